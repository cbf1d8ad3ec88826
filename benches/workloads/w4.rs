//! W4, blocking hand-off latency: a holder and a waiter in two processes, from the
//! holder's release to the waiter's return from `acquire()`, and the server's work per
//! hand-off.

use std::collections::BTreeMap;
use std::thread;
use std::time::Duration;

use redis_semaphore::{Client, Semaphore};
use serde_json::json;

use crate::measure::{Noise, ServerWork, is_harness, mark, pct, round, sorted};
use crate::peer::Peer;
use crate::{Ctx, R};

/// W4's semaphore: limit 1, WORKLOADS.md's 10 s lease; the same in both helpers.
pub(crate) fn w4_semaphore(client: &Client) -> R<Semaphore> {
    Ok(client
        .semaphore_builder("w4")
        .limit(1)
        .lease(Duration::from_secs(10))
        .build()?)
}

/// What a W4 run measured.
pub(crate) struct W4 {
    /// Hand-off latencies from the holder's release call, µs.
    pub(crate) from_call_us: Vec<f64>,
    /// Hand-off latencies from the holder's release return, µs.
    from_return_us: Vec<f64>,
    /// Server commands per hand-off.
    cmds_per_handoff: f64,
    /// Script calls (round trips) per hand-off.
    pub(crate) scripts_per_handoff: f64,
    /// Server CPU per hand-off, µs.
    cpu_us_per_handoff: f64,
    /// Work commands summed over the recorded hand-offs.
    cmds: BTreeMap<String, u64>,
    /// Foreign cores meanwhile.
    foreign: f64,
}

/// `rounds` hand-offs between a holder and a waiter process, driven step by step over
/// their stdin/stdout; the server's work is read around each hand-off alone.
pub(crate) fn w4_run(ctx: &mut Ctx, rounds: usize) -> R<W4> {
    let mut holder = Peer::spawn("w4-holder", &ctx.url, &[], false)?;
    let mut waiter = Peer::spawn("w4-waiter", &ctx.url, &[], false)?;
    let mut rng = fastrand::Rng::new();
    let mut from_call = Vec::new();
    let mut from_return = Vec::new();
    let mut hand_cmds = BTreeMap::<String, u64>::new();
    let mut cpu_s = 0.0;
    // two rounds first, not recorded: the waiter's first blocking acquire starts its
    // client's listener thread and subscription
    const WARM: usize = 2;
    let pids = [holder.child.id(), waiter.child.id()];
    let mut noise = None;
    for round in 0..rounds + WARM {
        if round == WARM {
            noise = Some(Noise::start(ctx, &pids));
        }
        holder.send("ACQ")?;
        holder.expect("HELD")?;
        waiter.send("WAIT")?;
        waiter.expect("STARTED")?;
        // a random phase, as for the peers, and time for the waiter to queue
        thread::sleep(Duration::from_micros(rng.u64(10_000..=20_000)));
        let before = mark(&mut ctx.admin)?;
        holder.send("REL")?;
        let rel = holder.expect("RELEASED")?;
        let got: u64 = waiter.expect("GOT")?.parse()?;
        // the hand-off is complete: count what the server did for it (release script,
        // serve, PUBLISH, anything the waiter ran after its wake-up)
        let work = ServerWork::read(&mut ctx.admin)?.since(&before);
        let mut it = rel.split_whitespace().map(str::parse::<u64>);
        let t_rel = it.next().ok_or("RELEASED without time")??;
        let t_done = it.next().ok_or("RELEASED without end")??;
        waiter.send("REL")?;
        waiter.expect("DONE")?;
        if round >= WARM {
            from_call.push((got as f64 - t_rel as f64) / 1e3);
            from_return.push((got as f64 - t_done as f64) / 1e3);
            for (k, v) in work.cmds.iter().filter(|(k, _)| !is_harness(k)) {
                *hand_cmds.entry(k.clone()).or_default() += v;
            }
            cpu_s += work.cpu_s;
        }
    }
    let foreign = noise.map_or(0.0, |n| n.end());
    holder.send("EXIT")?;
    waiter.send("EXIT")?;
    let n = rounds as f64;
    let total: u64 = hand_cmds.values().sum();
    let scripts: u64 = ["evalsha", "eval"]
        .iter()
        .map(|k| hand_cmds.get(*k).copied().unwrap_or(0))
        .sum();
    Ok(W4 {
        from_call_us: from_call,
        from_return_us: from_return,
        cmds_per_handoff: total as f64 / n,
        scripts_per_handoff: scripts as f64 / n,
        cpu_us_per_handoff: cpu_s * 1e6 / n,
        cmds: hand_cmds,
        foreign,
    })
}

/// W4 with WORKLOADS.md's 200 hand-offs.
pub(crate) fn w4(ctx: &mut Ctx) -> R<()> {
    let rounds = ctx.size(5, 50, 200);
    let r = w4_run(ctx, rounds)?;
    let call = sorted(r.from_call_us.clone());
    let ret = sorted(r.from_return_us.clone());
    let (p50, p99) = (pct(&call, 50.0), pct(&call, 99.0));
    ctx.row(
        "w4",
        "hand-off p50 (ms, from release call)",
        format!("{:.3}", p50 / 1e3),
        "≤ 0.5",
        Some(p50 <= 500.0),
    );
    ctx.row(
        "w4",
        "hand-off p99 (ms, from release call)",
        format!("{:.3}", p99 / 1e3),
        "≤ 2",
        Some(p99 <= 2000.0),
    );
    ctx.row(
        "w4",
        "hand-off p50 / p99 (ms, from release return)",
        format!(
            "{:.3} / {:.3}",
            pct(&ret, 50.0) / 1e3,
            pct(&ret, 99.0) / 1e3
        ),
        "",
        None,
    );
    ctx.row(
        "w4",
        "server commands / hand-off",
        format!("{:.1}", r.cmds_per_handoff),
        "",
        None,
    );
    ctx.row(
        "w4",
        "round trips (scripts) / hand-off",
        format!("{:.2}", r.scripts_per_handoff),
        "",
        None,
    );
    ctx.emit(
        "w4",
        json!({
            "handoffs": rounds,
            "p50_ms": round(p50 / 1e3, 4), "p99_ms": round(p99 / 1e3, 4),
            "max_ms": round(call.last().copied().unwrap_or(f64::NAN) / 1e3, 4),
            "from_return_p50_ms": round(pct(&ret, 50.0) / 1e3, 4),
            "from_return_p99_ms": round(pct(&ret, 99.0) / 1e3, 4),
            "server_commands_per_handoff": round(r.cmds_per_handoff, 2),
            "scripts_per_handoff": round(r.scripts_per_handoff, 3),
            "server_cpu_us_per_handoff": round(r.cpu_us_per_handoff, 1),
            "commands": r.cmds, "foreign_cpu": r.foreign,
        }),
    );
    ctx.w4_latencies_us = r.from_call_us;
    Ok(())
}
