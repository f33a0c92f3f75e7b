//! Run every policy of a scenario and write the run report, e.g.
//! `cargo run -p routelab-reports --example report_scenario -- scenarios/seed/sixteen-at-once.yaml /tmp/out`.
//! A development aid for looking at the charts; the CLI's `routelab run` is the real front.

use routelab_reports::{PolicyRun, RunMeta, run_table, write_run};
use routelab_sim::{RequestRecord, Scenario};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(out)) = (args.next(), args.next()) else {
        return Err("usage: report_scenario SCENARIO.yaml OUT_DIR".into());
    };
    let sc = Scenario::load(&path)?;
    let seed = sc.setup.seed;
    let mut runs = Vec::new();
    for p in &sc.policies {
        let mut traffic = sc.traffic_source(seed)?;
        let mut rows: Vec<RequestRecord> = Vec::new();
        let m = routelab_sim::run(&sc.setup, p, traffic.as_mut(), Some(&mut rows))?;
        runs.push(PolicyRun::new(m, Some(rows)));
    }
    let written = write_run(
        std::path::Path::new(&out),
        &RunMeta::from_scenario(&sc, seed),
        &runs,
    )?;
    print!("{}", run_table(&runs));
    println!("{} files in {out}", written.files.len());
    Ok(())
}
