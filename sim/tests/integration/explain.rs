//! The simulator shows the decisions its router made, in the shape the gateway's request log
//! shows them (`ShownDecision`, one type in the policy crate), and explaining them changes
//! nothing about the run (issue 42: "a request's logged scores are the ones the router decided
//! on, in the simulator and the gateway alike").

use routelab_policies::{PolicyConfig, ShownDecision};
use routelab_sim::{RequestRecord, RequestSink, Scenario, run};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Default)]
struct Explained {
    rows: Vec<RequestRecord>,
    decisions: Vec<(u64, ShownDecision)>,
}

impl RequestSink for Explained {
    fn record(&mut self, row: RequestRecord) {
        self.rows.push(row);
    }
    fn wants_decisions(&self) -> bool {
        true
    }
    fn decision(&mut self, id: u64, decision: ShownDecision) {
        self.decisions.push((id, decision));
    }
}

fn scenario() -> Scenario {
    Scenario::load(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios/traces/azure-code.yaml"),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_decisions_shown_are_the_ones_that_placed_each_request() {
    let sc = scenario();
    let seed = sc.setup.seed;
    for name in ["predictive", "seed-v3"] {
        let policy = PolicyConfig::from_name(name).expect("policy");
        let mut plain: Vec<RequestRecord> = Vec::new();
        let mut t = sc.traffic_source(seed).expect("traffic");
        let plain_metrics = run(&sc.setup, &policy, &mut *t, Some(&mut plain)).expect("run");
        let mut shown = Explained::default();
        let mut t = sc.traffic_source(seed).expect("traffic");
        let shown_metrics = run(&sc.setup, &policy, &mut *t, Some(&mut shown)).expect("run");

        // Explaining is only looking: the same run, row for row.
        assert_eq!(plain, shown.rows, "{name}: explaining changed the rows");
        assert_eq!(
            format!("{plain_metrics:?}"),
            format!("{shown_metrics:?}"),
            "{name}: explaining changed the metrics"
        );

        // The last decision made for a request placed it where it was served.
        let mut last: BTreeMap<u64, &ShownDecision> = BTreeMap::new();
        for (id, d) in &shown.decisions {
            last.insert(*id, d);
        }
        let served: Vec<&RequestRecord> = plain.iter().filter(|r| !r.worker.is_empty()).collect();
        assert!(
            served.len() > 100,
            "{name}: enough requests to mean something"
        );
        for r in &served {
            let d = last
                .get(&r.id)
                .unwrap_or_else(|| panic!("{name}: request {} has no decision", r.id));
            assert_eq!(d.chosen.worker, r.worker, "{name}: request {}", r.id);
        }

        // Where the chooser compared scores, the chosen one is the lowest shown, and the
        // runner-up is another worker.
        let mut compared = 0;
        for (id, d) in &shown.decisions {
            if d.reason != "score" {
                continue;
            }
            let chosen = d
                .chosen
                .score
                .expect("a scored decision has the chosen score");
            if let Some(r) = &d.runner_up {
                compared += 1;
                assert_ne!(r.worker, d.chosen.worker, "{name}: request {id}");
                let other = r.score.expect("the runner-up was scored");
                assert!(chosen <= other, "{name}: request {id}: {chosen} > {other}");
            }
            let predicts = d.chosen.predicted_ttft_ms.is_some();
            assert_eq!(predicts, name == "predictive", "{name}: predictions shown");
            if let Some(ttft) = d.chosen.predicted_ttft_ms {
                assert!(
                    ttft > 0.0 && ttft.is_finite(),
                    "{name}: request {id}: {ttft}"
                );
            }
        }
        assert!(
            compared * 2 > served.len(),
            "{name}: most decisions compared two workers ({compared} of {})",
            served.len()
        );
    }
}
