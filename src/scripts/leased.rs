//! The calls of the leased semaphore's scripts, typed: each function sends one script
//! (its `.lua` file is beside this one) with its arguments in the order the script's
//! header gives, and turns the reply into a Rust value. Nothing above this module
//! builds `ARGV` or reads a `redis::Value` of these scripts.
//!
//! Errors: a failed call is [`Error::Redis`] as `redis` gave it (callers sort it: a
//! timeout, a wrong key type, a dropped connection), a reply of the wrong shape is
//! [`Error::UnexpectedReply`](crate::Error) naming the script.

use std::time::Duration;

use crate::node::ClusterConn;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{ConnectionLike, Value};

use super::{
    ACQUIRE, ADOPT, BATCH, CANCEL, INSPECT, Keys, REFRESH, RELEASE, SERVER_TIME, SET_LIMIT,
};
use super::{END_OF_TIME_MS, Invocation, MAX_PERMITS, heartbeat_ms, pad_ms};
use crate::clock::{IoTimeouts, wait_ms_within};
use crate::error::{Error, Result};

/// Whether an acquire may queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A try: granted now or not at all.
    Try,
    /// A waiter's look: queued when not granted.
    Wait,
}

/// acquire.lua's arguments.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AcquireArgs<'a> {
    pub(crate) id: &'a str,
    pub(crate) n: u32,
    /// The caller's limit (a stored one takes precedence).
    pub(crate) limit: u32,
    pub(crate) lease_ms: u64,
    /// "pid|host|label", recorded with the grant.
    pub(crate) origin: &'a str,
    pub(crate) mode: Mode,
    pub(crate) fair: bool,
    /// The waiter's wake-up channel ("" for a try).
    pub(crate) channel: &'a str,
    /// The server time (ms) after which the script must do nothing (the caller has
    /// given up by then).
    pub(crate) cutoff_ms: i64,
    /// The arrival ticket an earlier queued reply of the same wait gave it
    /// ([`Acquired::Busy`]), 0 for none (every try): a waiter the queue dropped
    /// (its heartbeat ended while the server was paused, say) queues again in its
    /// old place. It only orders the queue; it grants nothing (ops.lua).
    pub(crate) ticket: u64,
}

impl AcquireArgs<'_> {
    /// Whether `other` has the same arguments but for its id and cutoff (batch.lua's
    /// 'A' form).
    fn same_but_id(&self, other: &AcquireArgs<'_>) -> bool {
        self.ticket == other.ticket
            && self.n == other.n
            && self.limit == other.limit
            && self.lease_ms == other.lease_ms
            && self.origin == other.origin
            && self.mode == other.mode
            && self.fair == other.fair
            && self.channel == other.channel
    }
}

/// A grant, as the acquire and cancel scripts report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) token: u64,
    /// The lease deadline, server time in ms.
    pub(crate) deadline_ms: i64,
    pub(crate) slots: Vec<u32>,
}

/// The acquire script's answer. Every answer but a try refused on the fast path carries
/// the server's time (`now_ms`), read between the call's send and its reply (a clock
/// anchor, `clock.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Acquired {
    Granted {
        now_ms: i64,
        grant: Grant,
    },
    /// Not granted: `retry_ms` until the earliest lease ends (negative: unknown);
    /// `head` when the waiter is at the head of the queue; `ticket` its arrival
    /// ticket in the queue (0: not queued, a try, or a server that does not say it).
    /// A try refused on the fast path says neither the time nor when to look again
    /// (a try does not use them).
    Busy {
        now_ms: Option<i64>,
        retry_ms: i64,
        head: bool,
        ticket: u64,
    },
    /// More permits asked for than the limit in force.
    TooMany {
        now_ms: i64,
        limit: u32,
    },
    /// The call ran after its cutoff and did nothing.
    TooLate {
        now_ms: i64,
    },
}

impl Acquired {
    /// The server's time when the script ran, when the reply says it.
    pub(crate) fn now_ms(&self) -> Option<i64> {
        match self {
            Acquired::Granted { now_ms, .. }
            | Acquired::TooMany { now_ms, .. }
            | Acquired::TooLate { now_ms } => Some(*now_ms),
            Acquired::Busy { now_ms, .. } => *now_ms,
        }
    }

    /// Reads op_acquire's reply (ops.lua), or one of the fast path's short forms of it
    /// (fast_acquire.lua): `0` for a try refused, `"now|token|deadline|slot"` for a
    /// grant of one permit.
    fn parse(reply: Value, n: u32) -> Result<Acquired> {
        let reply = match reply {
            Value::Int(0) => {
                return Ok(Acquired::Busy {
                    now_ms: None,
                    retry_ms: -1,
                    head: false,
                    ticket: 0,
                });
            }
            Value::BulkString(text) => return Self::parse_short_grant(&text, n),
            other => other,
        };
        let reply: Vec<i64> =
            redis::from_redis_value(reply).map_err(|e| Error::reply("acquire", e.to_string()))?;
        let now = |ms: &i64| server_time("acquire", "the server's time", *ms);
        match reply.as_slice() {
            [1, now_ms, token, deadline, slots @ ..] if slots.len() == n as usize => {
                let now_ms = now(now_ms)?;
                Ok(Acquired::Granted {
                    now_ms,
                    grant: grant("acquire", now_ms, *token, *deadline, slots)?,
                })
            }
            [0, now_ms, retry, head] => Ok(Acquired::Busy {
                now_ms: Some(now(now_ms)?),
                retry_ms: *retry,
                head: *head == 1,
                ticket: 0,
            }),
            // queued: with its arrival ticket (an integer below 2^53; one out of range,
            // from a queue edited by hand, is no ticket: the next look takes a fresh one)
            [0, now_ms, retry, head, ticket] => Ok(Acquired::Busy {
                now_ms: Some(now(now_ms)?),
                retry_ms: *retry,
                head: *head == 1,
                ticket: u64::try_from(*ticket)
                    .ok()
                    .filter(|t| *t <= MAX_TICKET)
                    .unwrap_or(0),
            }),
            [-1, now_ms, limit] => Ok(Acquired::TooMany {
                now_ms: now(now_ms)?,
                limit: u32::try_from(*limit).unwrap_or(u32::MAX),
            }),
            [-2, now_ms] => Ok(Acquired::TooLate {
                now_ms: now(now_ms)?,
            }),
            other => Err(Error::reply("acquire", format!("{other:?}"))),
        }
    }

    /// The fast path's grant, `"now|token|deadline|slot"` (one permit).
    fn parse_short_grant(text: &[u8], n: u32) -> Result<Acquired> {
        let bad = || Error::reply("acquire", format!("{:?}", String::from_utf8_lossy(text)));
        let mut fields = std::str::from_utf8(text)
            .map_err(|_| bad())?
            .split('|')
            .map(str::parse::<i64>);
        match (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) {
            (Some(Ok(now)), Some(Ok(token)), Some(Ok(deadline)), Some(Ok(slot)), None)
                if n == 1 =>
            {
                let now_ms = server_time("acquire", "the server's time", now)?;
                Ok(Acquired::Granted {
                    now_ms,
                    grant: grant("acquire", now_ms, token, deadline, &[slot])?,
                })
            }
            _ => Err(bad()),
        }
    }
}

/// The release script's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// The id held nothing (released before, purged, or never granted).
    NotHeld,
    /// Released while its lease was live.
    Live,
    /// Released, but its lease had ended.
    Late,
}

impl Released {
    fn parse(reply: Value) -> Result<Released> {
        match redis::from_redis_value::<i64>(reply)
            .map_err(|e| Error::reply("release", e.to_string()))?
        {
            0 => Ok(Released::NotHeld),
            1 => Ok(Released::Live),
            2 => Ok(Released::Late),
            other => Err(Error::reply("release", format!("unknown status {other}"))),
        }
    }
}

/// One operation of the hot path, as the batch script takes them.
#[derive(Debug, Clone, Copy)]
pub(crate) enum HotOp<'a> {
    /// A try (the batch script never queues anyone).
    Acquire(AcquireArgs<'a>),
    Release {
        id: &'a str,
    },
}

/// The answer to one [`HotOp`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HotReply {
    Acquired(Acquired),
    Released(Released),
}

/// The largest arrival ticket acquire.lua takes (its MAX_TOKEN, 2^53).
const MAX_TICKET: u64 = 1 << 53;

/// acquire.lua's 11 arguments, batch.lua's 'a' form (without the ticket: see
/// [`push_ticket`]).
fn push_acquire(inv: &mut Invocation<'_>, a: &AcquireArgs<'_>) {
    inv.arg(a.id)
        .arg(a.n)
        .arg(a.limit)
        .arg(a.lease_ms)
        .arg(pad_ms(a.lease_ms))
        .arg(heartbeat_ms(a.lease_ms))
        .arg(a.origin)
        .arg(match a.mode {
            Mode::Try => "t",
            Mode::Wait => "w",
        })
        .arg(if a.fair { "1" } else { "0" })
        .arg(a.channel)
        .arg(a.cutoff_ms.max(1));
}

/// acquire.lua's optional 12th argument, the ticket, sent only when there is one
/// (a try never has one). A batch carries none (batch.lua's 'a' takes 11 arguments):
/// the client batches only tries.
fn push_ticket(inv: &mut Invocation<'_>, a: &AcquireArgs<'_>) {
    if a.ticket > 0 {
        inv.arg(a.ticket);
    }
}

/// Runs hot-path operations in one call: the operation's own script (acquire.lua or
/// release.lua) for one, batch.lua for several. One reply per operation, in order.
pub(crate) fn hot(
    conn: &mut dyn ConnectionLike,
    keys: &Keys,
    ops: &[HotOp<'_>],
) -> Result<Vec<HotReply>> {
    let parse = |op: &HotOp<'_>, v: Value| match op {
        HotOp::Acquire(a) => Acquired::parse(v, a.n).map(HotReply::Acquired),
        HotOp::Release { .. } => Released::parse(v).map(HotReply::Released),
    };
    if let [op] = ops {
        let mut inv = keys.invoke(match op {
            HotOp::Acquire(_) => &ACQUIRE,
            HotOp::Release { .. } => &RELEASE,
        });
        match op {
            HotOp::Acquire(a) => {
                push_acquire(&mut inv, a);
                push_ticket(&mut inv, a);
            }
            HotOp::Release { id } => {
                inv.arg(*id);
            }
        }
        let reply: Value = inv.invoke(conn).map_err(Error::Redis)?;
        return Ok(vec![parse(op, reply)?]);
    }
    let mut inv = keys.invoke(&BATCH);
    // an acquire whose arguments, but for its id and cutoff, are those of the last
    // full one goes as 'A' (the tries of one semaphore handle share them)
    let mut shared: Option<&AcquireArgs<'_>> = None;
    for op in ops {
        match op {
            HotOp::Acquire(a) if shared.is_some_and(|s| s.same_but_id(a)) => {
                inv.arg("A").arg(a.id).arg(a.cutoff_ms.max(1));
            }
            HotOp::Acquire(a) => {
                inv.arg("a");
                push_acquire(&mut inv, a);
                shared = Some(a);
            }
            HotOp::Release { id } => {
                inv.arg("r").arg(*id);
            }
        }
    }
    let replies: Vec<Value> = inv.invoke(conn).map_err(Error::Redis)?;
    if replies.len() != ops.len() {
        return Err(Error::reply(
            "batch",
            format!("{} replies to {} operations", replies.len(), ops.len()),
        ));
    }
    ops.iter()
        .zip(replies)
        .map(|(op, v)| parse(op, v))
        .collect()
}

/// One run of the acquire script.
pub(crate) fn acquire(
    conn: &mut dyn ConnectionLike,
    keys: &Keys,
    args: &AcquireArgs<'_>,
) -> Result<Acquired> {
    let mut inv = keys.invoke(&ACQUIRE);
    push_acquire(&mut inv, args);
    push_ticket(&mut inv, args);
    let reply: Value = inv.invoke(conn).map_err(Error::Redis)?;
    Acquired::parse(reply, args.n)
}

/// Releases `id`. `keep`: keep the keys of a semaphore the release leaves idle (an
/// operator's release, so that the holder learns "released", not "keys gone").
pub(crate) fn release(
    conn: &mut dyn ConnectionLike,
    keys: &Keys,
    id: &str,
    keep: bool,
) -> Result<Released> {
    let mut inv = keys.invoke(&RELEASE);
    inv.arg(id);
    if keep {
        inv.arg("1");
    }
    let reply: Value = inv.invoke(conn).map_err(Error::Redis)?;
    Released::parse(reply)
}

/// What the refresh script said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// The semaphore's keys are gone.
    Reset,
    /// These ids are no longer held; the others were renewed.
    Lost(Vec<String>),
}

/// What the adopt script found of a handed-over permit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Adoption {
    /// Held and live, with the token and slots given: renewed. With how long ago it
    /// was granted (server time; `None`: its record does not say).
    Renewed { held: Option<Duration> },
    /// Held and live, but granted at least the adopter's max hold ago: taken over as
    /// it is, not renewed. With how long ago it was granted, and what is left of its
    /// lease (both server time).
    HeldOut { held: Duration, left: Duration },
    /// Not held (released, force-released, or ended and purged before).
    NotHeld,
    /// The semaphore's keys are gone.
    KeysGone,
    /// Held, but its lease had ended: purged, not renewed.
    Ended,
    /// Held with another token or other slots than those given: not renewed.
    Mismatch,
}

/// Takes over permit `id`, which must be held with `token` and `slots`, renewing its
/// lease to `lease_ms` from now unless it was granted `max_hold_ms` ago or more
/// (adopt.lua).
pub(crate) fn adopt(
    conn: &mut dyn ConnectionLike,
    keys: &Keys,
    lease_ms: u64,
    id: &str,
    token: u64,
    slots: &[u32],
    max_hold_ms: Option<u64>,
) -> Result<Adoption> {
    let slots: Vec<String> = slots.iter().map(u32::to_string).collect();
    let reply: Vec<i64> = keys
        .invoke(&ADOPT)
        .arg(lease_ms)
        .arg(pad_ms(lease_ms))
        .arg(id)
        .arg(token)
        .arg(slots.join(","))
        .arg(max_hold_ms.map_or(String::new(), |ms| ms.to_string()))
        .invoke(conn)
        .map_err(Error::Redis)?;
    match reply.as_slice() {
        [1] => Ok(Adoption::Renewed { held: None }),
        &[1, held] if held >= 0 => Ok(Adoption::Renewed {
            held: Some(Duration::from_millis(held as u64)),
        }),
        &[2, held, left] if held >= 0 && left >= 1 => Ok(Adoption::HeldOut {
            held: Duration::from_millis(held as u64),
            left: Duration::from_millis(left as u64),
        }),
        [0] => Ok(Adoption::NotHeld),
        [-1] => Ok(Adoption::KeysGone),
        [-2] => Ok(Adoption::Ended),
        [-3] => Ok(Adoption::Mismatch),
        other => Err(Error::reply("adopt", format!("{other:?}"))),
    }
}

/// Renews the leases of `ids` (at most 1000) to `lease_ms` from now.
pub(crate) fn refresh(
    conn: &mut dyn ConnectionLike,
    keys: &Keys,
    lease_ms: u64,
    ids: &[&str],
) -> Result<Renewal> {
    let mut inv = keys.invoke(&REFRESH);
    inv.arg(lease_ms).arg(pad_ms(lease_ms));
    for id in ids {
        inv.arg(*id);
    }
    let reply: Vec<Value> = inv.invoke(conn).map_err(Error::Redis)?;
    let mut it = reply.into_iter();
    match it.next() {
        Some(Value::Int(-1)) => Ok(Renewal::Reset),
        Some(Value::Int(0)) => {
            let gone = it
                .map(|v| match v {
                    Value::BulkString(b) => String::from_utf8(b)
                        .map_err(|_| Error::reply("refresh", "permit id is not UTF-8")),
                    other => Err(Error::reply(
                        "refresh",
                        format!("unexpected element {other:?}"),
                    )),
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Renewal::Lost(gone))
        }
        other => Err(Error::reply(
            "refresh",
            format!("unexpected status {other:?}"),
        )),
    }
}

/// `WAIT replicas timeout_ms`: blocks until `replicas` replicas acknowledged every
/// write this connection made so far, or `timeout_ms` passed (never 0: that would
/// block for ever), and says how many did. Not a script: inside a script `WAIT`
/// returns at once, so it must follow the write as its own command on the same
/// connection.
pub(crate) fn wait_replicas(
    conn: &mut dyn ConnectionLike,
    replicas: u32,
    timeout_ms: u64,
) -> Result<u32> {
    let acked: i64 = redis::cmd("WAIT")
        .arg(replicas)
        .arg(timeout_ms.max(1))
        .query(conn)
        .map_err(Error::Redis)?;
    u32::try_from(acked).map_err(|_| Error::reply("wait", format!("{acked} replicas")))
}

/// The cancel script's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cancelled {
    /// The waiter left the queue (or was not in it).
    Left { now_ms: i64 },
    /// The waiter had been granted meanwhile: the grant stands.
    Granted { now_ms: i64, grant: Grant },
}

/// Takes waiter `id` out of the queue, or reports the grant it got meanwhile.
pub(crate) fn cancel(conn: &mut dyn ConnectionLike, keys: &Keys, id: &str) -> Result<Cancelled> {
    let reply: Vec<i64> = keys
        .invoke(&CANCEL)
        .arg(id)
        .invoke(conn)
        .map_err(Error::Redis)?;
    let now = |ms: &i64| server_time("cancel", "the server's time", *ms);
    match reply.as_slice() {
        [0, now_ms] => Ok(Cancelled::Left {
            now_ms: now(now_ms)?,
        }),
        [1, now_ms, token, deadline, slots @ ..] => {
            let now_ms = now(now_ms)?;
            Ok(Cancelled::Granted {
                now_ms,
                grant: grant("cancel", now_ms, *token, *deadline, slots)?,
            })
        }
        other => Err(Error::reply("cancel", format!("{other:?}"))),
    }
}

/// Stores `limit` for `retention_ms` at least; returns the limit stored before (-1:
/// none).
pub(crate) fn set_limit(
    conn: &mut dyn ConnectionLike,
    keys: &Keys,
    limit: u32,
    retention_ms: u64,
) -> Result<i64> {
    keys.invoke(&SET_LIMIT)
        .arg(limit)
        .arg(retention_ms)
        .invoke(conn)
        .map_err(Error::Redis)
}

/// What the inspect script reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Inspect {
    /// The counts only.
    Counts,
    /// The counts and every unexpired holder.
    Holders,
}

/// A holder as the inspect script lists it: its id, its record
/// ("permits|token|slots|acquired_ms|pid|host|label") and its deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HolderRecord {
    pub(crate) id: String,
    pub(crate) record: String,
    pub(crate) deadline_ms: i64,
}

/// The inspect script's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Inspected {
    /// The limit in force (the stored one, else the caller's).
    pub(crate) limit: u32,
    pub(crate) used: u32,
    pub(crate) queued: u32,
    pub(crate) stored: Option<u32>,
    pub(crate) client: Option<u32>,
    pub(crate) exists: bool,
    /// Another limit a client passed since the keys were made, when clients disagree.
    pub(crate) other: Option<u32>,
    /// With [`Inspect::Holders`]: the server's time and the holders, soonest deadline
    /// first.
    pub(crate) holders: Option<(i64, Vec<HolderRecord>)>,
}

/// Reads the semaphore's counts (and holders), purging what has expired.
pub(crate) fn inspect(
    conn: &mut dyn ConnectionLike,
    keys: &Keys,
    limit: u32,
    what: Inspect,
) -> Result<Inspected> {
    let reply: Vec<Value> = keys
        .invoke(&INSPECT)
        .arg(limit)
        .arg(match what {
            Inspect::Counts => "count",
            Inspect::Holders => "holders",
        })
        .invoke(conn)
        .map_err(Error::Redis)?;
    let bad = |detail: &str| Error::reply("inspect", detail);
    let [
        limit,
        used,
        queued,
        stored,
        client,
        exists,
        other,
        rest @ ..,
    ] = reply.as_slice()
    else {
        return Err(bad("short reply"));
    };
    let count = |v: &Value, what: &str| -> Result<u32> {
        u32::try_from(int(v)?).map_err(|_| bad(&format!("{what} out of range")))
    };
    let optional = |v: &Value| -> Result<Option<u32>> { Ok(u32::try_from(int(v)?).ok()) };
    let holders = match what {
        Inspect::Counts => None,
        Inspect::Holders => {
            let [now, rest @ ..] = rest else {
                return Err(bad("holders: no time"));
            };
            if rest.len() % 3 != 0 {
                return Err(bad("holders: ragged list"));
            }
            let list = rest
                .chunks(3)
                .map(|c| {
                    let id = text(&c[0])?;
                    let deadline_ms = server_time(
                        "inspect",
                        // (Debug: the id is any member another program wrote, and an
                        // error may be printed on a terminal)
                        &format!("the deadline of holder {id:?}"),
                        int(&c[2])?,
                    )?;
                    Ok(HolderRecord {
                        id,
                        record: text(&c[1])?,
                        deadline_ms,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            Some((
                server_time("inspect", "the server's time", int(now)?)?,
                list,
            ))
        }
    };
    Ok(Inspected {
        limit: count(limit, "limit")?,
        used: count(used, "used")?,
        queued: count(queued, "queue length")?,
        stored: optional(stored)?,
        client: optional(client)?,
        exists: int(exists)? == 1,
        other: optional(other)?,
        holders,
    })
}

/// A server time (ms), `what` a reply of `script` gives: one in `1..=END_OF_TIME_MS`,
/// as every time the scripts read or write is, else a malformed reply (no arithmetic
/// on it can then overflow).
fn server_time(script: &'static str, what: &str, ms: i64) -> Result<i64> {
    if (1..=END_OF_TIME_MS).contains(&ms) {
        Ok(ms)
    } else {
        Err(Error::reply(
            script,
            format!("{what} ({ms}) is out of the range of server times"),
        ))
    }
}

/// The token, deadline and slots of a grant reply that read the server's time `now_ms`.
///
/// A grant's deadline is after the server's time of the reply: a new grant lasts a
/// lease from then, and an earlier one is answered only while it is live. One that is
/// not (a deadline another program wrote into the holders' zset, past 2^63 in Lua,
/// reaches the client as `i64::MIN`), or one past the scripts' end of time, is a
/// malformed reply. A slot is below [`MAX_PERMITS`], as every limit is.
fn grant(
    script: &'static str,
    now_ms: i64,
    token: i64,
    deadline_ms: i64,
    slots: &[i64],
) -> Result<Grant> {
    let slots = slots
        .iter()
        .map(|&s| {
            u32::try_from(s)
                .ok()
                .filter(|&s| s < MAX_PERMITS)
                .ok_or_else(|| Error::reply(script, format!("slot {s} out of range")))
        })
        .collect::<Result<Vec<u32>>>()?;
    let token = u64::try_from(token).map_err(|_| Error::reply(script, "negative token"))?;
    if deadline_ms <= now_ms || deadline_ms > END_OF_TIME_MS {
        return Err(Error::reply(
            script,
            format!(
                "a grant until server time {deadline_ms}, which is not after the server's \
                 time {now_ms} or past the end of time (a deadline out of range)"
            ),
        ));
    }
    Ok(Grant {
        token,
        deadline_ms,
        slots,
    })
}

fn int(v: &Value) -> Result<i64> {
    match v {
        Value::Int(i) => Ok(*i),
        other => Err(Error::reply(
            "inspect",
            format!("expected an integer, got {other:?}"),
        )),
    }
}

fn text(v: &Value) -> Result<String> {
    match v {
        Value::BulkString(b) => {
            String::from_utf8(b.clone()).map_err(|_| Error::reply("inspect", "text is not UTF-8"))
        }
        Value::SimpleString(s) => Ok(s.clone()),
        other => Err(Error::reply(
            "inspect",
            format!("expected text, got {other:?}"),
        )),
    }
}

/// `TIME` of the node that holds the semaphore of `keys`: the server's clock in ms.
pub(crate) fn server_time_ms(conn: &mut dyn ConnectionLike, keys: &Keys) -> Result<i64> {
    server_time_at(conn, &keys.info)
}

/// `TIME` of the node that holds `key` (a script keyed on it: on a cluster a bare
/// `TIME` goes to any node), in ms.
pub(crate) fn server_time_at(conn: &mut dyn ConnectionLike, key: &str) -> Result<i64> {
    let (secs, micros): (i64, i64) = SERVER_TIME
        .prepare_invoke()
        .key(key)
        .invoke(conn)
        .map_err(Error::Redis)?;
    time_ms(secs, micros)
}

/// `TIME`'s seconds and microseconds in milliseconds, checked: microseconds below a
/// million, and a time in the range of server times.
pub(super) fn time_ms(secs: i64, micros: i64) -> Result<i64> {
    let ms = secs
        .checked_mul(1000)
        .filter(|_| (0..1_000_000).contains(&micros))
        .and_then(|ms| ms.checked_add(micros / 1000));
    match ms {
        Some(ms) => server_time("time", "the server's time", ms),
        None => Err(Error::reply(
            "time",
            format!("TIME answered {secs} s and {micros} µs, out of range"),
        )),
    }
}

/// Which semaphores a scan looks for, by the key every one of them has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The leased semaphore: its info key `redsem:{NAME}:i`.
    Leased,
    /// The counting semaphore: its count key `redsem:{NAME}:count`.
    Counting,
}

impl Kind {
    fn suffix(self) -> &'static str {
        match self {
            Kind::Leased => "i",
            Kind::Counting => "count",
        }
    }
}

/// The `SCAN` step of [`scan_names`]; the names are taken from the keys found.
fn scan_cmd(cursor: u64, pattern: &str, kind: Kind) -> redis::Cmd {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(format!("redsem:{{{pattern}}}:{}", kind.suffix()))
        .arg("COUNT")
        .arg(1000);
    cmd
}

/// One `SCAN` step over the keys that semaphores of `kind` whose name matches the glob
/// `pattern` have: the next cursor (0 at the end) and the names found in this step.
pub(crate) fn scan_names(
    conn: &mut dyn ConnectionLike,
    cursor: u64,
    pattern: &str,
    kind: Kind,
) -> Result<(u64, Vec<String>)> {
    let (next, keys): (u64, Vec<Vec<u8>>) = scan_cmd(cursor, pattern, kind)
        .query(conn)
        .map_err(Error::Redis)?;
    Ok((next, names_of(keys, kind)))
}

/// [`scan_names`] on one node of a cluster (`SCAN` is not routed by key: each primary
/// is scanned in turn).
pub(crate) fn scan_names_at(
    conn: &mut ClusterConn,
    node: &(String, u16),
    cursor: u64,
    pattern: &str,
    kind: Kind,
) -> Result<(u64, Vec<String>)> {
    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
        host: node.0.clone(),
        port: node.1,
    });
    let reply = conn
        .route_command(&scan_cmd(cursor, pattern, kind), routing)
        .map_err(Error::Redis)?;
    let (next, keys): (u64, Vec<Vec<u8>>) =
        redis::from_redis_value(reply).map_err(|e| Error::reply("scan", e.to_string()))?;
    Ok((next, names_of(keys, kind)))
}

/// The primaries of a cluster (`CLUSTER SLOTS`: the first node of each slot range).
pub(crate) fn cluster_primaries(conn: &mut ClusterConn) -> Result<Vec<(String, u16)>> {
    let mut primaries = Vec::new();
    for (_, _, node) in cluster_slot_owners(conn)? {
        if !primaries.contains(&node) {
            primaries.push(node);
        }
    }
    Ok(primaries)
}

/// A range of a cluster's slots: its first and last slot, and the host and port of the
/// primary serving it.
pub(crate) type SlotRange = (u16, u16, (String, u16));

/// Which primary serves each slot range of a cluster (`CLUSTER SLOTS`): its first and
/// last slot and the primary's host and port, in the server's order.
pub(crate) fn cluster_slot_owners(conn: &mut ClusterConn) -> Result<Vec<SlotRange>> {
    cluster_slot_owners_at(conn, None)
}

/// [`cluster_slot_owners`] as the node `at` says it (`None`: any node, as the cluster
/// client picks one).
pub(crate) fn cluster_slot_owners_at(
    conn: &mut ClusterConn,
    at: Option<&(String, u16)>,
) -> Result<Vec<SlotRange>> {
    let cmd = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
    let reply = match at {
        Some((host, port)) => conn.route_command(
            &cmd,
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: host.clone(),
                port: *port,
            }),
        ),
        None => cmd.query(conn),
    };
    let ranges: Vec<Vec<Value>> = redis::from_redis_value(reply.map_err(Error::Redis)?)
        .map_err(|e| Error::reply("cluster slots", e.to_string()))?;
    let bad = |what: String| Error::reply("cluster slots", what);
    let mut owners = Vec::with_capacity(ranges.len());
    for range in ranges {
        let mut range = range.into_iter();
        let (Some(first), Some(last), Some(node)) = (range.next(), range.next(), range.next())
        else {
            return Err(bad("a range without a node".into()));
        };
        let slot = |v: Value| -> Result<u16> {
            redis::from_redis_value::<u16>(v)
                .ok()
                .filter(|s| *s < SLOTS)
                .ok_or_else(|| bad("a slot out of range".into()))
        };
        let (first, last) = (slot(first)?, slot(last)?);
        let (host, port): (String, u16) = match node {
            Value::Array(parts) if parts.len() >= 2 => {
                let mut parts = parts.into_iter();
                let (h, p) = (parts.next(), parts.next());
                (
                    redis::from_redis_value(h.unwrap_or(Value::Nil))
                        .map_err(|e| bad(e.to_string()))?,
                    redis::from_redis_value(p.unwrap_or(Value::Nil))
                        .map_err(|e| bad(e.to_string()))?,
                )
            }
            other => return Err(bad(format!("node {other:?}"))),
        };
        owners.push((first, last, (host, port)));
    }
    Ok(owners)
}

/// How many hash slots a Redis Cluster has.
const SLOTS: u16 = 16384;

/// The hash slot of `key` in a Redis Cluster: the CRC16 (XMODEM) of its hash tag (what
/// lies between its first `{` and the first `}` after it, when not empty), else of the
/// whole key, as the server and the cluster client compute it.
pub(crate) fn slot_of(key: &[u8]) -> u16 {
    let tag = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tag.unwrap_or(key)) % SLOTS
}

/// `WAIT` on a cluster, sent to the primary of `key`'s slot (plain `WAIT` would go to
/// every primary); see [`wait_replicas`].
pub(crate) fn wait_replicas_at(
    conn: &mut ClusterConn,
    key: &str,
    replicas: u32,
    timeout_ms: u64,
) -> Result<u32> {
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(replicas).arg(timeout_ms.max(1));
    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_slot(
        Slot::for_key(key),
        SlotAddr::Master,
    )));
    let reply = conn.route_command(&cmd, routing).map_err(Error::Redis)?;
    let acked: i64 =
        redis::from_redis_value(reply).map_err(|e| Error::reply("wait", e.to_string()))?;
    u32::try_from(acked).map_err(|_| Error::reply("wait", format!("{acked} replicas")))
}

/// [`wait_replicas_at`] with the cluster connection's read timeout set to `window` for
/// the wait (its standing one, `standing`, is one attempt's share of the operation
/// timeout, while `WAIT` blocks for its own) and put back to `standing` after, the
/// `WAIT` shortened to be answered within `window` ([`wait_ms_within`]).
pub(crate) fn wait_replicas_at_within(
    conn: &mut ClusterConn,
    key: &str,
    replicas: u32,
    timeout_ms: u64,
    window: std::time::Duration,
    standing: std::time::Duration,
) -> Result<u32> {
    let _ = conn.read_within(Some(window));
    let acked = wait_replicas_at(conn, key, replicas, wait_ms_within(timeout_ms, window));
    let _ = conn.read_within(Some(standing));
    acked
}

/// The semaphore names of the keys a scan for `kind` found.
/// A key whose name is not UTF-8 (another program's: the library's names are `&str`)
/// names no semaphore this library can open, and is skipped, not an error that would
/// hide every other semaphore.
fn names_of(keys: Vec<Vec<u8>>, kind: Kind) -> Vec<String> {
    let tail = format!("}}:{}", kind.suffix());
    keys.iter()
        .filter_map(|k| std::str::from_utf8(k).ok())
        .filter_map(|k| k.strip_prefix("redsem:{")?.strip_suffix(tail.as_str()))
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn a_key_s_slot_is_the_one_the_cluster_client_routes_it_by() {
        for key in [
            "redsem:{jobs}:h",
            "redsem:{jobs}:s",
            "plain",
            "{}empty-tag",
            "{a}{b}",
            "no{close",
            "}{x}",
            "",
            "redsem:{über}:h",
        ] {
            assert_eq!(
                Slot::new(slot_of(key.as_bytes())),
                Some(Slot::for_key(key)),
                "{key}"
            );
        }
        // the server's own figures (CLUSTER KEYSLOT)
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
    }

    #[test]
    fn the_fast_paths_short_replies_read_as_the_long_ones() {
        assert_eq!(
            Acquired::parse(Value::Int(0), 1).unwrap(),
            Acquired::Busy {
                now_ms: None,
                retry_ms: -1,
                head: false,
                ticket: 0,
            }
        );
        let long = Value::Array(
            [1, 1_700_000_000_000, 42, 1_700_000_010_000, 3]
                .into_iter()
                .map(Value::Int)
                .collect(),
        );
        let short = bulk("1700000000000|42|1700000010000|3");
        assert_eq!(
            Acquired::parse(short, 1).unwrap(),
            Acquired::parse(long, 1).unwrap()
        );
    }

    #[test]
    fn a_malformed_short_reply_is_an_error_not_a_panic() {
        for text in [
            "",
            "1|2|3",
            "1|2|3|4|5",
            "a|2|3|4",
            "1|-2|3|4",
            "1|2|3|-1",
            "1|2|3|99999999999",
            "\u{fffd}",
        ] {
            assert!(
                matches!(
                    Acquired::parse(bulk(text), 1),
                    Err(Error::UnexpectedReply { .. })
                ),
                "{text:?}"
            );
        }
        // a short grant is of one permit only
        assert!(Acquired::parse(bulk("1|2|3|4"), 2).is_err());
        assert!(Acquired::parse(Value::BulkString(vec![0xff, b'|']), 1).is_err());
    }

    /// A queued reply carries the waiter's arrival ticket (ops.lua); the form without
    /// it (an older script) is still read, as no ticket, and so is one out of the
    /// scripts' range (a queue edited by hand).
    #[test]
    fn a_queued_reply_carries_its_ticket() {
        const NOW: i64 = 1_700_000_000_000;
        let busy = |head, ticket| Acquired::Busy {
            now_ms: Some(NOW),
            retry_ms: 250,
            head,
            ticket,
        };
        let parse = |r: &[i64]| Acquired::parse(array(r), 1).unwrap();
        assert_eq!(parse(&[0, NOW, 250, 1, 7]), busy(true, 7));
        assert_eq!(parse(&[0, NOW, 250, 0, 7]), busy(false, 7));
        assert_eq!(parse(&[0, NOW, 250, 0]), busy(false, 0));
        assert_eq!(parse(&[0, NOW, 250, 0, -3]), busy(false, 0));
        assert_eq!(parse(&[0, NOW, 250, 0, (1 << 53) + 1]), busy(false, 0));
        assert_eq!(parse(&[0, NOW, 250, 0, 1 << 53]), busy(false, 1 << 53));
        assert!(Acquired::parse(array(&[0, NOW, 250, 0, 7, 8]), 1).is_err());
    }

    fn array(items: &[i64]) -> Value {
        Value::Array(items.iter().copied().map(Value::Int).collect())
    }

    /// Times and deadlines in replies were taken as they came: a deadline of
    /// `i64::MIN` (what a real Redis answers for a holder's score another program set
    /// past 2^63) reached the clock conversion, which panicked in a debug build
    /// (`attempt to subtract with overflow`) and wrapped round to a permit valid for
    /// 292 million years in a release build. A time out of the scripts' range, or a
    /// grant whose deadline is not after the reply's time, is a malformed reply now.
    #[test]
    fn times_and_deadlines_out_of_range_are_malformed_replies() {
        const NOW: i64 = 1_700_000_000_000;
        let min = i64::MIN.to_string();
        let max = i64::MAX.to_string();
        let malformed = |r: Result<Acquired>| matches!(r, Err(Error::UnexpectedReply { .. }));
        for text in [
            format!("{NOW}|1|{min}|0"),
            format!("{NOW}|1|{max}|0"),
            format!("{NOW}|1|{NOW}|0"),
            format!("{NOW}|1|{}|0", NOW - 1),
            format!("{min}|1|{NOW}|0"),
            format!("0|1|{NOW}|0"),
            format!("{max}|1|{max}|0"),
            format!("{}|1|{}|0", END_OF_TIME_MS + 1, END_OF_TIME_MS + 2),
        ] {
            assert!(malformed(Acquired::parse(bulk(&text), 1)), "{text}");
        }
        for reply in [
            [1, NOW, 1, i64::MIN, 0].as_slice(),
            &[1, NOW, 1, NOW, 0],
            &[1, i64::MIN, 1, NOW, 0],
            &[1, NOW, 1, NOW + 1000, 10_000],
            &[0, i64::MIN, 5, 1],
            &[0, -1, 5, 1],
            &[-1, i64::MAX, 5],
            &[-2, 0],
        ] {
            assert!(malformed(Acquired::parse(array(reply), 1)), "{reply:?}");
        }
        // the last moment of a lease that ends a millisecond on is a grant
        assert!(Acquired::parse(bulk(&format!("{NOW}|1|{}|0", NOW + 1)), 1).is_ok());
        assert!(Acquired::parse(array(&[1, NOW, 1, NOW + 1000, 9_999]), 1).is_ok());
    }

    /// `TIME` was read as `secs * 1000 + micros / 1000` unchecked: seconds of
    /// `i64::MAX` panicked with `attempt to multiply with overflow` (a debug build) or
    /// wrapped round (a release build). It is checked now.
    #[test]
    fn a_server_time_out_of_range_is_a_malformed_reply() {
        assert_eq!(time_ms(1_700_000_000, 123_456).unwrap(), 1_700_000_000_123);
        for (secs, micros) in [
            (i64::MAX, 0),
            (i64::MIN, 0),
            (-1, 0),
            (0, 0),
            (1_700_000_000, -1),
            (1_700_000_000, 1_000_000),
            (i64::MAX / 1000, 999_999),
            (END_OF_TIME_MS / 1000 + 1, 0),
        ] {
            assert!(
                matches!(time_ms(secs, micros), Err(Error::UnexpectedReply { .. })),
                "{secs} {micros}"
            );
        }
    }
}
