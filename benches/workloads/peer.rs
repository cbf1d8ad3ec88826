//! Helper processes: this binary started again with `REDSEM_BENCH_ROLE`, driven by lines
//! on its stdin, answering by lines on its stdout (W2 4 × 4 loops, W3 skew loops, W4
//! holder and waiter, W5 holder).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use redis_semaphore::{Client, Permit};

use crate::R;
use crate::measure::{mono_ns, warm_up};
use crate::w2::w2_child;
use crate::w3::w3_loop;
use crate::w4::w4_semaphore;
use crate::w5::w5_semaphore;

/// A helper process (this binary with `REDSEM_BENCH_ROLE`), driven by lines on its
/// stdin and answering by lines on its stdout. Reads go through a thread so that a hung
/// helper fails the bench instead of hanging it.
pub(crate) struct Peer {
    /// The helper process.
    pub(crate) child: Child,
    /// Where its commands go.
    stdin: ChildStdin,
    /// Its stdout, line by line, from the reading thread.
    lines: mpsc::Receiver<String>,
}

/// Where Debian and others put libfaketime.
const LIBFAKETIME: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
];

impl Peer {
    /// Starts this binary as helper `role` on server `url` with `env` added; `skewed` runs
    /// it under `faketime` 50 ms ahead (wall clock only).
    pub(crate) fn spawn(role: &str, url: &str, env: &[(&str, String)], skewed: bool) -> R<Peer> {
        let exe = std::env::current_exe()?;
        let mut cmd = if skewed {
            // libfaketime preloaded directly where it is found: the `faketime` wrapper
            // keeps files in /dev/shm per process, which killed processes leave behind,
            // and a later wrapper with a reused pid then fails to start its program
            let lib = LIBFAKETIME
                .iter()
                .find(|l| std::path::Path::new(l).exists());
            let mut c = match lib {
                Some(lib) => {
                    let mut c = Command::new(&exe);
                    c.env("LD_PRELOAD", lib).env("FAKETIME", "+0.05");
                    c
                }
                None => {
                    let mut c = Command::new("faketime");
                    c.args(["-f", "+0.05"]).arg(&exe);
                    c
                }
            };
            c.env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
            c
        } else {
            Command::new(&exe)
        };
        cmd.env("REDSEM_BENCH_ROLE", role)
            .env("REDSEM_BENCH_URL", url)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn()?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Peer {
            child,
            stdin,
            lines,
        })
    }

    /// Sends one line to the helper's stdin.
    pub(crate) fn send(&mut self, line: &str) -> R<()> {
        writeln!(self.stdin, "{line}")?;
        self.stdin.flush()?;
        Ok(())
    }

    /// The next line the helper printed, waiting at most `timeout`.
    pub(crate) fn line(&mut self, timeout: Duration) -> R<String> {
        self.lines
            .recv_timeout(timeout)
            .map_err(|_| format!("helper {} said nothing for {timeout:?}", self.child.id()).into())
    }

    /// The rest of the next line, which must start with `word`.
    pub(crate) fn expect(&mut self, word: &str) -> R<String> {
        let line = self.line(Duration::from_secs(30))?;
        match line.strip_prefix(word) {
            Some(rest) => Ok(rest.trim().to_owned()),
            None => Err(format!("expected {word} from a helper, got {line:?}").into()),
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The part a helper process plays.
pub(crate) fn child_role(role: &str) -> R<()> {
    let url = std::env::var("REDSEM_BENCH_URL")?;
    let client = Client::open(&url)?;
    warm_up(&client, 5)?;
    let mut stdin = std::io::stdin().lock().lines();
    let mut next = move || -> R<String> { Ok(stdin.next().ok_or("stdin closed")??) };
    match role {
        // W2 4 × 4: READY; GO start end → 4 loops of try + release, DONE ok failed cpu_us
        "w2" => w2_child(&client, &mut next)?,
        // W3: 4 loops from START to END (monotonic ns), intervals on stdout
        "w3" => {
            let start: u64 = std::env::var("REDSEM_BENCH_W3_START")?.parse()?;
            let end: u64 = std::env::var("REDSEM_BENCH_W3_END")?.parse()?;
            let sem = client.semaphore("w3_skew50", 5)?;
            // how far this process's wall clock is from the driver's idea of it (its
            // faketime offset, 0 otherwise), for the report
            let wall = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_secs_f64();
            let real: f64 = {
                let mut ts = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                // SAFETY: raw syscall into a timespec we own; libfaketime does not
                // intercept the syscall itself, so this is the real time
                unsafe { libc::syscall(libc::SYS_clock_gettime, libc::CLOCK_REALTIME, &mut ts) };
                ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
            };
            println!("SKEW {:.1}", (wall - real) * 1e3);
            while mono_ns() < start {
                thread::sleep(Duration::from_millis(1));
            }
            let res: Vec<_> = thread::scope(|s| {
                let hs: Vec<_> = (0..4).map(|_| s.spawn(|| w3_loop(&sem, end))).collect();
                hs.into_iter().map(|h| h.join().expect("loop")).collect()
            });
            let mut failed = 0;
            let mut out = String::new();
            for (iv, f) in res {
                failed += f;
                for (a, b) in iv {
                    out.push_str(&format!("I {a} {b}\n"));
                }
            }
            print!("{out}");
            println!("F {failed}");
        }
        // W4 holder: ACQ → acquire, HELD; REL → t_rel, release, RELEASED t_rel t_done
        "w4-holder" => {
            let sem = w4_semaphore(&client)?;
            let mut held: Option<Permit> = None;
            loop {
                match next()?.as_str() {
                    "ACQ" => {
                        held = Some(sem.acquire()?);
                        println!("HELD");
                    }
                    "REL" => {
                        let p = held.take().ok_or("REL without a permit")?;
                        let t = mono_ns();
                        p.release()?;
                        println!("RELEASED {t} {}", mono_ns());
                    }
                    _ => return Ok(()),
                }
            }
        }
        // W4 waiter: WAIT → STARTED, blocking acquire, GOT t_acq; REL → release, DONE
        "w4-waiter" => {
            let sem = w4_semaphore(&client)?;
            let mut held: Option<Permit> = None;
            loop {
                match next()?.as_str() {
                    "WAIT" => {
                        println!("STARTED");
                        let p = sem.acquire()?;
                        let t = mono_ns();
                        held = Some(p);
                        println!("GOT {t}");
                    }
                    "REL" => {
                        held.take().ok_or("REL without a permit")?.release()?;
                        println!("DONE");
                    }
                    _ => return Ok(()),
                }
            }
        }
        // W5 holder: acquire with a 1 s lease, HELD t_h, then wait for SIGKILL
        "w5-holder" => {
            let sem = w5_semaphore(&client)?;
            let p = sem.acquire()?;
            println!("HELD {}", mono_ns());
            let _ = next();
            drop(p);
        }
        other => return Err(format!("unknown role {other}").into()),
    }
    Ok(())
}
