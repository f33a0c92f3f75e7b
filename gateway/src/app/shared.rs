//! What the app composes: each feature's state beside the router core. Only the app and the
//! handlers and tasks at the top of the floor plan hold it; every feature below it is handed
//! the part it reads (the router core, the signal hub, the metrics registry, …).

use super::settings::Settings;
use crate::metrics::registry::GlobalMetrics;
use crate::persist::writer::StateWriter;
use crate::reqlog::RequestLog;
use crate::routing::Routing;
use crate::supervise::{Supervised, TaskRestarts};
use crate::upstream::HttpClient;
use std::sync::Arc;

/// Everything the handlers and background tasks share.
pub(crate) struct Shared {
    pub settings: Settings,
    /// The router core ([`crate::routing`]).
    pub routing: Routing,
    pub client: HttpClient,
    pub global: GlobalMetrics,
    /// Client connection counters, kept by the accept loop ([`crate::server`]).
    pub connections: Arc<crate::server::limits::ConnectionStats>,
    /// The state file's writer ([`crate::persist`]).
    pub state_file: StateWriter,
    /// The request log, when configured.
    pub request_log: Option<Arc<RequestLog>>,
    /// The engines' KV streams, metrics polls and recent history ([`crate::signals`]).
    pub signals: crate::signals::hub::SignalHub,
    /// The configured models' tokenizers ([`crate::tokens`]).
    pub tokenizers: crate::tokens::Tokenizers,
    /// The replicas' bus, with a `replicas:` block ([`crate::replicas`]).
    pub bus: Option<crate::replicas::Bus>,
}

impl Shared {
    /// Passive ejection and active health checks are on only when health checks run (someone
    /// must re-admit an ejected worker).
    pub fn ejection_enabled(&self) -> bool {
        !self.settings.health_interval.is_zero()
    }
}

impl Supervised for Arc<Shared> {
    fn restarts(&self) -> &TaskRestarts {
        &self.global.task_restarts
    }
}
