//! Issue 40 through real processes: a `nats-server`, 4 gateway replicas sharing every dispatch,
//! first token and end over it (`replicas:`), one emulated engine per worker, and the trace
//! split round-robin across the replicas (the player is the balancer: request k goes to replica
//! k mod 4). The simulator runs the same scenario (`emulator/tests/data/replicas.yaml`:
//! `gateways: {replicas: 4, split: round-robin, share: dispatch-stream}`) and the real run must
//! match it within the sim-to-real tolerances; then the same run with the bus killed half-way
//! loses nothing, shows the loss in `/metrics` and recovers when the bus returns.
//!
//! The policy is `predictive` (the gateway's default), aiming at the same SLO as the
//! single-gateway check. Its probes are shared as the simulator's `dispatch-stream` shares
//! them (one burst per worker, every replica the same measurement): replica 0 starts alone,
//! probes, and writes the state file; replicas 1-3 start on the same state file once the
//! measurements are in it and adopt them without probing — what replicas sharing a state file
//! do in production. (Four replicas probing at once would run four bursts on each worker at
//! the same instant, each measuring the others' load: the simulator's `share: none`.)
//!
//! Skipped, saying so, without a `nats-server` binary. Each run is 100 s of scenario time (325
//! requests): ~21 s of wall time at x5 for the compared run, ~11 s at x10 for the other.

use super::*;
use routelab_gateway::GatewayConfig;
use routelab_testkit::NatsServer;
use serde_json::Value;

/// The speed-up of the run compared with the simulator: at x5 the stack's fixed wall-clock
/// cost per request (4 gateways, 3 emulators and the player on one small machine) is a few % of
/// the median TTFT; at x10 it was +8 % to +16 % on a loaded 2-core VM.
const K_COMPARED: f64 = 5.0;
/// The speed-up of the run with the bus killed, which is not compared with the simulator's
/// latencies: it only has to keep the traffic going while the bus is down and after it returns.
const K_KILLED: f64 = 10.0;
const REPLICAS: usize = 4;
/// Waits for readiness (a busy 2-core machine may be slow; nothing is measured by them).
const READY: Duration = Duration::from_secs(30);

/// 4 replicas on a bus in front of the emulated fleet.
struct Tier {
    fleet: EmulatedFleet,
    gateways: Vec<RunningGateway>,
    urls: Vec<String>,
    /// Scenario time zero: replica 0's start (its registration probes are at t = 0).
    origin: Instant,
    /// The speed-up.
    k: f64,
    dir: PathBuf,
}

impl Tier {
    async fn stop(self) {
        for g in self.gateways {
            g.kill();
        }
        self.fleet.shutdown(Duration::ZERO).await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn replica_config(
    fleet: &EmulatedFleet,
    sc: &Scenario,
    k: f64,
    bus: &str,
    subject: &str,
    r: usize,
    state: &std::path::Path,
) -> GatewayConfig {
    let mut cfg = fleet.gateway_config("predictive", sc.setup.seed, k);
    cfg.policy = predictive_policy();
    cfg.admin_token = Some(TOKEN.into());
    cfg.state_file = Some(state.to_path_buf());
    // A heartbeat of 0.2 s (1 s by default) brings a replica back into its peers' view soon
    // after the bus returns; the timeout is the smallest the block allows around it. The
    // spread is the scenario's, in real seconds at this speed-up (as the bus hop is).
    let spread_s = sc.setup.gateways.share.spread_ns() as f64 / 1e9 / k;
    let block = format!(
        "replicas: {{address: \"{bus}\", subject: \"{subject}\", name: gw-{r}, heartbeat_s: 0.2, peer_timeout_s: 1, spread_s: {spread_s}}}\n"
    );
    cfg.replicas = GatewayConfig::from_yaml(&block, "replica.yaml")
        .unwrap()
        .replicas;
    cfg
}

async fn admin(url: &str, path: &str) -> Value {
    let (status, body) = get_as(&client(), &format!("{url}{path}"), Some(TOKEN)).await;
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// Whether every worker of the replica at `url` has a measured weight and prefill speed.
async fn measured(url: &str) -> bool {
    let v = admin(url, "/admin/workers").await;
    let workers = v["workers"].as_array().cloned().unwrap_or_default();
    !workers.is_empty()
        && workers
            .iter()
            .all(|w| w["provenance"] == "measured" && w["probe_prefill_tok_s"].is_number())
}

/// Workers whose throughput and prefill speed the state file holds.
fn in_state_file(path: &std::path::Path) -> usize {
    let Ok(text) = std::fs::read_to_string(path) else {
        return 0;
    };
    let v: Value = serde_json::from_str(&text).unwrap_or_default();
    v["cache"].as_array().map_or(0, |c| {
        c.iter()
            .filter(|e| e["throughput_tok_s"].is_number() && e["prefill_tok_s"].is_number())
            .count()
    })
}

fn probe_bursts(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("routelab_worker_probes_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A metric's value (the first series whose line starts with `series`).
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

async fn metrics_of(url: &str) -> String {
    get(&client(), &format!("{url}/metrics")).await.1
}

/// Poll until `cond` holds, panicking with `what` after [`READY`].
async fn wait_for(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + READY;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every replica on the bus, hearing its 3 peers.
async fn all_sharing(urls: &[String]) -> bool {
    for u in urls {
        let v = admin(u, "/admin/replicas").await;
        let live = v["peers"]
            .as_array()
            .map_or(0, |p| p.iter().filter(|p| p["live"] == true).count());
        if v["bus"]["up"] != true || live + 1 < urls.len() {
            return false;
        }
    }
    true
}

/// Start the tier: replica 0, its probes, then replicas 1-3 on its state file, all sharing.
async fn start_tier(sc: &Scenario, bus: &NatsServer, tag: &str, k: f64) -> Tier {
    let fleet = start_fleet(&sc.setup, k).await.unwrap();
    let dir = std::env::temp_dir().join(format!("routelab-replicas-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("state.json");
    let subject = format!("t{}.{tag}", std::process::id());
    let config = |r| replica_config(&fleet, sc, k, &bus.url(), &subject, r, &state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = Instant::now();
    let first = routelab_gateway::start_on(config(0), listener)
        .await
        .unwrap();
    let url0 = format!("http://{}", first.local_addr());
    wait_for("replica 0's probes", async || measured(&url0).await).await;
    // The state file is written after the router took the result: wait for the last one.
    wait_for("replica 0's measurements in the state file", async || {
        in_state_file(&state) == sc.setup.workers.len()
    })
    .await;
    let probed = origin.elapsed().as_secs_f64() * k;
    let mut gateways = vec![first];
    let mut urls = vec![url0];
    for r in 1..REPLICAS {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let g = routelab_gateway::start_on(config(r), listener)
            .await
            .unwrap();
        urls.push(format!("http://{}", g.local_addr()));
        gateways.push(g);
    }
    wait_for("the replicas to share", async || all_sharing(&urls).await).await;
    let ready = origin.elapsed().as_secs_f64() * k;
    let start_s = match &sc.traffic[0] {
        TrafficSpec::Poisson(c) => c.start as f64 / 1e9,
        other => panic!("expected Poisson traffic, got {other:?}"),
    };
    eprintln!(
        "{tag}: replica 0 probed by {probed:.1} s, 4 replicas sharing by {ready:.1} s of scenario time (traffic at {start_s} s)"
    );
    assert!(
        ready < start_s,
        "the tier must be up before the traffic: {ready:.1} s of scenario time"
    );
    // Replicas 1-3 took replica 0's measurements from the state file, without a burst.
    for u in &urls[1..] {
        assert!(measured(u).await, "{u} adopted the shared measurements");
        assert_eq!(probe_bursts(&metrics_of(u).await), 0.0, "{u} probed");
    }
    Tier {
        fleet,
        gateways,
        urls,
        origin,
        k,
        dir,
    }
}

async fn play_tier(sc: Scenario, tier_urls: Vec<String>, origin: Instant, k: f64) -> PlayReport {
    let mut opts = PlayOptions::new(k);
    opts.admin_token = Some(TOKEN.into());
    opts.origin = Some(origin);
    opts.policy = "predictive".into();
    let deadline = Duration::from_secs(30);
    opts.deadline = Some(deadline);
    opts.request_timeout = Duration::from_secs(20);
    opts.replicas = tier_urls[1..].to_vec();
    tokio::time::timeout(
        deadline + Duration::from_secs(10),
        play_with(&sc, sc.setup.seed, &tier_urls[0], &opts),
    )
    .await
    .expect("play ends by its deadline")
    .unwrap()
}

fn print_comparison(label: &str, sim: &RunMetrics, m: &RunMetrics) {
    let (ts, tr) = (p50(&sim.ttft), p50(&m.ttft));
    let (es, er) = (p50(&sim.e2e), p50(&m.e2e));
    eprintln!(
        "{label}: requests sim {} real {}; completed {}; ttft p50 sim {ts:.4} real {tr:.4} ({:+.1} %); e2e p50 sim {es:.4} real {er:.4} ({:+.1} %)",
        sim.requests,
        m.requests,
        m.completed,
        (tr / ts - 1.0) * 100.0,
        (er / es - 1.0) * 100.0
    );
    for w in ["pair", "pro6000", "r5090"] {
        eprintln!(
            "  {w:8} share sim {:.3} real {:.3}",
            share(sim, w),
            share(m, w)
        );
    }
}

fn simulate_predictive(sc: &Scenario) -> RunMetrics {
    let mut traffic = sc.traffic_source(sc.setup.seed).unwrap();
    let policy = predictive_policy().build().unwrap();
    routelab_sim::run(&sc.setup, &policy, &mut *traffic, None).unwrap()
}

fn counter(v: &Value, key: &str) -> u64 {
    v["counters"][key].as_u64().unwrap_or(0)
}

/// The shares and TTFT of 4 real replicas on a bus are the simulator's for 4 replicas under
/// `dispatch-stream`; the bus carried every request's events to the 3 other replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_on_a_bus_reproduce_the_simulator() {
    let Some(bin) = NatsServer::binary_or_skip("four_replicas_on_a_bus") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let sc = scenario("emulator/tests/data/replicas.yaml");
    let sim = simulate_predictive(&sc);
    let bus = NatsServer::start(bin, &[]).await;
    let tier = start_tier(&sc, &bus, "rr", K_COMPARED).await;
    // The heartbeats alone, for a second: the traffic's bytes are the rest.
    let idle = Duration::from_secs(1);
    let v0 = bus.varz().await;
    tokio::time::sleep(idle).await;
    let v1 = bus.varz().await;
    let played = Instant::now();
    let real = play_tier(sc.clone(), tier.urls.clone(), tier.origin, tier.k).await;
    let v2 = bus.varz().await;
    let play_s = played.elapsed().as_secs_f64();
    let mut views = Vec::new();
    for u in &tier.urls {
        views.push(admin(u, "/admin/replicas").await);
    }
    tier.stop().await;
    let m = &real.metrics;
    print_comparison("4 replicas on a bus", &sim, m);
    let d = |a: &Value, b: &Value, k: &str| b[k].as_f64().unwrap() - a[k].as_f64().unwrap();
    let n = m.requests as f64;
    let idle_rate = d(&v0, &v1, "in_bytes") / idle.as_secs_f64();
    let (in_b, out_b) = (d(&v1, &v2, "in_bytes"), d(&v1, &v2, "out_bytes"));
    let (in_m, out_m) = (d(&v1, &v2, "in_msgs"), d(&v1, &v2, "out_msgs"));
    eprintln!(
        "  bus: {:.1} messages and {:.0} B in per request ({:.0} B without the heartbeats, {:.0} B/s of them at 0.2 s), {:.0} B out per request ({:.2} deliveries per message)",
        in_m / n,
        in_b / n,
        (in_b - idle_rate * play_s) / n,
        idle_rate,
        out_b / n,
        out_m / in_m
    );
    for v in &views {
        eprintln!(
            "  {}: published {} received {} missed {} expired {} dropped full {} down {}",
            v["name"],
            counter(v, "published"),
            counter(v, "received"),
            counter(v, "missed"),
            counter(v, "expired"),
            counter(v, "dropped_full"),
            counter(v, "dropped_bus_down")
        );
    }
    assert_reproduces(&sim, m);
    // Every request put its dispatch, first token and end on the bus, and the server
    // delivered every message to the 3 other replicas.
    assert!(in_m >= 3.0 * n, "{in_m} messages for {n} requests");
    assert!((out_m / in_m - 3.0).abs() < 0.02, "{out_m} / {in_m}");
    for v in &views {
        // Round-robin: each replica routed a quarter of the requests and published their
        // events.
        assert!(
            counter(v, "published") >= 3 * (m.requests / REPLICAS as u64),
            "{v}"
        );
        assert_eq!(v["bus"]["up"], true, "{v}");
        assert_eq!(counter(v, "missed"), 0, "{v}");
        assert_eq!(
            counter(v, "dropped_full") + counter(v, "dropped_bus_down"),
            0,
            "{v}"
        );
        assert_eq!(counter(v, "task_restarts"), 0, "{v}");
    }
}

/// The same run with the bus killed half-way through the traffic and started again 1.5 s of
/// wall time (15 s of scenario time at x10) later: every request is answered 200, every replica shows
/// the loss in `/metrics` (`bus_up` 0, a disconnect, events dropped while down, the peers'
/// requests released), reconnects on its own and counts its peers' requests again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_bus_half_way_loses_no_request_and_sharing_recovers() {
    let Some(bin) = NatsServer::binary_or_skip("killing_the_bus_half_way") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let sc = scenario("emulator/tests/data/replicas.yaml");
    let sim = simulate_predictive(&sc);
    let (start_s, duration_s) = match &sc.traffic[0] {
        TrafficSpec::Poisson(c) => (
            c.start as f64 / 1e9,
            c.until.duration.expect("a duration") as f64 / 1e9,
        ),
        other => panic!("expected Poisson traffic, got {other:?}"),
    };
    let mut bus = NatsServer::start(bin, &[]).await;
    let tier = start_tier(&sc, &bus, "kill", K_KILLED).await;
    let urls = tier.urls.clone();
    let player = tokio::spawn(play_tier(sc.clone(), urls.clone(), tier.origin, tier.k));
    let at = |scenario_s: f64| tier.origin + Duration::from_secs_f64(scenario_s / tier.k);
    tokio::time::sleep_until(at(start_s + duration_s / 2.0).into()).await;
    bus.kill();
    let killed = Instant::now();
    for u in &urls {
        wait_for("bus_up to drop", async || {
            metric(&metrics_of(u).await, "routelab_gateway_bus_up") == 0.0
        })
        .await;
    }
    let noticed = killed.elapsed();
    let mut down = Vec::new();
    for u in &urls {
        down.push(metrics_of(u).await);
    }
    tokio::time::sleep_until((killed + Duration::from_millis(1500)).into()).await;
    bus.restart().await;
    let restarted = Instant::now();
    wait_for("the replicas to share again", async || {
        all_sharing(&urls).await
    })
    .await;
    let recovered = restarted.elapsed();
    // Peers' dispatches counted again while the traffic goes on.
    wait_for("a replica to count its peers' requests again", async || {
        for u in &urls {
            if admin(u, "/admin/replicas").await["peer_requests_counted"]
                .as_u64()
                .unwrap_or(0)
                > 0
            {
                return true;
            }
        }
        false
    })
    .await;
    let counted_again_at = tier.origin.elapsed().as_secs_f64() * tier.k;
    let real = player.await.unwrap();
    let mut after = Vec::new();
    for u in &urls {
        after.push((metrics_of(u).await, admin(u, "/admin/replicas").await));
    }
    tier.stop().await;
    let m = &real.metrics;
    print_comparison("4 replicas, bus killed half-way", &sim, m);
    eprintln!(
        "  bus down noticed by all in {:.0} ms; all sharing again {:.0} ms after the restart; a peer's request counted again at {counted_again_at:.1} s of scenario time (traffic ends at {:.0} s)",
        noticed.as_secs_f64() * 1e3,
        recovered.as_secs_f64() * 1e3,
        start_s + duration_s
    );
    for (text, v) in &after {
        eprintln!(
            "  {}: disconnects {} dropped while down {} peer requests released {} received {} task restarts {}",
            v["name"],
            metric(text, "routelab_gateway_bus_disconnects_total"),
            metric(
                text,
                "routelab_gateway_bus_events_dropped_total{reason=\"bus_down\"}"
            ),
            metric(text, "routelab_gateway_bus_peer_requests_expired_total"),
            counter(v, "received"),
            counter(v, "task_restarts")
        );
    }
    // Nothing lost: every arrival played, every one answered 200 and completed.
    assert_eq!(m.requests, sim.requests);
    for r in &real.requests {
        assert!(
            r.http_status == Some(200) && r.record.status == Status::Ok,
            "request {} failed: {r:?}",
            r.record.id
        );
    }
    assert_eq!(m.completed, m.requests);
    // The loss showed on every replica while it lasted …
    for text in &down {
        assert_eq!(metric(text, "routelab_gateway_bus_up"), 0.0);
        assert_eq!(
            metric(text, "routelab_gateway_bus_peer_requests"),
            0.0,
            "{text}"
        );
    }
    let expired: f64 = after
        .iter()
        .map(|(t, _)| metric(t, "routelab_gateway_bus_peer_requests_expired_total"))
        .sum();
    assert!(expired >= 1.0, "the peers' requests were released");
    for (text, v) in &after {
        assert!(
            metric(text, "routelab_gateway_bus_disconnects_total") >= 1.0,
            "{text}"
        );
        assert!(
            metric(
                text,
                "routelab_gateway_bus_events_dropped_total{reason=\"bus_down\"}"
            ) >= 1.0,
            "what was dispatched while the bus was down was dropped and counted: {text}"
        );
        // … and it is over: the replica is back on the bus, its task never died.
        assert_eq!(metric(text, "routelab_gateway_bus_up"), 1.0, "{text}");
        assert!(
            text.contains("routelab_gateway_task_restarts_total{task=\"bus\"} 0"),
            "{text}"
        );
        assert_eq!(counter(v, "missed"), 0, "{v}");
    }
}

/// Diagnostic (prints only): the simulator on the replicas scenario behind one gateway and
/// behind 4 replicas under each sharing mode — how far apart the modes are on this fleet, so
/// what the real-process check can tell apart.
#[test]
#[ignore = "diagnostic"]
fn diagnostic_replicas_scenario_by_sharing_mode() {
    use routelab_sim::{Gateways, Share};
    let base = scenario("emulator/tests/data/replicas.yaml");
    let period = 1_000_000_000;
    let hop = base
        .setup
        .gateways
        .share
        .bus_latency_ns()
        .unwrap_or(1_000_000);
    let mut runs = vec![("1 gateway".to_string(), Gateways::ONE)];
    for name in Share::NAMES {
        let mut g = base.setup.gateways;
        g.share = Share::from_name(name, period, hop).unwrap();
        runs.push((format!("4 replicas, {name}"), g));
    }
    for (label, g) in runs {
        let mut sc = base.clone();
        sc.setup.gateways = g;
        let m = simulate_predictive(&sc);
        eprintln!(
            "{label:32} ttft p50 {:.4} p90 {:.4} e2e p50 {:.4} shares {:.3} {:.3} {:.3}",
            p50(&m.ttft),
            m.ttft.quantile_secs(0.9).unwrap_or(f64::NAN),
            p50(&m.e2e),
            share(&m, "pair"),
            share(&m, "pro6000"),
            share(&m, "r5090")
        );
    }
}
