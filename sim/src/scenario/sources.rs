//! The scenario reader's synthetic traffic sources (a trace is read in `trace.rs`), each
//! checked by its own generator as it is read, then the memory they would hold together.

use super::reader::ScenarioReader;
use super::{RawSeconds, RawTraffic, ScenarioError, TrafficSpec};
use crate::event_loop::WorkerSetup;
use crate::footprint::SourceLoad;
use crate::traffic::{
    BurstConfig, ClosedLoopConfig, ConversationsConfig, DiurnalConfig, DurationDist, FamilyKind,
    LongPromptMixConfig, OnOffConfig, PoissonConfig, TrafficError, Until, catalog, family_param,
};
use routelab_policies::located::rule;
use routelab_policies::streams::{
    NANOS_PER_SEC, TRAFFIC_STREAM, derive_seed, nanos_to_secs, secs_to_nanos,
};
use serde_saphyr::{Location, Spanned};

impl<'p> ScenarioReader<'p> {
    /// Every source of `traffic:`, then whether the fleet could hold what they would keep
    /// waiting.
    pub(super) fn traffic_sources(
        &self,
        raw: Option<&[Spanned<RawTraffic>]>,
        workers: &[WorkerSetup],
    ) -> Result<Vec<TrafficSpec>, ScenarioError> {
        let Some(raw) = raw.filter(|r| !r.is_empty()) else {
            let what = if raw.is_none() {
                "is missing"
            } else {
                "is empty"
            };
            return Err(self.file.error(
                "traffic",
                format!("{what}; give at least one source ({})", catalog::names()),
            ));
        };
        let traffic = raw
            .iter()
            .enumerate()
            .map(|(i, t)| self.traffic(i, t))
            .collect::<Result<Vec<_>, _>>()?;
        self.waiting_memory(raw, &traffic, workers)?;
        Ok(traffic)
    }

    /// Refuse traffic whose waiting requests would not fit in memory, naming the largest
    /// source.
    fn waiting_memory(
        &self,
        raw: &[Spanned<RawTraffic>],
        traffic: &[TrafficSpec],
        workers: &[WorkerSetup],
    ) -> Result<(), ScenarioError> {
        let loads: Vec<(usize, SourceLoad)> = traffic
            .iter()
            .enumerate()
            .filter_map(|(i, t)| source_load(t).map(|l| (i, l)))
            .collect();
        let only: Vec<SourceLoad> = loads.iter().map(|(_, l)| *l).collect();
        let Some(why) = crate::footprint::waiting_overflow(
            &only,
            workers,
            crate::footprint::memory_limit_bytes(),
        ) else {
            return Ok(());
        };
        let (i, _) = loads
            .iter()
            .max_by(|a, b| a.1.requests.total_cmp(&b.1.requests))
            .expect("an overflow has a source");
        Err(self
            .file
            .at(&raw[*i].referenced, format!("traffic[{i}]"), why)
            .valid(
                "traffic the fleet can keep up with, or fewer requests (`count`, \
                 `duration_s`): a run holds every waiting request in memory",
            ))
    }

    /// Source `i`; a synthetic one is checked by its generator now, not at run time.
    fn traffic(&self, i: usize, t: &Spanned<RawTraffic>) -> Result<TrafficSpec, ScenarioError> {
        let loc = &t.referenced;
        let field = format!("traffic[{i}].{}", t.value.kind().name);
        let spec = match &t.value {
            raw @ RawTraffic::Trace { .. } => return self.trace(loc, &field, raw),
            raw @ (RawTraffic::ClosedLoop { .. } | RawTraffic::Conversations { .. }) => {
                self.source_at(loc, &field).user_driven(raw)?
            }
            raw @ RawTraffic::Family { .. } => self.source_at(loc, &field).family(raw)?,
            raw => self.source_at(loc, &field).open_loop(raw)?,
        };
        if let Some(Err(e)) = spec.generator(derive_seed(0, TRAFFIC_STREAM)) {
            return Err(self.file.at(loc, format!("traffic[{i}]"), e.to_string()));
        }
        Ok(spec)
    }

    fn source_at<'a>(&'a self, loc: &'a Location, field: &'a str) -> SourceAt<'a, 'p> {
        SourceAt {
            reader: self,
            loc,
            field,
        }
    }
}

/// Where a synthetic source is read: its position and field path (`traffic[2].poisson`), so
/// that each parameter is named by its key alone.
struct SourceAt<'a, 'p> {
    reader: &'a ScenarioReader<'p>,
    loc: &'a Location,
    field: &'a str,
}

impl SourceAt<'_, '_> {
    /// Seconds at `name` (0 when not written), in nanoseconds.
    fn secs(&self, name: &str, v: Option<f64>) -> Result<u64, ScenarioError> {
        self.reader
            .secs(self.loc, &format!("{}.{name}", self.field), v, 0.0)
    }

    /// An open-loop generator's source (arrivals that do not wait for completions).
    fn open_loop(&self, raw: &RawTraffic) -> Result<TrafficSpec, ScenarioError> {
        Ok(match raw {
            RawTraffic::Burst {
                at_s,
                size,
                repeats,
                period_s,
                prompt,
                output,
            } => TrafficSpec::Burst(BurstConfig {
                at: self.secs("at_s", *at_s)?,
                size: *size,
                repeats: repeats.unwrap_or(1),
                period: self.secs("period_s", *period_s)?,
                prompt: *prompt,
                output: *output,
            }),
            RawTraffic::Poisson {
                start_s,
                rate_per_s,
                duration_s,
                count,
                prompt,
                output,
            } => TrafficSpec::Poisson(PoissonConfig {
                start: self.secs("start_s", *start_s)?,
                rate_per_s: *rate_per_s,
                until: self.until(*duration_s, *count)?,
                prompt: *prompt,
                output: *output,
            }),
            RawTraffic::Diurnal {
                start_s,
                min_rate_per_s,
                max_rate_per_s,
                period_s,
                phase_s,
                duration_s,
                count,
                prompt,
                output,
            } => TrafficSpec::Diurnal(DiurnalConfig {
                start: self.secs("start_s", *start_s)?,
                min_rate_per_s: *min_rate_per_s,
                max_rate_per_s: *max_rate_per_s,
                period: self.secs("period_s", Some(*period_s))?,
                phase: self.secs("phase_s", *phase_s)?,
                until: self.until(*duration_s, *count)?,
                prompt: *prompt,
                output: *output,
            }),
            RawTraffic::OnOff {
                start_s,
                burst_size,
                window_s,
                gap_s,
                duration_s,
                count,
                prompt,
                output,
            } => TrafficSpec::OnOff(OnOffConfig {
                start: self.secs("start_s", *start_s)?,
                burst_size: *burst_size,
                window: self.secs("window_s", Some(*window_s))?,
                gap: self.seconds_dist("gap_s", *gap_s)?,
                until: self.until(*duration_s, *count)?,
                prompt: *prompt,
                output: *output,
            }),
            RawTraffic::LongPromptMix {
                start_s,
                rate_per_s,
                duration_s,
                count,
                long_fraction,
                long_prompt,
                short_prompt,
                output,
            } => TrafficSpec::LongPromptMix(LongPromptMixConfig {
                start: self.secs("start_s", *start_s)?,
                rate_per_s: *rate_per_s,
                until: self.until(*duration_s, *count)?,
                long_fraction: *long_fraction,
                long_prompt: *long_prompt,
                short_prompt: *short_prompt,
                output: *output,
            }),
            RawTraffic::ClosedLoop { .. }
            | RawTraffic::Conversations { .. }
            | RawTraffic::Family { .. }
            | RawTraffic::Trace { .. } => {
                unreachable!("ScenarioReader::traffic sends open-loop kinds only")
            }
        })
    }

    /// A source whose next requests wait for answers: users in a closed loop, or
    /// conversations.
    fn user_driven(&self, raw: &RawTraffic) -> Result<TrafficSpec, ScenarioError> {
        Ok(match raw {
            RawTraffic::ClosedLoop {
                start_s,
                users,
                ramp_s,
                think_s,
                duration_s,
                count,
                prompt,
                output,
            } => TrafficSpec::ClosedLoop(ClosedLoopConfig {
                start: self.secs("start_s", *start_s)?,
                users: *users,
                ramp: self.secs("ramp_s", *ramp_s)?,
                think: self.seconds_dist("think_s", *think_s)?,
                until: self.until(*duration_s, *count)?,
                prompt: *prompt,
                output: *output,
            }),
            RawTraffic::Conversations {
                start_s,
                rate_per_s,
                conversations,
                turns,
                user_tokens,
                output,
                think_s,
                system_prompt_tokens,
                max_prompt_tokens,
            } => TrafficSpec::Conversations(ConversationsConfig {
                start: self.secs("start_s", *start_s)?,
                rate_per_s: *rate_per_s,
                conversations: *conversations,
                turns: *turns,
                user_tokens: *user_tokens,
                output: *output,
                think: self.seconds_dist("think_s", *think_s)?,
                system_prompt_tokens: system_prompt_tokens.unwrap_or(0),
                system_prompt_id: 0,
                max_prompt_tokens: *max_prompt_tokens,
            }),
            _ => unreachable!("ScenarioReader::traffic sends closed loops and conversations only"),
        })
    }

    /// A family of traffic: the family's figures ([`FamilyKind::defaults`]), each parameter
    /// written replacing its figure; a parameter written for a family it does not apply to is
    /// refused, naming the families it applies to.
    fn family(&self, raw: &RawTraffic) -> Result<TrafficSpec, ScenarioError> {
        let RawTraffic::Family {
            kind,
            start_s,
            rate_per_s,
            duration_s,
            prompt,
            output,
            turns,
            think_s,
            max_prompt_tokens,
            shared_prompts,
            shared_prompt_tokens,
            zipf_s,
            cv,
            burst_size,
            batch_fraction,
            batch_size,
        } = raw
        else {
            unreachable!("ScenarioReader::traffic sends families only")
        };
        let file = &self.reader.file;
        let at = |name: &str| format!("{}.{name}", self.field);
        let family = FamilyKind::from_name(kind).ok_or_else(|| {
            file.at(self.loc, at("kind"), format!("unknown family `{kind}`"))
                .valid(FamilyKind::names())
        })?;
        let rate_per_s = file.check(self.loc, &at("rate_per_s"), rule::positive(*rate_per_s))?;
        let duration = file
            .check(self.loc, &at("duration_s"), rule::period(*duration_s))
            .map(|_| secs_to_nanos(*duration_s))?;
        let mut cfg = family.defaults(self.secs("start_s", *start_s)?, rate_per_s, duration);
        let written = [
            ("turns", turns.is_some()),
            ("think_s", think_s.is_some()),
            ("max_prompt_tokens", max_prompt_tokens.is_some()),
            ("shared_prompts", shared_prompts.is_some()),
            ("shared_prompt_tokens", shared_prompt_tokens.is_some()),
            ("zipf_s", zipf_s.is_some()),
            ("cv", cv.is_some()),
            ("burst_size", burst_size.is_some()),
            ("batch_fraction", batch_fraction.is_some()),
            ("batch_size", batch_size.is_some()),
        ];
        for (name, _) in written.iter().filter(|(_, w)| *w) {
            let param = family_param(name).expect("every per-family parameter is listed");
            if !param.applies(family) {
                return Err(file
                    .at(
                        self.loc,
                        at(name),
                        format!("does not apply to the `{}` family", family.name()),
                    )
                    .valid(format!(
                        "`{name}` for {} only; leave it out for `{}`",
                        param.families(),
                        family.name()
                    )));
            }
        }
        cfg.prompt = prompt.unwrap_or(cfg.prompt);
        cfg.output = output.unwrap_or(cfg.output);
        cfg.turns = turns.unwrap_or(cfg.turns);
        if let Some(t) = think_s {
            cfg.think = self.seconds_dist("think_s", *t)?;
        }
        cfg.max_prompt_tokens = max_prompt_tokens.or(cfg.max_prompt_tokens);
        cfg.shared_prompts = shared_prompts.unwrap_or(cfg.shared_prompts);
        cfg.shared_prompt_tokens = shared_prompt_tokens.unwrap_or(cfg.shared_prompt_tokens);
        cfg.zipf_s = zipf_s.unwrap_or(cfg.zipf_s);
        cfg.cv = cv.unwrap_or(cfg.cv);
        cfg.burst_size = burst_size.unwrap_or(cfg.burst_size);
        cfg.batch_fraction = batch_fraction.unwrap_or(cfg.batch_fraction);
        cfg.batch_size = batch_size.unwrap_or(cfg.batch_size);
        cfg.validate().map_err(|e| match e {
            TrafficError::InvalidConfig { field, problem, .. } => {
                file.at(self.loc, at(field), problem)
            }
            other => file.at(self.loc, self.field, other.to_string()),
        })?;
        Ok(TrafficSpec::Family(cfg))
    }

    /// When a source ends: after `duration_s`, after `count` requests, whichever is first.
    fn until(&self, duration_s: Option<f64>, count: Option<u64>) -> Result<Until, ScenarioError> {
        if duration_s.is_none() && count.is_none() {
            return Err(self.reader.file.at(
                self.loc,
                self.field,
                "sets neither `duration_s` nor `count`; give at least one so the source ends",
            ));
        }
        Ok(Until {
            duration: duration_s
                .map(|d| self.secs("duration_s", Some(d)))
                .transpose()?,
            count,
        })
    }

    /// A duration distribution written in seconds at `name`.
    fn seconds_dist(&self, name: &str, d: RawSeconds) -> Result<DurationDist, ScenarioError> {
        let field = format!("{}.{name}", self.field);
        let s = |v: f64| self.reader.secs(self.loc, &field, Some(v), 0.0);
        Ok(match d {
            RawSeconds::Fixed(v) => DurationDist::Fixed(s(v)?),
            RawSeconds::Uniform { min, max } => {
                if min > max {
                    return Err(self.reader.file.at(
                        self.loc,
                        field,
                        format!("uniform min {min} > max {max}; expected min <= max"),
                    ));
                }
                DurationDist::Uniform {
                    min: s(min)?,
                    max: s(max)?,
                }
            }
            RawSeconds::Exponential { mean } => DurationDist::Exponential { mean: s(mean)? },
        })
    }
}

/// An open-loop source's load for the memory estimate ([`crate::footprint`]): none for a closed
/// loop (its users bound what waits) and a trace (checked when read).
fn source_load(t: &TrafficSpec) -> Option<SourceLoad> {
    Some(match t {
        TrafficSpec::Burst(c) => SourceLoad {
            requests: f64::from(c.size) * f64::from(c.repeats.max(1)),
            span_s: nanos_to_secs(c.period) * f64::from(c.repeats.saturating_sub(1)),
            output_mean: c.output.mean(),
        },
        TrafficSpec::Poisson(c) => SourceLoad::rated(c.rate_per_s, &c.until, c.output.mean()),
        TrafficSpec::Diurnal(c) => SourceLoad::rated(
            (c.min_rate_per_s + c.max_rate_per_s) / 2.0,
            &c.until,
            c.output.mean(),
        ),
        TrafficSpec::OnOff(c) => {
            let cycle_s = (c.window as f64 + c.gap.mean_ns()) / NANOS_PER_SEC;
            let rate = if cycle_s > 0.0 {
                c.burst_size.mean() / cycle_s
            } else {
                f64::INFINITY
            };
            SourceLoad::rated(rate, &c.until, c.output.mean())
        }
        TrafficSpec::LongPromptMix(c) => SourceLoad::rated(c.rate_per_s, &c.until, c.output.mean()),
        TrafficSpec::Conversations(c) => SourceLoad {
            requests: c.conversations as f64 * c.turns.mean(),
            span_s: c.conversations as f64 / c.rate_per_s.max(f64::MIN_POSITIVE),
            output_mean: c.output.mean(),
        },
        TrafficSpec::Family(c) => {
            let span_s = nanos_to_secs(c.duration);
            SourceLoad {
                requests: c.rate_per_s * span_s * c.requests_per_start(),
                span_s,
                output_mean: c.output.mean(),
            }
        }
        TrafficSpec::ClosedLoop(_) | TrafficSpec::Trace { .. } => return None,
    })
}
