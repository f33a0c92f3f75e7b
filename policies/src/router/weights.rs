//! Applying the weight strategy's weights and keeping each model's members, free counts and
//! load indexes in step with the fleet.

use super::*;

impl Router {
    /// Apply every worker's weight after a [`WeightChange::All`]: one pass over the strategy's
    /// weights (its slice when it keeps one), with work only for the workers whose weight moved
    /// (while a large fleet is first probed, each measurement moves its model's median and
    /// re-derives every weight; the unmeasured ones stay put). A moved weight sets its cap,
    /// updates its model's free count and marks its load index stale (rebuilt at the next
    /// query: cheaper than an update per worker when many moved); the other models' stay valid.
    pub(super) fn refresh_all_weights(&mut self) {
        let strategy = self.strategy.as_ref();
        let cap = self.config.cap;
        let models = &mut self.models;
        let mut apply = |h: &mut Hot, w: f64| {
            // An unmoved weight implies an unmoved cap (the one from before registration is
            // replaced right after it, by `refresh_weight`): nothing to write. The stored weight
            // is usable, so a strategy's value with its bits is too: compare before sanitizing.
            if w.to_bits() == h.weight.to_bits() {
                return;
            }
            let w = usable_weight(w);
            if w.to_bits() == h.weight.to_bits() {
                return;
            }
            let was_open = h.open();
            h.weight = w;
            h.cap = cap_of(cap, w);
            // Members are exactly the routable workers.
            if h.routable {
                let entry = &mut models[h.model as usize];
                match (was_open, h.open()) {
                    (true, false) => entry.free -= 1,
                    (false, true) => entry.free += 1,
                    _ => {}
                }
                entry.loads.invalidate();
            }
        };
        // `hot` and the fleet grow together: one entry per worker id
        for (h, w) in self
            .hot
            .iter_mut()
            .zip(strategy_weights(strategy, &self.fleet))
        {
            apply(h, w.value);
        }
    }

    pub(super) fn recount_free(&mut self, model: u32) {
        let entry = &mut self.models[model as usize];
        entry.free = entry
            .members
            .iter()
            .filter(|&&i| {
                let h = &self.hot[i as usize];
                h.in_flight < h.cap
            })
            .count() as u32;
    }

    /// A newly registered (routable) worker joins its model: inserted where the sorted rebuild
    /// would put it (after every member with a window at least as large, as the newest id), with
    /// the free count and largest window updated instead of recounted.
    pub(super) fn join_model(&mut self, model: ModelId, id: WorkerId, window: u32) {
        let entry = &mut self.models[model.0 as usize];
        let at = entry.windows.partition_point(|&w| w >= window);
        entry.members.insert(at, id.0);
        entry.windows.insert(at, window);
        entry.cursor = 0;
        entry.positions_stale = true;
        entry.largest_registered_window = entry.largest_registered_window.max(window);
        // Nothing in flight and no cap yet (`u32::MAX` until its weight is applied).
        if self.hot[id.index()].open() {
            entry.free += 1;
        }
        entry.loads.invalidate();
        entry.loads.reserve(entry.members.len());
    }

    pub(super) fn intern(&mut self, model: &str) -> ModelId {
        if let Some(id) = self.model_ids.get(model) {
            return *id;
        }
        let id = ModelId(self.models.len() as u32);
        self.models.push(ModelEntry {
            name: model.to_string(),
            ..ModelEntry::default()
        });
        self.model_ids.insert(model.to_string(), id);
        id
    }

    pub(super) fn rebuild_model(&mut self, model: ModelId) {
        let hot = &self.hot;
        let entry = &mut self.models[model.0 as usize];
        entry.members = (0..hot.len() as u32)
            .filter(|&i| hot[i as usize].model == model.0 && hot[i as usize].routable)
            .collect();
        entry
            .members
            .sort_by_key(|&i| (std::cmp::Reverse(hot[i as usize].context_window), i));
        entry.windows = entry
            .members
            .iter()
            .map(|&i| hot[i as usize].context_window)
            .collect();
        entry.cursor = 0;
        entry.positions_stale = true;
        entry.loads.invalidate();
        entry.loads.reserve(entry.members.len());
        entry.largest_registered_window = (0..hot.len())
            .filter(|&i| {
                hot[i].model == model.0 && self.fleet.workers[i].state != WorkerState::Removed
            })
            .map(|i| hot[i].context_window)
            .max()
            .unwrap_or(0);
        self.recount_free(model.0);
    }

    pub(super) fn check(&self, id: WorkerId) -> Result<(), AdminError> {
        match self.fleet.get(id) {
            Some(w) if w.state != WorkerState::Removed => Ok(()),
            _ => Err(AdminError::UnknownWorker(id)),
        }
    }

    pub(super) fn set_state(&mut self, id: WorkerId, state: WorkerState) -> Result<(), AdminError> {
        self.check(id)?;
        let info = &mut self.fleet.workers[id.index()];
        info.state = state;
        self.hot[id.index()].routable = state == WorkerState::Up;
        let model = info.model;
        self.rebuild_model(model);
        Ok(())
    }
}
