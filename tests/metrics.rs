//! With the `metrics` feature, every semaphore reports its events through the
//! `metrics` facade, labelled with its name and kind (issue #15). A small recorder of
//! our own is installed as the process's global recorder before any semaphore is built.
#![cfg(feature = "metrics")]

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metrics::{
    Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use redis_semaphore::{Client, LostReason};
use support::{RedisServer, wait_until};

struct Cell(AtomicU64);

impl CounterFn for Cell {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Relaxed);
    }

    fn absolute(&self, value: u64) {
        self.0.fetch_max(value, Relaxed);
    }
}

struct Samples(Mutex<Vec<f64>>);

impl HistogramFn for Samples {
    fn record(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

/// Keeps every counter and histogram by `name{label=value,...}` (labels sorted).
#[derive(Default)]
struct Store {
    counters: Mutex<HashMap<String, Arc<Cell>>>,
    histograms: Mutex<HashMap<String, Arc<Samples>>>,
    described: Mutex<Vec<(String, Option<Unit>)>>,
}

fn render(key: &Key) -> String {
    let mut labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

struct Rec(&'static Store);

impl Recorder for Rec {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        let name = key.as_str().to_owned();
        self.0.described.lock().unwrap().push((name, unit));
    }

    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        let name = key.as_str().to_owned();
        self.0.described.lock().unwrap().push((name, unit));
    }

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut counters = self.0.counters.lock().unwrap();
        let cell = counters
            .entry(render(key))
            .or_insert_with(|| Arc::new(Cell(AtomicU64::new(0))));
        Counter::from_arc(Arc::clone(cell))
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let mut histograms = self.0.histograms.lock().unwrap();
        let samples = histograms
            .entry(render(key))
            .or_insert_with(|| Arc::new(Samples(Mutex::new(Vec::new()))));
        Histogram::from_arc(Arc::clone(samples))
    }
}

/// The global recorder, installed on first use.
fn store() -> &'static Store {
    static STORE: OnceLock<&'static Store> = OnceLock::new();
    STORE.get_or_init(|| {
        let store: &'static Store = Box::leak(Box::default());
        metrics::set_global_recorder(Rec(store)).unwrap();
        store
    })
}

/// The value of counter `redis_semaphore_<what>_total` of semaphore `sem`.
fn count(what: &str, sem: &str, kind: &str) -> u64 {
    count_with(what, sem, kind, None)
}

fn count_with(what: &str, sem: &str, kind: &str, reason: Option<&str>) -> u64 {
    let reason = reason.map(|r| format!(",reason={r}")).unwrap_or_default();
    let key = format!("redis_semaphore_{what}_total{{kind={kind}{reason},semaphore={sem}}}");
    let counters = store().counters.lock().unwrap();
    let cell = counters
        .get(&key)
        .unwrap_or_else(|| panic!("no counter {key}"));
    cell.0.load(Relaxed)
}

fn waits_recorded(sem: &str, kind: &str) -> Vec<f64> {
    let key = format!("redis_semaphore_wait_seconds{{kind={kind},semaphore={sem}}}");
    let histograms = store().histograms.lock().unwrap();
    let samples = histograms.get(&key).unwrap_or_else(|| panic!("no {key}"));
    samples.0.lock().unwrap().clone()
}

#[test]
fn leased_semaphore_reports_acquires_tries_waits_and_releases() {
    store();
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = client.semaphore("m-leased", 1).unwrap();
    let other = client.semaphore("m-untouched", 1).unwrap();
    let l = |what| count(what, "m-leased", "leased");

    let p = sem.acquire().unwrap();
    assert_eq!(l("acquired"), 1);
    assert!(sem.try_acquire().unwrap().is_none());
    assert_eq!(l("try_failed"), 1);
    assert!(
        sem.acquire_timeout(Duration::from_millis(50))
            .unwrap()
            .is_none()
    );
    // the blocking acquire's first look counts as a failed try, as in `Stats`
    assert_eq!(l("try_failed"), 2);
    assert_eq!(l("waits"), 1);
    assert_eq!(l("wait_gave_up"), 1);
    assert!(waits_recorded("m-leased", "leased").is_empty());

    let waiter = {
        let sem = sem.clone();
        std::thread::spawn(move || sem.acquire().unwrap().release().unwrap())
    };
    wait_until(Duration::from_secs(5), "queued", || {
        sem.queue_len().unwrap() == 1
    });
    // the holder keeps the permit 50 ms more (a hold, not a synchronisation): the wait
    // recorded below must be at least that
    std::thread::sleep(Duration::from_millis(50));
    p.release().unwrap();
    waiter.join().unwrap();
    assert_eq!(l("acquired"), 2);
    assert_eq!(l("released"), 2);
    assert_eq!(l("waits"), 2);
    let waited = waits_recorded("m-leased", "leased");
    assert_eq!(waited.len(), 1, "{waited:?}");
    assert!(waited[0] >= 0.05, "{waited:?}");
    assert_eq!(l("release_failed"), 0);
    assert_eq!(l("errors"), 0);

    // the other semaphore's series exist (registered when it was built) and stayed 0
    drop(other);
    assert_eq!(count("acquired", "m-untouched", "leased"), 0);

    let described = store().described.lock().unwrap().clone();
    assert!(described.contains(&(
        "redis_semaphore_wait_seconds".to_owned(),
        Some(Unit::Seconds)
    )));
    assert!(
        described
            .iter()
            .any(|d| d.0 == "redis_semaphore_lost_total")
    );
    assert_eq!(
        described
            .iter()
            .filter(|d| d.0 == "redis_semaphore_acquired_total")
            .count(),
        1,
        "described once"
    );
}

#[test]
fn a_lost_permit_is_reported_with_its_reason_and_its_release_as_gone() {
    store();
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = client
        .semaphore_builder("m-lost")
        .limit(2)
        .lease(Duration::from_millis(600))
        .build()
        .unwrap();
    let lost = sem.acquire().unwrap();
    sem.force_release(lost.id()).unwrap();
    wait_until(Duration::from_secs(5), "loss noticed", || lost.is_lost());
    assert_eq!(lost.lost_reason(), Some(LostReason::Released));
    let l = |reason| count_with("lost", "m-lost", "leased", Some(reason));
    // (the reason is recorded, then counted)
    wait_until(Duration::from_secs(5), "the loss counted", || {
        l("released") >= 1
    });
    assert_eq!(l("released"), 1);
    assert_eq!(l("expired"), 0);
    assert!(lost.release().is_err());
    assert_eq!(count("release_gone", "m-lost", "leased"), 1);
    assert_eq!(count("release_failed", "m-lost", "leased"), 0);
    assert_eq!(count("released", "m-lost", "leased"), 0);

    // a permit held past its max_hold is lost with that reason
    let held = client
        .semaphore_builder("m-lost")
        .limit(2)
        .lease(Duration::from_millis(600))
        .max_hold(Duration::from_millis(100))
        .build()
        .unwrap()
        .acquire()
        .unwrap();
    wait_until(Duration::from_secs(5), "max hold", || held.is_lost());
    // (the reason is recorded, then counted: see the loss above)
    wait_until(Duration::from_secs(5), "the loss counted", || {
        l("max_hold") >= 1
    });
    assert_eq!(l("max_hold"), 1);
    assert_eq!(l("released"), 1);
}

#[test]
fn counting_semaphore_reports_with_its_kind() {
    store();
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = client.counting_semaphore("m-counting").unwrap();
    let c = |what| count(what, "m-counting", "counting");
    assert!(sem.try_set_permits(1).unwrap());
    assert!(sem.try_acquire(1).unwrap());
    assert_eq!(c("acquired"), 1);
    assert!(!sem.try_acquire(1).unwrap());
    assert_eq!(c("try_failed"), 1);
    assert!(!sem.acquire_timeout(1, Duration::from_millis(50)).unwrap());
    assert_eq!(c("waits"), 1);
    assert_eq!(c("wait_gave_up"), 1);
    sem.release(1).unwrap();
    assert_eq!(c("released"), 1);
    assert!(sem.acquire_timeout(1, Duration::from_secs(5)).unwrap());
    assert_eq!(c("acquired"), 2);

    // an operation that fails counts as an error of this semaphore
    let mut conn = server.conn();
    let _: () = redis::cmd("SET")
        .arg("redsem:{m-counting}:count")
        .arg("many")
        .query(&mut conn)
        .unwrap();
    assert!(sem.try_acquire(1).is_err());
    assert_eq!(c("errors"), 1);
    // the leased semaphore of the same name is another series
    let _leased = client.semaphore("m-counting", 1).unwrap();
    assert_eq!(count("errors", "m-counting", "leased"), 0);
}
