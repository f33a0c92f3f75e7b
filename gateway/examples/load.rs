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

use axum::routing::post;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

const ANSWER: &str = r#"{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}"#;

const METRICS: &str = "vllm:num_requests_running{engine=\"0\"} 3\nvllm:num_requests_waiting{engine=\"0\"} 0\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.2\nvllm:generation_tokens_total{engine=\"0\"} 1000\n";

async fn fake_worker() -> String {
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            post(|| async { ([("content-type", "application/json")], ANSWER) }),
        )
        .route("/metrics", axum::routing::get(|| async { METRICS }))
        .route("/health", axum::routing::get(|| async { "ok" }));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let l = axum::serve::ListenerExt::tap_io(l, |t| {
        let _ = t.set_nodelay(true);
    });
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    url
}

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
    let signals = level != 0;
    let (tokens, streams) = (level == 1 || level == 2, level == 1 || level == 3);
    let mut workers = Vec::new();
    for _ in 0..nworkers {
        workers.push(fake_worker().await);
    }
    let mut yaml = String::from("listen: 127.0.0.1:0\nhealth: {interval_s: 5}\n");
    let mut publishers = Vec::new();
    if signals {
        let d = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../data/tokenizers/smollm2-135m-instruct");
        if tokens {
            yaml += &format!(
                "models:\n  - {{name: m, tokenizer: \"{}\", chat_template: \"{}\"}}\n",
                d.join("tokenizer.json").display(),
                d.join("chat_template.jinja").display()
            );
        }
        if !streams {
            yaml += "policy: probe/p2c:higher-weight/capacity/none\n";
        } else {
            yaml += "policy: probe/p2c:higher-weight/capacity/none/kv-events\n\
                     engine_metrics: {poll: on, interval_s: 1}\n";
        }
        for _ in 0..if streams { nworkers } else { 0 } {
            publishers.push(
                routelab_gateway::kv::publisher::start("127.0.0.1", "", 10_000)
                    .await
                    .unwrap(),
            );
        }
    } else {
        yaml += "policy: probe/p2c:higher-weight/capacity/none\n";
    }
    yaml += "workers:\n";
    for (i, w) in workers.iter().enumerate() {
        yaml += &format!("  - {{name: w{i}, base_url: \"{w}\", model: m, context_window: 32768");
        if let Some(p) = publishers.get(i) {
            yaml += &format!(
                ", kv_events: {{endpoint: \"{}\", replay_endpoint: \"{}\"}}",
                p.endpoint(),
                p.replay_endpoint()
            );
        }
        yaml += "}\n";
    }
    // Each worker's engine: a 512-token chain stored and evicted again, one batch every 10 ms.
    let publishers = Arc::new(publishers);
    let publishing = {
        let publishers = publishers.clone();
        tokio::spawn(async move {
            use routelab_gateway::kv::wire::{Batch, BlockHash, Event};
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            for round in 0u64.. {
                tick.tick().await;
                for (w, p) in publishers.iter().enumerate() {
                    let base = (round * 64 + w as u64) << 8;
                    let hashes: Vec<BlockHash> = (0..32).map(|j| BlockHash(base + j)).collect();
                    p.publish(&Batch {
                        ts: 0.0,
                        events: vec![
                            Event::BlockStored {
                                block_hashes: hashes.clone(),
                                parent: None,
                                token_ids: (0..512).map(|t| (t + round as u32) % 49_152).collect(),
                                block_size: 16,
                                lora_id: None,
                                medium: Some("GPU".into()),
                                group_idx: None,
                            },
                            Event::BlockRemoved {
                                block_hashes: hashes,
                                medium: Some("GPU".into()),
                                group_idx: None,
                            },
                        ],
                        data_parallel_rank: None,
                    });
                }
            }
        })
    };
    let cfg = routelab_gateway::GatewayConfig::from_yaml(&yaml, "load.yaml").unwrap();
    let gw = routelab_gateway::start_on(
        cfg,
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    )
    .await
    .unwrap();
    let via = format!("http://{}/v1/chat/completions", gw.local_addr());
    let direct = format!("{}/v1/chat/completions", workers[0]);
    let body = Bytes::from(
        r#"{"model":"m","messages":[{"role":"system","content":"You are brief."},{"role":"user","content":"Say ok."}],"max_tokens":16}"#,
    );
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
