//! Regression tests for the faults of issue #11, one or more per finding: each failed
//! before the change that fixed it. Real servers, no sleeps as synchronisation.

mod support;

use std::time::{Duration, Instant};

use redis_semaphore::{Client, Error, MAX_LIMIT, Permit};
use support::{
    RedisServer, acquire_script, call_on, server_ms, wait_for, wait_past_server_ms, wait_until,
};

fn client(server: &RedisServer) -> Client {
    Client::open(server.url()).unwrap()
}

/// Queues waiter `id` (wait mode, no wake-up channel) for one permit with the given
/// lease: a waiter whose process then dies (nobody renews its heartbeat).
fn queue_dead_waiter(conn: &mut redis::Connection, name: &str, id: &str, limit: u32, lease: u64) {
    queue_waiter_with_heartbeat(conn, name, id, limit, lease, lease.min(1000));
}

/// As [`queue_dead_waiter`], with a heartbeat of `hb` ms instead of the client's.
fn queue_waiter_with_heartbeat(
    conn: &mut redis::Connection,
    name: &str,
    id: &str,
    limit: u32,
    lease: u64,
    hb: u64,
) {
    let script = acquire_script();
    let mut inv = call_on(&script, name);
    inv.arg(id)
        .arg(1)
        .arg(limit)
        .arg(lease)
        .arg(1000)
        .arg(hb)
        .arg("1|dead|")
        .arg("w")
        .arg("1")
        .arg("")
        .arg("0");
    let reply: Vec<i64> = inv.invoke(conn).unwrap();
    assert_eq!(reply[0], 0, "queued, not granted: {reply:?}");
}

fn uuid(k: usize) -> String {
    format!("dddddddd-0000-4000-8000-{k:012}")
}

/// Every key of semaphore `name` has a TTL.
fn assert_ttls(conn: &mut redis::Connection, name: &str) {
    for part in ["h", "i", "s", "q"] {
        let key = format!("redsem:{{{name}}}:{part}");
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query(conn).unwrap();
        assert!(ttl > 0 || ttl == -2, "{key} has no TTL ({ttl})");
    }
}

/// Finding 1: the client's deadline is the server's, on every path. A permit's
/// `lease_left()` never exceeds what the server has left for it, for a direct grant, a
/// grant pushed to a waiter, and one kept by a timed-out wait.
#[test]
fn lease_left_never_exceeds_the_servers_on_any_path() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = client(&server);
    let sem = c
        .semaphore_builder("deadline")
        .limit(1)
        .lease(Duration::from_millis(1500))
        .build()
        .unwrap();
    // Sound against timing: the server's TIME T is read first (its reply received at
    // instant r), then the client's lease left at instant c, then the permit's deadline
    // on the server (the latest one: a renewal in between only moves it later). The
    // server's deadline comes at most (deadline - T) after r, so a correct client has
    // c + left <= r + (deadline - T).
    let check = |conn: &mut redis::Connection, p: &redis_semaphore::Permit| {
        let t = server_ms(conn);
        let r = std::time::Instant::now();
        let left = p.lease_left();
        let c = std::time::Instant::now();
        let deadline: i64 = redis::cmd("ZSCORE")
            .arg("redsem:{deadline}:h")
            .arg(p.id())
            .query(conn)
            .unwrap();
        let bound = (deadline - t) as i128 * 1000 - (c - r).as_micros() as i128;
        assert!(
            (left.as_micros() as i128) <= bound,
            "client {left:?} > server {bound} µs"
        );
    };
    let first = sem.try_acquire().unwrap().unwrap();
    check(&mut conn, &first);
    // a waiter in another client is pushed the permit when `first` goes
    let other = client(&server);
    let sem2 = other
        .semaphore_builder("deadline")
        .limit(1)
        .lease(Duration::from_millis(1500))
        .build()
        .unwrap();
    let waiter = std::thread::spawn(move || sem2.acquire().unwrap());
    wait_until(Duration::from_secs(5), "the waiter to queue", || {
        sem.queue_len().unwrap() == 1
    });
    drop(first);
    let pushed = waiter.join().unwrap();
    check(&mut conn, &pushed);
    // a pushed permit first lasts a heartbeat (at most a second), until renewed
    assert!(pushed.lease_left() <= Duration::from_millis(1000));
    wait_until(
        Duration::from_secs(5),
        "the pushed permit's renewal",
        || pushed.lease_left() > Duration::from_millis(1000),
    );
    check(&mut conn, &pushed);
}

/// Finding 1 (the cutoff): an acquire that reaches the server after the time its
/// caller gave up writes nothing.
#[test]
fn an_acquire_after_its_cutoff_does_nothing() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let script = acquire_script();
    let mut inv = call_on(&script, "cutoff");
    let past = server_ms(&mut conn) - 1;
    inv.arg(uuid(1))
        .arg(1)
        .arg(3)
        .arg(10_000)
        .arg(1000)
        .arg(1000)
        .arg("1|x|")
        .arg("t")
        .arg("1")
        .arg("")
        .arg(past);
    let reply: Vec<i64> = inv.invoke(&mut conn).unwrap();
    assert_eq!(reply[0], -2, "{reply:?}");
    assert!(support::keys(&mut conn, "redsem:*").is_empty());
}

/// Finding 2: serving thousands of waiters at once (a raised limit) cannot fail
/// halfway: one call serves a bounded number, the next calls the rest, and the state
/// agrees with itself all along.
#[test]
fn serving_thousands_of_waiters_is_bounded_and_never_fails_halfway() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = client(&server);
    let sem = c.semaphore("many", 1).unwrap();
    let held = sem.try_acquire().unwrap().unwrap();
    // waiters that stay queued for the test (a long heartbeat), with no channel
    for k in 0..4000 {
        queue_waiter_with_heartbeat(&mut conn, "many", &uuid(k), 1, 60_000, 60_000);
    }
    assert_eq!(sem.queue_len().unwrap(), 4000);
    sem.set_limit(5000).unwrap();
    drop(held);
    // every call serves a bounded share; calls go on until all are served
    wait_until(Duration::from_secs(20), "every waiter served", || {
        sem.queue_len().unwrap() == 0
    });
    let status = sem.status().unwrap();
    assert_eq!(status.held, 4000);
    let bits: i64 = redis::cmd("BITCOUNT")
        .arg("redsem:{many}:s")
        .query(&mut conn)
        .unwrap();
    assert_eq!(bits, 4000, "one slot bit per permit held");
    assert_ttls(&mut conn, "many");
}

/// Finding 2: a user whose ACL lacks the channel permission still releases fully (the
/// wake-up is best effort; the waiter finds its grant on its next look).
#[test]
fn a_user_without_publish_permission_still_releases() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("nopub")
        .arg("on")
        .arg(">secret")
        .arg("~redsem:*")
        .arg("resetchannels")
        .arg("+@all")
        .exec(&mut conn)
        .unwrap();
    let url = format!("redis://nopub:secret@127.0.0.1:{}/", server.port());
    let restricted = Client::open(&url).unwrap();
    let sem = restricted.semaphore("acl", 1).unwrap();
    let p = sem.try_acquire().unwrap().unwrap();
    // a waiter of another (unrestricted) client queues behind it
    let other = client(&server).semaphore("acl", 1).unwrap();
    let waiter = std::thread::spawn(move || {
        other
            .acquire_timeout(Duration::from_secs(20))
            .unwrap()
            .map(|p| p.slots().to_vec())
    });
    wait_until(Duration::from_secs(5), "the waiter to queue", || {
        sem.queue_len().unwrap() == 1
    });
    p.release().expect("the release runs to its end");
    let status = sem.status().unwrap();
    assert_eq!(
        (status.held, status.queued),
        (1, 0),
        "served at once: {status:?}"
    );
    assert_eq!(waiter.join().unwrap(), Some(vec![0]));
}

/// Finding 3: an id from outside can only name a holder.
#[test]
fn force_release_refuses_what_is_not_a_permit_id() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = client(&server);
    let sem = c.semaphore("ids", 2).unwrap();
    sem.set_limit(2).unwrap();
    let a = sem.try_acquire().unwrap().unwrap();
    let b = sem.try_acquire().unwrap().unwrap();
    queue_dead_waiter(&mut conn, "ids", &uuid(7), 2, 60_000);
    let waiter_member = format!("w:{}", uuid(7));
    for bad in [
        "limit",
        "used",
        "ctr",
        "exp",
        "mind",
        "qn",
        "qseq",
        "cl",
        "~",
        waiter_member.as_str(),
        "",
        "not-a-permit",
    ] {
        let r = sem.force_release(bad);
        assert!(
            matches!(r, Err(Error::InvalidArgument(_))),
            "{bad:?}: {r:?}"
        );
    }
    let status = sem.status().unwrap();
    assert_eq!(
        (status.held, status.stored_limit, status.queued),
        (2, Some(2), 1)
    );
    assert!(sem.force_release(a.id()).unwrap());
    assert!(!sem.force_release(&uuid(99)).unwrap());
    drop(b);
}

/// Finding 4: a lost holders zset is repaired: a crashed holder's record cannot keep
/// the semaphore full for ever, and the keys have TTLs again. A refused try decides on
/// the hash alone (its "no" writes nothing, and a repair would drop every holder), so
/// the repair comes with the first call that needs more: here the try after the
/// crashed holder's deadline ('mind'), which the hash still holds.
#[test]
fn a_lost_holders_zset_is_repaired() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = client(&server);
    let sem = c
        .semaphore_builder("lost-h")
        .limit(1)
        .auto_refresh(false)
        .lease(Duration::from_millis(300))
        .build()
        .unwrap();
    let crashed = sem.try_acquire().unwrap().unwrap();
    let deadline: i64 = redis::cmd("ZSCORE")
        .arg("redsem:{lost-h}:h")
        .arg(crashed.id())
        .query(&mut conn)
        .unwrap();
    std::mem::forget(crashed); // a holder that never comes back
    redis::cmd("DEL")
        .arg("redsem:{lost-h}:h")
        .exec(&mut conn)
        .unwrap();
    wait_past_server_ms(&mut conn, deadline);
    let p = sem
        .try_acquire()
        .unwrap()
        .expect("the semaphore was repaired");
    assert_eq!(p.slots(), &[0]);
    assert_eq!(sem.status().unwrap().held, 1);
    assert_ttls(&mut conn, "lost-h");
}

/// Finding 4: with the slot bitmap gone, no two live holders share a slot: the repair
/// drops the old holders, which learn it at their next renewal.
#[test]
fn a_lost_slot_bitmap_never_books_a_slot_twice() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = client(&server);
    let sem = c
        .semaphore_builder("lost-s")
        .limit(2)
        .auto_refresh(false)
        .lease(Duration::from_secs(60))
        .build()
        .unwrap();
    let old = sem.try_acquire().unwrap().unwrap();
    redis::cmd("DEL")
        .arg("redsem:{lost-s}:s")
        .exec(&mut conn)
        .unwrap();
    let new = sem.try_acquire().unwrap().unwrap();
    let holders = sem.holders().unwrap();
    assert_eq!(
        holders.len(),
        1,
        "only the new holder is booked: {holders:?}"
    );
    assert_eq!(holders[0].id, new.id());
    assert!(matches!(old.refresh(), Err(Error::PermitLost { .. })));
    assert!(old.is_lost());
    assert_ttls(&mut conn, "lost-s");
}

/// Finding 5: waiters whose process died are handed permits that come back within
/// about a heartbeat (a second), not a lease, and live waiters behind them get them.
#[test]
fn dead_waiters_cost_about_a_second_not_a_lease() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = client(&server);
    let lease = Duration::from_secs(60);
    let sem = c
        .semaphore_builder("dead")
        .limit(5)
        .lease(lease)
        .build()
        .unwrap();
    let held: Vec<_> = (0..5)
        .map(|_| sem.try_acquire().unwrap().unwrap())
        .collect();
    for k in 0..5 {
        queue_dead_waiter(&mut conn, "dead", &uuid(k), 5, lease.as_millis() as u64);
    }
    let live = c
        .semaphore_builder("dead")
        .limit(5)
        .lease(lease)
        .build()
        .unwrap();
    let waiter = std::thread::spawn(move || {
        let started = Instant::now();
        let p = live.acquire_timeout(Duration::from_secs(30)).unwrap();
        (p.is_some(), started.elapsed())
    });
    wait_until(Duration::from_secs(5), "the live waiter to queue", || {
        sem.queue_len().unwrap() == 6
    });
    drop(held); // the five permits go to the five dead waiters first
    let (got, waited) = waiter.join().unwrap();
    assert!(got, "the live waiter got a permit");
    assert!(
        waited < Duration::from_secs(10),
        "waited {waited:?}: the dead waiters held the permits far past a heartbeat"
    );
    assert_ttls(&mut conn, "dead");
}

/// Finding 6: one call's work is bounded: a limit past MAX_LIMIT is refused before any
/// network call, and a grant of MAX_LIMIT permits at once works.
#[test]
fn limits_past_the_maximum_are_refused_and_the_maximum_works() {
    let server = RedisServer::start();
    let c = client(&server);
    let too_big = c.semaphore("big", MAX_LIMIT + 1);
    assert!(
        matches!(too_big, Err(Error::InvalidArgument(_))),
        "{too_big:?}"
    );
    let sem = c.semaphore("big", MAX_LIMIT).unwrap();
    assert!(matches!(
        sem.set_limit(MAX_LIMIT + 1),
        Err(Error::InvalidArgument(_))
    ));
    let all = sem.try_acquire_many(MAX_LIMIT).unwrap().unwrap();
    assert_eq!(all.slots().len(), MAX_LIMIT as usize);
    assert_eq!(all.slots()[MAX_LIMIT as usize - 1], MAX_LIMIT - 1);
    all.release().unwrap();
    let one = wait_for(Duration::from_secs(5), "a permit", || {
        sem.try_acquire().unwrap()
    });
    assert_eq!(one.slots(), &[0]);
}

/// Finding 6: a release whose pooled connection was killed is sent again on a fresh
/// connection, so the slot is free at once, not after the lease.
#[test]
fn a_release_on_a_killed_connection_is_retried_on_a_fresh_one() {
    let server = RedisServer::start();
    let mut admin = server.conn();
    let c = client(&server);
    let sem = c
        .semaphore_builder("killed")
        .limit(1)
        .lease(Duration::from_secs(60))
        .build()
        .unwrap();
    let p = sem.try_acquire().unwrap().unwrap();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query(&mut admin)
        .unwrap();
    p.release().expect("released through a fresh connection");
    let other = client(&server).semaphore("killed", 1).unwrap();
    assert!(other.try_acquire().unwrap().is_some(), "the slot is free");
}

/// Finding 6: the wake-up listener never takes a user pool's only connection.
#[test]
fn a_user_pool_of_one_connection_is_refused_and_two_work() {
    let server = RedisServer::start();
    let one = r2d2::Pool::builder()
        .max_size(1)
        .build_unchecked(redis::Client::open(server.url()).unwrap());
    let r = Client::from_pool(one);
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    let two = r2d2::Pool::builder()
        .max_size(2)
        .build_unchecked(redis::Client::open(server.url()).unwrap());
    let c = Client::from_pool(two).unwrap();
    let sem = c.semaphore("pool2", 1).unwrap();
    let p = sem.try_acquire().unwrap().unwrap();
    let sem2 = sem.clone();
    let waiter = std::thread::spawn(move || sem2.acquire_timeout(Duration::from_secs(10)));
    wait_until(Duration::from_secs(5), "the waiter to queue", || {
        sem.queue_len().unwrap() == 1
    });
    drop(p);
    let got = waiter.join().unwrap().unwrap();
    assert!(got.is_some(), "the waiter was woken through the listener");
}

/// Finding 6: concurrent drops with a hung server never block past the operation
/// timeout, also when another thread's try-acquire carries them in its call (a call
/// that started later than the drop and would otherwise be waited for in full).
#[test]
fn drops_with_a_hung_server_end_within_the_operation_timeout() {
    const OP: Duration = Duration::from_millis(400);
    // scheduling on a loaded machine; well below a second operation timeout
    const SLACK: Duration = Duration::from_millis(250);
    let server = RedisServer::start();
    let mut admin = server.conn();
    let c = Client::builder()
        .operation_timeout(OP)
        .max_connections(8)
        .build(server.url())
        .unwrap();
    let sem = c
        .semaphore_builder("hung")
        .limit(20)
        .lease(Duration::from_secs(2))
        .auto_refresh(false)
        .build()
        .unwrap();
    let permits: Vec<_> = (0..6)
        .map(|_| sem.try_acquire().unwrap().unwrap())
        .collect();
    // scripts are held back while the pause lasts; CLIENT LIST still answers
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(10_000)
        .arg("WRITE")
        .query(&mut admin)
        .unwrap();
    let hung_calls = |admin: &mut redis::Connection| {
        let list: String = redis::cmd("CLIENT").arg("LIST").query(admin).unwrap();
        list.lines().filter(|l| l.contains("cmd=evalsha")).count()
    };
    // every call of the combiner in flight and hung
    let tries: Vec<_> = (0..4)
        .map(|_| {
            let sem = sem.clone();
            std::thread::spawn(move || sem.try_acquire().map(|p| p.is_some()))
        })
        .collect();
    wait_until(Duration::from_secs(5), "four hung tries", || {
        hung_calls(&mut admin) == 4
    });
    // The scenario's timing, not a wait for a condition: a try queues a little into
    // the hung calls, then the drops a little later; when the hung calls end, the try
    // leads the next call carrying the drops, a call that starts long after the drops
    // did.
    std::thread::sleep(OP / 20);
    let next_try = {
        let sem = sem.clone();
        std::thread::spawn(move || sem.try_acquire().map(|p| p.is_some()))
    };
    std::thread::sleep(OP / 20);
    let drops: Vec<_> = permits
        .into_iter()
        .map(|p| {
            std::thread::spawn(move || {
                let start = Instant::now();
                drop(p);
                start.elapsed()
            })
        })
        .collect();
    for d in drops {
        let took = d.join().unwrap();
        assert!(
            took <= OP + SLACK,
            "a drop blocked {took:?} (operation timeout {OP:?})"
        );
    }
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query(&mut admin)
        .unwrap();
    for t in tries.into_iter().chain([next_try]) {
        // timed out or granted: either way an answer, never a hang
        let _ = t.join().unwrap();
    }
    // whatever was not released ends with its lease: the semaphore is whole again
    wait_until(Duration::from_secs(10), "every permit back", || {
        sem.available().unwrap() == 20
    });
    assert_ttls(&mut admin, "hung");
}

/// Audit of 2026-11-26 (time bounds): dropping the last permit, which holds the last
/// handle of its client, during a partition takes one operation timeout in all. Two
/// waits went past it: a release resent on a fresh connection sent that connection's
/// set-up `PING` with a whole operation timeout of its own, and the client's joins of
/// its threads (here the wake-up listener, reconnecting into the partition) had
/// another operation timeout after the release's.
#[test]
fn dropping_the_last_handle_in_a_partition_ends_within_the_operation_timeout() {
    const OP: Duration = Duration::from_millis(1000);
    // scheduling on a loaded machine; well below the half timeout each wait added
    const SLACK: Duration = Duration::from_millis(300);
    let (_server, proxy, client) = support::proxied(OP);
    let permit = {
        let sem = client.semaphore("last-handle", 1).unwrap();
        let p = sem.try_acquire().unwrap().unwrap();
        // a waiter that gives up: the wake-up listener runs from now on
        assert!(
            sem.acquire_timeout(Duration::from_millis(50))
                .unwrap()
                .is_none()
        );
        p
    };
    drop(client);
    proxy.cut();
    let dropper = std::thread::spawn(move || {
        let start = Instant::now();
        drop(permit);
        start.elapsed()
    });
    // The scenario's timing, not a wait for a condition: halfway through the release's
    // timeout every connection closes, so the release goes again on a fresh one (into
    // the partition, with half its time left) and the listener reconnects into it.
    std::thread::sleep(OP / 2);
    proxy.reset();
    let took = dropper.join().unwrap();
    proxy.heal();
    assert!(
        took <= OP + SLACK,
        "the drop blocked {took:?} (operation timeout {OP:?})"
    );
}

/// The keys of semaphore `name` with their types and contents, to compare before and
/// after a call that must write nothing.
fn snapshot(conn: &mut redis::Connection, name: &str) -> Vec<(String, String, String)> {
    ["h", "i", "s", "q"]
        .iter()
        .map(|part| {
            let key = format!("redsem:{{{name}}}:{part}");
            let ty: String = redis::cmd("TYPE").arg(&key).query(conn).unwrap();
            let dump: Option<Vec<u8>> = redis::cmd("DUMP").arg(&key).query(conn).unwrap();
            (key, ty, format!("{dump:?}"))
        })
        .collect()
}

/// Review of the scripts: an acquire whose arguments are malformed (a fraction, NaN,
/// a number out of range, text where a number goes, a missing origin or channel) is
/// refused before the script's first write, alone and anywhere in a batch, on a new
/// semaphore and on one in use; so are set_limit's and refresh's.
#[test]
fn malformed_script_arguments_are_refused_before_any_write() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let acquire = acquire_script();
    let batch = support::batch_script();
    // ARGV 2.. of a valid waiting acquire: n, limit, lease, pad, heartbeat, origin,
    // mode, fair, channel, cutoff
    let good = [
        "1", "2", "10000", "1000", "1000", "1|t|", "w", "1", "ch", "0",
    ];
    let bad: Vec<(usize, Option<&str>)> = vec![
        (0, Some("1.5")),
        (0, Some("nan")),
        (0, Some("10001")),
        (0, Some("0")),
        (1, Some("xyz")),
        (1, Some("inf")),
        (1, Some("0")),
        (2, Some("abc")),
        (2, Some("nan")),
        (3, Some("-1")),
        (4, Some("x")),
        (5, None),
        (8, None),
    ];
    let with = |k: usize, v: Option<&str>| -> Vec<String> {
        let mut args: Vec<String> = good.iter().map(|s| s.to_string()).collect();
        match v {
            Some(v) => args[k] = v.to_owned(),
            // a missing argument: everything from it on is left out
            None => args.truncate(k),
        }
        args
    };
    let held = uuid(900);
    for (case, (k, v)) in bad.iter().enumerate() {
        for name in ["fresh", "used"] {
            if name == "used" && case == 0 {
                // one holder and one queued waiter
                let mut inv = call_on(&acquire, name);
                inv.arg(&held);
                for a in &good {
                    inv.arg(*a);
                }
                let _: redis::Value = inv.invoke(&mut conn).unwrap();
                queue_dead_waiter(&mut conn, name, &uuid(901), 1, 10_000);
            }
            let before = snapshot(&mut conn, name);
            // alone on the fresh semaphore the fast path grants without reading the
            // heartbeat and the channel (a waiter's arguments), so only the others
            // are refused there; on the semaphore in use the full logic runs
            if !(name == "fresh" && (*k == 4 || *k == 8)) {
                let mut inv = call_on(&acquire, name);
                inv.arg(uuid(case));
                for a in with(*k, *v) {
                    inv.arg(a);
                }
                let r: redis::RedisResult<redis::Value> = inv.invoke(&mut conn);
                assert!(r.is_err(), "acquire with ARGV[{}] = {v:?}: {r:?}", k + 2);
                assert_eq!(snapshot(&mut conn, name), before, "acquire {v:?} wrote");
            }

            // in a batch, after a try that would be granted and a release
            let mut inv = call_on(&batch, name);
            inv.arg("a").arg(uuid(100 + case));
            for a in ["1", "5", "10000", "1000", "1000", "1|t|", "t", "1", "", "0"] {
                inv.arg(a);
            }
            inv.arg("r").arg(&held);
            inv.arg("a").arg(uuid(200 + case));
            let mut args = with(*k, *v);
            if args.len() > 7 {
                args[6] = "t".into();
            }
            for a in args {
                inv.arg(a);
            }
            let r: redis::RedisResult<redis::Value> = inv.invoke(&mut conn);
            assert!(r.is_err(), "batch with ARGV[{}] = {v:?}: {r:?}", k + 2);
            assert_eq!(snapshot(&mut conn, name), before, "batch {v:?} wrote");
        }
    }

    let before = snapshot(&mut conn, "used");
    let set_limit = support::set_limit_script();
    for (limit, retention) in [
        ("nan", "1"),
        ("1.5", "1"),
        ("10001", "1"),
        ("3", "inf"),
        // a retention of 0 would delete the keys at once and leave the hash without a TTL
        ("3", "0"),
    ] {
        let r: redis::RedisResult<i64> = call_on(&set_limit, "used")
            .arg(limit)
            .arg(retention)
            .invoke(&mut conn);
        assert!(r.is_err(), "set_limit {limit} {retention}: {r:?}");
    }
    let refresh = support::refresh_script();
    for (lease, pad) in [
        ("nan", "1000"),
        ("1000", "nan"),
        ("0", "1000"),
        ("1e300", "1"),
    ] {
        let r: redis::RedisResult<redis::Value> = call_on(&refresh, "used")
            .arg(lease)
            .arg(pad)
            .arg(&held)
            .invoke(&mut conn);
        assert!(r.is_err(), "refresh {lease} {pad}: {r:?}");
    }
    assert_eq!(snapshot(&mut conn, "used"), before);
}

/// Review of the scripts (K9): waiters dropped because they ask for more than a
/// lowered limit count against one call's budget like waiters served, so one call
/// does bounded work however long the queue; the next calls drop the rest.
#[test]
fn dropping_waiters_above_a_lowered_limit_is_bounded_per_call() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = client(&server);
    let sem = c.semaphore("drops", 2).unwrap();
    let _held = sem.try_acquire_many(2).unwrap().unwrap();
    let script = acquire_script();
    for k in 0..100 {
        let reply: Vec<i64> = call_on(&script, "drops")
            .arg(uuid(k))
            .arg(2)
            .arg(2)
            .arg(60_000)
            .arg(1000)
            .arg(60_000)
            .arg("1|t|")
            .arg("w")
            .arg("1")
            .arg("")
            .arg("0")
            .invoke(&mut conn)
            .unwrap();
        assert_eq!(reply[0], 0, "queued: {reply:?}");
    }
    assert_eq!(sem.queue_len().unwrap(), 100);
    sem.set_limit(1).unwrap();
    // read without a script (any script call serves and drops too)
    let queued = |conn: &mut redis::Connection| -> i64 {
        redis::cmd("ZCARD")
            .arg("redsem:{drops}:q")
            .query::<i64>(conn)
            .unwrap()
    };
    assert_eq!(queued(&mut conn), 36, "one call drops at most 64 waiters");
    assert_eq!(sem.queue_len().unwrap(), 0, "the next call drops the rest");
    assert_eq!(queued(&mut conn), 0);
}

/// Tries `ids` in batch calls of at most 64 (limit 10,000, `lease_ms`).
fn batch_tries(conn: &mut redis::Connection, name: &str, ids: &[String], lease_ms: u64) {
    let script = support::batch_script();
    for chunk in ids.chunks(64) {
        let mut inv = call_on(&script, name);
        support::batch_try_many(&mut inv, &chunk[0], 1, MAX_LIMIT, lease_ms);
        for id in &chunk[1..] {
            inv.arg("A").arg(id).arg("0");
        }
        let _: redis::Value = inv.invoke(conn).unwrap();
    }
}

/// K2: 'used', the bitmap's bits and the holder records agree (every record is of one
/// permit here).
fn assert_k2(conn: &mut redis::Connection, name: &str) {
    let used: i64 = redis::cmd("HGET")
        .arg(format!("redsem:{{{name}}}:i"))
        .arg("used")
        .query(conn)
        .unwrap();
    let bits: i64 = redis::cmd("BITCOUNT")
        .arg(format!("redsem:{{{name}}}:s"))
        .query(conn)
        .unwrap();
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(format!("redsem:{{{name}}}:i"))
        .query(conn)
        .unwrap();
    let records = fields.iter().filter(|f| f.len() == 36).count() as i64;
    assert_eq!((used, bits), (records, records), "used, bits, records");
}

/// Review of the scripts (K9, K2): with more ended leases than one call may purge, a
/// batch's operations share one call's purge budget; a refresh reports an ended lease
/// that the budget left in h as lost instead of renewing it; and an id whose ended
/// lease the budget did not reach is granted again with its old permit freed, not
/// hidden under the new record and counted for good.
#[test]
fn more_ended_leases_than_one_call_purges_are_never_renewed_or_hidden() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let name = "ended";
    let h = format!("redsem:{{{name}}}:h");
    let zcard =
        |conn: &mut redis::Connection| -> i64 { redis::cmd("ZCARD").arg(&h).query(conn).unwrap() };
    // a keeper for a minute, then 1,600 holders of 300 ms and X of 600 ms (after them)
    batch_tries(&mut conn, name, &[uuid(100_000)], 60_000);
    let many: Vec<String> = (0..1600).map(uuid).collect();
    batch_tries(&mut conn, name, &many, 300);
    let x = uuid(200_000);
    batch_tries(&mut conn, name, std::slice::from_ref(&x), 600);
    let x_deadline: i64 = redis::cmd("ZSCORE")
        .arg(&h)
        .arg(&x)
        .query(&mut conn)
        .unwrap();
    support::wait_past_server_ms(&mut conn, x_deadline);

    // one batch of 21 tries purges at most 512 entries in all
    let before = zcard(&mut conn);
    let tries: Vec<String> = (300_000..300_021).map(uuid).collect();
    batch_tries(&mut conn, name, &tries, 60_000);
    let purged = before + 21 - zcard(&mut conn);
    assert!(purged <= 512, "one call purged {purged} entries");

    // a refresh of X (still in h, after 1,000 others): lost, not renewed
    let refresh = support::refresh_script();
    let reply: Vec<String> = call_on(&refresh, name)
        .arg(60_000)
        .arg(1000)
        .arg(&x)
        .invoke::<Vec<redis::Value>>(&mut conn)
        .unwrap()
        .into_iter()
        .map(|v| match v {
            redis::Value::Int(i) => i.to_string(),
            v => redis::from_redis_value(v).unwrap(),
        })
        .collect();
    assert_eq!(reply, vec!["0".to_owned(), x.clone()], "X reported lost");
    let score: i64 = redis::cmd("ZSCORE")
        .arg(&h)
        .arg(&x)
        .query(&mut conn)
        .unwrap();
    assert_eq!(score, x_deadline, "X renewed after its lease ended");

    // X acquires again while the budget still cannot reach it: its old permit is freed
    batch_tries(&mut conn, name, std::slice::from_ref(&x), 60_000);
    // the calls that purge the rest
    for k in 0..4 {
        batch_tries(&mut conn, name, &[uuid(400_000 + k)], 60_000);
    }
    let ended = |conn: &mut redis::Connection| -> i64 {
        redis::cmd("ZCOUNT")
            .arg(&h)
            .arg("-inf")
            .arg(server_ms(conn))
            .query(conn)
            .unwrap()
    };
    assert_eq!(ended(&mut conn), 0, "every ended lease purged");
    assert_k2(&mut conn, name);
}

/// K9 for batches: the acquires of one batch ask for at most MAX_LIMIT permits in all,
/// so that a batch that repeats an id (acquire all, release, acquire all again...)
/// cannot make one call set and clear slot bits without end; one that asks for more is
/// refused before anything is written.
#[test]
fn a_batch_asking_for_more_than_the_most_permits_in_all_is_refused_before_any_write() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let batch = support::batch_script();
    let x = uuid(1);
    let full = |inv: &mut redis::ScriptInvocation<'_>, n: u32| {
        support::batch_try_many(inv, &x, n, MAX_LIMIT, 60_000);
    };
    let mut inv = call_on(&batch, "bits");
    full(&mut inv, MAX_LIMIT);
    inv.arg("r").arg(&x);
    full(&mut inv, 1);
    let r: redis::RedisResult<redis::Value> = inv.invoke(&mut conn);
    assert!(r.is_err(), "{r:?}");
    assert!(support::keys(&mut conn, "redsem:*").is_empty(), "written");
    // at most MAX_LIMIT in all: taken
    let mut inv = call_on(&batch, "bits");
    full(&mut inv, MAX_LIMIT - 1);
    inv.arg("r").arg(&x);
    full(&mut inv, 1);
    let replies: Vec<redis::Value> = inv.invoke(&mut conn).unwrap();
    assert_eq!(replies.len(), 3);
    assert_eq!(support::acquire_reply(&replies[2])[0], 1, "{replies:?}");
}

/// A Redisson script, as the library builds it (src/scripts/mod.rs: publish, counter,
/// the PES prelude, once, the body), for calls the public API never makes.
fn redisson_script(pes: bool, body: &str) -> redis::Script {
    let publish = include_str!("../src/scripts/redisson_publish.lua");
    let counter = include_str!("../src/scripts/redisson_counter.lua");
    let once = include_str!("../src/scripts/once.lua");
    if pes {
        redis::Script::new(&format!(
            "{publish}{counter}{}{once}{body}",
            include_str!("../src/scripts/redisson_pes_common.lua")
        ))
    } else {
        redis::Script::new(&format!("{publish}{counter}{once}{body}"))
    }
}

/// Review of the Redisson scripts: arguments the public API never sends (a negative
/// or mismatched permit count, a deadline no score can hold, a count that is no
/// integer) are refused before anything is written, where they used to create permits,
/// lose them after a write, or store a float as the counter.
#[test]
fn redisson_scripts_refuse_bad_arguments_before_any_write() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let counter = |conn: &mut redis::Connection| -> Option<String> {
        redis::cmd("GET").arg("jobs").query(conn).unwrap()
    };
    redis::cmd("SET")
        .arg("jobs")
        .arg(3)
        .exec(&mut conn)
        .unwrap();
    let pes_acquire = redisson_script(
        true,
        include_str!("../src/scripts/redisson_pes_acquire.lua"),
    );
    let id = |k: u8| vec![k; 16];
    let huge = format!("1{}", "0".repeat(400));
    for (n, deadline, ids) in [
        ("-1", "1000", vec![id(1)]),
        ("1", "1000", vec![id(1), id(2), id(3)]),
        ("2", huge.as_str(), vec![id(1), id(2)]),
        ("1.5", "1000", vec![id(1)]),
    ] {
        let mut inv = pes_acquire.prepare_invoke();
        inv.key("jobs")
            .key("{jobs}:timeout")
            .key("redisson_sc:{jobs}")
            .arg("PUBLISH")
            .arg(1000)
            .arg(n)
            .arg(deadline);
        for i in &ids {
            inv.arg(i.as_slice());
        }
        let r: redis::RedisResult<redis::Value> = inv.invoke(&mut conn);
        assert!(r.is_err(), "pes acquire n={n}: {r:?}");
        assert_eq!(
            counter(&mut conn).as_deref(),
            Some("3"),
            "pes acquire n={n}"
        );
    }
    let rs_try = redisson_script(
        false,
        include_str!("../src/scripts/redisson_rs_try_acquire.lua"),
    );
    for n in ["-5", "0", "1.5", "nan"] {
        let r: redis::RedisResult<redis::Value> = rs_try.key("jobs").arg(n).invoke(&mut conn);
        assert!(r.is_err(), "rs try n={n}: {r:?}");
    }
    let rs_add = redisson_script(false, include_str!("../src/scripts/redisson_rs_add.lua"));
    for d in ["inf", "1.5", "0", "99999999999999999999"] {
        let r: redis::RedisResult<redis::Value> = rs_add
            .key("jobs")
            .key("redisson_sc:{jobs}")
            .arg("PUBLISH")
            .arg(d)
            .invoke(&mut conn);
        assert!(r.is_err(), "rs add {d}: {r:?}");
    }
    let pes_set = redisson_script(true, include_str!("../src/scripts/redisson_pes_set.lua"));
    for (op, v) in [("add", "inf"), ("set", "1.5"), ("set", "1e3")] {
        let r: redis::RedisResult<redis::Value> = pes_set
            .key("fresh")
            .key("{fresh}:timeout")
            .key("redisson_sc:{fresh}")
            .arg("PUBLISH")
            .arg(1000)
            .arg(op)
            .arg(v)
            .invoke(&mut conn);
        assert!(r.is_err(), "pes {op} {v}: {r:?}");
    }
    assert_eq!(counter(&mut conn).as_deref(), Some("3"));
    let fresh: Option<String> = redis::cmd("GET").arg("fresh").query(&mut conn).unwrap();
    assert_eq!(fresh, None);
}

/// Seventh session: a Redisson script called with an argument missing (a direct
/// `EVALSHA` with a wrong argument count) failed after its first write. The lease
/// zset's `getLeaseTime` without its id reclaimed the expired permits (`INCRBY` of the
/// counter, `ZREMRANGEBYSCORE`) and only then raised at `ZSCORE` with a nil argument.
#[test]
fn a_redisson_lease_read_without_its_id_fails_before_any_write() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    redis::cmd("SET")
        .arg("jobs")
        .arg(5)
        .exec(&mut conn)
        .unwrap();
    // two leases that ended long ago (client ms 10 and 20), reclaimable at now = 1000
    redis::cmd("ZADD")
        .arg("{jobs}:timeout")
        .arg(10)
        .arg(vec![1u8; 16])
        .arg(20)
        .arg(vec![2u8; 16])
        .exec(&mut conn)
        .unwrap();
    let lease = redisson_script(true, include_str!("../src/scripts/redisson_pes_lease.lua"));
    for args in [vec!["get"], vec![]] {
        let mut inv = lease.prepare_invoke();
        inv.key("jobs")
            .key("{jobs}:timeout")
            .key("redisson_sc:{jobs}")
            .arg("PUBLISH")
            .arg(1000);
        for a in &args {
            inv.arg(*a);
        }
        let r: redis::RedisResult<redis::Value> = inv.invoke(&mut conn);
        assert!(r.is_err(), "lease {args:?}: {r:?}");
        let counter: Option<String> = redis::cmd("GET").arg("jobs").query(&mut conn).unwrap();
        assert_eq!(
            counter.as_deref(),
            Some("5"),
            "lease {args:?}: counter written"
        );
        let held: u64 = redis::cmd("ZCARD")
            .arg("{jobs}:timeout")
            .query(&mut conn)
            .unwrap();
        assert_eq!(held, 2, "lease {args:?}: leases reclaimed");
    }
    // with its id the same call reclaims them and answers
    let r: Vec<i64> = lease
        .key("jobs")
        .key("{jobs}:timeout")
        .key("redisson_sc:{jobs}")
        .arg("PUBLISH")
        .arg(1000)
        .arg("get")
        .arg(vec![3u8; 16])
        .invoke(&mut conn)
        .unwrap();
    assert_eq!(r, vec![0]);
    let counter: Option<String> = redis::cmd("GET").arg("jobs").query(&mut conn).unwrap();
    assert_eq!(counter.as_deref(), Some("7"));
}

/// Seventh session: Redisson scripts stored a counter that every later call refuses
/// (WRONGTYPE: not integer text of at most 15 digits), from arguments the public API
/// never sends: `setPermits` stored its count as sent ('007', '-0'), and `release`
/// took any n: on a missing counter a 17-digit one was stored, and a negative or zero
/// n (a release that takes permits) was applied.
#[test]
fn redisson_scripts_never_store_a_counter_they_refuse() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let get = |conn: &mut redis::Connection, key: &str| -> Option<String> {
        redis::cmd("GET").arg(key).query(conn).unwrap()
    };
    let pes_set = redisson_script(true, include_str!("../src/scripts/redisson_pes_set.lua"));
    for v in ["007", "-0", "00"] {
        let r: redis::RedisResult<redis::Value> = pes_set
            .key("fresh")
            .key("{fresh}:timeout")
            .key("redisson_sc:{fresh}")
            .arg("PUBLISH")
            .arg(1000)
            .arg("set")
            .arg(v)
            .invoke(&mut conn);
        assert!(r.is_err(), "pes set {v}: {r:?}");
        assert_eq!(get(&mut conn, "fresh"), None, "pes set {v}: stored");
    }
    let rs_release = redisson_script(
        false,
        include_str!("../src/scripts/redisson_rs_release.lua"),
    );
    for n in ["99999999999999999", "0", "-5", "1.5", "007"] {
        for key in ["absent", "jobs"] {
            redis::cmd("SET")
                .arg("jobs")
                .arg(3)
                .exec(&mut conn)
                .unwrap();
            let r: redis::RedisResult<redis::Value> = rs_release
                .key(key)
                .key(format!("redisson_sc:{{{key}}}"))
                .arg("PUBLISH")
                .arg(n)
                .arg("0")
                .invoke(&mut conn);
            assert!(r.is_err(), "rs release {n} on {key}: {r:?}");
            assert_eq!(get(&mut conn, "absent"), None, "rs release {n}: stored");
            assert_eq!(
                get(&mut conn, "jobs").as_deref(),
                Some("3"),
                "rs release {n}"
            );
        }
    }
    // the arguments the library sends still work
    let r: Vec<i64> = rs_release
        .key("jobs")
        .key("redisson_sc:{jobs}")
        .arg("PUBLISH")
        .arg(2)
        .arg("0")
        .invoke(&mut conn)
        .unwrap();
    assert_eq!(r, vec![1, 5]);
    let r: i64 = pes_set
        .key("fresh")
        .key("{fresh}:timeout")
        .key("redisson_sc:{fresh}")
        .arg("PUBLISH")
        .arg(1000)
        .arg("set")
        .arg(0)
        .invoke(&mut conn)
        .unwrap();
    assert_eq!(r, 0);
    assert_eq!(get(&mut conn, "fresh").as_deref(), Some("0"));
}

/// The server's clock (`TIME`) in microseconds.
fn server_us(conn: &mut redis::Connection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(conn).unwrap();
    s * 1_000_000 + us
}

/// Asserts that `p`'s client-side deadline is not after the server's deadline for it
/// (the permit's score in h), to the microsecond. Sound against timing: the server's
/// time T (µs) is read at some instant t before the reply's arrival r, and the lease
/// left is measured after r, so the client's deadline is at least r + left; the server
/// reaches its deadline D at t + (D - T) <= r + (D - T). The deadline is read last (a
/// renewal in between only moves it later).
fn assert_deadline_not_after_servers(conn: &mut redis::Connection, name: &str, p: &Permit) {
    let t = server_us(conn);
    let left = p.lease_left();
    let d: i64 = redis::cmd("ZSCORE")
        .arg(format!("redsem:{{{name}}}:h"))
        .arg(p.id())
        .query(conn)
        .unwrap();
    assert!(
        left.as_micros() as i64 <= d * 1000 - t,
        "the client's deadline is after the server's: {} µs left, the server {} µs",
        left.as_micros(),
        d * 1000 - t
    );
}

/// A renewal (manual, background, or an adoption) sets the server's deadline to
/// its whole-millisecond time plus the lease, up to a millisecond less than a lease
/// after the call ran; the client's deadline must allow for that millisecond, as the
/// conversion of a grant's deadline does, or with a lease under a second it comes after
/// the server's.
#[test]
fn a_renewed_or_adopted_permits_deadline_is_never_after_the_servers() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = client(&server);
    let manual = |name: &str, lease_ms: u64| {
        c.semaphore_builder(name)
            .limit(1)
            .lease(Duration::from_millis(lease_ms))
            .auto_refresh(false)
            .build()
            .unwrap()
    };

    // manual refresh
    let sem = manual("renew-manual", 200);
    let p = sem.acquire().unwrap();
    for _ in 0..50 {
        p.refresh().unwrap();
        assert_deadline_not_after_servers(&mut conn, "renew-manual", &p);
    }
    p.release().unwrap();

    // adoption
    let sem = manual("renew-adopt", 200);
    for _ in 0..50 {
        let parts = sem.acquire().unwrap().into_parts();
        let p = sem.adopt(parts).unwrap();
        assert_deadline_not_after_servers(&mut conn, "renew-adopt", &p);
        p.release().unwrap();
    }

    // background renewal, every third of a 300 ms lease, looked at for 20 of them
    let sem = c
        .semaphore_builder("renew-auto")
        .limit(1)
        .lease(Duration::from_millis(300))
        .build()
        .unwrap();
    let p = sem.acquire().unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        assert_deadline_not_after_servers(&mut conn, "renew-auto", &p);
    }
    assert!(!p.is_lost(), "{:?}", p.lost_reason());
    p.release().unwrap();
}

/// Adopting a grant that a `Permit` of the same client already holds made two handles
/// of one grant: the second adoption replaced the first handle in the refresher (which
/// stopped renewing it), the first release ended both, and an adoption through a
/// handle with a shorter lease moved the server's deadline before the first handle's.
/// It is refused now, before Redis is called, through any handle of the semaphore; the
/// first holder is untouched, and once it has released, the server answers.
#[test]
fn a_grant_held_in_this_client_is_not_adopted_twice() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = client(&server);
    let sem = c.semaphore("adopt-twice", 2).unwrap();
    let short = c
        .semaphore_builder("adopt-twice")
        .limit(2)
        .lease(Duration::from_millis(500))
        .build()
        .unwrap();
    let parts = sem.acquire().unwrap().into_parts();
    let first = sem.adopt(parts.clone()).unwrap();
    let deadline = |conn: &mut redis::Connection| -> i64 {
        redis::cmd("ZSCORE")
            .arg("redsem:{adopt-twice}:h")
            .arg(first.id())
            .query(conn)
            .unwrap()
    };
    let before = deadline(&mut conn);
    for (what, handle) in [("the same handle", &sem), ("a shorter lease", &short)] {
        match handle.adopt(parts.clone()) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(first.id()), "{what}: {m}"),
            other => panic!("{what}: adopted twice: {other:?}"),
        }
    }
    assert_eq!(deadline(&mut conn), before, "Redis was not called");
    first.refresh().unwrap();
    assert!(!first.is_lost());
    first.release().unwrap();
    assert!(matches!(sem.adopt(parts), Err(Error::PermitLost { .. })));
    // a failed adoption leaves no claim behind: a new grant is adopted once, as before
    let again = sem.acquire().unwrap().into_parts();
    let p = short.adopt(again).unwrap();
    p.release().unwrap();
}

/// The holder record of `id` in semaphore `name`, with its slot list replaced by
/// `slots` (an operator's edit).
fn edit_slots(conn: &mut redis::Connection, name: &str, id: &str, slots: &str) {
    let info = format!("redsem:{{{name}}}:i");
    let rec: String = redis::cmd("HGET").arg(&info).arg(id).query(conn).unwrap();
    let mut parts: Vec<&str> = rec.split('|').collect();
    parts[2] = slots;
    redis::cmd("HSET")
        .arg(&info)
        .arg(id)
        .arg(parts.join("|"))
        .exec(conn)
        .unwrap();
}

/// Review of the scripts (2026-11-26, late): records and fields edited by hand made a
/// script fail after its first write, leaving half of an operation behind (a holder
/// gone from h with its permit still counted; a batch's earlier grant orphaned). Each
/// case now runs to its end, and never grants past the limit.
#[test]
fn hand_edited_records_never_make_a_script_fail_after_a_write() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = client(&server);

    // a slot SETBIT refuses, met by a release on the full path (someone queued): the
    // release is done, and the waiter gets the permit in a slot within the limit
    for (k, slots) in ["4294967296", "00", "0,07"].into_iter().enumerate() {
        let name = format!("slots{k}");
        let sem = client.semaphore(&name, 1).unwrap();
        let p = sem.try_acquire().unwrap().expect("the permit");
        let waiter = support::queued_waiter(&sem, Duration::from_secs(10));
        edit_slots(&mut conn, &name, p.id(), slots);
        p.release().expect("a release runs to its end");
        let (got, _) = waiter.join().unwrap();
        let got = got.unwrap().expect("the waiter's permit");
        assert_eq!(got.slots(), &[0], "{slots}");
        assert!(
            sem.try_acquire().unwrap().is_none(),
            "{slots}: never over the limit"
        );
    }

    // the same on the fast path (nobody queued) and when the purge meets it
    let sem = client.semaphore("fastslots", 2).unwrap();
    let p = sem.try_acquire().unwrap().expect("a permit");
    let _other = sem.try_acquire().unwrap().expect("a permit");
    edit_slots(&mut conn, "fastslots", p.id(), "99999");
    p.release().expect("a release runs to its end");
    let short = client
        .semaphore_builder("purged")
        .limit(2)
        .lease(Duration::from_millis(200))
        .auto_refresh(false)
        .build()
        .unwrap();
    let gone = short.try_acquire().unwrap().expect("a permit");
    edit_slots(&mut conn, "purged", gone.id(), "0,4294967296");
    let deadline_ms = server_ms(&mut conn) + 250;
    wait_past_server_ms(&mut conn, deadline_ms);
    assert!(short.available().is_ok(), "the purge runs to its end");
    let a = short
        .try_acquire()
        .unwrap()
        .expect("a permit after the repair");
    let b = short.try_acquire().unwrap().expect("a second permit");
    assert!(
        short.try_acquire().unwrap().is_none(),
        "never over the limit"
    );
    assert!(
        a.slots()[0] < 2 && b.slots()[0] < 2,
        "{:?} {:?}",
        a.slots(),
        b.slots()
    );
    drop(gone);

    // a waiter record that does not parse: the waiter is dropped, not a failed release
    let sem = client.semaphore("wrec", 1).unwrap();
    let p = sem.try_acquire().unwrap().expect("the permit");
    let waiter = support::queued_waiter(&sem, Duration::from_secs(10));
    let queued: Vec<String> = redis::cmd("ZRANGE")
        .arg("redsem:{wrec}:q")
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .unwrap();
    redis::cmd("HSET")
        .arg("redsem:{wrec}:i")
        .arg(format!("w:{}", queued[0]))
        .arg("garbage")
        .exec(&mut conn)
        .unwrap();
    p.release().expect("a release runs to its end");
    // the waiter looks again (its heartbeat or its timer) and queues anew
    let (got, _) = waiter.join().unwrap();
    assert!(got.unwrap().is_some(), "the waiter still gets the permit");

    // a stored limit that is no integer ('nan' and 'inf' pass Lua's tonumber) is
    // ignored: the caller's limit holds
    for bad in ["nan", "inf", "-inf", "1e300", "2.5"] {
        let name = format!("lim-{bad}");
        let sem = client.semaphore(&name, 2).unwrap();
        let first = sem.try_acquire().unwrap().expect("a permit");
        redis::cmd("HSET")
            .arg(format!("redsem:{{{name}}}:i"))
            .arg("limit")
            .arg(bad)
            .exec(&mut conn)
            .unwrap();
        let second = sem.try_acquire().unwrap().expect("a second permit");
        assert!(
            sem.try_acquire().unwrap().is_none(),
            "limit {bad}: never over 2"
        );
        assert!(sem.try_acquire_many(2).unwrap().is_none(), "limit {bad}");
        drop((first, second));
    }

    // a live holder record that does not parse, met by a batch's repeated id after an
    // earlier operation of the batch was granted: the batch runs to its end
    let sem = client.semaphore("grec", 3).unwrap();
    let held = sem.try_acquire().unwrap().expect("a permit");
    redis::cmd("HSET")
        .arg("redsem:{grec}:i")
        .arg(held.id())
        .arg("garbage")
        .exec(&mut conn)
        .unwrap();
    let batch = support::batch_script();
    let fresh = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa";
    let mut inv = call_on(&batch, "grec");
    support::batch_try_many(&mut inv, fresh, 1, 3, 10_000);
    support::batch_try_many(&mut inv, held.id(), 1, 3, 10_000);
    let replies: Vec<redis::Value> = inv.invoke(&mut conn).expect("the batch runs to its end");
    assert_eq!(support::acquire_reply(&replies[0])[0], 1, "{replies:?}");
    assert_eq!(
        support::acquire_reply(&replies[1])[..3],
        [1, support::acquire_reply(&replies[1])[1], 0],
        "a grant without token or slots: {replies:?}"
    );

    // a direct caller that sends three keys is refused before anything is written
    let mut inv = batch.prepare_invoke();
    for part in ["h", "i", "s"] {
        inv.key(format!("redsem:{{grec}}:{part}"));
    }
    inv.arg("r").arg(fresh);
    let err = inv.invoke::<redis::Value>(&mut conn).unwrap_err();
    assert!(err.to_string().contains("four keys"), "{err}");
    let still: Option<String> = redis::cmd("HGET")
        .arg("redsem:{grec}:i")
        .arg(fresh)
        .query(&mut conn)
        .unwrap();
    assert!(still.is_some(), "nothing written");
}

/// Review of the permit paths (2026-11-26, late): a renewal the first holder sent
/// before `into_parts` (its refresher had taken the batch, and the call waited for a
/// connection) ran after another client adopted the grant with a longer lease, and
/// moved the server's deadline back to the first holder's shorter lease. The server
/// then purged the grant and gave its slot away while the adopter's `Permit` still said
/// it had most of its lease left: two valid holders of a limit-1 semaphore, in one slot
/// (reproduced with a busy pool). Renewals and adoptions now never move a deadline
/// earlier; each client counts validity from its own call and lease.
#[test]
fn a_renewal_sent_before_a_hand_over_never_cuts_the_adopter_s_lease_short() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let first = client(&server);
    let short = first
        .semaphore_builder("handover")
        .limit(1)
        .lease(Duration::from_secs(3))
        .build()
        .unwrap();
    let parts = short
        .try_acquire()
        .unwrap()
        .expect("the permit")
        .into_parts();
    let id = parts.id().to_owned();
    let second = client(&server);
    let long = second
        .semaphore_builder("handover")
        .limit(1)
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let adopted = long.adopt(parts).unwrap();
    let score = |conn: &mut redis::Connection| -> i64 {
        redis::cmd("ZSCORE")
            .arg("redsem:{handover}:h")
            .arg(&id)
            .query(conn)
            .unwrap()
    };
    let after_adopt = score(&mut conn);
    // the first holder's renewal, sent before the hand-over, arrives now
    let refresh = support::refresh_script();
    let lost: Vec<redis::Value> = call_on(&refresh, "handover")
        .arg(3000)
        .arg(1000)
        .arg(&id)
        .invoke(&mut conn)
        .unwrap();
    assert_eq!(lost.len(), 1, "renewed, nothing lost: {lost:?}");
    assert!(
        score(&mut conn) >= after_adopt,
        "the deadline moved back from {after_adopt} to {}",
        score(&mut conn)
    );
    // the adopter's view is never later than the server's
    let server_left = score(&mut conn) - server_ms(&mut conn);
    assert!(
        adopted.lease_left() <= Duration::from_millis(server_left.max(0) as u64),
        "{:?} left on the client, {server_left} ms on the server",
        adopted.lease_left()
    );
    assert!(
        long.try_acquire().unwrap().is_none(),
        "never over the limit"
    );

    // an adoption with a shorter lease than the grant's sets its own (the permit comes
    // back when that ends, should the adopter die), and its view is never later
    let parts = adopted.into_parts();
    let again = short.adopt(parts).unwrap();
    let server_left = score(&mut conn) - server_ms(&mut conn);
    assert!(server_left <= 3_000, "{server_left} ms left on the server");
    assert!(
        again.lease_left() <= Duration::from_millis(server_left.max(0) as u64),
        "{:?} left on the client, {server_left} ms on the server",
        again.lease_left()
    );
}

/// `Semaphore::set_limit` promises: "The stored limit is kept for at least a day after
/// this call, and as long as the semaphore is in use." Once the retention (a day; here
/// the script's retention argument, 2 s, stands for it) has passed, a semaphore
/// still in use must keep its stored limit: a grant, a renewal, must carry it on.
/// It did not: the keys' expiry then followed the leases only (the last deadline plus
/// the padding, at most a second), so the first second in which nobody held a permit
/// deleted the stored limit with the keys, and every client went back to its own
/// limit: 5 holders where the operator had stored 2.
#[test]
fn a_stored_limit_outlives_its_retention_while_the_semaphore_is_in_use() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = redis_semaphore::Client::open(server.url()).unwrap();
    let sem = client
        .semaphore_builder("kept")
        .limit(5)
        .lease(Duration::from_millis(200))
        .build()
        .unwrap();
    // set_limit(2), as the client sends it but with a retention of 2 s for its day
    let stored_at = server_ms(&mut conn);
    let previous: i64 = call_on(&support::set_limit_script(), "kept")
        .arg(2)
        .arg(2000)
        .invoke(&mut conn)
        .unwrap();
    assert_eq!(previous, -1);
    assert_eq!(sem.limit().unwrap(), 2);

    // the retention passes while the semaphore is in use: a permit is held (and
    // renewed by the keepalive) from before its end to after it
    let p = sem.try_acquire().unwrap().expect("a free permit");
    wait_past_server_ms(&mut conn, stored_at + 2000);
    assert_eq!(
        sem.limit().unwrap(),
        2,
        "stored limit while a permit is held"
    );
    p.release().unwrap();
    let released_at = server_ms(&mut conn);

    // ... and it goes on being used after a short pause without holders, far shorter
    // than the retention: every lease it had (200 ms) and its padding (200 ms) over
    let paused = Instant::now();
    wait_past_server_ms(&mut conn, released_at + 500);
    let status = sem.status().unwrap();
    assert_eq!(
        status.stored_limit,
        Some(2),
        "the stored limit was lost after a pause of {:?} without holders; status now: \
         {status:?}",
        paused.elapsed()
    );
    // what that costs: three holders of a semaphore whose stored limit is 2
    let three: Vec<_> = (0..3).filter_map(|_| sem.try_acquire().unwrap()).collect();
    assert_eq!(
        three.len(),
        2,
        "held {} permits under a stored limit of 2",
        three.len()
    );
}

/// The operators' fields 'cl' and 'cdl' (the limits clients passed) edited by hand to
/// text that is no number: the inspect script put a nil into its reply array, which
/// Redis cuts short there ('cl') or which shifts the holders' list by one ('cdl'), so
/// `status()` failed with "short reply" and `holders()` with a malformed list, an
/// error that does not say what is wrong, for a field that is only shown to operators
/// (the scripts ignore a stored 'limit' or 'ctr' that is no number, common.lua).
#[test]
fn a_client_limit_field_edited_by_hand_does_not_break_status_or_holders() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = redis_semaphore::Client::open(server.url()).unwrap();
    let sem = client.semaphore("edited", 3).unwrap();
    let _p = sem.try_acquire().unwrap().expect("a free permit");
    let info = "redsem:{edited}:i";
    let () = redis::cmd("HSET")
        .arg(info)
        .arg("cl")
        .arg("abc")
        .query(&mut conn)
        .unwrap();
    let status = sem.status();
    assert!(status.is_ok(), "status with 'cl' = abc: {status:?}");
    let () = redis::cmd("HSET")
        .arg(info)
        .arg("cl")
        .arg("3")
        .arg("cdl")
        .arg("x")
        .query(&mut conn)
        .unwrap();
    let holders = sem.holders();
    assert!(
        holders.as_ref().is_ok_and(|h| h.len() == 1),
        "holders with 'cdl' = x: {holders:?}"
    );
}

/// adopt.lua's header: a holder record whose grant time does not parse (edited by
/// hand) is adopted with the reply `{1}` alone (max_hold then counts from the
/// adoption); it was refused as held "with another token or other slots" (review).
#[test]
fn a_record_whose_grant_time_does_not_parse_is_still_adopted() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = Client::open(server.url()).unwrap();
    let sem = client.semaphore("edited-time", 2).unwrap();
    let parts = sem.acquire().unwrap().into_parts();
    let info = "redsem:{edited-time}:i";
    let rec: String = redis::cmd("HGET")
        .arg(info)
        .arg(parts.id())
        .query(&mut conn)
        .unwrap();
    // n|token|slots|time|origin: the time edited to text that is no number
    let f: Vec<&str> = rec.splitn(5, '|').collect();
    let edited = format!("{}|{}|{}|x{}|{}", f[0], f[1], f[2], f[3], f[4]);
    let () = redis::cmd("HSET")
        .arg(info)
        .arg(parts.id())
        .arg(&edited)
        .query(&mut conn)
        .unwrap();
    let adopted = sem.adopt(parts);
    assert!(adopted.is_ok(), "record {edited:?}: {:?}", adopted.err());
}

/// Fifth session (2026-11-27): a grant served to a waiter lasted a whole heartbeat from
/// the moment it was served, however little was left of the waiter's own heartbeat. A
/// waiter whose process died (or a wait that gave up its id without a cancel, in an
/// outage) was served by a release just before its heartbeat ended, and the permit it
/// never took stayed captured for a second more: up to two heartbeats in all, where
/// DESIGN.md allows a dead waiter about one. A served grant now ends no later than the
/// served waiter's heartbeat (a waiter's own look, which proves it alive, still gets a
/// whole heartbeat), so the waiter behind gets the permit when that heartbeat ends.
#[test]
fn a_grant_served_to_a_dead_waiter_ends_with_its_heartbeat() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let name = "deadhead";
    let lease = Duration::from_secs(60);
    let sem = client(&server)
        .semaphore_builder(name)
        .limit(1)
        .lease(lease)
        .build()
        .unwrap();
    let held = sem.try_acquire().unwrap().unwrap();
    let dead = uuid(7);
    // a waiter with a heartbeat of a second, which nobody renews
    queue_dead_waiter(&mut conn, name, &dead, 1, lease.as_millis() as u64);
    let heartbeat_end: i64 = redis::cmd("ZSCORE")
        .arg(format!("redsem:{{{name}}}:h"))
        .arg(format!("w:{dead}"))
        .query(&mut conn)
        .unwrap();
    // a live waiter of another client queues behind it
    let live = client(&server)
        .semaphore_builder(name)
        .limit(1)
        .lease(lease)
        .build()
        .unwrap();
    let behind = std::thread::spawn(move || live.acquire_timeout(Duration::from_secs(10)));
    wait_until(Duration::from_secs(5), "the live waiter to queue", || {
        sem.queue_len().unwrap() == 2
    });
    // the release comes while the dead waiter's heartbeat still runs: it is served
    wait_until(
        Duration::from_secs(5),
        "the dead waiter's last moments",
        || server_ms(&mut conn) >= heartbeat_end - 300,
    );
    held.release().unwrap();
    let granted_until: Option<i64> = redis::cmd("ZSCORE")
        .arg(format!("redsem:{{{name}}}:h"))
        .arg(&dead)
        .query(&mut conn)
        .unwrap();
    let granted_until = granted_until.expect("the dead waiter at the head was served");
    assert!(
        granted_until <= heartbeat_end,
        "the grant to a dead waiter lasts until {granted_until}, {} ms past its heartbeat",
        granted_until - heartbeat_end
    );
    // the live waiter gets the permit when the dead waiter's heartbeat ends (it is told
    // to look then), not a heartbeat later
    let p = behind
        .join()
        .unwrap()
        .unwrap()
        .expect("the live waiter's permit");
    let got_at = server_ms(&mut conn);
    assert!(
        got_at < heartbeat_end + 500,
        "the live waiter got the permit {} ms after the dead waiter's heartbeat ended",
        got_at - heartbeat_end
    );
    drop(p);
    assert_ttls(&mut conn, name);
}

/// Review (fifth session): a grant adopted again in the client that still held a
/// `Permit` of it, once that permit was known lost, gave the client two handles of one
/// grant. The first permit had been declared lost by this client's clock while the
/// server still held the grant (here: the first holder's renewal, sent before the
/// hand-over, arrived after it, as `a_renewal_sent_before_a_hand_over_...` sends it),
/// and the adoption claimed the grant because no live permit of the client was
/// registered under its id. Dropping the lost permit then released the grant on the
/// server (and took the second handle out of the refresher by its id), while the second
/// handle still said it was valid: another client got the permit, two valid holders
/// of a semaphore of one. A grant is now adopted only while no `Permit` of the client
/// holds it, lost or not.
#[test]
fn a_lost_permit_still_in_hand_keeps_its_grant_from_a_second_adoption() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = client(&server);
    let name = "readopt";
    let long = c
        .semaphore_builder(name)
        .limit(1)
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let short = c
        .semaphore_builder(name)
        .limit(1)
        .lease(Duration::from_millis(500))
        .auto_refresh(false)
        .build()
        .unwrap();
    let parts = long
        .try_acquire()
        .unwrap()
        .expect("a free permit")
        .into_parts();
    let id = parts.id().to_owned();
    let first = short.adopt(parts.clone()).unwrap();
    // the first holder's renewal, sent before the hand-over, arrives now: the server
    // keeps the grant for 30 s, the adopter counts its own 500 ms
    let refresh = support::refresh_script();
    let renewed: Vec<redis::Value> = call_on(&refresh, name)
        .arg(30_000)
        .arg(1000)
        .arg(&id)
        .invoke(&mut conn)
        .unwrap();
    assert_eq!(renewed.len(), 1, "renewed, nothing lost: {renewed:?}");
    first
        .lost()
        .recv_timeout(Duration::from_secs(10))
        .expect("the adopter's lease runs out by its clock");
    match long.adopt(parts.clone()) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains(&id), "{m}"),
        Ok(second) => {
            // the lost permit goes: its release frees the grant on the server
            drop(first);
            let other = client(&server);
            let taken = other.semaphore(name, 1).unwrap().try_acquire().unwrap();
            panic!(
                "adopted a second time while a lost Permit of the grant was in hand: after \
                 the lost one was dropped, the second says lost={} lease_left={:?}, and \
                 another client got the permit: {}",
                second.is_lost(),
                second.lease_left(),
                taken.is_some()
            );
        }
        Err(e) => panic!("{e}"),
    }
    // once the lost permit is dropped (its release frees the grant), nothing is left
    // to adopt, and the semaphore is free
    drop(first);
    assert!(matches!(long.adopt(parts), Err(Error::PermitLost { .. })));
    assert!(long.try_acquire().unwrap().is_some());
}

/// Review (fifth session): `max_hold` promises that a permit's lease "runs out, at
/// most one lease after `max_hold`" (counted from the grant, also across an
/// adoption). An adoption after `max_hold` renewed the grant for a whole lease all the
/// same, so a permit handed over and adopted past its max hold lived a lease longer,
/// and one handed on again and again lived for ever. Past its max hold a grant is
/// adopted as it is now: not renewed, its lease ends when it would have.
#[test]
fn an_adoption_past_max_hold_does_not_renew_the_grant() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = client(&server);
    let name = "adopt-held-out";
    let build = || {
        c.semaphore_builder(name)
            .limit(1)
            .lease(Duration::from_secs(4))
            .refresh_interval(Duration::from_secs(1))
            .max_hold(Duration::from_millis(200))
            .build()
            .unwrap()
    };
    let (giver, taker) = (build(), build());
    let p = giver.try_acquire().unwrap().expect("a free permit");
    let id = p.id().to_owned();
    let score = |conn: &mut redis::Connection| -> i64 {
        redis::cmd("ZSCORE")
            .arg(format!("redsem:{{{name}}}:h"))
            .arg(&id)
            .query(conn)
            .unwrap()
    };
    // past max_hold by the server's clock (the grant's time is the server's), before
    // the first renewal would be due
    let granted_ms = score(&mut conn) - 4_000;
    wait_past_server_ms(&mut conn, granted_ms + 300);
    let before = score(&mut conn);
    let adopted = taker.adopt(p.into_parts()).unwrap();
    let after = score(&mut conn);
    assert!(
        after <= before,
        "an adoption past max_hold renewed the grant by {} ms",
        after - before
    );
    let server_left = after - server_ms(&mut conn);
    assert!(
        adopted.lease_left() <= Duration::from_millis(server_left.max(0) as u64),
        "{:?} left on the client, {server_left} ms on the server",
        adopted.lease_left()
    );
    assert!(!adopted.is_lost(), "the grant's lease still runs");
    let reason = adopted
        .lost()
        .recv_timeout(Duration::from_secs(10))
        .expect("lost fires when the grant's lease ends");
    assert_eq!(reason, redis_semaphore::LostReason::MaxHold);
    assert!(
        server_ms(&mut conn) >= after - 50,
        "lost fired before the grant's lease ended on the server"
    );
}

/// Review of hostile writes (sixth session): a holder record edited to claim more
/// permits than the slots it names, released while someone queued (the full logic),
/// lowered 'used' by the permits it claimed but cleared fewer slot bits, and the same
/// script then served the queue's head as if those permits were free: on a limit of 2,
/// the other holder's permit and the waiter's two, three valid permits, one in slot 2
/// (K5, K2). The fast release already compared the bits it cleared with the record's
/// count; free_slots (the full logic: release, purge, a grant over an ended lease) now
/// does too, and a script that met such a record grants nothing more (`damaged`; the
/// next call repairs the disagreement).
#[test]
fn a_holder_record_claiming_more_permits_than_its_slots_grants_nothing_past_the_limit() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = client(&server);
    let name = "claims";
    let info = format!("redsem:{{{name}}}:i");
    let sem = client
        .semaphore_builder(name)
        .limit(2)
        .lease(Duration::from_secs(30))
        .auto_refresh(false)
        .build()
        .unwrap();
    let a = sem.try_acquire().unwrap().expect("a permit");
    let b = sem.try_acquire().unwrap().expect("a second permit");
    // a waiter of another process for both permits: the release takes the full logic
    let waiter = uuid(7);
    let script = acquire_script();
    let mut inv = call_on(&script, name);
    inv.arg(&waiter)
        .arg(2)
        .arg(2)
        .arg(30_000)
        .arg(1000)
        .arg(30_000)
        .arg("1|other|")
        .arg("w")
        .arg("1")
        .arg("")
        .arg("0");
    let reply: Vec<i64> = inv.invoke(&mut conn).unwrap();
    assert_eq!(reply[0], 0, "queued, not granted: {reply:?}");
    // a's record claims two permits, naming its one slot
    let rec: String = redis::cmd("HGET")
        .arg(&info)
        .arg(a.id())
        .query(&mut conn)
        .unwrap();
    let mut parts: Vec<&str> = rec.split('|').collect();
    parts[0] = "2";
    redis::cmd("HSET")
        .arg(&info)
        .arg(a.id())
        .arg(parts.join("|"))
        .exec(&mut conn)
        .unwrap();
    a.release().expect("a release runs to its end");
    let granted: Option<String> = redis::cmd("HGET")
        .arg(&info)
        .arg(&waiter)
        .query(&mut conn)
        .unwrap();
    let bits: i64 = redis::cmd("BITCOUNT")
        .arg(format!("redsem:{{{name}}}:s"))
        .query(&mut conn)
        .unwrap();
    assert!(
        granted.is_none() && bits <= 2,
        "the waiter was granted {granted:?} ({bits} slot bits set) while the other \
         holder keeps slot {:?}: over the limit of 2",
        b.slots()
    );
    drop(b);
}
