//! The ownerless counting semaphore (P/V) against a real Redis: its count semantics
//! (try_set once, add, reduce, drain, debt), push wake-ups, timeouts that leave
//! nothing behind, errors, and a producer-consumer across processes.
//!
//! The helper processes are this very test binary, started again with
//! `REDSEM_HELPER` set: the `helper` test then plays the part it is told.

#![allow(clippy::disallowed_methods)] // the tests set socket timeouts as they need

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redis_semaphore::{Client, CountingSemaphore, Error};
use support::{RedisServer, keys, wait_until};

/// Counting script `$file` as the library builds it (prelude + body), to send what the
/// public API never would.
macro_rules! counting_script {
    ($file:literal) => {
        redis::Script::new(concat!(
            include_str!("../src/scripts/once.lua"),
            include_str!("../src/scripts/counting_common.lua"),
            include_str!(concat!("../src/scripts/", $file))
        ))
    };
}

const WAIT: Duration = Duration::from_secs(10);

fn counting(server: &RedisServer, name: &str) -> CountingSemaphore {
    Client::open(server.url())
        .unwrap()
        .counting_semaphore(name)
        .unwrap()
}

/// The keys matching `pattern` but the short-lived operation keys (`:op:<uuid>`, one per
/// call that changed the count), each of which must be on its way out: a TTL of at most
/// twice the operation timeout (2 s) and eleven seconds.
fn lasting_keys(conn: &mut redis::Connection, pattern: &str) -> Vec<String> {
    let (ops, rest): (Vec<String>, Vec<String>) = keys(conn, pattern)
        .into_iter()
        .partition(|k| k.contains(":op:"));
    for k in ops {
        let ttl: i64 = redis::cmd("PTTL").arg(&k).query(conn).unwrap();
        assert!((1..=15_000).contains(&ttl), "{k} lives {ttl} ms more");
    }
    rest
}

fn queue_reaches(sem: &CountingSemaphore, n: u32) {
    wait_until(WAIT, &format!("queue length {n}"), || {
        sem.queue_len().unwrap() == n
    });
}

/// Producer-consumer roles for the cross-process test.
const PRODUCERS: usize = 2;
const CONSUMERS: usize = 3;
const PER_PRODUCER: usize = 150;
const PER_CONSUMER: usize = PRODUCERS * PER_PRODUCER / CONSUMERS;
const ITEMS_NAME: &str = "pv:items";
const ITEMS_LIST: &str = "pv:list";

/// Runs the role named by `REDSEM_HELPER`; does nothing in a normal test run.
#[test]
fn helper() {
    let Ok(role) = std::env::var("REDSEM_HELPER") else {
        return;
    };
    let url = std::env::var("REDSEM_URL").unwrap();
    let client = Client::open(&url).unwrap();
    let sem = client.counting_semaphore(ITEMS_NAME).unwrap();
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    println!("RESULT started");
    match role.as_str() {
        // pushes an item, then releases one permit for it (V); pauses now and then so
        // that consumers run dry and have to block
        "producer" => {
            let me = std::process::id();
            for i in 0..PER_PRODUCER {
                let _: i64 = redis::cmd("RPUSH")
                    .arg(ITEMS_LIST)
                    .arg(format!("{me}:{i}"))
                    .query(&mut conn)
                    .unwrap();
                sem.release(1).unwrap();
                if i % 10 == 0 {
                    thread::sleep(Duration::from_millis(15));
                }
            }
            println!("RESULT produced {PER_PRODUCER}");
        }
        // acquires one permit (P), then pops an item: there must always be one
        "consumer" => {
            let mut empty = 0;
            let mut blocked = 0;
            for _ in 0..PER_CONSUMER {
                if !sem.try_acquire(1).unwrap() {
                    blocked += 1;
                    assert!(
                        sem.acquire_timeout(1, Duration::from_secs(20)).unwrap(),
                        "no item came within 20 s"
                    );
                }
                let item: Option<String> =
                    redis::cmd("LPOP").arg(ITEMS_LIST).query(&mut conn).unwrap();
                if item.is_none() {
                    empty += 1;
                }
            }
            println!("RESULT consumed {PER_CONSUMER} empty={empty} blocked={blocked}");
        }
        // blocks on a semaphore nobody releases, until killed
        "waiter" => {
            let sem = client.counting_semaphore("orphan").unwrap();
            let ok = sem.acquire_timeout(1, Duration::from_secs(60)).unwrap();
            println!("RESULT acquired {ok}");
        }
        other => panic!("unknown helper role {other}"),
    }
}

/// A helper process and its stdout, read line by line.
struct Helper {
    child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Helper {
    /// Starts `role` and waits until it runs, so that the processes really overlap.
    fn spawn(role: &str, url: &str) -> Helper {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["helper", "--exact", "--nocapture", "--test-threads=1"])
            .env("REDSEM_HELPER", role)
            .env("REDSEM_URL", url)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start helper {role}: {e}"));
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut helper = Helper { child, lines };
        assert_eq!(helper.result_line(), "RESULT started");
        helper
    }

    /// Reads stdout until the next RESULT line.
    fn result_line(&mut self) -> String {
        self.lines
            .by_ref()
            .find_map(|l| {
                l.ok()
                    .and_then(|l| l.find("RESULT ").map(|at| l[at..].to_owned()))
            })
            .unwrap_or_else(|| panic!("helper ended without a RESULT line"))
    }

    /// Reads the final RESULT line and waits for a successful exit.
    fn finish(mut self) -> String {
        let line = self.result_line();
        self.lines.for_each(drop);
        assert!(
            self.child.wait().unwrap().success(),
            "helper failed: {line}"
        );
        line
    }
}

#[test]
fn producers_and_consumers_in_separate_processes_never_find_the_list_empty() {
    let server = RedisServer::start();
    let url = server.url();
    let sem = counting(&server, ITEMS_NAME);
    assert!(sem.try_set_permits(0).unwrap());

    // Checker: at every sampled instant, 0 <= count <= items in the list (a producer
    // pushes before it releases; a consumer acquires before it pops), read atomically.
    let stop = Arc::new(AtomicBool::new(false));
    let checker = {
        let stop = Arc::clone(&stop);
        let mut conn = server.conn();
        thread::spawn(move || {
            let mut samples = 0u64;
            let mut most = 0i64;
            while !stop.load(Ordering::Relaxed) {
                let (count, len): (Option<i64>, i64) = redis::pipe()
                    .atomic()
                    .cmd("GET")
                    .arg("redsem:{pv:items}:count")
                    .cmd("LLEN")
                    .arg(ITEMS_LIST)
                    .query(&mut conn)
                    .unwrap();
                let count = count.unwrap();
                assert!(count >= 0, "the count went negative: {count}");
                assert!(count <= len, "count {count} but only {len} items listed");
                most = most.max(count);
                samples += 1;
            }
            (samples, most)
        })
    };

    let consumers: Vec<Helper> = (0..CONSUMERS)
        .map(|_| Helper::spawn("consumer", &url))
        .collect();
    let producers: Vec<Helper> = (0..PRODUCERS)
        .map(|_| Helper::spawn("producer", &url))
        .collect();
    for p in producers {
        assert_eq!(p.finish(), format!("RESULT produced {PER_PRODUCER}"));
    }
    let mut blocked_total = 0;
    for c in consumers {
        let line = c.finish();
        assert!(
            line.starts_with(&format!("RESULT consumed {PER_CONSUMER} empty=0 ")),
            "{line}"
        );
        blocked_total += line
            .rsplit("blocked=")
            .next()
            .unwrap()
            .parse::<u32>()
            .unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let (samples, _most) = checker.join().unwrap();
    assert!(samples > 10, "the checker sampled only {samples} times");
    assert!(
        blocked_total > 0,
        "no consumer ever had to wait: the test proved nothing about wake-ups"
    );
    // every item made was consumed, every permit given was taken
    assert_eq!(sem.balance().unwrap(), Some(0));
    let len: i64 = redis::cmd("LLEN")
        .arg(ITEMS_LIST)
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(len, 0);
    assert_eq!(sem.queue_len().unwrap(), 0);
}

#[test]
fn try_set_permits_sets_only_an_unset_semaphore() {
    let server = RedisServer::start();
    let sem = counting(&server, "once");
    let other = counting(&server, "once");
    assert_eq!(sem.balance().unwrap(), None);
    assert_eq!(sem.available_permits().unwrap(), 0);
    assert!(sem.try_set_permits(3).unwrap());
    assert!(!other.try_set_permits(7).unwrap());
    assert_eq!(other.available_permits().unwrap(), 3);
    // also when the count has gone to 0: set is set
    sem.drain_permits().unwrap();
    assert!(!other.try_set_permits(7).unwrap());
    assert_eq!(sem.balance().unwrap(), Some(0));

    // release and add_permits create an unset semaphore, as Redisson's do
    let released = counting(&server, "released-first");
    released.release(2).unwrap();
    assert!(!released.try_set_permits(9).unwrap());
    assert_eq!(released.available_permits().unwrap(), 2);
    let added = counting(&server, "added-first");
    added.add_permits(4).unwrap();
    assert!(!added.try_set_permits(9).unwrap());
    assert_eq!(added.available_permits().unwrap(), 4);
}

#[test]
fn add_reduce_drain_and_debt() {
    let server = RedisServer::start();
    let sem = counting(&server, "ops");
    // acquiring from an unset semaphore fails (it reads 0)
    assert!(!sem.try_acquire(1).unwrap());
    assert!(sem.try_set_permits(5).unwrap());
    assert!(sem.try_acquire(2).unwrap());
    assert_eq!(sem.available_permits().unwrap(), 3);
    assert!(!sem.try_acquire(4).unwrap());
    assert_eq!(
        sem.available_permits().unwrap(),
        3,
        "a failed try takes nothing"
    );
    sem.add_permits(3).unwrap();
    assert_eq!(sem.balance().unwrap(), Some(6));

    // reduce below 0: a debt, reported as 0 available; acquires fail until paid back
    sem.reduce_permits(8).unwrap();
    assert_eq!(sem.balance().unwrap(), Some(-2));
    assert_eq!(sem.available_permits().unwrap(), 0);
    assert!(!sem.try_acquire(1).unwrap());
    assert!(!sem.acquire_timeout(1, Duration::from_millis(50)).unwrap());
    sem.release(2).unwrap();
    assert_eq!(sem.balance().unwrap(), Some(0));
    assert!(!sem.try_acquire(1).unwrap(), "never while the count is 0");
    sem.release(1).unwrap();
    assert!(sem.try_acquire(1).unwrap());
    assert_eq!(sem.balance().unwrap(), Some(0));

    // add_permits with a negative delta is reduce_permits
    sem.add_permits(-3).unwrap();
    assert_eq!(sem.balance().unwrap(), Some(-3));

    // drain: takes what is free and returns it; clears a debt to 0 and returns 0
    assert_eq!(sem.drain_permits().unwrap(), 0);
    assert_eq!(sem.balance().unwrap(), Some(0));
    sem.release(4).unwrap();
    assert_eq!(sem.drain_permits().unwrap(), 4);
    assert_eq!(sem.balance().unwrap(), Some(0));
    assert_eq!(sem.drain_permits().unwrap(), 0);
    // an unset semaphore stays unset
    let fresh = counting(&server, "never-set");
    assert_eq!(fresh.drain_permits().unwrap(), 0);
    assert_eq!(fresh.balance().unwrap(), None);

    // the count's range is ±(2^32 - 1): past it, refused and unchanged
    sem.release(u32::MAX).unwrap();
    assert!(matches!(sem.release(1), Err(Error::CountOutOfRange { .. })));
    assert_eq!(sem.balance().unwrap(), Some(i64::from(u32::MAX)));
    assert_eq!(sem.drain_permits().unwrap(), u32::MAX);
    sem.reduce_permits(u32::MAX).unwrap();
    let err = sem.add_permits(-1).unwrap_err();
    assert!(matches!(err, Error::CountOutOfRange { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "the count of counting semaphore \"ops\" would leave its range: \
         -4294967295 + -1 is outside -4294967295..=4294967295"
    );
    assert_eq!(sem.balance().unwrap(), Some(-i64::from(u32::MAX)));

    // the count key never gets a TTL
    let ttl: i64 = redis::cmd("PTTL")
        .arg("redsem:{ops}:count")
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(ttl, -1);
}

#[test]
fn a_blocked_acquire_wakes_promptly_on_a_release_from_another_client() {
    let server = RedisServer::start();
    let consumer = counting(&server, "wake");
    let producer = counting(&server, "wake");
    assert!(consumer.try_set_permits(0).unwrap());
    // Several rounds; the re-check timer alone would take 100 ms on average (uniform
    // over 0..200 ms), a pushed wake-up about a round trip.
    let mut handoffs = Vec::new();
    for _ in 0..7 {
        let waiter = {
            let sem = consumer.clone();
            thread::spawn(move || {
                let ok = sem.acquire_timeout(1, WAIT).unwrap();
                (ok, Instant::now())
            })
        };
        queue_reaches(&producer, 1);
        let released = Instant::now();
        producer.release(1).unwrap();
        let (ok, woke) = waiter.join().unwrap();
        assert!(ok);
        handoffs.push(woke - released);
    }
    handoffs.sort();
    let median = handoffs[handoffs.len() / 2];
    assert!(
        median < Duration::from_millis(60),
        "hand-offs {handoffs:?}: the waiters were not woken by the release"
    );
    assert_eq!(producer.balance().unwrap(), Some(0));
    assert_eq!(producer.queue_len().unwrap(), 0);
}

#[test]
fn a_blocking_acquire_of_several_permits_waits_until_they_are_all_there() {
    let server = RedisServer::start();
    let sem = counting(&server, "many");
    assert!(sem.try_set_permits(1).unwrap());
    let waiter = {
        let sem = sem.clone();
        thread::spawn(move || sem.acquire(3))
    };
    queue_reaches(&sem, 1);
    sem.release(1).unwrap();
    // 2 free, 3 wanted: still waiting, and nothing taken
    assert_eq!(sem.queue_len().unwrap(), 1);
    assert_eq!(sem.balance().unwrap(), Some(2));
    assert!(!waiter.is_finished());
    sem.add_permits(1).unwrap();
    waiter.join().unwrap().unwrap();
    assert_eq!(sem.balance().unwrap(), Some(0));
    assert_eq!(sem.queue_len().unwrap(), 0);
}

#[test]
fn waiters_on_an_unset_semaphore_wake_when_it_is_set() {
    let server = RedisServer::start();
    let sem = counting(&server, "unset");
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let sem = sem.clone();
            thread::spawn(move || sem.acquire_timeout(1, WAIT).unwrap())
        })
        .collect();
    queue_reaches(&sem, 3);
    assert!(sem.try_set_permits(2).unwrap());
    // two of them get a permit; the third waits on
    wait_until(WAIT, "two waiters served", || {
        waiters.iter().filter(|w| w.is_finished()).count() == 2
    });
    assert_eq!(sem.queue_len().unwrap(), 1);
    sem.release(1).unwrap();
    for w in waiters {
        assert!(w.join().unwrap());
    }
    assert_eq!(sem.balance().unwrap(), Some(0));
}

#[test]
fn acquire_timeout_gives_up_at_its_deadline_and_leaves_no_waiter_behind() {
    let server = RedisServer::start();
    let sem = counting(&server, "late");
    assert!(sem.try_set_permits(0).unwrap());
    let timeout = Duration::from_millis(300);
    let started = Instant::now();
    assert!(!sem.acquire_timeout(2, timeout).unwrap());
    let took = started.elapsed();
    assert!(took >= timeout, "gave up early, after {took:?}");
    assert!(took < timeout + Duration::from_secs(1), "took {took:?}");
    assert_eq!(sem.queue_len().unwrap(), 0);
    // only the count remains: the waiter keys went with the last waiter
    let mut conn = server.conn();
    assert_eq!(
        lasting_keys(&mut conn, "redsem:{late}:*"),
        vec!["redsem:{late}:count"]
    );
    assert_eq!(
        sem.balance().unwrap(),
        Some(0),
        "a timed-out wait takes nothing"
    );

    // a zero timeout is a plain try
    assert!(!sem.acquire_timeout(1, Duration::ZERO).unwrap());
    sem.release(1).unwrap();
    assert!(sem.acquire_timeout(1, Duration::ZERO).unwrap());
}

/// Queues a waiter by hand, exactly as the acquire script records one: arrival
/// `ticket`, heartbeat deadline `heartbeat_ms` (server ms; 1 is long dead), `n`
/// permits, wake-up `channel`.
fn fake_waiter(
    conn: &mut redis::Connection,
    name: &str,
    id: &str,
    ticket: u64,
    heartbeat_ms: u64,
    n: u32,
    channel: &str,
) {
    let _: () = redis::pipe()
        .atomic()
        .cmd("ZADD")
        .arg(format!("redsem:{{{name}}}:cq"))
        .arg(ticket)
        .arg(id)
        .ignore()
        .cmd("ZADD")
        .arg(format!("redsem:{{{name}}}:ch"))
        .arg(heartbeat_ms)
        .arg(id)
        .ignore()
        .cmd("HSET")
        .arg(format!("redsem:{{{name}}}:cw"))
        .arg(id)
        .arg(format!("{n}|{channel}"))
        .ignore()
        .query(conn)
        .unwrap();
}

/// A heartbeat deadline far in the future (server ms).
const LIVE: u64 = 9_000_000_000_000;

/// Subscribes to `channels` (from a thread that owns the subscription: a dropped
/// `PubSub` unsubscribes); `next` returns "channel payload" of the next message,
/// `None` after `within` without one.
struct Listen(crossbeam_channel::Receiver<String>);

impl Listen {
    fn on(server: &RedisServer, channels: &[&str]) -> Listen {
        let mut conn = server.conn();
        let channels: Vec<String> = channels.iter().map(|c| c.to_string()).collect();
        let (tx, rx) = crossbeam_channel::unbounded();
        let (ready_tx, ready_rx) = crossbeam_channel::bounded(1);
        thread::spawn(move || {
            let mut ps = conn.as_pubsub();
            for c in &channels {
                ps.subscribe(c).unwrap();
            }
            ps.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            ready_tx.send(()).unwrap();
            loop {
                match ps.get_message() {
                    Ok(m) => {
                        let text = format!(
                            "{} {}",
                            m.get_channel_name(),
                            m.get_payload::<String>().unwrap()
                        );
                        if tx.send(text).is_err() {
                            return;
                        }
                    }
                    Err(e) if e.is_timeout() => {
                        // the test is over when nobody listens any more
                        if tx.send(String::new()).is_err() {
                            return;
                        }
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        });
        ready_rx.recv_timeout(WAIT).unwrap();
        Listen(rx)
    }

    fn next(&mut self, within: Duration) -> Option<String> {
        let deadline = Instant::now() + within;
        loop {
            match self.0.recv_deadline(deadline) {
                Ok(m) if m.is_empty() => continue, // a keep-alive of the thread
                Ok(m) => return Some(m),
                Err(_) => return None,
            }
        }
    }
}

/// The cancel script, run as the library runs it (prelude + body), to play a waiter
/// that gives up.
fn cancel_by_hand(conn: &mut redis::Connection, name: &str, id: &str) {
    let script = counting_script!("counting_cancel.lua");
    let _: i64 = script
        .key(format!("redsem:{{{name}}}:count"))
        .key(format!("redsem:{{{name}}}:cq"))
        .key(format!("redsem:{{{name}}}:ch"))
        .key(format!("redsem:{{{name}}}:cw"))
        .arg(id)
        .invoke(conn)
        .unwrap();
}

#[test]
fn a_release_tells_the_waiters_that_fit_in_arrival_order_and_no_more() {
    let server = RedisServer::start();
    let sem = counting(&server, "order");
    assert!(sem.try_set_permits(0).unwrap());
    let mut conn = server.conn();
    // big (3) arrived first, then a, b, c (1 each)
    fake_waiter(&mut conn, "order", "big", 1, LIVE, 3, "ch:big");
    fake_waiter(&mut conn, "order", "a", 2, LIVE, 1, "ch:a");
    fake_waiter(&mut conn, "order", "b", 3, LIVE, 1, "ch:b");
    fake_waiter(&mut conn, "order", "c", 4, LIVE, 1, "ch:c");
    let mut listen = Listen::on(&server, &["ch:big", "ch:a", "ch:b", "ch:c"]);
    assert_eq!(sem.queue_len().unwrap(), 4);
    // 2 free: big does not fit, a and b do (first fit, in arrival order); c is not told
    sem.release(2).unwrap();
    assert_eq!(listen.next(WAIT).as_deref(), Some("ch:a L a"));
    assert_eq!(listen.next(WAIT).as_deref(), Some("ch:b L b"));
    assert_eq!(listen.next(Duration::from_millis(100)), None);
    // 3 free now (nobody took the 2): big is told first, and that uses the budget
    sem.release(1).unwrap();
    assert_eq!(listen.next(WAIT).as_deref(), Some("ch:big L big"));
    assert_eq!(listen.next(Duration::from_millis(100)), None);
    // a decrease tells nobody
    sem.reduce_permits(1).unwrap();
    assert_eq!(listen.next(Duration::from_millis(100)), None);
}

#[test]
fn a_waiter_that_gives_up_passes_its_wake_up_on() {
    let server = RedisServer::start();
    let sem = counting(&server, "pass-on");
    assert!(sem.try_set_permits(0).unwrap());
    let mut conn = server.conn();
    fake_waiter(&mut conn, "pass-on", "quitter", 1, LIVE, 1, "ch:quitter");
    fake_waiter(&mut conn, "pass-on", "patient", 2, LIVE, 1, "ch:patient");
    let mut listen = Listen::on(&server, &["ch:quitter", "ch:patient"]);
    sem.release(1).unwrap();
    assert_eq!(listen.next(WAIT).as_deref(), Some("ch:quitter L quitter"));
    assert_eq!(listen.next(Duration::from_millis(100)), None);
    // the quitter times out instead of taking the permit: the next in line is told
    cancel_by_hand(&mut conn, "pass-on", "quitter");
    assert_eq!(listen.next(WAIT).as_deref(), Some("ch:patient L patient"));
    assert_eq!(sem.queue_len().unwrap(), 1);
    assert_eq!(sem.balance().unwrap(), Some(1));
}

#[test]
fn a_dead_waiter_is_purged_and_does_not_take_a_live_one_s_wake_up() {
    let server = RedisServer::start();
    let sem = counting(&server, "ghost");
    assert!(sem.try_set_permits(0).unwrap());
    let mut conn = server.conn();
    // first in line, but its process died: its heartbeat has passed
    fake_waiter(&mut conn, "ghost", "dead", 1, 1, 1, "ch:dead");
    fake_waiter(&mut conn, "ghost", "live", 2, LIVE, 1, "ch:live");
    assert_eq!(
        sem.queue_len().unwrap(),
        1,
        "a dead heartbeat is not counted"
    );
    let mut listen = Listen::on(&server, &["ch:dead", "ch:live"]);
    sem.release(1).unwrap();
    assert_eq!(listen.next(WAIT).as_deref(), Some("ch:live L live"));
    assert_eq!(listen.next(Duration::from_millis(100)), None);
    let queued: Vec<String> = redis::cmd("ZRANGE")
        .arg("redsem:{ghost}:cq")
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .unwrap();
    assert_eq!(queued, vec!["live"]);
    let records: Vec<String> = redis::cmd("HKEYS")
        .arg("redsem:{ghost}:cw")
        .query(&mut conn)
        .unwrap();
    assert_eq!(records, vec!["live"]);
}

#[test]
fn dead_waiters_beyond_one_purge_do_not_take_a_live_one_s_wake_up() {
    // One purge drops at most 256 dead waiters, those whose heartbeats passed first.
    // Here 300 dead waiters stand before the live one, and the 44 that arrived first
    // are the last to have died, so they are still queued after the purge: the
    // wake-up must skip them, not spend the one free permit on the first of them.
    let server = RedisServer::start();
    let sem = counting(&server, "crowd");
    assert!(sem.try_set_permits(0).unwrap());
    let mut conn = server.conn();
    for k in 1..=300u64 {
        fake_waiter(
            &mut conn,
            "crowd",
            &format!("dead{k}"),
            k,
            1_000 - k,
            1,
            "ch:dead",
        );
    }
    fake_waiter(&mut conn, "crowd", "live", 301, LIVE, 1, "ch:live");
    let mut listen = Listen::on(&server, &["ch:dead", "ch:live"]);
    sem.release(1).unwrap();
    assert_eq!(listen.next(WAIT).as_deref(), Some("ch:live L live"));
    assert_eq!(listen.next(Duration::from_millis(100)), None);
    // every dead waiter is gone: 256 by the purge, the 44 at the head by the wake-up
    assert_eq!(
        waiter_keys(&mut conn, "crowd"),
        [
            vec!["live".to_string()],
            vec!["live".to_string()],
            vec!["live".to_string()]
        ]
    );
    assert_eq!(sem.queue_len().unwrap(), 1);
}

#[test]
fn a_real_waiter_whose_wake_up_went_to_a_dead_one_still_gets_the_permit() {
    // The safety net: a message lost (here: sent to a waiter that is dead but not yet
    // past its heartbeat) costs the live waiter at most its re-check interval.
    let server = RedisServer::start();
    let sem = counting(&server, "net");
    assert!(sem.try_set_permits(0).unwrap());
    let mut conn = server.conn();
    fake_waiter(&mut conn, "net", "stale", 1, LIVE, 1, "ch:nobody");
    let live = {
        let sem = sem.clone();
        thread::spawn(move || sem.acquire_timeout(1, WAIT).unwrap())
    };
    queue_reaches(&sem, 2);
    sem.release(1).unwrap();
    assert!(live.join().unwrap());
    assert_eq!(sem.balance().unwrap(), Some(0));
}

#[test]
fn a_waiter_killed_with_sigkill_leaves_the_queue_by_its_heartbeat() {
    let server = RedisServer::start();
    let sem = counting(&server, "orphan");
    let mut waiter = Helper::spawn("waiter", &server.url());
    queue_reaches(&sem, 1);
    waiter.child.kill().unwrap(); // SIGKILL: no cancel, no more looks
    let killed = Instant::now();
    waiter.child.wait().unwrap();
    // its heartbeat (2 s, renewed every 200 ms) runs out; queue_len counts only live
    // heartbeats, and the next wake-up pass purges the entry
    queue_reaches(&sem, 0);
    let gone = killed.elapsed();
    assert!(gone <= Duration::from_millis(2000 + 500), "took {gone:?}");
    sem.release(1).unwrap();
    let mut conn = server.conn();
    assert_eq!(
        lasting_keys(&mut conn, "redsem:{orphan}:*"),
        vec!["redsem:{orphan}:count"]
    );
    assert_eq!(
        sem.balance().unwrap(),
        Some(1),
        "the dead waiter took nothing"
    );
}

#[test]
fn a_waiter_gets_its_permits_when_the_wake_up_connection_was_cut() {
    let server = RedisServer::start();
    let sem = counting(&server, "cut");
    let waiter = {
        let sem = sem.clone();
        thread::spawn(move || sem.acquire_timeout(1, WAIT).unwrap())
    };
    queue_reaches(&sem, 1);
    // drop every pub/sub connection: the listener must reconnect; a release meanwhile
    // publishes to nobody, and the waiter's re-check (or the listener's "look again"
    // after resubscribing) still finds the permit
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut server.conn())
        .unwrap();
    sem.release(1).unwrap();
    assert!(waiter.join().unwrap());
    assert_eq!(sem.balance().unwrap(), Some(0));
    assert_eq!(sem.queue_len().unwrap(), 0);
}

#[test]
fn bad_arguments_are_errors() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    for name in ["", "a{b}", "}"] {
        let err = client.counting_semaphore(name).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    }
    let sem = client.counting_semaphore("args").unwrap();
    assert!(matches!(sem.try_acquire(0), Err(Error::InvalidArgument(_))));
    assert!(matches!(sem.acquire(0), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        sem.acquire_timeout(0, WAIT),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(sem.release(0), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        sem.reduce_permits(0),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(sem.add_permits(0), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        sem.add_permits(1 << 40),
        Err(Error::InvalidArgument(_))
    ));
    // nothing was written
    let mut conn = server.conn();
    assert!(keys(&mut conn, "redsem:*").is_empty());
}

/// Another program's values under two counting semaphores' count keys: a hash
/// (`hash`) and a string that is no integer (`text`).
fn foreign_counts(conn: &mut redis::Connection) {
    let _: () = redis::cmd("HSET")
        .arg("redsem:{hash}:count")
        .arg("f")
        .arg("v")
        .query(conn)
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("redsem:{text}:count")
        .arg("many")
        .query(conn)
        .unwrap();
}

/// Ninth session (new-user review): a count key of another type gave "a key of
/// semaphore \"hash\" holds a value of the wrong type: Operation against a key holding
/// the wrong kind of value", naming no key (the leased semaphore's name the key and
/// what it holds), and a count that is no integer named none either. Both now name the
/// count key, from every call, the CLI's too.
#[test]
fn a_count_key_of_the_wrong_type_is_named() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    foreign_counts(&mut conn);
    for (name, what) in [("hash", "another type"), ("text", "found many")] {
        let sem = counting(&server, name);
        for (op, e) in [
            ("try_acquire", sem.try_acquire(1).unwrap_err()),
            ("release", sem.release(1).unwrap_err()),
            ("available_permits", sem.available_permits().unwrap_err()),
        ] {
            let text = e.to_string();
            assert!(matches!(e, Error::WrongType { .. }), "{op}: {e:?}");
            assert!(
                text.contains(&format!("key redsem:{{{name}}}:count")) && text.contains(what),
                "{name} {op}: {text}"
            );
            assert!(!text.contains("script:"), "{name} {op}: {text}");
        }
    }
}

#[test]
fn a_key_of_the_wrong_type_is_an_error() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    foreign_counts(&mut conn);
    let _: () = redis::cmd("SET")
        .arg("redsem:{float}:count")
        .arg("1.5")
        .query(&mut conn)
        .unwrap();
    for name in ["hash", "text", "float"] {
        let sem = counting(&server, name);
        let wrong = |r: Result<(), Error>, op: &str| match r {
            Err(Error::WrongType { name: n, .. }) => assert_eq!(n, name),
            other => panic!("{name}: {op} gave {other:?}"),
        };
        wrong(sem.try_acquire(1).map(drop), "try_acquire");
        wrong(
            sem.acquire_timeout(1, Duration::from_millis(50)).map(drop),
            "acquire_timeout",
        );
        wrong(sem.release(1), "release");
        wrong(sem.add_permits(1), "add_permits");
        wrong(sem.reduce_permits(1), "reduce_permits");
        wrong(sem.try_set_permits(1).map(drop), "try_set_permits");
        wrong(sem.drain_permits().map(drop), "drain_permits");
        wrong(sem.available_permits().map(drop), "available_permits");
    }
    // a waiter key of the wrong type holds only wake-up hints: it is replaced, and the
    // script never fails halfway (a release used to add the permit, then fail)
    let _: () = redis::cmd("SET")
        .arg("redsem:{wq}:cq")
        .arg("x")
        .query(&mut conn)
        .unwrap();
    let sem = counting(&server, "wq");
    assert!(
        !sem.acquire_timeout(1, Duration::from_millis(50)).unwrap(),
        "nothing to take, and no error"
    );
    let _: () = redis::cmd("SET")
        .arg("redsem:{wq}:ch")
        .arg("x")
        .query(&mut conn)
        .unwrap();
    sem.release(1).unwrap();
    assert_eq!(sem.available_permits().unwrap(), 1);
    let ty: String = redis::cmd("TYPE")
        .arg("redsem:{wq}:ch")
        .query(&mut conn)
        .unwrap();
    assert_ne!(ty, "string");
}

/// Runs `script` on the keys of counting semaphore `name` with `args`.
fn run_counting(
    conn: &mut redis::Connection,
    script: &redis::Script,
    name: &str,
    args: &[&str],
) -> redis::RedisResult<redis::Value> {
    let mut inv = script.prepare_invoke();
    for k in ["count", "cq", "ch", "cw"] {
        inv.key(format!("redsem:{{{name}}}:{k}"));
    }
    for a in args {
        inv.arg(*a);
    }
    inv.invoke(conn)
}

/// The members of `name`'s queue, heartbeat zset and waiter hash.
fn waiter_keys(conn: &mut redis::Connection, name: &str) -> [Vec<String>; 3] {
    let zset = |conn: &mut redis::Connection, k: &str| -> Vec<String> {
        redis::cmd("ZRANGE")
            .arg(format!("redsem:{{{name}}}:{k}"))
            .arg(0)
            .arg(-1)
            .query(conn)
            .unwrap()
    };
    let hash: Vec<String> = redis::cmd("HKEYS")
        .arg(format!("redsem:{{{name}}}:cw"))
        .query(conn)
        .unwrap();
    [zset(conn, "cq"), zset(conn, "ch"), hash]
}

#[test]
fn a_cancel_with_a_bad_count_fails_before_the_queue_is_touched() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let cancel = counting_script!("counting_cancel.lua");
    for (name, wrong) in [("chash", true), ("cfloat", false)] {
        let count = format!("redsem:{{{name}}}:count");
        if wrong {
            redis::cmd("HSET")
                .arg(&count)
                .arg("f")
                .arg("v")
                .exec(&mut conn)
                .unwrap();
        } else {
            redis::cmd("SET")
                .arg(&count)
                .arg("1.5")
                .exec(&mut conn)
                .unwrap();
        }
        fake_waiter(&mut conn, name, "w1", 1, LIVE, 1, "ch:w1");
        let before = waiter_keys(&mut conn, name);
        assert_eq!(before[0], vec!["w1"]);
        let err = run_counting(&mut conn, &cancel, name, &["w1"]).unwrap_err();
        assert!(err.to_string().contains("WRONGTYPE"), "{name}: {err}");
        // nothing written: the waiter is still in all three keys
        assert_eq!(waiter_keys(&mut conn, name), before, "{name}");
    }
}

#[test]
fn script_arguments_out_of_their_domain_are_refused_before_any_write() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let try_set = counting_script!("counting_try_set.lua");
    let release = counting_script!("counting_release.lua");
    let add = counting_script!("counting_add.lua");
    let acquire = counting_script!("counting_acquire.lua");
    let exists = |conn: &mut redis::Connection, key: &str| -> bool {
        redis::cmd("EXISTS").arg(key).query(conn).unwrap()
    };
    let get = |conn: &mut redis::Connection, key: &str| -> Option<String> {
        redis::cmd("GET").arg(key).query(conn).unwrap()
    };

    // try_set: '1.5' used to be stored, and every later script failed on it
    for bad in ["1.5", "nan", "inf", "-inf", "-1", "4294967296", "x", ""] {
        let err = run_counting(&mut conn, &try_set, "ts", &[bad]).unwrap_err();
        assert!(err.to_string().contains("invalid argument"), "{bad}: {err}");
        assert!(!exists(&mut conn, "redsem:{ts}:count"), "{bad} was stored");
    }
    // what tonumber reads as an integer is stored as one, not as sent
    let set = run_counting(&mut conn, &try_set, "ts", &[" 7"]).unwrap();
    assert_eq!(set, redis::Value::Int(1));
    assert_eq!(get(&mut conn, "redsem:{ts}:count").as_deref(), Some("7"));
    let sem = counting(&server, "ts");
    sem.release(1).unwrap();
    assert_eq!(sem.balance().unwrap(), Some(8));

    // release and add: refused, the count unchanged
    for bad in ["1.5", "nan", "0", "-1"] {
        assert!(
            run_counting(&mut conn, &release, "ts", &[bad]).is_err(),
            "{bad}"
        );
    }
    for bad in ["0.5", "nan", "inf", "0"] {
        assert!(
            run_counting(&mut conn, &add, "ts", &[bad]).is_err(),
            "{bad}"
        );
    }
    assert_eq!(get(&mut conn, "redsem:{ts}:count").as_deref(), Some("8"));

    // a waiter's look with a bad heartbeat, pad or channel: the queue is not written
    // (it used to get the waiter in cq, then fail)
    redis::cmd("SET")
        .arg("redsem:{tw}:count")
        .arg(0)
        .exec(&mut conn)
        .unwrap();
    for args in [
        &["1", "w", "me", "ch:me", "x", "1000"][..],
        &["1", "w", "me", "ch:me", "2000", "1.5"],
        &["1", "w", "me", "ch:me", "nan", "1000"],
        &["1", "w", "me"],
        &["1.5", "w", "me", "ch:me", "2000", "1000"],
    ] {
        let err = run_counting(&mut conn, &acquire, "tw", args).unwrap_err();
        assert!(
            err.to_string().contains("invalid argument"),
            "{args:?}: {err}"
        );
        for k in ["cq", "ch", "cw"] {
            assert!(
                !exists(&mut conn, &format!("redsem:{{tw}}:{k}")),
                "{args:?}: {k}"
            );
        }
    }
    // the same look, well formed, queues the waiter
    run_counting(
        &mut conn,
        &acquire,
        "tw",
        &["1", "w", "me", "ch:me", "2000", "1000"],
    )
    .unwrap();
    assert_eq!(waiter_keys(&mut conn, "tw")[0], vec!["me"]);

    // a bad argument fails even before a waiter key of another type is replaced
    redis::cmd("SET")
        .arg("redsem:{tk}:cq")
        .arg("x")
        .exec(&mut conn)
        .unwrap();
    assert!(run_counting(&mut conn, &release, "tk", &["1.5"]).is_err());
    let ty: String = redis::cmd("TYPE")
        .arg("redsem:{tk}:cq")
        .query(&mut conn)
        .unwrap();
    assert_eq!(ty, "string");
    assert!(!exists(&mut conn, "redsem:{tk}:count"));
}

#[test]
fn a_counting_semaphore_and_a_leased_one_of_the_same_name_do_not_meet() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let counting = client.counting_semaphore("shared-name").unwrap();
    let leased = client.semaphore("shared-name", 1).unwrap();
    assert!(counting.try_set_permits(2).unwrap());
    let p = leased.try_acquire().unwrap().unwrap();
    assert!(counting.try_acquire(2).unwrap());
    assert_eq!(leased.available().unwrap(), 0);
    drop(p);
    assert_eq!(leased.available().unwrap(), 1);
    assert_eq!(counting.balance().unwrap(), Some(0));
}

/// Review of the counting scripts: a count that is no integer text ('1e3', '0x10',
/// ' 7', which Lua reads as numbers but INCRBY and DECRBY refuse) fails a script
/// before its first write, here the repair of a waiter key of another type; and
/// inspect writes nothing, also with such a waiter key.
#[test]
fn a_count_that_is_no_integer_text_fails_before_any_write_and_inspect_writes_nothing() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let release = counting_script!("counting_release.lua");
    let inspect = counting_script!("counting_inspect.lua");
    let junk_waiters = |conn: &mut redis::Connection, name: &str| {
        redis::cmd("SET")
            .arg(format!("redsem:{{{name}}}:cw"))
            .arg("junk")
            .exec(conn)
            .unwrap();
    };
    let cw_type = |conn: &mut redis::Connection, name: &str| -> String {
        redis::cmd("TYPE")
            .arg(format!("redsem:{{{name}}}:cw"))
            .query(conn)
            .unwrap()
    };
    for (k, text) in ["1e3", "0x10", " 7", "5.0"].into_iter().enumerate() {
        let name = format!("text{k}");
        redis::cmd("SET")
            .arg(format!("redsem:{{{name}}}:count"))
            .arg(text)
            .exec(&mut conn)
            .unwrap();
        junk_waiters(&mut conn, &name);
        let r = run_counting(&mut conn, &release, &name, &["1"]);
        assert!(r.is_err(), "release on count {text:?}: {r:?}");
        assert_eq!(
            cw_type(&mut conn, &name),
            "string",
            "written before failing"
        );
    }
    junk_waiters(&mut conn, "seen");
    let r = run_counting(&mut conn, &inspect, "seen", &[]).unwrap();
    assert_eq!(
        r,
        redis::Value::Array(vec![
            redis::Value::Int(0),
            redis::Value::Int(0),
            redis::Value::Int(0)
        ])
    );
    assert_eq!(cw_type(&mut conn, "seen"), "string", "inspect wrote");
}

/// Review: a count key holding bytes that are not UTF-8 used to be echoed raw in the
/// script's WRONGTYPE message; redis-rs cannot parse such an error line, so the call
/// failed with a parse error instead of `WrongType`, and the pooled connection was
/// left unusable: every later call on it, for any semaphore, failed the same way.
#[test]
fn a_count_that_is_not_utf8_is_a_wrong_type_and_the_connection_stays_usable() {
    let (_server, client) = support::non_utf8_at("redsem:{bytes}:count");
    let bad = client.counting_semaphore("bytes").unwrap();
    let good = client.counting_semaphore("fine").unwrap();
    for _ in 0..2 {
        match bad.try_acquire(1) {
            Err(Error::WrongType { name, .. }) => assert_eq!(name, "bytes"),
            other => panic!("try_acquire on a non-UTF-8 count gave {other:?}"),
        }
        match bad.available_permits() {
            Err(Error::WrongType { .. }) => {}
            other => panic!("available_permits on a non-UTF-8 count gave {other:?}"),
        }
        good.release(1).unwrap();
    }
    assert_eq!(good.balance().unwrap(), Some(2));
}

/// Review: count() took '007', '00', '-0' and '-007' as integers, but INCRBY and
/// DECRBY refuse them (Redis takes no leading zero and no '-0'). available_permits
/// then said 7 while try_acquire failed with a bare Redis error, and a release whose
/// waiter key of another type was repaired first failed after that write (the DEL).
#[test]
fn a_count_with_leading_zeros_is_a_wrong_type_before_any_write() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let release = counting_script!("counting_release.lua");
    for (k, text) in ["007", "00", "-0", "-007"].into_iter().enumerate() {
        let name = format!("zeros{k}");
        redis::cmd("SET")
            .arg(format!("redsem:{{{name}}}:count"))
            .arg(text)
            .exec(&mut conn)
            .unwrap();
        redis::cmd("SET")
            .arg(format!("redsem:{{{name}}}:cw"))
            .arg("junk")
            .exec(&mut conn)
            .unwrap();
        let r = run_counting(&mut conn, &release, &name, &["1"]);
        assert!(r.is_err(), "release on count {text:?}: {r:?}");
        let ty: String = redis::cmd("TYPE")
            .arg(format!("redsem:{{{name}}}:cw"))
            .query(&mut conn)
            .unwrap();
        assert_eq!(ty, "string", "count {text:?}: written before failing");
        let sem = counting(&server, &name);
        for (op, r) in [
            ("available_permits", sem.available_permits().map(drop)),
            ("try_acquire", sem.try_acquire(1).map(drop)),
            ("release", sem.release(1)),
        ] {
            match r {
                Err(Error::WrongType { .. }) => {}
                other => panic!("{op} on count {text:?} gave {other:?}"),
            }
        }
    }
    // '0' itself is a count
    let sem = counting(&server, "zero");
    redis::cmd("SET")
        .arg("redsem:{zero}:count")
        .arg("0")
        .exec(&mut conn)
        .unwrap();
    assert!(!sem.try_acquire(1).unwrap());
    sem.release(1).unwrap();
    assert_eq!(sem.balance().unwrap(), Some(1));
}

/// Review: errors were sorted as the scripts' RANGE refusal whenever their text held
/// "RANGE ", and a WRONGTYPE error quotes the stored count: a count key holding
/// "RANGE 9" was reported as a change out of range (detail "9") instead of a wrong type.
#[test]
fn a_stored_count_that_reads_like_a_range_refusal_is_a_wrong_type() {
    let server = RedisServer::start();
    redis::cmd("SET")
        .arg("redsem:{rng}:count")
        .arg("RANGE 9")
        .exec(&mut server.conn())
        .unwrap();
    let sem = counting(&server, "rng");
    for (op, r) in [
        ("release", sem.release(1)),
        ("add_permits", sem.add_permits(1)),
        ("try_acquire", sem.try_acquire(1).map(drop)),
    ] {
        match r {
            Err(Error::WrongType { .. }) => {}
            other => panic!("{op} gave {other:?}"),
        }
    }
    // the scripts' own refusal is still sorted as such
    let fine = counting(&server, "rng-fine");
    fine.release(u32::MAX).unwrap();
    assert!(matches!(
        fine.release(1),
        Err(Error::CountOutOfRange { .. })
    ));
}

/// Review: a counting call that timed out said "a call on semaphore ..."; it names the
/// operation now, as the leased semaphore's errors do.
#[test]
fn a_timeout_names_the_operation_and_the_semaphore() {
    let (_server, proxy, client) = support::proxied(Duration::from_millis(300));
    let sem = client.counting_semaphore("named").unwrap();
    sem.release(1).unwrap();
    proxy.cut();
    type Op<'a> = (&'static str, Box<dyn Fn() -> Result<(), Error> + 'a>);
    let ops: Vec<Op> = vec![
        ("release", Box::new(|| sem.release(1))),
        ("acquire", Box::new(|| sem.try_acquire(1).map(drop))),
        ("add_permits", Box::new(|| sem.add_permits(2))),
        ("available", Box::new(|| sem.available_permits().map(drop))),
    ];
    for (what, op) in ops {
        support::assert_timeout(op(), what, "named");
    }
}

/// A release whose connection fails while its reply is awaited may have run. It used
/// to end in that doubt (sixth session: the docs said so, and this test pinned it), and
/// a caller could only choose between a permit lost and one given twice. Every call
/// that changes the count now carries an operation key on every deployment, and one
/// whose connection broke is sent again on another connection: the second send finds
/// the key the first one's run left and answers its reply, changing nothing.
#[test]
fn a_release_whose_connection_drops_before_its_reply_is_sent_again_and_applied_once() {
    let server = RedisServer::start();
    let (proxy, client) = support::proxied_client(&server, Duration::from_secs(10));
    let sem = client.counting_semaphore("dropped").unwrap();
    assert!(sem.try_set_permits(0).unwrap());
    // the reply held back (a slow network) far longer than the test needs to see the
    // release run and reset the connection
    proxy.delay_replies(Duration::from_secs(4));
    let releasing = {
        let sem = sem.clone();
        thread::spawn(move || sem.release(1))
    };
    let mut conn = server.conn();
    wait_until(WAIT, "the release ran on the server", || {
        let count: Option<String> = redis::cmd("GET")
            .arg("redsem:{dropped}:count")
            .query(&mut conn)
            .unwrap();
        count.as_deref() == Some("1")
    });
    proxy.delay_replies(Duration::ZERO);
    proxy.reset();
    releasing.join().unwrap().unwrap();
    assert_eq!(
        sem.balance().unwrap(),
        Some(1),
        "the release took effect once"
    );
}

/// Connections the server closed while they sat idle in the pool (its `timeout`
/// setting; an operator's `CLIENT KILL`, a restart) used to fail the next call on each
/// with "unexpected end of file", in doubt: a release so lost its permits for good
/// (counting releases are not sent twice without an operation key). Each call that
/// changes the count is now sent again on another connection, and applies once.
#[test]
fn calls_on_connections_the_server_closed_while_idle_go_through_once() {
    let server = RedisServer::start_with(&["--timeout", "1"]);
    let sem = counting(&server, "idle");
    assert!(sem.try_set_permits(2).unwrap());
    assert!(sem.try_acquire(1).unwrap());
    support::wait_idle_closed(&server);
    sem.release(1).unwrap();
    assert_eq!(sem.balance().unwrap(), Some(2));
    support::kill_clients(&server);
    assert!(sem.try_acquire(2).unwrap());
    assert_eq!(sem.balance().unwrap(), Some(0));
    support::kill_clients(&server);
    sem.add_permits(3).unwrap();
    support::wait_idle_closed(&server);
    assert_eq!(sem.drain_permits().unwrap(), 3);
    support::kill_clients(&server);
    sem.release(2).unwrap();
    support::kill_clients(&server);
    assert!(sem.acquire_timeout(1, Duration::from_secs(5)).unwrap());
    support::kill_clients(&server);
    assert_eq!(sem.balance().unwrap(), Some(1));
    // reads too: nothing to lose, but an error where the server was fine
    support::kill_clients(&server);
    assert_eq!(sem.available_permits().unwrap(), 1);
    support::kill_clients(&server);
    assert_eq!(sem.queue_len().unwrap(), 0);
}

/// Ninth session (review): every call that changes the count carries an operation key
/// on every deployment now, whose deadline is read from the server's clock (`TIME`),
/// a reading kept a minute; but each handle kept its own, so a new handle per call (a
/// per-account semaphore made where it is used, `client.counting_semaphore(name)`, no
/// network call) paid a `TIME` round trip before every release and acquire: two round
/// trips where the docs promise one (DESIGN invariant 12). The reading is the client's,
/// shared by its handles of the semaphore (as the leased semaphore's clock is): once
/// read, a new handle sends no `TIME`. (The proxy stops forwarding at the script that
/// reads the clock, so a call that sends it times out.) `RSemaphore` likewise.
#[test]
fn a_new_handle_per_call_sends_no_time_of_its_own() {
    let server = RedisServer::start();
    let (proxy, client) = support::proxied_client(&server, Duration::from_millis(500));
    // the first handle reads the server's clock (and loads the scripts)
    client
        .counting_semaphore("per-call")
        .unwrap()
        .release(1)
        .unwrap();
    client.redisson_semaphore("rs-per-call").release(1).unwrap();
    // (the library reads `TIME` in a script on the semaphore's key, for a cluster)
    let server_time = redis::Script::new("return redis.call('TIME')")
        .get_hash()
        .to_owned();
    proxy.cut_when_sent(server_time.as_bytes());
    for _ in 0..3 {
        client
            .counting_semaphore("per-call")
            .unwrap()
            .release(1)
            .unwrap();
        assert!(
            client
                .counting_semaphore("per-call")
                .unwrap()
                .try_acquire(1)
                .unwrap()
        );
        client.redisson_semaphore("rs-per-call").release(1).unwrap();
    }
    let c = client.counting_semaphore("per-call").unwrap();
    assert_eq!(c.available_permits().unwrap(), 1);
    assert_eq!(
        client
            .redisson_semaphore("rs-per-call")
            .available_permits()
            .unwrap(),
        4
    );
}

/// Ninth session (review; found by the counting fault run, a release applied twice
/// across a crash and restart): a release whose first send ran but whose connection
/// broke before the reply came is sent again on a fresh connection; when that
/// connection could not be had (the server restarting, new connections unanswered),
/// the call failed with the connect's error, `Error::Connect`, which says nothing was
/// sent: a caller that then releases again (safe after such an error) gave the permits
/// twice. The first send's error is the answer then (an I/O error: in doubt, as the
/// docs say; do not repeat), not the connect's.
#[test]
fn a_release_that_ran_and_could_not_be_sent_again_is_in_doubt_not_unsent() {
    let server = RedisServer::start();
    let proxy = support::Proxy::start(server.port());
    let client = Client::builder()
        .operation_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_millis(300))
        .build(proxy.url())
        .unwrap();
    let sem = client.counting_semaphore("ran-once").unwrap();
    // (the scripts loaded, the server's clock read, a connection in the pool)
    sem.release(1).unwrap();
    let mut admin = server.conn();
    let count = |admin: &mut redis::Connection| -> i64 {
        redis::cmd("GET")
            .arg("redsem:{ran-once}:count")
            .query(admin)
            .unwrap()
    };
    proxy.delay_replies(Duration::from_millis(800));
    let releasing = {
        let sem = sem.clone();
        thread::spawn(move || sem.release(1))
    };
    // the release ran; its reply is lost with the connection, and a new connection
    // hears nothing
    wait_until(Duration::from_secs(5), "the release on the server", || {
        count(&mut admin) == 2
    });
    wait_until(Duration::from_secs(5), "its reply held", || {
        proxy.held_replies() >= 1
    });
    proxy.stall_new();
    proxy.delay_replies(Duration::ZERO);
    proxy.reset();
    let e = releasing
        .join()
        .unwrap()
        .expect_err("no connection to answer on");
    assert!(
        !matches!(
            e,
            Error::Connect { .. } | Error::Pool(_) | Error::Auth { .. }
        ),
        "a release that ran reported as never sent: {e:?}"
    );
    assert!(
        matches!(&e, Error::Call { source, .. } if source.is_io_error()) || e.is_timeout(),
        "not an error the docs call in doubt: {e:?}"
    );
    proxy.heal();
    assert_eq!(count(&mut admin), 2, "applied once");
}
