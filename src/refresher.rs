//! The background thread of a [`Client`](crate::Client): it keeps the leases of every
//! live permit of the client alive, one script call per semaphore per tick, and tells
//! each permit the moment its lease is known to be gone.
//!
//! Invariants it keeps:
//!
//! - **One call per semaphore per tick.** Permits are grouped by (semaphore, lease);
//!   a tick sends all ids of a group in one `refresh` script call, up to 1,000 of
//!   them (a larger group in chunks of 1,000, one call each). When a chunk fails, the
//!   chunks answered before it count (their permits renewed, or lost when found gone),
//!   and only the rest wait for the retry.
//!   A round takes, between its calls, what came due while it ran (in O(1) when
//!   nothing did), first: a long round (many semaphores, a distant server) does not
//!   keep a permit registered meanwhile, or a group of a short period, from its
//!   renewal until the round has ended. A failed renewal is tried again
//!   [`RETRY_AFTER_FAILURE`] (at most a period) after it failed, never at once; and
//!   after the rest of the round when the call took that long or more (cut by its
//!   wait, against a server slow for that semaphore): the tries of slow semaphores do
//!   not keep the others of the round, which the server answers, from their renewals.
//!   A group is in one batch at a time: once taken, it is not taken again until that
//!   batch has been sent and its answer applied (`Registry::settle`), or the batch is
//!   gone unsettled (a round that ended early, a panic, a call not sent: `Taken`
//!   releases it). When it comes due again meanwhile (a round longer than its
//!   period), its queued batch moves up instead, and a permit registered meanwhile
//!   joins that batch when it is sent; a renewal that succeeded is due again a period
//!   after it was sent. What came due goes the earliest deadline first. So a round
//!   longer than the periods renews each group once at a time, each in its turn: no
//!   group renewed twice or thrice in a row while the batches behind it wait.
//! - **A renewal counts once the replicas have it.** For a semaphore with
//!   `wait_replicas(n, t)` each renewal call is followed by `WAIT n t` on its
//!   connection (one per call, none when it renewed nothing, none without
//!   `wait_replicas`); when fewer than `n` replicas acknowledged it, or the `WAIT`
//!   failed, the call counts as failed (its permits keep their deadlines, tried again
//!   soon), while the ids it found gone are lost all the same. A failover that
//!   promotes a replica which acknowledged keeps every deadline the client counts on.
//! - **A dropped permit is never renewed.** A permit leaves its group before its release
//!   is sent, and the script only renews ids that are still held (`ZADD XX`), so a
//!   renewal racing a release cannot bring the permit back.
//! - **Loss is declared, never missed.** A permit is declared lost when the script says
//!   its id is gone, or when, by this process's monotonic clock, its lease must have run
//!   out since the last renewal that succeeded (measured from when that renewal was
//!   *sent*, so the client's idea of the deadline is never later than the server's).
//! - **Loss is declared on time, also when Redis hangs or refuses connections.** The
//!   thread wakes at the earliest such deadline of any permit, and it never waits on
//!   Redis (pool checkout, command read or write) past the earliest deadline still ahead
//!   (nor longer than the operation timeout, nor less than [`MIN_WAIT`]); a deadline
//!   that passes during a call is declared right after that call. So `lost()` fires at
//!   the deadline, give or take `MIN_WAIT`, not when a dead server's timeouts run out.
//!   Each group keeps a lower bound of its earliest deadline, so a wake reads the
//!   deadlines of no group whose earliest is still ahead.
//!   On a Redis Cluster every call runs on a thread of its own ([`call_by`]), waited
//!   for [`SHORT_WAIT`] at most, and applies its answer itself when it comes: a node
//!   that hangs then holds back neither the losses nor the renewals on the other
//!   nodes (calls about semaphores that were slow, or whose node was, go last, and
//!   have a quarter of the pool: the thread reads the cluster's slot map, so that the
//!   first slow call about a node that hangs stands for every semaphore on it). At
//!   most one call per semaphore, and calls on half the pool, are on their way.
//! - **What is owed is sent.** Releases owed after a lost reply, and give-backs of
//!   permits too few replicas acknowledged that failed (also a Redisson layout's),
//!   are sent again until they succeed or their end passes, and once more, on a
//!   thread of their own, when the last client handle is gone.
//! - **The thread never dies of an error.** Failures are logged and retried at the next
//!   tick; one group's bad reply does not touch the others. It holds only [`Shared`]
//!   (pool and registry), never a client handle, and ends when the last handle drops
//!   the channel's sender.
//! - **Nothing slow under the lock.** The registry lock is held only to copy what is
//!   due; script calls and loss notifications happen after it is released.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, TryRecvError};
use parking_lot::Mutex;

use crate::clock::lease_end;
use crate::error::LostReason;
use crate::registry::{Batch, Cleanup, GiveBack, GroupKey, PermitState, RETRY_AFTER_FAILURE};
use crate::scripts::Keys;
use crate::scripts::leased;
pub(crate) use crate::scripts::leased::Renewal;
use crate::shared::Shared;
use crate::stats::Counters;
use crate::threads::{run_aside, shielded};
/// The shortest time a renewal may wait on Redis, even when some permit's deadline is
/// nearer: a healthy call is not cut short because another lease is about to end.
const MIN_WAIT: Duration = Duration::from_millis(5);
/// The most ids one refresh call carries (the script refuses more than 1000).
const REFRESH_CHUNK: usize = 1000;
/// The thread's body: sleeps until the next group is due or the schedule changes,
/// and returns when every client handle is gone (the channel disconnects).
pub(crate) fn run(shared: Arc<Shared>, wake: Receiver<()>) {
    let asides = SharedAsides::default();
    loop {
        // a call on its way may settle its group sooner (a failure is tried again soon)
        // after this thread went to sleep: look again meanwhile
        let soon = (!asides.lock().on_way.is_empty()).then(|| Instant::now() + RETRY_AFTER_FAILURE);
        let next = {
            let mut registry = shared.registry.lock();
            let next = registry.next_wake().into_iter().chain(soon).min();
            // (a permit registered from here on wakes this thread only when due sooner)
            registry.sleeping_until(next);
            next
        };
        let woke = match next {
            Some(t) => wake.recv_deadline(t),
            None => wake.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        if let Err(RecvTimeoutError::Disconnected) = woke {
            give_back_owed(&shared);
            return;
        }
        shared.registry.lock().awake();
        // A panic in code of the user's that a round calls (a logger, a metrics
        // recorder) ends the piece of work it was called for (one loss, one release
        // owed, one batch's renewal: `lose_each`, `clean_up`, the loops of `tick`),
        // not the round: nothing the round took out of the registry is dropped, and
        // one that panics at every round keeps nothing else from being done. Here,
        // what is left (a panic outside those pieces) ends the round, not the thread.
        shielded(|| tick(&shared, &asides, &wake));
    }
}

/// How long a call on a cluster is waited for: a node that answers does so well within
/// it, and an answer that comes later is applied then, on the call's own thread
/// ([`renew`]). So a node that hangs costs a tick at most this much per semaphore on
/// it, not the operation timeout.
const SHORT_WAIT: Duration = Duration::from_millis(50);

/// How long a semaphore, or a node of a cluster, counts as slow after its last slow
/// call.
const SLOW_FOR: Duration = Duration::from_secs(30);

/// How long a cluster's slot map serves before it is read again ([`read_slot_map`]).
const SLOT_MAP_FOR: Duration = Duration::from_secs(60);

/// How soon a slot map read that failed is tried again (at once on another node when
/// the failed one was sent to a node of the map's choosing).
const SLOT_MAP_RETRY: Duration = Duration::from_secs(5);

/// How old the slot map must be for a node turning slow to have it read again (a map
/// read since the node turned slow already says where its slots are).
const SLOT_MAP_REREAD: Duration = Duration::from_secs(1);

/// How long a slot map read may take: `CLUSTER SLOTS` is answered at once by a node
/// that answers at all, and a read sent to a node that hangs (one the map did not know
/// to be slow: a slot moved there since) is given up soon and sent to another.
const SLOT_MAP_READ_FOR: Duration = Duration::from_millis(500);

/// The thread's calls that run on threads of their own (on a cluster), by the holders
/// key of their semaphore.
#[derive(Default)]
struct Asides {
    /// Calls on their way.
    on_way: HashSet<String>,
    /// Semaphores whose last call took longer than [`SHORT_WAIT`], and when it was
    /// (forgotten after [`SLOW_FOR`], so that semaphores no longer held leave no trace).
    slow: HashMap<String, Instant>,
    /// The nodes of those calls, and when: the first slow call about a node that hangs
    /// stands for every semaphore on it, not only its own (forgotten after
    /// [`SLOW_FOR`], or at the node's first quick answer).
    slow_nodes: HashMap<Node, Instant>,
    /// Which node serves each slot, as the cluster last said.
    slots: SlotMap,
}

impl Asides {
    /// Whether a call about the semaphore whose holders key is `key` is likely slow:
    /// its own last call was, or one about another semaphore on its node.
    fn is_slow(&self, key: &str) -> bool {
        self.slow.contains_key(key)
            || self
                .slots
                .node_of(key)
                .is_some_and(|n| self.slow_nodes.contains_key(&n))
    }
}

/// Which node of a cluster serves each slot (`CLUSTER SLOTS`), read in the background
/// ([`read_slot_map`]). Used to budget the thread's calls only: a map gone stale (a
/// slot moved since) misplaces a semaphore's call in the budget, and nothing else. A
/// node that turns slow has the map read again at once (from a node that is not slow)
/// when it is older than [`SLOT_MAP_REREAD`]: a slot moved onto a node that then hangs would
/// otherwise make its first slow call count for the slot's old node, and every
/// semaphore there, which answers, would wait behind the hung node's calls.
#[derive(Default)]
struct SlotMap {
    /// Slot ranges (first, last, node), by first slot.
    ranges: Vec<(u16, u16, Node)>,
    /// When it is read next (`None`: at once).
    next_read: Option<Instant>,
    /// When the map in use was read.
    read_at: Option<Instant>,
    /// Whether a read is on its way.
    reading: bool,
    /// Nodes a read sent to failed, and when (not asked again for [`SLOW_FOR`]).
    failed: HashMap<Node, Instant>,
}

impl SlotMap {
    /// The node serving the slot of `key`, when the map has it.
    fn node_of(&self, key: &str) -> Option<Node> {
        if self.ranges.is_empty() {
            return None;
        }
        let slot = leased::slot_of(key.as_bytes());
        let i = self
            .ranges
            .partition_point(|r| r.0 <= slot)
            .checked_sub(1)?;
        let (_, last, node) = &self.ranges[i];
        (slot <= *last).then(|| Arc::clone(node))
    }

    /// A node of the map other than those of `avoid` and those a read failed on
    /// lately, to read the map from (`None`: any node, as the cluster client picks one).
    fn node_to_ask(&self, avoid: &HashMap<Node, Instant>) -> Option<Node> {
        let now = Instant::now();
        self.ranges.iter().map(|r| &r.2).find_map(|n| {
            let failed = self
                .failed
                .get(n)
                .is_some_and(|at| now.saturating_duration_since(*at) < SLOW_FOR);
            (!avoid.contains_key(n) && !failed).then(|| Arc::clone(n))
        })
    }
}

/// A node of a cluster: its host and port, as `CLUSTER SLOTS` names it.
type Node = Arc<(String, u16)>;

/// [`Asides`], shared with the threads of the calls.
type SharedAsides = Arc<Mutex<Asides>>;

/// Takes a semaphore's key out of [`Asides::on_way`] when its call's thread ends, also
/// when the call panics.
struct OnWay(SharedAsides, String);

impl Drop for OnWay {
    fn drop(&mut self) {
        self.0.lock().on_way.remove(&self.1);
    }
}

/// What became of a call of this thread ([`call_by`]).
enum Called<T> {
    /// It ended while this thread waited.
    Done(T),
    /// It goes on, on its own thread, and does what it does with its own answer (see
    /// [`renew`]).
    LeftRunning,
    /// It was not sent: a call about the semaphore is still on its way, or there was no
    /// room or no thread for it.
    NotSent(crate::Error),
}

/// Runs `call`, one call of this thread to Redis about the semaphore whose holders key
/// is `key`, and says what became of it ([`Called`]).
///
/// Off a cluster the call runs here: every step of it is bounded by the deadlines the
/// library sets, which the caller gives it. On a cluster it runs on a thread of its own,
/// waited for until `wait_until`, so that a node that hangs, or any step that outlasts
/// the library's deadlines, does not hold this thread. At most one call per semaphore
/// is on its way, and calls are on their way on at most half the pool (a quarter for
/// semaphores whose last call was slow, or the last call about their node, so that
/// those of a hung node leave room for the others from its first slow call on): a
/// hung node costs at most one thread per semaphore on it, and leaves the other
/// callers of the pool half of it.
fn call_by<T: Send + 'static>(
    shared: &Arc<Shared>,
    asides: &SharedAsides,
    key: &str,
    wait_until: Instant,
    call: impl FnOnce(&Shared) -> T + Send + 'static,
) -> Called<T> {
    if !shared.is_cluster() {
        return Called::Done(call(shared));
    }
    {
        let mut a = asides.lock();
        if a.on_way.contains(key) {
            return Called::NotSent(late(format!(
                "a call about {key} is still on its way (a node of the cluster hangs?)"
            )));
        }
        let mut most = on_way_at_most(shared);
        if a.is_slow(key) {
            most = (most / 2).max(1);
        }
        if a.on_way.len() >= most {
            return Called::NotSent(late(format!(
                "{} calls of the background thread are on their way (a node of the cluster \
                 hangs?); {key} is tried again soon",
                a.on_way.len()
            )));
        }
        a.on_way.insert(key.to_owned());
    }
    let s = Arc::clone(shared);
    let on_way = OnWay(Arc::clone(asides), key.to_owned());
    let started = Instant::now();
    let answer = run_aside("redsem-renew", wait_until, move || {
        let _on_way = on_way;
        call(&s)
    });
    let mut a = asides.lock();
    let node = a.slots.node_of(key);
    match answer {
        Ok(Some(answer)) if started.elapsed() <= SHORT_WAIT => {
            a.slow.remove(key);
            if let Some(node) = node {
                a.slow_nodes.remove(&node);
            }
            Called::Done(answer)
        }
        Ok(answer) => {
            let now = Instant::now();
            a.slow.insert(key.to_owned(), now);
            if let Some(node) = node
                && a.slow_nodes.insert(node, now).is_none()
                && a.slots
                    .read_at
                    .is_some_and(|at| now.saturating_duration_since(at) >= SLOT_MAP_REREAD)
            {
                // a node turned slow: the map it was found by is read again, now (a
                // slot moved since would count the slow call for a node that answers)
                a.slots.next_read = None;
                drop(a);
                read_slot_map(shared, asides);
            }
            answer.map_or(Called::LeftRunning, Called::Done)
        }
        // (the closure, and the key's guard with it, went with the failed spawn)
        Err(e) => Called::NotSent(late(format!("no thread for the call about {key}: {e}"))),
    }
}

/// How many calls of this thread may be on their way at once on a cluster: half the
/// pool (the other callers of the pool keep the other half).
fn on_way_at_most(shared: &Shared) -> usize {
    (shared.pool.max_size() / 2).max(1) as usize
}

/// On a cluster, reads which node serves each slot (`CLUSTER SLOTS`), on a thread of
/// its own and not waited for, when the map is due ([`SLOT_MAP_FOR`] after the last
/// read, [`SLOT_MAP_RETRY`] after a failed one; at once when a node turns slow), one
/// at a time; each node asked within [`SLOT_MAP_READ_FOR`], and one that fails is left
/// for the next node the map names (it may be the one that hangs). A read takes a
/// connection besides the calls on their way, not their room. Never with a budget
/// of one call (a pool of up to three connections): the map could not keep a hung
/// node's calls from the others' room then (one call on its way fills it, slow or
/// not), and a read sent to a hung node would hold that room itself.
fn read_slot_map(shared: &Arc<Shared>, asides: &SharedAsides) {
    if !shared.is_cluster() || on_way_at_most(shared) < 2 {
        return;
    }
    let ask = {
        let mut a = asides.lock();
        let now = Instant::now();
        if a.slots.reading || a.slots.next_read.is_some_and(|t| now < t) {
            return;
        }
        a.slots.reading = true;
        // (from a node that answers, when the map names one: a read sent to the node
        // that hangs would hold a call's room for an operation timeout)
        a.slots.node_to_ask(&a.slow_nodes)
    };
    /// Ends the read (asked of node `.1`, when chosen) in the map, also when the read
    /// panics (a logger of the user's).
    struct Reading(SharedAsides, Option<Node>, Option<Vec<(u16, u16, Node)>>);
    impl Drop for Reading {
        fn drop(&mut self) {
            let mut a = self.0.lock();
            let now = Instant::now();
            match self.2.take() {
                Some(ranges) => {
                    let old = std::mem::replace(&mut a.slots.ranges, ranges);
                    a.slots.next_read = Some(now + SLOT_MAP_FOR);
                    a.slots.read_at = Some(now);
                    // the slow nodes, found by the old map, are found again by the new
                    // one: each slow call counts for the node its slot is on now
                    let old = SlotMap {
                        ranges: old,
                        ..SlotMap::default()
                    };
                    let mut slow_nodes: HashMap<Node, Instant> = HashMap::new();
                    for (key, at) in &a.slow {
                        let was = old.node_of(key).filter(|n| a.slow_nodes.contains_key(n));
                        if let (Some(_), Some(node)) = (was, a.slots.node_of(key)) {
                            let t = slow_nodes.entry(node).or_insert(*at);
                            *t = (*t).max(*at);
                        }
                    }
                    a.slow_nodes = slow_nodes;
                }
                // (every node the map names failed, or the cluster client's choice)
                None => a.slots.next_read = Some(now + SLOT_MAP_RETRY),
            }
            a.slots.reading = false;
        }
    }
    let reading = Reading(Arc::clone(asides), ask, None);
    let (s, sides) = (Arc::clone(shared), Arc::clone(asides));
    let spawned = run_aside("redsem-slots", Instant::now(), move || {
        let mut reading = reading;
        let op = s.op_timeout;
        // a node chosen that fails is left for the next one the map names, at once
        // (it may be the one that hangs), each read within SLOT_MAP_READ_FOR
        loop {
            let node = reading.1.clone();
            let until = Instant::now() + op.min(SLOT_MAP_READ_FOR);
            let read = s.pool.run_by(Some(until), op, |c| {
                c.cluster()
                    .map(|mut cluster| {
                        leased::cluster_slot_owners_at(&mut cluster, node.as_deref())
                    })
                    .transpose()
            });
            match read {
                Ok(Some(owners)) => {
                    let mut ranges: Vec<(u16, u16, Node)> = owners
                        .into_iter()
                        .map(|(first, last, node)| (first, last, Arc::new(node)))
                        .collect();
                    ranges.sort_unstable_by_key(|r| r.0);
                    reading.2 = Some(ranges);
                }
                // (a pool of the user's: no map, read again later all the same)
                Ok(None) => reading.2 = Some(Vec::new()),
                Err(e) => {
                    log::debug!("redis-semaphore: reading the cluster's slot map failed: {e}");
                    if let Some(failed) = reading.1.take() {
                        let mut a = sides.lock();
                        a.slots.failed.insert(failed, Instant::now());
                        reading.1 = a.slots.node_to_ask(&a.slow_nodes);
                        if reading.1.is_some() {
                            continue;
                        }
                    }
                }
            }
            break;
        }
    });
    if let Err(e) = spawned {
        log::debug!("redis-semaphore: no thread to read the cluster's slot map: {e}");
    }
}

/// The error of a call this thread did not wait for to the end.
fn late(message: String) -> crate::Error {
    crate::Error::Redis(std::io::Error::new(std::io::ErrorKind::TimedOut, message).into())
}

/// Whether every client handle is gone (nudges still queued are dropped: the loop
/// reads the schedule again after each tick anyway).
fn stopping(wake: &Receiver<()>) -> bool {
    loop {
        match wake.try_recv() {
            Ok(()) => {}
            Err(TryRecvError::Empty) => return false,
            Err(TryRecvError::Disconnected) => return true,
        }
    }
}

/// One round of work; it stops between calls once the last handle is gone, so that
/// the drop which joins the thread waits for one call at most, not the whole round.
fn tick(shared: &Arc<Shared>, asides: &SharedAsides, wake: &Receiver<()>) {
    read_slot_map(shared, asides);
    let now = Instant::now();
    let (batches, expired, cleanups, mut horizon) = {
        let mut registry = shared.registry.lock();
        // First the permits already past their deadline, so none of them is renewed.
        let mut expired = registry.take_expired(now);
        let cleanups = registry.take_cleanups(now);
        let (batches, more) = registry.take_due(now);
        expired.extend(more);
        // (a group whose batch a call left running holds: it settles it itself)
        registry.take_again();
        // (the full scan below covers every permit registered so far)
        registry.take_fresh_deadline();
        let horizon = registry.earliest_deadline_after(now);
        (batches, expired, cleanups, horizon)
    };
    lose_each(shared, expired.into_iter().map(|p| (p.expiry_reason(), p)));
    if !clean_ups(shared, asides, wake, cleanups, &mut horizon) {
        return;
    }
    let mut batches: VecDeque<Taken> = batches.into_iter().map(|b| Taken::new(shared, b)).collect();
    // (those whose last renewal failed slowly last, as those that come due meanwhile)
    batches.make_contiguous().sort_by_key(|b| b.behind);
    // (how many batches at the front came due while the round ran: `came_due`)
    let mut front = 0;
    slow_last(shared, asides, &mut batches, &mut front);
    while let Some(mut batch) = batches.pop_front() {
        front = front.saturating_sub(1);
        if stopping(wake) {
            return;
        }
        // (the permits that joined its group while it was queued go with it)
        shared
            .registry
            .lock()
            .join(&mut batch.batch, Instant::now());
        let batch = Arc::new(batch);
        // (a panic in a record ends this batch's renewal, not the round: one that
        // panics at every round, the warning of a semaphore whose renewal keeps
        // failing, say, does not keep the batches after it from being renewed)
        shielded(|| {
            settle_passed(shared, &mut horizon);
            let wait = until_next(shared, horizon);
            renew(shared, asides, batch, wait);
        });
        // What came due while the round ran (a permit registered meanwhile, a grant
        // pushed to a waiter with a heartbeat's lease say, a group whose period is
        // shorter than the round, a retry): done next, not after the round, which
        // may take longer than their leases (in O(1) when nothing came due). The
        // batches left of the round have their period's slack; these may have less.
        // But a group whose last renewal failed slowly (a server slow for that
        // semaphore, the call cut by its wait) goes after the rest of the round: put
        // first, its tries (and those of the round's other slow semaphores, due again
        // by the time each ends) would follow one another, and the renewals of the
        // semaphores behind them, which the server answers at once, would wait until
        // their leases ran out.
        // A group whose batch is still queued in the round is not taken again (it
        // would be renewed twice or thrice in a row, a period or less apart): its
        // batch is moved up instead, as a new one would be put first.
        let (more, expired, cleanups, again) = {
            let mut registry = shared.registry.lock();
            let (more, expired, cleanups) = registry.take_due_since(Instant::now());
            (more, expired, cleanups, registry.take_again())
        };
        let more: Vec<Taken> = more.into_iter().map(|b| Taken::new(shared, b)).collect();
        lose_each(shared, expired.into_iter().map(|p| (p.expiry_reason(), p)));
        if !clean_ups(shared, asides, wake, cleanups, &mut horizon) {
            return;
        }
        if !more.is_empty() || !again.is_empty() {
            came_due(&mut batches, &mut front, more, again);
            slow_last(shared, asides, &mut batches, &mut front);
        }
    }
    // a deadline that passed during the last call: declared now, not at the next tick
    settle_passed(shared, &mut horizon);
}

/// A batch a round took out of the registry. Its group is not taken again until the
/// batch is settled (its answer applied, [`apply`]); dropped unsettled (a round that
/// ended early, a panic in a record or in its call, a call's thread that ended
/// without its answer), it releases its group for taking again on its schedule, so
/// that no group is left never renewed again. On a cluster the call left running
/// holds it until the call ends.
struct Taken {
    batch: Batch,
    shared: Arc<Shared>,
}

impl Taken {
    fn new(shared: &Arc<Shared>, batch: Batch) -> Taken {
        Taken {
            batch,
            shared: Arc::clone(shared),
        }
    }
}

impl std::ops::Deref for Taken {
    type Target = Batch;
    fn deref(&self) -> &Batch {
        &self.batch
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        // (never dropped under the registry's lock: the round drops its batches, and
        // the calls theirs, after the registry calls they make)
        self.shared
            .registry
            .lock()
            .release(&self.batch.key, self.batch.taken);
    }
}

/// Puts what came due while a round ran ahead of the rest of the round: the new
/// batches `more`, and the batches still queued of the groups that came due again
/// (`again`, not taken twice). The first `front` batches of the round came due while
/// it ran; these join them, the earliest deadline first ([`Batch::deadline`]: a
/// permit registered meanwhile with a short lease goes before the groups renewed a
/// period ago, and in a round longer than the periods, a batch that came due early is
/// not passed again and again by those that come due after it: each group has its
/// turn). But a batch whose group's last renewal failed slowly ([`Batch::behind`])
/// goes after the rest of the round.
fn came_due(
    batches: &mut VecDeque<Taken>,
    front: &mut usize,
    more: Vec<Taken>,
    again: Vec<(GroupKey, Instant)>,
) {
    let mut up = Vec::new();
    if !again.is_empty() {
        // (a scan of the round's batches when groups came due again: once a period
        // for each at most, as the registry's own look at what is due)
        let again: HashMap<GroupKey, Instant> = again.into_iter().collect();
        let rest = batches.split_off(*front);
        for mut b in rest {
            if let Some(deadline) = again.get(&b.key).filter(|_| !b.behind) {
                // (a permit may have joined the group since it was taken)
                b.batch.deadline = *deadline;
                up.push(b);
            } else {
                batches.push_back(b);
            }
        }
    }
    let mut behind = Vec::new();
    for b in up.into_iter().chain(more) {
        if b.behind {
            behind.push(b);
            continue;
        }
        // (after those whose deadline is no earlier: the front is in that order)
        let (mut lo, mut hi) = (0, *front);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if batches[mid].deadline <= b.deadline {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let at = lo;
        batches.insert(at, b);
        *front += 1;
    }
    batches.extend(behind);
}

/// On a cluster, puts the batches of the semaphores whose last call was slow last: a
/// hung node's do not make those of the nodes that answer wait. (`front` counts the
/// batches at the front that came due while the round ran, [`came_due`].)
fn slow_last(
    shared: &Shared,
    asides: &SharedAsides,
    batches: &mut VecDeque<Taken>,
    front: &mut usize,
) {
    if shared.is_cluster() {
        let mut a = asides.lock();
        let now = Instant::now();
        let recent = |at: &mut Instant| now.saturating_duration_since(*at) < SLOW_FOR;
        a.slow.retain(|_, at| recent(at));
        a.slow_nodes.retain(|_, at| recent(at));
        *front = batches
            .iter()
            .take(*front)
            .filter(|b| !a.is_slow(&b.keys.holders))
            .count();
        batches
            .make_contiguous()
            .sort_by_cached_key(|b| a.is_slow(&b.keys.holders));
    }
}

/// Sends the releases owed that a round took out of the registry ([`clean_up`]);
/// `false` when every client handle is gone meanwhile (those not sent are owed again,
/// and given back once the thread stops: `give_back_owed`).
fn clean_ups(
    shared: &Arc<Shared>,
    asides: &SharedAsides,
    wake: &Receiver<()>,
    cleanups: Vec<Cleanup>,
    horizon: &mut Option<Instant>,
) -> bool {
    let mut cleanups = cleanups.into_iter();
    while let Some(c) = cleanups.next() {
        if stopping(wake) {
            shared
                .registry
                .lock()
                .put_back(std::iter::once(c).chain(cleanups));
            return false;
        }
        // (a panic in a record ends this clean-up's handling, not the round: the
        // clean-ups after it and the renewals are still done, see `run`)
        shielded(|| clean_up(shared, asides, c, horizon));
    }
    true
}

/// Sends one release owed ([`Cleanup`]) that a round took out of the registry, and
/// owes it again when its send failed and there is time left, before any record (a
/// logger that panics on the record must not drop it: its permit would stay taken
/// until its lease ends, an `RSemaphore` give-back's for good).
fn clean_up(
    shared: &Arc<Shared>,
    asides: &SharedAsides,
    c: Cleanup,
    horizon: &mut Option<Instant>,
) {
    settle_passed(shared, horizon);
    // bounded as the renewals below: a hung server must not hold back the losses
    // due before the next deadline (a clean-up that runs out is tried again)
    let by = Instant::now() + until_next(shared, *horizon);
    let (end, wait_until) = call_bounds(shared, by);
    let (keys, id, waiter, custom) = (
        Arc::clone(&c.keys),
        c.id.clone(),
        c.waiter,
        c.custom.clone(),
    );
    let result = call_by(shared, asides, &c.keys.holders, wait_until, move |s| {
        send_clean_up(s, &keys, &id, waiter, custom.as_deref(), end)
    });
    // (a clean-up left running is tried again too: a second release of a permit
    // already given back changes nothing)
    let result = match result {
        Called::Done(result) => result,
        Called::LeftRunning => Err(late(format!("the give-back of {} goes on aside", c.id))),
        Called::NotSent(e) => Err(e),
    };
    if result.is_ok() || Instant::now() + RETRY_AFTER_FAILURE >= c.until {
        // done with it: a grant whose release was owed may be adopted again in this
        // client (its release ran, or its lease has surely ended)
        shared.registry.lock().let_go_owed(&c.id);
    }
    match result {
        Ok(_) => log::debug!("redis-semaphore: cleaned up after a lost reply: {}", c.id),
        Err(e) if Instant::now() + RETRY_AFTER_FAILURE < c.until => {
            let id = c.id.clone();
            // (the entry itself goes back: a compat give-back keeps its own call;
            // before the record, which must not drop it by panicking)
            shared.registry.lock().put_back(std::iter::once(Cleanup {
                at: Instant::now() + RETRY_AFTER_FAILURE,
                ..c
            }));
            log::debug!("redis-semaphore: clean-up of {id} failed, again soon: {e}");
        }
        Err(e) => log::warn!(
            "redis-semaphore: gave up giving back {} (owed after a failed acquire or \
             release; {}): {e}",
            c.id,
            c.given_up()
        ),
    }
}

/// Declares each of `lost` lost ([`lose`]). A logger or metrics recorder that panics
/// on the record of one loss (`mark_lost` fires its `lost()` before the record) does
/// not keep the others from being declared: those past their deadline are out of the
/// registry already, and nothing else would ever fire their `lost()`.
fn lose_each(shared: &Shared, lost: impl IntoIterator<Item = (LostReason, Arc<PermitState>)>) {
    for (reason, p) in lost {
        shielded(|| lose(shared, &p, reason));
    }
}

/// Sends one clean-up ([`Cleanup`]), all of it ending by `end`: a compat layout's
/// give-back (`custom`), else the leased semaphore's release of `id`.
fn send_clean_up(
    s: &Shared,
    keys: &Keys,
    id: &str,
    waiter: bool,
    custom: Option<&dyn GiveBack>,
    end: Instant,
) -> crate::Result<()> {
    if let Some(what) = custom {
        return what.give_back(&s.pool, s.op_timeout, end);
    }
    // (sent again on a fresh connection when its connection broke: both are safe to
    // run twice)
    s.run_resending(Some(end), |c2| {
        if waiter {
            // out of the queue first: nothing can be granted to it afterwards (a
            // reply it cannot read, a grant another program's value put out of
            // range, say, still goes on to the release)
            match leased::cancel(&mut **c2, keys, id) {
                Ok(_) | Err(crate::Error::UnexpectedReply { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        leased::release(&mut **c2, keys, id, false).map(|_| ())
    })
}

/// Once the last client handle is gone: the releases still owed (the grant of an
/// acquire whose reply was lost, a waiter that left without its cancel) are sent on a
/// thread of their own, each once its time has come, so that the drop that stops this
/// thread does not wait for them, and they are not forgotten (a lost reply's grant
/// would stay taken for its whole lease). Each is tried for a few operation timeouts
/// at most (or until its lease has surely ended, if sooner).
fn give_back_owed(shared: &Arc<Shared>) {
    let owed = shared.registry.lock().take_all_cleanups();
    if owed.is_empty() {
        return;
    }
    let s = Arc::clone(shared);
    let spawned = std::thread::Builder::new()
        .name("redsem-give-back".into())
        .spawn(move || {
            let op = s.op_timeout;
            // In passes: every release still owed is sent once per pass, all the sends
            // of a pass ending within one operation timeout (however many are owed and
            // however slow the server), until each one's own end has passed. The
            // thread outlives the client by a few operation timeouts at most, not one
            // per release owed.
            let mut owed = owed;
            while !owed.is_empty() {
                // (a wait for the first caller's give-up time, after which its acquire
                // cannot run any more: not a wait for a condition)
                if let Some(first) = owed.iter().map(|c| c.at).min() {
                    std::thread::sleep(first.saturating_duration_since(Instant::now()));
                }
                let end = Instant::now() + op;
                // those a pass had no time for go first in the next one, those whose
                // send failed last: one that hangs (a hung node of a cluster) does not
                // take every pass's time from the others
                let (mut untried, mut failed) = (Vec::new(), Vec::new());
                for c in owed {
                    if Instant::now() < c.at {
                        untried.push(c);
                        continue;
                    }
                    let stop_at = c.until.min(c.at + 3 * op);
                    let tried = Instant::now() < end;
                    let result = if tried {
                        send_clean_up(&s, &c.keys, &c.id, c.waiter, c.custom.as_deref(), end)
                    } else {
                        Err(late(format!("no time left in this pass for {}", c.id)))
                    };
                    // (the records after the bookkeeping, and a panic in one (a logger
                    // of the user's) ends the record, not the thread: the releases
                    // still owed are not dropped)
                    match result {
                        Ok(_) => {}
                        Err(e) if Instant::now() + RETRY_AFTER_FAILURE < stop_at => {
                            let id = c.id.clone();
                            if tried {
                                failed.push(c)
                            } else {
                                untried.push(c)
                            }
                            shielded(|| {
                                log::debug!(
                                    "redis-semaphore: clean-up of {id} failed, again soon: {e}"
                                )
                            });
                        }
                        Err(e) => {
                            shielded(|| {
                                log::warn!(
                                    "redis-semaphore: gave up giving back {} (owed after a \
                                     failed acquire or release; {}): {e}",
                                    c.id,
                                    c.given_up()
                                )
                            });
                        }
                    }
                }
                untried.append(&mut failed);
                owed = untried;
                if !owed.is_empty() {
                    std::thread::sleep(RETRY_AFTER_FAILURE);
                }
            }
        });
    if let Err(e) = spawned {
        log::warn!("redis-semaphore: cannot start a thread to give back owed permits: {e}");
    }
}

/// When the deadline `horizon` has passed (during the call before): declares the
/// losses due by now and moves `horizon` to the next deadline. Run before each call of
/// the thread, clean-ups included, so that no loss waits behind the calls after it;
/// the registry is scanned only when a deadline has passed, not once per call (a tick
/// of 16,000 semaphores would scan it 16,000 times). A permit registered meanwhile
/// brings its deadline in first, in O(1).
fn settle_passed(shared: &Shared, horizon: &mut Option<Instant>) {
    let now = Instant::now();
    let expired = {
        let mut registry = shared.registry.lock();
        if let Some(fresh) = registry.take_fresh_deadline() {
            *horizon = Some(horizon.map_or(fresh, |h| h.min(fresh)));
        }
        if !horizon.is_some_and(|t| now >= t) {
            return;
        }
        // (the look for permits past their deadline first: it makes the bounds the
        // next deadline is read from exact)
        let expired = registry.take_expired(now);
        *horizon = registry.earliest_deadline_after(now);
        expired
    };
    lose_each(shared, expired.into_iter().map(|p| (p.expiry_reason(), p)));
}

/// How long a call of the thread may wait on Redis: never past the next deadline
/// (`horizon`), since a refused connect or a hung server would otherwise hold every
/// loss back for the whole operation timeout; at least [`MIN_WAIT`].
fn until_next(shared: &Shared, horizon: Option<Instant>) -> Duration {
    horizon
        .map_or(shared.op_timeout, |t| {
            t.saturating_duration_since(Instant::now())
        })
        .max(MIN_WAIT)
        .min(shared.op_timeout)
}

/// Marks `p` lost, counting the loss of a permit (not of a waiter's heartbeat) once,
/// also when a manual refresh marks it at the same moment.
fn lose(shared: &Shared, p: &PermitState, reason: LostReason) {
    if p.is_detached() {
        // released (or handed over) while its renewal was on its way: its holder gave
        // it up, nothing was lost
        return;
    }
    if p.mark_lost(reason) && !p.id.starts_with("w:") {
        Counters::bump(&shared.stats.lost);
    }
}

/// Renews one batch and applies the answer ([`apply`]), waiting on Redis at most `wait`
/// (see [`call_by`]). On a cluster the call applies its own answer on its own thread,
/// also one that comes after this thread stopped waiting: a renewal that got through
/// is not wasted, and a failure is said and tried again soon once it happens. A late
/// answer is safe to apply: a renewal's deadline counts from when it was sent, before
/// the server renewed, and a permit declared lost meanwhile stays lost (the losses
/// themselves are declared by their deadlines, [`settle_passed`], whatever the calls
/// do). The counters count the calls sent and those that failed.
fn renew(shared: &Arc<Shared>, asides: &SharedAsides, batch: Arc<Taken>, wait: Duration) {
    let sent = Instant::now();
    let by = sent + wait;
    let (end, wait_until) = call_bounds(shared, by);
    let b = Arc::clone(&batch);
    let done = call_by(shared, asides, &batch.keys.holders, wait_until, move |s| {
        Counters::bump(&s.stats.refresh_calls);
        let answer = call_batch(s, &b, end);
        if answer.result.is_err() {
            Counters::bump(&s.stats.refresh_failed);
        }
        apply(s, &b, sent, answer, false);
    });
    match done {
        // it settled its group itself, or will when it ends
        Called::Done(()) | Called::LeftRunning => {}
        // (a call about the semaphore still runs, for another group, say, or for an
        // older batch without this one's newest permits; or no room): tried again soon
        Called::NotSent(e) => apply(shared, &batch, sent, Answer::failed(e), true),
    }
}

/// For a call of this thread that may take until `by`: when the call must end itself,
/// and how long this thread waits for it. Both are `by` where the call runs on this
/// thread; on a cluster, where it runs on its own ([`call_by`]) and applies its late
/// answer itself, it may take one operation timeout from now, and is waited for
/// [`SHORT_WAIT`] at most.
fn call_bounds(shared: &Shared, by: Instant) -> (Instant, Instant) {
    if shared.is_cluster() {
        let now = Instant::now();
        (by.max(now + shared.op_timeout), by.min(now + SHORT_WAIT))
    } else {
        (by, by)
    }
}

/// What the renewal calls of a batch said ([`call_batch`]).
struct Answer {
    /// The last call's answer: an error ends the batch's calls, and the permits of
    /// the chunks after it are not known renewed.
    result: crate::Result<Renewal>,
    /// The permits whose chunks were answered, renewed on the server but for those
    /// named in `gone` (read only when `result` is an error).
    answered: Vec<Arc<PermitState>>,
    /// The ids the answered chunks found gone.
    gone: Vec<String>,
}

impl Answer {
    /// A batch of which no chunk was answered.
    fn failed(e: crate::Error) -> Answer {
        Answer {
            result: Err(e),
            answered: Vec::new(),
            gone: Vec::new(),
        }
    }
}

/// Applies the answer to a renewal of `batch` sent at `sent`: the permits found gone
/// (or whose deadline passed, when a call failed) are declared lost, the others
/// renewed until `sent` plus their lease, and the group's schedule is settled. When a
/// call failed after chunks before it were answered, the permits of those chunks are
/// renewed all the same (the server did), and only the rest wait for the retry. An
/// error is logged as a warning, or for a call not sent (`aside`, on a cluster for want
/// of room: tried again soon) at debug level.
fn apply(shared: &Shared, batch: &Batch, sent: Instant, answer: Answer, aside: bool) {
    let now = Instant::now();
    let (lost, failed) = match answer.result {
        Ok(Renewal::Reset) => {
            let lost = batch
                .permits
                .iter()
                .map(|p| (p.reason_for_missing(now, true), Arc::clone(p)));
            (lost.collect(), false)
        }
        // (the permits the calls carried: not those declared lost, or past their max
        // hold, by the time their chunk was sent, call_chunks)
        Ok(Renewal::Lost(gone)) => (
            renewed_but(&answer.answered, batch.key.lease(), &gone, sent, now),
            false,
        ),
        Err(e) => {
            // (a call not sent is tried again soon: said at debug level)
            let level = if aside {
                log::Level::Debug
            } else {
                log::Level::Warn
            };
            log::log!(
                level,
                "redis-semaphore: renewal of {} permits of {} failed: {e}",
                batch.permits.len(),
                batch.key.name
            );
            // the chunks answered before the failure renewed their permits
            let lease = batch.key.lease();
            let mut lost = renewed_but(&answer.answered, lease, &answer.gone, sent, now);
            let answered: HashSet<&str> = answer.answered.iter().map(|p| p.id.as_str()).collect();
            let rest = batch
                .permits
                .iter()
                .filter(|p| !answered.contains(p.id.as_str()));
            // (a chunk whose renewal too few replicas acknowledged still said which of
            // its ids are gone: those are lost, the others kept their deadlines)
            lost.extend(gone_or_expired(rest, &answer.gone, now));
            (lost, true)
        }
    };
    lose_each(
        shared,
        lost.iter().map(|(reason, p)| (*reason, Arc::clone(p))),
    );
    let lost: Vec<_> = lost.into_iter().map(|(_, p)| p).collect();
    shared
        .registry
        .lock()
        .settle(&batch.key, batch.taken, &lost, sent, failed, Instant::now());
}

/// The renewal calls of one batch, a chunk of at most [`REFRESH_CHUNK`] permits each,
/// through the batch's renewer (a compat layout) or the refresh script, all of them
/// waiting on Redis until `by` at most. A call that fails ends the batch's calls; what
/// the chunks before it said is kept ([`Answer`]).
fn call_batch(shared: &Shared, batch: &Batch, by: Instant) -> Answer {
    let (mut answered, mut gone) = (Vec::new(), Vec::new());
    let result = match call_chunks(shared, batch, by, &mut answered, &mut gone) {
        Ok(Renewal::Lost(_)) => Ok(Renewal::Lost(std::mem::take(&mut gone))),
        other => other,
    };
    Answer {
        result,
        answered,
        gone,
    }
}

/// The calls of [`call_batch`]: the permits of each chunk answered go to `answered`,
/// the ids it found gone to `gone`; the chunk that fails ends them (its error).
fn call_chunks(
    shared: &Shared,
    batch: &Batch,
    by: Instant,
    answered: &mut Vec<Arc<PermitState>>,
    all: &mut Vec<String>,
) -> crate::Result<Renewal> {
    // (a permit declared lost since the batch was taken is not renewed: the server
    // lets its lease lapse and its slot comes back)
    let live: Vec<Arc<PermitState>> = batch
        .permits
        .iter()
        .filter(|p| p.lost_reason().is_none())
        .cloned()
        .collect();
    for chunk in live.chunks(REFRESH_CHUNK) {
        // nor one whose max hold has passed since the batch was taken (the calls of the
        // round before this one, and the chunks before this one, may have taken
        // several operation timeouts): `max_hold` is "renewed until then and no more",
        // and the renewal's deadline counts from before this look (`renew`'s `sent`)
        let now = Instant::now();
        let chunk: Vec<Arc<PermitState>> =
            chunk.iter().filter(|p| !p.held_out(now)).cloned().collect();
        if chunk.is_empty() {
            continue;
        }
        let chunk = chunk.as_slice();
        let wait = by.saturating_duration_since(Instant::now()).max(MIN_WAIT);
        let gone = match &batch.renewer {
            Some(renewer) => renewer.renew(chunk, wait)?,
            None => {
                let ids: Vec<&str> = chunk.iter().map(|p| p.id.as_str()).collect();
                let key = &batch.key;
                let refreshed = call_refresh(
                    shared,
                    &key.name,
                    &batch.keys,
                    key.lease(),
                    &ids,
                    wait,
                    key.replicas,
                )?;
                match refreshed.renewal {
                    Renewal::Reset => return Ok(Renewal::Reset),
                    // too few replicas have the renewal: it does not count (the chunk
                    // is not answered, its permits keep their deadlines), but the ids
                    // found gone are gone
                    Renewal::Lost(gone) => match refreshed.acked {
                        Ok(()) => gone,
                        Err(e) => {
                            all.extend(gone);
                            return Err(e);
                        }
                    },
                }
            }
        };
        all.extend(gone);
        answered.extend(chunk.iter().cloned());
    }
    Ok(Renewal::Lost(Vec::new()))
}

/// After a renewal of `permits` for `lease`, sent at `sent`, that found the ids `gone`
/// missing: those are lost, the others renewed.
fn renewed_but(
    permits: &[Arc<PermitState>],
    lease: Duration,
    gone: &[String],
    sent: Instant,
    now: Instant,
) -> Vec<(LostReason, Arc<PermitState>)> {
    // (a set: a group of 10,000 permits all found gone is not 10^8 comparisons)
    let gone: HashSet<&str> = gone.iter().map(String::as_str).collect();
    let mut lost = Vec::new();
    for p in permits {
        if gone.contains(p.id.as_str()) {
            lost.push((p.reason_for_missing(now, false), Arc::clone(p)));
        } else {
            p.renewed(lease_end(sent, lease), sent);
        }
    }
    lost
}

/// After a failed renewal, for the permits it did not renew: those whose ids a call
/// found `gone` (a renewal too few replicas acknowledged) and those whose deadline has
/// passed are lost.
fn gone_or_expired<'a>(
    permits: impl Iterator<Item = &'a Arc<PermitState>>,
    gone: &[String],
    now: Instant,
) -> Vec<(LostReason, Arc<PermitState>)> {
    let gone: HashSet<&str> = gone.iter().map(String::as_str).collect();
    permits
        .filter_map(|p| {
            if gone.contains(p.id.as_str()) {
                Some((p.reason_for_missing(now, false), Arc::clone(p)))
            } else if p.valid_until() <= now {
                Some((p.expiry_reason(), Arc::clone(p)))
            } else {
                None
            }
        })
        .collect()
}

/// What a renewal call of the leased semaphore said ([`call_refresh`]).
pub(crate) struct Refreshed {
    /// The `refresh` script's answer.
    pub(crate) renewal: Renewal,
    /// With a replica wait (`SemaphoreBuilder::wait_replicas`), `Err` when the renewal
    /// must not count on the client: fewer replicas than asked acknowledged it in time
    /// ([`Error::ReplicasNotAcked`](crate::Error::ReplicasNotAcked)), or its `WAIT`
    /// failed. The permits then keep their deadlines (a failover may promote a replica
    /// that never saw the renewal), while the ids the script found gone are gone all
    /// the same. `Ok` without a replica wait, and when the script renewed nothing.
    pub(crate) acked: crate::Result<()>,
}

/// One call of the `refresh` script for `ids` of semaphore `name`, followed, with
/// `replicas` (`wait_replicas`' count and timeout in ms), by `WAIT` on the same
/// connection ([`crate::pool::wait_acks`]: one per call, none when the script
/// renewed nothing), waiting on Redis at most `wait` in all (`shared.op_timeout` when
/// `wait` is not shorter): the checkout, then the calls with what the checkout left.
pub(crate) fn call_refresh(
    shared: &Shared,
    name: &str,
    keys: &Keys,
    lease: Duration,
    ids: &[&str],
    wait: Duration,
    replicas: Option<(u32, u64)>,
) -> crate::Result<Refreshed> {
    let lease_ms = lease.as_millis() as u64;
    let op = shared.op_timeout;
    let wait = wait.min(op).max(Duration::from_millis(1));
    let by = Instant::now() + wait;
    // (sent again on a fresh connection, by the same end, when its connection broke:
    // a renewal is safe to run twice, its lease counts from before the first send,
    // and a renewal that waited for the retry instead might come after a short
    // lease ended, each try on the next of the pool's idle connections a restart or
    // a `CLIENT KILL` closed)
    // A second send with a replica wait asks one millisecond more than the first: a
    // first send that ran within the same server millisecond (its reply lost with its
    // connection) leaves the second's renewal to the same deadline writing nothing
    // (`ZADD GT`), and `WAIT` on the fresh connection, which then wrote nothing,
    // counts replicas that lack the renewal on a server that moves a connection's
    // offset only when it writes. (The server then holds the permit up to a
    // millisecond longer than the client counts.)
    let mut sends = 0;
    shared.run_resending(Some(by), |c| {
        let extra_ms = if replicas.is_some() { sends } else { 0 };
        sends += 1;
        let renewal = leased::refresh(&mut **c, keys, lease_ms + extra_ms, ids)?;
        let renewed_some = match &renewal {
            Renewal::Lost(gone) => gone.len() < ids.len(),
            Renewal::Reset => false,
        };
        let acked = match replicas {
            Some((wanted, timeout_ms)) if renewed_some => {
                match crate::pool::wait_acks(c, &keys.holders, wanted, timeout_ms, op) {
                    Ok(acked) if acked >= wanted => Ok(()),
                    Ok(acked) => Err(crate::Error::ReplicasNotAcked {
                        name: name.to_owned(),
                        acked,
                        wanted,
                    }),
                    Err(e) => Err(e),
                }
            }
            _ => Ok(()),
        };
        Ok(Refreshed { renewal, acked })
    })
}
