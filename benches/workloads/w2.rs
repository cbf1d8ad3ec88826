//! W2, contended throughput: loops of try-acquire then release at once on one semaphore of
//! limit 5. `w2`: 1 × 16 (one process, 16 threads sharing one `Client`) with its curve
//! over 1–16 threads; `w2_4x4`: 4 helper processes × 4 threads. Successful acquires/s,
//! failed tries/s, server and client CPU per successful acquire.

use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis_semaphore::{Client, Semaphore};
use serde_json::json;

use crate::measure::{
    Noise, ServerWork, mark, mono_ns, proc_cpu_us, process_cpu_us, round, warm_up,
};
use crate::peer::Peer;
use crate::{Ctx, R};

/// npm redis-semaphore 5.8.0's successful acquires/s in W2 with 1 process × 16 loops: the
/// top of the 14.1–18.4k it made over 4 runs (shared/WORKLOADS.md, "The peers' figures").
const NPM_1X16: f64 = 18_400.0;
/// npm redis-semaphore's successful acquires/s with 4 processes × 4 loops: the top of its
/// 8.4–13.0k (same table).
const NPM_4X4: f64 = 13_000.0;
/// Issue #12: W2 1 × 16 makes at least this many times [`NPM_1X16`].
const TIMES_NPM_1X16: f64 = 1.5;
/// Issue #12: W2 4 × 4 makes at least this many times [`NPM_4X4`].
const TIMES_NPM_4X4: f64 = 1.0;
/// Issue #12: server CPU per successful acquire + release at most this, µs.
const MAX_SERVER_CPU_US: f64 = 12.0;
/// Issue #12: client CPU per successful acquire + release at most this, µs.
const MAX_CLIENT_CPU_US: f64 = 15.0;

/// Processes of W2 4 × 4 (the Node peer's second shape).
const PROCESSES: usize = 4;
/// Threads per process of W2 4 × 4.
const THREADS: usize = 4;

/// What one W2 run measured.
#[derive(Clone)]
struct W2Run {
    /// Successful tries (each released at once).
    ok: u64,
    /// Failed tries.
    failed: u64,
    /// Wall time of the run, s.
    secs: f64,
    /// What the server did over the run.
    work: ServerWork,
    /// Client CPU over the run, µs (getrusage, all threads).
    client_cpu_us: f64,
    /// Foreign cores meanwhile.
    foreign: f64,
}

/// One W2 loop: try, release at once on success, until `end`. Returns (successful,
/// failed) tries.
fn tries(sem: &Semaphore, end: Instant) -> (u64, u64) {
    let (mut a, mut f) = (0u64, 0u64);
    while Instant::now() < end {
        match sem.try_acquire().expect("try_acquire") {
            Some(p) => {
                a += 1;
                p.release().expect("release");
            }
            None => f += 1,
        }
    }
    (a, f)
}

/// `threads` loops of try_acquire + release on one semaphore of limit 5, sharing one
/// `Client` (as the Node peer's "1 process × 16 loops"), for `secs`.
fn w2_run(ctx: &mut Ctx, threads: usize, secs: f64) -> R<W2Run> {
    let client = Client::builder().max_connections(16).build(&ctx.url)?;
    let sem = client.semaphore("w2", 5)?;
    warm_up(&client, 16)?;
    let ready = Barrier::new(threads + 1);
    let go = Barrier::new(threads + 1);
    let end = Mutex::new(Instant::now());
    thread::scope(|s| -> R<W2Run> {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    warm_up(&client, 5).expect("warm-up");
                    ready.wait();
                    go.wait();
                    let end = *end.lock().unwrap();
                    tries(&sem, end)
                })
            })
            .collect();
        ready.wait();
        let before = mark(&mut ctx.admin)?;
        let noise = Noise::start(ctx, &[]);
        let cpu0 = process_cpu_us();
        let start = Instant::now();
        *end.lock().unwrap() = start + Duration::from_secs_f64(secs);
        go.wait();
        let (mut ok, mut failed) = (0, 0);
        for w in workers {
            let (a, f) = w.join().map_err(|_| "W2 worker panicked")?;
            ok += a;
            failed += f;
        }
        let elapsed = start.elapsed().as_secs_f64();
        let client_cpu_us = process_cpu_us() - cpu0;
        let foreign = noise.end();
        let work = ServerWork::read(&mut ctx.admin)?.since(&before);
        Ok(W2Run {
            ok,
            failed,
            secs: elapsed,
            work,
            client_cpu_us,
            foreign,
        })
    })
}

/// W2 at 16 threads for WORKLOADS.md's 10 s, then the curve over 1–16 threads: per point
/// successful acquires/s and failed tries/s (the chart), server and client CPU µs per
/// successful acquire.
pub(crate) fn w2(ctx: &mut Ctx) -> R<()> {
    let secs = ctx.size(1.0, 3.0, 10.0);
    let r = w2_run(ctx, 16, secs)?;
    let succ = r.ok as f64 / r.secs;
    let fail = r.failed as f64 / r.secs;
    let per = |x: f64| x / r.ok.max(1) as f64;
    // issue #12's targets: 1.5 × npm redis-semaphore's best 1 × 16 figure, and the CPU
    // per success below
    let target = TIMES_NPM_1X16 * NPM_1X16;
    ctx.row(
        "w2",
        "successful acquires/s (16 threads, limit 5)",
        format!("{succ:.0}"),
        &format!("≥ {target:.0}"),
        Some(succ >= target),
    );
    ctx.row(
        "w2",
        "… ÷ npm redis-semaphore 1 × 16 (18,400/s)",
        format!("{:.2} ×", succ / NPM_1X16),
        &format!("≥ {TIMES_NPM_1X16:.1} ×"),
        Some(succ >= target),
    );
    ctx.row("w2", "failed tries/s", format!("{fail:.0}"), "", None);
    ctx.row(
        "w2",
        "Redis commands / successful acquire",
        format!("{:.1}", per(r.work.commands() as f64)),
        "",
        None,
    );
    ctx.row(
        "w2",
        "round trips / successful acquire",
        format!("{:.2}", per(r.work.scripts() as f64)),
        "",
        None,
    );
    let server_us = per(r.work.cpu_s * 1e6);
    ctx.row(
        "w2",
        "server CPU µs / successful acquire",
        format!("{server_us:.1}"),
        &format!("≤ {MAX_SERVER_CPU_US}"),
        Some(server_us <= MAX_SERVER_CPU_US),
    );
    ctx.row(
        "w2",
        "server µs per EVALSHA (commandstats)",
        format!("{:.1}", r.work.usec_per_script()),
        "",
        None,
    );
    ctx.row(
        "w2",
        "server CPU busy (of 1 core)",
        format!("{:.0} %", 100.0 * r.work.cpu_s / r.secs),
        "",
        None,
    );
    let client_us = per(r.client_cpu_us);
    ctx.row(
        "w2",
        "client CPU µs / successful acquire",
        format!("{client_us:.1}"),
        &format!("≤ {MAX_CLIENT_CPU_US}"),
        Some(client_us <= MAX_CLIENT_CPU_US),
    );
    ctx.emit(
        "w2",
        json!({
            "threads": 16, "seconds": secs, "acquired_per_s": round(succ, 0), "failed_per_s": round(fail, 0),
            "target_per_s": round(target, 0),
            "npm_acquired_per_s": NPM_1X16, "ratio_to_npm": round(succ / NPM_1X16, 3),
            "target_ratio_to_npm": TIMES_NPM_1X16,
            "target_server_cpu_us_per_acquire": MAX_SERVER_CPU_US,
            "target_client_cpu_us_per_acquire": MAX_CLIENT_CPU_US,
            "redis_commands_per_acquire": round(per(r.work.commands() as f64), 2),
            "round_trips_per_acquire": round(per(r.work.scripts() as f64), 3),
            "server_cpu_us_per_acquire": round(per(r.work.cpu_s * 1e6), 2),
            "server_usec_per_evalsha": round(r.work.usec_per_script(), 2),
            "server_cpu_share": round(r.work.cpu_s / r.secs, 3),
            "client_cpu_us_per_acquire": round(per(r.client_cpu_us), 2),
            "commands": r.work.cmds_json(), "foreign_cpu": r.foreign,
        }),
    );
    // throughput and cost per success against clients, for the chart and to see where
    // the CPU per success grows
    let point = ctx.size(0.3, 1.0, 2.0);
    let mut curve = Vec::new();
    let mut points = Vec::new();
    for t in [1usize, 2, 4, 8, 16] {
        let r = if t == 16 {
            r.clone()
        } else {
            w2_run(ctx, t, point)?
        };
        let (s, f) = (r.ok as f64 / r.secs, r.failed as f64 / r.secs);
        let per = |x: f64| x / r.ok.max(1) as f64;
        let (server_us, client_us) = (per(r.work.cpu_s * 1e6), per(r.client_cpu_us));
        println!(
            "  w2 curve: {t:>2} threads: {s:>7.0} acquires/s, {f:>7.0} failed/s, server CPU {:.0} %, \
             per successful acquire: server CPU {server_us:.1} µs, client CPU {client_us:.1} µs",
            100.0 * r.work.cpu_s / r.secs
        );
        curve.push((t as u32, s, f));
        points.push(json!({
            "threads": t, "seconds": round(r.secs, 2),
            "acquired_per_s": round(s, 0), "failed_per_s": round(f, 0),
            "server_cpu_us_per_acquire": round(server_us, 2),
            "client_cpu_us_per_acquire": round(client_us, 2),
            "server_cpu_share": round(r.work.cpu_s / r.secs, 3), "foreign_cpu": r.foreign,
        }));
    }
    ctx.emit("w2_curve", json!({ "points": points }));
    ctx.w2_curve = curve;
    Ok(())
}

/// W2 4 × 4: [`PROCESSES`] helper processes of [`THREADS`] loops each (one `Client` per
/// process, as the Node peer's "4 processes × 4 loops") on one semaphore of limit 5,
/// started together at one monotonic instant for WORKLOADS.md's 10 s.
pub(crate) fn w2_4x4(ctx: &mut Ctx) -> R<()> {
    let secs = ctx.size(1.0, 3.0, 10.0);
    let mut peers = (0..PROCESSES)
        .map(|_| Peer::spawn("w2", &ctx.url, &[], false))
        .collect::<R<Vec<_>>>()?;
    // every helper connected and warmed up before the server's counters are reset
    for p in &mut peers {
        p.expect("READY")?;
    }
    let pids: Vec<u32> = peers.iter().map(|p| p.child.id()).collect();
    let before = mark(&mut ctx.admin)?;
    let noise = Noise::start(ctx, &pids);
    let proc0: Vec<f64> = pids.iter().map(|&p| proc_cpu_us(p)).collect();
    // time for the GO lines to reach the helpers before the start
    let start = mono_ns() + 100_000_000;
    let end = start + (secs * 1e9) as u64;
    for p in &mut peers {
        p.send(&format!("GO {start} {end}"))?;
    }
    let (mut ok, mut failed, mut client_cpu_us) = (0u64, 0u64, 0.0);
    for p in &mut peers {
        let line = p.line(Duration::from_secs_f64(secs + 30.0))?;
        let f: Vec<&str> = line.split_whitespace().collect();
        let ["DONE", a, b, cpu] = f.as_slice() else {
            return Err(format!("W2 4 × 4 helper said {line:?}").into());
        };
        ok += a.parse::<u64>()?;
        failed += b.parse::<u64>()?;
        client_cpu_us += cpu.parse::<f64>()?;
    }
    let foreign = noise.end();
    let work = ServerWork::read(&mut ctx.admin)?.since(&before);
    // the helpers wait for EXIT, so their /proc entries are still there: the whole
    // window from before GO, warm-up excluded, at the kernel's 10 ms tick
    let proc_cpu: f64 = pids
        .iter()
        .zip(&proc0)
        .map(|(&p, c0)| proc_cpu_us(p) - c0)
        .sum();
    for p in &mut peers {
        p.send("EXIT")?;
    }
    for mut p in peers {
        let _ = p.child.wait();
    }
    let succ = ok as f64 / secs;
    let fail = failed as f64 / secs;
    let per = |x: f64| x / ok.max(1) as f64;
    let label = "w2_4x4";
    // issue #12's targets: as many as npm redis-semaphore's best 4 × 4 figure, and the
    // same CPU per success as 1 × 16
    let target = TIMES_NPM_4X4 * NPM_4X4;
    ctx.row(
        label,
        "successful acquires/s (4 × 4 threads, limit 5)",
        format!("{succ:.0}"),
        &format!("≥ {target:.0}"),
        Some(succ >= target),
    );
    ctx.row(
        label,
        "… ÷ npm redis-semaphore 4 × 4 (13,000/s)",
        format!("{:.2} ×", succ / NPM_4X4),
        &format!("≥ {TIMES_NPM_4X4:.1} ×"),
        Some(succ >= target),
    );
    ctx.row(label, "failed tries/s", format!("{fail:.0}"), "", None);
    ctx.row(
        label,
        "Redis commands / successful acquire",
        format!("{:.1}", per(work.commands() as f64)),
        "",
        None,
    );
    ctx.row(
        label,
        "round trips / successful acquire",
        format!("{:.2}", per(work.scripts() as f64)),
        "",
        None,
    );
    let server_us = per(work.cpu_s * 1e6);
    ctx.row(
        label,
        "server CPU µs / successful acquire",
        format!("{server_us:.1}"),
        &format!("≤ {MAX_SERVER_CPU_US}"),
        Some(server_us <= MAX_SERVER_CPU_US),
    );
    ctx.row(
        label,
        "server CPU busy (of 1 core)",
        format!("{:.0} %", 100.0 * work.cpu_s / secs),
        "",
        None,
    );
    let client_us = per(client_cpu_us);
    ctx.row(
        label,
        "client CPU µs / successful acquire (summed)",
        format!("{client_us:.1}"),
        &format!("≤ {MAX_CLIENT_CPU_US}"),
        Some(client_us <= MAX_CLIENT_CPU_US),
    );
    ctx.emit(
        label,
        json!({
            "processes": PROCESSES, "threads_per_process": THREADS, "seconds": secs,
            "acquired_per_s": round(succ, 0), "failed_per_s": round(fail, 0),
            "target_per_s": round(target, 0),
            "npm_acquired_per_s": NPM_4X4, "ratio_to_npm": round(succ / NPM_4X4, 3),
            "target_ratio_to_npm": TIMES_NPM_4X4,
            "target_server_cpu_us_per_acquire": MAX_SERVER_CPU_US,
            "target_client_cpu_us_per_acquire": MAX_CLIENT_CPU_US,
            "redis_commands_per_acquire": round(per(work.commands() as f64), 2),
            "round_trips_per_acquire": round(per(work.scripts() as f64), 3),
            "server_cpu_us_per_acquire": round(per(work.cpu_s * 1e6), 2),
            "server_usec_per_evalsha": round(work.usec_per_script(), 2),
            "server_cpu_share": round(work.cpu_s / secs, 3),
            "client_cpu_us_per_acquire": round(per(client_cpu_us), 2),
            "client_cpu_us_per_acquire_proc_stat": round(per(proc_cpu), 2),
            "commands": work.cmds_json(), "foreign_cpu": foreign,
        }),
    );
    Ok(())
}

/// A W2 4 × 4 helper: [`THREADS`] loops sharing `client`. Prints READY once they are warm;
/// on `GO start end` (monotonic ns) runs them from start to end, then prints
/// `DONE successful failed client_cpu_us` (getrusage of this process over the loops) and
/// returns on the next line (EXIT).
pub(crate) fn w2_child(client: &Client, next: &mut dyn FnMut() -> R<String>) -> R<()> {
    let sem = client.semaphore("w2_4x4", 5)?;
    let ready = Barrier::new(THREADS + 1);
    let go = Barrier::new(THREADS + 1);
    // (start, end), or None when GO was not understood: the loops then stop at once
    let window = Mutex::new(None::<(Instant, Instant)>);
    let at = |ns: u64| Instant::now() + Duration::from_nanos(ns.saturating_sub(mono_ns()));
    let res = thread::scope(|s| -> R<(u64, u64, f64)> {
        let loops: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    warm_up(client, 5).expect("warm-up");
                    ready.wait();
                    go.wait();
                    let Some((start, end)) = *window.lock().unwrap() else {
                        return (0, 0);
                    };
                    thread::sleep(start.saturating_duration_since(Instant::now()));
                    tries(&sem, end)
                })
            })
            .collect();
        ready.wait();
        println!("READY");
        let parsed = next().and_then(|line| -> R<(Instant, Instant)> {
            match line.split_whitespace().collect::<Vec<_>>().as_slice() {
                ["GO", a, b] => Ok((at(a.parse()?), at(b.parse()?))),
                _ => Err(format!("expected GO start end, got {line:?}").into()),
            }
        });
        *window.lock().unwrap() = parsed.as_ref().ok().copied();
        go.wait();
        let (start, _) = parsed?;
        thread::sleep(start.saturating_duration_since(Instant::now()));
        let cpu0 = process_cpu_us();
        let (mut ok, mut failed) = (0, 0);
        for l in loops {
            let (a, f) = l.join().map_err(|_| "W2 loop panicked")?;
            ok += a;
            failed += f;
        }
        Ok((ok, failed, process_cpu_us() - cpu0))
    })?;
    println!("DONE {} {} {:.0}", res.0, res.1, res.2);
    let _ = next();
    Ok(())
}
