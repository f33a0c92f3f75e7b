//! What a trace's session ids look like, and the prefix reuse the prompts support: a growing
//! session prefix (`session_prefix: growing`) is an assumption, and `trace stats` must not
//! present what it invents as observed.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::traffic::Arrival;

/// Below this share of follow-ups that resume a session after another session's request, the
/// ids look like a counter (chats from concurrent users interleave).
pub const COUNTER_MAX_RESUMED: f64 = 0.01;
/// Fewest follow-ups (and sessions) before session ids are judged at all.
pub const SESSION_MIN_JUDGED: u64 = 10;

/// The session ids of a trace, as replayed (requests in arrival order).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct SessionStats {
    /// Requests that carry a session id.
    pub requests: u64,
    /// Distinct session ids.
    pub sessions: u64,
    /// Requests after their session's first.
    pub follow_ups: u64,
    /// Follow-ups whose session is not the one of the request just before them (with an id):
    /// the session resumed after another one's request.
    pub resumed: u64,
    /// Follow-ups whose prompt is at least the session's previous prompt plus its output: a
    /// prompt that can hold the history a chat resends.
    pub resending: u64,
    /// Prefix blocks of the requests with an id (the session's growing prefix, when
    /// `session_prefix: growing`).
    pub blocks_referenced: u64,
    /// Of those, blocks an earlier request carried (what `session_prefix: growing` assumes).
    pub reused_blocks: u64,
    /// Of those, the ones in resending follow-ups (the reuse the prompt lengths allow).
    pub supported_reused_blocks: u64,
}

impl SessionStats {
    /// The ids name requests, not sessions: (almost) every request has its own.
    #[must_use]
    pub fn unique_per_request(&self) -> bool {
        self.requests >= SESSION_MIN_JUDGED && self.follow_ups * 100 < self.requests
    }

    /// The ids look like a counter (a batch, a time bucket, a request sequence): enough
    /// sessions and follow-ups, and hardly any session resumes after another one's request.
    #[must_use]
    pub fn counter_like(&self) -> bool {
        self.follow_ups >= SESSION_MIN_JUDGED
            && self.sessions >= 3
            && (self.resumed as f64) < COUNTER_MAX_RESUMED * self.follow_ups as f64
    }

    /// Warnings about what the ids look like (empty when they look like sessions).
    #[must_use]
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.unique_per_request() {
            out.push(format!(
                "session ids: only {} of the {} requests with an id share it with an earlier \
                 request, so the ids look unique per request (a request id?) and group nothing; \
                 map the conversation's id as `session_id`, or leave it out",
                self.follow_ups, self.requests
            ));
        }
        // Only a growing prefix invents reuse from them (`session_prefix: none` gives no blocks).
        if self.counter_like() && self.blocks_referenced > 0 {
            out.push(format!(
                "session ids look like a counter (a batch, a time bucket, a request sequence), \
                 not conversations: the {} sessions' requests come one session after another \
                 and only {} of {} follow-ups resume a session after another's request (chats \
                 from concurrent users interleave); `session_prefix: growing` (the default) \
                 gives each follow-up its session's earlier blocks whatever its prompt, so the \
                 prefix reuse from them is assumed, not observed: set `session_prefix: none` \
                 if the id only groups requests",
                self.sessions, self.resumed, self.follow_ups
            ));
        }
        out
    }
}

/// Builds [`SessionStats`] from the replayed rows (arrival, session key).
#[derive(Debug, Default)]
pub(super) struct SessionAccumulator {
    stats: SessionStats,
    // Per session: its last prompt and output.
    last: HashMap<u64, (u32, u32)>,
    previous: Option<u64>,
    seen: HashSet<u64>,
}

impl SessionAccumulator {
    pub(super) fn add(&mut self, a: &Arrival, session: u64) {
        let s = &mut self.stats;
        s.requests += 1;
        let before = self
            .last
            .insert(session, (a.prompt_tokens, a.output_tokens));
        let resending = match before {
            None => {
                s.sessions += 1;
                false
            }
            Some((prompt, output)) => {
                s.follow_ups += 1;
                s.resumed += u64::from(self.previous != Some(session));
                a.prompt_tokens >= prompt.saturating_add(output)
            }
        };
        s.resending += u64::from(resending);
        self.previous = Some(session);
        let reused = a
            .prefix_blocks
            .iter()
            .filter(|h| self.seen.contains(h))
            .count() as u64;
        s.blocks_referenced += a.prefix_blocks.len() as u64;
        s.reused_blocks += reused;
        if resending {
            s.supported_reused_blocks += reused;
        }
        self.seen.extend(a.prefix_blocks.iter().copied());
    }

    pub(super) fn finish(self) -> Option<SessionStats> {
        (self.stats.requests > 0).then_some(self.stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traffic::hash::{block_content_key, grow_prefix_blocks};

    /// Rows (time, session, prompt, output) with growing session prefixes.
    fn stats(rows: &[(u64, u64, u32, u32)]) -> SessionStats {
        let mut acc = SessionAccumulator::default();
        let mut full: HashMap<u64, Vec<u64>> = HashMap::new();
        for &(at, session, prompt, output) in rows {
            let blocks = grow_prefix_blocks(full.entry(session).or_default(), prompt, |i, f| {
                block_content_key(session, i, f)
            });
            acc.add(
                &Arrival {
                    at,
                    prompt_tokens: prompt,
                    output_tokens: output,
                    prefix_blocks: blocks,
                    tag: 0,
                },
                session,
            );
        }
        acc.finish().unwrap()
    }

    #[test]
    fn interleaved_chats_that_resend_their_history_are_sessions() {
        // Four chats, interleaved, each turn's prompt = the last prompt + its answer + 100.
        let mut rows = Vec::new();
        let mut prompt = [600u32; 4];
        for turn in 0..4u64 {
            for chat in 0..4u64 {
                rows.push((turn * 4 + chat, chat, prompt[chat as usize], 200));
                prompt[chat as usize] += 300;
            }
        }
        let s = stats(&rows);
        assert_eq!(
            (s.sessions, s.follow_ups, s.resumed, s.resending),
            (4, 12, 12, 12)
        );
        assert!(s.reused_blocks > 0 && s.supported_reused_blocks == s.reused_blocks);
        assert!(s.warnings().is_empty(), "{:?}", s.warnings());
    }

    #[test]
    fn a_time_bucket_counter_is_warned_about_and_its_reuse_is_not_supported() {
        // Ids that tick every 5 requests; prompts unrelated (alternating long and short).
        let rows: Vec<_> = (0..50u64)
            .map(|k| (k, k / 5, if k % 2 == 0 { 4000 } else { 1500 }, 100))
            .collect();
        let s = stats(&rows);
        assert_eq!((s.sessions, s.follow_ups, s.resumed), (10, 40, 0));
        assert!(s.counter_like() && !s.unique_per_request());
        assert!(s.supported_reused_blocks < s.reused_blocks);
        let w = s.warnings().join("\n");
        assert!(
            w.contains("look like a counter") && w.contains("session_prefix: none"),
            "{w}"
        );
    }

    #[test]
    fn ids_unique_per_request_are_warned_about() {
        let rows: Vec<_> = (0..20u64).map(|k| (k, k, 1000, 10)).collect();
        let s = stats(&rows);
        assert!(s.unique_per_request() && !s.counter_like());
        assert_eq!(s.reused_blocks, 0);
        assert!(
            s.warnings()[0].contains("only 0 of the 20 requests"),
            "{:?}",
            s.warnings()
        );
    }
}
