//! The leased semaphore after the server closed the client's idle pooled connections
//! (ninth session, 2026-11-28): Redis's `timeout`, an idle cut of a cloud service or a
//! load balancer, `CLIENT KILL`, a restart. The pool hands such a connection out again
//! (no `PING` on checkout, DESIGN invariant 12), and the first request on it fails with
//! "unexpected end of file" or a reset, although the server is fine. Every call of the
//! leased semaphore is safe to run twice (invariant 11), so one that fails on a broken
//! connection is sent once more on a fresh one: every public operation succeeds, and no
//! permit is lost or granted twice.

mod support;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use redis_semaphore::{Client, Permit, Semaphore};
use support::{Cut, Proxy, RedisServer, Stream, normal_clients, server_ms, wait_until};

use support::kill_clients_on as kill_clients;

fn sem_of(client: &Client, name: &str) -> Semaphore {
    client
        .semaphore_builder(name)
        .limit(2)
        .lease(Duration::from_secs(60))
        .auto_refresh(false)
        .build()
        .unwrap()
}

/// A client of its own (one pooled connection once primed) and its semaphore `name`.
fn fresh(server: &RedisServer, name: &str) -> Semaphore {
    sem_of(&Client::open(server.url()).unwrap(), name)
}

/// The semaphore holds exactly `held` (id, permits), and has the rest of its limit 2
/// free: nothing lost, nothing granted twice.
fn holds(sem: &Semaphore, held: &[(&str, u32)]) -> Result<(), String> {
    let holders = sem.holders().map_err(|e| format!("holders: {e}"))?;
    let mut got: Vec<(String, u32)> = holders.iter().map(|h| (h.id.clone(), h.permits)).collect();
    let mut want: Vec<(String, u32)> = held.iter().map(|(i, n)| ((*i).to_owned(), *n)).collect();
    got.sort();
    want.sort();
    if got != want {
        return Err(format!("holders {got:?}, expected {want:?}"));
    }
    let used: u32 = held.iter().map(|(_, n)| n).sum();
    let available = sem.available().map_err(|e| format!("available: {e}"))?;
    if available != 2 - used {
        return Err(format!("available {available}, expected {}", 2 - used));
    }
    Ok(())
}

type Run = Box<dyn FnOnce() -> Result<(), String>>;

/// An acquiring operation of `sem`, checked: the permit it returns is the only holder.
fn acquiring(
    sem: Semaphore,
    n: u32,
    acquire: fn(&Semaphore) -> redis_semaphore::Result<Option<Permit>>,
) -> Run {
    Box::new(move || {
        let p = acquire(&sem)
            .map_err(|e| format!("failed: {e}"))?
            .ok_or("not granted")?;
        if p.permits() != n {
            return Err(format!("{} permits", p.permits()));
        }
        holds(&sem, &[(p.id(), n)])?;
        p.release().map_err(|e| format!("release: {e}"))?;
        holds(&sem, &[])
    })
}

/// Every public operation of the leased semaphore, each on a client whose one pooled
/// connection the server closed while it was idle: each succeeds, and the semaphore
/// holds what it should.
fn every_operation_after(cut: Cut) {
    let server = cut.server();
    let mut admin = server.conn();
    let mut runs: Vec<(&str, Run)> = Vec::new();
    // acquires on clients that have not read the server's clock yet (a status read made
    // their one connection): an acquire's first try that fails is not waited through
    type Acquire = fn(&Semaphore) -> redis_semaphore::Result<Option<Permit>>;
    let acquires: [(&str, u32, Acquire); 8] = [
        ("try_acquire", 1, |s| s.try_acquire()),
        ("try_acquire_many", 2, |s| s.try_acquire_many(2)),
        ("acquire", 1, |s| s.acquire().map(Some)),
        ("acquire_many", 2, |s| s.acquire_many(2).map(Some)),
        ("acquire_timeout", 1, |s| {
            s.acquire_timeout(Duration::from_secs(5))
        }),
        ("acquire_many_timeout", 2, |s| {
            s.acquire_many_timeout(2, Duration::from_secs(5))
        }),
        ("acquire_cancellable", 1, |s| {
            s.acquire_cancellable(&crossbeam_channel::never::<()>())
        }),
        ("acquire_many_cancellable", 2, |s| {
            s.acquire_many_cancellable(2, &crossbeam_channel::never::<()>())
        }),
    ];
    for (name, n, acquire) in acquires {
        let sem = fresh(&server, name);
        assert_eq!(sem.available().unwrap(), 2);
        runs.push((name, acquiring(sem, n, acquire)));
    }
    // and on a client that has: its try is not given up for a wait either
    {
        let sem = fresh(&server, "try_acquire_anchored");
        drop(sem.try_acquire().unwrap().unwrap());
        runs.push((
            "try_acquire (anchored)",
            acquiring(sem, 1, |s| s.try_acquire()),
        ));
    }
    type Read = fn(&Semaphore) -> Result<(), String>;
    let reads: [(&str, Read); 6] = [
        ("available", |s| match s.available() {
            Ok(2) => Ok(()),
            r => Err(format!("{r:?}")),
        }),
        ("limit", |s| match s.limit() {
            Ok(2) => Ok(()),
            r => Err(format!("{r:?}")),
        }),
        ("queue_len", |s| match s.queue_len() {
            Ok(0) => Ok(()),
            r => Err(format!("{r:?}")),
        }),
        ("holders", |s| match s.holders() {
            Ok(h) if h.is_empty() => Ok(()),
            r => Err(format!("{r:?}")),
        }),
        ("status", |s| match s.status() {
            Ok(st) if st.limit == 2 && st.held == 0 => Ok(()),
            r => Err(format!("{r:?}")),
        }),
        ("status_and_holders", |s| match s.status_and_holders() {
            Ok((st, h)) if st.held == 0 && h.is_empty() => Ok(()),
            r => Err(format!("{r:?}")),
        }),
    ];
    for (name, read) in reads {
        let sem = fresh(&server, name);
        assert_eq!(sem.available().unwrap(), 2);
        runs.push((name, Box::new(move || read(&sem))));
    }
    {
        let sem = fresh(&server, "set_limit");
        assert_eq!(sem.available().unwrap(), 2);
        runs.push((
            "set_limit",
            Box::new(move || {
                sem.set_limit(3).map_err(|e| format!("failed: {e}"))?;
                match sem.limit() {
                    Ok(3) => Ok(()),
                    r => Err(format!("limit {r:?}")),
                }
            }),
        ));
    }
    {
        let sem = fresh(&server, "refresh");
        let p = sem.try_acquire().unwrap().unwrap();
        runs.push((
            "Permit::refresh",
            Box::new(move || {
                p.refresh().map_err(|e| format!("failed: {e}"))?;
                if p.is_lost() || p.lease_left() < Duration::from_secs(50) {
                    return Err(format!("lease left {:?}", p.lease_left()));
                }
                holds(&sem, &[(p.id(), 1)])
            }),
        ));
    }
    {
        let sem = fresh(&server, "release");
        let p = sem.try_acquire().unwrap().unwrap();
        runs.push((
            "Permit::release",
            Box::new(move || {
                p.release().map_err(|e| format!("failed: {e}"))?;
                holds(&sem, &[])
            }),
        ));
    }
    {
        let sem = fresh(&server, "force_release");
        let p = sem.try_acquire().unwrap().unwrap();
        runs.push((
            "force_release",
            Box::new(move || {
                match sem.force_release(p.id()) {
                    Ok(true) => {}
                    r => return Err(format!("{r:?}")),
                }
                if !p.is_lost() {
                    return Err("the permit is not marked lost".into());
                }
                holds(&sem, &[])
            }),
        ));
    }
    {
        // handed over by one client, adopted by another whose connection was closed
        let from = fresh(&server, "adopt");
        let parts = from.try_acquire().unwrap().unwrap().into_parts();
        let sem = fresh(&server, "adopt");
        assert_eq!(sem.available().unwrap(), 1);
        runs.push((
            "adopt",
            Box::new(move || {
                let _keep = from;
                let id = parts.id().to_owned();
                let p = sem.adopt(parts).map_err(|e| format!("failed: {e}"))?;
                holds(&sem, &[(&id, 1)])?;
                p.release().map_err(|e| format!("release: {e}"))?;
                holds(&sem, &[])
            }),
        ));
    }
    cut.apply(&mut admin);
    let mut failed = Vec::new();
    for (name, run) in runs {
        if let Err(e) = run() {
            failed.push(format!("{name}: {e}"));
        }
    }
    assert!(
        failed.is_empty(),
        "after {cut:?}, operations failed although the server is fine:\n{}",
        failed.join("\n")
    );
}

#[test]
fn every_operation_succeeds_after_the_server_closed_its_idle_connection() {
    every_operation_after(Cut::Idle);
}

#[test]
fn every_operation_succeeds_after_client_kill() {
    every_operation_after(Cut::Kill);
}

/// Opens `at_least` pooled connections of `sem`'s client (calls from many threads at
/// once until the server counts them, besides `admin`'s), then lets them all go idle.
fn open_connections(sem: &Semaphore, admin: &mut redis::Connection, at_least: usize) {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let threads: Vec<_> = (0..at_least + 4)
        .map(|_| {
            let (sem, stop) = (sem.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    sem.status().unwrap();
                }
            })
        })
        .collect();
    wait_until(
        Duration::from_secs(10),
        "the pool to open connections",
        || normal_clients(admin) > at_least,
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
}

/// Tries of many threads at once, some of them in flight (slow replies) and the others
/// queued in the combiner, when `CLIENT KILL` closes every connection and the network
/// loses the replies in flight (every proxied connection reset): the calls in flight
/// ran and lost their replies, and a call that then carries queued tries goes out on a
/// connection the server has closed, and fails for every try it carries. Each is sent
/// again by its caller, once, on a fresh connection: every try is granted, once (a
/// try whose first send ran finds its grant). (With the kill alone the replies held
/// come through, and under load every try may ride in the calls in flight.)
#[test]
fn tries_combined_on_killed_connections_are_each_granted_once() {
    let server = RedisServer::start();
    let mut admin = server.conn();
    let proxy = Proxy::start(server.port());
    let client = Client::builder()
        .max_connections(16)
        .build(proxy.url())
        .unwrap();
    let sem = client
        .semaphore_builder("combined")
        .limit(16)
        .lease(Duration::from_secs(60))
        .auto_refresh(false)
        .build()
        .unwrap();
    // (the clock anchored, the scripts loaded, connections in the pool for the calls
    // in flight: no connection's set-up among the replies held below)
    drop(sem.try_acquire().unwrap().unwrap());
    open_connections(&sem, &mut admin, 6);
    proxy.delay_replies(Duration::from_millis(300));
    let barrier = Arc::new(Barrier::new(16));
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (sem, barrier) = (sem.clone(), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                sem.try_acquire()
            })
        })
        .collect();
    // four calls in flight (their replies held), the other tries queued for a call
    // (a connect the pool still had under way may add its set-up's reply)
    wait_until(Duration::from_secs(5), "four calls in flight", || {
        proxy.held_replies() >= 4
    });
    let before = client.stats();
    kill_clients(&mut admin);
    proxy.reset();
    proxy.delay_replies(Duration::ZERO);
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let failed: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
        .collect();
    assert!(
        failed.is_empty(),
        "tries failed after CLIENT KILL: {failed:?}"
    );
    let permits: Vec<Permit> = results
        .into_iter()
        .map(|r| r.unwrap().expect("a free permit"))
        .collect();
    assert!(
        client.stats().resent > before.resent,
        "no call met a killed connection"
    );
    let mut ids: Vec<&str> = permits.iter().map(Permit::id).collect();
    ids.sort();
    let mut held: Vec<String> = sem.holders().unwrap().into_iter().map(|h| h.id).collect();
    held.sort();
    assert_eq!(held, ids, "the holders are exactly the permits returned");
    assert_eq!(sem.available().unwrap(), 0);
    let mut slots: Vec<u32> = permits.iter().flat_map(|p| p.slots().to_vec()).collect();
    slots.sort();
    assert_eq!(slots, (0..16).collect::<Vec<_>>(), "each slot once");
    drop(permits);
    assert_eq!(sem.available().unwrap(), 16);
}

/// A try whose request ran but whose connection broke before the reply came (a
/// restart, a reset): the try is sent again on a fresh connection with the same
/// permit id, finds the grant the first send made and returns it: one permit, held
/// once, its deadline on the client no later than the server's.
#[test]
fn a_try_whose_reply_was_lost_with_its_connection_ends_as_the_one_permit() {
    let server = RedisServer::start();
    let mut admin = server.conn();
    let proxy = Proxy::start(server.port());
    let client = Client::open(proxy.url()).unwrap();
    let sem = client
        .semaphore_builder("lost-reply")
        .limit(2)
        .lease(Duration::from_secs(30))
        .auto_refresh(false)
        .build()
        .unwrap();
    // (the clock anchored, the script loaded, a connection in the pool)
    drop(sem.try_acquire().unwrap().unwrap());
    proxy.delay_replies(Duration::from_millis(500));
    let trying = {
        let sem = sem.clone();
        std::thread::spawn(move || sem.try_acquire())
    };
    wait_until(Duration::from_secs(5), "the grant's reply held", || {
        proxy.held_replies() == 1
    });
    // the server has granted; its reply is lost with the connection
    proxy.delay_replies(Duration::ZERO);
    let mut granted = Vec::new();
    wait_until(Duration::from_secs(5), "the grant on the server", || {
        granted = redis::cmd("ZRANGE")
            .arg("redsem:{lost-reply}:h")
            .arg(0)
            .arg(-1)
            .query::<Vec<String>>(&mut admin)
            .unwrap()
            .into_iter()
            .filter(|m| m != "~")
            .collect();
        granted.len() == 1
    });
    proxy.reset();
    let p = trying
        .join()
        .unwrap()
        .expect("sent again on a fresh connection")
        .expect("the grant the first send made");
    assert_eq!(
        p.id(),
        granted[0],
        "the first send's grant, not a second one"
    );
    // the client's deadline is never later than the server's: read the server's time
    // T (its reply received at r), then the permit's lease left at c, then its deadline
    // D on the server: c + left <= r + (D - T)
    let t = server_ms(&mut admin);
    let r = Instant::now();
    let left = p.lease_left();
    let c = Instant::now();
    let d: f64 = redis::cmd("ZSCORE")
        .arg("redsem:{lost-reply}:h")
        .arg(p.id())
        .query(&mut admin)
        .unwrap();
    let server_left = Duration::from_millis((d as i64 - t).max(0) as u64);
    assert!(
        c + left <= r + server_left,
        "the client believes {left:?} left, the server {server_left:?}"
    );
    assert!(left > Duration::from_secs(20), "{left:?}");
    assert_eq!(sem.holders().unwrap().len(), 1);
    assert_eq!(sem.available().unwrap(), 1);
    p.release().unwrap();
    assert_eq!(sem.available().unwrap(), 2);
}

/// Background renewals after `CLIENT KILL` of a pool of several idle connections: a
/// renewal that fails on a dead connection is tried again only after a delay, and the
/// next one takes the next dead connection, so a short lease ran out before a renewal
/// reached a live connection. Sent again at once on a fresh connection, the renewal
/// keeps the permit.
#[test]
fn a_short_lease_survives_the_kill_of_every_pooled_connection() {
    let server = RedisServer::start();
    let mut admin = server.conn();
    let client = Client::builder()
        .max_connections(16)
        .build(server.url())
        .unwrap();
    let sem = client
        .semaphore_builder("renewed")
        .limit(2)
        .lease(Duration::from_millis(600))
        .build()
        .unwrap();
    let p = sem.try_acquire().unwrap().unwrap();
    open_connections(&sem, &mut admin, 6);
    let before = client.stats();
    kill_clients(&mut admin);
    let killed = Instant::now();
    // five leases' worth of renewals
    wait_until(Duration::from_secs(10), "renewals after the kill", || {
        p.is_lost()
            || client.stats().refresh_calls >= before.refresh_calls + 15
                && killed.elapsed() > Duration::from_secs(3)
    });
    assert!(!p.is_lost(), "lost: {:?}", p.lost_reason());
    let after = client.stats();
    assert_eq!(
        after.refresh_failed, before.refresh_failed,
        "renewals failed on dead connections"
    );
    assert_eq!(sem.holders().unwrap().len(), 1);
    p.release().unwrap();
    assert_eq!(sem.available().unwrap(), 2);
}

/// A waiter whose look meets a dead connection (its client's pooled connections were
/// killed while it waited; a message made it look at once): the look is sent again on
/// a fresh connection, with the same id, and the wait goes on without an error (before,
/// the look failed, counted an error, and the waiter queued again under a new id).
#[test]
fn a_waiters_look_on_a_killed_connection_is_sent_again() {
    let server = RedisServer::start();
    let mut admin = server.conn();
    let holder_client = Client::open(server.url()).unwrap();
    let holder = sem_of(&holder_client, "waiter");
    let _a = holder.try_acquire_many(2).unwrap().unwrap();
    let client = Client::open(server.url()).unwrap();
    let sem = sem_of(&client, "waiter");
    let waiting = {
        let sem = sem.clone();
        std::thread::spawn(move || sem.acquire_timeout(Duration::from_secs(30)))
    };
    wait_until(Duration::from_secs(5), "the waiter queued", || {
        holder.queue_len().unwrap() == 1
    });
    let queued: Vec<String> = redis::cmd("ZRANGE")
        .arg("redsem:{waiter}:q")
        .arg(0)
        .arg(-1)
        .query(&mut admin)
        .unwrap();
    assert_eq!(queued.len(), 1, "{queued:?}");
    let before = client.stats();
    kill_clients(&mut admin);
    // look again now (as the listener says after it resubscribed)
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg("redsem:c:*")
        .query(&mut admin)
        .unwrap();
    for ch in &channels {
        let _: i64 = redis::cmd("PUBLISH")
            .arg(ch)
            .arg(format!("L {}", queued[0]))
            .query(&mut admin)
            .unwrap();
    }
    drop(_a);
    let p = waiting
        .join()
        .unwrap()
        .expect("granted")
        .expect("granted in time");
    assert_eq!(p.id(), queued[0], "granted under the id it queued with");
    assert_eq!(client.stats().errors, before.errors, "no error counted");
    assert_eq!(sem.holders().unwrap().len(), 1);
    p.release().unwrap();
    assert_eq!(sem.available().unwrap(), 2);
}

/// After the server closed every idle pooled connection (16 of them), the calls after
/// the first do not each meet one: the first call that finds its connection closed
/// tells the pool, which drops every connection idle as long or longer, without a
/// round trip. One call (or two) is sent again on a fresh connection, not sixteen.
#[test]
fn only_the_first_call_meets_a_connection_closed_while_idle() {
    let server = RedisServer::start_with(&["--timeout", "1"]);
    let mut admin = server.conn();
    let client = Client::builder()
        .max_connections(16)
        .build(server.url())
        .unwrap();
    let sem = sem_of(&client, "pool");
    open_connections(&sem, &mut admin, 12);
    // (one more call: the connection on top of the pool is the one idle the shortest)
    sem.status().unwrap();
    Cut::Idle.apply(&mut admin);
    let before = client.stats();
    for _ in 0..32 {
        sem.status().unwrap();
    }
    let resent = client.stats().resent - before.resent;
    // one, or two when two connections went back to the pool in another order than
    // their idle times (measured: 1 or 2; without the cut, one per closed connection)
    assert!(
        (1..=2).contains(&resent),
        "{resent} calls sent again on a fresh connection"
    );
    assert_eq!(client.stats().errors, before.errors);
}

/// The `ZADD`s of permit `id` the replica's `stream` shows from now on, once there are
/// `n` of them (within 5 s): a grant's, a renewal's.
fn zadds_of(stream: &mut Stream, id: &str, n: usize, what: &str) -> Vec<String> {
    let zadd_of = |line: &String| line.contains("\"ZADD\"") && line.contains(id);
    let lines = stream.lines_until(what, |lines| {
        lines.iter().filter(|l| zadd_of(l)).count() >= n
    });
    lines.into_iter().filter(zadd_of).collect()
}

/// A preload library for redis-server whose wall clock (`TIME`, the scripts' time) is
/// read in whole seconds: every call within one second sees the same milliseconds
/// (system calls only, as `support::clock_shift_env`'s library).
const COARSE_CLOCK_C: &str = r#"
#define _GNU_SOURCE
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
int clock_gettime(clockid_t id, struct timespec *ts) {
    long r = syscall(SYS_clock_gettime, id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) ts->tv_nsec = 0;
    return (int)r;
}
int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    (void)tz;
    if (syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts) != 0) return -1;
    if (tv) { tv->tv_sec = ts.tv_sec; tv->tv_usec = 0; }
    return 0;
}
time_t time(time_t *t) {
    struct timespec ts;
    syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
"#;

/// The environment that runs a redis-server on [`COARSE_CLOCK_C`]'s clock (built here
/// with `cc`).
fn coarse_clock_env() -> Vec<(String, String)> {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("coarse-clock");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("coarse_clock.c");
    std::fs::write(&src, COARSE_CLOCK_C).unwrap();
    let lib = dir.join(format!("libcoarseclock-{}.so", std::process::id()));
    let built = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("the C compiler `cc` (install gcc)");
    assert!(built.success(), "cc failed to build {}", src.display());
    vec![("LD_PRELOAD".into(), lib.display().to_string())]
}

/// With `wait_replicas`, a try sent again on a fresh connection after `CLIENT KILL`
/// has its grant written by that connection (closed after it) and confirmed on
/// another one: the confirmation's renewal must write, so that `WAIT` on its
/// connection counts replicas that have the grant. Within the grant's millisecond
/// (here: a primary whose clock is read in whole seconds) a renewal to the same
/// deadline wrote nothing; on a server that moves a connection's `WAIT` offset only
/// when it writes (Redis 6.2), `WAIT` then counted a replica that lacked the grant.
/// (Redis 7 moves it at every command, so there the grant was safe; what is checked
/// here is that the renewal reaches the replica after the grant.)
#[test]
fn a_grant_sent_again_is_confirmed_by_a_renewal_that_writes() {
    let primary = RedisServer::start_with_env(&[], &coarse_clock_env());
    let replica = support::replica_of(&primary);
    let mut admin = primary.conn();
    let client = Client::open(primary.url()).unwrap();
    let sem = client
        .semaphore_builder("confirmed")
        .limit(2)
        .lease(Duration::from_secs(60))
        .auto_refresh(false)
        .wait_replicas(1, Duration::from_millis(500))
        .build()
        .unwrap();
    // (the clock anchored, the scripts loaded)
    drop(sem.try_acquire().unwrap().unwrap());
    kill_clients(&mut admin);
    // what the replica is sent: its MONITOR shows the primary's stream
    let mut stream = Stream::of(&replica);
    let p = sem.try_acquire().unwrap().expect("granted and confirmed");
    assert_eq!(client.stats().resent, 1, "sent again after the kill");
    let zadds = zadds_of(
        &mut stream,
        p.id(),
        2,
        "the grant and its renewal at the replica",
    );
    assert!(
        zadds[1].contains("\"GT\""),
        "the confirmation's renewal after the grant: {zadds:?}"
    );
    p.release().unwrap();
}

/// Ninth session (review): a call sent again late in its bound (its first send broke
/// near the end of the operation timeout, as when a failing primary hangs, then resets
/// its connections) opens its fresh connection with what is left, and that set-up may
/// run out of it although the server answers. The pool recorded that as its last
/// connect failure, "no answer within the connect timeout", and a checkout waiting
/// meanwhile (every pooled connection busy) ended with it at once, while its own
/// connection was on its way. Now a set-up that ran out of a caller's budget shorter
/// than the connect timeout is not the pool's failure (as a subscription's is not):
/// the waiting checkout gets its connection and its call answers.
#[test]
fn a_resend_that_runs_out_of_time_to_connect_fails_no_waiting_checkout() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let op = Duration::from_secs(2);
    let client = Client::builder()
        .max_connections(1)
        .operation_timeout(op)
        .connect_timeout(Duration::from_secs(2))
        .checkout_timeout(Duration::from_secs(10))
        .build(proxy.url())
        .unwrap();
    let sem = client.semaphore("late-resend", 2).unwrap();
    // (the script loaded, the one connection in the pool)
    assert_eq!(sem.available().unwrap(), 2);
    proxy.delay_replies(Duration::from_secs(3));
    let started = Instant::now();
    let first = {
        let sem = sem.clone();
        std::thread::spawn(move || sem.available())
    };
    wait_until(
        Duration::from_secs(5),
        "the first call's reply held",
        || proxy.held_replies() == 1,
    );
    // every pooled connection busy: this one waits for a checkout
    let waiting = {
        let sem = sem.clone();
        std::thread::spawn(move || sem.available())
    };
    // late in the first call's bound (its read gives up at about 8/9 of it), its
    // connection breaks; a new connection's set-up (its PING) takes 1.2 s: longer than
    // the first call has left, well within the connect timeout
    wait_until(
        Duration::from_secs(5),
        "late in the first call's bound",
        || started.elapsed() >= op - Duration::from_millis(700),
    );
    proxy.delay_replies(Duration::from_millis(1200));
    proxy.reset();
    let first = first.join().unwrap();
    assert!(
        first.is_err(),
        "the first call had no time to answer: {first:?}"
    );
    let waited = waiting.join().unwrap();
    assert_eq!(
        waited.expect("the waiting checkout got a connection, and its call answered"),
        2
    );
}

/// The same for a manual renewal of a `wait_replicas` permit whose first send ran and
/// lost its reply with its connection (review of the resend): the second send on a
/// fresh connection renewed to the same deadline within the server's millisecond
/// (here: a primary whose clock is read in whole seconds) and wrote nothing, and its
/// `WAIT` counted replicas by a connection that had written nothing. The second send
/// now asks one millisecond more, so that it writes: the replica's stream shows both
/// renewals.
#[test]
fn a_manual_renewal_sent_again_writes_before_its_replica_wait() {
    let primary = RedisServer::start_with_env(&[], &coarse_clock_env());
    let replica = support::replica_of(&primary);
    let (proxy, client) = support::proxied_client(&primary, Duration::from_secs(5));
    let sem = client
        .semaphore_builder("renewed")
        .limit(2)
        .lease(Duration::from_secs(60))
        .auto_refresh(false)
        .wait_replicas(1, Duration::from_millis(500))
        .build()
        .unwrap();
    let p = sem.try_acquire().unwrap().expect("granted and confirmed");
    let id = p.id().to_owned();
    let mut stream = Stream::of(&replica);
    // (a second of the primary's clock after the grant's, so that the first renewal
    // moves the deadline and writes)
    let mut admin = primary.conn();
    let granted_at = server_ms(&mut admin);
    support::wait_past_server_ms(&mut admin, granted_at);
    // the first send runs, and its reply is lost with its connection
    proxy.delay_replies(Duration::from_secs(3));
    let before = client.stats();
    let renewing = std::thread::spawn(move || {
        let r = p.refresh();
        (p, r)
    });
    zadds_of(&mut stream, &id, 1, "the first renewal ran");
    proxy.delay_replies(Duration::ZERO);
    proxy.reset();
    let (p, renewed) = renewing.join().unwrap();
    renewed.unwrap();
    assert!(
        client.stats().resent > before.resent,
        "sent again after the reset"
    );
    // (the second send runs only after the reset, after the first was seen)
    zadds_of(&mut stream, &id, 1, "the second renewal at the replica");
    p.release().unwrap();
}
