use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use crate::clock::{deadline_in, left_until};
use crate::error::{Error, LostReason, Result};
use crate::registry::PermitState;
use crate::threads::{DropBudget, drop_deadline, run_aside};

/// A held permit (or several, see [`permits`](Permit::permits)) of a [`Semaphore`].
///
/// The permits go back when the `Permit` is dropped, or by [`release`](Permit::release),
/// which reports errors that `Drop` can only log. A drop never blocks longer than the
/// client's operation timeout; on Redis Cluster, whose client reconnects a node by
/// itself inside a call, its release runs on a thread of its own for that (a drop
/// that gives up waiting leaves it to end in the background, and logs so). While it is held, the client's
/// background thread renews its lease (unless the semaphore was built with
/// `auto_refresh(false)`). Permits of the wire-compatible
/// [`compat::book`](crate::compat::book) and [`compat::redisson`](crate::compat::redisson)
/// semaphores are not renewed in the background, except those of an
/// `RPermitExpirableSemaphore` made
/// [`with_auto_refresh(true)`](crate::compat::redisson::RPermitExpirableSemaphore::with_auto_refresh),
/// and their [`token`](Permit::token) and [`slots`](Permit::slots) mean what those
/// modules say.
///
/// A `Permit` owns everything it needs (`Send + 'static`), so it can move into a
/// thread that holds it for hours.
///
/// # Lost leases
///
/// A lease can end while the `Permit` still exists: the process stalled for longer
/// than the lease, Redis could not be reached, an operator force-released it, or the
/// server lost its data. [`lost`](Permit::lost) fires and [`is_lost`](Permit::is_lost)
/// turns true as soon as the client knows: within one refresh tick when Redis says so,
/// and at the latest when the lease must have run out by this process's monotonic
/// clock, counted from the last renewal that succeeded. Between the real end of a
/// lease and that moment, another holder may already have the slot: work that must
/// never overlap should be fenced downstream with [`token`](Permit::token) and
/// [`slots`](Permit::slots).
///
/// [`Semaphore`]: crate::Semaphore
#[must_use = "dropping the Permit releases it immediately"]
#[clippy::has_significant_drop]
pub struct Permit {
    pub(crate) grantor: Arc<dyn Grantor>,
    pub(crate) state: Arc<PermitState>,
    pub(crate) lost_rx: Receiver<LostReason>,
    pub(crate) token: u64,
    pub(crate) slots: Vec<u32>,
    pub(crate) permits: u32,
    pub(crate) released: bool,
}

impl Permit {
    /// The permit id: 128 random bits as uuid v4 text, unique to this grant (for a
    /// [`compat::redisson`](crate::compat::redisson) permit, Redisson's 32-character
    /// hex id). It names
    /// the holder in [`Semaphore::holders`](crate::Semaphore::holders) and
    /// [`Semaphore::force_release`](crate::Semaphore::force_release).
    pub fn id(&self) -> &str {
        &self.state.id
    }

    /// The fencing token: a number from a per-semaphore counter, strictly increasing
    /// in grant order. A resource that remembers, per slot, the highest token it has
    /// seen and refuses lower ones is safe from a holder whose lease ran out.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The slot indexes (each below the limit) this permit occupies, one per permit;
    /// the lowest free slots are taken first.
    pub fn slots(&self) -> &[u32] {
        &self.slots
    }

    /// How many permits this guard holds.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The name of the semaphore this permit belongs to.
    pub fn semaphore_name(&self) -> &str {
        self.grantor.name()
    }

    /// Whether the lease is known to be gone. See [Lost leases](#lost-leases).
    pub fn is_lost(&self) -> bool {
        self.state.lost_reason().is_some()
    }

    /// Why the lease is gone, once it is.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.state.lost_reason()
    }

    /// A channel that receives the [`LostReason`] once, when the lease is known to be
    /// gone, and is disconnected from then on. Use it in `crossbeam_channel::select!`
    /// next to the work the permit guards.
    ///
    /// ```no_run
    /// # let client = redis_semaphore::Client::open("redis://127.0.0.1/")?;
    /// # let sem = client.semaphore("consumers", 1)?;
    /// # let work = crossbeam_channel::never::<()>();
    /// let permit = sem.acquire()?;
    /// crossbeam_channel::select! {
    ///     recv(permit.lost()) -> reason => eprintln!("stopping: {reason:?}"),
    ///     recv(work) -> _ => { /* ... */ }
    /// }
    /// # Ok::<(), redis_semaphore::Error>(())
    /// ```
    pub fn lost(&self) -> &Receiver<LostReason> {
        &self.lost_rx
    }

    /// Renews the lease now, to a full lease from this moment.
    ///
    /// Needed only with `auto_refresh(false)`; with automatic refresh the client's
    /// background thread does it every tick. A permit of a
    /// [`Semaphore`](crate::Semaphore) waits on Redis at most the operation timeout in
    /// all, the wait for a pooled connection included.
    ///
    /// # Errors
    ///
    /// [`Error::PermitLost`] when the permit is no longer held (the permit is then
    /// marked lost); [`Error::ReplicasNotAcked`] when its semaphore has
    /// [`wait_replicas`](crate::SemaphoreBuilder::wait_replicas) and too few replicas
    /// acknowledged the renewal in time (the permit keeps its previous deadline: try
    /// again before [`lease_left`](Permit::lease_left) runs out); Redis and pool
    /// errors as they come.
    pub fn refresh(&self) -> Result<()> {
        let lost = || {
            self.lost_reason().map(|reason| Error::PermitLost {
                id: self.id().to_owned(),
                reason,
            })
        };
        if let Some(e) = lost() {
            return Err(e);
        }
        self.grantor.refresh(&self.state)?;
        // renewed, but its deadline passed while the renewal was on its way and the
        // background thread declared it lost (`lost()` fired): it stays lost
        lost().map_or(Ok(()), Err)
    }

    /// Hands the grant over to another process: stops renewing it here and does not
    /// give it back, and returns what [`Semaphore::adopt`](crate::Semaphore::adopt) in
    /// the other process needs to take over its renewal and release (the id, the
    /// fencing token and the slots travel with it). [`PermitParts`] prints as one line
    /// and parses back ([`Display`](std::fmt::Display) and
    /// [`FromStr`](std::str::FromStr)), to pass in a message.
    ///
    /// From now on nothing renews the lease until the other process adopts it: adopt
    /// within what [`lease_left`](Permit::lease_left) said at this call, or the permit
    /// comes back to the semaphore. A permit a blocking acquire was served from the
    /// queue holds at most a heartbeat's lease (about a second) until its first renewal: call
    /// [`refresh`](Permit::refresh) first when the hand-over takes longer.
    ///
    /// ```no_run
    /// # let client = redis_semaphore::Client::open("redis://127.0.0.1/")?;
    /// # let sem = client.semaphore("jobs", 5)?;
    /// let parts = sem.acquire()?.into_parts();
    /// let line = parts.to_string(); // send it to the process that goes on
    /// // ... in that process:
    /// let permit = sem.adopt(line.parse()?)?;
    /// # Ok::<(), redis_semaphore::Error>(())
    /// ```
    #[must_use = "the grant stays taken, renewed by nobody, until its lease ends unless the parts are adopted"]
    pub fn into_parts(mut self) -> PermitParts {
        self.released = true;
        self.grantor.detach(&self.state);
        PermitParts {
            semaphore: self.grantor.name().to_owned(),
            id: self.state.id.clone(),
            token: self.token,
            slots: std::mem::take(&mut self.slots),
            permits: self.permits,
        }
    }

    /// Gives the permits back now and says how it went.
    ///
    /// # Errors
    ///
    /// - [`Error::LeaseExpired`]: released, but the lease had ended before: the work
    ///   done under it may have overlapped another holder's.
    /// - [`Error::PermitLost`]: it was no longer held at all.
    /// - Redis and pool errors; the lease then ends by itself (a
    ///   [`compat::redisson`](crate::compat::redisson) permit-expirable permit without
    ///   a lease has none: it stays taken until released by its id). A transient one
    ///   ([`Error::is_retryable`]: `TRYAGAIN` while a cluster slot migrates, a
    ///   failover, a timeout) of this crate's leased semaphore is sent again by the
    ///   background thread until it runs or the lease has ended.
    ///
    /// In every case the permit is no longer held afterwards.
    pub fn release(mut self) -> Result<()> {
        self.released = true;
        self.grantor.release(&self.state)
    }

    /// The time left before the lease is known to end, by this process's monotonic
    /// clock: a lower bound of what the server holds (zero once lost).
    pub fn lease_left(&self) -> std::time::Duration {
        if self.is_lost() {
            return std::time::Duration::ZERO;
        }
        self.state
            .valid_until()
            .saturating_duration_since(Instant::now())
    }
}

/// What a [`Permit`] needs from the semaphore that granted it: the leased semaphore of
/// this crate, or one of the wire-compatible variants.
pub(crate) trait Grantor: Send + Sync + 'static {
    /// The semaphore's name.
    fn name(&self) -> &str;
    /// Gives the permit back; called once, by `release` or `Drop`.
    fn release(&self, permit: &PermitState) -> Result<()>;
    /// Renews the permit's lease; marks it lost when it is gone.
    fn refresh(&self, permit: &PermitState) -> Result<()>;
    /// Stops renewing the permit here without giving it back ([`Permit::into_parts`]).
    fn detach(&self, _permit: &PermitState) {}
    /// The operation timeout of the client: what a drop of a permit may take in all.
    fn op_timeout(&self) -> Duration;
    /// Whether a drop runs the release on a thread of its own and waits for it no
    /// longer than its budget: where a call can outlast every deadline the library
    /// sets (on Redis Cluster the cluster client reconnects a node by itself, inside
    /// the call, each step with its own connect timeout).
    fn release_aside(&self) -> bool {
        false
    }
}

/// Runs `grantor.release(state)` on a thread of its own and waits for it until the
/// drop's budget of `budget` from now ends; `None` when it did not end by then (it goes
/// on in the background, and is safe to end late: a release that finds the permit
/// gone changes nothing). The thread lets go of its handles before it answers, so a
/// release that ends in time leaves the last handle of the client (and the joins of its
/// threads) to the drop, as without the thread.
fn release_aside(
    grantor: &Arc<dyn Grantor>,
    state: &Arc<PermitState>,
    budget: Duration,
) -> Option<Result<()>> {
    let end = drop_deadline(deadline_in(budget));
    let (g, s) = (Arc::clone(grantor), Arc::clone(state));
    let spawned = run_aside("redsem-release", end, move || {
        let outcome = {
            let _budget = DropBudget::start(left_until(end));
            g.release(&s)
        };
        drop((g, s));
        outcome
    });
    // no thread to be had: the release runs here, within the library's deadlines
    spawned.unwrap_or_else(|_| Some(grantor.release(state)))
}

/// What a dropped [`Permit`] holds in place of its grantor, so that the grantor (and
/// perhaps the last handle of its client) goes inside the drop's budget.
struct Released;

impl Grantor for Released {
    fn name(&self) -> &str {
        ""
    }

    fn release(&self, _permit: &PermitState) -> Result<()> {
        Ok(())
    }

    fn refresh(&self, _permit: &PermitState) -> Result<()> {
        Ok(())
    }

    fn op_timeout(&self) -> Duration {
        Duration::ZERO
    }
}

static RELEASED: LazyLock<Arc<dyn Grantor>> = LazyLock::new(|| Arc::new(Released));

impl Drop for Permit {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.released = true;
        // one budget for the release and, when this permit held the last handle of its
        // client, the client's joins of its threads (invariant 13)
        let op = self.grantor.op_timeout();
        let _budget = DropBudget::start(op);
        let outcome = if self.grantor.release_aside() {
            release_aside(&self.grantor, &self.state, op)
        } else {
            Some(self.grantor.release(&self.state))
        };
        let Some(outcome) = outcome else {
            log::warn!(
                "redis-semaphore: releasing permit {} of {:?} on drop did not end within the \
                 operation timeout ({op:?}); it goes on in the background",
                self.state.id,
                self.grantor.name()
            );
            self.grantor = Arc::clone(&RELEASED);
            return;
        };
        match outcome {
            Ok(()) => {}
            // a lease that ended while held: the holder's work may have overlapped
            // another's, which Drop says at `warn` as the design asks (as release()
            // says it with its error), also when the loss was already noticed
            Err(
                e @ (Error::LeaseExpired { .. }
                | Error::PermitLost {
                    reason: LostReason::Expired | LostReason::MaxHold,
                    ..
                }),
            ) => log::warn!("redis-semaphore: dropped a permit whose lease had ended: {e}"),
            Err(e @ Error::PermitLost { .. }) if self.is_lost() => {
                log::debug!("redis-semaphore: dropped a permit already known lost: {e}")
            }
            Err(e) => log::warn!("redis-semaphore: releasing permit on drop: {e}"),
        }
        self.grantor = Arc::clone(&RELEASED);
    }
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("semaphore", &self.grantor.name())
            .field("id", &self.id())
            .field("token", &self.token)
            .field("slots", &self.slots)
            .field("permits", &self.permits)
            .field("lost", &self.lost_reason())
            .finish()
    }
}

/// A held grant on its way to another process: what [`Permit::into_parts`] returns and
/// [`Semaphore::adopt`](crate::Semaphore::adopt) takes. It prints as one line,
/// `redsem-permit:1:ID:TOKEN:PERMITS:SLOTS:NAME` (slots comma-separated; the name last,
/// as it is), and parses back from it. One line break after the text is dropped when
/// it is read, so a name ending in a line break would not survive the text form: such
/// names are refused when a semaphore is built
/// ([`SemaphoreBuilder::build`](crate::SemaphoreBuilder::build)); a line break inside
/// a name round-trips.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermitParts {
    semaphore: String,
    id: String,
    token: u64,
    slots: Vec<u32>,
    permits: u32,
}

/// The first two fields of [`PermitParts`]' text form.
const PARTS_PREFIX: &str = "redsem-permit:1:";

impl PermitParts {
    /// The semaphore's name.
    pub fn semaphore_name(&self) -> &str {
        &self.semaphore
    }

    /// The permit id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The fencing token of the grant.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The slots the grant occupies.
    pub fn slots(&self) -> &[u32] {
        &self.slots
    }

    /// How many permits the grant holds.
    pub fn permits(&self) -> u32 {
        self.permits
    }
}

impl std::fmt::Display for PermitParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let slots: Vec<String> = self.slots.iter().map(u32::to_string).collect();
        write!(
            f,
            "{PARTS_PREFIX}{}:{}:{}:{}:{}",
            self.id,
            self.token,
            self.permits,
            slots.join(","),
            self.semaphore
        )
    }
}

impl std::str::FromStr for PermitParts {
    type Err = Error;

    /// Parses the text [`Display`](std::fmt::Display) makes. Whitespace before it is
    /// ignored, and one line break after it (`\n` or `\r\n`, as a line read from a pipe
    /// ends); anything else after the name is part of the name, which may end in a
    /// space.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] saying which part is wrong.
    fn from_str(s: &str) -> Result<PermitParts> {
        let bad = |what: &str| {
            Error::InvalidArgument(format!(
                "not a permit handed over by Permit::into_parts ({what}): expected \
                 {PARTS_PREFIX}ID:TOKEN:PERMITS:SLOTS:NAME"
            ))
        };
        // not trim(): the name, last, may end in whitespace (a name "jobs " is another
        // semaphore than "jobs")
        let line = s.trim_start();
        let line = line
            .strip_suffix("\r\n")
            .or_else(|| line.strip_suffix('\n'))
            .unwrap_or(line);
        let rest = line
            .strip_prefix(PARTS_PREFIX)
            .ok_or_else(|| bad("prefix"))?;
        let mut fields = rest.splitn(5, ':');
        let mut next = |what: &str| fields.next().ok_or_else(|| bad(what));
        let id = next("id")?.to_owned();
        if !is_permit_id(&id) {
            return Err(bad("id"));
        }
        let token = next("token")?.parse().map_err(|_| bad("token"))?;
        let permits: u32 = next("permits")?.parse().map_err(|_| bad("permits"))?;
        let slots = next("slots")?
            .split(',')
            .map(|x| x.parse::<u32>())
            .collect::<std::result::Result<Vec<u32>, _>>()
            .map_err(|_| bad("slots"))?;
        let semaphore = next("name")?.to_owned();
        if permits == 0 || slots.len() != permits as usize {
            return Err(bad("slots and permits disagree"));
        }
        if semaphore.is_empty() {
            return Err(bad("name"));
        }
        Ok(PermitParts {
            semaphore,
            id,
            token,
            slots,
            permits,
        })
    }
}

/// Whether `id` has the shape of a permit id of this crate (uuid text, 36 characters
/// of hexadecimal digits and '-'), as the scripts require.
pub(crate) fn is_permit_id(id: &str) -> bool {
    id.len() == 36 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_round_trip_and_bad_text_is_refused() {
        let parts = PermitParts {
            semaphore: "jobs:a:b".into(),
            id: "0f8fad5b-d9cb-469f-a165-70867728950e".into(),
            token: 42,
            slots: vec![0, 3],
            permits: 2,
        };
        let text = parts.to_string();
        assert_eq!(text.parse::<PermitParts>().unwrap(), parts);
        for bad in [
            "",
            "redsem-permit:1:",
            "redsem-permit:1:nope:1:1:0:jobs",
            "redsem-permit:1:0f8fad5b-d9cb-469f-a165-70867728950e:x:1:0:jobs",
            "redsem-permit:1:0f8fad5b-d9cb-469f-a165-70867728950e:1:2:0:jobs",
            "redsem-permit:1:0f8fad5b-d9cb-469f-a165-70867728950e:1:1:0:",
        ] {
            assert!(
                matches!(bad.parse::<PermitParts>(), Err(Error::InvalidArgument(_))),
                "{bad:?}"
            );
        }
    }
}
