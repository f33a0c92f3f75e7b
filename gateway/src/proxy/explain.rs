//! A routing decision shown to whoever asks: the request log's `decision` (always) and, when
//! the request carries `x-routelab-explain`, the same JSON in the answer's
//! `x-routelab-decision` header. Both are the router's own explanation of the decision
//! ([`routelab_policies::Explanation`]): the scores it compared, not a recomputation.

use crate::reqlog::LogDecision;
use crate::routing::Core;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use routelab_policies::Explanation;

/// The request header that asks for the decision (any value).
pub(crate) const ASK: HeaderName = HeaderName::from_static("x-routelab-explain");
/// The response header that carries it.
pub(crate) const ANSWER: HeaderName = HeaderName::from_static("x-routelab-decision");

/// True if the client asked to see the decision.
pub(super) fn asked(headers: &HeaderMap) -> bool {
    headers.contains_key(ASK)
}

/// `why` with the workers' names, as `core` knows them (a worker removed since is shown by
/// its id).
pub(super) fn record(core: &Core, why: &Explanation) -> Option<LogDecision> {
    let name = |id: routelab_policies::WorkerId| {
        core.workers
            .get(id)
            .map_or_else(|| format!("#{}", id.0), |w| w.cfg.name.clone())
    };
    LogDecision::of(why, name)
}

/// The response header's value: the decision as one line of JSON (`None` if it is not a
/// valid header value, e.g. a worker name outside visible ASCII).
pub(super) fn header(d: &LogDecision) -> Option<HeaderValue> {
    let json = serde_json::to_string(d).ok()?;
    HeaderValue::from_str(&json).ok()
}
