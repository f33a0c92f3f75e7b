//! The decode step's context term (`kv_read_s_per_ktok`), fitted from a decode sweep measured
//! at two contexts.
//!
//! A decode step reads the model's weights once and the KV cache of every token its sequences
//! attend to (a memory-bound roofline: KV bytes per token / bandwidth per token). A sweep with
//! short contexts gives the curve; rows of the same concurrencies at a longer context
//! (`mean_context_tokens`) show the time the extra tokens cost. With `n` sequences attending to
//! `c` tokens each on average, the step is `t(n, c) = t0(n) + k n c`, so between the two
//! contexts at one concurrency `t_long - t_short = k n (c_long - c_short)`. [`fit`] takes `k`
//! by least squares over the concurrencies both contexts measured, weighted by the long step's
//! inverse square (the rows' errors are relative), with its standard error from the residuals;
//! the curve is then the short rows' with their own context's reads taken out (`t0(n) =
//! t_short - k n c_short`: the step at no context), which the engine adds back for the context
//! its sequences hold.

use routelab_policies::located::InputError;

use super::{Measured, Obs};

/// The fitted term and the curve it leaves.
#[derive(Debug, Clone)]
pub(super) struct ContextFit {
    /// Seconds per decode step per token attended (>= 0).
    pub(super) s_per_tok: f64,
    /// Its standard error (`None` with one concurrency: no residual to estimate it from).
    pub(super) se: Option<f64>,
    /// The shortest context (the curve's) and the longer ones, tokens.
    pub(super) short: f64,
    pub(super) long: Vec<f64>,
    /// Pairs of rows (one concurrency, two contexts) the fit used.
    pub(super) pairs: usize,
    /// The rows at the shortest context: the curve's points.
    pub(super) points: Vec<Obs>,
    /// Their aggregates with their own context's KV reads taken out.
    pub(super) values: Vec<f64>,
    /// The least-squares figure was below 0 (taken as 0).
    pub(super) clamped: bool,
}

/// The mean tokens a sequence attends to while it decodes a closed loop's `output` tokens after
/// a `prompt`: its prompt and first token at its first decode step, its prompt and all but its
/// last token at its last, so the prompt and half its output on average.
pub(super) fn decode_context(prompt: f64, output: f64) -> f64 {
    prompt + output / 2.0
}

/// The context term from `sweep`, when its rows give two contexts or more; `None` when they
/// give none or one (the curve is then the sweep as measured). An error when only some rows
/// give one, or a longer context's row has no row at the shortest context and its concurrency.
pub(super) fn fit(sweep: &Measured, origin: &str) -> Result<Option<ContextFit>, InputError> {
    let with = sweep
        .points
        .iter()
        .filter(|p| p.context_tokens.is_some())
        .count();
    if with == 0 {
        return Ok(None);
    }
    if let Some(p) = sweep.points.iter().find(|p| p.context_tokens.is_none()) {
        return Err(
            InputError::new(origin, "mean_context_tokens", "empty on this row")
                .at(p.at.line, None)
                .valid("mean_context_tokens on every row of the decode sweep, or on none"),
        );
    }
    let ctx = |p: &Obs| p.context_tokens.expect("every row has one");
    let short = sweep.points.iter().map(ctx).fold(f64::INFINITY, f64::min);
    let mut long: Vec<f64> = Vec::new();
    for p in &sweep.points {
        let c = ctx(p);
        if c > short && !long.contains(&c) {
            long.push(c);
        }
    }
    if long.is_empty() {
        return Ok(None);
    }
    long.sort_by(f64::total_cmp);
    let points: Vec<Obs> = sweep
        .points
        .iter()
        .filter(|p| ctx(p) == short)
        .cloned()
        .collect();
    // (x = n (c_long - c_short), y = t_long - t_short, weight 1 / t_long^2)
    let mut xyw = Vec::new();
    for p in sweep.points.iter().filter(|p| ctx(p) > short) {
        let Some(s) = points.iter().find(|s| s.concurrency == p.concurrency) else {
            return Err(InputError::new(
                origin,
                "concurrency",
                format!(
                    "no row at the shortest context ({short} tokens) for concurrency {}",
                    p.concurrency
                ),
            )
            .at(p.at.line, None)
            .valid(
                "every concurrency of a longer context measured at the shortest context too \
                 (the term is the step time between the two at one concurrency)",
            ));
        };
        let n = p.concurrency;
        let (t_long, t_short) = (n / p.aggregate_tok_s, n / s.aggregate_tok_s);
        xyw.push((
            n * (ctx(p) - short),
            t_long - t_short,
            1.0 / (t_long * t_long),
        ));
    }
    let sxx: f64 = xyw.iter().map(|(x, _, w)| w * x * x).sum();
    let sxy: f64 = xyw.iter().map(|(x, y, w)| w * x * y).sum();
    let k = sxy / sxx;
    let se = (xyw.len() >= 2).then(|| {
        let rss: f64 = xyw.iter().map(|(x, y, w)| w * (y - k * x).powi(2)).sum();
        (rss / (xyw.len() - 1) as f64 / sxx).sqrt()
    });
    let clamped = k < 0.0;
    let k = k.max(0.0);
    let mut values = Vec::with_capacity(points.len());
    for p in &points {
        let n = p.concurrency;
        let t0 = n / p.aggregate_tok_s - k * n * short;
        if t0 <= 0.0 {
            return Err(InputError::new(
                origin,
                "aggregate_tok_s",
                format!(
                    "at concurrency {n} the fitted KV read ({:.3} ms for {short} tokens each) is \
                     the whole measured step ({:.3} ms)",
                    k * n * short * 1e3,
                    n / p.aggregate_tok_s * 1e3
                ),
            )
            .at(p.at.line, None)
            .valid(
                "a shortest context short enough that the step is mostly the weights' read \
                 (e.g. a 16-token prompt), and a longer context whose steps are longer",
            ));
        }
        values.push(n / t0);
    }
    Ok(Some(ContextFit {
        s_per_tok: k,
        se,
        short,
        long,
        pairs: xyw.len(),
        points,
        values,
        clamped,
    }))
}

impl ContextFit {
    /// The profile's figure, seconds per step per 1,000 tokens attended (to 0.1 ns).
    pub(super) fn per_ktok(&self) -> f64 {
        (self.s_per_tok * 1e3 * 1e10).round() / 1e10
    }

    /// The `fitted` note on it.
    pub(super) fn note(&self) -> String {
        let se = match self.se {
            Some(se) => format!(" ± {:.2e} (standard error)", se * 1e3),
            None => " (one concurrency: no standard error)".to_string(),
        };
        let clamped = if self.clamped {
            "; the least-squares figure was below 0 (the longer context's steps were not \
             longer) and is taken as 0"
        } else {
            ""
        };
        format!(
            "kv_read_s_per_ktok {}{se}: the decode sweep's rows at mean context {} tokens \
             against its rows at {} ({} concurrencies), the added step time over the added \
             tokens attended (n sequences x the context difference), least squares on relative \
             step times{clamped}; the decode curve is the {}-token rows' with their own \
             context's KV reads taken out (the step at no context)",
            self.per_ktok(),
            self.long
                .iter()
                .map(f64::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            self.short,
            self.pairs,
            self.short
        )
    }
}
