//! The counting semaphores of "Redis in Action" (ch. 6.3, listings 12–17), exactly as
//! published, on the book's keys, so a Rust service can share a semaphore with Python
//! code from the book or with its Java and Node ports — including the Node port's fair
//! semaphore, which has keys of its own ([`BookVariant::NodeFair`]).
//!
//! # Variants
//!
//! | [`BookVariant`] | listings | keys | what it keeps of the book's failure modes |
//! |---|---|---|---|
//! | [`Basic`](BookVariant::Basic) | 12–13 | `NAME` | a client whose clock runs behind steals a granted permit (its entry ranks first); two acquires in flight can both win; no refresh |
//! | [`Fair`](BookVariant::Fair) | 14–16 | `NAME`, `NAME:owner`, `NAME:counter` | the race: two acquires interleaving their two round trips can both win, so under load it still goes over the limit; a clock ahead by Δ ends other holders' leases Δ early |
//! | [`FairWithLock`](BookVariant::FairWithLock) | 17 (+14–16) | as `Fair`, plus `lock:NAME` | holds the limit while clocks agree to well within the lease and every acquire finishes within the lock timeout; a clock ahead by Δ still ends other leases Δ early |
//! | [`NodeFair`](BookVariant::NodeFair) | 14 (+15–16), the Node port's (seed 004) | `NAME:time`, `NAME:count`, the global `semaphore:count` | as `Fair`: the race over the limit under load, a clock ahead by Δ ends other leases Δ early |
//!
//! A client whose clock runs *ahead* by more than a holder's remaining lease purges
//! that holder in every variant (the book asks for clocks within a second or two).
//! With [`TimeUnit::Millis`], `Basic` has one more: entries of the same millisecond
//! rank by id, so an acquire in the millisecond of the last grant can rank before it
//! and steal it.
//!
//! # The Node.js port (seed 004)
//!
//! - Its **basic** semaphore is the book's basic one with millisecond scores: the zset
//!   `NAME`, uuid v4 ids, `Date.getTime()` scores. Use [`BookVariant::Basic`] with
//!   [`TimeUnit::Millis`]; no variant of its own is needed.
//! - Its **fair** semaphore is [`BookVariant::NodeFair`]: listing 14's commands in the
//!   same order and the same two batches, on `NAME:time` (id → ms), `NAME:count` (id →
//!   ticket) and tickets from `INCR semaphore:count`, **one counter for every semaphore
//!   of every Node client** (Rust must take its tickets there too, or its entries would
//!   rank ahead of, or behind, every Node entry). [`Permit::token`] is that ticket.
//!   Scores are whole milliseconds (the only unit it accepts).
//! - The port sends each batch as a plain pipeline and its clean-up unawaited; Rust
//!   sends each as a `MULTI`/`EXEC` transaction and awaits the clean-up, which only
//!   narrows the interleavings (a Node client sees nothing another Node client could not
//!   make). The race between the two round trips stays: Node and Rust acquires
//!   interleaving them can both win, so the two together go over the limit under load.
//! - Give every client the Node callers' `limit` and `timeout` (the port defaults to 5
//!   and 10 000 ms): each acquirer purges with its own timeout and ranks against its
//!   own limit.
//! - What it keeps of the crate's guarantees: the [`Permit`] guard (released on drop,
//!   from both zsets), [`Permit::refresh`] (`ZADD NAME:time XX GT`, listing 16's step on
//!   the port's keys; Node holders never refresh, so theirs end after `timeout`), polling
//!   waits with deadlines, clear errors. What it gives up: the limit under load (the
//!   race), server time (scores are client clocks: keep them NTP-synced; a clock ahead
//!   by Δ ends others' leases Δ early), background keepalive (nothing renews a permit
//!   unless you call refresh), fencing (tickets increase, but the race can give two
//!   holders over the limit), wake-ups, and Redis Cluster.
//!
//! Measured here (tests/book_compat.rs, limit 3, three Rust threads and two Python
//! processes holding for 1 ms in a loop on loopback): `Basic` and `Fair` reached 4 and
//! 5 holders at once within a second; `FairWithLock` never more than 3.
//!
//! # What differs from the crate's own semaphore
//!
//! - **Client clock.** Scores are the client's wall-clock time, as in the originals;
//!   the crate's rule that only Redis `TIME` counts does not hold here.
//! - **Several round trips.** Each acquire is one or two `MULTI`/`EXEC` transactions
//!   plus a clean-up on failure (and the lock's round trips for `FairWithLock`), not
//!   one script.
//! - **No wake-ups, no background refresh.** [`acquire_timeout`](BookSemaphore::acquire_timeout)
//!   polls (a try, then a short sleep), as the book's users do. Permits are never
//!   renewed behind your back: call [`Permit::refresh`] (fair variants only, listing
//!   16) before the timeout runs out.
//! - **Refresh never re-adds.** Listing 16's `ZADD` puts a purged id back and takes
//!   it out again on seeing that it added it; here the refresh is one transaction of
//!   `ZADD XX GT` on the time zset (an id that is gone stays gone, a score never
//!   moves back) and a look at both zsets, so a refresh whose reply was lost cannot
//!   leave the id behind for the next refresh to find and report renewed. The permit
//!   is lost when its id is missing from either zset. A user needs `+zscore` for it
//!   (the book's ACL rule, [deployment](crate::guide::deployment)).
//! - **No fencing slots.** [`Permit::slots`] is empty; [`Permit::token`] is the value
//!   of `NAME:counter` (`semaphore:count` for `NodeFair`) taken by the fair variants
//!   (increasing in grant order, but the race above can give two holders over the
//!   limit), and 0 for `Basic`.
//! - **No cluster.** [`BookSemaphoreBuilder::build`] refuses a Redis Cluster client
//!   for every variant: the transactions span keys in several hash slots (the Node
//!   port's global `semaphore:count` hashes to a slot of its own, whatever the name).
//!
//! Every client of one semaphore must use the same variant and the same [`TimeUnit`]:
//! a seconds client and a milliseconds client purge each other's entries at once or
//! never (the Java port's author warns about exactly this). `Fair` and `FairWithLock`
//! share their keys, but the lock only guards the acquires of the clients that take
//! it: one `Fair` client among `FairWithLock` ones brings the race back.
//!
//! # Connections the server closed
//!
//! The pool sends no `PING` when it hands a connection out, so it hands out
//! connections the server closed while they sat idle (Redis's `timeout`, a load
//! balancer's or a cloud's idle cut, `CLIENT KILL`, a restart), on which the first
//! request fails. Every call of a book semaphore is safe to send twice, and one that
//! fails so is made again on another connection (a new one once the pool's idle ones
//! are used up), by the same bound (not after a timeout, whose request may still run;
//! an acquire's entry is then taken out aside): an acquire with the same entry id and
//! the same clock reading (its purges and `ZADD`s write the same entry again, never a
//! second one; a second `INCR` of the ticket counter only skips a ticket, as a failed
//! acquire does; `FairWithLock` takes the lock under a new lock id, the first one
//! given back aside), so a grant whose reply was lost ends as the `Permit` and its
//! lease counts from the score its entry holds; a refresh (`ZADD XX GT` to one
//! score); a release (`ZREM` by id); [`held`](BookSemaphore::held) and
//! [`available`](BookSemaphore::available).
//!
//! # Lost permits
//!
//! A book permit is marked lost (and [`Permit::lost`] fires) when
//! [`Permit::refresh`] finds its entry gone (from the time zset or, its ticket, from
//! the owner zset); nothing watches it in the background.
//! [`Permit::lease_left`] counts down the timeout from the score the acquire (or the
//! last successful refresh) wrote, by this process's monotonic clock: with
//! [`TimeUnit::Millis`] from the clock reading truncated to the millisecond, and by
//! the timeout in whole milliseconds, so that it ends no later than another client on
//! the same clock can purge the entry. [`Permit::release`] returns
//! [`Error::PermitLost`] when the entry was already gone (the book's `False`).
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_semaphore::Client;
//! use redis_semaphore::compat::book::{BookVariant, TimeUnit};
//!
//! let client = Client::open("redis://127.0.0.1:6379/")?;
//! // The same semaphore as Python's `acquire_semaphore_with_lock(conn, "market:acct:42", 5)`.
//! let sem = client
//!     .book_semaphore("market:acct:42", 5)
//!     .variant(BookVariant::FairWithLock)
//!     .unit(TimeUnit::Seconds)
//!     .timeout(Duration::from_secs(10))
//!     .build()?;
//! if let Some(permit) = sem.try_acquire()? {
//!     // ... call the market API ...
//!     permit.refresh()?; // listing 16, for holders that run longer than the timeout
//!     permit.release()?; // listing 15
//! }
//! # Ok::<(), redis_semaphore::Error>(())
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::{ConnectionLike, RedisError, RedisResult, Value};

use crate::client::Client;
use crate::clock::{IoTimeouts, TIMEOUT_SLACK, left_until, wait_end};
use crate::error::LostReason;
use crate::error::{Error, Result};
use crate::permit::{Grantor, Permit};
use crate::pool::Conn;
use crate::registry::PermitState;
use crate::scripts::book::{self, BookKeys, NODE_GLOBAL_COUNTER};
use crate::stats::Counters;
use crate::topology::{is_read_only_error, is_read_only_reply};

/// The longest timeout, lock wait and lock timeout a builder takes.
const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

/// Which of the book's semaphores to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BookVariant {
    /// Listings 12–13: one zset `NAME` of id → time; a holder is an id whose rank is
    /// below the limit. No refresh.
    Basic,
    /// Listings 14–16: `NAME` (id → time), `NAME:owner` (id → counter) and
    /// `NAME:counter`; rank by counter, expiry by time; refreshable.
    Fair,
    /// Listing 17: the fair semaphore, acquired under the short lock `lock:NAME` (the
    /// book's `acquire_lock_with_timeout` / `release_lock`); refreshable.
    FairWithLock,
    /// The Node.js port's fair semaphore (seed 004): listing 14's steps on the port's
    /// keys `NAME:time` (id → time), `NAME:count` (id → ticket) and the one global
    /// ticket counter `semaphore:count` shared by every semaphore, scored in whole
    /// milliseconds ([`TimeUnit::Millis`], the only unit it accepts). Refreshable here
    /// (the port itself has no refresh). The port's *basic* semaphore needs no variant
    /// of its own: it is [`Basic`](BookVariant::Basic) with [`TimeUnit::Millis`].
    NodeFair,
}

/// The unit of the time scores in the zsets. All clients of a semaphore must agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TimeUnit {
    /// Seconds since the Unix epoch as a float (`time.time()`), like the Python
    /// original.
    Seconds,
    /// Whole milliseconds since the Unix epoch (`System.currentTimeMillis()`,
    /// `Date.getTime()`), like the Java and Node ports.
    Millis,
}

/// Settings of a [`BookSemaphore`], from [`Client::book_semaphore`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until build() is called"]
pub struct BookSemaphoreBuilder {
    client: Client,
    name: String,
    limit: u32,
    variant: BookVariant,
    /// `None`: the variant's own (seconds for the book's, milliseconds for the Node
    /// port's fair semaphore).
    unit: Option<TimeUnit>,
    timeout: Duration,
    lock_wait: Duration,
    lock_timeout: Duration,
    poll_interval: Duration,
    clock_offset_ms: i64,
}

impl Client {
    /// A builder for the "Redis in Action" semaphore `name` with `limit` permits,
    /// wire-compatible with the book's code and its ports. See [`compat::book`].
    ///
    /// [`compat::book`]: crate::compat::book
    pub fn book_semaphore(&self, name: &str, limit: u32) -> BookSemaphoreBuilder {
        BookSemaphoreBuilder {
            client: self.clone(),
            name: name.to_owned(),
            limit,
            variant: BookVariant::FairWithLock,
            unit: None,
            timeout: Duration::from_secs(10),
            lock_wait: Duration::from_millis(10),
            lock_timeout: Duration::from_secs(10),
            poll_interval: Duration::from_millis(10),
            clock_offset_ms: 0,
        }
    }
}

impl BookSemaphoreBuilder {
    /// Which algorithm. Defaults to [`BookVariant::FairWithLock`], the one the book
    /// recommends; pick whatever the other services of this semaphore run.
    pub fn variant(mut self, variant: BookVariant) -> Self {
        self.variant = variant;
        self
    }

    /// The unit of the time scores. Defaults to [`TimeUnit::Seconds`] (the Python
    /// original), and to [`TimeUnit::Millis`] for [`BookVariant::NodeFair`], which
    /// accepts no other.
    pub fn unit(mut self, unit: TimeUnit) -> Self {
        self.unit = Some(unit);
        self
    }

    /// How old an entry may be before an acquire purges it: the book's `timeout`
    /// argument (a lease). Defaults to 10 s, the book's default.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// `FairWithLock` only: how long one acquire spins for `lock:NAME` before it gives
    /// up and reports no permit (the book's `acquire_timeout=.01`). Defaults to 10 ms.
    pub fn lock_wait(mut self, wait: Duration) -> Self {
        self.lock_wait = wait;
        self
    }

    /// `FairWithLock` only: the expiry set on `lock:NAME`, so a client that dies
    /// holding it does not block the semaphore for ever (`acquire_lock_with_timeout`'s
    /// `lock_timeout`). Defaults to 10 s, the book's default.
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// How long [`BookSemaphore::acquire_timeout`] and [`BookSemaphore::acquire`]
    /// sleep between tries. Defaults to 10 ms.
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every;
        self
    }

    /// Tests only: shifts this client's clock by `ms` milliseconds (negative: behind),
    /// to show what clock skew does to the book's algorithms.
    #[doc(hidden)]
    pub fn clock_offset_ms(mut self, ms: i64) -> Self {
        self.clock_offset_ms = ms;
        self
    }

    /// Checks the settings and makes the semaphore. No network call is made.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name, a limit of 0, a timeout under
    /// 1 ms (or over a year), or, for `FairWithLock`, a zero lock wait or a lock
    /// timeout under 1 ms (or either over a year); a zero poll interval;
    /// [`BookVariant::NodeFair`] with [`TimeUnit::Seconds`] (the Node port scores in
    /// milliseconds), or a `NodeFair` semaphore named `semaphore` (its count zset
    /// `semaphore:count` would be the Node port's global ticket counter). On Redis Cluster (a `redis+cluster://` client), for every
    /// variant: the book's keys (`NAME`, `NAME:owner`, `NAME:counter`, `lock:NAME`) and
    /// the Node port's (`NAME:time`, `NAME:count` and the global `semaphore:count`) lie
    /// in different hash slots and the transactions span them, which a cluster refuses.
    pub fn build(self) -> Result<BookSemaphore> {
        let invalid = |s: &str| Err(Error::InvalidArgument(s.to_owned()));
        if self.client.inner.shared.is_cluster() {
            return invalid(
                "the book's semaphores (and the Node port's) cannot run on Redis Cluster: \
                 their transactions span keys in several hash slots (use the leased semaphore)",
            );
        }
        let unit = match (self.variant, self.unit) {
            (BookVariant::NodeFair, Some(TimeUnit::Seconds)) => {
                return invalid(
                    "the Node port's fair semaphore scores in milliseconds: \
                     BookVariant::NodeFair takes TimeUnit::Millis only",
                );
            }
            (BookVariant::NodeFair, _) => TimeUnit::Millis,
            (_, unit) => unit.unwrap_or(TimeUnit::Seconds),
        };
        let keys = match self.variant {
            BookVariant::NodeFair => BookKeys::node_fair(&self.name),
            _ => BookKeys::new(&self.name),
        };
        Error::check_name(&self.name, false)?;
        if keys.owner == NODE_GLOBAL_COUNTER {
            // its count zset would be the Node port's global ticket counter, a string:
            // every call would fail with WRONGTYPE
            return invalid(
                "a NodeFair semaphore cannot be named \"semaphore\": its key \
                 \"semaphore:count\" is the Node port's global ticket counter",
            );
        }
        if self.limit == 0 {
            return invalid("limit must be at least 1");
        }
        if self.timeout < Duration::from_millis(1) {
            return invalid("timeout must be at least 1 ms");
        }
        if self.timeout > YEAR {
            return invalid("timeout must be at most a year");
        }
        if self.variant == BookVariant::FairWithLock {
            if self.lock_wait.is_zero() {
                return invalid("lock wait must be above zero");
            }
            if self.lock_wait > YEAR {
                return invalid("lock wait must be at most a year");
            }
            if self.lock_timeout < Duration::from_millis(1) {
                return invalid("lock timeout must be at least 1 ms");
            }
            if self.lock_timeout > YEAR {
                return invalid("lock timeout must be at most a year");
            }
        }
        if self.poll_interval.is_zero() {
            return invalid("poll interval must be above zero");
        }
        if self.clock_offset_ms.unsigned_abs() > YEAR.as_millis() as u64 {
            return invalid("clock offset must be within a year");
        }
        Ok(BookSemaphore {
            inner: Arc::new(BookInner {
                keys,
                name: self.name,
                client: self.client,
                limit: self.limit,
                variant: self.variant,
                unit,
                timeout: self.timeout,
                lock_wait: self.lock_wait,
                lock_timeout: self.lock_timeout,
                poll_interval: self.poll_interval,
                clock_offset_ms: self.clock_offset_ms,
            }),
        })
    }
}

/// A "Redis in Action" semaphore (see the [module docs](self)). Cheap to clone;
/// clones share the settings.
#[derive(Clone)]
pub struct BookSemaphore {
    inner: Arc<BookInner>,
}

struct BookInner {
    client: Client,
    name: String,
    keys: BookKeys,
    limit: u32,
    variant: BookVariant,
    unit: TimeUnit,
    timeout: Duration,
    lock_wait: Duration,
    lock_timeout: Duration,
    poll_interval: Duration,
    clock_offset_ms: i64,
}

/// A reading of the client clock, as the book's scores: `now` and the purge cutoff
/// `now - timeout`, already formatted in the semaphore's unit.
#[derive(Clone)]
struct Stamp {
    now: String,
    cutoff: String,
    /// When the entry's lease ends by this client's monotonic clock: when a client
    /// whose clock agrees with ours may purge it (its score plus the timeout, in the
    /// unit's resolution), never later.
    ends: Instant,
}

/// A checked-out connection of a book semaphore on which every call (one command, or
/// one transaction: `MULTI`, its commands and `EXEC`, sent together) ends within the
/// operation timeout, or by the deadline of the whole operation when that comes first
/// (a release's, which `Drop` runs).
///
/// redis-rs reads each reply of a pipeline with the connection's full read timeout,
/// also after one has timed out: against a server that stopped answering, a
/// transaction of five replies blocked five operation timeouts. Here each reply is read
/// with what is left of the call's time, so those after a timed-out one wait about a
/// millisecond each; the connection skips every such late reply when it comes, as it
/// does after any timeout.
///
/// (The replies are read on the plain connection: the book's commands never quote a
/// stored value in an error, so no reply can fail to parse and leave the connection
/// out of step.)
struct BookConn {
    conn: Conn,
    op: Duration,
    /// The operation's deadline, if it has one of its own.
    deadline: Option<Instant>,
}

impl BookConn {
    /// A connection of the client's pool for one operation on a thread of its own (a
    /// clean-up aside): the wait for it and the operation end within one operation
    /// timeout each.
    fn fresh(shared: &crate::shared::Shared) -> crate::Result<BookConn> {
        let op = shared.op_timeout;
        Ok(BookConn {
            conn: shared.pool.get(Some(op))?,
            op,
            deadline: Some(Instant::now() + op),
        })
    }

    /// Sends `cmd` (a packed command or pipeline) and reads `offset + count` replies,
    /// returning those from `offset` on, as redis-rs does, each read waiting no longer
    /// than the call's deadline.
    fn call(&mut self, cmd: &[u8], offset: usize, count: usize) -> RedisResult<Vec<Value>> {
        let op = self.op;
        let now = Instant::now();
        let deadline = self.deadline.map_or(now + op, |d| d.min(now + op));
        // (sent on the plain connection: refused here, as the pool's own requests are,
        // once its primary has been replaced)
        self.conn.refuse_if_stale(cmd)?;
        let Some(c) = self.conn.plain() else {
            // never for a book semaphore, which refuses a cluster client
            return self.conn.req_packed_commands(cmd, offset, count);
        };
        let left = || left_until(deadline);
        // the timeouts are changed only when the call has less than the operation
        // timeout left (a release's deadline, or a transaction's later replies)
        let mut shortened = false;
        let mut shorten = |c: &mut redis::Connection, write: bool| {
            let budget = left();
            if shortened || budget + TIMEOUT_SLACK.min(op / 10) < op {
                shortened = true;
                let _ = c.read_within(Some(budget));
                if write {
                    let _ = c.write_within(Some(budget));
                }
            }
        };
        shorten(c, true);
        // a READONLY reply, also one before `offset` (a write refused inside MULTI,
        // after which EXEC answers EXECABORT): a demoted Sentinel primary (see
        // PrimaryConn::checked); the call fails with it, not with what EXEC said
        let mut read_only: Option<RedisError> = None;
        let result = (|| {
            c.send_packed_command(cmd)?;
            let (mut replies, mut first_err) = (Vec::with_capacity(count), None);
            let (mut idx, mut total) = (0, offset + count);
            while idx < total {
                if idx > 0 {
                    shorten(c, false);
                }
                match c.recv_response() {
                    // RESP3 push data between replies is not a reply
                    Ok(Value::Push { .. }) => total += 1,
                    Ok(Value::ServerError(e)) if read_only.is_none() && is_read_only_reply(&e) => {
                        read_only = Some(e.clone().into());
                        if idx >= offset {
                            replies.push(Value::ServerError(e));
                        }
                    }
                    Ok(v) if idx >= offset => replies.push(v),
                    // a command refused as it was queued inside MULTI (OOM at
                    // maxmemory, NOPERM...): the call fails with it, as redis-rs's own
                    // connection does, not with EXEC's EXECABORT (which redis-rs then
                    // reported as "Invalid response when parsing multi response")
                    Ok(Value::ServerError(e)) => {
                        first_err.get_or_insert(e.into());
                    }
                    Ok(_) => {}
                    Err(e) => {
                        if read_only.is_none() && is_read_only_error(&e) {
                            read_only = Some(e);
                        } else {
                            first_err.get_or_insert(e);
                        }
                    }
                }
                idx += 1;
            }
            first_err.map_or(Ok(replies), Err)
        })();
        if shortened {
            let restored = c.io_within(Some(op));
            if let Err(e) = restored {
                log::warn!("redis-semaphore: cannot restore a connection's timeouts: {e}");
            }
        }
        match read_only {
            Some(e) => {
                self.conn.primary_demoted();
                Err(e)
            }
            None => result,
        }
    }
}

/// Whether `e` is the failure of a call whose connection was broken (dropped, reset,
/// refused, an I/O error but a timeout, `READONLY`: [`broken`](crate::pool::broken)),
/// after which another connection may work; not a timeout, whose request may still run.
fn is_broken(e: &Error) -> bool {
    matches!(e, Error::Call { source, .. } if crate::pool::broken(source))
}

/// Runs `call` (a step safe to send twice) on `conn`; when it fails because the
/// connection was broken (a pooled connection the server had closed while it sat idle:
/// its `timeout`, a load balancer's or a cloud's idle cut, `CLIENT KILL`, a restart;
/// or a reset), once more on a fresh connection, as
/// [`Shared::run_resending`](crate::shared::Shared::run_resending) sends a call
/// again: while time is left (`conn`'s deadline, or one operation timeout from the
/// failure). The last answer, and the connection it came on, for the steps after it
/// (none when no fresh connection could be had in time: that failure is the answer).
fn run_again<T>(
    shared: &crate::shared::Shared,
    conn: BookConn,
    mut call: impl FnMut(&mut BookConn) -> Result<T>,
) -> (Result<T>, Option<BookConn>) {
    let mut conn = conn;
    let answer = call(&mut conn);
    let by = conn
        .deadline
        .unwrap_or_else(|| Instant::now() + shared.op_timeout);
    match &answer {
        Err(e) if is_broken(e) && Instant::now() < by => {
            log::debug!("redis-semaphore: book semaphore call sent again: {e}");
        }
        _ => return (answer, Some(conn)),
    }
    let op = conn.op;
    // (back to the pool first, which drops it, so that a pool at its size has room)
    drop(conn);
    let fresh = match shared.fresh_conn(by) {
        Ok(fresh) => fresh,
        Err(e) => return (Err(e), None),
    };
    let mut conn = BookConn {
        conn: fresh,
        op,
        deadline: Some(by),
    };
    (call(&mut conn), Some(conn))
}

impl ConnectionLike for BookConn {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        let mut replies = self.call(cmd, 0, 1)?;
        Ok(replies.pop().unwrap_or(Value::Nil))
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.call(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }

    fn check_connection(&mut self) -> bool {
        self.conn.check_connection()
    }

    fn is_open(&self) -> bool {
        self.conn.is_open()
    }
}

impl BookInner {
    fn stamp(&self) -> Stamp {
        // the monotonic reading first: its wall time is at or before the score's
        let at = Instant::now();
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        // Other clients purge the entry once their clock reads its score plus the
        // timeout (both as written on the wire), so the lease counts from the score,
        // not from the unrounded reading: `early` is how much earlier than the reading
        // the score (and the purge) may fall.
        let (now, cutoff, early, timeout) = match self.unit {
            TimeUnit::Seconds => {
                let now = since_epoch.as_secs_f64() + self.clock_offset_ms as f64 / 1000.0;
                // Rust prints f64 in shortest round-trip form without an exponent,
                // like Python's repr of time.time().
                (
                    format!("{now}"),
                    format!("{}", now - self.timeout.as_secs_f64()),
                    // the f64 roundings of the score and of a purging client's cutoff
                    // (half a unit in the last place each: 0.12 us until 2106)
                    Duration::from_micros(1),
                    self.timeout,
                )
            }
            TimeUnit::Millis => {
                let ms = since_epoch.as_millis();
                let now = ms as i64 + self.clock_offset_ms;
                let timeout = self.timeout.as_millis() as i64;
                (
                    now.to_string(),
                    (now - timeout).to_string(),
                    // the score is the reading truncated to the millisecond
                    since_epoch.saturating_sub(Duration::from_millis(ms as u64)),
                    // and the timeout is purged with in whole milliseconds
                    Duration::from_millis(timeout as u64),
                )
            }
        };
        let ends = at.checked_sub(early).unwrap_or(at) + timeout;
        Stamp { now, cutoff, ends }
    }

    /// A connection, waiting for one up to the checkout timeout.
    fn conn(&self) -> Result<BookConn> {
        self.conn_by(None)
    }

    /// A connection for a try, which never waits: when every pooled connection is busy,
    /// it waits for one at most the operation timeout, not the checkout timeout; its
    /// calls then take an operation timeout each.
    fn conn_for_try(&self) -> Result<BookConn> {
        let shared = &self.client.inner.shared;
        let op = shared.op_timeout;
        Ok(BookConn {
            conn: shared.pool.get(Some(op))?,
            op,
            deadline: None,
        })
    }

    /// A connection on which every call ends within the operation timeout, and all of
    /// it (the checkout included) by `deadline` when one is given.
    fn conn_by(&self, deadline: Option<Instant>) -> Result<BookConn> {
        let shared = &self.client.inner.shared;
        let wait = deadline.map(left_until);
        Ok(BookConn {
            conn: shared.pool.get(wait)?,
            op: shared.op_timeout,
            deadline,
        })
    }

    fn err(&self, e: redis::RedisError) -> Error {
        Error::redis(&self.name, e, self.client.inner.shared.op_timeout)
    }

    fn stats(&self) -> &Counters {
        &self.client.inner.shared.stats
    }

    /// One attempt, the book's way. `Some((id, token, stamp))` when granted. `until`:
    /// the caller's deadline, which also ends `FairWithLock`'s spin for the lock.
    ///
    /// An attempt that failed on a broken connection (a pooled one the server had
    /// closed while it was idle, say) is made again on another one ([`run_again`]),
    /// with the same entry id and the same clock reading (`FairWithLock`: a new lock
    /// id): each of its steps is safe to send twice so (the purges and `ZADD`s write
    /// the same entry again, never a second one; a second `INCR` only skips a ticket,
    /// as a failed acquire's does; a `ZREM` by id), and the permit's lease counts from
    /// the first reading, which its score holds. Not after a timeout, whose request
    /// may still run: its entry is taken out aside.
    fn attempt(
        &self,
        conn: BookConn,
        until: Option<Instant>,
    ) -> Result<Option<(String, u64, Stamp)>> {
        let id = uuid::Uuid::new_v4().to_string();
        let mut stamp = None;
        let mut sends = 0u32;
        let (outcome, conn) = run_again(&self.client.inner.shared, conn, |conn| {
            sends += 1;
            match self.variant {
                BookVariant::Basic => self.acquire_basic(conn, &id, &mut stamp),
                BookVariant::Fair | BookVariant::NodeFair => {
                    self.acquire_fair(conn, &id, &mut stamp)
                }
                BookVariant::FairWithLock => self.acquire_with_lock(conn, &id, until, &mut stamp),
            }
        });
        match outcome {
            Ok(Some((token, stamp))) => Ok(Some((id, token, stamp))),
            // Made again and not granted: the first attempt may have added the entry
            // (its reply lost with the connection). `Basic` and `Fair` took it out
            // themselves (the same id); `FairWithLock`'s second attempt may have ended
            // without the lock (the first one's, given back aside, still held) before
            // it touched the entry, which would hold a place until its timeout: taken
            // out aside, as a failed attempt's is.
            Ok(None) if sends > 1 => {
                self.remove_aside(conn, id);
                Ok(None)
            }
            Ok(None) => Ok(None),
            Err(e) => {
                // A failed transaction may still have added the entry (a read timeout
                // after the server ran it, or a request held up on its way that runs
                // later): take it out rather than let it hold a place until it
                // expires. Aside, so that the caller's try ends with the call that
                // failed (inline, the clean-up waited behind that call's late reply,
                // or one more operation timeout); see `remove_aside`.
                self.remove_aside(conn, id);
                Err(e)
            }
        }
    }

    /// Takes out the entry of `id` on a thread of its own: on `conn` while it is open,
    /// behind the request that failed (which the server then runs first: a late entry
    /// is taken out, not left behind; a pool of one connection has no other to give),
    /// else on another, waiting for it no longer than the operation timeout (and sent
    /// again on another when that one broke: [`run_again`]). The thread holds the
    /// client's shared state, not a handle: its last drop still stops its threads.
    fn remove_aside(&self, conn: Option<BookConn>, id: String) {
        let shared = Arc::clone(&self.client.inner.shared);
        let (variant, keys, name) = (self.variant, self.keys.clone(), self.name.clone());
        let clean_up = move || {
            // (not on a connection to a primary since replaced: it refuses to send)
            // (a closed one goes back to the pool here, which drops it)
            let open = conn.filter(|c| c.is_open() && !c.conn.is_stale());
            let conn = if let Some(mut conn) = open {
                // an operation timeout of its own, not what was left of the failed
                // acquire's (a poll's deadline may have passed)
                conn.deadline = None;
                conn
            } else {
                match BookConn::fresh(&shared) {
                    Ok(c) => c,
                    Err(e) => {
                        log::debug!(
                            "redis-semaphore: book semaphore {name:?}: no connection to \
                             take out a failed acquire's entry: {e}"
                        );
                        return;
                    }
                }
            };
            // (a `ZREM` by id, sent again on another connection when this one broke)
            let op = shared.op_timeout;
            let (removed, _) = run_again(&shared, conn, |c| {
                remove_entry(variant, c, &keys, &id).map_err(|e| Error::redis(&name, e, op))
            });
            if let Err(e) = removed {
                log::debug!(
                    "redis-semaphore: book semaphore {name:?}: taking out a failed \
                     acquire's entry: {e}"
                );
            }
        };
        if let Err(e) = crate::threads::run_aside("redsem-give-back", Instant::now(), clean_up) {
            log::warn!(
                "redis-semaphore: cannot start a thread to take out a failed book acquire's \
                 entry (it ends with its timeout): {e}"
            );
        }
    }

    /// Listing 12, with the clock reading `stamp` (read now when it has none yet: an
    /// attempt made again reuses the first one's).
    fn acquire_basic(
        &self,
        conn: &mut BookConn,
        id: &str,
        stamp: &mut Option<Stamp>,
    ) -> Result<Option<(u64, Stamp)>> {
        let stamp = stamp.get_or_insert_with(|| self.stamp()).clone();
        let rank = book::basic_enter(conn, &self.keys, &stamp.now, &stamp.cutoff, id)
            .map_err(|e| self.err(e))?;
        if rank.is_some_and(|r| r < i64::from(self.limit)) {
            return Ok(Some((0, stamp)));
        }
        book::basic_remove(conn, &self.keys, id).map_err(|e| self.err(e))?;
        Ok(None)
    }

    /// Listing 14, on the book's keys or (`NodeFair`) the Node port's: the ticket comes
    /// from `NAME:counter` or the global `semaphore:count`. With the clock reading
    /// `stamp`, as [`acquire_basic`](Self::acquire_basic).
    fn acquire_fair(
        &self,
        conn: &mut BookConn,
        id: &str,
        stamp: &mut Option<Stamp>,
    ) -> Result<Option<(u64, Stamp)>> {
        let stamp = stamp.get_or_insert_with(|| self.stamp()).clone();
        let counter =
            book::fair_purge_and_count(conn, &self.keys, &stamp.cutoff).map_err(|e| self.err(e))?;
        let rank =
            book::fair_enter(conn, &self.keys, &stamp.now, counter, id).map_err(|e| self.err(e))?;
        if rank.is_some_and(|r| r < i64::from(self.limit)) {
            return Ok(Some((u64::try_from(counter).unwrap_or(0), stamp)));
        }
        self.remove(conn, id)?;
        Ok(None)
    }

    /// Listing 17: the fair acquire under `lock:NAME`; no lock, no permit.
    fn acquire_with_lock(
        &self,
        conn: &mut BookConn,
        id: &str,
        until: Option<Instant>,
        stamp: &mut Option<Stamp>,
    ) -> Result<Option<(u64, Stamp)>> {
        let Some(lock_id) = self.acquire_lock(conn, until)? else {
            return Ok(None);
        };
        let outcome = self.acquire_fair(conn, id, stamp);
        if outcome.is_err() {
            // Python's `finally: release_lock(...)`, aside: this connection may owe the
            // reply of the call that failed, and a release behind it would wait for
            // that reply (or one more operation timeout) before the try could end
            self.release_lock_aside(lock_id);
            return outcome;
        }
        // Python's `finally: release_lock(...)`. A failure to release does not take
        // the permit back; the lock is released by its id on a thread of its own
        // (`release_lock_aside`), not left to expire after `lock_timeout`.
        match self.release_lock(conn, &lock_id) {
            Ok(true) => {}
            Ok(false) => log::warn!(
                "redis-semaphore: book lock {} expired before it was released: \
                 the acquire took longer than the lock timeout",
                self.keys.lock
            ),
            Err(e) => {
                log::warn!(
                    "redis-semaphore: releasing book lock {}: {e}; tried again aside",
                    self.keys.lock
                );
                self.release_lock_aside(lock_id);
            }
        }
        outcome
    }

    /// Releases the lock `lock_id` names, if it is still ours, on a thread of its own
    /// ([`give_back_twice`](crate::threads::give_back_twice), each time within one
    /// operation timeout), when a call on the caller's connection failed with the lock
    /// perhaps taken (a lost reply): else it would block every client's acquire until
    /// `lock_timeout` (10 s by default; the book's code leaves it so). The release
    /// compares the lock's value with the id first, so it never frees another's lock.
    fn release_lock_aside(&self, lock_id: String) {
        // the client's shared state, not a handle: its last drop still stops its threads
        let shared = Arc::clone(&self.client.inner.shared);
        let (keys, name) = (self.keys.clone(), self.name.clone());
        let op = shared.op_timeout;
        crate::threads::give_back_twice(op, move || {
            // (a compare-and-delete by the lock's id, sent again on another
            // connection when this one broke)
            let released = BookConn::fresh(&shared).and_then(|conn| {
                run_again(&shared, conn, |c| {
                    for _ in 0..16 {
                        if book::lock_release_round(c, &keys, &lock_id)
                            .map_err(|e| Error::redis(&name, e, op))?
                            .is_some()
                        {
                            break;
                        }
                    }
                    Ok(())
                })
                .0
            });
            if let Err(e) = released {
                log::warn!(
                    "redis-semaphore: releasing book lock {} aside: {e}",
                    keys.lock
                );
            }
        });
    }

    /// The book's `acquire_lock_with_timeout`: `SETNX` + `EXPIRE` (sent here as one
    /// `SET NX PX`, the same key, value and expiry), and, when the lock is taken but
    /// has no expiry (its holder died between the book's two commands, or used the
    /// book's expiry-less `acquire_lock`), give it one. Spins every 1 ms for
    /// `lock_wait` (or until `until`, if sooner), trying at least once (unless the
    /// primary its connection goes to was replaced: see the loop).
    fn acquire_lock(&self, conn: &mut BookConn, until: Option<Instant>) -> Result<Option<String>> {
        let lock_id = uuid::Uuid::new_v4().to_string();
        let lock_ms = self.lock_timeout.as_millis() as u64;
        let end = Instant::now() + self.lock_wait;
        let end = until.map_or(end, |d| end.min(d));
        loop {
            // The primary this connection goes to was replaced (a Sentinel failover
            // heard while spinning): a lock taken there, and the grant after it, would
            // be on the old primary, which the client has left. The spin ends; the
            // next try checks a connection to the new primary out.
            if conn.conn.is_stale() {
                return Ok(None);
            }
            match book::lock_try(conn, &self.keys, &lock_id, lock_ms) {
                Ok(true) => return Ok(Some(lock_id)),
                Ok(false) => {}
                Err(e) => {
                    // the SET may have run (its reply lost or late): the lock would
                    // block every acquire until it expires (the book's code leaves it)
                    self.release_lock_aside(lock_id);
                    // a switch learnt between the check above and the SET (refused
                    // then, nothing sent): the spin ends as it does at the check
                    if conn.conn.is_stale() {
                        return Ok(None);
                    }
                    return Err(self.err(e));
                }
            }
            match book::lock_repair(conn, &self.keys, lock_ms) {
                Ok(()) => {}
                // (likewise: the switch learnt after the SET)
                Err(_) if conn.conn.is_stale() => return Ok(None),
                Err(e) => return Err(self.err(e)),
            }
            if Instant::now() >= end {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The book's `release_lock`: `WATCH`, `GET`, and `MULTI`/`DEL`/`EXEC` when the
    /// value is ours, retried when the transaction aborts. `false`: not ours any more.
    fn release_lock(&self, conn: &mut BookConn, lock_id: &str) -> Result<bool> {
        // All of it within one operation timeout: after a call that got no reply in
        // time, the round's `UNWATCH` (and any further round) gets what is left, not an
        // operation timeout of its own (it is sent all the same, so the server still
        // ends the WATCH before the connection's next transaction).
        let end = Instant::now() + self.client.inner.shared.op_timeout;
        let outer = conn.deadline;
        conn.deadline = Some(outer.map_or(end, |d| d.min(end)));
        let released = (|| {
            // The book retries for ever; the only writer that can abort our EXEC is the
            // lock's own expiry, after which GET no longer matches, so a few rounds
            // suffice.
            for _ in 0..16 {
                match book::lock_release_round(conn, &self.keys, lock_id) {
                    Ok(Some(released)) => return Ok(released),
                    Ok(None) => continue,
                    Err(e) => return Err(self.err(e)),
                }
            }
            Ok(false)
        })();
        conn.deadline = outer;
        released
    }

    /// Listing 13 (basic) or 15 (fair; the Node port's clean-up, from both of its
    /// zsets): whether the entry was still there.
    fn remove(&self, conn: &mut BookConn, id: &str) -> Result<bool> {
        remove_entry(self.variant, conn, &self.keys, id).map_err(|e| self.err(e))
    }

    fn lost(&self, permit: &PermitState, reason: LostReason) -> Error {
        permit.mark_lost_counted(reason, self.stats());
        Error::PermitLost {
            id: permit.id.clone(),
            reason: permit.lost_reason().unwrap_or(reason),
        }
    }
}

/// Listing 13 (basic) or 15 (fair; the Node port's clean-up, from both of its zsets)
/// for `variant`: whether the entry was still there.
fn remove_entry(
    variant: BookVariant,
    conn: &mut BookConn,
    keys: &BookKeys,
    id: &str,
) -> RedisResult<bool> {
    match variant {
        BookVariant::Basic => book::basic_remove(conn, keys, id),
        BookVariant::Fair | BookVariant::FairWithLock | BookVariant::NodeFair => {
            book::fair_remove(conn, keys, id)
        }
    }
}

impl Grantor for BookInner {
    fn name(&self) -> &str {
        &self.name
    }

    fn op_timeout(&self) -> Duration {
        self.client.inner.shared.op_timeout
    }

    fn release(&self, permit: &PermitState) -> Result<()> {
        // Drop runs this: all of it, a wait for a busy pool included, ends within the
        // operation timeout (not the checkout timeout of acquires, nor an operation
        // timeout per reply of its transaction); else the entry ends with its timeout
        let deadline = Instant::now() + self.client.inner.shared.op_timeout;
        // After the server's idle timeout, a `CLIENT KILL` or a restart every idle
        // pooled connection may be dead: a release that failed on a broken connection
        // (the pool drops it) is sent again on another one, by the same deadline (a
        // `ZREM` by id is safe to run twice), else the entry would hold its place until
        // the timeout. Found gone by a resend, it is reported lost (the first send may
        // have removed it, but another client may as well have, or purged it): the
        // holder is told its work may have overlapped, never the reverse.
        let result = self
            .conn_by(Some(deadline))
            .and_then(|conn| {
                run_again(&self.client.inner.shared, conn, |c| {
                    self.remove(c, &permit.id)
                })
                .0
            })
            .map_err(|e| e.during("release"));
        match result {
            Ok(true) => {
                Counters::bump(&self.stats().released);
                Ok(())
            }
            Ok(false) => {
                Counters::bump(&self.stats().release_gone);
                Err(Error::PermitLost {
                    id: permit.id.clone(),
                    reason: permit.gone_reason(),
                })
            }
            Err(e) => {
                Counters::bump(&self.stats().release_failed);
                Counters::bump(&self.stats().errors);
                Err(e)
            }
        }
    }

    /// Listing 16 for the fair variants (for `NodeFair` on `NAME:time`: the port has no
    /// refresh, and this is the same step on its keys), as `ZADD XX GT` so that a refresh
    /// whose reply was lost never leaves a purged id behind (see [`book::rescore`]);
    /// the basic semaphore has no refresh in the book (re-scoring its entry would move
    /// it behind later acquirers).
    fn refresh(&self, permit: &PermitState) -> Result<()> {
        if self.variant == BookVariant::Basic {
            return Err(Error::InvalidArgument(format!(
                "semaphore {:?} is the book's basic semaphore, which cannot be refreshed \
                 (listing 16 is for the fair variants)",
                self.name
            )));
        }
        Counters::bump(&self.stats().refresh_calls);
        // all of it (the wait for a connection, the transaction and a clean-up) within
        // the operation timeout, as a leased permit's manual refresh: it waited for a
        // connection up to the checkout timeout, and then an operation timeout
        let conn = self.conn_by(Some(Instant::now() + self.op_timeout()))?;
        let sent = Instant::now();
        let stamp = self.stamp();
        // safe to send twice (`ZADD XX GT` to one score): sent again on another
        // connection when its own broke, the lease counted from the first reading of
        // the clock
        let (held, conn) = run_again(&self.client.inner.shared, conn, |c| {
            book::rescore(c, &self.keys, &stamp.now, &permit.id).map_err(|e| self.err(e))
        });
        let held = held.map_err(|e| e.during("refresh"))?;
        if held {
            permit.renewed(stamp.ends, sent);
            return Ok(());
        }
        // Gone from the time zset (purged), or its ticket gone: take out what is left,
        // as the book's refresh does through its release, and report the loss.
        let reason = permit.gone_reason();
        // (the connection that answered: `run_again` returns one with every answer)
        let cleaned = conn
            .map_or_else(
                || self.conn_by(Some(Instant::now() + self.op_timeout())),
                Ok,
            )
            .and_then(|mut conn| self.remove(&mut conn, &permit.id));
        let err = self.lost(permit, reason);
        cleaned.map_err(|e| e.during("refresh"))?;
        Err(err)
    }
}

impl BookSemaphore {
    /// The semaphore's name (its main key).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The limit this client checks ranks against (every client passes its own, as in
    /// the book).
    pub fn limit(&self) -> u32 {
        self.inner.limit
    }

    /// The algorithm spoken.
    pub fn variant(&self) -> BookVariant {
        self.inner.variant
    }

    /// The unit of the time scores.
    pub fn unit(&self) -> TimeUnit {
        self.inner.unit
    }

    /// One acquire attempt, the book's way: `Ok(None)` when the rank was not below the
    /// limit (or, for `FairWithLock`, when `lock:NAME` stayed taken for the lock wait).
    ///
    /// # Blocking
    ///
    /// `Basic`: one transaction (two round trips on failure). `Fair` and `NodeFair`:
    /// two transactions (three on failure). `FairWithLock`: the fair acquire plus the lock's round trips,
    /// spinning at most the lock wait (10 ms by default) for the lock. When every
    /// pooled connection is busy, it waits for one at most the operation timeout.
    ///
    /// # Errors
    ///
    /// Redis and pool errors; [`Error::WrongType`] when a key holds another type.
    pub fn try_acquire(&self) -> Result<Option<Permit>> {
        self.try_until(None)
    }

    /// [`try_acquire`](Self::try_acquire), its lock spin ending by `until`.
    fn try_until(&self, until: Option<Instant>) -> Result<Option<Permit>> {
        // a try never waits (at most one operation timeout for a connection); a poll
        // of a blocking acquire, the wait for its connection included, ends by the
        // acquire's deadline and one operation timeout (the poll in flight at the
        // deadline), as every other wait's tries do, not after the checkout timeout
        // and then an operation timeout per call
        let conn = match until {
            None => self.inner.conn_for_try()?,
            Some(deadline) => {
                let op = self.inner.client.inner.shared.op_timeout;
                self.inner.conn_by(wait_end(Some(deadline), op))?
            }
        };
        match self
            .inner
            .attempt(conn, until)
            .map_err(|e| e.during("acquire"))?
        {
            Some((id, token, stamp)) => Ok(Some(self.permit(id, token, stamp))),
            None => {
                Counters::bump(&self.inner.stats().try_failed);
                Ok(None)
            }
        }
    }

    /// Tries until a permit is granted or `timeout` has passed; `Ok(None)` then.
    ///
    /// # Blocking
    ///
    /// This polls: a [`try_acquire`](Self::try_acquire), then a sleep of the poll
    /// interval (10 ms by default), as the book's callers do. It is not fair: a waiter
    /// has no place in any queue. At least one try is made; `FairWithLock`'s spin for
    /// the lock ends by the deadline, even with a longer lock wait. It returns within
    /// `timeout` and one operation timeout (the try in flight at the deadline), the
    /// waits for a connection included: a try waits for one, when every pooled
    /// connection is busy or a new one cannot be opened, no longer than that bound.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    pub fn acquire_timeout(&self, timeout: Duration) -> Result<Option<Permit>> {
        // a timeout past what `Instant` can hold waits "for ever", as the crate's
        // other semaphores do
        let deadline = crate::clock::deadline_in(timeout);
        loop {
            if let Some(p) = self.try_until(Some(deadline))? {
                return Ok(Some(p));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            std::thread::sleep(self.inner.poll_interval.min(deadline - now));
        }
    }

    /// Tries until a permit is granted.
    ///
    /// # Blocking
    ///
    /// Without bound, polling as [`acquire_timeout`](Self::acquire_timeout) does.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    pub fn acquire(&self) -> Result<Permit> {
        loop {
            if let Some(p) = self.acquire_timeout(Duration::from_secs(3600))? {
                return Ok(p);
            }
        }
    }

    /// How many entries of the time zset (`NAME`; `NAME:time` for `NodeFair`) are younger than the timeout by this
    /// client's clock: the holders, plus acquires in flight that may still fail.
    ///
    /// # Errors
    ///
    /// Redis and pool errors.
    pub fn held(&self) -> Result<u32> {
        let stamp = self.inner.stamp();
        let inner = &self.inner;
        let (n, _) = run_again(&inner.client.inner.shared, inner.conn()?, |c| {
            book::count_younger(c, &inner.keys, &stamp.cutoff).map_err(|e| inner.err(e))
        });
        Ok(u32::try_from(n?).unwrap_or(u32::MAX))
    }

    /// The limit minus [`held`](Self::held), never below zero.
    ///
    /// # Errors
    ///
    /// Redis and pool errors.
    pub fn available(&self) -> Result<u32> {
        Ok(self.inner.limit.saturating_sub(self.held()?))
    }

    fn permit(&self, id: String, token: u64, stamp: Stamp) -> Permit {
        Counters::bump(&self.inner.stats().acquired);
        let (state, lost_rx) = PermitState::new(id, stamp.ends);
        Permit {
            grantor: Arc::clone(&self.inner) as Arc<dyn Grantor>,
            state,
            lost_rx,
            token,
            slots: Vec::new(),
            permits: 1,
            released: false,
        }
    }
}

impl std::fmt::Debug for BookSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = &self.inner;
        f.debug_struct("BookSemaphore")
            .field("name", &i.name)
            .field("limit", &i.limit)
            .field("variant", &i.variant)
            .field("unit", &i.unit)
            .field("timeout", &i.timeout)
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

    #[test]
    fn bad_settings_are_refused_before_any_network_call() {
        let c = client();
        let cases = [
            c.book_semaphore("", 5),
            c.book_semaphore("s", 0),
            c.book_semaphore("s", 5).timeout(Duration::ZERO),
            c.book_semaphore("s", 5).lock_wait(Duration::ZERO),
            c.book_semaphore("s", 5)
                .lock_timeout(Duration::from_micros(10)),
            c.book_semaphore("s", 5).poll_interval(Duration::ZERO),
            // an offset whose stamps would overflow (found by a review: a debug build
            // panicked on the first acquire)
            c.book_semaphore("s", 5).clock_offset_ms(i64::MAX),
            c.book_semaphore("s", 5).clock_offset_ms(i64::MIN),
        ];
        for b in cases {
            assert!(matches!(b.build(), Err(Error::InvalidArgument(_))));
        }
        // Lock settings do not matter without the lock.
        c.book_semaphore("s", 5)
            .variant(BookVariant::Fair)
            .lock_wait(Duration::ZERO)
            .build()
            .unwrap();
    }

    #[test]
    fn keys_are_the_books() {
        let s = client()
            .book_semaphore("market:acct:42", 5)
            .build()
            .unwrap();
        assert_eq!(s.inner.name, "market:acct:42");
        assert_eq!(s.inner.keys.time, "market:acct:42");
        assert_eq!(s.inner.keys.owner, "market:acct:42:owner");
        assert_eq!(s.inner.keys.counter, "market:acct:42:counter");
        assert_eq!(s.inner.keys.lock, "lock:market:acct:42");
    }

    #[test]
    fn node_fair_keys_are_the_node_ports_and_its_unit_is_millis() {
        let c = client();
        let s = c
            .book_semaphore("market:acct:42", 5)
            .variant(BookVariant::NodeFair)
            .build()
            .unwrap();
        assert_eq!(s.inner.keys.time, "market:acct:42:time");
        assert_eq!(s.inner.keys.owner, "market:acct:42:count");
        assert_eq!(s.inner.keys.counter, "semaphore:count");
        assert_eq!(s.unit(), TimeUnit::Millis);
        let explicit = c
            .book_semaphore("s", 5)
            .variant(BookVariant::NodeFair)
            .unit(TimeUnit::Millis)
            .build()
            .unwrap();
        assert_eq!(explicit.unit(), TimeUnit::Millis);
        match c
            .book_semaphore("s", 5)
            .variant(BookVariant::NodeFair)
            .unit(TimeUnit::Seconds)
            .build()
        {
            Err(Error::InvalidArgument(msg)) => assert!(msg.contains("milliseconds"), "{msg}"),
            other => panic!("NodeFair in seconds: {other:?}"),
        }
        // The book's variants keep seconds as their default.
        assert_eq!(
            c.book_semaphore("s", 5).build().unwrap().unit(),
            TimeUnit::Seconds
        );
    }

    #[test]
    fn stamps_in_both_units() {
        let c = client();
        let secs = c
            .book_semaphore("s", 1)
            .timeout(Duration::from_millis(2500))
            .build()
            .unwrap();
        let st = secs.inner.stamp();
        let now: f64 = st.now.parse().unwrap();
        let cutoff: f64 = st.cutoff.parse().unwrap();
        assert!(!st.now.contains('e'), "{}", st.now);
        assert!((now - cutoff - 2.5).abs() < 1e-3);
        assert!(now > 1.5e9 && now < 1.0e10);

        let ms = c
            .book_semaphore("s", 1)
            .unit(TimeUnit::Millis)
            .clock_offset_ms(-1000)
            .build()
            .unwrap();
        let st = ms.inner.stamp();
        let now: i64 = st.now.parse().unwrap();
        let cutoff: i64 = st.cutoff.parse().unwrap();
        assert_eq!(now - cutoff, 10_000);
        let real = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        assert!((real - 1000 - now).abs() < 500);
    }
}
