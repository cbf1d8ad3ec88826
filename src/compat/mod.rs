//! Wire-compatible variants: other programs' semaphore algorithms, spoken on their own
//! keys, so a Rust service can share one semaphore with services that run them.
//!
//! These variants keep the algorithms exactly as their authors published them,
//! weaknesses included (they break some of the guarantees of the crate's own
//! [`Semaphore`](crate::Semaphore), which is the one to use unless you must
//! interoperate). Each one's documentation says which guarantees it keeps.
//!
//! - [`book`]: the counting semaphores of "Redis in Action" (Josiah Carlson, ch. 6.3)
//!   and their Java and Node ports: basic, fair, and fair with a lock.
//! - [`redisson`]: Redisson's `RSemaphore` and `RPermitExpirableSemaphore` (Java), on
//!   Redisson's own keys and channel.

pub mod book;
pub mod redisson;
