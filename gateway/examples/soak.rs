//! Soak of the gateway binary: `cargo build --release -p routelab-gateway --examples --bins`,
//! then `target/release/examples/soak --rate 400 --seconds 1200 --signals all`.
//!
//! Starts the load example's fake workers (with KV event publishers and `/metrics` pages, as
//! `--signals` asks), writes a gateway configuration for them, starts the gateway binary as its
//! own process (so the RSS sampled is the gateway's alone) and sends it an open loop of chat
//! completions at R req/s for S seconds. Finished requests are reaped as they finish, so the
//! driver's own memory does not grow with the request count. Every N seconds it prints the
//! interval's requests, errors, p50 and p99 and the gateway's VmRSS and threads (from
//! `/proc/<pid>/status`); at the end, the least-squares slope of RSS over the second half of
//! the run in MiB/min and bytes per request.
//!
//! Arguments (all optional): `--rate R` (400) `--seconds S` (1200) `--sample N` (15, seconds
//! between samples) `--workers W` (4) `--signals all|none|tokens,kv,polls` (all)
//! `--gateway PATH` (the `routelab-gateway` beside this example's directory) `--dir PATH`
//! (where the configuration and the gateway's log go; a new directory under the system's
//! temporary directory) `--wrap "CMD ARGS"` (run the gateway under a command, e.g.
//! `--wrap "heaptrack -o /tmp/gw"`; the RSS is then the gateway process's among the
//! command's descendants).

mod fake;

use bytes::Bytes;
use fake::args::{arg, gateway_binary, num, work_dir};
use fake::{Fleet, Signals, rss_kib};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// What `--help` prints.
const USAGE: &str = "soak [--rate R (400)] [--seconds S (1200)] [--sample N (15)] [--workers W (4)] \
             [--signals all|none|tokens,kv,polls (all)] [--gateway PATH] [--dir PATH] [--wrap \"CMD ARGS\"]";

/// The flags this example takes, each followed by a value.
const FLAGS: [&str; 8] = [
    "--rate",
    "--seconds",
    "--sample",
    "--workers",
    "--signals",
    "--gateway",
    "--dir",
    "--wrap",
];

/// Least-squares slope of `y` over `x`.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    sxy / sxx
}

fn pct(v: &[u32], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() - 1) as f64 * p).round() as usize] as f64 / 1e3
}

#[derive(Default)]
struct Tally {
    sent: AtomicU64,
    ok: AtomicU64,
    errors: AtomicU64,
    /// Latencies of the requests finished since the last sample, in µs.
    lat: Mutex<Vec<u32>>,
}

async fn one(c: &HttpClient, url: &hyper::Uri, body: &Bytes) -> Result<(), ()> {
    let req = hyper::Request::post(url.clone())
        .header("content-type", "application/json")
        .body(Full::new(body.clone()))
        .map_err(|_| ())?;
    let r = c.request(req).await.map_err(|_| ())?;
    let ok = r.status().is_success();
    r.into_body().collect().await.map_err(|_| ())?;
    if ok { Ok(()) } else { Err(()) }
}

#[tokio::main]
async fn main() {
    fake::args::check("soak", USAGE, &FLAGS);
    let rate = num("--rate", 400).max(1);
    let secs = num("--seconds", 1200);
    let every = num("--sample", 15).max(1);
    let nworkers = num("--workers", 4).max(1) as usize;
    let signals = match Signals::parse(&arg("--signals").unwrap_or_else(|| "all".into())) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let gateway = gateway_binary();
    let dir = work_dir("soak");

    let fleet = Fleet::start(nworkers, signals).await;
    let config = dir.join("soak.yaml");
    std::fs::write(&config, fleet.config("127.0.0.1:0", signals)).unwrap_or_else(|e| {
        eprintln!("error: cannot write {}: {e}", config.display());
        std::process::exit(2)
    });
    let publishing = fleet.publish();

    // The gateway, as its own process, optionally under a wrapper.
    let wrap: Vec<String> = arg("--wrap")
        .map(|w| w.split_whitespace().map(String::from).collect())
        .unwrap_or_default();
    let log_path = dir.join("gateway.log");
    let (mut child, addr, pid) = fake::spawn_gateway(&gateway, &wrap, &config, &log_path)
        .unwrap_or_else(|e| {
            eprintln!("error: {e}");
            std::process::exit(1)
        });
    println!(
        "== soak: gateway {} (pid {pid}) on {addr}, signals {}, {nworkers} fake workers, {rate} req/s for {secs} s; config and log in {}",
        gateway.display(),
        signals.describe(),
        dir.display()
    );

    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build(connector);
    let url: hyper::Uri = format!("http://{addr}/v1/chat/completions")
        .parse()
        .unwrap();
    let body = Bytes::from(fake::BODY);
    let tally = Arc::new(Tally::default());

    // Let the probe bursts finish before the idle sample.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let start = Instant::now();
    let sender = spawn_sender(&client, &url, &body, &tally, rate, secs);

    let (samples, hwm) = sample(&mut child, pid, &log_path, &tally, start, secs, every).await;
    let _ = sender.await;

    // What the gateway read of the signals.
    if signals != Signals::default() {
        fake::print_metrics(&client, &addr, None, |l| {
            l.starts_with("routelab_worker_kv_events_batches_total")
                || l.starts_with("routelab_worker_kv_events_live")
                || l.starts_with("routelab_worker_engine_metrics_live")
                || l.starts_with("routelab_gateway_task_restarts_total")
        })
        .await;
    }
    publishing.abort();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = tokio::task::spawn_blocking(move || child.wait()).await;

    let half = secs as f64 / 2.0;
    let second: Vec<(f64, f64)> = samples.iter().copied().filter(|p| p.0 >= half).collect();
    let ok = tally.ok.load(Relaxed);
    println!(
        "== {} requests, {ok} ok, {} errors; VmHWM {:.1} MiB",
        tally.sent.load(Relaxed),
        tally.errors.load(Relaxed),
        hwm as f64 / 1024.0
    );
    if second.len() >= 2 {
        let per_s = slope(&second); // MiB per second
        let per_min = per_s * 60.0;
        let per_req = per_s * 1024.0 * 1024.0 / rate as f64;
        println!(
            "== RSS slope over the second half ({} samples, {:.0}-{:.0} s): {per_min:+.4} MiB/min, {per_req:+.2} bytes/request",
            second.len(),
            second[0].0,
            second[second.len() - 1].0
        );
    }
}

/// Send the short chat at `rate` per second for `secs` seconds, each request a task of its own,
/// counting what each is answered in `tally`.
fn spawn_sender(
    client: &HttpClient,
    url: &hyper::Uri,
    body: &Bytes,
    tally: &Arc<Tally>,
    rate: u64,
    secs: u64,
) -> tokio::task::JoinHandle<()> {
    let (client, url, body, tally) = (client.clone(), url.clone(), body.clone(), tally.clone());
    tokio::spawn(async move {
        let n = rate * secs;
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        for _ in 0..n {
            tick.tick().await;
            tally.sent.fetch_add(1, Relaxed);
            let (client, url, body, tally) =
                (client.clone(), url.clone(), body.clone(), tally.clone());
            // Not kept: a finished task is freed at once.
            tokio::spawn(async move {
                let t = Instant::now();
                let r =
                    tokio::time::timeout(Duration::from_secs(10), one(&client, &url, &body)).await;
                if let Ok(Ok(())) = r {
                    tally.ok.fetch_add(1, Relaxed);
                    let us = t.elapsed().as_micros().min(u32::MAX as u128) as u32;
                    tally.lat.lock().unwrap().push(us);
                } else {
                    tally.errors.fetch_add(1, Relaxed);
                }
            });
        }
    })
}

/// Every `every` seconds until `secs`: a row of the requests' figures since the last row and
/// the gateway's RSS and threads (the process exits 1 if the gateway died). Returns the
/// (time, RSS MiB) samples and the RSS high-water mark (KiB).
async fn sample(
    child: &mut std::process::Child,
    pid: u32,
    log_path: &std::path::Path,
    tally: &Tally,
    start: Instant,
    secs: u64,
    every: u64,
) -> (Vec<(f64, f64)>, u64) {
    println!(
        "{:>7} {:>10} {:>10} {:>7} {:>8} {:>8} {:>9} {:>8}",
        "t_s", "sent", "ok", "errors", "p50_ms", "p99_ms", "rss_mib", "threads"
    );
    let mut samples: Vec<(f64, f64)> = Vec::new();
    let mut hwm = 0;
    let mut tick = tokio::time::interval(Duration::from_secs(every));
    loop {
        tick.tick().await;
        let t = start.elapsed().as_secs_f64();
        if let Ok(Some(status)) = child.try_wait() {
            eprintln!(
                "error: the gateway exited ({status}) at {t:.0} s; its log: {}",
                log_path.display()
            );
            std::process::exit(1);
        }
        let Some((rss, peak, threads)) = rss_kib(pid) else {
            eprintln!("error: cannot read /proc/{pid}/status");
            std::process::exit(1);
        };
        hwm = hwm.max(peak);
        let mut lat = std::mem::take(&mut *tally.lat.lock().unwrap());
        lat.sort_unstable();
        let mib = rss as f64 / 1024.0;
        println!(
            "{t:>7.0} {:>10} {:>10} {:>7} {:>8.3} {:>8.3} {mib:>9.1} {threads:>8}",
            tally.sent.load(Relaxed),
            tally.ok.load(Relaxed),
            tally.errors.load(Relaxed),
            pct(&lat, 0.5),
            pct(&lat, 0.99),
        );
        samples.push((t, mib));
        if t >= secs as f64 {
            break;
        }
    }
    (samples, hwm)
}
