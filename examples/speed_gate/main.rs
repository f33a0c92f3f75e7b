//! The speed gate: instruction counts of the simulator and of the router's decisions, counted by
//! valgrind (deterministic, unlike time on a shared machine), against committed references.
//!
//! ```text
//! cargo run --release --example speed_gate                         # check
//! cargo run --release --example speed_gate -- --tolerance 2        # check against a 2 % budget
//! cargo run --release --example speed_gate -- --inject-slowdown 5  # check, then show that 5 % more fails (CI)
//! cargo run --release --example speed_gate -- --update             # take new references
//! ```
//!
//! Each case (`workload.rs`: `fleet-64` at 100,000 requests, `fleet-10k` cut to 10,000, the
//! decision bench's `seed-v3` with and without a 64-block prefix at 64 and 10,240 workers) runs
//! twice in a child process of this program under cachegrind: once through its setup only, once
//! through setup and measured part. The difference is the measured part's count; divided by the
//! requests or decisions, it is compared with `benches/speed-gate.yaml`. A count above its
//! reference by more than the file's tolerance fails the gate (exit 1); errors exit 2.
//!
//! `--inject-slowdown P` is the gate's own test (CI runs it): after the check, each case runs
//! again with deliberate work in its measured path — a loop run once per request (inside the
//! simulation: in the traffic the simulator pulls) or per decision, sized to P % of the case's
//! reference from counted costs — and the run succeeds only if the check passed and the same
//! comparison fails every slowed case. What the counts are, their run-to-run variation and when
//! `--update` is legitimate: `docs/performance.md`, "The speed gate".

#![forbid(unsafe_code)]

// The decision bench's workload; the gate uses its seed-v3 cases only.
#[path = "../../benches/support/decision.rs"]
#[allow(dead_code)]
mod decision;
mod references;
mod valgrind;
mod verdict;
mod workload;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use references::{Reference, References, TakenWith, valid_tolerance};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use valgrind::{Count, Counter, tool_version};
use verdict::{Verdict, judge};
use workload::{CASES, Case, case, case_names, run_case, spin};

/// The repository: scenario paths and the default references file are relative to it.
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The references file, relative to the repository.
const REFERENCES: &str = "benches/speed-gate.yaml";

/// Rounds of the spin loop counted to measure what one round costs.
const CALIBRATION_ROUNDS: u64 = 1_000_000;

#[derive(Debug, Parser)]
#[command(
    name = "speed_gate",
    about = "Instruction counts of the bench fleets and the routing decision under valgrind, \
             against committed references"
)]
struct Cli {
    #[command(subcommand)]
    child: Option<Child>,
    /// Write the counts measured now as the references (of the cases given with --case, else of
    /// all); docs/performance.md says when that is legitimate.
    #[arg(long, conflicts_with = "inject_slowdown")]
    update: bool,
    /// Fail above reference × (1 + PERCENT / 100) instead of the file's tolerance; with
    /// --update, the tolerance to write.
    #[arg(long, value_name = "PERCENT")]
    tolerance: Option<f64>,
    /// Measure only this case (repeatable; default: all).
    #[arg(long = "case", value_name = "NAME")]
    cases: Vec<String>,
    /// The references file [default: benches/speed-gate.yaml in the repository].
    #[arg(long, value_name = "FILE")]
    references: Option<PathBuf>,
    /// After the check, count each case again with PERCENT of its reference added as deliberate
    /// work per request or decision in the measured path; succeed only if the check passed and
    /// every slowed case fails it.
    #[arg(long, value_name = "PERCENT")]
    inject_slowdown: Option<f64>,
    /// Valgrind processes at once [default: the cores available].
    #[arg(long, value_name = "N")]
    jobs: Option<usize>,
    /// The valgrind to run (a path, or a name looked up on PATH).
    #[arg(long, value_name = "PATH", default_value = "valgrind")]
    valgrind: PathBuf,
}

/// What the gate runs under valgrind: this program again.
#[derive(Debug, Subcommand)]
enum Child {
    /// Run one case: its setup and, unless --setup-only, its measured part.
    #[command(hide = true)]
    Workload {
        case: String,
        /// Requests or decisions [default: the case's].
        #[arg(long)]
        units: Option<u64>,
        #[arg(long)]
        setup_only: bool,
        /// Rounds of deliberate work per request or decision.
        #[arg(long, default_value_t = 0)]
        spin: u64,
    },
    /// Run the deliberate-work loop ROUNDS times (to measure one round's cost).
    #[command(hide = true)]
    Spin { rounds: u64 },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.child {
        Some(child) => run_child(child).map(|()| true),
        None => gate(&cli),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("speed_gate: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// In the child: run what was asked and print its outcome for the gate.
fn run_child(child: &Child) -> anyhow::Result<()> {
    let outcome = match child {
        Child::Workload {
            case: name,
            units,
            setup_only,
            spin: rounds,
        } => {
            let c = case(name)
                .with_context(|| format!("unknown case `{name}`; valid: {}", case_names()))?;
            // The gate starts the child in the repository, so paths stay short and the same
            // in every checkout.
            let units = units.unwrap_or(c.units);
            run_case(c, units, Path::new(""), *setup_only, *rounds)?
        }
        Child::Spin { rounds } => spin(*rounds),
    };
    println!("outcome {outcome}");
    Ok(())
}

/// One valgrind run.
struct Job {
    label: String,
    args: Vec<String>,
}

impl Job {
    fn workload(case: &Case, setup_only: bool, spin: u64) -> Job {
        Job::workload_over(case, None, setup_only, spin)
    }

    /// `case` over `units` (`None`: the case's own).
    fn workload_over(case: &Case, units: Option<u64>, setup_only: bool, spin: u64) -> Job {
        let mut args = vec!["workload".to_string(), case.name.to_string()];
        let mut label = case.name.to_string();
        if let Some(u) = units {
            args.push(format!("--units={u}"));
            label.push_str(&format!("-{u}"));
        }
        if setup_only {
            args.push("--setup-only".into());
            label.push_str("-setup");
        }
        if spin > 0 {
            args.push(format!("--spin={spin}"));
            label.push_str(&format!("-spin{spin}"));
        }
        Job { label, args }
    }

    fn spin(rounds: u64) -> Job {
        Job {
            label: format!("spin-{rounds}"),
            args: vec!["spin".into(), rounds.to_string()],
        }
    }
}

/// Count every job, `parallel` at a time, in order of start (results in the jobs' order).
fn count_all(counter: &Counter, jobs: &[Job], parallel: usize) -> anyhow::Result<Vec<Count>> {
    let exe = std::env::current_exe().context("cannot find this program's path")?;
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<anyhow::Result<Count>>>> =
        jobs.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..parallel.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(i) else { break };
                    let r = counter.count(&job.label, &exe, &job.args, Path::new(ROOT));
                    *results[i].lock().expect("no panics hold this lock") = Some(r);
                }
            });
        }
    });
    results
        .into_iter()
        .map(|r| {
            r.into_inner()
                .expect("no panics hold this lock")
                .expect("every job ran")
        })
        .collect()
}

/// A case's measured part: instructions and outcome.
#[derive(Debug, Clone, Copy)]
struct Measured {
    case: &'static Case,
    instructions: u64,
    outcome: u64,
}

/// Count the measured part of each `(case, rounds of deliberate work per unit)` run; each
/// case's setup is counted once and taken off each of its runs.
fn measure(
    counter: &Counter,
    runs: &[(&'static Case, u64)],
    parallel: usize,
) -> anyhow::Result<Vec<Measured>> {
    let mut setups: Vec<&'static Case> = Vec::new();
    for (c, _) in runs {
        if !setups.contains(c) {
            setups.push(c);
        }
    }
    // Whole runs first, in the order given (longest first), then the setups.
    let mut jobs: Vec<Job> = runs
        .iter()
        .map(|&(c, rounds)| Job::workload(c, false, rounds))
        .collect();
    jobs.extend(setups.iter().map(|c| Job::workload(c, true, 0)));
    let counts = count_all(counter, &jobs, parallel)?;
    let (whole, setup) = counts.split_at(runs.len());
    runs.iter()
        .zip(whole)
        .map(|(&(case, _), w)| {
            let s = setup[setups.iter().position(|c| *c == case).expect("counted")];
            let instructions = w
                .instructions
                .checked_sub(s.instructions)
                .with_context(|| {
                    format!(
                        "{}: the setup alone counted {} instructions, more than the whole run's {}",
                        case.name, s.instructions, w.instructions
                    )
                })?;
            Ok(Measured {
                case,
                instructions,
                outcome: w.outcome,
            })
        })
        .collect()
}

/// What injected work costs, counted: one round of [`spin`], and the fixed cost of injecting
/// at all, per request (the traffic wrapper and the call) and per decision (the call).
#[derive(Debug, Clone, Copy)]
struct Injection {
    per_round: f64,
    per_request: f64,
    per_decision: f64,
}

impl Injection {
    /// Rounds of [`spin`] per unit that add `percent` of `reference` to `case`'s count.
    fn rounds(&self, case: &Case, reference: &Reference, percent: f64) -> anyhow::Result<u64> {
        let fixed = match case.kind {
            workload::Kind::Sim { .. } => self.per_request,
            workload::Kind::Decision { .. } => self.per_decision,
        };
        let wanted = percent / 100.0 * reference.per_unit();
        if wanted < fixed + self.per_round {
            bail!(
                "{}: {percent} % is {wanted:.1} instructions per {}, less than injecting costs \
                 by itself ({:.1})",
                case.name,
                case.unit,
                fixed + self.per_round
            );
        }
        Ok(((wanted - fixed) / self.per_round).round() as u64)
    }
}

/// Count what injecting work costs: [`spin`] over 0 and [`CALIBRATION_ROUNDS`] rounds; and
/// short `fleet-64` and `decision-64` runs over two lengths, each plain and with 1 round per
/// unit. Between the lengths, the extra that 1 round per unit adds grows by the cost per unit of
/// injecting at all plus one round (the extra also holds a fixed part, e.g. a heap laid out
/// differently, which the difference cancels).
fn injection(counter: &Counter, parallel: usize) -> anyhow::Result<Injection> {
    const SHORT: u64 = 2_000;
    const LONGER: u64 = 12_000;
    let sim = case("fleet-64").expect("a case");
    let decision = case("decision-64").expect("a case");
    let mut jobs = vec![Job::spin(0), Job::spin(CALIBRATION_ROUNDS)];
    for c in [sim, decision] {
        for units in [SHORT, LONGER] {
            for rounds in [0, 1] {
                jobs.push(Job::workload_over(c, Some(units), false, rounds));
            }
        }
    }
    let n = count_all(counter, &jobs, parallel)?;
    let i = |j: usize| n[j].instructions as f64;
    let per_round = (i(1) - i(0)) / CALIBRATION_ROUNDS as f64;
    // Jobs 2.. : per case, (SHORT plain, SHORT 1 round, LONGER plain, LONGER 1 round).
    let per_unit = |first: usize| -> anyhow::Result<f64> {
        let extra_short = i(first + 1) - i(first);
        let extra_longer = i(first + 3) - i(first + 2);
        let cost = (extra_longer - extra_short) / (LONGER - SHORT) as f64 - per_round;
        if !(cost > -1.0 && per_round > 0.0) {
            bail!(
                "{}: injecting counted {cost:.1} instructions per unit and {per_round:.2} per round \
                 of the loop; cannot size a slowdown from that",
                jobs[first].label
            );
        }
        Ok(cost.max(0.0))
    };
    Ok(Injection {
        per_round,
        per_request: per_unit(2)?,
        per_decision: per_unit(6)?,
    })
}

/// The cases asked for, in the gate's order.
fn selected(names: &[String]) -> anyhow::Result<Vec<&'static Case>> {
    if names.is_empty() {
        return Ok(CASES.iter().collect());
    }
    for n in names {
        if case(n).is_none() {
            bail!("--case: unknown case `{n}`; valid: {}", case_names());
        }
    }
    Ok(CASES
        .iter()
        .filter(|c| names.iter().any(|n| n == c.name))
        .collect())
}

fn taken_with(counter: &Counter) -> TakenWith {
    TakenWith {
        rustc: tool_version(Path::new("rustc"), "-V"),
        valgrind: counter.version(),
        glibc: tool_version(Path::new("getconf"), "GNU_LIBC_VERSION"),
    }
}

/// Run the gate; `Ok(false)` when it fails (a regression, or a slowdown it did not catch).
fn gate(cli: &Cli) -> anyhow::Result<bool> {
    let started = Instant::now();
    let cases = selected(&cli.cases)?;
    if let Some(t) = cli.tolerance.filter(|t| !valid_tolerance(*t)) {
        bail!("--tolerance: {t} is not valid; valid: a percentage above 0 and below 100");
    }
    if let Some(p) = cli.inject_slowdown.filter(|p| !(p.is_finite() && *p > 0.0)) {
        bail!("--inject-slowdown: {p} is not valid; valid: a percentage above 0");
    }
    let (path, shown) = match &cli.references {
        Some(p) => (p.clone(), p.display().to_string()),
        None => (Path::new(ROOT).join(REFERENCES), REFERENCES.to_string()),
    };
    let old = if cli.update && !path.exists() {
        None
    } else {
        let r = References::read(&path, &shown).map_err(|e| {
            let hint = if cli.update {
                "\n(fix the file, or delete it and run --update again)"
            } else if path.exists() {
                ""
            } else {
                "\n(take references with `cargo run --release --example speed_gate -- --update`)"
            };
            anyhow::anyhow!("{e}{hint}")
        })?;
        if !cli.update {
            r.check_names()?;
            for c in &cases {
                r.for_case(c)?;
            }
        }
        Some(r)
    };
    let parallel = cli
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, std::num::NonZero::get));
    let scratch = std::env::temp_dir().join(format!("routelab-speed-gate-{}", std::process::id()));
    let counter = Counter::new(&cli.valgrind, scratch.clone())?;
    println!(
        "speed gate: {} case(s) under {} (cachegrind), {} at a time{}",
        cases.len(),
        counter.version(),
        parallel,
        if counter.randomisation_off() {
            ", address randomisation off"
        } else {
            " (setarch -R is not allowed here: address randomisation stays on)"
        }
    );
    let outcome = match old {
        None => update(cli, References::empty(shown), &counter, &cases, parallel),
        Some(old) if cli.update => update(cli, old, &counter, &cases, parallel),
        Some(refs) => check(cli, &refs, &counter, &cases, parallel),
    };
    let _ = std::fs::remove_dir_all(&scratch);
    println!("({:.1} s)", started.elapsed().as_secs_f64());
    outcome
}

/// `--update`: measure and write the references.
fn update(
    cli: &Cli,
    mut refs: References,
    counter: &Counter,
    cases: &[&'static Case],
    parallel: usize,
) -> anyhow::Result<bool> {
    let runs: Vec<_> = cases.iter().map(|&c| (c, 0)).collect();
    let measured = measure(counter, &runs, parallel)?;
    println!(
        "{:<29} {:>14} {:>12} {:>12} {:>9}",
        "case", "instructions", "per unit", "was", "change"
    );
    for m in &measured {
        let per_unit = m.instructions as f64 / m.case.units as f64;
        let old = refs
            .cases
            .iter()
            .find(|r| r.case == m.case.name && r.units == m.case.units);
        let (was, change) = match old {
            Some(r) => (
                format!("{:.1}", r.per_unit()),
                format!(
                    "{:+.3} %",
                    judge(m.instructions, r.instructions, 1.0).change_percent
                ),
            ),
            None => ("-".into(), "-".into()),
        };
        println!(
            "{:<29} {:>14} {:>12.1} {:>12} {:>9}  per {}",
            m.case.name, m.instructions, per_unit, was, change, m.case.unit
        );
    }
    let taken = taken_with(counter);
    refs.update(
        measured
            .iter()
            .map(|m| Reference::measured(m.case, m.instructions, m.outcome))
            .collect(),
        taken,
    );
    if let Some(t) = cli.tolerance {
        refs.tolerance_percent = t;
    }
    let path = match &cli.references {
        Some(p) => p.clone(),
        None => Path::new(ROOT).join(REFERENCES),
    };
    std::fs::write(&path, refs.to_yaml())
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!("wrote {}", refs.file);
    Ok(true)
}

/// Check; with --inject-slowdown, also count each case with that share of its reference added
/// as deliberate work and show that the gate fails it.
fn check(
    cli: &Cli,
    refs: &References,
    counter: &Counter,
    cases: &[&'static Case],
    parallel: usize,
) -> anyhow::Result<bool> {
    let tolerance = cli.tolerance.unwrap_or(refs.tolerance_percent);
    let references: Vec<&Reference> = cases
        .iter()
        .map(|c| refs.for_case(c))
        .collect::<Result<_, _>>()?;
    let rounds: Option<Vec<u64>> = match cli.inject_slowdown {
        None => None,
        Some(percent) => {
            let cost = injection(counter, parallel)?;
            println!(
                "injection counted: {:.2} instructions per round of the loop; {:.1} per request and \
                 {:.1} per decision to inject at all",
                cost.per_round, cost.per_request, cost.per_decision
            );
            Some(
                cases
                    .iter()
                    .zip(&references)
                    .map(|(c, r)| cost.rounds(c, r, percent))
                    .collect::<anyhow::Result<_>>()?,
            )
        }
    };
    // Each case plain, then slowed (if asked), longest case first.
    let mut runs = Vec::new();
    for (i, &c) in cases.iter().enumerate() {
        runs.push((c, 0));
        if let Some(r) = &rounds {
            runs.push((c, r[i]));
        }
    }
    let measured = measure(counter, &runs, parallel)?;
    let per_case = if rounds.is_some() { 2 } else { 1 };
    let plain: Vec<&Measured> = measured.iter().step_by(per_case).collect();

    println!(
        "{:<29} {:>14} {:>12} {:>12} {:>9}  verdict (tolerance {tolerance} %)",
        "case", "instructions", "per unit", "reference", "change"
    );
    let mut slower = 0;
    let mut notes = Vec::new();
    for (m, r) in plain.iter().zip(&references) {
        let j = judge(m.instructions, r.instructions, tolerance);
        let verdict = match j.verdict {
            Verdict::Within => "ok",
            Verdict::Slower => {
                slower += 1;
                "SLOWER"
            }
            Verdict::Faster => {
                notes.push(format!(
                    "{}: faster than its reference by {:.2} %: take new references \
                     (--update) to keep the gain from being spent unnoticed",
                    m.case.name, -j.change_percent
                ));
                "faster"
            }
        };
        println!(
            "{:<29} {:>14} {:>12.1} {:>12.1} {:>+8.3} %  {verdict}  (per {})",
            m.case.name,
            m.instructions,
            m.instructions as f64 / m.case.units as f64,
            r.per_unit(),
            j.change_percent,
            m.case.unit
        );
        if m.outcome != r.outcome {
            notes.push(format!(
                "{}: the measured part computed something else than when the reference was \
                 taken (outcome {}, reference {}): the counts compare different work; if that \
                 change is intended, take new references (--update)",
                m.case.name, m.outcome, r.outcome
            ));
        }
    }
    let now = taken_with(counter);
    if now != refs.taken_with {
        notes.push(format!(
            "the references were taken with {} / {} / {}; this run uses {} / {} / {} (a \
             toolchain or C library change moves counts by itself)",
            refs.taken_with.rustc,
            refs.taken_with.valgrind,
            refs.taken_with.glibc,
            now.rustc,
            now.valgrind,
            now.glibc
        ));
    }
    for n in &notes {
        println!("note: {n}");
    }
    let passed = slower == 0;
    if passed {
        println!("speed gate passed");
    } else {
        println!(
            "speed gate FAILED: {slower} case(s) slower than their reference by more than \
             {tolerance} % (docs/performance.md, \"The speed gate\")"
        );
    }
    let (Some(percent), Some(rounds)) = (cli.inject_slowdown, rounds) else {
        return Ok(passed);
    };
    println!(
        "\nthe same cases with {percent} % of each reference added as deliberate work per request \
         or decision:"
    );
    println!(
        "{:<29} {:>14} {:>12} {:>12} {:>9} {:>14}  verdict",
        "case", "instructions", "per unit", "rounds/unit", "vs plain", "vs reference"
    );
    let mut caught = 0;
    for ((m, p), (r, rounds)) in measured
        .iter()
        .skip(1)
        .step_by(2)
        .zip(&plain)
        .zip(references.iter().zip(&rounds))
    {
        let j = judge(m.instructions, r.instructions, tolerance);
        let verdict = if j.verdict == Verdict::Slower {
            caught += 1;
            "caught"
        } else {
            "MISSED"
        };
        println!(
            "{:<29} {:>14} {:>12.1} {:>12} {:>+8.3} % {:>+12.3} %  {verdict}",
            m.case.name,
            m.instructions,
            m.instructions as f64 / m.case.units as f64,
            rounds,
            judge(m.instructions, p.instructions, tolerance).change_percent,
            j.change_percent,
        );
    }
    if caught == cases.len() {
        println!("the gate catches the injected {percent} % slowdown in every case");
    } else {
        println!(
            "the gate MISSED the injected {percent} % slowdown in {} of {} case(s)",
            cases.len() - caught,
            cases.len()
        );
    }
    Ok(passed && caught == cases.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn injection_sizes_the_loop_to_the_share_less_the_fixed_cost() {
        let cost = Injection {
            per_round: 7.0,
            per_request: 63.0,
            per_decision: 10.0,
        };
        let sim = case("fleet-64").unwrap();
        let reference = Reference::measured(sim, 515_810_166, 0);
        // 5 % of 5,158.1 = 257.9; less 63 for the wrapper = 194.9 = 27.8 rounds of 7
        assert_eq!(cost.rounds(sim, &reference, 5.0).unwrap(), 28);
        let decision = case("decision-64").unwrap();
        let reference = Reference::measured(decision, 51_618_684, 0);
        // 5 % of 516.2 = 25.8; less 10 = 15.8 = 2.3 rounds
        assert_eq!(cost.rounds(decision, &reference, 5.0).unwrap(), 2);
        // 1 % of 516.2 = 5.2 is less than injecting costs by itself
        let e = cost.rounds(decision, &reference, 1.0).unwrap_err();
        assert!(e.to_string().contains("less than injecting costs"), "{e}");
    }

    #[test]
    fn cases_are_selected_by_name_in_the_gates_order() {
        assert_eq!(selected(&[]).unwrap().len(), CASES.len());
        let names = |v: Vec<&Case>| v.iter().map(|c| c.name).collect::<Vec<_>>();
        assert_eq!(
            names(selected(&["decision-64".into(), "fleet-64".into()]).unwrap()),
            ["fleet-64", "decision-64"]
        );
        let e = selected(&["fleet-65".into()]).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("--case: unknown case `fleet-65`; valid: "),
            "{e}"
        );
    }
}
