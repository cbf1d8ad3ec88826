//! `redis-semaphore`: see and act on semaphores without writing code. It understands
//! the crate's leased and counting semaphores (keys `redsem:{NAME}:*`), not the
//! Redisson or book layouts of `compat`.
//!
//! ```text
//! redis-semaphore [--url URL] [--user U] [--password P] [--tls-ca F] [--tls-cert F --tls-key F] ...
//! redis-semaphore [--url URL] [--json] status NAME
//! redis-semaphore [--url URL] [--json] list [PATTERN]
//! redis-semaphore [--url URL] set-limit NAME N
//! redis-semaphore [--url URL] release NAME ID
//! redis-semaphore [--url URL] watch NAME [--count N]
//! ```

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use redis_semaphore::{Client, Error, Holder, Semaphore, Status, redact_url};
use serde_json::{Value, json};

/// Inspect and operate redis-semaphore semaphores: the crate's leased and counting
/// ones, not the Redisson or book layouts of its `compat` module.
#[derive(Parser, Debug)]
#[command(
    name = "redis-semaphore",
    version,
    about = "Inspect and operate redis-semaphore semaphores (the crate's leased and \
             counting ones; not the Redisson or book layouts of its compat module)",
    after_help = "Semaphores: the crate's leased (Client::semaphore) and counting \
                  (Client::counting_semaphore) semaphores, whose keys are redsem:{NAME}:*. \
                  The Redisson and book layouts (compat::redisson, compat::book) are not \
                  understood: `list` does not find them and `status` says there is no \
                  such semaphore.\n\n\
                  Exit status: 0 done; 1 `release` found no such holder, or `list` \
                  showed a row with an error; 2 any other error (Redis unreachable, \
                  no such semaphore, bad arguments)."
)]
struct Cli {
    /// Where Redis is: redis://host:port/db, redis://user:password@host:port/db or
    /// redis://:password@host:port/db (a password alone), rediss://... (TLS),
    /// unix:///path/redis.sock, redis+sentinel://h1:26379,h2/SERVICE (a Sentinel
    /// service's primary) or redis+cluster://h1:7000,h2:7001 (Redis Cluster seeds).
    /// Passwords are never printed.
    #[arg(
        long,
        env = "REDIS_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379/",
        global = true
    )]
    url: String,
    /// ACL user name (overrides the URL's).
    // (every `env` argument hides its value in `--help`: clap shows it by default,
    // and a user name may be a password typed in the wrong variable)
    #[arg(long, env = "REDIS_USER", hide_env_values = true, global = true)]
    user: Option<String>,
    /// Password (overrides the URL's); better given in REDIS_PASSWORD than on the
    /// command line.
    // (a value that starts with `-` is the password, not an option that clap would
    // name in its error: quoting the password)
    #[arg(
        long,
        env = "REDIS_PASSWORD",
        hide_env_values = true,
        allow_hyphen_values = true,
        global = true
    )]
    password: Option<String>,
    /// ACL user name for the sentinels of a redis+sentinel:// URL (the URL's own
    /// credentials are the data nodes').
    #[arg(
        long,
        env = "REDIS_SENTINEL_USER",
        hide_env_values = true,
        global = true
    )]
    sentinel_user: Option<String>,
    /// Password for the sentinels of a redis+sentinel:// URL.
    #[arg(
        long,
        env = "REDIS_SENTINEL_PASSWORD",
        hide_env_values = true,
        allow_hyphen_values = true,
        global = true
    )]
    sentinel_password: Option<String>,
    /// PEM file of the CA that signed the server's certificate (rediss:// URLs).
    #[arg(long, value_name = "FILE", global = true)]
    tls_ca: Option<std::path::PathBuf>,
    /// PEM client certificate for mutual TLS (with --tls-key).
    #[arg(long, value_name = "FILE", requires = "tls_key", global = true)]
    tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert", global = true)]
    tls_key: Option<std::path::PathBuf>,
    /// Print JSON instead of text, for scripts.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Limit, permits held and free, queue length, and every holder.
    Status {
        /// The semaphore's name.
        name: String,
    },
    /// The semaphores that have keys in Redis, found with SCAN.
    List {
        /// A glob on the names.
        #[arg(default_value = "*")]
        pattern: String,
    },
    /// Store a limit that every client of the semaphore obeys (leased semaphores
    /// only: a counting semaphore has no limit).
    SetLimit {
        /// The semaphore's name.
        name: String,
        /// The new limit (1 to 10000, the library's MAX_LIMIT).
        #[arg(value_parser = clap::value_parser!(u32).range(1..=i64::from(redis_semaphore::MAX_LIMIT)))]
        limit: u32,
    },
    /// Release a holder's permit, whoever holds it.
    Release {
        /// The semaphore's name.
        name: String,
        /// The permit id (from `status`).
        id: String,
    },
    /// Redraw the status every second until Ctrl-C (fails as `status` does on a name
    /// without keys).
    Watch {
        /// The semaphore's name.
        name: String,
        /// Stop after this many screens, at least one (default: never).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(code) => code,
        Err(e) => {
            // an error may quote what another program wrote in Redis (a holder's id,
            // a value): no terminal escapes reach the terminal
            eprintln!("redis-semaphore: {}", clean(&e));
            ExitCode::from(2)
        }
    }
}

/// `println!` on stdout, failing `run` (exit status 2, with the reason) when the
/// output cannot be written: a closed pipe (`watch NAME | head -1`) or a full disk,
/// where `println!` panics (exit status 101).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*)
            .map_err(|e| format!("cannot write the output: {e}"))?
    }};
}

/// `print!` as [`outln!`] does `println!`.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout(), $($arg)*)
            .map_err(|e| format!("cannot write the output: {e}"))?
    }};
}

fn run(cli: &Cli) -> Result<ExitCode, String> {
    // the URL as every message shows it: without its password
    let url = redact_url(&cli.url);
    let mut builder = Client::builder()
        .max_connections(2)
        .connect_timeout(Duration::from_secs(2))
        .checkout_timeout(Duration::from_secs(3));
    if let Some(user) = &cli.user {
        builder = builder.username(user);
    }
    if let Some(password) = &cli.password {
        builder = builder.password(password);
    }
    if let Some(ca) = &cli.tls_ca {
        builder = builder.tls_ca_file(ca);
    }
    if let Some(user) = &cli.sentinel_user {
        builder = builder.sentinel_username(user);
    }
    if let Some(password) = &cli.sentinel_password {
        builder = builder.sentinel_password(password);
    }
    if let (Some(cert), Some(key)) = (&cli.tls_cert, &cli.tls_key) {
        builder = builder.tls_client_cert(cert, key);
    }
    let client = builder.build(&cli.url).map_err(|e| e.to_string())?;
    let reach = |e: Error| match e {
        Error::Pool(_)
        | Error::Redis(_)
        | Error::Call { .. }
        | Error::Timeout { .. }
        | Error::Connect { .. }
        | Error::Auth { .. } => {
            format!("cannot talk to Redis at {url}: {e}")
        }
        other => other.to_string(),
    };
    let open = |name: &str| client.semaphore(name, 1).map_err(|e| e.to_string());
    match &cli.command {
        Command::Status { name } => {
            let (json, text) = report(&client, &open(name)?, name, &url, &reach, false)?;
            if cli.json {
                outln!("{json}");
            } else {
                out!("{text}");
            }
        }
        Command::List { pattern } => {
            let leased = client.list_semaphores(pattern).map_err(reach)?;
            let counting = client.list_counting_semaphores(pattern).map_err(reach)?;
            // one row per semaphore; a semaphore that cannot be read is a row with its
            // error, and the others are still shown
            let mut rows: Vec<Row> = Vec::new();
            for name in &leased {
                rows.push(Row {
                    name: name.clone(),
                    kind: "leased",
                    read: client
                        .semaphore(name, 1)
                        .and_then(|s| s.status())
                        .map(|s| (s.held as i64, limit_of(&s).map(i64::from), s.queued))
                        .map_err(|e| e.to_string()),
                });
            }
            for name in &counting {
                let read = client
                    .counting_semaphore(name)
                    .and_then(|c| Ok((c.balance()?.unwrap_or(0), c.queue_len()?)))
                    .map(|(count, queued)| (count, None, queued))
                    .map_err(|e| e.to_string());
                rows.push(Row {
                    name: name.clone(),
                    kind: "counting",
                    read,
                });
            }
            rows.sort_by(|a, b| a.name.cmp(&b.name).then(a.kind.cmp(b.kind)));
            let failed = rows.iter().any(|r| r.read.is_err());
            if cli.json {
                let list: Vec<Value> = rows
                    .iter()
                    .map(|r| match &r.read {
                        Ok((held, limit, queued)) if r.kind == "leased" => json!({
                            "name": r.name, "kind": r.kind, "limit": limit, "held": held,
                            "queued": queued,
                        }),
                        Ok((count, _, queued)) => json!({
                            "name": r.name, "kind": r.kind, "count": count, "queued": queued,
                        }),
                        Err(e) => json!({"name": r.name, "kind": r.kind, "error": e}),
                    })
                    .collect();
                outln!("{}", Value::Array(list));
            } else if rows.is_empty() {
                outln!("no semaphores match {:?}", clean(pattern));
            } else {
                outln!(
                    "{:<40} {:<8} {:>6} {:>6} {:>6}",
                    "NAME",
                    "KIND",
                    "HELD",
                    "LIMIT",
                    "QUEUED"
                );
                for r in &rows {
                    let name = clean(&r.name);
                    match &r.read {
                        Ok((held, limit, queued)) if r.kind == "leased" => outln!(
                            "{name:<40} {:<8} {held:>6} {:>6} {queued:>6}",
                            r.kind,
                            limit.map_or_else(|| "?".into(), |l| l.to_string()),
                        ),
                        // a counting semaphore: its count, no limit
                        Ok((count, _, queued)) => outln!(
                            "{name:<40} {:<8} {:>6} {:>6} {queued:>6}",
                            r.kind,
                            format!("={count}"),
                            "-",
                        ),
                        Err(e) => outln!("{name:<40} {:<8} error: {}", r.kind, clean(e)),
                    }
                }
            }
            if failed {
                return Ok(ExitCode::from(1));
            }
        }
        Command::SetLimit { name, limit } => {
            let sem = open(name)?;
            if !sem.status().map_err(reach)?.exists {
                // a counting semaphore has no limit: storing one would make a second,
                // leased semaphore of the same name, which `status` would show instead
                let counting = client.counting_semaphore(name).map_err(|e| e.to_string())?;
                if let Some(count) = counting.balance().map_err(reach)? {
                    return Err(format!(
                        "{:?} at {url} is a counting semaphore (count {count}), which has no \
                         limit: set-limit is for leased semaphores (its count changes with \
                         CountingSemaphore::add_permits and reduce_permits)",
                        clean(name)
                    ));
                }
                // stored all the same: it is how a limit is set before the first acquire
                eprintln!(
                    "redis-semaphore: note: no semaphore {:?} at {url} yet (it has no keys in \
                     Redis); the limit is stored for its first use and kept for at least a day",
                    clean(name)
                );
            }
            sem.set_limit(*limit).map_err(reach)?;
            if cli.json {
                outln!("{}", json!({"name": name, "limit": limit}));
            } else {
                outln!("limit of {} set to {limit}", clean(name));
            }
        }
        Command::Release { name, id } => {
            let released = open(name)?.force_release(id).map_err(reach)?;
            if cli.json {
                outln!("{}", json!({"name": name, "id": id, "released": released}));
            }
            if !released {
                if !cli.json {
                    eprintln!(
                        "redis-semaphore: {} has no holder {}",
                        clean(name),
                        clean(id)
                    );
                }
                return Ok(ExitCode::from(1));
            }
            if !cli.json {
                outln!("released {} from {}", clean(id), clean(name));
            }
        }
        Command::Watch { name, count } => {
            let sem = open(name)?;
            let mut shown = 0;
            loop {
                // as `status` shows it: a name without keys is an error on the first
                // screen; later, a semaphore gone idle (its last release deletes its
                // keys) is shown empty
                let (json, text) = report(&client, &sem, name, &url, &reach, shown > 0)?;
                if cli.json {
                    outln!("{json}");
                } else if std::io::stdout().is_terminal() {
                    // clear the screen, cursor home
                    out!("\x1b[2J\x1b[H{text}");
                    outln!("\n(refreshing every second; Ctrl-C to quit)");
                } else {
                    // a pipe or a file: no terminal codes, one report after another
                    out!("{text}");
                    outln!();
                }
                shown += 1;
                if count.is_some_and(|c| shown >= c) {
                    break;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What `status` and each screen of `watch` show of the semaphore `name` (`sem`), as
/// JSON and as text: the leased semaphore when it has keys, else the counting one of
/// that name; when neither has keys, an error naming `url`, or with `idle_ok` the
/// leased semaphore empty (a watched one gone idle). `reach` words an error of
/// Redis.
fn report(
    client: &Client,
    sem: &Semaphore,
    name: &str,
    url: &str,
    reach: &dyn Fn(Error) -> String,
    idle_ok: bool,
) -> Result<(Value, String), String> {
    let (status, holders) = sem.status_and_holders().map_err(reach)?;
    if !status.exists {
        let counting = client.counting_semaphore(name).map_err(|e| e.to_string())?;
        match counting.balance().map_err(reach)? {
            Some(count) => {
                let queued = counting.queue_len().map_err(reach)?;
                return Ok((
                    counting_json(name, count, queued),
                    counting_text(name, count, queued),
                ));
            }
            None if !idle_ok => {
                return Err(format!(
                    "no semaphore {:?} at {url} (it has no keys in Redis)",
                    clean(name)
                ));
            }
            None => {}
        }
    }
    Ok((
        status_json(name, &status, &holders),
        status_text(name, &status, &holders),
    ))
}

/// What `status` and `watch` show of a counting semaphore.
fn counting_text(name: &str, count: i64, queued: u32) -> String {
    format!(
        "counting semaphore {}\n  count      {count}\n  queued     {queued}\n",
        clean(name)
    )
}

/// [`counting_text`] as JSON.
fn counting_json(name: &str, count: i64, queued: u32) -> Value {
    json!({"name": name, "kind": "counting", "count": count, "queued": queued})
}

/// The limit clients use: the stored one, else the one the last acquiring client passed.
fn limit_of(s: &Status) -> Option<u32> {
    s.stored_limit.or(s.client_limit)
}

fn show(v: Option<u32>) -> String {
    v.map_or_else(|| "?".into(), |v| v.to_string())
}

/// How long the holder has held its permit, by the server's clock.
fn age(h: &Holder) -> Duration {
    h.held_for
}

/// One row of `list`: a semaphore and what was read of it (held or count, limit,
/// queued) or why it could not be read.
struct Row {
    name: String,
    kind: &'static str,
    read: Result<(i64, Option<i64>, u32), String>,
}

/// `s` safe to print on a terminal: control characters (escape sequences, tabs, line
/// breaks) are shown escaped, never sent as they are.
fn clean(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn status_text(name: &str, s: &Status, holders: &[Holder]) -> String {
    let limit = limit_of(s);
    let source = match (s.stored_limit, s.client_limit) {
        (Some(_), _) => "stored with set-limit",
        (None, Some(_)) => "passed by the clients",
        (None, None) => "unknown: no client has acquired yet",
    };
    let available = limit.map(|l| l.saturating_sub(s.held));
    let mut out = format!(
        "semaphore {}\n  limit      {} ({source})\n  held       {}\n  available  {}\n  queued     {}\n",
        clean(name),
        show(limit),
        s.held,
        show(available),
        s.queued
    );
    // (as `Semaphore::status` warns: a stored limit governs every acquire, whatever
    // the clients pass)
    if s.stored_limit.is_none()
        && let (Some(a), Some(b)) = (s.client_limit, s.other_client_limit)
    {
        out.push_str(&format!(
            "  warning    clients pass different limits ({a} and {b}): each acquire obeys its \
             own; store one with set-limit\n"
        ));
    }
    if holders.is_empty() {
        out.push_str("  no holders\n");
        return out;
    }
    out.push_str(&format!(
        "\n  {:<36}  {:>7}  {:>17}  {:<8}  {:>9}  {:>10}  {:<20}  {}\n",
        "ID", "PERMITS", "TOKEN", "SLOTS", "AGE", "LEASE LEFT", "HOST/PID", "LABEL"
    ));
    for h in holders {
        let slots: Vec<String> = h.slots.iter().map(u32::to_string).collect();
        out.push_str(&format!(
            "  {:<36}  {:>7}  {:>17}  {:<8}  {:>8.1}s  {:>9.1}s  {:<20}  {}\n",
            // only uuid ids come from this crate's scripts, but any program that can
            // write the keys can add a member
            clean(&h.id),
            h.permits,
            h.token,
            slots.join(","),
            age(h).as_secs_f64(),
            h.lease_left.as_secs_f64(),
            format!("{}/{}", clean(&h.host), h.pid),
            clean(h.label.as_deref().unwrap_or("-")),
        ));
    }
    out
}

fn status_json(name: &str, s: &Status, holders: &[Holder]) -> Value {
    let limit = limit_of(s);
    json!({
        "name": name,
        "kind": "leased",
        "limit": limit,
        "stored_limit": s.stored_limit,
        "client_limit": s.client_limit,
        "other_client_limit": s.other_client_limit,
        "held": s.held,
        "available": limit.map(|l| l.saturating_sub(s.held)),
        "queued": s.queued,
        "holders": holders.iter().map(|h| json!({
            "id": h.id,
            "permits": h.permits,
            "token": h.token,
            "slots": h.slots,
            "host": h.host,
            "pid": h.pid,
            "label": h.label,
            "age_ms": age(h).as_millis() as u64,
            "lease_left_ms": h.lease_left.as_millis() as u64,
        })).collect::<Vec<_>>(),
    })
}
