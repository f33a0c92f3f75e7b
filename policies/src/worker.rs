//! Workers as the router knows them: identity, what they serve, and their live state.

use std::fmt;

/// Dense identifier of a registered worker. Ids are never reused within one [`crate::Router`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkerId(pub u32);

impl WorkerId {
    /// The id as a vector index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "w{}", self.0)
    }
}

/// Interned model name; resolve once with [`crate::Router::model_id`], route many times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModelId(pub u32);

impl fmt::Display for ModelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "m{}", self.0)
    }
}

/// What a worker announces when it registers.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerSpec {
    /// Human-readable name (unique per router is advised, not enforced).
    pub name: String,
    /// The machine (node) that hosts the worker; probe cache and pins are keyed on it.
    pub node: String,
    /// The model it serves.
    pub model: String,
    /// One entry per GPU, e.g. `["RTX 4090", "RTX 4090"]`.
    pub gpu_names: Vec<String>,
    /// Largest prompt (in tokens) the engine accepts.
    pub context_window: u32,
    /// The engine's launch arguments; a restart with other arguments is a different machine.
    pub launch_args: String,
    /// The engine's prefix-cache size in 512-token blocks, as its launch arguments give it
    /// (KV memory / block size); `None` when unknown. Bounds what the router may believe the
    /// worker still holds. Sizes above [`MAX_CACHE_BLOCKS`] count as that many (the router
    /// reserves its per-worker record up front).
    pub cache_blocks: Option<u32>,
}

/// The largest prefix-cache size, in 512-token blocks, the router keeps a per-worker record
/// for: 2²² blocks (about 2.1 billion tokens, far beyond any engine's KV memory), so a record
/// costs at most 32 MiB however large a size is announced.
pub const MAX_CACHE_BLOCKS: u32 = 1 << 22;

/// Where a worker's current weight comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Provenance {
    /// Not yet measured: a neutral placeholder, *not* a measurement of a slow worker.
    Default,
    /// From the GPU-name table.
    Table,
    /// Measured (burst probe or live traffic).
    Measured,
    /// Pinned by an administrator.
    Pinned,
    /// The simulator's ground truth (lab only).
    Oracle,
}

impl Provenance {
    /// Lower-case name used in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Provenance::Default => "default",
            Provenance::Table => "table",
            Provenance::Measured => "measured",
            Provenance::Pinned => "pinned",
            Provenance::Oracle => "oracle",
        }
    }
}

/// A worker's weight: the router's model of its capacity, relative to its peers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weight {
    /// Always finite and strictly positive.
    pub value: f64,
    /// Where it comes from.
    pub provenance: Provenance,
}

impl Default for Weight {
    fn default() -> Self {
        Weight::UNMEASURED
    }
}

impl Weight {
    /// The neutral weight of a worker nothing is known about.
    pub const UNMEASURED: Weight = Weight {
        value: 1.0,
        provenance: Provenance::Default,
    };

    /// True when this weight is a placeholder rather than knowledge about the worker.
    pub fn is_unmeasured(&self) -> bool {
        self.provenance == Provenance::Default
    }
}

/// Connection state of a registered worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkerState {
    /// Connected and accepting requests.
    Up,
    /// Connected, finishing its in-flight requests, accepting no new ones.
    Draining,
    /// Connection lost; may reconnect.
    Disconnected,
    /// Deregistered for good.
    Removed,
}

/// The router's live record of one worker. Strategies read it through [`Fleet`].
#[derive(Debug, Clone)]
pub struct WorkerInfo {
    /// What the worker announced.
    pub spec: WorkerSpec,
    /// Interned model.
    pub model: ModelId,
    /// Connection state.
    pub state: WorkerState,
    /// Requests dispatched and not yet completed or failed (probe traffic excluded).
    pub in_flight: u32,
    /// When it (last) registered, reconnected or restarted.
    pub since: crate::Time,
}

impl WorkerInfo {
    /// Counted among its model's peers (weights are normalised over these).
    pub fn is_active(&self) -> bool {
        matches!(self.state, WorkerState::Up | WorkerState::Draining)
    }

    /// Whether [`crate::Router::route`] may send this worker a request for `model` that needs
    /// `context_tokens`: connected and up, serving the model, a context window that holds it
    /// (its cap aside). The router applies the same filter from its compact routing state; a
    /// host that asks "which workers could have taken this request" asks here.
    pub fn accepts(&self, model: ModelId, context_tokens: u32) -> bool {
        self.state == WorkerState::Up
            && self.model == model
            && self.spec.context_window >= context_tokens
    }
}

/// Read-only view of every worker the router has seen, indexed by [`WorkerId`].
#[derive(Debug, Default, Clone)]
pub struct Fleet {
    pub(crate) workers: Vec<WorkerInfo>,
}

impl Fleet {
    /// The worker, if that id was ever registered.
    pub fn get(&self, id: WorkerId) -> Option<&WorkerInfo> {
        self.workers.get(id.index())
    }

    /// Number of ids ever handed out.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// True if no worker ever registered.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// Every worker ever registered, with its id.
    pub fn iter(&self) -> impl Iterator<Item = (WorkerId, &WorkerInfo)> {
        self.workers
            .iter()
            .enumerate()
            .map(|(i, w)| (WorkerId(i as u32), w))
    }

    /// Active workers serving `model`.
    pub fn active_peers(&self, model: ModelId) -> impl Iterator<Item = (WorkerId, &WorkerInfo)> {
        self.iter()
            .filter(move |(_, w)| w.model == model && w.is_active())
    }
}
