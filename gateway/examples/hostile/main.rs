//! The gateway binary under hostile engines and hostile clients (issue 42's "Must show"):
//! `cargo build --release -p routelab-gateway --examples --bins`, then
//! `target/release/examples/hostile --seconds 180`.
//!
//! Four fake workers, each a different hostile engine on both of its engine-side inputs:
//!
//! | worker | KV event peer (ZMTP, written by hand here) | `/metrics` |
//! |---|---|---|
//! | w0 | announces a 2^61-byte frame, then closes | every gauge `1e30` |
//! | w1 | one endless multipart message of 1 MiB frames with MORE set | `sglang:gen_throughput 1e300` |
//! | w2 | valid batches whose sequence restarts at 0 every 300 batches, with one at `i64::MAX` every 1,000; no replay endpoint | never answers |
//! | w3 | live batches with a gap before each (every other sequence number); its replay socket answers any request with batches forever and no end marker | an endless page, 64 KiB every 10 ms |
//!
//! The KV peers that send valid batches store 32 fresh blocks per batch every 10 ms and never
//! remove them, so a mirror not bounded by the worker's `cache_tokens` grows. The model has the
//! vendored SmolLM2 tokenizer and chat template (exact counting on) and a small window
//! (`--window`, 32,768 tokens); `--clients` clients (4) send chat completions with a
//! `--prompt-bytes` (1 MiB) prompt of digits back to back. A prober sends the short request of
//! the load and soak examples every `--probe-ms` (20) ms, to a worker directly and through the
//! gateway in turn, so the added latency is the gateway's p50/p99 minus the direct p50/p99.
//!
//! The gateway runs as its own process; its VmRSS is read every second. Every `--sample` (15)
//! seconds a line: the interval's direct and gateway p50/p99 of the short request, the big
//! requests answered and how, RSS and threads. At the end the whole run's figures and a verdict
//! against `--rss-bound-mib` (200) and `--p99-bound-ms` (5, added p99), and whether the process
//! is alive and answering `/health`; the exit status is 1 when any of them fails.
//!
//! Other arguments: `--gateway PATH` (the `routelab-gateway` beside this example's directory),
//! `--dir PATH` (configuration and log; a new temporary directory), `--policy P` (the soak's
//! `probe/p2c:higher-weight/capacity/none/kv-events`), `--engines benign` (the same clients
//! and prober against well-behaved fake workers without KV streams, to tell the clients' part
//! from the engines'; give it a `--policy` without `kv-events`), `--big-model NAME` (the model
//! the big prompts ask for, `m`: another name is parsed and refused with a 404 without being
//! counted, to tell the parsing's part from the counting's).

mod engines;
#[path = "../fake/mod.rs"]
mod fake;

use bytes::Bytes;
use engines::{KvMode, KvPeer, MetricsMode, kv_peer, worker};
use fake::args::{arg, gateway_binary, num, work_dir};
use fake::rss_kib;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// What `--help` prints.
const USAGE: &str = "hostile [--seconds S (180)] [--sample N (15)] [--window TOKENS (32768)] \
             [--prompt-bytes B (1048576)] [--clients C (4)] [--probe-ms MS (20)] \
             [--rss-bound-mib MIB (200)] [--p99-bound-ms MS (5)] [--gateway PATH] [--dir PATH] \
             [--policy POLICY] [--engines hostile|benign] [--big-model NAME (m)]";

const FLAGS: [&str; 13] = [
    "--engines",
    "--big-model",
    "--seconds",
    "--sample",
    "--window",
    "--prompt-bytes",
    "--clients",
    "--probe-ms",
    "--rss-bound-mib",
    "--p99-bound-ms",
    "--gateway",
    "--dir",
    "--policy",
];

fn config(workers: &[(String, Option<KvPeer>)], window: u64, policy: &str) -> String {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/tokenizers/smollm2-135m-instruct");
    let mut yaml = format!(
        "listen: 127.0.0.1:0\nhealth: {{interval_s: 5}}\nmodels:\n  - {{name: m, tokenizer: \"{}\", chat_template: \"{}\"}}\npolicy: {policy}\nengine_metrics: {{poll: on, interval_s: 1}}\nworkers:\n",
        d.join("tokenizer.json").display(),
        d.join("chat_template.jinja").display()
    );
    for (i, (url, kv)) in workers.iter().enumerate() {
        yaml += &format!(
            "  - {{name: w{i}, base_url: \"{url}\", model: m, context_window: {window}, cache_tokens: 262144"
        );
        if let Some(kv) = kv {
            yaml += &format!(", kv_events: {{endpoint: \"{}\"", kv.endpoint);
            if let Some(r) = &kv.replay {
                yaml += &format!(", replay_endpoint: \"{r}\"");
            }
            yaml += "}";
        }
        yaml += "}\n";
    }
    yaml
}

// ---- Clients.

/// Send one request; its status once the whole body is read, and the body (or what went
/// wrong: status 0).
async fn send(c: &HttpClient, url: &hyper::Uri, body: &Bytes) -> (u16, String) {
    let req = match hyper::Request::post(url.clone())
        .header("content-type", "application/json")
        .body(Full::new(body.clone()))
    {
        Ok(r) => r,
        Err(e) => return (0, e.to_string()),
    };
    let r = match c.request(req).await {
        Ok(r) => r,
        Err(e) => return (0, format!("{e:?}")),
    };
    let status = r.status().as_u16();
    match r.into_body().collect().await {
        Ok(b) => (status, String::from_utf8_lossy(&b.to_bytes()).into_owned()),
        Err(e) => (0, format!("reading the body: {e}")),
    }
}

#[derive(Default)]
struct Big {
    /// Each status seen (0: no answer) with its count and its first body or error.
    statuses: Mutex<std::collections::BTreeMap<u16, (u64, String)>>,
    ok: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
    /// Latencies of the big requests, µs, since the last sample.
    lat: Mutex<Vec<u32>>,
}

#[derive(Default)]
struct Probe {
    errors: AtomicU64,
    /// (direct, through the gateway) latencies in µs, since the last sample and all run.
    direct: Mutex<(Vec<u32>, Vec<u32>)>,
    gateway: Mutex<(Vec<u32>, Vec<u32>)>,
}

fn take(m: &Mutex<(Vec<u32>, Vec<u32>)>) -> Vec<u32> {
    let mut g = m.lock().unwrap();
    let v = std::mem::take(&mut g.0);
    g.1.extend_from_slice(&v);
    v
}

fn pct(v: &mut [u32], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize] as f64 / 1e3
}

/// CPU seconds of each of the process's threads, by thread name with its trailing number
/// dropped (`tokio-runtime-w`, `routelab-count-large-`), most first.
fn cpu_by_thread(pid: u32) -> Vec<(String, f64)> {
    let mut by: std::collections::BTreeMap<String, f64> = Default::default();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    for t in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].trim_end_matches(|c: char| c.is_ascii_digit());
        // After the name: state is field 3; utime and stime are fields 14 and 15.
        let f: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        let ticks: f64 = f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
            + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        *by.entry(name.to_string()).or_default() += ticks / 100.0;
    }
    let mut v: Vec<(String, f64)> = by.into_iter().collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v
}

/// The process's CPU seconds (user and system, all threads).
fn cpu_s(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let f: Vec<String> = s[s.rfind(')')? + 1..]
                .split_whitespace()
                .map(String::from)
                .collect();
            Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / 100.0)
        })
        .unwrap_or(f64::NAN)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[tokio::main]
async fn main() {
    fake::args::check("hostile", USAGE, &FLAGS);
    let secs = num("--seconds", 180);
    let every = num("--sample", 15).max(1);
    let window = num("--window", 32_768);
    let prompt_bytes = num("--prompt-bytes", 1 << 20) as usize;
    let clients = num("--clients", 4);
    let probe_ms = num("--probe-ms", 20).max(1);
    let rss_bound = num("--rss-bound-mib", 200) as f64;
    let p99_bound = num("--p99-bound-ms", 5) as f64;
    let policy =
        arg("--policy").unwrap_or_else(|| "probe/p2c:higher-weight/capacity/none/kv-events".into());
    let gateway = gateway_binary();
    let dir = work_dir("hostile");

    let plan = [
        (KvMode::HugeFrame, MetricsMode::HugeGauges),
        (KvMode::EndlessMultipart, MetricsMode::HugeRate),
        (KvMode::Backwards, MetricsMode::Hangs),
        (KvMode::EndlessReplay, MetricsMode::Endless),
    ];
    let hostile = match arg("--engines").as_deref() {
        None | Some("hostile") => true,
        Some("benign") => false,
        Some(other) => {
            eprintln!("error: --engines: `{other}` (valid: hostile, benign)");
            std::process::exit(2)
        }
    };
    let mut workers = Vec::new();
    for (i, (kv, metrics)) in plan.iter().enumerate() {
        workers.push(if hostile {
            (worker(*metrics).await, Some(kv_peer(*kv, i as u64).await))
        } else {
            (worker(MetricsMode::Benign).await, None)
        });
    }
    let config_path = dir.join("hostile.yaml");
    std::fs::write(&config_path, config(&workers, window, &policy)).unwrap_or_else(|e| {
        eprintln!("error: cannot write {}: {e}", config_path.display());
        std::process::exit(2)
    });
    let log = dir.join("gateway.log");
    let (mut child, addr, pid) = fake::spawn_gateway(&gateway, &[], &config_path, &log)
        .unwrap_or_else(|e| {
            eprintln!("error: {e}");
            std::process::exit(1)
        });
    println!(
        "== hostile: gateway {} (pid {pid}) on {addr}; 4 workers, {}; window {window}, \
         {clients} clients x {prompt_bytes}-byte prompts, probe every {probe_ms} ms, {secs} s; \
         policy {policy}; config and log in {}",
        gateway.display(),
        if hostile {
            format!("hostile (KV peer, /metrics): {plan:?}")
        } else {
            "benign (no KV streams, the fake workers' /metrics)".to_string()
        },
        dir.display()
    );

    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(64)
        .build(connector);
    let gw_url: hyper::Uri = format!("http://{addr}/v1/chat/completions")
        .parse()
        .unwrap();
    let big_model = arg("--big-model").unwrap_or_else(|| "m".into());
    let big_body = {
        let digits: String = (0..prompt_bytes)
            .map(|i| char::from(b'0' + (i * 7 % 10) as u8))
            .collect();
        Bytes::from(format!(
            r#"{{"model":"{big_model}","messages":[{{"role":"user","content":"{digits}"}}],"max_tokens":16}}"#
        ))
    };
    let short = Bytes::from(fake::BODY);

    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let big = Arc::new(Big::default());
    let mut tasks = Vec::new();
    for _ in 0..clients {
        tasks.push(spawn_big_client(&client, &gw_url, &big_body, &big, end));
    }
    let probe = Arc::new(Probe::default());
    let direct: Vec<hyper::Uri> = workers
        .iter()
        .map(|(w, _)| format!("{w}/v1/chat/completions").parse().unwrap())
        .collect();
    tasks.push(spawn_prober(
        &client, &gw_url, direct, short, &probe, probe_ms, end,
    ));

    let (rss_max, died) = sample(&mut child, pid, start, secs, every, &big, &probe).await;
    for t in &tasks {
        t.abort();
    }

    // Alive: still running and answering /health.
    let healthy = died.is_none() && last_look(&client, &addr, pid, child).await;

    let bounds = Bounds {
        rss_mib: rss_bound,
        p99_ms: p99_bound,
    };
    if !verdict(secs, &big, &probe, rss_max, died, healthy, bounds) {
        std::process::exit(1);
    }
}

/// One client sending the big prompt back to back until `end`, counting what it is answered.
fn spawn_big_client(
    client: &HttpClient,
    url: &hyper::Uri,
    body: &Bytes,
    big: &Arc<Big>,
    end: Instant,
) -> tokio::task::JoinHandle<()> {
    let (client, url, body, big) = (client.clone(), url.clone(), body.clone(), big.clone());
    tokio::spawn(async move {
        while Instant::now() < end {
            let t = Instant::now();
            let (s, text) =
                tokio::time::timeout(Duration::from_secs(60), send(&client, &url, &body))
                    .await
                    .unwrap_or_else(|_| (0, "no answer within 60 s".into()));
            let us = t.elapsed().as_micros().min(u32::MAX as u128) as u32;
            big.lat.lock().unwrap().push(us);
            big.statuses
                .lock()
                .unwrap()
                .entry(s)
                .or_insert((0, text.chars().take(300).collect()))
                .0 += 1;
            match s {
                200..=299 => big.ok.fetch_add(1, Relaxed),
                400..=499 => big.refused.fetch_add(1, Relaxed),
                _ => big.failed.fetch_add(1, Relaxed),
            };
        }
    })
}

/// The short request every `probe_ms` until `end`, to a worker directly and through the
/// gateway in turn (which goes first alternates, so neither always runs on a warmer path).
fn spawn_prober(
    client: &HttpClient,
    gw_url: &hyper::Uri,
    direct: Vec<hyper::Uri>,
    body: Bytes,
    probe: &Arc<Probe>,
    probe_ms: u64,
    end: Instant,
) -> tokio::task::JoinHandle<()> {
    let (client, gw_url, probe) = (client.clone(), gw_url.clone(), probe.clone());
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(probe_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for n in 0usize.. {
            tick.tick().await;
            if Instant::now() >= end {
                break;
            }
            let d = &direct[n % direct.len()];
            for leg in 0..2 {
                let through = (leg + n) % 2 == 0;
                let url = if through { &gw_url } else { d };
                let t = Instant::now();
                let (s, _) =
                    tokio::time::timeout(Duration::from_secs(30), send(&client, url, &body))
                        .await
                        .unwrap_or((0, String::new()));
                let us = t.elapsed().as_micros().min(u32::MAX as u128) as u32;
                if !(200..300).contains(&s) {
                    probe.errors.fetch_add(1, Relaxed);
                    continue;
                }
                let into = if through {
                    &probe.gateway
                } else {
                    &probe.direct
                };
                into.lock().unwrap().0.push(us);
            }
        }
    })
}

/// The end of a run the gateway survived: whether `/health` still answers; the KV, engine
/// metrics, restart and counting lines of `/metrics` and the CPU by thread, printed; then the
/// gateway stopped.
async fn last_look(
    client: &HttpClient,
    addr: &str,
    pid: u32,
    mut child: std::process::Child,
) -> bool {
    let req = hyper::Request::get(format!("http://{addr}/health"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let healthy = matches!(
        tokio::time::timeout(Duration::from_secs(5), client.request(req)).await,
        Ok(Ok(r)) if r.status().is_success()
    );
    fake::print_metrics(client, addr, Some(Duration::from_secs(5)), |l| {
        !l.starts_with('#')
            && (l.contains("kv_events")
                || l.contains("engine_metrics")
                || l.contains("task_restarts")
                || l.contains("buffered")
                || l.contains("count"))
    })
    .await;
    let by = cpu_by_thread(pid);
    println!(
        "== the gateway's CPU by thread (s): {}",
        by.iter()
            .map(|(n, s)| format!("{n} {s:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = tokio::task::spawn_blocking(move || child.wait()).await;
    healthy
}

/// The run's bounds: RSS (MiB) and the short request's added p99 (ms).
#[derive(Debug, Clone, Copy)]
struct Bounds {
    rss_mib: f64,
    p99_ms: f64,
}

/// The summary lines and the verdict: whether RSS, the added p99 and liveness held.
fn verdict(
    secs: u64,
    big: &Big,
    probe: &Probe,
    rss_max: u64,
    died: Option<String>,
    healthy: bool,
    bounds: Bounds,
) -> bool {
    let Bounds {
        rss_mib: rss_bound,
        p99_ms: p99_bound,
    } = bounds;
    for (status, (n, first)) in big.statuses.lock().unwrap().iter() {
        println!("== big requests answered {status} (0: no answer): {n}; the first: {first}");
    }
    let mut d = probe.direct.lock().unwrap().1.clone();
    let mut g = probe.gateway.lock().unwrap().1.clone();
    let (n_d, n_g) = (d.len(), g.len());
    let (d50, d99, g50, g99) = (
        pct(&mut d, 0.5),
        pct(&mut d, 0.99),
        pct(&mut g, 0.5),
        pct(&mut g, 0.99),
    );
    let rss_mib = rss_max as f64 / 1024.0;
    println!(
        "== {secs} s: big requests {} ok, {} refused (4xx), {} failed; short requests {n_d} direct, {n_g} through, {} errors",
        big.ok.load(Relaxed),
        big.refused.load(Relaxed),
        big.failed.load(Relaxed),
        probe.errors.load(Relaxed),
    );
    println!(
        "== short request p50/p99 ms: direct {d50:.3}/{d99:.3}, gateway {g50:.3}/{g99:.3}, added {:.3}/{:.3}; RSS max {rss_mib:.1} MiB; loadavg {}",
        g50 - d50,
        g99 - d99,
        loadavg()
    );
    let checks = [
        (
            format!("RSS max {rss_mib:.1} MiB < {rss_bound} MiB"),
            rss_mib < rss_bound,
        ),
        (
            format!("added p99 {:.3} ms < {p99_bound} ms", g99 - d99),
            g99 - d99 < p99_bound,
        ),
        (
            died.clone()
                .unwrap_or_else(|| "alive, /health answers".to_string()),
            healthy,
        ),
    ];
    let mut passed = true;
    for (what, ok) in &checks {
        println!("== {} {what}", if *ok { "PASS" } else { "FAIL" });
        passed &= ok;
    }
    passed
}

/// Every second until `secs`: stop if the gateway died; keep its RSS high-water mark; every
/// `every` seconds print a row (the big and short requests' figures since the last row, RSS,
/// threads, CPU and the load average). Returns the RSS maximum (KiB) and, if it died, how.
async fn sample(
    child: &mut std::process::Child,
    pid: u32,
    start: Instant,
    secs: u64,
    every: u64,
    big: &Big,
    probe: &Probe,
) -> (u64, Option<String>) {
    println!(
        "{:>5} {:>6} {:>7} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>7} {:>15}",
        "t_s",
        "big_ok",
        "big_4xx",
        "big_x",
        "big_p50",
        "dir_p50",
        "dir_p99",
        "gw_p50",
        "gw_p99",
        "rss_mib",
        "hwm_mib",
        "threads",
        "gw_cpu",
        "own_cpu",
        "loadavg"
    );
    let mut rss_max = 0u64;
    let mut died = None;
    let mut next_print = every;
    let mut cpu_before = (0u64, cpu_s(pid), cpu_s(std::process::id()));
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let t = start.elapsed().as_secs();
        if let Ok(Some(status)) = child.try_wait() {
            died = Some(format!("the gateway exited ({status}) at {t} s"));
            break;
        }
        let Some((rss, hwm, threads)) = rss_kib(pid) else {
            died = Some(format!("cannot read /proc/{pid}/status at {t} s"));
            break;
        };
        rss_max = rss_max.max(rss).max(hwm);
        if t >= next_print || t >= secs {
            next_print += every;
            let mut d = take(&probe.direct);
            let mut g = take(&probe.gateway);
            let mut b = std::mem::take(&mut *big.lat.lock().unwrap());
            let cpu_now = (t, cpu_s(pid), cpu_s(std::process::id()));
            println!(
                "{t:>5} {:>6} {:>7} {:>6} {:>8.1} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.1} {:>8.1} {threads:>7} {:>6.0}% {:>6.0}% {:>15}",
                big.ok.load(Relaxed),
                big.refused.load(Relaxed),
                big.failed.load(Relaxed),
                pct(&mut b, 0.5),
                pct(&mut d, 0.5),
                pct(&mut d, 0.99),
                pct(&mut g, 0.5),
                pct(&mut g, 0.99),
                rss as f64 / 1024.0,
                hwm as f64 / 1024.0,
                100.0 * (cpu_s(pid) - cpu_before.1) / (t - cpu_before.0).max(1) as f64,
                100.0 * (cpu_s(std::process::id()) - cpu_before.2)
                    / (t - cpu_before.0).max(1) as f64,
                loadavg(),
            );
            cpu_before = cpu_now;
        }
        if t >= secs {
            break;
        }
    }
    (rss_max, died)
}
