//! `routelab h2h`'s own outputs (issue 39): `runs.csv`, one row per real-time run of a router
//! in front of the emulated fleet; the "Against the originals" part of `docs/findings.md`
//! ([`findings`]); and the head-to-head's charts ([`write_h2h_charts`]).
//!
//! `runs.csv` is also the command's input when it re-renders its findings from runs already
//! made (`routelab h2h --reuse`), so it is written and read here, in one place.

mod charts;
pub mod findings;

pub use charts::write_h2h_charts;

use crate::error::ReportError;
use routelab_sim::RunMetrics;
use std::fmt::Write as _;
use std::path::Path;

/// One run: a router at a load and seed, what it measured.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    /// Load scale of the scenario's traffic.
    pub load: f64,
    /// The router, as `--routers` names it (`ours`, `sglang:cache_aware`, …).
    pub router: String,
    /// The seed.
    pub seed: u64,
    /// Requests sent.
    pub requests: u64,
    /// Requests completed.
    pub completed: u64,
    /// Requests failed.
    pub failed: u64,
    /// Requests rejected.
    pub rejected: u64,
    /// Share of the requests that met the scenario's SLO.
    pub slo_attainment: Option<f64>,
    /// TTFT mean, p50, p99 (scenario seconds).
    pub ttft_s: [Option<f64>; 3],
    /// TPOT p50, p99 (scenario seconds).
    pub tpot_s: [Option<f64>; 2],
    /// End-to-end mean, p50, p99 (scenario seconds).
    pub e2e_s: [Option<f64>; 3],
    /// Each worker's share of the requests, in [`Runs::workers`] order.
    pub shares: Vec<Option<f64>>,
}

impl RunRow {
    /// The row of one run's metrics, its shares in `workers`' order (a worker the run never
    /// named counts 0).
    pub fn of(load: f64, router: &str, seed: u64, m: &RunMetrics, workers: &[String]) -> RunRow {
        let total: u64 = m.workers.iter().map(|w| w.requests).sum();
        let shares = workers
            .iter()
            .map(|w| {
                let n = m
                    .workers
                    .iter()
                    .find(|x| &x.name == w)
                    .map_or(0, |x| x.requests);
                (total > 0).then(|| n as f64 / total as f64)
            })
            .collect();
        RunRow {
            load,
            router: router.to_string(),
            seed,
            requests: m.requests,
            completed: m.completed,
            failed: m.failed,
            rejected: m.rejected,
            slo_attainment: m.slo_attainment(),
            ttft_s: [
                m.ttft.mean_secs(),
                m.ttft.quantile_secs(0.5),
                m.ttft.quantile_secs(0.99),
            ],
            tpot_s: [m.tpot.quantile_secs(0.5), m.tpot.quantile_secs(0.99)],
            e2e_s: [
                m.e2e.mean_secs(),
                m.e2e.quantile_secs(0.5),
                m.e2e.quantile_secs(0.99),
            ],
            shares,
        }
    }
}

/// Every run of one `routelab h2h` invocation (one scenario).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Runs {
    /// The fleet's workers, the order of every row's shares.
    pub workers: Vec<String>,
    /// The runs, in the order they were made.
    pub rows: Vec<RunRow>,
}

const HEAD: [&str; 16] = [
    "load",
    "router",
    "seed",
    "requests",
    "completed",
    "failed",
    "rejected",
    "slo_attainment",
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p99_s",
    "e2e_mean_s",
    "e2e_p50_s",
    "e2e_p99_s",
];

const SHARE: &str = "share:";

impl Runs {
    /// `runs.csv`: the columns of [`RunRow`], then `share:WORKER` per worker. Floats print as
    /// Rust's shortest exact decimal, a missing value as an empty cell.
    pub fn to_csv(&self) -> String {
        let mut s = HEAD.join(",");
        for w in &self.workers {
            let _ = write!(s, ",{SHARE}{w}");
        }
        s.push('\n');
        let o = |x: Option<f64>| x.map(|v| format!("{v}")).unwrap_or_default();
        for r in &self.rows {
            let _ = write!(
                s,
                "{},{},{},{},{},{},{},{}",
                r.load,
                r.router,
                r.seed,
                r.requests,
                r.completed,
                r.failed,
                r.rejected,
                o(r.slo_attainment)
            );
            for v in r.ttft_s.iter().chain(&r.tpot_s).chain(&r.e2e_s) {
                let _ = write!(s, ",{}", o(*v));
            }
            for v in &r.shares {
                let _ = write!(s, ",{}", o(*v));
            }
            s.push('\n');
        }
        s
    }

    /// Write [`Runs::to_csv`] to `path`.
    pub fn write(&self, path: &Path) -> Result<(), ReportError> {
        std::fs::write(path, self.to_csv()).map_err(|source| ReportError::Write {
            file: path.to_path_buf(),
            source,
        })
    }

    /// Read a `runs.csv` that [`Runs::write`] wrote; an error names the file, line and column.
    pub fn read(path: &Path) -> Result<Runs, ReportError> {
        let text = std::fs::read_to_string(path).map_err(|e| ReportError::Input {
            file: path.to_path_buf(),
            message: format!("cannot read: {e}"),
        })?;
        Runs::parse(&text, path)
    }

    /// Parse the text of a `runs.csv` (`file` names it in errors).
    pub fn parse(text: &str, file: &Path) -> Result<Runs, ReportError> {
        let bad = |line: usize, message: String| ReportError::Input {
            file: file.to_path_buf(),
            message: format!("line {line}: {message}"),
        };
        let mut lines = text.lines();
        let head: Vec<&str> = lines
            .next()
            .ok_or_else(|| bad(1, "empty; expected the header of runs.csv".into()))?
            .split(',')
            .collect();
        if head.len() < HEAD.len() || head[..HEAD.len()] != HEAD {
            return Err(bad(
                1,
                format!("header is not runs.csv's; expected `{}`", HEAD.join(",")),
            ));
        }
        let mut workers = Vec::new();
        for h in &head[HEAD.len()..] {
            let w = h.strip_prefix(SHARE).ok_or_else(|| {
                bad(
                    1,
                    format!("column `{h}`: expected share:WORKER after the fixed columns"),
                )
            })?;
            workers.push(w.to_string());
        }
        let mut rows = Vec::new();
        for (i, line) in lines.enumerate() {
            let n = i + 2;
            if line.is_empty() {
                continue;
            }
            let cells: Vec<&str> = line.split(',').collect();
            if cells.len() != head.len() {
                return Err(bad(
                    n,
                    format!("{} cells; expected {}", cells.len(), head.len()),
                ));
            }
            let float = |k: usize| -> Result<Option<f64>, ReportError> {
                if cells[k].is_empty() {
                    return Ok(None);
                }
                cells[k].parse::<f64>().map(Some).map_err(|_| {
                    bad(
                        n,
                        format!("column `{}`: `{}` is not a number", head[k], cells[k]),
                    )
                })
            };
            let uint = |k: usize| -> Result<u64, ReportError> {
                cells[k].parse::<u64>().map_err(|_| {
                    bad(
                        n,
                        format!(
                            "column `{}`: `{}` is not a whole number >= 0",
                            head[k], cells[k]
                        ),
                    )
                })
            };
            let load = float(0)?.ok_or_else(|| bad(n, "column `load` is empty".into()))?;
            rows.push(RunRow {
                load,
                router: cells[1].to_string(),
                seed: uint(2)?,
                requests: uint(3)?,
                completed: uint(4)?,
                failed: uint(5)?,
                rejected: uint(6)?,
                slo_attainment: float(7)?,
                ttft_s: [float(8)?, float(9)?, float(10)?],
                tpot_s: [float(11)?, float(12)?],
                e2e_s: [float(13)?, float(14)?, float(15)?],
                shares: (HEAD.len()..head.len())
                    .map(float)
                    .collect::<Result<_, _>>()?,
            });
        }
        Ok(Runs { workers, rows })
    }

    /// The loads, in the order first run.
    pub fn loads(&self) -> Vec<f64> {
        let mut out: Vec<f64> = Vec::new();
        for r in &self.rows {
            if !out.contains(&r.load) {
                out.push(r.load);
            }
        }
        out
    }

    /// The routers, in the order first run.
    pub fn routers(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for r in &self.rows {
            if !out.contains(&r.router) {
                out.push(r.router.clone());
            }
        }
        out
    }

    /// The runs of `router` at `load`, by seed.
    pub fn of(&self, load: f64, router: &str) -> Vec<&RunRow> {
        let mut v: Vec<&RunRow> = self
            .rows
            .iter()
            .filter(|r| r.load == load && r.router == router)
            .collect();
        v.sort_by_key(|r| r.seed);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(load: f64, router: &str, seed: u64, att: f64) -> RunRow {
        RunRow {
            load,
            router: router.into(),
            seed,
            requests: 10,
            completed: 9,
            failed: 0,
            rejected: 1,
            slo_attainment: Some(att),
            ttft_s: [Some(0.5), Some(0.25), None],
            tpot_s: [Some(0.02), Some(0.05)],
            e2e_s: [Some(3.0), Some(2.5), Some(9.125)],
            shares: vec![Some(0.6), Some(0.4)],
        }
    }

    #[test]
    fn runs_csv_reads_back_what_it_wrote() {
        let runs = Runs {
            workers: vec!["a".into(), "b-1".into()],
            rows: vec![
                row(0.5, "ours", 1, 0.9),
                row(1.0, "vllm:round_robin", 2, 0.75),
            ],
        };
        let csv = runs.to_csv();
        assert!(csv.starts_with(
            "load,router,seed,requests,completed,failed,rejected,slo_attainment,ttft_mean_s,"
        ));
        assert!(csv.lines().next().unwrap().ends_with(",share:a,share:b-1"));
        assert!(
            csv.contains("\n0.5,ours,1,10,9,0,1,0.9,0.5,0.25,,0.02,0.05,3,2.5,9.125,0.6,0.4\n")
        );
        assert_eq!(Runs::parse(&csv, Path::new("runs.csv")).unwrap(), runs);
        assert_eq!(runs.loads(), vec![0.5, 1.0]);
        assert_eq!(runs.routers(), vec!["ours", "vllm:round_robin"]);
        assert_eq!(runs.of(1.0, "vllm:round_robin").len(), 1);
    }

    #[test]
    fn a_bad_runs_csv_names_its_line_and_column() {
        let p = Path::new("out/runs.csv");
        let e = Runs::parse("load,router\n", p).unwrap_err().to_string();
        assert!(
            e.contains("out/runs.csv: line 1: header is not runs.csv's"),
            "{e}"
        );
        let good = Runs {
            workers: vec!["a".into()],
            rows: vec![],
        }
        .to_csv();
        let e = Runs::parse(&format!("{good}1,ours,x,1,1,0,0,1,,,,,,,,,1\n"), p)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 2: column `seed`: `x` is not a whole number"),
            "{e}"
        );
        let e = Runs::parse(&format!("{good}1,ours\n"), p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2: 2 cells; expected 17"), "{e}");
        let e = Runs::parse(&format!("{good}1,ours,1,1,1,0,0,zz,,,,,,,,,1\n"), p)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("column `slo_attainment`: `zz` is not a number"),
            "{e}"
        );
    }
}
