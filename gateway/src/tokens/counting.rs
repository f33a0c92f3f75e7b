//! The counting threads: a lane for small prompts and one for large ones, each with a bounded
//! queue and a wait deadline, so a big prompt cannot delay a small one.

use super::CountError;
use std::sync::Arc;

/// The threads that count prompts for the request path, in two lanes, started at the first
/// count and ending when the last clone of the [`Tokenizers`] goes.
///
/// One thread per core counts small prompts (bodies up to [`SMALL_BODY`]); a separate half of
/// the cores (at least one thread) counts large ones, behind a queue of [`LARGE_QUEUE`] per
/// thread: a few clients sending megabyte prompts then take the large lane only, and a short
/// request is counted as soon as a small-lane thread is free (the probe's "hello" waited 6-10 s
/// behind four 1 MB prompts when both shared one queue). A large prompt that finds the queue
/// full, or whose count waited more than [`COUNT_WAIT`], is answered 503 with `Retry-After`.
///
/// Why fixed threads at all: counts used to run on tokio's blocking pool, where every count
/// that found no idle thread started one more (up to 512): a stall of a few milliseconds at 400
/// req/s left the pool a dozen threads larger, each with its own glibc malloc arena holding the
/// tokenizer's garbage, and the gateway's RSS rose a step at every stall (+0.11 MiB/min over a
/// 29-minute soak, with the live heap flat).
#[derive(Debug)]
pub(super) struct Counting {
    threads: usize,
    small: std::sync::OnceLock<Result<Lane, String>>,
    large: std::sync::OnceLock<Result<Lane, String>>,
    /// Where request bodies over [`SMALL_BODY`] are parsed ([`Counting::read`]).
    reading: std::sync::OnceLock<Result<Lane, String>>,
    /// The threads that ran a count (for the tests).
    #[cfg(test)]
    pub(super) seen: std::sync::Mutex<std::collections::HashSet<std::thread::ThreadId>>,
}

/// Bodies up to this many bytes count in the small lane (a 64 KiB prompt is about 16k tokens,
/// a few milliseconds of counting).
pub const SMALL_BODY: usize = 64 << 10;
/// Large counts waiting per large-lane thread before a large prompt is refused.
pub const LARGE_QUEUE: usize = 2;
/// Small counts waiting before a small prompt is refused (the bodies are held by their
/// requests anyway; this bounds the queue, not the memory).
pub const SMALL_QUEUE: usize = 4096;
/// Large bodies waiting per reading thread before one is parsed on the executor after all.
pub const READ_QUEUE: usize = 8;
/// How much lower than the executor's the bulk lanes' threads run (the large counting lane and
/// the reading lane; a `nice` increment). On 2 cores the reading threads parsing four clients'
/// 1 MiB prompts took 64 % of a core at the executor's priority, and a short request's added p99
/// was 9.8 ms (issue 42's hostile run, bound 5 ms): below it, the short request's turns come
/// first and the big prompts take what is left. The small lane keeps the executor's priority:
/// the short request is counted there.
pub const BULK_NICENESS: i32 = 10;
/// Longest a count may wait for a thread before it is refused instead of started.
pub const COUNT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

pub(super) type CountJob = Box<dyn FnOnce() + Send>;

/// One lane's queue (its threads end when it is dropped).
#[derive(Debug)]
struct Lane(std::sync::mpsc::SyncSender<CountJob>);

impl Lane {
    fn start(name: &str, threads: usize, queue: usize, niceness: i32) -> Result<Lane, String> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<CountJob>(queue);
        let rx = Arc::new(std::sync::Mutex::new(rx));
        for i in 0..threads {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("routelab-count-{name}-{i}"))
                .spawn(move || {
                    lower_priority(niceness);
                    loop {
                        let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                        let Ok(job) = next else { return };
                        // A count that panics fails its request (its answer is dropped
                        // unsent), not the thread.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    }
                })
                .map_err(|e| format!("cannot start a counting thread: {e}"))?;
        }
        Ok(Lane(tx))
    }
}

/// Run the calling thread `niceness` below the process's priority (Linux: `setpriority` on the
/// thread's id applies to that thread only). Raising one's own nice value needs no privilege,
/// so it does not fail in practice; if it did, the thread would run at the executor's priority,
/// as it did before, which costs latency, not correctness, so the error is not reported.
fn lower_priority(niceness: i32) {
    if niceness == 0 {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        let tid = rustix::thread::gettid();
        let now = rustix::process::getpriority_process(Some(tid)).unwrap_or(0);
        let _ = rustix::process::setpriority_process(Some(tid), now.saturating_add(niceness));
    }
}

impl Counting {
    pub(super) fn new(threads: usize) -> Counting {
        Counting {
            threads: threads.max(1),
            small: std::sync::OnceLock::new(),
            large: std::sync::OnceLock::new(),
            reading: std::sync::OnceLock::new(),
            #[cfg(test)]
            seen: Default::default(),
        }
    }

    /// Run `job` on a thread of the lane for a body of `body_len` bytes (started now if this is
    /// the lane's first job); why not, when the lane is full or could not be started.
    pub(super) fn run(&self, body_len: usize, job: CountJob) -> Result<(), CountError> {
        let lane = if body_len <= SMALL_BODY {
            self.small
                .get_or_init(|| Lane::start("small", self.threads, SMALL_QUEUE, 0))
        } else {
            let n = (self.threads / 2).max(1);
            self.large
                .get_or_init(|| Lane::start("large", n, n * LARGE_QUEUE, BULK_NICENESS))
        };
        let lane = lane.as_ref().map_err(|e| CountError::Busy(e.clone()))?;
        lane.0.try_send(job).map_err(|e| match e {
            std::sync::mpsc::TrySendError::Full(_) => CountError::Busy(format!(
                "every thread counting {} prompts is busy and its queue is full; retry shortly",
                if body_len <= SMALL_BODY {
                    "small"
                } else {
                    "large"
                }
            )),
            std::sync::mpsc::TrySendError::Disconnected(_) => {
                CountError::Busy("the counting threads are gone".to_string())
            }
        })
    }
}

impl Counting {
    /// Run `job`, the parse of a body over [`SMALL_BODY`], on a reading thread (half the cores,
    /// at least one; started at the first). Parsing a megabyte of JSON takes 3-5 ms of CPU:
    /// on the executor it held up every other request's turn (issue 42's hostile run: a short
    /// request's added p99 was 91 ms behind four clients of 1 MiB prompts). The job back when
    /// the lane is full or cannot start: the caller parses on its own thread then (slower for
    /// the others, never a refusal).
    pub(super) fn read(&self, job: CountJob) -> Result<(), CountJob> {
        let n = (self.threads / 2).max(1);
        let Ok(lane) = self
            .reading
            .get_or_init(|| Lane::start("read", n, n * READ_QUEUE, BULK_NICENESS))
        else {
            return Err(job);
        };
        lane.0.try_send(job).map_err(|e| match e {
            std::sync::mpsc::TrySendError::Full(job)
            | std::sync::mpsc::TrySendError::Disconnected(job) => job,
        })
    }
}

impl Default for Counting {
    /// One thread per core.
    fn default() -> Counting {
        Counting::new(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The nice value of the thread that runs a job on `lane` of a fresh [`Counting`].
    fn niceness_on(body_len: Option<usize>) -> i32 {
        let counting = Counting::new(2);
        let (tx, rx) = std::sync::mpsc::channel();
        let job: CountJob = Box::new(move || {
            let tid = rustix::thread::gettid();
            let _ = tx.send(rustix::process::getpriority_process(Some(tid)).expect("readable"));
        });
        match body_len {
            Some(len) => counting.run(len, job).expect("queued"),
            None => counting.read(job).map_err(|_| "full").expect("queued"),
        }
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the job ran")
    }

    #[test]
    fn the_bulk_lanes_run_below_the_small_lane() {
        let own = rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap();
        let small = niceness_on(Some(100));
        assert_eq!(small, own, "the small lane keeps the caller's priority");
        let expected = (own + BULK_NICENESS).min(19);
        assert_eq!(niceness_on(Some(SMALL_BODY + 1)), expected, "large lane");
        assert_eq!(niceness_on(None), expected, "reading lane");
    }
}
