//! What the background machinery (the refresher thread, the wake-up listener) shares
//! with the public handles: the pool, the registry of live permits, the counters and
//! the clock. It holds no handle and imports none of the public types, so the threads
//! cannot keep a client alive and the machinery does not depend on the layer above.

use std::time::{Duration, Instant};

use crate::clock::{Clock, IoTimeouts, left_until};
use crate::error::{Error, Result};
use crate::pool::Pool;
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

    /// Runs `call` on a brand-new connection (not one of the pool's idle ones, which a
    /// `CLIENT KILL` or a restart may all have broken), all of it ending by
    /// `deadline`: for a release sent again after its connection broke. With a pool
    /// the user gave, a new checkout (the pool dropped the broken connection).
    pub(crate) fn on_fresh_connection<T>(
        &self,
        deadline: Instant,
        call: impl FnOnce(&mut dyn redis::ConnectionLike) -> Result<T>,
    ) -> Result<T> {
        let left = left_until(deadline);
        if left.is_zero() {
            return Err(Error::Redis(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no time left to send it again on a fresh connection",
            ))));
        }
        match &self.pool {
            Pool::Own(_, manager) => {
                let mut fresh =
                    manager.open_within(left.min(self.connect_timeout), Some(deadline))?;
                fresh
                    .io_within(Some(left_until(deadline)))
                    .map_err(Error::Redis)?;
                call(&mut fresh)
            }
            Pool::User(..) => {
                let mut pooled = self.pool.get(Some(left))?;
                pooled.within(left_until(deadline), self.op_timeout, |c| call(c))
            }
        }
    }
}
