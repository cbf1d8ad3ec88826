//! Client lifecycle: the background thread ends with the last handle.
//!
//! Alone in its test binary, so that no other test's client owns threads; the tests
//! of this binary take turns ([`alone`]), since some count every thread of the process.

mod support;

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use redis_semaphore::Client;
use support::{RedisServer, info_field, library_threads, wait_until};

/// Makes the tests of this binary run one at a time (each counts threads that
/// another's client would start).
fn alone() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Every thread of this process, whatever its name.
fn all_threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

fn connected_clients(admin: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("clients").query(admin).unwrap();
    info_field(&info, "connected_clients")
        .and_then(|n| n.parse().ok())
        .unwrap()
}

#[test]
fn dropping_the_client_and_its_permits_ends_its_threads() {
    let _alone = alone();
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
    let _alone = alone();
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

/// Clients made and dropped in a loop (one per job, say) leave no thread and no
/// connection behind. The pool of each `Client` ran three `r2d2-worker-N` threads
/// (r2d2's own thread pool, which opens the pool's connections), and they outlived the
/// client by up to r2d2's reaper period (30 s): a program that made a client per job
/// piled up thousands of threads. They are now the client's `redsem-pool-N` threads,
/// which end as the pool does.
#[test]
fn clients_made_and_dropped_in_a_loop_leave_no_thread_and_no_connection() {
    let _alone = alone();
    let server = RedisServer::start();
    let mut admin = server.conn();
    let (threads, connections) = (all_threads(), connected_clients(&mut admin));
    for round in 0..5 {
        let client = Client::open(server.url()).unwrap();
        let sem = client.semaphore("loop", 1).unwrap();
        let held = sem.acquire().unwrap();
        // a blocked acquire starts the wake-up listener too
        let other = sem.clone();
        let waiter = std::thread::spawn(move || other.acquire_timeout(Duration::from_secs(10)));
        wait_until(Duration::from_secs(5), "the waiter is queued", || {
            sem.queue_len().unwrap() == 1
        });
        drop(held);
        let served = waiter.join().unwrap().unwrap();
        assert!(served.is_some(), "round {round}: the waiter was not served");
        drop((served, sem, client));
    }
    wait_until(
        Duration::from_secs(5),
        "the dropped clients' threads and connections to end",
        || all_threads() <= threads && connected_clients(&mut admin) == connections,
    );
    assert_eq!(library_threads(), 0);
}

/// Review (fifth session): a client dropped while its pool was opening a connection to
/// a server that hangs (accepts, never answers) left its pool threads connecting to it
/// for as long as the server hung: each connect job r2d2 runs holds the pool while it
/// connects, so a job that came due while another was connecting found the pool alive
/// and connected again, and a failed connect scheduled its retry the same way (three
/// `redsem-pool-N` threads and about two new sockets a second, still going 45 s after
/// the drop in a run before the fix). Once the client is gone its pool opens no new
/// connection: the threads end with the connects in flight, within a connect timeout.
#[test]
fn a_client_dropped_while_its_pool_connects_to_a_hung_server_leaves_no_thread() {
    let _alone = alone();
    let server = RedisServer::start();
    let connect_timeout = Duration::from_millis(1_000);
    let client = Client::builder()
        .connect_timeout(connect_timeout)
        .operation_timeout(Duration::from_millis(300))
        .checkout_timeout(Duration::from_millis(300))
        .build(server.url())
        .unwrap();
    let sem = client.semaphore("hung-connect", 1).unwrap();
    let paused = server.pause();
    // the checkout gives up after its timeout; the pool's connects go on meanwhile
    let err = sem
        .try_acquire()
        .expect_err("a server that hangs grants nothing");
    assert!(err.is_timeout() || err.is_retryable(), "{err:?}");
    assert!(library_threads() > 0);
    drop((sem, client));
    // the connects in flight end by their connect timeout, and no other starts
    wait_until(
        3 * connect_timeout,
        "the dropped client's pool threads to end while the server hangs",
        || library_threads() == 0,
    );
    drop(paused);
    let mut admin = server.conn();
    wait_until(
        Duration::from_secs(5),
        "no connection of the dropped client left",
        || connected_clients(&mut admin) == 1,
    );
}

/// Ninth session (new-user review): `Client::from_pool` with r2d2's defaults
/// (`test_on_check_out(true)`) for a server that is not running failed, after the
/// call's operation timeout, with "no connection from the given pool within 2s (its
/// check on checkout, a PING, got no answer; build the pool with
/// test_on_check_out(false))": no PING was ever sent, the server refused every
/// connection, and the hint sent the user to change a setting that was not the cause.
/// The checkout, run on a thread of its own (`checkout_aside`), was given the whole
/// time the caller waited for it, so r2d2's own error ("Connection refused") came just
/// after the caller had stopped waiting. It now comes before, and is the one reported.
#[test]
fn a_user_pool_whose_server_refuses_connections_says_so() {
    let _alone = alone();
    // a port with nothing listening (bound, then closed)
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let pool = r2d2::Pool::builder()
        .max_size(2)
        .connection_timeout(Duration::from_millis(600))
        .build_unchecked(redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap());
    assert!(pool.test_on_check_out(), "r2d2's default");
    let client = Client::from_pool(pool).unwrap();
    let sem = client.semaphore("refused", 1).unwrap();
    for (what, e) in [
        ("try_acquire", sem.try_acquire().map(drop).unwrap_err()),
        ("status", sem.status().map(drop).unwrap_err()),
    ] {
        let text = e.to_string();
        assert!(text.to_lowercase().contains("refused"), "{what}: {text}");
        assert!(!text.contains("PING"), "{what}: {text}");
        assert!(e.is_retryable(), "{what}: {text}");
    }
}
