//! The admin API's door: every `/admin` request carries `Authorization: Bearer <admin_token>`,
//! compared in constant time; each refusal is logged with its reason, never the token.

use crate::config::Secret;
use crate::error::ApiError;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::SocketAddr;

/// What the admin API's door reads of the gateway: its `admin_token` (none: every request is
/// refused).
#[derive(Clone)]
pub(crate) struct AdminToken(pub Option<Secret>);

/// Reject requests without the admin bearer token (401, OpenAI error shape), logging each
/// refusal (`admin_auth_failed`: path, remote address when the listener records it, reason;
/// never the token nor what was sent).
pub(crate) async fn require_token(
    State(AdminToken(token)): State<AdminToken>,
    req: Request,
    next: Next,
) -> Response {
    let verdict = authenticate(
        token.as_ref().map(Secret::expose),
        req.headers().get(header::AUTHORIZATION),
    );
    match verdict {
        Ok(()) => next.run(req).await,
        Err(reason) => {
            let remote = req
                .extensions()
                .get::<ConnectInfo<SocketAddr>>()
                .map(|ConnectInfo(addr)| addr.to_string())
                .unwrap_or_default();
            crate::logging::log(
                "admin_auth_failed",
                &[
                    ("path", req.uri().path()),
                    ("remote", &remote),
                    ("reason", reason.as_str()),
                ],
            );
            ApiError::unauthorized().into_response()
        }
    }
}

/// Why an admin request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AuthFailure {
    /// The gateway has no `admin_token`: the admin API refuses everyone.
    NotConfigured,
    /// No `Authorization` header.
    Missing,
    /// An `Authorization` header that is not visible ASCII.
    Malformed,
    /// Another scheme than `Bearer` (e.g. `Basic`).
    WrongScheme,
    /// `Bearer` with another token.
    WrongToken,
}

impl AuthFailure {
    /// The name logged.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthFailure::NotConfigured => "admin_token_not_configured",
            AuthFailure::Missing => "missing",
            AuthFailure::Malformed => "malformed",
            AuthFailure::WrongScheme => "wrong_scheme",
            AuthFailure::WrongToken => "wrong_token",
        }
    }
}

/// Check an `Authorization` header against the admin token. The scheme is matched
/// case-insensitively (RFC 7235 §2.1: "It uses a case-insensitive token as a means to identify
/// the authentication scheme"); the token is compared in constant time.
pub(crate) fn authenticate(
    want: Option<&str>,
    authorization: Option<&HeaderValue>,
) -> Result<(), AuthFailure> {
    let want = want.ok_or(AuthFailure::NotConfigured)?;
    let value = authorization.ok_or(AuthFailure::Missing)?;
    let value = value.to_str().map_err(|_| AuthFailure::Malformed)?.trim();
    // `credentials = auth-scheme [ 1*SP token68 ]` (RFC 7235 §2.1).
    let (scheme, token) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(AuthFailure::WrongScheme);
    }
    if constant_time_eq(want.as_bytes(), token.trim().as_bytes()) {
        Ok(())
    } else {
        Err(AuthFailure::WrongToken)
    }
}

/// Compare a secret (`want`, never empty) with what a client sent in time that depends only on
/// the length of what was sent: no early exit at the first differing byte, and no early exit
/// on a length mismatch either, which would tell an attacker the token's length.
fn constant_time_eq(want: &[u8], given: &[u8]) -> bool {
    if want.is_empty() {
        return false;
    }
    let mut diff = u8::from(want.len() != given.len());
    for (i, g) in given.iter().enumerate() {
        // Wrapping around `want` keeps the loop free of a branch on the secret's length.
        diff |= g ^ want[i % want.len()];
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(want: Option<&str>, sent: Option<&str>) -> Result<(), AuthFailure> {
        let header = sent.map(|v| HeaderValue::from_str(v).unwrap());
        authenticate(want, header.as_ref())
    }

    /// Regression: `bearer` and `BEARER` were refused (RFC 7235 §2.1: the scheme is
    /// case-insensitive), and a refusal did not say why.
    #[test]
    fn the_scheme_is_case_insensitive_and_each_refusal_has_its_reason() {
        let want = Some("s3cret");
        for ok in [
            "Bearer s3cret",
            "bearer s3cret",
            "BEARER s3cret",
            "  bEaReR   s3cret ",
        ] {
            assert_eq!(check(want, Some(ok)), Ok(()), "{ok}");
        }
        for (sent, reason) in [
            (None, AuthFailure::Missing),
            (Some("Basic czNjcmV0"), AuthFailure::WrongScheme),
            (Some("s3cret"), AuthFailure::WrongScheme),
            (Some("Bearers3cret"), AuthFailure::WrongScheme),
            (Some("Bearer s3cre"), AuthFailure::WrongToken),
            (Some("Bearer s3cret!"), AuthFailure::WrongToken),
            (Some("Bearer"), AuthFailure::WrongToken),
        ] {
            assert_eq!(check(want, sent), Err(reason), "{sent:?}");
        }
        let opaque = HeaderValue::from_bytes(b"Bearer \xff").unwrap();
        assert_eq!(
            authenticate(want, Some(&opaque)),
            Err(AuthFailure::Malformed)
        );
        assert_eq!(
            check(None, Some("Bearer s3cret")),
            Err(AuthFailure::NotConfigured)
        );
    }

    #[test]
    fn constant_time_eq_compares_whole_tokens() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        // A prefix that repeats the secret is still a different token.
        assert!(!constant_time_eq(b"abc", b"abcabc"));
        assert!(!constant_time_eq(b"", b""));
    }
}
