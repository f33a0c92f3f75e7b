//! The probing side of the strategy: which bursts fall due, and what their results change.

use super::{Cached, Pending, ProbeWeights};
use crate::time::Time;
use crate::weights::{ProbeOrder, ProbePhase, ProbeResult};
use crate::worker::{Fleet, WorkerId};

impl ProbeWeights {
    /// Visit the whole fleet in id order: periodic re-measurements fall due, due probes go out.
    pub(super) fn poll_scan(&mut self, now: Time, fleet: &Fleet, out: &mut Vec<ProbeOrder>) {
        for (id, info) in fleet.iter() {
            if !info.is_active() {
                continue;
            }
            let Some(slot) = self.workers.get_mut(id.index()) else {
                continue;
            };
            // The periodic re-measurement never competes with a customer.
            if slot.pending == Pending::Nothing
                && slot.throughput.is_some()
                && info.in_flight == 0
                && now.saturating_since(slot.measured_at) >= self.config.reprobe_period
            {
                slot.pending = Pending::Due { warmed: false };
                slot.not_before = now;
            }
            self.issue_if_due(now, id, out);
        }
    }

    /// Send `id`'s probe if one is due and its retry time has come.
    pub(super) fn issue_if_due(&mut self, now: Time, id: WorkerId, out: &mut Vec<ProbeOrder>) {
        let Some(slot) = self.workers.get_mut(id.index()) else {
            return;
        };
        if now < slot.not_before {
            return;
        }
        let (phase, concurrency, output_tokens, prompt_tokens) = match slot.pending {
            Pending::Due { warmed } => (
                if self.config.warmup && !warmed {
                    ProbePhase::Warmup
                } else {
                    ProbePhase::Measure
                },
                self.config.concurrency,
                self.config.output_tokens,
                self.config.prompt_tokens,
            ),
            Pending::PrefillDue => match self.config.prefill {
                Some(p) => (ProbePhase::Prefill, p.requests, 1, slot.prefill_prompt),
                None => return,
            },
            Pending::Nothing | Pending::Out { .. } => return,
        };
        let order = self.next_order;
        self.next_order += 1;
        slot.pending = Pending::Out { order, phase };
        out.push(ProbeOrder {
            id: order,
            worker: id,
            phase,
            concurrency,
            output_tokens,
            prompt_tokens,
        });
    }

    pub(super) fn on_result(&mut self, now: Time, fleet: &Fleet, r: &ProbeResult) -> bool {
        let Some(slot) = self.workers.get_mut(r.worker.index()) else {
            return false;
        };
        let Pending::Out { order, phase } = slot.pending else {
            return false;
        };
        if order != r.order {
            return false;
        }
        if phase == ProbePhase::Prefill {
            self.on_prefill_result(now, fleet, r);
            return false;
        }
        // A burst with no tokens or no wall time measured nothing (its throughput is reported
        // as zero): retry it like a failure rather than caching "measured at 0 tok/s".
        if !r.ok || r.throughput_tok_s() <= 0.0 {
            slot.pending = Pending::Due { warmed: false };
            slot.not_before = now + self.config.retry_after;
            self.due.insert(r.worker.0);
            return false;
        }
        match phase {
            ProbePhase::Warmup => {
                slot.pending = Pending::Due { warmed: true };
                self.due.insert(r.worker.0);
                false
            }
            ProbePhase::Measure => {
                let tp = r.throughput_tok_s();
                slot.throughput = Some(tp);
                slot.measured_at = now;
                slot.pending = Pending::Nothing;
                // A new throughput starts a new measurement: the prefill speed is taken again.
                slot.prefill_tok_s = None;
                if self.config.prefill.is_some() {
                    slot.pending = Pending::PrefillDue;
                    slot.not_before = now;
                    self.due.insert(r.worker.0);
                }
                self.note_measured(now);
                if let Some(k) = Self::cache_key(fleet, r.worker) {
                    self.cache.insert(
                        k,
                        Cached {
                            throughput: tp,
                            prefill_tok_s: None,
                            at: now,
                        },
                    );
                }
                true
            }
            // Handled above.
            ProbePhase::Prefill => false,
        }
    }

    /// A prefill-bound burst ended: its prompt tokens over its wall time are the worker's
    /// prefill speed (kept beside the throughput in the cache). A failed or empty burst is
    /// retried after `retry_after`; the weight never depends on it.
    pub(super) fn on_prefill_result(&mut self, now: Time, fleet: &Fleet, r: &ProbeResult) {
        let Some(slot) = self.workers.get_mut(r.worker.index()) else {
            return;
        };
        let speed = r.prefill_tok_s();
        if speed <= 0.0 {
            slot.pending = Pending::PrefillDue;
            slot.not_before = now + self.config.retry_after;
            self.due.insert(r.worker.0);
            return;
        }
        slot.prefill_tok_s = Some(speed);
        slot.pending = Pending::Nothing;
        if let Some(c) = Self::cache_key(fleet, r.worker).and_then(|k| self.cache.get_mut(&k)) {
            c.prefill_tok_s = Some(speed);
        }
    }
}
