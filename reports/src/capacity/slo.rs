//! The SLO of `routelab capacity`: `--slo "ttft_p99<=2s,tpot_p99<=100ms"` parsed into a
//! validated [`SloSpec`], and the one test of whether a run meets it.
//!
//! Without `--target`, a bound is `METRIC_STAT<=VALUE UNIT`: metric `ttft`, `tpot`, `itl` or
//! `e2el` (the names of `vllm bench serve`), statistic `pNN` (any percentile 0 < NN < 100:
//! `p50`, `p99`, `p99.9`) or `mean`, value a finite number > 0 with unit `s` or `ms`. With
//! `--target F`, a bound is a per-request bound `METRIC<=VALUE UNIT`, with no statistic.
//! Bounds are separated by commas.
//!
//! **What holds means.** Without a target, every bound holds on the run's distribution (the
//! percentile or mean of the run's histogram is at most the bound). With a target (`--target
//! 0.9`), each bound applies to each request and the SLO holds when the fraction of arrived
//! requests that completed within *all* of them is at least the target: the simulator's
//! recorder counts them against [`SloSpec::per_request`]. A statistic written with a target is
//! refused (issue 29: `ttft_p50<=2s --target 0.9` ran as a per-request bound while every header
//! still said p50), and so is a per-request bound without one.
//!
//! ITL: this simulator has no per-token events, so a request's mean inter-token latency is its
//! TPOT. A per-request `itl` bound is therefore a TPOT bound; a distribution bound on `itl` reads
//! the run's ITL histogram (each request's mean gap weighted by its number of gaps, the pooled
//! figure `vllm bench serve` reports).

use routelab_policies::located::{InputError, rule};
use routelab_sim::histogram::Histogram;
use routelab_sim::{RunMetrics, Slo};
use serde::Serialize;
use std::fmt;

/// The flag named in `--slo` errors.
const SLO_FLAG: &str = "--slo";
/// What a bound looks like, said in every error about one.
const BOUND_FORM: &str = "comma-separated bounds METRIC_STAT<=VALUE with a unit, e.g. \
                          ttft_p99<=2s,tpot_p99<=100ms";
/// The metrics a bound may name, said in the unknown-metric error.
const VALID_METRICS: &str = "ttft, tpot, itl, e2el, each with _pNN (0 < NN < 100, e.g. _p99, \
                             _p99.9) or _mean";

/// A latency an SLO bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SloMetric {
    /// Time to first token.
    Ttft,
    /// Time per output token after the first.
    Tpot,
    /// Inter-token latency (per request: its mean gap between tokens).
    Itl,
    /// End-to-end latency.
    E2el,
}

impl SloMetric {
    const ALL: [SloMetric; 4] = [
        SloMetric::Ttft,
        SloMetric::Tpot,
        SloMetric::Itl,
        SloMetric::E2el,
    ];

    /// The name in `--slo` (`ttft`, `tpot`, `itl`, `e2el`).
    pub const fn as_str(self) -> &'static str {
        match self {
            SloMetric::Ttft => "ttft",
            SloMetric::Tpot => "tpot",
            SloMetric::Itl => "itl",
            SloMetric::E2el => "e2el",
        }
    }

    /// The run histogram a distribution bound on this metric reads (the same histograms the
    /// metric catalog's `ttft_*`, `tpot_*`, `itl_*` and `e2e_*` entries read).
    fn histogram(self, m: &RunMetrics) -> &Histogram {
        match self {
            SloMetric::Ttft => &m.ttft,
            SloMetric::Tpot => &m.tpot,
            // Each request's mean gap, weighted by its number of gaps (pooled ITL).
            SloMetric::Itl => &m.itl,
            SloMetric::E2el => &m.e2e,
        }
    }
}

/// Which statistic of a metric's distribution a bound applies to, or none: a per-request bound.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Statistic {
    /// The mean.
    Mean,
    /// A percentile, 0 < p < 100.
    Percentile(f64),
    /// Each request's own value (with `--target`: the fraction of requests within every bound
    /// is what holds or not). Its value in a run, for the outputs, is the quantile at the
    /// target: the latency that fraction of requests stayed within.
    PerRequest {
        /// The `--target` fraction.
        target: f64,
    },
}

impl fmt::Display for Statistic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Statistic::Mean => f.write_str("mean"),
            Statistic::Percentile(p) => write!(f, "p{p}"),
            Statistic::PerRequest { .. } => f.write_str("per request"),
        }
    }
}

/// One bound: `metric_stat <= bound_s`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bound {
    /// The latency.
    pub metric: SloMetric,
    /// Its statistic.
    pub statistic: Statistic,
    /// The bound, seconds.
    pub bound_s: f64,
}

impl Bound {
    /// `ttft_p99`, or `ttft` for a per-request bound (the bound's name, as written in
    /// `--slo`).
    pub fn name(&self) -> String {
        match self.statistic {
            Statistic::PerRequest { .. } => self.metric.as_str().to_string(),
            s => format!("{}_{s}", self.metric.as_str()),
        }
    }

    /// The statistic in a run (`None`: the run has no value, e.g. nothing completed).
    pub fn value(&self, m: &RunMetrics) -> Option<f64> {
        let h = self.metric.histogram(m);
        match self.statistic {
            Statistic::Mean => h.mean_secs(),
            Statistic::Percentile(p) => h.quantile_secs(p / 100.0),
            Statistic::PerRequest { target } => h.quantile_secs(target),
        }
        .filter(|v| v.is_finite())
    }
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}<={}", self.name(), fmt_seconds(self.bound_s))
    }
}

/// A duration as `--slo` writes it: milliseconds below one second.
fn fmt_seconds(s: f64) -> String {
    if s < 1.0 {
        format!("{}ms", (s * 1e3 * 1e6).round() / 1e6)
    } else {
        format!("{s}s")
    }
}

/// A validated SLO: its bounds and, optionally, the fraction of requests that must meet them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SloSpec {
    /// The bounds, in the order given.
    pub bounds: Vec<Bound>,
    /// With a target, the bounds are per request and this fraction of requests must meet all
    /// of them; without, each bound holds on the run's distribution.
    pub target: Option<f64>,
}

impl SloSpec {
    /// Parse `--slo` (and validate `--target`).
    ///
    /// # Errors
    /// A located [`InputError`] naming `--slo` (and the bound) or `--target`: a bound that does
    /// not parse, an unknown metric or statistic (the valid ones are listed), a value that is
    /// not a finite number > 0, a missing unit, a bound given twice, a target outside (0, 1].
    pub fn parse(slo: &str, target: Option<f64>) -> Result<SloSpec, InputError> {
        let target = target.map(parse_target).transpose()?;
        let mut bounds: Vec<Bound> = Vec::new();
        if slo.trim().is_empty() {
            return Err(InputError::new(SLO_FLAG, "", "is empty").valid(BOUND_FORM));
        }
        for part in slo.split(',') {
            let b = parse_bound(part.trim(), target)?;
            if bounds
                .iter()
                .any(|o| o.metric == b.metric && o.statistic == b.statistic)
            {
                return Err(InputError::new(
                    SLO_FLAG,
                    part.trim(),
                    format!("`{}` is bounded twice", b.name()),
                )
                .valid("each METRIC_STAT once"));
            }
            bounds.push(b);
        }
        Ok(SloSpec { bounds, target })
    }

    /// Warnings about bounds that are legal but implausible (`tpot<=100s` meant `100ms`), by
    /// the policy crate's one plausibility rule; `e2el` bounds are not judged (a long output
    /// may take minutes). Each names the bound as written.
    pub fn warnings(&self) -> Vec<String> {
        self.bounds
            .iter()
            .filter_map(|b| {
                let kind = match b.metric {
                    SloMetric::Ttft => routelab_policies::SloBound::Ttft,
                    SloMetric::Tpot | SloMetric::Itl => routelab_policies::SloBound::Tpot,
                    SloMetric::E2el => return None,
                };
                routelab_policies::implausible_slo_bound(kind, b.bound_s)
                    .map(|why| format!("{SLO_FLAG} {}: {why}", b.name()))
            })
            .collect()
    }

    /// The per-request bounds the simulator's recorder counts against (`slo_met`): each
    /// metric's tightest bound, unbounded ones infinite. `itl` bounds the TPOT (see the module
    /// documentation).
    pub fn per_request(&self) -> Slo {
        let tightest = |ms: &[SloMetric]| {
            self.bounds
                .iter()
                .filter(|b| ms.contains(&b.metric))
                .map(|b| b.bound_s)
                .fold(f64::INFINITY, f64::min)
        };
        let e2e = tightest(&[SloMetric::E2el]);
        Slo {
            ttft_s: tightest(&[SloMetric::Ttft]),
            tpot_s: tightest(&[SloMetric::Tpot, SloMetric::Itl]),
            e2e_s: e2e.is_finite().then_some(e2e),
        }
    }

    /// Whether the run meets the SLO (see the module documentation). A bound the run has no
    /// value for does not hold.
    pub fn holds(&self, m: &RunMetrics) -> bool {
        match self.target {
            Some(t) => m.slo_attainment().is_some_and(|a| a >= t),
            None => self
                .bounds
                .iter()
                .all(|b| b.value(m).is_some_and(|v| v <= b.bound_s)),
        }
    }

    /// The rule in one sentence, for reports.
    pub fn rule(&self) -> String {
        match self.target {
            Some(t) => format!(
                "at least {}% of requests complete within every bound ({}) per request",
                t * 100.0,
                self.per_request_text()
            ),
            None => format!(
                "every bound holds on the run's distribution: {}",
                self.to_string().replace(',', ", ")
            ),
        }
    }

    fn per_request_text(&self) -> String {
        self.bounds
            .iter()
            .map(|b| format!("{} <= {}", b.metric.as_str(), fmt_seconds(b.bound_s)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for SloSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.bounds.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

/// `--target`: a fraction in (0, 1].
///
/// # Errors
/// A located [`InputError`] naming `--target`.
pub fn parse_target(t: f64) -> Result<f64, InputError> {
    if t.is_finite() && t > 0.0 && t <= 1.0 {
        Ok(t)
    } else {
        Err(InputError::new(
            "--target",
            "",
            format!("{t} is not valid; expected a fraction of requests in (0, 1], e.g. 0.9"),
        ))
    }
}

fn parse_bound(part: &str, target: Option<f64>) -> Result<Bound, InputError> {
    let err = |message: String| InputError::new(SLO_FLAG, part, message);
    let Some((name, value)) = part.split_once("<=") else {
        return Err(err("is not a bound".into()).valid(BOUND_FORM));
    };
    let (name, value) = (name.trim(), value.trim());
    let (metric, stat) = match name.split_once('_') {
        Some((m, s)) => (m, Some(s)),
        None => (name, None),
    };
    let metric = SloMetric::ALL
        .into_iter()
        .find(|m| m.as_str() == metric)
        .ok_or_else(|| {
            let valid = if target.is_some() {
                VALID_PER_REQUEST
            } else {
                VALID_METRICS
            };
            err(format!("unknown metric `{metric}`")).valid(valid)
        })?;
    let bound_s = parse_value(value, &err)?;
    let per_request = format!("{}<={value}", metric.as_str());
    let statistic = match (stat, target) {
        (None, Some(target)) => Statistic::PerRequest { target },
        (Some(stat), Some(t)) => {
            return Err(err(format!(
                "`{name}` bounds a statistic of the run's distribution ({stat}), but --target {t} \
                 makes every bound a per-request bound: each request's {} within {value}, and at \
                 least {}% of the requests within every bound; write `{per_request}` (or leave \
                 --target out to bound the run's {stat})",
                metric.as_str(),
                t * 100.0
            ))
            .valid(VALID_PER_REQUEST));
        }
        (None, None) => {
            return Err(err(format!(
                "`{name}` names no statistic; a bound without one is a per-request bound, which \
                 needs --target F (the fraction of requests that must meet every bound, e.g. \
                 `--slo \"{per_request}\" --target 0.9`)"
            ))
            .valid(VALID_METRICS));
        }
        (Some(stat), None) => parse_statistic(stat, &err)?,
    };
    Ok(Bound {
        metric,
        statistic,
        bound_s,
    })
}

/// What a per-request bound looks like, said in the errors about one.
const VALID_PER_REQUEST: &str = "with --target, per-request bounds METRIC<=VALUE: ttft, tpot, \
                                 itl or e2el, e.g. ttft<=2s,tpot<=100ms";

fn parse_statistic(
    stat: &str,
    err: &impl Fn(String) -> InputError,
) -> Result<Statistic, InputError> {
    Ok(if stat == "mean" {
        Statistic::Mean
    } else {
        let p = stat
            .strip_prefix('p')
            .and_then(|p| p.parse::<f64>().ok())
            .ok_or_else(|| err(format!("unknown statistic `{stat}`")).valid(VALID_METRICS))?;
        if !(p.is_finite() && p > 0.0 && p < 100.0) {
            return Err(err(format!(
                "percentile {p} is not valid; expected 0 < NN < 100"
            )));
        }
        Statistic::Percentile(p)
    })
}

fn parse_value(value: &str, err: &impl Fn(String) -> InputError) -> Result<f64, InputError> {
    let (number, per_second) = if let Some(n) = value.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = value.strip_suffix('s') {
        (n, 1.0)
    } else {
        return Err(
            err(format!("`{value}` has no unit")).valid("a number with s or ms, e.g. 2s or 100ms")
        );
    };
    let x: f64 = number.trim().parse().map_err(|_| {
        err(format!("`{number}` is not a number")).valid("a number with s or ms, e.g. 2s or 100ms")
    })?;
    Ok(rule::positive(x).map_err(|v| err(v.to_string()))? * per_second)
}

#[cfg(test)]
mod tests {
    use super::*;
    use routelab_sim::WorkerTotals;

    #[test]
    fn the_issue_example_parses_into_two_percentile_bounds() {
        let s = SloSpec::parse("ttft_p99<=2s, tpot_p99<=100ms", None).unwrap();
        assert_eq!(s.bounds.len(), 2);
        assert_eq!(s.bounds[0].metric, SloMetric::Ttft);
        assert_eq!(s.bounds[0].statistic, Statistic::Percentile(99.0));
        assert_eq!(s.bounds[0].bound_s, 2.0);
        assert_eq!(s.bounds[1].metric, SloMetric::Tpot);
        assert!((s.bounds[1].bound_s - 0.1).abs() < 1e-15);
        assert_eq!(s.to_string(), "ttft_p99<=2s,tpot_p99<=100ms");
        let odd = SloSpec::parse("e2el_p99.9<=1.5s,itl_mean<=20ms", None).unwrap();
        assert_eq!(odd.bounds[0].statistic, Statistic::Percentile(99.9));
        assert_eq!(odd.bounds[1].statistic, Statistic::Mean);
        assert_eq!(odd.to_string(), "e2el_p99.9<=1.5s,itl_mean<=20ms");
        let per_request = SloSpec::parse("ttft<=2s, tpot<=100ms", Some(0.9)).unwrap();
        assert_eq!(
            per_request.bounds[0].statistic,
            Statistic::PerRequest { target: 0.9 }
        );
        assert_eq!(per_request.target, Some(0.9));
        assert_eq!(per_request.to_string(), "ttft<=2s,tpot<=100ms");
        assert_eq!(
            per_request.rule(),
            "at least 90% of requests complete within every bound (ttft <= 2s, tpot <= 100ms) \
             per request"
        );
    }

    #[test]
    fn trap2_a_statistic_with_a_target_is_refused_saying_how_to_write_a_per_request_bound() {
        // Regression (issue 29): `ttft_p50<=2s,tpot_mean<=100ms --target 0.9` ran as
        // per-request bounds while every header still said p50.
        let e = SloSpec::parse("ttft_p50<=2s,tpot_mean<=100ms", Some(0.9)).unwrap_err();
        assert_eq!(
            (e.file.as_str(), e.field.as_str()),
            ("--slo", "ttft_p50<=2s")
        );
        let m = e.to_string();
        assert!(
            m.contains(
                "`ttft_p50` bounds a statistic of the run's distribution (p50), but \
                        --target 0.9 makes every bound a per-request bound"
            ) && m.contains("write `ttft<=2s` (or leave --target out to bound the run's p50)")
                && m.contains("valid: with --target, per-request bounds METRIC<=VALUE"),
            "{m}"
        );
        let e = SloSpec::parse("ttft<=2s,tpot_mean<=100ms", Some(0.9)).unwrap_err();
        assert_eq!(e.field, "tpot_mean<=100ms");
        assert!(e.to_string().contains("write `tpot<=100ms`"), "{e}");
        // The per-request spelling without a target says what it needs.
        let e = SloSpec::parse("ttft<=2s", None).unwrap_err().to_string();
        assert!(
            e.contains("a bound without one is a per-request bound, which needs --target F")
                && e.contains("--slo \"ttft<=2s\" --target 0.9"),
            "{e}"
        );
    }

    #[test]
    fn per_request_bounds_take_the_tightest_and_map_itl_to_tpot() {
        let s = SloSpec::parse(
            "ttft_p99<=2s,ttft_p50<=500ms,itl_p99<=50ms,tpot_p90<=80ms",
            None,
        )
        .unwrap();
        let slo = s.per_request();
        assert_eq!(slo.ttft_s, 0.5);
        assert_eq!(slo.tpot_s, 0.05);
        assert_eq!(slo.e2e_s, None);
        let e = SloSpec::parse("e2el_mean<=3s", None).unwrap().per_request();
        assert_eq!(
            (e.ttft_s, e.tpot_s, e.e2e_s),
            (f64::INFINITY, f64::INFINITY, Some(3.0))
        );
    }

    fn err(slo: &str) -> String {
        SloSpec::parse(slo, None).unwrap_err().to_string()
    }

    #[test]
    fn bad_bounds_are_located_errors_naming_the_flag() {
        let e = err("ttft_p99<=2s,ttfx_p99<=1s");
        assert!(
            e.starts_with("--slo: ttfx_p99<=1s: unknown metric `ttfx`"),
            "{e}"
        );
        assert!(e.contains("valid: ttft, tpot, itl, e2el"), "{e}");
        assert!(err("ttft_p99=2s").contains("is not a bound"));
        assert!(err("").contains("--slo: is empty"));
        assert!(err("ttft<=2s").contains("names no statistic"));
        assert!(err("ttft_q99<=2s").contains("unknown statistic `q99`"));
        assert!(err("ttft_p100<=2s").contains("expected 0 < NN < 100"));
        assert!(err("ttft_p0<=2s").contains("expected 0 < NN < 100"));
        assert!(err("ttft_p99<=2").contains("has no unit"));
        assert!(err("ttft_p99<=xs").contains("`x` is not a number"));
        for bad in ["-1s", "0ms", "NaNs", "infs"] {
            let e = err(&format!("ttft_p99<={bad}"));
            assert!(e.contains("expected a finite number > 0"), "{bad}: {e}");
        }
        assert!(err("ttft_p99<=1s,ttft_p99<=2s").contains("bounded twice"));
    }

    #[test]
    fn a_target_outside_0_1_is_refused() {
        for bad in [0.0, -0.1, 1.01, f64::NAN] {
            let e = SloSpec::parse("ttft_p99<=2s", Some(bad)).unwrap_err();
            assert_eq!(e.file, "--target");
            assert!(
                e.to_string()
                    .contains("expected a fraction of requests in (0, 1]")
            );
        }
        assert_eq!(parse_target(1.0), Ok(1.0));
    }

    fn metrics(ttft_s: &[f64], slo_met: u64) -> RunMetrics {
        let mut m = RunMetrics::new("p", vec![WorkerTotals::new("w")]);
        for t in ttft_s {
            m.ttft.record_secs(*t);
            m.e2e.record_secs(*t + 1.0);
            m.tpot.record_secs(0.01);
        }
        m.requests = ttft_s.len() as u64;
        m.completed = m.requests;
        m.slo_met = slo_met;
        m
    }

    #[test]
    fn holds_reads_the_distribution_or_the_attainment() {
        // 100 requests: 98 at 1 s, 2 at 3 s; p99 is 3 s, p90 is 1 s.
        let mut ttft = vec![1.0; 98];
        ttft.extend([3.0, 3.0]);
        let m = metrics(&ttft, 90);
        assert!(!SloSpec::parse("ttft_p99<=2s", None).unwrap().holds(&m));
        assert!(SloSpec::parse("ttft_p90<=2s", None).unwrap().holds(&m));
        // mean = (98 + 6) / 100 = 1.04 s
        assert!(SloSpec::parse("ttft_mean<=1050ms", None).unwrap().holds(&m));
        assert!(!SloSpec::parse("ttft_mean<=1030ms", None).unwrap().holds(&m));
        assert!(
            SloSpec::parse("ttft_p90<=2s,e2el_p90<=2.1s", None)
                .unwrap()
                .holds(&m)
        );
        assert!(
            !SloSpec::parse("ttft_p90<=2s,e2el_p90<=1.9s", None)
                .unwrap()
                .holds(&m)
        );
        // With a target, the recorded attainment (90 of 100) decides.
        assert!(SloSpec::parse("ttft<=2s", Some(0.9)).unwrap().holds(&m));
        assert!(!SloSpec::parse("ttft<=2s", Some(0.91)).unwrap().holds(&m));
        // A per-request bound's value is the quantile at the target: 90 % stayed within 1 s.
        let b = &SloSpec::parse("ttft<=2s", Some(0.9)).unwrap().bounds[0];
        assert_eq!(b.name(), "ttft");
        assert!((b.value(&m).unwrap() - 1.0).abs() < 0.01);
        // Nothing measured: nothing holds.
        let empty = metrics(&[], 0);
        assert!(!SloSpec::parse("ttft_p99<=2s", None).unwrap().holds(&empty));
        assert!(!SloSpec::parse("ttft<=2s", Some(0.5)).unwrap().holds(&empty));
    }

    /// Issue 41: `tpot<=100s` (meant 100 ms) parsed silently; implausible bounds now warn.
    #[test]
    fn implausible_bounds_warn() {
        let s = SloSpec::parse("ttft<=2s,tpot<=100s", Some(0.9)).unwrap();
        let w = s.warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("--slo tpot: ") && w[0].contains("implausibly long"),
            "{w:?}"
        );
        let s = SloSpec::parse("ttft_p99<=2000s,itl_p99<=50ms,e2el_p99<=3000s", None).unwrap();
        let w = s.warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("--slo ttft_p99: "), "{w:?}");
        assert!(
            SloSpec::parse("ttft_p99<=2s,tpot_p99<=100ms", None)
                .unwrap()
                .warnings()
                .is_empty()
        );
    }
}
