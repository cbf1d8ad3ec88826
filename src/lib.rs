//! A distributed counting semaphore on Redis for plain threaded programs.
//!
//! At most `limit` permits of a named semaphore are held at once, across every thread,
//! process and host that uses the same Redis. [`Semaphore::acquire`] returns a
//! [`Permit`] guard that gives the permit back when it is dropped; a background thread
//! per [`Client`] keeps the leases of held permits alive, and a holder that crashes
//! loses its permits when its lease ends.
//!
//! ```no_run
//! use redis_semaphore::Client;
//!
//! let client = Client::open("redis://127.0.0.1:6379/")?;
//! let sem = client.semaphore("market:acct:42", 5)?;
//! {
//!     let permit = sem.acquire()?;
//!     // at most 5 holders run this at once, wherever they are
//!     println!("holding slot {:?} with token {}", permit.slots(), permit.token());
//! } // dropped: released
//! # Ok::<(), redis_semaphore::Error>(())
//! ```
//!
//! # Blocking, timeouts and cancellation
//!
//! [`try_acquire`](Semaphore::try_acquire) makes one round trip and never waits:
//! `Ok(None)` means no permit is free. [`acquire`](Semaphore::acquire) waits as long as
//! it takes, [`acquire_timeout`](Semaphore::acquire_timeout) at most a given time, and
//! [`acquire_cancellable`](Semaphore::acquire_cancellable) until a crossbeam receiver
//! fires (for shutdown). The `_many` forms take several permits at once; asking for
//! more than the limit is an error at once, never an endless wait.
//!
//! ```no_run
//! use std::time::Duration;
//! # let client = redis_semaphore::Client::open("redis://127.0.0.1/")?;
//! let sem = client.semaphore("reports", 3)?;
//! match sem.acquire_many_timeout(2, Duration::from_millis(500))? {
//!     Some(permit) => assert_eq!(permit.permits(), 2),
//!     None => eprintln!("busy, try later"),
//! }
//! # Ok::<(), redis_semaphore::Error>(())
//! ```
//!
//! # Fairness and wake-ups
//!
//! Blocked acquires queue in arrival order across every client and process
//! (`fair(true)`, the default); a `try_acquire` does not jump ahead of them, and a
//! waiter for several permits at the head of the queue keeps what frees up until it has
//! enough, so a stream of small acquires cannot starve it. With `fair(false)` a
//! `try_acquire` takes a free permit even while others wait. Fairness is each
//! handle's setting: give every client of a semaphore the same one.
//!
//! Waiters are not woken by polling. A release (or a raised limit, or the purge of an
//! expired holder) hands the permits to the head of the queue inside the same script
//! and publishes the grant on the waiting client's channel; one listener thread and
//! connection per client serves all its waiters. The head waiter also looks again at
//! the moment the earliest lease ends, so a crashed holder's permit goes to it then.
//! A queued waiter has a heartbeat of at most a second (never more than the lease),
//! renewed by the client's background thread with one call per semaphore (which also
//! purges the expired and serves the head, as any call does): a waiter whose process
//! dies leaves the queue within about a second, and a permit pushed to it lasts no
//! longer than that heartbeat until its client renews it, so it comes back as soon.
//! The next few waiters, and on an unfair semaphore every waiter, also look again
//! when the head's heartbeat would end, so a dead head is replaced, and a permit the
//! head cannot use is taken, within about a second.
//!
//! # Leases and refresh
//!
//! A permit is a lease (10 s by default, [`SemaphoreBuilder::lease`]). While the
//! [`Permit`] lives, the client's background thread renews it every third of the lease,
//! with one script call per semaphore for all of the client's permits. With
//! [`auto_refresh(false)`](SemaphoreBuilder::auto_refresh) the lease ends `lease` after
//! the grant unless [`Permit::refresh`] is called, as in the book's semaphores.
//!
//! # Lost leases and fencing
//!
//! A lease can end while its `Permit` is still held: the process stalled for longer
//! than the lease, Redis was unreachable, an operator force-released it, or the server
//! lost its data. [`Permit::lost`] then fires (usable in `crossbeam_channel::select!`)
//! and [`Permit::is_lost`] turns true:
//!
//! - when Redis says the permit is gone (force release, server reset): at the next
//!   renewal, within one refresh interval (a third of the lease by default);
//! - when Redis cannot be reached: once the lease must have run out by this process's
//!   monotonic clock, counted from when the last successful renewal was *sent*, which
//!   is never later than the server's own deadline.
//!
//! Between the real end of a lease and that moment, another holder may already have
//! the slot. Work that must never overlap is fenced downstream: each grant carries a
//! [`token`](Permit::token), strictly increasing per semaphore, and the
//! [`slots`](Permit::slots) it occupies. A resource that remembers the highest token
//! it has accepted *per slot* and refuses lower ones is safe from a holder whose lease
//! ran out (a single global token cannot fence N concurrent holders; per slot it can).
//!
//! ```no_run
//! # let client = redis_semaphore::Client::open("redis://127.0.0.1/")?;
//! # let sem = client.semaphore("stream:orders", 1)?;
//! let permit = sem.acquire()?;
//! let ticks = crossbeam_channel::tick(std::time::Duration::from_millis(100));
//! loop {
//!     crossbeam_channel::select! {
//!         recv(permit.lost()) -> reason => { eprintln!("lease lost: {reason:?}"); break }
//!         recv(ticks) -> _ => { /* write with (permit.slots()[0], permit.token()) */ }
//!     }
//! }
//! # Ok::<(), redis_semaphore::Error>(())
//! ```
//!
//! # An ownerless counting semaphore
//!
//! [`Client::counting_semaphore`] gives a [`CountingSemaphore`]: a plain count in
//! Redis with Dijkstra's P/V and the API of Redisson's `RSemaphore` (`acquire(n)`,
//! `release(n)` by any process, `try_set_permits`, `add_permits`, `drain_permits`...),
//! for signalling between processes. Its permits have no owner and no lease: **a
//! holder that crashes never gives them back**, and the count key has no TTL, by
//! design. Blocked acquires are woken by the release itself, like the leased ones.
//!
//! # Sharing a semaphore with Java (Redisson)
//!
//! [`compat::redisson`] speaks Redisson's `RSemaphore` and `RPermitExpirableSemaphore`
//! on their own keys ([`Client::redisson_semaphore`],
//! [`Client::redisson_permit_expirable_semaphore`]), with Redisson's guarantees rather
//! than the crate's: client-clock leases and no fencing token.
//!
//! # Operating it
//!
//! [`Semaphore::holders`] lists who holds what (id, permits, token, slots, host, pid,
//! label, age, lease left), [`Semaphore::status`] the counts,
//! [`Semaphore::force_release`] and [`Semaphore::set_limit`] act, and
//! [`Client::stats`] counts what the client did. The `redis-semaphore` command (feature
//! `cli`) does the same from a shell.
//!
//! # Choosing a semaphore
//!
//! The leased [`Semaphore`] is the one to use unless you must share a semaphore with
//! code that runs the "Redis in Action" algorithms, or need ownerless P/V signalling:
//! [`guide::which_semaphore`] compares every variant (guarantees, clocks, crash
//! recovery, round trips), and [`guide::keepalive`] states the keepalive's timing
//! guarantees.
//!
//! # How it works
//!
//! Every operation is one Lua script, one round trip (a client's first operation reads
//! the server's `TIME` once before it, on a cluster once per semaphore: each call
//! carries a cutoff in server time after which the script does nothing, so that a
//! call delayed past the moment its caller gave up cannot grant): an acquire purges
//! expired holders, checks the limit and records the grant atomically, with the lease
//! deadline computed from the Redis server's `TIME`, never the client's clock. All keys of a
//! semaphore share the hash tag `{name}` (Redis Cluster ready) and carry a TTL past the
//! last lease; the release that leaves a semaphore idle (nobody holding or waiting, no
//! limit stored by `set_limit`) deletes them, so idle semaphores cost no memory. A
//! semaphore is three keys (holders, state, slots); the queue's key exists only while
//! someone queues. Each script is safe to run twice for the same permit id (a timed-out
//! command may have run; a resent one must not take a second permit or free someone
//! else's).
//!
//! That is also what lets the pool hand out connections without testing them first
//! (no `PING` on checkout, which would cost every call a round trip). A connection
//! the server closed while it sat idle in the pool (Redis's `timeout`, an idle cut of
//! a load balancer or a cloud service, `CLIENT KILL`, a restart) fails the first
//! request sent on it; the call is then sent once more, with the same permit id and
//! cutoff, on a brand-new connection within the same deadline, and its answer is the
//! call's (an acquire granted by the first send, whose reply was lost with the
//! connection, gets that grant back, its deadline read afresh from the server). A call
//! that timed out is not sent again: it may still run, and the caller's time is spent.
//! The pool then drops, at their next checkout, its other connections idle at least as
//! long as the closed one (closed by the same idle cut, or by the same kill): the calls
//! after it do not each meet one. [`Stats::resent`] counts the calls sent again.
//!
//! Each hot-path script (acquire, release, and the batch below) starts with a fast
//! path that does only what a plain case needs: granting one permit while nobody
//! queues and no lease has passed, saying "no" to a try, or releasing a permit nobody
//! waits for. It reads the state with one `HMGET`, checks that the keys exist with
//! their types before its first write, and answers before the rest of the script is
//! even set up. A "no" to a try needs only that `HMGET`: it writes nothing, so it
//! reads no other key (were one lost, the repair it would trigger drops every holder;
//! the next call that needs more makes it). Nor does the release of the last permit,
//! which deletes the semaphore's keys whatever they hold. Anything else (keys missing
//! or not agreeing, a queue to serve, an expired holder to purge, a repeated id,
//! several permits at once, a grant that must move the keys' expiry of a semaphore
//! with a stored limit: about once a day) falls through to the full logic, which decides exactly as
//! it would alone.
//!
//! When several threads of one [`Client`] try-acquire or release on the same semaphore
//! at the same moment, their operations share script calls: a thread that finds the
//! most calls of that semaphore in flight queues its operation, and the queued
//! operations go together in one script, each run exactly as it would run alone, the
//! releases first (so the tries of the same call find those permits free). The most
//! is four while tries are granted, and one per four waiting threads, at most two,
//! while tries are refused: on a full semaphore more calls would only be more
//! refusals, and fewer, larger calls spread each call's fixed cost. A thread
//! alone sends its own script at once. In a batch the fast path reads the state fields once
//! and then only each operation's own record, writes the `used` count its releases
//! lowered once at the end, and the tries that share their handle's arguments send
//! only their id and cutoff; a fast grant answers with one short text and a refused
//! try with `0`, not a table: a refused try that joins a batch costs the server about
//! a sixth of a call of its own. Under contention this cuts the server's work per
//! operation (see `BENCHMARKS.md`); blocking waits and refreshes are not combined.
//!
//! # Feature flags
//!
//! - `cli`: builds the `redis-semaphore` command-line inspector (pulls in `clap` and
//!   `serde_json`). Off by default.
//! - `tls-rustls`: `rediss://` URLs over rustls, with its `ring` crypto provider
//!   (installed as the process default before the first TLS connection unless the
//!   application chose one). Off by default.
//! - `tls-native-tls`: `rediss://` URLs over the platform's TLS library (OpenSSL on
//!   Linux). Off by default.
//! - `serde`: `serde::Serialize` on [`Holder`], [`Status`] and [`Stats`] (for a
//!   status endpoint or a log line). Off by default.
//! - `metrics`: every [`Semaphore`] and [`CountingSemaphore`] also reports through the
//!   [`metrics`](https://docs.rs/metrics) facade, to whatever exporter the application
//!   installs (Prometheus with `metrics-exporter-prometheus`, see the README):
//!   counters `redis_semaphore_{acquired, try_failed, waits, wait_gave_up, released,
//!   release_gone, release_failed, lost, errors}_total` (the same events as [`Stats`],
//!   `lost` with a `reason` label) and the histogram `redis_semaphore_wait_seconds` of
//!   granted waits, each labelled `semaphore` (the name) and `kind` (`leased` or
//!   `counting`). A handle looks its series up once, when it is built: install the
//!   recorder before building semaphores. Off by default; without it nothing of it is
//!   compiled.
//!
//! # Production Redis
//!
//! TLS, ACL users and passwords, and the URL forms are in [`guide::deployment`],
//! with the minimal ACL rule for a user of this library.
//!
//! # Requirements
//!
//! Redis 6.2 or later (the scripts use `ZMSCORE`), without an evicting
//! `maxmemory-policy` for the semaphore's keys (an evicted key would drop holders).
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

// Three layers; each imports only from the layers below it.
//
// Base and protocol: the error type, the clock anchor, the counters and the
// per-semaphore metrics (`metrics` feature), the connection to one cluster node, and
// the Lua scripts with one typed Rust function per script call.
mod clock;
mod error;
mod metrics;
mod node;
mod scripts;
mod stats;
// Background machinery: the connection layer (URL forms, TLS, connect errors), where
// the primary is (one server, a Sentinel service and its watcher, a Redis Cluster), the
// pool, the combiner of concurrent calls, the registry of live permits, the state
// shared with the threads, the refresher thread and the wake-up listener, and the
// helpers for joining threads and bounding drops. None of it imports the public types.
mod combine;
mod connect;
mod listener;
mod pool;
mod refresher;
mod registry;
mod shared;
mod threads;
mod topology;
// Public types.
mod client;
pub mod compat;
mod counting;
mod permit;
mod semaphore;

pub use client::{Client, ClientBuilder, MAX_CONNECTIONS, MAX_TIMEOUT};
pub use connect::{IntoRedisTarget, redact as redact_url};
pub use counting::CountingSemaphore;
pub use error::{Error, LostReason, Result};
pub use permit::{Permit, PermitParts};
pub use semaphore::{Holder, MAX_LIMIT, MAX_WAIT_REPLICAS, Semaphore, SemaphoreBuilder, Status};
pub use stats::Stats;

// The interop types at the top level too, beside their modules (`compat::book`,
// `compat::redisson`), where their documentation lives.
#[doc(no_inline)]
pub use compat::book::{BookSemaphore, BookSemaphoreBuilder, BookVariant};
#[doc(no_inline)]
pub use compat::redisson::{PublishCommand, RPermitExpirableSemaphore, RSemaphore};

// The crates whose types the public API exposes, so that users need not depend on
// the same versions themselves: `redis` (1.x: `Client::from_pool` takes an
// `r2d2::Pool<redis::Client>`), `r2d2` (0.8) and `crossbeam_channel` (0.5:
// `Permit::lost` is a `crossbeam_channel::Receiver`, and `acquire_cancellable` takes
// one).
pub use crossbeam_channel;
pub use r2d2;
pub use redis;

/// Longer pages: choosing a variant, the timing guarantees of the keepalive, and
/// which Redis deployment gives which guarantee (URLs, TLS, ACL, Sentinel, Cluster,
/// failover).
pub mod guide {
    #[doc = include_str!("../docs/which-semaphore.md")]
    pub mod which_semaphore {}

    #[doc = include_str!("../docs/keepalive.md")]
    pub mod keepalive {}

    #[doc = include_str!("../docs/deployment.md")]
    pub mod deployment {}
}

/// The README's examples, compiled as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
