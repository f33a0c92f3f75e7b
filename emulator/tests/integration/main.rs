//! Sim-to-real: the production gateway in front of emulated engines reproduces the simulator.
//!
//! Loopback only, every wait bounded. The timing-sensitive tests run one at a time (a shared
//! lock) so that they do not steal each other's CPU on a small machine.

mod disconnect;
mod field_wire;
mod real_engine;
mod replicas;
mod request_log;
mod signals;

use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use routelab_emulator::{
    EmulatedFleet, EmulatorOptions, PlayOptions, PlayReport, play_with, serve, start_fleet,
};
use routelab_gateway::RunningGateway;
use routelab_sim::traffic::Until;
use routelab_sim::{RunMetrics, Scenario, Status, TrafficSpec};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

type HttpClient = Client<HttpConnector, Full<bytes::Bytes>>;

const TOKEN: &str = "emulator-test";

/// Timing-sensitive tests take turns.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn scenario(rel: &str) -> Scenario {
    Scenario::load(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn profile(name: &str) -> Arc<routelab_sim::HardwareProfile> {
    let p = root()
        .join("scenarios/hardware")
        .join(format!("{name}.yaml"));
    Arc::new(routelab_sim::HardwareProfile::load(p).unwrap())
}

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// Emulators for the scenario's fleet and a gateway in front of them.
async fn stack(
    sc: &Scenario,
    policy: &str,
    speedup: f64,
) -> (EmulatedFleet, RunningGateway, String, Instant) {
    let fleet = start_fleet(&sc.setup, speedup).await.unwrap();
    let mut cfg = fleet.gateway_config(policy, sc.setup.seed, speedup);
    cfg.admin_token = Some(TOKEN.into());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = Instant::now();
    let gw = routelab_gateway::start_on(cfg, listener).await.unwrap();
    let url = format!("http://{}", gw.local_addr());
    (fleet, gw, url, origin)
}

async fn play_on(
    sc: &Scenario,
    url: &str,
    speedup: f64,
    origin: Instant,
    policy: &str,
    deadline: Duration,
) -> PlayReport {
    let mut opts = PlayOptions::new(speedup);
    opts.admin_token = Some(TOKEN.into());
    opts.origin = Some(origin);
    opts.policy = policy.into();
    opts.deadline = Some(deadline);
    opts.request_timeout = Duration::from_secs(20);
    tokio::time::timeout(
        deadline + Duration::from_secs(10),
        play_with(sc, sc.setup.seed, url, &opts),
    )
    .await
    .expect("play ends by its deadline")
    .unwrap()
}

/// The scenario's policy of that name, else the preset or composition it names.
fn policy_of(sc: &Scenario, policy: &str) -> routelab_policies::PolicyConfig {
    sc.policies
        .iter()
        .find(|p| p.name == policy)
        .cloned()
        .unwrap_or_else(|| routelab_policies::PolicyConfig::from_name(policy).unwrap())
}

/// `predictive` aiming at the SLO written into it (TTFT 2 s, TPOT 0.1 s), so the simulator
/// and the gateway aim at the same bounds.
fn predictive_policy() -> routelab_policies::PolicyEntry {
    routelab_gateway::GatewayConfig::from_yaml(
        "policy: { name: predictive, preset: predictive, chooser: { kind: predictive, ttft_s: 2, tpot_s: 0.1 } }\n",
        "predictive.yaml",
    )
    .unwrap()
    .policy
}

fn simulate(sc: &Scenario, policy: &str) -> RunMetrics {
    let p = policy_of(sc, policy);
    let mut traffic = sc.traffic_source(sc.setup.seed).unwrap();
    routelab_sim::run(&sc.setup, &p, &mut *traffic, None).unwrap()
}

/// The sim-to-real tolerances of the headline check: every request played and completed, each
/// worker's share within 0.05 of the simulator's, median TTFT and e2e within 15 %.
fn assert_reproduces(sim: &RunMetrics, m: &RunMetrics) {
    assert_eq!(m.requests, sim.requests);
    assert_eq!(m.completed, m.requests, "every request completes");
    for w in ["pair", "pro6000", "r5090"] {
        let (a, b) = (share(m, w), share(sim, w));
        assert!(
            (a - b).abs() <= 0.05,
            "{w}: share real {a:.3} vs sim {b:.3}"
        );
    }
    let (ts, tr) = (p50(&sim.ttft), p50(&m.ttft));
    let (es, er) = (p50(&sim.e2e), p50(&m.e2e));
    assert!(rel(tr, ts) <= 0.15, "median TTFT real {tr} vs sim {ts}");
    assert!(rel(er, es) <= 0.15, "median e2e real {er} vs sim {es}");
}

fn share(m: &RunMetrics, name: &str) -> f64 {
    let total: u64 = m.workers.iter().map(|w| w.requests).sum();
    let w = m
        .workers
        .iter()
        .find(|w| w.name == name)
        .map_or(0, |w| w.requests);
    w as f64 / total.max(1) as f64
}

fn requests_of(m: &RunMetrics, name: &str) -> u64 {
    m.workers
        .iter()
        .find(|w| w.name == name)
        .map_or(0, |w| w.requests)
}

fn weight_of(m: &RunMetrics, name: &str) -> f64 {
    m.workers
        .iter()
        .find(|w| w.name == name)
        .map_or(f64::NAN, |w| w.final_weight)
}

fn p50(h: &routelab_sim::histogram::Histogram) -> f64 {
    h.quantile_secs(0.5).unwrap_or(f64::NAN)
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b
}

async fn get(c: &HttpClient, url: &str) -> (u16, String) {
    get_as(c, url, None).await
}

/// A GET with an optional bearer token.
async fn get_as(c: &HttpClient, url: &str, token: Option<&str>) -> (u16, String) {
    let mut req = hyper::Request::get(url);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req.body(Full::new(bytes::Bytes::new())).unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), c.request(req))
        .await
        .unwrap()
        .unwrap();
    let status = r.status().as_u16();
    let b = r.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&b).into_owned())
}

async fn post(c: &HttpClient, url: &str, body: &str) -> (u16, String, Duration) {
    let t = Instant::now();
    let req = hyper::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from(body.to_string())))
        .unwrap();
    let r = tokio::time::timeout(Duration::from_secs(20), c.request(req))
        .await
        .unwrap()
        .unwrap();
    let status = r.status().as_u16();
    let b = tokio::time::timeout(Duration::from_secs(20), r.into_body().collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    (
        status,
        String::from_utf8_lossy(&b).into_owned(),
        t.elapsed(),
    )
}

/// One request alone on an emulator takes the model's time: prefill (which brings the first
/// token) + (T - 1) / per-request speed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_request_takes_the_models_time_and_speaks_openai() {
    let _serial = SERIAL.lock().await;
    let p = profile("rtx-pro-6000-27b");
    let mut opts = EmulatorOptions::new(p.clone());
    opts.speedup = 10.0;
    opts.model = "m".into();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let emu = serve(listener, opts).await.unwrap();
    let base = emu.base_url();
    let c = client();
    assert_eq!(get(&c, &format!("{base}/health")).await.0, 200);
    let (s, models) = get(&c, &format!("{base}/v1/models")).await;
    assert_eq!(s, 200);
    assert!(models.contains("\"id\":\"m\""), "{models}");

    // non-streaming: 600 prompt tokens at 6,000 tok/s, then the 211 tokens after the first at
    // 106 tok/s: 2.09 s model
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":212,"prompt_tokens":600}"#;
    let (s, text, took) = post(&c, &format!("{base}/v1/chat/completions"), body).await;
    assert_eq!(s, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 212);
    assert_eq!(v["usage"]["prompt_tokens"], 600);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let want = 0.1 + 211.0 / 106.0;
    let got = took.as_secs_f64() * 10.0;
    assert!(
        (got - want).abs() < 0.05 * want,
        "took {got} s of model time, want {want}"
    );

    // streaming: role chunk, one content event per token, usage, [DONE]
    let body = r#"{"model":"m","prompt":"once upon","max_tokens":20,"min_tokens":20,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}"#;
    let (s, text, _) = post(&c, &format!("{base}/v1/completions"), body).await;
    assert_eq!(s, 200, "{text}");
    let events: Vec<&str> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap())
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"));
    let content = events.iter().filter(|e| e.contains("\"text\":\" ")).count();
    assert_eq!(content, 20, "{text}");
    assert!(events[events.len() - 2].contains("\"completion_tokens\":20"));
    // one token: it is the prefill's, and the request ends with it (issue 10)
    let body = r#"{"model":"m","prompt":"once","max_tokens":1,"stream":true,"stream_options":{"include_usage":true}}"#;
    let (s, text, _) = post(&c, &format!("{base}/v1/completions"), body).await;
    assert_eq!(s, 200, "{text}");
    let content = text.matches("\"text\":\" ").count();
    assert_eq!(content, 1, "{text}");
    assert!(text.contains("\"completion_tokens\":1"), "{text}");

    // errors
    let (s, text, _) = post(
        &c,
        &format!("{base}/v1/chat/completions"),
        r#"{"model":"other","messages":[{"role":"user","content":"x"}]}"#,
    )
    .await;
    assert_eq!(s, 404, "{text}");
    let (s, text, _) = post(
        &c,
        &format!("{base}/v1/completions"),
        r#"{"model":"m","prompt":"x","max_tokens":100,"prompt_tokens":32700}"#,
    )
    .await;
    assert_eq!(s, 400, "{text}");
    assert!(text.contains("context_length_exceeded"));
    let snap = emu.snapshot();
    assert_eq!((snap.in_flight, snap.streams), (0, 0));
    assert_eq!(snap.counters.completed, 3);
    emu.shutdown(Duration::from_secs(1)).await;
}

/// The round trip and the cold start are the model's too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_and_cold_start_follow_the_model() {
    let _serial = SERIAL.lock().await;
    let p = profile("rtx-pro-6000-27b");
    let c = client();
    let body = r#"{"model":"gemma-27b","messages":[{"role":"user","content":"x"}],"max_tokens":212,"prompt_tokens":600}"#;
    let warm_s = 0.1 + 211.0 / 106.0;

    // 400 ms round trip at x5: before admission and on the way back
    let mut opts = EmulatorOptions::new(p.clone());
    opts.speedup = 5.0;
    opts.rtt_ms = 400.0;
    let emu = serve(
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        opts,
    )
    .await
    .unwrap();
    let (s, text, took) = post(&c, &format!("{}/v1/chat/completions", emu.base_url()), body).await;
    assert_eq!(s, 200, "{text}");
    let (got, want) = (took.as_secs_f64() * 5.0, 0.4 + warm_s);
    assert!(
        (got - want).abs() < 0.05 * want,
        "rtt: {got} s, want {want}"
    );
    emu.kill();

    // cold: every rate x0.25 until 2,800 tokens of work (this request is 600 + 211)
    let mut opts = EmulatorOptions::new(p);
    opts.speedup = 20.0;
    opts.overrides.start_cold = true;
    let emu = serve(
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        opts,
    )
    .await
    .unwrap();
    let (s, text, took) = post(&c, &format!("{}/v1/chat/completions", emu.base_url()), body).await;
    assert_eq!(s, 200, "{text}");
    let (got, want) = (took.as_secs_f64() * 20.0, 4.0 * warm_s);
    assert!(
        (got - want).abs() < 0.05 * want,
        "cold: {got} s, want {want}"
    );
    assert!(!emu.snapshot().warm);
    emu.kill();
}

/// The headline check: shares, median TTFT and median end-to-end latency of the gateway with
/// emulated workers match the simulator on the same scenario.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_with_emulators_reproduces_the_simulator() {
    let _serial = SERIAL.lock().await;
    // 180 s of scenario time in 36 s. At x10 the stack's fixed wall-clock overhead per request
    // (~2-3 ms in a debug build, more under CPU contention) becomes 25-50 ms of scenario time,
    // 10-17 % of the median TTFT; at x5 it is ~3 %.
    const K: f64 = 5.0;
    let sc = scenario("emulator/tests/data/sim-to-real.yaml");
    let sim = simulate(&sc, "seed-v3");
    let started = Instant::now();
    let (fleet, gw, url, origin) = stack(&sc, "seed-v3", K).await;
    let real = play_on(&sc, &url, K, origin, "seed-v3", Duration::from_secs(60)).await;
    let wall = started.elapsed();
    let m = &real.metrics;
    eprintln!(
        "sim-to-real ({:.1} s wall): requests sim {} real {}; completed {} / {}; failed {}",
        wall.as_secs_f64(),
        sim.requests,
        m.requests,
        sim.completed,
        m.completed,
        m.failed
    );
    for w in ["pair", "pro6000", "r5090"] {
        eprintln!(
            "  {w:8} share sim {:.3} real {:.3}   weight sim {:.3} real {:.3}",
            share(&sim, w),
            share(m, w),
            weight_of(&sim, w),
            weight_of(m, w)
        );
    }
    let (ts, tr) = (p50(&sim.ttft), p50(&m.ttft));
    let (es, er) = (p50(&sim.e2e), p50(&m.e2e));
    eprintln!(
        "  ttft p50 sim {ts:.4} real {tr:.4} ({:+.1} %); e2e p50 sim {es:.4} real {er:.4} ({:+.1} %)",
        (tr / ts - 1.0) * 100.0,
        (er / es - 1.0) * 100.0
    );
    eprintln!(
        "  ttft p90 sim {:.4} real {:.4}; e2e p90 sim {:.4} real {:.4}",
        sim.ttft.quantile_secs(0.9).unwrap_or(f64::NAN),
        m.ttft.quantile_secs(0.9).unwrap_or(f64::NAN),
        sim.e2e.quantile_secs(0.9).unwrap_or(f64::NAN),
        m.e2e.quantile_secs(0.9).unwrap_or(f64::NAN)
    );
    assert_reproduces(&sim, m);
    gw.kill();
    fleet.shutdown(Duration::ZERO).await;
}

/// `predictive` through the gateway: the router measures each emulated worker's prefill speed
/// and decode curve from the completions it sees (in the gateway's scaled policy time) and
/// predicts TTFT and TPOT from them, as it does in the simulator; shares, median TTFT and
/// median end-to-end latency match the simulator within the headline check's tolerances. The
/// SLO it aims at is written into the policy, so both sides aim at the same bounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predictive_through_the_gateway_reproduces_the_simulator() {
    let _serial = SERIAL.lock().await;
    const K: f64 = 5.0;
    let sc = scenario("emulator/tests/data/sim-to-real.yaml");
    let policy = predictive_policy();
    let mut traffic = sc.traffic_source(sc.setup.seed).unwrap();
    let sim = routelab_sim::run(&sc.setup, &policy.build().unwrap(), &mut *traffic, None).unwrap();
    let fleet = start_fleet(&sc.setup, K).await.unwrap();
    let mut cfg = fleet.gateway_config("predictive", sc.setup.seed, K);
    cfg.policy = policy;
    cfg.admin_token = Some(TOKEN.into());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = Instant::now();
    let gw = routelab_gateway::start_on(cfg, listener).await.unwrap();
    let url = format!("http://{}", gw.local_addr());
    let real = play_on(&sc, &url, K, origin, "predictive", Duration::from_secs(60)).await;
    let m = &real.metrics;
    let (ts, tr) = (p50(&sim.ttft), p50(&m.ttft));
    let (es, er) = (p50(&sim.e2e), p50(&m.e2e));
    eprintln!(
        "predictive sim-to-real: requests sim {} real {}; ttft p50 sim {ts:.4} real {tr:.4} ({:+.1} %); e2e p50 sim {es:.4} real {er:.4} ({:+.1} %)",
        sim.requests,
        m.requests,
        (tr / ts - 1.0) * 100.0,
        (er / es - 1.0) * 100.0
    );
    for w in ["pair", "pro6000", "r5090"] {
        eprintln!(
            "  {w:8} share sim {:.3} real {:.3}",
            share(&sim, w),
            share(m, w)
        );
    }
    // The prefill-bound probe measured each engine's prefill speed through the gateway (its
    // profile's `prefill_tok_s`: PRO 6000 6,000, the pair and the 5090 4,000; the burst's
    // wall time also holds a round trip and the first token's decode step).
    let req = hyper::Request::get(format!("{url}/admin/workers"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Full::new(bytes::Bytes::new()))
        .unwrap();
    let body = client().request(req).await.unwrap().into_body();
    let v: serde_json::Value =
        serde_json::from_slice(&body.collect().await.unwrap().to_bytes()).unwrap();
    gw.kill();
    fleet.shutdown(Duration::ZERO).await;
    for (name, profile_tok_s) in [("pair", 4000.0), ("pro6000", 6000.0), ("r5090", 4000.0)] {
        let w = v["workers"]
            .as_array()
            .and_then(|l| l.iter().find(|w| w["name"] == name))
            .unwrap_or_else(|| panic!("no worker {name}: {v}"));
        let probed = w["probe_prefill_tok_s"].as_f64().unwrap_or(0.0);
        eprintln!("  {name:8} probed prefill {probed:.0} tok/s (profile {profile_tok_s})");
        assert!(
            (probed / profile_tok_s - 1.0).abs() < 0.25,
            "{name}: probed prefill {probed} tok/s, profile {profile_tok_s}: {w}"
        );
    }
    assert_reproduces(&sim, m);
}

/// The scenario's run without an SLO to aim at (`Router::aim_at` ignores a bound that is not
/// finite), for the check that aiming changes what `predictive` does.
fn simulate_blind(sc: &Scenario, policy: &str) -> RunMetrics {
    let mut setup = sc.setup.clone();
    setup.slo.ttft_s = f64::INFINITY;
    setup.slo.tpot_s = f64::INFINITY;
    let mut traffic = sc.traffic_source(sc.setup.seed).unwrap();
    routelab_sim::run(&setup, &policy_of(sc, policy), &mut *traffic, None).unwrap()
}

/// The gateway's `routelab_decisions_total` of one reason, from `/metrics`.
async fn decisions(url: &str, reason: &str) -> u64 {
    let (status, text) = get(&client(), &format!("{url}/metrics")).await;
    assert_eq!(status, 200, "{text}");
    let key = format!("routelab_decisions_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(key.as_str()))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /metrics:\n{text}"))
}

/// One real run of `predictive` (the preset: no bounds in its chooser) behind the gateway,
/// with the top-level `slo` given or not: the metrics and the write-offs it counted.
async fn play_predictive(
    sc: &Scenario,
    slo: Option<routelab_gateway::SloConfig>,
    speedup: f64,
) -> (RunMetrics, u64) {
    let fleet = start_fleet(&sc.setup, speedup).await.unwrap();
    let mut cfg = fleet.gateway_config("predictive", sc.setup.seed, speedup);
    cfg.slo = slo;
    cfg.admin_token = Some(TOKEN.into());
    // With the SLO the configuration is what `--check` passes without a word; without it,
    // `--check` warns that predictive has nothing to aim at.
    assert_eq!(
        cfg.warnings().is_empty(),
        slo.is_some(),
        "{:?}",
        cfg.warnings()
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = Instant::now();
    let gw = routelab_gateway::start_on(cfg, listener).await.unwrap();
    let url = format!("http://{}", gw.local_addr());
    let real = play_on(
        sc,
        &url,
        speedup,
        origin,
        "predictive",
        Duration::from_secs(60),
    )
    .await;
    let written_off = decisions(&url, "write-off").await;
    gw.kill();
    fleet.shutdown(Duration::ZERO).await;
    (real.metrics, written_off)
}

fn print_run(label: &str, m: &RunMetrics) {
    eprintln!(
        "  {label:18} ttft p50 {:.4} p90 {:.4}; e2e p50 {:.4}; shares pair {:.3} pro6000 {:.3} r5090 {:.3}; attainment {:.3}",
        p50(&m.ttft),
        m.ttft.quantile_secs(0.9).unwrap_or(f64::NAN),
        p50(&m.e2e),
        share(m, "pair"),
        share(m, "pro6000"),
        share(m, "r5090"),
        m.slo_attainment().unwrap_or(f64::NAN)
    );
}

/// Issue 41, the gateway runs the router the lab measured: `predictive` as the preset (no
/// bounds written into its chooser) behind a gateway whose top-level `slo` is the scenario's
/// aims at it as the simulator's does at the scenario's, so shares, median TTFT and median e2e
/// match the simulator within the headline check's tolerances. The SLO binds (TPOT 20 ms), so
/// aiming matters: the simulator without it routes differently, and the gateway writes
/// requests off (predicted to miss everywhere), which a predictive without bounds never does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predictive_aims_at_the_gateways_top_level_slo() {
    let _serial = SERIAL.lock().await;
    const K: f64 = 5.0;
    let sc = scenario("emulator/tests/data/sim-to-real-slo.yaml");
    let preset = policy_of(&sc, "predictive");
    assert!(
        matches!(preset.chooser, routelab_policies::Chooser::Predictive(p) if p.ttft_s.is_none() && p.tpot_s.is_none()),
        "the preset carries no bounds of its own: {:?}",
        preset.chooser
    );
    let sim = simulate(&sc, "predictive");
    let blind = simulate_blind(&sc, "predictive");
    let slo = routelab_gateway::SloConfig {
        ttft_s: sc.setup.slo.ttft_s,
        tpot_s: sc.setup.slo.tpot_s,
    };
    let (real, written_off) = play_predictive(&sc, Some(slo), K).await;
    let (real_blind, blind_written_off) = play_predictive(&sc, None, K).await;
    eprintln!("predictive at the gateway's top-level slo ({slo:?}):");
    print_run("sim, aimed", &sim);
    print_run("sim, no slo", &blind);
    print_run("gateway, slo", &real);
    print_run("gateway, no slo", &real_blind);
    eprintln!("  write-offs: gateway with slo {written_off}, without {blind_written_off}");
    assert_reproduces(&sim, &real);
    // Sharp: each real run's shares are nearer the simulation that aims as it was configured
    // than the other (measured: with the slo 0.068 from the aimed simulation, 0.124 from the
    // blind one; without it 0.156 and 0.036, the pair's share 0.078 off the aimed simulation's,
    // beyond the 0.05 tolerance), and only the gateway that aims writes requests off.
    let (near, far) = (shares_apart(&real, &sim), shares_apart(&real, &blind));
    assert!(
        near < far,
        "with the slo: {near:.3} from the aimed sim, {far:.3} from the blind one"
    );
    let (near, far) = (
        shares_apart(&real_blind, &blind),
        shares_apart(&real_blind, &sim),
    );
    assert!(
        near < far,
        "without the slo: {near:.3} from the blind sim, {far:.3} from the aimed one"
    );
    assert!(
        written_off > 0,
        "the gateway aiming at TPOT 20 ms wrote nothing off"
    );
    assert_eq!(
        blind_written_off, 0,
        "a predictive without bounds predicts no miss"
    );
}

/// How far apart two runs' worker shares are (the sum of the absolute differences).
fn shares_apart(a: &RunMetrics, b: &RunMetrics) -> f64 {
    ["pair", "pro6000", "r5090"]
        .iter()
        .map(|w| (share(a, w) - share(b, w)).abs())
        .sum()
}

/// Multi-turn traffic: follow-ups are sent when the previous turn completes, prefixes are
/// shared, and the emulators' prefix caches serve them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_follow_up_and_hit_the_prefix_cache() {
    let _serial = SERIAL.lock().await;
    const K: f64 = 20.0;
    let sc = scenario("emulator/tests/data/conversations.yaml");
    let sim = simulate(&sc, "seed-v3");
    let (fleet, gw, url, origin) = stack(&sc, "seed-v3", K).await;
    let real = play_on(&sc, &url, K, origin, "seed-v3", Duration::from_secs(20)).await;
    gw.kill();
    fleet.shutdown(Duration::ZERO).await;
    let m = &real.metrics;
    eprintln!(
        "conversations: requests sim {} real {}; prefix hit fraction sim {:.3} real {:.3}; \
         e2e p50 sim {:.3} real {:.3}",
        sim.requests,
        m.requests,
        sim.prefix_hit_fraction(),
        m.prefix_hit_fraction(),
        p50(&sim.e2e),
        p50(&m.e2e)
    );
    // the source draws new conversations' turn counts and follow-ups' lengths from one RNG in
    // the order arrivals and completions happen, so the number of turns depends on timing
    assert!(
        m.requests.abs_diff(sim.requests) * 10 <= sim.requests,
        "every conversation was played"
    );
    assert_eq!(m.completed, m.requests);
    assert!(
        m.prefix_hit_fraction() > 0.3,
        "turns reuse their conversation's prefix"
    );
    assert!(rel(m.prefix_hit_fraction(), sim.prefix_hit_fraction()) < 0.25);
}

/// The source's opening finding through gateway + emulators: table weights send 12 of 16 to
/// the pair; the burst probe gives the PRO 6000 the majority, with the simulator's weights.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_at_once_through_the_gateway() {
    let _serial = SERIAL.lock().await;
    const K: f64 = 20.0;
    let sc = scenario("scenarios/seed/sixteen-at-once.yaml");

    let (fleet, gw, url, origin) = stack(&sc, "seed-v1", K).await;
    let v1 = play_on(&sc, &url, K, origin, "seed-v1", Duration::from_secs(20)).await;
    gw.kill();
    fleet.shutdown(Duration::ZERO).await;
    let m = &v1.metrics;
    eprintln!(
        "seed-v1: pair {} pro6000 {}",
        requests_of(m, "pair"),
        requests_of(m, "pro6000")
    );
    assert_eq!(m.completed, 16);
    assert_eq!((requests_of(m, "pair"), requests_of(m, "pro6000")), (12, 4));

    let sim = simulate(&sc, "seed-v3");
    let (fleet, gw, url, origin) = stack(&sc, "seed-v3", K).await;
    let v3 = play_on(&sc, &url, K, origin, "seed-v3", Duration::from_secs(20)).await;
    gw.kill();
    fleet.shutdown(Duration::ZERO).await;
    let m = &v3.metrics;
    let (wp, wq) = (weight_of(m, "pair"), weight_of(m, "pro6000"));
    eprintln!(
        "seed-v3: pair {} pro6000 {} (sim {} / {}); weights pair {wp:.3} pro6000 {wq:.3} (sim {:.3} / {:.3})",
        requests_of(m, "pair"),
        requests_of(m, "pro6000"),
        requests_of(&sim, "pair"),
        requests_of(&sim, "pro6000"),
        weight_of(&sim, "pair"),
        weight_of(&sim, "pro6000"),
    );
    assert_eq!(m.completed, 16);
    assert!(
        requests_of(m, "pro6000") > 8,
        "the PRO 6000 gets the majority"
    );
    assert!(
        rel(wq, weight_of(&sim, "pro6000")) <= 0.10,
        "pro6000 weight {wq}"
    );
    assert!(rel(wp, weight_of(&sim, "pair")) <= 0.10, "pair weight {wp}");
    assert!(rel(wq, 1.37) <= 0.10 && rel(wp, 0.63) <= 0.10);
}

/// Killing an emulator mid-run loses nothing that had not started streaming: the gateway
/// retries it elsewhere; what was streaming from the killed worker ends with an SSE error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_an_emulator_mid_run_loses_no_unstarted_request() {
    let _serial = SERIAL.lock().await;
    const K: f64 = 10.0;
    let mut sc = scenario("emulator/tests/data/sim-to-real.yaml");
    // traffic from 20 s to 80 s of scenario time; the PRO 6000 dies at 50 s
    match &mut sc.traffic[0] {
        TrafficSpec::Poisson(c) => c.until = Until::duration(60_000_000_000),
        other => panic!("expected Poisson traffic, got {other:?}"),
    }
    let (mut fleet, gw, url, origin) = stack(&sc, "seed-v3", K).await;
    let sc2 = sc.clone();
    let url2 = url.clone();
    let player = tokio::spawn(async move {
        play_on(&sc2, &url2, K, origin, "seed-v3", Duration::from_secs(20)).await
    });
    tokio::time::sleep_until((origin + Duration::from_secs(5)).into()).await;
    // kill it while a request is before its first token (prefilling or waiting), so that one
    // must be retried elsewhere, and others are streaming
    let victim = "pro6000";
    let give_up = Instant::now() + Duration::from_secs(2);
    let busy = loop {
        let s = fleet.emulator(victim).unwrap().snapshot();
        if (s.in_flight > s.decoding && s.decoding > 0) || Instant::now() > give_up {
            break s;
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    };
    assert!(fleet.kill(victim));
    let report = player.await.unwrap();
    let mut cut = 0;
    let mut ok = 0;
    let mut after = 0;
    for r in &report.requests {
        if r.record.arrival_s > 50.0 {
            after += 1;
        }
        if r.record.status == Status::Ok {
            ok += 1;
        } else {
            cut += 1;
            assert!(
                r.streamed && r.sse_error && r.record.worker == victim,
                "request {} lost: {r:?}",
                r.record.id
            );
        }
    }
    let (_, metrics) = get(&client(), &format!("{url}/metrics")).await;
    let retries: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("routelab_retries_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    eprintln!(
        "kill: {} requests ({after} after the kill), {ok} ok, {cut} cut mid-stream on {victim}, \
         {retries} retried by the gateway; at the kill its engine had {} in flight, {} decoding",
        report.requests.len(),
        busy.in_flight,
        busy.decoding
    );
    assert!(
        busy.in_flight == busy.decoding || retries >= 1,
        "a request before its first token was retried"
    );
    assert_eq!(report.metrics.requests, report.requests.len() as u64);
    assert!(busy.in_flight > 0, "the victim was busy when killed");
    assert!(after > 50 && ok > 100, "traffic went on after the kill");
    assert!(
        report
            .requests
            .iter()
            .filter(|r| r.record.arrival_s > 51.0)
            .all(|r| r.record.status == Status::Ok && r.record.worker != victim),
        "after the kill everything goes to the others"
    );
    gw.kill();
    fleet.shutdown(Duration::ZERO).await;
}

/// Diagnostic (prints only): time to first token of lone requests straight to an emulator and
/// through the gateway, in wall milliseconds, against the model's prefill time — the stack's
/// fixed per-request overhead, which the speed-up multiplies into scenario time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "diagnostic"]
async fn diagnostic_per_request_overhead() {
    let _serial = SERIAL.lock().await;
    const K: f64 = 10.0;
    let sc = scenario("emulator/tests/data/sim-to-real.yaml");
    let fleet = start_fleet(&sc.setup, K).await.unwrap();
    let mut cfg = fleet.gateway_config("seed-v1", 1, K);
    cfg.workers.retain(|w| w.name == "pro6000");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gw = routelab_gateway::start_on(cfg, listener).await.unwrap();
    let url = format!("http://{}", gw.local_addr());
    let direct = fleet.workers()[1].base_url.clone();
    let c = client();
    for (label, base, n) in [
        ("direct", direct.clone(), 8000),
        ("gateway", url.clone(), 8000),
        ("direct", direct.clone(), 100),
        ("gateway", url.clone(), 100),
        ("direct", direct, 100),
        ("gateway", url, 100),
    ] {
        let content = "x".repeat(n - 10);
        let mut ttfts = Vec::new();
        for _ in 0..15 {
            let body = serde_json::json!({"model":"gemma-27b","messages":[{"role":"user","content":content}],
                "max_tokens":2,"stream":true,"prompt_tokens":2000}).to_string();
            let req = hyper::Request::post(format!("{base}/v1/chat/completions"))
                .header("content-type", "application/json")
                .body(Full::new(bytes::Bytes::from(body)))
                .unwrap();
            let t = Instant::now();
            let r = c.request(req).await.unwrap();
            let mut b = r.into_body();
            let mut first = None;
            while let Some(f) = b.frame().await {
                let f = f.unwrap();
                if let Some(d) = f.data_ref()
                    && first.is_none()
                    && std::str::from_utf8(d).unwrap().contains("\"content\":\" ")
                {
                    first = Some(t.elapsed());
                }
            }
            ttfts.push(first.unwrap().as_secs_f64() * 1e3);
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        ttfts.sort_by(f64::total_cmp);
        // pro6000 / 5090: prefill 2000 tokens alone
        eprintln!(
            "{label} {n}: ttft wall ms p50 {:.2} min {:.2} max {:.2}",
            ttfts[7], ttfts[0], ttfts[14]
        );
    }
    gw.kill();
    fleet.shutdown(Duration::ZERO).await;
}

/// Diagnostic (prints only; `K=10` in the environment sets the speed-up): per-request and
/// per-worker comparison of the simulator and the real stack on the sim-to-real scenario.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "diagnostic"]
async fn diagnostic_sim_vs_real_per_worker() {
    let _serial = SERIAL.lock().await;
    let k: f64 = std::env::var("K")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10.0);
    let sc = scenario("emulator/tests/data/sim-to-real.yaml");
    let p = sc.policies[0].clone();
    let mut traffic = sc.traffic_source(sc.setup.seed).unwrap();
    let mut rows: Vec<routelab_sim::RequestRecord> = Vec::new();
    let sim = routelab_sim::run(&sc.setup, &p, &mut *traffic, Some(&mut rows)).unwrap();
    let (fleet, gw, url, origin) = stack(&sc, "seed-v3", k).await;
    let real = play_on(
        &sc,
        &url,
        k,
        origin,
        "seed-v3",
        Duration::from_secs_f64(450.0 / k),
    )
    .await;
    rows.sort_by_key(|r| r.id);
    let mut by_worker: std::collections::BTreeMap<String, Vec<(f64, f64, f64, f64)>> =
        Default::default();
    let mut arr = Vec::new();
    for (s, r) in rows.iter().zip(&real.requests) {
        arr.push(r.record.arrival_s - s.arrival_s);
        if s.worker == r.record.worker {
            by_worker.entry(s.worker.clone()).or_default().push((
                s.ttft_s.unwrap_or(f64::NAN),
                r.record.ttft_s.unwrap_or(f64::NAN),
                s.e2e_s.unwrap_or(f64::NAN),
                r.record.e2e_s.unwrap_or(f64::NAN),
            ));
        }
    }
    arr.sort_by(f64::total_cmp);
    eprintln!(
        "arrival lateness (real - sim) s: p50 {:.4} p90 {:.4} max {:.4}",
        arr[arr.len() / 2],
        arr[arr.len() * 9 / 10],
        arr[arr.len() - 1]
    );
    for (w, v) in &by_worker {
        let mut d: Vec<f64> = v.iter().map(|x| x.1 - x.0).collect();
        d.sort_by(f64::total_cmp);
        let mut r: Vec<f64> = v.iter().map(|x| x.1 / x.0).collect();
        r.sort_by(f64::total_cmp);
        let mut e: Vec<f64> = v.iter().map(|x| x.3 - x.2).collect();
        e.sort_by(f64::total_cmp);
        eprintln!(
            "{w}: n {} same-worker ttft diff p10 {:.4} p50 {:.4} p90 {:.4}; ratio p50 {:.3}; e2e diff p50 {:.4}",
            v.len(),
            d[d.len() / 10],
            d[d.len() / 2],
            d[d.len() * 9 / 10],
            r[r.len() / 2],
            e[e.len() / 2]
        );
    }
    let (ts, tr) = (p50(&sim.ttft), p50(&real.metrics.ttft));
    eprintln!(
        "ttft p50 sim {ts:.4} real {tr:.4}; cached sim {} real {}",
        sim.cached_tokens, real.metrics.cached_tokens
    );
    let q = |v: &mut Vec<f64>, x: f64| {
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            f64::NAN
        } else {
            v[((v.len() - 1) as f64 * x) as usize]
        }
    };
    for w in ["pair", "pro6000", "r5090"] {
        let mut a: Vec<f64> = rows
            .iter()
            .filter(|r| r.worker == w)
            .map(|r| r.ttft_s.unwrap_or(f64::NAN))
            .collect();
        let mut b: Vec<f64> = real
            .requests
            .iter()
            .filter(|r| r.record.worker == w)
            .map(|r| r.record.ttft_s.unwrap_or(f64::NAN))
            .collect();
        let mut pa: Vec<f64> = rows
            .iter()
            .filter(|r| r.worker == w)
            .map(|r| r.prompt_tokens as f64)
            .collect();
        let mut pb: Vec<f64> = real
            .requests
            .iter()
            .filter(|r| r.record.worker == w)
            .map(|r| r.record.prompt_tokens as f64)
            .collect();
        eprintln!(
            "{w}: sim n {} ttft p50 {:.3} p90 {:.3} prompt p50 {:.0} | real n {} ttft p50 {:.3} p90 {:.3} prompt p50 {:.0}",
            a.len(),
            q(&mut a, 0.5),
            q(&mut a, 0.9),
            q(&mut pa, 0.5),
            b.len(),
            q(&mut b, 0.5),
            q(&mut b, 0.9),
            q(&mut pb, 0.5)
        );
    }
    gw.kill();
    fleet.shutdown(Duration::ZERO).await;
}

/// Diagnostic (prints only): the simulator's own spread over routing seeds with the same
/// traffic — the noise floor of any sim-vs-real comparison.
#[test]
#[ignore = "diagnostic"]
fn diagnostic_sim_routing_seed_spread() {
    let sc = scenario("emulator/tests/data/sim-to-real.yaml");
    let p = sc.policies[0].clone();
    for seed in 1..=12u64 {
        let mut traffic = sc.traffic_source(sc.setup.seed).unwrap();
        let setup = sc.setup_for_seed(seed);
        let m = routelab_sim::run(&setup, &p, &mut *traffic, None).unwrap();
        eprintln!(
            "routing seed {seed}: ttft p50 {:.4} p90 {:.4} e2e p50 {:.4} shares {:.3} {:.3} {:.3}",
            p50(&m.ttft),
            m.ttft.quantile_secs(0.9).unwrap_or(f64::NAN),
            p50(&m.e2e),
            share(&m, "pair"),
            share(&m, "pro6000"),
            share(&m, "r5090")
        );
    }
}

/// Issue 31: the burst probe measures a slow engine. The default 16 × 128-token burst takes
/// ~100 s of model time on an engine that decodes 20 tok/s; the gateway cuts it at
/// `probe.budget_s` (30 s) and measures the tokens streamed within it, so the worker gets a
/// measured weight (not the unmeasured default after a timed-out burst), and the admin view
/// says the measurement was cut. The fast worker's bursts complete and say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_engine_is_measured_within_the_probe_budget() {
    let _serial = SERIAL.lock().await;
    const K: f64 = 10.0;
    let sc = scenario("emulator/tests/data/slow-engine.yaml");
    let (fleet, gw, url, _origin) = stack(&sc, "seed-v3", K).await;
    // warm-up and measure bursts: 2 × 30 s of policy time on the slow worker, 6 s of wall
    let deadline = Instant::now() + Duration::from_secs(30);
    let workers = loop {
        let req = hyper::Request::get(format!("{url}/admin/workers"))
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(Full::new(bytes::Bytes::new()))
            .unwrap();
        let r = client().request(req).await.unwrap();
        let b = r.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        let list = v["workers"].as_array().cloned().unwrap_or_default();
        let measured = list
            .iter()
            .filter(|w| w["last_probe_tok_s"].is_number())
            .count();
        if measured == 2 || Instant::now() > deadline {
            break list;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    gw.kill();
    fleet.shutdown(Duration::ZERO).await;
    let get = |name: &str| {
        workers
            .iter()
            .find(|w| w["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no worker {name}: {workers:?}"))
    };
    let (slow, fast) = (get("slow"), get("fast"));
    eprintln!("slow: {slow}\nfast: {fast}");
    assert_eq!(slow["provenance"], "measured", "{slow}");
    let tok_s = slow["last_probe_tok_s"].as_f64().unwrap();
    assert!(
        (tok_s / 20.0 - 1.0).abs() < 0.25,
        "slow measured at {tok_s} tok/s"
    );
    assert!(
        slow["last_probe_basis"]
            .as_str()
            .is_some_and(|b| b.contains("cut at the budget")),
        "{slow}"
    );
    assert_eq!(fast["provenance"], "measured", "{fast}");
    assert_eq!(fast["last_probe_basis"], "a complete burst", "{fast}");
    assert!(slow["weight"].as_f64().unwrap() < fast["weight"].as_f64().unwrap());
}
