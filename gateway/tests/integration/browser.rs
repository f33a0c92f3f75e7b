//! The admin page (`GET /admin`) driven in a real headless Chromium through chromedriver's W3C
//! WebDriver HTTP API, spoken with the tests' own hyper client.
//!
//! Needs the Debian packages `chromium` and `chromium-driver` (`.ci/run` installs them). Every
//! wait is bounded; chromedriver listens on 127.0.0.1 only and is killed, with the browser it
//! started, when the test ends or fails.

use crate::fake::FakeWorker;
use crate::harness::*;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const SECS_20: Duration = Duration::from_secs(20);

/// The key under which WebDriver returns an element reference (W3C WebDriver, "elements").
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver child process on a free loopback port. Dropping it kills chromedriver and
/// every browser process it started (they share its process group).
struct ChromeDriver {
    child: Child,
    url: String,
}

impl ChromeDriver {
    async fn start() -> ChromeDriver {
        let binary = which("chromedriver").unwrap_or_else(|| {
            panic!(
                "chromedriver not found on PATH: the admin page's browser test needs the Debian \
                 packages `chromium` and `chromium-driver` (apt-get install -y chromium \
                 chromium-driver; .ci/run installs them)"
            )
        });
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
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
        wait_for("chromedriver ready", SECS_20, async || {
            matches!(
                webdriver(&c, Method::GET, &format!("{}/status", driver.url), None).await,
                Ok(v) if v["ready"] == true
            )
        })
        .await;
        driver
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

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    })
}

/// One WebDriver command: its `value`, or the WebDriver error (`error: message`).
async fn webdriver(
    c: &HttpClient,
    method: Method,
    url: &str,
    body: Option<Value>,
) -> Result<Value, String> {
    let req = Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(body.map_or_else(bytes::Bytes::new, |b| {
            bytes::Bytes::from(b.to_string())
        })))
        .unwrap();
    let answer = tokio::time::timeout(SECS_20, async {
        let r = c.request(req).await.map_err(|e| e.to_string())?;
        let status = r.status();
        let bytes = r
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok::<_, String>((status, bytes))
    })
    .await
    .map_err(|_| format!("no WebDriver answer to {url} within {SECS_20:?}"))??;
    let (status, bytes) = answer;
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    if status == StatusCode::OK {
        Ok(v["value"].clone())
    } else {
        Err(format!(
            "{}: {}",
            v["value"]["error"].as_str().unwrap_or("?"),
            v["value"]["message"].as_str().unwrap_or("?")
        ))
    }
}

/// A browser session (headless Chromium).
struct Browser {
    c: HttpClient,
    session: String,
}

impl Browser {
    async fn open(driver: &ChromeDriver) -> Browser {
        let c = client();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--window-size=1400,700", "--disable-dev-shm-usage"],
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

    async fn cmd(&self, method: Method, path: &str, body: Option<Value>) -> Result<Value, String> {
        webdriver(&self.c, method, &format!("{}{path}", self.session), body).await
    }

    async fn go(&self, url: &str) {
        self.cmd(Method::POST, "/url", Some(json!({ "url": url })))
            .await
            .unwrap();
    }

    /// The element's id, or `None` if the page has no such element (yet).
    async fn find(&self, css: &str) -> Option<String> {
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
    async fn text(&self, css: &str) -> Option<String> {
        let id = self.find(css).await?;
        let v = self
            .cmd(Method::GET, &format!("/element/{id}/text"), None)
            .await
            .ok()?;
        v.as_str().map(str::to_string)
    }

    async fn must_find(&self, css: &str) -> String {
        self.find(css)
            .await
            .unwrap_or_else(|| panic!("no element `{css}` on the page"))
    }

    /// Whether the element is shown (WebDriver's "is element displayed").
    async fn displayed(&self, css: &str) -> bool {
        let id = self.must_find(css).await;
        let v = self
            .cmd(Method::GET, &format!("/element/{id}/displayed"), None)
            .await
            .unwrap();
        v.as_bool().expect("a boolean")
    }

    async fn type_into(&self, css: &str, text: &str) {
        let id = self.must_find(css).await;
        self.cmd(
            Method::POST,
            &format!("/element/{id}/clear"),
            Some(json!({})),
        )
        .await
        .unwrap();
        self.cmd(
            Method::POST,
            &format!("/element/{id}/value"),
            Some(json!({ "text": text })),
        )
        .await
        .unwrap();
    }

    async fn click(&self, css: &str) {
        let id = self.must_find(css).await;
        self.cmd(
            Method::POST,
            &format!("/element/{id}/click"),
            Some(json!({})),
        )
        .await
        .unwrap();
    }

    /// A PNG of the viewport, written to `path` (for a human to look at while developing).
    async fn screenshot(&self, path: &std::path::Path) {
        let v = self.cmd(Method::GET, "/screenshot", None).await.unwrap();
        let png = decode_base64(v.as_str().expect("base64 PNG"));
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::write(path, png).unwrap();
    }

    async fn close(self) {
        let _ = self.cmd(Method::DELETE, "", None).await;
    }
}

/// Standard base64 (RFC 4648 §4) to bytes; padding and line breaks are skipped.
fn decode_base64(text: &str) -> Vec<u8> {
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

/// Open `/admin#token=…` with two workers behind a probe policy, pin worker a to 1.5 from the
/// page, and see the pinned weight and provenance both on the page and in `/admin/workers`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_page_pins_a_weight_in_a_real_browser() {
    let a = FakeWorker::start(1000.0).await;
    let b = FakeWorker::start(500.0).await;
    let gateway = serve(
        "{preset: seed-v3, weights: {kind: probe, concurrency: 4, output_tokens: 32, warmup: true}}",
        "probe: {poll_interval_s: 0.05}",
        &[
            worker("a", &a.url, "m", &[], 32768),
            worker("b", &b.url, "m", &[], 32768),
        ],
    )
    .await;
    let Gateway { base, c, .. } = gateway;

    // The shell is public and carries no data; the data is behind the token.
    let shell = send(&c, Method::GET, &format!("{base}/admin"), None, "").await;
    assert_eq!(shell.status, StatusCode::OK);
    assert!(
        !shell.text().contains(&a.url),
        "the shell holds no worker data"
    );
    let api = send(&c, Method::GET, &format!("{base}/admin/workers"), None, "").await;
    assert_eq!(api.status, StatusCode::UNAUTHORIZED);

    let driver = ChromeDriver::start().await;
    let browser = Browser::open(&driver).await;
    browser.go(&format!("{base}/admin#token={TOKEN}")).await;
    wait_for("both workers measured, on the page", SECS_20, async || {
        browser
            .text(r#"tr[data-worker="a"] .provenance"#)
            .await
            .as_deref()
            == Some("measured")
            && browser
                .text(r#"tr[data-worker="b"] .provenance"#)
                .await
                .as_deref()
                == Some("measured")
    })
    .await;
    assert_eq!(
        browser
            .text(r#"tr[data-worker="a"] .model"#)
            .await
            .as_deref(),
        Some("m")
    );
    // The token left the address bar as soon as the page had it.
    let url = browser.cmd(Method::GET, "/url", None).await.unwrap();
    assert!(!url.as_str().unwrap().contains(TOKEN), "{url}");

    browser
        .type_into(r#"tr[data-worker="a"] input.pin-weight"#, "1.5")
        .await;
    browser
        .click(r#"tr[data-worker="a"] button[data-action="pin"]"#)
        .await;
    wait_for("the page shows a pinned at 1.5", SECS_20, async || {
        browser
            .text(r#"tr[data-worker="a"] .weight"#)
            .await
            .as_deref()
            == Some("1.5")
            && browser
                .text(r#"tr[data-worker="a"] .provenance"#)
                .await
                .as_deref()
                == Some("pinned")
    })
    .await;
    assert_eq!(
        browser
            .text(r#"tr[data-worker="a"] .row-error"#)
            .await
            .as_deref(),
        Some(""),
        "no error shown"
    );
    let w = admin_worker(&c, &base, "a").await;
    assert_eq!(
        (w["weight"].as_f64(), w["provenance"].as_str()),
        (Some(1.5), Some("pinned"))
    );
    assert_eq!(
        admin_worker(&c, &base, "b").await["provenance"],
        "measured",
        "b untouched"
    );

    // An action the API refuses shows the API's own message in the row.
    browser
        .type_into(r#"tr[data-worker="b"] input.pin-weight"#, "-1")
        .await;
    browser
        .click(r#"tr[data-worker="b"] button[data-action="pin"]"#)
        .await;
    let mut shown = String::new();
    wait_for("the refused pin's error in b's row", SECS_20, async || {
        shown = browser
            .text(r#"tr[data-worker="b"] .row-error"#)
            .await
            .unwrap_or_default();
        !shown.is_empty()
    })
    .await;
    assert!(shown.starts_with("pin: 400: "), "{shown}");
    assert!(
        shown.len() > "pin: 400: ".len(),
        "the API's message: {shown}"
    );
    assert_eq!(
        admin_worker(&c, &base, "b").await["provenance"],
        "measured",
        "the refused pin changed nothing"
    );

    // Drain from the page: the state follows, and the row offers undrain instead of drain.
    browser
        .click(r#"tr[data-worker="b"] button[data-action="drain"]"#)
        .await;
    wait_for("b draining, on the page", SECS_20, async || {
        browser
            .text(r#"tr[data-worker="b"] .state"#)
            .await
            .as_deref()
            == Some("draining")
    })
    .await;
    assert_eq!(admin_worker(&c, &base, "b").await["state"], "draining");
    assert!(
        browser
            .displayed(r#"tr[data-worker="b"] button[data-action="undrain"]"#)
            .await
    );
    assert!(
        !browser
            .displayed(r#"tr[data-worker="b"] button[data-action="drain"]"#)
            .await
    );

    // ... and undrain puts it back in service.
    browser
        .click(r#"tr[data-worker="b"] button[data-action="undrain"]"#)
        .await;
    wait_for("b up again, on the page", SECS_20, async || {
        browser
            .text(r#"tr[data-worker="b"] .state"#)
            .await
            .as_deref()
            == Some("up")
    })
    .await;
    let b = admin_worker(&c, &base, "b").await;
    assert_eq!(
        (b["state"].as_str(), b["drained"].as_bool()),
        (Some("up"), Some(false))
    );
    assert!(
        browser
            .displayed(r#"tr[data-worker="b"] button[data-action="drain"]"#)
            .await
    );

    // A token typed into the password field replaces the session's; a wrong one gets the API's
    // 401 message on the page.
    browser.type_into("#token", "not-the-token").await;
    browser.click("#token-save").await;
    wait_for("the 401 message on the page", SECS_20, async || {
        browser
            .text("#error")
            .await
            .is_some_and(|t| t.starts_with("401: ") && t.contains("Bearer"))
    })
    .await;
    // ... and stops polling with it instead of failing once a second
    assert_eq!(
        browser.text("#status").await.as_deref(),
        Some("token rejected: enter the admin token")
    );

    if let Some(path) = std::env::var_os("ROUTELAB_ADMIN_SCREENSHOT") {
        browser.screenshot(std::path::Path::new(&path)).await;
    }
    browser.close().await;
}
