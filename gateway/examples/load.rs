//! Load test of the gateway on loopback: `cargo run --release -p routelab-gateway --example load`
//!
//! Starts fast in-process fake workers (a fixed non-streaming completion, no delay) and the
//! gateway in front of them, then:
//! 1. throughput: N requests (default 20,000) with C in flight (default 64), through the
//!    gateway and directly to one worker;
//! 2. overhead: an open loop at R req/s (default 1,000) for S seconds (default 5), directly and
//!    through the gateway; p50/p99 latency of both and their difference.
//!
//! Every loop is bounded in count and time. Client, gateway and workers share one process and
//! one runtime, so on a small machine the figures include their contention.
//!
//! Arguments (all optional): `--requests N --concurrency C --rate R --seconds S --workers W
//! --signals 0|1|2|3`. With `--signals 1` the production signals are on (2: exact tokens only;
//! 3: KV streams and metrics polls only): the model's prompts are
//! counted by the vendored SmolLM2 tokenizer and chat template, the policy mirrors the workers'
//! KV event streams (each fake worker publishes a 32-block batch every 10 ms, as an engine
//! publishes one per step) and the gateway polls each worker's vLLM-named `/metrics` every
//! second.
//!
//! The open loop keeps its tasks until the end, so it cannot run for long: for a soak of the
//! gateway binary, with its RSS sampled, see the `soak` example.

mod fake;

use bytes::Bytes;
use fake::{Fleet, Signals};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn one(c: &HttpClient, url: &hyper::Uri, body: &Bytes) -> Result<Duration, String> {
    let t = Instant::now();
    let req = hyper::Request::post(url.clone())
        .header("content-type", "application/json")
        .body(Full::new(body.clone()))
        .unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), async {
        let r = c.request(req).await.map_err(|e| e.to_string())?;
        let ok = r.status().is_success();
        r.into_body().collect().await.map_err(|e| e.to_string())?;
        if ok {
            Ok(())
        } else {
            Err("status".to_string())
        }
    })
    .await
    .map_err(|_| "timeout".to_string())?;
    r.map(|()| t.elapsed())
}

async fn closed_loop(c: &HttpClient, url: &str, body: &Bytes, n: u64, conc: u64) -> (f64, u64) {
    let url: hyper::Uri = url.parse().unwrap();
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..conc {
        let (c, url, body, next, errors) = (
            c.clone(),
            url.clone(),
            body.clone(),
            next.clone(),
            errors.clone(),
        );
        set.spawn(async move {
            while next.fetch_add(1, Relaxed) < n {
                if one(&c, &url, &body).await.is_err() {
                    errors.fetch_add(1, Relaxed);
                }
            }
        });
    }
    while set.join_next().await.is_some() {}
    (n as f64 / t.elapsed().as_secs_f64(), errors.load(Relaxed))
}

async fn open_loop(
    c: &HttpClient,
    url: &str,
    body: &Bytes,
    rate: u64,
    secs: u64,
) -> (Vec<Duration>, u64) {
    let url: hyper::Uri = url.parse().unwrap();
    let n = rate * secs;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        tick.tick().await;
        let (c, url, body) = (c.clone(), url.clone(), body.clone());
        set.spawn(async move { one(&c, &url, &body).await });
    }
    let mut lat = Vec::with_capacity(n as usize);
    let mut errors = 0;
    while let Some(r) = set.join_next().await {
        match r {
            Ok(Ok(d)) => lat.push(d),
            _ => errors += 1,
        }
    }
    lat.sort_unstable();
    (lat, errors)
}

fn pct(v: &[Duration], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1e3
}

#[tokio::main]
async fn main() {
    let n = arg("--requests", 20_000);
    let conc = arg("--concurrency", 64);
    let rate = arg("--rate", 1_000);
    let secs = arg("--seconds", 5);
    let nworkers = arg("--workers", 4);
    // 0: none; 1: all; 2: exact tokens only; 3: KV streams and metrics polls only.
    let level = arg("--signals", 0);
    let chosen = Signals {
        tokens: level == 1 || level == 2,
        kv: level == 1 || level == 3,
        polls: level == 1 || level == 3,
    };
    let signals = level != 0;
    let fleet = Fleet::start(nworkers as usize, chosen).await;
    let yaml = fleet.config("127.0.0.1:0", chosen);
    let publishing = fleet.publish();
    let cfg = routelab_gateway::GatewayConfig::from_yaml(&yaml, "load.yaml").unwrap();
    let gw = routelab_gateway::start_on(
        cfg,
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    )
    .await
    .unwrap();
    let via = format!("http://{}/v1/chat/completions", gw.local_addr());
    let direct = format!("{}/v1/chat/completions", fleet.workers[0]);
    let body = Bytes::from(fake::BODY);
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let c: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build(connector);
    // Let the probe bursts (tiny here) finish and warm the pools.
    tokio::time::sleep(Duration::from_millis(500)).await;
    closed_loop(&c, &via, &body, 2_000, conc).await;
    closed_loop(&c, &direct, &body, 2_000, conc).await;

    println!(
        "== signals {}",
        match level {
            0 => "off",
            1 => "on (exact tokens, KV event streams, metrics polls)",
            2 => "exact tokens only",
            _ => "KV event streams and metrics polls only",
        }
    );
    println!("== throughput: {n} requests, {conc} in flight, {nworkers} fake workers");
    let (rps_d, err_d) = closed_loop(&c, &direct, &body, n, conc).await;
    println!("direct  {rps_d:>9.0} req/s  errors {err_d}");
    let (rps_g, err_g) = closed_loop(&c, &via, &body, n, conc).await;
    println!("gateway {rps_g:>9.0} req/s  errors {err_g}");

    println!("== latency at {rate} req/s for {secs} s (open loop)");
    let (ld, ed) = open_loop(&c, &direct, &body, rate, secs).await;
    let (lg, eg) = open_loop(&c, &via, &body, rate, secs).await;
    println!(
        "direct  p50 {:.3} ms  p99 {:.3} ms  errors {ed}",
        pct(&ld, 0.5),
        pct(&ld, 0.99)
    );
    println!(
        "gateway p50 {:.3} ms  p99 {:.3} ms  errors {eg}",
        pct(&lg, 0.5),
        pct(&lg, 0.99)
    );
    println!(
        "overhead p50 {:.3} ms  p99 {:.3} ms",
        pct(&lg, 0.5) - pct(&ld, 0.5),
        pct(&lg, 0.99) - pct(&ld, 0.99)
    );
    if signals {
        let m = c
            .request(
                hyper::Request::get(format!("http://{}/metrics", gw.local_addr()))
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
            .await
            .unwrap()
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes();
        for line in String::from_utf8_lossy(&m).lines().filter(|l| {
            l.starts_with("routelab_worker_kv_events_batches_total")
                || l.starts_with("routelab_worker_kv_events_live")
                || l.starts_with("routelab_worker_engine_metrics_live")
        }) {
            println!("{line}");
        }
    }
    publishing.abort();
    gw.shutdown().await;
}
