//! W1-replicas: what `SemaphoreBuilder::wait_replicas(1, 100 ms)` costs. W1's uncontended
//! acquire + release pairs on one thread, with and without the option, in alternating
//! rounds against the same primary with one replica attached (started here), so both
//! sides see the same machine.

use std::time::{Duration, Instant};

use redis::IntoConnectionInfo;
use redis_semaphore::{Client, Semaphore};
use serde_json::json;

use crate::measure::{Server, connect, info, pct, round, sorted, warm_up};
use crate::{Ctx, R};

/// The primary's port, from the run's URL.
fn port_of(url: &str) -> R<u16> {
    match url.into_connection_info()?.addr() {
        redis::ConnectionAddr::Tcp(_, port) => Ok(*port),
        other => Err(format!("w1_replicas needs a TCP server, not {other:?}").into()),
    }
}

/// Pairs of `sem` for `pairs` rounds: per-pair acquire latencies (µs) and the wall time.
fn pairs(sem: &Semaphore, pairs: usize) -> R<(Vec<f64>, f64)> {
    let mut acq = Vec::with_capacity(pairs);
    let start = Instant::now();
    for _ in 0..pairs {
        let t0 = Instant::now();
        let p = sem
            .try_acquire()?
            .ok_or("w1_replicas: a try failed with nobody else holding")?;
        acq.push(t0.elapsed().as_secs_f64() * 1e6);
        p.release()?;
    }
    Ok((acq, start.elapsed().as_secs_f64()))
}

/// W1 with and without `wait_replicas(1, 100 ms)`, one replica attached.
pub(crate) fn w1_replicas(ctx: &mut Ctx) -> R<()> {
    let primary = port_of(&ctx.url)?.to_string();
    let replica = Server::start_with(&["--replicaof", "127.0.0.1", &primary])?;
    let mut rc = connect(&replica.url())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !info(&mut rc, "replication")?.contains("master_link_status:up") {
        if Instant::now() > deadline {
            return Err("w1_replicas: the replica did not sync within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let client = Client::open(&ctx.url)?;
    let build = |name: &str, replicas: u32| {
        client
            .semaphore_builder(name)
            .limit(5)
            .wait_replicas(replicas, Duration::from_millis(100))
            .build()
    };
    let plain = build("w1r_plain", 0)?;
    let waited = build("w1r_waited", 1)?;
    warm_up(&client, 200)?;
    let rounds = ctx.size(1, 5, 5);
    let per_round = ctx.size(100, 1_000, 3_000);
    let (mut acq_plain, mut acq_waited) = (Vec::new(), Vec::new());
    let (mut wall_plain, mut wall_waited) = (0.0, 0.0);
    for _ in 0..rounds {
        let (a, w) = pairs(&plain, per_round)?;
        acq_plain.extend(a);
        wall_plain += w;
        let (a, w) = pairs(&waited, per_round)?;
        acq_waited.extend(a);
        wall_waited += w;
    }
    let n = (rounds * per_round) as f64;
    let (rate_plain, rate_waited) = (n / wall_plain, n / wall_waited);
    let (acq_plain, acq_waited) = (sorted(acq_plain), sorted(acq_waited));
    ctx.row(
        "w1_replicas",
        "pairs/s without / with wait_replicas(1, 100 ms)",
        format!("{rate_plain:.0} / {rate_waited:.0}"),
        "",
        None,
    );
    ctx.row(
        "w1_replicas",
        "acquire p50 / p99 (µs) without; with",
        format!(
            "{:.0} / {:.0}; {:.0} / {:.0}",
            pct(&acq_plain, 50.0),
            pct(&acq_plain, 99.0),
            pct(&acq_waited, 50.0),
            pct(&acq_waited, 99.0)
        ),
        "",
        None,
    );
    ctx.emit(
        "w1_replicas",
        json!({
            "pairs_per_s_plain": round(rate_plain, 0),
            "pairs_per_s_wait_replicas": round(rate_waited, 0),
            "acquire_p50_us_plain": round(pct(&acq_plain, 50.0), 1),
            "acquire_p99_us_plain": round(pct(&acq_plain, 99.0), 1),
            "acquire_p50_us_wait_replicas": round(pct(&acq_waited, 50.0), 1),
            "acquire_p99_us_wait_replicas": round(pct(&acq_waited, 99.0), 1),
        }),
    );
    drop(replica);
    Ok(())
}
