//! C, the ceiling: PING and a trivial `EVALSHA` (one `ZADD` + `ZCARD`) through a pool like
//! the library's, sequential and on 16 threads, and `redis-benchmark`'s own figures when
//! it is installed; what W1 and W2 are measured against.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redis::IntoConnectionInfo;
use serde_json::{Value, json};

use crate::measure::{Noise, ServerWork, process_cpu_us, round, sorted};
use crate::{Ctx, R};

/// The trivial script of WORKLOADS.md's C.
pub(crate) const ZSET_SCRIPT: &str =
    "redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2]) return redis.call('ZCARD', KEYS[1])";

/// Loads [`ZSET_SCRIPT`] and returns its SHA and C's operation: one `EVALSHA` of it.
pub(crate) fn zset_eval(
    admin: &mut redis::Connection,
) -> R<(String, impl Fn(&mut redis::Connection, u64) + Sync + use<>)> {
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(ZSET_SCRIPT)
        .query(admin)?;
    let op_sha = sha.clone();
    Ok((sha, move |c: &mut redis::Connection, i: u64| {
        let _: i64 = redis::cmd("EVALSHA")
            .arg(&op_sha)
            .arg(1)
            .arg("bench:zset")
            .arg(1)
            .arg(format!("m:{}", i % 5))
            .query(c)
            .expect("EVALSHA");
    }))
}

/// A pool of the kind the library uses for its connections: r2d2 over
/// `redis::Connection`, TCP_NODELAY on, no PING on checkout. So C is "one round trip
/// through the same plumbing", not redis-benchmark's C client.
pub(crate) fn raw_pool(url: &str, size: u32) -> R<r2d2::Pool<redis::Client>> {
    let info = url
        .into_connection_info()?
        .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
    let client = redis::Client::open(info)?;
    Ok(r2d2::Pool::builder()
        .max_size(size)
        .test_on_check_out(false)
        .build(client)?)
}

/// Runs `op` on `threads` threads for `dur` (or `n` times when sequential): ops/s.
pub(crate) fn rate(
    pool: &r2d2::Pool<redis::Client>,
    threads: usize,
    n: u64,
    dur: Duration,
    op: &(dyn Fn(&mut redis::Connection, u64) + Sync),
) -> f64 {
    if threads == 1 {
        let t = Instant::now();
        for i in 0..n {
            let mut c = pool.get().expect("checkout");
            op(&mut c, i);
        }
        return n as f64 / t.elapsed().as_secs_f64();
    }
    let total = AtomicU64::new(0);
    let start = Instant::now();
    let end = start + dur;
    thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut i = 0;
                while Instant::now() < end {
                    let mut c = pool.get().expect("checkout");
                    op(&mut c, i);
                    i += 1;
                }
                total.fetch_add(i, Ordering::Relaxed);
            });
        }
    });
    total.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// C (label "c") or C-awake ("c_awake", sequential only).
pub(crate) fn ceiling(ctx: &mut Ctx, label: &str) -> R<()> {
    let pool = raw_pool(&ctx.url, 16)?;
    let ping = |c: &mut redis::Connection, _i: u64| {
        let _: String = redis::cmd("PING").query(c).expect("PING");
    };
    let (sha, eval) = zset_eval(&mut ctx.admin)?;
    // warm the pool's 16 connections and the script cache
    rate(&pool, 16, 0, Duration::from_millis(200), &ping);
    let n = ctx.size(500, 5_000, 20_000);
    let dur = Duration::from_secs_f64(ctx.size(0.2, 1.0, 2.0));
    let noise = Noise::start(ctx, &[]);
    // PING and EVALSHA alternate in three rounds, each figure the median of its rounds,
    // so that a burst of foreign load cannot land on one of them only
    let (mut pings, mut evals) = (Vec::new(), Vec::new());
    // the client's own CPU per EVALSHA round trip: what W1's client CPU per pair is
    // compared with, to tell the library's work from redis-rs and the kernel's
    let mut eval_cpu_us = 0.0;
    for _ in 0..3 {
        pings.push(rate(&pool, 1, n / 3, dur, &ping));
        let cpu0 = process_cpu_us();
        evals.push(rate(&pool, 1, n / 3, dur, &eval));
        eval_cpu_us += process_cpu_us() - cpu0;
    }
    let ping1 = sorted(pings)[1];
    let eval1 = sorted(evals)[1];
    let (ping16, eval16) = if label == "c" {
        (
            Some(rate(&pool, 16, 0, dur, &ping)),
            Some(rate(&pool, 16, 0, dur, &eval)),
        )
    } else {
        (None, None)
    };
    let foreign = noise.end();
    ctx.ceiling.insert(format!("{label}_evalsha1"), eval1);
    let client_us_per_eval = eval_cpu_us / (3 * (n / 3)).max(1) as f64;
    ctx.ceiling
        .insert(format!("{label}_client_us_per_evalsha"), client_us_per_eval);
    ctx.row(
        label,
        "PING, 1 thread (req/s)",
        format!("{ping1:.0}"),
        "",
        None,
    );
    ctx.row(
        label,
        "EVALSHA zset script, 1 thread (req/s)",
        format!("{eval1:.0}"),
        "",
        None,
    );
    if let (Some(p), Some(e)) = (ping16, eval16) {
        ctx.row(
            label,
            "PING, 16 threads (req/s)",
            format!("{p:.0}"),
            "",
            None,
        );
        ctx.row(
            label,
            "EVALSHA zset script, 16 threads (req/s)",
            format!("{e:.0}"),
            "",
            None,
        );
    }
    let script_us = ServerWork::read(&mut ctx.admin)?.usec_per_script();
    ctx.row(
        label,
        "server µs per EVALSHA (commandstats)",
        format!("{script_us:.1}"),
        "",
        None,
    );
    let rb = if ctx.redis_pid.is_some() {
        redis_benchmark(ctx, label, &sha)
    } else {
        None
    };
    ctx.emit(
        label,
        json!({
            "ping_1": round(ping1, 0), "evalsha_1": round(eval1, 0),
            "ping_16": ping16.map(|x| round(x, 0)), "evalsha_16": eval16.map(|x| round(x, 0)),
            "sequential_ops": n, "threaded_seconds": dur.as_secs_f64(),
            "redis_benchmark": rb, "foreign_cpu": foreign,
            "server_usec_per_evalsha": round(script_us, 2),
            "client_cpu_us_per_evalsha": round(client_us_per_eval, 2),
        }),
    );
    Ok(())
}

/// WORKLOADS.md's own C commands, when `redis-benchmark` is installed: the peers'
/// ceiling exactly, next to ours through r2d2.
fn redis_benchmark(ctx: &mut Ctx, label: &str, sha: &str) -> Option<Value> {
    let threaded = label == "c";
    let port = ctx.url.rsplit(':').next()?.trim_end_matches('/').to_owned();
    let n1 = ctx.size(1_000, 10_000, 50_000).to_string();
    let n16 = ctx.size(1_000, 50_000, 200_000).to_string();
    let run = |clients: &str, n: &str, extra: &[&str]| -> Option<f64> {
        let out = Command::new("redis-benchmark")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "--csv",
                "-c",
                clients,
                "-n",
                n,
            ])
            .args(extra)
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        // "name","rps",...: the second field of the last data line
        text.lines()
            .filter(|l| !l.starts_with("\"test\""))
            .filter_map(|l| l.split(',').nth(1)?.trim_matches('"').parse::<f64>().ok())
            .next_back()
    };
    let eval: Vec<&str> = vec![
        "-r",
        "5",
        "EVALSHA",
        sha,
        "1",
        "bench:zset",
        "1",
        "m:__rand_int__",
    ];
    let ping1 = run("1", &n1, &["-t", "ping_mbulk"])?;
    let eval1 = run("1", &n1, &eval)?;
    ctx.row(
        label,
        "redis-benchmark PING_MBULK -c 1 (req/s)",
        format!("{ping1:.0}"),
        "",
        None,
    );
    ctx.row(
        label,
        "redis-benchmark EVALSHA -c 1 (req/s)",
        format!("{eval1:.0}"),
        "",
        None,
    );
    let mut v = json!({"ping_mbulk_1": ping1, "evalsha_1": eval1});
    if threaded {
        let ping16 = run("16", &n16, &["-t", "ping_mbulk"])?;
        let eval16 = run("16", &n16, &eval)?;
        ctx.row(
            label,
            "redis-benchmark PING_MBULK -c 16 (req/s)",
            format!("{ping16:.0}"),
            "",
            None,
        );
        ctx.row(
            label,
            "redis-benchmark EVALSHA -c 16 (req/s)",
            format!("{eval16:.0}"),
            "",
            None,
        );
        v["ping_mbulk_16"] = json!(ping16);
        v["evalsha_16"] = json!(eval16);
    }
    Some(v)
}
