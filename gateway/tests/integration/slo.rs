//! Issue 41: the gateway runs the router the lab measured. `--check` warns when an SLO-aiming
//! policy has no SLO, and says nothing of it once a top-level `slo` gives one.

use crate::harness::check_config;

#[test]
fn check_warns_when_an_slo_aiming_policy_has_no_slo() {
    let (code, stdout, stderr) = check_config("listen: 127.0.0.1:0\n");
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains(": ok ("), "{stdout}");
    assert!(
        stderr.contains("warning: ") && stderr.contains("policy predictive aims at an SLO"),
        "{stderr}"
    );
    let (code, _, stderr) = check_config("listen: 127.0.0.1:0\nslo: {ttft_s: 30, tpot_s: 0.1}\n");
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("aims at an SLO"), "{stderr}");
    // Implausible bounds are warned about, the run is not refused.
    let (code, _, stderr) = check_config("listen: 127.0.0.1:0\nslo: {ttft_s: 2000, tpot_s: 0.1}\n");
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("slo.ttft_s") && stderr.contains("implausibly long"),
        "{stderr}"
    );
    // A bad one is a located error, exit 2.
    let (code, _, stderr) = check_config("listen: 127.0.0.1:0\nslo: {ttft_s: -1, tpot_s: 0.1}\n");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("slo.ttft_s"), "{stderr}");
}
