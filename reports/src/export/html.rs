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
body{font-family:'DejaVu Sans',Verdana,Arial,sans-serif;margin:24px auto;max-width:1100px;\
padding:0 16px;color:#222;line-height:1.4}\
h1{font-size:1.6em;margin-bottom:.2em}h2{margin-top:1.6em;border-bottom:1px solid #ddd}\
.desc{font-size:1.1em;color:#444}.meta,.note{color:#666;font-size:.9em}\
.scroll{overflow-x:auto}\
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}\
th,td{border:1px solid #d6d6d6;padding:3px 8px;text-align:right;white-space:nowrap}\
th{background:#f2f2f2}td.l,th.l{text-align:left}\
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
