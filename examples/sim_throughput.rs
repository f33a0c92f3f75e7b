//! Release measurement of the simulator: requests simulated per CPU-second and peak memory.
//!
//! ```text
//! cargo run --release --example sim_throughput -- scenarios/bench/fleet-64.yaml [REQUESTS]
//! ```
//! REQUESTS overrides the `count` of count-limited generators (e.g. 10000000 for the memory
//! check). Per-request output is off. Linux only for the CPU-time and RSS figures.

use routelab_sim::{Scenario, TrafficSpec, run};
use std::time::Instant;

fn cpu_seconds() -> Option<f64> {
    // utime + stime, fields 14 and 15 of /proc/self/stat, in clock ticks (100 Hz on Linux).
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: sim_throughput SCENARIO [REQUESTS]")?;
    let requests: Option<u64> = args.next().map(|s| s.parse()).transpose()?;
    let mut sc = Scenario::load(&path)?;
    if let Some(n) = requests {
        for t in &mut sc.traffic {
            if let TrafficSpec::Poisson(c) = t {
                c.until.count = Some(n);
            }
        }
    }
    for policy in &sc.policies {
        let mut traffic = sc.traffic_source(sc.setup.seed)?;
        let cpu0 = cpu_seconds();
        let wall0 = Instant::now();
        let m = run(&sc.setup, policy, &mut *traffic, None)?;
        let wall = wall0.elapsed().as_secs_f64();
        let cpu = match (cpu0, cpu_seconds()) {
            (Some(a), Some(b)) if b > a => b - a,
            _ => wall,
        };
        println!(
            "{} / {}: {} requests ({} completed), {} events, simulated {:.0} s in {:.2} s CPU ({:.2} s wall): {:.0} requests per CPU-second; p50 e2e {:.2} s; peak RSS {:.0} MB",
            sc.name,
            policy.name,
            m.requests,
            m.completed,
            m.events,
            m.end_ns as f64 / 1e9,
            cpu,
            wall,
            m.requests as f64 / cpu,
            m.e2e.quantile_secs(0.5).unwrap_or(f64::NAN),
            peak_rss_mb().unwrap_or(f64::NAN),
        );
    }
    Ok(())
}
