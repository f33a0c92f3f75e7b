//! The engine driver: one [`FluidEngine`] advanced in real time by one OS thread per emulator.
//!
//! Why a thread and not a tokio timer: tokio's timer wheel has a 1 ms resolution, and at a
//! speed-up of 10 a millisecond of lateness is 10 ms of model time on every first token and
//! completion. A dedicated thread waiting on a [`Condvar`] with a timeout wakes within tens of
//! microseconds of the model's next event. It is the only timer of an emulator: it admits
//! requests (after half the round trip), advances the model to "now", paces the token streams
//! (every `tick` of wall time while anything decodes) and publishes each stream's progress half
//! a round trip later through a [`watch`] channel, which wakes the stream's HTTP body. There is
//! no task or timer per token.
//!
//! Model time is `(wall time since the emulator started) × speedup`, in nanoseconds.

use routelab_sim::worker::{Admission, EngineOutput};
use routelab_sim::{FluidEngine, InferenceEngine};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Tokens a decoding sequence of `output` tokens has produced after `decoded` decode steps
/// ([`FluidEngine::decoded_tokens`]): the prefill's step produced the first, decode step `k`
/// produces token `k + 1`. The last one is left to the completion, which delivers it, so this
/// stays below `output` (and at least 1: a decoding sequence has its first token).
fn tokens_out(decoded: f64, output: u32) -> u32 {
    let after_first = decoded.max(0.0).floor().min(f64::from(u32::MAX - 1)) as u32;
    (1 + after_first).min(output.saturating_sub(1)).max(1)
}

/// Wall clock → model clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ModelClock {
    start: Instant,
    speedup: f64,
}

impl ModelClock {
    pub fn new(speedup: f64) -> ModelClock {
        ModelClock {
            start: Instant::now(),
            speedup,
        }
    }

    /// Model time now, ns.
    pub fn now_ns(&self) -> u64 {
        (self.start.elapsed().as_nanos() as f64 * self.speedup) as u64
    }

    /// The wall instant at which the model clock reaches `ns` (a microsecond late rather than
    /// early, so that a wake-up at that instant sees the event as due).
    pub fn wall_at(&self, ns: u64) -> Instant {
        let wall = (ns as f64 / self.speedup).ceil();
        let wall = if wall >= 1e18 { 1e18 } else { wall };
        self.start + Duration::from_nanos(wall as u64 + 1_000)
    }
}

/// What a request's client may see so far (already delayed by half the round trip).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Progress {
    /// Output tokens out (the first one at the first token, all of them at completion).
    pub tokens: u32,
    /// Model time of the first token (as produced by the engine), ns.
    pub first_token_ns: Option<u64>,
    /// All tokens are out.
    pub done: bool,
    /// Prompt tokens served from the engine's prefix cache.
    pub cached_tokens: u32,
    /// The engine went away (killed): the request cannot finish.
    pub failed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// On its way to the engine (half a round trip).
    InTransit,
    /// Waiting or prefilling inside the engine.
    Engine,
    /// Decoding: paced by the driver.
    Decoding,
    /// Completed inside the engine; the last delivery may still be on its way.
    Finished,
}

struct Stream {
    tx: watch::Sender<Progress>,
    prompt: u32,
    output: u32,
    blocks: Vec<u64>,
    phase: Phase,
    /// Tokens produced so far (before the return delay).
    produced: u32,
    /// Model time of its first token.
    first_at: u64,
}

#[derive(Debug, Clone, Copy)]
enum Update {
    First { at: u64, cached: u32 },
    Tokens(u32),
    Done { cached: u32 },
}

/// Counters for `/emulator/stats` and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverCounters {
    /// Requests handed to the engine.
    pub admitted: u64,
    /// Requests whose last token came out.
    pub completed: u64,
    /// Requests whose client went away before the end (taken out of the engine).
    pub aborted: u64,
    /// Prompt tokens of the requests handed to the engine.
    pub prompt_tokens: u64,
    /// Output tokens the engine produced.
    pub generation_tokens: u64,
    /// Prompt tokens of the completed requests (vLLM's `request_prompt_tokens` sum; the count
    /// is `completed`).
    pub completed_prompt_tokens: u64,
    /// Output tokens of the completed requests (vLLM's `request_generation_tokens` sum).
    pub completed_generation_tokens: u64,
    /// Model time the completed requests spent decoding, first token to last, ns (vLLM's
    /// `request_decode_time_seconds` sum).
    pub completed_decode_ns: u64,
}

struct State {
    engine: FluidEngine,
    stop: bool,
    next_seq: u64,
    /// Last model time handed to the engine.
    engine_ns: u64,
    /// (admission time, seq)
    pending: BinaryHeap<Reverse<(u64, u64)>>,
    streams: HashMap<u64, Stream>,
    /// (delivery time, seq, update), in non-decreasing delivery time.
    deliveries: VecDeque<(u64, u64, Update)>,
    outputs: Vec<EngineOutput>,
    counters: DriverCounters,
    /// Where the engine's KV events go, when they are published.
    kv_tx: Option<tokio::sync::mpsc::UnboundedSender<Vec<routelab_policies::KvEvent>>>,
    kv_buf: Vec<routelab_policies::KvEvent>,
}

/// Shared between the driver thread, the HTTP handlers and the handle.
pub(crate) struct Driver {
    pub clock: ModelClock,
    half_rtt_ns: u64,
    tick: Duration,
    state: Mutex<State>,
    cv: Condvar,
}

/// A snapshot of the engine for `/emulator/stats`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineSnapshot {
    /// Model time, s.
    pub model_time_s: f64,
    /// Sequences in the engine (running + waiting).
    pub in_flight: u32,
    /// Running (prefilling or decoding).
    pub running: u32,
    /// Decoding (past their first token).
    pub decoding: u32,
    /// Waiting inside the engine.
    pub waiting: u32,
    /// Requests on their way in (half a round trip) or streaming out.
    pub streams: u32,
    /// Whether the cold-start penalty is over.
    pub warm: bool,
    /// Counters.
    pub counters: DriverCounters,
    /// KV tokens the running sequences hold (as vLLM's metrics show KV use).
    pub kv_allocated_tokens: u64,
    /// The engine's KV capacity in tokens.
    pub kv_capacity_tokens: u64,
    /// Output tokens per second the engine generates now (the simulator's engine report).
    pub generation_tok_s: f64,
    /// Prompt tokens of the requests waiting inside the engine.
    pub waiting_prompt_tokens: u64,
    /// The requests whose prompts `waiting_prompt_tokens` counts: those waiting for room and
    /// those admitted while a step ran, not yet in one (what the engine's metrics show waiting,
    /// as the simulator's engine report counts them).
    pub queued: u32,
}

impl Driver {
    pub fn new(engine: FluidEngine, clock: ModelClock, half_rtt_ns: u64, tick: Duration) -> Self {
        Driver {
            clock,
            half_rtt_ns,
            tick,
            state: Mutex::new(State {
                engine,
                stop: false,
                next_seq: 1,
                engine_ns: 0,
                pending: BinaryHeap::new(),
                streams: HashMap::new(),
                deliveries: VecDeque::new(),
                outputs: Vec::new(),
                counters: DriverCounters::default(),
                kv_tx: None,
                kv_buf: Vec::new(),
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// From now on send the engine's KV events (as its cache records them) to `tx`, one vector
    /// per processing round.
    pub fn publish_kv(
        &self,
        tx: tokio::sync::mpsc::UnboundedSender<Vec<routelab_policies::KvEvent>>,
    ) {
        let mut st = self.lock();
        st.engine.publish_kv_events(true);
        st.kv_tx = Some(tx);
    }

    /// Start the driver thread.
    pub fn spawn(self: &Arc<Self>, name: &str) -> std::io::Result<std::thread::JoinHandle<()>> {
        let me = self.clone();
        std::thread::Builder::new()
            .name(format!("emulator-{name}"))
            .spawn(move || me.run())
    }

    /// A request that arrived at model time `arrived_ns` (when the server received it, before
    /// parsing) reaches the engine half a round trip later. Returns its id (for
    /// [`Self::abort`]) and its progress channel, or `None` if the engine is stopped.
    pub fn submit(
        &self,
        arrived_ns: u64,
        prompt: u32,
        output: u32,
        blocks: Vec<u64>,
    ) -> Option<(u64, watch::Receiver<Progress>)> {
        let mut st = self.lock();
        if st.stop {
            return None;
        }
        let now = arrived_ns.max(st.engine_ns);
        let seq = st.next_seq;
        st.next_seq += 1;
        let (tx, rx) = watch::channel(Progress::default());
        st.streams.insert(
            seq,
            Stream {
                tx,
                prompt,
                output,
                blocks,
                phase: Phase::InTransit,
                produced: 0,
                first_at: 0,
            },
        );
        st.pending.push(Reverse((now + self.half_rtt_ns, seq)));
        drop(st);
        self.cv.notify_one();
        Some((seq, rx))
    }

    /// The client of request `seq` went away before its end: forget its stream and take it out
    /// of the engine at once (as vLLM aborts a request whose connection closed), so that its
    /// batch slot and KV are free for the others. A request already finished is left alone.
    pub fn abort(&self, seq: u64) {
        let mut st = self.lock();
        let Some(stream) = st.streams.remove(&seq) else {
            return;
        };
        st.counters.aborted += 1;
        // In transit: its admission finds no stream and is skipped. Finished: only its last
        // delivery was pending, which finds no stream either.
        if matches!(stream.phase, Phase::Engine | Phase::Decoding) {
            let now = self.clock.now_ns().max(st.engine_ns);
            st.engine_ns = now;
            st.engine.abort(now, seq);
        }
        drop(st);
        // The engine's next event moved (the others speed up).
        self.cv.notify_one();
    }

    /// Stop the thread; every unfinished request is marked failed.
    pub fn stop(&self) {
        let mut st = self.lock();
        st.stop = true;
        drop(st);
        self.cv.notify_one();
    }

    pub fn snapshot(&self) -> EngineSnapshot {
        let st = self.lock();
        let now = self.clock.now_ns().max(st.engine_ns);
        EngineSnapshot {
            model_time_s: now as f64 / 1e9,
            in_flight: st.engine.in_flight(),
            running: st.engine.running(),
            decoding: st.engine.decoding(),
            waiting: st.engine.waiting(),
            streams: st.streams.len() as u32,
            warm: st.engine.is_warm(),
            counters: st.counters,
            kv_allocated_tokens: st.engine.kv_allocated_tokens(now),
            kv_capacity_tokens: st.engine.kv_capacity_tokens(),
            generation_tok_s: st.engine.generation_tok_s(),
            waiting_prompt_tokens: st.engine.waiting_prompt_tokens(),
            queued: st.engine.queued(),
        }
    }

    fn run(&self) {
        let mut st = self.lock();
        loop {
            if st.stop {
                break;
            }
            let now = self.clock.now_ns().max(st.engine_ns);
            self.process(&mut st, now);
            if st.kv_tx.is_some() {
                let State {
                    engine,
                    kv_tx,
                    kv_buf,
                    ..
                } = &mut *st;
                engine.drain_kv_events(kv_buf);
                if !kv_buf.is_empty()
                    && let Some(tx) = kv_tx
                {
                    let _ = tx.send(std::mem::take(kv_buf));
                }
            }
            match self.next_wakeup(&st) {
                None => st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner()),
                Some(at) => {
                    let wait = at.saturating_duration_since(Instant::now());
                    if !wait.is_zero() {
                        st = self
                            .cv
                            .wait_timeout(st, wait)
                            .unwrap_or_else(|p| p.into_inner())
                            .0;
                    }
                }
            }
        }
        for (_, s) in st.streams.drain() {
            s.tx.send_modify(|p| p.failed = true);
        }
        st.pending.clear();
        st.deliveries.clear();
    }

    fn next_wakeup(&self, st: &State) -> Option<Instant> {
        let mut model: Option<u64> = st.engine.next_event_time();
        let mut consider = |t: u64| model = Some(model.map_or(t, |m| m.min(t)));
        if let Some(Reverse((t, _))) = st.pending.peek() {
            consider(*t);
        }
        if let Some((t, _, _)) = st.deliveries.front() {
            consider(*t);
        }
        let mut wall = model.map(|t| self.clock.wall_at(t));
        if st.streams.values().any(|s| s.phase == Phase::Decoding) {
            let tick = Instant::now() + self.tick;
            wall = Some(wall.map_or(tick, |w| w.min(tick)));
        }
        wall
    }

    /// Everything due at or before `now`, in time order.
    fn process(&self, st: &mut State, now: u64) {
        let half = self.half_rtt_ns;
        // admissions (each at its own time, after the engine's earlier events)
        while let Some(&Reverse((at, seq))) = st.pending.peek() {
            if at > now {
                break;
            }
            st.pending.pop();
            let at = at.max(st.engine_ns);
            self.advance(st, at);
            let State {
                engine,
                streams,
                counters,
                ..
            } = &mut *st;
            if let Some(s) = streams.get_mut(&seq) {
                engine.admit(at, Admission::new(seq, s.prompt, s.output, &s.blocks));
                s.phase = Phase::Engine;
                counters.admitted += 1;
                counters.prompt_tokens += u64::from(s.prompt);
            }
        }
        self.advance(st, now);
        // pacing: token k + 1 comes out with decode step k after the first token
        let State {
            engine,
            streams,
            deliveries,
            counters,
            ..
        } = &mut *st;
        for (&seq, s) in streams.iter_mut() {
            if s.phase != Phase::Decoding {
                continue;
            }
            if let Some(d) = engine.decoded_tokens(now, seq) {
                let n = tokens_out(d, s.output);
                if n > s.produced {
                    counters.generation_tokens += u64::from(n - s.produced);
                    s.produced = n;
                    deliveries.push_back((now + half, seq, Update::Tokens(n)));
                }
            }
        }
        // deliveries due
        while let Some(&(at, seq, update)) = st.deliveries.front() {
            if at > now {
                break;
            }
            st.deliveries.pop_front();
            let Some(s) = st.streams.get_mut(&seq) else {
                continue;
            };
            let output = s.output;
            let finished = matches!(update, Update::Done { .. });
            s.tx.send_if_modified(|p| match update {
                Update::First { at, cached } => {
                    p.first_token_ns = Some(at);
                    p.cached_tokens = cached;
                    p.tokens = p.tokens.max(1);
                    true
                }
                Update::Tokens(n) => {
                    if n > p.tokens {
                        p.tokens = n;
                        true
                    } else {
                        false
                    }
                }
                Update::Done { cached } => {
                    p.tokens = output;
                    p.cached_tokens = cached;
                    p.done = true;
                    true
                }
            });
            if finished {
                st.streams.remove(&seq);
            }
        }
    }

    /// Moves the engine to `t` and queues the deliveries of what happened.
    fn advance(&self, st: &mut State, t: u64) {
        let half = self.half_rtt_ns;
        st.engine_ns = st.engine_ns.max(t);
        let State {
            engine,
            outputs,
            streams,
            deliveries,
            counters,
            ..
        } = st;
        engine.advance_to(t, outputs);
        for o in outputs.drain(..) {
            let seq = o.seq();
            let Some(s) = streams.get_mut(&seq) else {
                continue;
            };
            match o {
                EngineOutput::FirstToken {
                    at, cached_tokens, ..
                } => {
                    s.phase = Phase::Decoding;
                    counters.generation_tokens += u64::from(1u32.saturating_sub(s.produced));
                    s.produced = 1;
                    s.first_at = at;
                    deliveries.push_back((
                        at + half,
                        seq,
                        Update::First {
                            at,
                            cached: cached_tokens,
                        },
                    ));
                }
                EngineOutput::Completed(c) => {
                    s.phase = Phase::Finished;
                    counters.generation_tokens += u64::from(s.output.saturating_sub(s.produced));
                    s.produced = s.output;
                    counters.completed += 1;
                    counters.completed_prompt_tokens += u64::from(s.prompt);
                    counters.completed_generation_tokens += u64::from(s.output);
                    counters.completed_decode_ns += c.at.saturating_sub(s.first_at);
                    deliveries.push_back((
                        c.at + half,
                        seq,
                        Update::Done {
                            cached: c.cached_tokens,
                        },
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use routelab_sim::worker::EngineOverrides;

    #[test]
    fn token_k_plus_one_comes_with_decode_step_k() {
        // 5 tokens: the first from the prefill, tokens 2..=4 at steps 1..=3, the fifth with the
        // completion at step 4
        let at = |d: f64| tokens_out(d, 5);
        assert_eq!(
            [
                at(0.0),
                at(0.99),
                at(1.0),
                at(2.5),
                at(3.0),
                at(3.99),
                at(4.0)
            ],
            [1, 1, 2, 3, 4, 4, 4]
        );
        // two tokens: the second only with the completion
        assert_eq!((tokens_out(0.0, 2), tokens_out(0.999, 2)), (1, 1));
        assert_eq!(tokens_out(f64::MAX, 7), 6);
    }

    /// Driven by the engine: every token of a 5-token output comes out one decode step after
    /// the one before, the first at the prefill's end, 5 in all.
    #[test]
    fn an_n_token_output_streams_n_tokens_one_step_apart() {
        let profile = Arc::new(
            routelab_sim::HardwareProfile::from_yaml_str(
                "name: t\ndecode:\n  points:\n    - { concurrency: 1, aggregate_tok_s: 100 }\n\
                 prefill_tok_s: 1000\nkv_capacity_tokens: 100000\nmax_running: 8\n\
                 context_window: 1024\n",
                "t.yaml",
            )
            .unwrap(),
        );
        let mut engine = FluidEngine::new(profile, EngineOverrides::default(), 1);
        engine.admit(0, Admission::new(1, 100, 5, &[]));
        let mut out = Vec::new();
        let first = engine.next_event_time().unwrap();
        engine.advance_to(first, &mut out);
        // 100 prompt tokens at 1,000 tok/s
        assert_eq!(out[0].at(), 100_000_000);
        let step_ns = 10_000_000; // 100 tok/s alone
        let mut emitted = vec![first];
        let mut produced = 1;
        for t in (first..first + 5 * step_ns).step_by(1_000_000) {
            if let Some(d) = engine.decoded_tokens(t, 1) {
                let n = tokens_out(d, 5);
                if n > produced {
                    produced = n;
                    emitted.push(t);
                }
            }
        }
        out.clear();
        let done = engine.next_event_time().unwrap();
        engine.advance_to(done, &mut out);
        assert!(matches!(out[0], EngineOutput::Completed(_)));
        emitted.push(done);
        assert_eq!(emitted.len(), 5, "{emitted:?}");
        for (k, w) in emitted.windows(2).enumerate() {
            assert!(w[1] - w[0] <= step_ns + 1, "token {}: {w:?}", k + 2);
            assert!(w[1] - w[0] + 1_000_000 >= step_ns, "token {}: {w:?}", k + 2);
        }
        assert!(
            (done - first).abs_diff(4 * step_ns) <= 1,
            "{}",
            done - first
        );
    }
}
