//! What a request's body must be before anything routes it: JSON if it names a type (415
//! otherwise), at most `max_body_bytes` (413), its bytes counted in the aggregate budget as
//! they arrive (503 when it is spent).

use super::budget;
use crate::app::shared::Shared;
use crate::error::ApiError;
use axum::http::{HeaderMap, StatusCode, header};
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};

/// The request body must be JSON if it says what it is: `text/plain`, form and multipart
/// bodies, which a browser page of any origin may send without a CORS preflight, are refused
/// (415) before anything is read. A body that names no type is taken as JSON (as the
/// OpenAI clients send it).
pub(super) fn json_content(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(ct) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let media = ct
        .to_str()
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim();
    // Compared without case, not lowercased (an allocation per request).
    let (m, is) = (media.as_bytes(), <[u8]>::eq_ignore_ascii_case);
    let (head, tail) = (
        m.get(..12).unwrap_or_default(),
        &m[m.len().saturating_sub(5)..],
    );
    if is(m, b"application/json") || (is(head, b"application/") && is(tail, b"+json")) {
        return Ok(());
    }
    let media = media.to_ascii_lowercase();
    Err(ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "invalid_request_error",
        "unsupported_media_type",
        format!("the request body must be JSON (`Content-Type: application/json`), not `{media}`"),
    ))
}

fn too_large(max: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        "request_too_large",
        format!("the request body is larger than the gateway's limit of {max} bytes"),
    )
}

/// The request body, whole, at most `max_body_bytes` (413 above), its bytes counted in the
/// aggregate budget as they arrive (503 when it is spent; [`budget`]).
pub(super) async fn read_request_body(
    s: &Shared,
    headers: &HeaderMap,
    body: axum::body::Body,
) -> Result<(Bytes, budget::BodyHold), ApiError> {
    let max = s.settings.max_body;
    if crate::upstream::declared_length(headers).is_some_and(|n| n > max as u64) {
        return Err(too_large(max));
    }
    let mut hold = s.bodies.hold();
    let mut body = Limited::new(body, max);
    let mut chunks: Vec<Bytes> = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            if e.downcast_ref::<LengthLimitError>().is_some() {
                too_large(max)
            } else {
                ApiError::bad_request(format!("could not read the request body: {e}"), None)
            }
        })?;
        if let Ok(data) = frame.into_data() {
            hold.grow(data.len())?;
            chunks.push(data);
        }
    }
    // One chunk (the usual case) is handed on as it is; several are joined once.
    let bytes = match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.pop().unwrap_or_default(),
        _ => Bytes::from(chunks.concat()),
    };
    Ok((bytes, hold))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    /// JSON media types pass in any case (compared without a lowercased copy); anything else
    /// is 415, named in lower case as before.
    #[test]
    fn json_content_types_pass_in_any_case_and_others_are_415() {
        let with = |ct: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
            json_content(&h)
        };
        for ok in [
            "application/json",
            "Application/JSON; charset=utf-8",
            " application/vnd.api+JSON ",
            "application/+json",
        ] {
            assert!(with(ok).is_ok(), "{ok}");
        }
        assert!(
            json_content(&HeaderMap::new()).is_ok(),
            "no type: taken as JSON"
        );
        for bad in [
            "text/plain",
            "application/jsonx",
            "+json",
            "application/",
            "TEXT/JSON",
        ] {
            let e = with(bad).expect_err(bad);
            assert_eq!(e.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{bad}");
        }
        let e = with("Text/Plain;charset=UTF-8").unwrap_err();
        assert!(e.message.ends_with("not `text/plain`"), "{}", e.message);
    }
}
