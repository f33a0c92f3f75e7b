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
/// The worker both replicas route to, pin, unpin and probe.
const SHARED: &str = "shared";

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

/// The pins in the state file, by node.
fn file_pins(file: &Value) -> BTreeMap<String, f64> {
    file["pins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["node"].as_str().unwrap().to_string(),
                p["weight"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// Two gateway processes share one state file and write pins, unpins and probe results
/// concurrently for many rounds, each on workers of its own and on one worker both have. Before
/// the lock and merge, each write replaced the file with the writer's own view, so whichever
/// wrote last erased the other's entries. Then pins and unpins of the shared worker that do not
/// change the replica's own view (before the fix, not written though answered 200) must reach
/// the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateway_processes_sharing_a_state_file_lose_nothing() {
    let dir = temp_dir("shared-state");
    let state = dir.join("state.json");
    let c = client();
    let shared = FakeWorker::start(1000.0).await;
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
        // Last, so that the rounds end on an unpin of an own worker and pins of the others.
        names.push(SHARED.to_string());
        workers.push(worker(SHARED, &shared.url, "m", &[], 32768));
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
    // Both replicas pinned and unpinned the shared worker at once: what the file holds for it
    // depends on the interleaving, and the steps below settle it.
    pins.remove(SHARED);
    assert!(
        pins.len() >= 2 && pins.len() < 2 * WORKERS_EACH,
        "the rounds leave pins and unpins on both replicas: {pins:?}"
    );
    let read = || -> Option<Value> {
        let text = std::fs::read_to_string(&state).ok()?;
        Some(serde_json::from_str(&text).expect("the state file always parses"))
    };

    // One replica after the other on the shared worker; an admin change is written before it
    // is answered, so the file shows it at once. Each step's expected pin holds only if the
    // change is written even when the replica's own view already held it.
    let pin = |w: f64| format!(r#"{{"weight": {w}}}"#);
    let steps = [
        (&a.0, "unpin", String::new(), None),
        (&b.0, "unpin", String::new(), None),
        (&a.0, "pin", pin(2.0), Some(2.0)),
        // B's own view has no pin: its unpin still removes A's.
        (&b.0, "unpin", String::new(), None),
        (&b.0, "pin", pin(3.0), Some(3.0)),
        // A's own view already holds 2: its pin still replaces B's 3.
        (&a.0, "pin", pin(2.0), Some(2.0)),
    ];
    for (i, (replica, action, body, expected)) in steps.into_iter().enumerate() {
        let answer = admin(&c, &replica.base, &format!("{SHARED}/{action}"), &body).await;
        assert_eq!(answer.status, StatusCode::OK, "step {i}: {}", answer.text());
        let file = read().expect("the state file exists");
        assert_eq!(
            file_pins(&file).get(SHARED).copied(),
            expected,
            "step {i} ({action} through {}): the file's pin of the shared worker",
            replica.base
        );
    }
    pins.insert(SHARED.to_string(), 2.0);

    // Once the re-probes asked for are done, the file holds each replica's latest measurement
    // of each of its own workers and the newer of the two of the shared one, and exactly the
    // pins both left.
    let deadline = tokio::time::Instant::now() + SECS_20;
    loop {
        let file = read().expect("the state file exists");
        let held_by_a = measurements(&c, &a.0.base).await;
        let held_by_b = measurements(&c, &b.0.base).await;
        let mut cached: BTreeMap<String, Option<f64>> = file["cache"]
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
        let shared_cached = cached.remove(SHARED);
        let shared_held = [held_by_a[SHARED], held_by_b[SHARED]];
        let mut expected = held_by_a;
        expected.extend(held_by_b);
        expected.remove(SHARED);
        let pinned = file_pins(&file);
        if cached == expected
            && shared_cached.is_some_and(|v| shared_held.contains(&v))
            && pinned == pins
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the state file lost entries: cache {cached:?} and {SHARED} {shared_cached:?}, \
             pins {pinned:?}; the gateways hold {expected:?} and {SHARED} {shared_held:?}, \
             pins {pins:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let file = read().unwrap();
    assert_eq!(
        file["cache"].as_array().unwrap().len(),
        2 * WORKERS_EACH + 1
    );
    // Each write is a whole file: no temporary file is left behind. One may exist for a moment,
    // while a write of a probe still running is under way; a leaked one stays.
    wait_for("no temporary file left behind", SECS_20, async || {
        std::fs::read_dir(&dir)
            .unwrap()
            .all(|e| !e.unwrap().file_name().to_string_lossy().contains(".tmp."))
    })
    .await;
    drop(replicas);
    let _ = std::fs::remove_dir_all(&dir);
}
