//! Panels of grouped bars: a bar per group and category, with error bars and value labels,
//! and category names that are shortened, thinned out or numbered to fit.

use super::e2s;
use super::frame::{
    Axis, PanelChart, draw_mesh, fmt_y, message, nice_max, nice_ticks, panel_chart,
};
use super::legend::{MAX_LEGEND, draw_panel_legend};
use super::style::{FAMILY, color};
use super::{BarGroup, BarPanel};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

pub(super) fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// Estimated width of a tick label's character (the 14 px label font), pixels.
pub(super) const LABEL_CHAR_PX: f64 = 7.5;

/// Pixels per category on a bar panel `panel_width` wide.
pub(super) fn category_px(panel_width: u32, n: usize) -> f64 {
    (f64::from(panel_width) - 110.0).max(100.0) / n.max(1) as f64
}

/// Whether every category's full name fits under its bars.
pub(super) fn names_fit(categories: &[String], panel_width: u32) -> bool {
    let per_cat = category_px(panel_width, categories.len());
    categories
        .iter()
        .all(|c| c.chars().count() as f64 * LABEL_CHAR_PX + 10.0 <= per_cat)
}

/// Top of a bar panel's y axis: the highest bar or error bar, with headroom (a share stops at
/// 100 %, with room for the value labels above a bar near it).
fn bar_y_top(p: &BarPanel) -> f64 {
    let ymax = p
        .groups
        .iter()
        .flat_map(|g| {
            g.values
                .iter()
                .zip(&g.errors)
                .map(|(v, e)| e.map(|e| e.1).or(*v).unwrap_or(0.0))
        })
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    if p.y_percent && ymax > 0.9 && ymax <= 1.0 {
        1.1 // room for the value labels above a bar near 100 %
    } else if p.y_percent && ymax <= 1.0 {
        nice_max(ymax).min(1.0)
    } else {
        nice_max(ymax)
    }
}

/// The labelled categories' positions and the labels of a bar panel `w` pixels wide. Every
/// category whose name fits is labelled. Bars coloured by category (policies) that do not all
/// fit are numbered, and the shared legend gives each number's full name; otherwise (workers)
/// every k-th one is labelled in full (names cut short to a few letters say nothing).
fn category_ticks(p: &BarPanel, w: u32) -> (Vec<f64>, Vec<String>) {
    let n = p.categories.len();
    let per_cat = category_px(w, n);
    if p.color_by_category && !names_fit(&p.categories, w) {
        (
            (0..n).map(|i| i as f64).collect(),
            (1..=n).map(|i| i.to_string()).collect(),
        )
    } else {
        let longest = p
            .categories
            .iter()
            .map(|c| c.chars().count())
            .max()
            .unwrap_or(1);
        let needed = (longest.min(24) as f64 * LABEL_CHAR_PX + 10.0).max(1.0);
        let every = ((needed / per_cat).ceil() as usize).max(1);
        let max_chars = ((per_cat * every as f64 - 10.0) / LABEL_CHAR_PX).max(6.0) as usize;
        (
            (0..n).step_by(every).map(|i| i as f64).collect(),
            p.categories
                .iter()
                .map(|c| truncate(c, max_chars))
                .collect(),
        )
    }
}

/// Draw a panel of bars; its own legend only when the figure has no shared one.
pub(super) fn draw_bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &BarPanel,
    shared_legend: bool,
) -> Result<(), String> {
    let n = p.categories.len();
    if n == 0 || p.groups.is_empty() {
        return message(area, &p.title, "no data");
    }
    let y1 = bar_y_top(p);
    let yticks = nice_ticks(0.0, y1.min(if p.y_percent { 1.0 } else { y1 }), 6);
    let (w, _) = area.dim_in_pixel();
    let (xpos, labels) = category_ticks(p, w);
    let mut chart = panel_chart(
        area,
        &p.title,
        Axis::new(-0.5, n as f64 - 0.5, xpos),
        Axis::new(0.0, y1, yticks),
    )?;
    let xfmt = |v: &f64| {
        let i = v.round();
        if (v - i).abs() < 1e-6 && i >= 0.0 {
            labels.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let yfmt = |v: &f64| fmt_y(*v, p.y_percent);
    draw_mesh(&mut chart, (&p.x_label, &p.y_label), &xfmt, &yfmt, false)?;
    for (j, grp) in p.groups.iter().enumerate() {
        draw_bar_group(&mut chart, p, (j, grp), y1)?;
    }
    if !p.color_by_category && p.groups.len() <= MAX_LEGEND && !shared_legend {
        draw_panel_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    }
    Ok(())
}

/// The bars of group `j` (the `j`-th of each category's bars), their error bars and, when the
/// panel has few bars, their values above them (`y1`: the axis' top); the group's legend entry
/// unless bars are coloured by category.
fn draw_bar_group<DB: DrawingBackend>(
    chart: &mut PanelChart<'_, DB>,
    p: &BarPanel,
    (j, grp): (usize, &BarGroup),
    y1: f64,
) -> Result<(), String> {
    let g = p.groups.len();
    let bw = 0.8 / g as f64;
    let gap = bw * 0.06;
    let total_bars = p.categories.len() * g;
    let value_font = TextStyle::from((FAMILY, 12).into_font())
        .color(&RGBColor(50, 50, 50))
        .pos(Pos::new(HPos::Center, VPos::Bottom));
    let gc = grp.color;
    let mut rects = Vec::new();
    let mut errs = Vec::new();
    let mut texts = Vec::new();
    for (i, v) in grp.values.iter().enumerate() {
        let Some(v) = v.filter(|v| v.is_finite()) else {
            continue;
        };
        let c = if p.color_by_category { color(i) } else { gc };
        let x0 = i as f64 - 0.4 + j as f64 * bw;
        rects.push(Rectangle::new(
            [(x0 + gap, 0.0), (x0 + bw - gap, v)],
            c.filled(),
        ));
        let mid = x0 + bw / 2.0;
        let mut top = v;
        if let Some(Some((lo, hi))) = grp.errors.get(i) {
            let cap = bw * 0.12;
            let style = RGBColor(30, 30, 30).stroke_width(2);
            errs.push(PathElement::new(vec![(mid, *lo), (mid, *hi)], style));
            errs.push(PathElement::new(
                vec![(mid - cap, *lo), (mid + cap, *lo)],
                style,
            ));
            errs.push(PathElement::new(
                vec![(mid - cap, *hi), (mid + cap, *hi)],
                style,
            ));
            top = top.max(*hi);
        }
        if total_bars <= 24 {
            texts.push(Text::new(
                fmt_y(v, p.y_percent),
                (mid, top + y1 * 0.015),
                value_font.clone(),
            ));
        }
    }
    let series = chart.draw_series(rects).map_err(e2s)?;
    if !p.color_by_category {
        series
            .label(grp.name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], gc.filled()));
    }
    chart.draw_series(errs).map_err(e2s)?;
    chart.draw_series(texts).map_err(e2s)?;
    Ok(())
}
