//! The arrival rate over time: requests and tokens per window, for `trace stats`.

use serde::Serialize;

use crate::traffic::Arrival;

/// Window lengths the series picks from (s), each a multiple of the one before, so that counts
/// kept at one rung add up exactly to the next. Past the last, the ladder goes on in tenfold
/// steps ([`rung_width`]), so that a span of any length (a timestamp unit mistake included) still
/// gets at most [`SERIES_MAX_WINDOWS`] windows.
pub const SERIES_WINDOWS_S: [u64; 7] = [1, 10, 60, 600, 3_600, 21_600, 86_400];
/// The most windows the series shows when it picks the window itself.
pub const SERIES_MAX_WINDOWS: u64 = 60;
/// The most windows a fixed `--window` may lay out (each one is a row of the series, empty ones
/// included): a fixed window this fine against the trace's span is refused, not allocated.
pub const SERIES_MAX_FIXED_WINDOWS: u64 = 100_000;
/// Above this many non-empty windows the accumulator moves to the next rung (memory bound).
const MAX_KEPT: usize = 100_000;
/// Rungs past [`SERIES_WINDOWS_S`]: 10 to 10^13 days, beyond any span a `u64` of
/// nanoseconds can hold (5.8e11 years).
const TENFOLD_RUNGS: u32 = 13;

/// The window of ladder rung `rung` (s).
fn rung_width(rung: usize) -> u64 {
    match SERIES_WINDOWS_S.get(rung) {
        Some(&w) => w,
        None => {
            let past = (rung + 1 - SERIES_WINDOWS_S.len()) as u32;
            SERIES_WINDOWS_S[SERIES_WINDOWS_S.len() - 1] * 10_u64.pow(past.min(TENFOLD_RUNGS))
        }
    }
}

const LAST_RUNG: usize = SERIES_WINDOWS_S.len() - 1 + TENFOLD_RUNGS as usize;

/// A fixed window too fine for the trace's span: the series would have more than
/// [`SERIES_MAX_FIXED_WINDOWS`] windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowTooFine {
    /// The window asked for (s).
    pub window_s: u64,
    /// The trace's span, first arrival to last (s).
    pub span_s: u64,
}

impl WindowTooFine {
    /// The windows the series would have had.
    #[must_use]
    pub fn windows(&self) -> u64 {
        self.span_s / self.window_s + 1
    }

    /// The finest window that gives at most [`SERIES_MAX_FIXED_WINDOWS`] windows (s).
    #[must_use]
    pub fn finest_allowed_s(&self) -> u64 {
        (self.span_s / SERIES_MAX_FIXED_WINDOWS) + 1
    }
}

/// One window of the series.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct SeriesWindow {
    /// Window start, s after the first arrival.
    pub start_s: u64,
    /// Arrivals in the window (requests).
    pub requests: u64,
    /// Prompt tokens of those arrivals.
    pub prompt_tokens: u64,
    /// Output tokens of those arrivals.
    pub output_tokens: u64,
}

/// Requests and tokens per window, from the first arrival to the last; empty windows included.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct RateSeries {
    /// Window length, s.
    pub window_s: u64,
    /// The windows, in time order.
    pub windows: Vec<SeriesWindow>,
}

impl SeriesWindow {
    /// Requests per second over the window.
    #[must_use]
    pub fn requests_per_s(&self, window_s: u64) -> f64 {
        self.requests as f64 / window_s as f64
    }

    /// Prompt plus output tokens per second over the window.
    #[must_use]
    pub fn tokens_per_s(&self, window_s: u64) -> f64 {
        (self.prompt_tokens + self.output_tokens) as f64 / window_s as f64
    }
}

/// Builds a [`RateSeries`] in one pass; memory is bounded by [`MAX_KEPT`] windows (without a
/// fixed window) or by the rows.
#[derive(Debug, Clone)]
pub(super) struct SeriesAccumulator {
    fixed: Option<u64>,
    rung: usize,
    first: Option<u64>,
    // A fixed window that an arrival showed too fine (the span, not this, sizes the error).
    // Nothing more is kept once it is set, so memory stays bounded whatever the timestamps say.
    too_fine: bool,
    // (window index at the current rung) -> totals; arrivals come in time order, so this is
    // appended to at its end.
    kept: Vec<(u64, SeriesWindow)>,
}

impl SeriesAccumulator {
    /// `window_s`: a fixed window (s, >= 1), or `None` to pick one of [`SERIES_WINDOWS_S`]
    /// giving at most [`SERIES_MAX_WINDOWS`] windows.
    pub(super) fn new(window_s: Option<u64>) -> Self {
        Self {
            fixed: window_s.map(|w| w.max(1)),
            rung: 0,
            first: None,
            too_fine: false,
            kept: Vec::new(),
        }
    }

    fn width(&self) -> u64 {
        self.fixed.unwrap_or_else(|| rung_width(self.rung))
    }

    pub(super) fn add(&mut self, a: &Arrival) {
        let first = *self.first.get_or_insert(a.at);
        let offset_s = a.at.saturating_sub(first) / 1_000_000_000;
        let index = offset_s / self.width();
        if self.fixed.is_some() && (index >= SERIES_MAX_FIXED_WINDOWS || self.too_fine) {
            self.too_fine = true;
            return;
        }
        match self.kept.last_mut() {
            Some((i, w)) if *i == index => add_to(w, a),
            // Out-of-order arrivals (a source that is not sorted) land in their own window.
            _ => match self.kept.binary_search_by_key(&index, |(i, _)| *i) {
                Ok(k) => add_to(&mut self.kept[k].1, a),
                Err(k) => {
                    let mut w = SeriesWindow::default();
                    add_to(&mut w, a);
                    self.kept.insert(k, (index, w));
                }
            },
        }
        while self.fixed.is_none() && self.kept.len() > MAX_KEPT && self.rung < LAST_RUNG {
            self.coarsen(self.rung + 1);
        }
    }

    fn coarsen(&mut self, rung: usize) {
        let factor = rung_width(rung) / rung_width(self.rung);
        let mut out: Vec<(u64, SeriesWindow)> = Vec::new();
        for (i, w) in self.kept.drain(..) {
            let j = i / factor;
            match out.last_mut() {
                Some((k, acc)) if *k == j => {
                    acc.requests += w.requests;
                    acc.prompt_tokens += w.prompt_tokens;
                    acc.output_tokens += w.output_tokens;
                }
                _ => out.push((j, w)),
            }
        }
        self.kept = out;
        self.rung = rung;
    }

    /// # Errors
    /// A fixed window that would give more than [`SERIES_MAX_FIXED_WINDOWS`] windows.
    pub(super) fn finish(mut self, span_ns: u64) -> Result<RateSeries, WindowTooFine> {
        let span_s = span_ns / 1_000_000_000;
        if let (Some(window_s), true) = (self.fixed, self.too_fine) {
            return Err(WindowTooFine { window_s, span_s });
        }
        if self.fixed.is_none() {
            while self.rung < LAST_RUNG && span_s / rung_width(self.rung) + 1 > SERIES_MAX_WINDOWS {
                self.coarsen(self.rung + 1);
            }
        }
        let width = self.width();
        let n = self.kept.last().map_or(0, |(i, _)| i + 1);
        let mut windows: Vec<SeriesWindow> = (0..n)
            .map(|i| SeriesWindow {
                start_s: i * width,
                ..SeriesWindow::default()
            })
            .collect();
        for (i, w) in self.kept {
            windows[i as usize] = SeriesWindow {
                start_s: i * width,
                ..w
            };
        }
        Ok(RateSeries {
            window_s: width,
            windows,
        })
    }
}

fn add_to(w: &mut SeriesWindow, a: &Arrival) {
    w.requests += 1;
    w.prompt_tokens += u64::from(a.prompt_tokens);
    w.output_tokens += u64::from(a.output_tokens);
}

/// Eight-level bars, one a value, scaled to the largest (an empty or all-zero series is flat).
#[must_use]
pub fn sparkline(values: &[f64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = values.iter().copied().fold(0.0_f64, f64::max);
    values
        .iter()
        .map(|&v| {
            if max <= 0.0 {
                BARS[0]
            } else {
                let level = ((v / max) * 7.0).round() as usize;
                BARS[level.min(7)]
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: f64, prompt: u32) -> Arrival {
        Arrival {
            at: (s * 1e9) as u64,
            prompt_tokens: prompt,
            output_tokens: 10,
            prefix_blocks: Vec::new(),
            tag: 0,
        }
    }

    #[test]
    fn windows_count_requests_and_tokens_with_empty_windows_kept() {
        let mut acc = SeriesAccumulator::new(Some(60));
        for (s, p) in [(0.0, 100), (59.9, 100), (60.0, 50), (185.0, 1)] {
            acc.add(&at(s, p));
        }
        let s = acc.finish(185_000_000_000).unwrap();
        assert_eq!(s.window_s, 60);
        let got: Vec<(u64, u64, u64)> = s
            .windows
            .iter()
            .map(|w| (w.start_s, w.requests, w.prompt_tokens))
            .collect();
        assert_eq!(got, [(0, 2, 200), (60, 1, 50), (120, 0, 0), (180, 1, 1)]);
        assert!((s.windows[0].requests_per_s(60) - 2.0 / 60.0).abs() < 1e-12);
        assert!((s.windows[0].tokens_per_s(60) - 220.0 / 60.0).abs() < 1e-12);
    }

    #[test]
    fn the_picked_window_gives_at_most_sixty_windows_and_keeps_the_totals() {
        // Two hours, one arrival every 7 s: 1 s windows would be 7,200, 60 s gives 120,
        // 600 s gives 12.
        let mut acc = SeriesAccumulator::new(None);
        let n: u32 = 7_200 / 7 + 1;
        for k in 0..n {
            acc.add(&at(7.0 * f64::from(k), 1));
        }
        let s = acc.finish(7_000_000_000 * u64::from(n - 1)).unwrap();
        assert_eq!(s.window_s, 600);
        assert_eq!(s.windows.len(), 12);
        assert_eq!(
            s.windows.iter().map(|w| w.requests).sum::<u64>(),
            u64::from(n)
        );
    }

    #[test]
    fn a_fixed_window_too_fine_for_the_span_is_an_error_and_keeps_nothing() {
        let mut acc = SeriesAccumulator::new(Some(1));
        let late = SERIES_MAX_FIXED_WINDOWS as f64 * 3.0;
        for s in [0.0, 5.0, late, 7.0] {
            acc.add(&at(s, 1));
        }
        assert!(acc.kept.len() <= 2, "{:?}", acc.kept);
        let span_ns = (late * 1e9) as u64;
        let e = acc.finish(span_ns).unwrap_err();
        assert_eq!(e.window_s, 1);
        assert_eq!(e.windows(), 3 * SERIES_MAX_FIXED_WINDOWS + 1);
        assert!(e.finest_allowed_s() * SERIES_MAX_FIXED_WINDOWS > e.span_s);
        // The finest allowed window is accepted.
        let mut acc = SeriesAccumulator::new(Some(e.finest_allowed_s()));
        for s in [0.0, late] {
            acc.add(&at(s, 1));
        }
        let s = acc.finish(span_ns).unwrap();
        assert!(s.windows.len() as u64 <= SERIES_MAX_FIXED_WINDOWS);
    }

    #[test]
    fn the_ladder_widens_past_a_day_for_any_span() {
        for span_s in [86_400_u64 * 61, 1_000_000_000, u64::MAX / 1_000_000_000] {
            let mut acc = SeriesAccumulator::new(None);
            acc.add(&Arrival {
                at: 0,
                ..at(0.0, 1)
            });
            acc.add(&Arrival {
                at: span_s * 1_000_000_000,
                ..at(0.0, 1)
            });
            let s = acc.finish(span_s * 1_000_000_000).unwrap();
            assert!(
                s.windows.len() as u64 <= SERIES_MAX_WINDOWS,
                "{span_s}: {}",
                s.windows.len()
            );
            assert_eq!(s.windows.iter().map(|w| w.requests).sum::<u64>(), 2);
        }
    }

    #[test]
    fn sparkline_scales_to_the_largest() {
        assert_eq!(sparkline(&[0.0, 1.0, 2.0]), "▁▅█");
        assert_eq!(sparkline(&[0.0, 0.0]), "▁▁");
        assert_eq!(sparkline(&[]), "");
    }
}
