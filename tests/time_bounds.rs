//! Time bounds of the public blocking calls when the server stops answering (SIGSTOP,
//! or `CLIENT PAUSE` where the test must see which call hangs): each call returns,
//! with an error or its answer, within the bound its documentation gives.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use redis_semaphore::{Client, Error};
use support::{RedisServer, wait_until};

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
    assert!(
        took <= TIMEOUT + OP + SLACK,
        "acquire_timeout({TIMEOUT:?}) took {took:?} (operation timeout {OP:?}): {r:?}"
    );
    // a look in flight at the deadline fails; a wait that reached it leaves the queue
    assert!(
        matches!(&r, Ok(false)) || r.as_ref().is_err_and(Error::is_timeout),
        "{r:?}"
    );
}
