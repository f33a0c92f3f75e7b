//! Probes as real traffic: the router's probe orders become bursts of requests on the
//! engines, sharing the engines with customers, and their measured throughput goes back to the
//! router as a [`ProbeResult`].
//!
//! With several gateway replicas every replica orders probes on its own; with shared probe
//! results (`share: probes` or `probes-and-load`) a replica's order of a worker and phase whose
//! burst already runs joins that burst, and the burst's result reaches every replica that
//! joined it (see [`super::replicas`]).

use super::requests::Kind;
use super::{Ev, Sim};
use crate::traffic::Arrival;
use routelab_policies::{ProbeOrder, ProbePhase, ProbeResult, Time};
use std::time::Duration;

/// One probe burst in flight.
#[derive(Debug, Clone)]
pub(super) struct ProbeRun {
    pub(super) order: ProbeOrder,
    pub(super) started: Time,
    /// Requests of the burst not yet done or failed.
    pub(super) outstanding: u32,
    /// Output tokens of its completed requests.
    pub(super) tokens: u64,
    pub(super) last_done: Time,
    /// No request of the burst failed.
    pub(super) ok: bool,
    /// Who waits for its result: each replica with the id of its own order.
    pub(super) waiting: Vec<(u32, u64)>,
}

impl Sim<'_> {
    /// Start the bursts the routers ask for now.
    pub(super) fn poll_probes(&mut self) {
        for r in 0..self.replicas.len() {
            self.poll_probes_of(r as u32);
        }
    }

    /// Start the bursts replica `replica` asks for now.
    fn poll_probes_of(&mut self, replica: u32) {
        let mut orders = std::mem::take(&mut self.orders);
        self.replicas[replica as usize]
            .router
            .poll_probes(self.now, &mut orders);
        let shared = self.setup.gateways.share.probes();
        for order in orders.drain(..) {
            if shared && let Some(run) = self.running_burst(&order) {
                run.waiting.push((replica, order.id));
                continue;
            }
            let worker = self.by_id[order.worker.index()];
            let p = self.probes.len() as u32;
            self.probes.push(ProbeRun {
                order,
                started: self.now,
                outstanding: order.concurrency,
                tokens: 0,
                last_done: self.now,
                ok: true,
                waiting: vec![(replica, order.id)],
            });
            if shared {
                self.running.push(p);
            }
            let m = self.rec.metrics_mut();
            m.probe_bursts += 1;
            m.workers[worker as usize].probe_bursts += 1;
            let half = self.workers[worker as usize].rtt_half;
            for _ in 0..order.concurrency {
                let a = Arrival::new(
                    self.now.as_nanos(),
                    order.prompt_tokens,
                    order.output_tokens,
                    0,
                );
                let req = self.alloc(Kind::Probe(p), &a);
                let now = self.now;
                let r = &mut self.reqs[req as usize];
                r.worker = worker;
                r.dispatched = now;
                let epoch = r.epoch;
                self.push(self.after(half), Ev::Admit { req, epoch });
            }
        }
        self.orders = orders;
    }

    /// The burst of the same worker and phase in flight, if any (shared probe results only).
    fn running_burst(&mut self, order: &ProbeOrder) -> Option<&mut ProbeRun> {
        let p = *self.running.iter().find(|&&p| {
            let o = &self.probes[p as usize].order;
            o.worker == order.worker && o.phase == order.phase
        })?;
        Some(&mut self.probes[p as usize])
    }

    /// A request of burst `p` ended: report the burst when it is complete.
    pub(super) fn probe_progress(&mut self, p: u32) {
        let run = &self.probes[p as usize];
        if run.outstanding > 0 {
            return;
        }
        self.running.retain(|&q| q != p);
        let wall = run.last_done.nanos_since(run.started);
        let worker = self.by_id[run.order.worker.index()] as usize;
        let now = self.now;
        let m = self.rec.metrics_mut();
        m.probe_gpu_s += wall as f64 / 1e9;
        let mut result = ProbeResult {
            order: run.order.id,
            worker: run.order.worker,
            output_tokens: run.tokens,
            // A complete burst prefilled every prompt it was ordered (probe prompts share no
            // prefix, so nothing is cached); a failed one measures nothing.
            prompt_tokens: u64::from(run.order.concurrency) * u64::from(run.order.prompt_tokens),
            wall: Duration::from_nanos(wall),
            ok: run.ok,
        };
        if run.ok && run.order.phase == ProbePhase::Measure {
            m.probe_measurements += 1;
            m.workers[worker]
                .first_measured_ns
                .get_or_insert(now.as_nanos());
        }
        let waiting = std::mem::take(&mut self.probes[p as usize].waiting);
        for &(replica, order) in &waiting {
            result.order = order;
            self.replicas[replica as usize]
                .router
                .probe_result(self.now, &result);
        }
        self.probes[p as usize].waiting = waiting;
        self.poll_probes();
    }
}
