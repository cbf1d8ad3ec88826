//! Review of the leased semaphore's permit lifecycle (seventh session): hand-overs
//! (`into_parts`/`adopt`), operator releases, releases whose outcome is unknown, and
//! `max_hold`. Each test failed before the change that fixed what it names.
//!
//! Real servers; the proxy's delays stand for a slow network (never a wait for a
//! condition); every wait for a condition has a deadline.

mod support;

use std::thread;
use std::time::Duration;

use redis_semaphore::{Client, Error, LostReason, Permit};
use support::{Proxy, RedisServer, wait_until};

fn client(url: &str) -> Client {
    Client::builder()
        .operation_timeout(Duration::from_millis(500))
        .build(url)
        .unwrap()
}

/// The server's deadline of permit `id` of semaphore `name`, if it is held.
fn score(conn: &mut redis::Connection, name: &str, id: &str) -> Option<i64> {
    redis::cmd("ZSCORE")
        .arg(format!("redsem:{{{name}}}:h"))
        .arg(id)
        .query(conn)
        .unwrap()
}

/// Whether `p` says it is valid, as the design defines it.
fn says_valid(p: &Permit) -> bool {
    !p.is_lost() && p.lease_left() > Duration::ZERO
}

/// `force_release` of this client marks the client's own `Permit`s of the grant lost
/// before its call is sent; an adoption of the same grant under way in the client (its
/// script already run, its reply not yet back) had no `Permit` registered yet, so it
/// was not told: it came back valid for a whole lease while the grant was gone on the
/// server, and another client took the slot of a semaphore of one (two holders that
/// said valid).
#[test]
fn a_force_release_racing_an_adoption_in_the_same_client_tells_the_adopted_permit() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let proxy = Proxy::start(server.port());
    let name = "force-vs-adopt";
    let giver = client(&server.url());
    let c = Client::builder()
        .operation_timeout(Duration::from_secs(5))
        .build(proxy.url())
        .unwrap();
    let sem = c
        .semaphore_builder(name)
        .limit(1)
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    // warm the proxied client's pool (two connections) and scripts (adopt, release)
    let warm = sem.try_acquire().unwrap().expect("a free permit");
    let warm = sem.adopt(warm.into_parts()).unwrap();
    thread::scope(|s| {
        s.spawn(|| sem.holders().unwrap());
        s.spawn(|| sem.holders().unwrap());
    });
    drop(warm);
    let parts = handed_over(&giver, name, Duration::from_secs(10));
    let id = parts.id().to_owned();
    let before = score(&mut conn, name, &id).expect("held");
    // the adoption's reply (and every reply through the proxy) is slow
    proxy.delay_replies(Duration::from_millis(1000));
    let adopter = {
        let sem = sem.clone();
        thread::spawn(move || sem.adopt(parts))
    };
    // the adoption ran on the server (its 30 s lease replaced the 10 s one)...
    wait_until(Duration::from_secs(10), "the adoption ran", || {
        score(&mut conn, name, &id).is_some_and(|s| s > before + 5_000)
    });
    // ... and its reply is on its way: the operator's release of the same client runs
    assert!(sem.force_release(&id).unwrap(), "the grant was held");
    proxy.delay_replies(Duration::ZERO);
    let adopted = adopter.join().unwrap();
    assert_eq!(score(&mut conn, name, &id), None, "force-released");
    let other = Client::open(server.url()).unwrap();
    let taken = other.semaphore(name, 1).unwrap().try_acquire().unwrap();
    assert!(taken.is_some(), "the slot is free on the server");
    match adopted {
        Err(Error::PermitLost { reason, .. }) => assert_eq!(reason, LostReason::Released),
        Ok(p) => {
            assert!(
                !says_valid(&p),
                "the adopted permit says valid ({:?} left) while another client holds \
                 the only permit",
                p.lease_left()
            );
            assert_eq!(p.lost_reason(), Some(LostReason::Released));
        }
        Err(e) => panic!("{e}"),
    }
}

/// A release whose reply timed out is owed to the background thread (sent again until
/// the lease has surely ended), but the grant was let go in the client at once: the
/// same parts adopted again in the client were renewed on the server, and then the
/// release (the late first send, or the owed one) freed the grant under the new
/// handle, which still said valid while another client took the slot.
#[test]
fn a_release_whose_outcome_is_unknown_keeps_its_grant_from_a_second_adoption() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let proxy = Proxy::start(server.port());
    let name = "release-vs-adopt";
    let giver = client(&server.url());
    let c = client(&proxy.url());
    let sem = c
        .semaphore_builder(name)
        .limit(1)
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    // warm the proxied client's pool and scripts (the release script is loaded)
    drop(sem.try_acquire().unwrap().expect("a free permit"));
    let parts = handed_over(&giver, name, Duration::from_secs(30));
    let id = parts.id().to_owned();
    let first = sem.adopt(parts.clone()).unwrap();
    // the releases are slow (longer than the operation timeout)
    let release_sha = support::release_script().get_hash().to_owned();
    proxy.delay_sent(release_sha.as_bytes(), Duration::from_secs(2));
    let released = first.release();
    assert!(
        matches!(&released, Err(e) if e.is_timeout() || e.is_retryable()),
        "{released:?}"
    );
    // the grant is still held on the server (the release is on its way)
    assert!(score(&mut conn, name, &id).is_some());
    let second = sem.adopt(parts.clone());
    proxy.delay_sent(b"-", Duration::ZERO);
    let second = match second {
        Err(Error::InvalidArgument(m)) => {
            assert!(m.contains(&id), "{m}");
            None
        }
        Err(Error::PermitLost { .. }) => None,
        Ok(p) => Some(p),
        Err(e) => panic!("{e}"),
    };
    // the release arrives
    wait_until(Duration::from_secs(10), "the release ran", || {
        score(&mut conn, name, &id).is_none()
    });
    let other = Client::open(server.url()).unwrap();
    let taken = other.semaphore(name, 1).unwrap().try_acquire().unwrap();
    assert!(taken.is_some(), "the slot is free on the server");
    if let Some(p) = second {
        assert!(
            !says_valid(&p),
            "adopted again while the release was on its way: it says valid ({:?} left) \
             while another client holds the only permit",
            p.lease_left()
        );
    }
    // once the background thread's release has run, the grant is let go in the
    // client: an adoption is sent, and hears that the grant is gone
    wait_until(Duration::from_secs(10), "the grant let go", || {
        match sem.adopt(parts.clone()) {
            Err(Error::InvalidArgument(_)) => false,
            Err(Error::PermitLost { reason, .. }) => reason == LostReason::Released,
            other => panic!("{other:?}"),
        }
    });
}

/// `max_hold`: "the keepalive renews it until `max_hold` after the grant and no more
/// ... Its lease then runs out, at most one lease after `max_hold`". The background
/// thread chose the permits to renew when its round began, and sent their renewal
/// after the round's earlier calls (here renewals of other semaphores, each of which
/// runs out its time on a slow network): a renewal chosen just before `max_hold` went
/// out up to an operation timeout after it (one per slow call before it), and the
/// permit said it was valid for a whole lease from then.
#[test]
fn no_renewal_is_sent_after_max_hold_even_late_in_a_round() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let c = Client::builder()
        .operation_timeout(Duration::from_secs(1))
        .build(proxy.url())
        .unwrap();
    // semaphores whose renewals are slow (longer than the operation timeout), each
    // tried again soon after it fails, so at nearly every round: the order of a
    // round's calls is not fixed, so several of them
    let slow: Vec<Permit> = (0..3)
        .map(|k| {
            c.semaphore_builder(&format!("slow-{k}"))
                .limit(1)
                .lease(Duration::from_secs(60))
                .refresh_interval(Duration::from_secs(1))
                .build()
                .unwrap()
                .try_acquire()
                .unwrap()
                .expect("a free permit")
        })
        .collect();
    proxy.delay_sent(b"{slow-", Duration::from_secs(30));
    // (their first renewals, a second after their grant, fail: tried again soon)
    wait_until(Duration::from_secs(20), "the slow renewals failed", || {
        c.stats().refresh_failed >= 3
    });
    let (lease, max_hold) = (Duration::from_secs(5), Duration::from_secs(2));
    let held = c
        .semaphore_builder("held")
        .limit(1)
        .lease(lease)
        .refresh_interval(Duration::from_millis(100))
        .max_hold(max_hold)
        .build()
        .unwrap();
    let p = held.try_acquire().unwrap().expect("a free permit");
    // (max_hold counts from the grant, which came before this instant)
    let latest_end = std::time::Instant::now() + max_hold + lease;
    let lost = loop {
        let now = std::time::Instant::now();
        assert!(
            now + p.lease_left() <= latest_end,
            "renewed after max_hold: {:?} left, {:?} past max_hold and a lease",
            p.lease_left(),
            (now + p.lease_left()) - latest_end
        );
        assert!(
            now < latest_end + Duration::from_secs(5),
            "lost() never fired"
        );
        if let Ok(reason) = p.lost().recv_timeout(Duration::from_millis(20)) {
            break reason;
        }
    };
    assert_eq!(lost, LostReason::MaxHold);
    assert!(slow.iter().all(|p| !p.is_lost()), "their leases still run");
    proxy.delay_sent(b"-", Duration::ZERO);
}

/// The parts of the only permit of `name` (limit 1, `lease`), taken by `giver`, to
/// hand over.
fn handed_over(giver: &Client, name: &str, lease: Duration) -> redis_semaphore::PermitParts {
    giver
        .semaphore_builder(name)
        .limit(1)
        .lease(lease)
        .build()
        .unwrap()
        .try_acquire()
        .unwrap()
        .expect("a free permit")
        .into_parts()
}
