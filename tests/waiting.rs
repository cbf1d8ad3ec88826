//! Blocking acquire: FIFO order across clients, multi-permit heads, dead waiters,
//! timeouts, cancellation and wake-ups pushed by Redis.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis_semaphore::{Client, Semaphore};
use support::{RedisServer, wait_until};

const WAIT: Duration = Duration::from_secs(10);

fn sem(server: &RedisServer, name: &str, limit: u32) -> Semaphore {
    Client::open(server.url())
        .unwrap()
        .semaphore(name, limit)
        .unwrap()
}

fn queue_reaches(sem: &Semaphore, n: u32) {
    wait_until(WAIT, &format!("queue length {n}"), || {
        sem.queue_len().unwrap() == n
    });
}

/// Runs the role named by `REDSEM_HELPER`; does nothing in a normal test run.
#[test]
fn helper() {
    let Ok(role) = std::env::var("REDSEM_HELPER") else {
        return;
    };
    let client = Client::open(std::env::var("REDSEM_URL").unwrap()).unwrap();
    let sem = client
        .semaphore_builder(&std::env::var("REDSEM_NAME").unwrap())
        .limit(1)
        .lease(Duration::from_millis(500))
        .build()
        .unwrap();
    match role.as_str() {
        "waiter" => {
            println!("RESULT waiting");
            let p = sem.acquire().unwrap();
            println!("RESULT acquired {}", p.token());
            thread::sleep(Duration::from_secs(60));
        }
        "holder" => {
            let p = sem.acquire().unwrap();
            println!("RESULT held {}", p.token());
            thread::sleep(Duration::from_secs(60));
        }
        other => panic!("unknown role {other}"),
    }
}

fn spawn_helper(role: &str, server: &RedisServer, name: &str) -> Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["helper", "--exact", "--nocapture", "--test-threads=1"])
        .env("REDSEM_HELPER", role)
        .env("REDSEM_URL", server.url())
        .env("REDSEM_NAME", name)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    lines
        .find(|l| l.as_ref().is_ok_and(|l| l.contains("RESULT ")))
        .expect("helper said nothing")
        .unwrap();
    thread::spawn(move || lines.for_each(drop));
    child
}

#[test]
fn five_waiters_in_separate_clients_are_served_in_arrival_order() {
    let server = RedisServer::start();
    let holder = sem(&server, "fifo", 1);
    let held = holder.acquire().unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..5 {
        let s = sem(&server, "fifo", 1);
        let order = Arc::clone(&order);
        waiters.push(thread::spawn(move || {
            let p = s.acquire().unwrap();
            order.lock().push(i);
            p.release().unwrap();
        }));
        queue_reaches(&holder, i + 1);
    }
    held.release().unwrap();
    for w in waiters {
        w.join().unwrap();
    }
    assert_eq!(*order.lock(), vec![0, 1, 2, 3, 4]);
    assert_eq!(holder.queue_len().unwrap(), 0);
}

#[test]
fn a_three_permit_waiter_at_the_head_is_served_before_later_one_permit_waiters() {
    let server = RedisServer::start();
    let s = sem(&server, "multi", 3);
    let held: Vec<_> = (0..3).map(|_| s.acquire().unwrap()).collect();
    let order = Arc::new(Mutex::new(Vec::new()));
    let spawn = |name: &'static str, n: u32| {
        let s = sem(&server, "multi", 3);
        let order = Arc::clone(&order);
        thread::spawn(move || {
            let p = s.acquire_many(n).unwrap();
            order.lock().push(name);
            thread::sleep(Duration::from_millis(5));
            p.release().unwrap();
        })
    };
    let big = spawn("three", 3);
    queue_reaches(&s, 1);
    let small: Vec<_> = (0..3)
        .map(|i| {
            let t = spawn(["one-a", "one-b", "one-c"][i], 1);
            queue_reaches(&s, i as u32 + 2);
            t
        })
        .collect();
    let mut held = held.into_iter();
    held.next().unwrap().release().unwrap();
    // one permit is free, but the head needs three: nobody behind it may take it
    assert_eq!(s.available().unwrap(), 1);
    assert_eq!(s.queue_len().unwrap(), 4);
    assert!(
        s.try_acquire().unwrap().is_none(),
        "a try jumped the fair queue"
    );
    assert!(order.lock().is_empty());
    for p in held {
        p.release().unwrap();
    }
    big.join().unwrap();
    for t in small {
        t.join().unwrap();
    }
    let order = order.lock();
    assert_eq!(order[0], "three", "{order:?}");
    assert_eq!(order.len(), 4);
}

#[test]
fn an_unfair_semaphore_lets_a_try_jump_the_queue() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let s = client
        .semaphore_builder("unfair")
        .limit(2)
        .fair(false)
        .build()
        .unwrap();
    let a = s.acquire().unwrap();
    let b = s.acquire().unwrap();
    let w = {
        let s = s.clone();
        thread::spawn(move || s.acquire_many(2).map(|p| p.permits()))
    };
    queue_reaches(&s, 1);
    drop(a);
    let jumped = s.try_acquire().unwrap();
    assert!(
        jumped.is_some(),
        "an unfair try should take the free permit"
    );
    drop((b, jumped));
    assert_eq!(w.join().unwrap().unwrap(), 2);
}

#[test]
fn a_timed_out_waiter_leaves_no_queue_entry() {
    let server = RedisServer::start();
    let s = sem(&server, "timeout", 1);
    let _held = s.acquire().unwrap();
    let started = Instant::now();
    assert!(
        s.acquire_timeout(Duration::from_millis(200))
            .unwrap()
            .is_none()
    );
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(s.queue_len().unwrap(), 0);
    assert!(
        s.acquire_many_timeout(1, Duration::from_millis(50))
            .unwrap()
            .is_none()
    );
    assert_eq!(s.queue_len().unwrap(), 0);
}

#[test]
fn a_cancelled_acquire_returns_none_and_leaves_the_queue() {
    let server = RedisServer::start();
    let s = sem(&server, "cancel", 1);
    let held = s.acquire().unwrap();
    let (shutdown, cancel) = crossbeam_channel::bounded::<()>(0);
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let (s, cancel) = (s.clone(), cancel.clone());
            thread::spawn(move || s.acquire_cancellable(&cancel).unwrap().map(|p| p.token()))
        })
        .collect();
    queue_reaches(&s, 3);
    drop(shutdown);
    for w in waiters {
        assert_eq!(w.join().unwrap(), None);
    }
    assert_eq!(s.queue_len().unwrap(), 0);
    held.release().unwrap();
    assert_eq!(
        s.available().unwrap(),
        1,
        "a cancelled waiter kept a permit"
    );
}

/// A cancel that fired before the call ends it with `Ok(None)` even when permits are
/// free: the README's shutdown loop (`while let Some(p) = sem.acquire_cancellable(&stop)?`)
/// ran on for ever after its sender was dropped, since every call found a free permit.
/// A message waiting in the channel is taken by the call it cancels.
#[test]
fn a_cancel_that_fired_before_the_call_takes_nothing_even_when_permits_are_free() {
    let server = RedisServer::start();
    let s = sem(&server, "cancelled", 5);
    let (stop_tx, stop) = crossbeam_channel::bounded::<()>(1);
    stop_tx.send(()).unwrap();
    assert!(s.acquire_cancellable(&stop).unwrap().is_none());
    assert!(stop.is_empty(), "the message was taken");
    let p = s
        .acquire_cancellable(&stop)
        .unwrap()
        .expect("not cancelled now");
    drop(p);
    drop(stop_tx);
    let mut loops = 0;
    while let Some(p) = s.acquire_many_cancellable(2, &stop).unwrap() {
        drop(p);
        loops += 1;
        assert!(loops < 10, "a disconnected cancel did not end the loop");
    }
    assert_eq!(loops, 0);
    assert_eq!(s.available().unwrap(), 5, "nothing was taken");
}

#[test]
fn raising_the_limit_wakes_a_waiter_promptly() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    // a long lease makes the waiter's fallback look 5 s away: only a push is prompt
    let s = client
        .semaphore_builder("raise")
        .limit(1)
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let _held = s.acquire().unwrap();
    let waiter = {
        let s = s.clone();
        thread::spawn(move || s.acquire().map(|p| (Instant::now(), p.slots().to_vec())))
    };
    queue_reaches(&s, 1);
    let raised = Instant::now();
    s.set_limit(2).unwrap();
    let (acquired, slots) = waiter.join().unwrap().unwrap();
    assert!(
        acquired.duration_since(raised) < Duration::from_secs(2),
        "woken after {:?}",
        acquired - raised
    );
    assert_eq!(slots, vec![1]);
}

#[test]
fn a_release_hands_the_permit_to_the_waiter_in_one_push() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let s = client
        .semaphore_builder("push")
        .limit(1)
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let other = Client::open(server.url()).unwrap();
    let waiting = other
        .semaphore_builder("push")
        .limit(1)
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    for _ in 0..5 {
        let held = s.acquire().unwrap();
        let w = {
            let waiting = waiting.clone();
            thread::spawn(move || waiting.acquire().map(|p| (Instant::now(), p.token())))
        };
        queue_reaches(&s, 1);
        let token = held.token();
        let released = Instant::now();
        held.release().unwrap();
        let (acquired, next) = w.join().unwrap().unwrap();
        assert!(next > token);
        assert!(acquired.duration_since(released) < Duration::from_secs(2));
    }
}

#[test]
fn a_crashed_holders_permit_goes_to_the_waiter_when_its_lease_ends() {
    let server = RedisServer::start();
    let mut holder = spawn_helper("holder", &server, "crashed");
    let s = Client::open(server.url())
        .unwrap()
        .semaphore_builder("crashed")
        .limit(1)
        .lease(Duration::from_millis(500))
        .build()
        .unwrap();
    let waiter = {
        let s = s.clone();
        thread::spawn(move || s.acquire().map(|_| Instant::now()))
    };
    queue_reaches(&s, 1);
    holder.kill().unwrap();
    let killed = Instant::now();
    holder.wait().unwrap();
    let acquired = waiter.join().unwrap().unwrap();
    // the lease had at most 500 ms left; the waiter looks again when it ends
    let after = acquired.duration_since(killed);
    assert!(after < Duration::from_millis(500 + 300), "took {after:?}");
}

#[test]
fn a_waiter_killed_while_queued_stops_blocking_the_queue_within_its_heartbeat() {
    let server = RedisServer::start();
    let s = Client::open(server.url())
        .unwrap()
        .semaphore_builder("deadwaiter")
        .limit(1)
        .lease(Duration::from_millis(500))
        .build()
        .unwrap();
    let held = s.acquire().unwrap();
    let mut dead = spawn_helper("waiter", &server, "deadwaiter");
    queue_reaches(&s, 1);
    let behind = {
        let s = s.clone();
        thread::spawn(move || s.acquire().map(|p| p.token()))
    };
    queue_reaches(&s, 2);
    dead.kill().unwrap();
    let killed = Instant::now();
    dead.wait().unwrap();
    queue_reaches(&s, 1);
    let gone = killed.elapsed();
    assert!(
        gone < Duration::from_millis(500 + 500),
        "the dead waiter stayed {gone:?}"
    );
    let token = held.token();
    held.release().unwrap();
    assert!(behind.join().unwrap().unwrap() > token);
}

#[test]
fn a_thousand_waiters_in_one_process_use_the_pool_and_one_more_connection() {
    let server = RedisServer::start();
    let pool_size = 8;
    let client = Client::builder()
        .max_connections(pool_size)
        .build(server.url())
        .unwrap();
    let s = client.semaphore("crowd", 10).unwrap();
    let held: Vec<_> = (0..10).map(|_| s.acquire().unwrap()).collect();
    let waiters: Vec<_> = (0..1000)
        .map(|_| {
            let s = s.clone();
            thread::Builder::new()
                .stack_size(128 * 1024)
                .spawn(move || s.acquire().map(|p| p.release()))
                .unwrap()
        })
        .collect();
    wait_until(Duration::from_secs(60), "1000 waiters queued", || {
        s.queue_len().unwrap() == 1000
    });
    let mut conn = server.conn();
    let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut conn).unwrap();
    let connections = list.lines().count() - 1; // minus the one asking
    assert!(
        connections <= pool_size as usize + 1,
        "{connections} connections for 1000 waiters:\n{list}"
    );
    drop(held);
    for w in waiters {
        w.join().unwrap().unwrap().unwrap();
    }
    assert_eq!(s.queue_len().unwrap(), 0);
    assert_eq!(s.available().unwrap(), 10);
}

#[test]
fn a_blocked_acquire_rides_through_a_server_restart() {
    let mut server = RedisServer::start();
    let client = Client::builder()
        .operation_timeout(Duration::from_millis(500))
        .build(server.url())
        .unwrap();
    let sem = client.semaphore("restarted", 1).unwrap();
    let held = sem.acquire().unwrap();
    let waiter = {
        let sem = sem.clone();
        thread::spawn(move || sem.acquire_timeout(Duration::from_secs(20)))
    };
    queue_reaches(&sem, 1);
    // the server comes back empty: the holder's permit is gone with it, and the
    // waiter, whose looks failed meanwhile, queues again and is served
    server.stop();
    wait_until(WAIT, "a look of the waiter fails", || {
        client.stats().errors >= 1
    });
    server.restart();
    let got = waiter.join().unwrap();
    assert!(matches!(got, Ok(Some(_))), "{got:?}");
    drop(held);
}

/// A blocked acquire whose first try met an outage (a restart, a failover) failed at
/// once, while one already queued rode through it. It now rides through as well when
/// the server has answered the client before; a client that never reached its server
/// (a wrong address, a server not started) still fails at once.
#[test]
fn an_acquire_started_during_a_restart_rides_through_it() {
    let mut server = RedisServer::start();
    let client = Client::builder()
        .operation_timeout(Duration::from_millis(500))
        .build(server.url())
        .unwrap();
    let sem = client.semaphore("started-in-outage", 1).unwrap();
    drop(sem.acquire().unwrap());
    server.stop();
    let waiter = {
        let sem = sem.clone();
        thread::spawn(move || sem.acquire_timeout(Duration::from_secs(20)))
    };
    wait_until(WAIT, "the first try fails", || client.stats().errors >= 1);
    // meanwhile a client that never reached the server fails at once
    let fresh = Client::builder()
        .operation_timeout(Duration::from_millis(500))
        .build(server.url())
        .unwrap();
    let started = Instant::now();
    let r = fresh.semaphore("started-in-outage", 1).unwrap().acquire();
    assert!(r.is_err(), "{r:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    server.restart();
    let got = waiter.join().unwrap();
    assert!(matches!(got, Ok(Some(_))), "{got:?}");
}

/// A fresh client pointed at a replica: its first try read the server's clock (an
/// answer) and then met `READONLY`, which counts as an outage, so a first version of
/// the ride-through above blocked `acquire()` for 30 s (found by a review). Only an
/// answer before the call counts: it fails at once.
#[test]
fn an_acquire_of_a_fresh_client_on_a_replica_fails_at_once() {
    let (_primary, replica) = support::primary_and_replica();
    let client = Client::builder()
        .operation_timeout(Duration::from_millis(500))
        .build(replica.url())
        .unwrap();
    let started = Instant::now();
    let r = client.semaphore("on-a-replica", 1).unwrap().acquire();
    assert!(r.is_err(), "{r:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// With `auto_refresh(false)` a lease lasts `lease` after the grant unless renewed by
/// hand: a permit the queue hands to a blocked waiter (which the script grants for a
/// heartbeat only, so that a dead waiter's permit comes back soon) must still get the
/// full lease, since no background renewal will extend it.
#[test]
fn a_waiter_served_from_the_queue_gets_the_full_lease_without_auto_refresh() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let s = client
        .semaphore_builder("manual-served")
        .limit(1)
        .lease(Duration::from_secs(30))
        .auto_refresh(false)
        .build()
        .unwrap();
    let held = s.try_acquire().unwrap().unwrap();
    let waiter = {
        let s = s.clone();
        thread::spawn(move || s.acquire_timeout(WAIT))
    };
    queue_reaches(&s, 1);
    held.release().unwrap();
    let p = waiter.join().unwrap().unwrap().unwrap();
    assert!(
        p.lease_left() > Duration::from_secs(20),
        "lease left {:?}",
        p.lease_left()
    );
    let mut conn = server.conn();
    let score: f64 = redis::cmd("ZSCORE")
        .arg("redsem:{manual-served}:h")
        .arg(p.id())
        .query(&mut conn)
        .unwrap();
    let left_ms = score as i64 - support::server_ms(&mut conn);
    assert!(left_ms > 20_000, "server lease left {left_ms} ms");
    p.release().unwrap();
}

/// Every waiter whose heartbeat the server lost (here all at once: the keys flushed)
/// queues again and is kept alive from then on: the background thread must not drop
/// the heartbeat a waiter registers anew while it settles the lost ones.
#[test]
fn waiters_that_queue_again_after_losing_their_heartbeat_stay_queued() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let s = client.semaphore("requeued", 1).unwrap();
    let other = Client::open(server.url()).unwrap();
    let held = other.semaphore("requeued", 1).unwrap().acquire().unwrap();
    let n = 64;
    // a served waiter holds its permit until `done` is dropped
    let (done, held_until) = crossbeam_channel::bounded::<()>(0);
    let waiters: Vec<_> = (0..n)
        .map(|_| {
            let s = s.clone();
            let held_until = held_until.clone();
            thread::spawn(move || {
                let p = s.acquire_timeout(Duration::from_secs(30))?;
                let _ = held_until.recv();
                Ok::<_, redis_semaphore::Error>(p.is_some())
            })
        })
        .collect();
    queue_reaches(&s, n);
    let mut conn = server.conn();
    let _: () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
    // one waiter takes the free permit, the others queue again
    queue_reaches(&s, n - 1);
    drop(held);
    // three heartbeats later, none of them has lapsed
    let t = support::server_ms(&mut conn);
    support::wait_past_server_ms(&mut conn, t + 3000);
    assert_eq!(s.queue_len().unwrap(), n - 1);
    drop(done);
    for w in waiters {
        assert!(w.join().unwrap().unwrap());
    }
}

/// Dropping the last handle of a client whose wake-up listener is reconnecting to a
/// network that swallows every byte (a connect is accepted, its handshake never
/// answered) ends within the operation timeout: the drop does not wait for the
/// handshake's own timeouts.
#[test]
fn dropping_a_client_whose_listener_is_reconnecting_ends_within_the_operation_timeout() {
    const OP: Duration = Duration::from_millis(1000);
    // scheduling on a loaded machine; well below a second operation timeout
    const SLACK: Duration = Duration::from_millis(400);
    let (server, proxy, client) = support::proxied(OP);
    let sem = client.semaphore("listener-drop", 1).unwrap();
    let p = sem.try_acquire().unwrap().unwrap();
    // a wait starts the listener
    support::start_listener(&sem);
    p.release().unwrap();
    drop(sem);
    let mut admin = server.conn();
    let ids = |admin: &mut redis::Connection| -> Vec<String> {
        let list: String = redis::cmd("CLIENT").arg("LIST").query(admin).unwrap();
        list.lines()
            .filter_map(|l| l.split(' ').next().map(str::to_owned))
            .collect()
    };
    let before = ids(&mut admin);
    proxy.cut();
    proxy.reset();
    // the listener saw its connection close and opened a new one (nothing else of the
    // client connects: it holds nothing)
    wait_until(WAIT, "the listener's new connection", || {
        ids(&mut admin).iter().any(|id| !before.contains(id))
    });
    let start = Instant::now();
    drop(client);
    let took = start.elapsed();
    proxy.heal();
    assert!(
        took <= OP + SLACK,
        "dropping the client blocked {took:?} (operation timeout {OP:?})"
    );
}

/// Failover audit (2026-11-26): a blocked acquire rides through an outage (a failover)
/// of up to 30 s, but that allowance was counted from the first failed look of the
/// whole wait and never started again: a waiter that rode through one failover and
/// met a second one more than 30 s later failed with the second one's first error.
/// Each outage now has its own 30 s, counted from its own first failed look.
#[test]
fn a_waiter_rides_through_a_second_outage_long_after_the_first() {
    let server = RedisServer::start();
    let proxy = support::Proxy::start(server.port());
    // the holder talks to the server directly: only the waiter meets the outages
    let holder = Client::open(server.url())
        .unwrap()
        .semaphore_builder("twice")
        .limit(1)
        .lease(Duration::from_secs(60))
        .build()
        .unwrap();
    let held = holder.acquire().unwrap();
    let client = Client::builder()
        .operation_timeout(Duration::from_millis(300))
        .build(proxy.url())
        .unwrap();
    let sem = client
        .semaphore_builder("twice")
        .limit(1)
        .lease(Duration::from_secs(60))
        .build()
        .unwrap();
    let waiter = {
        let sem = sem.clone();
        thread::spawn(move || sem.acquire_timeout(Duration::from_secs(120)))
    };
    let mut conn = server.conn();
    wait_until(WAIT, "the waiter queued", || {
        support::queued_ids(&mut conn, "twice").len() == 1
    });
    // An outage: nothing goes through until one of the waiter's looks has failed;
    // then the waiter queues again (with a new id).
    let outage = |conn: &mut redis::Connection| {
        let before = support::queued_ids(conn, "twice");
        let errors = client.stats().errors;
        proxy.cut();
        wait_until(WAIT, "a look of the waiter failed", || {
            client.stats().errors > errors
        });
        proxy.heal();
        wait_until(WAIT, "the waiter queued again, or its wait ended", || {
            waiter.is_finished() || {
                let now = support::queued_ids(conn, "twice");
                now.iter().any(|id| !before.contains(id))
            }
        });
    };
    let first = Instant::now();
    outage(&mut conn);
    assert!(!waiter.is_finished(), "the wait ended at the first outage");
    // scenario timing: the second outage comes more than the 30 s ride-through after
    // the first
    thread::sleep(Duration::from_secs(31).saturating_sub(first.elapsed()));
    outage(&mut conn);
    assert!(
        !waiter.is_finished(),
        "the wait ended at the second outage: {:?}",
        waiter.join().unwrap()
    );
    drop(held);
    let got = waiter.join().unwrap();
    assert!(
        matches!(got, Ok(Some(_))),
        "the waiter got the released permit: {got:?}"
    );
}

/// An unfair semaphore serves only the head of its queue on a release; a permit the
/// head cannot use (it waits for more) goes to the first unfair waiter that looks.
/// Waiters past the third place had no time to look again (-1) and fell back to a
/// timer of up to 5 s (measured: 4,999 ms with a 10 s lease); every waiter of an
/// unfair caller now looks again when the head's heartbeat would end, at most a
/// heartbeat (1 s) after the release.
#[test]
fn an_unfair_waiter_behind_heads_that_need_more_takes_a_freed_permit_within_a_heartbeat() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let unfair = |client: &Client| {
        client
            .semaphore_builder("unfair-rank")
            .limit(2)
            .fair(false)
            .lease(Duration::from_secs(10))
            .build()
            .unwrap()
    };
    let holders = Client::open(server.url()).unwrap();
    let x = unfair(&holders).acquire().unwrap();
    let y = unfair(&holders).acquire().unwrap();
    let waiters = Client::open(server.url()).unwrap();
    let s = unfair(&waiters);
    let mut heads = Vec::new();
    for i in 0..4 {
        let s2 = s.clone();
        heads.push(thread::spawn(move || {
            s2.acquire_many_timeout(2, Duration::from_secs(30))
        }));
        queue_reaches(&s, i + 1);
    }
    let b = {
        let s = s.clone();
        thread::spawn(move || s.acquire_timeout(Duration::from_secs(30)))
    };
    queue_reaches(&s, 5);
    let released_at = support::server_ms(&mut conn);
    x.release().unwrap();
    let p = b.join().unwrap().unwrap().expect("the freed permit");
    let waited = support::server_ms(&mut conn) - released_at;
    assert!(waited < 2_000, "the freed permit waited {waited} ms");
    drop((p, y));
    for h in heads {
        let _ = h.join();
    }
}
