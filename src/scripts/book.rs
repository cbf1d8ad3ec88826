//! The commands of the "Redis in Action" semaphores (ch. 6.3, listings 12–17), typed,
//! and of their Node.js port's fair semaphore (seed 004). The book's protocol is command
//! level, not scripts: `MULTI`/`EXEC` pipelines, a `SETNX` lock and a `WATCH` release.
//! Each function here sends one of its steps exactly as the listings do, on the keys of
//! [`BookKeys`], and returns a Rust value; `compat::book` sequences the steps and never
//! builds a command itself.
//!
//! The Node port's fair semaphore sends the same commands as listing 14 in the same
//! order and in the same two batches, on its own keys (`name:time`, `name:count`, the
//! global `semaphore:count`): [`fair_purge_and_count`] is its first pipeline (steps
//! 1–3), [`fair_enter`] its second (steps 4–6), [`fair_remove`] its clean-up on failure
//! and its release. The port sends each batch as a plain pipeline; here each is a
//! `MULTI`/`EXEC` transaction, which allows a subset of the port's interleavings (the
//! same commands, never split), so a Node client sees nothing it could not see from
//! another Node client.
//!
//! Errors are [`redis::RedisError`] as `redis` gave them; the caller names the semaphore.

use redis::{ConnectionLike, RedisResult};

/// The keys of one semaphore: the time zset (id → acquire time, for expiry), and for
/// the fair variants the ticket zset (id → ticket, for ranking), the ticket counter and
/// the book's lock.
///
/// The book's layout ([`BookKeys::new`]) is `name`, `name:owner`, `name:counter` and
/// `lock:name`; the Node port's fair layout ([`BookKeys::node_fair`]) is `name:time`,
/// `name:count` and the one global counter `semaphore:count` (no lock). The basic
/// semaphore of both uses the time zset `name` alone.
#[derive(Debug, Clone)]
pub(crate) struct BookKeys {
    pub(crate) time: String,
    pub(crate) owner: String,
    pub(crate) counter: String,
    pub(crate) lock: String,
}

/// The ticket counter of the Node port's fair semaphore: one literal key shared by
/// every semaphore of every Node client (seed 004), not one per name.
pub(crate) const NODE_GLOBAL_COUNTER: &str = "semaphore:count";

impl BookKeys {
    /// The book's keys (listings 12–17) of semaphore `name`.
    pub(crate) fn new(name: &str) -> BookKeys {
        BookKeys {
            time: name.to_owned(),
            owner: format!("{name}:owner"),
            counter: format!("{name}:counter"),
            lock: format!("lock:{name}"),
        }
    }

    /// The Node port's fair keys of semaphore `name` (seed 004): `name:time`,
    /// `name:count`, the global `semaphore:count`. The lock key is unused (the port has
    /// no lock-guarded variant).
    pub(crate) fn node_fair(name: &str) -> BookKeys {
        BookKeys {
            time: format!("{name}:time"),
            owner: format!("{name}:count"),
            counter: NODE_GLOBAL_COUNTER.to_owned(),
            lock: format!("lock:{name}"),
        }
    }
}

/// Listing 12 in one transaction: purge entries scored at or below `cutoff`, add `id`
/// scored `now`, and `id`'s rank in the time zset.
pub(crate) fn basic_enter(
    conn: &mut dyn ConnectionLike,
    keys: &BookKeys,
    now: &str,
    cutoff: &str,
    id: &str,
) -> RedisResult<Option<i64>> {
    let (rank,): (Option<i64>,) = redis::pipe()
        .atomic()
        .cmd("ZREMRANGEBYSCORE")
        .arg(&keys.time)
        .arg("-inf")
        .arg(cutoff)
        .ignore()
        .cmd("ZADD")
        .arg(&keys.time)
        .arg(now)
        .arg(id)
        .ignore()
        .cmd("ZRANK")
        .arg(&keys.time)
        .arg(id)
        .query(conn)?;
    Ok(rank)
}

/// Listing 13: `ZREM` of `id` from the time zset; whether it was there.
pub(crate) fn basic_remove(
    conn: &mut dyn ConnectionLike,
    keys: &BookKeys,
    id: &str,
) -> RedisResult<bool> {
    let removed: i64 = redis::cmd("ZREM").arg(&keys.time).arg(id).query(conn)?;
    Ok(removed == 1)
}

/// Listing 14, first transaction: purge the time zset, drop the purged entries from
/// the owner zset (`ZINTERSTORE` with weights 1, 0), and `INCR` the counter: the new
/// entry's owner score.
pub(crate) fn fair_purge_and_count(
    conn: &mut dyn ConnectionLike,
    keys: &BookKeys,
    cutoff: &str,
) -> RedisResult<i64> {
    let (counter,): (i64,) = redis::pipe()
        .atomic()
        .cmd("ZREMRANGEBYSCORE")
        .arg(&keys.time)
        .arg("-inf")
        .arg(cutoff)
        .ignore()
        .cmd("ZINTERSTORE")
        .arg(&keys.owner)
        .arg(2)
        .arg(&keys.owner)
        .arg(&keys.time)
        .arg("WEIGHTS")
        .arg(1)
        .arg(0)
        .ignore()
        .cmd("INCR")
        .arg(&keys.counter)
        .query(conn)?;
    Ok(counter)
}

/// Listing 14, second transaction: add `id` to the time zset (score `now`) and the
/// owner zset (score `counter`), and `id`'s rank in the owner zset.
pub(crate) fn fair_enter(
    conn: &mut dyn ConnectionLike,
    keys: &BookKeys,
    now: &str,
    counter: i64,
    id: &str,
) -> RedisResult<Option<i64>> {
    let (rank,): (Option<i64>,) = redis::pipe()
        .atomic()
        .cmd("ZADD")
        .arg(&keys.time)
        .arg(now)
        .arg(id)
        .ignore()
        .cmd("ZADD")
        .arg(&keys.owner)
        .arg(counter)
        .arg(id)
        .ignore()
        .cmd("ZRANK")
        .arg(&keys.owner)
        .arg(id)
        .query(conn)?;
    Ok(rank)
}

/// Listing 15: `ZREM` of `id` from both zsets in one transaction; whether it was in
/// the time zset.
///
/// At `maxmemory` Redis refuses every command queued inside `MULTI` (a `ZREM` too,
/// which only frees memory) and aborts the `EXEC`: nothing ran. The two `ZREM`s are
/// then sent again as a plain pipeline (the Node port's own form of this step), so a
/// release still frees its place when Redis is full, as the basic release and the
/// scripts' releases do. Between the two another client may see the id in the owner
/// zset alone: its purge (`ZINTERSTORE` with the time zset) drops it, and until then
/// it only ranks others lower, never over the limit.
pub(crate) fn fair_remove(
    conn: &mut dyn ConnectionLike,
    keys: &BookKeys,
    id: &str,
) -> RedisResult<bool> {
    let mut pipe = redis::pipe();
    pipe.cmd("ZREM")
        .arg(&keys.time)
        .arg(id)
        .cmd("ZREM")
        .arg(&keys.owner)
        .arg(id);
    let (timeout_zset, _owner): (i64, i64) = match pipe.clone().atomic().query(conn) {
        Err(e) if e.code() == Some("OOM") => pipe.query(conn)?,
        other => other?,
    };
    Ok(timeout_zset == 1)
}

/// Listing 16, made safe to send twice: in one transaction, re-score `id` in the time
/// zset with `now` only if it is there and `now` is later (`ZADD XX GT`: a refresh
/// held up on a connection given up on, arriving after a later one, cannot move the
/// entry back), and read whether it is in both zsets. Whether it is (still held; `false`: gone, the caller reports the loss and
/// takes out what is left, as the book's release does).
///
/// The book's `ZADD` (without `XX`) adds the id back when it is gone and relies on its
/// reply to take it out again: when that reply is lost, the id stays in the time zset
/// without its ticket, and a second refresh found it there and reported the permit
/// renewed. With `XX` a refresh never adds an entry, so it gives the same answer
/// however often it is sent; other clients see a subset of what the book's refresh
/// shows them (never the brief re-added entry).
pub(crate) fn rescore(
    conn: &mut dyn ConnectionLike,
    keys: &BookKeys,
    now: &str,
    id: &str,
) -> RedisResult<bool> {
    let (in_time, in_owner): (redis::Value, redis::Value) = redis::pipe()
        .atomic()
        .cmd("ZADD")
        .arg(&keys.time)
        .arg("XX")
        .arg("GT")
        .arg(now)
        .arg(id)
        .ignore()
        .cmd("ZSCORE")
        .arg(&keys.time)
        .arg(id)
        .cmd("ZSCORE")
        .arg(&keys.owner)
        .arg(id)
        .query(conn)?;
    let present = |v: &redis::Value| !matches!(v, redis::Value::Nil);
    Ok(present(&in_time) && present(&in_owner))
}

/// The entries of the time zset scored above `cutoff`.
pub(crate) fn count_younger(
    conn: &mut dyn ConnectionLike,
    keys: &BookKeys,
    cutoff: &str,
) -> RedisResult<u64> {
    redis::cmd("ZCOUNT")
        .arg(&keys.time)
        .arg(format!("({cutoff}"))
        .arg("+inf")
        .query(conn)
}

/// The book's lock, one try: `SET lock id NX PX lock_ms` (its `SETNX` + `EXPIRE`);
/// whether it was taken.
pub(crate) fn lock_try(
    conn: &mut dyn ConnectionLike,
    keys: &BookKeys,
    lock_id: &str,
    lock_ms: u64,
) -> RedisResult<bool> {
    let set: Option<String> = redis::cmd("SET")
        .arg(&keys.lock)
        .arg(lock_id)
        .arg("NX")
        .arg("PX")
        .arg(lock_ms)
        .query(conn)?;
    Ok(set.is_some())
}

/// The book's repair of a lock without expiry (`TTL` is -1: its holder died between
/// `SETNX` and `EXPIRE`): gives it one of `lock_ms`.
pub(crate) fn lock_repair(
    conn: &mut dyn ConnectionLike,
    keys: &BookKeys,
    lock_ms: u64,
) -> RedisResult<()> {
    let ttl: i64 = redis::cmd("TTL").arg(&keys.lock).query(conn)?;
    if ttl == -1 {
        redis::cmd("PEXPIRE")
            .arg(&keys.lock)
            .arg(lock_ms)
            .exec(conn)?;
    }
    Ok(())
}

/// One round of the book's `release_lock`: `WATCH`, `GET`, and `MULTI`/`DEL`/`EXEC`
/// when the value is `lock_id`. `Some(false)`: not ours; `Some(true)`: deleted; `None`:
/// the transaction aborted (the key changed), try again. On an error the connection
/// is left without a pending `WATCH`.
pub(crate) fn lock_release_round(
    conn: &mut dyn ConnectionLike,
    keys: &BookKeys,
    lock_id: &str,
) -> RedisResult<Option<bool>> {
    let round = (|| -> RedisResult<Option<bool>> {
        redis::cmd("WATCH").arg(&keys.lock).exec(conn)?;
        let held: Option<String> = redis::cmd("GET").arg(&keys.lock).query(conn)?;
        if held.as_deref() != Some(lock_id) {
            redis::cmd("UNWATCH").exec(conn)?;
            return Ok(Some(false));
        }
        let done: Option<(i64,)> = redis::pipe()
            .atomic()
            .cmd("DEL")
            .arg(&keys.lock)
            .query(conn)?;
        Ok(done.map(|_| true))
    })();
    if round.is_err() {
        // never hand a connection with a pending WATCH back to the pool
        let _ = redis::cmd("UNWATCH").exec(conn);
    }
    round
}
