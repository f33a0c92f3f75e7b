//! What one write of the state file carries: the changes this gateway made since its last
//! write ([`Changes`]), and how they are merged into the file other replicas may share.

use super::{CacheEntry, Pin, StateFile};
use crate::clock::Clock;
use routelab_policies::Time;
use routelab_policies::weights::{PersistedProbeState, ProbeCacheEntry};
use std::collections::BTreeMap;

/// A pin set (`Some`) or removed (`None`) by this gateway.
#[derive(Debug, Clone, PartialEq)]
pub struct PinChange {
    /// Node name.
    pub node: String,
    /// Model name.
    pub model: String,
    /// The new pin, or `None` for an unpin.
    pub weight: Option<f64>,
}

/// A measurement this gateway dropped (a node manager restart with `keep_cache: false`): the
/// file's measurement of the same (node, model, launch arguments) is removed if it was made at
/// or before `invalidated_at`, whoever made it. A measurement another replica made after the
/// invalidation is kept.
#[derive(Debug, Clone, PartialEq)]
pub struct Forget {
    /// Node name.
    pub node: String,
    /// Model name.
    pub model: String,
    /// Launch arguments.
    pub launch_args: String,
    /// When the measurement stopped being valid, as far as this gateway can tell: the moment
    /// its state was taken for the write ([`Update::taken_at`]). The forget itself happened
    /// between its last write and then; taking the later bound may also remove a measurement
    /// another replica made in between, which costs a re-probe, whereas the earlier bound could
    /// keep a measurement of the restarted node, which is what the forget is there to drop.
    pub invalidated_at: Time,
}

/// What this gateway changed in its durable state since it last wrote the state file: the part
/// of its view it merges into the file. Recording changes rather than the whole view is what
/// lets replicas share a file: a replica that never heard of another's pin does not erase it,
/// and an unpin is written as a removal rather than lost as an absence.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Changes {
    /// Measurements new or different since the last write.
    pub measured: Vec<ProbeCacheEntry>,
    /// Measurements dropped from this gateway's cache since the last write.
    pub forgotten: Vec<Forget>,
    /// Pins set, changed or removed since the last write, and the caller's explicit one.
    pub pins: Vec<PinChange>,
}

/// One write of this gateway's state ([`save`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Update<'a> {
    /// What this gateway last wrote, or loaded at start.
    pub written: &'a PersistedProbeState,
    /// Its durable state now.
    pub now: &'a PersistedProbeState,
    /// When `now` was taken (this gateway's clock).
    pub taken_at: Time,
    /// The pin or unpin an administrator asked this gateway for, which the write must carry:
    /// merged and written even when it does not change this gateway's view (re-pinning a
    /// value another replica has since replaced in the file, or unpinning a pin this gateway
    /// never had).
    pub explicit_pin: Option<PinChange>,
}

type CacheKey<'a> = (&'a str, &'a str, &'a str);

fn cache_key(e: &ProbeCacheEntry) -> CacheKey<'_> {
    (&e.node, &e.model, &e.launch_args)
}

impl Changes {
    /// The changes that turn `written` (what this gateway last wrote, or loaded at start) into
    /// `now` (its current state, taken at `taken_at`).
    pub fn between(
        written: &PersistedProbeState,
        now: &PersistedProbeState,
        taken_at: Time,
    ) -> Changes {
        let before: BTreeMap<CacheKey<'_>, &ProbeCacheEntry> =
            written.cache.iter().map(|e| (cache_key(e), e)).collect();
        let after: BTreeMap<CacheKey<'_>, &ProbeCacheEntry> =
            now.cache.iter().map(|e| (cache_key(e), e)).collect();
        let measured = after
            .iter()
            .filter(|(k, e)| before.get(*k) != Some(*e))
            .map(|(_, e)| (*e).clone())
            .collect();
        let forgotten = before
            .iter()
            .filter(|(k, _)| !after.contains_key(*k))
            .map(|(_, e)| Forget {
                node: e.node.clone(),
                model: e.model.clone(),
                launch_args: e.launch_args.clone(),
                invalidated_at: taken_at,
            })
            .collect();
        let pin_map = |s: &PersistedProbeState| -> BTreeMap<(String, String), f64> {
            s.pins
                .iter()
                .map(|p| ((p.node.clone(), p.model.clone()), p.weight))
                .collect()
        };
        let (before, after) = (pin_map(written), pin_map(now));
        let mut pins: Vec<PinChange> = after
            .iter()
            .filter(|(k, w)| before.get(*k) != Some(*w))
            .map(|((node, model), w)| PinChange {
                node: node.clone(),
                model: model.clone(),
                weight: Some(*w),
            })
            .collect();
        pins.extend(
            before
                .keys()
                .filter(|k| !after.contains_key(*k))
                .map(|(node, model)| PinChange {
                    node: node.clone(),
                    model: model.clone(),
                    weight: None,
                }),
        );
        Changes {
            measured,
            forgotten,
            pins,
        }
    }

    /// What `update` carries into the file: its changes since the last write, and its explicit
    /// pin change whether or not that changed anything here (it replaces the diff's change of
    /// the same pin, which can only agree with it). When the file does not exist yet
    /// (`file_exists` false), the whole of `now` is a change.
    pub(super) fn of(update: &Update<'_>, file_exists: bool) -> Changes {
        let none = PersistedProbeState::default();
        let since = if file_exists { update.written } else { &none };
        let mut changes = Changes::between(since, update.now, update.taken_at);
        if let Some(p) = &update.explicit_pin {
            changes
                .pins
                .retain(|c| (&c.node, &c.model) != (&p.node, &p.model));
            changes.pins.push(p.clone());
        }
        changes
    }

    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.measured.is_empty() && self.forgotten.is_empty() && self.pins.is_empty()
    }
}

/// Merge one writer's `changes` into the file's entries. Per measurement (node, model, launch
/// arguments) the newer one by its timestamp wins, whoever wrote it; a forgotten measurement is
/// removed if the file's was made at or before the invalidation. A pin set or removed by this
/// writer wins for its (node, model). Entries the writer did not change are kept as they are,
/// including ones this gateway ignores on load (another replica's policy may accept them).
/// Entries come out sorted by key.
pub(super) fn merge(file: &mut StateFile, changes: &Changes, clock: &Clock) {
    let mut cache: BTreeMap<(String, String, String), CacheEntry> = std::mem::take(&mut file.cache)
        .into_iter()
        .map(|e| ((e.node.clone(), e.model.clone(), e.launch_args.clone()), e))
        .collect();
    let key = |e: &ProbeCacheEntry| (e.node.clone(), e.model.clone(), e.launch_args.clone());
    for e in &changes.measured {
        let entry = CacheEntry::of(e, clock);
        let newer_on_file = cache
            .get(&key(e))
            .is_some_and(|f| f.measured_at_unix_ms > entry.measured_at_unix_ms);
        if !newer_on_file {
            cache.insert(key(e), entry);
        }
    }
    for f in &changes.forgotten {
        let k = (f.node.clone(), f.model.clone(), f.launch_args.clone());
        let invalidated_ms = clock.to_unix_ms(f.invalidated_at);
        if cache
            .get(&k)
            .is_some_and(|e| e.measured_at_unix_ms <= invalidated_ms)
        {
            cache.remove(&k);
        }
    }
    let mut pins: BTreeMap<(String, String), Pin> = std::mem::take(&mut file.pins)
        .into_iter()
        .map(|p| ((p.node.clone(), p.model.clone()), p))
        .collect();
    for p in &changes.pins {
        let k = (p.node.clone(), p.model.clone());
        match p.weight {
            Some(weight) => {
                pins.insert(
                    k,
                    Pin {
                        node: p.node.clone(),
                        model: p.model.clone(),
                        weight,
                    },
                );
            }
            None => {
                pins.remove(&k);
            }
        }
    }
    file.cache = cache.into_values().collect();
    file.pins = pins.into_values().collect();
}
