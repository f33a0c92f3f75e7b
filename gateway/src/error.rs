//! The gateway's errors: [`GatewayError`] for the library's operations (configuration, start,
//! state file, workers) and [`ApiError`], responses in OpenAI's error shape:
//! `{"error": {"message", "type", "param", "code"}}`.

use crate::persist::StateFileError;
use crate::upstream::BaseUrlError;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use routelab_policies::{InputError, RouteError};

/// Why the gateway could not start, or refused an administrative change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// The configuration is not valid (located: file, line, field, what would be valid).
    #[error(transparent)]
    Config(#[from] InputError),
    /// A worker cannot be added.
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// The state file cannot be loaded.
    #[error(transparent)]
    State(#[from] StateFileError),
    /// The listen address cannot be bound.
    #[error("listen {addr}: {error}")]
    Listen {
        /// The configured `listen`.
        addr: String,
        /// Why.
        error: std::io::Error,
    },
    /// The bound listener has no local address.
    #[error("{0}")]
    LocalAddr(std::io::Error),
}

/// Why a worker cannot be registered. The messages are what the admin API answers.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// No name.
    #[error("workers[].name must not be empty")]
    EmptyName,
    /// No model.
    #[error("worker `{name}`: model must not be empty")]
    EmptyModel {
        /// The worker.
        name: String,
    },
    /// A context window of 0.
    #[error("worker `{name}`: context_window must be > 0")]
    ZeroContextWindow {
        /// The worker.
        name: String,
    },
    /// An unusable base URL.
    #[error("worker `{name}`: base_url: {error}")]
    BaseUrl {
        /// The worker.
        name: String,
        /// Why.
        error: BaseUrlError,
    },
    /// A live worker already has the name (the admin API answers 409).
    #[error("a worker named `{0}` already exists")]
    Duplicate(String),
    /// An unusable `kv_events` block.
    #[error("worker `{name}`: {error}")]
    KvEvents {
        /// The worker.
        name: String,
        /// Why (names the field and what is valid).
        error: crate::kv::KvEventsError,
    },
    /// An `api_key_file` that cannot be read or does not hold one key.
    #[error("worker `{name}`: api_key_file: {reason}")]
    ApiKey {
        /// The worker.
        name: String,
        /// Why (names the file, never its content).
        reason: String,
    },
    /// A name, node or model that logs, metrics labels and the admin page would show wrongly:
    /// control or bidirectional-formatting characters, or too long.
    #[error("worker {name:?}: {field} {reason}")]
    Text {
        /// The worker, as given (printed escaped).
        name: String,
        /// The field at fault (`name`, `node`, `model`).
        field: &'static str,
        /// What is wrong, with what would be valid.
        reason: String,
    },
}

impl WorkerError {
    /// The worker configuration field at fault.
    pub fn field(&self) -> &'static str {
        match self {
            WorkerError::EmptyName | WorkerError::Duplicate(_) => "name",
            WorkerError::EmptyModel { .. } => "model",
            WorkerError::ZeroContextWindow { .. } => "context_window",
            WorkerError::BaseUrl { .. } => "base_url",
            WorkerError::KvEvents { .. } => "kv_events",
            WorkerError::ApiKey { .. } => "api_key_file",
            WorkerError::Text { field, .. } => field,
        }
    }

    /// What is wrong with the field, without naming the worker (a located error names it by
    /// its path, `workers[2].base_url`).
    pub fn reason(&self) -> String {
        match self {
            WorkerError::EmptyName | WorkerError::EmptyModel { .. } => "must not be empty".into(),
            WorkerError::ZeroContextWindow { .. } => "must be > 0".into(),
            WorkerError::BaseUrl { error, .. } => error.to_string(),
            WorkerError::Duplicate(name) => format!("duplicate name `{name}`"),
            WorkerError::KvEvents { error, .. } => error.to_string(),
            WorkerError::Text { reason, .. } | WorkerError::ApiKey { reason, .. } => reason.clone(),
        }
    }

    /// This error as a located configuration error about `workers[index]` of `file`.
    pub fn located(&self, file: &str, index: usize) -> InputError {
        InputError::new(
            file,
            format!("workers[{index}].{}", self.field()),
            self.reason(),
        )
    }
}

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

    /// 404 `model_not_found` on the `model` parameter: no worker serves the model asked for.
    pub fn model_not_found(message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some("model"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "model_not_found",
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

    /// 500 for an admin change that could not be written to the state file (and was therefore
    /// not applied).
    pub fn state_write_failed(error: &crate::persist::StateFileError) -> ApiError {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "state_write_failed",
            format!("{error}; the change was not applied"),
        )
    }

    /// 404 for a path the gateway does not serve (axum's default has an empty body).
    pub fn unknown_path(method: &str, path: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "unknown_url",
            format!("the gateway serves no `{method} {path}`"),
        )
    }

    /// 405 for a known path asked with another method (the `Allow` header lists the valid
    /// ones).
    pub fn method_not_allowed(method: &str, path: &str) -> ApiError {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method_not_allowed",
            format!("`{path}` does not accept {method}; the `Allow` header lists what it does"),
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

    /// 503: the gateway is shutting down (a stream cut at the drain deadline).
    pub fn shutting_down(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "shutting_down",
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
    /// A prompt too long is laid at `prompt_param`, the field that held it (`messages` or, on
    /// `/v1/completions`, `prompt`).
    pub fn route(e: RouteError, model: &str, prompt_param: &'static str) -> ApiError {
        let status =
            StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        let (kind, code, param) = match &e {
            RouteError::NoWorkerForModel => {
                ("invalid_request_error", "model_not_found", Some("model"))
            }
            RouteError::PromptTooLong { .. } => (
                "invalid_request_error",
                "context_length_exceeded",
                Some(prompt_param),
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

/// The `code` of a rejection the gateway answered itself, attached to the response as an
/// extension by [`ApiError`]'s `IntoResponse` so that one middleware
/// (`metrics::count_rejections`) counts every rejection by status and code, whichever handler
/// or layer produced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RejectionCode(pub &'static str);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        r.extensions_mut().insert(RejectionCode(self.code));
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

    #[test]
    fn every_answer_carries_its_code_for_the_rejection_counter() {
        let r = ApiError::unauthorized().into_response();
        assert_eq!(
            r.extensions().get::<RejectionCode>(),
            Some(&RejectionCode("invalid_api_key"))
        );
    }
}
