//! Per-semaphore reporting through the [`metrics`](https://docs.rs/metrics) facade, with
//! the `metrics` feature: next to the client's [`Counters`](crate::stats::Counters),
//! each semaphore handle holds a [`SemMetrics`] with its handles, looked up once when
//! the handle is built (labels `semaphore` = the name and `kind`), so an event is one
//! call on a cached handle: no lookup, no allocation.
//!
//! Without the feature `SemMetrics` has no fields and every method is an empty inline
//! function: no dependency, no work.
//!
//! Base layer: imports nothing but the error type, so the public types and the
//! background machinery (`PermitState::mark_lost`) can both call it.

use std::time::Duration;

use crate::error::LostReason;

/// Which semaphore type reports: the value of the `kind` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// [`Semaphore`](crate::Semaphore).
    Leased,
    /// [`CountingSemaphore`](crate::CountingSemaphore).
    Counting,
}

impl Kind {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn label(self) -> &'static str {
        match self {
            Kind::Leased => "leased",
            Kind::Counting => "counting",
        }
    }
}

/// The value of the `reason` label of `redis_semaphore_lost_total`.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
fn reason_label(r: LostReason) -> &'static str {
    match r {
        LostReason::Expired => "expired",
        LostReason::Released => "released",
        LostReason::Reset => "reset",
        LostReason::MaxHold => "max_hold",
    }
}

/// Every `LostReason`, in the order of [`Handles::lost`].
#[cfg(feature = "metrics")]
const REASONS: [LostReason; 4] = [
    LostReason::Expired,
    LostReason::Released,
    LostReason::Reset,
    LostReason::MaxHold,
];

/// The metric names, with what they count (given to the recorder once by `describe`).
#[cfg(feature = "metrics")]
mod names {
    pub(super) const ACQUIRED: &str = "redis_semaphore_acquired_total";
    pub(super) const TRY_FAILED: &str = "redis_semaphore_try_failed_total";
    pub(super) const WAITS: &str = "redis_semaphore_waits_total";
    pub(super) const WAIT_GAVE_UP: &str = "redis_semaphore_wait_gave_up_total";
    pub(super) const WAIT_SECONDS: &str = "redis_semaphore_wait_seconds";
    pub(super) const RELEASED: &str = "redis_semaphore_released_total";
    pub(super) const RELEASE_GONE: &str = "redis_semaphore_release_gone_total";
    pub(super) const RELEASE_FAILED: &str = "redis_semaphore_release_failed_total";
    pub(super) const LOST: &str = "redis_semaphore_lost_total";
    pub(super) const ERRORS: &str = "redis_semaphore_errors_total";
}

#[cfg(feature = "metrics")]
fn describe() {
    use ::metrics::{Unit, describe_counter, describe_histogram};
    use names::*;
    describe_counter!(
        ACQUIRED,
        "Permits granted (a Permit guard, or a counting semaphore's successful acquire)"
    );
    describe_counter!(
        TRY_FAILED,
        "Tries (and first looks of blocking acquires) that found no permit free"
    );
    describe_counter!(WAITS, "Blocking acquires that had to queue and wait");
    describe_counter!(
        WAIT_GAVE_UP,
        "Blocking acquires that gave up: timed out or cancelled"
    );
    describe_histogram!(WAIT_SECONDS, Unit::Seconds, "How long granted waits took");
    describe_counter!(RELEASED, "Permits given back without error");
    describe_counter!(
        RELEASE_GONE,
        "Releases of permits already gone (lost, force-released, or expired)"
    );
    describe_counter!(
        RELEASE_FAILED,
        "Releases that failed (Redis or pool error, bad reply): the lease ends by itself"
    );
    describe_counter!(LOST, "Permits declared lost while held, by reason");
    describe_counter!(ERRORS, "Operations that failed with a Redis or pool error");
}

#[cfg(feature = "metrics")]
struct Handles {
    acquired: ::metrics::Counter,
    try_failed: ::metrics::Counter,
    waits: ::metrics::Counter,
    wait_gave_up: ::metrics::Counter,
    wait_seconds: ::metrics::Histogram,
    released: ::metrics::Counter,
    release_gone: ::metrics::Counter,
    release_failed: ::metrics::Counter,
    /// One per `LostReason`, in the order of `REASONS`.
    lost: [::metrics::Counter; REASONS.len()],
    errors: ::metrics::Counter,
}

/// The metric handles of one semaphore handle; empty (reports nothing) for the
/// compatibility types and without the `metrics` feature. Cheap to clone (one `Arc`).
#[derive(Clone, Default)]
pub(crate) struct SemMetrics {
    #[cfg(feature = "metrics")]
    handles: Option<std::sync::Arc<Handles>>,
}

impl std::fmt::Debug for SemMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SemMetrics")
    }
}

/// Runs `f` on the handles, when there are any.
macro_rules! with_handles {
    ($self:ident, $h:ident => $body:expr) => {{
        #[cfg(feature = "metrics")]
        if let Some($h) = &$self.handles {
            $body;
        }
    }};
}

impl SemMetrics {
    /// Looks up the handles of semaphore `name` in the recorder installed now (the
    /// first call also describes the metrics to it). A handle built before the
    /// application installs its recorder reports to the no-op recorder.
    pub(crate) fn new(kind: Kind, name: &str) -> SemMetrics {
        #[cfg(feature = "metrics")]
        {
            use ::metrics::{SharedString, counter, histogram};
            use names::*;
            static DESCRIBED: std::sync::Once = std::sync::Once::new();
            DESCRIBED.call_once(describe);
            // One shared copy of the name for every label.
            let name: std::sync::Arc<str> = std::sync::Arc::from(name);
            let sem = || SharedString::from(std::sync::Arc::clone(&name));
            let kind = kind.label();
            let c = |metric: &'static str| counter!(metric, "semaphore" => sem(), "kind" => kind);
            let handles = Handles {
                acquired: c(ACQUIRED),
                try_failed: c(TRY_FAILED),
                waits: c(WAITS),
                wait_gave_up: c(WAIT_GAVE_UP),
                wait_seconds: histogram!(WAIT_SECONDS, "semaphore" => sem(), "kind" => kind),
                released: c(RELEASED),
                release_gone: c(RELEASE_GONE),
                release_failed: c(RELEASE_FAILED),
                lost: REASONS.map(|r| {
                    counter!(LOST, "semaphore" => sem(), "kind" => kind, "reason" => reason_label(r))
                }),
                errors: c(ERRORS),
            };
            SemMetrics {
                handles: Some(std::sync::Arc::new(handles)),
            }
        }
        #[cfg(not(feature = "metrics"))]
        {
            let _ = (kind, name);
            SemMetrics {}
        }
    }

    #[inline]
    pub(crate) fn acquired(&self) {
        with_handles!(self, h => h.acquired.increment(1));
    }

    #[inline]
    pub(crate) fn try_failed(&self) {
        with_handles!(self, h => h.try_failed.increment(1));
    }

    #[inline]
    pub(crate) fn waits(&self) {
        with_handles!(self, h => h.waits.increment(1));
    }

    #[inline]
    pub(crate) fn wait_gave_up(&self) {
        with_handles!(self, h => h.wait_gave_up.increment(1));
    }

    /// A blocking acquire that waited `d` and was granted.
    #[inline]
    pub(crate) fn waited(&self, d: Duration) {
        let _ = d;
        with_handles!(self, h => h.wait_seconds.record(d.as_secs_f64()));
    }

    #[inline]
    pub(crate) fn released(&self) {
        with_handles!(self, h => h.released.increment(1));
    }

    #[inline]
    pub(crate) fn release_gone(&self) {
        with_handles!(self, h => h.release_gone.increment(1));
    }

    #[inline]
    pub(crate) fn release_failed(&self) {
        with_handles!(self, h => h.release_failed.increment(1));
    }

    /// A permit declared lost (called once per permit, where the loss is recorded).
    #[inline]
    pub(crate) fn lost(&self, reason: LostReason) {
        let _ = reason;
        with_handles!(self, h => {
            let i = REASONS.iter().position(|&r| r == reason).unwrap_or(0);
            h.lost[i].increment(1)
        });
    }

    #[inline]
    pub(crate) fn errors(&self) {
        with_handles!(self, h => h.errors.increment(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_own_label() {
        let labels = [
            LostReason::Expired,
            LostReason::Released,
            LostReason::Reset,
            LostReason::MaxHold,
        ]
        .map(reason_label);
        for (i, l) in labels.iter().enumerate() {
            assert!(!labels[..i].contains(l), "{l} twice");
        }
        assert_eq!(Kind::Counting.label(), "counting");
    }

    #[test]
    fn without_handles_every_event_is_a_no_op() {
        let m = SemMetrics::default();
        m.acquired();
        m.waited(Duration::from_millis(1));
        m.lost(LostReason::Reset);
    }
}
