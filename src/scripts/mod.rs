//! The Lua side of the protocol: one script per operation, each run through
//! [`Script`] (EVALSHA, and EVAL on a server that lacks it), and the key layout they
//! share.
//!
//! Every script is `head.lua` (key names, the server's time), `common.lua` (key layout,
//! invariants K1–K9, helpers), for the hot path then `ops.lua` (acquire and release as
//! functions), followed by its own body; the invariants each part keeps are written at
//! its top. The hot-path scripts (acquire, release, batch) carry the fast paths
//! (`fast.lua` and the fast operations they call) and an entry part between `head.lua`
//! and `common.lua`: a plain grant, "no" or release returns before the full logic is
//! even set up. `sources.rs` lists each script's parts.
//!
//! This is the protocol layer: [`leased`] and [`counting`] have one typed function per
//! script call (arguments in, a typed reply out), and [`book`] one per step of the
//! "Redis in Action" semaphores' command-level protocol, so the modules above never
//! build `ARGV`, a command or a pipeline, nor read a `redis::Value`. It depends only on
//! `error`.

pub(crate) mod book;
pub(crate) mod counting;
pub(crate) mod leased;
pub(crate) mod redisson;
mod script;
mod sources;

use std::sync::{Arc, LazyLock, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::clock::Anchor;
use crate::error::Result;

/// The largest limit and permit count the scripts take (`MAX_LIMIT` in head.lua),
/// and the most permits the acquires of one batch may ask for in all (K9).
pub(crate) const MAX_PERMITS: u32 = 10_000;

/// The scripts' end of time (`END_OF_TIME` in head.lua, server ms, about the year
/// 287,000): no server time or deadline they write or answer lies beyond it (the
/// longest span an argument gives is 300 years, `MAX_MS`). A time in a reply outside
/// `1..=END_OF_TIME_MS` is not the server's: a malformed reply, or a key another
/// program wrote (a Lua number past 2^63 reaches the client as `i64::MIN`).
pub(crate) const END_OF_TIME_MS: i64 = 9_000_000_000_000_000;

pub(crate) use script::{Invocation, Script};

/// Grants permits to a permit id, or answers when to try again.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(sources::ACQUIRE));
/// Frees the permits of a permit id.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(sources::RELEASE));
/// Several try-acquires and releases in one call (see `combine.rs`).
pub(crate) static BATCH: LazyLock<Script> = LazyLock::new(|| Script::new(sources::BATCH));
/// Renews the leases of a batch of permit ids.
pub(crate) static REFRESH: LazyLock<Script> = LazyLock::new(|| Script::new(sources::REFRESH));
/// Takes over a handed-over permit, checked against its record.
pub(crate) static ADOPT: LazyLock<Script> = LazyLock::new(|| Script::new(sources::ADOPT));
/// Reads limit, permits in use and holders.
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(sources::INSPECT));
/// Takes a waiter out of the queue.
pub(crate) static CANCEL: LazyLock<Script> = LazyLock::new(|| Script::new(sources::CANCEL));
/// The server's `TIME`, in a script on the semaphore's info key: on a cluster it runs
/// on the node that holds the semaphore (a bare `TIME` goes to any node).
pub(crate) static SERVER_TIME: LazyLock<Script> =
    LazyLock::new(|| Script::new("return redis.call('TIME')"));
/// Stores a limit for every client.
pub(crate) static SET_LIMIT: LazyLock<Script> = LazyLock::new(|| Script::new(sources::SET_LIMIT));

macro_rules! counting_script {
    ($file:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("once.lua"),
                include_str!("counting_common.lua"),
                include_str!($file)
            ))
        })
    };
}

/// Counting semaphore (P): takes permits if the count has them, else queues a waiter.
pub(crate) static COUNTING_ACQUIRE: LazyLock<Script> = counting_script!("counting_acquire.lua");
/// Counting semaphore (V): gives permits back and tells the waiters that fit.
pub(crate) static COUNTING_RELEASE: LazyLock<Script> = counting_script!("counting_release.lua");
/// Counting semaphore: changes the count by a signed delta.
pub(crate) static COUNTING_ADD: LazyLock<Script> = counting_script!("counting_add.lua");
/// Counting semaphore: sets the count once, when unset.
pub(crate) static COUNTING_TRY_SET: LazyLock<Script> = counting_script!("counting_try_set.lua");
/// Counting semaphore: takes every free permit.
pub(crate) static COUNTING_DRAIN: LazyLock<Script> = counting_script!("counting_drain.lua");
/// Counting semaphore: a waiter leaves the queue.
pub(crate) static COUNTING_CANCEL: LazyLock<Script> = counting_script!("counting_cancel.lua");
/// Counting semaphore: reads the count and the queue length.
pub(crate) static COUNTING_INSPECT: LazyLock<Script> = counting_script!("counting_inspect.lua");

/// The keys of one counting semaphore, in the order the counting scripts take them.
#[derive(Debug, Clone)]
pub(crate) struct CountingKeys {
    pub(crate) count: String,
    pub(crate) queue: String,
    pub(crate) heartbeats: String,
    pub(crate) waiters: String,
    /// The prefix of the operation keys (`once.lua`).
    op_prefix: String,
    /// The clock of the node of its slot, for the operation keys' deadlines.
    clock: NodeClock,
}

/// A call's operation key (`once.lua`): a call may be sent more than once (on Redis
/// Cluster the cluster client resends a command whose reply did not come in time; a
/// counting or `RSemaphore` call whose connection broke is sent again on another),
/// and the script's first run records its reply here, so that a resent run changes
/// nothing; a give-back owed to the background thread is sent again for minutes,
/// each send under one such key.
#[derive(Debug, Clone)]
pub(crate) struct Once {
    key: String,
    /// The script's last argument: `@` and the server time after which a run of the
    /// call is refused when it finds no key (the run that applies keeps the key until
    /// that time and a second).
    retention: String,
}

impl Once {
    /// A fresh operation key under `prefix` for a call: every run after server time
    /// `not_after_ms` that finds no key is refused before its first write, and the run
    /// that applies keeps the key until then (and a second). Fixed before the first
    /// send, it makes the call apply at most once however late a send of it runs (a
    /// request held in a socket buffer or a partition for minutes).
    fn until(prefix: &str, not_after_ms: i64) -> Once {
        Once {
            key: format!("{prefix}{}", uuid::Uuid::new_v4()),
            // (at most 15 digits, as once.lua takes a deadline: far past any clock)
            retention: format!("@{}", not_after_ms.clamp(1, 999_999_999_999_999)),
        }
    }
}

/// How long after a call is made its sends may still run (every resend of the cluster
/// client leaves within one operation timeout): twice the operation timeout and ten
/// seconds more.
fn send_window(op_timeout: Duration) -> Duration {
    op_timeout
        .saturating_mul(2)
        .saturating_add(Duration::from_secs(10))
}

/// How long a reading of a node's clock serves the deadlines of operation keys.
const NODE_CLOCK_FOR: Duration = Duration::from_secs(60);

/// The clock of the node that serves one layout's hash slot on a cluster, as last read
/// (`TIME` on that node), for the deadlines of its operation keys; shared by the
/// clones of the layout's keys, and by a client's handles of the layout
/// ([`ClientInner::node_clock`](crate::client::ClientInner::node_clock)): a new handle
/// needs no `TIME` of its own. A cache: any two compare equal.
#[derive(Debug, Clone, Default)]
pub(crate) struct NodeClock(Arc<Mutex<Option<Anchor>>>);

/// The reading a [`NodeClock`] keeps, shared by the clocks made of it.
pub(crate) type NodeReading = Mutex<Option<Anchor>>;

impl PartialEq for NodeClock {
    fn eq(&self, _: &NodeClock) -> bool {
        true
    }
}

impl Eq for NodeClock {}

impl NodeClock {
    /// The clock whose reading is `reading` (shared with every clock made of it).
    pub(crate) fn of(reading: Arc<NodeReading>) -> NodeClock {
        NodeClock(reading)
    }

    /// Drops the last reading: the next call reads the node's clock again.
    fn forget(&self) {
        *self.0.lock() = None;
    }

    /// A server time (ms) the node has surely reached by now: from the last reading
    /// while it is under [`NODE_CLOCK_FOR`] old, else from a new one, `read` (the
    /// node's `TIME`, on the connection of the call).
    fn now_ms(&self, read: impl FnOnce() -> Result<i64>) -> Result<i64> {
        let now = Instant::now();
        let last = *self.0.lock();
        if let Some(a) = last
            && now.saturating_duration_since(a.received) < NODE_CLOCK_FOR
        {
            return Ok(a.server_ms_by(now));
        }
        let sent = Instant::now();
        let server_ms = read()?;
        let a = Anchor {
            sent,
            received: Instant::now(),
            server_ms,
        };
        *self.0.lock() = Some(a);
        Ok(a.server_ms_by(Instant::now()))
    }
}

/// The operation key of one call that changes a count without an owner to check (the
/// counting semaphore's, the Redisson layouts'), made at its first send
/// ([`on`](Self::on)) and the same for every later send of the call: its deadline is
/// the node's time read then (a reading under a minute old, else `TIME` on the call's
/// connection first) and [`send_window`]. Made for every call of the counting
/// semaphore and of `RSemaphore`, which are sent again after a broken connection on
/// every deployment; for the Redisson expirable semaphore's calls (safe to repeat by
/// their permit ids) only on Redis Cluster, whose client resends by itself; none when
/// not keyed.
///
/// A deadline in the server's clock, not a retention counted from the run that
/// applies: a first send held up (a partition that heals, a socket buffer) longer than
/// a retention could run after the key of the resend that applied had gone, and apply
/// a second time; past the deadline it is refused before it writes.
#[derive(Debug)]
pub(crate) struct LazyOnce<'a> {
    /// When keyed: the prefix of the layout's operation keys, a key of its slot, its
    /// node's clock, and the operation timeout.
    keyed: Option<(&'a str, &'a str, &'a NodeClock, Duration)>,
    made: OnceLock<Once>,
}

impl LazyOnce<'_> {
    /// The call's operation key, made on the first call with `conn` (the connection the
    /// call goes out on, routed by the layout's slot); `None` when not keyed. A failed
    /// reading of the node's time fails the call before anything is written.
    pub(crate) fn on(&self, conn: &mut dyn redis::ConnectionLike) -> Result<Option<&Once>> {
        let Some((prefix, key, clock, op)) = self.keyed else {
            return Ok(None);
        };
        if let Some(made) = self.made.get() {
            return Ok(Some(made));
        }
        let now = clock.now_ms(|| leased::server_time_at(conn, key))?;
        let window = i64::try_from(send_window(op).as_millis()).unwrap_or(i64::MAX);
        Ok(Some(self.made.get_or_init(|| {
            Once::until(prefix, now.saturating_add(window))
        })))
    }

    /// Sends the call, `send` (given `conn` and the operation key [`on`](Self::on)
    /// makes), and passes its answer on, after dropping the node's clock reading when
    /// a run was refused for arriving after its deadline: the node that runs the call
    /// now may not be the one read (a failover, a slot moved) and its clock may be
    /// ahead, and every call until the next reading (a minute) would be refused too.
    /// The next call reads the clock of the node that serves the slot.
    pub(crate) fn run<T>(
        &self,
        conn: &mut dyn redis::ConnectionLike,
        send: impl FnOnce(&mut dyn redis::ConnectionLike, Option<&Once>) -> Result<T>,
    ) -> Result<T> {
        let once = self.on(conn)?;
        let answer = send(conn, once);
        if let (Err(e), Some((_, _, clock, _))) = (&answer, self.keyed)
            && e.arrived_late()
        {
            clock.forget();
        }
        answer
    }
}

/// Adds the operation key `once`, if any, after the script's keys and its retention
/// as the script's last argument (an invocation keeps keys and arguments apart, so
/// after the other arguments is all that matters).
pub(crate) fn with_once(inv: &mut Invocation<'_>, once: Option<&Once>) {
    if let Some(o) = once {
        inv.key(&o.key).arg(&o.retention);
    }
}

impl CountingKeys {
    /// The key layout of counting semaphore `name`; `name` holds no `{` or `}`.
    pub(crate) fn new(name: &str) -> CountingKeys {
        CountingKeys {
            count: format!("redsem:{{{name}}}:count"),
            queue: format!("redsem:{{{name}}}:cq"),
            heartbeats: format!("redsem:{{{name}}}:ch"),
            waiters: format!("redsem:{{{name}}}:cw"),
            op_prefix: format!("redsem:{{{name}}}:op:"),
            clock: NodeClock::default(),
        }
    }

    /// These keys with `clock` as their node's clock (a client's, shared by its
    /// handles of the semaphore).
    pub(crate) fn with_clock(mut self, clock: NodeClock) -> CountingKeys {
        self.clock = clock;
        self
    }

    /// The operation key of one call ([`LazyOnce`]); none when not `keyed`.
    pub(crate) fn once(&self, keyed: bool, op_timeout: Duration) -> LazyOnce<'_> {
        LazyOnce {
            keyed: keyed.then_some((
                self.op_prefix.as_str(),
                self.count.as_str(),
                &self.clock,
                op_timeout,
            )),
            made: OnceLock::new(),
        }
    }

    /// Starts an invocation of `script` with the keys in place.
    pub(crate) fn invoke<'a>(&self, script: &'a Script) -> Invocation<'a> {
        let mut inv = script.prepare_invoke();
        inv.key(&self.count)
            .key(&self.queue)
            .key(&self.heartbeats)
            .key(&self.waiters);
        inv
    }
}

/// The keys of one semaphore, in the order the scripts take them.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub(crate) holders: String,
    pub(crate) info: String,
    pub(crate) slots: String,
    pub(crate) queue: String,
}

impl Keys {
    /// The key layout of semaphore `name`; `name` has been checked to hold no `{` or `}`.
    pub(crate) fn new(name: &str) -> Keys {
        Keys {
            holders: format!("redsem:{{{name}}}:h"),
            info: format!("redsem:{{{name}}}:i"),
            slots: format!("redsem:{{{name}}}:s"),
            queue: format!("redsem:{{{name}}}:q"),
        }
    }

    /// Starts an invocation of `script` with the keys in place.
    pub(crate) fn invoke<'a>(&self, script: &'a Script) -> Invocation<'a> {
        let mut inv = script.prepare_invoke();
        inv.key(&self.holders)
            .key(&self.info)
            .key(&self.slots)
            .key(&self.queue);
        inv
    }
}

/// How long past the last deadline the keys are kept: at most one second, and never
/// more than the lease, so an idle semaphore's keys are gone soon after its last lease.
pub(crate) fn pad_ms(lease_ms: u64) -> u64 {
    lease_ms.clamp(1, 1000)
}

/// How long a queued waiter lives without a heartbeat renewal, and how long a permit
/// pushed to it lasts before its client renews it: at most one second, and never more
/// than the lease, so a process that dies while waiting costs the others about a
/// second, whatever the lease.
pub(crate) fn heartbeat_ms(lease_ms: u64) -> u64 {
    lease_ms.clamp(1, 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag() {
        let k = Keys::new("market:acct:42");
        for key in [&k.holders, &k.info, &k.slots, &k.queue] {
            assert!(key.starts_with("redsem:{market:acct:42}:"), "{key}");
        }
    }

    #[test]
    fn counting_keys_share_one_hash_tag_and_stay_apart_from_the_leased_ones() {
        let k = CountingKeys::new("jobs");
        let leased = Keys::new("jobs");
        for key in [&k.count, &k.queue, &k.heartbeats, &k.waiters] {
            assert!(key.starts_with("redsem:{jobs}:"), "{key}");
            for other in [&leased.holders, &leased.info, &leased.slots, &leased.queue] {
                assert_ne!(key, other);
            }
        }
        for s in [
            &COUNTING_ACQUIRE,
            &COUNTING_RELEASE,
            &COUNTING_ADD,
            &COUNTING_TRY_SET,
            &COUNTING_DRAIN,
            &COUNTING_CANCEL,
            &COUNTING_INSPECT,
        ] {
            assert_eq!(s.get_hash().len(), 40);
        }
        assert!(!include_str!("counting_common.lua").starts_with("#!"));
    }

    #[test]
    fn scripts_start_with_the_prelude_and_have_no_shebang() {
        for s in [
            &ACQUIRE, &RELEASE, &BATCH, &REFRESH, &ADOPT, &INSPECT, &SET_LIMIT, &CANCEL,
        ] {
            assert_eq!(s.get_hash().len(), 40);
        }
        assert!(!include_str!("head.lua").starts_with("#!"));
    }

    #[test]
    fn the_end_of_time_is_the_scripts() {
        assert!(
            include_str!("head.lua").contains(&format!("local END_OF_TIME = {END_OF_TIME_MS}\n"))
        );
    }

    #[test]
    fn padding_is_bounded_by_lease_and_one_second() {
        assert_eq!(pad_ms(100), 100);
        assert_eq!(pad_ms(10_000), 1000);
        assert_eq!(pad_ms(0), 1);
    }
}
