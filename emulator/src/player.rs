//! The real-time player: a scenario's traffic replayed against a running gateway.
//!
//! Each [`Arrival`] becomes a streaming chat request sent at `arrival time / speedup` of wall
//! time after the start, with `max_tokens` = `min_tokens` = the arrival's output tokens,
//! `ignore_eos: true`, the `prompt_tokens` hint (exact length for an emulator), and a prompt of
//! `4 × prompt_tokens` bytes once rendered (so the gateway's `bytes / 4` estimate is the
//! arrival's length) whose leading 2,048-byte blocks reproduce the arrival's prefix blocks:
//! block `i` is spelled from the arrival's chain hash `i`, so two arrivals that share their
//! first `k` block hashes share their first `k` blocks of text, and the gateway's prefix
//! affinity (and an emulator's prefix cache) see the same sharing the simulator sees. Bytes not
//! covered by prefix blocks are unique to the request.
//!
//! Times are measured in **scenario time** (wall × speedup): TTFT from the moment the request
//! is sent to its first content chunk, end-to-end to `data: [DONE]`. Closed-loop and multi-turn
//! sources get their follow-ups through [`TrafficSource::on_complete`] at the scenario time the
//! request finished. The worker that served a request is read from the gateway's
//! `x-routelab-worker` response header.

use crate::server::EmulatorError;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use routelab_gateway::prompt::{BLOCK_BYTES, BYTES_PER_TOKEN};
use routelab_gateway::proxy::WORKER_HEADER;
use routelab_policies::streams::splitmix64;
use routelab_policies::{Provenance, Time};
use routelab_sim::record::{Outcome, Recorder, Status};
use routelab_sim::traffic::{Arrival, TrafficSource};
use routelab_sim::{RequestRecord, RunMetrics, Scenario, WorkerTotals};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

pub(crate) type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// How to play.
#[derive(Debug, Clone)]
pub struct PlayOptions {
    /// Scenario time runs this many times faster than wall time.
    pub speedup: f64,
    /// Bearer token of the gateway's admin API: final weights and provenances are read from
    /// `GET /admin/workers` at the end when given.
    pub admin_token: Option<String>,
    /// Most requests in flight at once; an arrival beyond it waits (and its latency counts
    /// from when it is sent).
    pub max_in_flight: usize,
    /// Wall-time limit of one request (a request over it is cut and counted failed).
    pub request_timeout: Duration,
    /// Wall-time limit of the whole play (from the origin): no arrival is sent after it, and
    /// whatever is still in flight then is cut and counted failed ("timed out"). Default: the scenario's `max_duration_s` (if
    /// set) / speedup + the request timeout, else one hour.
    pub deadline: Option<Duration>,
    /// Scenario time zero (default: when `play` starts). Pass the instant the gateway started
    /// so that its registration probes and the traffic share one time axis.
    pub origin: Option<Instant>,
    /// Name put in [`RunMetrics::policy`] (empty: the gateway's, when an admin token is given).
    pub policy: String,
    /// Further gateway replicas (base URLs) behind a round-robin balancer with the gateway
    /// given to [`play_with`]: request k, in the order requests are sent (follow-ups
    /// included), goes to the (k mod (1 + n))-th of the gateway and these, as the simulator's
    /// `gateways: {split: round-robin}` sends the k-th arrival. Empty (default): every request
    /// to the gateway. The admin API read at the end is the gateway's.
    pub replicas: Vec<String>,
}

impl PlayOptions {
    /// Defaults: no admin token, 1,024 in flight, 300 s per request, no policy name.
    pub fn new(speedup: f64) -> PlayOptions {
        PlayOptions {
            speedup,
            admin_token: None,
            max_in_flight: 1024,
            request_timeout: Duration::from_secs(300),
            deadline: None,
            origin: None,
            policy: String::new(),
            replicas: Vec::new(),
        }
    }

    /// The options' ranges: a speedup that is a finite number > 0, room for a request.
    fn check(&self) -> Result<(), PlayError> {
        if !(self.speedup.is_finite() && self.speedup > 0.0) {
            return Err(PlayError::Invalid(format!(
                "speedup = {}: must be a finite number > 0",
                self.speedup
            )));
        }
        if self.max_in_flight == 0 {
            return Err(PlayError::Invalid("max_in_flight must be > 0".into()));
        }
        Ok(())
    }

    /// Wall time from the origin to the deadline: the one given, else the scenario's time
    /// limit (scaled by the speedup) plus a request's timeout, else an hour.
    fn play_time(&self, time_limit_ns: Option<u64>) -> Duration {
        self.deadline.unwrap_or_else(|| match time_limit_ns {
            Some(limit) => {
                Duration::from_secs_f64(limit as f64 / 1e9 / self.speedup) + self.request_timeout
            }
            None => Duration::from_secs(3600),
        })
    }
}

/// One request as the player saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlayedRequest {
    /// The row `routelab run` would write (`believed_cached_tokens` from the gateway's
    /// `x-routelab-believed-cached-tokens` header; `queue_s` and `affinity_kept` are not
    /// observable from a client: 0 / false).
    pub record: RequestRecord,
    /// HTTP status from the gateway (`None`: no answer at all).
    pub http_status: Option<u16>,
    /// The gateway answered 200 and started the stream.
    pub streamed: bool,
    /// The stream ended with an SSE `error` event.
    pub sse_error: bool,
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// The prompt tokens the engine counted (`usage.prompt_tokens` of the stream), when it
    /// said: the engine's tokenizer, where the row's `prompt_tokens` is the length asked for.
    pub engine_prompt_tokens: Option<u32>,
}

/// Everything a play measured.
#[derive(Debug, Clone)]
pub struct PlayReport {
    /// The same metrics as a simulator run (see [`play`] for what cannot be observed).
    pub metrics: RunMetrics,
    /// One entry per request, in order of arrival.
    pub requests: Vec<PlayedRequest>,
}

/// Errors of a play.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlayError {
    /// The scenario's traffic failed.
    #[error(transparent)]
    Traffic(#[from] routelab_sim::traffic::TrafficError),
    /// The gateway URL or an option is unusable.
    #[error("{0}")]
    Invalid(String),
    /// Setting up an emulator failed.
    #[error(transparent)]
    Emulator(#[from] EmulatorError),
}

/// Replay `scenario`'s traffic for `seed` against the gateway at `gateway` (base URL, e.g.
/// `http://127.0.0.1:8080`) in real time divided by `speedup`, and measure it as
/// [`routelab_sim::run`] would. See [`play_with`].
pub async fn play(
    scenario: &Scenario,
    seed: u64,
    gateway: &str,
    speedup: f64,
) -> Result<RunMetrics, PlayError> {
    Ok(
        play_with(scenario, seed, gateway, &PlayOptions::new(speedup))
            .await?
            .metrics,
    )
}

/// Replay with options; returns the metrics and the per-request outcomes.
///
/// Filled like a simulator run: `requests`, `completed`, `failed`, `rejected` (gateway 4xx
/// other than 429), the TTFT / end-to-end / TPOT histograms and SLO attainment (the scenario's
/// SLO), output / prompt / cached tokens (cached from `usage.prompt_tokens_details`), first
/// arrival and last completion, per-worker requests / completed / failed / output tokens /
/// TTFT and e2e sums, and (with an admin token) final weights and provenances plus probe bursts
/// (from `/metrics`), `believed_cached_tokens` (the gateway's response header). Not observable
/// from a client, left at 0 / empty: `retried`, the gateway queue histogram,
/// `probe_measurements`, `probe_gpu_s`, the timeline, `events`.
pub async fn play_with(
    scenario: &Scenario,
    seed: u64,
    gateway: &str,
    opts: &PlayOptions,
) -> Result<PlayReport, PlayError> {
    opts.check()?;
    let base = gateway.trim_end_matches('/').to_string();
    let urls = std::iter::once(gateway)
        .chain(opts.replicas.iter().map(String::as_str))
        .map(|g| {
            format!("{}/v1/chat/completions", g.trim_end_matches('/'))
                .parse::<hyper::Uri>()
                .map_err(|e| PlayError::Invalid(format!("gateway URL `{g}`: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut source = scenario.traffic_source(seed)?;
    let setup = scenario.setup_for_seed(seed);
    let k = opts.speedup;
    let origin = opts.origin.unwrap_or_else(Instant::now);
    let scen_ns = |t: Instant| (t.saturating_duration_since(origin).as_nanos() as f64 * k) as u64;
    let wall_at = |ns: u64| origin + Duration::from_secs_f64(ns as f64 / 1e9 / k);
    let deadline = origin + opts.play_time(setup.time_limit_ns());
    let client = http_client(opts.max_in_flight);

    let mut acc = Accumulator::new(&opts.policy, &setup);
    let mut next_open = source.next_arrival()?;
    // follow-ups of closed-loop / multi-turn sources, by (time, order)
    let mut follow_ups: BTreeMap<(u64, u64), Arrival> = BTreeMap::new();
    let mut follow_seq = 0u64;
    let mut tasks: JoinSet<Observed> = JoinSet::new();
    let mut next_id = 0u64;
    let mut cut_off = false;

    loop {
        // the earliest pending arrival
        let next_at = match (&next_open, follow_ups.keys().next()) {
            (Some(a), Some(&(t, _))) => Some(a.at.min(t)),
            (Some(a), None) => Some(a.at),
            (None, Some(&(t, _))) => Some(t),
            (None, None) => None,
        };
        if next_at.is_none() && tasks.is_empty() {
            break;
        }
        let room = tasks.len() < opts.max_in_flight;
        if let Some(at) = next_at
            && room
            && !cut_off
            && wall_at(at) <= Instant::now()
        {
            let a = if next_open.as_ref().is_some_and(|a| a.at == at) {
                let a = next_open.take().expect("checked");
                next_open = source.next_arrival()?;
                a
            } else {
                follow_ups.pop_first().expect("checked").1
            };
            let id = next_id;
            next_id += 1;
            let body = request_body(&setup.model, &a, id);
            let req = Pending {
                id,
                arrival: a,
                client: client.clone(),
                url: urls[(id % urls.len() as u64) as usize].clone(),
                body,
                timeout_at: (Instant::now() + opts.request_timeout).min(deadline),
            };
            tasks.spawn(req.run());
            continue;
        }
        if cut_off && tasks.is_empty() {
            break;
        }
        let sleep_to = match next_at {
            Some(at) if room && !cut_off => wall_at(at).min(deadline),
            _ => deadline,
        };
        tokio::select! {
            joined = tasks.join_next(), if !tasks.is_empty() => {
                if let Some(Ok(o)) = joined {
                    let done_ns = scen_ns(o.finished);
                    let tag = o.arrival.tag;
                    acc.record(o, &scen_ns);
                    if let Some(f) = source.on_complete(done_ns, tag) && !cut_off {
                        follow_seq += 1;
                        follow_ups.insert((f.at, follow_seq), f);
                    }
                }
            }
            _ = tokio::time::sleep_until(sleep_to.into()), if !cut_off => {
                if Instant::now() >= deadline {
                    // out of time: send nothing more; what is in flight ends by the deadline
                    cut_off = true;
                }
            }
        }
    }
    let end_ns = scen_ns(Instant::now());
    Ok(final_report(acc, end_ns, &client, &base, opts.admin_token.as_deref()).await)
}

/// The player's HTTP client: a connection kept per request in flight, no Nagle delay.
pub(crate) fn http_client(max_in_flight: usize) -> HttpClient {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(max_in_flight)
        .build({
            let mut c = HttpConnector::new();
            c.set_nodelay(true);
            c
        })
}

/// The report, with the gateway's policy, weights and probe bursts when the admin API can be
/// read (`admin_token`).
async fn final_report(
    mut acc: Accumulator,
    end_ns: u64,
    client: &HttpClient,
    base: &str,
    admin_token: Option<&str>,
) -> PlayReport {
    let (admin, probes) = match admin_token {
        Some(token) => (
            admin_workers(client, base, token).await,
            probe_bursts(client, base).await,
        ),
        None => (None, HashMap::new()),
    };
    let (policy, weights) = admin.unwrap_or_default();
    let m = acc.rec.metrics_mut();
    if m.policy.is_empty() {
        m.policy = policy;
    }
    acc.finish(end_ns, &weights, &probes)
}

/// The prompt text for an arrival: rendered as a chat message (`<|user|>\n` + text + `\n`) it
/// is `4 × prompt_tokens` bytes (at least 10), its leading 2,048-byte blocks are spelled from
/// the arrival's prefix hashes, the rest is unique to request `id`.
pub fn prompt_text(a: &Arrival, id: u64) -> String {
    const RENDER_OVERHEAD: usize = "<|user|>\n".len() + 1;
    let len = (a.prompt_tokens as usize * BYTES_PER_TOKEN)
        .saturating_sub(RENDER_OVERHEAD)
        .max(1);
    let mut s = String::with_capacity(len + 16);
    let mut i = 0usize;
    while s.len() < len {
        let word = match a.prefix_blocks.get(i) {
            Some(&h) => h,
            // unique filler: the request id and the block index
            None => splitmix64(id.wrapping_mul(0x9E37_79B9) ^ (i as u64) ^ 0xA5A5_0000_0000_0000),
        };
        let tag = if i < a.prefix_blocks.len() { 'p' } else { 'u' };
        let start = s.len();
        // 17 bytes per word: tag + 16 hex digits; the block's first bytes identify it
        while s.len() - start < BLOCK_BYTES && s.len() < len {
            use std::fmt::Write as _;
            let _ = write!(s, "{tag}{word:016x}");
        }
        s.truncate((start + BLOCK_BYTES).min(len));
        i += 1;
    }
    s.truncate(len);
    s
}

fn request_body(model: &str, a: &Arrival, id: u64) -> Bytes {
    let output = a.output_tokens.max(1);
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": prompt_text(a, id)}],
        "max_tokens": output,
        "min_tokens": output,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
        "prompt_tokens": a.prompt_tokens,
    });
    Bytes::from(serde_json::to_vec(&body).expect("json"))
}

struct Pending {
    id: u64,
    arrival: Arrival,
    client: HttpClient,
    url: hyper::Uri,
    body: Bytes,
    /// Wall instant at which the request is cut.
    timeout_at: Instant,
}

#[derive(Debug)]
struct Observed {
    id: u64,
    arrival: Arrival,
    sent: Instant,
    first: Option<Instant>,
    finished: Instant,
    status: Option<u16>,
    worker: Option<String>,
    streamed: bool,
    done: bool,
    sse_error: bool,
    error: Option<String>,
    content_events: u32,
    usage_tokens: Option<u32>,
    usage_prompt_tokens: Option<u32>,
    cached_tokens: u32,
    /// What the gateway believed the chosen worker had cached (its response header).
    believed_cached_tokens: u32,
}

impl Pending {
    async fn run(self) -> Observed {
        let sent = Instant::now();
        let mut o = Observed {
            id: self.id,
            arrival: self.arrival,
            sent,
            first: None,
            finished: sent,
            status: None,
            worker: None,
            streamed: false,
            done: false,
            sse_error: false,
            error: None,
            content_events: 0,
            usage_tokens: None,
            usage_prompt_tokens: None,
            cached_tokens: 0,
            believed_cached_tokens: 0,
        };
        let req = hyper::Request::post(self.url)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(hyper::header::ACCEPT, "text/event-stream")
            .body(Full::new(self.body))
            .expect("valid request");
        let work = async {
            let resp = match self.client.request(req).await {
                Ok(r) => r,
                Err(e) => {
                    o.error = Some(format!("request failed: {e}"));
                    return;
                }
            };
            o.status = Some(resp.status().as_u16());
            o.worker = resp
                .headers()
                .get(WORKER_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            o.believed_cached_tokens = resp
                .headers()
                .get(routelab_gateway::proxy::BELIEVED_CACHED_HEADER)
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(0);
            let ok = resp.status().is_success();
            o.streamed = ok;
            let mut body = resp.into_body();
            let mut scan = SseScan::default();
            let mut text = Vec::new();
            while let Some(frame) = body.frame().await {
                let frame = match frame {
                    Ok(f) => f,
                    Err(e) => {
                        o.error = Some(format!("body broke: {e}"));
                        return;
                    }
                };
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if !ok {
                    if text.len() < 4096 {
                        text.extend_from_slice(&data);
                    }
                    continue;
                }
                let now = Instant::now();
                scan.feed(&data, &mut o, now);
                if o.done || o.sse_error {
                    break;
                }
            }
            if !ok {
                o.error = Some(format!(
                    "status {}: {}",
                    o.status.unwrap_or(0),
                    String::from_utf8_lossy(&text)
                ));
            } else if !o.done && o.error.is_none() {
                o.error = Some(if o.sse_error {
                    "the stream ended with an error event".into()
                } else {
                    "the stream ended without [DONE]".into()
                });
            }
        };
        if tokio::time::timeout_at(self.timeout_at.into(), work)
            .await
            .is_err()
        {
            o.error = Some("timed out".into());
            o.done = false;
        }
        o.finished = Instant::now();
        o
    }
}

/// Splits SSE bytes into `data:` events.
#[derive(Default)]
struct SseScan {
    carry: Vec<u8>,
}

impl SseScan {
    fn feed(&mut self, mut chunk: &[u8], o: &mut Observed, now: Instant) {
        while let Some(pos) = chunk.iter().position(|&b| b == b'\n') {
            let line = if self.carry.is_empty() {
                Self::event(&chunk[..pos], o, now);
                chunk = &chunk[pos + 1..];
                continue;
            } else {
                let mut l = std::mem::take(&mut self.carry);
                l.extend_from_slice(&chunk[..pos]);
                l
            };
            Self::event(&line, o, now);
            chunk = &chunk[pos + 1..];
        }
        if self.carry.len() + chunk.len() <= 1 << 20 {
            self.carry.extend_from_slice(chunk);
        }
    }

    fn event(line: &[u8], o: &mut Observed, now: Instant) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(payload) = line.strip_prefix(b"data:") else {
            return;
        };
        let payload = payload.trim_ascii();
        if payload == b"[DONE]" {
            o.done = true;
            return;
        }
        // Content chunks are the bulk of the stream: recognise them without a JSON parse.
        let has = |needle: &[u8]| payload.windows(needle.len()).any(|w| w == needle);
        if has(b"\"usage\"") || has(b"\"error\"") {
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(payload) else {
                return;
            };
            if v.get("error").is_some() {
                o.sse_error = true;
                return;
            }
            if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                o.usage_tokens = u
                    .get("completion_tokens")
                    .and_then(serde_json::Value::as_u64)
                    .map(|n| n as u32);
                o.usage_prompt_tokens = u
                    .get("prompt_tokens")
                    .and_then(serde_json::Value::as_u64)
                    .map(|n| n as u32);
                o.cached_tokens = u
                    .pointer("/prompt_tokens_details/cached_tokens")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(0) as u32;
            }
        }
        // The gateway's own rule, so the player and the gateway count the same chunks.
        if routelab_gateway::proxy::is_content_event(payload) {
            o.content_events += 1;
            if o.first.is_none() {
                o.first = Some(now);
            }
        }
    }
}

/// The player's side of the shared [`Recorder`]: a response as observed from the client
/// becomes an [`Outcome`], counted and written by the same code as a simulated request.
struct Accumulator {
    rec: Recorder,
    rows: Vec<PlayedRequest>,
}

impl Accumulator {
    fn new(policy: &str, setup: &routelab_sim::SimSetup) -> Accumulator {
        let workers: Vec<WorkerTotals> = setup
            .workers
            .iter()
            .map(|w| WorkerTotals::new(w.spec.name.clone()))
            .collect();
        Accumulator {
            rec: Recorder::new(RunMetrics::new(policy, workers), setup.slo),
            rows: Vec::new(),
        }
    }

    fn record(&mut self, o: Observed, scen_ns: &impl Fn(Instant) -> u64) {
        let outcome = self.outcome(&o, scen_ns);
        self.rec.arrived(outcome.arrival);
        if let Some(w) = outcome.worker {
            self.rec.dispatched(w);
            if outcome.status == Status::Failed {
                self.rec.failed_on(w);
            }
        }
        self.rec.finished(&outcome);
        self.rows.push(PlayedRequest {
            record: self.rec.row(&outcome),
            http_status: o.status,
            streamed: o.streamed,
            sse_error: o.sse_error,
            error: o.error,
            engine_prompt_tokens: o.usage_prompt_tokens,
        });
    }

    /// What the client observed, in scenario time. Latencies count from when the request was
    /// sent; the output tokens are the stream's reported usage (else its content chunks), for
    /// the row and the totals alike.
    fn outcome(&mut self, o: &Observed, scen_ns: &impl Fn(Instant) -> u64) -> Outcome {
        let rejected = matches!(o.status, Some(s) if (400..500).contains(&s) && s != 429);
        let ok = o.done && !o.sse_error && o.error.is_none();
        let status = if ok {
            Status::Ok
        } else if rejected {
            Status::Rejected
        } else {
            Status::Failed
        };
        let at = |t: Instant| Time::from_nanos(scen_ns(t));
        Outcome {
            id: o.id,
            status,
            worker: o.worker.as_deref().map(|n| self.rec.worker_index(n)),
            arrival: at(o.sent),
            dispatched: None,
            first_token: o.first.map(at),
            end: at(o.finished),
            prompt_tokens: o.arrival.prompt_tokens,
            output_tokens: o.usage_tokens.unwrap_or(o.content_events),
            cached_tokens: o.cached_tokens,
            believed_cached_tokens: o.believed_cached_tokens,
            affinity_kept: false,
        }
    }

    fn finish(
        mut self,
        end_ns: u64,
        weights: &HashMap<String, (f64, Provenance)>,
        probes: &HashMap<String, u64>,
    ) -> PlayReport {
        let m = self.rec.metrics_mut();
        m.end_ns = end_ns;
        for t in &mut m.workers {
            if let Some(&(w, p)) = weights.get(&t.name) {
                t.final_weight = w;
                t.final_provenance = p;
            }
            if let Some(&n) = probes.get(&t.name) {
                t.probe_bursts = n;
            }
        }
        m.probe_bursts = m.workers.iter().map(|w| w.probe_bursts).sum();
        self.rows.sort_by_key(|r| r.record.id);
        PlayReport {
            metrics: self.rec.into_metrics(),
            requests: self.rows,
        }
    }
}

async fn get_text(client: &HttpClient, url: &str, token: Option<&str>) -> Option<String> {
    let mut b = hyper::Request::get(url);
    if let Some(t) = token {
        b = b.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = b.body(Full::new(Bytes::new())).ok()?;
    let work = async {
        let r = client.request(req).await.ok()?;
        if !r.status().is_success() {
            return None;
        }
        let b = r.into_body().collect().await.ok()?.to_bytes();
        String::from_utf8(b.to_vec()).ok()
    };
    tokio::time::timeout(Duration::from_secs(10), work)
        .await
        .ok()
        .flatten()
}

/// Provenance from its report name.
pub fn provenance_from_str(s: &str) -> Option<Provenance> {
    [
        Provenance::Default,
        Provenance::Table,
        Provenance::Measured,
        Provenance::Pinned,
        Provenance::Oracle,
    ]
    .into_iter()
    .find(|p| p.as_str() == s)
}

/// Weights and provenances by worker name from a gateway's `GET /admin/workers` (empty if it
/// cannot be read).
pub async fn admin_weights_of(gateway: &str, token: &str) -> HashMap<String, (f64, Provenance)> {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    admin_workers(&client, gateway.trim_end_matches('/'), token)
        .await
        .map(|(_, w)| w)
        .unwrap_or_default()
}

/// The gateway's policy name and its workers' weights and provenances.
type AdminView = (String, HashMap<String, (f64, Provenance)>);

async fn admin_workers(client: &HttpClient, base: &str, token: &str) -> Option<AdminView> {
    let text = get_text(client, &format!("{base}/admin/workers"), Some(token)).await?;
    let v = serde_json::from_str::<serde_json::Value>(&text).ok()?;
    let policy = v["policy"].as_str().unwrap_or_default().to_string();
    let weights = v["workers"]
        .as_array()
        .map(|ws| {
            ws.iter()
                .filter_map(|w| {
                    let name = w["name"].as_str()?.to_string();
                    let weight = w["weight"].as_f64()?;
                    let prov = w["provenance"]
                        .as_str()
                        .and_then(provenance_from_str)
                        .unwrap_or(Provenance::Default);
                    Some((name, (weight, prov)))
                })
                .collect()
        })
        .unwrap_or_default();
    Some((policy, weights))
}

/// Probe bursts (ok + failed) per worker from the gateway's `/metrics`.
async fn probe_bursts(client: &HttpClient, base: &str) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    let Some(text) = get_text(client, &format!("{base}/metrics"), None).await else {
        return out;
    };
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("routelab_worker_probes_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let Some(name) = labels
            .split("worker=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
        else {
            continue;
        };
        if let Ok(n) = value.trim().parse::<u64>() {
            *out.entry(name.to_string()).or_insert(0) += n;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use routelab_gateway::prompt;

    /// A replica's unusable URL is refused, naming it, before anything is sent.
    #[tokio::test]
    async fn a_bad_replica_url_is_refused_naming_it() {
        let file =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/replicas.yaml");
        let sc = Scenario::load(file).unwrap();
        let mut opts = PlayOptions::new(5.0);
        opts.replicas = vec!["http://127.0.0.1:1".into(), "http://bad host".into()];
        let e = play_with(&sc, 1, "http://127.0.0.1:2", &opts)
            .await
            .unwrap_err();
        assert!(
            matches!(&e, PlayError::Invalid(m) if m.contains("gateway URL `http://bad host`")),
            "{e}"
        );
    }

    fn rendered(a: &Arrival, id: u64) -> String {
        format!("<|user|>\n{}\n", prompt_text(a, id))
    }

    #[test]
    fn prompt_text_has_the_length_and_the_sharing_of_the_arrival() {
        let mut a = Arrival::new(0, 1500, 10, 0);
        a.prefix_blocks = vec![11, 22, 33];
        let mut b = a.clone();
        b.prefix_blocks = vec![11, 22, 44];
        let (ra, rb) = (rendered(&a, 1), rendered(&b, 2));
        assert_eq!(ra.len(), 6000);
        assert_eq!(prompt::estimate_tokens(ra.len()), 1500);
        let (ha, hb) = (
            prompt::prefix_hashes(ra.as_bytes()),
            prompt::prefix_hashes(rb.as_bytes()),
        );
        assert_eq!(ha.len(), 2);
        assert_eq!(ha, hb, "the first two blocks are shared");
        // a third full block differs when the third hash differs
        let mut c = a.clone();
        c.prompt_tokens = 2000;
        let mut d = b.clone();
        d.prompt_tokens = 2000;
        let (hc, hd) = (
            prompt::prefix_hashes(rendered(&c, 3).as_bytes()),
            prompt::prefix_hashes(rendered(&d, 4).as_bytes()),
        );
        assert_eq!(hc.len(), 3);
        assert_eq!(hc[..2], hd[..2]);
        assert_ne!(hc[2], hd[2]);
        // without prefix blocks, two requests share nothing
        let e = Arrival::new(0, 1500, 10, 0);
        let (he, hf) = (
            prompt::prefix_hashes(rendered(&e, 5).as_bytes()),
            prompt::prefix_hashes(rendered(&e, 6).as_bytes()),
        );
        assert_ne!(he[0], hf[0]);
        // tiny prompts stay valid
        assert!(!prompt_text(&Arrival::new(0, 1, 1, 0), 0).is_empty());
    }

    /// A finished stream as the player observes it: sent at 1 s, first token at 1.5 s, done
    /// at 3.5 s (scenario time = wall time here), served by `w0`.
    fn observed(base: Instant, requested: u32, usage: u32) -> Observed {
        let at = |s: f64| base + Duration::from_secs_f64(s);
        Observed {
            id: 0,
            arrival: Arrival::new(0, 100, requested, 0),
            sent: at(1.0),
            first: Some(at(1.5)),
            finished: at(3.5),
            status: Some(200),
            worker: Some("w0".into()),
            streamed: true,
            done: true,
            sse_error: false,
            error: None,
            content_events: usage,
            usage_tokens: Some(usage),
            usage_prompt_tokens: Some(100),
            cached_tokens: 0,
            believed_cached_tokens: 0,
        }
    }

    fn play_one(o: Observed, base: Instant) -> PlayReport {
        let setup = routelab_sim::SimSetup::new("m", Vec::new(), 1);
        let mut acc = Accumulator::new("p", &setup);
        let scen_ns = |t: Instant| t.saturating_duration_since(base).as_nanos() as u64;
        acc.record(o, &scen_ns);
        acc.finish(4_000_000_000, &HashMap::new(), &HashMap::new())
    }

    /// Regression: the player wrote TPOT 0.0 for a one-token output where the simulator wrote
    /// none; both now go through the same recorder, which has none.
    #[test]
    fn a_one_token_output_has_no_tpot_in_the_player() {
        let base = Instant::now();
        let report = play_one(observed(base, 1, 1), base);
        let row = &report.requests[0].record;
        assert_eq!((row.status, row.output_tokens), (Status::Ok, 1));
        assert_eq!(row.tpot_s, None);
        assert!(row.ttft_s.is_some_and(|t| (t - 0.5).abs() < 1e-6));
        assert_eq!(report.metrics.tpot.quantile_secs(1.0), Some(0.0));
        assert_eq!(report.metrics.completed, 1);
        assert_eq!(report.metrics.workers[0].name, "w0");
    }

    /// Regression: the row took output tokens from the arrival while the totals used the
    /// reported usage.
    #[test]
    fn the_row_and_the_totals_take_output_tokens_from_the_reported_usage() {
        let base = Instant::now();
        let report = play_one(observed(base, 10, 7), base);
        let row = &report.requests[0].record;
        assert_eq!(row.output_tokens, 7);
        assert_eq!(report.metrics.output_tokens, 7);
        assert_eq!(report.metrics.workers[0].output_tokens, 7);
        // (3.5 - 1.5) s over the 6 tokens after the first
        assert!(row.tpot_s.is_some_and(|t| (t - 2.0 / 6.0).abs() < 1e-6));
    }

    #[test]
    fn sse_scan_finds_first_content_usage_done_and_errors() {
        let now = Instant::now();
        let mut o = Observed {
            id: 0,
            arrival: Arrival::new(0, 1, 1, 0),
            sent: now,
            first: None,
            finished: now,
            status: Some(200),
            worker: None,
            streamed: true,
            done: false,
            sse_error: false,
            error: None,
            content_events: 0,
            usage_tokens: None,
            usage_prompt_tokens: None,
            cached_tokens: 0,
            believed_cached_tokens: 0,
        };
        let mut s = SseScan::default();
        s.feed(
            b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\nda",
            &mut o,
            now,
        );
        assert!(o.first.is_none());
        s.feed(
            b"ta: {\"choices\":[{\"delta\":{\"content\":\" sea\"}}]}\n\n",
            &mut o,
            now,
        );
        assert_eq!((o.first, o.content_events), (Some(now), 1));
        s.feed(b"data: {\"choices\":[],\"usage\":{\"completion_tokens\":7,\"prompt_tokens\":90,\"prompt_tokens_details\":{\"cached_tokens\":512}}}\n\ndata: [DONE]\n\n", &mut o, now);
        assert_eq!(
            (
                o.usage_tokens,
                o.usage_prompt_tokens,
                o.cached_tokens,
                o.done
            ),
            (Some(7), Some(90), 512, true)
        );
        s.feed(b"data: {\"error\":{\"message\":\"x\"}}\n\n", &mut o, now);
        assert!(o.sse_error);
    }
}
