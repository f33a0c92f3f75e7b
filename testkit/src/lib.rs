//! Test helpers shared by routelab's packages (a dev-dependency only, never published).
//!
//! [`ChromeDriver`] and [`Browser`] drive a real headless Chromium through chromedriver's W3C
//! WebDriver HTTP API (<https://www.w3.org/TR/webdriver2/>), spoken with a small hyper client:
//! the gateway's admin page test and the lab's `report.html` test both use them. They need the
//! Debian packages `chromium` and `chromium-driver` (`.ci/run` installs them). Every wait is
//! bounded; chromedriver listens on 127.0.0.1 only and is killed, with the browsers it started,
//! when its [`ChromeDriver`] is dropped (also when a test panics).
//!
//! [`NatsServer`] runs a `nats-server` on loopback for the tests of gateway replicas sharing
//! their dispatches over NATS ([`nats`]).

#![forbid(unsafe_code)]

pub mod nats;
pub use nats::NatsServer;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The longest any one WebDriver command, or chromedriver's start-up, may take.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(20);

/// The key under which WebDriver returns an element reference (W3C WebDriver, "elements").
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// Why a WebDriver command failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebDriverError {
    /// The HTTP exchange with chromedriver failed.
    #[error("talking to chromedriver at {url}: {message}")]
    Transport {
        /// The command's URL.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// No answer within [`COMMAND_TIMEOUT`].
    #[error("no WebDriver answer to {url} within {COMMAND_TIMEOUT:?}")]
    Timeout {
        /// The command's URL.
        url: String,
    },
    /// chromedriver answered with a WebDriver error (`no such element`, `javascript error`…).
    #[error("{error}: {message}")]
    Command {
        /// The WebDriver error code.
        error: String,
        /// Its message.
        message: String,
    },
}

/// One WebDriver command: its `value`, or the WebDriver error.
async fn webdriver(
    c: &HttpClient,
    method: Method,
    url: &str,
    body: Option<Value>,
) -> Result<Value, WebDriverError> {
    let transport = |message: String| WebDriverError::Transport {
        url: url.to_string(),
        message,
    };
    let req = Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(
            body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string())),
        ))
        .map_err(|e| transport(e.to_string()))?;
    let (status, bytes) = tokio::time::timeout(COMMAND_TIMEOUT, async {
        let r = c.request(req).await.map_err(|e| transport(e.to_string()))?;
        let status = r.status();
        let bytes = r
            .into_body()
            .collect()
            .await
            .map_err(|e| transport(e.to_string()))?
            .to_bytes();
        Ok::<_, WebDriverError>((status, bytes))
    })
    .await
    .map_err(|_| WebDriverError::Timeout {
        url: url.to_string(),
    })??;
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| transport(e.to_string()))?;
    if status == StatusCode::OK {
        Ok(v["value"].clone())
    } else {
        Err(WebDriverError::Command {
            error: v["value"]["error"].as_str().unwrap_or("?").to_string(),
            message: v["value"]["message"].as_str().unwrap_or("?").to_string(),
        })
    }
}

/// A chromedriver child process on a free loopback port. Dropping it kills chromedriver and
/// every browser process it started (they share its process group).
#[derive(Debug)]
pub struct ChromeDriver {
    child: Child,
    url: String,
}

impl ChromeDriver {
    /// Start chromedriver and wait until it is ready. Panics with the packages to install when
    /// it is not on `PATH`, and when it is not ready within [`COMMAND_TIMEOUT`].
    pub async fn start() -> ChromeDriver {
        let binary = which("chromedriver").unwrap_or_else(|| {
            panic!(
                "chromedriver not found on PATH: the browser tests need the Debian packages \
                 `chromium` and `chromium-driver` (apt-get install -y chromium \
                 chromium-driver; .ci/run installs them)"
            )
        });
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
            l.local_addr().expect("its address").port()
        };
        use std::os::unix::process::CommandExt as _;
        let child = Command::new(binary)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("chromedriver starts");
        let driver = ChromeDriver {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let c = client();
        let deadline = tokio::time::Instant::now() + COMMAND_TIMEOUT;
        // Connection refused until it listens: poll /status.
        loop {
            let status = webdriver(&c, Method::GET, &format!("{}/status", driver.url), None).await;
            if matches!(status, Ok(v) if v["ready"] == true) {
                return driver;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "chromedriver not ready within {COMMAND_TIMEOUT:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for ChromeDriver {
    fn drop(&mut self) {
        // The whole group: chromedriver and the Chromium processes it launched.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The first `program` on `PATH`.
pub fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    })
}

/// A headless Chromium session.
#[derive(Debug)]
pub struct Browser {
    c: HttpClient,
    session: String,
}

impl Browser {
    /// A new headless session whose window is `width` × `height` CSS pixels. Panics when
    /// Chromium does not start.
    pub async fn open(driver: &ChromeDriver, (width, height): (u32, u32)) -> Browser {
        let c = client();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         format!("--window-size={width},{height}"),
                         "--disable-dev-shm-usage"],
            },
        }}});
        let v = webdriver(
            &c,
            Method::POST,
            &format!("{}/session", driver.url),
            Some(caps),
        )
        .await
        .unwrap_or_else(|e| panic!("cannot start headless Chromium: {e}"));
        let session = format!(
            "{}/session/{}",
            driver.url,
            v["sessionId"].as_str().expect("a session id")
        );
        Browser { c, session }
    }

    /// A command on this session (`path` after `/session/{id}`).
    pub async fn cmd(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, WebDriverError> {
        webdriver(&self.c, method, &format!("{}{path}", self.session), body).await
    }

    /// Navigate to `url` and wait for the page to load (WebDriver's default "normal" page load
    /// strategy: the document and its images are loaded).
    pub async fn go(&self, url: &str) {
        self.cmd(Method::POST, "/url", Some(json!({ "url": url })))
            .await
            .unwrap_or_else(|e| panic!("cannot open {url}: {e}"));
    }

    /// The current address.
    pub async fn url(&self) -> String {
        let v = self.cmd(Method::GET, "/url", None).await.expect("the URL");
        v.as_str().expect("a string").to_string()
    }

    /// Run `script` as a function body in the page (`arguments[i]` are `args`); its return
    /// value as JSON.
    pub async fn execute(&self, script: &str, args: Vec<Value>) -> Result<Value, WebDriverError> {
        self.cmd(
            Method::POST,
            "/execute/sync",
            Some(json!({ "script": script, "args": args })),
        )
        .await
    }

    /// The element's id, or `None` if the page has no such element (yet).
    pub async fn find(&self, css: &str) -> Option<String> {
        let v = self
            .cmd(
                Method::POST,
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await
            .ok()?;
        v[ELEMENT_KEY].as_str().map(str::to_string)
    }

    /// The rendered text of the element, `None` if it is not there.
    pub async fn text(&self, css: &str) -> Option<String> {
        let id = self.find(css).await?;
        let v = self
            .cmd(Method::GET, &format!("/element/{id}/text"), None)
            .await
            .ok()?;
        v.as_str().map(str::to_string)
    }

    /// The element's id; panics when the page has none.
    pub async fn must_find(&self, css: &str) -> String {
        self.find(css)
            .await
            .unwrap_or_else(|| panic!("no element `{css}` on the page"))
    }

    /// Whether the element is shown (WebDriver's "is element displayed").
    pub async fn displayed(&self, css: &str) -> bool {
        let id = self.must_find(css).await;
        let v = self
            .cmd(Method::GET, &format!("/element/{id}/displayed"), None)
            .await
            .unwrap_or_else(|e| panic!("is `{css}` displayed: {e}"));
        v.as_bool().expect("a boolean")
    }

    /// Clear the field and type `text` into it.
    pub async fn type_into(&self, css: &str, text: &str) {
        let id = self.must_find(css).await;
        self.cmd(
            Method::POST,
            &format!("/element/{id}/clear"),
            Some(json!({})),
        )
        .await
        .unwrap_or_else(|e| panic!("clear `{css}`: {e}"));
        self.cmd(
            Method::POST,
            &format!("/element/{id}/value"),
            Some(json!({ "text": text })),
        )
        .await
        .unwrap_or_else(|e| panic!("type into `{css}`: {e}"));
    }

    /// Click the element.
    pub async fn click(&self, css: &str) {
        let id = self.must_find(css).await;
        self.cmd(
            Method::POST,
            &format!("/element/{id}/click"),
            Some(json!({})),
        )
        .await
        .unwrap_or_else(|e| panic!("click `{css}`: {e}"));
    }

    /// A PNG of the viewport, written to `path` (for a human to look at while developing).
    pub async fn screenshot(&self, path: &Path) {
        let v = self
            .cmd(Method::GET, "/screenshot", None)
            .await
            .expect("a screenshot");
        let png = decode_base64(v.as_str().expect("base64 PNG"));
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::write(path, png).expect("the screenshot is written");
    }

    /// End the session (the browser closes; chromedriver stays until dropped).
    pub async fn close(self) {
        let _ = self.cmd(Method::DELETE, "", None).await;
    }
}

/// Standard base64 (RFC 4648 §4) to bytes; padding and line breaks are skipped.
pub fn decode_base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for six in text.bytes().filter_map(value) {
        acc = (acc << 6) | u32::from(six);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes_the_rfc_4648_test_vectors() {
        // RFC 4648 §10.
        for (encoded, decoded) in [
            ("", ""),
            ("Zg==", "f"),
            ("Zm8=", "fo"),
            ("Zm9v", "foo"),
            ("Zm9vYg==", "foob"),
            ("Zm9vYmE=", "fooba"),
            ("Zm9vYmFy", "foobar"),
        ] {
            assert_eq!(decode_base64(encoded), decoded.as_bytes(), "{encoded}");
        }
        assert_eq!(
            decode_base64("Zm9v\nYmFy"),
            b"foobar",
            "line breaks skipped"
        );
    }

    #[test]
    fn which_finds_a_program_on_path_and_not_a_missing_one() {
        assert!(which("sh").is_some_and(|p| p.ends_with("sh")));
        assert_eq!(which("routelab-no-such-program"), None);
    }
}
