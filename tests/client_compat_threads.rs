//! Client lifecycle with a Redisson `RPermitExpirableSemaphore` whose permits are
//! renewed in the background: the threads end with the last handle, as with the
//! leased semaphore (tests/client.rs).
//!
//! Alone in its test binary, so that no other test's client owns threads.

mod support;

use std::time::Duration;

use redis_semaphore::Client;
use support::{RedisServer, library_threads, wait_until};

#[test]
fn dropping_the_client_after_a_renewed_redisson_permit_ends_its_threads() {
    let server = RedisServer::start();
    let before = library_threads();
    let client = Client::open(server.url()).unwrap();
    let pes = client
        .redisson_permit_expirable_semaphore("pes-threads")
        .with_auto_refresh(true);
    assert!(pes.try_set_permits(1).unwrap());
    // renewed every 20 s: the refresher keeps a group for it until then
    let permit = pes
        .try_acquire(Some(Duration::from_secs(60)))
        .unwrap()
        .unwrap();
    // (a new thread names itself once it runs: until then it shows its parent's name)
    wait_until(
        Duration::from_secs(5),
        "the client's threads to start",
        || library_threads() > before,
    );
    permit.release().unwrap();
    drop(pes);
    drop(client);
    wait_until(Duration::from_secs(5), "threads end", || {
        library_threads() == before
    });
}
