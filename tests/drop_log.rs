//! What dropping a permit says in the log. The design: `Permit::release()` on a permit
//! whose lease had already ended returns an error that says so; Drop logs it at `warn`.
//! (A file of its own: the logger is global to the test process.)

mod support;

use std::time::Duration;

use redis_semaphore::Client;
use support::RedisServer;

fn warnings_about(text: &str) -> Vec<String> {
    support::capture::crate_records()
        .into_iter()
        .filter(|(level, msg)| *level == log::Level::Warn && msg.contains(text))
        .map(|(_, msg)| msg.clone())
        .collect()
}

#[test]
fn dropping_a_permit_whose_lease_ended_logs_a_warning_and_a_live_one_nothing() {
    support::capture::install();
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = client
        .semaphore_builder("drop-log")
        .limit(3)
        .lease(Duration::from_millis(300))
        .auto_refresh(false)
        .build()
        .unwrap();

    // a live permit dropped: released, no warning
    let live = sem.try_acquire().unwrap().expect("a permit");
    drop(live);
    assert!(
        support::capture::crate_records()
            .iter()
            .all(|(level, _)| *level > log::Level::Warn),
        "{:?}",
        support::capture::crate_records()
    );

    // a permit whose lease ended on the server (nobody renews it) and that this
    // process has already seen lost (is_lost), then dropped: a warning that says so
    let late = sem.try_acquire().unwrap().expect("a permit");
    let id = late.id().to_owned();
    support::wait_until(Duration::from_secs(10), "the lease to end", || {
        late.is_lost()
            && sem
                .holders()
                .unwrap()
                .iter()
                .all(|h| h.id != id || h.lease_left.is_zero())
    });
    drop(late);
    let said = warnings_about(&id);
    assert_eq!(said.len(), 1, "{:?}", support::capture::crate_records());
    assert!(said[0].contains("lease"), "{said:?}");
}
