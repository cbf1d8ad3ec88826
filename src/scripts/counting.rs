//! The calls of the counting semaphore's scripts (`counting_*.lua`, beside this file),
//! typed: arguments in, a Rust value out. Nothing above this module builds `ARGV` or
//! reads a `redis::Value` of these scripts.
//!
//! Errors: a failed call is [`Error::Redis`] as `redis` gave it (the caller sorts it:
//! the scripts' `RANGE` refusal, a wrong key type), a reply of the wrong shape is
//! [`Error::UnexpectedReply`](crate::Error) naming the script.

use redis::ConnectionLike;

use super::{
    COUNTING_ACQUIRE, COUNTING_ADD, COUNTING_CANCEL, COUNTING_DRAIN, COUNTING_INSPECT,
    COUNTING_RELEASE, COUNTING_TRY_SET, CountingKeys, Once, with_once,
};
use crate::error::{Error, Result};

/// Who looks: a plain try, or a queued waiter (its id and wake-up channel), which the
/// script queues or whose heartbeat it renews when the permits are not there.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Look<'a> {
    Try,
    Waiter { id: &'a str, channel: &'a str },
}

/// Takes `permits` if the count has them (P); whether it did. With `once` (Redis
/// Cluster), a resent call takes them at most once.
pub(crate) fn acquire(
    conn: &mut dyn ConnectionLike,
    keys: &CountingKeys,
    permits: u32,
    look: Look<'_>,
    heartbeat_ms: u64,
    pad_ms: u64,
    once: Option<&Once>,
) -> Result<bool> {
    let (mode, id, channel) = match look {
        Look::Waiter { id, channel } => ("w", id, channel),
        Look::Try => ("t", "", ""),
    };
    let mut inv = keys.invoke(&COUNTING_ACQUIRE);
    inv.arg(permits)
        .arg(mode)
        .arg(id)
        .arg(channel)
        .arg(heartbeat_ms)
        .arg(pad_ms);
    with_once(&mut inv, once);
    let reply: Vec<i64> = inv.invoke(conn).map_err(Error::Redis)?;
    match reply.as_slice() {
        [1, _] => Ok(true),
        [0, _] => Ok(false),
        other => Err(Error::reply("counting_acquire", format!("{other:?}"))),
    }
}

/// Gives `permits` back (V) and tells the waiters that fit; the count after. With
/// `once` (Redis Cluster), a resent call gives them at most once.
pub(crate) fn release(
    conn: &mut dyn ConnectionLike,
    keys: &CountingKeys,
    permits: u32,
    once: Option<&Once>,
) -> Result<i64> {
    let mut inv = keys.invoke(&COUNTING_RELEASE);
    inv.arg(permits);
    with_once(&mut inv, once);
    inv.invoke(conn).map_err(Error::Redis)
}

/// Changes the count by `delta` (non-zero); the count after. With `once`, at most once.
pub(crate) fn add(
    conn: &mut dyn ConnectionLike,
    keys: &CountingKeys,
    delta: i64,
    once: Option<&Once>,
) -> Result<i64> {
    let mut inv = keys.invoke(&COUNTING_ADD);
    inv.arg(delta);
    with_once(&mut inv, once);
    inv.invoke(conn).map_err(Error::Redis)
}

/// Sets the count to `permits` when the semaphore is unset; whether it did (with
/// `once`, a resent call answers as its first run did).
pub(crate) fn try_set(
    conn: &mut dyn ConnectionLike,
    keys: &CountingKeys,
    permits: u32,
    once: Option<&Once>,
) -> Result<bool> {
    let mut inv = keys.invoke(&COUNTING_TRY_SET);
    inv.arg(permits);
    with_once(&mut inv, once);
    let set: i64 = inv.invoke(conn).map_err(Error::Redis)?;
    Ok(set == 1)
}

/// Takes every free permit; how many (with `once`, a resent call answers as its
/// first run did).
pub(crate) fn drain(
    conn: &mut dyn ConnectionLike,
    keys: &CountingKeys,
    once: Option<&Once>,
) -> Result<u32> {
    let mut inv = keys.invoke(&COUNTING_DRAIN);
    with_once(&mut inv, once);
    let taken: i64 = inv.invoke(conn).map_err(Error::Redis)?;
    u32::try_from(taken).map_err(|_| Error::reply("counting_drain", taken.to_string()))
}

/// Waiter `id` leaves the queue, passing on any wake-up it had.
pub(crate) fn cancel(conn: &mut dyn ConnectionLike, keys: &CountingKeys, id: &str) -> Result<()> {
    let _: i64 = keys
        .invoke(&COUNTING_CANCEL)
        .arg(id)
        .invoke(conn)
        .map_err(Error::Redis)?;
    Ok(())
}

/// What the inspect script reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Inspected {
    /// Whether the count is set.
    pub(crate) set: bool,
    pub(crate) count: i64,
    /// Waiters whose heartbeat is live.
    pub(crate) queued: u32,
}

/// Reads the count and the queue length.
pub(crate) fn inspect(conn: &mut dyn ConnectionLike, keys: &CountingKeys) -> Result<Inspected> {
    let reply: Vec<i64> = keys
        .invoke(&COUNTING_INSPECT)
        .invoke(conn)
        .map_err(Error::Redis)?;
    match reply.as_slice() {
        [set, count, queued] => Ok(Inspected {
            set: *set == 1,
            count: *count,
            queued: u32::try_from(*queued)
                .map_err(|_| Error::reply("counting_inspect", "queue length out of range"))?,
        }),
        other => Err(Error::reply("counting_inspect", format!("{other:?}"))),
    }
}
