//! What the host tells the router about its workers from outside the request path: the
//! engines' polled reports, the network round trips and the engines' KV-cache events, kept in
//! each worker's [`Signals`] and the prefix index the rules read.

use super::Router;
use crate::prefix::PrefixIndex;
use crate::signals::{EngineReport, Signals};
use crate::time::Time;
use crate::worker::WorkerId;

impl Router {
    /// The router's prefix index.
    pub fn prefix_index(&self) -> &PrefixIndex {
        &self.prefix
    }

    /// When the policy mirrors the engines' KV events (`prefix_knowledge: kv-events`), the
    /// delay after which the host should hand each worker's events to
    /// [`Router::apply_kv_events`]; `None` when the policy does not read them (the host then
    /// need not produce any).
    pub fn kv_event_delay(&self) -> Option<std::time::Duration> {
        self.config.kv_event_delay()
    }

    /// Mirror a worker's prefix-cache events (in the order the engine published them) into
    /// the router's knowledge of that worker's cache. Ignored unless the policy's knowledge is
    /// `kv-events`, and for unknown or removed workers.
    pub fn apply_kv_events(&mut self, _now: Time, worker: WorkerId, events: &[crate::KvEvent]) {
        if self.kv_event_delay().is_none() || self.check(worker).is_err() {
            return;
        }
        self.prefix.apply(worker, events);
    }

    /// A worker's router-local signals (tokens in flight, engine report, observed input speed).
    pub fn signals(&self, id: WorkerId) -> Option<&Signals> {
        self.signals.get(id.index())
    }

    /// How often the host should poll its engines and call [`Router::engine_report`]; `None`
    /// when the policy reads no engine report (the host then schedules no polls at all).
    pub fn engine_poll_interval(&self) -> Option<std::time::Duration> {
        self.config.chooser.engine_poll_interval()
    }

    /// An engine's polled figures. Between polls the rules add what was dispatched since.
    pub fn engine_report(&mut self, _now: Time, id: WorkerId, report: EngineReport) {
        if let Some(s) = self.signals.get_mut(id.index()) {
            s.report(report);
        }
    }

    /// An engine's figures polled by a request sent when the worker's
    /// [`Signals::tokens_dispatched`] read `mark`. The prompt tokens dispatched since stay
    /// counted on top of the report (the engine may have written its figures before they
    /// reached it), where [`Router::engine_report`], the report of an instant poll, counts from
    /// zero again: a host whose polls take time (a network round trip, a slow engine, the other
    /// workers' answers awaited) uses this one, so that the requests dispatched while its poll
    /// was out are not forgotten until the next one.
    pub fn engine_report_as_of(
        &mut self,
        _now: Time,
        id: WorkerId,
        report: EngineReport,
        mark: u64,
    ) {
        if let Some(s) = self.signals.get_mut(id.index()) {
            s.report_as_of(report, mark);
        }
    }

    /// Drop a worker's engine report (the host's poll of it went stale): the rules use the
    /// router's local counters for it again, as before its first report.
    pub fn forget_engine_report(&mut self, _now: Time, id: WorkerId) {
        if let Some(s) = self.signals.get_mut(id.index()) {
            s.forget_report();
        }
    }

    /// The network round trip to a worker, as the host measured or configured it (rules that
    /// estimate TTFT add it; others ignore it).
    pub fn set_round_trip(&mut self, id: WorkerId, rtt: std::time::Duration) {
        if let Some(s) = self.signals.get_mut(id.index()) {
            s.round_trip_s = Some(rtt.as_secs_f64());
        }
    }
}
