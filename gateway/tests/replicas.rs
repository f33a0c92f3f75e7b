//! Gateway replicas sharing their dispatches over a real NATS server (issue 40): each test
//! starts `nats-server` on a free loopback port (`routelab_testkit::NatsServer`; skipped,
//! saying so, when the binary is missing; `scripts/test` installs it) and gateways in front of
//! fake workers. Every wait is a poll with a generous deadline; nothing asserts on time.

#[allow(dead_code)]
#[path = "integration/fake.rs"]
mod fake;
#[allow(dead_code)]
#[path = "integration/harness.rs"]
mod harness;

use fake::FakeWorker;
use harness::*;
use hyper::{Method, StatusCode};
use routelab_gateway::replicas::wire::{self, Body, Header};
use routelab_testkit::NatsServer;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

/// Readiness waits (a busy 2-core machine may be slow; nothing is measured by them).
const READY: Duration = Duration::from_secs(30);
/// A policy without probes that compares in-flight counts (its cap is out of the way).
const POLICY: &str = "equal/jsq:higher-weight/no-affinity/flat:64";

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A unique subject per test, so tests sharing a machine never hear each other.
fn subject(tag: &str) -> String {
    format!("t{}.{tag}", std::process::id())
}

fn replica_block(nats: &str, subject: &str, name: &str) -> String {
    replica_block_with(nats, subject, name, 1.0)
}

/// A `replicas:` block whose peers are forgotten after `peer_timeout_s`.
fn replica_block_with(nats: &str, subject: &str, name: &str, peer_timeout_s: f64) -> String {
    format!(
        "health: {{interval_s: 0}}\nreplicas: {{address: \"{nats}\", subject: \"{subject}\", name: {name}, heartbeat_s: 0.2, peer_timeout_s: {peer_timeout_s}}}\n"
    )
}

async fn get_json(g: &Gateway, path: &str) -> Value {
    let a = send(
        &g.c,
        Method::GET,
        &format!("{}{path}", g.base),
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{path}: {}", a.text());
    a.json()
}

async fn replicas(g: &Gateway) -> Value {
    get_json(g, "/admin/replicas").await
}

async fn metrics(g: &Gateway) -> String {
    send(&g.c, Method::GET, &format!("{}/metrics", g.base), None, "")
        .await
        .text()
}

/// A metric's value (the first series whose line starts with `series`).
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

/// The peers' requests this replica counts on `worker`.
async fn peer_in_flight(g: &Gateway, worker: &str) -> u64 {
    let v = replicas(g).await;
    v["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == worker)
        .and_then(|w| w["peer_in_flight"].as_u64())
        .unwrap_or_else(|| panic!("no worker {worker}: {v}"))
}

fn received(v: &Value) -> u64 {
    v["counters"]["received"].as_u64().unwrap_or(0)
}

/// Wait until every gateway (two or more) is on the bus and has heard every other one since
/// this call: its subscription works now, whatever it heard before a loss of the bus.
async fn wait_sharing(gs: &[&Gateway]) {
    let mut before = Vec::new();
    for g in gs {
        before.push(received(&replicas(g).await));
    }
    for (g, before) in gs.iter().zip(before) {
        wait_for(
            "the replica to be on the bus and hear its peers",
            READY,
            async || {
                let v = replicas(g).await;
                let live = v["peers"]
                    .as_array()
                    .map_or(0, |p| p.iter().filter(|p| p["live"] == true).count());
                v["bus"]["up"] == true
                    && live + 1 >= gs.len()
                    && received(&v) >= before + gs.len() as u64
            },
        )
        .await;
    }
}

/// Publish empty snapshots as `sender` until `g` has received one (its subscription is
/// registered at the server); returns the next sequence number of `sender`.
async fn until_heard(url: &str, subject: &str, g: &Gateway, sender: &str, instance: u64) -> u64 {
    let c = async_nats::connect(url)
        .await
        .expect("a raw client connects");
    let before = received(&replicas(g).await);
    let mut seq = 1;
    wait_for("the gateway to hear a raw publisher", READY, async || {
        let e = event(
            sender,
            instance,
            seq,
            Body::Snapshot {
                watermark: 0,
                ids: vec![],
            },
        );
        seq += 1;
        c.publish(format!("{subject}.{sender}"), e.into())
            .await
            .unwrap();
        c.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        received(&replicas(g).await) > before
    })
    .await;
    seq
}

fn hold(workers: &[&FakeWorker], on: bool) {
    for w in workers {
        if on {
            w.state.hold.store(true, SeqCst);
        } else {
            w.state.release();
        }
    }
}

async fn wait_received(workers: &[&FakeWorker], n: u64) {
    wait_for("the workers to receive the requests", READY, async || {
        workers
            .iter()
            .map(|w| w.state.requests.load(SeqCst))
            .sum::<u64>()
            >= n
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peers_requests_count_in_this_replicas_routing_until_they_end() {
    let Some(bin) = NatsServer::binary_or_skip("a_peers_requests_count") else {
        return;
    };
    let nats = NatsServer::start(bin, &[]).await;
    let subj = subject("count");
    let [w1, w2] = fakes::<2>(0.0).await;
    // Replica A knows only w1, so its requests all go there; B knows both.
    let a = serve(
        POLICY,
        &replica_block(&nats.url(), &subj, "gw-a"),
        &[worker("w1", &w1.url, "m", &[], 8192)],
    )
    .await;
    let b = serve(
        POLICY,
        &replica_block(&nats.url(), &subj, "gw-b"),
        &[
            worker("w1", &w1.url, "m", &[], 8192),
            worker("w2", &w2.url, "m", &[], 8192),
        ],
    )
    .await;
    wait_sharing(&[&a, &b]).await;
    hold(&[&w1, &w2], true);
    let through_a: Vec<_> = (0..3)
        .map(|i| spawn_chat(&a.chat, &format!("a {i}")))
        .collect();
    wait_received(&[&w1], 3).await;
    // B counts A's three requests on w1, though it dispatched none itself.
    wait_for("B to count A's requests", READY, async || {
        peer_in_flight(&b, "w1").await == 3
    })
    .await;
    assert_eq!(peer_in_flight(&b, "w2").await, 0);
    assert_eq!(admin_worker(&b.c, &b.base, "w1").await["in_flight"], 0);
    // So B's own requests go to w2 (3 + 0 against 0, then 1), where without the bus they
    // would tie with w1 and split.
    let through_b: Vec<_> = (0..2)
        .map(|i| spawn_chat(&b.chat, &format!("b {i}")))
        .collect();
    wait_received(&[&w1, &w2], 5).await;
    assert_eq!(w2.state.requests.load(SeqCst), 2, "B sent both to w2");
    assert_eq!(admin_worker(&b.c, &b.base, "w2").await["in_flight"], 2);
    // And A counts B's two on w2 (a worker A does not know: ignored and counted).
    wait_for("A to ignore B's dispatches to w2", READY, async || {
        replicas(&a).await["counters"]["ignored"]["unknown_worker"]
            .as_u64()
            .unwrap_or(0)
            >= 2
    })
    .await;
    hold(&[&w1, &w2], false);
    for t in through_a.into_iter().chain(through_b) {
        assert_eq!(t.await.unwrap().status, StatusCode::OK);
    }
    // Their ends release them on B: nothing is left counted.
    wait_for("B to release A's requests", READY, async || {
        peer_in_flight(&b, "w1").await == 0
    })
    .await;
    let v = replicas(&b).await;
    assert_eq!(v["peer_requests_counted"], 0, "{v}");
    let m = metrics(&a).await;
    // 3 dispatches, 3 first tokens, 3 ends, plus heartbeats.
    assert!(
        metric(&m, "routelab_gateway_bus_events_published_total") >= 9.0,
        "{m}"
    );
    assert_eq!(metric(&m, "routelab_gateway_bus_up"), 1.0);
    assert!(
        m.contains("routelab_gateway_task_restarts_total{task=\"bus\"} 0"),
        "{m}"
    );
    // Every event of A's that B received was applied, none missed.
    let v = replicas(&b).await;
    let peer = &v["peers"][0];
    assert_eq!(
        (peer["name"].as_str(), peer["missed"].as_u64()),
        (Some("gw-a"), Some(0)),
        "{v}"
    );
    assert!(v["freshest_peer_event_age_s"].as_f64().is_some(), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_bus_degrades_to_the_local_view_and_sharing_resumes_after_it() {
    let Some(bin) = NatsServer::binary_or_skip("losing_the_bus") else {
        return;
    };
    let mut nats = NatsServer::start(bin, &[]).await;
    let subj = subject("loss");
    let [w1, w2] = fakes::<2>(0.0).await;
    let workers = [
        worker("w1", &w1.url, "m", &[], 8192),
        worker("w2", &w2.url, "m", &[], 8192),
    ];
    let a = serve(POLICY, &replica_block(&nats.url(), &subj, "gw-a"), &workers).await;
    let b = serve(POLICY, &replica_block(&nats.url(), &subj, "gw-b"), &workers).await;
    wait_sharing(&[&a, &b]).await;
    hold(&[&w1, &w2], true);
    let held: Vec<_> = (0..2)
        .map(|i| spawn_chat(&a.chat, &format!("held {i}")))
        .collect();
    wait_received(&[&w1, &w2], 2).await;
    wait_for("B to count A's requests", READY, async || {
        replicas(&b).await["peer_requests_counted"] == 2
    })
    .await;

    nats.kill();
    // Both notice, log it once, and forget what they counted of the other.
    for g in [&a, &b] {
        wait_for("the bus gauge to drop", READY, async || {
            metric(&metrics(g).await, "routelab_gateway_bus_up") == 0.0
        })
        .await;
    }
    let m = metrics(&b).await;
    assert_eq!(metric(&m, "routelab_gateway_bus_peer_requests"), 0.0, "{m}");
    assert!(
        metric(&m, "routelab_gateway_bus_disconnects_total") >= 1.0,
        "{m}"
    );
    assert!(
        metric(&m, "routelab_gateway_bus_peer_requests_expired_total") >= 2.0,
        "{m}"
    );
    // Requests keep succeeding, the held ones and new ones, through both replicas.
    hold(&[&w1, &w2], false);
    for t in held {
        assert_eq!(t.await.unwrap().status, StatusCode::OK);
    }
    for (i, g) in [&a, &b, &a, &b].into_iter().enumerate() {
        let r = post_chat(&g.c, &g.chat, &format!("down {i}"), 4, i % 2 == 0).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    let m = metrics(&a).await;
    assert!(
        metric(
            &m,
            "routelab_gateway_bus_events_dropped_total{reason=\"bus_down\"}"
        ) >= 3.0,
        "what happened while the bus was down was dropped and counted: {m}"
    );

    // The bus returns: both reconnect by themselves and share again.
    nats.restart().await;
    wait_sharing(&[&a, &b]).await;
    hold(&[&w1, &w2], true);
    let held: Vec<_> = (0..2)
        .map(|i| spawn_chat(&a.chat, &format!("again {i}")))
        .collect();
    wait_for("B to count A's new requests", READY, async || {
        replicas(&b).await["peer_requests_counted"] == 2
    })
    .await;
    hold(&[&w1, &w2], false);
    for t in held {
        assert_eq!(t.await.unwrap().status, StatusCode::OK);
    }
    wait_for("B to release them", READY, async || {
        replicas(&b).await["peer_requests_counted"] == 0
    })
    .await;
    assert_eq!(metric(&metrics(&b).await, "routelab_gateway_bus_up"), 1.0);
}

/// Publish raw payloads on a subject, as a misbehaving peer would.
async fn publish_raw(url: &str, subject: &str, payloads: Vec<Vec<u8>>) {
    let c = async_nats::connect(url)
        .await
        .expect("a raw client connects");
    for p in payloads {
        c.publish(subject.to_string(), p.into()).await.unwrap();
    }
    c.flush().await.unwrap();
}

fn event(sender: &str, instance: u64, seq: u64, body: Body<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    wire::encode(
        &mut out,
        &Header {
            sender,
            instance,
            seq,
        },
        &body,
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_versions_collisions_and_stale_events_are_ignored_and_counted() {
    let Some(bin) = NatsServer::binary_or_skip("garbage") else {
        return;
    };
    let nats = NatsServer::start(bin, &[]).await;
    let subj = subject("garbage");
    let [w1] = fakes::<1>(0.0).await;
    let workers = [worker("w1", &w1.url, "m", &[], 8192)];
    let a = serve(POLICY, &replica_block(&nats.url(), &subj, "gw-a"), &workers).await;
    until_heard(&nats.url(), &subj, &a, "gw-probe", 1).await;
    let before = received(&replicas(&a).await);
    let dispatch = |id| Body::Dispatch {
        id,
        worker: "w1",
        charge: routelab_policies::Charge::NONE,
        prefix: vec![],
    };
    let mut v2 = event("gw-x", 5, 1, Body::FirstToken { id: 1 });
    v2[1] = 2;
    publish_raw(
        &nats.url(),
        &format!("{subj}.gw-x"),
        vec![
            b"not an event".to_vec(),
            Vec::new(),
            v2,
            // Our own name from another instance: a replica configured with our name.
            event("gw-a", 42, 1, Body::FirstToken { id: 1 }),
            // A peer's dispatch to a worker we do not have.
            event(
                "gw-x",
                5,
                1,
                Body::Dispatch {
                    id: 1,
                    worker: "nowhere",
                    charge: routelab_policies::Charge::NONE,
                    prefix: vec![],
                },
            ),
            event("gw-x", 5, 2, dispatch(2)),
            // The same sequence number again.
            event("gw-x", 5, 2, dispatch(3)),
        ],
    )
    .await;
    wait_for("the events to be counted", READY, async || {
        received(&replicas(&a).await) >= before + 7
    })
    .await;
    let v = replicas(&a).await;
    let ignored = &v["counters"]["ignored"];
    for (reason, n) in [
        ("malformed", 2),
        ("version", 1),
        ("collision", 1),
        ("unknown_worker", 1),
        ("stale", 1),
    ] {
        assert_eq!(ignored[reason], n, "{reason}: {v}");
    }
    // The one good dispatch counted; the peer's silence released it.
    wait_for(
        "the silent peer's request to be released",
        READY,
        async || replicas(&a).await["counters"]["expired"] == 1,
    )
    .await;
    let v = replicas(&a).await;
    let gw_x = v["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "gw-x")
        .cloned();
    assert_eq!(gw_x.map(|p| p["events"].clone()), Some(2.into()), "{v}");
    assert_eq!(peer_in_flight(&a, "w1").await, 0);
    let m = metrics(&a).await;
    assert_eq!(
        metric(
            &m,
            "routelab_gateway_bus_events_ignored_total{reason=\"collision\"}"
        ),
        1.0
    );
    assert_eq!(
        metric(&m, "routelab_gateway_bus_peer_requests_expired_total"),
        1.0
    );
    // A second gateway with A's name: its heartbeats are collisions at A (and A's at it).
    let twin = serve(POLICY, &replica_block(&nats.url(), &subj, "gw-a"), &workers).await;
    wait_for(
        "the twin's events to count as collisions",
        READY,
        async || {
            replicas(&a).await["counters"]["ignored"]["collision"]
                .as_u64()
                .unwrap_or(0)
                >= 3
                && replicas(&twin).await["counters"]["ignored"]["collision"]
                    .as_u64()
                    .unwrap_or(0)
                    >= 2
        },
    )
    .await;
    // Nothing of this hurt the gateway or its task.
    let r = post_chat(&a.c, &a.chat, "still fine", 4, false).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        metrics(&a)
            .await
            .contains("routelab_gateway_task_restarts_total{task=\"bus\"} 0")
    );
}

/// A peer's end that never arrives is released by its next snapshot, not kept for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_end_is_released_by_the_peers_next_snapshot() {
    let Some(bin) = NatsServer::binary_or_skip("lost_end") else {
        return;
    };
    let nats = NatsServer::start(bin, &[]).await;
    let subj = subject("lost");
    let [w1] = fakes::<1>(0.0).await;
    // The fake peer sends no heartbeats: a long timeout keeps it from going silent here.
    let a = serve(
        POLICY,
        &replica_block_with(&nats.url(), &subj, "gw-a", 600.0),
        &[worker("w1", &w1.url, "m", &[], 8192)],
    )
    .await;
    let seq = until_heard(&nats.url(), &subj, &a, "gw-p", 9).await;
    let peer = format!("{subj}.gw-p");
    let dispatch = |id| Body::Dispatch {
        id,
        worker: "w1",
        charge: routelab_policies::Charge {
            tokens: 100,
            ..routelab_policies::Charge::NONE
        },
        prefix: vec![7, 8],
    };
    // Two dispatches; then a snapshot that lists only the second (the first one's end was
    // lost).
    publish_raw(
        &nats.url(),
        &peer,
        vec![
            event("gw-p", 9, seq, dispatch(1)),
            event("gw-p", 9, seq + 1, dispatch(2)),
        ],
    )
    .await;
    wait_for("A to count both", READY, async || {
        peer_in_flight(&a, "w1").await == 2
    })
    .await;
    publish_raw(
        &nats.url(),
        &peer,
        vec![event(
            "gw-p",
            9,
            seq + 3,
            Body::Snapshot {
                watermark: 2,
                ids: vec![2],
            },
        )],
    )
    .await;
    wait_for("the snapshot to release the first", READY, async || {
        peer_in_flight(&a, "w1").await == 1
    })
    .await;
    let v = replicas(&a).await;
    assert_eq!(v["counters"]["expired"], 1, "{v}");
    assert_eq!(
        v["counters"]["missed"], 1,
        "one sequence number never came: {v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_config_errors_are_located_and_an_unreachable_bus_is_a_run_time_state() {
    let base = "listen: 127.0.0.1:0\nhealth: {interval_s: 0}\n";
    for (block, field) in [
        ("{address: \"http://127.0.0.1:4222\"}", "replicas.address"),
        (
            "{address: \"nats://u:pw@127.0.0.1:4222\"}",
            "replicas.address",
        ),
        ("{subject: \"a.>\"}", "replicas.subject"),
        ("{name: \"gw a\"}", "replicas.name"),
        (
            "{heartbeat_s: 2, peer_timeout_s: 3}",
            "replicas.peer_timeout_s",
        ),
        ("{publish_queue: 0}", "replicas.publish_queue"),
    ] {
        let e = routelab_gateway::GatewayConfig::from_yaml(
            &format!("{base}replicas: {block}\n"),
            "g.yaml",
        )
        .unwrap_err();
        assert_eq!(e.field, field, "{block}: {e}");
        assert!(!e.to_string().contains("pw@"), "{e}");
    }
    let e = routelab_gateway::GatewayConfig::from_yaml(
        &format!("{base}replicas: {{bogus: 1}}\n"),
        "g.yaml",
    )
    .unwrap_err();
    assert_eq!(
        (e.line, e.field.as_str()),
        (Some(3), "replicas.bogus"),
        "{e}"
    );
    // A bad credentials file fails `--check` at its field, naming the file, never its content.
    let dir = temp_dir("replicas-check");
    std::fs::write(dir.join("bad.creds"), "tokn: hunter2-secret\n").unwrap();
    let yaml = format!(
        "{base}replicas: {{credentials_file: \"{}\"}}\n",
        dir.join("bad.creds").display()
    );
    let (code, out, err) = check_config(&yaml);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(
        err.contains("replicas.credentials_file") && err.contains("bad.creds"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
    let missing = format!("{base}replicas: {{credentials_file: /nonexistent/x.creds}}\n");
    let (code, _, err) = check_config(&missing);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("cannot read"), "{err}");
    // An unreachable bus passes `--check` and the start: the gateway serves on its own view.
    let unreachable = format!(
        "{base}replicas: {{address: \"nats://127.0.0.1:{}\", name: lonely}}\n",
        free_port()
    );
    let (code, out, err) = check_config(&unreachable);
    assert_eq!(code, Some(0), "{out}{err}");
    let [w1] = fakes::<1>(0.0).await;
    let g = serve(
        POLICY,
        &unreachable.replace(base, "health: {interval_s: 0}\n"),
        &[worker("w1", &w1.url, "m", &[], 8192)],
    )
    .await;
    let r = post_chat(&g.c, &g.chat, "alone", 4, false).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = replicas(&g).await;
    assert_eq!(
        (v["bus"]["up"].as_bool(), v["name"].as_str()),
        (Some(false), Some("lonely"))
    );
    assert!(
        v["counters"]["dropped_bus_down"].as_u64().unwrap_or(0) >= 1,
        "{v}"
    );
    // Without the block nothing of the bus shows: no metric, no admin path, no task series.
    let plain = serve(
        POLICY,
        "health: {interval_s: 0}\n",
        &[worker("w1", &w1.url, "m", &[], 8192)],
    )
    .await;
    let m = metrics(&plain).await;
    assert!(
        !m.contains("routelab_gateway_bus_") && !m.contains("task=\"bus\""),
        "{m}"
    );
    let a = send(
        &plain.c,
        Method::GET,
        &format!("{}/admin/replicas", plain.base),
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert!(
        get_json(&plain, "/admin/workers")
            .await
            .get("replicas")
            .is_none()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_from_a_file_let_the_replica_on_an_authenticating_bus() {
    let Some(bin) = NatsServer::binary_or_skip("credentials") else {
        return;
    };
    let nats = NatsServer::start(bin, &["--user", "gw", "--pass", "s3cret-bus-pw"]).await;
    let dir = temp_dir("replicas-creds");
    let good = dir.join("good.creds");
    let bad = dir.join("bad.creds");
    std::fs::write(&good, "user: gw\npassword: s3cret-bus-pw\n").unwrap();
    std::fs::write(&bad, "user: gw\npassword: wrong-pw\n").unwrap();
    let [w1] = fakes::<1>(0.0).await;
    let block = |name: &str, creds: &PathBuf| {
        format!(
            "health: {{interval_s: 0}}\nreplicas: {{address: \"{}\", subject: \"{}\", name: {name}, credentials_file: \"{}\", heartbeat_s: 0.2, peer_timeout_s: 1}}\n",
            nats.url(),
            subject("creds"),
            creds.display()
        )
    };
    let workers = [worker("w1", &w1.url, "m", &[], 8192)];
    let ok = serve(POLICY, &block("gw-ok", &good), &workers).await;
    let refused = serve(POLICY, &block("gw-refused", &bad), &workers).await;
    wait_for(
        "the replica with good credentials on the bus",
        READY,
        async || replicas(&ok).await["bus"]["up"] == true,
    )
    .await;
    // The refused one keeps serving on its own view (and keeps trying).
    let r = post_chat(&refused.c, &refused.chat, "refused", 4, false).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(replicas(&refused).await["bus"]["up"], false);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The cost of sharing, measured (not a pass/fail bound: run with `--ignored --nocapture`):
/// p50 of a closed loop of requests through a gateway in front of an immediate worker, with
/// and without a `replicas:` block, the two gateways' requests interleaved one by one so both
/// see the same machine; first with no peer listening (what the request path and the
/// publishing cost the sender), then with a peer replica in the same process (whose applying
/// shares the same two cores). Also the bus bytes per request, from the server's `/varz`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: cargo test --release -p routelab-gateway --test replicas -- --ignored --nocapture"]
async fn measure_the_cost_of_sharing() {
    let Some(bin) = NatsServer::binary_or_skip("measure") else {
        return;
    };
    let nats = NatsServer::start(bin, &[]).await;
    let subj = subject("measure");
    let [w1] = fakes::<1>(0.0).await;
    let workers = [worker("w1", &w1.url, "m", &[], 8192)];
    let n: usize = std::env::var("BUS_MEASURE_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let body = chat_body("m", "measure the added latency of the bus", 4, false);
    async fn timed(g: &Gateway, body: &str) -> f64 {
        let start = std::time::Instant::now();
        let r = send(&g.c, Method::POST, &g.chat, None, body.to_string()).await;
        assert_eq!(r.status, StatusCode::OK);
        start.elapsed().as_secs_f64() * 1e3
    }
    fn quantile(t: &mut [f64], q: f64) -> f64 {
        t.sort_by(f64::total_cmp);
        t[((t.len() - 1) as f64 * q) as usize]
    }
    let off = serve(POLICY, "health: {interval_s: 0}\n", &workers).await;
    let on = serve(
        POLICY,
        &replica_block(&nats.url(), &subj, "gw-on"),
        &workers,
    )
    .await;
    wait_for("the replica on the bus", READY, async || {
        replicas(&on).await["bus"]["up"] == true
    })
    .await;
    let mut peer = None;
    for setup in ["no peer", "one peer in this process"] {
        if setup != "no peer" {
            let p = serve(
                POLICY,
                &replica_block(&nats.url(), &subj, "gw-peer"),
                &workers,
            )
            .await;
            wait_sharing(&[&on, &p]).await;
            peer = Some(p);
        }
        for round in 0..3 {
            // Warm both.
            for _ in 0..50 {
                timed(&off, &body).await;
                timed(&on, &body).await;
            }
            let before = nats.varz().await;
            let (mut a, mut b) = (Vec::with_capacity(n), Vec::with_capacity(n));
            for _ in 0..n {
                a.push(timed(&off, &body).await);
                b.push(timed(&on, &body).await);
            }
            let after = nats.varz().await;
            let delta = |k: &str| after[k].as_f64().unwrap() - before[k].as_f64().unwrap();
            let (pa, pb) = (quantile(&mut a, 0.5), quantile(&mut b, 0.5));
            eprintln!(
                "{setup}, round {round}: off p50 {pa:.3} ms p99 {:.3} | on p50 {pb:.3} ms p99 {:.3} | added p50 {:.3} ms | bus in {:.1} B/request over {:.2} msgs/request (heartbeats included), out {:.1} B/request",
                quantile(&mut a, 0.99),
                quantile(&mut b, 0.99),
                pb - pa,
                delta("in_bytes") / n as f64,
                delta("in_msgs") / n as f64,
                delta("out_bytes") / n as f64,
            );
        }
    }
    drop(peer);
    let m = metrics(&on).await;
    let published = metric(&m, "routelab_gateway_bus_events_published_total");
    eprintln!(
        "published {published} dropped(full) {}",
        metric(
            &m,
            "routelab_gateway_bus_events_dropped_total{reason=\"full\"}"
        )
    );
    assert!(published >= 3.0 * n as f64, "the bus carried the events");
}

/// One hop of the bus, measured (not a pass/fail bound: run with `--ignored --nocapture`):
/// a publisher and a subscriber, each on its own connection to a loopback `nats-server`,
/// timestamps on one monotonic clock. The publisher sends a 96-byte message (about one
/// dispatch event with a few prefix blocks) every millisecond, as the gateway publishes:
/// without an explicit flush, the client's writer sends it; the subscriber takes the time it
/// arrives. Paced, so the figure is a hop's latency, not a queue's. The simulator's
/// `gateways.bus_latency_s` is this hop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: cargo test --release -p routelab-gateway --test replicas -- --ignored --nocapture"]
async fn measure_the_nats_hop() {
    let Some(bin) = NatsServer::binary_or_skip("measure_the_nats_hop") else {
        return;
    };
    let nats = NatsServer::start(bin, &[]).await;
    let n: usize = std::env::var("BUS_MEASURE_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    let subj = subject("hop");
    let origin = std::time::Instant::now();
    let subscriber = async_nats::connect(nats.url()).await.unwrap();
    let publisher = async_nats::connect(nats.url()).await.unwrap();
    let mut sub = subscriber.subscribe(subj.clone()).await.unwrap();
    subscriber.flush().await.unwrap();
    let receiving = tokio::spawn(async move {
        use futures_util::StreamExt;
        let mut hops = Vec::with_capacity(n);
        while hops.len() < n {
            let Some(msg) = sub.next().await else { break };
            let at = origin.elapsed().as_nanos() as u64;
            let sent = u64::from_le_bytes(msg.payload[..8].try_into().unwrap());
            hops.push((at - sent) as f64 / 1e3);
        }
        hops
    });
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    for _ in 0..n {
        tick.tick().await;
        let mut payload = vec![0u8; 96];
        payload[..8].copy_from_slice(&(origin.elapsed().as_nanos() as u64).to_le_bytes());
        publisher
            .publish(subj.clone(), payload.into())
            .await
            .unwrap();
    }
    let mut hops = tokio::time::timeout(Duration::from_secs(30), receiving)
        .await
        .expect("every message arrives")
        .unwrap();
    assert_eq!(hops.len(), n, "every message arrived");
    hops.sort_by(f64::total_cmp);
    let q = |x: f64| hops[((hops.len() - 1) as f64 * x) as usize];
    eprintln!(
        "nats hop over loopback, {n} messages of 96 B at 1 ms: p50 {:.1} us, p90 {:.1} us, p99 {:.1} us, max {:.1} us",
        q(0.5),
        q(0.9),
        q(0.99),
        hops[hops.len() - 1]
    );
}
