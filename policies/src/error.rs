//! Typed errors a host maps to its own responses.

use crate::worker::{ModelId, WorkerId};
use std::fmt;

/// Why a request could not be routed.
///
/// Every variant carries only `Copy` data, so refusing a request never allocates: a saturated
/// fleet answers [`RouteError::AllAtCap`] to every arrival. A host that wants the model's name
/// in its message renders the error with [`RouteError::with_model`] (the router's
/// [`crate::Router::model_name`] resolves the id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RouteError {
    /// No worker was ever registered for the model.
    NoWorkerForModel,
    /// Workers exist for the model but none is connected and accepting.
    NoHealthyWorker {
        /// The model.
        model: ModelId,
    },
    /// The prompt exceeds every worker's context window.
    PromptTooLong {
        /// Tokens requested.
        tokens: u32,
        /// Largest window among the model's workers.
        largest_window: u32,
    },
    /// Every eligible worker is at its concurrency cap: the host should queue the request.
    AllAtCap {
        /// The model.
        model: ModelId,
    },
}

/// A [`RouteError`] rendered with its model's name (see [`RouteError::with_model`]).
#[derive(Debug, Clone, Copy)]
pub struct RouteErrorWithModel<'a> {
    error: &'a RouteError,
    model: &'a str,
}

impl fmt::Display for RouteErrorWithModel<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.render(f, &format_args!("`{}`", self.model))
    }
}

impl fmt::Display for RouteError {
    /// Without the model's name (the error does not carry it): the interned id stands in.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteError::NoHealthyWorker { model } | RouteError::AllAtCap { model } => {
                self.render(f, model)
            }
            _ => self.render(f, &""),
        }
    }
}

impl std::error::Error for RouteError {}

impl RouteError {
    /// The message with the model's name, as a gateway answers it: "no healthy worker for
    /// model `gemma-27b`". The one place the wording of routing errors lives.
    pub fn with_model<'a>(&'a self, model: &'a str) -> RouteErrorWithModel<'a> {
        RouteErrorWithModel { error: self, model }
    }

    fn render(&self, f: &mut fmt::Formatter<'_>, model: &dyn fmt::Display) -> fmt::Result {
        match self {
            RouteError::NoWorkerForModel => f.write_str("no worker serves this model"),
            RouteError::NoHealthyWorker { .. } => write!(f, "no healthy worker for model {model}"),
            RouteError::PromptTooLong {
                tokens,
                largest_window,
            } => write!(
                f,
                "prompt needs {tokens} tokens of context; the largest window is {largest_window}"
            ),
            RouteError::AllAtCap { .. } => write!(
                f,
                "every eligible worker for model {model} is at its concurrency cap"
            ),
        }
    }

    /// The HTTP status a gateway should answer with (429 for a queue that cannot be joined).
    pub fn http_status(&self) -> u16 {
        match self {
            RouteError::NoWorkerForModel => 404,
            RouteError::PromptTooLong { .. } => 400,
            RouteError::AllAtCap { .. } => 429,
            RouteError::NoHealthyWorker { .. } => 503,
        }
    }
}

/// Errors of lifecycle and administrator calls.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The id was never registered or was removed.
    #[error("unknown worker {0}")]
    UnknownWorker(WorkerId),
    /// A pinned weight must be finite and positive.
    #[error("invalid weight {0}: a pinned weight must be a finite number > 0")]
    InvalidWeight(f64),
}

/// A probe's prefill-bound requests that cannot fit a worker's context window: the prompt
/// length given and one output token are more than the window holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the probe's prefill-bound requests ({prompt_tokens} prompt tokens and 1 output token) do not fit this worker's context window of {context_window} tokens; set the policy's weights.prefill_prompt_tokens to at most {}, leave it out (prompts fitted to each window), or give the worker a larger context_window",
    context_window.saturating_sub(1)
)]
pub struct PrefillProbeTooLong {
    /// The prompt length given (`prefill_prompt_tokens`).
    pub prompt_tokens: u32,
    /// The worker's context window.
    pub context_window: u32,
}

/// An invalid policy configuration. Messages name the field and what would be valid.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A name that is not one of the known ones.
    #[error("{field}: unknown {what} `{got}`; valid: {valid}")]
    UnknownName {
        /// Field path, e.g. `policies[1].chooser.kind`.
        field: String,
        /// What kind of name (preset, chooser, …).
        what: &'static str,
        /// What was given.
        got: String,
        /// Valid names, comma-separated.
        valid: String,
    },
    /// A value out of range or inconsistent.
    #[error("{field}: {message}")]
    Invalid {
        /// Field path.
        field: String,
        /// What is wrong and what would be valid.
        message: String,
    },
}

impl ConfigError {
    /// Prefix the field path (e.g. with `policies[2]`).
    pub fn within(self, prefix: &str) -> ConfigError {
        let join = |f: String| {
            if f.is_empty() {
                prefix.to_string()
            } else {
                format!("{prefix}.{f}")
            }
        };
        match self {
            ConfigError::UnknownName {
                field,
                what,
                got,
                valid,
            } => ConfigError::UnknownName {
                field: join(field),
                what,
                got,
                valid,
            },
            ConfigError::Invalid { field, message } => ConfigError::Invalid {
                field: join(field),
                message,
            },
        }
    }

    /// The field path this error is about.
    pub fn field(&self) -> &str {
        match self {
            ConfigError::UnknownName { field, .. } | ConfigError::Invalid { field, .. } => field,
        }
    }
}
