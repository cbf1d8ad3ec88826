//! TLS topologies for the tests: a Sentinel set whose sentinels and data nodes speak TLS
//! (mutual TLS, `tls-replication yes`), and a Redis Cluster of three primaries and three
//! replicas with `tls-cluster yes` and `tls-replication yes`. Certificates are the test
//! binary's [`TlsCerts`]; every process runs on free loopback ports in its own
//! temporary folder and is killed when its set is dropped.
//!
//! Each process keeps its plaintext port too: the harness uses it to see that the
//! process is up and for assertions. Everything the processes say to each other
//! (replication, the sentinels' links and hellos, the cluster bus) goes over TLS, and
//! the addresses they hand out to TLS clients (the primary a sentinel names, the nodes
//! of `CLUSTER SLOTS`) are TLS ports, so a client given only TLS ports never touches a
//! plaintext one.
//!
//! Waiting is done with deadlines, never with sleeps that must be long enough.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::cluster;
use super::sentinel::{SERVICE, Sentinel, wait_settled};
use super::{RedisServer, TlsCerts, info_field, pick_port, wait_until};

/// How long a set may take to settle (replicas in sync, sentinels knowing each other,
/// every slot served).
const SETTLE_DEADLINE: Duration = Duration::from_secs(40);
/// How long a forced failover may take until every sentinel names the new primary.
const FAILOVER_DEADLINE: Duration = Duration::from_secs(40);

/// The TLS arguments of a data node (mutual TLS: `tls-auth-clients yes`; replicas and
/// sentinels present the server certificate as their client certificate).
fn tls_args(certs: &TlsCerts, tls_port: u16) -> Vec<String> {
    [
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        certs.server_cert.to_str().unwrap(),
        "--tls-key-file",
        certs.server_key.to_str().unwrap(),
        "--tls-ca-cert-file",
        certs.ca.to_str().unwrap(),
        "--tls-auth-clients",
        "yes",
        "--tls-replication",
        "yes",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn start_node(tls_port: u16, extra: &[&str]) -> RedisServer {
    let mut args = tls_args(TlsCerts::get(), tls_port);
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    RedisServer::start_with(&args)
}

/// A data node with its TLS port.
pub struct TlsNode {
    pub server: RedisServer,
    pub tls_port: u16,
}

/// One TLS sentinel: its process (plaintext port for the harness) and its TLS port.
pub struct TlsSentinel {
    pub sentinel: Sentinel,
    pub tls_port: u16,
}

/// A primary, one replica and three sentinels, all speaking TLS to each other and to
/// clients, monitoring the primary's TLS port as [`SERVICE`].
pub struct TlsSentinelSet {
    /// The two data nodes (the first started as the primary; roles swap on failover).
    pub nodes: Vec<TlsNode>,
    pub sentinels: Vec<TlsSentinel>,
}

impl TlsSentinelSet {
    /// Starts everything and waits until every sentinel knows the replica and the two
    /// other sentinels (over TLS: they find each other through hellos on the primary).
    pub fn start() -> TlsSentinelSet {
        let certs = TlsCerts::get();
        let p_tls = pick_port();
        let primary = start_node(p_tls, &["--repl-diskless-sync-delay", "0"]);
        let r_tls = pick_port();
        let p_tls_s = p_tls.to_string();
        let replica = start_node(
            r_tls,
            &[
                "--replicaof",
                "127.0.0.1",
                &p_tls_s,
                "--repl-diskless-sync-delay",
                "0",
            ],
        );
        let mut r = replica.conn();
        wait_until(
            SETTLE_DEADLINE,
            "the replica's TLS link to the primary",
            || {
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query(&mut r)
                    .unwrap_or_default();
                info_field(&info, "master_link_status") == Some("up")
            },
        );
        let sentinels: Vec<TlsSentinel> = (0..3)
            .map(|_| {
                let tls_port = pick_port();
                let lines = [
                    format!("tls-port {tls_port}"),
                    format!("tls-cert-file {}", certs.server_cert.display()),
                    format!("tls-key-file {}", certs.server_key.display()),
                    format!("tls-ca-cert-file {}", certs.ca.display()),
                    "tls-auth-clients yes".to_owned(),
                    "tls-replication yes".to_owned(),
                ];
                let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
                TlsSentinel {
                    sentinel: Sentinel::start(p_tls, &lines),
                    tls_port,
                }
            })
            .collect();
        let set = TlsSentinelSet {
            nodes: vec![
                TlsNode {
                    server: primary,
                    tls_port: p_tls,
                },
                TlsNode {
                    server: replica,
                    tls_port: r_tls,
                },
            ],
            sentinels,
        };
        for s in &set.sentinels {
            wait_settled(&mut s.sentinel.conn(), SETTLE_DEADLINE);
        }
        set
    }

    /// `rediss+sentinel://127.0.0.1:T1,127.0.0.1:T2,127.0.0.1:T3/svc` (TLS ports).
    pub fn url(&self) -> String {
        format!("rediss+sentinel://{}/{SERVICE}", self.sentinel_hosts())
    }

    /// The sentinels' TLS ports as `127.0.0.1:T1,...`.
    pub fn sentinel_hosts(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.tls_port))
            .collect();
        hosts.join(",")
    }

    /// The primary's (TLS) port as the first sentinel names it now.
    pub fn primary_tls_port(&self) -> u16 {
        let (_, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(SERVICE)
            .query(&mut self.sentinels[0].sentinel.conn())
            .expect("SENTINEL GET-MASTER-ADDR-BY-NAME");
        port
    }

    /// The data node whose TLS port is `tls_port`.
    pub fn node(&self, tls_port: u16) -> &TlsNode {
        self.nodes
            .iter()
            .find(|n| n.tls_port == tls_port)
            .unwrap_or_else(|| panic!("no data node on TLS port {tls_port}"))
    }

    /// Forces a failover (`SENTINEL FAILOVER svc`, retried while the sentinel refuses)
    /// and waits until every sentinel names the other node. Returns (old, new) TLS ports.
    pub fn failover(&self) -> (u16, u16) {
        let old = self.primary_tls_port();
        let new = self
            .nodes
            .iter()
            .find(|n| n.tls_port != old)
            .expect("two data nodes")
            .tls_port;
        let mut c = self.sentinels[0].sentinel.conn();
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
                    // the sentinel refuses until it has checked the replica: wait for
                    // that, bounded by the deadline
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!(
                    "SENTINEL FAILOVER: {e}\n{}",
                    self.sentinels[0].sentinel.log()
                ),
            }
        }
        for s in &self.sentinels {
            let mut c = s.sentinel.conn();
            wait_until(
                FAILOVER_DEADLINE,
                "every TLS sentinel naming the new primary",
                || {
                    let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
                        .arg("GET-MASTER-ADDR-BY-NAME")
                        .arg(SERVICE)
                        .query(&mut c)
                        .ok()
                        .flatten();
                    addr.is_some_and(|(_, p)| p == new)
                },
            );
        }
        (old, new)
    }
}

/// A 3-primary, 3-replica cluster (`cluster-node-timeout` 1000 ms) whose bus and
/// replication run over TLS, joined with `redis-cli --tls --cluster create` on the
/// TLS ports.
pub struct TlsCluster {
    pub nodes: Vec<TlsNode>,
}

impl TlsCluster {
    pub fn start() -> TlsCluster {
        let nodes: Vec<TlsNode> = (0..6)
            .map(|_| {
                // pick_port reserves `port + 10000` too: the TLS bus port is free
                let tls_port = pick_port();
                let server = start_node(
                    tls_port,
                    &[
                        "--tls-cluster",
                        "yes",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "1000",
                        "--repl-diskless-sync-delay",
                        "0",
                    ],
                );
                TlsNode { server, tls_port }
            })
            .collect();
        let certs = TlsCerts::get();
        let ports: Vec<u16> = nodes.iter().map(|n| n.tls_port).collect();
        cluster::create(
            &ports,
            &[
                "--tls".as_ref(),
                "--cacert".as_ref(),
                certs.ca.as_os_str(),
                "--cert".as_ref(),
                certs.client_cert.as_os_str(),
                "--key".as_ref(),
                certs.client_key.as_os_str(),
            ],
        );
        let cluster = TlsCluster { nodes };
        cluster.wait_healthy();
        cluster
    }

    /// `rediss+cluster://127.0.0.1:T1,...` with every node's TLS port as a seed.
    pub fn url(&self) -> String {
        cluster::seed_url("rediss+cluster", self.nodes.iter().map(|n| n.tls_port))
    }

    /// Waits until every node says `cluster_state:ok` and every replica's (TLS) link to
    /// its primary is up.
    pub fn wait_healthy(&self) {
        wait_until(
            SETTLE_DEADLINE,
            "the TLS cluster to be ok and its replicas in sync",
            || {
                self.nodes
                    .iter()
                    .all(|n| cluster::node_healthy(&mut n.server.conn()))
            },
        );
    }

    /// The nodes that are primaries now.
    pub fn primaries(&self) -> Vec<&TlsNode> {
        self.nodes
            .iter()
            .filter(|n| {
                redis::cmd("INFO")
                    .arg("replication")
                    .query::<String>(&mut n.server.conn())
                    .is_ok_and(|i| i.contains("role:master"))
            })
            .collect()
    }
}

/// A second certificate authority, which signed nothing the servers use: a client that
/// trusts only it must refuse every server of the tests.
pub fn other_ca() -> PathBuf {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("redsem-other-ca-")
            .tempdir()
            .expect("create a temporary folder for a second CA");
        for args in [
            &["genrsa", "-out", "other.key", "2048"][..],
            &[
                "req",
                "-x509",
                "-new",
                "-nodes",
                "-sha256",
                "-key",
                "other.key",
                "-days",
                "3650",
                "-subj",
                "/CN=redsem other CA",
                "-out",
                "other.crt",
            ][..],
        ] {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .output()
                .expect("run openssl");
            assert!(
                out.status.success(),
                "openssl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        dir
    });
    dir.path().join("other.crt")
}
