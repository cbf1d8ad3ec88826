//! Client lifecycle: the background thread ends with the last handle.
//!
//! Alone in its test binary, so that no other test's client owns threads.

mod support;

use std::time::Duration;

use redis_semaphore::Client;
use support::{RedisServer, wait_until};

fn our_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("redsem-"))
        .count()
}

#[test]
fn dropping_the_client_and_its_permits_ends_its_threads() {
    let server = RedisServer::start();
    let before = our_threads();
    let client = Client::open(server.url()).unwrap();
    let sem = client.semaphore("threads", 2).unwrap();
    let permit = sem.acquire().unwrap();
    assert!(our_threads() > before);
    drop(client);
    drop(sem);
    // the permit keeps the client alive, and its lease renewed
    assert!(our_threads() > before);
    permit.release().unwrap();
    wait_until(Duration::from_secs(5), "threads end", || {
        our_threads() == before
    });
}
