use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::clock::{Clock, deadline_in, socket_timeout};
use crate::combine::SemCombiner;
use crate::connect::{
    Credentials, HostPort, IntoRedisTarget, MIN_TIMEOUT, NodeTls, RedisTarget, Target, TlsFiles,
    addr_text, endpoint, redact, with_credentials,
};
use crate::error::{Error, Result};
use crate::listener::{Hub, Listener};
use crate::pool::{CLUSTER_ATTEMPTS, CLUSTER_RETRY_WAIT, Manager, Pool, QuietErrors, per_attempt};
use crate::refresher;
use crate::registry::Registry;
use crate::scripts::leased::{self, Kind};
use crate::scripts::{NodeClock, NodeReading};
use crate::shared::Shared;
use crate::stats::{Counters, Stats};
use crate::threads::{drop_deadline, join_by, run_aside};
use crate::topology::{self, ClusterSource, Connector, SentinelTarget, SentinelUrl, Watcher};
use crossbeam_channel::{Receiver, Sender};
use redis::IntoConnectionInfo;
use redis::io::tcp::TcpSettings;

/// A handle to a Redis server: a connection pool and one background thread that keeps
/// the leases of this client's permits alive.
///
/// `Client` is cheap to clone; clones share the pool and the thread. When the last
/// handle is dropped, together with every [`Semaphore`](crate::Semaphore) and [`Permit`] made from it,
/// the background thread is stopped and joined, and the threads on which the client's
/// own pool opens its connections end with it (its pool opens no new connection once
/// nothing of the client can take one; a connect in flight ends within the connect
/// timeout). Releases the client still owes (the grant of an acquire whose reply was
/// lost, a waiter that left without its cancel, a give-back of permits too few
/// replicas acknowledged that failed) are then sent on a thread of their own, which
/// the drop does not wait for, each once its caller's give-up time has passed and for
/// at most three operation timeouts.
///
/// # Examples
///
/// ```no_run
/// use redis_semaphore::Client;
///
/// let client = Client::open("redis://127.0.0.1:6379/")?;
/// let sem = client.semaphore("market:acct:42", 5)?;
/// let permit = sem.acquire()?;
/// // ... at most 5 holders of "market:acct:42" run this at once ...
/// drop(permit);
/// # Ok::<(), redis_semaphore::Error>(())
/// ```
///
/// [`Permit`]: crate::Permit
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

pub(crate) struct ClientInner {
    pub(crate) shared: Arc<Shared>,
    /// The refresher's command channel; dropping it stops the thread.
    wake: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
    /// Disconnected when the refresher thread ends.
    thread_done: Receiver<()>,
    /// The wake-up listener, started by the first blocking wait.
    listener: parking_lot::Mutex<Option<Listener>>,
    /// One combiner per semaphore name, shared by every handle of this client, so that
    /// concurrent try-acquires and releases of one semaphore share script calls.
    combiners: parking_lot::Mutex<HashMap<String, Weak<SemCombiner>>>,
    /// On a cluster, one view of the clock per semaphore name (of the node that holds
    /// it), shared by every handle of this client, so that a new handle needs no
    /// `TIME` of its own.
    clocks: parking_lot::Mutex<HashMap<String, Weak<Clock>>>,
    /// The reading of the server's clock for the deadlines of the counting and
    /// Redisson layouts' operation keys, shared by every handle of this client: a
    /// handle made for one call needs no `TIME` of its own. On a cluster one per
    /// layout (by its key: the node that holds it), while a handle of it lives, as
    /// `clocks`.
    node_clock: Arc<NodeReading>,
    node_clocks: parking_lot::Mutex<HashMap<String, Weak<NodeReading>>>,
    /// The `+switch-master` watcher of a Sentinel target; stopped on drop, and joined
    /// by the drop's deadline.
    watcher: Option<Watcher>,
}

/// The `T` of `name` in `map`, made when no live handle holds one.
fn per_name<T: Default>(map: &parking_lot::Mutex<HashMap<String, Weak<T>>>, name: &str) -> Arc<T> {
    let mut map = map.lock();
    if let Some(c) = map.get(name).and_then(Weak::upgrade) {
        return c;
    }
    // forget dropped semaphores now and then (amortised: at powers of two)
    if map.len() >= 64 && map.len().is_power_of_two() {
        map.retain(|_, c| c.strong_count() > 0);
    }
    let c = Arc::new(T::default());
    map.insert(name.to_owned(), Arc::downgrade(&c));
    c
}

impl ClientInner {
    fn start(
        pool: Pool,
        op_timeout: Duration,
        connector: Option<Connector>,
        connect_timeout: Duration,
    ) -> Result<Client> {
        let watcher = match connector.as_ref().and_then(Connector::sentinel) {
            Some(target) => Some(Watcher::start(Arc::clone(target), connect_timeout).map_err(
                |e| {
                    Error::InvalidArgument(format!("cannot start the sentinel watcher thread: {e}"))
                },
            )?),
            None => None,
        };
        let shared = Arc::new(Shared {
            pool,
            op_timeout,
            registry: parking_lot::Mutex::new(Registry::default()),
            origin: format!("{}|{}", std::process::id(), host_name()),
            connect_timeout,
            stats: Counters::default(),
            clock: Default::default(),
        });
        let (wake, rx) = crossbeam_channel::unbounded();
        let (done_tx, thread_done) = crossbeam_channel::bounded::<()>(0);
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("redsem-refresh".into())
                .spawn(move || {
                    let _done = done_tx;
                    refresher::run(shared, rx)
                })
                .map_err(|e| {
                    Error::InvalidArgument(format!("cannot start the refresher thread: {e}"))
                })?
        };
        Ok(Client {
            inner: Arc::new(ClientInner {
                shared,
                wake: Some(wake),
                thread: Some(thread),
                thread_done,
                listener: parking_lot::Mutex::new(None),
                combiners: parking_lot::Mutex::new(HashMap::new()),
                clocks: parking_lot::Mutex::new(HashMap::new()),
                node_clock: Arc::default(),
                node_clocks: parking_lot::Mutex::new(HashMap::new()),
                watcher,
            }),
        })
    }

    /// The wake-up hub of this client, starting the listener thread on first use.
    pub(crate) fn hub(&self) -> Result<Arc<Hub>> {
        let mut listener = self.listener.lock();
        if let Some(l) = listener.as_ref() {
            return Ok(Arc::clone(&l.hub));
        }
        let l = Listener::start(Arc::clone(&self.shared)).map_err(|e| {
            Error::InvalidArgument(format!("cannot start the listener thread: {e}"))
        })?;
        let hub = Arc::clone(&l.hub);
        *listener = Some(l);
        Ok(hub)
    }

    /// The combiner of semaphore `name`, shared with every live handle of it.
    pub(crate) fn combiner(&self, name: &str) -> Arc<SemCombiner> {
        per_name(&self.combiners, name)
    }

    /// The cluster clock of semaphore `name`, shared with every live handle of it.
    pub(crate) fn cluster_clock(&self, name: &str) -> Arc<Clock> {
        per_name(&self.clocks, name)
    }

    /// The clock of the node that holds `key` (a counting or Redisson layout's), for
    /// the deadlines of its operation keys, shared with every live handle of it.
    pub(crate) fn node_clock(&self, key: &str) -> NodeClock {
        NodeClock::of(if self.shared.is_cluster() {
            per_name(&self.node_clocks, key)
        } else {
            Arc::clone(&self.node_clock)
        })
    }

    /// Tells the refresher that its schedule changed.
    pub(crate) fn nudge(&self) {
        if let Some(w) = &self.wake {
            let _ = w.send(());
        }
    }
}

impl Drop for ClientInner {
    /// Stops both threads at once and joins them within one operation timeout (or
    /// what is left of the budget of the drop this one is part of, see `threads.rs`);
    /// a thread still in a call to a hung server then ends by itself (see `join_by`).
    fn drop(&mut self) {
        let deadline = drop_deadline(Instant::now() + self.shared.op_timeout);
        drop(self.wake.take());
        let mut listener = self.listener.get_mut().take();
        if let Some(l) = &mut listener {
            l.signal();
        }
        let mut watcher = self.watcher.take();
        if let Some(w) = &mut watcher {
            w.signal();
        }
        join_by(self.thread.take(), &self.thread_done, deadline, "refresher");
        if let Some(l) = &mut listener {
            l.stop_by(deadline);
        }
        if let Some(w) = &mut watcher {
            w.stop_by(deadline);
        }
    }
}

impl Client {
    /// Opens a client for `target` with the default settings of [`ClientBuilder`]. No
    /// connection is made until the first operation ([`Client::ping`] checks the
    /// connection and the credentials at once).
    ///
    /// `target` is a URL (`&str` or `String`), or a [`redis::ConnectionInfo`] built by
    /// hand for one server ([`IntoRedisTarget`]). URL forms:
    ///
    /// - `redis://[user:password@]host[:6379][/db]`: one server;
    /// - `rediss://[user:password@]host[:port][/db]`: one server over TLS (crate
    ///   feature `tls-rustls` or `tls-native-tls`; certificate files are set with
    ///   [`ClientBuilder::tls_ca_file`] and [`ClientBuilder::tls_client_cert`]);
    /// - `unix:///path/to/redis.sock[?db=N&user=U&pass=P]`: one server on a Unix socket;
    /// - `redis+sentinel://[user:password@]h1[:26379],h2[:26379]/SERVICE[/db]`: a
    ///   Sentinel-managed primary (the URL's credentials are the data nodes'; the
    ///   sentinels' are set with [`ClientBuilder::sentinel_username`] and
    ///   [`ClientBuilder::sentinel_password`]); `rediss+sentinel://` speaks TLS to the
    ///   sentinels and to the data nodes, with the same certificate files for both;
    /// - `redis+cluster://[user:password@]h1[:6379],h2[:6379]`: Redis Cluster seed
    ///   nodes; `rediss+cluster://` speaks TLS to every node, with the certificate
    ///   files (which need the `tls-rustls` feature with a cluster).
    ///
    /// A Sentinel client follows a failover: its connections go to the service's
    /// current primary. A Cluster client routes each semaphore's scripts to the
    /// primary of its slot (all keys of a semaphore share the hash tag `{name}`) and
    /// follows a failover of a shard. [`guide::deployment`](crate::guide::deployment)
    /// says which guarantees each topology gives. User names and passwords are
    /// percent-decoded; no message or `Debug` output of this crate shows a password.
    ///
    /// Refused with [`Error::InvalidArgument`] before any connection: a TLS URL's
    /// `#insecure` (certificates are always checked, against the host of the URL; see
    /// [`ClientBuilder::tls_ca_file`] for a private CA), a negative database, the
    /// `db`, `user` and `pass` query parameters in a TCP URL (read only in `unix://`
    /// URLs: they would be ignored), any other spelling of them in a `unix://` URL
    /// (`database`, `DB`, `password`: read only so spelt) and its user info, and a host
    /// listed twice, a wildcard address or a
    /// bracketed host that is no IPv6 address in a Sentinel or Cluster host list.
    ///
    /// ```no_run
    /// use redis_semaphore::Client;
    ///
    /// let client = Client::open("redis://semaphores:s3cret@redis.internal:6379/0")?;
    /// client.ping()?; // fails now with Error::Auth if the password is wrong
    /// # Ok::<(), redis_semaphore::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when the URL cannot be parsed or is refused (above),
    /// and for a TLS URL without a TLS feature.
    pub fn open(target: impl IntoRedisTarget) -> Result<Client> {
        Client::builder().build(target)
    }

    /// A builder to set pool size and timeouts.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// Uses a pool the application already has.
    ///
    /// The library takes each connection's read and write timeouts in hand: it sets them
    /// to [`ClientBuilder::operation_timeout`]'s default (2 s) on every checkout. For the
    /// lowest latency, build the pool's `redis::Client` with TCP_NODELAY on and the
    /// pool with `test_on_check_out(false)`. With r2d2's default
    /// `test_on_check_out(true)`, r2d2 sends a `PING` on each checkout before the
    /// library can set the connection's timeouts; the library then checks out on a
    /// thread of its own and waits for it no longer than the call's bound, so that a
    /// server that stops answering cannot hold a `Permit`'s drop past the operation
    /// timeout (that costs a thread start per checkout, beside the `PING`).
    ///
    /// The trade-off: a call whose connection the server had closed while it sat idle
    /// (its `timeout`, `CLIENT KILL`, a restart) is sent once more on a new checkout
    /// of this pool (the library cannot open connections of its own for it), and with
    /// `test_on_check_out(false)` that checkout may hand out another closed
    /// connection, so the call fails (retryably; every call is safe to send again).
    /// With `test_on_check_out(true)` the `PING` weeds those out. The library's own
    /// pool ([`Client::open`]) needs neither: it sends the second send on a brand-new
    /// connection and drops its other connections idle as long.
    ///
    /// The pool must hold at least two connections: the client's wake-up listener
    /// keeps one for as long as the client lives (blocking acquires are woken through
    /// it), and every other call needs another. A Redisson wait subscribes on one
    /// too, for as long as it waits. A connection a subscription used goes back to
    /// the pool only once its replies are in step with its commands again (when the
    /// server did not answer the unsubscribe in time, the library reads the late
    /// answers first, on a thread of its own if that takes longer than the call may
    /// wait), so the application's own commands on it never read a late answer.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a pool of fewer than two connections or with a
    /// connection timeout over [`MAX_TIMEOUT`]; otherwise
    /// only if the background thread cannot be started.
    pub fn from_pool(pool: r2d2::Pool<redis::Client>) -> Result<Client> {
        if pool.max_size() < 2 {
            return Err(Error::InvalidArgument(format!(
                "a pool given to Client::from_pool needs at least 2 connections, this one has \
                 {}: the wake-up listener keeps one for the client's lifetime",
                pool.max_size()
            )));
        }
        // r2d2 waits until `Instant::now() + connection_timeout`, which overflows (a
        // panic) for a huge timeout
        if pool.connection_timeout() > MAX_TIMEOUT {
            return Err(Error::InvalidArgument(format!(
                "a pool given to Client::from_pool must have a connection timeout of at most \
                 a day, this one has {:?}",
                pool.connection_timeout()
            )));
        }
        let defaults = ClientBuilder::default();
        let op = defaults.operation_timeout;
        ClientInner::start(Pool::User(pool, op), op, None, defaults.connect_timeout)
    }

    /// Checks now that Redis can be reached and accepts the credentials: opens a
    /// connection of its own (as a pooled connection would be opened: through the
    /// sentinels, or to the cluster's nodes) and runs `PING` on it, so that a password
    /// changed or a server restarted since the pool's connections were opened shows
    /// now. With a pool given to [`Client::from_pool`] it checks a connection out of
    /// that pool instead (once more on another when the server had closed it). It
    /// waits at most the connect timeout to open the connection, then the operation
    /// timeout for the `PING`.
    ///
    /// # Errors
    ///
    /// [`Error::Auth`] for a wrong user name or password, or a password missing where
    /// the server requires one; [`Error::Connect`] when the server cannot be reached,
    /// the TLS handshake fails, or the server refuses the URL's database index (not
    /// retryable: the message names the index); both name the address; [`Error::Pool`]
    /// or [`Error::Redis`] otherwise.
    pub fn ping(&self) -> Result<()> {
        let shared = &self.inner.shared;
        let reply = match &shared.pool {
            Pool::Own(_, manager) => {
                // on a thread of its own: a cluster client's connects may wait for
                // ever in a TLS handshake with native-tls (which has no handshake
                // timeout; the library's own connects are bounded, see
                // `connect::bounded_handshake`), so the wait for it ends by the
                // connect timeout and one operation timeout
                let bound = deadline_in(shared.connect_timeout + shared.op_timeout);
                let opener = manager.clone();
                let answer = run_aside("redsem-ping", bound, move || {
                    opener
                        .open()
                        .map(|mut fresh| redis::cmd("PING").query::<String>(&mut fresh))
                })
                .map_err(|e| Error::Redis(e.into()))?;
                match answer {
                    Some(answer) => answer?,
                    None => return Err(manager.stalled_within("the connect timeout")),
                }
            }
            Pool::User(..) => {
                let mut conn = shared.pool.get(None)?;
                match redis::cmd("PING").query::<String>(&mut *conn) {
                    Err(e) if e.is_connection_dropped() || e.is_io_error() => {
                        // (the pool drops a broken connection when it comes back)
                        drop(conn);
                        redis::cmd("PING").query::<String>(&mut *shared.pool.get(None)?)
                    }
                    r => r,
                }
            }
        };
        // refused credentials and a lost connection are sorted as when connecting, with
        // the address (which the error of `redis` does not name)
        let reply: String = reply.map_err(|e| {
            let refused = matches!(e.code(), Some("NOAUTH" | "WRONGPASS"));
            if refused || e.is_io_error() || e.is_connection_dropped() {
                // (a PING on a connection already set up: no SELECT to refuse)
                let (addr, lone_user) = (shared.pool.addr(), shared.pool.lone_user());
                crate::connect::connect_error_at(&addr, false, 0, lone_user, &e)
            } else {
                Error::Redis(e)
            }
        })?;
        if reply != "PONG" {
            return Err(Error::Connect {
                addr: shared.pool.addr(),
                message: format!("PING answered {reply:?} instead of PONG: is this Redis?"),
            });
        }
        Ok(())
    }

    /// A snapshot of this client's counters: acquires, failed tries, waits and their
    /// latency, refresh calls and losses, errors. Counting is always on; it costs a
    /// relaxed atomic add per event.
    pub fn stats(&self) -> Stats {
        self.inner.shared.stats.snapshot()
    }

    /// The names of the semaphores that have keys in Redis now, found with `SCAN`;
    /// `pattern` is a glob on the name (`*` for all). On a cluster every primary is
    /// scanned.
    ///
    /// # Errors
    ///
    /// Redis and pool errors, counted in [`Stats::errors`]. A Redis error is an
    /// [`Error::Call`] (or [`Error::Timeout`]) whose operation is `list_semaphores`
    /// and whose name is `pattern`.
    pub fn list_semaphores(&self, pattern: &str) -> Result<Vec<String>> {
        self.list(pattern, Kind::Leased, "list_semaphores")
    }

    /// The names of the [`CountingSemaphore`](crate::CountingSemaphore)s that have a
    /// count in Redis now, as [`list_semaphores`](Self::list_semaphores) finds the
    /// leased ones.
    ///
    /// # Errors
    ///
    /// As [`list_semaphores`](Self::list_semaphores), the operation named
    /// `list_counting_semaphores`.
    pub fn list_counting_semaphores(&self, pattern: &str) -> Result<Vec<String>> {
        self.list(pattern, Kind::Counting, "list_counting_semaphores")
    }

    /// [`list_names`](Self::list_names), its error counted in [`Stats::errors`] and a
    /// Redis error naming the call `op` and the pattern, as a semaphore's call names
    /// its operation and semaphore.
    fn list(&self, pattern: &str, kind: Kind, op: &'static str) -> Result<Vec<String>> {
        let shared = &self.inner.shared;
        self.list_names(pattern, kind).map_err(|e| {
            if crate::semaphore::is_redis_error(&e) {
                Counters::bump(&shared.stats.errors);
            }
            match e {
                Error::Redis(e) => Error::redis(pattern, e, shared.op_timeout).during(op),
                other => other,
            }
        })
    }

    fn list_names(&self, pattern: &str, kind: Kind) -> Result<Vec<String>> {
        let shared = &self.inner.shared;
        let mut conn = shared.pool.get(None)?;
        let mut names = Vec::new();
        // SCAN is not routed by key on a cluster: each primary is scanned in turn
        let primaries = match conn.cluster() {
            Some(mut cluster) => Some(leased::cluster_primaries(&mut cluster)?),
            None => None,
        };
        for node in primaries
            .as_deref()
            .map_or(vec![None], |p| p.iter().map(Some).collect())
        {
            let mut cursor: u64 = 0;
            loop {
                let (next, found) = match (node, conn.cluster()) {
                    (Some(node), Some(mut cluster)) => {
                        leased::scan_names_at(&mut cluster, node, cursor, pattern, kind)?
                    }
                    _ => leased::scan_names(&mut conn, cursor, pattern, kind)?,
                };
                names.extend(found);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        names.sort();
        names.dedup();
        Ok(names)
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("pool", &self.inner.shared.pool)
            .field("operation_timeout", &self.inner.shared.op_timeout)
            .finish()
    }
}

/// The most connections [`ClientBuilder::max_connections`] accepts.
pub const MAX_CONNECTIONS: u32 = 10_000;

/// The longest timeout [`ClientBuilder`] accepts (connect, operation and checkout): a
/// day.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Settings of a [`Client`]: pool size, timeouts, credentials and TLS files.
///
/// ```no_run
/// use std::time::Duration;
/// use redis_semaphore::Client;
///
/// let client = Client::builder()
///     .max_connections(32)
///     .connect_timeout(Duration::from_secs(1))
///     .operation_timeout(Duration::from_millis(500))
///     .build("redis://127.0.0.1:6379/")?;
/// # Ok::<(), redis_semaphore::Error>(())
/// ```
///
/// Over TLS with a private certificate authority and a client certificate, as an ACL
/// user whose password comes from elsewhere than the URL (needs the crate feature
/// `tls-rustls` or `tls-native-tls`):
///
/// ```no_run
/// use redis_semaphore::Client;
///
/// let client = Client::builder()
///     .tls_ca_file("/etc/redis/ca.crt")
///     .tls_client_cert("/etc/redis/client.crt", "/etc/redis/client.key")
///     .username("semaphores")
///     .password(std::env::var("REDIS_PASSWORD").unwrap_or_default())
///     .build("rediss://redis.internal:6380/")?;
/// client.ping()?;
/// # Ok::<(), redis_semaphore::Error>(())
/// ```
#[derive(Clone)]
#[must_use = "a builder does nothing until build() is called"]
pub struct ClientBuilder {
    max_connections: u32,
    connect_timeout: Duration,
    operation_timeout: Duration,
    checkout_timeout: Duration,
    connect_at_build: bool,
    creds: Credentials,
    tls: TlsFiles,
    sentinel_username: Option<String>,
    sentinel_password: Option<topology::Secret>,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            max_connections: 16,
            connect_timeout: Duration::from_secs(2),
            operation_timeout: Duration::from_secs(2),
            checkout_timeout: Duration::from_secs(5),
            connect_at_build: false,
            creds: Credentials::default(),
            tls: TlsFiles::default(),
            sentinel_username: None,
            sentinel_password: None,
        }
    }
}

impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("max_connections", &self.max_connections)
            .field("connect_timeout", &self.connect_timeout)
            .field("operation_timeout", &self.operation_timeout)
            .field("checkout_timeout", &self.checkout_timeout)
            .field("connect_at_build", &self.connect_at_build)
            .field("credentials", &self.creds)
            .field("tls", &self.tls)
            .finish()
    }
}

impl ClientBuilder {
    /// The most connections the pool opens. Defaults to 16; at most
    /// [`MAX_CONNECTIONS`] (checked by [`build`](Self::build)).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// How long opening one connection may take: the TCP connect, the TLS handshake,
    /// `AUTH` and `SELECT` where the URL asks for them, and the `PING` that checks a
    /// connection without a password, all within about this. Defaults to 2 s; at least
    /// 1 ms and at most [`MAX_TIMEOUT`] (checked by [`build`](Self::build), as the
    /// other timeouts).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// How long one Redis command may take before it fails with a timeout. Defaults
    /// to 2 s. It also bounds how long dropping a [`Permit`](crate::Permit) can block.
    ///
    /// The call ends within it even though Linux fires socket timeouts late (by up to
    /// an eighth of their length and a tick or two; 124 ms for 5 s, measured): the
    /// library waits for a reply about 8/9 of it, less 30 ms. A replica wait's `WAIT`
    /// is shortened where needed so that the server's answer comes within that.
    pub fn operation_timeout(mut self, d: Duration) -> Self {
        self.operation_timeout = d;
        self
    }

    /// How long an operation waits for a free connection when all are busy.
    /// Defaults to 5 s. A connection that cannot be opened ends the wait at once: a
    /// refused connection, refused credentials, or a server that did not answer within
    /// the [`connect_timeout`](Self::connect_timeout).
    pub fn checkout_timeout(mut self, d: Duration) -> Self {
        self.checkout_timeout = d;
        self
    }

    /// Whether [`build`](Self::build) connects at once and checks the connection and
    /// the credentials ([`Client::ping`]), so that a wrong address or password fails
    /// the build instead of the first operation. Defaults to `false` (no connection is
    /// made until it is needed).
    pub fn connect_at_build(mut self, yes: bool) -> Self {
        self.connect_at_build = yes;
        self
    }

    /// The ACL user name to authenticate as, overriding the URL's. An empty one is the
    /// same as none (an empty environment variable passed through, say): the URL's
    /// stays.
    pub fn username(mut self, user: impl Into<String>) -> Self {
        self.creds.username = Some(user.into()).filter(|u| !u.is_empty());
        self
    }

    /// The password to authenticate with, overriding the URL's (so that it need not
    /// be written into a URL). It is never printed, not even by `Debug`. An empty one
    /// is the same as none: the URL's stays (Redis refuses `AUTH` with an empty
    /// password).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.creds.password = Some(password.into()).filter(|p| !p.is_empty());
        self
    }

    /// A PEM file of the certificate authorities that signed the server's certificate,
    /// for `rediss://` URLs (instead of the system's trust store); with
    /// `rediss+sentinel://` it must trust the sentinels' and the data nodes'
    /// certificates, with `rediss+cluster://` every node's. Read by
    /// [`build`](Self::build). Needs the crate feature `tls-rustls` or `tls-native-tls`.
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls.ca = Some(path.into());
        self
    }

    /// A client certificate and its private key (PEM files) for mutual TLS, for
    /// servers run with `tls-auth-clients yes`. Read by [`build`](Self::build). Needs
    /// the crate feature `tls-rustls` or `tls-native-tls`.
    pub fn tls_client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls.client_cert = Some((cert.into(), key.into()));
        self
    }

    /// The user name for the sentinels of a `redis+sentinel://` URL (the URL's own
    /// user and password are for the data nodes). Unset by default. Give that ACL user
    /// `+sentinel|master` as well as `+sentinel|get-master-addr-by-name`: lookups read
    /// the service's configuration epoch with it, and without it they go unguarded
    /// against a sentinel that has not learnt a failover (see the deployment notes,
    /// "Sentinel").
    pub fn sentinel_username(mut self, username: impl Into<String>) -> Self {
        self.sentinel_username = Some(username.into()).filter(|u| !u.is_empty());
        self
    }

    /// The password for the sentinels of a `redis+sentinel://` URL (the URL's own
    /// password is for the data nodes). Unset by default: the sentinels need none. An
    /// empty one is the same as none.
    pub fn sentinel_password(mut self, password: impl Into<String>) -> Self {
        self.sentinel_password = Some(password.into())
            .filter(|p| !p.is_empty())
            .map(topology::Secret);
        self
    }

    /// Builds the client for `url` (the forms of [`Client::open`]). No connection is
    /// opened until it is needed; [`Client::ping`] checks now.
    ///
    /// A `redis+sentinel://[user:pass@]h1:26379,h2:26379/SERVICE[/DB]` URL names a
    /// Sentinel service: connections go to its current primary, and the client
    /// follows a failover (see the crate's deployment notes). With
    /// `rediss+sentinel://` the sentinels and the data nodes are reached over TLS with
    /// the files of [`tls_ca_file`](Self::tls_ca_file) and
    /// [`tls_client_cert`](Self::tls_client_cert); with `rediss+cluster://` every
    /// cluster node is, the wake-up listener's connection included.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a zero size, a timeout under 1 ms, more than
    /// [`MAX_CONNECTIONS`] connections, a timeout over [`MAX_TIMEOUT`], a URL that cannot be
    /// parsed or that [`Client::open`] says is refused, a TLS URL without a TLS feature, TLS files that cannot be read or
    /// parsed (naming the file) or set for a URL without TLS, and TLS files with a
    /// `rediss+cluster://` URL in a build without the `tls-rustls` feature (redis-rs's
    /// cluster client takes certificates only with rustls).
    pub fn build(self, target: impl IntoRedisTarget) -> Result<Client> {
        if self.max_connections == 0 {
            return Err(Error::InvalidArgument(
                "max_connections must be at least 1".into(),
            ));
        }
        // r2d2 reserves room for the largest pool up front: u32::MAX would abort the
        // process on a failed allocation instead of returning an error
        if self.max_connections > MAX_CONNECTIONS {
            return Err(Error::InvalidArgument(format!(
                "max_connections must be at most {MAX_CONNECTIONS}, got {}",
                self.max_connections
            )));
        }
        for (what, d) in [
            ("connect_timeout", self.connect_timeout),
            ("operation_timeout", self.operation_timeout),
            ("checkout_timeout", self.checkout_timeout),
        ] {
            // a socket timeout cannot be zero, and a connect's is divided among the
            // replies of its set-up: under a millisecond every call would fail with
            // redis-rs's "cannot set a 0 duration timeout", which names no setting
            if d < MIN_TIMEOUT {
                return Err(Error::InvalidArgument(format!(
                    "{what} must be at least 1 ms, got {d:?}"
                )));
            }
            // deadlines are `Instant::now() + timeout`: Duration::MAX would overflow
            // (a panic, and an abort when it happens in a drop)
            if d > MAX_TIMEOUT {
                return Err(Error::InvalidArgument(format!(
                    "{what} must be at most a day, got {d:?}"
                )));
            }
        }
        // messages name a hand-built target by its address (never a password)
        let (url, parsed) = match target.into_redis_target() {
            RedisTarget::Url(url) => {
                let parsed = Target::parse(&url)?;
                (url, parsed)
            }
            RedisTarget::Info(info) => {
                let scheme = match info.addr() {
                    redis::ConnectionAddr::TcpTls { .. } => "rediss",
                    redis::ConnectionAddr::Unix(_) => "unix",
                    _ => "redis",
                };
                let addr = addr_text(info.addr());
                (format!("{scheme}://{addr}"), Target::Single(*info))
            }
        };
        let url = url.as_str();
        match parsed {
            Target::Single(info) => {
                let ep = endpoint(url, info, &self.creds, &self.tls)?;
                self.build_with(Connector::Single(Box::new(ep)))
            }
            Target::Sentinel {
                sentinels,
                service,
                db,
                auth,
                tls,
            } => {
                let node_tls = self.node_tls(url, tls, "rediss+sentinel://")?;
                // the builder's credentials for the data nodes override the URL's
                let parsed = SentinelUrl {
                    tls,
                    sentinels,
                    service,
                    db,
                    username: self.creds.username.clone().or(auth.username),
                    password: self.creds.password.clone().or(auth.password),
                };
                let target = SentinelTarget::new(
                    parsed,
                    self.sentinel_username.clone(),
                    self.sentinel_password.clone(),
                    node_tls,
                );
                self.build_with(Connector::Sentinel(Arc::new(target)))
            }
            Target::Cluster { nodes, auth, tls } => {
                let source = self.cluster_source(url, nodes, auth, tls)?;
                self.build_with(Connector::Cluster(Arc::new(source)))
            }
        }
    }

    /// TLS toward the nodes of a Sentinel or Cluster URL (`tls`), with the builder's
    /// certificate files; files set for a URL without TLS are refused (`scheme` is the
    /// TLS form to suggest).
    fn node_tls(&self, url: &str, tls: bool, scheme: &str) -> Result<Option<NodeTls>> {
        if tls {
            return NodeTls::new(url, &self.tls).map(Some);
        }
        if !self.tls.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "TLS certificate files are set, but {} is not a TLS URL (use {scheme})",
                redact(url)
            )));
        }
        Ok(None)
    }

    /// The cluster client of a `redis+cluster://` URL: the builder's credentials
    /// override the URL's; each command with its retries ends within the operation
    /// timeout ([`per_attempt`]).
    fn cluster_source(
        &self,
        url: &str,
        nodes: Vec<(String, u16)>,
        auth: Credentials,
        tls: bool,
    ) -> Result<ClusterSource> {
        let username = self.creds.username.clone().or(auth.username);
        let password = self.creds.password.clone().or(auth.password);
        let bad = |e: redis::RedisError| {
            Error::InvalidArgument(format!("bad cluster URL {}: {e}", redact(url)))
        };
        let node_tls = self.node_tls(url, tls, "rediss+cluster://")?;
        let mut infos = Vec::with_capacity(nodes.len());
        for (host, port) in &nodes {
            // the seeds carry the certificates too: the wake-up listener's plain
            // connections go to them (ClusterSource::plain)
            let addr = match &node_tls {
                Some(t) => t.addr(host, *port),
                None => redis::ConnectionAddr::Tcp(host.clone(), *port),
            };
            let info = addr.into_connection_info().map_err(bad)?;
            let settings = with_credentials(
                info.redis_settings().clone(),
                username.as_deref(),
                password.as_deref(),
            );
            infos.push(
                info.set_redis_settings(settings)
                    .set_tcp_settings(TcpSettings::default().set_nodelay(true)),
            );
        }
        let certs = cluster_certs(url, tls && !self.tls.is_empty(), &self.tls)?;
        let seeds = infos.clone();
        let configured = move || {
            certs(redis::cluster::ClusterClient::builder(seeds.clone()))
                .tcp_settings(TcpSettings::default().set_nodelay(true))
        };
        let client = configured()
            .retries(CLUSTER_ATTEMPTS - 1)
            .min_retry_wait(5)
            .max_retry_wait(CLUSTER_RETRY_WAIT.as_millis() as u64)
            .connection_timeout(self.connect_timeout)
            .response_timeout(socket_timeout(per_attempt(self.operation_timeout)))
            .build()
            .map_err(bad)?;
        // each step of a connection's set-up and first command (a seed's connect and
        // PING, tried in turn; the slot map; the slot's node's connect and PING; the
        // script, loaded once when the node lacks it) a share of the budget, and no
        // retries: all of it ends within about the budget
        let steps = 2 * infos.len() as u32 + 6;
        let within = move |budget: Duration| {
            let step = (budget / steps).max(Duration::from_millis(1));
            configured()
                .retries(0)
                .connection_timeout(step)
                .response_timeout(socket_timeout(step))
                .build()
        };
        let list: Vec<String> = nodes.iter().map(|n| HostPort::of(n).to_string()).collect();
        Ok(ClusterSource {
            client,
            within: Box::new(within),
            nodes: infos,
            addr: format!("cluster {}", list.join(",")),
            tls,
            has_password: password.is_some(),
            next: Default::default(),
        })
    }

    fn build_with(self, connector: Connector) -> Result<Client> {
        let manager = Manager::new(
            connector.clone(),
            self.connect_timeout,
            self.operation_timeout,
        );
        let pool = r2d2::Pool::builder()
            .max_size(self.max_connections)
            .min_idle(Some(0))
            .test_on_check_out(false)
            .connection_timeout(self.checkout_timeout)
            .error_handler(Box::new(QuietErrors))
            .thread_pool(pool_threads())
            .build_unchecked(manager.clone());
        let client = ClientInner::start(
            Pool::Own(pool, manager),
            self.operation_timeout,
            Some(connector),
            self.connect_timeout,
        )?;
        if self.connect_at_build {
            client.ping()?;
        }
        Ok(client)
    }
}

/// What a cluster client builder is given for TLS toward every node of a cluster (the
/// seeds and the nodes the cluster names): the builder's certificates when `files` are
/// wanted (read once, here), else nothing. redis-rs's cluster client takes
/// certificates with rustls only.
type ClusterTls = Box<
    dyn Fn(redis::cluster::ClusterClientBuilder) -> redis::cluster::ClusterClientBuilder
        + Send
        + Sync,
>;

#[cfg(feature = "tls-rustls")]
fn cluster_certs(_url: &str, wanted: bool, files: &TlsFiles) -> Result<ClusterTls> {
    if !wanted {
        return Ok(Box::new(|b| b));
    }
    let certs = crate::connect::certificates(files)?;
    Ok(Box::new(move |b| {
        b.tls(redis::TlsMode::Secure).certs(certs.clone())
    }))
}

/// Without rustls, redis-rs's cluster client cannot take certificates: a clear error.
#[cfg(not(feature = "tls-rustls"))]
fn cluster_certs(url: &str, wanted: bool, _files: &TlsFiles) -> Result<ClusterTls> {
    if !wanted {
        return Ok(Box::new(|b| b));
    }
    Err(Error::InvalidArgument(format!(
        "{}: TLS certificate files with Redis Cluster need the crate feature `tls-rustls` \
         (redis-rs's cluster client takes certificates only with rustls; with \
         `tls-native-tls` alone, rediss+cluster:// uses the system's trust store)",
        redact(url)
    )))
}

/// The threads of a client's own pool (r2d2 opens the pool's connections on them),
/// as many as r2d2's default. They end as soon as the pool is dropped: r2d2's default
/// thread pool keeps its threads until its reaper's next run (30 s), so clients made and
/// dropped in a loop piled up three threads each. Named `redsem-pool-N`, as the other
/// threads of the library.
fn pool_threads() -> Arc<scheduled_thread_pool::ScheduledThreadPool> {
    Arc::new(
        scheduled_thread_pool::ScheduledThreadPool::builder()
            .num_threads(3)
            .thread_name_pattern("redsem-pool-{}")
            .on_drop_behavior(scheduled_thread_pool::OnPoolDropBehavior::DiscardPendingScheduled)
            .build(),
    )
}

/// The host name recorded with each grant, without the record separator.
fn host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_else(|| "unknown".into());
    name.trim().replace('|', "_")
}
