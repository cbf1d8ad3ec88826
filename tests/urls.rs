//! The URL forms of `Client::open` that need no server: Sentinel and Cluster URLs make
//! a client (no connection yet), their TLS forms too when a TLS feature is on, bad URLs
//! and TLS URLs without a TLS feature are clear errors, and no message or `Debug`
//! output shows a password. (Those of `unix://` URLs run a private server on a socket.)

mod support;

use redis_semaphore::{Client, Error};

const SECRET: &str = "s3cret-Pw";

fn invalid(url: &str) -> String {
    match Client::open(url) {
        Err(e @ Error::InvalidArgument(_)) => {
            let text = e.to_string();
            assert!(!text.contains(SECRET), "{text}");
            assert!(!format!("{e:?}").contains(SECRET), "{e:?}");
            text
        }
        Err(e) => panic!("{url}: expected InvalidArgument, got {e:?}"),
        Ok(c) => panic!("{url}: opened {c:?}"),
    }
}

#[test]
fn sentinel_and_cluster_urls_make_a_client_in_both_forms() {
    // no connection is made until the first operation
    Client::open(format!(
        "redis+sentinel://u:{SECRET}@h1:26379,h2:26379/mymaster"
    ))
    .unwrap();
    let cluster = Client::open(format!("redis+cluster://u:{SECRET}@h1:7000,h2:7001")).unwrap();
    assert!(!format!("{cluster:?}").contains(SECRET));
    for url in [
        format!("rediss+sentinel://u:{SECRET}@h1:26379,h2:26379/mymaster"),
        format!("rediss+cluster://u:{SECRET}@h1:7000,h2:7001"),
    ] {
        if cfg!(any(feature = "tls-rustls", feature = "tls-native-tls")) {
            let client = Client::open(&url).unwrap();
            assert!(!format!("{client:?}").contains(SECRET));
        } else {
            // without a TLS feature the URL is refused, naming the feature
            let text = invalid(&url);
            assert!(text.contains("tls-rustls"), "{text}");
            assert!(text.contains("u:***@h1"), "{text}");
        }
    }
}

#[test]
fn bad_urls_are_clear_errors_without_the_password() {
    for url in [
        format!("redis://u:{SECRET}@host:notaport/"),
        format!("redis+sentinel://u:{SECRET}@h1:26379"),
        format!("redis+cluster://u:{SECRET}@h1:0"),
        format!("ftp://u:{SECRET}@host/"),
        "".to_string(),
    ] {
        let text = invalid(&url);
        assert!(text.contains("bad Redis URL"), "{text}");
    }
}

#[test]
fn debug_output_never_shows_the_password() {
    let client = Client::open(format!("redis://u:{SECRET}@127.0.0.1:1/")).unwrap();
    let debug = format!("{client:?}");
    assert!(!debug.contains(SECRET), "{debug}");
    assert!(debug.contains("127.0.0.1:1"), "{debug}");
    let builder = Client::builder().username("u").password(SECRET);
    assert!(!format!("{builder:?}").contains(SECRET));
}

#[cfg(not(any(feature = "tls-rustls", feature = "tls-native-tls")))]
#[test]
fn tls_urls_without_a_tls_feature_name_the_feature() {
    for url in [
        format!("rediss://u:{SECRET}@host:6380/"),
        format!("rediss+cluster://u:{SECRET}@h1:7000"),
    ] {
        let text = invalid(&url);
        assert!(text.contains("tls-rustls"), "{text}");
    }
}

#[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
#[test]
fn tls_files_with_a_plaintext_url_are_refused() {
    let err = Client::builder()
        .tls_ca_file("/some/ca.crt")
        .build(format!("redis://u:{SECRET}@host/"))
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("rediss://"), "{text}");
    assert!(!text.contains(SECRET), "{text}");
}

/// A `?` or `#` in a password that is not percent-encoded ends the URL's authority:
/// the URL parser took the user name and the start of the password for the host and
/// dropped the credentials (`redis://localhost:7642#pw@redis.internal:6379/` connected
/// to localhost without AUTH). Refused, as the Sentinel and cluster forms refuse it,
/// without showing the password.
#[test]
fn an_unencoded_question_mark_or_hash_in_a_password_is_refused() {
    for url in [
        "redis://admin:pa#ss-wd@h:6379/",
        "redis://admin:pa?ss-wd@h:6379/0",
        "redis://localhost:7642#ss-wd@redis.internal:6379/",
    ] {
        let e = Client::open(url).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, Error::InvalidArgument(_)), "{url}: {e:?}");
        assert!(text.contains("percent-encode"), "{text}");
        assert!(!text.contains("ss-wd"), "{text}");
        assert!(!format!("{e:?}").contains("ss-wd"), "{e:?}");
    }
    // encoded, and '?' or '@' where they belong, still open
    for url in [
        "redis://admin:pa%23ss%3Fwd@h:6379/",
        "redis://h:6379/0?protocol=resp3",
        "redis://h:6379/0#fragment",
    ] {
        Client::open(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    }
}

/// A host name that does not resolve is reported as such for every kind of URL. The
/// Sentinel and cluster clients of `redis` report it in a kind that read as a dropped
/// connection, so the message said "the server closed the connection during the
/// handshake (is this a TLS port?...)" and named the lookup failure only at its end.
#[test]
fn a_host_name_that_does_not_resolve_is_named_as_such() {
    #[allow(unused_mut)]
    let mut urls = vec![
        "redis://no-such-host.invalid:6379/",
        "redis+sentinel://no-such-host.invalid:26379/mymaster",
        "redis+cluster://no-such-host.invalid:7000",
    ];
    // (over TLS it read "TLS connection failed")
    #[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
    urls.extend([
        "rediss://no-such-host.invalid:6379/",
        "rediss+sentinel://no-such-host.invalid:26379/mymaster",
        "rediss+cluster://no-such-host.invalid:7000",
    ]);
    for url in urls {
        let client = Client::builder()
            .connect_timeout(std::time::Duration::from_secs(2))
            .build(url)
            .unwrap();
        match client.ping() {
            Err(Error::Connect { message, .. }) => {
                assert!(
                    message.starts_with("the host name does not resolve"),
                    "{url}: {message}"
                );
                assert!(!message.contains("TLS port"), "{url}: {message}");
            }
            other => panic!("{url}: {other:?}"),
        }
    }
}

/// Review: a misspelt scheme (`redi://`, `reids://`, `http://`) said only "Redis URL did
/// not parse - InvalidClientConfig", and so did a port out of range; the first now
/// lists the schemes taken, as a URL without `://` does, and the second names the port.
#[test]
fn a_misspelt_scheme_or_a_bad_port_is_named() {
    for url in [
        format!("redi://u:{SECRET}@h:6379/"),
        "reids://h:6379/".to_owned(),
        "http://127.0.0.1:6379/".to_owned(),
        "REDI://h/".to_owned(),
        // for comparison: no scheme at all
        "127.0.0.1:6379".to_owned(),
    ] {
        let text = invalid(&url);
        assert!(
            text.contains(
                "expected redis://, rediss://, unix://, redis+sentinel:// or redis+cluster://"
            ),
            "{url}: {text}"
        );
        assert!(!text.contains("InvalidClientConfig"), "{url}: {text}");
    }
    for url in [
        "redis://127.0.0.1:99999/".to_owned(),
        format!("redis://u:{SECRET}@127.0.0.1:65536/0"),
        "redis://[::1]:99999/".to_owned(),
        "redis://h:notaport/".to_owned(),
        "valkey://h:-1/".to_owned(),
    ] {
        let text = invalid(&url);
        assert!(text.contains("port"), "{url}: {text}");
        assert!(text.contains("1 to 65535"), "{url}: {text}");
        assert!(!text.contains("InvalidClientConfig"), "{url}: {text}");
    }
    // a '/' in a password that is not percent-encoded cuts the host short: named as
    // such, not as a bad port, and without the password
    let text = invalid("redis://admin:s3cret-Pw/x@h:6379/");
    assert!(text.contains("%2F"), "{text}");
    assert!(!text.contains("port"), "{text}");
}

/// Review (secrets and URLs): redis-rs reads `rediss://host/#insecure` as "check no
/// certificate and no host name". With `tls-native-tls` that turned verification off
/// without a word from this crate, which documents no insecure mode; with
/// `tls-rustls` the URL opened and every connect then failed with a retryable "TLS
/// connection failed". Refused when the client is built, naming the way to trust a
/// private CA instead.
#[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
#[test]
fn an_insecure_tls_fragment_is_refused() {
    for url in [
        format!("rediss://u:{SECRET}@127.0.0.1:6380/#insecure"),
        "rediss://localhost:6380/0#insecure".to_owned(),
        "valkeys://localhost:6380/#insecure".to_owned(),
    ] {
        let text = invalid(&url);
        assert!(text.contains("#insecure"), "{url}: {text}");
        assert!(text.contains("tls_ca_file"), "{url}: {text}");
    }
    // the topology forms take no fragment at all
    for url in [
        "rediss+sentinel://h1:26379/svc#insecure",
        "rediss+cluster://h1:7000#insecure",
    ] {
        let text = invalid(url);
        assert!(
            text.contains("fragments are not supported"),
            "{url}: {text}"
        );
    }
}

/// Review: a negative database index (`redis://host/-1`, `unix://...?db=-1`) was taken
/// by redis-rs and refused by the server only at the first connect; the Sentinel form
/// already refused it. Now every form refuses it before any network call.
#[test]
fn a_negative_database_is_refused_before_any_connect() {
    for url in [
        format!("redis://u:{SECRET}@127.0.0.1:6379/-1"),
        "redis://127.0.0.1:6379/-7".to_owned(),
        format!("unix:///tmp/redsem-none.sock?db=-1&pass={SECRET}"),
    ] {
        let text = invalid(&url);
        assert!(text.contains("database -"), "{url}: {text}");
        assert!(text.contains("0 or more"), "{url}: {text}");
    }
    let text = invalid("redis+sentinel://h1/svc/-1");
    assert!(text.contains("not a number"), "{text}");
}

/// Review: redis-rs reads `db`, `user` and `pass` query parameters only in `unix://`
/// URLs and ignores them in a TCP URL: `redis://host:6379/?db=3` sent every semaphore
/// to database 0 (sharing it with whatever used database 0), and
/// `redis://host/?password=...` connected without a password. Refused, naming the
/// parameter and where the setting goes, never the value.
#[test]
fn settings_a_tcp_url_would_ignore_in_its_query_are_refused() {
    for (url, key, hint) in [
        ("redis://127.0.0.1:6379/?db=3".to_owned(), "db", "/DB"),
        (
            "redis://127.0.0.1:6379/?DB=3&protocol=resp3".to_owned(),
            "db",
            "/DB",
        ),
        (
            format!("redis://h:6379/0?password={SECRET}"),
            "password",
            "user:password@",
        ),
        (
            format!("redis://h/?user=app&pass={SECRET}"),
            "user",
            "user:password@",
        ),
        (
            format!("redis://h/?pa%73s={SECRET}"),
            "pass",
            "ClientBuilder::password",
        ),
        (
            "valkey://h/?username=app#x".to_owned(),
            "username",
            "user:password@",
        ),
    ] {
        let text = invalid(&url);
        assert!(text.contains(&format!("`{key}`")), "{url}: {text}");
        assert!(text.contains(hint), "{url}: {text}");
        assert!(text.contains("unix://"), "{url}: {text}");
    }
    // what redis-rs reads in a TCP URL, and the unix form's own parameters, still open
    for url in [
        "redis://h:6379/2?protocol=resp3",
        "unix:///tmp/redsem-none.sock?db=2&user=app&pass=pw",
        "redis+unix:///tmp/redsem-none.sock?db=1",
        "redis://h:6379/0#frag?db=3",
    ] {
        Client::open(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    }
}

/// Review: the host lists of the Sentinel and cluster forms took a host listed twice
/// (`h1,h1`: most likely `h2` mistyped, leaving one sentinel where two were meant), a
/// bracketed host that is no IPv6 address (`[zzz]`, tried as the host name `zzz`), and
/// a wildcard address (`0.0.0.0`, `[::]`, which redis-rs refuses in a `redis://` URL).
/// Each is now refused, naming the host.
#[test]
fn duplicate_wildcard_and_malformed_hosts_in_a_host_list_are_refused() {
    for (url, want) in [
        (
            format!("redis+sentinel://u:{SECRET}@h1,h1/svc"),
            "h1:26379 is listed twice",
        ),
        (
            "redis+sentinel://h1:26379,H1/svc".to_owned(),
            "H1:26379 is listed twice",
        ),
        (
            "redis+cluster://h1:7000,h2:7001,h1:7000".to_owned(),
            "h1:7000 is listed twice",
        ),
        (
            "redis+cluster://[::1]:7000,[::1]:7000".to_owned(),
            "[::1]:7000 is listed twice",
        ),
        (
            "redis+cluster://[zzz]:7000".to_owned(),
            "not an IPv6 address",
        ),
        (
            "redis+sentinel://[127.0.0.1]:26379/svc".to_owned(),
            "not an IPv6 address",
        ),
        ("redis+cluster://0.0.0.0:7000".to_owned(), "wildcard"),
        ("redis+sentinel://[::]:26379/svc".to_owned(), "wildcard"),
        ("redis+sentinel://h1,/svc".to_owned(), "empty host"),
    ] {
        let text = invalid(&url);
        assert!(text.contains(want), "{url}: {text}");
    }
    // the same host on two ports, IPv6 literals and a zone still open
    for url in [
        "redis+cluster://h1:7000,h1:7001",
        "redis+cluster://[::1]:7000,[fe80::1%eth0]:7001",
        "redis+sentinel://[::1],127.0.0.1/svc",
    ] {
        Client::open(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    }
}

/// Review: a one-server URL without a host (`redis://user@:6379/`) or with an IPv6
/// address missing its `]` said only "Redis URL did not parse - InvalidClientConfig".
#[test]
fn a_missing_host_or_an_unclosed_ipv6_bracket_is_named() {
    for (url, want) in [
        (format!("redis://u:{SECRET}@:6379/"), "no host given"),
        (format!("redis://:{SECRET}@/"), "no host given"),
        ("redis://".to_owned(), "no host given"),
        ("redis://[::1/".to_owned(), "closing ]"),
        (format!("redis://:{SECRET}@[::1:6379/0"), "closing ]"),
    ] {
        let text = invalid(&url);
        assert!(text.contains(want), "{url}: {text}");
        assert!(!text.contains("InvalidClientConfig"), "{url}: {text}");
    }
}

/// Every public `Debug` of a client, its builder, a semaphore and an error, for every
/// URL form with a password in each place a URL can carry one (user info, plain and
/// percent-encoded; a password alone, as a Sentinel URL's data-node password; a user
/// name alone, which may be a password missing its `:`; a `pass=` parameter), shows
/// no password. (Coverage: passes without the fixes above.)
#[test]
fn no_public_debug_or_display_shows_a_password() {
    const ENCODED: &str = "s3cret%2FPw%40x"; // s3cret/Pw@x
    let mut urls = vec![
        format!("redis://app:{SECRET}@127.0.0.1:1/"),
        format!("redis://app:{ENCODED}@127.0.0.1:1/"),
        format!("redis://{SECRET}@127.0.0.1:1/"),
        format!("redis+sentinel://:{SECRET}@127.0.0.1:1/svc"),
        format!("redis+sentinel://app:{ENCODED}@127.0.0.1:1,[::1]:2/svc/3"),
        format!("redis+sentinel://{SECRET}@127.0.0.1:1/svc"),
        format!("redis+cluster://app:{SECRET}@127.0.0.1:1"),
        format!("redis+cluster://:{ENCODED}@127.0.0.1:1"),
        format!("unix:///tmp/redsem-none.sock?user=app&pass={SECRET}"),
    ];
    if cfg!(any(feature = "tls-rustls", feature = "tls-native-tls")) {
        urls.extend([
            format!("rediss://app:{SECRET}@127.0.0.1:1/"),
            format!("rediss+sentinel://:{SECRET}@127.0.0.1:1/svc"),
            format!("rediss+cluster://app:{ENCODED}@127.0.0.1:1"),
        ]);
    }
    let hidden = |what: &str, shown: &str| {
        for secret in [SECRET, ENCODED, "s3cret/Pw@x"] {
            assert!(!shown.contains(secret), "{what}: {shown}");
        }
    };
    for url in &urls {
        let builder = Client::builder()
            .connect_timeout(std::time::Duration::from_millis(300))
            .checkout_timeout(std::time::Duration::from_millis(300))
            .password(format!("{SECRET}-b"))
            .sentinel_username("sentinel-user")
            .sentinel_password(format!("{SECRET}-s"));
        hidden(url, &format!("{builder:?}"));
        let client = builder.build(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        hidden(url, &format!("{client:?}"));
        let sem = client.semaphore("debug", 1).unwrap();
        hidden(url, &format!("{sem:?}"));
        // nothing listens on ports 1 and 2, the socket does not exist: every error
        let e = client.ping().unwrap_err();
        hidden(url, &format!("{e} {e:?}"));
        let e = sem.try_acquire().unwrap_err();
        hidden(url, &format!("{e} {e:?}"));
    }
}

/// Review (seventh session): redis-rs reads a `unix://` URL's settings from three
/// query parameters spelt exactly `db`, `user` and `pass`, and ignores its user info.
/// Every other spelling was taken and ignored: `?database=3` (or `?DB=3`) sent every
/// semaphore to database 0, where other services' semaphores of the same name live,
/// and `?password=..`, `?Pass=..` or `unix://:PW@localhost/path` connected without the
/// password (a NOAUTH at the first operation, whose hint said to write a `redis://`
/// URL). Refused, as the TCP form's ignored parameters are, naming the parameter and
/// never its value.
#[test]
fn settings_a_unix_url_would_ignore_are_refused() {
    let folder = tempfile::tempdir().unwrap();
    let sock = folder.path().join("r.sock");
    let sock = sock.to_str().unwrap();
    let server =
        support::RedisServer::start_with(&["--unixsocket", sock, "--unixsocketperm", "700"]);
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(SECRET)
        .exec(&mut server.conn())
        .unwrap();
    let keys_in = |db: i64| -> Vec<String> {
        let mut conn = server.conn();
        let _: () = redis::cmd("AUTH").arg(SECRET).query(&mut conn).unwrap();
        let _: () = redis::cmd("SELECT").arg(db).query(&mut conn).unwrap();
        redis::cmd("KEYS").arg("redsem:*").query(&mut conn).unwrap()
    };
    // the spellings redis-rs reads: the limit lands in database 3
    let good = format!("unix://{sock}?db=3&pass={SECRET}");
    let client = Client::open(good.as_str()).unwrap();
    client
        .semaphore("unix-db", 2)
        .unwrap()
        .set_limit(2)
        .unwrap();
    assert!(!keys_in(3).is_empty(), "{:?}", keys_in(3));
    assert!(keys_in(0).is_empty(), "{:?}", keys_in(0));
    // without the password: the hint shows where a unix:// URL carries one
    let e = Client::open(format!("unix://{sock}").as_str())
        .unwrap()
        .ping()
        .unwrap_err();
    assert!(matches!(e, Error::Auth { .. }), "{e:?}");
    assert!(e.to_string().contains("?pass=PASSWORD"), "{e}");
    assert!(!e.to_string().contains("redis://"), "{e}");

    for (url, named) in [
        (
            format!("unix://{sock}?pass={SECRET}&database=3"),
            "`database`",
        ),
        (format!("unix://{sock}?pass={SECRET}&DB=3"), "`DB`"),
        (format!("unix://{sock}?password={SECRET}"), "`password`"),
        (format!("unix://{sock}?Pass={SECRET}"), "`Pass`"),
        (
            format!("unix://{sock}?username=default&pass={SECRET}"),
            "`username`",
        ),
        (format!("unix://:{SECRET}@localhost{sock}"), "user info"),
        (
            format!("unix://default:{SECRET}@localhost{sock}"),
            "user info",
        ),
    ] {
        match Client::open(url.as_str()) {
            Err(e @ Error::InvalidArgument(_)) => {
                let text = e.to_string();
                assert!(!text.contains(SECRET), "{text}");
                assert!(!format!("{e:?}").contains(SECRET), "{e:?}");
                assert!(text.contains(named), "{url}: {text}");
                assert!(text.contains("`db`, `user` and `pass`"), "{url}: {text}");
            }
            Err(e) => panic!("{url}: expected InvalidArgument, got {e:?}"),
            Ok(client) => {
                // what the URL asked for is lost: show what happened instead
                let done = client
                    .semaphore("unix-ignored", 2)
                    .and_then(|s| s.set_limit(2));
                panic!(
                    "{}: opened; set_limit gave {done:?}; database 0 holds {:?}",
                    redis_semaphore::redact_url(&url),
                    keys_in(0)
                );
            }
        }
    }
}

/// Review (eighth session): a user name followed by an empty password
/// (`redis://s3cret:@host`, a password written in the user part, as with Redis before
/// 6, with a stray `:`) was shown by `redact_url` and every message built with it,
/// while the same name without the `:` was hidden. A user name is now shown only when
/// a non-empty password follows it (as `Debug` output shows one); otherwise the whole
/// user info is `***`, and the address is still shown.
#[test]
fn a_user_name_with_an_empty_password_is_redacted() {
    for (url, want) in [
        (
            format!("redis://{SECRET}:@redis.internal:6379/"),
            "redis://***@redis.internal:6379/",
        ),
        (
            format!("rediss://{SECRET}:@redis.internal:6380/0"),
            "rediss://***@redis.internal:6380/0",
        ),
        (
            format!("redis+sentinel://{SECRET}:@h1:26379,h2/svc"),
            "redis+sentinel://***@h1:26379,h2/svc",
        ),
        (
            format!("redis+cluster://{SECRET}:@h1:7000"),
            "redis+cluster://***@h1:7000",
        ),
        ("redis://:@h:1/".to_owned(), "redis://***@h:1/"),
        // unchanged: a user name with a password, a password alone, a bare name
        (format!("redis://app:{SECRET}@h:1/"), "redis://app:***@h:1/"),
        (format!("redis://:{SECRET}@h:1/"), "redis://:***@h:1/"),
        (format!("redis://{SECRET}@h:1/"), "redis://***@h:1/"),
        ("redis://h:1/".to_owned(), "redis://h:1/"),
    ] {
        assert_eq!(redis_semaphore::redact_url(&url), want, "{want}");
    }
    // and in the messages that show a URL
    let text = invalid(&format!("redis://{SECRET}:@host:notaport/"));
    assert!(text.contains("redis://***@host:notaport/"), "{text}");
    let text = invalid(&format!("redis+cluster://{SECRET}:@h1:0"));
    assert!(text.contains("bad Redis URL"), "{text}");
}

/// Review (2026-11-27, eighth session): a URL naming the port of another kind of
/// server (a web server, a typo in the port) failed every call only after the whole
/// checkout timeout (5 s by default), with redis-rs's parser error as the only
/// explanation, over several lines ("Incompatible type - Parse error at 1\nUnexpected
/// `84`..."), and called it retryable. It is now an `Error::Connect` that says the
/// server does not speak the Redis protocol, on one line, at once, and not retryable
/// (waiting will not turn it into Redis).
#[test]
fn a_server_that_does_not_speak_redis_is_named_at_once() {
    let port = support::http_server_port();
    let client = Client::builder()
        .connect_timeout(std::time::Duration::from_millis(500))
        .checkout_timeout(std::time::Duration::from_secs(20))
        .build(format!("redis://:{SECRET}@127.0.0.1:{port}/"))
        .unwrap();
    let sem = client.semaphore("jobs", 1).unwrap();
    let started = std::time::Instant::now();
    let errors = [
        sem.status().map(|_| ()).unwrap_err(),
        sem.try_acquire().map(|_| ()).unwrap_err(),
        client.ping().unwrap_err(),
    ];
    // within the connect timeouts, far from the checkout timeout
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    for e in errors {
        let text = e.to_string();
        let Error::Connect { addr, message } = &e else {
            panic!("expected Error::Connect, got {e:?}");
        };
        assert_eq!(addr, &format!("127.0.0.1:{port}"), "{text}");
        assert!(
            message.contains("does not speak the Redis protocol"),
            "{text}"
        );
        assert!(!text.contains('\n') && !text.contains(SECRET), "{text}");
        assert!(!e.is_retryable(), "{text}");
    }
}
