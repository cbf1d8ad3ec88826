//! What a logger that panics does to the library (a file of its own: the logger is
//! global to the test process). A panic in the user's own code must neither leave a
//! grant taken for as long as the client lives nor end the background thread that
//! keeps every other permit alive.

mod support;

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use redis_semaphore::Client;
use support::{Proxy, RedisServer, wait_until};

/// Texts whose next record makes the logger panic (each once).
static TRIGGERS: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Sets of texts: the first record that contains any text of a set makes the logger
/// panic, and takes the whole set out.
static ANY_TRIGGERS: Mutex<Vec<Vec<String>>> = Mutex::new(Vec::new());
/// Texts whose next record holds the logging thread (each once) until the test lets it
/// go (`RELEASED`), or ten seconds at most: `HELD` says which record holds it.
static HOLDS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static HELD: Mutex<Vec<String>> = Mutex::new(Vec::new());
static RELEASED: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Signalled when a text goes into `RELEASED`.
static RELEASED_CV: Condvar = Condvar::new();
/// Texts on whose every record the logger panics (they stay).
static ALWAYS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Panicking;

impl log::Log for Panicking {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let text = record.args().to_string();
        let hold = {
            let mut holds = HOLDS.lock().unwrap();
            let at = holds.iter().position(|t| text.contains(t.as_str()));
            at.map(|k| holds.remove(k))
        };
        if let Some(t) = hold {
            HELD.lock().unwrap().push(t.clone());
            let released = RELEASED.lock().unwrap();
            let _ = RELEASED_CV
                .wait_timeout_while(released, Duration::from_secs(10), |r| !r.contains(&t))
                .unwrap();
        }
        let always = ALWAYS
            .lock()
            .unwrap()
            .iter()
            .any(|t| text.contains(t.as_str()));
        if always {
            panic!("the logger panics on {text:?} (each time)");
        }
        let any = {
            let mut sets = ANY_TRIGGERS.lock().unwrap();
            let at = sets
                .iter()
                .position(|set| set.iter().any(|t| text.contains(t.as_str())));
            at.map(|k| sets.remove(k))
        };
        if let Some(set) = any {
            panic!("the logger panics on {text:?} (one of {set:?})");
        }
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

/// Lets go of the thread held by the record that holds `hold` (`HOLDS`).
fn release(hold: String) {
    RELEASED.lock().unwrap().push(hold);
    RELEASED_CV.notify_all();
}

fn install() {
    // (both tests call it; the first installs)
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(log::LevelFilter::Debug);
}

/// Deletes the keys of semaphore `name` by hand: its holders' next renewal finds them
/// gone.
fn delete_keys(server: &RedisServer, name: &str) {
    redis::cmd("DEL")
        .arg(format!("redsem:{{{name}}}:h"))
        .arg(format!("redsem:{{{name}}}:i"))
        .arg(format!("redsem:{{{name}}}:s"))
        .exec(&mut server.conn())
        .unwrap();
}

/// Holds the background thread in the record of the loss of permit `id` of semaphore
/// `name` (its keys deleted) until [`release`] is called with the text returned.
fn hold_background_thread(server: &RedisServer, name: &str, id: &str) -> String {
    let hold = format!("permit {id} lost");
    HOLDS.lock().unwrap().push(hold.clone());
    delete_keys(server, name);
    wait_until(
        Duration::from_secs(5),
        "the background thread is held",
        || HELD.lock().unwrap().contains(&hold),
    );
    hold
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
    delete_keys(&server, "pl-doomed");
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

/// Sixth session (review): the panic that ended one round of the background thread's
/// work also dropped what that round had taken out of the registry and not handled
/// yet. Permits found past their lease are taken out of the registry and then declared
/// lost one by one; a logger that panicked on the record of the first one's loss left
/// the others out of the registry and never declared lost: their `lost()` never fired
/// and `is_lost()` stayed false for good (a holder that waits on `lost()`, as the
/// stream consumer of the keepalive guide does, was never told). Each loss is now
/// declared whatever a record of another one does.
#[test]
fn a_logger_that_panics_on_one_loss_does_not_keep_the_others_from_being_declared() {
    install();
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    // a renewed permit whose keys go: the record of its loss, on the background
    // thread, holds that thread while two other permits' leases run out
    let held = client
        .semaphore_builder("pl-held")
        .limit(1)
        .lease(Duration::from_secs(1))
        .build()
        .unwrap();
    let c = held.try_acquire().unwrap().expect("a permit");
    let hold = hold_background_thread(&server, "pl-held", c.id());
    let manual = client
        .semaphore_builder("pl-manual")
        .limit(2)
        .lease(Duration::from_millis(200))
        .auto_refresh(false)
        .build()
        .unwrap();
    let a = manual.try_acquire().unwrap().expect("a permit");
    let b = manual.try_acquire().unwrap().expect("a permit");
    wait_until(Duration::from_secs(5), "both leases run out", || {
        a.lease_left() == Duration::ZERO && b.lease_left() == Duration::ZERO
    });
    // whichever of the two losses is recorded first makes the logger panic
    let one_of = vec![
        format!("permit {} lost", a.id()),
        format!("permit {} lost", b.id()),
    ];
    ANY_TRIGGERS.lock().unwrap().push(one_of);
    release(hold);
    wait_until(Duration::from_secs(5), "the logger panics", || {
        ANY_TRIGGERS.lock().unwrap().is_empty()
    });
    assert!(c.is_lost());
    wait_until(
        Duration::from_secs(3),
        "both permits are declared lost",
        || a.is_lost() && b.is_lost(),
    );
    assert!(a.lost().try_recv().is_ok() && b.lost().try_recv().is_ok());
}

/// Sixth session (review): the releases the background thread owes (here two permits
/// whose `release()` got no reply, a partition) are taken out of the registry for a
/// round and sent one by one; a logger that panicked on the record of the first one
/// ended the round with the others taken out and never put back: their permits stayed
/// taken until their leases ran out (and an `RSemaphore` give-back, which has no
/// lease, for good). What a round has not sent yet now goes back to the registry when
/// a panic ends it, and a failed send is owed again before its record is logged.
#[test]
fn a_logger_that_panics_on_one_owed_release_does_not_drop_the_others() {
    install();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = Client::builder()
        .operation_timeout(Duration::from_millis(300))
        .build(proxy.url())
        .unwrap();
    let held = client
        .semaphore_builder("pl-owed-held")
        .limit(1)
        .lease(Duration::from_secs(1))
        .build()
        .unwrap();
    let c = held.try_acquire().unwrap().expect("a permit");
    // leases far longer than the test: a permit given back is given back by a release
    let owed = client
        .semaphore_builder("pl-owed")
        .limit(2)
        .lease(Duration::from_secs(60))
        .build()
        .unwrap();
    let p1 = owed.try_acquire().unwrap().expect("a permit");
    let p2 = owed.try_acquire().unwrap().expect("a permit");
    let ids = vec![p1.id().to_owned(), p2.id().to_owned()];
    // the background thread held in the record of the loss of `c` (its keys deleted)
    let hold = hold_background_thread(&server, "pl-owed-held", c.id());
    // both releases lost in a partition: owed to the background thread
    proxy.cut();
    assert!(p1.release().is_err());
    assert!(p2.release().is_err());
    proxy.heal();
    assert_eq!(holders(&server, "pl-owed"), 2);
    // the first record of the round that sends them (sent or failed) panics
    ANY_TRIGGERS.lock().unwrap().push(ids);
    release(hold);
    wait_until(Duration::from_secs(5), "the logger panics", || {
        ANY_TRIGGERS.lock().unwrap().is_empty()
    });
    wait_until(
        Duration::from_secs(10),
        "both permits are given back",
        || holders(&server, "pl-owed") == 0,
    );
}

/// Sixth session (review): a panic ended the whole round of the background thread's
/// work, so a record that panicked at every round (here the warning of a semaphore
/// whose renewal keeps failing: its hash turned into a string) ended every round at
/// that semaphore's batch, and the batches after it in the round were never renewed:
/// their permits were lost while held, as when the thread ended. (Groups that fell due
/// together, here while the thread was held up, stay due together; their order in a
/// round is a hash map's: with fifteen failing semaphores the kept one comes after one
/// of them in all but one run in sixteen.) A panic now ends the renewal of one batch,
/// not the round.
#[test]
fn a_logger_that_panics_at_every_round_does_not_stop_the_other_renewals() {
    install();
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let lease = Duration::from_secs(1);
    // the background thread held in the record of a loss (keys deleted), so that
    // every group below falls due in the same round
    let held = client
        .semaphore_builder("pl-always-held")
        .limit(1)
        .lease(lease)
        .build()
        .unwrap();
    let c = held.try_acquire().unwrap().expect("a permit");
    let hold = hold_background_thread(&server, "pl-always-held", c.id());
    let mut bad = Vec::new();
    for k in 0..15 {
        let name = format!("pl-always-bad-{k}");
        let sem = client
            .semaphore_builder(&name)
            .limit(1)
            .lease(lease)
            .build()
            .unwrap();
        bad.push(sem.try_acquire().unwrap().expect("a permit"));
        let hash = format!("redsem:{{{name}}}:i");
        redis::pipe()
            .cmd("DEL")
            .arg(&hash)
            .cmd("SET")
            .arg(&hash)
            .arg("not a hash")
            .exec(&mut server.conn())
            .unwrap();
    }
    ALWAYS
        .lock()
        .unwrap()
        .push("permits of pl-always-bad-".to_owned());
    let kept = client
        .semaphore_builder("pl-always-kept")
        .limit(1)
        .lease(lease)
        .build()
        .unwrap();
    let acquired = Instant::now();
    let b = kept.try_acquire().unwrap().expect("a permit");
    // every group due (a renewal every third of the lease), then the thread goes on
    wait_until(Duration::from_secs(5), "every group is due", || {
        b.lease_left() < lease / 2
    });
    release(hold);
    // renewed twice (a deadline past its second lease's) or lost
    wait_until(
        Duration::from_secs(5),
        "the kept permit is renewed or lost",
        || b.is_lost() || Instant::now() + b.lease_left() > acquired + 2 * lease,
    );
    ALWAYS.lock().unwrap().clear();
    assert!(!b.is_lost(), "{:?}", b.lost_reason());
    assert_eq!(holders(&server, "pl-always-kept"), 1);
    drop(bad);
}

/// Makes the tests that start a wake-up listener take turns: a trigger on a record of
/// the listener's would otherwise hit another test's listener.
fn one_listener_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Publishes `junk` on `channel` until the logger has panicked on `trigger` (taken out
/// as it does): the listener has read it (published again while it was not subscribed).
fn read_junk(conn: &mut redis::Connection, channel: &str, junk: &str, trigger: &str) {
    wait_until(
        Duration::from_secs(5),
        "the listener reads the junk",
        || {
            redis::cmd("PUBLISH")
                .arg(channel)
                .arg(junk)
                .exec(conn)
                .unwrap();
            !ANY_TRIGGERS
                .lock()
                .unwrap()
                .iter()
                .any(|set| set.iter().any(|t| t == trigger))
        },
    );
}

/// Review: a logger that panicked in the wake-up listener's thread ended it, here on
/// the record of a malformed wake-up message, which anyone who may publish on the
/// client's channel can send. The client's waiters were never woken by a message
/// again for as long as it lived (the subscription closed, and the listener still
/// said it was subscribed, so they looked only on their long fallback timer). A panic
/// in the handling of one message now ends only that message's handling, and one
/// elsewhere in the thread ends its subscription, which is made again.
#[test]
fn a_logger_that_panics_in_the_listener_does_not_end_the_wake_ups() {
    install();
    let _turn = one_listener_at_a_time();
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = client.semaphore("pl-listener", 1).unwrap();
    let held = sem.acquire().unwrap();
    // starts the listener
    support::start_listener(&sem);
    let mut conn = server.conn();
    let channel = support::listener_channel(&mut conn);
    // each junk message's record makes the logger panic: the second is read only if
    // the listener lives on after the first
    for k in 0..2 {
        let junk = format!("junk {k} for {channel}");
        let trigger = format!("malformed wake-up {junk:?}");
        ANY_TRIGGERS.lock().unwrap().push(vec![trigger.clone()]);
        read_junk(&mut conn, &channel, &junk, &trigger);
    }
    // and a waiter is still handed its permit
    let waiter = support::queued_waiter(&sem, Duration::from_secs(5));
    drop(held);
    let served = waiter.join().unwrap().0.unwrap();
    assert!(served.is_some(), "the waiter was not served");
}

/// Review: as above, a logger that panicked elsewhere in the listener's thread (here
/// on the record of a subscription made) ended it. Such a panic now ends the
/// subscription, not the thread, which subscribes again after a pause.
#[test]
fn a_logger_that_panics_as_the_listener_subscribes_does_not_end_the_wake_ups() {
    install();
    let _turn = one_listener_at_a_time();
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = client.semaphore("pl-subscribed", 1).unwrap();
    let held = sem.acquire().unwrap();
    let subscribed = "listening for wake-ups on redsem:c:".to_owned();
    ANY_TRIGGERS.lock().unwrap().push(vec![subscribed.clone()]);
    // starts the listener, which panics once subscribed
    support::start_listener(&sem);
    wait_until(Duration::from_secs(5), "the logger panics", || {
        !ANY_TRIGGERS
            .lock()
            .unwrap()
            .iter()
            .any(|set| set.contains(&subscribed))
    });
    // the listener subscribes again and reads its messages
    let mut conn = server.conn();
    let channel = support::listener_channel(&mut conn);
    let junk = format!("junk after the panic for {channel}");
    let trigger = format!("malformed wake-up {junk:?}");
    ANY_TRIGGERS.lock().unwrap().push(vec![trigger.clone()]);
    read_junk(&mut conn, &channel, &junk, &trigger);
    drop(held);
}
