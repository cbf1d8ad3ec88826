//! `SemaphoreBuilder::wait_replicas`: a grant is handed out only once enough replicas
//! have it, on every path that yields a permit (a try, a first try of a blocking
//! acquire, a grant pushed to a queued waiter by someone else's release); otherwise
//! the permit is given back and the call fails with `Error::ReplicasNotAcked`; and a
//! renewal (the background thread's, `Permit::refresh`) counts on the client only once
//! enough replicas have it.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use redis_semaphore::{Client, Error, LostReason, Semaphore};
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

/// The deadline (server milliseconds) `server` holds for permit `id` of semaphore
/// `name`, if it holds the permit.
fn deadline_on(server: &RedisServer, name: &str, id: &str) -> Option<i64> {
    let score: Option<f64> = redis::cmd("ZSCORE")
        .arg(format!("redsem:{{{name}}}:h"))
        .arg(id)
        .query(&mut server.conn())
        .unwrap();
    score.map(|s| s as i64)
}

/// `server`'s clock, in milliseconds.
fn server_ms(server: &RedisServer) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(&mut server.conn()).unwrap();
    s * 1000 + us / 1000
}

/// A semaphore of `name` with a short lease, renewed in the background, whose grants
/// and renewals wait for one replica.
fn short_lease(server: &RedisServer, name: &str, lease: Duration) -> Semaphore {
    Client::open(server.url())
        .unwrap()
        .semaphore_builder(name)
        .limit(1)
        .lease(lease)
        // (generous: a replica that acknowledges does so at once, also under load)
        .wait_replicas(1, Duration::from_millis(500))
        .build()
        .unwrap()
}

/// Eighth session (failover): a renewal of a permit of a semaphore with
/// `wait_replicas` counted on the client as soon as the primary answered it, whether
/// or not a replica had it. With the replica no longer acknowledging, the primary
/// renewed the permit at every tick and the client went on believing in it for as
/// long as it liked, while a failover would promote a replica on which the lease
/// ended a lease after the replica stopped, and the slot could be granted to another
/// client there. A renewal now counts on the client only once the replicas
/// acknowledged it (`WAIT` after the refresh call, on its connection): the permit is
/// declared lost within a lease of the stop, although the primary still renews it.
#[test]
fn a_renewal_no_replica_acknowledged_does_not_count_and_the_permit_is_lost_within_a_lease() {
    const LEASE: Duration = Duration::from_millis(1_500);
    let (primary, replica) = primary_and_replica();
    let sem = short_lease(&primary, "renew-unacked", LEASE);
    let p = sem.try_acquire().unwrap().expect("a free permit");
    let id = p.id().to_owned();
    // connected, and acknowledging nothing from now on
    let paused = replica.pause();
    let stopped = Instant::now();
    let stop_ms = server_ms(&primary);
    let lost = p.lost().recv_timeout(4 * LEASE);
    let waited = stopped.elapsed();
    let on_primary = deadline_on(&primary, "renew-unacked", &id);
    drop(paused);
    assert_eq!(
        lost,
        Ok(LostReason::Expired),
        "the permit is still valid {waited:?} after the replica stopped acknowledging \
         (lease {LEASE:?}); lease_left {:?}",
        p.lease_left()
    );
    assert!(p.is_lost() && p.lease_left().is_zero());
    assert!(
        waited <= LEASE + Duration::from_millis(1_500),
        "declared lost {waited:?} after the replica stopped (lease {LEASE:?})"
    );
    // the primary went on renewing it after the stop: only the client let it go
    let on_primary = on_primary.expect("the primary still holds the permit");
    assert!(
        on_primary > stop_ms + LEASE.as_millis() as i64,
        "no renewal reached the primary after the stop: its deadline {on_primary}, the \
         stop at {stop_ms}"
    );
}

/// A renewal too few replicas acknowledged still says which permits are gone: those
/// are declared lost at once (`Released`), not when their deadline passes, and the
/// others of the same call stay valid until theirs.
#[test]
fn an_unacknowledged_renewal_still_declares_the_permits_it_found_gone() {
    let (primary, replica) = primary_and_replica();
    let sem = Client::open(primary.url())
        .unwrap()
        .semaphore_builder("renew-gone")
        .limit(2)
        .lease(Duration::from_secs(20))
        .refresh_interval(Duration::from_millis(300))
        .wait_replicas(1, Duration::from_millis(300))
        .build()
        .unwrap();
    let gone = sem.try_acquire().unwrap().expect("a free permit");
    let kept = sem.try_acquire().unwrap().expect("a second free permit");
    let paused = replica.pause();
    // an operator's release, by another client: only a renewal can tell this one
    let operator = Client::open(primary.url())
        .unwrap()
        .semaphore_builder("renew-gone")
        .limit(2)
        .build()
        .unwrap();
    assert!(operator.force_release(gone.id()).unwrap());
    let lost = gone.lost().recv_timeout(Duration::from_secs(10));
    let kept_valid = !kept.is_lost() && !kept.lease_left().is_zero();
    drop(paused);
    assert_eq!(lost, Ok(LostReason::Released));
    assert!(
        kept_valid,
        "the other permit of the call: {:?}",
        kept.lost().try_recv()
    );
}

/// The other side of `a_renewal_no_replica_acknowledged_does_not_count_...`: with the replica acknowledging, renewals count
/// and a permit of a short lease stays valid for many leases.
#[test]
fn with_the_replica_acknowledging_renewals_a_permit_stays_valid_for_many_leases() {
    const LEASE: Duration = Duration::from_millis(1_500);
    let (primary, replica) = primary_and_replica();
    let sem = short_lease(&primary, "renew-acked", LEASE);
    let p = sem.try_acquire().unwrap().expect("a free permit");
    let granted_ms = server_ms(&primary);
    let start = Instant::now();
    while start.elapsed() < 6 * LEASE {
        assert!(
            !p.is_lost() && !p.lease_left().is_zero(),
            "lost after {:?}: {:?}",
            start.elapsed(),
            p.lost().try_recv()
        );
        // (letting time pass: the leases run)
        thread::sleep(Duration::from_millis(100));
    }
    assert!(!p.is_lost());
    // the replica has the renewals, not only the grant
    let on_replica = deadline_on(&replica, "renew-acked", p.id()).expect("on the replica");
    assert!(
        on_replica > granted_ms + 5 * LEASE.as_millis() as i64,
        "the replica's deadline {on_replica}, granted at {granted_ms}"
    );
    p.release().unwrap();
}

/// `Permit::refresh` of a permit of a semaphore with `wait_replicas`: a renewal no
/// replica acknowledged fails with `ReplicasNotAcked` and leaves the permit's
/// deadline where it was (the primary renewed it; a failover may not keep that); once
/// the replica acknowledges again, a refresh moves the deadline to a full lease.
#[test]
fn a_manual_refresh_no_replica_acknowledged_fails_and_moves_no_deadline() {
    const LEASE: Duration = Duration::from_secs(20);
    let (primary, replica) = primary_and_replica();
    let sem = Client::open(primary.url())
        .unwrap()
        .semaphore_builder("refresh-unacked")
        .limit(1)
        .lease(LEASE)
        .auto_refresh(false)
        .wait_replicas(1, Duration::from_millis(300))
        .build()
        .unwrap();
    let p = sem.try_acquire().unwrap().expect("a free permit");
    p.refresh().unwrap();
    let before_ms = deadline_on(&primary, "refresh-unacked", p.id()).unwrap();
    let paused = replica.pause();
    // (letting time pass, so that a renewal would move the deadline measurably)
    thread::sleep(Duration::from_millis(300));
    let left = p.lease_left();
    let refreshed = p.refresh();
    let left_after = p.lease_left();
    let on_primary = deadline_on(&primary, "refresh-unacked", p.id()).unwrap();
    drop(paused);
    match refreshed {
        Err(Error::ReplicasNotAcked {
            ref name,
            acked: 0,
            wanted: 1,
        }) if name == "refresh-unacked" => {}
        other => panic!("expected ReplicasNotAcked, got {other:?}"),
    }
    let msg = refreshed.unwrap_err().to_string();
    assert!(
        msg.contains("0 of 1 replica") && msg.contains("renewal"),
        "{msg}"
    );
    assert!(
        left_after <= left,
        "the unacknowledged renewal moved the deadline: {left:?} left before, \
         {left_after:?} after"
    );
    assert!(!p.is_lost(), "still held");
    assert!(
        on_primary > before_ms,
        "the primary renewed it ({before_ms} -> {on_primary})"
    );
    // acknowledged again: the renewal counts
    p.refresh().unwrap();
    assert!(
        p.lease_left() > left_after + Duration::from_millis(200),
        "{:?} left after an acknowledged refresh, {left_after:?} before",
        p.lease_left()
    );
    p.release().unwrap();
}
