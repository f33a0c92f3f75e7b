//! Integration tests of `routelab-policies`: the source's calibration figures, the probe
//! lifecycle, choosers, affinity, caps, typed errors, configuration errors and property-based
//! invariants. One test binary; modules by theme.

mod affinity;
mod affinity_index;
mod caps;
mod choosers;
mod common;
mod config_errors;
mod errors;
mod explain;
mod invariants;
mod knowledge;
mod peers;
mod probe_lifecycle;
mod regressions;
mod source_figures;
mod weights_shaping;
