//! Traffic families: five kinds of realistic traffic a router was not tuned on (issue 38), each
//! with documented, seeded parameters, so that a policy can be chosen on some families and
//! reported on the others.
//!
//! | family | starts | a request is | shared prefixes |
//! |---|---|---|---|
//! | `chat` | sessions, Poisson | a turn of a multi-turn chat | a few system prompts |
//! | `code` | requests, Gamma renewal (CV > 1: bursty) | a code completion | none |
//! | `rag` | requests, Poisson | a question over one long document | documents, Zipf popularity |
//! | `agentic` | sessions, in bursts | a step of an agent whose context grows by tool output | app prompts |
//! | `batch-day` | online requests on a daily curve + batch jobs | a chat request, or one of a job's many | a job's instructions |
//!
//! The figures behind each family's defaults and where they come from are in
//! `docs/scenarios.md` (Traffic families); [`FamilyKind::defaults`] holds them.
//!
//! Sessions and shared prefixes are carried as the simulator carries a conversation's: a
//! session's requests have the session's tag (so `hash-by-session` and the router's session
//! affinity see one session), and prefix blocks follow [`grow_prefix_blocks`]: a block lying
//! wholly inside a shared prefix (a system prompt, an app prompt, a document, a job's
//! instructions) is the same block for every request that shares it, every other block belongs
//! to its session or request alone.
//!
//! **Randomness.** The source draws from its own traffic stream only (the seed it is built
//! with), split into sub-streams so that what a request *is* does not depend on *when* it comes:
//! the arrival clocks draw from one sub-stream per producer, the shared prefixes from another,
//! and the k-th session or request of a producer from its own (`derive_seed` of the producer's
//! item stream and k). So the same seed gives the same requests whatever the routing policy (a
//! session's later turns do not depend on the order completions come back) and whatever the
//! load scale (`capacity` sees the same sessions, sooner).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use rand::RngExt;
use rand_distr::{Distribution, Gamma};
use serde::{Deserialize, Serialize};

use super::dist::{DurationDist, LengthDist, SourceRng, exp1, rng_from_seed};
use super::hash::{BLOCK_TOKENS, block_content_key, grow_prefix_blocks};
use super::{Arrival, TrafficError, TrafficSource};
use routelab_policies::streams::{
    CONVERSATION_SALT, NANOS_PER_SEC, derive_seed, splitmix64, truncate_nanos,
};

/// A family of traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FamilyKind {
    /// Multi-turn chat.
    Chat,
    /// Code completion.
    Code,
    /// Long-context retrieval-augmented generation.
    Rag,
    /// Tool-using agents.
    Agentic,
    /// A day of online traffic with batch jobs.
    BatchDay,
}

impl FamilyKind {
    /// Every family, in the order errors list them.
    pub const ALL: [FamilyKind; 5] = [
        FamilyKind::Chat,
        FamilyKind::Code,
        FamilyKind::Rag,
        FamilyKind::Agentic,
        FamilyKind::BatchDay,
    ];

    /// Its name in a scenario (`kind: batch-day`).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            FamilyKind::Chat => "chat",
            FamilyKind::Code => "code",
            FamilyKind::Rag => "rag",
            FamilyKind::Agentic => "agentic",
            FamilyKind::BatchDay => "batch-day",
        }
    }

    /// The family called `name`.
    #[must_use]
    pub fn from_name(name: &str) -> Option<FamilyKind> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }

    /// Every family's name, comma-separated.
    #[must_use]
    pub fn names() -> String {
        Self::ALL.map(FamilyKind::name).join(", ")
    }

    /// Whether its requests come in sessions whose prompts grow turn by turn.
    #[must_use]
    pub const fn has_sessions(self) -> bool {
        matches!(self, FamilyKind::Chat | FamilyKind::Agentic)
    }

    /// Whether its requests share prefixes drawn from a set by popularity (system prompts, app
    /// prompts, documents).
    #[must_use]
    pub const fn has_shared_set(self) -> bool {
        matches!(
            self,
            FamilyKind::Chat | FamilyKind::Rag | FamilyKind::Agentic
        )
    }

    /// This family's parameters at `rate_per_s` from `start` for `duration` ns: the family's
    /// figures (`docs/scenarios.md`, Traffic families, says where each comes from).
    ///
    /// Parameters a family does not use keep neutral values it never reads; the scenario
    /// reader refuses them when written ([`FamilyParam::applies_to`]).
    #[must_use]
    pub fn defaults(self, start: u64, rate_per_s: f64, duration: u64) -> FamilyConfig {
        let log_normal =
            |median: f64, sigma: f64, max: u32| LengthDist::LogNormal { median, sigma, max };
        let secs = routelab_policies::streams::secs_to_nanos;
        let neutral = FamilyConfig {
            family: self,
            start,
            rate_per_s,
            duration,
            turns: LengthDist::Fixed(1),
            prompt: LengthDist::Fixed(1),
            output: LengthDist::Fixed(1),
            think: DurationDist::Fixed(0),
            shared_prompts: 1,
            shared_prompt_tokens: LengthDist::Fixed(1),
            zipf_s: 0.0,
            cv: 1.0,
            burst_size: LengthDist::Fixed(1),
            batch_fraction: 0.0,
            batch_size: LengthDist::Fixed(1),
            max_prompt_tokens: None,
        };
        match self {
            FamilyKind::Chat => FamilyConfig {
                turns: log_normal(2.0, 0.9, 40),
                prompt: log_normal(70.0, 1.0, 4096),
                output: log_normal(160.0, 0.8, 2048),
                think: DurationDist::Exponential { mean: secs(20.0) },
                shared_prompts: 4,
                shared_prompt_tokens: LengthDist::Uniform {
                    min: 500,
                    max: 2000,
                },
                zipf_s: 1.0,
                ..neutral
            },
            FamilyKind::Code => FamilyConfig {
                prompt: log_normal(1500.0, 0.7, 8192),
                output: log_normal(13.0, 1.2, 512),
                cv: 2.0,
                ..neutral
            },
            FamilyKind::Rag => FamilyConfig {
                prompt: log_normal(300.0, 0.7, 4096),
                output: log_normal(150.0, 0.7, 1024),
                shared_prompts: 200,
                shared_prompt_tokens: LengthDist::Uniform {
                    min: 16_384,
                    max: 122_880,
                },
                zipf_s: 1.0,
                ..neutral
            },
            FamilyKind::Agentic => FamilyConfig {
                turns: log_normal(12.0, 0.7, 40),
                prompt: log_normal(600.0, 1.0, 16_384),
                output: log_normal(100.0, 0.8, 2048),
                think: DurationDist::Exponential { mean: secs(2.0) },
                shared_prompts: 8,
                shared_prompt_tokens: LengthDist::Uniform {
                    min: 2000,
                    max: 12_000,
                },
                zipf_s: 1.0,
                burst_size: LengthDist::Uniform { min: 1, max: 8 },
                ..neutral
            },
            FamilyKind::BatchDay => FamilyConfig {
                prompt: log_normal(1020.0, 0.8, 16_384),
                output: log_normal(129.0, 0.9, 2048),
                shared_prompt_tokens: LengthDist::Uniform {
                    min: 500,
                    max: 3000,
                },
                batch_fraction: 0.3,
                batch_size: LengthDist::Uniform { min: 100, max: 400 },
                ..neutral
            },
        }
    }
}

/// An optional parameter of a family source, and the families it applies to (a scenario that
/// writes it for another family is refused, naming them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FamilyParam {
    /// The YAML field.
    pub name: &'static str,
    /// The families it applies to.
    pub applies_to: &'static [FamilyKind],
}

const SESSIONS: &[FamilyKind] = &[FamilyKind::Chat, FamilyKind::Agentic];
const SHARED_SET: &[FamilyKind] = &[FamilyKind::Chat, FamilyKind::Rag, FamilyKind::Agentic];

/// The per-family parameters, with the families each applies to (`prompt` and `output` apply
/// to all and are not listed).
pub const FAMILY_PARAMS: [FamilyParam; 10] = [
    FamilyParam {
        name: "turns",
        applies_to: SESSIONS,
    },
    FamilyParam {
        name: "think_s",
        applies_to: SESSIONS,
    },
    FamilyParam {
        name: "max_prompt_tokens",
        applies_to: SESSIONS,
    },
    FamilyParam {
        name: "shared_prompts",
        applies_to: SHARED_SET,
    },
    FamilyParam {
        name: "shared_prompt_tokens",
        applies_to: &[
            FamilyKind::Chat,
            FamilyKind::Rag,
            FamilyKind::Agentic,
            FamilyKind::BatchDay,
        ],
    },
    FamilyParam {
        name: "zipf_s",
        applies_to: SHARED_SET,
    },
    FamilyParam {
        name: "cv",
        applies_to: &[FamilyKind::Code],
    },
    FamilyParam {
        name: "burst_size",
        applies_to: &[FamilyKind::Agentic],
    },
    FamilyParam {
        name: "batch_fraction",
        applies_to: &[FamilyKind::BatchDay],
    },
    FamilyParam {
        name: "batch_size",
        applies_to: &[FamilyKind::BatchDay],
    },
];

/// The per-family parameter called `name`.
#[must_use]
pub fn family_param(name: &str) -> Option<&'static FamilyParam> {
    FAMILY_PARAMS.iter().find(|p| p.name == name)
}

impl FamilyParam {
    /// Whether it applies to `family`.
    #[must_use]
    pub fn applies(&self, family: FamilyKind) -> bool {
        self.applies_to.contains(&family)
    }

    /// The names of the families it applies to, comma-separated.
    #[must_use]
    pub fn families(&self) -> String {
        self.applies_to
            .iter()
            .map(|f| f.name())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Agent sessions of one burst start spread over this window (a batch of agents launched
/// together, e.g. by one CI run), ns.
pub const AGENT_BURST_WINDOW_NS: u64 = 2_000_000_000;

/// A batch job's requests are released over this window, ns: a job submits its requests at
/// once, up to its client's pacing.
pub const BATCH_RELEASE_NS: u64 = 10_000_000_000;

/// The online part of `batch-day` swings between `1 - DAY_SWING` and `1 + DAY_SWING` times its
/// mean (a peak three times the trough), trough at the start, peak half a day later.
pub const DAY_SWING: f64 = 0.5;

/// The most shared prefixes a source may draw from (its popularity table is held in memory).
pub const MAX_SHARED_PROMPTS: u32 = 1_000_000;

/// A family source: the family and every parameter, defaults resolved
/// ([`FamilyKind::defaults`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FamilyConfig {
    /// The family.
    pub family: FamilyKind,
    /// When the first session or request may start, ns.
    pub start: u64,
    /// New sessions (chat, agentic) or requests (code, rag; batch-day: online and batch
    /// together, averaged over the day) per second (> 0).
    pub rate_per_s: f64,
    /// How long new sessions and requests start, ns (> 0); started sessions run to their end.
    pub duration: u64,
    /// Turns per session (chat, agentic).
    pub turns: LengthDist,
    /// New tokens of each request: a chat turn's user message, a completion's prompt, a RAG
    /// question, an agent's task and then each tool output, a batch-day request's own text.
    pub prompt: LengthDist,
    /// Output tokens of each request.
    pub output: LengthDist,
    /// Between a turn's completion and the session's next turn (chat: the user reads and
    /// types; agentic: the tool runs), ns.
    pub think: DurationDist,
    /// How many shared prefixes requests draw from (chat: system prompts; rag: documents;
    /// agentic: apps).
    pub shared_prompts: u32,
    /// A shared prefix's length (batch-day: each job's instructions).
    pub shared_prompt_tokens: LengthDist,
    /// Zipf exponent of the shared prefixes' popularity (0: all equally popular).
    pub zipf_s: f64,
    /// Coefficient of variation of the gaps between requests (code; Gamma renewal, 1 is
    /// Poisson, above 1 bursty).
    pub cv: f64,
    /// Agent sessions launched together (agentic).
    pub burst_size: LengthDist,
    /// The share of requests that come from batch jobs (batch-day).
    pub batch_fraction: f64,
    /// Requests per batch job (batch-day).
    pub batch_size: LengthDist,
    /// A session ends before a turn whose prompt would exceed this (chat, agentic; none: no
    /// limit).
    pub max_prompt_tokens: Option<u32>,
}

const G: &str = "family";

/// `dist` counts whole things (`what`) and must draw at least 1.
fn check_count(dist: &LengthDist, field: &'static str, what: &str) -> Result<(), TrafficError> {
    match *dist {
        LengthDist::Fixed(0) => Err(TrafficError::config(
            G,
            field,
            format!("is fixed(0); expected at least 1 {what}"),
        )),
        LengthDist::Uniform { min: 0, max } => Err(TrafficError::config(
            G,
            field,
            format!(
                "is uniform{{min: 0, max: {max}}}; expected at least 1 {what} (1 <= min <= max)"
            ),
        )),
        _ => dist.validate(G, field),
    }
}

impl FamilyConfig {
    /// Check every parameter (the scenario reader names the field; a program building a
    /// config gets the same refusals from [`Family::new`]).
    ///
    /// # Errors
    /// [`TrafficError::InvalidConfig`] naming the field (as a scenario writes it) and what
    /// would be valid.
    pub fn validate(&self) -> Result<(), TrafficError> {
        if !(self.rate_per_s.is_finite() && self.rate_per_s > 0.0) {
            return Err(TrafficError::config(
                G,
                "rate_per_s",
                format!("is {}; expected a finite rate > 0", self.rate_per_s),
            ));
        }
        if self.duration == 0 {
            return Err(TrafficError::config(
                G,
                "duration_s",
                "is 0; expected a duration > 0",
            ));
        }
        check_count(&self.turns, "turns", "turn")?;
        self.prompt.validate(G, "prompt")?;
        self.output.validate(G, "output")?;
        self.think.validate(G, "think_s")?;
        if !(1..=MAX_SHARED_PROMPTS).contains(&self.shared_prompts) {
            return Err(TrafficError::config(
                G,
                "shared_prompts",
                format!(
                    "is {}; expected 1 to {MAX_SHARED_PROMPTS} shared prefixes",
                    self.shared_prompts
                ),
            ));
        }
        self.shared_prompt_tokens
            .validate(G, "shared_prompt_tokens")?;
        if !(self.zipf_s.is_finite() && self.zipf_s >= 0.0) {
            return Err(TrafficError::config(
                G,
                "zipf_s",
                format!(
                    "is {}; expected a finite exponent >= 0 (0: equally popular)",
                    self.zipf_s
                ),
            ));
        }
        if !(self.cv.is_finite() && self.cv > 0.0 && self.cv <= 100.0) {
            return Err(TrafficError::config(
                G,
                "cv",
                format!(
                    "is {}; expected a coefficient of variation > 0 and <= 100 (1: Poisson)",
                    self.cv
                ),
            ));
        }
        check_count(&self.burst_size, "burst_size", "session")?;
        if !(self.batch_fraction.is_finite() && (0.0..=1.0).contains(&self.batch_fraction)) {
            return Err(TrafficError::config(
                G,
                "batch_fraction",
                format!("is {}; expected a number from 0 to 1", self.batch_fraction),
            ));
        }
        check_count(&self.batch_size, "batch_size", "request")?;
        if self.max_prompt_tokens == Some(0) {
            return Err(TrafficError::config(
                G,
                "max_prompt_tokens",
                "is 0; expected a token count >= 1",
            ));
        }
        Ok(())
    }

    /// The same traffic `factor` times as fast: new sessions and requests (online and batch
    /// jobs alike) start `factor` times as often; what each session and request is stays the
    /// same (turns, lengths, think times, burst and job sizes, the day's length).
    #[must_use]
    pub fn with_load_scale(&self, factor: f64) -> Self {
        Self {
            rate_per_s: self.rate_per_s * factor,
            ..self.clone()
        }
    }

    /// The mean number of requests each start brings: a session's turns (before
    /// `max_prompt_tokens` ends any early), else 1.
    #[must_use]
    pub fn requests_per_start(&self) -> f64 {
        if self.family.has_sessions() {
            self.turns.mean()
        } else {
            1.0
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Sub-streams of one family source, under the seed it is built with (its traffic stream).

/// The shared prefixes' lengths.
const SHARED_SUBSTREAM: u64 = 1;
/// Producer p's clock (arrival times, burst and job sizes): `CLOCK_SUBSTREAM + p`.
const CLOCK_SUBSTREAM: u64 = 2;
/// Producer p's items: item k draws from `derive_seed(derive_seed(seed, ITEM_SUBSTREAM + p), k)`.
const ITEM_SUBSTREAM: u64 = 16;
/// Batch job j's instructions: `derive_seed(derive_seed(seed, JOB_SUBSTREAM), j)`.
const JOB_SUBSTREAM: u64 = 32;

/// Content-key domains, so a shared prefix, a job's instructions and a request's own tokens
/// never share a key.
const SHARED_DOMAIN: u64 = 1;
const JOB_DOMAIN: u64 = 2;
const OWN_DOMAIN: u64 = 3;

/// Producers per source (`batch-day` has two: the online day and the batch jobs); a request's
/// tag is `k · PRODUCERS + p` for item k of producer p.
const PRODUCERS: u64 = 2;

/// When a producer's next event comes.
#[derive(Debug, Clone)]
enum Clock {
    /// Exponential gaps (absolute time kept in f64 ns so that gaps do not accumulate
    /// rounding).
    Poisson { t_ns: f64, mean_gap_ns: f64 },
    /// Gamma gaps with the given mean and CV (a renewal process; BurstGPT models LLM
    /// services' arrivals this way).
    Gamma { t_ns: f64, gap: Gamma<f64> },
    /// A non-homogeneous Poisson process over one compressed day, by thinning candidates at
    /// the peak rate.
    Day {
        t_ns: f64,
        mean_gap_at_peak_ns: f64,
        start_ns: f64,
        period_ns: f64,
    },
}

impl Clock {
    fn advance(&mut self, rng: &mut SourceRng) -> u64 {
        match self {
            Clock::Poisson { t_ns, mean_gap_ns } => {
                *t_ns += exp1(rng) * *mean_gap_ns;
                truncate_nanos(*t_ns)
            }
            Clock::Gamma { t_ns, gap } => {
                *t_ns += gap.sample(rng);
                truncate_nanos(*t_ns)
            }
            Clock::Day {
                t_ns,
                mean_gap_at_peak_ns,
                start_ns,
                period_ns,
            } => loop {
                *t_ns += exp1(rng) * *mean_gap_at_peak_ns;
                let phase = std::f64::consts::TAU * (*t_ns - *start_ns) / *period_ns;
                let relative = (1.0 - DAY_SWING * phase.cos()) / (1.0 + DAY_SWING);
                if rng.random::<f64>() < relative || !t_ns.is_finite() {
                    break truncate_nanos(*t_ns);
                }
            },
        }
    }
}

/// What a producer's event starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Starts {
    /// One session (chat) or request (code, rag, the online day).
    One,
    /// A burst of agent sessions.
    AgentBurst,
    /// A batch job.
    BatchJob,
}

#[derive(Debug, Clone)]
struct Producer {
    clock: Clock,
    rng: SourceRng,
    starts: Starts,
    /// The next event's time; `None` once past the end.
    next: Option<u64>,
    /// Items issued so far.
    items: u64,
    /// Jobs issued so far (batch jobs).
    jobs: u64,
}

/// A started session or request waiting for its time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Pending {
    at: u64,
    /// Ties in time go in the order items were issued.
    order: u64,
    producer: u64,
    item: u64,
    /// A batch job's instructions: their length and key (0 tokens: none).
    shared_tokens: u32,
    shared_key: u64,
}

#[derive(Debug, Clone)]
struct Session {
    rng: SourceRng,
    turns_left: u32,
    prompt: u32,
    output: u32,
    shared_tokens: u32,
    shared_key: u64,
    own_key: u64,
    /// Hashes of the blocks that were full in the last prompt.
    full: Vec<u64>,
}

/// One shared prefix: its length and content key.
#[derive(Debug, Clone, Copy)]
struct Shared {
    tokens: u32,
    key: u64,
}

/// The generator of a [`FamilyConfig`] (see the module's doc). Tags: item k of producer p is
/// `k · 2 + p`; a session's turns all carry its first turn's tag.
#[derive(Debug, Clone)]
pub struct Family {
    cfg: FamilyConfig,
    seed: u64,
    salt: u64,
    end: u64,
    producers: Vec<Producer>,
    pending: BinaryHeap<Reverse<Pending>>,
    issued: u64,
    sessions: HashMap<u64, Session>,
    shared: Vec<Shared>,
    /// Cumulative Zipf weights of `shared` (the last is the total).
    popularity: Vec<f64>,
}

impl Family {
    /// Validate `cfg` and seed the generator with its traffic stream's `seed`.
    ///
    /// # Errors
    /// [`TrafficError::InvalidConfig`] naming the parameter out of range.
    pub fn new(cfg: FamilyConfig, seed: u64) -> Result<Self, TrafficError> {
        cfg.validate()?;
        let salt = splitmix64(seed ^ CONVERSATION_SALT);
        let mut shared = Vec::new();
        let mut popularity = Vec::new();
        if cfg.family.has_shared_set() {
            let mut rng = rng_from_seed(derive_seed(seed, SHARED_SUBSTREAM));
            let mut total = 0.0;
            for i in 0..cfg.shared_prompts {
                shared.push(Shared {
                    tokens: cfg.shared_prompt_tokens.sample(&mut rng),
                    key: content_key(salt, SHARED_DOMAIN, u64::from(i)),
                });
                total += (f64::from(i) + 1.0).powf(-cfg.zipf_s);
                popularity.push(total);
            }
        }
        let start = cfg.start as f64;
        let rate = cfg.rate_per_s;
        let poisson = |rate: f64| Clock::Poisson {
            t_ns: start,
            mean_gap_ns: NANOS_PER_SEC / rate,
        };
        let mut clocks: Vec<(Clock, Starts)> = Vec::new();
        match cfg.family {
            FamilyKind::Chat | FamilyKind::Rag => clocks.push((poisson(rate), Starts::One)),
            FamilyKind::Code => {
                // shape k = 1/cv², scale = mean gap · cv²: mean gap 1/rate, CV as given.
                let cv2 = cfg.cv * cfg.cv;
                let gap = Gamma::new(1.0 / cv2, NANOS_PER_SEC / rate * cv2).map_err(|e| {
                    TrafficError::config(G, "cv", format!("gives no Gamma distribution: {e}"))
                })?;
                clocks.push((Clock::Gamma { t_ns: start, gap }, Starts::One));
            }
            FamilyKind::Agentic => clocks.push((
                poisson(rate / cfg.burst_size.mean().max(1.0)),
                Starts::AgentBurst,
            )),
            FamilyKind::BatchDay => {
                let online = rate * (1.0 - cfg.batch_fraction);
                if online > 0.0 {
                    clocks.push((
                        Clock::Day {
                            t_ns: start,
                            mean_gap_at_peak_ns: NANOS_PER_SEC / (online * (1.0 + DAY_SWING)),
                            start_ns: start,
                            period_ns: cfg.duration as f64,
                        },
                        Starts::One,
                    ));
                }
                let jobs = rate * cfg.batch_fraction / cfg.batch_size.mean().max(1.0);
                if jobs > 0.0 {
                    clocks.push((poisson(jobs), Starts::BatchJob));
                }
            }
        }
        let end = cfg.start.saturating_add(cfg.duration);
        let producers = clocks
            .into_iter()
            .enumerate()
            .map(|(p, (mut clock, starts))| {
                let mut rng = rng_from_seed(derive_seed(seed, CLOCK_SUBSTREAM + p as u64));
                let t = clock.advance(&mut rng);
                Producer {
                    clock,
                    rng,
                    starts,
                    next: (t <= end).then_some(t),
                    items: 0,
                    jobs: 0,
                }
            })
            .collect();
        Ok(Self {
            cfg,
            seed,
            salt,
            end,
            producers,
            pending: BinaryHeap::new(),
            issued: 0,
            sessions: HashMap::new(),
            shared,
            popularity,
        })
    }

    /// Sessions waiting for a completion or their next turn.
    #[must_use]
    pub fn active_sessions(&self) -> usize {
        self.sessions.len()
    }

    /// The random stream of item `item` of producer `producer`.
    fn item_rng(&self, producer: u64, item: u64) -> SourceRng {
        rng_from_seed(derive_seed(
            derive_seed(self.seed, ITEM_SUBSTREAM + producer),
            item,
        ))
    }

    /// A shared prefix drawn by popularity.
    fn pick_shared(&self, rng: &mut SourceRng) -> Shared {
        let total = self.popularity.last().copied().unwrap_or(0.0);
        let u = rng.random::<f64>() * total;
        let i = self.popularity.partition_point(|c| *c <= u);
        self.shared[i.min(self.shared.len() - 1)]
    }

    /// Producer `p`'s event at `at`: queue what it starts, then advance its clock.
    fn fire(&mut self, p: usize, at: u64) {
        let producer = &mut self.producers[p];
        let mut queue = |producer: &mut Producer, at: u64, shared: (u32, u64)| {
            self.pending.push(Reverse(Pending {
                at,
                order: self.issued,
                producer: p as u64,
                item: producer.items,
                shared_tokens: shared.0,
                shared_key: shared.1,
            }));
            self.issued += 1;
            producer.items += 1;
        };
        match producer.starts {
            Starts::One => queue(producer, at, (0, 0)),
            Starts::AgentBurst | Starts::BatchJob => {
                let (size, window, shared) = if producer.starts == Starts::AgentBurst {
                    let n = self.cfg.burst_size.sample(&mut producer.rng);
                    (n, AGENT_BURST_WINDOW_NS, (0, 0))
                } else {
                    let n = self.cfg.batch_size.sample(&mut producer.rng);
                    let job = producer.jobs;
                    producer.jobs += 1;
                    let mut rng =
                        rng_from_seed(derive_seed(derive_seed(self.seed, JOB_SUBSTREAM), job));
                    let tokens = self.cfg.shared_prompt_tokens.sample(&mut rng);
                    let key = content_key(self.salt, JOB_DOMAIN, job);
                    (n, BATCH_RELEASE_NS, (tokens, key))
                };
                let mut offsets: Vec<u64> = (0..size)
                    .map(|_| producer.rng.random_range(0..=window))
                    .collect();
                offsets.sort_unstable();
                for o in offsets {
                    queue(producer, at.saturating_add(o), shared);
                }
            }
        }
        let t = producer.clock.advance(&mut producer.rng);
        producer.next = (t <= self.end).then_some(t);
    }

    /// The block list of a `prompt`-token prompt whose first `shared_tokens` are a shared
    /// prefix keyed `shared_key` and the rest its own content keyed `own_key`; `full` keeps the
    /// full blocks between a session's turns.
    fn blocks(
        full: &mut Vec<u64>,
        prompt: u32,
        shared_tokens: u32,
        shared_key: u64,
        own_key: u64,
    ) -> Vec<u64> {
        let b = u64::from(BLOCK_TOKENS);
        grow_prefix_blocks(full, prompt, |index, fill| {
            if (index + 1) * b <= u64::from(shared_tokens) {
                splitmix64(shared_key ^ index)
            } else {
                block_content_key(own_key, index, fill)
            }
        })
    }

    fn fits(&self, prompt: u64) -> bool {
        prompt <= u64::from(self.cfg.max_prompt_tokens.unwrap_or(u32::MAX))
    }

    /// The request (or a session's first turn) of a pending item; `None` when a session's first
    /// turn does not fit `max_prompt_tokens` (it never starts).
    fn emit(&mut self, p: Pending) -> Option<Arrival> {
        let tag = p.item * PRODUCERS + p.producer;
        let own_key = content_key(self.salt, OWN_DOMAIN, tag);
        let mut rng = self.item_rng(p.producer, p.item);
        let (shared_tokens, shared_key) = if self.cfg.family.has_shared_set() {
            let s = self.pick_shared(&mut rng);
            (s.tokens, s.key)
        } else {
            (p.shared_tokens, p.shared_key)
        };
        let turns = if self.cfg.family.has_sessions() {
            self.cfg.turns.sample(&mut rng)
        } else {
            1
        };
        let own = self.cfg.prompt.sample(&mut rng);
        let output = self.cfg.output.sample(&mut rng);
        let prompt = u64::from(shared_tokens) + u64::from(own);
        if !self.fits(prompt) {
            return None;
        }
        let prompt = prompt.min(u64::from(u32::MAX)) as u32;
        let mut full = Vec::new();
        let prefix_blocks = Self::blocks(&mut full, prompt, shared_tokens, shared_key, own_key);
        if self.cfg.family.has_sessions() && turns > 1 {
            self.sessions.insert(
                tag,
                Session {
                    rng,
                    turns_left: turns - 1,
                    prompt,
                    output,
                    shared_tokens,
                    shared_key,
                    own_key,
                    full,
                },
            );
        }
        Some(Arrival {
            at: p.at,
            prompt_tokens: prompt,
            output_tokens: output,
            prefix_blocks,
            tag,
        })
    }
}

/// The content key of shared prefix, job or request `id` in `domain`, for a source salted
/// `salt`.
fn content_key(salt: u64, domain: u64, id: u64) -> u64 {
    splitmix64(salt ^ splitmix64(domain.rotate_left(56) ^ splitmix64(id)))
}

impl TrafficSource for Family {
    fn next_arrival(&mut self) -> Result<Option<Arrival>, TrafficError> {
        loop {
            let producer = self
                .producers
                .iter()
                .enumerate()
                .filter_map(|(i, p)| p.next.map(|t| (t, i)))
                .min();
            let head = self.pending.peek().map(|Reverse(p)| p.at);
            match (head, producer) {
                // A queued start comes no later than any producer's next event: nothing a
                // producer queues later can come before it.
                (Some(h), next) if next.is_none_or(|(t, _)| h <= t) => {
                    let Reverse(p) = self.pending.pop().expect("peeked");
                    if let Some(a) = self.emit(p) {
                        return Ok(Some(a));
                    }
                }
                (_, Some((t, i))) => self.fire(i, t),
                (_, None) => return Ok(None),
            }
        }
    }

    fn on_complete(&mut self, now: u64, tag: u64) -> Option<Arrival> {
        let mut s = self.sessions.remove(&tag)?;
        let added = self.cfg.prompt.sample(&mut s.rng);
        let prompt = u64::from(s.prompt) + u64::from(s.output) + u64::from(added);
        if !self.fits(prompt) {
            return None;
        }
        let prompt = prompt.min(u64::from(u32::MAX)) as u32;
        let output = self.cfg.output.sample(&mut s.rng);
        let at = now.saturating_add(self.cfg.think.sample(&mut s.rng));
        let prefix_blocks = Self::blocks(
            &mut s.full,
            prompt,
            s.shared_tokens,
            s.shared_key,
            s.own_key,
        );
        s.turns_left -= 1;
        s.prompt = prompt;
        s.output = output;
        if s.turns_left > 0 {
            self.sessions.insert(tag, s);
        }
        Some(Arrival {
            at,
            prompt_tokens: prompt,
            output_tokens: output,
            prefix_blocks,
            tag,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The families' figures as the table of `docs/scenarios.md`.

/// A length distribution as a scenario writes it, as Markdown code.
fn yaml_length(d: &LengthDist) -> String {
    match *d {
        LengthDist::Fixed(n) => format!("`{{ fixed: {n} }}`"),
        LengthDist::Uniform { min, max } => {
            format!("`{{ uniform: {{ min: {min}, max: {max} }} }}`")
        }
        LengthDist::LogNormal { median, sigma, max } => {
            format!("`{{ log_normal: {{ median: {median}, sigma: {sigma}, max: {max} }} }}`")
        }
        LengthDist::Exponential { mean } => format!("`{{ exponential: {{ mean: {mean} }} }}`"),
    }
}

/// A duration distribution as a scenario writes it, in seconds, as Markdown code.
fn yaml_seconds(d: &DurationDist) -> String {
    let s = routelab_policies::streams::nanos_to_secs;
    match *d {
        DurationDist::Fixed(n) => format!("`{{ fixed: {} }}`", s(n)),
        DurationDist::Uniform { min, max } => {
            format!("`{{ uniform: {{ min: {}, max: {} }} }}`", s(min), s(max))
        }
        DurationDist::Exponential { mean } => {
            format!("`{{ exponential: {{ mean: {} }} }}`", s(mean))
        }
    }
}

/// Each family's figures (its defaults) as a Markdown table, one row per family: the table in
/// `docs/scenarios.md` (a test holds them equal).
#[must_use]
pub fn markdown_table() -> String {
    let mut out = String::from(
        "| family | `rate_per_s` starts | `prompt` (new tokens per request) | `output` | sessions: `turns`, `think_s` | shared prefixes: `shared_prompts` × `shared_prompt_tokens`, `zipf_s` | arrivals |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for f in FamilyKind::ALL {
        let c = f.defaults(0, 1.0, 1);
        let starts = match f {
            FamilyKind::Chat | FamilyKind::Agentic => "sessions",
            FamilyKind::Code | FamilyKind::Rag => "requests",
            FamilyKind::BatchDay => "requests, online and batch together",
        };
        let sessions = if f.has_sessions() {
            format!("{}, {}", yaml_length(&c.turns), yaml_seconds(&c.think))
        } else {
            "—".to_owned()
        };
        let shared = if f.has_shared_set() {
            format!(
                "{} × {}, Zipf {}",
                c.shared_prompts,
                yaml_length(&c.shared_prompt_tokens),
                c.zipf_s
            )
        } else if f == FamilyKind::BatchDay {
            format!(
                "each job's instructions: {}",
                yaml_length(&c.shared_prompt_tokens)
            )
        } else {
            "—".to_owned()
        };
        let arrivals = match f {
            FamilyKind::Chat | FamilyKind::Rag => "Poisson".to_owned(),
            FamilyKind::Code => format!("Gamma renewal, `cv` {}", c.cv),
            FamilyKind::Agentic => format!(
                "Poisson bursts of `burst_size` {} sessions over {} s",
                yaml_length(&c.burst_size),
                AGENT_BURST_WINDOW_NS / 1_000_000_000
            ),
            FamilyKind::BatchDay => format!(
                "online: one day over `duration_s`, trough at the start, peak {}× the trough; \
                 `batch_fraction` {} of requests in jobs of `batch_size` {}, Poisson, each \
                 released over {} s",
                (1.0 + DAY_SWING) / (1.0 - DAY_SWING),
                c.batch_fraction,
                yaml_length(&c.batch_size),
                BATCH_RELEASE_NS / 1_000_000_000
            ),
        };
        out.push_str(&format!(
            "| `{}` | {starts} | {} | {} | {sessions} | {shared} | {arrivals} |\n",
            f.name(),
            yaml_length(&c.prompt),
            yaml_length(&c.output),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_docs_family_table_is_the_generators() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/scenarios.md");
        let doc = std::fs::read_to_string(path).unwrap();
        let begin = "<!-- traffic families: generated from sim/src/traffic/family.rs -->\n";
        let end = "<!-- end of traffic families -->";
        let (_, rest) = doc.split_once(begin).expect("the table's start marker");
        let (table, _) = rest.split_once(end).expect("the table's end marker");
        assert_eq!(
            table,
            markdown_table(),
            "docs/scenarios.md's family table differs from the defaults; paste markdown_table()"
        );
    }

    #[test]
    fn every_family_has_a_name_that_reads_back_and_valid_defaults() {
        for f in FamilyKind::ALL {
            assert_eq!(FamilyKind::from_name(f.name()), Some(f));
            f.defaults(0, 1.0, 1_000_000_000).validate().unwrap();
        }
        assert_eq!(FamilyKind::from_name("Chat"), None);
        assert_eq!(FamilyKind::names(), "chat, code, rag, agentic, batch-day");
    }

    #[test]
    fn popularity_follows_zipf() {
        let mut cfg = FamilyKind::Rag.defaults(0, 1.0, 1_000_000_000);
        cfg.shared_prompts = 10;
        let f = Family::new(cfg, 3).unwrap();
        let mut rng = rng_from_seed(9);
        let mut hits = [0u32; 10];
        for _ in 0..20_000 {
            let s = f.pick_shared(&mut rng);
            let i = f.shared.iter().position(|x| x.key == s.key).unwrap();
            hits[i] += 1;
        }
        // weight 1/i over H_10 = 2.929: the first 34.1 %, the tenth 3.4 %.
        let share = |i: usize| f64::from(hits[i]) / 20_000.0;
        assert!((share(0) - 0.341).abs() < 0.02, "{hits:?}");
        assert!((share(9) - 0.034).abs() < 0.01, "{hits:?}");
        assert!(
            hits.windows(2).filter(|w| w[0] < w[1]).count() <= 2,
            "{hits:?}"
        );
    }

    #[test]
    fn a_shared_prefix_gives_the_same_blocks_and_the_rest_its_own() {
        let mut full_a = Vec::new();
        let mut full_b = Vec::new();
        let a = Family::blocks(&mut full_a, 2000, 1100, 7, 100);
        let b = Family::blocks(&mut full_b, 2000, 1100, 7, 200);
        // 1,100 shared tokens: blocks 0 and 1 (up to 1,024) are whole inside it.
        assert_eq!(a.len(), 4);
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        let c = Family::blocks(&mut Vec::new(), 2000, 1100, 8, 100);
        assert_ne!(a[0], c[0], "another shared prefix shares nothing");
    }
}
