//! The running gateway's writer of the state file: what it last wrote, the lock that orders its
//! writes, and the router core's durable state snapshotted into each write.

use super::{PinChange, StateFileError, Update, save};
use crate::routing::Routing;
use routelab_policies::weights::PersistedProbeState;
use std::path::PathBuf;
use tokio::sync::{Mutex, MutexGuard};

/// The state file's writer (`state_file`; without one every write is a no-op).
pub(crate) struct StateWriter {
    path: Option<PathBuf>,
    /// Serialises state-file writes (snapshot and write happen under it, so the newest
    /// snapshot is always the last one written); holds the durable state this gateway last
    /// wrote (or loaded at start), from which the next write's changes are computed.
    written: Mutex<PersistedProbeState>,
}

impl StateWriter {
    /// A writer of `path` whose file holds `written` as far as this gateway knows.
    pub fn new(path: Option<PathBuf>, written: PersistedProbeState) -> StateWriter {
        StateWriter {
            path,
            written: Mutex::new(written),
        }
    }

    /// Hold the writes back (an admin change holds it from the change to its write, so it can
    /// undo the change before anyone else writes).
    pub async fn lock(&self) -> MutexGuard<'_, PersistedProbeState> {
        self.written.lock().await
    }

    /// Write the probe cache and pins to the state file (if configured), atomically; a failure
    /// is logged (`state_write_failed`). For background writers (the probe runner); an admin
    /// change that must not outlive a failed write uses [`StateWriter::write`] and rolls back.
    pub async fn persist(&self, routing: &Routing) {
        let mut held = self.lock().await;
        if let Err(e) = self.write(routing, &mut held, None).await {
            crate::logging::log("state_write_failed", &[("error", &e.to_string())]);
        }
    }

    /// Snapshot the router's durable state and merge what changed since the last write into the
    /// state file (if configured; [`save`], safe with other gateways sharing the file), with
    /// `explicit_pin`, the administrator's pin or unpin this write is for, written whether or
    /// not it changed this gateway's view. `written` is [`StateWriter::lock`]'s guard, whose
    /// value is what this gateway last wrote (or loaded at start): the newest snapshot is
    /// always the last one written, a caller can undo its change before anyone else writes,
    /// and after a failed write the next one carries its changes too.
    pub async fn write(
        &self,
        routing: &Routing,
        written: &mut MutexGuard<'_, PersistedProbeState>,
        explicit_pin: Option<PinChange>,
    ) -> Result<(), StateFileError> {
        let Some(path) = self.path.clone() else {
            return Ok(());
        };
        let (now, taken_at) = {
            let core = routing.core();
            let Some(now) = core.router.strategy().export_state() else {
                return Ok(());
            };
            (now, routing.clock.now())
        };
        let (target, before, snapshot, clock) = (
            path.clone(),
            (**written).clone(),
            now.clone(),
            routing.clock,
        );
        tokio::task::spawn_blocking(move || {
            let update = Update {
                written: &before,
                now: &snapshot,
                taken_at,
                explicit_pin,
            };
            save(&target, &update, &clock)
        })
        .await
        .unwrap_or_else(|join| {
            Err(StateFileError::Write {
                path,
                error: std::io::Error::other(join.to_string()),
            })
        })?;
        **written = now;
        Ok(())
    }
}
