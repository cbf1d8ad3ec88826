//! Redisson's `RSemaphore` and `RPermitExpirableSemaphore`, spoken on Redisson's own
//! keys, so a Rust service can share a semaphore with Java services that use Redisson
//! (the Redis client most Java teams run), without either side moving first.
//!
//! | type | made by | keys | Redisson class |
//! |---|---|---|---|
//! | [`RSemaphore`] | [`Client::redisson_semaphore`] | counter `NAME`, channel `redisson_sc:{NAME}` | `RSemaphore` |
//! | [`RPermitExpirableSemaphore`] | [`Client::redisson_permit_expirable_semaphore`] | counter `NAME`, lease zset `{NAME}:timeout`, channel `redisson_sc:{NAME}` | `RPermitExpirableSemaphore` (the layout since Redisson 3.17: ids stored as 16 raw bytes) |
//!
//! When the name holds a `{` of its own, the lease zset is `NAME:timeout` and the
//! channel `redisson_sc:NAME`, as Redisson names them. Every state change is one Lua
//! script with the same effects on the keys and the channel as Redisson's script for
//! that operation, step by step (reclaim, counter, zset, publish), so Java clients see
//! nothing unusual.
//!
//! A call may have to be sent again: on Redis Cluster the cluster client resends a
//! command whose reply is late (it may have run), and on every deployment a call
//! whose connection broke (the server closed it while it sat idle in the pool: its
//! `timeout` setting, `CLIENT KILL`, a restart; or a reset on the way, perhaps after
//! the call ran) is sent again on another connection. So that a resent call does not
//! change the counter twice, each `RSemaphore` call that changes the counter also
//! writes a short-lived operation key of this library, `{NAME}:redsem-op:<uuid>`
//! (`NAME:redsem-op:<uuid>` for a name with a `{`), kept for twice the operation
//! timeout and eleven seconds more, and so do `RPermitExpirableSemaphore`'s
//! `add_permits` and `try_set_permits` (and, on a cluster, its releases: one by id is
//! safe to send twice without it, the key makes a resent run answer the first one's
//! reply); a resent run finds it and changes nothing. (A failed `RSemaphore` give-back
//! of permits no replica acknowledged carries one kept longer: see "Failover" below.)
//! A resent `RPermitExpirableSemaphore` acquire finds its new ids already held and
//! takes nothing again. (Redisson's own client, which resends as well, has neither.)
//!
//! # What it costs (read before use)
//!
//! These types keep Redisson's guarantees, not the crate's: they are limit-exact on one
//! Redis primary, and no more.
//!
//! - **`RSemaphore` has no owners and no leases.** Like
//!   [`CountingSemaphore`](crate::CountingSemaphore): a process that acquires and
//!   crashes has taken the permits for good, anyone may release any number (there is no
//!   upper bound, Redisson #5066), and the counter key has no TTL unless
//!   [`try_set_permits_with_ttl`](RSemaphore::try_set_permits_with_ttl) gave it one.
//! - **Client-clock leases.** `RPermitExpirableSemaphore` stores each lease deadline as
//!   the *acquiring client's* epoch milliseconds, and every call compares them with the
//!   *calling client's* clock (Redisson never calls `TIME`). The crate's "server time
//!   only" rule cannot hold on a shared layout: the clocks of every Java and Rust host
//!   must agree (NTP) to well within the shortest lease. A host whose clock runs ahead
//!   by Δ reclaims other holders' permits Δ early, which lets more than the limit hold
//!   a permit at once.
//! - **Expired permits come back only when someone calls.** Redisson has no server-side
//!   expiry of a permit: any later call (an acquire, `available_permits`,
//!   `lease_time`...) reclaims the expired ones. A waiter whose acquire saw a lease
//!   running retries at its deadline (the `':<deadline>'` answer).
//! - **A counter with a TTL ends the leases with it.** An acquire gives the lease
//!   zset the counter's TTL, as Redisson's does (`trySetPermits` with a time to live,
//!   [`RSemaphore::try_set_permits_with_ttl`]), and the permits in it go when it
//!   expires, whatever their leases. A [`Permit`] counts its lease no further than the
//!   TTL its grant, or any later renewal or `update_lease_time`, found on the zset.
//! - **No fencing token.** Nothing in this layout increases per grant: [`Permit::token`]
//!   is 0 and [`Permit::slots`] is empty. A holder whose lease ran out cannot be fenced
//!   off downstream.
//! - **No keepalive by default.** Redisson has none (a permit is renewed by
//!   `updateLeaseTime`); these permits are renewed in the background only with
//!   [`with_auto_refresh(true)`](RPermitExpirableSemaphore::with_auto_refresh) (the
//!   client's background thread runs `updateLeaseTime`'s steps every third of the
//!   lease, for all the permits of one semaphore handle and lease in one script
//!   call: permits of handles made apart are renewed by separate calls).
//!   Otherwise call [`Permit::refresh`] (the same steps) or
//!   [`update_lease_time`](RPermitExpirableSemaphore::update_lease_time) before the
//!   lease runs out. Such a permit is watched by nothing: when its lease ends,
//!   [`Permit::lease_left`] reaches zero (which, with `is_lost()`, is what "valid"
//!   means), but [`Permit::lost`] does not fire and [`Permit::is_lost`] stays false
//!   until a call finds it gone.
//! - **Not fair.** Woken waiters race, and a `try_acquire` may take what a waiter was
//!   told about; nothing in Redis records waiters.
//! - **Redisson's other known weaknesses come along:** reads that write
//!   (`available_permits`, `permits`, `acquired_permits` and `lease_time` reclaim
//!   expired permits first); a set-up race (`try_set_permits` only sets an absent
//!   counter, and [`set_permits`](RPermitExpirableSemaphore::set_permits) may take the
//!   counter below zero when fewer permits are wanted than are held); a wake-up message
//!   lost on the way (recovered here by a re-check every second). Permit ids come from
//!   Redisson's non-cryptographic generator on the Java side: do not treat an id as a
//!   secret.
//! - **Failover.** Redisson follows each write with `WAIT` when replicas exist; this
//!   module does so only when asked ([`RSemaphore::with_replica_wait`],
//!   [`RPermitExpirableSemaphore::with_replica_wait`]). Without it, a write acknowledged
//!   by a primary that fails before its replica copied it is lost, permits included;
//!   with it, as in Redisson, the window narrows to writes that some but not all
//!   replicas had (the wait fails only when *no* replica acknowledged). An acquire
//!   that no replica acknowledged gives its permits back; when that give-back fails
//!   (a dropped connection, a timeout), it is owed to the client's background thread,
//!   sent again until it succeeds (until the lease has surely ended, at most ten
//!   minutes) and once more when the client is dropped, as the crate's own releases
//!   owed after a lost reply are. An expirable permit's give-back is by its id, safe
//!   to send again. An `RSemaphore`'s has no id, and a send whose reply was lost may
//!   have run: each of its sends carries one operation key of this library
//!   (`{NAME}:redsem-op:<uuid>`, written on every deployment for this give-back), so
//!   it is applied once whatever the number of sends. Before the first send the client
//!   reads the server's time and fixes a deadline eleven minutes on: a send that runs
//!   after it (held up in a paused server, say) is refused before it writes, and the
//!   key is kept until then, so no send, however late, finds it gone. It is sent again
//!   for ten minutes at most, and permits whose give-back never got through stay taken
//!   (fewer holders than the limit, never more).
//! - **A lost reply.** An `RPermitExpirableSemaphore` acquire whose connection broke
//!   is sent again on another one (see "Connections the server closed" below); one
//!   that still fails after it may have reached the server (a timeout, a dropped
//!   connection again) gives back the ids it made, at once and once more an operation
//!   timeout later, on a thread of its own (Redisson leaves them taken: without a
//!   lease, for good). A request held up on its
//!   way for longer than that still takes its permits, until their lease ends if any.
//!   An `RSemaphore` acquire has no ids: a lost reply may have taken permits nobody
//!   gives back, as in Redisson. A [`Permit`]'s release that fails in a way worth
//!   another try (a timeout, a failover: [`Error::is_retryable`]) is owed to the
//!   client's background thread and sent again (by its id, safe to repeat) until the
//!   lease has surely ended, or for ten minutes at most without one, as the crate's
//!   own releases are.
//!
//! # Connections the server closed
//!
//! The client's pool sends no `PING` when it hands a connection out (DESIGN invariant
//! 12), so it hands out connections the server closed while they sat idle: Redis's
//! `timeout` setting, a cloud's or a load balancer's idle cut (Azure Cache for Redis
//! closes connections idle for 10 minutes), `CLIENT KILL`, a restart. The first
//! request on one fails (a reset, "unexpected end of file"), and the pool drops it.
//! Every call of `RPermitExpirableSemaphore` is safe to send twice, and one that
//! failed so is sent again, with the same arguments, on another connection (a new one
//! once the pool's idle ones are used up), by the same bound, its replica wait (when
//! on) after the send that answered (which first writes a short-lived marker key
//! under the operation-key prefix: its own run may have written nothing, and `WAIT`
//! counts from the connection's last write); a call that timed out is not, as its
//! request may still run:
//!
//! - **acquires** (each try of a blocking one): the ids are made before the call,
//!   and a run that finds one of them held takes nothing again, so a grant whose
//!   reply was lost ends as the `Permit`s of the send that answered. Their leases
//!   count from before the first send, whose clock reading every send carries as the
//!   lease deadline: the client's deadline is never later than the server's. Not
//!   granted by a later send, the ids are given back as a failed acquire's are (an
//!   earlier send held up on its way by a proxy could still take them);
//! - **releases** (by id, a `Permit`'s, its drop), **renewals** (`Permit::refresh`,
//!   the background ones: `ZADD GT` to one deadline), `update_lease_time` (it sets the
//!   deadline it is given), `set_permits` (it sets a total), and the **reads** and
//!   `lease_time` (a second reclaim at the same client time finds nothing more);
//! - `add_permits` and `try_set_permits`, which a second run would not repeat
//!   exactly (it would add again; it would answer `false` to the call that set the
//!   counter), carry an operation key of this library on every deployment (see
//!   above): a resent run answers the first run's reply and changes nothing.
//!
//! A server that ran a request and then closed its connection cannot be told apart
//! from one that had closed it before: redis-rs reports both as a read that found the
//! connection ended (the write into a connection the server closed succeeds on the
//! client's side). So only calls safe to run twice are sent again.
//!
//! # Wake-ups
//!
//! A blocked acquire tries once; then it subscribes to `redisson_sc:{NAME}` on a
//! connection of its own (taken for the wait and closed after it), tries again, and
//! then waits for a message before each new try. A message is a decimal count of the
//! permits that may proceed: a positive count makes the waiter try again, zero or
//! below wakes nobody, as in Redisson. A waiter also tries again every second (a lost
//! message) and, on `RPermitExpirableSemaphore`, at the nearest lease deadline (a
//! lease scored below 0, which nothing reclaims, is no deadline). A subscription lost
//! during the wait (a dropped connection, `CLIENT KILL TYPE pubsub`) is made again,
//! at most once a second; until then the waiter polls every 50 ms.
//! Releases, `add_permits` and `try_set_permits` publish with `PUBLISH` by default,
//! as Redisson does on one server, Sentinel or master/replica set-ups. On Redis
//! Cluster the default is [`PublishCommand::Both`]: `SPUBLISH` for Redisson's waiters
//! on a Redis 7 cluster (its default `shardedSubscriptionMode = AUTO` subscribes with
//! `SSUBSCRIBE`) and `PUBLISH` for the others (Redisson on Redis 6.2, or with sharding
//! turned off, and this library's waiters); the two namespaces do not see each other.
//! The blocking `redis` client cannot `SSUBSCRIBE`, so Rust waiters do not hear
//! Redisson's `SPUBLISH`: with [`PublishCommand::SPublish`] they poll every 50 ms
//! instead of subscribing, and with [`PublishCommand::Both`] they subscribe (and hear
//! this library's releases at once) and also look again every 50 ms.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_semaphore::Client;
//!
//! let client = Client::open("redis://127.0.0.1:6379/")?;
//! // The same semaphore as Java's `redisson.getPermitExpirableSemaphore("reports")`.
//! let sem = client.redisson_permit_expirable_semaphore("reports");
//! sem.try_set_permits(5)?;
//! if let Some(permit) = sem.acquire_timeout(Duration::from_secs(1), Some(Duration::from_secs(30)))? {
//!     println!("holding {}", permit.id()); // the hex id Java's release(id) takes
//!     // ... work, calling permit.refresh() before 30 s have passed ...
//! } // dropped: released
//!
//! // The same counter as Java's `redisson.getSemaphore("orders:ready")`.
//! let items = client.redisson_semaphore("orders:ready");
//! items.release(1)?;
//! # Ok::<(), redis_semaphore::Error>(())
//! ```

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::client::Client;
use crate::clock::{
    IoTimeouts, deadline_in, left_until, pubsub_read_within, wait_end, wait_ms_within,
};
use crate::error::{Error, LostReason, Result};
use crate::listener::{open_subscriber, quit_pubsub};
use crate::permit::{Grantor, Permit};
use crate::registry::{GiveBack, GroupKey, PermitState, Renew};
use crate::scripts::leased;
use crate::scripts::redisson::{
    self as calls, NO_LEASE, PesAcquire, PesCount, PesLease, PesReleased, RedissonKeys,
};
use crate::scripts::{Keys, LazyOnce, Once};
use crate::shared::Shared;
use crate::stats::Counters;

/// How often a waiter tries again without a message (a lost wake-up).
const RECHECK: Duration = Duration::from_secs(1);
/// How often a waiter tries while it cannot subscribe (or with `SPUBLISH`).
const NO_PUSH_POLL: Duration = Duration::from_millis(50);
/// The longest lease accepted: its deadline must stay far below Redisson's no-lease
/// score.
const MAX_LEASE: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// The most permits one call takes (each is an id in the script's arguments).
const MAX_MANY: u32 = 10_000;
/// How long a give-back of permits that no replica acknowledged, and that failed, is
/// sent again in the background when nothing else ends them (an `RSemaphore`'s, an
/// `RPermitExpirableSemaphore` permit's without a lease): an outage or a failover
/// shorter than this does not lose them for good.
const OWED_FOR: Duration = Duration::from_secs(600);
/// How much longer than [`OWED_FOR`] (from the server time read before its first send)
/// an owed `RSemaphore` give-back may still run, at the least (twice the operation
/// timeout when that is longer: [`give_back_deadline`]): a send written just before
/// the last moment still applies if it runs within this, and any send that runs later
/// (held in a paused server, say, or a socket buffer) is refused by the script, so it
/// can never find its operation key gone and apply a second time.
const LATE_SEND_MARGIN: Duration = Duration::from_secs(60);

/// The command that announces freed permits on `redisson_sc:{NAME}`. Every client of a
/// semaphore must use one that its waiters subscribe to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum PublishCommand {
    /// `PUBLISH` (Redisson's choice except on a Redis 7 cluster): the default except
    /// on Redis Cluster.
    #[default]
    Publish,
    /// `SPUBLISH` (Redisson's default on a Redis 7+ cluster, `shardedSubscriptionMode
    /// = AUTO`). Rust waiters then poll every 50 ms instead of subscribing.
    SPublish,
    /// Both `SPUBLISH` and `PUBLISH` (`SPUBLISH` is skipped where Redis does not know
    /// it, before Redis 7): waiters of either kind hear every release. The default on
    /// Redis Cluster, where Redisson's waiters use `SSUBSCRIBE` or `SUBSCRIBE`
    /// depending on the server's version and their settings. Rust waiters subscribe
    /// and also look again every 50 ms (they cannot hear Redisson's `SPUBLISH`).
    Both,
}

impl PublishCommand {
    fn as_str(self) -> &'static str {
        match self {
            PublishCommand::Publish => "PUBLISH",
            PublishCommand::SPublish => "SPUBLISH",
            PublishCommand::Both => "BOTH",
        }
    }
}

/// What the semaphores of this module share: the client, the name, the keys, the
/// settings.
#[derive(Clone)]
struct Common {
    client: Client,
    name: String,
    keys: RedissonKeys,
    publish: PublishCommand,
    recheck: Duration,
    /// Redisson's replica wait: `WAIT` after each write, for at most this long.
    replica_wait: Option<Duration>,
    /// The primary's connected replicas at the last look (`INFO`); -1 before the first.
    /// Shared by the clones, refreshed when `WAIT`'s answer differs, as in Redisson.
    replicas_seen: Arc<AtomicI64>,
}

impl Common {
    /// The name is checked by every call (`run`, `run_write`): the constructors that
    /// use this one return the semaphore itself, as Redisson's `getSemaphore` does.
    fn new(client: &Client, name: &str) -> Common {
        let keys = RedissonKeys::new(name);
        let clock = client.inner.node_clock(&keys.counter);
        Common {
            client: client.clone(),
            name: name.to_owned(),
            keys: keys.with_clock(clock),
            // Redisson publishes with SPUBLISH or PUBLISH on a cluster, depending on
            // the server's version and its settings: both reach its waiters
            publish: if client.inner.shared.is_cluster() {
                PublishCommand::Both
            } else {
                PublishCommand::Publish
            },
            recheck: RECHECK,
            replica_wait: None,
            replicas_seen: Arc::new(AtomicI64::new(-1)),
        }
    }

    /// The same settings with Redisson's replica wait of `timeout` (see
    /// [`RSemaphore::with_replica_wait`]).
    fn with_replica_wait(mut self, timeout: Duration) -> Result<Common> {
        let op = self.shared().op_timeout;
        if timeout < Duration::from_millis(1) || timeout >= op {
            return Err(Error::InvalidArgument(format!(
                "replica wait must be at least 1 ms and shorter than the client's operation \
                 timeout ({op:?}), got {timeout:?}"
            )));
        }
        self.replica_wait = Some(timeout);
        self.replicas_seen = Arc::new(AtomicI64::new(-1));
        Ok(self)
    }

    /// The bound of a try, which never waits: one operation timeout for the wait for a
    /// connection and the call together, and the replica wait after it when there is
    /// one (not the checkout timeout and then an operation timeout per command).
    fn try_end(&self) -> Instant {
        let op = self.shared().op_timeout;
        deadline_in(op + self.replica_wait.unwrap_or_default())
    }

    /// The bound of a release, as of a permit's release (which `Drop` runs): one
    /// operation timeout for all of it, the wait for a connection, the call, the
    /// replica wait and a resend on another connection included (DESIGN invariant 13).
    /// Without it a release that had to wait for a connection (one opened afresh
    /// while a node hangs) took up to the checkout timeout and then an operation
    /// timeout.
    fn release_end(&self) -> Instant {
        deadline_in(self.shared().op_timeout)
    }

    fn named(&self, e: Error) -> Error {
        Counters::bump(&self.shared().stats.errors);
        match e {
            Error::Redis(e) => Error::redis(&self.name, e, self.shared().op_timeout),
            other => other,
        }
    }

    /// A write, Redisson's `syncedEval` way: the call, then (with a replica wait) `WAIT`
    /// for the primary's connected replicas on the same connection. When some replicas
    /// are connected and none acknowledged in time (Redisson's
    /// `NoSyncedSlavesException`), `undo` runs on the call's result (an acquire gives
    /// its permits back; `true`: it did) and the call fails.
    ///
    /// All of it (the checkout, the call and the replica wait) ends by `deadline` when
    /// one is given: a permit's release, which `Drop` runs, waits no longer than the
    /// operation timeout (DESIGN invariant 13), not the checkout timeout and then an
    /// operation timeout per command.
    ///
    /// Every call made so is safe to send twice (an `RSemaphore` call carries an
    /// operation key on every deployment, `once.lua`; an `RPermitExpirableSemaphore`
    /// call carries its ids, or sets what it sets, or an operation key), so one that
    /// fails because its connection was broken (closed by the server while it sat idle
    /// in the pool, or reset) is sent again on another connection, by `deadline` or
    /// one operation timeout after the checkout
    /// ([`Shared::run_resending`](crate::shared::Shared::run_resending)), and the
    /// replica wait follows the send that answered, on its connection. A failed replica wait is
    /// not a reason to send again.
    fn run_write_again<T>(
        &self,
        operation: &'static str,
        deadline: Option<Instant>,
        call: impl Fn(&mut dyn redis::ConnectionLike, &RedissonKeys) -> Result<T>,
        undo: impl FnOnce(&T) -> bool,
    ) -> Result<T> {
        Error::check_name(&self.name, false)?;
        let shared = self.shared();
        let sends = std::cell::Cell::new(0u32);
        let (value, synced) = shared
            .run_resending(deadline, |c| {
                sends.set(sends.get() + 1);
                let value = call(&mut **c, &self.keys)?;
                let synced = self.replica_wait.map(|t| {
                    // A send after the first may write nothing (it finds the first
                    // run's work: an operation key's record, its ids held), and `WAIT`
                    // on a connection that wrote nothing counts every connected
                    // replica at once on a server that moves a connection's offset
                    // only when it writes (Redis's current source): a marker write first, after
                    // which a replica that acknowledges has the first run's writes
                    // too (replication is one ordered stream).
                    if sends.get() > 1 {
                        self.mark(c)?;
                    }
                    self.sync(c, t)
                });
                Ok((value, synced))
            })
            .map_err(|e| self.named(e).during(operation))?;
        self.settle(operation, value, synced, undo)
    }

    /// A write on `conn` (a key of the layout's slot, gone a second later), so that a
    /// `WAIT` after it counts only replicas that have every earlier write of the
    /// layout's node: for a call sent again, whose run may have written nothing.
    fn mark(&self, conn: &mut crate::pool::Conn) -> Result<()> {
        redis::cmd("SET")
            .arg(self.keys.marker_key())
            .arg("sent again")
            .arg("PX")
            .arg(1000)
            .exec(&mut **conn)
            .map_err(Error::Redis)
    }

    /// A write's end, once its call answered `value`: the replica wait's outcome
    /// (`None`: none was asked for), and `undo` when no replica acknowledged.
    fn settle<T>(
        &self,
        operation: &'static str,
        value: T,
        synced: Option<Result<Option<u32>>>,
        undo: impl FnOnce(&T) -> bool,
    ) -> Result<T> {
        let Some(synced) = synced else {
            return Ok(value);
        };
        match synced {
            Ok(None) => Ok(value),
            Ok(Some(connected)) => {
                let given_back = undo(&value);
                Err(if given_back {
                    Error::ReplicasNotAcked {
                        name: self.name.clone(),
                        acked: 0,
                        wanted: connected,
                    }
                } else {
                    Error::NoSyncedReplicas {
                        name: self.name.clone(),
                        operation,
                        connected,
                    }
                })
            }
            Err(e) => {
                // Unknown whether a replica has it: an acquire gives its permits back
                // rather than hold them unconfirmed (ownerless ones would be lost).
                undo(&value);
                Err(self.named(e))
            }
        }
    }

    /// `WAIT <connected replicas> <timeout>` after a write on `conn`, all of it within
    /// what is left of the call `conn` runs (the `WAIT` shortened to fit:
    /// [`wait_ms_within`]). `Some(connected)` when replicas are connected and none
    /// acknowledged.
    fn sync(&self, conn: &mut crate::pool::Conn, timeout: Duration) -> Result<Option<u32>> {
        let timeout_ms = timeout.as_millis() as u64;
        let key = self.keys.counter.as_str();
        let op = self.shared().op_timeout;
        let seen = self.replicas_seen.load(Ordering::Relaxed);
        let call_end = conn.end();
        let left = || call_end.map_or(op, left_until);
        let (acked, connected) = match conn.cluster() {
            Some(mut cluster) => {
                let cluster = &mut *cluster;
                // commands routed by hand: each gets what is left of the call, each
                // attempt its share (WAIT may block for its own), and the connection
                // its operation timeout's share again after
                let mut steps = || -> Result<(u32, u32)> {
                    let _ = cluster.read_within(Some(crate::pool::per_attempt(left())));
                    // (none known: read again, replicas may have come back since)
                    let known = match u32::try_from(seen) {
                        Ok(n) if n > 0 => n,
                        _ => calls::connected_replicas_at(cluster, key)?,
                    };
                    let share = crate::pool::per_attempt(op);
                    let window = (timeout + share).min(left());
                    let acked = leased::wait_replicas_at_within(
                        cluster, key, known, timeout_ms, window, share,
                    )?;
                    let connected = if acked == known {
                        known
                    } else {
                        let _ = cluster.read_within(Some(crate::pool::per_attempt(left())));
                        calls::connected_replicas_at(cluster, key)?
                    };
                    Ok((acked, connected))
                };
                let done = steps();
                let _ = cluster.read_within(Some(crate::pool::per_attempt(op)));
                done?
            }
            None => {
                // (none known: read again at each write, replicas may have come back
                // since; `WAIT 0` would answer 0 at once, equal to the number known,
                // and the number would never be read again)
                let known = match u32::try_from(seen) {
                    Ok(n) if n > 0 => n,
                    _ => calls::connected_replicas(&mut *conn)?,
                };
                let wait_ms = wait_ms_within(timeout_ms, conn.room(op));
                let acked = leased::wait_replicas(&mut *conn, known, wait_ms)?;
                let connected = if acked == known {
                    known
                } else {
                    calls::connected_replicas(&mut *conn)?
                };
                (acked, connected)
            }
        };
        self.replicas_seen
            .store(i64::from(connected), Ordering::Relaxed);
        Ok((acked == 0 && connected > 0).then_some(connected))
    }

    fn shared(&self) -> &Shared {
        &self.client.inner.shared
    }

    /// Owes the give-back `what` (named `id` in logs) to the client's background
    /// thread: sent again from now on until it succeeds or `until` passes, and once
    /// more at the client's drop, as the releases owed after a lost reply are.
    fn owe_give_back(&self, id: String, until: Instant, what: Arc<dyn GiveBack>) {
        let client = &self.client.inner;
        let keys = Arc::new(Keys::new(&self.name));
        client
            .shared
            .registry
            .lock()
            .clean_up_with(&keys, id, until, what);
        client.nudge();
    }

    /// A fresh operation key for one `RSemaphore` call that changes the counter
    /// (`once.lua`), on every deployment: a run of the call sent again (by the cluster
    /// client, whose client resends a command whose reply is late; by
    /// [`run_write_again`](Self::run_write_again) after a broken connection) then
    /// changes nothing.
    fn once(&self) -> LazyOnce<'_> {
        self.keys.once(true, self.shared().op_timeout)
    }

    /// On Redis Cluster only, a fresh operation key for one call that is safe to send
    /// twice without it (an `RPermitExpirableSemaphore` release, by its id): there the
    /// key makes a run the cluster client sent again answer the first one's reply.
    /// Elsewhere no key: a release's hot path pays neither the key nor the reading of
    /// the server's clock it needs.
    fn once_on_cluster(&self) -> LazyOnce<'_> {
        let shared = self.shared();
        self.keys.once(shared.is_cluster(), shared.op_timeout)
    }

    fn publish(&self) -> &'static str {
        self.publish.as_str()
    }

    /// Runs one call that is safe to send twice (a read, one that reclaims) on a
    /// pooled connection, its Redis error named: one whose connection was broken (closed by the server while it sat
    /// idle in the pool, or reset) is sent again, with the same arguments, on another
    /// connection, within one operation timeout
    /// ([`Shared::run_resending`](crate::shared::Shared::run_resending)).
    fn run_again<T>(
        &self,
        operation: &'static str,
        call: impl Fn(&mut dyn redis::ConnectionLike, &RedissonKeys) -> Result<T>,
    ) -> Result<T> {
        Error::check_name(&self.name, false)?;
        let shared = self.shared();
        shared
            .run_resending(None, |c| call(&mut **c, &self.keys))
            .map_err(|e| self.named(e).during(operation))
    }

    /// Redisson's waiting loop: one try; then subscribe to the channel (a connection of
    /// its own) and loop "try, then wait for a positive message, the re-check timer, or
    /// the nearest lease deadline". `None` when `deadline` passed first.
    fn wait<T>(
        &self,
        deadline: Option<Instant>,
        mut attempt: impl FnMut(Option<Instant>) -> Result<Attempt<T>>,
    ) -> Result<Option<T>> {
        // every try of the wait ends by its deadline and one operation timeout (the try
        // in flight at the deadline), the wait for a connection included
        let op = self.shared().op_timeout;
        let end = wait_end(deadline, op);
        if let Attempt::Got(t) = attempt(end)? {
            return Ok(Some(t));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
        let stats = &self.shared().stats;
        Counters::bump(&stats.waits);
        let started = Instant::now();
        // a subscription lost during the wait (a dropped connection, CLIENT KILL TYPE
        // pubsub, a server restart) is made again, at most once per RECHECK: the
        // wait does not fall back to polling for the rest of it
        let mut subscribe_at = Instant::now();
        // whether a subscription was lost and not made again yet (one that could never
        // be made, on a pooled cluster connection say, keeps polling as before)
        let mut resubscribe = false;
        loop {
            subscribe_at = subscribe_at.max(Instant::now()) + RECHECK;
            // the subscription's set-up (connect, SUBSCRIBE) ends by the deadline: the
            // bound is the timeout and the one try in flight at it, not a connect
            // timeout and an operation timeout more
            let mut holder = match self.publish {
                PublishCommand::Publish | PublishCommand::Both => {
                    match open_subscriber(self.shared(), deadline) {
                        Ok(c) => Some(c),
                        Err(e) => {
                            log::warn!(
                                "redis-semaphore: cannot subscribe to {} (polling instead): {e}",
                                self.keys.channel
                            );
                            None
                        }
                    }
                }
                PublishCommand::SPublish => None,
            };
            if let (Some(h), Some(end)) = (holder.as_mut(), end) {
                // a pooled connection is brought back in step by the wait's bound (the
                // rest on a thread of its own)
                h.leave_by(end);
            }
            let sub = holder.as_mut().and_then(|c| c.get()).and_then(|c| {
                let budget = deadline.map_or(op, |d| left_until(d).min(op));
                // the connection is this wait's own (or the user's pool sets its
                // timeouts again on the next checkout)
                let _ = c.io_within(Some(budget));
                // (confirmed: a refusal by an ACL without the channel is no
                // subscription, and the wait polls)
                let subscribed = crate::clock::subscribe(c, &self.keys.channel);
                let ps = c.as_pubsub();
                match subscribed {
                    Ok(()) => Some(ps),
                    Err(e) => {
                        // left without waiting on a server that did not answer (the
                        // holder's connection is closed, or brought back in step)
                        quit_pubsub(ps);
                        log::warn!(
                            "redis-semaphore: cannot subscribe to {} (polling instead): {e}",
                            self.keys.channel
                        );
                        None
                    }
                }
            });
            let mut sub = Leaving { ps: sub };
            if sub.ps.is_some() {
                resubscribe = false;
            }
            loop {
                let retry_at = match attempt(end)? {
                    Attempt::Got(t) => {
                        stats.waited(started.elapsed());
                        return Ok(Some(t));
                    }
                    Attempt::RetryAt(ms) => Some(ms),
                    Attempt::Wait => None,
                };
                let now = Instant::now();
                // a subscriber hears PUBLISH only: where Redisson may SPUBLISH (Both),
                // it also looks again as often as a waiter that cannot subscribe
                let every = match sub.ps {
                    Some(_) if self.publish != PublishCommand::Both => self.recheck,
                    Some(_) => self.recheck.min(NO_PUSH_POLL),
                    None => NO_PUSH_POLL,
                };
                let mut until = now + every;
                if let Some(d) = deadline {
                    until = until.min(d);
                }
                if let Some(ms) = retry_at {
                    // the nearest lease deadline, by this client's clock (at least 1 ms
                    // on, so clocks that disagree cannot make a busy loop)
                    let left = u64::try_from(ms.saturating_sub(now_ms())).unwrap_or(0);
                    until = until.min(now + Duration::from_millis(left.max(1)));
                }
                match sub.ps.as_mut() {
                    Some(ps) => {
                        if let Err(e) = wait_message(ps, until) {
                            log::warn!(
                                "redis-semaphore: subscription to {} lost (subscribing again, \
                                 polling until then): {e}",
                                self.keys.channel
                            );
                            if let Some(ps) = sub.ps.take() {
                                quit_pubsub(ps);
                            }
                            resubscribe = true;
                        }
                    }
                    None => std::thread::sleep(until.saturating_duration_since(Instant::now())),
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    Counters::bump(&stats.wait_gave_up);
                    return Ok(None);
                }
                if resubscribe && Instant::now() >= subscribe_at {
                    // the subscription (and its connection) is left here, a new one
                    // made, and the next try comes after it (a release between the
                    // two is found by that try)
                    break;
                }
            }
        }
    }
}

/// A wait's subscription, left without waiting for the server when the wait ends,
/// however it ends ([`quit_pubsub`]): the holder of its connection then closes it (the
/// wait's own) or brings it back in step with its replies before it goes back to the
/// user's pool, by the wait's bound ([`SubConn::leave_by`](crate::listener::SubConn::leave_by)).
struct Leaving<'a> {
    ps: Option<redis::PubSub<'a>>,
}

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        if let Some(ps) = self.ps.take() {
            quit_pubsub(ps);
        }
    }
}

/// One try of a blocking acquire.
enum Attempt<T> {
    Got(T),
    /// Not now; the nearest lease ends at this client epoch ms.
    RetryAt(i64),
    /// Not now; wait for a message.
    Wait,
}

/// Waits until a message with a positive count arrives (`Ok`) or `until` passes
/// (`Ok` too); an error when the connection failed.
fn wait_message(ps: &mut redis::PubSub<'_>, until: Instant) -> redis::RedisResult<()> {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        pubsub_read_within(ps, Some(left.max(Duration::from_millis(1))))?;
        match ps.get_message() {
            Ok(msg) => {
                let count = msg
                    .get_payload::<String>()
                    .ok()
                    .and_then(|s| s.trim().parse::<i64>().ok());
                match count {
                    Some(n) if n > 0 => return Ok(()),
                    // Redisson wakes min(waiters, n) waiters: nobody for n <= 0
                    Some(_) => {}
                    None => log::warn!("redis-semaphore: ignoring a non-numeric wake-up"),
                }
            }
            // the read timeout is set a little short of what is left (see
            // `pubsub_read_within`): read again until `until`, or every timed-out
            // read would make one more try of the acquire near the wait's end
            Err(e) if e.is_timeout() => {}
            Err(e) => return Err(e),
        }
    }
}

/// Runs `give_back` (the give-back of permits a try took that no replica
/// acknowledged, Redisson's `handleNoSync`) and says whether it gave them back. With
/// `end` (a wait's bound) the caller waits for it no later than then: it runs on a
/// thread of its own, which goes on in the background after `end` (permits without an
/// owner or a lease would be lost for good if it were cut short).
fn give_back_by(end: Option<Instant>, give_back: impl FnOnce() -> bool + Send + 'static) -> bool {
    let Some(end) = end else {
        return give_back();
    };
    match crate::threads::run_aside("redsem-give-back", end, give_back) {
        Ok(Some(given_back)) => given_back,
        Ok(None) => {
            log::warn!(
                "redis-semaphore: giving back permits that no replica acknowledged did not \
                 end by the wait's bound; it goes on in the background"
            );
            false
        }
        Err(e) => {
            log::warn!("redis-semaphore: cannot start a thread to give back permits: {e}");
            false
        }
    }
}

/// Gives back the permits an acquire may have taken before it failed (its reply lost
/// or late: the script may have run), as [`give_back_twice`](crate::threads::give_back_twice)
/// does. The ids are the call's own, so releasing them is safe whatever happened (an
/// id nobody holds changes nothing), and without a lease nothing else ever would. It
/// holds the client's shared state, not a handle: the client's last drop still stops
/// its threads.
fn give_back_after_failure(inner: &PesInner, ids: Vec<[u8; 16]>) {
    let shared = Arc::clone(&inner.common.client.inner.shared);
    let keys = inner.common.keys.clone();
    let name = inner.common.name.clone();
    let publish = inner.publish();
    let again = shared.op_timeout;
    crate::threads::give_back_twice(again, move || {
        // each pass ends within one operation timeout, however many ids and however
        // slow the server: the thread outlives the client by about two at most
        let end = Instant::now() + again;
        for id in &ids {
            let once = keys.once(shared.is_cluster(), shared.op_timeout);
            let released = shared.pool.run_by(Some(end), shared.op_timeout, |c| {
                once.run(&mut **c, |c, op| {
                    calls::pes_release(c, &keys, publish, now_ms(), id, None, op)
                })
            });
            if let Err(e) = released {
                log::warn!(
                    "redis-semaphore: could not give back a permit of {name} whose acquire \
                     failed: {e}"
                );
            }
        }
    });
}

/// An `RSemaphore` give-back of `permits` that no replica acknowledged, owed to the
/// background thread after its first send failed ([`Common::owe_give_back`]).
///
/// A failed send may have run (its reply lost or late), and a second "release n"
/// would then put n permits too many in the counter: more holders than the limit
/// later. So every send of it, the first included, carries the same operation key
/// (`once.lua`, on every deployment): whichever run comes first gives the permits
/// back, and every other run finds the key and changes nothing. The key's deadline is
/// a server time fixed before the first send ([`rs_give_back_once`]): a run after it
/// is refused before any write, and the key outlives it, so however late a send runs
/// it applies at most once. No send leaves after `send_by`; one whose reply was lost
/// for good leaves the permits taken (fewer holders than the limit, never more).
#[derive(Debug)]
struct OwedRsGiveBack {
    keys: RedissonKeys,
    publish: &'static str,
    permits: u32,
    /// The operation key, once the server's time has been read for it (none of the
    /// sends has left before).
    once: OnceLock<Once>,
    send_by: Instant,
}

/// The operation key of an `RSemaphore` give-back, read before its first send: its
/// runs are refused once the server's clock (read now, on the node of the counter)
/// has passed [`give_back_deadline`].
fn rs_give_back_once(
    conn: &mut dyn redis::ConnectionLike,
    keys: &RedissonKeys,
    op_timeout: Duration,
) -> Result<Once> {
    let now = calls::counter_server_time_ms(conn, keys)?;
    Ok(keys.once_until(give_back_deadline(now, op_timeout)))
}

/// The server time after which no run of an owed `RSemaphore` give-back applies, its
/// server's clock read at `now_ms`: [`OWED_FOR`] on (no send leaves later by the
/// client's clock) and a margin for the last send to run, [`LATE_SEND_MARGIN`] or
/// twice the operation timeout (the wait for a connection and the call), whichever is
/// longer.
fn give_back_deadline(now_ms: i64, op_timeout: Duration) -> i64 {
    let margin = LATE_SEND_MARGIN.max(op_timeout.saturating_mul(2));
    let ahead = OWED_FOR.saturating_add(margin).as_millis();
    // (at most 15 digits, as once.lua takes a deadline: far past any server's clock)
    now_ms
        .saturating_add(i64::try_from(ahead).unwrap_or(i64::MAX))
        .min(999_999_999_999_999)
}

impl GiveBack for OwedRsGiveBack {
    fn give_back(
        &self,
        pool: &crate::pool::Pool,
        op_timeout: Duration,
        end: Instant,
    ) -> Result<()> {
        if Instant::now() >= self.send_by {
            return Err(Error::InvalidArgument(format!(
                "the give-back of {} permit(s) of {:?} is past the time its operation key \
                 makes it safe to send again",
                self.permits, self.keys.counter
            )));
        }
        pool.run_by(Some(end), op_timeout, |c| {
            let once = match self.once.get() {
                Some(once) => once,
                None => {
                    let once = rs_give_back_once(&mut **c, &self.keys, op_timeout)?;
                    self.once.get_or_init(|| once)
                }
            };
            calls::rs_release(
                &mut **c,
                &self.keys,
                self.publish,
                self.permits,
                false,
                Some(once),
            )
        })
        .map(|_| ())
    }
}

/// An `RPermitExpirableSemaphore` give-back of permit `id` that no replica
/// acknowledged, owed to the background thread after its first send failed. A release
/// by the acquire's own id is safe to send any number of times: once the id is gone,
/// a run finds nothing and changes nothing.
#[derive(Debug)]
struct OwedPesGiveBack {
    keys: RedissonKeys,
    publish: &'static str,
    id: [u8; 16],
    /// The client's pool connects to a Redis Cluster (each send then carries a
    /// fresh operation key, as every PES release does there).
    cluster: bool,
}

impl GiveBack for OwedPesGiveBack {
    fn give_back(
        &self,
        pool: &crate::pool::Pool,
        op_timeout: Duration,
        end: Instant,
    ) -> Result<()> {
        let once = self.keys.once(self.cluster, op_timeout);
        pool.run_by(Some(end), op_timeout, |c| {
            once.run(&mut **c, |c, op| {
                calls::pes_release(c, &self.keys, self.publish, now_ms(), &self.id, None, op)
            })
        })
        .map(|_| ())
    }
}

/// The client's wall clock in epoch milliseconds: Redisson's time base.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn deadline_of(wait: Duration) -> Instant {
    Instant::now()
        .checked_add(wait)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600))
}

fn check_delta(delta: i64) -> Result<()> {
    if delta == 0 {
        return Err(Error::InvalidArgument("delta must not be 0".into()));
    }
    if delta.unsigned_abs() > u64::from(u32::MAX) {
        return Err(Error::InvalidArgument(
            "delta must be within -(2^32 - 1)..=2^32 - 1".into(),
        ));
    }
    Ok(())
}

impl Client {
    /// The Redisson `RSemaphore` `name`, on Redisson's keys (the counter `name`, the
    /// channel `redisson_sc:{name}`): see [`RSemaphore`] and what
    /// [`compat::redisson`](crate::compat::redisson) costs. No network call is made,
    /// and nothing can fail here: an empty name is refused by each operation
    /// ([`Error::InvalidArgument`], before any network call).
    pub fn redisson_semaphore(&self, name: &str) -> RSemaphore {
        RSemaphore {
            common: Common::new(self, name),
        }
    }

    /// The Redisson `RPermitExpirableSemaphore` `name`, on Redisson's keys (the counter
    /// `name`, the lease zset `{name}:timeout`, the channel `redisson_sc:{name}`): see
    /// [`RPermitExpirableSemaphore`] and what
    /// [`compat::redisson`](crate::compat::redisson) costs. No network call is made,
    /// and nothing can fail here: an empty name is refused by each operation
    /// ([`Error::InvalidArgument`], before any network call).
    pub fn redisson_permit_expirable_semaphore(&self, name: &str) -> RPermitExpirableSemaphore {
        RPermitExpirableSemaphore {
            inner: Arc::new(PesInner::new(Common::new(self, name), false, false)),
        }
    }
}

/// Redisson's `RSemaphore`: an ownerless counting semaphore (Dijkstra's P/V) on the
/// counter key `NAME`, woken through `redisson_sc:{NAME}`. See the
/// [module docs](self) for what it costs.
///
/// Made by [`Client::redisson_semaphore`]. Cheap to clone, `Send + Sync`. Permits have
/// no owner and no lease: a process that acquires and crashes has taken them for good,
/// and anyone may release any number.
///
/// Counts are `i64`: Redisson's counter may be negative after a negative
/// [`add_permits`](Self::add_permits). Redisson's Java API counts in `int`: where Java
/// clients share the semaphore, keep the counter and each call's permits within
/// 2^31 - 1 (Java reads a larger counter wrapped, and its waiters fail on a larger
/// announced count).
#[derive(Clone)]
pub struct RSemaphore {
    common: Common,
}

impl RSemaphore {
    /// The same semaphore, announcing freed permits with `command` (by default
    /// `PUBLISH`, and on Redis Cluster [`PublishCommand::Both`]).
    pub fn with_publish_command(mut self, command: PublishCommand) -> Self {
        self.common.publish = command;
        self
    }

    /// The same semaphore with Redisson's replica wait (Redisson 3.21+ on a
    /// master/replica, Sentinel or Cluster setup): after each write (acquire, release,
    /// `add_permits`, `try_set_permits`, `drain_permits`), `WAIT <connected replicas> <timeout>` on the same connection, the replica
    /// count read from `INFO replication` (`connected_slaves`) and read again when
    /// `WAIT`'s answer differs from it. When replicas are connected and none
    /// acknowledged in time (Redisson's `NoSyncedSlavesException`), an acquire gives
    /// the permits it took back and fails with [`Error::ReplicasNotAcked`] (with
    /// [`Error::NoSyncedReplicas`] when an `acquire_timeout`'s give-back has not ended by
    /// its bound, or when it failed: it goes on in the background, see "Failover" in
    /// the [module docs](self)); any other
    /// write (and a try that took nothing) fails with [`Error::NoSyncedReplicas`] and
    /// stands on the primary. A primary
    /// without replicas costs one `WAIT 0` per write. Redisson's default timeout is
    /// 1 s (`slavesSyncTimeout`). Reads do not wait, as in Redisson. A timeout close
    /// to the operation timeout is shortened so that the server's answer (up to 100 ms
    /// after its own timeout) comes within the operation timeout.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a timeout under 1 ms, or not shorter than the
    /// client's operation timeout (the reply to `WAIT` must come within it).
    pub fn with_replica_wait(self, timeout: Duration) -> Result<Self> {
        Ok(RSemaphore {
            common: self.common.with_replica_wait(timeout)?,
        })
    }

    /// Tests only: how often a waiter tries again without a message.
    #[doc(hidden)]
    pub fn with_recheck(mut self, every: Duration) -> Self {
        self.common.recheck = every.max(Duration::from_millis(1));
        self
    }

    /// The semaphore's name: its counter key.
    pub fn name(&self) -> &str {
        &self.common.name
    }

    /// Sets the counter to `permits` if it does not exist, publishes `permits`, and
    /// returns `true`; `false` and no change when it exists (even at 0). Redisson's
    /// `trySetPermits`: many processes may call it at start-up, one wins.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`]; Redis and pool errors.
    pub fn try_set_permits(&self, permits: u32) -> Result<bool> {
        let publish = self.common.publish();
        let once = self.common.once();
        self.common.run_write_again(
            "try_set_permits",
            None,
            |c, k| once.run(c, |c, op| calls::try_set(c, k, publish, permits, None, op)),
            |_| false,
        )
    }

    /// As [`try_set_permits`](Self::try_set_permits), with a TTL on the counter
    /// (`SET ... PX ttl`, the server's clock): the semaphore disappears after `ttl`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a TTL under 1 ms or over ten years (before any
    /// network call); as `try_set_permits`.
    pub fn try_set_permits_with_ttl(&self, permits: u32, ttl: Duration) -> Result<bool> {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        if ms == 0 {
            return Err(Error::InvalidArgument("ttl must be at least 1 ms".into()));
        }
        // Redis refuses a `PX` past its own range (a Redis error after a round trip)
        if ttl > MAX_LEASE {
            return Err(Error::InvalidArgument(
                "ttl must be at most ten years".into(),
            ));
        }
        let publish = self.common.publish();
        let once = self.common.once();
        self.common.run_write_again(
            "try_set_permits",
            None,
            |c, k| {
                once.run(c, |c, op| {
                    calls::try_set(c, k, publish, permits, Some(ms), op)
                })
            },
            |_| false,
        )
    }

    /// Changes the counter by `delta`, up or down (a missing counter counts as 0), and
    /// publishes the new value (Redisson's `addPermits`). Returns the counter after.
    /// Like Redisson's, it `SET`s the counter, dropping any TTL it had.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for 0 or `|delta| > 2^32 - 1`; [`Error::WrongType`];
    /// Redis and pool errors.
    pub fn add_permits(&self, delta: i64) -> Result<i64> {
        check_delta(delta)?;
        let publish = self.common.publish();
        let once = self.common.once();
        self.common.run_write_again(
            "add_permits",
            None,
            |c, k| once.run(c, |c, op| calls::rs_add(c, k, publish, delta, op)),
            |_| false,
        )
    }

    /// Takes `permits` if the counter has them now, in one round trip; never waits.
    /// The whole call, the wait for a pooled connection when all are busy included,
    /// ends within the operation timeout (and the replica wait, when one is set; when
    /// no replica acknowledged, the give-back of the permits runs before it returns,
    /// and one that fails is left to the client's background thread).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for 0 (Redisson answers `true` without a call);
    /// [`Error::WrongType`]; Redis and pool errors.
    pub fn try_acquire(&self, permits: u32) -> Result<bool> {
        Error::check_permits(permits)?;
        let got = self.try_once(permits, Some(self.common.try_end()), None)?;
        if !got {
            Counters::bump(&self.common.shared().stats.try_failed);
        }
        Ok(got)
    }

    /// One try, its checkout and call (and replica wait) ending by `end`; the give-back
    /// of permits no replica acknowledged ending by `give_back` (`None`: it runs to its
    /// end before the call returns, as a try's does, so that its `NoSyncedReplicas`
    /// means the permits are back).
    fn try_once(
        &self,
        permits: u32,
        end: Option<Instant>,
        give_back: Option<Instant>,
    ) -> Result<bool> {
        let publish = self.common.publish();
        let once = self.common.once();
        let got = self.common.run_write_again(
            "acquire",
            end,
            |c, k| once.run(c, |c, op| calls::rs_try_acquire(c, k, permits, op)),
            |got| {
                // Redisson's handleNoSync: give the permits just taken back (by the
                // wait's bound, when there is one). Nothing ends ownerless permits but
                // this give-back: one that fails is owed to the background thread,
                // every send with one operation key, so that a send whose reply was
                // lost but that ran is not repeated (see `OwedRsGiveBack`).
                if !*got {
                    return false;
                }
                let common = self.common.clone();
                let send_by = deadline_in(OWED_FOR);
                give_back_by(give_back, move || {
                    // the first send is the owed give-back's own (its key's deadline
                    // read before it leaves; a failure to read it sends nothing, and
                    // the background reads it)
                    let owed = Arc::new(OwedRsGiveBack {
                        keys: common.keys.clone(),
                        publish,
                        permits,
                        once: OnceLock::new(),
                        send_by,
                    });
                    let shared = common.shared();
                    let op = shared.op_timeout;
                    let first = owed.give_back(&shared.pool, op, Instant::now() + op);
                    let Err(e) = first.map_err(|e| common.named(e)) else {
                        return true;
                    };
                    log::warn!(
                        "redis-semaphore: could not give back {permits} permit(s) of {} that no \
                         replica acknowledged ({e}); sent again in the background",
                        common.name
                    );
                    common.owe_give_back(
                        format!("{permits} RSemaphore permit(s) of {:?}", common.name),
                        send_by,
                        owed,
                    );
                    false
                })
            },
        )?;
        if got {
            Counters::bump(&self.common.shared().stats.acquired);
        }
        Ok(got)
    }

    /// Takes `permits`, waiting as long as it takes.
    ///
    /// # Blocking
    ///
    /// Until a release (by any client, Java or Rust) leaves enough permits and this
    /// waiter takes them first: it is woken by the channel `redisson_sc:{NAME}`, and
    /// tries again every second in any case. Waits for ever on a semaphore nobody
    /// releases.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    pub fn acquire(&self, permits: u32) -> Result<()> {
        Error::check_permits(permits)?;
        self.wait_for(permits, None)?;
        Ok(())
    }

    /// Takes `permits`, waiting at most `timeout`; `false` when the time is up.
    ///
    /// # Blocking
    ///
    /// As [`acquire`](Self::acquire), bounded by `timeout` plus at most one operation
    /// timeout: the try in flight at the deadline. Subscribing to the channel
    /// (a connection and `SUBSCRIBE`) ends by the deadline too.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    pub fn acquire_timeout(&self, permits: u32, timeout: Duration) -> Result<bool> {
        Error::check_permits(permits)?;
        Ok(self
            .wait_for(permits, Some(deadline_of(timeout)))?
            .is_some())
    }

    fn wait_for(&self, permits: u32, deadline: Option<Instant>) -> Result<Option<()>> {
        self.common.wait(deadline, |end| {
            Ok(if self.try_once(permits, end, end)? {
                Attempt::Got(())
            } else {
                Attempt::Wait
            })
        })
    }

    /// Gives `permits` back (from any process, whether or not it acquired them) and
    /// publishes the new counter, waking waiters on every client. Creates a missing
    /// counter. Returns the counter after. All of it (the wait for a connection, the
    /// call and the replica wait when it is on) ends within the operation timeout, as
    /// a permit's release does.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for 0; [`Error::WrongType`]; Redis and pool errors.
    pub fn release(&self, permits: u32) -> Result<i64> {
        Error::check_permits(permits)?;
        let publish = self.common.publish();
        let once = self.common.once();
        let after = self.common.run_write_again(
            "release",
            Some(self.common.release_end()),
            |c, k| {
                once.run(c, |c, op| {
                    calls::rs_release(c, k, publish, permits, false, op)
                })
            },
            |_| false,
        )?;
        let after = after.ok_or_else(|| Error::reply("redisson_rs_release", "not released"))?;
        Counters::bump(&self.common.shared().stats.released);
        Ok(after)
    }

    /// As [`release`](Self::release), but only when the counter exists (Redisson 4.0's
    /// `releaseIfExists`): `false` and no change when it does not.
    ///
    /// # Errors
    ///
    /// As [`release`](Self::release).
    pub fn release_if_exists(&self, permits: u32) -> Result<bool> {
        Error::check_permits(permits)?;
        let publish = self.common.publish();
        let once = self.common.once();
        let released = self
            .common
            .run_write_again(
                "release",
                Some(self.common.release_end()),
                |c, k| {
                    once.run(c, |c, op| {
                        calls::rs_release(c, k, publish, permits, true, op)
                    })
                },
                |_| false,
            )?
            .is_some();
        if released {
            Counters::bump(&self.common.shared().stats.released);
        }
        Ok(released)
    }

    /// The counter (a plain `GET`): 0 when it does not exist; negative after a
    /// negative [`add_permits`](Self::add_permits).
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] when the key is of another type or holds something that
    /// is not an integer (of at most 15 digits); Redis and pool errors.
    pub fn available_permits(&self) -> Result<i64> {
        // (a read: sent again on another connection when its own broke)
        self.common
            .run_again("available_permits", calls::rs_available)
    }

    /// Sets the counter to 0 and returns what it was (0 when it did not exist; then it
    /// stays absent). Publishes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`]; Redis and pool errors.
    pub fn drain_permits(&self) -> Result<i64> {
        let once = self.common.once();
        self.common.run_write_again(
            "drain_permits",
            None,
            |c, k| once.run(c, |c, op| calls::rs_drain(c, k, op)),
            |_| false,
        )
    }
}

impl std::fmt::Debug for RSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RSemaphore")
            .field("name", &self.common.name)
            .field("publish", &self.common.publish)
            .field("replica_wait", &self.common.replica_wait)
            .finish()
    }
}

/// Redisson's `RPermitExpirableSemaphore`: permits with ids and optional leases, on the
/// counter `NAME` and the lease zset `{NAME}:timeout` (id as 16 raw bytes → deadline in
/// client epoch milliseconds). See the [module docs](self) for what it costs: above
/// all, leases are judged by the clients' clocks.
///
/// Made by [`Client::redisson_permit_expirable_semaphore`]. Cheap to clone,
/// `Send + Sync`. Each permit is a [`Permit`] guard whose [`id`](Permit::id) is the
/// 32-character lowercase hex id that Redisson's API hands out (a Java client can
/// `release` it, and [`release`](Self::release) takes a Java client's id); dropping the
/// guard releases it. A lease of `None` means no lease: the permit is held until
/// released.
#[derive(Clone)]
pub struct RPermitExpirableSemaphore {
    inner: Arc<PesInner>,
}

struct PesInner {
    common: Common,
    accept_hex_ids: bool,
    /// Whether the client's background thread renews the leases of its permits.
    auto_refresh: bool,
    /// This handle's own refresher group ([`PesInner::new`]).
    group_id: u64,
}

/// Gives each [`PesInner`] a refresher group of its own: a group's renewer holds its
/// handle weakly, and a permit of another handle in that group would not be renewed
/// once that handle is gone (while its own grant keeps its own handle alive).
static NEXT_PES_GROUP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl PesInner {
    /// Owes the background thread the release of permit `id`, granted with `lease`: a
    /// release by its own id, safe to send any number of times, sent again until the
    /// lease has surely ended (without one, for at most [`OWED_FOR`]).
    fn owe_release(&self, id: [u8; 16], lease: Option<Duration>) {
        let owed = OwedPesGiveBack {
            keys: self.common.keys.clone(),
            publish: self.publish(),
            id,
            cluster: self.common.shared().is_cluster(),
        };
        let until = deadline_in(lease.unwrap_or(OWED_FOR).min(OWED_FOR));
        let what = format!("{} of {:?}", encode_id(&id), self.common.name);
        self.common.owe_give_back(what, until, Arc::new(owed));
    }

    fn new(common: Common, accept_hex_ids: bool, auto_refresh: bool) -> PesInner {
        PesInner {
            common,
            accept_hex_ids,
            auto_refresh,
            group_id: NEXT_PES_GROUP.fetch_add(1, Ordering::Relaxed),
        }
    }
}

/// One grant's view of the semaphore, for its [`Permit`]: the lease to renew with, and
/// the refresher group its permits are in when renewed in the background.
struct PesGrant {
    inner: Arc<PesInner>,
    lease: Option<Duration>,
    group: Option<GroupKey>,
}

/// The background renewal of a grant's permits: `updateLeaseTime(id, lease)`'s steps
/// for all of them in one script call.
///
/// It holds the semaphore weakly: the refresher keeps it (in the client's registry)
/// until its group comes due, and a strong handle would keep the client alive from
/// inside the client, its threads running for up to a renewal period after the last
/// handle is gone. A live permit holds the semaphore through its grant.
struct PesRenewer {
    inner: std::sync::Weak<PesInner>,
    lease: Duration,
}

impl Renew for PesRenewer {
    fn renew(&self, permits: &[Arc<PermitState>], wait: Duration) -> Result<Vec<String>> {
        // gone: so are its permits (each holds it, and only its own permits are in its
        // group); should one be passed anyway, nothing is known of it (not "renewed":
        // it ends with its deadline)
        let Some(inner) = self.inner.upgrade() else {
            return Err(Error::InvalidArgument(
                "the handle of these permit-expirable permits is gone".into(),
            ));
        };
        let publish = inner.publish();
        let ids = permits
            .iter()
            .map(|p| decode_id(&p.id))
            .collect::<Result<Vec<_>>>()?;
        let sent = Instant::now();
        let now = now_ms();
        let deadline = lease_deadline(now, Some(self.lease));
        // the refresher's bound (the checkout, the call and a replica wait, all in
        // `wait`), not the checkout timeout and an operation timeout: a server that
        // stopped answering must not hold back the loss of the client's other permits
        let by = Instant::now() + wait.min(inner.common.shared().op_timeout);
        // (safe to send twice, `ZADD GT` to one deadline: sent again on another
        // connection when its own broke)
        let (held, ttl) = inner.common.run_write_again(
            "update_lease_time",
            Some(by),
            |c, k| calls::pes_update_leases(c, k, publish, now, &ids, deadline, true),
            |_| false,
        )?;
        if let Some(ttl) = ttl {
            // the leases end with the zset's TTL at the latest (applied before the
            // refresher renews them: a renewal never counts past it)
            for p in permits {
                p.ends_by(crate::clock::lease_end(sent, ttl));
            }
        }
        Ok(permits
            .iter()
            .zip(held)
            .filter(|(_, held)| !held)
            .map(|(p, _)| p.id.clone())
            .collect())
    }
}

fn check_lease(lease: Option<Duration>) -> Result<()> {
    if let Some(l) = lease {
        if l < Duration::from_millis(1) {
            return Err(Error::InvalidArgument("lease must be at least 1 ms".into()));
        }
        if l > MAX_LEASE {
            return Err(Error::InvalidArgument(
                "lease must be at most ten years (use None for no lease)".into(),
            ));
        }
    }
    Ok(())
}

/// The zset score of a lease starting at `now_ms`.
fn lease_deadline(now_ms: i64, lease: Option<Duration>) -> i64 {
    match lease {
        Some(l) => now_ms + l.as_millis() as i64,
        None => NO_LEASE,
    }
}

/// The monotonic instant before which a lease sent at `sent` surely still runs: its
/// score is the clock read after `sent` in whole milliseconds (up to one earlier than
/// the reading) plus the lease in whole milliseconds ([`lease_deadline`]), and a client
/// on the same clock reclaims it once its own reading reaches the score. So the lease
/// counts here in whole milliseconds, less the one of the reading's truncation, as the
/// background renewals count ([`lease_end`](crate::clock::lease_end)).
fn valid_until(sent: Instant, lease: Option<Duration>) -> Instant {
    match lease {
        Some(l) => crate::clock::lease_end(sent, Duration::from_millis(l.as_millis() as u64)),
        None => sent
            .checked_add(Duration::from_secs(100 * 365 * 24 * 3600))
            .unwrap_or_else(|| sent + Duration::from_secs(365 * 24 * 3600)),
    }
}

/// A permit id as Redisson's API shows it: 32 lowercase hex characters.
fn encode_id(id: &[u8; 16]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(32);
    for b in id {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The 16 raw bytes of a hex permit id (either case).
fn decode_id(hex: &str) -> Result<[u8; 16]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 32 || !bytes.iter().all(u8::is_ascii_hexdigit) {
        return Err(Error::InvalidArgument(format!(
            "a Redisson permit id is 32 hex characters, not {hex:?}"
        )));
    }
    let mut id = [0u8; 16];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).unwrap_or("00");
        id[i] = u8::from_str_radix(s, 16).unwrap_or(0);
    }
    Ok(id)
}

fn new_id() -> [u8; 16] {
    uuid::Uuid::new_v4().into_bytes()
}

impl PesInner {
    fn publish(&self) -> &'static str {
        self.common.publish()
    }

    /// A release without the replica wait: the give-back of an acquire that no
    /// replica acknowledged.
    fn release_raw_unsynced(&self, hex: &str) -> Result<PesReleased> {
        let id = decode_id(hex)?;
        let publish = self.publish();
        let now = now_ms();
        let once = self.common.once_on_cluster();
        self.common.run_again("release", |c, k| {
            once.run(c, |c, op| {
                calls::pes_release(c, k, publish, now, &id, None, op)
            })
        })
    }

    /// Releases `hex` (with the replica wait when it is on); all of it, a resend
    /// included, ends by `deadline` ([`Common::release_end`], see
    /// [`Common::run_write_again`]).
    /// After the server's idle timeout, a `CLIENT KILL` or a restart every idle pooled
    /// connection may be dead, and a permit without a lease would then stay taken for
    /// good: a release that failed on a broken connection is sent again on another one
    /// (a release by id is safe to run twice; on a cluster the same operation key
    /// makes a second run answer the first one's reply). Elsewhere "not held" from that
    /// resend is reported as such (the first send may have run, but the permit may as
    /// well have been released by id or reclaimed by another: the holder is told its
    /// work may have overlapped, never the reverse).
    fn release_raw(&self, hex: &str, deadline: Instant) -> Result<PesReleased> {
        let id = decode_id(hex)?;
        // (a pre-3.17 member is the id as Redisson printed it: lowercase hex)
        let legacy = self.accept_hex_ids.then(|| hex.to_ascii_lowercase());
        let legacy = legacy.as_deref();
        let publish = self.publish();
        let now = now_ms();
        let once = self.common.once_on_cluster();
        self.common.run_write_again(
            "release",
            Some(deadline),
            |c, k| {
                once.run(c, |c, op| {
                    calls::pes_release(c, k, publish, now, &id, legacy, op)
                })
            },
            |_| false,
        )
    }
}

impl Grantor for PesGrant {
    fn name(&self) -> &str {
        &self.inner.common.name
    }

    fn op_timeout(&self) -> Duration {
        self.inner.common.shared().op_timeout
    }

    fn release_aside(&self) -> bool {
        self.inner.common.shared().is_cluster()
    }

    fn detach(&self, permit: &PermitState) {
        let shared = self.inner.common.shared();
        let mut registry = shared.registry.lock();
        registry.pes_let_go(&self.inner.common.name, &permit.id);
        if let Some(key) = &self.group {
            registry.deregister(key, &permit.id);
        }
    }

    /// Gives the permit back, all of it (the checkout included) ending within one
    /// operation timeout: `Drop` runs this.
    fn release(&self, permit: &PermitState) -> Result<()> {
        let shared = self.inner.common.shared();
        let stats = &shared.stats;
        let deadline = self.inner.common.release_end();
        self.detach(permit);
        match self.inner.release_raw(&permit.id, deadline) {
            Ok(PesReleased::Live) => {
                Counters::bump(&stats.released);
                Ok(())
            }
            // (counted as `Stats` documents it, as the leased and book releases are:
            // a permit already gone is an expected outcome, an error a failure)
            Ok(PesReleased::Late) => {
                Counters::bump(&stats.release_gone);
                Err(Error::LeaseExpired {
                    id: permit.id.clone(),
                })
            }
            Ok(PesReleased::NotHeld) => {
                Counters::bump(&stats.release_gone);
                Err(Error::PermitLost {
                    id: permit.id.clone(),
                    reason: permit.gone_reason(),
                })
            }
            Err(e) => {
                Counters::bump(&stats.release_failed);
                Counters::bump(&stats.errors);
                if e.is_retryable()
                    && let Ok(id) = decode_id(&permit.id)
                {
                    // a timeout, a failover, a refused connection: sent again by the
                    // background thread, as the leased semaphore's release is; not
                    // left taken, for good when the permit has no lease
                    self.inner.owe_release(id, self.lease);
                }
                Err(e)
            }
        }
    }

    /// `updateLeaseTime(id, lease)` with the permit's own lease.
    fn refresh(&self, permit: &PermitState) -> Result<()> {
        let stats = &self.inner.common.shared().stats;
        Counters::bump(&stats.refresh_calls);
        let id = decode_id(&permit.id)?;
        let sent = Instant::now();
        let now = now_ms();
        let deadline = lease_deadline(now, self.lease);
        let publish = self.inner.publish();
        // safe to send twice (`ZADD GT` to one deadline): sent again on another
        // connection when its own broke, the lease counted from `sent`, before the
        // first send
        let (held, ttl) = self.inner.common.run_write_again(
            "update_lease_time",
            None,
            |c, k| calls::pes_update_lease(c, k, publish, now, &id, deadline, true),
            |_| false,
        )?;
        if let Some(ttl) = ttl {
            permit.ends_by(crate::clock::lease_end(sent, ttl));
        }
        if held {
            permit.renewed(valid_until(sent, self.lease), sent);
            return Ok(());
        }
        let reason = permit.gone_reason();
        permit.mark_lost_counted(reason, stats);
        Err(Error::PermitLost {
            id: permit.id.clone(),
            reason: permit.lost_reason().unwrap_or(reason),
        })
    }
}

impl RPermitExpirableSemaphore {
    /// The same semaphore, announcing freed permits with `command` (by default
    /// `PUBLISH`, and on Redis Cluster [`PublishCommand::Both`]).
    pub fn with_publish_command(self, command: PublishCommand) -> Self {
        let mut common = self.inner.common.clone();
        common.publish = command;
        self.with_common(common, self.inner.accept_hex_ids)
    }

    /// The same semaphore, whose releases (by id, and of its permits) also accept a
    /// lease zset member stored as 32-character hex text: the form Redisson used before
    /// 3.17.0. Off by default. Acquires always store the ≥ 3.17 form (16 raw bytes).
    pub fn with_hex_id_release(self, on: bool) -> Self {
        let common = self.inner.common.clone();
        self.with_common(common, on)
    }

    /// The same semaphore with Redisson's replica wait (Redisson 3.21+ on a
    /// master/replica, Sentinel or Cluster setup): after each write (acquire, release,
    /// `update_lease_time` and refresh, `set_permits`, `try_set_permits`, `add_permits`; each try of a
    /// blocking acquire), `WAIT <connected replicas> <timeout>` on the same connection, the replica
    /// count read from `INFO replication` (`connected_slaves`) and read again when
    /// `WAIT`'s answer differs from it. When replicas are connected and none
    /// acknowledged in time (Redisson's `NoSyncedSlavesException`), an acquire gives
    /// the permits it took back and fails with [`Error::ReplicasNotAcked`] (with
    /// [`Error::NoSyncedReplicas`] when an `acquire_timeout`'s give-back has not ended by
    /// its bound, or when it failed: it goes on in the background, see "Failover" in
    /// the [module docs](self)); any other
    /// write (and a try that took nothing) fails with [`Error::NoSyncedReplicas`] and
    /// stands on the primary. A primary
    /// without replicas costs one `WAIT 0` per write. Redisson's default timeout is
    /// 1 s (`slavesSyncTimeout`). Reads do not wait, as in Redisson. A timeout close
    /// to the operation timeout is shortened so that the server's answer (up to 100 ms
    /// after its own timeout) comes within the operation timeout.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a timeout under 1 ms, or not shorter than the
    /// client's operation timeout (the reply to `WAIT` must come within it).
    pub fn with_replica_wait(self, timeout: Duration) -> Result<Self> {
        let common = self.inner.common.clone().with_replica_wait(timeout)?;
        Ok(self.with_common(common, self.inner.accept_hex_ids))
    }

    /// Tests only: how often a waiter tries again without a message.
    #[doc(hidden)]
    pub fn with_recheck(self, every: Duration) -> Self {
        let mut common = self.inner.common.clone();
        common.recheck = every.max(Duration::from_millis(1));
        self.with_common(common, self.inner.accept_hex_ids)
    }

    fn with_common(&self, common: Common, accept_hex_ids: bool) -> Self {
        RPermitExpirableSemaphore {
            inner: Arc::new(PesInner::new(
                common,
                accept_hex_ids,
                self.inner.auto_refresh,
            )),
        }
    }

    /// The same semaphore, whose permits granted with a lease are renewed by the
    /// client's background thread (`updateLeaseTime`'s steps with the permit's own
    /// lease, every third of it) until they are released or dropped, like the
    /// crate's own semaphore does. Off by default: Redisson has no keepalive, and a
    /// Java client sees nothing odd either way (the lease simply keeps moving). A
    /// renewal that finds the permit gone (reclaimed after it expired, released by
    /// another client) fires [`Permit::lost`].
    pub fn with_auto_refresh(self, on: bool) -> Self {
        RPermitExpirableSemaphore {
            inner: Arc::new(PesInner::new(
                self.inner.common.clone(),
                self.inner.accept_hex_ids,
                on,
            )),
        }
    }

    /// The semaphore's name: its counter key.
    pub fn name(&self) -> &str {
        &self.inner.common.name
    }

    /// A call given the publish command and the client's time, both read once: every
    /// call of this type is safe to send twice with the same arguments, and one that
    /// fails on a broken connection is sent again on another one
    /// ([`Common::run_again`]; see "Connections the server closed" in the
    /// [module docs](self)).
    fn run<T>(
        &self,
        operation: &'static str,
        call: impl Fn(&mut dyn redis::ConnectionLike, &RedissonKeys, &'static str, i64) -> Result<T>,
    ) -> Result<T> {
        let publish = self.inner.publish();
        let now = now_ms();
        self.inner
            .common
            .run_again(operation, |c, k| call(c, k, publish, now))
    }

    /// [`run`](Self::run) for a write: followed by Redisson's replica wait when it is
    /// on, on the connection of the send that answered (see
    /// [`Common::run_write_again`]).
    fn run_write<T>(
        &self,
        operation: &'static str,
        call: impl Fn(&mut dyn redis::ConnectionLike, &RedissonKeys, &'static str, i64) -> Result<T>,
        undo: impl FnOnce(&T) -> bool,
    ) -> Result<T> {
        self.run_write_by(operation, None, call, undo)
    }

    /// [`run_write`](Self::run_write), all of it ending by `end` when one is given
    /// ([`Common::run_write_again`]).
    fn run_write_by<T>(
        &self,
        operation: &'static str,
        end: Option<Instant>,
        call: impl Fn(&mut dyn redis::ConnectionLike, &RedissonKeys, &'static str, i64) -> Result<T>,
        undo: impl FnOnce(&T) -> bool,
    ) -> Result<T> {
        let publish = self.inner.publish();
        let now = now_ms();
        self.inner
            .common
            .run_write_again(operation, end, |c, k| call(c, k, publish, now), undo)
    }

    /// One run of the acquire script for `n` new ids, ending by `end`; the give-back of
    /// permits no replica acknowledged by `give_back` (`None`: before it returns, see
    /// [`RSemaphore::try_once`]).
    ///
    /// A run that failed on a broken connection (a pooled one the server had closed
    /// while it was idle, say) is sent again on another one with the same ids, client
    /// time and lease deadline ([`Common::run_write_again`]): the script finds the ids
    /// of a run that granted them held and takes nothing again, so each grant ends as
    /// these `Permit`s, whose leases count from before the first send, never past the
    /// deadline the server holds.
    fn attempt(
        &self,
        n: u32,
        lease: Option<Duration>,
        end: Option<Instant>,
        give_back: Option<Instant>,
    ) -> Result<Attempt<Vec<Permit>>> {
        let ids: Vec<[u8; 16]> = (0..n).map(|_| new_id()).collect();
        let sent = Instant::now();
        let sends = std::cell::Cell::new(0u32);
        let answer = self.run_write_by(
            "acquire",
            end,
            |c, k, publish, now| {
                sends.set(sends.get() + 1);
                calls::pes_acquire(c, k, publish, now, lease_deadline(now, lease), &ids)
            },
            |answer| {
                // Redisson's handleNoSync: give the permits just taken back (by the
                // wait's bound, when there is one)
                if !matches!(answer, PesAcquire::Granted { .. }) {
                    return false;
                }
                let (inner, ids) = (Arc::clone(&self.inner), ids.clone());
                give_back_by(give_back, move || {
                    let mut all = true;
                    for id in &ids {
                        let Err(e) = inner.release_raw_unsynced(&encode_id(id)) else {
                            continue;
                        };
                        all = false;
                        log::warn!(
                            "redis-semaphore: could not give back a permit of {} that no \
                             replica acknowledged ({e}); sent again in the background",
                            inner.common.name
                        );
                        inner.owe_release(*id, lease);
                    }
                    all
                })
            },
        );
        let answer = match answer {
            Ok(answer) => {
                if sends.get() > 1 && !matches!(answer, PesAcquire::Granted { .. }) {
                    // sent again (a connection broke) and not granted: an earlier send
                    // cannot have granted (the later one would have found its ids
                    // held), unless it is still on its way (held up by a proxy); its
                    // ids are given back as a failed acquire's are, in case
                    give_back_after_failure(&self.inner, ids.clone());
                }
                answer
            }
            Err(e) => {
                if !matches!(e, Error::InvalidArgument(_) | Error::WrongType { .. }) {
                    give_back_after_failure(&self.inner, ids);
                }
                return Err(e);
            }
        };
        Ok(match answer {
            PesAcquire::Granted { ttl } => {
                let stats = &self.inner.common.shared().stats;
                // renewed in the background: a group of its own per handle and lease
                // (its renewer holds the handle weakly: only this handle's permits,
                // which hold it, may be in it); the `{` keeps it apart from a leased
                // semaphore's group, whose name has none
                let renewed = lease.filter(|_| self.inner.auto_refresh);
                let group = renewed.map(|l| GroupKey {
                    name: Arc::from(format!(
                        "redisson-pes:{} {{{}}}",
                        self.inner.common.name, self.inner.group_id
                    )),
                    lease_ms: l.as_millis() as u64,
                    auto: true,
                    // (its renewer waits for replicas itself, `with_replica_wait`)
                    replicas: None,
                });
                let grant: Arc<dyn Grantor> = Arc::new(PesGrant {
                    inner: Arc::clone(&self.inner),
                    lease,
                    group: group.clone(),
                });
                let client = &self.inner.common.client.inner;
                let renewer: Option<Arc<dyn Renew>> = renewed.map(|l| {
                    Arc::new(PesRenewer {
                        inner: Arc::downgrade(&self.inner),
                        lease: l,
                    }) as Arc<dyn Renew>
                });
                let keys = Arc::new(Keys::new(&self.inner.common.name));
                let name: Arc<str> = Arc::from(self.inner.common.name.as_str());
                let permits = ids
                    .iter()
                    .map(|id| {
                        Counters::bump(&stats.acquired);
                        let (state, lost_rx) =
                            PermitState::new(encode_id(id), valid_until(sent, lease));
                        if let Some(ttl) = ttl {
                            // the lease zset expires with the counter's TTL, and every
                            // lease in it with it
                            state.ends_by(crate::clock::lease_end(sent, ttl));
                        }
                        client.shared.registry.lock().pes_hold(&name, &state);
                        if let (Some(key), Some(l)) = (&group, renewed) {
                            let nudge = client.shared.registry.lock().register_with(
                                key.clone(),
                                &keys,
                                (l / 3).max(Duration::from_millis(1)),
                                Arc::clone(&state),
                                renewer.clone(),
                            );
                            if nudge {
                                client.nudge();
                            }
                        }
                        Permit {
                            grantor: Arc::clone(&grant),
                            state,
                            lost_rx,
                            token: 0,
                            slots: Vec::new(),
                            permits: 1,
                            released: false,
                        }
                    })
                    .collect();
                Attempt::Got(permits)
            }
            // a lease scored below 0 (written by hand, or `-inf`) is never reclaimed
            // (reclaim takes [0, now], as Redisson's does): retrying at it would try
            // again every millisecond for the whole wait
            PesAcquire::RetryAt(ms) if ms < 0 => Attempt::Wait,
            PesAcquire::RetryAt(ms) => Attempt::RetryAt(ms),
            PesAcquire::Wait => Attempt::Wait,
        })
    }

    fn check_many(n: u32, lease: Option<Duration>) -> Result<()> {
        Error::check_permits(n)?;
        if n > MAX_MANY {
            return Err(Error::InvalidArgument(format!(
                "at most {MAX_MANY} permits per call"
            )));
        }
        check_lease(lease)
    }

    /// Takes one permit with `lease` (`None`: no lease) if one is free now, after
    /// reclaiming an expired one; one round trip, never waits (Redisson's
    /// `tryAcquire()` / `tryAcquire(-1, lease)`). The whole call, the wait for a pooled
    /// connection when all are busy included, ends within the operation timeout (and
    /// the replica wait, when one is set; when no replica acknowledged, the give-back
    /// of the permits runs before it returns, and one that fails is left to the
    /// client's background thread).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a lease under 1 ms or over ten years;
    /// [`Error::WrongType`]; Redis and pool errors.
    pub fn try_acquire(&self, lease: Option<Duration>) -> Result<Option<Permit>> {
        Ok(self.try_acquire_many(1, lease)?.and_then(|mut v| v.pop()))
    }

    /// Takes `n` permits at once (each its own id and guard, all with `lease`) if `n`
    /// are free now; one round trip, never waits (Redisson's `tryAcquire(n, ...)`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for `n` of 0 or over 10 000, or a bad lease; as
    /// [`try_acquire`](Self::try_acquire).
    pub fn try_acquire_many(&self, n: u32, lease: Option<Duration>) -> Result<Option<Vec<Permit>>> {
        Self::check_many(n, lease)?;
        match self.attempt(n, lease, Some(self.inner.common.try_end()), None)? {
            Attempt::Got(p) => Ok(Some(p)),
            _ => {
                Counters::bump(&self.inner.common.shared().stats.try_failed);
                Ok(None)
            }
        }
    }

    /// Takes one permit with `lease`, waiting as long as it takes (Redisson's
    /// `acquire(lease)`).
    ///
    /// # Blocking
    ///
    /// Until a permit is released (by any client, Java or Rust; woken through
    /// `redisson_sc:{NAME}`) or a held lease ends (it retries at the nearest deadline
    /// the acquire script reports), and it gets the permit first. Tries again every
    /// second in any case.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    pub fn acquire(&self, lease: Option<Duration>) -> Result<Permit> {
        let mut v = self.acquire_many(1, lease)?;
        v.pop()
            .ok_or_else(|| Error::reply("redisson_pes_acquire", "no permit"))
    }

    /// Takes `n` permits with `lease`, waiting as long as it takes.
    ///
    /// # Blocking
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many).
    pub fn acquire_many(&self, n: u32, lease: Option<Duration>) -> Result<Vec<Permit>> {
        Self::check_many(n, lease)?;
        self.inner
            .common
            .wait(None, |end| self.attempt(n, lease, end, end))?
            .ok_or_else(|| Error::reply("redisson_pes_acquire", "no permit"))
    }

    /// Takes one permit with `lease`, waiting at most `wait`; `None` when the time is
    /// up (Redisson's `tryAcquire(wait, lease)`).
    ///
    /// # Blocking
    ///
    /// As [`acquire`](Self::acquire), bounded by `wait` plus at most one operation
    /// timeout: the try in flight at the deadline. Subscribing to the channel
    /// (a connection and `SUBSCRIBE`) ends by the deadline too.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    pub fn acquire_timeout(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<Permit>> {
        Ok(self
            .acquire_many_timeout(1, wait, lease)?
            .and_then(|mut v| v.pop()))
    }

    /// Takes `n` permits with `lease`, waiting at most `wait`; `None` when the time is
    /// up.
    ///
    /// # Blocking
    ///
    /// As [`acquire`](Self::acquire), bounded by `wait` plus at most one operation
    /// timeout: the try in flight at the deadline. Subscribing to the channel
    /// (a connection and `SUBSCRIBE`) ends by the deadline too.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many).
    pub fn acquire_many_timeout(
        &self,
        n: u32,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<Vec<Permit>>> {
        Self::check_many(n, lease)?;
        self.inner.common.wait(Some(deadline_of(wait)), |end| {
            self.attempt(n, lease, end, end)
        })
    }

    /// Releases the permit with hex id `id` (from a [`Permit`] or a Java client), and
    /// publishes the new counter. All of it (the wait for a connection, the call, the
    /// replica wait when it is on, and a resend on another connection after a broken
    /// one) ends within the operation timeout, as a permit's release does.
    /// A [`Permit`] of this client with that id (from any handle) is marked lost
    /// ([`LostReason::Released`](crate::LostReason)) before the call is sent; its drop
    /// then finds nothing to release.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseExpired`] when its deadline had passed (it was released all the
    /// same, as Redisson does); [`Error::PermitLost`] when no such permit is held;
    /// [`Error::InvalidArgument`] for an id that is not 32 hex characters; Redis and
    /// pool errors.
    pub fn release(&self, id: &str) -> Result<()> {
        self.tell_released(id);
        match self
            .inner
            .release_raw(id, self.inner.common.release_end())?
        {
            PesReleased::Live => Ok(()),
            PesReleased::Late => Err(Error::LeaseExpired { id: id.to_owned() }),
            PesReleased::NotHeld => Err(Error::PermitLost {
                id: id.to_owned(),
                reason: LostReason::Released,
            }),
        }
    }

    /// Releases the permit with hex id `id`: `true` when it was held and its lease
    /// still ran; `false` when it was not held, or had expired (then it is released
    /// all the same), as Redisson's `tryRelease`. Bounded as [`release`](Self::release).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an id that is not 32 hex characters; Redis and
    /// pool errors.
    pub fn try_release(&self, id: &str) -> Result<bool> {
        self.tell_released(id);
        Ok(self
            .inner
            .release_raw(id, self.inner.common.release_end())?
            == PesReleased::Live)
    }

    /// A release by id through the semaphore: a [`Permit`] of this client with that id
    /// (from any handle) is marked lost (released) before the call is sent, as
    /// `Semaphore::force_release` marks the client's own permits, so that it never says
    /// it is valid once another client may have taken its place (should the call fail,
    /// the permit may still be held: told lost all the same, the safe side).
    fn tell_released(&self, id: &str) {
        if let Ok(raw) = decode_id(id)
            && let Some(state) = self.own_permit(&raw)
        {
            state.mark_lost_counted(LostReason::Released, &self.inner.common.shared().stats);
        }
    }

    /// The live `Permit` of this client (from any handle) with id `raw`, if any.
    fn own_permit(&self, raw: &[u8; 16]) -> Option<Arc<PermitState>> {
        (self.inner.common.shared().registry.lock())
            .pes_held(&self.inner.common.name, &encode_id(raw))
    }

    /// Gives the permit `id` a new lease from now (`None`: no lease), after reclaiming
    /// expired permits; `false` when it is not held (Redisson's `updateLeaseTime`).
    /// A [`Permit`] of this client with that id (from any handle) follows: its
    /// [`lease_left`](Permit::lease_left) counts the new lease, a shorter one
    /// included, and it is marked lost when the call finds it gone. (A Java client's
    /// `updateLeaseTime` on it is not seen until its next call.)
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad id or lease; Redis and pool errors.
    pub fn update_lease_time(&self, id: &str, lease: Option<Duration>) -> Result<bool> {
        check_lease(lease)?;
        let raw = decode_id(id)?;
        // A `Permit` of this client with that id follows the lease it now has on the
        // server, a shorter one included (else it would say it is valid after another
        // client reclaimed its place), and learns it is gone when it is. Its renewals
        // whose flight overlaps this call are not applied (the server may have run
        // one before this update and answered it after), and an update of it that
        // fails after it may have run leaves it the shorter of the two leases.
        let own = self.own_permit(&raw);
        let update = own.as_deref().map(PermitState::begin_lease_update);
        let sent = Instant::now();
        let held = self.run_write(
            "update_lease_time",
            |c, k, publish, now| {
                calls::pes_update_lease(c, k, publish, now, &raw, lease_deadline(now, lease), false)
            },
            |_| false,
        );
        let (Some(state), Some(update)) = (own.as_deref(), update) else {
            return held.map(|(held, _)| held);
        };
        if let Ok((_, Some(ttl))) = held {
            state.ends_by(crate::clock::lease_end(sent, ttl));
        }
        match held {
            Ok((true, _)) => update.applied(valid_until(sent, lease)),
            Ok((false, _)) => {
                drop(update);
                state.mark_lost_counted(state.gone_reason(), &self.inner.common.shared().stats);
            }
            // (a bad argument was refused before anything was sent; any other failure
            // may have come after the server ran the update)
            Err(_) => update.in_doubt(valid_until(sent, lease)),
        }
        held.map(|(held, _)| held)
    }

    /// The lease left to permit `id` by this client's clock (`None`: no lease), after
    /// reclaiming expired permits (Redisson's `getLeaseTime`).
    ///
    /// # Errors
    ///
    /// [`Error::PermitLost`] when it is not held (released, or expired and reclaimed);
    /// [`Error::InvalidArgument`] for a bad id; Redis and pool errors.
    pub fn lease_time(&self, id: &str) -> Result<Option<Duration>> {
        let raw = decode_id(id)?;
        match self.run("lease_time", |c, k, publish, now| {
            calls::pes_lease_time(c, k, publish, now, &raw)
        })? {
            PesLease::Absent => Err(Error::PermitLost {
                id: id.to_owned(),
                reason: LostReason::Released,
            }),
            PesLease::NoLease => Ok(None),
            PesLease::Left(ms) => Ok(Some(Duration::from_millis(u64::try_from(ms).unwrap_or(0)))),
        }
    }

    /// Free permits (the counter, 0 when missing), after reclaiming expired ones.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`]; Redis and pool errors.
    pub fn available_permits(&self) -> Result<i64> {
        self.run("available_permits", |c, k, p, now| {
            calls::pes_read(c, k, p, now, PesCount::Available)
        })
    }

    /// Held permits (the lease zset's size), after reclaiming expired ones.
    ///
    /// # Errors
    ///
    /// As [`available_permits`](Self::available_permits).
    pub fn acquired_permits(&self) -> Result<u64> {
        let n = self.run("acquired_permits", |c, k, p, now| {
            calls::pes_read(c, k, p, now, PesCount::Acquired)
        })?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// All permits, free and held (0 when the counter is missing), after reclaiming
    /// expired ones (Redisson's `getPermits`).
    ///
    /// # Errors
    ///
    /// As [`available_permits`](Self::available_permits).
    pub fn permits(&self) -> Result<i64> {
        self.run("permits", |c, k, p, now| {
            calls::pes_read(c, k, p, now, PesCount::Permits)
        })
    }

    /// Makes the total (free + held) `permits`: sets a missing counter, else moves the
    /// counter by the difference, and publishes `permits`. The counter goes below 0
    /// when fewer permits are wanted than are held (Redisson's `setPermits`). Safe to
    /// send twice (a second run finds the total it set): one whose pooled connection
    /// was broken (closed by the server while idle, say) is sent again on another one
    /// (see "Connections the server closed" in the [module docs](self)).
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`]; Redis and pool errors.
    pub fn set_permits(&self, permits: u32) -> Result<()> {
        self.run_write(
            "set_permits",
            |c, k, p, now| calls::pes_set(c, k, p, now, permits),
            |_| false,
        )?;
        Ok(())
    }

    /// Sets the counter to `permits` if it does not exist (and publishes it); `false`
    /// and no change when it exists, even at 0. It carries an operation key of this
    /// library (see the [module docs](self)): a run sent again after its connection
    /// broke answers the first run's `true` rather than find the counter it set.
    ///
    /// # Errors
    ///
    /// As [`set_permits`](Self::set_permits).
    pub fn try_set_permits(&self, permits: u32) -> Result<bool> {
        let once = self.inner.common.once();
        self.run_write(
            "try_set_permits",
            |c, k, p, _| once.run(c, |c, op| calls::try_set(c, k, p, permits, None, op)),
            |_| false,
        )
    }

    /// Changes the counter by `delta` (missing = 0), publishing `delta` when it is
    /// positive; returns the counter after (Redisson's `addPermits`). It carries an
    /// operation key of this library (see the [module docs](self)): a run sent again
    /// after its connection broke (closed by the server while idle, or reset after the
    /// first run) answers the first run's counter and adds nothing again.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for 0 or `|delta| > 2^32 - 1`; as
    /// [`set_permits`](Self::set_permits).
    pub fn add_permits(&self, delta: i64) -> Result<i64> {
        check_delta(delta)?;
        let once = self.inner.common.once();
        self.run_write(
            "add_permits",
            |c, k, p, now| once.run(c, |c, op| calls::pes_add(c, k, p, now, delta, op)),
            |_| false,
        )
    }
}

impl std::fmt::Debug for RPermitExpirableSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RPermitExpirableSemaphore")
            .field("name", &self.inner.common.name)
            .field("publish", &self.inner.common.publish)
            .field("accept_hex_ids", &self.inner.accept_hex_ids)
            .field("replica_wait", &self.inner.common.replica_wait)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client() -> Client {
        // No I/O happens until an operation: nothing listens here.
        Client::open("redis://127.0.0.1:1/").unwrap()
    }

    /// Sixth session: the deadline of an owed `RSemaphore` give-back left its last send
    /// a fixed minute to run, less than an operation timeout over half a minute can
    /// take (the send then refused: its permits left taken). The margin is at least
    /// twice the operation timeout.
    #[test]
    fn a_give_back_s_deadline_leaves_its_last_send_two_operation_timeouts() {
        let owed = OWED_FOR.as_millis() as i64;
        assert_eq!(
            give_back_deadline(1_000, Duration::from_secs(2)),
            1_000 + owed + 60_000
        );
        assert_eq!(
            give_back_deadline(1_000, Duration::from_secs(90)),
            1_000 + owed + 180_000
        );
        // (no overflow whatever the timeout, and never more digits than once.lua takes)
        assert_eq!(
            give_back_deadline(1_800_000_000_000, Duration::MAX),
            999_999_999_999_999
        );
    }

    #[test]
    fn handles_are_clone_send_sync() {
        fn check<T: Clone + Send + Sync + 'static>() {}
        check::<RSemaphore>();
        check::<RPermitExpirableSemaphore>();
    }

    #[test]
    fn ids_round_trip_between_hex_and_raw() {
        let id = new_id();
        let hex = encode_id(&id);
        assert_eq!(hex.len(), 32);
        assert_eq!(hex, hex.to_lowercase());
        assert_eq!(decode_id(&hex).unwrap(), id);
        assert_eq!(decode_id(&hex.to_uppercase()).unwrap(), id);
        for bad in ["", "abc", &"g".repeat(32), &"a".repeat(33), "é"] {
            assert!(matches!(decode_id(bad), Err(Error::InvalidArgument(_))));
        }
    }

    #[test]
    fn bad_arguments_fail_before_any_network_call() {
        let c = client();
        let invalid = |r: Result<()>| assert!(matches!(r, Err(Error::InvalidArgument(_))));
        // an empty name: refused by each operation
        let unnamed = c.redisson_semaphore("");
        invalid(unnamed.try_acquire(1).map(drop));
        invalid(unnamed.release(1).map(drop));
        invalid(unnamed.available_permits().map(drop));
        let unnamed = c.redisson_permit_expirable_semaphore("");
        invalid(unnamed.try_acquire(None).map(drop));
        invalid(unnamed.available_permits().map(drop));
        let rs = c.redisson_semaphore("s");
        invalid(rs.try_acquire(0).map(drop));
        invalid(rs.acquire(0));
        invalid(rs.acquire_timeout(0, Duration::from_millis(1)).map(drop));
        invalid(rs.release(0).map(drop));
        invalid(rs.release_if_exists(0).map(drop));
        invalid(rs.add_permits(0).map(drop));
        invalid(rs.add_permits(i64::MIN).map(drop));
        invalid(rs.try_set_permits_with_ttl(1, Duration::ZERO).map(drop));

        let pes = c.redisson_permit_expirable_semaphore("s");
        invalid(pes.try_acquire(Some(Duration::ZERO)).map(drop));
        invalid(pes.try_acquire(Some(MAX_LEASE * 2)).map(drop));
        invalid(pes.try_acquire_many(0, None).map(drop));
        invalid(pes.try_acquire_many(MAX_MANY + 1, None).map(drop));
        invalid(pes.acquire_many_timeout(0, Duration::ZERO, None).map(drop));
        invalid(pes.release("nothex"));
        invalid(pes.try_release("00").map(drop));
        invalid(pes.update_lease_time("zz", None).map(drop));
        invalid(pes.lease_time("").map(drop));
        invalid(pes.add_permits(0).map(drop));
    }

    #[test]
    fn deadlines_are_client_ms_or_the_no_lease_score() {
        assert_eq!(lease_deadline(1000, Some(Duration::from_millis(250))), 1250);
        assert_eq!(lease_deadline(1000, None), NO_LEASE);
        assert!(lease_deadline(now_ms(), Some(MAX_LEASE)) < NO_LEASE);
    }
}
