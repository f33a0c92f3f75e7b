//! Responses in OpenAI's error shape: `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use routelab_policies::RouteError;

/// An error the gateway answers with.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// OpenAI error type (`invalid_request_error`, …).
    pub kind: &'static str,
    /// The offending parameter, if any.
    pub param: Option<&'static str>,
    /// Machine-readable code.
    pub code: &'static str,
    /// `Retry-After` seconds, if any.
    pub retry_after_s: Option<u64>,
}

impl ApiError {
    /// A new error.
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code,
            retry_after_s: None,
        }
    }

    /// 400 invalid request.
    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> ApiError {
        ApiError {
            param,
            ..ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_request",
                message,
            )
        }
    }

    /// 401 for the admin API.
    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid_api_key",
            "the admin API needs `Authorization: Bearer <admin_token>`",
        )
    }

    /// 404 for an admin call about an unknown worker.
    pub fn unknown_worker(name: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "worker_not_found",
            format!("no worker named `{name}`"),
        )
    }

    /// 502: the worker failed and no retry was left.
    pub fn upstream(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            "upstream_error",
            message,
        )
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }

    /// The SSE event that ends a stream that broke after its first byte.
    pub fn sse_event(&self) -> bytes::Bytes {
        bytes::Bytes::from(format!("data: {}\n\n", self.body()))
    }
}

impl ApiError {
    /// The answer to a request for `model` the router refused. The router's error carries the
    /// model's id only (it never allocates); the message names the model as the client wrote it.
    pub fn route(e: RouteError, model: &str) -> ApiError {
        let status =
            StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        let (kind, code, param) = match &e {
            RouteError::NoWorkerForModel => {
                ("invalid_request_error", "model_not_found", Some("model"))
            }
            RouteError::PromptTooLong { .. } => (
                "invalid_request_error",
                "context_length_exceeded",
                Some("messages"),
            ),
            RouteError::AllAtCap { .. } => ("rate_limit_error", "all_workers_at_cap", None),
            RouteError::NoHealthyWorker { .. } => {
                ("service_unavailable_error", "no_healthy_worker", None)
            }
            _ => ("service_unavailable_error", "unavailable", None),
        };
        ApiError {
            status,
            message: e.with_model(model).to_string(),
            kind,
            param,
            code,
            retry_after_s: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::PAYLOAD_TOO_LARGE {
            // The body was not read: the connection cannot carry another request, so say so
            // and keep clients from reusing it (they would see a truncated response).
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if let Some(s) = self.retry_after_s {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

#[cfg(test)]
mod connection_close_tests {
    use super::*;

    /// Regression: a 413 is sent without reading the body; a client that reused the connection
    /// saw `IncompleteMessage` on its next request.
    #[test]
    fn payload_too_large_closes_the_connection() {
        let r = ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
            "too big".to_string(),
        )
        .into_response();
        assert_eq!(r.headers()[header::CONNECTION], "close");
        let ok = ApiError::bad_request("bad".to_string(), None).into_response();
        assert!(ok.headers().get(header::CONNECTION).is_none());
    }
}
