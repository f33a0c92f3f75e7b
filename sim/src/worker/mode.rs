//! The engine mode of a worker (`engine: fluid | step` in a scenario) and [`Engine`], the one
//! type the event loop holds: a fluid [`FluidEngine`] (the fast default) or a step-level
//! [`StepEngine`] (the reference), behind the one [`InferenceEngine`] interface.

use std::fmt;
use std::sync::Arc;

use routelab_policies::KvEvent;

use super::core::EngineCore;
use super::inference::sealed::Moves;
use super::{
    Admission, AdmitInfo, EngineOutput, EngineOverrides, FluidEngine, InferenceEngine, StepEngine,
};
use crate::hardware::HardwareProfile;

/// How a worker's engine is simulated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum EngineMode {
    /// Fluid processor sharing between events ([`FluidEngine`]): fast, the default.
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
    /// [`EngineModeError`], naming the unknown mode and the valid ones.
    pub fn parse(name: &str) -> Result<EngineMode, EngineModeError> {
        match name {
            "fluid" => Ok(EngineMode::Fluid),
            "step" => Ok(EngineMode::Step),
            other => Err(EngineModeError {
                name: other.to_owned(),
            }),
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

/// An engine mode that does not exist.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown engine mode `{name}`; valid: {valid}", valid = EngineMode::NAMES.join(", "))]
pub struct EngineModeError {
    /// The name asked for.
    pub name: String,
}

impl fmt::Display for EngineMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One simulated engine in either mode, the type the event loop holds. Its methods are
/// [`InferenceEngine`]'s: what the modes share is read from the one [`EngineCore`] each owns
/// (one match, then the field), the rest is the mode's own (one match per call, a predictable
/// branch), so a fluid run's results are the fluid engine's, byte for byte.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // one per worker, never moved in a hot loop
pub enum Engine {
    /// The fluid model.
    Fluid(FluidEngine),
    /// The step-level model.
    Step(StepEngine),
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
            EngineMode::Fluid => Engine::Fluid(FluidEngine::new(profile, overrides, seed)),
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

    /// The state both modes share.
    #[inline]
    fn core(&self) -> &EngineCore {
        match self {
            Engine::Fluid(e) => e.core(),
            Engine::Step(e) => e.core(),
        }
    }

    /// The same, to change.
    #[inline]
    fn core_mut(&mut self) -> &mut EngineCore {
        match self {
            Engine::Fluid(e) => e.core_mut(),
            Engine::Step(e) => e.core_mut(),
        }
    }
}

/// The interface, once per method: the mode's own by a match, the shared part from the core.
/// See [`InferenceEngine`] for what each does.
impl Engine {
    /// [`InferenceEngine::admit`].
    #[inline]
    pub fn admit(&mut self, now: u64, s: Admission<'_>) -> AdmitInfo {
        match self {
            Engine::Fluid(e) => e.admit(now, s),
            Engine::Step(e) => e.admit(now, s),
        }
    }

    /// [`InferenceEngine::advance_to`].
    #[inline]
    pub fn advance_to(&mut self, now: u64, out: &mut Vec<EngineOutput>) {
        match self {
            Engine::Fluid(e) => e.advance_to(now, out),
            Engine::Step(e) => e.advance_to(now, out),
        }
    }

    /// [`InferenceEngine::decoded_tokens`].
    #[inline]
    pub fn decoded_tokens(&self, now: u64, seq: u64) -> Option<f64> {
        match self {
            Engine::Fluid(e) => e.decoded_tokens(now, seq),
            Engine::Step(e) => e.decoded_tokens(now, seq),
        }
    }

    /// [`InferenceEngine::in_flight`].
    #[inline]
    pub fn in_flight(&self) -> u32 {
        match self {
            Engine::Fluid(e) => e.in_flight(),
            Engine::Step(e) => e.in_flight(),
        }
    }

    /// [`InferenceEngine::running`].
    #[inline]
    pub fn running(&self) -> u32 {
        match self {
            Engine::Fluid(e) => e.running(),
            Engine::Step(e) => e.running(),
        }
    }

    /// [`InferenceEngine::decoding`].
    #[inline]
    pub fn decoding(&self) -> u32 {
        match self {
            Engine::Fluid(e) => e.decoding(),
            Engine::Step(e) => e.decoding(),
        }
    }

    /// [`InferenceEngine::waiting`].
    #[inline]
    pub fn waiting(&self) -> u32 {
        match self {
            Engine::Fluid(e) => e.waiting(),
            Engine::Step(e) => e.waiting(),
        }
    }

    /// [`InferenceEngine::kv_used_tokens`].
    #[inline]
    pub fn kv_used_tokens(&self) -> u64 {
        match self {
            Engine::Fluid(e) => e.kv_used_tokens(),
            Engine::Step(e) => e.kv_used_tokens(),
        }
    }

    /// [`InferenceEngine::kv_allocated_tokens`].
    #[inline]
    pub fn kv_allocated_tokens(&self, now: u64) -> u64 {
        match self {
            Engine::Fluid(e) => e.kv_allocated_tokens(now),
            Engine::Step(e) => e.kv_allocated_tokens(now),
        }
    }

    /// [`InferenceEngine::queued`].
    #[inline]
    pub fn queued(&self) -> u32 {
        match self {
            Engine::Fluid(e) => e.queued(),
            Engine::Step(e) => e.queued(),
        }
    }

    /// [`InferenceEngine::waiting_prompt_tokens`].
    #[inline]
    pub fn waiting_prompt_tokens(&self) -> u64 {
        match self {
            Engine::Fluid(e) => e.waiting_prompt_tokens(),
            Engine::Step(e) => e.waiting_prompt_tokens(),
        }
    }

    /// [`InferenceEngine::generation_tok_s`].
    #[inline]
    pub fn generation_tok_s(&self) -> f64 {
        match self {
            Engine::Fluid(e) => e.generation_tok_s(),
            Engine::Step(e) => e.generation_tok_s(),
        }
    }

    /// [`InferenceEngine::decoding_ns`].
    #[inline]
    pub fn decoding_ns(&self, now: u64) -> u64 {
        match self {
            Engine::Fluid(e) => e.decoding_ns(now),
            Engine::Step(e) => e.decoding_ns(now),
        }
    }

    /// [`InferenceEngine::speed_multiplier`].
    #[inline]
    pub fn speed_multiplier(&self) -> f64 {
        match self {
            Engine::Fluid(e) => e.speed_multiplier(),
            Engine::Step(e) => e.speed_multiplier(),
        }
    }

    /// [`InferenceEngine::abort`].
    #[inline]
    pub fn abort(&mut self, now: u64, seq: u64) -> bool {
        match self {
            Engine::Fluid(e) => e.abort(now, seq),
            Engine::Step(e) => e.abort(now, seq),
        }
    }

    /// [`InferenceEngine::set_speed_factor`].
    #[inline]
    pub fn set_speed_factor(&mut self, now: u64, factor: f64) {
        match self {
            Engine::Fluid(e) => e.set_speed_factor(now, factor),
            Engine::Step(e) => e.set_speed_factor(now, factor),
        }
    }

    /// [`InferenceEngine::restart`].
    #[inline]
    pub fn restart(&mut self, now: u64, ready_at: u64, cold: bool) -> Vec<u64> {
        match self {
            Engine::Fluid(e) => e.restart(now, ready_at, cold),
            Engine::Step(e) => e.restart(now, ready_at, cold),
        }
    }

    /// [`InferenceEngine::crash`].
    #[inline]
    pub fn crash(&mut self, now: u64) -> Vec<u64> {
        match self {
            Engine::Fluid(e) => e.crash(now),
            Engine::Step(e) => e.crash(now),
        }
    }

    /// [`InferenceEngine::profile`].
    #[inline]
    pub fn profile(&self) -> &Arc<HardwareProfile> {
        &self.core().profile
    }

    /// [`InferenceEngine::next_event_time`].
    #[inline]
    pub fn next_event_time(&self) -> Option<u64> {
        self.core().next_event
    }

    /// [`InferenceEngine::generation`].
    #[inline]
    pub fn generation(&self) -> u64 {
        self.core().generation
    }

    /// [`InferenceEngine::max_running`].
    #[inline]
    pub fn max_running(&self) -> u32 {
        self.core().max_running
    }

    /// [`InferenceEngine::kv_capacity_tokens`].
    #[inline]
    pub fn kv_capacity_tokens(&self) -> u64 {
        self.core().kv_capacity
    }

    /// [`InferenceEngine::is_warm`].
    #[inline]
    pub fn is_warm(&self) -> bool {
        self.core().pace.is_warm()
    }

    /// [`InferenceEngine::is_up`].
    #[inline]
    pub fn is_up(&self, now: u64) -> bool {
        self.core().is_up(now)
    }

    /// [`InferenceEngine::cached_blocks`].
    #[inline]
    pub fn cached_blocks(&self) -> usize {
        self.core().cache.len()
    }

    /// [`InferenceEngine::evictable_blocks`].
    #[inline]
    pub fn evictable_blocks(&self) -> usize {
        self.core().cache.evictable()
    }

    /// [`InferenceEngine::has_kv_events`].
    #[inline]
    pub fn has_kv_events(&self) -> bool {
        self.core().cache.has_events()
    }

    /// [`InferenceEngine::peek_cached_tokens`].
    #[inline]
    pub fn peek_cached_tokens(&self, prompt_tokens: u32, prefix: &[u64]) -> u32 {
        self.core().cached_for(prompt_tokens, prefix)
    }

    /// [`InferenceEngine::busy_ns`].
    #[inline]
    pub fn busy_ns(&self) -> u64 {
        self.core().busy_ns
    }

    /// [`InferenceEngine::speed_factor`].
    #[inline]
    pub fn speed_factor(&self) -> f64 {
        self.core().pace.node
    }

    /// [`InferenceEngine::publish_kv_events`].
    #[inline]
    pub fn publish_kv_events(&mut self, on: bool) {
        self.core_mut().cache.set_publish(on)
    }

    /// [`InferenceEngine::drain_kv_events`].
    #[inline]
    pub fn drain_kv_events(&mut self, out: &mut Vec<KvEvent>) {
        self.core_mut().cache.drain_events(out)
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
        let e = EngineMode::parse("stepped").unwrap_err().to_string();
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
            e.admit(0, Admission::new(1, 100, 3, &[]));
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
