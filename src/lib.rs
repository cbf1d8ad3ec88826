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
//! # How it works
//!
//! Every operation is one Lua script, one round trip: an acquire purges expired
//! holders, checks the limit and records the grant atomically, with the lease deadline
//! computed from the Redis server's `TIME`, never the client's clock. All keys of a
//! semaphore share the hash tag `{name}` (Redis Cluster ready) and carry a TTL past the
//! last lease. Each grant gets a fencing [`token`](Permit::token), strictly increasing
//! per semaphore, and the [`slots`](Permit::slots) it occupies (lowest free first).
//!
//! # Requirements
//!
//! Redis 6.2 or later (the scripts use `ZMSCORE`).
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

mod client;
mod error;
mod listener;
mod permit;
mod pool;
mod refresher;
mod scripts;
mod semaphore;
mod stats;

pub use client::{Client, ClientBuilder};
pub use error::{Error, Result};
pub use permit::{LostReason, Permit};
pub use semaphore::{Holder, Semaphore, SemaphoreBuilder, Status};
pub use stats::Stats;

/// The README's examples, compiled as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
