//! The client's view of the server's clock, for deadlines the client must never place
//! after the server's.
//!
//! The scripts decide every deadline by the server's `TIME`, in milliseconds. The
//! client needs two conversions between that clock and its own monotonic one:
//!
//! - **A server deadline X to a client instant D** that is surely not after X: a
//!   permit is valid on the client only before D.
//! - **A client instant g to a server time C** that the server has surely reached by g:
//!   the cutoff sent with an acquire, after which the script refuses to run (the client
//!   gives up waiting at g and cleans up after g).
//!
//! Both use an [`Anchor`]: a round trip sent at client instant `s` and answered at `r`,
//! whose script read server time `T` in between (so `T` was read at some client instant
//! in `[s, r]`). If the two clocks run at rates that differ by at most [`DRIFT`] (NTP
//! slews a clock by at most 500 ppm), then server time `X` is reached no earlier than
//! `s + (X - T)(1 - DRIFT)` and the server has reached `T + (g - r)(1 - DRIFT)` by `g`.
//! One more millisecond is taken off both, for the server's millisecond rounding.
//! Any anchor gives a true bound; a recent one gives a tight one, and every acquire
//! reply brings a new one. docs/keepalive.md has the whole argument.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The most the rates of the server's and the client's clocks are assumed to differ:
/// 0.1 %, twice the most NTP ever slews a clock.
pub(crate) const DRIFT: f64 = 0.001;

/// A round trip that read the server's time: sent at `sent`, answered at `received`,
/// the server's time `server_ms` read in between.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Anchor {
    pub(crate) sent: Instant,
    pub(crate) received: Instant,
    pub(crate) server_ms: i64,
}

impl Anchor {
    /// The client instant before which the server's clock has surely not reached
    /// `at_ms`. For a moment already past it may give any instant not after `sent`.
    pub(crate) fn instant_before(&self, at_ms: i64) -> Instant {
        let span = at_ms - self.server_ms - 1;
        if span <= 0 {
            let back = Duration::from_millis(span.unsigned_abs());
            return self.sent.checked_sub(back).unwrap_or(self.sent);
        }
        self.sent + shrink(Duration::from_millis(span as u64))
    }

    /// A server time (ms) that the server's clock has surely reached by client instant
    /// `at`.
    pub(crate) fn server_ms_by(&self, at: Instant) -> i64 {
        let ahead = shrink(at.saturating_duration_since(self.received));
        self.server_ms + ahead.as_millis() as i64 - 1
    }
}

/// `d` less the drift allowance.
pub(crate) fn shrink(d: Duration) -> Duration {
    d.mul_f64(1.0 - DRIFT)
}

/// The client instant before which a lease of `lease` that a script set from its own
/// time, in a call sent at `sent`, surely still runs on the server. The script's
/// deadline is its time in whole milliseconds plus the lease, so up to a millisecond
/// less than `lease` after it ran: one millisecond is taken off, as
/// [`Anchor::instant_before`] takes it off.
pub(crate) fn lease_end(sent: Instant, lease: Duration) -> Instant {
    sent + shrink(lease.saturating_sub(Duration::from_millis(1)))
}

/// The instant `timeout` from now; a timeout past what `Instant` can hold is a
/// hundred years ("for ever") instead of an overflow.
pub(crate) fn deadline_in(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}

/// The bound of a wait with `deadline`: the deadline and one operation timeout `op`
/// (the call in flight at the deadline); `None` for a wait without one.
pub(crate) fn wait_end(deadline: Option<Instant>, op: Duration) -> Option<Instant> {
    deadline.map(|d| d.checked_add(op).unwrap_or(d))
}

/// What is left until `deadline`, at least a millisecond: a socket timeout cannot be
/// zero, and a call whose time is up still gets one short try.
pub(crate) fn left_until(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// The freshest anchor of a client, shared by its threads.
#[derive(Debug, Default)]
pub(crate) struct Clock {
    anchor: Mutex<Option<Anchor>>,
}

impl Clock {
    /// The freshest anchor, if any round trip has made one.
    pub(crate) fn get(&self) -> Option<Anchor> {
        *self.anchor.lock()
    }

    /// Offers a new anchor; the most recently answered one is kept.
    pub(crate) fn update(&self, a: Anchor) {
        let mut cur = self.anchor.lock();
        if cur.is_none_or(|c| a.received >= c.received) {
            *cur = Some(a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_never_come_later_than_the_span_and_cutoffs_never_later_than_time_passed() {
        let s = Instant::now();
        let a = Anchor {
            sent: s,
            received: s + Duration::from_millis(3),
            server_ms: 1_000_000,
        };
        let d = a.instant_before(1_000_000 + 10_000);
        assert!(d <= s + Duration::from_millis(10_000));
        assert!(d >= s + Duration::from_millis(9_980));
        assert!(a.instant_before(999_000) <= s);
        let c = a.server_ms_by(s + Duration::from_millis(3 + 2_000));
        assert!(c <= 1_002_000);
        assert!(c >= 1_001_990);
    }

    #[test]
    fn the_most_recent_answer_wins() {
        let clock = Clock::default();
        let s = Instant::now();
        let new = Anchor {
            sent: s,
            received: s + Duration::from_millis(5),
            server_ms: 2,
        };
        let old = Anchor {
            sent: s,
            received: s + Duration::from_millis(1),
            server_ms: 1,
        };
        clock.update(new);
        clock.update(old);
        assert_eq!(clock.get().unwrap().server_ms, 2);
    }
}
