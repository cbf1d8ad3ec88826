//! The wake-up thread of a [`Client`](crate::Client): one pub/sub connection per
//! client, subscribed to the client's own channel, on which the scripts tell a blocked
//! waiter of this client that it was granted its permits (or must look again).
//!
//! Why pub/sub to a per-client channel: the release script hands the freed permits
//! straight to the head of the queue and publishes the grant, so a hand-off costs the
//! waiter no round trip of its own; the channel names the client, not the semaphore,
//! so one subscription made when the thread starts serves every waiter of every
//! semaphore, and nothing is subscribed or unsubscribed per wait. A blocking list pop
//! per waiter would need a connection per waiter (or a shared key per client, and a
//! read timeout longer than the pop, or a popped grant is lost).
//!
//! Invariants it keeps:
//!
//! - **A lost message is never fatal.** The grant itself lives in Redis; the waiter's
//!   next look (its acquire script, run again with the same id) returns it. After every
//!   (re)subscription the thread tells every waiter to look again, since messages
//!   published while it was away are gone; waiters also look again on a bounded timer.
//! - **Subscribed before queued.** A waiter queues itself only after
//!   [`Hub::wait_ready`] (or gives up on push and looks on its timer, at once while
//!   the listener's last try to subscribe failed). A subscription counts only once
//!   the server confirmed it: a `SUBSCRIBE` refused by an ACL is none.
//! - **It never keeps the client alive and never dies of an error.** It holds the pool
//!   (through [`Shared`]) and its own state; connection errors lead to a reconnect with
//!   back-off (and a panic of a logger's, to a new subscription); it ends when the
//!   client's last handle drops the stop channel.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};

use crate::clock::{IoTimeouts, deadline_in, left_until, pubsub_read_within};
use crate::pool::Pool;
use crate::scripts::{END_OF_TIME_MS, MAX_PERMITS};
use crate::shared::Shared;
use crate::stats::Counters;
use crate::threads::{drop_deadline, join_by, stopped};
use crate::topology::PrimaryConn;

/// How long one read of a message may block: bounds how late the thread sees that it
/// must stop while it listens. (Not a wait for the server's answer to a request: see
/// [`listen`].)
const POLL: Duration = Duration::from_millis(100);
/// A PING after this much silence finds a half-open connection.
const HEARTBEAT: Duration = Duration::from_secs(3);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// At most one warning per this long about malformed wake-up messages (the others are
/// logged at debug): anyone who may publish on a client's channel can send them.
const MALFORMED_WARN_EVERY: Duration = Duration::from_secs(60);
/// The most bytes of a malformed wake-up message a record quotes.
const MALFORMED_QUOTED: usize = 120;

/// What a waiter is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Wake {
    /// Its permits were granted with this token and these slots, until the server's
    /// time `deadline_ms`, by a message that arrived at `received`. Nothing vouches for
    /// it (anyone who may publish on the channel can send one): the waiter bounds what
    /// it believes of it (`Semaphore::pushed_deadline`).
    Granted {
        token: u64,
        deadline_ms: i64,
        slots: Vec<u32>,
        received: Instant,
    },
    /// It heads the queue: look again after this long (`None`: no lease will end).
    Head { retry_after: Option<Duration> },
    /// Messages may have been lost, or one said what a look must confirm (a refusal):
    /// look again now.
    LookAgain,
}

/// State shared by the thread and the waiters.
#[derive(Debug)]
pub(crate) struct Hub {
    pub(crate) channel: String,
    waiters: Mutex<HashMap<String, Sender<Wake>>>,
    ready: Mutex<bool>,
    ready_cv: Condvar,
    stopping: AtomicBool,
    /// The listener's last try to subscribe failed (a connection that could not be
    /// made, a `SUBSCRIBE` refused by an ACL without the channel): a waiter does not
    /// wait for the subscription then, it looks on its own timer at once.
    down: AtomicBool,
    /// When a malformed message was last warned about, and how many came since.
    malformed: Mutex<(Option<Instant>, u64)>,
}

impl Hub {
    /// Registers waiter `id`; its wake-ups arrive on the returned receiver.
    pub(crate) fn register(&self, id: &str) -> Receiver<Wake> {
        let (tx, rx) = crossbeam_channel::unbounded();
        self.waiters.lock().insert(id.to_owned(), tx);
        rx
    }

    pub(crate) fn deregister(&self, id: &str) {
        self.waiters.lock().remove(id);
    }

    /// Waits until the subscription is confirmed, at most until `deadline`.
    /// Returns at once (`false`) while the listener's last try to subscribe failed.
    pub(crate) fn wait_ready(&self, deadline: Instant) -> bool {
        let mut ready = self.ready.lock();
        while !*ready
            && !self.stopping.load(Ordering::Relaxed)
            && !self.down.load(Ordering::Relaxed)
        {
            if self.ready_cv.wait_until(&mut ready, deadline).timed_out() {
                break;
            }
        }
        *ready
    }

    /// Whether the subscription is up now.
    pub(crate) fn is_ready(&self) -> bool {
        *self.ready.lock()
    }

    fn set_ready(&self, on: bool) {
        let mut ready = self.ready.lock();
        *ready = on;
        if on {
            self.down.store(false, Ordering::Relaxed);
            self.ready_cv.notify_all();
        }
    }

    /// A try to subscribe failed: waiters waiting for the subscription look on their
    /// timers instead (until one succeeds).
    fn set_down(&self) {
        let mut ready = self.ready.lock();
        *ready = false;
        self.down.store(true, Ordering::Relaxed);
        self.ready_cv.notify_all();
    }

    /// Delivers one message "G id token deadline_ms slots", "F id limit", "H id retry_ms" or
    /// "L id" (look again).
    fn dispatch(&self, payload: &str) {
        let Some((id, wake)) = parse(payload, Instant::now()) else {
            self.ignore_malformed(payload);
            return;
        };
        let tx = self.waiters.lock().get(id).cloned();
        if let Some(tx) = tx {
            let _ = tx.send(wake);
        }
    }

    /// Logs a malformed message, quoting its first [`MALFORMED_QUOTED`] bytes: at warn
    /// at most once per [`MALFORMED_WARN_EVERY`] (with how many came since the last
    /// warning), else at debug, so that a flood of them floods no log at warn. (The
    /// record after the lock: a logger that panics leaves it free.)
    fn ignore_malformed(&self, payload: &str) {
        let warn = {
            let mut m = self.malformed.lock();
            let now = Instant::now();
            if m.0
                .is_none_or(|at| now.saturating_duration_since(at) >= MALFORMED_WARN_EVERY)
            {
                m.0 = Some(now);
                Some(std::mem::take(&mut m.1))
            } else {
                m.1 += 1;
                None
            }
        };
        let quoted = if payload.len() <= MALFORMED_QUOTED {
            format!("{payload:?}")
        } else {
            let mut end = MALFORMED_QUOTED;
            while !payload.is_char_boundary(end) {
                end -= 1;
            }
            format!("{:?}... ({} bytes)", &payload[..end], payload.len())
        };
        match warn {
            Some(0) => log::warn!(
                "redis-semaphore: ignoring malformed wake-up {quoted} on {} (more within a \
                 minute are logged at debug)",
                self.channel
            ),
            Some(n) => log::warn!(
                "redis-semaphore: ignoring malformed wake-up {quoted} on {} ({n} more since \
                 the last warning, logged at debug)",
                self.channel
            ),
            None => log::debug!("redis-semaphore: ignoring malformed wake-up {quoted}"),
        }
    }

    fn tell_all(&self, wake: Wake) {
        let all: Vec<Sender<Wake>> = self.waiters.lock().values().cloned().collect();
        for tx in all {
            let _ = tx.send(wake.clone());
        }
    }
}

/// Reads a message that arrived at `received`; `None` for one that does not parse,
/// or whose fields are out of range: a slot past [`MAX_PERMITS`], or a deadline that
/// is no server time (see [`END_OF_TIME_MS`]).
fn parse(payload: &str, received: Instant) -> Option<(&str, Wake)> {
    let mut f = payload.split(' ');
    let kind = f.next()?;
    let id = f.next()?;
    let wake = match kind {
        "G" => {
            let token = f.next()?.parse().ok()?;
            let deadline_ms = f
                .next()?
                .parse()
                .ok()
                .filter(|d| (1..=END_OF_TIME_MS).contains(d))?;
            let slots = match f.next() {
                None | Some("") => Vec::new(),
                Some(s) => s
                    .split(',')
                    .map(|x| x.parse().ok().filter(|&slot| slot < MAX_PERMITS))
                    .collect::<Option<Vec<u32>>>()?,
            };
            Wake::Granted {
                token,
                deadline_ms,
                slots,
                received,
            }
        }
        // "F id limit": it asked for more permits than the limit now in force, and
        // left the queue. Nothing vouches for it (anyone who may publish on the
        // channel can send one): the waiter looks again, and the look answers the
        // refusal when the limit was truly lowered.
        "F" => {
            let _limit: u32 = f.next()?.parse().ok()?;
            Wake::LookAgain
        }
        "L" => Wake::LookAgain,
        "H" => {
            let ms: i64 = f.next()?.parse().ok()?;
            Wake::Head {
                retry_after: u64::try_from(ms).ok().map(Duration::from_millis),
            }
        }
        _ => return None,
    };
    Some((id, wake))
}

/// The thread and its stop switch, owned by the client.
pub(crate) struct Listener {
    pub(crate) hub: Arc<Hub>,
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
    /// Disconnected when the thread ends.
    done: Receiver<()>,
    op_timeout: Duration,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("channel", &self.hub.channel)
            .finish()
    }
}

impl Listener {
    pub(crate) fn start(shared: Arc<Shared>) -> std::io::Result<Listener> {
        let hub = Arc::new(Hub {
            channel: format!("redsem:c:{}", uuid::Uuid::new_v4().simple()),
            waiters: Mutex::new(HashMap::new()),
            ready: Mutex::new(false),
            ready_cv: Condvar::new(),
            stopping: AtomicBool::new(false),
            down: AtomicBool::new(false),
            malformed: Mutex::new((None, 0)),
        });
        let (stop, stop_rx) = crossbeam_channel::bounded(0);
        let (done_tx, done) = crossbeam_channel::bounded::<()>(0);
        let op_timeout = shared.op_timeout;
        let thread = {
            let hub = Arc::clone(&hub);
            std::thread::Builder::new()
                .name("redsem-listen".into())
                .spawn(move || {
                    let _done = done_tx;
                    // A panic in code of the user's that the thread calls (a logger)
                    // ends the handling of one message (`listen_on`); one elsewhere
                    // ends the subscription, not the thread: the waiters look on
                    // their timers, and it subscribes again after a pause.
                    while crate::threads::shielded(|| run(&shared, &hub, &stop_rx)) {
                        hub.set_down();
                        if stop_rx
                            .recv_timeout(MAX_BACKOFF)
                            .is_err_and(|e| e.is_disconnected())
                        {
                            return;
                        }
                    }
                })?
        };
        Ok(Listener {
            hub,
            stop: Some(stop),
            thread: Some(thread),
            done,
            op_timeout,
        })
    }

    /// Tells the thread to stop, without waiting for it.
    pub(crate) fn signal(&mut self) {
        self.hub.stopping.store(true, Ordering::Relaxed);
        self.hub.ready_cv.notify_all();
        drop(self.stop.take());
    }

    /// Stops the thread, joining it if it ends by `deadline` (see [`join_by`]).
    pub(crate) fn stop_by(&mut self, deadline: Instant) {
        self.signal();
        join_by(self.thread.take(), &self.done, deadline, "listener");
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop_by(drop_deadline(Instant::now() + self.op_timeout));
    }
}

/// A connection for the subscription (see [`open_subscriber`]): a dedicated one to the
/// current primary when the client built its own pool, else one taken from the user's
/// pool for as long as the thread needs it.
///
/// A subscription on it must be left with [`leave`](SubConn::leave), its `PubSub`
/// dropped with a read timeout of [`LEAVE_AT_ONCE`] first ([`quit_pubsub`]): a dedicated
/// connection is closed, and a pooled one is brought back in step with its replies
/// before it goes back to the user's pool (see [`PooledSub`]).
pub(crate) enum SubConn {
    Own(PrimaryConn),
    /// (Boxed: a pooled connection is much larger than a dedicated one.)
    Pooled(Box<PooledSub>),
}

/// The read timeout a `PubSub` is dropped with: redis-rs then sends `UNSUBSCRIBE` and
/// `PUNSUBSCRIBE` and waits this long for their answers (see [`PooledSub`] for what
/// follows when they come later).
pub(crate) const LEAVE_AT_ONCE: Duration = Duration::from_millis(1);

/// Drops a subscription without waiting for the server: see [`LEAVE_AT_ONCE`].
pub(crate) fn quit_pubsub(ps: redis::PubSub<'_>) {
    let _ = pubsub_read_within(&ps, Some(LEAVE_AT_ONCE));
    drop(ps);
}

impl SubConn {
    /// The plain connection to subscribe on (`None`: a pooled cluster connection).
    pub(crate) fn get(&mut self) -> Option<&mut redis::Connection> {
        match self {
            SubConn::Own(c) => Some(c),
            SubConn::Pooled(c) => {
                c.subscribed = true;
                c.conn.as_mut()?.plain()
            }
        }
    }

    /// Makes a pooled connection's [`leave`](SubConn::leave) (also the one its drop
    /// makes) wait here until `by` at most.
    pub(crate) fn leave_by(&mut self, by: Instant) {
        if let SubConn::Pooled(c) = self {
            c.leave_by = Some(by);
        }
    }

    /// Gives the connection up once its subscription's `PubSub` is dropped
    /// ([`quit_pubsub`]): a dedicated one is closed; a pooled one goes back to the
    /// user's pool in step with its replies, waiting for that at most `budget` here
    /// (the rest, if any, on a thread of its own).
    pub(crate) fn leave(self, budget: Duration) {
        match self {
            SubConn::Own(c) => drop(c),
            SubConn::Pooled(mut c) => c.leave(budget),
        }
    }

    /// Whether the primary it was opened for has been replaced (Sentinel failover):
    /// the subscription must move to the new primary, where the scripts now publish.
    fn stale_check(&self) -> Box<dyn Fn() -> bool> {
        match self {
            SubConn::Own(c) => Box::new(c.stale_check()),
            SubConn::Pooled(_) => Box::new(|| false),
        }
    }
}

/// A connection to subscribe on: a new one to the current primary when the client
/// built its own pool, else one from the user's pool (redis-rs unsubscribes when the
/// subscription is dropped, before the connection goes back). With a deadline `by`,
/// getting it ends by then (a connect, or a checkout of the user's pool), else within
/// the connect timeout (the checkout within the operation timeout).
pub(crate) fn open_subscriber(shared: &Shared, by: Option<Instant>) -> crate::Result<SubConn> {
    let within = |cap: Duration| by.map_or(cap, |d| left_until(d).min(cap));
    match &shared.pool {
        // the pool's manager: the current primary, with the same credentials, TLS and
        // error sorting
        Pool::Own(_, m) => m
            .open_plain_within(within(m.connect_timeout))
            .map(SubConn::Own),
        Pool::User(..) => shared
            .pool
            .get(Some(within(shared.op_timeout)))
            .map(|conn| {
                SubConn::Pooled(Box::new(PooledSub {
                    conn: Some(conn),
                    subscribed: false,
                    op_timeout: shared.op_timeout,
                    leave_by: None,
                }))
            }),
    }
}

/// A connection of the user's pool that a subscription used. redis-rs leaves a
/// subscription when its `PubSub` is dropped (`UNSUBSCRIBE` and `PUNSUBSCRIBE`, then it
/// reads their answers); when they do not come within the read timeout (a server that
/// stopped answering), the answers arrive later and the next command on the connection
/// reads them as its own replies, each later command the reply of the one before
/// (measured with redis 1.8.1: a `SET` answered with `punsubscribe`, the `GET` after it
/// with `OK`). A script given another call's reply could take another caller's grant
/// for its own. So before the connection goes back to the user's pool it is brought
/// back in step ([`bring_in_step`]): `PING`s with tokens of their own follow the
/// subscription's last commands, everything is read up to the last token's echo, and a
/// last `PING` clears what redis-rs kept of the subscription. redis-rs skips one reply
/// for each earlier read of a reply that timed out, so the tokens outnumber those
/// reads ([`INLINE_TOKENS`], [`LATE_TOKENS`]). A connection not back in step within the
/// budget is brought back on a thread of its own, without timeouts (a server that never
/// answers keeps that one connection out of the pool; one whose socket closed makes
/// the pool discard it), and one that cannot be is never given back ([`OutOfStep`]).
///
/// Dropped without [`leave`](PooledSub::leave), it leaves as `leave` does, with the time
/// until [`SubConn::leave_by`]'s instant as its budget, else the operation timeout.
pub(crate) struct PooledSub {
    conn: Option<crate::pool::Conn>,
    /// Whether a subscription was made on it ([`SubConn::get`] was called).
    subscribed: bool,
    op_timeout: Duration,
    /// When set, how long a drop's leave may wait here: until then.
    leave_by: Option<Instant>,
}

impl PooledSub {
    fn leave(&mut self, budget: Duration) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        if !self.subscribed {
            return;
        }
        let op = self.op_timeout;
        let Some(c) = conn.plain() else {
            return;
        };
        match bring_in_step(c, INLINE_TOKENS, Some(budget.max(Duration::from_millis(1)))) {
            Ok(()) => {
                restore(&mut conn, op);
                return;
            }
            Err(e) => log::warn!(
                "redis-semaphore: a connection of the given pool is not back in step with \
                 its replies within {budget:?} of leaving a subscription ({e}); it goes back \
                 to the pool once it is"
            ),
        }
        // kept out of the pool unless brought back in step (also when the thread
        // cannot start: the closure, and the connection in it, is dropped then)
        let mut kept = OutOfStep(Some(conn));
        let spawned = std::thread::Builder::new()
            .name("redsem-unsub".into())
            .spawn(move || {
                let Some(c) = kept.0.as_mut().and_then(|conn| conn.plain()) else {
                    return;
                };
                // no timeout from here on: no read adds a skip any more
                match bring_in_step(c, LATE_TOKENS, None) {
                    Ok(()) => {
                        if let Some(mut conn) = kept.0.take() {
                            restore(&mut conn, op);
                        }
                    }
                    // the socket failed: nothing can be read from it any more, and the
                    // next command on it fails too (the pool discards a closed one)
                    Err(e) if e.is_io_error() || e.is_connection_dropped() => {
                        log::debug!(
                            "redis-semaphore: a connection of the given pool failed while \
                             leaving a subscription: {e}"
                        );
                        drop(kept.0.take());
                    }
                    Err(e) => log::warn!(
                        "redis-semaphore: a connection of the given pool could not be brought \
                         back in step with its replies ({e}); it is kept out of the pool"
                    ),
                }
            });
        if let Err(e) = spawned {
            log::warn!(
                "redis-semaphore: cannot start a thread to leave a subscription ({e}); its \
                 connection is kept out of the given pool"
            );
        }
    }
}

impl Drop for PooledSub {
    fn drop(&mut self) {
        let budget = self.leave_by.map_or(self.op_timeout, left_until);
        self.leave(budget);
    }
}

/// A pooled connection that must not go back to the pool out of step with its
/// replies: dropped while it still holds it, it leaks the connection (the pool counts
/// it as checked out for good) instead of giving it back.
struct OutOfStep(Option<crate::pool::Conn>);

impl Drop for OutOfStep {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            std::mem::forget(conn);
        }
    }
}

/// Tokens sent by a leave within its budget: redis-rs skips one reply per read of a
/// reply that timed out before (a `SUBSCRIBE` or a heartbeat `PING` in an outage, and
/// the unsubscribe of [`quit_pubsub`]: at most two), so the last of three is read.
const INLINE_TOKENS: usize = 3;

/// Tokens sent again, without a timeout, after a leave ran out of its budget: to the
/// two skips above, that leave's own timed-out reads add at most two (its token read,
/// or the `PING` that follows it); eight leave a margin.
const LATE_TOKENS: usize = 8;

/// Brings `c`, a connection a subscription used, back in step with its replies, all
/// of it within `timeout` (`None`: without timeouts). redis-rs's drop of the
/// subscription has sent `UNSUBSCRIBE` and `PUNSUBSCRIBE`; here `PING`s with tokens of
/// their own follow, everything is read up to the last token's echo (a reply skipped
/// by redis-rs in place of one that timed out is one of those read before it), and a
/// last `PING` through redis-rs's own command path clears the subscribed state it may
/// have kept after an unsubscribe that timed out (it unsubscribes again first and reads
/// exactly those answers, the connection being in step).
fn bring_in_step(
    c: &mut redis::Connection,
    tokens: usize,
    timeout: Option<Duration>,
) -> redis::RedisResult<()> {
    // every read gets what is left of `timeout`, not the whole of it again
    let end = timeout.map(deadline_in);
    let left = || end.map(left_until);
    c.io_within(timeout)?;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let mut packed = Vec::new();
    for k in 0..tokens {
        packed.extend(
            redis::cmd("PING")
                .arg(format!("redsem-leave-{run}-{k}"))
                .get_packed_command(),
        );
    }
    c.send_packed_command(&packed)?;
    let last = format!("redsem-leave-{run}-{}", tokens - 1);
    loop {
        if end.is_some() {
            c.read_within(left())?;
        }
        if is_echo(&c.recv_response()?, last.as_bytes()) {
            break;
        }
    }
    if end.is_some() {
        c.io_within(left())?;
    }
    redis::cmd("PING").query::<()>(c)
}

/// Whether `v` is the echo of `PING token`: `token` itself, or `["pong", token]` while
/// the connection is still subscribed.
fn is_echo(v: &redis::Value, token: &[u8]) -> bool {
    match v {
        redis::Value::BulkString(b) => b == token,
        redis::Value::SimpleString(s) => s.as_bytes() == token,
        redis::Value::Array(items) | redis::Value::Push { data: items, .. } => {
            items.iter().any(|i| is_echo(i, token))
        }
        _ => false,
    }
}

/// Puts the operation timeout back on a connection that goes back to the user's pool.
fn restore(conn: &mut crate::pool::Conn, op: Duration) {
    if let Some(c) = conn.plain() {
        let _ = c.io_within(Some(op));
    }
}

fn run(shared: &Shared, hub: &Hub, stop: &Receiver<()>) {
    let mut backoff = Duration::from_millis(10);
    let mut failed_before = false;
    // whether the last try's subscription was refused (or not confirmed)
    let mut refused = false;
    loop {
        if stopped(stop) {
            return;
        }
        let mut conn = match open_subscriber(shared, None) {
            Ok(c) => c,
            Err(e) => {
                failed_before = true;
                refused = false;
                hub.set_down();
                log::warn!("redis-semaphore: wake-up listener cannot connect: {e}");
                if stop
                    .recv_timeout(backoff)
                    .is_err_and(|e| e.is_disconnected())
                {
                    return;
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        // (not again at each try after a refused subscription)
        if failed_before && !refused {
            Counters::bump(&shared.stats.reconnects);
            log::info!("redis-semaphore: wake-up listener reconnected");
        }
        let stale = conn.stale_check();
        let Some(plain) = conn.get() else {
            log::error!("redis-semaphore: wake-up listener: no plain connection to subscribe on");
            return;
        };
        let mut subscribed = false;
        let listened = listen(plain, hub, stop, &stale, &mut subscribed, shared.op_timeout);
        if listened.is_err() {
            // waiters rely on their timers while there is no subscription
            hub.set_down();
        }
        conn.leave(shared.op_timeout);
        match listened {
            Ok(()) => return,
            Err(e) if subscribed => {
                failed_before = true;
                refused = false;
                log::warn!("redis-semaphore: wake-up listener lost its connection: {e}");
                backoff = Duration::from_millis(10);
            }
            // A subscription refused (an ACL without the channel) or not confirmed: tried
            // again with the back-off, not at once (a refusal would be met again at
            // once: a new connection, and an ACL LOG entry, each time)
            Err(e) => {
                if !refused {
                    log::warn!(
                        "redis-semaphore: wake-up listener cannot subscribe to {} (blocking \
                         acquires look again every 50 ms meanwhile): {e}",
                        hub.channel
                    );
                } else {
                    log::debug!("redis-semaphore: wake-up listener cannot subscribe: {e}");
                }
                refused = true;
                if stop
                    .recv_timeout(backoff)
                    .is_err_and(|e| e.is_disconnected())
                {
                    return;
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Subscribes and delivers messages until told to stop (`Ok`), the connection fails,
/// or `stale` says the primary it is subscribed on was replaced; `subscribed` says
/// whether the subscription was confirmed.
///
/// The server's answers (the `SUBSCRIBE`'s confirmation, a heartbeat's `PONG`) are
/// waited for up to the operation timeout `op`, as any call's reply: a network whose
/// round trip is longer than [`POLL`] (a server far away) is slow, not down. Only the
/// wait for a message, which may never come, is cut into reads of [`POLL`].
fn listen(
    conn: &mut redis::Connection,
    hub: &Hub,
    stop: &Receiver<()>,
    stale: &dyn Fn() -> bool,
    subscribed: &mut bool,
    op: Duration,
) -> redis::RedisResult<()> {
    let subscribing = conn
        .read_within(Some(op))
        .and_then(|()| crate::clock::subscribe(conn, &hub.channel))
        .and_then(|()| conn.read_within(Some(POLL)));
    // (a `PubSub` even when the subscription failed: its drop unsubscribes, in case
    // the server made one whose confirmation came too late)
    let mut ps = conn.as_pubsub();
    let listened = subscribing.and_then(|()| {
        *subscribed = true;
        listen_on(&mut ps, hub, stop, stale, op)
    });
    // left without waiting here; the caller brings a pooled connection back in step
    quit_pubsub(ps);
    listened
}

/// [`listen`] on the subscription `ps`, once it is confirmed, its reads of messages
/// cut at [`POLL`]; a heartbeat's answer is waited for up to `op`.
fn listen_on(
    ps: &mut redis::PubSub<'_>,
    hub: &Hub,
    stop: &Receiver<()>,
    stale: &dyn Fn() -> bool,
    op: Duration,
) -> redis::RedisResult<()> {
    hub.set_ready(true);
    log::debug!("redis-semaphore: listening for wake-ups on {}", hub.channel);
    // anything published while we were not subscribed is gone: everyone looks again
    hub.tell_all(Wake::LookAgain);
    let mut last_heard = Instant::now();
    loop {
        if stopped(stop) {
            hub.set_ready(false);
            return Ok(());
        }
        if stale() {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "the primary was replaced",
                "subscribing on the new one".to_string(),
            )));
        }
        match ps.get_message() {
            Ok(msg) => {
                last_heard = Instant::now();
                // (a logger that panics on its record ends this message's handling
                // only: anyone who may publish on the channel can send a malformed one)
                crate::threads::shielded(|| match msg.get_payload::<String>() {
                    Ok(payload) => hub.dispatch(&payload),
                    Err(e) => log::warn!("redis-semaphore: unreadable wake-up: {e}"),
                });
            }
            Err(e) if e.is_timeout() => {
                if last_heard.elapsed() >= HEARTBEAT {
                    // (messages that come before the answer are kept for the reads
                    // after it)
                    pubsub_read_within(ps, Some(op))?;
                    ps.ping::<redis::Value>()?;
                    pubsub_read_within(ps, Some(POLL))?;
                    last_heard = Instant::now();
                }
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_up_messages_parse() {
        let parse = |p| parse(p, Instant::now()).map(|(id, w)| (id, without_arrival(w)));
        assert_eq!(
            parse("G abc 17 1700000000123 0,3"),
            Some((
                "abc",
                Wake::Granted {
                    token: 17,
                    deadline_ms: 1_700_000_000_123,
                    slots: vec![0, 3],
                    received: arrival(),
                }
            ))
        );
        assert_eq!(parse("F abc 5"), Some(("abc", Wake::LookAgain)));
        assert_eq!(parse("F abc x"), None);
        assert_eq!(
            parse("H abc 250"),
            Some((
                "abc",
                Wake::Head {
                    retry_after: Some(Duration::from_millis(250))
                }
            ))
        );
        assert_eq!(
            parse("H abc -1"),
            Some(("abc", Wake::Head { retry_after: None }))
        );
        assert_eq!(parse("L abc"), Some(("abc", Wake::LookAgain)));
        assert_eq!(parse("X abc"), None);
        assert_eq!(parse("G abc notanumber 1"), None);
    }

    fn arrival() -> Instant {
        static AT: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *AT.get_or_init(Instant::now)
    }

    /// A granted wake-up with a fixed arrival, for comparing.
    fn without_arrival(w: Wake) -> Wake {
        match w {
            Wake::Granted {
                token,
                deadline_ms,
                slots,
                ..
            } => Wake::Granted {
                token,
                deadline_ms,
                slots,
                received: arrival(),
            },
            other => other,
        }
    }

    /// A grant message's deadline went to the waiter as it came: "G id 1
    /// -9223372036854775808 0", published by any program, made the waiter's clock
    /// conversion panic (debug build) or wrap round to a permit valid for 292 million
    /// years (release build). A deadline that is no server time, or a slot past the
    /// largest limit, makes the message one that is ignored (the waiter looks again on
    /// its timer).
    #[test]
    fn a_grant_message_with_fields_out_of_range_is_ignored() {
        let at = Instant::now();
        for payload in [
            "G abc 1 -9223372036854775808 0",
            "G abc 1 9223372036854775807 0",
            "G abc 1 -1 0",
            "G abc 1 0 0",
            "G abc 1 9000000000000001 0",
            "G abc 1 9223372036854775808 0",
            "G abc 1 1700000000123 10000",
            "G abc 1 1700000000123 0,4294967296",
            "G abc -1 1700000000123 0",
        ] {
            assert_eq!(parse(payload, at), None, "{payload}");
        }
        assert!(parse("G abc 1 1700000000123 9999", at).is_some());
    }
}
