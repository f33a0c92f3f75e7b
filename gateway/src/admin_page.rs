//! `GET /admin`: the operators' page — every worker's state, weight, provenance, load and last
//! probe, refreshing every second, with re-probe, pin / unpin, drain / undrain and remove.
//!
//! The page is one self-contained HTML file (inline CSS and JavaScript, no external assets, no
//! build step) compiled into the binary. It is served without the token because it carries no
//! data: everything it shows and does goes through the token-protected JSON API
//! ([`crate::admin`]) with `Authorization: Bearer <token>`. The token comes from a password field
//! or from the URL fragment (`/admin#token=…`; browsers never send a fragment, so it reaches
//! neither the server nor its logs) and is kept in the tab's `sessionStorage`.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

/// The page itself.
pub const ADMIN_HTML: &str = include_str!("../assets/admin.html");

/// What the page may do, as a Content-Security-Policy: its own inline script and style, API
/// calls to this origin only, nothing else (no external script, image, frame or form target),
/// and it may not be framed (clickjacking on the remove button).
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; \
     style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// `GET /admin`
pub(crate) async fn page() -> Response {
    let mut r = ADMIN_HTML.into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page must work offline and leak nothing to third parties: no asset is fetched from
    /// anywhere but this gateway.
    #[test]
    fn the_page_references_no_external_asset() {
        // The SVG namespace (sparklines are built with createElementNS) names, fetches nothing.
        let lower = ADMIN_HTML
            .to_ascii_lowercase()
            .replace("\"http://www.w3.org/2000/svg\"", "\"svg-namespace\"");
        for scheme in ["http://", "https://", "//cdn", "@import"] {
            assert!(!lower.contains(scheme), "admin.html contains `{scheme}`");
        }
        for attr in [" src=", " href="] {
            assert!(
                !lower.contains(attr),
                "admin.html loads something with `{attr}`"
            );
        }
    }

    /// The shell carries no data and builds the DOM from API data with `textContent` only, so a
    /// worker named `<img onerror=…>` cannot run script in the operator's browser.
    #[test]
    fn the_page_never_writes_api_data_as_html() {
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
        ] {
            assert!(!ADMIN_HTML.contains(sink), "admin.html uses `{sink}`");
        }
        assert!(ADMIN_HTML.contains("Authorization"));
        assert!(ADMIN_HTML.contains("sessionStorage"));
    }

    #[tokio::test]
    async fn it_is_served_as_html_with_a_strict_content_security_policy() {
        let r = page().await;
        let h = r.headers();
        assert_eq!(h[header::CONTENT_TYPE], "text/html; charset=utf-8");
        let csp = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"));
        assert_eq!(h[header::CACHE_CONTROL], "no-store");
    }
}
