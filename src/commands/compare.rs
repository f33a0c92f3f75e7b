//! `routelab compare SCENARIO...`: policies × seeds on each scenario, mean and 95 % interval
//! across seeds, every policy's paired difference from a baseline, one comparison report (and,
//! with `--findings`, the Markdown findings document). `--seeds auto` adds seeds until the
//! paired differences are precise enough (`routelab_lab::grow_seeds`).

use crate::lab::{
    self, Found, Job, RecordKey, ResampleArgs, ShardArgs, Sharded, ShardedArgs, Timing,
    canonical_options, holdout_fraction, read_scenario, run_all, seed_meaning,
};
use anyhow::Context;
use routelab_lab::holdout::compare_out_of_sample;
use routelab_lab::partial::{CompareRun, InputsHash, MergeSet, Record};
use routelab_lab::{grow_seeds, seed_of};
use routelab_policies::located::rule::{self, Violation};
use routelab_policies::{InputError, PolicyConfig};
use routelab_reports::findings;
use routelab_reports::holdout::held_out_text;
use routelab_reports::stats::AutoSeeds;
use routelab_reports::{
    PerfInfo, PerfRun, PolicySeeds, RunSummary, ScenarioComparison, SeedResult, compare_table,
    findings_document, write_compare, write_perf,
};
use routelab_sim::Scenario;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// Where command-line errors are located.
pub(crate) const COMMAND_LINE: &str = "command line";

/// Options of `routelab compare`.
#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// Scenario YAML files.
    #[arg(required = true)]
    pub scenarios: Vec<PathBuf>,
    /// Policy; repeat for several. Default: each scenario's own list.
    #[arg(long = "policy")]
    pub policies: Vec<String>,
    /// Seeds per policy: a count, or `auto` to add seeds until every paired difference from
    /// the baseline on the key metrics has a 95 % half-width within `--precision` of the
    /// baseline's mean (3 seeds first, then 2 at a time, at most `--max-seeds`).
    #[arg(long, default_value = "5", value_name = "N|auto")]
    pub seeds: String,
    /// The policy every paired difference is taken against (default: the first listed).
    #[arg(long)]
    pub baseline: Option<String>,
    /// With `--seeds auto`: the most seeds to run (default 20).
    #[arg(long)]
    pub max_seeds: Option<f64>,
    /// With `--seeds auto`: the half-width to reach, as a fraction of the baseline's mean
    /// (default 0.05).
    #[arg(long)]
    pub precision: Option<f64>,
    /// Output directory.
    #[arg(long, default_value = "out/compare")]
    pub out: PathBuf,
    /// Also write the Markdown findings document to this file (e.g. docs/findings.md).
    #[arg(long)]
    pub findings: Option<PathBuf>,
    /// What a seed means for a trace (see `--resample` below).
    #[command(flatten)]
    pub resample: ResampleArgs,
    /// Hold out this fraction of each trace's span (its end, by time): the comparison is made
    /// on the rest, and the winner is checked on the held-out part (same seeds, paired).
    #[arg(long, value_name = "F")]
    pub holdout: Option<f64>,
    /// Sharded runs.
    #[command(flatten)]
    pub shard: ShardArgs,
}

impl ShardedArgs for CompareArgs {
    fn clear_outputs(&mut self) {
        self.out = PathBuf::new();
        self.findings = None;
        self.shard = ShardArgs::default();
    }
}

/// How many seeds to run.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Seeds {
    /// `--seeds N`.
    Fixed(usize),
    /// `--seeds auto`.
    Auto(AutoSeeds),
}

/// The most seeds `--seeds` and `--max-seeds` may ask for (each is a run of every policy).
pub(crate) const MAX_SEEDS_LIMIT: u64 = 1000;

/// `--seeds` as `compare` and `capacity` take it: a count or `auto`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum SeedsFlag {
    /// A count, 1 to [`MAX_SEEDS_LIMIT`].
    Fixed(usize),
    /// `auto`.
    Auto,
}

/// What `--seeds` takes.
fn seeds_valid() -> String {
    format!("a whole number from 1 to {MAX_SEEDS_LIMIT}, or `auto`")
}

/// Parse `--seeds N|auto` (the one parser of `compare` and `capacity`).
pub(crate) fn seeds_flag(text: &str) -> Result<SeedsFlag, InputError> {
    if text.trim() == "auto" {
        return Ok(SeedsFlag::Auto);
    }
    let n: f64 = text.trim().parse().map_err(|_| {
        InputError::new(
            COMMAND_LINE,
            "--seeds",
            format!("`{text}` is not a number of seeds"),
        )
        .valid(seeds_valid())
    })?;
    rule::whole(n, 1, MAX_SEEDS_LIMIT)
        .map(|n| SeedsFlag::Fixed(n as usize))
        .map_err(|_| {
            InputError::new(
                COMMAND_LINE,
                "--seeds",
                format!("{} is not valid", text.trim()),
            )
            .valid(seeds_valid())
        })
}

/// A seed count given to `--seeds` (also `sweep`'s): whole, 1 to [`MAX_SEEDS_LIMIT`].
pub(crate) fn seed_count(n: f64) -> Result<usize, InputError> {
    rule::whole(n, 1, MAX_SEEDS_LIMIT)
        .map(|n| n as usize)
        .map_err(|v| flag_error("--seeds", &v))
}

/// A fraction strictly between 0 and 1 given to `flag` (`compare --precision`, the half-width
/// `--seeds auto` aims at, and `capacity --precision`, the search's); `example` shows one.
pub(crate) fn fraction_flag(flag: &str, p: f64, example: &str) -> Result<f64, InputError> {
    if p.is_finite() && p > 0.0 && p < 1.0 {
        Ok(p)
    } else {
        let why = Violation::new(p, format!("a fraction > 0 and < 1, e.g. {example}"));
        Err(flag_error(flag, &why))
    }
}

fn flag_error(flag: &str, v: &Violation) -> InputError {
    v.at_field(COMMAND_LINE, flag)
}

/// `--seeds`, `--max-seeds` and `--precision`, validated together.
fn seeds_of(args: &CompareArgs) -> Result<Seeds, InputError> {
    if seeds_flag(&args.seeds)? == SeedsFlag::Auto {
        let mut auto = AutoSeeds::default();
        if let Some(m) = args.max_seeds {
            // An interval needs two seeds.
            auto.max = rule::whole(m, 2, MAX_SEEDS_LIMIT)
                .map_err(|v| flag_error("--max-seeds", &v))? as usize;
        }
        if let Some(p) = args.precision {
            auto.rel_half_width = fraction_flag("--precision", p, "0.05")?;
        }
        return Ok(Seeds::Auto(auto));
    }
    for (flag, given) in [
        ("--max-seeds", args.max_seeds.is_some()),
        ("--precision", args.precision.is_some()),
    ] {
        if given {
            return Err(InputError::new(
                COMMAND_LINE,
                flag,
                "applies only with `--seeds auto`",
            ));
        }
    }
    match seeds_flag(&args.seeds)? {
        SeedsFlag::Fixed(n) => Ok(Seeds::Fixed(n)),
        SeedsFlag::Auto => unreachable!("handled above"),
    }
}

/// Index of the `--baseline` policy among a scenario's policies (by name as given, or by the
/// name the composition resolves to).
fn baseline_index(
    baseline: Option<&str>,
    scenario: &Scenario,
    policies: &[PolicyConfig],
) -> Result<usize, InputError> {
    let Some(b) = baseline else { return Ok(0) };
    let canonical = PolicyConfig::from_name(b).ok().map(|p| p.name);
    policies
        .iter()
        .position(|p| p.name == b || canonical.as_deref() == Some(p.name.as_str()))
        .ok_or_else(|| {
            InputError::new(
                COMMAND_LINE,
                "--baseline",
                format!(
                    "`{b}` is not one of the policies compared on `{}`",
                    scenario.name
                ),
            )
            .valid(
                policies
                    .iter()
                    .map(|p| format!("`{}`", p.name))
                    .collect::<Vec<_>>()
                    .join(", "),
            )
        })
}

/// A progress bar on a terminal, nothing otherwise (CI logs stay clean and deterministic).
pub fn progress(len: u64, what: &str) -> Option<indicatif::ProgressBar> {
    std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(len);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} {elapsed}")
                .expect("valid template"),
        );
        bar.set_message(what.to_string());
        bar
    })
}

/// What `compare` runs, worked out from its arguments and inputs before anything runs.
struct Plan {
    args: CompareArgs,
    scenarios: Vec<Scenario>,
    policies: Vec<Vec<PolicyConfig>>,
    /// One per scenario, its policies listed, no runs yet.
    comparisons: Vec<ScenarioComparison>,
    seeds: Seeds,
    /// The scenario files' text, hashed as it was parsed.
    read: InputsHash,
    /// With `--holdout F`: F and the number of scenarios asked for; `scenarios` then holds
    /// each one's first part, then each one's held-out part, in that order.
    holdout: Option<(f64, usize)>,
}

impl Plan {
    fn new(args: &CompareArgs) -> anyhow::Result<Plan> {
        let seeds = seeds_of(args)?;
        let resample = args.resample.default_resample()?;
        let holdout = holdout_fraction(args.holdout)?;
        let mut read = InputsHash::new();
        let scenarios: Vec<Scenario> = args
            .scenarios
            .iter()
            .map(|p| Ok(read_scenario(p, &mut read)?.with_resample_default(resample)))
            .collect::<anyhow::Result<_>>()?;
        let asked = scenarios.len();
        let scenarios = crate::lab::with_held_out_parts(scenarios, holdout)?;
        let policies: Vec<Vec<PolicyConfig>> = scenarios
            .iter()
            .map(|s| super::run::policies_for(s, &args.policies))
            .collect::<anyhow::Result<_>>()?;
        let mut comparisons: Vec<ScenarioComparison> = Vec::new();
        for (sc, ps) in scenarios.iter().zip(&policies) {
            let mut c = ScenarioComparison::new(
                sc.name.clone(),
                sc.description.clone(),
                ps.iter().map(PolicySeeds::of).collect(),
            );
            c.baseline = baseline_index(args.baseline.as_deref(), sc, ps)?;
            c.seed_meaning = seed_meaning(sc)?;
            c.slo = Some(sc.setup.slo);
            comparisons.push(c);
        }
        Ok(Plan {
            args: args.clone(),
            scenarios,
            policies,
            comparisons,
            seeds,
            read,
            holdout: holdout.map(|f| (f, asked)),
        })
    }

    /// The units shards are dealt: with a fixed seed count, (scenario, seed ordinal) — every
    /// policy on it; with `--seeds auto`, a scenario, whose seeds grow until its own paired
    /// differences are precise (each scenario's stopping depends on its runs only).
    fn unit_list(&self) -> Vec<(usize, Option<usize>)> {
        match self.seeds {
            Seeds::Fixed(n) => (0..self.scenarios.len())
                .flat_map(|i| (0..n).map(move |k| (i, Some(k))))
                .collect(),
            Seeds::Auto(_) => (0..self.scenarios.len()).map(|i| (i, None)).collect(),
        }
    }

    /// One batch of (scenario, seed ordinal): every policy on each, in parallel; the results
    /// come back in job order, so the outputs do not depend on the thread count.
    fn run_batch(
        &self,
        batch: &[(usize, usize)],
        bar: Option<&indicatif::ProgressBar>,
    ) -> anyhow::Result<Vec<(u64, Vec<CompareRun>)>> {
        let mut jobs = Vec::new();
        for &(i, k) in batch {
            let sc = &self.scenarios[i];
            for p in &self.policies[i] {
                jobs.push(Job {
                    scenario: sc,
                    policy: p,
                    seed: seed_of(sc.setup.seed, k),
                    rows: false,
                });
            }
        }
        if let Some(b) = bar {
            b.inc_length(jobs.len() as u64);
        }
        let outcomes = run_all(&jobs, &|| {
            if let Some(b) = bar {
                b.inc(1);
            }
        })?;
        let mut next = jobs.iter().zip(outcomes);
        let mut results = Vec::with_capacity(batch.len());
        for &(i, k) in batch {
            let sc = &self.scenarios[i];
            let mut runs = Vec::with_capacity(self.policies[i].len());
            for (p, policy) in self.policies[i].iter().enumerate() {
                let (job, o) = next.next().context("one outcome per job")?;
                runs.push(CompareRun {
                    scenario: i,
                    ordinal: k,
                    policy: p,
                    seed: job.seed,
                    summary: RunSummary::from_metrics(&o.metrics),
                    // Only the first seed's distribution is drawn (the CDF chart).
                    e2e: (k == 0).then(|| o.metrics.e2e.clone()),
                    requests: o.metrics.requests,
                    perf: PerfRun {
                        scenario: sc.name.clone(),
                        policy: policy.name.clone(),
                        seed: job.seed,
                        wall_s: o.wall_s,
                        sim_events: o.metrics.events,
                        simulated_s: o.metrics.end_ns as f64 / 1e9,
                    },
                });
            }
            results.push((seed_of(sc.setup.seed, k), runs));
        }
        Ok(results)
    }

    /// Seed ordinal `k` of scenario `i`: every policy's record, taken from `found` (and noted
    /// in `used`, the records the outputs count).
    fn seed_runs(
        &self,
        found: &mut Found<'_, Plan>,
        used: &mut Vec<CompareRun>,
        i: usize,
        k: usize,
    ) -> anyhow::Result<(u64, Vec<CompareRun>)> {
        let runs = (0..self.policies[i].len())
            .map(|p| found.take(&(i, k, p)))
            .collect::<Result<Vec<_>, _>>()?;
        used.extend(runs.iter().cloned());
        Ok((seed_of(self.scenarios[i].setup.seed, k), runs))
    }

    /// The comparisons built from every unit's records, as a single run builds them, and the
    /// records they used in report order.
    fn assemble(
        &self,
        mut found: Found<'_, Plan>,
    ) -> anyhow::Result<(Vec<ScenarioComparison>, Vec<CompareRun>, String)> {
        let mut used = Vec::new();
        let mut comparisons = self.comparisons.clone();
        let seeds_note = match self.seeds {
            Seeds::Fixed(n) => {
                for (i, c) in comparisons.iter_mut().enumerate() {
                    for k in 0..n {
                        let (seed, runs) = self.seed_runs(&mut found, &mut used, i, k)?;
                        for (p, r) in c.policies.iter_mut().zip(&runs) {
                            r.push_to(p, seed);
                        }
                    }
                }
                format!("{n} seeds each")
            }
            Seeds::Auto(auto) => {
                grow_seeds(&mut comparisons, &auto, |batch| {
                    batch
                        .iter()
                        .map(|&(i, k)| self.seed_runs(&mut found, &mut used, i, k))
                        .collect()
                })?;
                format!(
                    "`--seeds auto` (from {} to at most {} seeds per scenario, until every paired \
                     difference from the baseline on the key metrics had a 95 % half-width within {} % \
                     of the baseline's mean)",
                    auto.start,
                    auto.max,
                    auto.rel_half_width * 100.0
                )
            }
        };
        used.sort_by_key(|r| r.key());
        Ok((comparisons, used, seeds_note))
    }
}

impl Sharded for Plan {
    type Record = CompareRun;
    type Error = anyhow::Error;
    const COMMAND: &'static str = "compare";

    fn units(&self) -> usize {
        self.unit_list().len()
    }

    fn unit_of(&self, &(i, k, p): &RecordKey<Self>) -> Option<usize> {
        if i >= self.scenarios.len() || p >= self.policies[i].len() {
            return None;
        }
        match self.seeds {
            Seeds::Fixed(n) => (k < n).then_some(i * n + k),
            Seeds::Auto(auto) => (k < auto.max).then_some(i),
        }
    }

    fn describe(&self, &(i, k, p): &RecordKey<Self>) -> String {
        format!(
            "`{}`, seed ordinal {k}, policy `{}`",
            self.scenarios[i].name, self.policies[i][p].name
        )
    }

    /// The scenarios as parsed, what they read, and the options.
    fn inputs_hash(&self) -> anyhow::Result<u64> {
        let mut hash = self.read.clone();
        for sc in &self.scenarios {
            hash.scenario_reads(sc)?;
        }
        let options = canonical_options(&self.args);
        Ok(hash.item("options", options.as_bytes()).finish())
    }

    /// One record per simulation.
    fn run_units(&self, units: &[usize]) -> anyhow::Result<Vec<CompareRun>> {
        let all = self.unit_list();
        let owned: Vec<(usize, Option<usize>)> = units.iter().map(|&u| all[u]).collect();
        let bar = progress(0, "compare");
        let mut records = Vec::new();
        match self.seeds {
            Seeds::Fixed(_) => {
                let batch: Vec<(usize, usize)> =
                    owned.iter().map(|&(i, k)| (i, k.unwrap_or(0))).collect();
                for (_, runs) in self.run_batch(&batch, bar.as_ref())? {
                    records.extend(runs);
                }
            }
            Seeds::Auto(auto) => {
                let scenarios: Vec<usize> = owned.iter().map(|&(i, _)| i).collect();
                let mut mine: Vec<ScenarioComparison> = scenarios
                    .iter()
                    .map(|&i| self.comparisons[i].clone())
                    .collect();
                grow_seeds(&mut mine, &auto, |batch| {
                    let batch: Vec<(usize, usize)> =
                        batch.iter().map(|&(j, k)| (scenarios[j], k)).collect();
                    let results = self.run_batch(&batch, bar.as_ref())?;
                    records.extend(results.iter().flat_map(|(_, runs)| runs.iter().cloned()));
                    Ok::<_, anyhow::Error>(results)
                })?;
            }
        }
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        Ok(records)
    }

    fn finish(
        &self,
        found: Found<'_, Plan>,
        timing: Timing,
        out: &mut dyn Write,
        _note: &mut dyn Write,
    ) -> anyhow::Result<ExitCode> {
        finish(self, found, timing, out)
    }
}

/// Run it: the whole job, or with `--shard` one shard's units into a partial result.
pub fn run(args: &CompareArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    lab::run_sharded(&args.shard, || Plan::new(args), out, &mut std::io::sink())
}

/// `routelab merge` of compare partials: the outputs of the whole run from the shards' records.
pub fn merged(args: &CompareArgs, set: MergeSet, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    routelab_lab::sharded::merge(&Plan::new(args)?, set, out, &mut std::io::sink())
}

/// Build the comparisons from the records and write every output.
fn finish(
    plan: &Plan,
    found: Found<'_, Plan>,
    timing: Timing,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let args = &plan.args;
    let (mut comparisons, records, seeds_note) = plan.assemble(found)?;
    // With --holdout: the outputs are the first parts' comparisons, each with the check of
    // its winner on the held-out part.
    let mut names: Vec<&str> = plan.scenarios.iter().map(|s| s.name.as_str()).collect();
    if let Some((f, asked)) = plan.holdout {
        let held = comparisons.split_off(asked);
        names.truncate(asked);
        for (c, h) in comparisons.iter_mut().zip(&held) {
            c.out_of_sample = compare_out_of_sample(c, h, &held_out_text(f));
        }
    }
    let runs = records.len();
    let requests: u64 = records.iter().map(|r| r.requests).sum();
    let total_wall_s = timing.wall_s;
    write_compare(&args.out, &comparisons)?;
    write_perf(
        &args.out,
        &PerfInfo {
            total_wall_s,
            threads: timing.threads,
            runs: records.into_iter().map(|r| r.perf).collect(),
        },
    )?;
    write!(out, "{}", compare_table(&comparisons))?;
    if let Some(f) = &args.findings {
        // Keep the sections `capacity --findings` and `replicas --findings` wrote (each is
        // generated separately).
        let kept: Vec<String> = std::fs::read_to_string(f)
            .map(|old| findings::kept_sections(&old))
            .unwrap_or_default();
        let md = findings_document(&names, &seeds_note, &comparisons, &kept);
        if let Some(parent) = f.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("{}: cannot create", parent.display()))?;
        }
        std::fs::write(f, md).with_context(|| format!("{}: cannot write", f.display()))?;
        writeln!(out, "findings: {}", f.display())?;
    }
    writeln!(
        out,
        "\n{runs} runs, {requests} requests simulated in {total_wall_s:.2} s wall on {} threads",
        timing.threads
    )?;
    writeln!(out, "report: {}", args.out.join("report.html").display())?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: CompareArgs,
    }

    fn seeds(argv: &[&str]) -> Result<Seeds, InputError> {
        let mut full = vec!["compare", "s.yaml"];
        full.extend_from_slice(argv);
        seeds_of(&Cli::parse_from(full).args)
    }

    #[test]
    fn seeds_are_a_count_or_auto_with_its_bounds() {
        assert_eq!(seeds(&[]).unwrap(), Seeds::Fixed(5));
        assert_eq!(seeds(&["--seeds", "3"]).unwrap(), Seeds::Fixed(3));
        assert_eq!(
            seeds(&["--seeds", "auto"]).unwrap(),
            Seeds::Auto(AutoSeeds::default())
        );
        let Seeds::Auto(a) =
            seeds(&["--seeds", "auto", "--max-seeds", "9", "--precision", "0.02"]).unwrap()
        else {
            panic!("auto")
        };
        assert_eq!((a.max, a.rel_half_width), (9, 0.02));
        for (argv, field, says) in [
            (&["--seeds", "0"][..], "--seeds", "whole number"),
            (&["--seeds", "many"][..], "--seeds", "not a number of seeds"),
            (&["--seeds", "2.5"][..], "--seeds", "whole number"),
            // At most MAX_SEEDS_LIMIT, like `--max-seeds` (a count is a list that long).
            (&["--seeds", "1001"][..], "--seeds", "from 1 to 1000"),
            (
                &["--seeds", "18446744073709551615"][..],
                "--seeds",
                "from 1 to 1000",
            ),
            (
                &["--seeds", "auto", "--max-seeds", "1"][..],
                "--max-seeds",
                "from 2 to 1000",
            ),
            (
                &["--seeds", "auto", "--precision", "1.5"][..],
                "--precision",
                "< 1",
            ),
            (
                &["--seeds", "auto", "--precision", "0"][..],
                "--precision",
                "> 0",
            ),
            (
                &["--seeds", "4", "--precision", "0.1"][..],
                "--precision",
                "auto",
            ),
        ] {
            let e = seeds(argv).unwrap_err();
            assert_eq!(e.file, COMMAND_LINE, "{argv:?}");
            assert_eq!(e.field, field, "{argv:?}");
            assert!(e.to_string().contains(says), "{argv:?}: {e}");
        }
    }
}
