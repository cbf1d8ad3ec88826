//! `compat::redisson` with Redisson's replica wait (`with_replica_wait`): after each
//! write, `WAIT` for the primary's connected replicas, on a primary and a real replica
//! started by the test. A write that returns is on the replica; with the replica
//! stalled, an acquire gives its permits back and fails, another write fails and stands.

mod support;

use std::time::Duration;

use redis_semaphore::compat::redisson::{RPermitExpirableSemaphore, RSemaphore};
use redis_semaphore::{Client, Error};
use support::{RedisServer, primary_and_replica};

const WAIT: Duration = Duration::from_millis(500);

/// The counter `name` as `server` has it, read directly (no WAIT).
/// An `RSemaphore` whose writes wait for one replica ([`WAIT`]).
fn rs_waiting(client: &Client, name: &str) -> RSemaphore {
    client
        .redisson_semaphore(name)
        .with_replica_wait(WAIT)
        .unwrap()
}

/// An `RPermitExpirableSemaphore` whose writes wait for one replica ([`WAIT`]).
fn pes_waiting(client: &Client, name: &str) -> RPermitExpirableSemaphore {
    client
        .redisson_permit_expirable_semaphore(name)
        .with_replica_wait(WAIT)
        .unwrap()
}

fn counter(server: &RedisServer, name: &str) -> Option<i64> {
    redis::cmd("GET")
        .arg(name)
        .query(&mut server.conn())
        .unwrap()
}

fn leases(server: &RedisServer, name: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(format!("{{{name}}}:timeout"))
        .query(&mut server.conn())
        .unwrap()
}

#[test]
fn every_write_is_on_the_replica_when_the_call_returns() {
    let (primary, replica) = primary_and_replica();
    let client = Client::open(primary.url()).unwrap();

    let rs = rs_waiting(&client, "rs");
    assert!(rs.try_set_permits(3).unwrap());
    assert_eq!(counter(&replica, "rs"), Some(3));
    assert!(rs.try_acquire(2).unwrap());
    assert_eq!(counter(&replica, "rs"), Some(1));
    assert_eq!(rs.release(1).unwrap(), 2);
    assert_eq!(counter(&replica, "rs"), Some(2));
    assert_eq!(rs.add_permits(5).unwrap(), 7);
    assert_eq!(counter(&replica, "rs"), Some(7));
    assert_eq!(rs.drain_permits().unwrap(), 7);
    assert_eq!(counter(&replica, "rs"), Some(0));

    let pes = pes_waiting(&client, "pes");
    assert!(pes.try_set_permits(2).unwrap());
    assert_eq!(counter(&replica, "pes"), Some(2));
    let p = pes
        .try_acquire(Some(Duration::from_secs(30)))
        .unwrap()
        .expect("a free permit");
    assert_eq!(leases(&replica, "pes"), 1);
    assert_eq!(counter(&replica, "pes"), Some(1));
    assert!(
        pes.update_lease_time(p.id(), Some(Duration::from_secs(60)))
            .unwrap()
    );
    p.refresh().unwrap();
    p.release().unwrap();
    assert_eq!(leases(&replica, "pes"), 0);
    assert_eq!(counter(&replica, "pes"), Some(2));
    let blocking = pes
        .acquire_timeout(Duration::from_secs(1), None)
        .unwrap()
        .expect("a free permit");
    assert_eq!(leases(&replica, "pes"), 1);
    drop(blocking);
    assert_eq!(leases(&replica, "pes"), 0);
}

#[test]
fn with_a_stalled_replica_acquires_give_their_permits_back_and_writes_fail() {
    let (primary, replica) = primary_and_replica();
    let client = Client::open(primary.url()).unwrap();
    let rs = rs_waiting(&client, "rs");
    let pes = pes_waiting(&client, "pes");
    assert!(rs.try_set_permits(2).unwrap());
    assert!(pes.try_set_permits(2).unwrap());

    {
        let _stalled = replica.pause();
        match rs.try_acquire(1) {
            Err(Error::ReplicasNotAcked {
                name,
                acked,
                wanted,
            }) => assert_eq!((name.as_str(), acked, wanted), ("rs", 0, 1)),
            other => panic!("expected ReplicasNotAcked, got {other:?}"),
        }
        assert_eq!(counter(&primary, "rs"), Some(2), "permits not given back");
        match pes.try_acquire(Some(Duration::from_secs(30))) {
            Err(Error::ReplicasNotAcked { acked: 0, .. }) => {}
            other => panic!("expected ReplicasNotAcked, got {other:?}"),
        }
        assert_eq!(leases(&primary, "pes"), 0, "the permit was not given back");
        assert_eq!(counter(&primary, "pes"), Some(2));
        // Another write fails, and stands on the primary (as in Redisson).
        match rs.release(1) {
            Err(Error::NoSyncedReplicas {
                name,
                operation,
                connected,
            }) => assert_eq!((name.as_str(), operation, connected), ("rs", "release", 1)),
            other => panic!("expected NoSyncedReplicas, got {other:?}"),
        }
        assert_eq!(counter(&primary, "rs"), Some(3));
    }

    // The replica is back: the writes go through and reach it.
    assert!(rs.try_acquire(1).unwrap());
    assert_eq!(counter(&replica, "rs"), Some(2));
    let p = pes.try_acquire(None).unwrap().expect("a free permit");
    assert_eq!(leases(&replica, "pes"), 1);
    p.release().unwrap();
}

#[test]
fn without_replicas_it_costs_a_wait_0_and_bad_timeouts_are_refused() {
    let primary = RedisServer::start();
    let client = Client::open(primary.url()).unwrap();
    let rs = rs_waiting(&client, "alone");
    assert!(rs.try_set_permits(1).unwrap());
    assert!(rs.try_acquire(1).unwrap());
    assert_eq!(rs.release(1).unwrap(), 1);
    let pes = pes_waiting(&client, "alone-pes");
    assert!(pes.try_set_permits(1).unwrap());
    pes.try_acquire(None).unwrap().unwrap().release().unwrap();

    for bad in [Duration::ZERO, Duration::from_secs(3600)] {
        let e = client
            .redisson_semaphore("x")
            .with_replica_wait(bad)
            .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        let e = client
            .redisson_permit_expirable_semaphore("x")
            .with_replica_wait(bad)
            .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    }
}
