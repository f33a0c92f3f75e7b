//! A panel's frame: its axes (caller-chosen ticks on a linear scale, log axes drawn in log10
//! space), the caption and mesh both panel kinds draw alike, and the "no data" message.

use super::e2s;
use super::style::{FAMILY, label_font};
use crate::num::{fmt_axis, round_sig};
use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// The coordinates a panel is drawn in.
pub(super) type PanelChart<'a, DB> = ChartContext<'a, DB, Cartesian2d<Axis, Axis>>;

/// A linear f64 axis with caller-chosen tick positions (no light grid lines).
pub(super) struct Axis {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
}

impl Axis {
    pub(super) fn new(lo: f64, hi: f64, ticks: Vec<f64>) -> Axis {
        let hi = if hi > lo { hi } else { lo + 1.0 };
        let ticks = ticks
            .into_iter()
            .filter(|t| *t >= lo - (hi - lo) * 1e-9 && *t <= hi + (hi - lo) * 1e-9)
            .collect();
        Axis { lo, hi, ticks }
    }
}

impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let f = (v - self.lo) / (self.hi - self.lo);
        let len = f64::from(limit.1 - limit.0);
        limit.0 + (len * f).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

/// About `target` round ticks covering `[lo, hi]`.
pub(crate) fn nice_ticks(lo: f64, hi: f64, target: usize) -> Vec<f64> {
    let step = nice_step(hi - lo, target);
    let mut out = Vec::new();
    let mut k = (lo / step - 1e-9).ceil() as i64;
    loop {
        let v = k as f64 * step;
        if v > hi + step * 1e-9 || out.len() > 100 {
            break;
        }
        out.push(if v.abs() < step * 1e-9 {
            0.0
        } else {
            round_sig(v, 12).unwrap_or(v)
        });
        k += 1;
    }
    out
}

pub(super) fn nice_step(span: f64, target: usize) -> f64 {
    let raw = (span / target.max(1) as f64).max(1e-12);
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nf = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nf * mag
}

/// Round upper bound for an axis starting at 0 that shows `max` with a little headroom.
pub(crate) fn nice_max(max: f64) -> f64 {
    if max.is_nan() || max <= 0.0 {
        return 1.0;
    }
    let step = nice_step(max * 1.08, 5);
    let v = (max * 1.08 / step).ceil() * step;
    round_sig(v, 12).unwrap_or(v)
}

/// Ticks at 1, 2, 5 × 10^k within `[lo, hi]` (lo > 0).
pub(crate) fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut sets: Vec<&[f64]> = vec![&[1.0, 2.0, 5.0], &[1.0, 2.0, 3.0, 5.0, 7.0]];
    if (hi / lo).log10() > 5.0 {
        sets.insert(0, &[1.0]);
    }
    let mut best = Vec::new();
    for mult in sets {
        let mut out = Vec::new();
        let (k0, k1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
        for k in k0..=k1 {
            for m in mult {
                let v = m * 10f64.powi(k);
                let v = round_sig(v, 12).unwrap_or(v);
                if v >= lo * (1.0 - 1e-9) && v <= hi * (1.0 + 1e-9) {
                    out.push(v);
                }
            }
        }
        best = out;
        if best.len() >= 4 {
            break;
        }
    }
    if best.len() < 2 {
        return nice_ticks(lo, hi, 5)
            .into_iter()
            .filter(|v| *v > 0.0)
            .collect();
    }
    best
}

/// The chart of a panel titled `title` on `area`, with the margins and label areas every panel
/// has.
pub(super) fn panel_chart<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    title: &str,
    x: Axis,
    y: Axis,
) -> Result<PanelChart<'a, DB>, String> {
    ChartBuilder::on(area)
        .caption(title, (FAMILY, 19).into_font())
        .margin(8)
        .margin_right(24)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x, y)
        .map_err(|e| e.to_string())
}

/// Draw a panel's axes, their descriptions and the grid (vertical lines only when `x_mesh`).
pub(super) fn draw_mesh<DB: DrawingBackend>(
    chart: &mut PanelChart<'_, DB>,
    (x_desc, y_desc): (&str, &str),
    xfmt: &dyn Fn(&f64) -> String,
    yfmt: &dyn Fn(&f64) -> String,
    x_mesh: bool,
) -> Result<(), String> {
    let mut mesh = chart.configure_mesh();
    if !x_mesh {
        mesh.disable_x_mesh();
    }
    mesh.x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(xfmt)
        .y_label_formatter(yfmt)
        .label_style(label_font())
        .axis_desc_style((FAMILY, 15).into_font())
        .bold_line_style(RGBColor(228, 228, 228))
        .axis_style(RGBColor(110, 110, 110))
        .draw()
        .map_err(e2s)
}

pub(super) fn message<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    text: &str,
) -> Result<(), String> {
    let (w, h) = area.dim_in_pixel();
    let style = TextStyle::from((FAMILY, 18).into_font())
        .color(&RGBColor(90, 90, 90))
        .pos(Pos::new(HPos::Center, VPos::Center));
    area.draw(&Text::new(
        title.to_string(),
        (w as i32 / 2, 24),
        TextStyle::from((FAMILY, 20).into_font()).pos(Pos::new(HPos::Center, VPos::Center)),
    ))
    .map_err(e2s)?;
    area.draw(&Text::new(
        text.to_string(),
        (w as i32 / 2, h as i32 / 2),
        style,
    ))
    .map_err(e2s)
}

pub(super) fn fmt_y(v: f64, percent: bool) -> String {
    if percent {
        format!("{}%", fmt_axis(v * 100.0))
    } else {
        fmt_axis(v)
    }
}
