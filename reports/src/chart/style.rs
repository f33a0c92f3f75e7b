//! The look every chart shares: the bundled font, the colour palette, and the dash pattern
//! and marker shape that follow a series' colour.

use super::e2s;
use plotters::prelude::*;
use std::sync::OnceLock;

pub(super) static FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");
pub(super) const FAMILY: &str = "sans-serif";

/// Register the bundled font under the default family (idempotent).
pub(super) fn ensure_font() -> Result<(), String> {
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
pub(super) const DASHES: [Option<(u32, u32)>; 6] = [
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
pub(super) fn dash_of(c: RGBColor) -> Option<(u32, u32)> {
    DASHES[palette_index(c) % DASHES.len()]
}

/// The colour's place in the palette ([`color`]); 0 for a colour not in its first 64.
pub(super) fn palette_index(c: RGBColor) -> usize {
    const SEARCHED: usize = 64;
    (0..SEARCHED).find(|&i| color(i) == c).unwrap_or(0)
}

/// Marker shapes, one per series like [`DASHES`], so a line hidden under another (equal
/// weights, identical latency curves) still shows its markers.
pub(super) const MARKERS: usize = 6;

/// Markers spread along a line panel's x axis when series may hide each other.
pub(super) const SPREAD_MARKERS: usize = 6;

/// Draw the marker of colour `c` ([`palette_index`] picks the shape) at `at`, in whatever
/// coordinates `area` uses.
pub(super) fn marker_at<DB: DrawingBackend, CT: CoordTranslate>(
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
pub(super) fn spread_marker_points(
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
pub(super) fn dash_pair(c: RGBColor) -> (u32, u32) {
    dash_of(c).unwrap_or((1000, 1))
}

pub(super) fn label_font() -> TextStyle<'static> {
    (FAMILY, 14).into_font().color(&RGBColor(40, 40, 40))
}
