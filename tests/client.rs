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
