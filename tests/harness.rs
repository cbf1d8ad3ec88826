//! Self test of the test harness in `tests/support`.

mod support;

use std::cell::Cell;
use std::time::{Duration, Instant};

use support::{RedisServer, command_calls, keys, wait_for, wait_until};

fn ping(server: &RedisServer) -> String {
    redis::cmd("PING").query(&mut server.conn()).expect("PING")
}

#[test]
fn two_servers_restart_and_helpers() {
    let a = RedisServer::start();
    let mut b = RedisServer::start();
    assert_ne!(a.port(), b.port());
    for s in [&a, &b] {
        assert_ne!(s.port(), 6379, "must never use the system Redis port");
        assert_eq!(s.url(), format!("redis://127.0.0.1:{}/", s.port()));
        assert_eq!(ping(s), "PONG");
    }

    // SET on b, restart b: same port, empty, and a untouched.
    let mut cb = b.conn();
    redis::cmd("SET")
        .arg("redsem:probe")
        .arg("1")
        .exec(&mut cb)
        .unwrap();
    let mut ca = a.conn();
    redis::cmd("SET")
        .arg("redsem:other")
        .arg("1")
        .exec(&mut ca)
        .unwrap();
    assert_eq!(keys(&mut cb, "redsem:*"), vec!["redsem:probe".to_string()]);
    let calls = command_calls(&mut cb);
    assert_eq!(calls.get("set"), Some(&1), "{calls:?}");
    assert!(calls.contains_key("info"), "{calls:?}");

    let port = b.port();
    let pid = b.pid();
    b.restart();
    assert_eq!(b.port(), port);
    assert_ne!(b.pid(), pid);
    let mut cb = b.conn();
    let exists: bool = redis::cmd("EXISTS")
        .arg("redsem:probe")
        .query(&mut cb)
        .unwrap();
    assert!(!exists, "restart must come back empty");
    let dbsize: u64 = redis::cmd("DBSIZE").query(&mut cb).unwrap();
    assert_eq!(dbsize, 0);
    assert!(!command_calls(&mut cb).contains_key("set"));
    assert_eq!(keys(&mut ca, "redsem:*"), vec!["redsem:other".to_string()]);

    // DEBUG is enabled (fault injection).
    redis::cmd("DEBUG")
        .arg("SLEEP")
        .arg(0)
        .exec(&mut cb)
        .expect("DEBUG SLEEP 0");

    // stop is idempotent; restart works after stop.
    b.stop();
    b.stop();
    assert!(b.pid().is_none());
    assert!(
        redis::Client::open(b.url())
            .unwrap()
            .get_connection()
            .is_err()
    );
    b.restart();
    assert_eq!(ping(&b), "PONG");
    assert!(b.log().contains("Ready to accept connections"));
}

#[test]
fn keys_scans_everything() {
    let s = RedisServer::start();
    let mut c = s.conn();
    let mut pipe = redis::pipe();
    for i in 0..2500 {
        pipe.cmd("SET").arg(format!("k:{i}")).arg(i).ignore();
    }
    pipe.cmd("SET").arg("other").arg(0).ignore();
    pipe.exec(&mut c).unwrap();
    let found = keys(&mut c, "k:*");
    assert_eq!(found.len(), 2500);
    assert!(keys(&mut c, "none:*").is_empty());
}

#[test]
fn start_with_extra_args() {
    let mut s = RedisServer::start_with(&["--maxmemory", "12mb"]);
    let get = |s: &RedisServer| -> Vec<String> {
        redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory")
            .query(&mut s.conn())
            .unwrap()
    };
    assert_eq!(get(&s), vec!["maxmemory", &(12 * 1024 * 1024).to_string()]);
    s.restart();
    assert_eq!(get(&s), vec!["maxmemory", &(12 * 1024 * 1024).to_string()]);
}

#[test]
fn wait_helpers() {
    let n = Cell::new(0);
    wait_until(Duration::from_secs(5), "counter reaches 3", || {
        n.set(n.get() + 1);
        n.get() >= 3
    });
    assert_eq!(n.get(), 3);

    let t0 = Instant::now();
    let v = wait_for(Duration::from_secs(5), "20 ms to pass", || {
        (t0.elapsed() >= Duration::from_millis(20)).then_some(42)
    });
    assert_eq!(v, 42);

    let t0 = Instant::now();
    let r = std::panic::catch_unwind(|| {
        wait_until(
            Duration::from_millis(50),
            "something that never happens",
            || false,
        )
    });
    let msg = *r.unwrap_err().downcast::<String>().unwrap();
    assert!(msg.contains("something that never happens"), "{msg}");
    assert!(t0.elapsed() >= Duration::from_millis(50));
}
