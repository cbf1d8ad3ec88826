//! The connection to one node of a Redis Cluster, as the cluster client opens it.
//!
//! redis-rs's cluster client reconnects a node by itself inside a call (a node whose
//! link broke, a node missing from the connection's map, every node of a fresh slot
//! map), each connect with the cluster client's own connect timeout, whatever is left
//! of the call: a `try_acquire` with a 2 s operation timeout took 12 s against a node
//! that hung. A [`NodeConn`] opens within the connect timeout *and* by the end of the
//! bounded call running on the thread ([`CallEnd`]), and fails at once when the call's
//! time is up, so a call ends by its bound however many reconnects the cluster client
//! tries. The cluster client's `PING` on a new node connection, which redis-rs sends
//! with no timeout, is bounded the same way.
//!
//! It is the cluster client's connection type through
//! `ClusterClient::get_generic_connection`, which redis-rs 1.x keeps public (hidden
//! from its docs) for connection types of its users' own.

use std::time::{Duration, Instant};

use redis::cluster::Connect;
use redis::{ConnectionLike, IntoConnectionInfo, RedisResult, Value};

use crate::clock::{CallEnd, IoTimeouts, socket_timeout};

/// The least share of a connect's timeout: a socket timeout cannot be zero.
const MIN_SHARE: Duration = Duration::from_millis(1);

/// What a server without cluster mode answers `CLUSTER SLOTS` with (Redis and Valkey:
/// "ERR This instance has cluster support disabled").
const CLUSTER_DISABLED: &str = "cluster support disabled";

/// The description of the connect error of a seed that is not a cluster node: how
/// [`crate::connect::connect_error_at`] knows it.
pub(crate) const NOT_A_CLUSTER: &str = "not a Redis Cluster node";

/// Whether `cmd` is `CLUSTER SLOTS`, the command redis-rs reads the slot map with.
fn is_slots_command(cmd: &redis::Cmd) -> bool {
    let mut args = cmd.args_iter().map(|a| match a {
        redis::Arg::Simple(bytes) => bytes,
        _ => b"",
    });
    args.next()
        .is_some_and(|a| a.eq_ignore_ascii_case(b"CLUSTER"))
        && args
            .next()
            .is_some_and(|a| a.eq_ignore_ascii_case(b"SLOTS"))
}

/// How many replies redis-rs reads when it sets up a connection with `settings`
/// (without `CLIENT SETINFO`): `AUTH` or `HELLO`, and `SELECT`.
pub(crate) fn setup_replies(settings: &redis::RedisConnectionInfo) -> u32 {
    let auth =
        settings.password().is_some() || settings.protocol() != redis::ProtocolVersion::RESP2;
    u32::from(auth) + u32::from(settings.db() != 0)
}

/// The pool's cluster connection: redis-rs's, over [`NodeConn`]s.
pub(crate) type ClusterConn = redis::cluster::ClusterConnection<NodeConn>;

/// A plain connection to a cluster node whose set-up ends within the connect timeout
/// and by the end of the call on the thread, if any (see the module doc).
pub(crate) struct NodeConn(redis::Connection);

/// The timeout for a connect that may take `timeout` and must end by `end`; `None`
/// when the time is up.
fn connect_timeout_by(timeout: Option<Duration>, end: Option<Instant>) -> Option<Option<Duration>> {
    let Some(end) = end else {
        return Some(timeout);
    };
    let left = end.saturating_duration_since(Instant::now());
    if left < MIN_SHARE {
        return None;
    }
    Some(Some(timeout.map_or(left, |t| t.min(left))))
}

impl Connect for NodeConn {
    fn connect<T>(info: T, timeout: Option<Duration>) -> RedisResult<Self>
    where
        T: IntoConnectionInfo,
    {
        let Some(timeout) = connect_timeout_by(timeout, CallEnd::current()) else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the call's time was up before a cluster node could be reconnected",
            )
            .into());
        };
        let until = timeout.map(|t| Instant::now() + t);
        // redis-rs reads each reply of a connection's set-up with what is left of the
        // timeout, so n replies into a node that swallows bytes take n times it: no
        // `CLIENT SETINFO` (two replies; the seeds' settings leave it out too), and the
        // timeout divided among the replies left
        let info = info.into_connection_info()?;
        let settings = info.redis_settings().clone().set_skip_set_lib_name();
        // (each as a socket timeout the kernel's late timer still ends within it)
        let share =
            timeout.map(|t| socket_timeout((t / setup_replies(&settings).max(1)).max(MIN_SHARE)));
        let info = info.set_redis_settings(settings);
        let conn = <redis::Connection as Connect>::connect(info, share)?;
        // (the cluster client's PING comes next; it sets its response timeout after)
        conn.io_within(until.map(|u| u.saturating_duration_since(Instant::now()).max(MIN_SHARE)))?;
        Ok(NodeConn(conn))
    }

    fn send_packed_command(&mut self, cmd: &[u8]) -> RedisResult<()> {
        self.0.send_packed_command(cmd)
    }

    // The cluster client's own settings pass through as they are: they come from
    // `ClusterConnection`'s setters, which the library calls only through `IoTimeouts`.
    #[allow(clippy::disallowed_methods)]
    fn set_write_timeout(&self, dur: Option<Duration>) -> RedisResult<()> {
        self.0.set_write_timeout(dur)
    }

    #[allow(clippy::disallowed_methods)]
    fn set_read_timeout(&self, dur: Option<Duration>) -> RedisResult<()> {
        self.0.set_read_timeout(dur)
    }

    fn recv_response(&mut self) -> RedisResult<Value> {
        self.0.recv_response()
    }
}

impl ConnectionLike for NodeConn {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.0.req_packed_command(cmd)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.0.req_packed_commands(cmd, offset, count)
    }

    fn req_command(&mut self, cmd: &redis::Cmd) -> RedisResult<Value> {
        let reply = self.0.req_command(cmd)?;
        // redis-rs reads a seed's error reply to `CLUSTER SLOTS` as an empty slot map:
        // a server without cluster mode then "connected", and every call failed with
        // "No connections found", naming neither the address nor the cause
        if let Value::ServerError(e) = &reply
            && e.details().is_some_and(|d| d.contains(CLUSTER_DISABLED))
            && is_slots_command(cmd)
        {
            return Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                NOT_A_CLUSTER,
                format!(
                    "it answers CLUSTER SLOTS with: {} {}",
                    e.code(),
                    e.details().unwrap_or("")
                ),
            )));
        }
        Ok(reply)
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }

    fn supports_pipelining(&self) -> bool {
        self.0.supports_pipelining()
    }

    fn check_connection(&mut self) -> bool {
        self.0.check_connection()
    }

    fn is_open(&self) -> bool {
        self.0.is_open()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connect_ends_by_the_call_s_end_and_fails_once_it_has_passed() {
        let t = Some(Duration::from_secs(2));
        assert_eq!(connect_timeout_by(t, None), Some(t));
        let soon = Instant::now() + Duration::from_millis(300);
        let got = connect_timeout_by(t, Some(soon)).unwrap().unwrap();
        assert!(got <= Duration::from_millis(300), "{got:?}");
        let later = Instant::now() + Duration::from_secs(60);
        assert_eq!(connect_timeout_by(t, Some(later)), Some(t));
        let past = Instant::now() - Duration::from_millis(1);
        assert_eq!(connect_timeout_by(t, Some(past)), None);
    }
}
