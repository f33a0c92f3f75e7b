//! One module per subcommand.
pub mod bench;
pub mod capacity;
pub mod check;
pub mod compare;
pub mod emulate;
pub mod h2h;
pub mod merge;
pub mod plan;
pub mod policies;
pub mod profile;
pub mod realtime;
pub mod replicas;
pub mod run;
pub mod sweep;
pub mod trace;
pub mod validate;

use routelab_policies::{SloBound, implausible_slo_bound};
use routelab_sim::Scenario;

/// What a valid scenario likely did not mean, for the commands to print as `warning:` lines
/// (stderr; no output file changes): an explicit trace start inside the fleet's warm-up, and
/// an implausible `slo` bound (by the policy crate's one plausibility rule). A warm-up that
/// cannot be computed is left to the run, which reports it as an error.
pub fn scenario_warnings(sc: &Scenario) -> Vec<String> {
    let mut out = sc.start_warnings().unwrap_or_default();
    for (field, bound, x) in [
        ("slo.ttft_s", SloBound::Ttft, sc.setup.slo.ttft_s),
        ("slo.tpot_s", SloBound::Tpot, sc.setup.slo.tpot_s),
    ] {
        if let Some(why) = implausible_slo_bound(bound, x) {
            out.push(format!("{field}: {why}"));
        }
    }
    out
}
