//! W5, lease expiry after a crash: a holder process SIGKILLed 300 ms after its grant (1 s
//! lease) and how soon a waiter of this process gets the permit.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use redis_semaphore::{Client, Semaphore};
use serde_json::json;

use crate::measure::{mono_ns, round, warm_up};
use crate::peer::Peer;
use crate::{Ctx, R};

/// W5's semaphore: limit 1, 1 s lease (auto refresh on: its first tick, at a third of
/// the lease, comes after the kill at 300 ms, so no refresh happens before it).
pub(crate) fn w5_semaphore(client: &Client) -> R<Semaphore> {
    Ok(client
        .semaphore_builder("w5")
        .limit(1)
        .lease(Duration::from_millis(1000))
        .build()?)
}

/// W5: a fresh holder process per trial, SIGKILLed 300 ms after its grant, and a waiter
/// of this process blocked in `acquire()`.
pub(crate) fn w5(ctx: &mut Ctx) -> R<()> {
    let trials = ctx.size(1, 3, 8);
    let client = Client::open(&ctx.url)?;
    warm_up(&client, 5)?;
    let sem = w5_semaphore(&client)?;
    let mut kill_to_acq = Vec::new();
    let mut hold_to_acq = Vec::new();
    for _ in 0..trials {
        let mut holder = Peer::spawn("w5-holder", &ctx.url, &[], false)?;
        let t_h: u64 = holder.expect("HELD")?.parse()?;
        let (tx, rx) = mpsc::channel();
        let s = sem.clone();
        let waiter = thread::spawn(move || {
            let p = s.acquire();
            let t = mono_ns();
            let _ = tx.send(t);
            p.map(|p| p.release())
        });
        let kill_at = t_h + 300_000_000;
        while mono_ns() < kill_at {
            thread::sleep(Duration::from_micros(200));
        }
        let t_kill = mono_ns();
        holder.child.kill()?; // SIGKILL
        holder.child.wait()?;
        let t_w = rx.recv_timeout(Duration::from_secs(10))?;
        waiter.join().map_err(|_| "W5 waiter panicked")???;
        kill_to_acq.push((t_w - t_kill) as f64 / 1e6);
        hold_to_acq.push((t_w - t_h) as f64 / 1e6);
    }
    let (lo, hi) = minmax(&hold_to_acq);
    let (klo, khi) = minmax(&kill_to_acq);
    ctx.row(
        "w5",
        "SIGKILL → next holder (ms, ideal 700)",
        format!("{klo:.1}–{khi:.1}"),
        "",
        None,
    );
    ctx.row(
        "w5",
        "hold → next holder (ms, lease 1000)",
        format!("{lo:.1}–{hi:.1}"),
        "≤ 1020",
        Some(hi <= 1020.0),
    );
    ctx.emit(
        "w5",
        json!({"trials": trials, "kill_to_acquired_ms": kill_to_acq.iter().map(|x| round(*x, 2)).collect::<Vec<_>>(),
               "hold_to_acquired_ms": hold_to_acq.iter().map(|x| round(*x, 2)).collect::<Vec<_>>()}),
    );
    Ok(())
}

/// Lowest and highest value.
fn minmax(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        })
}
