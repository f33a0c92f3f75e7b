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
struct ProbeRun {
    order: ProbeOrder,
    started: Time,
    /// Requests of the burst not yet done or failed.
    outstanding: u32,
    /// Output tokens of its completed requests.
    tokens: u64,
    last_done: Time,
    /// No request of the burst failed.
    ok: bool,
    /// Who waits for its result: each replica with the id of its own order.
    waiting: Vec<(u32, u64)>,
}

/// A burst whose last request ended: what it measured, and who waits for it.
pub(super) struct FinishedBurst<'p> {
    /// The result, with the order id of the burst's first order (each waiting replica's own
    /// is set as it is handed over).
    pub(super) result: ProbeResult,
    /// Its phase.
    pub(super) phase: ProbePhase,
    /// From its start to its last request's end, ns.
    pub(super) wall_ns: u64,
    /// Each replica waiting for the result, with the id of its own order.
    pub(super) waiting: &'p [(u32, u64)],
}

/// The probe bursts of a run: every burst started (indexed by [`Kind::Probe`]) and, with
/// shared probe results, those in flight that another replica's order may join.
#[derive(Debug, Default)]
pub(super) struct Probes {
    runs: Vec<ProbeRun>,
    /// Bursts in flight that another replica's order may join (shared probe results only).
    running: Vec<u32>,
    /// Whether the replicas share probe results.
    shared: bool,
    /// The routers' orders being served (a reused buffer).
    orders: Vec<ProbeOrder>,
}

impl Probes {
    /// No burst yet; `shared`: the replicas share probe results.
    pub(super) fn new(shared: bool) -> Probes {
        Probes {
            shared,
            ..Probes::default()
        }
    }

    /// With shared probe results, replica `replica`'s `order` joins the burst of the same
    /// worker and phase in flight, if there is one (and then no burst is started for it).
    pub(super) fn join(&mut self, replica: u32, order: &ProbeOrder) -> bool {
        if !self.shared {
            return false;
        }
        let runs = &mut self.runs;
        let found = self.running.iter().find(|&&p| {
            let o = &runs[p as usize].order;
            o.worker == order.worker && o.phase == order.phase
        });
        match found {
            Some(&p) => {
                runs[p as usize].waiting.push((replica, order.id));
                true
            }
            None => false,
        }
    }

    /// Start a burst for replica `replica`'s `order` at `now`; its number, for the
    /// [`Kind::Probe`] of its requests.
    pub(super) fn start(&mut self, replica: u32, order: ProbeOrder, now: Time) -> u32 {
        let p = u32::try_from(self.runs.len()).expect("fewer than 2^32 probe bursts");
        self.runs.push(ProbeRun {
            order,
            started: now,
            outstanding: order.concurrency,
            tokens: 0,
            last_done: now,
            ok: true,
            waiting: vec![(replica, order.id)],
        });
        if self.shared {
            self.running.push(p);
        }
        p
    }

    /// A request of burst `p` ended at `now`: completed with `output_tokens`, or failed
    /// (`None`, and the burst measures nothing).
    pub(super) fn request_ended(&mut self, p: u32, now: Time, output_tokens: Option<u32>) {
        let run = &mut self.runs[p as usize];
        run.outstanding -= 1;
        match output_tokens {
            Some(tokens) => run.tokens += u64::from(tokens),
            None => run.ok = false,
        }
        run.last_done = run.last_done.max(now);
    }

    /// Burst `p`'s result once its last request ended (no longer joinable from then on).
    pub(super) fn finished(&mut self, p: u32) -> Option<FinishedBurst<'_>> {
        let run = &self.runs[p as usize];
        if run.outstanding > 0 {
            return None;
        }
        self.running.retain(|&q| q != p);
        let wall = run.last_done.nanos_since(run.started);
        Some(FinishedBurst {
            result: ProbeResult {
                order: run.order.id,
                worker: run.order.worker,
                output_tokens: run.tokens,
                // A complete burst prefilled every prompt it was ordered (probe prompts share
                // no prefix, so nothing is cached); a failed one measures nothing.
                prompt_tokens: u64::from(run.order.concurrency)
                    * u64::from(run.order.prompt_tokens),
                wall: Duration::from_nanos(wall),
                ok: run.ok,
            },
            phase: run.order.phase,
            wall_ns: wall,
            waiting: &run.waiting,
        })
    }

    /// The routers' orders buffer, to fill (hand it back with [`Probes::put_orders`]).
    fn take_orders(&mut self) -> Vec<ProbeOrder> {
        std::mem::take(&mut self.orders)
    }

    fn put_orders(&mut self, orders: Vec<ProbeOrder>) {
        self.orders = orders;
    }
}

impl Sim<'_> {
    /// Start the bursts the routers ask for now.
    pub(super) fn poll_probes(&mut self) {
        for r in 0..self.replicas.len() {
            self.poll_probes_of(r as u32);
        }
    }

    /// Start the bursts replica `replica` asks for now: each request of a burst goes to the
    /// probed worker, over the network like any other.
    fn poll_probes_of(&mut self, replica: u32) {
        let mut orders = self.probes.take_orders();
        self.replicas
            .get_mut(replica as usize)
            .router
            .poll_probes(self.now, &mut orders);
        for order in orders.drain(..) {
            if self.probes.join(replica, &order) {
                continue;
            }
            let worker = self.fleet.index_of(order.worker);
            let p = self.probes.start(replica, order, self.now);
            let m = self.rec.metrics_mut();
            m.probe_bursts += 1;
            m.workers[worker as usize].probe_bursts += 1;
            let half = self.fleet.get(worker).rtt_half;
            for _ in 0..order.concurrency {
                let a = Arrival::new(
                    self.now.as_nanos(),
                    order.prompt_tokens,
                    order.output_tokens,
                    0,
                );
                let req = self.requests.alloc(Kind::Probe(p), &a);
                let now = self.now;
                let r = self.requests.get_mut(req);
                r.worker = worker;
                r.dispatched = now;
                let epoch = r.epoch;
                self.push(self.after(half), Ev::Admit { req, epoch });
            }
        }
        self.probes.put_orders(orders);
    }

    /// Request `req` of burst `p` ended (completed with `output_tokens`, or failed): its slot
    /// is released, and the burst reported when it is complete.
    pub(super) fn probe_request_ended(&mut self, req: u32, p: u32, output_tokens: Option<u32>) {
        self.probes.request_ended(p, self.now, output_tokens);
        self.requests.release(req);
        self.probe_progress(p);
    }

    /// Report burst `p` to every replica waiting for it if it is complete.
    fn probe_progress(&mut self, p: u32) {
        let Some(FinishedBurst {
            mut result,
            phase,
            wall_ns,
            waiting,
        }) = self.probes.finished(p)
        else {
            return;
        };
        let worker = self.fleet.index_of(result.worker) as usize;
        let now = self.now;
        let m = self.rec.metrics_mut();
        m.probe_gpu_s += wall_ns as f64 / 1e9;
        if result.ok && phase == ProbePhase::Measure {
            m.probe_measurements += 1;
            m.workers[worker]
                .first_measured_ns
                .get_or_insert(now.as_nanos());
        }
        for &(replica, order) in waiting {
            result.order = order;
            self.replicas
                .get_mut(replica as usize)
                .router
                .probe_result(now, &result);
        }
        self.poll_probes();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use routelab_policies::WorkerId;

    fn order(id: u64, worker: u32, phase: ProbePhase) -> ProbeOrder {
        ProbeOrder {
            id,
            worker: WorkerId(worker),
            phase,
            concurrency: 2,
            output_tokens: 50,
            prompt_tokens: 100,
        }
    }

    fn t(s: u64) -> Time {
        Time::from_nanos(s * 1_000_000_000)
    }

    /// With shared results an order of the same worker and phase joins the burst in flight
    /// until that burst is over, and the result names every waiting replica's own order; a
    /// different phase or worker starts a burst of its own.
    #[test]
    fn shared_orders_join_the_burst_in_flight_until_it_ends() {
        let mut probes = Probes::new(true);
        assert!(!probes.join(0, &order(1, 7, ProbePhase::Measure)));
        let p = probes.start(0, order(1, 7, ProbePhase::Measure), t(10));
        assert!(probes.join(1, &order(9, 7, ProbePhase::Measure)));
        assert!(!probes.join(1, &order(10, 7, ProbePhase::Warmup)));
        assert!(!probes.join(1, &order(11, 8, ProbePhase::Measure)));

        probes.request_ended(p, t(12), Some(50));
        assert!(probes.finished(p).is_none(), "one request still runs");
        probes.request_ended(p, t(13), Some(50));
        let done = probes.finished(p).expect("both requests ended");
        assert_eq!(done.phase, ProbePhase::Measure);
        assert_eq!(done.wall_ns, 3_000_000_000);
        assert_eq!(done.waiting, &[(0, 1), (1, 9)]);
        assert_eq!(
            done.result,
            ProbeResult {
                order: 1,
                worker: WorkerId(7),
                output_tokens: 100,
                prompt_tokens: 200,
                wall: Duration::from_secs(3),
                ok: true,
            }
        );
        // Over: the next order of that worker and phase starts a burst of its own.
        assert!(!probes.join(1, &order(12, 7, ProbePhase::Measure)));
    }

    /// Without shared results nothing is joined; a failed request fails its burst.
    #[test]
    fn unshared_orders_start_their_own_bursts_and_a_failure_fails_the_burst() {
        let mut probes = Probes::new(false);
        let p = probes.start(0, order(1, 7, ProbePhase::Measure), t(0));
        assert!(!probes.join(1, &order(2, 7, ProbePhase::Measure)));
        probes.request_ended(p, t(1), None);
        probes.request_ended(p, t(2), Some(50));
        let done = probes.finished(p).expect("both requests ended");
        assert!(!done.result.ok);
        assert_eq!(done.result.output_tokens, 50);
        assert_eq!(done.waiting, &[(0, 1)]);
    }
}
