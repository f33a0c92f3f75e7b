//! The signals as others see them: their `/metrics` families, what `--check` says the policy
//! will read of each worker, and `/admin`'s views.

use super::hub::{PollState, PollStatus, SAMPLE_EVERY, lock};
use super::settings::PollSettings;
use crate::app::shared::Shared;
use crate::kv::{StreamState, StreamStatus};
use crate::supervise::BackgroundTask;
use routelab_policies::{PrefixKnowledge, WorkerId};
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::HashMap;

/// The signal families of `/metrics`: per worker with a KV stream, whether it is live and its
/// counters; per polled worker, whether its report is live and the polls' outcomes (the
/// background tasks' restarts are rendered with the gateway's own families, [`crate::metrics`]).
pub(crate) fn render_metrics(s: &Shared) -> String {
    use std::fmt::Write as _;
    let labels: HashMap<u32, String> = {
        let core = s.routing.core();
        core.workers
            .live()
            .map(|(id, w)| {
                (
                    id.0,
                    format!(
                        "worker=\"{}\",model=\"{}\"",
                        crate::metrics::render::esc(&w.cfg.name),
                        crate::metrics::render::esc(&w.cfg.model)
                    ),
                )
            })
            .collect()
    };
    let mut out = String::new();
    let mut streams: Vec<(u32, StreamStatus)> = lock(&s.signals.kv)
        .iter()
        .map(|(id, w)| (*id, w.status.clone()))
        .collect();
    streams.sort_by_key(|(id, _)| *id);
    let streams: Vec<(&String, StreamStatus)> = streams
        .into_iter()
        .filter_map(|(id, st)| labels.get(&id).map(|l| (l, st)))
        .collect();
    type Pick = fn(&StreamStatus) -> f64;
    let families: [(&str, &str, &str, Pick); 9] = [
        (
            "routelab_worker_kv_events_live",
            "1 while the worker's KV event stream is live; 0 while the gateway falls back to recording what it dispatches (approximate).",
            "gauge",
            |st| f64::from(u8::from(st.state == StreamState::Live)),
        ),
        (
            "routelab_worker_kv_events_batches_total",
            "KV event batches applied (live and replayed).",
            "counter",
            |st| st.batches as f64,
        ),
        (
            "routelab_worker_kv_events_gaps_total",
            "Sequence gaps in the worker's KV event stream.",
            "counter",
            |st| st.gaps as f64,
        ),
        (
            "routelab_worker_kv_events_replayed_total",
            "KV event batches recovered from the engine's replay socket.",
            "counter",
            |st| st.replayed as f64,
        ),
        (
            "routelab_worker_kv_events_unrecovered_total",
            "Gaps no replay could fill (the worker's mirror started again).",
            "counter",
            |st| st.unrecovered as f64,
        ),
        (
            "routelab_worker_kv_events_malformed_total",
            "KV event messages or payloads that could not be read.",
            "counter",
            |st| st.malformed as f64,
        ),
        (
            "routelab_worker_kv_events_refused_total",
            "KV event sessions ended because the peer broke a size limit (frame, message or frame count); the gateway reconnects.",
            "counter",
            |st| st.refused as f64,
        ),
        (
            "routelab_worker_kv_events_resets_total",
            "Times the worker's KV event sequence went backwards (an engine restart): its mirror was cleared and started again.",
            "counter",
            |st| st.resets as f64,
        ),
        (
            "routelab_worker_kv_events_fallback_blocks",
            "Prefix blocks the gateway recorded for the worker while its stream was not live.",
            "gauge",
            |st| st.fallback_blocks as f64,
        ),
    ];
    for (name, help, kind, pick) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (l, st) in &streams {
            let _ = writeln!(out, "{name}{{{l}}} {}", pick(st));
        }
    }
    let mut polls: Vec<(u32, PollStatus)> = lock(&s.signals.polls)
        .iter()
        .map(|(id, p)| (*id, p.clone()))
        .collect();
    polls.sort_by_key(|(id, _)| *id);
    let _ = writeln!(
        out,
        "# HELP routelab_worker_engine_metrics_live 1 while the worker's polled engine report is fresh; 0 while the policy falls back to the gateway's own counts.\n# TYPE routelab_worker_engine_metrics_live gauge"
    );
    for (id, p) in &polls {
        if let Some(l) = labels.get(id) {
            let _ = writeln!(
                out,
                "routelab_worker_engine_metrics_live{{{l}}} {}",
                u8::from(p.state == PollState::Live)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP routelab_worker_engine_metrics_polls_total Polls of the worker's metrics page, by result.\n# TYPE routelab_worker_engine_metrics_polls_total counter"
    );
    for (id, p) in &polls {
        if let Some(l) = labels.get(id) {
            let _ = writeln!(
                out,
                "routelab_worker_engine_metrics_polls_total{{{l},result=\"ok\"}} {}",
                p.ok
            );
            let _ = writeln!(
                out,
                "routelab_worker_engine_metrics_polls_total{{{l},result=\"failed\"}} {}",
                p.failed
            );
        }
    }
    out
}

/// A signal a policy reads and whether a worker provides it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SignalUse {
    /// The signal.
    pub signal: &'static str,
    /// Provided for this worker (as configured; `/admin` adds whether it is live now).
    pub provided: bool,
    /// What the policy uses instead when it is not.
    pub fallback: Option<&'static str>,
}

/// What the configured policy reads of a worker, as configured: prompt tokens (exact or
/// estimated), the engine's KV events, the engine's metrics.
pub(crate) fn uses(
    knowledge: PrefixKnowledge,
    reads_reports: bool,
    poll: &PollSettings,
    kv_configured: bool,
    exact_tokens: bool,
) -> Vec<SignalUse> {
    let mut out = vec![SignalUse {
        signal: "prompt tokens",
        provided: exact_tokens,
        fallback: (!exact_tokens).then_some("bytes / 4 estimate and 2,048-byte prefix blocks"),
    }];
    if let PrefixKnowledge::KvEvents { .. } = knowledge {
        out.push(SignalUse {
            signal: "kv events",
            provided: kv_configured,
            fallback: Some("approximate: the gateway records what it dispatches"),
        });
        if kv_configured && !exact_tokens {
            out.push(SignalUse {
                signal: "token ids matching the engine's",
                provided: false,
                fallback: Some("none: a real engine's blocks never match byte blocks (configure the model's tokenizer)"),
            });
        }
    }
    if reads_reports {
        out.push(SignalUse {
            signal: "engine metrics",
            provided: poll.enabled,
            fallback: Some("the gateway's own counts of tokens in flight"),
        });
    }
    out
}

/// The policy's parts as they take effect: what a composition string leaves out is filled in
/// ([`PolicyConfig::composition_default`]), and the per-worker cap in particular is easy to
/// miss (`equal/p2c` carries `flat:24`: at most 24 requests in flight per worker, the rest
/// queued in the gateway). `/admin` shows it as `policy_parts`, `--check` as a line.
pub(crate) fn policy_parts(p: &routelab_policies::PolicyConfig) -> Value {
    use routelab_policies::Cap;
    let (chooser, affinity, cap) = routelab_policies::PolicyConfig::composition_default();
    json!({
        "weights": p.weights.name(),
        "chooser": p.chooser.composition(),
        "affinity": p.affinity.composition(),
        "cap": p.cap.composition(),
        "cap_per_worker": match p.cap {
            Cap::None => "none: no limit on a worker's requests in flight".to_string(),
            Cap::Flat(n) => format!("at most {n} requests in flight per worker; more wait in the gateway's queue"),
            Cap::Weighted(n) => format!("{n} scaled by each worker's weight (at least 1) in flight per worker; more wait in the gateway's queue"),
        },
        "prefix_knowledge": p.knowledge.composition(),
        "composition_defaults": {
            "chooser": chooser.composition(),
            "affinity": affinity.composition(),
            "cap": cap.composition(),
        },
    })
}

/// [`policy_parts`] as `--check`'s line.
fn policy_parts_line(p: &routelab_policies::PolicyConfig) -> String {
    let v = policy_parts(p);
    let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
    let d = &v["composition_defaults"];
    format!(
        "policy {} in effect: weights {}, chooser {}, affinity {}, cap {} ({}), prefix knowledge {}; a composition that omits a part gets chooser {}, affinity {}, cap {}",
        p.name,
        s("weights"),
        s("chooser"),
        s("affinity"),
        s("cap"),
        s("cap_per_worker"),
        s("prefix_knowledge"),
        d["chooser"].as_str().unwrap_or_default(),
        d["affinity"].as_str().unwrap_or_default(),
        d["cap"].as_str().unwrap_or_default(),
    )
}

/// What `--check` says of the signals: per worker, what the configured policy reads and
/// whether the worker provides it (as configured: a stream or a poll may still fail at run
/// time, which `/admin` shows), and a warning per missing signal naming the fallback. Loads the
/// tokenizers, so a bad `models[]` entry is a located error here too.
pub fn check_report(
    c: &crate::config::GatewayConfig,
) -> Result<(Vec<String>, Vec<String>), routelab_policies::InputError> {
    let policy = c.policy.build_in(c.origin(), "policy")?;
    let tokenizers = crate::tokens::Tokenizers::load(
        &c.models,
        &crate::tokens::config_base(c.origin()),
        c.origin(),
    )?;
    let poll_interval = policy.chooser.engine_poll_interval();
    let poll = c.engine_metrics.settings(poll_interval);
    let mut lines = Vec::new();
    let mut warnings = Vec::new();
    let kv = matches!(policy.knowledge, PrefixKnowledge::KvEvents { .. });
    lines.push(format!(
        "policy {}: reads prompt tokens{}{}",
        policy.name,
        if kv {
            ", the engines' KV events (prefix_knowledge: kv-events)"
        } else {
            ""
        },
        if poll_interval.is_some() {
            format!(
                ", engine metrics (every {} s of policy time)",
                poll.interval_s
            )
        } else {
            String::new()
        }
    ));
    lines.push(policy_parts_line(&policy));
    if poll.enabled {
        lines.push(format!(
            "engine metrics: polled from each worker's {} every {} s, a report ages out after {} s",
            poll.path, poll.interval_s, poll.stale_after_s
        ));
    }
    for w in &c.workers {
        let used = uses(
            policy.knowledge,
            poll_interval.is_some(),
            &poll,
            w.kv_events.is_some(),
            tokenizers.get(&w.model).is_some(),
        );
        let mut parts = vec![format!("tokens {}", tokenizers.describe(&w.model))];
        if kv {
            parts.push(match &w.kv_events {
                Some(k) => format!(
                    "kv events from {}{}",
                    k.endpoint,
                    k.replay_endpoint.as_ref().map_or(
                        " (no replay socket: gaps cannot be filled)".to_string(),
                        |r| format!(", replay {r}")
                    )
                ),
                None => "no kv_events".into(),
            });
        }
        if poll_interval.is_some() || poll.enabled {
            parts.push(if poll.enabled {
                "metrics polled".into()
            } else {
                "metrics not polled".into()
            });
        }
        lines.push(format!("worker {}: {}", w.name, parts.join("; ")));
        for u in used
            .iter()
            .filter(|u| !u.provided && u.signal != "prompt tokens")
        {
            warnings.push(format!(
                "worker {}: the policy reads {} but {}; it falls back to {}",
                w.name,
                u.signal,
                match u.signal {
                    "kv events" => "the worker has no kv_events",
                    "engine metrics" => "engine_metrics.poll is off",
                    _ => "the model has no tokenizer",
                },
                u.fallback.unwrap_or("nothing")
            ));
        }
    }
    if kv {
        for m in c
            .workers
            .iter()
            .map(|w| w.model.as_str())
            .collect::<std::collections::BTreeSet<_>>()
        {
            if tokenizers.get(m).is_none() {
                warnings.push(format!(
                    "model {m}: prompt tokens are estimated (bytes / 4): only an engine that announces the same byte tokens (the emulator) matches its KV events; configure models[].tokenizer for a real engine"
                ));
            }
        }
    }
    Ok((lines, warnings))
}

/// `/admin`'s gateway-wide signal facts: the engine poll's settings and the background tasks'
/// restarts.
pub(crate) fn gateway_view(s: &Shared) -> Value {
    let p = &s.settings.engine_poll;
    json!({
        "engine_metrics": {
            "poll": p.enabled,
            "interval_s": p.interval_s,
            "stale_after_s": p.stale_after_s,
            "path": p.path,
        },
        "task_restarts": BackgroundTask::ALL
            .iter()
            .map(|&t| (t.as_str(), s.global.task_restarts.of(t)))
            .collect::<std::collections::BTreeMap<_, _>>(),
    })
}

/// `/admin`'s view of a worker's signals: what the policy reads, what is live now, the history.
pub(crate) fn admin_view(s: &Shared, id: WorkerId, model: &str, kv_configured: bool) -> Value {
    let (knowledge, reads_reports) = {
        let core = s.routing.core();
        (
            core.router.config().knowledge,
            core.router.engine_poll_interval().is_some(),
        )
    };
    let exact = s.tokenizers.get(model).is_some();
    let mut reads = uses(
        knowledge,
        reads_reports,
        &s.settings.engine_poll,
        kv_configured,
        exact,
    );
    let stream = s.signals.stream(id);
    let poll = s.signals.poll(id);
    // Live state refines "provided as configured".
    for u in &mut reads {
        match u.signal {
            "kv events" => {
                u.provided &= stream
                    .as_ref()
                    .is_some_and(|st| st.state == StreamState::Live)
            }
            "engine metrics" => {
                u.provided &= poll.as_ref().is_some_and(|p| p.state == PollState::Live)
            }
            _ => {}
        }
    }
    let history = s.signals.history(id);
    json!({
        "tokens": s.tokenizers.describe(model),
        "kv_events": match &stream {
            Some(st) => serde_json::to_value(st).unwrap_or(Value::Null),
            None => json!({"state": "off"}),
        },
        "engine_metrics": match &poll {
            Some(p) => {
                let mut v = serde_json::to_value(p).unwrap_or(Value::Null);
                if let (Some(r), Some(at)) = (p.report, p.at) {
                    v["report"] = json!({
                        "kv_used_fraction": r.kv_used_fraction,
                        "queued_prompt_tokens": r.queued_prompt_tokens,
                        "running_tokens": r.running_tokens,
                        "generation_tok_s": r.generation_tok_s,
                        "age_s": s.routing.clock.now().saturating_since(at).as_secs_f64(),
                    });
                }
                v
            }
            None => json!({"state": if s.settings.engine_poll.enabled { "waiting" } else { "off" }}),
        },
        "reads": reads,
        "history": {
            "every_s": SAMPLE_EVERY.as_secs_f64(),
            "in_flight": history.iter().map(|h| h.in_flight).collect::<Vec<_>>(),
            "ttft_s": history.iter().map(|h| h.ttft_s).collect::<Vec<_>>(),
            "weight": history.iter().map(|h| h.weight).collect::<Vec<_>>(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::{EngineMetricsConfig, PollMode};
    use std::time::Duration;

    #[test]
    fn least_load_without_a_poll_and_kv_events_without_a_stream_name_their_fallbacks() {
        let off = EngineMetricsConfig {
            poll: PollMode::Off,
            ..Default::default()
        }
        .settings(Some(Duration::from_secs(10)));
        let u = uses(PrefixKnowledge::Approximate, true, &off, false, false);
        let m = u.iter().find(|u| u.signal == "engine metrics").unwrap();
        assert!(!m.provided);
        assert!(m.fallback.unwrap().contains("own counts"));
        let on = EngineMetricsConfig::default().settings(Some(Duration::from_secs(10)));
        assert!(on.enabled && on.interval_s == 10.0 && on.stale_after_s == 30.0);
        let kv = PrefixKnowledge::KvEvents {
            delay: Duration::ZERO,
        };
        let u = uses(kv, false, &on, false, true);
        let k = u.iter().find(|u| u.signal == "kv events").unwrap();
        assert!(!k.provided && k.fallback.unwrap().starts_with("approximate"));
        let u = uses(kv, false, &on, true, false);
        assert!(
            u.iter()
                .any(|u| u.signal.starts_with("token ids") && !u.provided)
        );
    }
}
