//! W3, safety under contention: 16 loops of try, hold 2–5 ms, release on a semaphore of
//! limit 5, and the most holders ever at once; W3-skew50 the same from 4 processes, two
//! of them with their wall clock 50 ms ahead.

use std::process::Command;
use std::thread;
use std::time::Duration;

use redis_semaphore::{Client, Semaphore};
use serde_json::json;

use crate::measure::{Noise, mono_ns, round, warm_up};
use crate::peer::Peer;
use crate::{Ctx, R};

/// What the sweep over recorded holds found.
#[derive(Debug, Default)]
pub(crate) struct Sweep {
    /// Most holders at once.
    pub(crate) max: u32,
    /// Acquisitions that took the count over the limit.
    pub(crate) over_instants: u64,
    /// Time spent over the limit, ns.
    over_ns: u64,
    /// Time spent at or over the limit, ns.
    at_limit_ns: u64,
}

/// Sweeps the (t_acq, t_rel) intervals; a release sorts before an acquisition at the
/// same instant. Every recorded interval lies inside the server-side hold, so an
/// overlap above the limit is a real over-admission.
pub(crate) fn sweep(intervals: &[(u64, u64)], limit: u32) -> Sweep {
    let mut ev: Vec<(u64, i32)> = Vec::with_capacity(intervals.len() * 2);
    for &(a, b) in intervals {
        ev.push((a, 1));
        ev.push((b, -1));
    }
    ev.sort();
    let mut s = Sweep::default();
    let mut cur: i64 = 0;
    let mut last = ev.first().map_or(0, |e| e.0);
    for (t, d) in ev {
        let span = t - last;
        if cur > limit as i64 {
            s.over_ns += span;
        }
        if cur >= limit as i64 {
            s.at_limit_ns += span;
        }
        last = t;
        cur += d as i64;
        if d > 0 && cur > limit as i64 {
            s.over_instants += 1;
        }
        s.max = s.max.max(cur as u32);
    }
    s
}

/// One W3 loop: try, hold 2–5 ms, release, until `end_ns`. Returns (intervals, failed).
pub(crate) fn w3_loop(sem: &Semaphore, end_ns: u64) -> (Vec<(u64, u64)>, u64) {
    let mut out = Vec::new();
    let mut failed = 0;
    let mut rng = fastrand::Rng::new();
    while mono_ns() < end_ns {
        let Some(p) = sem.try_acquire().expect("try_acquire") else {
            failed += 1;
            continue;
        };
        let a = mono_ns();
        thread::sleep(Duration::from_micros(rng.u64(2_000..=5_000)));
        let b = mono_ns();
        p.release().expect("release");
        out.push((a, b));
    }
    (out, failed)
}

/// Rows and JSON of a W3 run from its recorded holds.
fn w3_report(ctx: &mut Ctx, label: &str, iv: &[(u64, u64)], failed: u64, secs: f64, foreign: f64) {
    let s = sweep(iv, 5);
    let wall_ns = secs * 1e9;
    ctx.row(
        label,
        "most holders at once (limit 5)",
        s.max.to_string(),
        "≤ 5",
        Some(s.max <= 5),
    );
    ctx.row(
        label,
        "acquisitions over the limit",
        s.over_instants.to_string(),
        "0",
        Some(s.over_instants == 0),
    );
    ctx.row(
        label,
        "time at ≥ limit (share of run)",
        format!("{:.0} %", 100.0 * s.at_limit_ns as f64 / wall_ns),
        "",
        None,
    );
    ctx.emit(
        label,
        json!({
            "clients": 16, "seconds": secs, "holds": iv.len(), "failed_tries": failed,
            "max_holders": s.max, "instants_over_limit": s.over_instants,
            "ms_over_limit": round(s.over_ns as f64 / 1e6, 3),
            "share_at_limit": round(s.at_limit_ns as f64 / wall_ns, 3), "foreign_cpu": foreign,
        }),
    );
}

/// 16 clients (one `Client` each) in this process.
pub(crate) fn w3_in_process(url: &str, clients: usize, secs: f64) -> R<(Vec<(u64, u64)>, u64)> {
    let sems = (0..clients)
        .map(|_| -> R<Semaphore> {
            let c = Client::open(url)?;
            warm_up(&c, 5)?;
            Ok(c.semaphore("w3", 5)?)
        })
        .collect::<R<Vec<_>>>()?;
    let end = mono_ns() + (secs * 1e9) as u64;
    let results: Vec<_> = thread::scope(|s| {
        let hs: Vec<_> = sems
            .iter()
            .map(|sem| s.spawn(move || w3_loop(sem, end)))
            .collect();
        hs.into_iter().map(|h| h.join().expect("W3 loop")).collect()
    });
    let mut iv = Vec::new();
    let mut failed = 0;
    for (i, f) in results {
        iv.extend(i);
        failed += f;
    }
    Ok((iv, failed))
}

/// W3 without skew: 16 clients in this process.
pub(crate) fn w3(ctx: &mut Ctx) -> R<()> {
    let secs = ctx.size(1.0, 2.0, 8.0);
    let noise = Noise::start(ctx, &[]);
    let (iv, failed) = w3_in_process(&ctx.url, 16, secs)?;
    let foreign = noise.end();
    w3_report(ctx, "w3", &iv, failed, secs, foreign);
    Ok(())
}

/// W3 with clock skew: 4 processes × 4 loops, processes 0 and 1 under `faketime` +50 ms
/// (monotonic clock left alone). Our scripts read only the server's TIME, so skew cannot
/// matter by construction; this run shows it rather than asserting it.
pub(crate) fn w3_skew(ctx: &mut Ctx) -> R<()> {
    let faketime = Command::new("faketime").arg("--help").output().is_ok();
    if !faketime {
        println!("  w3_skew50: faketime not installed; skipped");
        return Ok(());
    }
    let secs = ctx.size(1.0, 2.0, 8.0);
    let start = mono_ns() + 500_000_000;
    let end = start + (secs * 1e9) as u64;
    let mut peers = Vec::new();
    for p in 0..4 {
        let env = [
            ("REDSEM_BENCH_W3_START", start.to_string()),
            ("REDSEM_BENCH_W3_END", end.to_string()),
        ];
        peers.push(Peer::spawn("w3", &ctx.url, &env, p < 2)?);
    }
    let pids: Vec<u32> = peers.iter().map(|p| p.child.id()).collect();
    let noise = Noise::start(ctx, &pids);
    let mut iv = Vec::new();
    let mut failed = 0;
    let mut skews = Vec::new();
    for peer in &mut peers {
        loop {
            let line = peer.line(Duration::from_secs_f64(secs + 30.0))?;
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.as_slice() {
                ["I", a, b] => iv.push((a.parse()?, b.parse()?)),
                ["SKEW", ms] => skews.push(ms.parse::<f64>()?),
                ["F", n] => {
                    failed += n.parse::<u64>()?;
                    break;
                }
                _ => return Err(format!("W3 helper said {line:?}").into()),
            }
        }
    }
    let foreign = noise.end();
    for mut p in peers {
        let _ = p.child.wait();
    }
    println!("  w3_skew50: wall clock minus real time per process (ms): {skews:?}");
    w3_report(ctx, "w3_skew50", &iv, failed, secs, foreign);
    Ok(())
}
