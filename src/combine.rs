//! Combining: the try-acquires and releases that the threads of one client make on one
//! semaphore at the same moment go to Redis together, in one script call.
//!
//! Each script call costs the server a fixed price (reading the request, finding and
//! starting the script, writing the reply: tens of microseconds on a small machine)
//! on top of its work, and a try that fails is nearly all fixed price. When 16 threads
//! hammer one semaphore, that price, not the work, bounds throughput. So the threads
//! take turns: at most four calls per semaphore and client are in flight; whoever
//! comes while they are queues its operation, and the first of them, once a call
//! returns, sends everything queued so far as one `batch` script. A thread alone pays
//! nothing extra: with a call free it takes it without a lock and sends its own
//! one-operation script at once.
//!
//! How many calls may be in flight adapts to the load (C7): four while tries are
//! granted, so that up to four threads never wait for one another; while tries are
//! refused, one per four threads of this client in the combiner. A refused try is
//! server work that bought nothing, and more calls in flight on a full semaphore only
//! make more of them: fewer, bigger calls carry the same releases and tries for less.
//!
//! What each caller sees is unchanged: its operation runs exactly once, atomically, in
//! one script, with the reply it would have had alone at that instant (see
//! `scripts/batch.lua`); it waits for a free call at most until its deadline (C4), a
//! release for the reply no longer either (C5).
//! Blocking acquires, refreshes and everything else bypass the combiner.
//!
//! Invariants:
//! - C1 `leaders` counts the threads sending a call (at most `MAX_IN_FLIGHT`); only
//!   they send. A thread takes a call of its own only while `leaders` is below the
//!   in-flight limit (C7); whenever the queue is not empty, some leader is in flight
//!   and will pass the turn on (C3).
//! - C2 Every queued operation gets exactly one outcome: its reply, a copy of the
//!   call's Redis error, or "run it yourself" when the call never reached Redis (no
//!   connection) or the leader unwound. Resending an operation is safe because every
//!   operation is safe to run twice (same permit id). A call that failed on a broken
//!   connection (the server closed it while it was idle in the pool, say) hands each
//!   operation a copy of that error, and each caller sends its own operation once
//!   more, alone, on a fresh connection (`Semaphore::attempt`, `give_back`): each is
//!   sent again once, by the one thread that reads its reply, so a grant the first
//!   call made and whose reply was lost comes back to its caller as its permit (the
//!   same id), and one whose second send fails is given back as any lost reply's.
//! - C3 A leader hands over before it returns: it gives the queue (up to a batch) to
//!   the queue's first thread, or leaves (`leaders` - 1) when the queue is empty or
//!   more calls are in flight than the limit allows (C7; then another leader is in
//!   flight, which will pass the turn on, since the limit is at least one), so no
//!   operation is left waiting for a leader that will not come.
//! - C4 A queued operation waits for a call until its caller's deadline (the
//!   operation timeout from its start); then, if it is still in the queue, it leaves
//!   it unsent, so that a server that hangs costs a caller about one timeout, not one
//!   per call ahead of it. A thread handed the lead after its deadline sends nothing:
//!   it puts the others back at the head of the queue and passes the turn on; those
//!   whose deadline has passed too leave unsent instead (their callers may already
//!   be waiting for the call's outcome).
//! - C5 A release whose deadline passes while another thread's call carries it stops
//!   waiting for that call (it may still run: a release is safe either way, and the
//!   permit then ends with its lease), so a release, and so `Drop`, never blocks past
//!   its deadline. It leaves marked (`Left`), so that a leader too late to send the
//!   call that carries it (C4) drops it instead of queueing it again, where it would
//!   be handed a lead nobody takes. A try-acquire waits for the call's outcome instead: it must know
//!   whether it was granted (the script's cutoff ends that call's work by its own
//!   deadline anyway).
//! - C6 A call carries its releases before its tries (each group in queue order).
//!   Every operation of a call is pending from before the call is sent until after
//!   its reply, so they are concurrent and any order of them is one their callers
//!   could have seen; releases first is the one in which the tries find the permits
//!   just given back free. (Measured: fewer failed tries per success under
//!   contention, BENCHMARKS.md.)
//! - C7 The in-flight limit is `MAX_IN_FLIGHT` unless one of the last
//!   `CONTENDED_CALLS` calls that carried tries had one refused; then it is the
//!   number of this combiner's callers (queued or sending) divided by
//!   `THREADS_PER_CALL`, rounded up, from 1 to `CONTENDED_IN_FLIGHT`. It only decides
//!   whether a thread may start a call (C1) or a finishing leader leaves instead of
//!   handing over (C3); it never strands a queued operation. (Measured: four
//!   processes of four threads on one full semaphore made 45-90 % more successful
//!   tries with one call in flight each than with four; one process of four threads
//!   on a semaphore with room lost half its throughput with fewer than four; one
//!   process of sixteen threads on a full semaphore made 10-18 % more with two calls
//!   in flight than with four, in half the round trips; BENCHMARKS.md.)

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::scripts::MAX_PERMITS;
use crate::scripts::leased::{Acquired, HotReply};
use parking_lot::{Condvar, Mutex, MutexGuard};

/// The most operations one batch call carries; the rest wait for the next call.
const MAX_BATCH: usize = 64;

/// How many calls per semaphore and client may be in flight at once. Up to four threads
/// never wait for one another (measured: fewer in-flight calls cost throughput with 2–4
/// threads, more made the batches of 16 threads smaller and slower; BENCHMARKS.md).
const MAX_IN_FLIGHT: usize = 4;

/// For how many calls carrying tries a refused try keeps the in-flight limit low (C7).
const CONTENDED_CALLS: usize = 8;

/// While tries are refused, one call in flight per this many callers (C7).
const THREADS_PER_CALL: usize = 4;

/// While tries are refused, at most this many calls in flight (C7): the callers of a
/// full semaphore mostly hear "no", and larger calls spread each call's fixed cost
/// (the script call, the round trip) over more operations.
const CONTENDED_IN_FLIGHT: usize = 2;

/// What the combiner learns from a reply: whether it refused a try (C7).
pub(crate) trait Reply {
    /// Whether this is a try-acquire's "no" (the semaphore full, or waiters ahead).
    fn refused(&self) -> bool;
}

impl Reply for HotReply {
    fn refused(&self) -> bool {
        matches!(self, HotReply::Acquired(Acquired::Busy { .. }))
    }
}

/// The combiner of a leased semaphore's hot path: its replies are the scripts' typed
/// ones.
pub(crate) type SemCombiner = Combiner<HotReply>;

/// One operation of the hot path.
#[derive(Debug)]
pub(crate) enum Op {
    /// A try-acquire (never queued in Redis).
    Acquire {
        id: String,
        n: u32,
        limit: u32,
        lease_ms: u64,
        origin: Arc<str>,
        fair: bool,
        /// When the caller stops waiting for the reply: the script is told not to run
        /// after the server time this instant surely corresponds to.
        give_up: std::time::Instant,
    },
    /// A release.
    Release { id: String },
}

/// Sends a list of operations in one call and returns one reply per operation, in
/// order. Errors from `redis` come back as [`Error::Redis`], unsorted.
pub(crate) type Exec<'a, R> = &'a dyn Fn(&[&Op]) -> Result<Vec<R>>;

/// Why a combined operation has no reply.
#[derive(Debug)]
pub(crate) enum Failed {
    /// The call that carried it failed; after a Redis timeout it may have run.
    Call(Error),
    /// It waited until its deadline for a free call and was never sent (C4).
    NotSent(Duration),
    /// A release whose deadline passed while a call carried it: the call may still
    /// run it (C5).
    Abandoned(Duration),
}

impl From<Failed> for Error {
    fn from(f: Failed) -> Error {
        match f {
            Failed::Call(e) => e,
            Failed::NotSent(waited) => Error::Redis(redis::RedisError::from(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "waited {waited:?} for a free call to redis (every call in flight is slow)"
                ),
            ))),
            Failed::Abandoned(waited) => Error::Redis(redis::RedisError::from(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "gave up after {waited:?} waiting for a shared call to redis to \
                         answer (it may still run)"
                ),
            ))),
        }
    }
}

/// The turn-taking of one semaphore's callers in one client.
#[derive(Debug)]
pub(crate) struct Combiner<R> {
    /// Calls in flight (leaders), at most [`MAX_IN_FLIGHT`]. Raised without the lock
    /// (the fast path of a thread alone), lowered only under the `queue` lock, so a
    /// thread that finds it at the maximum under the lock can queue without being
    /// forgotten (C3).
    leaders: AtomicUsize,
    queue: Mutex<Vec<Arc<Slot<R>>>>,
    /// Threads inside [`run`](Combiner::run): queued, waiting for a reply or sending.
    callers: AtomicUsize,
    /// How many more calls carrying tries keep the limit low (C7): set by a refused
    /// try, lowered by a call whose tries were all granted.
    contended: AtomicUsize,
}

impl<R> Default for Combiner<R> {
    fn default() -> Self {
        Combiner {
            leaders: AtomicUsize::new(0),
            queue: Mutex::new(Vec::new()),
            callers: AtomicUsize::new(0),
            contended: AtomicUsize::new(0),
        }
    }
}

#[derive(Debug)]
struct Slot<R> {
    op: Op,
    /// Its caller's deadline: a late leader does not queue it again past it (C4).
    deadline: Instant,
    outcome: Mutex<Outcome<R>>,
    ready: Condvar,
}

#[derive(Debug)]
enum Outcome<R> {
    Waiting,
    /// This thread leads the next call, carrying these queued operations (its own is
    /// the first).
    Lead(Vec<Arc<Slot<R>>>),
    Done(Result<R>),
    /// The call did not reach Redis: run the operation alone.
    Alone,
    /// A release whose caller left while a call carried it (C5): nobody waits for
    /// it, so it is never handed the lead (C3).
    Left,
    /// Handed back unsent by a late leader after its caller's deadline (C4): it
    /// leaves unsent.
    Expired,
}

impl<R> Slot<R> {
    fn settle(&self, outcome: Outcome<R>) {
        *self.outcome.lock() = outcome;
        self.ready.notify_one();
    }
}

impl<R: Reply> Combiner<R> {
    /// Runs `op`, alone or in a batch with other threads' operations, and returns its
    /// reply. The caller waits until `deadline` at most for a free call (C4), and a
    /// release no longer than that for the reply of a call that carries it (C5).
    pub(crate) fn run(
        &self,
        op: Op,
        exec: Exec<'_, R>,
        deadline: Instant,
    ) -> std::result::Result<R, Failed> {
        let queued_at = Instant::now();
        let _caller = Caller::enter(&self.callers);
        if self.try_lead() {
            return self.lead(&op, Vec::new(), exec).map_err(Failed::Call);
        }
        let slot = {
            let mut queue = self.queue.lock();
            // under the lock `leaders` cannot fall: if a call is free now, take it
            if self.try_lead() {
                drop(queue);
                return self.lead(&op, Vec::new(), exec).map_err(Failed::Call);
            }
            let slot = Arc::new(Slot {
                op,
                deadline,
                outcome: Mutex::new(Outcome::Waiting),
                ready: Condvar::new(),
            });
            queue.push(Arc::clone(&slot));
            slot
        };
        let may_leave_a_call = matches!(slot.op, Op::Release { .. });
        let mut outcome = slot.outcome.lock();
        loop {
            match std::mem::replace(&mut *outcome, Outcome::Waiting) {
                // (`Left` is set only by this thread as it returns)
                Outcome::Waiting | Outcome::Left => {
                    if !slot.ready.wait_until(&mut outcome, deadline).timed_out()
                        || !matches!(*outcome, Outcome::Waiting)
                    {
                        continue;
                    }
                    // C4: leave the queue unsent if it is still there
                    drop(outcome);
                    let mut queue = self.queue.lock();
                    if let Some(k) = queue.iter().position(|s| Arc::ptr_eq(s, &slot)) {
                        queue.remove(k);
                        return Err(Failed::NotSent(queued_at.elapsed()));
                    }
                    // Not in the queue: a leader took it. Leads are handed under the
                    // queue lock (C3), so with that lock held the outcome is either a
                    // lead already or still waiting because a call carries it.
                    outcome = slot.outcome.lock();
                    drop(queue);
                    if matches!(*outcome, Outcome::Waiting) {
                        if may_leave_a_call {
                            // C5: the call goes on without this caller; marked while
                            // its outcome is locked, so that a leader that hands the
                            // call back (C4) drops it instead of queueing it again
                            *outcome = Outcome::Left;
                            return Err(Failed::Abandoned(queued_at.elapsed()));
                        }
                        while matches!(*outcome, Outcome::Waiting) {
                            slot.ready.wait(&mut outcome);
                        }
                    }
                }
                Outcome::Done(reply) => return reply.map_err(Failed::Call),
                Outcome::Expired => return Err(Failed::NotSent(queued_at.elapsed())),
                Outcome::Alone => {
                    drop(outcome);
                    return exec(&[&slot.op])
                        .and_then(|mut v| v.pop().ok_or_else(|| Error::reply("batch", "no reply")))
                        .map_err(Failed::Call);
                }
                Outcome::Lead(mut batch) => {
                    drop(outcome);
                    // batch[0] is this slot (C3 hands the queue to its first thread)
                    let others = batch.split_off(1);
                    if Instant::now() >= deadline {
                        // too late to send anything of its own: the others go back to
                        // the head of the queue and the turn passes on (C4)
                        self.hand_back(others);
                        return Err(Failed::NotSent(queued_at.elapsed()));
                    }
                    return self.lead(&slot.op, others, exec).map_err(Failed::Call);
                }
            }
        }
    }

    /// Sends `own` and `others` in one call as the leader, settles `others`, hands
    /// over (C3) and returns the reply to `own`.
    fn lead(&self, own: &Op, others: Vec<Arc<Slot<R>>>, exec: Exec<'_, R>) -> Result<R> {
        let mut turn = Turn {
            combiner: self,
            others,
        };
        if turn.others.is_empty() {
            // alone (the uncontended case): nothing to order or hand out
            let reply = match <[R; 1]>::try_from(exec(&[own])?) {
                Ok([reply]) => reply,
                Err(v) => {
                    let detail = format!("{} replies to 1 operation", v.len());
                    return Err(Error::reply("batch", detail));
                }
            };
            if matches!(own, Op::Acquire { .. }) {
                self.learn(reply.refused());
            }
            return Ok(reply);
        }
        // C6: the releases go first; `order[k]` is the position (0: `own`, then
        // `others`) of the k-th operation sent
        let count = 1 + turn.others.len();
        let op_at = |k: usize| if k == 0 { own } else { &turn.others[k - 1].op };
        let mut order: Vec<usize> = (0..count).collect();
        order.sort_by_key(|&k| !matches!(op_at(k), Op::Release { .. }));
        let ops: Vec<&Op> = order.iter().map(|&k| op_at(k)).collect();
        let result = exec(&ops);
        let had_tries = ops.iter().any(|op| matches!(op, Op::Acquire { .. }));
        drop(ops);
        match result {
            Ok(replies) if replies.len() == count => {
                if had_tries {
                    self.learn(replies.iter().any(Reply::refused));
                }
                let mut placed: Vec<Option<R>> = (0..count).map(|_| None).collect();
                for (&k, reply) in order.iter().zip(replies) {
                    placed[k] = Some(reply);
                }
                let mut placed = placed.into_iter();
                let mine = placed.next().flatten();
                for (slot, reply) in turn.others.drain(..).zip(placed) {
                    // (every position is in `order` once, so each has its reply)
                    slot.settle(match reply {
                        Some(r) => Outcome::Done(Ok(r)),
                        None => Outcome::Done(Err(Error::reply("batch", "no reply"))),
                    });
                }
                mine.ok_or_else(|| Error::reply("batch", "no reply"))
            }
            Ok(replies) => {
                let detail = format!(
                    "{} replies to {} operations",
                    replies.len(),
                    1 + turn.others.len()
                );
                for slot in turn.others.drain(..) {
                    slot.settle(Outcome::Done(Err(Error::reply("batch", detail.clone()))));
                }
                Err(Error::reply("batch", detail))
            }
            Err(e) => {
                for slot in turn.others.drain(..) {
                    slot.settle(match &e {
                        // the call may have run: each caller sees the error and
                        // handles the doubt as it would for its own call
                        Error::Redis(re) => Outcome::Done(Err(Error::Redis(re.clone()))),
                        // it never reached Redis
                        _ => Outcome::Alone,
                    });
                }
                Err(e)
            }
        }
    }

    /// Takes a free call, if there is one (C1).
    fn try_lead(&self) -> bool {
        let limit = self.limit();
        self.leaders
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_ok()
    }

    /// How many calls may be in flight now (C7): `MAX_IN_FLIGHT`, or while tries are
    /// refused from 1 to `CONTENDED_IN_FLIGHT`.
    fn limit(&self) -> usize {
        if self.contended.load(Ordering::Relaxed) == 0 {
            return MAX_IN_FLIGHT;
        }
        self.callers
            .load(Ordering::Relaxed)
            .div_ceil(THREADS_PER_CALL)
            .clamp(1, CONTENDED_IN_FLIGHT)
    }

    /// Updates the contention after a call that carried tries (C7).
    fn learn(&self, refused: bool) {
        if refused {
            self.contended.store(CONTENDED_CALLS, Ordering::Relaxed);
        } else if self.contended.load(Ordering::Relaxed) > 0 {
            // (a lost update between two leaders only shifts the count by one)
            let _ = self
                .contended
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_sub(1));
        }
    }

    /// Ends a leader's turn (C3).
    fn hand_over(&self) {
        self.pass_turn(self.queue.lock());
    }

    /// Ends the turn of a leader that did not send its call: `others` go back to the
    /// head of the queue, in their order, and the turn passes on (C3).
    fn hand_back(&self, mut others: Vec<Arc<Slot<R>>>) {
        let mut queue = self.queue.lock();
        // a release that left while this lead carried it (C5) has nobody to send it
        // or to lead: it is not queued again (a caller leaves with its outcome
        // locked, so it has either left by now or will find itself in the queue);
        // nor is an operation whose deadline has passed: it leaves unsent (C4). Its
        // caller may have looked for it in the queue already, under this lock, found
        // it carried and waited for the call's outcome (a try); queued again, it
        // would wait past its deadline for whichever call passes it the lead next.
        let now = Instant::now();
        others.retain(|s| {
            let mut outcome = s.outcome.lock();
            if matches!(*outcome, Outcome::Left) {
                return false;
            }
            if now >= s.deadline {
                *outcome = Outcome::Expired;
                s.ready.notify_one();
                return false;
            }
            true
        });
        queue.splice(0..0, others);
        self.pass_turn(queue);
    }

    /// Gives the queue (up to a batch) to its first thread, or leaves when it is
    /// empty. The lead is handed while the queue is locked, so a caller that holds
    /// the lock and is in no queue is either in a call or already leading (C5).
    fn pass_turn(&self, mut queue: MutexGuard<'_, Vec<Arc<Slot<R>>>>) {
        // above the limit, another leader is in flight (the limit is at least one) and
        // passes the turn on when it ends; under the queue lock `leaders` cannot fall
        if queue.is_empty() || self.leaders.load(Ordering::Acquire) > self.limit() {
            self.leaders.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        let take = batch_len(queue.iter().map(|s| &s.op));
        let batch: Vec<Arc<Slot<R>>> = if take == queue.len() {
            std::mem::take(&mut *queue)
        } else {
            queue.drain(..take).collect()
        };
        let first = Arc::clone(&batch[0]);
        first.settle(Outcome::Lead(batch));
        drop(queue);
    }
}

/// How many of the queued operations `ops` (at least one, when there is one) go in
/// one call: at most `MAX_BATCH`, whose acquires ask for at most `MAX_PERMITS`
/// permits in all (the batch script refuses more, K9). A single operation asks for at
/// most `MAX_PERMITS` (the handles check it).
fn batch_len<'a>(ops: impl Iterator<Item = &'a Op>) -> usize {
    let mut asked = 0u64;
    let mut len = 0;
    for op in ops.take(MAX_BATCH) {
        if let Op::Acquire { n, .. } = op {
            asked += u64::from(*n);
            if asked > u64::from(MAX_PERMITS) && len > 0 {
                break;
            }
        }
        len += 1;
    }
    len
}

/// Counts a thread inside [`Combiner::run`] until it leaves, also by unwinding (C7).
struct Caller<'a>(&'a AtomicUsize);

impl<'a> Caller<'a> {
    fn enter(callers: &'a AtomicUsize) -> Self {
        callers.fetch_add(1, Ordering::Relaxed);
        Caller(callers)
    }
}

impl Drop for Caller<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A leader's turn: settles whatever is left unsettled (C2, also when unwinding) and
/// hands over (C3) when it ends.
struct Turn<'a, R: Reply> {
    combiner: &'a Combiner<R>,
    others: Vec<Arc<Slot<R>>>,
}

impl<R: Reply> Drop for Turn<'_, R> {
    fn drop(&mut self) {
        for slot in self.others.drain(..) {
            slot.settle(Outcome::Alone);
        }
        self.combiner.hand_over();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    /// In these tests a reply of "no" is a refused try.
    impl Reply for Value {
        fn refused(&self) -> bool {
            matches!(self, Value::SimpleString(s) if s == "no")
        }
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    fn release(id: &str) -> Op {
        Op::Release { id: id.into() }
    }

    fn echo(ops: &[&Op]) -> Result<Vec<Value>> {
        Ok(ops
            .iter()
            .map(|op| match op {
                Op::Release { id } => Value::SimpleString(id.clone()),
                Op::Acquire { id, .. } => Value::SimpleString(id.clone()),
            })
            .collect())
    }

    #[test]
    fn alone_it_sends_its_own_operation() {
        let c = Combiner::<Value>::default();
        let calls = AtomicUsize::new(0);
        let exec = |ops: &[&Op]| {
            calls.fetch_add(1, Ordering::SeqCst);
            assert_eq!(ops.len(), 1);
            echo(ops)
        };
        for k in 0..3 {
            let v = c.run(release(&k.to_string()), &exec, far()).unwrap();
            assert_eq!(v, Value::SimpleString(k.to_string()));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert_eq!(c.leaders.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn concurrent_callers_each_get_their_own_reply_in_fewer_calls() {
        let c = Arc::new(Combiner::<Value>::default());
        let calls = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let c = Arc::clone(&c);
                let calls = Arc::clone(&calls);
                std::thread::spawn(move || {
                    for k in 0..500 {
                        let id = format!("{t}-{k}");
                        let exec = |ops: &[&Op]| {
                            calls.fetch_add(1, Ordering::SeqCst);
                            std::thread::yield_now();
                            echo(ops)
                        };
                        let v = c.run(release(&id), &exec, far()).unwrap();
                        assert_eq!(v, Value::SimpleString(id));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(c.leaders.load(Ordering::SeqCst), 0);
        assert!(c.queue.lock().is_empty());
        assert!(calls.load(Ordering::SeqCst) <= 8 * 500);
    }

    #[test]
    fn a_queued_operation_leaves_unsent_at_its_deadline() {
        let c = Arc::new(Combiner::<Value>::default());
        let (unblock, blocked) = crossbeam_channel::bounded::<()>(0);
        let leaders: Vec<_> = (0..MAX_IN_FLIGHT)
            .map(|k| {
                let c = Arc::clone(&c);
                let blocked = blocked.clone();
                std::thread::spawn(move || {
                    let slow = |ops: &[&Op]| {
                        let _ = blocked.recv(); // a server that hangs
                        echo(ops)
                    };
                    c.run(release(&format!("slow{k}")), &slow, far()).is_ok()
                })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        while c.leaders.load(Ordering::SeqCst) < MAX_IN_FLIGHT {
            assert!(Instant::now() < deadline, "the slow calls never started");
            std::thread::yield_now();
        }
        let started = Instant::now();
        let late = c.run(
            release("late"),
            &echo,
            Instant::now() + Duration::from_millis(100),
        );
        assert!(matches!(late, Err(Failed::NotSent(_))), "{late:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(c.queue.lock().is_empty(), "it left the queue");
        drop(unblock);
        for l in leaders {
            assert!(l.join().unwrap());
        }
        assert_eq!(c.leaders.load(Ordering::SeqCst), 0);
    }

    /// Starts `MAX_IN_FLIGHT` calls that hang until `gate` gives them a message (or
    /// is dropped), and waits until they are all in flight.
    fn hang_every_call(
        c: &Arc<Combiner<Value>>,
        gate: &crossbeam_channel::Receiver<()>,
    ) -> Vec<std::thread::JoinHandle<bool>> {
        let leaders: Vec<_> = (0..MAX_IN_FLIGHT)
            .map(|k| {
                let c = Arc::clone(c);
                let gate = gate.clone();
                std::thread::spawn(move || {
                    let slow = |ops: &[&Op]| {
                        let _ = gate.recv(); // a server that hangs
                        echo(ops)
                    };
                    c.run(release(&format!("slow{k}")), &slow, far()).is_ok()
                })
            })
            .collect();
        wait_until("the slow calls to start", || {
            c.leaders.load(Ordering::SeqCst) == MAX_IN_FLIGHT
        });
        leaders
    }

    fn wait_until(what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_carried_release_stops_waiting_at_its_deadline() {
        let c = Arc::new(Combiner::<Value>::default());
        let (unblock, gate) = crossbeam_channel::unbounded::<()>();
        let leaders = hang_every_call(&c, &gate);
        // "lead" queues first, so it leads the next call, carrying "carried"; that
        // call hangs too
        let lead = {
            let c = Arc::clone(&c);
            let gate = gate.clone();
            std::thread::spawn(move || {
                let slow = |ops: &[&Op]| {
                    assert_eq!(ops.len(), 2, "it carries the other release");
                    let _ = gate.recv();
                    echo(ops)
                };
                c.run(release("lead"), &slow, far()).is_ok()
            })
        };
        wait_until("the lead to queue", || c.queue.lock().len() == 1);
        let carried = {
            let c = Arc::clone(&c);
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_millis(300);
                let r = c.run(release("carried"), &echo, deadline);
                (r, Instant::now().saturating_duration_since(deadline))
            })
        };
        wait_until("the carried release to queue", || c.queue.lock().len() == 2);
        unblock.send(()).unwrap(); // one slow call ends: "lead" takes the queue
        let (r, late) = carried.join().unwrap();
        assert!(matches!(r, Err(Failed::Abandoned(_))), "{r:?}");
        assert!(
            late < Duration::from_secs(2),
            "returned {late:?} after its deadline"
        );
        drop(unblock);
        for l in leaders {
            assert!(l.join().unwrap());
        }
        assert!(lead.join().unwrap());
        assert_eq!(c.leaders.load(Ordering::SeqCst), 0);
        assert!(c.queue.lock().is_empty());
    }

    #[test]
    fn the_next_in_the_queue_is_served_after_one_leaves_unsent() {
        let c = Arc::new(Combiner::<Value>::default());
        let (unblock, gate) = crossbeam_channel::unbounded::<()>();
        let leaders = hang_every_call(&c, &gate);
        // "late" queues first with a deadline that passes while every call hangs;
        // "next" queues behind it
        let late = {
            let c = Arc::clone(&c);
            std::thread::spawn(move || {
                let never = |_: &[&Op]| -> Result<Vec<Value>> { panic!("sent after its deadline") };
                c.run(
                    release("late"),
                    &never,
                    Instant::now() + Duration::from_millis(200),
                )
            })
        };
        wait_until("the late one to queue", || c.queue.lock().len() == 1);
        let next = {
            let c = Arc::clone(&c);
            std::thread::spawn(move || c.run(release("next"), &echo, far()))
        };
        wait_until("the next one to queue", || c.queue.lock().len() == 2);
        let r = late.join().unwrap();
        assert!(matches!(r, Err(Failed::NotSent(_))), "{r:?}");
        assert_eq!(c.queue.lock().len(), 1, "only the late one left the queue");
        drop(unblock);
        let v = next.join().unwrap().unwrap();
        assert_eq!(v, Value::SimpleString("next".into()));
        for l in leaders {
            assert!(l.join().unwrap());
        }
        assert_eq!(c.leaders.load(Ordering::SeqCst), 0);
    }

    fn acquire(id: &str) -> Op {
        Op::Acquire {
            id: id.into(),
            n: 1,
            limit: 1,
            lease_ms: 1000,
            origin: Arc::from("test"),
            fair: true,
            give_up: far(),
        }
    }

    #[test]
    fn a_batch_takes_at_most_64_operations_asking_for_at_most_max_permits_in_all() {
        let many = |n: u32| {
            let mut op = acquire("x");
            if let Op::Acquire { n: m, .. } = &mut op {
                *m = n;
            }
            op
        };
        let ops: Vec<Op> = (0..100).map(|k| release(&k.to_string())).collect();
        assert_eq!(batch_len(ops.iter()), MAX_BATCH);
        let ops = [many(6_000), release("r"), many(4_000), many(1)];
        assert_eq!(batch_len(ops.iter()), 3, "up to 10,000 permits asked");
        let ops = [many(MAX_PERMITS), many(1)];
        assert_eq!(batch_len(ops.iter()), 1);
        let ops = [release("r")];
        assert_eq!(batch_len(ops.iter()), 1);
        assert_eq!(batch_len([].iter()), 0);
    }

    fn id_of(op: &Op) -> &str {
        match op {
            Op::Release { id } | Op::Acquire { id, .. } => id,
        }
    }

    #[test]
    fn a_call_carries_its_releases_first_and_each_caller_gets_its_own_reply() {
        let c = Arc::new(Combiner::<Value>::default());
        let (unblock, gate) = crossbeam_channel::unbounded::<()>();
        let leaders = hang_every_call(&c, &gate);
        // "t0" queues first, so it leads the next call and carries the others
        let sent = Arc::new(Mutex::new(Vec::<String>::new()));
        let lead = {
            let c = Arc::clone(&c);
            let sent = Arc::clone(&sent);
            std::thread::spawn(move || {
                let record = |ops: &[&Op]| {
                    *sent.lock() = ops.iter().map(|op| id_of(op).to_owned()).collect();
                    echo(ops)
                };
                c.run(acquire("t0"), &record, far())
            })
        };
        wait_until("the lead to queue", || c.queue.lock().len() == 1);
        let mut carried = Vec::new();
        for (k, op) in [release("r1"), acquire("t2"), release("r3"), acquire("t4")]
            .into_iter()
            .enumerate()
        {
            let id = id_of(&op).to_owned();
            let c2 = Arc::clone(&c);
            carried.push((id, std::thread::spawn(move || c2.run(op, &echo, far()))));
            wait_until("the next to queue", || c.queue.lock().len() == k + 2);
        }
        unblock.send(()).unwrap(); // one slow call ends: "t0" takes the queue
        assert_eq!(
            lead.join().unwrap().unwrap(),
            Value::SimpleString("t0".into())
        );
        for (id, t) in carried {
            assert_eq!(t.join().unwrap().unwrap(), Value::SimpleString(id));
        }
        assert_eq!(*sent.lock(), ["r1", "r3", "t0", "t2", "t4"]);
        drop(unblock);
        for l in leaders {
            assert!(l.join().unwrap());
        }
        assert_eq!(c.leaders.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn the_limit_is_four_unless_tries_are_refused_then_one_per_four_callers_up_to_two() {
        let c = Combiner::<Value>::default();
        c.callers.store(16, Ordering::SeqCst);
        assert_eq!(c.limit(), MAX_IN_FLIGHT);
        c.learn(true);
        for (callers, limit) in [(1, 1), (4, 1), (5, 2), (8, 2), (9, 2), (16, 2), (40, 2)] {
            c.callers.store(callers, Ordering::SeqCst);
            assert_eq!(c.limit(), limit, "{callers} callers");
        }
        c.callers.store(4, Ordering::SeqCst);
        for _ in 1..CONTENDED_CALLS {
            c.learn(false);
            assert_eq!(c.limit(), 1, "still contended");
        }
        c.learn(false);
        assert_eq!(c.limit(), MAX_IN_FLIGHT, "no refusal in the last calls");
        c.callers.store(0, Ordering::SeqCst);
    }

    #[test]
    fn while_tries_are_refused_four_threads_share_one_call_and_each_gets_its_reply() {
        let c = Arc::new(Combiner::<Value>::default());
        let calls = Arc::new(AtomicUsize::new(0));
        let in_exec = Arc::new(AtomicUsize::new(0));
        let most_later = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (c, calls) = (Arc::clone(&c), Arc::clone(&calls));
                let (in_exec, most_later) = (Arc::clone(&in_exec), Arc::clone(&most_later));
                std::thread::spawn(move || {
                    for k in 0..300 {
                        let exec = |ops: &[&Op]| {
                            let call = calls.fetch_add(1, Ordering::SeqCst);
                            let now_in = in_exec.fetch_add(1, Ordering::SeqCst) + 1;
                            if call >= 100 {
                                most_later.fetch_max(now_in, Ordering::SeqCst);
                            }
                            std::thread::yield_now();
                            in_exec.fetch_sub(1, Ordering::SeqCst);
                            Ok(ops
                                .iter()
                                .map(|op| match op {
                                    Op::Acquire { .. } => Value::SimpleString("no".into()),
                                    Op::Release { id } => Value::SimpleString(id.clone()),
                                })
                                .collect())
                        };
                        let id = format!("{t}-{k}");
                        let (op, want) = if k % 2 == 0 {
                            (acquire(&id), "no".to_owned())
                        } else {
                            (release(&id), id)
                        };
                        assert_eq!(c.run(op, &exec, far()).unwrap(), Value::SimpleString(want));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(calls.load(Ordering::SeqCst) > 100, "too few calls to judge");
        assert_eq!(
            most_later.load(Ordering::SeqCst),
            1,
            "one call in flight once tries are refused"
        );
        assert_eq!(c.leaders.load(Ordering::SeqCst), 0);
        assert_eq!(c.callers.load(Ordering::SeqCst), 0);
        assert!(c.queue.lock().is_empty());
    }

    /// The ids of the operations in `c`'s queue, for a failure's message.
    fn queued_ids(c: &Combiner<Value>) -> Vec<String> {
        c.queue
            .lock()
            .iter()
            .map(|s| id_of(&s.op).to_owned())
            .collect()
    }

    /// With every call in flight: thread L queues an acquire ending at `start + l_ms`,
    /// then a second thread queues `other` ending at `start + other_ms`, and a call
    /// ends (`pass_turn`) only once both deadlines have passed (after `start +
    /// after_ms`): L is handed a call it is too late to send, carrying `other`. Their
    /// threads, the second returning when it returned.
    #[allow(clippy::type_complexity)]
    fn late_lead(
        c: &Arc<Combiner<Value>>,
        start: Instant,
        (l_ms, other, other_ms, after_ms): (u64, Op, u64, u64),
    ) -> (
        std::thread::JoinHandle<std::result::Result<Value, Failed>>,
        std::thread::JoinHandle<(std::result::Result<Value, Failed>, Instant)>,
    ) {
        let never = |_: &[&Op]| -> Result<Vec<Value>> { panic!("sent after its deadline") };
        let l = {
            let c = Arc::clone(c);
            std::thread::spawn(move || {
                c.run(acquire("L"), &never, start + Duration::from_millis(l_ms))
            })
        };
        wait_until("L to queue", || c.queue.lock().len() == 1);
        let o = {
            let c = Arc::clone(c);
            std::thread::spawn(move || {
                let r = c.run(other, &never, start + Duration::from_millis(other_ms));
                (r, Instant::now())
            })
        };
        wait_until("the other to queue", || c.queue.lock().len() == 2);
        let queue = c.queue.lock();
        wait_until("both deadlines to pass", || {
            start.elapsed() > Duration::from_millis(after_ms)
        });
        c.pass_turn(queue);
        (l, o)
    }

    /// C3/C5: a thread is handed the lead of a call carrying a release only once its
    /// own deadline has passed (it was not scheduled in time), and the release's
    /// deadline passes too before it runs: the release leaves (C5), the late leader
    /// hands the call back (C4). The release must not be put back in the queue and
    /// handed the lead with nobody left to take it: that call would never be given
    /// back, and an operation carried with it would never be answered.
    #[test]
    fn a_release_that_left_its_call_is_never_handed_the_lead() {
        // (each round takes either order of the two threads, at the scheduler's will;
        // the bug showed in about every other round)
        for round in 0..8 {
            let c = Arc::new(Combiner::<Value>::default());
            // every call is in flight; this thread stands for one of them, which ends
            // (`pass_turn` is what a finishing leader runs) after both deadlines: L is
            // handed a call it is too late to send, carrying R
            c.leaders.store(MAX_IN_FLIGHT, Ordering::SeqCst);
            let start = Instant::now();
            let (l, r) = late_lead(&c, start, (150, release("R"), 300, 320));
            let lr = l.join().unwrap();
            assert!(matches!(lr, Err(Failed::NotSent(_))), "{lr:?}");
            let (rr, _) = r.join().unwrap();
            assert!(
                matches!(rr, Err(Failed::NotSent(_) | Failed::Abandoned(_))),
                "{rr:?}"
            );
            let deadline = Instant::now() + Duration::from_secs(5);
            while c.leaders.load(Ordering::SeqCst) != MAX_IN_FLIGHT - 1 {
                assert!(
                    Instant::now() < deadline,
                    "round {round}: the call L was handed is never given back: {} calls \
                     in flight, queue {:?}",
                    c.leaders.load(Ordering::SeqCst),
                    queued_ids(&c)
                );
                std::thread::yield_now();
            }
            assert!(c.queue.lock().is_empty());
        }
    }

    /// C4: a try-acquire whose deadline passes while a late leader holds the call
    /// that carries it (the lead was handed to that leader after its own deadline)
    /// finds itself in no queue and waits for the call's outcome; the late leader
    /// then puts it back in the queue unsent and, with more calls in flight than the
    /// contended limit allows, leaves without handing the turn on. The try waited
    /// there, past its deadline, for whichever call in flight ended next (up to a
    /// whole operation timeout later; here, where no call really is in flight, for
    /// ever), instead of leaving unsent at its deadline.
    #[test]
    fn a_try_handed_back_after_its_deadline_leaves_unsent() {
        // (each round takes either order of the two threads, at the scheduler's will)
        for round in 0..8 {
            let c = Arc::new(Combiner::<Value>::default());
            // every call is in flight; this thread stands for them. A's deadline
            // passes first, so that it mostly looks for itself before L takes the
            // lead it was handed (the bug needs that order); a call ends after both
            // deadlines: L is handed a call it is too late to send, carrying A
            c.leaders.store(MAX_IN_FLIGHT, Ordering::SeqCst);
            let start = Instant::now();
            let a_deadline = start + Duration::from_millis(300);
            let (l, a) = late_lead(&c, start, (310, acquire("A"), 300, 330));
            // meanwhile a call in flight had a try refused: for these two callers the
            // limit is now one call in flight, and more are
            c.learn(true);
            let lr = l.join().unwrap();
            assert!(matches!(lr, Err(Failed::NotSent(_))), "{lr:?}");
            let deadline = Instant::now() + Duration::from_secs(3);
            while !a.is_finished() {
                assert!(
                    Instant::now() < deadline,
                    "round {round}: the try waits past its deadline for a call that will \
                     not come: queue {:?}",
                    queued_ids(&c)
                );
                std::thread::yield_now();
            }
            let (ar, returned) = a.join().unwrap();
            assert!(matches!(ar, Err(Failed::NotSent(_))), "{ar:?}");
            assert!(
                returned.saturating_duration_since(a_deadline) < Duration::from_secs(2),
                "returned {:?} after its deadline",
                returned.saturating_duration_since(a_deadline)
            );
            assert!(c.queue.lock().is_empty(), "round {round}: A left the queue");
        }
    }

    #[test]
    fn a_failed_call_reaches_every_caller_of_the_batch() {
        let c = Arc::new(Combiner::<Value>::default());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let c = Arc::clone(&c);
                std::thread::spawn(move || {
                    for k in 0..200 {
                        let exec = |ops: &[&Op]| -> Result<Vec<Value>> {
                            if ops.len() > 1 || k % 2 == 0 {
                                Err(Error::Redis(redis::RedisError::from((
                                    redis::ErrorKind::Io,
                                    "boom",
                                ))))
                            } else {
                                echo(ops)
                            }
                        };
                        let r = c.run(release(&format!("{t}-{k}")), &exec, far());
                        if k % 2 == 0 {
                            assert!(matches!(r, Err(Failed::Call(Error::Redis(_)))));
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(c.leaders.load(Ordering::SeqCst), 0);
    }
}
