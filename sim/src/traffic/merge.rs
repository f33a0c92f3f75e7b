//! k-way merge of several traffic sources.

use super::{Arrival, Skipped, TrafficError, TrafficSource};

enum Head {
    /// Not pulled yet (or the pull failed and must be retried).
    Empty,
    Ready(Arrival),
    Exhausted,
}

/// Layers several sources into one stream, ordered by time; ties go to the source listed
/// first. Tags are re-encoded as `inner_tag · n + source_index` (n = number of sources) so
/// that [`on_complete`](TrafficSource::on_complete) reaches the right source; inner tags must
/// stay below `u64::MAX / n` (all sources of this module use small counters or ids).
///
/// The merge pulls each source one arrival ahead, so a source's
/// [`next_arrival`](TrafficSource::next_arrival) stream must not depend on completions (true
/// for every source here: closed-loop follow-ups come from `on_complete`).
pub struct Merge {
    sources: Vec<Box<dyn TrafficSource>>,
    heads: Vec<Head>,
}

impl std::fmt::Debug for Merge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Merge")
            .field("sources", &self.sources.len())
            .finish_non_exhaustive()
    }
}

impl Merge {
    /// Merge `sources` (in priority order for ties).
    #[must_use]
    pub fn new(sources: Vec<Box<dyn TrafficSource>>) -> Self {
        let heads = sources.iter().map(|_| Head::Empty).collect();
        Self { sources, heads }
    }

    /// Number of merged sources.
    #[must_use]
    pub fn len(&self) -> usize {
        self.sources.len()
    }

    /// True when nothing is merged.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    fn encode(&self, mut a: Arrival, index: usize) -> Result<Arrival, TrafficError> {
        let n = self.sources.len() as u64;
        a.tag = a
            .tag
            .checked_mul(n)
            .and_then(|t| t.checked_add(index as u64))
            .ok_or(TrafficError::TagOverflow {
                tag: a.tag,
                source_index: index,
                sources: self.sources.len(),
            })?;
        Ok(a)
    }
}

impl TrafficSource for Merge {
    fn next_arrival(&mut self) -> Result<Option<Arrival>, TrafficError> {
        let mut best: Option<(u64, usize)> = None;
        for (i, (src, head)) in self
            .sources
            .iter_mut()
            .zip(self.heads.iter_mut())
            .enumerate()
        {
            if matches!(head, Head::Empty) {
                *head = match src.next_arrival()? {
                    Some(a) => Head::Ready(a),
                    None => Head::Exhausted,
                };
            }
            if let Head::Ready(a) = head
                && best.is_none_or(|(t, _)| a.at < t)
            {
                best = Some((a.at, i));
            }
        }
        let Some((_, i)) = best else { return Ok(None) };
        let Head::Ready(a) = std::mem::replace(&mut self.heads[i], Head::Empty) else {
            unreachable!("best head is ready")
        };
        self.encode(a, i).map(Some)
    }

    fn on_complete(&mut self, now: u64, tag: u64) -> Option<Arrival> {
        let n = self.sources.len() as u64;
        if n == 0 {
            return None;
        }
        let index = (tag % n) as usize;
        let follow = self.sources[index].on_complete(now, tag / n)?;
        // Inner tags handed back by a source fit whenever its earlier tags did.
        self.encode(follow, index).ok()
    }

    fn skipped(&self) -> Skipped {
        self.sources
            .iter()
            .fold(Skipped::default(), |all, s| all.and(s.skipped()))
    }

    fn warnings(&self) -> Vec<String> {
        self.sources.iter().flat_map(|s| s.warnings()).collect()
    }
}
