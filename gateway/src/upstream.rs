//! Talking to workers: base URLs and the HTTP/1 client (no TLS: workers sit on a private
//! network next to the gateway).

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{AUTHORIZATION, HeaderValue};
use hyper::{Method, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// The pooled client every request, probe and health check goes through.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// How long a pooled connection to a worker may stay idle before it is closed.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Build the client.
pub fn client(connect_timeout: Duration, max_idle_per_host: usize) -> HttpClient {
    client_idle(connect_timeout, max_idle_per_host, POOL_IDLE_TIMEOUT)
}

/// [`client`] with idle connections closed after `idle`. The pool's timer is what closes
/// them: without one, hyper checks the timeout only when a checkout for the same worker comes
/// across the connection, so a connection no checkout reaches (once traffic to the worker
/// stops, or after a burst such as a probe's 16 streams) stays open past it.
fn client_idle(connect_timeout: Duration, max_idle_per_host: usize, idle: Duration) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(connect_timeout));
    connector.enforce_http(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(idle)
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .pool_max_idle_per_host(max_idle_per_host)
        .build(connector)
}

/// Why a worker's base URL is not usable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BaseUrlError {
    /// Not a URL at all.
    #[error("`{url}` is not a URL: {error}")]
    NotAUrl {
        /// As written.
        url: String,
        /// The parser's complaint.
        error: hyper::http::uri::InvalidUri,
    },
    /// Another scheme than plain `http`.
    #[error("`{url}`: scheme `{scheme}` is not supported (plain http only)")]
    Scheme {
        /// As written.
        url: String,
        /// The scheme given.
        scheme: String,
    },
    /// No scheme.
    #[error("`{url}`: needs a scheme, e.g. http://host:8000")]
    NoScheme {
        /// As written.
        url: String,
    },
    /// No host.
    #[error("`{url}`: needs a host")]
    NoHost {
        /// As written.
        url: String,
    },
    /// A query string, which request paths could not be appended to.
    #[error("`{url}`: must not have a query")]
    Query {
        /// As written.
        url: String,
    },
    /// A fragment (`#...`): the HTTP client drops it, and with it every path appended after it.
    #[error("`{url}`: must not have a fragment (`#...`)")]
    Fragment {
        /// As written.
        url: String,
    },
    /// User information (`user:password@`): credentials in a URL end up in logs and the admin
    /// API's answers.
    #[error("`{url}`: must not carry user information (`user@` or `user:password@`)")]
    UserInfo {
        /// As written.
        url: String,
    },
    /// A port that is not a number from 1 to 65535.
    #[error("`{url}`: the port must be a number from 1 to 65535")]
    Port {
        /// As written.
        url: String,
    },
    /// Longer than [`MAX_BASE_URL_BYTES`].
    #[error("a base URL of {len} bytes is too long (at most {MAX_BASE_URL_BYTES})")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// A path does not make a URL with this base (a path of the configuration that was not
    /// checked at load; never expected).
    #[error("`{url}` joined with `{path}` is not a URL: {error}")]
    Join {
        /// The base, as kept.
        url: String,
        /// The path appended.
        path: String,
        /// The parser's complaint.
        error: hyper::http::uri::InvalidUri,
    },
}

/// Longest base URL: far above any real one, and short enough that every path the gateway
/// appends ([`MAX_PATH_BYTES`]) still makes a URL (the HTTP library refuses 64 KiB ones).
pub const MAX_BASE_URL_BYTES: usize = 2048;
/// Longest path appended to a base URL (`health.path`).
pub const MAX_PATH_BYTES: usize = 1024;

/// Check a path to append to base URLs (`health.path`): it starts with `/`, has no fragment,
/// is at most [`MAX_PATH_BYTES`] and is a valid request path (no space nor control character).
/// The error says what is wrong.
pub fn check_path(path: &str) -> Result<(), PathError> {
    if !path.starts_with('/') {
        return Err(PathError::NoLeadingSlash);
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(PathError::TooLong { bytes: path.len() });
    }
    if path.contains('#') {
        return Err(PathError::Fragment);
    }
    path.parse::<hyper::http::uri::PathAndQuery>()
        .map(drop)
        .map_err(|error| PathError::NotARequestPath { error })
}

/// What is wrong with a path to append to base URLs ([`check_path`]); the message follows the
/// path's name (`` `/a b` is not a valid request path (...)``).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    /// It does not start with `/`.
    #[error("must start with `/`")]
    NoLeadingSlash,
    /// Longer than [`MAX_PATH_BYTES`].
    #[error("is {bytes} bytes long (at most {max})", max = MAX_PATH_BYTES)]
    TooLong {
        /// Its length.
        bytes: usize,
    },
    /// It has a fragment (`#...`), which is never sent.
    #[error("must not have a fragment (`#...`)")]
    Fragment,
    /// A space, control character or other byte a request path cannot carry.
    #[error(
        "is not a valid request path ({error}): escape spaces and other special characters as %XX"
    )]
    NotARequestPath {
        /// The parser's complaint.
        error: hyper::http::uri::InvalidUri,
    },
}

/// A worker's server root, `http://host:port[/prefix]`, and the API key every call to it
/// carries, if it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    root: String,
    key: Option<ApiKey>,
}

/// A worker's API key (`api_key_file`), kept as the `Authorization: Bearer <key>` header value
/// it is sent in, marked sensitive; `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(HeaderValue);

impl ApiKey {
    /// The header for `key` (one line of visible ASCII; the caller has checked its length).
    pub fn bearer(key: &str) -> Result<ApiKey, &'static str> {
        if !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("holds a space, control or non-ASCII character");
        }
        let mut value =
            HeaderValue::try_from(format!("Bearer {key}")).map_err(|_| "is not a header value")?;
        value.set_sensitive(true);
        Ok(ApiKey(value))
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(crate::logging::REDACTED)
    }
}

/// One URL on a worker and the worker's key: what every upstream call starts from, so that no
/// call (request, probe, health check, metrics poll) can leave the key out.
#[derive(Debug, Clone)]
pub struct Target {
    uri: Uri,
    key: Option<ApiKey>,
}

impl Target {
    /// A request to the URL, with `Authorization: Bearer <key>` when the worker has a key.
    pub fn request(&self, method: Method) -> hyper::http::request::Builder {
        let b = hyper::Request::builder()
            .method(method)
            .uri(self.uri.clone());
        match &self.key {
            Some(ApiKey(value)) => b.header(AUTHORIZATION, value.clone()),
            None => b,
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.uri.fmt(f)
    }
}

impl BaseUrl {
    /// Parse and check a base URL: `http` only, with a host and at most a port (1 to 65535),
    /// no user information, query or fragment, at most [`MAX_BASE_URL_BYTES`] long.
    pub fn parse(s: &str) -> Result<BaseUrl, BaseUrlError> {
        let url = || s.to_string();
        if s.len() > MAX_BASE_URL_BYTES {
            return Err(BaseUrlError::TooLong { len: s.len() });
        }
        // The URL parser accepts and then drops a fragment: refuse it before.
        if s.contains('#') {
            return Err(BaseUrlError::Fragment { url: url() });
        }
        let uri: Uri = s
            .parse()
            .map_err(|error| BaseUrlError::NotAUrl { url: url(), error })?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => {
                return Err(BaseUrlError::Scheme {
                    url: url(),
                    scheme: other.to_string(),
                });
            }
            None => return Err(BaseUrlError::NoScheme { url: url() }),
        }
        let Some(authority) = uri.authority() else {
            return Err(BaseUrlError::NoHost { url: url() });
        };
        if authority.as_str().contains('@') {
            return Err(BaseUrlError::UserInfo { url: url() });
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(BaseUrlError::NoHost { url: url() });
        }
        if !port_is_valid(authority.as_str()) {
            return Err(BaseUrlError::Port { url: url() });
        }
        if uri.query().is_some() {
            return Err(BaseUrlError::Query { url: url() });
        }
        Ok(BaseUrl {
            root: s.trim_end_matches('/').to_string(),
            key: None,
        })
    }

    /// This root with the worker's API key, sent on every call ([`Target::request`]).
    pub fn with_key(self, key: Option<ApiKey>) -> BaseUrl {
        BaseUrl { key, ..self }
    }

    /// The URL of `path` (which starts with `/`) on this worker. Never fails for a path that
    /// passed [`check_path`] (the bounds leave room), but a caller handles the error rather
    /// than trusting that: a panic here once killed the health loop.
    pub fn join(&self, path: &str) -> Result<Target, BaseUrlError> {
        let uri = format!("{}{}", self.root, path)
            .parse()
            .map_err(|error| BaseUrlError::Join {
                url: self.root.clone(),
                path: path.to_string(),
                error,
            })?;
        Ok(Target {
            uri,
            key: self.key.clone(),
        })
    }

    /// As written (without a trailing slash).
    pub fn as_str(&self) -> &str {
        &self.root
    }
}

/// The authority's port, if it names one, is a number from 1 to 65535 (the URL parser takes
/// `h:99999`, `h:0`, `h:abc` and `h:` alike).
fn port_is_valid(authority: &str) -> bool {
    // An IPv6 literal is bracketed: the port comes after `]`.
    let after_host = match authority.strip_prefix('[') {
        Some(rest) => rest.find(']').map_or("", |i| &rest[i + 1..]),
        None => authority.find(':').map_or("", |i| &authority[i..]),
    };
    match after_host.strip_prefix(':') {
        None => after_host.is_empty(),
        Some(port) => port.parse::<u16>().is_ok_and(|p| p >= 1),
    }
}

/// The body length a `Content-Length` header declares, if it is a number.
pub(crate) fn declared_length(headers: &hyper::HeaderMap) -> Option<u64> {
    headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// An error with its sources (hyper's own message is terse: "client error (Connect)").
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        let b = BaseUrl::parse("http://127.0.0.1:8000/").unwrap();
        assert_eq!(
            b.join("/v1/models").unwrap().to_string(),
            "http://127.0.0.1:8000/v1/models"
        );
        let b = BaseUrl::parse("http://h:1/engine").unwrap();
        assert_eq!(
            b.join("/health").unwrap().to_string(),
            "http://h:1/engine/health"
        );
        let b = BaseUrl::parse("http://[::1]:65535").unwrap();
        assert_eq!(b.join("/x").unwrap().to_string(), "http://[::1]:65535/x");
        assert!(matches!(
            BaseUrl::parse("https://h"),
            Err(BaseUrlError::Scheme { scheme, .. }) if scheme == "https"
        ));
        assert!(BaseUrl::parse("h:80").is_err());
        let e = BaseUrl::parse("http://h/?a=1").unwrap_err();
        assert!(matches!(e, BaseUrlError::Query { .. }));
        assert_eq!(e.to_string(), "`http://h/?a=1`: must not have a query");
    }

    /// Regression (issue 30, hardening 1 and 10): each of these was accepted, from the file and
    /// from the admin API; a 65 KB URL then made `join` panic in the health and probe loops,
    /// and a fragment silently sent every request to the server's root.
    #[test]
    fn urls_that_would_misroute_or_break_a_join_are_refused() {
        for (bad, what) in [
            ("http://h:0", "port"),
            ("http://h:99999", "port"),
            ("http://h:abc", "port"),
            ("http://h:", "port"),
            ("http://[::1]:0", "port"),
            ("http://user:pw@h:80", "user information"),
            ("http://user@h", "user information"),
            ("http://h:80/#frag", "fragment"),
            ("http://h#f", "fragment"),
            ("http://:80", "host"),
        ] {
            let e = BaseUrl::parse(bad).unwrap_err();
            assert!(e.to_string().contains(what), "{bad}: {e}");
        }
        let long = format!("http://h/{}", "a".repeat(65_000));
        let e = BaseUrl::parse(&long).unwrap_err();
        assert!(
            matches!(e, BaseUrlError::TooLong { len } if len == long.len()),
            "{e}"
        );
        // The longest base and the longest path still join.
        let base = format!("http://h/{}", "a".repeat(MAX_BASE_URL_BYTES - 9));
        let path = format!("/{}", "p".repeat(MAX_PATH_BYTES - 1));
        check_path(&path).unwrap();
        assert!(BaseUrl::parse(&base).unwrap().join(&path).is_ok());
    }

    /// Idle connections are closed once idle for the pool's timeout, after a burst and steady
    /// traffic, once the traffic stops (before the pool had a timer, 2 of the 8 stayed open).
    #[test]
    fn idle_connections_close_after_the_timeout_while_traffic_goes_on() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let open = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let counted = open.clone();
            tokio::spawn(async move {
                use std::sync::atomic::Ordering::SeqCst;
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        return;
                    };
                    let open = counted.clone();
                    open.fetch_add(1, SeqCst);
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(|_req| async {
                            // Slow enough that 8 requests sent together need 8 connections.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                                Bytes::from_static(b"ok"),
                            )))
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                            .await;
                        open.fetch_sub(1, SeqCst);
                    });
                }
            });
            let c = client_idle(Duration::from_secs(1), 64, Duration::from_millis(300));
            let get = |c: HttpClient| async move {
                let req = hyper::Request::get(format!("http://{addr}/"))
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                let r = c.request(req).await.unwrap();
                http_body_util::BodyExt::collect(r.into_body())
                    .await
                    .unwrap();
            };
            let burst: Vec<_> = (0..8).map(|_| tokio::spawn(get(c.clone()))).collect();
            for b in burst {
                b.await.unwrap();
            }
            let now = || open.load(std::sync::atomic::Ordering::SeqCst);
            assert_eq!(now(), 8, "the burst opened 8 connections");
            // Steady traffic, one request at a time, for 5 idle timeouts.
            let until = tokio::time::Instant::now() + Duration::from_millis(1_500);
            while tokio::time::Instant::now() < until {
                get(c.clone()).await;
            }
            // Then none: every connection closes within a few timeouts of its last use.
            let until = tokio::time::Instant::now() + Duration::from_secs(3);
            while now() > 0 && tokio::time::Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert_eq!(now(), 0, "connections left open after their idle timeout");
        });
    }

    #[test]
    fn health_paths_are_request_paths() {
        for ok in ["/health", "/v1/models", "/a%20b", "/h?x=1"] {
            check_path(ok).unwrap();
        }
        for (bad, what) in [
            ("/a b", "not a valid request path"),
            ("health", "start with"),
            ("/a#b", "fragment"),
            ("/\u{7}", "not a valid request path"),
        ] {
            let e = check_path(bad).unwrap_err().to_string();
            assert!(e.contains(what), "{bad}: {e}");
        }
        assert!(check_path(&format!("/{}", "a".repeat(MAX_PATH_BYTES))).is_err());
    }
}
