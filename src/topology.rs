//! Where the current primary is: one seam, [`Connector::connect`], used by the pool's
//! manager, the wake-up listener's own connection and the fresh-connection release.
//!
//! - [`Connector::Single`]: one server (plain, TLS or a Unix socket).
//! - [`Connector::Cluster`]: a Redis Cluster; the pool holds cluster connections,
//!   which route each command to its slot's node, and a plain connection (the wake-up
//!   listener's) goes to any node that answers, since a script's `PUBLISH` reaches a
//!   subscriber on every node.
//! - [`Connector::Sentinel`]: a service behind Redis Sentinel. A connection goes to the
//!   primary last known to this client (checked with `ROLE`), else to the one the
//!   sentinels name (asked in order, `SENTINEL MASTER` for the service's
//!   configuration epoch and `SENTINEL GET-MASTER-ADDR-BY-NAME` in one pipeline, then
//!   `ROLE` on the node). A watcher thread per client ([`Watcher`]) subscribes to
//!   `+switch-master` on one reachable sentinel; on a switch of our service it records
//!   the new primary, bumps a *generation*, and reads the switch's epoch from that
//!   sentinel.
//!
//! Invariants it keeps:
//!
//! - **No connection outlives its primary.** Every connection is tagged with the
//!   generation it was opened in ([`PrimaryConn`]); once the generation moves on, the
//!   pool never hands it out again and r2d2 discards it, and the listener re-subscribes
//!   on the new primary. A connection already checked out sends nothing more once the
//!   switch is learnt ([`PrimaryConn::refuse_if_stale`]: a call's second command, a
//!   script sent again by its text, fails as on a dropped connection). A command in
//!   flight at the moment of the switch may still reach the old primary; none is sent
//!   there after the watcher has seen the switch.
//! - **A missed switch is caught up.** After every (re)subscription the watcher reads
//!   the current primary again, since a switch may have happened while it was away.
//! - **No going back to a primary a sentinel has not seen replaced.** The client
//!   remembers the highest configuration epoch a sentinel reported with an answer it
//!   took (a failover raises it; a switch heard but whose epoch is not read yet counts
//!   as one more). An answer naming another node at a lower epoch is from a sentinel
//!   that has not learnt a failover the client knows of, and its node may still answer
//!   `ROLE` with `master` (cut off from the sentinels, nobody demoted it): it is
//!   refused and the next sentinel asked, whenever the lookup began (an answer asked
//!   for before a switch the client learnt meanwhile is refused too, see
//!   [`SentinelTarget::observe_since`]). Limits: a sentinel that refuses `SENTINEL
//!   MASTER` (an ACL user allowed only `GET-MASTER-ADDR-BY-NAME`) gives no epoch and
//!   its answer is taken as before; and when every sentinel of the URL that can be
//!   asked names the same node at the same lower epoch, and those are a majority of
//!   the URL's sentinels (the others down or unreachable), that is taken as the
//!   sentinels' configuration set anew by an operator (`SENTINEL REMOVE` + `MONITOR`
//!   starts the epoch again at 0), so a majority of the URL's sentinels all behind,
//!   with the others unreachable, is not guarded.
//! - **Errors name what failed, never a password.** Sentinel addresses and the service
//!   are named; credentials never appear in a message.
//!
//! Before the switch is announced (a forced failover promotes the replica about a
//! second before `+switch-master`) the old primary still answers `ROLE` with `master`:
//! no client can tell, so writes in that window are lost with the old primary's data.
//! `wait_replicas` and the server's `min-replicas-to-write` bound that window.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::clock::{IoTimeouts, deadline_in, left_until, pubsub_read_within};
use crate::connect::{Endpoint, HostPort, NodeTls, connect_within, is_lone_user, with_credentials};
use crate::error::{reply_code, server_code};
use crate::threads::stopped;
use redis::io::tcp::TcpSettings;
use redis::{ConnectionAddr, ErrorKind, IntoConnectionInfo, RedisConnectionInfo, RedisError};

/// The channel on which sentinels announce a new primary.
const SWITCH_CHANNEL: &str = "+switch-master";
/// How long one read of the watcher's subscription may block: bounds how late it sees
/// that it must stop.
const POLL: Duration = Duration::from_millis(100);
/// A PING after this much silence finds a half-open connection to a sentinel.
const HEARTBEAT: Duration = Duration::from_secs(3);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Opens connections to the current primary.
#[derive(Clone)]
pub(crate) enum Connector {
    /// One server (plain, TLS or a Unix socket).
    Single(Box<Endpoint>),
    /// A Sentinel service.
    Sentinel(Arc<SentinelTarget>),
    /// A Redis Cluster: the pool holds cluster connections; plain connections (the
    /// wake-up listener's) go to any node that answers.
    Cluster(Arc<ClusterSource>),
}

/// A Redis Cluster: the cluster client (slot map, redirections, retries) and the seed
/// nodes, for the plain connections the wake-up listener needs.
pub(crate) struct ClusterSource {
    pub(crate) client: redis::cluster::ClusterClient,
    /// A cluster client like `client` whose connection's set-up and first command end
    /// within about the given budget (a share of it per step, no retries): for a call
    /// with a deadline of its own on a brand-new connection (a release resent after a
    /// dropped connection, which a drop bounds by the operation timeout), where
    /// `client`'s connect timeout per seed could outlast the deadline.
    pub(crate) within:
        Box<dyn Fn(Duration) -> redis::RedisResult<redis::cluster::ClusterClient> + Send + Sync>,
    pub(crate) nodes: Vec<redis::ConnectionInfo>,
    /// "cluster h1:p1,h2:p2" (never a password): what messages name.
    pub(crate) addr: String,
    pub(crate) tls: bool,
    pub(crate) has_password: bool,
    /// The seed the next plain connection tries first: rotates, so that a listener
    /// whose node failed subscribes on another.
    pub(crate) next: std::sync::atomic::AtomicUsize,
}

impl ClusterSource {
    /// Whether the nodes are given a user name without a password ([`is_lone_user`]).
    pub(crate) fn lone_user(&self) -> bool {
        self.nodes
            .first()
            .is_some_and(|n| is_lone_user(n.redis_settings()))
    }

    /// A plain connection to one reachable node: the seeds in turn, starting after the
    /// one used last.
    fn plain(&self, timeout: Duration) -> redis::RedisResult<redis::Connection> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut last = None;
        for k in 0..self.nodes.len() {
            let info = self.nodes[(start + k) % self.nodes.len()].clone();
            match redis::Client::open(info).and_then(|c| connect_within(&c, timeout)) {
                Ok(conn) => return Ok(conn),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| RedisError::from((ErrorKind::Client, "no cluster node given"))))
    }
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Connector::Single(ep) => write!(f, "Single({})", ep.addr),
            Connector::Sentinel(t) => write!(f, "Sentinel({})", t.describe()),
            Connector::Cluster(c) => write!(f, "Cluster({})", c.addr),
        }
    }
}

/// Whether a reply is a `READONLY` error: the node is a replica (see
/// [`PrimaryConn::checked`]).
pub(crate) fn is_read_only(v: &redis::Value) -> bool {
    matches!(v, redis::Value::ServerError(e) if is_read_only_reply(e))
}

/// [`is_read_only`] for the error of a reply.
pub(crate) fn is_read_only_reply(e: &redis::ServerError) -> bool {
    reply_code(e) == "READONLY"
}

/// [`is_read_only`] for an error.
pub(crate) fn is_read_only_error(e: &RedisError) -> bool {
    server_code(e) == Some("READONLY")
}

/// A connection with the generation of the primary it was opened for.
pub(crate) struct PrimaryConn {
    pub(crate) conn: redis::Connection,
    generation: u64,
    target: Option<Arc<SentinelTarget>>,
    /// The node a Sentinel service's connection goes to, for messages.
    node: Option<(String, u16)>,
    /// Set when a reply could not be parsed: the rest of it is still in the stream,
    /// so every later reply would be read out of step; the pool drops the connection.
    /// Also set on a connection that owes a reply, passed over by a checkout that
    /// found another (`pool::in_place_of_owing`).
    pub(crate) desynced: bool,
    /// Set when a request got no reply in time, cleared by the next reply read: the
    /// connection still owes that reply (the `redis` connection skips it when it
    /// comes), so a request sent on it waits for it first. A checkout passes such a
    /// connection over while another can be had ([`Pool::get`](crate::pool::Pool::get)).
    pub(crate) owes_reply: bool,
    /// When it last went back to the pool (or was opened): how long it has been idle
    /// ([`IdleCut`]).
    pub(crate) idle_since: Instant,
    /// For a connection of the client's own pool, the pool's record of how long an idle
    /// connection was when the server was found to have closed it.
    pub(crate) idle_cut: Option<Arc<IdleCut>>,
}

/// What the client's own pool learnt of connections the server closed while they were
/// idle (Redis's `timeout`, an idle cut of a load balancer or a cloud service, `CLIENT
/// KILL`, a restart): a pooled connection whose request failed so
/// ([`closed_under`], noted by [`PrimaryConn::checked`]) had been idle since some instant, and every connection of the
/// pool idle since then or longer is likely closed as well (the same idle cut; all of
/// them at a kill or a restart). A checkout passes those over and the pool drops them
/// ([`Pool::get`](crate::pool::Pool::get)), so that the calls after the first do not each meet one of them
/// (and send again on a fresh connection, [`Shared::run_resending`](
/// crate::shared::Shared::run_resending)): no round trip, a clock read when a
/// connection goes back to the pool and an atomic read at each checkout.
///
/// Measured (`timeout 1`, 16 pooled connections closed while idle, loopback, debug
/// build): 32 calls one after the other sent 16 of them again without the cut (each
/// about 350 µs instead of 150 µs: a connect more), 1 or 2 with it (2 when two
/// connections went back to the pool in the other order than they were stamped); 16
/// threads calling at once, 16 without and 1 or 2 with it.
#[derive(Debug)]
pub(crate) struct IdleCut {
    /// The instant the times below count from.
    base: Instant,
    /// Nanoseconds from `base` to the latest idle start of a connection found closed,
    /// plus one (0: none found).
    cut_ns: AtomicU64,
}

impl IdleCut {
    pub(crate) fn new() -> IdleCut {
        IdleCut {
            base: Instant::now(),
            cut_ns: AtomicU64::new(0),
        }
    }

    fn ns(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }

    /// A connection idle since `idle_since` was found closed.
    fn note(&self, idle_since: Instant) {
        self.cut_ns
            .fetch_max(self.ns(idle_since), Ordering::Relaxed);
    }

    /// Whether a connection idle since `idle_since` has been idle at least as long as
    /// one found closed.
    pub(crate) fn covers(&self, idle_since: Instant) -> bool {
        self.ns(idle_since) <= self.cut_ns.load(Ordering::Relaxed)
    }
}

/// Whether a request's error says the server closed the connection (not a timeout,
/// nor a `READONLY` reply, which [`broken`](crate::pool::broken) counts too): what [`IdleCut`] learns from.
fn closed_under(e: &redis::RedisError) -> bool {
    e.is_connection_dropped() || e.is_io_error() && !e.is_timeout()
}

impl PrimaryConn {
    /// Whether the primary this connection was opened for has been replaced since.
    pub(crate) fn is_stale(&self) -> bool {
        self.target
            .as_ref()
            .is_some_and(|t| t.generation() != self.generation)
    }

    /// Refuses a request about to be sent on this connection (`cmd`, packed) once its
    /// primary has been replaced: a connection checked out before the switch was
    /// learnt would otherwise send a call's later commands (a script sent again by its
    /// text after `NOSCRIPT`, `WAIT` after a grant, a transaction after the book's
    /// lock) to the old primary. Nothing is sent; the error is a dropped connection's
    /// (retryable, and the caller takes the path of a request whose reply was lost:
    /// whatever it owes is cleaned up on a connection to the new primary), naming the
    /// command and the node.
    pub(crate) fn refuse_if_stale(&self, cmd: &[u8]) -> redis::RedisResult<()> {
        if !self.is_stale() {
            return Ok(());
        }
        let node = self.node.as_ref().map_or_else(
            || "the old primary".to_owned(),
            |n| HostPort::of(n).to_string(),
        );
        let service = self
            .target
            .as_ref()
            .map_or_else(String::new, |t| format!(" of {}", t.describe()));
        Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            format!(
                "{} not sent to {node}: that primary{service} was replaced (a Sentinel \
                 switch learnt while this connection was in use); nothing was sent, a new \
                 connection goes to the new primary",
                command_name(cmd)
            ),
        )))
    }

    /// Passes a reply on, noting what makes the connection unusable: a reply that
    /// could not be parsed (the rest of it is still in the stream), or a `READONLY`
    /// error from a Sentinel service's primary, which is then a replica (it was
    /// demoted in a failover whose `+switch-master` the watcher has not heard, or never
    /// will: it was cut off from the sentinels, or they were re-pointed by hand). That
    /// marks its generation as replaced ([`SentinelTarget::demoted`]): every
    /// connection to it is dropped at once, and the next one asks the sentinels. A
    /// connection the server had closed while it was idle is noted in the pool's
    /// [`IdleCut`]. (Redis error replies come back as `Ok(Value::ServerError)`.)
    pub(crate) fn checked<T: AsRef<[redis::Value]>>(
        &mut self,
        result: redis::RedisResult<T>,
    ) -> redis::RedisResult<T> {
        self.owes_reply = matches!(&result, Err(e) if e.is_timeout());
        let read_only = match &result {
            Ok(values) => values.as_ref().iter().any(is_read_only),
            Err(e) => {
                if e.kind() == ErrorKind::Parse {
                    self.desynced = true;
                }
                if closed_under(e)
                    && let Some(cut) = &self.idle_cut
                {
                    cut.note(self.idle_since);
                }
                is_read_only_error(e)
            }
        };
        if read_only {
            self.demoted();
        }
        result
    }

    /// Notes that this connection's primary answered `READONLY` (see
    /// [`checked`](Self::checked)), for a caller that reads the replies itself.
    pub(crate) fn demoted(&self) {
        if let Some(t) = &self.target {
            t.demoted(self.generation);
        }
    }

    /// [`is_stale`](Self::is_stale) as a check that does not borrow the connection.
    pub(crate) fn stale_check(&self) -> impl Fn() -> bool + Send + 'static + use<> {
        let target = self.target.clone();
        let generation = self.generation;
        move || {
            target
                .as_ref()
                .is_some_and(|t| t.generation() != generation)
        }
    }
}

/// The name of the first command in `cmd` (a packed command or pipeline), for
/// messages: `EVAL`, `WAIT`; "a command" when it cannot be read.
pub(crate) fn command_name(cmd: &[u8]) -> String {
    // *<args>\r\n$<len>\r\n<name>\r\n...
    let name = (|| {
        let rest = cmd.strip_prefix(b"*")?;
        let rest = &rest[rest.windows(2).position(|w| w == b"\r\n")? + 2..];
        let rest = rest.strip_prefix(b"$")?;
        let end = rest.windows(2).position(|w| w == b"\r\n")?;
        let len: usize = std::str::from_utf8(&rest[..end]).ok()?.parse().ok()?;
        let name = rest.get(end + 2..end + 2 + len.min(32))?;
        let name = std::str::from_utf8(name).ok()?;
        (!name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic()))
            .then(|| name.to_ascii_uppercase())
    })();
    name.unwrap_or_else(|| "a command".to_owned())
}

impl std::ops::Deref for PrimaryConn {
    type Target = redis::Connection;
    fn deref(&self) -> &redis::Connection {
        &self.conn
    }
}

impl std::ops::DerefMut for PrimaryConn {
    fn deref_mut(&mut self) -> &mut redis::Connection {
        &mut self.conn
    }
}

impl Connector {
    /// A connection to the current primary, opened within `timeout` per attempt (a
    /// Sentinel target may try the primary it knows, then ask each sentinel in turn and
    /// try the primary named), and with all attempts ending by `by` when given: a
    /// caller with a deadline (a release sent again on a fresh connection, a wait's
    /// subscription) must not wait one timeout per step.
    pub(crate) fn connect(
        &self,
        timeout: Duration,
        by: Option<Instant>,
    ) -> redis::RedisResult<PrimaryConn> {
        match self {
            Connector::Single(ep) => Ok(PrimaryConn {
                conn: connect_within(&ep.client, step(timeout, by).unwrap_or(MIN_STEP))?,
                generation: 0,
                target: None,
                node: None,
                desynced: false,
                owes_reply: false,
                idle_since: Instant::now(),
                idle_cut: None,
            }),
            Connector::Cluster(c) => Ok(PrimaryConn {
                conn: c.plain(step(timeout, by).unwrap_or(MIN_STEP))?,
                generation: 0,
                target: None,
                node: None,
                desynced: false,
                owes_reply: false,
                idle_since: Instant::now(),
                idle_cut: None,
            }),
            Connector::Sentinel(t) => {
                let (conn, generation, node) = t.connect(timeout, by)?;
                Ok(PrimaryConn {
                    conn,
                    generation,
                    target: Some(Arc::clone(t)),
                    node: Some(node),
                    desynced: false,
                    owes_reply: false,
                    idle_since: Instant::now(),
                    idle_cut: None,
                })
            }
        }
    }

    /// What messages name: the server's address, or the service and its sentinels.
    pub(crate) fn addr(&self) -> String {
        match self {
            Connector::Single(ep) => ep.addr.clone(),
            Connector::Sentinel(t) => t.describe(),
            Connector::Cluster(c) => c.addr.clone(),
        }
    }

    /// The database connections select (0: the default; a cluster has only 0).
    pub(crate) fn db(&self) -> i64 {
        match self {
            Connector::Single(ep) => ep.client.get_connection_info().redis_settings().db(),
            Connector::Sentinel(t) => t.data.db(),
            Connector::Cluster(_) => 0,
        }
    }

    /// Whether connections use TLS.
    pub(crate) fn is_tls(&self) -> bool {
        match self {
            Connector::Single(ep) => ep.tls,
            Connector::Sentinel(t) => t.is_tls(),
            Connector::Cluster(c) => c.tls,
        }
    }

    /// Whether this is a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Connector::Cluster(_))
    }

    /// Whether a password is sent on connect (when none is, the manager checks with a
    /// `PING` that the server does not require one).
    pub(crate) fn has_password(&self) -> bool {
        match self {
            Connector::Single(ep) => ep.has_password,
            Connector::Sentinel(t) => t.data.password().is_some(),
            Connector::Cluster(c) => c.has_password,
        }
    }

    /// Whether connections name a user but send no password ([`is_lone_user`]), for
    /// the hint of a `NOAUTH`.
    pub(crate) fn lone_user(&self) -> bool {
        match self {
            Connector::Single(ep) => is_lone_user(ep.client.get_connection_info().redis_settings()),
            Connector::Sentinel(t) => is_lone_user(&t.data),
            Connector::Cluster(c) => c.lone_user(),
        }
    }

    /// The Sentinel target, if this is one.
    pub(crate) fn sentinel(&self) -> Option<&Arc<SentinelTarget>> {
        match self {
            Connector::Single(_) | Connector::Cluster(_) => None,
            Connector::Sentinel(t) => Some(t),
        }
    }
}

/// The least time one connect step is given.
const MIN_STEP: Duration = Duration::from_millis(1);

/// How long the next connect step may take: `timeout`, and no later than `by`
/// (`None`: `by` has passed).
fn step(timeout: Duration, by: Option<Instant>) -> Option<Duration> {
    match by {
        None => Some(timeout),
        Some(by) => {
            let left = by.saturating_duration_since(Instant::now());
            (!left.is_zero()).then(|| left.min(timeout).max(MIN_STEP))
        }
    }
}

/// A password: its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(pub(crate) String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A Sentinel service as its URL names it (`redis+sentinel://[user:pass@]h1:26379,
/// h2:26379/SERVICE[/DB]`, or `rediss+sentinel://`: sentinels and data nodes over TLS;
/// parsed in `connect.rs`), with the data nodes' credentials.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    /// Whether the sentinels and the data nodes speak TLS (`rediss+sentinel://`).
    pub(crate) tls: bool,
    pub(crate) sentinels: Vec<(String, u16)>,
    pub(crate) service: String,
    pub(crate) db: i64,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
}

impl std::fmt::Debug for SentinelUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelUrl")
            .field("tls", &self.tls)
            .field("sentinels", &self.sentinels)
            .field("service", &self.service)
            .field("db", &self.db)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// A Sentinel service: the sentinels, the credentials for them and for the data
/// nodes, the primary last known and its generation.
pub(crate) struct SentinelTarget {
    service: String,
    sentinels: Vec<(String, u16)>,
    /// AUTH for the sentinels.
    sentinel_auth: RedisConnectionInfo,
    /// AUTH and SELECT for the data nodes.
    data: RedisConnectionInfo,
    /// TLS toward the sentinels and the data nodes (`rediss+sentinel://`), with the
    /// builder's certificates.
    tls: Option<NodeTls>,
    /// The primary last known (its generation is `generation`), how many times it was
    /// set to another address (see [`observe_since`](Self::observe_since)) and the
    /// service's configuration epoch known with it.
    primary: parking_lot::Mutex<Known>,
    generation: AtomicU64,
}

/// What a client knows of a Sentinel service's primary.
#[derive(Clone, Default)]
struct Known {
    /// The primary last known.
    addr: Option<(String, u16)>,
    /// How many times `addr` was set to another address.
    learnt: u64,
    /// The highest configuration epoch of the service (`SENTINEL MASTER`'s
    /// `config-epoch`) a sentinel reported in an answer this client took. A failover
    /// raises it, and a sentinel reports it together with the primary of that
    /// epoch; only an operator's `SENTINEL REMOVE` + `MONITOR` sets it back.
    epoch: Option<u64>,
    /// `addr` was learnt from a `+switch-master` message, and no sentinel has yet
    /// reported an epoch with it: the service's epoch is then above `epoch`.
    unverified: bool,
}

impl Known {
    /// `Some(bar)` when an answer naming `addr` at configuration epoch `epoch`
    /// predates what this client knows: it names another node than the primary
    /// known, at an epoch below `bar` (the epoch known, one more while a switch is
    /// unverified). Such a sentinel has not learnt a failover this client knows of,
    /// and its node may still answer `ROLE` with `master` (it was cut off from the
    /// sentinels, so nobody demoted it). An answer without an epoch (a sentinel
    /// that refuses `SENTINEL MASTER`) is never refused here.
    fn behind(&self, addr: &(String, u16), epoch: Option<u64>) -> Option<u64> {
        // (saturating: an odd sentinel may report the highest epoch there is)
        let bar = self.epoch?.saturating_add(u64::from(self.unverified));
        let epoch = epoch?;
        (self.addr.as_ref() != Some(addr) && epoch < bar).then_some(bar)
    }
}

/// A sentinel's answer: the primary's address, and the service's configuration epoch
/// when the sentinel reports it.
type Answer = ((String, u16), Option<u64>);

impl SentinelTarget {
    /// A target for `url`, with separate credentials for the sentinels, and TLS toward
    /// the sentinels and the data nodes when `tls` is set.
    pub(crate) fn new(
        url: SentinelUrl,
        sentinel_username: Option<String>,
        sentinel_password: Option<Secret>,
        tls: Option<NodeTls>,
    ) -> SentinelTarget {
        let data = with_credentials(
            RedisConnectionInfo::default().set_db(url.db),
            url.username.as_deref(),
            url.password.as_deref(),
        );
        let sentinel_auth = with_credentials(
            RedisConnectionInfo::default(),
            sentinel_username.as_deref(),
            sentinel_password.as_ref().map(|Secret(p)| p.as_str()),
        );
        SentinelTarget {
            service: url.service,
            sentinels: url.sentinels,
            sentinel_auth,
            data,
            tls,
            primary: parking_lot::Mutex::new(Known::default()),
            generation: AtomicU64::new(0),
        }
    }

    /// Whether the sentinels and the data nodes are reached over TLS.
    pub(crate) fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The address of a sentinel or data node: TLS (with the certificates) or plain.
    fn node_addr(&self, host: &str, port: u16) -> ConnectionAddr {
        match &self.tls {
            Some(tls) => tls.addr(host, port),
            None => ConnectionAddr::Tcp(host.to_owned(), port),
        }
    }

    /// The generation of the primary: moves on at every switch.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// "service "S" via h1:p1,h2:p2" (no credentials; "via TLS sentinels" over TLS).
    pub(crate) fn describe(&self) -> String {
        let tls = if self.is_tls() { "TLS sentinels " } else { "" };
        format!(
            "service {:?} via {tls}{}",
            self.service,
            self.sentinel_list()
        )
    }

    fn sentinel_list(&self) -> String {
        self.sentinels
            .iter()
            .map(|n| HostPort::of(n).to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Records `addr` as the primary, announced by a `+switch-master` message (which
    /// carries no epoch: the switch stays unverified until a sentinel reports an
    /// epoch with it); a change of a known primary bumps the generation.
    fn observe(&self, addr: (String, u16)) -> u64 {
        let mut known = self.primary.lock();
        let learnt = known.learnt;
        Self::record(&mut known, addr, None, &self.service, &self.generation);
        if known.learnt != learnt {
            // a switch raises the service's epoch above the one known
            known.unverified = known.epoch.is_some();
        }
        self.generation()
    }

    /// [`observe`](Self::observe) for a sentinel's answer (at configuration epoch
    /// `epoch`, when it reports one) asked for when the primary had been set `learnt`
    /// times. Nothing is recorded and `None` returned when the answer may predate
    /// what the client knows, as recording it would undo a switch (every connection
    /// to the new primary dropped, the old one used again until it is demoted):
    ///
    /// - the primary was set again since (by the watcher, which heard a switch, or by
    ///   another connection's lookup) to another address than `addr`;
    /// - the answer names another address at an epoch below the one known
    ///   ([`Known::behind`]): the sentinel has not learnt a switch this client knows
    ///   of, whenever the lookup began.
    fn observe_since(&self, addr: (String, u16), epoch: Option<u64>, learnt: u64) -> Option<u64> {
        let mut known = self.primary.lock();
        if (known.learnt != learnt && known.addr.as_ref() != Some(&addr))
            || known.behind(&addr, epoch).is_some()
        {
            return None;
        }
        Self::record(&mut known, addr, epoch, &self.service, &self.generation);
        Some(self.generation())
    }

    /// [`observe_since`](Self::observe_since) for the answer every sentinel that
    /// answers gives at the same epoch below the one known (sentinels re-pointed by
    /// hand): the epoch known is set back to `epoch` and the primary recorded in one
    /// step, unless the primary was learnt anew since the lookup began. `Some` with the
    /// generation and whether the epoch was set back.
    fn observe_reset(&self, addr: (String, u16), epoch: u64, learnt: u64) -> Option<(u64, bool)> {
        let mut known = self.primary.lock();
        if known.learnt != learnt && known.addr.as_ref() != Some(&addr) {
            return None;
        }
        let reset = known.behind(&addr, Some(epoch)).is_some();
        if reset {
            known.epoch = Some(epoch);
            known.unverified = false;
        }
        Self::record(
            &mut known,
            addr,
            Some(epoch),
            &self.service,
            &self.generation,
        );
        Some((self.generation(), reset))
    }

    /// The `Some(bar)` of [`Known::behind`] for this answer, now.
    fn behind(&self, addr: &(String, u16), epoch: Option<u64>) -> Option<u64> {
        self.primary.lock().behind(addr, epoch)
    }

    fn record(
        known: &mut Known,
        addr: (String, u16),
        epoch: Option<u64>,
        service: &str,
        generation: &AtomicU64,
    ) {
        match known.addr.as_ref() {
            Some(a) if *a == addr => {}
            Some(_) => {
                log::warn!(
                    "redis-semaphore: the primary of sentinel service {service:?} is now {}; \
                     connections to the old one are dropped",
                    HostPort::of(&addr)
                );
                known.addr = Some(addr);
                known.learnt += 1;
                generation.fetch_add(1, Ordering::AcqRel);
            }
            None => {
                known.addr = Some(addr);
                known.learnt += 1;
            }
        }
        if let Some(e) = epoch {
            known.epoch = Some(known.epoch.map_or(e, |k| k.max(e)));
            known.unverified = false;
        }
    }

    /// Marks the primary of `generation` as replaced, because a connection to it was
    /// refused a write (`READONLY`): the generation moves on (once, whichever of its
    /// connections reports it), so every connection to that node counts as stale, the
    /// listener subscribes again, and the next connection checks `ROLE` on the node
    /// last known and, as it is no primary, asks the sentinels.
    fn demoted(&self, generation: u64) {
        if self
            .generation
            .compare_exchange(
                generation,
                generation + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            let primary = self.primary.lock().addr.clone();
            log::warn!(
                "redis-semaphore: the primary of sentinel service {:?}{} refused a write \
                 (READONLY): it is a replica now; asking the sentinels again",
                self.service,
                primary.map_or(String::new(), |n| format!(", {},", HostPort::of(&n)))
            );
        }
    }

    fn sentinel_conn(
        &self,
        node: &(String, u16),
        timeout: Duration,
    ) -> redis::RedisResult<redis::Connection> {
        self.node_conn(node, self.sentinel_auth.clone(), timeout)
    }

    /// A connection to `node` with `settings`, opened within `timeout`, and with its
    /// timeouts set to what is left of it: the step's command that follows (`ROLE`, the
    /// `SENTINEL` query, the watcher's `SUBSCRIBE`) ends within `timeout` of the start
    /// too, not a whole `timeout` after a slow connect (a step took up to twice its
    /// share, and a release's fresh connection could end that much after its deadline).
    fn node_conn(
        &self,
        (host, port): &(String, u16),
        settings: redis::RedisConnectionInfo,
        timeout: Duration,
    ) -> redis::RedisResult<redis::Connection> {
        let step_end = deadline_in(timeout);
        let info = self
            .node_addr(host, *port)
            .into_connection_info()?
            .set_redis_settings(settings)
            .set_tcp_settings(TcpSettings::default().set_nodelay(true));
        let conn = connect_within(&redis::Client::open(info)?, timeout)?;
        conn.io_within(Some(left_until(step_end)))?;
        Ok(conn)
    }

    /// Asks one sentinel where the primary is, with the service's configuration epoch
    /// when it reports it (`None`: it does not know the service; see [`ask_on`]).
    fn ask(
        &self,
        sentinel: &(String, u16),
        timeout: Duration,
    ) -> redis::RedisResult<Option<Answer>> {
        let mut conn = self.sentinel_conn(sentinel, timeout)?;
        ask_on(&mut conn, &self.service)
    }

    /// A connection to `addr` if it is a primary now (`ROLE` says `master`).
    fn open_primary(
        &self,
        node: &(String, u16),
        timeout: Duration,
    ) -> redis::RedisResult<redis::Connection> {
        let mut conn = self.node_conn(node, self.data.clone(), timeout)?;
        let role: redis::Value = redis::cmd("ROLE").query(&mut conn)?;
        let first = match &role {
            redis::Value::Array(items) => items.first(),
            _ => None,
        };
        let is_master = matches!(
            first,
            Some(redis::Value::BulkString(b)) if b.as_slice() == b"master"
        ) || matches!(first, Some(redis::Value::SimpleString(s)) if s == "master");
        if !is_master {
            return Err(RedisError::from((
                ErrorKind::Client,
                "not a primary",
                format!(
                    "{}, named primary of sentinel service {:?}, answers ROLE with {role:?}",
                    HostPort::of(node),
                    self.service
                ),
            )));
        }
        Ok(conn)
    }

    /// A connection to the current primary, the generation it belongs to and the
    /// node's address: each
    /// step (the primary last known, each sentinel, the primary it names) within
    /// `timeout`, and all of them by `by` when given.
    fn connect(
        &self,
        timeout: Duration,
        by: Option<Instant>,
    ) -> redis::RedisResult<(redis::Connection, u64, (String, u16))> {
        let generation = self.generation();
        let Known {
            addr: known,
            learnt,
            ..
        } = self.primary.lock().clone();
        let mut tried = Vec::new();
        let mut failed = None;
        let out_of_time = |tried: &[String]| {
            RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "service {:?}: no primary reached by the call's deadline{}{}",
                    self.service,
                    if tried.is_empty() { "" } else { ": " },
                    tried.join("; ")
                ),
            ))
        };
        if let Some(addr) = known {
            let Some(timeout) = step(timeout, by) else {
                return Err(out_of_time(&tried));
            };
            match self.open_primary(&addr, timeout) {
                Ok(conn) => return Ok((conn, generation, addr)),
                Err(e) if is_refused_credentials(&e) => return Err(self.refused(&addr, &e)),
                Err(e) => {
                    tried.push(format!("known primary {}: {e}", HostPort::of(&addr)));
                    failed = Some(addr);
                }
            }
        }
        let mut unknown = 0;
        // sentinels that could not be asked (down, unreachable, refusing our credentials)
        let mut unreachable = 0;
        // answers refused as behind the epoch known
        let mut behind: Vec<Answer> = Vec::new();
        for s in &self.sentinels {
            let Some(t) = step(timeout, by) else {
                return Err(out_of_time(&tried));
            };
            let answer = self.ask(s, t);
            // a sentinel that has not learnt a switch this client knows of: its
            // primary may still answer ROLE with master (cut off from the sentinels)
            if let Ok(Some((addr, Some(epoch)))) = &answer
                && let Some(bar) = self.behind(addr, Some(*epoch))
            {
                tried.push(format!(
                    "sentinel {} names {} at configuration epoch {epoch}, older than the \
                     epoch {bar} known to this client: it has not learnt a failover yet",
                    HostPort::of(s),
                    HostPort::of(addr)
                ));
                behind.push((addr.clone(), Some(*epoch)));
                continue;
            }
            match answer {
                // just failed: not worth a second connect timeout
                Ok(Some((addr, _))) if failed.as_ref() == Some(&addr) => tried.push(format!(
                    "sentinel {} names the same {}",
                    HostPort::of(s),
                    HostPort::of(&addr)
                )),
                Ok(Some((addr, epoch))) => match step(timeout, by)
                    .ok_or_else(|| out_of_time(&tried))
                    .and_then(|t| self.open_primary(&addr, t))
                {
                    Ok(conn) => match self.observe_since(addr.clone(), epoch, learnt) {
                        Some(generation) => return Ok((conn, generation, addr)),
                        // the primary was learnt anew since this lookup began (a
                        // switch), or a higher epoch: the answer may be from before it
                        None => {
                            drop(conn);
                            // (the generation first: a switch in between leaves the
                            // connection stale, never one to the old primary current)
                            let generation = self.generation();
                            let now_known = self.primary.lock().addr.clone();
                            tried.push(format!(
                                "sentinel {} names {}, but {} was learnt meanwhile",
                                HostPort::of(s),
                                HostPort::of(&addr),
                                now_known.as_ref().map_or("another".to_owned(), |n| {
                                    HostPort::of(n).to_string()
                                })
                            ));
                            if let (Some(node), Some(t)) = (now_known, step(timeout, by)) {
                                match self.open_primary(&node, t) {
                                    Ok(conn) => return Ok((conn, generation, node)),
                                    Err(e) if is_refused_credentials(&e) => {
                                        return Err(self.refused(&node, &e));
                                    }
                                    Err(e) => {
                                        tried.push(format!("primary {}: {e}", HostPort::of(&node)))
                                    }
                                }
                            }
                        }
                    },
                    // the primary refused the data nodes' credentials: asking the other
                    // sentinels cannot help, and the caller must not take it for an
                    // outage (nor wait out its checkout timeout)
                    Err(e) if is_refused_credentials(&e) => return Err(self.refused(&addr, &e)),
                    Err(e) => tried.push(format!(
                        "sentinel {} names {}: {e}",
                        HostPort::of(s),
                        HostPort::of(&addr)
                    )),
                },
                Ok(None) => {
                    unknown += 1;
                    tried.push(format!(
                        "sentinel {} does not know the service",
                        HostPort::of(s)
                    ));
                }
                Err(e) => {
                    unreachable += 1;
                    tried.push(format!("sentinel {}: {e}", HostPort::of(s)))
                }
            }
        }
        // every sentinel that could be asked answered with the same node at the same
        // older epoch, and they are a majority of the URL's: no sentinel that answers
        // knows the epoch this client learnt from one of them, which only an
        // operator's SENTINEL REMOVE + MONITOR does (it starts the epoch again at 0).
        // Their answer is the service's configuration now. (A sentinel that cannot be
        // asked, one of a set that is down for good, say, does not disagree: requiring
        // its answer too locked the client out until it came back.)
        if behind.len() + unreachable == self.sentinels.len()
            && behind.len() * 2 > self.sentinels.len()
            && let Some(((addr, Some(epoch)), rest)) = behind.split_first()
            && rest.iter().all(|a| *a == (addr.clone(), Some(*epoch)))
            && let Some(t) = step(timeout, by)
        {
            // (the epoch known is lowered only together with recording the primary,
            // once a connection to it is open: a failed connect leaves the guard as it
            // was)
            match self.open_primary(addr, t) {
                Ok(conn) => {
                    if let Some((generation, reset)) =
                        self.observe_reset(addr.clone(), *epoch, learnt)
                    {
                        if reset {
                            log::warn!(
                                "redis-semaphore: every sentinel of service {:?} that answers \
                                 names {} at configuration epoch {epoch}, older than the one \
                                 this client knew: taken as the sentinels' configuration set \
                                 anew",
                                self.service,
                                HostPort::of(addr)
                            );
                        }
                        return Ok((conn, generation, addr.clone()));
                    }
                    tried.push(format!(
                        "every sentinel names {}, but another primary was learnt meanwhile",
                        HostPort::of(addr)
                    ));
                }
                Err(e) if is_refused_credentials(&e) => return Err(self.refused(addr, &e)),
                Err(e) => tried.push(format!("every sentinel names {}: {e}", HostPort::of(addr))),
            }
        }
        let detail = format!("service {:?}: {}", self.service, tried.join("; "));
        Err(if unknown == self.sentinels.len() {
            RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "no sentinel knows the service",
                detail,
            ))
        } else {
            RedisError::from((
                ErrorKind::Io,
                "cannot reach the primary through the sentinels",
                detail,
            ))
        })
    }
}

impl SentinelTarget {
    /// The error for credentials the primary `addr` refused, naming the service.
    fn refused(&self, node: &(String, u16), e: &RedisError) -> RedisError {
        RedisError::from((
            ErrorKind::AuthenticationFailed,
            "the primary refused the credentials or the ACL user's permissions",
            format!("service {:?}: {}: {e}", self.service, HostPort::of(node)),
        ))
    }
}

/// Whether a data node refused the credentials (a wrong user name or password, or a
/// password it requires and was not given) or the ACL user may not run `ROLE`.
fn is_refused_credentials(e: &RedisError) -> bool {
    e.kind() == ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM"))
}

/// Asks the sentinel on `conn` for the service's configuration epoch (`SENTINEL
/// MASTER`) and its primary (`SENTINEL GET-MASTER-ADDR-BY-NAME`), in one pipeline and
/// in that order: the address is then never older than the epoch. (`SENTINEL MASTER`'s
/// own `ip` and `port` are not used: during a failover the sentinel leading it
/// reports the new epoch there with the old primary's address until the switch, while
/// `GET-MASTER-ADDR-BY-NAME` names the promoted replica.) A sentinel that refuses
/// `SENTINEL MASTER` (an ACL user allowed only `GET-MASTER-ADDR-BY-NAME`) or whose
/// reply has no `config-epoch` gives its answer without an epoch.
fn ask_on(conn: &mut redis::Connection, service: &str) -> redis::RedisResult<Option<Answer>> {
    let replies: Vec<redis::Value> = redis::pipe()
        .ignore_errors()
        .cmd("SENTINEL")
        .arg("MASTER")
        .arg(service)
        .cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(service)
        .query(conn)?;
    let [master, addr] = <[redis::Value; 2]>::try_from(replies).map_err(|r| {
        RedisError::from((
            ErrorKind::Parse,
            "unexpected reply from a sentinel",
            format!("{} replies to a pipeline of 2 commands", r.len()),
        ))
    })?;
    let addr: redis::RedisResult<Option<(String, u16)>> = redis::from_redis_value(addr)?;
    Ok(addr?.map(|addr| (addr, config_epoch(&master))))
}

/// The `config-epoch` field of a `SENTINEL MASTER` reply (RESP2 pairs or a RESP3
/// map); `None` for an error reply or a reply without it.
fn config_epoch(reply: &redis::Value) -> Option<u64> {
    let number = |v: &redis::Value| match v {
        redis::Value::Int(n) => u64::try_from(*n).ok(),
        redis::Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        redis::Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    };
    let is_key = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => b.as_slice() == b"config-epoch",
        redis::Value::SimpleString(s) => s == "config-epoch",
        _ => false,
    };
    match reply {
        redis::Value::Array(items) => items
            .chunks_exact(2)
            .find(|kv| is_key(&kv[0]))
            .and_then(|kv| number(&kv[1])),
        redis::Value::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| is_key(k))
            .and_then(|(_, v)| number(v)),
        _ => None,
    }
}

/// The `+switch-master` watcher of a client with a Sentinel target, stopped when
/// dropped and joined if it ends by the deadline of the drop (see
/// [`stop_by`](Watcher::stop_by)).
pub(crate) struct Watcher {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
    /// Disconnected when the thread ends.
    done: Receiver<()>,
    /// Bounds the drop's wait when no deadline is given (the connect timeout).
    timeout: Duration,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher").finish()
    }
}

impl Watcher {
    /// Starts the thread for `target`; the connect timeout bounds each sentinel call.
    pub(crate) fn start(
        target: Arc<SentinelTarget>,
        timeout: Duration,
    ) -> std::io::Result<Watcher> {
        let (stop, stop_rx) = crossbeam_channel::bounded(0);
        let (done_tx, done) = crossbeam_channel::bounded::<()>(0);
        let thread = std::thread::Builder::new()
            .name("redsem-sentinel".into())
            .spawn(move || {
                let _done = done_tx;
                watch(&target, timeout, &stop_rx);
            })?;
        Ok(Watcher {
            stop: Some(stop),
            thread: Some(thread),
            done,
            timeout,
        })
    }

    /// Tells the thread to stop, without waiting for it.
    pub(crate) fn signal(&mut self) {
        drop(self.stop.take());
    }

    /// Stops the thread, joining it if it ends by `deadline`: a thread in a call to a
    /// sentinel that answers nothing (a partition) ends by itself when the call times
    /// out (see [`join_by`](crate::threads::join_by)), so that dropping a client never
    /// waits on a sentinel past its deadline.
    pub(crate) fn stop_by(&mut self, deadline: Instant) {
        self.signal();
        crate::threads::join_by(self.thread.take(), &self.done, deadline, "sentinel watcher");
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop_by(crate::threads::drop_deadline(Instant::now() + self.timeout));
    }
}

fn watch(target: &SentinelTarget, timeout: Duration, stop: &Receiver<()>) {
    let n = target.sentinels.len();
    let mut next = 0;
    let mut backoff = Duration::from_millis(10);
    loop {
        if stopped(stop) {
            return;
        }
        let s = &target.sentinels[next % n];
        next += 1;
        match watch_one(target, s, timeout, stop) {
            Ok(()) => return,
            Err(e) => {
                log::warn!(
                    "redis-semaphore: sentinel watcher of service {:?} lost sentinel {}: {e}",
                    target.service,
                    HostPort::of(s)
                );
            }
        }
        // after a round of failures, wait before the next round
        if next % n == 0 {
            if stop
                .recv_timeout(backoff)
                .is_err_and(|e| e.is_disconnected())
            {
                return;
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        } else {
            backoff = Duration::from_millis(10);
        }
    }
}

/// Subscribes on one sentinel and follows switches until told to stop (`Ok`) or the
/// sentinel fails.
fn watch_one(
    target: &SentinelTarget,
    sentinel: &(String, u16),
    timeout: Duration,
    stop: &Receiver<()>,
) -> redis::RedisResult<()> {
    let mut conn = target.sentinel_conn(sentinel, timeout)?;
    // (its heartbeats' writes get the whole timeout, not what the connect left of it)
    conn.write_within(Some(timeout))?;
    // (confirmed: a refusal by the sentinel's ACL is an error here, not a watch that
    // hears nothing)
    conn.read_within(Some(timeout))?;
    crate::clock::subscribe(&mut conn, SWITCH_CHANNEL)?;
    let mut ps = conn.as_pubsub();
    pubsub_read_within(&ps, Some(POLL))?;
    // a switch may have happened while nobody listened: read the primary again (an
    // answer from before a switch the client has learnt since, from another sentinel
    // or a connection's lookup, is not recorded: it would undo the switch)
    let learnt = target.primary.lock().learnt;
    if let Some((addr, epoch)) = target.ask(sentinel, timeout)? {
        let _ = target.observe_since(addr, epoch, learnt);
    }
    log::debug!(
        "redis-semaphore: watching {SWITCH_CHANNEL} of service {:?} on {}",
        target.service,
        HostPort::of(sentinel)
    );
    let mut last_heard = Instant::now();
    loop {
        if stopped(stop) {
            return Ok(());
        }
        match ps.get_message() {
            Ok(msg) => {
                last_heard = Instant::now();
                let payload: String = msg.get_payload()?;
                // "<service> <old ip> <old port> <new ip> <new port>"
                let f: Vec<&str> = payload.split(' ').collect();
                if let [service, _, _, ip, port] = f[..]
                    && service == target.service
                {
                    match port.parse::<u16>() {
                        Ok(port) => {
                            target.observe((ip.to_owned(), port));
                            // the switch's epoch, from the sentinel that announced it
                            // (until then a lookup's answer naming another node must
                            // be newer than the epoch known before the switch)
                            let learnt = target.primary.lock().learnt;
                            match target.ask(sentinel, timeout) {
                                Ok(Some((addr, epoch))) => {
                                    let _ = target.observe_since(addr, epoch, learnt);
                                }
                                Ok(None) => {}
                                Err(e) => log::warn!(
                                    "redis-semaphore: reading the configuration epoch of \
                                     service {:?} from sentinel {} after a switch: {e}",
                                    target.service,
                                    HostPort::of(sentinel)
                                ),
                            }
                        }
                        Err(_) => log::warn!(
                            "redis-semaphore: unreadable {SWITCH_CHANNEL} message {payload:?}"
                        ),
                    }
                }
            }
            Err(e) if e.is_timeout() => {
                if last_heard.elapsed() >= HEARTBEAT {
                    ps.ping::<redis::Value>()?;
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
    use redis::Value;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_refused_request_is_named_by_its_first_command() {
        let eval = redis::cmd("eval")
            .arg("return 1")
            .arg(0)
            .get_packed_command();
        assert_eq!(command_name(&eval), "EVAL");
        let pipe = redis::pipe()
            .atomic()
            .cmd("ZADD")
            .arg("k")
            .arg(1)
            .arg("m")
            .get_packed_pipeline();
        assert_eq!(command_name(&pipe), "MULTI");
        assert_eq!(command_name(b""), "a command");
        assert_eq!(command_name(b"*1\r\n$9\r\nWA"), "a command");
        assert_eq!(command_name(b"*1\r\n$3\r\na b\r\n"), "a command");
    }

    #[test]
    fn config_epoch_is_read_from_resp2_pairs_and_resp3_maps() {
        let pairs = Value::Array(vec![
            bulk("name"),
            bulk("svc"),
            bulk("config-epoch"),
            bulk("7"),
        ]);
        assert_eq!(config_epoch(&pairs), Some(7));
        let map = Value::Map(vec![(bulk("config-epoch"), Value::Int(3))]);
        assert_eq!(config_epoch(&map), Some(3));
        // refused (an ACL user without SENTINEL MASTER), absent or unreadable: none
        let refused = Value::ServerError(
            redis::ServerError::try_from(redis::make_extension_error(
                "NOPERM".to_owned(),
                Some("no permissions".to_owned()),
            ))
            .unwrap(),
        );
        assert_eq!(config_epoch(&refused), None);
        assert_eq!(
            config_epoch(&Value::Array(vec![bulk("name"), bulk("svc")])),
            None
        );
        assert_eq!(
            config_epoch(&Value::Array(vec![bulk("config-epoch"), bulk("-1")])),
            None
        );
    }

    #[test]
    fn an_answer_naming_another_node_at_an_older_epoch_is_behind() {
        let n = ("127.0.0.1".to_owned(), 2);
        let o = ("127.0.0.1".to_owned(), 1);
        let mut known = Known {
            addr: Some(n.clone()),
            learnt: 2,
            epoch: Some(1),
            unverified: false,
        };
        assert_eq!(known.behind(&o, Some(0)), Some(1));
        assert_eq!(known.behind(&o, Some(1)), None);
        assert_eq!(known.behind(&n, Some(0)), None, "the node known");
        assert_eq!(known.behind(&o, None), None, "no epoch: not refused");
        // a switch heard but not yet read: the service's epoch is above the one known
        known.unverified = true;
        assert_eq!(known.behind(&o, Some(1)), Some(2));
        assert_eq!(known.behind(&o, Some(2)), None);
        // the highest epoch there is, and a switch heard: no overflow
        known.epoch = Some(u64::MAX);
        assert_eq!(known.behind(&o, Some(0)), Some(u64::MAX));
        assert_eq!(known.behind(&o, Some(u64::MAX)), None);
        known.epoch = None;
        assert_eq!(known.behind(&o, Some(0)), None, "no epoch known");
    }
}
