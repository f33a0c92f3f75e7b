//! Open-loop synthetic generators: arrivals do not depend on completions.

use rand::RngExt;
use serde::{Deserialize, Serialize};

use super::dist::{DurationDist, LengthDist, SourceRng, Until, check_rate, exp1, rng_from_seed};
use super::{Arrival, TrafficError, TrafficSource};
use routelab_policies::streams::{NANOS_PER_SEC, truncate_nanos};

/// The next arrival of a generator at `at`: prompt drawn before output (the order every
/// generator's stream depends on), tagged with the generator's running sequence number.
#[inline]
fn draw(
    at: u64,
    prompt: &LengthDist,
    output: &LengthDist,
    rng: &mut SourceRng,
    seq: &mut u64,
) -> Arrival {
    let a = Arrival::new(at, prompt.sample(rng), output.sample(rng), *seq);
    *seq += 1;
    a
}

/// A homogeneous Poisson clock: absolute time kept in f64 ns so gaps do not accumulate
/// rounding bias.
#[derive(Debug, Clone)]
pub(crate) struct PoissonClock {
    pub(crate) t_ns: f64,
    mean_gap_ns: f64,
}

impl PoissonClock {
    pub(crate) fn new(start: u64, rate_per_s: f64) -> Self {
        Self {
            t_ns: start as f64,
            mean_gap_ns: NANOS_PER_SEC / rate_per_s,
        }
    }

    #[inline]
    pub(crate) fn advance(&mut self, rng: &mut SourceRng) -> u64 {
        self.t_ns += exp1(rng) * self.mean_gap_ns;
        // Truncated, as it always was; saturates at u64::MAX, which every `Until` treats as
        // "past the end".
        truncate_nanos(self.t_ns)
    }
}

// ---------------------------------------------------------------------------------------------

/// `size` requests at the same instant `at`, repeated `repeats` times every `period` ns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BurstConfig {
    /// Time of the first burst, ns.
    #[serde(default)]
    pub at: u64,
    /// Requests per burst (≥ 1).
    pub size: u32,
    /// Number of bursts (≥ 1).
    #[serde(default = "one")]
    pub repeats: u32,
    /// Time between bursts, ns (> 0 when `repeats > 1`).
    #[serde(default)]
    pub period: u64,
    /// Prompt tokens.
    pub prompt: LengthDist,
    /// Output tokens.
    pub output: LengthDist,
}

const fn one() -> u32 {
    1
}

/// Generator for [`BurstConfig`]. Tags are the arrival's sequence number.
#[derive(Debug, Clone)]
pub struct Burst {
    cfg: BurstConfig,
    rng: SourceRng,
    burst: u32,
    in_burst: u32,
    seq: u64,
}

impl Burst {
    /// Validate `cfg` and seed the generator.
    ///
    /// # Errors
    /// [`TrafficError::InvalidConfig`] for a zero size/repeat count or a zero period with repeats.
    pub fn new(cfg: BurstConfig, seed: u64) -> Result<Self, TrafficError> {
        const G: &str = "Burst";
        if cfg.size == 0 {
            return Err(TrafficError::config(
                G,
                "size",
                "is 0; expected >= 1 requests per burst",
            ));
        }
        if cfg.repeats == 0 {
            return Err(TrafficError::config(
                G,
                "repeats",
                "is 0; expected >= 1 bursts",
            ));
        }
        if cfg.repeats > 1 && cfg.period == 0 {
            return Err(TrafficError::config(
                G,
                "period",
                "is 0 with repeats > 1; expected > 0 ns",
            ));
        }
        cfg.prompt.validate(G, "prompt")?;
        cfg.output.validate(G, "output")?;
        Ok(Self {
            cfg,
            rng: rng_from_seed(seed),
            burst: 0,
            in_burst: 0,
            seq: 0,
        })
    }
}

impl TrafficSource for Burst {
    fn next_arrival(&mut self) -> Result<Option<Arrival>, TrafficError> {
        if self.burst >= self.cfg.repeats {
            return Ok(None);
        }
        let at = self
            .cfg
            .at
            .saturating_add(u64::from(self.burst).saturating_mul(self.cfg.period));
        self.in_burst += 1;
        if self.in_burst == self.cfg.size {
            self.in_burst = 0;
            self.burst += 1;
        }
        Ok(Some(draw(
            at,
            &self.cfg.prompt,
            &self.cfg.output,
            &mut self.rng,
            &mut self.seq,
        )))
    }
}

// ---------------------------------------------------------------------------------------------

/// Poisson arrivals at `rate_per_s` from `start` until `until`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoissonConfig {
    /// Start of the process, ns (the first arrival comes one exponential gap later).
    #[serde(default)]
    pub start: u64,
    /// Mean arrival rate, requests per second (> 0).
    pub rate_per_s: f64,
    /// Stop condition.
    pub until: Until,
    /// Prompt tokens.
    pub prompt: LengthDist,
    /// Output tokens.
    pub output: LengthDist,
}

/// Generator for [`PoissonConfig`]. Tags are the arrival's sequence number.
#[derive(Debug, Clone)]
pub struct Poisson {
    cfg: PoissonConfig,
    rng: SourceRng,
    clock: PoissonClock,
    end: u64,
    seq: u64,
}

impl Poisson {
    /// Validate `cfg` and seed the generator.
    ///
    /// # Errors
    /// [`TrafficError::InvalidConfig`] for a non-positive rate, no stop condition or bad lengths.
    pub fn new(cfg: PoissonConfig, seed: u64) -> Result<Self, TrafficError> {
        const G: &str = "Poisson";
        check_rate(G, "rate_per_s", cfg.rate_per_s, false)?;
        cfg.until.validate(G)?;
        cfg.prompt.validate(G, "prompt")?;
        cfg.output.validate(G, "output")?;
        Ok(Self {
            clock: PoissonClock::new(cfg.start, cfg.rate_per_s),
            end: cfg.until.end(cfg.start),
            rng: rng_from_seed(seed),
            cfg,
            seq: 0,
        })
    }
}

impl TrafficSource for Poisson {
    #[inline]
    fn next_arrival(&mut self) -> Result<Option<Arrival>, TrafficError> {
        if self.seq >= self.cfg.until.max_count() {
            return Ok(None);
        }
        let at = self.clock.advance(&mut self.rng);
        if at >= self.end {
            self.seq = u64::MAX; // exhausted for good
            return Ok(None);
        }
        Ok(Some(draw(
            at,
            &self.cfg.prompt,
            &self.cfg.output,
            &mut self.rng,
            &mut self.seq,
        )))
    }
}

// ---------------------------------------------------------------------------------------------

/// Non-homogeneous Poisson arrivals whose rate follows a sinusoid between `min_rate_per_s`
/// (at cycle position 0) and `max_rate_per_s` (at cycle position `period / 2`):
/// `rate(t) = min + (max - min) · (1 - cos(2π (t - start + phase) / period)) / 2`.
/// Generated by thinning a Poisson process of rate `max_rate_per_s`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiurnalConfig {
    /// Start, ns.
    #[serde(default)]
    pub start: u64,
    /// Trough rate, requests per second (≥ 0).
    pub min_rate_per_s: f64,
    /// Peak rate, requests per second (> 0, ≥ min).
    pub max_rate_per_s: f64,
    /// Cycle length, ns (> 0), e.g. 86 400 s for a day.
    pub period: u64,
    /// Position within the cycle at `start`, ns.
    #[serde(default)]
    pub phase: u64,
    /// Stop condition.
    pub until: Until,
    /// Prompt tokens.
    pub prompt: LengthDist,
    /// Output tokens.
    pub output: LengthDist,
}

/// Generator for [`DiurnalConfig`]. Tags are the arrival's sequence number.
#[derive(Debug, Clone)]
pub struct Diurnal {
    cfg: DiurnalConfig,
    rng: SourceRng,
    clock: PoissonClock,
    end: u64,
    seq: u64,
    omega: f64,
    /// `(cos, sin)` of the cycle angle at clock time `phase_t`, advanced by small-angle
    /// rotations between exact recomputations (cheaper than `cos` per thinning candidate).
    phase_t: f64,
    cos_sin: (f64, f64),
    rotations: u32,
}

impl Diurnal {
    /// Validate `cfg` and seed the generator.
    ///
    /// # Errors
    /// [`TrafficError::InvalidConfig`] for bad rates, a zero period, no stop condition or bad lengths.
    pub fn new(cfg: DiurnalConfig, seed: u64) -> Result<Self, TrafficError> {
        const G: &str = "Diurnal";
        check_rate(G, "min_rate_per_s", cfg.min_rate_per_s, true)?;
        check_rate(G, "max_rate_per_s", cfg.max_rate_per_s, false)?;
        if cfg.min_rate_per_s > cfg.max_rate_per_s {
            return Err(TrafficError::config(
                G,
                "min_rate_per_s",
                format!(
                    "is {} > max_rate_per_s {}; expected min <= max",
                    cfg.min_rate_per_s, cfg.max_rate_per_s
                ),
            ));
        }
        if cfg.period == 0 {
            return Err(TrafficError::config(
                G,
                "period",
                "is 0; expected a cycle length > 0 ns",
            ));
        }
        cfg.until.validate(G)?;
        cfg.prompt.validate(G, "prompt")?;
        cfg.output.validate(G, "output")?;
        Ok(Self {
            clock: PoissonClock::new(cfg.start, cfg.max_rate_per_s),
            end: cfg.until.end(cfg.start),
            omega: std::f64::consts::TAU / cfg.period as f64,
            phase_t: f64::NEG_INFINITY,
            cos_sin: (1.0, 0.0),
            rotations: 0,
            rng: rng_from_seed(seed),
            cfg,
            seq: 0,
        })
    }

    /// The instantaneous rate at absolute time `t` (ns), requests per second.
    #[must_use]
    pub fn rate_at(&self, t: u64) -> f64 {
        let x = (t.saturating_sub(self.cfg.start) as f64 + self.cfg.phase as f64) * self.omega;
        let (lo, hi) = (self.cfg.min_rate_per_s, self.cfg.max_rate_per_s);
        lo + (hi - lo) * 0.5 * (1.0 - x.cos())
    }
}

impl Diurnal {
    /// `cos` of the cycle angle at clock time `t_ns` (non-decreasing between calls).
    #[inline]
    fn cos_at(&mut self, t_ns: f64) -> f64 {
        const SMALL: f64 = 1e-3;
        let d = (t_ns - self.phase_t) * self.omega;
        if d < SMALL && self.rotations < 256 {
            // Rotate by d: Taylor terms up to d^5, error < d^6/720 < 2e-21.
            let d2 = d * d;
            let cd = 1.0 - d2 * (0.5 - d2 / 24.0);
            let sd = d * (1.0 - d2 / 6.0 * (1.0 - d2 / 20.0));
            let (c, s) = self.cos_sin;
            self.cos_sin = (c * cd - s * sd, s * cd + c * sd);
            self.rotations += 1;
        } else {
            let x = (t_ns - self.cfg.start as f64 + self.cfg.phase as f64) * self.omega;
            let (s, c) = x.sin_cos();
            self.cos_sin = (c, s);
            self.rotations = 0;
        }
        self.phase_t = t_ns;
        self.cos_sin.0
    }
}

impl TrafficSource for Diurnal {
    fn next_arrival(&mut self) -> Result<Option<Arrival>, TrafficError> {
        if self.seq >= self.cfg.until.max_count() {
            return Ok(None);
        }
        let (lo, hi) = (self.cfg.min_rate_per_s, self.cfg.max_rate_per_s);
        let at = loop {
            let t = self.clock.advance(&mut self.rng);
            if t >= self.end {
                self.seq = u64::MAX;
                return Ok(None);
            }
            let u = self.rng.random::<f64>() * hi;
            if u < lo || u < lo + (hi - lo) * 0.5 * (1.0 - self.cos_at(self.clock.t_ns)) {
                break t;
            }
        };
        Ok(Some(draw(
            at,
            &self.cfg.prompt,
            &self.cfg.output,
            &mut self.rng,
            &mut self.seq,
        )))
    }
}

// ---------------------------------------------------------------------------------------------

/// Sparse bursts: each burst has `burst_size` requests spread uniformly at random over
/// `window` ns; the next burst starts `gap` ns after the previous window ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnOffConfig {
    /// Start of the first burst, ns.
    #[serde(default)]
    pub start: u64,
    /// Requests per burst.
    pub burst_size: LengthDist,
    /// Length of a burst window, ns (0 = all requests of a burst at one instant).
    pub window: u64,
    /// Idle time between the end of one window and the start of the next, ns.
    pub gap: DurationDist,
    /// Stop condition (counts requests, not bursts).
    pub until: Until,
    /// Prompt tokens.
    pub prompt: LengthDist,
    /// Output tokens.
    pub output: LengthDist,
}

/// Generator for [`OnOffConfig`]. Tags are the arrival's sequence number.
#[derive(Debug, Clone)]
pub struct OnOff {
    cfg: OnOffConfig,
    rng: SourceRng,
    end: u64,
    seq: u64,
    burst_start: u64,
    /// Offset within the current window of the last emitted request, ns.
    pos: f64,
    remaining: u32,
    started: bool,
}

impl OnOff {
    /// Validate `cfg` and seed the generator.
    ///
    /// # Errors
    /// [`TrafficError::InvalidConfig`] for bad distributions or no stop condition.
    pub fn new(cfg: OnOffConfig, seed: u64) -> Result<Self, TrafficError> {
        const G: &str = "OnOff";
        cfg.burst_size.validate(G, "burst_size")?;
        cfg.gap.validate(G, "gap")?;
        cfg.until.validate(G)?;
        cfg.prompt.validate(G, "prompt")?;
        cfg.output.validate(G, "output")?;
        Ok(Self {
            end: cfg.until.end(cfg.start),
            burst_start: cfg.start,
            rng: rng_from_seed(seed),
            cfg,
            seq: 0,
            pos: 0.0,
            remaining: 0,
            started: false,
        })
    }
}

impl TrafficSource for OnOff {
    fn next_arrival(&mut self) -> Result<Option<Arrival>, TrafficError> {
        if self.seq >= self.cfg.until.max_count() {
            return Ok(None);
        }
        if self.remaining == 0 {
            if self.started {
                let gap = self.cfg.gap.sample(&mut self.rng);
                self.burst_start = self
                    .burst_start
                    .saturating_add(self.cfg.window)
                    .saturating_add(gap);
            }
            self.started = true;
            self.remaining = self.cfg.burst_size.sample(&mut self.rng);
            self.pos = 0.0;
        }
        // Next order statistic of `remaining` uniforms on [pos, window): no buffering needed.
        let u = 1.0 - self.rng.random::<f64>(); // (0, 1]
        let window = self.cfg.window as f64;
        self.pos += (window - self.pos) * (1.0 - u.powf(1.0 / f64::from(self.remaining)));
        self.remaining -= 1;
        let at = self.burst_start.saturating_add(truncate_nanos(self.pos));
        if at >= self.end {
            self.seq = u64::MAX;
            return Ok(None);
        }
        Ok(Some(draw(
            at,
            &self.cfg.prompt,
            &self.cfg.output,
            &mut self.rng,
            &mut self.seq,
        )))
    }
}

// ---------------------------------------------------------------------------------------------

/// Poisson arrivals where a fraction `long_fraction` of requests has a `long_prompt` and the
/// rest a `short_prompt`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LongPromptMixConfig {
    /// Start, ns.
    #[serde(default)]
    pub start: u64,
    /// Mean arrival rate, requests per second (> 0).
    pub rate_per_s: f64,
    /// Stop condition.
    pub until: Until,
    /// Probability that a request is long, in [0, 1].
    pub long_fraction: f64,
    /// Prompt tokens of long requests.
    pub long_prompt: LengthDist,
    /// Prompt tokens of the other requests.
    pub short_prompt: LengthDist,
    /// Output tokens (all requests).
    pub output: LengthDist,
}

/// Generator for [`LongPromptMixConfig`]. Tags are the arrival's sequence number.
#[derive(Debug, Clone)]
pub struct LongPromptMix {
    cfg: LongPromptMixConfig,
    rng: SourceRng,
    clock: PoissonClock,
    end: u64,
    seq: u64,
}

impl LongPromptMix {
    /// Validate `cfg` and seed the generator.
    ///
    /// # Errors
    /// [`TrafficError::InvalidConfig`] for a bad rate, fraction, stop condition or lengths.
    pub fn new(cfg: LongPromptMixConfig, seed: u64) -> Result<Self, TrafficError> {
        const G: &str = "LongPromptMix";
        check_rate(G, "rate_per_s", cfg.rate_per_s, false)?;
        if !(0.0..=1.0).contains(&cfg.long_fraction) {
            return Err(TrafficError::config(
                G,
                "long_fraction",
                format!("is {}; expected a probability in [0, 1]", cfg.long_fraction),
            ));
        }
        cfg.until.validate(G)?;
        cfg.long_prompt.validate(G, "long_prompt")?;
        cfg.short_prompt.validate(G, "short_prompt")?;
        cfg.output.validate(G, "output")?;
        Ok(Self {
            clock: PoissonClock::new(cfg.start, cfg.rate_per_s),
            end: cfg.until.end(cfg.start),
            rng: rng_from_seed(seed),
            cfg,
            seq: 0,
        })
    }
}

impl TrafficSource for LongPromptMix {
    fn next_arrival(&mut self) -> Result<Option<Arrival>, TrafficError> {
        if self.seq >= self.cfg.until.max_count() {
            return Ok(None);
        }
        let at = self.clock.advance(&mut self.rng);
        if at >= self.end {
            self.seq = u64::MAX;
            return Ok(None);
        }
        let long = self.rng.random::<f64>() < self.cfg.long_fraction;
        let prompt = if long {
            &self.cfg.long_prompt
        } else {
            &self.cfg.short_prompt
        };
        let prompt = prompt.sample(&mut self.rng);
        let a = Arrival::new(at, prompt, self.cfg.output.sample(&mut self.rng), self.seq);
        self.seq += 1;
        Ok(Some(a))
    }
}

// ----- load scale -----------------------------------------------------------------------------
//
// `routelab capacity` multiplies every source's arrival rate by one factor (the load scale).
// Each configuration says here what that means for it; lengths and burst sizes never change.
// A factor of 1 returns an equal configuration (rates × 1.0 and durations ÷ 1 are exact).

impl BurstConfig {
    /// Bursts come `factor` times as often (the period is divided by it); each burst keeps its
    /// size. A single burst (`repeats: 1`) is an event, not a rate, and is unchanged.
    #[must_use]
    pub fn with_load_scale(&self, factor: f64) -> Self {
        Self {
            period: super::dist::divide_ns(self.period, factor),
            ..self.clone()
        }
    }

    /// Whether the load scale changes this source (it repeats).
    pub const fn has_rate(&self) -> bool {
        self.repeats > 1
    }
}

impl PoissonConfig {
    /// The rate times `factor`; the start and stop condition are unchanged.
    #[must_use]
    pub fn with_load_scale(&self, factor: f64) -> Self {
        Self {
            rate_per_s: self.rate_per_s * factor,
            ..self.clone()
        }
    }
}

impl DiurnalConfig {
    /// Both the trough and the peak rate times `factor`; the period and phase (the shape of the
    /// day) are unchanged.
    #[must_use]
    pub fn with_load_scale(&self, factor: f64) -> Self {
        Self {
            min_rate_per_s: self.min_rate_per_s * factor,
            max_rate_per_s: self.max_rate_per_s * factor,
            ..self.clone()
        }
    }
}

impl OnOffConfig {
    /// The burst window and the idle gaps divided by `factor`, so bursts (of unchanged size)
    /// come `factor` times as often and the mean rate is `factor` times higher.
    #[must_use]
    pub fn with_load_scale(&self, factor: f64) -> Self {
        Self {
            window: super::dist::divide_ns(self.window, factor),
            gap: self.gap.divided_by(factor),
            ..self.clone()
        }
    }
}

impl LongPromptMixConfig {
    /// The rate times `factor`; the mix is unchanged.
    #[must_use]
    pub fn with_load_scale(&self, factor: f64) -> Self {
        Self {
            rate_per_s: self.rate_per_s * factor,
            ..self.clone()
        }
    }
}
