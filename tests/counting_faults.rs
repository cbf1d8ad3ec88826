//! Fault injection across processes for the ownerless counters: the
//! [`CountingSemaphore`] (Dijkstra's P/V on `redsem:{name}:count`) and Redisson's
//! [`RSemaphore`] (its counter `NAME`). "Never lose or leak a permit" (DESIGN
//! invariant 11, "safe to run twice"), checked from outside.
//!
//! Worker processes (this test binary started again with `REDSEM_HELPER`) reach the
//! data server each through its own TCP proxy; half of them use a counting semaphore,
//! the other half an `RSemaphore` (each its own name, both with [`LIMIT`] permits set
//! once by the test). Each worker thread loops: take 1 or 2 permits (a `try_acquire`
//! repeated for about a second, or a blocking `acquire_timeout`), hold them briefly,
//! give them back. Meanwhile the test injects every fault of `tests/faults.rs` but the
//! SIGKILL of a worker (a killed P-holder's permits are gone for good, by design of a
//! counter without owners): `CLIENT KILL`, `CLIENT PAUSE`, `DEBUG SLEEP`, a crash and
//! restart of the data server that keeps its AOF (`appendfsync always`), a partition
//! through the proxies and a reset of every proxied connection.
//!
//! What each worker knows, and reports (to the observer, a second redis-server that no
//! fault touches): the permits its acquires took with certainty (`Ok(true)`), those
//! whose acquire ended in an error that leaves it in doubt (a timeout, or the
//! connection failing while the reply was awaited: the script may have run, and the
//! library documents that it does not give such permits back on one server), the
//! permits its releases gave back with certainty (`Ok`), and those whose release ended
//! in doubt (not sent again: a repeat might give twice). An error that surely changed
//! nothing (no connection could be had, the server answered with an error code such
//! as `LOADING`, or the wait's `cancel` failed after its last look found nothing) is
//! not in doubt: an acquire so is simply not granted, and a release so is tried again.
//!
//! The run goes in rounds, one fault each, because a call in doubt may take permits
//! for good (a `CLIENT PAUSE` longer than the operation timeout drains both counters:
//! every acquire sent during it times out and then runs). A round: the counters are
//! full (`L` permits, the limit), the workers work, the fault is injected, the workers
//! are told to go idle (each gives back what it holds; at the last round they exit
//! instead, each client's drop sending whatever it still owes), the test waits until
//! the counters have settled (nothing in flight, unchanged for a second after the
//! fault is over) and asserts, for each type and that round:
//!
//! - `available <= L`: no permit created (no release applied twice, none resent);
//! - `available >= L - (acquires in doubt) - (releases in doubt)`: no permit destroyed
//!   but by a call that ended in an error the library documents as in doubt; exact
//!   (`available == L`) when no call ended in doubt;
//! - the workers' books balance: every permit taken was given back or its release
//!   ended in doubt.
//!
//! Then the test puts back what the round lost (`add_permits`, while nobody holds a
//! permit) and the next round begins. Over the whole run it asserts that at no instant
//! (on the observer's clock) did the permits the workers believed they held add up to
//! more than `L`: each hold is recorded as the interval between the observer's time
//! read after its acquire returned and the observer's time read before its release
//! was sent, which lies inside the time the server counted the permits as taken.
//!
//! Also asserted: work resumes in every round (the counters full again after the
//! faults before), holders overlapped (the test proved something), and each type and
//! each way of acquiring recorded holds. A round whose counters were drained by calls
//! in doubt before its fault (an unplanned stall: an `fsync` of the AOF held up by
//! other work on the machine) ends early, without its fault; one that makes no
//! progress although no call ended in doubt fails the test.
//!
//! The default run takes about 20 s (8 s of faults); `REDSEM_FAULT_SECS=300` runs
//! five minutes, and `REDSEM_FAULT_SEED` replays a schedule (the seed is printed).

mod support;

use std::time::{Duration, Instant};

use redis_semaphore::{Client, CountingSemaphore, Error, RSemaphore};
use support::fault_run::{self, Fault, Worker, inject, observer_ms};
use support::{Proxy, RedisServer, wait_until};

/// The role of this binary's worker processes (`REDSEM_HELPER`).
const ROLE: &str = "counting-fault-worker";
const COUNTING: &str = "cfaults";
const REDISSON: &str = "rfaults";
const LIMIT: u32 = 3;
/// Client operation timeout in the workers.
const OP_TIMEOUT_MS: u64 = 250;
/// How long after a fault new work must have been recorded.
const RESUME: Duration = Duration::from_secs(8);
/// Threads per worker process.
const THREADS: usize = 3;
/// How many worker processes (even ones count, odd ones use an `RSemaphore`).
const WORKERS: usize = 4;
/// How long a counter must stay unchanged, after its round's fault is over and every
/// worker went idle, to be read as settled.
const SETTLE: Duration = Duration::from_millis(1000);

/// The two counters under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Counting,
    Redisson,
}

impl Kind {
    fn of_worker(k: usize) -> Kind {
        if k.is_multiple_of(2) {
            Kind::Counting
        } else {
            Kind::Redisson
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Kind::Counting => "counting",
            Kind::Redisson => "redisson",
        }
    }
}

/// One semaphore of either kind, as a worker uses it.
enum Sem {
    Counting(CountingSemaphore),
    Redisson(RSemaphore),
}

impl Sem {
    fn try_acquire(&self, n: u32) -> Result<bool, Error> {
        match self {
            Sem::Counting(s) => s.try_acquire(n),
            Sem::Redisson(s) => s.try_acquire(n),
        }
    }

    fn acquire_timeout(&self, n: u32, d: Duration) -> Result<bool, Error> {
        match self {
            Sem::Counting(s) => s.acquire_timeout(n, d),
            Sem::Redisson(s) => s.acquire_timeout(n, d),
        }
    }

    fn release(&self, n: u32) -> Result<(), Error> {
        match self {
            Sem::Counting(s) => s.release(n),
            Sem::Redisson(s) => s.release(n).map(drop),
        }
    }
}

/// Whether a failed call may have changed the counter (its script may have run): a
/// timeout, or a connection that failed while the reply was awaited. Not in doubt:
/// no connection at all (nothing was sent), an error reply of the server (a script
/// fails before its first write, or did not run), and a failed `cancel` of a wait
/// (its last look found nothing: the cancel changes no count).
fn in_doubt(e: &Error) -> bool {
    match e {
        Error::Pool(_) | Error::Connect { .. } | Error::Auth { .. } => false,
        Error::InvalidArgument(_) | Error::WrongType { .. } | Error::CountOutOfRange { .. } => {
            false
        }
        Error::Timeout { operation, .. } => *operation != "cancel",
        Error::Call {
            operation, source, ..
        } => {
            *operation != "cancel"
                && (source.code().is_none()
                    || source.is_io_error()
                    || source.is_timeout()
                    || source.is_connection_dropped())
        }
        Error::Redis(source) => {
            source.code().is_none()
                || source.is_io_error()
                || source.is_timeout()
                || source.is_connection_dropped()
        }
        _ => true,
    }
}

/// Runs the role named by `REDSEM_HELPER`; does nothing in a normal test run.
#[test]
fn helper() {
    let Ok(role) = std::env::var("REDSEM_HELPER") else {
        return;
    };
    assert_eq!(role, ROLE, "unknown helper role {role}");
    let url = std::env::var("REDSEM_URL").unwrap();
    let observer = std::env::var("REDSEM_OBSERVER").unwrap();
    let me: usize = std::env::var("REDSEM_WORKER").unwrap().parse().unwrap();
    let kind = Kind::of_worker(me);
    let client = Client::builder()
        .operation_timeout(Duration::from_millis(OP_TIMEOUT_MS))
        .connect_timeout(Duration::from_millis(OP_TIMEOUT_MS))
        .checkout_timeout(Duration::from_millis(OP_TIMEOUT_MS))
        .build(&url)
        .unwrap();
    let sem = match kind {
        Kind::Counting => Sem::Counting(client.counting_semaphore(COUNTING).unwrap()),
        Kind::Redisson => Sem::Redisson(client.redisson_semaphore(REDISSON)),
    };
    println!("RESULT ready");
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (sem, observer) = (&sem, observer.as_str());
            let who = format!("{me}.{t}");
            s.spawn(move || work(sem, kind, observer, &who));
        }
    });
    // the client's drop (here) sends what it still owes, within its operation timeout
    drop(sem);
    drop(client);
    println!("RESULT done");
}

/// How a round of [`work`] takes its permits.
#[derive(Clone, Copy, Debug)]
enum Way {
    /// `try_acquire` again and again for about a second.
    Try,
    /// `acquire_timeout` of about a second (queued, woken by a release).
    Wait,
}

/// The phase the test sets on the observer (`phase`): `run R` (round R: work),
/// `hold R` (finish round R's work and wait), `stop` (finish and exit).
fn phase(conn: &mut redis::Connection) -> (String, u64) {
    let p: Option<String> = redis::cmd("GET").arg("phase").query(conn).unwrap();
    let p = p.unwrap_or_default();
    let mut f = p.split(' ');
    let what = f.next().unwrap_or("").to_owned();
    let round = f.next().and_then(|r| r.parse().ok()).unwrap_or(0);
    (what, round)
}

/// One thread of a worker: acquire 1..=2 permits, hold them briefly, give them back;
/// while the observer's phase says `run`. Everything it learns is counted on the
/// observer at once (`HINCRBY tally:<kind>:<round>`, the round its acquire began in),
/// each hold recorded as an interval. When the phase says `hold R`, it joins the
/// round's idle set (`idle:R`) holding nothing and waits for the next round; on
/// `stop` it returns.
fn work(sem: &Sem, kind: Kind, observer: &str, who: &str) {
    let obs = redis::Client::open(observer).unwrap();
    let mut conn = obs.get_connection().unwrap();
    let holds = format!("holds:{}", kind.tag());
    let count = |conn: &mut redis::Connection, round: u64, field: &str, n: u32| {
        let _: i64 = redis::cmd("HINCRBY")
            .arg(format!("tally:{}:{round}", kind.tag()))
            .arg(field)
            .arg(n)
            .query(conn)
            .unwrap();
    };
    let mut rng = fastrand::Rng::new();
    loop {
        let (what, round) = phase(&mut conn);
        match what.as_str() {
            "run" => {}
            "stop" => return,
            _ => {
                let _: i64 = redis::cmd("SADD")
                    .arg(format!("idle:{round}"))
                    .arg(who)
                    .query(&mut conn)
                    .unwrap();
                while phase(&mut conn) == (what.clone(), round) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                continue;
            }
        }
        let n = rng.u32(1..=2);
        let way = if rng.bool() { Way::Try } else { Way::Wait };
        let wait = Duration::from_millis(1000);
        note(
            &mut conn,
            who,
            &format!("round {round}: acquire {n} by {way:?}"),
        );
        let got = match way {
            Way::Try => {
                let end = Instant::now() + wait;
                loop {
                    match sem.try_acquire(n) {
                        Ok(false) if Instant::now() < end => {
                            std::thread::sleep(Duration::from_millis(rng.u64(1..4)));
                        }
                        other => break other,
                    }
                }
            }
            Way::Wait => sem.acquire_timeout(n, wait),
        };
        match got {
            Ok(true) => count(&mut conn, round, "acquired", n),
            Ok(false) => continue,
            Err(e) if in_doubt(&e) => {
                note(
                    &mut conn,
                    who,
                    &format!("round {round}: acquire in doubt: {e}"),
                );
                count(&mut conn, round, "acquire_in_doubt", n);
                if !e.is_timeout() {
                    count(&mut conn, round, "doubt_not_timeout", 1);
                }
                continue;
            }
            Err(e) => {
                note(
                    &mut conn,
                    who,
                    &format!("round {round}: acquire failed: {e}"),
                );
                count(&mut conn, round, "acquire_failed", n);
                continue;
            }
        }
        // believed held from here (the observer's time after the grant came back)...
        let from = observer_ms(&mut conn);
        std::thread::sleep(Duration::from_millis(rng.u64(5..60)));
        // ...until here (the observer's time before the release is sent); a release
        // that surely changed nothing is tried again, the permits still held
        let mut attempts = 0;
        note(&mut conn, who, &format!("round {round}: release {n}"));
        let to = loop {
            let to = observer_ms(&mut conn);
            attempts += 1;
            match sem.release(n) {
                Ok(()) => {
                    count(&mut conn, round, "released", n);
                    break to;
                }
                Err(e) if in_doubt(&e) => {
                    note(
                        &mut conn,
                        who,
                        &format!("round {round}: release in doubt: {e}"),
                    );
                    count(&mut conn, round, "release_in_doubt", n);
                    if !e.is_timeout() {
                        count(&mut conn, round, "doubt_not_timeout", 1);
                    }
                    break to;
                }
                Err(e) => {
                    note(
                        &mut conn,
                        who,
                        &format!("round {round}: release refused: {e}"),
                    );
                    count(&mut conn, round, "release_refused", n);
                    // a server that answers nothing but errors for a minute is a
                    // failure of the test's own, not a lost permit
                    assert!(
                        attempts < 2000,
                        "{who}: release refused {attempts} times: {e}"
                    );
                    std::thread::sleep(Duration::from_millis(rng.u64(5..20)));
                }
            }
        };
        let _: i64 = redis::cmd("RPUSH")
            .arg(&holds)
            .arg(format!("{from} {to} {n} {who}.{way:?}"))
            .query(&mut conn)
            .unwrap();
    }
}

/// Notes on the observer what thread `who` does or met last (`note:<who>`), for the
/// test's message when work does not resume.
fn note(conn: &mut redis::Connection, who: &str, what: &str) {
    let _: () = redis::cmd("SET")
        .arg(format!("note:{who}"))
        .arg(what)
        .query(conn)
        .unwrap();
}

/// One recorded hold: the interval on the observer's clock and how many permits.
#[derive(Debug, Clone)]
struct Hold {
    from: i64,
    to: i64,
    permits: u32,
    who: String,
}

fn holds(observer: &mut redis::Connection, kind: Kind) -> Vec<Hold> {
    let raw: Vec<String> = redis::cmd("LRANGE")
        .arg(format!("holds:{}", kind.tag()))
        .arg(0)
        .arg(-1)
        .query(observer)
        .unwrap();
    raw.iter()
        .map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            Hold {
                from: f[0].parse().unwrap(),
                to: f[1].parse().unwrap(),
                permits: f[2].parse().unwrap(),
                who: f[3].to_owned(),
            }
        })
        .collect()
}

/// The most permits held at one instant by the holds (half-open intervals `[from,
/// to)`: one that ends when another starts does not overlap it).
fn most_held(holds: &[Hold]) -> u32 {
    let most = fault_run::sweep(
        holds,
        |h| (h.from, h.to),
        |h| i64::from(h.permits),
        |_, _| {},
    );
    most as u32
}

/// What the workers of one kind reported.
#[derive(Debug, Default)]
struct Tally {
    acquired: u64,
    acquire_in_doubt: u64,
    acquire_failed: u64,
    released: u64,
    release_in_doubt: u64,
    release_refused: u64,
    /// Calls in doubt by an error other than a timeout (a connection broken again
    /// when the call was sent again, say).
    doubt_not_timeout: u64,
}

fn tally(observer: &mut redis::Connection, kind: Kind, round: u64) -> Tally {
    let map: std::collections::HashMap<String, u64> = redis::cmd("HGETALL")
        .arg(format!("tally:{}:{round}", kind.tag()))
        .query(observer)
        .unwrap();
    let get = |f: &str| map.get(f).copied().unwrap_or(0);
    Tally {
        acquired: get("acquired"),
        acquire_in_doubt: get("acquire_in_doubt"),
        acquire_failed: get("acquire_failed"),
        released: get("released"),
        release_in_doubt: get("release_in_doubt"),
        release_refused: get("release_refused"),
        doubt_not_timeout: get("doubt_not_timeout"),
    }
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.acquired += o.acquired;
        self.acquire_in_doubt += o.acquire_in_doubt;
        self.acquire_failed += o.acquire_failed;
        self.released += o.released;
        self.release_in_doubt += o.release_in_doubt;
        self.release_refused += o.release_refused;
        self.doubt_not_timeout += o.doubt_not_timeout;
    }
}

/// The faults of this run: every kind but a worker's SIGKILL (a killed holder's
/// permits are gone for good, by the design of a counter without leases).
const FAULTS: [Fault; 6] = [
    Fault::ClientKill,
    Fault::Pause,
    Fault::DebugSleep,
    Fault::Restart,
    Fault::Partition,
    Fault::Reset,
];

/// The counter of `kind` on the data server as the library reads it (the counting
/// semaphore's balance, which may be negative; the `RSemaphore` counter).
fn counter(client: &Client, kind: Kind) -> Result<i64, Error> {
    match kind {
        Kind::Counting => Ok(client
            .counting_semaphore(COUNTING)?
            .balance()?
            .expect("the counting semaphore was set")),
        Kind::Redisson => client.redisson_semaphore(REDISSON).available_permits(),
    }
}

#[test]
fn ownerless_counters_neither_lose_nor_leak_a_permit_whatever_fails() {
    let secs: u64 = std::env::var("REDSEM_FAULT_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let seed: u64 = std::env::var("REDSEM_FAULT_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("counting fault injection: {secs} s, REDSEM_FAULT_SEED={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);

    let mut data = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let observer = RedisServer::start();
    let mut obs = observer.conn();
    // the test's own client: sets the counters up, reads them, and puts back what a
    // round lost (its operation timeout outlasts every pause)
    let own = Client::builder()
        .operation_timeout(Duration::from_secs(3))
        .build(data.url())
        .unwrap();
    assert!(
        own.counting_semaphore(COUNTING)
            .unwrap()
            .try_set_permits(LIMIT)
            .unwrap()
    );
    assert!(
        own.redisson_semaphore(REDISSON)
            .try_set_permits(LIMIT)
            .unwrap()
    );
    let set_phase = |obs: &mut redis::Connection, p: &str| {
        let _: () = redis::cmd("SET").arg("phase").arg(p).query(obs).unwrap();
    };
    set_phase(&mut obs, "run 0");
    let proxies: Vec<Proxy> = (0..WORKERS).map(|_| Proxy::start(data.port())).collect();
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|k| Worker::start(ROLE, k, &proxies[k].url(), &observer.url(), None))
        .collect();

    let held_by = |obs: &mut redis::Connection, kind: Kind| -> usize {
        redis::cmd("LLEN")
            .arg(format!("holds:{}", kind.tag()))
            .query(obs)
            .unwrap()
    };
    // Each kind records new holds (the counters are full again at a round's start).
    // A kind may instead have been drained within the round, before its fault, by
    // calls that ended in doubt: an unplanned stall of the server (an `fsync` of the
    // AOF held up by other work on the machine, say) times acquires out that then take
    // their permits, as the library documents. `Err` names the kinds so drained (the
    // round then ends early); a kind that makes no progress although nothing ended in
    // doubt fails the test.
    let resumed = |obs: &mut redis::Connection, round: u64, report: &[String]| {
        let kinds = [Kind::Counting, Kind::Redisson];
        let before = kinds.map(|k| held_by(obs, k));
        let end = Instant::now() + RESUME;
        loop {
            let now = kinds.map(|k| held_by(obs, k));
            if (0..2).all(|k| now[k] > before[k] + 2) {
                return Ok(());
            }
            if Instant::now() >= end {
                let mut drained = Vec::new();
                for kind in kinds {
                    let k = kind as usize;
                    if now[k] > before[k] + 2 {
                        continue;
                    }
                    let t = tally(obs, kind, round);
                    let available = counter(&own, kind);
                    if t.acquire_in_doubt + t.release_in_doubt > 0
                        && available.as_ref().is_ok_and(|&a| a < i64::from(LIMIT))
                    {
                        drained.push(kind);
                        continue;
                    }
                    for line in report {
                        eprintln!("{line}");
                    }
                    for key in support::keys(obs, "note:*") {
                        let v: String = redis::cmd("GET").arg(&key).query(obs).unwrap();
                        eprintln!("{key}: {v}");
                    }
                    panic!(
                        "{}: work did not resume in round {round} within {RESUME:?}, holds {} \
                         -> {}, counter {available:?}, {t:?} (seed {seed})",
                        kind.tag(),
                        before[k],
                        now[k]
                    );
                }
                return Err(drained);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    };

    let end = Instant::now() + Duration::from_secs(secs);
    // every kind once first, then at random
    let mut schedule: Vec<Fault> = FAULTS.to_vec();
    rng.shuffle(&mut schedule);
    let mut totals = [Tally::default(), Tally::default()];
    let mut report = Vec::new();
    let mut round = 0u64;
    let mut injected = 0usize;
    let mut drained_rounds = 0usize;
    loop {
        let last = Instant::now() >= end && injected >= FAULTS.len();
        let mut fault = (!last).then(|| {
            schedule
                .get(injected)
                .copied()
                .unwrap_or_else(|| FAULTS[rng.usize(..FAULTS.len())])
        });
        if let Err(drained) = resumed(&mut obs, round, &report) {
            eprintln!(
                "round {round}: {drained:?} drained by calls in doubt before its fault; \
                 the round ends early"
            );
            drained_rounds += 1;
            assert!(
                drained_rounds <= 3 + round as usize / 4,
                "most rounds are drained by calls in doubt before their fault: the server \
                 keeps stalling (seed {seed})"
            );
            fault = None;
        }
        injected += usize::from(fault.is_some());
        // the fault, and when it is over (a request held by it runs by then)
        let over = match fault {
            Some(fault) => inject(fault, &mut rng, &mut data, &proxies),
            None => Instant::now(),
        };
        // some work after the fault (it ends in a round of its own otherwise)
        if fault.is_some() {
            std::thread::sleep(Duration::from_millis(rng.u64(100..600)));
        }

        // the round ends: every thread gives back what it holds and goes idle (at the
        // last, the workers exit: each client's drop sends what it still owes)
        if last {
            set_phase(&mut obs, "stop");
            for (k, w) in workers.iter_mut().enumerate() {
                let exited = w.exited_within(Duration::from_secs(30));
                assert_eq!(
                    exited,
                    Some(true),
                    "worker {k} did not stop cleanly (seed {seed})"
                );
            }
        } else {
            set_phase(&mut obs, &format!("hold {round}"));
            wait_until(
                Duration::from_secs(30),
                &format!("every worker thread to go idle after round {round} (seed {seed})"),
                || {
                    redis::cmd("SCARD")
                        .arg(format!("idle:{round}"))
                        .query::<usize>(&mut obs)
                        .unwrap()
                        == WORKERS * THREADS
                },
            );
        }
        // the counters settle: nothing is in flight any more, and nothing changes for
        // a second after the fault is over
        let mut settled = Vec::new();
        for kind in [Kind::Counting, Kind::Redisson] {
            let mut seen = (i64::MIN, Instant::now());
            let value = support::wait_for(
                Duration::from_secs(30),
                &format!("the {} counter to settle (seed {seed})", kind.tag()),
                || {
                    let now = counter(&own, kind).ok()?;
                    if now != seen.0 {
                        seen = (now, Instant::now());
                        return None;
                    }
                    let quiet = Instant::now().saturating_duration_since(seen.1.max(over));
                    (quiet >= SETTLE).then_some(now)
                },
            );
            settled.push((kind, value));
        }

        // what the round may have lost: only what ended in doubt; created: nothing
        for (kind, available) in settled {
            let t = tally(&mut obs, kind, round);
            let doubt = (t.acquire_in_doubt + t.release_in_doubt) as i64;
            let limit = i64::from(LIMIT);
            let what = format!(
                "{} after round {round} ({fault:?}; seed {seed}): counter {available}, \
                 limit {LIMIT}, {t:?}",
                kind.tag()
            );
            report.push(what.clone());
            // the workers' own books: every permit taken was given back or ended in doubt
            assert_eq!(
                t.acquired,
                t.released + t.release_in_doubt,
                "the workers' books do not balance: {what}"
            );
            assert!(
                available <= limit,
                "a permit was created (a release applied twice?): {what}"
            );
            assert!(
                available >= limit - doubt,
                "more permits lost than calls ended in doubt: {what}"
            );
            // a call whose connection was closed or reset under it is sent again on
            // another (with its operation key), so these faults leave nothing in doubt
            // but a timeout (an unplanned stall of the server)
            if matches!(fault, Some(Fault::ClientKill | Fault::Reset)) {
                assert_eq!(
                    t.doubt_not_timeout, 0,
                    "a call ended in doubt by a broken connection: {what}"
                );
            }
            totals[kind as usize].add(&t);
            // the next round starts full again (nobody holds a permit now)
            if available < limit && !last {
                let lost = limit - available;
                match kind {
                    Kind::Counting => own
                        .counting_semaphore(COUNTING)
                        .unwrap()
                        .add_permits(lost)
                        .unwrap(),
                    Kind::Redisson => {
                        own.redisson_semaphore(REDISSON).add_permits(lost).unwrap();
                    }
                }
                assert_eq!(
                    counter(&own, kind).unwrap(),
                    limit,
                    "{} restored",
                    kind.tag()
                );
            }
        }
        if last {
            break;
        }
        round += 1;
        set_phase(&mut obs, &format!("run {round}"));
    }
    drop(workers);

    for line in &report {
        eprintln!("{line}");
    }
    for kind in [Kind::Counting, Kind::Redisson] {
        let all = holds(&mut obs, kind);
        let most = most_held(&all);
        let by_way = |w: Way| {
            let tag = format!(".{w:?}");
            all.iter().filter(|h| h.who.ends_with(&tag)).count()
        };
        eprintln!(
            "{}: {} rounds, {} holds ({} by Try, {} by Wait), at most {most} permits held \
             at once; {:?}",
            kind.tag(),
            round + 1,
            all.len(),
            by_way(Way::Try),
            by_way(Way::Wait),
            totals[kind as usize]
        );
        assert!(
            most <= LIMIT,
            "{}: the workers believed they held {most} permits at once, limit {LIMIT} \
             (seed {seed})",
            kind.tag()
        );
        assert!(
            most >= 2,
            "{}: the holders never overlapped: the test proved nothing (seed {seed})",
            kind.tag()
        );
        for w in [Way::Try, Way::Wait] {
            assert!(
                by_way(w) > 0,
                "{}: no hold by {w:?}: that path was not tried (seed {seed})",
                kind.tag()
            );
        }
    }
}

#[test]
fn the_sweep_adds_up_the_permits_held_at_once() {
    let h = |from, to, permits| Hold {
        from,
        to,
        permits,
        who: "t".into(),
    };
    assert_eq!(most_held(&[h(0, 10, 2), h(5, 15, 1), h(10, 20, 2)]), 3);
    assert_eq!(most_held(&[h(0, 10, 2), h(9, 12, 2), h(9, 11, 1)]), 5);
    assert_eq!(most_held(&[h(0, 10, 2), h(10, 12, 2)]), 2);
}
