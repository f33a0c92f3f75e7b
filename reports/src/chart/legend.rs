//! Legends: the one a figure shares across its panels (rows under the title, laid out before
//! drawing) and the box a panel draws for its own series.

use super::Legend;
use super::e2s;
use super::frame::PanelChart;
use super::style::{dash_pair, label_font, marker_at};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Most legend entries drawn; more would hide the plot.
pub(super) const MAX_LEGEND: usize = 12;
const LEGEND_SWATCH: i32 = 28;
const LEGEND_ROW: u32 = 24;

/// Positions (x, y of the swatch's centre line) of the shared legend's entries, wrapped to the
/// figure width, and the height it takes. Widths are estimated from the character count so the
/// layout is known before drawing.
pub(super) fn legend_layout(
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

/// Draw the shared legend's laid-out `items` into `top`: a filled square per entry on a figure
/// of bars, else the series' dashed line and marker.
pub(super) fn draw_shared_legend<DB: DrawingBackend>(
    top: &DrawingArea<DB, Shift>,
    items: Vec<(i32, i32, &String, &RGBColor)>,
    bars: bool,
) -> Result<(), String> {
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
            marker_at(top, (x + (LEGEND_SWATCH - 6) / 2, y), c)?;
        }
        top.draw(&Text::new(
            name.clone(),
            (x + LEGEND_SWATCH, y),
            label_font().pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(e2s)?;
    }
    Ok(())
}

pub(super) fn legend_position(l: Legend) -> Option<SeriesLabelPosition> {
    match l {
        Legend::None => None,
        Legend::UpperRight => Some(SeriesLabelPosition::UpperRight),
    }
}

/// Draw a panel's own legend box at `pos`.
pub(super) fn draw_panel_legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut PanelChart<'a, DB>,
    pos: SeriesLabelPosition,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(pos)
        .margin(10)
        .label_font(label_font())
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(170, 170, 170))
        .draw()
        .map_err(e2s)
}
