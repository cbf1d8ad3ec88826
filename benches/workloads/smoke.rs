//! The smoke run under `cargo test` (no `--bench`): W1, W3 and W4 shortened to a few
//! seconds, asserting what holds on any machine.

use std::time::Instant;

use crate::measure::{reset, round};
use crate::w1::w1;
use crate::w3::{sweep, w3_in_process};
use crate::w4::w4_run;
use crate::{Ctx, R};

/// The `cargo test` run: a few seconds, asserting what holds on any machine.
pub(crate) fn smoke(ctx: &mut Ctx) -> R<()> {
    let t = Instant::now();
    reset(&mut ctx.admin)?;
    w1(ctx, "w1")?;
    let w1 = ctx.json.last().cloned().unwrap_or_default();
    let rt = w1["round_trips_per_pair"].as_f64().unwrap_or(f64::NAN);
    assert!(
        (rt - 2.0).abs() < 1e-9,
        "W1: {rt} round trips per pair, expected 2"
    );

    reset(&mut ctx.admin)?;
    let (iv, _) = w3_in_process(&ctx.url, 8, 1.0)?;
    let s = sweep(&iv, 5);
    println!("  smoke w3: {} holds, at most {} at once", iv.len(), s.max);
    assert!(!iv.is_empty(), "W3: no permit was ever granted");
    assert!(
        s.max <= 5 && s.over_instants == 0,
        "W3 went over the limit: {s:?}"
    );

    reset(&mut ctx.admin)?;
    let r = w4_run(ctx, 3)?;
    println!(
        "  smoke w4: hand-offs (ms) {:?}",
        r.from_call_us
            .iter()
            .map(|x| round(x / 1e3, 3))
            .collect::<Vec<_>>()
    );
    assert_eq!(r.from_call_us.len(), 3);
    assert!(
        r.from_call_us.iter().all(|&x| x > 0.0 && x < 5e6),
        "W4 hand-off out of range"
    );
    assert!(
        r.scripts_per_handoff >= 1.0,
        "W4: the release script was not counted"
    );
    println!("bench smoke passed in {:.1} s", t.elapsed().as_secs_f64());
    Ok(())
}
