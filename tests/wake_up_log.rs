//! What the wake-up listener says in the log about messages it cannot read. (A file
//! of its own: the logger is global to the test process.)

mod support;

use std::time::Duration;

use redis_semaphore::Client;
use support::{RedisServer, wait_until};

/// The records about malformed wake-ups: (warnings, all of them).
fn malformed_records() -> (Vec<String>, usize) {
    let records = support::capture::crate_records();
    let about: Vec<_> = records
        .iter()
        .filter(|(_, msg)| msg.contains("malformed wake-up"))
        .collect();
    let warnings = about
        .iter()
        .filter(|(level, _)| *level == log::Level::Warn)
        .map(|(_, msg)| msg.clone())
        .collect();
    (warnings, about.len())
}

/// Seventh session: anyone who may publish on a client's wake-up channel (which the
/// queue's records name) could flood the application's log at warn, one record per
/// message quoting all of it (a message of a hundred kilobytes, a hundred kilobytes of
/// log each time). A malformed message is now quoted up to 120 bytes, and warned
/// about at most once a minute (with how many came since); the rest go to debug. And
/// the listener still serves the client's waiters.
#[test]
fn a_flood_of_malformed_wake_ups_is_not_a_flood_of_warnings() {
    const MESSAGES: usize = 200;
    support::capture::install();
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = client.semaphore("flood", 1).unwrap();
    let held = sem.acquire().unwrap();
    // starts the listener
    support::start_listener(&sem);
    let mut conn = server.conn();
    let channel = support::listener_channel(&mut conn);
    let junk = "é".repeat(50_000);
    for _ in 0..MESSAGES {
        let heard: u32 = redis::cmd("PUBLISH")
            .arg(&channel)
            .arg(&junk)
            .query(&mut conn)
            .unwrap();
        assert_eq!(heard, 1, "the listener is subscribed");
    }
    wait_until(Duration::from_secs(10), "every message read", || {
        malformed_records().1 == MESSAGES
    });
    let (warnings, _) = malformed_records();
    assert_eq!(warnings.len(), 1, "one warning: {} of them", warnings.len());
    assert!(
        warnings[0].len() < 400,
        "the warning quotes the message in full: {} bytes",
        warnings[0].len()
    );
    assert!(
        warnings[0].contains("100000 bytes"),
        "the warning says how long the message was: {}",
        warnings[0]
    );
    let longest = support::capture::crate_records()
        .iter()
        .map(|(_, msg)| msg.len())
        .max()
        .unwrap();
    assert!(longest < 400, "a record of {longest} bytes");

    // and a waiter is still woken by its message
    let waiter = support::queued_waiter(&sem, Duration::from_secs(5));
    drop(held);
    let served = waiter.join().unwrap().0.unwrap();
    assert!(served.is_some(), "the waiter was not served");
}
