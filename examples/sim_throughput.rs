//! Release measurement of the simulator: requests simulated per CPU-second and peak memory.
//!
//! ```text
//! cargo run --release --example sim_throughput -- scenarios/bench/fleet-64.yaml [REQUESTS]
//! ```
//! REQUESTS overrides the `count` of count-limited generators (e.g. 10000000 for the memory
//! check). Per-request output is off. Linux only for the CPU-time and RSS figures.
//!
//! Before each run it also times the router's start-up on the scenario's fleet, as the
//! simulator performs it: every worker registered (with its round trip, its true capacity and
//! the probe orders polled after each registration, as the engine does) and then every
//! worker's first weight read.

use routelab_policies::{PolicyConfig, Router, Time};
use routelab_sim::{Scenario, SimSetup, TrafficSpec, run};
use std::io::Write;
use std::time::{Duration, Instant};

/// Wall time of the router's start-up on `setup`'s fleet under `policy`: registration and the
/// first weight derivation.
fn start_up(setup: &SimSetup, policy: &PolicyConfig) -> Duration {
    let t0 = Instant::now();
    let mut router = Router::new(policy.clone());
    let mut orders = Vec::new();
    let mut ids = Vec::with_capacity(setup.workers.len());
    for w in &setup.workers {
        let id = router.register(Time::ZERO, w.spec.clone());
        router.set_round_trip(id, Duration::from_nanos(w.rtt_ns));
        router.set_true_capacity(
            Time::ZERO,
            id,
            w.profile.aggregate_tok_s(setup.oracle_concurrency),
        );
        orders.clear();
        router.poll_probes(Time::ZERO, &mut orders);
        ids.push(id);
    }
    let total: f64 = ids
        .iter()
        .filter_map(|&id| router.weight(id))
        .map(|w| w.value)
        .sum();
    std::hint::black_box(total);
    t0.elapsed()
}

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

fn main() -> std::process::ExitCode {
    match measure() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // The reader stopped reading (`| head -1` for the start-up line): not an error.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sim_throughput: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

fn measure() -> Result<(), Box<dyn std::error::Error>> {
    let mut out = std::io::stdout().lock();
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: sim_throughput SCENARIO [REQUESTS]")?;
    let requests: Option<u64> = args
        .next()
        .map(|s| {
            s.parse().map_err(|_| {
                format!("REQUESTS `{s}` is not a request count (valid: a whole number ≥ 0)")
            })
        })
        .transpose()?;
    let mut sc = Scenario::load(&path)?;
    if let Some(n) = requests {
        for t in &mut sc.traffic {
            if let TrafficSpec::Poisson(c) = t {
                c.until.count = Some(n);
            }
        }
    }
    for policy in &sc.policies {
        let boot = start_up(&sc.setup, policy);
        writeln!(
            out,
            "{} / {}: start-up (registration of {} workers and first weight derivation) {:.1} ms",
            sc.name,
            policy.name,
            sc.setup.workers.len(),
            boot.as_secs_f64() * 1e3,
        )?;
        let mut traffic = sc.traffic_source(sc.setup.seed)?;
        let cpu0 = cpu_seconds();
        let wall0 = Instant::now();
        let m = run(&sc.setup, policy, &mut *traffic, None)?;
        let wall = wall0.elapsed().as_secs_f64();
        let cpu = match (cpu0, cpu_seconds()) {
            (Some(a), Some(b)) if b > a => b - a,
            _ => wall,
        };
        writeln!(
            out,
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
        )?;
    }
    Ok(())
}
