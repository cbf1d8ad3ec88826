//! Time bounds of the public blocking calls when the server stops answering (SIGSTOP,
//! or `CLIENT PAUSE` where the test must see which call hangs): each call returns,
//! with an error or its answer, within the bound its documentation gives.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use redis_semaphore::compat::book::BookVariant;
use redis_semaphore::{Client, Error, LostReason, Semaphore};
use support::{RedisServer, proxied, wait_until};

/// Scheduling on a loaded two-core machine; well below the operation timeouts used.
const SLACK: Duration = Duration::from_millis(500);

fn client(server: &RedisServer, op: Duration, max_connections: u32) -> Client {
    Client::builder()
        .operation_timeout(op)
        .max_connections(max_connections)
        .build(server.url())
        .unwrap()
}

/// Runs `f` and returns its result with how long it took.
fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let r = f();
    (r, start.elapsed())
}

/// Pauses every write of `admin`'s server (`CLIENT PAUSE WRITE`, scripts included) and
/// starts a counting release on `client`, which hangs on the client's only connection
/// until its operation timeout `op`; returns a little after the server shows it hung.
fn hang_the_only_connection(
    admin: &mut redis::Connection,
    client: &Client,
    op: Duration,
) -> thread::JoinHandle<()> {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(30_000)
        .arg("WRITE")
        .query(admin)
        .unwrap();
    let busy = {
        let cs = client.counting_semaphore("busy").unwrap();
        thread::spawn(move || drop(cs.release(1)))
    };
    // a paused call is a blocked client (flags b) with its command named
    wait_until(Duration::from_secs(5), "the busy call hangs", || {
        let list: String = redis::cmd("CLIENT").arg("LIST").query(admin).unwrap();
        list.lines()
            .any(|l| l.contains(" flags=b ") && l.contains(" cmd=evalsha "))
    });
    // The scenario's timing, not a wait for a condition: the caller's call starts a
    // tenth of the operation timeout after the busy one, so that the connection comes
    // free surely within its checkout, with most of its time spent.
    thread::sleep(op / 10);
    busy
}

/// Runs the wait `f` on a thread of its own, timed, and returns once `queued` shows
/// one waiter in its queue.
fn timed_queued<T: Send + 'static>(
    queued: &Semaphore,
    f: impl FnOnce() -> T + Send + 'static,
) -> thread::JoinHandle<(T, Duration)> {
    let waiter = thread::spawn(move || timed(f));
    wait_until(Duration::from_secs(5), "the waiter queues", || {
        queued.queue_len().unwrap() == 1
    });
    waiter
}

fn unpause(admin: &mut redis::Connection) {
    let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(admin).unwrap();
}

/// Runs `f` while the client's only connection hangs in another call
/// ([`hang_the_only_connection`]) and returns its result with how long it took.
fn behind_a_hung_call<T>(
    admin: &mut redis::Connection,
    client: &Client,
    op: Duration,
    f: impl FnOnce() -> T,
) -> (T, Duration) {
    let busy = hang_the_only_connection(admin, client, op);
    let result = timed(f);
    unpause(admin);
    busy.join().unwrap();
    result
}

/// Runs the wait `f` (an `acquire_timeout(timeout)`) while the client's only
/// connection hangs in another call, and asserts that it gave up within its bound
/// ([`assert_gave_up_in_time`]).
fn gives_up_in_time_behind_a_hung_call(
    admin: &mut redis::Connection,
    client: &Client,
    op: Duration,
    timeout: Duration,
    f: impl FnOnce() -> Result<bool, Error>,
) {
    let (r, took) = behind_a_hung_call(admin, client, op, f);
    assert_gave_up_in_time(&r, took, timeout, op);
}

/// Drops `permit` while the client's only connection hangs in another call
/// ([`hang_the_only_connection`]) and returns how long the drop took.
fn drop_behind_a_hung_call(
    admin: &mut redis::Connection,
    client: &Client,
    op: Duration,
    permit: redis_semaphore::Permit,
) -> Duration {
    behind_a_hung_call(admin, client, op, || drop(permit)).1
}

/// Asserts that an `acquire_timeout(timeout)` against a server that stopped answering
/// took at most its bound (its timeout and one operation timeout `op`, the look or try
/// in flight at the deadline) and gave up: `Ok(false)` at the deadline, or the timeout
/// of that look.
fn assert_gave_up_in_time(
    r: &Result<bool, Error>,
    took: Duration,
    timeout: Duration,
    op: Duration,
) {
    assert!(
        took <= timeout + op + SLACK,
        "acquire_timeout({timeout:?}) took {took:?} (operation timeout {op:?}): {r:?}"
    );
    assert!(
        matches!(r, Ok(false)) || r.as_ref().is_err_and(Error::is_timeout),
        "{r:?}"
    );
}

/// A counting `acquire_timeout` is "bounded by timeout (plus at most one round trip to
/// leave the queue)": a queued waiter whose look fails against a stopped server used
/// to send the cancel as well, a second operation timeout.
#[test]
fn a_counting_acquire_timeout_ends_within_its_timeout_and_one_round_trip_on_a_stopped_server() {
    const OP: Duration = Duration::from_millis(1500);
    const TIMEOUT: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    let client = client(&server, OP, 16);
    let cs = client.counting_semaphore("cs").unwrap();
    assert!(cs.try_set_permits(0).unwrap());
    let waiter = {
        let cs = cs.clone();
        thread::spawn(move || timed(|| cs.acquire_timeout(1, TIMEOUT)))
    };
    wait_until(Duration::from_secs(5), "the waiter queues", || {
        cs.queue_len().unwrap() == 1
    });
    let paused = server.pause();
    let (r, took) = waiter.join().unwrap();
    drop(paused);
    // a look in flight at the deadline fails; a wait that reached it leaves the queue
    assert_gave_up_in_time(&r, took, TIMEOUT, OP);
}

/// The same bound when the wait must first wait for a connection: every pooled
/// connection busy (here the only one, hung in another call) and the server stopped.
/// The look waited for a connection as long as the checkout timeout allows and then
/// an operation timeout for its call (2.85 s here against a bound of 1.8 s); every
/// call of the wait, the wait for its connection included, now ends by the deadline
/// and one operation timeout.
#[test]
fn a_counting_acquire_timeout_behind_a_busy_connection_ends_within_its_timeout_and_one_round_trip()
{
    const OP: Duration = Duration::from_millis(1500);
    const TIMEOUT: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    let client = client(&server, OP, 1);
    let cs = client.counting_semaphore("cs-busy").unwrap();
    assert!(cs.try_set_permits(0).unwrap());
    let mut admin = server.conn();
    gives_up_in_time_behind_a_hung_call(&mut admin, &client, OP, TIMEOUT, || {
        cs.acquire_timeout(1, TIMEOUT)
    });
}

/// A counting `acquire_timeout` is bounded by its timeout and one operation timeout
/// also when a queued look in flight at the deadline fails with an error the server
/// answered (not an outage): the waiter's drop left the queue with a cancel given a
/// fresh operation timeout, not what was left of the wait's bound. Every script call
/// here reaches the server 2.3 s late (a slow server): the look sent before the 0.6 s
/// deadline failed at about 2.4 s (the count had become a hash), and the cancel after
/// it answered at about 4.7 s, against a bound of 3.6 s.
#[test]
fn a_counting_acquire_timeout_whose_last_look_fails_leaves_the_queue_within_its_bound() {
    const OP: Duration = Duration::from_secs(3);
    const TIMEOUT: Duration = Duration::from_millis(600);
    const SLOW: Duration = Duration::from_millis(2300);
    let (server, proxy, client) = proxied(OP);
    let direct = Client::open(server.url()).unwrap();
    let watch = direct.counting_semaphore("cs-late-error").unwrap();
    let cs = client.counting_semaphore("cs-late-error").unwrap();
    assert!(watch.try_set_permits(0).unwrap());
    // a first wait that gives up loads the scripts (the cancel's too: one request each
    // below) and starts the client's listener
    assert!(!cs.acquire_timeout(1, Duration::from_millis(10)).unwrap());
    let start = Instant::now();
    let waiter = thread::spawn(move || timed(|| cs.acquire_timeout(1, TIMEOUT)));
    wait_until(Duration::from_secs(5), "the waiter queues", || {
        watch.queue_len().unwrap() == 1
    });
    assert!(
        start.elapsed() + Duration::from_millis(300) < TIMEOUT,
        "the scenario needs the waiter's next look to start before its deadline"
    );
    // from now on every script call through the proxy reaches the server 2.3 s late
    // (after the deadline, within the operation timeout), and finds the count of
    // another type: its error is an answer, not an outage
    proxy.delay_sent(b"EVALSHA", SLOW);
    let mut admin = server.conn();
    redis::cmd("DEL")
        .arg("redsem:{cs-late-error}:count")
        .exec(&mut admin)
        .unwrap();
    redis::cmd("HSET")
        .arg("redsem:{cs-late-error}:count")
        .arg("f")
        .arg("v")
        .exec(&mut admin)
        .unwrap();
    let (r, took) = waiter.join().unwrap();
    assert!(
        took <= TIMEOUT + OP + SLACK,
        "acquire_timeout({TIMEOUT:?}) took {took:?} (operation timeout {OP:?}): {r:?}"
    );
    assert!(
        matches!(r, Err(Error::WrongType { .. })) || r.as_ref().is_err_and(Error::is_timeout),
        "{r:?}"
    );
}

/// The Redisson waits promise their timeout plus at most one operation timeout; their
/// tries waited for a connection as long as the checkout timeout allows, and then an
/// operation timeout for the call. Every try of a wait, the wait for its connection
/// included, now ends by the deadline and one operation timeout.
#[test]
fn redisson_acquire_timeouts_behind_a_busy_connection_end_within_their_timeout_and_one_try() {
    const OP: Duration = Duration::from_millis(1500);
    const TIMEOUT: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    let client = client(&server, OP, 1);
    let rs = client.redisson_semaphore("rs-busy");
    assert!(rs.try_set_permits(0).unwrap());
    let pes = client.redisson_permit_expirable_semaphore("pes-busy");
    assert!(pes.try_set_permits(0).unwrap());
    let mut admin = server.conn();

    gives_up_in_time_behind_a_hung_call(&mut admin, &client, OP, TIMEOUT, || {
        rs.acquire_timeout(1, TIMEOUT)
    });

    gives_up_in_time_behind_a_hung_call(&mut admin, &client, OP, TIMEOUT, || {
        pes.acquire_timeout(TIMEOUT, None).map(|p| p.is_some())
    });
}

/// The leased semaphore's wait behind a busy connection: its timeout plus at most one
/// operation timeout, as every other wait (its try already ends by its deadline: the
/// combined call's checkout and call share one budget; a guard for the waits above).
#[test]
fn an_acquire_timeout_behind_a_busy_connection_ends_within_its_timeout_and_one_round_trip() {
    const OP: Duration = Duration::from_millis(1500);
    const TIMEOUT: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    let client = client(&server, OP, 1);
    let sem = client.semaphore("leased-busy", 1).unwrap();
    let other = Client::open(server.url()).unwrap();
    let held = other
        .semaphore("leased-busy", 1)
        .unwrap()
        .acquire()
        .unwrap();
    let mut admin = server.conn();
    gives_up_in_time_behind_a_hung_call(&mut admin, &client, OP, TIMEOUT, || {
        sem.acquire_timeout(TIMEOUT).map(|p| p.is_some())
    });
    drop(held);
}

/// The leased wait's later calls behind a busy connection: once the waiter has
/// queued, its looks and its cancel at the deadline each end by the wait's bound, the
/// wait for a connection included. The cancel used to wait for a connection as long
/// as the checkout timeout allows (here until the busy call's operation timeout), and
/// then an operation timeout for its own call: 3.0 s against a bound of 2.3 s.
#[test]
fn a_queued_acquire_timeout_whose_connection_turns_busy_ends_within_its_timeout_and_one_round_trip()
{
    const OP: Duration = Duration::from_millis(1500);
    const TIMEOUT: Duration = Duration::from_millis(800);
    let server = RedisServer::start();
    let client = client(&server, OP, 1);
    let sem = client.semaphore("leased-queued-busy", 1).unwrap();
    let other = Client::open(server.url()).unwrap();
    let other_sem = other.semaphore("leased-queued-busy", 1).unwrap();
    let held = other_sem.acquire().unwrap();
    let mut admin = server.conn();
    let waiter = timed_queued(&other_sem, move || {
        sem.acquire_timeout(TIMEOUT).map(|p| p.is_some())
    });
    let ((r, took), _) = behind_a_hung_call(&mut admin, &client, OP, || waiter.join().unwrap());
    assert_gave_up_in_time(&r, took, TIMEOUT, OP);
    drop(held);
}

/// A manual refresh of a leased permit waits on Redis at most the operation timeout in
/// all: its checkout and its call had one each, so behind a busy connection on a
/// paused server it took about two.
#[test]
fn a_manual_refresh_behind_a_busy_connection_ends_within_the_operation_timeout() {
    const OP: Duration = Duration::from_secs(1);
    let server = RedisServer::start();
    let client = client(&server, OP, 1);
    let sem = client
        .semaphore_builder("refresh-busy")
        .limit(1)
        .auto_refresh(false)
        .build()
        .unwrap();
    let permit = sem.acquire().unwrap();
    let mut admin = server.conn();
    let (r, took) = behind_a_hung_call(&mut admin, &client, OP, || permit.refresh());
    assert!(
        took <= OP + SLACK,
        "refresh took {took:?} (operation timeout {OP:?}): {r:?}"
    );
    assert!(r.as_ref().is_err_and(Error::is_timeout), "{r:?}");
}

/// Dropping a Redisson `RPermitExpirableSemaphore` permit never blocks longer than the
/// operation timeout (DESIGN invariant 13), also when it must wait for a connection:
/// it used to wait for one as long as the checkout timeout (5 s) allows, and then an
/// operation timeout for its call.
#[test]
fn dropping_a_redisson_permit_with_a_busy_pool_and_a_paused_server_ends_within_the_operation_timeout()
 {
    const OP: Duration = Duration::from_secs(1);
    let server = RedisServer::start();
    let mut admin = server.conn();
    let client = client(&server, OP, 1);
    let pes = client.redisson_permit_expirable_semaphore("pes");
    assert!(pes.try_set_permits(2).unwrap());
    let permit = pes.try_acquire(None).unwrap().expect("a free permit");
    let took = drop_behind_a_hung_call(&mut admin, &client, OP, permit);
    assert!(
        took <= OP + SLACK,
        "a Redisson permit's drop blocked {took:?} (operation timeout {OP:?})"
    );
}

/// Dropping a book permit never blocks longer than the operation timeout (DESIGN
/// invariant 13), also when it must wait for a connection: it used to wait up to an
/// operation timeout for the checkout, then one per reply of its transaction (four
/// for the fair variants).
#[test]
fn dropping_a_book_permit_with_a_busy_pool_and_a_paused_server_ends_within_the_operation_timeout() {
    const OP: Duration = Duration::from_secs(1);
    let server = RedisServer::start();
    let mut admin = server.conn();
    let client = client(&server, OP, 1);
    let book = client
        .book_semaphore("book", 2)
        .variant(BookVariant::Fair)
        .build()
        .unwrap();
    let permit = book.try_acquire().unwrap().expect("a free permit");
    let took = drop_behind_a_hung_call(&mut admin, &client, OP, permit);
    assert!(
        took <= OP + SLACK,
        "a book permit's drop blocked {took:?} (operation timeout {OP:?})"
    );
}

/// Linux fires socket timeouts late, by up to an eighth of their length and a tick or
/// two (a 3 s `SO_RCVTIMEO` up to 256 ms late on a 250 Hz kernel; measured 124 ms at
/// 5 s), and every drop set the operation timeout itself as its socket's timeout, so
/// it overshot the operation timeout by that much (DESIGN invariant 13). Drops of a
/// leased, a counting-free Redisson and a book permit, all at once on a stopped
/// server, now end by the operation timeout itself.
#[test]
fn drops_on_a_stopped_server_end_by_the_operation_timeout_itself_not_the_kernel_s_late_timer() {
    const OP: Duration = Duration::from_secs(3);
    /// A thread waking after the drop ends, far below the kernel's lateness at 3 s.
    const WAKE: Duration = Duration::from_millis(25);
    let server = RedisServer::start();
    let client = client(&server, OP, 4);
    let leased = client.semaphore("leased", 2).unwrap();
    let pes = client.redisson_permit_expirable_semaphore("pes");
    assert!(pes.try_set_permits(2).unwrap());
    let book = client
        .book_semaphore("book", 2)
        .variant(BookVariant::Fair)
        .build()
        .unwrap();
    let permits = vec![
        (
            "leased",
            leased.try_acquire().unwrap().expect("a leased permit"),
        ),
        (
            "redisson",
            pes.try_acquire(None).unwrap().expect("a Redisson permit"),
        ),
        ("book", book.try_acquire().unwrap().expect("a book permit")),
    ];
    let paused = server.pause();
    let drops: Vec<_> = permits
        .into_iter()
        .map(|(kind, permit)| thread::spawn(move || (kind, timed(|| drop(permit)).1)))
        .collect();
    let took: Vec<_> = drops.into_iter().map(|d| d.join().unwrap()).collect();
    drop(paused);
    for (kind, took) in took {
        assert!(
            took <= OP + WAKE,
            "a {kind} permit's drop took {took:?} (operation timeout {OP:?})"
        );
    }
}

/// A release that needs more than one round trip (its script gone from the server's
/// cache after a restart or `SCRIPT FLUSH`: then `EVALSHA`, `NOSCRIPT`, and `SCRIPT
/// LOAD` and `EVALSHA` then, `EVAL` now) gave each round trip the whole of what was
/// left when the call began: with 600 ms per reply and a 1 s operation timeout, a drop
/// took 1.8 s. Each request
/// now gets what is left of the call's budget. The release, cut short, is finished by
/// the background thread once replies are quick again.
#[test]
fn a_drop_whose_release_needs_several_round_trips_ends_within_the_operation_timeout() {
    const OP: Duration = Duration::from_secs(1);
    let (server, proxy, client) = support::proxied(OP);
    let sem = client.semaphore("flushed", 2).unwrap();
    let permit = sem.try_acquire().unwrap().expect("a permit");
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut server.conn())
        .unwrap();
    proxy.delay_replies(Duration::from_millis(600));
    let took = timed(|| drop(permit)).1;
    proxy.delay_replies(Duration::ZERO);
    assert!(
        took <= OP + SLACK,
        "the drop took {took:?} (operation timeout {OP:?})"
    );
    let direct = Client::open(server.url()).unwrap();
    let direct = direct.semaphore("flushed", 2).unwrap();
    wait_until(Duration::from_secs(10), "the permit is given back", || {
        direct.available().unwrap() == 2
    });
}

/// A client whose first call is `adopt` had no reading of the server's clock, and its
/// release read it first (`TIME`, a round trip a release never needs): dropping the
/// adopted permit cost two round trips (1.2 s with 600 ms per reply, past the 1 s
/// operation timeout). It now costs one.
#[test]
fn dropping_an_adopted_permit_on_a_fresh_client_costs_one_round_trip() {
    const OP: Duration = Duration::from_secs(1);
    let (server, proxy, adopter) = support::proxied(OP);
    let direct = Client::open(server.url()).unwrap();
    let owner = direct.semaphore("adopted", 2).unwrap();
    // every script the release may use in the server's cache (no NOSCRIPT round trips)
    owner
        .try_acquire()
        .unwrap()
        .expect("a permit")
        .release()
        .unwrap();
    let parts = owner.try_acquire().unwrap().expect("a permit").into_parts();
    let permit = adopter
        .semaphore("adopted", 2)
        .unwrap()
        .adopt(parts)
        .unwrap();
    proxy.delay_replies(Duration::from_millis(600));
    let (released, took) = timed(|| permit.release());
    proxy.delay_replies(Duration::ZERO);
    assert!(released.is_ok(), "{released:?}");
    assert!(took < OP, "one round trip of 600 ms, not two: {took:?}");
    assert_eq!(owner.available().unwrap(), 2, "released at once");
}

/// A book `try_acquire` against a stopped server fails within one operation timeout:
/// its transaction's, the clean-up of an entry it may have added going on aside (on
/// the same connection, behind the transaction). It used to wait an operation timeout
/// per reply of the transaction (five), then, with a pool of one connection, the whole
/// checkout timeout (5 s) for a second connection to clean up on; then one operation
/// timeout for the transaction and another for the clean-up, inline (see
/// `book_compat::a_try_without_a_reply_in_time_ends_within_the_operation_timeout`).
#[test]
fn a_failed_book_try_acquire_with_one_connection_does_not_wait_for_a_second() {
    const OP: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    let client = client(&server, OP, 1);
    for variant in [
        BookVariant::Basic,
        BookVariant::Fair,
        BookVariant::FairWithLock,
        BookVariant::NodeFair,
    ] {
        let book = client
            .book_semaphore(&format!("book-{variant:?}"), 2)
            .variant(variant)
            .build()
            .unwrap();
        assert!(book.held().unwrap() == 0);
        let paused = server.pause();
        let (r, took) = timed(|| book.try_acquire());
        drop(paused);
        assert!(
            r.as_ref().is_err_and(Error::is_timeout),
            "{variant:?}: {r:?}"
        );
        // its transaction's operation timeout; the clean-up goes on aside
        assert!(
            took <= OP + SLACK,
            "{variant:?}: a failed try_acquire took {took:?} (operation timeout {OP:?})"
        );
    }
}

/// Pins the bound of the calls that already keep it: against a stopped server, each
/// of these fails within one operation timeout (a pooled connection is idle, as in a
/// client in use; the tries that may have taken permits come last, since the
/// give-back each leaves to a background thread takes a connection for a while, and a
/// call without a deadline of its own may wait the checkout timeout for one).
#[test]
fn every_other_call_on_a_stopped_server_fails_within_one_operation_timeout() {
    const OP: Duration = Duration::from_millis(800);
    let server = RedisServer::start();
    let client = client(&server, OP, 16);
    let sem = client.semaphore("pinned", 2).unwrap();
    let cs = client.counting_semaphore("pinned").unwrap();
    let rs = client.redisson_semaphore("rs");
    let pes = client.redisson_permit_expirable_semaphore("pes");
    let book = client.book_semaphore("book", 2).build().unwrap();
    // every handle has made its first call (its connection and clock anchor)
    client.ping().unwrap();
    assert_eq!(sem.available().unwrap(), 2);
    assert!(!cs.try_acquire(1).unwrap());
    assert!(!rs.try_acquire(1).unwrap());
    assert!(pes.try_acquire(None).unwrap().is_none());
    assert_eq!(book.held().unwrap(), 0);
    type Call<'a> = (&'static str, Box<dyn Fn() -> Result<(), Error> + 'a>);
    // (`Client::ping` opens a connection of its own: it is bounded by the connect
    // timeout, a_call_that_must_connect_to_a_stopped_server_fails_within_the_connect_timeout)
    let calls: Vec<Call> = vec![
        ("available", Box::new(|| sem.available().map(drop))),
        ("holders", Box::new(|| sem.holders().map(drop))),
        ("set_limit", Box::new(|| sem.set_limit(3))),
        (
            "counting try_acquire",
            Box::new(|| cs.try_acquire(1).map(drop)),
        ),
        ("counting release", Box::new(|| cs.release(1))),
        ("counting available", Box::new(|| cs.available().map(drop))),
        (
            "RSemaphore try_acquire",
            Box::new(|| rs.try_acquire(1).map(drop)),
        ),
        (
            "RSemaphore available",
            Box::new(|| rs.available_permits().map(drop)),
        ),
        (
            "RPermitExpirable available",
            Box::new(|| pes.available_permits().map(drop)),
        ),
        ("book held", Box::new(|| book.held().map(drop))),
        (
            "RPermitExpirable try_acquire",
            Box::new(|| pes.try_acquire(None).map(drop)),
        ),
        ("try_acquire", Box::new(|| sem.try_acquire().map(drop))),
        (
            "acquire_timeout",
            Box::new(|| sem.acquire_timeout(Duration::from_secs(10)).map(drop)),
        ),
    ];
    let paused = server.pause();
    for (what, call) in calls {
        let (r, took) = timed(call);
        assert!(r.as_ref().is_err_and(Error::is_timeout), "{what}: {r:?}");
        if ["available", "holders", "set_limit"].contains(&what) {
            // the message names the operation (it said "a call on semaphore ...")
            let msg = r.as_ref().unwrap_err().to_string();
            assert!(msg.starts_with(&format!("{what} on semaphore")), "{msg}");
        }
        assert!(
            took <= OP + SLACK,
            "{what} took {took:?} on a stopped server (operation timeout {OP:?})"
        );
    }
    drop(paused);
}

/// Pins `Semaphore::acquire_timeout`'s bound for a waiter already queued when the
/// server stops: its timeout, plus the one round trip in flight or leaving the queue.
#[test]
fn a_queued_acquire_timeout_on_a_stopped_server_ends_within_its_timeout_and_one_round_trip() {
    const OP: Duration = Duration::from_millis(800);
    const TIMEOUT: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    let client = client(&server, OP, 16);
    let sem = client.semaphore("queued", 1).unwrap();
    let held = sem.try_acquire().unwrap().expect("a free permit");
    let waiting = sem.clone();
    let waiter = timed_queued(&sem, move || {
        waiting.acquire_timeout(TIMEOUT).map(|p| p.is_some())
    });
    let paused = server.pause();
    let (r, took) = waiter.join().unwrap();
    drop(paused);
    assert_gave_up_in_time(&r, took, TIMEOUT, OP);
    drop(held);
}

/// Pins `RSemaphore::acquire_timeout`'s bound for a waiter already subscribed when the
/// server stops: its timeout, plus the one try in flight.
#[test]
fn a_subscribed_redisson_acquire_timeout_on_a_stopped_server_ends_within_its_timeout_and_one_try() {
    const OP: Duration = Duration::from_millis(800);
    const TIMEOUT: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    let mut admin = server.conn();
    let client = client(&server, OP, 16);
    let rs = client.redisson_semaphore("rs");
    assert!(rs.try_set_permits(0).unwrap());
    let waiter = {
        let rs = rs.clone();
        thread::spawn(move || timed(|| rs.acquire_timeout(1, TIMEOUT)))
    };
    wait_until(Duration::from_secs(5), "the waiter subscribes", || {
        let subs: (String, u32) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("redisson_sc:{rs}")
            .query(&mut admin)
            .unwrap();
        subs.1 == 1
    });
    let paused = server.pause();
    let (r, took) = waiter.join().unwrap();
    drop(paused);
    assert_gave_up_in_time(&r, took, TIMEOUT, OP);
}

/// A call that must open a connection (none idle) to a server that does not answer
/// fails once the connect attempt times out, not after the whole checkout timeout:
/// before, `ping()` and `available()` on a fresh client took the checkout timeout
/// (5 s) whatever the operation and connect timeouts.
#[test]
fn a_call_that_must_connect_to_a_stopped_server_fails_within_the_connect_timeout() {
    const CONNECT: Duration = Duration::from_millis(600);
    let server = RedisServer::start();
    let client = Client::builder()
        .operation_timeout(Duration::from_millis(600))
        .connect_timeout(CONNECT)
        .checkout_timeout(Duration::from_secs(10))
        .build(server.url())
        .unwrap();
    let sem = client.semaphore("fresh", 1).unwrap();
    let _paused = server.pause();
    let (r, took) = timed(|| client.ping());
    assert!(took <= CONNECT + SLACK, "ping took {took:?}: {r:?}");
    match r {
        Err(e @ Error::Connect { .. }) => {
            assert!(e.to_string().contains("connect timeout"), "{e}");
            assert!(e.is_retryable(), "{e}");
            // (it said false: a connect that timed out is a timeout)
            assert!(e.is_timeout(), "{e}");
        }
        other => panic!("ping of a stopped server: {other:?}"),
    }
    let (r, took) = timed(|| sem.available());
    assert!(r.as_ref().is_err_and(Error::is_timeout), "{r:?}");
    assert!(took <= CONNECT + SLACK, "available took {took:?}: {r:?}");
}

/// Redisson `acquire_timeout` (both types) is bounded by its timeout plus one
/// operation timeout, the try in flight at the deadline. When the server stopped
/// answering between the first try and the subscription, the subscription's set-up
/// took its own timeouts: a connect timeout for the new connection's check `PING`, or
/// an operation timeout for `SUBSCRIBE`, and then came the try (3.5 s and 3.0 s for a
/// 300 ms timeout with a 1.5 s operation timeout). The set-up now ends by the deadline.
#[test]
fn a_redisson_acquire_timeout_whose_subscription_hangs_ends_within_its_timeout_and_one_try() {
    const OP: Duration = Duration::from_millis(1500);
    const TIMEOUT: Duration = Duration::from_millis(300);
    // what the waiter's own connection sends as the server stops answering: the check
    // of a new connection, or the subscription on it
    for step in ["PING", "SUBSCRIBE"] {
        for expirable in [false, true] {
            let (_server, proxy, client) = proxied(OP);
            let rs = client.redisson_semaphore("rs");
            let pes = client.redisson_permit_expirable_semaphore("pes");
            // the first try goes on the pooled connection these made
            if expirable {
                assert!(pes.try_set_permits(0).unwrap());
            } else {
                assert!(rs.try_set_permits(0).unwrap());
            }
            proxy.cut_when_sent(step.as_bytes());
            let (r, took) = timed(|| {
                if expirable {
                    pes.acquire_timeout(TIMEOUT, None).map(|p| p.is_some())
                } else {
                    rs.acquire_timeout(1, TIMEOUT)
                }
            });
            let what = if expirable {
                "RPermitExpirable"
            } else {
                "RSemaphore"
            };
            assert!(
                took <= TIMEOUT + OP + SLACK,
                "{what} acquire_timeout({TIMEOUT:?}) took {took:?} with the server stopping at \
                 {step} (operation timeout {OP:?}): {r:?}"
            );
            assert!(
                matches!(&r, Ok(false)) || r.as_ref().is_err_and(Error::is_timeout),
                "{what}, {step}: {r:?}"
            );
        }
    }
}

/// The background renewal of Redisson expirable permits waits on Redis no longer than
/// the refresher's other calls (until the next deadline of any permit): it used to
/// take the pool's checkout timeout and an operation timeout, so a stopped server held
/// back the loss of the client's other permits (`lost()` of a 1.5 s lease fired 3.1 s
/// after the server stopped, with a 3 s operation timeout).
#[test]
fn a_redisson_renewal_on_a_stopped_server_does_not_hold_back_another_permits_loss() {
    const OP: Duration = Duration::from_secs(3);
    const LEASE: Duration = Duration::from_millis(1500);
    let server = RedisServer::start();
    let client = client(&server, OP, 16);
    let pes = client
        .redisson_permit_expirable_semaphore("pes")
        .with_auto_refresh(true);
    assert!(pes.try_set_permits(1).unwrap());
    // renewed every 200 ms: a renewal is under way soon after the server stops
    let _renewed = pes
        .try_acquire(Some(Duration::from_millis(600)))
        .unwrap()
        .expect("a free Redisson permit");
    let sem = client
        .semaphore_builder("leased")
        .limit(1)
        .lease(LEASE)
        .build()
        .unwrap();
    let permit = sem.try_acquire().unwrap().expect("a free permit");
    let paused = server.pause();
    let stopped = Instant::now();
    let reason = permit.lost().recv_timeout(LEASE + OP + SLACK);
    let took = stopped.elapsed();
    drop(paused);
    assert_eq!(reason, Ok(LostReason::Expired));
    // its last renewal was sent before the server stopped: its deadline is within a
    // lease of that
    assert!(
        took <= LEASE + SLACK,
        "lost() fired {took:?} after the server stopped (lease {LEASE:?}, operation \
         timeout {OP:?})"
    );
}

/// Queues a waiter, `acquire_timeout(timeout)`, on the full semaphore "manual" (limit
/// 1, without automatic refresh, on a client of operation timeout `op`), and serves it
/// by [`release_and_pause_writes`]: returns the admin connection (the server's writes
/// still paused: [`unpause`] it), the waiter's result and how long it took.
fn serve_a_manual_waiter_and_pause_writes(
    server: &RedisServer,
    op: Duration,
    timeout: Duration,
) -> (
    redis::Connection,
    Result<Option<redis_semaphore::Permit>, Error>,
    Duration,
) {
    let mut admin = server.conn();
    let client = client(server, op, 16);
    let sem = client
        .semaphore_builder("manual")
        .limit(1)
        .auto_refresh(false)
        .build()
        .unwrap();
    let held = sem
        .try_acquire()
        .unwrap()
        .expect("a free permit")
        .into_parts();
    let waiting = sem.clone();
    let waiter = timed_queued(&sem, move || waiting.acquire_timeout(timeout));
    release_and_pause_writes(&mut admin, "manual", held.id());
    let (r, took) = waiter.join().unwrap();
    (admin, r, took)
}

/// Releases the permit `id` of semaphore `name` (one nobody renews) through `admin`,
/// and pauses every write of the server (scripts included) in the same transaction:
/// the release hands the permit to the waiter at the head of the queue, and the
/// waiter's next script call hangs.
fn release_and_pause_writes(admin: &mut redis::Connection, name: &str, id: &str) {
    let sha = support::release_script().load(admin).unwrap();
    let _: redis::Value = redis::pipe()
        .atomic()
        .cmd("EVALSHA")
        .arg(sha)
        .arg(4)
        .arg(
            ["h", "i", "s", "q"]
                .map(|part| format!("redsem:{{{name}}}:{part}"))
                .to_vec(),
        )
        .arg(id)
        .cmd("CLIENT")
        .arg("PAUSE")
        .arg(30_000)
        .arg("WRITE")
        .query(admin)
        .unwrap();
}

/// A waiter of a semaphore without automatic refresh renews the permit pushed to it
/// (a heartbeat long) to a full lease before `acquire_timeout` returns. When the
/// server stopped answering after the grant, that renewal took an operation timeout
/// and the permit's release another (4.0 s for a 1 s timeout with a 2 s operation
/// timeout); the renewal now ends by the call's bound and by the grant's own deadline,
/// and a grant whose deadline passed is given back in the background (1.0 s).
#[test]
fn a_manual_refresh_acquire_timeout_served_from_the_queue_on_a_stopped_server_ends_within_its_timeout_and_one_round_trip()
 {
    const OP: Duration = Duration::from_secs(2);
    const TIMEOUT: Duration = Duration::from_secs(1);
    let server = RedisServer::start();
    let (mut admin, r, took) = serve_a_manual_waiter_and_pause_writes(&server, OP, TIMEOUT);
    let r = r.map(|p| p.map(|p| p.lease_left()));
    unpause(&mut admin);
    assert!(
        took <= TIMEOUT + OP + SLACK,
        "acquire_timeout({TIMEOUT:?}) took {took:?} (operation timeout {OP:?}): {r:?}"
    );
    // the pushed grant lasted a heartbeat (1 s), too short for its renewal: the call
    // fails with the renewal's timeout, or, when the renewal gave up a little before
    // the grant's deadline (its socket timeout ends short of its bound), returns the
    // permit valid only until that deadline
    match r {
        Err(e) => assert!(e.is_timeout(), "{e:?}"),
        Ok(Some(left)) => assert!(left <= Duration::from_secs(1), "{left:?}"),
        Ok(None) => panic!("neither the grant nor the renewal's timeout"),
    }
}

/// The same with an operation timeout shorter than the heartbeat: the renewal fails
/// while the pushed grant still runs, and the permit is returned valid until the
/// deadline the client knew (the grant's, never later than the server's), its loss
/// told by `lost()` then. It used to fail with the renewal's timeout, the permit
/// given back.
#[test]
fn a_manual_refresh_permit_served_from_the_queue_whose_renewal_fails_keeps_its_first_deadline() {
    const OP: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    let (mut admin, r, _) =
        serve_a_manual_waiter_and_pause_writes(&server, OP, Duration::from_secs(10));
    let permit = match r {
        Ok(Some(p)) => p,
        other => {
            unpause(&mut admin);
            panic!("a permit pushed to the waiter: {other:?}");
        }
    };
    assert!(!permit.is_lost());
    let left = permit.lease_left();
    assert!(
        left > Duration::ZERO && left <= Duration::from_secs(1),
        "the pushed grant's heartbeat, not a lease it could not renew: {left:?}"
    );
    assert_eq!(
        permit.lost().recv_timeout(left + SLACK),
        Ok(LostReason::Expired)
    );
    unpause(&mut admin);
}

/// Runs `rs.acquire_timeout(1, timeout)` on a semaphore without permits, stops the
/// server once the wait has made `tries` script calls, and returns the wait's result
/// and how long it took (the server goes on once the wait has ended).
fn a_redisson_wait_through_an_outage(
    server: &RedisServer,
    admin: &mut redis::Connection,
    rs: &redis_semaphore::compat::redisson::RSemaphore,
    timeout: Duration,
    tries: u64,
) -> (Result<bool, Error>, Duration) {
    assert!(rs.try_set_permits(0).unwrap());
    let calls = |admin: &mut redis::Connection| {
        support::command_calls(admin)
            .get("evalsha")
            .copied()
            .unwrap_or(0)
    };
    let before = calls(admin);
    let waiter = {
        let rs = rs.clone();
        thread::spawn(move || timed(|| rs.acquire_timeout(1, timeout)))
    };
    wait_until(Duration::from_secs(5), "the wait's tries", || {
        calls(admin) >= before + tries
    });
    let paused = server.pause();
    let result = waiter.join().unwrap();
    drop(paused);
    result
}

/// A Redisson `acquire_timeout` on a server that stopped answering during its wait ends
/// within its bound (its timeout and one try): leaving the subscription used to wait
/// for the answer to `UNSUBSCRIBE` as long as the read timeout the last wait for a
/// message had set (up to the re-check period), on the wait's own connection, which is
/// closed anyway.
#[test]
fn a_redisson_wait_ends_without_waiting_to_leave_its_subscription() {
    const OP: Duration = Duration::from_millis(300);
    const RECHECK: Duration = Duration::from_millis(1500);
    const TIMEOUT: Duration = Duration::from_secs(3);
    let server = RedisServer::start();
    let mut admin = server.conn();
    let client = client(&server, OP, 16);
    let rs = client.redisson_semaphore("rs").with_recheck(RECHECK);
    // two tries at once (before and after subscribing), then the one of the first
    // re-check: the server stops while the wait for a message that follows reads the
    // channel (with read timeouts up to the re-check period) until the deadline, and
    // the wait leaves its subscription on the stopped server (a silent wait makes no
    // try between its re-checks, nor one at its deadline)
    let (r, took) = a_redisson_wait_through_an_outage(&server, &mut admin, &rs, TIMEOUT, 3);
    assert_gave_up_in_time(&r, took, TIMEOUT, OP);
}

/// `Client::from_pool` with r2d2's defaults (`test_on_check_out(true)`, `min_idle` =
/// `max_size`): r2d2 sends a `PING` on each checkout, in the caller's thread, on a
/// connection whose timeouts the library has not set yet (those the pool opened and
/// the library never used have none). Dropping a permit on a stopped server waited
/// until the server answered again (found still blocked after 12 s, with a 2 s
/// operation timeout); it now ends within the operation timeout.
#[test]
fn dropping_a_permit_of_a_default_user_pool_on_a_stopped_server_ends_within_the_operation_timeout()
{
    let server = RedisServer::start();
    let pool = r2d2::Pool::builder()
        .max_size(4)
        .build(redis::Client::open(server.url()).unwrap())
        .unwrap();
    assert!(pool.test_on_check_out(), "r2d2's default");
    let client = Client::from_pool(pool).unwrap();
    let op = Duration::from_secs(2); // from_pool's operation timeout
    let sem = client.semaphore("user-pool", 2).unwrap();
    let permit = sem.try_acquire().unwrap().expect("a permit");
    let paused = server.pause();
    assert!(
        support::drop_ends_within(op + SLACK, permit, || drop(paused)),
        "the drop did not end within {:?}",
        op + SLACK
    );
    // and the client works again once the server answers
    assert!(sem.try_acquire().unwrap().is_some());
}

/// `acquire_timeout` with `wait_replicas`: the grant's confirmation (the renewal on a
/// pooled connection, then `WAIT`) ran without the wait's deadline (a checkout with
/// the pool's own wait, then an operation timeout per command), and a confirmation
/// that failed gave the permit back in the foreground (another operation timeout).
/// Here the grant is pushed to a queued waiter as the server's writes pause: the
/// renewal hangs for an operation timeout, then the release for another.
#[test]
fn a_replica_confirmed_acquire_timeout_served_from_the_queue_on_a_paused_server_ends_within_its_timeout_and_one_round_trip()
 {
    const OP: Duration = Duration::from_millis(1500);
    const TIMEOUT: Duration = Duration::from_millis(800);
    let server = RedisServer::start();
    let mut admin = server.conn();
    let client = client(&server, OP, 16);
    let sem = client
        .semaphore_builder("confirmed")
        .limit(1)
        .wait_replicas(1, Duration::from_millis(100))
        .build()
        .unwrap();
    // the holder, on a handle without the replica wait (no replica here), renewed by
    // nobody once handed over
    let held = client
        .semaphore("confirmed", 1)
        .unwrap()
        .try_acquire()
        .unwrap()
        .expect("a free permit")
        .into_parts();
    let waiting = sem.clone();
    let waiter = timed_queued(&sem, move || {
        waiting.acquire_timeout(TIMEOUT).map(|p| p.is_some())
    });
    release_and_pause_writes(&mut admin, "confirmed", held.id());
    let (r, took) = waiter.join().unwrap();
    unpause(&mut admin);
    assert!(
        took <= TIMEOUT + OP + SLACK,
        "acquire_timeout({TIMEOUT:?}) took {took:?} (operation timeout {OP:?}): {r:?}"
    );
}

/// Redisson's replica wait inside `acquire_timeout`: a try whose write no replica
/// acknowledged gives its permits back (Redisson's `handleNoSync`). That give-back ran
/// without the wait's deadline: a checkout with the pool's own wait, then an operation
/// timeout for its call. Here the replica is stopped (no acknowledgement) and the
/// primary's writes pause while the try's `WAIT` blocks: the give-back hangs.
#[test]
fn a_redisson_acquire_timeout_whose_give_back_after_an_unacknowledged_try_hangs_ends_within_its_timeout_and_one_try()
 {
    const OP: Duration = Duration::from_millis(1500);
    const REPLICA_WAIT: Duration = Duration::from_millis(1400);
    const TIMEOUT: Duration = Duration::from_millis(300);
    let (primary, replica) = support::primary_and_replica();
    let mut admin = primary.conn();
    let client = client(&primary, OP, 16);
    for expirable in [false, true] {
        let name = if expirable { "pes-undo" } else { "rs-undo" };
        let rs = client
            .redisson_semaphore(name)
            .with_replica_wait(REPLICA_WAIT)
            .unwrap();
        let pes = client
            .redisson_permit_expirable_semaphore(name)
            .with_replica_wait(REPLICA_WAIT)
            .unwrap();
        let _: () = redis::cmd("SET")
            .arg(name)
            .arg(5)
            .query(&mut admin)
            .unwrap();
        let stalled = replica.pause();
        let waiter = thread::spawn(move || {
            timed(|| {
                if expirable {
                    pes.acquire_timeout(TIMEOUT, None).map(|p| p.is_some())
                } else {
                    rs.acquire_timeout(1, TIMEOUT)
                }
            })
        });
        // the try took a permit and waits for the replica's acknowledgement
        wait_until(Duration::from_secs(5), "the try's WAIT blocks", || {
            let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut admin).unwrap();
            list.lines().any(|l| l.contains(" cmd=wait "))
        });
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(30_000)
            .arg("WRITE")
            .query(&mut admin)
            .unwrap();
        let (r, took) = waiter.join().unwrap();
        unpause(&mut admin);
        drop(stalled);
        assert!(
            took <= TIMEOUT + OP + SLACK,
            "{name}: acquire_timeout({TIMEOUT:?}) took {took:?} (operation timeout {OP:?}): {r:?}"
        );
    }
}

/// Waits until every connection of `pool` but `kept` (a listener's subscription) is
/// back in it, then checks each, all checked out at once, for replies in step with its
/// commands: a `SET` answered `OK` and the `GET` after it with the value set.
fn assert_every_pooled_connection_in_step(pool: &r2d2::Pool<redis::Client>, kept: u32) {
    wait_until(
        Duration::from_secs(10),
        "every connection back in the pool",
        || {
            let state = pool.state();
            state.idle_connections + kept == state.connections
        },
    );
    let conns: Vec<_> = (0..pool.state().idle_connections)
        .map(|_| pool.get().unwrap())
        .collect();
    for (k, mut conn) in conns.into_iter().enumerate() {
        let value = format!("value-{k}");
        let set: redis::RedisResult<String> = redis::cmd("SET")
            .arg("in-step")
            .arg(&value)
            .query(&mut *conn);
        assert_eq!(
            set.as_deref().ok(),
            Some("OK"),
            "connection {k}: SET got {set:?}"
        );
        let got: redis::RedisResult<redis::Value> =
            redis::cmd("GET").arg("in-step").query(&mut *conn);
        assert_eq!(
            got.as_ref().ok(),
            Some(&redis::Value::BulkString(value.into_bytes())),
            "connection {k}: GET got {got:?}"
        );
    }
}

/// The same with a pool given to `Client::from_pool`, whose connection the wait
/// subscribes on and gives back.
/// - Its bound: leaving the subscription waited for the answer to `UNSUBSCRIBE` as long
///   as the read timeout the last wait for a message had set (up to the re-check
///   period), after the try in flight at the deadline had taken its operation timeout
///   (5.03 s against a bound of 3.7 s).
/// - The connection it gives back: when that answer did not come in time, redis-rs
///   read it later as the reply to the connection's next command, and every later
///   command got the reply of the one before (a `SET` answered with `punsubscribe`, the
///   `GET` after it with `OK`). The connection now goes back to the pool only in step
///   with its replies.
#[test]
fn a_redisson_wait_on_a_given_pool_ends_in_time_and_gives_its_connection_back_in_step() {
    const OP: Duration = Duration::from_secs(2); // from_pool's operation timeout
    const RECHECK: Duration = Duration::from_millis(1500);
    const TIMEOUT: Duration = Duration::from_millis(1700);
    let server = RedisServer::start();
    let mut admin = server.conn();
    let pool = r2d2::Pool::builder()
        .max_size(4)
        .test_on_check_out(false)
        .build(redis::Client::open(server.url()).unwrap())
        .unwrap();
    let client = Client::from_pool(pool.clone()).unwrap();
    let rs = client.redisson_semaphore("rs").with_recheck(RECHECK);
    // the tries as the wait starts; the wait for a message that follows sets a read
    // timeout of the re-check period, and the try after it (before the deadline) hangs
    let (r, took) = a_redisson_wait_through_an_outage(&server, &mut admin, &rs, TIMEOUT, 3);
    assert_gave_up_in_time(&r, took, TIMEOUT, OP);
    assert_every_pooled_connection_in_step(&pool, 0);
    assert!(rs.try_set_permits(1).is_ok());
}

/// A leased semaphore's wake-up listener on a pool given to `Client::from_pool`
/// subscribes on one of its connections, and leaves that subscription when the client
/// is dropped. Dropped while the server does not answer, the client used to give that
/// connection back to the pool out of step with its replies (see the Redisson wait
/// above).
#[test]
fn a_client_on_a_given_pool_dropped_in_an_outage_gives_its_listener_s_connection_back_in_step() {
    let server = RedisServer::start();
    drop_a_listening_client_in_an_outage(&server, server.url(), Duration::ZERO);
}

/// The same over RESP3 (where redis-rs's subscription answers are push messages), with
/// an outage that outlasts the leave's own budget (the operation timeout), so the
/// connection is brought back in step in the background.
#[test]
fn a_resp3_listener_s_connection_left_in_a_long_outage_goes_back_in_step() {
    let server = RedisServer::start();
    let url = format!("{}?protocol=resp3", server.url());
    drop_a_listening_client_in_an_outage(&server, url, Duration::from_millis(1500));
}

/// Starts the listener of a client on a given pool (`url`), drops the client while
/// the server is stopped, keeps it stopped `longer` after the drop, and checks that
/// every connection comes back to the pool in step.
fn drop_a_listening_client_in_an_outage(server: &RedisServer, url: String, longer: Duration) {
    const OP: Duration = Duration::from_secs(2); // from_pool's operation timeout
    let pool = r2d2::Pool::builder()
        .max_size(4)
        .test_on_check_out(false)
        .build(redis::Client::open(url).unwrap())
        .unwrap();
    let client = Client::from_pool(pool.clone()).unwrap();
    let sem = client.semaphore("listened", 1).unwrap();
    let held = sem.acquire().unwrap();
    // a waiter makes the client start its listener, which subscribes on a pooled
    // connection
    let waiter = {
        let sem = sem.clone();
        thread::spawn(move || sem.acquire_timeout(Duration::from_millis(300)))
    };
    let mut admin = server.conn();
    wait_until(Duration::from_secs(5), "the listener subscribed", || {
        let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut admin).unwrap();
        list.lines().any(|l| l.contains(" sub=1 "))
    });
    assert!(matches!(waiter.join().unwrap(), Ok(None)));
    drop(held);
    let paused = server.pause();
    let (_, took) = timed(|| drop((sem, client)));
    // the scenario's timing, not a wait for a condition: the outage goes on
    thread::sleep(longer);
    drop(paused);
    assert!(took <= OP + SLACK, "the client's drop took {took:?}");
    assert_every_pooled_connection_in_step(&pool, 0);
}

/// A try never waits (DESIGN: "one round trip, never waits"): while every connection of
/// the pool is in use elsewhere, each semaphore's `try_acquire` gives up within one
/// operation timeout with a timeout error, not after the pool's own checkout wait (here
/// 30 s). The counting, Redisson and book tries used to wait for a connection that long;
/// the leased try already shared one budget between the checkout and its call.
#[test]
fn every_try_acquire_with_every_connection_busy_gives_up_within_one_operation_timeout() {
    // the operation timeout of a client made by Client::from_pool
    const OP: Duration = Duration::from_secs(2);
    let server = RedisServer::start();
    let pool = r2d2::Pool::builder()
        .max_size(2)
        .connection_timeout(Duration::from_secs(30))
        .test_on_check_out(false)
        .build(server.client())
        .unwrap();
    let client = Client::from_pool(pool.clone()).unwrap();
    let sem = client.semaphore("try-busy", 1).unwrap();
    let cs = client.counting_semaphore("cs-try-busy").unwrap();
    let rs = client.redisson_semaphore("rs-try-busy");
    let pes = client.redisson_permit_expirable_semaphore("pes-try-busy");
    let book = client.book_semaphore("book-try-busy", 1).build().unwrap();
    // every handle has made its first call (its clock anchor, its scripts loaded)
    assert!(cs.try_set_permits(1).unwrap());
    assert!(rs.try_set_permits(1).unwrap());
    assert!(pes.try_set_permits(1).unwrap());
    drop(sem.try_acquire().unwrap().expect("a free permit"));
    assert_eq!(book.held().unwrap(), 0);
    type Try<'a> = (&'static str, Box<dyn Fn() -> Result<bool, Error> + 'a>);
    let tries: Vec<Try> = vec![
        (
            "leased",
            Box::new(|| sem.try_acquire().map(|p| p.is_some())),
        ),
        ("counting", Box::new(|| cs.try_acquire(1))),
        ("RSemaphore", Box::new(|| rs.try_acquire(1))),
        (
            "RPermitExpirableSemaphore",
            Box::new(|| pes.try_acquire(None).map(|p| p.is_some())),
        ),
        ("book", Box::new(|| book.try_acquire().map(|p| p.is_some()))),
    ];
    for (what, try_acquire) in tries {
        // every connection the pool has or can open, in use here
        let busy: Vec<_> = std::iter::from_fn(|| pool.get_timeout(Duration::from_millis(200)).ok())
            .take(pool.max_size() as usize)
            .collect();
        assert!(!busy.is_empty());
        let (r, took) = timed(try_acquire);
        drop(busy);
        assert!(
            r.as_ref().is_err_and(Error::is_timeout),
            "{what} try_acquire with every connection busy: {r:?}"
        );
        assert!(
            took <= OP + SLACK,
            "{what} try_acquire with every connection busy took {took:?} (operation \
             timeout {OP:?})"
        );
    }
}

/// One client, two semaphores: a try on A whose request is held up on its way (the
/// proxy holds every request naming A, as a stalled link under one connection would)
/// times out, and the calls on B made after it must not wait for it. They did: the
/// timed-out connection went back to the pool with A's reply still owed (the `redis`
/// connection only notes to skip it), the next checkout handed it to B, and B's
/// request queued behind A's held one, so B timed out too although nothing held B
/// (review of 2026-11-27). A checkout now passes over a connection that owes a reply
/// while another can be had (and a call on a stopped server still ends by its
/// operation timeout: `every_other_call_on_a_stopped_server_fails_within_one_operation_timeout`).
#[test]
fn calls_on_another_semaphore_do_not_wait_for_a_held_call_s_connection() {
    const OP: Duration = Duration::from_millis(500);
    const HOLD: Duration = Duration::from_secs(4);
    let (_server, proxy, client) = proxied(OP);
    let a = client.semaphore("held-a", 2).unwrap();
    let b = client.semaphore("free-b", 2).unwrap();
    // (both scripts loaded, and a connection or two in the pool)
    drop(a.try_acquire().unwrap().expect("a permit of A"));
    drop(b.try_acquire().unwrap().expect("a permit of B"));
    proxy.delay_sent(b"held-a", HOLD);
    let started = Instant::now();
    let (r, _) = timed(|| a.try_acquire());
    assert!(
        matches!(&r, Err(e) if e.is_timeout()),
        "A's held try times out: {r:?}"
    );
    for round in 0..3 {
        let (p, took) = timed(|| b.try_acquire());
        let p = p
            .unwrap_or_else(|e| panic!("B's try_acquire (round {round}) failed: {e}"))
            .expect("a permit of B");
        assert!(took <= OP, "B's try_acquire (round {round}) took {took:?}");
        let (r, took) = timed(|| p.release());
        r.unwrap_or_else(|e| panic!("B's release (round {round}) failed: {e}"));
        assert!(took <= OP, "B's release (round {round}) took {took:?}");
        let (p, took) = timed(|| b.acquire_timeout(OP));
        let p = p
            .unwrap_or_else(|e| panic!("B's acquire_timeout (round {round}) failed: {e}"))
            .expect("a permit of B");
        assert!(
            took <= OP,
            "B's acquire_timeout (round {round}) took {took:?}"
        );
        let (_, took) = timed(|| drop(p));
        assert!(
            took <= OP,
            "dropping B's permit (round {round}) took {took:?}"
        );
        let (r, took) = timed(|| b.available());
        r.unwrap_or_else(|e| panic!("B's available (round {round}) failed: {e}"));
        assert!(took <= OP, "B's available (round {round}) took {took:?}");
    }
    assert!(
        started.elapsed() < HOLD,
        "the checks ran while A's request was held"
    );
    proxy.delay_sent(b"held-a", Duration::ZERO);
}

/// A leased `acquire_timeout` is bounded by its timeout and one operation timeout (the
/// look in flight at the deadline). A look that came back after the deadline was
/// followed by another one, sent after the deadline with a whole operation timeout of
/// its own, whenever a wake-up was ready beside the expired timer: the waiter's
/// `select!` picked one of them at random, and took a lost heartbeat (or a "look
/// again", or a grant message to check) as a reason to look again without asking
/// whether its time was up. Here every script call reaches the server 3 s late: the
/// listener's reconnection tells the eight waiters to look again 0.3 s before their
/// deadline, their heartbeats are found lost while those looks hang, and each waiter
/// that then looked again returned about 5.7 s after its deadline, against a bound of
/// 4 s (each waiter had an even chance of that second look: with eight, about one
/// run in 256 passed). No look is sent after the deadline
/// now: the wait leaves the queue instead.
#[test]
fn a_queued_acquire_timeout_sends_no_look_after_its_deadline() {
    const OP: Duration = Duration::from_secs(4);
    const TIMEOUT: Duration = Duration::from_millis(1500);
    const SLOW: Duration = Duration::from_secs(3);
    const WAITERS: usize = 8;
    let (server, proxy, client) = proxied(OP);
    let direct = Client::open(server.url()).unwrap();
    let watch = direct.semaphore("leased-late-look", 1).unwrap();
    let held = watch.acquire().unwrap();
    let sem = client.semaphore("leased-late-look", 1).unwrap();
    // a first wait that gives up loads the scripts (the cancel's too) and starts the
    // client's listener
    assert!(
        sem.acquire_timeout(Duration::from_millis(10))
            .unwrap()
            .is_none()
    );
    let start = Instant::now();
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let sem = sem.clone();
            thread::spawn(move || timed(|| sem.acquire_timeout(TIMEOUT).map(|p| p.is_some())))
        })
        .collect();
    wait_until(Duration::from_secs(5), "the waiters queue", || {
        watch.queue_len().unwrap() == WAITERS as u32
    });
    let arm_at = start + TIMEOUT - Duration::from_millis(300);
    assert!(
        Instant::now() < arm_at,
        "the scenario needs the waiters queued before their last look"
    );
    // The scenario's timing, not a wait for a condition: the last looks start 0.3 s
    // before the deadline, so that they are in flight at it.
    thread::sleep(arm_at.saturating_duration_since(Instant::now()));
    // every script call through the proxy reaches the server 3 s late (after the
    // deadline, within the operation timeout): the looks answer "not yet", late
    proxy.delay_sent(b"EVALSHA", SLOW);
    // the listener's connection dropped: once subscribed again it tells every waiter
    // to look again
    let mut admin = server.conn();
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .exec(&mut admin)
        .unwrap();
    for w in waiters {
        let (r, took) = w.join().unwrap();
        assert_gave_up_in_time(&r, took, TIMEOUT, OP);
    }
    drop(held);
}

/// The book's variants, for the tests that run on each.
const BOOK_VARIANTS: [BookVariant; 4] = [
    BookVariant::Basic,
    BookVariant::Fair,
    BookVariant::FairWithLock,
    BookVariant::NodeFair,
];

/// A book `acquire_timeout` polls, and each poll waited for a connection as long as
/// the pool's checkout timeout allows (5 s by default), then an operation timeout for
/// its calls: behind the only connection, hung in another call, a 300 ms wait took
/// about two operation timeouts (3 s here against a bound of 1.8 s). Every poll, the
/// wait for its connection included, now ends by the deadline and one operation
/// timeout, as the other semaphores' waits do.
#[test]
fn book_acquire_timeouts_behind_a_busy_connection_end_within_their_timeout_and_one_round_trip() {
    const OP: Duration = Duration::from_millis(1500);
    const TIMEOUT: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    let mut admin = server.conn();
    for variant in BOOK_VARIANTS {
        // a client of its own for each variant: a failed poll's clean-up, aside, holds
        // the only connection a while
        let client = client(&server, OP, 1);
        let book = client
            .book_semaphore(&format!("book-busy-{variant:?}"), 1)
            .variant(variant)
            .build()
            .unwrap();
        let (r, took) = behind_a_hung_call(&mut admin, &client, OP, || {
            book.acquire_timeout(TIMEOUT).map(|p| p.is_some())
        });
        assert!(
            took <= TIMEOUT + OP + SLACK,
            "{variant:?}: acquire_timeout({TIMEOUT:?}) took {took:?} (operation timeout \
             {OP:?}): {r:?}"
        );
        assert!(
            matches!(r, Ok(false)) || r.as_ref().is_err_and(Error::is_timeout),
            "{variant:?}: {r:?}"
        );
    }
}

/// A book `acquire_timeout` on a fresh client whose server accepts connections and
/// never answers (a stalled link): its first poll waited for the connect attempt to
/// time out (3 s here, the connect timeout) against a bound of the timeout and one
/// operation timeout (0.8 s). It now gives up by that bound.
#[test]
fn a_book_acquire_timeout_whose_connect_stalls_ends_within_its_timeout_and_one_round_trip() {
    const OP: Duration = Duration::from_millis(600);
    const TIMEOUT: Duration = Duration::from_millis(200);
    let server = RedisServer::start();
    let proxy = support::Proxy::start(server.port());
    proxy.stall_new();
    for variant in BOOK_VARIANTS {
        let client = Client::builder()
            .operation_timeout(OP)
            .connect_timeout(Duration::from_secs(3))
            .checkout_timeout(Duration::from_secs(10))
            .build(proxy.url())
            .unwrap();
        let book = client
            .book_semaphore(&format!("book-stall-{variant:?}"), 1)
            .variant(variant)
            .build()
            .unwrap();
        let (r, took) = timed(|| book.acquire_timeout(TIMEOUT).map(|p| p.is_some()));
        assert!(
            took <= TIMEOUT + OP + SLACK,
            "{variant:?}: acquire_timeout({TIMEOUT:?}) took {took:?} (operation timeout \
             {OP:?}): {r:?}"
        );
        assert!(
            matches!(r, Ok(false)) || r.as_ref().is_err_and(Error::is_timeout),
            "{variant:?}: {r:?}"
        );
    }
    drop(server);
}

/// A book permit's manual refresh waits on Redis at most the operation timeout in all:
/// it waited for a connection as long as the checkout timeout allows, and then an
/// operation timeout for its transaction, so behind a busy connection on a paused
/// server it took about two.
#[test]
fn a_book_manual_refresh_behind_a_busy_connection_ends_within_the_operation_timeout() {
    const OP: Duration = Duration::from_secs(1);
    let server = RedisServer::start();
    let mut admin = server.conn();
    for variant in [
        BookVariant::Fair,
        BookVariant::FairWithLock,
        BookVariant::NodeFair,
    ] {
        let client = client(&server, OP, 1);
        let book = client
            .book_semaphore(&format!("book-refresh-busy-{variant:?}"), 2)
            .variant(variant)
            .build()
            .unwrap();
        let permit = book.try_acquire().unwrap().expect("a free permit");
        let (r, took) = behind_a_hung_call(&mut admin, &client, OP, || permit.refresh());
        assert!(
            took <= OP + SLACK,
            "{variant:?}: a book permit's refresh took {took:?} (operation timeout {OP:?}): \
             {r:?}"
        );
        assert!(
            r.as_ref().is_err_and(Error::is_timeout),
            "{variant:?}: {r:?}"
        );
        permit.release().unwrap();
    }
}

/// A book permit's refresh and release on a stopped server end by the operation
/// timeout itself, as every drop does
/// (`drops_on_a_stopped_server_end_by_the_operation_timeout_itself_not_the_kernel_s_late_timer`).
#[test]
fn book_refresh_and_release_on_a_stopped_server_end_by_the_operation_timeout_itself() {
    const OP: Duration = Duration::from_secs(3);
    /// A thread waking after the call ends, far below the kernel's lateness at 3 s.
    const WAKE: Duration = Duration::from_millis(25);
    let server = RedisServer::start();
    let mut permits = Vec::new();
    for variant in [
        BookVariant::Fair,
        BookVariant::FairWithLock,
        BookVariant::NodeFair,
    ] {
        for op in ["refresh", "release"] {
            // a client of its own for each call, its one connection idle in its pool
            // (so that no call waits to open one)
            let client = client(&server, OP, 1);
            let book = client
                .book_semaphore(&format!("book-stopped-{variant:?}"), 6)
                .variant(variant)
                .build()
                .unwrap();
            permits.push((variant, op, book.try_acquire().unwrap().expect("a permit")));
        }
    }
    let paused = server.pause();
    let calls: Vec<_> = permits
        .into_iter()
        .map(|(variant, op, permit)| {
            thread::spawn(move || {
                // (a refreshed permit is dropped after the server runs again: its
                // drop is a release of its own, not timed here)
                if op == "refresh" {
                    let (r, took) = timed(|| permit.refresh());
                    (variant, op, r, took, Some(permit))
                } else {
                    let (r, took) = timed(|| permit.release());
                    (variant, op, r, took, None)
                }
            })
        })
        .collect();
    let results: Vec<_> = calls.into_iter().map(|c| c.join().unwrap()).collect();
    drop(paused);
    for (variant, op, r, took, permit) in results {
        drop(permit);
        assert!(
            r.as_ref().is_err_and(Error::is_timeout),
            "{variant:?} {op}: {r:?}"
        );
        assert!(
            took <= OP + WAKE,
            "{variant:?}: a book permit's {op} took {took:?} on a stopped server (operation \
             timeout {OP:?})"
        );
    }
}
