//! W7, many blocked waiters: 1,000 threads of one client queued on one semaphore, the
//! connections they take while queued and during the chain of hand-offs, and its speed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis_semaphore::Client;
use serde_json::json;

use crate::measure::{ServerWork, connect, connections, mark, mono_ns, pct, round, sorted};
use crate::{Ctx, R};

/// W7: 1,000 threads of one client blocked on one semaphore (limit 1, held by another
/// client); connections while queued and during the chain of hand-offs that follows.
pub(crate) fn w7(ctx: &mut Ctx) -> R<()> {
    let n = ctx.size(50, 1000, 1000);
    let holder_client = Client::open(&ctx.url)?;
    let hsem = holder_client.semaphore("w7", 1)?;
    let first = hsem.try_acquire()?.ok_or("W7: semaphore busy")?;
    let baseline = connections(&mut ctx.admin)?;
    let client = Client::open(&ctx.url)?; // default pool: 16 connections
    let pool_size = 16;
    let sem = client.semaphore("w7", 1)?;
    let times = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let mut hs = Vec::new();
    for _ in 0..n {
        let sem = sem.clone();
        let times = Arc::clone(&times);
        hs.push(
            thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || -> R<()> {
                    let p = sem.acquire()?;
                    let a = mono_ns();
                    let b = mono_ns();
                    p.release()?;
                    times.lock().unwrap().push((a, b));
                    Ok(())
                })?,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while hsem.queue_len()? < n as u32 {
        if Instant::now() > deadline {
            return Err(format!("W7: only {} of {n} waiters queued", hsem.queue_len()?).into());
        }
        thread::sleep(Duration::from_millis(20));
    }
    let queued_conns = connections(&mut ctx.admin)? - baseline;
    let before = mark(&mut ctx.admin)?;
    let stop = AtomicBool::new(false);
    let peak = AtomicU64::new(queued_conns as u64);
    let t_rel0 = mono_ns();
    first.release()?;
    let url = ctx.url.clone();
    thread::scope(|s| -> R<()> {
        s.spawn(|| {
            // sample the connection count while the chain of hand-offs runs
            let Ok(mut c) = connect(&url) else { return };
            while !stop.load(Ordering::Relaxed) {
                if let Ok(k) = connections(&mut c) {
                    // minus this sampling connection
                    peak.fetch_max((k - 1).saturating_sub(baseline) as u64, Ordering::Relaxed);
                }
                thread::sleep(Duration::from_millis(10));
            }
        });
        for h in hs {
            h.join().map_err(|_| "W7 waiter panicked")??;
        }
        stop.store(true, Ordering::Relaxed);
        Ok(())
    })?;
    let work = ServerWork::read(&mut ctx.admin)?.since(&before);
    let mut t = times.lock().unwrap().clone();
    t.sort();
    let chain_s = (t.last().map_or(t_rel0, |x| x.1) - t_rel0) as f64 / 1e9;
    let mut lat = vec![(t[0].0 - t_rel0) as f64 / 1e3];
    lat.extend(t.windows(2).map(|w| (w[1].0 as f64 - w[0].1 as f64) / 1e3));
    let lat = sorted(lat);
    let peak = peak.load(Ordering::Relaxed);
    let limit = pool_size + 1;
    ctx.row(
        "w7",
        &format!("connections with {n} waiters queued"),
        queued_conns.to_string(),
        &format!("≤ {limit}"),
        Some(queued_conns <= limit),
    );
    ctx.row(
        "w7",
        "connections, most during the hand-offs",
        peak.to_string(),
        &format!("≤ {limit}"),
        Some(peak as usize <= limit),
    );
    ctx.row(
        "w7",
        "hand-off p50 / p99 (ms)",
        format!(
            "{:.3} / {:.3}",
            pct(&lat, 50.0) / 1e3,
            pct(&lat, 99.0) / 1e3
        ),
        "",
        None,
    );
    ctx.row(
        "w7",
        "hand-offs/s through the chain",
        format!("{:.0}", n as f64 / chain_s),
        "",
        None,
    );
    ctx.emit(
        "w7",
        json!({
            "waiters": n, "pool_size": pool_size, "connections_queued": queued_conns, "connections_peak": peak,
            "handoff_p50_ms": round(pct(&lat, 50.0) / 1e3, 4), "handoff_p99_ms": round(pct(&lat, 99.0) / 1e3, 4),
            "handoffs_per_s": round(n as f64 / chain_s, 0),
            "server_commands_per_handoff": round(work.commands() as f64 / n as f64, 2),
            "server_cpu_us_per_handoff": round(work.cpu_s * 1e6 / n as f64, 1),
        }),
    );
    Ok(())
}
