//! `routelab replicas`: the study behind several replica counts, its findings section beside
//! the others, and its bad options.

use super::common::{routelab, scratch, text};

#[test]
fn replicas_writes_its_section_and_keeps_the_others() {
    let dir = scratch("replicas-findings");
    let findings = dir.join("findings.md");
    let capacity = "<!-- routelab:capacity:begin (generated; do not edit by hand) -->\n\
                    ## Capacity at the SLO\n<!-- routelab:capacity:end -->\n";
    std::fs::write(&findings, format!("# Findings\n\nBy hand.\n\n{capacity}")).unwrap();
    let f = findings.display().to_string();
    let args = [
        "replicas",
        "scenarios/seed/identical-4090s.yaml",
        "--slo",
        "ttft_p99<=2s",
        "--replicas",
        "1,2",
        "--share",
        "none,probes-and-load",
        "--seeds",
        "1",
        "--policy",
        "seed-v1",
        "--findings",
        &f,
    ];
    let o = routelab(&args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("### seed/identical-4090s at `ttft_p99<=2s`, random split"),
        "{t}"
    );
    assert!(t.contains("| `seed-v1` | seed's | 1 | none |"), "{t}");
    assert!(
        t.contains("| `seed-v1` | seed's | 2 | probes-and-load (sync 1.00 s) |"),
        "{t}"
    );
    let once = std::fs::read_to_string(&findings).unwrap();
    assert!(once.starts_with("# Findings\n\nBy hand.\n\n"), "{once}");
    assert!(once.contains(capacity), "{once}");
    assert!(once.contains("<!-- routelab:replicas:begin"), "{once}");
    assert!(once.contains("## How many gateway replicas"), "{once}");
    // Again: the same bytes (deterministic, replaced in place).
    let o = routelab(&args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(&findings).unwrap(), once);
}

#[test]
fn replicas_refuses_bad_options_with_exit_code_2() {
    for (extra, expected) in [
        (
            &["--replicas", "0"][..],
            "error: --replicas: `0`: 0 is not valid",
        ),
        (
            &["--split", "sticky"][..],
            "error: --split: unknown split `sticky`",
        ),
        (
            &["--share", "all"][..],
            "error: --share: unknown share `all`",
        ),
        (
            &["--seed-policy", "no-such-policy"][..],
            "error: --seed-policy no-such-policy: ",
        ),
    ] {
        let mut args = vec![
            "replicas",
            "scenarios/seed/identical-4090s.yaml",
            "--slo",
            "ttft_p99<=2s",
        ];
        args.extend_from_slice(extra);
        let o = routelab(&args);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", text(&o));
        assert!(text(&o).starts_with(expected), "{extra:?}: {}", text(&o));
    }
}
