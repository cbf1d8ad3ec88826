//! `compat::redisson` against a Redisson peer: a Python client written from the
//! protocol description (tests/python/redisson_peer.py, redis-py; not Redisson's code)
//! plays the Java side on the same keys of a private redis-server.
//!
//! Needs `python3` with redis-py (`scripts/test.sh` installs tests/python/requirements.txt).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis_semaphore::compat::redisson::{PublishCommand, RPermitExpirableSemaphore, RSemaphore};
use redis_semaphore::{Client, Error, Permit};
use support::python::{PythonPeer, REPLY};
use support::{RedisServer, command_calls, now_ms, wait_until};

const NAME: &str = "reports";
const CHANNEL: &str = "redisson_sc:{reports}";
const TIMEOUT_KEY: &str = "{reports}:timeout";
const LONG: Duration = Duration::from_secs(60);

/// A running `redisson_peer.py`.
type Py = PythonPeer;

impl PythonPeer {
    /// The peer on semaphore NAME with `args`.
    fn on(url: &str, args: &[&str]) -> Py {
        let mut all = vec!["--url", url, "--name", NAME];
        all.extend_from_slice(args);
        Py::start("redisson_peer.py", &all)
    }

    fn repl(url: &str) -> Py {
        Py::on(url, &["repl"])
    }

    /// A `pes-*` command that answers `GOT <ids>` or `NONE`/`TIMEOUT`.
    /// A blocked acquire's `WAITING` line is skipped.
    fn ids(&mut self, line: &str) -> Option<Vec<String>> {
        let mut reply = self.cmd(line);
        if reply == "WAITING" {
            reply = self.line();
        }
        reply
            .strip_prefix("GOT ")
            .map(|ids| ids.split(' ').map(str::to_owned).collect())
    }
}

fn numsub(conn: &mut redis::Connection) -> i64 {
    let v: (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(CHANNEL)
        .query(conn)
        .unwrap();
    v.1
}

fn evalsha_calls(conn: &mut redis::Connection) -> u64 {
    command_calls(conn).get("evalsha").copied().unwrap_or(0)
}

/// Waits until a Rust waiter is subscribed to the channel and has tried again after
/// subscribing (two acquire calls since `base`), so only a message can wake it now
/// (its re-check timer is an hour).
fn wait_rust_waiting(conn: &mut redis::Connection, base: u64) {
    wait_until(REPLY, "the Rust waiter to subscribe and try again", || {
        numsub(conn) == 1 && evalsha_calls(conn) >= base + 2
    });
}

fn counter(conn: &mut redis::Connection) -> Option<i64> {
    redis::cmd("GET").arg(NAME).query(conn).unwrap()
}

#[test]
fn rsemaphore_each_side_sees_the_others_permits() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let rs = client.redisson_semaphore(NAME);
    let mut py = Py::repl(&server.url());
    let mut conn = server.conn();

    assert_eq!(py.cmd("try-set 3"), "OK True");
    assert!(!rs.try_set_permits(5).unwrap(), "set twice");
    assert_eq!(rs.available_permits().unwrap(), 3);
    assert!(rs.try_acquire(2).unwrap());
    assert_eq!(py.cmd("rs-available"), "OK 1");
    assert_eq!(py.cmd("rs-try 1"), "OK True");
    assert_eq!(py.cmd("rs-try 1"), "OK False");
    assert!(!rs.try_acquire(1).unwrap());
    assert_eq!(rs.available_permits().unwrap(), 0);

    assert_eq!(rs.release(1).unwrap(), 1);
    assert_eq!(py.cmd("rs-try 1"), "OK True");
    assert_eq!(py.cmd("rs-release 3"), "OK 3");
    assert!(rs.release_if_exists(1).unwrap());
    assert_eq!(rs.drain_permits().unwrap(), 4);
    assert_eq!(counter(&mut conn), Some(0));
    assert_eq!(rs.add_permits(-2).unwrap(), -2);
    assert_eq!(py.cmd("rs-available"), "OK -2");
    assert_eq!(py.cmd("rs-release 3"), "OK 1");
    assert!(rs.try_acquire(1).unwrap());

    // A missing counter: releaseIfExists does nothing, trySetPermits with a TTL sets it.
    redis::cmd("DEL").arg(NAME).exec(&mut conn).unwrap();
    assert!(!rs.release_if_exists(1).unwrap());
    assert_eq!(counter(&mut conn), None);
    assert_eq!(rs.drain_permits().unwrap(), 0);
    assert!(rs.try_set_permits_with_ttl(2, LONG).unwrap());
    let ttl: i64 = redis::cmd("PTTL").arg(NAME).query(&mut conn).unwrap();
    assert!(ttl > 0 && ttl <= 60_000, "{ttl}");
    assert_eq!(py.cmd("rs-available"), "OK 2");
    // Only Redisson's keys: nothing of the crate's own layout but the operation keys
    // of the calls that changed the counter, each on its way out (twice the operation
    // timeout of 2 s and eleven seconds at most).
    let mut all: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    all.sort();
    let (ops, rest): (Vec<String>, Vec<String>) = all
        .into_iter()
        .partition(|k| k.starts_with("{reports}:redsem-op:"));
    assert_eq!(rest, vec![NAME.to_owned()]);
    assert!(!ops.is_empty());
    for k in ops {
        let ttl: i64 = redis::cmd("PTTL").arg(&k).query(&mut conn).unwrap();
        assert!((1..=15_000).contains(&ttl), "{k} lives {ttl} ms more");
    }

    // SPUBLISH on request (Redisson on a Redis 7 cluster); PUBLISH by default.
    let calls = command_calls(&mut conn);
    let count =
        |c: &std::collections::HashMap<String, u64>, k: &str| c.get(k).copied().unwrap_or(0);
    rs.clone()
        .with_publish_command(PublishCommand::SPublish)
        .release(1)
        .unwrap();
    let after = command_calls(&mut conn);
    assert_eq!(count(&after, "spublish"), count(&calls, "spublish") + 1);
    assert_eq!(count(&after, "publish"), count(&calls, "publish"));

    // A key of another type is an error, not a panic.
    redis::cmd("SET")
        .arg("wrong")
        .arg("x")
        .exec(&mut conn)
        .unwrap();
    let wrong = client.redisson_semaphore("wrong");
    assert!(wrong.try_acquire(1).is_err());
    assert!(matches!(
        wrong.available_permits(),
        Err(Error::WrongType { .. })
    ));
}

#[test]
fn rsemaphore_a_release_on_one_side_wakes_a_waiter_on_the_other() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let rs = client
        .redisson_semaphore(NAME)
        .with_recheck(Duration::from_secs(3600));
    let mut py = Py::repl(&server.url());
    let mut conn = server.conn();
    assert!(rs.try_set_permits(0).unwrap());

    // Python waits; a Rust release wakes it through the channel.
    py.send("rs-acquire 1 30000");
    assert_eq!(py.line(), "WAITING");
    rs.release(1).unwrap();
    assert_eq!(py.line(), "GOT");
    assert_eq!(counter(&mut conn), Some(0));

    // Rust waits (no re-check for an hour); a Python release wakes it. The script is
    // loaded first, so each try is one EVALSHA.
    assert!(!rs.try_acquire(1).unwrap());
    let base = evalsha_calls(&mut conn);
    let waiter = {
        let rs = rs.clone();
        std::thread::spawn(move || rs.acquire_timeout(2, Duration::from_secs(30)))
    };
    wait_rust_waiting(&mut conn, base);
    // a message for too few permits: the waiter tries, fails, waits again
    assert_eq!(py.cmd("rs-release 1"), "OK 1");
    assert_eq!(py.cmd("rs-release 1"), "OK 2");
    assert!(waiter.join().unwrap().unwrap(), "the Rust waiter timed out");
    assert_eq!(counter(&mut conn), Some(0));
    wait_until(REPLY, "the waiter to unsubscribe", || {
        numsub(&mut conn) == 0
    });

    // A timed-out wait gives up and leaves no subscription behind.
    assert!(!rs.acquire_timeout(1, Duration::from_millis(50)).unwrap());
    wait_until(REPLY, "the waiter to unsubscribe", || {
        numsub(&mut conn) == 0
    });
}

fn pes(client: &Client) -> RPermitExpirableSemaphore {
    client
        .redisson_permit_expirable_semaphore(NAME)
        .with_recheck(Duration::from_secs(3600))
}

fn members(conn: &mut redis::Connection) -> Vec<Vec<u8>> {
    redis::cmd("ZRANGE")
        .arg(TIMEOUT_KEY)
        .arg(0)
        .arg(-1)
        .query(conn)
        .unwrap()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn permit_expirable_each_side_sees_the_others_permits_and_ids_round_trip() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = pes(&client);
    let mut py = Py::repl(&server.url());
    let mut conn = server.conn();

    assert!(sem.try_set_permits(3).unwrap());
    let mut rust: Vec<Permit> = sem.try_acquire_many(2, Some(LONG)).unwrap().unwrap();
    let py_id = py.ids("pes-try 1 60000").expect("Python got no permit")[0].clone();
    assert!(py.ids("pes-try 1 60000").is_none(), "Python got a 4th of 3");
    assert!(
        sem.try_acquire(None).unwrap().is_none(),
        "Rust got a 4th of 3"
    );
    assert_eq!(sem.available_permits().unwrap(), 0);
    assert_eq!(sem.acquired_permits().unwrap(), 3);
    assert_eq!(sem.permits().unwrap(), 3);
    assert_eq!(py.cmd("pes-acquired"), "OK 3");

    // The zset holds 16 raw bytes per id, the API the lowercase hex form.
    let mut stored: Vec<String> = members(&mut conn)
        .iter()
        .map(|m| {
            assert_eq!(m.len(), 16, "not a raw id: {m:?}");
            hex(m)
        })
        .collect();
    stored.sort();
    let mut ids: Vec<String> = rust.iter().map(|p| p.id().to_owned()).collect();
    ids.push(py_id.clone());
    ids.sort();
    assert_eq!(stored, ids);
    for p in &rust {
        assert_eq!(p.id().len(), 32);
        assert_eq!(p.token(), 0);
        assert!(p.slots().is_empty());
        let left = sem.lease_time(p.id()).unwrap().unwrap();
        assert!(left > Duration::from_secs(50) && left <= LONG, "{left:?}");
    }

    // Each side releases the other's permit by its hex id.
    let rust_one = rust.pop().unwrap();
    assert_eq!(py.cmd(&format!("pes-release {}", rust_one.id())), "OK True");
    assert!(matches!(rust_one.release(), Err(Error::PermitLost { .. })));
    sem.release(&py_id).unwrap();
    assert!(!sem.try_release(&py_id).unwrap(), "released twice");
    assert!(matches!(
        sem.release(&py_id.to_uppercase()),
        Err(Error::PermitLost { .. })
    ));
    assert_eq!(py.cmd("pes-available"), "OK 2");

    // A permit without lease reports no lease; update_lease_time gives it one.
    let forever = sem.try_acquire(None).unwrap().unwrap();
    assert_eq!(sem.lease_time(forever.id()).unwrap(), None);
    assert!(sem.update_lease_time(forever.id(), Some(LONG)).unwrap());
    assert!(sem.lease_time(forever.id()).unwrap().is_some());
    forever.refresh().unwrap();
    drop(forever);
    drop(rust);
    assert_eq!(sem.available_permits().unwrap(), 3);
    assert_eq!(sem.acquired_permits().unwrap(), 0);
    assert!(members(&mut conn).is_empty());

    // set_permits and add_permits move the total, seen by both.
    sem.set_permits(5).unwrap();
    assert_eq!(py.cmd("pes-available"), "OK 5");
    assert_eq!(sem.add_permits(-1).unwrap(), 4);
    assert_eq!(sem.permits().unwrap(), 4);
}

#[test]
fn permit_expirable_expired_permits_are_reclaimed_by_the_other_side() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = pes(&client);
    let mut py = Py::repl(&server.url());
    let mut conn = server.conn();
    assert!(sem.try_set_permits(1).unwrap());

    // Python takes the only permit for 300 ms and never releases it: the Rust waiter
    // (no message comes, its re-check is an hour away) retries at the deadline the
    // acquire script reports, and reclaims it.
    let py_id = py.ids("pes-try 1 300").unwrap()[0].clone();
    let started = Instant::now();
    let permit = sem
        .acquire_timeout(Duration::from_secs(20), Some(LONG))
        .unwrap()
        .expect("Rust did not reclaim Python's expired permit");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(members(&mut conn).len(), 1);
    assert_eq!(py.cmd(&format!("pes-release {py_id}")), "OK False");
    drop(permit);

    // The other way: Rust's permit of 300 ms is left to expire; Python reclaims it.
    let rust = sem
        .try_acquire(Some(Duration::from_millis(300)))
        .unwrap()
        .unwrap();
    let rust_id = rust.id().to_owned();
    assert!(py.ids("pes-try 1 60000").is_none());
    let py_again = py
        .ids("pes-acquire 1 60000 20000")
        .expect("Python did not reclaim Rust's expired permit");
    assert!(!sem.try_release(&rust_id).unwrap());
    // the guard finds its permit gone, and says so
    assert!(matches!(rust.release(), Err(Error::PermitLost { .. })));
    assert!(matches!(
        sem.lease_time(&rust_id),
        Err(Error::PermitLost { .. })
    ));

    // An expired, not yet reclaimed permit: released all the same, reported late.
    assert_eq!(py.cmd(&format!("pes-release {}", py_again[0])), "OK True");
    let late = sem
        .try_acquire(Some(Duration::from_millis(50)))
        .unwrap()
        .unwrap();
    let late_id = late.id().to_owned();
    std::mem::forget(late);
    wait_until(REPLY, "the lease to pass", || {
        let score: f64 = redis::cmd("ZSCORE")
            .arg(TIMEOUT_KEY)
            .arg(decode(&late_id))
            .query(&mut conn)
            .unwrap();
        (score as i64) < now_ms()
    });
    assert!(matches!(
        sem.release(&late_id),
        Err(Error::LeaseExpired { .. })
    ));
    assert_eq!(sem.available_permits().unwrap(), 1);
}

fn decode(hex: &str) -> Vec<u8> {
    (0..16)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

#[test]
fn permit_expirable_a_release_on_one_side_wakes_a_waiter_on_the_other() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = pes(&client);
    let mut py = Py::repl(&server.url());
    let mut conn = server.conn();
    assert!(sem.try_set_permits(1).unwrap());

    // Python waits for a permit held without lease; dropping Rust's guard wakes it.
    let held = sem.try_acquire(None).unwrap().unwrap();
    py.send("pes-acquire 1 -1 30000");
    assert_eq!(py.line(), "WAITING");
    drop(held);
    let py_id = py
        .line()
        .strip_prefix("GOT ")
        .expect("Python not woken")
        .to_owned();

    // Rust waits (no lease runs, so only a message can wake it); Python releases.
    let base = evalsha_calls(&mut conn);
    let waiter = {
        let sem = sem.clone();
        std::thread::spawn(move || sem.acquire_timeout(Duration::from_secs(30), Some(LONG)))
    };
    wait_rust_waiting(&mut conn, base);
    assert_eq!(py.cmd(&format!("pes-release {py_id}")), "OK True");
    let permit = waiter.join().unwrap().unwrap().expect("Rust not woken");
    assert_eq!(sem.acquired_permits().unwrap(), 1);
    permit.release().unwrap();
    assert_eq!(sem.available_permits().unwrap(), 1);
}

#[test]
fn permit_expirable_accepts_pre_3_17_hex_members_on_release_when_asked() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = pes(&client);
    let mut py = Py::repl(&server.url());
    let mut conn = server.conn();
    assert!(sem.try_set_permits(2).unwrap());
    let old = py.ids("pes-try-legacy 1 60000").unwrap()[0].clone();
    assert_eq!(members(&mut conn), vec![old.as_bytes().to_vec()]);
    assert!(matches!(sem.release(&old), Err(Error::PermitLost { .. })));
    sem.clone().with_hex_id_release(true).release(&old).unwrap();
    assert!(members(&mut conn).is_empty());
    assert_eq!(sem.available_permits().unwrap(), 2);
}

/// A pre-3.17 member is the id as Redisson printed it, lowercase hex; the id a
/// release takes may be in either case (the 3.17 raw form is found from either), but
/// the hex member was looked up with the id exactly as given: an uppercase id (as a
/// log or a user's tool may show it) did not release a pre-3.17 permit, which stayed
/// held (`PermitLost`, and without a lease for good).
#[test]
fn permit_expirable_releases_a_pre_3_17_hex_member_given_its_id_in_upper_case() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = pes(&client).with_hex_id_release(true);
    let mut py = Py::repl(&server.url());
    let mut conn = server.conn();
    assert!(sem.try_set_permits(2).unwrap());
    let old = py.ids("pes-try-legacy 1 60000").unwrap()[0].clone();
    assert_eq!(members(&mut conn), vec![old.as_bytes().to_vec()]);
    let r = sem.release(&old.to_uppercase());
    assert!(r.is_ok(), "{r:?}");
    assert!(members(&mut conn).is_empty());
    assert_eq!(sem.available_permits().unwrap(), 2);
}

#[test]
fn permit_expirable_a_counter_of_another_type_fails_release_and_reclaim_before_any_write() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = pes(&client);
    let mut conn = server.conn();
    assert!(sem.try_set_permits(3).unwrap());
    let held = sem.try_acquire(Some(LONG)).unwrap().unwrap();
    let short = sem
        .try_acquire(Some(Duration::from_millis(50)))
        .unwrap()
        .unwrap();
    let (held_id, short_id) = (held.id().to_owned(), short.id().to_owned());
    std::mem::forget(held);
    std::mem::forget(short);
    wait_until(REPLY, "the short lease to pass", || {
        let score: f64 = redis::cmd("ZSCORE")
            .arg(TIMEOUT_KEY)
            .arg(decode(&short_id))
            .query(&mut conn)
            .unwrap();
        (score as i64) < now_ms()
    });
    let before = members(&mut conn);
    assert_eq!(before.len(), 2);

    for (wrong, text) in [(true, ""), (false, "1.5")] {
        redis::cmd("DEL").arg(NAME).exec(&mut conn).unwrap();
        if wrong {
            redis::cmd("HSET")
                .arg(NAME)
                .arg("f")
                .arg("v")
                .exec(&mut conn)
                .unwrap();
        } else {
            redis::cmd("SET")
                .arg(NAME)
                .arg(text)
                .exec(&mut conn)
                .unwrap();
        }
        // release: used to ZREM the permit, then fail in INCRBY (the permit lost)
        let r = sem.release(&held_id);
        assert!(matches!(r, Err(Error::WrongType { .. })), "{r:?}");
        assert_eq!(members(&mut conn), before, "release wrote");
        // reclaim, all expired (a read) and at most n (an acquire): used to ZREM the
        // expired permit, then fail
        let r = sem.available_permits();
        assert!(matches!(r, Err(Error::WrongType { .. })), "{r:?}");
        assert_eq!(members(&mut conn), before, "reclaim(all) wrote");
        let r = sem.try_acquire(Some(LONG));
        assert!(
            matches!(r, Err(Error::WrongType { .. })),
            "{:?}",
            r.map(|_| ())
        );
        assert_eq!(members(&mut conn), before, "reclaim(n) wrote");
        let r = sem.lease_time(&held_id);
        assert!(r.is_err(), "{r:?}");
        assert_eq!(members(&mut conn), before, "reclaim(all) wrote");
    }
    // with a counter again, both go through
    redis::cmd("SET").arg(NAME).arg(1).exec(&mut conn).unwrap();
    sem.release(&held_id).unwrap();
    assert_eq!(counter(&mut conn), Some(2));
    assert_eq!(
        sem.available_permits().unwrap(),
        3,
        "the expired one reclaimed"
    );
    assert!(members(&mut conn).is_empty());
}

#[test]
fn a_publish_refused_by_acl_does_not_fail_a_write_that_was_made() {
    // the scripts publish after their writes: with redis.call, a refused PUBLISH
    // failed the call although the write stood
    let server = support::AclServer::start("admin-pw");
    server.add_user(
        "nopub",
        "user-pw",
        &["~*", "&*", "+@all", "-publish", "-spublish"],
    );
    let client = Client::open(server.url_as("nopub", "user-pw")).unwrap();
    let rs = client.redisson_semaphore(NAME);
    assert!(rs.try_set_permits(1).unwrap());
    assert_eq!(rs.release(2).unwrap(), 3);
    assert_eq!(rs.add_permits(1).unwrap(), 4);
    let sem = client.redisson_permit_expirable_semaphore("pes-nopub");
    assert!(sem.try_set_permits(1).unwrap());
    let p = sem
        .try_acquire(Some(Duration::from_millis(50)))
        .unwrap()
        .unwrap();
    let id = p.id().to_owned();
    std::mem::forget(p);
    // a read reclaims the permit once its 50 ms lease has ended, and publishes the
    // counter (which this user may not: the publish fails quietly)
    wait_until(
        Duration::from_secs(5),
        "the expired permit reclaimed",
        || sem.available_permits().unwrap() == 1,
    );
    let p = sem.try_acquire(Some(LONG)).unwrap().unwrap();
    p.release().unwrap();
    assert!(matches!(sem.release(&id), Err(Error::PermitLost { .. })));
    sem.set_permits(3).unwrap();
    assert_eq!(sem.add_permits(1).unwrap(), 4);
    // the publishes were refused all the same
    let log: Vec<redis::Value> = redis::cmd("ACL")
        .arg("LOG")
        .query(&mut server.admin_conn())
        .unwrap();
    assert!(
        format!("{log:?}").contains("publish"),
        "no PUBLISH refusal logged: {log:?}"
    );
}

/// What a contention run saw.
#[derive(Debug)]
struct Seen {
    rust_grants: u64,
    py_grants: u64,
    most: i64,
}

/// Two Python peers and three Rust threads take, hold and give back one permit of a
/// limit-3 semaphore in a loop for `run`; around each hold they INCR and DECR the key
/// `inside`, and the highest value anyone saw is the most holders at once.
fn contend(server: &RedisServer, kind: &str, run: Duration) -> Seen {
    const LIMIT: u32 = 3;
    let client = Client::open(server.url()).unwrap();
    let rs: RSemaphore = client.redisson_semaphore(NAME);
    let pes = pes(&client);
    if kind == "rs" {
        assert!(rs.try_set_permits(LIMIT).unwrap());
    } else {
        assert!(pes.try_set_permits(LIMIT).unwrap());
    }
    let mut pys: Vec<Py> = (0..2)
        .map(|_| Py::on(&server.url(), &["contend", kind, "inside"]))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicI64::new(0));
    let grants = Arc::new(AtomicU64::new(0));
    for py in &mut pys {
        py.send("go");
    }
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let (stop, most, grants) = (stop.clone(), most.clone(), grants.clone());
            let (rs, pes, kind) = (rs.clone(), pes.clone(), kind.to_owned());
            let mut conn = server.conn();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let permit = if kind == "rs" {
                        if !rs.try_acquire(1).unwrap() {
                            continue;
                        }
                        None
                    } else {
                        match pes.try_acquire(Some(LONG)).unwrap() {
                            Some(p) => Some(p),
                            None => continue,
                        }
                    };
                    grants.fetch_add(1, Ordering::Relaxed);
                    let n: i64 = redis::cmd("INCR").arg("inside").query(&mut conn).unwrap();
                    most.fetch_max(n, Ordering::Relaxed);
                    let _: i64 = redis::cmd("DECR").arg("inside").query(&mut conn).unwrap();
                    match permit {
                        Some(p) => p.release().unwrap(),
                        None => {
                            rs.release(1).unwrap();
                        }
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(run); // the length of the workload, not a synchronisation
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let mut py_grants = 0;
    for py in &mut pys {
        let line = py.cmd("stop");
        let rest = line.strip_prefix("RESULT ").expect(&line);
        for kv in rest.split(' ') {
            let (k, v) = kv.split_once('=').unwrap();
            let v: i64 = v.parse().unwrap();
            match k {
                "grants" => py_grants += v as u64,
                "most" => {
                    most.fetch_max(v, Ordering::Relaxed);
                }
                _ => {}
            }
        }
    }
    Seen {
        rust_grants: grants.load(Ordering::Relaxed),
        py_grants,
        most: most.load(Ordering::Relaxed),
    }
}

#[test]
fn together_they_never_exceed_the_permits() {
    for kind in ["rs", "pes"] {
        let server = RedisServer::start();
        let seen = contend(&server, kind, Duration::from_millis(1500));
        eprintln!("{kind}: {seen:?} (limit 3)");
        assert!(
            seen.rust_grants > 0 && seen.py_grants > 0,
            "{kind}: {seen:?}"
        );
        assert!(seen.most <= 3, "{kind}: over the limit: {seen:?}");
        assert!(seen.most >= 2, "{kind}: holders never overlapped: {seen:?}");
        let mut conn = server.conn();
        assert_eq!(counter(&mut conn), Some(3), "{kind}: permits lost");
        if kind == "pes" {
            assert!(members(&mut conn).is_empty(), "{kind}: leases left");
        }
    }
}

/// The background renewal of several permits of one semaphore is one script call per
/// tick: each call renews all three (three `ZADD`s per run of the lease script, whose
/// runs its one `ZCOUNT` counts: an `EVALSHA` refused with NOSCRIPT runs nothing),
/// not one call per permit.
#[test]
fn permit_expirable_renewal_of_several_permits_is_one_call_per_tick() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = pes(&client).with_auto_refresh(true);
    assert!(sem.try_set_permits(3).unwrap());
    let held = sem
        .try_acquire_many(3, Some(Duration::from_millis(300)))
        .unwrap()
        .unwrap();
    let mut conn = server.conn();
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .exec(&mut conn)
        .unwrap();
    // only the renewals run now (one every 100 ms, a third of the lease)
    wait_until(REPLY, "three renewal ticks", || {
        command_calls(&mut conn).get("zcount").copied().unwrap_or(0) >= 3
    });
    let calls = command_calls(&mut conn);
    let (runs, zadds) = (calls["zcount"], calls["zadd"]);
    assert_eq!(zadds, 3 * runs, "{calls:?}");
    assert!(held.iter().all(|p| !p.is_lost()));
}

#[test]
fn permit_expirable_permits_are_kept_alive_with_auto_refresh_and_their_loss_is_seen() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = pes(&client).with_auto_refresh(true);
    let mut py = Py::repl(&server.url());
    assert!(sem.try_set_permits(1).unwrap());
    let permit = sem
        .try_acquire(Some(Duration::from_millis(300)))
        .unwrap()
        .unwrap();
    // held for several of its leases: the background thread renews it with
    // updateLeaseTime, so the Java side (here the Python peer) finds no permit free
    std::thread::sleep(Duration::from_millis(1_200));
    assert!(!permit.is_lost());
    assert!(
        py.ids("pes-try 1 60000").is_none(),
        "the permit is still held"
    );
    let left = sem.lease_time(permit.id()).unwrap().unwrap();
    assert!(
        left > Duration::ZERO && left <= Duration::from_millis(300),
        "{left:?}"
    );
    // the other side releases it: the next renewal finds it gone
    assert_eq!(py.cmd(&format!("pes-release {}", permit.id())), "OK True");
    let reason = permit
        .lost()
        .recv_timeout(REPLY)
        .expect("lost fires once a renewal finds the permit gone");
    assert_eq!(reason, redis_semaphore::LostReason::Released);
    // without auto refresh (the default), a lease simply runs out
    let plain = pes(&client)
        .try_acquire(Some(Duration::from_millis(200)))
        .unwrap()
        .unwrap();
    wait_until(REPLY, "the plain permit's lease to run out", || {
        sem.lease_time(plain.id()).is_err() || plain.is_lost()
    });
}

/// Review: drainPermits on a counter that is not UTF-8 answered with an error line of
/// the counter's raw bytes, which the client cannot parse: the call failed with a parse
/// error instead of `WrongType`, and the pooled connection, with the rest of that reply
/// still in it, answered every later call out of step. The script now escapes the
/// bytes, and the pool drops a connection whose reply could not be parsed.
#[test]
fn draining_a_counter_that_is_not_utf8_is_a_wrong_type_and_the_connection_stays_usable() {
    let (_server, client) = support::non_utf8_at("bytes");
    let bad = client.redisson_semaphore("bytes");
    let good = client.redisson_semaphore("fine");
    for _ in 0..2 {
        match bad.drain_permits() {
            Err(Error::WrongType { name, .. }) => assert_eq!(name, "bytes"),
            other => panic!("drain_permits on a non-UTF-8 counter gave {other:?}"),
        }
        good.release(1).unwrap();
    }
    assert_eq!(good.available_permits().unwrap(), 2);
}

/// A counter holding text that is no integer (`SET reports x`, another program's value
/// under the semaphore's name) is a `WrongType` error naming the key and the value for
/// every operation of both Redisson types, and nothing is written. The tries failed
/// with a Lua error ("attempt to compare number with nil"), the RSemaphore release with
/// the INCRBY's "value is not an integer", `available_permits` with an unexpected-reply
/// error, and the permit-expirable reads with a nil conversion error.
#[test]
fn a_counter_that_is_no_integer_is_a_wrong_type_error_naming_the_key_for_every_operation() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = Client::open(server.url()).unwrap();
    let rs = client.redisson_semaphore(NAME);
    let pes = pes(&client);
    redis::cmd("SET")
        .arg(NAME)
        .arg("x\nnot-a-number")
        .exec(&mut conn)
        .unwrap();
    type Call<'a> = (&'static str, Box<dyn Fn() -> Result<(), Error> + 'a>);
    let calls: Vec<Call> = vec![
        (
            "RSemaphore try_acquire",
            Box::new(|| rs.try_acquire(1).map(drop)),
        ),
        ("RSemaphore release", Box::new(|| rs.release(1).map(drop))),
        (
            "RSemaphore available_permits",
            Box::new(|| rs.available_permits().map(drop)),
        ),
        (
            "RSemaphore add_permits",
            Box::new(|| rs.add_permits(2).map(drop)),
        ),
        (
            "RSemaphore drain_permits",
            Box::new(|| rs.drain_permits().map(drop)),
        ),
        (
            "RPermitExpirableSemaphore try_acquire",
            Box::new(|| pes.try_acquire(None).map(drop)),
        ),
        (
            "RPermitExpirableSemaphore available_permits",
            Box::new(|| pes.available_permits().map(drop)),
        ),
        (
            "RPermitExpirableSemaphore set_permits",
            Box::new(|| pes.set_permits(3)),
        ),
        (
            "RPermitExpirableSemaphore add_permits",
            Box::new(|| pes.add_permits(1).map(drop)),
        ),
    ];
    for (what, call) in calls {
        match call() {
            Err(Error::WrongType { name, source }) => {
                assert_eq!(name, NAME, "{what}");
                let text = source.to_string();
                assert!(
                    text.contains(NAME) && text.contains("must be an integer"),
                    "{what}: {text}"
                );
                assert!(!text.contains('\n'), "{what}: {text:?}");
            }
            other => panic!("{what}: {other:?}"),
        }
        let stored: String = redis::cmd("GET").arg(NAME).query(&mut conn).unwrap();
        assert_eq!(stored, "x\nnot-a-number", "{what} wrote");
    }
}

/// The counter checks name the key and the value on the paths through the first
/// write's `INCRBY` too (the permit-expirable release, and the reclaim of an expired
/// lease before a read), refuse integer text `INCRBY` refuses (`007`, 20 digits: the
/// tries used to fail with the INCRBY's "not an integer", `add_permits` stored a
/// wrapped value), and leave any other refusal of that `INCRBY` as it is: on a replica
/// a release is `READONLY` (retryable, what the failover handling looks for), not a
/// wrong type.
#[test]
fn counter_checks_name_the_key_on_every_path_and_pass_other_refusals_on() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = Client::open(server.url()).unwrap();
    let rs = client.redisson_semaphore(NAME);
    let pes = pes(&client);
    let named = |what: &str, r: Result<(), Error>| match r {
        Err(Error::WrongType { source, .. }) => {
            let text = source.to_string();
            assert!(text.contains(NAME), "{what}: {text}");
            assert!(text.contains("must be an integer"), "{what}: {text}");
        }
        other => panic!("{what}: {other:?}"),
    };
    for stored in ["007", "-0", "99999999999999999999", "+5"] {
        redis::cmd("SET")
            .arg(NAME)
            .arg(stored)
            .exec(&mut conn)
            .unwrap();
        named(stored, rs.try_acquire(1).map(drop));
        named(stored, rs.add_permits(1).map(drop));
        named(stored, rs.release(1).map(drop));
        named(stored, rs.available_permits().map(drop));
        let now: String = redis::cmd("GET").arg(NAME).query(&mut conn).unwrap();
        assert_eq!(now, stored, "nothing written");
    }

    // a held permit, then the counter overwritten: the release's INCRBY path
    redis::cmd("DEL").arg(NAME).exec(&mut conn).unwrap();
    assert!(pes.try_set_permits(2).unwrap());
    let held = pes.try_acquire(None).unwrap().expect("a permit");
    let short = pes
        .try_acquire(Some(Duration::from_millis(1)))
        .unwrap()
        .expect("a permit with a 1 ms lease");
    std::mem::forget(short); // its lease ends by itself: the reclaim path below
    wait_until(Duration::from_secs(5), "the 1 ms lease ends", || {
        let ended: i64 = redis::cmd("ZCOUNT")
            .arg(TIMEOUT_KEY)
            .arg(0)
            .arg(now_ms() - 1)
            .query(&mut conn)
            .unwrap();
        ended == 1
    });
    redis::cmd("SET")
        .arg(NAME)
        .arg("x")
        .exec(&mut conn)
        .unwrap();
    named(
        "the reclaim of an expired lease",
        pes.available_permits().map(drop),
    );
    named("a permit-expirable release", pes.release(held.id()));
    drop(held); // (its own release fails the same way; Drop logs it)

    // on a replica: READONLY, as the server says it
    let (primary, replica) = support::primary_and_replica();
    let mut pc = primary.conn();
    redis::cmd("SET").arg(NAME).arg(5).exec(&mut pc).unwrap();
    let mut rc = replica.conn();
    wait_until(
        Duration::from_secs(5),
        "the replica has the counter",
        || {
            let v: Option<String> = redis::cmd("GET").arg(NAME).query(&mut rc).unwrap();
            v.is_some()
        },
    );
    let on_replica = Client::open(replica.url()).unwrap();
    let r = on_replica.redisson_semaphore(NAME).release(1);
    match &r {
        Err(e) => {
            assert!(!matches!(e, Error::WrongType { .. }), "{e:?}");
            assert!(e.to_string().contains("read only replica"), "{e}");
            assert!(e.is_retryable(), "{e:?}");
        }
        Ok(v) => panic!("a release on a replica: {v}"),
    }
}

// Found by a review (2026-11-27, fourth session): each failed before its mend.

fn zcard(conn: &mut redis::Connection) -> i64 {
    redis::cmd("ZCARD").arg(TIMEOUT_KEY).query(conn).unwrap()
}

fn stored(conn: &mut redis::Connection) -> String {
    redis::cmd("GET").arg(NAME).query(conn).unwrap()
}

/// A counter of 16 to 19 digits (integer text INCRBY takes, but past the 15 digits the
/// scripts promise to refuse) with an expired lease in the zset: the reclaim before a
/// read or an acquire ran its INCRBY, its ZREM and its PUBLISH, and only then did the
/// counter check refuse the value, so the script failed after its first write (the
/// counter raised, the expired member gone, a wake-up announced) while the call
/// returned `WrongType`. Nothing may be written when it fails.
#[test]
fn a_reclaim_on_a_counter_past_15_digits_fails_before_any_write() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = Client::open(server.url()).unwrap();
    let pes = client.redisson_permit_expirable_semaphore(NAME);
    for (value, what) in [
        ("1000000000000000000", "19 digits"),
        ("9999999999999999", "16 digits, which +1 takes to 17"),
    ] {
        for call in ["available_permits", "try_acquire"] {
            redis::cmd("SET")
                .arg(NAME)
                .arg(value)
                .exec(&mut conn)
                .unwrap();
            redis::cmd("DEL").arg(TIMEOUT_KEY).exec(&mut conn).unwrap();
            // an expired lease (deadline 1 ms after the epoch), id of 16 raw bytes
            redis::cmd("ZADD")
                .arg(TIMEOUT_KEY)
                .arg(1)
                .arg(&[7u8; 16][..])
                .exec(&mut conn)
                .unwrap();
            let r = match call {
                "available_permits" => pes.available_permits().map(drop),
                _ => pes.try_acquire(None).map(drop),
            };
            assert!(
                matches!(r, Err(Error::WrongType { .. })),
                "{call} on {what}: {r:?}"
            );
            assert_eq!(
                stored(&mut conn),
                value,
                "{call} on {what}: the counter was written"
            );
            assert_eq!(
                zcard(&mut conn),
                1,
                "{call} on {what}: the expired lease was removed"
            );
        }
    }
}

/// A counter of 16 digits passes the counter check (which means "at most 15 digits,
/// exact as a Lua number") and add_permits computed the new value in Lua doubles:
/// 9007199254740993 + 2 was stored (and returned) as 9007199254740994. It must store
/// the exact sum or refuse the counter with nothing written.
#[test]
fn add_permits_on_a_16_digit_counter_stores_the_exact_sum_or_refuses() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = Client::open(server.url()).unwrap();
    let rs = client.redisson_semaphore(NAME);
    let value = "9007199254740993";
    redis::cmd("SET")
        .arg(NAME)
        .arg(value)
        .exec(&mut conn)
        .unwrap();
    match rs.add_permits(2) {
        Ok(after) => {
            assert_eq!(after, 9_007_199_254_740_995, "the sum returned");
            assert_eq!(stored(&mut conn), "9007199254740995", "the sum stored");
        }
        Err(Error::WrongType { .. }) => assert_eq!(stored(&mut conn), value, "nothing written"),
        Err(e) => panic!("add_permits: {e:?}"),
    }
}

/// A permit-expirable acquire without lease whose reply came after the operation
/// timeout: the script had run (the id is in the lease zset and the counter went down),
/// the call failed with a timeout, and nothing ever gave the permit back, although the
/// client made the id itself. Without a lease nothing reclaims it: the semaphore stays
/// one permit short for good (here: no permit left at all). The leased semaphore gives
/// back such a grant ("an acquire whose reply was lost ... is given back by the
/// client's background thread"); the permit-expirable one knows its ids and can release
/// them (release by id is safe at any time: an id nobody holds changes nothing).
#[test]
fn a_timed_out_permit_expirable_acquire_without_lease_is_given_back() {
    const OP: Duration = Duration::from_millis(300);
    let (server, proxy, client) = support::proxied(OP);
    let mut conn = server.conn();
    let pes = client.redisson_permit_expirable_semaphore(NAME);
    assert!(pes.try_set_permits(1).unwrap());
    // the acquire and release scripts in the server's cache (no NOSCRIPT round trip)
    pes.try_acquire(None)
        .unwrap()
        .expect("a permit")
        .release()
        .unwrap();
    let zadds = |conn: &mut redis::Connection| {
        support::command_calls(conn)
            .get("zadd")
            .copied()
            .unwrap_or(0)
    };
    let before = zadds(&mut conn);
    proxy.delay_replies(Duration::from_millis(800));
    let r = pes.try_acquire(None);
    proxy.delay_replies(Duration::ZERO);
    match &r {
        Err(e) => assert!(e.is_timeout(), "{e:?}"),
        Ok(p) => panic!("expected a timeout, got {p:?}"),
    }
    // the script ran (its ZADD): the grant was made, under an id only the client knew
    wait_until(Duration::from_secs(5), "the acquire script ran", || {
        zadds(&mut conn) == before + 1
    });
    let direct = Client::open(server.url()).unwrap();
    let other = direct.redisson_permit_expirable_semaphore(NAME);
    wait_until(
        Duration::from_secs(10),
        "the timed-out grant is given back",
        || zcard(&mut conn) == 0,
    );
    assert!(
        other.try_acquire(None).unwrap().is_some(),
        "the permit is free again"
    );
}

fn zscore(conn: &mut redis::Connection, id: &[u8]) -> Option<i64> {
    let s: Option<f64> = redis::cmd("ZSCORE")
        .arg(TIMEOUT_KEY)
        .arg(id)
        .query(conn)
        .unwrap();
    s.map(|s| s as i64)
}

/// Auto-refreshed permit-expirable permits were grouped by name and lease only, and a
/// group kept the renewer of the handle that made it, which holds that handle weakly.
/// A handle made per call (`client.redisson_permit_expirable_semaphore(name)` makes no
/// network call, so a helper may well make one each time) whose permit was released
/// left its group behind until the group came due; the next handle's permit joined
/// that group, and its renewals found the first handle gone and answered "nothing to
/// renew": the refresher took that as renewed. The permit's lease ran out in Redis while
/// the permit kept saying it was valid, and another client got the only permit: two
/// holders of a one-permit semaphore (DESIGN "Under faults": never more valid holders
/// than permits).
#[test]
fn an_auto_refreshed_permit_is_renewed_after_the_handle_that_made_its_group_is_gone() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = Client::open(server.url()).unwrap();
    let lease = Duration::from_millis(900);
    let handle = || {
        client
            .redisson_permit_expirable_semaphore(NAME)
            .with_auto_refresh(true)
    };
    assert!(handle().try_set_permits(1).unwrap());
    // a handle of its own per call, as a helper would make it
    handle()
        .try_acquire(Some(lease))
        .unwrap()
        .expect("a permit")
        .release()
        .unwrap();
    let permit = handle()
        .try_acquire(Some(lease))
        .unwrap()
        .expect("a permit");
    let id = decode(permit.id());
    let first = zscore(&mut conn, &id).expect("held");
    let other = Client::open(server.url()).unwrap();
    let other = other.redisson_permit_expirable_semaphore(NAME);
    // either its deadline in Redis moves on twice over (renewed), or it passes while
    // the permit still says it is valid
    support::wait_for(Duration::from_secs(10), "two renewals or a lapse", || {
        match zscore(&mut conn, &id) {
            Some(s) if s >= first + 2 * lease.as_millis() as i64 => Some(()),
            Some(s) if support::now_ms() <= s + 20 => None,
            lapsed => {
                if permit.is_lost() || permit.lease_left().is_zero() {
                    return Some(()); // known lost: no second valid holder
                }
                let second = other.try_acquire(Some(Duration::from_secs(60))).unwrap();
                panic!(
                    "the lease ended in Redis ({lapsed:?}, first deadline {first}) while the \
                     permit says it is valid ({:?} left); another client got the only \
                     permit: {:?}",
                    permit.lease_left(),
                    second.as_ref().map(|p| p.id().to_owned())
                );
            }
        }
    });
    assert!(!permit.is_lost(), "renewed, not lost");
}

fn kill_subscribers(conn: &mut redis::Connection) -> i64 {
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(conn)
        .unwrap()
}

/// Regression: a blocked acquire whose subscription was lost (CLIENT KILL TYPE pubsub,
/// a dropped connection) polled every 50 ms for the rest of its wait, for ever with
/// `acquire()`, and never subscribed again (with a pool given to `from_pool`, the dead
/// connection stayed checked out all that time). It now subscribes again (at most once
/// a second) and a release wakes it through the channel.
#[test]
fn a_waiter_whose_subscription_is_killed_subscribes_again() {
    let server = RedisServer::start();
    let own = Client::open(server.url()).unwrap();
    let pool = r2d2::Pool::builder()
        .max_size(4)
        .build(server.client())
        .unwrap();
    let given = Client::from_pool(pool.clone()).unwrap();
    for (what, client) in [("own pool", &own), ("from_pool", &given)] {
        let rs = client
            .redisson_semaphore(NAME)
            .with_recheck(Duration::from_secs(3600));
        let mut conn = server.conn();
        let _: () = redis::cmd("DEL").arg(NAME).query(&mut conn).unwrap();
        assert!(rs.try_set_permits(0).unwrap());
        assert!(!rs.try_acquire(1).unwrap());
        let base = evalsha_calls(&mut conn);
        let waiter = {
            let rs = rs.clone();
            std::thread::spawn(move || rs.acquire_timeout(1, Duration::from_secs(60)))
        };
        wait_rust_waiting(&mut conn, base);
        assert_eq!(kill_subscribers(&mut conn), 1, "{what}");
        wait_until(
            REPLY,
            &format!("the waiter to subscribe again ({what})"),
            || numsub(&mut conn) == 1,
        );
        assert_eq!(rs.release(1).unwrap(), 1);
        assert!(waiter.join().unwrap().unwrap(), "{what}: not woken");
        assert_eq!(counter(&mut conn), Some(0));
        wait_until(REPLY, "the waiter to unsubscribe", || {
            numsub(&mut conn) == 0
        });
    }
    // every connection of the given pool is back (the killed one discarded)
    wait_until(REPLY, "the given pool's connections to be back", || {
        let s = pool.state();
        s.idle_connections == s.connections
    });
}

/// Regression: a lease scored below 0 in `{NAME}:timeout` (written by hand, or
/// `-inf`) is never reclaimed, yet the acquire script reports it as the nearest lease
/// deadline; a blocked acquire retried at it every few milliseconds for its whole wait
/// (57 tries in 500 ms, for ever with `acquire`). It now waits for a message (or its
/// re-check) as when no lease runs. And a silent wait tries twice in all (before and
/// after subscribing): each read of the channel ended a little before its time (the
/// read timeout is set short), and each such end made one more try near the wait's
/// end (4 tries in 500 ms).
#[test]
fn a_silent_wait_does_not_try_again_before_its_time() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = pes(&client);
    let mut conn = server.conn();
    assert!(sem.try_set_permits(0).unwrap());
    for score in [None, Some("-1"), Some("-inf")] {
        let _: () = redis::cmd("DEL").arg(TIMEOUT_KEY).query(&mut conn).unwrap();
        if let Some(score) = score {
            let _: i64 = redis::cmd("ZADD")
                .arg(TIMEOUT_KEY)
                .arg(score)
                .arg(&[7u8; 16][..])
                .query(&mut conn)
                .unwrap();
        }
        // the script is loaded: each try is one EVALSHA
        assert!(sem.try_acquire(None).unwrap().is_none());
        let base = evalsha_calls(&mut conn);
        let got = sem
            .acquire_timeout(Duration::from_millis(500), Some(LONG))
            .unwrap();
        assert!(got.is_none());
        let tries = evalsha_calls(&mut conn) - base;
        // one try, one after subscribing (the re-check is an hour)
        assert_eq!(tries, 2, "lease score {score:?}: tries in a 500 ms wait");
    }
}

/// An expirable permit's deadline in the lease zset is the acquiring client's clock
/// read in whole milliseconds plus the lease in whole milliseconds (Redisson's
/// `System.currentTimeMillis() + lease`), and any client on the same clock reclaims
/// the permit as soon as its own reading reaches that score. The permit counted its
/// whole lease, sub-millisecond part included, from the moment its call was sent: it
/// said it was valid (`lease_left() > 0`) for up to two milliseconds after another
/// client could reclaim it and take its place (two holders of a one-permit
/// semaphore; DESIGN "Under faults": the client's deadline is never later than the
/// server's). The book's layouts already count so (`compat::book`, "Lost permits").
#[test]
fn a_permit_expirable_permit_is_not_valid_once_a_client_on_its_clock_may_reclaim_it() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = pes(&client);
    let mut conn = server.conn();
    assert!(sem.try_set_permits(1).unwrap());
    for _ in 0..5 {
        let permit = sem
            .try_acquire(Some(Duration::from_micros(2_999)))
            .unwrap()
            .expect("a permit");
        let score = zscore(&mut conn, &decode(permit.id())).expect("held");
        // the first moment a client on this clock reclaims it (a condition polled
        // without pause: the window is a millisecond or two)
        let start = Instant::now();
        while now_ms() < score {
            assert!(start.elapsed() < Duration::from_secs(5), "the clock stands");
            std::hint::spin_loop();
        }
        let left = permit.lease_left();
        assert_eq!(
            left,
            Duration::ZERO,
            "still valid by {left:?} at the score {score}, when a client on this clock \
             reclaims it"
        );
        drop(permit);
    }
}

/// `update_lease_time` on the id of a `Permit` this client holds moves the lease on the
/// server, and the `Permit` must follow: it said it was valid for its first lease
/// (`lease_left() > 0`, not lost) after a shorter one had ended and another client
/// had reclaimed its place (two valid holders of a one-permit semaphore; DESIGN "Under
/// faults": the client's deadline is never later than the server's). A handle made
/// apart on the same client updates it too.
#[test]
fn a_lease_shortened_by_update_lease_time_is_the_permits_own_deadline() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let other = Client::open(server.url()).unwrap();
    let sem = pes(&client);
    let apart = pes(&client);
    let mut conn = server.conn();
    assert!(sem.try_set_permits(1).unwrap());
    for shorten in [&sem, &apart] {
        let permit = sem.try_acquire(Some(LONG)).unwrap().expect("a permit");
        assert!(
            shorten
                .update_lease_time(permit.id(), Some(Duration::from_millis(300)))
                .unwrap()
        );
        let score = zscore(&mut conn, &decode(permit.id())).expect("held");
        wait_until(REPLY, "the shortened lease to end by this clock", || {
            now_ms() >= score
        });
        let theirs = pes(&other)
            .try_acquire(Some(LONG))
            .unwrap()
            .expect("the other client reclaims the expired permit");
        not_valid_beside(permit, theirs);
    }
}

/// `release(id)` and `try_release(id)` on the id of a `Permit` this client holds give
/// the permit back; the `Permit` must then say it is gone: it stayed valid (not lost,
/// its whole lease left) while another client held the only permit, as
/// `Semaphore::force_release` already tells the client's own `Permit`s.
#[test]
fn a_permit_released_by_its_id_through_the_semaphore_is_lost() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let other = Client::open(server.url()).unwrap();
    let sem = pes(&client);
    let apart = pes(&client);
    assert!(sem.try_set_permits(1).unwrap());
    for (by, try_release) in [(&sem, false), (&apart, true)] {
        let permit = sem.try_acquire(Some(LONG)).unwrap().expect("a permit");
        if try_release {
            assert!(by.try_release(permit.id()).unwrap());
        } else {
            by.release(permit.id()).unwrap();
        }
        let theirs = pes(&other)
            .try_acquire(Some(LONG))
            .unwrap()
            .expect("the other client takes the permit given back");
        not_valid_beside(permit, theirs);
    }
}

/// Asserts that `permit` does not say it is valid while `theirs`, another client's,
/// holds the only permit; drops both.
fn not_valid_beside(permit: Permit, theirs: Permit) {
    let valid = !permit.is_lost() && permit.lease_left() > Duration::ZERO;
    assert!(
        !valid,
        "the permit still says valid for {:?} while {} holds the only permit",
        permit.lease_left(),
        theirs.id()
    );
}

/// `RSemaphore` calls on connections the server closed while they sat idle in the
/// pool (its `timeout` setting; `CLIENT KILL`) used to fail with "unexpected end of
/// file", in doubt: a release so lost its permits for good. Each call that changes
/// the counter carries an operation key on every deployment now and is sent again on
/// another connection.
#[test]
fn rsemaphore_calls_on_connections_the_server_closed_while_idle_go_through_once() {
    let server = RedisServer::start_with(&["--timeout", "1"]);
    let client = Client::open(server.url()).unwrap();
    let rs = client.redisson_semaphore(NAME);
    let conn = || server.conn();
    assert!(rs.try_set_permits(2).unwrap());
    assert!(rs.try_acquire(1).unwrap());
    support::wait_idle_closed(&server);
    assert_eq!(rs.release(1).unwrap(), 2);
    support::kill_clients(&server);
    assert!(rs.try_acquire(2).unwrap());
    assert_eq!(counter(&mut conn()), Some(0));
    support::kill_clients(&server);
    assert_eq!(rs.add_permits(3).unwrap(), 3);
    support::wait_idle_closed(&server);
    assert_eq!(rs.drain_permits().unwrap(), 3);
    support::kill_clients(&server);
    assert!(rs.release_if_exists(2).unwrap());
    support::kill_clients(&server);
    assert!(rs.acquire_timeout(1, Duration::from_secs(5)).unwrap());
    assert_eq!(counter(&mut conn()), Some(1));
}

/// Ninth session (review): `RSemaphore::available_permits` (a plain `GET`) was the one
/// call of the type not sent again after a broken connection: on a pooled connection
/// the server had closed while it sat idle it failed with "unexpected end of file",
/// where every other call answers. It is sent again on a fresh connection too.
#[test]
fn rsemaphore_available_permits_on_a_connection_the_server_closed_answers() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let rs = client.redisson_semaphore(NAME);
    assert!(rs.try_set_permits(2).unwrap());
    let before = client.stats().resent;
    assert!(
        support::kill_clients(&server) >= 1,
        "no pooled connection to close"
    );
    assert_eq!(rs.available_permits().unwrap(), 2);
    assert_eq!(client.stats().resent, before + 1, "not sent again");
}

/// An `RSemaphore` release whose reply was lost with its connection (the release ran)
/// is sent again and applies once: the second send finds the operation key.
#[test]
fn rsemaphore_a_release_whose_connection_drops_before_its_reply_applies_once() {
    let server = RedisServer::start();
    let (proxy, client) = support::proxied_client(&server, Duration::from_secs(10));
    let rs = client.redisson_semaphore(NAME);
    assert!(rs.try_set_permits(0).unwrap());
    proxy.delay_replies(Duration::from_secs(4));
    let releasing = {
        let rs = rs.clone();
        std::thread::spawn(move || rs.release(1))
    };
    let mut conn = server.conn();
    wait_until(
        Duration::from_secs(10),
        "the release ran on the server",
        || counter(&mut conn) == Some(1),
    );
    proxy.delay_replies(Duration::ZERO);
    proxy.reset();
    assert_eq!(releasing.join().unwrap().unwrap(), 1);
    assert_eq!(counter(&mut conn), Some(1), "the release took effect once");
}
