//! A release owed for a lost reply is still sent when the client is dropped (found by
//! a review, 2026-11-27, fourth session).
//!
//! Apart from tests/client.rs, whose thread count must see no other test's client.

mod support;

use std::time::Duration;

use redis_semaphore::Client;
use support::{RedisServer, wait_until};

// Found by a review (2026-11-27, fourth session): each failed before its mend.

/// An acquire whose connection dropped after the server ran its script (the grant is
/// in Redis, the reply lost) owes a clean-up that the background thread sends once the
/// caller's give-up time has passed (README, "Under faults": "given back by the
/// client's background thread right after that moment"). When the application then
/// drops the semaphore and the client (a clean shutdown after the error), the
/// background thread stops and the clean-up is never sent: the permit stays taken for
/// its whole lease (here 60 s).
#[test]
fn a_clean_up_owed_when_the_client_is_dropped_is_still_sent() {
    lost_reply_then(true);
}

/// The same with the client kept: the clean-up is sent (the control).
#[test]
fn a_clean_up_owed_while_the_client_lives_is_sent() {
    lost_reply_then(false);
}

fn lost_reply_then(drop_client: bool) {
    const OP: Duration = Duration::from_secs(1);
    let server = RedisServer::start();
    let proxy = support::Proxy::start(server.port());
    let client = Client::builder()
        .operation_timeout(OP)
        .build(proxy.url())
        .unwrap();
    let sem = client
        .semaphore_builder("owed")
        .limit(1)
        .lease(Duration::from_secs(60))
        .build()
        .unwrap();
    // the clock anchor and the scripts in the server's cache: the acquire below is one
    // round trip
    sem.try_acquire()
        .unwrap()
        .expect("a permit")
        .release()
        .unwrap();
    let direct = Client::open(server.url()).unwrap();
    let observer = direct.semaphore("owed", 1).unwrap();
    // replies held back: the acquire runs on the server, its reply does not come
    proxy.delay_replies(Duration::from_secs(30));
    let trier = {
        let sem = sem.clone();
        std::thread::spawn(move || sem.try_acquire().map(|p| p.is_some()))
    };
    wait_until(Duration::from_secs(5), "the grant in Redis", || {
        observer.available().unwrap() == 0
    });
    // the connection closes before the reply comes: a lost reply
    proxy.reset();
    let tried = trier.join().unwrap();
    eprintln!("the try: {tried:?}");
    assert!(tried.is_err(), "{tried:?}");
    proxy.delay_replies(Duration::ZERO);
    // the application shuts down after the error
    let kept = (!drop_client).then_some((sem, client));
    wait_until(
        Duration::from_secs(10),
        "the lost reply's grant given back (it holds a 60 s lease)",
        || observer.available().unwrap() == 1,
    );
    drop(kept);
}

// Found by a review of the session's changes (2026-11-27).

fn give_back_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.trim_end().starts_with("redsem-give-ba"))
        .count()
}

/// The owed clean-ups handed to the give-back thread at a client's drop are sent one
/// after the other, each bounded by an operation timeout: against a hung server the
/// thread (and the pool it keeps alive) outlives the client by about one operation
/// timeout per owed release, however many there are (the PES give-back's passes were
/// bounded by one operation timeout for that reason).
#[test]
fn the_give_back_thread_is_bounded_whatever_the_number_owed() {
    const OP: Duration = Duration::from_millis(300);
    const N: usize = 16;
    let server = RedisServer::start();
    let client = Client::builder()
        .operation_timeout(OP)
        .max_connections(4 * N as u32)
        .build(server.url())
        .unwrap();
    let sems: Vec<_> = (0..N)
        .map(|i| {
            client
                .semaphore_builder(&format!("owedmany{i}"))
                .limit(1)
                .lease(Duration::from_secs(60))
                .build()
                .unwrap()
        })
        .collect();
    // N idle connections in the pool: N permits held at once, on N threads
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(N));
    let warm: Vec<_> = sems
        .iter()
        .map(|sem| {
            let (sem, barrier) = (sem.clone(), barrier.clone());
            std::thread::spawn(move || {
                let p = sem.try_acquire().unwrap().expect("a permit");
                barrier.wait();
                p.release().unwrap();
            })
        })
        .collect();
    for t in warm {
        t.join().unwrap();
    }
    let paused = server.pause();
    let tries: Vec<_> = sems
        .iter()
        .map(|sem| {
            let sem = sem.clone();
            std::thread::spawn(move || sem.try_acquire().map(|p| p.is_some()))
        })
        .collect();
    for t in tries {
        let r = t.join().unwrap();
        eprintln!("try: {r:?}");
        assert!(r.is_err(), "{r:?}");
    }
    let sem = sems;
    let dropped = std::time::Instant::now();
    drop(sem);
    drop(client);
    eprintln!(
        "client dropped in {:?}; give-back threads {}",
        dropped.elapsed(),
        give_back_threads()
    );
    let mut gone = None;
    while dropped.elapsed() < Duration::from_secs(30) {
        if give_back_threads() == 0 {
            gone = Some(dropped.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(paused);
    eprintln!("give-back thread gone after {gone:?} (op timeout {OP:?}, {N} owed)");
    let gone = gone.expect("the give-back thread ended");
    assert!(gone < 5 * OP, "outlived the client by {gone:?}");
}
