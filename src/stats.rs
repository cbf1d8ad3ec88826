//! Counters of a [`Client`](crate::Client): atomics bumped on the paths they count,
//! read as a [`Stats`] snapshot. Cheap enough to leave on: a relaxed atomic add per
//! event, no lock.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of the wait-latency histogram buckets; the last bucket counts the rest.
const BOUNDS_US: [u64; 12] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 50_000, 100_000, 1_000_000, 10_000_000, 60_000_000,
];

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) acquired: AtomicU64,
    pub(crate) try_failed: AtomicU64,
    pub(crate) waits: AtomicU64,
    pub(crate) wait_gave_up: AtomicU64,
    wait_hist: [AtomicU64; BOUNDS_US.len() + 1],
    wait_total_us: AtomicU64,
    pub(crate) released: AtomicU64,
    pub(crate) release_failed: AtomicU64,
    pub(crate) release_gone: AtomicU64,
    pub(crate) refresh_calls: AtomicU64,
    pub(crate) refresh_failed: AtomicU64,
    pub(crate) lost: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) reconnects: AtomicU64,
    pub(crate) resent: AtomicU64,
}

impl Counters {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
    }

    /// Records a blocking acquire that waited `d` and was granted.
    pub(crate) fn waited(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let bucket = BOUNDS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(BOUNDS_US.len());
        self.wait_hist[bucket].fetch_add(1, Relaxed);
        self.wait_total_us.fetch_add(us, Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let get = |c: &AtomicU64| c.load(Relaxed);
        Stats {
            acquired: get(&self.acquired),
            try_failed: get(&self.try_failed),
            waits: get(&self.waits),
            wait_gave_up: get(&self.wait_gave_up),
            wait_latency: BOUNDS_US
                .iter()
                .map(|&b| Some(Duration::from_micros(b)))
                .chain([None])
                .zip(self.wait_hist.iter().map(get))
                .collect(),
            wait_total: Duration::from_micros(get(&self.wait_total_us)),
            released: get(&self.released),
            release_failed: get(&self.release_failed),
            release_gone: get(&self.release_gone),
            refresh_calls: get(&self.refresh_calls),
            refresh_failed: get(&self.refresh_failed),
            lost: get(&self.lost),
            errors: get(&self.errors),
            reconnects: get(&self.reconnects),
            resent: get(&self.resent),
        }
    }
}

/// A snapshot of a client's counters since it was opened, from
/// [`Client::stats`](crate::Client::stats). Every count is cumulative.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Stats {
    /// Permit guards granted, by any acquire; and successful acquires of the ownerless
    /// semaphores ([`CountingSemaphore`](crate::CountingSemaphore), Redisson's
    /// `RSemaphore`), one per call whatever its number of permits, as a guard of
    /// several permits is one.
    pub acquired: u64,
    /// `try_acquire` calls (and first looks of blocking acquires) that found no
    /// permit free.
    pub try_failed: u64,
    /// Blocking acquires that had to queue and wait.
    pub waits: u64,
    /// Blocking acquires that gave up: timed out or cancelled.
    pub wait_gave_up: u64,
    /// How long granted waits took: `(upper bound, count)` per bucket, the last bucket
    /// (bound `None`) counting everything longer.
    pub wait_latency: Vec<(Option<Duration>, u64)>,
    /// The sum of all granted waits.
    pub wait_total: Duration,
    /// Permits given back without error (by `release` or `Drop`); and releases of the
    /// ownerless semaphores that gave permits back, one per call.
    pub released: u64,
    /// Releases that failed: Redis or pool errors, or a bad reply (the lease then ends
    /// by itself).
    pub release_failed: u64,
    /// Releases of permits that were already gone (lost, force-released, or released
    /// after their lease ended: [`Error::PermitLost`](crate::Error::PermitLost),
    /// [`Error::LeaseExpired`](crate::Error::LeaseExpired)): an expected outcome, not
    /// a failure.
    pub release_gone: u64,
    /// Refresh script calls made by the background thread (one per semaphore per tick).
    pub refresh_calls: u64,
    /// Refresh calls that failed (Redis unreachable, bad reply). On a cluster, where
    /// the thread need not wait for a call to the end, a call is counted when it ends.
    pub refresh_failed: u64,
    /// Permits declared lost.
    pub lost: u64,
    /// Operations that failed with a Redis or pool error.
    pub errors: u64,
    /// Times the wake-up listener had to reconnect.
    pub reconnects: u64,
    /// Calls sent again on a fresh connection because their pooled one was broken
    /// (closed by the server while it was idle in the pool: Redis's `timeout`, an
    /// idle cut of a load balancer, `CLIENT KILL`, a restart). Every call of every
    /// semaphore type is safe to run twice (the counting semaphore's and `RSemaphore`'s
    /// by an operation key), so the caller sees the answer of the second send, not
    /// the broken connection's error.
    pub resent: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "serde")]
    #[test]
    fn stats_serialize() {
        let c = Counters::default();
        Counters::bump(&c.acquired);
        let v = serde_json::to_value(c.snapshot()).unwrap();
        assert_eq!(v["acquired"], 1);
        assert_eq!(v["release_gone"], 0);
    }

    #[test]
    fn waits_land_in_their_bucket() {
        let c = Counters::default();
        c.waited(Duration::from_micros(90));
        c.waited(Duration::from_millis(3));
        c.waited(Duration::from_secs(120));
        Counters::bump(&c.acquired);
        let s = c.snapshot();
        assert_eq!(s.acquired, 1);
        assert_eq!(s.wait_latency[0], (Some(Duration::from_micros(100)), 1));
        assert_eq!(s.wait_latency[5], (Some(Duration::from_millis(5)), 1));
        assert_eq!(s.wait_latency.last(), Some(&(None, 1)));
        assert_eq!(s.wait_latency.iter().map(|b| b.1).sum::<u64>(), 3);
    }
}
