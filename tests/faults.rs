//! Fault injection across processes (issue #11): "never more valid holders than the
//! limit, whatever fails", checked from outside.
//!
//! Worker processes (this test binary started again with `REDSEM_HELPER`, two of them
//! under `faketime` an hour ahead and behind) hold and release permits of one
//! small-limit semaphore with short leases, each through its own TCP proxy the test starts in
//! front of the data server. Each process has one thread that waits in the fair queue
//! and two that take a permit every way a holder can, one at random per round: a
//! wait in the queue, tries again and again (combined into batch calls), two permits
//! at once, an unfair handle, a permit taken apart and adopted again, and a handle
//! renewed by hand (`Permit::refresh`). Meanwhile the test injects faults one after the other:
//! SIGKILL of a worker (a new one replaces it), `CLIENT KILL` of every client
//! connection, `CLIENT PAUSE`, `DEBUG SLEEP`, a crash and restart of the data server
//! that keeps its AOF (`appendfsync always`), a partition (each worker has its own
//! proxy; those of one, two or all workers drop every byte for 0.3–2 s, often longer
//! than the lease, then close their connections, while the others go on and take the
//! permits the server frees) and a reset of every proxied connection. After each fault it waits until work resumes.
//!
//! What "inside" means. A holder works in short steps. Before each it reads the
//! observer's clock (`TIME` on a second, independent redis-server) and then checks its
//! permit: `!is_lost()` and `lease_left()` more than the step. After the step it reads
//! the observer's clock again and records the step. The step's valid interval on the
//! observer's clock is `[e, min(l, e + left - (c - r)... )]`, made sound as follows:
//! with `e` the observer's time of the first read, `r` the instant its reply came back,
//! `c` the instant of the check and `left` the lease left at `c`, the permit is valid
//! until `c + left` (the library promises its deadline is never after the server's),
//! and `e <= r <= c`, so `e + left` is at most `c + left`: the interval
//! `[e, min(l, e + left)]` lies inside the time the holder may believe itself valid
//! and inside the time it really was inside. Two holders whose recorded intervals
//! overlap were both valid at once; so the test asserts, over all recorded steps, that
//! at no instant more than `limit` intervals overlap and never two with the same slot.
//! No margin is needed, and clock skew does not matter: the observer's clock is the
//! only one compared, and `lease_left()` runs on the monotonic clock, which faketime
//! leaves alone (`FAKETIME_DONT_FAKE_MONOTONIC=1`).
//!
//! Also asserted: work resumes (new steps are recorded) within a few leases after
//! every fault, the workers really overlapped (the test proved something), and at the
//! end every key of the semaphore on the data server has a TTL.
//!
//! The default run takes about 20 s; `REDSEM_FAULT_SECS=300` runs five minutes, and
//! `REDSEM_FAULT_SEED` replays a schedule (the seed is printed).

mod support;

use std::time::{Duration, Instant};

use redis_semaphore::Client;
use support::fault_run::{self, FAULTS, Fault, Worker, inject, observer_ms};
use support::{Proxy, RedisServer, wait_until};

const NAME: &str = "faults";
/// The role of this binary's worker processes (`REDSEM_HELPER`).
const ROLE: &str = "fault-worker";
const LIMIT: u32 = 3;
const LEASE_MS: u64 = 600;
/// Client operation timeout in the workers: calls end well within a lease.
const OP_TIMEOUT_MS: u64 = 250;
/// How long after a fault new work must have been recorded.
const RESUME: Duration = Duration::from_secs(8);

/// Runs the role named by `REDSEM_HELPER`; does nothing in a normal test run.
#[test]
fn helper() {
    let Ok(role) = std::env::var("REDSEM_HELPER") else {
        return;
    };
    assert_eq!(role, ROLE, "unknown helper role {role}");
    let url = std::env::var("REDSEM_URL").unwrap();
    let observer = std::env::var("REDSEM_OBSERVER").unwrap();
    let me = std::env::var("REDSEM_WORKER").unwrap();
    let client = Client::builder()
        .operation_timeout(Duration::from_millis(OP_TIMEOUT_MS))
        .connect_timeout(Duration::from_millis(OP_TIMEOUT_MS))
        .checkout_timeout(Duration::from_millis(OP_TIMEOUT_MS))
        .build(&url)
        .unwrap();
    let sem = client
        .semaphore_builder(NAME)
        .limit(LIMIT)
        .lease(Duration::from_millis(LEASE_MS))
        .build()
        .unwrap();
    // the same semaphore through handles of every kind a holder may use: unfair, and
    // renewed by hand (`Permit::refresh`) instead of by the background thread
    let unfair = client
        .semaphore_builder(NAME)
        .limit(LIMIT)
        .lease(Duration::from_millis(LEASE_MS))
        .fair(false)
        .build()
        .unwrap();
    let manual = client
        .semaphore_builder(NAME)
        .limit(LIMIT)
        .lease(Duration::from_millis(LEASE_MS))
        .auto_refresh(false)
        .build()
        .unwrap();
    let handles = Handles {
        sem: &sem,
        unfair: &unfair,
        manual: &manual,
    };
    println!("RESULT ready");
    std::thread::scope(|s| {
        for t in 0..3 {
            let observer = observer.as_str();
            let who = format!("{me}.{t}");
            // thread 0 only waits in the queue; the others take every path in turn
            s.spawn(move || work(handles, t > 0, observer, &who));
        }
    });
}

/// The handles of one worker process on the semaphore.
#[derive(Clone, Copy)]
struct Handles<'a> {
    sem: &'a redis_semaphore::Semaphore,
    unfair: &'a redis_semaphore::Semaphore,
    manual: &'a redis_semaphore::Semaphore,
}

/// How a round of [`work`] gets its permit.
#[derive(Clone, Copy, Debug)]
enum Way {
    /// `acquire_timeout` of one permit, waiting in the fair queue.
    Wait,
    /// `try_acquire` again and again (calls combined with the other threads').
    Try,
    /// `acquire_many_timeout` of two permits.
    Two,
    /// an unfair handle's `acquire_timeout`.
    Unfair,
    /// a permit taken apart (`into_parts`) and adopted again.
    Adopted,
    /// a handle without automatic renewal: the holder calls `Permit::refresh`.
    Manual,
}

const WAYS: [Way; 6] = [
    Way::Wait,
    Way::Try,
    Way::Two,
    Way::Unfair,
    Way::Adopted,
    Way::Manual,
];

/// A permit got the way `way` says, within about a second; `None` when none came or
/// the library reported a fault (it answered in time: go on).
fn obtain(h: Handles<'_>, way: Way, rng: &mut fastrand::Rng) -> Option<redis_semaphore::Permit> {
    let wait = Duration::from_millis(1000);
    match way {
        Way::Wait => h.sem.acquire_timeout(wait).ok().flatten(),
        Way::Try => {
            let end = Instant::now() + wait;
            while Instant::now() < end {
                if let Some(p) = h.sem.try_acquire().ok().flatten() {
                    return Some(p);
                }
                std::thread::sleep(Duration::from_millis(rng.u64(1..4)));
            }
            None
        }
        Way::Two => h.sem.acquire_many_timeout(2, wait).ok().flatten(),
        Way::Unfair => h.unfair.acquire_timeout(wait).ok().flatten(),
        Way::Adopted => {
            let parts = h.sem.acquire_timeout(wait).ok().flatten()?.into_parts();
            h.sem.adopt(parts).ok()
        }
        Way::Manual => h.manual.acquire_timeout(wait).ok().flatten(),
    }
}

/// One thread of a worker: acquire, work in short steps while valid, release; forever
/// (the test kills the process). With `mixed`, each round takes one of [`WAYS`], in
/// turn; else it waits in the queue. A permit of several slots records each step
/// once per slot (each slot a holder of its own in the sweep).
fn work(h: Handles<'_>, mixed: bool, observer: &str, who: &str) {
    let obs = redis::Client::open(observer).unwrap();
    let mut conn = obs.get_connection().unwrap();
    let mut rng = fastrand::Rng::new();
    // the ways in turn from a random one, the next once this one got a permit: every
    // way is taken in a run of any length, however rarely one succeeds under load
    let mut turn = rng.usize(..WAYS.len());
    loop {
        let way = if mixed {
            WAYS[turn % WAYS.len()]
        } else {
            Way::Wait
        };
        let Some(permit) = obtain(h, way, &mut rng) else {
            continue;
        };
        turn += 1;
        // short holds, and holds longer than the lease (kept by the refresher, or by
        // hand), so that a fault often finds a holder that stays inside until its
        // permit runs out
        let hold = Duration::from_millis(if rng.bool() {
            rng.u64(20..100)
        } else {
            rng.u64(300..1500)
        });
        let start = Instant::now();
        while start.elapsed() < hold {
            if matches!(way, Way::Manual)
                && permit.lease_left() < Duration::from_millis(LEASE_MS / 2)
                && permit.refresh().is_err()
            {
                break;
            }
            let step = Duration::from_millis(rng.u64(3..15));
            let e = observer_ms(&mut conn);
            let left = permit.lease_left();
            if permit.is_lost() || left <= step {
                break;
            }
            std::thread::sleep(step); // the work: only while valid
            let l = observer_ms(&mut conn);
            let end = l.min(e + left.as_millis() as i64);
            for slot in permit.slots() {
                let _: i64 = redis::cmd("RPUSH")
                    .arg("steps")
                    .arg(format!("{e} {end} {slot} {} {who}.{way:?}", permit.token()))
                    .query(&mut conn)
                    .unwrap();
            }
        }
        let _ = permit.release();
    }
}

/// One recorded step: its valid interval on the observer's clock, slot, token, who.
#[derive(Debug, Clone)]
struct Step {
    from: i64,
    to: i64,
    slot: u32,
    token: u64,
    who: String,
}

fn steps(observer: &mut redis::Connection) -> Vec<Step> {
    let raw: Vec<String> = redis::cmd("LRANGE")
        .arg("steps")
        .arg(0)
        .arg(-1)
        .query(observer)
        .unwrap();
    raw.iter()
        .map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            Step {
                from: f[0].parse().unwrap(),
                to: f[1].parse().unwrap(),
                slot: f[2].parse().unwrap(),
                token: f[3].parse().unwrap(),
                who: f[4].to_owned(),
            }
        })
        .collect()
}

fn step_count(observer: &mut redis::Connection) -> usize {
    redis::cmd("LLEN").arg("steps").query(observer).unwrap()
}

/// The most intervals that overlap at one instant, and the first two intervals of one
/// slot that overlap, if any. Intervals are half-open `[from, to)`: one that ends when
/// another starts does not overlap it.
fn sweep(steps: &[Step]) -> (usize, Option<(Step, Step)>) {
    let mut clash = None;
    let most = fault_run::sweep(
        steps,
        |s| (s.from, s.to),
        |_| 1,
        |inside, k| {
            let s = &steps[k];
            if clash.is_none()
                && let Some(&other) = inside
                    .iter()
                    .find(|&&o| o != k && steps[o].slot == s.slot && steps[o].token != s.token)
            {
                clash = Some((steps[other].clone(), s.clone()));
            }
        },
    );
    (most as usize, clash)
}

#[test]
fn never_more_valid_holders_than_the_limit_whatever_fails() {
    assert!(
        support::has_faketime(),
        "this test needs faketime on PATH (Debian package faketime; scripts/test.sh installs it)"
    );
    let secs: u64 = std::env::var("REDSEM_FAULT_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let seed: u64 = std::env::var("REDSEM_FAULT_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("fault injection: {secs} s, REDSEM_FAULT_SEED={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);

    let mut data = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let observer = RedisServer::start();
    let mut obs = observer.conn();
    let skews = [None, Some("+1h"), Some("-1h"), None];
    // each worker reaches the data server through its own proxy, so that a partition
    // can cut some holders off while the others go on (and may take their permits)
    let proxies: Vec<Proxy> = skews.iter().map(|_| Proxy::start(data.port())).collect();
    let mut workers: Vec<Worker> = skews
        .iter()
        .enumerate()
        .map(|(k, skew)| Worker::start(ROLE, k, &proxies[k].url(), &observer.url(), *skew))
        .collect();
    let mut next_worker = workers.len();

    let resumed = |obs: &mut redis::Connection, after: usize, what: &str| {
        wait_until(RESUME, &format!("work to resume after {what}"), || {
            step_count(obs) > after + 3
        });
    };
    resumed(&mut obs, 0, "the start");

    let end = Instant::now() + Duration::from_secs(secs);
    let mut injected = Vec::new();
    // every kind once first, then at random
    let mut schedule: Vec<Fault> = FAULTS.to_vec();
    rng.shuffle(&mut schedule);
    let mut k = 0;
    while Instant::now() < end || k < FAULTS.len() {
        let fault = schedule
            .get(k)
            .copied()
            .unwrap_or_else(|| FAULTS[rng.usize(..FAULTS.len())]);
        k += 1;
        let before = step_count(&mut obs);
        match fault {
            Fault::KillWorker => {
                let victim = rng.usize(..workers.len());
                let skew = skews[victim % skews.len()];
                drop(std::mem::replace(
                    &mut workers[victim],
                    Worker::start(
                        ROLE,
                        next_worker,
                        &proxies[victim].url(),
                        &observer.url(),
                        skew,
                    ),
                ));
                next_worker += 1;
            }
            _ => {
                inject(fault, &mut rng, &mut data, &proxies);
            }
        }
        injected.push(fault);
        resumed(&mut obs, before, &format!("{fault:?}"));
        // some work between faults
        let calm = step_count(&mut obs);
        resumed(&mut obs, calm, &format!("the calm after {fault:?}"));
    }
    drop(workers);

    let all = steps(&mut obs);
    let (most, clash) = sweep(&all);
    let processes: std::collections::HashSet<&str> = all
        .iter()
        .map(|s| s.who.split('.').next().unwrap_or(""))
        .collect();
    let by_way: Vec<(Way, usize)> = WAYS
        .iter()
        .map(|&w| {
            let tag = format!(".{w:?}");
            (w, all.iter().filter(|s| s.who.ends_with(&tag)).count())
        })
        .collect();
    eprintln!("steps by way: {by_way:?}");
    eprintln!(
        "{} steps by {} processes, {} faults {:?}, at most {most} valid holders at once",
        all.len(),
        processes.len(),
        injected.len(),
        injected
    );
    assert!(
        clash.is_none(),
        "two valid holders in one slot (seed {seed}): {clash:?}"
    );
    assert!(
        most <= LIMIT as usize,
        "{most} valid holders at once, limit {LIMIT} (seed {seed})"
    );
    assert!(
        most >= 2,
        "the holders never overlapped: the test proved nothing (seed {seed})"
    );
    for way in WAYS {
        let tag = format!(".{way:?}");
        assert!(
            all.iter().any(|s| s.who.ends_with(&tag)),
            "no step was recorded by a permit got by {way:?}: that path was not tried (seed {seed})"
        );
    }

    // no key without a TTL
    let mut conn = data.conn();
    for key in support::keys(&mut conn, "redsem:*") {
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
        assert!(ttl > 0 || ttl == -2, "{key} has no TTL ({ttl})");
    }
}

#[test]
fn the_sweep_counts_overlaps_and_finds_a_shared_slot() {
    let s = |from, to, slot, token| Step {
        from,
        to,
        slot,
        token,
        who: "t".into(),
    };
    let (most, clash) = sweep(&[s(0, 10, 0, 1), s(5, 15, 1, 2), s(10, 20, 0, 3)]);
    assert_eq!(most, 2);
    assert!(
        clash.is_none(),
        "an end and a start at one instant do not overlap"
    );
    let (most, clash) = sweep(&[s(0, 10, 0, 1), s(9, 12, 0, 2), s(9, 11, 1, 3)]);
    assert_eq!(most, 3);
    assert!(clash.is_some());
}
