//! A request's time at a worker: its place in the gateway's queue while it waits
//! ([`QueueTicket`]), then its flight from dispatch to the end of the answer ([`Flight`]), each
//! handing back what it holds however it ends.

use crate::app::shared::Shared;
use crate::capacity::Decoding;
use crate::metrics::registry::WorkerMetrics;
use crate::reqlog::{LogStatus, Trace};
use crate::routing::Failure;
use routelab_policies::{Completion, Decision, RouteError, Time, WorkerId};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

/// A place in the gateway's queue; leaving it (drop) without a decision cancels it.
pub(crate) struct QueueTicket {
    pub shared: Arc<Shared>,
    pub ticket: u64,
    pub rx: oneshot::Receiver<Result<Decision, RouteError>>,
    pub armed: bool,
}

impl Drop for QueueTicket {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut core = self.shared.routing.core();
        if !core.cancel(self.ticket) {
            // Dispatched between the timeout and now: give the slot back.
            if let Ok(Ok(d)) = self.rx.try_recv() {
                let now = self.shared.routing.clock.now();
                core.release(now, d.worker, d.charge, None);
            }
        }
    }
}

/// One request dispatched to a worker. Dropping it unfinished (the client went away) frees the
/// worker's slot.
pub(crate) struct Flight {
    pub shared: Arc<Shared>,
    pub worker: WorkerId,
    /// The worker's name, for log lines (the worker may be removed while its request runs).
    pub name: String,
    pub metrics: Arc<WorkerMetrics>,
    pub arrived: Instant,
    pub dispatched_at: Time,
    pub first_token_at: Option<Time>,
    pub prompt_tokens: u32,
    pub finished: bool,
    /// What the router charged for it; handed back at first token and at the end.
    pub charge: routelab_policies::Charge,
    /// Counted in the worker's capacity curve from its first byte: `Some(buffered)` for a
    /// successful response (a buffered body's tokens are known at its end only), `None` for
    /// one that is not a generation (an error body).
    pub curve: Option<bool>,
    /// Its place in the capacity curve while decoding.
    pub decoding: Option<Decoding>,
    /// Its line in the request log, once the response is the request's answer.
    pub trace: Option<Trace>,
    /// Its id on the replicas' bus, once published there ([`Flight::tell_peers`]).
    pub bus_id: Option<u64>,
}

impl Flight {
    /// A request that arrived at `arrived` with `prompt_tokens` (as the router counts them),
    /// dispatched to `decision`'s worker now.
    pub fn new(
        shared: &Arc<Shared>,
        decision: &Decision,
        metrics: Arc<WorkerMetrics>,
        name: String,
        (arrived, prompt_tokens): (Instant, u32),
    ) -> Flight {
        Flight {
            shared: shared.clone(),
            worker: decision.worker,
            name,
            metrics,
            arrived,
            dispatched_at: shared.routing.clock.now(),
            first_token_at: None,
            prompt_tokens,
            finished: false,
            charge: decision.charge,
            curve: None,
            decoding: None,
            trace: None,
            bus_id: None,
        }
    }

    /// With a `replicas:` block: tell the other replicas this request was dispatched, with the
    /// prompt's `prefix` blocks (its first token and end follow from the flight).
    pub fn tell_peers(&mut self, prefix: &[u64]) {
        if let Some(bus) = &self.shared.bus {
            self.bus_id = Some(bus.dispatched(&self.name, self.charge, prefix));
        }
    }

    /// Tell the other replicas the request ended (`done`: what a completed one measured).
    fn tell_peers_ended(&mut self, done: Option<crate::replicas::Done>) {
        if let (Some(bus), Some(id)) = (&self.shared.bus, self.bus_id.take()) {
            bus.ended(id, done);
        }
    }

    /// The first body byte arrived from the worker.
    pub fn first_byte(&mut self) {
        if self.first_token_at.is_some() {
            return;
        }
        self.metrics.ttft.observe(self.arrived.elapsed());
        let now = self.shared.routing.clock.now();
        self.first_token_at = Some(now);
        if let Some(buffered) = self.curve {
            self.decoding = Some(self.metrics.curve().start(now, buffered));
        }
        self.shared
            .routing
            .core()
            .router
            .first_token(now, self.worker, &mut self.charge);
        if let (Some(bus), Some(id)) = (&self.shared.bus, self.bus_id) {
            bus.first_token(id);
        }
    }

    /// `tokens` output tokens of a stream passed through.
    pub fn tokens(&self, tokens: u32) {
        if tokens > 0 && self.decoding.is_some() {
            self.metrics.curve().tokens(tokens);
        }
    }

    /// Leave the capacity curve (a buffered body's `tokens`, if it completed).
    fn end_decoding(&mut self, now: Time, tokens: Option<u32>) {
        if let Some(d) = self.decoding.take() {
            self.metrics.curve().end(now, d, tokens);
        }
    }

    /// Write the request's log line now, unless written already: it ended as `status` with
    /// `output` tokens.
    pub fn log_end(&mut self, status: LogStatus, output: Option<u32>) {
        if let Some(t) = self.trace.as_mut() {
            t.finish(status, self.first_token_at, output);
        }
    }

    /// The response ended normally: `output_tokens` for the router and the capacity curve,
    /// `logged` for the request log.
    pub fn complete(&mut self, output_tokens: u32, logged: Option<u32>) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.metrics.e2e.observe(self.arrived.elapsed());
        let now = self.shared.routing.clock.now();
        self.end_decoding(now, Some(output_tokens));
        self.log_end(LogStatus::Ok, logged);
        let c = Completion {
            prompt_tokens: self.prompt_tokens,
            output_tokens,
            dispatched_at: self.dispatched_at,
            first_token_at: self.first_token_at.unwrap_or(now),
            completed_at: now,
        };
        let mut core = self.shared.routing.core();
        core.release(now, self.worker, self.charge, Some(&c));
        core.note_success(now, self.worker, false);
        drop(core);
        self.tell_peers_ended(Some(crate::replicas::Done {
            prompt_tokens: c.prompt_tokens,
            output_tokens: c.output_tokens,
            ttft_ns: c.first_token_at.nanos_since(c.dispatched_at),
            decode_ns: c.completed_at.nanos_since(c.first_token_at),
        }));
    }

    /// The worker failed the request (`hard`: the connection could not be made). Logged as
    /// `upstream_error` unless [`Flight::log_end`] said otherwise first.
    pub fn fail(&mut self, hard: bool) {
        if self.release_failed() {
            let now = self.shared.routing.clock.now();
            self.shared
                .routing
                .core()
                .note_failure(now, self.worker, Failure::Request { hard });
        }
    }

    /// The worker failed the request in a way that may be the request's fault (a 5xx): the
    /// slot is freed and the error counted, and the health logic is told later, if at all,
    /// when the request has ended (`proxy::Tries::judge`).
    pub fn fail_unjudged(&mut self) {
        self.release_failed();
    }

    /// Count the failure and free the slot; false if the flight had already ended.
    fn release_failed(&mut self) -> bool {
        if self.finished {
            return false;
        }
        self.finished = true;
        self.metrics
            .errors
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let now = self.shared.routing.clock.now();
        self.end_decoding(now, None);
        self.log_end(LogStatus::UpstreamError, None);
        self.shared
            .routing
            .core()
            .release(now, self.worker, self.charge, None);
        self.tell_peers_ended(None);
        true
    }

    /// The request ended without a worker fault worth counting (client gone, client error).
    /// Logged as `client_gone` unless [`Flight::log_end`] said otherwise first.
    pub fn abandon(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        let now = self.shared.routing.clock.now();
        self.end_decoding(now, None);
        self.log_end(LogStatus::ClientGone, None);
        self.shared
            .routing
            .core()
            .release(now, self.worker, self.charge, None);
        self.tell_peers_ended(None);
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        self.abandon();
    }
}
