//! Probes as real traffic: the router's probe orders become bursts of requests on the
//! engines, sharing the engines with customers, and their measured throughput goes back to the
//! router as a [`ProbeResult`].

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
}

impl Sim<'_> {
    /// Start the bursts the router asks for now.
    pub(super) fn poll_probes(&mut self) {
        let mut orders = std::mem::take(&mut self.orders);
        self.router.poll_probes(self.now, &mut orders);
        for order in orders.drain(..) {
            let worker = self.by_id[order.worker.index()];
            let p = self.probes.len() as u32;
            self.probes.push(ProbeRun {
                order,
                started: self.now,
                outstanding: order.concurrency,
                tokens: 0,
                last_done: self.now,
                ok: true,
            });
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

    /// A request of burst `p` ended: report the burst when it is complete.
    pub(super) fn probe_progress(&mut self, p: u32) {
        let run = &self.probes[p as usize];
        if run.outstanding > 0 {
            return;
        }
        let wall = run.last_done.nanos_since(run.started);
        let m = self.rec.metrics_mut();
        m.probe_gpu_s += wall as f64 / 1e9;
        let result = ProbeResult {
            order: run.order.id,
            worker: run.order.worker,
            output_tokens: run.tokens,
            wall: Duration::from_nanos(wall),
            ok: run.ok,
        };
        if run.ok && run.order.phase == ProbePhase::Measure {
            m.probe_measurements += 1;
        }
        self.router.probe_result(self.now, &result);
        self.poll_probes();
    }
}
