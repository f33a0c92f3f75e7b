//! Weight strategies that need no measurement: `table` (v1), `equal`, `oracle`.

use super::{
    Clamp, WeightChange, WeightEvent, WeightStrategy, ensure_slot, relative_to, sanitize,
    sorted_by_model, sorted_median,
};
use crate::time::Time;
use crate::worker::{Fleet, Provenance, Weight, WorkerId};

/// The GPU-name table of the source's first router (v1).
#[derive(Debug, Clone, PartialEq)]
pub struct TableConfig {
    /// (GPU name, weight of one card). Matching ignores case, spaces and punctuation, and a
    /// table name contained in the reported name matches (longest entry wins), so
    /// "NVIDIA GeForce RTX 4090" matches "RTX 4090".
    pub entries: Vec<(String, f64)>,
    /// Weight of a card the table does not know.
    pub unknown: f64,
}

impl Default for TableConfig {
    /// The source's figures: RTX 4090 1.75, RTX 5090 2.5, H100 3.5, unknown 1.0.
    fn default() -> Self {
        TableConfig {
            entries: vec![
                ("RTX 4090".into(), 1.75),
                ("RTX 5090".into(), 2.5),
                ("H100".into(), 3.5),
            ],
            unknown: 1.0,
        }
    }
}

fn normalise(name: &str) -> String {
    name.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

impl TableConfig {
    /// Weight of one card, or `None` if the table does not know it.
    pub fn card(&self, gpu: &str) -> Option<f64> {
        let gpu = normalise(gpu);
        self.entries
            .iter()
            .map(|(name, w)| (normalise(name), *w))
            .filter(|(name, _)| !name.is_empty() && gpu.contains(name.as_str()))
            .max_by_key(|(name, _)| name.len())
            .map(|(_, w)| w)
    }

    /// Weight of a worker: the sum over its cards; `Default` provenance when no card is known.
    pub fn worker(&self, gpus: &[String]) -> Weight {
        let mut known = false;
        let mut sum = 0.0;
        for gpu in gpus {
            match self.card(gpu) {
                Some(w) => {
                    known = true;
                    sum += w;
                }
                None => sum += self.unknown,
            }
        }
        let value = sanitize(sum);
        if !known || value <= 0.0 {
            Weight {
                value: if value > 0.0 { value } else { self.unknown },
                provenance: Provenance::Default,
            }
        } else {
            Weight {
                value,
                provenance: Provenance::Table,
            }
        }
    }

    /// The first card's figure: the starting point the source's live correction used (its bug).
    pub fn first_card(&self, gpus: &[String]) -> f64 {
        gpus.first()
            .and_then(|g| self.card(g))
            .unwrap_or(self.unknown)
    }
}

/// v1: weight from the GPU-name table, never measured.
#[derive(Debug, Clone)]
pub struct TableWeights {
    table: TableConfig,
    cache: Vec<Weight>,
}

impl TableWeights {
    /// A table strategy.
    pub fn new(table: TableConfig) -> Self {
        TableWeights {
            table,
            cache: Vec::new(),
        }
    }
}

impl WeightStrategy for TableWeights {
    fn name(&self) -> &'static str {
        "table"
    }

    fn observe(&mut self, _now: Time, event: WeightEvent<'_>, fleet: &Fleet) -> WeightChange {
        match event {
            WeightEvent::Registered(id) | WeightEvent::Restarted { worker: id, .. } => {
                if let Some(info) = fleet.get(id) {
                    *ensure_slot(&mut self.cache, id) = self.table.worker(&info.spec.gpu_names);
                }
                WeightChange::One(id)
            }
            _ => WeightChange::None,
        }
    }

    fn weight(&self, worker: WorkerId, _fleet: &Fleet) -> Weight {
        self.cache
            .get(worker.index())
            .copied()
            .unwrap_or(Weight::UNMEASURED)
    }

    /// The table reads the workers' cards only.
    fn observes_requests(&self) -> bool {
        false
    }
}

/// Every worker weighs 1.0: plain load balancing by in-flight count.
#[derive(Debug, Clone, Default)]
pub struct EqualWeights;

impl WeightStrategy for EqualWeights {
    fn name(&self) -> &'static str {
        "equal"
    }

    fn observe(&mut self, _now: Time, _event: WeightEvent<'_>, _fleet: &Fleet) -> WeightChange {
        WeightChange::None
    }

    fn weight(&self, _worker: WorkerId, _fleet: &Fleet) -> Weight {
        Weight::UNMEASURED
    }

    fn observes_requests(&self) -> bool {
        false
    }
}

/// Lab only: weight from the true capacity the simulator knows, relative to the median of the
/// same model's active workers, clamped. The best any estimator could do.
#[derive(Debug, Clone)]
pub struct OracleWeights {
    clamp: Clamp,
    capacity: Vec<f64>,
    weights: Vec<Weight>,
}

impl OracleWeights {
    /// An oracle strategy with the given clamp.
    pub fn new(clamp: Clamp) -> Self {
        OracleWeights {
            clamp,
            capacity: Vec::new(),
            weights: Vec::new(),
        }
    }

    fn recompute(&mut self, fleet: &Fleet) {
        self.weights = oracle_weights(fleet, &self.capacity, self.clamp);
    }
}

/// The oracle's rule, shared with hosts that measure how far a strategy is from it: each
/// worker's true capacity (`capacity[id]`, tokens/s; 0 or missing: unknown) relative to the
/// median of its model's active workers' known capacities, clamped. A worker of unknown
/// capacity gets the unmeasured placeholder; one that is not active is relative to its active
/// peers (or itself when there are none).
pub fn oracle_weights(fleet: &Fleet, capacity: &[f64], clamp: Clamp) -> Vec<Weight> {
    let capacity = |id: WorkerId| capacity.get(id.index()).copied().filter(|c| *c > 0.0);
    let known = sorted_by_model(fleet, capacity);
    fleet
        .iter()
        .map(|(id, info)| match capacity(id) {
            Some(cap) => Weight {
                value: relative_to(
                    cap,
                    known
                        .get(&info.model)
                        .and_then(|v| sorted_median(v, None))
                        .or(Some(cap)),
                    clamp,
                ),
                provenance: Provenance::Oracle,
            },
            None => Weight::UNMEASURED,
        })
        .collect()
}

impl WeightStrategy for OracleWeights {
    fn name(&self) -> &'static str {
        "oracle"
    }

    fn observe(&mut self, _now: Time, event: WeightEvent<'_>, fleet: &Fleet) -> WeightChange {
        match event {
            WeightEvent::TrueCapacity(id, cap) => {
                *ensure_slot(&mut self.capacity, id) = sanitize(cap);
            }
            WeightEvent::Registered(_)
            | WeightEvent::Disconnected(_)
            | WeightEvent::Reconnected(_)
            | WeightEvent::Restarted { .. }
            | WeightEvent::Removed(_) => {}
            _ => return WeightChange::None,
        }
        self.recompute(fleet);
        WeightChange::All
    }

    fn weight(&self, worker: WorkerId, _fleet: &Fleet) -> Weight {
        self.weights
            .get(worker.index())
            .copied()
            .unwrap_or(Weight::UNMEASURED)
    }

    fn weights(&self) -> Option<&[Weight]> {
        Some(&self.weights)
    }

    /// The oracle reads true capacities and the fleet's membership only.
    fn observes_requests(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_sums_cards_and_defaults_unknown() {
        let t = TableConfig::default();
        let pair = t.worker(&["NVIDIA GeForce RTX 4090".into(), "RTX 4090".into()]);
        assert_eq!(pair.value, 3.5);
        assert_eq!(pair.provenance, Provenance::Table);
        let pro = t.worker(&["NVIDIA RTX PRO 6000 Blackwell".into()]);
        assert_eq!(pro.value, 1.0);
        assert_eq!(pro.provenance, Provenance::Default);
        assert_eq!(t.first_card(&["RTX 4090".into(), "RTX 4090".into()]), 1.75);
        assert_eq!(t.worker(&["H100 80GB HBM3".into()]).value, 3.5);
    }
}
