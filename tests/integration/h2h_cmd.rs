//! `routelab h2h`: the field's real routers and ours in front of the same emulated workers
//! (issue 39). Every way it can fail names the router or worker and leaves nothing running;
//! with the pinned wheels installed (`scripts/test` installs them), a small head-to-head runs.

use super::common::{routelab, scratch, text};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Two workers, `count` requests at 2 per second.
fn scenario(dir: &Path, count: u32) -> PathBuf {
    let p = dir.join("h2h.yaml");
    std::fs::write(
        &p,
        format!(
            "name: h2h/two-workers\n\
             description: two workers, a few dozen requests\n\
             seed: 7\n\
             model: gemma-27b\n\
             fleet:\n  - {{ name: pair, profile: rtx4090x2-27b }}\n  - {{ name: pro6000, profile: rtx-pro-6000-27b }}\n\
             traffic:\n  - poisson: {{ rate_per_s: 2, count: {count}, prompt: {{ uniform: {{ min: 100, max: 600 }} }}, output: {{ uniform: {{ min: 16, max: 48 }} }} }}\n\
             policies: [seed-v3]\n"
        ),
    )
    .unwrap();
    p
}

/// A venv whose `bin/smg` runs `body` (a shell script) after recording its process id.
fn fake_venv(dir: &Path, body: &str) -> PathBuf {
    let venv = dir.join("fake-venv");
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    let smg = venv.join("bin/smg");
    std::fs::write(
        &smg,
        format!(
            "#!/bin/sh\necho $$ > '{}'\n{body}\n",
            dir.join("router.pid").display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&smg, std::fs::Permissions::from_mode(0o755)).unwrap();
    venv
}

fn alive(pid: &str) -> bool {
    Path::new("/proc").join(pid.trim()).exists()
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(needle) {
                found.push(format!("{}: {cmd}", e.file_name().to_string_lossy()));
            }
        }
    }
    found
}

#[test]
fn an_unknown_router_or_policy_is_refused_with_what_is_valid() {
    let dir = scratch("h2h-bad-router");
    let sc = scenario(&dir, 4);
    let o = routelab(&[
        "h2h",
        sc.to_str().unwrap(),
        "--routers",
        "ours,sglang:kv_aware",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let t = text(&o);
    assert!(
        t.contains("`kv_aware` is not a policy of sglang; valid: cache_aware, power_of_two, round_robin, random"),
        "{t}"
    );
    let o = routelab(&["h2h", sc.to_str().unwrap(), "--routers", "haproxy"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("unknown router `haproxy`"),
        "{}",
        text(&o)
    );
}

#[test]
fn field_routers_that_are_not_installed_are_named_before_anything_starts() {
    let dir = scratch("h2h-not-installed");
    let sc = scenario(&dir, 4);
    let missing = dir.join("no-venv");
    let o = routelab(&[
        "h2h",
        sc.to_str().unwrap(),
        "--routers",
        "ours,vllm:power_of_two",
        "--field-routers",
        missing.to_str().unwrap(),
        "--out",
        dir.join("out").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let t = text(&o);
    assert!(
        t.contains("vllm:power_of_two") && t.contains("deploy/field-routers/install.sh"),
        "{t}"
    );
    assert!(!t.contains("load 1, seed"), "nothing ran: {t}");
}

#[test]
fn a_router_that_exits_at_start_is_named_with_its_log() {
    let dir = scratch("h2h-exits");
    let sc = scenario(&dir, 4);
    let venv = fake_venv(&dir, "echo 'cannot bind: boom' >&2\nexit 3");
    let out = dir.join("out");
    let o = routelab(&[
        "h2h",
        sc.to_str().unwrap(),
        "--routers",
        "sglang:round_robin",
        "--field-routers",
        venv.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let t = text(&o);
    assert!(
        t.contains("sglang:round_robin did not start: it exited at start (exit status: 3)"),
        "{t}"
    );
    let log = out.join("logs/sglang_round_robin-load1-seed7.log");
    assert!(t.contains(log.to_str().unwrap()), "{t}");
    assert!(std::fs::read_to_string(&log).unwrap().contains("boom"));
}

#[test]
fn a_router_that_never_gets_ready_is_stopped_by_its_process_id() {
    let dir = scratch("h2h-never-ready");
    let sc = scenario(&dir, 4);
    let venv = fake_venv(&dir, "exec sleep 300");
    let o = routelab(&[
        "h2h",
        sc.to_str().unwrap(),
        "--routers",
        "sglang:cache_aware",
        "--field-routers",
        venv.to_str().unwrap(),
        "--start-timeout-s",
        "1.5",
        "--out",
        dir.join("out").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let t = text(&o);
    assert!(
        t.contains("sglang:cache_aware did not start: not ready within 1.5s"),
        "{t}"
    );
    let pid = std::fs::read_to_string(dir.join("router.pid")).unwrap();
    assert!(!alive(&pid), "the router process {pid} was stopped");
}

#[test]
fn a_port_in_use_is_named() {
    let dir = scratch("h2h-port");
    let sc = scenario(&dir, 4);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let o = routelab(&[
        "h2h",
        sc.to_str().unwrap(),
        "--routers",
        "ours",
        "--router-port",
        &port,
        "--out",
        dir.join("out").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let t = text(&o);
    assert!(
        t.contains(&format!("ours: port {port} on 127.0.0.1 is in use")),
        "{t}"
    );
}

#[test]
fn a_worker_that_disappears_mid_run_is_named() {
    let dir = scratch("h2h-worker-gone");
    // 200 requests at 2/s: 100 s of traffic, 10 s at x10; the worker goes after 1 s.
    let sc = scenario(&dir, 200);
    let o = routelab(&[
        "h2h",
        sc.to_str().unwrap(),
        "--routers",
        "ours",
        "--speedup",
        "10",
        "--kill-worker-after",
        "pro6000:1",
        "--out",
        dir.join("out").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let t = text(&o);
    assert!(
        t.contains("worker `pro6000` disappeared mid-run under ours: GET /health"),
        "{t}"
    );
}

/// The pinned routers' venv, when `deploy/field-routers/install.sh` installed it.
fn installed_field_routers() -> Option<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/field-routers/install.sh");
    let check = Command::new("bash")
        .arg(&script)
        .arg("check")
        .status()
        .ok()?;
    if !check.success() {
        return None;
    }
    let path = Command::new("bash")
        .arg(&script)
        .arg("path")
        .output()
        .ok()?;
    Some(PathBuf::from(String::from_utf8_lossy(&path.stdout).trim()))
}

/// Issue 39's CI head-to-head: two workers, one field router (vLLM's round robin) and ours, a
/// few dozen requests; every request completes through both, the field router's shares are
/// seen through `x-routelab-worker`, and no router process is left.
#[test]
fn a_small_head_to_head_with_a_real_field_router() {
    let Some(venv) = installed_field_routers() else {
        eprintln!(
            "skipped: the field's routers are not installed (deploy/field-routers/install.sh; scripts/test installs them)"
        );
        return;
    };
    let dir = scratch("h2h-small");
    let sc = scenario(&dir, 36);
    // Through a link under the scratch directory, so the router's command line names it.
    let link = dir.join("venv");
    std::os::unix::fs::symlink(&venv, &link).unwrap();
    let out = dir.join("out");
    let o = routelab(&[
        "h2h",
        sc.to_str().unwrap(),
        "--routers",
        "ours,vllm:round_robin",
        "--speedup",
        "10",
        "--field-routers",
        link.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let csv = std::fs::read_to_string(out.join("runs.csv")).unwrap();
    let mut lines = csv.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| head.iter().position(|h| *h == name).unwrap();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 2, "{csv}");
    for r in &rows {
        assert_eq!(r[col("requests")], "36", "{csv}");
        assert_eq!(r[col("completed")], "36", "every request completes: {csv}");
        let shares: f64 = ["share:pair", "share:pro6000"]
            .iter()
            .map(|c| r[col(c)].parse::<f64>().unwrap())
            .sum();
        assert!(
            (shares - 1.0).abs() < 1e-9,
            "every request has its worker: {csv}"
        );
    }
    let vllm = rows
        .iter()
        .find(|r| r[col("router")] == "vllm:round_robin")
        .unwrap();
    for c in ["share:pair", "share:pro6000"] {
        let s: f64 = vllm[col(c)].parse().unwrap();
        assert!(
            (0.4..=0.6).contains(&s),
            "round robin splits two workers evenly: {c} = {s}"
        );
    }
    assert!(out.join("compare.json").is_file() && out.join("report.html").is_file());
    let left = processes_mentioning(link.to_str().unwrap());
    assert!(left.is_empty(), "nothing left running: {left:?}");
}

#[test]
fn reuse_writes_the_findings_part_and_the_copies_from_an_earlier_runs_csv() {
    let dir = scratch("h2h-reuse");
    let sc = scenario(&dir, 12);
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    // What two real-time runs at one load and two seeds wrote (ours and vLLM's round robin).
    let mut csv = String::from(
        "load,router,seed,requests,completed,failed,rejected,slo_attainment,ttft_mean_s,ttft_p50_s,ttft_p99_s,tpot_p50_s,tpot_p99_s,e2e_mean_s,e2e_p50_s,e2e_p99_s,share:pair,share:pro6000\n",
    );
    for seed in [7, 8] {
        csv.push_str(&format!(
            "1,ours,{seed},12,12,0,0,1,0.2,0.2,0.4,0.02,0.03,1.5,1.4,2,0.25,0.75\n"
        ));
        csv.push_str(&format!(
            "1,vllm:round_robin,{seed},12,12,0,0,0.5,0.9,0.5,3,0.02,0.04,2.5,2,5,0.5,0.5\n"
        ));
    }
    std::fs::write(out.join("runs.csv"), csv).unwrap();
    let findings = dir.join("findings.md");
    std::fs::write(&findings, "# Findings\n\nkept\n").unwrap();
    let o = routelab(&[
        "h2h",
        sc.to_str().unwrap(),
        "--reuse",
        "--out",
        out.to_str().unwrap(),
        "--findings",
        findings.to_str().unwrap(),
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let doc = std::fs::read_to_string(&findings).unwrap();
    assert!(doc.starts_with("# Findings\n\nkept\n"), "{doc}");
    assert!(doc.contains("## Against the originals"), "{doc}");
    assert!(doc.contains("### h2h/two-workers"), "{doc}");
    assert!(
        doc.contains("| 1 | `vllm:round_robin` | 50.0% ± 0.0 | -50.0 [-50.0, -50.0] ! |"),
        "{doc}"
    );
    assert!(
        doc.contains("Ours meets the SLO at a load where none of theirs does"),
        "{doc}"
    );
    // The copies ran in the simulator on the same load and seeds: round robin splits evenly.
    assert!(
        doc.contains("| 1 | `vllm:round_robin` | `equal/round-robin/no-affinity/none` |"),
        "{doc}"
    );
    let copies = std::fs::read_to_string(out.join("copies.csv")).unwrap();
    assert_eq!(
        copies.lines().count(),
        1 + 4,
        "two routers x two seeds: {copies}"
    );
    assert!(
        copies
            .lines()
            .any(|l| l.starts_with("1,vllm:round_robin,8,12,")),
        "{copies}"
    );
    assert!(out.join("h2h.svg").is_file() && out.join("h2h.png").is_file());
    // Nothing to reuse: said plainly.
    let empty = dir.join("empty");
    let o = routelab(&[
        "h2h",
        sc.to_str().unwrap(),
        "--reuse",
        "--out",
        empty.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("runs.csv: cannot read"), "{}", text(&o));
}
