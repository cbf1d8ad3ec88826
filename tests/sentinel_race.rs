//! Sentinel: an answer a sentinel gave before a switch must not undo the switch (found
//! by a review, 2026-11-27); a switch heard while a call spins on one connection, and
//! odd epochs, must not keep the client on the old primary (sixth session).
//!
//! A scripted sentinel (a few RESP commands on a loopback port, so that the order of
//! its answers is the test's) in front of two real Redis servers, both answering
//! `ROLE` with `master`: the old primary during a failover's window, and the new one.

#![allow(clippy::disallowed_methods)]

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use redis_semaphore::Client;
use support::{RedisServer, keys, wait_until};

const SERVICE: &str = "svc";

#[derive(Default)]
struct State {
    /// What `SENTINEL GET-MASTER-ADDR-BY-NAME` answers now.
    answer: Option<u16>,
    /// Hold the next query: it is answered with what `answer` was when it came, once
    /// `release` is set.
    hold_next: bool,
    held: bool,
    release: bool,
    subscribers: Vec<TcpStream>,
    asks: usize,
    /// What `SENTINEL MASTER` reports as the service's `config-epoch`, when set (else
    /// it answers nil: an answer without an epoch).
    epoch: Option<String>,
}

#[derive(Clone)]
struct FakeSentinel {
    port: u16,
    state: Arc<(Mutex<State>, Condvar)>,
}

fn read_command(r: &mut BufReader<TcpStream>) -> Option<Vec<String>> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let n: usize = line.trim().strip_prefix('*')?.parse().ok()?;
    let mut args = Vec::with_capacity(n);
    for _ in 0..n {
        line.clear();
        r.read_line(&mut line).ok()?;
        let len: usize = line.trim().strip_prefix('$')?.parse().ok()?;
        let mut buf = vec![0; len + 2];
        r.read_exact(&mut buf).ok()?;
        buf.truncate(len);
        args.push(String::from_utf8(buf).ok()?);
    }
    Some(args)
}

fn bulk(s: &str) -> String {
    format!("${}\r\n{s}\r\n", s.len())
}

fn addr_reply(port: Option<u16>) -> String {
    match port {
        Some(p) => format!("*2\r\n{}{}", bulk("127.0.0.1"), bulk(&p.to_string())),
        None => "*-1\r\n".to_owned(),
    }
}

impl FakeSentinel {
    fn start() -> FakeSentinel {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let me = FakeSentinel {
            port,
            state: Arc::default(),
        };
        let server = me.clone();
        thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let server = server.clone();
                thread::spawn(move || server.serve(conn));
            }
        });
        me
    }

    fn serve(&self, conn: TcpStream) {
        let mut out = conn.try_clone().unwrap();
        let mut r = BufReader::new(conn);
        let (lock, cv) = &*self.state;
        while let Some(args) = read_command(&mut r) {
            let cmd = args[0].to_ascii_uppercase();
            let reply = match cmd.as_str() {
                "SUBSCRIBE" => {
                    lock.lock()
                        .unwrap()
                        .subscribers
                        .push(out.try_clone().unwrap());
                    format!("*3\r\n{}{}:1\r\n", bulk("subscribe"), bulk(&args[1]))
                }
                "PING"
                    if lock
                        .lock()
                        .unwrap()
                        .subscribers
                        .iter()
                        .any(|s| s.peer_addr().ok() == out.peer_addr().ok()) =>
                {
                    format!("*2\r\n{}{}", bulk("pong"), bulk(""))
                }
                "PING" => "+PONG\r\n".to_owned(),
                // (`SENTINEL MASTER`, asked first for the epoch, gets the nil below:
                // an answer without an epoch, as from a sentinel that refuses it)
                "SENTINEL"
                    if args.len() == 3
                        && args[1].eq_ignore_ascii_case("GET-MASTER-ADDR-BY-NAME")
                        && args[2] == SERVICE =>
                {
                    let mut st = lock.lock().unwrap();
                    st.asks += 1;
                    let answer = st.answer;
                    if st.hold_next {
                        st.hold_next = false;
                        st.held = true;
                        cv.notify_all();
                        while !st.release {
                            st = cv.wait(st).unwrap();
                        }
                    }
                    addr_reply(answer)
                }
                "SENTINEL"
                    if args.len() == 3
                        && args[1].eq_ignore_ascii_case("MASTER")
                        && args[2] == SERVICE =>
                {
                    match &lock.lock().unwrap().epoch {
                        Some(e) => format!("*2\r\n{}{}", bulk("config-epoch"), bulk(e)),
                        None => "*-1\r\n".to_owned(),
                    }
                }
                "SENTINEL" => "*-1\r\n".to_owned(),
                _ => "-ERR unknown command\r\n".to_owned(),
            };
            if out.write_all(reply.as_bytes()).is_err() {
                return;
            }
        }
    }

    fn set_answer(&self, port: Option<u16>) {
        self.state.0.lock().unwrap().answer = port;
    }

    fn set_epoch(&self, epoch: &str) {
        self.state.0.lock().unwrap().epoch = Some(epoch.to_owned());
    }

    fn asks(&self) -> usize {
        self.state.0.lock().unwrap().asks
    }

    fn subscribed(&self) -> bool {
        !self.state.0.lock().unwrap().subscribers.is_empty()
    }

    fn hold_next(&self) {
        self.state.0.lock().unwrap().hold_next = true;
    }

    fn wait_held(&self) {
        let (lock, cv) = &*self.state;
        let mut st = lock.lock().unwrap();
        while !st.held {
            st = cv.wait_timeout(st, Duration::from_secs(10)).unwrap().0;
        }
    }

    fn release(&self) {
        let (lock, cv) = &*self.state;
        lock.lock().unwrap().release = true;
        cv.notify_all();
    }

    fn publish_switch(&self, old: u16, new: u16) {
        let payload = format!("{SERVICE} 127.0.0.1 {old} 127.0.0.1 {new}");
        let msg = format!(
            "*3\r\n{}{}{}",
            bulk("message"),
            bulk("+switch-master"),
            bulk(&payload)
        );
        for s in &mut self.state.0.lock().unwrap().subscribers {
            let _ = s.write_all(msg.as_bytes());
        }
    }
}

/// A connection that asked the sentinels before a switch and got the old primary's
/// address, and opened it after the client had learnt of the new primary (the switch
/// announced, a lookup naming it), recorded the old one as the primary again: the
/// generation moved on, every connection to the new primary was dropped, and the
/// client went on writing to the old one. Another client that follows the sentinels
/// is granted the same permit of a limit-1 semaphore on the new primary: two holders.
#[test]
fn an_answer_from_before_a_switch_does_not_send_the_client_back_to_the_old_primary() {
    let old = RedisServer::start();
    let new = RedisServer::start();
    let sentinel = FakeSentinel::start();
    let url = format!("redis+sentinel://127.0.0.1:{}/{SERVICE}", sentinel.port);
    let client = Client::open(url.as_str()).unwrap();
    // the watcher subscribed and read the primary (not known yet: no answer)
    wait_until(Duration::from_secs(10), "the watcher subscribed", || {
        sentinel.subscribed() && sentinel.asks() >= 1
    });

    // before the switch: a connection asks, and is told the old primary
    sentinel.set_answer(Some(old.port()));
    sentinel.hold_next();
    let early = {
        let client = client.clone();
        thread::spawn(move || client.ping())
    };
    sentinel.wait_held();

    // the switch: announced, and every later lookup names the new primary
    sentinel.set_answer(Some(new.port()));
    sentinel.publish_switch(old.port(), new.port());
    // the client knows the new primary now (a lookup of its own names it)
    client.ping().unwrap();
    let sem = client.semaphore("one", 1).unwrap();
    let probe = sem.try_acquire().unwrap().expect("free");
    assert!(
        !keys(&mut new.conn(), "redsem:{one}:*").is_empty(),
        "the client uses the new primary"
    );
    probe.release().unwrap();

    // the early answer arrives
    sentinel.release();
    early.join().unwrap().unwrap();

    // the client still writes to the new primary
    let held = sem.try_acquire().unwrap().expect("free");
    let on_old = keys(&mut old.conn(), "redsem:{one}:*");
    let other = Client::open(url.as_str())
        .unwrap()
        .semaphore("one", 1)
        .unwrap();
    let second = other.try_acquire().unwrap();
    assert!(
        on_old.is_empty() && second.is_none(),
        "the client went back to the old primary after the switch: its keys there: \
         {on_old:?}; a client following the sentinels got a second permit of a limit-1 \
         semaphore: {:?} (first: {})",
        second.as_ref().map(|p| p.id().to_owned()),
        held.id()
    );
}

/// How many times `server` has run `command` (`INFO commandstats`).
fn calls_of(server: &RedisServer, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.conn())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Review (2026-11-27, sixth session): a `FairWithLock` book acquire spins for the
/// book's lock on the connection it checked out, for up to its lock wait (the book's
/// own callers wait 10 s). A switch heard during the spin left it spinning on the old
/// primary: once the lock there was free it took it and was granted a permit on the
/// old primary, after the client had moved to the new one, where a client following
/// the sentinels was granted the same permit of a limit-1 semaphore: two holders. The
/// spin now ends when its connection's primary is replaced, and the next try goes to
/// the new primary.
#[test]
fn a_book_lock_spin_does_not_outlive_a_switch_on_the_old_primary() {
    use redis_semaphore::BookVariant;
    let old = RedisServer::start();
    let new = RedisServer::start();
    let sentinel = FakeSentinel::start();
    sentinel.set_answer(Some(old.port()));
    let url = format!("redis+sentinel://127.0.0.1:{}/{SERVICE}", sentinel.port);
    let client = Client::builder()
        .operation_timeout(Duration::from_secs(1))
        .build(url.as_str())
        .unwrap();
    wait_until(Duration::from_secs(10), "the watcher subscribed", || {
        sentinel.subscribed()
    });
    let build = |c: &Client| {
        c.book_semaphore("bk", 1)
            .variant(BookVariant::FairWithLock)
            .lock_wait(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let sem = build(&client);
    // another process of the old primary's holds the book's lock for now
    redis::cmd("SET")
        .arg("lock:bk")
        .arg("someone")
        .arg("PX")
        .arg(60_000)
        .exec(&mut old.conn())
        .unwrap();
    let before = calls_of(&old, "set");
    let spinning = {
        let sem = sem.clone();
        thread::spawn(move || sem.acquire_timeout(Duration::from_secs(30)))
    };
    wait_until(
        Duration::from_secs(10),
        "the acquire spins for the lock",
        || calls_of(&old, "set") >= before + 3,
    );

    // the switch, announced; the client follows it (a probe lands on the new primary)
    sentinel.set_answer(Some(new.port()));
    sentinel.publish_switch(old.port(), new.port());
    let probe = client.semaphore("probe", 1).unwrap();
    wait_until(
        Duration::from_secs(10),
        "the client uses the new primary",
        || {
            probe.try_acquire().ok().flatten().is_some_and(|held| {
                let on_new = !keys(&mut new.conn(), "redsem:{probe}:*").is_empty();
                drop(held);
                on_new
            })
        },
    );
    // the lock on the old primary comes free
    redis::cmd("DEL")
        .arg("lock:bk")
        .exec(&mut old.conn())
        .unwrap();
    let got = spinning.join().unwrap().unwrap().expect("granted");

    let on_old: u64 = redis::cmd("ZCARD")
        .arg("bk")
        .query(&mut old.conn())
        .unwrap();
    let other = Client::open(url.as_str()).unwrap();
    let second = build(&other).try_acquire().unwrap();
    assert!(
        on_old == 0 && second.is_none(),
        "the book acquire was granted on the old primary after the switch ({on_old} \
         holder(s) there); a client following the sentinels got a second permit of a \
         limit-1 semaphore: {:?} (first: {})",
        second.as_ref().map(|p| p.id().to_owned()),
        got.id()
    );
}

/// Review (2026-11-27, sixth session): a sentinel reporting the highest configuration
/// epoch (`u64::MAX`, an odd answer) and then announcing a switch made the epoch check
/// add one to it: an overflow, which panicked (debug builds) in the `+switch-master`
/// watcher, whose thread ended, so the client never heard of a switch again (and
/// wrapped to 0 in release builds, turning the check off). The bar now saturates.
#[test]
fn a_sentinel_reporting_the_highest_epoch_does_not_end_the_watcher() {
    let a = RedisServer::start();
    let b = RedisServer::start();
    let sentinel = FakeSentinel::start();
    sentinel.set_epoch(&u64::MAX.to_string());
    sentinel.set_answer(Some(a.port()));
    let url = format!("redis+sentinel://127.0.0.1:{}/{SERVICE}", sentinel.port);
    let client = Client::open(url.as_str()).unwrap();
    wait_until(Duration::from_secs(10), "the watcher subscribed", || {
        sentinel.subscribed()
    });
    // (a probe semaphore of its own per step: keys a probe left on a node say nothing
    // of the next step)
    let lands_on = |name: &str, node: &RedisServer| {
        let probe = client.semaphore(name, 1).unwrap();
        probe.try_acquire().ok().flatten().is_some_and(|held| {
            let there = !keys(&mut node.conn(), &format!("redsem:{{{name}}}:*")).is_empty();
            drop(held);
            there
        })
    };
    wait_until(Duration::from_secs(10), "the client uses a", || {
        lands_on("first", &a)
    });
    // two switches, a -> b and back: the watcher must hear both
    sentinel.set_answer(Some(b.port()));
    sentinel.publish_switch(a.port(), b.port());
    wait_until(Duration::from_secs(10), "the client uses b", || {
        lands_on("second", &b)
    });
    sentinel.set_answer(Some(a.port()));
    let published = std::time::Instant::now();
    wait_until(
        Duration::from_secs(10),
        "the client follows the switch back to a",
        || {
            // (announced again until heard: a watcher that resubscribed after a
            // failure reads the primary anew, one that died never will)
            if published.elapsed() > Duration::from_millis(200) {
                sentinel.publish_switch(b.port(), a.port());
            }
            lands_on("third", &a)
        },
    );
}

/// Whether a client of `server` waits, held by `CLIENT PAUSE WRITE`, with a command
/// whose name starts with `cmd` (`CLIENT LIST`: flag `b`, its `cmd=`).
fn held_at(server: &RedisServer, cmd: &str) -> bool {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut server.conn())
        .unwrap();
    list.lines().any(|l| {
        let field = |name: &str| {
            l.split(' ')
                .find_map(|f| f.strip_prefix(name))
                .unwrap_or("")
                .to_owned()
        };
        field("flags=").contains('b') && field("cmd=").starts_with(cmd)
    })
}

/// Holds every write command sent to `server` from now on (`CLIENT PAUSE WRITE`),
/// until [`unpause`] (or a minute).
fn pause_writes(server: &RedisServer) {
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(60_000)
        .arg("WRITE")
        .exec(&mut server.conn())
        .unwrap();
}

fn unpause(server: &RedisServer) {
    redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .exec(&mut server.conn())
        .unwrap();
}

/// Waits until `client` uses `node` for a new checkout: a try on a probe semaphore of
/// its own lands there.
fn follows(client: &Client, name: &str, node: &RedisServer) {
    let probe = client.semaphore(name, 1).unwrap();
    wait_until(
        Duration::from_secs(10),
        "the client uses the new primary",
        || {
            probe.try_acquire().ok().flatten().is_some_and(|held| {
                let there = !keys(&mut node.conn(), &format!("redsem:{{{name}}}:*")).is_empty();
                drop(held);
                there
            })
        },
    );
}

/// Waits until `client` has learnt that `node` is the primary now: a connection it
/// opens goes there (its `ROLE` check reaches `node`, which nothing of the client's
/// asked before), writing nothing anywhere (a probe's script could be held by a
/// paused old primary).
fn learnt(client: &Client, node: &RedisServer) {
    wait_until(
        Duration::from_secs(10),
        "the client knows the new primary",
        || {
            let _ = client.ping();
            calls_of(node, "role") > 0
        },
    );
}

/// Seventh session: the pool never hands out a connection to a replaced primary, but
/// one already checked out when the switch is learnt went on sending there: a second
/// command of the same call reached the old primary after the client had moved to the
/// new one. Here a try's `EVALSHA` is on its way to the old primary (held there, while
/// its writes are paused) when the switch is heard; it then answers `NOSCRIPT`, and the
/// script was sent again by its text on the same connection: granted on the old
/// primary, while a client following the sentinels was granted the same permit of a
/// limit-1 semaphore on the new one: two holders. A connection of the client's pool
/// now refuses to send once its primary is replaced (a retryable error naming the
/// node and the command; nothing sent), and the try takes the path of a lost reply.
#[test]
fn a_script_resent_by_its_text_after_a_switch_does_not_reach_the_old_primary() {
    let (old, new, sentinel, url, client) = following_the_old_primary();
    // the old primary has no script cached: the try's EVALSHA will be refused
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .exec(&mut old.conn())
        .unwrap();

    // the try's EVALSHA is held at the old primary across the switch, which then
    // answers NOSCRIPT
    let sem = client.semaphore("one", 1).unwrap();
    let got = held_across_a_switch(&old, &new, &sentinel, &client, "evalsha", move || {
        sem.try_acquire()
    });

    let on_old = keys(&mut old.conn(), "redsem:{one}:*");
    let other = Client::open(url.as_str())
        .unwrap()
        .semaphore("one", 1)
        .unwrap();
    let second = other.try_acquire().unwrap();
    assert!(
        on_old.is_empty(),
        "the script was sent again to the old primary after the switch was learnt: its \
         keys there: {on_old:?}; the try: {got:?}; a client following the sentinels: {:?}",
        second.as_ref().map(|p| p.id().to_owned())
    );
    assert!(
        !(matches!(got, Ok(Some(_))) && second.is_some()),
        "two holders of a limit-1 semaphore"
    );
    match got {
        Err(e) => {
            let text = e.to_string();
            assert!(e.is_retryable(), "not retryable: {e}");
            assert!(
                text.contains(&old.port().to_string()) && text.contains("EVAL"),
                "the error names neither the old primary nor the command: {text}"
            );
        }
        // (ninth session: a call refused so is sent once more on a fresh connection,
        // which goes to the new primary; nothing of it ran on the old one)
        Ok(Some(p)) => {
            let holders = other.holders().unwrap();
            assert!(
                holders.iter().any(|h| h.id == p.id()),
                "the try got {p:?}, which the new primary does not hold: {holders:?}"
            );
        }
        Ok(None) => panic!("the try found the limit-1 semaphore full"),
    }
}

/// Seventh session, the same for a book semaphore, whose steps go on the plain
/// connection under the pool's: a `Fair` acquire purges and counts in one transaction,
/// then enters in a second. The first was on its way to the old primary when the
/// switch was heard; the second went there too, and was granted on the old primary
/// while a client following the sentinels was granted the same permit of a limit-1
/// semaphore on the new one. It is refused now, and the try fails (retryable).
#[test]
fn a_book_acquire_s_second_transaction_after_a_switch_does_not_reach_the_old_primary() {
    use redis_semaphore::BookVariant;
    let (old, new, sentinel, url, client) = following_the_old_primary();
    let build = |c: &Client| {
        c.book_semaphore("bk", 1)
            .variant(BookVariant::Fair)
            .build()
            .unwrap()
    };

    // the try's first transaction is held at the old primary across the switch,
    // which then answers it
    let sem = build(&client);
    let got = held_across_a_switch(
        &old,
        &new,
        &sentinel,
        &client,
        "zremrangebyscore",
        move || sem.try_acquire(),
    );

    let on_old: u64 = redis::cmd("ZCARD")
        .arg("bk")
        .query(&mut old.conn())
        .unwrap();
    let other = Client::open(url.as_str()).unwrap();
    let second = build(&other).try_acquire().unwrap();
    assert!(
        on_old == 0,
        "the book's second transaction reached the old primary after the switch was \
         learnt ({on_old} holder(s) there); the try: {got:?}; a client following the \
         sentinels: {:?}",
        second.as_ref().map(|p| p.id().to_owned())
    );
    assert!(
        !(matches!(got, Ok(Some(_))) && second.is_some()),
        "two holders of a limit-1 semaphore"
    );
    match got {
        Err(e) => assert!(
            e.is_retryable() && e.to_string().contains(&old.port().to_string()),
            "not retryable, or the old primary not named: {e}"
        ),
        // (ninth session: a step refused so is sent once more on a fresh connection,
        // which goes to the new primary; nothing of it ran on the old one)
        Ok(Some(p)) => {
            let on_new: u64 = redis::cmd("ZCARD")
                .arg("bk")
                .query(&mut new.conn())
                .unwrap();
            assert_eq!(
                on_new, 1,
                "the try got {p:?}, which the new primary does not hold"
            );
        }
        Ok(None) => panic!("the try found the limit-1 semaphore full"),
    }
}

/// A primary `old`, a server `new` to switch to, a fake sentinel naming `old` (with
/// its watcher subscribed), its URL, and a client (10 s operation timeout) whose
/// connections go to `old`.
fn following_the_old_primary() -> (RedisServer, RedisServer, FakeSentinel, String, Client) {
    let old = RedisServer::start();
    let new = RedisServer::start();
    let sentinel = FakeSentinel::start();
    sentinel.set_answer(Some(old.port()));
    let url = format!("redis+sentinel://127.0.0.1:{}/{SERVICE}", sentinel.port);
    let client = Client::builder()
        .operation_timeout(Duration::from_secs(10))
        .build(url.as_str())
        .unwrap();
    wait_until(Duration::from_secs(10), "the watcher subscribed", || {
        sentinel.subscribed()
    });
    follows(&client, "before", &old);
    (old, new, sentinel, url, client)
}

/// Runs `call` on a thread of its own, its first command (`cmd`) held at the paused
/// `old` primary while the switch to `new` is announced and `client` learns it
/// (nothing of that written anywhere: a write to the old primary would wait there
/// too); then lets `old` answer, and returns what the call returned.
fn held_across_a_switch<T: Send + 'static>(
    old: &RedisServer,
    new: &RedisServer,
    sentinel: &FakeSentinel,
    client: &Client,
    cmd: &str,
    call: impl FnOnce() -> T + Send + 'static,
) -> T {
    pause_writes(old);
    let trying = thread::spawn(call);
    wait_until(
        Duration::from_secs(10),
        &format!("the call's {cmd} waits at the old primary"),
        || held_at(old, cmd),
    );
    sentinel.set_answer(Some(new.port()));
    sentinel.publish_switch(old.port(), new.port());
    learnt(client, new);
    unpause(old);
    trying.join().unwrap()
}
