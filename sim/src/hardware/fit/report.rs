//! What the fit says about itself: every input point against the fitted profile, and the
//! warnings a careful reader needs ([`super::super::fit_check`]'s thresholds).

use super::super::HardwareProfile;
use super::super::fit_check::{
    CORRECTION_WARN, PREFILL_PER_DECODE_MAX, PREFILL_PER_DECODE_MIN, PointError,
    SIMULATED_ERROR_WARN, SIMULATED_ROUNDS_MAX, SimulatedLoop, simulate_closed_loop,
};
use super::{ClosedLoop, FitOptions, Measured, Obs, PointMove, round_to};

/// A closed-loop row as the benchmark ran it (its clients, rounds, prompt and output lengths),
/// played on the simulator's fluid engine with `profile`.
pub(super) fn play(profile: &HardwareProfile, p: &Obs, row: &ClosedLoop) -> SimulatedLoop {
    simulate_closed_loop(
        crate::worker::EngineMode::Fluid,
        profile,
        (row.concurrency.round() as u32).max(1),
        p.rounds.clamp(1, SIMULATED_ROUNDS_MAX),
        (row.prompt_tokens.round() as u32).max(1),
        (row.output_tokens.round() as u32).max(2),
    )
}

/// Every input point against the fitted profile: a closed loop simulated on the fluid engine
/// (unless the rows were declared pure decode), a pure-decode point read off the curve (at its
/// sequences' context, when the sweep row gives one: the decode step with its KV reads).
pub(super) fn point_errors(
    profile: &HardwareProfile,
    points: &[Obs],
    sweep: Option<&Measured>,
    pure_decode: bool,
) -> Vec<PointError> {
    let label = |p: &Obs| match p.at.line {
        Some(l) => format!("{}:{l}", p.at.file),
        None => p.at.file.clone(),
    };
    let decode_point = |p: &Obs| PointError {
        source: label(p),
        concurrency: p.concurrency,
        what: "decode aggregate tok/s",
        measured: p.aggregate_tok_s,
        fitted: match p.context_tokens {
            Some(c) => {
                let n = p.concurrency;
                n / profile.decode_step_time_s(n, n * c)
            }
            None => profile.aggregate_tok_s(p.concurrency),
        },
    };
    let mut out: Vec<PointError> = points
        .iter()
        .map(|p| match (&p.closed_loop, pure_decode) {
            (Some(row), false) => {
                let sim = play(profile, p, row);
                PointError {
                    source: label(p),
                    concurrency: p.concurrency,
                    what: "closed-loop output tok/s",
                    measured: row.output_tok_s,
                    fitted: sim.output_tok_s,
                }
            }
            _ => decode_point(p),
        })
        .collect();
    if let Some(sw) = sweep {
        out.extend(sw.points.iter().map(decode_point));
    }
    out
}

/// The warnings a careful reader needs, each with its threshold.
pub(super) fn warnings(
    profile: &HardwareProfile,
    points: &[Obs],
    moves: &[PointMove],
    errors: &[PointError],
    opts: &FitOptions,
) -> Vec<String> {
    let mut w = Vec::new();
    for (i, mv) in moves.iter().enumerate() {
        if mv.relative().abs() > CORRECTION_WARN {
            w.push(format!(
                "decode.points[{i}] (concurrency {}) was corrected by {:+.0} % ({} -> {} tok/s), \
                 more than {:.0} %: the measurement breaks the curve's rules (the aggregate may \
                 not fall as concurrency grows, nor the per-request speed rise); re-measure \
                 that concurrency or leave it out",
                mv.concurrency,
                mv.relative() * 100.0,
                round_to(mv.measured_tok_s, 1e3),
                mv.fitted_tok_s,
                CORRECTION_WARN * 100.0
            ));
        }
    }
    for e in errors {
        if e.relative().abs() > SIMULATED_ERROR_WARN {
            w.push(format!(
                "{} (concurrency {}): the fitted profile gives {:.2} {} where {:.2} was \
                 measured ({:+.1} %, more than {:.0} %)",
                e.source,
                e.concurrency,
                e.fitted,
                e.what,
                e.measured,
                e.relative() * 100.0,
                SIMULATED_ERROR_WARN * 100.0
            ));
        }
    }
    let held = points
        .iter()
        .filter_map(|p| p.closed_loop)
        .map(|r| {
            (
                r.concurrency,
                r.concurrency * (r.prompt_tokens + r.output_tokens),
            )
        })
        .fold(None::<(f64, f64)>, |m, x| match m {
            Some(m) if m.1 >= x.1 => Some(m),
            _ => Some(x),
        });
    if let Some((c, tokens)) = held
        && tokens > profile.kv_capacity_tokens() as f64
    {
        w.push(format!(
            "kv_capacity_tokens {} cannot hold the measured concurrency: {c} requests of \
             prompt + output tokens need {tokens:.0} tokens of KV at once, which the engine \
             held; pass the engine's KV size with --kv-capacity-tokens",
            profile.kv_capacity_tokens()
        ));
    }
    let top = points.iter().map(|p| p.concurrency).fold(0.0f64, f64::max);
    if top > f64::from(profile.max_running()) {
        w.push(format!(
            "max_running {} is below the measured concurrency {top}: the simulated engine \
             queues what the measured one ran at once; pass the engine's limit with \
             --max-running (llama.cpp --parallel, vLLM --max-num-seqs)",
            profile.max_running()
        ));
    }
    if opts.prefill_tok_s.is_none() {
        let ratio = profile.prefill_tok_s() / profile.aggregate_tok_s(1.0);
        if ratio > PREFILL_PER_DECODE_MAX {
            w.push(format!(
                "prefill_tok_s {} is {ratio:.0} x the single-sequence decode speed (more than \
                 {PREFILL_PER_DECODE_MAX:.0} x; the bundled profiles sit at 10-90 x): is the \
                 TTFT it was derived from (mean_ttft_ms) in seconds rather than milliseconds?",
                profile.prefill_tok_s()
            ));
        } else if ratio < PREFILL_PER_DECODE_MIN {
            w.push(format!(
                "prefill_tok_s {} is {ratio:.2} x the single-sequence decode speed (less than \
                 {PREFILL_PER_DECODE_MIN} x: prefill batches a prompt's tokens, decode runs one \
                 a step): is the TTFT it was derived from in milliseconds declared as seconds, \
                 or does it hold a long queue?",
                profile.prefill_tok_s()
            ));
        }
    }
    w
}
