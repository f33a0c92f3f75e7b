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

use serde::{Deserialize, Serialize};

use super::TrafficError;
use super::dist::{DurationDist, LengthDist};

mod source;
pub use source::Family;

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

pub(super) const G: &str = "family";

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

/// The least value `dist` draws (the samplers clamp below at 1).
fn least(dist: &LengthDist) -> u32 {
    match *dist {
        LengthDist::Fixed(n) => n,
        LengthDist::Uniform { min, .. } => min,
        LengthDist::LogNormal { .. } | LengthDist::Exponential { .. } => 1,
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
        // A limit below the shortest first turn (its shared prefix and its own tokens) ends
        // every session before it sends anything: a run of no traffic, not a limit.
        if let Some(limit) = self.max_prompt_tokens
            && self.family.has_sessions()
        {
            let shared = if self.family.has_shared_set() {
                least(&self.shared_prompt_tokens)
            } else {
                0
            };
            let first = u64::from(shared) + u64::from(least(&self.prompt));
            if first > u64::from(limit) {
                return Err(TrafficError::config(
                    G,
                    "max_prompt_tokens",
                    format!(
                        "is {limit}, below the shortest first turn ({first} tokens: the least shared prefix and prompt the distributions draw), so no session would send a request; expected at least {first}"
                    ),
                ));
            }
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
        let begin = "<!-- traffic families: generated from sim/src/traffic/family/mod.rs -->\n";
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
    fn a_limit_below_every_first_turn_is_refused_by_name() {
        let mut c = FamilyKind::Agentic.defaults(0, 1.0, 1_000_000_000);
        c.shared_prompt_tokens = LengthDist::Uniform {
            min: 2000,
            max: 12_000,
        };
        c.prompt = LengthDist::Fixed(300);
        c.max_prompt_tokens = Some(2299);
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("max_prompt_tokens") && e.contains("expected at least 2300"),
            "{e}"
        );
        c.max_prompt_tokens = Some(2300);
        c.validate().unwrap();
        // Code has no sessions: the limit does not apply.
        let mut code = FamilyKind::Code.defaults(0, 1.0, 1_000_000_000);
        code.max_prompt_tokens = Some(1);
        code.validate().unwrap();
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
