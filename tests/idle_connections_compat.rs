//! The compat types on pooled connections the server closed while they were idle
//! (ninth session): Redis's `timeout` setting, a cloud's idle cut (Azure closes
//! connections idle for 10 minutes), a load balancer, `CLIENT KILL` or a restart close
//! them, and the pool hands them out again (it sends no `PING` on checkout, DESIGN
//! invariant 12). The first request on such a connection fails ("unexpected end of
//! file", a reset). Every operation of `RPermitExpirableSemaphore` and of the book's
//! semaphores (each variant) is safe to send twice (its own ids, an absolute value,
//! or, for `add_permits` and `try_set_permits`, an operation key), and is sent again
//! on another connection; no permit is lost or taken twice, also when the first send
//! ran and only its reply was lost (a connection reset after the server answered).
//!
//! Each operation runs right after its client's idle connections were closed, in
//! one of two ways: a server started with `timeout 1`, waited on until `CLIENT LIST`
//! shows the pooled connections gone; or `CLIENT KILL TYPE normal SKIPME yes`.

mod support;

use std::time::Duration;

use redis_semaphore::compat::book::{BookSemaphore, BookVariant};
use redis_semaphore::{Client, Permit};
use support::{Cut, RedisServer};

/// Long enough for every step of a test (each waits a second or two for its cut).
const LEASE: Duration = Duration::from_secs(600);

struct Server {
    server: RedisServer,
    cut: Cut,
}

impl Server {
    fn start(cut: Cut) -> Server {
        Server {
            server: cut.server(),
            cut,
        }
    }

    fn url(&self) -> String {
        self.server.url()
    }

    /// A connection for assertions (a new one each time: with `timeout 1` an idle one
    /// would be closed as well).
    fn admin(&self) -> redis::Connection {
        self.server.conn()
    }

    /// Runs `warm` (a call that leaves a connection in the client's pool: it opens a
    /// new one when the pool has none) until the pool holds a live one, then closes
    /// every idle connection of the client the way `cut` says. The pool still holds
    /// them: the next call checks one of them out.
    fn cut_after(&self, mut warm: impl FnMut()) {
        let mut admin = self.admin();
        // (a call may find a connection the server closed still in the pool, and send
        // itself again on another, a new one closed after it: it then leaves none)
        support::wait_until(
            Duration::from_secs(10),
            "the client has an idle pooled connection to lose",
            || {
                warm();
                support::normal_clients(&mut admin) >= 2
            },
        );
        self.cut.apply(&mut admin);
    }
}

fn zcard(conn: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("ZCARD").arg(key).query(conn).unwrap()
}

fn get(conn: &mut redis::Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(conn).unwrap()
}

fn exists(conn: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query(conn).unwrap()
}

// ---- RPermitExpirableSemaphore ----

/// Free permits (the counter) and held ones (the lease zset) of PES `name`.
fn pes_state(s: &Server, name: &str) -> (i64, i64) {
    pes_state_of(&mut s.admin(), name)
}

/// Every way to take a permit-expirable permit, and every way to give one back, each
/// right after the idle connections were closed: each acquire is sent again with its
/// own ids (a resend finds them held and takes nothing again), each grant ends as a
/// `Permit`, and the counts add up after each step (none taken twice, none lost).
fn pes_acquires_and_releases(cut: Cut) {
    let s = Server::start(cut);
    let client = Client::open(s.url()).unwrap();
    let pes = client.redisson_permit_expirable_semaphore("pa");
    let warm = || {
        pes.available_permits().unwrap();
    };
    assert!(pes.try_set_permits(9).unwrap());
    let mut held: Vec<Permit> = Vec::new();
    let check = |held: &[Permit]| {
        let (free, taken) = pes_state(&s, "pa");
        assert_eq!(taken, held.len() as i64, "{cut:?}: held in Redis");
        assert_eq!(free + taken, 9, "{cut:?}: no permit lost or taken twice");
    };

    s.cut_after(warm);
    held.push(pes.try_acquire(None).unwrap().expect("try_acquire"));
    check(&held);
    s.cut_after(warm);
    held.extend(
        pes.try_acquire_many(2, Some(LEASE))
            .unwrap()
            .expect("try_acquire_many"),
    );
    check(&held);
    s.cut_after(warm);
    held.push(pes.acquire(Some(LEASE)).unwrap());
    check(&held);
    s.cut_after(warm);
    held.extend(pes.acquire_many(2, None).unwrap());
    check(&held);
    s.cut_after(warm);
    held.push(
        pes.acquire_timeout(Duration::from_secs(1), Some(LEASE))
            .unwrap()
            .expect("acquire_timeout"),
    );
    check(&held);
    s.cut_after(warm);
    held.extend(
        pes.acquire_many_timeout(2, Duration::from_secs(1), None)
            .unwrap()
            .expect("acquire_many_timeout"),
    );
    check(&held);
    assert_eq!(held.len(), 9);
    // the semaphore is full: a try on a dead connection answers "not now", and takes
    // nothing (its resend finds no permit free)
    s.cut_after(warm);
    assert!(pes.try_acquire(None).unwrap().is_none());
    check(&held);

    // every permit says it is valid, and is held in Redis with a lease at least as
    // long as the one it counts (the client's deadline never later than the server's)
    for p in &held {
        assert!(!p.is_lost() && !p.lease_left().is_zero());
        if let Some(left) = pes.lease_time(p.id()).unwrap() {
            assert!(left + Duration::from_millis(5) >= p.lease_left(), "{cut:?}");
        }
    }

    // the ways back: release by id, try_release by id, Permit::release, drop
    let mut held = held.into_iter();
    let p = held.next().unwrap();
    s.cut_after(warm);
    pes.release(p.id()).unwrap();
    drop(p);
    let p = held.next().unwrap();
    s.cut_after(warm);
    assert!(pes.try_release(p.id()).unwrap());
    drop(p);
    let p = held.next().unwrap();
    s.cut_after(warm);
    p.release().unwrap();
    let rest: Vec<Permit> = held.collect();
    for p in rest {
        s.cut_after(warm);
        drop(p);
    }
    assert_eq!(pes_state(&s, "pa"), (9, 0), "{cut:?}: every permit back");
}

#[test]
fn pes_acquires_and_releases_after_the_server_s_idle_timeout() {
    pes_acquires_and_releases(Cut::Idle);
}

#[test]
fn pes_acquires_and_releases_after_client_kill() {
    pes_acquires_and_releases(Cut::Kill);
}

/// The reads (each reclaims expired permits first), the lease calls and the set-up
/// calls, each right after the idle connections were closed: each is sent again, and
/// each count moves as once.
fn pes_reads_leases_and_set_up(cut: Cut) {
    let s = Server::start(cut);
    let client = Client::open(s.url()).unwrap();
    let pes = client.redisson_permit_expirable_semaphore("pr");
    let warm = || {
        pes.available_permits().unwrap();
    };

    // on a counter that does not exist
    s.cut_after(warm);
    assert!(pes.try_set_permits(3).unwrap(), "{cut:?}: try_set_permits");
    let permit = pes.try_acquire(Some(LEASE)).unwrap().expect("a permit");

    s.cut_after(warm);
    assert_eq!(pes.available_permits().unwrap(), 2);
    s.cut_after(warm);
    assert_eq!(pes.acquired_permits().unwrap(), 1);
    s.cut_after(warm);
    assert_eq!(pes.permits().unwrap(), 3);
    s.cut_after(warm);
    let left = pes.lease_time(permit.id()).unwrap().expect("a lease");
    assert!(left > LEASE - Duration::from_secs(10));

    // a renewal, then a lease update: the permit counts each from its first send
    s.cut_after(warm);
    permit.refresh().unwrap();
    assert!(!permit.is_lost());
    s.cut_after(warm);
    assert!(
        pes.update_lease_time(permit.id(), Some(Duration::from_secs(30)))
            .unwrap()
    );
    let left = pes.lease_time(permit.id()).unwrap().expect("a lease");
    assert!(
        permit.lease_left() <= left + Duration::from_millis(5),
        "{cut:?}: the permit counts {:?}, the server {left:?}",
        permit.lease_left()
    );
    assert!(permit.lease_left() > Duration::from_secs(20));

    s.cut_after(warm);
    pes.set_permits(5).unwrap();
    assert_eq!(pes_state(&s, "pr"), (4, 1), "{cut:?}: set_permits");

    // a second run would not repeat these exactly: their operation key answers it
    s.cut_after(warm);
    assert_eq!(pes.add_permits(2).unwrap(), 6, "{cut:?}: add_permits");
    assert_eq!(pes_state(&s, "pr"), (6, 1), "{cut:?}: added once");
    s.cut_after(warm);
    assert!(
        !pes.try_set_permits(9).unwrap(),
        "{cut:?}: the counter exists"
    );
    assert_eq!(pes_state(&s, "pr"), (6, 1), "{cut:?}: try_set_permits");

    s.cut_after(warm);
    permit.release().unwrap();
    assert_eq!(pes_state(&s, "pr"), (7, 0));
}

#[test]
fn pes_reads_leases_and_set_up_after_the_server_s_idle_timeout() {
    pes_reads_leases_and_set_up(Cut::Idle);
}

#[test]
fn pes_reads_leases_and_set_up_after_client_kill() {
    pes_reads_leases_and_set_up(Cut::Kill);
}

/// With Redisson's replica wait, the resend waits for the replica as the first send
/// would have (`WAIT` on the fresh connection).
#[test]
fn pes_with_replica_wait_acquires_after_client_kill() {
    let (primary, _replica) = support::primary_and_replica();
    let s = Server {
        server: primary,
        cut: Cut::Kill,
    };
    // (time to spare for the replica's acknowledgement on a busy machine)
    let client = Client::builder()
        .operation_timeout(Duration::from_secs(5))
        .build(s.url())
        .unwrap();
    let pes = client
        .redisson_permit_expirable_semaphore("pw")
        .with_replica_wait(Duration::from_secs(2))
        .unwrap();
    let warm = || {
        pes.available_permits().unwrap();
    };
    assert!(pes.try_set_permits(2).unwrap());
    s.cut_after(warm);
    let p = pes.try_acquire(Some(LEASE)).unwrap().expect("a permit");
    s.cut_after(warm);
    p.refresh().unwrap();
    s.cut_after(warm);
    p.release().unwrap();
    assert_eq!(pes_state(&s, "pw"), (2, 0));
}

// ---- the book's semaphores ----

fn book(client: &Client, name: &str, variant: BookVariant) -> BookSemaphore {
    client
        .book_semaphore(name, 3)
        .variant(variant)
        .timeout(LEASE)
        .build()
        .unwrap()
}

/// The keys of book semaphore `name` of `variant`: its time zset and its ticket zset
/// (the fair variants).
fn book_keys(name: &str, variant: BookVariant) -> (String, Option<String>) {
    match variant {
        BookVariant::Basic => (name.to_owned(), None),
        BookVariant::NodeFair => (format!("{name}:time"), Some(format!("{name}:count"))),
        _ => (name.to_owned(), Some(format!("{name}:owner"))),
    }
}

/// Every operation of a book semaphore of `variant`, each right after the idle
/// connections were closed: an acquire is sent again with the same entry id and the
/// same clock reading (a resend writes the same entry, never a second one), a refresh
/// and a release by the entry's id; the entries in Redis are the permits held after
/// each step, and no lock is left behind.
fn book_every_operation(variant: BookVariant, cut: Cut) {
    let s = Server::start(cut);
    let client = Client::open(s.url()).unwrap();
    let name = format!("bk-{variant:?}");
    let sem = book(&client, &name, variant);
    let warm = || {
        sem.held().unwrap();
    };
    let (time, owner) = book_keys(&name, variant);
    let check = |held: usize| {
        let mut admin = s.admin();
        assert_eq!(zcard(&mut admin, &time), held as i64, "{variant:?} {cut:?}");
        if let Some(owner) = &owner {
            assert_eq!(zcard(&mut admin, owner), held as i64, "{variant:?} {cut:?}");
        }
        assert!(
            !exists(&mut admin, &format!("lock:{name}")),
            "{variant:?} {cut:?}: the lock is not left taken"
        );
    };

    s.cut_after(warm);
    let a = sem.try_acquire().unwrap().expect("try_acquire");
    check(1);
    s.cut_after(warm);
    let b = sem
        .acquire_timeout(Duration::from_secs(1))
        .unwrap()
        .expect("acquire_timeout");
    check(2);
    s.cut_after(warm);
    let c = sem.acquire().unwrap();
    check(3);
    // full: a try on a dead connection answers "not now" and leaves no entry behind
    s.cut_after(warm);
    assert!(sem.try_acquire().unwrap().is_none(), "{variant:?} {cut:?}");
    check(3);
    s.cut_after(warm);
    assert_eq!(sem.held().unwrap(), 3);
    s.cut_after(warm);
    assert_eq!(sem.available().unwrap(), 0);
    for p in [&a, &b, &c] {
        assert!(!p.is_lost() && p.lease_left() > LEASE - Duration::from_secs(120));
    }
    if variant != BookVariant::Basic {
        s.cut_after(warm);
        b.refresh().unwrap();
        assert!(!b.is_lost());
    }
    s.cut_after(warm);
    a.release().unwrap();
    check(2);
    s.cut_after(warm);
    drop(b);
    check(1);
    s.cut_after(warm);
    c.release().unwrap();
    check(0);
}

#[test]
fn book_basic_after_the_server_s_idle_timeout() {
    book_every_operation(BookVariant::Basic, Cut::Idle);
}

#[test]
fn book_basic_after_client_kill() {
    book_every_operation(BookVariant::Basic, Cut::Kill);
}

#[test]
fn book_fair_after_the_server_s_idle_timeout() {
    book_every_operation(BookVariant::Fair, Cut::Idle);
}

#[test]
fn book_fair_after_client_kill() {
    book_every_operation(BookVariant::Fair, Cut::Kill);
}

#[test]
fn book_fair_with_lock_after_the_server_s_idle_timeout() {
    book_every_operation(BookVariant::FairWithLock, Cut::Idle);
}

#[test]
fn book_fair_with_lock_after_client_kill() {
    book_every_operation(BookVariant::FairWithLock, Cut::Kill);
}

#[test]
fn book_node_fair_after_the_server_s_idle_timeout() {
    book_every_operation(BookVariant::NodeFair, Cut::Idle);
}

#[test]
fn book_node_fair_after_client_kill() {
    book_every_operation(BookVariant::NodeFair, Cut::Kill);
}

/// The permit-expirable acquire script as the library builds it (src/scripts/mod.rs:
/// publish, counter, the PES prelude, once, the body), for a run the public API makes
/// only after a lost reply.
fn pes_acquire_script() -> redis::Script {
    redis::Script::new(&format!(
        "{}{}{}{}{}",
        include_str!("../src/scripts/redisson_publish.lua"),
        include_str!("../src/scripts/redisson_counter.lua"),
        include_str!("../src/scripts/redisson_pes_common.lua"),
        include_str!("../src/scripts/once.lua"),
        include_str!("../src/scripts/redisson_pes_acquire.lua"),
    ))
}

/// A permit-expirable acquire sent again (its first connection broke after the server
/// ran it, the reply lost) knew itself a resend only by its *first* id: when that one
/// had been released by id in between (or reclaimed: a reclaim takes at most n expired
/// members), the second run took n permits again for the one put back, and the
/// counter lost n - 1 for good. It now knows itself by any of its ids.
#[test]
fn a_resent_pes_acquire_takes_nothing_again_when_one_of_its_ids_was_released_since() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = Client::open(server.url()).unwrap();
    let pes = client.redisson_permit_expirable_semaphore("pz");
    assert!(pes.try_set_permits(5).unwrap());
    let script = pes_acquire_script();
    let (a, b) = ([0xaa_u8; 16], [0xbb_u8; 16]);
    let run = |conn: &mut redis::Connection| -> redis::Value {
        script
            .key("pz")
            .key("{pz}:timeout")
            .key("redisson_sc:{pz}")
            .arg("PUBLISH")
            .arg(support::now_ms())
            .arg(2)
            .arg(support::now_ms() + 600_000)
            .arg(&a[..])
            .arg(&b[..])
            .invoke(conn)
            .unwrap()
    };
    // the first run grants both; its reply is lost
    let first = run(&mut conn);
    assert!(granted(&first), "{first:?}");
    assert_eq!(pes_state_of(&mut conn, "pz"), (3, 2));
    // the first id is released by id (its hex, as Redisson's API shows it)
    pes.release(&"aa".repeat(16)).unwrap();
    assert_eq!(pes_state_of(&mut conn, "pz"), (4, 1));
    // the resend finds the second id held: it takes nothing again
    let again = run(&mut conn);
    assert!(granted(&again), "{again:?}");
    assert_eq!(
        pes_state_of(&mut conn, "pz"),
        (4, 1),
        "no permit taken again, none lost"
    );
}

/// Whether an acquire script's reply says granted (`OK`, or `OK:<ttl>`).
fn granted(v: &redis::Value) -> bool {
    match v {
        redis::Value::Okay => true,
        redis::Value::SimpleString(s) => s.starts_with("OK"),
        redis::Value::BulkString(b) => b.starts_with(b"OK"),
        _ => false,
    }
}

fn pes_state_of(conn: &mut redis::Connection, name: &str) -> (i64, i64) {
    let free = get(conn, name).map_or(0, |v| v.parse().unwrap());
    (free, zcard(conn, &format!("{{{name}}}:timeout")))
}

// ---- the first send ran, its reply lost with its connection ----

/// A client through a proxy (its operation timeout 10 s), for [`with_reply_lost`]; its
/// pool holds a connection, and the server has every script of the compat types, so
/// that a call under test makes as few round trips as it can.
fn reply_lost() -> (RedisServer, support::Proxy, Client) {
    let server = RedisServer::start();
    let (proxy, client) = support::proxied_client(&server, Duration::from_secs(10));
    let warm = client.redisson_permit_expirable_semaphore("warm-up");
    assert!(warm.try_set_permits(3).unwrap());
    warm.add_permits(1).unwrap();
    let p = warm.try_acquire(None).unwrap().expect("a permit");
    warm.permits().unwrap();
    p.release().unwrap();
    (server, proxy, client)
}

/// Runs `call` on a thread of its own with the proxy holding every reply 4 s, waits
/// until `ran` says the server ran it, then resets every connection (the reply lost
/// with it) and returns what the call answered, sent again on a new connection.
fn with_reply_lost<T: Send + 'static>(
    proxy: &support::Proxy,
    client: &Client,
    call: impl FnOnce() -> T + Send + 'static,
    ran: impl FnMut() -> bool,
) -> T {
    // (a pooled connection made before the replies are held: the second send of the
    // last call went on a fresh connection outside the pool, and a connection made
    // while they are held does not connect within the connect timeout)
    client
        .semaphore("warm-pool", 1)
        .unwrap()
        .available()
        .unwrap();
    proxy.delay_replies(Duration::from_secs(4));
    let calling = std::thread::spawn(call);
    support::wait_until(Duration::from_secs(10), "the call ran on the server", ran);
    proxy.delay_replies(Duration::ZERO);
    proxy.reset();
    calling.join().unwrap()
}

/// Permit-expirable calls whose first send ran and whose reply was lost with their
/// connection: the acquire sent again finds its ids held and takes nothing again (its
/// permits are the ones the first send took), `add_permits` and `try_set_permits`
/// find their operation key and answer the first run's reply.
#[test]
fn pes_calls_whose_reply_was_lost_with_their_connection_apply_once() {
    let (server, proxy, client) = reply_lost();
    let pes = client.redisson_permit_expirable_semaphore("pl");
    let state = || pes_state_of(&mut server.conn(), "pl");

    let set = {
        let pes = pes.clone();
        with_reply_lost(
            &proxy,
            &client,
            move || pes.try_set_permits(3),
            || state() == (3, 0),
        )
    };
    assert!(set.unwrap(), "the call that set the counter is told so");

    let taken = {
        let pes = pes.clone();
        with_reply_lost(
            &proxy,
            &client,
            move || pes.try_acquire_many(2, Some(LEASE)),
            || state() == (1, 2),
        )
    };
    let taken = taken.unwrap().expect("the permits the first send took");
    assert_eq!(state(), (1, 2), "taken once");
    for p in &taken {
        let left = pes
            .lease_time(p.id())
            .unwrap()
            .expect("held with its lease");
        assert!(!p.is_lost() && p.lease_left() <= left + Duration::from_millis(5));
    }

    let added = {
        let pes = pes.clone();
        with_reply_lost(
            &proxy,
            &client,
            move || pes.add_permits(2),
            || state() == (3, 2),
        )
    };
    assert_eq!(added.unwrap(), 3, "the first run's counter");
    assert_eq!(state(), (3, 2), "added once");
    drop(taken);
    assert_eq!(state(), (5, 0));
}

/// A book acquire whose first transaction ran and whose reply was lost with its
/// connection: made again with the same entry id and clock reading, it writes one
/// entry (a second `INCR` skips a ticket), and `FairWithLock` leaves no lock behind.
#[test]
fn a_book_acquire_whose_reply_was_lost_with_its_connection_writes_one_entry() {
    for variant in [
        BookVariant::Basic,
        BookVariant::Fair,
        BookVariant::FairWithLock,
        BookVariant::NodeFair,
    ] {
        let (server, proxy, client) = reply_lost();
        let name = format!("bl-{variant:?}");
        let sem = book(&client, &name, variant);
        assert_eq!(sem.held().unwrap(), 0);
        let (time, owner) = book_keys(&name, variant);
        // what the acquire's first step writes
        let first_step = {
            let (name, time) = (name.clone(), time.clone());
            let mut conn = server.conn();
            move || match variant {
                BookVariant::Basic => zcard(&mut conn, &time) == 1,
                BookVariant::Fair => get(&mut conn, &format!("{name}:counter")).is_some(),
                BookVariant::NodeFair => get(&mut conn, "semaphore:count").is_some(),
                _ => exists(&mut conn, &format!("lock:{name}")),
            }
        };
        let permit = {
            let sem = sem.clone();
            with_reply_lost(
                &proxy,
                &client,
                move || sem.acquire_timeout(Duration::from_secs(5)),
                first_step,
            )
        };
        let permit = permit.unwrap().expect("a permit");
        let mut conn = server.conn();
        assert_eq!(zcard(&mut conn, &time), 1, "{variant:?}: one entry");
        if let Some(owner) = &owner {
            assert_eq!(zcard(&mut conn, owner), 1, "{variant:?}: one ticket");
        }
        assert!(!permit.is_lost() && permit.lease_left() > LEASE - Duration::from_secs(60));
        support::wait_until(Duration::from_secs(10), "no lock left behind", || {
            !exists(&mut conn, &format!("lock:{name}"))
        });
        permit.release().unwrap();
        assert_eq!(zcard(&mut conn, &time), 0, "{variant:?}");
    }
}

/// Ninth session (review): a `FairWithLock` try whose entry was added but whose reply
/// was lost with its connection (a reset after the server ran the transaction) is made
/// again on a fresh connection, and that second attempt needs the lock first; the
/// first attempt's lock is given back aside, and when that give-back is slow (here
/// held up on its way) the second attempt's spin for the lock ends first, and the try
/// answers "not now". The first attempt's entry, which holds a place, was then left
/// in both zsets until its timeout: a place taken on the server by nobody. Now a try
/// that was made again and answers "not now" takes its entry out aside, as a failed
/// one does.
#[test]
fn a_fair_with_lock_try_made_again_that_misses_the_lock_leaves_no_entry() {
    let server = RedisServer::start();
    let (proxy, client) = support::proxied_client(&server, Duration::from_secs(2));
    let name = "bk-lost-lock";
    let sem = book(&client, name, BookVariant::FairWithLock);
    let (time, owner) = book_keys(name, BookVariant::FairWithLock);
    let owner = owner.unwrap();
    // (a connection in the pool, the clock of the server read)
    drop(sem.try_acquire().unwrap().expect("a free permit"));
    let mut admin = server.conn();
    assert_eq!(zcard(&mut admin, &time), 0);
    // the first attempt's lock is given back (WATCH, GET, MULTI/DEL/EXEC) slowly
    proxy.delay_sent(b"WATCH", Duration::from_secs(2));
    proxy.delay_replies(Duration::from_millis(300));
    let trying = {
        let sem = sem.clone();
        std::thread::spawn(move || sem.try_acquire().map(|p| p.map(|p| p.id().to_owned())))
    };
    // the entry added on the server; the reply of that transaction is held
    support::wait_until(Duration::from_secs(10), "the entry on the server", || {
        zcard(&mut admin, &owner) == 1
    });
    support::wait_until(Duration::from_secs(5), "its reply held", || {
        proxy.held_replies() >= 1
    });
    proxy.delay_replies(Duration::ZERO);
    proxy.reset();
    let outcome = trying.join().unwrap();
    assert!(
        matches!(outcome, Ok(None)),
        "expected the try made again to miss the lock, got {outcome:?}"
    );
    support::wait_until(
        Duration::from_secs(10),
        "the first attempt's entry taken out",
        || zcard(&mut admin, &time) == 0 && zcard(&mut admin, &owner) == 0,
    );
    assert_eq!(sem.held().unwrap(), 0);
    proxy.delay_sent(b"WATCH", Duration::ZERO);
}
