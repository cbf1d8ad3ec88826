//! What a logger that panics does to the library (a file of its own: the logger is
//! global to the test process). A panic in the user's own code must neither leave a
//! grant taken for as long as the client lives nor end the background thread that
//! keeps every other permit alive.

mod support;

use std::sync::Mutex;
use std::time::Duration;

use redis_semaphore::Client;
use support::{RedisServer, wait_until};

/// Texts whose next record makes the logger panic (each once).
static TRIGGERS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Panicking;

impl log::Log for Panicking {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let text = record.args().to_string();
        let hit = {
            let mut triggers = TRIGGERS.lock().unwrap();
            let at = triggers.iter().position(|t| text.contains(t.as_str()));
            at.map(|k| triggers.remove(k))
        };
        if let Some(t) = hit {
            panic!("the logger panics on {t:?}");
        }
    }

    fn flush(&self) {}
}

static LOGGER: Panicking = Panicking;

fn install() {
    // (both tests call it; the first installs)
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(log::LevelFilter::Debug);
}

fn holders(server: &RedisServer, name: &str) -> i64 {
    // the holders' zset less its sentinel member '~' (0 once the keys are gone)
    let n: i64 = redis::cmd("ZCARD")
        .arg(format!("redsem:{{{name}}}:h"))
        .query(&mut server.conn())
        .unwrap();
    (n - 1).max(0)
}

/// Sixth session: the grant was registered with the background thread before its
/// `Permit` guard existed, and the debug record "granted" was logged in between. A
/// logger that panicked there unwound out of the acquire with no guard to drop: the
/// background thread went on renewing the grant for as long as the client lived, a
/// permit nobody held. The guard now exists before the logger is called, and its drop
/// during the unwinding gives the grant back.
#[test]
fn a_logger_that_panics_as_a_grant_is_made_leaves_no_permit_taken() {
    install();
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = client
        .semaphore_builder("pl-grant")
        .limit(1)
        .lease(Duration::from_secs(1))
        .build()
        .unwrap();
    TRIGGERS.lock().unwrap().push("pl-grant granted".to_owned());
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sem.try_acquire()));
    assert!(r.is_err(), "the logger's panic reaches the caller");
    // renewed every third of a second while held: gone for good within a few leases
    // only if it was given back
    wait_until(Duration::from_secs(5), "the grant is given back", || {
        holders(&server, "pl-grant") == 0
    });
    let again = sem.try_acquire().unwrap();
    assert!(again.is_some(), "the permit can be had again");
}

/// Sixth session: a logger that panicked in the background thread (here on the record
/// of a permit found lost) ended the thread, and every other permit of the client was
/// no longer renewed: their leases ran out while they were held. A panic now ends one
/// round of the thread's work, not the thread.
#[test]
fn a_logger_that_panics_in_the_background_thread_does_not_stop_the_renewals() {
    install();
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let lease = Duration::from_secs(1);
    let doomed = client
        .semaphore_builder("pl-doomed")
        .limit(1)
        .lease(lease)
        .build()
        .unwrap();
    let kept = client
        .semaphore_builder("pl-kept")
        .limit(1)
        .lease(lease)
        .build()
        .unwrap();
    let a = doomed.try_acquire().unwrap().expect("a permit");
    let b = kept.try_acquire().unwrap().expect("a permit");
    let trigger = format!("permit {} lost", a.id());
    TRIGGERS.lock().unwrap().push(trigger.clone());
    // the doomed semaphore's keys deleted by hand: its next renewal finds the permit
    // gone, and the record of its loss makes the logger panic
    redis::cmd("DEL")
        .arg("redsem:{pl-doomed}:h")
        .arg("redsem:{pl-doomed}:i")
        .arg("redsem:{pl-doomed}:s")
        .exec(&mut server.conn())
        .unwrap();
    // (the trigger is taken out as the logger panics on it)
    wait_until(Duration::from_secs(5), "the logger panics", || {
        !TRIGGERS.lock().unwrap().contains(&trigger)
    });
    assert!(a.is_lost());
    let calls = client.stats().refresh_calls;
    // three more renewals of the kept permit (one every third of its lease), and it is
    // held past several leases
    wait_until(
        Duration::from_secs(5),
        "the background thread goes on renewing",
        || client.stats().refresh_calls >= calls + 3,
    );
    assert!(!b.is_lost(), "{:?}", b.lost_reason());
    assert!(b.lease_left() > Duration::ZERO);
    assert_eq!(holders(&server, "pl-kept"), 1);
}
