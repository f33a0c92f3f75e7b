//! Decisions that explain themselves: which worker a decision chose, the runner-up, and the
//! scores the chooser compared them by, taken from the decision as it was made (not computed
//! again afterwards).
//!
//! A host asks for an explanation with [`Router::route_explained`](crate::Router); the plain
//! [`Router::route`](crate::Router) passes the choosers a no-op [`Observe`] (`()`), so a decision
//! nobody asked to explain costs what it did before. Recording needs no allocation: the
//! collector keeps the two best candidates by score (and, for `predictive`, by harm, its
//! criterion when it writes a request off), which is all an explanation reports.

use crate::predictive::Prediction;
use crate::worker::WorkerId;
use serde::Serialize;

/// Why a decision went where it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Reason {
    /// The prefix affinity kept the worker that holds the prompt's prefix.
    Affinity,
    /// The chooser compared the candidates' scores and took the lowest.
    #[default]
    Score,
    /// `predictive` predicted a miss on every candidate it scored and took the one that harms
    /// the other requests least (its write-off; the scores compared are then the harms).
    WriteOff,
    /// The chooser compared no scores: one open candidate, or a chooser that ignores load
    /// (`random`, `round-robin`, `wrr`) or a field's rule whose scores are not reported.
    Unscored,
    /// Dispatched from the router's queue when a worker had room again.
    Queued,
}

impl Reason {
    /// Every reason, in a stable order (for a counter per reason).
    pub const ALL: [Reason; 5] = [
        Reason::Affinity,
        Reason::Score,
        Reason::WriteOff,
        Reason::Unscored,
        Reason::Queued,
    ];

    /// Its name in logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Affinity => "affinity",
            Reason::Score => "score",
            Reason::WriteOff => "write-off",
            Reason::Unscored => "unscored",
            Reason::Queued => "queued",
        }
    }
}

/// One candidate as the chooser scored it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scored {
    /// The worker.
    pub worker: WorkerId,
    /// The value the chooser compared (lower wins): the load score (`in_flight / weight` for
    /// `p2c` and `jsq`, `(in_flight + 1) / weight` for `sed`, …), `predictive`'s objective, or
    /// its harm to the others when [`Reason::WriteOff`].
    pub score: f64,
    /// `predictive`'s predictions for this request on this worker.
    pub predicted: Option<Predicted>,
}

/// What `predictive` predicted for a candidate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Predicted {
    /// Time to first token, seconds.
    pub ttft_s: f64,
    /// Time per output token, seconds.
    pub tpot_s: f64,
    /// The objective (lower wins).
    pub objective: f64,
    /// What choosing it costs the other requests, in the objective's units.
    pub harm: f64,
}

/// The explanation of one decision.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Explanation {
    /// Why.
    pub reason: Reason,
    /// The chosen worker (set once the decision is made).
    pub worker: Option<WorkerId>,
    /// The chosen worker's score, when the chooser compared scores ([`Reason::Score`],
    /// [`Reason::WriteOff`]).
    pub chosen: Option<Scored>,
    /// The best other candidate by the same criterion, if the chooser scored one.
    pub runner_up: Option<Scored>,
    /// Scores the chooser compared (a candidate drawn twice by a sampling chooser may count
    /// twice).
    pub scored: u32,
    by_score: Best2,
    by_harm: Best2,
    feasible: bool,
}

/// The two best distinct candidates offered, by a value (lower wins; the first at a value
/// stays ahead of later ones at the same value, as the choosers keep them).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Best2([Option<(Scored, f64)>; 2]);

impl Best2 {
    /// Offer a candidate; false if it was already offered (a chooser may draw one twice).
    fn offer(&mut self, entry: Scored, value: f64) -> bool {
        if self
            .0
            .iter()
            .flatten()
            .any(|(s, _)| s.worker == entry.worker)
        {
            return false;
        }
        match self.0 {
            [None, _] => self.0[0] = Some((entry, value)),
            [Some((_, v0)), _] if value < v0 => {
                self.0[1] = self.0[0];
                self.0[0] = Some((entry, value));
            }
            [_, None] => self.0[1] = Some((entry, value)),
            [_, Some((_, v1))] if value < v1 => self.0[1] = Some((entry, value)),
            _ => {}
        }
        true
    }
}

/// What a chooser reports of the candidates it scores. `()` records nothing (every call
/// compiles away); [`Explanation`] records.
pub(crate) trait Observe {
    /// Candidate `worker` scored `score` (a `predictive` candidate also its prediction).
    fn scored(&mut self, worker: u32, score: f64, prediction: Option<&Prediction>);
}

impl Observe for () {
    #[inline(always)]
    fn scored(&mut self, _: u32, _: f64, _: Option<&Prediction>) {}
}

impl Observe for Explanation {
    fn scored(&mut self, worker: u32, score: f64, prediction: Option<&Prediction>) {
        let entry = Scored {
            worker: WorkerId(worker),
            score,
            predicted: prediction.map(|p| Predicted {
                ttft_s: p.ttft_s,
                tpot_s: p.tpot_s,
                objective: p.score,
                harm: p.harm,
            }),
        };
        // A candidate scored again scored the same (nothing changes during a decision): it
        // is counted once.
        let offered = prediction.map_or(score, |p| p.harm);
        if self.by_score.offer(entry, score) {
            self.scored += 1;
        }
        if let Some(p) = prediction {
            self.feasible |= !p.own_miss;
            self.by_harm.offer(entry, offered);
        }
    }
}

impl Explanation {
    /// A fresh explanation to hand to [`Router::route_explained`](crate::Router).
    pub fn new() -> Explanation {
        Explanation::default()
    }

    /// An explanation of a request dispatched from the router's queue to `worker`.
    pub fn queued(worker: WorkerId) -> Explanation {
        Explanation {
            reason: Reason::Queued,
            worker: Some(worker),
            ..Explanation::default()
        }
    }

    /// Settle the explanation of a decision for `worker` (`affinity`: the prefix holder was
    /// kept). The chooser's comparison was recorded as it ran; with `predictive`, a decision
    /// where no scored candidate was predicted to meet the bounds compared harms.
    pub(crate) fn finish(&mut self, worker: WorkerId, affinity: bool) {
        self.worker = Some(worker);
        let predictive = self.by_harm.0[0].is_some();
        self.reason = if affinity {
            Reason::Affinity
        } else if self.scored == 0 {
            Reason::Unscored
        } else if predictive && !self.feasible {
            Reason::WriteOff
        } else {
            Reason::Score
        };
        let list = match self.reason {
            Reason::Score => self.by_score,
            Reason::WriteOff => self.by_harm,
            _ => {
                self.chosen = None;
                self.runner_up = None;
                return;
            }
        };
        let at = |slot: Option<(Scored, f64)>| slot.map(|(s, v)| Scored { score: v, ..s });
        let (first, second) = (at(list.0[0]), at(list.0[1]));
        // The chosen is the first candidate at the lowest value, as every chooser keeps it,
        // unless a tie rule took another one at that value.
        (self.chosen, self.runner_up) = match (first, second) {
            (Some(f), s) if f.worker == worker => (Some(f), s),
            (f, Some(s)) if s.worker == worker => (Some(s), f),
            (Some(f), _) => (Some(Scored { worker, ..f }), Some(f)),
            (None, s) => (None, s),
        };
    }
}

/// A decision as its hosts show it: the gateway's request log and `x-routelab-decision` header,
/// the simulator's decisions to a [`RequestSink`](../../routelab_sim/trait.RequestSink.html)
/// that asks for them. Workers by name; one shape for both, so that a decision logged by the
/// gateway and one written by the simulator read alike.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShownDecision {
    /// `affinity`, `score`, `write-off`, `unscored` or `queued` ([`Reason`]).
    pub reason: &'static str,
    /// The chosen worker and its score (no score unless the reason is `score` or `write-off`).
    pub chosen: ShownCandidate,
    /// The best other candidate the chooser compared, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runner_up: Option<ShownCandidate>,
}

/// One candidate of a [`ShownDecision`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShownCandidate {
    /// The worker's name.
    pub worker: String,
    /// The value compared (lower wins): the load score, `predictive`'s objective, or its harm
    /// to the others for a write-off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// `predictive`'s predicted time to first token there, milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_ttft_ms: Option<f64>,
    /// `predictive`'s predicted time per output token there, milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_tpot_ms: Option<f64>,
}

impl ShownCandidate {
    /// `s` (or, with no score, just `worker`) under `name`.
    pub fn new(name: String, s: Option<&Scored>) -> ShownCandidate {
        let p = s.and_then(|s| s.predicted);
        ShownCandidate {
            worker: name,
            score: s.map(|s| s.score),
            predicted_ttft_ms: p.map(|p| p.ttft_s * 1e3),
            predicted_tpot_ms: p.map(|p| p.tpot_s * 1e3),
        }
    }
}

impl ShownDecision {
    /// `why` with the workers named by `name`; `None` before a worker was chosen.
    pub fn of(why: &Explanation, name: impl Fn(WorkerId) -> String) -> Option<ShownDecision> {
        let worker = why.worker?;
        Some(ShownDecision {
            reason: why.reason.as_str(),
            chosen: ShownCandidate::new(name(worker), why.chosen.as_ref()),
            runner_up: why
                .runner_up
                .as_ref()
                .map(|r| ShownCandidate::new(name(r.worker), Some(r))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(b: &mut Best2, w: u32, v: f64) -> bool {
        b.offer(
            Scored {
                worker: WorkerId(w),
                score: v,
                predicted: None,
            },
            v,
        )
    }

    #[test]
    fn best2_keeps_the_two_lowest_distinct_first_at_a_tie() {
        let mut b = Best2::default();
        assert!(offer(&mut b, 1, 3.0));
        assert!(offer(&mut b, 2, 2.0));
        assert!(offer(&mut b, 3, 2.0));
        assert!(!offer(&mut b, 2, 2.0), "a repeat is not counted");
        assert!(offer(&mut b, 4, 5.0));
        let workers: Vec<u32> = b.0.iter().flatten().map(|(s, _)| s.worker.0).collect();
        assert_eq!(workers, vec![2, 3]);
        assert!(offer(&mut b, 5, 1.0));
        let workers: Vec<u32> = b.0.iter().flatten().map(|(s, _)| s.worker.0).collect();
        assert_eq!(workers, vec![5, 2]);
    }

    #[test]
    fn a_tie_rule_that_took_the_second_swaps_chosen_and_runner_up() {
        let mut e = Explanation::new();
        e.scored(7, 1.0, None);
        e.scored(9, 1.0, None);
        e.finish(WorkerId(9), false);
        assert_eq!(e.reason, Reason::Score);
        assert_eq!(e.chosen.map(|s| s.worker), Some(WorkerId(9)));
        assert_eq!(e.runner_up.map(|s| s.worker), Some(WorkerId(7)));
        let mut e = Explanation::new();
        e.finish(WorkerId(3), false);
        assert_eq!(
            (e.reason, e.worker, e.chosen),
            (Reason::Unscored, Some(WorkerId(3)), None)
        );
    }
}
