//! # routelab-reports
//!
//! Everything routelab writes for people and scripts, built from the simulator's result types
//! only (`routelab-sim`):
//!
//! - [`write_run`]: `summary.json`, `requests.csv`, `timeline.csv`, charts (SVG + PNG) and a
//!   self-contained `report.html` for `routelab run`; [`write_perf`] for wall-clock figures.
//! - [`write_compare`]: `compare.json`, `compare.csv`, `compare_seeds.csv`, charts and
//!   `report.html` for `routelab compare` (mean and 95 % interval across seeds, winners, the
//!   paired difference of every policy from a baseline; `--seeds auto` grows them in `routelab-lab`);
//!   [`findings_markdown`] for `docs/findings.md`.
//! - [`write_sweep`]: `sweep.csv` and a chart for `routelab sweep`.
//! - [`run_table`], [`summary_table`], [`compare_table`], [`sweep_table`]: aligned plain-text
//!   tables for the terminal.
//! - [`capacity`]: `routelab capacity` — the SLO spec, what the per-seed capacity search and
//!   the study across policies and seeds found (plain data; the search and the study runner
//!   are `routelab-lab`'s), and its outputs.
//! - [`profile_text`], [`write_profile_chart`]: a hardware profile's curve and fields for
//!   `routelab profile show`, and its chart; [`fit_report`], `routelab profile fit`'s check of
//!   the fitted profile against its inputs.
//! - [`h2h`]: `routelab h2h`'s `runs.csv`, its "Against the originals" findings and charts.
//! - [`metric`]: the one metric catalog every output takes its metrics from.
//! - [`gate`]: the gate's report (verdicts against the baselines, invariants) that the
//!   exporters write; the gate itself (suite, baselines, measuring) is `routelab-lab`'s.
//! - [`export`]: output formats (table, JSON, Markdown, CSV, HTML) behind [`Exporter`].
//!
//! **Determinism**: every file except `perf.json` is a pure function of the inputs — no
//! timestamps, no hash-map order, figures rounded to 6 significant digits (JSON) or fixed
//! decimals (CSV), NaN written as `null` / an empty cell. Charts use the bundled DejaVu Sans
//! through plotters' `ab_glyph` backend, so no system font library is involved.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod capacity;
mod chart;
mod compare;
mod error;
pub mod export;
pub mod findings;
pub mod gate;
pub mod h2h;
pub mod holdout;
mod interval_text;
pub mod metric;
mod num;
mod perf;
pub mod plan;
mod profile;
mod question;
mod requests_csv;
pub use requests_csv::{RequestsCsvStream, RowSink};
pub mod replicas;
mod run;
pub mod stats;
pub mod summary;
mod sweep;

pub use compare::{
    AutoSeedsRule, PairedDiff, SeedResult, Verdict, findings_baseline_markdown,
    reported_differences,
};
pub use compare::{
    CompareFile, MetricStats, PolicySeeds, PolicyStats, ScenarioComparison, ScenarioStats, SeedRun,
    Winner, compare_file, compare_table, findings_document, findings_markdown, headline_metric,
    interval, paired_diff, winner, write_compare,
};
pub use error::ReportError;
pub use export::{Exporter, Format};
pub use gate::GateReport;
pub use metric::{CATALOG, Direction, Metric, Unit};
pub use perf::{PerfInfo, PerfRun, write_perf};
pub use profile::{fit_report, profile_concurrencies, profile_text, write_profile_chart};
pub use run::{
    PolicyRun, RunEntry, RunMeta, SummaryFile, Written, run_table, summary_file, summary_table,
    write_run,
};
pub use summary::{ReplicaSummary, RunSummary, WorkerSummary};
pub use sweep::{SweepRow, sweep_table, write_sweep};
