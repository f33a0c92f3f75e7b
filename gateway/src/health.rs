//! Active health checks: `GET {base_url}{health.path}` every `health.interval_s`. A worker
//! failing `unhealthy_after` checks (or requests, before their first byte) in a row is ejected
//! (`Router::disconnect`); an ejected worker passing `healthy_after` checks in a row is
//! re-admitted (`Router::reconnect`). Drained and removed workers are left alone.

use crate::state::Shared;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use routelab_policies::WorkerId;
use std::sync::Arc;
use tokio::task::JoinSet;

/// The health loop; runs until aborted.
pub(crate) async fn run(s: Arc<Shared>) {
    let mut ticker = tokio::time::interval(s.settings.health_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let targets: Vec<(WorkerId, hyper::Uri)> = {
            let core = s.core();
            core.workers
                .iter()
                .enumerate()
                .filter(|(_, w)| !w.removed && !w.drained)
                .map(|(i, w)| (WorkerId(i as u32), w.base.join(&s.settings.health.path)))
                .collect()
        };
        let mut set = JoinSet::new();
        for (id, uri) in targets {
            let s = s.clone();
            set.spawn(async move {
                let ok = check(&s, uri).await;
                let mut core = s.core();
                let now = s.clock.now();
                if ok {
                    core.note_success(now, id, true, &s);
                } else {
                    core.note_failure(now, id, false, &s);
                }
            });
        }
        while set.join_next().await.is_some() {}
    }
}

async fn check(s: &Shared, uri: hyper::Uri) -> bool {
    let req = hyper::Request::get(uri)
        .body(Full::new(Bytes::new()))
        .expect("valid request");
    let work = async {
        let resp = s.client.request(req).await.ok()?;
        let ok = resp.status().is_success();
        resp.into_body().collect().await.ok()?;
        Some(ok)
    };
    matches!(
        tokio::time::timeout(s.settings.health_timeout, work).await,
        Ok(Some(true))
    )
}
