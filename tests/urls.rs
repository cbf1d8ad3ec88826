//! The URL forms of `Client::open` that need no server: Sentinel and Cluster URLs make
//! a client (no connection yet), their TLS forms too when a TLS feature is on, bad URLs
//! and TLS URLs without a TLS feature are clear errors, and no message or `Debug`
//! output shows a password.

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
