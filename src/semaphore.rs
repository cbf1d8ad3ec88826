use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::Value;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::permit::Permit;
use crate::refresher::{GroupKey, PermitState};
use crate::scripts::{self, Keys};

/// Longest pause between two tries of a blocking acquire.
const MAX_BACKOFF: Duration = Duration::from_millis(50);
/// How long a limit stored by [`Semaphore::set_limit`] outlives the last use.
const LIMIT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// A distributed counting semaphore: at most `limit` permits are held at once, by all
/// clients, threads and processes that use the same name on the same Redis.
///
/// Made by [`Client::semaphore`] or [`Client::semaphore_builder`]. Cheap to clone and
/// `Send + Sync`: one handle can be shared by many threads, and every acquire makes a
/// permit of its own.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use redis_semaphore::Client;
///
/// let client = Client::open("redis://127.0.0.1:6379/")?;
/// let sem = client.semaphore("market:acct:42", 5)?;
///
/// if let Some(permit) = sem.try_acquire()? {
///     println!("slot {:?}, token {}", permit.slots(), permit.token());
/// }
/// let permit = sem.acquire_timeout(Duration::from_millis(500))?;
/// # Ok::<(), redis_semaphore::Error>(())
/// ```
#[derive(Clone)]
pub struct Semaphore {
    pub(crate) inner: Arc<SemInner>,
}

pub(crate) struct SemInner {
    pub(crate) client: Client,
    pub(crate) name: String,
    pub(crate) keys: Arc<Keys>,
    pub(crate) limit: u32,
    pub(crate) lease: Duration,
    pub(crate) refresh_every: Duration,
    pub(crate) fair: bool,
    pub(crate) auto_refresh: bool,
    pub(crate) group: GroupKey,
}

impl SemInner {
    pub(crate) fn error(&self, e: redis::RedisError) -> Error {
        Error::redis(&self.name, e)
    }
}

/// One holder of a semaphore, as [`Semaphore::holders`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The permit id.
    pub id: String,
    /// Permits it holds.
    pub permits: u32,
    /// Its fencing token.
    pub token: u64,
    /// The slots it occupies.
    pub slots: Vec<u32>,
    /// Host name of the process that took it.
    pub host: String,
    /// Process id of the process that took it.
    pub pid: u32,
    /// When it was granted, by the Redis server's clock.
    pub acquired_at: SystemTime,
    /// How much of its lease is left, by the Redis server's clock.
    pub lease_left: Duration,
}

/// Settings of a [`Semaphore`], from [`Client::semaphore_builder`].
///
/// ```no_run
/// use std::time::Duration;
/// # let client = redis_semaphore::Client::open("redis://127.0.0.1/")?;
/// let sem = client
///     .semaphore_builder("jobs")
///     .limit(5)
///     .lease(Duration::from_secs(30))
///     .build()?;
/// # Ok::<(), redis_semaphore::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct SemaphoreBuilder {
    client: Client,
    name: String,
    limit: Option<u32>,
    lease: Duration,
    refresh_every: Option<Duration>,
    fair: bool,
    auto_refresh: bool,
}

impl SemaphoreBuilder {
    pub(crate) fn new(client: Client, name: &str) -> SemaphoreBuilder {
        SemaphoreBuilder {
            client,
            name: name.to_owned(),
            limit: None,
            lease: Duration::from_secs(10),
            refresh_every: None,
            fair: true,
            auto_refresh: true,
        }
    }

    /// How many permits may be held at once. Required.
    ///
    /// A limit stored with [`Semaphore::set_limit`] takes precedence for every client.
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = Some(limit);
        self
    }

    /// How long a permit stays valid without renewal; a holder that crashes gives its
    /// permits back at most this long after its last renewal. At least 1 ms, whole
    /// milliseconds. Defaults to 10 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Whether blocked waiters are served in arrival order. Defaults to `true`.
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// Whether the client's background thread renews the leases of held permits.
    /// With `false`, a lease ends `lease` after the grant unless
    /// [`Permit::refresh`] is called. Defaults to `true`.
    pub fn auto_refresh(mut self, on: bool) -> Self {
        self.auto_refresh = on;
        self
    }

    /// How often the background thread renews leases. Must be shorter than the lease.
    /// Defaults to a third of the lease.
    pub fn refresh_interval(mut self, every: Duration) -> Self {
        self.refresh_every = Some(every);
        self
    }

    /// Checks the settings and makes the semaphore. No network call is made.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name, a name containing `{` or `}`
    /// (the library puts the name in a hash tag), a missing or zero limit, a lease
    /// under 1 ms, or a refresh interval that is zero or not shorter than the lease.
    pub fn build(self) -> Result<Semaphore> {
        let invalid = |s: &str| Err(Error::InvalidArgument(s.to_owned()));
        if self.name.is_empty() {
            return invalid("semaphore name must not be empty");
        }
        if self.name.contains(['{', '}']) {
            return invalid("semaphore name must not contain '{' or '}'");
        }
        let limit = match self.limit {
            None => return invalid("a limit is required"),
            Some(0) => return invalid("limit must be at least 1"),
            Some(n) => n,
        };
        if self.lease < Duration::from_millis(1) {
            return invalid("lease must be at least 1 ms");
        }
        if self.lease > Duration::from_secs(365 * 24 * 3600) {
            return invalid("lease must be at most a year");
        }
        let refresh_every = self.refresh_every.unwrap_or(self.lease / 3);
        if refresh_every.is_zero() || refresh_every >= self.lease {
            return invalid("refresh interval must be above zero and shorter than the lease");
        }
        let keys = Arc::new(Keys::new(&self.name));
        let group = GroupKey {
            name: Arc::from(self.name.as_str()),
            lease_ms: self.lease.as_millis() as u64,
            auto: self.auto_refresh,
        };
        Ok(Semaphore {
            inner: Arc::new(SemInner {
                client: self.client,
                name: self.name,
                keys,
                limit,
                lease: Duration::from_millis(group.lease_ms),
                refresh_every: refresh_every.max(Duration::from_millis(1)),
                fair: self.fair,
                auto_refresh: self.auto_refresh,
                group,
            }),
        })
    }
}

/// What one acquire attempt gave.
enum Attempt {
    Granted(Permit),
    Busy(Option<Duration>),
}

impl Semaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The lease of permits granted through this handle.
    pub fn lease(&self) -> Duration {
        self.inner.lease
    }

    /// Whether waiters are served in arrival order.
    pub fn is_fair(&self) -> bool {
        self.inner.fair
    }

    /// Takes one permit if one is free now, in one round trip; never waits.
    ///
    /// # Errors
    ///
    /// Redis and pool errors; [`Error::PermitsExceedLimit`] if a stored limit is 0
    /// permits... never for one permit, since limits are at least 1.
    pub fn try_acquire(&self) -> Result<Option<Permit>> {
        self.try_acquire_many(1)
    }

    /// Takes `n` permits at once if they are free now, in one round trip; never waits.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for `n == 0`; [`Error::PermitsExceedLimit`] when `n`
    /// is above the limit; Redis and pool errors.
    pub fn try_acquire_many(&self, n: u32) -> Result<Option<Permit>> {
        self.check_permits(n)?;
        match self.attempt(&new_id(), n)? {
            Attempt::Granted(p) => Ok(Some(p)),
            Attempt::Busy(_) => Ok(None),
        }
    }

    /// Takes one permit, waiting as long as it takes.
    ///
    /// # Blocking
    ///
    /// Waits until a permit is released or a holder's lease ends; returns early only
    /// on an error.
    ///
    /// # Errors
    ///
    /// Redis and pool errors.
    pub fn acquire(&self) -> Result<Permit> {
        self.acquire_many(1)
    }

    /// Takes `n` permits at once, waiting as long as it takes.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for `n == 0`; [`Error::PermitsExceedLimit`] at once
    /// when `n` is above the limit (it could never be granted); Redis and pool errors.
    pub fn acquire_many(&self, n: u32) -> Result<Permit> {
        match self.wait_for(n, None)? {
            Some(p) => Ok(p),
            None => unreachable!("a wait without deadline returns only with a permit or an error"),
        }
    }

    /// Takes one permit, waiting at most `timeout`; `Ok(None)` when the time is up.
    ///
    /// # Errors
    ///
    /// Redis and pool errors.
    pub fn acquire_timeout(&self, timeout: Duration) -> Result<Option<Permit>> {
        self.acquire_many_timeout(1, timeout)
    }

    /// Takes `n` permits at once, waiting at most `timeout`; `Ok(None)` when the time
    /// is up.
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Semaphore::acquire_many).
    pub fn acquire_many_timeout(&self, n: u32, timeout: Duration) -> Result<Option<Permit>> {
        let deadline = Instant::now().checked_add(timeout);
        self.wait_for(n, Some(deadline.unwrap_or_else(far_future)))
    }

    /// Permits free now: the limit minus the permits of unexpired holders (0 when a
    /// lowered limit is still exceeded).
    pub fn available(&self) -> Result<u32> {
        let (limit, used) = self.counts()?;
        Ok(limit.saturating_sub(used))
    }

    /// The limit in force: the one stored by [`set_limit`](Semaphore::set_limit), else
    /// this handle's.
    pub fn limit(&self) -> Result<u32> {
        Ok(self.counts()?.0)
    }

    /// Stores `limit` in Redis, where it takes precedence over the limit every client
    /// passes. Lowering it takes no permit away; new grants wait until the holders fit.
    /// The stored limit is kept for at least a day after this call, and as long as the
    /// semaphore is in use.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for 0; Redis and pool errors.
    pub fn set_limit(&self, limit: u32) -> Result<()> {
        if limit == 0 {
            return Err(Error::InvalidArgument("limit must be at least 1".into()));
        }
        let mut conn = self.conn()?;
        let _previous: i64 = self
            .inner
            .keys
            .invoke(&scripts::SET_LIMIT)
            .arg(limit)
            .arg(LIMIT_RETENTION.as_millis() as u64)
            .invoke(&mut *conn)
            .map_err(|e| self.inner.error(e))?;
        Ok(())
    }

    /// Every unexpired holder, ordered by lease deadline (soonest first).
    pub fn holders(&self) -> Result<Vec<Holder>> {
        let reply = self.inspect("holders")?;
        let (_, _, rest) = split_counts(&reply)?;
        let now = rest
            .first()
            .map(int)
            .transpose()?
            .ok_or_else(|| bad("holders: no time"))?;
        let rest = &rest[1..];
        if rest.len() % 3 != 0 {
            return Err(bad("holders: ragged list"));
        }
        rest.chunks(3)
            .map(|c| {
                let id = text(&c[0])?;
                let record = text(&c[1])?;
                let deadline = int(&c[2])?;
                parse_holder(id, &record, deadline, now)
            })
            .collect()
    }

    /// Releases permit `id` whoever holds it (an operator's tool: the holder learns of
    /// it at its next refresh). Returns whether it was held.
    pub fn force_release(&self, id: &str) -> Result<bool> {
        if id.is_empty() {
            return Err(Error::InvalidArgument("permit id must not be empty".into()));
        }
        let mut conn = self.conn()?;
        let status: i64 = self
            .inner
            .keys
            .invoke(&scripts::RELEASE)
            .arg(id)
            .invoke(&mut *conn)
            .map_err(|e| self.inner.error(e))?;
        Ok(status != 0)
    }

    fn check_permits(&self, n: u32) -> Result<()> {
        if n == 0 {
            return Err(Error::InvalidArgument("permits must be at least 1".into()));
        }
        if n > self.inner.limit {
            return Err(self.too_many(n, self.inner.limit));
        }
        Ok(())
    }

    fn too_many(&self, requested: u32, limit: u32) -> Error {
        Error::PermitsExceedLimit {
            name: self.inner.name.clone(),
            requested,
            limit,
        }
    }

    fn conn(&self) -> Result<crate::pool::Conn> {
        self.inner.client.inner.shared.pool.get(None)
    }

    /// Blocking acquire: tries, then waits with a short capped back-off (never past a
    /// lease that the server says ends sooner) until granted or `deadline`.
    fn wait_for(&self, n: u32, deadline: Option<Instant>) -> Result<Option<Permit>> {
        self.check_permits(n)?;
        let id = new_id();
        let mut backoff = Duration::from_millis(1);
        loop {
            let retry_after = match self.attempt(&id, n)? {
                Attempt::Granted(p) => return Ok(Some(p)),
                Attempt::Busy(r) => r,
            };
            let mut pause = backoff;
            if let Some(r) = retry_after {
                pause = pause.min(r.max(Duration::from_millis(1)));
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
            if let Some(d) = deadline {
                let now = Instant::now();
                if now >= d {
                    return Ok(None);
                }
                pause = pause.min(d - now);
            }
            std::thread::sleep(pause);
        }
    }

    /// One run of the acquire script for permit id `id`.
    fn attempt(&self, id: &str, n: u32) -> Result<Attempt> {
        let sem = &self.inner;
        let shared = &sem.client.inner.shared;
        let lease_ms = sem.group.lease_ms;
        let mut conn = self.conn()?;
        let sent = Instant::now();
        let reply: redis::RedisResult<Vec<i64>> = sem
            .keys
            .invoke(&scripts::ACQUIRE)
            .arg(id)
            .arg(n)
            .arg(sem.limit)
            .arg(lease_ms)
            .arg(scripts::pad_ms(lease_ms))
            .arg(format!("{}|", shared.origin))
            .invoke(&mut *conn);
        drop(conn);
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                if e.is_timeout() || e.is_connection_dropped() {
                    // The script may have run: give back whatever it granted.
                    self.release_quietly(id);
                }
                return Err(sem.error(e));
            }
        };
        match reply.as_slice() {
            [1, token, slots @ ..] if slots.len() == n as usize => {
                let slots = slots
                    .iter()
                    .map(|&s| u32::try_from(s).map_err(|_| bad("acquire: slot out of range")))
                    .collect::<Result<Vec<u32>>>()?;
                let token = u64::try_from(*token).map_err(|_| bad("acquire: negative token"))?;
                Ok(Attempt::Granted(self.permit(
                    id.to_owned(),
                    token,
                    slots,
                    n,
                    sent,
                )))
            }
            [0, retry] => Ok(Attempt::Busy(
                u64::try_from(*retry).ok().map(Duration::from_millis),
            )),
            [-1, limit] => Err(self.too_many(n, u32::try_from(*limit).unwrap_or(u32::MAX))),
            other => Err(Error::reply("acquire", format!("{other:?}"))),
        }
    }

    fn permit(&self, id: String, token: u64, slots: Vec<u32>, n: u32, sent: Instant) -> Permit {
        let sem = &self.inner;
        let client = &sem.client.inner;
        let (state, lost_rx) = PermitState::new(id, sent + sem.lease);
        let nudge = client.shared.registry.lock().register(
            sem.group.clone(),
            &sem.keys,
            sem.lease,
            sem.refresh_every,
            Arc::clone(&state),
        );
        if nudge {
            client.nudge();
        }
        log::debug!(
            "redis-semaphore: {} granted {n} permit(s) to {}",
            sem.name,
            state.id
        );
        Permit {
            sem: Arc::clone(&self.inner),
            state,
            lost_rx,
            token,
            slots,
            permits: n,
            released: false,
        }
    }

    /// Best-effort release of an id whose acquire ended in doubt.
    fn release_quietly(&self, id: &str) {
        let shared = &self.inner.client.inner.shared;
        let result = shared
            .pool
            .get(Some(shared.op_timeout))
            .and_then(|mut conn| {
                self.inner
                    .keys
                    .invoke(&scripts::RELEASE)
                    .arg(id)
                    .invoke::<i64>(&mut *conn)
                    .map_err(Error::Redis)
            });
        if let Err(e) = result {
            log::warn!(
                "redis-semaphore: could not give back permit {id} after a failed acquire: {e}"
            );
        }
    }

    fn inspect(&self, what: &str) -> Result<Vec<Value>> {
        let mut conn = self.conn()?;
        self.inner
            .keys
            .invoke(&scripts::INSPECT)
            .arg(self.inner.limit)
            .arg(what)
            .invoke(&mut *conn)
            .map_err(|e| self.inner.error(e))
    }

    fn counts(&self) -> Result<(u32, u32)> {
        let reply = self.inspect("count")?;
        let (limit, used, _) = split_counts(&reply)?;
        Ok((limit, used))
    }
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.inner.name)
            .field("limit", &self.inner.limit)
            .field("lease", &self.inner.lease)
            .field("fair", &self.inner.fair)
            .field("auto_refresh", &self.inner.auto_refresh)
            .finish()
    }
}

fn new_id() -> String {
    uuid::Uuid::new_v4().hyphenated().to_string()
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)
}

fn bad(detail: &str) -> Error {
    Error::reply("inspect", detail)
}

fn int(v: &Value) -> Result<i64> {
    match v {
        Value::Int(i) => Ok(*i),
        other => Err(bad(&format!("expected an integer, got {other:?}"))),
    }
}

fn text(v: &Value) -> Result<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).map_err(|_| bad("text is not UTF-8")),
        Value::SimpleString(s) => Ok(s.clone()),
        other => Err(bad(&format!("expected text, got {other:?}"))),
    }
}

fn split_counts(reply: &[Value]) -> Result<(u32, u32, &[Value])> {
    match reply {
        [limit, used, rest @ ..] => {
            let limit = u32::try_from(int(limit)?).map_err(|_| bad("limit out of range"))?;
            let used = u32::try_from(int(used)?).map_err(|_| bad("used out of range"))?;
            Ok((limit, used, rest))
        }
        _ => Err(bad("short reply")),
    }
}

/// Parses a holder record "permits|token|slots|acquired_ms|pid|host|label".
fn parse_holder(id: String, record: &str, deadline: i64, now: i64) -> Result<Holder> {
    let f: Vec<&str> = record.splitn(7, '|').collect();
    if f.len() < 6 {
        return Err(bad("holder record has too few fields"));
    }
    let num = |s: &str| {
        s.parse::<u64>()
            .map_err(|_| bad("holder record has a bad number"))
    };
    let slots = if f[2].is_empty() {
        Vec::new()
    } else {
        f[2].split(',')
            .map(|s| num(s).map(|v| v as u32))
            .collect::<Result<_>>()?
    };
    Ok(Holder {
        id,
        permits: num(f[0])? as u32,
        token: num(f[1])?,
        slots,
        acquired_at: UNIX_EPOCH + Duration::from_millis(num(f[3])?),
        pid: num(f[4])? as u32,
        host: f[5].to_owned(),
        lease_left: Duration::from_millis(deadline.saturating_sub(now).max(0) as u64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_records_parse() {
        let h = parse_holder(
            "id".into(),
            "2|1763800000000001|0,3|1763800000000|42|box|",
            1500,
            1000,
        )
        .unwrap();
        assert_eq!(h.permits, 2);
        assert_eq!(h.slots, vec![0, 3]);
        assert_eq!(h.pid, 42);
        assert_eq!(h.host, "box");
        assert_eq!(h.lease_left, Duration::from_millis(500));
        assert!(parse_holder("id".into(), "garbage", 0, 0).is_err());
    }
}
