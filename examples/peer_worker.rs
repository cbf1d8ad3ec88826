//! A worker for the peers' harness (`shared/peers`, its `harness/PROTOCOL.md`): puts this
//! library beside npm `redis-semaphore` in one run of the same workloads.
//!
//! ```sh
//! cargo build --release --example peer_worker
//! cd ../shared/peers
//! EXTRA_ARGS="--only w1_awake,w2,w3,w4 --extra-peer R=\"$PWD/../../main/target/release/examples/peer_worker\"" ./run_all.sh
//! ```
//!
//! Modes `w1`, `w2`, `w3` and `interactive` as the protocol says; `--loops L` runs L
//! threads sharing one [`Client`]. A try is [`Semaphore::try_acquire`]: one round trip,
//! no back-off (the library's try has none, so `--retry-ms` only paces the blocking
//! acquire's timer, which the library does not need: it is woken by the release). The
//! library never puts a client clock reading into Redis (leases run on the server's
//! `TIME`), so `--skew-ms` changes nothing and is accepted for the protocol's sake.
//! Only protocol lines go to stdout; diagnostics go to stderr.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis_semaphore::{Client, Permit, Semaphore};

type R<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// `CLOCK_MONOTONIC` in nanoseconds, the harness's clock.
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn sleep_until(t_ns: u64) {
    let now = mono_ns();
    if t_ns > now {
        std::thread::sleep(Duration::from_nanos(t_ns - now));
    }
}

/// The protocol's options, all passed as `--name value`.
struct Args(HashMap<String, String>);

impl Args {
    fn parse() -> R<Args> {
        let mut map = HashMap::new();
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let name = flag
                .strip_prefix("--")
                .ok_or_else(|| format!("unexpected argument {flag:?}"))?;
            let value = it.next().ok_or_else(|| format!("--{name} needs a value"))?;
            map.insert(name.to_owned(), value);
        }
        Ok(Args(map))
    }

    fn get(&self, name: &str) -> R<&str> {
        self.0
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| format!("--{name} is missing").into())
    }

    fn num<T: std::str::FromStr>(&self, name: &str, default: T) -> R<T> {
        match self.0.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("--{name} {v:?} is not a number").into()),
        }
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("peer_worker: {e}");
        std::process::exit(1);
    }
}

fn run() -> R<()> {
    let a = Args::parse()?;
    let host = a.get("host")?;
    if !["127.0.0.1", "localhost", "::1"].contains(&host) {
        return Err(format!("refusing non-loopback host {host}").into());
    }
    let port: u16 = a.num("port", 6399)?;
    let key = a.get("key")?.to_owned();
    let limit: u32 = a.num("limit", 5)?;
    let mode = a.get("mode")?.to_owned();
    let loops: usize = a.num("loops", 1)?;
    let lease = Duration::from_millis(a.num("lease-ms", 10_000)?);
    let warmup: usize = a.num("warmup", 5)?;

    let client = Client::builder()
        .max_connections((loops as u32 + 2).max(4))
        .build(format!("redis://{host}:{port}/"))?;
    let sem = |name: &str| {
        client
            .semaphore_builder(name)
            .limit(limit)
            .lease(lease)
            .build()
    };
    let warm = sem(&format!("{key}:warmup:{}", std::process::id()))?;
    for _ in 0..warmup {
        if let Some(p) = warm.try_acquire()? {
            p.release()?;
        }
    }
    let sem = sem(&key)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "READY")?;
    out.flush()?;
    drop(out);

    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    if mode == "interactive" {
        return interactive(&sem, &mut lines);
    }
    let go = lines.next().ok_or("stdin closed before GO")??;
    let parts: Vec<&str> = go.split_whitespace().collect();
    let (start_ns, end_ns) = match parts.as_slice() {
        ["GO", s, e] => (s.parse::<u64>()?, e.parse::<u64>()?),
        _ => return Err(format!("expected GO, got {go:?}").into()),
    };
    sleep_until(start_ns);
    let line = match mode.as_str() {
        "w1" => w1(&sem, a.num("iterations", 20_000)?)?,
        "w2" => w2(&sem, loops, end_ns)?,
        "w3" => w3(
            &sem,
            loops,
            start_ns,
            end_ns,
            a.num("hold-min-us", 2000)?,
            a.num("hold-max-us", 5000)?,
        )?,
        other => return Err(format!("unknown mode {other:?}").into()),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// N sequential pairs; one script call per acquire and per release.
fn w1(sem: &Semaphore, n: usize) -> R<String> {
    let (mut acq, mut rel) = (vec![0u64; n], vec![0u64; n]);
    let (mut acquired, mut failed, mut round_trips) = (0u64, 0u64, 0u64);
    let begin = mono_ns();
    for k in 0..n {
        let t0 = mono_ns();
        let permit = sem.try_acquire()?;
        let t1 = mono_ns();
        round_trips += 1;
        acq[k] = t1 - t0;
        let Some(p) = permit else {
            failed += 1;
            continue;
        };
        acquired += 1;
        p.release()?;
        round_trips += 1;
        rel[k] = mono_ns() - t1;
    }
    let elapsed = mono_ns() - begin;
    Ok(format!(
        "{{\"acq_ns\":{acq:?},\"rel_ns\":{rel:?},\"acquired\":{acquired},\"failed\":{failed},\"elapsed_ns\":{elapsed},\"round_trips\":{round_trips}}}"
    ))
}

/// L threads: try, and release at once when granted, until `end_ns`.
fn w2(sem: &Semaphore, loops: usize, end_ns: u64) -> R<String> {
    let (ok, fail) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| -> R<()> {
        let workers: Vec<_> = (0..loops)
            .map(|_| {
                s.spawn(|| -> R<()> {
                    while mono_ns() < end_ns {
                        match sem.try_acquire()? {
                            Some(p) => {
                                ok.fetch_add(1, Ordering::Relaxed);
                                p.release()?;
                            }
                            None => {
                                fail.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| "a w2 loop panicked")??;
        }
        Ok(())
    })?;
    Ok(format!(
        "{{\"acquired\":{},\"failed\":{}}}",
        ok.into_inner(),
        fail.into_inner()
    ))
}

/// L threads: try until granted, hold a uniform random time, release.
fn w3(
    sem: &Semaphore,
    loops: usize,
    start_ns: u64,
    end_ns: u64,
    hold_min_us: u64,
    hold_max_us: u64,
) -> R<String> {
    let (ok, fail) = (AtomicU64::new(0), AtomicU64::new(0));
    let intervals = parking_lot::Mutex::new(Vec::new());
    std::thread::scope(|s| -> R<()> {
        let workers: Vec<_> = (0..loops)
            .map(|_| {
                s.spawn(|| -> R<()> {
                    let mut rng = fastrand::Rng::new();
                    while mono_ns() < end_ns {
                        let Some(p): Option<Permit> = sem.try_acquire()? else {
                            fail.fetch_add(1, Ordering::Relaxed);
                            continue;
                        };
                        let t_acq = mono_ns();
                        ok.fetch_add(1, Ordering::Relaxed);
                        let hold = rng.u64(hold_min_us..=hold_max_us.max(hold_min_us));
                        std::thread::sleep(Duration::from_micros(hold));
                        let t_rel = mono_ns();
                        p.release()?;
                        intervals.lock().push((t_acq - start_ns, t_rel - start_ns));
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| "a w3 loop panicked")??;
        }
        Ok(())
    })?;
    let iv: Vec<String> = intervals
        .into_inner()
        .iter()
        .map(|(a, b)| format!("[{a},{b}]"))
        .collect();
    Ok(format!(
        "{{\"acquired\":{},\"failed\":{},\"intervals\":[{}]}}",
        ok.into_inner(),
        fail.into_inner(),
        iv.join(",")
    ))
}

/// W4 and W5: ACQUIRE (blocking, at most 10 s), RELEASE, QUIT.
fn interactive(
    sem: &Semaphore,
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
) -> R<()> {
    let mut held: Option<Permit> = None;
    let say = |line: String| -> R<()> {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}")?;
        out.flush()?;
        Ok(())
    };
    for line in lines {
        let line = line?;
        match line.split_whitespace().next().unwrap_or("") {
            "ACQUIRE" => {
                say(format!("STARTED {}", mono_ns()))?;
                match sem.acquire_timeout(Duration::from_secs(10))? {
                    Some(p) => {
                        say(format!("ACQUIRED {}", mono_ns()))?;
                        held = Some(p);
                    }
                    None => say(format!("TIMEOUT {}", mono_ns()))?,
                }
            }
            "RELEASE" => {
                let t0 = mono_ns();
                if let Some(p) = held.take() {
                    p.release()?;
                }
                let t1 = mono_ns();
                say(format!("RELEASED {t0} {t1}"))?;
            }
            "QUIT" => return Ok(()),
            "" => {}
            other => say(format!("ERROR unknown command {other}"))?,
        }
    }
    Ok(())
}
