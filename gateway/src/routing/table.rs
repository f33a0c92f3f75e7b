//! The gateway's own record of each worker beside the router's: its configuration, address,
//! counters and health, in slots indexed like the router's fleet.

use crate::config::WorkerConfig;
use crate::metrics::registry::WorkerMetrics;
use crate::prompt::Endpoint;
use crate::upstream::{BaseUrl, BaseUrlError, Target};
use routelab_policies::WorkerId;
use std::sync::Arc;

/// The gateway's own record of a worker, indexed by [`WorkerId`] like the router's fleet.
#[derive(Debug)]
pub(crate) struct WorkerRt {
    pub cfg: WorkerConfig,
    pub base: BaseUrl,
    pub metrics: Arc<WorkerMetrics>,
    pub consecutive_failures: u32,
    pub consecutive_successes: u32,
    /// Disconnected by the gateway's health logic (re-admitted by a successful check).
    pub ejected: bool,
    /// Drained by an administrator (health logic leaves it alone).
    pub drained: bool,
    /// Last measured burst throughput, tok/s.
    pub probe_tok_s: Option<f64>,
    /// Whether that burst was cut at `probe.budget_s` (its throughput counts the tokens
    /// streamed within the budget) rather than completed.
    pub probe_cut_at_budget: bool,
    /// Its two OpenAI endpoints, joined when it was added ([`WorkerRt::endpoint`]).
    pub endpoints: [Option<Target>; 2],
}

impl WorkerRt {
    /// The joined URLs of `base`'s OpenAI endpoints, in [`Endpoint`] order.
    pub fn endpoints_of(base: &BaseUrl) -> [Option<Target>; 2] {
        [Endpoint::Chat, Endpoint::Completions].map(|ep| base.join(ep.path()).ok())
    }

    /// The URL of `ep` on this worker: a clone of the one joined when it was added (reference
    /// counts), else joined now. Joining formats and parses the URL, about 1,000 of the
    /// handler bench's ~108,000 instructions per request (issue 42's +2.4 %, re-measured).
    pub fn endpoint(&self, ep: Endpoint) -> Result<Target, BaseUrlError> {
        match &self.endpoints[ep as usize] {
            Some(t) => Ok(t.clone()),
            None => self.base.join(ep.path()),
        }
    }
}

/// The gateway's records of the workers, indexed by [`WorkerId`] like the router's fleet. A
/// removed worker's record is dropped (its slot keeps 8 bytes), and a worker removed and added
/// again takes its old slot back ([`Core::add_worker`]), so that adding and removing workers
/// through the admin API does not grow the gateway without bound.
#[derive(Debug, Default)]
pub(crate) struct WorkerTable {
    slots: Vec<Option<Box<WorkerRt>>>,
}

impl WorkerTable {
    /// A worker that is not removed.
    pub fn get(&self, id: WorkerId) -> Option<&WorkerRt> {
        self.slots.get(id.index())?.as_deref()
    }

    /// A worker that is not removed.
    pub fn get_mut(&mut self, id: WorkerId) -> Option<&mut WorkerRt> {
        self.slots.get_mut(id.index())?.as_deref_mut()
    }

    /// The workers that are not removed, in id order.
    pub fn live(&self) -> impl Iterator<Item = (WorkerId, &WorkerRt)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, w)| Some((WorkerId(i as u32), w.as_deref()?)))
    }

    /// Slots, removed workers' included: the router's fleet size.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    pub(super) fn put(&mut self, id: WorkerId, w: WorkerRt) {
        if id.index() == self.slots.len() {
            self.slots.push(Some(Box::new(w)));
        } else {
            self.slots[id.index()] = Some(Box::new(w));
        }
    }

    pub(super) fn take(&mut self, id: WorkerId) -> Option<Box<WorkerRt>> {
        self.slots.get_mut(id.index())?.take()
    }
}

#[cfg(test)]
mod endpoint_tests {
    use super::*;

    /// The endpoints joined when a worker is added are the URLs a join at request time gives
    /// (under a path prefix too), in [`Endpoint`] order.
    #[test]
    fn the_joined_endpoints_are_the_request_time_joins() {
        for root in ["http://127.0.0.1:8000/", "http://h:1/engine"] {
            let base = BaseUrl::parse(root).unwrap();
            let joined = WorkerRt::endpoints_of(&base);
            for ep in [Endpoint::Chat, Endpoint::Completions] {
                let cached = joined[ep as usize].as_ref().expect("joined").to_string();
                assert_eq!(cached, base.join(ep.path()).unwrap().to_string(), "{root}");
                assert!(cached.ends_with(ep.path()), "{cached}");
            }
        }
    }
}
