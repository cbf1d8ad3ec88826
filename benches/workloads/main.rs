//! The benchmark suite of issue #5: the shared workloads of `shared/WORKLOADS.md` (C, W1–W5,
//! W2 both as 1 process × 16 threads and as 4 processes × 4 threads, the "awake" variants)
//! and our own W6 (refresh cost), W7 (1,000 blocked waiters), W8 (memory) and W9 (many
//! semaphores), run against a private `redis-server` this binary starts.
//!
//! ```text
//! cargo bench --bench workloads                 # everything (about 3 minutes)
//! cargo bench --bench workloads -- w1 w4        # only the workloads named
//! REDSEM_BENCH_QUICK=1 cargo bench --bench workloads      # a short run
//! REDSEM_BENCH_SAVE=1  cargo bench --bench workloads      # also docs/bench/*.jsonl, *.svg
//! REDSEM_BENCH_RSS_PAIRS=1000000 cargo bench --bench workloads -- w8
//! REDIS_URL=redis://127.0.0.1:7000/ cargo bench --bench workloads   # a server of yours: FLUSHALLed
//! ```
//!
//! `cargo test --all-targets` builds and runs this file too (`harness = false`); cargo
//! passes `--bench` only under `cargo bench`, so without it we run a smoke version of a
//! few seconds that asserts what must hold whatever the machine's speed (2 round trips per
//! W1 pair, W3 never above the limit, W4 hand-offs across processes complete).
//!
//! Workloads, by the names the filters match (a filter runs every workload whose name
//! starts with it, so `w2` runs `w2` and `w2_4x4`): `c w1 w2 w2_4x4 w3 w3_skew50 w4 w5 w6
//! w7 w8 w9 awake w1_replicas` (the last: W1 with and without
//! `wait_replicas(1, 100 ms)`, a replica attached; `replicas.rs`).
//!
//! Helper processes (W2 4 × 4, W3 skew, W4 holder and waiter, W5 holder) are this binary
//! started again with `REDSEM_BENCH_ROLE` set: `main` plays the role and exits.
//!
//! Files: this one parses the arguments, runs the workloads asked for, prints the summary
//! and saves; `measure.rs` holds what the workloads measure with (clocks, CPU, noise,
//! percentiles, the private server and its `INFO`, warm-up, charts); `peer.rs` the helper
//! processes and their roles; then one file per workload (`ceiling.rs` for C, `w1.rs` to
//! `w9.rs`, `awake.rs`) and `smoke.rs`, the `cargo test` run.
//!
//! How things are measured (the why of each choice is at the code):
//! - latencies: `CLOCK_MONOTONIC` (`clock_gettime`), comparable across processes;
//! - Redis commands: `INFO commandstats` after `CONFIG RESETSTAT`, harness commands excluded,
//!   inner `redis.call`s included (that is what WORKLOADS.md counts);
//! - round trips: top-level `EVALSHA` calls (the library sends nothing else on these paths);
//! - server CPU: `used_cpu_user + used_cpu_sys` of `INFO cpu`;
//! - client CPU: `getrusage(RUSAGE_SELF)`, all threads of this process (the library's
//!   background threads included);
//! - client heap: a counting `#[global_allocator]` (live bytes);
//! - noise ("foreign CPU"): machine busy time from `/proc/stat` minus this process, its
//!   children and our redis-server, in cores.

mod awake;
mod ceiling;
mod measure;
mod peer;
mod replicas;
mod smoke;
mod w1;
mod w2;
mod w3;
mod w4;
mod w5;
mod w6;
mod w7;
mod w8;
mod w9;

use std::collections::BTreeMap;
use std::error::Error as StdError;
use std::io::Write;
use std::path::PathBuf;
use std::thread;
use std::time::Instant;

use serde_json::{Value, json};

use crate::measure::{Server, chart_w2, chart_w4, connect, info, reset};

/// Errors of the bench: anything, with a message; a failed workload stops the run.
type R<T> = Result<T, Box<dyn StdError + Send + Sync>>;

/// How long a run is, chosen from the command line and the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `cargo test`: a few seconds, with assertions.
    Smoke,
    /// `REDSEM_BENCH_QUICK=1 cargo bench`: every workload, shortened.
    Quick,
    /// `cargo bench`: WORKLOADS.md's parameters.
    Full,
}

/// One figure of the summary table.
struct Row {
    /// Workload label (`w1`, `w2_4x4`, ...).
    workload: String,
    /// What was measured.
    figure: String,
    /// The figure, formatted.
    value: String,
    /// The target it is held to, or empty.
    target: String,
    /// Whether the target was met (`None`: no target).
    met: Option<bool>,
}

/// State of one run of the suite.
struct Ctx {
    /// Smoke, quick or full.
    mode: Mode,
    /// The server the workloads run against.
    url: String,
    /// Our redis-server's pid (none with `REDIS_URL`): its CPU is not foreign load.
    redis_pid: Option<u32>,
    /// The driver's own connection (INFO, CONFIG RESETSTAT, FLUSHALL...).
    admin: redis::Connection,
    /// Workload name prefixes from the command line; empty runs everything.
    filters: Vec<String>,
    /// The summary table, in order.
    rows: Vec<Row>,
    /// The JSON lines, in order (saved with `REDSEM_BENCH_SAVE=1`).
    json: Vec<Value>,
    /// C's sequential EVALSHA rate and client CPU per EVALSHA, for W1's comparisons.
    ceiling: BTreeMap<String, f64>,
    /// W2's (threads, successful acquires/s, failed tries/s), for its chart.
    w2_curve: Vec<(u32, f64, f64)>,
    /// W4's hand-off latencies, µs, for its chart.
    w4_latencies_us: Vec<f64>,
    /// The awake variants' busy loops: not foreign load.
    busy_pids: Vec<u32>,
}

impl Ctx {
    /// Whether workload `name` starts with one of the filters (or there are none).
    fn wants(&self, name: &str) -> bool {
        self.filters.is_empty() || self.filters.iter().any(|f| name.starts_with(f.as_str()))
    }

    /// Pick a size by mode: (smoke, quick, full).
    fn size<T>(&self, smoke: T, quick: T, full: T) -> T {
        match self.mode {
            Mode::Smoke => smoke,
            Mode::Quick => quick,
            Mode::Full => full,
        }
    }

    /// Prints a figure and keeps it for the summary table.
    fn row(
        &mut self,
        workload: &str,
        figure: &str,
        value: String,
        target: &str,
        met: Option<bool>,
    ) {
        let mark = match met {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "",
        };
        println!("  {workload:<9} {figure:<44} {value:>22}  {target} {mark}");
        self.rows.push(Row {
            workload: workload.into(),
            figure: figure.into(),
            value,
            target: target.into(),
            met,
        });
    }

    /// Prints a JSON line tagged with `workload` and keeps it for saving.
    fn emit(&mut self, workload: &str, mut v: Value) {
        v["workload"] = json!(workload);
        println!("{v}");
        self.json.push(v);
    }
}

/// Plays a helper role when `REDSEM_BENCH_ROLE` is set; otherwise runs the suite: the
/// full one under `cargo bench` (which passes `--bench`), the smoke one under `cargo test`.
fn main() {
    if let Ok(role) = std::env::var("REDSEM_BENCH_ROLE") {
        if let Err(e) = peer::child_role(&role) {
            eprintln!("bench helper {role}: {e}");
            std::process::exit(1);
        }
        return;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    // cargo bench passes --bench; cargo test passes nothing of the kind
    let bench = args.iter().any(|a| a == "--bench");
    let mode = if !bench {
        Mode::Smoke
    } else if std::env::var("REDSEM_BENCH_QUICK").is_ok_and(|v| v == "1") {
        Mode::Quick
    } else {
        Mode::Full
    };
    let filters = args
        .iter()
        .filter(|a| !a.starts_with('-'))
        .map(|a| a.to_ascii_lowercase())
        .collect();
    if let Err(e) = run(mode, filters) {
        eprintln!("bench failed: {e}");
        std::process::exit(1);
    }
}

/// Starts the server (unless `REDIS_URL`), runs the selected workloads, prints the
/// summary and saves when asked.
fn run(mode: Mode, filters: Vec<String>) -> R<()> {
    let started = Instant::now();
    // The smoke run under `cargo test` never uses REDIS_URL: the suite never touches a
    // server it did not start, and the bench FLUSHALLs the one it uses.
    let given = std::env::var("REDIS_URL")
        .ok()
        .filter(|_| mode != Mode::Smoke);
    let (server, url) = match given {
        Some(url) => {
            eprintln!("using REDIS_URL={url}: its data is flushed before each workload");
            (None, url)
        }
        None => {
            let s = Server::start()?;
            let url = s.url();
            (Some(s), url)
        }
    };
    let mut admin = connect(&url)?;
    let sinfo = info(&mut admin, "server")?;
    let redis_version = sinfo
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    let redis_pid = server.as_ref().map(|s| s.child.id());
    let mut ctx = Ctx {
        mode,
        url,
        redis_pid,
        admin,
        filters,
        rows: Vec::new(),
        json: Vec::new(),
        ceiling: BTreeMap::new(),
        w2_curve: Vec::new(),
        w4_latencies_us: Vec::new(),
        busy_pids: Vec::new(),
    };
    let machine = machine_json(&redis_version, mode);
    println!("redis-semaphore workloads, mode {mode:?}: {machine}");
    ctx.emit("machine", machine);

    if mode == Mode::Smoke {
        return smoke::smoke(&mut ctx);
    }
    type Workload = fn(&mut Ctx) -> R<()>;
    let all: [(&str, Workload); 14] = [
        ("c", |c| ceiling::ceiling(c, "c")),
        ("w1", |c| w1::w1(c, "w1")),
        ("w2", w2::w2),
        ("w2_4x4", w2::w2_4x4),
        ("w3", w3::w3),
        ("w3_skew50", w3::w3_skew),
        ("w4", w4::w4),
        ("w5", w5::w5),
        ("w6", w6::w6),
        ("w7", w7::w7),
        ("w8", w8::w8),
        ("w9", w9::w9),
        ("awake", awake::awake),
        ("w1_replicas", replicas::w1_replicas),
    ];
    for f in &ctx.filters {
        if !all.iter().any(|(name, _)| name.starts_with(f.as_str())) {
            let names: Vec<&str> = all.iter().map(|(name, _)| *name).collect();
            eprintln!(
                "no workload starts with {f:?}; the workloads: {}",
                names.join(" ")
            );
        }
    }
    for (name, f) in all {
        if ctx.wants(name) {
            println!("== {name}");
            reset(&mut ctx.admin)?;
            f(&mut ctx)?;
        }
    }
    print_summary(&ctx);
    if std::env::var("REDSEM_BENCH_SAVE").is_ok_and(|v| v == "1") {
        save(&ctx)?;
    }
    println!("total time {:.1} s", started.elapsed().as_secs_f64());
    drop(server);
    Ok(())
}

/// What the figures were measured on, as the first JSON line.
fn machine_json(redis_version: &str, mode: Mode) -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|s| s.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    json!({
        "nproc": thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu": cpu,
        "redis_version": redis_version,
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "loadavg_at_start": load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        "mode": format!("{mode:?}"),
    })
}

/// Every figure of the run as a Markdown table, ready for BENCHMARKS.md.
fn print_summary(ctx: &Ctx) {
    println!();
    println!("| workload | figure | value | target | |");
    println!("|---|---|---|---|---|");
    for r in &ctx.rows {
        let mark = match r.met {
            Some(true) => "met",
            Some(false) => "**missed**",
            None => "",
        };
        println!(
            "| {} | {} | {} | {} | {} |",
            r.workload, r.figure, r.value, r.target, mark
        );
    }
}

/// Writes `docs/bench/results.jsonl` and the charts (`REDSEM_BENCH_SAVE=1`).
fn save(ctx: &Ctx) -> R<()> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/bench");
    std::fs::create_dir_all(&dir)?;
    let mut f = std::fs::File::create(dir.join("results.jsonl"))?;
    for v in &ctx.json {
        writeln!(f, "{v}")?;
    }
    if !ctx.w2_curve.is_empty() {
        chart_w2(&dir.join("w2_throughput.svg"), &ctx.w2_curve)?;
    }
    if !ctx.w4_latencies_us.is_empty() {
        chart_w4(&dir.join("w4_latency.svg"), &ctx.w4_latencies_us)?;
    }
    println!("saved to {}", dir.display());
    Ok(())
}
