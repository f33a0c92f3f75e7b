//! The generator of a traffic family: producers of sessions and requests on their arrival
//! clocks, the shared prefixes, and each session's turns, drawn from the sub-streams the
//! parent module's documentation describes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use rand::RngExt;
use rand_distr::{Distribution, Gamma};

use super::super::dist::{SourceRng, exp1, rng_from_seed};
use super::super::hash::{BLOCK_TOKENS, block_content_key, grow_prefix_blocks};
use super::super::{Arrival, TrafficError, TrafficSource};
use super::{AGENT_BURST_WINDOW_NS, BATCH_RELEASE_NS, DAY_SWING, FamilyConfig, FamilyKind, G};
use routelab_policies::streams::{
    CONVERSATION_SALT, NANOS_PER_SEC, derive_seed, splitmix64, truncate_nanos,
};

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
    pub(super) fn blocks(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traffic::family::FamilyKind;

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
}
