//! A Python peer of the interop tests: one script of `tests/python` run with `$PYTHON`
//! (the virtual environment `scripts/test.sh` makes; `python3` otherwise), spoken to a
//! line at a time over its stdin and stdout. Each test adds the commands of its own
//! peer as methods in an `impl PythonPeer` block.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use redis_semaphore::Error;
use redis_semaphore::compat::book::BookSemaphore;

use super::RedisServer;

/// How long a Python reply may take (interpreter start included).
pub const REPLY: Duration = Duration::from_secs(20);

/// One running peer; killed when dropped.
pub struct PythonPeer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl PythonPeer {
    /// Starts `tests/python/<script>` with `args` and waits for its READY line.
    pub fn start(script: &str, args: &[&str]) -> PythonPeer {
        let script = format!("{}/tests/python/{script}", env!("CARGO_MANIFEST_DIR"));
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let mut child = Command::new(&python)
            .arg(&script)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {python} {script}: {e}"));
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        let mut peer = PythonPeer {
            child,
            stdin,
            lines,
        };
        let ready = peer.line();
        assert_eq!(
            ready, "READY",
            "the Python peer {script} did not start (is redis-py installed? \
             python3 -m pip install -r tests/python/requirements.txt)"
        );
        peer
    }

    /// The next line the peer prints (panics after [`REPLY`] or when it exited).
    pub fn line(&mut self) -> String {
        match self.lines.recv_timeout(REPLY) {
            Ok(l) => l,
            Err(RecvTimeoutError::Timeout) => panic!("no reply from the Python peer in {REPLY:?}"),
            Err(RecvTimeoutError::Disconnected) => {
                panic!("the Python peer exited: {:?}", self.child.wait())
            }
        }
    }

    /// Sends one command line.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// Sends one command line and returns the reply line.
    pub fn cmd(&mut self, line: &str) -> String {
        self.send(line);
        self.line()
    }
}

impl Drop for PythonPeer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a contention run saw.
#[derive(Debug)]
pub struct Contention {
    /// The most holders inside the guarded section at once.
    pub most: i64,
    pub rust_grants: u64,
    pub py_grants: u64,
}

/// Three Rust threads on `sem` and the `peers` (started in their `contend` mode, with
/// `--inside inside`) hammer one semaphore for `run`, each holder raising the Redis
/// counter `inside` on entry and lowering it on exit.
pub fn contend_with_peers(
    server: &RedisServer,
    peers: &mut [PythonPeer],
    sem: &BookSemaphore,
    inside: &'static str,
    run: Duration,
) -> Contention {
    let stop = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicI64::new(0));
    let grants = Arc::new(AtomicU64::new(0));
    for p in peers.iter_mut() {
        p.send("go");
    }
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let (sem, stop, most, grants) = (
                sem.clone(),
                Arc::clone(&stop),
                Arc::clone(&most),
                Arc::clone(&grants),
            );
            let mut conn = server.conn();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Some(p) = sem.try_acquire().unwrap() else {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    };
                    grants.fetch_add(1, Ordering::Relaxed);
                    let now: i64 = redis::cmd("INCR").arg(inside).query(&mut conn).unwrap();
                    most.fetch_max(now, Ordering::Relaxed);
                    // the work the permit guards: holders must overlap
                    std::thread::sleep(Duration::from_millis(1));
                    let _: i64 = redis::cmd("DECR").arg(inside).query(&mut conn).unwrap();
                    // a permit stolen by a racing acquire may be gone already
                    match p.release() {
                        Ok(()) | Err(Error::PermitLost { .. }) => {}
                        Err(e) => panic!("release: {e}"),
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(run); // the length of the load, not a synchronisation
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let (mut py_grants, mut py_most) = (0, 0);
    for p in peers.iter_mut() {
        p.send("stop");
        let line = p.line();
        let mut words = line.split_whitespace();
        assert_eq!(words.next(), Some("RESULT"), "{line}");
        for w in words {
            if let Some(g) = w.strip_prefix("grants=") {
                py_grants += g.parse::<u64>().unwrap();
            } else if let Some(m) = w.strip_prefix("most=") {
                py_most = py_most.max(m.parse::<i64>().unwrap());
            }
        }
    }
    Contention {
        most: most.load(Ordering::Relaxed).max(py_most),
        rust_grants: grants.load(Ordering::Relaxed),
        py_grants,
    }
}
