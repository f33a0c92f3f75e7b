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
//!   wall time in production, the emulated engine's time under `clock_scale`.
//!
//! Requests refused before routing (a malformed body, an unknown model) are not logged: they
//! carry no model or prompt worth replaying. The prompt's text is never written.
//!
//! **Writing never blocks a request**: the request path hands its record to a dedicated writer
//! thread over a bounded channel ([`CHANNEL_LINES`] records) with `try_send`; when the channel
//! is full the record is dropped and counted (`routelab_gateway_request_log_dropped_total`).
//! A thread rather than a tokio task because file writes and renames are blocking system calls
//! that must not hold a runtime worker. It writes through a `BufWriter`, flushed whenever the
//! channel is empty (so the file lags by at most what is queued) and at shutdown.
//!
//! **Rotation**: a line that would take the file past `max_bytes` first renames it to
//! `<path>.1` (shifting `<path>.1` to `<path>.2` … and dropping `<path>.<keep>`), then starts a
//! new file; a line is never split across files (a single line longer than `max_bytes` gets a
//! file of its own). Every line ends with `\n`.

use routelab_policies::Time;
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
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
}

impl LogStatus {
    /// Every status, as written.
    pub const ALL: [LogStatus; 5] = [
        LogStatus::Ok,
        LogStatus::UpstreamError,
        LogStatus::Timeout,
        LogStatus::Rejected,
        LogStatus::ClientGone,
    ];

    /// The name written in the log.
    pub fn as_str(self) -> &'static str {
        match self {
            LogStatus::Ok => "ok",
            LogStatus::UpstreamError => "upstream_error",
            LogStatus::Timeout => "timeout",
            LogStatus::Rejected => "rejected",
            LogStatus::ClientGone => "client_gone",
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
}

/// Counters of the log, rendered in `/metrics`.
#[derive(Debug, Default)]
pub struct LogCounters {
    /// Records dropped because the writer's channel was full.
    pub dropped: AtomicU64,
    /// Records lost to a failed write.
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
            },
            done: false,
        }
    }

    /// The worker the request is (last) sent to.
    pub fn worker(&mut self, name: &str) {
        self.record.worker = Some(name.to_string());
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
        Msg::Line(r) => {
            if let Err(e) = w.write(&r) {
                counters.write_errors.fetch_add(1, Relaxed);
                crate::log(
                    "request_log_write_failed",
                    &[
                        ("path", &w.settings.path.display().to_string()),
                        ("error", &e.to_string()),
                    ],
                );
            }
        }
        Msg::Sync(ack) => {
            w.flush_logged();
            let _ = ack.send(());
        }
    };
    while let Ok(m) = rx.recv() {
        handle(&mut w, m);
        loop {
            match rx.try_recv() {
                Ok(m) => handle(&mut w, m),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    w.flush_logged();
                    return;
                }
            }
        }
        w.flush_logged();
    }
    w.flush_logged();
}

/// The file and its rotation.
struct Writer {
    settings: LogSettings,
    out: BufWriter<File>,
    /// Bytes in the live file (what is on disk plus what is buffered).
    size: u64,
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
        let size = file.metadata()?.len();
        Ok(Writer {
            settings,
            out: BufWriter::new(file),
            size,
        })
    }

    fn write(&mut self, r: &LogRecord) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(r).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let len = line.len() as u64;
        if self.size > 0 && self.size + len > self.settings.max_bytes {
            self.rotate()?;
        }
        self.out.write_all(&line)?;
        self.size += len;
        Ok(())
    }

    /// Shift the rotated files up by one (the oldest is overwritten) and start a new file.
    fn rotate(&mut self) -> std::io::Result<()> {
        self.out.flush()?;
        let path = self.settings.path.clone();
        for i in (1..self.settings.keep).rev() {
            let from = rotated(&path, i);
            if from.exists() {
                std::fs::rename(&from, rotated(&path, i + 1))?;
            }
        }
        if self.settings.keep == 0 {
            std::fs::remove_file(&path)?;
        } else {
            std::fs::rename(&path, rotated(&path, 1))?;
        }
        self.out = BufWriter::new(open_append(&path)?);
        self.size = 0;
        Ok(())
    }

    fn flush_logged(&mut self) {
        if let Err(e) = self.out.flush() {
            crate::log(
                "request_log_write_failed",
                &[
                    ("path", &self.settings.path.display().to_string()),
                    ("error", &e.to_string()),
                ],
            );
        }
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
            w.write(&record(i)).unwrap();
        }
        w.flush_logged();
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
            w.write(&record(i)).unwrap();
        }
        w.flush_logged();
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
}
