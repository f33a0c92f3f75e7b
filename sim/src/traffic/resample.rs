//! Seeds that resample a trace, and a trace's parts by time.
//!
//! A trace is one recording of traffic. Replayed exactly, every seed of a study sees the same
//! arrivals and lengths, so an interval across seeds measures only the policies' and engines'
//! own randomness and says nothing about how a verdict would fare on the next hour of traffic.
//! [`Resample::Block`] gives each seed a different sample of traffic drawn from the trace
//! itself: a **local block bootstrap** in continuous time.
//!
//! **The scheme.** The trace's span is taken as a timeline of length `C` (the span plus one
//! mean gap between arrivals). Each seed lays out a new timeline of the same length from blocks
//! of fixed length `L`: the block that fills `[t, t + L)` of the new timeline copies the trace
//! from a start drawn uniformly within `±W` of `t` (clipped to the trace), so what happens
//! within `L` (bursts, lulls, the mix of lengths at that time) is kept as recorded, and so is
//! *when* it happens to within `W`, while the blocks themselves change from seed to seed. This
//! is the local block bootstrap of Paparoditis and Politis (2002, *Comptes Rendus Math.*
//! 335(11), "The local bootstrap for periodogram statistics" and "Local block bootstrap"),
//! the block bootstrap for **locally stationary** series: a series whose level drifts slowly
//! (a day's rate rising to its peak and falling) is near-stationary within a short window, so
//! blocks may be exchanged within it but not across it.
//!
//! **Why not the circular bootstrap it replaced.** Until issue 41 each block started anywhere
//! on the circle (Künsch 1989; Politis and Romano 1992). That is valid for a stationary trace
//! only: on a two-hour diurnal log it laid the peak's blocks beside the night's, flattening
//! the day into its mean rate, so the capacity at an SLO (which the peak decides) came out
//! 49 % above the trace's as recorded, with an interval that excluded it. Making blocks long
//! enough to span the rate's correlation time would keep the day's shape inside each block but
//! leave a handful of blocks per seed, still shuffled (a seed could draw the peak twice and the
//! night never): the shape would be kept in pieces and its position lost. Exchanging blocks only
//! near their own time keeps the shape where it was, whatever the block length, and still
//! resamples the traffic within it; on a stationary trace it is as valid as the circular
//! bootstrap, with a little less variety between seeds.
//!
//! **The window** `W` is [`LOCAL_HALF_WIDTH`] of the timeline on each side (at least one block):
//! on a trace spanning one daily cycle, moving a block by 5 % of the cycle changes the
//! sinusoidal rate at its place by at most `1 − cos(2π·0.05)`, 5 % of the day's swing; on
//! a two-hour log, blocks move by up to 6 minutes. The theory asks for a window that is small
//! against the span and long against a block (`L/W → 0`), which the block length's cap keeps.
//!
//! **What a block holds: whole episodes.** Requests of one conversation are not independent:
//! a later turn resends the earlier ones, which is what prefix caching lives on. So the unit a
//! block copies is an *episode* — a session (a mapped log's `session_id`), or, in a log with
//! prefix hashes and no session ids, a chain of requests each of which continues the latest
//! earlier request whose prompt, all but its last block, its own prompt begins with (a chat's
//! next turn is the previous prompt and answer plus a new message; each request continues at
//! most one later request, so a popular shared prefix never glues unrelated requests into one
//! episode), or else a single request. An episode belongs to the block its first request falls
//! in and is copied whole, its later requests at their recorded distances from the first; one
//! that runs past the end of the new timeline wraps round to its start (time is a circle, as
//! in the bootstrap), so every seed carries about the trace's request count.
//!
//! **Repeated episodes are new ones.** A block drawn twice would replay the same conversation
//! twice, and its second copy would find its prompts already cached: a reuse the trace never
//! had. The second and later copies of an episode therefore get their own prefix hashes for the
//! blocks only that episode used; blocks several episodes share (a system prompt) keep their
//! hashes, so that reuse stays as recorded.
//!
//! **The block length** is chosen from the trace unless given: the Politis–White rule for the
//! circular block bootstrap (Politis and White 2004, *Econometric Reviews* 23(1), with the
//! correction of Patton, Politis and White 2009, 28(4)) applied to the trace's work per second
//! (prompt plus output tokens in each second), then kept within [`MIN_BLOCK_NS`] (a block
//! spans the service of many requests) and the window `W` (a block is exchanged with others
//! near it, so it must be shorter than the window it moves in).
//!
//! A **part of a trace by time** ([`TimeWindow`]) keeps the rows whose arrival falls in a
//! fraction of the trace's span: how `capacity` and `compare` hold out the end of a trace to
//! check a winner out of sample.

use std::collections::HashMap;
use std::path::Path;

use rand::RngExt;
use routelab_policies::streams::{secs_to_nanos, splitmix64};
use serde::{Deserialize, Serialize};

use super::dist::rng_from_seed;
use super::trace::{ReplayOptions, TraceFormat, TraceReplay};
use super::{Arrival, Skipped, TrafficError, TrafficSource};

/// How the seeds of a trace source relate to its trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resample {
    /// Every seed replays the trace exactly as recorded (`resample: none`).
    Exact,
    /// Each seed replays its own local block-bootstrap resample of the trace (see the
    /// module documentation); `block_ns` is the block length, `None` to choose it from the
    /// trace.
    Block {
        /// Block length, ns (`None`: the Politis–White choice).
        block_ns: Option<u64>,
    },
}

impl Resample {
    /// The default of the commands that study traffic variability (`compare`, `capacity`,
    /// `sweep`, `replicas`): a block bootstrap with the block length chosen from the trace.
    pub const BLOCK_AUTO: Resample = Resample::Block { block_ns: None };
}

/// The shortest block the automatic choice gives, ns (10 s: many LLM requests' service).
pub const MIN_BLOCK_NS: u64 = 10_000_000_000;

/// How far a block may move, as a fraction of the timeline on each side: the local block
/// bootstrap's window (the module documentation says why 5 %).
pub const LOCAL_HALF_WIDTH: f64 = 0.05;

/// A part of a trace by time: the rows whose arrival, as a fraction of the trace's span from
/// its first row, is in `[from, to)` (`to = 1` includes the last row).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TimeWindow {
    /// Start, a fraction of the span in `[0, 1)`.
    pub from: f64,
    /// End, a fraction of the span in `(from, 1]`.
    pub to: f64,
}

impl TimeWindow {
    /// Whether a row at `t` (ns from the first row) of a trace spanning `span` ns is in it.
    #[must_use]
    pub fn contains(&self, t: u64, span: u64) -> bool {
        let x = if span == 0 {
            0.0
        } else {
            t as f64 / span as f64
        };
        x >= self.from && (x < self.to || (self.to >= 1.0 && t == span))
    }

    /// `the first 70 %` / `the last 30 %` / `30 % to 70 %` of the trace's span.
    #[must_use]
    pub fn describe(&self) -> String {
        let pct = |x: f64| format!("{} %", (x * 1000.0).round() / 10.0);
        if self.from <= 0.0 {
            format!("the first {} of its span", pct(self.to))
        } else if self.to >= 1.0 {
            format!("the last {} of its span", pct(1.0 - self.from))
        } else {
            format!("{} to {} of its span", pct(self.from), pct(self.to))
        }
    }
}

/// One loaded row: the arrival (its `at` in ns from the first loaded row, at the trace's own
/// pace) and its session's key, if the log has one.
#[derive(Debug, Clone)]
struct Row {
    arrival: Arrival,
    session: Option<u64>,
}

/// A trace read whole (at its own pace, from its first row): what a window or a resample is
/// taken from. Memory: one [`Arrival`] per row (its prefix hashes included).
#[derive(Debug, Clone)]
pub struct LoadedTrace {
    rows: Vec<Row>,
    skipped: Skipped,
    warnings: Vec<String>,
    /// The file name, for notes.
    name: String,
}

impl LoadedTrace {
    /// Read the trace at `path` whole, with `options`' row selection (`skip_rows`, `limit`,
    /// `on_bad_row`) and its `window`; the pace and offset are applied later.
    ///
    /// # Errors
    /// The trace's errors, and [`TrafficError::Empty`] when no row is left (in the window).
    pub fn load(
        path: &Path,
        format: TraceFormat,
        options: &ReplayOptions,
    ) -> Result<LoadedTrace, TrafficError> {
        crate::footprint::check_trace_fits(path, options.limit)?;
        let own_pace = ReplayOptions {
            time_scale: 1.0,
            rate_scale: 1.0,
            start_offset: 0,
            resample: None,
            window: None,
            ..options.clone()
        };
        let mut replay = TraceReplay::open(path, format, own_pace)?;
        let mut rows = Vec::new();
        while let Some((arrival, session)) = replay.next_row()? {
            rows.push(Row { arrival, session });
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut loaded = LoadedTrace {
            rows,
            skipped: replay.skipped(),
            warnings: replay.warnings(),
            name,
        };
        if let Some(w) = options.window {
            loaded.keep_window(w, path)?;
        }
        Ok(loaded)
    }

    /// Keep the rows in `w`, re-timed from the first one kept.
    fn keep_window(&mut self, w: TimeWindow, path: &Path) -> Result<(), TrafficError> {
        let span = self.span_ns();
        let total = self.rows.len();
        self.rows.retain(|r| w.contains(r.arrival.at, span));
        let Some(first) = self.rows.first().map(|r| r.arrival.at) else {
            return Err(TrafficError::Empty {
                path: path.to_path_buf(),
                detail: format!(
                    "none of its {total} rows falls in {} ({:.1} s in all)",
                    w.describe(),
                    span as f64 / 1e9
                ),
            });
        };
        for r in &mut self.rows {
            r.arrival.at -= first;
        }
        Ok(())
    }

    /// Rows loaded.
    #[must_use]
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True when no row is loaded (never, after a successful [`LoadedTrace::load`]).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// From the first row to the last, ns (at the trace's own pace).
    #[must_use]
    pub fn span_ns(&self) -> u64 {
        self.rows.last().map_or(0, |r| r.arrival.at)
    }

    /// The circle a resample is laid on: the span plus one mean gap between arrivals; `None`
    /// when the trace cannot be resampled (fewer than two rows, or all at one instant).
    fn circumference(&self) -> Option<u64> {
        let (n, span) = (self.rows.len() as u64, self.span_ns());
        (n >= 2 && span > 0).then(|| span + span / (n - 1))
    }

    /// The block length a resample with `block_ns` uses (`None`: chosen from the trace), or
    /// `None` when the trace cannot be resampled.
    #[must_use]
    pub fn block_length(&self, block_ns: Option<u64>) -> Option<u64> {
        let c = self.circumference()?;
        let most = local_window(c, 1).max(1);
        Some(match block_ns {
            Some(b) => b.clamp(1, c),
            None => {
                let bins = work_per_second(&self.rows, c);
                let chosen = politis_white_block(&bins).map_or(0, secs_to_nanos);
                chosen.max(MIN_BLOCK_NS).min(most)
            }
        })
    }

    /// How far (ns, each side) a block of a resample with `block_ns` may move from its own
    /// time: [`LOCAL_HALF_WIDTH`] of the timeline, and at least one block; `None` when the
    /// trace cannot be resampled.
    #[must_use]
    pub fn window_ns(&self, block_ns: Option<u64>) -> Option<u64> {
        let c = self.circumference()?;
        Some(local_window(c, self.block_length(block_ns)?))
    }

    /// The trace as recorded, at `options`' pace and offset.
    #[must_use]
    pub fn exact(self, options: &ReplayOptions) -> Replayed {
        let pace = Pace::of(options);
        let arrivals = self
            .rows
            .into_iter()
            .map(|r| Arrival {
                at: pace.at(r.arrival.at),
                ..r.arrival
            })
            .collect::<Vec<_>>();
        Replayed {
            arrivals: arrivals.into_iter(),
            skipped: self.skipped,
            warnings: self.warnings,
        }
    }

    /// A local block-bootstrap resample (the module documentation) drawn from `seed`, with
    /// blocks of `block_ns` (`None`: chosen from the trace), at `options`' pace and offset. A
    /// trace that cannot be resampled (fewer than two rows, or all at one instant) is replayed
    /// as recorded, and its warnings say so.
    #[must_use]
    pub fn resample(
        mut self,
        block_ns: Option<u64>,
        seed: u64,
        options: &ReplayOptions,
    ) -> Replayed {
        let (Some(circle), Some(block), Some(window)) = (
            self.circumference(),
            self.block_length(block_ns),
            self.window_ns(block_ns),
        ) else {
            self.warnings.push(format!(
                "{}: {} row(s) at one instant cannot be resampled; every seed replays them as \
                 recorded",
                self.name,
                self.rows.len()
            ));
            return self.exact(options);
        };
        let pace = Pace::of(options);
        let episodes = episodes(&self.rows);
        let owners = block_owners(&self.rows, &episodes);
        let anchors: Vec<u64> = episodes
            .iter()
            .map(|e| self.rows[e[0]].arrival.at)
            .collect();
        let mut used = vec![false; episodes.len()];
        let mut rng = rng_from_seed(seed);
        let mut out: Vec<(u64, Arrival)> = Vec::with_capacity(self.rows.len());
        let (mut placed, mut draw) = (0u64, 0u64);
        while placed < circle {
            let len = block.min(circle - placed);
            // A start within the window of the block's own place, the block inside the trace
            // (`placed + len <= circle`, so the range always holds `placed`).
            let lo = placed.saturating_sub(window);
            let hi = (placed + window).min(circle - len);
            let start = rng.random_range(lo..=hi);
            draw += 1;
            // Episodes whose first request falls in [start, start + len).
            let end = start + len;
            {
                let from = anchors.partition_point(|&a| a < start);
                let to = anchors.partition_point(|&a| a < end);
                for e in from..to {
                    let offset = anchors[e] - start;
                    let salt = if std::mem::replace(&mut used[e], true) {
                        Some(splitmix64(draw ^ 0x5245_5341_4D50_4C45))
                    } else {
                        None
                    };
                    for &i in &episodes[e] {
                        let row = &self.rows[i].arrival;
                        let mut t = placed + offset + (row.at - anchors[e]);
                        if t >= circle {
                            t -= circle;
                        }
                        let mut a = row.clone();
                        if let Some(salt) = salt {
                            for h in &mut a.prefix_blocks {
                                if owners.get(h) != Some(&SHARED) {
                                    *h = splitmix64(*h ^ salt);
                                }
                            }
                        }
                        a.at = pace.at(t);
                        out.push((t, a));
                    }
                }
            }
            placed += len;
        }
        // Stable: equal times keep the order they were laid out in.
        out.sort_by_key(|(t, _)| *t);
        Replayed {
            arrivals: out
                .into_iter()
                .map(|(_, a)| a)
                .collect::<Vec<_>>()
                .into_iter(),
            skipped: self.skipped,
            warnings: self.warnings,
        }
    }

    /// Episodes (the module documentation) and their sizes in requests, for tests and notes.
    #[must_use]
    pub fn episode_sizes(&self) -> Vec<usize> {
        episodes(&self.rows).iter().map(Vec::len).collect()
    }
}

/// `options`' pace (`time_scale / rate_scale`) and offset.
#[derive(Debug, Clone, Copy)]
struct Pace {
    factor: f64,
    offset: u64,
}

impl Pace {
    fn of(options: &ReplayOptions) -> Pace {
        Pace {
            factor: options.time_scale / options.rate_scale,
            offset: options.start_offset,
        }
    }

    /// The same rounding as the streamed replay's.
    fn at(self, t: u64) -> u64 {
        let scaled = if self.factor == 1.0 {
            t
        } else {
            (t as f64 * self.factor).round() as u64
        };
        self.offset.saturating_add(scaled)
    }
}

/// A loaded trace replayed (as recorded, part of it, or resampled).
#[derive(Debug)]
pub struct Replayed {
    arrivals: std::vec::IntoIter<Arrival>,
    skipped: Skipped,
    warnings: Vec<String>,
}

impl TrafficSource for Replayed {
    fn next_arrival(&mut self) -> Result<Option<Arrival>, TrafficError> {
        Ok(self.arrivals.next())
    }

    fn skipped(&self) -> Skipped {
        self.skipped.clone()
    }

    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }
}

/// The source of a trace: streamed as recorded when neither a resample nor a window is asked
/// for (the replay every run used before resampling existed, byte for byte), else read whole
/// and replayed as [`LoadedTrace`] makes it; `seed` draws the resample.
///
/// # Errors
/// As [`TraceReplay::open`] and [`LoadedTrace::load`].
pub fn open_trace(
    path: &Path,
    format: TraceFormat,
    options: &ReplayOptions,
    seed: u64,
) -> Result<Box<dyn TrafficSource>, TrafficError> {
    let resample = options.resample.unwrap_or(Resample::Exact);
    if resample == Resample::Exact && options.window.is_none() {
        return Ok(Box::new(TraceReplay::open(path, format, options.clone())?));
    }
    let loaded = LoadedTrace::load(path, format, options)?;
    Ok(Box::new(match resample {
        Resample::Exact => loaded.exact(options),
        Resample::Block { block_ns } => loaded.resample(block_ns, seed, options),
    }))
}

/// A block hash several episodes use (it keeps its hash in every copy).
const SHARED: u32 = u32::MAX;

/// The episodes of `rows` (sorted by arrival): each a list of row indices in time order, the
/// episodes in order of their first row.
fn episodes(rows: &[Row]) -> Vec<Vec<usize>> {
    let mut of_row: Vec<usize> = Vec::with_capacity(rows.len());
    let mut episodes: Vec<Vec<usize>> = Vec::new();
    let join = |episodes: &mut Vec<Vec<usize>>, of_row: &mut Vec<usize>, e: Option<usize>| {
        let i = of_row.len();
        let e = e.unwrap_or_else(|| {
            episodes.push(Vec::new());
            episodes.len() - 1
        });
        episodes[e].push(i);
        of_row.push(e);
    };
    if rows.iter().any(|r| r.session.is_some()) {
        let mut by_session: HashMap<u64, usize> = HashMap::new();
        for r in rows {
            let e = r.session.and_then(|s| by_session.get(&s).copied());
            join(&mut episodes, &mut of_row, e);
            if let Some(s) = r.session {
                by_session
                    .entry(s)
                    .or_insert(*of_row.last().expect("just pushed"));
            }
        }
    } else {
        // A request continues the latest earlier request whose prompt, all but its last
        // block, begins its own (keyed by that block's chain hash); each at most once.
        let mut open_ends: HashMap<u64, usize> = HashMap::new();
        for r in rows {
            let blocks = &r.arrival.prefix_blocks;
            let parent = (1..blocks.len())
                .rev()
                .find_map(|j| open_ends.remove(&blocks[j]));
            let parent = parent.map(|p| of_row[p]);
            join(&mut episodes, &mut of_row, parent);
            // Two full blocks at least: a shared one-block system prompt links nothing.
            if blocks.len() >= 3 {
                open_ends.insert(blocks[blocks.len() - 2], of_row.len() - 1);
            }
        }
    }
    episodes
}

/// Each prefix-block hash's episode, or [`SHARED`] when several use it.
fn block_owners(rows: &[Row], episodes: &[Vec<usize>]) -> HashMap<u64, u32> {
    let mut owners: HashMap<u64, u32> = HashMap::new();
    for (e, members) in episodes.iter().enumerate() {
        let e = u32::try_from(e).unwrap_or(SHARED - 1);
        for &i in members {
            for &h in &rows[i].arrival.prefix_blocks {
                owners
                    .entry(h)
                    .and_modify(|o| {
                        if *o != e {
                            *o = SHARED;
                        }
                    })
                    .or_insert(e);
            }
        }
    }
    owners
}

/// The local bootstrap's window on a timeline of `circle` ns: [`LOCAL_HALF_WIDTH`] of it, at
/// least `block`.
fn local_window(circle: u64, block: u64) -> u64 {
    ((circle as f64 * LOCAL_HALF_WIDTH) as u64).max(block)
}

/// Prompt plus output tokens arriving in each second of `[0, circle)`.
fn work_per_second(rows: &[Row], circle: u64) -> Vec<f64> {
    let bins = usize::try_from(circle.div_ceil(1_000_000_000)).unwrap_or(usize::MAX);
    let mut x = vec![0.0; bins.max(1)];
    for r in rows {
        let i = usize::try_from(r.arrival.at / 1_000_000_000).unwrap_or(usize::MAX);
        if let Some(v) = x.get_mut(i) {
            *v += f64::from(r.arrival.prompt_tokens) + f64::from(r.arrival.output_tokens);
        }
    }
    x
}

/// The circular block bootstrap's block length for the mean of `x`, in samples, by Politis and
/// White (2004) with the correction of Patton, Politis and White (2009): the flat-top lag
/// window's bandwidth `M = 2m̂` (`m̂` the first lag after which `K_n` autocorrelations in a row
/// are insignificant at `2·sqrt(log10(n)/n)`), then `b = (2Ĝ² / D̂_CB)^(1/3) n^(1/3)` with
/// `Ĝ = Σ λ(k/M)|k|R̂(k)` and `D̂_CB = (4/3)ĝ(0)²`, `ĝ(0) = Σ λ(k/M)R̂(k)`. `None` for fewer
/// than 8 samples or a constant series.
#[must_use]
pub fn politis_white_block(x: &[f64]) -> Option<f64> {
    let n = x.len();
    if n < 8 {
        return None;
    }
    let nf = n as f64;
    let mean = x.iter().sum::<f64>() / nf;
    let c: Vec<f64> = x.iter().map(|v| v - mean).collect();
    let acov = |k: usize| {
        c[..n - k]
            .iter()
            .zip(&c[k..])
            .map(|(a, b)| a * b)
            .sum::<f64>()
            / nf
    };
    let r0 = acov(0);
    if r0 <= 0.0 {
        return None;
    }
    let kn = (nf.log10().sqrt().ceil() as usize).max(5);
    let m_max = (nf.sqrt().ceil() as usize + kn).min(n - 1);
    let bound = 2.0 * (nf.log10() / nf).sqrt();
    let rho: Vec<f64> = (0..=(m_max + kn).min(n - 1))
        .map(|k| acov(k) / r0)
        .collect();
    let insignificant_after =
        |m: usize| (1..=kn).all(|k| rho.get(m + k).is_none_or(|r| r.abs() < bound));
    let m_hat = (1..=m_max)
        .find(|&m| insignificant_after(m))
        .unwrap_or(m_max);
    let big_m = (2 * m_hat).min(m_max).max(1);
    let flat_top = |t: f64| {
        let t = t.abs();
        if t <= 0.5 {
            1.0
        } else if t <= 1.0 {
            2.0 * (1.0 - t)
        } else {
            0.0
        }
    };
    let (mut g, mut g0) = (0.0, r0);
    for k in 1..=big_m {
        let w = flat_top(k as f64 / big_m as f64);
        let r = acov(k);
        g += 2.0 * w * k as f64 * r;
        g0 += 2.0 * w * r;
    }
    let d_cb = 4.0 / 3.0 * g0 * g0;
    if d_cb <= 0.0 || g == 0.0 {
        return None;
    }
    Some((2.0 * g * g / d_cb).cbrt() * nf.cbrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(at_s: f64, blocks: &[u64], session: Option<u64>) -> Row {
        Row {
            arrival: Arrival {
                at: (at_s * 1e9) as u64,
                prompt_tokens: 512 * blocks.len() as u32,
                output_tokens: 10,
                prefix_blocks: blocks.to_vec(),
                tag: 0,
            },
            session,
        }
    }

    #[test]
    fn a_follow_up_continues_the_request_whose_history_it_resends() {
        // (Hashes as chained ids: position i stands for the prefix up to i.) a: [0, 1, 2, 3];
        // b shares only the system block 0; c resends a's history 0, 1, 2 and adds 4, 5; d
        // resends c's history 0, 1, 2, 4 and adds; e resends c's history too, but c is already
        // continued by d (each request continues at most one later one) and a by c: e starts
        // its own episode.
        let rows = vec![
            row(0.0, &[0, 1, 2, 3], None),
            row(1.0, &[0, 70, 80], None),
            row(2.0, &[0, 1, 2, 4, 5], None),
            row(3.0, &[0, 1, 2, 4, 6, 7], None),
            row(4.0, &[0, 1, 2, 4, 8], None),
        ];
        let e = episodes(&rows);
        assert_eq!(e, vec![vec![0, 2, 3], vec![1], vec![4]]);
        let owners = block_owners(&rows, &e);
        assert_eq!(owners[&0], SHARED);
        assert_eq!(owners[&1], SHARED, "e resends 0, 1, 2 too");
        assert_eq!(owners[&5], 0);
        assert_eq!(owners[&6], 0);
        assert_eq!(owners[&70], 1);
        assert_eq!(owners[&8], 2);
    }

    #[test]
    fn sessions_are_episodes_when_the_log_names_them() {
        let rows = vec![
            row(0.0, &[], Some(1)),
            row(1.0, &[], None),
            row(2.0, &[], Some(1)),
            row(3.0, &[], Some(2)),
        ];
        assert_eq!(episodes(&rows), vec![vec![0, 2], vec![1], vec![3]]);
    }

    #[test]
    fn windows_split_a_span_without_overlap() {
        let head = TimeWindow { from: 0.0, to: 0.7 };
        let tail = TimeWindow { from: 0.7, to: 1.0 };
        for t in [0, 69, 70, 99, 100] {
            assert!(head.contains(t, 100) != tail.contains(t, 100), "{t}");
        }
        assert!(tail.contains(100, 100));
        assert_eq!(head.describe(), "the first 70 % of its span");
        assert_eq!(tail.describe(), "the last 30 % of its span");
    }

    #[test]
    fn politis_white_grows_with_the_series_memory() {
        // White noise: a short block; an AR(1) with strong memory: a much longer one.
        let mut s = 1u64;
        let mut next = || {
            s = splitmix64(s);
            (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        let noise: Vec<f64> = (0..3600).map(|_| next()).collect();
        let mut ar = vec![0.0; 3600];
        for i in 1..ar.len() {
            ar[i] = 0.95 * ar[i - 1] + next();
        }
        let b_noise = politis_white_block(&noise).unwrap();
        let b_ar = politis_white_block(&ar).unwrap();
        assert!(b_noise < 5.0, "{b_noise}");
        assert!(b_ar > 5.0 * b_noise && b_ar < 200.0, "{b_ar} vs {b_noise}");
        assert_eq!(politis_white_block(&[1.0; 100]), None);
        assert_eq!(politis_white_block(&[1.0, 2.0]), None);
    }

    /// A trace whose rate rises over its first half and falls over its second (a day in two
    /// hours), one request a row; `n` rows in all.
    fn diurnal_rows(n: usize) -> LoadedTrace {
        // Arrival times by inverting the cumulative rate 1 - cos(2πt/T) (rate 0 at the ends,
        // highest at T/2), found by bisection per row.
        let span = 7200.0;
        let cum =
            |t: f64| t - span / std::f64::consts::TAU * (std::f64::consts::TAU * t / span).sin();
        let rows = (0..n)
            .map(|i| {
                let target = cum(span) * (i as f64 + 0.5) / n as f64;
                let (mut lo, mut hi) = (0.0, span);
                for _ in 0..60 {
                    let mid = 0.5 * (lo + hi);
                    if cum(mid) < target {
                        lo = mid
                    } else {
                        hi = mid
                    }
                }
                row(lo, &[], None)
            })
            .collect();
        LoadedTrace {
            rows,
            skipped: Skipped::default(),
            warnings: Vec::new(),
            name: "d".into(),
        }
    }

    fn per_tenth(arrivals: &[Arrival], span_ns: u64) -> [usize; 10] {
        let mut out = [0; 10];
        for a in arrivals {
            out[((a.at * 10 / span_ns.max(1)) as usize).min(9)] += 1;
        }
        out
    }

    /// Issue 41: the resample keeps the trace's rate profile (each tenth of the span carries
    /// about its recorded share of the requests), where the circular bootstrap it replaced
    /// spread the peak evenly; and it still differs from seed to seed.
    #[test]
    fn the_local_resample_keeps_the_rate_profile_and_varies_by_seed() {
        let trace = diurnal_rows(6000);
        let span = trace.span_ns();
        let recorded: Vec<Arrival> = trace.rows.iter().map(|r| r.arrival.clone()).collect();
        let want = per_tenth(&recorded, span);
        let options = ReplayOptions::default();
        let draw = |seed| {
            let mut r = trace.clone().resample(Some(30_000_000_000), seed, &options);
            let mut v = Vec::new();
            while let Some(a) = r.next_arrival().unwrap() {
                v.push(a);
            }
            v
        };
        let (a, b) = (draw(1), draw(2));
        assert_ne!(
            a.iter().map(|x| x.at).collect::<Vec<_>>(),
            b.iter().map(|x| x.at).collect::<Vec<_>>()
        );
        for got in [per_tenth(&a, span), per_tenth(&b, span)] {
            for (k, (g, w)) in got.iter().zip(want).enumerate() {
                // The peak tenths hold ~16 % of the rows, the edge tenths ~1 %: a flattened
                // day (every tenth 10 %) fails at both ends.
                let tolerance = (w as f64 * 0.12).max(40.0);
                assert!(
                    (*g as f64 - w as f64).abs() <= tolerance,
                    "tenth {k}: {g} resampled vs {w} recorded ({got:?} vs {want:?})"
                );
            }
        }
        // The window: 5 % of the timeline, at least a block.
        let c = trace.circumference().unwrap();
        assert_eq!(trace.window_ns(Some(1)), Some((c as f64 * 0.05) as u64));
        assert_eq!(trace.window_ns(Some(c / 2)), Some(c / 2));
    }
}
