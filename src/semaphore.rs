use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, select};

use crate::client::Client;
use crate::clock::{Anchor, Clock, deadline_in, lease_end, left_until, shrink, wait_end};
use crate::combine::{Failed, Op, SemCombiner};
use crate::error::LostReason;
use crate::error::{Error, Result};
use crate::listener::{Hub, Wake};
use crate::metrics::{Kind, SemMetrics};
use crate::permit::{Grantor, Permit, PermitParts, is_permit_id};
use crate::pool::broken;
use crate::refresher;
use crate::registry::{GroupKey, PermitState};
use crate::scripts::leased::{
    self, AcquireArgs, Acquired, Adoption, Cancelled, HotOp, HotReply, Inspect, Inspected, Mode,
    Released, Renewal,
};
use crate::scripts::{self, Keys};
use crate::stats::Counters;
use crate::threads::{DropBudget, drop_deadline};

/// How often a waiter looks again while the wake-up listener is not subscribed.
const NO_PUSH_POLL: Duration = Duration::from_millis(50);
/// How long a limit stored by [`Semaphore::set_limit`] is kept from that call and
/// from each later move of the keys' expiry (so while the semaphore is in use, and
/// after its last use until the keys' expiry then set).
const LIMIT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// The largest limit a semaphore may have: every grant and release costs the server
/// work per permit (a slot bit each), and one call must stay short whatever its
/// arguments (measured: about 10 ms of server time for a grant of all 10,000 permits at
/// once, and as much for their release, on the 2-core development machine).
pub const MAX_LIMIT: u32 = scripts::MAX_PERMITS;

/// The most replicas [`SemaphoreBuilder::wait_replicas`] may ask to acknowledge a
/// grant. No Redis primary has that many replicas, and a count above those it has
/// fails every grant (each waits `WAIT`'s timeout, gives its permit back and fails
/// with [`Error::ReplicasNotAcked`]; from 2<sup>31</sup> on Redis reads the count as
/// a negative number and answers at once), so a larger count is refused when the
/// semaphore is built.
pub const MAX_WAIT_REPLICAS: u32 = 1_000;

/// A distributed counting semaphore: at most `limit` permits are held at once, by all
/// clients, threads and processes that use the same name on the same Redis.
///
/// Made by [`Client::semaphore`] or [`Client::semaphore_builder`]. Cheap to clone and
/// `Send + Sync`: one handle can be shared by many threads, and every acquire makes a
/// permit of its own.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use redis_semaphore::Client;
///
/// let client = Client::open("redis://127.0.0.1:6379/")?;
/// let sem = client.semaphore("market:acct:42", 5)?;
///
/// if let Some(permit) = sem.try_acquire()? {
///     println!("slot {:?}, token {}", permit.slots(), permit.token());
/// }
/// let permit = sem.acquire_timeout(Duration::from_millis(500))?;
/// # Ok::<(), redis_semaphore::Error>(())
/// ```
#[derive(Clone)]
pub struct Semaphore {
    pub(crate) inner: Arc<SemInner>,
}

#[derive(Clone)]
pub(crate) struct SemInner {
    pub(crate) client: Client,
    pub(crate) name: String,
    pub(crate) keys: Arc<Keys>,
    pub(crate) limit: u32,
    /// The limit stored in Redis ([`Semaphore::set_limit`]) as this handle last learnt
    /// it (its own `set_limit`, a status read); 0 while none is known. Shared by the
    /// clones of the handle.
    pub(crate) stored_limit: Arc<AtomicU32>,
    pub(crate) refresh_every: Duration,
    pub(crate) fair: bool,
    /// The refresher group of this handle's permits (its key says whether they are
    /// renewed automatically).
    pub(crate) group: GroupKey,
    /// The refresher group of this handle's waiter heartbeats (always renewed).
    pub(crate) wait_group: GroupKey,
    /// "pid|host|label", recorded with every grant.
    pub(crate) origin: Arc<str>,
    /// Shared by every handle of this semaphore in this client (see `combine.rs`).
    pub(crate) combiner: Arc<SemCombiner>,
    /// [`SemaphoreBuilder::wait_replicas`]: how many replicas must acknowledge a grant,
    /// and how long to wait for them (ms).
    pub(crate) replicas: Option<(u32, u64)>,
    /// The view of the server's clock this handle's deadlines are converted with: the
    /// client's on one server; on a cluster the one of the node that holds the
    /// semaphore (nodes' clocks may differ), shared by the client's handles of it.
    pub(crate) clock: Arc<Clock>,
    /// [`SemaphoreBuilder::max_hold`].
    pub(crate) max_hold: Option<Duration>,
    /// This handle's per-semaphore metrics (`metrics` feature; empty without it).
    pub(crate) metrics: SemMetrics,
}

impl SemInner {
    /// The lease of this handle's permits (kept once, in its refresher group's key).
    pub(crate) fn lease(&self) -> Duration {
        self.group.lease()
    }

    pub(crate) fn error(&self, e: redis::RedisError) -> Error {
        Error::redis(&self.name, e, self.client.inner.shared.op_timeout)
    }

    /// Sorts a failed call's error (a Redis error gets the semaphore's name and its
    /// kind); other errors pass.
    pub(crate) fn sorted(&self, e: Error) -> Error {
        match e {
            Error::Redis(e) => self.error(e),
            other => other,
        }
    }

    /// Sends hot-path operations in one script call: the operation's own script for
    /// one, the batch script for several (the combiner's [`Exec`](crate::combine::Exec)),
    /// the whole call (checkout, write, read) ending by `deadline`. Redis errors come
    /// back unsorted, as [`Error::Redis`].
    pub(crate) fn exec_until(&self, ops: &[&Op], deadline: Instant) -> Result<Vec<HotReply>> {
        let shared = &self.client.inner.shared;
        shared.pool.run_by(Some(deadline), shared.op_timeout, |c| {
            self.exec_on_conn(&mut **c, ops)
        })
    }

    /// [`exec_until`](Self::exec_until) on a fresh connection ([`Shared::on_fresh`](
    /// crate::shared::Shared::on_fresh)): for operations sent again, alone, after the
    /// call that carried them failed on a broken connection.
    pub(crate) fn exec_fresh(&self, ops: &[&Op], deadline: Instant) -> Result<Vec<HotReply>> {
        self.client
            .inner
            .shared
            .on_fresh(deadline, |c| self.exec_on_conn(&mut **c, ops))
    }

    /// A release of `id` on a brand-new connection (not one of the pool's idle ones,
    /// which a `CLIENT KILL` or a restart may all have broken), ending by `deadline`.
    pub(crate) fn release_fresh(&self, id: &str, deadline: Instant) -> Result<Released> {
        if left_until(deadline).is_zero() {
            return Err(late_reply(&self.name));
        }
        self.client
            .inner
            .shared
            .on_fresh_connection(deadline, |c| leased::release(c, &self.keys, id, false))
    }

    fn exec_on_conn(
        &self,
        conn: &mut dyn redis::ConnectionLike,
        ops: &[&Op],
    ) -> Result<Vec<HotReply>> {
        let clock = &self.clock;
        // the server's time is needed for an acquire's cutoff only: a batch of
        // releases (a drop's) never pays a round trip for it
        let mut anchor = clock.get();
        if anchor.is_none() && ops.iter().any(|op| matches!(op, Op::Acquire { .. })) {
            anchor = Some(read_server_time(conn, &self.keys, clock)?);
        }
        // The releases go first: at maxmemory Redis refuses a script only at its first
        // write of a command that may use memory, and a release's first writes (ZREM,
        // HDEL) use none, so a batch's releases still run when Redis is out of memory
        // (DESIGN invariant 12), where an acquire granted before them would have had
        // the whole call refused. The operations run as separate calls at one instant
        // would, in any order; the replies go back in the callers' order.
        let order = releases_first(ops);
        let sorted: Vec<&Op>;
        let ops = match &order {
            Some(order) => {
                sorted = order.iter().map(|&k| ops[k]).collect();
                &sorted[..]
            }
            None => ops,
        };
        let hot: Vec<HotOp<'_>> = ops
            .iter()
            .map(|op| match op {
                Op::Acquire {
                    id,
                    n,
                    limit,
                    lease_ms,
                    origin,
                    fair,
                    give_up,
                } => HotOp::Acquire(AcquireArgs {
                    id,
                    n: *n,
                    limit: *limit,
                    lease_ms: *lease_ms,
                    origin,
                    mode: Mode::Try,
                    fair: *fair,
                    channel: "",
                    // (read above for every batch with an acquire; 0 would mean none, 1 ms
                    // after the epoch refuses)
                    cutoff_ms: anchor.as_ref().map_or(1, |a| a.server_ms_by(*give_up)),
                    // a try is never queued
                    ticket: 0,
                }),
                Op::Release { id } => HotOp::Release { id },
            })
            .collect();
        let sent = Instant::now();
        let replies = leased::hot(conn, &self.keys, &hot)?;
        note_anchor(
            clock,
            sent,
            replies.iter().find_map(|r| match r {
                HotReply::Acquired(a) => a.now_ms(),
                HotReply::Released(_) => None,
            }),
        );
        Ok(match order {
            Some(order) => {
                let mut back: Vec<(usize, HotReply)> = order.into_iter().zip(replies).collect();
                back.sort_by_key(|&(k, _)| k);
                back.into_iter().map(|(_, r)| r).collect()
            }
            None => replies,
        })
    }
}

/// The order to send `ops` in, releases first (each kind in the callers' order), when
/// an acquire comes before a release; `None` when they are in that order already.
fn releases_first(ops: &[&Op]) -> Option<Vec<usize>> {
    ops.windows(2)
        .any(|w| matches!(w, [Op::Acquire { .. }, Op::Release { .. }]))
        .then(|| {
            let mut order: Vec<usize> = (0..ops.len()).collect();
            order.sort_by_key(|&k| matches!(ops[k], Op::Acquire { .. }));
            order
        })
}

/// Takes a clock anchor from a reply that carries the server's time, for a call sent
/// at `sent` and answered now.
fn note_anchor(clock: &Clock, sent: Instant, server_ms: Option<i64>) {
    if let Some(server_ms) = server_ms {
        clock.update(Anchor {
            sent,
            received: Instant::now(),
            server_ms,
        });
    }
}

/// Reads the server's `TIME` once, for a client's first anchor.
fn read_server_time(
    conn: &mut dyn redis::ConnectionLike,
    keys: &Keys,
    clock: &Clock,
) -> Result<Anchor> {
    let sent = Instant::now();
    let server_ms = leased::server_time_ms(conn, keys)?;
    let anchor = Anchor {
        sent,
        received: Instant::now(),
        server_ms,
    };
    clock.update(anchor);
    Ok(anchor)
}

impl Client {
    /// A semaphore named `name` allowing `limit` permits at once, with the default
    /// settings of [`SemaphoreBuilder`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name, a name with `{` or `}` or ending
    /// in a line break, or a limit of 0 or above [`MAX_LIMIT`].
    pub fn semaphore(&self, name: &str, limit: u32) -> Result<Semaphore> {
        self.semaphore_builder(name).limit(limit).build()
    }

    /// A builder for semaphore `name`, to set its lease, fairness and refresh.
    pub fn semaphore_builder(&self, name: &str) -> SemaphoreBuilder {
        SemaphoreBuilder::new(self.clone(), name)
    }
}

/// One holder of a semaphore, as [`Semaphore::holders`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Holder {
    /// The permit id.
    pub id: String,
    /// Permits it holds.
    pub permits: u32,
    /// Its fencing token.
    pub token: u64,
    /// The slots it occupies.
    pub slots: Vec<u32>,
    /// Host name of the process that took it.
    pub host: String,
    /// Process id of the process that took it.
    pub pid: u32,
    /// When it was granted, by the Redis server's clock.
    pub acquired_at: SystemTime,
    /// How much of its lease is left, by the Redis server's clock.
    pub lease_left: Duration,
    /// How long it has been held, by the Redis server's clock (no client clock is
    /// involved, so it is right whatever the reader's clock says).
    pub held_for: Duration,
    /// The label the holder's semaphore handle carried, if any
    /// ([`SemaphoreBuilder::label`]).
    pub label: Option<String>,
}

/// The state of a semaphore, as [`Semaphore::status`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Status {
    /// The limit in force: the stored one, else the asking handle's.
    pub limit: u32,
    /// The limit stored by [`Semaphore::set_limit`], if any.
    pub stored_limit: Option<u32>,
    /// The limit the last acquiring client passed, if known.
    pub client_limit: Option<u32>,
    /// Another limit a client passed since the semaphore's keys were made, when it
    /// differs from [`client_limit`](Self::client_limit): clients disagree on the
    /// limit (each acquire obeys its caller's, unless one is stored with
    /// [`Semaphore::set_limit`]). [`Semaphore::status`] logs a warning when it sees it.
    pub other_client_limit: Option<u32>,
    /// Permits held by unexpired holders.
    pub held: u32,
    /// Permits free now (0 while a lowered limit is still exceeded).
    pub available: u32,
    /// Acquires queued, waiting.
    pub queued: u32,
    /// Whether the semaphore has keys in Redis (it is or was recently in use).
    pub exists: bool,
}

/// Settings of a [`Semaphore`], from [`Client::semaphore_builder`].
///
/// ```no_run
/// use std::time::Duration;
/// # let client = redis_semaphore::Client::open("redis://127.0.0.1/")?;
/// let sem = client
///     .semaphore_builder("jobs")
///     .limit(5)
///     .lease(Duration::from_secs(30))
///     .build()?;
/// # Ok::<(), redis_semaphore::Error>(())
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until build() is called"]
pub struct SemaphoreBuilder {
    client: Client,
    name: String,
    limit: Option<u32>,
    lease: Duration,
    refresh_every: Option<Duration>,
    fair: bool,
    auto_refresh: bool,
    label: String,
    replicas: Option<(u32, Duration)>,
    max_hold: Option<Duration>,
}

impl SemaphoreBuilder {
    pub(crate) fn new(client: Client, name: &str) -> SemaphoreBuilder {
        SemaphoreBuilder {
            client,
            name: name.to_owned(),
            limit: None,
            lease: Duration::from_secs(10),
            refresh_every: None,
            fair: true,
            auto_refresh: true,
            label: String::new(),
            replicas: None,
            max_hold: None,
        }
    }

    /// A short label recorded with every permit granted through this handle, for
    /// operators: [`Semaphore::holders`] and the `redis-semaphore status` command show
    /// it (for example a job id or a service name). At most 100 bytes, no line breaks.
    /// Defaults to none. See also [`Semaphore::with_label`].
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }

    /// How many permits may be held at once. Required.
    ///
    /// A limit stored with [`Semaphore::set_limit`] takes precedence for every client.
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = Some(limit);
        self
    }

    /// How long a permit stays valid without renewal; a holder that crashes gives its
    /// permits back at most this long after its last renewal. At least 100 ms with
    /// automatic refresh (the default), at least 1 ms without; whole milliseconds.
    /// Defaults to 10 s.
    ///
    /// A grant is valid on arrival only when its lease exceeds the round trip plus one
    /// millisecond (the server's clock counts whole milliseconds, and the client's
    /// deadline allows for that): with a shorter one the acquire gives the grant back
    /// and fails with a timeout error that says so. A 1 ms lease never arrives valid.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Whether blocked waiters are served in arrival order. Defaults to `true`.
    ///
    /// With `true`, an acquire of this handle is granted only when nobody queues or it
    /// heads the queue, and a release serves the queue's head. With `false`, an
    /// acquire of this handle takes free permits whoever queues (a waiter looks again
    /// at most a heartbeat, about a second, after a release the head could not use).
    /// The setting is each handle's, not the semaphore's: give every client of a
    /// semaphore the same one, or the unfair ones go ahead of the fair ones' queue.
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// Whether the client's background thread renews the leases of held permits.
    /// With `false`, a lease ends `lease` after the grant unless
    /// [`Permit::refresh`] is called. Defaults to `true`.
    pub fn auto_refresh(mut self, on: bool) -> Self {
        self.auto_refresh = on;
        self
    }

    /// How often the background thread renews leases. Must be shorter than the lease.
    /// Defaults to a third of the lease.
    pub fn refresh_interval(mut self, every: Duration) -> Self {
        self.refresh_every = Some(every);
        self
    }

    /// Makes every grant wait until at least `replicas` replicas of the Redis primary
    /// have acknowledged it, for at most `timeout`; `replicas == 0` turns it off (the
    /// default). `replicas` is at most [`MAX_WAIT_REPLICAS`]; set it to no more than
    /// the replicas the primary has, or every grant fails.
    ///
    /// After the grant, the acquiring call renews the new permit's lease on a pooled
    /// connection (a write of that connection, which replication delivers after the
    /// grant) and sends `WAIT replicas timeout` on the same connection. When fewer
    /// replicas answer in time, the permit is released and the call fails with
    /// [`Error::ReplicasNotAcked`]; a try-acquire or a timed acquire does not wait
    /// again. A release that fails (or does not end within the operation timeout) is
    /// sent again by the client's background thread until the lease has surely ended.
    /// It costs two round trips and up to `timeout` per grant (see `BENCHMARKS.md`). A
    /// `timeout` close to the client's operation timeout is shortened so that the
    /// server's answer (which may come up to 100 ms after its own timeout) still comes
    /// within the operation timeout.
    ///
    /// Renewals wait too: the background thread sends `WAIT replicas timeout` right
    /// after each renewal call of the semaphore's permits (one per semaphore and
    /// lease per tick, on the same connection), and a renewal fewer replicas
    /// acknowledged does not count on the client: the permits keep the deadlines of
    /// their last acknowledged renewal, the renewal is tried again soon, and a permit
    /// is declared lost ([`Permit::lost`], [`LostReason::Expired`]) when its deadline
    /// passes, although the primary still renews it. [`Permit::refresh`] then fails
    /// with [`Error::ReplicasNotAcked`] and moves no deadline. Releases are not waited
    /// for (one a failover loses leaves the slot taken until its lease ends: fewer
    /// holders, never more).
    ///
    /// What it gives: a permit this call returns is in the memory of `replicas`
    /// replicas, so a failover that promotes one of them keeps it, and its deadline
    /// on the client is never later than the one such a replica has. What it does not
    /// give: Redis replication stays asynchronous, and Sentinel or Cluster may
    /// promote a replica that did not acknowledge (`replicas` below the number of
    /// replicas), or an old primary may go on granting for a while after it was cut
    /// off (bound that with the server's `min-replicas-to-write` and
    /// `min-replicas-max-lag`). Fence the work with [`Permit::token`] and
    /// [`Permit::slots`] where an overlap must be refused; `docs/deployment.md` says
    /// what each topology guarantees.
    ///
    /// [`Permit::token`]: crate::Permit::token
    /// [`Permit::slots`]: crate::Permit::slots
    /// [`Permit::lost`]: crate::Permit::lost
    /// [`Permit::refresh`]: crate::Permit::refresh
    pub fn wait_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replicas = Some((replicas, timeout));
        self
    }

    /// The longest a permit of this handle is kept alive: the keepalive renews it
    /// until `max_hold` after the grant and no more, so a stuck holder (a hung job
    /// that never drops its permit) cannot keep it for ever. Its lease then runs out,
    /// at most one lease after `max_hold`, and [`Permit::lost`] fires with
    /// [`LostReason::MaxHold`]; [`Permit::refresh`] after it is refused. Unset (no
    /// bound) by default.
    ///
    /// [`Permit::lost`]: crate::Permit::lost
    /// [`Permit::refresh`]: crate::Permit::refresh
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Checks the settings and makes the semaphore. No network call is made.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name, a name containing `{` or `}`
    /// (the library puts the name in a hash tag) or ending in a line break (a permit's
    /// [`PermitParts`] text ends with the name), a missing or zero limit, a lease
    /// under 1 ms (100 ms with automatic refresh), a refresh interval that is zero or
    /// not shorter than the lease, a
    /// [`wait_replicas`](SemaphoreBuilder::wait_replicas) timeout under 1 ms or not
    /// shorter than the client's operation timeout, a `wait_replicas` count above
    /// [`MAX_WAIT_REPLICAS`], or a `max_hold` under 1 ms.
    pub fn build(self) -> Result<Semaphore> {
        let invalid = |s: &str| Err(Error::InvalidArgument(s.to_owned()));
        Error::check_name(&self.name, true)?;
        if self.name.ends_with(['\n', '\r']) {
            // the text form of a permit's parts (PermitParts) ends with the name, and
            // its parser takes a trailing line break off: the name would come back
            // without it
            return invalid("semaphore name must not end in a line break");
        }
        let limit = match self.limit {
            None => return invalid("a limit is required"),
            Some(0) => return invalid("limit must be at least 1"),
            Some(n) if n > MAX_LIMIT => {
                return invalid(&format!("limit must be at most {MAX_LIMIT}, got {n}"));
            }
            Some(n) => n,
        };
        if self.lease < Duration::from_millis(1) {
            return invalid("lease must be at least 1 ms");
        }
        if self.lease > Duration::from_secs(365 * 24 * 3600) {
            return invalid("lease must be at most a year");
        }
        if self.auto_refresh && self.lease < MIN_RENEWED_LEASE {
            return invalid(&format!(
                "a lease of {:?} cannot be renewed in time (each renewal is a round trip): \
                 use at least {MIN_RENEWED_LEASE:?}, or auto_refresh(false) for a lease \
                 that is never renewed",
                self.lease
            ));
        }
        let refresh_every = self.refresh_every.unwrap_or(self.lease / 3);
        if refresh_every.is_zero() || refresh_every >= self.lease {
            return invalid("refresh interval must be above zero and shorter than the lease");
        }
        check_label(&self.label)?;
        if self.max_hold.is_some_and(|d| d < Duration::from_millis(1)) {
            return invalid("max_hold must be at least 1 ms");
        }
        let replicas = match self.replicas {
            None | Some((0, _)) => None,
            Some((n, _)) if n > MAX_WAIT_REPLICAS => {
                return invalid(&format!(
                    "wait_replicas count must be at most {MAX_WAIT_REPLICAS} (replicas of \
                     one primary), got {n}: every grant would wait for more replicas than \
                     the primary has, and fail"
                ));
            }
            Some((n, timeout)) => {
                if timeout < Duration::from_millis(1)
                    || timeout >= self.client.inner.shared.op_timeout
                {
                    return invalid(&format!(
                        "wait_replicas timeout must be at least 1 ms and shorter than the \
                         client's operation timeout ({:?}), got {timeout:?}",
                        self.client.inner.shared.op_timeout
                    ));
                }
                Some((n, timeout.as_millis() as u64))
            }
        };
        let origin = Arc::from(format!(
            "{}|{}",
            self.client.inner.shared.origin, self.label
        ));
        let combiner = self.client.inner.combiner(&self.name);
        let shared = &self.client.inner.shared;
        let clock = if shared.is_cluster() {
            self.client.inner.cluster_clock(&self.name)
        } else {
            Arc::clone(&shared.clock)
        };
        let keys = Arc::new(Keys::new(&self.name));
        let metrics = SemMetrics::new(Kind::Leased, &self.name);
        let group = GroupKey {
            name: Arc::from(self.name.as_str()),
            lease_ms: self.lease.as_millis() as u64,
            auto: self.auto_refresh,
            replicas,
        };
        // (a heartbeat is renewed without a replica wait: it keeps a place in the
        // queue, not a permit)
        let wait_group = GroupKey {
            auto: true,
            lease_ms: scripts::heartbeat_ms(group.lease_ms),
            replicas: None,
            ..group.clone()
        };
        Ok(Semaphore {
            inner: Arc::new(SemInner {
                client: self.client,
                name: self.name,
                keys,
                limit,
                stored_limit: Arc::new(AtomicU32::new(0)),
                refresh_every: refresh_every.max(Duration::from_millis(1)),
                fair: self.fair,
                group,
                wait_group,
                origin,
                combiner,
                replicas,
                clock,
                max_hold: self.max_hold,
                metrics,
            }),
        })
    }
}

/// What one acquire attempt gave.
enum Attempt {
    Granted(Permit),
    /// Not granted; look again after `retry_after` at the latest (the script's answer:
    /// for the head when the earliest lease ends, for the next few waiters when the
    /// head's heartbeat would end, so that a dead head is replaced within it);
    /// `ticket`: the waiter's arrival ticket in the queue (0: none said).
    Busy {
        retry_after: Option<Duration>,
        ticket: u64,
    },
}

/// A blocked acquire's registrations: its wake-up channel with the listener and its
/// heartbeat with the refresher. Dropped without [`finish`](Waiter::finish) (an error
/// on the way), it also takes itself out of the queue, best effort.
struct Waiter<'a> {
    sem: &'a Semaphore,
    hub: Arc<Hub>,
    id: String,
    wake: Receiver<Wake>,
    heartbeat: Arc<PermitState>,
    heartbeat_lost: Receiver<LostReason>,
    armed: bool,
    /// Whether one of its looks was answered: an outage that ends its wait afterwards
    /// is a new one (see [`Semaphore::wait_riding_through`]).
    answered: bool,
    /// The wait's bound (its deadline and one operation timeout), which its drop's
    /// cancel keeps too; `None` for a wait without a deadline.
    end: Option<Instant>,
}

impl<'a> Waiter<'a> {
    fn new(sem: &'a Semaphore, hub: Arc<Hub>, id: String, end: Option<Instant>) -> Waiter<'a> {
        let wake = hub.register(&id);
        let (heartbeat, heartbeat_lost) = sem.register_heartbeat(&id);
        Waiter {
            sem,
            hub,
            id,
            wake,
            heartbeat,
            heartbeat_lost,
            armed: true,
            answered: false,
            end,
        }
    }

    /// The heartbeat was found gone (the queue dropped us): a new one goes with the
    /// next look, which queues the waiter again.
    fn renew_heartbeat(&mut self) {
        self.sem.deregister_heartbeat(&self.heartbeat.id);
        let (heartbeat, lost) = self.sem.register_heartbeat(&self.id);
        self.heartbeat = heartbeat;
        self.heartbeat_lost = lost;
    }

    fn finish(&mut self) {
        if self.armed {
            self.armed = false;
            self.hub.deregister(&self.id);
            self.sem.deregister_heartbeat(&self.heartbeat.id);
        }
    }
}

impl Drop for Waiter<'_> {
    /// Leaves the queue, the cancel ending within one operation timeout and by the
    /// wait's bound (and an enclosing drop's): a wait that ends on an error keeps its
    /// bound. A grant that came as the waiter left is given back by then too; what
    /// does not fit is left to the background thread.
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.finish();
        let now = Instant::now();
        let soon = now + self.sem.inner.client.inner.shared.op_timeout;
        let until = drop_deadline(self.end.map_or(soon, |end| soon.min(end)));
        if until <= now {
            // no time left: the background thread takes it out of the queue and
            // releases a grant that came
            self.sem.clean_up_waiter_after(&self.id, now);
            return;
        }
        let _budget = DropBudget::start(until - now);
        match self.sem.run_cancel(&self.id, until) {
            // a grant that came as this waiter left on an error: given back now,
            // not left to lapse with its heartbeat
            Ok(Some((token, valid_until, slots))) => {
                let n = slots.len() as u32;
                let p = self
                    .sem
                    .permit(self.id.clone(), token, slots, n, valid_until);
                self.sem.give_back_by(p, until);
            }
            Ok(None) => {}
            Err(e) => {
                log::warn!(
                    "redis-semaphore: could not leave the queue of {}: {e}",
                    self.sem.name()
                );
                self.sem.clean_up_waiter_after(&self.id, Instant::now());
            }
        }
    }
}

impl Semaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// A handle to the same semaphore whose permits carry `label` (see
    /// [`SemaphoreBuilder::label`]); this handle is unchanged.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a label over 100 bytes or with a line break.
    pub fn with_label(&self, label: &str) -> Result<Semaphore> {
        check_label(label)?;
        let inner = &self.inner;
        Ok(Semaphore {
            inner: Arc::new(SemInner {
                origin: Arc::from(format!("{}|{label}", inner.client.inner.shared.origin)),
                ..SemInner::clone(inner)
            }),
        })
    }

    /// The lease of permits granted through this handle.
    pub fn lease(&self) -> Duration {
        self.inner.lease()
    }

    /// Whether waiters are served in arrival order.
    pub fn is_fair(&self) -> bool {
        self.inner.fair
    }

    /// Takes one permit if one is free now, in one round trip; never waits.
    ///
    /// # Errors
    ///
    /// Redis and pool errors (never [`Error::PermitsExceedLimit`]: every limit is at
    /// least 1).
    pub fn try_acquire(&self) -> Result<Option<Permit>> {
        self.try_acquire_many(1)
    }

    /// Takes `n` permits at once if they are free now, in one round trip; never waits.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for `n == 0`; [`Error::PermitsExceedLimit`] when `n`
    /// is above the limit: before any call when it is above every limit this handle
    /// knows of (its own, and a stored one it learnt, see
    /// [`set_limit`](Semaphore::set_limit)), else from the server; Redis and pool
    /// errors.
    pub fn try_acquire_many(&self, n: u32) -> Result<Option<Permit>> {
        self.check_permits(n)?;
        match self.attempt(&new_id(), n, Mode::Try, "", 0)? {
            Attempt::Granted(p) => self.confirm(p, None).map(Some),
            Attempt::Busy { .. } => Ok(None),
        }
    }

    /// Takes one permit, waiting as long as it takes.
    ///
    /// # Blocking
    ///
    /// Waits until a permit is released or a holder's lease ends; returns early only
    /// on an error. An outage (a failover, a restart: the server unreachable or
    /// moving) is waited through for up to 30 s at a time, once the server has
    /// answered this client before (`docs/deployment.md`).
    ///
    /// # Errors
    ///
    /// Redis and pool errors (an outage's after those 30 s, or at once when the server
    /// never answered this client).
    pub fn acquire(&self) -> Result<Permit> {
        self.acquire_many(1)
    }

    /// Takes `n` permits at once, waiting as long as it takes.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for `n == 0`; [`Error::PermitsExceedLimit`] at once
    /// when `n` is above the limit (it could never be granted); Redis and pool errors.
    pub fn acquire_many(&self, n: u32) -> Result<Permit> {
        match self.wait_for(n, None, &crossbeam_channel::never::<()>())? {
            Some(p) => Ok(p),
            None => unreachable!("a wait without deadline returns only with a permit or an error"),
        }
    }

    /// Takes one permit, waiting at most `timeout`; `Ok(None)` when the time is up.
    ///
    /// Returns within `timeout` and one operation timeout (the call in flight at the
    /// deadline), the wait for a pooled connection included, also when the server
    /// stops answering or every connection is busy.
    ///
    /// # Errors
    ///
    /// Redis and pool errors.
    pub fn acquire_timeout(&self, timeout: Duration) -> Result<Option<Permit>> {
        self.acquire_many_timeout(1, timeout)
    }

    /// Takes `n` permits at once, waiting at most `timeout`; `Ok(None)` when the time
    /// is up.
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Semaphore::acquire_many).
    pub fn acquire_many_timeout(&self, n: u32, timeout: Duration) -> Result<Option<Permit>> {
        self.wait_for(
            n,
            Some(deadline_in(timeout)),
            &crossbeam_channel::never::<()>(),
        )
    }

    /// Takes one permit, waiting until it is granted or `cancel` receives a message or
    /// is disconnected (`Ok(None)`). For shutdown: drop the `Sender` (or send on it)
    /// from another thread to wake every acquire that waits on its receiver. A
    /// `crossbeam_channel::after(d)` receiver makes it a timeout. A `cancel` that
    /// already holds a message (which this call takes) or is already disconnected when
    /// the call starts gives `Ok(None)` at once, without a call to Redis, even when a
    /// permit is free.
    ///
    /// ```no_run
    /// # let client = redis_semaphore::Client::open("redis://127.0.0.1/")?;
    /// # let sem = client.semaphore("jobs", 1)?;
    /// let (shutdown, cancel) = crossbeam_channel::bounded::<()>(0);
    /// let waiter = std::thread::spawn(move || sem.acquire_cancellable(&cancel));
    /// drop(shutdown); // the waiter gives up and leaves the queue
    /// assert!(waiter.join().unwrap()?.is_none());
    /// # Ok::<(), redis_semaphore::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Semaphore::acquire_many).
    pub fn acquire_cancellable<T>(&self, cancel: &Receiver<T>) -> Result<Option<Permit>> {
        self.acquire_many_cancellable(1, cancel)
    }

    /// Takes `n` permits at once, waiting until they are granted or `cancel` fires; see
    /// [`acquire_cancellable`](Semaphore::acquire_cancellable).
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Semaphore::acquire_many).
    pub fn acquire_many_cancellable<T>(
        &self,
        n: u32,
        cancel: &Receiver<T>,
    ) -> Result<Option<Permit>> {
        self.wait_for(n, None, cancel)
    }

    /// Takes over a permit another process handed over with
    /// [`Permit::into_parts`](crate::Permit::into_parts): renews its lease now (with this
    /// handle's lease, unless its max hold has passed, below) and from then on as any
    /// permit of this handle, and gives it
    /// back when the returned `Permit` is dropped or released. Its id, fencing token
    /// and slots are the original grant's, and this handle's
    /// [`max_hold`](SemaphoreBuilder::max_hold) counts from that grant (by the server's
    /// clock), not from the adoption (from the adoption only when the holder record's
    /// grant time does not parse, say edited by hand): a grant adopted at or after its
    /// max hold is taken over as it is, not renewed, and its lease ends when it would
    /// have ([`Permit::lost`](crate::Permit::lost) then says
    /// [`LostReason::MaxHold`]).
    ///
    /// The server checks the parts against the grant it holds: the same id, token and
    /// slots, its lease not yet ended. Hand each `PermitParts` to one process: the
    /// server knows one grant, so two adoptions of the same parts would be two handles
    /// of it (each renewing it, the first release ending both). Within one [`Client`]
    /// that is refused: a grant a `Permit` of the client holds (also one known lost
    /// and not yet dropped: its release would free the grant under the new handle),
    /// or that another thread is adopting, or whose release by this client failed
    /// with its outcome unknown (a timeout: the background thread sends it again)
    /// until that release has run or the lease has surely ended, is not adopted
    /// again, and Redis is not called.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`] when `parts` belongs to another semaphore, or names
    ///   another token or other slots than the grant held under its id, or when a
    ///   `Permit` of this client already holds that grant, lost or not (or it is
    ///   being adopted): adopt each grant once.
    /// - [`Error::PermitLost`] when the grant is no longer held: reason
    ///   [`LostReason::Expired`] when its lease ran out before the adoption (also when
    ///   the semaphore's keys have gone since), [`LostReason::Released`] when it was
    ///   released or force-released (or ran out and was cleared by another call).
    /// - Redis and pool errors.
    pub fn adopt(&self, parts: PermitParts) -> Result<Permit> {
        let sem = &self.inner;
        if parts.semaphore_name() != sem.name {
            return Err(Error::InvalidArgument(format!(
                "a permit of semaphore {:?} cannot be adopted by semaphore {:?}",
                parts.semaphore_name(),
                sem.name
            )));
        }
        let client = &sem.client.inner;
        if !client.shared.registry.lock().claim(&sem.name, parts.id()) {
            return Err(Error::InvalidArgument(format!(
                "permit {} of semaphore {:?} is already held by a Permit of this client \
                 (or being adopted by another thread): adopt each grant once",
                parts.id(),
                sem.name
            )));
        }
        // (ends the claim on every return below, after the permit is registered)
        struct Claim<'a>(&'a crate::shared::Shared, &'a str, &'a str);
        impl Drop for Claim<'_> {
            fn drop(&mut self) {
                self.0.registry.lock().unclaim(self.1, self.2);
            }
        }
        let _claim = Claim(&client.shared, &sem.name, parts.id());
        // (a max hold past what the script takes, 300 years, bounds nothing)
        let max_hold_ms = sem
            .max_hold
            .and_then(|d| u64::try_from(d.as_millis()).ok())
            .filter(|&ms| ms <= 10_000_000_000_000);
        // (before the call, and before a second send of it on a fresh connection when
        // the first broke: the lease counts from before either renewed it)
        let sent = Instant::now();
        let adoption = self.run_resending(|conn| {
            leased::adopt(
                conn,
                &sem.keys,
                sem.group.lease_ms,
                parts.id(),
                parts.token(),
                parts.slots(),
                max_hold_ms,
            )
            .map_err(|e| sem.sorted(e).during("adopt"))
        })?;
        let lost = |reason| {
            Err(Error::PermitLost {
                id: parts.id().to_owned(),
                reason,
            })
        };
        let (held, valid_until) = match adoption {
            Adoption::Renewed { held } => (held, lease_end(sent, sem.lease())),
            // past its max hold: taken over as it is, its lease ending when it would
            // have (counted from before the call, as a renewal's)
            Adoption::HeldOut { held, left } => (Some(held), lease_end(sent, left)),
            Adoption::NotHeld => return lost(LostReason::Released),
            // a semaphore's keys go by their TTL only once every lease in it ended,
            // this one's included; a server that lost its data is the rarer case
            Adoption::Ended | Adoption::KeysGone => return lost(LostReason::Expired),
            Adoption::Mismatch => {
                return Err(Error::InvalidArgument(format!(
                    "permit {} of semaphore {:?} is held with another token or other slots \
                     than the handed-over parts name (token {}, slots {:?})",
                    parts.id(),
                    sem.name,
                    parts.token(),
                    parts.slots()
                )));
            }
        };
        // max_hold counts from the grant, not from this adoption (the server's time
        // since the grant, before the call was sent: never later than the grant)
        let granted = held.map_or(sent, |h| sent.checked_sub(h).unwrap_or(sent));
        let permit = self.permit_since(
            parts.id().to_owned(),
            parts.token(),
            parts.slots().to_vec(),
            parts.permits(),
            valid_until,
            granted,
        );
        // an operator's release of this client that named the grant while the adoption
        // was on its way (it found no Permit to mark lost) may have run after the
        // adoption's script: the grant is then gone on the server, its slot perhaps
        // granted again. (Asked after the registration, under the claim: a release
        // sent from then on finds the permit and marks it itself.) Its drop sends a
        // release, which changes nothing when the operator's ran.
        if client
            .shared
            .registry
            .lock()
            .claim_force_released(&sem.name, parts.id())
        {
            permit
                .state
                .mark_lost_counted(LostReason::Released, &client.shared.stats);
            return lost(LostReason::Released);
        }
        Ok(permit)
    }

    /// Limit, permits held and free, queue length, in one round trip.
    ///
    /// # Errors
    ///
    /// Redis and pool errors; [`Error::WrongType`] when a key was overwritten.
    pub fn status(&self) -> Result<Status> {
        self.status_during("status")
    }

    /// [`status`](Semaphore::status), its errors naming `op`.
    fn status_during(&self, op: &'static str) -> Result<Status> {
        let status = self.learn(status_of(&self.inspect(Inspect::Counts, op)?));
        if status.stored_limit.is_none()
            && let (Some(a), Some(b)) = (status.client_limit, status.other_client_limit)
        {
            log::warn!(
                "redis-semaphore: clients of semaphore {:?} pass different limits ({a} and \
                 {b}): each acquire obeys its own; store one with set_limit",
                self.inner.name
            );
        }
        Ok(status)
    }

    /// What a status read teaches this handle: the stored limit (see
    /// [`check_permits`](Self::check_permits)).
    fn learn(&self, status: Status) -> Status {
        self.inner
            .stored_limit
            .store(status.stored_limit.unwrap_or(0), Ordering::Relaxed);
        status
    }

    /// How many acquires are queued, waiting, across all clients.
    pub fn queue_len(&self) -> Result<u32> {
        Ok(self.counts("queue_len")?.2)
    }

    /// Permits free now: the limit minus the permits of unexpired holders (0 when a
    /// lowered limit is still exceeded).
    pub fn available(&self) -> Result<u32> {
        let (limit, used, _) = self.counts("available")?;
        Ok(limit.saturating_sub(used))
    }

    /// The limit in force: the one stored by [`set_limit`](Semaphore::set_limit), else
    /// this handle's.
    pub fn limit(&self) -> Result<u32> {
        Ok(self.counts("limit")?.0)
    }

    /// Stores `limit` in Redis, where it takes precedence over the limit every client
    /// passes. Lowering it takes no permit away; new grants wait until the holders fit.
    /// The stored limit is kept for at least a day after this call, and as long as the
    /// semaphore is in use.
    ///
    /// A handle refuses an acquire of more permits than every limit it knows of before
    /// any call; it learns a stored limit from this call and from its status reads
    /// ([`status`](Semaphore::status), [`limit`](Semaphore::limit),
    /// [`available`](Semaphore::available), [`queue_len`](Semaphore::queue_len)). A
    /// handle whose own limit is lower than a limit stored by another process may
    /// therefore refuse `acquire_many(n)` above its own limit until it has read the
    /// status once.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for 0 or a limit above [`MAX_LIMIT`]; Redis and pool
    /// errors.
    pub fn set_limit(&self, limit: u32) -> Result<()> {
        if limit == 0 {
            return Err(Error::InvalidArgument("limit must be at least 1".into()));
        }
        if limit > MAX_LIMIT {
            return Err(Error::InvalidArgument(format!(
                "limit must be at most {MAX_LIMIT}, got {limit}"
            )));
        }
        self.counted(|| {
            self.run_resending(|conn| {
                leased::set_limit(
                    conn,
                    &self.inner.keys,
                    limit,
                    LIMIT_RETENTION.as_millis() as u64,
                )
                .map_err(|e| self.inner.sorted(e).during("set_limit"))
            })
        })?;
        self.inner.stored_limit.store(limit, Ordering::Relaxed);
        Ok(())
    }

    /// Every unexpired holder, ordered by lease deadline (soonest first).
    pub fn holders(&self) -> Result<Vec<Holder>> {
        Ok(self.status_and_holders_during("holders")?.1)
    }

    /// [`status`](Semaphore::status) and [`holders`](Semaphore::holders) read in one
    /// round trip, so they describe the same instant: the holders' permits add up to
    /// the status's `held` (two calls may see a grant or a release between them).
    ///
    /// # Errors
    ///
    /// As [`status`](Semaphore::status).
    pub fn status_and_holders(&self) -> Result<(Status, Vec<Holder>)> {
        self.status_and_holders_during("status_and_holders")
    }

    fn status_and_holders_during(&self, op: &'static str) -> Result<(Status, Vec<Holder>)> {
        let inspected = self.inspect(Inspect::Holders, op)?;
        let status = self.learn(status_of(&inspected));
        let Some((now, list)) = inspected.holders else {
            return Err(bad("holders: none listed"));
        };
        let holders = list
            .into_iter()
            .map(|h| parse_holder(h.id, &h.record, h.deadline_ms, now))
            .collect::<Result<_>>()?;
        Ok((status, holders))
    }

    /// Releases permit `id` whoever holds it (an operator's tool: the holder learns of
    /// it at its next refresh). Returns whether it was held.
    ///
    /// It sets aside the limit's promise for that permit: until the holder's next
    /// renewal (within its refresh interval) its `Permit` still says it is valid,
    /// while the freed slot may already be granted to another holder. Fencing (the
    /// new holder's higher [`token`](crate::Permit::token) for that slot) is what
    /// tells them apart downstream. Use it for a holder known to be gone. A `Permit`
    /// of this call's own [`Client`] is told at once: it is marked lost
    /// ([`LostReason::Released`]) before the call is sent; an adoption of it under
    /// way in this client fails with [`Error::PermitLost`] (reason `Released`).
    ///
    /// A call whose connection broke is sent once more on a fresh connection (as
    /// every call of the semaphore is); when the first send had released the permit
    /// and its reply was lost with the connection, the second finds it gone and the
    /// answer is `false`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `id` is not a permit id (36 characters of uuid
    /// text, as [`Permit::id`] gives): nothing else stored with the semaphore can be
    /// named; Redis and pool errors.
    pub fn force_release(&self, id: &str) -> Result<bool> {
        if !is_permit_id(id) {
            return Err(Error::InvalidArgument(format!(
                "{id:?} is not a permit id (36 characters of uuid text)"
            )));
        }
        // a permit of this client is lost from now on, before its slot can be granted
        // again: its next renewal would say so only up to a refresh interval later,
        // while another Permit of this client may already hold the slot (marked before
        // the call: one that fails may have run)
        let shared = &self.inner.client.inner.shared;
        // (an adoption of it under way in this client is told as well: its script may
        // have run before this release, its Permit not registered yet)
        let own = shared.registry.lock().force_released(&self.inner.name, id);
        for p in own {
            p.mark_lost_counted(LostReason::Released, &shared.stats);
        }
        // keep the keys, so that the holder learns "released", not "keys gone"
        let status = self.counted(|| {
            self.run_resending(|conn| {
                leased::release(conn, &self.inner.keys, id, true)
                    .map_err(|e| self.inner.sorted(e).during("force_release"))
            })
        })?;
        Ok(status != Released::NotHeld)
    }

    /// Refuses, before any call, a count no limit this handle knows of allows: above
    /// both its own limit and the stored one it last learnt (a stored limit takes
    /// precedence; one lower than the handle's is enforced by the scripts, which
    /// answer [`Error::PermitsExceedLimit`] with the limit in force).
    fn check_permits(&self, n: u32) -> Result<()> {
        Error::check_permits(n)?;
        let known = self
            .inner
            .limit
            .max(self.inner.stored_limit.load(Ordering::Relaxed));
        if n > known {
            return Err(self.too_many(n, known));
        }
        Ok(())
    }

    fn too_many(&self, requested: u32, limit: u32) -> Error {
        Error::PermitsExceedLimit {
            name: self.inner.name.clone(),
            requested,
            limit,
        }
    }

    /// Runs `call` on a pooled connection (the pool's own wait for it, then one
    /// operation timeout), once more on a fresh one when that connection was broken
    /// ([`Shared::run_resending`](crate::shared::Shared::run_resending)): for the
    /// status reads and the operator's writes, each safe to run twice.
    fn run_resending<T>(
        &self,
        mut call: impl FnMut(&mut dyn redis::ConnectionLike) -> Result<T>,
    ) -> Result<T> {
        self.inner
            .client
            .inner
            .shared
            .run_resending(None, |c| call(&mut **c))
    }

    /// Blocking acquire. One try first; then the waiter queues itself (after the
    /// client's wake-up listener is subscribed) and sleeps until Redis pushes its grant,
    /// it heads the queue and the earliest lease ends, the listener asks everyone to
    /// look again, or a bounded timer runs out (covers a lost message). Every look is
    /// the same acquire script with the same id, so a grant made while the waiter was
    /// not listening is found, never made twice.
    fn wait_for<T>(
        &self,
        n: u32,
        deadline: Option<Instant>,
        cancel: &Receiver<T>,
    ) -> Result<Option<Permit>> {
        self.check_permits(n)?;
        // a cancel that fired before the call: nothing is taken, even a free permit (a
        // shutdown loop `while let Some(p) = sem.acquire_cancellable(&stop)?` ends)
        if fired(cancel) {
            return Ok(None);
        }
        let mut id = new_id();
        // the wait's bound: its deadline and one operation timeout
        let end = wait_end(deadline, self.inner.client.inner.shared.op_timeout);
        // (read before the try, whose own reading of the server's clock must not count)
        let answered_before = self.inner.clock.get().is_some();
        let tried = Instant::now();
        let mut outage_since = None;
        match self.attempt(&id, n, Mode::Try, "", 0) {
            Ok(Attempt::Granted(p)) => return self.confirm(p, end).map(Some),
            Ok(_) => {}
            // An outage (a failover, a restart) met by the first try is ridden through
            // as the queued looks ride through theirs, timed from this try, when the
            // server has answered this client before; one it never answered (a wrong
            // address, a replica, a server not started) fails the call at once, and
            // so does a checkout from a given pool (whose error may hide refused
            // credentials). The try's id, which a lost reply may have been granted
            // to, is given back by the clean-up `attempt` scheduled, and never used
            // again.
            Err(e)
                if is_outage(&e)
                    && answered_before
                    && !matches!(e, Error::Pool(_))
                    && deadline.is_none_or(|d| Instant::now() < d) =>
            {
                if fired(cancel) {
                    return Ok(None);
                }
                log::warn!(
                    "redis-semaphore: an acquire of {} waits through: {e}",
                    self.inner.name
                );
                id = new_id();
                outage_since = Some(tried);
            }
            Err(e) => return Err(e),
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
        let client = &self.inner.client.inner;
        let hub = client.hub()?;
        if outage_since.is_none() {
            // (not in an outage, when the subscription cannot come up: the looks
            // cover a missed wake-up)
            let ready_by = Instant::now() + client.shared.op_timeout;
            hub.wait_ready(deadline.map_or(ready_by, |d| d.min(ready_by)));
        }
        let stats = &client.shared.stats;
        let metrics = &self.inner.metrics;
        Counters::bump(&stats.waits);
        metrics.waits();
        let started = Instant::now();
        // (a look that fails has counted its error already, in `attempt`)
        let result = self
            .wait_riding_through(n, deadline, cancel, &hub, id, outage_since)
            .and_then(|p| {
                p.map(|p| {
                    self.full_lease(p, deadline)
                        .and_then(|p| self.confirm(p, end))
                        .inspect_err(|e| self.count_redis_error(e))
                })
                .transpose()
            });
        match &result {
            Ok(Some(_)) => {
                let waited = started.elapsed();
                stats.waited(waited);
                metrics.waited(waited);
            }
            Ok(None) => {
                Counters::bump(&stats.wait_gave_up);
                metrics.wait_gave_up();
            }
            Err(_) => {}
        }
        result
    }

    /// A permit served from the queue lasts only a heartbeat until its client renews it
    /// (`serve` in common.lua); without automatic refresh nothing would, so it is
    /// renewed here to the full lease, as a grant of the caller's own call has.
    ///
    /// The renewal ends by the wait's bound (its `deadline` plus one operation
    /// timeout, the look in flight at the deadline) and by the grant's own deadline,
    /// after which the permit is lost whatever the renewal says. A renewal that cannot
    /// finish for want of the server leaves the permit valid until the deadline the
    /// client already knows (never later than the server's); when that has passed
    /// too, the grant is given back in the background and the wait ends with the
    /// error, as an acquire whose reply came too late.
    fn full_lease(&self, p: Permit, deadline: Option<Instant>) -> Result<Permit> {
        let sem = &self.inner;
        let hb = Duration::from_millis(scripts::heartbeat_ms(sem.group.lease_ms));
        if sem.group.auto || p.lease_left() > hb || p.state.held_out(Instant::now()) {
            return Ok(p);
        }
        let op = sem.client.inner.shared.op_timeout;
        let mut until = p.state.valid_until();
        if let Some(d) = deadline {
            until = until.min(d + op);
        }
        let wait = until.saturating_duration_since(Instant::now()).min(op);
        // (no replica wait: `confirm` follows, and waits for its own renewal)
        match sem.renew_within(&p.state, wait, false) {
            Ok(()) if !p.is_lost() => Ok(p),
            // renewed, but its deadline passed meanwhile and the refresher said so
            Ok(()) => {
                self.give_back_later(p);
                Err(late_reply(&sem.name))
            }
            Err(e) if is_outage(&e) => {
                if !p.is_lost() && p.lease_left() > Duration::ZERO {
                    log::debug!(
                        "redis-semaphore: a permit of {} served from the queue keeps its \
                         first deadline: its renewal failed: {e}",
                        sem.name
                    );
                    return Ok(p);
                }
                self.give_back_later(p);
                Err(e)
            }
            // the permit is gone (marked lost), or an error of another kind: dropping
            // it gives it back, one round trip to a server that answers
            Err(e) => Err(e),
        }
    }

    /// Gives `p` back now, the release ending by `end` (or one operation timeout from
    /// now, if sooner); a release that fails or runs out of time is left to the
    /// background thread (sent again until the lease has surely ended), so the caller
    /// never waits past `end` for it.
    fn give_back_by(&self, p: Permit, end: Instant) {
        let sem = &self.inner;
        let state = Arc::clone(&p.state);
        // stops its renewal here and sends nothing
        let _ = p.into_parts();
        let deadline = end.min(Instant::now() + sem.client.inner.shared.op_timeout);
        match sem.release_by(&state, deadline) {
            Ok(()) | Err(Error::PermitLost { .. } | Error::LeaseExpired { .. }) => {}
            Err(e) => {
                log::debug!(
                    "redis-semaphore: giving back {} of {} in the background: {e}",
                    state.id,
                    sem.name
                );
                self.clean_up_after(&state.id, Instant::now());
            }
        }
    }

    /// Gives `p` back through the background thread (the release sent at once, and
    /// retried until its lease has surely ended), without waiting for it here.
    fn give_back_later(&self, p: Permit) {
        let id = p.id().to_owned();
        // stops its renewal here and sends nothing
        let _ = p.into_parts();
        self.clean_up_after(&id, Instant::now());
    }

    /// The queued part of [`wait_for`](Semaphore::wait_for), riding through a failover
    /// or a short outage: a look that fails for want of the server (a connection
    /// refused or dropped, a timeout, a cluster moving its slots) does not end the
    /// wait while the outage is shorter than [`RIDE_THROUGH`] and the deadline has not
    /// come; the waiter queues again with a new id after a short pause. Each outage is
    /// timed from its own first failed look: one after a look was answered again is a
    /// new outage (a waiter blocked for hours rides through every failover). The old id is
    /// never used again: a grant a failed look may have left behind is given back by
    /// the clean-up `attempt` schedules, and a queued record of it lapses with its
    /// heartbeat (about a second). `outage_since`: when an outage the call met before
    /// it queued (its first try's) began, which the first look's failure continues.
    /// The wait's arrival ticket (see [`wait_queued`](Self::wait_queued)) goes on
    /// with the new id: the waiter keeps its place in the arrival order.
    fn wait_riding_through<T>(
        &self,
        n: u32,
        deadline: Option<Instant>,
        cancel: &Receiver<T>,
        hub: &Arc<Hub>,
        mut id: String,
        mut outage_since: Option<Instant>,
    ) -> Result<Option<Permit>> {
        let mut pause = Duration::from_millis(20);
        let end = wait_end(deadline, self.inner.client.inner.shared.op_timeout);
        let mut ticket = 0;
        loop {
            let mut waiter = Waiter::new(self, Arc::clone(hub), id, end);
            let looked = Instant::now();
            match self.wait_queued(n, deadline, cancel, &mut waiter, &mut ticket) {
                Err(e) if is_outage(&e) => {
                    // leave without a cancel round trip (the server is not answering)
                    waiter.finish();
                    let now = Instant::now();
                    // an outage is timed from its first failed look: the start of this
                    // wait when none of its looks was answered, else (a new outage) the
                    // look that just failed, sent within one operation timeout
                    let since = if waiter.answered {
                        pause = Duration::from_millis(20);
                        *outage_since.insert(now)
                    } else {
                        *outage_since.get_or_insert(looked)
                    };
                    if now >= since + RIDE_THROUGH || deadline.is_some_and(|d| now >= d) {
                        return Err(e);
                    }
                    log::warn!(
                        "redis-semaphore: a waiter of {} looks again after: {e}",
                        self.inner.name
                    );
                    let until = deadline.map_or(now + pause, |d| d.min(now + pause));
                    select! {
                        recv(cancel) -> _ => return Ok(None),
                        recv(crossbeam_channel::at(until)) -> _ => {}
                    }
                    pause = (pause * 2).min(Duration::from_millis(500));
                    id = new_id();
                }
                other => return other,
            }
        }
    }

    /// The queued part of [`wait_for`](Semaphore::wait_for).
    ///
    /// `ticket`: the arrival ticket of the wait's last queued reply (0: none yet),
    /// passed on every later look. A waiter the queue dropped while it still waits
    /// (its heartbeat ended unrenewed: writes paused or the server stopped for longer
    /// than a heartbeat, which purges every waiter at once) queues again with it, in
    /// its old place, not behind the waiters whose clients learnt of the loss first.
    /// It only orders the queue: the script grants the same with or without it.
    fn wait_queued<T>(
        &self,
        n: u32,
        deadline: Option<Instant>,
        cancel: &Receiver<T>,
        waiter: &mut Waiter<'_>,
        ticket: &mut u64,
    ) -> Result<Option<Permit>> {
        let fallback = self
            .inner
            .lease()
            .clamp(Duration::from_millis(250), Duration::from_secs(5));
        loop {
            // No look goes out once the deadline has passed: a look that came back
            // after it (the one in flight at the deadline) is followed by the cancel,
            // never by another look with an operation timeout of its own, whatever woke
            // the waiter (a lost heartbeat, "look again", a grant message to check),
            // which the `select!` below may pick over the expired timer. (A waiter none
            // of whose looks was answered has sent none: the loop comes back here only
            // after an answer. Nothing of it is queued, and there is nothing to cancel.)
            if deadline.is_some_and(|d| Instant::now() >= d) {
                if !waiter.answered {
                    waiter.finish();
                    return Ok(None);
                }
                return self.give_up(waiter, true, deadline);
            }
            let channel = &waiter.hub.channel;
            let retry_after = match self.attempt(&waiter.id, n, Mode::Wait, channel, *ticket)? {
                Attempt::Granted(p) => {
                    waiter.finish();
                    return Ok(Some(p));
                }
                Attempt::Busy {
                    retry_after,
                    ticket: t,
                } => {
                    // (a reply without one, from an older script, keeps the last)
                    if t > 0 {
                        *ticket = t;
                    }
                    retry_after
                }
            };
            waiter.answered = true;
            let now = Instant::now();
            let mut look_at = now
                + if waiter.hub.is_ready() {
                    fallback
                } else {
                    NO_PUSH_POLL
                };
            if let Some(r) = retry_after {
                look_at = look_at.min(later_by(now, r));
            }
            loop {
                let until = deadline.map_or(look_at, |d| d.min(look_at));
                select! {
                    recv(waiter.wake) -> wake => match wake {
                        Ok(Wake::Granted { token, deadline_ms, slots, received }) if slots.len() == n as usize => {
                            // learnt outside a round trip: the server's deadline, through
                            // the anchor, bounds it (a message delayed by a partition
                            // arrives with less time left, or none), and so does what
                            // the server gives a pushed grant (a forged message)
                            let valid_until = match self.pushed_deadline(deadline_ms, received) {
                                Some(v) if v > Instant::now() => v,
                                // look again: the look says what is left of it
                                _ => break,
                            };
                            waiter.finish();
                            return Ok(Some(self.permit(waiter.id.clone(), token, slots, n, valid_until)));
                        }
                        Ok(Wake::Head { retry_after }) => {
                            if let Some(r) = retry_after {
                                look_at = look_at.min(later_by(Instant::now(), r));
                            }
                        }
                        Ok(_) | Err(_) => break,
                    },
                    recv(waiter.heartbeat_lost) -> _ => {
                        waiter.renew_heartbeat();
                        break;
                    }
                    recv(cancel) -> _ => return self.give_up(waiter, false, deadline),
                    recv(crossbeam_channel::at(until)) -> _ => {
                        if deadline.is_some_and(|d| Instant::now() >= d) {
                            return self.give_up(waiter, true, deadline);
                        }
                        break;
                    }
                }
            }
        }
    }

    /// Leaves the queue. A grant that raced the cancellation is kept when `keep` (a
    /// timeout at the very moment of the hand-off), else given back. The cancel, the
    /// wait for its connection included, ends within one operation timeout, and by
    /// the wait's `deadline` plus one operation timeout (the wait's bound).
    fn give_up(
        &self,
        waiter: &mut Waiter<'_>,
        keep: bool,
        deadline: Option<Instant>,
    ) -> Result<Option<Permit>> {
        let op = self.inner.client.inner.shared.op_timeout;
        let soon = Instant::now() + op;
        let until = wait_end(deadline, op).map_or(soon, |end| soon.min(end));
        let reply = self.run_cancel(&waiter.id, until);
        waiter.finish();
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                // out of the queue, and a grant that came given back, by the background
                // thread (as a dropped waiter's failed cancel is): not left to lapse
                // with the heartbeat
                self.clean_up_waiter_after(&waiter.id, Instant::now());
                self.count_redis_error(&e);
                return Err(e);
            }
        };
        match reply {
            Some((token, valid_until, slots)) => {
                let n = slots.len() as u32;
                let p = self.permit(waiter.id.clone(), token, slots, n, valid_until);
                if keep && valid_until > Instant::now() {
                    return Ok(Some(p));
                }
                // by the wait's bound, not one more operation timeout after it
                self.give_back_by(p, until);
                Ok(None)
            }
            None => Ok(None),
        }
    }

    /// Runs the cancel script, the whole call (checkout, write, read) ending by
    /// `until`; `Some((token, client deadline, slots))` when the waiter had been
    /// granted meanwhile.
    fn run_cancel(&self, id: &str, until: Instant) -> Result<Option<(u64, Instant, Vec<u32>)>> {
        let sent = Instant::now();
        let shared = &self.inner.client.inner.shared;
        let keys = &self.inner.keys;
        // (sent again on a fresh connection when its own broke: a cancel is safe to run
        // twice, and the second answers whether the waiter had been granted)
        let reply = shared.run_resending(Some(until), |c| {
            leased::cancel(&mut **c, keys, id).map_err(|e| self.inner.sorted(e))
        })?;
        let clock = &self.inner.clock;
        match reply {
            Cancelled::Left { now_ms } => {
                note_anchor(clock, sent, Some(now_ms));
                Ok(None)
            }
            Cancelled::Granted { now_ms, grant } => {
                note_anchor(clock, sent, Some(now_ms));
                let valid_until = self.client_deadline(now_ms, grant.deadline_ms);
                Ok(Some((grant.token, valid_until, grant.slots)))
            }
        }
    }

    /// One run of the acquire script for permit id `id`. A try goes through the
    /// combiner (it may share a script call with other threads' tries and releases);
    /// a waiter's look goes alone.
    ///
    /// The permit's client-side deadline comes from the server's deadline in the reply,
    /// converted with the client's clock anchor (`clock.rs`): never later than the
    /// server's, whenever the call was sent, however long it waited for a connection.
    /// `ticket`: a waiter's arrival ticket (0 for a try, which is never queued).
    fn attempt(&self, id: &str, n: u32, mode: Mode, channel: &str, ticket: u64) -> Result<Attempt> {
        let sem = &self.inner;
        let shared = &sem.client.inner.shared;
        let lease_ms = sem.group.lease_ms;
        // the caller stops waiting for this call then; the script refuses to run later
        // (by the server's clock), and a clean-up after a lost reply waits until then
        let give_up = Instant::now() + shared.op_timeout;
        // whether a failure may have left a grant behind (not when it was never sent)
        let mut in_doubt = true;
        let op = || Op::Acquire {
            id: id.to_owned(),
            n,
            limit: sem.limit,
            lease_ms,
            origin: Arc::clone(&sem.origin),
            fair: sem.fair,
            give_up,
        };
        let first: Result<Acquired> = match mode {
            Mode::Try => sem
                .combiner
                .run(op(), &|ops| sem.exec_until(ops, give_up), give_up)
                .map_err(|f| {
                    in_doubt = matches!(f, Failed::Call(_));
                    Error::from(f)
                })
                .and_then(acquired),
            Mode::Wait => self.look(id, n, channel, ticket, give_up, false),
        };
        // A call that failed on a broken connection (the server closed it while it was
        // idle in the pool, `CLIENT KILL`, a restart) is sent once more on a fresh
        // connection, alone, with the same id and cutoff, by the same give-up time:
        // the script is safe to run twice, and a grant the first send made (its reply
        // lost with the connection) is what the second returns, with the server's
        // deadline read afresh. Each operation of a shared call that broke is sent
        // again so by its own caller, once. `first_ran`: the first send may have run
        // (its reply lost), so a failure or a refusal past the cutoff of the second
        // leaves its grant, if any, to a clean-up.
        let (reply, first_ran) = match first {
            Err(Error::Redis(e)) if broken(&e) && Instant::now() < give_up => {
                log::debug!(
                    "redis-semaphore: an acquire of {} is sent again on a fresh connection: {e}",
                    sem.name
                );
                let again = match mode {
                    Mode::Try => sem.exec_fresh(&[&op()], give_up).and_then(|mut v| {
                        match (v.pop(), v.is_empty()) {
                            (Some(r), true) => acquired(r),
                            _ => Err(Error::reply("acquire", "not one reply to one operation")),
                        }
                    }),
                    Mode::Wait => self.look(id, n, channel, ticket, give_up, true),
                };
                in_doubt = true;
                (again, e.is_timeout() || e.is_connection_dropped())
            }
            other => (other, false),
        };
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                Counters::bump(&shared.stats.errors);
                sem.metrics.errors();
                return Err(match e {
                    Error::Redis(e) => {
                        if first_ran || in_doubt && (e.is_timeout() || e.is_connection_dropped()) {
                            // The script may have run (before the cutoff): give back
                            // whatever it granted, once the caller's give-up time has
                            // passed, so the clean-up cannot overtake the call (a
                            // waiter's look may have queued it: out of the queue first).
                            self.owe_clean_up(id, give_up, mode == Mode::Wait);
                        }
                        sem.error(e).during("acquire")
                    }
                    e @ Error::UnexpectedReply { .. } => {
                        // The script ran and may have granted to `id` (a grant whose
                        // deadline is out of range, say, one another program wrote):
                        // given back, as the id is never used again.
                        self.owe_clean_up(id, Instant::now(), mode == Mode::Wait);
                        e
                    }
                    other => {
                        // (the fresh connection could not be made, say: the first
                        // send's grant, if any, is given back all the same)
                        if first_ran {
                            self.owe_clean_up(id, give_up, mode == Mode::Wait);
                        }
                        other
                    }
                });
            }
        };
        if first_ran && matches!(reply, Acquired::TooLate { .. }) {
            // the second send came after the cutoff and did nothing; the first may
            // have granted before it
            self.owe_clean_up(id, give_up, mode == Mode::Wait);
        }
        if mode == Mode::Try && matches!(reply, Acquired::Busy { .. }) {
            Counters::bump(&shared.stats.try_failed);
            sem.metrics.try_failed();
        }
        match reply {
            Acquired::Granted { now_ms, grant } => {
                if grant.slots.len() != n as usize {
                    return Err(Error::reply("acquire", "granted another number of permits"));
                }
                let valid_until = self.client_deadline(now_ms, grant.deadline_ms);
                if valid_until <= Instant::now() {
                    // The grant is already over by this client's reckoning (the reply
                    // took longer than the lease): give it back and report a timeout.
                    // The id is never used again (a waiter's wait ends with the error).
                    self.clean_up_after(id, Instant::now());
                    return Err(lease_over_on_arrival(&sem.name, sem.lease()));
                }
                Ok(Attempt::Granted(self.permit(
                    id.to_owned(),
                    grant.token,
                    grant.slots,
                    n,
                    valid_until,
                )))
            }
            Acquired::Busy {
                retry_ms, ticket, ..
            } => Ok(Attempt::Busy {
                retry_after: u64::try_from(retry_ms).ok().map(Duration::from_millis),
                ticket,
            }),
            Acquired::TooMany { limit, .. } => Err(self.too_many(n, limit)),
            Acquired::TooLate { .. } => Err(late_reply(&sem.name)),
        }
    }

    /// With [`SemaphoreBuilder::wait_replicas`]: makes sure enough replicas have the
    /// grant of `permit` before it is handed out, else gives it back.
    ///
    /// The grant was written by whatever connection ran its script (this caller's, a
    /// combined call's leader's, or a releaser's that served the queue), and `WAIT`
    /// only counts the writes of its own connection. So a renewal of the permit goes
    /// first on the connection that then waits: replication is one ordered stream, and
    /// a replica that acknowledged the renewal has the grant before it. The renewal
    /// asks for one millisecond more than the lease, so that it writes (its deadline is
    /// later than the grant's even within the grant's millisecond, `ZADD GT`): a
    /// renewal to the same deadline writes nothing, and `WAIT` on a connection that has
    /// written nothing yet (a new one, as after a call sent again on a fresh
    /// connection) or only before the grant counts replicas that lack it. (The server
    /// then holds the permit up to a millisecond longer than the client counts.)
    ///
    /// With `end` (a wait's bound: its deadline and one operation timeout), all of it
    /// (the checkout, the renewal and `WAIT`) ends by then, and a permit that was not
    /// confirmed is given back in the background, not in the caller's time.
    fn confirm(&self, permit: Permit, end: Option<Instant>) -> Result<Permit> {
        let sem = &self.inner;
        let Some((wanted, timeout_ms)) = sem.replicas else {
            return Ok(permit);
        };
        let shared = &sem.client.inner.shared;
        let op = shared.op_timeout;
        // (both sent again on a fresh connection when theirs broke: the renewal is safe
        // to run twice, and it is what the `WAIT` on that connection then counts; a
        // second send asks one millisecond more than the first, so that it writes
        // although the first ran within the same server millisecond)
        let mut extra_ms = 0;
        let acked = shared.run_resending(end, |conn| {
            extra_ms += 1;
            let lease_ms = sem.group.lease_ms + extra_ms;
            match leased::refresh(conn, &sem.keys, lease_ms, &[permit.id()]) {
                Ok(Renewal::Lost(gone)) if gone.is_empty() => {}
                Ok(_) => {
                    return Err(Error::PermitLost {
                        id: permit.id().to_owned(),
                        reason: LostReason::Expired,
                    });
                }
                Err(e) => return Err(sem.sorted(e)),
            }
            crate::pool::wait_acks(conn, &sem.keys.holders, wanted, timeout_ms, op)
                .map_err(|e| sem.sorted(e))
        });
        // The grant is given back, within one operation timeout (and by the wait's
        // bound): a give-back that fails is owed to the background thread (a release
        // by the grant's own id, safe to send again until its lease has surely ended),
        // not left to hold the permits for the rest of the lease.
        let give_back_end = end.unwrap_or_else(|| Instant::now() + op);
        match acked {
            Ok(acked) if acked >= wanted => Ok(permit),
            Ok(acked) => {
                self.give_back_by(permit, give_back_end);
                Err(Error::ReplicasNotAcked {
                    name: sem.name.clone(),
                    acked,
                    wanted,
                })
            }
            Err(e) => {
                self.give_back_by(permit, give_back_end);
                Err(e)
            }
        }
    }

    /// A waiter's look: the acquire script in wait mode, alone on a connection, the
    /// whole call (checkout, write, read) ending by `give_up` (one operation timeout
    /// from its start, so a look in flight at the wait's deadline ends within the
    /// wait's bound); with `fresh`, on a fresh connection (a look sent again after its
    /// connection broke, [`attempt`](Self::attempt)).
    fn look(
        &self,
        id: &str,
        n: u32,
        channel: &str,
        ticket: u64,
        give_up: Instant,
        fresh: bool,
    ) -> Result<Acquired> {
        let shared = &self.inner.client.inner.shared;
        let look =
            |c: &mut crate::pool::Conn| self.look_on(&mut **c, id, n, channel, ticket, give_up);
        if fresh {
            shared.on_fresh(give_up, look)
        } else {
            shared.pool.run_by(Some(give_up), shared.op_timeout, look)
        }
    }

    /// [`look`](Self::look) on the connection `conn`.
    fn look_on(
        &self,
        conn: &mut dyn redis::ConnectionLike,
        id: &str,
        n: u32,
        channel: &str,
        ticket: u64,
        give_up: Instant,
    ) -> Result<Acquired> {
        let sem = &self.inner;
        let clock = &sem.clock;
        let anchor = match clock.get() {
            Some(a) => a,
            None => read_server_time(conn, &sem.keys, clock)?,
        };
        let args = AcquireArgs {
            id,
            n,
            limit: sem.limit,
            lease_ms: sem.group.lease_ms,
            origin: &sem.origin,
            mode: Mode::Wait,
            fair: sem.fair,
            channel,
            cutoff_ms: anchor.server_ms_by(give_up),
            ticket,
        };
        let sent = Instant::now();
        let reply = leased::acquire(conn, &sem.keys, &args)?;
        note_anchor(clock, sent, reply.now_ms());
        Ok(reply)
    }

    /// The client-side deadline of a grant that a reply read at server time `now_ms`
    /// says lasts until server time `deadline_ms`: at most one lease of this handle
    /// after `now_ms`, what the scripts give (the deadline of a grant made by a server
    /// whose clock ran ahead of the one answering now, after a failover, may lie
    /// further on: the permit's client then believes less than the server's, never
    /// more), converted with the freshest anchor.
    fn client_deadline(&self, now_ms: i64, deadline_ms: i64) -> Instant {
        let lease_ms = i64::try_from(self.inner.group.lease_ms).unwrap_or(i64::MAX);
        let end = deadline_ms.min(now_ms.saturating_add(lease_ms));
        match self.inner.clock.get() {
            Some(a) => a.instant_before(end),
            // no anchor: no round trip has been answered, so nothing is known valid
            None => Instant::now(),
        }
    }

    /// The client-side deadline of a grant pushed to a waiter (serve() in
    /// common.lua): the message says the server's deadline `deadline_ms`, and arrived
    /// at `received`. `None` when nothing is known valid, or when the message cannot be
    /// the server's: the waiter then looks again, and the look answers with the grant
    /// if there is one.
    ///
    /// Nothing vouches for a message (any program that may `PUBLISH` can send one on
    /// the waiter's channel, which the queue's records name), so the server's own
    /// rule bounds it: a pushed grant lasts at most one heartbeat (`heartbeat_ms`, at
    /// most the lease and a second; less when the waiter's own heartbeat on the server
    /// ended sooner) from the server's time when it was made, which came before
    /// the message arrived. A deadline past the latest server time the anchor allows
    /// at `received` and one heartbeat is not the server's; any other is believed for
    /// at most one heartbeat from `received`, never longer, however it was forged. (A
    /// forged message can still give the waiter a `Permit` for that long: its first
    /// renewal, by the refresher within half of it or by the wait itself without
    /// auto-refresh, finds the id not held. Telling a forged message from a true one
    /// would take a round trip, or secrets the scripts cannot keep from a program that
    /// reads the keys.)
    fn pushed_deadline(&self, deadline_ms: i64, received: Instant) -> Option<Instant> {
        let anchor = self.inner.clock.get()?;
        let hb_ms = scripts::heartbeat_ms(self.inner.group.lease_ms);
        let hb = i64::try_from(hb_ms).unwrap_or(i64::MAX);
        let latest = anchor.server_ms_at_most(received).saturating_add(hb);
        if deadline_ms > latest {
            log::warn!(
                "redis-semaphore: a waiter of {} ignores a grant message whose deadline \
                 ({deadline_ms}) is later than the server can have given (by {latest}); \
                 it looks again",
                self.inner.name
            );
            return None;
        }
        Some(
            anchor
                .instant_before(deadline_ms)
                .min(lease_end(received, Duration::from_millis(hb_ms))),
        )
    }

    /// Counts `e` in [`Stats::errors`](crate::Stats::errors) (and the metrics) when it is
    /// a Redis or pool error.
    fn count_redis_error(&self, e: &Error) {
        self.inner.count_redis_error(e);
    }

    fn permit(
        &self,
        id: String,
        token: u64,
        slots: Vec<u32>,
        n: u32,
        valid_until: Instant,
    ) -> Permit {
        let p = self.permit_since(id, token, slots, n, valid_until, Instant::now());
        // a grant (an adoption, which takes over a grant counted where it was made, is
        // not counted again)
        Counters::bump(&self.inner.client.inner.shared.stats.acquired);
        self.inner.metrics.acquired();
        p
    }

    /// [`permit`](Self::permit) for a grant made at `granted` (an adopted one's
    /// [`max_hold`](SemaphoreBuilder::max_hold) counts from its grant).
    fn permit_since(
        &self,
        id: String,
        token: u64,
        slots: Vec<u32>,
        n: u32,
        valid_until: Instant,
        granted: Instant,
    ) -> Permit {
        let sem = &self.inner;
        let client = &sem.client.inner;
        let hold_until = sem.max_hold.and_then(|d| granted.checked_add(d));
        let (state, lost_rx) =
            PermitState::with_hold(id, valid_until, hold_until, sem.metrics.clone());
        let nudge = {
            let mut registry = client.shared.registry.lock();
            registry.in_hand(&sem.group.name, &state.id);
            registry.register(
                sem.group.clone(),
                &sem.keys,
                sem.refresh_every,
                Arc::clone(&state),
            )
        };
        if nudge {
            client.nudge();
        }
        // the guard exists before any code of the user's runs (the logger): were that
        // to panic, the guard's drop gives the grant back, which the refresher would
        // otherwise renew for as long as the client lives
        let permit = Permit {
            grantor: Arc::clone(&self.inner) as Arc<dyn crate::permit::Grantor>,
            state,
            lost_rx,
            token,
            slots,
            permits: n,
            released: false,
        };
        log::debug!(
            "redis-semaphore: {} granted {n} permit(s) to {}",
            sem.name,
            permit.state.id
        );
        permit
    }

    /// Registers a waiter's heartbeat ("w:" + id) with the refresher, which renews it
    /// every third of a heartbeat (the lease's [`heartbeat_ms`](crate::scripts::heartbeat_ms)),
    /// apart from the permits.
    fn register_heartbeat(&self, id: &str) -> (Arc<PermitState>, Receiver<LostReason>) {
        let sem = &self.inner;
        let client = &sem.client.inner;
        let hb = sem.wait_group.lease();
        let (state, lost) = PermitState::new(format!("w:{id}"), Instant::now() + shrink(hb));
        let nudge = client.shared.registry.lock().register(
            sem.wait_group.clone(),
            &sem.keys,
            (hb / 3).max(Duration::from_millis(1)),
            Arc::clone(&state),
        );
        if nudge {
            client.nudge();
        }
        (state, lost)
    }

    fn deregister_heartbeat(&self, member: &str) {
        let sem = &self.inner;
        sem.client
            .inner
            .shared
            .registry
            .lock()
            .deregister(&sem.wait_group, member);
    }

    /// Gives back, from the background thread, whatever an acquire of `id` whose reply
    /// was lost may have been granted, not before `at` (the caller's give-up time: the
    /// script refuses to run after it, so a clean-up sent then comes after the acquire
    /// if the acquire ran at all).
    fn clean_up_after(&self, id: &str, at: Instant) {
        self.owe_clean_up(id, at, false);
    }

    /// [`clean_up_after`](Self::clean_up_after) for a waiter that left without its
    /// cancel: its queue entry is taken out first (else it would hold up the waiters
    /// behind it until its heartbeat lapsed, and could be served a grant then).
    fn clean_up_waiter_after(&self, id: &str, at: Instant) {
        self.owe_clean_up(id, at, true);
    }

    fn owe_clean_up(&self, id: &str, at: Instant, waiter: bool) {
        self.inner.owe_clean_up(id, at, waiter);
    }

    fn inspect(&self, what: Inspect, op: &'static str) -> Result<Inspected> {
        self.counted(|| {
            self.run_resending(|conn| {
                leased::inspect(conn, &self.inner.keys, self.inner.limit, what)
                    .map_err(|e| self.inner.sorted(e).during(op))
            })
        })
    }

    /// `call`, its Redis or pool error counted ([`count_redis_error`](Self::count_redis_error)):
    /// for the calls of the status reads and the operator's writes, which have no
    /// counting of their own.
    fn counted<T>(&self, call: impl FnOnce() -> Result<T>) -> Result<T> {
        call().inspect_err(|e| self.count_redis_error(e))
    }

    fn counts(&self, op: &'static str) -> Result<(u32, u32, u32)> {
        let s = self.status_during(op)?;
        Ok((s.limit, s.held, s.queued))
    }
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.inner.name)
            .field("limit", &self.inner.limit)
            .field("lease", &self.inner.lease())
            .field("fair", &self.inner.fair)
            .field("auto_refresh", &self.inner.group.auto)
            .field("wait_replicas", &self.inner.replicas)
            .field("max_hold", &self.inner.max_hold)
            .finish()
    }
}

/// The shortest lease the background thread renews: a renewal is a round trip, sent a
/// third of the lease before its end, so a shorter lease would run out between two.
pub(crate) const MIN_RENEWED_LEASE: Duration = Duration::from_millis(100);

/// How long a blocked acquire waits through an outage (failed looks one after the
/// other) before it returns the error: a Sentinel or Cluster failover takes a few
/// seconds.
const RIDE_THROUGH: Duration = Duration::from_secs(30);

/// Whether `e` is a Redis or pool error (what `Stats::errors` counts), not a refusal
/// or an outcome of the semaphore's own (a limit, a lost permit, too few replicas).
pub(crate) fn is_redis_error(e: &Error) -> bool {
    matches!(
        e,
        Error::Redis(_)
            | Error::Call { .. }
            | Error::Pool(_)
            | Error::Connect { .. }
            | Error::Auth { .. }
            | Error::Timeout { .. }
            | Error::WrongType { .. }
            | Error::UnexpectedReply { .. }
    )
}

/// Whether `e` says the server could not be reached or is moving (a failover): a
/// waiter may look again later. `NOREPLICAS` is one: a primary with
/// `min-replicas-to-write` refuses writes while its replicas are gone, as the old
/// primary does during a failover (docs/deployment.md recommends the setting).
pub(crate) fn is_outage(e: &Error) -> bool {
    if is_lease_over_on_arrival(e) {
        // the server answered: the lease is shorter than the round trip, which riding
        // through would only meet again at every look
        return false;
    }
    match e {
        Error::Pool(_) | Error::Timeout { .. } => true,
        Error::Connect { .. } => e.is_retryable(),
        Error::Redis(e) | Error::Call { source: e, .. } => {
            e.is_io_error()
                || e.is_connection_refusal()
                || e.is_connection_dropped()
                || e.is_timeout()
                || e.is_cluster_error()
                || matches!(
                    crate::error::server_code(e),
                    Some("NOREPLICAS" | "READONLY" | "LOADING" | "MASTERDOWN" | "TRYAGAIN")
                )
        }
        _ => false,
    }
}

/// The error of an acquire whose reply came too late to use: the script ran after the
/// caller's give-up time (and did nothing), or its grant had ended by the client's
/// reckoning when the reply arrived (and is given back).
fn late_reply(name: &str) -> Error {
    Error::Redis(redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("acquire on semaphore {name:?}: the reply came after the operation timeout"),
    )))
}

/// The acquire's reply of a hot-path call.
fn acquired(r: HotReply) -> Result<Acquired> {
    match r {
        HotReply::Acquired(a) => Ok(a),
        HotReply::Released(_) => Err(Error::reply("acquire", "a release's reply")),
    }
}

/// Whether `cancel` has fired: a message waits, or every sender is gone.
fn fired<T>(cancel: &Receiver<T>) -> bool {
    matches!(
        cancel.try_recv(),
        Ok(_) | Err(crossbeam_channel::TryRecvError::Disconnected)
    )
}

/// The instant `d` (and a millisecond) after `at`: a wait's next look, after a time a
/// reply or a message gave. A time past what an `Instant` holds is a hundred years.
fn later_by(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .and_then(|t| t.checked_add(Duration::from_millis(1)))
        .unwrap_or_else(|| deadline_in(Duration::MAX))
}

/// A grant whose lease had ended by the time its reply arrived (the round trip took
/// longer than the lease): a timeout, which says so rather than blaming the operation
/// timeout, and which a wait does not take for an outage (see [`is_outage`]).
fn lease_over_on_arrival(name: &str, lease: Duration) -> Error {
    Error::Redis(redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        LeaseOverOnArrival(format!(
            "acquire on semaphore {name:?}: the grant arrived after its lease of {lease:?} \
             had ended (the reply took longer than the lease), so it was given back; use a \
             lease well above the round trip to Redis"
        )),
    )))
}

/// The message of [`lease_over_on_arrival`]; its source, [`LeaseTooShort`], marks the
/// error so that it can be told from a timeout of the server (redis keeps the I/O error
/// behind an `Arc`, so only the chain of sources reaches it).
#[derive(Debug)]
struct LeaseOverOnArrival(String);

impl std::fmt::Display for LeaseOverOnArrival {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LeaseOverOnArrival {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&LeaseTooShort)
    }
}

/// The cause of [`lease_over_on_arrival`]'s error.
#[derive(Debug)]
struct LeaseTooShort;

impl std::fmt::Display for LeaseTooShort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the lease is shorter than the round trip to Redis")
    }
}

impl std::error::Error for LeaseTooShort {}

/// Whether `e` is [`lease_over_on_arrival`]'s error (also once sorted into another
/// variant): [`LeaseTooShort`] is in its chain of sources.
fn is_lease_over_on_arrival(e: &Error) -> bool {
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if c.is::<LeaseTooShort>() {
            return true;
        }
        cause = c.source();
    }
    false
}

fn check_label(label: &str) -> Result<()> {
    if label.len() > 100 || label.contains(['\n', '\r']) {
        return Err(Error::InvalidArgument(
            "a label is at most 100 bytes, without line breaks".into(),
        ));
    }
    Ok(())
}

fn new_id() -> String {
    uuid::Uuid::new_v4().hyphenated().to_string()
}

fn bad(detail: &str) -> Error {
    Error::reply("inspect", detail)
}

/// The status the inspect script's counts give.
fn status_of(i: &Inspected) -> Status {
    Status {
        limit: i.limit,
        stored_limit: i.stored,
        client_limit: i.client,
        other_client_limit: i.other.filter(|o| Some(*o) != i.client),
        held: i.used,
        available: i.limit.saturating_sub(i.used),
        queued: i.queued,
        exists: i.exists,
    }
}

/// Parses a holder record "permits|token|slots|acquired_ms|pid|host|label".
fn parse_holder(id: String, record: &str, deadline: i64, now: i64) -> Result<Holder> {
    let f: Vec<&str> = record.splitn(7, '|').collect();
    if f.len() < 6 {
        return Err(bad("holder record has too few fields"));
    }
    let num = |s: &str| {
        s.parse::<u64>()
            .map_err(|_| bad("holder record has a bad number"))
    };
    let small = |s: &str| {
        u32::try_from(num(s)?).map_err(|_| bad("holder record has a number out of range"))
    };
    let slots = if f[2].is_empty() {
        Vec::new()
    } else {
        f[2].split(',').map(small).collect::<Result<_>>()?
    };
    let acquired_ms = num(f[3])?;
    Ok(Holder {
        id,
        permits: small(f[0])?,
        token: num(f[1])?,
        slots,
        acquired_at: UNIX_EPOCH
            .checked_add(Duration::from_millis(acquired_ms))
            .ok_or_else(|| bad("holder record has an acquire time out of range"))?,
        held_for: Duration::from_millis(
            u64::try_from(now).unwrap_or(0).saturating_sub(acquired_ms),
        ),
        pid: small(f[4])?,
        host: f[5].to_owned(),
        label: f.get(6).filter(|l| !l.is_empty()).map(|l| (*l).to_owned()),
        lease_left: Duration::from_millis(deadline.saturating_sub(now).max(0) as u64),
    })
}

impl Grantor for SemInner {
    fn name(&self) -> &str {
        &self.name
    }

    fn op_timeout(&self) -> Duration {
        self.client.inner.shared.op_timeout
    }

    fn release_aside(&self) -> bool {
        self.client.inner.shared.is_cluster()
    }

    fn detach(&self, permit: &PermitState) {
        let shared = &self.client.inner.shared;
        let mut registry = shared.registry.lock();
        registry.deregister(&self.group, &permit.id);
        registry.let_go(&self.name, &permit.id);
    }

    fn refresh(&self, permit: &PermitState) -> Result<()> {
        // (a manual refresh: a waiter's renewal of its grant counts its error itself)
        self.renew_within(permit, self.client.inner.shared.op_timeout, true)
            .inspect_err(|e| self.count_redis_error(e))
    }

    fn release(&self, permit: &PermitState) -> Result<()> {
        let deadline = Instant::now() + self.client.inner.shared.op_timeout;
        let result = self.release_by(permit, deadline);
        if let Err(e) = &result
            && e.is_retryable()
        {
            // a transient refusal (TRYAGAIN while the slot migrates, a failover, a
            // timeout): sent again by the background thread until the lease has surely
            // ended, not left taken for the rest of its lease (a second release of a
            // permit already given back changes nothing)
            self.owe_clean_up(&permit.id, Instant::now(), false);
        }
        result
    }
}

impl SemInner {
    /// Counts `e` in [`Stats::errors`](crate::Stats::errors) (and the metrics) when it is
    /// a Redis or pool error.
    fn count_redis_error(&self, e: &Error) {
        if is_redis_error(e) {
            Counters::bump(&self.client.inner.shared.stats.errors);
            self.metrics.errors();
        }
    }

    /// Owes the background thread the release of `id` (and, for a waiter, its cancel
    /// first), sent from `at` on until its lease has surely ended.
    fn owe_clean_up(&self, id: &str, at: Instant, waiter: bool) {
        let client = &self.client.inner;
        client
            .shared
            .registry
            .lock()
            .clean_up(&self.keys, id, at, at + self.lease(), waiter);
        client.nudge();
    }

    /// [`Grantor::release`], all of it ending by `deadline`.
    fn release_by(&self, permit: &PermitState, deadline: Instant) -> Result<()> {
        let shared = &self.client.inner.shared;
        let result = self
            .give_back(permit, deadline)
            .map_err(|e| e.during("release"));
        // the grant may be adopted again in this client once its release has ended
        // (not before: an adoption that ran before the release would be freed by it).
        // A release that may still run (its reply timed out, say: the first send may
        // yet arrive, and the background thread sends it again, Grantor::release) keeps
        // the grant in hand until the background thread is done with it: until its
        // release ran, or its lease has surely ended (Registry::let_go_owed).
        if !result.as_ref().is_err_and(Error::is_retryable) {
            shared.registry.lock().let_go(&self.name, &permit.id);
        }
        match &result {
            Ok(()) => {
                Counters::bump(&shared.stats.released);
                self.metrics.released();
                log::debug!("redis-semaphore: {} released {}", self.name, permit.id);
            }
            Err(Error::PermitLost { .. } | Error::LeaseExpired { .. }) => {
                Counters::bump(&shared.stats.release_gone);
                self.metrics.release_gone();
            }
            Err(e) => {
                Counters::bump(&shared.stats.release_failed);
                self.metrics.release_failed();
                if matches!(
                    e,
                    Error::Redis(_)
                        | Error::Call { .. }
                        | Error::Pool(_)
                        | Error::Connect { .. }
                        | Error::Auth { .. }
                ) {
                    Counters::bump(&shared.stats.errors);
                    self.metrics.errors();
                }
            }
        }
        result
    }

    /// Renews `permit` for a full lease (a manual refresh), waiting on Redis (the pool
    /// checkout and the calls) at most `wait`. With `acks` and
    /// [`SemaphoreBuilder::wait_replicas`], the renewal counts (moves the permit's
    /// deadline) only once that many replicas acknowledged it (`WAIT` on the same
    /// connection), else it fails with [`Error::ReplicasNotAcked`], the deadline where
    /// it was; a permit found gone is marked lost all the same. (Without `acks`: a
    /// grant's renewal that [`confirm`](Semaphore::confirm) follows, which waits for
    /// the replicas itself, after a renewal of its own.)
    fn renew_within(&self, permit: &PermitState, wait: Duration, acks: bool) -> Result<()> {
        let shared = &self.client.inner.shared;
        let sent = Instant::now();
        if permit.held_out(sent) {
            return Err(Error::InvalidArgument(format!(
                "permit {} of semaphore {:?} has been held for its max_hold: it is not \
                 renewed any more and ends with its lease",
                permit.id, self.name
            )));
        }
        let refreshed = refresher::call_refresh(
            shared,
            &self.name,
            &self.keys,
            self.lease(),
            &[&permit.id],
            wait,
            self.replicas.filter(|_| acks),
        )
        .map_err(|e| self.sorted(e).during("refresh"))?;
        let now = Instant::now();
        let reason = match refreshed.renewal {
            Renewal::Lost(gone) if gone.is_empty() => {
                // (too few replicas have it: a failover may not keep it)
                refreshed
                    .acked
                    .map_err(|e| self.sorted(e).during("refresh"))?;
                permit.renewed(lease_end(sent, self.lease()), sent);
                return Ok(());
            }
            Renewal::Lost(_) => permit.reason_for_missing(now, false),
            Renewal::Reset => permit.reason_for_missing(now, true),
        };
        permit.mark_lost_counted(reason, &shared.stats);
        let reason = permit.lost_reason().unwrap_or(reason);
        Err(Error::PermitLost {
            id: permit.id.clone(),
            reason,
        })
    }

    /// Sends the release, all of it (pool checkout, a wait for a shared call, the call,
    /// one retry) ending by one deadline: for `release` and `Drop`, the operation
    /// timeout from now. A release
    /// that fails on a broken connection is sent once more on a fresh one (the script
    /// is safe to run twice): after a `CLIENT KILL` or a restart every idle pooled
    /// connection may be dead, and the slot would otherwise stay taken for a lease.
    fn give_back(&self, permit: &PermitState, deadline: Instant) -> Result<()> {
        let shared = &self.client.inner.shared;
        shared.registry.lock().deregister(&self.group, &permit.id);
        let first = self
            .combiner
            .run(
                Op::Release {
                    id: permit.id.clone(),
                },
                &|ops| self.exec_until(ops, deadline),
                deadline,
            )
            .map_err(Error::from);
        let (status, retried) = match first {
            Ok(HotReply::Released(status)) => (status, false),
            Ok(HotReply::Acquired(_)) => {
                return Err(Error::reply("release", "an acquire's reply"));
            }
            Err(Error::Redis(e)) if broken(&e) && Instant::now() < deadline => {
                log::debug!("redis-semaphore: release of {} again: {e}", permit.id);
                match self.release_fresh(&permit.id, deadline) {
                    Ok(status) => (status, true),
                    Err(Error::Redis(e2)) => return Err(self.error(e2)),
                    Err(other) => return Err(other),
                }
            }
            Err(Error::Redis(e)) => return Err(self.error(e)),
            Err(other) => return Err(other),
        };
        match status {
            Released::Live => Ok(()),
            Released::Late => Err(Error::LeaseExpired {
                id: permit.id.clone(),
            }),
            // an earlier run of this release may have freed the permit, and then "not
            // held" is its own doing, not a loss: the first try, before its connection
            // broke, or on a cluster, whose client resends a late command by itself,
            // the first send (while the lease surely runs, nothing else but an
            // operator's force_release can have taken it)
            Released::NotHeld
                if permit.lost_reason().is_none()
                    && (retried
                        || shared.is_cluster() && Instant::now() < permit.valid_until()) =>
            {
                Ok(())
            }
            Released::NotHeld => {
                let reason = permit.gone_reason();
                Err(Error::PermitLost {
                    id: permit.id.clone(),
                    reason,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_sends_its_releases_first() {
        let acquire = |id: &str| Op::Acquire {
            id: id.to_owned(),
            n: 1,
            limit: 3,
            lease_ms: 1000,
            origin: Arc::from("1|h|"),
            fair: true,
            give_up: Instant::now(),
        };
        let release = |id: &str| Op::Release { id: id.to_owned() };
        let (a1, a2, r1, r2) = (acquire("a1"), acquire("a2"), release("r1"), release("r2"));
        assert_eq!(releases_first(&[&r1, &a1, &a2]), None);
        assert_eq!(releases_first(&[&a1, &a2]), None);
        assert_eq!(releases_first(&[&r1, &r2]), None);
        assert_eq!(
            releases_first(&[&a1, &r1, &a2, &r2]),
            Some(vec![1, 3, 0, 2])
        );
        assert_eq!(releases_first(&[&a1, &a2, &r1]), Some(vec![2, 0, 1]));
    }

    #[test]
    fn holder_records_parse() {
        let h = parse_holder(
            "id".into(),
            "2|1763800000000001|0,3|1763800000000|42|box|",
            1500,
            1000,
        )
        .unwrap();
        assert_eq!(h.permits, 2);
        assert_eq!(h.slots, vec![0, 3]);
        assert_eq!(h.pid, 42);
        assert_eq!(h.host, "box");
        assert_eq!(h.lease_left, Duration::from_millis(500));
        assert!(parse_holder("id".into(), "garbage", 0, 0).is_err());
    }
}
