//! `compat::redisson` with Redisson's replica wait (`with_replica_wait`): after each
//! write, `WAIT` for the primary's connected replicas, on a primary and a real replica
//! started by the test. A write that returns is on the replica; with the replica
//! stalled, an acquire gives its permits back and fails, another write fails and stands.

mod support;

use std::time::Duration;

use redis_semaphore::compat::redisson::{RPermitExpirableSemaphore, RSemaphore};
use redis_semaphore::{Client, Error};
use support::{Proxy, RedisServer, Stream, command_calls, primary_and_replica, wait_until};

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

/// The SHA1 of a Redisson script as the library sends it (src/scripts/redisson.rs):
/// what `EVALSHA` carries, for a proxy to act on that call alone.
macro_rules! redisson_sha {
    ($($part:literal),*) => {
        redis::Script::new(concat!(
            include_str!("../src/scripts/redisson_publish.lua"),
            include_str!("../src/scripts/redisson_counter.lua"),
            $(include_str!(concat!("../src/scripts/", $part)),)*
        ))
        .get_hash()
        .to_owned()
    };
}

/// Fifth session: the give-back of permits no replica acknowledged, when it fails (here
/// its request vanishes on the way to the primary), used to be forgotten: the caller
/// got `NoSyncedReplicas` and the permits stayed taken, an `RSemaphore`'s for good, an
/// expirable permit without a lease until released by an id nobody has. It is now owed
/// to the client's background thread, which gives them back once the primary answers.
#[test]
fn a_failed_give_back_of_unacknowledged_permits_is_sent_again_in_the_background() {
    let (primary, replica, proxy, client) = support::proxied_primary();
    // the expirable semaphore's client through a proxy of its own (the cut of one
    // leaves the other's pooled connections whole)
    let pes_proxy = Proxy::start(primary.port());
    let pes_client = Client::builder()
        .operation_timeout(Duration::from_secs(1))
        .build(pes_proxy.url())
        .unwrap();
    let wait = Duration::from_millis(200);
    let rs = client
        .redisson_semaphore("rs")
        .with_replica_wait(wait)
        .unwrap();
    let pes = pes_client
        .redisson_permit_expirable_semaphore("pes")
        .with_replica_wait(wait)
        .unwrap();
    assert!(rs.try_set_permits(2).unwrap());
    assert!(pes.try_set_permits(2).unwrap());
    let rs_release = redisson_sha!("once.lua", "redisson_rs_release.lua");
    let pes_release = redisson_sha!(
        "redisson_pes_common.lua",
        "once.lua",
        "redisson_pes_release.lua"
    );
    {
        let _stalled = replica.pause();
        // the give-back's request, the first that carries the release script, vanishes
        proxy.cut_when_sent(rs_release.as_bytes());
        match rs.try_acquire(1) {
            Err(Error::NoSyncedReplicas { operation, .. }) => assert_eq!(operation, "acquire"),
            other => panic!("expected NoSyncedReplicas, got {other:?}"),
        }
        assert_eq!(counter(&primary, "rs"), Some(1), "the give-back was cut");
        proxy.heal();

        pes_proxy.cut_when_sent(pes_release.as_bytes());
        match pes.try_acquire(None) {
            Err(Error::NoSyncedReplicas { operation, .. }) => assert_eq!(operation, "acquire"),
            other => panic!("expected NoSyncedReplicas, got {other:?}"),
        }
        assert_eq!(leases(&primary, "pes"), 1, "the give-back was cut");
        pes_proxy.heal();
    }
    wait_until(
        Duration::from_secs(10),
        "the RSemaphore permit is given back in the background",
        || counter(&primary, "rs") == Some(2),
    );
    wait_until(
        Duration::from_secs(10),
        "the expirable permit is given back in the background",
        || leases(&primary, "pes") == 0 && counter(&primary, "pes") == Some(2),
    );
    // given back once, not more
    drop((client, pes_client));
    assert_eq!(counter(&primary, "rs"), Some(2));
    assert_eq!(counter(&primary, "pes"), Some(2));
}

/// Fifth session: an `RSemaphore` give-back has no id, and a send of it whose reply is
/// lost may have run: sent again as such, each run would add the permits once more
/// (more permits than the limit later). Here every send reaches the primary only after
/// the client gave up on it (held 1.5 s on the way, the operation timeout is 1 s), so
/// every send runs: the counter must come back to where it was and go no higher.
#[test]
fn an_rsemaphore_give_back_sent_again_after_a_lost_reply_is_applied_once() {
    let (primary, replica, proxy, client) = support::proxied_primary();
    let rs = client
        .redisson_semaphore("rs")
        .with_replica_wait(Duration::from_millis(200))
        .unwrap();
    assert!(rs.try_set_permits(2).unwrap());
    // both scripts loaded, so that every call below is one EVALSHA
    assert!(rs.try_acquire(1).unwrap());
    assert_eq!(rs.release(1).unwrap(), 2);
    let rs_release = redisson_sha!("once.lua", "redisson_rs_release.lua");
    let evalsha = || {
        command_calls(&mut primary.conn())
            .get("evalsha")
            .copied()
            .unwrap_or(0)
    };
    let before = evalsha();
    {
        let _stalled = replica.pause();
        proxy.delay_sent(rs_release.as_bytes(), Duration::from_millis(1500));
        match rs.try_acquire(1) {
            Err(Error::NoSyncedReplicas { .. }) => {}
            other => panic!("expected NoSyncedReplicas, got {other:?}"),
        }
        // the acquire and three runs of the give-back (the first and two resent)
        wait_until(
            Duration::from_secs(20),
            "the give-back runs three times",
            || evalsha() >= before + 4,
        );
        assert_eq!(
            counter(&primary, "rs"),
            Some(2),
            "a resent give-back that had run already was applied again"
        );
        proxy.delay_sent(rs_release.as_bytes(), Duration::ZERO);
    }
    drop(client);
    assert_eq!(counter(&primary, "rs"), Some(2));
}

/// Sixth session: the operation key of an owed `RSemaphore` give-back was kept a fixed
/// time after the run that applied it (twenty minutes), so a send held up longer than
/// that (in a paused server, say) ran after the key had gone and gave the permits back
/// a second time: the counter above the limit. Every send now carries a deadline in
/// the server's clock, fixed before the first send: a run after it is refused before
/// it writes, and the key lives until the deadline. Here: the give-back's key lives
/// until its deadline (about eleven minutes, not a fixed time from the run), and a run
/// of the same call after its deadline (sent by hand: the server's clock cannot be
/// moved on here) changes nothing, with or without the key.
#[test]
fn an_rsemaphore_give_back_run_after_its_deadline_changes_nothing() {
    let (primary, replica, proxy, client) = support::proxied_primary();
    let rs = client
        .redisson_semaphore("rs")
        .with_replica_wait(Duration::from_millis(200))
        .unwrap();
    assert!(rs.try_set_permits(2).unwrap());
    let rs_release = redisson_sha!("once.lua", "redisson_rs_release.lua");
    {
        let _stalled = replica.pause();
        proxy.cut_when_sent(rs_release.as_bytes());
        match rs.try_acquire(1) {
            Err(Error::NoSyncedReplicas { .. }) => {}
            other => panic!("expected NoSyncedReplicas, got {other:?}"),
        }
        proxy.heal();
    }
    wait_until(
        Duration::from_secs(10),
        "the RSemaphore permit is given back in the background",
        || counter(&primary, "rs") == Some(2),
    );
    let mut conn = primary.conn();
    // (the calls of the set-up and the try carry short-lived keys of their own: about
    // 15 s; the give-back's lives about eleven minutes)
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("{rs}:redsem-op:*")
        .query::<Vec<String>>(&mut conn)
        .unwrap()
        .into_iter()
        .filter(|k| redis::cmd("PTTL").arg(k).query::<i64>(&mut conn).unwrap() > 60_000)
        .collect();
    assert_eq!(keys.len(), 1, "one operation key for every send: {keys:?}");
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut conn).unwrap();
    let now_ms = secs * 1000 + micros / 1000;
    let expires_at: i64 = redis::cmd("PEXPIRETIME")
        .arg(&keys[0])
        .query(&mut conn)
        .unwrap_or(-3);
    if expires_at != -3 {
        // Redis 7: the key's expiry is its deadline and a second, eleven minutes on
        let ahead = expires_at - now_ms;
        assert!(
            (600_000..=661_000).contains(&ahead),
            "the key expires {ahead} ms from now"
        );
    }
    let pttl: i64 = redis::cmd("PTTL").arg(&keys[0]).query(&mut conn).unwrap();
    assert!((600_000..=661_000).contains(&pttl), "PTTL {pttl}");

    // runs of the give-back after their deadline: with the applied call's key (the
    // first run's reply, nothing changed), and with a fresh key (a first send held
    // until after its deadline: refused, nothing written)
    let late_run = |key: &str| -> redis::RedisResult<Vec<i64>> {
        redis::cmd("EVALSHA")
            .arg(&rs_release)
            .arg(3)
            .arg("rs")
            .arg("redisson_sc:{rs}")
            .arg(key)
            .arg("PUBLISH")
            .arg(1)
            .arg(0)
            .arg(format!("@{}", now_ms - 1))
            .query(&mut primary.conn())
    };
    assert_eq!(
        late_run(&keys[0]).unwrap(),
        vec![1, 2],
        "the first run's reply"
    );
    assert_eq!(
        counter(&primary, "rs"),
        Some(2),
        "a late run changed the count"
    );
    let fresh = "{rs}:redsem-op:00000000-0000-4000-8000-000000000000".to_owned();
    let e = late_run(&fresh).expect_err("a run after its deadline is refused");
    assert!(
        e.to_string().contains("arrived after its deadline"),
        "unexpected error: {e}"
    );
    assert_eq!(
        counter(&primary, "rs"),
        Some(2),
        "a late run changed the count"
    );
    let exists: i64 = redis::cmd("EXISTS").arg(&fresh).query(&mut conn).unwrap();
    assert_eq!(exists, 0, "a refused run wrote its key");
    // the same call before its deadline still finds the key and changes nothing
    let deadline = now_ms + 600_000;
    let again: Vec<i64> = redis::cmd("EVALSHA")
        .arg(&rs_release)
        .arg(3)
        .arg("rs")
        .arg("redisson_sc:{rs}")
        .arg(&keys[0])
        .arg("PUBLISH")
        .arg(1)
        .arg(0)
        .arg(format!("@{deadline}"))
        .query(&mut conn)
        .unwrap();
    assert_eq!(again, vec![1, 2], "the first run's reply");
    assert_eq!(counter(&primary, "rs"), Some(2));
    drop(client);
    assert_eq!(counter(&primary, "rs"), Some(2));
}

/// Sixth session (review of failovers): the number of replicas a handle waits for was
/// read again only when `WAIT`'s answer differed from it. Once a write found the
/// primary without replicas (a replica restarting, a failover's new primary before its
/// replicas reattach), every later write sent `WAIT 0`, which answers 0 at once, equal
/// to the number remembered: the count was never read again, and writes were no longer
/// confirmed by any replica for the rest of the handle's life. A handle that knows of
/// no replica now reads their number again at each write.
#[test]
fn a_replica_back_after_a_write_without_one_is_waited_for_again() {
    let (primary, replica) = primary_and_replica();
    let client = Client::open(primary.url()).unwrap();
    let rs = rs_waiting(&client, "back");
    assert!(rs.try_set_permits(3).unwrap());
    let mut rc = replica.conn();
    let replicas = |server: &RedisServer| -> String {
        redis::cmd("INFO")
            .arg("replication")
            .query(&mut server.conn())
            .unwrap()
    };
    // the replica detached: a write finds the primary without one
    redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .exec(&mut rc)
        .unwrap();
    support::wait_until(
        Duration::from_secs(10),
        "the primary without replica",
        || replicas(&primary).contains("connected_slaves:0"),
    );
    assert!(rs.try_acquire(1).unwrap());
    // back again, in sync
    redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port())
        .exec(&mut rc)
        .unwrap();
    support::wait_until(Duration::from_secs(10), "the replica back in sync", || {
        replicas(&replica).contains("master_link_status:up")
            && replicas(&primary).contains("connected_slaves:1")
    });
    // an acquire the replica cannot acknowledge is not confirmed: its permits are
    // given back
    let _stalled = replica.pause();
    match rs.try_acquire(1) {
        Err(Error::ReplicasNotAcked { wanted: 1, .. }) => {}
        other => panic!("an acquire no replica acknowledged: {other:?}"),
    }
    assert_eq!(counter(&primary, "back"), Some(2));
}

/// Ninth session (review): an acquire whose first send ran but whose reply was lost
/// with its connection (a reset) is sent again on a fresh connection, and that second
/// run finds the first one's work (`RSemaphore`: its operation key's record; the
/// expirable semaphore: its ids held) and writes nothing. The replica wait then ran
/// `WAIT` on a connection that had written nothing: a server that moves a
/// connection's `WAIT` offset only when it writes (Redis's current source, its
/// `call()`; 7.0.15 moves it at every command) counts every connected replica at once, one
/// that lacks the grant too, and the acquire returned permits no replica had (a
/// failover then hands them out again). A send after the first now writes a marker (a
/// short-lived key of the layout's slot) before its `WAIT`: replication is one
/// ordered stream, so a replica that acknowledges the marker has the first run's
/// writes. Checked here: after the first run's writes, the resent call's connection
/// writes again, before the call returns.
fn acquire_resent_after_a_lost_reply_writes_before_its_wait(pes: bool) {
    let (primary, replica, proxy, client) = support::proxied_primary();
    let name = if pes { "pes-resent" } else { "rs-resent" };
    let rs = rs_waiting(&client, name);
    let expirable = pes_waiting(&client, name);
    // (the scripts loaded, the node's clock read, a connection in the pool: the
    // acquire below is one EVALSHA)
    if pes {
        assert!(expirable.try_set_permits(2).unwrap());
        drop(expirable.try_acquire(None).unwrap().expect("a free permit"));
    } else {
        assert!(rs.try_set_permits(2).unwrap());
        assert!(rs.try_acquire(1).unwrap());
        assert_eq!(rs.release(1).unwrap(), 2);
    }
    let mut stream = Stream::of(&replica);
    let before = client.stats().resent;
    proxy.delay_replies(Duration::from_millis(500));
    let trying = std::thread::spawn(move || {
        if pes {
            expirable
                .try_acquire(Some(Duration::from_secs(30)))
                .map(|p| p.map(|p| p.id().to_owned()))
        } else {
            rs.try_acquire(1).map(|_| None)
        }
    });
    // the acquire ran on the primary; its reply is lost with the connection
    wait_until(Duration::from_secs(5), "the acquire on the primary", || {
        counter(&primary, name) == Some(1)
    });
    wait_until(Duration::from_secs(5), "its reply held", || {
        proxy.held_replies() >= 1
    });
    proxy.delay_replies(Duration::ZERO);
    proxy.reset();
    let outcome = trying.join().unwrap();
    assert!(outcome.is_ok(), "the acquire sent again: {outcome:?}");
    assert!(
        client.stats().resent > before,
        "the acquire was not sent again"
    );
    // the first run's DECRBY (and, for `RSemaphore`, its operation key's record),
    // then a write of the connection that sent it again
    let ours = if pes { 1 } else { 2 };
    stream.lines_until("the acquire and a write after it", |lines| {
        lines
            .iter()
            .position(|l| l.contains("\"DECRBY\""))
            .is_some_and(|at| {
                lines[at..]
                    .iter()
                    .filter(|l| l.contains("redsem-op"))
                    .count()
                    >= ours
            })
    });
}

#[test]
fn an_rsemaphore_acquire_sent_again_writes_before_its_replica_wait() {
    acquire_resent_after_a_lost_reply_writes_before_its_wait(false);
}

#[test]
fn an_expirable_acquire_sent_again_writes_before_its_replica_wait() {
    acquire_resent_after_a_lost_reply_writes_before_its_wait(true);
}
