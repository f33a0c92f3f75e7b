//! The engine mode of a worker (`engine: fluid | step` in a scenario) and [`Engine`], the one
//! type the event loop holds: a fluid [`EngineModel`] (the fast default) or a step-level
//! [`StepEngine`] (the reference), with the same API.

use std::fmt;
use std::sync::Arc;

use routelab_policies::KvEvent;

use super::{AdmitInfo, EngineModel, EngineOutput, EngineOverrides, StepEngine};
use crate::hardware::HardwareProfile;

/// How a worker's engine is simulated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum EngineMode {
    /// Fluid processor sharing between events ([`EngineModel`]): fast, the default.
    #[default]
    Fluid,
    /// Discrete steps with vLLM's scheduler ([`StepEngine`]): one event per step.
    Step,
}

impl EngineMode {
    /// Every mode's name, in the order `valid:` lists show them.
    pub const NAMES: [&'static str; 2] = ["fluid", "step"];

    /// The mode called `name`.
    ///
    /// # Errors
    /// A message naming the unknown mode and the valid ones.
    pub fn parse(name: &str) -> Result<EngineMode, String> {
        match name {
            "fluid" => Ok(EngineMode::Fluid),
            "step" => Ok(EngineMode::Step),
            other => Err(format!(
                "unknown engine mode `{other}`; valid: {}",
                Self::NAMES.join(", ")
            )),
        }
    }

    /// The mode's name as a scenario writes it.
    pub const fn name(self) -> &'static str {
        match self {
            EngineMode::Fluid => Self::NAMES[0],
            EngineMode::Step => Self::NAMES[1],
        }
    }
}

impl fmt::Display for EngineMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One simulated engine in either mode. Every method is the mode's own (see
/// [`EngineModel`]); the match costs a predictable branch, so a fluid run's results are the
/// fluid engine's, byte for byte.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // one per worker, never moved in a hot loop
pub enum Engine {
    /// The fluid model.
    Fluid(EngineModel),
    /// The step-level model.
    Step(StepEngine),
}

macro_rules! delegate {
    ($( $(#[$doc:meta])* fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty; )*) => {
        $( $(#[$doc])* #[inline]
        pub fn $name(&self $(, $arg: $ty)*) -> $ret {
            match self {
                Engine::Fluid(e) => e.$name($($arg),*),
                Engine::Step(e) => e.$name($($arg),*),
            }
        } )*
    };
}

macro_rules! delegate_mut {
    ($( $(#[$doc:meta])* fn $name:ident(&mut self $(, $arg:ident: $ty:ty)*) -> $ret:ty; )*) => {
        $( $(#[$doc])* #[inline]
        pub fn $name(&mut self $(, $arg: $ty)*) -> $ret {
            match self {
                Engine::Fluid(e) => e.$name($($arg),*),
                Engine::Step(e) => e.$name($($arg),*),
            }
        } )*
    };
}

impl Engine {
    /// A warm engine (cold if `overrides.start_cold`) of the given mode, ready at time 0.
    ///
    /// # Panics
    /// If `overrides` fail [`EngineOverrides::validate`].
    pub fn new(
        mode: EngineMode,
        profile: Arc<HardwareProfile>,
        overrides: EngineOverrides,
        seed: u64,
    ) -> Engine {
        match mode {
            EngineMode::Fluid => Engine::Fluid(EngineModel::new(profile, overrides, seed)),
            EngineMode::Step => Engine::Step(StepEngine::new(profile, overrides, seed)),
        }
    }

    /// Which mode it runs in.
    pub fn mode(&self) -> EngineMode {
        match self {
            Engine::Fluid(_) => EngineMode::Fluid,
            Engine::Step(_) => EngineMode::Step,
        }
    }

    delegate! {
        /// The hardware profile.
        fn profile(&self) -> &Arc<HardwareProfile>;
        /// The time (ns) of the engine's next event, if any.
        fn next_event_time(&self) -> Option<u64>;
        /// Bumped on every change of pending events.
        fn generation(&self) -> u64;
        /// Decode progress of `seq` at `now`.
        fn decoded_tokens(&self, now: u64, seq: u64) -> Option<f64>;
        /// Sequences in the engine (running + waiting).
        fn in_flight(&self) -> u32;
        /// Sequences in the running set.
        fn running(&self) -> u32;
        /// Sequences currently decoding.
        fn decoding(&self) -> u32;
        /// Sequences waiting inside the engine.
        fn waiting(&self) -> u32;
        /// KV tokens the running set uses.
        fn kv_used_tokens(&self) -> u64;
        /// KV tokens allocated at `now`, as an engine's KV-usage metric reports them.
        fn kv_allocated_tokens(&self, now: u64) -> u64;
        /// Effective running-set limit.
        fn max_running(&self) -> u32;
        /// Effective KV capacity (tokens).
        fn kv_capacity_tokens(&self) -> u64;
        /// Sequences whose prompts `waiting_prompt_tokens` counts.
        fn queued(&self) -> u32;
        /// Prompt tokens of the waiting sequences.
        fn waiting_prompt_tokens(&self) -> u64;
        /// Output tokens per second the engine generates now.
        fn generation_tok_s(&self) -> f64;
        /// Whether the cold-start penalty is over.
        fn is_warm(&self) -> bool;
        /// Whether the engine serves at `now`.
        fn is_up(&self, now: u64) -> bool;
        /// Blocks in the prefix cache.
        fn cached_blocks(&self) -> usize;
        /// Evictable blocks in the prefix cache.
        fn evictable_blocks(&self) -> usize;
        /// Whether KV events are waiting to be drained.
        fn has_kv_events(&self) -> bool;
        /// Prompt tokens the prefix cache would serve now.
        fn peek_cached_tokens(&self, prompt_tokens: u32, prefix: &[u64]) -> u32;
        /// Nanoseconds the engine was busy.
        fn busy_ns(&self) -> u64;
        /// Sequence-nanoseconds decoding up to `now`.
        fn decoding_ns(&self, now: u64) -> u64;
        /// Current overall speed multiplier.
        fn speed_multiplier(&self) -> f64;
        /// The node's speed factor.
        fn speed_factor(&self) -> f64;
    }

    delegate_mut! {
        /// Hands a sequence to the engine at `now`.
        fn admit(&mut self, now: u64, seq: u64, prompt_tokens: u32, output_tokens: u32, prefix: &[u64]) -> AdmitInfo;
        /// Moves the engine to `now`, appending what happened.
        fn advance_to(&mut self, now: u64, out: &mut Vec<EngineOutput>) -> ();
        /// Record KV events from now on (or stop).
        fn publish_kv_events(&mut self, on: bool) -> ();
        /// Appends the KV events recorded since the last drain.
        fn drain_kv_events(&mut self, out: &mut Vec<KvEvent>) -> ();
        /// Sets the node's speed factor from `now` on.
        fn set_speed_factor(&mut self, now: u64, factor: f64) -> ();
        /// Restarts the engine; returns the failed sequences.
        fn restart(&mut self, now: u64, ready_at: u64, cold: bool) -> Vec<u64>;
        /// Crashes the engine; returns the failed sequences.
        fn crash(&mut self, now: u64) -> Vec<u64>;
        /// Aborts sequence `seq`.
        fn abort(&mut self, now: u64, seq: u64) -> bool;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_by_name_and_unknown_ones_name_the_valid_ones() {
        for name in EngineMode::NAMES {
            assert_eq!(EngineMode::parse(name).unwrap().name(), name);
        }
        assert_eq!(EngineMode::default(), EngineMode::Fluid);
        let e = EngineMode::parse("stepped").unwrap_err();
        assert!(
            e.contains("`stepped`") && e.contains("valid: fluid, step"),
            "{e}"
        );
    }

    #[test]
    fn the_enum_runs_the_chosen_mode() {
        let p = Arc::new(
            HardwareProfile::from_yaml_str(
                "name: t\ndecode: { points: [ { concurrency: 1, aggregate_tok_s: 100 } ] }\n\
                 prefill_tok_s: 1000\nkv_capacity_tokens: 100000\nmax_running: 8\n\
                 context_window: 4096\n",
                "t.yaml",
            )
            .unwrap(),
        );
        let mut outs = Vec::new();
        for mode in [EngineMode::Fluid, EngineMode::Step] {
            let mut e = Engine::new(mode, p.clone(), EngineOverrides::default(), 3);
            assert_eq!(e.mode(), mode);
            e.admit(0, 1, 100, 3, &[]);
            let mut out = Vec::new();
            while let Some(t) = e.next_event_time() {
                e.advance_to(t, &mut out);
            }
            assert_eq!(out.len(), 2, "{mode}: first token and completion");
            outs.push(out[1].at());
        }
        // alone, with nothing to overlap, both modes take 0.1 s of prefill and two 10 ms steps
        for at in outs {
            assert!((at as f64 / 1e9 - 0.12).abs() < 1e-6, "{at}");
        }
    }
}
