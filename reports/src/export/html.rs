//! Self-contained HTML: inline CSS, inline SVG, no scripts, no external resources.

use super::Exporter;
use crate::gate::{GateReport, Verdict, fmt_delta, fmt6};
use std::fmt::Write as _;
use std::io;

/// Escape text for HTML element content and attribute values.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

const CSS: &str = "\
body{font-family:'DejaVu Sans',Verdana,Arial,sans-serif;margin:24px auto;max-width:1240px;\
padding:0 16px;color:#222;line-height:1.4}\
h1{font-size:1.6em;margin-bottom:.2em}h2{margin-top:1.6em;border-bottom:1px solid #ddd}\
.desc{font-size:1.1em;color:#444}.meta,.note{color:#666;font-size:.9em}\
.lead{font-size:1.1em;margin:.8em 0;padding:.5em .8em;border-left:4px solid #4e79a7;\
background:#f4f7fa}\
.scroll{overflow-x:auto}\
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}\
th,td{border:1px solid #d6d6d6;padding:3px 8px;text-align:right;white-space:nowrap}\
th{background:#f2f2f2;white-space:normal;vertical-align:bottom}\
td.l,th.l{text-align:left}td.l{white-space:normal;overflow-wrap:anywhere}\
td.best{background:#d9f2d9;font-weight:bold}\
tr.group td{border-top:2px solid #999}\
figure{margin:1.2em 0}figcaption{color:#555;font-size:.9em}\
svg{max-width:100%;height:auto;display:block}\
code{background:#f4f4f4;padding:0 3px}";

/// An HTML page being built.
pub(crate) struct Page {
    body: String,
    title: String,
}

impl Page {
    pub fn new(title: &str) -> Page {
        Page {
            body: String::new(),
            title: title.to_string(),
        }
    }

    /// Raw (already escaped) HTML.
    pub fn raw(&mut self, html: &str) {
        self.body.push_str(html);
        self.body.push('\n');
    }

    /// `<tag>text</tag>` with escaping; `class` optional.
    pub fn el(&mut self, tag: &str, class: Option<&str>, text: &str) {
        match class {
            Some(c) => {
                let _ = writeln!(self.body, "<{tag} class=\"{c}\">{}</{tag}>", esc(text));
            }
            None => {
                let _ = writeln!(self.body, "<{tag}>{}</{tag}>", esc(text));
            }
        }
    }

    /// An inline chart with a caption.
    pub fn figure(&mut self, svg: &str, caption: &str) {
        let _ = writeln!(
            self.body,
            "<figure>\n{}\n<figcaption>{}</figcaption>\n</figure>",
            inline_svg(svg),
            esc(caption)
        );
    }

    pub fn finish(self) -> String {
        format!(
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
             <title>{}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{}</body>\n</html>\n",
            esc(&self.title),
            self.body
        )
    }
}

/// Prepare plotters' SVG for inlining: HTML5 needs neither the XML namespace attribute nor a
/// prolog (and the page then holds no URL at all).
pub(crate) fn inline_svg(svg: &str) -> String {
    let s = svg.trim();
    let s = match s.find("<svg") {
        Some(i) => &s[i..],
        None => s,
    };
    s.replacen(" xmlns=\"http://www.w3.org/2000/svg\"", "", 1)
}

/// A table cell.
#[derive(Debug, Clone)]
pub(crate) struct Cell {
    pub text: String,
    pub left: bool,
    pub best: bool,
    pub title: Option<String>,
}

impl Cell {
    pub fn text(s: impl Into<String>) -> Cell {
        Cell {
            text: s.into(),
            left: true,
            best: false,
            title: None,
        }
    }

    pub fn num(s: impl Into<String>) -> Cell {
        Cell {
            left: false,
            ..Cell::text(s)
        }
    }

    pub fn best(mut self, best: bool) -> Cell {
        self.best = best;
        self
    }

    pub fn titled(mut self, title: impl Into<String>) -> Cell {
        self.title = Some(title.into());
        self
    }
}

/// A table; rows whose first element is `true` start a visual group.
pub(crate) fn table(header: &[(&str, bool)], rows: &[(bool, Vec<Cell>)]) -> String {
    let mut s = String::from("<div class=\"scroll\"><table>\n<thead><tr>");
    for (h, left) in header {
        let _ = write!(
            s,
            "<th{}>{}</th>",
            if *left { " class=\"l\"" } else { "" },
            esc(h)
        );
    }
    s.push_str("</tr></thead>\n<tbody>\n");
    for (group, cells) in rows {
        s.push_str(if *group {
            "<tr class=\"group\">"
        } else {
            "<tr>"
        });
        for c in cells {
            let mut classes = Vec::new();
            if c.left {
                classes.push("l");
            }
            if c.best {
                classes.push("best");
            }
            s.push_str("<td");
            if !classes.is_empty() {
                let _ = write!(s, " class=\"{}\"", classes.join(" "));
            }
            if let Some(t) = &c.title {
                let _ = write!(s, " title=\"{}\"", esc(t));
            }
            let _ = write!(s, ">{}</td>", esc(&c.text));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</tbody></table></div>");
    s
}

/// The widest a table may be estimated to render (CSS px) before [`split_table`] splits it:
/// the page's content width (`max-width:1240px` in [`CSS`]) less a margin for the estimate's
/// error.
const TABLE_BUDGET_PX: usize = 1180;

/// Estimated rendered width (CSS px) of a column at its natural (max-content) width: its
/// header and its longest cell on one line, text cells (policy names) counted up to 40
/// characters (beyond that they wrap). A browser lays a table out at those widths when they
/// fit and squeezes the wrappable columns first when they do not, so the estimate is of the
/// unwrapped widths, measured on DejaVu Sans at the tables' 0.9em (14.4 px): a digit is
/// 0.636 em (9.2 px), other characters about 7.6 px, 8.2 px in the bold header.
fn column_px(header: &str, cells: &[&Cell]) -> usize {
    const PADDING_PX: f64 = 18.0;
    let px = |text: &str, other: f64| -> f64 {
        text.chars()
            .map(|c| if c.is_ascii_digit() { 9.2 } else { other })
            .sum()
    };
    let head = px(header, 8.2);
    let body = cells
        .iter()
        .map(|c| {
            let text: String = if c.left {
                c.text.chars().take(40).collect()
            } else {
                c.text.clone()
            };
            px(&text, 7.6)
        })
        .fold(0.0, f64::max);
    (head.max(body) + PADDING_PX).ceil() as usize
}

/// The family of a column: its header's first word (`TTFT` of `TTFT p99`), so related
/// columns stay in one table when a wide table is split.
fn family(header: &str) -> &str {
    header.split_whitespace().next().unwrap_or(header)
}

/// Groups of the value columns (indices from `keep` on) such that each group, beside the
/// first `keep` columns, is estimated to fit [`TABLE_BUDGET_PX`]. A family of columns
/// ([`family`]) is kept whole unless it alone does not fit.
fn column_groups(header: &[(&str, bool)], widths: &[usize], keep: usize) -> Vec<Vec<usize>> {
    let key: usize = widths.iter().take(keep).sum();
    let room = TABLE_BUDGET_PX.saturating_sub(key);
    let mut families: Vec<Vec<usize>> = Vec::new();
    for i in keep..header.len() {
        match families.last_mut() {
            Some(f) if family(header[f[0]].0) == family(header[i].0) => f.push(i),
            _ => families.push(vec![i]),
        }
    }
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut used = 0;
    for f in families {
        let w: usize = f.iter().map(|&i| widths[i]).sum();
        if used + w > room && !current.is_empty() {
            groups.push(std::mem::take(&mut current));
            used = 0;
        }
        if w <= room {
            current.extend(&f);
            used += w;
            continue;
        }
        // A family wider than the page on its own: split it column by column.
        for i in f {
            if used + widths[i] > room && !current.is_empty() {
                groups.push(std::mem::take(&mut current));
                used = 0;
            }
            current.push(i);
            used += widths[i];
        }
    }
    if !current.is_empty() || groups.is_empty() {
        groups.push(current);
    }
    groups
}

/// [`table`] for a table too wide for the page: its value columns are split into several
/// tables, each repeating the first `keep` columns (the row's name), so every table fits a
/// 1,280 px window without horizontal scrolling. Splitting keeps each row readable across
/// (a transposed table would not fit either once there are many policies); related columns
/// ([`family`]) stay together. A table that fits is one table.
pub(crate) fn split_table(
    header: &[(&str, bool)],
    rows: &[(bool, Vec<Cell>)],
    keep: usize,
) -> String {
    let widths: Vec<usize> = header
        .iter()
        .enumerate()
        .map(|(i, (h, _))| {
            let cells: Vec<&Cell> = rows.iter().filter_map(|r| r.1.get(i)).collect();
            column_px(h, &cells)
        })
        .collect();
    let keep = keep.min(header.len());
    column_groups(header, &widths, keep)
        .iter()
        .map(|g| {
            let cols: Vec<usize> = (0..keep).chain(g.iter().copied()).collect();
            let head: Vec<(&str, bool)> = cols.iter().map(|&i| header[i]).collect();
            let body: Vec<(bool, Vec<Cell>)> = rows
                .iter()
                .map(|(group, cells)| {
                    (
                        *group,
                        cols.iter().filter_map(|&i| cells.get(i).cloned()).collect(),
                    )
                })
                .collect();
            table(&head, &body)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Indices of the best values (all of them on a tie); empty when fewer than two values exist
/// or they are all equal.
pub(crate) fn best_indices(values: &[Option<f64>], lower_is_better: bool) -> Vec<usize> {
    let present: Vec<(usize, f64)> = values
        .iter()
        .enumerate()
        .filter_map(|(i, v)| v.filter(|x| x.is_finite()).map(|x| (i, x)))
        .collect();
    if present.len() < 2 {
        return Vec::new();
    }
    let best = present
        .iter()
        .map(|p| p.1)
        .fold(None, |acc: Option<f64>, x| match acc {
            None => Some(x),
            Some(a) if (lower_is_better && x < a) || (!lower_is_better && x > a) => Some(x),
            Some(a) => Some(a),
        })
        .unwrap_or(0.0);
    if present.iter().all(|p| p.1 == best) {
        return Vec::new();
    }
    present
        .iter()
        .filter(|p| p.1 == best)
        .map(|p| p.0)
        .collect()
}

/// The HTML exporter: a self-contained page.
#[derive(Debug, Clone, Copy, Default)]
pub struct Html;

impl Exporter<GateReport> for Html {
    /// The verdict, the comparisons (regressions highlighted) and the invariants.
    fn export(&self, report: &GateReport, out: &mut dyn io::Write) -> io::Result<()> {
        let mut page = Page::new("routelab check");
        page.el("h1", None, "routelab check");
        page.el("p", Some("meta"), report.summary().trim());
        page.el("h2", None, "Comparisons");
        let header = [
            ("scenario", true),
            ("policy", true),
            ("metric", true),
            ("baseline", false),
            ("current", false),
            ("delta", false),
            ("tolerance", false),
            ("status", true),
        ];
        let rows: Vec<(bool, Vec<Cell>)> = report
            .comparisons
            .iter()
            .map(|r| {
                (
                    false,
                    vec![
                        Cell::text(&r.scenario),
                        Cell::text(&r.policy),
                        Cell::text(&r.metric),
                        Cell::num(fmt6(r.baseline)),
                        Cell::num(fmt6(r.current)),
                        Cell::num(fmt_delta(r.delta_pct)),
                        Cell::num(format!("{:.2}%", r.tolerance_pct)),
                        Cell::text(r.status.as_str()).best(r.status == Verdict::Regression),
                    ],
                )
            })
            .collect();
        page.raw(&table(&header, &rows));
        page.el("h2", None, "Invariants");
        let header = [
            ("scenario", true),
            ("invariant", true),
            ("left", true),
            ("right", true),
            ("holds", true),
        ];
        let rows: Vec<(bool, Vec<Cell>)> = report
            .invariants
            .iter()
            .map(|i| {
                (
                    false,
                    vec![
                        Cell::text(&i.scenario),
                        Cell::text(&i.statement),
                        Cell::text(&i.left),
                        Cell::text(&i.right),
                        Cell::text(if i.holds { "yes" } else { "NO" }).best(!i.holds),
                    ],
                )
            })
            .collect();
        page.raw(&table(&header, &rows));
        out.write_all(page.finish().as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_and_inline_svg() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        let svg = "<?xml version=\"1.0\"?>\n<svg width=\"10\" height=\"10\" viewBox=\"0 0 10 10\" xmlns=\"http://www.w3.org/2000/svg\">\n</svg>\n";
        let inl = inline_svg(svg);
        assert!(inl.starts_with("<svg width"));
        assert!(!inl.contains("http"));
    }

    #[test]
    fn best_values() {
        assert_eq!(best_indices(&[Some(2.0), Some(1.0), None], true), vec![1]);
        assert_eq!(
            best_indices(&[Some(2.0), Some(1.0), Some(2.0)], false),
            vec![0, 2]
        );
        assert!(best_indices(&[Some(1.0), Some(1.0)], true).is_empty());
        assert!(best_indices(&[Some(1.0), None], true).is_empty());
    }

    fn header_of(names: &[&'static str]) -> Vec<(&'static str, bool)> {
        names.iter().map(|n| (*n, false)).collect()
    }

    #[test]
    fn a_table_that_fits_stays_one_table() {
        let header = header_of(&["policy", "TTFT mean", "TTFT p99", "failed"]);
        let rows = vec![(
            false,
            vec![
                Cell::text("p2c"),
                Cell::num("0.123"),
                Cell::num("0.456"),
                Cell::num("0"),
            ],
        )];
        let s = split_table(&header, &rows, 1);
        assert_eq!(s, table(&header, &rows));
    }

    #[test]
    fn a_wide_table_is_split_repeating_the_key_and_keeping_families_whole() {
        // 24 value columns in 6 families of 4, each cell 14 characters: ~1,800 px in one row.
        let families = ["TTFT", "e2e", "TPOT", "queue", "ITL", "probe"];
        let names: Vec<String> = families
            .iter()
            .flat_map(|f| ["mean", "p50", "p90", "p99"].map(|q| format!("{f} {q}")))
            .collect();
        let mut header: Vec<(&str, bool)> = vec![("policy", true)];
        header.extend(names.iter().map(|n| (n.as_str(), false)));
        let rows: Vec<(bool, Vec<Cell>)> = ["seed-v1", "least-load"]
            .iter()
            .map(|p| {
                let mut cells = vec![Cell::text(*p)];
                cells.extend((0..names.len()).map(|i| Cell::num(format!("{i:>6} ± 0.0123"))));
                (false, cells)
            })
            .collect();
        let s = split_table(&header, &rows, 1);
        let tables = s.matches("<table>").count();
        assert!(tables >= 2, "split into {tables} table(s)");
        assert_eq!(s.matches("<th class=\"l\">policy</th>").count(), tables);
        assert_eq!(s.matches("<td class=\"l\">least-load</td>").count(), tables);
        // Every value column appears exactly once, and a family never spans two tables.
        for n in &names {
            assert_eq!(s.matches(&format!("<th>{n}</th>")).count(), 1, "{n}");
        }
        for chunk in s.split("<table>").skip(1) {
            for f in families {
                let here = chunk.matches(&format!("<th>{f} ")).count();
                assert!(here == 0 || here == 4, "family {f} split: {here} here");
            }
        }
        // Each table's estimated width fits the budget.
        let widths: Vec<usize> = header
            .iter()
            .enumerate()
            .map(|(i, (h, _))| {
                let cells: Vec<&Cell> = rows.iter().map(|r| &r.1[i]).collect();
                column_px(h, &cells)
            })
            .collect();
        for g in column_groups(&header, &widths, 1) {
            let w = widths[0] + g.iter().map(|&i| widths[i]).sum::<usize>();
            assert!(w <= TABLE_BUDGET_PX, "{w} px");
        }
    }

    #[test]
    fn gate_html_is_one_escaped_page() {
        let s = crate::export::tests::export(crate::export::Format::Html);
        assert!(s.starts_with("<!DOCTYPE html>"));
        assert!(s.contains("<td class=\"l best\">REGRESSION</td>"), "{s}");
        assert!(s.contains("<td class=\"l\">p|q</td>"));
        assert!(s.contains("3 comparison(s): 2 regression(s)"));
        assert!(!s.contains("<script"));
    }
}
