//! The gateway's request log and passive capacity curve, end to end: a scenario played through
//! gateway + emulators is read back from the log file (as JSON, then as a scenario's trace
//! through the lab's `gateway-log` reader), and `/admin/capacity` is checked against the
//! emulated hardware profiles.

use super::*;
use routelab_gateway::config::RequestLogConfig;
use routelab_sim::hardware::fit::{FitInput, FitOptions, FitSource, fit};
use routelab_sim::traffic::LengthDist;
use serde_json::Value;

/// One line of the log, as the test reads it (parsed straight from the JSON).
#[derive(Debug, Clone)]
struct Line {
    arrival_unix_ms: i64,
    prompt_tokens: u32,
    output_tokens: Option<u32>,
    worker: Option<String>,
    status: String,
    ttft_ms: Option<f64>,
}

fn read_log(path: &std::path::Path) -> Vec<Line> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            Line {
                arrival_unix_ms: v["arrival_unix_ms"].as_i64().expect("arrival_unix_ms"),
                prompt_tokens: v["prompt_tokens"].as_u64().expect("prompt_tokens") as u32,
                output_tokens: v["output_tokens"].as_u64().map(|n| n as u32),
                worker: v["worker"].as_str().map(str::to_string),
                status: v["status"].as_str().expect("status").to_string(),
                ttft_ms: v["ttft_ms"].as_f64(),
            }
        })
        .collect()
}

/// 80 s of the sim-to-real scenario's Poisson traffic (3 req/s, outputs 64-384 tokens; prompts
/// shortened to 32-128 tokens) at x10, through a gateway that logs every request: the log holds one `ok`
/// line per played request with the played prompt and output lengths, arriving when the
/// player sent it; the capacity curve of each emulated worker matches its profile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_log_and_the_capacity_curve_reproduce_the_played_scenario() {
    let _serial = SERIAL.lock().await;
    const K: f64 = 10.0;
    let mut sc = scenario("emulator/tests/data/sim-to-real.yaml");
    match &mut sc.traffic[0] {
        TrafficSpec::Poisson(c) => {
            c.until = Until::duration(80_000_000_000);
            // Short prompts: an engine step that prefills a chunk of someone's prompt slows
            // every decoding sequence (chunked prefill), so with the scenario's 500-3,000-token
            // prompts the decode rate observed at n is ~30 % below the profile's pure-decode
            // aggregate(n) — true of the engine, not an error of the curve. With 32-128 tokens
            // a prefill takes one short step per arrival and the profile is the reference.
            c.prompt = LengthDist::Uniform { min: 32, max: 128 };
        }
        other => panic!("expected Poisson traffic, got {other:?}"),
    }
    let dir = std::env::temp_dir().join(format!("routelab-emu-reqlog-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("requests.jsonl");

    let fleet = start_fleet(&sc.setup, K).await.unwrap();
    let mut cfg = fleet.gateway_config("seed-v3", sc.setup.seed, K);
    cfg.admin_token = Some(TOKEN.into());
    cfg.request_log = Some(RequestLogConfig {
        path: path.clone(),
        max_bytes: 100 * 1024 * 1024,
        keep: 1,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = Instant::now();
    let gw = routelab_gateway::start_on(cfg, listener).await.unwrap();
    let url = format!("http://{}", gw.local_addr());
    let report = play_on(&sc, &url, K, origin, "seed-v3", Duration::from_secs(30)).await;
    // The player stops reading at `[DONE]`; the gateway writes a stream's line when its body
    // ends, which on a loaded machine can come a moment later: flush until every played request
    // has its line, or 10 s have passed (the count is then asserted below).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        gw.flush_request_log().await;
        let lines = std::fs::read_to_string(&path).map_or(0, |t| t.lines().count());
        if lines >= report.requests.len() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, capacity) = {
        let req = hyper::Request::get(format!("{url}/admin/capacity"))
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(Full::new(bytes::Bytes::new()))
            .unwrap();
        let r = client().request(req).await.unwrap();
        let status = r.status().as_u16();
        let b = r.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&b).into_owned())
    };
    gw.kill();
    fleet.shutdown(Duration::ZERO).await;

    // The log, read back: one line per played request, all completed.
    let log = read_log(&path);
    let played = &report.requests;
    assert!(played.len() > 150, "{} requests played", played.len());
    assert_eq!(log.len(), played.len(), "one line per request");
    assert!(played.iter().all(|r| r.record.status == Status::Ok));
    let not_ok: Vec<&Line> = log.iter().filter(|l| l.status != "ok").collect();
    assert!(not_ok.is_empty(), "every request completed: {not_ok:?}");

    // Pair each played request with the unpaired line of the same lengths nearest in time.
    // Arrivals are compared relative to the first request on each side, in wall time: the
    // player's arrival is when it sent the request, the log's when the gateway had read it.
    let first_played = played
        .iter()
        .map(|r| r.record.arrival_s)
        .fold(f64::INFINITY, f64::min);
    let first_logged = log.iter().map(|l| l.arrival_unix_ms).min().unwrap();
    let mut used = vec![false; log.len()];
    let mut lateness_ms = Vec::with_capacity(played.len());
    let mut ttft_ratio = Vec::with_capacity(played.len());
    for r in played {
        let rec = &r.record;
        let want_ms = (rec.arrival_s - first_played) / K * 1e3;
        let (i, l) = log
            .iter()
            .enumerate()
            .filter(|(i, l)| {
                !used[*i]
                    && l.prompt_tokens == rec.prompt_tokens
                    && l.output_tokens == Some(rec.output_tokens)
            })
            .min_by(|(_, a), (_, b)| {
                let d = |l: &Line| ((l.arrival_unix_ms - first_logged) as f64 - want_ms).abs();
                d(a).total_cmp(&d(b))
            })
            .unwrap_or_else(|| {
                panic!(
                    "no log line of {} prompt and {} output tokens for request {}",
                    rec.prompt_tokens, rec.output_tokens, rec.id
                )
            });
        used[i] = true;
        assert_eq!(l.worker.as_deref(), Some(rec.worker.as_str()), "{rec:?}");
        if let (Some(logged), Some(played)) = (l.ttft_ms, rec.ttft_s) {
            ttft_ratio.push(logged / (played * 1e3));
        }
        lateness_ms.push((l.arrival_unix_ms - first_logged) as f64 - want_ms);
    }
    lateness_ms.sort_by(f64::total_cmp);
    let worst = lateness_ms.iter().map(|d| d.abs()).fold(0.0_f64, f64::max);
    let q = |x: f64| lateness_ms[((lateness_ms.len() - 1) as f64 * x) as usize];
    eprintln!(
        "request log: {} lines; arrival offset vs played (wall ms): min {:.2} p50 {:.2} p90 {:.2} p99 {:.2} max {:.2}",
        log.len(),
        q(0.0),
        q(0.5),
        q(0.9),
        q(0.99),
        q(1.0)
    );
    // Tolerances, in wall time (×10 for scenario time). Between the player's send and the
    // gateway's handler lie a loopback connection and a small body read: under a millisecond
    // on an idle machine, plus the log's truncation to whole milliseconds (±1 ms). The typical
    // request must see that: a median within 10 ms (0.1 s of scenario time, under a third of
    // the mean gap between arrivals). But player, gateway and emulators share two runtime
    // threads here, on two cores shared with parallel builds, and a request can wait a few
    // hundred ms for a thread: each arrival is only held to 1 s (the played arrivals span
    // 8 s of wall time, so a log stamped with the x10 policy clock, or in other units, would
    // be off by tens of seconds).
    // TTFT in the log is in policy time (the emulated engine's, K times faster than the wall),
    // so it agrees with the player's TTFT in scenario time, where a wall-clock figure would be
    // K times smaller. The gateway stamps the first response byte, the player the first
    // content chunk a loopback hop later: the log reads shorter by 5-36 scenario ms, a fifth
    // of these short prompts' TTFT (measured: ratio p50 0.80, min 0.44). A wall-clock figure
    // would read 0.1.
    ttft_ratio.sort_by(f64::total_cmp);
    let ttft_median = ttft_ratio[ttft_ratio.len() / 2];
    eprintln!(
        "ttft: logged / played: min {:.3} p50 {ttft_median:.3} max {:.3} over {}",
        ttft_ratio[0],
        ttft_ratio[ttft_ratio.len() - 1],
        ttft_ratio.len()
    );
    assert_eq!(
        ttft_ratio.len(),
        played.len(),
        "every request has both TTFTs"
    );
    assert!(
        (0.5..=1.05).contains(&ttft_median),
        "logged TTFT / played TTFT: median {ttft_median}"
    );
    let median = lateness_ms[lateness_ms.len() / 2];
    assert!(median.abs() <= 10.0, "median arrival off by {median:.1} ms");
    assert!(
        worst <= 1000.0,
        "an arrival off by {worst:.1} ms of wall time"
    );

    // The same log replayed by the lab: a scenario whose traffic is the log (`format:
    // gateway-log`, `time_scale: K` to put the wall-clock arrivals back in scenario time)
    // yields, in arrival order, exactly the logged requests — the arrivals and lengths that were
    // just shown to equal the played ones.
    let yaml = format!(
        "name: replayed\nseed: 1\nmodel: gemma-27b\nfleet:\n  - {{ name: pro6000, profile: rtx-pro-6000-27b }}\n\
         traffic:\n  - trace: {{ path: requests.jsonl, format: gateway-log, time_scale: {K} }}\n\
         policies: [seed-v3]\n"
    );
    let replay_file = dir.join("replayed.yaml");
    std::fs::write(&replay_file, yaml).unwrap();
    let replayed = Scenario::load(&replay_file).unwrap_or_else(|e| panic!("{e:#}"));
    let mut source = replayed.traffic_source(1).unwrap();
    let mut arrivals = Vec::new();
    while let Some(a) = source.next_arrival().unwrap() {
        arrivals.push(a);
    }
    let mut logged = log.clone();
    logged.sort_by_key(|l| l.arrival_unix_ms);
    assert_eq!(arrivals.len(), logged.len(), "every logged request replays");
    let first_ns = arrivals[0].at;
    for (a, l) in arrivals.iter().zip(&logged) {
        let want_ns = ((l.arrival_unix_ms - first_logged) as f64 * 1e6 * K).round() as u64;
        assert_eq!(a.at - first_ns, want_ns, "{l:?}");
        assert_eq!(a.prompt_tokens, l.prompt_tokens, "{l:?}");
        assert_eq!(Some(a.output_tokens), l.output_tokens, "{l:?}");
    }
    // Played vs replayed, directly: the same multiset of (prompt, output) lengths.
    let mut played_lengths: Vec<(u32, u32)> = played
        .iter()
        .map(|r| (r.record.prompt_tokens, r.record.output_tokens))
        .collect();
    let mut replayed_lengths: Vec<(u32, u32)> = arrivals
        .iter()
        .map(|a| (a.prompt_tokens, a.output_tokens))
        .collect();
    played_lengths.sort_unstable();
    replayed_lengths.sort_unstable();
    assert_eq!(played_lengths, replayed_lengths);

    // The capacity curve: per emulated worker, the best-observed concurrency's tok/s in the
    // engine's own time against its profile.
    assert_eq!(status, 200, "{capacity}");
    let v: Value = serde_json::from_str(&capacity).unwrap();
    assert_eq!(v["schema"], routelab_gateway::capacity::SCHEMA);
    // The schema the gateway writes is the one `profile fit --from gateway` reads.
    assert_eq!(
        routelab_gateway::capacity::SCHEMA,
        routelab_sim::hardware::fit::GATEWAY_SCHEMA
    );
    assert_eq!(v["model"], "gemma-27b");
    let workers = v["workers"].as_array().unwrap();
    assert_eq!(workers.len(), sc.setup.workers.len());
    for w in &sc.setup.workers {
        let name = &w.spec.name;
        let got = workers
            .iter()
            .find(|x| x["name"] == name.as_str())
            .unwrap_or_else(|| panic!("{name} missing: {v}"));
        let points = got["points"].as_array().unwrap();
        assert!(!points.is_empty(), "{name}: no point");
        let best = points
            .iter()
            .max_by(|a, b| {
                a["observed_s"]
                    .as_f64()
                    .unwrap()
                    .total_cmp(&b["observed_s"].as_f64().unwrap())
            })
            .unwrap();
        let n = best["concurrency"].as_u64().unwrap();
        let tok_s = best["aggregate_tok_s"].as_f64().unwrap();
        let observed = best["observed_s"].as_f64().unwrap();
        let want = w.profile.aggregate_tok_s(n as f64);
        eprintln!(
            "capacity {name}: n {n} observed {observed:.1} s: {tok_s:.1} tok/s, profile {want:.1} ({:+.1} %); points {}",
            (tok_s / want - 1.0) * 100.0,
            points.len()
        );
        for p in points {
            let n = p["concurrency"].as_u64().unwrap();
            assert!(
                p["observed_s"].as_f64().unwrap()
                    >= routelab_gateway::capacity::DEFAULT_MIN_OBSERVED_S,
                "{p}"
            );
            eprintln!(
                "    n {n}: {:.1} tok/s over {:.1} s, profile {:.1}",
                p["aggregate_tok_s"].as_f64().unwrap(),
                p["observed_s"].as_f64().unwrap(),
                w.profile.aggregate_tok_s(n as f64)
            );
        }
        assert!(observed >= 10.0, "{name}: best point observed {observed} s");
        // Measured within 1-3 % here: the prefill step of each arrival (a few %), and tokens
        // that cross the loopback late by a few wall ms (x10) at an interval's edge, hold the
        // observed rate a little under the profile. 10 % leaves room for a loaded machine and
        // still tells n from n ± 1 (the profile's aggregate grows 10-80 % per step here).
        assert!(
            rel(tok_s, want) <= 0.10,
            "{name}: {tok_s} tok/s at {n}, profile {want}"
        );

        // `routelab profile fit --from gateway` on this very answer: a valid profile whose
        // curve passes through the measured points (moved only where noise made them
        // decrease, and then by a few per cent).
        let fitted = fit(
            FitSource::Gateway,
            &[FitInput {
                origin: "admin-capacity.json".into(),
                text: capacity.clone(),
            }],
            &FitOptions {
                name: format!("{name}-fitted"),
                worker: Some(name.clone()),
                ..FitOptions::default()
            },
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        for p in points {
            let n = p["concurrency"].as_u64().unwrap() as f64;
            let measured = p["aggregate_tok_s"].as_f64().unwrap();
            let curve = fitted.profile.aggregate_tok_s(n);
            assert!(
                rel(curve, measured) <= 0.05,
                "{name}: fitted {curve} tok/s at {n}, measured {measured}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
