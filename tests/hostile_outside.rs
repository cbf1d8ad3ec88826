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

/// How many times Redis ran `command` (lower case) since its statistics were reset,
/// scripts' calls included (`INFO commandstats`).
fn calls_of(conn: &mut redis::Connection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// Review of hostile writes (sixth session): a holder record another program writes
/// with a slot list far longer than its permit count (every slot in range, here slot
/// 0 named 200,000 times in 400 KB) made its release run one SETBIT per entry in one
/// script that cannot be killed once it wrote (K9: "touches at most 2 * limit slot
/// bits"); a record of a few hundred megabytes blocks the server for minutes. A slot
/// list longer than its permit count's slots can be is now one SETBIT refuses: it
/// frees no slot, and the next call repairs the keys.
#[test]
fn a_holder_record_with_a_huge_slot_list_cannot_make_a_script_run_unbounded() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let mut conn = server.conn();
    for queued in [false, true] {
        let name = format!("slotlist-{queued}");
        let info = format!("redsem:{{{name}}}:i");
        let sem = client.semaphore(&name, 2).unwrap();
        let held = sem.try_acquire().unwrap().expect("a permit");
        let _other = sem.try_acquire().unwrap().expect("a second permit");
        if queued {
            // someone queued: the release takes the full logic (free_slots)
            let w = "11111111-2222-4333-8444-666666666666";
            let far = support::server_ms(&mut conn) + 600_000;
            let _: () = redis::pipe()
                .cmd("ZADD")
                .arg(format!("redsem:{{{name}}}:q"))
                .arg(1)
                .arg(w)
                .ignore()
                .cmd("ZADD")
                .arg(format!("redsem:{{{name}}}:h"))
                .arg(far)
                .arg(format!("w:{w}"))
                .ignore()
                .cmd("HSET")
                .arg(&info)
                .arg(format!("w:{w}"))
                .arg("2|2|1000|1000|600000||1|other|")
                .arg("qn")
                .arg(1)
                .ignore()
                .query(&mut conn)
                .unwrap();
        }
        let rec: String = redis::cmd("HGET")
            .arg(&info)
            .arg(held.id())
            .query(&mut conn)
            .unwrap();
        let mut parts: Vec<&str> = rec.split('|').collect();
        let slots = vec![parts[2]; 200_000].join(",");
        parts[2] = &slots;
        redis::cmd("HSET")
            .arg(&info)
            .arg(held.id())
            .arg(parts.join("|"))
            .exec(&mut conn)
            .unwrap();
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .exec(&mut conn)
            .unwrap();
        let released = held.release();
        let setbits = calls_of(&mut conn, "setbit");
        eprintln!("queued {queued}: release {released:?}, {setbits} SETBIT calls");
        assert!(
            released.is_ok(),
            "the release runs to its end: {released:?}"
        );
        assert!(
            setbits <= 4,
            "queued {queued}: {setbits} SETBIT calls in one release on a limit of 2"
        );
    }
}
