//! Issue 41: `routelab plan` on a bundled heterogeneous scenario (the diurnal trace on a mixed
//! 4-worker fleet): the paragraph, the capacity range, the robust choice, and a gateway
//! configuration the gateway's own loader and check accept, whose policy and SLO are the ones
//! the plan measured.

use super::common::{routelab, scratch, text};
use routelab_gateway::{GatewayConfig, SloConfig};
use serde_json::Value;

#[test]
fn plan_writes_the_robust_choice_its_range_and_a_gateway_config_that_runs_it() {
    let dir = scratch("plan-diurnal");
    let o = routelab(&[
        "plan",
        "scenarios/traces/diurnal.yaml",
        "--seeds",
        "2",
        "--precision",
        "0.1",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let said = text(&o);
    assert!(o.status.success(), "{said}");
    let plan: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
    let robust = plan["robust"].as_str().unwrap().to_string();
    let policies: Vec<&str> = plan["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    // Default candidates: ours, then the scenario's field routers.
    assert_eq!(policies[0], "predictive");
    assert!(policies.contains(&"least-load"), "{policies:?}");
    assert!(policies.contains(&robust.as_str()));
    let conditions: Vec<&str> = plan["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    // Every bundled profile of this fleet marks prefill_tok_s and decode extrapolated.
    assert_eq!(
        conditions,
        [
            "resampled",
            "as recorded",
            "held-out tail",
            "prefill_tok_s low",
            "prefill_tok_s high",
            "decode low",
            "decode high"
        ]
    );
    // The range is the robust choice's capacity over the conditions, and a slower fleet
    // carries less than a faster one.
    let range = &plan["range_rate_per_s"];
    let (lo, hi) = (
        range["low_mean"].as_f64().unwrap(),
        range["high_mean"].as_f64().unwrap(),
    );
    assert!(0.0 < lo && lo < hi, "{range}");
    assert!(range["low"].as_f64().unwrap() <= lo && range["high"].as_f64().unwrap() >= hi);
    let rate = |cond: usize| {
        let i = policies.iter().position(|p| *p == robust).unwrap();
        plan["conditions"][cond]["capacity_rate_per_s"][i]["mean"]
            .as_f64()
            .unwrap()
    };
    assert!(
        rate(5) < rate(6),
        "decode low {} vs high {}",
        rate(5),
        rate(6)
    );
    // The standings: the robust choice has the highest worst ratio (up to the precision).
    let worst = |p: &str| {
        plan["standings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["policy"] == p)
            .unwrap()["worst"]
            .as_f64()
            .unwrap()
    };
    for p in &policies {
        assert!(
            worst(&robust) >= worst(p) - 0.1,
            "{p}: {}",
            plan["standings"]
        );
    }
    // The console paragraph.
    assert!(
        said.contains(&format!("ship `{robust}`, the robust choice")),
        "{said}"
    );
    assert!(said.contains("Plan for "), "{said}");
    assert!(said.contains("req/s"), "{said}");
    assert!(
        std::fs::read_to_string(dir.join("plan.md"))
            .unwrap()
            .contains("## Standings")
    );

    // The gateway configuration: the gateway's loader and check accept it, without warnings,
    // and it runs the policy the plan chose at the SLO it measured (the scenario's slo,
    // TTFT <= 2 s and TPOT <= 0.1 s per request, met by 90 %).
    let cfg = GatewayConfig::load(&dir.join("gateway.yaml")).unwrap();
    routelab_gateway::check(&cfg).unwrap();
    assert!(cfg.warnings().is_empty(), "{:?}", cfg.warnings());
    assert_eq!(cfg.policy.build().unwrap().name, robust);
    assert_eq!(
        cfg.slo,
        Some(SloConfig {
            ttft_s: 2.0,
            tpot_s: 0.1
        })
    );
    assert_eq!(plan["slo"], "ttft<=2s,tpot<=100ms");
    let names: Vec<&str> = cfg.workers.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(names.len(), 4, "{names:?}");
    assert!(
        names.contains(&"pro6000") && names.contains(&"mac"),
        "{names:?}"
    );
}

/// Issue 41: `plan` from a fleet, a trace and an SLO given apart (no scenario file): the fleet
/// file is a scenario without traffic, the trace a file or a scenario's trace source; the plan
/// runs on them and writes the gateway configuration for that fleet at that SLO. What is wrong
/// is a located error naming the file or flag at fault.
#[test]
fn plan_takes_a_fleet_a_trace_and_an_slo() {
    let dir = scratch("plan-fleet-trace");
    let fleet = dir.join("fleet.yaml");
    std::fs::write(
        &fleet,
        "model: gemma-27b\nfleet:\n  - { name: pro6000, profile: rtx-pro-6000-27b }\n  - { name: pair, profile: rtx4090x2-27b }\n",
    )
    .unwrap();
    let trace = "{path: data/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv, format: azure, limit: 1500, rate_scale: 0.4}".to_string();
    let out = dir.join("out");
    let o = routelab(&[
        "plan",
        "--fleet",
        fleet.to_str().unwrap(),
        "--trace",
        &trace,
        "--slo",
        "ttft<=2s,tpot<=100ms",
        "--target",
        "0.9",
        "--policy",
        "predictive",
        "--policy",
        "least-load",
        "--seeds",
        "1",
        "--precision",
        "0.2",
        "--out",
        out.to_str().unwrap(),
    ]);
    let said = text(&o);
    assert!(o.status.success(), "{said}");
    assert!(said.contains("Plan for "), "{said}");
    let plan: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("plan.json")).unwrap()).unwrap();
    assert_eq!(plan["scenario"], "fleet");
    let cfg = GatewayConfig::load(&out.join("gateway.yaml")).unwrap();
    routelab_gateway::check(&cfg).unwrap();
    assert!(cfg.warnings().is_empty(), "{:?}", cfg.warnings());
    assert_eq!(
        cfg.policy.build().unwrap().name,
        plan["robust"].as_str().unwrap()
    );
    assert_eq!(
        cfg.slo,
        Some(SloConfig {
            ttft_s: 2.0,
            tpot_s: 0.1
        })
    );
    let names: Vec<&str> = cfg.workers.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(names, ["pro6000", "pair"]);
    let header = std::fs::read_to_string(out.join("gateway.yaml")).unwrap();
    assert!(header.contains("routelab plan --fleet"), "{header}");

    // Located errors: the fleet file's line and field, the trace flag's field, a fleet file
    // with traffic of its own, and the flags that go together.
    let bad = dir.join("bad.yaml");
    std::fs::write(
        &bad,
        "model: m\nfleet:\n  - { name: a, profile: no-such-profile }\n",
    )
    .unwrap();
    let slo = "ttft<=2s,tpot<=100ms";
    for (args, want) in [
        (
            vec![
                "--fleet",
                bad.to_str().unwrap(),
                "--trace",
                &trace,
                "--slo",
                slo,
            ],
            "bad.yaml:3:",
        ),
        (
            vec![
                "--fleet",
                fleet.to_str().unwrap(),
                "--trace",
                "no/such.csv",
                "--slo",
                slo,
            ],
            "--trace: trace.path: no such file",
        ),
        (
            vec![
                "--fleet",
                fleet.to_str().unwrap(),
                "--trace",
                "{path: x.csv, speed: 2}",
                "--slo",
                slo,
            ],
            "speed",
        ),
        (
            vec!["--fleet", fleet.to_str().unwrap(), "--slo", slo],
            "--trace",
        ),
        (
            vec!["--fleet", fleet.to_str().unwrap(), "--trace", &trace],
            "--slo",
        ),
    ] {
        let o = routelab(&[&["plan"], args.as_slice()].concat());
        let said = text(&o);
        assert!(!o.status.success(), "{args:?}: {said}");
        assert!(said.contains(want), "{args:?}: {said}");
        assert!(!said.contains("panicked"), "{said}");
    }
}
