//! Charts: a small, backend-independent description ([`Figure`]) drawn by the same code onto
//! plotters' SVG backend (kept as a string for inlining into HTML) and bitmap backend (PNG).
//!
//! Text is laid out with the bundled DejaVu Sans (registered once with plotters' `ab_glyph`
//! font table), so no system font library is needed and the output is identical everywhere.

use crate::error::ReportError;
use crate::num::{fmt_axis, round_sig};
use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";
/// Most legend entries drawn; more would hide the plot.
const MAX_LEGEND: usize = 12;

/// Register the bundled font under the default family (idempotent).
fn ensure_font() -> Result<(), String> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok()
            && plotters::style::register_font(FAMILY, FontStyle::Bold, FONT).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err("the bundled font DejaVuSans.ttf could not be loaded".into())
    }
}

/// Colour `i` of a fixed palette (Tableau 10, then golden-angle hues).
pub(crate) fn color(i: usize) -> RGBColor {
    const TAB10: [(u8, u8, u8); 10] = [
        (78, 121, 167),
        (242, 142, 43),
        (225, 87, 89),
        (118, 183, 178),
        (89, 161, 79),
        (237, 201, 72),
        (176, 122, 161),
        (255, 157, 167),
        (156, 117, 95),
        (186, 176, 172),
    ];
    if let Some(&(r, g, b)) = TAB10.get(i) {
        return RGBColor(r, g, b);
    }
    // Integer-only HSV → RGB so every platform gets the same bytes.
    let hue = ((i as u64 * 137) % 360) as u32;
    let (s, v) = (65u32, 80u32); // percent
    let c = v * s / 100; // chroma, percent of 255
    let hp = hue / 60;
    let x = c * (60 - ((hue % 120) as i32 - 60).unsigned_abs()) / 60;
    let (r, g, b) = match hp {
        0 => (c, x, 0),
        1 => (x, c, 0),
        2 => (0, c, x),
        3 => (0, x, c),
        4 => (x, 0, c),
        _ => (c, 0, x),
    };
    let m = v - c;
    let to = |p: u32| ((p + m) * 255 / 100) as u8;
    RGBColor(to(r), to(g), to(b))
}

/// Dash patterns (dash, gap in pixels; `None`: solid) that tell series apart where they overlap
/// and for readers who cannot tell the colours apart.
const DASHES: [Option<(u32, u32)>; 6] = [
    None,
    Some((12, 5)),
    Some((3, 4)),
    Some((7, 3)),
    Some((2, 7)),
    Some((16, 4)),
];

/// The dash pattern of a series of colour `c`: by the colour's place in the palette, so a line
/// and its legend entry (which carries only the name and colour) are drawn alike, however a
/// figure orders its series (a capacity knee shares its policy's colour and so its dashes).
fn dash_of(c: RGBColor) -> Option<(u32, u32)> {
    DASHES[palette_index(c) % DASHES.len()]
}

/// The colour's place in the palette ([`color`]); 0 for a colour not in its first 64.
fn palette_index(c: RGBColor) -> usize {
    const SEARCHED: usize = 64;
    (0..SEARCHED).find(|&i| color(i) == c).unwrap_or(0)
}

/// Marker shapes, one per series like [`DASHES`], so a line hidden under another (equal
/// weights, identical latency curves) still shows its markers.
const MARKERS: usize = 6;

/// Markers spread along a line panel's x axis when series may hide each other.
const SPREAD_MARKERS: usize = 6;

/// Draw the marker of colour `c` ([`palette_index`] picks the shape) at `at`, in whatever
/// coordinates `area` uses.
fn marker_at<DB: DrawingBackend, CT: CoordTranslate>(
    area: &DrawingArea<DB, CT>,
    at: CT::From,
    c: RGBColor,
) -> Result<(), String>
where
    CT::From: Clone,
{
    let e = EmptyElement::at(at);
    match palette_index(c) % MARKERS {
        0 => area.draw(&(e + Circle::new((0, 0), 4, c.filled()))),
        1 => area.draw(&(e + TriangleMarker::new((0, 0), 6, c.filled()))),
        2 => area.draw(&(e + Rectangle::new([(-4, -4), (4, 4)], c.filled()))),
        3 => area.draw(&(e + Cross::new((0, 0), 5, c.stroke_width(2)))),
        4 => area.draw(&(e + Circle::new((0, 0), 4, c.stroke_width(2)))),
        _ => area.draw(&(e + Rectangle::new([(-4, -4), (4, 4)], c.stroke_width(2)))),
    }
    .map_err(e2s)
}

/// Where to put a series' spread markers: [`SPREAD_MARKERS`] x positions across `[x0, x1]`,
/// offset by the series' place in the palette so the markers of coinciding series fall side by
/// side, each on the drawn line there (`pts` in axis coordinates: a step series holds the last
/// point at or before x, a plain line is interpolated between its neighbours; none before the
/// first point or after the last).
fn spread_marker_points(
    pts: &[(f64, f64)],
    (x0, x1): (f64, f64),
    c: RGBColor,
    step: bool,
) -> Vec<(f64, f64)> {
    let offset = ((palette_index(c) % MARKERS) as f64 + 0.5) / MARKERS as f64;
    let last_x = pts.last().map_or(f64::NEG_INFINITY, |p| p.0);
    (0..SPREAD_MARKERS)
        .filter_map(|j| {
            let x = x0 + (x1 - x0) * (j as f64 + offset) / SPREAD_MARKERS as f64;
            if x > last_x {
                return None;
            }
            let at = pts.partition_point(|p| p.0 <= x);
            let k = at.checked_sub(1)?;
            let (xa, ya) = pts[k];
            let y = match pts.get(k + 1) {
                Some(&(xb, yb)) if !step && xb > xa => ya + (yb - ya) * (x - xa) / (xb - xa),
                _ => ya,
            };
            Some((x, y))
        })
        .collect()
}

/// [`dash_of`] as a (dash, gap) pair for a path element: a solid line is one dash longer than
/// any swatch.
fn dash_pair(c: RGBColor) -> (u32, u32) {
    dash_of(c).unwrap_or((1000, 1))
}

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

fn e2s<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> String {
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
        for (x, y, name, c) in items {
            let c = *c;
            if bars {
                top.draw(&Rectangle::new([(x, y - 7), (x + 14, y + 7)], c.filled()))
                    .map_err(e2s)?;
            } else {
                let (dash, gap) = dash_pair(c);
                top.draw(&DashedPathElement::new(
                    vec![(x, y), (x + LEGEND_SWATCH - 6, y)],
                    dash,
                    gap,
                    c.stroke_width(3),
                ))
                .map_err(e2s)?;
                marker_at(&top, (x + (LEGEND_SWATCH - 6) / 2, y), c)?;
            }
            top.draw(&Text::new(
                name.clone(),
                (x + LEGEND_SWATCH, y),
                label_font().pos(Pos::new(HPos::Left, VPos::Center)),
            ))
            .map_err(e2s)?;
        }
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
            Panel::Lines(p) => draw_lines(area, p, shared)?,
            Panel::Bars(p) => draw_bars(area, p, shared)?,
        }
    }
    Ok(())
}

const LEGEND_SWATCH: i32 = 28;
const LEGEND_ROW: u32 = 24;

/// Positions (x, y of the swatch's centre line) of the shared legend's entries, wrapped to the
/// figure width, and the height it takes. Widths are estimated from the character count so the
/// layout is known before drawing.
fn legend_layout(
    items: &[(String, RGBColor)],
    width: u32,
) -> (Vec<(i32, i32, &String, &RGBColor)>, u32) {
    if items.is_empty() {
        return (Vec::new(), 0);
    }
    let (left, right) = (80i32, width as i32 - 20);
    let (mut x, mut row) = (left, 0i32);
    let mut out = Vec::new();
    for (name, c) in items {
        let w = LEGEND_SWATCH + name.chars().count() as i32 * 8 + 22;
        if x + w > right && x > left {
            x = left;
            row += 1;
        }
        out.push((x, row * LEGEND_ROW as i32 + LEGEND_ROW as i32 / 2, name, c));
        x += w;
    }
    let h = (row as u32 + 1) * LEGEND_ROW + 6;
    (out, h)
}

/// A linear f64 axis with caller-chosen tick positions (no light grid lines).
struct Axis {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
}

impl Axis {
    fn new(lo: f64, hi: f64, ticks: Vec<f64>) -> Axis {
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

fn nice_step(span: f64, target: usize) -> f64 {
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

fn message<DB: DrawingBackend>(
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

fn label_font() -> TextStyle<'static> {
    (FAMILY, 14).into_font().color(&RGBColor(40, 40, 40))
}

fn legend_position(l: Legend) -> Option<SeriesLabelPosition> {
    match l {
        Legend::None => None,
        Legend::UpperRight => Some(SeriesLabelPosition::UpperRight),
    }
}

fn fmt_y(v: f64, percent: bool) -> String {
    if percent {
        format!("{}%", fmt_axis(v * 100.0))
    } else {
        fmt_axis(v)
    }
}

/// Draw a panel of lines; its own legend only when the figure has no shared one.
fn draw_lines<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &LinePanel,
    shared_legend: bool,
) -> Result<(), String> {
    let usable = |(x, y): &(f64, f64)| {
        x.is_finite() && y.is_finite() && (!p.x_log || *x > 0.0) && (!p.y_log || *y > 0.0)
    };
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
        .filter(usable)
        .collect();
    if all.is_empty() {
        return message(area, &p.title, "no data");
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
    // x range and ticks (in axis space: log10 of the value on a log axis).
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
    let (ax0, ax1, xticks): (f64, f64, Vec<(f64, String)>) = if let Some(t) = &p.x_ticks {
        (x0, x1, t.clone())
    } else if p.x_log {
        let ticks = log_ticks(x0, x1);
        (
            x0.log10(),
            x1.log10(),
            ticks.iter().map(|v| (v.log10(), fmt_axis(*v))).collect(),
        )
    } else {
        let ticks = nice_ticks(x0, x1, 8);
        (x0, x1, ticks.iter().map(|v| (*v, fmt_axis(*v))).collect())
    };
    // y range and ticks, in axis space like x.
    let (y0, y1, yticks, ylabels): (f64, f64, Vec<f64>, Vec<(f64, String)>) = if p.y_log {
        let (lo, hi) = p.y_range.unwrap_or((dy0 / 1.5, dy1 * 1.5));
        let hi = if hi > lo { hi } else { lo * 10.0 };
        let ticks = log_ticks(lo, hi);
        let labels = ticks
            .iter()
            .map(|v| (v.log10(), fmt_y(*v, p.y_percent)))
            .collect();
        (
            lo.log10(),
            hi.log10(),
            ticks.iter().map(|v| v.log10()).collect(),
            labels,
        )
    } else {
        let (y0, y1) = p.y_range.unwrap_or_else(|| {
            let lo = if dy0 >= 0.0 { 0.0 } else { -nice_max(-dy0) };
            (lo, nice_max(dy1.max(lo + 1e-9)))
        });
        (y0, y1, nice_ticks(y0, y1, 6), Vec::new())
    };
    let xpos: Vec<f64> = xticks.iter().map(|t| t.0).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, (FAMILY, 19).into_font())
        .margin(8)
        .margin_right(24)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(Axis::new(ax0, ax1, xpos), Axis::new(y0, y1, yticks))
        .map_err(|e| e.to_string())?;
    let xfmt = |v: &f64| {
        xticks
            .iter()
            .find(|t| (t.0 - v).abs() <= 1e-9 * (1.0 + v.abs()))
            .map(|t| t.1.clone())
            .unwrap_or_default()
    };
    let yfmt = |v: &f64| {
        if p.y_log {
            ylabels
                .iter()
                .find(|t| (t.0 - v).abs() <= 1e-9 * (1.0 + v.abs()))
                .map(|t| t.1.clone())
                .unwrap_or_default()
        } else {
            fmt_y(*v, p.y_percent)
        }
    };
    chart
        .configure_mesh()
        .x_desc(&p.x_label)
        .y_desc(&p.y_label)
        .x_label_formatter(&xfmt)
        .y_label_formatter(&yfmt)
        .label_style(label_font())
        .axis_desc_style((FAMILY, 15).into_font())
        .bold_line_style(RGBColor(228, 228, 228))
        .axis_style(RGBColor(110, 110, 110))
        .draw()
        .map_err(e2s)?;
    let to_axis = |(x, y): (f64, f64)| {
        (
            if p.x_log { x.log10() } else { x },
            if p.y_log { y.log10() } else { y },
        )
    };
    // Bands under everything else: the upper edge forward, the lower one back.
    for b in &p.bands {
        let upper = b.points.iter().map(|&(x, _, h)| (x, h));
        let lower = b.points.iter().rev().map(|&(x, l, _)| (x, l));
        let poly: Vec<(f64, f64)> = upper.chain(lower).filter(usable).map(to_axis).collect();
        if poly.len() >= 3 {
            chart
                .draw_series(std::iter::once(Polygon::new(
                    poly,
                    b.color.mix(0.16).filled(),
                )))
                .map_err(e2s)?;
        }
    }
    for (y, label) in &p.reference_lines {
        if !usable(&(if p.x_log { 1.0 } else { 0.0 }, *y)) {
            continue;
        }
        let (_, ya) = to_axis((1.0, *y));
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
    for s in &p.series {
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(usable)
            .map(to_axis)
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
    }
    // Knees last, on top: a whisker over the interval and an outlined diamond, a shape no data
    // series uses.
    for k in &p.knees {
        if !usable(&(k.x, k.y)) {
            continue;
        }
        let at = to_axis((k.x, k.y));
        let ends: Vec<(f64, f64)> = [(k.x_low, k.y), (k.x_high, k.y)]
            .into_iter()
            .filter(usable)
            .map(to_axis)
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
    if let Some(pos) = legend_position(p.legend)
        && p.series.len() <= MAX_LEGEND
        && !shared_legend
    {
        chart
            .configure_series_labels()
            .position(pos)
            .margin(10)
            .label_font(label_font())
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(170, 170, 170))
            .draw()
            .map_err(e2s)?;
    }
    Ok(())
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// Estimated width of a tick label's character (the 14 px label font), pixels.
const LABEL_CHAR_PX: f64 = 7.5;

/// Pixels per category on a bar panel `panel_width` wide.
fn category_px(panel_width: u32, n: usize) -> f64 {
    (f64::from(panel_width) - 110.0).max(100.0) / n.max(1) as f64
}

/// Whether every category's full name fits under its bars.
fn names_fit(categories: &[String], panel_width: u32) -> bool {
    let per_cat = category_px(panel_width, categories.len());
    categories
        .iter()
        .all(|c| c.chars().count() as f64 * LABEL_CHAR_PX + 10.0 <= per_cat)
}

/// Draw a panel of bars; its own legend only when the figure has no shared one.
fn draw_bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &BarPanel,
    shared_legend: bool,
) -> Result<(), String> {
    let n = p.categories.len();
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
    if n == 0 || p.groups.is_empty() {
        return message(area, &p.title, "no data");
    }
    let y1 = if p.y_percent && ymax > 0.9 && ymax <= 1.0 {
        1.1 // room for the value labels above a bar near 100 %
    } else if p.y_percent && ymax <= 1.0 {
        nice_max(ymax).min(1.0)
    } else {
        nice_max(ymax)
    };
    let yticks = nice_ticks(0.0, y1.min(if p.y_percent { 1.0 } else { y1 }), 6);
    // Label every category whose name fits. Bars coloured by category (policies) that do not
    // all fit are numbered, and the shared legend gives each number's full name; otherwise
    // (workers) every k-th one is labelled in full (names cut short to a few letters say
    // nothing).
    let (w, _) = area.dim_in_pixel();
    let per_cat = category_px(w, n);
    let (xpos, labels): (Vec<f64>, Vec<String>) =
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
        };
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, (FAMILY, 19).into_font())
        .margin(8)
        .margin_right(24)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(
            Axis::new(-0.5, n as f64 - 0.5, xpos),
            Axis::new(0.0, y1, yticks),
        )
        .map_err(|e| e.to_string())?;
    let xfmt = |v: &f64| {
        let i = v.round();
        if (v - i).abs() < 1e-6 && i >= 0.0 {
            labels.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let yfmt = |v: &f64| fmt_y(*v, p.y_percent);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc(&p.x_label)
        .y_desc(&p.y_label)
        .x_label_formatter(&xfmt)
        .y_label_formatter(&yfmt)
        .label_style(label_font())
        .axis_desc_style((FAMILY, 15).into_font())
        .bold_line_style(RGBColor(228, 228, 228))
        .axis_style(RGBColor(110, 110, 110))
        .draw()
        .map_err(e2s)?;
    let g = p.groups.len();
    let bw = 0.8 / g as f64;
    let gap = bw * 0.06;
    let total_bars = n * g;
    let value_font = TextStyle::from((FAMILY, 12).into_font())
        .color(&RGBColor(50, 50, 50))
        .pos(Pos::new(HPos::Center, VPos::Bottom));
    for (j, grp) in p.groups.iter().enumerate() {
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
    }
    if !p.color_by_category && g <= MAX_LEGEND && !shared_legend {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .margin(10)
            .label_font(label_font())
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(170, 170, 170))
            .draw()
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

#[cfg(test)]
mod tests {
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
