//! `GET /metrics`: the gateway's metrics in the Prometheus text format. The counters are the
//! registry's ([`registry`]), the text [`render`]'s; this handler gathers what the features
//! report (the router core's workers, the connections, the signals, the request log, the bus).

pub mod registry;
pub mod render;

use crate::app::shared::Shared;
use crate::routing::state_name;
use axum::extract::State;
use axum::response::IntoResponse;
use std::sync::Arc;

/// The metrics page, read under the router lock once.
pub(crate) async fn handler(State(s): State<Arc<Shared>>) -> axum::response::Response {
    let mut text = {
        let core = s.routing.core();
        let rows: Vec<render::WorkerRow<'_>> = core
            .workers
            .live()
            .filter_map(|(id, w)| Some((id, w, core.router.fleet().get(id)?)))
            .map(|(id, w, info)| {
                let weight = core.router.weight(id).unwrap_or_default();
                render::WorkerRow {
                    name: &w.cfg.name,
                    model: &w.cfg.model,
                    state: state_name(info.state),
                    in_flight: info.in_flight,
                    weight: weight.value,
                    provenance: weight.provenance.as_str(),
                    cap: core.router.cap(id).filter(|&c| c != u32::MAX),
                    probe_tok_s: w.probe_tok_s,
                    metrics: &w.metrics,
                }
            })
            .collect();
        let mut text = render::render(&rows, core.router.queued(), &s.global);
        let models: Vec<(&str, bool)> = core
            .router
            .models()
            .into_iter()
            .map(|m| {
                let panic = core.router.model_id(m).is_some_and(|id| core.panicking(id));
                (m, panic)
            })
            .collect();
        text.push_str(&render::render_fleet(&models, core.workers.slots()));
        text
    };
    text.push_str(&render::render_connections(&s.connections));
    text.push_str(&crate::signals::view::render_metrics(&s));
    text.push_str(&render::render_request_log(
        s.request_log
            .as_deref()
            .map(crate::reqlog::RequestLog::counters),
    ));
    if let Some(bus) = &s.bus {
        text.push_str(&render::render_bus(bus));
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
