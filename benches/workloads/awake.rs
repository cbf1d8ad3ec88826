//! The awake variants of C and W1: the same runs with a `nice -n 19` busy loop per CPU,
//! which keeps the vCPUs out of idle (WORKLOADS.md).

use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::Duration;

use crate::ceiling::ceiling;
use crate::w1::w1;
use crate::{Ctx, R};

/// C (sequential) and W1 again with one `nice -n 19` busy loop per CPU, which keeps the
/// vCPUs out of idle: on this kind of VM waking an idle vCPU dominates a sequential
/// request/response loop (WORKLOADS.md).
pub(crate) fn awake(ctx: &mut Ctx) -> R<()> {
    let cpus = thread::available_parallelism().map_or(2, |n| n.get());
    let mut loops = Vec::new();
    for _ in 0..cpus {
        loops.push(
            Command::new("nice")
                .args(["-n", "19", "sh", "-c", "while :; do :; done"])
                .stdin(Stdio::null())
                .spawn()?,
        );
    }
    ctx.busy_pids = loops.iter().map(Child::id).collect();
    thread::sleep(Duration::from_millis(200));
    let result = ceiling(ctx, "c_awake").and_then(|()| w1(ctx, "w1_awake"));
    ctx.busy_pids.clear();
    for mut l in loops {
        let _ = l.kill();
        let _ = l.wait();
    }
    result
}
