//! A private Redis Cluster: three primaries and three replicas, each a `RedisServer` of
//! this harness (free loopback ports whose bus twin `port + 10000` was free too), joined
//! with `redis-cli --cluster create`. Killed with its servers when dropped.

use std::ffi::OsStr;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{RedisServer, wait_until};

/// How long the cluster may take to agree on its slots, or on a failover.
const CLUSTER_DEADLINE: Duration = Duration::from_secs(30);

/// A 3-primary, 3-replica cluster (`cluster-node-timeout` 1000 ms).
pub struct RedisCluster {
    /// The six nodes; which are primaries changes with failovers.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        Self::start_with_env(|_| Vec::new())
    }

    /// [`start`](Self::start), node `k` (0..6) with the environment variables `env(k)`
    /// (the first three are made primaries: `redis-cli --cluster create` takes them so
    /// on one host).
    pub fn start_with_env(env: impl Fn(usize) -> Vec<(String, String)>) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..6)
            .map(|k| {
                RedisServer::start_with_env(
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "1000",
                        // replicas sync at once (the default waits 5 s for more replicas)
                        "--repl-diskless-sync-delay",
                        "0",
                    ],
                    &env(k),
                )
            })
            .collect();
        let ports: Vec<u16> = nodes.iter().map(RedisServer::port).collect();
        create(&ports, &[]);
        let cluster = RedisCluster { nodes };
        cluster.wait_healthy();
        cluster
    }

    /// `redis+cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        seed_url("redis+cluster", self.nodes.iter().map(RedisServer::port))
    }

    /// Waits until every running node says `cluster_state:ok` (every slot served) and
    /// every running replica's link to its primary is up.
    pub fn wait_healthy(&self) {
        wait_until(
            CLUSTER_DEADLINE,
            "the cluster to be ok and its replicas in sync",
            || self.running().all(|n| node_healthy(&mut n.conn())),
        );
    }

    fn running(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|n| n.pid().is_some())
    }

    /// The index in `nodes` of the primary serving `key`'s slot, as the running
    /// nodes see it.
    pub fn primary_of(&self, key: &str) -> usize {
        let any = self.running().next().expect("a running node");
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut any.conn())
            .expect("CLUSTER KEYSLOT");
        let ranges: Vec<redis::Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut any.conn())
            .expect("CLUSTER SLOTS");
        for range in ranges {
            let redis::Value::Array(parts) = range else {
                continue;
            };
            let start: u16 = redis::from_redis_value(parts[0].clone()).unwrap();
            let end: u16 = redis::from_redis_value(parts[1].clone()).unwrap();
            if (start..=end).contains(&slot) {
                let redis::Value::Array(node) = parts[2].clone() else {
                    panic!("CLUSTER SLOTS: bad node");
                };
                let port: u16 = redis::from_redis_value(node[1].clone()).unwrap();
                return self
                    .nodes
                    .iter()
                    .position(|n| n.port() == port)
                    .expect("a node of ours");
            }
        }
        panic!("slot {slot} not served");
    }

    /// Kills node `k` (SIGKILL) and waits until the cluster has promoted a replica in
    /// its place and is ok again on every running node.
    pub fn kill_and_wait_failover(&mut self, k: usize) {
        let dead = self.nodes[k].port();
        self.nodes[k].stop();
        let served_elsewhere = || {
            self.running().all(|n| {
                let mut c = n.conn();
                let ok = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query::<String>(&mut c)
                    .is_ok_and(|i| i.contains("cluster_state:ok"));
                let slots: redis::RedisResult<Vec<redis::Value>> =
                    redis::cmd("CLUSTER").arg("SLOTS").query(&mut c);
                ok && slots.is_ok_and(|ranges| {
                    !ranges.iter().any(|r| match r {
                        redis::Value::Array(parts) => match parts.get(2) {
                            Some(redis::Value::Array(node)) => node
                                .get(1)
                                .is_some_and(|p| *p == redis::Value::Int(i64::from(dead))),
                            _ => false,
                        },
                        _ => false,
                    })
                })
            })
        };
        let deadline = std::time::Instant::now() + CLUSTER_DEADLINE;
        while !served_elsewhere() {
            if std::time::Instant::now() > deadline {
                let any = self.running().next().expect("a running node");
                let nodes: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query(&mut any.conn())
                    .unwrap_or_default();
                panic!(
                    "no replica took over the slots of the killed primary (port {dead}) \
                     within {CLUSTER_DEADLINE:?}; CLUSTER NODES:\n{nodes}"
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Joins the nodes on `ports` (six) into three primaries with a replica each, with
/// `redis-cli --cluster create`; `cli` goes before it (the TLS options).
pub(crate) fn create(ports: &[u16], cli: &[&OsStr]) {
    let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let out = Command::new("redis-cli")
        .args(cli)
        .arg("--cluster")
        .arg("create")
        .args(&addrs)
        .args(["--cluster-replicas", "1", "--cluster-yes"])
        .stdin(Stdio::null())
        .output()
        .expect("run redis-cli --cluster create (install redis-tools)");
    assert!(
        out.status.success(),
        "redis-cli {cli:?} --cluster create failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `scheme://127.0.0.1:P1,...` with every port as a seed.
pub(crate) fn seed_url(scheme: &str, ports: impl Iterator<Item = u16>) -> String {
    let hosts: Vec<String> = ports.map(|p| format!("127.0.0.1:{p}")).collect();
    format!("{scheme}://{}", hosts.join(","))
}

/// Whether a node says `cluster_state:ok` and, if it is a replica, its link to its
/// primary is up.
pub(crate) fn node_healthy(c: &mut redis::Connection) -> bool {
    let ok = redis::cmd("CLUSTER")
        .arg("INFO")
        .query::<String>(c)
        .is_ok_and(|i| i.contains("cluster_state:ok"));
    let synced = redis::cmd("INFO")
        .arg("replication")
        .query::<String>(c)
        .is_ok_and(|i| i.contains("role:master") || i.contains("master_link_status:up"));
    ok && synced
}
