//! The metrics registry's counters and histograms, and what the other features report,
//! rendered in the Prometheus text format.
//!
//! Names follow Prometheus' conventions: base units (`_seconds`, `_tokens_per_second`),
//! `_total` for counters. A label set never changes with a worker's state or weight provenance:
//! those are one-hot families (`routelab_worker_state{state}` has a series for every state,
//! 1 for the current one), so a pin or an ejection moves a value, never creates a series.

use super::registry::{GlobalMetrics, WorkerMetrics};
use crate::routing::STATE_NAMES;
use routelab_policies::Provenance;
use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;

/// Every provenance a weight can have, for the one-hot `routelab_worker_weight_provenance`.
const PROVENANCES: &[Provenance] = &[
    Provenance::Default,
    Provenance::Table,
    Provenance::Measured,
    Provenance::Pinned,
    Provenance::Oracle,
];

/// One worker's row, snapshotted under the router lock.
#[derive(Debug)]
pub struct WorkerRow<'a> {
    /// Name.
    pub name: &'a str,
    /// Model.
    pub model: &'a str,
    /// Router state name.
    pub state: &'a str,
    /// In flight (router count).
    pub in_flight: u32,
    /// Weight.
    pub weight: f64,
    /// Provenance of the weight.
    pub provenance: &'a str,
    /// Cap (None: uncapped).
    pub cap: Option<u32>,
    /// Last probe throughput.
    pub probe_tok_s: Option<f64>,
    /// Counters.
    pub metrics: &'a WorkerMetrics,
}

/// Escape a label value.
pub(crate) fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The accept loop's connection counters ([`crate::server::limits::ConnectionStats`]) in the
/// Prometheus text format.
pub fn render_connections(stats: &crate::server::limits::ConnectionStats) -> String {
    format!(
        "# HELP routelab_gateway_client_connections Client connections open now.\n\
         # TYPE routelab_gateway_client_connections gauge\n\
         routelab_gateway_client_connections {}\n\
         # HELP routelab_gateway_client_connections_rejected_total Client connections answered 503 at server.max_connections.\n\
         # TYPE routelab_gateway_client_connections_rejected_total counter\n\
         routelab_gateway_client_connections_rejected_total {}\n",
        stats.open.load(Relaxed),
        stats.rejected.load(Relaxed)
    )
}

/// Each model's panic mode (1 while fewer than `health.panic_threshold_percent` of its workers
/// are healthy and requests go to all of them) and the size of the worker table (removed
/// workers' slots included: it grows only when a worker never seen before is added), in the
/// Prometheus text format.
pub fn render_fleet(models: &[(&str, bool)], worker_slots: usize) -> String {
    let mut out = String::from(
        "# HELP routelab_model_panic_mode 1 while too few of the model's workers are healthy (health.panic_threshold_percent) and requests go to all of them, ejected or not.\n\
         # TYPE routelab_model_panic_mode gauge\n",
    );
    for (model, panic) in models {
        let _ = writeln!(
            out,
            "routelab_model_panic_mode{{model=\"{}\"}} {}",
            esc(model),
            u8::from(*panic)
        );
    }
    let _ = writeln!(
        out,
        "# HELP routelab_gateway_worker_slots Workers the gateway has registered since start, removed ones included (a worker removed and added again takes its slot back).\n\
         # TYPE routelab_gateway_worker_slots gauge\n\
         routelab_gateway_worker_slots {worker_slots}"
    );
    out
}

/// The request log's counters in the Prometheus text format (zeros when there is no log, so
/// the series exist whatever the configuration).
pub fn render_request_log(counters: Option<&crate::reqlog::LogCounters>) -> String {
    let (dropped, errors) = counters.map_or((0, 0), |c| {
        (c.dropped.load(Relaxed), c.write_errors.load(Relaxed))
    });
    format!(
        "# HELP routelab_gateway_request_log_dropped_total Request log lines dropped because the writer's queue was full.\n\
         # TYPE routelab_gateway_request_log_dropped_total counter\n\
         routelab_gateway_request_log_dropped_total {dropped}\n\
         # HELP routelab_gateway_request_log_write_errors_total Request log lines lost to a failed write.\n\
         # TYPE routelab_gateway_request_log_write_errors_total counter\n\
         routelab_gateway_request_log_write_errors_total {errors}\n"
    )
}

/// The replicas' bus ([`crate::replicas`]), with a `replicas:` block only.
pub fn render_bus(bus: &crate::replicas::Bus) -> String {
    let c = &bus.counters;
    let (live, counted) = {
        let peers = bus.peers.lock().unwrap_or_else(|p| p.into_inner());
        (peers.live(), peers.counted())
    };
    let mut out = String::with_capacity(2048);
    let mut family = |name: &str, kind: &str, help: &str, value: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    };
    family(
        "routelab_gateway_bus_up",
        "gauge",
        "1 while this replica is connected to the replicas' bus.",
        u64::from(bus.is_up()),
    );
    family(
        "routelab_gateway_bus_peers",
        "gauge",
        "Peer replicas heard from within replicas.peer_timeout_s.",
        live as u64,
    );
    family(
        "routelab_gateway_bus_peer_requests",
        "gauge",
        "Peer replicas' requests in flight this replica's router counts.",
        counted as u64,
    );
    family(
        "routelab_gateway_bus_events_published_total",
        "counter",
        "Events this replica published on the bus (snapshots included).",
        c.published.load(Relaxed),
    );
    family(
        "routelab_gateway_bus_events_received_total",
        "counter",
        "Messages received from the bus (ignored ones included).",
        c.received.load(Relaxed),
    );
    family(
        "routelab_gateway_bus_events_missed_total",
        "counter",
        "Peer events that never arrived (gaps in a peer's sequence numbers).",
        c.missed.load(Relaxed),
    );
    family(
        "routelab_gateway_bus_peer_requests_expired_total",
        "counter",
        "Peer requests released without their end event: missing from the peer's snapshot, the peer silent, or the bus lost.",
        c.expired.load(Relaxed),
    );
    family(
        "routelab_gateway_bus_disconnects_total",
        "counter",
        "Times the connection to the bus was lost.",
        c.disconnects.load(Relaxed),
    );
    let _ = writeln!(
        out,
        "# HELP routelab_gateway_bus_events_dropped_total Events not published: the queue to the bus was full, or the bus was down.\n# TYPE routelab_gateway_bus_events_dropped_total counter\n\
         routelab_gateway_bus_events_dropped_total{{reason=\"full\"}} {}\n\
         routelab_gateway_bus_events_dropped_total{{reason=\"bus_down\"}} {}",
        c.dropped_full.load(Relaxed),
        c.dropped_down.load(Relaxed),
    );
    let _ = writeln!(
        out,
        "# HELP routelab_gateway_bus_events_ignored_total Received events ignored, by reason.\n# TYPE routelab_gateway_bus_events_ignored_total counter"
    );
    for why in crate::replicas::Ignored::ALL {
        let _ = writeln!(
            out,
            "routelab_gateway_bus_events_ignored_total{{reason=\"{}\"}} {}",
            why.as_str(),
            c.ignored_of(why)
        );
    }
    out
}

/// Render everything.
pub fn render(rows: &[WorkerRow<'_>], queue_len: usize, global: &GlobalMetrics) -> String {
    let mut out = String::with_capacity(4096 + rows.len() * 4096);
    let workers = WorkerFamilies::new(rows);
    workers.render_state(&mut out);
    workers.render_traffic(&mut out);
    render_queue(&mut out, queue_len, global);
    render_gateway_errors(&mut out, global);
    out
}

/// The per-worker families: one series per row (per row and label value), each row's labels
/// escaped once.
struct WorkerFamilies<'r, 'a> {
    rows: &'r [WorkerRow<'a>],
    labels: Vec<String>,
}

impl<'r, 'a> WorkerFamilies<'r, 'a> {
    fn new(rows: &'r [WorkerRow<'a>]) -> Self {
        let labels = rows
            .iter()
            .map(|r| format!("worker=\"{}\",model=\"{}\"", esc(r.name), esc(r.model)))
            .collect();
        WorkerFamilies { rows, labels }
    }

    /// A family with a line per row `f` gives (after the name: labels and value).
    fn family(
        &self,
        out: &mut String,
        name: &str,
        help: &str,
        kind: &str,
        f: &dyn Fn(&WorkerRow<'_>, &str) -> Option<String>,
    ) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (r, l) in self.rows.iter().zip(&self.labels) {
            if let Some(line) = f(r, l) {
                let _ = writeln!(out, "{name}{line}");
            }
        }
    }

    /// Where each worker stands: in flight, weight and its provenance, cap, state, last probe.
    fn render_state(&self, out: &mut String) {
        self.family(
            out,
            "routelab_worker_in_flight",
            "Requests in flight on the worker (router count).",
            "gauge",
            &|r, l| Some(format!("{{{l}}} {}", r.in_flight)),
        );
        self.family(
            out,
            "routelab_worker_weight",
            "The router's weight of the worker (its provenance: routelab_worker_weight_provenance).",
            "gauge",
            &|r, l| Some(format!("{{{l}}} {}", r.weight)),
        );
        one_hot(
            out,
            "routelab_worker_weight_provenance",
            "1 for where the worker's weight comes from (default, table, measured, pinned, oracle), 0 for the others.",
            "provenance",
            &PROVENANCES.iter().map(|p| p.as_str()).collect::<Vec<_>>(),
            self.rows,
            &self.labels,
            |r| r.provenance,
        );
        self.family(
            out,
            "routelab_worker_cap",
            "Concurrency cap of the worker (absent when uncapped).",
            "gauge",
            &|r, l| r.cap.map(|c| format!("{{{l}}} {c}")),
        );
        self.family(
            out,
            "routelab_worker_up",
            "1 when the worker is routable.",
            "gauge",
            &|r, l| Some(format!("{{{l}}} {}", u8::from(r.state == "up"))),
        );
        one_hot(
            out,
            "routelab_worker_state",
            "1 for the worker's router state (up, draining, disconnected), 0 for the others.",
            "state",
            STATE_NAMES,
            self.rows,
            &self.labels,
            |r| r.state,
        );
        self.family(
            out,
            "routelab_worker_probe_throughput_tokens_per_second",
            "Last burst-probe throughput, output tokens per second.",
            "gauge",
            &|r, l| r.probe_tok_s.map(|t| format!("{{{l}}} {t}")),
        );
    }

    /// What each worker served: requests, errors, probes, TTFT and end-to-end histograms.
    fn render_traffic(&self, out: &mut String) {
        self.family(
            out,
            "routelab_worker_requests_total",
            "Requests sent to the worker (probes excluded).",
            "counter",
            &|r, l| Some(format!("{{{l}}} {}", r.metrics.requests.load(Relaxed))),
        );
        self.family(
            out,
            "routelab_worker_errors_total",
            "Requests that failed on the worker.",
            "counter",
            &|r, l| Some(format!("{{{l}}} {}", r.metrics.errors.load(Relaxed))),
        );
        self.family(
            out,
            "routelab_worker_probes_total",
            "Probe bursts run.",
            "counter",
            &|r, l| {
                Some(format!(
                    "{{{l},result=\"ok\"}} {}\nroutelab_worker_probes_total{{{l},result=\"failed\"}} {}",
                    r.metrics.probes_ok.load(Relaxed),
                    r.metrics.probes_failed.load(Relaxed)
                ))
            },
        );
        for (name, help, pick) in [
            (
                "routelab_worker_ttft_seconds",
                "Gateway arrival to first response byte.",
                0,
            ),
            (
                "routelab_worker_e2e_seconds",
                "Gateway arrival to last response byte.",
                1,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (r, l) in self.rows.iter().zip(&self.labels) {
                let h = if pick == 0 {
                    &r.metrics.ttft
                } else {
                    &r.metrics.e2e
                };
                h.render(out, name, l);
            }
        }
    }
}

/// The gateway's queue and retries.
fn render_queue(out: &mut String, queue_len: usize, global: &GlobalMetrics) {
    let _ = writeln!(
        out,
        "# HELP routelab_queue_length Requests waiting at the gateway.\n# TYPE routelab_queue_length gauge\nroutelab_queue_length {queue_len}"
    );
    let _ = writeln!(
        out,
        "# HELP routelab_queued_total Requests that waited in the queue.\n# TYPE routelab_queued_total counter\nroutelab_queued_total {}",
        global.queued_total.load(Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP routelab_queue_timeouts_total Requests answered 429 after the queue timeout.\n# TYPE routelab_queue_timeouts_total counter\nroutelab_queue_timeouts_total {}",
        global.queue_timeouts.load(Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP routelab_decisions_total Routing decisions by why the worker was chosen (affinity: the prefix holder kept; score: the lowest score; write-off: predictive's least harm when every candidate misses; unscored: no scores compared; queued: dispatched from the queue).\n# TYPE routelab_decisions_total counter"
    );
    for (reason, n) in routelab_policies::Reason::ALL.iter().zip(&global.decisions) {
        let _ = writeln!(
            out,
            "routelab_decisions_total{{reason=\"{}\"}} {}",
            reason.as_str(),
            n.load(Relaxed)
        );
    }
    let _ = writeln!(
        out,
        "# HELP routelab_retries_total Requests retried on another worker.\n# TYPE routelab_retries_total counter\nroutelab_retries_total {}",
        global.retries.load(Relaxed)
    );
}

/// What went wrong in the gateway itself: background tasks restarted, requests it refused.
fn render_gateway_errors(out: &mut String, global: &GlobalMetrics) {
    let _ = writeln!(
        out,
        "# HELP routelab_gateway_task_restarts_total Panics of a background task (or of a task it spawned), each logged as task_panicked; the task is started again.\n# TYPE routelab_gateway_task_restarts_total counter"
    );
    let bus = global
        .bus_task
        .load(Relaxed)
        .then_some(crate::supervise::BackgroundTask::Bus);
    for task in crate::supervise::BackgroundTask::ALL.into_iter().chain(bus) {
        let _ = writeln!(
            out,
            "routelab_gateway_task_restarts_total{{task=\"{}\"}} {}",
            task.as_str(),
            global.task_restarts.of(task)
        );
    }
    let _ = writeln!(
        out,
        "# HELP routelab_gateway_rejections_total Requests the gateway answered with an error itself, by HTTP status and error code.\n# TYPE routelab_gateway_rejections_total counter"
    );
    let rejections = global
        .rejections
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    for ((status, code), n) in rejections {
        let _ = writeln!(
            out,
            "routelab_gateway_rejections_total{{status=\"{status}\",code=\"{}\"}} {n}",
            esc(code)
        );
    }
}

/// A one-hot gauge family: for every row, one series per possible `values` entry, 1 for the
/// row's current value and 0 for the others, so the label sets never change.
#[allow(clippy::too_many_arguments)]
fn one_hot<'a>(
    out: &mut String,
    name: &str,
    help: &str,
    label: &str,
    values: &[&str],
    rows: &[WorkerRow<'a>],
    labels: &[String],
    current: impl Fn(&WorkerRow<'a>) -> &'a str,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
    for (r, l) in rows.iter().zip(labels) {
        let now = current(r);
        for v in values {
            let _ = writeln!(out, "{name}{{{l},{label}=\"{v}\"}} {}", u8::from(*v == now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::registry::Histogram;
    use super::*;
    use std::time::Duration;

    #[test]
    fn histogram_is_cumulative() {
        let h = Histogram::new(&[0.1, 1.0]);
        h.observe(Duration::from_millis(50));
        h.observe(Duration::from_millis(500));
        h.observe(Duration::from_secs(5));
        let mut s = String::new();
        h.render(&mut s, "x", "a=\"b\"");
        assert!(s.contains("x_bucket{a=\"b\",le=\"0.1\"} 1\n"));
        assert!(s.contains("x_bucket{a=\"b\",le=\"1\"} 2\n"));
        assert!(s.contains("x_bucket{a=\"b\",le=\"+Inf\"} 3\n"));
        assert!(s.contains("x_count{a=\"b\"} 3\n"));
        assert_eq!(h.count(), 3);
    }

    fn row<'a>(state: &'a str, provenance: &'a str, m: &'a WorkerMetrics) -> WorkerRow<'a> {
        WorkerRow {
            name: "w",
            model: "m",
            state,
            in_flight: 0,
            weight: 1.5,
            provenance,
            cap: None,
            probe_tok_s: Some(900.0),
            metrics: m,
        }
    }

    /// The series (name and labels, without values) of a rendering.
    fn series(text: &str) -> Vec<String> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.rsplit_once(' ').unwrap().0.to_string())
            .collect()
    }

    /// Regression: the state and provenance were labels of the value itself, so every pin and
    /// ejection started a new series; throughput was named `_tok_s`; rejections were not
    /// counted.
    #[test]
    fn label_sets_stay_stable_units_are_base_units_and_rejections_are_counted() {
        let m = WorkerMetrics::default();
        let global = GlobalMetrics::default();
        let before = render(&[row("up", "measured", &m)], 0, &global);
        let after = render(&[row("disconnected", "pinned", &m)], 0, &global);
        assert_eq!(series(&before), series(&after));
        let l = r#"worker="w",model="m""#;
        for line in [
            format!("routelab_worker_weight{{{l}}} 1.5\n"),
            format!("routelab_worker_weight_provenance{{{l},provenance=\"measured\"}} 1\n"),
            format!("routelab_worker_weight_provenance{{{l},provenance=\"pinned\"}} 0\n"),
            format!("routelab_worker_state{{{l},state=\"up\"}} 1\n"),
            format!("routelab_worker_state{{{l},state=\"disconnected\"}} 0\n"),
            format!("routelab_worker_up{{{l}}} 1\n"),
            format!("routelab_worker_probe_throughput_tokens_per_second{{{l}}} 900\n"),
        ] {
            assert!(before.contains(&line), "missing {line:?} in\n{before}");
        }
        assert!(after.contains(&format!(
            "routelab_worker_weight_provenance{{{l},provenance=\"pinned\"}} 1\n"
        )));
        assert!(after.contains(&format!("routelab_worker_up{{{l}}} 0\n")));
        assert!(!before.contains("tok_s"), "{before}");

        global.count_rejection(429, "queue_timeout");
        global.count_rejection(429, "queue_timeout");
        global.count_rejection(404, "model_not_found");
        let text = render(&[], 0, &global);
        assert!(text.contains("# TYPE routelab_gateway_rejections_total counter\n"));
        assert!(text.contains(
            "routelab_gateway_rejections_total{status=\"429\",code=\"queue_timeout\"} 2\n"
        ));
        assert!(text.contains(
            "routelab_gateway_rejections_total{status=\"404\",code=\"model_not_found\"} 1\n"
        ));
    }
}
