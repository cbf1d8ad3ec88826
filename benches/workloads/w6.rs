//! W6, refresh cost: server and client work per refresher tick for 10 to 10,000 held
//! permits on 1 to 100 semaphores.

use std::thread;
use std::time::Duration;

use redis_semaphore::{Client, Permit, Semaphore};
use serde_json::json;

use crate::measure::{ServerWork, mark, round};
use crate::{Ctx, Mode, R};

/// CPU time, in ns, of this process's refresher threads (`redsem-refresh`), from
/// `/proc/self/task/*/schedstat`: the client side of a tick, without the sleeping
/// driver or anything else of the process, at nanosecond resolution (getrusage and
/// `/proc/*/stat` count in 10 ms jiffies for a single thread).
fn refresher_cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim() == "redsem-refresh")
        })
        .filter_map(|t| {
            let s = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
            s.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// Takes `per_sem` permits of each semaphore with `threads` threads.
fn hold_many(sems: &[Semaphore], per_sem: usize, threads: usize) -> R<Vec<Permit>> {
    let jobs: Vec<(usize, usize)> = (0..sems.len())
        .flat_map(|s| (0..per_sem).map(move |k| (s, k)))
        .collect();
    let chunk = jobs.len().div_ceil(threads).max(1);
    thread::scope(|s| {
        let hs: Vec<_> = jobs
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || -> R<Vec<Permit>> {
                    part.iter()
                        .map(|&(i, _)| {
                            sems[i]
                                .try_acquire()?
                                .ok_or_else(|| "hold_many: semaphore full".into())
                        })
                        .collect()
                })
            })
            .collect();
        let mut all = Vec::with_capacity(jobs.len());
        for h in hs {
            all.extend(h.join().map_err(|_| "hold_many panicked")??);
        }
        Ok(all)
    })
}

/// Gives permits back from several threads (one round trip each).
pub(crate) fn release_many(permits: Vec<Permit>, threads: usize) {
    let mut parts: Vec<Vec<Permit>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, p) in permits.into_iter().enumerate() {
        parts[i % threads].push(p);
    }
    thread::scope(|s| {
        for part in parts {
            s.spawn(move || drop(part));
        }
    });
}

/// W6: refresh cost per tick over the grid of issue #3 (10, 1,000, 10,000 permits on 1,
/// 10, 100 semaphores).
pub(crate) fn w6(ctx: &mut Ctx) -> R<()> {
    let grid: Vec<(usize, usize)> = match ctx.mode {
        Mode::Smoke => vec![(10, 1)],
        Mode::Quick => vec![(10, 1), (10, 10), (1000, 1), (1000, 10), (1000, 100)],
        Mode::Full => vec![
            (10, 1),
            (10, 10),
            (1000, 1),
            (1000, 10),
            (1000, 100),
            (10_000, 1),
            (10_000, 10),
            (10_000, 100),
        ],
    };
    // a short interval gives many ticks in a short window; the cost of one tick does not
    // depend on the interval
    let every = Duration::from_millis(200);
    let window = Duration::from_secs_f64(ctx.size(0.5, 1.0, 2.0));
    // what an idle server spends anyway (its cron at `hz`, our INFO reads) over the
    // same window, subtracted from each point
    let idle_before = mark(&mut ctx.admin)?;
    thread::sleep(window);
    let idle_cpu_s = ServerWork::read(&mut ctx.admin)?.since(&idle_before).cpu_s;
    let mut points = Vec::new();
    for (permits, nsems) in grid {
        redis::cmd("FLUSHALL").exec(&mut ctx.admin)?;
        let client = Client::builder().max_connections(8).build(&ctx.url)?;
        let per = permits / nsems;
        let sems = (0..nsems)
            .map(|k| {
                client
                    .semaphore_builder(&format!("w6:{permits}:{nsems}:{k}"))
                    .limit(per as u32)
                    .lease(Duration::from_secs(3))
                    .refresh_interval(every)
                    .build()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let held = hold_many(&sems, per, 8)?;
        // let the refresher settle into its schedule before measuring
        thread::sleep(every + Duration::from_millis(50));
        let calls0 = client.stats().refresh_calls;
        let before = mark(&mut ctx.admin)?;
        let cpu0 = refresher_cpu_ns();
        thread::sleep(window);
        let cpu = (refresher_cpu_ns() - cpu0) as f64 / 1e3;
        let mut work = ServerWork::read(&mut ctx.admin)?.since(&before);
        work.cpu_s = (work.cpu_s - idle_cpu_s).max(0.0);
        let calls = client.stats().refresh_calls - calls0;
        let ticks = calls as f64 / nsems as f64;
        let t = ticks.max(1e-9);
        // server cost: the time commandstats books to the refresh EVALSHAs, exact at
        // any size; INFO cpu net of the idle window (in the JSON) also holds socket work
        // but drowns in the server's cron for the small cases
        let script_us = work.usec.get("evalsha").copied().unwrap_or(0) as f64;
        let row = format!(
            "{:.2} scripts/sem, {:.0} cmds, {:.0} µs server, {:.0} µs client",
            work.scripts() as f64 / nsems as f64 / t,
            work.commands() as f64 / t,
            script_us / t,
            cpu / t
        );
        ctx.row(
            "w6",
            &format!("per tick: {permits} permits / {nsems} semaphores"),
            row,
            "",
            None,
        );
        points.push(json!({
            "permits": permits, "semaphores": nsems, "ticks": round(ticks, 2),
            "refresh_scripts_per_semaphore_per_tick": round(work.scripts() as f64 / nsems as f64 / t, 3),
            "server_commands_per_tick": round(work.commands() as f64 / t, 1),
            "server_script_us_per_tick": round(script_us / t, 1),
            "server_script_ns_per_permit_per_tick": round(script_us * 1e3 / t / permits as f64, 1),
            "server_cpu_us_per_tick": round(work.cpu_s * 1e6 / t, 1),
            "server_cpu_ns_per_permit_per_tick": round(work.cpu_s * 1e9 / t / permits as f64, 1),
            "client_cpu_us_per_tick": round(cpu / t, 1),
            "client_cpu_ns_per_permit_per_tick": round(cpu * 1e3 / t / permits as f64, 1),
        }));
        release_many(held, 8);
    }
    ctx.emit(
        "w6",
        json!({"refresh_interval_ms": every.as_millis() as u64, "window_s": window.as_secs_f64(),
        "server_idle_cpu_us_per_window": round(idle_cpu_s * 1e6, 0), "points": points}),
    );
    Ok(())
}
