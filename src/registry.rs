//! What the background thread keeps: every live permit of a client, grouped by
//! (semaphore, lease), with the schedule of their renewals and the clean-ups it owes
//! (see `refresher.rs` for the thread and its invariants). Shared by the permits (which
//! register and leave), the semaphores (which register waiters' heartbeats and
//! clean-ups) and the thread, under one lock in `Shared` (`shared.rs`);
//! nothing here talks to Redis.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

use crate::error::LostReason;
use crate::metrics::SemMetrics;
use crate::scripts::Keys;
use crate::stats::Counters;

/// How soon a failed renewal is tried again (bounded by the group's period).
pub(crate) const RETRY_AFTER_FAILURE: Duration = Duration::from_millis(200);

/// The part of a permit the refresher and the permit share.
#[derive(Debug)]
pub(crate) struct PermitState {
    pub(crate) id: String,
    reason: OnceLock<LostReason>,
    tx: Mutex<Option<Sender<LostReason>>>,
    /// The instant before which the lease surely still runs on the server, and the
    /// lease updates that set it ([`Lease`]).
    lease: Mutex<Lease>,
    /// Held across a lease update's call (`RPermitExpirableSemaphore::update_lease_time`):
    /// two updates of one permit in this client never overlap ([`LeaseUpdate`]).
    update_serial: Mutex<()>,
    /// `SemaphoreBuilder::max_hold`: no renewal is sent from this instant on.
    hold_until: Option<Instant>,
    /// Where its loss is reported (`metrics` feature); empty for waiters' heartbeats
    /// and the compatibility types' permits.
    metrics: SemMetrics,
    /// Taken out of the registry (released, handed over with `into_parts`, a waiter
    /// that finished): a renewal already on its way for it reports nothing.
    detached: AtomicBool,
}

impl PermitState {
    pub(crate) fn new(
        id: String,
        valid_until: Instant,
    ) -> (Arc<PermitState>, Receiver<LostReason>) {
        Self::with_hold(id, valid_until, None, SemMetrics::default())
    }

    /// A permit that is not renewed from `hold_until` on (`max_hold`), whose loss is
    /// reported to `metrics`.
    pub(crate) fn with_hold(
        id: String,
        valid_until: Instant,
        hold_until: Option<Instant>,
        metrics: SemMetrics,
    ) -> (Arc<PermitState>, Receiver<LostReason>) {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let state = PermitState {
            id,
            reason: OnceLock::new(),
            tx: Mutex::new(Some(tx)),
            lease: Mutex::new(Lease {
                until: valid_until,
                ends_by: None,
                updating: false,
                updated_at: None,
            }),
            update_serial: Mutex::new(()),
            hold_until,
            metrics,
            detached: AtomicBool::new(false),
        };
        (Arc::new(state), rx)
    }

    /// Whether its max hold has passed by `now`: it is no longer renewed.
    pub(crate) fn held_out(&self, now: Instant) -> bool {
        self.hold_until.is_some_and(|h| now >= h)
    }

    /// Why a lease that ran out by this client's clock is gone: its max hold, else
    /// plainly expired.
    pub(crate) fn expiry_reason(&self) -> LostReason {
        if self.hold_until.is_some_and(|h| h <= self.valid_until()) {
            LostReason::MaxHold
        } else {
            LostReason::Expired
        }
    }

    /// Whether it was taken out of the registry ([`Registry::deregister`]).
    pub(crate) fn is_detached(&self) -> bool {
        self.detached.load(Ordering::Acquire)
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        self.reason.get().copied()
    }

    pub(crate) fn valid_until(&self) -> Instant {
        #[cfg(test)]
        tests::DEADLINE_READS.with(|n| n.set(n.get() + 1));
        let l = self.lease.lock();
        l.ends_by.map_or(l.until, |end| end.min(l.until))
    }

    /// The lease cannot outlast `end`, whatever renewals say: the key that holds it
    /// expires by then (an `RPermitExpirableSemaphore` whose counter has a TTL).
    /// Only ever moves earlier.
    pub(crate) fn ends_by(&self, end: Instant) {
        let mut l = self.lease.lock();
        if l.ends_by.is_none_or(|e| end < e) {
            l.ends_by = Some(end);
        }
    }

    /// Why a permit that Redis no longer has is gone, as far as this client can tell:
    /// the reason already recorded, else expired once its lease must have run out by
    /// this client's clock, else released by someone else.
    pub(crate) fn gone_reason(&self) -> LostReason {
        self.lost_reason()
            .unwrap_or(if Instant::now() >= self.valid_until() {
                self.expiry_reason()
            } else {
                LostReason::Released
            })
    }

    /// Starts a lease update of this permit (`updateLeaseTime`, which sets the
    /// server's deadline to what it is given, a shorter one included): call it before
    /// the update is sent, and say how it went on the guard. It waits for an update of
    /// the same permit already on its way in this client.
    pub(crate) fn begin_lease_update(&self) -> LeaseUpdate<'_> {
        let serial = self.update_serial.lock();
        self.lease.lock().updating = true;
        LeaseUpdate {
            state: self,
            _serial: serial,
        }
    }

    /// A renewal sent at `sent` was answered: the lease surely runs until `until`. A
    /// renewal never moves the deadline earlier (the scripts renew with `GT`), and is
    /// not applied when a lease update ([`begin_lease_update`](Self::begin_lease_update))
    /// was on its way at any moment since `sent`: the server may have run the renewal
    /// first and the update (perhaps a shorter lease) after it, which this client
    /// cannot tell from the order of the replies. The update's deadline then stands
    /// until a renewal sent after it is answered.
    pub(crate) fn renewed(&self, until: Instant, sent: Instant) {
        let mut l = self.lease.lock();
        if l.updating || l.updated_at.is_some_and(|at| at >= sent) {
            return;
        }
        if until > l.until {
            l.until = until;
        }
    }

    /// [`mark_lost`](Self::mark_lost), counted in the client's `lost` statistic when
    /// this call recorded the loss.
    pub(crate) fn mark_lost_counted(&self, reason: LostReason, stats: &Counters) {
        if self.mark_lost(reason) {
            Counters::bump(&stats.lost);
        }
    }

    /// Records the loss once and fires the `lost()` channel: the reason is sent, then
    /// the sender dropped, so every receiver sees the loss. Whether this call recorded
    /// it (false: it was already lost), so that racing callers count a loss once.
    pub(crate) fn mark_lost(&self, reason: LostReason) -> bool {
        let first = self.reason.set(reason).is_ok();
        if first {
            let tx = self.tx.lock().take();
            if let Some(tx) = tx {
                let _ = tx.try_send(reason);
            }
            if !self.id.starts_with("w:") {
                self.metrics.lost(reason);
                log::info!("redis-semaphore: permit {} lost: {reason}", self.id);
            }
        }
        first
    }

    /// Why the lease is gone, judged from the client's clock and what Redis said.
    pub(crate) fn reason_for_missing(&self, now: Instant, server_reset: bool) -> LostReason {
        if now >= self.valid_until() {
            self.expiry_reason()
        } else if server_reset {
            LostReason::Reset
        } else {
            LostReason::Released
        }
    }
}

/// A permit's deadline on the client, and what lease updates did to it.
#[derive(Debug)]
struct Lease {
    /// The instant before which the lease surely still runs on the server, by what
    /// renewals and lease updates said.
    until: Instant,
    /// The lease ends then at the latest, whatever renewals say: the end of the key
    /// that holds it, when it has a TTL ([`PermitState::ends_by`]), or the deadline of
    /// a lease update that failed and may still run ([`LeaseUpdate::in_doubt`]).
    ends_by: Option<Instant>,
    /// A lease update is on its way ([`PermitState::begin_lease_update`]).
    updating: bool,
    /// When the last lease update ended (its answer, or its failure, came).
    updated_at: Option<Instant>,
}

/// A lease update of a permit on its way ([`PermitState::begin_lease_update`]): it
/// ends, as far as renewals are concerned, when the guard goes.
pub(crate) struct LeaseUpdate<'a> {
    state: &'a PermitState,
    _serial: parking_lot::MutexGuard<'a, ()>,
}

impl LeaseUpdate<'_> {
    /// The server applied the update: the lease surely runs until `until`, and no
    /// longer.
    pub(crate) fn applied(self, until: Instant) {
        self.state.lease.lock().until = until;
    }

    /// The update failed after it may have reached the server (a lost reply, a replica
    /// wait that failed after the write, a request held on its way): the lease runs
    /// until its old deadline or `until`, whichever the server kept, so the client
    /// counts the earlier. And for good: a request held on its way may still run
    /// after a later renewal was answered, and set the update's deadline over the
    /// renewal's, so no renewal moves the permit past `until` any more (as a key's
    /// TTL bounds it, [`PermitState::ends_by`]).
    pub(crate) fn in_doubt(self, until: Instant) {
        let mut l = self.state.lease.lock();
        if until < l.until {
            l.until = until;
        }
        if l.ends_by.is_none_or(|e| until < e) {
            l.ends_by = Some(until);
        }
    }
}

impl Drop for LeaseUpdate<'_> {
    fn drop(&mut self) {
        let mut l = self.state.lease.lock();
        l.updating = false;
        l.updated_at = Some(Instant::now());
    }
}

/// Permits are refreshed in groups that share keys and lease.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct GroupKey {
    pub(crate) name: Arc<str>,
    pub(crate) lease_ms: u64,
    /// `false`: manual refresh; the thread only watches for the lease to end.
    pub(crate) auto: bool,
    /// `SemaphoreBuilder::wait_replicas` (count, timeout in ms) of the leased
    /// semaphore's permits: each renewal call of the group is followed by `WAIT` on
    /// its connection, and counts on the client only once that many replicas
    /// acknowledged it. `None` for waiters' heartbeats and the compat layouts.
    pub(crate) replicas: Option<(u32, u64)>,
}

impl GroupKey {
    /// The lease the group's permits are renewed for.
    pub(crate) fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }
}

/// Renews permits of another layout than the leased semaphore's (a compat type's),
/// for the refresher: one call per due group and chunk of permits (as the leased
/// semaphore's refresh), in the background thread.
pub(crate) trait Renew: Send + Sync {
    /// Renews each permit for another lease, with one script call (the refresher
    /// passes a bounded chunk), waiting on Redis (pool checkout and the call) at most
    /// `wait` in all, as the refresher's own renewals do; returns the ids found gone.
    /// An error means nothing is known (the permits stay, their deadlines unchanged).
    fn renew(&self, permits: &[Arc<PermitState>], wait: Duration) -> crate::Result<Vec<String>>;
}

/// Gives back what a call of another layout than the leased semaphore's took (a compat
/// type's give-back that failed), for the refresher's clean-ups ([`Cleanup::custom`]).
/// A give-back handed to the refresher is sent again until it succeeds or its end
/// passes (and once more at the client's drop), so it must be safe to run any number
/// of times: by the call's own ids, or with an operation key (`once.lua`) that makes a
/// repeated run change nothing.
pub(crate) trait GiveBack: Send + Sync + std::fmt::Debug {
    /// Sends the give-back once on a connection of `pool` (the client's; calls of
    /// `op_timeout`), all of it (the checkout included) ending by `end`.
    fn give_back(
        &self,
        pool: &crate::pool::Pool,
        op_timeout: Duration,
        end: Instant,
    ) -> crate::Result<()>;
}

struct Group {
    keys: Arc<Keys>,
    period: Duration,
    next_due: Instant,
    permits: HashMap<String, Arc<PermitState>>,
    /// At or before the client-side deadline of every permit of the group (`None`: no
    /// permit). A lower bound, since a deadline only ever moves later (a renewal,
    /// here or by a manual refresh); made exact by a look at the permits
    /// ([`Group::take_expired`], a settled renewal). So the thread's schedule and its
    /// look for permits past their deadline cost one comparison per group, not one per
    /// permit: a client of 200 semaphores of 50 permits each woke 600 times a second
    /// and read 10,000 deadlines three times each time.
    earliest: Option<Instant>,
    /// `None`: the leased semaphore's refresh script on `keys`.
    renewer: Option<Arc<dyn Renew>>,
    /// Its last renewal failed after taking a retry's delay or more (cut by its wait:
    /// a server slow for this semaphore): its next one goes after the rest of the
    /// round ([`Batch::behind`]).
    failed_slowly: bool,
    /// The batch the thread took of it and has not settled yet ([`Batch::taken`]):
    /// the group is not taken again meanwhile ([`Registry::take_due`]), so that a
    /// round longer than its period does not renew it twice or thrice in a row.
    queued: Option<u64>,
    /// A permit joined it while its batch was queued: the batch takes it in when it
    /// is sent ([`Registry::join`]), and its settling keeps the permit's first
    /// renewal due time.
    joined: bool,
}

impl Group {
    /// Moves the permits whose client-side deadline is not after `now` to `expired`
    /// (a look at them only when [`Group::earliest`] says one may be), and makes
    /// `earliest` exact.
    fn take_expired(&mut self, now: Instant, expired: &mut Vec<Arc<PermitState>>) {
        if self.earliest.is_none_or(|t| t > now) {
            return;
        }
        let mut earliest: Option<Instant> = None;
        self.permits.retain(|_, p| {
            let until = p.valid_until();
            let live = until > now;
            if live {
                earliest = Some(earliest.map_or(until, |t| t.min(until)));
            } else {
                expired.push(Arc::clone(p));
            }
            live
        });
        self.earliest = earliest;
    }

    /// Makes [`Group::earliest`] exact (after a renewal moved deadlines).
    fn recount_earliest(&mut self) {
        self.earliest = self.permits.values().map(|p| p.valid_until()).min();
    }
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("keys", &self.keys)
            .field("period", &self.period)
            .field("permits", &self.permits.len())
            .field("custom", &self.renewer.is_some())
            .finish()
    }
}

/// Every permit of one client that is still held.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    groups: HashMap<GroupKey, Group>,
    cleanups: Vec<Cleanup>,
    /// (semaphore, permit id) of the adoptions under way (see [`Registry::claim`]),
    /// and whether an operator's release of this client named the grant meanwhile
    /// ([`Registry::force_released`]).
    claims: Vec<(String, String, bool)>,
    /// Permit id -> semaphore of every `Permit` of the leased semaphore this client has
    /// handed out and that has not gone yet (released, dropped, handed over with
    /// `into_parts`), lost or not: such a grant is not adopted again
    /// ([`Registry::claim`]). (Keyed by the id alone, a random 128-bit one, so that
    /// the hot path's removal and the look-up allocate nothing.)
    in_hand: HashMap<String, Arc<str>>,
    /// Hex id -> (semaphore, state) of every `RPermitExpirableSemaphore` permit this
    /// client handed out and that has not gone yet: `update_lease_time` on its id, by
    /// any handle of the client, moves its deadline too
    /// ([`Registry::pes_held`]). Weak: a permit dropped without its release path
    /// leaves a dead entry, pruned as the map grows.
    pes_in_hand: HashMap<String, (Arc<str>, std::sync::Weak<PermitState>)>,
    /// The size at which `pes_in_hand` is pruned of dead entries next.
    pes_prune_at: usize,
    /// The earliest deadline of the permits registered since the background thread
    /// last asked ([`take_fresh_deadline`](Registry::take_fresh_deadline)).
    fresh_deadline: Option<Instant>,
    /// When the background thread looks at the registry next by itself.
    looks: Looks,
    /// At or before the next renewal due of every group and the time of every
    /// release owed (`None`: none): how a round of the background thread knows, in
    /// O(1), that nothing came due while it ran ([`take_due_since`](Registry::take_due_since)).
    /// A lower bound, made exact by that look.
    due_bound: Option<Instant>,
    /// The tag of the next batch taken ([`Batch::taken`]).
    next_taken: u64,
    /// The groups that came due again while their batch was queued, since the thread
    /// last asked ([`take_again`](Registry::take_again)), with a bound of their
    /// earliest deadline (as [`Batch::deadline`]): a round moves their batch up, as it
    /// would put a new batch first.
    again: Vec<(GroupKey, Instant)>,
}

/// When the background thread looks at the registry next without being woken: a
/// registration wakes it only when its first renewal is due before then (so that a
/// thread already due to wake in time is not woken per permit, a wake-up that would
/// cost the acquiring thread its CPU on a busy machine).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Looks {
    /// It is awake (or starting): it reads the schedule again before it sleeps.
    #[default]
    Soon,
    /// It sleeps until then.
    At(Instant),
    /// It sleeps until woken.
    Never,
}

/// A release owed for an acquire whose reply was lost: sent from `at` on (never
/// before: the acquire cannot run after then), retried until `until` (by then the
/// lease of whatever it was granted has surely ended).
///
/// For a `waiter`'s id (a queued acquire that left without its cancel), the queue
/// entry is taken out first, then whatever was granted to it is released.
#[derive(Debug)]
pub(crate) struct Cleanup {
    pub(crate) keys: Arc<Keys>,
    pub(crate) id: String,
    pub(crate) at: Instant,
    pub(crate) until: Instant,
    pub(crate) waiter: bool,
    /// `None`: the leased semaphore's release of `id` on `keys`; else the give-back of
    /// a compat layout ([`GiveBack`]), `id` then only naming it in logs and `keys`
    /// only telling the refresher's calls apart.
    pub(crate) custom: Option<Arc<dyn GiveBack>>,
}

impl Cleanup {
    /// What becomes of the permit once its clean-up is given up, for the warning.
    pub(crate) fn given_up(&self) -> &'static str {
        if self.custom.is_some() {
            "it stays taken until its lease ends, if it has one: fewer holders than the \
             limit, never more"
        } else {
            "its lease ends by itself"
        }
    }
}

impl Registry {
    /// Adds a permit; returns whether the thread must be woken to look at its schedule
    /// (it sleeps past the permit's first renewal, or its loss when not renewed).
    pub(crate) fn register(
        &mut self,
        key: GroupKey,
        keys: &Arc<Keys>,
        period: Duration,
        state: Arc<PermitState>,
    ) -> bool {
        self.register_with(key, keys, period, state, None)
    }

    /// [`register`](Self::register) with the renewer of a compat layout (`None`: the
    /// leased semaphore's refresh script). Groups of different renewers must have
    /// different keys (the compat types prefix the name).
    pub(crate) fn register_with(
        &mut self,
        key: GroupKey,
        keys: &Arc<Keys>,
        period: Duration,
        state: Arc<PermitState>,
        renewer: Option<Arc<dyn Renew>>,
    ) -> bool {
        let now = Instant::now();
        let until = state.valid_until();
        self.fresh_deadline = Some(self.fresh_deadline.map_or(until, |t| t.min(until)));
        let first_due = if key.auto {
            // a grant with little left (a permit pushed to a waiter lasts a heartbeat
            // until renewed, a grant learnt late has less) is renewed at half of it
            let left = state.valid_until().saturating_duration_since(now);
            now + period.min(left / 2)
        } else {
            state.valid_until()
        };
        let group = self.groups.entry(key).or_insert_with(|| Group {
            keys: Arc::clone(keys),
            period,
            next_due: first_due,
            permits: HashMap::new(),
            earliest: None,
            renewer,
            failed_slowly: false,
            queued: None,
            joined: false,
        });
        if period < group.period {
            group.period = period;
        }
        if first_due < group.next_due {
            group.next_due = first_due;
        }
        lower(&mut self.due_bound, first_due);
        group.earliest = Some(group.earliest.map_or(until, |t| t.min(until)));
        group.permits.insert(state.id.clone(), state);
        group.joined |= group.queued.is_some();
        // (first_due is at or before the permit's deadline: a loss is declared in time)
        match self.looks {
            Looks::Soon => false,
            Looks::At(t) => first_due < t,
            Looks::Never => true,
        }
    }

    /// The background thread is about to sleep: when it wakes by itself (`None`: only
    /// when woken), as it computed from [`next_wake`](Registry::next_wake) under the same
    /// lock, so that a registration in between sees it.
    pub(crate) fn sleeping_until(&mut self, until: Option<Instant>) {
        self.looks = until.map_or(Looks::Never, Looks::At);
    }

    /// The background thread woke up: it reads the schedule again before it sleeps.
    pub(crate) fn awake(&mut self) {
        self.looks = Looks::Soon;
    }

    /// Claims permit `id` of semaphore `name` for an adoption; `false` when a permit of
    /// this client already holds that grant (registered and not lost, under any lease
    /// of the semaphore) or another adoption of it is under way. Two handles of one
    /// grant in one client would each believe it theirs: the first release would end
    /// both (renewals no longer move a deadline earlier, so a shorter lease cannot cut
    /// the other's short any more). Held until [`Registry::unclaim`], which the
    /// adoption calls after it registered its permit (or failed).
    ///
    /// A `Permit` still in hand holds its grant also once it is known lost (its lease
    /// ran out by this client's clock, while the server may still hold the grant, a
    /// renewal whose reply was lost having moved it on): its release, when it goes,
    /// frees the grant on the server, so a second handle adopted meanwhile would say
    /// it is valid while another holder has the slot.
    pub(crate) fn claim(&mut self, name: &str, id: &str) -> bool {
        let held = self.groups.iter().any(|(key, g)| {
            &*key.name == name && g.permits.get(id).is_some_and(|p| p.lost_reason().is_none())
        });
        let in_hand = self.in_hand.get(id).is_some_and(|n| &**n == name);
        if held || in_hand || self.claims.iter().any(|(n, i, _)| n == name && i == id) {
            return false;
        }
        self.claims.push((name.to_owned(), id.to_owned(), false));
        true
    }

    /// An operator's release of grant `id` of semaphore `name` by this client is about
    /// to be sent: the registered permits of the grant (under any lease of it), which
    /// [`Semaphore::force_release`](crate::Semaphore::force_release) marks lost, and
    /// an adoption of it under way is told too ([`Registry::claim_force_released`]):
    /// its script may have run before the release, its `Permit` not registered yet.
    pub(crate) fn force_released(&mut self, name: &str, id: &str) -> Vec<Arc<PermitState>> {
        for claim in self.claims.iter_mut() {
            if claim.0 == name && claim.1 == id {
                claim.2 = true;
            }
        }
        self.permits_of(name, id)
    }

    /// Whether an operator's release of this client named grant `id` of semaphore
    /// `name` while this client's adoption of it was under way (asked by the adoption
    /// after it registered its permit, before it ends its claim: a release sent after
    /// the registration finds the permit, one sent before it marked the claim).
    pub(crate) fn claim_force_released(&self, name: &str, id: &str) -> bool {
        self.claims
            .iter()
            .any(|(n, i, released)| *released && n == name && i == id)
    }

    /// The registered permits of grant `id` of semaphore `name` (under any lease of
    /// it): what [`Semaphore::force_release`](crate::Semaphore::force_release) of this
    /// client frees under its own `Permit`s.
    pub(crate) fn permits_of(&self, name: &str, id: &str) -> Vec<Arc<PermitState>> {
        self.groups
            .iter()
            .filter(|(key, _)| &*key.name == name)
            .filter_map(|(_, g)| g.permits.get(id).cloned())
            .collect()
    }

    /// An `RPermitExpirableSemaphore` permit of semaphore `name` was handed out: until
    /// [`Registry::pes_let_go`], [`Registry::pes_held`] finds it by its id.
    pub(crate) fn pes_hold(&mut self, name: &Arc<str>, state: &Arc<PermitState>) {
        if self.pes_in_hand.len() >= self.pes_prune_at.max(64) {
            self.pes_in_hand.retain(|_, (_, s)| s.strong_count() > 0);
            self.pes_prune_at = self.pes_in_hand.len() * 2;
        }
        self.pes_in_hand
            .insert(state.id.clone(), (Arc::clone(name), Arc::downgrade(state)));
    }

    /// The `RPermitExpirableSemaphore` permit `id` of semaphore `name` went (released,
    /// dropped, handed over).
    pub(crate) fn pes_let_go(&mut self, name: &str, id: &str) {
        if self.pes_in_hand.get(id).is_some_and(|(n, _)| &**n == name) {
            self.pes_in_hand.remove(id);
        }
    }

    /// The live `RPermitExpirableSemaphore` permit `id` of semaphore `name` this client
    /// holds, if any.
    pub(crate) fn pes_held(&self, name: &str, id: &str) -> Option<Arc<PermitState>> {
        self.pes_in_hand
            .get(id)
            .filter(|(n, _)| &**n == name)
            .and_then(|(_, s)| s.upgrade())
    }

    /// Ends the claim [`Registry::claim`] made.
    pub(crate) fn unclaim(&mut self, name: &str, id: &str) {
        self.claims.retain(|(n, i, _)| !(n == name && i == id));
    }

    /// A `Permit` of grant `id` of semaphore `name` was handed out: until
    /// [`Registry::let_go`], the grant is not adopted again in this client.
    pub(crate) fn in_hand(&mut self, name: &Arc<str>, id: &str) {
        self.in_hand.insert(id.to_owned(), Arc::clone(name));
    }

    /// The `Permit` of grant `id` of semaphore `name` went (released, dropped, or
    /// handed over).
    pub(crate) fn let_go(&mut self, name: &str, id: &str) {
        if self.in_hand.get(id).is_some_and(|n| &**n == name) {
            self.in_hand.remove(id);
        }
    }

    /// The owed release of grant `id` ([`Registry::clean_up`]) is done with (it ran,
    /// or it was given up once the lease had surely ended): the `Permit` whose
    /// release failed with an outcome unknown (a timeout, say) held the grant until
    /// now (`Semaphore`'s `release_by`), and it may be adopted again. (By the id alone:
    /// ids are random and unique to their grant, and a grant in hand is not adopted
    /// again, so the entry can only be that permit's.)
    pub(crate) fn let_go_owed(&mut self, id: &str) {
        self.in_hand.remove(id);
    }

    /// The earliest deadline of the permits registered since the last call (in O(1):
    /// the background thread asks before each of its calls, so that a permit
    /// registered while the call before ran, a grant pushed to a waiter with a
    /// heartbeat's lease say, bounds the next one).
    pub(crate) fn take_fresh_deadline(&mut self) -> Option<Instant> {
        self.fresh_deadline.take()
    }

    /// Takes permit `id` out: it is renewed no more, and a renewal of it already on
    /// its way (in a batch the thread took before) reports no loss of it.
    pub(crate) fn deregister(&mut self, key: &GroupKey, id: &str) {
        if let Some(g) = self.groups.get_mut(key)
            && let Some(p) = g.permits.remove(id)
        {
            p.detached.store(true, Ordering::Release);
        }
    }

    /// When the thread must wake: the next group due, or the next lease that may end by
    /// this process's clock, whichever comes first.
    pub(crate) fn next_wake(&self) -> Option<Instant> {
        let due = self.groups.values().map(|g| g.next_due).min();
        let ends = self.groups.values().filter_map(|g| g.earliest).min();
        let cleanups = self.cleanups.iter().map(|c| c.at).min();
        due.into_iter().chain(ends).chain(cleanups).min()
    }

    /// Owes a release of `id` from `at` on, tried until `until`; for a `waiter`'s id,
    /// its queue entry's removal first (see [`Cleanup`]).
    pub(crate) fn clean_up(
        &mut self,
        keys: &Arc<Keys>,
        id: &str,
        at: Instant,
        until: Instant,
        waiter: bool,
    ) {
        self.lower_due_bound(at);
        self.cleanups.push(Cleanup {
            keys: Arc::clone(keys),
            id: id.to_owned(),
            at,
            until,
            waiter,
            custom: None,
        });
    }

    /// Owes the give-back `what` of a compat layout (named `id` in logs), sent from
    /// now on and tried until `until` ([`GiveBack`]).
    pub(crate) fn clean_up_with(
        &mut self,
        keys: &Arc<Keys>,
        id: String,
        until: Instant,
        what: Arc<dyn GiveBack>,
    ) {
        let at = Instant::now();
        self.lower_due_bound(at);
        self.cleanups.push(Cleanup {
            keys: Arc::clone(keys),
            id,
            at,
            until,
            waiter: false,
            custom: Some(what),
        });
    }

    /// Takes the releases owed by `now`.
    pub(crate) fn take_cleanups(&mut self, now: Instant) -> Vec<Cleanup> {
        let (due, later) = std::mem::take(&mut self.cleanups)
            .into_iter()
            .partition(|c| c.at <= now);
        self.cleanups = later;
        due
    }

    /// Takes every release owed, due or not (the thread is stopping).
    pub(crate) fn take_all_cleanups(&mut self) -> Vec<Cleanup> {
        std::mem::take(&mut self.cleanups)
    }

    /// Owes again releases taken by [`take_cleanups`](Self::take_cleanups) and not sent.
    pub(crate) fn put_back(&mut self, cleanups: impl IntoIterator<Item = Cleanup>) {
        let first = self.cleanups.len();
        self.cleanups.extend(cleanups);
        if let Some(at) = self.cleanups[first..].iter().map(|c| c.at).min() {
            self.lower_due_bound(at);
        }
    }

    fn lower_due_bound(&mut self, at: Instant) {
        lower(&mut self.due_bound, at);
    }

    /// What came due by `now` while a round of the background thread ran (renewals
    /// and manual permits past their deadline as [`take_due`](Self::take_due), and
    /// releases owed as [`take_cleanups`](Self::take_cleanups)); in O(1) when nothing
    /// can have.
    pub(crate) fn take_due_since(&mut self, now: Instant) -> TakenDue {
        if self.due_bound.is_none_or(|t| t > now) {
            return (Vec::new(), Vec::new(), Vec::new());
        }
        let cleanups = self.take_cleanups(now);
        let (batches, expired) = self.take_due(now);
        (batches, expired, cleanups)
    }

    /// The earliest client-side deadline after `now`, or a time before it and after
    /// `now`: how long the thread may wait on Redis without missing one. Asked right
    /// after [`take_expired`](Self::take_expired) with the same `now` (which leaves no
    /// group whose bound is not after it), it costs one comparison per group.
    pub(crate) fn earliest_deadline_after(&self, now: Instant) -> Option<Instant> {
        self.groups
            .values()
            .filter_map(|g| match g.earliest {
                // (a group not looked at since its bound passed: its permits)
                Some(t) if t <= now => g
                    .permits
                    .values()
                    .map(|p| p.valid_until())
                    .filter(|&t| t > now)
                    .min(),
                bound => bound,
            })
            .min()
    }

    /// Takes the permits, of any group, whose lease may have run out by `now` by this
    /// process's clock: they are lost, whatever their group's schedule.
    pub(crate) fn take_expired(&mut self, now: Instant) -> Vec<Arc<PermitState>> {
        let mut expired = Vec::new();
        for g in self.groups.values_mut() {
            g.take_expired(now, &mut expired);
        }
        expired
    }

    /// Takes the work that is due: batches to renew, and manual permits whose lease
    /// ran out. Empty groups are dropped when they come due. (Makes the bound of what
    /// is due next exact, the releases owed counted as they are: take those due first.)
    pub(crate) fn take_due(&mut self, now: Instant) -> (Vec<Batch>, Vec<Arc<PermitState>>) {
        let mut batches = Vec::new();
        let mut expired = Vec::new();
        // (the bound of what is due next, made exact in the same pass)
        let mut next = self.cleanups.iter().map(|c| c.at).min();
        self.groups.retain(|key, g| {
            if g.next_due > now {
                lower(&mut next, g.next_due);
                return true;
            }
            if key.auto {
                if g.permits.is_empty() {
                    return false;
                }
                g.next_due = now + g.period;
                // (a lower bound of its permits' earliest deadline)
                let deadline = g.earliest.unwrap_or(g.next_due);
                if g.queued.is_some() {
                    // its batch is still queued (taken, not settled): not taken again
                    // (it would be renewed twice in a row), but moved up in the round
                    self.again.push((key.clone(), deadline));
                    lower(&mut next, g.next_due);
                    return true;
                }
                // a permit past its max hold is not renewed: it ends with its lease
                let permits: Vec<_> = g
                    .permits
                    .values()
                    .filter(|p| !p.held_out(now))
                    .cloned()
                    .collect();
                if !permits.is_empty() {
                    let taken = self.next_taken;
                    self.next_taken += 1;
                    g.queued = Some(taken);
                    g.joined = false;
                    batches.push(Batch {
                        key: key.clone(),
                        keys: Arc::clone(&g.keys),
                        permits,
                        renewer: g.renewer.clone(),
                        behind: g.failed_slowly,
                        taken,
                        deadline,
                    });
                }
            } else {
                g.take_expired(now, &mut expired);
                match g.permits.values().map(|p| p.valid_until()).min() {
                    Some(t) => g.next_due = t,
                    None => return false,
                }
            }
            lower(&mut next, g.next_due);
            true
        });
        self.due_bound = next;
        (batches, expired)
    }

    /// The groups that came due again, since the last call, while their batch was
    /// queued ([`take_due`](Self::take_due) does not take them again): the round moves
    /// their batch up.
    pub(crate) fn take_again(&mut self) -> Vec<(GroupKey, Instant)> {
        std::mem::take(&mut self.again)
    }

    /// The batch is about to be sent at `now`: the permits that joined its group
    /// while it was queued join it (they are renewed with it, at once, rather than
    /// after it).
    pub(crate) fn join(&mut self, batch: &mut Batch, now: Instant) {
        if let Some(g) = self.groups.get_mut(&batch.key)
            && g.queued == Some(batch.taken)
            && g.joined
        {
            g.joined = false;
            batch.permits = g
                .permits
                .values()
                .filter(|p| !p.held_out(now))
                .cloned()
                .collect();
        }
    }

    /// The batch tagged `taken` of group `key` is gone without being settled (its
    /// round ended early, its call panicked): the group may be taken again, on its
    /// schedule. Nothing when it was settled, or taken again since.
    pub(crate) fn release(&mut self, key: &GroupKey, taken: u64) {
        if let Some(g) = self.groups.get_mut(key)
            && g.queued == Some(taken)
        {
            g.queued = None;
            g.joined = false;
            lower(&mut self.due_bound, g.next_due);
        }
    }

    /// Applies the outcome of the batch tagged `taken` (sent at `sent`): lost permits
    /// leave, and the group may be taken again ([`Registry::release`]). A renewal that
    /// succeeded is due again a period after it was sent (not after the batch was
    /// taken: a batch queued long in a round is not followed at once by another), or
    /// sooner for a permit that joined the group since the batch was sent. `failed`:
    /// the renewal failed; its next try is a retry's delay from `now`
    /// ([`RETRY_AFTER_FAILURE`], at most a period), or sooner when the group was already
    /// due sooner (a permit registered meanwhile), never at a due time already past;
    /// and when the call took that delay or more, the try goes after the rest of the
    /// round ([`Batch::behind`]). Else a call that failed after outlasting its period
    /// (cut by its wait, against a server slow for this semaphore) had the round take
    /// the group again at once, first, and the groups left in the round waited behind
    /// its tries (and those of the round's other slow semaphores) until their leases
    /// ran out.
    pub(crate) fn settle(
        &mut self,
        key: &GroupKey,
        taken: u64,
        lost: &[Arc<PermitState>],
        sent: Instant,
        failed: bool,
        now: Instant,
    ) {
        if let Some(g) = self.groups.get_mut(key) {
            let joined = g.joined;
            if g.queued == Some(taken) {
                g.queued = None;
                g.joined = false;
            }
            for p in lost {
                // only that entry: a waiter told of the loss may already have
                // registered a new heartbeat under the same id
                if g.permits.get(&p.id).is_some_and(|q| Arc::ptr_eq(q, p)) {
                    g.permits.remove(&p.id);
                }
            }
            let delay = RETRY_AFTER_FAILURE.min(g.period);
            g.failed_slowly = failed && now.saturating_duration_since(sent) >= delay;
            if failed {
                let retry = now + delay;
                g.next_due = if g.next_due > now {
                    g.next_due.min(retry)
                } else {
                    retry
                };
            } else if !joined && key.auto {
                g.next_due = g.next_due.max(sent + g.period);
            }
            lower(&mut self.due_bound, g.next_due);
            // (the renewal moved the deadlines of the batch's permits: one look at the
            // group, as long as the batch's own)
            g.recount_earliest();
        }
    }
}

/// Moves the lower bound `bound` to `at` if that is earlier.
fn lower(bound: &mut Option<Instant>, at: Instant) {
    *bound = Some(bound.map_or(at, |t| t.min(at)));
}

/// What [`Registry::take_due_since`] takes: batches to renew, manual permits past
/// their deadline, releases owed.
pub(crate) type TakenDue = (Vec<Batch>, Vec<Arc<PermitState>>, Vec<Cleanup>);

/// One script call's worth of renewals.
pub(crate) struct Batch {
    pub(crate) key: GroupKey,
    pub(crate) keys: Arc<Keys>,
    pub(crate) permits: Vec<Arc<PermitState>>,
    /// A compat layout's renewer, else the leased semaphore's refresh script.
    pub(crate) renewer: Option<Arc<dyn Renew>>,
    /// The group's last renewal failed slowly ([`Registry::settle`]): this one goes
    /// after the other batches of the round, so that a semaphore the server is slow for
    /// does not hold back the renewals of the others.
    pub(crate) behind: bool,
    /// Tells this batch from the group's others: the group is not taken again until
    /// the batch so tagged is settled or released ([`Registry::settle`],
    /// [`Registry::release`]).
    pub(crate) taken: u64,
    /// At or before the earliest deadline of the group's permits when it was taken:
    /// the order in which a round renews what came due while it ran.
    pub(crate) deadline: Instant,
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// How many client-side deadlines this thread read ([`PermitState::valid_until`]).
        pub(super) static DEADLINE_READS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// Review (fifth session): each wake of the thread read every permit's deadline
    /// three times (its schedule, the look for permits past their deadline, the next
    /// deadline): with 200 semaphores of 50 permits renewed a third of a lease apart,
    /// 600 wakes a second read 10,000 deadlines each (the thread spent about 40 % of
    /// a core on a debug build, against 15 % for 200 permits). The groups keep a bound
    /// of their earliest deadline: a wake reads none where no deadline is due.
    #[test]
    fn a_wake_reads_the_deadlines_of_no_group_whose_earliest_is_ahead() {
        let mut reg = Registry::default();
        let period = Duration::from_millis(300);
        let far = Instant::now() + Duration::from_secs(60);
        for g in 0..100 {
            let name = format!("s{g}");
            let key = GroupKey {
                name: Arc::from(name.as_str()),
                lease_ms: 1000,
                auto: g % 2 == 0,
                replicas: None,
            };
            let keys = Arc::new(Keys::new(&name));
            for k in 0..100 {
                let (state, _rx) = PermitState::new(format!("{g}-{k}"), far);
                reg.register(key.clone(), &keys, period, state);
            }
        }
        DEADLINE_READS.with(|n| n.set(0));
        for _ in 0..10 {
            let now = Instant::now();
            assert!(reg.next_wake().is_some());
            assert!(reg.take_expired(now).is_empty());
            assert!(reg.earliest_deadline_after(now).is_some_and(|t| t >= far));
        }
        let reads = DEADLINE_READS.with(|n| n.get());
        assert!(
            reads < 1_000,
            "{reads} deadlines read in 10 wakes of 10,000 permits"
        );
        // a deadline that comes is still seen, and only its group is read
        let soon = Instant::now() + Duration::from_millis(50);
        let key = GroupKey {
            name: Arc::from("s7"),
            lease_ms: 1000,
            auto: false,
            replicas: None,
        };
        let (state, _rx) = PermitState::new("soon".into(), soon);
        reg.register(key, &Arc::new(Keys::new("s7")), period, state);
        assert!(reg.next_wake().is_some_and(|t| t <= soon));
        assert_eq!(reg.earliest_deadline_after(Instant::now()), Some(soon));
        DEADLINE_READS.with(|n| n.set(0));
        let gone = reg.take_expired(soon);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].id, "soon");
        let reads = DEADLINE_READS.with(|n| n.get());
        assert!(
            reads <= 101,
            "{reads} deadlines read to take one group's expired permit"
        );
        assert!(reg.earliest_deadline_after(soon).is_some_and(|t| t >= far));
    }

    /// The key of the group [`register`] puts a permit of semaphore `name` in.
    fn group_key(name: &str, auto: bool) -> GroupKey {
        GroupKey {
            name: Arc::from(name),
            lease_ms: 300,
            auto,
            replicas: None,
        }
    }

    fn register(reg: &mut Registry, name: &str, auto: bool, id: &str, valid_for: Duration) {
        let key = group_key(name, auto);
        let keys = Arc::new(Keys::new(name));
        let (state, _rx) = PermitState::new(id.into(), Instant::now() + valid_for);
        let period = Duration::from_millis(100);
        reg.register(key, &keys, period, state);
    }

    /// Review (sixth session): a round of the background thread looks, between its
    /// calls, for what came due while it ran (a permit registered meanwhile, a retry,
    /// a release owed), by a bound of the next due time: nothing when nothing did.
    #[test]
    fn a_look_for_work_due_during_a_round_finds_what_came_due_and_only_that() {
        let mut reg = Registry::default();
        for g in 0..10 {
            register(
                &mut reg,
                &format!("s{g}"),
                true,
                "p",
                Duration::from_secs(60),
            );
        }
        let start = Instant::now();
        // the round takes every group (their first renewal, due within a period)
        let (batches, _) = reg.take_due(start + Duration::from_millis(100));
        assert_eq!(batches.len(), 10);
        let (more, expired, owed) = reg.take_due_since(start + Duration::from_millis(150));
        assert!(more.is_empty() && expired.is_empty() && owed.is_empty());
        // a permit registered while the round runs comes due within it
        register(&mut reg, "new", true, "q", Duration::from_secs(60));
        let (more, _, _) = reg.take_due_since(Instant::now() + Duration::from_millis(100));
        assert_eq!(more.len(), 1);
        assert_eq!(more[0].permits[0].id, "q");
        // and so does a release owed
        let keys = Arc::new(Keys::new("s0"));
        let at = Instant::now();
        reg.clean_up(&keys, "r", at, at + Duration::from_secs(1), false);
        let (more, _, owed) = reg.take_due_since(at);
        assert!(more.is_empty());
        assert_eq!(owed.len(), 1);
    }

    /// Review (eighth session): a renewal that failed after outlasting its period kept
    /// the due time the round had set when it took the group, already past, so the
    /// round took the group again at once and first. Its next try is a retry's delay
    /// after the failure, after the rest of the round; a quick failure's is not put
    /// last, and a failure still brings a far-off next try closer.
    #[test]
    fn a_renewal_that_failed_slowly_is_tried_again_later_and_after_the_others() {
        let mut reg = Registry::default();
        register(&mut reg, "slow", true, "s", Duration::from_secs(60));
        register(&mut reg, "quick", true, "q", Duration::from_secs(60));
        let key = |name: &str| group_key(name, true);
        let start = Instant::now();
        let (batches, _) = reg.take_due(start + Duration::from_millis(100));
        assert_eq!(batches.len(), 2);
        assert!(batches.iter().all(|b| !b.behind));
        let tag = |batches: &[Batch], name: &str| {
            batches
                .iter()
                .find(|b| &*b.key.name == name)
                .map(|b| b.taken)
                .unwrap()
        };
        let quick_tag = tag(&batches, "quick");
        // the slow one's call failed 500 ms after it was sent (its period is 100 ms)
        let failed_at = start + Duration::from_millis(600);
        reg.settle(
            &key("slow"),
            tag(&batches, "slow"),
            &[],
            start + Duration::from_millis(100),
            true,
            failed_at,
        );
        let (more, _, _) = reg.take_due_since(failed_at);
        assert!(
            more.iter().all(|b| &*b.key.name != "slow"),
            "taken again at once"
        );
        let retry = failed_at + RETRY_AFTER_FAILURE.min(Duration::from_millis(100));
        let (more, _, _) = reg.take_due_since(retry);
        let slow = more.iter().find(|b| &*b.key.name == "slow");
        assert!(
            slow.is_some_and(|b| b.behind),
            "tried again, after the others"
        );
        let slow_tag = tag(&more, "slow");
        // a failure that came at once: tried again as soon, not put last
        reg.settle(
            &key("quick"),
            quick_tag,
            &[],
            retry,
            true,
            retry + Duration::from_millis(1),
        );
        let (more, _, _) = reg.take_due_since(retry + Duration::from_secs(1));
        let quick = more.iter().find(|b| &*b.key.name == "quick");
        assert!(quick.is_some_and(|b| !b.behind));
        // a renewal that succeeds ends it
        let at = retry + Duration::from_secs(1);
        reg.settle(&key("slow"), slow_tag, &[], at, false, at);
        let (more, _, _) = reg.take_due_since(at + Duration::from_secs(1));
        let slow = more.iter().find(|b| &*b.key.name == "slow");
        assert!(slow.is_some_and(|b| !b.behind));
        // a failure brings a far-off next try closer
        let far = GroupKey {
            name: Arc::from("far"),
            lease_ms: 60_000,
            auto: true,
            replicas: None,
        };
        let keys = Arc::new(Keys::new("far"));
        let now = Instant::now();
        let (state, _rx) = PermitState::new("f".into(), now + Duration::from_secs(60));
        reg.register(far.clone(), &keys, Duration::from_secs(20), state);
        reg.settle(&far, 0, &[], now, true, now);
        assert!(reg.groups[&far].next_due <= now + RETRY_AFTER_FAILURE);
    }

    /// Review (eighth session): when a round outlasted a group's period (a slow
    /// server, many semaphores), the look between its calls took the group again
    /// while the batch taken at the round's start was still queued, not yet sent:
    /// both were sent, and a healthy semaphore was renewed two or three times in a
    /// row. A group whose batch is queued is not taken again until that batch is
    /// settled (or released, gone unsettled); it is moved up instead, and a permit
    /// registered meanwhile joins the batch when it is sent.
    #[test]
    fn a_group_whose_batch_is_queued_is_not_taken_again_until_it_is_settled() {
        let mut reg = Registry::default();
        for g in 0..3 {
            register(
                &mut reg,
                &format!("s{g}"),
                true,
                "p",
                Duration::from_secs(60),
            );
        }
        let key = |name: &str| group_key(name, true);
        let start = Instant::now();
        let (batches, _) = reg.take_due(start + Duration::from_millis(100));
        assert_eq!(batches.len(), 3);
        assert!(reg.take_again().is_empty());
        // the round outlasts the period (100 ms): s0 sent and settled, the others queued
        let s0 = batches.iter().find(|b| &*b.key.name == "s0").unwrap();
        let sent = start + Duration::from_millis(100);
        reg.settle(&key("s0"), s0.taken, &[], sent, false, sent);
        let (more, _, _) = reg.take_due_since(start + Duration::from_millis(300));
        let names: Vec<&str> = more.iter().map(|b| &*b.key.name).collect();
        assert_eq!(names, vec!["s0"], "taken again while their batch is queued");
        // ... they are moved up instead
        let mut again: Vec<String> = reg
            .take_again()
            .into_iter()
            .map(|(k, _)| k.name.to_string())
            .collect();
        again.sort();
        assert_eq!(again, vec!["s1", "s2"]);
        // nothing more due: found in O(1), and not again and again
        let (more, _, _) = reg.take_due_since(start + Duration::from_millis(350));
        assert!(more.is_empty() && reg.take_again().is_empty());
        // a permit registered meanwhile joins the queued batch when it is sent
        let mut s1 = batches.into_iter().find(|b| &*b.key.name == "s1").unwrap();
        register(&mut reg, "s1", true, "joined", Duration::from_secs(60));
        let look = Instant::now() + Duration::from_millis(100);
        let (more, _, _) = reg.take_due_since(look);
        assert!(more.iter().all(|b| &*b.key.name != "s1"));
        assert!(reg.take_again().iter().any(|(k, _)| &*k.name == "s1"));
        let sent = look + Duration::from_millis(1);
        reg.join(&mut s1, sent);
        let mut ids: Vec<&str> = s1.permits.iter().map(|p| p.id.as_str()).collect();
        ids.sort();
        assert_eq!(ids, vec!["joined", "p"]);
        // settled, it is due a period after it was sent
        reg.settle(&key("s1"), s1.taken, &[], sent, false, sent);
        let (more, _, _) = reg.take_due_since(sent + Duration::from_millis(50));
        assert!(more.iter().all(|b| &*b.key.name != "s1"));
        let (more, _, _) = reg.take_due_since(sent + Duration::from_millis(100));
        assert!(more.iter().any(|b| &*b.key.name == "s1"));
        // a batch gone unsettled (its round ended early) releases its group; an
        // old tag releases nothing
        let s2 = reg.groups[&key("s2")].queued.unwrap();
        let later = sent + Duration::from_secs(1);
        reg.release(&key("s2"), s2 + 1_000);
        let (more, _, _) = reg.take_due_since(later);
        assert!(more.iter().all(|b| &*b.key.name != "s2"));
        reg.release(&key("s2"), s2);
        let (more, _, _) = reg.take_due_since(later + Duration::from_millis(100));
        assert!(more.iter().any(|b| &*b.key.name == "s2"));
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
    fn a_registration_wakes_the_thread_only_when_due_before_it_looks_by_itself() {
        let key = |name: &str| GroupKey {
            name: Arc::from(name),
            lease_ms: 3000,
            auto: true,
            replicas: None,
        };
        let period = Duration::from_secs(1);
        let permit =
            |id: &str, valid_for| PermitState::new(id.into(), Instant::now() + valid_for).0;
        let mut reg = Registry::default();
        let keys = Arc::new(Keys::new("s"));
        // awake: it reads the schedule before it sleeps
        assert!(!reg.register(key("s"), &keys, period, permit("a", Duration::from_secs(3))));
        // asleep until after the first renewal of a new permit (due in a second): woken
        reg.sleeping_until(Some(Instant::now() + Duration::from_secs(2)));
        assert!(reg.register(key("t"), &keys, period, permit("b", Duration::from_secs(3))));
        // asleep until before it (a waiter's heartbeat, say): not woken, and the
        // schedule it reads then has the new permit's renewal (its first renewal, a
        // second from now, only moves further past the thread's wake-up as time goes)
        let looks_at = Instant::now() + Duration::from_millis(300);
        reg.sleeping_until(Some(looks_at));
        assert!(!reg.register(key("u"), &keys, period, permit("c", Duration::from_secs(3))));
        assert!(
            reg.next_wake()
                .is_some_and(|t| t <= Instant::now() + period)
        );
        // a pushed grant lasting a heartbeat is renewed at half of it: woken when the
        // thread sleeps past that (half a second from now, against two seconds)
        reg.sleeping_until(Some(Instant::now() + Duration::from_secs(2)));
        assert!(reg.register(key("u"), &keys, period, permit("d", Duration::from_secs(1))));
        // asleep until woken: always woken
        reg.sleeping_until(None);
        assert!(reg.register(key("s"), &keys, period, permit("e", Duration::from_secs(3))));
        reg.awake();
        assert!(!reg.register(key("s"), &keys, period, permit("f", Duration::from_secs(3))));
    }

    #[test]
    fn a_grant_is_claimed_for_adoption_only_while_no_permit_or_claim_holds_it() {
        let mut reg = Registry::default();
        register(&mut reg, "s", true, "held", Duration::from_secs(10));
        assert!(!reg.claim("s", "held"), "a permit of the client holds it");
        assert!(
            reg.claim("t", "held"),
            "another semaphore's grant of that id"
        );
        assert!(reg.claim("s", "free"));
        assert!(
            !reg.claim("s", "free"),
            "another adoption of it is under way"
        );
        reg.unclaim("s", "free");
        assert!(reg.claim("s", "free"));
        // a permit known lost holds nothing
        let key = GroupKey {
            name: Arc::from("s"),
            lease_ms: 300,
            auto: true,
            replicas: None,
        };
        reg.groups[&key].permits["held"].mark_lost(LostReason::Expired);
        assert!(reg.claim("s", "held"));
        reg.unclaim("s", "held");
        // ... unless its Permit is still in hand, lost or not
        reg.in_hand(&Arc::from("s"), "held");
        assert!(!reg.claim("s", "held"), "a Permit of the grant is in hand");
        assert!(
            reg.claim("u", "held"),
            "another semaphore's grant of that id"
        );
        reg.let_go("s", "held");
        assert!(reg.claim("s", "held"));
    }

    /// Review: the refresher and a manual refresh both checked "not lost yet" and then
    /// marked the loss, so racing they could count one loss twice in `Stats::lost`.
    /// Marking says whether it recorded the loss, and the callers count only then.
    #[test]
    fn a_loss_is_recorded_once_and_its_channel_fires_once() {
        let (p, lost) = PermitState::new("x".into(), Instant::now());
        assert!(p.mark_lost(LostReason::Expired));
        assert!(!p.mark_lost(LostReason::Released));
        assert_eq!(p.lost_reason(), Some(LostReason::Expired));
        assert_eq!(lost.try_recv(), Ok(LostReason::Expired));
        assert!(lost.try_recv().is_err());
    }

    #[test]
    fn settling_a_loss_keeps_a_heartbeat_registered_anew_under_the_same_id() {
        let mut reg = Registry::default();
        let key = GroupKey {
            name: Arc::from("w"),
            lease_ms: 300,
            auto: true,
            replicas: None,
        };
        let keys = Arc::new(Keys::new("w"));
        let period = Duration::from_millis(100);
        let valid = Instant::now() + Duration::from_secs(1);
        let (old, _old_rx) = PermitState::new("w:x".into(), valid);
        reg.register(key.clone(), &keys, period, Arc::clone(&old));
        // the waiter, told of the loss, registers a new heartbeat before it is settled
        reg.deregister(&key, "w:x");
        let (new, _new_rx) = PermitState::new("w:x".into(), valid);
        reg.register(key.clone(), &keys, period, Arc::clone(&new));
        reg.settle(&key, 0, &[old], Instant::now(), false, Instant::now());
        let kept = reg.groups[&key].permits.get("w:x");
        assert!(kept.is_some_and(|p| Arc::ptr_eq(p, &new)));
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
