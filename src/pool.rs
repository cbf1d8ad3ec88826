//! Connections: our own r2d2 manager (connect timeout, per-command timeouts,
//! TCP_NODELAY, connect errors sorted) to one server or a Sentinel service's current
//! primary, or a pool the user built, behind one checkout call.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::ConnectionLike;

use crate::connect::{connect_error_at, is_config_error};
use crate::error::{Error, Result};
use crate::topology::{Connector, PrimaryConn};

/// How much later than its deadline a call may end rather than pay for shortening its
/// connection's timeouts (see [`Conn::within`]).
pub(crate) const TIMEOUT_SLACK: Duration = Duration::from_millis(10);

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
    last_failure: Mutex<Option<(Instant, Error)>>,
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
        }))
    }

    /// Opens one connection, with its timeouts set; when no password is sent on
    /// connect, a `PING` finds at once a server that requires one.
    pub(crate) fn open(&self) -> Result<PrimaryConn> {
        self.open_within(self.connect_timeout)
    }

    /// [`open`](Self::open) with its own connect timeout.
    pub(crate) fn open_within(&self, connect_timeout: Duration) -> Result<PrimaryConn> {
        let result = self.open_inner(connect_timeout);
        if let Err(e) = &result {
            *self.last_failure.lock() = Some((Instant::now(), e.copy()));
        }
        result
    }

    fn open_inner(&self, connect_timeout: Duration) -> Result<PrimaryConn> {
        let (addr, tls) = (self.connector.addr(), self.connector.is_tls());
        let sort = |e: redis::RedisError| connect_error_at(&addr, tls, &e);
        let mut conn = self.connector.connect(connect_timeout).map_err(sort)?;
        conn.set_read_timeout(Some(self.op_timeout)).map_err(sort)?;
        conn.set_write_timeout(Some(self.op_timeout))
            .map_err(sort)?;
        if !self.connector.has_password() {
            redis::cmd("PING").exec(&mut conn.conn).map_err(sort)?;
        }
        Ok(conn)
    }

    /// What messages name as the server (never a password).
    pub(crate) fn addr(&self) -> String {
        self.connector.addr()
    }

    /// The error of a checkout that timed out while no connection could be made and
    /// none failed either: connecting hangs (a TLS handshake with a plaintext server
    /// waits for an answer that never comes with native-tls, which has no handshake
    /// timeout; a host that drops packets, with a connect timeout longer than the
    /// checkout timeout).
    fn stalled(&self) -> Error {
        let message = if self.connector.is_tls() {
            "no connection was made within the checkout timeout: the TLS handshake did not \
             finish (is this a plaintext port? use redis:// for a server without TLS)"
        } else {
            "no connection was made within the checkout timeout: connecting hangs"
        };
        Error::Connect {
            addr: self.addr(),
            message: message.to_owned(),
        }
    }

    /// The last connect error if it happened at or after `since`.
    fn failure_since(&self, since: Instant) -> Option<Error> {
        match &*self.last_failure.lock() {
            Some((at, e)) if *at >= since => Some(e.copy()),
            _ => None,
        }
    }
}

impl r2d2::ManageConnection for Manager {
    type Connection = PrimaryConn;
    type Error = Error;

    fn connect(&self) -> Result<PrimaryConn> {
        self.open()
    }

    fn is_valid(&self, conn: &mut PrimaryConn) -> Result<()> {
        redis::cmd("PING")
            .exec(&mut conn.conn)
            .map_err(Error::Redis)
    }

    fn has_broken(&self, conn: &mut PrimaryConn) -> bool {
        !conn.is_open() || conn.is_stale()
    }
}

/// How often a checkout that waits looks whether connecting has failed for a reason
/// that waiting will not fix.
const CHECKOUT_SLICE: Duration = Duration::from_millis(50);

/// Where connections come from.
#[derive(Clone)]
pub(crate) enum Pool {
    /// Built by [`crate::ClientBuilder`].
    Own(r2d2::Pool<Manager>, Manager),
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
            Pool::Own(p, m) => {
                let start = Instant::now();
                let deadline = start + timeout.unwrap_or_else(|| p.connection_timeout());
                loop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match p.get_timeout(left.min(CHECKOUT_SLICE)) {
                        // a connection to a replaced primary is never handed out: r2d2
                        // discards it (`has_broken`) and the next one is tried
                        Ok(c) if c.is_stale() => drop(c),
                        Ok(c) => return Ok(Conn::Own(c)),
                        Err(e) => {
                            let failure = m.failure_since(start);
                            match failure {
                                Some(f) if is_config_error(&f) => return Err(f),
                                _ if Instant::now() < deadline => {}
                                Some(f) => return Err(f),
                                // no connection at all, and none failed: connecting hangs
                                None if p.state().connections == 0 => return Err(m.stalled()),
                                None => return Err(Error::Pool(e)),
                            }
                        }
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

    /// The server's address for messages (`host:port`, never a password).
    pub(crate) fn addr(&self) -> String {
        match self {
            Pool::Own(_, m) => m.addr(),
            Pool::User(..) => "the server of the given pool".to_owned(),
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
            Conn::Own(c) => c,
            Conn::User(c) => c,
        }
    }
}

impl DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut redis::Connection {
        match self {
            Conn::Own(c) => c,
            Conn::User(c) => c,
        }
    }
}
