//! The passive capacity curve of a worker: the aggregate decode throughput the gateway observes
//! at each number of requests decoding at once, measured on customer traffic only.
//!
//! A request is **decoding** from its first response byte until it ends (completed, failed, or
//! its client went away). The number decoding on a worker, `n`, changes only at those events;
//! over each interval during which it stays `n`, the curve adds the interval's length to bin `n`
//! and the output tokens that passed through the proxy meanwhile. `aggregate_tok_s(n)` is then
//! the bin's tokens over its time.
//!
//! - **Streamed** responses count their content events as they pass (one token each: engines
//!   stream one token per event), so each token lands in the interval it arrived in.
//! - **Buffered** (non-streaming) responses only say how many tokens they carried at the end
//!   (`usage.completion_tokens`); those are spread uniformly over the request's time from first
//!   byte to end, i.e. each bin the request lived through gets the share of its tokens that its
//!   time there is of the whole. A body that arrives all at once (first byte and end together)
//!   was decoded before the gateway saw a byte: with no observed time to set them against, its
//!   tokens are left out. The curve is exact for streamed traffic; buffered traffic adds to it
//!   only what the gateway saw being produced.
//!
//! **Time base**: the policy clock ([`crate::clock`]), the one the router uses. With
//! `clock_scale: K` in front of emulators at `--speedup K`, a wall second is K seconds of the
//! emulated engine's time, so tokens per policy second are the engine's own tok/s, comparable
//! with the hardware profile the emulator runs.
//!
//! **Bounded state**: [`MAX_CONCURRENCY`] bins of two numbers each, plus, per buffered request
//! decoding now, one entry per concurrency it lived through (at most [`MAX_CONCURRENCY`]).
//! Intervals at a higher concurrency are not recorded.

use routelab_policies::Time;
use std::time::Duration;

/// Highest concurrency with a bin of its own.
pub const MAX_CONCURRENCY: usize = 1024;

/// Default `capacity.min_observed_s`: a concurrency is exported once it was observed this long.
pub const DEFAULT_MIN_OBSERVED_S: f64 = 5.0;

/// The schema tag of `GET /admin/capacity`.
pub const SCHEMA: &str = "routelab-gateway-capacity/1";

/// What was observed at one concurrency.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Bin {
    observed: Duration,
    tokens: f64,
}

/// One exported point of the curve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// Requests decoding at once.
    pub concurrency: u32,
    /// Tokens per policy second over the observed time.
    pub aggregate_tok_s: f64,
    /// Policy seconds observed at this concurrency.
    pub observed_s: f64,
    /// Output tokens observed at this concurrency (fractional shares of buffered responses
    /// rounded only when exported).
    pub tokens: f64,
}

/// A request that started decoding, as the curve knows it; hand it back to [`Curve::end`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a decoding request must be ended"]
pub struct Decoding {
    /// The buffered request's slot in `Curve::buffered`, or `None` for a stream.
    buffered: Option<u64>,
}

/// A buffered request decoding now: the time it spent at each concurrency so far.
#[derive(Debug)]
struct Buffered {
    id: u64,
    spent: Vec<(u32, Duration)>,
}

/// One worker's curve.
#[derive(Debug)]
pub struct Curve {
    decoding: u32,
    /// When `decoding` last changed (or the curve was last brought up to date).
    since: Time,
    /// Tokens that arrived since `since`, at `decoding`.
    pending: f64,
    /// Bin `i` is concurrency `i + 1`; grown on demand up to [`MAX_CONCURRENCY`].
    bins: Vec<Bin>,
    buffered: Vec<Buffered>,
    next_id: u64,
}

impl Default for Curve {
    fn default() -> Self {
        Curve::new()
    }
}

impl Curve {
    /// An empty curve.
    pub fn new() -> Curve {
        Curve {
            decoding: 0,
            since: Time::ZERO,
            pending: 0.0,
            bins: Vec::new(),
            buffered: Vec::new(),
            next_id: 0,
        }
    }

    /// Close the interval `since..now` at the current concurrency.
    fn advance(&mut self, now: Time) {
        let dt = now.saturating_since(self.since);
        let n = self.decoding as usize;
        if (1..=MAX_CONCURRENCY).contains(&n) {
            if self.bins.len() < n {
                self.bins.resize(n, Bin::default());
            }
            let bin = &mut self.bins[n - 1];
            bin.observed += dt;
            bin.tokens += self.pending;
            if !dt.is_zero() {
                for b in &mut self.buffered {
                    match b.spent.iter_mut().find(|(c, _)| *c == self.decoding) {
                        Some((_, t)) => *t += dt,
                        None => b.spent.push((self.decoding, dt)),
                    }
                }
            }
        }
        self.pending = 0.0;
        self.since = self.since.max(now);
    }

    /// A request's first byte arrived; `buffered`: its body is read whole, so its tokens are
    /// known only at the end.
    pub fn start(&mut self, now: Time, buffered: bool) -> Decoding {
        self.advance(now);
        self.decoding += 1;
        let buffered = buffered.then(|| {
            let id = self.next_id;
            self.next_id += 1;
            self.buffered.push(Buffered {
                id,
                spent: Vec::new(),
            });
            id
        });
        Decoding { buffered }
    }

    /// `tokens` output tokens of a stream passed through now.
    pub fn tokens(&mut self, tokens: u32) {
        if self.decoding > 0 {
            self.pending += f64::from(tokens);
        }
    }

    /// A decoding request ended; `buffered_tokens`: a buffered response's output tokens, if it
    /// completed (ignored for a stream, whose tokens were counted as they came).
    pub fn end(&mut self, now: Time, d: Decoding, buffered_tokens: Option<u32>) {
        self.advance(now);
        if let Some(id) = d.buffered
            && let Some(i) = self.buffered.iter().position(|b| b.id == id)
        {
            let b = self.buffered.swap_remove(i);
            if let Some(n) = buffered_tokens.filter(|&n| n > 0) {
                let total: f64 = b.spent.iter().map(|(_, t)| t.as_secs_f64()).sum();
                // A body that arrived all at once (first byte and end together) was decoded
                // before the gateway saw anything: no observed time to set its tokens against,
                // so they are left out rather than credited to whatever bin is open now (which
                // would raise that bin's tok/s by tokens it did not produce).
                if total > 0.0 {
                    for (c, t) in &b.spent {
                        self.bins[*c as usize - 1].tokens += f64::from(n) * t.as_secs_f64() / total;
                    }
                }
            }
        }
        self.decoding = self.decoding.saturating_sub(1);
    }

    /// Requests decoding now.
    pub fn decoding(&self) -> u32 {
        self.decoding
    }

    /// The points observed at least `min_observed` (the interval still open counted up to
    /// `now`), by concurrency.
    pub fn points(&self, now: Time, min_observed: Duration) -> Vec<Point> {
        let mut bins = self.bins.clone();
        let n = self.decoding as usize;
        if (1..=MAX_CONCURRENCY).contains(&n) {
            if bins.len() < n {
                bins.resize(n, Bin::default());
            }
            bins[n - 1].observed += now.saturating_since(self.since);
            bins[n - 1].tokens += self.pending;
        }
        bins.iter()
            .enumerate()
            .filter(|(_, b)| !b.observed.is_zero() && b.observed >= min_observed)
            .map(|(i, b)| {
                let observed_s = b.observed.as_secs_f64();
                Point {
                    concurrency: i as u32 + 1,
                    aggregate_tok_s: b.tokens / observed_s,
                    observed_s,
                    tokens: b.tokens,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: f64) -> Time {
        Time::from_secs_f64(s)
    }

    fn point(points: &[Point], n: u32) -> Point {
        *points
            .iter()
            .find(|p| p.concurrency == n)
            .unwrap_or_else(|| panic!("no point at {n}: {points:?}"))
    }

    /// Two streams on one worker: A decodes alone for 2 s (60 tokens), then with B for 4 s
    /// (200 tokens in all), then B alone for 1 s (40 tokens).
    #[test]
    fn streamed_tokens_land_in_the_interval_they_arrived_in() {
        let mut c = Curve::new();
        let a = c.start(at(10.0), false);
        c.tokens(1);
        for _ in 0..59 {
            c.tokens(1);
        }
        let b = c.start(at(12.0), false);
        c.tokens(150);
        c.tokens(50);
        c.end(at(16.0), a, Some(999));
        c.tokens(40);
        c.end(at(17.0), b, None);
        assert_eq!(c.decoding(), 0);
        let p = c.points(at(100.0), Duration::ZERO);
        assert_eq!(p.len(), 2, "{p:?}");
        assert_eq!(
            point(&p, 1),
            Point {
                concurrency: 1,
                aggregate_tok_s: 100.0 / 3.0,
                observed_s: 3.0,
                tokens: 100.0
            }
        );
        assert_eq!(
            point(&p, 2),
            Point {
                concurrency: 2,
                aggregate_tok_s: 50.0,
                observed_s: 4.0,
                tokens: 200.0
            }
        );
        // Only what was observed long enough, in order of concurrency.
        let p = c.points(at(100.0), Duration::from_secs_f64(3.5));
        assert_eq!(p.iter().map(|p| p.concurrency).collect::<Vec<_>>(), [2]);
    }

    /// A buffered response of 300 tokens decoding from 0 s to 6 s: 2 s alone, 3 s beside a
    /// stream, 1 s alone again. Its tokens are spread by time: 150 to concurrency 1 (3 s of 6),
    /// 150 to concurrency 2; the stream adds its own 90 at concurrency 2.
    #[test]
    fn buffered_tokens_are_spread_over_the_time_from_first_byte_to_end() {
        let mut c = Curve::new();
        let body = c.start(at(0.0), true);
        let stream = c.start(at(2.0), false);
        c.tokens(90);
        c.end(at(5.0), stream, None);
        c.end(at(6.0), body, Some(300));
        let p = c.points(at(6.0), Duration::ZERO);
        let (one, two) = (point(&p, 1), point(&p, 2));
        assert_eq!((one.observed_s, two.observed_s), (3.0, 3.0));
        assert!((one.tokens - 150.0).abs() < 1e-9, "{one:?}");
        assert!((two.tokens - 240.0).abs() < 1e-9, "{two:?}");
        assert!((one.aggregate_tok_s - 50.0).abs() < 1e-9);
        assert!((two.aggregate_tok_s - 80.0).abs() < 1e-9);
        // A failed buffered response adds time but no tokens; one that came at once (no time
        // observed) adds nothing: its tokens would raise the open bin's rate by tokens that bin
        // did not produce.
        let f = c.start(at(10.0), true);
        c.end(at(12.0), f, None);
        let now = c.start(at(20.0), true);
        c.end(at(20.0), now, Some(10));
        let one = point(&c.points(at(20.0), Duration::ZERO), 1);
        assert_eq!(one.observed_s, 5.0);
        assert!((one.tokens - 150.0).abs() < 1e-9, "{one:?}");
    }

    /// The interval still open counts up to the snapshot, and concurrencies beyond the last bin
    /// are not recorded (the state stays bounded).
    #[test]
    fn the_open_interval_counts_and_the_state_is_bounded() {
        let mut c = Curve::new();
        let d = c.start(at(1.0), false);
        c.tokens(20);
        let p = c.points(at(3.0), Duration::ZERO);
        assert_eq!(point(&p, 1).aggregate_tok_s, 10.0);
        c.end(at(3.0), d, None);
        let mut many = Vec::new();
        for _ in 0..MAX_CONCURRENCY + 5 {
            many.push(c.start(at(4.0), false));
        }
        c.tokens(1000);
        for d in many {
            c.end(at(5.0), d, None);
        }
        assert!(c.bins.len() <= MAX_CONCURRENCY);
        let p = c.points(at(5.0), Duration::ZERO);
        assert!(p.iter().all(|p| p.concurrency as usize <= MAX_CONCURRENCY));
        assert_eq!(c.decoding(), 0);
    }
}
