//! Connections: our own r2d2 manager (connect timeout, per-command timeouts,
//! TCP_NODELAY) or a pool the user built, behind one checkout call.

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use redis::ConnectionLike;

use crate::error::{Error, Result};
use crate::topology::{Connector, PrimaryConn};

/// How much later than its deadline a call may end rather than pay for shortening its
/// connection's timeouts (see [`Conn::within`]).
pub(crate) const TIMEOUT_SLACK: Duration = Duration::from_millis(10);

/// An r2d2 manager that connects with a timeout and sets read and write timeouts on
/// every new connection, so no command can block for ever. Its connections go to the
/// current primary; one opened for a primary since replaced counts as broken.
#[derive(Debug, Clone)]
pub(crate) struct Manager {
    pub(crate) connector: Connector,
    pub(crate) connect_timeout: Duration,
    pub(crate) op_timeout: Duration,
}

impl r2d2::ManageConnection for Manager {
    type Connection = PrimaryConn;
    type Error = redis::RedisError;

    fn connect(&self) -> Result<PrimaryConn, redis::RedisError> {
        let conn = self.connector.connect(self.connect_timeout)?;
        conn.set_read_timeout(Some(self.op_timeout))?;
        conn.set_write_timeout(Some(self.op_timeout))?;
        Ok(conn)
    }

    fn is_valid(&self, conn: &mut PrimaryConn) -> Result<(), redis::RedisError> {
        redis::cmd("PING").exec(&mut conn.conn)
    }

    fn has_broken(&self, conn: &mut PrimaryConn) -> bool {
        !conn.is_open() || conn.is_stale()
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

/// A checked-out connection; derefs to [`redis::Connection`].
pub(crate) enum Conn {
    Own(r2d2::PooledConnection<Manager>),
    User(r2d2::PooledConnection<redis::Client>),
}

impl Pool {
    /// Checks a connection out, waiting at most `timeout` (the pool's own wait when `None`).
    pub(crate) fn get(&self, timeout: Option<Duration>) -> Result<Conn> {
        match self {
            Pool::Own(p) => {
                // a connection to a replaced primary is never handed out: dropped here,
                // r2d2 discards it (`has_broken`), and the next one is tried
                let deadline = timeout.map(|t| std::time::Instant::now() + t);
                loop {
                    let c = match deadline {
                        Some(d) => p.get_timeout(
                            d.saturating_duration_since(std::time::Instant::now())
                                .max(Duration::from_millis(1)),
                        )?,
                        None => p.get()?,
                    };
                    if !c.is_stale() {
                        return Ok(Conn::Own(c));
                    }
                }
            }
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
        f: impl FnOnce(&mut redis::Connection) -> R,
    ) -> R {
        if budget + TIMEOUT_SLACK.min(op / 10) >= op {
            return f(self);
        }
        let budget = budget.max(Duration::from_millis(1));
        let _ = self.set_read_timeout(Some(budget));
        let _ = self.set_write_timeout(Some(budget));
        let result = f(self);
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
    type Target = redis::Connection;
    fn deref(&self) -> &redis::Connection {
        match self {
            Conn::Own(c) => &c.conn,
            Conn::User(c) => c,
        }
    }
}

impl DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut redis::Connection {
        match self {
            Conn::Own(c) => &mut c.conn,
            Conn::User(c) => c,
        }
    }
}
