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

// Found by a review (2026-11-27, fourth session): each failed before its mend.

/// A permit handed over with `into_parts` and adopted is one grant: `Stats::acquired`
/// ("Permit guards granted, by any acquire") counted it twice, once for the acquire
/// and once for the adoption, while it is released once: `acquired - released`, the
/// permits held, stays 1 for good after every hand-over (across a fleet too: the
/// adopting process counts it acquired again).
#[test]
fn an_adopted_permit_is_not_counted_acquired_again() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = client.semaphore("handed", 2).unwrap();
    let parts = sem.acquire().unwrap().into_parts();
    let adopted = sem.adopt(parts).unwrap();
    adopted.release().unwrap();
    let s = client.stats();
    assert_eq!(
        (s.acquired, s.released),
        (1, 1),
        "one grant, acquired once and released once: {s:?}"
    );
}

/// `Stats::try_failed` counts "try_acquire calls (and first looks of blocking
/// acquires) that found no permit free", and a counting semaphore's `try_acquire`
/// is counted there; its blocking acquire's first look, which found nothing, was not
/// (the leased semaphore's is).
#[test]
fn a_counting_blocking_acquire_s_failed_first_look_counts_as_a_failed_try() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let cs = client.counting_semaphore("empty").unwrap();
    assert!(cs.try_set_permits(0).unwrap());
    assert!(!cs.try_acquire(1).unwrap());
    assert_eq!(client.stats().try_failed, 1);
    assert!(!cs.acquire_timeout(1, Duration::from_millis(50)).unwrap());
    let s = client.stats();
    assert_eq!((s.waits, s.wait_gave_up), (1, 1));
    assert_eq!(s.try_failed, 2, "{s:?}");
    // the leased semaphore counts its first look (tests/stats.rs)
    let leased = client.semaphore("empty", 1).unwrap();
    let _held = leased.acquire().unwrap();
    assert!(
        leased
            .acquire_timeout(Duration::from_millis(50))
            .unwrap()
            .is_none()
    );
    assert_eq!(client.stats().try_failed, 3);
}

/// `Stats::errors` counts "operations that failed with a Redis or pool error". A
/// blocking acquire refused because the limit was lowered below its request while it
/// waited (`Error::PermitsExceedLimit`, no Redis or pool error) was counted as one.
#[test]
fn a_wait_refused_by_a_lowered_limit_is_no_redis_error() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = client.semaphore("lowered", 2).unwrap();
    let held = sem.acquire().unwrap();
    let waiter = {
        let sem = sem.clone();
        std::thread::spawn(move || sem.acquire_many_timeout(2, Duration::from_secs(20)))
    };
    support::wait_until(Duration::from_secs(5), "queued", || {
        sem.queue_len().unwrap() == 1
    });
    sem.set_limit(1).unwrap();
    let r = waiter.join().unwrap();
    assert!(
        matches!(r, Err(redis_semaphore::Error::PermitsExceedLimit { .. })),
        "{r:?}"
    );
    drop(held);
    assert_eq!(client.stats().errors, 0, "{:?}", client.stats());
}

/// A blocking acquire whose queued look fails with a Redis error (a key of the
/// semaphore overwritten with another type) is one operation that failed: counted
/// once in `Stats::errors`, not once by the look and once more by the wait.
#[test]
fn a_wait_that_fails_on_a_redis_error_counts_one_error() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = client.semaphore("clobbered", 1).unwrap();
    let held = sem.acquire().unwrap();
    let waiter = {
        let sem = sem.clone();
        std::thread::spawn(move || sem.acquire_timeout(Duration::from_secs(20)))
    };
    support::wait_until(Duration::from_secs(5), "queued", || {
        sem.queue_len().unwrap() == 1
    });
    let errors_before = client.stats().errors;
    let _: () = redis::cmd("SET")
        .arg("redsem:{clobbered}:q")
        .arg("x")
        .query(&mut server.conn())
        .unwrap();
    let r = waiter.join().unwrap();
    assert!(r.is_err(), "{r:?}");
    std::mem::forget(held);
    assert_eq!(
        client.stats().errors - errors_before,
        1,
        "{:?}",
        client.stats()
    );
}

/// A Redisson permit-expirable permit released after another client released it by
/// its id is gone (an expected outcome, `release_gone`), not a failed release; it was
/// counted in `release_failed`, unlike the leased and book semaphores' releases.
#[test]
fn a_permit_expirable_permit_gone_before_its_release_counts_as_gone() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let pes = client.redisson_permit_expirable_semaphore("gone");
    assert!(pes.try_set_permits(1).unwrap());
    let permit = pes.try_acquire(None).unwrap().expect("a permit");
    // another process releases it by its id (Redisson's release(id))
    let other = Client::open(server.url()).unwrap();
    other
        .redisson_permit_expirable_semaphore("gone")
        .release(permit.id())
        .unwrap();
    assert!(permit.release().is_err(), "already released by another");
    let s = client.stats();
    assert_eq!(
        (s.release_gone, s.release_failed, s.errors),
        (1, 0, 0),
        "{s:?}"
    );
}

/// Review (seventh session): `Stats::errors` (and `redis_semaphore_errors_total`)
/// counts "operations that failed with a Redis or pool error", and a counting
/// semaphore's reads and writes (`queue_len`, `balance`, `add_permits`...) are
/// counted there; the leased semaphore's were not: `status`, `available`, `limit`,
/// `queue_len`, `holders`, `set_limit`, `force_release` and a manual
/// `Permit::refresh` failing on an unreachable server left the count at 0, so an
/// alert on it missed an application whose every call but acquire and release failed.
#[test]
fn failed_reads_writes_and_manual_refreshes_of_a_leased_semaphore_count_as_errors() {
    let mut server = RedisServer::start();
    let client = Client::builder()
        .connect_timeout(Duration::from_millis(500))
        .checkout_timeout(Duration::from_millis(500))
        .build(server.url())
        .unwrap();
    let sem = client
        .semaphore_builder("down")
        .limit(2)
        .auto_refresh(false)
        .build()
        .unwrap();
    let held = sem.acquire().unwrap();
    let counting = client.counting_semaphore("down").unwrap();
    server.stop();
    let errors = || client.stats().errors;
    let before = errors();
    // the counting semaphore's read counts (as it did)
    assert!(counting.queue_len().is_err());
    assert_eq!(errors(), before + 1, "{:?}", client.stats());
    let absent = "00000000-0000-4000-8000-000000000000";
    let failed: Vec<(&str, bool)> = vec![
        ("status", sem.status().is_err()),
        ("available", sem.available().is_err()),
        ("limit", sem.limit().is_err()),
        ("queue_len", sem.queue_len().is_err()),
        ("holders", sem.holders().is_err()),
        ("status_and_holders", sem.status_and_holders().is_err()),
        ("set_limit", sem.set_limit(3).is_err()),
        ("force_release", sem.force_release(absent).is_err()),
        ("refresh", held.refresh().is_err()),
    ];
    assert!(failed.iter().all(|f| f.1), "{failed:?}");
    assert_eq!(
        errors() - before - 1,
        failed.len() as u64,
        "one error per failed call: {:?}",
        client.stats()
    );
    std::mem::forget(held);
}

// Found by a review (2026-11-27, eighth session): each failed before its mend.

/// `Stats::acquired` counts "permit guards granted, by any acquire" and `released`
/// "permits given back without error"; the metrics count a counting semaphore's
/// successful acquire and its release there (`redis_semaphore_acquired_total`,
/// `_released_total`), and `Stats` counts a Redisson `RSemaphore`'s grant. A counting
/// semaphore's grants (a try, a blocking acquire's first look, a granted wait) and
/// releases, and an `RSemaphore`'s releases, left both counts at 0.
#[test]
fn counting_and_rsemaphore_grants_and_releases_count_as_acquired_and_released() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let cs = client.counting_semaphore("counted").unwrap();
    assert!(cs.try_set_permits(2).unwrap());
    assert!(cs.try_acquire(1).unwrap(), "a try");
    cs.acquire(1).unwrap(); // granted at its first look
    let waiter = {
        let cs = cs.clone();
        std::thread::spawn(move || cs.acquire_timeout(2, Duration::from_secs(20)))
    };
    wait_until(Duration::from_secs(10), "queued", || {
        cs.queue_len().unwrap() == 1
    });
    cs.release(2).unwrap();
    assert!(waiter.join().unwrap().unwrap(), "a granted wait");
    cs.release(1).unwrap();
    let s = client.stats();
    assert_eq!((s.acquired, s.released), (3, 2), "{s:?}");
    // a refused try and a wait that gave up are not grants
    assert!(!cs.try_acquire(2).unwrap());
    assert!(!cs.acquire_timeout(2, Duration::from_millis(50)).unwrap());
    let s = client.stats();
    assert_eq!((s.acquired, s.released), (3, 2), "{s:?}");

    // the Redisson RSemaphore counted its grants but not its releases
    let rs = client.redisson_semaphore("counted-rs");
    assert!(rs.try_set_permits(1).unwrap());
    assert!(rs.try_acquire(1).unwrap());
    assert_eq!(rs.release(1).unwrap(), 1);
    assert!(rs.release_if_exists(1).unwrap());
    // a counter that does not exist: nothing given back, nothing counted
    assert!(
        !client
            .redisson_semaphore("counted-rs-absent")
            .release_if_exists(1)
            .unwrap()
    );
    let s = client.stats();
    assert_eq!((s.acquired, s.released), (4, 4), "{s:?}");
}

/// `Stats::errors` counts "operations that failed with a Redis or pool error", and
/// every semaphore's reads count there; `Client::list_semaphores` and
/// `list_counting_semaphores` did not, and their Redis error was a bare
/// `redis error: ...` that named neither the call nor the pattern (a `status` that
/// fails names its operation and semaphore).
#[test]
fn a_failed_listing_counts_as_an_error_naming_its_call_and_pattern() {
    // a server on which SCAN is refused (an error reply, the connection fine)
    let server = RedisServer::start_with(&["--rename-command", "SCAN", ""]);
    let client = Client::open(server.url()).unwrap();
    client.ping().unwrap();
    for (call, listed) in [
        ("list_semaphores", client.list_semaphores("jobs:*")),
        (
            "list_counting_semaphores",
            client.list_counting_semaphores("jobs:*"),
        ),
    ] {
        let e = listed.expect_err("SCAN is refused");
        let text = e.to_string();
        assert!(text.contains(call), "{text}");
        assert!(text.contains("jobs:*"), "{text}");
        assert!(text.to_lowercase().contains("scan"), "{text}");
        assert!(!e.is_retryable(), "{e:?}");
    }
    assert_eq!(client.stats().errors, 2, "{:?}", client.stats());

    // a server that is gone: a connect error, counted as well
    let mut gone = RedisServer::start();
    let client = Client::builder()
        .connect_timeout(Duration::from_millis(500))
        .checkout_timeout(Duration::from_millis(500))
        .build(gone.url())
        .unwrap();
    gone.stop();
    assert!(client.list_semaphores("*").is_err());
    assert!(client.list_counting_semaphores("*").is_err());
    assert_eq!(client.stats().errors, 2, "{:?}", client.stats());
}
