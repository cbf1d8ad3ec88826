//! W9, many semaphores: Redis bytes and keys per semaphore with one holder, per idle
//! semaphore just released, and how long its keys stay.

use std::time::Duration;

use redis_semaphore::{Client, Semaphore};
use serde_json::json;

use crate::measure::{field, info, round, warm_up};
use crate::{Ctx, R};

/// `used_memory` of the server, in bytes.
fn used_memory(c: &mut redis::Connection) -> R<f64> {
    field(&info(c, "memory")?, "used_memory").ok_or_else(|| "INFO memory: no used_memory".into())
}

/// W9: many semaphores (one per account, the seed's market-API scenario): Redis bytes
/// per semaphore with one holder, then per idle semaphore right after its holder left,
/// and how long its keys stay.
pub(crate) fn w9(ctx: &mut Ctx) -> R<()> {
    let count = ctx.size(200, 10_000, 10_000);
    // a long lease and no renewals: nothing expires or moves while it is measured
    let lease = Duration::from_secs(60);
    let client = Client::builder().max_connections(4).build(&ctx.url)?;
    warm_up(&client, 50)?;
    let sems: Vec<Semaphore> = (0..count)
        .map(|k| {
            client
                .semaphore_builder(&format!("w9:acct:{k}"))
                .limit(5)
                .lease(lease)
                .auto_refresh(false)
                .build()
        })
        .collect::<Result<_, _>>()?;
    let before = used_memory(&mut ctx.admin)?;
    let keys_before = db_keys(&mut ctx.admin)?;
    let mut held = Vec::with_capacity(count);
    for sem in &sems {
        held.push(sem.try_acquire()?.ok_or("W9: busy")?);
    }
    let with_holder = (used_memory(&mut ctx.admin)? - before) / count as f64;
    let keys_each = (db_keys(&mut ctx.admin)? - keys_before) as f64 / count as f64;
    for p in held {
        p.release()?;
    }
    let idle = (used_memory(&mut ctx.admin)? - before) / count as f64;
    let ttl_ms: i64 = redis::cmd("PTTL")
        .arg("redsem:{w9:acct:0}:i")
        .query(&mut ctx.admin)?;
    let ttl = if ttl_ms >= 0 {
        ttl_ms as f64 / 1000.0
    } else {
        0.0
    };
    ctx.row(
        "w9",
        &format!("Redis bytes / semaphore with one holder ({count} semaphores)"),
        format!("{with_holder:.0}"),
        "≤ 300",
        Some(with_holder <= 300.0),
    );
    ctx.row(
        "w9",
        "keys / semaphore",
        format!("{keys_each:.1}"),
        "",
        None,
    );
    ctx.row(
        "w9",
        "Redis bytes / idle semaphore (just released)",
        format!("{idle:.0}"),
        "",
        None,
    );
    ctx.row(
        "w9",
        &format!("idle keys kept for (s, lease {} s)", lease.as_secs()),
        format!("{ttl:.1}"),
        "soon",
        Some(ttl <= 2.0),
    );
    ctx.emit(
        "w9",
        json!({
            "semaphores": count, "lease_s": lease.as_secs(),
            "redis_bytes_per_semaphore_one_holder": round(with_holder, 1),
            "keys_per_semaphore": round(keys_each, 2),
            "redis_bytes_per_idle_semaphore": round(idle, 1),
            "idle_keys_ttl_s": round(ttl, 1),
        }),
    );
    Ok(())
}

/// The number of keys in the server's database 0.
fn db_keys(c: &mut redis::Connection) -> R<u64> {
    Ok(redis::cmd("DBSIZE").query(c)?)
}
