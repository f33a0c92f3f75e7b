//! `predictive`'s measurement of each worker's capacity, and the SLO it aims at: what a
//! dispatch notes for the completion to be measured against, and the measurement itself (both
//! kept out of line so the other policies' request path stays as short as it was).

use super::{Decision, Router};
use crate::capacity::{Capacities, Sample};
use crate::chooser::Chooser;
use crate::signals::Charge;
use crate::weights::Completion;
use crate::worker::WorkerId;

impl Router {
    /// The SLO the host holds the fleet to (seconds): a `predictive` chooser whose own bounds
    /// are not set aims at these. Other choosers ignore it.
    pub fn aim_at(&mut self, ttft_s: f64, tpot_s: f64) {
        if let Chooser::Predictive(p) = &mut self.config.chooser {
            let valid = |x: f64| (x.is_finite() && x > 0.0).then_some(x);
            p.ttft_s = p.ttft_s.or(valid(ttft_s));
            p.tpot_s = p.tpot_s.or(valid(tpot_s));
        }
    }

    /// The measured capacities (`predictive`'s knowledge; empty for other choosers).
    pub fn capacity(&self) -> &Capacities {
        &self.capacity
    }

    /// `predictive`'s measurement of a completion (kept out of line: the other policies'
    /// completion path stays as short as it was).
    #[inline(never)]
    pub(super) fn learn_capacity(&mut self, id: WorkerId, charge: Charge, completion: &Completion) {
        // Not a request this router has in flight (a charge handed back twice, an unknown id).
        if self
            .fleet
            .workers
            .get(id.index())
            .is_none_or(|w| w.in_flight == 0)
        {
            return;
        }
        let sample = self.capacity_sample(id, charge);
        self.capacity.learn(id.index(), completion, sample);
    }

    /// What a completion on `id` charged with `charge` is measured against: the worker's
    /// weight and round trip, the prefill it waited for, and the requests it shared the worker
    /// with (its dispatch count and the count now, itself still in, averaged).
    pub(super) fn capacity_sample(&self, id: WorkerId, charge: Charge) -> Sample {
        let h = &self.hot[id.index()];
        Sample {
            weight: h.weight,
            round_trip_s: self.signals[id.index()].round_trip_s.unwrap_or(0.0),
            prefill_tokens: charge.prefill_at_dispatch,
            sharing: (f64::from(charge.sharing_at_dispatch) + f64::from(h.in_flight)) / 2.0,
        }
    }

    /// What a completion will be measured against (`predictive`): the uncached tokens it
    /// waits for (those already waiting, and its own) and the requests it shares the worker
    /// with. Out of line. With a future term on, the arrival is noted in its model's
    /// [`Foresight`](crate::foresight::Foresight) too.
    #[inline(never)]
    pub(super) fn note_dispatch(&mut self, d: &mut Decision) {
        let id = d.worker;
        // Only a `predictive` that prices the requests to come reads what they will be.
        if let Chooser::Predictive(p) = &self.config.chooser
            && (p.reserve > 0.0 || p.evict > 0.0)
        {
            let cached = d.charge.tokens - d.charge.uncached.min(d.charge.tokens);
            self.foresee(id, d.charge.tokens, cached);
        }
        let s = &self.signals[id.index()];
        d.charge.prefill_at_dispatch =
            u32::try_from(s.uncached_in_flight + u64::from(d.charge.uncached)).unwrap_or(u32::MAX);
        d.charge.sharing_at_dispatch = self.hot[id.index()].in_flight.saturating_add(1);
    }

    /// Note an arrival of `prompt_tokens` (`cached` believed cached) routed to `id` in its
    /// model's foresight, refreshing the window levels' capacity shares when due.
    fn foresee(&mut self, id: WorkerId, prompt_tokens: u32, cached: u32) {
        let model = self.hot[id.index()].model as usize;
        let members = self.models.get(model).map_or(0, |e| e.members.len());
        if self.capacity.foresight_mut(model).due(members)
            && let Some(entry) = self.models.get(model)
        {
            // Taken out and put back (no allocation) while the members' speeds are read.
            let mut f = std::mem::take(self.capacity.foresight_mut(model));
            let (hot, capacity) = (&self.hot, &self.capacity);
            f.refresh(entry.members.iter().map(|&i| {
                let h = &hot[i as usize];
                (
                    h.context_window,
                    capacity.estimate(i as usize, h.weight).prefill_tok_s,
                )
            }));
            *self.capacity.foresight_mut(model) = f;
        }
        self.capacity
            .foresight_mut(model)
            .observe(prompt_tokens, prompt_tokens, cached);
    }
}
