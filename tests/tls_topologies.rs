//! TLS with Sentinel and Redis Cluster (feature `tls-rustls` or `tls-native-tls`;
//! scripts/test.sh runs both): `rediss+sentinel://` against sentinels and data nodes that
//! speak mutual TLS (every operation, a waiter woken by a release, a forced failover
//! followed by the same `Client`), `rediss+cluster://` against a 3-primary, 3-replica
//! cluster with `tls-cluster yes` (every operation, semaphores spread over the slots,
//! `list_semaphores`, a woken waiter), and clear errors naming TLS for a wrong CA.
//! The servers are started by the test on free loopback ports (tests/support/tls_topologies.rs).
#![cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]

mod support;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redis_semaphore::{Client, ClientBuilder, Error};
use support::tls_topologies::{TlsSentinelSet, other_ca};
use support::{TlsCerts, every_operation, keys, wait_for, wait_until};

const LONG: Duration = Duration::from_secs(20);

/// Mutual TLS with the test CA and the client certificate.
fn mtls() -> ClientBuilder {
    let certs = TlsCerts::get();
    Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .checkout_timeout(Duration::from_secs(5))
        .tls_ca_file(&certs.ca)
        .tls_client_cert(&certs.client_cert, &certs.client_key)
}

fn connect_error(e: Error) -> (String, String) {
    match e {
        Error::Connect { addr, message } => (addr, message),
        other => panic!("expected Error::Connect, got {other:?}"),
    }
}

/// A limit-1 semaphore held by one permit, a second acquire blocked on it, woken by the
/// release within about a round trip (well under the bounded re-check).
fn woken_waiter(client: &Client, name: &str) {
    let sem = client.semaphore(name, 1).expect("semaphore");
    let held = sem.acquire().expect("acquire");
    let (tx, rx) = mpsc::channel();
    let waiter = {
        let sem = sem.clone();
        thread::spawn(move || {
            let p = sem.acquire_timeout(LONG);
            tx.send(Instant::now()).unwrap();
            p
        })
    };
    wait_until(LONG, "the waiter queues", || sem.queue_len().unwrap() == 1);
    let released = Instant::now();
    held.release().expect("release");
    let woken = rx.recv_timeout(LONG).expect("the waiter is woken");
    let p = waiter
        .join()
        .unwrap()
        .expect("acquire_timeout")
        .expect("granted by the release");
    let took = woken.duration_since(released);
    assert!(took < Duration::from_millis(900), "woken after {took:?}");
    p.release().expect("release the woken permit");
}

#[test]
fn rediss_sentinel_runs_every_operation_and_follows_a_failover() {
    let set = TlsSentinelSet::start();
    let client = mtls().build(set.url()).expect("build");
    every_operation(&client, "tls-sentinel");
    woken_waiter(&client, "tls-sentinel:woken");

    // a wrong CA: a clear Error::Connect naming TLS and the service, never the password
    let url = format!(
        "rediss+sentinel://app:secret@{}/{}",
        set.sentinel_hosts(),
        support::sentinel::SERVICE
    );
    let wrong = Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .checkout_timeout(Duration::from_secs(5))
        .tls_ca_file(other_ca())
        .build(&url)
        .unwrap();
    let err = wrong.ping().unwrap_err();
    let text = err.to_string();
    eprintln!("wrong CA: {text}");
    assert!(!err.is_retryable(), "{err:?}");
    assert!(!text.contains("secret"), "{text}");
    let (addr, message) = connect_error(err);
    assert!(addr.contains("svc"), "{addr}");
    assert!(message.contains("TLS"), "{message}");
    assert!(message.to_lowercase().contains("certificate"), "{message}");

    // the plaintext form against the TLS sentinels names TLS too
    let plain = Client::builder()
        .connect_timeout(Duration::from_millis(500))
        .checkout_timeout(Duration::from_secs(2))
        .build(format!(
            "redis+sentinel://{}/{}",
            set.sentinel_hosts(),
            support::sentinel::SERVICE
        ))
        .unwrap();
    let err = plain.ping().unwrap_err();
    eprintln!("plaintext URL against TLS sentinels: {err}");
    let (_, message) = connect_error(err);
    assert!(message.contains("TLS"), "{message}");

    // a forced failover, followed by the same client
    let sem = client.semaphore("tls-sentinel:failover", 2).unwrap();
    let before = sem.acquire().expect("acquire before the failover");
    let (old, new) = set.failover();
    eprintln!("failover: {old} -> {new}");
    let after = wait_for(LONG, "an acquire on the new primary", || {
        match sem.try_acquire() {
            Ok(Some(p)) => Some(p),
            Ok(None) => panic!("the limit is 2 and one permit is held"),
            Err(e) => {
                eprintln!("during the switch: {e}");
                None
            }
        }
    });
    let mut conn = set.node(new).server.conn();
    assert!(
        !keys(&mut conn, "redsem:{tls-sentinel:failover}*").is_empty(),
        "the grant is on the new primary"
    );
    after.release().expect("release after the failover");
    drop(before);
    woken_waiter(&client, "tls-sentinel:woken-after-failover");
    client.ping().unwrap();
}

#[test]
fn tls_files_with_plaintext_topology_urls_are_refused() {
    let certs = TlsCerts::get();
    for url in [
        "redis+sentinel://u:secret@127.0.0.1:1/svc",
        "redis+cluster://u:secret@127.0.0.1:1",
    ] {
        let err = Client::builder()
            .tls_ca_file(&certs.ca)
            .build(url)
            .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        assert!(text.contains("rediss+"), "{text}");
        assert!(!text.contains("secret"), "{text}");
    }
    // an unreadable file is named, for both topologies
    for url in [
        "rediss+sentinel://127.0.0.1:1/svc",
        "rediss+cluster://127.0.0.1:1",
    ] {
        let err = Client::builder()
            .tls_ca_file("/nonexistent/ca.crt")
            .build(url)
            .unwrap_err();
        assert!(err.to_string().contains("/nonexistent/ca.crt"), "{err}");
    }
}

#[cfg(feature = "tls-rustls")]
#[test]
fn rediss_cluster_runs_every_operation_over_the_slots() {
    use support::tls_topologies::TlsCluster;

    let cluster = TlsCluster::start();
    let client = mtls().build(cluster.url()).expect("build");
    every_operation(&client, "tls-cluster");
    woken_waiter(&client, "tls-cluster:woken");

    // semaphores spread over the slots: every primary holds some
    let sems: Vec<_> = (0..30)
        .map(|i| client.semaphore(&format!("spread:{i}"), 2).unwrap())
        .collect();
    let permits: Vec<_> = sems.iter().map(|s| s.acquire().expect("acquire")).collect();
    for p in cluster.primaries() {
        let found = keys(&mut p.server.conn(), "redsem:{spread:*");
        assert!(!found.is_empty(), "primary {} holds none", p.tls_port);
    }
    let names = client.list_semaphores("spread:*").expect("list_semaphores");
    let mut want: Vec<String> = (0..30).map(|i| format!("spread:{i}")).collect();
    want.sort();
    assert_eq!(names, want);
    for s in &sems {
        assert_eq!(s.available().unwrap(), 1);
    }
    for p in permits {
        p.release().expect("release");
    }
    for s in &sems {
        assert_eq!(s.available().unwrap(), 2);
    }

    // a wrong CA: a clear Error::Connect naming TLS and the cluster
    let wrong = Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .checkout_timeout(Duration::from_secs(5))
        .tls_ca_file(other_ca())
        .build(cluster.url())
        .unwrap();
    let err = wrong.ping().unwrap_err();
    eprintln!("wrong CA: {err}");
    let (addr, message) = connect_error(err);
    assert!(addr.contains("cluster"), "{addr}");
    assert!(message.contains("TLS"), "{message}");
}

#[cfg(not(feature = "tls-rustls"))]
#[test]
fn cluster_certificate_files_need_rustls() {
    let err = Client::builder()
        .tls_ca_file(&TlsCerts::get().ca)
        .build("rediss+cluster://u:secret@127.0.0.1:1")
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(text.contains("tls-rustls"), "{text}");
    assert!(!text.contains("secret"), "{text}");
}
