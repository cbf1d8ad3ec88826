//! Keepalive of long holders (issue 3): the client's background thread renews leases in
//! batches, tells a permit the moment its lease is gone, and survives a server that
//! restarts or cannot be reached.
//!
//! Every wait for a condition has a deadline (`wait_until`, `wait_for`, `recv_timeout`);
//! a plain sleep appears only where the test is about time passing ("hold for five
//! leases", "let three ticks go by").

mod support;

use std::collections::HashSet;
use std::thread;
use std::time::{Duration, Instant};

use redis_semaphore::{Client, Error, LostReason, Permit, Semaphore};
use support::{RedisServer, command_calls, keys, wait_for, wait_until};

fn client(server: &RedisServer) -> Client {
    Client::open(server.url()).unwrap()
}

fn sem(client: &Client, name: &str, limit: u32, lease_ms: u64) -> Semaphore {
    client
        .semaphore_builder(name)
        .limit(limit)
        .lease(Duration::from_millis(lease_ms))
        .build()
        .unwrap()
}

fn manual_sem(client: &Client, name: &str, lease_ms: u64) -> Semaphore {
    client
        .semaphore_builder(name)
        .limit(1)
        .lease(Duration::from_millis(lease_ms))
        .auto_refresh(false)
        .build()
        .unwrap()
}

fn reset_stats(server: &RedisServer) {
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .exec(&mut server.conn())
        .unwrap();
}

fn calls(server: &RedisServer, cmd: &str) -> u64 {
    command_calls(&mut server.conn())
        .get(cmd)
        .copied()
        .unwrap_or(0)
}

/// Asserts the permit has not been told of a loss.
fn assert_held(p: &Permit) {
    assert!(!p.is_lost(), "permit lost: {:?}", p.lost_reason());
    assert!(p.lost().is_empty(), "lost() fired: {:?}", p.lost_reason());
}

#[test]
fn a_permit_held_for_five_leases_stays_valid_and_exclusive() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(200);
    let mine = sem(&client(&server), "long", 1, 200);
    let other = sem(&client(&server), "long", 1, 200);

    let p = mine.acquire().unwrap();
    let start = Instant::now();
    let mut checks = 0;
    // The test is about time passing: hold for five lease lengths, looking every 20 ms.
    while start.elapsed() < lease * 5 {
        assert_held(&p);
        assert!(
            other.try_acquire().unwrap().is_none(),
            "another client got the permit {:?} after the grant",
            start.elapsed()
        );
        checks += 1;
        thread::sleep(Duration::from_millis(20));
    }
    assert!(checks >= 20, "only {checks} checks in five leases");
    let holders = other.holders().unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].id, p.id());
    assert_eq!(holders[0].token, p.token());
    assert_eq!(holders[0].slots, p.slots());
    assert!(holders[0].lease_left > Duration::ZERO);
    assert!(holders[0].lease_left <= lease);
    assert_held(&p);
    p.release().unwrap();
    assert!(other.try_acquire().unwrap().is_some());
}

#[test]
fn force_release_by_another_client_fires_lost_within_about_one_tick() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(300); // a tick is 100 ms
    let mine = sem(&client(&server), "forced", 1, 300);
    let operator = sem(&client(&server), "forced", 1, 300);

    let p = mine.acquire().unwrap();
    assert!(operator.force_release(p.id()).unwrap());
    let told = Instant::now();
    let reason = p
        .lost()
        .recv_timeout(lease)
        .unwrap_or_else(|e| panic!("lost() did not fire within a lease after force_release: {e}"));
    let late = told.elapsed();
    assert_eq!(reason, LostReason::Released);
    assert!(p.is_lost());
    assert_eq!(p.lost_reason(), Some(LostReason::Released));
    // fires once, then stays disconnected
    assert!(p.lost().recv_timeout(Duration::from_millis(1)).is_err());
    eprintln!("force_release noticed after {late:?}");
    match p.release() {
        Err(Error::PermitLost { reason, .. }) => assert_eq!(reason, LostReason::Released),
        other => panic!("release of a force-released permit gave {other:?}"),
    }
}

/// Found by a review (sixth session): a permit force-released by its own client (through
/// any handle of the semaphore the client made) went on saying it was valid
/// (`!is_lost()`, `lease_left()` above zero) until its next renewal, up to a refresh
/// interval later, though the client itself had just freed its slot: the next grant
/// of that slot, in the same client, made two `Permit`s saying valid on slot 0 of a
/// semaphore of limit 1. The client knows its permits: `force_release` marks its own
/// lost (`LostReason::Released`) before the slot is freed.
#[test]
fn a_permit_force_released_by_its_own_client_is_lost_before_its_slot_is_granted_again() {
    let server = RedisServer::start();
    let client = client(&server);
    // a tick is 10 s: no renewal tells the permit during the test
    let mine = sem(&client, "own-forced", 1, 30_000);
    let operator = sem(&client, "own-forced", 1, 30_000);

    let p = mine.acquire().unwrap();
    assert!(operator.force_release(p.id()).unwrap());
    let next = mine.try_acquire().unwrap().expect("the freed slot");
    assert_eq!(next.slots(), p.slots());
    assert_held(&next);
    assert!(next.lease_left() > Duration::ZERO);
    assert!(
        p.is_lost() && p.lease_left() == Duration::ZERO,
        "two valid permits on slot {:?} of a semaphore of limit 1: the force-released one \
         says lost {:?}, lease left {:?}",
        p.slots(),
        p.lost_reason(),
        p.lease_left()
    );
    assert_eq!(p.lost().try_recv(), Ok(LostReason::Released));
    assert_eq!(client.stats().lost, 1);
    match p.release() {
        Err(Error::PermitLost { reason, .. }) => assert_eq!(reason, LostReason::Released),
        other => panic!("release of a force-released permit gave {other:?}"),
    }
    // the same with a permit that is not renewed in the background
    let manual = manual_sem(&client, "own-forced-manual", 30_000);
    let q = manual.acquire().unwrap();
    assert!(manual.force_release(q.id()).unwrap());
    assert_eq!(q.lost_reason(), Some(LostReason::Released));
    assert!(matches!(
        q.refresh(),
        Err(Error::PermitLost {
            reason: LostReason::Released,
            ..
        })
    ));
    next.release().unwrap();
}

#[test]
fn a_server_restart_fires_lost_and_the_same_client_serves_again() {
    let mut server = RedisServer::start();
    let client = client(&server);
    let s = sem(&client, "restart", 1, 300);
    let p = s.acquire().unwrap();
    let token = p.token();

    server.restart();
    // Reset when the first refresh after the restart reaches the new, empty server while
    // the client still counts the lease as running; Expired when the lease ran out by
    // the client's clock first (the server was down, or reconnecting, for longer than
    // what was left of the lease). Either way the permit is gone, and both are true.
    let reason = p
        .lost()
        .recv_timeout(Duration::from_secs(5))
        .expect("lost() did not fire after the server restarted empty");
    assert!(
        matches!(reason, LostReason::Reset | LostReason::Expired),
        "{reason:?}"
    );
    assert!(p.is_lost());
    drop(p);

    // The same client (pool and refresher thread) serves new acquires once the server
    // is back; errors are allowed while connections are re-made.
    let again = wait_for(Duration::from_secs(5), "an acquire after restart", || {
        s.try_acquire().ok().flatten()
    });
    assert_ne!(again.id(), "");
    // A restart loses the token counter, but tokens restart above TIME in microseconds.
    assert!(again.token() > token, "{} after {token}", again.token());
    // ...and the refresher keeps the new permit alive: let three leases pass.
    thread::sleep(Duration::from_millis(900));
    assert_held(&again);
    assert_eq!(s.holders().unwrap().len(), 1);
    again.release().unwrap();
}

#[test]
fn manual_refresh_lease_runs_out_without_refresh_and_lost_fires_expired() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(200);
    let mine = manual_sem(&client(&server), "manual-expire", 200);
    let other = sem(&client(&server), "manual-expire", 1, 200);

    let before = Instant::now();
    let p = mine.acquire().unwrap();
    assert_held(&p);
    let reason = p
        .lost()
        .recv_timeout(lease * 5)
        .expect("lost() did not fire after the lease ran out");
    assert_eq!(reason, LostReason::Expired);
    let fired = before.elapsed();
    // Not much before the lease could have ended: the client's deadline is the
    // server's, converted to its own clock with 1 ms for the server's rounding and
    // 0.1 % for clock drift taken off (docs/keepalive.md), never later.
    let margin = Duration::from_millis(1) + lease / 1000 + Duration::from_millis(1);
    assert!(fired + margin >= lease, "lost() fired after only {fired:?}");

    let q = wait_for(lease * 5, "another client to get the permit", || {
        other.try_acquire().unwrap()
    });
    let got = before.elapsed();
    assert!(got >= lease, "another client got the permit after {got:?}");

    match p.refresh() {
        Err(Error::PermitLost { id, reason }) => {
            assert_eq!(id, p.id());
            assert_eq!(reason, LostReason::Expired);
        }
        other => panic!("refresh of an expired permit gave {other:?}"),
    }
    drop(p); // must not release q's permit
    assert_eq!(other.holders().unwrap()[0].id, q.id());
    q.release().unwrap();
}

#[test]
fn manual_refresh_extends_the_lease_and_keeps_it_exclusive() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(300);
    let mine = manual_sem(&client(&server), "manual-keep", 300);
    let other = sem(&client(&server), "manual-keep", 1, 300);

    let p = mine.acquire().unwrap();
    let start = Instant::now();
    let mut refreshes = 0;
    // The test is about time passing: three leases, refreshing every third of one.
    while start.elapsed() < lease * 3 {
        thread::sleep(lease / 3);
        p.refresh().unwrap();
        refreshes += 1;
        assert_held(&p);
        assert!(
            other.try_acquire().unwrap().is_none(),
            "another client got a refreshed permit after {:?}",
            start.elapsed()
        );
    }
    assert!(refreshes >= 5, "{refreshes}");
    let h = other.holders().unwrap();
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].id, p.id());
    // A refresh renews to a full lease from now.
    assert!(h[0].lease_left > lease / 2, "{:?}", h[0].lease_left);
    p.release().unwrap();
}

#[test]
fn manual_refresh_of_a_force_released_permit_is_permit_lost() {
    let server = RedisServer::start();
    let mine = manual_sem(&client(&server), "manual-gone", 5_000);
    let operator = sem(&client(&server), "manual-gone", 1, 5_000);

    let p = mine.acquire().unwrap();
    p.refresh().unwrap();
    assert!(operator.force_release(p.id()).unwrap());
    match p.refresh() {
        Err(Error::PermitLost { id, reason }) => {
            assert_eq!(id, p.id());
            assert_eq!(reason, LostReason::Released);
        }
        other => panic!("refresh of a force-released permit gave {other:?}"),
    }
    // the refresh that found it gone also fires lost(), once
    assert_eq!(p.lost().try_recv(), Ok(LostReason::Released));
    assert!(p.is_lost());
    // and a second refresh says the same without a round trip
    assert!(matches!(
        p.refresh(),
        Err(Error::PermitLost {
            reason: LostReason::Released,
            ..
        })
    ));
}

#[test]
fn a_thousand_permits_cost_one_refresh_call_per_semaphore_per_tick() {
    const SEMS: u32 = 10;
    const EACH: u32 = 100;
    let server = RedisServer::start();
    let client = client(&server);
    let lease = Duration::from_millis(600);
    let period = lease / 3;
    let sems: Vec<Semaphore> = (0..SEMS)
        .map(|i| sem(&client, &format!("bulk:{i}"), EACH, 600))
        .collect();
    let mut held = Vec::new();
    for s in &sems {
        for _ in 0..EACH {
            held.push(s.try_acquire().unwrap().expect("a free permit"));
        }
    }
    for s in &sems {
        assert_eq!(s.available().unwrap(), 0);
    }

    reset_stats(&server);
    let start = Instant::now();
    // The test is about time passing: let about three ticks go by.
    thread::sleep(period * 3);
    let stats = command_calls(&mut server.conn());
    let elapsed = start.elapsed();
    let ticks = elapsed.as_secs_f64() / period.as_secs_f64();
    // (a script's first call on a server sends its text: EVAL, then EVALSHA)
    let evalsha =
        stats.get("evalsha").copied().unwrap_or(0) + stats.get("eval").copied().unwrap_or(0);
    let low = (SEMS as f64 * (ticks.floor() - 1.0)).max(SEMS as f64) as u64;
    let high = (SEMS as f64 * (ticks.ceil() + 2.0)) as u64;
    eprintln!("{ticks:.2} ticks, {evalsha} evalsha, stats {stats:?}");
    assert!(
        (low..=high).contains(&evalsha),
        "{evalsha} script calls in {ticks:.2} ticks for {SEMS} semaphores, expected {low}..={high}"
    );
    // Inside the script, one ZMSCORE and one ZADD per 500 ids: here one of each per call,
    // not one per permit (that would be 1,000 per tick).
    for inner in ["zmscore", "zadd"] {
        let n = stats.get(inner).copied().unwrap_or(0);
        assert!(
            n <= evalsha,
            "{n} {inner} calls for {evalsha} refresh calls: {stats:?}"
        );
    }
    for p in &held {
        assert_held(p);
    }
    for s in &sems {
        assert_eq!(s.available().unwrap(), 0);
    }
}

/// The arguments of every `EVALSHA` in the slow log (which records every command when
/// `slowlog-log-slower-than` is 0), oldest first. Redis keeps at most 32 arguments of
/// a command; the last one then says how many more there were.
fn logged_evalshas(server: &RedisServer) -> Vec<Vec<String>> {
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query(&mut server.conn())
        .unwrap();
    let mut out: Vec<Vec<String>> = entries
        .into_iter()
        .filter_map(|e| {
            let redis::Value::Array(fields) = e else {
                return None;
            };
            let args: Vec<String> = redis::from_redis_value(fields.get(3)?.clone()).ok()?;
            args[0].eq_ignore_ascii_case("evalsha").then_some(args)
        })
        .collect();
    out.reverse();
    out
}

fn slowlog_reset(server: &RedisServer) {
    redis::cmd("SLOWLOG")
        .arg("RESET")
        .exec(&mut server.conn())
        .unwrap();
}

#[test]
fn dropped_permits_are_never_refreshed_again() {
    let server = RedisServer::start_with(&[
        "--slowlog-log-slower-than",
        "0",
        "--slowlog-max-len",
        "100000",
    ]);
    let client = client(&server);
    let lease = Duration::from_millis(300);
    let period = lease / 3;
    let s = sem(&client, "drops", 60, 300);
    let mut held: Vec<Permit> = (0..60).map(|_| s.try_acquire().unwrap().unwrap()).collect();
    let kept: Vec<Permit> = held.drain(..10).collect();
    let kept_ids: HashSet<String> = kept.iter().map(|p| p.id().to_owned()).collect();
    let dropped_ids: HashSet<String> = held.iter().map(|p| p.id().to_owned()).collect();

    // Drop 50 while the refresher runs: spread over more than a tick, so that some drops
    // fall between a tick's snapshot of the group and its script call.
    let start = Instant::now();
    for p in held {
        drop(p);
        thread::sleep(Duration::from_millis(3));
    }
    assert!(start.elapsed() > period, "the drops took less than a tick");
    assert_eq!(s.available().unwrap(), 50);

    // At most one refresh taken before the last drop can still be on its way; once a
    // refresh call has been seen after the drops, every later one carries exactly the
    // ten kept ids.
    slowlog_reset(&server);
    wait_until(lease * 3, "a refresh after the drops", || {
        !logged_evalshas(&server).is_empty()
    });
    slowlog_reset(&server);
    let refreshes = wait_for(lease * 5, "three refresh calls", || {
        let calls = logged_evalshas(&server);
        (calls.len() >= 3).then_some(calls)
    });
    for args in &refreshes {
        // EVALSHA sha 4 k1 k2 k3 k4 lease pad id...
        assert_eq!(args.len(), 9 + kept.len(), "{args:?}");
        let ids: HashSet<String> = args[9..].iter().cloned().collect();
        assert_eq!(
            ids, kept_ids,
            "a refresh call sent other ids than the held ones"
        );
        assert!(ids.is_disjoint(&dropped_ids));
    }
    let holders: HashSet<String> = s.holders().unwrap().into_iter().map(|h| h.id).collect();
    assert_eq!(holders, kept_ids);

    // Drop the rest: the group empties and the refresher sends nothing more.
    drop(kept);
    assert!(s.holders().unwrap().is_empty());
    // Let a possible in-flight tick land (time passing), then watch four quiet ticks.
    thread::sleep(period * 2);
    reset_stats(&server);
    thread::sleep(period * 4);
    assert_eq!(calls(&server, "evalsha"), 0, "refresh calls for no permit");
    assert!(s.holders().unwrap().is_empty());
    // Nothing renews the keys any more, so they expire (lease plus at most 1 s padding).
    let mut conn = server.conn();
    wait_until(
        Duration::from_secs(3),
        "the semaphore's keys to expire",
        || keys(&mut conn, "redsem:{drops}:*").is_empty(),
    );
}

#[test]
fn an_unreachable_server_fires_lost_by_the_clients_clock_and_the_refresher_survives() {
    let mut server = RedisServer::start();
    let client = client(&server);
    let lease = Duration::from_millis(300);
    let period = lease / 3;
    let s = sem(&client, "down", 1, 300);
    let p = s.acquire().unwrap();
    // let a renewal or two succeed first
    thread::sleep(period * 2);
    assert_held(&p);

    server.stop();
    let stopped = Instant::now();
    // The last successful renewal was sent before the stop, so by the client's clock the
    // lease ends at most one lease after it; the refresher notices at its next tick.
    let reason = p
        .lost()
        .recv_timeout(lease + period + Duration::from_millis(100))
        .unwrap_or_else(|e| {
            panic!(
                "lost() did not fire within a lease and a tick of the stop ({:?}): {e}",
                stopped.elapsed()
            )
        });
    let late = stopped.elapsed();
    eprintln!("unreachable server: lost after {late:?}");
    assert_eq!(reason, LostReason::Expired);
    assert!(p.is_lost());
    assert!(p.release().is_err(), "release with the server down");

    // The refresher thread lives on: after a restart the same client acquires, and keeps
    // the new permit alive.
    server.restart();
    let again = wait_for(Duration::from_secs(8), "an acquire after restart", || {
        s.try_acquire().ok().flatten()
    });
    thread::sleep(lease * 2);
    assert_held(&again);
    again.release().unwrap();
}

/// Sends `signal` (`-STOP`, `-CONT`) to the server process, with the shell's own `kill`
/// (no procps needed).
fn signal(server: &RedisServer, signal: &str) {
    let pid = server.pid().expect("the server runs").to_string();
    let status = std::process::Command::new("sh")
        .args(["-c", &format!("kill {signal} {pid}")])
        .status()
        .expect("run sh -c kill");
    assert!(status.success(), "kill {signal} {pid}");
}

#[test]
fn a_hung_server_fires_lost_on_time_and_its_late_replies_are_not_misread() {
    let server = RedisServer::start();
    let client = client(&server);
    let lease = Duration::from_millis(300);
    let period = lease / 3;
    let s = sem(&client, "hung", 1, 300);
    let p = s.acquire().unwrap();
    thread::sleep(period * 2);
    assert_held(&p);

    // A stopped server keeps its sockets: connects and writes succeed, reads hang. The
    // refresher must not wait for the 2 s operation timeout before declaring the loss.
    signal(&server, "-STOP");
    let stopped = Instant::now();
    let reason = p
        .lost()
        .recv_timeout(lease + period + Duration::from_millis(100));
    let late = stopped.elapsed();
    signal(&server, "-CONT");
    let reason = reason.unwrap_or_else(|e| {
        panic!("lost() did not fire within a lease and a tick of the hang ({late:?}): {e}")
    });
    eprintln!("hung server: lost after {late:?}");
    assert_eq!(reason, LostReason::Expired);

    // Once the server runs again, the renewals it answers late are skipped by the
    // connections that sent them: the same client works, with replies in step.
    let again = wait_for(Duration::from_secs(5), "an acquire after the hang", || {
        s.try_acquire().ok().flatten()
    });
    assert_ne!(again.id(), p.id());
    thread::sleep(lease * 2);
    assert_held(&again);
    let holders = s.holders().unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].id, again.id());
    assert_eq!(s.available().unwrap(), 0);
    again.release().unwrap();
    assert_eq!(s.available().unwrap(), 1);
}

#[test]
fn max_hold_stops_the_keepalive_and_lost_says_why() {
    let server = RedisServer::start();
    let client = client(&server);
    let sem = client
        .semaphore_builder("held-too-long")
        .limit(1)
        .lease(Duration::from_millis(300))
        .max_hold(Duration::from_millis(900))
        .build()
        .unwrap();
    let started = Instant::now();
    let p = sem.acquire().unwrap();
    // renewed past its first lease, then not renewed after max_hold
    let reason = p
        .lost()
        .recv_timeout(Duration::from_secs(10))
        .expect("lost fires once the lease after max_hold ends");
    assert_eq!(reason, LostReason::MaxHold);
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "kept alive until max_hold: {:?}",
        started.elapsed()
    );
    assert!(p.is_lost());
    match p.refresh() {
        Err(Error::PermitLost { reason, .. }) => assert_eq!(reason, LostReason::MaxHold),
        other => panic!("a refresh after max_hold: {other:?}"),
    }
    // the server agrees: the permit is free for the next holder
    wait_until(Duration::from_secs(5), "the permit to come back", || {
        sem.available().unwrap() == 1
    });
    assert!(sem.try_acquire().unwrap().is_some());
    assert!(
        client
            .semaphore_builder("bad")
            .limit(1)
            .max_hold(Duration::ZERO)
            .build()
            .is_err()
    );
}

/// `max_hold` counts from the grant ("renews it until `max_hold` after the grant"): a
/// permit handed over (`into_parts`) and adopted by a handle with the same `max_hold`
/// is not kept alive a whole `max_hold` more from the adoption. (It was: the hold
/// restarted at every adoption, so a permit passed on could be kept for ever.)
#[test]
fn max_hold_counts_from_the_grant_across_an_adoption() {
    let server = RedisServer::start();
    let client = client(&server);
    let build = || {
        client
            .semaphore_builder("handed-on")
            .limit(1)
            .lease(Duration::from_millis(300))
            .max_hold(Duration::from_millis(1500))
            .build()
            .unwrap()
    };
    let (giver, taker) = (build(), build());
    let granted = Instant::now();
    let p = giver.acquire().unwrap();
    // held (and renewed) for most of max_hold, then handed over
    wait_until(Duration::from_secs(5), "a second of holding", || {
        granted.elapsed() >= Duration::from_millis(1000)
    });
    assert!(!p.is_lost());
    let adopted = taker.adopt(p.into_parts()).unwrap();
    let adopted_at = Instant::now();
    // lost once the lease after max_hold (from the grant) ends: by about 1.8 s after
    // the grant, not 1.5 s + a lease after the adoption (about 2.8 s after the grant)
    let reason = adopted
        .lost()
        .recv_timeout(Duration::from_secs(10))
        .expect("lost fires");
    assert_eq!(reason, LostReason::MaxHold);
    assert!(
        adopted_at.elapsed() < Duration::from_millis(1300),
        "kept alive {:?} after the adoption, {:?} after the grant",
        adopted_at.elapsed(),
        granted.elapsed()
    );
}

#[test]
fn a_manual_refresh_after_max_hold_is_refused() {
    let server = RedisServer::start();
    let sem = client(&server)
        .semaphore_builder("manual-hold")
        .limit(1)
        .lease(Duration::from_secs(10))
        .auto_refresh(false)
        .max_hold(Duration::from_millis(50))
        .build()
        .unwrap();
    let p = sem.acquire().unwrap();
    p.refresh().unwrap_or_else(|e| {
        // the refresh may already come after 50 ms on a slow machine
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    });
    wait_until(Duration::from_secs(5), "max_hold to pass", || {
        matches!(p.refresh(), Err(Error::InvalidArgument(_)))
    });
    let msg = p.refresh().unwrap_err().to_string();
    assert!(msg.contains("max_hold"), "{msg}");
}

/// Dropping the last handle of a client (here through `into_parts`, which sends
/// nothing) while its refresher works through a tick of several batches against a hung
/// network stops the thread after the call in flight: the drop does not wait for every
/// batch of the tick, one operation timeout each.
#[test]
fn dropping_the_last_handle_mid_tick_does_not_wait_for_the_ticks_other_batches() {
    const OP: Duration = Duration::from_millis(1000);
    // scheduling on a loaded machine; well below another operation timeout
    const SLACK: Duration = Duration::from_millis(400);
    let (_server, proxy, client) = support::proxied(OP);
    let build = |name: &str, every_ms: u64| {
        client
            .semaphore_builder(name)
            .limit(1)
            .lease(Duration::from_secs(30))
            .refresh_interval(Duration::from_millis(every_ms))
            .build()
            .unwrap()
    };
    // "a" comes due first; the others come due while its renewal hangs, so the next
    // tick takes all four groups at once
    let sems = [
        build("midtick-a", 300),
        build("midtick-b", 500),
        build("midtick-c", 500),
        build("midtick-d", 500),
    ];
    let permits: Vec<Permit> = sems
        .iter()
        .map(|s| s.try_acquire().unwrap().unwrap())
        .collect();
    let base = client.stats();
    proxy.cut();
    // the first tick's one batch failed, and the second tick's first batch is in flight
    wait_until(Duration::from_secs(10), "the second tick", || {
        let s = client.stats();
        s.refresh_failed > base.refresh_failed && s.refresh_calls >= base.refresh_calls + 2
    });
    drop(sems);
    drop(client);
    let start = Instant::now();
    for p in permits {
        let _ = p.into_parts();
    }
    let took = start.elapsed();
    proxy.heal();
    assert!(
        took <= OP + SLACK,
        "dropping the last handle blocked {took:?} (operation timeout {OP:?})"
    );
}

/// Review: the refresher gave back the possible grant of a timed-out acquire (a
/// clean-up) with the whole operation timeout to wait, so against a hung server a
/// permit whose lease ran out meanwhile was declared lost only when the clean-up gave
/// up. Clean-ups wait no longer than the next deadline now, as renewals do.
#[test]
fn a_clean_up_against_a_hung_server_does_not_hold_back_a_loss() {
    const OP: Duration = Duration::from_secs(3);
    // scheduling on a loaded machine; well below the 2.5 s the clean-up would add
    const SLACK: Duration = Duration::from_millis(1000);
    let (_server, proxy, client) = support::proxied(OP);
    let sem = client
        .semaphore_builder("held-back")
        .limit(2)
        .lease(Duration::from_millis(3500))
        .auto_refresh(false)
        .build()
        .unwrap();
    let permit = sem.acquire().unwrap();
    let ends = Instant::now() + permit.lease_left();
    proxy.cut();
    // a try whose reply never comes: the grant it may have made is owed a clean-up,
    // which the refresher starts against the hung server about 0.5 s before `ends`
    let r = sem.try_acquire();
    assert!(r.as_ref().is_err_and(Error::is_timeout), "{r:?}");
    let reason = permit
        .lost()
        .recv_deadline(ends + SLACK)
        .expect("the loss by the lease's end");
    assert_eq!(reason, LostReason::Expired);
}

/// A manual `refresh()` whose reply came after the permit's deadline, when the
/// background thread had already declared it lost (`lost()` fired), returned `Ok(())`
/// while the permit stayed lost (found by a review). It now says the permit is lost.
#[test]
fn a_manual_refresh_answered_after_the_loss_was_declared_reports_the_loss() {
    let (_server, proxy, client) = support::proxied(Duration::from_secs(2));
    let sem = manual_sem(&client, "late-refresh", 1_000);
    let p = sem.try_acquire().unwrap().expect("a free permit");
    // the refresh script in the server's cache (no NOSCRIPT round trips below)
    p.refresh().unwrap();
    // the scenario's timing, not a wait for a condition: the refresh goes 150 ms
    // before the permit's deadline, and its reply comes 400 ms later
    thread::sleep(p.lease_left().saturating_sub(Duration::from_millis(150)));
    proxy.delay_replies(Duration::from_millis(400));
    let r = p.refresh();
    proxy.delay_replies(Duration::ZERO);
    assert!(p.is_lost());
    assert!(
        matches!(
            r,
            Err(Error::PermitLost {
                reason: LostReason::Expired,
                ..
            })
        ),
        "{r:?}"
    );
}

/// A release during a renewal already on its way made that renewal, answered "not
/// held", fire `lost()` and count a loss for a permit its holder had given back (found
/// by a review: `release -> Ok`, `lost() -> Reset`, `stats.lost` 0 -> 1). Nothing is
/// reported now.
#[test]
fn a_release_during_a_renewal_on_its_way_reports_no_loss() {
    let (server, proxy, client) = support::proxied(Duration::from_secs(2));
    let sem = sem(&client, "release-mid-renewal", 1, 1_000);
    // the renewal script in the server's cache: one round trip, answered within the
    // renewal's wait (the time to the permit's deadline, about half a lease)
    let refresh = support::refresh_script();
    refresh.load(&mut server.conn()).unwrap();
    proxy.delay_sent(refresh.get_hash().as_bytes(), Duration::from_millis(200));
    let p = sem.try_acquire().unwrap().expect("a free permit");
    let lost = p.lost().clone();
    wait_until(Duration::from_secs(5), "a renewal is on its way", || {
        client.stats().refresh_calls >= 1
    });
    p.release().unwrap();
    // the renewal's answer comes after the 200 ms it is held; the permit's state goes
    // with the batch after it, which ends the channel without a message
    let got = lost.recv_timeout(Duration::from_secs(3));
    assert!(got.is_err(), "lost() fired for a released permit: {got:?}");
    assert_eq!(client.stats().lost, 0);
}

/// Review (fifth session): a renewal of more than 1,000 permits goes in chunks, and a
/// chunk that failed after the ones before it had renewed their permits threw their
/// answers away: the whole batch counted as failed, so the permits the server had
/// renewed kept their old client-side deadlines. With the same chunk failing at each
/// try (a slow call cut by its deadline, say), every permit of the group was declared
/// lost at the end of its lease while the server kept renewing most of them. The
/// chunks that were answered now count: their permits are renewed (and those found
/// gone lost), and only the rest wait for the retry.
#[test]
fn a_failed_chunk_does_not_throw_away_the_renewals_of_the_chunks_before_it() {
    const HELD: usize = 1_001;
    let lease = Duration::from_millis(1_500);
    let (server, proxy, client) = support::proxied(Duration::from_millis(400));
    let sem = sem(
        &client,
        "chunked-partial",
        HELD as u32,
        lease.as_millis() as u64,
    );
    let refresh = support::refresh_script();
    refresh.load(&mut server.conn()).unwrap();
    let held: Vec<Permit> = (0..HELD)
        .map(|_| sem.try_acquire().unwrap().expect("a free permit"))
        .collect();
    // two renewals since the last grant: every permit renewed together at least once
    let calls = client.stats().refresh_calls;
    wait_until(Duration::from_secs(5), "two renewals", || {
        client.stats().refresh_calls >= calls + 2
    });
    // 1,001 permits: a chunk of 1,000 ids, then one of a single id, the only refresh
    // call of 10 elements (sha, key count, 4 keys, lease, padding, one id); that one
    // is held far past the call's wait, at every try
    let second_chunk = format!("*10\r\n$7\r\nEVALSHA\r\n$40\r\n{}", refresh.get_hash());
    proxy.delay_sent(second_chunk.as_bytes(), Duration::from_secs(3));
    let failed = client.stats().refresh_failed;
    wait_until(Duration::from_secs(5), "a renewal fails", || {
        client.stats().refresh_failed > failed
    });
    // The test is about time passing: two leases, by which every permit whose
    // renewals were all thrown away has run out by the client's clock.
    thread::sleep(lease * 2);
    let lost = held.iter().filter(|p| p.is_lost()).count();
    assert!(
        lost <= 1,
        "{lost} of {HELD} permits declared lost, though only one chunk of one id failed \
         (stats {:?})",
        client.stats()
    );
    // and those still valid are held on the server
    let on_server: HashSet<String> = sem.holders().unwrap().into_iter().map(|h| h.id).collect();
    for p in held.iter().filter(|p| !p.is_lost()) {
        assert!(on_server.contains(p.id()), "{} valid but not held", p.id());
    }
}

/// Review (sixth session): a round of the background thread renewed the groups that
/// were due when it began, one call after another, and looked at the schedule again
/// only once it had ended. A permit registered meanwhile (a grant pushed to a waiter,
/// which lasts a heartbeat until its first renewal; any permit of a short lease), or
/// a group whose period is shorter than the round, waited for the whole round: with
/// twenty semaphores due together and 100 ms per call (a round trip to a distant
/// server, or thousands of semaphores), a 900 ms lease acquired as the round began
/// was never renewed and was declared lost, though the server answered all along.
/// A round now takes the groups that come due while it runs.
#[test]
fn a_permit_due_while_a_long_round_runs_is_renewed_in_that_round() {
    const SLOW: usize = 20;
    let (server, proxy, client) = support::proxied(Duration::from_secs(2));
    let refresh = support::refresh_script();
    refresh.load(&mut server.conn()).unwrap();
    let slow_sems: Vec<Semaphore> = (0..SLOW)
        .map(|k| sem(&client, &format!("slowgrp:{k}"), 1, 6_000))
        .collect();
    let held: Vec<Permit> = slow_sems
        .iter()
        .map(|s| s.try_acquire().unwrap().expect("a free permit"))
        .collect();
    // every renewal of those semaphores takes 100 ms more (a distant server)
    proxy.delay_sent(b"{slowgrp:", Duration::from_millis(100));
    let calls = client.stats().refresh_calls;
    // their first renewals: the first round takes the group due first, the next one
    // the others, which came due meanwhile (about two seconds of calls)
    wait_until(Duration::from_secs(5), "a second round begins", || {
        client.stats().refresh_calls >= calls + 2
    });
    let quick = sem(&client, "quick", 1, 900);
    let p = quick.try_acquire().unwrap().expect("a free permit");
    // The test is about time passing: the rest of the long round, and a lease more.
    thread::sleep(Duration::from_millis(2_500));
    assert_held(&p);
    assert!(p.lease_left() > Duration::ZERO);
    for h in &held {
        assert_held(h);
    }
}

/// Review (eighth session): a renewal that failed after taking longer than its group's
/// period (a call cut by its wait, against a server path slow for that semaphore's
/// commands only) left the group's next try at the due time already past, so the
/// round took it again at once and put it first: that semaphore was tried back to
/// back, and the semaphores of the round behind it, whose server answered at once,
/// were renewed only when a try's wait, bounded by their deadline, ended just before
/// it (about 40 ms before, on an idle machine; on a busy one, after it: declared
/// lost). A failed renewal is tried again a retry's delay after it failed, behind the
/// rest of the round, and the others are renewed about once per slow try.
#[test]
fn a_semaphore_whose_renewals_fail_slowly_does_not_starve_the_others_renewals() {
    // (which groups a round takes first goes by a hash map's order: with three slow
    // semaphores among eleven, some healthy one comes after a slow one but about once
    // in 165 runs, and it was that one that starved)
    const SLOW: usize = 3;
    const HEALTHY: usize = 8;
    const EVERY: Duration = Duration::from_millis(250);
    let lease = Duration::from_secs(3);
    // each renewal of a slow semaphore waits at most this long (a healthy round
    // trip takes a few ms): longer than its period, well within the others' lease
    let (server, proxy, client) = support::proxied(Duration::from_millis(600));
    let refresh = support::refresh_script();
    refresh.load(&mut server.conn()).unwrap();
    let build = |name: &str, lease: Duration| {
        client
            .semaphore_builder(name)
            .limit(1)
            .lease(lease)
            .refresh_interval(EVERY)
            .build()
            .unwrap()
    };
    // (a long lease: its renewals keep failing while the others' leases come and go,
    // and its deadline is not the one the calls' waits end by)
    let slow: Vec<Semaphore> = (0..SLOW)
        .map(|k| build(&format!("lagging-{k}"), Duration::from_secs(60)))
        .collect();
    let lagging: Vec<Permit> = slow
        .iter()
        .map(|s| s.try_acquire().unwrap().expect("a free permit"))
        .collect();
    let healthy: Vec<Semaphore> = (0..HEALTHY)
        .map(|k| build(&format!("healthy-{k}"), lease))
        .collect();
    let held: Vec<Permit> = healthy
        .iter()
        .map(|s| s.try_acquire().unwrap().expect("a free permit"))
        .collect();
    // every command about the slow semaphores is held far past a renewal's wait
    proxy.delay_sent(b"{lagging-", Duration::from_secs(10));
    let failed = client.stats().refresh_failed;
    wait_until(
        Duration::from_secs(5),
        "a renewal of a slow one fails",
        || client.stats().refresh_failed > failed,
    );
    // The test is about time passing: three leases of the healthy semaphores, looking
    // at what is left of their leases all along. Renewed about once per slow try
    // (600 ms at most, and a period), they keep about two seconds; starved, they
    // came down to the last tens of milliseconds, or ran out.
    let end = Instant::now() + lease * 3;
    let mut least = lease;
    while Instant::now() < end {
        for p in &held {
            assert_held(p);
            least = least.min(p.lease_left());
        }
        thread::sleep(Duration::from_millis(5));
    }
    let stats = client.stats();
    assert!(
        least >= lease / 3,
        "a healthy semaphore's permit came down to {least:?} of its {lease:?} lease \
         (its renewals waited behind the slow ones'): {stats:?}"
    );
    assert!(
        stats.refresh_failed >= failed + 3,
        "the slow semaphores' renewals kept failing: {stats:?}"
    );
    for p in &lagging {
        assert_held(p);
    }
    for (s, p) in healthy.iter().zip(&held) {
        assert_held(p);
        let on_server: Vec<String> = s.holders().unwrap().into_iter().map(|h| h.id).collect();
        assert_eq!(on_server, vec![p.id().to_string()]);
    }
    assert_eq!(stats.lost, 0, "{stats:?}");
}

/// Review (eighth session): the refresh script moved the keys' expiry ('exp' and
/// the TTLs) to a lease and its padding past the call also when it renewed nothing
/// (every id gone: released, force-released, expired while its client could not
/// reach the server), so the keys outlived their use by up to that lease, more than
/// the padding K1 allows (common.lua). A refresh that renews nothing leaves the
/// expiry as it was.
#[test]
fn a_refresh_that_renews_nothing_leaves_the_keys_expiry_as_it_was() {
    let server = RedisServer::start();
    let client = client(&server);
    let sem = manual_sem(&client, "nothing-renewed", 1_500);
    let _held = sem.try_acquire().unwrap().expect("a free permit");
    let mut conn = server.conn();
    let pttls = |conn: &mut redis::Connection| -> Vec<i64> {
        ["h", "i", "s"]
            .iter()
            .map(|part| {
                redis::cmd("PTTL")
                    .arg(format!("redsem:{{nothing-renewed}}:{part}"))
                    .query(conn)
                    .unwrap()
            })
            .collect()
    };
    let exp = |conn: &mut redis::Connection| -> i64 {
        redis::cmd("HGET")
            .arg("redsem:{nothing-renewed}:i")
            .arg("exp")
            .query(conn)
            .unwrap()
    };
    let (before, exp_before) = (pttls(&mut conn), exp(&mut conn));
    assert!(before.iter().all(|&t| t > 0), "{before:?}");
    // a renewal, of a long lease, of a permit the semaphore no longer has
    let gone = "0e8400e2-9b1d-41d4-a716-446655440000";
    let reply: Vec<String> = support::call_on(&support::refresh_script(), "nothing-renewed")
        .arg(60_000)
        .arg(1_000)
        .arg(gone)
        .invoke(&mut conn)
        .unwrap();
    assert_eq!(reply, vec!["0".to_string(), gone.to_string()]);
    let after = pttls(&mut conn);
    assert!(
        after.iter().zip(&before).all(|(a, b)| a <= b),
        "the keys' TTLs went from {before:?} to {after:?} ms"
    );
    assert_eq!(exp(&mut conn), exp_before);
}

/// The refresh calls the server received while `f` ran (`MONITOR`, on a connection of
/// its own): for each, the server's time in seconds and the semaphore it renewed
/// (the name in the keys' hash tag), oldest first.
fn monitored_refreshes(server: &RedisServer, f: impl FnOnce()) -> Vec<(f64, String)> {
    let sha = support::refresh_script().get_hash().to_owned();
    let mut conn = server.conn();
    conn.send_packed_command(&redis::cmd("MONITOR").get_packed_command())
        .unwrap();
    let ok = conn.recv_response().unwrap();
    assert!(matches!(ok, redis::Value::Okay), "{ok:?}");
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(1);
    let reader = thread::spawn(move || {
        // (a test's own connection: a plain socket timeout, to look for the stop)
        #[allow(clippy::disallowed_methods)]
        conn.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut lines = Vec::new();
        while stop_rx.try_recv().is_err() {
            match conn.recv_response() {
                Ok(redis::Value::SimpleString(line)) => lines.push(line),
                Ok(other) => panic!("unexpected from MONITOR: {other:?}"),
                Err(e) if e.is_timeout() => {}
                Err(e) => panic!("MONITOR failed: {e}"),
            }
        }
        lines
    });
    f();
    stop_tx.send(()).unwrap();
    let lines = reader.join().unwrap();
    lines
        .iter()
        .filter(|l| {
            l.to_ascii_lowercase()
                .contains(&format!("\"evalsha\" \"{sha}\""))
        })
        .map(|l| {
            let at: f64 = l.split(' ').next().unwrap().parse().unwrap();
            let name = l.split('{').nth(1).unwrap().split('}').next().unwrap();
            (at, name.to_owned())
        })
        .collect()
}

/// Review (eighth session): when a round of the background thread outlasted a
/// group's period (a slow server, many semaphores), the look for what came due
/// between its calls took the group again while the batch the round had taken of it
/// was still queued, not yet sent, and put the new batch first: the groups taken
/// again and again kept the round's first place, renewed once per period or more,
/// while the batches queued behind them were never sent (here, with eight semaphores
/// renewed every 300 ms through a server 60 ms away, three of the eight were not
/// renewed at all in four seconds; with their usual lease of three periods, lost).
/// A group whose batch is queued is not taken again until the batch is settled; its
/// batch moves up instead, and what came due goes the earliest deadline first: each
/// semaphore has its turn, and no renewal follows another of its semaphore within
/// a third of a period.
#[test]
fn a_round_longer_than_a_period_renews_each_semaphore_in_turn_and_once_at_a_time() {
    const SEMS: usize = 8;
    const EVERY: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    let proxy = support::Proxy::start(server.port());
    let client = Client::builder()
        .operation_timeout(Duration::from_secs(2))
        .build(proxy.url())
        .unwrap();
    let names: Vec<String> = (0..SEMS).map(|k| format!("bunch-{k}")).collect();
    let sems: Vec<Semaphore> = names
        .iter()
        .map(|name| {
            client
                .semaphore_builder(name)
                .limit(1)
                // (long: the test is about the order of the renewals, not the leases)
                .lease(Duration::from_secs(60))
                .refresh_interval(EVERY)
                .build()
                .unwrap()
        })
        .collect();
    let held: Vec<Permit> = sems
        .iter()
        .map(|s| s.try_acquire().unwrap().expect("a free permit"))
        .collect();
    // every round trip takes 60 ms or more: a round of the eight, 480 ms or more,
    // outlasts their period
    proxy.delay_replies(Duration::from_millis(60));
    // The test is about time passing: a few rounds, watched by the server.
    let seen = monitored_refreshes(&server, || thread::sleep(Duration::from_secs(4)));
    let stats = client.stats();
    assert!(seen.len() >= 16, "{} renewals seen: {stats:?}", seen.len());
    let counts: Vec<usize> = names
        .iter()
        .map(|n| seen.iter().filter(|(_, s)| s == n).count())
        .collect();
    eprintln!("renewals per semaphore: {counts:?}");
    // (in turn, each has about an eighth of the calls)
    assert!(
        counts.iter().all(|&c| c * 2 * SEMS >= seen.len()),
        "renewals per semaphore {counts:?} of {}: some waited behind the others",
        seen.len()
    );
    let mut last: std::collections::HashMap<&str, f64> = std::collections::HashMap::new();
    let mut bunched = Vec::new();
    for (at, name) in &seen {
        if let Some(before) = last.insert(name, *at)
            && at - before < EVERY.as_secs_f64() / 3.0
        {
            bunched.push(format!("{name} {:.0} ms apart", (at - before) * 1e3));
        }
    }
    assert!(
        bunched.is_empty(),
        "renewed again well within a period: {bunched:?} ({} renewals seen)",
        seen.len()
    );
    for p in &held {
        assert_held(p);
    }
    assert_eq!(client.stats().lost, 0);
}
