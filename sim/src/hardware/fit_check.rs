//! How well a fitted profile fits, and `prefill_overlap` inferred from benchmark data.
//!
//! **The fit's own error.** [`simulate_closed_loop`] plays a benchmark's closed loop (C clients
//! without think time, fixed prompt and output lengths) on the simulator's engine with the
//! fitted profile, so `profile fit` can print, for every input point, the figure it measured
//! against the one the profile reproduces ([`PointError`]), and warn ([`FitWarning`]) where a
//! point was corrected by more than [`CORRECTION_WARN`], where the simulated point misses by
//! more than [`SIMULATED_ERROR_WARN`], where the KV size or `max_running` cannot hold what the
//! engine demonstrably held, and where a figure is implausible in its declared unit
//! ([`PREFILL_PER_DECODE_MAX`]: a TTFT in seconds read as milliseconds makes the prefill a
//! thousand times too fast).
//!
//! **The overlap from data.** A closed loop's output tok/s holds its prompts' prefill, and how
//! much of it hides beside the decodes is the overlap. Given the engine's pure-decode curve (a
//! sweep with nothing prefilling), each closed-loop row's decode aggregate after subtraction
//! ([`ClosedLoop::decode_aggregate`]) must equal the curve at its concurrency: the overlap is
//! the value that makes it so, in least squares of the log ratios over the rows
//! ([`infer_overlap`]). Without the sweep, rows at one concurrency with different prompt or
//! output lengths must give one decode aggregate: the overlap is the value that makes them
//! agree. Its uncertainty is the jackknife standard error over the rows.

use std::collections::HashMap;
use std::sync::Arc;

use super::HardwareProfile;
use super::fit::{ClosedLoop, StepModel};
use crate::worker::{Admission, Engine, EngineMode, EngineOutput, EngineOverrides};

/// A point the monotone fit moved by more than this share is warned about.
pub const CORRECTION_WARN: f64 = 0.25;
/// A benchmark the fitted profile reproduces worse than this share (simulated against
/// measured output tok/s) is warned about.
pub const SIMULATED_ERROR_WARN: f64 = 0.10;
/// A prefill speed more than this many times the single-sequence decode speed is implausible
/// (the bundled profiles sit at 10–90×; llama.cpp on a CPU at ~1.5×): most likely a TTFT in
/// seconds declared as milliseconds.
pub const PREFILL_PER_DECODE_MAX: f64 = 1000.0;
/// A prefill speed below this share of the single-sequence decode speed is implausible too
/// (prefill batches a prompt's tokens, decode runs one at a time): most likely a TTFT in
/// milliseconds declared as seconds, or a TTFT that holds a long queue.
pub const PREFILL_PER_DECODE_MIN: f64 = 0.5;
/// Closed-loop rounds simulated per client at most (a benchmark's own count when smaller).
pub const SIMULATED_ROUNDS_MAX: u32 = 50;

/// What the simulator's engine gives for one closed loop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimulatedLoop {
    /// Output tokens/s from the first request to the last completion.
    pub output_tok_s: f64,
    /// Mean time to first token, s.
    pub mean_ttft_s: f64,
    /// Mean end-to-end latency, s.
    pub mean_e2e_s: f64,
}

/// Plays `concurrency` clients, `rounds` requests each, of `prompt` prompt and `output`
/// output tokens, each client sending its next request when its last one completes, on one
/// engine of `mode` running `profile` (seed 1; the profile's noise is off unless it says so).
///
/// # Panics
/// If `concurrency`, `rounds` or `output` is 0.
pub fn simulate_closed_loop(
    mode: EngineMode,
    profile: &HardwareProfile,
    concurrency: u32,
    rounds: u32,
    prompt: u32,
    output: u32,
) -> SimulatedLoop {
    assert!(concurrency >= 1 && rounds >= 1 && output >= 1);
    let requests = concurrency * rounds;
    let mut e = Engine::new(
        mode,
        Arc::new(profile.clone()),
        EngineOverrides::default(),
        1,
    );
    let mut arrival: HashMap<u64, u64> = HashMap::new();
    for seq in 0..u64::from(concurrency) {
        e.admit(0, Admission::new(seq, prompt.max(1), output, &[]));
        arrival.insert(seq, 0);
    }
    let mut sent = concurrency;
    let (mut done, mut ttft_ns, mut e2e_ns, mut end) = (0u32, 0u128, 0u128, 0u64);
    let mut outs = Vec::new();
    while let Some(t) = e.next_event_time() {
        e.advance_to(t, &mut outs);
        for o in outs.drain(..) {
            if let EngineOutput::Completed(c) = o {
                done += 1;
                end = end.max(c.at);
                let at = arrival[&c.seq];
                ttft_ns += u128::from(c.first_token_at - at);
                e2e_ns += u128::from(c.at - at);
                if sent < requests {
                    let seq = u64::from(sent);
                    e.admit(t, Admission::new(seq, prompt.max(1), output, &[]));
                    arrival.insert(seq, t);
                    sent += 1;
                }
            }
        }
    }
    let n = f64::from(done.max(1));
    SimulatedLoop {
        output_tok_s: f64::from(done) * f64::from(output) / (end as f64 / 1e9),
        mean_ttft_s: ttft_ns as f64 / 1e9 / n,
        mean_e2e_s: e2e_ns as f64 / 1e9 / n,
    }
}

/// One input point: what was measured against what the fitted profile gives.
#[derive(Debug, Clone, PartialEq)]
pub struct PointError {
    /// The file (and row) it came from.
    pub source: String,
    /// Its concurrency.
    pub concurrency: f64,
    /// What the figure is: "closed-loop output tok/s" or "decode aggregate tok/s".
    pub what: &'static str,
    /// The measured figure.
    pub measured: f64,
    /// The fitted profile's figure (simulated for a closed loop, read off the curve for a
    /// pure-decode point).
    pub fitted: f64,
}

impl PointError {
    /// fitted / measured - 1.
    pub fn relative(&self) -> f64 {
        self.fitted / self.measured - 1.0
    }
}

/// `prefill_overlap` fitted from benchmark data.
#[derive(Debug, Clone, PartialEq)]
pub struct OverlapFit {
    /// The fitted value, in `[0, 1]`.
    pub value: f64,
    /// Jackknife standard error over the rows (`None` with one row; with two it is half their
    /// difference).
    pub std_error: Option<f64>,
    /// Each informative row's own overlap (the value that alone makes it agree), clamped to
    /// `[0, 1]`, with its concurrency.
    pub per_row: Vec<(f64, f64)>,
    /// What the rows were held against: "the pure-decode sweep" or "each other".
    pub against: &'static str,
}

/// One closed-loop row for the overlap: its loop, its weight, and what it is held against.
#[derive(Debug, Clone, Copy)]
pub struct OverlapRow {
    /// The benchmark.
    pub row: ClosedLoop,
    /// Its weight (the run's duration).
    pub weight: f64,
    /// The pure-decode aggregate at its concurrency, when a sweep gave one.
    pub reference: Option<f64>,
    /// Its group (rows of one concurrency) when there is no reference.
    pub group: usize,
}

fn aggregate_at(row: &ClosedLoop, model: &StepModel, overlap: f64) -> Option<f64> {
    let m = StepModel {
        prefill_overlap: overlap,
        ..*model
    };
    row.decode_aggregate(&m).ok()
}

/// The weighted sum of squared log errors of `rows` at `overlap`: against their references,
/// else against their group's weighted geometric mean.
fn misfit(rows: &[OverlapRow], model: &StepModel, overlap: f64) -> Option<f64> {
    let logs: Vec<f64> = rows
        .iter()
        .map(|r| aggregate_at(&r.row, model, overlap).map(f64::ln))
        .collect::<Option<_>>()?;
    let mut group_mean: HashMap<usize, (f64, f64)> = HashMap::new();
    for (r, l) in rows.iter().zip(&logs) {
        if r.reference.is_none() {
            let e = group_mean.entry(r.group).or_default();
            e.0 += r.weight * l;
            e.1 += r.weight;
        }
    }
    Some(
        rows.iter()
            .zip(&logs)
            .map(|(r, l)| {
                let target = match r.reference {
                    Some(a) => a.ln(),
                    None => {
                        let (s, w) = group_mean[&r.group];
                        s / w
                    }
                };
                r.weight * (l - target).powi(2)
            })
            .sum(),
    )
}

/// The overlap in `[0, 1]` that minimises [`misfit`]: a grid of 201 values, then golden
/// sections around the best.
fn minimise(rows: &[OverlapRow], model: &StepModel) -> Option<f64> {
    let f = |o: f64| misfit(rows, model, o).unwrap_or(f64::INFINITY);
    let (best, best_f, mid) = super::unit_search::minimise_on_unit(f, 200, 60)?;
    Some(if f(mid) <= best_f { mid } else { best })
}

/// Whether `rows` can say anything about the overlap: some row's decode aggregate moves by
/// more than 0.1 % between overlap 0 and 1 (a row whose prefill never runs beside a decode —
/// one client, or prompts bunched into prefill-only steps — cannot).
pub fn informative(row: &ClosedLoop, model: &StepModel) -> bool {
    match (aggregate_at(row, model, 0.0), aggregate_at(row, model, 1.0)) {
        (Some(a), Some(b)) => (a / b - 1.0).abs() > 1e-3,
        _ => false,
    }
}

/// `prefill_overlap` from closed-loop `rows` (each informative: see [`informative`]), with
/// its jackknife standard error; `None` when no value in `[0, 1]` gives every row a decode
/// aggregate, or when the rows hold too little to pin it (fewer than one row with a reference
/// and fewer than two in one group).
pub fn infer_overlap(rows: &[OverlapRow], model: &StepModel) -> Option<OverlapFit> {
    let with_reference = rows.iter().filter(|r| r.reference.is_some()).count();
    let mut groups: HashMap<usize, usize> = HashMap::new();
    for r in rows.iter().filter(|r| r.reference.is_none()) {
        *groups.entry(r.group).or_default() += 1;
    }
    let pairs = groups.values().filter(|&&n| n >= 2).count();
    if with_reference == 0 && pairs == 0 {
        return None;
    }
    // Rows alone in their group and without a reference say nothing: leave them out.
    let rows: Vec<OverlapRow> = rows
        .iter()
        .filter(|r| r.reference.is_some() || groups[&r.group] >= 2)
        .copied()
        .collect();
    let value = minimise(&rows, model)?;
    let per_row = rows
        .iter()
        .map(|r| {
            let own = match r.reference {
                Some(_) => minimise(std::slice::from_ref(r), model),
                None => {
                    let group: Vec<OverlapRow> = rows
                        .iter()
                        .filter(|o| o.reference.is_none() && o.group == r.group)
                        .copied()
                        .collect();
                    minimise(&group, model)
                }
            };
            (r.row.concurrency, own.unwrap_or(value))
        })
        .collect();
    let std_error = (rows.len() >= 2)
        .then(|| {
            let leave_out: Vec<f64> = (0..rows.len())
                .filter_map(|i| {
                    let rest: Vec<OverlapRow> = rows
                        .iter()
                        .enumerate()
                        .filter(|(j, _)| *j != i)
                        .map(|(_, r)| *r)
                        .collect();
                    minimise(&rest, model)
                })
                .collect();
            let n = leave_out.len() as f64;
            let mean = leave_out.iter().sum::<f64>() / n;
            ((n - 1.0) / n * leave_out.iter().map(|o| (o - mean).powi(2)).sum::<f64>()).sqrt()
        })
        .filter(|s| s.is_finite());
    Some(OverlapFit {
        value,
        std_error,
        per_row,
        against: if with_reference > 0 {
            "the pure-decode sweep"
        } else {
            "each other (rows of one concurrency with different lengths)"
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(overlap: f64) -> HardwareProfile {
        let yaml = format!(
            "name: t\ndecode:\n  points:\n    - {{ concurrency: 1, aggregate_tok_s: 50 }}\n    \
             - {{ concurrency: 8, aggregate_tok_s: 200 }}\nprefill_tok_s: 1000\n\
             prefill_overlap: {overlap}\nkv_capacity_tokens: 65536\nmax_running: 8\n\
             context_window: 8192\n"
        );
        HardwareProfile::from_yaml_str(&yaml, "test").unwrap()
    }

    #[test]
    fn a_closed_loop_of_one_client_is_prefill_then_decode() {
        // one client: each request is its prefill (100 / 1000 s) then 9 decode steps at 50
        // tok/s (0.02 s each): 0.28 s per request, 10 tokens
        let p = profile(0.4);
        let s = simulate_closed_loop(EngineMode::Fluid, &p, 1, 10, 100, 10);
        assert!((s.mean_e2e_s - 0.28).abs() < 0.01, "{s:?}");
        assert!((s.output_tok_s - 10.0 / 0.28).abs() < 1.0, "{s:?}");
        assert!((s.mean_ttft_s - 0.1).abs() < 0.01, "{s:?}");
    }

    #[test]
    fn rows_against_a_known_curve_give_back_the_overlap() {
        // closed loops whose decode aggregates, subtracted at overlap 0.3, equal the curve
        let model = StepModel {
            prefill_tok_s: 5000.0,
            prefill_chunk_tokens: 512,
            prefill_overlap: 0.0,
        };
        let truth = 0.3;
        let mut rows = Vec::new();
        for (c, x) in [(4.0, 120.0), (8.0, 150.0)] {
            let row = ClosedLoop {
                concurrency: c,
                output_tok_s: x,
                prompt_tokens: 400.0,
                output_tokens: 32.0,
            };
            assert!(informative(&row, &model));
            let reference = aggregate_at(&row, &model, truth).unwrap();
            rows.push(OverlapRow {
                row,
                weight: 1.0,
                reference: Some(reference),
                group: 0,
            });
        }
        let fit = infer_overlap(&rows, &model).unwrap();
        assert!((fit.value - truth).abs() < 1e-6, "{fit:?}");
        assert!(fit.per_row.iter().all(|(_, o)| (o - truth).abs() < 1e-6));
        // one client is never informative: nothing decodes beside its prefill
        let one = ClosedLoop {
            concurrency: 1.0,
            output_tok_s: 30.0,
            prompt_tokens: 400.0,
            output_tokens: 32.0,
        };
        assert!(!informative(&one, &model));
        // no reference and no second row in the group: nothing to pin it
        let lone = OverlapRow {
            reference: None,
            ..rows[0]
        };
        assert!(infer_overlap(&[lone], &model).is_none());
    }
}
