//! The engines' `/metrics` poll: every live worker's page read on a fixed grid of policy time,
//! each turned into an engine report for the router ([`crate::engine_metrics`]).

use super::hub::{PollState, PollStatus, lock};
use crate::app::shared::Shared;
use crate::engine_metrics::{self, Scrape};
use routelab_policies::{EngineReport, Time, WorkerId, WorkerState};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// A worker to poll, as it stood when its poll was sent.
struct PollTarget {
    id: WorkerId,
    /// Its page's URL, or why it cannot be made.
    uri: Result<crate::upstream::Target, crate::upstream::BaseUrlError>,
    /// Its cache size in tokens.
    cache: Option<u64>,
    /// Requests sent to it so far.
    sent: u64,
    /// Prompt tokens the router dispatched to it so far ([`routelab_policies::Signals`]'s
    /// `tokens_dispatched`): the report applies as of this mark, so the requests dispatched
    /// while the poll is out stay counted on top of it.
    mark: u64,
}

/// A poll's page, or why there is none.
type Page = Result<String, String>;

/// What the router is told of a worker after a poll: its new report as of the target's mark,
/// or `None` when its last report aged out.
type ReportChange = (WorkerId, Option<(EngineReport, u64)>);

/// Poll every live worker's `/metrics` each interval and hand the router its report; drop a
/// report once it is older than `stale_after_s`.
///
/// As the simulator polls its engines: on a fixed grid of policy time from the gateway's start
/// (a tick delayed by a busy runtime does not shift the ones after it), and each report taken
/// as of the moment its poll was sent, not the (later) moment every worker had answered.
///
/// Each worker's page is recorded as it arrives: a worker whose `/metrics` hangs delays only
/// its own report (every report waited for the slowest page, up to twice the timeout). Reports
/// older than `stale_after_s` are dropped at every tick and every arrival, not only when their
/// own worker's next poll fails ([`sweep_stale`]).
pub(super) async fn poll_engines(s: Arc<Shared>) {
    let p = s.settings.engine_poll.clone();
    let wall = s
        .routing
        .clock
        .to_wall(Duration::from_secs_f64(p.interval_s));
    let mut tick = tokio::time::interval(wall);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let targets = poll_targets(&s, &p.path);
        // The statuses of workers no longer polled go.
        lock(&s.signals.polls).retain(|id, _| targets.iter().any(|t| t.id.0 == *id));
        sweep_stale(&s, p.stale_after_s);
        let mut pages = fetch_each(&s, targets, p.timeout);
        loop {
            // While pages hang, reports still age out, checked once an interval.
            match tokio::time::timeout(wall, futures_util::StreamExt::next(&mut pages)).await {
                Ok(Some(result)) => {
                    let now = s.routing.clock.now();
                    let changes = record(&s, vec![result], now, p.stale_after_s);
                    if !changes.is_empty() {
                        tell_router(&s, now, changes);
                    }
                }
                Ok(None) => break,
                Err(_) => {}
            }
            sweep_stale(&s, p.stale_after_s);
        }
    }
}

/// Drop every report older than `stale_after_s` (its worker's poll may still be out, hanging).
fn sweep_stale(s: &Shared, stale_after_s: f64) {
    let now = s.routing.clock.now();
    let gone: Vec<WorkerId> = {
        let mut polls = lock(&s.signals.polls);
        polls
            .iter_mut()
            .filter_map(|(id, st)| st.aged_out(now, stale_after_s).then_some(WorkerId(*id)))
            .collect()
    };
    if !gone.is_empty() {
        tell_router(s, now, gone.into_iter().map(|id| (id, None)).collect());
    }
}

/// Every live worker the router has not removed, as it stands now.
fn poll_targets(s: &Shared, path: &str) -> Vec<PollTarget> {
    let core = s.routing.core();
    core.workers
        .live()
        .filter(|(id, _)| {
            core.router
                .fleet()
                .get(*id)
                .is_some_and(|f| f.state != WorkerState::Removed)
        })
        .map(|(id, w)| PollTarget {
            id,
            uri: w.base.join(path),
            cache: w.cfg.cache_tokens.map(crate::config::CacheTokens::tokens),
            sent: w.metrics.requests.load(Relaxed),
            mark: core
                .router
                .signals(id)
                .map_or(0, |sig| sig.tokens_dispatched),
        })
        .collect()
}

/// Every target's page, read at once, each yielded as it arrives.
fn fetch_each(
    s: &Arc<Shared>,
    targets: Vec<PollTarget>,
    timeout: Duration,
) -> futures_util::stream::FuturesUnordered<impl std::future::Future<Output = (PollTarget, Page)>> {
    let polls = targets.into_iter().map(|t| {
        let s = s.clone();
        async move {
            // A URL that cannot be made is a failed poll, said in its status, never a panic.
            let page = match t.uri {
                Ok(ref uri) => fetch(&s, uri.clone(), timeout).await,
                Err(ref e) => Err(e.to_string()),
            };
            (t, page)
        }
    });
    polls.collect()
}

/// Each poll's outcome in its worker's status; what the router must be told.
fn record(
    s: &Shared,
    results: Vec<(PollTarget, Page)>,
    now: Time,
    stale_after_s: f64,
) -> Vec<ReportChange> {
    let mut changes = Vec::new();
    let mut polls = lock(&s.signals.polls);
    for (t, page) in results {
        let PollTarget {
            id,
            cache,
            sent,
            mark,
            ..
        } = t;
        let st = polls.entry(id.0).or_insert_with(PollStatus::waiting);
        match page.and_then(|text| {
            let scrape = engine_metrics::parse(&text).ok_or_else(|| {
                "the page carries none of vLLM's, SGLang's or llama.cpp's metric names".to_string()
            })?;
            // A figure no engine can report: the page is not used.
            engine_metrics::check(&scrape).map_err(|e| e.to_string())?;
            Ok(scrape)
        }) {
            Ok(scrape) => {
                let report = st.scraped(scrape, now, cache, sent, mark);
                changes.push((id, Some((report, mark))));
            }
            Err(e) => {
                if st.failed(e, now, stale_after_s) {
                    changes.push((id, None));
                }
            }
        }
    }
    changes
}

/// Hand the router the new reports, and drop the ones that aged out.
fn tell_router(s: &Shared, now: Time, changes: Vec<ReportChange>) {
    let mut core = s.routing.core();
    for (id, r) in changes {
        // Removed while its page was being read: nothing to tell the router.
        if core.workers.get(id).is_none() {
            continue;
        }
        match r {
            Some((r, mark)) => core.router.engine_report_as_of(now, id, r, mark),
            None => core.router.forget_engine_report(now, id),
        }
    }
}

impl PollStatus {
    /// A worker's status before its first answer.
    fn waiting() -> PollStatus {
        PollStatus {
            state: PollState::Waiting,
            engine: None,
            ok: 0,
            failed: 0,
            last_error: None,
            report: None,
            at: None,
            last_scrape: None,
        }
    }

    /// A page with an engine's figures came: the report it makes (rates against the previous
    /// page), as of the poll's `mark`.
    fn scraped(
        &mut self,
        scrape: Scrape,
        now: Time,
        cache: Option<u64>,
        sent: u64,
        mark: u64,
    ) -> EngineReport {
        let prev = self
            .last_scrape
            .as_ref()
            .map(|(sc, at)| (sc, now.saturating_since(*at).as_secs_f64()));
        let report = engine_metrics::report(
            &scrape,
            prev,
            cache,
            engine_metrics::Sent {
                requests: sent,
                prompt_tokens: mark,
            },
        );
        self.ok += 1;
        self.engine = Some(scrape.engine);
        self.report = Some(report);
        self.at = Some(now);
        self.state = PollState::Live;
        self.last_scrape = Some((scrape, now));
        report
    }

    /// Whether the last report is older than `stale_after_s` at `now`; if so it is dropped
    /// (the state says `stale`) and true is returned once.
    fn aged_out(&mut self, now: Time, stale_after_s: f64) -> bool {
        let old = self
            .at
            .is_some_and(|at| now.saturating_since(at).as_secs_f64() > stale_after_s);
        if old && self.state == PollState::Live {
            self.state = PollState::Stale;
            self.report = None;
            return true;
        }
        false
    }

    /// The poll failed (`error`); true when the last report just aged out (older than
    /// `stale_after_s`), so the router must forget it.
    fn failed(&mut self, error: String, now: Time, stale_after_s: f64) -> bool {
        self.failed += 1;
        self.last_error = Some(error);
        let stale = self
            .at
            .is_none_or(|at| now.saturating_since(at).as_secs_f64() > stale_after_s);
        if stale && self.state != PollState::Stale && self.state != PollState::Waiting {
            self.state = PollState::Stale;
            self.report = None;
            return true;
        }
        false
    }
}

/// A worker's metrics page, as text: its answer within `timeout`, 200, at most 4 MiB, UTF-8.
async fn fetch(
    s: &Shared,
    uri: crate::upstream::Target,
    timeout: Duration,
) -> Result<String, String> {
    use http_body_util::{BodyExt, Full, Limited};
    let req = uri
        .request(hyper::Method::GET)
        .body(Full::new(bytes::Bytes::new()))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(timeout, s.client.request(req))
        .await
        .map_err(|_| "no answer within the timeout".to_string())?
        .map_err(|e| crate::upstream::error_chain(&e))?;
    if !resp.status().is_success() {
        return Err(format!("answered {}", resp.status()));
    }
    // A metrics page is tens of kilobytes; 4 MiB bounds a worker that sends more.
    let body = tokio::time::timeout(timeout, Limited::new(resp.into_body(), 4 << 20).collect())
        .await
        .map_err(|_| "the page did not arrive within the timeout".to_string())?
        .map_err(|e| format!("the page broke: {e}"))?;
    String::from_utf8(body.to_bytes().to_vec()).map_err(|_| "the page is not UTF-8".into())
}
