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

/// A worker's server root, `http://host:port[/prefix]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    root: String,
}

impl BaseUrl {
    /// Parse and check a base URL: `http` only, with a host, no query.
    pub fn parse(s: &str) -> Result<BaseUrl, String> {
        let uri: Uri = s.parse().map_err(|e| format!("`{s}` is not a URL: {e}"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => {
                return Err(format!(
                    "`{s}`: scheme `{other}` is not supported (plain http only)"
                ));
            }
            None => return Err(format!("`{s}`: needs a scheme, e.g. http://host:8000")),
        }
        if uri.authority().is_none() {
            return Err(format!("`{s}`: needs a host"));
        }
        if uri.query().is_some() {
            return Err(format!("`{s}`: must not have a query"));
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
        assert!(BaseUrl::parse("https://h").is_err());
        assert!(BaseUrl::parse("h:80").is_err());
        assert!(BaseUrl::parse("http://h/?a=1").is_err());
    }
}
