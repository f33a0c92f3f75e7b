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
