//! The calls of the Redisson-layout scripts (`redisson_*.lua`, beside this file),
//! typed: arguments in, a Rust value out. `compat::redisson` never builds `ARGV` nor
//! reads a `redis::Value` of these scripts.
//!
//! The layout and each script's steps are Redisson's `RSemaphore` and
//! `RPermitExpirableSemaphore` (see the scripts' headers for the Java line numbers);
//! the scripts need not be byte-identical to Redisson's, only their effects on the keys
//! and the channel are. Errors: a failed call is [`Error::Redis`] as `redis` gave it
//! (the caller names the semaphore), a reply of the wrong shape is
//! [`Error::UnexpectedReply`](crate::Error).

use std::sync::LazyLock;
use std::time::Duration;

use redis::{ConnectionLike, Value};

use super::{Invocation, LazyOnce, NodeClock, Once, Script, with_once};
use crate::error::{Error, Result};

/// The lease zset's score for a permit without lease (Redisson's
/// `nonExpirableTimeout`, about `Long.MAX_VALUE / 10000`).
pub(crate) const NO_LEASE: i64 = 922_337_203_685_477;

/// A script of the `RSemaphore` layout, after the once prelude (`once.lua`).
macro_rules! rs_script {
    ($file:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("redisson_publish.lua"),
                include_str!("redisson_counter.lua"),
                include_str!("once.lua"),
                include_str!($file)
            ))
        })
    };
}

static RS_TRY_ACQUIRE: LazyLock<Script> = rs_script!("redisson_rs_try_acquire.lua");
static RS_RELEASE: LazyLock<Script> = rs_script!("redisson_rs_release.lua");
static RS_DRAIN: LazyLock<Script> = rs_script!("redisson_rs_drain.lua");
static RS_ADD: LazyLock<Script> = rs_script!("redisson_rs_add.lua");
static TRY_SET: LazyLock<Script> = rs_script!("redisson_try_set.lua");

macro_rules! pes_script {
    ($file:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("redisson_publish.lua"),
                include_str!("redisson_counter.lua"),
                include_str!("redisson_pes_common.lua"),
                include_str!("once.lua"),
                include_str!($file)
            ))
        })
    };
}

static PES_ACQUIRE: LazyLock<Script> = pes_script!("redisson_pes_acquire.lua");
static PES_RELEASE: LazyLock<Script> = pes_script!("redisson_pes_release.lua");
static PES_READ: LazyLock<Script> = pes_script!("redisson_pes_read.lua");
static PES_SET: LazyLock<Script> = pes_script!("redisson_pes_set.lua");
static PES_LEASE: LazyLock<Script> = pes_script!("redisson_pes_lease.lua");

/// Redisson's keys of semaphore `name`: the counter `NAME`, the lease zset
/// `{NAME}:timeout` (`NAME:timeout` when the name has a `{` of its own) and the channel
/// `redisson_sc:{NAME}` (`redisson_sc:NAME` when it has a `{`), all in one hash slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RedissonKeys {
    pub(crate) counter: String,
    pub(crate) timeout: String,
    pub(crate) channel: String,
    /// The prefix of this library's operation keys (`once.lua`), in the
    /// counter's hash slot as the lease zset is.
    op_prefix: String,
    /// The clock of the node of the counter's slot, for the operation keys' deadlines.
    clock: NodeClock,
}

impl RedissonKeys {
    /// `RedissonObject.suffixName(name, "timeout")` and `prefixName("redisson_sc", name)`.
    pub(crate) fn new(name: &str) -> RedissonKeys {
        let tagged = name.contains('{');
        RedissonKeys {
            counter: name.to_owned(),
            timeout: if tagged {
                format!("{name}:timeout")
            } else {
                format!("{{{name}}}:timeout")
            },
            channel: if tagged {
                format!("redisson_sc:{name}")
            } else {
                format!("redisson_sc:{{{name}}}")
            },
            op_prefix: if tagged {
                format!("{name}:redsem-op:")
            } else {
                format!("{{{name}}}:redsem-op:")
            },
            clock: NodeClock::default(),
        }
    }

    /// A new key of the layout's slot, under its operation keys' prefix, for a marker
    /// write (one a `WAIT` after it counts from).
    pub(crate) fn marker_key(&self) -> String {
        format!("{}{}", self.op_prefix, uuid::Uuid::new_v4())
    }

    /// These keys with `clock` as their node's clock (a client's, shared by its
    /// handles of the layout).
    pub(crate) fn with_clock(mut self, clock: NodeClock) -> RedissonKeys {
        self.clock = clock;
        self
    }

    /// The operation key of one call that changes a count ([`LazyOnce`],
    /// `once.lua`); none when not `keyed`.
    pub(crate) fn once(&self, keyed: bool, op_timeout: std::time::Duration) -> LazyOnce<'_> {
        LazyOnce {
            keyed: keyed.then_some((
                self.op_prefix.as_str(),
                self.counter.as_str(),
                &self.clock,
                op_timeout,
            )),
            made: std::sync::OnceLock::new(),
        }
    }

    /// A fresh operation key for one call, on every deployment, for a call this
    /// library sends again in the background: no run after server time
    /// `not_after_ms` applies (see `Once::until`).
    pub(crate) fn once_until(&self, not_after_ms: i64) -> Once {
        Once::until(&self.op_prefix, not_after_ms)
    }

    /// The counter and the channel (the `RSemaphore` scripts and try-set).
    fn rs<'a>(&self, script: &'a Script) -> Invocation<'a> {
        let mut inv = script.prepare_invoke();
        inv.key(&self.counter).key(&self.channel);
        inv
    }

    /// The counter, the lease zset and the channel, then the publish command and the
    /// client's time (the `RPermitExpirableSemaphore` scripts).
    fn pes<'a>(&self, script: &'a Script, publish: &str, now_ms: i64) -> Invocation<'a> {
        let mut inv = script.prepare_invoke();
        inv.key(&self.counter)
            .key(&self.timeout)
            .key(&self.channel)
            .arg(publish)
            .arg(now_ms);
        inv
    }
}

/// `RSemaphore.tryAcquire(n)`: whether `n` permits were taken.
pub(crate) fn rs_try_acquire(
    conn: &mut dyn ConnectionLike,
    keys: &RedissonKeys,
    n: u32,
    once: Option<&Once>,
) -> Result<bool> {
    let mut inv = RS_TRY_ACQUIRE.prepare_invoke();
    inv.key(&keys.counter).arg(n);
    with_once(&mut inv, once);
    let r: i64 = inv.invoke(conn).map_err(Error::Redis)?;
    Ok(r == 1)
}

/// `RSemaphore.release(n)` (or `releaseIfExists(n)` when `if_exists`): the counter
/// after, or `None` when `if_exists` found no counter (nothing changed).
pub(crate) fn rs_release(
    conn: &mut dyn ConnectionLike,
    keys: &RedissonKeys,
    publish: &str,
    n: u32,
    if_exists: bool,
    once: Option<&Once>,
) -> Result<Option<i64>> {
    let mut inv = keys.rs(&RS_RELEASE);
    inv.arg(publish)
        .arg(n)
        .arg(if if_exists { "1" } else { "0" });
    with_once(&mut inv, once);
    let r: Vec<i64> = inv.invoke(conn).map_err(Error::Redis)?;
    match r.as_slice() {
        [1, v] => Ok(Some(*v)),
        [0, _] => Ok(None),
        other => Err(Error::reply("redisson_rs_release", format!("{other:?}"))),
    }
}

/// `TIME` of the node that holds the counter of `keys`, in ms (the deadline of an owed
/// give-back's operation key is set in this clock).
pub(crate) fn counter_server_time_ms(
    conn: &mut dyn ConnectionLike,
    keys: &RedissonKeys,
) -> Result<i64> {
    super::leased::server_time_at(conn, &keys.counter)
}

/// `RSemaphore.drainPermits()`: the counter before (0 when missing).
pub(crate) fn rs_drain(
    conn: &mut dyn ConnectionLike,
    keys: &RedissonKeys,
    once: Option<&Once>,
) -> Result<i64> {
    let mut inv = RS_DRAIN.prepare_invoke();
    inv.key(&keys.counter);
    with_once(&mut inv, once);
    inv.invoke(conn).map_err(Error::Redis)
}

/// `RSemaphore.addPermits(d)`: the counter after.
pub(crate) fn rs_add(
    conn: &mut dyn ConnectionLike,
    keys: &RedissonKeys,
    publish: &str,
    delta: i64,
    once: Option<&Once>,
) -> Result<i64> {
    let mut inv = keys.rs(&RS_ADD);
    inv.arg(publish).arg(delta);
    with_once(&mut inv, once);
    inv.invoke(conn).map_err(Error::Redis)
}

/// `trySetPermits(p)` / `trySetPermits(p, ttl)` of either type: whether the counter
/// was absent and is now `p`.
pub(crate) fn try_set(
    conn: &mut dyn ConnectionLike,
    keys: &RedissonKeys,
    publish: &str,
    permits: u32,
    ttl_ms: Option<u64>,
    once: Option<&Once>,
) -> Result<bool> {
    let ttl = ttl_ms.map(|t| t.to_string()).unwrap_or_default();
    let mut inv = keys.rs(&TRY_SET);
    inv.arg(publish).arg(permits).arg(ttl);
    with_once(&mut inv, once);
    let r: i64 = inv.invoke(conn).map_err(Error::Redis)?;
    Ok(r == 1)
}

/// `availablePermits()` of `RSemaphore`: a plain `GET` of the counter (missing = 0). A
/// value that is not integer text is a WRONGTYPE error naming the key, as the scripts
/// give (`redisson_counter.lua`).
pub(crate) fn rs_available(conn: &mut dyn ConnectionLike, keys: &RedissonKeys) -> Result<i64> {
    let v: Option<Vec<u8>> = redis::cmd("GET")
        .arg(&keys.counter)
        .query(conn)
        .map_err(Error::Redis)?;
    let Some(bytes) = v else { return Ok(0) };
    match std::str::from_utf8(&bytes)
        .ok()
        .filter(|s| is_counter_text(s))
        .and_then(|s| s.parse().ok())
    {
        Some(n) => Ok(n),
        None => {
            let found = String::from_utf8_lossy(&bytes[..bytes.len().min(40)]).into_owned();
            Err(Error::Redis(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "WRONGTYPE",
                format!(
                    "the counter {:?} of a Redisson semaphore must be an integer of at most 15 \
                     digits, found {found:?}",
                    keys.counter
                ),
            ))))
        }
    }
}

/// Whether `s` is a counter's value as the scripts take it (`counter_text` in
/// `redisson_counter.lua`): integer text as `INCRBY` takes it (no `+`, no leading
/// zero, not `-0`), of at most 15 digits.
fn is_counter_text(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    digits.len() <= 15
        && !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (s == "0" || !digits.starts_with('0'))
}

/// What an `RPermitExpirableSemaphore` acquire answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PesAcquire {
    /// Granted: the ids are in the lease zset, which expires in `ttl` when it has a
    /// TTL (the counter's: the leases end with it at the latest).
    Granted { ttl: Option<Duration> },
    /// Not now; the nearest lease ends at this client epoch ms: retry then.
    RetryAt(i64),
    /// Not now, and no lease will end: wait for a message.
    Wait,
}

/// `tryAcquire(n, lease)`: takes `ids.len()` permits, each id scored `deadline_ms`
/// (or [`NO_LEASE`]), after reclaiming at most that many expired ones.
pub(crate) fn pes_acquire(
    conn: &mut dyn ConnectionLike,
    keys: &RedissonKeys,
    publish: &str,
    now_ms: i64,
    deadline_ms: i64,
    ids: &[[u8; 16]],
) -> Result<PesAcquire> {
    let mut inv = keys.pes(&PES_ACQUIRE, publish, now_ms);
    inv.arg(ids.len()).arg(deadline_ms);
    for id in ids {
        inv.arg(&id[..]);
    }
    let v: Value = inv.invoke(conn).map_err(Error::Redis)?;
    let text = match &v {
        Value::Nil => return Ok(PesAcquire::Wait),
        Value::Okay => return Ok(PesAcquire::Granted { ttl: None }),
        Value::SimpleString(s) => s.clone(),
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        other => return Err(Error::reply("redisson_pes_acquire", format!("{other:?}"))),
    };
    if text == "OK" {
        return Ok(PesAcquire::Granted { ttl: None });
    }
    if let Some(ms) = text.strip_prefix("OK:") {
        return match ms.parse::<u64>() {
            Ok(ms) if ms > 0 => Ok(PesAcquire::Granted {
                ttl: Some(Duration::from_millis(ms)),
            }),
            _ => Err(Error::reply("redisson_pes_acquire", text)),
        };
    }
    text.strip_prefix(':')
        .and_then(parse_score)
        .map(PesAcquire::RetryAt)
        .ok_or_else(|| Error::reply("redisson_pes_acquire", text))
}

/// A zset score as Redis prints it (an integer, or a float like `1.7e+12` written by
/// some client), as whole milliseconds.
fn parse_score(s: &str) -> Option<i64> {
    s.parse::<i64>()
        .ok()
        .or_else(|| s.parse::<f64>().ok().map(|f| f as i64))
}

/// What a release found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PesReleased {
    /// Released while its lease ran.
    Live,
    /// Released, but its deadline had passed (Redisson answers false).
    Late,
    /// Not in the lease zset.
    NotHeld,
}

/// `tryRelease(id)`; `hex` also matches the pre-3.17 member (the id as hex text).
pub(crate) fn pes_release(
    conn: &mut dyn ConnectionLike,
    keys: &RedissonKeys,
    publish: &str,
    now_ms: i64,
    id: &[u8; 16],
    hex: Option<&str>,
    once: Option<&Once>,
) -> Result<PesReleased> {
    let mut inv = keys.pes(&PES_RELEASE, publish, now_ms);
    inv.arg(&id[..]).arg(hex.unwrap_or(""));
    with_once(&mut inv, once);
    let r: i64 = inv.invoke(conn).map_err(Error::Redis)?;
    match r {
        1 => Ok(PesReleased::Live),
        2 => Ok(PesReleased::Late),
        0 => Ok(PesReleased::NotHeld),
        other => Err(Error::reply("redisson_pes_release", other.to_string())),
    }
}

/// Which count [`pes_read`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PesCount {
    /// `availablePermits()`: the counter.
    Available,
    /// `getPermits()`: counter + held.
    Permits,
    /// `acquiredPermits()`: held.
    Acquired,
}

/// Reclaims every expired permit, then reads one count.
pub(crate) fn pes_read(
    conn: &mut dyn ConnectionLike,
    keys: &RedissonKeys,
    publish: &str,
    now_ms: i64,
    what: PesCount,
) -> Result<i64> {
    let what = match what {
        PesCount::Available => "available",
        PesCount::Permits => "permits",
        PesCount::Acquired => "acquired",
    };
    keys.pes(&PES_READ, publish, now_ms)
        .arg(what)
        .invoke(conn)
        .map_err(Error::Redis)
}

/// `setPermits(p)`: the counter after.
pub(crate) fn pes_set(
    conn: &mut dyn ConnectionLike,
    keys: &RedissonKeys,
    publish: &str,
    now_ms: i64,
    permits: u32,
) -> Result<i64> {
    keys.pes(&PES_SET, publish, now_ms)
        .arg("set")
        .arg(permits)
        .invoke(conn)
        .map_err(Error::Redis)
}

/// `addPermits(d)` of `RPermitExpirableSemaphore`: the counter after.
pub(crate) fn pes_add(
    conn: &mut dyn ConnectionLike,
    keys: &RedissonKeys,
    publish: &str,
    now_ms: i64,
    delta: i64,
    once: Option<&Once>,
) -> Result<i64> {
    let mut inv = keys.pes(&PES_SET, publish, now_ms);
    inv.arg("add").arg(delta);
    with_once(&mut inv, once);
    inv.invoke(conn).map_err(Error::Redis)
}

/// `updateLeaseTime(id, lease)`: whether the id was still held (and now has
/// `deadline_ms`; with `renew`, a renewal of this client's own, at least that: see
/// [`pes_update_leases`]), and the lease zset's TTL, if it has one.
pub(crate) fn pes_update_lease(
    conn: &mut dyn ConnectionLike,
    keys: &RedissonKeys,
    publish: &str,
    now_ms: i64,
    id: &[u8; 16],
    deadline_ms: i64,
    renew: bool,
) -> Result<(bool, Option<Duration>)> {
    let (held, ttl) = pes_update_leases(
        conn,
        keys,
        publish,
        now_ms,
        std::slice::from_ref(id),
        deadline_ms,
        renew,
    )?;
    // (one answer: pes_update_leases checks that there is one per id)
    Ok((held.first() == Some(&true), ttl))
}

/// `updateLeaseTime` of several ids to one deadline in one call (a renewal tick of
/// the background refresher): for each id, in order, whether it was still held; and
/// the lease zset's TTL when it has one (the counter's, copied by an acquire), which
/// ends every lease in it at the latest.
///
/// With `renew` (this client's renewals of its own permits) a deadline is never moved
/// earlier: a renewal held up on its way, whose call gave up, may land after the one
/// sent after it, whose client counts its lease from that later send.
pub(crate) fn pes_update_leases(
    conn: &mut dyn ConnectionLike,
    keys: &RedissonKeys,
    publish: &str,
    now_ms: i64,
    ids: &[[u8; 16]],
    deadline_ms: i64,
    renew: bool,
) -> Result<(Vec<bool>, Option<Duration>)> {
    let mut inv = keys.pes(&PES_LEASE, publish, now_ms);
    inv.arg(if renew { "renew" } else { "update" })
        .arg(deadline_ms);
    for id in ids {
        inv.arg(&id[..]);
    }
    let mut held: Vec<i64> = inv.invoke(conn).map_err(Error::Redis)?;
    // (one answer per id, then the zset's PTTL)
    if held.len() != ids.len() + 1 {
        return Err(Error::reply(
            "redisson_pes_lease",
            format!("{} answers for {} ids and a TTL", held.len(), ids.len()),
        ));
    }
    let ttl = held
        .pop()
        .and_then(|ms| u64::try_from(ms).ok())
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis);
    Ok((held.into_iter().map(|h| h == 1).collect(), ttl))
}

/// What `getLeaseTime(id)` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PesLease {
    /// Not held.
    Absent,
    /// Held without lease.
    NoLease,
    /// Held; this many ms left by the caller's clock (may be 0 or below at the edge).
    Left(i64),
}

/// `getLeaseTime(id)`.
pub(crate) fn pes_lease_time(
    conn: &mut dyn ConnectionLike,
    keys: &RedissonKeys,
    publish: &str,
    now_ms: i64,
    id: &[u8; 16],
) -> Result<PesLease> {
    let r: Vec<i64> = keys
        .pes(&PES_LEASE, publish, now_ms)
        .arg("get")
        .arg(&id[..])
        .invoke(conn)
        .map_err(Error::Redis)?;
    match r.as_slice() {
        [0] => Ok(PesLease::Absent),
        [1, -1] => Ok(PesLease::NoLease),
        [1, ms] => Ok(PesLease::Left(*ms)),
        other => Err(Error::reply("redisson_pes_lease", format!("{other:?}"))),
    }
}

/// Redisson's replica wait, step 1: `INFO replication` on the primary this connection
/// talks to, and its `connected_slaves` (Redisson's cached replica count).
pub(crate) fn connected_replicas(conn: &mut dyn ConnectionLike) -> Result<u32> {
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(conn)
        .map_err(Error::Redis)?;
    parse_connected_replicas(&info)
}

/// [`connected_replicas`] on a cluster: `INFO replication` on the primary of `key`'s
/// slot.
pub(crate) fn connected_replicas_at(conn: &mut crate::node::ClusterConn, key: &str) -> Result<u32> {
    use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
    let mut cmd = redis::cmd("INFO");
    cmd.arg("replication");
    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_slot(
        Slot::for_key(key),
        SlotAddr::Master,
    )));
    let reply = conn.route_command(&cmd, routing).map_err(Error::Redis)?;
    let info: String =
        redis::from_redis_value(reply).map_err(|e| Error::reply("info", e.to_string()))?;
    parse_connected_replicas(&info)
}

fn parse_connected_replicas(info: &str) -> Result<u32> {
    info.lines()
        .find_map(|l| l.trim().strip_prefix("connected_slaves:"))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| Error::reply("info", "no connected_slaves in INFO replication"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_redissons() {
        let k = RedissonKeys::new("jobs");
        assert_eq!(k.counter, "jobs");
        assert_eq!(k.timeout, "{jobs}:timeout");
        assert_eq!(k.channel, "redisson_sc:{jobs}");
        let k = RedissonKeys::new("{acct}:jobs");
        assert_eq!(k.counter, "{acct}:jobs");
        assert_eq!(k.timeout, "{acct}:jobs:timeout");
        assert_eq!(k.channel, "redisson_sc:{acct}:jobs");
    }

    #[test]
    fn replica_counts_parse() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\nslave0:ip=...\r\n";
        assert_eq!(parse_connected_replicas(info).unwrap(), 2);
        assert!(parse_connected_replicas("role:master\r\n").is_err());
    }

    #[test]
    fn scores_parse() {
        assert_eq!(parse_score("1764000000123"), Some(1_764_000_000_123));
        assert_eq!(parse_score("1.764e+12"), Some(1_764_000_000_000));
        assert_eq!(parse_score("x"), None);
        for s in [
            &RS_TRY_ACQUIRE,
            &RS_RELEASE,
            &RS_DRAIN,
            &RS_ADD,
            &TRY_SET,
            &PES_ACQUIRE,
            &PES_RELEASE,
            &PES_READ,
            &PES_SET,
            &PES_LEASE,
        ] {
            assert_eq!(s.get_hash().len(), 40);
        }
    }
}
