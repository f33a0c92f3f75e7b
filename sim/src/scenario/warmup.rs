//! The fleet's warm-up: when a trace without `start_offset_s` starts.

use super::{Scenario, TrafficSpec};
use crate::event_loop::Gateways;
use crate::traffic::{Arrival, TrafficError, TrafficSource};
use routelab_policies::PolicyConfig;
use std::sync::{Arc, OnceLock};

/// No traffic at all: the warm-up run's source.
struct NoTraffic;

impl TrafficSource for NoTraffic {
    fn next_arrival(&mut self) -> Result<Option<Arrival>, TrafficError> {
        Ok(None)
    }
}

/// A trace that waits for the warm-up cannot start without it: its error is the trace's.
impl From<WarmupError> for TrafficError {
    fn from(e: WarmupError) -> Self {
        TrafficError::config("warm-up", "start_offset_s", e.to_string())
    }
}

/// The fleet's warm-up ([`Scenario::warmup_ns`]), computed on first use and shared by clones.
#[derive(Debug, Clone, Default)]
pub struct Warmup(Arc<OnceLock<Result<u64, WarmupError>>>);

/// Why the fleet's warm-up could not be worked out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WarmupError {
    /// The reference run failed (a fleet the simulator refuses). The run's error is kept as
    /// its text: the result is computed once and shared by every copy of the scenario.
    #[error("the fleet's warm-up run failed: {reason}")]
    RunFailed {
        /// The simulator's error.
        reason: String,
    },
}

/// The policy whose registration probes define the warm-up: the probing preset.
pub const WARMUP_REFERENCE: &str = "seed-v3";

impl Scenario {
    /// The fleet's warm-up, ns: when every worker registered at the fleet's first registration
    /// has its first measured weight, as the probing preset ([`WARMUP_REFERENCE`]) measures
    /// them on this fleet with no traffic (one gateway, no lifecycle events). A trace without
    /// `start_offset_s` starts then, for every policy alike: its requests do not meet the
    /// registration probes, so a probing policy's weights are not measured under customer load
    /// and no policy is judged on the seconds before any router could know the fleet. 0 when
    /// the reference measures no worker.
    ///
    /// # Errors
    /// [`WarmupError::RunFailed`] when the reference run fails (a fleet the simulator refuses).
    pub fn warmup_ns(&self) -> Result<u64, WarmupError> {
        self.warmup
            .0
            .get_or_init(|| {
                let mut setup = self.setup.clone();
                setup.events.clear();
                setup.gateways = Gateways::ONE;
                setup.timeline_ns = 0;
                setup.max_time_ns = 3_600_000_000_000;
                let reference =
                    PolicyConfig::preset(WARMUP_REFERENCE).expect("the warm-up preset exists");
                let m = crate::run(&setup, &reference, &mut NoTraffic, None).map_err(|e| {
                    WarmupError::RunFailed {
                        reason: e.to_string(),
                    }
                })?;
                let first = setup
                    .workers
                    .iter()
                    .map(|w| w.register_at)
                    .min()
                    .unwrap_or(0);
                Ok(setup
                    .workers
                    .iter()
                    .zip(&m.workers)
                    .filter(|(w, _)| w.register_at == first)
                    .filter_map(|(_, t)| t.first_measured_ns)
                    .max()
                    .unwrap_or(0))
            })
            .clone()
    }

    /// What the outputs say about a warm-up: for each trace that starts after the fleet's
    /// warm-up, when and why (empty when no trace does).
    ///
    /// # Errors
    /// [`Scenario::warmup_ns`]'s.
    pub fn warmup_note(&self) -> Result<Option<String>, WarmupError> {
        let auto: Vec<String> = self
            .traffic
            .iter()
            .enumerate()
            .filter(|(_, t)| {
                matches!(t, TrafficSpec::Trace { options, .. } if options.start_after_warmup)
            })
            .map(|(i, _)| format!("traffic[{i}]"))
            .collect();
        if auto.is_empty() {
            return Ok(None);
        }
        let w = self.warmup_ns()?;
        Ok(Some(format!(
            "Warm-up: {} start{} at {:.1} s, when the fleet's registration probes have measured \
             every worker ({WARMUP_REFERENCE}'s probes on this fleet with no traffic), for \
             every policy alike; set `start_offset_s` to choose another start.",
            auto.join(", "),
            if auto.len() == 1 { "s" } else { "" },
            w as f64 / 1e9
        )))
    }

    /// Warnings about trace starts the scenario wrote itself: a trace whose explicit
    /// `start_offset_s` falls inside the fleet's warm-up meets the registration probes with its
    /// first requests, so a probing policy measures its weights under customer load, and every
    /// policy is judged on seconds before any router could know the fleet (issue 41: such an
    /// offset was used silently). Empty when no explicit start is inside the warm-up (the
    /// warm-up run is made only when some trace writes a start).
    ///
    /// # Errors
    /// [`Scenario::warmup_ns`]'s.
    pub fn start_warnings(&self) -> Result<Vec<String>, WarmupError> {
        let explicit: Vec<(usize, u64)> = self
            .traffic
            .iter()
            .enumerate()
            .filter_map(|(i, t)| match t {
                TrafficSpec::Trace { options, .. } if !options.start_after_warmup => {
                    Some((i, options.start_offset))
                }
                _ => None,
            })
            .collect();
        if explicit.is_empty() {
            return Ok(Vec::new());
        }
        let w = self.warmup_ns()?;
        Ok(explicit
            .into_iter()
            .filter(|&(_, offset)| offset < w)
            .map(|(i, offset)| {
                format!(
                    "traffic[{i}]: start_offset_s {} is inside the fleet's warm-up ({:.1} s, \
                     when {WARMUP_REFERENCE}'s registration probes have measured every \
                     worker): its first requests meet the probes, so probing policies measure \
                     their weights under this load; leave start_offset_s out to start after \
                     the warm-up, or set it to at least {:.1}",
                    offset as f64 / 1e9,
                    w as f64 / 1e9,
                    w as f64 / 1e9
                )
            })
            .collect())
    }
}
