use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::Sender;
use redis::IntoConnectionInfo;
use redis::io::tcp::TcpSettings;

use crate::combine::Combiner;
use crate::error::{Error, Result};
use crate::listener::{Hub, Listener};
use crate::pool::{ClusterSource, Manager, Pool, Source};
use crate::refresher;
use crate::registry::Registry;
use crate::scripts::leased;
use crate::semaphore::{SemCombiner, Semaphore, SemaphoreBuilder};
use crate::shared::Shared;
use crate::stats::{Counters, Stats};

/// A handle to a Redis server: a connection pool and one background thread that keeps
/// the leases of this client's permits alive.
///
/// `Client` is cheap to clone; clones share the pool and the thread. When the last
/// handle is dropped, together with every [`Semaphore`] and [`Permit`] made from it,
/// the background thread is stopped and joined.
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
    /// The wake-up listener, started by the first blocking wait.
    listener: parking_lot::Mutex<Option<Listener>>,
    /// One combiner per semaphore name, shared by every handle of this client, so that
    /// concurrent try-acquires and releases of one semaphore share script calls.
    combiners: parking_lot::Mutex<HashMap<String, Weak<SemCombiner>>>,
}

impl ClientInner {
    fn start(
        pool: Pool,
        op_timeout: Duration,
        manager: Option<Manager>,
        connect_timeout: Duration,
    ) -> Result<Client> {
        let shared = Arc::new(Shared {
            pool,
            op_timeout,
            registry: parking_lot::Mutex::new(Registry::default()),
            origin: format!("{}|{}", std::process::id(), host_name()),
            manager,
            connect_timeout,
            stats: Counters::default(),
            clock: Default::default(),
        });
        let (wake, rx) = crossbeam_channel::unbounded();
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("redsem-refresh".into())
                .spawn(move || refresher::run(shared, rx))
                .map_err(|e| {
                    Error::InvalidArgument(format!("cannot start the refresher thread: {e}"))
                })?
        };
        Ok(Client {
            inner: Arc::new(ClientInner {
                shared,
                wake: Some(wake),
                thread: Some(thread),
                listener: parking_lot::Mutex::new(None),
                combiners: parking_lot::Mutex::new(HashMap::new()),
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

    /// Tells the refresher that its schedule changed.
    /// The combiner of semaphore `name`, shared with every live handle of it.
    pub(crate) fn combiner(&self, name: &str) -> Arc<SemCombiner> {
        let mut map = self.combiners.lock();
        if let Some(c) = map.get(name).and_then(Weak::upgrade) {
            return c;
        }
        // forget dropped semaphores now and then (amortised: at powers of two)
        if map.len() >= 64 && map.len().is_power_of_two() {
            map.retain(|_, c| c.strong_count() > 0);
        }
        let c = Arc::new(Combiner::default());
        map.insert(name.to_owned(), Arc::downgrade(&c));
        c
    }

    pub(crate) fn nudge(&self) {
        if let Some(w) = &self.wake {
            let _ = w.send(());
        }
    }
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        drop(self.wake.take());
        if let Some(t) = self.thread.take()
            && t.thread().id() != std::thread::current().id()
            && t.join().is_err()
        {
            log::error!("redis-semaphore: the refresher thread panicked");
        }
    }
}

impl Client {
    /// Opens a client for `url` (`redis://host:port/db`, `rediss://`, `unix://`) with
    /// the default settings of [`ClientBuilder`]. No connection is made until the first
    /// operation.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] when the URL cannot be parsed.
    pub fn open(url: &str) -> Result<Client> {
        Client::builder().build(url)
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
    /// pool with `test_on_check_out(false)`.
    ///
    /// The pool must hold at least two connections: the client's wake-up listener
    /// keeps one for as long as the client lives (blocking acquires are woken through
    /// it), and every other call needs another.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a pool of fewer than two connections; otherwise
    /// only if the background thread cannot be started.
    pub fn from_pool(pool: r2d2::Pool<redis::Client>) -> Result<Client> {
        if pool.max_size() < 2 {
            return Err(Error::InvalidArgument(format!(
                "a pool given to Client::from_pool needs at least 2 connections, this one has \
                 {}: the wake-up listener keeps one for the client's lifetime",
                pool.max_size()
            )));
        }
        let defaults = ClientBuilder::default();
        let op = defaults.operation_timeout;
        ClientInner::start(Pool::User(pool, op), op, None, defaults.connect_timeout)
    }

    /// A semaphore named `name` allowing `limit` permits at once, with the default
    /// settings of [`SemaphoreBuilder`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name, a name with `{` or `}`, or a
    /// limit of 0.
    pub fn semaphore(&self, name: &str, limit: u32) -> Result<Semaphore> {
        self.semaphore_builder(name).limit(limit).build()
    }

    /// A builder for semaphore `name`, to set its lease, fairness and refresh.
    pub fn semaphore_builder(&self, name: &str) -> SemaphoreBuilder {
        SemaphoreBuilder::new(self.clone(), name)
    }

    /// A snapshot of this client's counters: acquires, failed tries, waits and their
    /// latency, refresh calls and losses, errors. Counting is always on; it costs a
    /// relaxed atomic add per event.
    pub fn stats(&self) -> Stats {
        self.inner.shared.stats.snapshot()
    }

    /// The names of the semaphores that have keys in Redis now, found with `SCAN`;
    /// `pattern` is a glob on the name (`*` for all).
    ///
    /// # Errors
    ///
    /// Redis and pool errors.
    pub fn list_semaphores(&self, pattern: &str) -> Result<Vec<String>> {
        let shared = &self.inner.shared;
        let mut conn = shared.pool.get(None)?;
        let mut names = Vec::new();
        // SCAN is not routed by key on a cluster: each primary is scanned in turn
        let primaries = match conn.cluster() {
            Some(cluster) => Some(leased::cluster_primaries(cluster)?),
            None => None,
        };
        for node in primaries
            .as_deref()
            .map_or(vec![None], |p| p.iter().map(Some).collect())
        {
            let mut cursor: u64 = 0;
            loop {
                let (next, found) = match (node, conn.cluster()) {
                    (Some(node), Some(cluster)) => {
                        leased::scan_names_at(cluster, node, cursor, pattern)?
                    }
                    _ => leased::scan_names(&mut conn, cursor, pattern)?,
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

/// Settings of a [`Client`]: pool size and timeouts.
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
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    max_connections: u32,
    connect_timeout: Duration,
    operation_timeout: Duration,
    checkout_timeout: Duration,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            max_connections: 16,
            connect_timeout: Duration::from_secs(2),
            operation_timeout: Duration::from_secs(2),
            checkout_timeout: Duration::from_secs(5),
        }
    }
}

impl ClientBuilder {
    /// The most connections the pool opens. Defaults to 16.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// How long opening one connection (TCP connect and handshake) may take.
    /// Defaults to 2 s.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// How long one Redis command may take before it fails with a timeout. Defaults
    /// to 2 s. It also bounds how long dropping a [`Permit`](crate::Permit) can block.
    pub fn operation_timeout(mut self, d: Duration) -> Self {
        self.operation_timeout = d;
        self
    }

    /// How long an operation waits for a free connection when all are busy.
    /// Defaults to 5 s.
    pub fn checkout_timeout(mut self, d: Duration) -> Self {
        self.checkout_timeout = d;
        self
    }

    /// Builds the client for `url`. No connection is opened until it is needed.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for zero sizes or durations, [`Error::Redis`] when
    /// the URL cannot be parsed.
    pub fn build(self, url: &str) -> Result<Client> {
        if self.max_connections == 0 {
            return Err(Error::InvalidArgument(
                "max_connections must be at least 1".into(),
            ));
        }
        for (what, d) in [
            ("connect_timeout", self.connect_timeout),
            ("operation_timeout", self.operation_timeout),
            ("checkout_timeout", self.checkout_timeout),
        ] {
            if d.is_zero() {
                return Err(Error::InvalidArgument(format!("{what} must be above zero")));
            }
        }
        let source = match cluster_nodes(url)? {
            Some(nodes) => {
                let per_attempt = crate::pool::per_attempt(self.operation_timeout);
                let client = redis::cluster::ClusterClient::builder(nodes.clone())
                    .retries(crate::pool::CLUSTER_ATTEMPTS - 1)
                    .min_retry_wait(5)
                    .max_retry_wait(50)
                    .connection_timeout(self.connect_timeout)
                    .response_timeout(per_attempt)
                    .tcp_settings(TcpSettings::default().set_nodelay(true))
                    .build()
                    .map_err(Error::Redis)?;
                Source::Cluster(Arc::new(ClusterSource {
                    client,
                    nodes,
                    next: Default::default(),
                }))
            }
            None => {
                let info = url
                    .into_connection_info()
                    .map_err(Error::Redis)?
                    .set_tcp_settings(TcpSettings::default().set_nodelay(true));
                Source::Single(redis::Client::open(info).map_err(Error::Redis)?)
            }
        };
        let manager = Manager {
            source,
            connect_timeout: self.connect_timeout,
            op_timeout: self.operation_timeout,
        };
        let pool = r2d2::Pool::builder()
            .max_size(self.max_connections)
            .min_idle(Some(0))
            .test_on_check_out(false)
            .connection_timeout(self.checkout_timeout)
            .build_unchecked(manager.clone());
        ClientInner::start(
            Pool::Own(pool),
            self.operation_timeout,
            Some(manager),
            self.connect_timeout,
        )
    }
}

/// The seed nodes of a `redis+cluster://` or `rediss+cluster://` URL
/// (`[user:password@]host[:port],host[:port]...`, port 6379 by default), each as the
/// connection info of one node; `None` for any other URL.
fn cluster_nodes(url: &str) -> Result<Option<Vec<redis::ConnectionInfo>>> {
    let (scheme, rest) = match url.split_once("://") {
        Some((s @ ("redis+cluster" | "rediss+cluster"), rest)) => (s, rest),
        _ => return Ok(None),
    };
    let node_scheme = if scheme == "rediss+cluster" {
        "rediss"
    } else {
        "redis"
    };
    let bad = |why: &str| Error::InvalidArgument(format!("cluster URL {}: {why}", redact(url)));
    let rest = rest.split(['/', '?', '#']).next().unwrap_or("");
    let (auth, hosts) = match rest.rsplit_once('@') {
        Some((auth, hosts)) => (Some(auth), hosts),
        None => (None, rest),
    };
    let mut nodes = Vec::new();
    for host in hosts.split(',') {
        let host = host.trim();
        if host.is_empty() {
            return Err(bad("an empty node address"));
        }
        let has_port = host.rsplit_once(':').is_some_and(|(h, p)| {
            !h.is_empty() && !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit())
        });
        let with_port = if has_port {
            host.to_owned()
        } else {
            format!("{host}:6379")
        };
        let node_url = match auth {
            Some(a) => format!("{node_scheme}://{a}@{with_port}/"),
            None => format!("{node_scheme}://{with_port}/"),
        };
        let info = node_url
            .as_str()
            .into_connection_info()
            .map_err(|e| bad(&format!("node {host}: {e}")))?
            .set_tcp_settings(TcpSettings::default().set_nodelay(true));
        nodes.push(info);
    }
    if nodes.is_empty() {
        return Err(bad("no node address"));
    }
    Ok(Some(nodes))
}

/// `url` with any password replaced by `***`.
fn redact(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((auth, hosts)) => match auth.split_once(':') {
                Some((user, _)) => format!("{scheme}://{user}:***@{hosts}"),
                None => format!("{scheme}://***@{hosts}"),
            },
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
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
