//! The scenario reader: a [`RawScenario`] validated into a [`Scenario`], one named step per
//! part of the file (fleet, traffic, events, policies, settings), every refusal a located
//! [`InputError`] through the one adapter ([`SourceFile`]).

use super::{RawEvent, RawGateways, RawScenario, RawWorker, Scenario, ScenarioError, Warmup};
use crate::event_loop::{
    Action, DEFAULT_BUS_LATENCY_S, Gateways, LifecycleEvent, MAX_REPLICAS, Share, SimSetup, Slo,
    Split, WorkerSetup,
};
use crate::hardware::{HardwareProfile, ProfileLookup};
use crate::worker::{EngineMode, EngineOverrides};
use routelab_policies::located::{InputError, SourceFile, rule};
use routelab_policies::streams::secs_to_nanos;
use routelab_policies::{PolicyConfig, PolicyEntry, WorkerSpec};
use serde_saphyr::{Location, Spanned};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// Reads one scenario file: where it is (relative paths start there), how its errors name it,
/// and the hardware profiles it has read so far.
pub(super) struct ScenarioReader<'p> {
    pub(super) path: &'p Path,
    pub(super) file: SourceFile,
    profiles: HashMap<String, Arc<HardwareProfile>>,
}

impl<'p> ScenarioReader<'p> {
    pub(super) fn new(path: &'p Path) -> Self {
        ScenarioReader {
            path,
            file: SourceFile::new(path.display().to_string()),
            profiles: HashMap::new(),
        }
    }
}

impl ScenarioReader<'_> {
    /// Seconds at `field` (`default` when not written), in nanoseconds.
    pub(super) fn secs(
        &self,
        loc: &Location,
        field: &str,
        v: Option<f64>,
        default: f64,
    ) -> Result<u64, ScenarioError> {
        let v = v.unwrap_or(default);
        // The rule bounds the value; the conversion is the one rounding to nanoseconds.
        self.file
            .check(loc, field, rule::seconds(v))
            .map(|_| secs_to_nanos(v))
    }

    fn positive(&self, loc: &Location, field: &str, v: f64) -> Result<f64, ScenarioError> {
        self.file.check(loc, field, rule::positive(v))
    }

    /// The profile `spec` of a fleet entry, through the one lookup ([`ProfileLookup`]); each
    /// `profile:` string is read once per scenario.
    fn profile(
        &mut self,
        lookup: &ProfileLookup,
        spec: &str,
        loc: &Location,
        field: &str,
    ) -> Result<Arc<HardwareProfile>, ScenarioError> {
        if let Some(p) = self.profiles.get(spec) {
            return Ok(p.clone());
        }
        let p = Arc::new(
            lookup
                .find(spec)
                .map_err(|e| e.located(self.file.name(), field).at_location(*loc))?,
        );
        self.profiles.insert(spec.to_string(), p.clone());
        Ok(p)
    }

    /// The whole file, part by part in the order errors are reported: name, fleet, traffic,
    /// the memory the traffic would hold, events, policies, then the settings.
    pub(super) fn scenario(mut self, mut raw: RawScenario) -> Result<Scenario, ScenarioError> {
        let name = self.name(raw.name.take())?;
        let model = raw.model.take().unwrap_or_else(|| "model".to_string());
        let (workers, names) = self.fleet(
            &raw.fleet,
            raw.hardware_dir.as_deref(),
            &model,
            raw.engine.as_ref(),
        )?;
        let traffic = self.traffic_sources(raw.traffic.as_deref(), &workers)?;
        let events = raw
            .events
            .iter()
            .enumerate()
            .map(|(i, e)| self.event(i, e, &names))
            .collect::<Result<Vec<_>, _>>()?;
        let policies = self.policies(&raw.policies, &workers)?;
        let mut setup = SimSetup::new(model, workers, raw.seed.unwrap_or(1));
        setup.events = events;
        self.settings(&raw, &mut setup)?;
        Ok(Scenario {
            name,
            description: raw.description.take().unwrap_or_default(),
            path: self.path.to_path_buf(),
            setup,
            traffic,
            policies,
            warmup: Warmup::default(),
        })
    }

    /// The display name: as written, or the file stem.
    fn name(&self, written: Option<String>) -> Result<String, ScenarioError> {
        Ok(match written {
            Some(n) if n.trim().is_empty() => {
                return Err(self.file.error("name", "must not be empty"));
            }
            Some(n) => n,
            None => self
                .path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("scenario")
                .to_string(),
        })
    }

    /// The workers, with `count` expanded, and where each name is in the list (for events).
    fn fleet(
        &mut self,
        fleet: &[Spanned<RawWorker>],
        hardware_dir: Option<&str>,
        model: &str,
        engine: Option<&Spanned<String>>,
    ) -> Result<(Vec<WorkerSetup>, HashMap<String, usize>), ScenarioError> {
        let lookup = ProfileLookup::for_scenario(self.path, hardware_dir);
        if fleet.is_empty() {
            return Err(self
                .file
                .error("fleet", "is empty; a scenario needs at least one worker"));
        }
        let scenario_engine = match engine {
            Some(e) => self.engine_mode(e, "engine")?,
            None => EngineMode::default(),
        };
        let mut workers: Vec<WorkerSetup> = Vec::new();
        let mut names: HashMap<String, usize> = HashMap::new();
        for (i, w) in fleet.iter().enumerate() {
            let entry = self.worker(i, w, &lookup, model, scenario_engine)?;
            let loc = &w.referenced;
            let w = &w.value;
            let count = w.count.unwrap_or(1);
            for k in 0..count {
                let wname = if count == 1 {
                    w.name.clone()
                } else {
                    format!("{}-{}", w.name, k + 1)
                };
                if names.insert(wname.clone(), workers.len()).is_some() {
                    return Err(self.file.at(
                        loc,
                        format!("fleet[{i}].name"),
                        format!("`{wname}` is used twice; worker names must be unique"),
                    ));
                }
                let node = match (&w.node, count) {
                    (Some(n), 1) => n.clone(),
                    (Some(n), _) => format!("{n}-{}", k + 1),
                    (None, _) => wname.clone(),
                };
                let mut setup = entry.clone();
                setup.spec.name = wname;
                setup.spec.node = node;
                workers.push(setup);
            }
        }
        Ok((workers, names))
    }

    /// Fleet entry `i` as one worker (its name and node are set per copy by [`Self::fleet`]).
    fn worker(
        &mut self,
        i: usize,
        w: &Spanned<RawWorker>,
        lookup: &ProfileLookup,
        model: &str,
        scenario_engine: EngineMode,
    ) -> Result<WorkerSetup, ScenarioError> {
        let loc = &w.referenced;
        let f = |s: &str| format!("fleet[{i}].{s}");
        let w = &w.value;
        if w.name.trim().is_empty() {
            return Err(self.file.at(loc, f("name"), "must not be empty"));
        }
        let profile = self.profile(lookup, &w.profile, loc, &f("profile"))?;
        let count = w.count.unwrap_or(1);
        if count == 0 || count > 100_000 {
            return Err(self.file.at(
                loc,
                f("count"),
                format!("{count} is not valid; expected 1 to 100000"),
            ));
        }
        let context_window = w.context_window.unwrap_or(profile.context_window());
        if context_window < 1024 {
            return Err(self.file.at(
                loc,
                f("context_window"),
                format!(
                    "{context_window} is too small; expected at least 1024 tokens (the probe \
                     prompt must fit)"
                ),
            ));
        }
        let engine = match &w.engine {
            Some(e) => self.engine_mode(e, &f("engine"))?,
            None => scenario_engine,
        };
        let noise = w.noise.as_ref();
        let overrides = EngineOverrides {
            speed_factor: w.speed_factor.unwrap_or(1.0),
            request_noise_cv: noise.and_then(|n| n.request_cv).unwrap_or(0.0),
            epoch_noise_cv: noise.and_then(|n| n.epoch_cv).unwrap_or(0.0),
            epoch_s: noise.and_then(|n| n.epoch_s).unwrap_or(60.0),
            max_running: w.max_running,
            kv_capacity_tokens: w.kv_capacity_tokens,
            prefill_chunk_tokens: None,
            start_cold: w.start_cold.unwrap_or(false),
        };
        self.file
            .check(loc, &format!("fleet[{i}]"), overrides.validate())?;
        let rtt_ns = self.secs(loc, &f("rtt_ms"), w.rtt_ms.map(|ms| ms / 1000.0), 0.0)?;
        let register_at = self.secs(loc, &f("register_at_s"), w.register_at_s, 0.0)?;
        // What the engine's launch arguments tell a gateway: its KV memory in cache blocks.
        let cache_blocks = u32::try_from(
            w.kv_capacity_tokens.unwrap_or(profile.kv_capacity_tokens())
                / u64::from(crate::traffic::BLOCK_TOKENS),
        )
        .unwrap_or(u32::MAX);
        Ok(WorkerSetup {
            spec: WorkerSpec {
                name: w.name.clone(),
                node: w.name.clone(),
                model: model.to_string(),
                gpu_names: w
                    .gpu_names
                    .clone()
                    .unwrap_or_else(|| profile.gpu_names().to_vec()),
                context_window,
                launch_args: w.launch_args.clone().unwrap_or_default(),
                cache_blocks: Some(cache_blocks),
            },
            profile,
            overrides,
            engine,
            rtt_ns,
            register_at,
        })
    }

    /// The policies to run (every preset when none is listed), each checked against the fleet.
    fn policies(
        &self,
        entries: &[Spanned<PolicyEntry>],
        workers: &[WorkerSetup],
    ) -> Result<Vec<PolicyConfig>, ScenarioError> {
        let mut policies = Vec::new();
        for (i, p) in entries.iter().enumerate() {
            let cfg = p.value.build().map_err(|e| {
                InputError::from_config(self.file.name(), &e)
                    .within(&format!("policies[{i}]"))
                    .at_location(p.referenced)
            })?;
            // A prefill-bound probe (predictive's) must fit every worker's context window.
            if let Some((w, reason)) = workers
                .iter()
                .find_map(|w| Some((w, cfg.prefill_probe_fits(w.spec.context_window).err()?)))
            {
                return Err(self.file.at(
                    &p.referenced,
                    format!("policies[{i}]"),
                    format!(
                        "policy `{}` on worker `{}`: {reason}",
                        cfg.name, w.spec.name
                    ),
                ));
            }
            // sita's bands must each go to a class of windows that can hold its requests.
            let windows: Vec<u32> = workers.iter().map(|w| w.spec.context_window).collect();
            if let Err(reason) = cfg.sita_fits(&windows) {
                return Err(self.file.at(
                    &p.referenced,
                    format!("policies[{i}].chooser.cutoffs"),
                    format!("policy `{}`: {reason}", cfg.name),
                ));
            }
            if policies.iter().any(|q: &PolicyConfig| q.name == cfg.name) {
                return Err(self.file.at(
                    &p.referenced,
                    format!("policies[{i}]"),
                    format!("policy `{}` is listed twice; give one a `name`", cfg.name),
                ));
            }
            policies.push(cfg);
        }
        if policies.is_empty() {
            policies = routelab_policies::PRESETS
                .iter()
                .map(|p| PolicyConfig::preset(p.name).expect("presets are valid"))
                .collect();
        }
        Ok(policies)
    }

    /// The scenario-wide settings: tick and timeline periods, limits, the SLO, the gateways.
    fn settings(&self, raw: &RawScenario, setup: &mut SimSetup) -> Result<(), ScenarioError> {
        let none = Location::UNKNOWN;
        setup.tick_ns = self.secs(&none, "tick_s", raw.tick_s, 1.0)?.max(1_000_000);
        setup.timeline_ns = self.secs(&none, "timeline_s", raw.timeline_s, 10.0)?;
        if let Some(d) = raw.max_duration_s {
            setup.max_time_ns = self.secs(&none, "max_duration_s", Some(d), 0.0)?;
        }
        if let Some(r) = raw.max_retries {
            setup.max_retries = r;
        }
        if let Some(c) = raw.oracle_concurrency {
            setup.oracle_concurrency = self.positive(&none, "oracle_concurrency", c)?;
        }
        if let Some(slo) = &raw.slo {
            if let Some(t) = slo.ttft_s {
                setup.slo.ttft_s = self.positive(&none, "slo.ttft_s", t)?;
            }
            if let Some(t) = slo.tpot_s {
                setup.slo.tpot_s = self.positive(&none, "slo.tpot_s", t)?;
            }
        } else {
            setup.slo = Slo::default();
        }
        if let Some(g) = &raw.gateways {
            setup.gateways = self.gateways(g)?;
        }
        Ok(())
    }

    /// An `engine:` mode (the scenario's or a fleet entry's).
    fn engine_mode(&self, e: &Spanned<String>, field: &str) -> Result<EngineMode, ScenarioError> {
        EngineMode::parse(&e.value).map_err(|_| {
            self.file
                .at(
                    &e.referenced,
                    field,
                    format!("unknown engine mode `{}`", e.value),
                )
                .valid(EngineMode::NAMES.join(", "))
        })
    }

    /// The `gateways:` block.
    fn gateways(&self, g: &Spanned<RawGateways>) -> Result<Gateways, ScenarioError> {
        let loc = &g.referenced;
        let g = &g.value;
        let replicas = match g.replicas {
            None => 1,
            Some(n) => rule::whole(n, 1, u64::from(MAX_REPLICAS))
                .map_err(|e| self.file.at(loc, "gateways.replicas", e.to_string()))?
                as u32,
        };
        let names = |all: &[&str]| all.join(", ");
        let split = match g.split.as_deref() {
            None => Split::RoundRobin,
            Some(name) => Split::from_name(name).ok_or_else(|| {
                let valid: Vec<&str> = Split::ALL.iter().map(|(n, _)| *n).collect();
                self.file
                    .at(loc, "gateways.split", format!("unknown split `{name}`"))
                    .valid(names(&valid))
            })?,
        };
        let name = g.share.as_deref().unwrap_or(Share::NAMES[0]);
        let sync_ns = match g.sync_interval_s {
            None => None,
            Some(s) => Some(
                rule::period(s)
                    .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
                    .map_err(|e| self.file.at(loc, "gateways.sync_interval_s", e.to_string()))?,
            ),
        };
        let bus_ns = match g.bus_latency_s {
            None => None,
            Some(s) => Some(
                rule::non_negative(s)
                    .map(secs_to_nanos)
                    .map_err(|e| self.file.at(loc, "gateways.bus_latency_s", e.to_string()))?,
            ),
        };
        let default_bus_ns = secs_to_nanos(DEFAULT_BUS_LATENCY_S);
        let share = Share::from_name(name, sync_ns.unwrap_or(0), bus_ns.unwrap_or(default_bus_ns))
            .ok_or_else(|| {
                self.file
                    .at(loc, "gateways.share", format!("unknown share `{name}`"))
                    .valid(names(&Share::NAMES))
            })?;
        match (share.periodic(), sync_ns) {
            (true, None) => {
                return Err(self.file.at(
                    loc,
                    "gateways.sync_interval_s",
                    format!(
                        "is missing; `share: {name}` {} every `sync_interval_s` seconds (a \
                         number > 0)",
                        if matches!(share, Share::EngineTruth { .. }) {
                            "polls the engines"
                        } else {
                            "exchanges in-flight counts"
                        }
                    ),
                ));
            }
            (false, Some(_)) => {
                return Err(self.file.at(
                    loc,
                    "gateways.sync_interval_s",
                    format!(
                        "is given with `share: {name}`; only `share: probes-and-load` and \
                         `engine-truth` run on a period"
                    ),
                ));
            }
            _ => {}
        }
        if bus_ns.is_some() && share.bus_latency_ns().is_none() {
            return Err(self.file.at(
                loc,
                "gateways.bus_latency_s",
                format!(
                    "is given with `share: {name}`; only `share: dispatch-stream` and \
                     `route-and-reserve` publish on a bus"
                ),
            ));
        }
        let share = match g.spread_s {
            None => share,
            Some(s) => {
                let spread_ns = rule::non_negative(s)
                    .map(secs_to_nanos)
                    .map_err(|e| self.file.at(loc, "gateways.spread_s", e.to_string()))?;
                share.with_spread(spread_ns).ok_or_else(|| {
                    self.file.at(
                        loc,
                        "gateways.spread_s",
                        format!(
                            "is given with `share: {name}`; only `share: dispatch-stream` \
                             spreads its replicas' decisions"
                        ),
                    )
                })?
            }
        };
        Ok(Gateways {
            replicas,
            split,
            share,
        })
    }

    fn event(
        &self,
        i: usize,
        e: &Spanned<RawEvent>,
        names: &HashMap<String, usize>,
    ) -> Result<LifecycleEvent, ScenarioError> {
        let loc = &e.referenced;
        let f = |s: &str| format!("events[{i}].{s}");
        let r = &e.value;
        let at = self.secs(loc, &f("at_s"), Some(r.at_s), 0.0)?;
        let Some(&worker) = names.get(&r.worker) else {
            let mut known: Vec<&str> = names.keys().map(String::as_str).collect();
            known.sort_unstable();
            return Err(self.file.at(
                loc,
                f("worker"),
                format!("no worker `{}`; workers: {}", r.worker, known.join(", ")),
            ));
        };
        const ACTIONS: &str = "restart, crash, disconnect, reconnect, node-manager-restart, pin, unpin, reprobe, degrade, remove";
        let allowed: &[&str] = match r.action.as_str() {
            "restart" => &["launch_args", "ready_after_s", "register_after_s", "cold"],
            "node-manager-restart" => &["keep_cache"],
            "pin" => &["weight"],
            "degrade" => &["speed_factor"],
            "crash" | "disconnect" | "reconnect" | "unpin" | "reprobe" | "remove" => &[],
            other => {
                return Err(self.file.at(
                    loc,
                    f("action"),
                    format!("unknown action `{other}`; valid: {ACTIONS}"),
                ));
            }
        };
        let set = [
            ("launch_args", r.launch_args.is_some()),
            ("ready_after_s", r.ready_after_s.is_some()),
            ("register_after_s", r.register_after_s.is_some()),
            ("cold", r.cold.is_some()),
            ("keep_cache", r.keep_cache.is_some()),
            ("weight", r.weight.is_some()),
            ("speed_factor", r.speed_factor.is_some()),
        ];
        if let Some((name, _)) = set.iter().find(|(n, s)| *s && !allowed.contains(n)) {
            return Err(self.file.at(
                loc,
                f(name),
                format!(
                    "does not apply to action `{}`; its fields: {}",
                    r.action,
                    if allowed.is_empty() {
                        "(none)".to_string()
                    } else {
                        allowed.join(", ")
                    }
                ),
            ));
        }
        let action = match r.action.as_str() {
            "restart" => Action::Restart {
                launch_args: r.launch_args.clone(),
                ready_after_ns: self.secs(loc, &f("ready_after_s"), r.ready_after_s, 60.0)?,
                register_after_ns: self.secs(
                    loc,
                    &f("register_after_s"),
                    r.register_after_s,
                    5.0,
                )?,
                cold: r.cold.unwrap_or(true),
            },
            "crash" => Action::Crash,
            "disconnect" => Action::Disconnect,
            "reconnect" => Action::Reconnect,
            "node-manager-restart" => Action::NodeManagerRestart {
                keep_cache: r.keep_cache.unwrap_or(true),
            },
            "pin" => {
                let w = r
                    .weight
                    .ok_or_else(|| self.file.at(loc, f("weight"), "`pin` needs a weight > 0"))?;
                Action::Pin(self.positive(loc, &f("weight"), w)?)
            }
            "unpin" => Action::Unpin,
            "reprobe" => Action::Reprobe,
            "degrade" => {
                let s = r.speed_factor.ok_or_else(|| {
                    self.file.at(
                        loc,
                        f("speed_factor"),
                        "`degrade` needs a speed_factor > 0 (1.0 = healthy)",
                    )
                })?;
                Action::SetSpeed(self.positive(loc, &f("speed_factor"), s)?)
            }
            _ => Action::Remove,
        };
        Ok(LifecycleEvent { at, worker, action })
    }
}
