//! Where Redis is: the URL forms of the crate (one server, a Sentinel service, Cluster
//! seed nodes; plaintext or TLS), the TLS settings that a URL cannot carry, the
//! process-wide rustls crypto provider, the sorting of connect errors into
//! [`Error::Auth`] and [`Error::Connect`], and [`redact`], which every message that
//! shows a URL goes through.
//!
//! `redis://`, `rediss://`, `unix://` (and redis-rs's other single-server forms) are
//! parsed by redis-rs itself; what it would take and then ignore or get wrong is
//! refused here: `#insecure` on a TLS URL (this crate has no insecure mode), the `db`,
//! `user` and `pass` query parameters of a TCP URL (read only in `unix://` URLs) and
//! a negative database. `redis+sentinel://`, `rediss+sentinel://`,
//! `redis+cluster://` and `rediss+cluster://` are parsed here:
//!
//! ```text
//! redis+sentinel://[user:password@]h1[:26379][,h2[:26379]...]/SERVICE[/DB]
//! redis+cluster://[user:password@]h1[:6379][,h2[:6379]...][/]
//! ```
//!
//! The user name and password are percent-decoded; hosts may be `[IPv6]`. A host
//! listed twice, a wildcard address (`0.0.0.0`, `[::]`) and a bracketed host that is
//! no IPv6 address are refused, naming the host.

#[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
use std::path::Path;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use redis::IntoConnectionInfo;
use redis::io::tcp::TcpSettings;

use crate::clock::{IoTimeouts, TIMEOUT_SLACK, deadline_in, left_until, socket_timeout};
use crate::error::{DB_REFUSED, Error, Result, TLS_HANDSHAKE_FAILED};
use crate::node::setup_replies;
use crate::threads::run_aside;

/// Default port of a sentinel in `redis+sentinel://` URLs.
pub(crate) const SENTINEL_PORT: u16 = 26379;
/// Default port of a cluster node in `redis+cluster://` URLs.
pub(crate) const CLUSTER_PORT: u16 = 6379;

/// Where Redis is, as parsed from a URL.
#[derive(Clone)]
pub(crate) enum Target {
    /// One server (`redis://`, `rediss://`, `unix://`), parsed by redis-rs.
    Single(redis::ConnectionInfo),
    /// A primary found through sentinels (`redis+sentinel://`, `rediss+sentinel://`).
    Sentinel {
        /// The sentinels' addresses.
        sentinels: Vec<(String, u16)>,
        /// The service (master) name the sentinels monitor.
        service: String,
        /// The database on the data nodes.
        db: i64,
        /// Credentials for the data nodes (the primary and replicas).
        auth: Credentials,
        /// Whether the data nodes (and sentinels) speak TLS.
        tls: bool,
    },
    /// Redis Cluster seed nodes (`redis+cluster://`, `rediss+cluster://`).
    Cluster {
        /// The seed nodes' addresses.
        nodes: Vec<(String, u16)>,
        /// Credentials for every node.
        auth: Credentials,
        /// Whether the nodes speak TLS.
        tls: bool,
    },
}

/// A user name and password taken from a URL (or set on the builder).
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct Credentials {
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
}

/// `settings` with `username` and `password` set where given (kept where not), and
/// without redis-rs's `CLIENT SETINFO` on connect (see [`connect_within`]). Every
/// connection's settings pass through here.
pub(crate) fn with_credentials(
    mut settings: redis::RedisConnectionInfo,
    username: Option<&str>,
    password: Option<&str>,
) -> redis::RedisConnectionInfo {
    if let Some(u) = username {
        settings = settings.set_username(u);
    }
    if let Some(p) = password {
        settings = settings.set_password(p);
    }
    settings.set_skip_set_lib_name()
}

/// A connection by `client`, its set-up ending within about `timeout` in all.
///
/// redis-rs bounds the TCP connect by the timeout and then each reply of its set-up by
/// what is left of it, so a set-up of n replies into a partition that swallows bytes
/// takes up to n times the timeout. Our settings leave out the two replies of `CLIENT
/// SETINFO` ([`with_credentials`]); the timeout is divided among the replies that are
/// left (`AUTH` or `HELLO`, `SELECT`), so that n of them end within it. The timeout
/// and each share are at least [`MIN_TIMEOUT`]: redis-rs refuses a zero socket timeout
/// ("cannot set a 0 duration timeout", which names no setting).
///
/// Where the TLS handshake has no timeout ([`HANDSHAKE_UNBOUNDED`]), a TLS connect runs
/// on a thread of its own and is waited for until `timeout` has passed
/// ([`bounded_handshake`]): every connect of the library (the pool's, a release's
/// fresh connection, a subscription's, the sentinels') ends by its bound with either
/// TLS library. A connect there without a set-up reply (no password, database 0) sends
/// a `PING` on that thread right after the handshake: a server that refuses the client
/// certificate (TLS 1.3 tells the client after its side of the handshake is done) sends
/// its alert and resets the connection, and a first command sent only once the caller
/// had woken up met the reset instead of the alert (on loopback, about a third of the
/// connects), an "unreachable" error for a configuration one.
pub(crate) fn connect_within(
    client: &redis::Client,
    timeout: Duration,
) -> redis::RedisResult<redis::Connection> {
    let timeout = timeout.max(MIN_TIMEOUT);
    let info = client.get_connection_info();
    let replies = setup_replies(info.redis_settings());
    let share = (timeout / replies.max(1)).max(MIN_TIMEOUT);
    let until = deadline_in(timeout);
    let tls = is_tls_addr(info.addr());
    let ping_first = tls && HANDSHAKE_UNBOUNDED && replies == 0;
    let client = client.clone();
    let addr = info.addr().to_string();
    bounded_handshake(tls, &addr, until, move || {
        // (its set-up replies are read with redis-rs's own socket timeouts, this long)
        let mut conn = match client.get_connection_with_timeout(socket_timeout(share)) {
            Err(e) if e.kind() == redis::ErrorKind::AuthenticationFailed => {
                return Err(refusal_in_the_servers_words(&client, e, until));
            }
            connected => connected?,
        };
        if ping_first {
            conn.io_within(Some(left_until(until)))?;
            redis::cmd("PING").exec(&mut conn)?;
        }
        Ok(conn)
    })
}

/// `refused`, redis-rs's error for credentials the server refused while `client`
/// connected, with what the server said: redis-rs keeps only "Password authentication
/// failed", and the server's reason matters to the user: a password sent to a server
/// that has none ("AUTH &lt;password&gt; called without any password configured for the
/// default user": leave it out) is not a wrong password (`WRONGPASS`). The reason is
/// read by sending the same `AUTH` on a connection without credentials, opened and
/// answered by `until`; a failed credential check only, never the path of a good one.
/// When that fails too, `refused` as it is.
fn refusal_in_the_servers_words(
    client: &redis::Client,
    refused: redis::RedisError,
    until: Instant,
) -> redis::RedisError {
    let info = client.get_connection_info();
    let settings = info.redis_settings();
    let Some(password) = settings.password() else {
        return refused;
    };
    let bare = info.clone().set_redis_settings(
        redis::RedisConnectionInfo::default()
            .set_protocol(settings.protocol())
            .set_skip_set_lib_name(),
    );
    let said = (|| {
        let mut conn = redis::Client::open(bare)
            .ok()?
            .get_connection_with_timeout(socket_timeout(left_until(until).max(MIN_TIMEOUT)))
            .ok()?;
        conn.io_within(Some(left_until(until).max(MIN_TIMEOUT)))
            .ok()?;
        let mut auth = redis::cmd("AUTH");
        if let Some(user) = settings.username() {
            auth.arg(user);
        }
        let e = auth.arg(password).exec(&mut conn).err()?;
        let code = e.code()?;
        Some(format!("{code} {}", e.detail()?))
    })();
    match said {
        Some(said) => redis::RedisError::from((
            redis::ErrorKind::AuthenticationFailed,
            "Password authentication failed",
            said,
        )),
        None => refused,
    }
}

/// The least timeout of a connect or of a call: a socket timeout cannot be zero.
/// `ClientBuilder::build` refuses shorter timeouts, and a connect's share of what is
/// left of a deadline is never less.
pub(crate) const MIN_TIMEOUT: Duration = Duration::from_millis(1);

/// Whether redis-rs runs a TLS handshake with no timeout: with `tls-native-tls` (and
/// not `tls-rustls`, which redis-rs prefers when both are on) it hands a socket without
/// a read timeout to the platform's TLS library, which waits for the server's hello
/// for as long as the server stays silent (measured: a server behind a proxy that
/// forwards nothing held a connect for as long as the proxy stalled). rustls
/// handshakes on the connection's first read and write, under redis-rs's set-up
/// timeouts.
pub(crate) const HANDSHAKE_UNBOUNDED: bool =
    cfg!(all(feature = "tls-native-tls", not(feature = "tls-rustls")));

/// Runs `connect`, a TLS connect to `addr` when `tls`, so that it ends by `until`:
/// where the handshake has no timeout ([`HANDSHAKE_UNBOUNDED`]), on a thread of its
/// own, waited for until [`TIMEOUT_SLACK`] before `until` (a connect that outlasts the
/// wait goes on there, and closes its connection when it ends or fails), the end of
/// the wait a timeout error that reads as a handshake that did not finish; else in the
/// calling thread, whose socket timeouts bound it.
///
/// A handshake left running so keeps its thread and socket until the server answers
/// or closes, which a plaintext port never does. So while [`MAX_STALLED`] of them to
/// `addr` run, another connect there fails at once with the same timeout error, and
/// the threads and sockets left behind stay that few per address whatever retries
/// (the pool's own, every caller's) follow.
pub(crate) fn bounded_handshake<T: Send + 'static>(
    tls: bool,
    addr: &str,
    until: Instant,
    connect: impl FnOnce() -> redis::RedisResult<T> + Send + 'static,
) -> redis::RedisResult<T> {
    if !(tls && HANDSHAKE_UNBOUNDED) {
        return connect();
    }
    let started = Instant::now();
    let stalled = |what: String| {
        Err(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            what,
        )))
    };
    if Stalled::count(addr) >= MAX_STALLED {
        return stalled(format!(
            "the TLS handshake did not finish: an earlier one with {addr} has not \
             finished either"
        ));
    }
    // the caller's own work after the wait (and a thread woken late on a loaded
    // machine) gets the slack that socket timeouts leave (`clock::socket_timeout`)
    let wait_until = until
        .checked_sub(TIMEOUT_SLACK)
        .map_or(until, |t| t.max(started + MIN_TIMEOUT).min(until));
    let attempt = std::sync::Arc::new(parking_lot::Mutex::new(Attempt::Running));
    let on_thread = std::sync::Arc::clone(&attempt);
    let addr_owned = addr.to_owned();
    let run = move || {
        let result = connect();
        let mut state = on_thread.lock();
        if *state == Attempt::Abandoned {
            Stalled::ended(&addr_owned);
        }
        *state = Attempt::Done;
        result
    };
    match run_aside("redsem-connect", wait_until, run) {
        Ok(Some(done)) => done,
        Ok(None) => {
            let mut state = attempt.lock();
            if *state == Attempt::Running {
                *state = Attempt::Abandoned;
                Stalled::began(addr);
            }
            stalled(format!(
                "the TLS handshake did not finish within {:?}",
                until.saturating_duration_since(started)
            ))
        }
        Err(e) => Err(e.into()),
    }
}

/// How many handshakes left running ([`bounded_handshake`]) one address may have
/// before its connects fail at once.
const MAX_STALLED: usize = 1;

/// Where a connect [`bounded_handshake`] runs aside stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    Running,
    /// Its caller stopped waiting: counted in [`Stalled`] until it ends.
    Abandoned,
    Done,
}

/// The handshakes left running, per address (a process-wide count: each `Client`'s
/// connects to one address add to the same).
struct Stalled;

static STALLED: parking_lot::Mutex<Vec<(String, usize)>> = parking_lot::Mutex::new(Vec::new());

impl Stalled {
    fn count(addr: &str) -> usize {
        STALLED
            .lock()
            .iter()
            .find(|(a, _)| a == addr)
            .map_or(0, |(_, n)| *n)
    }

    fn began(addr: &str) {
        let mut all = STALLED.lock();
        match all.iter_mut().find(|(a, _)| a == addr) {
            Some((_, n)) => *n += 1,
            None => all.push((addr.to_owned(), 1)),
        }
    }

    fn ended(addr: &str) {
        let mut all = STALLED.lock();
        if let Some(i) = all.iter().position(|(a, _)| a == addr) {
            all[i].1 = all[i].1.saturating_sub(1);
            if all[i].1 == 0 {
                all.swap_remove(i);
            }
        }
    }
}

impl Credentials {
    /// `settings` with these credentials where they are set.
    pub(crate) fn apply(&self, settings: redis::RedisConnectionInfo) -> redis::RedisConnectionInfo {
        with_credentials(settings, self.username.as_deref(), self.password.as_deref())
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field(
                "username",
                &shown_user(self.username.as_deref(), self.password.is_some()),
            )
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

/// A user name as `Debug` output shows it: `***` when no password goes with it (it may
/// be a password typed without its leading `:`, as [`redact`] hides it in a URL).
fn shown_user(username: Option<&str>, has_password: bool) -> Option<&str> {
    username.map(|u| if has_password { u } else { "***" })
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Single(info) => f
                .debug_struct("Single")
                .field("addr", &addr_text(info.addr()))
                .field(
                    "username",
                    &shown_user(
                        info.redis_settings().username(),
                        info.redis_settings().password().is_some(),
                    ),
                )
                .field("password", &info.redis_settings().password().map(|_| "***"))
                .field("db", &info.redis_settings().db())
                .field("tls", &is_tls_addr(info.addr()))
                .finish(),
            Target::Sentinel {
                sentinels,
                service,
                db,
                auth,
                tls,
            } => f
                .debug_struct("Sentinel")
                .field("sentinels", sentinels)
                .field("service", service)
                .field("db", db)
                .field("auth", auth)
                .field("tls", tls)
                .finish(),
            Target::Cluster { nodes, auth, tls } => f
                .debug_struct("Cluster")
                .field("nodes", nodes)
                .field("auth", auth)
                .field("tls", tls)
                .finish(),
        }
    }
}

/// A host and port as messages, logs and `Debug` output show them: `host:port`, an
/// IPv6 literal in brackets as in a URL (`[::1]:6379`, not the ambiguous `::1:6379`).
/// Every place that prints a node's address goes through it (or [`addr_text`]).
#[derive(Clone, Copy)]
pub(crate) struct HostPort<'a>(pub(crate) &'a str, pub(crate) u16);

impl<'a> HostPort<'a> {
    /// The address of a node as the topologies keep it.
    pub(crate) fn of((host, port): &'a (String, u16)) -> HostPort<'a> {
        HostPort(host, *port)
    }
}

impl std::fmt::Display for HostPort<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let HostPort(host, port) = *self;
        if host.contains(':') && !host.starts_with('[') {
            write!(f, "[{host}]:{port}")
        } else {
            write!(f, "{host}:{port}")
        }
    }
}

/// A connection address as messages show it: [`HostPort`] for TCP (redis-rs's own
/// `Display` leaves an IPv6 host bare), the path of a Unix socket.
pub(crate) fn addr_text(addr: &redis::ConnectionAddr) -> String {
    match addr {
        redis::ConnectionAddr::Tcp(host, port)
        | redis::ConnectionAddr::TcpTls { host, port, .. } => HostPort(host, *port).to_string(),
        other => other.to_string(),
    }
}

fn is_tls_addr(addr: &redis::ConnectionAddr) -> bool {
    matches!(addr, redis::ConnectionAddr::TcpTls { .. })
}

/// Whether a TLS feature of this crate is compiled in.
pub(crate) const TLS_ENABLED: bool = cfg!(any(feature = "tls-rustls", feature = "tls-native-tls"));

fn tls_feature_missing(url: &str) -> Error {
    Error::InvalidArgument(format!(
        "{} is a TLS URL, but redis-semaphore was built without TLS: enable its crate \
         feature `tls-rustls` (or `tls-native-tls`)",
        redact(url)
    ))
}

impl Target {
    /// Parses any URL form of the crate. Never panics; a bad URL is
    /// [`Error::InvalidArgument`] naming the (redacted) URL and what is wrong.
    pub(crate) fn parse(url: &str) -> Result<Target> {
        let bad =
            |why: &str| Error::InvalidArgument(format!("bad Redis URL {}: {why}", redact(url)));
        let url = url.trim();
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(bad(EXPECTED_SCHEMES));
        };
        let scheme = scheme.to_ascii_lowercase();
        let (topology, tls) = match scheme.as_str() {
            "redis+sentinel" => ("sentinel", false),
            "rediss+sentinel" => ("sentinel", true),
            "redis+cluster" => ("cluster", false),
            "rediss+cluster" => ("cluster", true),
            "rediss" | "valkeys" => {
                if !TLS_ENABLED {
                    return Err(tls_feature_missing(url));
                }
                return single(url);
            }
            "redis" | "valkey" | "unix" | "redis+unix" | "valkey+unix" => return single(url),
            // (not quoted: the text before `://` of a mistyped URL may be anything)
            _ => return Err(bad(&format!("unknown scheme: {EXPECTED_SCHEMES}"))),
        };
        if tls && !TLS_ENABLED {
            return Err(tls_feature_missing(url));
        }
        // authority, path, and no query or fragment
        let (before_query, query) = match rest.find(['?', '#']) {
            Some(i) => (&rest[..i], Some(&rest[i..])),
            None => (rest, None),
        };
        if query.is_some() {
            return Err(bad("query parameters and fragments are not supported here"));
        }
        let (userinfo, hostpath) = match before_query.rfind('@') {
            Some(i) => (Some(&before_query[..i]), &before_query[i + 1..]),
            None => (None, before_query),
        };
        let (hosts, path) = match hostpath.find('/') {
            Some(i) => (&hostpath[..i], &hostpath[i..]),
            None => (hostpath, ""),
        };
        let auth = match userinfo {
            None => Credentials::default(),
            Some(info) => {
                let (user, pass) = match info.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (info, None),
                };
                let user = percent_decode(user).map_err(|e| bad(&format!("user name: {e}")))?;
                let pass = pass
                    .map(percent_decode)
                    .transpose()
                    .map_err(|e| bad(&format!("password: {e}")))?;
                Credentials {
                    username: (!user.is_empty()).then_some(user),
                    password: pass.filter(|p| !p.is_empty()),
                }
            }
        };
        let default_port = if topology == "sentinel" {
            SENTINEL_PORT
        } else {
            CLUSTER_PORT
        };
        let nodes = parse_hosts(hosts, default_port).map_err(|e| bad(&e))?;
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        if topology == "cluster" {
            match segments.as_slice() {
                [] | ["0"] => {}
                _ => {
                    return Err(bad(
                        "a cluster URL takes no path (Redis Cluster has only database 0)",
                    ));
                }
            }
            return Ok(Target::Cluster { nodes, auth, tls });
        }
        let (service, db) = match segments.as_slice() {
            [] => {
                return Err(bad("a sentinel URL needs the service name as its path: \
                     redis+sentinel://host:26379/SERVICE"));
            }
            [service] => (*service, 0),
            [service, db] => (
                *service,
                db.parse::<i64>()
                    .ok()
                    .filter(|d| *d >= 0)
                    .ok_or_else(|| bad(&format!("database {db:?} is not a number")))?,
            ),
            _ => return Err(bad("expected /SERVICE or /SERVICE/DB as the path")),
        };
        let service = percent_decode(service).map_err(|e| bad(&format!("service: {e}")))?;
        Ok(Target::Sentinel {
            sentinels: nodes,
            service,
            db,
            auth,
            tls,
        })
    }

    /// Whether the target speaks TLS (the tests' view; the connectors have their own).
    #[cfg(test)]
    fn is_tls(&self) -> bool {
        match self {
            Target::Single(info) => is_tls_addr(info.addr()),
            Target::Sentinel { tls, .. } | Target::Cluster { tls, .. } => *tls,
        }
    }
}

/// What a URL whose scheme is none of ours is told.
const EXPECTED_SCHEMES: &str =
    "expected redis://, rediss://, unix://, redis+sentinel:// or redis+cluster://";

/// A one-server URL, parsed by redis-rs.
fn single(url: &str) -> Result<Target> {
    // A `?` or `#` in a password that is not percent-encoded ends the URL's authority
    // there: the URL parser would take what came before it for the host (the user
    // name and the start of the password) and drop the credentials. Refused, as the
    // Sentinel and cluster forms refuse it.
    if let Some((_, rest)) = url.split_once("://") {
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let cut_short = rest[authority_end..].starts_with(['?', '#']);
        if cut_short && rest.rfind('@').is_some_and(|at| at > authority_end) {
            return Err(Error::InvalidArgument(format!(
                "bad Redis URL {}: a '?' or '#' before the '@' (percent-encode it in a \
                 password: %3F, %23)",
                redact(url)
            )));
        }
    }
    let bad = |why: &str| Error::InvalidArgument(format!("bad Redis URL {}: {why}", redact(url)));
    if let Some(why) = ignored_query_parameter(url) {
        return Err(bad(&why));
    }
    let info = url.into_connection_info().map_err(|e| {
        // redis-rs says only "Redis URL did not parse" of most mistakes: say which
        // when we can tell
        bad(&single_url_mistake(url).map_or_else(|| e.to_string(), str::to_owned))
    })?;
    // redis-rs reads `rediss://...#insecure` as "verify no certificate and no host
    // name" (with `tls-native-tls`; with `tls-rustls` every connect then failed with a
    // retryable error): this crate has no insecure mode, so that no URL turns
    // certificate checks off
    if matches!(
        info.addr(),
        redis::ConnectionAddr::TcpTls { insecure: true, .. }
    ) {
        return Err(bad(
            "`#insecure` (no certificate or host name check) is not supported: give the \
             CA that signed the server's certificate with ClientBuilder::tls_ca_file (the \
             CLI's --tls-ca)",
        ));
    }
    // (redis-rs takes `/-1` or `?db=-1`; the server refuses it only at connect)
    let db = info.redis_settings().db();
    if db < 0 {
        return Err(bad(&format!("database {db}: the index must be 0 or more")));
    }
    Ok(Target::Single(info))
}

/// What is wrong with a setting of the one-server URL `url` that redis-rs would take
/// and ignore. In a TCP URL: the `db`, `user` and `pass` query parameters (read only
/// in `unix://` URLs) and their longer spellings. In a `unix://` URL, which redis-rs
/// reads from exactly `db`, `user` and `pass`: any other spelling of them (`database`,
/// `DB`, `password`...), and user info (`unix://user:pw@localhost/path`). Ignored,
/// `?db=3` (or a unix URL's `?database=3`) sent every semaphore to database 0 and
/// `?password=...` connected without one. Quotes no value.
fn ignored_query_parameter(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let unix = scheme.to_ascii_lowercase().ends_with("unix");
    const UNIX_READS: &str = "a unix:// URL reads its settings from the query parameters \
         `db`, `user` and `pass`, so spelt";
    if unix {
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        if rest[..authority_end].contains('@') {
            return Some(format!(
                "the user info (user:password@) of a unix:// URL would be ignored: \
                 {UNIX_READS} (unix:///path/redis.sock?user=U&pass=P), or set \
                 ClientBuilder::username and ClientBuilder::password"
            ));
        }
    }
    // (the fragment first: a `?` inside it starts no query; tabs and line breaks are
    // dropped, as the URL parser drops them)
    let rest = rest.split_once('#').map_or(rest, |(r, _)| r);
    let query: String = rest[rest.find('?')? + 1..]
        .chars()
        .filter(|c| !matches!(c, '\t' | '\n' | '\r'))
        .collect();
    form_urlencoded::parse(query.as_bytes()).find_map(|(key, _)| {
        let lower = key.to_ascii_lowercase();
        let (read, hint) = match lower.as_str() {
            "db" | "database" => ("db", "put the database in the path: redis://host:port/DB"),
            "user" | "username" => ("user", CREDENTIALS_HINT),
            "pass" | "password" => ("pass", CREDENTIALS_HINT),
            _ => return None,
        };
        if !unix {
            return Some(format!(
                "the query parameter `{lower}` would be ignored here (only a unix:// URL \
                 reads `db`, `user` and `pass` from its query): {hint}"
            ));
        }
        // (the key matched one of the words above in any case: letters only, no value)
        (key != read).then(|| {
            format!("the query parameter `{key}` would be ignored: {UNIX_READS} (`{read}` here)")
        })
    })
}

/// How to give credentials that a TCP URL's query cannot carry.
const CREDENTIALS_HINT: &str = "put the credentials before the host \
     (redis://user:password@host:port/) or set ClientBuilder::username and \
     ClientBuilder::password";

/// What is wrong with the TCP one-server URL `url` that redis-rs could not parse, when
/// it can be told: a `/` in the user info (not percent-encoded, it ends the host part
/// early), or a port that is not a number from 1 to 65535. Quotes no part of the URL
/// (the caller shows it redacted): what looks like a port may be part of a password.
fn single_url_mistake(url: &str) -> Option<&'static str> {
    let (scheme, rest) = url.split_once("://")?;
    if scheme.to_ascii_lowercase().ends_with("unix") {
        return None;
    }
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let path_end = rest.find(['?', '#']).unwrap_or(rest.len());
    if rest[authority_end..path_end.max(authority_end)].contains('@') {
        return Some("a '/' before the '@' (percent-encode it in a password: %2F)");
    }
    let authority = &rest[..authority_end];
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host_port.is_empty() || host_port.starts_with(':') {
        return Some("no host given");
    }
    let port = match host_port.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((_, after)) => after.strip_prefix(':')?,
            None => return Some("an IPv6 address without its closing ]"),
        },
        None => host_port.split_once(':')?.1,
    };
    match port.parse::<u16>() {
        Ok(1..) => None,
        _ if port.is_empty() => None,
        _ => Some("the port must be a number from 1 to 65535"),
    }
}

/// `h1:p1,h2,[::1]:p3` into addresses, with `default_port` where none is given.
fn parse_hosts(hosts: &str, default_port: u16) -> std::result::Result<Vec<(String, u16)>, String> {
    if hosts.is_empty() {
        return Err("no host given".into());
    }
    let mut out = Vec::new();
    for part in hosts.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err("an empty host in the host list".into());
        }
        let (host, port) = if let Some(v6) = part.strip_prefix('[') {
            let Some((host, after)) = v6.split_once(']') else {
                return Err(format!("{part:?}: an IPv6 address without its closing ]"));
            };
            match after {
                "" => (host, None),
                p => match p.strip_prefix(':') {
                    Some(p) => (host, Some(p)),
                    None => return Err(format!("{part:?}: expected :PORT after the ]")),
                },
            }
        } else {
            match part.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (part, None),
            }
        };
        if host.is_empty() {
            return Err(format!("{part:?}: the host is empty"));
        }
        if part.starts_with('[') {
            // (an IPv6 address, with a zone after a `%` if any)
            let address = host.split_once('%').map_or(host, |(a, _)| a);
            if address.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(format!("{part:?}: not an IPv6 address"));
            }
        } else if host.contains([' ', '@', ':', '/']) {
            return Err(format!("{part:?}: not a host name"));
        }
        // (as redis-rs refuses them in a redis:// URL: an address to listen on)
        if host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_unspecified())
        {
            return Err(format!(
                "{part:?}: a wildcard address (0.0.0.0 or ::) names no server"
            ));
        }
        let port = match port {
            None => default_port,
            Some(p) => match p.parse::<u16>() {
                Ok(0) | Err(_) => return Err(format!("{part:?}: the port must be 1 to 65535")),
                Ok(p) => p,
            },
        };
        // (a host listed twice is most likely another one mistyped)
        if out
            .iter()
            .any(|(h, p): &(String, u16)| h.eq_ignore_ascii_case(host) && *p == port)
        {
            return Err(format!("{} is listed twice", HostPort(host, port)));
        }
        out.push((host.to_owned(), port));
    }
    Ok(out)
}

/// Decodes `%XX` escapes (UTF-8 required).
fn percent_decode(s: &str) -> std::result::Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("a % not followed by two hex digits")?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "not UTF-8 once percent-decoded".to_owned())
}

/// `url` with any password replaced by `***`, for logs and messages: the password of
/// the `user:password@` part (everything from the first `:` after the user name up to
/// the last `@`), a user name given without a password (all of a `user@` or `user:@`
/// part: it is likely a password typed without its leading `:`; a user name is shown
/// only when a non-empty password follows it), and the values of `pass=` /
/// `password=` query parameters (the form of `unix://` URLs; a key is compared as the
/// URL parser reads it: percent-decoded, tabs and line breaks dropped, in any case).
/// When in doubt it hides more, never less. Every message of this crate that shows a
/// URL shows it through this function.
///
/// ```
/// assert_eq!(
///     redis_semaphore::redact_url("rediss://app:s3cret@redis.internal:6380/0"),
///     "rediss://app:***@redis.internal:6380/0"
/// );
/// assert_eq!(
///     redis_semaphore::redact_url("redis://s3cret@redis.internal:6379/"),
///     "redis://***@redis.internal:6379/"
/// );
/// assert_eq!(
///     redis_semaphore::redact_url("unix:///run/redis.sock?user=a@b&pa%73s=s3cret"),
///     "unix:///run/redis.sock?user=a@b&pa%73s=***"
/// );
/// ```
pub fn redact(url: &str) -> String {
    // Two rules mark byte ranges to hide, each on the whole text, so that neither can
    // hide what the other reveals (an `@` in a query, a `?` in a password).
    let (scheme_len, has_scheme) = match url.find("://") {
        Some(i) => (i + 3, true),
        None => (0, false),
    };
    let rest = &url[scheme_len..];
    let mut hide: Vec<(usize, usize)> = Vec::new();
    // the user info: up to the last `@`
    if let Some(at) = rest.rfind('@') {
        let userinfo = &rest[..at];
        match userinfo.find(':') {
            // no scheme: we cannot tell what this is, hide all of it
            _ if !has_scheme => hide.push((scheme_len, scheme_len + at)),
            // a user name is shown only with a non-empty password after it (as
            // `Debug` shows one): `name:@` may be the password with a stray `:`
            Some(colon) if colon + 1 < at => hide.push((scheme_len + colon + 1, scheme_len + at)),
            Some(_) => hide.push((scheme_len, scheme_len + at)),
            // a user name without a password: all of it (it may be the password, typed
            // without its `:`), unless the text starts with the path (`unix:///p?a@b`:
            // no user info at all)
            None if !userinfo.starts_with('/') => hide.push((scheme_len, scheme_len + at)),
            None => {}
        }
    }
    // `pass=` / `password=` parameters, from the first `?` on (any `?`, `&` or `;`
    // may start one: more than the URL parser splits on)
    if let Some(q) = rest.find('?') {
        let mut at = scheme_len + q + 1;
        for param in url[at..].split(['&', ';', '?']) {
            if let Some((key, value)) = param.split_once('=')
                && is_password_key(key)
            {
                let from = at + key.len() + 1;
                hide.push((from, from + value.len()));
            }
            at += param.len() + 1;
        }
    }
    hide.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(hide.len());
    for (from, to) in hide {
        match merged.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(to),
            _ => merged.push((from, to)),
        }
    }
    let mut out = String::with_capacity(url.len());
    let mut shown = 0;
    for (from, to) in merged {
        out.push_str(&url[shown..from]);
        out.push_str("***");
        shown = to;
    }
    out.push_str(&url[shown..]);
    out
}

/// Whether a query parameter named `key` carries a password, as a URL parser reads
/// the key (tabs and line breaks dropped, then decoded as query pairs are: `%XX`, `+`
/// for a space), in any case.
fn is_password_key(key: &str) -> bool {
    let key: String = key
        .chars()
        .filter(|c| !matches!(c, '\t' | '\n' | '\r'))
        .collect();
    form_urlencoded::parse(key.as_bytes())
        .next()
        .is_some_and(|(k, _)| k.eq_ignore_ascii_case("pass") || k.eq_ignore_ascii_case("password"))
}

/// TLS files set on the builder: read when the client is built.
#[derive(Debug, Clone, Default)]
pub(crate) struct TlsFiles {
    pub(crate) ca: Option<PathBuf>,
    pub(crate) client_cert: Option<(PathBuf, PathBuf)>,
}

impl TlsFiles {
    pub(crate) fn is_empty(&self) -> bool {
        self.ca.is_none() && self.client_cert.is_none()
    }
}

#[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
fn read_file(what: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        Error::InvalidArgument(format!("cannot read the {what} {}: {e}", path.display()))
    })
}

/// What the pool's manager needs to open connections to one server.
#[derive(Clone)]
pub(crate) struct Endpoint {
    pub(crate) client: redis::Client,
    /// `host:port` (`[::1]:6379` for IPv6, see [`HostPort`]) or the socket path: what
    /// messages name. Never a password.
    pub(crate) addr: String,
    pub(crate) tls: bool,
    /// Whether a password is sent on connect (when none is, a PING checks at once that
    /// the server does not require one).
    pub(crate) has_password: bool,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("addr", &self.addr)
            .field("tls", &self.tls)
            .finish()
    }
}

/// Builds the redis-rs client of one server from its connection info, the builder's
/// credentials and TLS files.
pub(crate) fn endpoint(
    url: &str,
    info: redis::ConnectionInfo,
    creds: &Credentials,
    tls_files: &TlsFiles,
) -> Result<Endpoint> {
    let settings = creds.apply(info.redis_settings().clone());
    let has_password = settings.password().is_some();
    let info = info
        .set_redis_settings(settings)
        .set_tcp_settings(TcpSettings::default().set_nodelay(true));
    let addr = addr_text(info.addr());
    let tls = is_tls_addr(info.addr());
    let client = if tls_files.is_empty() {
        redis::Client::open(info)
            .map_err(|e| Error::InvalidArgument(format!("bad Redis URL {}: {e}", redact(url))))?
    } else if !tls {
        return Err(Error::InvalidArgument(format!(
            "TLS certificate files are set, but {} is not a TLS URL (use rediss://)",
            redact(url)
        )));
    } else {
        with_tls(url, info, tls_files)?
    };
    if tls {
        install_crypto_provider();
    }
    Ok(Endpoint {
        client,
        addr,
        tls,
        has_password,
    })
}

/// The builder's TLS files, read: the CA and the client certificate and key (PEM).
#[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
pub(crate) fn certificates(files: &TlsFiles) -> Result<redis::TlsCertificates> {
    let root_cert = files
        .ca
        .as_deref()
        .map(|p| read_file("TLS CA file", p))
        .transpose()?;
    let client_tls = match &files.client_cert {
        None => None,
        Some((cert, key)) => Some(redis::ClientTlsConfig {
            client_cert: read_file("TLS client certificate file", cert)?,
            client_key: read_file("TLS client key file", key)?,
        }),
    };
    Ok(redis::TlsCertificates {
        client_tls,
        root_cert,
    })
}

#[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
fn with_tls(url: &str, info: redis::ConnectionInfo, files: &TlsFiles) -> Result<redis::Client> {
    let certs = certificates(files)?;
    let names = {
        let mut v: Vec<String> = Vec::new();
        if let Some(ca) = &files.ca {
            v.push(format!("CA file {}", ca.display()));
        }
        if let Some((c, k)) = &files.client_cert {
            v.push(format!(
                "client certificate {} and key {}",
                c.display(),
                k.display()
            ));
        }
        v.join(", ")
    };
    redis::Client::build_with_tls(info, certs).map_err(|e| {
        Error::InvalidArgument(format!(
            "cannot use the TLS files ({names}) for {}: {e}",
            redact(url)
        ))
    })
}

#[cfg(not(any(feature = "tls-rustls", feature = "tls-native-tls")))]
fn with_tls(url: &str, _info: redis::ConnectionInfo, _files: &TlsFiles) -> Result<redis::Client> {
    Err(tls_feature_missing(url))
}

/// How the nodes of a Sentinel or Cluster topology are reached over TLS: a
/// `ConnectionAddr::TcpTls` template holding the builder's certificates (parsed once),
/// copied into the address of each node the topology names.
#[derive(Clone)]
pub(crate) struct NodeTls(redis::ConnectionAddr);

impl std::fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeTls")
    }
}

impl NodeTls {
    /// TLS with the builder's files (the system's trust store when none is set).
    /// Unreadable or unparsable files are [`Error::InvalidArgument`] naming them.
    pub(crate) fn new(url: &str, files: &TlsFiles) -> Result<NodeTls> {
        if !TLS_ENABLED {
            return Err(tls_feature_missing(url));
        }
        let template = redis::ConnectionAddr::TcpTls {
            host: "localhost".to_owned(),
            port: CLUSTER_PORT,
            insecure: false,
            tls_params: None,
        };
        install_crypto_provider();
        if files.is_empty() {
            return Ok(NodeTls(template));
        }
        let info = template
            .into_connection_info()
            .map_err(|e| Error::InvalidArgument(format!("bad Redis URL {}: {e}", redact(url))))?;
        let client = with_tls(url, info, files)?;
        Ok(NodeTls(client.get_connection_info().addr().clone()))
    }

    /// The TLS address of the node at `host:port`, with the certificates.
    pub(crate) fn addr(&self, host: &str, port: u16) -> redis::ConnectionAddr {
        match &self.0 {
            redis::ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => redis::ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => redis::ConnectionAddr::Tcp(host.to_owned(), port),
        }
    }
}

/// Makes rustls's `ring` provider the process default, once, before the first TLS
/// connection: redis-rs compiles rustls without a provider, and rustls panics at the
/// first handshake when it cannot tell which provider to use. A provider the
/// application installed first is kept.
pub(crate) fn install_crypto_provider() {
    #[cfg(feature = "tls-rustls")]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // Err means one is installed already: the application's choice stands
            let _ = rustls::crypto::ring::default_provider().install_default();
        });
    }
}

/// Whether `e` (whose text, lowercased, is `lower`) says the server closed the
/// connection: dropped, reset, a broken pipe, an end of file.
fn closed_by_server(e: &redis::RedisError, lower: &str) -> bool {
    e.is_connection_dropped()
        || ["reset", "broken pipe", "end of file", "eof"]
            .iter()
            .any(|w| lower.contains(w))
}

/// Sorts an error met while opening a connection to `addr` (what messages name: an
/// address, or a Sentinel service and its sentinels), over TLS when `tls`, that selects
/// database `db` (0: the default, which needs no `SELECT`), and that names a user but
/// sends no password when `lone_user` (see [`is_lone_user`]).
pub(crate) fn connect_error_at(
    addr: &str,
    tls: bool,
    db: i64,
    lone_user: bool,
    e: &redis::RedisError,
) -> Error {
    // A `SELECT` refused for want of a password or of the `+select` permission is a
    // refusal of the credentials, not of the database: redis-rs reports it as the
    // database refused and keeps only the server's text, without its code (`NOAUTH
    // Authentication required.`, `NOPERM User u has no permissions to run the
    // 'select' command`); the code is put back.
    let select_code = refused_database(e)
        .then(|| e.detail().unwrap_or(""))
        .and_then(|said| {
            if said.starts_with("Authentication required") {
                Some("NOAUTH")
            } else if said.contains("no permissions to run the 'select' command") {
                Some("NOPERM")
            } else {
                None
            }
        });
    let text = match (select_code, e.detail()) {
        (Some(code), Some(said)) => format!("{code:?}: {said} (refused SELECT {db})"),
        _ => e.to_string(),
    };
    let code = select_code.or(e.code()).unwrap_or("");
    // (the cluster and Sentinel clients of `redis` report a refused AUTH as an I/O
    // error whose text names the kind: "Password authentication failed -
    // AuthenticationFailed")
    if e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(code, "NOAUTH" | "WRONGPASS" | "NOPERM")
        || text.contains("NOAUTH")
        || text.contains("WRONGPASS")
        || text.contains("NOPERM")
        || text.contains("AuthenticationFailed")
    {
        // the code of the error, or of the node's error inside an aggregated one (a
        // Sentinel target reports every sentinel and the primary in one message)
        let says = |c: &str| code == c || text.contains(c);
        // (a Sentinel target's address reads `service "NAME" via host:port,...`)
        let sentinels = addr.starts_with("service ");
        // (a password typed without its leading ':' reads as a user name; not said for
        // a Sentinel target, where the NOAUTH may be a sentinel's, whose password is
        // not the URL's)
        // (a Unix socket's address is its path: its URL carries a password in its query)
        let unix = addr.starts_with('/');
        let lone = if lone_user && says("NOAUTH") && !sentinels {
            if unix {
                "; a user name without a password is not sent: add ?pass=PASSWORD"
            } else {
                "; a user name without a password is not sent: for a password alone write \
                 redis://:PASSWORD@host"
            }
        } else {
            ""
        };
        let hint = if says("NOAUTH") && sentinels {
            " (a sentinel or the server requires a password: the URL's password is the \
             data nodes'; the sentinels' is ClientBuilder::sentinel_password, or the \
             CLI's --sentinel-password"
        } else if says("NOAUTH") && unix {
            " (the server requires a password: put it in the URL \
             (unix:///path/redis.sock?pass=PASSWORD) or set ClientBuilder::password; the \
             CLI: --password or REDIS_PASSWORD"
        } else if says("NOAUTH") {
            " (the server requires a password: put it in the URL \
             (redis://:PASSWORD@host:port/) or set ClientBuilder::password; the CLI: \
             --password or REDIS_PASSWORD"
        } else if text.contains("without any password configured") && sentinels {
            // (the server's words, read back by `refusal_in_the_servers_words`)
            " (a sentinel or the server has no password: leave out the one given for it \
             (the URL's is the data nodes', ClientBuilder::sentinel_password the \
             sentinels'), or give it one with requirepass)"
        } else if text.contains("without any password configured") {
            " (the server has no password: leave it out of the URL and \
             ClientBuilder::password, the CLI's --password and REDIS_PASSWORD, or give the \
             server one with requirepass)"
        } else if sentinels && !says("NOPERM") {
            " (wrong user name or password; the sentinels' are \
             ClientBuilder::sentinel_user and sentinel_password)"
        } else if select_code == Some("NOPERM") {
            " (the ACL user lacks a permission this library needs: a URL with a database \
             other than 0 needs +select, see the ACL rule in docs/deployment.md)"
        } else if says("NOPERM") {
            " (the ACL user lacks a permission this library needs: see the ACL rule in \
             docs/deployment.md)"
        } else {
            " (wrong user name or password)"
        };
        // (the NOAUTH hints leave their parenthesis open for the lone user's)
        let close = if says("NOAUTH") { ")" } else { "" };
        return Error::Auth {
            addr: addr.to_owned(),
            message: format!("{text}{hint}{lone}{close}"),
        };
    }
    if e.kind() == redis::ErrorKind::InvalidClientConfig
        && text.contains(crate::node::NOT_A_CLUSTER)
    {
        // (a seed of a redis+cluster:// URL without cluster mode, see `NodeConn`)
        let said = e.detail().unwrap_or(&text);
        let scheme = if tls { "rediss" } else { "redis" };
        return Error::Connect {
            addr: addr.to_owned(),
            message: format!(
                "{NOT_A_CLUSTER_SEED}: {said} (a {scheme}+cluster:// URL names the nodes of a \
                 Redis Cluster: use {scheme}:// for a single server, {scheme}+sentinel:// for \
                 a Sentinel service)"
            ),
        };
    }
    if refused_database(e) {
        // what the server said, without the client library's wording around it (a
        // Sentinel target's detail is its report of the primary it tried)
        let said = e.detail().unwrap_or(&text);
        let hint = if said.contains("cluster") {
            " (a Redis Cluster node has only database 0: use a redis+cluster:// URL)"
        } else {
            " (the index is the number at the end of the URL's path; a server has 16 \
             databases, 0 to 15, unless its `databases` setting says otherwise)"
        };
        return Error::Connect {
            addr: addr.to_owned(),
            message: format!("{DB_REFUSED} {db}: {said}{hint}"),
        };
    }
    if e.kind() == redis::ErrorKind::Parse {
        // a reply that is no Redis protocol at all: another kind of server on that port
        // (a web server, a wrong port), which no wait turns into Redis. redis-rs's parser
        // error spreads over several lines: kept, on one
        let said = text.split_whitespace().collect::<Vec<_>>().join(" ");
        return Error::Connect {
            addr: addr.to_owned(),
            message: format!(
                "{NOT_REDIS} (is this the port of a Redis server? the URL's port, 6379 when \
                 left out, must be one): {said}"
            ),
        };
    }
    let lower = text.to_ascii_lowercase();
    let timed_out = e.is_timeout() || every_seed_timed_out(&lower);
    let not_sentinels = not_sentinels(&text);
    let message = if !not_sentinels.is_empty() {
        // (first: the rest of a Sentinel target's report, another sentinel refused or
        // dropped, would read as the cause; a Redis server answers SENTINEL with
        // "unknown command")
        let (servers, are) = match not_sentinels.as_slice() {
            [one] => (format!("the server at {one}"), "is not a sentinel"),
            many => (
                format!("the servers at {}", many.join(", ")),
                "are not sentinels",
            ),
        };
        format!(
            "{servers} {are} (a redis+sentinel:// URL names sentinels, not the data \
             nodes): {text}"
        )
    } else if is_unknown_host(&lower) {
        // (before the TLS and dropped-connection cases: the Sentinel and cluster clients
        // of `redis` report a host name that does not resolve in a kind that reads as a
        // dropped connection, and over TLS it read as a failed TLS connection)
        format!("the host name does not resolve: {text}")
    } else if tls {
        if [
            "certificate",
            "unknownissuer",
            "alert",
            "corrupt",
            "invalidcontenttype",
            "wrong version",
            "record",
        ]
        .iter()
        .any(|w| lower.contains(w))
        {
            format!("{TLS_HANDSHAKE_FAILED}: {text}")
        } else if timed_out {
            let plain = plaintext_scheme(addr);
            format!(
                "{NO_TLS_HANDSHAKE} (is this a plaintext port? use {plain} for a server \
                 without TLS): {text}"
            )
        } else if closed_by_server(e, &lower) {
            // (a server that requires a client certificate and got none sends its alert
            // and closes; with TLS 1.3 the close can reach the client before the alert
            // is read, and then nothing tells the two causes apart)
            format!(
                "TLS connection failed: the server closed the connection during or right \
                 after the handshake (if it requires a client certificate, give one: \
                 ClientBuilder::tls_client_cert, or the CLI's --tls-cert and --tls-key): \
                 {text}"
            )
        } else {
            format!("TLS connection failed: {text}")
        }
    } else if e.is_connection_refusal() || lower.contains("refused") {
        text
    } else if timed_out {
        format!("{NO_ANSWER}: {text}")
    } else if closed_by_server(e, &lower) {
        format!(
            "the server closed the connection during the handshake (is this a TLS port? \
             use rediss://, rediss+sentinel:// or rediss+cluster:// for TLS): {text}"
        )
    } else {
        text
    };
    Error::Connect {
        addr: addr.to_owned(),
        message,
    }
}

/// Whether connection settings name a user but carry no password: redis-rs then sends
/// no `AUTH` at all, and the user name may well be a password typed without its
/// leading ':' (`redis://PASSWORD@host`).
pub(crate) fn is_lone_user(settings: &redis::RedisConnectionInfo) -> bool {
    settings.username().is_some() && settings.password().is_none()
}

/// The sentinels that a Sentinel target's error (`text`, as `SentinelTarget::connect`
/// words it: `sentinel HOST:PORT: ...` for each, `; ` between them) reports as
/// answering `SENTINEL` with "unknown command": Redis servers, not sentinels. Empty
/// for any other error, and when a sentinel of the report answered (it named a
/// primary, or did not know the service): the cause is then elsewhere, and a primary
/// unreachable during a failover must not read as a configuration mistake.
fn not_sentinels(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for part in text.split("; ") {
        let lower = part.to_ascii_lowercase();
        // (as `SentinelTarget::connect` words a sentinel's answer, src/topology.rs)
        if lower.contains("known primary ")
            || lower.contains("does not know the service")
            || (lower.contains("sentinel ") && lower.contains(" names "))
        {
            return Vec::new();
        }
        // (Redis 7 quotes the command with ', Redis 6 with `)
        let Some(at) = ["unknown command 'sentinel'", "unknown command `sentinel`"]
            .iter()
            .find_map(|w| lower.find(w))
        else {
            continue;
        };
        let before = &part[..at];
        let addr = before
            .rfind("sentinel ")
            .map(|i| &before[i + "sentinel ".len()..])
            .and_then(|rest| rest.split_once(": "))
            .map(|(addr, _)| addr.to_owned());
        found.push(addr.unwrap_or_else(|| "a sentinel of the URL".to_owned()));
    }
    found
}

/// Whether the lower-cased text of a connect error of redis-rs's cluster client says
/// that every seed timed out. It folds the seeds' errors into one I/O error of its own
/// ("Failed to connect to each cluster node (h1:p1: ERROR; h2:p2: ERROR)"), for which
/// `is_timeout` is false and `is_connection_dropped` true: a seed that never answered
/// (a hung server, or a TLS hello sent to a plaintext port) read as a closed
/// connection.
fn every_seed_timed_out(lower: &str) -> bool {
    const EACH: &str = "failed to connect to each cluster node (";
    let Some(at) = lower.find(EACH) else {
        return false;
    };
    let list = &lower[at + EACH.len()..];
    let list = list.strip_suffix(')').unwrap_or(list);
    list.split("; ").all(|seed| {
        [
            // (WouldBlock and TimedOut as Linux words them, and the one of `NodeConn`)
            "resource temporarily unavailable",
            "timed out",
            "would block",
            "time was up",
        ]
        .iter()
        .any(|w| seed.contains(w))
    })
}

/// The scheme to name for a server without TLS, as the address `addr` in an error
/// reads (a cluster's is "cluster h1:p1,...").
pub(crate) fn plaintext_scheme(addr: &str) -> &'static str {
    if addr.starts_with("cluster ") {
        "redis+cluster://"
    } else {
        "redis://"
    }
}

/// Whether the lower-cased text of a connect error says a host name did not resolve.
fn is_unknown_host(lower: &str) -> bool {
    [
        "failed to lookup address",
        "name or service not known",
        "nodename nor servname",
        "no address associated with hostname",
        "temporary failure in name resolution",
    ]
    .iter()
    .any(|w| lower.contains(w))
}

/// How the [`Error::Connect`] messages of a connect that timed out begin: no answer, no
/// TLS handshake (both [`connect_error_at`]), or no connection at all within a timeout
/// (the pool's, `Manager::stalled_within`). [`is_connect_timeout`] reads them.
const NO_ANSWER: &str = "no answer within the connect timeout";
const NO_TLS_HANDSHAKE: &str = "no TLS handshake within the connect timeout";
/// How the message of an [`Error::Connect`] for a `redis+cluster://` seed without cluster
/// mode starts: a configuration error, not retryable.
const NOT_A_CLUSTER_SEED: &str = "a seed of the URL is not a Redis Cluster node";
/// How the message of an [`Error::Connect`] for a server whose reply is no Redis
/// protocol starts (another kind of server on the port): a configuration error, not
/// retryable.
const NOT_REDIS: &str = "the server does not speak the Redis protocol";
pub(crate) const NO_CONNECTION: &str = "no connection was made within";

/// Whether an [`Error::Connect`]'s message says a connect timed out (see [`NO_ANSWER`]).
pub(crate) fn is_connect_timeout(message: &str) -> bool {
    [NO_ANSWER, NO_TLS_HANDSHAKE, NO_CONNECTION]
        .iter()
        .any(|m| message.starts_with(m))
}

/// Whether `e`, met while a connection was set up, says the server refused to switch
/// to the connection's database (`SELECT` answered an error: "DB index is out of range",
/// "SELECT is not allowed in cluster mode"). `redis` reports it as a response error
/// "Redis server refused to switch database", with the server's text as its detail; a
/// Sentinel target passes that text on in its report of the primary it tried.
fn refused_database(e: &redis::RedisError) -> bool {
    e.to_string().contains("refused to switch database")
}

/// Whether a connect error says the server is not there at all (a refused
/// connection, an unknown host name, a missing socket file, a Sentinel service no
/// sentinel knows, as a misspelt name is, a "sentinel" that is a Redis server): a call
/// fails at once
/// with it instead of waiting out the checkout timeout. (A configuration error is not
/// one, whatever its message says.)
pub(crate) fn is_unreachable(e: &Error) -> bool {
    match e {
        Error::Connect { message, .. } if !is_config_error(e) => {
            let m = message.to_ascii_lowercase();
            [
                "refused",
                "failed to lookup address",
                "name or service not known",
                "no such file or directory",
                "nodename nor servname",
                "no sentinel knows the service",
                "is not a sentinel",
                "are not sentinels",
            ]
            .iter()
            .any(|w| m.contains(w))
        }
        _ => false,
    }
}

/// Whether a connect error is a matter of configuration, which waiting will not fix:
/// refused credentials, a TLS handshake the server or the client refused (certificates),
/// a database index the server refused, a cluster seed without cluster mode, a server
/// that does not speak the Redis protocol. A call fails with it at once, and
/// [`Error::is_retryable`] is false for it.
pub(crate) fn is_config_error(e: &Error) -> bool {
    match e {
        Error::Auth { .. } => true,
        Error::Connect { message, .. } => [
            TLS_HANDSHAKE_FAILED,
            DB_REFUSED,
            NOT_A_CLUSTER_SEED,
            NOT_REDIS,
        ]
        .iter()
        .any(|p| message.starts_with(p)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review (2026-11-27): the connect timeout is divided among the replies of the
    /// set-up, and a share under a nanosecond was zero, which redis-rs refuses with
    /// "cannot set a 0 duration timeout" (every call failed with that, naming no
    /// setting). Each share is now at least a millisecond: a server that accepts and
    /// answers nothing gives a timeout.
    #[test]
    fn a_connect_with_a_tiny_budget_times_out_instead_of_refusing_a_zero_timeout() {
        // accepted by the kernel, never answered
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = silent.local_addr().unwrap().port();
        // a password and a database: two replies share the budget
        let client = redis::Client::open(format!("redis://:pw@127.0.0.1:{port}/3")).unwrap();
        for budget in [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_micros(999),
        ] {
            let e = connect_within(&client, budget).map(|_| ()).unwrap_err();
            assert!(e.is_timeout(), "{budget:?}: {e}");
            assert!(!e.to_string().contains("0 duration"), "{budget:?}: {e}");
        }
    }

    fn parse(url: &str) -> Target {
        Target::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    fn parse_err(url: &str) -> String {
        match Target::parse(url) {
            Ok(t) => panic!("{url} parsed as {t:?}"),
            Err(e) => {
                let Error::InvalidArgument(m) = &e else {
                    panic!("{url}: not InvalidArgument: {e:?}")
                };
                m.clone()
            }
        }
    }

    #[test]
    fn single_server_urls_go_through_redis_rs() {
        let Target::Single(info) = parse("redis://127.0.0.1:6380/2") else {
            panic!()
        };
        assert_eq!(info.addr().to_string(), "127.0.0.1:6380");
        assert_eq!(info.redis_settings().db(), 2);
        let Target::Single(info) = parse("redis://us%40r:p%3Ass@h/") else {
            panic!()
        };
        assert_eq!(info.redis_settings().username(), Some("us@r"));
        assert_eq!(info.redis_settings().password(), Some("p:ss"));
        assert!(matches!(parse("unix:///tmp/r.sock"), Target::Single(_)));
    }

    #[test]
    fn tls_urls_need_a_feature_or_parse() {
        let r = Target::parse("rediss://user:secret@host:6380/");
        if TLS_ENABLED {
            let t = r.unwrap();
            assert!(t.is_tls());
        } else {
            let e = r.unwrap_err().to_string();
            assert!(e.contains("tls-rustls"), "{e}");
            assert!(!e.contains("secret"), "{e}");
        }
    }

    #[test]
    fn sentinel_urls() {
        let Target::Sentinel {
            sentinels,
            service,
            db,
            auth,
            tls,
        } = parse("redis+sentinel://u:p%40w@h1:26380,h2/mymaster/3")
        else {
            panic!()
        };
        assert_eq!(
            sentinels,
            vec![("h1".to_string(), 26380), ("h2".to_string(), 26379)]
        );
        assert_eq!(service, "mymaster");
        assert_eq!(db, 3);
        assert_eq!(auth.username.as_deref(), Some("u"));
        assert_eq!(auth.password.as_deref(), Some("p@w"));
        assert!(!tls);
        let Target::Sentinel {
            sentinels,
            db,
            auth,
            ..
        } = parse("REDIS+SENTINEL://[::1]:5000,127.0.0.1/svc/")
        else {
            panic!()
        };
        assert_eq!(
            sentinels,
            vec![("::1".to_string(), 5000), ("127.0.0.1".to_string(), 26379)]
        );
        assert_eq!(db, 0);
        assert_eq!(auth, Credentials::default());
        let Target::Sentinel { auth, .. } = parse("redis+sentinel://:onlypass@h/s") else {
            panic!()
        };
        assert_eq!(auth.username, None);
        assert_eq!(auth.password.as_deref(), Some("onlypass"));
        if TLS_ENABLED {
            assert!(parse("rediss+sentinel://h/s").is_tls());
        }
    }

    #[test]
    fn cluster_urls() {
        let Target::Cluster { nodes, auth, tls } = parse("redis+cluster://h1:7000,h2:7001") else {
            panic!()
        };
        assert_eq!(
            nodes,
            vec![("h1".to_string(), 7000), ("h2".to_string(), 7001)]
        );
        assert_eq!(auth, Credentials::default());
        assert!(!tls);
        let Target::Cluster { nodes, auth, .. } = parse("redis+cluster://sem:pw@h1/") else {
            panic!()
        };
        assert_eq!(nodes, vec![("h1".to_string(), 6379)]);
        assert_eq!(auth.username.as_deref(), Some("sem"));
        if TLS_ENABLED {
            assert!(parse("rediss+cluster://h1:7000").is_tls());
        }
    }

    #[test]
    fn bad_urls_are_clear_errors() {
        let cases = [
            ("", "expected redis://"),
            ("localhost:6379", "expected redis://"),
            ("redis+sentinel://h1:26379", "service name"),
            ("redis+sentinel:///svc", "no host"),
            ("redis+sentinel://h1,,h2/svc", "empty host"),
            ("redis+sentinel://h1:abc/svc", "port must be"),
            ("redis+sentinel://h1:0/svc", "port must be"),
            ("redis+sentinel://h1:70000/svc", "port must be"),
            ("redis+sentinel://h1/svc/x", "not a number"),
            ("redis+sentinel://h1/svc/1/2", "/SERVICE/DB"),
            ("redis+sentinel://[::1/svc", "closing ]"),
            ("redis+sentinel://u:p%zz@h1/svc", "password"),
            ("redis+cluster://h1:7000/3", "no path"),
            ("redis+cluster://h1:7000?x=1", "query"),
            ("redis+cluster://:secret@h1:x", "port must be"),
            ("redis://host:notaport/", "bad Redis URL"),
            ("http://host/", "bad Redis URL"),
            ("redi://h:6379/", "unknown scheme: expected redis://"),
            ("redis://127.0.0.1:99999/", "port must be"),
            ("redis://:secret@[::1]:0x1/", "port must be"),
            ("redis://u:sec/ret@h:1/", "%2F"),
        ];
        for (url, want) in cases {
            let m = parse_err(url);
            assert!(m.contains(want), "{url}: {m}");
            assert!(!m.contains("secret"), "{url}: {m}");
        }
    }

    #[test]
    fn a_target_debugs_without_its_password() {
        let t = "redis://app:s3cretPW@127.0.0.1:1/".into_redis_target();
        let shown = format!("{t:?}");
        assert!(!shown.contains("s3cretPW"), "{shown}");
        assert!(shown.contains("127.0.0.1"), "{shown}");
    }

    #[test]
    fn redact_hides_passwords() {
        let cases = [
            ("redis://127.0.0.1:6379/", "redis://127.0.0.1:6379/"),
            ("redis://u:secret@h:1/0", "redis://u:***@h:1/0"),
            ("rediss://:secret@h/", "rediss://:***@h/"),
            ("redis://user@h/", "redis://***@h/"),
            ("redis://secret:@h:1/", "redis://***@h:1/"),
            ("redis://:@h/", "redis://***@h/"),
            ("redis://pa/ss@h:1/", "redis://***@h:1/"),
            (
                "redis+sentinel://secret@h1,h2/m",
                "redis+sentinel://***@h1,h2/m",
            ),
            ("unix:///s.sock?user=a@b", "unix:///s.sock?user=a@b"),
            ("redis://u:se@cr:et@h/", "redis://u:***@h/"),
            (
                "redis+sentinel://u:secret@h1,h2/m",
                "redis+sentinel://u:***@h1,h2/m",
            ),
            (
                "unix:///s.sock?db=1&pass=secret",
                "unix:///s.sock?db=1&pass=***",
            ),
            ("u:secret@h", "***@h"),
        ];
        for (url, want) in cases {
            assert_eq!(redact(url), want);
        }
    }

    #[test]
    fn host_port_brackets_an_ipv6_literal() {
        assert_eq!(HostPort("127.0.0.1", 6379).to_string(), "127.0.0.1:6379");
        assert_eq!(
            HostPort("redis.internal", 1).to_string(),
            "redis.internal:1"
        );
        assert_eq!(HostPort("::1", 6379).to_string(), "[::1]:6379");
        assert_eq!(
            HostPort("fe80::1%eth0", 7000).to_string(),
            "[fe80::1%eth0]:7000"
        );
        assert_eq!(HostPort("[::1]", 6379).to_string(), "[::1]:6379");
        let tcp = redis::ConnectionAddr::Tcp("::1".into(), 6380);
        assert_eq!(addr_text(&tcp), "[::1]:6380");
        let Target::Single(info) = parse("redis://[::1]:6381/") else {
            panic!()
        };
        assert_eq!(addr_text(info.addr()), "[::1]:6381");
        let unix = redis::ConnectionAddr::Unix("/run/redis.sock".into());
        assert_eq!(addr_text(&unix), "/run/redis.sock");
    }

    #[test]
    fn a_refused_database_is_a_configuration_error_naming_the_index() {
        // as redis-rs reports a SELECT that answered an error while connecting
        let refused = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "Redis server refused to switch database",
            "DB index is out of range".to_owned(),
        ));
        let e = connect_error_at("127.0.0.1:6380", false, 99, false, &refused);
        assert!(is_config_error(&e) && !is_unreachable(&e), "{e:?}");
        assert!(!e.is_retryable() && !e.is_timeout(), "{e:?}");
        let text = e.to_string();
        assert!(
            text.starts_with("cannot connect to 127.0.0.1:6380: "),
            "{text}"
        );
        assert!(
            text.contains("database 99: DB index is out of range"),
            "{text}"
        );
        // a refused connection stays retryable
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = connect_error_at(
            "127.0.0.1:6380",
            false,
            99,
            false,
            &redis::RedisError::from(io),
        );
        assert!(
            !is_config_error(&e) && is_unreachable(&e) && e.is_retryable(),
            "{e:?}"
        );
    }

    #[test]
    fn redis_servers_named_as_sentinels_are_found_in_the_report() {
        let text = "cannot reach the primary through the sentinels - Io: service \"m\": \
                    sentinel 127.0.0.1:26379: ResponseError: unknown command 'SENTINEL', with \
                    args beginning with: 'GET-MASTER-ADDR-BY-NAME' 'm' ; sentinel [::1]:7000: \
                    ERR unknown command `SENTINEL`, with args beginning with: ; sentinel \
                    127.0.0.1:1: Connection refused (os error 111)";
        assert_eq!(not_sentinels(text), ["127.0.0.1:26379", "[::1]:7000"]);
        assert!(not_sentinels("unknown command 'FOO'").is_empty());
        // a sentinel that answered: the cause is the primary it named
        let answered = format!(
            "{text}; sentinel 127.0.0.1:26380 names 127.0.0.1:6380: Connection refused (os \
             error 111)"
        );
        assert!(not_sentinels(&answered).is_empty(), "{answered}");
        let e = redis::RedisError::from((redis::ErrorKind::Io, "x", text.to_owned()));
        let e = connect_error_at("service \"m\" via h", false, 0, false, &e);
        assert!(is_unreachable(&e) && e.is_retryable(), "{e:?}");
        assert!(
            e.to_string()
                .contains("the servers at 127.0.0.1:26379, [::1]:7000 are not sentinels"),
            "{e}"
        );
    }

    #[test]
    fn debug_never_shows_the_password() {
        for url in [
            "redis://u:secret@h:1/",
            "redis+sentinel://u:secret@h/s",
            "redis+cluster://u:secret@h",
            // a user name without a password may be the password
            "redis://secret@h:1/",
            "redis+sentinel://secret@h/s",
            "redis+cluster://secret@h",
        ] {
            let d = format!("{:?}", parse(url));
            assert!(!d.contains("secret"), "{d}");
            assert!(d.contains("***"), "{d}");
        }
    }
}

/// Where Redis is, as [`Client::open`](crate::Client::open) and
/// [`ClientBuilder::build`](crate::ClientBuilder::build) take it: a URL of any of the
/// forms they list (`&str`, `String`, `&String`), or a [`redis::ConnectionInfo`] built
/// by hand for one server. Implemented for those types only.
pub trait IntoRedisTarget: sealed::Sealed {
    #[doc(hidden)]
    fn into_redis_target(self) -> RedisTarget;
}

/// What an [`IntoRedisTarget`] gives; not a public API.
#[doc(hidden)]
pub enum RedisTarget {
    /// A URL, parsed by [`Target::parse`].
    Url(String),
    /// One server's connection info, as built by the caller.
    Info(Box<redis::ConnectionInfo>),
}

/// Shows a URL without its password (`ConnectionInfo`'s own `Debug` hides it too).
impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedisTarget::Url(url) => f.debug_tuple("Url").field(&redact(url)).finish(),
            RedisTarget::Info(info) => f.debug_tuple("Info").field(info).finish(),
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for &str {}
    impl Sealed for String {}
    impl Sealed for &String {}
    impl Sealed for redis::ConnectionInfo {}
}

impl IntoRedisTarget for &str {
    fn into_redis_target(self) -> RedisTarget {
        RedisTarget::Url(self.to_owned())
    }
}

impl IntoRedisTarget for String {
    fn into_redis_target(self) -> RedisTarget {
        RedisTarget::Url(self)
    }
}

impl IntoRedisTarget for &String {
    fn into_redis_target(self) -> RedisTarget {
        RedisTarget::Url(self.clone())
    }
}

impl IntoRedisTarget for redis::ConnectionInfo {
    fn into_redis_target(self) -> RedisTarget {
        RedisTarget::Info(Box::new(self))
    }
}
