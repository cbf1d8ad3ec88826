//! W1, uncontended latency: acquire + release pairs of one thread on a free semaphore
//! (limit 5): pairs/s and its ratio to the ceiling, latency percentiles, round trips,
//! Redis commands and server and client CPU per pair.

use std::time::{Duration, Instant};

use redis_semaphore::{Client, Semaphore};
use serde_json::json;

use crate::ceiling::{rate, raw_pool, zset_eval};
use crate::measure::{Noise, ServerWork, mark, pct, process_cpu_us, round, sorted, warm_up};
use crate::{Ctx, R};

/// W1 (label "w1") or W1-awake ("w1_awake").
pub(crate) fn w1(ctx: &mut Ctx, label: &str) -> R<()> {
    let client = Client::open(&ctx.url)?;
    let sem = client
        .semaphore_builder("w1")
        .limit(5)
        .lease(Duration::from_secs(10))
        .build()?;
    warm_up(&client, 500)?;
    let pairs = ctx.size(200, 5_000, 20_000);
    let mut acq = Vec::with_capacity(pairs);
    let mut rel = Vec::with_capacity(pairs);
    let before = mark(&mut ctx.admin)?;
    let noise = Noise::start(ctx, &[]);
    let cpu0 = process_cpu_us();
    let start = Instant::now();
    for _ in 0..pairs {
        let t0 = Instant::now();
        let p = sem
            .try_acquire()?
            .ok_or("W1: a try failed with nobody else holding")?;
        let t1 = Instant::now();
        p.release()?;
        let t2 = Instant::now();
        acq.push((t1 - t0).as_secs_f64() * 1e6);
        rel.push((t2 - t1).as_secs_f64() * 1e6);
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = process_cpu_us() - cpu0;
    let foreign = noise.end();
    let work = ServerWork::read(&mut ctx.admin)?.since(&before);
    let acq = sorted(acq);
    let rel = sorted(rel);
    let n = pairs as f64;
    let rate = n / wall;
    let rt = work.scripts() as f64 / n;
    let cmds = work.commands() as f64 / n;
    // The ratio to the ceiling: rounds of the C EVALSHA loop and of W1 pairs taken in
    // turn, the median of the per-round ratios, so that both sides of each ratio see the
    // same foreign load (C run a minute earlier need not have).
    let ceiling_key = if label == "w1" {
        "c_evalsha1"
    } else {
        "c_awake_evalsha1"
    };
    let separate = ctx.ceiling.get(ceiling_key).map(|e| rate / (e / 2.0));
    let ratios = interleaved_ratios(ctx, &sem, ctx.size(0, 4, 5), 2_000)?;
    let (ratio, ceiling_pairs) = if ratios.is_empty() {
        (separate, ctx.ceiling.get(ceiling_key).map(|e| e / 2.0))
    } else {
        let r = sorted(ratios.iter().map(|x| x.0).collect())[ratios.len() / 2];
        let c = sorted(ratios.iter().map(|x| x.1).collect())[ratios.len() / 2];
        (Some(r), Some(c))
    };
    ctx.row(label, "pairs/s", format!("{rate:.0}"), "", None);
    if let Some(r) = ratio {
        // issue #5 asked 0.8 of the ceiling; issue #12 asks 0.9 with the CPUs kept awake
        let target = if label == "w1" { 0.8 } else { 0.9 };
        ctx.row(
            label,
            "pairs/s ÷ ceiling pairs/s (EVALSHA/2, interleaved)",
            format!("{r:.2}"),
            &format!("≥ {target}"),
            Some(r >= target),
        );
    }
    ctx.row(
        label,
        "acquire p50 / p99 (µs)",
        format!("{:.0} / {:.0}", pct(&acq, 50.0), pct(&acq, 99.0)),
        "",
        None,
    );
    ctx.row(
        label,
        "release p50 / p99 (µs)",
        format!("{:.0} / {:.0}", pct(&rel, 50.0), pct(&rel, 99.0)),
        "",
        None,
    );
    ctx.row(
        label,
        "round trips / pair",
        format!("{rt:.2}"),
        "= 2",
        Some(rt <= 2.0 + 1e-9),
    );
    ctx.row(
        label,
        "Redis commands / pair",
        format!("{cmds:.1}"),
        "",
        None,
    );
    ctx.row(
        label,
        "server CPU µs / pair",
        format!("{:.1}", work.cpu_s * 1e6 / n),
        "",
        None,
    );
    ctx.row(
        label,
        "server µs per EVALSHA (of which inner commands)",
        format!(
            "{:.1} ({:.1})",
            work.usec_per_script(),
            work.inner_usec_per_script()
        ),
        "",
        None,
    );
    ctx.row(
        label,
        "client CPU µs / pair (getrusage)",
        format!("{:.1}", cpu / n),
        "",
        None,
    );
    // the same for two raw EVALSHA round trips of C: the rest is the library's own work
    // (ids, permit state, refresher registration, script arguments and replies)
    let c_key = if label == "w1" {
        "c_client_us_per_evalsha"
    } else {
        "c_awake_client_us_per_evalsha"
    };
    let raw2 = ctx.ceiling.get(c_key).map(|x| 2.0 * x);
    if let Some(raw2) = raw2 {
        ctx.row(
            label,
            "… of which beyond 2 raw EVALSHA round trips",
            format!("{:.1}", cpu / n - raw2),
            "",
            None,
        );
    }
    ctx.emit(
        label,
        json!({
            "pairs": pairs, "pairs_per_s": round(rate, 0),
            "ceiling_pairs_per_s": ceiling_pairs.map(|c| round(c, 0)),
            "ratio_to_ceiling": ratio.map(|r| round(r, 3)),
            "ratio_to_separate_c_run": separate.map(|r| round(r, 3)),
            "acquire_p50_us": round(pct(&acq, 50.0), 1), "acquire_p99_us": round(pct(&acq, 99.0), 1),
            "release_p50_us": round(pct(&rel, 50.0), 1), "release_p99_us": round(pct(&rel, 99.0), 1),
            "round_trips_per_pair": round(rt, 3), "redis_commands_per_pair": round(cmds, 2),
            "server_cpu_us_per_pair": round(work.cpu_s * 1e6 / n, 2),
            "server_usec_per_evalsha": round(work.usec_per_script(), 2),
            "server_usec_per_evalsha_inner_commands": round(work.inner_usec_per_script(), 2),
            "client_cpu_us_per_pair": round(cpu / n, 2),
            "client_cpu_us_per_two_raw_evalsha": raw2.map(|x| round(x, 2)),
            "commands": work.cmds_json(), "foreign_cpu": foreign,
        }),
    );
    Ok(())
}

/// `rounds` rounds of (`ops` sequential C EVALSHAs through a pool like the library's,
/// `ops` W1 pairs): (W1 pairs/s ÷ ceiling pairs/s, ceiling pairs/s) per round.
fn interleaved_ratios(
    ctx: &mut Ctx,
    sem: &Semaphore,
    rounds: usize,
    ops: u64,
) -> R<Vec<(f64, f64)>> {
    if rounds == 0 {
        return Ok(Vec::new());
    }
    let pool = raw_pool(&ctx.url, 1)?;
    let (_, eval) = zset_eval(&mut ctx.admin)?;
    rate(&pool, 1, 200, Duration::ZERO, &eval);
    let mut out = Vec::new();
    for _ in 0..rounds {
        let ceiling_pairs = rate(&pool, 1, ops, Duration::ZERO, &eval) / 2.0;
        let t = Instant::now();
        for _ in 0..ops {
            sem.try_acquire()?.ok_or("W1: a try failed")?.release()?;
        }
        let pairs = ops as f64 / t.elapsed().as_secs_f64();
        out.push((pairs / ceiling_pairs, ceiling_pairs));
    }
    Ok(out)
}
