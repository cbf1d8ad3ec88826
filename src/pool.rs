//! Connections: our own r2d2 manager (connect timeout, per-command timeouts,
//! TCP_NODELAY, connect errors sorted) to one server, a Sentinel service's current
//! primary or a Redis Cluster, or a pool the user built, behind one checkout call.
//! A checkout of the client's own pool passes over a connection that still owes the
//! reply of a request that timed out while another can be had (an idle one, or a new
//! one within a quarter of the operation timeout), so that a call does not wait for
//! another call's late reply; once the client is gone, that pool opens no new
//! connection. A connection of that pool to a Sentinel service's primary since
//! replaced is never handed out, and one already checked out sends nothing more: each
//! request on it fails before a byte goes out (a retryable error naming the command
//! and the node), so no call's second command reaches the old primary.

use std::cell::Cell;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::ConnectionLike;

use crate::clock::{CallEnd, IoTimeouts, TIMEOUT_SLACK, deadline_in, left_until};
use crate::connect::{
    NO_CONNECTION, bounded_handshake, connect_error_at, is_config_error, is_unreachable,
};
use crate::error::{Error, Result};
use crate::node::{ClusterConn, NodeConn};
use crate::threads::run_aside;
use crate::topology::{ClusterSource, Connector, IdleCut, PrimaryConn};

/// How many times the cluster client sends one command at most (a `MOVED` after a
/// failover or a slot migration, a dropped node connection): the first attempt and
/// two retries. Every script is safe to run twice (DESIGN invariant 11).
pub(crate) const CLUSTER_ATTEMPTS: u32 = 3;

/// The longest the cluster client waits between two attempts of one command.
pub(crate) const CLUSTER_RETRY_WAIT: Duration = Duration::from_millis(50);

/// The per-attempt share of a timeout `d` on a cluster connection, so that every
/// attempt of one command, and the waits between them, together stay within `d`
/// (for a `d` too short for the waits, half of an equal share: a command that must be
/// retried may then end a little late).
pub(crate) fn per_attempt(d: Duration) -> Duration {
    let waits = CLUSTER_RETRY_WAIT * (CLUSTER_ATTEMPTS - 1);
    (d.saturating_sub(waits) / CLUSTER_ATTEMPTS)
        .max(d / (2 * CLUSTER_ATTEMPTS))
        .max(Duration::from_millis(1))
}

/// A connection of the library's own pool: to one server or a Sentinel service's
/// primary, or to a Redis Cluster (which routes each command to the node owning its
/// keys' slot).
pub(crate) enum RConn {
    Primary(PrimaryConn),
    /// With whether a command failed for want of a node: the connection's slot map
    /// may then name a node that is gone (a failed primary whose replica took over
    /// without a `MOVED` ever reaching us), so the pool replaces the whole connection
    /// and the next one reads the slot map afresh.
    Cluster(Box<ClusterConn>, bool),
}

/// On a cluster, each attempt gets its share ([`per_attempt`]), so that a command with
/// its retries ends within `d`.
impl IoTimeouts for RConn {
    fn read_within(&self, d: Option<Duration>) -> redis::RedisResult<()> {
        match self {
            RConn::Primary(c) => c.read_within(d),
            RConn::Cluster(c, _) => c.read_within(d.map(per_attempt)),
        }
    }

    fn write_within(&self, d: Option<Duration>) -> redis::RedisResult<()> {
        match self {
            RConn::Primary(c) => c.write_within(d),
            RConn::Cluster(c, _) => c.write_within(d.map(per_attempt)),
        }
    }
}

impl RConn {
    /// Whether it goes to a primary since replaced (Sentinel failover).
    pub(crate) fn is_stale(&self) -> bool {
        match self {
            RConn::Primary(c) => c.is_stale(),
            RConn::Cluster(..) => false,
        }
    }

    /// Whether it has been idle in the pool at least as long as a connection the server
    /// was found to have closed ([`IdleCut`]): a checkout passes it over.
    fn closed_while_idle(&self) -> bool {
        match self {
            RConn::Primary(c) => c
                .idle_cut
                .as_ref()
                .is_some_and(|cut| cut.covers(c.idle_since)),
            RConn::Cluster(..) => false,
        }
    }

    /// Marks it not to be used again: the pool drops it when it comes back.
    fn close(&mut self) {
        match self {
            RConn::Primary(c) => c.desynced = true,
            RConn::Cluster(_, broken) => *broken = true,
        }
    }

    /// Whether its last request got no reply in time, which it still owes
    /// ([`PrimaryConn::owes_reply`]). A cluster connection is dropped after a timeout
    /// instead (`node_failed`).
    fn owes_reply(&self) -> bool {
        match self {
            RConn::Primary(c) => c.owes_reply,
            RConn::Cluster(..) => false,
        }
    }
}

/// Passes `result` on, noting in `flag` an error after which `breaks` says the
/// connection is not to be used again.
fn noting<T>(
    flag: &mut bool,
    breaks: fn(&redis::RedisError) -> bool,
    result: redis::RedisResult<T>,
) -> redis::RedisResult<T> {
    if let Err(e) = &result
        && breaks(e)
    {
        *flag = true;
    }
    result
}

/// A reply that could not be parsed: what is left of it would be read as the next
/// command's reply. (A redis error reply whose text is not UTF-8 is one.)
fn unparsed(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Parse
}

/// On a cluster connection, also a node that could not be reached or did not answer:
/// the connection's slot map may name a node that is gone.
fn node_failed(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_timeout()
        || unparsed(e)
}

impl ConnectionLike for RConn {
    fn req_packed_command(&mut self, cmd: &[u8]) -> redis::RedisResult<redis::Value> {
        match self {
            RConn::Primary(c) => {
                // (nothing to a primary replaced since the connection was checked out)
                c.refuse_if_stale(cmd)?;
                let r = c.conn.req_packed_command(cmd).map(|v| [v]);
                c.checked(r).map(|[v]| v)
            }
            RConn::Cluster(c, broken) => noting(broken, node_failed, c.req_packed_command(cmd)),
        }
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        match self {
            RConn::Primary(c) => {
                c.refuse_if_stale(cmd)?;
                let r = c.conn.req_packed_commands(cmd, offset, count);
                c.checked(r)
            }
            RConn::Cluster(c, broken) => noting(
                broken,
                node_failed,
                c.req_packed_commands(cmd, offset, count),
            ),
        }
    }

    fn req_command(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        match self {
            RConn::Primary(c) => {
                if c.is_stale() {
                    c.refuse_if_stale(&cmd.get_packed_command())?;
                }
                let r = c.conn.req_command(cmd).map(|v| [v]);
                c.checked(r).map(|[v]| v)
            }
            RConn::Cluster(c, broken) => noting(broken, node_failed, c.req_command(cmd)),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RConn::Primary(c) => c.conn.get_db(),
            RConn::Cluster(c, _) => c.get_db(),
        }
    }

    fn supports_pipelining(&self) -> bool {
        match self {
            RConn::Primary(c) => c.conn.supports_pipelining(),
            RConn::Cluster(c, _) => c.supports_pipelining(),
        }
    }

    fn check_connection(&mut self) -> bool {
        match self {
            RConn::Primary(c) => c.conn.check_connection(),
            RConn::Cluster(c, _) => c.check_connection(),
        }
    }

    fn is_open(&self) -> bool {
        match self {
            RConn::Primary(c) => !c.desynced && c.conn.is_open(),
            RConn::Cluster(c, broken) => !*broken && c.is_open(),
        }
    }
}

/// An r2d2 manager that connects with a timeout and sets read and write timeouts on
/// every new connection, so no command can block for ever. Its connections go to the
/// current primary; one opened for a primary since replaced (a Sentinel failover)
/// counts as broken and is never handed out again.
///
/// Connect errors are sorted into [`Error::Auth`] and [`Error::Connect`] (naming the
/// address, never the password), and the last one is kept so that a checkout that
/// times out says why, and one that can never succeed (refused credentials, a failed
/// TLS handshake) fails at once instead of waiting out the checkout timeout.
///
/// Clones share the record of the last failure (the pool keeps one, and a clone of it
/// for itself, since r2d2 does not hand its manager back).
#[derive(Debug, Clone)]
pub(crate) struct Manager(Arc<ManagerInner>);

#[derive(Debug)]
pub(crate) struct ManagerInner {
    pub(crate) connector: Connector,
    pub(crate) connect_timeout: Duration,
    pub(crate) op_timeout: Duration,
    /// The last connect error, when it happened, and whether it was a timeout.
    last_failure: Mutex<Option<(Instant, Error, bool)>>,
    /// The client is gone ([`Manager::close`]): its pool opens no new connection.
    closed: AtomicBool,
    /// Idle connections the server closed, as far as the pool's requests found.
    idle_cut: Arc<IdleCut>,
}

impl Deref for Manager {
    type Target = ManagerInner;
    fn deref(&self) -> &ManagerInner {
        &self.0
    }
}

impl Manager {
    pub(crate) fn new(
        connector: Connector,
        connect_timeout: Duration,
        op_timeout: Duration,
    ) -> Self {
        Manager(Arc::new(ManagerInner {
            connector,
            connect_timeout,
            op_timeout,
            last_failure: Mutex::new(None),
            closed: AtomicBool::new(false),
            idle_cut: Arc::new(IdleCut::new()),
        }))
    }

    /// The client whose pool this manager fills is gone (its last [`Shared`](
    /// crate::shared::Shared) dropped): r2d2's connects still queued or retried on the
    /// pool's threads fail at once from now on. Each of those jobs holds the pool while
    /// it runs, so against a server that hangs, one connecting kept the pool alive for
    /// the next (and a failed one scheduled its retry): the pool's threads went on
    /// connecting to it for as long as it hung. Now they end with the connects in
    /// flight, within a connect timeout.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Opens one connection, with its timeouts set; when no password is sent on
    /// connect, a `PING` finds at once a server that requires one.
    pub(crate) fn open(&self) -> Result<RConn> {
        self.open_within(self.connect_timeout, None)
    }

    /// [`open`](Self::open) with its own connect timeout, and its whole set-up ending
    /// by `by` when given (a Sentinel target's steps each get what is left).
    pub(crate) fn open_within(
        &self,
        connect_timeout: Duration,
        by: Option<Instant>,
    ) -> Result<RConn> {
        let timed_out = Cell::new(false);
        let result = match &self.connector {
            Connector::Cluster(c) => self.open_cluster(c, by),
            _ => self
                .open_inner(connect_timeout, by, &timed_out)
                .map(|mut c| {
                    c.idle_cut = Some(Arc::clone(&self.idle_cut));
                    RConn::Primary(c)
                }),
        };
        // a set-up that ran out of a caller's budget shorter than the connect timeout
        // (a call sent again late in its bound, `Pool::fresh`) says nothing of the
        // server: not the pool's last failure, which a checkout waiting meanwhile
        // would end with at once (as `open_plain_within`'s)
        if let Err(e) = &result
            && !(timed_out.get() && connect_timeout < self.connect_timeout)
        {
            *self.last_failure.lock() = Some((Instant::now(), e.copy(), timed_out.get()));
        }
        result
    }

    /// A plain connection with its timeouts set: to the current primary, or to one
    /// node of a cluster (for a subscription), its set-up ending within `budget` (at
    /// most the connect timeout: a caller with a deadline of its own passes what is
    /// left of it). A set-up that runs out of a budget shorter than the connect timeout
    /// is not recorded as the pool's last connect failure: it says nothing of the
    /// server, and a checkout waiting meanwhile would end with it.
    pub(crate) fn open_plain_within(&self, budget: Duration) -> Result<PrimaryConn> {
        let budget = budget.min(self.connect_timeout);
        let timed_out = Cell::new(false);
        // a budget shorter than the connect timeout is a caller's deadline: it bounds
        // the whole set-up, not each of a Sentinel target's steps
        let by = (budget < self.connect_timeout).then(|| Instant::now() + budget);
        let result = self.open_inner(budget, by, &timed_out);
        if let Err(e) = &result
            && !(timed_out.get() && budget < self.connect_timeout)
        {
            *self.last_failure.lock() = Some((Instant::now(), e.copy(), timed_out.get()));
        }
        result
    }

    /// A cluster connection (the cluster client's own connect and response timeouts
    /// are set when it is built, `ClientBuilder::build`); with `by`, one whose set-up
    /// ends by then ([`ClusterSource::within`]), its commands' timeouts at most what is
    /// left.
    fn open_cluster(&self, c: &ClusterSource, by: Option<Instant>) -> Result<RConn> {
        let sort = |e: redis::RedisError| connect_error_at(&c.addr, c.tls, 0, c.lone_user(), &e);
        let conn = match by {
            None => c.client.get_generic_connection::<NodeConn>(),
            // (its connects' TLS handshakes too: see `bounded_handshake`)
            Some(by) => (c.within)(left_until(by)).and_then(|short| {
                bounded_handshake(c.tls, &c.addr, by, move || {
                    short.get_generic_connection::<NodeConn>()
                })
            }),
        }
        .map_err(sort)?;
        let conn = RConn::Cluster(Box::new(conn), false);
        let timeout = by.map_or(self.op_timeout, |by| left_until(by).min(self.op_timeout));
        conn.io_within(Some(timeout)).map_err(sort)?;
        Ok(conn)
    }

    /// Opens a connection, its set-up (connect, handshake and the `PING`) ending
    /// within about `connect_timeout` (for a Sentinel target: each of its steps, see
    /// [`Connector::connect`]) and, when `by` is given, by then in any case, and leaves
    /// the operation timeout set on it. `timed_out` is set when it fails for want of
    /// an answer in time.
    fn open_inner(
        &self,
        connect_timeout: Duration,
        by: Option<Instant>,
        timed_out: &Cell<bool>,
    ) -> Result<PrimaryConn> {
        let (addr, tls, db, lone_user) = (
            self.connector.addr(),
            self.connector.is_tls(),
            self.connector.db(),
            self.connector.lone_user(),
        );
        let sort = |e: redis::RedisError| {
            timed_out.set(timed_out.get() || e.is_timeout());
            connect_error_at(&addr, tls, db, lone_user, &e)
        };
        let started = Instant::now();
        let mut conn = self.connector.connect(connect_timeout, by).map_err(sort)?;
        if !self.connector.has_password() {
            // part of the set-up: what is left of its budget, not an operation timeout
            // (a release resent on a fresh connection must end by its deadline)
            let mut left = connect_timeout
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(1));
            if let Some(by) = by {
                left = left.min(left_until(by));
            }
            conn.io_within(Some(left)).map_err(sort)?;
            redis::cmd("PING").exec(&mut conn.conn).map_err(sort)?;
        }
        conn.io_within(Some(self.op_timeout)).map_err(sort)?;
        Ok(conn)
    }

    /// What messages name as the server (never a password).
    pub(crate) fn addr(&self) -> String {
        self.connector.addr()
    }

    /// The error of a checkout that timed out while no connection could be made and
    /// none failed either: connecting hangs (a host that drops packets, with a connect
    /// timeout longer than the checkout timeout; a cluster client's own connects, whose
    /// TLS handshakes with native-tls have no timeout).
    fn stalled(&self) -> Error {
        self.stalled_within("the checkout timeout")
    }

    /// [`stalled`](Self::stalled), for a connection that was not made within `what`.
    pub(crate) fn stalled_within(&self, what: &str) -> Error {
        let message = if self.connector.is_tls() {
            let plain = crate::connect::plaintext_scheme(&self.addr());
            format!(
                "{NO_CONNECTION} {what}: the TLS handshake did not finish (is this a plaintext \
                 port? use {plain} for a server without TLS)"
            )
        } else {
            format!("{NO_CONNECTION} {what}: connecting hangs")
        };
        Error::Connect {
            addr: self.addr(),
            message,
        }
    }

    /// The last connect error if it happened at or after `since`, and whether it was
    /// a timeout.
    fn failure_since(&self, since: Instant) -> Option<(Error, bool)> {
        match &*self.last_failure.lock() {
            Some((at, e, timed_out)) if *at >= since => Some((e.copy(), *timed_out)),
            _ => None,
        }
    }
}

impl r2d2::ManageConnection for Manager {
    type Connection = RConn;
    type Error = Error;

    fn connect(&self) -> Result<RConn> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Connect {
                addr: self.addr(),
                message: "the client is gone: its pool opens no new connection".into(),
            });
        }
        self.open()
    }

    fn is_valid(&self, conn: &mut RConn) -> Result<()> {
        redis::cmd("PING").exec(conn).map_err(Error::Redis)
    }

    fn has_broken(&self, conn: &mut RConn) -> bool {
        !conn.is_open() || conn.is_stale()
    }
}

/// r2d2's handler of connect errors: they reach the caller (the manager keeps the last
/// one and a checkout returns it), so r2d2's own report of each goes to `debug`, not
/// to the application's log at `ERROR` once per attempt.
#[derive(Debug)]
pub(crate) struct QuietErrors;

impl r2d2::HandleError<Error> for QuietErrors {
    fn handle_error(&self, e: Error) {
        log::debug!("redis-semaphore: opening a connection failed: {e}");
    }
}

/// How often a checkout that waits looks whether connecting has failed for a reason
/// that waiting will not fix.
const CHECKOUT_SLICE: Duration = Duration::from_millis(10);

/// Where connections come from.
#[derive(Clone)]
pub(crate) enum Pool {
    /// Built by [`crate::ClientBuilder`].
    Own(r2d2::Pool<Manager>, Manager),
    /// Given to [`crate::Client::from_pool`]; the operation timeout is set on each checkout.
    User(r2d2::Pool<redis::Client>, Duration),
}

/// A checked-out connection. It derefs to itself as a [`ConnectionLike`], so that
/// every request of a call [`within_conn`](Conn::within_conn) runs goes through its
/// bound.
pub(crate) struct Conn {
    checkout: Checkout,
    /// While [`within_conn`](Conn::within_conn) runs a call: when it must end, and the
    /// timeout in force on the socket.
    bound: Option<Bound>,
    /// The operation timeout: what a request outside such a call may take.
    op: Duration,
    /// When everything sent on it must end, if earlier than its calls' budgets say:
    /// a connection handed out after a wait for another ([`in_place_of_owing`]).
    /// (Requests outside a call then shorten its timeouts to the cap: they are
    /// restored to the operation timeout before it goes back to the pool.)
    cap: Option<Instant>,
}

/// Where a [`Conn`] comes from.
enum Checkout {
    Own(r2d2::PooledConnection<Manager>),
    User(r2d2::PooledConnection<redis::Client>),
    /// A brand-new connection of the client's own manager, outside the pool (closed
    /// when it is dropped): for a call sent again after its pooled connection broke
    /// ([`Pool::fresh`]).
    Fresh(Box<RConn>),
}

/// A call's end and the timeout set on its connection (see [`Conn::within_conn`]).
#[derive(Clone, Copy)]
struct Bound {
    end: Instant,
    set: Duration,
    slack: Duration,
}

/// The longest a checkout waits for a new connection in place of one that owes a
/// reply ([`in_place_of_owing`]), as a share of the operation timeout.
const FRESH_SHARE: u32 = 4;

/// A connection in place of `owing`, which the pool handed out but which still owes
/// the reply of a request that timed out ([`RConn::owes_reply`]): a request sent on it
/// would wait for that reply first, so a call on another semaphore, which nothing
/// holds, would wait for one held up on its way, and time out with it. Another idle
/// connection that owes nothing is taken instead; else a new one, if the pool has
/// room and it comes within a quarter of the operation timeout (on a server that
/// answers, about a round trip), and by the checkout's `deadline`. Once one is found,
/// the connections passed over are closed: the server answers, and a reply they owe
/// may never come. When none comes (the server itself stopped answering: every
/// connection owes a reply and a new one hears nothing), `owing` is used after all;
/// without a deadline of the caller's, its call then ends within one operation
/// timeout of now, the wait for a new one included, as it would have without the wait
/// (`Conn::cap`); the others go back to the pool.
fn in_place_of_owing(
    p: &r2d2::Pool<Manager>,
    m: &Manager,
    owing: r2d2::PooledConnection<Manager>,
    deadline: Option<Instant>,
) -> Conn {
    let op = m.op_timeout;
    let cap = deadline_in(op);
    let mut passed_over = vec![owing];
    let found = |c: r2d2::PooledConnection<Manager>,
                 passed_over: Vec<r2d2::PooledConnection<Manager>>| {
        for mut owing in passed_over {
            owing.close();
        }
        Conn::new(Checkout::Own(c), op)
    };
    while let Some(mut c) = p.try_get() {
        if c.is_stale() {
            continue;
        }
        if c.closed_while_idle() {
            c.close();
            continue;
        }
        if !c.owes_reply() {
            return found(c, passed_over);
        }
        passed_over.push(c);
    }
    // (r2d2 opens one on a thread of its own when the pool has room; one that comes
    // later waits in the pool for the next checkout)
    let mut wait = (op / FRESH_SHARE).min(m.connect_timeout);
    if let Some(d) = deadline {
        wait = wait.min(left_until(d));
    }
    if let Ok(c) = p.get_timeout(wait.max(Duration::from_millis(1)))
        && !c.is_stale()
        && !c.owes_reply()
    {
        return found(c, passed_over);
    }
    let owing = passed_over.swap_remove(0);
    let mut conn = Conn::new(Checkout::Own(owing), op);
    conn.cap = deadline.is_none().then_some(cap);
    conn
}

/// How much sooner than its caller [`checkout_aside`]'s r2d2 checkout gives up (a
/// tenth of the wait when that is less).
const CHECKOUT_ASIDE_MARGIN: Duration = Duration::from_millis(50);

/// A checkout from a user's pool that tests each connection on checkout (r2d2's
/// `test_on_check_out(true)`, its default), ended by `timeout` however the server
/// behaves. r2d2 sends that test's `PING` in the calling thread, on a connection
/// whose timeouts the library has not set yet (one the pool opened and the library
/// never used has none at all), and does not look at the checkout's deadline while
/// it waits for the answer: against a server that stopped answering a checkout
/// could wait until it answered again, and a `Permit`'s drop with it (DESIGN
/// invariant 13). So the checkout runs on a thread of its own and the caller waits
/// for it at most `timeout`; a connection checked out after that goes back to the
/// pool when that thread ends. The thread costs a few microseconds beside the
/// `PING`'s round trip; a pool built with `test_on_check_out(false)` needs neither.
fn checkout_aside(
    pool: &r2d2::Pool<redis::Client>,
    timeout: Duration,
) -> Result<r2d2::PooledConnection<redis::Client>> {
    let aside = pool.clone();
    // r2d2 gives up a little before the caller does, so that its own error (a server
    // that refuses connections, say) is the one reported when it failed in time, not
    // the caller's end of its wait, which reads as a PING without an answer
    let own = timeout.saturating_sub((timeout / 10).min(CHECKOUT_ASIDE_MARGIN));
    let got = run_aside("redsem-checkout", deadline_in(timeout), move || {
        aside.get_timeout(own)
    })
    .map_err(|e| Error::Redis(e.into()))?;
    match got {
        Some(got) => Ok(got?),
        None => Err(Error::Redis(
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no connection from the given pool within {timeout:?} (its check on \
                     checkout, a PING, got no answer; build the pool with \
                     test_on_check_out(false))"
                ),
            )
            .into(),
        )),
    }
}

impl Pool {
    /// Runs `f` on a connection from the pool, the wait for the connection and `f`
    /// together ending by `until` (`f` gets what the checkout left: see
    /// [`Conn::within_conn`]); with `None`, the pool's own wait and the operation
    /// timeout `op` for `f`.
    pub(crate) fn run_by<T>(
        &self,
        until: Option<Instant>,
        op: Duration,
        f: impl FnOnce(&mut Conn) -> Result<T>,
    ) -> Result<T> {
        let mut conn = self.get(until.map(left_until))?;
        conn.within_conn(until.map_or(op, left_until), op, f)
    }

    /// Checks a connection out, waiting at most `timeout` (the pool's own wait when `None`).
    pub(crate) fn get(&self, timeout: Option<Duration>) -> Result<Conn> {
        match self {
            Pool::Own(p, m) => {
                let start = Instant::now();
                // (a pool's own timeout is bounded by the builder; a caller's may be huge)
                let deadline = deadline_in(timeout.unwrap_or_else(|| p.connection_timeout()));
                loop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match p.get_timeout(left.min(CHECKOUT_SLICE)) {
                        // a connection to a replaced primary is never handed out: r2d2
                        // discards it (`has_broken`) and the next one is tried
                        Ok(c) if c.is_stale() => drop(c),
                        // idle as long as one the server closed: likely closed too
                        Ok(mut c) if c.closed_while_idle() => c.close(),
                        Ok(c) if c.owes_reply() => {
                            return Ok(in_place_of_owing(p, m, c, timeout.map(|_| deadline)));
                        }
                        Ok(c) => return Ok(Conn::new(Checkout::Own(c), m.op_timeout)),
                        Err(e) => {
                            let failure = m.failure_since(start);
                            match failure {
                                // refused credentials or certificates, or no server
                                // there at all: waiting will not help; nor a server
                                // that did not answer within the connect timeout (a
                                // call waits about that long then, not the whole
                                // checkout timeout)
                                Some((f, timed_out))
                                    if timed_out || is_config_error(&f) || is_unreachable(&f) =>
                                {
                                    return Err(f);
                                }
                                _ if Instant::now() < deadline => {}
                                Some((f, _)) => return Err(f),
                                // no connection at all, and none failed: connecting hangs
                                None if p.state().connections == 0 => return Err(m.stalled()),
                                None => return Err(Error::Pool(e)),
                            }
                        }
                    }
                }
            }
            Pool::User(p, op) => {
                let c = if p.test_on_check_out() {
                    checkout_aside(p, timeout.unwrap_or_else(|| p.connection_timeout()))?
                } else {
                    match timeout {
                        Some(t) => p.get_timeout(t)?,
                        None => p.get()?,
                    }
                };
                c.io_within(Some(*op)).map_err(Error::Redis)?;
                Ok(Conn::new(Checkout::User(c), *op))
            }
        }
    }

    /// A connection for a call sent again after its pooled connection broke, its
    /// set-up ending by `deadline` (and within `connect_timeout`): a brand-new one of
    /// the client's own manager, outside the pool (none of the pool's idle ones, which
    /// the server may all have closed: an idle timeout, `CLIENT KILL`, a restart); from
    /// a pool the user gave, a new checkout (the pool dropped the broken connection).
    pub(crate) fn fresh(&self, deadline: Instant, connect_timeout: Duration) -> Result<Conn> {
        let left = left_until(deadline);
        match self {
            Pool::Own(_, m) => {
                let fresh = m.open_within(left.min(connect_timeout), Some(deadline))?;
                Ok(Conn::new(Checkout::Fresh(Box::new(fresh)), m.op_timeout))
            }
            Pool::User(..) => self.get(Some(left)),
        }
    }

    /// The server's address for messages (`host:port`, never a password).
    pub(crate) fn addr(&self) -> String {
        match self {
            Pool::Own(_, m) => m.addr(),
            Pool::User(..) => "the server of the given pool".to_owned(),
        }
    }

    /// Whether the pool's connections name a user but send no password (unknown, so
    /// `false`, for a pool given to `Client::from_pool`).
    pub(crate) fn lone_user(&self) -> bool {
        match self {
            Pool::Own(_, m) => m.connector.lone_user(),
            Pool::User(..) => false,
        }
    }

    /// The most connections the pool holds.
    pub(crate) fn max_size(&self) -> u32 {
        match self {
            Pool::Own(p, _) => p.max_size(),
            Pool::User(p, _) => p.max_size(),
        }
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("addr", &self.addr())
            .field("max_size", &self.max_size())
            .finish()
    }
}

impl IoTimeouts for Checkout {
    fn read_within(&self, d: Option<Duration>) -> redis::RedisResult<()> {
        match self {
            Checkout::Own(c) => c.read_within(d),
            Checkout::User(c) => c.read_within(d),
            Checkout::Fresh(c) => c.read_within(d),
        }
    }

    fn write_within(&self, d: Option<Duration>) -> redis::RedisResult<()> {
        match self {
            Checkout::Own(c) => c.write_within(d),
            Checkout::User(c) => c.write_within(d),
            Checkout::Fresh(c) => c.write_within(d),
        }
    }
}

impl Checkout {
    fn conn(&mut self) -> &mut dyn ConnectionLike {
        match self {
            Checkout::Own(c) => &mut **c,
            Checkout::User(c) => &mut **c,
            Checkout::Fresh(c) => &mut **c,
        }
    }

    fn conn_ref(&self) -> &dyn ConnectionLike {
        match self {
            Checkout::Own(c) => &**c,
            Checkout::User(c) => &**c,
            Checkout::Fresh(c) => &**c,
        }
    }

    /// The connection of the client's own manager (pooled or fresh); `None` for one
    /// of a pool the user gave.
    fn own(&self) -> Option<&RConn> {
        match self {
            Checkout::Own(c) => Some(c),
            Checkout::Fresh(c) => Some(c),
            Checkout::User(_) => None,
        }
    }

    fn own_mut(&mut self) -> Option<&mut RConn> {
        match self {
            Checkout::Own(c) => Some(c),
            Checkout::Fresh(c) => Some(c),
            Checkout::User(_) => None,
        }
    }
}

impl IoTimeouts for Conn {
    fn read_within(&self, d: Option<Duration>) -> redis::RedisResult<()> {
        self.checkout.read_within(d)
    }

    fn write_within(&self, d: Option<Duration>) -> redis::RedisResult<()> {
        self.checkout.write_within(d)
    }
}

impl Conn {
    fn new(checkout: Checkout, op: Duration) -> Conn {
        Conn {
            checkout,
            bound: None,
            op,
            cap: None,
        }
    }

    /// The cluster connection under this one, for commands routed by hand; while the
    /// handle lives, the cluster client's reconnects end by the end of the call
    /// [`within_conn`](Self::within_conn) runs, or one operation timeout from now
    /// ([`CallEnd`], as for every request through this connection).
    pub(crate) fn cluster(&mut self) -> Option<ClusterCall<'_>> {
        let end = self.bound.map_or_else(|| deadline_in(self.op), |b| b.end);
        match self.checkout.own_mut()? {
            RConn::Cluster(c, _) => Some(ClusterCall {
                conn: c,
                _end: CallEnd::start(end),
            }),
            RConn::Primary(_) => None,
        }
    }

    /// Whether it goes to a Sentinel service's primary since replaced (the pool never
    /// hands such a connection out; one held across the switch is, until it comes back,
    /// but refuses every request then: [`refuse_if_stale`](Self::refuse_if_stale)):
    /// for a caller that sends many requests on one checkout.
    pub(crate) fn is_stale(&self) -> bool {
        self.checkout.own().is_some_and(RConn::is_stale)
    }

    /// Refuses to send `cmd` (packed) when the connection goes to a Sentinel service's
    /// primary since replaced ([`PrimaryConn::refuse_if_stale`]): for callers that send
    /// on [`plain`](Self::plain) themselves (every request through this connection is
    /// checked so already).
    pub(crate) fn refuse_if_stale(&self, cmd: &[u8]) -> redis::RedisResult<()> {
        match self.checkout.own() {
            Some(RConn::Primary(p)) => p.refuse_if_stale(cmd),
            Some(RConn::Cluster(..)) | None => Ok(()),
        }
    }

    /// Notes that this connection's server answered `READONLY`: a Sentinel service's
    /// primary then counts as replaced ([`PrimaryConn::demoted`]). For callers that
    /// read replies on [`plain`](Self::plain) themselves; nothing for other servers.
    pub(crate) fn primary_demoted(&self) {
        if let Some(RConn::Primary(p)) = self.checkout.own() {
            p.demoted();
        }
    }

    /// The plain connection under this one, for a subscription; `None` on a cluster.
    pub(crate) fn plain(&mut self) -> Option<&mut redis::Connection> {
        match &mut self.checkout {
            Checkout::User(c) => Some(c),
            own => match own.own_mut()? {
                RConn::Primary(c) => Some(&mut c.conn),
                RConn::Cluster(..) => None,
            },
        }
    }

    /// Runs `f`, all of it ending within `budget`: its first request with read and write
    /// timeouts of `budget` when that is shorter than the operation timeout `op` by
    /// more than [`TIMEOUT_SLACK`], and each later one (a script sent by its text after
    /// `NOSCRIPT`, a second command) with what is left of it, the timeouts restored to
    /// `op` before the connection goes back to the pool. A reply that comes after a
    /// short timeout is skipped by the connection, so its next user does not read it
    /// (nor wait for it, while another connection can be had: [`in_place_of_owing`]).
    ///
    /// The slack spares the `setsockopt` calls (measured: a visible share of the
    /// client's CPU under contention) for a request that has spent almost nothing of
    /// its budget yet; it still ends by its deadline, as the operation timeout's socket
    /// timeout leaves the slack to spare ([`socket_timeout`](crate::clock::socket_timeout)).
    /// A call of one request, the hot path, sets no timeout at all. `f` gets the
    /// checked-out connection itself (to route a command on a cluster, say).
    pub(crate) fn within_conn<R>(
        &mut self,
        budget: Duration,
        op: Duration,
        f: impl FnOnce(&mut Conn) -> R,
    ) -> R {
        let budget = match (self.bound, self.cap) {
            (None, Some(cap)) => budget.min(left_until(cap)),
            _ => budget,
        }
        .max(Duration::from_millis(1));
        let outer = self.bound;
        let in_force = outer.map_or(op, |b| b.set);
        let mut bound = Bound {
            end: deadline_in(budget),
            set: in_force,
            slack: TIMEOUT_SLACK.min(op / 10),
        };
        if budget + bound.slack < in_force {
            let _ = self.io_within(Some(budget));
            bound.set = budget;
        }
        self.bound = Some(bound);
        // (each request, and each hand-routed cluster command, marks the call's end
        // for the cluster client: `tighten`, `cluster`)
        let result = f(self);
        let set = self.bound.map_or(in_force, |b| b.set);
        self.bound = outer;
        if set != in_force
            && let Err(e) = self.io_within(Some(in_force))
        {
            log::warn!("redis-semaphore: cannot restore a connection's timeouts: {e}");
        }
        result
    }

    /// When the call [`within_conn`](Self::within_conn) runs must end; `None` outside one.
    pub(crate) fn end(&self) -> Option<Instant> {
        self.bound.map(|b| b.end)
    }

    /// How long a reply to a request sent now may take, at most: what is left of the
    /// call [`within_conn`](Self::within_conn) runs, and no more than the timeout in
    /// force (a call's budget may be longer than the operation timeout, which its
    /// requests keep); `op` outside a call.
    pub(crate) fn room(&self, op: Duration) -> Duration {
        self.bound.map_or(op, |b| left_until(b.end).min(b.set))
    }

    /// Before a request: in a call [`within_conn`](Self::within_conn) runs, shortens
    /// the timeouts to what is left of the call's budget, unless that is within the
    /// slack of those in force; and marks when the request must end, the call's end or
    /// one operation timeout from now, for the steps the cluster client takes inside it
    /// (`node::NodeConn`).
    fn tighten(&mut self) -> CallEnd {
        match &mut self.bound {
            Some(b) => {
                let left = left_until(b.end);
                if left + b.slack < b.set {
                    let _ = self.checkout.io_within(Some(left));
                    b.set = left;
                }
                CallEnd::start(b.end)
            }
            None => match self.cap {
                // (the timeouts restored when the connection goes back: `Drop`)
                Some(cap) => {
                    let left = left_until(cap).max(Duration::from_millis(1));
                    if left + TIMEOUT_SLACK.min(self.op / 10) < self.op {
                        let _ = self.checkout.io_within(Some(left));
                    }
                    CallEnd::start(cap)
                }
                None => CallEnd::start(deadline_in(self.op)),
            },
        }
    }
}

/// A connection goes back to the pool idle from now ([`IdleCut`]); one with a cap,
/// whose timeouts a request may have shortened ([`Conn::tighten`]), with the operation
/// timeout's again.
impl Drop for Conn {
    fn drop(&mut self) {
        if let Checkout::Own(c) = &mut self.checkout
            && let RConn::Primary(p) = &mut **c
        {
            p.idle_since = Instant::now();
        }
        if self.cap.is_some()
            && let Err(e) = self.checkout.io_within(Some(self.op))
        {
            log::warn!("redis-semaphore: cannot restore a connection's timeouts: {e}");
        }
    }
}

/// A pooled cluster connection, borrowed for commands routed by hand ([`Conn::cluster`]).
pub(crate) struct ClusterCall<'a> {
    conn: &'a mut ClusterConn,
    _end: CallEnd,
}

impl Deref for ClusterCall<'_> {
    type Target = ClusterConn;
    fn deref(&self) -> &ClusterConn {
        self.conn
    }
}

impl DerefMut for ClusterCall<'_> {
    fn deref_mut(&mut self) -> &mut ClusterConn {
        self.conn
    }
}

impl Deref for Conn {
    type Target = dyn ConnectionLike;
    fn deref(&self) -> &(dyn ConnectionLike + 'static) {
        self
    }
}

impl DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut (dyn ConnectionLike + 'static) {
        self
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command(&mut self, cmd: &[u8]) -> redis::RedisResult<redis::Value> {
        let _end = self.tighten();
        self.checkout.conn().req_packed_command(cmd)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        let _end = self.tighten();
        self.checkout.conn().req_packed_commands(cmd, offset, count)
    }

    fn req_command(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        // (the inner connection's own: a cluster routes a `Cmd` without parsing its
        // packed bytes again)
        let _end = self.tighten();
        self.checkout.conn().req_command(cmd)
    }

    fn get_db(&self) -> i64 {
        self.checkout.conn_ref().get_db()
    }

    fn supports_pipelining(&self) -> bool {
        self.checkout.conn_ref().supports_pipelining()
    }

    fn check_connection(&mut self) -> bool {
        let _end = self.tighten();
        self.checkout.conn().check_connection()
    }

    fn is_open(&self) -> bool {
        self.checkout.conn_ref().is_open()
    }
}

/// Whether a failed command broke its connection (so another connection may work):
/// dropped or reset (the server closed it while it was idle, `CLIENT KILL`, a
/// restart), refused, another I/O error but a timeout; also a `READONLY` reply, from a
/// primary demoted in a failover (the script wrote nothing; the connection is dropped
/// and a new one goes to the new primary). A timeout is not: the request may still
/// run later, and the caller's time is spent anyway.
pub(crate) fn broken(e: &redis::RedisError) -> bool {
    e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_io_error() && !e.is_timeout()
        || crate::topology::is_read_only_error(e)
}

/// [`broken`] for a call's error, sorted ([`Error::Call`]) or not ([`Error::Redis`]).
pub(crate) fn broke_connection(e: &Error) -> bool {
    match e {
        Error::Redis(e) | Error::Call { source: e, .. } => broken(e),
        _ => false,
    }
}

/// `WAIT wanted timeout_ms` on `conn`, right after a write of it (a grant's or a
/// renewal's refresh, [`SemaphoreBuilder::wait_replicas`](crate::SemaphoreBuilder::wait_replicas)): how many replicas
/// acknowledged every write of the connection so far. On a cluster it goes to the
/// primary of the slot of `holders` (the semaphore's), not to every primary. It ends
/// within what is left of the call `conn` runs: the `WAIT` is shortened so that the
/// server's answer still comes within it ([`wait_ms_within`](crate::clock::wait_ms_within)). Errors come back
/// unsorted.
pub(crate) fn wait_acks(
    conn: &mut Conn,
    holders: &str,
    wanted: u32,
    timeout_ms: u64,
    op: Duration,
) -> Result<u32> {
    // what is left of this call when WAIT is sent: its read gets no more
    let call_end = conn.end();
    let left = || call_end.map_or(op, left_until);
    match conn.cluster() {
        Some(mut cluster) => {
            // the cluster connection's read timeout is a share of the operation's (one
            // per attempt): WAIT may block for its own, never past the call's end
            let share = per_attempt(op);
            let window = (Duration::from_millis(timeout_ms) + share).min(left());
            crate::scripts::leased::wait_replicas_at_within(
                &mut cluster,
                holders,
                wanted,
                timeout_ms,
                window,
                share,
            )
        }
        None => {
            let wait_ms = crate::clock::wait_ms_within(timeout_ms, conn.room(op));
            crate::scripts::leased::wait_replicas(conn, wanted, wait_ms)
        }
    }
}
