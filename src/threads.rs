//! Helpers for the client's background threads and for what may block while a handle
//! is dropped: joining a thread by a deadline, and one time budget for a whole drop.
//!
//! Invariant 13 bounds a `Drop` by the operation timeout. Dropping the last
//! [`Permit`](crate::Permit) that holds the last handle of its client runs two waits on
//! one thread: the release, then the client's joins of its threads. Both take their
//! deadline from [`drop_deadline`], so the second gets only what the first left of the
//! budget that [`DropBudget::start`] opened. A call that can outlast every deadline
//! the library sets (a step inside `redis` or `r2d2` with no timeout of its own) runs
//! through [`run_aside`], which the caller leaves at its deadline.

use std::cell::Cell;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, TryRecvError};

thread_local! {
    /// The end of the budget of the drop this thread is in, if any.
    static DROP_BY: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Runs `work`, a piece of a background thread's work that calls code of the user's
/// (a logger, a metrics recorder): a panic there ends that piece, not the thread.
/// Whether it panicked.
pub(crate) fn shielded(work: impl FnOnce()) -> bool {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).is_err()
}

/// Whether a background thread has been told to stop: its owner signals by dropping
/// the sending side of `stop`, so the channel is disconnected (nothing is ever sent).
pub(crate) fn stopped(stop: &Receiver<()>) -> bool {
    matches!(stop.try_recv(), Err(TryRecvError::Disconnected))
}

/// Gives back, on a thread of its own, what a call that failed after it may have
/// reached the server may have taken: runs `give_back` at once (a reply lost or late:
/// the call ran) and once more `again` later (a request held up on its way that reached
/// the server after the first). `give_back` must be safe whatever the call did (it
/// frees only what the call's own ids name); it logs its own failures. A request held
/// up for longer still takes what it takes (until its expiry, if any).
pub(crate) fn give_back_twice(again: Duration, give_back: impl Fn() + Send + 'static) {
    let spawned = run_aside("redsem-give-back", Instant::now(), move || {
        give_back();
        // (a delay, not a wait for a condition: nothing tells when a request held up
        // on its way arrives)
        std::thread::sleep(again);
        give_back();
    });
    if let Err(e) = spawned {
        log::warn!("redis-semaphore: cannot start a thread to give back after a failed call: {e}");
    }
}

/// Runs `f` on a thread named `name` and waits for its answer until `until`: `Ok(None)`
/// when none came by then (`f` goes on, and its late answer is dropped: a connection
/// in it goes back to its pool), `Err` when no thread could be started. For a call
/// that may block past every deadline the library sets.
pub(crate) fn run_aside<T: Send + 'static>(
    name: &str,
    until: Instant,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<Option<T>> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let _ = tx.send(f());
        })?;
    Ok(rx.recv_deadline(until).ok())
}

/// A drop's time budget, open on this thread until this guard is dropped.
#[derive(Debug)]
pub(crate) struct DropBudget {
    /// The budget that was open before (a drop inside a drop keeps the earlier end).
    outer: Option<Instant>,
}

impl DropBudget {
    /// Opens a budget of `len` from now for everything this thread waits for until the
    /// guard goes; an enclosing budget that ends sooner stays in force.
    pub(crate) fn start(len: Duration) -> Self {
        let end = Instant::now().checked_add(len);
        let outer = DROP_BY.get();
        let new = match (outer, end) {
            (Some(o), Some(e)) => Some(o.min(e)),
            (o, e) => o.or(e),
        };
        DROP_BY.set(new);
        DropBudget { outer }
    }
}

impl Drop for DropBudget {
    fn drop(&mut self) {
        DROP_BY.set(self.outer);
    }
}

/// `deadline`, or the end of the drop budget open on this thread if that is sooner.
pub(crate) fn drop_deadline(deadline: Instant) -> Instant {
    DROP_BY.get().map_or(deadline, |end| end.min(deadline))
}

/// Joins background thread `what` if it ends by `deadline` (`done` disconnects when
/// it does); else leaves it to end by itself once the call to Redis it is in returns,
/// so that a drop never waits on a hung server past the deadline. Never joins the
/// calling thread itself.
pub(crate) fn join_by(
    thread: Option<JoinHandle<()>>,
    done: &Receiver<()>,
    deadline: Instant,
    what: &str,
) {
    let Some(t) = thread else { return };
    if t.thread().id() == std::thread::current().id() {
        return;
    }
    match done.recv_deadline(deadline) {
        Err(RecvTimeoutError::Disconnected) => {
            if t.join().is_err() {
                log::error!("redis-semaphore: the {what} thread panicked");
            }
        }
        _ => log::warn!(
            "redis-semaphore: the {what} thread is still in a call to Redis; it ends by \
             itself when the call does"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_bounds_later_deadlines_on_its_thread_until_it_ends() {
        let far = Instant::now() + Duration::from_secs(3600);
        assert_eq!(drop_deadline(far), far);
        {
            let _outer = DropBudget::start(Duration::from_secs(10));
            let outer_end = drop_deadline(far);
            assert!(outer_end < far);
            {
                // a longer inner budget keeps the outer end
                let _inner = DropBudget::start(Duration::from_secs(100));
                assert_eq!(drop_deadline(far), outer_end);
            }
            assert_eq!(drop_deadline(far), outer_end);
            // another thread has no budget
            let other = std::thread::spawn(move || drop_deadline(far))
                .join()
                .unwrap();
            assert_eq!(other, far);
        }
        assert_eq!(drop_deadline(far), far);
    }
}
