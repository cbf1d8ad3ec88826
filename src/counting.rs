//! The ownerless counting semaphore: Dijkstra's P/V on one integer in Redis, with the
//! surface of Redisson's `RSemaphore` and `java.util.concurrent.Semaphore`.
//!
//! How it works: the count is one string key, `redsem:{name}:count`, changed only by
//! the `counting_*.lua` scripts (one per operation, one round trip each). A blocked
//! acquire puts itself in a small waiter registry under the same hash tag (arrival
//! order, heartbeat deadline, request size and its client's wake-up channel); every
//! script that raises the count publishes "L id" (look again) to the queued waiters
//! whose requests fit in the new count, and the client's listener thread turns that
//! into [`Wake::LookAgain`] for the waiting thread, which runs its acquire script
//! again. Permits are never handed over through the registry, so a lost message or a
//! lost registry costs a waiter at most its re-check interval, never a permit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, select};

use crate::client::Client;
use crate::clock::{deadline_in, wait_end};
use crate::error::{Error, Result};
use crate::listener::{Hub, Wake};
use crate::metrics::{Kind, SemMetrics};
use crate::scripts::counting::{self as calls, Look};
use crate::scripts::{CountingKeys, Once};
use crate::stats::Counters;

/// How often a queued waiter looks again without being told to: the safety net for a
/// lost wake-up message (and for a waiter that a barging `try_acquire` beat to the
/// permits it was told about). Each look also renews the waiter's heartbeat.
const RECHECK: Duration = Duration::from_millis(200);
/// How often a waiter looks while the client's listener is not subscribed (no push).
const NO_PUSH_POLL: Duration = Duration::from_millis(50);
/// A queued waiter that has not looked for this long is dropped from the queue by the
/// next script that wakes waiters (its process died). Ten re-checks: a waiter stalled
/// that long is not harmed either, its next look queues it again.
const HEARTBEAT: Duration = Duration::from_secs(2);
/// How long the waiter keys outlive the last heartbeat deadline.
const KEY_PAD: Duration = Duration::from_secs(1);
/// The count stays within `-MAX_COUNT..=MAX_COUNT` (the scripts refuse to leave it).
const MAX_COUNT: u64 = u32::MAX as u64;

/// An ownerless distributed counting semaphore: a number of permits in Redis that any
/// process may take ([`acquire`](CountingSemaphore::acquire), Dijkstra's *P*) and any
/// process may give ([`release`](CountingSemaphore::release), *V*), with the API of
/// Redisson's `RSemaphore` and `java.util.concurrent.Semaphore`.
///
/// Made by [`Client::counting_semaphore`]. Cheap to clone, `Send + Sync`. There is
/// no guard type on purpose: P and V are usually done by different processes, and a
/// guard would suggest an ownership that nothing in Redis backs. Use it for
/// signalling between processes (a producer releases one permit per item, a consumer
/// acquires one before taking an item) or to interoperate with `RSemaphore`-style
/// counting. To bound how many processes use a resource at once, use the leased
/// [`Semaphore`](crate::Semaphore) instead.
///
/// # Danger: nothing comes back by itself
///
/// **Permits have no owner and no lease.** A process that acquires permits and then
/// crashes (or forgets to release) has taken them for good: no timeout, no heartbeat
/// and no background thread will ever give them back, and the semaphore stays that
/// many permits short until someone calls [`release`](CountingSemaphore::release) or
/// [`add_permits`](CountingSemaphore::add_permits). Likewise a `release` that is
/// called twice gives twice: nothing can check who gave what.
///
/// **The count key has no TTL, by design.** `redsem:{name}:count` *is* the
/// semaphore's state; expiring it would silently reset the semaphore. It stays in
/// Redis until deleted by hand. (The waiter registry keys, which only serve wake-ups,
/// do expire.) An evicting `maxmemory-policy` that removes it resets the semaphore to
/// unset, that is to 0 permits.
///
/// **Each call that changes the count applies at most once, however often it is
/// sent.** It carries an operation key (`redsem:{name}:op:<uuid>`, written by the
/// script that changes the count and kept for twice the operation timeout and eleven
/// seconds more: about 160 bytes of Redis memory per call for 15 s with the default
/// timeout), and a run that finds it answers the first run's reply and changes
/// nothing. So a call whose connection broke (the server closed it while it sat idle
/// in the pool: its `timeout` setting, `CLIENT KILL`, a restart; or a reset while the
/// reply was awaited, perhaps after the script ran) is sent again on another
/// connection, within the operation timeout, and its answer is certain; on Redis
/// Cluster the cluster client resends a late command the same way.
///
/// **An acquire that fails with a timeout is in doubt.** The script may have run and
/// taken the permits although the reply did not come in time ([`Error::is_timeout`]),
/// and so may one whose connection broke again when sent again (an I/O error such as
/// "unexpected end of file" or a reset, which `is_timeout` does not report; both are
/// [`Error::is_retryable`]). Without an owner the library cannot tell, and it does not
/// give them back. So is a release, an `add_permits` or a `drain_permits` that fails
/// so: repeating it as a new call may give (or take) twice. A call in doubt took
/// effect once or not at all.
///
/// # The count
///
/// The semaphore starts *unset* (no key), which reads as 0 permits:
/// [`try_set_permits`](CountingSemaphore::try_set_permits) initialises it once, as
/// Redisson's `trySetPermits` does; `release` and `add_permits` on an unset semaphore
/// create it. The count may go negative only through
/// [`reduce_permits`](CountingSemaphore::reduce_permits) or a negative
/// [`add_permits`](CountingSemaphore::add_permits): a debt that releases pay back
/// first. Acquires never take it below 0 and never succeed while it is 0 or less;
/// [`available_permits`](CountingSemaphore::available_permits) reports a debt as 0,
/// [`balance`](CountingSemaphore::balance) shows it. The count stays within
/// ±(2<sup>32</sup> − 1); a change beyond is refused with
/// [`Error::CountOutOfRange`].
///
/// # Waiting
///
/// Blocked acquires do not poll: they queue under the semaphore's hash tag, and each
/// release (or `add_permits`, or `try_set_permits`) tells the queued waiters whose
/// requests fit in the new count, in arrival order, to look again, through the
/// client's wake-up channel. A waiter also looks again every 200 ms, which covers a
/// lost message and renews its heartbeat; a waiter whose process died leaves the queue
/// within about 2 s. Each queued waiter thus costs one short script call per 200 ms
/// while it waits. The semaphore is **not fair**, like `RSemaphore` and the default
/// `java.util.concurrent.Semaphore`: a `try_acquire` may take permits that a queued
/// waiter was told about, and a small request may pass a large one that does not fit
/// yet.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use redis_semaphore::Client;
///
/// let client = Client::open("redis://127.0.0.1:6379/")?;
/// let items = client.counting_semaphore("orders:ready")?;
/// items.try_set_permits(0)?; // once, by whoever comes first
///
/// // producer, any process: one permit per item made
/// items.release(1)?;
///
/// // consumer, any process: one permit per item taken
/// if items.acquire_timeout(1, Duration::from_secs(5))? {
///     // an item is there for us
/// }
/// # Ok::<(), redis_semaphore::Error>(())
/// ```
#[derive(Clone)]
pub struct CountingSemaphore {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    name: String,
    keys: CountingKeys,
    /// Per-semaphore metrics (`metrics` feature; empty without it).
    metrics: SemMetrics,
}

/// A queued acquire's registration with the client's listener. Dropped while still
/// armed (an error on the way), it also leaves the queue in Redis, best effort.
struct Waiter<'a> {
    sem: &'a CountingSemaphore,
    hub: Arc<Hub>,
    id: String,
    wake: Receiver<Wake>,
    armed: bool,
    /// The wait's bound (its deadline and one operation timeout), which the drop's
    /// cancel keeps too; `None` for a wait without a deadline.
    end: Option<Instant>,
}

impl Waiter<'_> {
    /// Stops listening. The queue entry is gone already when the acquire succeeded (the
    /// script removed it) or the caller ran the cancel script.
    fn finish(&mut self) {
        if self.armed {
            self.armed = false;
            self.hub.deregister(&self.id);
        }
    }
}

impl Drop for Waiter<'_> {
    /// Leaves the queue, the cancel ending within one operation timeout and by the
    /// wait's bound: a wait that ends on an error (a look in flight at the deadline
    /// that failed, say) keeps its bound. With no time left, the queue entry lapses
    /// with its heartbeat (about 2 s), as after an outage.
    fn drop(&mut self) {
        if self.armed {
            self.finish();
            let soon = deadline_in(self.sem.shared().op_timeout);
            let end = self.end.map_or(soon, |end| end.min(soon));
            if end <= Instant::now() {
                log::debug!(
                    "redis-semaphore: no time left to leave the queue of counting semaphore \
                     {}; the entry lapses with its heartbeat",
                    self.sem.name()
                );
                return;
            }
            if let Err(e) = self.sem.cancel(&self.id, Some(end)) {
                log::warn!(
                    "redis-semaphore: could not leave the queue of counting semaphore {}: {e}",
                    self.sem.name()
                );
            }
        }
    }
}

impl Client {
    /// The ownerless counting semaphore `name` (Redisson's `RSemaphore`, Dijkstra's
    /// P/V): see [`CountingSemaphore`], and its warning that a crashed holder's
    /// permits never come back. No network call is made.
    ///
    /// Its keys (`redsem:{name}:count` and the waiter keys) are distinct from those of
    /// a leased [`Semaphore`](crate::Semaphore) of the same name.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name or a name with `{` or `}` (the
    /// library puts the name in a hash tag).
    pub fn counting_semaphore(&self, name: &str) -> Result<CountingSemaphore> {
        Error::check_name(name, true)?;
        let keys = CountingKeys::new(name);
        let clock = self.inner.node_clock(&keys.count);
        Ok(CountingSemaphore {
            inner: Arc::new(Inner {
                client: self.clone(),
                name: name.to_owned(),
                keys: keys.with_clock(clock),
                metrics: SemMetrics::new(Kind::Counting, name),
            }),
        })
    }
}

impl CountingSemaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Sets the count to `permits` if the semaphore is unset, and returns `true`;
    /// returns `false` and changes nothing if it is already set (by an earlier
    /// `try_set_permits`, a `release` or an `add_permits`), whatever its count. Like
    /// Redisson's `trySetPermits`: many processes may call it at start-up, one wins.
    /// 0 is allowed (a signalling semaphore starts empty). Waiters that queued on the
    /// unset semaphore are woken.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] when the key holds something else; Redis and pool errors.
    pub fn try_set_permits(&self, permits: u32) -> Result<bool> {
        self.run_once("try_set_permits", None, |c, k, once| {
            calls::try_set(c, k, permits, once)
        })
    }

    /// Changes the count by `delta`, up or down, without waiting (Redisson's
    /// `addPermits`). A negative delta may take the count below 0, a debt that releases
    /// pay back before any acquire succeeds again. A positive delta wakes the waiters
    /// that now fit. Creates an unset semaphore.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for 0 or `|delta| > 2^32 - 1` (before any network
    /// call); [`Error::CountOutOfRange`] when the count would leave
    /// ±(2<sup>32</sup> − 1); [`Error::WrongType`]; Redis and pool errors.
    pub fn add_permits(&self, delta: i64) -> Result<()> {
        if delta == 0 {
            return Err(Error::InvalidArgument("delta must not be 0".into()));
        }
        if delta.unsigned_abs() > MAX_COUNT {
            return Err(Error::InvalidArgument(
                "delta must be within -(2^32 - 1)..=2^32 - 1".into(),
            ));
        }
        self.run_once("add_permits", None, |c, k, once| {
            calls::add(c, k, delta, once)
        })?;
        Ok(())
    }

    /// Lowers the count by `permits` without waiting, even below 0
    /// (`java.util.concurrent.Semaphore.reducePermits`); the same as
    /// `add_permits(-permits)`. Use it to shrink a pool of permits while some are
    /// taken: the debt is paid back by the next releases.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for 0; as [`add_permits`](Self::add_permits).
    pub fn reduce_permits(&self, permits: u32) -> Result<()> {
        Error::check_permits(permits)?;
        self.add_permits(-i64::from(permits))
    }

    /// Takes `permits` if the count has them now, in one round trip; never waits.
    /// `false` when it has fewer (or is unset, or in debt). The whole call, the wait
    /// for a pooled connection when all are busy included, ends within the operation
    /// timeout.
    ///
    /// Does not queue, and may take permits that a queued waiter was told about (the
    /// semaphore is not fair).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for 0; [`Error::WrongType`]; Redis and pool errors.
    /// A timeout or a dropped connection leaves the acquire in doubt (see the type's
    /// docs).
    pub fn try_acquire(&self, permits: u32) -> Result<bool> {
        Error::check_permits(permits)?;
        // never waits: the wait for a connection and the call share one operation
        // timeout, as the leased semaphore's try (not the checkout timeout and then one)
        let end = deadline_in(self.shared().op_timeout);
        let granted = self.look(permits, None, Some(end))?;
        if granted {
            self.granted();
        } else {
            Counters::bump(&self.shared().stats.try_failed);
            self.inner.metrics.try_failed();
        }
        Ok(granted)
    }

    /// Takes `permits`, waiting as long as it takes (*P*).
    ///
    /// # Blocking
    ///
    /// Until a release (or `add_permits`, `try_set_permits`) leaves enough permits and
    /// this waiter gets them first; it is told so through the client's wake-up
    /// listener, and looks again every 200 ms in any case. Returns early only on an
    /// error. It waits for ever on a semaphore nobody releases: that is what P means.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    pub fn acquire(&self, permits: u32) -> Result<()> {
        let granted = self.wait_for(permits, None)?;
        debug_assert!(granted, "a wait without deadline ends granted or in error");
        Ok(())
    }

    /// Takes `permits`, waiting at most `timeout`; `false` when the time is up, and
    /// then nothing is left of the wait in Redis (no queue entry).
    ///
    /// # Blocking
    ///
    /// As [`acquire`](Self::acquire), bounded by `timeout` plus at most one round trip
    /// (one operation timeout): the look in flight at the deadline, or the one that
    /// leaves the queue. A look that fails because the server does not answer ends the
    /// wait with its error at once; its queue entry then lapses with its heartbeat
    /// (about 2 s). A look that fails with another error leaves the queue within the
    /// same bound (or, with no time left, lets its entry lapse the same way).
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    pub fn acquire_timeout(&self, permits: u32, timeout: Duration) -> Result<bool> {
        self.wait_for(permits, Some(crate::clock::deadline_in(timeout)))
    }

    /// Gives `permits` back (*V*), from any process, whether or not it acquired them;
    /// the queued waiters whose requests now fit are woken at once. Creates an unset
    /// semaphore with that count.
    ///
    /// Never checked against anything: releasing more than was acquired raises the
    /// count for good.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for 0; [`Error::CountOutOfRange`] past
    /// 2<sup>32</sup> − 1; [`Error::WrongType`]; Redis and pool errors.
    ///
    /// A connection that failed (closed while idle, reset) is not an error by itself:
    /// the release is sent again on another connection and applies once (see the
    /// type's docs). A timeout ([`Error::is_timeout`]), or a connection that failed
    /// again when it was sent again (an I/O error, which `is_timeout` does not
    /// report), leaves the release in doubt, as an acquire's: the script may have run
    /// and raised the count although the reply was lost. Do not call it again on such
    /// an error (although [`Error::is_retryable`] says a later call may succeed): a
    /// release repeated after one that took effect gives twice, and lets more acquires
    /// through than there are permits.
    pub fn release(&self, permits: u32) -> Result<()> {
        Error::check_permits(permits)?;
        self.run_once("release", None, |c, k, once| {
            calls::release(c, k, permits, once)
        })?;
        Counters::bump(&self.shared().stats.released);
        self.inner.metrics.released();
        Ok(())
    }

    /// Permits free now: the count, or 0 when it is unset or negative (in debt).
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`]; Redis and pool errors.
    pub fn available_permits(&self) -> Result<u32> {
        self.available()
    }

    /// The same as [`available_permits`](Self::available_permits), under the name
    /// [`Semaphore::available`](crate::Semaphore::available) has: the permits that can
    /// be taken now (0 when the count is negative).
    ///
    /// # Errors
    ///
    /// Redis and pool errors.
    pub fn available(&self) -> Result<u32> {
        let (_, count, _) = self.inspect("available")?;
        Ok(u32::try_from(count.max(0)).unwrap_or(u32::MAX))
    }

    /// The raw count: negative while the semaphore is in debt after
    /// [`reduce_permits`](Self::reduce_permits); `None` when it is unset.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`]; Redis and pool errors.
    pub fn balance(&self) -> Result<Option<i64>> {
        let (set, count, _) = self.inspect("balance")?;
        Ok(set.then_some(count))
    }

    /// Takes every free permit at once and returns how many
    /// (`java.util.concurrent.Semaphore.drainPermits`): the count becomes 0. A
    /// negative count (a debt) is cleared to 0 too, and 0 is returned. An unset
    /// semaphore stays unset.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`]; Redis and pool errors.
    pub fn drain_permits(&self) -> Result<u32> {
        self.run_once("drain_permits", None, calls::drain)
    }

    /// How many acquires are queued, waiting, across all clients (those whose
    /// heartbeat is live).
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`]; Redis and pool errors.
    pub fn queue_len(&self) -> Result<u32> {
        let (_, _, queued) = self.inspect("queue_len")?;
        Ok(queued)
    }

    /// Whether any acquire is queued, waiting
    /// (`java.util.concurrent.Semaphore.hasQueuedThreads`).
    ///
    /// # Errors
    ///
    /// As [`queue_len`](Self::queue_len).
    pub fn has_queued_waiters(&self) -> Result<bool> {
        Ok(self.queue_len()? > 0)
    }

    fn shared(&self) -> &crate::shared::Shared {
        &self.inner.client.inner.shared
    }

    /// Sorts a Redis error: the scripts' RANGE refusal, WRONGTYPE, or anything else.
    fn error(&self, e: redis::RedisError) -> Error {
        let text = e.to_string();
        // a WRONGTYPE message quotes the stored count, which may read "RANGE ..."
        let wrong_type = e.code() == Some("WRONGTYPE") || text.contains("WRONGTYPE");
        if !wrong_type && (e.code() == Some("RANGE") || text.contains("RANGE ")) {
            // Redis 7 appends " script: <sha>, on @user_script:<line>." to the message;
            // Redis 6.2 puts its own words before it
            let detail = match e.code() {
                Some("RANGE") => e.detail().unwrap_or("").to_owned(),
                _ => text.split("RANGE ").nth(1).unwrap_or("").to_owned(),
            };
            let detail = detail.split(" script: ").next().unwrap_or(&detail);
            Error::CountOutOfRange {
                name: self.inner.name.clone(),
                detail: detail.trim().to_owned(),
            }
        } else if wrong_type {
            // only the count key can be of another type (the scripts replace a waiter
            // key of another type; counting_common.lua): named, as the leased
            // semaphore's scripts name theirs
            let key = &self.inner.keys.count;
            let said = crate::error::wrong_type_detail(&e);
            let detail = if said.contains("the count of a counting semaphore") {
                format!("key {key}: {said}")
            } else {
                format!(
                    "key {key} holds another type than the count's string (another program \
                     writes under its name): {said}"
                )
            };
            Error::WrongType {
                name: self.inner.name.clone(),
                source: redis::RedisError::from((redis::ErrorKind::Extension, "WRONGTYPE", detail)),
            }
        } else {
            Error::redis(
                &self.inner.name,
                e,
                self.inner.client.inner.shared.op_timeout,
            )
        }
    }

    /// Runs one script call (`scripts::counting`) of operation `op` on a pooled
    /// connection, its Redis error sorted (a timeout names `op`).
    fn run<T>(
        &self,
        op: &'static str,
        call: impl Fn(&mut dyn redis::ConnectionLike, &CountingKeys) -> Result<T>,
    ) -> Result<T> {
        self.run_by(op, None, call)
    }

    /// [`run`](Self::run), all of it (the wait for a connection and the call) ending
    /// by `end` when one is given: the calls of a wait with a deadline end by the
    /// deadline and one operation timeout, also when every pooled connection is busy.
    ///
    /// Every call of the counting semaphore is safe to send twice (a read; a waiter's
    /// cancel by its id; a call that may change the count carries an operation key,
    /// [`run_once`](Self::run_once)), so one whose connection was broken (closed by the
    /// server while it sat idle in the pool: its `timeout` setting, `CLIENT KILL`, a
    /// restart; or reset on the way) is sent again on a fresh connection, by `end` or
    /// one operation timeout after the checkout
    /// ([`Shared::run_resending`](crate::shared::Shared::run_resending)). A timeout is
    /// not sent again: its request may still be on its way, and its time is spent.
    fn run_by<T>(
        &self,
        op: &'static str,
        end: Option<Instant>,
        call: impl Fn(&mut dyn redis::ConnectionLike, &CountingKeys) -> Result<T>,
    ) -> Result<T> {
        let keys = &self.inner.keys;
        let result = self.shared().run_resending(end, |c| call(&mut **c, keys));
        result.map_err(|e| self.failed(op, e))
    }

    /// Counts a failed call and sorts its Redis error (a timeout names `op`).
    fn failed(&self, op: &'static str, e: Error) -> Error {
        Counters::bump(&self.shared().stats.errors);
        self.inner.metrics.errors();
        match e {
            Error::Redis(e) => self.error(e).during(op),
            other => other,
        }
    }

    /// [`run_by`](Self::run_by) for a call that may change the count, with an
    /// operation key (`once.lua`, C7 of `counting_common.lua`) on every deployment, so
    /// that the call applies at most once however often it is sent: on Redis Cluster,
    /// whose client resends a command whose reply did not come in time; and when its
    /// connection broke, sent again by `run_by`. The last send's answer is the call's:
    /// an earlier send either never ran, or ran and recorded its reply under the key,
    /// which a later one then returns without changing anything. Without the key a
    /// release on a connection the server had closed while idle failed, in doubt, and
    /// its permits were lost for good (a counting release is not safe to repeat).
    fn run_once<T>(
        &self,
        op: &'static str,
        end: Option<Instant>,
        call: impl Fn(&mut dyn redis::ConnectionLike, &CountingKeys, Option<&Once>) -> Result<T>,
    ) -> Result<T> {
        let once = self.inner.keys.once(true, self.shared().op_timeout);
        self.run_by(op, end, |c, k| once.run(c, |c, o| call(c, k, o)))
    }

    /// {set, count, queued} in one round trip.
    fn inspect(&self, op: &'static str) -> Result<(bool, i64, u32)> {
        let i = self.run(op, calls::inspect)?;
        Ok((i.set, i.count, i.queued))
    }

    /// One run of the acquire script: a plain try when `waiter` is `None`, else a look
    /// by a queued waiter (channel, id), which queues it or renews its heartbeat when
    /// the permits are not there; ending by `end` when one is given (see `run_by`).
    fn look(
        &self,
        permits: u32,
        waiter: Option<(&str, &str)>,
        end: Option<Instant>,
    ) -> Result<bool> {
        let look = match waiter {
            Some((id, channel)) => Look::Waiter { id, channel },
            None => Look::Try,
        };
        self.run_once("acquire", end, |c, k, once| {
            calls::acquire(
                c,
                k,
                permits,
                look,
                HEARTBEAT.as_millis() as u64,
                KEY_PAD.as_millis() as u64,
                once,
            )
        })
    }

    /// Counts a successful acquire (one per call, whatever its number of permits, as
    /// a leased `Permit` guard is one) in `Stats::acquired` and the metrics.
    fn granted(&self) {
        Counters::bump(&self.shared().stats.acquired);
        self.inner.metrics.acquired();
    }

    /// Runs the cancel script: waiter `id` leaves the queue, passing on any wake-up;
    /// ending by `end` when one is given (see `run_by`).
    fn cancel(&self, id: &str, end: Option<Instant>) -> Result<()> {
        self.run_by("cancel", end, |c, k| calls::cancel(c, k, id))
    }

    /// Blocking acquire: one plain try; then the waiter registers with the client's
    /// listener (subscribed first, so no message published after its first queued look
    /// is missed), and looks again each time it is told to, on its re-check timer, and
    /// never after its deadline; on timeout it leaves the queue.
    fn wait_for(&self, permits: u32, deadline: Option<Instant>) -> Result<bool> {
        Error::check_permits(permits)?;
        let metrics = &self.inner.metrics;
        // every call of the wait ends by its deadline and one operation timeout (the
        // look in flight at the deadline, or the cancel after it), the waits for a
        // connection included
        let end = wait_end(deadline, self.shared().op_timeout);
        if self.look(permits, None, end)? {
            self.granted();
            return Ok(true);
        }
        // the first look found nothing free: a failed try, as the leased semaphore
        // counts it (`Stats::try_failed`)
        Counters::bump(&self.shared().stats.try_failed);
        metrics.try_failed();
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(false);
        }
        let client = &self.inner.client.inner;
        let hub = client.hub()?;
        let ready_by = Instant::now() + client.shared.op_timeout;
        hub.wait_ready(deadline.map_or(ready_by, |d| d.min(ready_by)));
        let id = uuid::Uuid::new_v4().hyphenated().to_string();
        let wake = hub.register(&id);
        let mut waiter = Waiter {
            sem: self,
            hub,
            id,
            wake,
            armed: true,
            end,
        };
        let stats = &client.shared.stats;
        Counters::bump(&stats.waits);
        metrics.waits();
        let started = Instant::now();
        let result = self.wait_queued(permits, deadline, end, &mut waiter);
        match result {
            Ok(true) => {
                let waited = started.elapsed();
                stats.waited(waited);
                metrics.waited(waited);
                self.granted();
            }
            Ok(false) => {
                Counters::bump(&stats.wait_gave_up);
                metrics.wait_gave_up();
            }
            Err(_) => {}
        }
        result
    }

    fn wait_queued(
        &self,
        permits: u32,
        deadline: Option<Instant>,
        end: Option<Instant>,
        waiter: &mut Waiter<'_>,
    ) -> Result<bool> {
        loop {
            match self.look(permits, Some((&waiter.id, &waiter.hub.channel)), end) {
                Ok(true) => {
                    waiter.finish();
                    return Ok(true);
                }
                Ok(false) => {}
                // The server is not answering: leave without the cancel round trip,
                // which would wait out a second operation timeout (the wait is
                // bounded by its timeout and one round trip). The queue entry lapses
                // with its heartbeat.
                Err(e) if crate::semaphore::is_outage(&e) => {
                    waiter.finish();
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
            let every = if waiter.hub.is_ready() {
                RECHECK
            } else {
                NO_PUSH_POLL
            };
            let look_at = Instant::now() + every;
            let until = deadline.map_or(look_at, |d| d.min(look_at));
            select! {
                recv(waiter.wake) -> _ => {
                    // several wake-ups may be queued: one look answers them all
                    while waiter.wake.try_recv().is_ok() {}
                }
                recv(crossbeam_channel::at(until)) -> _ => {}
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                // Leave the queue first, then stop listening: the cancel script
                // passes on a wake-up that may have been meant for us.
                let left = self.cancel(&waiter.id, end);
                waiter.finish();
                left?;
                return Ok(false);
            }
        }
    }
}

impl std::fmt::Debug for CountingSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingSemaphore")
            .field("name", &self.inner.name)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_clone_send_sync<T: Clone + Send + Sync + 'static>() {}

    #[test]
    fn counting_semaphore_is_clone_send_sync() {
        assert_clone_send_sync::<CountingSemaphore>();
    }

    #[test]
    fn bad_arguments_fail_before_any_network_call() {
        // nothing listens on port 1: any network call would fail with another error
        let client = Client::open("redis://127.0.0.1:1/").unwrap();
        for name in ["", "a{b", "a}b"] {
            assert!(matches!(
                client.counting_semaphore(name),
                Err(Error::InvalidArgument(_))
            ));
        }
        let sem = client.counting_semaphore("s").unwrap();
        let invalid = |r: Result<()>| assert!(matches!(r, Err(Error::InvalidArgument(_))));
        invalid(sem.try_acquire(0).map(drop));
        invalid(sem.acquire(0));
        invalid(sem.acquire_timeout(0, Duration::from_millis(1)).map(drop));
        invalid(sem.release(0));
        invalid(sem.reduce_permits(0));
        invalid(sem.add_permits(0));
        invalid(sem.add_permits(i64::from(u32::MAX) + 1));
        invalid(sem.add_permits(i64::MIN));
    }

    #[test]
    fn the_heartbeat_outlasts_many_rechecks() {
        assert!(HEARTBEAT >= RECHECK * 5);
        assert!(NO_PUSH_POLL < RECHECK);
    }
}
