//! A Lua script run by its SHA1 (`EVALSHA`), and by its text (`EVAL`) on a server that
//! lacks it (`NOSCRIPT`).
//!
//! redis-rs's own `Script::invoke` loads a missing script with `SCRIPT LOAD`, which its
//! cluster client sends to every node: the first call of a script on a node failed, or
//! waited the connect timeouts out, while any other node of the cluster was down or hung,
//! though the call needed only its keys' node. `EVAL` goes where `EVALSHA` goes (the
//! node of the first key) and leaves the script in that server's cache for the next
//! `EVALSHA`; it is also one round trip where `SCRIPT LOAD` and a second `EVALSHA` were
//! two. A script that `NOSCRIPT` refused did not run, so running it by its text once is
//! the same call, not a second one.
//!
//! A user whose ACL allows `EVALSHA` and `SCRIPT LOAD` but not `EVAL` (the rule this
//! crate documented before) is refused `EVAL` before anything runs; the script is then
//! loaded and run by its SHA1 as before.

use redis::{ConnectionLike, FromRedisValue, RedisResult, ToRedisArgs};

/// A script of the library: its text and SHA1.
pub(crate) struct Script {
    code: &'static str,
    hash: String,
}

impl Script {
    /// The script `code`.
    pub(crate) fn new(code: &'static str) -> Script {
        let hash = redis::Script::new(code).get_hash().to_owned();
        Script { code, hash }
    }

    /// The script's SHA1, as `EVALSHA` takes it.
    #[cfg(test)]
    pub(crate) fn get_hash(&self) -> &str {
        &self.hash
    }

    /// An invocation with no keys or arguments yet.
    pub(crate) fn prepare_invoke(&self) -> Invocation<'_> {
        Invocation {
            script: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }
}

/// One call of a [`Script`]: its keys and arguments.
pub(crate) struct Invocation<'a> {
    script: &'a Script,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Invocation<'_> {
    /// Adds a key (`KEYS`).
    pub(crate) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        self.keys.extend(key.to_redis_args());
        self
    }

    /// Adds an argument (`ARGV`).
    pub(crate) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    /// Runs the script by its SHA1, and by its text when the server lacks it.
    pub(crate) fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut dyn ConnectionLike,
    ) -> RedisResult<T> {
        match self.command("EVALSHA", &self.script.hash).query(conn) {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                match self.command("EVAL", self.script.code).query(conn) {
                    Err(e) if eval_refused(&e) => {
                        redis::cmd("SCRIPT")
                            .arg("LOAD")
                            .arg(self.script.code)
                            .exec(conn)?;
                        self.command("EVALSHA", &self.script.hash).query(conn)
                    }
                    answer => answer,
                }
            }
            answer => answer,
        }
    }

    /// `EVALSHA` or `EVAL` (`name`) of `script`, the SHA1 or the text, with the keys
    /// and arguments.
    fn command(&self, name: &str, script: &str) -> redis::Cmd {
        let mut cmd = redis::cmd(name);
        cmd.arg(script)
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        cmd
    }
}

/// Whether the ACL refused `EVAL` itself (not a command the script calls: that one the
/// server names, and the script ran up to it). Redis 6.2 says "NOPERM this user has no
/// permissions to run the 'eval' command ...", Redis 7 and Valkey "NOPERM User u has no
/// permissions to run the 'eval' command".
fn eval_refused(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
        && e.detail().is_some_and(|d| d.contains("'eval' command"))
}
