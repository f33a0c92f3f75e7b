//! Multi-turn conversations whose prompts grow and share prefixes.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::dist::{DurationDist, LengthDist, SourceRng, check_rate, rng_from_seed};
use super::hash::{BLOCK_TOKENS, block_content_key, grow_prefix_blocks};
use super::open_loop::PoissonClock;
use super::{Arrival, TrafficError, TrafficSource};
use routelab_policies::streams::{CONVERSATION_SALT, splitmix64};

/// `conversations` conversations start as a Poisson process of rate `rate_per_s`. Each has
/// `turns` turns. Turn 1's prompt is the optional shared system prompt plus `user_tokens`;
/// turn k+1's prompt is turn k's prompt + turn k's output + new `user_tokens`, and it arrives
/// a `think` sample after turn k completes (or fails).
///
/// Prefix blocks follow the Mooncake convention (one hash per started 512-token block, hash i
/// identifies the whole prefix up to block i): full blocks keep their hash across turns, a
/// trailing partial block gets a hash that also encodes its fill, and blocks lying entirely
/// inside the system prompt are identical for every conversation with the same
/// `system_prompt_id` (even across sources). Conversation blocks are salted by the seed, so
/// two sources with different seeds never share conversation blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConversationsConfig {
    /// Start, ns.
    #[serde(default)]
    pub start: u64,
    /// Conversation start rate, per second (> 0).
    pub rate_per_s: f64,
    /// Number of conversations (≥ 1).
    pub conversations: u64,
    /// Turns per conversation.
    pub turns: LengthDist,
    /// New user tokens per turn.
    pub user_tokens: LengthDist,
    /// Output tokens per turn.
    pub output: LengthDist,
    /// Think time between a turn's completion and the next turn.
    pub think: DurationDist,
    /// Shared system prompt length in tokens (0 = none).
    #[serde(default)]
    pub system_prompt_tokens: u32,
    /// Identifies the system prompt's content; equal ids share blocks.
    #[serde(default)]
    pub system_prompt_id: u64,
    /// A conversation ends early when its next prompt would exceed this (e.g. context window).
    #[serde(default)]
    pub max_prompt_tokens: Option<u32>,
}

#[derive(Debug, Clone)]
struct Conv {
    turns_left: u32,
    prompt: u32,
    output: u32,
    /// Hashes of the blocks that were full in the last prompt.
    full: Vec<u64>,
}

/// Generator for [`ConversationsConfig`]. The tag of an arrival is its conversation id
/// (`0..conversations`); [`next_arrival`](TrafficSource::next_arrival) yields first turns,
/// [`on_complete`](TrafficSource::on_complete) the following ones.
#[derive(Debug, Clone)]
pub struct Conversations {
    cfg: ConversationsConfig,
    rng: SourceRng,
    clock: PoissonClock,
    salt: u64,
    system_key: u64,
    started: u64,
    turns_sent: u64,
    active: HashMap<u64, Conv>,
}

impl Conversations {
    /// Validate `cfg` and seed the generator.
    ///
    /// # Errors
    /// [`TrafficError::InvalidConfig`] for a bad rate, zero conversations, bad distributions or
    /// a `max_prompt_tokens` that leaves no room after the system prompt.
    pub fn new(cfg: ConversationsConfig, seed: u64) -> Result<Self, TrafficError> {
        const G: &str = "Conversations";
        check_rate(G, "rate_per_s", cfg.rate_per_s, false)?;
        if cfg.conversations == 0 {
            return Err(TrafficError::config(
                G,
                "conversations",
                "is 0; expected >= 1",
            ));
        }
        cfg.turns.validate(G, "turns")?;
        cfg.user_tokens.validate(G, "user_tokens")?;
        cfg.output.validate(G, "output")?;
        cfg.think.validate(G, "think")?;
        if let Some(m) = cfg.max_prompt_tokens
            && m <= cfg.system_prompt_tokens
        {
            return Err(TrafficError::config(
                G,
                "max_prompt_tokens",
                format!(
                    "is {m}; expected more than system_prompt_tokens ({})",
                    cfg.system_prompt_tokens
                ),
            ));
        }
        Ok(Self {
            clock: PoissonClock::new(cfg.start, cfg.rate_per_s),
            salt: splitmix64(seed ^ CONVERSATION_SALT),
            system_key: splitmix64(cfg.system_prompt_id ^ 0x5157_E4D0_0000_0002),
            rng: rng_from_seed(seed),
            cfg,
            started: 0,
            turns_sent: 0,
            active: HashMap::new(),
        })
    }

    /// Conversations currently waiting for a completion or a next turn.
    #[must_use]
    pub fn active(&self) -> usize {
        self.active.len()
    }

    /// Turns sent so far over all conversations.
    #[must_use]
    pub const fn turns_sent(&self) -> u64 {
        self.turns_sent
    }

    fn block_key(&self, conv: u64, index: u64, fill: u32) -> u64 {
        let b = u64::from(BLOCK_TOKENS);
        if (index + 1) * b <= u64::from(self.cfg.system_prompt_tokens) {
            splitmix64(self.system_key ^ index)
        } else {
            block_content_key(splitmix64(self.salt ^ splitmix64(conv)), index, fill)
        }
    }

    /// Extend `full` to the full blocks of a `prompt`-token prompt and return its block list.
    fn blocks(&self, conv: u64, full: &mut Vec<u64>, prompt: u32) -> Vec<u64> {
        grow_prefix_blocks(full, prompt, |index, fill| {
            self.block_key(conv, index, fill)
        })
    }

    fn fits(&self, prompt: u64) -> bool {
        prompt <= u64::from(self.cfg.max_prompt_tokens.unwrap_or(u32::MAX))
    }
}

impl TrafficSource for Conversations {
    fn next_arrival(&mut self) -> Result<Option<Arrival>, TrafficError> {
        while self.started < self.cfg.conversations {
            let at = self.clock.advance(&mut self.rng);
            let id = self.started;
            self.started += 1;
            let turns = self.cfg.turns.sample(&mut self.rng);
            let prompt = u64::from(self.cfg.system_prompt_tokens)
                + u64::from(self.cfg.user_tokens.sample(&mut self.rng));
            let output = self.cfg.output.sample(&mut self.rng);
            if !self.fits(prompt) {
                continue; // does not fit even its first turn: the conversation never starts
            }
            let prompt = prompt as u32; // fits() bounds it by u32::MAX
            let mut full = Vec::new();
            let blocks = self.blocks(id, &mut full, prompt);
            self.active.insert(
                id,
                Conv {
                    turns_left: turns - 1,
                    prompt,
                    output,
                    full,
                },
            );
            self.turns_sent += 1;
            return Ok(Some(Arrival {
                at,
                prompt_tokens: prompt,
                output_tokens: output,
                prefix_blocks: blocks,
                tag: id,
            }));
        }
        Ok(None)
    }

    fn on_complete(&mut self, now: u64, tag: u64) -> Option<Arrival> {
        let mut conv = self.active.remove(&tag)?;
        if conv.turns_left == 0 {
            return None;
        }
        let prompt = u64::from(conv.prompt)
            + u64::from(conv.output)
            + u64::from(self.cfg.user_tokens.sample(&mut self.rng));
        if !self.fits(prompt) {
            return None;
        }
        let prompt = prompt as u32;
        let output = self.cfg.output.sample(&mut self.rng);
        let at = now.saturating_add(self.cfg.think.sample(&mut self.rng));
        let blocks = self.blocks(tag, &mut conv.full, prompt);
        conv.turns_left -= 1;
        conv.prompt = prompt;
        conv.output = output;
        self.active.insert(tag, conv);
        self.turns_sent += 1;
        Some(Arrival {
            at,
            prompt_tokens: prompt,
            output_tokens: output,
            prefix_blocks: blocks,
            tag,
        })
    }
}

impl ConversationsConfig {
    /// Conversations start `factor` times as often (the start rate times `factor`); turns,
    /// lengths and think times are unchanged, so the request rate scales with it.
    #[must_use]
    pub fn with_load_scale(&self, factor: f64) -> Self {
        Self {
            rate_per_s: self.rate_per_s * factor,
            ..self.clone()
        }
    }
}
