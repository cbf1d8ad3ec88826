//! Test harness shared by every `tests/*.rs` (each does `mod support;`).
//!
//! Every Redis server used by the suite is started here: a child `redis-server` on a free loopback
//! port (never 6379) in its own temporary folder, with persistence off. It is killed when the
//! `RedisServer` is dropped. Nothing here ever talks to a server it did not start.
//!
//! Waiting is done with deadlines (`wait_until`, `wait_for`), never with sleeps that must be long
//! enough.

#![allow(dead_code)]
#![allow(clippy::disallowed_methods)] // the tests set socket timeouts as they need

pub mod sentinel;

/// The scripts' texts, as the crate assembles them.
#[path = "../../src/scripts/sources.rs"]
mod sources;

use std::collections::{HashMap, HashSet};
use std::env;
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

pub mod capture;
pub mod cluster;
pub mod fault_run;
pub mod python;
pub mod tls_topologies;

/// How long a server may take to answer its first PING.
const READY_DEADLINE: Duration = Duration::from_secs(10);
/// Read/write timeouts of the connections handed out by `RedisServer::conn`.
const CONN_TIMEOUT: Duration = Duration::from_secs(5);
/// The system Redis of this machine: never used, never chosen.
const SYSTEM_REDIS_PORT: u16 = 6379;
/// Offset of the cluster bus port.
const BUS_OFFSET: u16 = 10000;
/// How many times `start` tries fresh ports when a server cannot come up on the one it picked.
const START_ATTEMPTS: usize = 5;

/// Ports handed out in this test process (client ports and their bus twins). Never released,
/// so two servers of one test binary can never share a port, not even one after the other.
fn reserved_ports() -> &'static Mutex<HashSet<u16>> {
    static RESERVED: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    RESERVED.get_or_init(|| Mutex::new(HashSet::new()))
}

/// A free loopback port `p` (not 6379) such that `p + 10000` is free too, reserved for this
/// process. Freedom is checked by binding, which is racy against other processes; `start`
/// copes with losing that race by trying another port.
pub fn pick_port() -> u16 {
    let mut reserved = reserved_ports().lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .expect("bind 127.0.0.1:0")
            .local_addr()
            .expect("local_addr")
            .port();
        if port == SYSTEM_REDIS_PORT || port >= u16::MAX - BUS_OFFSET {
            continue;
        }
        let bus = port + BUS_OFFSET;
        if reserved.contains(&port) || reserved.contains(&bus) {
            continue;
        }
        if TcpListener::bind((Ipv4Addr::LOCALHOST, bus)).is_err() {
            continue;
        }
        reserved.insert(port);
        reserved.insert(bus);
        return port;
    }
}

/// An inline `PING` over a raw socket: true only when the answer is `+PONG`.
fn ping(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(100)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let _ = s.set_write_timeout(Some(Duration::from_millis(500)));
    let mut buf = [0u8; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

fn read_or_empty(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_default()
}

/// A command that runs `program` with its wall clock moved by `offset` (libfaketime's
/// `FAKETIME` form, as `faketime -f` takes it: "+1h", "-1h"), its monotonic clock
/// left alone. It preloads libfaketime itself when it is found, rather than going
/// through the `faketime` wrapper: the wrapper keeps a named semaphore and shared
/// memory in /dev/shm per process, which a wrapper killed by a test leaves behind,
/// and a later wrapper that gets the same pid then fails ("sem_open: File exists")
/// without starting `program`.
pub fn faketime(offset: &str, program: &Path) -> Command {
    const LIBS: [&str; 4] = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
        "/usr/local/lib/faketime/libfaketime.so.1",
    ];
    let mut cmd = match LIBS.iter().find(|lib| Path::new(lib).exists()) {
        Some(lib) => {
            let mut c = Command::new(program);
            c.env("LD_PRELOAD", lib).env("FAKETIME", offset);
            c
        }
        None => {
            let mut c = Command::new("faketime");
            c.arg("-f").arg(offset).arg(program);
            c
        }
    };
    cmd.env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    cmd
}

/// The environment variables that run a redis-server with its wall clock (`TIME`, key
/// expiry) moved by `offset_ms`, its monotonic clock left alone: a small preload
/// library built here with the C compiler (`cc`), since libfaketime crashes
/// redis-server at start-up. `Err` says why the library could not be built (no C
/// compiler, say): a test that needs it fails with that, it does not pass unchecked.
pub fn clock_shift_env(offset_ms: i64) -> Result<Vec<(String, String)>, String> {
    static LIB: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    let lib = LIB.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("clock-shift");
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let src = dir.join("clock_shift.c");
        std::fs::write(&src, CLOCK_SHIFT_C).map_err(|e| format!("write {}: {e}", src.display()))?;
        let lib = dir.join(format!("libclockshift-{}.so", std::process::id()));
        let built = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&lib)
            .arg(&src)
            .status()
            .map_err(|e| format!("cannot run the C compiler `cc` (install gcc): {e}"))?;
        if built.success() {
            Ok(lib)
        } else {
            Err(format!("`cc` failed to build {} ({built})", src.display()))
        }
    });
    let lib = lib
        .as_ref()
        .map_err(|e| format!("no library to shift a redis-server's clock: {e}"))?;
    Ok(vec![
        ("LD_PRELOAD".into(), lib.display().to_string()),
        ("REDSEM_TEST_CLOCK_OFFSET_MS".into(), offset_ms.to_string()),
    ])
}

/// [`clock_shift_env`]'s library: `clock_gettime` (realtime clocks), `gettimeofday`
/// and `time` shifted by `REDSEM_TEST_CLOCK_OFFSET_MS`, through the system call itself
/// (no symbol lookup, no allocation: jemalloc reads the clock while it starts).
const CLOCK_SHIFT_C: &str = r#"
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
static long long offset_ms;
__attribute__((constructor)) static void init(void) {
    const char *s = getenv("REDSEM_TEST_CLOCK_OFFSET_MS");
    offset_ms = s ? atoll(s) : 0;
}
static void shift(struct timespec *ts) {
    long long ns = ts->tv_nsec + (offset_ms % 1000) * 1000000LL;
    ts->tv_sec += offset_ms / 1000 + ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
    if (ts->tv_nsec < 0) { ts->tv_nsec += 1000000000LL; ts->tv_sec -= 1; }
}
int clock_gettime(clockid_t id, struct timespec *ts) {
    long r = syscall(SYS_clock_gettime, id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) shift(ts);
    return (int)r;
}
int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    (void)tz;
    if (syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts) != 0) return -1;
    shift(&ts);
    if (tv) { tv->tv_sec = ts.tv_sec; tv->tv_usec = ts.tv_nsec / 1000; }
    return 0;
}
time_t time(time_t *t) {
    struct timespec ts;
    syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts);
    shift(&ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
"#;

/// Whether [`faketime`] works here (libfaketime or the `faketime` wrapper installed).
pub fn has_faketime() -> bool {
    faketime("+0", Path::new("true"))
        .status()
        .is_ok_and(|s| s.success())
}

/// The servers always run on real time, even when the test binary runs under `faketime`
/// (libfaketime also crashes redis-server at start-up): `LD_PRELOAD` without libfaketime.
fn scrubbed_faketime_env() -> Vec<(&'static str, String)> {
    match env::var("LD_PRELOAD") {
        Ok(preload) if preload.contains("faketime") => {
            let kept: Vec<&str> = preload
                .split([' ', ':'])
                .filter(|lib| !lib.is_empty() && !lib.contains("faketime"))
                .collect();
            vec![("LD_PRELOAD", kept.join(":"))]
        }
        _ => Vec::new(),
    }
}

/// Why a spawn attempt did not give a ready server.
enum StartError {
    /// The port was taken by another process: worth trying another port.
    PortTrouble(String),
    /// Anything else (bad binary, bad arguments, deadline): give up.
    Fatal(String),
}

/// A `redis-server` child process owned by the test.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    extra_args: Vec<String>,
    /// Environment variables of the process (kept by `restart`).
    env: Vec<(String, String)>,
    // Declared last: dropped after the child is killed.
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a standalone server with the default arguments.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Starts a server with `extra_args` appended to the default arguments
    /// (`--port P --bind 127.0.0.1 --save "" --appendonly no --dir <tmp> --logfile <tmp>/redis.log
    /// --enable-debug-command yes`). `restart` reuses them.
    pub fn start_with(extra_args: &[&str]) -> RedisServer {
        Self::start_with_env(extra_args, &[])
    }

    /// [`start_with`](Self::start_with), the process having the environment variables
    /// `env` too (a clock shifted with [`clock_shift_env`], say).
    pub fn start_with_env(extra_args: &[&str], env: &[(String, String)]) -> RedisServer {
        let dir = tempfile::Builder::new()
            .prefix("redsem-test-")
            .tempdir()
            .expect("create a temporary folder for redis-server");
        let mut server = RedisServer {
            child: None,
            port: 0,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            env: env.to_vec(),
            dir,
        };
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            server.port = pick_port();
            match server.spawn() {
                Ok(()) => return server,
                Err(StartError::PortTrouble(msg)) => failures.push(msg),
                Err(StartError::Fatal(msg)) => panic!("{msg}"),
            }
        }
        panic!(
            "redis-server did not start after {START_ATTEMPTS} attempts:\n{}",
            failures.join("\n---\n")
        );
    }

    /// The client port (never 6379; `port() + 10000` was free too when it was picked).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The temporary folder of this server (its `--dir`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The process id of the running server, if it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Crash and start again: SIGKILL, wait, then a new server on the same port with the same
    /// arguments. It comes back empty (nothing is persisted; any dump or AOF is removed first).
    pub fn restart(&mut self) {
        self.stop();
        for name in ["dump.rdb", "appendonly.aof"] {
            let _ = fs::remove_file(self.dir.path().join(name));
        }
        let _ = fs::remove_dir_all(self.dir.path().join("appendonlydir"));
        self.restart_keeping_data();
    }

    /// Crash and start again keeping the data: SIGKILL, wait, then a new server on the
    /// same port with the same arguments, which loads whatever it persisted (start it
    /// with `--appendonly yes --appendfsync always` to lose nothing acknowledged).
    pub fn restart_keeping_data(&mut self) {
        self.stop();
        // Redis binds with SO_REUSEADDR, so the port is normally free at once; retry briefly in
        // case a short-lived client socket holds it.
        let deadline = Instant::now() + READY_DEADLINE;
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(StartError::PortTrouble(msg)) if Instant::now() < deadline => {
                    eprintln!(
                        "redis-server restart on port {} failed, retrying: {msg}",
                        self.port
                    );
                    thread::sleep(Duration::from_millis(50));
                }
                Err(StartError::PortTrouble(msg) | StartError::Fatal(msg)) => {
                    panic!("restart on port {}: {msg}", self.port)
                }
            }
        }
    }

    /// Kills the server (SIGKILL) and reaps it. Does nothing when it is already stopped.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server with SIGSTOP until the guard is dropped (SIGCONT): the kernel
    /// still accepts connections to it, but nothing is answered, as with a hung host.
    pub fn pause(&self) -> Paused {
        let pid = self.pid().expect("a running server") as i32;
        // SAFETY: a signal to a child process this test started
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        Paused(pid)
    }

    /// A client for this server.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("redis::Client::open")
    }

    /// A direct connection for assertions, with 5 s connect, read and write timeouts.
    pub fn conn(&self) -> redis::Connection {
        let conn = self
            .client()
            .get_connection_with_timeout(CONN_TIMEOUT)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url()));
        conn.set_read_timeout(Some(CONN_TIMEOUT))
            .expect("set_read_timeout");
        conn.set_write_timeout(Some(CONN_TIMEOUT))
            .expect("set_write_timeout");
        conn
    }

    /// The server's log file (all runs, after `restart`), plus whatever it wrote to
    /// stdout/stderr.
    pub fn log(&self) -> String {
        let mut log = read_or_empty(&self.dir.path().join("redis.log"));
        let out = read_or_empty(&self.dir.path().join("stdout.log"));
        if !out.trim().is_empty() {
            log.push_str("\n[stdout/stderr]\n");
            log.push_str(&out);
        }
        log
    }

    fn bin() -> OsString {
        env::var_os("REDIS_SERVER_BIN").unwrap_or_else(|| "redis-server".into())
    }

    /// The arguments that turn on `DEBUG` (for `DEBUG SLEEP` and the like): Redis 7 and
    /// Valkey need `--enable-debug-command yes`; Redis 6.2 allows `DEBUG` always and
    /// refuses the option.
    fn debug_args() -> &'static [&'static str] {
        static ARGS: OnceLock<&'static [&'static str]> = OnceLock::new();
        ARGS.get_or_init(|| {
            let version = Command::new(Self::bin())
                .arg("--version")
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            let major = version
                .split("v=")
                .nth(1)
                .and_then(|v| v.split('.').next())
                .and_then(|m| m.parse::<u32>().ok())
                .unwrap_or(7);
            if major >= 7 {
                &["--enable-debug-command", "yes"]
            } else {
                &[]
            }
        })
    }

    /// Spawns the child on `self.port` and waits until it answers PING and is really ours.
    fn spawn(&mut self) -> Result<(), StartError> {
        assert!(self.child.is_none(), "spawn while a server runs");
        assert_ne!(self.port, SYSTEM_REDIS_PORT, "never the system Redis");
        let dir = self.dir.path();
        let out = File::options()
            .create(true)
            .append(true)
            .open(dir.join("stdout.log"))
            .expect("open stdout.log");
        let err = out.try_clone().expect("clone stdout.log handle");
        let bin = Self::bin();
        let child = Command::new(&bin)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .args(Self::debug_args())
            .args(&self.extra_args)
            .envs(scrubbed_faketime_env())
            .env_remove("FAKETIME")
            .env_remove("FAKETIME_DONT_FAKE_MONOTONIC")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| {
                StartError::Fatal(format!(
                    "cannot run {bin:?} ({e}): install redis-server or set REDIS_SERVER_BIN"
                ))
            })?;
        let pid = child.id();
        self.child = Some(child);

        let deadline = Instant::now() + READY_DEADLINE;
        loop {
            let child = self.child.as_mut().expect("child");
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                let log = self.log();
                let msg = format!(
                    "redis-server on port {} exited with {status}; log:\n{log}",
                    self.port
                );
                // Lost the race for the port (or its bus twin) to another process: worth another
                // try. Anything else (bad arguments, ...) will not get better.
                return Err(if log.contains("Address already in use") {
                    StartError::PortTrouble(msg)
                } else {
                    StartError::Fatal(msg)
                });
            }
            if ping(self.port) {
                break;
            }
            if Instant::now() >= deadline {
                self.stop();
                return Err(StartError::Fatal(format!(
                    "redis-server on port {} not ready after {READY_DEADLINE:?}; log:\n{}",
                    self.port,
                    self.log()
                )));
            }
            thread::sleep(Duration::from_millis(2));
        }

        // The PONG could come from a foreign process that took the port (another test binary):
        // make sure it is our child that answers.
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut self.conn())
            .map_err(|e| StartError::Fatal(format!("INFO server on port {}: {e}", self.port)))?;
        let server_pid = info_field(&info, "process_id").and_then(|v| v.parse::<u32>().ok());
        if server_pid != Some(pid) {
            self.stop();
            return Err(StartError::PortTrouble(format!(
                "port {} is answered by process {server_pid:?}, not by our child {pid}",
                self.port
            )));
        }
        Ok(())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The value of `field` in an `INFO` reply (`field:value` lines).
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k == field).then_some(v.trim())
    })
}

/// `CONFIG SET maxmemory bytes` on `conn`'s server (`"0"`: no limit).
#[allow(dead_code)] // each test binary uses its part of the support
pub fn set_maxmemory(conn: &mut redis::Connection, bytes: &str) {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(bytes)
        .exec(conn)
        .unwrap();
}

/// A primary and one replica of it, the replica in sync.
pub fn primary_and_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start();
    let replica = replica_of(&primary);
    (primary, replica)
}

/// A replica of `primary`, in sync (its link up) when it is returned.
pub fn replica_of(primary: &RedisServer) -> RedisServer {
    let port = primary.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    let mut rc = replica.conn();
    wait_until(Duration::from_secs(10), "the replica's link is up", || {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut rc)
            .unwrap();
        info_field(&info, "master_link_status") == Some("up")
    });
    replica
}

/// The writes the primary a `replica` follows sent it from now on, as its `MONITOR`
/// shows them, gathered by [`Stream::lines_until`].
#[allow(dead_code)] // each test binary uses its part of the support
pub struct Stream(redis::Connection);

#[allow(dead_code)] // each test binary uses its part of the support
impl Stream {
    pub fn of(replica: &RedisServer) -> Stream {
        let mut monitor = replica.conn();
        monitor
            .send_packed_command(&redis::cmd("MONITOR").get_packed_command())
            .unwrap();
        assert!(matches!(
            monitor.recv_response().unwrap(),
            redis::Value::Okay
        ));
        Stream(monitor)
    }

    /// The lines seen until `done` says they are all there (within 5 s).
    pub fn lines_until(&mut self, what: &str, done: impl Fn(&[String]) -> bool) -> Vec<String> {
        let mut lines = Vec::new();
        wait_until(Duration::from_secs(5), what, || {
            // (a test's own connection: a plain socket timeout)
            #[allow(clippy::disallowed_methods)]
            self.0
                .set_read_timeout(Some(Duration::from_millis(50)))
                .unwrap();
            while let Ok(redis::Value::SimpleString(line)) = self.0.recv_response() {
                lines.push(line);
            }
            done(&lines)
        });
        lines
    }
}

/// A [`Proxy`] to `server` and a client through it whose operation timeout is
/// `op_timeout` (longer than the replies a test holds back in the proxy).
#[allow(dead_code)] // each test binary uses its part of the support
pub fn proxied_client(
    server: &RedisServer,
    op_timeout: Duration,
) -> (Proxy, redis_semaphore::Client) {
    let proxy = Proxy::start(server.port());
    let client = redis_semaphore::Client::builder()
        .operation_timeout(op_timeout)
        .build(proxy.url())
        .unwrap();
    (proxy, client)
}

/// How many `SUBSCRIBE`s the server (or sentinel) `conn` is connected to refused, as
/// its ACL LOG counts them (one entry per client and channel, with a count).
pub fn refused_subscribes(conn: &mut redis::Connection) -> i64 {
    let entries: Vec<redis::Value> = redis::cmd("ACL").arg("LOG").arg(100).query(conn).unwrap();
    entries
        .iter()
        .map(|e| format!("{e:?}"))
        .filter(|e| e.contains("subscribe"))
        .map(|e| {
            let count = e.split("int(").nth(1).expect("a count");
            count[..count.find(')').unwrap()].parse::<i64>().unwrap()
        })
        .sum()
}

/// Closes every client connection of `server` but the one asking (`CLIENT KILL TYPE
/// normal SKIPME yes`): what a restart, a failover or an operator does to the pooled
/// connections of every client. Returns how many it closed.
pub fn kill_clients(server: &RedisServer) -> i64 {
    kill_clients_on(&mut server.conn())
}

/// [`kill_clients`] from the connection `admin` (which stays).
pub fn kill_clients_on(admin: &mut redis::Connection) -> i64 {
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query(admin)
        .unwrap()
}

/// Waits until `server` (started with `--timeout`) has closed every idle client
/// connection ([`Cut::Idle`]).
pub fn wait_idle_closed(server: &RedisServer) {
    Cut::Idle.apply(&mut server.conn());
}

/// How a test closes a client's idle pooled connections.
#[derive(Clone, Copy, Debug)]
#[allow(dead_code)] // each test binary uses its part of the support
pub enum Cut {
    /// By the server's `timeout 1`: each is closed once idle for a second or two.
    Idle,
    /// By `CLIENT KILL TYPE normal SKIPME yes` (a restart closes them the same way).
    Kill,
}

#[allow(dead_code)] // each test binary uses its part of the support
impl Cut {
    /// A server for this cut (`--timeout 1` for [`Cut::Idle`]).
    pub fn server(self) -> RedisServer {
        match self {
            Cut::Idle => RedisServer::start_with(&["--timeout", "1"]),
            Cut::Kill => RedisServer::start(),
        }
    }

    /// Closes every normal connection but `admin`'s: waits for the server's idle
    /// timeout to close them, or kills them.
    pub fn apply(self, admin: &mut redis::Connection) {
        match self {
            Cut::Idle => wait_until(
                Duration::from_secs(15),
                "the server to close the idle connections",
                // (polled every few ms: the admin connection itself never idles)
                || normal_clients(admin) == 1,
            ),
            Cut::Kill => {
                kill_clients_on(admin);
                assert_eq!(normal_clients(admin), 1);
            }
        }
    }
}

/// Normal (not pub/sub) client connections of `admin`'s server, `admin`'s included.
pub fn normal_clients(admin: &mut redis::Connection) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("normal")
        .query(admin)
        .unwrap();
    list.lines().filter(|l| !l.trim().is_empty()).count()
}

/// A primary with a replica, and a client reaching the primary through a [`Proxy`],
/// its operation timeout 1 s.
pub fn proxied_primary() -> (RedisServer, RedisServer, Proxy, redis_semaphore::Client) {
    let (primary, replica) = primary_and_replica();
    let proxy = Proxy::start(primary.port());
    let client = redis_semaphore::Client::builder()
        .operation_timeout(Duration::from_secs(1))
        .build(proxy.url())
        .unwrap();
    (primary, replica, proxy, client)
}

/// What a [`queued_waiter`] thread returns: its acquire's outcome and when it came.
pub type WaiterOutcome = (
    redis_semaphore::Result<Option<redis_semaphore::Permit>>,
    Instant,
);

/// Starts a thread blocked in `sem.acquire_timeout(60 s)` and returns once it is queued
/// (`queue_len` 1, within `within`).
pub fn queued_waiter(
    sem: &redis_semaphore::Semaphore,
    within: Duration,
) -> thread::JoinHandle<WaiterOutcome> {
    let waiter = {
        let sem = sem.clone();
        thread::spawn(move || {
            let r = sem.acquire_timeout(Duration::from_secs(60));
            (r, Instant::now())
        })
    };
    wait_until(within, "the waiter queued", || {
        sem.queue_len().unwrap() == 1
    });
    waiter
}

/// The Redis server's clock (`TIME`) in Unix milliseconds: the clock the scripts read.
pub fn server_ms(conn: &mut redis::Connection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(conn).unwrap();
    s * 1000 + us / 1000
}

/// Waits (at most 5 s) until the Redis server's clock is past `deadline_ms`.
pub fn wait_past_server_ms(conn: &mut redis::Connection, deadline_ms: i64) {
    wait_until(
        Duration::from_secs(5),
        "the server's clock to pass the deadline",
        || server_ms(conn) > deadline_ms,
    );
}

/// This machine's wall clock in Unix milliseconds (what the peers' algorithms read).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Polls `cond` about every 2 ms until it returns true; panics naming `what` when `timeout`
/// passes first.
pub fn wait_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    wait_for(timeout, what, || cond().then_some(()))
}

/// Drops `value` on a thread of its own and says whether the drop ended within
/// `limit`; then `resume` runs (a paused server let go, say) and the thread is joined.
/// A drop that hangs until the server answers fails the test instead of hanging it.
pub fn drop_ends_within<T: Send + 'static>(
    limit: Duration,
    value: T,
    resume: impl FnOnce(),
) -> bool {
    let (done, ended) = crossbeam_channel::bounded(1);
    let dropping = thread::spawn(move || {
        drop(value);
        let _ = done.send(());
    });
    let in_time = ended.recv_timeout(limit).is_ok();
    resume();
    dropping.join().unwrap();
    in_time
}

/// Polls `f` about every 2 ms until it returns `Some`, and returns the value; panics naming
/// `what` when `timeout` passes first.
pub fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        if start.elapsed() >= timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        thread::sleep(Duration::from_millis(2));
    }
}

/// Calls per command from `INFO commandstats`: `cmdstat_evalsha:calls=3,...` gives
/// `{"evalsha": 3}`. Names are lower case; subcommands stay as Redis writes them
/// (`client|setname`). Commands run inside scripts are counted too.
pub fn command_calls(conn: &mut redis::Connection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO commandstats");
    parse_command_calls(&info)
}

fn parse_command_calls(info: &str) -> HashMap<String, u64> {
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_ascii_lowercase(), calls))
        })
        .collect()
}

/// Every key matching `pattern`, found with `SCAN ... MATCH` (never `KEYS`), sorted and without
/// duplicates.
pub fn keys(conn: &mut redis::Connection, pattern: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query(conn)
            .expect("SCAN");
        found.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    found.sort();
    found.dedup();
    found
}

/// The acquire script as the client sends it (src/scripts/sources.rs).
pub fn acquire_script() -> redis::Script {
    redis::Script::new(sources::ACQUIRE)
}

/// The batch script as the client sends it (src/scripts/sources.rs).
pub fn batch_script() -> redis::Script {
    redis::Script::new(sources::BATCH)
}

/// An acquire's reply (acquire.lua's, or an acquire's entry in batch.lua's) in
/// op_acquire's long form (ops.lua). The fast path's short forms (fast_acquire.lua)
/// become the long ones: `0`, a try refused, is `[0, 0, -1, 0]` (the time is not
/// sent), and `"now|token|deadline|slot"`, a grant, is `[1, now, token, deadline, slot]`.
pub fn acquire_reply(v: &redis::Value) -> Vec<i64> {
    match v {
        redis::Value::Int(0) => vec![0, 0, -1, 0],
        redis::Value::BulkString(text) => std::str::from_utf8(text)
            .expect("a grant's text")
            .split('|')
            .map(|f| f.parse().expect("a grant's number"))
            .fold(vec![1], |mut r, x| {
                r.push(x);
                r
            }),
        v => redis::from_redis_value_ref(v).expect("an acquire's reply"),
    }
}

/// Appends a try-acquire of `n` permits for `id` to a call of the batch script (its
/// full form 'a', pad and heartbeat 1 s).
pub fn batch_try_many(
    inv: &mut redis::ScriptInvocation<'_>,
    id: &str,
    n: u32,
    limit: u32,
    lease_ms: u64,
) {
    inv.arg("a")
        .arg(id)
        .arg(n)
        .arg(limit)
        .arg(lease_ms)
        .arg(1000)
        .arg(1000)
        .arg("1|test|")
        .arg("t")
        .arg("1")
        .arg("")
        .arg("0");
}

/// A call of `script` on the four keys of semaphore `name`.
pub fn call_on<'a>(script: &'a redis::Script, name: &str) -> redis::ScriptInvocation<'a> {
    let mut inv = script.prepare_invoke();
    for part in ["h", "i", "s", "q"] {
        inv.key(format!("redsem:{{{name}}}:{part}"));
    }
    inv
}

/// The release script as the client sends it (src/scripts/sources.rs).
pub fn release_script() -> redis::Script {
    redis::Script::new(sources::RELEASE)
}

/// The set_limit script as the client sends it (src/scripts/sources.rs).
pub fn set_limit_script() -> redis::Script {
    redis::Script::new(sources::SET_LIMIT)
}

/// The refresh script as the client sends it (src/scripts/sources.rs).
pub fn refresh_script() -> redis::Script {
    redis::Script::new(sources::REFRESH)
}

/// The cancel script as the client sends it (src/scripts/sources.rs).
pub fn cancel_script() -> redis::Script {
    redis::Script::new(sources::CANCEL)
}

/// A TCP proxy on a free loopback port in front of a server, for network faults: it
/// forwards bytes both ways until [`cut`](Proxy::cut), which makes it a black hole
/// (bytes in either direction vanish, connections stay open, new ones are accepted
/// and hear nothing: what a client sees of a partition) until [`heal`](Proxy::heal),
/// which closes every connection that lived through the cut (their streams lost
/// bytes). [`reset`](Proxy::reset) closes every connection at once.
/// [`stall_new`](Proxy::stall_new) leaves the live connections be and makes new ones
/// hear nothing (a server that accepts and never answers, as one stopped mid-way).
pub struct Proxy {
    port: u16,
    shared: std::sync::Arc<ProxyShared>,
}

#[derive(Default)]
struct ProxyShared {
    cut: std::sync::atomic::AtomicBool,
    stop: std::sync::atomic::AtomicBool,
    /// Both sockets of every live connection, whether it lived through a cut, and its
    /// number (a connection that ended leaves the list: [`ProxyShared::forget`]).
    conns: Mutex<Vec<(TcpStream, TcpStream, bool, u64)>>,
    /// The number of the next connection.
    next_conn: std::sync::atomic::AtomicU64,
    /// Bytes whose passage from a client starts a cut ([`Proxy::cut_when_sent`]).
    trigger: Mutex<Option<Vec<u8>>>,
    /// How long each chunk from the server is held before it goes on, in ms
    /// ([`Proxy::delay_replies`]).
    reply_delay_ms: std::sync::atomic::AtomicU64,
    /// How many chunks from the server are being held by that delay now
    /// ([`Proxy::held_replies`]).
    held_replies: std::sync::atomic::AtomicUsize,
    /// Bytes whose passage from a client holds the chunk that long
    /// ([`Proxy::delay_sent`]).
    sent_delay: Mutex<Option<(Vec<u8>, Duration)>>,
    /// Whether new connections are held open and never forwarded ([`Proxy::stall_new`]).
    stall_new: std::sync::atomic::AtomicBool,
    /// The connections held so: read by nobody, closed by a heal, a reset or the drop.
    stalled: Mutex<Vec<TcpStream>>,
}

impl ProxyShared {
    /// Starts a partition (see [`Proxy::cut`]).
    fn cut(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        self.cut.store(true, SeqCst);
        for c in conns.iter_mut() {
            c.2 = true;
        }
    }

    /// Whether `chunk`, on its way from a client, holds the armed trigger (which it
    /// then disarms).
    fn triggered_by(&self, chunk: &[u8]) -> bool {
        let mut trigger = self.trigger.lock().unwrap_or_else(|e| e.into_inner());
        let hit = trigger
            .as_deref()
            .is_some_and(|t| chunk.windows(t.len()).any(|w| w == t));
        if hit {
            *trigger = None;
        }
        hit
    }

    /// How long `chunk`, on its way from a client, is held ([`Proxy::delay_sent`]).
    fn sent_delay_of(&self, chunk: &[u8]) -> Option<Duration> {
        let delay = self.sent_delay.lock().unwrap_or_else(|e| e.into_inner());
        let (bytes, d) = delay.as_ref()?;
        chunk.windows(bytes.len()).any(|w| w == bytes).then_some(*d)
    }

    fn close_where(&self, pred: impl Fn(bool) -> bool) {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        Self::close_in(&mut conns, pred);
    }

    /// Closes the connections held by [`Proxy::stall_new`].
    fn close_stalled(&self) {
        let mut stalled = self.stalled.lock().unwrap_or_else(|e| e.into_inner());
        for s in stalled.drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Takes connection `id`, which ended, out of the list (its sockets with it): a
    /// long run opens thousands.
    fn forget(&self, id: u64) {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.retain(|c| c.3 != id);
    }

    fn close_in(conns: &mut Vec<(TcpStream, TcpStream, bool, u64)>, pred: impl Fn(bool) -> bool) {
        conns.retain(|(a, b, cut, _)| {
            if pred(*cut) {
                let _ = a.shutdown(std::net::Shutdown::Both);
                let _ = b.shutdown(std::net::Shutdown::Both);
                false
            } else {
                true
            }
        });
    }
}

impl Proxy {
    /// Starts forwarding a free loopback port to `127.0.0.1:target`.
    pub fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let shared = std::sync::Arc::new(ProxyShared::default());
        let sh = std::sync::Arc::clone(&shared);
        thread::spawn(move || {
            use std::sync::atomic::Ordering::SeqCst;
            for client in listener.incoming() {
                if sh.stop.load(SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                if sh.stall_new.load(SeqCst) {
                    // accepted, and never answered
                    let mut stalled = sh.stalled.lock().unwrap_or_else(|e| e.into_inner());
                    stalled.push(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect((Ipv4Addr::LOCALHOST, target)) else {
                    continue; // the server is down: the client sees its connection close
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                let id = sh.next_conn.fetch_add(1, SeqCst);
                {
                    // under the lock, so a heal sees it (and its cut mark) whole
                    let mut conns = sh.conns.lock().unwrap_or_else(|e| e.into_inner());
                    let cut = sh.cut.load(SeqCst);
                    conns.push((c2, s2, cut, id));
                }
                for (from, to, from_client) in [
                    (client.try_clone(), server.try_clone(), true),
                    (server.try_clone(), client.try_clone(), false),
                ] {
                    let (Ok(mut from), Ok(mut to)) = (from, to) else {
                        continue;
                    };
                    let sh = std::sync::Arc::clone(&sh);
                    thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        loop {
                            match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    if from_client && sh.triggered_by(&buf[..n]) {
                                        sh.cut(); // this chunk is the first to vanish
                                    }
                                    if sh.cut.load(SeqCst) {
                                        continue; // the black hole
                                    }
                                    let delay = sh.reply_delay_ms.load(SeqCst);
                                    if !from_client && delay > 0 {
                                        // a slow network, not a wait for a condition
                                        sh.held_replies.fetch_add(1, SeqCst);
                                        thread::sleep(Duration::from_millis(delay));
                                        sh.held_replies.fetch_sub(1, SeqCst);
                                    }
                                    if from_client && let Some(d) = sh.sent_delay_of(&buf[..n]) {
                                        // a slow request (a slow server), likewise
                                        thread::sleep(d);
                                    }
                                    if to.write_all(&buf[..n]).is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = from.shutdown(std::net::Shutdown::Both);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                        sh.forget(id);
                    });
                }
            }
        });
        Proxy { port, shared }
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/` of the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Starts a partition: from now on nothing goes through.
    pub fn cut(&self) {
        self.shared.cut();
    }

    /// Starts a partition the moment a client sends `bytes` (within one read of the
    /// proxy: a command's name, say): that chunk and everything after it vanish. For a
    /// fault that must land between two steps of one call, where no test could time
    /// a [`cut`](Proxy::cut).
    pub fn cut_when_sent(&self, bytes: &[u8]) {
        *self
            .shared
            .trigger
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(bytes.to_vec());
    }

    /// Holds every chunk the server sends for `d` before passing it on (`ZERO`: none),
    /// so that each round trip takes at least `d`.
    pub fn delay_replies(&self, d: Duration) {
        use std::sync::atomic::Ordering::SeqCst;
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.shared.reply_delay_ms.store(ms, SeqCst);
    }

    /// How many chunks from the server [`delay_replies`](Proxy::delay_replies) holds
    /// now: a reply counted here was read by the proxy under the delay, and goes on
    /// only when its delay is over, whatever the delay is set to meanwhile.
    pub fn held_replies(&self) -> usize {
        use std::sync::atomic::Ordering::SeqCst;
        self.shared.held_replies.load(SeqCst)
    }

    /// Holds every chunk a client sends that holds `bytes` (a command's name, say) for
    /// `d` before passing it on: those requests take at least `d` longer.
    pub fn delay_sent(&self, bytes: &[u8], d: Duration) {
        *self
            .shared
            .sent_delay
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some((bytes.to_vec(), d));
    }

    /// From now on new connections are accepted and hear nothing (their bytes go
    /// nowhere; a TLS handshake on one waits for the server's hello), while the live
    /// ones go on forwarding, until [`heal`](Proxy::heal) closes them.
    pub fn stall_new(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        self.shared.stall_new.store(true, SeqCst);
    }

    /// How many connections [`stall_new`](Proxy::stall_new) holds (accepted, never
    /// forwarded) since it began.
    pub fn stalled_connections(&self) -> usize {
        self.shared
            .stalled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Ends a partition: connections that lived through it are closed (their streams
    /// lost bytes), and bytes flow again; connections held by
    /// [`stall_new`](Proxy::stall_new) are closed, and new ones are forwarded again.
    pub fn heal(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        let mut conns = self.shared.conns.lock().unwrap_or_else(|e| e.into_inner());
        ProxyShared::close_in(&mut conns, |cut| cut);
        self.shared.cut.store(false, SeqCst);
        self.shared.stall_new.store(false, SeqCst);
        self.shared.close_stalled();
    }

    /// Closes every connection through the proxy (both sides see it end).
    pub fn reset(&self) {
        self.shared.close_where(|_| true);
        self.shared.close_stalled();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering::SeqCst;
        self.shared.stop.store(true, SeqCst);
        self.shared.close_where(|_| true);
        self.shared.close_stalled();
        // wake the accept loop so it sees `stop`
        let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port));
    }
}

// --- TLS and ACL servers ----------------------------------------------------------------

/// Certificates made by the test with the `openssl` command: a CA, a server certificate
/// (X.509 v3, `subjectAltName=DNS:localhost,IP:127.0.0.1`; rustls refuses v1 and
/// certificates without a SAN) and a client certificate (`extendedKeyUsage=clientAuth`)
/// for mutual TLS. Made once per test binary.
pub struct TlsCerts {
    pub dir: tempfile::TempDir,
    pub ca: std::path::PathBuf,
    pub server_cert: std::path::PathBuf,
    pub server_key: std::path::PathBuf,
    pub client_cert: std::path::PathBuf,
    pub client_key: std::path::PathBuf,
}

impl TlsCerts {
    /// The certificates of this test binary, made on first use.
    pub fn get() -> &'static TlsCerts {
        static CERTS: OnceLock<TlsCerts> = OnceLock::new();
        CERTS.get_or_init(TlsCerts::make)
    }

    fn make() -> TlsCerts {
        let dir = tempfile::Builder::new()
            .prefix("redsem-tls-")
            .tempdir()
            .expect("create a temporary folder for certificates");
        let d = dir.path();
        fs::write(
            d.join("san.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        )
        .unwrap();
        fs::write(d.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
        let steps: &[&[&str]] = &[
            &["genrsa", "-out", "ca.key", "2048"],
            &[
                "req",
                "-x509",
                "-new",
                "-nodes",
                "-sha256",
                "-key",
                "ca.key",
                "-days",
                "3650",
                "-subj",
                "/CN=redsem test CA",
                "-out",
                "ca.crt",
            ],
            &["genrsa", "-out", "redis.key", "2048"],
            &[
                "req",
                "-new",
                "-sha256",
                "-key",
                "redis.key",
                "-subj",
                "/CN=localhost",
                "-out",
                "redis.csr",
            ],
            &[
                "x509",
                "-req",
                "-sha256",
                "-in",
                "redis.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "365",
                "-extfile",
                "san.ext",
                "-out",
                "redis.crt",
            ],
            &["genrsa", "-out", "client.key", "2048"],
            &[
                "req",
                "-new",
                "-sha256",
                "-key",
                "client.key",
                "-subj",
                "/CN=redsem-client",
                "-out",
                "client.csr",
            ],
            &[
                "x509",
                "-req",
                "-sha256",
                "-in",
                "client.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "365",
                "-extfile",
                "client.ext",
                "-out",
                "client.crt",
            ],
        ];
        for args in steps {
            let out = Command::new("openssl")
                .args(*args)
                .current_dir(d)
                .stdin(Stdio::null())
                .output()
                .unwrap_or_else(|e| {
                    panic!("cannot run openssl ({e}): install it (Debian package openssl)")
                });
            assert!(
                out.status.success(),
                "openssl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        TlsCerts {
            ca: d.join("ca.crt"),
            server_cert: d.join("redis.crt"),
            server_key: d.join("redis.key"),
            client_cert: d.join("client.crt"),
            client_key: d.join("client.key"),
            dir,
        }
    }
}

/// A server with a TLS port as well as its plaintext one (which the harness uses to see
/// that it is up, and the tests to check a TLS URL against a plaintext port);
/// [`TlsServer::tls_only`] closes the plaintext port.
pub struct TlsServer {
    pub server: RedisServer,
    pub tls_port: u16,
}

impl TlsServer {
    /// Starts a server whose TLS port asks for client certificates as `auth_clients`
    /// says (`yes`, `optional` or `no`).
    pub fn start(auth_clients: &str) -> TlsServer {
        TlsServer::start_with(auth_clients, &[])
    }

    /// [`start`](Self::start) with `extra` arguments for the server (`--bind ...`).
    pub fn start_with(auth_clients: &str, extra: &[&str]) -> TlsServer {
        let certs = TlsCerts::get();
        let tls_port = pick_port();
        let port = tls_port.to_string();
        let mut args = vec![
            "--tls-port",
            &port,
            "--tls-cert-file",
            certs.server_cert.to_str().unwrap(),
            "--tls-key-file",
            certs.server_key.to_str().unwrap(),
            "--tls-ca-cert-file",
            certs.ca.to_str().unwrap(),
            "--tls-auth-clients",
            auth_clients,
        ];
        args.extend_from_slice(extra);
        let server = RedisServer::start_with(&args);
        TlsServer { server, tls_port }
    }

    /// Closes the plaintext port (`CONFIG SET port 0`): from now on the server speaks
    /// TLS only, as one started with `--port 0 --tls-port P`.
    pub fn tls_only(self) -> TlsServer {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("port")
            .arg(0)
            .exec(&mut self.server.conn())
            .expect("CONFIG SET port 0");
        assert!(
            !ping(self.server.port()),
            "the plaintext port still answers"
        );
        self
    }

    /// `rediss://localhost:TLS_PORT/` (the name the server certificate is for).
    pub fn tls_url(&self) -> String {
        format!("rediss://localhost:{}/", self.tls_port)
    }
}

/// A server with `requirepass` (the default user's password is `admin_password`) and an
/// ACL user made with `ACL SETUSER user on >password rules...`.
pub struct AclServer {
    pub server: RedisServer,
    pub admin_password: String,
}

impl AclServer {
    /// Starts a server and sets `requirepass` on it.
    pub fn start(admin_password: &str) -> AclServer {
        let server = RedisServer::start();
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("requirepass")
            .arg(admin_password)
            .exec(&mut server.conn())
            .expect("CONFIG SET requirepass");
        AclServer {
            server,
            admin_password: admin_password.to_owned(),
        }
    }

    /// A connection as the default user (the admin).
    pub fn admin_conn(&self) -> redis::Connection {
        let url = format!(
            "redis://default:{}@127.0.0.1:{}/",
            self.admin_password,
            self.server.port()
        );
        let conn = redis::Client::open(url)
            .unwrap()
            .get_connection_with_timeout(CONN_TIMEOUT)
            .expect("admin connection");
        conn.set_read_timeout(Some(CONN_TIMEOUT)).unwrap();
        conn
    }

    /// `ACL SETUSER user on >password rules...` (rules as separate words).
    pub fn add_user(&self, user: &str, password: &str, rules: &[&str]) {
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER")
            .arg(user)
            .arg("on")
            .arg(format!(">{password}"));
        for r in rules {
            cmd.arg(*r);
        }
        cmd.exec(&mut self.admin_conn())
            .unwrap_or_else(|e| panic!("ACL SETUSER {user}: {e}"));
    }

    /// `redis://user:password@127.0.0.1:PORT/`
    pub fn url_as(&self, user: &str, password: &str) -> String {
        format!(
            "redis://{user}:{password}@127.0.0.1:{}/",
            self.server.port()
        )
    }
}

/// Runs every public operation of the library once against `client` on semaphores whose
/// names start with `tag`, asserting the results: the leased semaphore (acquire,
/// try_acquire, acquire_timeout woken by a release, acquire_many, refresh, release,
/// available, limit, set_limit, queue_len, holders, force_release), list_semaphores,
/// the counting semaphore (a blocked acquire woken by a release too), and stats.
pub fn every_operation(client: &redis_semaphore::Client, tag: &str) {
    use std::sync::mpsc;
    const LONG: Duration = Duration::from_secs(10);

    client.ping().expect("ping");
    let name = format!("{tag}:leased");
    let sem = client.semaphore(&name, 2).expect("semaphore");
    assert_eq!(sem.limit().unwrap(), 2);
    assert_eq!(sem.available().unwrap(), 2);

    let a = sem.acquire().expect("acquire");
    let b = sem
        .try_acquire()
        .expect("try_acquire")
        .expect("a free permit");
    assert!(sem.try_acquire().unwrap().is_none(), "the limit is 2");
    assert_eq!(sem.available().unwrap(), 0);
    a.refresh().expect("refresh");
    let holders = sem.holders().expect("holders");
    assert_eq!(holders.len(), 2);

    // a blocked acquire, woken by a release
    let (tx, rx) = mpsc::channel();
    let waiter = {
        let sem = sem.clone();
        thread::spawn(move || {
            let p = sem.acquire_timeout(LONG);
            tx.send(()).unwrap();
            p
        })
    };
    wait_until(LONG, "the waiter queues", || sem.queue_len().unwrap() == 1);
    a.release().expect("release");
    rx.recv_timeout(LONG).expect("the waiter is woken");
    let c = waiter
        .join()
        .unwrap()
        .expect("acquire_timeout")
        .expect("granted by the release");
    assert_eq!(sem.queue_len().unwrap(), 0);

    // force_release of another's permit
    assert!(sem.force_release(b.id()).expect("force_release"));
    wait_until(LONG, "b learns its loss", || {
        b.refresh().is_err() || b.is_lost()
    });
    drop(b);
    drop(c);

    sem.set_limit(3).expect("set_limit");
    assert_eq!(sem.limit().unwrap(), 3);
    let sem = client.semaphore(&name, 3).unwrap();
    let many = sem.acquire_many(3).expect("acquire_many");
    assert_eq!(many.permits(), 3);
    assert_eq!(sem.available().unwrap(), 0);
    let names = client
        .list_semaphores(&format!("{tag}:*"))
        .expect("list_semaphores");
    assert_eq!(names, vec![name.clone()]);
    many.release().expect("release many");
    assert_eq!(sem.available().unwrap(), 3);

    // the counting semaphore, with a blocked acquire woken by a release
    let cs = client
        .counting_semaphore(&format!("{tag}:counting"))
        .expect("counting_semaphore");
    assert!(cs.try_set_permits(1).expect("try_set_permits"));
    assert!(cs.try_acquire(1).expect("counting try_acquire"));
    assert_eq!(cs.available_permits().unwrap(), 0);
    let (tx, rx) = mpsc::channel();
    let waiter = {
        let cs = cs.clone();
        thread::spawn(move || {
            let got = cs.acquire_timeout(1, LONG);
            tx.send(()).unwrap();
            got
        })
    };
    wait_until(LONG, "the counting waiter queues", || {
        cs.queue_len().unwrap() == 1
    });
    cs.release(1).expect("counting release");
    rx.recv_timeout(LONG).expect("the counting waiter is woken");
    assert!(waiter.join().unwrap().expect("counting acquire_timeout"));
    cs.release(1).unwrap();
    assert_eq!(cs.drain_permits().expect("drain_permits"), 1);

    let stats = client.stats();
    assert!(stats.acquired >= 4, "{stats:?}");
    assert!(stats.waits >= 1, "{stats:?}");
}

/// Asserts that `r` failed with `Error::Timeout` naming `operation` and semaphore
/// `name`, in its fields and its message.
pub fn assert_timeout<T: std::fmt::Debug>(
    r: Result<T, redis_semaphore::Error>,
    operation: &str,
    name: &str,
) {
    match r {
        Err(e @ redis_semaphore::Error::Timeout { .. }) => {
            let redis_semaphore::Error::Timeout {
                operation: op,
                name: n,
                ..
            } = &e
            else {
                unreachable!()
            };
            assert_eq!(*op, operation, "{e}");
            assert_eq!(n, name, "{e}");
            assert!(e.to_string().contains(operation), "{e}");
        }
        other => panic!("{operation} through a cut: {other:?}"),
    }
}

/// A server stopped by [`RedisServer::pause`]; dropping it lets the server run again.
pub struct Paused(i32);

impl Drop for Paused {
    fn drop(&mut self) {
        // SAFETY: as in `RedisServer::pause`
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// A private server behind a [`Proxy`] (for network faults), and a client through the
/// proxy whose operation timeout is `op`.
pub fn proxied(op: Duration) -> (RedisServer, Proxy, redis_semaphore::Client) {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = redis_semaphore::Client::builder()
        .operation_timeout(op)
        .build(proxy.url())
        .unwrap();
    (server, proxy, client)
}

/// The waiter ids in the queue of semaphore `name`, read directly (a `~` sentinel
/// member, which older versions kept there, left out).
pub fn queued_ids(conn: &mut redis::Connection, name: &str) -> Vec<String> {
    let ids: Vec<String> = redis::cmd("ZRANGE")
        .arg(format!("redsem:{{{name}}}:q"))
        .arg(0)
        .arg(-1)
        .query(conn)
        .unwrap();
    ids.into_iter().filter(|id| id != "~").collect()
}

/// How many of this process's threads are the library's (named `redsem-*`).
pub fn library_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("redsem-"))
        .count()
}

/// A private server whose `key` holds bytes that are not UTF-8, and a client of one
/// connection to it (a connection a bad reply left unusable would be the one every
/// later call gets).
pub fn non_utf8_at(key: &str) -> (RedisServer, redis_semaphore::Client) {
    let server = RedisServer::start();
    redis::cmd("SET")
        .arg(key)
        .arg(b"\xff\xfe7".as_slice())
        .exec(&mut server.conn())
        .unwrap();
    let client = redis_semaphore::Client::builder()
        .max_connections(1)
        .build(server.url())
        .unwrap();
    (server, client)
}

/// The channel of the wake-up listener of the one client of the server `conn` is
/// connected to, once it is subscribed.
pub fn listener_channel(conn: &mut redis::Connection) -> String {
    wait_for(Duration::from_secs(5), "the listener subscribed", || {
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .arg("redsem:c:*")
            .query(conn)
            .unwrap();
        channels.into_iter().next()
    })
}

/// Starts the wake-up listener of `sem`'s client: a wait that gives up after 100 ms
/// (its one permit held).
pub fn start_listener(sem: &redis_semaphore::Semaphore) {
    assert!(
        sem.acquire_timeout(Duration::from_millis(100))
            .unwrap()
            .is_none(),
        "the semaphore's permit is held"
    );
}

/// A port where something else than Redis answers (an HTTP server): every connection
/// gets an HTTP error reply to whatever it sends, as a web server's does.
pub fn http_server_port() -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                while matches!(stream.read(&mut buf), Ok(n) if n > 0) {
                    let reply = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
                    if stream.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}
