//! `requests.csv`: one row per finished request, the largest file routelab writes (about 92 bytes
//! a row, 92 MB for a million requests).
//!
//! Two ways to write it, with the same bytes (those of the generic CSV writer; a test compares):
//! - [`write_requests_csv`], from rows already collected (the real-time player's): chunks are
//!   formatted in parallel and written in order;
//! - [`RequestsCsvStream`], while the simulations run (`routelab run`): each run's sink hands
//!   chunks of rows to one writer thread, which formats them on a core the simulation does not
//!   use and writes them in policy order, holding back a later policy's bytes until the ones
//!   before it are complete. The file is then done when the last simulation ends, instead of
//!   costing a second pass over a million rows afterwards.
//!
//! Rows are formatted straight into byte buffers (no `String` per cell).

use crate::error::ReportError;
use crate::num::{push_fixed6, push_uint};
use crate::run::PolicyRun;
use rayon::prelude::*;
use routelab_sim::{RequestRecord, RequestSink};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

/// The columns, in order.
pub(crate) const REQUEST_HEADER: &[&str] = &[
    "policy",
    "id",
    "arrival_s",
    "worker",
    "status",
    "prompt_tokens",
    "output_tokens",
    "cached_tokens",
    "believed_cached_tokens",
    "affinity_kept",
    "queue_s",
    "ttft_s",
    "e2e_s",
    "tpot_s",
];

/// Rows per parallel formatting task: large enough to amortise the task, small enough that a
/// window of them (`WINDOW` tasks) bounds the memory held before writing.
const CHUNK_ROWS: usize = 16_384;
const WINDOW: usize = 16;

/// Chunks a stream's writer thread may hold queued before a simulation waits for it.
const QUEUED_CHUNKS: usize = 32;

fn write_error(path: &Path) -> impl Fn(std::io::Error) -> ReportError + '_ {
    |source| ReportError::Write {
        file: path.to_path_buf(),
        source,
    }
}

/// Create `path` (and its directory) and write the header row.
fn create_with_header(path: &Path) -> Result<BufWriter<File>, ReportError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| ReportError::CreateDir {
            dir: dir.to_path_buf(),
            source,
        })?;
    }
    let file = File::create(path).map_err(write_error(path))?;
    let mut file = BufWriter::with_capacity(1 << 20, file);
    let mut header = Vec::new();
    for (i, name) in REQUEST_HEADER.iter().enumerate() {
        if i > 0 {
            header.push(b',');
        }
        push_field(&mut header, name);
    }
    header.push(b'\n');
    file.write_all(&header).map_err(write_error(path))?;
    Ok(file)
}

/// The policy cell, quoted once for all its rows.
fn policy_cell(policy: &str) -> Vec<u8> {
    let mut cell = Vec::new();
    push_field(&mut cell, policy);
    cell
}

fn format_chunk(policy: &[u8], rows: &[RequestRecord]) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows.len() * 96);
    for q in rows {
        push_row(&mut out, policy, q);
    }
    out
}

/// Write `requests.csv` for `runs` (their rows in order, policy by policy).
pub(crate) fn write_requests_csv(path: &Path, runs: &[PolicyRun]) -> Result<(), ReportError> {
    let fail = write_error(path);
    let mut file = create_with_header(path)?;
    for run in runs {
        let Some(rows) = &run.requests else { continue };
        let policy = policy_cell(&run.policy);
        for window in rows.chunks(CHUNK_ROWS * WINDOW) {
            let chunks: Vec<Vec<u8>> = window
                .par_chunks(CHUNK_ROWS)
                .map(|chunk| format_chunk(&policy, chunk))
                .collect();
            for c in &chunks {
                file.write_all(c).map_err(&fail)?;
            }
        }
    }
    file.flush().map_err(fail)
}

enum Message {
    /// Rows of run `.0`, in the order the simulation finished them.
    Rows(usize, Vec<RequestRecord>),
    /// Run `.0` has no more rows.
    Done(usize),
}

/// `requests.csv` written while the simulations run: one [`RowSink`] per run (policy), rows
/// in the file policy by policy in the order the policies were given, whatever order the runs
/// finish in.
#[derive(Debug)]
pub struct RequestsCsvStream {
    path: PathBuf,
    runs: usize,
    sender: SyncSender<Message>,
    writer: JoinHandle<Result<(), ReportError>>,
}

impl RequestsCsvStream {
    /// Create `path` (and its directory), write the header and start the writer thread for
    /// runs named `policies`, in file order.
    pub fn create(path: &Path, policies: &[String]) -> Result<RequestsCsvStream, ReportError> {
        let file = create_with_header(path)?;
        let (sender, receiver) = sync_channel(QUEUED_CHUNKS);
        let cells: Vec<Vec<u8>> = policies.iter().map(|p| policy_cell(p)).collect();
        let at = path.to_path_buf();
        let writer = std::thread::Builder::new()
            .name("requests.csv".into())
            .spawn(move || write_in_order(&at, file, &cells, receiver))
            .map_err(write_error(path))?;
        Ok(RequestsCsvStream {
            path: path.to_path_buf(),
            runs: policies.len(),
            sender,
            writer,
        })
    }

    /// The sink of run `run` (its index in the policies given to [`RequestsCsvStream::create`]).
    /// Dropping the sink ends that run's rows.
    ///
    /// # Panics
    /// If `run` is not an index of those policies (a bug of the caller).
    pub fn sink(&self, run: usize) -> RowSink {
        assert!(run < self.runs, "run {run} of {} policies", self.runs);
        RowSink {
            run,
            rows: Vec::with_capacity(CHUNK_ROWS),
            sender: self.sender.clone(),
        }
    }

    /// Wait for every row to be written (every sink must have been dropped).
    pub fn finish(self) -> Result<PathBuf, ReportError> {
        drop(self.sender);
        match self.writer.join() {
            Ok(result) => result.map(|()| self.path),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// The runs failed: stop writing and remove the partial file.
    pub fn abandon(self) {
        let path = self.path.clone();
        let _ = self.finish();
        let _ = std::fs::remove_file(path);
    }
}

/// The writer thread: formats each chunk as it comes, writes the current run's bytes at once
/// and holds a later run's until every run before it is done.
fn write_in_order(
    path: &Path,
    mut file: BufWriter<File>,
    policies: &[Vec<u8>],
    receiver: Receiver<Message>,
) -> Result<(), ReportError> {
    let mut current = 0;
    let mut held: Vec<Vec<u8>> = vec![Vec::new(); policies.len()];
    let mut done = vec![false; policies.len()];
    let mut result = Ok(());
    // On a write error keep receiving (and dropping) rows, so no simulation blocks on a full
    // channel; the error is returned once every sink is gone.
    for message in receiver {
        match message {
            Message::Rows(run, rows) => {
                let bytes = format_chunk(&policies[run], &rows);
                if run == current {
                    if result.is_ok() {
                        result = file.write_all(&bytes).map_err(write_error(path));
                    }
                } else {
                    held[run].extend_from_slice(&bytes);
                }
            }
            Message::Done(run) => {
                done[run] = true;
                while current < done.len() && done[current] {
                    current += 1;
                    if let Some(bytes) = held.get_mut(current).map(std::mem::take)
                        && result.is_ok()
                    {
                        result = file.write_all(&bytes).map_err(write_error(path));
                    }
                }
            }
        }
    }
    result?;
    file.flush().map_err(write_error(path))
}

/// One run's rows on their way to a [`RequestsCsvStream`], in chunks.
#[derive(Debug)]
pub struct RowSink {
    run: usize,
    rows: Vec<RequestRecord>,
    sender: SyncSender<Message>,
}

impl RequestSink for RowSink {
    fn record(&mut self, row: RequestRecord) {
        self.rows.push(row);
        if self.rows.len() == CHUNK_ROWS {
            let full = std::mem::replace(&mut self.rows, Vec::with_capacity(CHUNK_ROWS));
            // A closed channel means the writer stopped; its error is reported by `finish`.
            let _ = self.sender.send(Message::Rows(self.run, full));
        }
    }
}

impl Drop for RowSink {
    fn drop(&mut self) {
        if !self.rows.is_empty() {
            let _ = self
                .sender
                .send(Message::Rows(self.run, std::mem::take(&mut self.rows)));
        }
        let _ = self.sender.send(Message::Done(self.run));
    }
}

/// One row; an absent latency (no first token, TPOT of a one-token output) is an empty cell.
fn push_row(out: &mut Vec<u8>, policy: &[u8], q: &RequestRecord) {
    out.extend_from_slice(policy);
    out.push(b',');
    push_uint(out, q.id);
    out.push(b',');
    push_fixed6(out, q.arrival_s);
    out.push(b',');
    push_field(out, &q.worker);
    out.push(b',');
    out.extend_from_slice(q.status.as_str().as_bytes());
    for n in [
        q.prompt_tokens,
        q.output_tokens,
        q.cached_tokens,
        q.believed_cached_tokens,
    ] {
        out.push(b',');
        push_uint(out, u64::from(n));
    }
    out.push(b',');
    out.extend_from_slice(if q.affinity_kept { b"true" } else { b"false" });
    out.push(b',');
    push_fixed6(out, q.queue_s);
    for x in [q.ttft_s, q.e2e_s, q.tpot_s] {
        out.push(b',');
        if let Some(x) = x {
            push_fixed6(out, x);
        }
    }
    out.push(b'\n');
}

/// A text cell as the `csv` crate's default writer quotes it: in double quotes (inner quotes
/// doubled) when it holds a comma, a quote or a line break, else as it is.
fn push_field(out: &mut Vec<u8>, s: &str) {
    if s.bytes().any(|b| matches!(b, b',' | b'"' | b'\n' | b'\r')) {
        out.push(b'"');
        for b in s.bytes() {
            if b == b'"' {
                out.push(b'"');
            }
            out.push(b);
        }
        out.push(b'"');
    } else {
        out.extend_from_slice(s.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::num::fmt_fixed;
    use routelab_sim::{RunMetrics, Status};

    fn record(id: u64, worker: &str, status: Status, ttft: Option<f64>) -> RequestRecord {
        RequestRecord {
            id,
            arrival_s: id as f64 * 0.1234565,
            worker: worker.into(),
            prompt_tokens: 812,
            output_tokens: 1,
            queue_s: 0.0,
            ttft_s: ttft,
            e2e_s: ttft.map(|t| t * 3.0),
            tpot_s: None,
            cached_tokens: 512,
            believed_cached_tokens: 1024,
            affinity_kept: id.is_multiple_of(2),
            status,
        }
    }

    /// What the generic CSV writer makes of the same rows (the format before this module).
    fn generic(runs: &[PolicyRun]) -> Vec<u8> {
        let opt = |x: Option<f64>| x.map_or_else(String::new, |x| fmt_fixed(x, 6));
        let mut w = csv::Writer::from_writer(Vec::new());
        w.write_record(REQUEST_HEADER).unwrap();
        for r in runs {
            for q in r.requests.iter().flatten() {
                w.write_record([
                    r.policy.clone(),
                    q.id.to_string(),
                    fmt_fixed(q.arrival_s, 6),
                    q.worker.clone(),
                    q.status.as_str().to_string(),
                    q.prompt_tokens.to_string(),
                    q.output_tokens.to_string(),
                    q.cached_tokens.to_string(),
                    q.believed_cached_tokens.to_string(),
                    q.affinity_kept.to_string(),
                    fmt_fixed(q.queue_s, 6),
                    opt(q.ttft_s),
                    opt(q.e2e_s),
                    opt(q.tpot_s),
                ])
                .unwrap();
            }
        }
        w.into_inner().unwrap()
    }

    #[test]
    fn bytes_equal_the_generic_csv_writer_across_chunks() {
        let statuses = [Status::Ok, Status::Failed, Status::Rejected];
        // More rows than one parallel window, so chunk order matters.
        let many: Vec<RequestRecord> = (0..(CHUNK_ROWS * WINDOW + 777) as u64)
            .map(|i| {
                let worker = ["pro6000-1", "", "a,b", "say \"hi\""][(i % 4) as usize];
                let ttft = (i % 5 != 0).then_some(i as f64 * 1e-3 + 0.0000005);
                record(i, worker, statuses[(i % 3) as usize], ttft)
            })
            .collect();
        let runs = vec![
            PolicyRun::new(
                RunMetrics::new("at-load/sed/capacity/weighted:24", vec![]),
                Some(many),
            ),
            PolicyRun::new(RunMetrics::new("seed-v3", vec![]), None),
            PolicyRun::new(
                RunMetrics::new("odd,policy", vec![]),
                Some(vec![record(1, "w", Status::Ok, None)]),
            ),
        ];
        let dir = std::env::temp_dir().join(format!("routelab-requests-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("requests.csv");
        write_requests_csv(&path, &runs).unwrap();
        let fast = std::fs::read(&path).unwrap();
        assert_eq!(
            String::from_utf8(fast).unwrap(),
            String::from_utf8(generic(&runs)).unwrap()
        );

        // The stream, fed out of order (the last run first, rows arriving interleaved from
        // threads), writes the same bytes.
        let path = dir.join("streamed.csv");
        std::fs::create_dir_all(&dir).unwrap();
        let names: Vec<String> = runs.iter().map(|r| r.policy.clone()).collect();
        let stream = RequestsCsvStream::create(&path, &names).unwrap();
        std::thread::scope(|scope| {
            for i in (0..runs.len()).rev() {
                let mut sink = stream.sink(i);
                let rows = runs[i].requests.clone().unwrap_or_default();
                scope.spawn(move || {
                    for row in rows {
                        sink.record(row);
                    }
                });
            }
        });
        assert_eq!(stream.finish().unwrap(), path);
        let streamed = std::fs::read(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            String::from_utf8(streamed).unwrap(),
            String::from_utf8(generic(&runs)).unwrap()
        );
    }

    #[test]
    fn an_abandoned_stream_leaves_no_file() {
        let dir = std::env::temp_dir().join(format!("routelab-abandon-{}", std::process::id()));
        let path = dir.join("nested").join("requests.csv");
        let stream = RequestsCsvStream::create(&path, &["p".to_string()]).unwrap();
        let mut sink = stream.sink(0);
        sink.record(record(0, "w", Status::Ok, Some(0.5)));
        drop(sink);
        stream.abandon();
        assert!(!path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
