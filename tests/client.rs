//! Client lifecycle: the background thread ends with the last handle.
//!
//! Alone in its test binary, so that no other test's client owns threads.

mod support;

use std::time::Duration;

use redis_semaphore::Client;
use support::{RedisServer, library_threads, wait_until};

#[test]
fn dropping_the_client_and_its_permits_ends_its_threads() {
    let server = RedisServer::start();
    let before = library_threads();
    let client = Client::open(server.url()).unwrap();
    let sem = client.semaphore("threads", 2).unwrap();
    let permit = sem.acquire().unwrap();
    // (a new thread names itself once it runs: until then it shows its parent's name)
    wait_until(
        Duration::from_secs(5),
        "the client's threads to start",
        || library_threads() > before,
    );
    drop(client);
    drop(sem);
    // the permit keeps the client alive, and its lease renewed
    assert!(library_threads() > before);
    permit.release().unwrap();
    wait_until(Duration::from_secs(5), "threads end", || {
        library_threads() == before
    });
}

/// The interop types are named at the top level too, beside their modules.
#[test]
fn the_interop_types_are_named_at_the_top_level_too() {
    use redis_semaphore::{
        BookSemaphore, BookSemaphoreBuilder, BookVariant, PublishCommand,
        RPermitExpirableSemaphore, RSemaphore,
    };
    let variant: BookVariant = redis_semaphore::compat::book::BookVariant::NodeFair;
    assert_eq!(variant, BookVariant::NodeFair);
    let client = Client::open("redis://127.0.0.1:1/").unwrap();
    let _: RSemaphore = client.redisson_semaphore("top");
    let _: RPermitExpirableSemaphore = client.redisson_permit_expirable_semaphore("top");
    let builder: BookSemaphoreBuilder = client.book_semaphore("top", 1);
    let _: BookSemaphore = builder.variant(variant).build().unwrap();
    let _ = PublishCommand::Both;
}
