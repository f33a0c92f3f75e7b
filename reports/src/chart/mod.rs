//! Charts: a small, backend-independent description ([`Figure`]) drawn by the same code onto
//! plotters' SVG backend (kept as a string for inlining into HTML) and bitmap backend (PNG).
//!
//! Text is laid out with the bundled DejaVu Sans (registered once with plotters' `ab_glyph`
//! font table), so no system font library is needed and the output is identical everywhere.
//!
//! `style`: font, palette, dashes and markers; `frame`: axes, ticks and what every panel
//! draws alike; `legend`: the shared legend and a panel's own; `lines` and `bars`: the two
//! kinds of panel.

mod bars;
mod frame;
mod legend;
mod lines;
mod style;

pub(crate) use frame::nice_max;
pub(crate) use lines::cdf_points;
pub(crate) use style::color;

use crate::error::ReportError;
use bars::names_fit;
use legend::{draw_shared_legend, legend_layout};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use style::{FAMILY, ensure_font};

/// A line or step series.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    pub name: String,
    pub color: RGBColor,
    pub points: Vec<(f64, f64)>,
}

/// Where a legend goes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Legend {
    None,
    UpperRight,
}

/// A panel of lines.
#[derive(Debug, Clone)]
pub(crate) struct LinePanel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Logarithmic x axis.
    pub x_log: bool,
    /// Logarithmic y axis (for latencies that span orders of magnitude across load).
    pub y_log: bool,
    pub x_range: Option<(f64, f64)>,
    pub y_range: Option<(f64, f64)>,
    /// Format y ticks as percentages of 1.
    pub y_percent: bool,
    /// Categorical x ticks: (position, label).
    pub x_ticks: Option<Vec<(f64, String)>>,
    /// Draw point markers.
    pub markers: bool,
    /// Hold each value until the next point (sampled state such as weights).
    pub step: bool,
    pub legend: Legend,
    pub series: Vec<Series>,
    /// Shaded intervals drawn under the lines (a mean's 95 % band across seeds).
    pub bands: Vec<Band>,
    /// Horizontal reference lines across the panel (a target), each with its label.
    pub reference_lines: Vec<(f64, String)>,
    /// Marked points that are not data (a capacity: where a policy's mean curve meets the
    /// target, with its interval), drawn as outlined diamonds with a horizontal whisker.
    pub knees: Vec<Knee>,
}

/// A shaded interval: at each x, from `low` to `high`.
#[derive(Debug, Clone)]
pub(crate) struct Band {
    pub color: RGBColor,
    /// `(x, low, high)`, by x.
    pub points: Vec<(f64, f64, f64)>,
}

/// A marked point with a horizontal interval.
#[derive(Debug, Clone)]
pub(crate) struct Knee {
    pub color: RGBColor,
    pub x: f64,
    pub y: f64,
    /// The interval's ends on x (equal to `x` when it has none).
    pub x_low: f64,
    pub x_high: f64,
}

impl LinePanel {
    pub fn new(title: impl Into<String>, x_label: &str, y_label: &str) -> LinePanel {
        LinePanel {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            x_log: false,
            y_log: false,
            x_range: None,
            y_range: None,
            y_percent: false,
            x_ticks: None,
            markers: false,
            step: false,
            legend: Legend::UpperRight,
            series: Vec::new(),
            bands: Vec::new(),
            reference_lines: Vec::new(),
            knees: Vec::new(),
        }
    }
}

/// One group of bars (one legend entry), a value per category.
#[derive(Debug, Clone)]
pub(crate) struct BarGroup {
    pub name: String,
    pub color: RGBColor,
    pub values: Vec<Option<f64>>,
    /// Error bar (low, high) per category.
    pub errors: Vec<Option<(f64, f64)>>,
}

/// A panel of grouped bars.
#[derive(Debug, Clone)]
pub(crate) struct BarPanel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub categories: Vec<String>,
    pub groups: Vec<BarGroup>,
    pub y_percent: bool,
    /// One group only: colour each bar by its category.
    pub color_by_category: bool,
}

/// A panel.
#[derive(Debug, Clone)]
pub(crate) enum Panel {
    Lines(LinePanel),
    Bars(BarPanel),
}

/// A chart: a title and panels stacked in a grid.
#[derive(Debug, Clone)]
pub(crate) struct Figure {
    pub title: String,
    pub width: u32,
    pub panel_height: u32,
    pub columns: usize,
    pub panels: Vec<Panel>,
    /// A legend shared by all panels, drawn as rows under the title.
    pub legend: Vec<(String, RGBColor)>,
}

impl Figure {
    pub fn new(title: impl Into<String>, panels: Vec<Panel>) -> Figure {
        let n = panels.len().max(1);
        Figure {
            title: title.into(),
            width: 900,
            panel_height: if n == 1 { 460 } else { 320 },
            columns: 1,
            panels,
            legend: Vec::new(),
        }
    }

    /// The legend drawn under the title, shared by every panel: the figure's own, else, for
    /// bars coloured by category, the categories in full (numbered as their ticks are when the
    /// names do not fit under the bars).
    fn legend_items(&self) -> Vec<(String, RGBColor)> {
        if !self.legend.is_empty() {
            // A figure's own legend that names, in order, the categories of a bars panel whose
            // ticks are numbered carries the same numbers (issue 41: the capacity chart's bars
            // read 1, 2, 3 and its legend said which policy none of them was).
            let numbered_bars = self.panels.iter().any(|p| {
                matches!(p, Panel::Bars(b) if b.color_by_category
                    && !names_fit(&b.categories, self.panel_width())
                    && b.categories.iter().eq(self.legend.iter().map(|(n, _)| n)))
            });
            if numbered_bars {
                return self
                    .legend
                    .iter()
                    .enumerate()
                    .map(|(i, (n, c))| (format!("{} {n}", i + 1), *c))
                    .collect();
            }
            return self.legend.clone();
        }
        let Some(Panel::Bars(p)) = self.panels.first() else {
            return Vec::new();
        };
        if !p.color_by_category {
            return Vec::new();
        }
        let numbered = !names_fit(&p.categories, self.panel_width());
        p.categories
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let name = if numbered {
                    format!("{} {c}", i + 1)
                } else {
                    c.clone()
                };
                (name, color(i))
            })
            .collect()
    }

    /// Width of one panel, pixels.
    fn panel_width(&self) -> u32 {
        self.width / self.columns.max(1) as u32
    }

    fn size(&self) -> (u32, u32) {
        let rows = self.panels.len().max(1).div_ceil(self.columns.max(1)) as u32;
        let legend = legend_layout(&self.legend_items(), self.width).1;
        (self.width, 40 + legend + rows * self.panel_height)
    }
}

/// A rendered chart: the SVG text and the files written.
#[derive(Debug, Clone)]
pub(crate) struct Rendered {
    pub svg: String,
    pub svg_path: PathBuf,
    pub png_path: PathBuf,
}

/// Draw `fig` into `dir/stem.svg` and `dir/stem.png`.
pub(crate) fn render(fig: &Figure, dir: &Path, stem: &str) -> Result<Rendered, ReportError> {
    let svg_path = dir.join(format!("{stem}.svg"));
    let png_path = dir.join(format!("{stem}.png"));
    let chart_err = |file: &Path| {
        let file = file.to_path_buf();
        move |message: String| ReportError::Chart { file, message }
    };
    ensure_font().map_err(chart_err(&svg_path))?;
    let size = fig.size();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        draw(fig, &root).map_err(chart_err(&svg_path))?;
        root.present()
            .map_err(|e| e.to_string())
            .map_err(chart_err(&svg_path))?;
    }
    std::fs::write(&svg_path, &svg).map_err(|source| ReportError::Write {
        file: svg_path.clone(),
        source,
    })?;
    {
        let root = BitMapBackend::new(&png_path, size).into_drawing_area();
        draw(fig, &root).map_err(chart_err(&png_path))?;
        root.present()
            .map_err(|e| e.to_string())
            .map_err(chart_err(&png_path))?;
    }
    Ok(Rendered {
        svg,
        svg_path,
        png_path,
    })
}

pub(super) fn e2s<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> String {
    e.to_string()
}

fn draw<DB: DrawingBackend>(fig: &Figure, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
    root.fill(&WHITE).map_err(e2s)?;
    let body = root
        .margin(6, 0, 0, 0)
        .titled(&fig.title, (FAMILY, 24).into_font().color(&BLACK))
        .map_err(e2s)?;
    let legend = fig.legend_items();
    let (items, legend_h) = legend_layout(&legend, fig.width);
    let bars = fig.panels.iter().all(|p| matches!(p, Panel::Bars(_)));
    let body = if legend_h > 0 {
        let (top, rest) = body.split_vertically(legend_h);
        draw_shared_legend(&top, items, bars)?;
        rest
    } else {
        body
    };
    let cols = fig.columns.max(1);
    let rows = fig.panels.len().max(1).div_ceil(cols);
    let areas = body.split_evenly((rows, cols));
    let shared = !legend.is_empty();
    for (panel, area) in fig.panels.iter().zip(areas.iter()) {
        match panel {
            Panel::Lines(p) => lines::draw_lines(area, p, shared)?,
            Panel::Bars(p) => bars::draw_bars(area, p, shared)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::frame::{log_ticks, nice_ticks};
    use super::style::{DASHES, SPREAD_MARKERS, dash_of, palette_index, spread_marker_points};
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(nice_ticks(0.0, 1.0, 5), vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0]);
        assert_eq!(nice_max(0.75), 1.0);
        assert_eq!(nice_max(3.5), 4.0);
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(
            log_ticks(0.1, 10.0),
            vec![0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0]
        );
        assert!(log_ticks(1.0, 1.5).len() >= 2);
    }

    #[test]
    fn palette_is_stable_and_distinct() {
        let cs: Vec<RGBColor> = (0..40).map(color).collect();
        assert_eq!(cs[0], RGBColor(78, 121, 167));
        for (i, a) in cs.iter().enumerate().take(12) {
            assert!(cs[..i].iter().all(|b| b != a), "colour {i} repeats");
        }
    }

    #[test]
    fn dash_and_marker_follow_the_colour() {
        for (i, dash) in DASHES.iter().enumerate() {
            assert_eq!(palette_index(color(i)), i);
            assert_eq!(dash_of(color(i)), *dash);
        }
        assert_eq!(palette_index(color(40)), 40, "beyond Tableau 10 too");
        assert_eq!(palette_index(RGBColor(1, 2, 3)), 0, "not a palette colour");
        // Every dash pattern differs from the others, and each shows a gap within a legend
        // swatch (22 px), so the swatch tells them apart too.
        for (i, a) in DASHES.iter().enumerate() {
            assert!(DASHES[..i].iter().all(|b| b != a), "dash {i} repeats");
            if let Some((dash, gap)) = a {
                assert!(dash + gap < 22, "dash {i} looks solid in a swatch");
            }
        }
    }

    #[test]
    fn spread_markers_of_coinciding_series_fall_side_by_side() {
        // A step series from x = 0 to 12, value 3 then 5 from x = 6.
        let pts = [(0.0, 3.0), (6.0, 5.0), (12.0, 5.0)];
        let a = spread_marker_points(&pts, (0.0, 12.0), color(0), true);
        let b = spread_marker_points(&pts, (0.0, 12.0), color(1), true);
        assert_eq!(a.len(), SPREAD_MARKERS);
        assert_eq!(b.len(), SPREAD_MARKERS);
        for (p, q) in a.iter().zip(&b) {
            assert!(
                q.0 > p.0,
                "series 1's marker right of series 0's: {p:?} {q:?}"
            );
            for m in [p, q] {
                assert_eq!(
                    m.1,
                    if m.0 < 6.0 { 3.0 } else { 5.0 },
                    "on the line at {m:?}"
                );
            }
        }
        // No marker where the series has no value: before its first point, after its last.
        let short = [(4.0, 1.0), (8.0, 1.0)];
        let m = spread_marker_points(&short, (0.0, 12.0), color(0), true);
        assert!(
            !m.is_empty() && m.iter().all(|p| (4.0..=8.0).contains(&p.0)),
            "{m:?}"
        );
        // A plain line: markers sit on the segment between the neighbouring points.
        let line = [(0.0, 0.0), (12.0, 6.0)];
        let m = spread_marker_points(&line, (0.0, 12.0), color(2), false);
        assert!(!m.is_empty());
        for p in m {
            assert!((p.1 - p.0 / 2.0).abs() < 1e-12, "off the line: {p:?}");
        }
    }

    fn bars_of(names: &[&str]) -> Figure {
        Figure::new(
            "t",
            vec![Panel::Bars(BarPanel {
                title: String::new(),
                x_label: "policy".into(),
                y_label: "s".into(),
                categories: names.iter().map(|n| n.to_string()).collect(),
                groups: Vec::new(),
                y_percent: false,
                color_by_category: true,
            })],
        )
    }

    #[test]
    fn bars_coloured_by_policy_get_a_legend_of_full_names_numbered_when_they_do_not_fit() {
        let short = bars_of(&["p2c", "jsq"]);
        assert_eq!(
            short.legend_items(),
            vec![("p2c".to_string(), color(0)), ("jsq".to_string(), color(1))]
        );
        let long = [
            "seed-v1",
            "at-load/sed/capacity/weighted:24",
            "oracle/sed/capacity/weighted:24",
            "seed-next",
            "sticky-until-saturated",
        ];
        let fig = bars_of(&long);
        assert!(!names_fit(&fig_categories(&fig), fig.panel_width()));
        let items = fig.legend_items();
        assert_eq!(items.len(), long.len());
        for (k, (name, c)) in items.iter().enumerate() {
            assert_eq!(
                name,
                &format!("{} {}", k + 1, long[k]),
                "full name, numbered"
            );
            assert_eq!(*c, color(k));
        }
        // The legend takes room under the title, wrapped to the figure's width.
        assert!(fig.size().1 > short.size().1);
    }

    /// Issue 41: a figure's own legend (the capacity chart's: a curve panel and a bars panel)
    /// is numbered like the bars' ticks when their names do not fit; unnumbered when they do.
    #[test]
    fn a_figures_own_legend_is_numbered_like_the_bars_it_names() {
        let long = [
            "seed-v1",
            "at-load/sed/capacity/weighted:24",
            "oracle/sed/capacity/weighted:24",
            "seed-next",
            "sticky-until-saturated",
        ];
        for (names, numbered) in [(&long[..], true), (&["p2c", "jsq"][..], false)] {
            let mut fig = bars_of(names);
            fig.legend = names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.to_string(), color(i)))
                .collect();
            let items = fig.legend_items();
            for (k, (name, c)) in items.iter().enumerate() {
                let want = if numbered {
                    format!("{} {}", k + 1, names[k])
                } else {
                    names[k].to_string()
                };
                assert_eq!(name, &want);
                assert_eq!(*c, color(k));
            }
        }
    }

    fn fig_categories(fig: &Figure) -> Vec<String> {
        match &fig.panels[0] {
            Panel::Bars(p) => p.categories.clone(),
            Panel::Lines(_) => Vec::new(),
        }
    }

    #[test]
    fn cdf_ends_at_one_and_is_monotone() {
        let mut h = routelab_sim::histogram::Histogram::new();
        for v in [1.0, 2.0, 2.0, 3.5] {
            h.record_secs(v);
        }
        let pts = cdf_points(&h);
        assert_eq!(pts.first(), Some(&(1.0, 0.0)));
        assert_eq!(pts.last().map(|p| p.1), Some(1.0));
        assert_eq!(pts.last().map(|p| p.0), Some(3.5));
        assert!(pts.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
        assert!(cdf_points(&routelab_sim::histogram::Histogram::new()).is_empty());
    }
}
