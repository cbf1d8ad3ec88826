//! What the background machinery (the refresher thread, the wake-up listener) shares
//! with the public handles: the pool, the registry of live permits, the counters and
//! the clock. It holds no handle and imports none of the public types, so the threads
//! cannot keep a client alive and the machinery does not depend on the layer above.

use std::time::Duration;

use crate::clock::Clock;
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

impl Shared {
    /// Whether the client's own pool connects to a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(&self.pool, Pool::Own(_, m) if m.connector.is_cluster())
    }
}
