//! What the fault runs share (`tests/faults.rs`, `tests/redisson_faults.rs`,
//! `tests/counting_faults.rs`): worker processes (the test binary started again in a
//! role), the faults injected into the data server and the proxies in front of it, and
//! the observer's clock that every recorded interval is read on.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{Proxy, RedisServer};

/// The observer's clock (`TIME` of the independent observer server), in ms.
pub fn observer_ms(conn: &mut redis::Connection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(conn).unwrap();
    s * 1000 + us / 1000
}

/// A worker process, SIGKILLed with its process group when dropped (unless it exited
/// by itself).
pub struct Worker(Child);

impl Worker {
    /// Starts this test binary again as worker `k` in `role` (`REDSEM_HELPER`, read by
    /// the binary's `helper` test), with the data server at `url` (`REDSEM_URL`) and
    /// the observer at `observer` (`REDSEM_OBSERVER`), in a process group of its own,
    /// under `faketime` with `skew` when given (the monotonic clock left alone); waits
    /// until it prints `RESULT ready`.
    pub fn start(role: &str, k: usize, url: &str, observer: &str, skew: Option<&str>) -> Worker {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = match skew {
            Some(offset) => super::faketime(offset, &exe),
            None => Command::new(&exe),
        };
        // its own process group, so that Drop kills the worker and not only faketime
        // (which runs it as a child)
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        cmd.args(["helper", "--exact", "--nocapture", "--test-threads=1"])
            .env("REDSEM_HELPER", role)
            .env("REDSEM_URL", url)
            .env("REDSEM_OBSERVER", observer)
            .env("REDSEM_WORKER", k.to_string())
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start worker {k} (faketime {skew:?}): {e}"));
        let out = child.stdout.take().unwrap();
        let mut lines = BufReader::new(out).lines();
        let ready = lines.any(|l| l.is_ok_and(|l| l.contains("RESULT ready")));
        assert!(ready, "worker {k} did not start");
        std::thread::spawn(move || lines.for_each(drop));
        Worker(child)
    }

    /// Waits for the worker to exit by itself; whether it did so with success in time.
    pub fn exited_within(&mut self, d: Duration) -> Option<bool> {
        let end = Instant::now() + d;
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return Some(status.success());
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Worker {
    /// SIGKILL to the worker's whole process group (faketime and the worker under it).
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let group = format!("-{}", self.0.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A fault a run injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL of a worker (the run replaces it: [`inject`] leaves it to the run).
    KillWorker,
    /// `CLIENT KILL` of every normal client connection.
    ClientKill,
    /// `CLIENT PAUSE` of 0.2-1.2 s.
    Pause,
    /// `DEBUG SLEEP` of 0.2-1.2 s.
    DebugSleep,
    /// A crash and restart of the data server that keeps its AOF.
    Restart,
    /// One, two or every worker's proxy drops every byte for 0.3-2 s, then closes its
    /// connections.
    Partition,
    /// A reset of every proxied connection.
    Reset,
}

/// Every kind of fault.
pub const FAULTS: [Fault; 7] = [
    Fault::KillWorker,
    Fault::ClientKill,
    Fault::Pause,
    Fault::DebugSleep,
    Fault::Restart,
    Fault::Partition,
    Fault::Reset,
];

/// Injects `fault` into the data server `data` and the workers' `proxies` (one per
/// worker); returns when its effect is over (a `CLIENT PAUSE` returns at once and ends
/// later). [`Fault::KillWorker`] does nothing here: the run kills and replaces its own
/// workers.
pub fn inject(
    fault: Fault,
    rng: &mut fastrand::Rng,
    data: &mut RedisServer,
    proxies: &[Proxy],
) -> Instant {
    match fault {
        Fault::KillWorker => {}
        Fault::ClientKill => {
            let _: i64 = redis::cmd("CLIENT")
                .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
                .query(&mut data.conn())
                .unwrap();
        }
        Fault::Pause => {
            let ms = rng.u64(200..1200);
            let _: () = redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(ms)
                .arg("ALL")
                .query(&mut data.conn())
                .unwrap();
            return Instant::now() + Duration::from_millis(ms);
        }
        Fault::DebugSleep => {
            let ms = rng.u64(200..1200);
            let _: () = redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg(format!("{:.3}", ms as f64 / 1000.0))
                .query(&mut data.conn())
                .unwrap();
        }
        Fault::Restart => data.restart_keeping_data(),
        Fault::Partition => {
            // one or two workers cut off (the others go on and take the permits the
            // server frees), sometimes all of them
            let ms = rng.u64(300..2000);
            let mut cut: Vec<usize> = (0..proxies.len()).collect();
            rng.shuffle(&mut cut);
            cut.truncate([1, 2, 2, proxies.len()][rng.usize(..4)]);
            for &w in &cut {
                proxies[w].cut();
            }
            // the fault's own length, not a wait for a condition
            std::thread::sleep(Duration::from_millis(ms));
            for &w in &cut {
                proxies[w].heal();
            }
        }
        Fault::Reset => proxies.iter().for_each(Proxy::reset),
    }
    Instant::now()
}

/// Sweeps recorded holds, half-open intervals `[from, to)` on the observer's clock
/// (`span` of each item; one that ends when another starts does not overlap it; an
/// empty one is left out): calls `on_start(inside, k)` as item `k` begins, with the
/// items held at that instant (`k` among them), and returns the largest total `weight`
/// held at one instant.
#[allow(dead_code)] // each fault run uses its part of the support
pub fn sweep<T>(
    items: &[T],
    span: impl Fn(&T) -> (i64, i64),
    weight: impl Fn(&T) -> i64,
    mut on_start: impl FnMut(&[usize], usize),
) -> i64 {
    let mut events: Vec<(i64, i32, usize)> = Vec::new();
    for (k, item) in items.iter().enumerate() {
        let (from, to) = span(item);
        if to > from {
            events.push((from, 1, k));
            events.push((to, -1, k));
        }
    }
    // ends before starts at the same instant
    events.sort_by_key(|&(t, d, k)| (t, d, k));
    let mut inside: Vec<usize> = Vec::new();
    let (mut held, mut most) = (0i64, 0i64);
    for (_, d, k) in events {
        if d == 1 {
            inside.push(k);
            held += weight(&items[k]);
            on_start(&inside, k);
        } else {
            inside.retain(|&i| i != k);
            held -= weight(&items[k]);
        }
        most = most.max(held);
    }
    most
}
