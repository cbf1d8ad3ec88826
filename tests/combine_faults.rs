//! Combined calls (src/combine.rs, the batch script) and wake-ups (src/listener.rs)
//! under faults: lost replies of shared calls, a slow network, batches of any order.
//! Real servers; sleeps only hold a fault or let time pass.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis_semaphore::Client;
use support::{Proxy, RedisServer};

/// The permit ids semaphore `name` holds on the server, read directly.
fn held(conn: &mut redis::Connection, name: &str) -> Vec<String> {
    let ids: Vec<String> = redis::cmd("ZRANGE")
        .arg(format!("redsem:{{{name}}}:h"))
        .arg(0)
        .arg(-1)
        .query(conn)
        .unwrap();
    ids.into_iter()
        .filter(|id| id != "~" && !id.starts_with("w:"))
        .collect()
}

/// Ten threads of one client try and release on a full semaphore (their calls shared),
/// while the connection is cut again and again just as a batch call goes out: its reply
/// never comes, and the operations it carried may or may not have run. Every grant the
/// callers did not learn of, and every release whose outcome they did not learn, is
/// given back by the background thread once the network heals, long before the
/// minute-long lease would have ended.
#[test]
fn batch_calls_whose_replies_are_lost_leave_no_permit_taken() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = Client::builder()
        .max_connections(16)
        .operation_timeout(Duration::from_millis(300))
        .build(proxy.url())
        .unwrap();
    let sem = client
        .semaphore_builder("lost-batches")
        .limit(3)
        .lease(Duration::from_secs(60))
        .build()
        .unwrap();
    drop(sem.try_acquire().unwrap()); // loads the scripts
    let stop = Arc::new(AtomicBool::new(false));
    let granted = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..10)
        .map(|_| {
            let (sem, stop, granted) = (sem.clone(), Arc::clone(&stop), Arc::clone(&granted));
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    if let Ok(Some(p)) = sem.try_acquire() {
                        granted.fetch_add(1, Ordering::SeqCst);
                        let _ = p.release();
                    }
                }
            })
        })
        .collect();
    let batch = support::batch_script().get_hash().to_owned();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(4) {
        proxy.cut_when_sent(batch.as_bytes());
        // (holds the cut, if a batch went out, past the operation timeout)
        std::thread::sleep(Duration::from_millis(400));
        proxy.heal();
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    proxy.heal();
    assert!(
        granted.load(Ordering::SeqCst) > 0,
        "no try was ever granted"
    );
    let mut conn = server.conn();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let still = held(&mut conn, "lost-batches");
        if still.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still held after 20 s: {still:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether `channel` has a subscriber on the server `conn` is connected to.
fn subscribers(conn: &mut redis::Connection, channel: &str) -> i64 {
    let (_, n): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query(conn)
        .unwrap();
    n
}

/// A network whose round trip is longer than the listener's 100 ms read of a message
/// (a server far away, well within the operation timeout): the listener read the
/// `SUBSCRIBE`'s confirmation (and a heartbeat's `PONG`) within those 100 ms too, so it
/// never subscribed: it gave up on every confirmation, dropped the connection and
/// tried again about once a second for ever, while every waiter polled the server
/// every 50 ms. The subscription must come up and stay.
#[test]
fn the_wake_up_listener_subscribes_over_a_network_slower_than_its_poll() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    proxy.delay_replies(Duration::from_millis(250));
    let client = Client::builder()
        .operation_timeout(Duration::from_secs(3))
        .build(proxy.url())
        .unwrap();
    let sem = client
        .semaphore_builder("far")
        .limit(1)
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let _held = sem.try_acquire().unwrap().unwrap();
    // a wait starts the listener
    assert!(
        sem.acquire_timeout(Duration::from_millis(1500))
            .unwrap()
            .is_none()
    );
    let mut conn = server.conn();
    let channel = support::listener_channel(&mut conn);
    // sampled over four seconds (a heartbeat PING included): subscribed each time
    let mut seen = Vec::new();
    for _ in 0..40 {
        seen.push(subscribers(&mut conn, &channel));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        seen.iter().all(|&n| n == 1),
        "subscribers over time: {seen:?}"
    );
}

/// The batch script's operations may come in any order: one ending in a release after
/// an acquire the full logic ran wrote no 'cl' (the limit the last acquiring client
/// passed, `Status::client_limit`): each operation's load cleared what the acquire
/// before it had set, so the batch's one save had none to write.
#[test]
fn a_batch_ending_in_a_full_logic_release_keeps_the_acquires_client_limit() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let batch = support::batch_script();
    let mut inv = support::call_on(&batch, "cl");
    // two permits at once: not plain, so the full logic runs it, then a release
    support::batch_try_many(
        &mut inv,
        "eeeeeeee-0000-4000-8000-000000000001",
        2,
        3,
        10_000,
    );
    inv.arg("r").arg("eeeeeeee-0000-4000-8000-000000000002");
    let replies: Vec<redis::Value> = inv.invoke(&mut conn).unwrap();
    assert_eq!(support::acquire_reply(&replies[0])[0], 1, "{replies:?}");
    let client = Client::open(server.url()).unwrap();
    let status = client.semaphore("cl", 3).unwrap().status().unwrap();
    assert_eq!(status.client_limit, Some(3));
    assert_eq!(status.other_client_limit, None);

    // two acquires of one batch passing different limits: clients disagree
    let mut inv = support::call_on(&batch, "cdl");
    support::batch_try_many(
        &mut inv,
        "eeeeeeee-0000-4000-8000-000000000003",
        2,
        4,
        10_000,
    );
    support::batch_try_many(
        &mut inv,
        "eeeeeeee-0000-4000-8000-000000000004",
        2,
        5,
        10_000,
    );
    let _: Vec<redis::Value> = inv.invoke(&mut conn).unwrap();
    let status = client.semaphore("cdl", 5).unwrap().status().unwrap();
    assert_eq!(status.client_limit, Some(5));
    assert_eq!(status.other_client_limit, Some(4));
}

/// The batch script gives every operation the reply it would have had alone, and
/// leaves the same holders, slots and count, for random batches of tries and releases
/// over a few ids (repeated ids, several permits, different limits and fairness in one
/// batch), run on one semaphore and one at a time on another. (An idle release that
/// is not a batch's last operation keeps the keys, empty, where a lone one deletes
/// them; the operators' 'cl' fields are compared by the test above.)
#[test]
fn random_batches_act_as_their_operations_one_at_a_time() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let (batch, acquire, release) = (
        support::batch_script(),
        support::acquire_script(),
        support::release_script(),
    );
    let mut seed: u64 = 0x1234_5678;
    let mut rnd = |m: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % m
    };
    let id = |k: u64| format!("dddddddd-0000-4000-8000-{k:012}");
    // (id, permits, limit, fair) for a try; permits 0 for a release
    type Op = (String, u64, u64, bool);
    let try_args = |inv: &mut redis::ScriptInvocation<'_>, (id, n, limit, fair): &Op| {
        inv.arg(id)
            .arg(*n)
            .arg(*limit)
            .arg(100_000)
            .arg(1000)
            .arg(1000)
            .arg("1|test|")
            .arg("t")
            .arg(if *fair { "1" } else { "0" })
            .arg("")
            .arg("0");
    };
    let shape = |v: &redis::Value, op: &Op| -> Vec<i64> {
        if op.1 == 0 {
            return vec![redis::from_redis_value_ref::<i64>(v).unwrap()];
        }
        let r = support::acquire_reply(v);
        if r[0] == 1 {
            [&r[..1], &r[4..]].concat()
        } else {
            vec![r[0]]
        }
    };
    let state = |conn: &mut redis::Connection, name: &str| {
        let mut h = held(conn, name);
        h.sort();
        let used: Option<i64> = redis::cmd("HGET")
            .arg(format!("redsem:{{{name}}}:i"))
            .arg("used")
            .query(conn)
            .unwrap();
        let bits: i64 = redis::cmd("BITCOUNT")
            .arg(format!("redsem:{{{name}}}:s"))
            .query(conn)
            .unwrap();
        (h, used.unwrap_or(0), bits)
    };
    for round in 0..200 {
        let (a, b) = (format!("batched{round}"), format!("alone{round}"));
        for _ in 0..4 {
            let ops: Vec<Op> = (0..1 + rnd(8))
                .map(|_| {
                    let k = rnd(6);
                    if rnd(3) == 0 {
                        (id(k), 0, 0, false)
                    } else {
                        (id(k), 1 + rnd(2), 2 + rnd(2), rnd(2) == 0)
                    }
                })
                .collect();
            let mut inv = support::call_on(&batch, &a);
            for op in &ops {
                if op.1 == 0 {
                    inv.arg("r").arg(&op.0);
                } else {
                    inv.arg("a");
                    try_args(&mut inv, op);
                }
            }
            let batched: Vec<redis::Value> = inv.invoke(&mut conn).unwrap();
            for (k, op) in ops.iter().enumerate() {
                let alone: redis::Value = if op.1 == 0 {
                    support::call_on(&release, &b)
                        .arg(&op.0)
                        .invoke(&mut conn)
                        .unwrap()
                } else {
                    let mut inv = support::call_on(&acquire, &b);
                    try_args(&mut inv, op);
                    inv.invoke(&mut conn).unwrap()
                };
                assert_eq!(
                    shape(&batched[k], op),
                    shape(&alone, op),
                    "round {round}, operation {k} of {ops:?}"
                );
            }
            let (batched, alone) = (state(&mut conn, &a), state(&mut conn, &b));
            assert_eq!(batched, alone, "round {round}: {ops:?}");
            assert_eq!(batched.1, batched.2, "'used' is the slots taken");
        }
    }
}
