//! Several processes on one semaphore: clock skew and crashed holders.
//!
//! The helper processes are this very test binary, started again with
//! `REDSEM_HELPER` set: the `helper` test then plays the part it is told.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis_semaphore::Client;
use support::RedisServer;

const LIMIT: u32 = 5;

/// Runs the role named by `REDSEM_HELPER`; does nothing in a normal test run.
#[test]
fn helper() {
    let Ok(role) = std::env::var("REDSEM_HELPER") else {
        return;
    };
    let url = std::env::var("REDSEM_URL").unwrap();
    let client = Client::open(&url).unwrap();
    match role.as_str() {
        // acquires and releases for a while, counting holders in a Redis counter that
        // is raised after each grant and lowered before each release
        "contender" => {
            let sem = client.semaphore("skew", LIMIT).unwrap();
            let mut conn = redis::Client::open(url.as_str())
                .unwrap()
                .get_connection()
                .unwrap();
            let mut most = 0;
            let end = Instant::now() + Duration::from_millis(1500);
            while Instant::now() < end {
                let Some(p) = sem.acquire_timeout(Duration::from_millis(200)).unwrap() else {
                    continue;
                };
                let inside: i64 = redis::cmd("INCR").arg("inside").query(&mut conn).unwrap();
                most = most.max(inside);
                std::thread::sleep(Duration::from_millis(1));
                let _: i64 = redis::cmd("DECR").arg("inside").query(&mut conn).unwrap();
                p.release().unwrap();
            }
            println!("RESULT most={most}");
        }
        // takes the only permit, says so, and waits to be killed
        "holder" => {
            let sem = client
                .semaphore_builder("crash")
                .limit(1)
                .lease(Duration::from_millis(500))
                .build()
                .unwrap();
            let p = sem.acquire().unwrap();
            println!("RESULT held token={}", p.token());
            std::thread::sleep(Duration::from_secs(60));
            drop(p);
        }
        // takes a permit with a short lease, hands it over on stdout and exits at once
        // without giving it back
        "handover" => {
            let sem = client
                .semaphore_builder("handover")
                .limit(1)
                .lease(Duration::from_millis(400))
                .build()
                .unwrap();
            let parts = sem.acquire().unwrap().into_parts();
            println!("RESULT {parts}");
            std::process::exit(0);
        }
        other => panic!("unknown helper role {other}"),
    }
}

fn spawn_helper(role: &str, url: &str, faketime: Option<&str>) -> Child {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match faketime {
        Some(offset) => support::faketime(offset, &exe),
        None => Command::new(&exe),
    };
    cmd.args(["helper", "--exact", "--nocapture", "--test-threads=1"])
        .env("REDSEM_HELPER", role)
        .env("REDSEM_URL", url)
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot start helper {role} (faketime {faketime:?}): {e}"))
}

/// Reads the helper's stdout until its RESULT line.
fn result_line(child: &mut Child) -> String {
    let out = child.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    let line = lines
        .find_map(|l| {
            l.ok()
                .and_then(|l| l.find("RESULT ").map(|at| l[at..].to_owned()))
        })
        .unwrap_or_else(|| panic!("helper ended without a RESULT line"));
    // keep draining in the background so the child never blocks on a full pipe
    std::thread::spawn(move || lines.for_each(drop));
    line
}

#[test]
fn never_over_the_limit_across_processes_with_clocks_an_hour_apart() {
    assert!(
        support::has_faketime(),
        "this test needs faketime on PATH (Debian package faketime; scripts/test.sh installs it)"
    );
    let server = RedisServer::start();
    let url = server.url();
    let mut children: Vec<Child> = [
        None,
        Some("+1h"),
        Some("-1h"),
        None,
        Some("+1h"),
        Some("-1h"),
    ]
    .iter()
    .map(|skew| spawn_helper("contender", &url, *skew))
    .collect();
    let mut most_overall = 0;
    for child in &mut children {
        let line = result_line(child);
        let most: i64 = line.trim_start_matches("RESULT most=").parse().unwrap();
        most_overall = most_overall.max(most);
        assert!(child.wait().unwrap().success());
    }
    assert!(
        most_overall <= LIMIT as i64,
        "{most_overall} holders at once, limit {LIMIT}"
    );
    assert!(
        most_overall >= 2,
        "the processes never overlapped: the test proved nothing"
    );
}

#[test]
fn a_holder_killed_with_sigkill_frees_its_permit_when_its_lease_ends() {
    let server = RedisServer::start();
    let url = server.url();
    let mut holder = spawn_helper("holder", &url, None);
    let line = result_line(&mut holder);
    assert!(line.starts_with("RESULT held"), "{line}");
    let sem = Client::open(&url).unwrap().semaphore("crash", 1).unwrap();
    assert!(sem.try_acquire().unwrap().is_none());
    holder.kill().unwrap(); // SIGKILL: no release, no more refresh
    let killed = Instant::now();
    holder.wait().unwrap();
    let p = sem.acquire_timeout(Duration::from_secs(5)).unwrap();
    let waited = killed.elapsed();
    assert!(p.is_some(), "the dead holder's permit never came back");
    // the lease is 500 ms and was renewed at most ~170 ms before the kill
    assert!(
        waited <= Duration::from_millis(500 + 400),
        "took {waited:?}"
    );
}

#[test]
fn an_adopted_permit_outlives_the_process_that_handed_it_over() {
    let server = RedisServer::start();
    let url = server.url();
    let mut child = spawn_helper("handover", &url, None);
    let line = result_line(&mut child);
    assert!(child.wait().unwrap().success());
    let parts: redis_semaphore::PermitParts = line.trim_start_matches("RESULT ").parse().unwrap();

    let client = Client::open(&url).unwrap();
    let sem = client
        .semaphore_builder("handover")
        .limit(1)
        .lease(Duration::from_millis(400))
        .build()
        .unwrap();
    let permit = sem.adopt(parts.clone()).unwrap();
    assert_eq!(
        (permit.id(), permit.token(), permit.slots()),
        (parts.id(), parts.token(), parts.slots())
    );
    // held for several leases after its first holder exited: the adopter renews it
    std::thread::sleep(Duration::from_millis(1_500));
    assert!(!permit.is_lost());
    let holders = sem.holders().unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].id, parts.id());
    assert!(sem.try_acquire().unwrap().is_none(), "still held");
    // only the adopter gives it back
    permit.release().unwrap();
    assert!(sem.try_acquire().unwrap().is_some());
}

#[test]
fn a_permit_handed_over_but_never_adopted_comes_back_after_its_lease() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = client
        .semaphore_builder("orphan")
        .limit(1)
        .lease(Duration::from_millis(300))
        .build()
        .unwrap();
    let parts = sem.acquire().unwrap().into_parts();
    assert!(
        sem.try_acquire().unwrap().is_none(),
        "not given back by into_parts"
    );
    support::wait_until(Duration::from_secs(5), "the lease to run out", || {
        sem.available().unwrap() == 1
    });
    match sem.adopt(parts) {
        Err(redis_semaphore::Error::PermitLost { .. }) => {}
        other => panic!("adopting an expired grant: {other:?}"),
    }
    let other = client.semaphore("elsewhere", 1).unwrap();
    let parts = sem.acquire().unwrap().into_parts();
    assert!(matches!(
        other.adopt(parts),
        Err(redis_semaphore::Error::InvalidArgument(_))
    ));
}

/// Adoption is checked against the grant the server holds: parts naming another token
/// or other slots are refused (and renew nothing); a grant whose lease has ended is
/// lost with `Expired`, whether its record is still there or the keys have gone.
#[test]
fn adopting_checks_the_parts_against_the_grant_and_says_when_its_lease_ended() {
    use redis_semaphore::{Error, LostReason, PermitParts};
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = Client::open(server.url()).unwrap();
    let sem = client
        .semaphore_builder("checked")
        .limit(2)
        .lease(Duration::from_millis(300))
        .build()
        .unwrap();
    let parts = sem.acquire().unwrap().into_parts();
    // the text form with one field changed
    let with = |field: usize, value: &str| -> PermitParts {
        let text = parts.to_string();
        let mut f: Vec<&str> = text.splitn(8, ':').collect();
        f[field] = value;
        f.join(":").parse().unwrap()
    };
    let other_token = (parts.token() + 1).to_string();
    for forged in [with(3, &other_token), with(5, "1")] {
        match sem.adopt(forged) {
            Err(Error::InvalidArgument(msg)) => assert!(msg.contains("token"), "{msg}"),
            other => panic!("forged parts adopted: {other:?}"),
        }
    }
    let permit = sem.adopt(parts.clone()).unwrap();
    assert_eq!(
        (permit.token(), permit.slots()),
        (parts.token(), parts.slots())
    );
    permit.release().unwrap();

    // ended, its record still there (another holder keeps the keys): Expired. The
    // keeper is not renewed: a renewal's purge would clear the ended record first,
    // and adopt would then rightly say Released
    let keeper = client
        .semaphore_builder("checked")
        .limit(2)
        .lease(Duration::from_secs(60))
        .auto_refresh(false)
        .build()
        .unwrap();
    let _keeper = keeper.acquire().unwrap();
    let short = client
        .semaphore_builder("checked")
        .limit(2)
        .lease(Duration::from_millis(300))
        .auto_refresh(false)
        .build()
        .unwrap();
    let parts = short.acquire().unwrap().into_parts();
    let deadline: i64 = redis::cmd("ZSCORE")
        .arg("redsem:{checked}:h")
        .arg(parts.id())
        .query(&mut conn)
        .unwrap();
    support::wait_past_server_ms(&mut conn, deadline);
    match sem.adopt(parts) {
        Err(Error::PermitLost { reason, .. }) => assert_eq!(reason, LostReason::Expired),
        other => panic!("adopting an ended grant: {other:?}"),
    }

    // ended, and the keys gone with it: Expired
    let alone = client
        .semaphore_builder("alone")
        .limit(1)
        .lease(Duration::from_millis(100))
        .auto_refresh(false)
        .build()
        .unwrap();
    let parts = alone.acquire().unwrap().into_parts();
    support::wait_until(Duration::from_secs(5), "the keys to go", || {
        support::keys(&mut conn, "redsem:{alone}:*").is_empty()
    });
    match alone.adopt(parts) {
        Err(Error::PermitLost { reason, .. }) => assert_eq!(reason, LostReason::Expired),
        other => panic!("adopting a grant whose keys are gone: {other:?}"),
    }
}

/// 'mind' (a lower bound of every deadline, K3) follows a deadline that an adoption
/// moves earlier: a permit adopted by a handle with a shorter lease than its grant's
/// comes back when the shorter lease ends, not the original one. The refresh script
/// renewing a grant with a shorter lease keeps the later deadline (a renewal never
/// moves one earlier) and 'mind' stays a lower bound.
#[test]
fn a_permit_renewed_with_a_shorter_lease_comes_back_when_that_lease_ends() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = Client::open(server.url()).unwrap();
    let builder = |lease_ms: u64| {
        client
            .semaphore_builder("shorter")
            .limit(2)
            .lease(Duration::from_millis(lease_ms))
            .auto_refresh(false)
            .build()
            .unwrap()
    };
    let long = builder(60_000);
    let short = builder(300);
    let mind_and_deadline = |conn: &mut redis::Connection, id: &str| -> (i64, i64) {
        let mind: i64 = redis::cmd("HGET")
            .arg("redsem:{shorter}:i")
            .arg("mind")
            .query(conn)
            .unwrap();
        let deadline: i64 = redis::cmd("ZSCORE")
            .arg("redsem:{shorter}:h")
            .arg(id)
            .query(conn)
            .unwrap();
        (mind, deadline)
    };
    // one holder for a minute, another handed over and adopted with 300 ms
    let _keeper = long.acquire().unwrap();
    let adopted = short.adopt(long.acquire().unwrap().into_parts()).unwrap();
    let (mind, deadline) = mind_and_deadline(&mut conn, adopted.id());
    assert!(
        mind <= deadline,
        "mind {mind} after the deadline {deadline}"
    );
    support::wait_past_server_ms(&mut conn, deadline);
    // (a minute's lease again, so that 'mind' is a minute ahead below)
    let next = long.try_acquire().unwrap();
    assert!(
        next.is_some(),
        "the ended adopted lease still holds its permit"
    );
    drop(next);

    // the refresh script renewing a one-minute grant for 300 ms
    let renewed = long.try_acquire().unwrap().expect("a permit");
    let script = support::refresh_script();
    let reply: Vec<redis::Value> = support::call_on(&script, "shorter")
        .arg(300)
        .arg(300)
        .arg(renewed.id())
        .invoke(&mut conn)
        .unwrap();
    assert_eq!(reply, vec![redis::Value::Int(0)], "renewed, none lost");
    let (mind, deadline) = mind_and_deadline(&mut conn, renewed.id());
    assert!(
        mind <= deadline,
        "mind {mind} after the deadline {deadline}"
    );
}
