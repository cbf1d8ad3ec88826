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
    ///
    /// Any `at_ms` is taken, however far from the anchor (a deadline read from a
    /// message nobody vouches for): the arithmetic saturates, and a moment too far on
    /// for an `Instant` gives `sent`, which is never wrong (only useless).
    pub(crate) fn instant_before(&self, at_ms: i64) -> Instant {
        let span = at_ms.saturating_sub(self.server_ms).saturating_sub(1);
        if span <= 0 {
            let back = Duration::from_millis(span.unsigned_abs());
            return self.sent.checked_sub(back).unwrap_or(self.sent);
        }
        self.sent
            .checked_add(shrink(Duration::from_millis(span.unsigned_abs())))
            .unwrap_or(self.sent)
    }

    /// A server time (ms) that the server's clock has surely reached by client instant
    /// `at`.
    pub(crate) fn server_ms_by(&self, at: Instant) -> i64 {
        let ahead = shrink(at.saturating_duration_since(self.received));
        let ahead = i64::try_from(ahead.as_millis()).unwrap_or(i64::MAX);
        self.server_ms.saturating_add(ahead).saturating_sub(1)
    }

    /// A server time (ms) that the server's clock had surely not passed at client
    /// instant `at`, while its clock runs as the anchor's [`DRIFT`] assumes (a server
    /// whose clock was stepped forward, or a failover to one whose clock is ahead, may
    /// be past it): the time `server_ms` was read at `sent` at the earliest, and one
    /// millisecond more for its rounding. What a message pushed at `at` can truly say
    /// of the server's time.
    pub(crate) fn server_ms_at_most(&self, at: Instant) -> i64 {
        let since = at.saturating_duration_since(self.sent);
        let ahead = since.mul_f64(1.0 + DRIFT) + Duration::from_millis(1);
        let ahead = i64::try_from(ahead.as_millis()).unwrap_or(i64::MAX);
        self.server_ms.saturating_add(ahead).saturating_add(1)
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

thread_local! {
    /// The end of the bounded call running on this thread ([`CallEnd`]), if any.
    static CALL_END: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// While alive, marks the end of the bounded call running on this thread, for the
/// steps a client library takes inside the call with timeouts of its own (the cluster
/// client reconnecting a node: see `node::NodeConn`). A call inside a call keeps the
/// earlier end.
pub(crate) struct CallEnd {
    outer: Option<Instant>,
}

impl CallEnd {
    /// Marks `end` as the end of the call on this thread until the guard goes.
    pub(crate) fn start(end: Instant) -> CallEnd {
        let outer = CALL_END.get();
        CALL_END.set(Some(outer.map_or(end, |o| o.min(end))));
        CallEnd { outer }
    }

    /// The end of the bounded call running on this thread, if any.
    pub(crate) fn current() -> Option<Instant> {
        CALL_END.get()
    }
}

impl Drop for CallEnd {
    fn drop(&mut self) {
        CALL_END.set(self.outer);
    }
}

/// What is left until `deadline`, at least a millisecond: a socket timeout cannot be
/// zero, and a call whose time is up still gets one short try.
pub(crate) fn left_until(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// The most the kernel may add to a socket timeout beyond its eighth (below): two
/// ticks of a kernel built with the coarsest common tick, 100 Hz.
const KERNEL_TICKS: Duration = Duration::from_millis(20);

/// How much of its budget a call may have spent and still keep its connection's
/// standing timeouts (those of the operation timeout) rather than pay for shortening
/// them (`pool::Conn::within_conn`): [`socket_timeout`] leaves this much to spare.
pub(crate) const TIMEOUT_SLACK: Duration = Duration::from_millis(10);

/// The socket timeout to set for a read or a write that must end within `d`.
///
/// Linux keeps socket timeouts (`SO_RCVTIMEO`, `SO_SNDTIMEO`) on its timer wheel,
/// which never fires a timer early but may fire it late by up to an eighth of its
/// length, and by a tick or two more (measured on the development VM with a socket
/// that got no answer: 50 ms ended 7.6 ms late, 1 s 24 ms, 2.5 s 64 ms, 5 s 124 ms).
/// A timeout `t` with `t + t/8 + KERNEL_TICKS + TIMEOUT_SLACK <= d` therefore ends
/// within `d`, with the slack to spare: a reply is waited for about 8/9 of `d`, and a
/// call, or a drop, ends by its bound. Under 120 ms the fixed part shrinks to a
/// quarter of `d` (a cluster's per-attempt share of a short operation timeout, say,
/// keeps a timeout it can use; a tick or two late there is the kernel's to give).
pub(crate) fn socket_timeout(d: Duration) -> Duration {
    let fixed = (KERNEL_TICKS + TIMEOUT_SLACK).min(d / 4);
    (d.saturating_sub(fixed) * 8 / 9).max(Duration::from_millis(1))
}

/// How late a server may answer a blocking command after its own timeout: it checks
/// blocked clients' timeouts in its event loop, which sleeps up to one `serverCron`
/// period, 100 ms at the default `hz` of 10 (measured: `WAIT 1 120` on a server
/// without replicas answered after 201 ms).
const SERVER_TIMER_LATE: Duration = Duration::from_millis(100);

/// The timeout to send with `WAIT` for a replica wait of `timeout_ms` whose reply is
/// read within `window` (with the read timeout [`socket_timeout`] of it): `timeout_ms`,
/// or less when the server's answer, late by up to [`SERVER_TIMER_LATE`], could
/// otherwise come after the read gave up. At least 1 (`WAIT` with 0 blocks for ever).
pub(crate) fn wait_ms_within(timeout_ms: u64, window: Duration) -> u64 {
    let room = socket_timeout(window).saturating_sub(SERVER_TIMER_LATE + TIMEOUT_SLACK);
    timeout_ms
        .min(u64::try_from(room.as_millis()).unwrap_or(u64::MAX))
        .max(1)
}

/// Socket timeouts set so that a blocked read or write ends within the duration given
/// ([`socket_timeout`]). The library sets timeouts only through these (clippy.toml
/// disallows the redis types' own setters in `src`).
pub(crate) trait IoTimeouts {
    /// Sets the read timeout so that a read ends within `d`.
    fn read_within(&self, d: Option<Duration>) -> redis::RedisResult<()>;
    /// Sets the write timeout so that a write ends within `d`.
    fn write_within(&self, d: Option<Duration>) -> redis::RedisResult<()>;
    /// Both.
    fn io_within(&self, d: Option<Duration>) -> redis::RedisResult<()> {
        self.read_within(d)?;
        self.write_within(d)
    }
}

#[allow(clippy::disallowed_methods)]
impl IoTimeouts for redis::Connection {
    fn read_within(&self, d: Option<Duration>) -> redis::RedisResult<()> {
        self.set_read_timeout(d.map(socket_timeout))
    }
    fn write_within(&self, d: Option<Duration>) -> redis::RedisResult<()> {
        self.set_write_timeout(d.map(socket_timeout))
    }
}

// (every node connection type of the cluster client: the pool's is `node::NodeConn`)
#[allow(clippy::disallowed_methods)]
impl<C: redis::ConnectionLike + redis::cluster::Connect> IoTimeouts
    for redis::cluster::ClusterConnection<C>
{
    fn read_within(&self, d: Option<Duration>) -> redis::RedisResult<()> {
        self.set_read_timeout(d.map(socket_timeout))
    }
    fn write_within(&self, d: Option<Duration>) -> redis::RedisResult<()> {
        self.set_write_timeout(d.map(socket_timeout))
    }
}

/// [`IoTimeouts::read_within`] for a subscription (which writes through its
/// connection, whose write timeout is set before it subscribes).
#[allow(clippy::disallowed_methods)]
pub(crate) fn pubsub_read_within(
    ps: &redis::PubSub<'_>,
    d: Option<Duration>,
) -> redis::RedisResult<()> {
    ps.set_read_timeout(d.map(socket_timeout))
}

/// `SUBSCRIBE channel` on `conn` (before it becomes a `PubSub`), its answer read with
/// the connection's read timeout: redis-rs's `PubSub::subscribe` takes a refusal
/// (`NOPERM` from an ACL without the channel) for a subscription, since an error reply
/// comes back as a value there.
pub(crate) fn subscribe(conn: &mut redis::Connection, channel: &str) -> redis::RedisResult<()> {
    conn.send_packed_command(&redis::cmd("SUBSCRIBE").arg(channel).get_packed_command())?;
    conn.recv_response()?.extract_error().map(drop)
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
    fn a_socket_timeout_ends_within_its_bound_at_the_kernel_s_latest() {
        let ms = Duration::from_millis;
        for d in [
            ms(1),
            ms(5),
            ms(31),
            ms(50),
            ms(300),
            ms(2_000),
            ms(5_000),
            ms(86_400_000),
        ] {
            let t = socket_timeout(d);
            assert!(t >= ms(1), "{d:?}: a socket timeout cannot be zero");
            if d >= ms(120) {
                // the timer wheel's eighth and two ticks, with the slack to spare
                assert!(
                    t + t / 8 + KERNEL_TICKS + TIMEOUT_SLACK <= d,
                    "{d:?} -> {t:?}"
                );
            }
        }
        // a short share keeps most of itself
        assert!(
            socket_timeout(ms(33)) >= ms(21),
            "{:?}",
            socket_timeout(ms(33))
        );
        // the default operation timeout: replies are waited for about 1.75 s
        assert_eq!(socket_timeout(ms(2_000)).as_millis(), 1_751);
    }

    #[test]
    fn a_replica_wait_is_shortened_only_to_be_answered_within_its_read() {
        let ms = Duration::from_millis;
        // room to spare: the wait asked for
        assert_eq!(wait_ms_within(100, ms(2_000)), 100);
        // a wait close to the read's bound: the server's late answer must still fit
        let sent = wait_ms_within(1_900, ms(2_000));
        assert!(ms(sent) + SERVER_TIMER_LATE + TIMEOUT_SLACK <= socket_timeout(ms(2_000)));
        assert!(sent >= 1_600, "{sent}");
        // never 0, which would block for ever
        assert_eq!(wait_ms_within(500, ms(1)), 1);
        assert_eq!(wait_ms_within(0, ms(2_000)), 1);
    }

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

    /// The conversions subtracted and added a server time the client had not checked
    /// (`at_ms - server_ms - 1`, `server_ms + ahead - 1`): a deadline of `i64::MIN` in a
    /// forged wake-up message panicked in a debug build and wrapped round to a
    /// deadline 292 million years on in a release build. They saturate now, and a
    /// moment past what an `Instant` holds gives the anchor's `sent`, never later.
    #[test]
    fn times_at_the_ends_of_the_range_neither_panic_nor_wrap() {
        let s = Instant::now();
        for server_ms in [i64::MIN, -1, 0, 1_700_000_000_000, i64::MAX] {
            let a = Anchor {
                sent: s,
                received: s + Duration::from_millis(3),
                server_ms,
            };
            for at_ms in [i64::MIN, i64::MIN + 1, -1, 0, 1_700_000_000_000, i64::MAX] {
                let d = a.instant_before(at_ms);
                if at_ms <= server_ms {
                    assert!(d <= s, "{server_ms} {at_ms}");
                }
            }
            assert!(a.instant_before(i64::MIN) <= s);
            let _ = a.server_ms_by(s + Duration::from_secs(3600));
            let _ = a.server_ms_at_most(s + Duration::from_secs(3600));
        }
        let a = Anchor {
            sent: s,
            received: s,
            server_ms: i64::MAX - 5,
        };
        assert_eq!(a.server_ms_by(s + Duration::from_secs(10)), i64::MAX - 1);
        assert_eq!(a.server_ms_at_most(s + Duration::from_secs(10)), i64::MAX);
    }

    #[test]
    fn the_server_s_time_at_an_instant_lies_between_the_two_bounds() {
        let s = Instant::now();
        let a = Anchor {
            sent: s,
            received: s + Duration::from_millis(3),
            server_ms: 1_000_000,
        };
        // read at `sent` at the earliest: at most 1 ms on then, and the drift on top
        assert_eq!(a.server_ms_at_most(s), 1_000_002);
        assert_eq!(a.server_ms_at_most(s - Duration::from_secs(1)), 1_000_002);
        let later = s + Duration::from_secs(1000);
        let most = a.server_ms_at_most(later);
        assert!(most >= 1_000_000 + 1_000_000 + 1000, "{most}");
        assert!(most <= 1_000_000 + 1_000_000 + 1003, "{most}");
        assert!(a.server_ms_by(later) < most);
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
