//! Traffic: synthetic request generators, trace replay and trace statistics.
//!
//! Every source implements [`TrafficSource`]: an open-loop stream of [`Arrival`]s in
//! non-decreasing time order, plus [`TrafficSource::on_complete`] through which closed-loop
//! and multi-turn sources hand back follow-up requests. Time is `u64` nanoseconds.
//!
//! Synthetic generators ([`Burst`], [`Poisson`], [`Diurnal`], [`OnOff`], [`ClosedLoop`],
//! [`Conversations`], [`LongPromptMix`], [`Family`]) are built from a plain config struct and a `u64` seed
//! and own a [`SourceRng`]: the same config and seed always give the same stream. [`Merge`]
//! layers sources. [`TraceReplay`] streams Azure 2023 CSV and Mooncake JSONL traces line by
//! line and replays any JSONL / CSV request log through a [`TraceMapping`] (custom, or the
//! ready-made `gateway-log` and `otel-genai`), and [`TraceStats`] summarises any source in one
//! pass.

pub mod catalog;
mod closed_loop;
mod conversations;
mod dist;
mod error;
pub mod family;
mod hash;
mod mapping;
mod merge;
mod open_loop;
mod resample;
mod stats;
mod trace;

pub use closed_loop::{ClosedLoop, ClosedLoopConfig};
pub use conversations::{Conversations, ConversationsConfig};
pub use dist::{DurationDist, LengthDist, SourceRng, Until};
pub use error::TrafficError;
pub use family::{
    AGENT_BURST_WINDOW_NS, BATCH_RELEASE_NS, DAY_SWING, FAMILY_PARAMS, Family, FamilyConfig,
    FamilyKind, FamilyParam, MAX_SHARED_PROMPTS, family_param,
};
pub use hash::{BLOCK_TOKENS, CHAIN_ROOT, blocks_for_tokens, chain_block_hash};
pub use mapping::{
    ArrivalError, ArrivalUnit, EPOCH_DOUBT_BEFORE_S, FieldPath, MappingError, OFFSET_MS_DOUBT_RATE,
    OFFSET_MS_DOUBT_SPAN_S, OFFSET_S_DOUBT_RATE, OFFSET_S_DOUBT_SPAN_S, READY_MADE_MAPPINGS,
    SHRINKING_FOLLOW_UPS, SHRINKING_MIN_FOLLOW_UPS, SessionPrefix, TraceLayout, TraceMapping,
};
pub use merge::Merge;
pub use open_loop::{
    Burst, BurstConfig, Diurnal, DiurnalConfig, LongPromptMix, LongPromptMixConfig, OnOff,
    OnOffConfig, Poisson, PoissonConfig,
};
pub use resample::{
    LoadedTrace, MIN_BLOCK_NS, Replayed, Resample, TimeWindow, open_trace, politis_white_block,
};
pub use stats::{
    COUNTER_MAX_RESUMED, LengthStats, PrefixReuse, RateSeries, SERIES_MAX_FIXED_WINDOWS,
    SERIES_MAX_WINDOWS, SERIES_WINDOWS_S, SESSION_MIN_JUDGED, SKIPPED_EXAMPLES_SHOWN, SeriesWindow,
    SessionStats, TraceStats, WindowTooFine, sparkline,
};
pub use trace::{BadRowPolicy, MAX_SKIPPED_EXAMPLES, ReplayOptions, TraceFormat, TraceReplay};

/// One request entering the gateway.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Arrival {
    /// Arrival time, ns.
    pub at: u64,
    /// Prompt length, tokens.
    pub prompt_tokens: u32,
    /// Output length, tokens (≥ 1).
    pub output_tokens: u32,
    /// Hashes of the prompt's 512-token blocks ([`BLOCK_TOKENS`]); hash `i` identifies the whole
    /// prefix up to and including block `i`. Empty = no prefix information.
    pub prefix_blocks: Vec<u64>,
    /// Source-specific id (sequence number, user, conversation or trace line), handed back to
    /// [`TrafficSource::on_complete`].
    pub tag: u64,
}

impl Arrival {
    /// An arrival without prefix information (does not allocate).
    #[inline]
    #[must_use]
    pub const fn new(at: u64, prompt_tokens: u32, output_tokens: u32, tag: u64) -> Self {
        Self {
            at,
            prompt_tokens,
            output_tokens,
            prefix_blocks: Vec::new(),
            tag,
        }
    }
}

/// A stream of requests.
pub trait TrafficSource: Send {
    /// Next open-loop arrival in non-decreasing time order, or `Ok(None)` when exhausted.
    ///
    /// This stream must not depend on completions (so it can be read ahead, e.g. by [`Merge`]).
    ///
    /// # Errors
    /// Trace sources report unreadable files and invalid rows.
    fn next_arrival(&mut self) -> Result<Option<Arrival>, TrafficError>;

    /// A request of this source with `tag` completed (or failed) at `now`; closed-loop and
    /// multi-turn sources answer with the follow-up arrival (`at >= now`).
    fn on_complete(&mut self, now: u64, tag: u64) -> Option<Arrival> {
        let _ = (now, tag);
        None
    }

    /// The rows a trace source skipped so far (`on_bad_row: skip`), so that a run can say so:
    /// none for generators.
    fn skipped(&self) -> Skipped {
        Skipped::default()
    }

    /// What a trace source noticed about its data that a run should say (a declared unit that
    /// makes the data implausible, sessions whose prompts do not grow): none for generators.
    fn warnings(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Bad rows a source skipped: how many, and the first one's error (file, line, field).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Rows skipped.
    pub rows: u64,
    /// The error of the first skipped row.
    pub first: Option<String>,
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the traffic skipped {} bad trace row(s) (on_bad_row: skip)",
            self.rows
        )?;
        if let Some(first) = &self.first {
            write!(f, "; the first: {first}")?;
        }
        Ok(())
    }
}

impl Skipped {
    /// Both counts; the first example of `self`, else of `other`.
    #[must_use]
    pub fn and(self, other: Skipped) -> Skipped {
        Skipped {
            rows: self.rows + other.rows,
            first: self.first.or(other.first),
        }
    }
}

impl<T: TrafficSource + ?Sized> TrafficSource for Box<T> {
    fn next_arrival(&mut self) -> Result<Option<Arrival>, TrafficError> {
        (**self).next_arrival()
    }

    fn on_complete(&mut self, now: u64, tag: u64) -> Option<Arrival> {
        (**self).on_complete(now, tag)
    }

    fn skipped(&self) -> Skipped {
        (**self).skipped()
    }

    fn warnings(&self) -> Vec<String> {
        (**self).warnings()
    }
}

#[cfg(test)]
mod tests;
