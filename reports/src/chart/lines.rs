//! Panels of lines: series (plain or held as steps), shaded bands under them, reference lines
//! across, and knees (a marked point with its interval) on top.

use super::e2s;
use super::frame::{
    Axis, PanelChart, draw_mesh, fmt_y, log_ticks, message, nice_max, nice_ticks, panel_chart,
};
use super::legend::{MAX_LEGEND, draw_panel_legend, legend_position};
use super::style::{dash_of, dash_pair, label_font, marker_at, spread_marker_points};
use super::{LinePanel, Series};
use crate::num::fmt_axis;
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

impl LinePanel {
    /// Whether a point can be drawn: finite, and positive on a log axis.
    fn usable(&self, &(x, y): &(f64, f64)) -> bool {
        x.is_finite() && y.is_finite() && (!self.x_log || x > 0.0) && (!self.y_log || y > 0.0)
    }

    /// A point in axis space: log10 of the value on a log axis.
    fn to_axis(&self, (x, y): (f64, f64)) -> (f64, f64) {
        (
            if self.x_log { x.log10() } else { x },
            if self.y_log { y.log10() } else { y },
        )
    }
}

/// Tick positions with their labels.
type TickLabels = Vec<(f64, String)>;

/// A line panel's axes in axis space (log10 of the value on a log axis).
struct LineAxes {
    x: (f64, f64),
    /// The x ticks and their labels.
    x_ticks: TickLabels,
    y: (f64, f64),
    y_ticks: Vec<f64>,
    /// The labels of the y ticks on a log axis (a linear one formats its ticks as they come).
    y_labels: TickLabels,
}

/// The axes that show every drawable point of the panel (its series, bands and knees), unless
/// it fixes a range or its ticks; `None` when nothing can be drawn.
fn line_axes(p: &LinePanel) -> Option<LineAxes> {
    let all: Vec<(f64, f64)> = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .chain(
            p.bands
                .iter()
                .flat_map(|b| b.points.iter().flat_map(|&(x, l, h)| [(x, l), (x, h)])),
        )
        .chain(
            p.knees
                .iter()
                .flat_map(|k| [(k.x_low, k.y), (k.x_high, k.y), (k.x, k.y)]),
        )
        .filter(|pt| p.usable(pt))
        .collect();
    if all.is_empty() {
        return None;
    }
    let (dx0, dx1) = all
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), (x, _)| {
            (a.min(*x), b.max(*x))
        });
    let (dy0, dy1) = all
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), (_, y)| {
            (a.min(*y), b.max(*y))
        });
    let (x, x_ticks) = x_axis(p, (dx0, dx1));
    let (y, y_ticks, y_labels) = y_axis(p, (dy0, dy1));
    Some(LineAxes {
        x,
        x_ticks,
        y,
        y_ticks,
        y_labels,
    })
}

/// The x range and ticks (in axis space) for data spanning `dx0..=dx1`.
fn x_axis(p: &LinePanel, (dx0, dx1): (f64, f64)) -> ((f64, f64), TickLabels) {
    let (x0, x1) = p.x_range.unwrap_or(if p.x_log {
        (dx0 / 1.2, dx1 * 1.2)
    } else if dx1 > dx0 && p.markers {
        let pad = (dx1 - dx0) * 0.04;
        (dx0 - pad, dx1 + pad)
    } else if dx1 > dx0 {
        (dx0, dx1)
    } else {
        (dx0 - 0.5, dx1 + 0.5)
    });
    if let Some(t) = &p.x_ticks {
        ((x0, x1), t.clone())
    } else if p.x_log {
        let ticks = log_ticks(x0, x1);
        (
            (x0.log10(), x1.log10()),
            ticks.iter().map(|v| (v.log10(), fmt_axis(*v))).collect(),
        )
    } else {
        let ticks = nice_ticks(x0, x1, 8);
        ((x0, x1), ticks.iter().map(|v| (*v, fmt_axis(*v))).collect())
    }
}

/// The y range, ticks and (on a log axis) tick labels, in axis space, for data spanning
/// `dy0..=dy1`.
fn y_axis(p: &LinePanel, (dy0, dy1): (f64, f64)) -> ((f64, f64), Vec<f64>, TickLabels) {
    if p.y_log {
        let (lo, hi) = p.y_range.unwrap_or((dy0 / 1.5, dy1 * 1.5));
        let hi = if hi > lo { hi } else { lo * 10.0 };
        let ticks = log_ticks(lo, hi);
        let labels = ticks
            .iter()
            .map(|v| (v.log10(), fmt_y(*v, p.y_percent)))
            .collect();
        (
            (lo.log10(), hi.log10()),
            ticks.iter().map(|v| v.log10()).collect(),
            labels,
        )
    } else {
        let (y0, y1) = p.y_range.unwrap_or_else(|| {
            let lo = if dy0 >= 0.0 { 0.0 } else { -nice_max(-dy0) };
            (lo, nice_max(dy1.max(lo + 1e-9)))
        });
        ((y0, y1), nice_ticks(y0, y1, 6), Vec::new())
    }
}

/// The label of the tick at `v` (none between ticks).
fn tick_label(ticks: &[(f64, String)], v: f64) -> String {
    ticks
        .iter()
        .find(|t| (t.0 - v).abs() <= 1e-9 * (1.0 + v.abs()))
        .map(|t| t.1.clone())
        .unwrap_or_default()
}

/// Draw a panel of lines; its own legend only when the figure has no shared one.
pub(super) fn draw_lines<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &LinePanel,
    shared_legend: bool,
) -> Result<(), String> {
    let Some(LineAxes {
        x: (ax0, ax1),
        x_ticks,
        y: (y0, y1),
        y_ticks,
        y_labels,
    }) = line_axes(p)
    else {
        return message(area, &p.title, "no data");
    };
    let xpos: Vec<f64> = x_ticks.iter().map(|t| t.0).collect();
    let mut chart = panel_chart(
        area,
        &p.title,
        Axis::new(ax0, ax1, xpos),
        Axis::new(y0, y1, y_ticks),
    )?;
    let xfmt = |v: &f64| tick_label(&x_ticks, *v);
    let yfmt = |v: &f64| {
        if p.y_log {
            tick_label(&y_labels, *v)
        } else {
            fmt_y(*v, p.y_percent)
        }
    };
    draw_mesh(&mut chart, (&p.x_label, &p.y_label), &xfmt, &yfmt, true)?;
    draw_bands(&mut chart, p)?;
    draw_reference_lines(&mut chart, p, (ax0, ax1))?;
    for s in &p.series {
        draw_series(&mut chart, p, s, (ax0, ax1))?;
    }
    draw_knees(&mut chart, p)?;
    if let Some(pos) = legend_position(p.legend)
        && p.series.len() <= MAX_LEGEND
        && !shared_legend
    {
        draw_panel_legend(&mut chart, pos)?;
    }
    Ok(())
}

/// Bands under everything else: the upper edge forward, the lower one back.
fn draw_bands<DB: DrawingBackend>(
    chart: &mut PanelChart<'_, DB>,
    p: &LinePanel,
) -> Result<(), String> {
    for b in &p.bands {
        let upper = b.points.iter().map(|&(x, _, h)| (x, h));
        let lower = b.points.iter().rev().map(|&(x, l, _)| (x, l));
        let poly: Vec<(f64, f64)> = upper
            .chain(lower)
            .filter(|pt| p.usable(pt))
            .map(|pt| p.to_axis(pt))
            .collect();
        if poly.len() >= 3 {
            chart
                .draw_series(std::iter::once(Polygon::new(
                    poly,
                    b.color.mix(0.16).filled(),
                )))
                .map_err(e2s)?;
        }
    }
    Ok(())
}

/// The panel's reference lines: dashed across the x range `ax0..ax1`, labelled at the left.
fn draw_reference_lines<DB: DrawingBackend>(
    chart: &mut PanelChart<'_, DB>,
    p: &LinePanel,
    (ax0, ax1): (f64, f64),
) -> Result<(), String> {
    for (y, label) in &p.reference_lines {
        if !p.usable(&(if p.x_log { 1.0 } else { 0.0 }, *y)) {
            continue;
        }
        let (_, ya) = p.to_axis((1.0, *y));
        chart
            .draw_series(DashedLineSeries::new(
                vec![(ax0, ya), (ax1, ya)],
                10,
                6,
                BLACK.stroke_width(2),
            ))
            .map_err(e2s)?;
        chart
            .plotting_area()
            .draw(&Text::new(
                label.clone(),
                (ax0 + (ax1 - ax0) * 0.01, ya),
                label_font().pos(Pos::new(HPos::Left, VPos::Bottom)),
            ))
            .map_err(e2s)?;
    }
    Ok(())
}

/// One series: its line in its colour's dash pattern, its legend entry, and its markers.
fn draw_series<DB: DrawingBackend>(
    chart: &mut PanelChart<'_, DB>,
    p: &LinePanel,
    s: &Series,
    (ax0, ax1): (f64, f64),
) -> Result<(), String> {
    let pts: Vec<(f64, f64)> = s
        .points
        .iter()
        .copied()
        .filter(|pt| p.usable(pt))
        .map(|pt| p.to_axis(pt))
        .collect();
    let c = s.color;
    let line: Vec<(f64, f64)> = if p.step {
        let mut out = Vec::with_capacity(pts.len() * 2);
        for (i, &(x, y)) in pts.iter().enumerate() {
            if i > 0 {
                out.push((x, pts[i - 1].1));
            }
            out.push((x, y));
        }
        out
    } else {
        pts.clone()
    };
    let series = match dash_of(c) {
        None => chart
            .draw_series(LineSeries::new(line, c.stroke_width(2)))
            .map_err(e2s)?,
        Some((dash, gap)) => chart
            .draw_series(DashedLineSeries::new(line, dash, gap, c.stroke_width(2)))
            .map_err(e2s)?,
    };
    let (dash, gap) = dash_pair(c);
    series.label(s.name.clone()).legend(move |(x, y)| {
        DashedPathElement::new(vec![(x, y), (x + 22, y)], dash, gap, c.stroke_width(3))
    });
    // Markers in the series' own shape: at every point when the panel asks, else spread
    // along the axis when there is another series it could hide under.
    let marks = if p.markers {
        pts.clone()
    } else if p.series.len() > 1 {
        spread_marker_points(&pts, (ax0, ax1), c, p.step)
    } else {
        Vec::new()
    };
    for pt in marks {
        marker_at(chart.plotting_area(), pt, c)?;
    }
    Ok(())
}

/// Knees last, on top: a whisker over the interval and an outlined diamond, a shape no data
/// series uses.
fn draw_knees<DB: DrawingBackend>(
    chart: &mut PanelChart<'_, DB>,
    p: &LinePanel,
) -> Result<(), String> {
    for k in &p.knees {
        if !p.usable(&(k.x, k.y)) {
            continue;
        }
        let at = p.to_axis((k.x, k.y));
        let ends: Vec<(f64, f64)> = [(k.x_low, k.y), (k.x_high, k.y)]
            .into_iter()
            .filter(|pt| p.usable(pt))
            .map(|pt| p.to_axis(pt))
            .collect();
        if ends.len() == 2 && ends[0] != ends[1] {
            chart
                .draw_series(LineSeries::new(ends.clone(), k.color.stroke_width(4)))
                .map_err(e2s)?;
            for end in ends {
                chart
                    .plotting_area()
                    .draw(
                        &(EmptyElement::at(end)
                            + PathElement::new(vec![(0, -7), (0, 7)], k.color.stroke_width(3))),
                    )
                    .map_err(e2s)?;
            }
        }
        let diamond = vec![(0, -10), (10, 0), (0, 10), (-10, 0)];
        chart
            .plotting_area()
            .draw(
                &(EmptyElement::at(at)
                    + Polygon::new(diamond.clone(), k.color.filled())
                    + PathElement::new(
                        diamond
                            .iter()
                            .chain(diamond.first())
                            .copied()
                            .collect::<Vec<_>>(),
                        BLACK.stroke_width(2),
                    )),
            )
            .map_err(e2s)?;
    }
    Ok(())
}

/// Step points of the empirical CDF of a histogram of nanosecond values, in seconds: for each
/// non-empty bucket the fraction of values up to its upper edge (clamped to the observed
/// maximum), starting at (min, 0).
pub(crate) fn cdf_points(h: &routelab_sim::histogram::Histogram) -> Vec<(f64, f64)> {
    let (Some(min), Some(max)) = (h.min(), h.max()) else {
        return Vec::new();
    };
    let n = h.count() as f64;
    let s = |ns: u64| ns as f64 / 1e9;
    let mut pts = vec![(s(min), 0.0)];
    let mut seen = 0u64;
    for (lo, hi, c) in h.buckets() {
        let lo = lo.clamp(min, max);
        let hi = hi.clamp(min, max);
        let before = seen as f64 / n;
        seen += c;
        pts.push((s(lo), before));
        pts.push((s(hi), seen as f64 / n));
    }
    pts
}
