//! `--from csv` (and `--decode-sweep`): a CSV of `concurrency,aggregate_tok_s` rows with the
//! optional columns of [`CSV_COLUMNS`].

use csv::StringRecord;
use routelab_policies::located::{InputError, rule};

use super::{CSV_COLUMNS, ClosedLoop, ColdBurst, FitInput, Measured, Obs, RowAt, not_valid};

/// What a CSV must look like, for errors about its header.
const VALID_HEADER: &str = "a header row `concurrency,aggregate_tok_s` (optional columns \
                            prefill_tok_s, cold_burst_tok_s, mean_prompt_tokens, \
                            mean_output_tokens, mean_context_tokens), then one row per \
                            concurrency (per concurrency and context in a decode sweep)";

/// Each of [`CSV_COLUMNS`]' place in the file, when it has it.
type Columns = [Option<usize>; CSV_COLUMNS.len()];

/// Reads a profile CSV: one point per row, the first row giving `prefill_tok_s` and the one
/// row giving `cold_burst_tok_s`.
pub(super) fn read_csv(input: &FitInput) -> Result<Measured, InputError> {
    let file = input.origin.as_str();
    let mut rd = csv::ReaderBuilder::new()
        .has_headers(true)
        .trim(csv::Trim::All)
        .from_reader(input.text.as_bytes());
    let header = rd
        .headers()
        .map_err(|e| InputError::new(file, "", format!("unreadable CSV: {e}")).at(Some(1), None))?
        .clone();
    let col = columns(file, &header)?;
    let mut m = Measured {
        weight_name: "equal weights (one per row)",
        ..Measured::default()
    };
    let mut once = OnceRows::default();
    for rec in rd.records() {
        let rec = rec.map_err(|e| {
            let line = e.position().map(|p| p.line() as u32);
            InputError::new(file, "", format!("unreadable CSV row: {e}")).at(line, None)
        })?;
        let row = Row {
            file,
            col: &col,
            line: rec.position().map_or(0, |p| p.line()),
            rec: &rec,
        };
        read_row(&row, &mut m, &mut once)?;
    }
    if m.points.is_empty() {
        return Err(InputError::new(file, "", "no data rows").valid(VALID_HEADER));
    }
    describe(file, &mut m, once.prefill_at);
    Ok(m)
}

/// Where each known column is; an unknown, repeated or missing required column is an error.
fn columns(file: &str, header: &StringRecord) -> Result<Columns, InputError> {
    let mut col = [None; CSV_COLUMNS.len()];
    for (i, h) in header.iter().enumerate() {
        match CSV_COLUMNS.iter().position(|c| *c == h) {
            Some(k) if col[k].is_none() => col[k] = Some(i),
            Some(_) => {
                return Err(InputError::new(file, h, "column given twice")
                    .at(Some(1), None)
                    .valid(VALID_HEADER));
            }
            None => {
                return Err(InputError::new(file, h, format!("unknown column `{h}`"))
                    .at(Some(1), None)
                    .valid(VALID_HEADER));
            }
        }
    }
    for (k, name) in CSV_COLUMNS.iter().enumerate().take(2) {
        if col[k].is_none() {
            return Err(
                InputError::new(file, *name, format!("missing column `{name}`"))
                    .at(Some(1), None)
                    .valid(VALID_HEADER),
            );
        }
    }
    Ok(col)
}

/// What the rows so far gave that the file may give once.
#[derive(Default)]
struct OnceRows {
    /// The line of the cold burst's row.
    cold_line: Option<u64>,
    /// The first `prefill_tok_s`: (the row's concurrency, the figure).
    prefill_at: Option<(f64, f64)>,
}

/// One data row of the CSV.
struct Row<'a> {
    file: &'a str,
    col: &'a Columns,
    line: u64,
    rec: &'a StringRecord,
}

impl Row<'_> {
    /// An error about the cell of column `name` on this row.
    fn err(&self, name: &str, msg: String, valid: &str) -> InputError {
        InputError::new(self.file, name, msg)
            .at(u32::try_from(self.line).ok(), None)
            .valid(valid)
    }

    /// The number in column `k`: none when the file has no such column or (for an optional
    /// column) the cell is empty; an error unless it is a number > 0.
    fn cell(&self, k: usize) -> Result<Option<f64>, InputError> {
        let Some(i) = self.col[k] else {
            return Ok(None);
        };
        let name = CSV_COLUMNS[k];
        let text = self.rec.get(i).unwrap_or("");
        if text.is_empty() {
            return if k < 2 {
                Err(self.err(name, "empty cell".into(), "a number > 0"))
            } else {
                Ok(None)
            };
        }
        let v: f64 = text
            .parse()
            .map_err(|_| self.err(name, format!("`{text}` is not a number"), "a number > 0"))?;
        rule::positive(v)
            .map(Some)
            .map_err(|e| self.err(name, not_valid(&e), &e.expected))
    }

    /// The closed loop this row measured, when it gives both mean lengths.
    fn closed_loop(
        &self,
        concurrency: f64,
        aggregate: f64,
    ) -> Result<Option<ClosedLoop>, InputError> {
        match (self.cell(4)?, self.cell(5)?) {
            (Some(prompt_tokens), Some(output_tokens)) => Ok(Some(ClosedLoop {
                concurrency,
                output_tok_s: aggregate,
                prompt_tokens,
                output_tokens,
            })),
            (None, None) => Ok(None),
            (prompt, _) => {
                let missing = if prompt.is_some() {
                    "mean_output_tokens"
                } else {
                    "mean_prompt_tokens"
                };
                Err(self.err(
                    missing,
                    format!(
                        "no {missing}: a closed-loop row needs both its mean prompt and mean output tokens"
                    ),
                    "both mean_prompt_tokens and mean_output_tokens (a closed-loop result), or \
                     neither (a pure-decode measurement)",
                ))
            }
        }
    }
}

/// Reads one row into `m`: its point, and the prefill or cold burst it gives.
fn read_row(row: &Row<'_>, m: &mut Measured, once: &mut OnceRows) -> Result<(), InputError> {
    let c = row.cell(0)?.expect("required column");
    let a = row.cell(1)?.expect("required column");
    let context_tokens = row.cell(6)?;
    // a decode sweep at several contexts: each context's rows in their own concurrency order
    if let Some(prev) = m
        .points
        .iter()
        .rev()
        .find(|p| p.context_tokens == context_tokens)
        && c <= prev.concurrency
    {
        return Err(row.err(
            "concurrency",
            format!(
                "concurrency {c} is not greater than the previous row's {}",
                prev.concurrency
            ),
            "rows in strictly increasing concurrency, one row per concurrency (per \
             mean_context_tokens when the rows give one)",
        ));
    }
    let closed_loop = row.closed_loop(c, a)?;
    m.points.push(Obs {
        concurrency: c,
        aggregate_tok_s: a,
        weight: 1.0,
        closed_loop,
        rounds: 20,
        context_tokens,
        at: RowAt {
            file: row.file.to_string(),
            field: "aggregate_tok_s".into(),
            line: u32::try_from(row.line).ok(),
            column: None,
        },
    });
    if let Some(p) = row.cell(2)? {
        once.prefill_at.get_or_insert((c, p));
    }
    if let Some(t) = row.cell(3)? {
        if let Some(first) = once.cold_line {
            return Err(row.err(
                "cold_burst_tok_s",
                format!("a second cold burst (the first is on line {first})"),
                "cold_burst_tok_s on one row only: the concurrency of the cold burst",
            ));
        }
        once.cold_line = Some(row.line);
        m.cold = Some(ColdBurst {
            concurrency: c,
            tok_s: t,
        });
    }
    Ok(())
}

/// The prefill speed the file gave and its `sources` line: which columns were read.
fn describe(file: &str, m: &mut Measured, prefill_at: Option<(f64, f64)>) {
    let mut read = vec!["concurrency", "aggregate_tok_s"];
    if let Some((c, p)) = prefill_at {
        m.prefill = Some((
            p,
            format!(
                "prefill_tok_s: the CSV's prefill_tok_s at the lowest concurrency giving one ({c})"
            ),
        ));
        read.push("prefill_tok_s");
    }
    if m.cold.is_some() {
        read.push("cold_burst_tok_s");
    }
    if m.points.iter().any(|p| p.closed_loop.is_some()) {
        read.extend(["mean_prompt_tokens", "mean_output_tokens"]);
    }
    if m.points.iter().any(|p| p.context_tokens.is_some()) {
        read.push("mean_context_tokens");
    }
    m.sources.push(format!(
        "{file} (CSV, {} rows): {}",
        m.points.len(),
        read.join(", ")
    ));
}
