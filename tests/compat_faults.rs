//! The compat types under faults (found by a review, 2026-11-27): a release whose
//! pooled connection was killed is sent again on a fresh one, as the leased
//! semaphore's is.

mod support;

use redis_semaphore::Client;
use support::RedisServer;

use support::kill_clients_on as kill_clients;

fn zcard(conn: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("ZCARD").arg(key).query(conn).unwrap()
}

fn get(conn: &mut redis::Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(conn).unwrap()
}

/// A permit-expirable permit without a lease, released after the client's idle pooled
/// connections were killed (CLIENT KILL, a server `timeout`, a restart with
/// persistence): the release goes out on a dead connection and fails. Nothing else
/// ever gives a permit without lease back, so the semaphore stays one short for good.
/// The leased semaphore resends such a release on a fresh connection (release by id is
/// safe to run twice); this one should too.
#[test]
fn a_permit_expirable_release_on_a_killed_connection_is_retried_on_a_fresh_one() {
    let server = RedisServer::start();
    let mut admin = server.conn();
    let client = Client::open(server.url()).unwrap();
    let pes = client.redisson_permit_expirable_semaphore("pk");
    assert!(pes.try_set_permits(1).unwrap());
    let permit = pes.try_acquire(None).unwrap().expect("a permit");
    assert!(kill_clients(&mut admin) >= 1);
    let r = permit.release();
    eprintln!("release after CLIENT KILL: {r:?}");
    eprintln!(
        "counter {:?}, held {}",
        get(&mut admin, "pk"),
        zcard(&mut admin, "{pk}:timeout")
    );
    assert!(r.is_ok(), "released through a fresh connection: {r:?}");
    assert_eq!(zcard(&mut admin, "{pk}:timeout"), 0, "no permit left held");
    assert_eq!(get(&mut admin, "pk").as_deref(), Some("1"));
}

/// The same through Drop.
#[test]
fn a_permit_expirable_permit_dropped_after_a_client_kill_is_given_back() {
    let server = RedisServer::start();
    let mut admin = server.conn();
    let client = Client::open(server.url()).unwrap();
    let pes = client.redisson_permit_expirable_semaphore("pd");
    assert!(pes.try_set_permits(1).unwrap());
    let permit = pes.try_acquire(None).unwrap().expect("a permit");
    assert!(kill_clients(&mut admin) >= 1);
    drop(permit);
    eprintln!(
        "counter {:?}, held {}",
        get(&mut admin, "pd"),
        zcard(&mut admin, "{pd}:timeout")
    );
    assert_eq!(zcard(&mut admin, "{pd}:timeout"), 0, "no permit left held");
    let other = Client::open(server.url()).unwrap();
    assert!(
        other
            .redisson_permit_expirable_semaphore("pd")
            .try_acquire(None)
            .unwrap()
            .is_some(),
        "the permit is free again"
    );
}

/// The same for a book permit: its release after a CLIENT KILL of the pool's idle
/// connections fails, and the entry holds its place until the book's timeout.
#[test]
fn a_book_release_on_a_killed_connection_is_retried_on_a_fresh_one() {
    use redis_semaphore::compat::book::BookVariant;
    let server = RedisServer::start();
    let mut admin = server.conn();
    let client = Client::open(server.url()).unwrap();
    let sem = client
        .book_semaphore("bk", 1)
        .variant(BookVariant::Fair)
        .timeout(std::time::Duration::from_secs(60))
        .build()
        .unwrap();
    let permit = sem.try_acquire().unwrap().expect("a permit");
    assert!(kill_clients(&mut admin) >= 1);
    let r = permit.release();
    eprintln!(
        "book release after CLIENT KILL: {r:?}, held {}",
        zcard(&mut admin, "bk")
    );
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(zcard(&mut admin, "bk"), 0);
}

// Found by a review of the session's changes (2026-11-27).

/// A PES permit (no lease) released by id from elsewhere (an operator, Redisson's
/// `release(id)`), another holder granted the freed permit; then the holder's idle
/// pooled connection is killed and it releases: its first send never reached the
/// server, the resend finds the id gone, and the caller is told it released fine,
/// though its permit had been taken from it and handed to another.
#[test]
fn a_pes_permit_released_by_another_is_not_reported_released_after_a_kill() {
    for kill in [false, true] {
        let server = RedisServer::start();
        let mut admin = server.conn();
        let client = Client::open(server.url()).unwrap();
        let pes = client.redisson_permit_expirable_semaphore("pf");
        assert!(pes.try_set_permits(1).unwrap());
        let permit = pes.try_acquire(None).unwrap().expect("a permit");
        // an operator frees it, another holder takes the permit
        let operator = Client::open(server.url()).unwrap();
        let op_pes = operator.redisson_permit_expirable_semaphore("pf");
        op_pes.release(permit.id()).unwrap();
        let other = op_pes
            .try_acquire(None)
            .unwrap()
            .expect("the other holder's permit");
        if kill {
            assert!(kill_clients(&mut admin) >= 1);
        }
        let r = permit.release();
        eprintln!("kill={kill}: release of a permit taken from its holder: {r:?}");
        assert!(r.is_err(), "kill={kill}: told released fine: {r:?}");
        drop(other);
    }
}

/// The same for a book permit whose entry another process removed (the book's
/// `release_fair_semaphore(conn, name, id)` run elsewhere, or its purge by a client
/// whose clock runs ahead), another holder then granted: after a CLIENT KILL of the
/// idle pooled connections, its release is reported fine.
#[test]
fn a_book_permit_removed_by_another_is_not_reported_released_after_a_kill() {
    use redis_semaphore::compat::book::BookVariant;
    for kill in [false, true] {
        let server = RedisServer::start();
        let mut admin = server.conn();
        let client = Client::open(server.url()).unwrap();
        let build = |c: &Client| {
            c.book_semaphore("bf", 1)
                .variant(BookVariant::Fair)
                .timeout(std::time::Duration::from_secs(60))
                .build()
                .unwrap()
        };
        let sem = build(&client);
        let permit = sem.try_acquire().unwrap().expect("a permit");
        // the book's release_fair_semaphore, run by another process
        let removed: i64 = redis::pipe()
            .cmd("ZREM")
            .arg("bf")
            .arg(permit.id())
            .cmd("ZREM")
            .arg("bf:owner")
            .arg(permit.id())
            .query::<(i64, i64)>(&mut admin)
            .map(|(a, b)| a + b)
            .unwrap();
        assert_eq!(removed, 2);
        let other_client = Client::open(server.url()).unwrap();
        let other = build(&other_client)
            .try_acquire()
            .unwrap()
            .expect("the other holder's");
        if kill {
            assert!(kill_clients(&mut admin) >= 1);
        }
        let r = permit.release();
        eprintln!("kill={kill}: book release of an entry removed by another: {r:?}");
        assert!(r.is_err(), "kill={kill}: told released fine: {r:?}");
        drop(other);
    }
}

/// A permit-expirable permit's release that got no reply in time (a partition, a
/// server that stopped answering for longer than the operation timeout) was not sent
/// again: the release failed with a timeout, and a permit without a lease, which
/// nothing else ever gives back, stayed taken for good (the semaphore one permit
/// short for ever; with a lease, taken until it ended). The leased semaphore owes such
/// a release to the client's background thread, which sends it again; a release by
/// the permit's own id is safe to send any number of times, and now is too.
#[test]
fn a_permit_expirable_release_without_a_reply_in_time_is_sent_again_in_the_background() {
    const OP: std::time::Duration = std::time::Duration::from_millis(300);
    let (server, proxy, client) = support::proxied(OP);
    let mut admin = server.conn();
    let pes = client.redisson_permit_expirable_semaphore("pt");
    assert!(pes.try_set_permits(1).unwrap());
    let permit = pes.try_acquire(None).unwrap().expect("a permit");
    proxy.cut();
    let r = permit.release();
    assert!(
        r.as_ref().is_err_and(redis_semaphore::Error::is_timeout),
        "{r:?}"
    );
    assert_eq!(
        zcard(&mut admin, "{pt}:timeout"),
        1,
        "the release did not reach the server"
    );
    proxy.heal();
    support::wait_until(
        std::time::Duration::from_secs(10),
        "the permit is given back",
        || zcard(&mut admin, "{pt}:timeout") == 0,
    );
    assert_eq!(get(&mut admin, "pt").as_deref(), Some("1"));
}

/// Review (sixth session): a background renewal of a permit-expirable permit that the
/// network held up (no reply within its wait: the call failed, and the renewal was
/// tried again 200 ms later on another connection) could still reach the server after
/// the renewal sent after it, and its plain `ZADD` moved the permit's deadline back to
/// its own, earlier one, while the `Permit` counted its lease from the later renewal:
/// it said it was valid for as long as the two sends lay apart (here about half a
/// second) after another client had reclaimed the permit and been granted it, two
/// holders of a semaphore of one. (The leased semaphore's refresh never moves a
/// deadline earlier: `ZADD GT`.) A renewal of a permit-expirable permit by this
/// client, in the background or by `Permit::refresh`, now never moves one earlier
/// either.
#[test]
fn a_permit_expirable_renewal_that_lands_late_never_moves_the_deadline_back() {
    use std::time::Duration;
    const OP: Duration = Duration::from_millis(300);
    let lease = Duration::from_secs(3);
    let (server, proxy, client) = support::proxied(OP);
    let pes = client
        .redisson_permit_expirable_semaphore("pl")
        .with_auto_refresh(true);
    assert!(pes.try_set_permits(1).unwrap());
    let permit = pes.try_acquire(Some(lease)).unwrap().expect("a permit");
    // the lease script in the server's cache: the renewal held below is one EVALSHA,
    // which runs when it arrives
    permit.refresh().unwrap();
    let failed = client.stats().refresh_failed;
    // the next background renewal (from now on the only call of this client about
    // the semaphore) is held 1.5 s on its way (its call gives up after 300 ms); the
    // one that follows goes through at once
    proxy.delay_sent(b"{pl}:timeout", Duration::from_millis(1_500));
    support::wait_until(Duration::from_secs(5), "a background renewal fails", || {
        client.stats().refresh_failed > failed
    });
    proxy.delay_sent(b"{pl}:timeout", Duration::ZERO);
    support::wait_until(
        Duration::from_secs(5),
        "a background renewal after it renews the permit",
        || permit.lease_left() > lease - Duration::from_millis(500),
    );
    // nothing from this client reaches the server from now on, but the held renewal,
    // already on its way, which lands a second later
    proxy.cut();
    let other = Client::open(server.url()).unwrap();
    let other_pes = other.redisson_permit_expirable_semaphore("pl");
    let _taken = support::wait_for(
        Duration::from_secs(10),
        "another client is granted the only permit",
        || other_pes.try_acquire(Some(lease)).unwrap(),
    );
    assert!(
        permit.is_lost() || permit.lease_left().is_zero(),
        "the permit says it is valid for {:?} more while another client holds the \
         semaphore's only permit",
        permit.lease_left()
    );
}

/// Review (eighth session): an `update_lease_time` that shortened a held permit's
/// lease on the server but whose reply was lost (a timeout: a partition, a slow
/// network) left the `Permit` of this client on its old lease. Once the short lease
/// had ended, another client reclaimed the permit and took the only one of a
/// semaphore of one, while this `Permit` still said it was valid for most of a
/// minute: two valid holders. A failed update may have run, so the `Permit` now
/// counts the shorter of its lease and the one the update asked for.
#[test]
fn a_lease_update_whose_reply_is_lost_still_shortens_the_permit() {
    use std::time::Duration;
    const OP: Duration = Duration::from_millis(400);
    let (server, proxy, client) = support::proxied(OP);
    let mut admin = server.conn();
    let pes = client.redisson_permit_expirable_semaphore("pu");
    assert!(pes.try_set_permits(1).unwrap());
    let permit = pes
        .try_acquire(Some(Duration::from_secs(60)))
        .unwrap()
        .expect("a permit");
    // the lease script in the server's cache: the update below is one EVALSHA
    permit.refresh().unwrap();
    let before = pes_score(&mut admin, "{pu}:timeout");
    // the update runs on the server; its reply comes after the call gave up
    proxy.delay_replies(Duration::from_millis(1_500));
    let r = pes.update_lease_time(permit.id(), Some(Duration::from_millis(300)));
    assert!(
        r.as_ref().is_err_and(redis_semaphore::Error::is_timeout),
        "{r:?}"
    );
    proxy.delay_replies(Duration::ZERO);
    let score = support::wait_for(Duration::from_secs(5), "the update runs", || {
        let score = pes_score(&mut admin, "{pu}:timeout");
        (score < before - 50_000).then_some(score)
    });
    support::wait_until(Duration::from_secs(5), "the short lease ends", || {
        support::now_ms() >= score
    });
    let other = Client::open(server.url()).unwrap();
    let theirs = other
        .redisson_permit_expirable_semaphore("pu")
        .try_acquire(Some(Duration::from_secs(60)))
        .unwrap()
        .expect("the other client reclaims the expired permit");
    assert!(
        permit.is_lost() || permit.lease_left().is_zero(),
        "the permit says it is valid for {:?} more while {} holds the only permit",
        permit.lease_left(),
        theirs.id()
    );
}

/// Eighth session (the permit-expirable fault run, against the fix above): an
/// `update_lease_time` that gave up before its request had even reached the server
/// (held on its way) was followed by a renewal that was answered, which moved the
/// `Permit` a whole lease on; then the held update ran and set the shorter lease on
/// the server, which reclaimed the permit at its end and granted it to another client
/// while this `Permit` said it was valid for most of a lease. A failed update may run
/// at any later time, so no renewal moves the `Permit` past the deadline it asked for.
#[test]
fn a_lease_update_that_runs_after_a_later_renewal_still_ends_the_permit() {
    use std::time::Duration;
    const OP: Duration = Duration::from_millis(300);
    let lease = Duration::from_secs(4);
    let (server, proxy, client) = support::proxied(OP);
    let mut admin = server.conn();
    let pes = client.redisson_permit_expirable_semaphore("pl");
    assert!(pes.try_set_permits(1).unwrap());
    let permit = pes.try_acquire(Some(lease)).unwrap().expect("a permit");
    // the lease script in the server's cache: the update held below is one EVALSHA
    permit.refresh().unwrap();
    let before = pes_score(&mut admin, "{pl}:timeout");
    // the update is held 1.5 s on its way (its call gives up after 300 ms), then runs
    proxy.delay_sent(b"{pl}:timeout", Duration::from_millis(1_500));
    let r = pes.update_lease_time(permit.id(), Some(Duration::from_millis(200)));
    assert!(
        r.as_ref().is_err_and(redis_semaphore::Error::is_timeout),
        "{r:?}"
    );
    proxy.delay_sent(b"{pl}:timeout", Duration::ZERO);
    // a renewal sent after the update gave up, answered before the update runs
    permit.refresh().unwrap();
    assert!(
        pes_score(&mut admin, "{pl}:timeout") >= before,
        "the renewal ran before the held update"
    );
    support::wait_until(Duration::from_secs(5), "the held update runs", || {
        pes_score(&mut admin, "{pl}:timeout") < before - 1_000
    });
    let other = Client::open(server.url()).unwrap();
    let theirs = support::wait_for(
        Duration::from_secs(10),
        "another client is granted the only permit",
        || {
            other
                .redisson_permit_expirable_semaphore("pl")
                .try_acquire(Some(lease))
                .unwrap()
        },
    );
    assert!(
        permit.is_lost() || permit.lease_left().is_zero(),
        "the permit says it is valid for {:?} more while {} holds the only permit",
        permit.lease_left(),
        theirs.id()
    );
}

/// The score of the only member of the lease zset `key`.
fn pes_score(conn: &mut redis::Connection, key: &str) -> i64 {
    let v: Vec<(Vec<u8>, i64)> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(conn)
        .unwrap();
    assert_eq!(v.len(), 1, "one permit held");
    v[0].1
}

/// Review (eighth session): a renewal of a permit-expirable permit (`Permit::refresh`
/// here, the background renewal alike) that ran on the server before an
/// `update_lease_time` shortened the lease, but whose reply came back after the
/// update's, moved the `Permit` past the shortened lease: the renewal counted its
/// whole lease from its own send, while the server held the update's short one. Once
/// that had ended, another client reclaimed the permit and took the only one, while
/// this `Permit` said it was valid for most of a minute. A renewal whose flight
/// overlapped a lease update of the same permit now leaves the update's deadline as
/// it is (the next renewal, sent after the update, counts as usual).
#[test]
fn a_renewal_answered_after_a_lease_update_does_not_undo_it() {
    use std::time::Duration;
    const OP: Duration = Duration::from_secs(8);
    let (server, proxy, client) = support::proxied(OP);
    let mut admin = server.conn();
    let pes = client.redisson_permit_expirable_semaphore("pr");
    assert!(pes.try_set_permits(1).unwrap());
    let permit = pes
        .try_acquire(Some(Duration::from_secs(60)))
        .unwrap()
        .expect("a permit");
    // the lease script in the server's cache: each call below is one EVALSHA
    permit.refresh().unwrap();
    std::thread::scope(|s| {
        // the renewal runs on the server at once; its reply is held 4 s on its way
        proxy.delay_replies(Duration::from_secs(4));
        let renewal = s.spawn(|| permit.refresh());
        support::wait_until(
            Duration::from_secs(5),
            "the renewal's reply is held",
            || proxy.held_replies() >= 1,
        );
        proxy.delay_replies(Duration::ZERO);
        // after it on the server, answered before it
        assert!(
            pes.update_lease_time(permit.id(), Some(Duration::from_millis(300)))
                .unwrap()
        );
        assert!(
            proxy.held_replies() >= 1,
            "the renewal's reply is still held"
        );
        renewal.join().unwrap().expect("the renewal went through");
    });
    let score = pes_score(&mut admin, "{pr}:timeout");
    support::wait_until(Duration::from_secs(5), "the short lease ends", || {
        support::now_ms() >= score
    });
    let other = Client::open(server.url()).unwrap();
    let theirs = other
        .redisson_permit_expirable_semaphore("pr")
        .try_acquire(Some(Duration::from_secs(60)))
        .unwrap()
        .expect("the other client reclaims the expired permit");
    assert!(
        permit.is_lost() || permit.lease_left().is_zero(),
        "the permit says it is valid for {:?} more while {} holds the only permit",
        permit.lease_left(),
        theirs.id()
    );
}

/// Review (eighth session): a permit-expirable permit of a semaphore whose counter has
/// a TTL (`RSemaphore::try_set_permits_with_ttl`, or Redisson's `trySetPermits(n,
/// ttl)` on the Java side: the acquire gives the lease zset the counter's TTL, as
/// Redisson's does) said it was valid for its whole lease after the semaphore's keys
/// had expired with it, when the semaphore was set up again and another client was
/// granted its only permit: two valid holders. A grant now counts its lease no further
/// than the keys' TTL it was made under, and so does a renewal.
#[test]
fn a_permit_expirable_permit_ends_with_the_keys_ttl() {
    use std::time::Duration;
    let server = RedisServer::start();
    let mut admin = server.conn();
    let client = Client::open(server.url()).unwrap();
    let rs = client.redisson_semaphore("px");
    assert!(
        rs.try_set_permits_with_ttl(1, Duration::from_secs(3))
            .unwrap()
    );
    let pes = client.redisson_permit_expirable_semaphore("px");
    let permit = pes
        .try_acquire(Some(Duration::from_secs(60)))
        .unwrap()
        .expect("a permit");
    permit.refresh().unwrap();
    support::wait_until(Duration::from_secs(10), "the keys expire", || {
        get(&mut admin, "px").is_none() && zcard(&mut admin, "{px}:timeout") == 0
    });
    let other = Client::open(server.url()).unwrap();
    let other_pes = other.redisson_permit_expirable_semaphore("px");
    assert!(other_pes.try_set_permits(1).unwrap(), "set up again");
    let theirs = other_pes
        .try_acquire(Some(Duration::from_secs(60)))
        .unwrap()
        .expect("the other client is granted the only permit");
    assert!(
        permit.is_lost() || permit.lease_left().is_zero(),
        "the permit says it is valid for {:?} more while {} holds the only permit",
        permit.lease_left(),
        theirs.id()
    );
    drop((permit, theirs));

    // a TTL given to the keys after the grant (Redisson's `expire` on the semaphore)
    // is learnt by the permit's next renewal
    let py = client.redisson_permit_expirable_semaphore("py");
    assert!(py.try_set_permits(1).unwrap());
    let permit = py
        .try_acquire(Some(Duration::from_secs(60)))
        .unwrap()
        .expect("a permit");
    for key in ["py", "{py}:timeout"] {
        let set: i64 = redis::cmd("PEXPIRE")
            .arg(key)
            .arg(3_000)
            .query(&mut admin)
            .unwrap();
        assert_eq!(set, 1, "{key} has a TTL");
    }
    permit.refresh().unwrap();
    support::wait_until(Duration::from_secs(10), "the keys expire", || {
        get(&mut admin, "py").is_none() && zcard(&mut admin, "{py}:timeout") == 0
    });
    let other_py = other.redisson_permit_expirable_semaphore("py");
    assert!(other_py.try_set_permits(1).unwrap(), "set up again");
    let theirs = other_py
        .try_acquire(Some(Duration::from_secs(60)))
        .unwrap()
        .expect("the other client is granted the only permit");
    assert!(
        permit.is_lost() || permit.lease_left().is_zero(),
        "the renewed permit says it is valid for {:?} more while {} holds the only permit",
        permit.lease_left(),
        theirs.id()
    );
}
