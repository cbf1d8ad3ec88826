//! A stream consumer that holds its slot for much longer than its lease.
//!
//! Only one consumer of the "orders" stream may run at a time, on any host: it holds
//! the single permit of semaphore `stream:orders` (limit 1, lease 2 s) for as long as it
//! runs. The client's background thread renews the lease every 2/3 s; nothing in this
//! program does. The consumer stops cleanly when:
//!
//! - the lease is lost (`permit.lost()` fires: Redis lost its data, an operator
//!   force-released the permit, or Redis could not be reached for a whole lease): it
//!   stops at once, since another consumer may already have the slot, and exits with
//!   status 3 so that a supervisor can start it again;
//! - Ctrl-C is pressed, or `--for <seconds>` have passed: it releases the permit so that
//!   a standby consumer takes over at once, and exits with status 0.
//!
//! Every write downstream carries the permit's slot and fencing token. The (simulated)
//! sink keeps the highest token seen per slot and refuses a lower one, so a consumer
//! that stalled past its lease cannot overwrite the work of the one that took over.
//!
//! Redis: `REDIS_URL`, else `redis://127.0.0.1:6379/`.
//!
//! ```text
//! cargo run --example stream_consumer                 # until Ctrl-C
//! cargo run --example stream_consumer -- --for 10     # stops by itself after 10 s
//! ```
//!
//! Start two of them: the second waits as a standby and takes over when the first one
//! stops.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, after, never, select, tick};
use redis_semaphore::{Client, Permit};

/// How often the simulated stream delivers a message.
const MESSAGE_EVERY: Duration = Duration::from_millis(250);
/// How long a standby waits for the permit before it looks at Ctrl-C and the clock again.
const STANDBY_POLL: Duration = Duration::from_millis(500);

fn main() -> ExitCode {
    let run_for = match parse_args() {
        Ok(Args::Run(d)) => d,
        Ok(Args::Help) => {
            println!(
                "the one consumer of stream:orders at a time (semaphore stream:orders, limit 1)"
            );
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprintln!("{msg}");
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());

    let (stop_tx, stop) = crossbeam_channel::bounded::<()>(1);
    if let Err(e) = ctrlc::set_handler(move || {
        let _ = stop_tx.try_send(());
    }) {
        eprintln!("cannot install the Ctrl-C handler: {e}");
        return ExitCode::FAILURE;
    }
    let deadline = match run_for {
        Some(d) => after(d),
        None => never(),
    };

    match run(&url, &stop, &deadline) {
        Ok(Outcome::Stopped) => ExitCode::SUCCESS,
        Ok(Outcome::Lost) => ExitCode::from(3),
        Err(e) => {
            eprintln!("stream consumer failed: {e}");
            ExitCode::FAILURE
        }
    }
}

enum Outcome {
    /// Ctrl-C or `--for`: the permit was given back.
    Stopped,
    /// The lease was lost while consuming.
    Lost,
}

fn run(
    url: &str,
    stop: &Receiver<()>,
    deadline: &Receiver<Instant>,
) -> redis_semaphore::Result<Outcome> {
    let client = Client::open(url)?;
    let sem = client
        .semaphore_builder("stream:orders")
        .limit(1)
        .lease(Duration::from_secs(2))
        .build()?;
    println!(
        "connecting to {}, semaphore {:?}",
        redis_semaphore::redact_url(url),
        sem.name()
    );

    // Wait for the permit, as a standby if another consumer holds it.
    let permit = loop {
        if stop.try_recv().is_ok() || deadline.try_recv().is_ok() {
            println!("stopped before the permit was granted");
            return Ok(Outcome::Stopped);
        }
        if let Some(p) = sem.acquire_timeout(STANDBY_POLL)? {
            break p;
        }
        println!("standby: another consumer holds {:?}", sem.name());
    };
    let start = Instant::now();
    println!(
        "consuming: permit {} holds slot {:?}; fencing token {} goes with every write",
        permit.id(),
        permit.slots(),
        permit.token()
    );

    let messages = simulated_stream();
    let mut sink = FencedSink::default();
    let mut consumed = 0u64;
    let outcome = loop {
        select! {
            recv(permit.lost()) -> reason => {
                let reason = reason.ok().or(permit.lost_reason());
                println!(
                    "lease lost ({}): stopping now, another consumer may hold the slot",
                    reason.map_or("reason unknown".to_string(), |r| r.to_string())
                );
                break Outcome::Lost;
            }
            recv(stop) -> _ => {
                println!("Ctrl-C: stopping");
                break Outcome::Stopped;
            }
            recv(deadline) -> _ => {
                println!("--for time is up: stopping");
                break Outcome::Stopped;
            }
            recv(messages) -> msg => {
                let Ok(msg) = msg else { break Outcome::Stopped };
                match sink.write(&permit, &msg) {
                    Ok(()) => {
                        consumed += 1;
                        println!(
                            "{:>7.2} s  {msg}  (slot {:?}, token {})",
                            start.elapsed().as_secs_f64(),
                            permit.slots(),
                            permit.token()
                        );
                    }
                    Err(refused) => {
                        println!("sink refused {msg}: {refused}; stopping");
                        break Outcome::Lost;
                    }
                }
            }
        }
    };

    let held = start.elapsed();
    println!(
        "consumed {consumed} messages in {:.1} s, {:.1} times the {:?} lease (renewed in the background)",
        held.as_secs_f64(),
        held.as_secs_f64() / sem.lease().as_secs_f64(),
        sem.lease()
    );
    match outcome {
        Outcome::Stopped => match permit.release() {
            Ok(()) => println!("permit released: a standby consumer can take over now"),
            Err(e) => println!("permit release: {e}"),
        },
        // Nothing to give back that is still ours; dropping it tidies up what is left.
        Outcome::Lost => drop(permit),
    }
    Ok(outcome)
}

/// What the command line asks for.
enum Args {
    /// Run, for so long if given.
    Run(Option<Duration>),
    /// Print the usage and stop (`-h`, `--help`).
    Help,
}

/// `--for <seconds>` (fractions allowed), or nothing; `-h`/`--help`.
fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut run_for = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--for" => {
                let v = args.next().ok_or("--for needs a number of seconds")?;
                let secs: f64 = v
                    .parse()
                    .map_err(|_| format!("--for: {v:?} is not a number of seconds"))?;
                run_for = Some(
                    Duration::try_from_secs_f64(secs)
                        .map_err(|_| format!("--for: {v:?} is not a usable duration"))?,
                );
            }
            "-h" | "--help" => return Ok(Args::Help),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Args::Run(run_for))
}

/// The usage line.
const USAGE: &str = "usage: stream_consumer [--for <seconds>]   (Redis at $REDIS_URL, \
                     default redis://127.0.0.1:6379/)";

/// The "orders" stream: a message every [`MESSAGE_EVERY`], numbered from 1.
fn simulated_stream() -> Receiver<String> {
    let (tx, rx) = crossbeam_channel::bounded(16);
    let ticks = tick(MESSAGE_EVERY);
    std::thread::spawn(move || {
        for n in 1u64.. {
            if ticks.recv().is_err() || tx.send(format!("order #{n}")).is_err() {
                return;
            }
        }
    });
    rx
}

/// A downstream store that fences per slot: it keeps the highest token seen for each
/// slot and refuses a write with a lower one. (A real one keeps this next to the data,
/// and checks and writes in one transaction.)
#[derive(Default)]
struct FencedSink {
    highest: HashMap<u32, u64>,
}

impl FencedSink {
    fn write(&mut self, permit: &Permit, _msg: &str) -> Result<(), String> {
        for &slot in permit.slots() {
            let seen = self.highest.entry(slot).or_insert(0);
            if permit.token() < *seen {
                return Err(format!(
                    "slot {slot} already saw token {seen}, above {}",
                    permit.token()
                ));
            }
            *seen = permit.token();
        }
        Ok(())
    }
}
