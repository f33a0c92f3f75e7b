//! The measured side of the probe strategy: each model's sorted throughputs, kept in step
//! per event, and the weights derived from them.

use super::{PinKey, ProbeConfig, ProbeWeights, WorkerProbe};
use crate::weights::{
    Clamp, WeightChange, ensure_slot, relative_to, sanitize, sorted_by_model, sorted_median,
};
use crate::worker::{Fleet, ModelId, Provenance, Weight, WorkerId};
use std::collections::HashMap;

impl ProbeWeights {
    /// What `id` should contribute to its model's sorted throughputs now.
    pub(super) fn membership(&self, fleet: &Fleet, id: WorkerId) -> Option<(ModelId, f64)> {
        let info = fleet.get(id)?;
        if !info.is_active() {
            return None;
        }
        let tp = self.workers.get(id.index()).and_then(|w| w.throughput)?;
        Some((info.model, sanitize(tp)))
    }

    pub(super) fn median_of(&self, model: ModelId) -> Option<f64> {
        self.measured
            .get(model.0 as usize)
            .and_then(|v| sorted_median(v, None))
    }

    /// Bring `id`'s entry in the sorted throughputs in step; the models whose list changed.
    pub(super) fn sync_member(&mut self, fleet: &Fleet, id: WorkerId) -> [Option<ModelId>; 2] {
        let want = self.membership(fleet, id);
        let slot = ensure_slot(&mut self.member, id);
        let had = *slot;
        if had.map(|(m, v)| (m, v.to_bits())) == want.map(|(m, v)| (m, v.to_bits())) {
            return [None, None];
        }
        *slot = want;
        if let Some((m, v)) = had {
            let list = &mut self.measured[m.0 as usize];
            let at = list.partition_point(|x| x.total_cmp(&v).is_lt());
            list.remove(at);
        }
        if let Some((m, v)) = want {
            let i = m.0 as usize;
            if self.measured.len() <= i {
                self.measured.resize_with(i + 1, Vec::new);
            }
            let list = &mut self.measured[i];
            let at = list.partition_point(|x| x.total_cmp(&v).is_le());
            list.insert(at, v);
        }
        [had.map(|(m, _)| m), want.map(|(m, _)| m)]
    }

    /// Rebuild the sorted throughputs of every worker from scratch.
    pub(super) fn sync_all(&mut self, fleet: &Fleet) {
        self.measured.clear();
        self.member.clear();
        for (id, _) in fleet.iter() {
            let want = self.membership(fleet, id);
            *ensure_slot(&mut self.member, id) = want;
            if let Some((m, v)) = want {
                let i = m.0 as usize;
                if self.measured.len() <= i {
                    self.measured.resize_with(i + 1, Vec::new);
                }
                self.measured[i].push(v);
            }
        }
        for v in &mut self.measured {
            v.sort_by(f64::total_cmp);
        }
    }

    /// An event changed only `id`'s state (and the fleet's record of it): if no model's median
    /// moved, only `id`'s weight can have changed.
    pub(super) fn update_one(&mut self, fleet: &Fleet, id: WorkerId) -> WeightChange {
        let before_models = self
            .member
            .get(id.index())
            .copied()
            .flatten()
            .map(|(m, _)| m);
        let after_model = self.membership(fleet, id).map(|(m, _)| m);
        let models = [before_models, after_model];
        let before = models.map(|m| m.map(|m| self.median_of(m)));
        self.sync_member(fleet, id);
        let after = models.map(|m| m.map(|m| self.median_of(m)));
        let bits = |x: [Option<Option<f64>>; 2]| x.map(|m| m.map(|o| o.map(f64::to_bits)));
        // A fleet grown by more than this worker has weights to derive beyond it.
        let grown = self.weights.len() < fleet.len()
            && !(self.weights.len() + 1 == fleet.len() && id.index() == self.weights.len());
        if bits(before) != bits(after) || grown {
            self.recompute(fleet);
            return WeightChange::All;
        }
        if fleet.len() <= 64 {
            // Debug builds, small fleets: the kept lists equal a rebuild (see `recompute`).
            debug_assert!(self.measured_check(fleet) <= self.measured.len());
        }
        if self.weights.len() < fleet.len() {
            self.weights.push(Weight::UNMEASURED);
        }
        let median = fleet.get(id).and_then(|info| self.median_of(info.model));
        let w = Self::weight_of(&self.config, &self.pins, &self.workers, median, fleet, id);
        if let Some(slot) = self.weights.get_mut(id.index()) {
            *slot = w;
        }
        WeightChange::One(id)
    }

    /// Re-derive every weight, in place. On a large fleet this runs at each measurement that
    /// moves a median (every one, while a fleet is first probed), so without pins it is one
    /// pass over flat arrays: the worker's model, its throughput, its model's median.
    pub(super) fn recompute(&mut self, fleet: &Fleet) {
        debug_assert_eq!(
            self.measured_check(fleet),
            self.measured.iter().filter(|v| !v.is_empty()).count(),
            "the sorted throughputs drifted from the fleet"
        );
        let n = fleet.len();
        // The fleet only grows (a removed worker keeps its id).
        if let Some(new) = fleet.workers.get(self.model_of.len()..) {
            self.model_of.extend(new.iter().map(|info| info.model));
        }
        self.weights.resize(n, Weight::UNMEASURED);
        self.medians.clear();
        self.medians
            .extend(self.measured.iter().map(|v| sorted_median(v, None)));
        if !self.pins.is_empty() {
            for (i, slot) in self.weights.iter_mut().enumerate() {
                let id = WorkerId(i as u32);
                let median = median_in(&self.medians, self.model_of[i]);
                *slot = Self::weight_of(&self.config, &self.pins, &self.workers, median, fleet, id);
            }
            return;
        }
        let clamp = self.config.clamp;
        let medians = &self.medians;
        let covered = self.workers.len().min(n);
        for ((slot, model), probe) in self
            .weights
            .iter_mut()
            .zip(&self.model_of)
            .zip(&self.workers)
        {
            *slot = match probe.throughput {
                Some(tp) => Self::measured_weight(tp, median_in(medians, *model), clamp),
                None => Weight::UNMEASURED,
            };
        }
        // Workers the strategy never heard of are unmeasured.
        for slot in &mut self.weights[covered..] {
            *slot = Weight::UNMEASURED;
        }
    }

    /// Debug builds: `measured` equals what `sorted_by_model` builds from scratch; the number of
    /// models with a measured worker.
    pub(super) fn measured_check(&self, fleet: &Fleet) -> usize {
        let fresh = sorted_by_model(fleet, |id| {
            self.workers.get(id.index()).and_then(|w| w.throughput)
        });
        for (m, v) in &fresh {
            let kept = self
                .measured
                .get(m.0 as usize)
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            assert!(
                kept.iter()
                    .map(|x| x.to_bits())
                    .eq(v.iter().map(|x| x.to_bits())),
                "model {m}: kept {kept:?}, fleet {v:?}"
            );
        }
        fresh.len()
    }

    /// `id`'s weight: its pin, else its throughput relative to `median` (its model's), else
    /// unmeasured.
    pub(super) fn weight_of(
        config: &ProbeConfig,
        pins: &HashMap<PinKey, f64>,
        workers: &[WorkerProbe],
        median: Option<f64>,
        fleet: &Fleet,
        id: WorkerId,
    ) -> Weight {
        if fleet.get(id).is_none() {
            return Weight::UNMEASURED;
        }
        // Pins are rare: skip building a key (two String clones) when there are none.
        let pinned = if pins.is_empty() {
            None
        } else {
            Self::pin_key(fleet, id).and_then(|k| pins.get(&k).copied())
        };
        if let Some(p) = pinned {
            Weight {
                value: config.clamp.apply(p),
                provenance: Provenance::Pinned,
            }
        } else if let Some(tp) = workers.get(id.index()).and_then(|w| w.throughput) {
            Self::measured_weight(tp, median, config.clamp)
        } else {
            Weight::UNMEASURED
        }
    }

    /// The weight of an unpinned worker measured at `tp` whose model's median is `median`.
    #[inline]
    pub(super) fn measured_weight(tp: f64, median: Option<f64>, clamp: Clamp) -> Weight {
        // An inactive worker's own figure is not among its model's; with no other measured
        // peer it is the median.
        Weight {
            value: relative_to(tp, median.or(Some(tp)), clamp),
            provenance: Provenance::Measured,
        }
    }

    /// Rebuild the sorted throughputs and every weight.
    pub(super) fn rebuild(&mut self, fleet: &Fleet) -> WeightChange {
        self.sync_all(fleet);
        self.recompute(fleet);
        WeightChange::All
    }
}

/// Model `model`'s entry of `medians` (by model index; `None` past its end).
#[inline]
fn median_in(medians: &[Option<f64>], model: ModelId) -> Option<f64> {
    medians.get(model.0 as usize).copied().flatten()
}
