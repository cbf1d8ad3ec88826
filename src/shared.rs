//! What the background machinery (the refresher thread, the wake-up listener) shares
//! with the public handles: the pool, the registry of live permits, the counters and
//! the clock. It holds no handle and imports none of the public types, so the threads
//! cannot keep a client alive and the machinery does not depend on the layer above.

use std::time::{Duration, Instant};

use crate::clock::{Clock, deadline_in, left_until};
use crate::error::{Error, Result};
use crate::pool::{Conn, Pool, broke_connection};
use crate::registry::Registry;
use crate::stats::Counters;

/// What the background thread shares with the handles: never a handle itself, so the
/// thread cannot keep the client alive.
pub(crate) struct Shared {
    pub(crate) pool: Pool,
    /// Bounds each Redis command and each checkout made on behalf of a `Drop`.
    pub(crate) op_timeout: Duration,
    pub(crate) registry: parking_lot::Mutex<Registry>,
    /// "pid|host", recorded with every grant.
    pub(crate) origin: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) stats: Counters,
    /// The client's view of the server's clock (see `clock.rs`); on a cluster each
    /// semaphore keeps its own, of its node.
    pub(crate) clock: std::sync::Arc<Clock>,
}

impl Drop for Shared {
    /// Nothing can check a connection out of the client's own pool any more: the
    /// connects r2d2 still has queued or retries are not made ([`Manager::close`](
    /// crate::pool::Manager::close)), so the pool's threads end with those in flight.
    fn drop(&mut self) {
        if let Pool::Own(_, manager) = &self.pool {
            manager.close();
        }
    }
}

impl Shared {
    /// Whether the client's own pool connects to a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(&self.pool, Pool::Own(_, m) if m.connector.is_cluster())
    }

    /// A fresh connection ([`Pool::fresh`]: a brand-new one, not one of the pool's idle
    /// ones, which the server may all have closed; with a pool the user gave, a new
    /// checkout), its set-up ending by `deadline`: for a call sent again after its
    /// connection broke. Counted in [`Stats::resent`](crate::Stats::resent) once it is
    /// there.
    pub(crate) fn fresh_conn(&self, deadline: Instant) -> Result<Conn> {
        if Instant::now() >= deadline {
            return Err(Error::Redis(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no time left to send it again on a fresh connection",
            ))));
        }
        let fresh = self.pool.fresh(deadline, self.connect_timeout)?;
        Counters::bump(&self.stats.resent);
        Ok(fresh)
    }

    /// Runs `call` on a [`fresh_conn`](Self::fresh_conn), all of it (the connect and
    /// the call) ending by `deadline`.
    pub(crate) fn on_fresh<T>(
        &self,
        deadline: Instant,
        call: impl FnOnce(&mut Conn) -> Result<T>,
    ) -> Result<T> {
        let mut fresh = self.fresh_conn(deadline)?;
        fresh.within_conn(left_until(deadline), self.op_timeout, call)
    }

    /// [`on_fresh`](Self::on_fresh) for a call on the connection's requests only.
    pub(crate) fn on_fresh_connection<T>(
        &self,
        deadline: Instant,
        call: impl FnOnce(&mut dyn redis::ConnectionLike) -> Result<T>,
    ) -> Result<T> {
        self.on_fresh(deadline, |c| call(&mut **c))
    }

    /// Runs `call` on a pooled connection, the checkout and the call ending by `until`
    /// (with `None`: the pool's own wait for the checkout, and one operation timeout
    /// for the call); when it fails because its connection was broken
    /// ([`broken`](crate::pool::broken): the server closed it while it was idle in the
    /// pool, `CLIENT KILL`, a restart), it is sent once more on a fresh connection
    /// ([`on_fresh`](Self::on_fresh)) by the same end, and that answer is taken (when
    /// no fresh connection can be had, the first send's error is the answer). Only
    /// for calls safe to run twice (DESIGN invariant 11): the first may have run. A
    /// timeout is not sent again (the request may still run, and the time is spent).
    pub(crate) fn run_resending<T>(
        &self,
        until: Option<Instant>,
        mut call: impl FnMut(&mut Conn) -> Result<T>,
    ) -> Result<T> {
        let op = self.op_timeout;
        let mut conn = self.pool.get(until.map(left_until))?;
        let end = until.unwrap_or_else(|| deadline_in(op));
        let first = conn.within_conn(left_until(end), op, &mut call);
        // (back to the pool, which drops it when it broke, before a new one is opened)
        drop(conn);
        match first {
            Err(e) if broke_connection(&e) && Instant::now() < end => {
                log::debug!("redis-semaphore: a call is sent again on a fresh connection: {e}");
                // A fresh connection that cannot be had sends nothing: the answer is
                // then the first send's error (it may have run: in doubt), not the
                // connect's, which says nothing was sent (and a caller may repeat a
                // call after it that is not safe to repeat as a new call, a counting
                // release under a new operation key).
                match self.fresh_conn(end) {
                    Ok(mut fresh) => fresh.within_conn(left_until(end), op, call),
                    Err(again) => {
                        log::debug!(
                            "redis-semaphore: no fresh connection to send it again: {again}"
                        );
                        Err(e)
                    }
                }
            }
            other => other,
        }
    }
}
