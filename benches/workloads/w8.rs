//! W8, memory: Redis bytes and client heap per held permit with 10,000 holders, and the
//! client's RSS and live heap across many acquire + release pairs (a leak shows there).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Instant;

use redis_semaphore::{Client, Permit};
use serde_json::json;

use crate::measure::{live_heap, round, rss_bytes, warm_up};
use crate::w6::release_many;
use crate::{Ctx, R};

/// `MEMORY USAGE` of the four keys of semaphore `name`: (sum, bytes per key in the order
/// h, i, s, q, encoding of h, encoding of i).
type Usage = (u64, Vec<u64>, String, String);

/// Reads the sizes and encodings of semaphore `name`'s keys.
fn memory_usage(c: &mut redis::Connection, name: &str) -> R<Usage> {
    let mut total = 0;
    let mut each = Vec::new();
    for suffix in ["h", "i", "s", "q"] {
        let bytes: Option<u64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(format!("redsem:{{{name}}}:{suffix}"))
            .arg("SAMPLES")
            .arg(0)
            .query(c)?;
        total += bytes.unwrap_or(0);
        each.push(bytes.unwrap_or(0));
    }
    let enc = |c: &mut redis::Connection, s: &str| -> String {
        redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(format!("redsem:{{{name}}}:{s}"))
            .query::<Option<String>>(c)
            .ok()
            .flatten()
            .unwrap_or_default()
    };
    let (h, i) = (enc(c, "h"), enc(c, "i"));
    Ok((total, each, h, i))
}

/// W8: Redis bytes and client heap per held permit with 10,000 holders, then RSS and
/// live heap across many pairs.
pub(crate) fn w8(ctx: &mut Ctx) -> R<()> {
    let holders = ctx.size(500, 10_000, 10_000);
    let client = Client::builder().max_connections(4).build(&ctx.url)?;
    warm_up(&client, 50)?;
    let sem = client.semaphore("w8", holders as u32)?;
    // one holder first so the keys exist: the per-permit cost is the growth from there
    let one = sem.try_acquire()?.ok_or("W8: busy")?;
    let (empty_bytes, empty_each, _, _) = memory_usage(&mut ctx.admin, "w8")?;
    let mut held: Vec<Permit> = Vec::with_capacity(holders);
    held.push(one);
    let heap0 = live_heap();
    for _ in 1..holders {
        held.push(sem.try_acquire()?.ok_or("W8: semaphore full")?);
    }
    let heap = (live_heap() - heap0) as f64 / (holders - 1) as f64;
    let inline = std::mem::size_of::<Permit>();
    let (bytes, each, enc_h, enc_i) = memory_usage(&mut ctx.admin, "w8")?;
    let per = bytes as f64 / holders as f64;
    let marginal = (bytes - empty_bytes) as f64 / (holders - 1) as f64;
    release_many(held, 4);
    ctx.row(
        "w8",
        &format!("Redis bytes / held permit ({holders} holders)"),
        format!("{per:.0}"),
        "≤ 200",
        Some(per <= 200.0),
    );
    ctx.row(
        "w8",
        "Redis encodings (holders zset, info hash)",
        format!("{enc_h}, {enc_i}"),
        "",
        None,
    );
    ctx.row(
        "w8",
        "client heap / held permit (B)",
        format!("{heap:.0} + {inline} inline"),
        "≤ 1024",
        Some(heap + inline as f64 <= 1024.0),
    );

    // RSS across many pairs: 4 loops, one client, limit 4 so every try succeeds
    let pairs: u64 = std::env::var("REDSEM_BENCH_RSS_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ctx.size(2_000, 20_000, 100_000));
    let step = (pairs / 10).max(1);
    let rss_sem = client.semaphore("w8:rss", 4)?;
    let done = AtomicU64::new(0);
    let samples = Mutex::new(vec![(0u64, rss_bytes(), live_heap())]);
    let started = Instant::now();
    thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                loop {
                    let k = done.fetch_add(1, Ordering::Relaxed) + 1;
                    if k > pairs {
                        break;
                    }
                    rss_sem
                        .try_acquire()
                        .expect("try")
                        .expect("free")
                        .release()
                        .expect("release");
                    if k.is_multiple_of(step) {
                        samples.lock().unwrap().push((k, rss_bytes(), live_heap()));
                    }
                }
            });
        }
    });
    let secs = started.elapsed().as_secs_f64();
    let samples = samples.into_inner().unwrap();
    // growth after the first tenth (allocator and pool warm-up), the part a leak shows in
    let first = samples.get(1).unwrap_or(&samples[0]);
    let last = samples.last().unwrap_or(first);
    let rss_growth = last.1 as i64 - first.1 as i64;
    let heap_growth = last.2 - first.2;
    ctx.row(
        "w8",
        &format!("client RSS growth over {pairs} pairs (KiB)"),
        format!("{}", rss_growth / 1024),
        "flat (≤ 1024)",
        Some(rss_growth <= 1024 * 1024),
    );
    ctx.row(
        "w8",
        "client live heap growth over them (B)",
        heap_growth.to_string(),
        "flat (≤ 64 KiB)",
        Some(heap_growth <= 64 * 1024),
    );
    ctx.emit(
        "w8",
        json!({
            "holders": holders, "redis_bytes_total": bytes, "redis_bytes_per_permit": round(per, 1),
            "redis_bytes_marginal_per_permit": round(marginal, 1), "redis_bytes_one_holder": empty_bytes,
            "encoding_holders_zset": enc_h,
            "bytes_per_key_h_i_s_q": each, "bytes_per_key_one_holder": empty_each,
            "marginal_bytes_per_permit_h_i": [
                round((each[0] as f64 - empty_each[0] as f64) / (holders - 1) as f64, 1),
                round((each[1] as f64 - empty_each[1] as f64) / (holders - 1) as f64, 1)], "encoding_info_hash": enc_i,
            "client_heap_bytes_per_permit": round(heap, 1), "permit_inline_bytes": inline,
            "rss_pairs": pairs, "rss_pairs_per_s": round(pairs as f64 / secs, 0),
            "rss_samples": samples.iter().map(|(k, r, h)| json!({"pairs": k, "rss_kib": r / 1024, "heap_bytes": h})).collect::<Vec<_>>(),
            "rss_growth_bytes": rss_growth, "heap_growth_bytes": heap_growth,
        }),
    );
    Ok(())
}
