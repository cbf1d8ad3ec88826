//! The `redis-semaphore` command against a private redis-server (needs `--features cli`).
#![cfg(feature = "cli")]

mod support;

use std::process::{Command, Output};
use std::time::Duration;

use redis_semaphore::Client;
use support::RedisServer;

fn cli(server: &RedisServer, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_redis-semaphore"))
        .arg("--url")
        .arg(server.url())
        .args(args)
        .env_remove("REDIS_URL")
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[test]
fn status_shows_the_holders_the_library_created() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = client
        .semaphore_builder("acct:42")
        .limit(5)
        .label("job-17")
        .build()
        .unwrap();
    let one = sem.acquire().unwrap();
    let two = sem.acquire_many(2).unwrap();
    let text = stdout(&cli(&server, &["status", "acct:42"]));
    assert!(text.contains("limit      5"), "{text}");
    assert!(text.contains("held       3"), "{text}");
    assert!(text.contains("available  2"), "{text}");
    for p in [&one, &two] {
        assert!(text.contains(p.id()), "{text}");
        assert!(text.contains(&p.token().to_string()), "{text}");
    }
    assert!(text.contains("job-17"), "{text}");

    let json: serde_json::Value =
        serde_json::from_str(&stdout(&cli(&server, &["--json", "status", "acct:42"]))).unwrap();
    assert_eq!(json["limit"], 5);
    assert_eq!(json["held"], 3);
    assert_eq!(json["queued"], 0);
    let holders = json["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 2);
    let h = holders.iter().find(|h| h["id"] == two.id()).unwrap();
    assert_eq!(h["permits"], 2);
    assert_eq!(h["token"], two.token());
    assert_eq!(h["slots"], serde_json::json!([1, 2]));
    assert_eq!(h["pid"], std::process::id());
    assert_eq!(h["label"], "job-17");
    assert!(h["lease_left_ms"].as_u64().unwrap() > 5_000);
}

#[test]
fn release_frees_a_holder_and_the_library_sees_it() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = client.semaphore("rel", 1).unwrap();
    let held = sem.acquire().unwrap();
    assert!(sem.try_acquire().unwrap().is_none());
    let out = stdout(&cli(&server, &["release", "rel", held.id()]));
    assert!(out.contains(held.id()), "{out}");
    assert!(sem.try_acquire().unwrap().is_some());
    let again = cli(&server, &["release", "rel", held.id()]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("no holder"));
}

#[test]
fn set_limit_changes_what_the_library_sees() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = client.semaphore("lim", 1).unwrap();
    let _held = sem.acquire().unwrap();
    assert!(sem.try_acquire().unwrap().is_none());
    stdout(&cli(&server, &["set-limit", "lim", "3"]));
    assert_eq!(sem.limit().unwrap(), 3);
    assert!(sem.try_acquire().unwrap().is_some());
    let json: serde_json::Value =
        serde_json::from_str(&stdout(&cli(&server, &["--json", "status", "lim"]))).unwrap();
    assert_eq!(json["stored_limit"], 3);
}

/// `set-limit` and `release` printed the semaphore's name as given, so a name with
/// control characters (an escape sequence another program chose) reached the
/// terminal; like `status` and `list`, they now print it escaped.
#[test]
fn set_limit_and_release_print_names_escaped() {
    let server = RedisServer::start();
    let name = "esc\u{1b}[2Jname";
    let out = stdout(&cli(&server, &["set-limit", name, "2"]));
    assert!(
        !out.contains('\u{1b}') && out.contains("\\u{1b}"),
        "{out:?}"
    );
    let client = Client::open(server.url()).unwrap();
    let held = client.semaphore(name, 2).unwrap().acquire().unwrap();
    let out = stdout(&cli(&server, &["release", name, held.id()]));
    assert!(
        !out.contains('\u{1b}') && out.contains("\\u{1b}"),
        "{out:?}"
    );
    let again = cli(&server, &["release", name, held.id()]);
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        !err.contains('\u{1b}') && err.contains("no holder"),
        "{err:?}"
    );
}

#[test]
fn list_and_watch_find_the_semaphores() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let a = client.semaphore("jobs:a", 2).unwrap();
    let b = client.semaphore("jobs:b", 4).unwrap();
    let _pa = a.acquire().unwrap();
    let _pb = b.acquire().unwrap();
    let text = stdout(&cli(&server, &["list"]));
    assert!(text.contains("jobs:a") && text.contains("jobs:b"), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&stdout(&cli(&server, &["--json", "list", "jobs:*"]))).unwrap();
    let names: Vec<&str> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["jobs:a", "jobs:b"]);
    let watched = stdout(&cli(&server, &["watch", "jobs:b", "--count", "2"]));
    assert_eq!(watched.matches("semaphore jobs:b").count(), 2, "{watched}");
    // a counting semaphore is watched as `status` shows it (was: an empty leased one)
    let tokens = client.counting_semaphore("jobs:tokens").unwrap();
    assert!(tokens.try_set_permits(7).unwrap());
    let watched = stdout(&cli(&server, &["watch", "jobs:tokens", "--count", "1"]));
    assert!(
        watched.contains("counting semaphore jobs:tokens"),
        "{watched}"
    );
    assert!(watched.contains("count      7"), "{watched}");
    let json: serde_json::Value = serde_json::from_str(&stdout(&cli(
        &server,
        &["--json", "watch", "jobs:tokens", "--count", "1"],
    )))
    .unwrap();
    assert_eq!(
        (json["kind"].as_str(), json["count"].as_i64()),
        (Some("counting"), Some(7))
    );
}

#[test]
fn a_wrong_url_or_an_unknown_semaphore_is_a_clear_message_and_a_failure() {
    let server = RedisServer::start();
    let unknown = cli(&server, &["status", "nobody"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no semaphore \"nobody\""));

    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    }; // closed again: nothing listens there
    let started = std::time::Instant::now();
    let down = Command::new(env!("CARGO_BIN_EXE_redis-semaphore"))
        .args([
            "--url",
            &format!("redis://127.0.0.1:{port}/"),
            "status",
            "x",
        ])
        .output()
        .unwrap();
    assert_eq!(down.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&down.stderr).contains("cannot talk to Redis"));
    assert!(started.elapsed() < Duration::from_secs(30));
    let bad = Command::new(env!("CARGO_BIN_EXE_redis-semaphore"))
        .args(["--url", "not a url", "status", "x"])
        .output()
        .unwrap();
    assert_ne!(bad.status.code(), Some(0));
}

/// `watch --count 0` is a usage error (exit status 2), not one screen drawn: it is
/// refused before anything connects.
#[test]
fn watch_refuses_a_count_of_zero() {
    let o = bare_cli(
        &[
            "--url",
            "redis://127.0.0.1:1/",
            "watch",
            "x",
            "--count",
            "0",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--count"),
        "{o:?}"
    );
    assert!(o.stdout.is_empty(), "{o:?}");
}

/// `set-limit NAME 0` (or above the library's `MAX_LIMIT`) is a usage error (exit
/// status 2) refused before anything connects; 0 printed a note that the limit "is
/// stored for its first use" and then failed on the limit.
#[test]
fn set_limit_refuses_a_limit_of_zero_before_anything_else() {
    for limit in ["0", "10001"] {
        let o = bare_cli(
            &["--url", "redis://127.0.0.1:1/", "set-limit", "x", limit],
            &[],
        );
        assert_eq!(o.status.code(), Some(2), "{o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        // the range it names is the library's (1..=MAX_LIMIT)
        assert!(
            err.contains("LIMIT") && err.contains("10000") && !err.contains("note"),
            "{err}"
        );
        assert!(o.stdout.is_empty(), "{o:?}");
    }
}

/// A database index the server refuses (`SELECT 99` against the default 16
/// databases) made the CLI wait out its 3 s checkout timeout and say "cannot talk to
/// Redis" without naming the index; it now fails at once, naming the address and the
/// index.
#[test]
fn a_database_index_the_server_refuses_is_named_at_once() {
    let server = RedisServer::start();
    let started = std::time::Instant::now();
    let out = bare_cli(
        &[
            "--url",
            &format!("redis://127.0.0.1:{}/99", server.port()),
            "status",
            "x",
        ],
        &[],
    );
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains(&format!("127.0.0.1:{}", server.port())),
        "{text}"
    );
    assert!(text.contains("database 99"), "{text}");
    assert!(took < Duration::from_secs(2), "took {took:?}: {text}");
}

fn bare_cli(args: &[&str], envs: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_redis-semaphore"))
        .args(args)
        .env_remove("REDIS_URL")
        .env_remove("REDIS_USER")
        .env_remove("REDIS_PASSWORD")
        .envs(envs.iter().copied())
        .output()
        .unwrap()
}

#[test]
fn credentials_from_options_and_environment_and_never_printed() {
    let server = support::AclServer::start("cli-admin-Pw");
    server.add_user(
        "ops",
        "cli-ops-Pw",
        &["resetkeys", "~redsem:*", "&redsem:c:*", "+@all"],
    );
    let port = server.server.port();
    let plain = format!("redis://127.0.0.1:{port}/");
    // user and password in the URL
    let ok = bare_cli(&["--url", &server.url_as("ops", "cli-ops-Pw"), "list"], &[]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    // --user and REDIS_PASSWORD
    let ok = bare_cli(
        &["--url", &plain, "--user", "ops", "list"],
        &[("REDIS_PASSWORD", "cli-ops-Pw")],
    );
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    // a wrong password in the URL: a clear message without the password
    let bad = bare_cli(
        &[
            "--url",
            &server.url_as("ops", "cli-wrong-Pw"),
            "status",
            "x",
        ],
        &[],
    );
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("authentication failed"), "{err}");
    assert!(
        err.contains(&format!("redis://ops:***@127.0.0.1:{port}/")),
        "{err}"
    );
    assert!(!err.contains("cli-wrong-Pw"), "{err}");
    // --password on the command line, wrong: same
    let bad = bare_cli(
        &[
            "--url",
            &plain,
            "--user",
            "ops",
            "--password",
            "cli-wrong-Pw",
            "list",
        ],
        &[],
    );
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("authentication failed"), "{err}");
    assert!(!err.contains("cli-wrong-Pw"), "{err}");
    // help shows the options, not the password in the environment, nor the one in a
    // REDIS_URL
    let help = bare_cli(
        &["--help"],
        &[
            ("REDIS_PASSWORD", "cli-ops-Pw"),
            ("REDIS_URL", "redis://ops:cli-url-Pw@127.0.0.1:1/"),
        ],
    );
    let text = String::from_utf8_lossy(&help.stdout);
    for option in [
        "--user",
        "--password",
        "--tls-ca",
        "--tls-cert",
        "--tls-key",
        "Exit status",
    ] {
        assert!(text.contains(option), "{text}");
    }
    assert!(!text.contains("cli-ops-Pw"), "{text}");
    assert!(!text.contains("cli-url-Pw"), "{text}");
}

#[cfg(feature = "tls-rustls")]
#[test]
fn tls_options() {
    let server = support::TlsServer::start("yes");
    let certs = support::TlsCerts::get();
    let ca = certs.ca.to_str().unwrap();
    let ok = bare_cli(
        &[
            "--url",
            &server.tls_url(),
            "--tls-ca",
            ca,
            "--tls-cert",
            certs.client_cert.to_str().unwrap(),
            "--tls-key",
            certs.client_key.to_str().unwrap(),
            "list",
        ],
        &[],
    );
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let no_cert = bare_cli(&["--url", &server.tls_url(), "--tls-ca", ca, "list"], &[]);
    assert_eq!(no_cert.status.code(), Some(2));
    let err = String::from_utf8_lossy(&no_cert.stderr);
    assert!(err.contains("TLS"), "{err}");
    // --tls-cert without --tls-key is refused by the parser
    let half = bare_cli(&["--url", &server.tls_url(), "--tls-cert", ca, "list"], &[]);
    assert!(!half.status.success());
}

#[test]
fn list_and_status_through_a_cluster_url() {
    let cluster = support::cluster::RedisCluster::start();
    let client = Client::open(cluster.url()).unwrap();
    let held: Vec<_> = (0..12)
        .map(|k| {
            client
                .semaphore(&format!("acct:{k}"), 2)
                .unwrap()
                .acquire()
                .unwrap()
        })
        .collect();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_redis-semaphore"))
            .arg("--url")
            .arg(cluster.url())
            .args(args)
            .env_remove("REDIS_URL")
            .output()
            .unwrap()
    };
    // the semaphores of every primary are listed
    let text = stdout(&run(&["list"]));
    for k in 0..12 {
        let name = format!("acct:{k}");
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().next() == Some(name.as_str())),
            "{text}"
        );
    }
    let text = stdout(&run(&["status", "acct:7"]));
    assert!(text.contains("held       1"), "{text}");
    drop(held);
}

#[test]
fn escape_codes_are_shown_escaped_and_options_go_anywhere() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = client
        .semaphore_builder("labels")
        .limit(2)
        .label("job\u{1b}[31mred\tx")
        .build()
        .unwrap();
    let _p = sem.acquire().unwrap();
    // --url after the subcommand, as well as before it
    let out = Command::new(env!("CARGO_BIN_EXE_redis-semaphore"))
        .args(["status", "labels", "--url", &server.url()])
        .env_remove("REDIS_URL")
        .output()
        .unwrap();
    let text = stdout(&out);
    assert!(!text.contains('\u{1b}'), "{text:?}");
    assert!(!text.contains("red\tx"), "{text:?}");
    assert!(text.contains("job\\u{1b}[31mred\\tx"), "{text}");
    // watch into a pipe: no terminal codes
    let text = stdout(&cli(&server, &["watch", "labels", "--count", "2"]));
    assert!(!text.contains('\u{1b}'), "{text:?}");
    assert_eq!(text.matches("semaphore labels").count(), 2, "{text}");
}

#[test]
fn list_shows_counting_semaphores_and_a_broken_one_without_failing_the_rest() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let _held = client.semaphore("good", 3).unwrap().acquire().unwrap();
    let counting = client.counting_semaphore("tokens").unwrap();
    counting.try_set_permits(4).unwrap();
    // a counting semaphore whose count another program overwrote with a list
    let _: () = redis::cmd("RPUSH")
        .arg("redsem:{broken}:count")
        .arg("x")
        .query(&mut server.conn())
        .unwrap();
    let out = cli(&server, &["list"]);
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "a broken row makes the exit code 1"
    );
    let row = |name: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no row {name} in {text}"))
            .to_owned()
    };
    assert!(row("good").contains("leased"), "{text}");
    assert!(
        row("tokens").contains("counting") && row("tokens").contains("=4"),
        "{text}"
    );
    assert!(row("broken").contains("error"), "{text}");
    let json: serde_json::Value =
        serde_json::from_slice(&cli(&server, &["--json", "list"]).stdout).unwrap();
    let kinds: Vec<&str> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"counting") && kinds.contains(&"leased"),
        "{json}"
    );
    // status shows the counting semaphore too
    let text = stdout(&cli(&server, &["status", "tokens"]));
    assert!(text.contains("counting semaphore tokens"), "{text}");
    assert!(text.contains("count      4"), "{text}");
}

#[test]
fn no_error_path_prints_the_password() {
    const SECRET: &str = "pw-SeCrEt-42";
    let server = RedisServer::start();
    let free = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let urls = [
        // a server that refuses the password
        format!("redis://someone:{SECRET}@127.0.0.1:{}/", server.port()),
        // nothing listens
        format!("redis://someone:{SECRET}@127.0.0.1:{free}/"),
        // not a URL we take
        format!("redis://someone:{SECRET}@127.0.0.1:notaport/"),
        format!("ftp://someone:{SECRET}@127.0.0.1/"),
        // sentinels and cluster nodes that are not there
        format!("redis+sentinel://someone:{SECRET}@127.0.0.1:{free}/svc"),
        format!("redis+cluster://someone:{SECRET}@127.0.0.1:{free}"),
    ];
    let commands: [&[&str]; 5] = [
        &["status", "x"],
        &["list"],
        &["set-limit", "x", "3"],
        &["release", "x", "0f8fad5b-d9cb-469f-a165-70867728950e"],
        &["watch", "x", "--count", "1"],
    ];
    for url in &urls {
        for args in commands {
            let out = bare_cli(&[&["--url", url.as_str()], args].concat(), &[]);
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert_ne!(out.status.code(), Some(0), "{url} {args:?}: {text}");
            assert!(
                !text.contains(SECRET),
                "{url} {args:?} printed the password: {text}"
            );
        }
    }
    // the password from the environment, on a refused connection
    let out = bare_cli(
        &[
            "--url",
            &format!("redis://127.0.0.1:{free}/"),
            "status",
            "x",
        ],
        &[("REDIS_PASSWORD", SECRET)],
    );
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!text.contains(SECRET), "{text}");
}

/// Review: `list` promises one row per semaphore, a broken one shown with its error;
/// but a leased semaphore whose name the library refuses (keys another program wrote,
/// here `redsem:{}:i`) aborted the whole listing with exit code 2 and no rows.
#[test]
fn list_shows_a_leased_name_the_library_refuses_as_a_row_with_its_error() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let _held = client.semaphore("good", 3).unwrap().acquire().unwrap();
    redis::cmd("HSET")
        .arg("redsem:{}:i")
        .arg("f")
        .arg("v")
        .exec(&mut server.conn())
        .unwrap();
    let out = cli(&server, &["list"]);
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().next() == Some("good") && l.contains("leased")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("leased") && l.contains("error")),
        "{text}"
    );
    let out = cli(&server, &["--json", "list"]);
    assert_eq!(out.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = json.as_array().unwrap();
    assert!(rows.iter().any(|r| r["name"] == "good"), "{json}");
    assert!(
        rows.iter()
            .any(|r| r["name"] == "" && r["error"].is_string()),
        "{json}"
    );
}

/// Review: `status` warned "clients pass different limits ... store one with
/// set-limit" even when a limit was stored, which then governs every acquire; the
/// warning is shown (as `Semaphore::status` logs it) only while no limit is stored.
#[test]
fn status_warns_of_different_client_limits_only_while_no_limit_is_stored() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let _two = client.semaphore("mixed", 2).unwrap().acquire().unwrap();
    let _four = client.semaphore("mixed", 4).unwrap().acquire().unwrap();
    let text = stdout(&cli(&server, &["status", "mixed"]));
    assert!(text.contains("clients pass different limits"), "{text}");
    stdout(&cli(&server, &["set-limit", "mixed", "3"]));
    let text = stdout(&cli(&server, &["status", "mixed"]));
    assert!(
        text.contains("limit      3 (stored with set-limit)"),
        "{text}"
    );
    assert!(!text.contains("warning"), "{text}");
    assert!(!text.contains("different limits"), "{text}");
}

/// Review: `set-limit` on a counting semaphore (which has no limit) made a second,
/// leased semaphore of the same name, which `status` then showed instead of the
/// counting one. It is refused (exit status 2) and writes nothing. On a name without
/// keys the limit is still stored for the semaphore's first use, with a note that no
/// semaphore of that name exists yet.
#[test]
fn set_limit_refuses_a_counting_semaphore_and_notes_a_name_without_keys() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let tokens = client.counting_semaphore("tokens").unwrap();
    assert!(tokens.try_set_permits(4).unwrap());
    // (the count, and the operation key of that call: once.lua)
    let before = support::keys(&mut server.conn(), "redsem:{tokens}:*");
    for args in [
        &["set-limit", "tokens", "3"][..],
        &["--json", "set-limit", "tokens", "3"],
    ] {
        let out = cli(&server, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("\"tokens\""), "{err}");
        assert!(err.contains("counting semaphore"), "{err}");
        assert!(err.contains("no limit"), "{err}");
        assert!(out.stdout.is_empty(), "{args:?}: {out:?}");
    }
    // nothing was written: the counting semaphore is still the one `status` shows
    assert_eq!(
        support::keys(&mut server.conn(), "redsem:{tokens}:*"),
        before
    );
    assert!(
        before.contains(&"redsem:{tokens}:count".to_owned()),
        "{before:?}"
    );
    let text = stdout(&cli(&server, &["status", "tokens"]));
    assert!(text.contains("counting semaphore tokens"), "{text}");
    assert!(text.contains("count      4"), "{text}");

    // a name without keys: the limit is stored for its first use, with a note
    let out = cli(&server, &["set-limit", "fresh", "3"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(stdout(&out).contains("limit of fresh set to 3"), "{err}");
    assert!(err.contains("no semaphore \"fresh\""), "{err}");
    assert_eq!(client.semaphore("fresh", 1).unwrap().limit().unwrap(), 3);
    // a leased semaphore that exists: no note
    let out = cli(&server, &["set-limit", "fresh", "5"]);
    assert!(stdout(&out).contains("limit of fresh set to 5"));
    assert!(out.stderr.is_empty(), "{out:?}");
}

/// Review: `watch` on a name without keys drew an empty leased semaphore (limit
/// unknown, nothing held) every second; it now fails as `status` does, saying there
/// is no such semaphore (exit status 2).
#[test]
fn watch_of_a_name_without_keys_fails_as_status_does() {
    let server = RedisServer::start();
    for args in [
        &["watch", "nobody", "--count", "1"][..],
        &["--json", "watch", "nobody", "--count", "1"],
        &["status", "nobody"],
    ] {
        let out = cli(&server, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(err.contains("no semaphore \"nobody\""), "{args:?}: {err}");
        assert!(err.contains("no keys"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}: {out:?}");
    }
}

/// Review: a password the server requires but was not given got the hint "put it in
/// the URL or set ClientBuilder::password", which says neither how to write it in the
/// URL nor how to give it to the CLI; and a password typed without its leading ':'
/// (`redis://PASSWORD@host`, which reads as a user name, and a user name without a
/// password is not sent) got the same hint and was printed in clear in the URL.
#[test]
fn a_missing_password_says_how_to_give_it_and_a_lone_user_name_is_not_shown() {
    const SECRET: &str = "cli-lone-Pw";
    let server = support::AclServer::start(SECRET);
    let port = server.server.port();
    // `status x` at `url`, which the server refuses: its message
    let refused = |url: String| {
        let out = bare_cli(&["--url", &url, "status", "x"], &[]);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(err.contains("authentication failed"), "{err}");
        err
    };
    let err = refused(format!("redis://127.0.0.1:{port}/"));
    assert!(err.contains("redis://:PASSWORD@host:port/"), "{err}");
    assert!(err.contains("--password or REDIS_PASSWORD"), "{err}");
    assert!(!err.contains("user name without a password"), "{err}");

    // the password where a user name goes: hinted at, and not shown
    let err = refused(format!("redis://{SECRET}@127.0.0.1:{port}/"));
    assert!(
        err.contains("a user name without a password is not sent"),
        "{err}"
    );
    assert!(err.contains("redis://:PASSWORD@host"), "{err}");
    assert!(
        err.contains(&format!("redis://***@127.0.0.1:{port}/")),
        "{err}"
    );
    assert!(!err.contains(SECRET), "{err}");
    // written as the hint says, it works
    let ok = bare_cli(
        &[
            "--url",
            &format!("redis://:{SECRET}@127.0.0.1:{port}/"),
            "list",
        ],
        &[],
    );
    assert!(ok.status.success(), "{ok:?}");
}

/// Review: `watch` failed with "no semaphore ... (it has no keys)" as soon as the
/// semaphore it watched went idle (the last release deletes its keys). Only its first
/// screen fails for a name without keys; later screens show the semaphore empty.
#[test]
fn watch_goes_on_when_the_watched_semaphore_goes_idle() {
    use std::io::{BufRead, BufReader};
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = client.semaphore("goes-idle", 2).unwrap();
    let held = sem.acquire().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_redis-semaphore"))
        .args([
            "--url",
            &server.url(),
            "--json",
            "watch",
            "goes-idle",
            "--count",
            "3",
        ])
        .env_remove("REDIS_URL")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a first screen").unwrap();
    assert!(first.contains("\"held\":1"), "{first}");
    drop(held); // the last release: the keys are gone
    assert!(support::keys(&mut server.conn(), "*").is_empty());
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{status:?}: {err}");
    assert_eq!(rest.len(), 2, "{rest:?}");
    for screen in &rest {
        assert!(screen.contains("\"held\":0"), "{screen}");
    }
}

/// A holder member another program adds to the holders' zset (with a record and a
/// score out of the range of server times) whose name holds terminal escapes: the
/// error `status` fails with names it, and printed it raw (found by a review). (The
/// score is past the range: one in the past is an ended lease, which is not listed.)
#[test]
fn a_status_error_does_not_echo_a_crafted_holder_id() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = client.semaphore("esc", 2).unwrap();
    let _held = sem.acquire().unwrap();
    let mut conn = server.conn();
    let evil = "\x1b]0;pwned\x07\x1b[2J";
    redis::cmd("ZADD")
        .arg("redsem:{esc}:h")
        .arg("99000000000000000")
        .arg(evil)
        .exec(&mut conn)
        .unwrap();
    redis::cmd("HSET")
        .arg("redsem:{esc}:i")
        .arg(evil)
        .arg("1|1||1|1|h|")
        .exec(&mut conn)
        .unwrap();
    let out = cli(&server, &["status", "esc"]);
    let err = String::from_utf8_lossy(&out.stderr);
    // the error path: the holder's deadline is out of the range of server times
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("out of the range"), "{err}");
    assert!(
        !err.contains('\x1b') && !out.stdout.contains(&0x1b),
        "raw escape in the CLI's output: {err:?}"
    );
}

/// A holder id is shown escaped like every other text read from Redis: the scripts of
/// this crate write only uuid ids, but another program with write access can put any
/// member in the holders' zset, and `status` lists it.
#[test]
fn status_prints_a_foreign_holder_id_escaped() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let sem = client.semaphore("esc", 3).unwrap();
    let held = sem.acquire().unwrap();
    let mut conn = server.conn();
    let record: String = redis::cmd("HGET")
        .arg("redsem:{esc}:i")
        .arg(held.id())
        .query(&mut conn)
        .unwrap();
    let deadline: i64 = redis::cmd("ZSCORE")
        .arg("redsem:{esc}:h")
        .arg(held.id())
        .query(&mut conn)
        .unwrap();
    let evil = "\u{1b}]0;owned\u{7}\u{1b}[2J";
    let _: () = redis::cmd("ZADD")
        .arg("redsem:{esc}:h")
        .arg(deadline)
        .arg(evil)
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg("redsem:{esc}:i")
        .arg(evil)
        .arg(&record)
        .query(&mut conn)
        .unwrap();
    let out = cli(&server, &["status", "esc"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !text.contains('\u{1b}') && !err.contains('\u{1b}'),
        "status printed a raw escape sequence: {text:?} {err:?}"
    );
}

/// Output that cannot be written (a reader that went away: `watch NAME | head -1`; a
/// full disk) is an error with exit status 2, as documented, not a panic (101).
#[test]
fn output_that_cannot_be_written_is_exit_status_2_not_a_panic() {
    use std::process::Stdio;
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let _held = client.semaphore("piped", 2).unwrap().acquire().unwrap();
    // the reader closes the pipe before the second screen is drawn (a second later)
    let mut child = Command::new(env!("CARGO_BIN_EXE_redis-semaphore"))
        .args(["--url", &server.url(), "watch", "piped", "--count", "2"])
        .env_remove("REDIS_URL")
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "watch into a closed pipe: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // a full disk
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_redis-semaphore"))
        .args(["--url", &server.url(), "status", "piped"])
        .env_remove("REDIS_URL")
        .env("RUST_BACKTRACE", "0")
        .stdout(full)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "status into /dev/full: {err}");
    assert!(err.contains("cannot write the output"), "{err}");
}

/// Review (secrets and URLs): a URL whose settings would be ignored (`?db=`,
/// `?password=`), with `#insecure`, or naming a sentinel twice is refused by the CLI
/// with exit status 2 and a message naming the problem, from `--url` and from
/// `REDIS_URL` alike, without showing the password.
#[test]
fn urls_the_library_refuses_are_named_without_the_password() {
    #[allow(unused_mut)]
    let mut cases = vec![
        ("redis://127.0.0.1:1/?password=cli-q-Pw", "`password`"),
        ("redis://:cli-q-Pw@127.0.0.1:1/?db=3", "`db`"),
        ("redis+sentinel://:cli-q-Pw@h1,h1/svc", "listed twice"),
    ];
    #[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
    cases.push(("rediss://u:cli-q-Pw@127.0.0.1:1/#insecure", "#insecure"));
    for (url, want) in cases {
        for out in [
            bare_cli(&["--url", url, "list"], &[]),
            bare_cli(&["list"], &[("REDIS_URL", url)]),
        ] {
            assert_eq!(out.status.code(), Some(2), "{url}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains(want), "{url}: {err}");
            assert!(!err.contains("cli-q-Pw"), "{url}: {err}");
            assert!(out.stdout.is_empty(), "{url}");
        }
    }
}

/// Review (seventh session): a password that starts with `-` (as generated ones may)
/// given as `--password VALUE` was taken for an option: the command failed, and clap's
/// message quoted it (`unexpected argument '--Pw-...' found`, or its first letters for
/// a single `-`). `--password` and `--sentinel-password` now take such a value.
#[test]
fn a_password_that_starts_with_a_dash_is_taken_and_never_printed() {
    for password in ["--cli-dash-Pw", "-cli-dash-Pw"] {
        let server = support::AclServer::start(password);
        let plain = format!("redis://127.0.0.1:{}/", server.server.port());
        let out = bare_cli(&["--url", &plain, "--password", password, "list"], &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.contains("dash-Pw") && !err.contains("'-c'"),
            "{password}: {err}"
        );
        assert!(out.status.success(), "{password}: {err}");
        // the sentinels' password (not used with this URL) too
        let out = bare_cli(
            &[
                "--url",
                &plain,
                "--sentinel-password",
                password,
                "--password",
                password,
                "list",
            ],
            &[],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.contains("dash-Pw") && !err.contains("'-c'"),
            "{password}: {err}"
        );
        assert!(out.status.success(), "{password}: {err}");
    }
}

/// Review (eighth session): clap shows an `env` argument's value in `--help`
/// (`[env: REDIS_USER=alice]`) unless told not to; `REDIS_URL` and the passwords were
/// hidden, but `REDIS_USER` and `REDIS_SENTINEL_USER` printed their values in the help
/// of the command and of every subcommand (the options are global). No environment
/// value is shown; the variables' names still are.
#[test]
fn help_shows_no_environment_value() {
    const VARS: [&str; 5] = [
        "REDIS_URL",
        "REDIS_USER",
        "REDIS_PASSWORD",
        "REDIS_SENTINEL_USER",
        "REDIS_SENTINEL_PASSWORD",
    ];
    let markers: Vec<(String, String)> = VARS
        .iter()
        .map(|v| (v.to_string(), format!("marker-{}-7f3a", v.to_lowercase())))
        .collect();
    for args in [
        &["--help"][..],
        &["status", "--help"],
        &["list", "--help"],
        &["help", "watch"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_redis-semaphore"))
            .args(args)
            .envs(markers.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for (var, marker) in &markers {
            assert!(text.contains(&format!("[env: {var}")), "{args:?}: {text}");
            assert!(!text.contains(marker), "{args:?} shows {var}: {text}");
            assert!(!text.contains("marker-"), "{args:?}: {text}");
        }
    }
}

/// Review (2026-11-27, eighth session): `--url` naming the port of another kind of
/// server (a web server, a wrong port) failed after the whole checkout timeout (3 s)
/// with redis-rs's parser error, its line breaks shown escaped ("Incompatible type -
/// Parse error at 1\nUnexpected `33`..."). It now fails at once, saying the server
/// does not speak the Redis protocol and naming its address.
#[test]
fn a_url_naming_a_server_that_is_not_redis_says_so_at_once() {
    let port = support::http_server_port();
    let url = format!("redis://127.0.0.1:{port}/");
    let started = std::time::Instant::now();
    let out = bare_cli(&["--url", &url, "status", "jobs"], &[]);
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("127.0.0.1:{port}"))
            && err.contains("does not speak the Redis protocol"),
        "{err}"
    );
    assert!(!err.contains("\\n"), "{err}");
    // the CLI's checkout timeout is 3 s, its connect timeout 2 s
    assert!(took < Duration::from_millis(2500), "took {took:?}: {err}");
}

/// Ninth session (new-user review): `--json status` (and `--json watch`) of a counting
/// semaphore carried `"kind": "counting"`, but that of a leased one no `kind` at all,
/// so a script reading the output had to guess the kind from which fields were there
/// (`list --json` names it for both). Both now carry it.
#[test]
fn json_status_names_the_kind_of_either_semaphore() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let _held = client
        .semaphore("kind:leased", 2)
        .unwrap()
        .acquire()
        .unwrap();
    assert!(
        client
            .counting_semaphore("kind:counting")
            .unwrap()
            .try_set_permits(3)
            .unwrap()
    );
    for (name, kind) in [("kind:leased", "leased"), ("kind:counting", "counting")] {
        for args in [
            vec!["--json", "status", name],
            vec!["--json", "watch", name, "--count", "1"],
        ] {
            let json: serde_json::Value =
                serde_json::from_str(&stdout(&cli(&server, &args))).unwrap();
            assert_eq!(json["kind"], kind, "{args:?}: {json}");
            assert_eq!(json["name"], name, "{args:?}: {json}");
        }
    }
}
