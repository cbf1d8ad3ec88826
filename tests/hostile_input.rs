//! Hostile input (the input audit of 2026-11-26): bad input gets a clear `Error`, never
//! a panic, never a permit it should not, and no message, `Debug` output or log line
//! shows a password.
//!
//! Property tests with bounded case counts (a few seconds in all) and the regression
//! tests of what they found. Refused input is checked against a client whose server
//! cannot be reached (`127.0.0.1:1`): an `InvalidArgument` there proves nothing was sent.
//! (A file of its own: the log capture is global to the test process.)

mod support;

use std::time::Duration;

use proptest::prelude::*;
use redis_semaphore::compat::book::BookVariant;
use redis_semaphore::{Client, Error, PermitParts, Semaphore, redact_url};
use support::RedisServer;

fn capture_logs() {
    support::capture::install();
}

/// Where nobody listens: a call that reaches for the network fails with `Connect`.
const NOWHERE: &str = "redis://127.0.0.1:1/";

fn nowhere() -> Client {
    Client::open(NOWHERE).unwrap()
}

fn is_invalid<T>(r: &Result<T, Error>) -> bool {
    matches!(r, Err(Error::InvalidArgument(_)))
}

// ---------------------------------------------------------------------------------
// PermitParts: text form

const ID: &str = "0f8fad5b-d9cb-469f-a165-70867728950e";

fn valid_line(name: &str, token: u64, slots: &[u32]) -> String {
    let slots: Vec<String> = slots.iter().map(u32::to_string).collect();
    format!(
        "redsem-permit:1:{ID}:{token}:{}:{}:{name}",
        slots.len(),
        slots.join(",")
    )
}

/// Mutations of a valid line: cut, fields swapped, numbers replaced.
fn mutate(line: &str, how: u8, at: usize, with: &str) -> String {
    let fields: Vec<&str> = line.splitn(7, ':').collect();
    match how % 6 {
        0 => line.chars().take(at % (line.chars().count() + 1)).collect(),
        1 => {
            let mut f = fields.clone();
            let (i, j) = (2 + at % 5, 2 + (at / 5) % 5);
            f.swap(i, j);
            f.join(":")
        }
        2 => {
            let mut f: Vec<String> = fields.iter().map(|s| s.to_string()).collect();
            f[2 + at % 5] = with.to_owned();
            f.join(":")
        }
        3 => format!("{line}{with}"),
        4 => format!("{with}{line}"),
        _ => line.replacen(':', with, 1 + at % 6),
    }
}

fn hostile_field() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("-1".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("99999999999999999999999999999999".to_owned()),
        Just(u32::MAX.to_string()),
        Just("+1".to_owned()),
        Just("0,0".to_owned()),
        Just(",".to_owned()),
        Just("\u{0}".to_owned()),
        Just("\u{202e}é\u{1F600}".to_owned()),
        Just("x".repeat(10_000)),
        any::<String>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    /// Any text parses or is refused with `InvalidArgument`, never a panic; what
    /// parses prints back to an equal value.
    #[test]
    fn permit_parts_from_any_text(text in any::<String>()) {
        match text.parse::<PermitParts>() {
            Ok(parts) => prop_assert_eq!(parts.to_string().parse::<PermitParts>().unwrap(), parts),
            Err(e) => prop_assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}"),
        }
    }

    /// Mutations of a valid line (cut, fields swapped, huge and negative numbers,
    /// odd unicode, 10 kB fields): parsed or refused, never a panic; a parsed one
    /// has as many slots as permits.
    #[test]
    fn permit_parts_from_mutated_lines(
        token in any::<u64>(),
        slots in proptest::collection::vec(any::<u32>(), 1..5),
        how in any::<u8>(),
        at in any::<usize>(),
        with in hostile_field(),
    ) {
        let text = mutate(&valid_line("jobs", token, &slots), how, at, &with);
        match text.parse::<PermitParts>() {
            Ok(p) => {
                prop_assert_eq!(p.slots().len(), p.permits() as usize);
                prop_assert!(!p.semaphore_name().is_empty());
            }
            Err(e) => prop_assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}"),
        }
    }

    /// Valid parts round-trip through their text, whatever the name (which goes last,
    /// as it is), also with a line break after the text.
    #[test]
    fn permit_parts_round_trip(
        name in "[^\r\n]{1,40}",
        token in any::<u64>(),
        slots in proptest::collection::vec(any::<u32>(), 1..5),
    ) {
        let line = valid_line(&name, token, &slots);
        let parts: PermitParts = line.parse().unwrap();
        prop_assert_eq!(parts.semaphore_name(), name.as_str());
        prop_assert_eq!(parts.token(), token);
        prop_assert_eq!(parts.slots(), &slots[..]);
        prop_assert_eq!(parts.to_string(), line.clone());
        prop_assert_eq!(format!("  {line}\n").parse::<PermitParts>().unwrap(), parts);
    }
}

/// Regression: `from_str` trimmed the end of the line, so the parts of a permit of
/// semaphore "jobs " came back as semaphore "jobs" and `adopt` refused them.
#[test]
fn a_name_ending_in_a_space_survives_the_text_form() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    for name in ["jobs ", " ", "jobs\t"] {
        let sem = client.semaphore(name, 1).unwrap();
        let line = sem.acquire().unwrap().into_parts().to_string();
        let parts: PermitParts = line.parse().unwrap();
        assert_eq!(parts.semaphore_name(), name);
        let permit = sem.adopt(parts).unwrap();
        assert_eq!(permit.semaphore_name(), name);
        permit.release().unwrap();
    }
}

/// Parsed-but-hostile parts (another token, other or more slots, another id, another
/// semaphore's name) are refused by `adopt` with an error; the real holder keeps its
/// grant, and nothing of another semaphore changes.
#[test]
fn adopting_hostile_parts_is_refused_and_touches_nothing_else() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let mut conn = server.conn();
    let sem = client.semaphore("victim", 3).unwrap();
    let other = client.semaphore("bystander", 3).unwrap();
    let held = sem.acquire().unwrap();
    let _bystander = other.acquire().unwrap();
    let (id, token, slot) = (held.id().to_owned(), held.token(), held.slots()[0]);
    let dump = |conn: &mut redis::Connection| -> Vec<(String, Vec<u8>)> {
        support::keys(conn, "*bystander*")
            .into_iter()
            .map(|k| {
                let d: Vec<u8> = redis::cmd("DUMP").arg(&k).query(conn).unwrap();
                (k, d)
            })
            .collect()
    };
    let before = dump(&mut conn);
    let fresh = "11111111-2222-4333-8444-555555555555";
    let hostile = [
        format!("redsem-permit:1:{id}:{}:1:{slot}:victim", token + 1),
        format!("redsem-permit:1:{id}:{}:1:{slot}:victim", u64::MAX),
        format!("redsem-permit:1:{id}:{token}:1:{}:victim", slot + 1),
        format!("redsem-permit:1:{id}:{token}:1:{}:victim", u32::MAX),
        format!("redsem-permit:1:{id}:{token}:2:{slot},{}:victim", slot + 1),
        format!("redsem-permit:1:{id}:{token}:2:{slot},{slot}:victim"),
        format!("redsem-permit:1:{fresh}:{token}:1:{slot}:victim"),
        format!("redsem-permit:1:{}:{token}:1:{slot}:victim", "-".repeat(36)),
        format!("redsem-permit:1:{id}:{token}:1:{slot}:bystander"),
        format!("redsem-permit:1:{id}:{token}:1:{slot}:victim:x"),
    ];
    for line in &hostile {
        let parts: PermitParts = line.parse().unwrap();
        match sem.adopt(parts) {
            Err(Error::InvalidArgument(_) | Error::PermitLost { .. }) => {}
            Err(e) => panic!("{line}: unexpected error {e:?}"),
            Ok(p) => panic!("{line}: adopted {p:?}"),
        }
    }
    // the real grant is intact: still held, still renewable, nothing else granted
    let holders = sem.holders().unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].id, id);
    assert_eq!(holders[0].token, token);
    held.refresh().unwrap();
    assert_eq!(dump(&mut conn), before, "the bystander's keys changed");
    held.release().unwrap();
}

// ---------------------------------------------------------------------------------
// Numbers from the server and from wake-up messages

/// The one queued waiter of semaphore `name`: its id, from the queue, and its wake-up
/// channel, from its record (what any program that reads the keys sees).
fn waiter_and_channel(conn: &mut redis::Connection, name: &str) -> (String, String) {
    let ids = support::queued_ids(conn, name);
    assert_eq!(ids.len(), 1, "{ids:?}");
    let record: String = redis::cmd("HGET")
        .arg(format!("redsem:{{{name}}}:i"))
        .arg(format!("w:{}", ids[0]))
        .query(conn)
        .unwrap();
    let channel = record.split('|').nth(5).unwrap().to_owned();
    (ids[0].clone(), channel)
}

/// Whether the crate logged a line containing `what`.
fn logged(what: &str) -> bool {
    support::capture::all_texts()
        .iter()
        .any(|r| r.contains(what))
}

/// The holder's handle of `name` (limit 1, 30 s lease), the only permit it holds, and
/// a waiter of another client queued behind it.
fn held_with_a_waiter(
    server: &RedisServer,
    name: &str,
) -> (
    Semaphore,
    redis_semaphore::Permit,
    std::thread::JoinHandle<support::WaiterOutcome>,
) {
    let holder_client = Client::open(server.url()).unwrap();
    let sem = semaphore_30s(&holder_client, name);
    let held = sem.try_acquire().unwrap().unwrap();
    let waiter_client = Client::open(server.url()).unwrap();
    let waiting =
        support::queued_waiter(&semaphore_30s(&waiter_client, name), Duration::from_secs(5));
    (sem, held, waiting)
}

fn semaphore_30s(client: &Client, name: &str) -> Semaphore {
    client
        .semaphore_builder(name)
        .limit(1)
        .lease(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// A grant message another program publishes on a waiter's channel ("G id token
/// deadline slots", the id read from the queue and the channel from the waiter's
/// record) was believed as it came: a deadline of `i64::MIN` made the waiting thread
/// panic in a debug build ("attempt to subtract with overflow" in the clock
/// conversion) and, in a release build, return a permit valid for 292 million years
/// while another holder held the only permit. Now a deadline that is no server time
/// makes the message one the listener ignores, one later than the server can have
/// given (an hour on) makes the waiter look again, and one that looks like the
/// server's is believed for at most a heartbeat (a second, what the server gives a
/// pushed grant), after which the permit's renewal finds it not held: lost.
#[test]
fn a_forged_grant_message_gives_no_permit_past_a_heartbeat() {
    capture_logs();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let name = "forged-grant";
    let (sem, held, waiting) = held_with_a_waiter(&server, name);
    let (id, channel) = waiter_and_channel(&mut conn, name);
    let publish = |conn: &mut redis::Connection, deadline: i64| {
        let heard: i64 = redis::cmd("PUBLISH")
            .arg(&channel)
            .arg(format!("G {id} 1 {deadline} 0"))
            .query(conn)
            .unwrap();
        assert_eq!(heard, 1, "the waiter's client listens on {channel}");
    };
    let within = Duration::from_secs(5);
    // no server time: the listener drops the message
    for deadline in [i64::MIN, i64::MAX, -1] {
        publish(&mut conn, deadline);
        let message = format!("G {id} 1 {deadline} 0");
        support::wait_until(within, "the message dropped", || logged(&message));
    }
    // an hour on: later than the server gives a pushed grant; the waiter looks again
    let hour_on = support::server_ms(&mut conn) + 3_600_000;
    publish(&mut conn, hour_on);
    support::wait_until(within, "the message ignored", || {
        logged(&format!("({hour_on})"))
    });
    assert!(!waiting.is_finished(), "the waiter still waits");
    assert_eq!(sem.queue_len().unwrap(), 1);
    // a deadline like the server's: believed for a heartbeat at most
    let soon = support::server_ms(&mut conn) + 900;
    publish(&mut conn, soon);
    let (got, _) = waiting.join().expect("the waiter did not panic");
    let forged = got
        .unwrap()
        .expect("a permit, valid for a heartbeat at most");
    let left = forged.lease_left();
    assert!(left <= Duration::from_secs(1), "{left:?}");
    support::wait_until(within, "the forged permit found not held", || {
        forged.is_lost()
    });
    assert_eq!(forged.lease_left(), Duration::ZERO);
    // the real holder held the only permit throughout
    assert!(!held.is_lost());
    let holders = sem.holders().unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].id, held.id());
    drop(forged);
    held.release().unwrap();
}

/// Seventh session: a refusal message another program publishes on a waiter's channel
/// ("F id limit": the waiter asks for more than the limit in force) ended the wait
/// with `Error::PermitsExceedLimit` as it came, though the limit was unchanged, and
/// left the waiter's queue entry behind for its heartbeat. The waiter now looks
/// again: the look answers the refusal when the limit was truly lowered, and here the
/// waiter waits on and is served.
#[test]
fn a_forged_refusal_message_does_not_end_a_wait() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let name = "forged-refusal";
    let (sem, held, waiting) = held_with_a_waiter(&server, name);
    let (id, channel) = waiter_and_channel(&mut conn, name);
    let heard: i64 = redis::cmd("PUBLISH")
        .arg(&channel)
        .arg(format!("F {id} 0"))
        .query(&mut conn)
        .unwrap();
    assert_eq!(heard, 1, "the waiter's client listens on {channel}");
    // the waiter looked again (the message read) and is still queued: a heartbeat
    // renewed or a look made since the message is seen in the server's statistics
    let calls = |conn: &mut redis::Connection| -> u64 {
        let info: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    };
    let before = calls(&mut conn);
    support::wait_until(Duration::from_secs(5), "the waiter looked again", || {
        calls(&mut conn) > before
    });
    assert!(!waiting.is_finished(), "the wait ended on a forged refusal");
    assert_eq!(sem.queue_len().unwrap(), 1);
    drop(held);
    let (got, _) = waiting.join().expect("the waiter did not panic");
    let permit = got.unwrap().expect("the waiter is served");
    assert!(!permit.is_lost());
}

/// A lease deadline another program wrote into the holders' zset past 2^63 (a score
/// of 1e30) reaches the client as `i64::MIN`, which is how Redis answers a Lua number
/// out of range: the grant in a waiter's look made the clock conversion panic in a
/// debug build ("attempt to subtract with overflow") and gave a permit valid for 292
/// million years in a release build. Now such a reply is malformed: the wait ends
/// with `Error::UnexpectedReply` saying the deadline is out of range, and the grant is
/// given back. `holders()` refuses the same score with an error naming the holder
/// (it showed no lease left for a holder the server keeps for ever).
#[test]
fn a_deadline_out_of_range_in_a_reply_is_an_error_not_a_panic() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let name = "tampered-score";
    let (h, i, q) = (
        format!("redsem:{{{name}}}:h"),
        format!("redsem:{{{name}}}:i"),
        format!("redsem:{{{name}}}:q"),
    );
    let (sem, held, waiting) = held_with_a_waiter(&server, name);
    let (w, channel) = waiter_and_channel(&mut conn, name);

    let _: () = redis::cmd("ZADD")
        .arg(&h)
        .arg("XX")
        .arg("1e30")
        .arg(held.id())
        .query(&mut conn)
        .unwrap();
    match sem.holders() {
        Err(Error::UnexpectedReply { detail, .. }) => {
            assert!(detail.contains(held.id()), "{detail}");
            assert!(detail.contains("out of the range"), "{detail}");
        }
        other => panic!("{other:?}"),
    }

    // the other program makes the waiter the holder of the only slot, until 1e30
    let record: String = redis::cmd("HGET")
        .arg(&i)
        .arg(held.id())
        .query(&mut conn)
        .unwrap();
    let _: () = redis::pipe()
        .atomic()
        .cmd("HDEL")
        .arg(&i)
        .arg(held.id())
        .arg(format!("w:{w}"))
        .ignore()
        .cmd("ZREM")
        .arg(&h)
        .arg(held.id())
        .arg(format!("w:{w}"))
        .ignore()
        .cmd("ZREM")
        .arg(&q)
        .arg(&w)
        .ignore()
        .cmd("HSET")
        .arg(&i)
        .arg(&w)
        .arg(&record)
        .arg("qn")
        .arg(0)
        .ignore()
        .cmd("ZADD")
        .arg(&h)
        .arg("1e30")
        .arg(&w)
        .ignore()
        .query(&mut conn)
        .unwrap();
    // and tells it to look ("L id"); its look finds the grant
    let _: i64 = redis::cmd("PUBLISH")
        .arg(&channel)
        .arg(format!("L {w}"))
        .query(&mut conn)
        .unwrap();
    let (got, _) = waiting.join().expect("the waiter did not panic");
    match got {
        Err(Error::UnexpectedReply { script, detail }) => {
            assert_eq!(script, "acquire");
            assert!(detail.contains("out of range"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    // given back: the other program's grant to the waiter's id is released
    support::wait_until(Duration::from_secs(5), "the grant given back", || {
        sem.status().unwrap().held == 0
    });
    drop(held);
}

// ---------------------------------------------------------------------------------
// URLs and passwords

/// A password unlikely to appear by chance in any message.
fn marker() -> impl Strategy<Value = String> {
    "[A-Za-z0-9]{10}".prop_map(|s| format!("Pw0rd-{s}"))
}

fn url_with_password() -> impl Strategy<Value = (String, String)> {
    let scheme = prop_oneof![
        Just("redis"),
        Just("rediss"),
        Just("valkey"),
        Just("redis+sentinel"),
        Just("rediss+sentinel"),
        Just("redis+cluster"),
        Just("REDIS+CLUSTER"),
    ];
    let host = prop_oneof![
        Just("h".to_owned()),
        Just("h1:7000,h2:7001".to_owned()),
        Just("[::1]:6380".to_owned()),
        Just("[::1".to_owned()),
        Just("h:0".to_owned()),
        Just("h:99999".to_owned()),
        Just(String::new()),
        "[a-z0-9:,\\[\\]@%]{0,12}",
    ];
    let path = prop_oneof![
        Just(String::new()),
        Just("/".to_owned()),
        Just("/0".to_owned()),
        Just("/x".to_owned()),
        Just("/mymaster/3".to_owned()),
        Just("/mymaster/-1".to_owned()),
        Just("/?protocol=resp3".to_owned()),
        Just("/?x=@".to_owned()),
        "[/?#&=@a-z0-9%]{0,12}",
    ];
    let user = prop_oneof![Just(""), Just("u"), Just("app:x"), Just("%zz")];
    let unix_query = prop_oneof![
        Just("pass"),
        Just("PASS"),
        Just("pa%73s"),
        Just("%70ass"),
        Just("pa\nss"),
        Just("pa\tss"),
        Just("password"),
    ];
    prop_oneof![
        (scheme, user, marker(), host, path, "[%@:/?#]{0,2}").prop_map(
            |(scheme, user, pw, host, path, junk)| {
                let url = format!("{scheme}://{user}:{pw}{junk}@{host}{path}");
                (url, pw)
            }
        ),
        (
            unix_query,
            marker(),
            "[a-z=&@;#]{0,8}",
            "[a-z=&@;#]{0,8}",
            prop_oneof![Just("unix"), Just("redis+unix"), Just("unix:")],
        )
            .prop_map(|(key, pw, before, after, scheme)| {
                let url = format!("{scheme}///tmp/r.sock?{before}&{key}={pw}&{after}");
                (url, pw)
            }),
    ]
}

/// Builds a client for `url` with the builder's password setters too (no connection
/// is made), and returns everything it shows: the result, the error, the builder.
fn everything_shown(url: &str, pw: &str) -> Vec<String> {
    let builder = Client::builder()
        .password(pw)
        .sentinel_password(pw)
        .username("u");
    let mut shown = vec![format!("{builder:?}"), redact_url(url)];
    for result in [Client::open(url), builder.build(url)] {
        match result {
            Ok(client) => shown.push(format!("{client:?}")),
            Err(e) => {
                shown.push(e.to_string());
                shown.push(format!("{e:?}"));
            }
        }
    }
    shown
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// Any string as a URL: a client or an error, never a panic; `redact_url` never
    /// panics either.
    #[test]
    fn any_text_as_a_url(text in any::<String>()) {
        let _ = redact_url(&text);
        if let Err(e) = Client::builder().build(text.as_str()) {
            let _ = (e.to_string(), format!("{e:?}"));
        }
    }

    /// No message, `Debug` output or log line shows the password of a URL of any
    /// form, well-formed or not, nor the builder's.
    #[test]
    fn no_output_shows_the_password((url, pw) in url_with_password()) {
        capture_logs();
        for text in everything_shown(&url, &pw) {
            prop_assert!(!text.contains(&pw), "{url:?} showed its password: {text}");
        }
        let logs = support::capture::all_texts();
        prop_assert!(logs.iter().all(|l| !l.contains(&pw)), "a log line showed {pw}");
    }
}

/// Regressions: `redact_url` showed a `unix://` password when the query key was
/// percent-encoded or had a line break in it (the URL parser decodes and drops them:
/// `pa%73s` is `pass`), or when an `@` came later in the query (it took the text
/// before it for a user name).
#[test]
fn redact_url_hides_query_passwords_the_parser_reads() {
    for (url, want) in [
        (
            "unix:///r.sock?pa%73s=SECRET&db=x",
            "unix:///r.sock?pa%73s=***&db=x",
        ),
        ("unix:///r.sock?%70ass=SECRET", "unix:///r.sock?%70ass=***"),
        ("unix:///r.sock?pa\nss=SECRET", "unix:///r.sock?pa\nss=***"),
        (
            "unix:///r.sock?pass=SECRET&user=a@b&db=x",
            "unix:///r.sock?pass=***&user=a@b&db=x",
        ),
        (
            "unix:///r.sock?user=a@b&pass=SECRET",
            "unix:///r.sock?user=a@b&pass=***",
        ),
        ("redis://u:SECRET@h/?x=@", "redis://u:***@"),
        ("redis://u:se?pass=cret@h/", "redis://u:***"),
        ("redis://u:SECRET@h:1/0", "redis://u:***@h:1/0"),
        ("u:SECRET@h", "***@h"),
    ] {
        assert_eq!(redact_url(url), want, "{url:?}");
    }
    // and the error of such a URL (a bad db) shows no password
    let e = Client::open("unix:///r.sock?pa%73s=SECRET&user=a@b&db=x").unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(!format!("{e} {e:?}").contains("SECRET"), "{e}");
}

// ---------------------------------------------------------------------------------
// Client builder, semaphore builders: edges

/// Regressions: `max_connections(u32::MAX)` aborted the process (r2d2 reserves room
/// for the whole pool), and a `Duration::MAX` timeout panicked on the first checkout
/// (`checkout_timeout`) or aborted the process when the client was dropped
/// (`operation_timeout`: a panic inside a drop).
#[test]
fn client_builder_refuses_sizes_and_timeouts_out_of_range() {
    let refused = |b: redis_semaphore::ClientBuilder| {
        let r = b.build(NOWHERE);
        assert!(is_invalid(&r), "{:?}", r.map(|_| ()));
    };
    refused(Client::builder().max_connections(0));
    refused(Client::builder().max_connections(u32::MAX));
    refused(Client::builder().max_connections(redis_semaphore::MAX_CONNECTIONS + 1));
    for d in [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_nanos(999_999),
        Duration::MAX,
        redis_semaphore::MAX_TIMEOUT + Duration::from_nanos(1),
    ] {
        refused(Client::builder().connect_timeout(d));
        refused(Client::builder().operation_timeout(d));
        refused(Client::builder().checkout_timeout(d));
    }
    // the bounds themselves are fine, and work
    let client = Client::builder()
        .max_connections(redis_semaphore::MAX_CONNECTIONS)
        .connect_timeout(redis_semaphore::MAX_TIMEOUT)
        .operation_timeout(redis_semaphore::MAX_TIMEOUT)
        .checkout_timeout(redis_semaphore::MAX_TIMEOUT)
        .build(NOWHERE)
        .unwrap();
    assert!(matches!(client.ping(), Err(Error::Connect { .. })));
    drop(client);
}

/// Review (2026-11-27): a timeout under a millisecond was accepted (only zero was
/// refused), and with `connect_timeout(1ns)` and a URL with a password and a database
/// every call failed with redis-rs's "cannot set a 0 duration timeout", which named no
/// setting: the connect timeout is divided among the replies of the set-up. `build`
/// refuses a timeout under 1 ms, naming the setting and the value; 1 ms works.
#[test]
fn client_builder_refuses_timeouts_under_a_millisecond_naming_the_setting() {
    let tiny = Duration::from_nanos(1);
    for (what, builder) in [
        ("connect_timeout", Client::builder().connect_timeout(tiny)),
        (
            "operation_timeout",
            Client::builder().operation_timeout(tiny),
        ),
        ("checkout_timeout", Client::builder().checkout_timeout(tiny)),
    ] {
        let e = builder
            .build("redis://:pw@127.0.0.1:1/3")
            .map(|_| ())
            .unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        assert!(text.contains(what), "{text}");
        assert!(text.contains("at least 1 ms"), "{text}");
        assert!(text.contains("1ns"), "{text}");
        assert!(!text.contains("pw"), "{text}");
    }
    // 1 ms is fine: a call fails for want of a server, not for its settings
    let ms = Duration::from_millis(1);
    let client = Client::builder()
        .connect_timeout(ms)
        .operation_timeout(ms)
        .checkout_timeout(ms)
        .build("redis://:pw@127.0.0.1:1/3")
        .unwrap();
    let e = client.ping().unwrap_err();
    assert!(!e.to_string().contains("0 duration"), "{e}");
    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
}

/// Regression: a pool given to `from_pool` with a huge connection timeout panicked
/// on the first checkout (r2d2 adds it to `Instant::now()`).
#[test]
fn from_pool_refuses_a_huge_connection_timeout() {
    let pool = r2d2::Pool::builder()
        .max_size(2)
        .connection_timeout(Duration::MAX)
        .build_unchecked(redis::Client::open(NOWHERE).unwrap());
    assert!(is_invalid(&Client::from_pool(pool)));
}

/// Regression: a Redisson TTL past Redis's range went to Redis and came back as a
/// Redis error; it is refused before any network call.
#[test]
fn redisson_ttl_out_of_range_is_refused_before_any_call() {
    let rs = nowhere().redisson_semaphore("ttl");
    for ttl in [Duration::ZERO, Duration::from_nanos(999_999), Duration::MAX] {
        assert!(is_invalid(&rs.try_set_permits_with_ttl(1, ttl)), "{ttl:?}");
    }
}

fn hostile_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("{".to_owned()),
        Just("}".to_owned()),
        Just("a{b}".to_owned()),
        Just("\0".to_owned()),
        Just("a\nb".to_owned()),
        Just("x".repeat(10_000)),
        any::<String>(),
    ]
}

fn hostile_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_nanos(1)),
        Just(Duration::from_millis(1)),
        Just(Duration::from_secs(u64::MAX)),
        Just(Duration::MAX),
        any::<u64>().prop_map(Duration::from_millis),
    ]
}

fn hostile_u32() -> impl Strategy<Value = u32> {
    prop_oneof![
        Just(0),
        Just(1),
        Just(u32::MAX),
        Just(10_000),
        Just(10_001),
        any::<u32>()
    ]
}

/// Whether `r` is fine for a builder that makes no network call: a value or an
/// `InvalidArgument`.
fn no_call<T>(r: &Result<T, Error>) -> bool {
    r.is_ok() || is_invalid(r)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, .. ProptestConfig::default() })]

    /// Every builder and constructor at the edges (empty, 0, u32::MAX, Duration::MAX,
    /// Duration::ZERO, names with `{`, `}`, NUL, line breaks, 10 kB): a value or
    /// `InvalidArgument`, never a panic, and a refused one sends nothing (the client's
    /// server cannot be reached: a call would fail otherwise).
    #[test]
    fn builders_at_the_edges(
        name in hostile_name(),
        label in hostile_name(),
        limit in hostile_u32(),
        n in hostile_u32(),
        lease in hostile_duration(),
        every in hostile_duration(),
        hold in hostile_duration(),
        wait in hostile_duration(),
        auto in any::<bool>(),
        variant in 0..4u8,
    ) {
        let client = nowhere();
        let sem = client
            .semaphore_builder(&name)
            .limit(limit)
            .lease(lease)
            .refresh_interval(every)
            .max_hold(hold)
            .auto_refresh(auto)
            .label(label.as_str())
            .wait_replicas(n, wait)
            .build();
        prop_assert!(no_call(&sem));
        let _ = client.semaphore(&name, limit).map(|s: Semaphore| s.with_label(&label));
        if let Ok(sem) = sem {
            prop_assert!(no_call(&sem.with_label(&label)));
            if n == 0 || n > limit {
                let r = sem.try_acquire_many(n).map(drop);
                let sent = matches!(r, Err(Error::Connect { .. }));
                prop_assert!(!sent, "{:?}", r);
            }
        }
        prop_assert!(no_call(&client.counting_semaphore(&name)));
        let variant = [BookVariant::Basic, BookVariant::Fair, BookVariant::FairWithLock,
            BookVariant::NodeFair][variant as usize];
        prop_assert!(no_call(&client.book_semaphore(&name, limit).variant(variant)
            .timeout(lease).lock_wait(wait).lock_timeout(hold).poll_interval(every).build()));
        let rs = client.redisson_semaphore(&name);
        prop_assert!(no_call(&rs.clone().with_replica_wait(wait)));
        let pes = client.redisson_permit_expirable_semaphore(&name);
        prop_assert!(no_call(&pes.clone().with_replica_wait(wait)));
        // refused arguments of the operations themselves: nothing sent
        if name.is_empty() {
            prop_assert!(is_invalid(&rs.try_acquire(1)));
            prop_assert!(is_invalid(&pes.try_acquire(None).map(drop)));
        }
        if n == 0 {
            prop_assert!(is_invalid(&rs.try_acquire(n)));
            prop_assert!(is_invalid(&pes.try_acquire_many(n, None).map(drop)));
        }
        if lease < Duration::from_millis(1) || lease > Duration::from_secs(10 * 365 * 24 * 3600) {
            prop_assert!(is_invalid(&pes.try_acquire(Some(lease)).map(drop)));
        }
    }
}

/// The command line: a URL whose password is in a percent-encoded query key (refused
/// before any connection: a bad db) gives a usage error and exit status 2, with no
/// panic and no password in its output.
#[cfg(feature = "cli")]
#[test]
fn the_cli_never_prints_a_query_password() {
    let url = "unix:///nonexistent/r.sock?pa%73s=Pw0rd-cli&user=a@b&db=x";
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_redis-semaphore"))
        .args(["--url", url, "status", "jobs"])
        .env_remove("REDIS_URL")
        .env_remove("REDIS_PASSWORD")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("bad Redis URL"), "{text}");
    assert!(
        !text.contains("Pw0rd-cli") && !text.contains("panicked"),
        "{text}"
    );
}

/// A wrong password, a right one and a missing one against a server that requires
/// one: no error, `Debug` output or log line shows either password.
#[test]
fn passwords_refused_by_a_server_are_never_shown() {
    capture_logs();
    let server = RedisServer::start();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("Pw0rd-right")
        .query(&mut server.conn())
        .unwrap();
    let base = server.url().replace("redis://", "");
    for url in [
        format!("redis://:Pw0rd-wrong@{base}"),
        format!("redis://u:Pw0rd-wrong@{base}"),
        format!("redis://:Pw0rd-right@{base}0?protocol=resp3"),
        format!("redis://{base}"),
    ] {
        let client = Client::builder().build(url.as_str()).unwrap();
        let mut shown = vec![format!("{client:?}")];
        match client.ping() {
            Ok(()) => assert!(url.contains("right"), "{url}: accepted"),
            Err(e) => {
                assert!(matches!(e, Error::Auth { .. }), "{url}: {e:?}");
                shown.push(format!("{e} {e:?}"));
            }
        }
        if let Err(e) = client.semaphore("s", 1).and_then(|s| s.try_acquire()) {
            shown.push(format!("{e} {e:?}"));
        }
        drop(client);
        shown.extend(support::capture::all_texts());
        for text in shown {
            assert!(!text.contains("Pw0rd-"), "{url}: {text}");
        }
    }
}
