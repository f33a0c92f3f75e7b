//! Aligned plain-text tables for the terminal.

/// A plain-text table: left-aligned text columns, right-aligned numbers.
pub(crate) struct TextTable {
    header: Vec<String>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl TextTable {
    /// Columns as (name, right-aligned).
    pub fn new(cols: &[(&str, bool)]) -> TextTable {
        TextTable {
            header: cols.iter().map(|c| c.0.to_string()).collect(),
            right: cols.iter().map(|c| c.1).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let n = self.header.len();
        let mut width: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(n) {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut s = String::new();
            for (i, (w, right)) in width.iter().zip(&self.right).enumerate() {
                let c = cells.get(i).map(String::as_str).unwrap_or("");
                let pad = w.saturating_sub(c.chars().count());
                if i > 0 {
                    s.push_str("  ");
                }
                if *right {
                    s.push_str(&" ".repeat(pad));
                    s.push_str(c);
                } else {
                    s.push_str(c);
                    if i + 1 < n {
                        s.push_str(&" ".repeat(pad));
                    }
                }
            }
            s.trim_end().to_string()
        };
        let mut out = line(&self.header);
        out.push('\n');
        let total: usize = width.iter().sum::<usize>() + 2 * n.saturating_sub(1);
        out.push_str(&"-".repeat(total));
        out.push('\n');
        for r in &self.rows {
            out.push_str(&line(r));
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns() {
        let mut t = TextTable::new(&[("policy", false), ("n", true)]);
        t.row(vec!["a".into(), "100".into()]);
        t.row(vec!["long-name".into(), "2".into()]);
        assert_eq!(
            t.render(),
            "policy       n\n--------------\na          100\nlong-name    2\n"
        );
    }
}
