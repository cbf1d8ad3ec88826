//! Connections: our own r2d2 manager (connect timeout, per-command timeouts,
//! TCP_NODELAY) to one server or a Redis Cluster, or a pool the user built, behind one
//! checkout call.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redis::ConnectionLike;

use crate::error::{Error, Result};

/// How much later than its deadline a call may end rather than pay for shortening its
/// connection's timeouts (see [`Conn::within`]).
pub(crate) const TIMEOUT_SLACK: Duration = Duration::from_millis(10);

/// Where the library's own connections go: one server (plain, TLS, unix socket) or a
/// Redis Cluster.
#[derive(Clone)]
pub(crate) enum Source {
    Single(redis::Client),
    Cluster(Arc<ClusterSource>),
}

/// A Redis Cluster: the cluster client (slot map, redirections, retries) and the seed
/// nodes, for the plain connections the wake-up listener and `SCAN` need.
pub(crate) struct ClusterSource {
    pub(crate) client: redis::cluster::ClusterClient,
    pub(crate) nodes: Vec<redis::ConnectionInfo>,
    /// The seed the next plain connection tries first: rotates, so that a listener
    /// whose node failed subscribes on another.
    pub(crate) next: AtomicUsize,
}

impl Source {
    /// A plain connection to one server: the server, or for a cluster one reachable
    /// node (the seeds in turn, starting after the one used last).
    pub(crate) fn plain(&self, timeout: Duration) -> redis::RedisResult<redis::Connection> {
        match self {
            Source::Single(client) => client.get_connection_with_timeout(timeout),
            Source::Cluster(c) => {
                let start = c.next.fetch_add(1, Ordering::Relaxed);
                let mut last = None;
                for k in 0..c.nodes.len() {
                    let info = c.nodes[(start + k) % c.nodes.len()].clone();
                    match redis::Client::open(info)
                        .and_then(|cl| cl.get_connection_with_timeout(timeout))
                    {
                        Ok(conn) => return Ok(conn),
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.unwrap_or_else(|| {
                    redis::RedisError::from((redis::ErrorKind::Client, "no cluster node given"))
                }))
            }
        }
    }

    /// Whether this is a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Source::Cluster(_))
    }
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Single(_) => f.write_str("Single"),
            Source::Cluster(c) => write!(f, "Cluster({} seed nodes)", c.nodes.len()),
        }
    }
}

/// A connection of the library's own pool: to one server, or to a Redis Cluster
/// (which routes each command to the node owning its keys' slot).
pub(crate) enum RConn {
    Plain(redis::Connection),
    /// With whether a command failed for want of a node: the connection's slot map
    /// may then name a node that is gone (a failed primary whose replica took over
    /// without a `MOVED` ever reaching us), so the pool replaces the whole connection
    /// and the next one reads the slot map afresh.
    Cluster(Box<redis::cluster::ClusterConnection>, bool),
}

/// How many times the cluster client sends one command at most (a `MOVED` after a
/// failover or a slot migration, a dropped node connection): the first attempt and
/// two retries. Every script is safe to run twice (DESIGN invariant 11).
pub(crate) const CLUSTER_ATTEMPTS: u32 = 3;

/// The per-attempt share of a timeout `d` on a cluster connection, so that every
/// attempt of one command together stays within `d`.
pub(crate) fn per_attempt(d: Duration) -> Duration {
    (d / CLUSTER_ATTEMPTS).max(Duration::from_millis(1))
}

impl RConn {
    /// Sets the read timeout: on a cluster, each attempt gets its share
    /// ([`per_attempt`]), so that a command with its retries ends within `d`.
    pub(crate) fn set_read_timeout(&self, d: Option<Duration>) -> redis::RedisResult<()> {
        match self {
            RConn::Plain(c) => c.set_read_timeout(d),
            RConn::Cluster(c, _) => c.set_read_timeout(d.map(per_attempt)),
        }
    }

    /// Sets the write timeout, as [`set_read_timeout`](Self::set_read_timeout).
    pub(crate) fn set_write_timeout(&self, d: Option<Duration>) -> redis::RedisResult<()> {
        match self {
            RConn::Plain(c) => c.set_write_timeout(d),
            RConn::Cluster(c, _) => c.set_write_timeout(d.map(per_attempt)),
        }
    }
}

impl ConnectionLike for RConn {
    fn req_packed_command(&mut self, cmd: &[u8]) -> redis::RedisResult<redis::Value> {
        match self {
            RConn::Plain(c) => c.req_packed_command(cmd),
            RConn::Cluster(c, broken) => noting(broken, c.req_packed_command(cmd)),
        }
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        match self {
            RConn::Plain(c) => c.req_packed_commands(cmd, offset, count),
            RConn::Cluster(c, broken) => noting(broken, c.req_packed_commands(cmd, offset, count)),
        }
    }

    fn req_command(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        match self {
            RConn::Plain(c) => c.req_command(cmd),
            RConn::Cluster(c, broken) => noting(broken, c.req_command(cmd)),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RConn::Plain(c) => c.get_db(),
            RConn::Cluster(c, _) => c.get_db(),
        }
    }

    fn supports_pipelining(&self) -> bool {
        match self {
            RConn::Plain(c) => c.supports_pipelining(),
            RConn::Cluster(c, _) => c.supports_pipelining(),
        }
    }

    fn check_connection(&mut self) -> bool {
        match self {
            RConn::Plain(c) => c.check_connection(),
            RConn::Cluster(c, _) => c.check_connection(),
        }
    }

    fn is_open(&self) -> bool {
        match self {
            RConn::Plain(c) => c.is_open(),
            RConn::Cluster(c, broken) => !*broken && c.is_open(),
        }
    }
}

/// Passes `result` on, noting in `broken` an error that says a node could not be
/// reached or did not answer.
fn noting<T>(broken: &mut bool, result: redis::RedisResult<T>) -> redis::RedisResult<T> {
    if let Err(e) = &result
        && (e.is_io_error()
            || e.is_connection_refusal()
            || e.is_connection_dropped()
            || e.is_timeout())
    {
        *broken = true;
    }
    result
}

/// An r2d2 manager that connects with a timeout and sets read and write timeouts on
/// every new connection, so no command can block for ever.
#[derive(Debug, Clone)]
pub(crate) struct Manager {
    pub(crate) source: Source,
    pub(crate) connect_timeout: Duration,
    pub(crate) op_timeout: Duration,
}

impl Manager {
    /// A new connection, with the operation timeout set.
    pub(crate) fn open(&self, connect_timeout: Duration) -> redis::RedisResult<RConn> {
        let conn = match &self.source {
            Source::Single(client) => {
                RConn::Plain(client.get_connection_with_timeout(connect_timeout)?)
            }
            // the cluster client's own connect and response timeouts are set when it
            // is built (`ClientBuilder::build`)
            Source::Cluster(c) => RConn::Cluster(Box::new(c.client.get_connection()?), false),
        };
        conn.set_read_timeout(Some(self.op_timeout))?;
        conn.set_write_timeout(Some(self.op_timeout))?;
        Ok(conn)
    }
}

impl r2d2::ManageConnection for Manager {
    type Connection = RConn;
    type Error = redis::RedisError;

    fn connect(&self) -> Result<RConn, redis::RedisError> {
        self.open(self.connect_timeout)
    }

    fn is_valid(&self, conn: &mut RConn) -> Result<(), redis::RedisError> {
        redis::cmd("PING").exec(conn)
    }

    fn has_broken(&self, conn: &mut RConn) -> bool {
        !conn.is_open()
    }
}

/// Where connections come from.
#[derive(Clone)]
pub(crate) enum Pool {
    /// Built by [`crate::ClientBuilder`].
    Own(r2d2::Pool<Manager>),
    /// Given to [`crate::Client::from_pool`]; the operation timeout is set on each checkout.
    User(r2d2::Pool<redis::Client>, Duration),
}

/// A checked-out connection; derefs to a [`ConnectionLike`] that scripts and commands
/// run on.
pub(crate) enum Conn {
    Own(r2d2::PooledConnection<Manager>),
    User(r2d2::PooledConnection<redis::Client>),
}

impl Pool {
    /// Checks a connection out, waiting at most `timeout` (the pool's own wait when `None`).
    pub(crate) fn get(&self, timeout: Option<Duration>) -> Result<Conn> {
        match self {
            Pool::Own(p) => Ok(Conn::Own(match timeout {
                Some(t) => p.get_timeout(t)?,
                None => p.get()?,
            })),
            Pool::User(p, op) => {
                let c = match timeout {
                    Some(t) => p.get_timeout(t)?,
                    None => p.get()?,
                };
                c.set_read_timeout(Some(*op)).map_err(Error::Redis)?;
                c.set_write_timeout(Some(*op)).map_err(Error::Redis)?;
                Ok(Conn::User(c))
            }
        }
    }

    /// The most connections the pool holds.
    pub(crate) fn max_size(&self) -> u32 {
        match self {
            Pool::Own(p) => p.max_size(),
            Pool::User(p, _) => p.max_size(),
        }
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("max_size", &self.max_size())
            .finish()
    }
}

impl Conn {
    pub(crate) fn set_read_timeout(&self, d: Option<Duration>) -> redis::RedisResult<()> {
        match self {
            Conn::Own(c) => c.set_read_timeout(d),
            Conn::User(c) => c.set_read_timeout(d),
        }
    }

    pub(crate) fn set_write_timeout(&self, d: Option<Duration>) -> redis::RedisResult<()> {
        match self {
            Conn::Own(c) => c.set_write_timeout(d),
            Conn::User(c) => c.set_write_timeout(d),
        }
    }

    /// The cluster connection under this one, for commands routed by hand.
    pub(crate) fn cluster(&mut self) -> Option<&mut redis::cluster::ClusterConnection> {
        match self {
            Conn::Own(c) => match &mut **c {
                RConn::Cluster(c, _) => Some(c),
                RConn::Plain(_) => None,
            },
            Conn::User(_) => None,
        }
    }

    /// The plain connection under this one, for a subscription; `None` on a cluster.
    pub(crate) fn plain(&mut self) -> Option<&mut redis::Connection> {
        match self {
            Conn::Own(c) => match &mut **c {
                RConn::Plain(c) => Some(c),
                RConn::Cluster(..) => None,
            },
            Conn::User(c) => Some(c),
        }
    }

    /// Runs `f` with read and write timeouts of `budget` when that is shorter than the
    /// operation timeout `op` by more than [`TIMEOUT_SLACK`], restored to `op` before the
    /// connection goes back to the pool. A reply that comes after the short timeout is
    /// skipped by the connection, so its next user does not read it.
    ///
    /// The slack spares the four `setsockopt` calls (measured: a visible share of the
    /// client's CPU under contention) for a call that has spent almost nothing of its
    /// budget yet, at the price of ending at most the slack after its deadline.
    pub(crate) fn within<R>(
        &mut self,
        budget: Duration,
        op: Duration,
        f: impl FnOnce(&mut dyn ConnectionLike) -> R,
    ) -> R {
        if budget + TIMEOUT_SLACK.min(op / 10) >= op {
            return f(&mut **self);
        }
        let budget = budget.max(Duration::from_millis(1));
        let _ = self.set_read_timeout(Some(budget));
        let _ = self.set_write_timeout(Some(budget));
        let result = f(&mut **self);
        let restored = self
            .set_read_timeout(Some(op))
            .and_then(|()| self.set_write_timeout(Some(op)));
        if let Err(e) = restored {
            log::warn!("redis-semaphore: cannot restore a connection's timeouts: {e}");
        }
        result
    }
}

impl Deref for Conn {
    type Target = dyn ConnectionLike;
    fn deref(&self) -> &(dyn ConnectionLike + 'static) {
        match self {
            Conn::Own(c) => &**c,
            Conn::User(c) => &**c,
        }
    }
}

impl DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut (dyn ConnectionLike + 'static) {
        match self {
            Conn::Own(c) => &mut **c,
            Conn::User(c) => &mut **c,
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command(&mut self, cmd: &[u8]) -> redis::RedisResult<redis::Value> {
        (**self).req_packed_command(cmd)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        (**self).req_packed_commands(cmd, offset, count)
    }

    fn req_command(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        (**self).req_command(cmd)
    }

    fn get_db(&self) -> i64 {
        (**self).get_db()
    }

    fn supports_pipelining(&self) -> bool {
        (**self).supports_pipelining()
    }

    fn check_connection(&mut self) -> bool {
        (**self).check_connection()
    }

    fn is_open(&self) -> bool {
        (**self).is_open()
    }
}
