//! Talking to workers: base URLs and the HTTP/1 client (no TLS: workers sit on a private
//! network next to the gateway).

use bytes::Bytes;
use http_body_util::Full;
use hyper::Uri;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// The pooled client every request, probe and health check goes through.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Build the client.
pub fn client(connect_timeout: Duration, max_idle_per_host: usize) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(connect_timeout));
    connector.enforce_http(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(60))
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
}

/// A worker's server root, `http://host:port[/prefix]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    root: String,
}

impl BaseUrl {
    /// Parse and check a base URL: `http` only, with a host, no query.
    pub fn parse(s: &str) -> Result<BaseUrl, BaseUrlError> {
        let url = || s.to_string();
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
        if uri.authority().is_none() {
            return Err(BaseUrlError::NoHost { url: url() });
        }
        if uri.query().is_some() {
            return Err(BaseUrlError::Query { url: url() });
        }
        Ok(BaseUrl {
            root: s.trim_end_matches('/').to_string(),
        })
    }

    /// The URL of `path` (which starts with `/`) on this worker.
    pub fn join(&self, path: &str) -> Uri {
        format!("{}{}", self.root, path)
            .parse()
            .expect("a valid base URL joined with a valid path is a valid URL")
    }

    /// As written (without a trailing slash).
    pub fn as_str(&self) -> &str {
        &self.root
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        let b = BaseUrl::parse("http://127.0.0.1:8000/").unwrap();
        assert_eq!(
            b.join("/v1/models").to_string(),
            "http://127.0.0.1:8000/v1/models"
        );
        let b = BaseUrl::parse("http://h:1/engine").unwrap();
        assert_eq!(b.join("/health").to_string(), "http://h:1/engine/health");
        assert!(matches!(
            BaseUrl::parse("https://h"),
            Err(BaseUrlError::Scheme { scheme, .. }) if scheme == "https"
        ));
        assert!(BaseUrl::parse("h:80").is_err());
        let e = BaseUrl::parse("http://h/?a=1").unwrap_err();
        assert!(matches!(e, BaseUrlError::Query { .. }));
        assert_eq!(e.to_string(), "`http://h/?a=1`: must not have a query");
    }
}
