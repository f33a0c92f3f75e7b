//! Scalar summaries of a run ([`RunSummary`]) and the per-worker rows ([`WorkerSummary`]),
//! both filled from the metric catalog ([`crate::metric`]).

use crate::metric::{CATALOG, JsonKey, Metric, REPLICA_METRICS, share};
use crate::num::r6;
use routelab_sim::RunMetrics;
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

/// The scalar metrics of one policy's run (one seed): what `summary.json` reports per run, what
/// `compare` aggregates across seeds and what `sweep` tabulates — one value per [`CATALOG`]
/// entry, as reported (counts exact, the rest to 6 significant digits); a missing value is
/// `None` (JSON `null`, never NaN, never 0).
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    /// Policy name.
    pub policy: String,
    /// Indexed like [`CATALOG`].
    values: Vec<Option<f64>>,
}

impl RunSummary {
    /// Extract the scalar metrics of a run.
    pub fn from_metrics(m: &RunMetrics) -> RunSummary {
        RunSummary {
            policy: m.policy.clone(),
            values: CATALOG.iter().map(|c| c.reported(m)).collect(),
        }
    }

    /// The same values under another policy name.
    pub fn with_policy(mut self, policy: impl Into<String>) -> RunSummary {
        self.policy = policy.into();
        self
    }

    /// Every catalog value, indexed like [`CATALOG`] (what a partial result records).
    pub fn values(&self) -> &[Option<f64>] {
        &self.values
    }

    /// A summary from values indexed like [`CATALOG`] (a partial result read back); `None`
    /// when there is not exactly one value per catalog metric or a value is not finite.
    pub fn from_values(policy: impl Into<String>, values: Vec<Option<f64>>) -> Option<RunSummary> {
        (values.len() == CATALOG.len() && values.iter().flatten().all(|v| v.is_finite())).then(
            || RunSummary {
                policy: policy.into(),
                values,
            },
        )
    }

    /// The value of a catalog metric.
    pub fn get(&self, metric: &Metric) -> Option<f64> {
        self.values.get(metric.index()).copied().flatten()
    }

    /// Replace the value of a catalog metric (e.g. to scale a summary in a test).
    pub fn set(&mut self, metric: &Metric, value: Option<f64>) {
        self.values[metric.index()] = value.filter(|v| v.is_finite());
    }

    /// Cells of the per-run CSVs, in [`summary_csv_header`] order (empty for missing values).
    pub(crate) fn csv_fields(&self) -> Vec<String> {
        CATALOG
            .iter()
            .zip(&self.values)
            .filter(|(m, _)| m.csv)
            .map(|(m, v)| match v {
                Some(v) if m.unit.is_count() => (*v as u64).to_string(),
                Some(v) => v.to_string(),
                None => String::new(),
            })
            .collect()
    }
}

/// A catalog value as JSON: counts as integers, the rest as numbers, missing as `null`.
struct JsonValue(Option<f64>, bool);

impl Serialize for JsonValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            JsonValue(Some(v), true) => s.serialize_u64(*v as u64),
            JsonValue(Some(v), false) => s.serialize_f64(*v),
            JsonValue(None, _) => s.serialize_none(),
        }
    }
}

/// The entries of one nested object (`ttft_s`: mean, p50, …).
struct Group(Vec<(&'static str, JsonValue)>);

impl Serialize for Group {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl Serialize for RunSummary {
    /// `policy`, then every catalog metric at its [`JsonKey`], in catalog order.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("policy", &self.policy)?;
        let mut group: Option<(&'static str, Group)> = None;
        for (m, v) in CATALOG.iter().zip(&self.values) {
            let value = JsonValue(*v, m.unit.is_count());
            let open = match &group {
                Some((g, _)) => matches!(m.json, JsonKey::Nested(n, _) if n == *g),
                None => false,
            };
            if !open && let Some((g, entries)) = group.take() {
                map.serialize_entry(g, &entries)?;
            }
            match m.json {
                JsonKey::Top(k) => map.serialize_entry(k, &value)?,
                JsonKey::Nested(g, k) => group
                    .get_or_insert_with(|| (g, Group(Vec::new())))
                    .1
                    .0
                    .push((k, value)),
                JsonKey::Absent => {}
            }
        }
        if let Some((g, entries)) = group {
            map.serialize_entry(g, &entries)?;
        }
        map.end()
    }
}

/// Column names of the per-run CSVs (the catalog's CSV metrics, in catalog order).
pub(crate) fn summary_csv_header() -> Vec<&'static str> {
    CATALOG.iter().filter(|m| m.csv).map(|m| m.name).collect()
}

/// One worker's totals in a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerSummary {
    /// Worker name.
    pub id: String,
    /// Customer requests dispatched to it (retries count again).
    pub requests: u64,
    /// Its fraction of all dispatches of the run.
    pub share: Option<f64>,
    /// Completed on it.
    pub completed: u64,
    /// Failed on it.
    pub failed: u64,
    /// Customer output tokens completed on it.
    pub output_tokens: u64,
    /// Weight at the end of the run.
    pub weight: Option<f64>,
    /// Where that weight came from (`default`, `table`, `measured`, `pinned`, `oracle`).
    pub provenance: String,
    /// Probe bursts it served.
    pub probe_bursts: u64,
}

impl WorkerSummary {
    /// The per-worker rows of a run, in fleet order.
    pub fn from_metrics(m: &RunMetrics) -> Vec<WorkerSummary> {
        m.workers
            .iter()
            .enumerate()
            .map(|(i, w)| WorkerSummary {
                id: w.name.clone(),
                requests: w.requests,
                share: share(m, i).and_then(r6),
                completed: w.completed,
                failed: w.failed,
                output_tokens: w.output_tokens,
                weight: r6(w.final_weight),
                provenance: w.final_provenance.as_str().to_string(),
                probe_bursts: w.probe_bursts,
            })
            .collect()
    }
}

/// One gateway replica of a run with several, in `summary.json`'s `replicas` list: its index,
/// then each [`REPLICA_METRICS`] value under its catalog name (counts as integers, missing as
/// `null`).
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaSummary {
    /// Replica index (0-based, as the balancer numbers them).
    pub replica: usize,
    /// Indexed like [`REPLICA_METRICS`].
    values: Vec<Option<f64>>,
}

impl ReplicaSummary {
    /// The per-replica entries of a run (empty with one gateway).
    pub fn from_metrics(m: &RunMetrics) -> Vec<ReplicaSummary> {
        m.replicas
            .iter()
            .enumerate()
            .map(|(replica, r)| ReplicaSummary {
                replica,
                values: REPLICA_METRICS.iter().map(|x| x.reported(r)).collect(),
            })
            .collect()
    }

    /// The value of a per-replica metric by its catalog name.
    pub fn get(&self, name: &str) -> Option<f64> {
        let i = REPLICA_METRICS.iter().position(|x| x.name == name)?;
        self.values[i]
    }
}

impl Serialize for ReplicaSummary {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(REPLICA_METRICS.len() + 1))?;
        map.serialize_entry("replica", &self.replica)?;
        for (x, v) in REPLICA_METRICS.iter().zip(&self.values) {
            map.serialize_entry(x.name, &JsonValue(*v, x.metric().unit.is_count()))?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metric::view;
    use routelab_sim::WorkerTotals;

    #[test]
    fn a_run_without_completions_writes_nulls_not_zeros() {
        let mut m = RunMetrics::new("p", vec![WorkerTotals::new("a")]);
        m.requests = 3;
        let s = RunSummary::from_metrics(&m);
        assert_eq!(s.get(view("e2e_mean_s")), None);
        assert_eq!(s.get(view("requests")), Some(3.0));
        let json = serde_json::to_string(&s).unwrap();
        assert!(
            json.starts_with(r#"{"policy":"p","requests":3,"completed":0,"#),
            "{json}"
        );
        assert!(
            json.contains(
                r#""ttft_s":{"mean":null,"p50":null,"p90":null,"p99":null,"max":null},"e2e_s":"#
            ),
            "{json}"
        );
        assert!(json.contains(r#""output_tok_s":null"#), "{json}");
        assert!(
            json.ends_with(
                r#""slo_attainment":0.0,"request_throughput":null,"total_token_throughput":null,"goodput":null,"itl_s":{"mean":null,"p50":null,"p90":null,"p99":null},"weight_error":null,"weight_error_after_10m":null,"weight_error_at_oracle_concurrency":null,"weight_error_at_oracle_concurrency_after_10m":null,"overlap_regret_tokens":{"mean":null,"p99":null}}"#
            ),
            "{json}"
        );
        let csv = s.csv_fields();
        assert_eq!(csv.len(), summary_csv_header().len());
        assert_eq!(&csv[..3], ["3", "0", "0"]);
        assert_eq!(csv[5], "", "missing TTFT mean is an empty cell");
    }

    #[test]
    fn replicas_are_listed_only_with_several_and_read_like_the_catalog() {
        let mut m = RunMetrics::new("p", vec![WorkerTotals::new("a")]);
        assert!(ReplicaSummary::from_metrics(&m).is_empty());
        m.replicas = vec![routelab_sim::ReplicaTotals::default(); 2];
        m.replicas[1].routed = 4;
        m.replicas[1].completed = 1;
        m.replicas[1].e2e.record_secs(2.0);
        m.e2e.record_secs(2.0);
        let rows = ReplicaSummary::from_metrics(&m);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1].get("requests"), Some(4.0));
        assert_eq!(rows[1].get("ttft_mean_s"), None, "missing is null, not 0");
        // The same histogram reads the same through the catalog and per replica.
        assert_eq!(
            rows[1].get("e2e_mean_s"),
            RunSummary::from_metrics(&m).get(view("e2e_mean_s"))
        );
        let json = serde_json::to_string(&rows[1]).unwrap();
        assert!(
            json.starts_with(r#"{"replica":1,"requests":4,"completed":1,"weight_error":null,"#),
            "{json}"
        );
        assert!(json.contains(r#""e2e_mean_s":2.0"#), "{json}");
        assert_eq!(rows[0].get("requests"), Some(0.0));
    }

    #[test]
    fn values_are_rounded_and_settable() {
        let mut m = RunMetrics::new("p", vec![]);
        m.requests = 1;
        m.completed = 1;
        m.e2e.record_secs(1.5);
        let mut s = RunSummary::from_metrics(&m);
        assert_eq!(s.get(view("e2e_p50_s")), Some(1.5));
        s.set(view("e2e_p50_s"), Some(f64::NAN));
        assert_eq!(s.get(view("e2e_p50_s")), None);
        m.probe_gpu_s = 1.0 / 3.0;
        assert_eq!(
            RunSummary::from_metrics(&m).get(view("probe_gpu_s")),
            Some(0.333333)
        );
    }
}
