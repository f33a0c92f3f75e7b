//! The optional request log: one JSON line per finished request (`request_log` in the
//! configuration), rotated by size.
//!
//! ```json
//! {"arrival_unix_ms": 1733050000123, "model": "gemma-27b", "prompt_tokens": 812,
//!  "output_tokens": 203, "prefix_hashes": [123, 456], "worker": "pro6000", "status": "ok",
//!  "ttft_ms": 412.5, "e2e_ms": 9012.0}
//! ```
//!
//! - `arrival_unix_ms`: wall-clock Unix milliseconds when the request arrived, **always the real
//!   wall clock**, also under `clock_scale` (the log is read as a trace of when traffic came);
//! - `model` as the client asked it; `prompt_tokens`: the gateway's estimate, the router's
//!   ([`crate::prompt`]); `prefix_hashes`: the prefix block hashes the router saw;
//! - `output_tokens`, for a completed (`ok`) request only: the response's
//!   `usage.completion_tokens` (a stream's final usage chunk), else the stream's content events
//!   (a buffered body: its text's estimate, as the router counts it); null for every other
//!   status, so that a failed request never replays as a short one;
//! - `worker`: the worker that served it (the last one tried), null when none was chosen;
//! - `status`, one of [`LogStatus`]: `ok`; `upstream_error` (the worker failed: connection,
//!   5xx with no retry left, a broken stream); `timeout` (the worker did not answer within
//!   `upstream.response_timeout_s`, or went silent longer than
//!   `upstream.stream_idle_timeout_s`); `rejected` (refused without a generation: by the router
//!   on the first attempt — none healthy, the prompt too long — with `worker` null; a queue
//!   timeout, on any attempt; or by the worker with a 4xx; a router refusal on a retry keeps
//!   the status of the failure that caused the retry);
//!   `client_gone` (the client went away first);
//! - `ttft_ms` (arrival to the first response byte) and `e2e_ms` (arrival to the end), null
//!   when that point was not reached; in **policy time**, the router's clock ([`crate::clock`]):
//!   wall time in production, the emulated engine's time under `clock_scale`;
//! - `decision`, for a routed request only: why the router chose the worker, from the router's
//!   own explanation of the decision ([`LogDecision`]): `reason` (`score`, `write-off`,
//!   `affinity`, `unscored`, `queued`), `chosen` and `runner_up`, each a `worker` with the
//!   `score` the chooser compared (lower wins) and, for `predictive`, `predicted_ttft_ms` and
//!   `predicted_tpot_ms`.
//!
//! Requests refused before routing (a malformed body, an unknown model) are not logged: they
//! carry no model or prompt worth replaying. The prompt's text is never written.
//!
//! **Writing never blocks a request**: the request path hands its record to a dedicated writer
//! thread over a bounded channel ([`CHANNEL_LINES`] records) with `try_send`; when the channel
//! is full the record is dropped and counted (`routelab_gateway_request_log_dropped_total`).
//! A thread rather than a tokio task because file writes and renames are blocking system calls
//! that must not hold a runtime worker. It buffers lines and writes them whenever the channel
//! is empty (so the file lags by at most what is queued) and at shutdown. A failed write loses
//! its lines: each is counted (`routelab_gateway_request_log_write_errors_total`), and the
//! failure is logged at most once a second with the running total (a full disk fails every
//! line), and the part of them that reached the file is cut off again.
//!
//! **A live file moved or deleted** (by hand, or by a rotation tool) is noticed at the next
//! batch: the writer starts a new file at the path and logs `request_log_reopened`. It never
//! rotates a file that is no longer at the path (shifting the rotated files for a missing live
//! file destroyed the history, one file per line written).
//!
//! **Rotation**: a line that would take the file past `max_bytes` first renames it to
//! `<path>.1` (shifting `<path>.1` to `<path>.2` … and dropping `<path>.<keep>`), then starts a
//! new file; a line is never split across files (a single line longer than `max_bytes` gets a
//! file of its own). Every line ends with `\n`.

use routelab_policies::Time;
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError};

/// Records queued for the writer before new ones are dropped.
pub const CHANNEL_LINES: usize = 8192;

/// How a logged request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LogStatus {
    /// Completed.
    Ok,
    /// The worker failed it (connection, 5xx, a broken stream) and no retry was left.
    UpstreamError,
    /// The worker did not answer in time or went silent.
    Timeout,
    /// Refused without a generation (by the router, or by the worker with a 4xx).
    Rejected,
    /// The client went away before the end.
    ClientGone,
    /// A stream still running at the drain deadline of a shutdown, cut by the gateway.
    DrainCut,
}

impl LogStatus {
    /// Every status, as written.
    pub const ALL: [LogStatus; 6] = [
        LogStatus::Ok,
        LogStatus::UpstreamError,
        LogStatus::Timeout,
        LogStatus::Rejected,
        LogStatus::ClientGone,
        LogStatus::DrainCut,
    ];

    /// The name written in the log.
    pub fn as_str(self) -> &'static str {
        match self {
            LogStatus::Ok => "ok",
            LogStatus::UpstreamError => "upstream_error",
            LogStatus::Timeout => "timeout",
            LogStatus::Rejected => "rejected",
            LogStatus::ClientGone => "client_gone",
            LogStatus::DrainCut => "drain_cut",
        }
    }
}

/// One line of the log, in its exact schema (field names and units are read by
/// `routelab`'s trace reader).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogRecord {
    /// Wall-clock Unix milliseconds at arrival.
    pub arrival_unix_ms: i64,
    /// The model asked for.
    pub model: String,
    /// The gateway's prompt-token estimate.
    pub prompt_tokens: u32,
    /// Output tokens of a completed (`ok`) request; `None` for every other status.
    pub output_tokens: Option<u32>,
    /// Prefix block hashes as routed.
    pub prefix_hashes: Vec<u64>,
    /// The worker that served it (the last tried).
    pub worker: Option<String>,
    /// How it ended.
    pub status: LogStatus,
    /// Arrival to first response byte, policy-time milliseconds.
    pub ttft_ms: Option<f64>,
    /// Arrival to end, policy-time milliseconds.
    pub e2e_ms: Option<f64>,
    /// Why the router chose the worker (the last attempt's decision); absent when the request
    /// was never routed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<Box<LogDecision>>,
}

mod decision;
pub use decision::{LogCandidate, LogDecision};

/// Counters of the log, rendered in `/metrics`.
#[derive(Debug, Default)]
pub struct LogCounters {
    /// Records dropped because the writer's channel was full.
    pub dropped: AtomicU64,
    /// Records lost to a failed write (every line of a failed write counts).
    pub write_errors: AtomicU64,
}

/// The log's validated settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// The live file.
    pub path: PathBuf,
    /// Largest size of one file, bytes.
    pub max_bytes: u64,
    /// Rotated files kept (`<path>.1` … `<path>.<keep>`).
    pub keep: u32,
}

enum Msg {
    Line(LogRecord),
    /// Flush, then answer.
    Sync(tokio::sync::oneshot::Sender<()>),
}

/// The handle the request path holds.
#[derive(Debug)]
pub struct RequestLog {
    tx: SyncSender<Msg>,
    counters: Arc<LogCounters>,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Msg::Line(r) => f.debug_tuple("Line").field(r).finish(),
            Msg::Sync(_) => f.write_str("Sync"),
        }
    }
}

impl RequestLog {
    /// Open (append to) the log file and start its writer thread. The thread ends, after a
    /// last flush, when the handle is dropped.
    pub fn open(settings: LogSettings) -> std::io::Result<RequestLog> {
        let writer = Writer::open(settings)?;
        let counters = Arc::new(LogCounters::default());
        let (tx, rx) = std::sync::mpsc::sync_channel(CHANNEL_LINES);
        let c = counters.clone();
        std::thread::Builder::new()
            .name("request-log".into())
            .spawn(move || run(writer, rx, &c))?;
        Ok(RequestLog { tx, counters })
    }

    /// Queue a record; never blocks (a full channel drops it, counted).
    pub fn send(&self, record: LogRecord) {
        match self.tx.try_send(Msg::Line(record)) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counters.dropped.fetch_add(1, Relaxed);
            }
        }
    }

    /// Wait until every record queued before this call is written and flushed.
    pub async fn sync(&self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sender = self.tx.clone();
        // `send` waits for room in the channel: off the runtime's threads.
        let sent = tokio::task::spawn_blocking(move || sender.send(Msg::Sync(tx)).is_ok())
            .await
            .unwrap_or(false);
        if sent {
            let _ = rx.await;
        }
    }

    /// Its counters.
    pub fn counters(&self) -> &LogCounters {
        &self.counters
    }
}

/// A request on its way, as the log will show it. It writes its line once: at
/// [`Trace::finish`], or when dropped unfinished (the client went away: `client_gone`).
pub(crate) struct Trace {
    log: Arc<RequestLog>,
    clock: crate::clock::Clock,
    arrived: Time,
    record: LogRecord,
    done: bool,
}

impl Trace {
    /// A request that arrived at `arrived` (policy time) and `arrival_unix_ms` (wall clock).
    pub fn new(
        log: Arc<RequestLog>,
        clock: crate::clock::Clock,
        arrived: Time,
        arrival_unix_ms: i64,
        model: &str,
        prompt_tokens: u32,
        prefix_hashes: &[u64],
    ) -> Trace {
        Trace {
            log,
            clock,
            arrived,
            record: LogRecord {
                arrival_unix_ms,
                model: model.to_string(),
                prompt_tokens,
                output_tokens: None,
                prefix_hashes: prefix_hashes.to_vec(),
                worker: None,
                status: LogStatus::ClientGone,
                ttft_ms: None,
                e2e_ms: None,
                decision: None,
            },
            done: false,
        }
    }

    /// The worker the request is (last) sent to.
    pub fn worker(&mut self, name: &str) {
        self.record.worker = Some(name.to_string());
    }

    /// The decision that sent it to its (last) worker.
    pub fn decision(&mut self, d: LogDecision) {
        self.record.decision = Some(Box::new(d));
    }

    /// The request ended now: write its line (once; later calls do nothing).
    pub fn finish(&mut self, status: LogStatus, first_byte: Option<Time>, output: Option<u32>) {
        if self.done {
            return;
        }
        self.done = true;
        let ms = |t: Time| t.saturating_since(self.arrived).as_secs_f64() * 1e3;
        let now = self.clock.now();
        let r = &mut self.record;
        r.status = status;
        // Only a completed request has an output length: a partial count of a failed stream
        // would replay as a request that wanted that few tokens.
        r.output_tokens = output.filter(|_| status == LogStatus::Ok);
        r.ttft_ms = first_byte.map(ms);
        r.e2e_ms = Some(ms(now));
        let record = LogRecord {
            model: std::mem::take(&mut r.model),
            prefix_hashes: std::mem::take(&mut r.prefix_hashes),
            worker: r.worker.take(),
            decision: r.decision.take(),
            ..r.clone()
        };
        self.log.send(record);
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        self.finish(LogStatus::ClientGone, None, None);
    }
}

/// The writer thread: write what comes, flush when nothing is waiting.
fn run(mut w: Writer, rx: Receiver<Msg>, counters: &LogCounters) {
    let handle = |w: &mut Writer, m: Msg| match m {
        Msg::Line(r) => w.write_counted(&r, counters),
        Msg::Sync(ack) => {
            w.flush_counted(counters);
            let _ = ack.send(());
        }
    };
    while let Ok(m) = rx.recv() {
        // The live file may have been moved or deleted (by hand, or a rotation tool) since
        // the last batch: lines go to the path, not to a file nobody can open any more.
        w.follow_path(counters);
        handle(&mut w, m);
        loop {
            match rx.try_recv() {
                // A sync ends the batch: what comes after it may have been sent after the
                // live file was moved (the host synced, then moved it), so the next line
                // checks the path first. Continuing the batch here lost lines 5-8 of
                // `lines_after_the_live_file_was_moved_go_to_a_new_file_at_the_path` to the
                // moved file when the test's sends overtook the writer (seen under load).
                Ok(m @ Msg::Sync(_)) => {
                    handle(&mut w, m);
                    break;
                }
                Ok(m) => handle(&mut w, m),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    w.flush_counted(counters);
                    return;
                }
            }
        }
        w.flush_counted(counters);
    }
    w.flush_counted(counters);
}

/// Bytes of lines held before they are written to the file.
const BUFFER_BYTES: usize = 64 * 1024;

/// The file and its rotation.
struct Writer {
    settings: LogSettings,
    file: File,
    /// Which file `file` is, to tell when the path names another one (or none).
    identity: Option<FileIdentity>,
    /// Lines not yet written to the file, and how many.
    buf: Vec<u8>,
    buffered_lines: u64,
    /// Bytes in the live file (what is on disk plus what is buffered).
    size: u64,
    /// Bytes of the live file known to be on disk.
    written: u64,
    failures: FailureReport,
}

/// A file's device and inode: the same path may name another file after a rename or delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileIdentity(u64, u64);

impl FileIdentity {
    #[cfg(unix)]
    fn of(m: &std::fs::Metadata) -> Option<FileIdentity> {
        use std::os::unix::fs::MetadataExt;
        Some(FileIdentity(m.dev(), m.ino()))
    }

    #[cfg(not(unix))]
    fn of(_: &std::fs::Metadata) -> Option<FileIdentity> {
        None
    }
}

/// Write failures, logged at most once a second (a full disk fails every line: 3,000 requests
/// printed 5,946 lines), every lost line counted.
#[derive(Debug, Default)]
struct FailureReport {
    /// When the last line was logged.
    logged_at: Option<std::time::Instant>,
    /// Failures since then, not logged.
    quiet: u64,
}

/// The shortest time between two `request_log_write_failed` lines.
const FAILURE_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl FailureReport {
    /// `lines` lines were lost to `error`: count them, and log unless a line was logged less
    /// than [`FAILURE_LOG_EVERY`] ago. True if logged.
    fn failed(
        &mut self,
        path: &Path,
        error: &std::io::Error,
        lines: u64,
        counters: &LogCounters,
    ) -> bool {
        let total = counters.write_errors.fetch_add(lines, Relaxed) + lines;
        let now = std::time::Instant::now();
        if self
            .logged_at
            .is_some_and(|at| now.duration_since(at) < FAILURE_LOG_EVERY)
        {
            self.quiet += 1;
            return false;
        }
        crate::logging::log(
            "request_log_write_failed",
            &[
                ("path", &path.display().to_string()),
                ("error", &error.to_string()),
                ("lines_lost", &lines.to_string()),
                ("lines_lost_total", &total.to_string()),
                ("failures_not_logged", &self.quiet.to_string()),
            ],
        );
        self.logged_at = Some(now);
        self.quiet = 0;
        true
    }
}

fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// `<path>.<i>`
fn rotated(path: &Path, i: u32) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(format!(".{i}"));
    PathBuf::from(s)
}

impl Writer {
    fn open(settings: LogSettings) -> std::io::Result<Writer> {
        let file = open_append(&settings.path)?;
        let meta = file.metadata()?;
        Ok(Writer {
            settings,
            file,
            identity: FileIdentity::of(&meta),
            buf: Vec::with_capacity(BUFFER_BYTES),
            buffered_lines: 0,
            size: meta.len(),
            written: meta.len(),
            failures: FailureReport::default(),
        })
    }

    /// Queue one line, rotating first if it would take the file past `max_bytes`; a failure
    /// is counted and reported.
    fn write_counted(&mut self, r: &LogRecord, counters: &LogCounters) {
        if let Err((e, lost)) = self.write(r) {
            let path = self.settings.path.clone();
            self.failures.failed(&path, &e, lost, counters);
        }
    }

    /// Write what is buffered; a failure is counted and reported.
    fn flush_counted(&mut self, counters: &LogCounters) {
        if let Err((e, lost)) = self.flush() {
            let path = self.settings.path.clone();
            self.failures.failed(&path, &e, lost, counters);
        }
    }

    /// Queue one line; on failure, the error and the lines lost with it.
    fn write(&mut self, r: &LogRecord) -> Result<(), (std::io::Error, u64)> {
        let mut line = serde_json::to_vec(r).map_err(|e| (std::io::Error::other(e), 1))?;
        line.push(b'\n');
        let len = line.len() as u64;
        if self.size > 0 && self.size + len > self.settings.max_bytes {
            self.rotate()?;
        }
        self.buf.extend_from_slice(&line);
        self.buffered_lines += 1;
        self.size += len;
        if self.buf.len() >= BUFFER_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Write the buffered lines to the file. On failure they are lost (and counted by the
    /// caller), and whatever part of them reached the file is cut off again, so that the next
    /// line does not start in the middle of a torn one.
    fn flush(&mut self) -> Result<(), (std::io::Error, u64)> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let lines = std::mem::take(&mut self.buffered_lines);
        let result = self.file.write_all(&self.buf);
        let bytes = self.buf.len() as u64;
        self.buf.clear();
        match result {
            Ok(()) => {
                self.written += bytes;
                Ok(())
            }
            Err(e) => {
                let _ = self.file.set_len(self.written);
                self.size = self.written;
                Err((e, lines))
            }
        }
    }

    /// True if the path still names the file being written.
    fn path_is_ours(&self) -> bool {
        match (std::fs::metadata(&self.settings.path), self.identity) {
            (Ok(m), Some(id)) => FileIdentity::of(&m) == Some(id),
            (Ok(_), None) => true,
            (Err(_), _) => false,
        }
    }

    /// If the live file was moved or deleted, write what is buffered to it and start a new
    /// file at the path.
    fn follow_path(&mut self, counters: &LogCounters) {
        if self.path_is_ours() {
            return;
        }
        self.flush_counted(counters);
        match self.reopen() {
            Ok(()) => crate::logging::log(
                "request_log_reopened",
                &[
                    ("path", &self.settings.path.display().to_string()),
                    ("reason", "the live file was moved or deleted"),
                ],
            ),
            Err(e) => {
                let path = self.settings.path.clone();
                self.failures.failed(&path, &e, 0, counters);
            }
        }
    }

    /// Start writing to the file at the path (created if missing).
    fn reopen(&mut self) -> std::io::Result<()> {
        let file = open_append(&self.settings.path)?;
        let meta = file.metadata()?;
        self.file = file;
        self.identity = FileIdentity::of(&meta);
        self.size = meta.len() + self.buf.len() as u64;
        self.written = meta.len();
        Ok(())
    }

    /// Shift the rotated files up by one (the oldest is overwritten) and start a new file. A
    /// live file that is no longer at the path (moved or deleted) is not rotated: the rotated
    /// files are left as they are and a new file is started, so that the history is never
    /// shifted for a file that is not there.
    fn rotate(&mut self) -> Result<(), (std::io::Error, u64)> {
        self.flush()?;
        let fail = |e| (e, 0);
        if !self.path_is_ours() {
            return self.reopen().map_err(fail);
        }
        let path = self.settings.path.clone();
        for i in (1..self.settings.keep).rev() {
            let from = rotated(&path, i);
            if from.exists() {
                std::fs::rename(&from, rotated(&path, i + 1)).map_err(fail)?;
            }
        }
        if self.settings.keep == 0 {
            std::fs::remove_file(&path).map_err(fail)?;
        } else {
            std::fs::rename(&path, rotated(&path, 1)).map_err(fail)?;
        }
        self.reopen().map_err(fail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(i: u32) -> LogRecord {
        LogRecord {
            arrival_unix_ms: 1_733_050_000_000 + i64::from(i),
            model: "gemma-27b".into(),
            prompt_tokens: 800 + i,
            output_tokens: Some(i),
            prefix_hashes: vec![u64::MAX - u64::from(i), 7],
            worker: Some("pro6000".to_string()),
            status: LogStatus::Ok,
            ttft_ms: Some(412.5),
            e2e_ms: None,
            decision: None,
        }
    }

    fn temp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("routelab-reqlog-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_record_is_one_line_in_the_exact_schema() {
        let line = serde_json::to_string(&record(4)).unwrap();
        assert_eq!(
            line,
            r#"{"arrival_unix_ms":1733050000004,"model":"gemma-27b","prompt_tokens":804,"output_tokens":4,"prefix_hashes":[18446744073709551611,7],"worker":"pro6000","status":"ok","ttft_ms":412.5,"e2e_ms":null}"#
        );
        let none = LogRecord {
            worker: None,
            output_tokens: None,
            e2e_ms: Some(9012.0),
            status: LogStatus::ClientGone,
            ..record(4)
        };
        let line = serde_json::to_string(&none).unwrap();
        assert!(
            line.contains(r#""output_tokens":null,"#)
                && line.contains(r#""worker":null,"status":"client_gone","#)
                && line.ends_with(r#""e2e_ms":9012.0}"#),
            "{line}"
        );
        let explained = LogRecord {
            decision: Some(Box::new(LogDecision {
                reason: "score",
                chosen: LogCandidate {
                    worker: "a".into(),
                    score: Some(0.5),
                    predicted_ttft_ms: Some(120.0),
                    predicted_tpot_ms: Some(25.0),
                },
                runner_up: Some(LogCandidate::new("b".into(), None)),
            })),
            ..record(4)
        };
        let line = serde_json::to_string(&explained).unwrap();
        assert!(
            line.ends_with(
                r#""e2e_ms":null,"decision":{"reason":"score","chosen":{"worker":"a","score":0.5,"predicted_ttft_ms":120.0,"predicted_tpot_ms":25.0},"runner_up":{"worker":"b"}}}"#
            ),
            "{line}"
        );
        for s in LogStatus::ALL {
            let shown = serde_json::to_string(&s).unwrap();
            assert_eq!(shown, format!("\"{}\"", s.as_str()));
        }
    }

    /// Small files, many rotations: `keep` files are kept beside the live one, none larger
    /// than `max_bytes`, every line whole and valid, the newest lines in order; the oldest
    /// lines were dropped with the oldest file.
    #[test]
    fn rotation_keeps_whole_lines_and_at_most_keep_files() {
        let dir = temp("rotate");
        let path = dir.join("requests.jsonl");
        let line_len = serde_json::to_vec(&record(10)).unwrap().len() as u64 + 1;
        let settings = LogSettings {
            path: path.clone(),
            max_bytes: line_len * 3 + line_len / 2,
            keep: 2,
        };
        let mut w = Writer::open(settings.clone()).unwrap();
        for i in 10..50 {
            w.write(&record(i)).map_err(|(e, _)| e).unwrap();
        }
        w.flush().unwrap();
        assert!(!rotated(&path, 3).exists(), "keep: 2");
        let mut seen = Vec::new();
        // 40 lines of equal length, 3 to a file: 13 full files, the last line alone.
        for (p, n) in [
            (rotated(&path, 2), 3),
            (rotated(&path, 1), 3),
            (path.clone(), 1),
        ] {
            let text = std::fs::read_to_string(&p).unwrap();
            assert!(text.len() as u64 <= settings.max_bytes, "{}", p.display());
            assert!(text.ends_with('\n'));
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines.len(), n, "{}: {text}", p.display());
            for l in lines {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                seen.push(v["prompt_tokens"].as_u64().unwrap() - 800);
            }
        }
        assert_eq!(seen, (43..50).collect::<Vec<u64>>());
        // Reopening appends to the live file and counts what it holds.
        let w = Writer::open(settings).unwrap();
        assert_eq!(w.size, line_len);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_line_longer_than_max_bytes_gets_a_file_of_its_own() {
        let dir = temp("long");
        let path = dir.join("r.jsonl");
        let mut w = Writer::open(LogSettings {
            path: path.clone(),
            max_bytes: 10,
            keep: 5,
        })
        .unwrap();
        for i in 0..3 {
            w.write(&record(i)).map_err(|(e, _)| e).unwrap();
        }
        w.flush().unwrap();
        for p in [rotated(&path, 2), rotated(&path, 1), path.clone()] {
            let text = std::fs::read_to_string(&p).unwrap();
            assert_eq!(text.lines().count(), 1, "{text}");
        }
        assert!(!rotated(&path, 3).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn the_thread_writes_what_it_is_sent_and_sync_waits_for_it() {
        let dir = temp("thread");
        let path = dir.join("r.jsonl");
        let log = RequestLog::open(LogSettings {
            path: path.clone(),
            max_bytes: 1 << 20,
            keep: 1,
        })
        .unwrap();
        for i in 0..100 {
            log.send(record(i));
        }
        log.sync().await;
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 100);
        assert_eq!(log.counters().dropped.load(Relaxed), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn lines_in(path: &Path) -> Vec<u64> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                v["prompt_tokens"].as_u64().unwrap() - 800
            })
            .collect()
    }

    /// Regression (issue 30, hardening 5): with the live file deleted, every line that wanted
    /// a rotation shifted `.1 → .2 → …` and then failed to rename the missing file, so each
    /// line written destroyed one more rotated file (581 of 600 lines lost). Now the rotated
    /// files are left as they are and a new live file is started.
    #[test]
    fn a_missing_live_file_is_never_rotated_and_the_history_is_kept() {
        let dir = temp("vanish");
        let path = dir.join("r.jsonl");
        let line_len = serde_json::to_vec(&record(10)).unwrap().len() as u64 + 1;
        let mut w = Writer::open(LogSettings {
            path: path.clone(),
            max_bytes: line_len * 2,
            keep: 3,
        })
        .unwrap();
        let write = |w: &mut Writer, i| w.write(&record(i)).map_err(|(e, _)| e).unwrap();
        for i in 0..8 {
            write(&mut w, i);
        }
        w.flush().unwrap();
        let history: Vec<Vec<u64>> = (1..=3).map(|k| lines_in(&rotated(&path, k))).collect();
        assert_eq!(history, [vec![4, 5], vec![2, 3], vec![0, 1]]);
        std::fs::remove_file(&path).unwrap();
        for i in 8..14 {
            write(&mut w, i);
        }
        w.flush().unwrap();
        // The first line after the deletion found the live file missing and started a new
        // one; the history moved by whole files since, never by a file that was not there.
        let now: Vec<Vec<u64>> = (1..=3).map(|k| lines_in(&rotated(&path, k))).collect();
        assert_eq!(now, [vec![10, 11], vec![8, 9], vec![4, 5]], "{now:?}");
        assert_eq!(lines_in(&path), [12, 13]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Regression (issue 30, hardening 5): lines written after the live file was deleted went
    /// to the deleted file, and were lost; the writer now notices and starts a new file.
    #[tokio::test]
    async fn lines_after_the_live_file_was_moved_go_to_a_new_file_at_the_path() {
        let dir = temp("moved");
        let path = dir.join("r.jsonl");
        let log = RequestLog::open(LogSettings {
            path: path.clone(),
            max_bytes: 1 << 20,
            keep: 1,
        })
        .unwrap();
        for i in 0..5 {
            log.send(record(i));
        }
        log.sync().await;
        std::fs::rename(&path, dir.join("moved.jsonl")).unwrap();
        for i in 5..9 {
            log.send(record(i));
        }
        log.sync().await;
        assert_eq!(lines_in(&dir.join("moved.jsonl")), [0, 1, 2, 3, 4]);
        assert_eq!(lines_in(&path), [5, 6, 7, 8]);
        assert_eq!(log.counters().write_errors.load(Relaxed), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Regression (issue 30, hardening 9): on a full disk every line printed two log lines
    /// (5,946 for 3,000 requests) while lines lost in a failed flush were not counted. Now
    /// every lost line is counted and the failure logged at most once a second.
    #[tokio::test]
    async fn every_line_lost_to_a_full_disk_is_counted() {
        let log = RequestLog::open(LogSettings {
            path: PathBuf::from("/dev/full"),
            max_bytes: 1 << 20,
            keep: 1,
        })
        .unwrap();
        for round in 1..=3u64 {
            for i in 0..100 {
                log.send(record(i));
            }
            log.sync().await;
            assert_eq!(
                log.counters().write_errors.load(Relaxed),
                100 * round,
                "round {round}"
            );
        }
        assert_eq!(log.counters().dropped.load(Relaxed), 0);
    }

    #[test]
    fn write_failures_are_logged_at_most_once_a_second() {
        let counters = LogCounters::default();
        let mut report = FailureReport::default();
        let e = std::io::Error::other("disk full");
        let logged = (0..500)
            .filter(|_| report.failed(Path::new("/x"), &e, 2, &counters))
            .count();
        assert_eq!(logged, 1);
        assert_eq!(counters.write_errors.load(Relaxed), 1000);
        assert_eq!(report.quiet, 499);
    }
}
