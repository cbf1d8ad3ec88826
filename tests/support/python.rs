//! A Python peer of the interop tests: one script of `tests/python` run with `$PYTHON`
//! (the virtual environment `scripts/test.sh` makes; `python3` otherwise), spoken to a
//! line at a time over its stdin and stdout. Each test adds the commands of its own
//! peer as methods in an `impl PythonPeer` block.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

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
