//! Hostile fault review of waiters (seventh session): waiters killed or stopped while
//! queued, grants that race a timeout or a cancel, limits changed under a queue, lost
//! wake-ups, on every kind of semaphore that waits.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redis_semaphore::{Client, Error, Semaphore};
use support::{RedisServer, wait_until};

const WAIT: Duration = Duration::from_secs(10);

/// Runs the role named by `REDSEM_HELPER`; does nothing in a normal test run.
#[test]
fn helper() {
    let Ok(role) = std::env::var("REDSEM_HELPER") else {
        return;
    };
    let client = Client::open(std::env::var("REDSEM_URL").unwrap()).unwrap();
    let name = std::env::var("REDSEM_NAME").unwrap();
    let lease_ms: u64 = std::env::var("REDSEM_LEASE_MS").unwrap().parse().unwrap();
    let fair = std::env::var("REDSEM_FAIR").unwrap() == "1";
    match role.as_str() {
        "leased-waiter" => {
            let sem = client
                .semaphore_builder(&name)
                .limit(1)
                .lease(Duration::from_millis(lease_ms))
                .fair(fair)
                .build()
                .unwrap();
            println!("RESULT waiting");
            let p = sem.acquire().unwrap();
            println!("RESULT acquired {}", p.token());
            thread::sleep(Duration::from_secs(60));
        }
        other => panic!("unknown role {other}"),
    }
}

/// A helper process and the lines it prints after its first RESULT line.
struct Helper {
    child: Child,
    lines: crossbeam_channel::Receiver<String>,
}

impl Helper {
    fn spawn(role: &str, server: &RedisServer, name: &str, lease: Duration, fair: bool) -> Helper {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["helper", "--exact", "--nocapture", "--test-threads=1"])
            .env("REDSEM_HELPER", role)
            .env("REDSEM_URL", server.url())
            .env("REDSEM_NAME", name)
            .env("REDSEM_LEASE_MS", lease.as_millis().to_string())
            .env("REDSEM_FAIR", if fair { "1" } else { "0" })
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = crossbeam_channel::unbounded();
        thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if let Some(at) = line.find("RESULT ") {
                    let _ = tx.send(line[at + 7..].to_owned());
                }
            }
        });
        let first = rx.recv_timeout(WAIT).expect("helper said nothing");
        assert_eq!(first, "waiting");
        Helper { child, lines: rx }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: a signal to a child process this test started
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn leased(server: &RedisServer, name: &str, limit: u32, lease: Duration, fair: bool) -> Semaphore {
    Client::open(server.url())
        .unwrap()
        .semaphore_builder(name)
        .limit(limit)
        .lease(lease)
        .fair(fair)
        .build()
        .unwrap()
}

fn queue_reaches(sem: &Semaphore, n: u32) {
    wait_until(WAIT, &format!("queue length {n}"), || {
        sem.queue_len().unwrap() == n
    });
}

/// A waiter process killed at the head of the queue of a semaphore with a long lease
/// costs the live waiter behind it about a second (its heartbeat), not its lease.
fn dead_head_with_a_long_lease(fair: bool) {
    let server = RedisServer::start();
    let name = if fair {
        "deadhead-fair"
    } else {
        "deadhead-unfair"
    };
    let lease = Duration::from_secs(30);
    let s = leased(&server, name, 1, lease, fair);
    let held = s.acquire().unwrap();
    let mut dead = Helper::spawn("leased-waiter", &server, name, lease, fair);
    queue_reaches(&s, 1);
    let behind = {
        let s = leased(&server, name, 1, lease, fair);
        thread::spawn(move || {
            let p = s.acquire().unwrap();
            (Instant::now(), p.token())
        })
    };
    queue_reaches(&s, 2);
    dead.kill();
    let killed = Instant::now();
    let token = held.token();
    held.release().unwrap();
    let (at, got) = behind.join().unwrap();
    assert!(got > token);
    let took = at.duration_since(killed);
    assert!(
        took < Duration::from_millis(2500),
        "the dead head held the queue for {took:?}"
    );
}

#[test]
fn a_dead_head_with_a_long_lease_costs_about_a_second_fair() {
    dead_head_with_a_long_lease(true);
}

#[test]
fn a_dead_head_with_a_long_lease_costs_about_a_second_unfair() {
    dead_head_with_a_long_lease(false);
}

/// A waiter process stopped (SIGSTOP) at the head: a release pushes the grant to it,
/// which lapses with its heartbeat and goes to the waiter behind; the stopped one,
/// continued, never believes it holds the permit while the other does, and queues
/// again.
#[test]
fn a_stopped_head_s_pushed_grant_goes_on_and_it_does_not_hold_it_when_continued() {
    let server = RedisServer::start();
    let name = "stoppedhead";
    let lease = Duration::from_secs(30);
    let s = leased(&server, name, 1, lease, true);
    let held = s.acquire().unwrap();
    let stopped = Helper::spawn("leased-waiter", &server, name, lease, true);
    queue_reaches(&s, 1);
    let behind = {
        let s = leased(&server, name, 1, lease, true);
        thread::spawn(move || s.acquire().unwrap())
    };
    queue_reaches(&s, 2);
    stopped.signal(libc::SIGSTOP);
    let at = Instant::now();
    held.release().unwrap();
    let p = behind.join().unwrap();
    let took = at.elapsed();
    assert!(
        took < Duration::from_millis(2500),
        "the stopped head held the queue for {took:?}"
    );
    stopped.signal(libc::SIGCONT);
    // continued, it looks again and queues behind the holder
    queue_reaches(&s, 1);
    assert!(
        stopped.lines.try_recv().is_err(),
        "the continued waiter believes it holds the permit the other holds"
    );
    assert!(!p.is_lost());
    drop(p);
    let line = stopped
        .lines
        .recv_timeout(WAIT)
        .expect("the waiter acquires");
    assert!(line.starts_with("acquired"), "{line}");
}

/// A grant pushed as a waiter's timeout ends: either the waiter keeps it (and it is
/// valid), or it is back at once, never left to lapse with a heartbeat or a lease.
fn grant_at_the_timeout(fair: bool) {
    let server = RedisServer::start();
    let name = if fair { "edge-fair" } else { "edge-unfair" };
    let lease = Duration::from_secs(30);
    let s = leased(&server, name, 1, lease, fair);
    let w = leased(&server, name, 1, lease, fair);
    // warm the waiter's client (scripts, listener)
    let held = s.acquire().unwrap();
    assert!(
        w.acquire_timeout(Duration::from_millis(20))
            .unwrap()
            .is_none()
    );
    drop(held);
    let (mut kept, mut gave_up) = (0, 0);
    for i in 0..40u64 {
        let held = s.acquire().unwrap();
        let timeout = Duration::from_millis(150);
        let waiter = {
            let w = w.clone();
            thread::spawn(move || w.acquire_timeout(timeout).unwrap())
        };
        queue_reaches(&s, 1);
        // The scenario's timing: the release lands around the waiter's deadline,
        // spread over a few ms either side.
        let started = Instant::now();
        thread::sleep(
            (timeout - Duration::from_millis(25) + Duration::from_micros(i * 1200))
                .saturating_sub(started.elapsed()),
        );
        held.release().unwrap();
        match waiter.join().unwrap() {
            Some(p) => {
                kept += 1;
                assert!(!p.is_lost() && p.lease_left() > Duration::ZERO);
                assert_eq!(s.available().unwrap(), 0);
                p.release().unwrap();
            }
            None => {
                gave_up += 1;
                assert_eq!(s.queue_len().unwrap(), 0);
                assert_eq!(
                    s.available().unwrap(),
                    1,
                    "a grant that raced the timeout was not given back (round {i})"
                );
            }
        }
        assert_eq!(s.available().unwrap(), 1);
    }
    assert!(kept + gave_up == 40);
}

#[test]
fn a_grant_at_the_timeout_is_kept_or_back_at_once_fair() {
    grant_at_the_timeout(true);
}

#[test]
fn a_grant_at_the_timeout_is_kept_or_back_at_once_unfair() {
    grant_at_the_timeout(false);
}

/// A grant pushed as the waiter's cancel fires is given back at once.
#[test]
fn a_grant_at_the_cancel_is_back_at_once() {
    let server = RedisServer::start();
    let name = "edge-cancel";
    let lease = Duration::from_secs(30);
    let s = leased(&server, name, 1, lease, true);
    let w = leased(&server, name, 1, lease, true);
    for i in 0..30u64 {
        let held = s.acquire().unwrap();
        let (tx, rx) = crossbeam_channel::bounded::<()>(1);
        let waiter = {
            let w = w.clone();
            thread::spawn(move || w.acquire_cancellable(&rx).unwrap())
        };
        queue_reaches(&s, 1);
        let go = Arc::new(AtomicBool::new(false));
        let canceller = {
            let go = Arc::clone(&go);
            thread::spawn(move || {
                while !go.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                thread::sleep(Duration::from_micros(i * 40));
                let _ = tx.send(());
            })
        };
        go.store(true, Ordering::Release);
        held.release().unwrap();
        canceller.join().unwrap();
        match waiter.join().unwrap() {
            Some(p) => {
                assert!(!p.is_lost());
                p.release().unwrap();
            }
            None => {
                assert_eq!(
                    s.available().unwrap(),
                    1,
                    "a grant that raced the cancel was not given back (round {i})"
                );
            }
        }
        assert_eq!(s.queue_len().unwrap(), 0);
    }
}

/// A limit lowered below what the head of the queue asks for: the head is refused
/// promptly, and the waiter behind it is served when the holders fit the new limit.
#[test]
fn a_limit_lowered_under_a_queued_head_refuses_it_and_serves_the_next() {
    let server = RedisServer::start();
    let name = "lowered";
    let lease = Duration::from_secs(30);
    let s = leased(&server, name, 3, lease, true);
    let held = s.acquire_many(2).unwrap();
    let head = {
        let s = leased(&server, name, 3, lease, true);
        thread::spawn(move || {
            let r = s.acquire_many(2);
            (Instant::now(), r.map(|p| p.permits()))
        })
    };
    queue_reaches(&s, 1);
    let next = {
        let s = leased(&server, name, 3, lease, true);
        thread::spawn(move || s.acquire().map(|p| p.token()))
    };
    queue_reaches(&s, 2);
    let lowered = Instant::now();
    s.set_limit(1).unwrap();
    let (at, r) = head.join().unwrap();
    assert!(
        matches!(r, Err(Error::PermitsExceedLimit { .. })),
        "the head was not refused: {r:?}"
    );
    let took = at.duration_since(lowered);
    assert!(took < Duration::from_millis(2500), "refused after {took:?}");
    queue_reaches(&s, 1);
    let token = held.token();
    held.release().unwrap();
    assert!(next.join().unwrap().unwrap() > token);
}

/// A release while the client's listener connection was just killed: the waiter is
/// served within about a second, not its lease-long re-check.
#[test]
fn a_wake_up_lost_with_the_listener_connection_costs_about_a_round_trip() {
    let server = RedisServer::start();
    let name = "lostwake";
    let lease = Duration::from_secs(60);
    let s = leased(&server, name, 1, lease, true);
    let held = s.acquire().unwrap();
    let w = leased(&server, name, 1, lease, true);
    let waiter = thread::spawn(move || {
        let p = w.acquire().unwrap();
        (Instant::now(), p)
    });
    queue_reaches(&s, 1);
    let mut admin = server.conn();
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .exec(&mut admin)
        .unwrap();
    let released = Instant::now();
    held.release().unwrap();
    let (at, p) = waiter.join().unwrap();
    assert!(!p.is_lost());
    let took = at.duration_since(released);
    assert!(took < Duration::from_millis(2500), "served after {took:?}");
}

/// The scenario's timing for a release around a waiter's deadline: spread over a few
/// ms either side of it, round by round.
fn release_near(timeout: Duration, started: Instant, round: u64) {
    let at = timeout - Duration::from_millis(25) + Duration::from_micros(round * 1200);
    thread::sleep(at.saturating_sub(started.elapsed()));
}

/// The ownerless semaphores: a permit released as a waiter's timeout ends is either
/// taken (`true`) or still there (`false`), never gone with a waiter that said no.
#[test]
fn ownerless_waits_that_give_up_as_a_permit_comes_take_nothing() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let counting = client.counting_semaphore("edge-counting").unwrap();
    let rs = client.redisson_semaphore("edge-rs");
    let pes = client.redisson_permit_expirable_semaphore("edge-pes");
    assert!(counting.try_set_permits(0).unwrap());
    assert!(rs.try_set_permits(0).unwrap());
    assert!(pes.try_set_permits(1).unwrap());
    let held = pes.acquire(Some(Duration::from_secs(30))).unwrap();
    drop(held);
    let timeout = Duration::from_millis(150);
    for i in 0..20u64 {
        // counting
        let w = counting.clone();
        let started = Instant::now();
        let waiter = thread::spawn(move || w.acquire_timeout(1, timeout).unwrap());
        release_near(timeout, started, i);
        counting.release(1).unwrap();
        let got = waiter.join().unwrap();
        assert_eq!(
            counting.available_permits().unwrap(),
            u32::from(!got),
            "counting round {i}"
        );
        if !got {
            assert!(counting.try_acquire(1).unwrap());
        }
        assert_eq!(counting.queue_len().unwrap(), 0);
        // RSemaphore
        let w = rs.clone();
        let started = Instant::now();
        let waiter = thread::spawn(move || w.acquire_timeout(1, timeout).unwrap());
        release_near(timeout, started, i);
        rs.release(1).unwrap();
        let got = waiter.join().unwrap();
        assert_eq!(
            rs.available_permits().unwrap(),
            i64::from(!got),
            "rs round {i}"
        );
        if !got {
            assert!(rs.try_acquire(1).unwrap());
        }
        // RPermitExpirableSemaphore
        let p = pes
            .try_acquire(Some(Duration::from_secs(30)))
            .unwrap()
            .unwrap();
        let w = pes.clone();
        let started = Instant::now();
        let waiter = thread::spawn(move || {
            w.acquire_timeout(timeout, Some(Duration::from_secs(30)))
                .unwrap()
        });
        release_near(timeout, started, i);
        p.release().unwrap();
        let got = waiter.join().unwrap();
        assert_eq!(
            pes.available_permits().unwrap(),
            i64::from(got.is_none()),
            "pes round {i}"
        );
        drop(got);
        wait_until(WAIT, "the pes permit back", || {
            pes.available_permits().unwrap() == 1
        });
    }
}

/// Writes paused (`CLIENT PAUSE WRITE`) for longer than a heartbeat (within the
/// operation timeout), a release sent during the pause: the waiters are served in
/// their arrival order when it ends.
///
/// Found in the seventh session's waiter review, fixed since: the first script after
/// the pause purges every queued waiter (their heartbeats ended on the server's clock
/// while nothing ran), and the live waiters queued again with new tickets in the order
/// their clients heard of the loss: 4 runs in 5 served them as [0, 2, 3, 1, 4] and
/// the like. (A server stopped with SIGSTOP purges them the same way; there they
/// happened to queue again in their old order.) Now a waiter's looks pass back the
/// arrival ticket of its last queued reply, and one that queues again takes its old
/// place (ops.lua). The ticket orders the queue only: the release, first to run after
/// the pause, finds the queue purged and serves nobody, and the first look after it
/// is granted on the empty queue, with or without a ticket. That look is the head's:
/// its client finds its heartbeat lost a few milliseconds before the waiters behind
/// it look at the moment the script told them the head's heartbeat would end.
#[test]
fn waiters_keep_their_order_through_a_client_pause() {
    let server = RedisServer::start();
    let name = "clientpaused";
    let lease = Duration::from_secs(30);
    let s = leased(&server, name, 1, lease, true);
    let held = s.acquire().unwrap();
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut threads = Vec::new();
    for who in 0..5 {
        let w = leased(&server, name, 1, lease, true);
        let order = Arc::clone(&order);
        threads.push(thread::spawn(move || {
            let p = w.acquire().unwrap();
            order.lock().push(who);
            p.release().unwrap();
        }));
        queue_reaches(&s, who + 1);
    }
    let mut admin = server.conn();
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1500)
        .arg("WRITE")
        .exec(&mut admin)
        .unwrap();
    let releaser = thread::spawn(move || held.release());
    for t in threads {
        t.join().unwrap();
    }
    releaser.join().unwrap().unwrap();
    assert_eq!(*order.lock(), vec![0, 1, 2, 3, 4]);
}

/// The acquire script's side of the fix above: a waiter the queue dropped (its
/// heartbeat ended) that looks again with the arrival ticket of its last queued reply
/// takes its old place, whatever order the looks come in; `qseq` does not move for it.
/// A ticket above `qseq` (from a queue made again since) or none gets a fresh one, one
/// already queued keeps its own, and a bad ticket is refused before anything is
/// written, on the fast path too. The ticket only orders: the release serves the head.
#[test]
fn a_waiter_that_queues_again_with_its_ticket_keeps_its_place() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let name = "tickets";
    let script = support::acquire_script();
    let run = |conn: &mut redis::Connection,
               id: &str,
               mode: &str,
               hb: u64,
               ticket: Option<&str>|
     -> redis::RedisResult<Vec<i64>> {
        let mut inv = support::call_on(&script, name);
        inv.arg(id)
            .arg(1)
            .arg(1)
            .arg(60_000)
            .arg(1000)
            .arg(hb)
            .arg("1|test|")
            .arg(mode)
            .arg("1")
            .arg("")
            .arg("0");
        if let Some(t) = ticket {
            inv.arg(t);
        }
        let reply: redis::Value = inv.invoke(conn)?;
        Ok(support::acquire_reply(&reply))
    };
    let id = |k: u32| format!("aaaaaaaa-0000-4000-8000-{k:012}");
    let queue = |conn: &mut redis::Connection| -> Vec<String> {
        redis::cmd("ZRANGE")
            .arg(format!("redsem:{{{name}}}:q"))
            .arg(0)
            .arg(-1)
            .query(conn)
            .unwrap()
    };
    let qseq = |conn: &mut redis::Connection| -> i64 {
        redis::cmd("HGET")
            .arg(format!("redsem:{{{name}}}:i"))
            .arg("qseq")
            .query(conn)
            .unwrap()
    };
    // a bad ticket on a semaphore without keys (the fast path's create) writes nothing
    for bad in ["x", "-1", "1.5", "9007199254740994", "1e300", "inf", ""] {
        let e = run(&mut conn, &id(1), "w", 1000, Some(bad)).unwrap_err();
        assert!(e.to_string().contains("bad ticket"), "{bad}: {e}");
    }
    assert!(support::keys(&mut conn, "redsem:*").is_empty());
    // the holder, then three waiters with a heartbeat of 100 ms: tickets 1, 2, 3
    assert_eq!(run(&mut conn, &id(9), "t", 1000, None).unwrap()[0], 1);
    for k in 1..=3 {
        let r = run(&mut conn, &id(k), "w", 100, None).unwrap();
        assert_eq!(
            (r[0], r[3], r[4]),
            (0, i64::from(k == 1), i64::from(k)),
            "{r:?}"
        );
    }
    // their heartbeats end unrenewed
    let last: i64 = redis::cmd("ZSCORE")
        .arg(format!("redsem:{{{name}}}:h"))
        .arg(format!("w:{}", id(3)))
        .query(&mut conn)
        .unwrap();
    support::wait_past_server_ms(&mut conn, last);
    // the third looks first: its look purges all three, and it queues with its ticket
    let r = run(&mut conn, &id(3), "w", 1000, Some("3")).unwrap();
    assert_eq!((r[0], r[3], r[4]), (0, 1, 3), "{r:?}");
    // a bad ticket on the full logic is refused before any write
    let before = queue(&mut conn);
    assert!(run(&mut conn, &id(1), "w", 1000, Some("x")).is_err());
    assert_eq!(queue(&mut conn), before);
    // then the first and the second, with theirs: in front of the third
    let r = run(&mut conn, &id(1), "w", 1000, Some("1")).unwrap();
    assert_eq!((r[0], r[3], r[4]), (0, 1, 1), "{r:?}");
    let r = run(&mut conn, &id(2), "w", 1000, Some("2")).unwrap();
    assert_eq!((r[0], r[3], r[4]), (0, 0, 2), "{r:?}");
    assert_eq!(qseq(&mut conn), 3, "kept tickets take no new one");
    // a new waiter without a ticket, and one with a ticket this queue never gave
    // (above 'qseq'): fresh ones, behind
    assert_eq!(run(&mut conn, &id(4), "w", 1000, None).unwrap()[4], 4);
    assert_eq!(run(&mut conn, &id(5), "w", 1000, Some("99")).unwrap()[4], 5);
    assert_eq!(run(&mut conn, &id(6), "w", 1000, Some("0")).unwrap()[4], 6);
    assert_eq!(qseq(&mut conn), 6);
    // one already queued keeps its own ticket, whatever it passes
    assert_eq!(run(&mut conn, &id(4), "w", 1000, Some("1")).unwrap()[4], 4);
    assert_eq!(queue(&mut conn), (1..=6).map(id).collect::<Vec<_>>());
    // the release serves the head, the first waiter
    let released: i64 = support::call_on(&support::release_script(), name)
        .arg(id(9))
        .invoke(&mut conn)
        .unwrap();
    assert_eq!(released, 1);
    assert_eq!(run(&mut conn, &id(1), "w", 1000, Some("1")).unwrap()[0], 1);
    assert_eq!(queue(&mut conn), (2..=6).map(id).collect::<Vec<_>>());
}
