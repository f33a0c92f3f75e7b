//! A routing decision's part of a log line (and of the `x-routelab-decision` header).

use serde::Serialize;

/// A routing decision as the log (and the `x-routelab-decision` response header) shows it:
/// the router's own explanation ([`routelab_policies::Explanation`]), workers by name.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogDecision {
    /// `affinity`, `score`, `write-off`, `unscored` or `queued` ([`routelab_policies::Reason`]).
    pub reason: &'static str,
    /// The chosen worker and its score (no score unless the reason is `score` or `write-off`).
    pub chosen: LogCandidate,
    /// The best other candidate the chooser compared, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runner_up: Option<LogCandidate>,
}

/// One candidate of a [`LogDecision`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogCandidate {
    /// The worker's name.
    pub worker: String,
    /// The value compared (lower wins): the load score, `predictive`'s objective, or its harm
    /// to the others for a write-off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// `predictive`'s predicted time to first token there, milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_ttft_ms: Option<f64>,
    /// `predictive`'s predicted time per output token there, milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_tpot_ms: Option<f64>,
}

impl LogCandidate {
    /// `s` (or, with no score, just `worker`) under `name`.
    pub fn new(name: String, s: Option<&routelab_policies::Scored>) -> LogCandidate {
        let p = s.and_then(|s| s.predicted);
        LogCandidate {
            worker: name,
            score: s.map(|s| s.score),
            predicted_ttft_ms: p.map(|p| p.ttft_s * 1e3),
            predicted_tpot_ms: p.map(|p| p.tpot_s * 1e3),
        }
    }
}
