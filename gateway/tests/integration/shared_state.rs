//! Several gateway processes sharing one `state_file` (replicas on one host or volume): none
//! loses the others' pins or probe results.

use crate::fake::FakeWorker;
use crate::harness::*;
use hyper::{Method, StatusCode};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const SECS_20: Duration = Duration::from_secs(20);
const ROUNDS: usize = 25;
const WORKERS_EACH: usize = 3;

/// A gateway binary running as its own process; killed when dropped, so a failing assertion
/// leaves no process behind.
struct Process {
    child: Child,
    base: String,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start the gateway binary on a free port with `yaml` (its `listen` replaced), stderr to
/// `<dir>/<tag>.log`, and wait until it answers `/health`.
async fn spawn(dir: &Path, tag: &str, yaml: &str, c: &HttpClient) -> Process {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let file = dir.join(format!("{tag}.yaml"));
    std::fs::write(
        &file,
        yaml.replace("listen: 127.0.0.1:0", &format!("listen: 127.0.0.1:{port}")),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_routelab-gateway"))
        .arg("--config")
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("{tag}.log"))).unwrap())
        .spawn()
        .expect("the gateway binary starts");
    let process = Process {
        child,
        base: format!("http://127.0.0.1:{port}"),
    };
    let health = format!("{}/health", process.base);
    wait_for("the gateway to listen", SECS_20, async || {
        let req = hyper::Request::get(&health)
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        matches!(
            tokio::time::timeout(Duration::from_secs(1), c.request(req)).await,
            Ok(Ok(r)) if r.status() == StatusCode::OK
        )
    })
    .await;
    process
}

async fn admin(c: &HttpClient, base: &str, path: &str, body: &str) -> Answer {
    send(
        c,
        Method::POST,
        &format!("{base}/admin/workers/{path}"),
        Some(TOKEN),
        body.to_string(),
    )
    .await
}

/// One replica's rounds: pin (or, every fifth round, unpin) one of its workers, and ask another
/// for a new probe, so that pin writes and probe-result writes of both processes interleave.
/// Returns the pins this replica leaves.
async fn rounds(c: &HttpClient, base: &str, names: &[String]) -> BTreeMap<String, f64> {
    let mut pins = BTreeMap::new();
    for r in 0..ROUNDS {
        let name = &names[r % names.len()];
        let a = if r % 5 == 4 {
            pins.remove(name);
            admin(c, base, &format!("{name}/unpin"), "").await
        } else {
            let weight = 0.5 + (r % 7) as f64 * 0.5;
            pins.insert(name.clone(), weight);
            admin(
                c,
                base,
                &format!("{name}/pin"),
                &format!(r#"{{"weight": {weight}}}"#),
            )
            .await
        };
        assert_eq!(a.status, StatusCode::OK, "round {r}: {}", a.text());
        let other = &names[(r + 1) % names.len()];
        let a = admin(c, base, &format!("{other}/reprobe"), "").await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "round {r}: {}", a.text());
    }
    pins
}

/// The workers' last measured tok/s as the gateway itself holds them.
async fn measurements(c: &HttpClient, base: &str) -> BTreeMap<String, Option<f64>> {
    let a = send(
        c,
        Method::GET,
        &format!("{base}/admin/workers"),
        Some(TOKEN),
        "",
    )
    .await;
    a.json()["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["name"].as_str().unwrap().to_string(),
                w["last_probe_tok_s"].as_f64(),
            )
        })
        .collect()
}

/// Two gateway processes with disjoint workers share one state file and write pins, unpins and
/// probe results concurrently for many rounds. Before the lock and merge, each write replaced
/// the file with the writer's own view, so whichever wrote last erased the other's entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateway_processes_sharing_a_state_file_lose_nothing() {
    let dir = temp_dir("shared-state");
    let state = dir.join("state.json");
    let c = client();
    let mut fakes = Vec::new();
    let mut replicas = Vec::new();
    for tag in ["a", "b"] {
        let mut names = Vec::new();
        let mut workers = Vec::new();
        for i in 0..WORKERS_EACH {
            let fake = FakeWorker::start(1000.0).await;
            let name = format!("{tag}{i}");
            workers.push(worker(&name, &fake.url, "m", &[], 32768));
            names.push(name);
            fakes.push(fake);
        }
        let yaml = config(
            crate::probe_policy(),
            &format!(
                "state_file: {}\nprobe: {{poll_interval_s: 0.02}}\nhealth: {{interval_s: 0}}",
                state.display()
            ),
            &workers,
        );
        replicas.push((spawn(&dir, tag, &yaml, &c).await, names));
    }
    for (p, _) in &replicas {
        wait_for("every worker measured", SECS_20, async || {
            measurements(&c, &p.base)
                .await
                .values()
                .all(Option::is_some)
        })
        .await;
    }

    let (a, b) = (&replicas[0], &replicas[1]);
    let (pins_a, pins_b) = tokio::join!(rounds(&c, &a.0.base, &a.1), rounds(&c, &b.0.base, &b.1));
    let mut pins = pins_a;
    pins.extend(pins_b);
    assert!(
        pins.len() >= 2 && pins.len() < 2 * WORKERS_EACH,
        "the rounds leave pins and unpins on both replicas: {pins:?}"
    );

    // Once the re-probes asked for are done, the file holds each replica's latest measurement
    // of each of its workers, and exactly the pins both left.
    let read = || -> Option<Value> {
        let text = std::fs::read_to_string(&state).ok()?;
        Some(serde_json::from_str(&text).expect("the state file always parses"))
    };
    let deadline = tokio::time::Instant::now() + SECS_20;
    loop {
        let file = read().expect("the state file exists");
        let mut expected = measurements(&c, &a.0.base).await;
        expected.extend(measurements(&c, &b.0.base).await);
        let cached: BTreeMap<String, Option<f64>> = file["cache"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["node"].as_str().unwrap().to_string(),
                    e["throughput_tok_s"].as_f64(),
                )
            })
            .collect();
        let pinned: BTreeMap<String, f64> = file["pins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["node"].as_str().unwrap().to_string(),
                    p["weight"].as_f64().unwrap(),
                )
            })
            .collect();
        if cached == expected && pinned == pins {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the state file lost entries: cache {cached:?} pins {pinned:?}; \
             the gateways hold {expected:?} and pins {pins:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let file = read().unwrap();
    assert_eq!(file["cache"].as_array().unwrap().len(), 2 * WORKERS_EACH);
    // Each write is a whole file: no temporary file is left behind.
    let leftovers: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp."))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    drop(replicas);
    let _ = std::fs::remove_dir_all(&dir);
}
