//! A configuration written for a fleet the lab simulated (`routelab plan`): its workers, the
//! policy the lab chose and the SLO it measured that policy against, so the router the
//! gateway runs is the router the lab measured. The text is read back through
//! [`GatewayConfig::from_yaml`] before it is handed out, so a file this writes is one the
//! gateway (and `--check`) accepts.

use super::{CacheTokens, GatewayConfig, SloConfig, WorkerConfig};
use routelab_policies::{InputError, PREFIX_BLOCK_TOKENS, WorkerSpec};
use serde::Serialize;

impl WorkerConfig {
    /// The gateway's entry for a worker the policy crate describes, served at `base_url`:
    /// names, node, GPUs, context window and launch arguments as given, its KV cache in tokens
    /// from the spec's prefix-cache blocks.
    pub fn from_spec(spec: &WorkerSpec, base_url: String) -> WorkerConfig {
        WorkerConfig {
            name: spec.name.clone(),
            base_url,
            node: Some(spec.node.clone()),
            model: spec.model.clone(),
            gpu_names: spec.gpu_names.clone(),
            context_window: spec.context_window,
            launch_args: spec.launch_args.clone(),
            cache_tokens: spec
                .cache_blocks
                .and_then(|b| CacheTokens::new(f64::from(b) * f64::from(PREFIX_BLOCK_TOKENS)).ok()),
            kv_events: None,
            api_key_file: None,
            api_key: None,
        }
    }
}

/// The fields a fleet's configuration sets; everything else keeps the gateway's default.
#[derive(Serialize)]
struct FleetFile<'a> {
    policy: &'a str,
    slo: SloConfig,
    workers: &'a [WorkerConfig],
}

/// The configuration text for `workers` routed by `policy` (a preset or composition name)
/// aiming at `slo`, after `header` (comment lines, each starting with `#`), and the
/// configuration it parses into (`origin` names it in errors).
///
/// # Errors
/// The gateway's own refusal of the text, as [`GatewayConfig::from_yaml`] gives it (a policy
/// name it does not know, a bad bound, a worker it refuses).
pub fn fleet_config(
    header: &str,
    policy: &str,
    slo: SloConfig,
    workers: &[WorkerConfig],
    origin: &str,
) -> Result<(String, GatewayConfig), InputError> {
    let body = serde_saphyr::to_string(&FleetFile {
        policy,
        slo,
        workers,
    })
    .map_err(|e| InputError::new(origin, "", format!("cannot be written: {e}")))?;
    let text = format!("{header}{body}");
    let parsed = GatewayConfig::from_yaml(&text, origin)?;
    Ok((text, parsed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str) -> WorkerSpec {
        WorkerSpec {
            name: name.into(),
            node: format!("{name}-node"),
            model: "m".into(),
            gpu_names: vec!["RTX 4090".into(), "RTX 4090".into()],
            context_window: 16384,
            launch_args: "--tp 2".into(),
            cache_blocks: Some(48),
        }
    }

    #[test]
    fn a_fleet_config_reads_back_with_its_policy_slo_and_workers() {
        let workers: Vec<WorkerConfig> = ["a", "b"]
            .iter()
            .enumerate()
            .map(|(i, n)| {
                WorkerConfig::from_spec(&spec(n), format!("http://127.0.0.1:{}", 8001 + i))
            })
            .collect();
        let slo = SloConfig {
            ttft_s: 30.0,
            tpot_s: 0.1,
        };
        let (text, c) = fleet_config("# planned\n", "least-load", slo, &workers, "t.yaml").unwrap();
        assert!(text.starts_with("# planned\n"), "{text}");
        assert_eq!(c.slo, Some(slo));
        assert_eq!(c.policy.build().unwrap().name, "least-load");
        assert_eq!(c.workers, workers);
        assert_eq!(c.workers[1].spec(), spec("b"));
        // A name the gateway does not know is its own located refusal, not a file it would
        // refuse later.
        let e = fleet_config("", "no-such-policy", slo, &workers, "t.yaml").unwrap_err();
        assert_eq!(e.field, "policy.preset", "{e}");
    }
}
