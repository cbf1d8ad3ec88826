//! The background thread of a [`Client`](crate::Client): it keeps the leases of every
//! live permit of the client alive, one script call per semaphore per tick, and tells
//! each permit the moment its lease is known to be gone.
//!
//! Invariants it keeps:
//!
//! - **One call per semaphore per tick.** Permits are grouped by (semaphore, lease);
//!   a tick sends all ids of a group in one `refresh` script call, whatever their number.
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
//! - **The thread never dies of an error.** Failures are logged and retried at the next
//!   tick; one group's bad reply does not touch the others. It holds only [`Shared`]
//!   (pool and registry), never a client handle, and ends when the last handle drops
//!   the channel's sender.
//! - **Nothing slow under the lock.** The registry lock is held only to copy what is
//!   due; script calls and loss notifications happen after it is released.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::client::Shared;
use crate::clock::shrink;
use crate::permit::LostReason;
use crate::scripts::{self, Keys};
use crate::stats::Counters;

/// How soon a failed renewal is tried again (bounded by the group's period).
const RETRY_AFTER_FAILURE: Duration = Duration::from_millis(200);
/// The shortest time a renewal may wait on Redis, even when some permit's deadline is
/// nearer: a healthy call is not cut short because another lease is about to end.
const MIN_WAIT: Duration = Duration::from_millis(5);
/// The most ids one refresh call carries (the script refuses more than 1000).
const REFRESH_CHUNK: usize = 1000;

/// The part of a permit the refresher and the permit share.
#[derive(Debug)]
pub(crate) struct PermitState {
    pub(crate) id: String,
    reason: OnceLock<LostReason>,
    tx: Mutex<Option<Sender<LostReason>>>,
    /// The instant before which the lease surely still runs on the server.
    valid_until: Mutex<Instant>,
}

impl PermitState {
    pub(crate) fn new(
        id: String,
        valid_until: Instant,
    ) -> (Arc<PermitState>, Receiver<LostReason>) {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let state = PermitState {
            id,
            reason: OnceLock::new(),
            tx: Mutex::new(Some(tx)),
            valid_until: Mutex::new(valid_until),
        };
        (Arc::new(state), rx)
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        self.reason.get().copied()
    }

    pub(crate) fn valid_until(&self) -> Instant {
        *self.valid_until.lock()
    }

    /// Why a permit that Redis no longer has is gone, as far as this client can tell:
    /// the reason already recorded, else expired once its lease must have run out by
    /// this client's clock, else released by someone else.
    pub(crate) fn gone_reason(&self) -> LostReason {
        self.lost_reason()
            .unwrap_or(if Instant::now() >= self.valid_until() {
                LostReason::Expired
            } else {
                LostReason::Released
            })
    }

    pub(crate) fn renewed(&self, until: Instant) {
        let mut v = self.valid_until.lock();
        if until > *v {
            *v = until;
        }
    }

    /// Records the loss once and fires the `lost()` channel: the reason is sent, then
    /// the sender dropped, so every receiver sees the loss.
    pub(crate) fn mark_lost(&self, reason: LostReason) {
        if self.reason.set(reason).is_ok() {
            let tx = self.tx.lock().take();
            if let Some(tx) = tx {
                let _ = tx.try_send(reason);
            }
            if !self.id.starts_with("w:") {
                log::info!("redis-semaphore: permit {} lost: {reason}", self.id);
            }
        }
    }

    /// Why the lease is gone, judged from the client's clock and what Redis said.
    fn reason_for_missing(&self, now: Instant, server_reset: bool) -> LostReason {
        if now >= self.valid_until() {
            LostReason::Expired
        } else if server_reset {
            LostReason::Reset
        } else {
            LostReason::Released
        }
    }
}

/// Permits are refreshed in groups that share keys and lease.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct GroupKey {
    pub(crate) name: Arc<str>,
    pub(crate) lease_ms: u64,
    /// `false`: manual refresh; the thread only watches for the lease to end.
    pub(crate) auto: bool,
}

#[derive(Debug)]
struct Group {
    keys: Arc<Keys>,
    lease: Duration,
    period: Duration,
    next_due: Instant,
    permits: HashMap<String, Arc<PermitState>>,
}

/// Every permit of one client that is still held.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    groups: HashMap<GroupKey, Group>,
    cleanups: Vec<Cleanup>,
}

/// A release owed for an acquire whose reply was lost: sent from `at` on (never
/// before: the acquire cannot run after then), retried until `until` (by then the
/// lease of whatever it was granted has surely ended).
#[derive(Debug)]
struct Cleanup {
    keys: Arc<Keys>,
    id: String,
    at: Instant,
    until: Instant,
}

impl Registry {
    /// Adds a permit; returns whether the thread must look at its schedule again.
    pub(crate) fn register(
        &mut self,
        key: GroupKey,
        keys: &Arc<Keys>,
        lease: Duration,
        period: Duration,
        state: Arc<PermitState>,
    ) -> bool {
        let now = Instant::now();
        let first_due = if key.auto {
            // a grant with little left (a permit pushed to a waiter lasts a heartbeat
            // until renewed, a grant learnt late has less) is renewed at half of it
            let left = state.valid_until().saturating_duration_since(now);
            now + period.min(left / 2)
        } else {
            state.valid_until()
        };
        let mut nudge = false;
        let group = self.groups.entry(key).or_insert_with(|| {
            nudge = true;
            Group {
                keys: Arc::clone(keys),
                lease,
                period,
                next_due: first_due,
                permits: HashMap::new(),
            }
        });
        if period < group.period {
            group.period = period;
        }
        if first_due < group.next_due {
            group.next_due = first_due;
            nudge = true;
        }
        group.permits.insert(state.id.clone(), state);
        nudge
    }

    pub(crate) fn deregister(&mut self, key: &GroupKey, id: &str) {
        if let Some(g) = self.groups.get_mut(key) {
            g.permits.remove(id);
        }
    }

    /// When the thread must wake: the next group due, or the next lease that may end by
    /// this process's clock, whichever comes first.
    fn next_wake(&self) -> Option<Instant> {
        let due = self.groups.values().map(|g| g.next_due).min();
        let ends = self.deadlines().min();
        let cleanups = self.cleanups.iter().map(|c| c.at).min();
        due.into_iter().chain(ends).chain(cleanups).min()
    }

    /// Owes a release of `id` from `at` on, tried until `until`.
    pub(crate) fn clean_up(&mut self, keys: &Arc<Keys>, id: &str, at: Instant, until: Instant) {
        self.cleanups.push(Cleanup {
            keys: Arc::clone(keys),
            id: id.to_owned(),
            at,
            until,
        });
    }

    /// Takes the releases owed by `now`.
    fn take_cleanups(&mut self, now: Instant) -> Vec<Cleanup> {
        let (due, later) = std::mem::take(&mut self.cleanups)
            .into_iter()
            .partition(|c| c.at <= now);
        self.cleanups = later;
        due
    }

    /// The client-side deadline of every permit still registered.
    fn deadlines(&self) -> impl Iterator<Item = Instant> + '_ {
        self.groups
            .values()
            .flat_map(|g| g.permits.values().map(|p| p.valid_until()))
    }

    /// The earliest client-side deadline after `now`: how long the thread may wait on
    /// Redis without missing one.
    fn earliest_deadline_after(&self, now: Instant) -> Option<Instant> {
        self.deadlines().filter(|&t| t > now).min()
    }

    /// Takes the permits, of any group, whose lease may have run out by `now` by this
    /// process's clock: they are lost, whatever their group's schedule.
    fn take_expired(&mut self, now: Instant) -> Vec<Arc<PermitState>> {
        let mut expired = Vec::new();
        for g in self.groups.values_mut() {
            g.permits.retain(|_, p| {
                let live = p.valid_until() > now;
                if !live {
                    expired.push(Arc::clone(p));
                }
                live
            });
        }
        expired
    }

    /// Takes the work that is due: batches to renew, and manual permits whose lease
    /// ran out. Empty groups are dropped when they come due.
    fn take_due(&mut self, now: Instant) -> (Vec<Batch>, Vec<Arc<PermitState>>) {
        let mut batches = Vec::new();
        let mut expired = Vec::new();
        self.groups.retain(|key, g| {
            if g.next_due > now {
                return true;
            }
            if key.auto {
                if g.permits.is_empty() {
                    return false;
                }
                g.next_due = now + g.period;
                batches.push(Batch {
                    key: key.clone(),
                    keys: Arc::clone(&g.keys),
                    lease: g.lease,
                    permits: g.permits.values().cloned().collect(),
                });
            } else {
                g.permits.retain(|_, p| {
                    let live = p.valid_until() > now;
                    if !live {
                        expired.push(Arc::clone(p));
                    }
                    live
                });
                match g.permits.values().map(|p| p.valid_until()).min() {
                    Some(t) => g.next_due = t,
                    None => return false,
                }
            }
            true
        });
        (batches, expired)
    }

    /// Applies the outcome of a batch: lost permits leave, a failure moves the next
    /// try closer.
    fn settle(&mut self, key: &GroupKey, lost: &[Arc<PermitState>], failed: bool, now: Instant) {
        if let Some(g) = self.groups.get_mut(key) {
            for p in lost {
                g.permits.remove(&p.id);
            }
            if failed {
                g.next_due = g.next_due.min(now + RETRY_AFTER_FAILURE.min(g.period));
            }
        }
    }
}

/// One script call's worth of renewals.
struct Batch {
    key: GroupKey,
    keys: Arc<Keys>,
    lease: Duration,
    permits: Vec<Arc<PermitState>>,
}

/// The thread's body: sleeps until the next group is due or the schedule changes,
/// and returns when every client handle is gone (the channel disconnects).
pub(crate) fn run(shared: Arc<Shared>, wake: Receiver<()>) {
    loop {
        let next = shared.registry.lock().next_wake();
        let woke = match next {
            Some(t) => wake.recv_deadline(t),
            None => wake.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        if let Err(RecvTimeoutError::Disconnected) = woke {
            return;
        }
        tick(&shared);
    }
}

fn tick(shared: &Shared) {
    let now = Instant::now();
    let (batches, expired, mut horizon) = {
        let mut registry = shared.registry.lock();
        // First the permits already past their deadline, so none of them is renewed.
        let mut expired = registry.take_expired(now);
        let (batches, more) = registry.take_due(now);
        expired.extend(more);
        (batches, expired, registry.earliest_deadline_after(now))
    };
    for p in expired {
        count_loss(shared, &p);
        p.mark_lost(LostReason::Expired);
    }
    let cleanups = shared.registry.lock().take_cleanups(now);
    for c in cleanups {
        let result = shared
            .pool
            .get(Some(shared.op_timeout))
            .and_then(|mut conn| {
                c.keys
                    .invoke(&scripts::RELEASE)
                    .arg(&c.id)
                    .invoke::<i64>(&mut *conn)
                    .map_err(crate::Error::Redis)
            });
        match result {
            Ok(_) => log::debug!("redis-semaphore: cleaned up after a lost reply: {}", c.id),
            Err(e) if Instant::now() + RETRY_AFTER_FAILURE < c.until => {
                log::debug!(
                    "redis-semaphore: clean-up of {} failed, again soon: {e}",
                    c.id
                );
                let mut registry = shared.registry.lock();
                registry.clean_up(
                    &c.keys,
                    &c.id,
                    Instant::now() + RETRY_AFTER_FAILURE,
                    c.until,
                );
            }
            Err(e) => log::warn!(
                "redis-semaphore: could not give back permit {} after a failed acquire \
                 (its lease ends by itself): {e}",
                c.id
            ),
        }
    }
    for batch in batches {
        Counters::bump(&shared.stats.refresh_calls);
        // Never wait on Redis past the next deadline: a refused connect or a hung server
        // would otherwise hold every loss back for the whole operation timeout.
        let wait = horizon
            .map_or(shared.op_timeout, |t| {
                t.saturating_duration_since(Instant::now())
            })
            .max(MIN_WAIT)
            .min(shared.op_timeout);
        let (lost, failed) = renew(shared, &batch, wait);
        if failed {
            Counters::bump(&shared.stats.refresh_failed);
        }
        for p in &lost {
            count_loss(shared, &p.1);
            p.1.mark_lost(p.0);
        }
        let lost: Vec<_> = lost.into_iter().map(|(_, p)| p).collect();
        shared
            .registry
            .lock()
            .settle(&batch.key, &lost, failed, Instant::now());
        // A deadline passed while this batch waited: declare those losses now, not after
        // the tick's other batches, and give the next batches the next deadline.
        let now = Instant::now();
        if horizon.is_some_and(|t| now >= t) {
            let expired = {
                let mut registry = shared.registry.lock();
                horizon = registry.earliest_deadline_after(now);
                registry.take_expired(now)
            };
            for p in expired {
                p.mark_lost(LostReason::Expired);
            }
        }
    }
}

/// Counts the loss of a permit (not of a waiter's heartbeat), once.
fn count_loss(shared: &Shared, p: &PermitState) {
    if p.lost_reason().is_none() && !p.id.starts_with("w:") {
        Counters::bump(&shared.stats.lost);
    }
}

/// Renews one batch, waiting on Redis at most `wait`; returns the permits found lost
/// (with why) and whether the call failed.
fn renew(
    shared: &Shared,
    batch: &Batch,
    wait: Duration,
) -> (Vec<(LostReason, Arc<PermitState>)>, bool) {
    let sent = Instant::now();
    let ids: Vec<&str> = batch.permits.iter().map(|p| p.id.as_str()).collect();
    let result = ids
        .chunks(REFRESH_CHUNK)
        .map(|chunk| call_refresh(shared, &batch.keys, batch.lease, chunk, wait))
        .try_fold(
            Renewal::Lost(Vec::new()),
            |all, r| -> crate::Result<Renewal> {
                Ok(match (all, r?) {
                    (Renewal::Lost(mut a), Renewal::Lost(b)) => {
                        a.extend(b);
                        Renewal::Lost(a)
                    }
                    _ => Renewal::Reset,
                })
            },
        );
    let now = Instant::now();
    match result {
        Ok(Renewal::Reset) => {
            let lost = batch
                .permits
                .iter()
                .map(|p| (p.reason_for_missing(now, true), Arc::clone(p)));
            (lost.collect(), false)
        }
        Ok(Renewal::Lost(gone)) => {
            let mut lost = Vec::new();
            for p in &batch.permits {
                if gone.iter().any(|g| g == &p.id) {
                    lost.push((p.reason_for_missing(now, false), Arc::clone(p)));
                } else {
                    p.renewed(sent + shrink(batch.lease));
                }
            }
            (lost, false)
        }
        Err(e) => {
            log::warn!(
                "redis-semaphore: refresh of {} permits failed: {e}",
                ids.len()
            );
            let lost = batch
                .permits
                .iter()
                .filter(|p| p.valid_until() <= now)
                .map(|p| (LostReason::Expired, Arc::clone(p)));
            (lost.collect(), true)
        }
    }
}

/// What the `refresh` script said.
pub(crate) enum Renewal {
    /// The semaphore's keys are gone.
    Reset,
    /// These ids are no longer held; the others were renewed.
    Lost(Vec<String>),
}

/// One call of the `refresh` script for `ids`, waiting at most `wait` for a connection
/// and at most `wait` for each read and write (`shared.op_timeout` when `wait` is not
/// shorter).
pub(crate) fn call_refresh(
    shared: &Shared,
    keys: &Keys,
    lease: Duration,
    ids: &[&str],
    wait: Duration,
) -> crate::Result<Renewal> {
    let lease_ms = lease.as_millis() as u64;
    let mut inv = keys.invoke(&scripts::REFRESH);
    inv.arg(lease_ms).arg(scripts::pad_ms(lease_ms));
    for id in ids {
        inv.arg(*id);
    }
    let wait = wait.min(shared.op_timeout).max(Duration::from_millis(1));
    let mut conn = shared.pool.get(Some(wait))?;
    let reply = conn.within(wait, shared.op_timeout, |c| {
        inv.invoke::<Vec<redis::Value>>(c)
    });
    let reply = reply.map_err(crate::Error::Redis)?;
    let mut it = reply.into_iter();
    match it.next() {
        Some(redis::Value::Int(-1)) => Ok(Renewal::Reset),
        Some(redis::Value::Int(0)) => {
            let gone = it
                .map(|v| match v {
                    redis::Value::BulkString(b) => String::from_utf8(b)
                        .map_err(|_| crate::Error::reply("refresh", "permit id is not UTF-8")),
                    other => Err(crate::Error::reply(
                        "refresh",
                        format!("unexpected element {other:?}"),
                    )),
                })
                .collect::<crate::Result<Vec<_>>>()?;
            Ok(Renewal::Lost(gone))
        }
        other => Err(crate::Error::reply(
            "refresh",
            format!("unexpected status {other:?}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn register(reg: &mut Registry, name: &str, auto: bool, id: &str, valid_for: Duration) {
        let key = GroupKey {
            name: Arc::from(name),
            lease_ms: 300,
            auto,
        };
        let keys = Arc::new(Keys::new(name));
        let (state, _rx) = PermitState::new(id.into(), Instant::now() + valid_for);
        let period = Duration::from_millis(100);
        reg.register(key, &keys, Duration::from_millis(300), period, state);
    }

    #[test]
    fn the_thread_wakes_at_a_deadline_before_the_next_tick() {
        let mut reg = Registry::default();
        register(&mut reg, "a", true, "late", Duration::from_secs(10));
        register(&mut reg, "b", true, "soon", Duration::from_millis(20));
        let wake = reg.next_wake().unwrap();
        assert!(wake <= Instant::now() + Duration::from_millis(20));
        let now = Instant::now();
        assert_eq!(
            reg.earliest_deadline_after(now).map(|t| t > now),
            Some(true)
        );
    }

    #[test]
    fn expired_permits_leave_every_group_and_live_ones_stay() {
        let mut reg = Registry::default();
        register(&mut reg, "a", true, "live", Duration::from_secs(10));
        register(&mut reg, "a", true, "gone", Duration::ZERO);
        register(&mut reg, "m", false, "manual-gone", Duration::ZERO);
        let gone: Vec<String> = reg
            .take_expired(Instant::now())
            .into_iter()
            .map(|p| p.id.clone())
            .collect();
        assert_eq!(gone.len(), 2, "{gone:?}");
        assert!(gone.contains(&"gone".to_string()));
        assert!(gone.contains(&"manual-gone".to_string()));
        let left: Vec<&String> = reg.groups.values().flat_map(|g| g.permits.keys()).collect();
        assert_eq!(left, vec!["live"]);
        assert!(reg.take_expired(Instant::now()).is_empty());
    }
}
