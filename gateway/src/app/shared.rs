//! What the app composes: each feature's state beside the router core. Only the app and the
//! handlers and tasks at the top of the floor plan hold it; every feature below it is handed
//! the part it reads (the router core, the signal hub, the metrics registry, …).

use super::settings::Settings;
use crate::metrics::registry::GlobalMetrics;
use crate::persist::writer::StateWriter;
use crate::reqlog::RequestLog;
use crate::routing::{RouterCore, Routing};
use crate::supervise::{Supervised, TaskRestarts};
use crate::upstream::HttpClient;
use axum::extract::FromRef;
use std::sync::Arc;

/// Everything the handlers and background tasks share.
pub(crate) struct Shared {
    pub settings: Settings,
    /// The router core ([`crate::routing`]).
    pub routing: Arc<Routing>,
    pub client: HttpClient,
    /// A client that keeps no idle connection, so each request opens its own: the one retry
    /// of a request whose pooled connection failed under it ([`crate::proxy`]).
    pub fresh: HttpClient,
    /// The metrics registry ([`crate::metrics`]); the accept loop counts rejections into it.
    pub global: Arc<GlobalMetrics>,
    /// Client connection counters, kept by the accept loop ([`crate::server`]).
    pub connections: Arc<crate::server::limits::ConnectionStats>,
    /// The state file's writer ([`crate::persist`]).
    pub state_file: StateWriter,
    /// The request bodies held now, within `max_buffered_body_bytes` ([`crate::proxy`]).
    pub bodies: Arc<crate::proxy::budget::BodyBudget>,
    /// The request log, when configured.
    pub request_log: Option<Arc<RequestLog>>,
    /// The engines' KV streams, metrics polls and recent history ([`crate::signals`]).
    pub signals: crate::signals::hub::SignalHub,
    /// The configured models' tokenizers ([`crate::tokens`]).
    pub tokenizers: crate::tokens::Tokenizers,
    /// The replicas' bus, with a `replicas:` block ([`crate::replicas`]).
    pub bus: Option<crate::replicas::Bus>,
    /// The drain deadline, which the streams still running then watch ([`crate::drain`]).
    pub drain: crate::drain::Drain,
}

impl Shared {
    /// Passive ejection and active health checks are on only when health checks run (someone
    /// must re-admit an ejected worker).
    pub fn ejection_enabled(&self) -> bool {
        !self.settings.health_interval.is_zero()
    }
}

/// A handler that reads only the router core takes it alone (`State<RouterCore>`).
impl FromRef<Arc<Shared>> for RouterCore {
    fn from_ref(s: &Arc<Shared>) -> RouterCore {
        RouterCore(s.routing.clone())
    }
}

impl Supervised for Arc<Shared> {
    fn restarts(&self) -> &TaskRestarts {
        &self.global.task_restarts
    }
}
