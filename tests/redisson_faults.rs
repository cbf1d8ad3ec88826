//! Fault injection across processes for Redisson's `RPermitExpirableSemaphore` as this
//! library speaks it (`compat::redisson`): "never more valid holders than the permits
//! available, whatever fails", checked from outside, as tests/faults.rs checks the
//! leased `Semaphore`.
//!
//! Worker processes (this test binary started again with `REDSEM_HELPER`) hold and
//! release permits of one semaphore of a few permits with short leases, each process
//! through its own TCP proxy the test starts in front of the data server. Each process
//! has three threads; one waits (`acquire_timeout`) every round, the others take a
//! permit one way at random per round: a blocking acquire with a timeout, tries again
//! and again (`try_acquire`), two permits at once (`acquire_many_timeout`, or
//! `try_acquire_many` again and again), a handle
//! that renews in the background (`with_auto_refresh(true)`), a permit renewed by hand
//! (`Permit::refresh`), a permit whose lease is changed now and then
//! (`update_lease_time`, shorter or longer than the lease it had), and a permit
//! renewed in the background whose lease is also changed, shorter, through another
//! handle. Each permit goes back one way at random: dropped, `Permit::release`, or by
//! id through the semaphore (`release`, `try_release`). Meanwhile the test injects
//! the faults of tests/faults.rs one after the other: SIGKILL of a worker (a new one
//! replaces it), `CLIENT KILL` of every client connection, `CLIENT PAUSE`,
//! `DEBUG SLEEP`, a crash and restart of the data server that keeps its AOF
//! (`appendfsync always`), a partition of one, two or all workers (their proxies
//! drop every byte for 0.3–2 s, then close their connections) and a reset of every
//! proxied connection.
//!
//! No clock skew. Redisson's layout keeps each lease deadline in the *acquiring
//! client's* epoch milliseconds and every call reclaims by the *calling client's*
//! clock (shared/reference/redisson-protocol.md §2; the module docs of
//! `compat::redisson`, "Client-clock leases": a host whose clock runs ahead reclaims
//! other holders' permits early, which lets more than the limit hold a permit). The
//! library documents that this type is NOT safe under client clock skew, so the
//! workers run on the machine's clock (tests/faults.rs runs two of its workers an
//! hour off).
//!
//! What "inside" means is as in tests/faults.rs: before each short step a holder reads
//! the observer's clock (`TIME` on a second, independent redis-server) at `e`, then
//! checks its permit (`lease_left()` more than the step, `!is_lost()`); after the step
//! it reads the observer's clock again at `l` and records `[e, min(l, e + left))`.
//! The library promises that a permit's deadline on the client is never later than
//! the server's (here: never later than the moment any client's clock reaches the
//! permit's score), and `e` was read before the check, so the interval lies inside
//! the time the permit was held. A holder of two permits records each as a holder of
//! its own. The test asserts that at no instant more than `PERMITS` recorded
//! intervals overlap (this layout has no slots: only the count is checked).
//!
//! Also asserted: work resumes within a few leases after every fault, the holders
//! really overlapped, every way of taking and of giving back a permit was used, and
//! at the end, once the workers are gone and their leases over, the semaphore has
//! exactly its `PERMITS` again (none lost, none made up), and no key is left
//! without a TTL but Redisson's counter, which Redisson's own layout keeps for good
//! (its lease zset takes the counter's TTL, none here, and is gone once empty).
//!
//! The default run takes about 20 s; `REDSEM_FAULT_SECS=300` runs five minutes, and
//! `REDSEM_FAULT_SEED` replays a schedule (the seed is printed).

mod support;

use std::time::{Duration, Instant};

use redis_semaphore::compat::redisson::RPermitExpirableSemaphore;
use redis_semaphore::{Client, Permit};
use support::fault_run::{self, FAULTS, Fault, Worker, inject, observer_ms};
use support::{Proxy, RedisServer, wait_until};

const NAME: &str = "pes-faults";
/// The role of this binary's worker processes (`REDSEM_HELPER`).
const ROLE: &str = "pes-fault-worker";
const PERMITS: u32 = 3;
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
    let sem = client.redisson_permit_expirable_semaphore(NAME);
    let auto = client
        .redisson_permit_expirable_semaphore(NAME)
        .with_auto_refresh(true);
    let handles = Handles {
        sem: &sem,
        auto: &auto,
    };
    println!("RESULT ready");
    std::thread::scope(|s| {
        for t in 0..3 {
            let observer = observer.as_str();
            let who = format!("{me}.{t}");
            // thread 0 only waits; the others take every way in turn
            s.spawn(move || work(handles, t > 0, observer, &who));
        }
    });
}

/// The handles of one worker process on the semaphore.
#[derive(Clone, Copy)]
struct Handles<'a> {
    /// Redisson's way: no renewal but by hand.
    sem: &'a RPermitExpirableSemaphore,
    /// Renewed by the client's background thread.
    auto: &'a RPermitExpirableSemaphore,
}

/// How a round of [`work`] gets its permit(s) and keeps them.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Way {
    /// `acquire_timeout` of one permit.
    Wait,
    /// `try_acquire` again and again.
    Try,
    /// two permits at once (`acquire_many_timeout`, or `try_acquire_many` again and
    /// again).
    Two,
    /// a handle `with_auto_refresh(true)`: renewed in the background.
    Auto,
    /// renewed by hand (`Permit::refresh`).
    Manual,
    /// its lease changed now and then (`update_lease_time`, shorter or longer).
    Update,
    /// renewed in the background, and its lease now and then made shorter through
    /// the other handle (`update_lease_time`).
    AutoUpdate,
}

const WAYS: [Way; 7] = [
    Way::Wait,
    Way::Try,
    Way::Two,
    Way::Auto,
    Way::Manual,
    Way::Update,
    Way::AutoUpdate,
];

/// How a round of [`work`] gives its permits back.
#[derive(Clone, Copy, Debug)]
enum Back {
    /// the guard dropped
    Drop,
    /// `Permit::release`
    Release,
    /// `RPermitExpirableSemaphore::release(id)`, then the guard dropped
    ById,
    /// `RPermitExpirableSemaphore::try_release(id)`, then the guard dropped
    TryById,
}

const BACKS: [Back; 4] = [Back::Drop, Back::Release, Back::ById, Back::TryById];

/// The permits got the way `way` says, within about a second; empty when none came or
/// the library reported a fault (it answered in time: go on).
fn obtain(h: Handles<'_>, way: Way, rng: &mut fastrand::Rng) -> Vec<Permit> {
    let wait = Duration::from_millis(1000);
    let lease = Some(Duration::from_millis(LEASE_MS));
    let one = |p: Option<Permit>| p.into_iter().collect();
    match way {
        Way::Wait | Way::Manual | Way::Update => {
            one(h.sem.acquire_timeout(wait, lease).ok().flatten())
        }
        Way::Try => tries(wait, rng, || {
            h.sem.try_acquire(lease).ok().flatten().map(|p| vec![p])
        }),
        // (two free at once are rare among a dozen threads that want one: a blocking
        // acquire or tries again and again, whichever comes first)
        Way::Two if rng.bool() => h
            .sem
            .acquire_many_timeout(2, wait, lease)
            .ok()
            .flatten()
            .unwrap_or_default(),
        Way::Two => tries(wait, rng, || {
            h.sem.try_acquire_many(2, lease).ok().flatten()
        }),
        Way::Auto | Way::AutoUpdate => one(h.auto.acquire_timeout(wait, lease).ok().flatten()),
    }
}

/// `attempt` again and again, a few ms apart, for up to `wait`; empty when it never
/// gave permits.
fn tries(
    wait: Duration,
    rng: &mut fastrand::Rng,
    mut attempt: impl FnMut() -> Option<Vec<Permit>>,
) -> Vec<Permit> {
    let end = Instant::now() + wait;
    while Instant::now() < end {
        if let Some(p) = attempt() {
            return p;
        }
        std::thread::sleep(Duration::from_millis(rng.u64(1..4)));
    }
    Vec::new()
}

/// One thread of a worker: acquire, work in short steps while valid, give back;
/// forever (the test kills the process). With `mixed`, each round takes one of
/// [`WAYS`], in turn (and gives its permits back one of [`BACKS`] in turn); else it
/// waits. Each permit of a round is a holder of its own in
/// the sweep.
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
        let permits = obtain(h, way, &mut rng);
        if permits.is_empty() {
            continue;
        }
        turn += 1;
        // short holds, and holds longer than the lease (kept by the background thread,
        // by hand, or by lease updates), so that a fault often finds a holder that
        // stays inside until its permit runs out
        let renewed = matches!(way, Way::Auto | Way::Manual | Way::Update | Way::AutoUpdate);
        let hold = Duration::from_millis(if renewed && rng.bool() {
            rng.u64(300..1500)
        } else {
            rng.u64(20..100)
        });
        let start = Instant::now();
        let mut next_update = Instant::now() + Duration::from_millis(rng.u64(30..200));
        while start.elapsed() < hold {
            if way == Way::Manual
                && permits[0].lease_left() < Duration::from_millis(LEASE_MS / 2)
                && permits[0].refresh().is_err()
            {
                break;
            }
            if matches!(way, Way::Update | Way::AutoUpdate) && Instant::now() >= next_update {
                // Update: shorter or longer than the lease; AutoUpdate: shorter, between
                // the background renewals (which give it its own lease again)
                let ms = match way {
                    Way::Update => rng.u64(150..1200),
                    _ => rng.u64(100..LEASE_MS),
                };
                // a failure may or may not have changed the lease: the permit says
                let _ = h
                    .sem
                    .update_lease_time(permits[0].id(), Some(Duration::from_millis(ms)));
                next_update = Instant::now() + Duration::from_millis(rng.u64(30..200));
            }
            let step = Duration::from_millis(rng.u64(3..15));
            let e = observer_ms(&mut conn);
            let lefts: Vec<Duration> = permits.iter().map(Permit::lease_left).collect();
            if permits
                .iter()
                .zip(&lefts)
                .any(|(p, &left)| p.is_lost() || left <= step)
            {
                break;
            }
            std::thread::sleep(step); // the work: only while valid
            let l = observer_ms(&mut conn);
            for (p, left) in permits.iter().zip(&lefts) {
                let end = l.min(e + left.as_millis() as i64);
                let _: i64 = redis::cmd("RPUSH")
                    .arg("steps")
                    .arg(format!("{e} {end} {} {who}.{way:?}", p.id()))
                    .query(&mut conn)
                    .unwrap();
            }
        }
        let back = BACKS[turn % BACKS.len()];
        for p in permits {
            match back {
                Back::Drop => drop(p),
                Back::Release => {
                    let _ = p.release();
                }
                Back::ById => {
                    let _ = h.sem.release(p.id());
                }
                Back::TryById => {
                    let _ = h.sem.try_release(p.id());
                }
            }
        }
        let _: i64 = redis::cmd("HINCRBY")
            .arg("backs")
            .arg(format!("{back:?}"))
            .arg(1)
            .query(&mut conn)
            .unwrap();
        // a pause between rounds, so that permits are sometimes free two at once
        std::thread::sleep(Duration::from_millis(rng.u64(0..30)));
    }
}

/// One recorded step: its valid interval on the observer's clock, the permit, who.
#[derive(Debug, Clone)]
struct Step {
    from: i64,
    to: i64,
    id: String,
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
                id: f[2].to_owned(),
                who: f[3].to_owned(),
            }
        })
        .collect()
}

fn step_count(observer: &mut redis::Connection) -> usize {
    redis::cmd("LLEN").arg("steps").query(observer).unwrap()
}

/// The most intervals that overlap at one instant, and the intervals of the first
/// instant where more than `limit` overlap, if any. Intervals are half-open
/// `[from, to)`: one that ends when another starts does not overlap it.
fn sweep(steps: &[Step], limit: usize) -> (usize, Option<Vec<Step>>) {
    let mut over = None;
    let most = fault_run::sweep(
        steps,
        |s| (s.from, s.to),
        |_| 1,
        |inside, _| {
            if inside.len() > limit && over.is_none() {
                over = Some(inside.iter().map(|&k| steps[k].clone()).collect());
            }
        },
    );
    (most as usize, over)
}

#[test]
fn never_more_valid_permit_expirable_holders_than_permits_whatever_fails() {
    let secs: u64 = std::env::var("REDSEM_FAULT_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let seed: u64 = std::env::var("REDSEM_FAULT_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("permit-expirable fault injection: {secs} s, REDSEM_FAULT_SEED={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);

    let mut data = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let observer = RedisServer::start();
    let mut obs = observer.conn();
    {
        let setup = Client::open(data.url()).unwrap();
        let pes = setup.redisson_permit_expirable_semaphore(NAME);
        assert!(pes.try_set_permits(PERMITS).unwrap());
    }
    const WORKERS: usize = 4;
    // each worker reaches the data server through its own proxy, so that a partition
    // can cut some holders off while the others go on (and may take their permits)
    let proxies: Vec<Proxy> = (0..WORKERS).map(|_| Proxy::start(data.port())).collect();
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|k| Worker::start(ROLE, k, &proxies[k].url(), &observer.url(), None))
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
                drop(std::mem::replace(
                    &mut workers[victim],
                    Worker::start(
                        ROLE,
                        next_worker,
                        &proxies[victim].url(),
                        &observer.url(),
                        None,
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
    let (most, over) = sweep(&all, PERMITS as usize);
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
    let backs: std::collections::HashMap<String, u64> =
        redis::cmd("HGETALL").arg("backs").query(&mut obs).unwrap();
    eprintln!("steps by way: {by_way:?}; give-backs by way: {backs:?}");
    let permits: std::collections::HashSet<&str> = all.iter().map(|s| s.id.as_str()).collect();
    eprintln!(
        "{} steps of {} permits by {} processes, {} faults {:?}, at most {most} valid \
         holders at once",
        all.len(),
        permits.len(),
        processes.len(),
        injected.len(),
        injected
    );
    assert!(
        over.is_none(),
        "{most} valid holders at once, {PERMITS} permits (seed {seed}); the first time: {over:#?}"
    );
    assert!(
        most >= 2,
        "the holders never overlapped: the test proved nothing (seed {seed})"
    );
    for (way, n) in &by_way {
        assert!(
            *n > 0,
            "no step was recorded by a permit got by {way:?}: that path was not tried (seed {seed})"
        );
    }
    for back in BACKS {
        assert!(
            backs.get(&format!("{back:?}")).is_some_and(|&n| n > 0),
            "no permit was given back by {back:?} (seed {seed})"
        );
    }

    // The workers are gone; once their leases are over (at most 1.2 s after their
    // last update), every permit comes back at the next call: exactly PERMITS, none
    // lost and none made up. (`acquired_permits` reclaims expired ones first.)
    let check = Client::builder()
        .operation_timeout(Duration::from_secs(5))
        .build(data.url())
        .unwrap();
    let pes = check.redisson_permit_expirable_semaphore(NAME);
    wait_until(
        Duration::from_secs(15),
        "every lease of the killed workers to end",
        || pes.acquired_permits().unwrap() == 0,
    );
    assert_eq!(
        pes.available_permits().unwrap(),
        i64::from(PERMITS),
        "the free permits once nobody holds one (seed {seed})"
    );
    assert_eq!(pes.permits().unwrap(), i64::from(PERMITS));

    // Keys: Redisson's counter has no TTL (its layout keeps it for good: set by
    // `try_set_permits`, without one); the lease zset takes the counter's TTL when
    // there is one (none here) and is gone once empty; anything else (this library's
    // operation keys, on a cluster) has a TTL.
    let mut conn = data.conn();
    let zset = format!("{{{NAME}}}:timeout");
    for key in support::keys(&mut conn, "*") {
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
        if key == NAME {
            assert_eq!(ttl, -1, "{key}: Redisson's counter, without a TTL as set");
        } else {
            assert_ne!(key, zset, "the lease zset is left once empty");
            assert!(ttl > 0 || ttl == -2, "{key} has no TTL ({ttl})");
        }
    }
}

#[test]
fn the_sweep_counts_overlaps_and_shows_the_first_excess() {
    let s = |from, to| Step {
        from,
        to,
        id: "p".into(),
        who: "t".into(),
    };
    let (most, over) = sweep(&[s(0, 10), s(5, 15), s(10, 20)], 1);
    assert_eq!(most, 2);
    assert_eq!(over.map(|v| v.len()), Some(2));
    let (most, over) = sweep(&[s(0, 10), s(10, 20), s(20, 30)], 1);
    assert_eq!(most, 1, "an end and a start at one instant do not overlap");
    assert!(over.is_none());
    let (most, over) = sweep(&[s(0, 10), s(9, 12), s(9, 11)], 3);
    assert_eq!(most, 3);
    assert!(over.is_none());
}
