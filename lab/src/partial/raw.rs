//! The partial file's raw serde structs and their conversion to and from the domain records.

use super::{CapacityRun, CheckRun, CompareRun, MergeError, Partial, Records, SweepRun};
use crate::shard::Shard;
use routelab_policies::InputError;
use routelab_reports::PerfRun;
use routelab_reports::RunSummary;
use routelab_reports::capacity::{Censored, Evaluation, Rejected, SeedCapacity};
use routelab_sim::histogram::Histogram;
use serde::{Deserialize, Serialize};

/// The format's version; a reader refuses any other (2: the routelab version is recorded).
pub(super) const FORMAT: u32 = 2;

/// An `f64` written as the shortest text that reads back to the same value (Rust's `{:?}`,
/// parsed back by `str::parse`, which rounds correctly). serde_json's own float parser may be
/// off by an ulp, and NaN has no JSON number; the merge must rebuild every value exactly.
#[derive(Debug, Clone, Copy)]
struct Exact(f64);

impl Serialize for Exact {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{:?}", self.0))
    }
}

impl<'de> Deserialize<'de> for Exact {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map(Exact).map_err(|_| {
            serde::de::Error::custom(format!("`{text}` is not a number written by a shard"))
        })
    }
}

fn exact(v: &[Option<f64>]) -> Vec<Option<Exact>> {
    v.iter().map(|v| v.map(Exact)).collect()
}

fn plain(v: Vec<Option<Exact>>) -> Vec<Option<f64>> {
    v.into_iter().map(|v| v.map(|x| x.0)).collect()
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPartial {
    routelab_partial: u32,
    /// The routelab version that wrote it.
    routelab: String,
    command: String,
    args: Vec<String>,
    /// `K/N`.
    shard: String,
    units: usize,
    /// 16 hexadecimal digits.
    inputs_hash: String,
    wall_s: f64,
    threads: usize,
    records: RawRecords,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum RawRecords {
    Compare(Vec<RawCompareRun>),
    Sweep(Vec<RawSweepRun>),
    Capacity(Vec<RawCapacityRun>),
    Check(Vec<RawCheckRun>),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCompareRun {
    scenario: usize,
    ordinal: usize,
    policy: usize,
    seed: u64,
    summary: Vec<Option<Exact>>,
    e2e: Option<RawHistogram>,
    requests: u64,
    perf: PerfRun,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSweepRun {
    job: usize,
    seed: u64,
    summary: Vec<Option<Exact>>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCapacityRun {
    scenario: usize,
    policy: usize,
    seed: u64,
    scale: Exact,
    failing_scale: Exact,
    censored: Option<RawCensored>,
    evaluations: Vec<RawEvaluation>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum RawCensored {
    NeverHolds { min_scale: Exact, why: String },
    AlwaysHolds { max_scale: Exact },
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEvaluation {
    scale: Exact,
    holds: bool,
    attainment: Option<Exact>,
    ttft_p99_s: Option<Exact>,
    values: Vec<Option<Exact>>,
    /// The refused requests (total, context window, no worker, largest window, longest
    /// request). Absent when none was, so a partial written before it existed (or of a run
    /// without rejections) reads the same as ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rejected: Option<(u64, u64, u64, u32, u32)>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCheckRun {
    job: usize,
    values: Vec<(String, Option<Exact>)>,
}

/// What the CDF chart reads of a histogram, and enough to rebuild it exactly: the count, the
/// exact sum, min and max, and the non-empty buckets as `(lowest, highest, count)`.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHistogram {
    count: u64,
    sum: u128,
    min: u64,
    max: u64,
    buckets: Vec<(u64, u64, u64)>,
}

impl RawHistogram {
    fn of(h: &Histogram) -> RawHistogram {
        RawHistogram {
            count: h.count(),
            sum: h.sum(),
            min: h.min().unwrap_or(0),
            max: h.max().unwrap_or(0),
            buckets: h.buckets().collect(),
        }
    }

    /// The histogram these figures describe. Values are placed inside their buckets so that
    /// the count, sum, min, max and every bucket's count come out as recorded (the values
    /// themselves are not kept, and no reader needs them); `None` when no histogram has these
    /// figures.
    fn rebuild(&self) -> Option<Histogram> {
        let mut h = Histogram::new();
        if self.count == 0 {
            return (self.buckets.is_empty() && self.sum == 0).then_some(h);
        }
        let (first, last) = (0, self.buckets.len().checked_sub(1)?);
        // Each bucket's range as far as min and max allow; the lowest value sits at min, one
        // value sits at max, and the sum left over raises the other values within their
        // buckets.
        let bounds = |lo: u64, hi: u64| (lo.max(self.min), hi.min(self.max));
        let mut floor: u128 = 0;
        for (i, &(lo, hi, c)) in self.buckets.iter().enumerate() {
            let (lo, hi) = bounds(lo, hi);
            if lo > hi || c == 0 {
                return None;
            }
            floor += u128::from(lo) * u128::from(c);
            if i == last {
                floor += u128::from(hi - lo);
            }
        }
        let mut excess = self.sum.checked_sub(floor)?;
        for (i, &(lo, hi, c)) in self.buckets.iter().enumerate() {
            let (lo, hi) = bounds(lo, hi);
            let pinned_low = u64::from(i == first);
            let pinned_high = u64::from(i == last && (i != first || c >= 2));
            let free = c.checked_sub(pinned_low + pinned_high)?;
            if pinned_low == 1 {
                h.record(lo);
            }
            if pinned_high == 1 {
                h.record(hi);
            }
            let width = hi - lo;
            let raise = if width == 0 {
                0
            } else {
                excess.min(u128::from(free) * u128::from(width))
            };
            excess -= raise;
            let full = u64::try_from(raise / u128::from(width.max(1))).ok()?;
            let part = u64::try_from(raise % u128::from(width.max(1))).ok()?;
            h.record_n(hi, full);
            if part > 0 {
                h.record(lo + part);
            }
            h.record_n(lo, free - full - u64::from(part > 0));
        }
        let exact = excess == 0
            && h.count() == self.count
            && h.sum() == self.sum
            && h.min() == Some(self.min)
            && h.max() == Some(self.max)
            && h.buckets().eq(self.buckets.iter().copied());
        exact.then_some(h)
    }
}

/// The partial as JSON text.
pub(super) fn to_json(p: &Partial) -> Result<String, MergeError> {
    let records = match &p.records {
        Records::Compare(runs) => RawRecords::Compare(
            runs.iter()
                .map(|r| RawCompareRun {
                    scenario: r.scenario,
                    ordinal: r.ordinal,
                    policy: r.policy,
                    seed: r.seed,
                    summary: exact(r.summary.values()),
                    e2e: r.e2e.as_ref().map(RawHistogram::of),
                    requests: r.requests,
                    perf: r.perf.clone(),
                })
                .collect(),
        ),
        Records::Sweep(runs) => RawRecords::Sweep(
            runs.iter()
                .map(|r| RawSweepRun {
                    job: r.job,
                    seed: r.seed,
                    summary: exact(r.summary.values()),
                })
                .collect(),
        ),
        Records::Capacity(runs) => RawRecords::Capacity(
            runs.iter()
                .map(|r| {
                    let f = &r.found;
                    RawCapacityRun {
                        scenario: r.scenario,
                        policy: r.policy,
                        seed: f.seed,
                        scale: Exact(f.scale),
                        failing_scale: Exact(f.failing_scale),
                        censored: f.censored.as_ref().map(|c| match c {
                            Censored::NeverHolds { min_scale, why } => RawCensored::NeverHolds {
                                min_scale: Exact(*min_scale),
                                why: why.clone(),
                            },
                            Censored::AlwaysHolds { max_scale } => RawCensored::AlwaysHolds {
                                max_scale: Exact(*max_scale),
                            },
                        }),
                        evaluations: f
                            .evaluations
                            .iter()
                            .map(|e| RawEvaluation {
                                scale: Exact(e.scale),
                                holds: e.holds,
                                attainment: e.attainment.map(Exact),
                                ttft_p99_s: e.ttft_p99_s.map(Exact),
                                values: exact(&e.values),
                                rejected: (!e.rejected.is_none()).then_some((
                                    e.rejected.total,
                                    e.rejected.context_window,
                                    e.rejected.no_worker,
                                    e.rejected.largest_window,
                                    e.rejected.longest_request,
                                )),
                            })
                            .collect(),
                    }
                })
                .collect(),
        ),
        Records::Check(runs) => RawRecords::Check(
            runs.iter()
                .map(|r| RawCheckRun {
                    job: r.job,
                    values: r
                        .values
                        .iter()
                        .map(|(k, v)| (k.clone(), v.map(Exact)))
                        .collect(),
                })
                .collect(),
        ),
    };
    let raw = RawPartial {
        routelab_partial: FORMAT,
        routelab: p.version.clone(),
        command: p.command.clone(),
        args: p.args.clone(),
        shard: p.shard.to_string(),
        units: p.units,
        inputs_hash: format!("{:016x}", p.inputs_hash),
        wall_s: p.wall_s,
        threads: p.threads,
        records,
    };
    let mut text = serde_json::to_string(&raw)
        .map_err(|e| InputError::new("partial result", "", format!("cannot serialise: {e}")))?;
    text.push('\n');
    Ok(text)
}

/// Parse a partial's text; `file` names it in errors.
pub(super) fn from_json(text: &str, file: &str) -> Result<Partial, InputError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let raw: RawPartial = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let mut located = crate::gate::json_error(file, &e)
            .valid("a partial result written by `routelab ... --shard K/N`");
        // Text that ends before its first field has no field path (serde_path_to_error: `?`).
        if located.field == "?" {
            located.field.clear();
        }
        located
    })?;
    let bad = |field: String, why: &str| InputError::new(file, field, why.to_string());
    if raw.routelab_partial != FORMAT {
        return Err(bad(
            "routelab_partial".into(),
            &format!(
                "format {} is not the one this routelab reads",
                raw.routelab_partial
            ),
        )
        .valid(format!("{FORMAT} (re-run the shards with this routelab)")));
    }
    let shard = Shard::parse(&raw.shard, file, "shard")?;
    let inputs_hash = u64::from_str_radix(&raw.inputs_hash, 16)
        .ok()
        .filter(|_| raw.inputs_hash.len() == 16)
        .ok_or_else(|| bad("inputs_hash".into(), "is not 16 hexadecimal digits"))?;
    let records = records_of(raw.records, &bad)?;
    if records.command() != raw.command {
        return Err(bad(
            "records".into(),
            &format!(
                "holds results of `{}`, not of `{}`",
                records.command(),
                raw.command
            ),
        ));
    }
    Ok(Partial {
        version: raw.routelab,
        command: raw.command,
        args: raw.args,
        shard,
        units: raw.units,
        inputs_hash,
        wall_s: raw.wall_s,
        threads: raw.threads,
        records,
    })
}

/// A partial's records, validated (`bad` locates an error in `file`).
fn records_of(
    records: RawRecords,
    bad: &impl Fn(String, &str) -> InputError,
) -> Result<Records, InputError> {
    let summary = |values: Vec<Option<Exact>>, policy: &str, at: String| {
        RunSummary::from_values(policy, plain(values)).ok_or_else(|| {
            bad(
                at,
                "does not hold one finite value (or null) per catalog metric; the partial was \
                 written by another routelab version or edited",
            )
        })
    };
    Ok(match records {
        RawRecords::Compare(runs) => {
            let mut out = Vec::with_capacity(runs.len());
            for (i, r) in runs.into_iter().enumerate() {
                let e2e = match r.e2e {
                    Some(h) => Some(h.rebuild().ok_or_else(|| {
                        bad(
                            format!("records.compare[{i}].e2e"),
                            "is not a histogram (its buckets, count, sum, min and max disagree)",
                        )
                    })?),
                    None => None,
                };
                out.push(CompareRun {
                    scenario: r.scenario,
                    ordinal: r.ordinal,
                    policy: r.policy,
                    seed: r.seed,
                    summary: summary(
                        r.summary,
                        &r.perf.policy,
                        format!("records.compare[{i}].summary"),
                    )?,
                    e2e,
                    requests: r.requests,
                    perf: r.perf,
                });
            }
            Records::Compare(out)
        }
        RawRecords::Sweep(runs) => {
            let mut out = Vec::with_capacity(runs.len());
            for (i, r) in runs.into_iter().enumerate() {
                out.push(SweepRun {
                    job: r.job,
                    seed: r.seed,
                    summary: summary(r.summary, "", format!("records.sweep[{i}].summary"))?,
                });
            }
            Records::Sweep(out)
        }
        RawRecords::Capacity(runs) => {
            Records::Capacity(runs.into_iter().map(RawCapacityRun::into_run).collect())
        }
        RawRecords::Check(runs) => Records::Check(
            runs.into_iter()
                .map(|r| CheckRun {
                    job: r.job,
                    values: r
                        .values
                        .into_iter()
                        .map(|(k, v)| (k, v.map(|x| x.0)))
                        .collect(),
                })
                .collect(),
        ),
    })
}

impl RawCapacityRun {
    /// The record as written, its floats exact.
    fn into_run(self) -> CapacityRun {
        CapacityRun {
            scenario: self.scenario,
            policy: self.policy,
            found: SeedCapacity {
                seed: self.seed,
                scale: self.scale.0,
                failing_scale: self.failing_scale.0,
                censored: self.censored.map(|c| match c {
                    RawCensored::NeverHolds { min_scale, why } => Censored::NeverHolds {
                        min_scale: min_scale.0,
                        why,
                    },
                    RawCensored::AlwaysHolds { max_scale } => Censored::AlwaysHolds {
                        max_scale: max_scale.0,
                    },
                }),
                evaluations: self
                    .evaluations
                    .into_iter()
                    .map(|e| Evaluation {
                        scale: e.scale.0,
                        holds: e.holds,
                        attainment: e.attainment.map(|x| x.0),
                        ttft_p99_s: e.ttft_p99_s.map(|x| x.0),
                        values: plain(e.values),
                        rejected: e.rejected.map_or_else(
                            Rejected::default,
                            |(
                                total,
                                context_window,
                                no_worker,
                                largest_window,
                                longest_request,
                            )| {
                                Rejected {
                                    total,
                                    context_window,
                                    no_worker,
                                    largest_window,
                                    longest_request,
                                }
                            },
                        ),
                    })
                    .collect(),
            },
        }
    }
}
