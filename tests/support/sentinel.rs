//! A Sentinel set-up for the tests: a primary, one replica and three sentinels
//! (`redis-server sentinel.conf --sentinel`, quorum 2, down-after 1000 ms), all on free
//! loopback ports in temporary folders, killed when the [`SentinelSet`] is dropped.
//! Waiting is done with deadlines, never with sleeps that must be long enough.

use std::fs::{self, File};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::{
    Paused, READY_DEADLINE, RedisServer, info_field, pick_port, read_or_empty,
    scrubbed_faketime_env, wait_until,
};

/// The service name the sentinels monitor.
pub const SERVICE: &str = "svc";
/// How long the sentinels may take to see the primary, the replica and each other.
const SETTLE_DEADLINE: Duration = Duration::from_secs(30);
/// How long a forced failover may take until every sentinel names the new primary.
const FAILOVER_DEADLINE: Duration = Duration::from_secs(30);

/// One sentinel process.
pub struct Sentinel {
    child: Option<Child>,
    port: u16,
    /// From a `requirepass` line of its configuration.
    password: Option<String>,
    // Declared last: dropped after the child is killed.
    dir: tempfile::TempDir,
}

impl Sentinel {
    /// Starts a sentinel monitoring `SERVICE` at `127.0.0.1:primary`, with `extra`
    /// configuration lines (e.g. `requirepass x`, `sentinel auth-pass svc y`).
    pub fn start(primary: u16, extra: &[&str]) -> Sentinel {
        let (dir, password) = Self::prepare(extra);
        let mut failures = Vec::new();
        for _ in 0..5 {
            let port = pick_port();
            match Self::spawn(dir.path(), port, primary, extra, password.as_deref()) {
                Ok(child) => {
                    return Sentinel {
                        child: Some(child),
                        port,
                        password,
                        dir,
                    };
                }
                Err((true, msg)) => failures.push(msg),
                Err((false, msg)) => panic!("{msg}"),
            }
        }
        panic!("sentinel did not start:\n{}", failures.join("\n---\n"));
    }

    /// Like [`start`](Self::start), on `port` (from [`pick_port`], for a URL made
    /// before the sentinel starts); panics when it cannot start there.
    pub fn start_on(port: u16, primary: u16, extra: &[&str]) -> Sentinel {
        let (dir, password) = Self::prepare(extra);
        match Self::spawn(dir.path(), port, primary, extra, password.as_deref()) {
            Ok(child) => Sentinel {
                child: Some(child),
                port,
                password,
                dir,
            },
            Err((_, msg)) => panic!("sentinel did not start on port {port}: {msg}"),
        }
    }

    /// A temporary folder for a sentinel, and the password of a `requirepass` line of
    /// `extra`.
    fn prepare(extra: &[&str]) -> (tempfile::TempDir, Option<String>) {
        let dir = tempfile::Builder::new()
            .prefix("redsem-sentinel-")
            .tempdir()
            .expect("create a temporary folder for a sentinel");
        let password = extra
            .iter()
            .find_map(|l| l.strip_prefix("requirepass "))
            .map(|p| p.trim().to_owned());
        (dir, password)
    }

    /// Spawns on `port`; `Err((true, ..))` when the port was taken (worth another try).
    fn spawn(
        dir: &Path,
        port: u16,
        primary: u16,
        extra: &[&str],
        password: Option<&str>,
    ) -> Result<Child, (bool, String)> {
        let conf = dir.join("sentinel.conf");
        let mut text = format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {dir}/sentinel.log\n\
             sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n\
             sentinel down-after-milliseconds {SERVICE} 1000\n\
             sentinel failover-timeout {SERVICE} 5000\n\
             sentinel parallel-syncs {SERVICE} 1\n",
            dir = dir.display()
        );
        for line in extra {
            text.push_str(line);
            text.push('\n');
        }
        fs::write(&conf, text).expect("write sentinel.conf");
        let out = File::options()
            .create(true)
            .append(true)
            .open(dir.join("stdout.log"))
            .expect("open stdout.log");
        let err = out.try_clone().expect("clone stdout.log handle");
        let bin = std::env::var_os("REDIS_SERVER_BIN").unwrap_or_else(|| "redis-server".into());
        let mut child = Command::new(&bin)
            .arg(&conf)
            .arg("--sentinel")
            .envs(scrubbed_faketime_env())
            .env_remove("FAKETIME")
            .env_remove("FAKETIME_DONT_FAKE_MONOTONIC")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| (false, format!("cannot run {bin:?} --sentinel: {e}")))?;
        let deadline = Instant::now() + READY_DEADLINE;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                let log = read_or_empty(&dir.join("sentinel.log"))
                    + &read_or_empty(&dir.join("stdout.log"));
                return Err((
                    log.contains("Address already in use"),
                    format!("sentinel on port {port} exited with {status}; log:\n{log}"),
                ));
            }
            if answers(port) {
                break;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err((false, format!("sentinel on port {port} not ready")));
            }
            thread::sleep(Duration::from_millis(2));
        }
        // make sure our child answers, not a foreign process that took the port
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut sentinel_conn(port, password))
            .map_err(|e| (false, format!("INFO server on sentinel {port}: {e}")))?;
        let pid = info_field(&info, "process_id").and_then(|v| v.parse::<u32>().ok());
        if pid != Some(child.id()) {
            let _ = child.kill();
            let _ = child.wait();
            return Err((true, format!("port {port} is answered by process {pid:?}")));
        }
        Ok(child)
    }

    /// The sentinel's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A direct connection to this sentinel (5 s timeouts).
    pub fn conn(&self) -> redis::Connection {
        sentinel_conn(self.port, self.password.as_deref())
    }

    /// Kills the sentinel (SIGKILL). Does nothing when it is already stopped.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the sentinel with SIGSTOP until the guard is dropped (SIGCONT): the kernel
    /// still accepts connections to it, but nothing is answered, as with a sentinel on
    /// the far side of a partition.
    pub fn pause(&self) -> Paused {
        let pid = self.child.as_ref().expect("a running sentinel").id() as i32;
        // SAFETY: a signal to a child process this test started
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        Paused(pid)
    }

    /// The sentinel's log.
    pub fn log(&self) -> String {
        read_or_empty(&self.dir.path().join("sentinel.log"))
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An inline `PING` over a raw socket: true when anything answers (`+PONG`, or
/// `-NOAUTH` from a sentinel with a password).
fn answers(port: u16) -> bool {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(100)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let _ = s.set_write_timeout(Some(Duration::from_millis(500)));
    let mut buf = [0u8; 1];
    s.write_all(b"PING\r\n").is_ok()
        && s.read_exact(&mut buf).is_ok()
        && matches!(buf[0], b'+' | b'-')
}

fn sentinel_conn(port: u16, password: Option<&str>) -> redis::Connection {
    let t = Duration::from_secs(5);
    let auth = password.map_or(String::new(), |p| format!(":{p}@"));
    let conn = redis::Client::open(format!("redis://{auth}127.0.0.1:{port}/"))
        .expect("sentinel client")
        .get_connection_with_timeout(t)
        .unwrap_or_else(|e| panic!("connect to sentinel {port}: {e}"));
    conn.set_read_timeout(Some(t)).expect("set_read_timeout");
    conn.set_write_timeout(Some(t)).expect("set_write_timeout");
    conn
}

/// What a sentinel says of the service (`SENTINEL MASTER`), as field/value pairs.
pub fn master_fields(conn: &mut redis::Connection) -> Option<Vec<(String, String)>> {
    let flat: Vec<String> = redis::cmd("SENTINEL")
        .arg("MASTER")
        .arg(SERVICE)
        .query(conn)
        .ok()?;
    Some(
        flat.chunks(2)
            .filter_map(|kv| Some((kv.first()?.clone(), kv.get(1)?.clone())))
            .collect(),
    )
}

/// Waits until the sentinel on `c` knows the replica and the two other sentinels.
pub fn wait_settled(c: &mut redis::Connection, deadline: Duration) {
    wait_until(
        deadline,
        "every sentinel knowing the replica and the other sentinels",
        || {
            master_fields(c).is_some_and(|f| {
                field(&f, "num-slaves").is_some_and(|n| n != "0")
                    && field(&f, "num-other-sentinels") == Some("2")
            })
        },
    );
}

/// The value of `name` in [`master_fields`]'s pairs.
pub fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find_map(|(k, v)| (k == name).then_some(v.as_str()))
}

/// A primary, one replica and three sentinels monitoring them as [`SERVICE`].
pub struct SentinelSet {
    /// The two data nodes (the first started as the primary; roles swap on failover).
    pub nodes: Vec<RedisServer>,
    /// The three sentinels.
    pub sentinels: Vec<Sentinel>,
    /// The data nodes' `requirepass` (and the replica's `masterauth`), if any.
    pub data_password: Option<String>,
}

impl SentinelSet {
    /// Starts everything and waits until every sentinel knows the replica and the two
    /// other sentinels (so a failover can run and its news spreads).
    pub fn start() -> SentinelSet {
        Self::start_with(&[], &[])
    }

    /// Like [`start`](Self::start), with extra arguments for both data nodes and extra
    /// configuration lines for the sentinels.
    pub fn start_with(node_args: &[&str], sentinel_conf: &[&str]) -> SentinelSet {
        Self::start_full(node_args, sentinel_conf, None)
    }

    /// Like [`start`](Self::start), with `requirepass password` on both data nodes,
    /// `masterauth password` on the replica and `sentinel auth-pass` on the sentinels.
    /// The password is set with `CONFIG SET` once a node answered (the harness's
    /// readiness check pings without one).
    pub fn start_with_data_password(password: &str) -> SentinelSet {
        Self::start_full(&[], &[], Some(password))
    }

    fn start_full(
        node_args: &[&str],
        sentinel_conf: &[&str],
        password: Option<&str>,
    ) -> SentinelSet {
        let require_pass = |node: &RedisServer| {
            if let Some(pw) = password {
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("requirepass")
                    .arg(pw)
                    .exec(&mut node.conn())
                    .expect("CONFIG SET requirepass");
            }
        };
        let primary = RedisServer::start_with(node_args);
        require_pass(&primary);
        let primary_port = primary.port().to_string();
        let mut replica_args = vec!["--replicaof", "127.0.0.1", &primary_port];
        if let Some(pw) = password {
            replica_args.extend_from_slice(&["--masterauth", pw]);
        }
        replica_args.extend_from_slice(node_args);
        let replica = RedisServer::start_with(&replica_args);
        let mut r = replica.conn();
        wait_until(SETTLE_DEADLINE, "the replica's link to the primary", || {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut r)
                .unwrap_or_default();
            info_field(&info, "master_link_status") == Some("up")
        });
        drop(r);
        require_pass(&replica);
        let auth_pass = password.map(|pw| format!("sentinel auth-pass {SERVICE} {pw}"));
        let mut conf: Vec<&str> = sentinel_conf.to_vec();
        conf.extend(auth_pass.as_deref());
        let sentinels: Vec<Sentinel> = (0..3)
            .map(|_| Sentinel::start(primary.port(), &conf))
            .collect();
        let set = SentinelSet {
            nodes: vec![primary, replica],
            sentinels,
            data_password: password.map(str::to_owned),
        };
        for s in &set.sentinels {
            wait_settled(&mut s.conn(), SETTLE_DEADLINE);
        }
        set
    }

    /// `redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/svc`
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        format!("redis+sentinel://{}/{SERVICE}", hosts.join(","))
    }

    /// The primary's port as the first sentinel names it now.
    pub fn primary_port(&self) -> u16 {
        let (_, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(SERVICE)
            .query(&mut self.sentinels[0].conn())
            .expect("SENTINEL GET-MASTER-ADDR-BY-NAME");
        port
    }

    /// The data node on `port`.
    pub fn node(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no data node on port {port}"))
    }

    /// A direct connection to the data node on `port`, with the data nodes' password
    /// if they have one (5 s timeouts).
    pub fn node_conn(&self, port: u16) -> redis::Connection {
        let node = self.node(port);
        let auth = self
            .data_password
            .as_ref()
            .map_or(String::new(), |p| format!(":{p}@"));
        let t = Duration::from_secs(5);
        let conn = redis::Client::open(format!("redis://{auth}127.0.0.1:{}/", node.port()))
            .expect("data node client")
            .get_connection_with_timeout(t)
            .unwrap_or_else(|e| panic!("connect to data node {port}: {e}"));
        conn.set_read_timeout(Some(t)).expect("set_read_timeout");
        conn.set_write_timeout(Some(t)).expect("set_write_timeout");
        conn
    }

    /// Kills the primary with SIGKILL (a crash, not `SENTINEL FAILOVER`) and returns
    /// at once, with (old primary port, the replica's port). Wait for the promotion
    /// with [`wait_for_primary`](Self::wait_for_primary).
    pub fn kill_primary(&mut self) -> (u16, u16) {
        let old = self.primary_port();
        let new = self.other_node(old).port();
        self.nodes
            .iter_mut()
            .find(|n| n.port() == old)
            .expect("the primary is one of ours")
            .stop();
        (old, new)
    }

    /// The data node that is not on `port`.
    pub fn other_node(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port() != port)
            .expect("two data nodes")
    }

    /// Forces a failover (`SENTINEL FAILOVER svc`, retried while the sentinel refuses,
    /// e.g. before it has checked the replica) and waits until every sentinel names
    /// the new primary. Returns (old primary port, new primary port).
    pub fn failover(&self) -> (u16, u16) {
        let old = self.primary_port();
        let new = self.other_node(old).port();
        let mut c = self.sentinels[0].conn();
        let start = Instant::now();
        loop {
            let r: redis::RedisResult<String> = redis::cmd("SENTINEL")
                .arg("FAILOVER")
                .arg(SERVICE)
                .query(&mut c);
            match r {
                Ok(_) => break,
                Err(e) if start.elapsed() < FAILOVER_DEADLINE => {
                    eprintln!("SENTINEL FAILOVER refused, again: {e}");
                    thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("SENTINEL FAILOVER: {e}\n{}", self.sentinels[0].log()),
            }
        }
        self.wait_for_primary(new);
        (old, new)
    }

    /// Waits until every sentinel names `127.0.0.1:port` as the primary.
    pub fn wait_for_primary(&self, port: u16) {
        for s in &self.sentinels {
            let mut c = s.conn();
            wait_until(
                FAILOVER_DEADLINE,
                "every sentinel naming the new primary",
                || {
                    let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
                        .arg("GET-MASTER-ADDR-BY-NAME")
                        .arg(SERVICE)
                        .query(&mut c)
                        .ok()
                        .flatten();
                    addr.is_some_and(|(_, p)| p == port)
                },
            );
        }
    }
}
