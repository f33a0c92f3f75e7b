//! The drain deadline as a signal the streams watch: at a graceful shutdown, connections get
//! `server.drain_timeout_s` to finish their requests; a stream still running then is cut. Cut
//! by the connection alone, the client saw a truncated stream and the log said `client_gone`.
//! With this signal the stream ends itself first, with an SSE error event and its own status
//! in the request log, and the connection is closed [`CUT_GRACE`] later (if still open).
//! At the bottom of the floor plan: it imports nothing of the gateway's.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long after the drain deadline a connection whose stream was cut has to write the
/// stream's error event before the connection itself is closed.
pub(crate) const CUT_GRACE: Duration = Duration::from_millis(250);

/// The gateway's drain deadline: reached once, never undone.
#[derive(Clone, Debug)]
pub(crate) struct Drain {
    tx: Arc<watch::Sender<bool>>,
}

impl Default for Drain {
    fn default() -> Drain {
        Drain {
            tx: Arc::new(watch::channel(false).0),
        }
    }
}

impl Drain {
    /// The deadline is reached: every stream watching ends.
    pub fn cut(&self) {
        self.tx.send_replace(true);
    }

    /// A future that completes when the deadline is reached (never, if it is not).
    pub fn reached(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let mut rx = self.tx.subscribe();
        Box::pin(async move {
            if rx.wait_for(|cut| *cut).await.is_err() {
                // The sender lives as long as any clone of `Drain`; without it, no cut comes.
                std::future::pending::<()>().await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watcher_wakes_at_the_cut_and_one_made_after_it_is_ready_at_once() {
        let d = Drain::default();
        let before = d.reached();
        let waiting = tokio::spawn(before);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        d.cut();
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("woken by the cut")
            .unwrap();
        tokio::time::timeout(Duration::from_millis(100), d.reached())
            .await
            .expect("already cut");
    }
}
