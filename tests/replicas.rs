//! `SemaphoreBuilder::wait_replicas`: a grant is handed out only once enough replicas
//! have it, on every path that yields a permit (a try, a first try of a blocking
//! acquire, a grant pushed to a queued waiter by someone else's release); otherwise
//! the permit is given back and the call fails with `Error::ReplicasNotAcked`.

mod support;

use std::thread;
use std::time::Duration;

use redis_semaphore::{Client, Error, Semaphore};
use support::{RedisServer, primary_and_replica, release_script, wait_until};

fn sem(server: &RedisServer, name: &str, limit: u32, replicas: u32, timeout_ms: u64) -> Semaphore {
    Client::open(server.url())
        .unwrap()
        .semaphore_builder(name)
        .limit(limit)
        .wait_replicas(replicas, Duration::from_millis(timeout_ms))
        .build()
        .unwrap()
}

/// Whether `server` (read directly, no WAIT) holds permit `id` of semaphore `name`.
fn holds(server: &RedisServer, name: &str, id: &str) -> bool {
    let score: Option<f64> = redis::cmd("ZSCORE")
        .arg(format!("redsem:{{{name}}}:h"))
        .arg(id)
        .query(&mut server.conn())
        .unwrap();
    score.is_some()
}

#[test]
fn every_grant_path_returns_a_permit_the_replica_already_has() {
    let (primary, replica) = primary_and_replica();
    let sem = sem(&primary, "replicated", 1, 1, 1_000);

    // a try
    let p = sem.try_acquire().unwrap().expect("a free permit");
    assert!(
        holds(&replica, "replicated", p.id()),
        "the try's grant is on the replica"
    );

    // a blocking acquire served by the release of the holder (a pushed grant)
    let waiter = {
        let sem = sem.clone();
        thread::spawn(move || sem.acquire())
    };
    wait_until(Duration::from_secs(5), "the waiter queues", || {
        sem.queue_len().unwrap() == 1
    });
    p.release().unwrap();
    let q = waiter.join().unwrap().unwrap();
    assert!(
        holds(&replica, "replicated", q.id()),
        "the pushed grant is on the replica"
    );
    drop(q);

    // a blocking acquire granted on its first try
    let r = sem
        .acquire_timeout(Duration::from_secs(1))
        .unwrap()
        .unwrap();
    assert!(holds(&replica, "replicated", r.id()));
}

#[test]
fn without_enough_replicas_the_grant_is_given_back_and_the_call_fails() {
    let primary = RedisServer::start();
    let sem = sem(&primary, "alone", 2, 1, 50);
    for attempt in [
        sem.try_acquire().map(|_| ()),
        sem.acquire().map(|_| ()),
        sem.acquire_many_timeout(2, Duration::from_millis(200))
            .map(|_| ()),
    ] {
        match attempt {
            Err(Error::ReplicasNotAcked {
                name,
                acked,
                wanted,
            }) => {
                assert_eq!((name.as_str(), acked, wanted), ("alone", 0, 1));
            }
            other => panic!("expected ReplicasNotAcked, got {other:?}"),
        }
        // nothing is left held: the permit was released, not left to its lease
        assert_eq!(sem.available().unwrap(), 2);
        assert!(sem.holders().unwrap().is_empty());
    }
    let msg = sem.try_acquire().unwrap_err().to_string();
    assert!(
        msg.contains("0 of 1 replica") && msg.contains("\"alone\""),
        "{msg}"
    );
}

/// A replica wait close to the operation timeout: the server answers a blocked `WAIT`
/// up to 100 ms after its own timeout, and the read of its answer must end within the
/// operation timeout, so a `WAIT` of the whole timeout failed as a read timeout
/// instead of saying how many replicas acknowledged. The library now sends a `WAIT`
/// short enough to be answered in time, and the call fails as it should.
#[test]
fn a_replica_wait_close_to_the_operation_timeout_is_answered_not_timed_out() {
    const OP: Duration = Duration::from_secs(1);
    let primary = RedisServer::start();
    let client = Client::builder()
        .operation_timeout(OP)
        .build(primary.url())
        .unwrap();
    let sem = client
        .semaphore_builder("close")
        .limit(1)
        .wait_replicas(1, OP - Duration::from_millis(20))
        .build()
        .unwrap();
    match sem.try_acquire() {
        Err(Error::ReplicasNotAcked { acked: 0, .. }) => {}
        other => panic!("expected ReplicasNotAcked, got {other:?}"),
    }
    assert_eq!(sem.available().unwrap(), 1, "the permit was given back");
}

/// The `WAIT` after a grant's renewal was sized from the whole operation timeout,
/// while its read got only what the renewal left of the call: with a renewal that
/// took 120 ms, a 400 ms replica wait and a 500 ms operation timeout, the server's
/// answer came after the read gave up, every time (found by a review). The `WAIT` is
/// now sized from what is left when it is sent.
#[test]
fn a_replica_wait_after_a_slow_renewal_is_answered_not_timed_out() {
    const OP: Duration = Duration::from_millis(500);
    let (_server, proxy, client) = support::proxied(OP);
    let sem = client
        .semaphore_builder("slow")
        .limit(1)
        .wait_replicas(1, Duration::from_millis(400))
        .build()
        .unwrap();
    // once without delays: every script in the server's cache, the server's clock read
    assert!(matches!(
        sem.try_acquire(),
        Err(Error::ReplicasNotAcked { .. })
    ));
    proxy.delay_sent(b"EVALSHA", Duration::from_millis(120));
    for _ in 0..3 {
        match sem.try_acquire() {
            Err(Error::ReplicasNotAcked { acked: 0, .. }) => {}
            other => panic!("expected ReplicasNotAcked, got {other:?}"),
        }
    }
}

/// A timed acquire's confirmation runs within the wait's bound (its deadline and one
/// operation timeout), longer than the operation timeout its reads keep: a `WAIT`
/// sized from that bound got its whole timeout while the read gave up at the
/// operation timeout's, so "too few replicas" came as a retryable timeout (found by a
/// review). It is sized from what the read allows.
#[test]
fn a_timed_acquire_s_replica_wait_is_answered_not_timed_out() {
    const OP: Duration = Duration::from_millis(500);
    let (primary, replica) = primary_and_replica();
    // connected, and acknowledging nothing
    let _paused = replica.pause();
    let client = Client::builder()
        .operation_timeout(OP)
        .build(primary.url())
        .unwrap();
    let sem = client
        .semaphore_builder("timed")
        .limit(1)
        .wait_replicas(1, Duration::from_millis(450))
        .build()
        .unwrap();
    match sem.acquire_timeout(Duration::from_secs(10)) {
        Err(Error::ReplicasNotAcked { acked: 0, .. }) => {}
        other => panic!("expected ReplicasNotAcked, got {other:?}"),
    }
    let rs = client.redisson_semaphore("timed-rs");
    assert!(rs.try_set_permits(1).unwrap());
    let rs = rs.with_replica_wait(Duration::from_millis(450)).unwrap();
    match rs.try_acquire(1) {
        Err(Error::ReplicasNotAcked { .. } | Error::NoSyncedReplicas { .. }) => {}
        other => panic!("expected a replica error, got {other:?}"),
    }
}

#[test]
fn a_stalled_replica_fails_the_grant_and_a_recovered_one_confirms_it() {
    let (primary, replica) = primary_and_replica();
    let sem = sem(&primary, "stalled", 1, 1, 100);
    let paused = replica.pause();
    let stalled = sem.try_acquire();
    drop(paused);
    assert!(
        matches!(stalled, Err(Error::ReplicasNotAcked { acked: 0, .. })),
        "{stalled:?}"
    );
    assert_eq!(
        sem.available().unwrap(),
        1,
        "the unconfirmed permit was given back"
    );
    let p = sem.try_acquire().unwrap().expect("free again");
    assert!(holds(&replica, "stalled", p.id()));
}

#[test]
fn zero_replicas_is_off_and_bad_timeouts_are_refused() {
    let primary = RedisServer::start();
    let sem = sem(&primary, "off", 1, 0, 0);
    assert!(sem.try_acquire().unwrap().is_some(), "no replica needed");

    let client = Client::builder()
        .operation_timeout(Duration::from_millis(500))
        .build(primary.url())
        .unwrap();
    for timeout in [
        Duration::ZERO,
        Duration::from_millis(500),
        Duration::from_secs(5),
    ] {
        let built = client
            .semaphore_builder("bad")
            .limit(1)
            .wait_replicas(1, timeout)
            .build();
        match built {
            Err(Error::InvalidArgument(msg)) => assert!(msg.contains("wait_replicas"), "{msg}"),
            other => panic!("expected InvalidArgument for {timeout:?}, got {other:?}"),
        }
    }
}

/// Failover audit (2026-11-26): with `min-replicas-to-write` (docs/deployment.md
/// recommends it to bound the failover window), a primary whose replicas are gone
/// refuses writes with `NOREPLICAS`, as the old primary does during a failover. A
/// blocked acquire rides through an outage, but `NOREPLICAS` did not count as one:
/// the waiter failed at its first look in that window. It now rides through it and
/// is served once the primary takes writes again.
#[test]
fn a_blocked_acquire_rides_through_a_primary_refusing_writes_for_want_of_replicas() {
    let (primary, mut replica) = primary_and_replica();
    let mut admin = primary.conn();
    // a lag of 2 s: a replica that acknowledges every second never looks lagging, one
    // that stopped does within a few seconds
    for (k, v) in [
        ("min-replicas-to-write", "1"),
        ("min-replicas-max-lag", "2"),
    ] {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg(k)
            .arg(v)
            .exec(&mut admin)
            .unwrap();
    }
    let writes = |admin: &mut redis::Connection| {
        redis::cmd("SET")
            .arg("probe")
            .arg(1)
            .exec(admin)
            .map_err(|e| e.code().map(str::to_owned))
    };
    // the replica counts as good once it has acknowledged under the new settings
    wait_until(Duration::from_secs(10), "the primary taking writes", || {
        writes(&mut admin).is_ok()
    });
    let holder = sem(&primary, "norep", 1, 0, 0);
    let held = holder.acquire().unwrap();
    let client = Client::open(primary.url()).unwrap();
    let waiting = client.semaphore_builder("norep").limit(1).build().unwrap();
    // (long enough for the whole outage: the wait must end by being served)
    let waiter = support::queued_waiter(&waiting, Duration::from_secs(30));
    let errors = client.stats().errors;
    replica.stop();
    wait_until(
        Duration::from_secs(10),
        "the primary refusing writes",
        || writes(&mut admin) == Err(Some("NOREPLICAS".into())),
    );
    wait_until(
        Duration::from_secs(10),
        "a look of the waiter failed",
        || client.stats().errors > errors,
    );
    replica.restart();
    wait_until(Duration::from_secs(10), "the primary taking writes", || {
        writes(&mut admin).is_ok()
    });
    assert!(
        !waiter.is_finished(),
        "the wait ended: {:?}",
        waiter.join().unwrap().0
    );
    drop(held);
    let (got, _) = waiter.join().unwrap();
    assert!(matches!(got, Ok(Some(_))), "the waiter: {got:?}");
}

/// Fifth session (audit of the Redisson layouts' finding on the leased semaphore): a
/// try's grant that too few replicas acknowledged is given back; when that give-back
/// failed it used to be only logged, the permit held on the primary for the rest of
/// its lease. It is now owed to the background thread, like the give-back of a timed
/// acquire, and sent again until it succeeds.
#[test]
fn a_try_s_failed_give_back_of_an_unacknowledged_grant_is_sent_again() {
    let (primary, replica, proxy, client) = support::proxied_primary();
    let sem = client
        .semaphore_builder("unacked")
        .limit(1)
        .lease(Duration::from_secs(120))
        .wait_replicas(1, Duration::from_millis(200))
        .build()
        .unwrap();
    // the holders' ids on the primary (the zset's '~' sentinel left out)
    let held = || {
        let ids: Vec<String> = redis::cmd("ZRANGE")
            .arg("redsem:{unacked}:h")
            .arg(0)
            .arg(-1)
            .query(&mut primary.conn())
            .unwrap();
        ids.iter().filter(|id| *id != "~").count()
    };
    {
        let _stalled = replica.pause();
        // the give-back's release vanishes on its way
        proxy.cut_when_sent(release_script().get_hash().as_bytes());
        match sem.try_acquire() {
            Err(Error::ReplicasNotAcked { acked: 0, .. }) => {}
            other => panic!("expected ReplicasNotAcked, got {other:?}"),
        }
        assert_eq!(held(), 1, "the give-back was cut");
        proxy.heal();
    }
    wait_until(
        Duration::from_secs(10),
        "the grant is given back in the background, long before its lease ends",
        || held() == 0,
    );
    assert!(sem.try_acquire().unwrap().is_some());
}

/// Review (eighth session): `wait_replicas(u32::MAX, timeout)` was accepted, and no
/// grant could ever be handed out: every acquire took a permit, asked `WAIT` for more
/// replicas than any primary has (Redis reads a count from 2^31 on as a negative
/// `int` and answers at once), gave the permit back and failed with
/// `ReplicasNotAcked`. A count above `MAX_WAIT_REPLICAS` is now refused when the
/// semaphore is built, naming the value; the bound itself is accepted.
#[test]
fn a_replica_count_no_primary_can_meet_is_refused_at_build() {
    let (primary, _replica) = primary_and_replica();
    let client = Client::open(primary.url()).unwrap();
    let build = |n: u32| {
        client
            .semaphore_builder("many-replicas")
            .limit(1)
            // (long enough for the one replica to acknowledge under load)
            .wait_replicas(n, Duration::from_millis(1_000))
            .build()
    };
    for n in [redis_semaphore::MAX_WAIT_REPLICAS + 1, 1 << 31, u32::MAX] {
        match build(n) {
            Err(Error::InvalidArgument(m)) => {
                assert!(m.contains("wait_replicas"), "{m}");
                assert!(m.contains(&n.to_string()), "{m}");
                assert!(
                    m.contains(&redis_semaphore::MAX_WAIT_REPLICAS.to_string()),
                    "{m}"
                );
            }
            Err(e) => panic!("{n}: expected InvalidArgument, got {e:?}"),
            Ok(sem) => panic!("{n}: built; a try gives {:?}", sem.try_acquire()),
        }
    }
    // the bound is accepted (and, with one replica, refused per grant as before)
    let sem = build(redis_semaphore::MAX_WAIT_REPLICAS).unwrap();
    match sem.try_acquire() {
        Err(Error::ReplicasNotAcked { wanted, .. }) => {
            assert_eq!(wanted, redis_semaphore::MAX_WAIT_REPLICAS)
        }
        other => panic!("expected ReplicasNotAcked, got {other:?}"),
    }
    let granted = build(1).unwrap().try_acquire();
    assert!(matches!(granted, Ok(Some(_))), "{granted:?}");
}
