//! `Client::stats` counters move as operations happen.

mod support;

use std::time::Duration;

use redis_semaphore::Client;
use support::{RedisServer, wait_until};

#[test]
fn stats_count_acquires_failures_waits_releases_and_refreshes() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = client
        .semaphore_builder("stats")
        .limit(1)
        .lease(Duration::from_millis(300))
        .build()
        .unwrap();
    assert_eq!(client.stats().acquired, 0);
    let p = sem.acquire().unwrap();
    assert!(sem.try_acquire().unwrap().is_none());
    assert!(
        sem.acquire_timeout(Duration::from_millis(50))
            .unwrap()
            .is_none()
    );
    let s = client.stats();
    assert_eq!(s.acquired, 1);
    assert_eq!(s.try_failed, 2, "{s:?}");
    assert_eq!(s.waits, 1);
    assert_eq!(s.wait_gave_up, 1);
    wait_until(Duration::from_secs(5), "a refresh tick", || {
        client.stats().refresh_calls >= 1
    });
    let waiter = {
        let sem = sem.clone();
        std::thread::spawn(move || sem.acquire().unwrap().release().unwrap())
    };
    wait_until(Duration::from_secs(5), "queued", || {
        sem.queue_len().unwrap() == 1
    });
    p.release().unwrap();
    waiter.join().unwrap();
    let s = client.stats();
    assert_eq!(s.acquired, 2);
    assert_eq!(s.waits, 2);
    assert_eq!(s.released, 2);
    assert_eq!(s.wait_latency.iter().map(|b| b.1).sum::<u64>(), 1);
    assert!(s.wait_total > Duration::ZERO);

    let lost = sem.acquire().unwrap();
    sem.force_release(lost.id()).unwrap();
    wait_until(Duration::from_secs(5), "loss noticed", || lost.is_lost());
    assert_eq!(client.stats().lost, 1);
    assert!(lost.release().is_err());
    // a permit already gone is an expected outcome, counted apart from failures
    assert_eq!(client.stats().release_gone, 1);
    assert_eq!(client.stats().release_failed, 0);
}
