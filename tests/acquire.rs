//! The core protocol against a private redis-server: limits, slots, tokens, bad input.

mod support;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::Duration;

use redis_semaphore::{Client, Error, Permit, Semaphore};
use support::{
    RedisServer, acquire_script, batch_script, batch_try_many, call_on, set_maxmemory, wait_until,
};

fn client(server: &RedisServer) -> Client {
    Client::open(server.url()).unwrap()
}

#[test]
fn never_over_the_limit_with_32_threads_sharing_one_semaphore() {
    let server = RedisServer::start();
    let sem = client(&server).semaphore("shared", 5).unwrap();
    let inside = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let tokens = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..32)
        .map(|_| {
            let (sem, inside, most, tokens) =
                (sem.clone(), inside.clone(), most.clone(), tokens.clone());
            thread::spawn(move || {
                for _ in 0..20 {
                    let p = sem.acquire().unwrap();
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    assert!(p.slots()[0] < 5);
                    tokens.lock().push((p.id().to_owned(), p.token()));
                    thread::yield_now();
                    inside.fetch_sub(1, Ordering::SeqCst);
                    p.release().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 5, "{most} holders at once");
    assert!(most >= 2, "the test never had concurrent holders");
    let tokens = tokens.lock();
    assert_eq!(tokens.len(), 640);
    let ids: HashSet<_> = tokens.iter().map(|(id, _)| id).collect();
    let toks: HashSet<_> = tokens.iter().map(|(_, t)| t).collect();
    assert_eq!(ids.len(), 640, "two acquires shared a permit id");
    assert_eq!(toks.len(), 640, "two grants shared a token");
    assert_eq!(sem.available().unwrap(), 5);
}

#[test]
fn tokens_strictly_increase_in_grant_order() {
    let server = RedisServer::start();
    let a = client(&server).semaphore("tok", 2).unwrap();
    let b = client(&server).semaphore("tok", 2).unwrap();
    let mut last = 0;
    for i in 0..50 {
        let sem = if i % 2 == 0 { &a } else { &b };
        let p = sem.acquire().unwrap();
        assert!(p.token() > last, "token {} after {last}", p.token());
        last = p.token();
    }
}

#[test]
fn three_holders_take_slots_0_1_2_and_a_freed_slot_is_reused_first() {
    let server = RedisServer::start();
    let sem = client(&server).semaphore("slots", 3).unwrap();
    let p0 = sem.acquire().unwrap();
    let p1 = sem.acquire().unwrap();
    let p2 = sem.acquire().unwrap();
    assert_eq!([p0.slots(), p1.slots(), p2.slots()], [&[0][..], &[1], &[2]]);
    assert!(sem.try_acquire().unwrap().is_none());
    p1.release().unwrap();
    let again = sem.try_acquire().unwrap().unwrap();
    assert_eq!(again.slots(), &[1]);
    drop((p0, p2, again));
    let many = sem.acquire_many(3).unwrap();
    assert_eq!(many.slots(), &[0, 1, 2]);
    assert_eq!(many.permits(), 3);
}

#[test]
fn multi_permit_grants_count_against_the_limit() {
    let server = RedisServer::start();
    let sem = client(&server).semaphore("many", 5).unwrap();
    let three = sem.try_acquire_many(3).unwrap().unwrap();
    assert_eq!(sem.available().unwrap(), 2);
    assert!(sem.try_acquire_many(3).unwrap().is_none());
    let two = sem.try_acquire_many(2).unwrap().unwrap();
    assert_eq!(sem.available().unwrap(), 0);
    drop(three);
    assert_eq!(sem.available().unwrap(), 3);
    drop(two);
    assert_eq!(sem.available().unwrap(), 5);
}

#[test]
fn acquire_timeout_gives_none_at_its_deadline() {
    let server = RedisServer::start();
    let sem = client(&server).semaphore("full", 1).unwrap();
    let _held = sem.acquire().unwrap();
    let started = std::time::Instant::now();
    assert!(
        sem.acquire_timeout(Duration::from_millis(100))
            .unwrap()
            .is_none()
    );
    assert!(started.elapsed() >= Duration::from_millis(100));
    assert!(
        sem.acquire_many_timeout(1, Duration::ZERO)
            .unwrap()
            .is_none()
    );
}

#[test]
fn a_blocked_acquire_gets_the_permit_when_it_is_released() {
    let server = RedisServer::start();
    let sem = client(&server).semaphore("handoff", 1).unwrap();
    let held = sem.acquire().unwrap();
    let waiter = {
        let sem = sem.clone();
        thread::spawn(move || sem.acquire().map(|p| p.token()))
    };
    wait_until(Duration::from_secs(5), "waiter is blocked", || {
        !waiter.is_finished()
    });
    let first = held.token();
    held.release().unwrap();
    let token = waiter.join().unwrap().unwrap();
    assert!(token > first);
}

#[test]
fn introspection_reports_holders_and_limits() {
    let server = RedisServer::start();
    let sem = client(&server).semaphore("intro", 4).unwrap();
    assert_eq!(sem.limit().unwrap(), 4);
    assert_eq!(sem.available().unwrap(), 4);
    assert!(sem.holders().unwrap().is_empty());
    let p = sem.acquire_many(2).unwrap();
    let holders = sem.holders().unwrap();
    assert_eq!(holders.len(), 1);
    let h = &holders[0];
    assert_eq!(h.id, p.id());
    assert_eq!(h.permits, 2);
    assert_eq!(h.token, p.token());
    assert_eq!(h.slots, p.slots());
    assert_eq!(h.pid, std::process::id());
    assert!(!h.host.is_empty());
    assert!(h.lease_left > Duration::from_secs(5) && h.lease_left <= Duration::from_secs(10));
    let age = std::time::SystemTime::now()
        .duration_since(h.acquired_at)
        .unwrap_or_default();
    assert!(
        age < Duration::from_secs(60),
        "acquired_at is off by {age:?}"
    );
}

/// `status_and_holders` reads both in one round trip (the CLI's `status` read them in
/// two, which could show a holder count and a holder list of different instants).
#[test]
fn status_and_holders_are_one_read_of_one_instant() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let sem = client(&server).semaphore("snapshot", 4).unwrap();
    let a = sem.acquire_many(2).unwrap();
    let b = sem.acquire().unwrap();
    let status = sem.status().unwrap(); // (loads the script)
    let before = support::command_calls(&mut conn);
    let both = sem.status_and_holders().unwrap();
    let after = support::command_calls(&mut conn);
    let holders = &both.1;
    let scripts = |m: &std::collections::HashMap<String, u64>| -> u64 {
        ["evalsha", "eval"].iter().filter_map(|c| m.get(*c)).sum()
    };
    assert_eq!(scripts(&after) - scripts(&before), 1, "one script call");
    assert_eq!(status, both.0);
    assert_eq!((status.held, status.available), (3, 1));
    let held: u32 = holders.iter().map(|h| h.permits).sum();
    assert_eq!(held, status.held);
    let mut ids: Vec<&str> = holders.iter().map(|h| h.id.as_str()).collect();
    ids.sort_unstable();
    let mut want = vec![a.id(), b.id()];
    want.sort_unstable();
    assert_eq!(ids, want);
}

/// More holders whose leases have ended than one call may purge (MAX_PURGE, 512: a
/// crashed fleet of workers on a semaphore with a large limit): a status read purged
/// 512 of them and reported the rest as held, and `holders()` listed them with no
/// lease left, although `Status::held` and `holders()` promise unexpired holders only
/// and the next acquire takes their permits (here: `available()` said 912 of 1000
/// after 600 leases had all ended, `held` 88, and 88 holders were listed). The leases
/// end as time passing would end them: their deadlines in h are moved to the past and
/// 'mind' with them (K3), no sleeping.
#[test]
fn holders_whose_leases_ended_beyond_the_purge_budget_are_not_reported() {
    let server = RedisServer::start();
    let client = client(&server);
    let mut conn = server.conn();
    // every lease of semaphore `name` ends now, as far as the server can tell
    let end_all = |conn: &mut redis::Connection, name: &str, permits: &[Permit]| {
        let mut pipe = redis::pipe();
        for p in permits {
            pipe.cmd("ZADD")
                .arg(format!("redsem:{{{name}}}:h"))
                .arg("XX")
                .arg(1)
                .arg(p.id())
                .ignore();
        }
        pipe.cmd("HSET")
            .arg(format!("redsem:{{{name}}}:i"))
            .arg("mind")
            .arg(1)
            .ignore();
        let _: () = pipe.query(conn).unwrap();
    };
    let held = |name: &str| {
        let sem = client
            .semaphore_builder(name)
            .limit(1000)
            .lease(Duration::from_secs(60))
            .auto_refresh(false)
            .build()
            .unwrap();
        let permits: Vec<Permit> = (0..600)
            .map(|_| sem.try_acquire().unwrap().expect("a free permit"))
            .collect();
        (sem, permits)
    };

    // the counts alone
    let (sem, permits) = held("ended-counts");
    end_all(&mut conn, "ended-counts", &permits);
    let status = sem.status().unwrap();
    assert_eq!(
        (status.held, status.available),
        (0, 1000),
        "every lease has ended"
    );
    drop(permits);

    // with the holders
    let (sem, permits) = held("ended-holders");
    end_all(&mut conn, "ended-holders", &permits);
    let (status, holders) = sem.status_and_holders().unwrap();
    assert_eq!(status.held, 0, "every lease has ended");
    assert!(
        holders.is_empty(),
        "{} holders listed whose leases have ended",
        holders.len()
    );
    // and what is left to purge is taken by the next acquire: all of it can be had
    let all = sem.try_acquire_many(1000).unwrap();
    assert!(all.is_some(), "the permits of ended leases can be had");
    drop(permits);
}

#[test]
fn a_stored_limit_wins_for_every_client() {
    let server = RedisServer::start();
    let a = client(&server).semaphore("lim", 2).unwrap();
    let b = client(&server).semaphore("lim", 3).unwrap();
    assert_eq!(a.limit().unwrap(), 2);
    assert_eq!(b.limit().unwrap(), 3);
    a.set_limit(1).unwrap();
    assert_eq!(a.limit().unwrap(), 1);
    assert_eq!(b.limit().unwrap(), 1);
    let held = b.acquire().unwrap();
    assert!(b.try_acquire().unwrap().is_none());
    assert!(a.try_acquire().unwrap().is_none());
    b.set_limit(2).unwrap();
    let second = a.try_acquire().unwrap().unwrap();
    assert_eq!(second.slots(), &[1]);
    drop(held);
    // lowering below what is held takes nothing away, and grants wait until it fits
    a.set_limit(1).unwrap();
    let c = b.try_acquire();
    assert!(c.unwrap().is_none());
    assert_eq!(a.available().unwrap(), 0);
    assert!(!second.is_lost());
}

#[test]
fn force_release_frees_the_permit_and_release_then_reports_it_lost() {
    let server = RedisServer::start();
    let sem = client(&server).semaphore("force", 1).unwrap();
    let p = sem.acquire().unwrap();
    assert!(sem.force_release(p.id()).unwrap());
    assert!(!sem.force_release(p.id()).unwrap());
    let other = sem.try_acquire().unwrap().unwrap();
    match p.release() {
        Err(Error::PermitLost { .. }) => {}
        other => panic!("expected PermitLost, got {other:?}"),
    }
    assert_eq!(sem.holders().unwrap().len(), 1);
    drop(other);
}

#[test]
fn releasing_after_the_lease_ended_says_so() {
    let server = RedisServer::start();
    let sem = client(&server)
        .semaphore_builder("late")
        .limit(1)
        .lease(Duration::from_millis(50))
        .auto_refresh(false)
        .build()
        .unwrap();
    let p = sem.acquire().unwrap();
    // the holder stays in Redis (nobody purged it) but its deadline has passed: by the
    // client's clock (which counts from before the call, so it ends first) and then by
    // the server's
    wait_until(Duration::from_secs(5), "lease ends", || p.is_lost());
    wait_past_server_deadline(&mut server.conn(), "late", p.id());
    match p.release() {
        Err(Error::LeaseExpired { .. }) | Err(Error::PermitLost { .. }) => {}
        other => panic!("expected an expired lease, got {other:?}"),
    }
    assert_eq!(sem.available().unwrap(), 1);
}

#[test]
fn an_expired_holder_is_purged_and_its_slot_reused() {
    let server = RedisServer::start();
    let sem = client(&server)
        .semaphore_builder("expire")
        .limit(1)
        .lease(Duration::from_millis(100))
        .auto_refresh(false)
        .build()
        .unwrap();
    let old = sem.acquire().unwrap();
    let new = sem
        .acquire_timeout(Duration::from_secs(5))
        .unwrap()
        .unwrap();
    assert_eq!(new.slots(), old.slots());
    assert!(new.token() > old.token());
    assert!(matches!(old.release(), Err(Error::PermitLost { .. })));
}

#[test]
fn bad_input_is_an_error_before_any_network_call() {
    // nothing listens on this port: any network call would fail differently
    let client = Client::builder()
        .checkout_timeout(Duration::from_millis(200))
        .build("redis://127.0.0.1:1/")
        .unwrap();
    let invalid = |r: Result<Semaphore, Error>| matches!(r, Err(Error::InvalidArgument(_)));
    assert!(invalid(client.semaphore("", 5)));
    assert!(invalid(client.semaphore("a{b", 5)));
    assert!(invalid(client.semaphore("a}b", 5)));
    assert!(invalid(client.semaphore("jobs", 0)));
    assert!(invalid(client.semaphore_builder("jobs").build()));
    assert!(invalid(
        client
            .semaphore_builder("jobs")
            .limit(1)
            .lease(Duration::ZERO)
            .build()
    ));
    assert!(invalid(
        client
            .semaphore_builder("jobs")
            .limit(1)
            .lease(Duration::from_micros(10))
            .build()
    ));
    assert!(invalid(
        client
            .semaphore_builder("jobs")
            .limit(1)
            .lease(Duration::from_secs(1))
            .refresh_interval(Duration::from_secs(1))
            .build()
    ));
    // too short to be renewed by the keepalive; fine when nothing renews it
    assert!(invalid(
        client
            .semaphore_builder("jobs")
            .limit(1)
            .lease(Duration::from_millis(1))
            .build()
    ));
    assert!(
        client
            .semaphore_builder("jobs")
            .limit(1)
            .lease(Duration::from_millis(1))
            .auto_refresh(false)
            .build()
            .is_ok()
    );
    let sem = client.semaphore("jobs", 5).unwrap();
    let invalid_permit =
        |r: Result<Option<Permit>, Error>| matches!(r, Err(Error::InvalidArgument(_)));
    assert!(invalid_permit(sem.try_acquire_many(0)));
    assert!(invalid_permit(
        sem.acquire_many_timeout(0, Duration::from_secs(1))
    ));
    assert!(matches!(
        sem.acquire_many(0),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        sem.acquire_many(6),
        Err(Error::PermitsExceedLimit {
            requested: 6,
            limit: 5,
            ..
        })
    ));
    assert!(matches!(
        sem.try_acquire_many(6),
        Err(Error::PermitsExceedLimit { .. })
    ));
    assert!(matches!(sem.set_limit(0), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        sem.force_release(""),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        Client::builder()
            .max_connections(0)
            .build("redis://127.0.0.1/"),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        Client::builder()
            .operation_timeout(Duration::ZERO)
            .build("redis://127.0.0.1/"),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        Client::builder()
            .connect_timeout(Duration::ZERO)
            .build("redis://127.0.0.1/"),
        Err(Error::InvalidArgument(_))
    ));
    assert!(Client::open("not a url").is_err());
}

#[test]
fn more_permits_than_a_stored_limit_is_an_error_not_a_wait() {
    let server = RedisServer::start();
    let sem = client(&server).semaphore("stored", 5).unwrap();
    sem.set_limit(2).unwrap();
    assert!(matches!(
        sem.acquire_many(3),
        Err(Error::PermitsExceedLimit {
            requested: 3,
            limit: 2,
            ..
        })
    ));
}

/// A stored limit above the handle's own allows acquires up to it (it takes
/// precedence, DESIGN): the handle used to refuse every count above its own limit
/// before any call, even right after its own `set_limit` raised it and while
/// `limit()` said the higher one. Another handle learns it from a status read; until
/// then its own limit is all it knows, and a count above every limit it knows is
/// still refused before any call.
#[test]
fn a_stored_limit_above_the_handle_s_own_allows_acquires_up_to_it() {
    let server = RedisServer::start();
    let sem = client(&server).semaphore("raised", 2).unwrap();
    sem.set_limit(5).unwrap();
    let three = sem.try_acquire_many(3).unwrap().expect("3 of the stored 5");
    assert_eq!(three.slots(), &[0, 1, 2]);
    let two = sem
        .acquire_many_timeout(2, Duration::from_millis(100))
        .unwrap()
        .expect("the other 2");
    assert!(matches!(
        sem.try_acquire_many(6),
        Err(Error::PermitsExceedLimit {
            requested: 6,
            limit: 5,
            ..
        })
    ));
    drop((three, two));

    let other = client(&server).semaphore("raised", 2).unwrap();
    assert!(matches!(
        other.try_acquire_many(4),
        Err(Error::PermitsExceedLimit { limit: 2, .. })
    ));
    assert_eq!(other.limit().unwrap(), 5);
    let four = other.acquire_many(4).unwrap();
    assert_eq!(four.permits(), 4);
    drop(four);

    // lowered: the scripts refuse what the stored limit no longer allows
    other.set_limit(3).unwrap();
    assert!(matches!(
        sem.try_acquire_many(4),
        Err(Error::PermitsExceedLimit {
            requested: 4,
            limit: 3,
            ..
        })
    ));
}

#[test]
fn an_unreachable_server_is_an_error_not_a_panic() {
    let client = Client::builder()
        .checkout_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(100))
        .build("redis://127.0.0.1:1/")
        .unwrap();
    let sem = client.semaphore("nowhere", 1).unwrap();
    // the checkout times out; the error says why: the address cannot be reached
    for e in [sem.try_acquire().unwrap_err(), sem.acquire().unwrap_err()] {
        assert!(
            matches!(&e, Error::Connect { addr, .. } if addr == "127.0.0.1:1"),
            "{e:?}"
        );
        assert!(e.is_retryable(), "{e:?}");
    }
    assert!(sem.available().is_err());
}

/// A key overwritten with another type (by another program writing under the
/// semaphore's key names) is an error that names the key (DESIGN invariant 13), not a
/// loss to repair: every call that reads it fails with `Error::WrongType` and writes
/// nothing, so the holder keeps its permit and slot and nobody else is granted one.
/// It used to be repaired as a partial loss, which dropped the holder while its
/// `Permit` still said it was valid and gave its slot to the next caller: two valid
/// permits on one slot. Once the key is deleted it is a partial loss: the next call
/// rebuilds a safe state, keeping a stored limit when the hash is readable. The queue
/// key while nobody queues is the exception (see
/// `the_queue_key_replaced_while_nobody_queues_loses_no_holder`).
#[test]
fn a_key_of_another_type_is_an_error_that_writes_nothing_until_it_is_deleted() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    for (suffix, kind) in [("h", "string"), ("i", "list"), ("s", "set")] {
        let name = format!("typed-{suffix}");
        let sem = client(&server).semaphore(&name, 2).unwrap();
        sem.set_limit(3).unwrap();
        let held = sem.try_acquire().unwrap().unwrap();
        let key = format!("redsem:{{{name}}}:{suffix}");
        redis::cmd("DEL").arg(&key).exec(&mut conn).unwrap();
        let (command, ty) = match kind {
            "string" => ("SET", "string"),
            "list" => ("RPUSH", "list"),
            _ => ("SADD", "set"),
        };
        redis::cmd(command)
            .arg(&key)
            .arg("theirs")
            .exec(&mut conn)
            .unwrap();
        let dump = |conn: &mut redis::Connection| -> Vec<Option<Vec<u8>>> {
            ["h", "i", "s", "q"]
                .iter()
                .map(|part| {
                    redis::cmd("DUMP")
                        .arg(format!("redsem:{{{name}}}:{part}"))
                        .query(conn)
                        .unwrap()
                })
                .collect()
        };
        let before = dump(&mut conn);
        let other = client(&server).semaphore(&name, 2).unwrap();
        type Call<'a> = (&'static str, Box<dyn Fn() -> Result<(), Error> + 'a>);
        let tries: [Call; 4] = [
            ("try_acquire", Box::new(|| other.try_acquire().map(drop))),
            ("status", Box::new(|| sem.status().map(drop))),
            ("refresh", Box::new(|| held.refresh())),
            (
                "acquire_timeout",
                Box::new(|| other.acquire_timeout(Duration::from_millis(50)).map(drop)),
            ),
        ];
        for (what, call) in tries {
            match call() {
                Err(e @ Error::WrongType { .. }) => {
                    let Error::WrongType { name: n, source } = &e else {
                        unreachable!()
                    };
                    assert_eq!(n, &name, "{suffix} {what}");
                    assert!(
                        source.to_string().contains(&key),
                        "{suffix} {what}: the error names the key: {source}"
                    );
                    // the message names the key, without the script's sha and line
                    // that Redis appends, and ends without a full stop (STYLE)
                    let msg = e.to_string();
                    assert!(
                        msg.contains(&key)
                            && !msg.contains("script:")
                            && !msg.contains("@user_script")
                            && !msg.ends_with('.'),
                        "{suffix} {what}: {msg}"
                    );
                }
                other => panic!("{suffix} {what}: {other:?}"),
            }
        }
        assert_eq!(dump(&mut conn), before, "{suffix}: nothing was written");
        let t: String = redis::cmd("TYPE").arg(&key).query(&mut conn).unwrap();
        assert_eq!(t, ty, "{key}: the other program's value stays");
        assert!(!held.is_lost(), "{suffix}: the holder keeps its permit");

        // deleted: a partial loss, which the next call repairs
        redis::cmd("DEL").arg(&key).exec(&mut conn).unwrap();
        let p = sem.try_acquire().unwrap().expect("repaired and granted");
        assert_eq!(
            p.slots(),
            &[0],
            "{suffix}: the dropped holder's slot is free again"
        );
        let status = sem.status().unwrap();
        assert_eq!(status.held, 1, "{suffix}");
        let expected_limit = if suffix == "i" { 2 } else { 3 };
        assert_eq!(
            status.limit, expected_limit,
            "{suffix}: the stored limit survives while the hash does"
        );
        for (part, ty) in [("h", "zset"), ("i", "hash"), ("s", "string")] {
            let k = format!("redsem:{{{name}}}:{part}");
            let t: String = redis::cmd("TYPE").arg(&k).query(&mut conn).unwrap();
            assert_eq!(t, ty, "{k}");
            let ttl: i64 = redis::cmd("PTTL").arg(&k).query(&mut conn).unwrap();
            assert!(ttl > 0, "{k} has no TTL: {ttl}");
        }
        // the dropped holder learns it at its next renewal
        assert!(
            matches!(held.refresh(), Err(Error::PermitLost { .. })),
            "{suffix}"
        );
        assert!(held.is_lost());
    }
}

/// The queue key exists only while someone queues. One found while nobody queues (made
/// by hand here, or left by an older version) is not needed and is no loss: the fast
/// grant and release do not read it, the next call of the full logic (here the status
/// read) deletes it, and no holder is dropped. Before, any change to it was partial
/// loss, and the repair dropped every holder.
#[test]
fn the_queue_key_replaced_while_nobody_queues_loses_no_holder() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let sem = client(&server).semaphore("typed-q", 3).unwrap();
    let held = sem.try_acquire().unwrap().unwrap();
    let q = "redsem:{typed-q}:q";
    let t: String = redis::cmd("TYPE").arg(q).query(&mut conn).unwrap();
    assert_eq!(t, "none", "a grant makes no queue key");
    redis::cmd("SET").arg(q).arg("x").exec(&mut conn).unwrap();
    let p = sem.try_acquire().unwrap().expect("granted");
    assert_eq!(p.slots(), &[1], "the holder of slot 0 keeps it");
    p.release().unwrap();
    let status = sem.status().unwrap();
    assert_eq!(status.held, 1);
    let t: String = redis::cmd("TYPE").arg(q).query(&mut conn).unwrap();
    assert_eq!(t, "none", "deleted by the status read");
    held.refresh().unwrap();
    assert!(!held.is_lost());
    // the semaphore still counts its holder
    let other = client(&server).semaphore("typed-q", 3).unwrap();
    let (a, b) = (sem.try_acquire().unwrap(), sem.try_acquire().unwrap());
    assert!(a.is_some() && b.is_some());
    assert!(
        other
            .acquire_timeout(Duration::from_millis(50))
            .unwrap()
            .is_none()
    );
    drop((a, b, held));
}

#[test]
fn every_key_has_a_ttl_and_an_idle_semaphore_leaves_none() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let sem = client(&server)
        .semaphore_builder("ttl")
        .limit(3)
        .lease(Duration::from_millis(300))
        .build()
        .unwrap();
    let a = sem.acquire().unwrap();
    let b = sem.acquire_many(2).unwrap();
    let keys = support::keys(&mut conn, "*");
    assert_eq!(keys.len(), 3, "h, i, s; no queue key: {keys:?}");
    for key in &keys {
        let ttl: i64 = redis::cmd("PTTL").arg(key).query(&mut conn).unwrap();
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
    }
    drop((a, b));
    wait_until(Duration::from_secs(5), "keys expire", || {
        support::keys(&mut conn, "*").is_empty()
    });
}

#[test]
fn acquire_and_release_are_one_command_each_on_the_server() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let sem = client(&server).semaphore("rtt", 5).unwrap();
    drop(sem.acquire().unwrap()); // loads the scripts, opens the connection
    for _ in 0..3 {
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .exec(&mut conn)
            .unwrap();
        let p = sem.try_acquire().unwrap().unwrap();
        let after_acquire = support::command_calls(&mut conn);
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .exec(&mut conn)
            .unwrap();
        p.release().unwrap();
        let after_release = support::command_calls(&mut conn);
        for stats in [after_acquire, after_release] {
            assert_eq!(stats.get("evalsha"), Some(&1), "{stats:?}");
            for extra in ["ping", "eval", "script", "multi", "exec", "watch"] {
                assert!(!stats.contains_key(extra), "{extra} was sent: {stats:?}");
            }
        }
    }
}

#[test]
fn an_acquire_script_run_twice_with_the_same_id_grants_once() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let script = acquire_script();
    let run = |conn: &mut redis::Connection, id: &str| -> Vec<i64> {
        let reply: redis::Value = script
            .key("redsem:{twice}:h")
            .key("redsem:{twice}:i")
            .key("redsem:{twice}:s")
            .key("redsem:{twice}:q")
            .arg(id)
            .arg(1)
            .arg(3)
            .arg(10_000)
            .arg(1000)
            .arg(1000)
            .arg("1|test|")
            .arg("t")
            .arg("1")
            .arg("")
            .arg("0")
            .invoke(conn)
            .unwrap();
        support::acquire_reply(&reply)
    };
    let first = run(&mut conn, "aaaaaaaa-0000-4000-8000-000000000001");
    let second = run(&mut conn, "aaaaaaaa-0000-4000-8000-000000000001");
    assert_eq!(first[0], 1);
    // {1, now, token, deadline, slot...}: all but the server's time are the same
    assert_eq!(
        first[2..],
        second[2..],
        "the repeat must return the first grant"
    );
    let sem = client(&server).semaphore("twice", 3).unwrap();
    assert_eq!(sem.available().unwrap(), 2);
    assert_eq!(sem.holders().unwrap().len(), 1);
}

/// Appends a one-permit try-acquire of `id` to a batch call.
fn batch_try(inv: &mut redis::ScriptInvocation<'_>, id: &str, limit: u32, lease_ms: u64) {
    batch_try_many(inv, id, 1, limit, lease_ms);
}

/// Waits until the Redis server's clock is past the lease deadline of holder `id`.
fn wait_past_server_deadline(conn: &mut redis::Connection, name: &str, id: &str) {
    let deadline: i64 = redis::cmd("ZSCORE")
        .arg(format!("redsem:{{{name}}}:h"))
        .arg(id)
        .query(conn)
        .unwrap();
    support::wait_past_server_ms(conn, deadline);
}

/// The batch script (several threads' tries and releases in one call) gives each
/// operation the reply it would have had alone, in order, and is as safe to run twice.
#[test]
fn a_batch_runs_its_operations_in_order_and_twice_grants_nothing_more() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let script = batch_script();
    let id = |k: u32| format!("aaaaaaaa-0000-4000-8000-00000000000{k}");
    let run = |conn: &mut redis::Connection, held: &str| -> Vec<redis::Value> {
        let mut inv = call_on(&script, "batch");
        batch_try(&mut inv, &id(1), 1, 10_000); // limit 1: granted
        batch_try(&mut inv, &id(2), 1, 10_000); // full: refused
        inv.arg("r").arg(held); // frees the permit
        batch_try(&mut inv, &id(3), 1, 10_000); // granted
        inv.invoke(conn).unwrap()
    };
    let first = run(&mut conn, &id(1));
    let parse = support::acquire_reply;
    assert_eq!(first.len(), 4, "{first:?}");
    assert_eq!(parse(&first[0])[0], 1, "{first:?}");
    assert_eq!(parse(&first[1])[0], 0, "{first:?}");
    assert_eq!(first[2], redis::Value::Int(1), "{first:?}");
    let third = parse(&first[3]);
    assert_eq!(third[0], 1, "{first:?}");
    assert!(
        third[2] > parse(&first[0])[2],
        "tokens increase within a batch"
    );
    assert_eq!(&third[4..], &[0], "the freed slot is reused");

    // sent again (a resent command): id 3's grant is returned again and nothing else
    // changes hands: 1 is no longer held, 2 is still refused
    let second = run(&mut conn, &id(1));
    assert_eq!(parse(&second[0])[0], 0, "{second:?}");
    assert_eq!(parse(&second[1])[0], 0, "{second:?}");
    assert_eq!(second[2], redis::Value::Int(0), "{second:?}");
    assert_eq!(parse(&second[3])[2..], third[2..], "{second:?}");
    let sem = client(&server).semaphore("batch", 1).unwrap();
    let holders = sem.holders().unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].id, id(3));
}

/// A try in the short form 'A' (id and cutoff; the rest from the last full 'a') acts
/// exactly as its full form: the same replies, slots and holders, with releases of
/// the same batch in between; the fast releases' pending 'used' is written before the
/// call returns. An 'A' with no 'a' before it is refused before anything is written.
#[test]
fn a_batch_short_acquire_acts_as_its_full_form() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let script = batch_script();
    let id = |k: u32| format!("bbbbbbbb-0000-4000-8000-00000000000{k}");
    let short = |inv: &mut redis::ScriptInvocation<'_>, k: u32| {
        inv.arg("A").arg(id(k)).arg("0");
    };
    // limit 2: 1 and 2 granted, 3 refused, 1 released, 4 granted on slot 0, 2 released,
    // 5 granted on slot 1
    let run = |conn: &mut redis::Connection, name: &str, full: bool| -> Vec<redis::Value> {
        let mut inv = call_on(&script, name);
        batch_try(&mut inv, &id(1), 2, 10_000);
        for k in 2..=5 {
            if k == 4 {
                inv.arg("r").arg(id(1));
            }
            if k == 5 {
                inv.arg("r").arg(id(2));
            }
            if full {
                batch_try(&mut inv, &id(k), 2, 10_000);
            } else {
                short(&mut inv, k);
            }
        }
        inv.invoke(conn).unwrap()
    };
    let shape = |replies: &[redis::Value]| -> Vec<Vec<i64>> {
        replies
            .iter()
            .map(|v| match v {
                redis::Value::Int(i) => vec![*i],
                v => {
                    // granted: status and slots; refused: status (time and tokens differ)
                    let r = support::acquire_reply(v);
                    if r[0] == 1 {
                        [&r[..1], &r[4..]].concat()
                    } else {
                        vec![r[0]]
                    }
                }
            })
            .collect()
    };
    let full = shape(&run(&mut conn, "full", true));
    let short_form = shape(&run(&mut conn, "short", false));
    assert_eq!(
        full,
        vec![
            vec![1, 0],
            vec![1, 1],
            vec![0],
            vec![1],
            vec![1, 0],
            vec![1],
            vec![1, 1]
        ]
    );
    assert_eq!(short_form, full);
    for name in ["full", "short"] {
        let sem = client(&server).semaphore(name, 2).unwrap();
        let status = sem.status().unwrap();
        assert_eq!(status.held, 2, "{name}: 'used' as the releases left it");
        let mut held: Vec<String> = sem.holders().unwrap().into_iter().map(|h| h.id).collect();
        held.sort();
        assert_eq!(held, vec![id(4), id(5)], "{name}");
    }

    let mut inv = call_on(&script, "orphan");
    short(&mut inv, 1);
    let r: redis::RedisResult<redis::Value> = inv.invoke(&mut conn);
    let e = r.expect_err("an 'A' without an 'a' before it");
    assert!(e.to_string().contains("unknown operation"), "{e}");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("redsem:{orphan}:*")
        .query(&mut conn)
        .unwrap();
    assert!(keys.is_empty(), "nothing written: {keys:?}");
}

/// A fast release leaves its lowered `used` pending until the call ends; when a later
/// operation of the same batch needs the full logic, the count is written first, so
/// the full logic finds the keys agreeing (no repair that would drop the other
/// holders) and grants from the freed permit.
#[test]
fn a_batch_writes_its_fast_releases_before_the_full_logic_runs() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let script = batch_script();
    let id = |k: u32| format!("cccccccc-0000-4000-8000-00000000000{k}");
    let mut inv = call_on(&script, "pending");
    batch_try(&mut inv, &id(1), 3, 10_000);
    batch_try(&mut inv, &id(2), 3, 10_000);
    batch_try(&mut inv, &id(3), 3, 10_000);
    let _: Vec<redis::Value> = inv.invoke(&mut conn).unwrap();
    // release 1 (fast), then take two permits at once (not plain: the full logic)
    let mut inv = call_on(&script, "pending");
    inv.arg("r").arg(id(1));
    batch_try_many(&mut inv, &id(4), 2, 3, 10_000);
    let replies: Vec<redis::Value> = inv.invoke(&mut conn).unwrap();
    assert_eq!(replies[0], redis::Value::Int(1), "{replies:?}");
    let busy = support::acquire_reply(&replies[1]);
    assert_eq!(busy[0], 0, "one permit free, two asked: {replies:?}");
    let sem = client(&server).semaphore("pending", 3).unwrap();
    let status = sem.status().unwrap();
    assert_eq!(status.held, 2, "'used' written before the full logic");
    let mut held: Vec<String> = sem.holders().unwrap().into_iter().map(|h| h.id).collect();
    held.sort();
    assert_eq!(held, vec![id(2), id(3)], "nobody dropped by a repair");
    // the same, with the freed permits enough for the full-logic acquire
    let mut inv = call_on(&script, "pending");
    inv.arg("r").arg(id(2));
    batch_try_many(&mut inv, &id(4), 2, 3, 10_000);
    let replies: Vec<redis::Value> = inv.invoke(&mut conn).unwrap();
    let granted = support::acquire_reply(&replies[1]);
    assert_eq!(granted[0], 1, "{replies:?}");
    let mut slots = granted[4..].to_vec();
    slots.sort();
    assert_eq!(slots, vec![0, 1], "the freed slots");
    assert_eq!(sem.status().unwrap().held, 3);
}

/// In a batch, an operation sees what the operations before it did: a holder purged
/// by an earlier acquire is gone for a later release of the same id, which must not
/// free the slot the acquire took.
#[test]
fn a_batch_release_of_a_holder_purged_earlier_in_the_batch_frees_nothing() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let batch = batch_script();
    let keeper = "aaaaaaaa-0000-4000-8000-00000000000c";
    let old = "aaaaaaaa-0000-4000-8000-00000000000a";
    let new = "aaaaaaaa-0000-4000-8000-00000000000b";
    let mut inv = call_on(&batch, "purged");
    batch_try(&mut inv, keeper, 2, 10_000); // keeps the keys alive, on slot 0
    batch_try(&mut inv, old, 2, 20); // slot 1, soon expired
    let _: Vec<redis::Value> = inv.invoke(&mut conn).unwrap();
    wait_past_server_deadline(&mut conn, "purged", old);
    let mut inv = call_on(&batch, "purged");
    batch_try(&mut inv, new, 2, 10_000); // purges old, takes slot 1
    inv.arg("r").arg(old);
    let replies: Vec<redis::Value> = inv.invoke(&mut conn).unwrap();
    let granted = support::acquire_reply(&replies[0]);
    assert_eq!((granted[0], granted[4]), (1, 1), "{replies:?}");
    assert_eq!(
        replies[1],
        redis::Value::Int(0),
        "the old holder was already purged"
    );
    let sem = client(&server).semaphore("purged", 2).unwrap();
    assert_eq!(sem.available().unwrap(), 0, "the new holder keeps its slot");
    let mut holders: Vec<(String, Vec<u32>)> = sem
        .holders()
        .unwrap()
        .into_iter()
        .map(|h| (h.id, h.slots))
        .collect();
    holders.sort();
    assert_eq!(
        holders,
        vec![(new.to_owned(), vec![1]), (keeper.to_owned(), vec![0])]
    );
}

/// Threads of one client that try and release at the same time share script calls
/// (fewer calls than operations), and every one of them still sees a correct answer.
#[test]
fn concurrent_tries_of_one_client_share_calls_and_never_exceed_the_limit() {
    let server = RedisServer::start();
    let client = Client::builder()
        .max_connections(20)
        .build(server.url())
        .unwrap();
    let sem = client.semaphore("combined", 3).unwrap();
    let mut conn = server.conn();
    drop(sem.try_acquire().unwrap()); // loads the scripts
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .exec(&mut conn)
        .unwrap();
    let inside = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(0));
    let ops = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let threads: Vec<_> = (0..12)
        .map(|_| {
            let sem = sem.clone();
            let inside = inside.clone();
            let ops = ops.clone();
            std::thread::spawn(move || {
                use std::sync::atomic::Ordering::SeqCst;
                let mut most = 0;
                for _ in 0..300 {
                    ops.fetch_add(1, SeqCst);
                    if let Some(p) = sem.try_acquire().unwrap() {
                        most = most.max(inside.fetch_add(1, SeqCst) + 1);
                        inside.fetch_sub(1, SeqCst);
                        ops.fetch_add(1, SeqCst);
                        p.release().unwrap();
                    }
                }
                most
            })
        })
        .collect();
    for t in threads {
        assert!(t.join().unwrap() <= 3, "more than 3 holders at once");
    }
    let calls = support::command_calls(&mut conn)["evalsha"];
    let ops = ops.load(std::sync::atomic::Ordering::SeqCst);
    assert!(calls < ops, "{calls} script calls for {ops} operations");
    assert_eq!(sem.available().unwrap(), 3);
    assert!(sem.holders().unwrap().is_empty());
}

#[test]
fn permit_and_handles_have_the_promised_auto_traits() {
    fn send_static<T: Send + 'static>() {}
    fn clone_send_sync<T: Clone + Send + Sync + 'static>() {}
    send_static::<Permit>();
    clone_send_sync::<Semaphore>();
    clone_send_sync::<Client>();
    fn error_is_std<T: std::error::Error + Send + Sync + 'static>() {}
    error_is_std::<Error>();
}

/// Threads that share script calls all get an answer when the server goes away: an
/// error, never a hang, whether their operation led a call or waited in a batch; and
/// they are served again once it is back.
#[test]
fn contending_threads_get_errors_not_hangs_when_the_server_dies_and_recover_after() {
    use std::sync::atomic::{AtomicBool, AtomicU64};
    let mut server = RedisServer::start();
    let client = Client::builder()
        .max_connections(8)
        .operation_timeout(Duration::from_millis(500))
        .checkout_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build(server.url())
        .unwrap();
    let sem = client.semaphore("outage", 3).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let threads = 12;
    let oks: Arc<Vec<AtomicU64>> = Arc::new((0..threads).map(|_| AtomicU64::new(0)).collect());
    let errs: Arc<Vec<AtomicU64>> = Arc::new((0..threads).map(|_| AtomicU64::new(0)).collect());
    let (done_tx, done_rx) = crossbeam_channel::unbounded();
    for t in 0..threads {
        let (sem, stop, oks, errs, done) = (
            sem.clone(),
            stop.clone(),
            oks.clone(),
            errs.clone(),
            done_tx.clone(),
        );
        thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let outcome = sem
                    .try_acquire()
                    .and_then(|p| p.map_or(Ok(()), Permit::release));
                match outcome {
                    Ok(()) => oks[t].fetch_add(1, Ordering::SeqCst),
                    Err(_) => errs[t].fetch_add(1, Ordering::SeqCst),
                };
            }
            let _ = done.send(t);
        });
    }
    let total = |v: &Vec<AtomicU64>| v.iter().map(|a| a.load(Ordering::SeqCst)).sum::<u64>();
    wait_until(Duration::from_secs(10), "traffic before the outage", || {
        total(&oks) >= 2_000
    });

    server.stop();
    let errs_at_stop: Vec<u64> = errs.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    wait_until(
        Duration::from_secs(15),
        "every thread to get an error",
        || {
            errs.iter()
                .zip(&errs_at_stop)
                .all(|(now, before)| now.load(Ordering::SeqCst) > *before)
        },
    );

    server.restart();
    let oks_at_restart: Vec<u64> = oks.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    wait_until(Duration::from_secs(15), "every thread served again", || {
        oks.iter()
            .zip(&oks_at_restart)
            .all(|(now, before)| now.load(Ordering::SeqCst) > *before)
    });

    stop.store(true, Ordering::SeqCst);
    for _ in 0..threads {
        done_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("a thread hung after the outage");
    }
    assert_eq!(sem.available().unwrap(), 3, "{:?}", sem.holders().unwrap());
}

/// An idle semaphore costs no memory (#12): the holder's release that leaves nobody
/// holding or waiting deletes the keys; a stored limit or an operator's
/// `force_release` keeps them; tokens still increase across the deletion.
#[test]
fn the_release_that_leaves_a_semaphore_idle_deletes_its_keys() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = client(&server);
    let sem = c.semaphore("idle", 2).unwrap();
    let a = sem.try_acquire().unwrap().unwrap();
    let b = sem.try_acquire().unwrap().unwrap();
    assert_eq!(
        support::keys(&mut conn, "redsem:{idle}:*").len(),
        3,
        "h, i, s (the queue key exists only while someone queues)"
    );
    let last = b.token();
    a.release().unwrap();
    assert_eq!(
        support::keys(&mut conn, "redsem:{idle}:*").len(),
        3,
        "a holder is left: the keys stay"
    );
    b.release().unwrap();
    assert!(support::keys(&mut conn, "redsem:{idle}:*").is_empty());
    // a fresh start: slot 0, a larger token
    let p = sem.try_acquire().unwrap().unwrap();
    assert_eq!(p.slots(), &[0]);
    assert!(p.token() > last);
    // force_release keeps them, so the holder learns "released", not "keys gone"
    assert!(sem.force_release(p.id()).unwrap());
    assert_eq!(support::keys(&mut conn, "redsem:{idle}:*").len(), 3);
    // a stored limit keeps them too
    let stored = c.semaphore("stored", 2).unwrap();
    stored.set_limit(3).unwrap();
    stored.try_acquire().unwrap().unwrap().release().unwrap();
    assert_eq!(support::keys(&mut conn, "redsem:{stored}:*").len(), 3);
    assert_eq!(stored.limit().unwrap(), 3);
}

#[test]
fn a_refused_connection_fails_a_call_at_once_with_the_address() {
    // a port nobody listens on (bound, then freed)
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // default settings: a 5 s checkout timeout that a refused connection must not wait out
    let client = Client::open(format!("redis://user:hunter2@127.0.0.1:{port}/")).unwrap();
    let sem = client.semaphore("refused", 1).unwrap();
    let started = std::time::Instant::now();
    let e = sem.try_acquire().unwrap_err();
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(1_000),
        "try_acquire waited {took:?} against a refused port"
    );
    let text = e.to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(text.contains("refused"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(e.is_retryable() && !e.is_timeout(), "{e:?}");
    eprintln!("a refused connection failed try_acquire after {took:?}");
}

#[test]
fn connect_at_build_checks_the_server_when_the_client_is_built() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}/");
    // lazily: the build succeeds, the first operation fails
    assert!(Client::builder().build(&url).is_ok());
    match Client::builder().connect_at_build(true).build(&url) {
        Err(Error::Connect { addr, .. }) => assert_eq!(addr, format!("127.0.0.1:{port}")),
        other => panic!("expected Error::Connect, got {other:?}"),
    }
    let server = RedisServer::start();
    let client = Client::builder()
        .connect_at_build(true)
        .build(server.url())
        .unwrap();
    assert!(
        client
            .semaphore("eager", 1)
            .unwrap()
            .try_acquire()
            .unwrap()
            .is_some()
    );
}

/// A database index the server refuses (`SELECT 99` against the default 16 databases
/// answers "ERR DB index is out of range") was a retryable `Error::Connect` whose
/// message named neither the index nor what to change, and every call waited out the
/// checkout timeout (5 s by default) before it. It is a configuration mistake: a
/// connect error that is not retryable, names the address and the index (never the
/// password), and comes at once, from an operation and from `ping`.
#[test]
fn a_database_index_the_server_refuses_is_a_configuration_error_at_once() {
    const PW: &str = "db-Pw-99";
    let plain = RedisServer::start();
    let with_password = support::AclServer::start(PW);
    for (port, url) in [
        (
            plain.port(),
            format!("redis://127.0.0.1:{}/99", plain.port()),
        ),
        (
            with_password.server.port(),
            format!("redis://:{PW}@127.0.0.1:{}/99", with_password.server.port()),
        ),
    ] {
        let client = Client::open(&url).unwrap();
        let sem = client.semaphore("db99", 1).unwrap();
        let started = std::time::Instant::now();
        let errors = [
            sem.try_acquire().unwrap_err(),
            sem.acquire().unwrap_err(),
            client.ping().unwrap_err(),
        ];
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(2),
            "{url}: three calls took {took:?} against a refused database"
        );
        let addr = format!("127.0.0.1:{port}");
        for e in errors {
            let (text, debug) = (e.to_string(), format!("{e:?}"));
            assert!(
                matches!(&e, Error::Connect { addr: a, .. } if *a == addr),
                "{url}: {debug}"
            );
            assert!(!e.is_retryable() && !e.is_timeout(), "{url}: {debug}");
            assert!(text.contains(&addr), "{url}: {text}");
            assert!(text.contains("database 99"), "{url}: {text}");
            assert!(!text.contains(PW) && !debug.contains(PW), "{url}: {debug}");
        }
    }
}

/// IPv6 addresses were printed without brackets in messages (`::1:6379`: which part
/// is the port?). Every message that names a host and port shows an IPv6 literal as
/// `[::1]:PORT`: one server's address, a Sentinel target's sentinels and a cluster's
/// seed nodes (the text `redis` adds to a cluster's error is its own), and a
/// `ConnectionInfo` built by hand. Nothing listens on the port (bound on the loopback,
/// then freed), so the connection is refused at once. On a machine without an IPv6 loopback the connect
/// fails otherwise (no such address, unreachable network) after at most the short
/// connect timeout set here, and the messages still name the address through the
/// same formatting, which is what this test checks.
#[test]
fn an_ipv6_address_is_bracketed_in_messages() {
    let port = std::net::TcpListener::bind("[::1]:0")
        .or_else(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let bracketed = format!("[::1]:{port}");
    let bare = format!("::1:{port}");
    let build = |url: String| {
        Client::builder()
            .connect_timeout(Duration::from_millis(300))
            .checkout_timeout(Duration::from_millis(600))
            .build(url)
            .unwrap()
    };
    let check = |what: &str, text: String| {
        assert!(text.contains(&bracketed), "{what}: {text}");
        assert!(!text.contains(&bare), "{what}: {text}");
    };
    let client = build(format!("redis://[::1]:{port}/"));
    check("client debug", format!("{client:?}"));
    let sem = client.semaphore("v6", 1).unwrap();
    for e in [sem.try_acquire().unwrap_err(), client.ping().unwrap_err()] {
        assert!(
            matches!(&e, Error::Connect { addr, .. } if *addr == bracketed),
            "{e:?}"
        );
        check("one server", e.to_string());
    }
    // a hand-built target is named by a URL made from its address
    use redis_semaphore::redis::{ConnectionAddr, IntoConnectionInfo};
    let info = ConnectionAddr::Tcp("::1".into(), port)
        .into_connection_info()
        .unwrap();
    let e = Client::builder()
        .tls_ca_file("/nonexistent/ca.crt")
        .build(info)
        .unwrap_err();
    check("hand-built", e.to_string());
    let sentinel = build(format!("redis+sentinel://[::1]:{port}/svc"));
    check("sentinel", sentinel.ping().unwrap_err().to_string());
    // (what the cluster client of `redis` adds after the address is its own text, which
    // shows its nodes its own way: only the library's part is checked)
    let cluster = build(format!("redis+cluster://[::1]:{port}"));
    let text = cluster.ping().unwrap_err().to_string();
    let ours = format!("cannot connect to cluster {bracketed}: ");
    assert!(text.starts_with(&ours), "cluster: {text}");
}

#[test]
fn a_timed_out_release_names_the_operation_and_the_time_allowed() {
    let server = RedisServer::start();
    let client = Client::builder()
        .operation_timeout(Duration::from_millis(200))
        .build(server.url())
        .unwrap();
    let sem = client.semaphore("paused", 1).unwrap();
    let p = sem.acquire().unwrap();
    // every client's commands wait for 1 s: the release gets no reply in time
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1_000)
        .query(&mut server.conn())
        .unwrap();
    let e = p.release().unwrap_err();
    let text = e.to_string();
    assert!(e.is_timeout(), "{e:?}");
    assert!(
        text.starts_with("release on semaphore \"paused\""),
        "{text}"
    );
    assert!(text.contains("200ms"), "{text}");
}

#[test]
fn a_client_opens_from_a_connection_info_built_by_hand() {
    use redis_semaphore::redis::IntoConnectionInfo;
    let server = RedisServer::start();
    let info = server.url().as_str().into_connection_info().unwrap();
    let client = Client::open(info).unwrap();
    client.ping().unwrap();
    let sem = client.semaphore("from-info", 1).unwrap();
    assert!(sem.try_acquire().unwrap().is_some());
    // a String works as well as a &str
    assert!(Client::open(server.url()).is_ok());
}

#[test]
fn clients_that_pass_different_limits_are_reported() {
    let server = RedisServer::start();
    let client = client(&server);
    let two = client.semaphore("disagree", 2).unwrap();
    let four = client.semaphore("disagree", 4).unwrap();
    drop(two.acquire().unwrap());
    let p = two.acquire().unwrap(); // keeps the keys while the other client acquires
    assert_eq!(
        two.status().unwrap().other_client_limit,
        None,
        "one limit so far"
    );
    let q = four.acquire().unwrap();
    let s = four.status().unwrap();
    assert_eq!(s.client_limit, Some(4));
    assert_eq!(s.other_client_limit, Some(2));
    drop((p, q));
    // clients that agree are not reported
    let agree = client.semaphore("agree", 3).unwrap();
    let again = client.semaphore("agree", 3).unwrap();
    let (a, b) = (agree.acquire().unwrap(), again.acquire().unwrap());
    assert_eq!(agree.status().unwrap().other_client_limit, None);
    drop((a, b));
}

/// `with_label` gives a handle of the same semaphore (same limit, lease, combiner)
/// whose permits carry the new label; the original handle keeps its own.
#[test]
fn with_label_changes_only_the_label() {
    let server = RedisServer::start();
    let sem = client(&server)
        .semaphore_builder("labelled")
        .limit(2)
        .lease(Duration::from_secs(7))
        .label("first")
        .build()
        .unwrap();
    let other = sem.with_label("second").unwrap();
    assert_eq!(other.lease(), sem.lease());
    let a = sem.try_acquire().unwrap().unwrap();
    let b = other.try_acquire().unwrap().unwrap();
    assert!(other.try_acquire().unwrap().is_none(), "one limit for both");
    let mut labels: Vec<(String, Option<String>)> = sem
        .holders()
        .unwrap()
        .into_iter()
        .map(|h| (h.id, h.label))
        .collect();
    labels.sort();
    let mut want = vec![
        (a.id().to_owned(), Some("first".to_owned())),
        (b.id().to_owned(), Some("second".to_owned())),
    ];
    want.sort();
    assert_eq!(labels, want);
    assert!(sem.with_label("line\nbreak").is_err());
}

/// A Redis error on a semaphore's call names the semaphore and the operation, not only
/// what Redis said (here the server is out of memory: the acquire's first write is
/// refused, before anything is written).
#[test]
fn a_redis_error_names_the_semaphore_and_the_operation() {
    let server = RedisServer::start();
    let sem = client(&server).semaphore("oom", 2).unwrap();
    let mut admin = server.conn();
    set_maxmemory(&mut admin, "1");
    let e = sem.try_acquire().unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, Error::Call { ref name, operation: "acquire", .. } if name == "oom"),
        "{e:?}"
    );
    assert!(
        text.starts_with("acquire on semaphore \"oom\" failed: redis error: ")
            && text.contains("OOM"),
        "{text}"
    );
    assert!(!e.is_retryable(), "{text}");
    set_maxmemory(&mut admin, "0");
    assert!(sem.try_acquire().unwrap().is_some());
}

/// Ninth session (new-user review): on a server older than Redis 6.2 (Ubuntu 20.04
/// ships 5.0, Debian 11 6.0) the scripts' 6.2 commands fail inside the script, and the
/// caller read only "ERR syntax error" (`SET ... PXAT`) or "Unknown Redis command
/// called from Lua script" (`ZMSCORE`), with nothing about the version the library
/// needs. Such an error now says that the library needs Redis 6.2 or later. A server
/// without `ZMSCORE` (renamed away here; Redis 6.0 has none) stands in for an old one:
/// the renewal reads the holders' deadlines with it.
#[test]
fn a_script_command_the_server_lacks_says_the_library_needs_redis_6_2() {
    let server = RedisServer::start_with(&["--rename-command", "ZMSCORE", ""]);
    let sem = client(&server)
        .semaphore_builder("old")
        .limit(2)
        .auto_refresh(false)
        .build()
        .unwrap();
    let permit = sem.acquire().unwrap();
    let e = permit.refresh().unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(
            e,
            Error::Call {
                operation: "refresh",
                ..
            }
        ),
        "{e:?}"
    );
    // (Redis: "Unknown Redis command called from ..."; Valkey: "Unknown command ...")
    assert!(
        text.contains("Unknown") && text.contains("command"),
        "{text}"
    );
    assert!(text.contains("needs Redis 6.2 or later"), "{text}");
    assert!(!e.is_retryable(), "{text}");
}

/// The first waiter makes the queue key, with the TTL of the other keys, also over a
/// stray key of another type left while nobody queued (deleted first, the only write
/// before the waiter's own); the last waiter to leave deletes it.
#[test]
fn the_first_waiter_makes_the_queue_key_and_the_last_removes_it() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let sem = client(&server).semaphore("q-life", 1).unwrap();
    let held = sem.acquire().unwrap();
    let q = "redsem:{q-life}:q";
    redis::cmd("SET")
        .arg(q)
        .arg("stray")
        .exec(&mut conn)
        .unwrap();
    thread::scope(|s| {
        let waiter = s.spawn(|| sem.acquire_timeout(Duration::from_secs(10)));
        wait_until(Duration::from_secs(5), "the waiter queues", || {
            sem.queue_len().unwrap() == 1
        });
        let t: String = redis::cmd("TYPE").arg(q).query(&mut conn).unwrap();
        assert_eq!(t, "zset", "made by the first waiter");
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(q)
            .arg(0)
            .arg(-1)
            .query(&mut conn)
            .unwrap();
        assert_eq!(members.len(), 1, "the waiter alone: {members:?}");
        // (the holders' first: read later, the same expiry time shows a smaller TTL)
        let h_ttl: i64 = redis::cmd("PTTL")
            .arg("redsem:{q-life}:h")
            .query(&mut conn)
            .unwrap();
        let ttl: i64 = redis::cmd("PTTL").arg(q).query(&mut conn).unwrap();
        assert!(
            ttl > 0 && ttl <= h_ttl,
            "the queue key's TTL {ttl} ms, the holders' {h_ttl} ms"
        );
        held.release().unwrap();
        let p = waiter
            .join()
            .unwrap()
            .unwrap()
            .expect("served at the release");
        let t: String = redis::cmd("TYPE").arg(q).query(&mut conn).unwrap();
        assert_eq!(t, "none", "the last waiter left: no queue key");
        assert_eq!(sem.status().unwrap().held, 1);
        drop(p);
    });
}

/// A 1 ms lease is accepted without automatic refresh, but its grants are over before
/// they arrive (the client's deadline allows a millisecond for the server's
/// whole-millisecond clock): the acquire gives the grant back and fails with a timeout
/// error that names the lease. It said "the reply came after the operation timeout",
/// which sent the reader to the wrong setting.
#[test]
fn a_grant_over_on_arrival_says_the_lease_was_too_short() {
    let server = RedisServer::start();
    let sem = client(&server)
        .semaphore_builder("one-ms")
        .limit(1)
        .lease(Duration::from_millis(1))
        .auto_refresh(false)
        .build()
        .unwrap();
    for _ in 0..5 {
        let started = std::time::Instant::now();
        let e = sem.acquire().expect_err("a 1 ms lease is over on arrival");
        // (a queued waiter took it for an outage and rode through it for 30 s)
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "failed after {:?}: {e}",
            started.elapsed()
        );
        assert!(e.is_timeout(), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.contains("one-ms") && msg.contains("after its lease of 1ms had ended"),
            "{msg}"
        );
    }
}

/// Ninth session (new-user review): DESIGN invariant 12 promises that a release runs
/// when Redis is out of memory (the scripts have no shebang, so Redis refuses only a
/// script's first write of a command that may use memory). The fast release's first
/// write was the SETBIT that frees its slot, so releasing one of several permits at
/// `maxmemory` failed with OOM (the permit stayed taken until its lease ended); it
/// now removes the holder's entries (ZREM, HDEL, which use no memory) first.
#[test]
fn a_release_runs_when_redis_is_out_of_memory() {
    let server = RedisServer::start();
    let sem = client(&server).semaphore("oom-release", 3).unwrap();
    let first = sem.try_acquire().unwrap().unwrap();
    let second = sem.try_acquire().unwrap().unwrap();
    let mut admin = server.conn();
    set_maxmemory(&mut admin, "1");
    assert!(
        sem.try_acquire().is_err(),
        "an acquire is refused at maxmemory"
    );
    first.release().unwrap();
    second.release().unwrap();
    set_maxmemory(&mut admin, "0");
    assert_eq!(sem.available().unwrap(), 3);
}

/// The same for a batch of releases and acquires sent together (the combiner's): a
/// granted acquire's first write uses memory and would have the whole call refused
/// at `maxmemory`, its releases with it. Sent as the client sends a batch (releases
/// first), the releases run; in the other order the call is refused.
#[test]
fn a_batch_puts_its_releases_first_so_that_they_run_out_of_memory() {
    let server = RedisServer::start();
    let sem = client(&server).semaphore("oom-batch", 3).unwrap();
    let held: Vec<Permit> = (0..2)
        .map(|_| sem.try_acquire().unwrap().unwrap())
        .collect();
    let ids: Vec<String> = held.iter().map(|p| p.id().to_owned()).collect();
    let parts: Vec<_> = held.into_iter().map(Permit::into_parts).collect();
    let mut admin = server.conn();
    set_maxmemory(&mut admin, "1");
    let script = batch_script();
    let fresh = "6f7d1c1e-0000-4000-8000-000000000001";
    // an acquire first: refused whole, nothing released
    let mut inv = call_on(&script, "oom-batch");
    batch_try_many(&mut inv, fresh, 1, 3, 10_000);
    inv.arg("r").arg(&ids[0]);
    let refused = inv
        .invoke::<redis::Value>(&mut admin)
        .expect_err("an acquire first is refused at maxmemory");
    assert!(refused.to_string().contains("OOM"), "{refused}");
    // releases first: they run, and the acquire after them too
    let mut inv = call_on(&script, "oom-batch");
    inv.arg("r").arg(&ids[0]).arg("r").arg(&ids[1]);
    batch_try_many(&mut inv, fresh, 1, 3, 10_000);
    let replies: Vec<redis::Value> = inv.invoke(&mut admin).unwrap();
    assert_eq!(replies.len(), 3);
    set_maxmemory(&mut admin, "0");
    let holders = sem.holders().unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].id, fresh);
    drop(parts);
}
