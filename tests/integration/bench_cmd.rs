//! `routelab bench`: a closed-loop sweep of an OpenAI-compatible endpoint, written as `vllm
//! bench serve` results that `profile fit` reads; a sweep that does not reach the engine's
//! capacity is refused (issue 31).

use super::common::{routelab, scratch, text};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `routelab emulate` on a free port, killed on drop.
struct Emulator {
    child: Child,
    url: String,
}

impl Emulator {
    fn start(profile: &str) -> Emulator {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_routelab"))
            .args(["emulate", "--profile", profile, "--port", &port.to_string()])
            .args(["--model", "m"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the emulator did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Emulator { child, url }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_sweep_writes_fit_inputs_and_an_unsaturated_sweep_is_refused() {
    // The 4090's curve still climbs from 1 to 2 sequences: a sweep that stops there is refused.
    let emu = Emulator::start("scenarios/hardware/rtx4090-27b.yaml");
    let dir = scratch("bench-sweep");
    let out = dir.join("sweep");
    let args = [
        "bench",
        &emu.url,
        "--concurrency",
        "1,2",
        "--prompt-tokens",
        "16",
        "--output-tokens",
        "12",
        "--rounds",
        "2",
        "--model",
        "m",
        "--out",
        out.to_str().unwrap(),
    ];
    let o = routelab(&args);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(
        t.contains("the sweep does not saturate") && t.contains("--allow-unsaturated"),
        "{t}"
    );
    // the files were written before the verdict, and a sweep accepted as it is fits
    let mut allowed = args.to_vec();
    allowed.push("--allow-unsaturated");
    let o = routelab(&allowed);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("warning: the sweep does not saturate"), "{t}");
    let c2: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("c2.json")).unwrap()).unwrap();
    assert_eq!(c2["max_concurrency"], 2);
    assert_eq!(c2["completed"], 4);
    assert_eq!(c2["total_output_tokens"], 48);
    let decode = std::fs::read_to_string(out.join("decode.csv")).unwrap();
    assert!(
        decode.starts_with("concurrency,aggregate_tok_s\n1,"),
        "{decode}"
    );
    let files = [out.join("c1.json"), out.join("c2.json")];
    let mut fit = vec![
        "profile".to_string(),
        "fit".into(),
        "--from".into(),
        "vllm-bench".into(),
        "--name".into(),
        "benched".into(),
    ];
    fit.extend(files.iter().map(|f| f.display().to_string()));
    let fit: Vec<&str> = fit.iter().map(String::as_str).collect();
    let o = routelab(&fit);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("fit check"));
}

#[test]
fn bench_refuses_bad_options_and_an_unreachable_engine() {
    let dir = scratch("bench-bad");
    let out = dir.join("x");
    let o = routelab(&[
        "bench",
        "http://127.0.0.1:9",
        "--concurrency",
        "2,1",
        "--prompt-tokens",
        "8",
        "--output-tokens",
        "8",
        "--out",
        out.to_str().unwrap(),
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("increasing order"), "{t}");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let o = routelab(&[
        "bench",
        &format!("http://127.0.0.1:{port}"),
        "--concurrency",
        "1",
        "--prompt-tokens",
        "8",
        "--output-tokens",
        "8",
        "--request-timeout-s",
        "5",
        "--out",
        out.to_str().unwrap(),
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("requests failed at concurrency 1"), "{t}");
}
