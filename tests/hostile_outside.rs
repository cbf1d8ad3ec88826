//! Hostile input from outside the process, found by a review (2026-11-27): values
//! another program writes under the library's keys, and names at the edge of the
//! permit parts' text form.

mod support;

use redis_semaphore::{Client, Error};
use support::RedisServer;

/// A semaphore whose name ends in a line break (accepted by the builder): the text
/// form of its permit's parts loses it, so `adopt` refuses the parts its own
/// semaphore handed over (as it did for a name ending in a space before).
#[test]
fn a_name_ending_in_a_line_break_survives_the_text_form() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    for name in ["jobs\n", "\n", "jobs\r\n", "jobs\r", "a\nb", "a\r\nb"] {
        let sem = match client.semaphore(name, 1) {
            Err(Error::InvalidArgument(e)) => {
                // refused only when the text form would lose the line break
                assert!(name.ends_with(['\n', '\r']), "{name:?} refused: {e}");
                assert!(e.contains("line break"), "{e}");
                continue;
            }
            other => other.unwrap(),
        };
        let line = sem.acquire().unwrap().into_parts().to_string();
        let parsed = line.parse::<redis_semaphore::PermitParts>();
        eprintln!("{name:?}: {parsed:?}");
        let parts = parsed.unwrap();
        assert_eq!(parts.semaphore_name(), name);
        let permit = sem.adopt(parts).unwrap();
        permit.release().unwrap();
    }
}

/// One key under the library's prefix whose name is not UTF-8 (another program's):
/// `list_semaphores` fails for every semaphore.
#[test]
fn list_survives_a_key_that_is_not_utf8() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = client.semaphore("ok", 1).unwrap();
    let _held = sem.acquire().unwrap();
    let mut conn = server.conn();
    let _: () = redis::cmd("HSET")
        .arg(&b"redsem:{\xff}:i"[..])
        .arg("x")
        .arg("1")
        .query(&mut conn)
        .unwrap();
    let listed = client.list_semaphores("*");
    eprintln!("{listed:?}");
    assert_eq!(listed.unwrap(), vec!["ok".to_owned()]);
}

/// A waiter record another program writes (with its queue entry) asking for more
/// permits than MAX_LIMIT, with a limit above them: the next call that serves the
/// queue (here a status read) grants them all, one BITPOS and SETBIT per permit, in
/// one script (K9: "touches at most 2 * limit slot bits") that cannot be killed once it
/// wrote; with 4 billion the server is blocked for hours. Here 300,000: the slots
/// granted pass MAX_LIMIT.
#[test]
fn a_crafted_waiter_record_cannot_make_a_script_run_unbounded() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = client.semaphore("huge", 2).unwrap();
    let held = sem.acquire().unwrap();
    let mut conn = server.conn();
    let w = "11111111-2222-4333-8444-555555555555";
    let far = support::server_ms(&mut conn) + 600_000;
    let _: () = redis::pipe()
        .cmd("ZADD")
        .arg("redsem:{huge}:q")
        .arg(1)
        .arg(w)
        .ignore()
        .cmd("ZADD")
        .arg("redsem:{huge}:h")
        .arg(far)
        .arg(format!("w:{w}"))
        .ignore()
        .cmd("HSET")
        .arg("redsem:{huge}:i")
        .arg(format!("w:{w}"))
        .arg("300000|1000000000|1000|1000|1000||1|evil|")
        .arg("qn")
        .arg(1)
        .ignore()
        .query(&mut conn)
        .unwrap();
    let started = std::time::Instant::now();
    let status = sem.status();
    let took = started.elapsed();
    let bits: i64 = redis::cmd("BITCOUNT")
        .arg("redsem:{huge}:s")
        .query(&mut conn)
        .unwrap();
    eprintln!("status {status:?} after {took:?}; {bits} slot bits set");
    assert!(
        bits <= 10_000,
        "{bits} slots taken (MAX_LIMIT 10,000), in {took:?}"
    );
    drop(held);
}
