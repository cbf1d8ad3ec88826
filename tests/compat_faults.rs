//! The compat types under faults (found by a review, 2026-11-27): a release whose
//! pooled connection was killed is sent again on a fresh one, as the leased
//! semaphore's is.

mod support;

use redis_semaphore::Client;
use support::RedisServer;

fn kill_clients(admin: &mut redis::Connection) -> i64 {
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query(admin)
        .unwrap()
}

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
