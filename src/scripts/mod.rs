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

use std::sync::LazyLock;
use std::time::Duration;

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
}

/// A call's operation key (`once.lua`): on Redis Cluster the cluster client resends a
/// command whose reply did not come in time, and the script's first run records its
/// reply here, so that a resent run changes nothing; a give-back owed to the
/// background thread is sent again for minutes, each send under one such key.
#[derive(Debug, Clone)]
pub(crate) struct Once {
    key: String,
    /// The script's last argument: how long the key stays (ms, longer than every
    /// resend of the call can come), or `@` and the server time after which a run of
    /// the call is refused (the key then stays until that time and a second).
    retention: String,
}

impl Once {
    /// On Redis Cluster (`cluster`), a fresh operation key under `prefix` for one call,
    /// kept twice the operation timeout and ten seconds more, since every resend of a
    /// call is sent within one operation timeout (at most 2^32 - 1 ms, 49 days, which
    /// the scripts take). `None` on one server, where nothing resends.
    fn on_cluster(cluster: bool, prefix: &str, op_timeout: Duration) -> Option<Once> {
        cluster.then(|| {
            let retention = op_timeout
                .saturating_mul(2)
                .saturating_add(Duration::from_secs(10));
            Once {
                key: format!("{prefix}{}", uuid::Uuid::new_v4()),
                retention: (retention.as_millis().min(u128::from(u32::MAX)) as u64).to_string(),
            }
        })
    }

    /// A fresh operation key under `prefix` on every deployment, for a call this
    /// library sends again in the background: every run after server time
    /// `not_after_ms` is refused before its first write, and the run that applies
    /// keeps the key until then (and a second). Fixed before the first send, it makes
    /// the call apply at most once however late a send of it runs.
    fn until(prefix: &str, not_after_ms: i64) -> Once {
        Once {
            key: format!("{prefix}{}", uuid::Uuid::new_v4()),
            retention: format!("@{}", not_after_ms.max(1)),
        }
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
        }
    }

    /// On Redis Cluster, a fresh operation key for one call ([`Once`]).
    pub(crate) fn once(&self, cluster: bool, op_timeout: Duration) -> Option<Once> {
        Once::on_cluster(cluster, &self.op_prefix, op_timeout)
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
