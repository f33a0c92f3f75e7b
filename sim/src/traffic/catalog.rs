//! The catalog of traffic kinds: every source a scenario's `traffic:` may list, with its
//! parameters, their defaults, what its generator refuses and how `routelab capacity` scales
//! its load.
//!
//! It is the one list of kinds: the scenario reader's field paths and `valid: …` lists, the
//! load-scale refusals and the table in `docs/scenarios.md` are all read from it. Tests hold
//! it to the reader: every kind and every parameter the YAML accepts is listed (and nothing
//! else), every example is a valid source, and every printed default is the one used (writing
//! it gives the same source as leaving it out).
//!
//! To add a kind: add its entry here, its `RawTraffic` variant and its `TrafficSpec`; the
//! compiler asks for the rest (`RawTraffic::kind`, `TrafficSpec::kind`).

/// A parameter of a traffic kind, as written in a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    /// The YAML field.
    pub name: &'static str,
    /// Whether it must be written, and what leaving it out means.
    pub default: Default,
}

/// What a parameter is when it is not written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Default {
    /// It must be written.
    Required,
    /// This YAML value (written, it gives the same source).
    Value(&'static str),
    /// Not a single value: what leaving it out means.
    Means(&'static str),
}

/// How `routelab capacity`'s load scale applies to a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadScale {
    /// Its arrival rate scales, as the sentence says.
    Scales(&'static str),
    /// Its load cannot be scaled, for the reason given.
    Refused(&'static str),
}

/// One kind of traffic source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrafficKind {
    /// The key in `traffic:` (`- poisson: { … }`).
    pub name: &'static str,
    /// One line on what it sends.
    pub summary: &'static str,
    /// Parameters, in the order the reader reads them.
    pub params: &'static [Param],
    /// What its generator refuses (beyond a parameter's type).
    pub rules: &'static str,
    /// How its load scales.
    pub load_scale: LoadScale,
    /// A minimal valid source, as YAML flow (the value under the kind's key).
    pub example: &'static str,
}

impl TrafficKind {
    /// Whether `routelab capacity` can scale this kind's load.
    pub fn scales(&self) -> bool {
        matches!(self.load_scale, LoadScale::Scales(_))
    }
}

const fn required(name: &'static str) -> Param {
    Param {
        name,
        default: Default::Required,
    }
}

const fn value(name: &'static str, yaml: &'static str) -> Param {
    Param {
        name,
        default: Default::Value(yaml),
    }
}

const fn means(name: &'static str, what: &'static str) -> Param {
    Param {
        name,
        default: Default::Means(what),
    }
}

const START: Param = value("start_s", "0");
const PROMPT: Param = required("prompt");
const OUTPUT: Param = required("output");
const DURATION: Param = means(
    "duration_s",
    "none, `count` ends it (one of the two is required)",
);
const COUNT: Param = means(
    "count",
    "none, `duration_s` ends it (one of the two is required)",
);

/// The sentence shared by the kinds that need a stop condition.
const ENDS: &str = "`duration_s` or `count` (at least one); sizes, lengths and gaps valid";

/// Every traffic kind, in the order `traffic:` errors list them.
pub const KINDS: [TrafficKind; 9] = [
    TrafficKind {
        name: "burst",
        summary: "`size` requests at one instant, optionally repeated every `period_s`",
        params: &[
            value("at_s", "0"),
            required("size"),
            value("repeats", "1"),
            value("period_s", "0"),
            PROMPT,
            OUTPUT,
        ],
        rules: "size >= 1; repeats >= 1; period_s > 0 when repeats > 1; lengths valid",
        load_scale: LoadScale::Scales(
            "with repeats > 1, the period ÷ scale; a single burst is an event, not a rate",
        ),
        example: "{ size: 4, prompt: { fixed: 100 }, output: { fixed: 10 } }",
    },
    TrafficKind {
        name: "poisson",
        summary: "Poisson arrivals at a mean rate",
        params: &[
            START,
            required("rate_per_s"),
            DURATION,
            COUNT,
            PROMPT,
            OUTPUT,
        ],
        rules: "rate_per_s > 0; `duration_s` or `count` (at least one); lengths valid",
        load_scale: LoadScale::Scales("rate_per_s × scale"),
        example: "{ rate_per_s: 2, count: 10, prompt: { fixed: 100 }, output: { fixed: 10 } }",
    },
    TrafficKind {
        name: "diurnal",
        summary: "a sinusoidal rate between a low and a high",
        params: &[
            START,
            required("min_rate_per_s"),
            required("max_rate_per_s"),
            required("period_s"),
            value("phase_s", "0"),
            DURATION,
            COUNT,
            PROMPT,
            OUTPUT,
        ],
        rules: "0 <= min_rate_per_s <= max_rate_per_s, max > 0; period_s > 0; `duration_s` or \
                `count` (at least one); lengths valid",
        load_scale: LoadScale::Scales(
            "min_rate_per_s and max_rate_per_s × scale (period and phase unchanged)",
        ),
        example: "{ min_rate_per_s: 1, max_rate_per_s: 3, period_s: 60, count: 10, prompt: { \
                  fixed: 100 }, output: { fixed: 10 } }",
    },
    TrafficKind {
        name: "on_off",
        summary: "sparse bursts: a burst's requests spread over a window, then an idle gap",
        params: &[
            START,
            required("burst_size"),
            required("window_s"),
            required("gap_s"),
            DURATION,
            COUNT,
            PROMPT,
            OUTPUT,
        ],
        rules: ENDS,
        load_scale: LoadScale::Scales(
            "the window and the idle gaps ÷ scale (burst sizes unchanged)",
        ),
        example: "{ burst_size: { fixed: 4 }, window_s: 1, gap_s: { fixed: 10 }, count: 10, \
                  prompt: { fixed: 100 }, output: { fixed: 10 } }",
    },
    TrafficKind {
        name: "closed_loop",
        summary: "users who wait for each answer and think before their next request",
        params: &[
            START,
            required("users"),
            value("ramp_s", "0"),
            required("think_s"),
            DURATION,
            COUNT,
            PROMPT,
            OUTPUT,
        ],
        rules: "users >= 1; `duration_s` or `count` (at least one); lengths and think times \
                valid",
        load_scale: LoadScale::Refused(
            "a closed loop's load is set by its users and their think time, not by an arrival \
             rate",
        ),
        example: "{ users: 2, think_s: { fixed: 1 }, count: 10, prompt: { fixed: 100 }, output: \
                  { fixed: 10 } }",
    },
    TrafficKind {
        name: "conversations",
        summary: "multi-turn conversations whose prompts share a growing prefix",
        params: &[
            START,
            required("rate_per_s"),
            required("conversations"),
            required("turns"),
            required("user_tokens"),
            OUTPUT,
            required("think_s"),
            value("system_prompt_tokens", "0"),
            means("max_prompt_tokens", "no limit"),
        ],
        rules: "rate_per_s > 0; conversations >= 1; max_prompt_tokens > system_prompt_tokens; \
                lengths and think times valid",
        load_scale: LoadScale::Scales(
            "the conversation start rate × scale (turns and think times unchanged)",
        ),
        example: "{ rate_per_s: 1, conversations: 3, turns: { fixed: 2 }, user_tokens: { fixed: \
                  50 }, output: { fixed: 10 }, think_s: { fixed: 1 } }",
    },
    TrafficKind {
        name: "long_prompt_mix",
        summary: "Poisson arrivals, a fraction of them with long prompts",
        params: &[
            START,
            required("rate_per_s"),
            DURATION,
            COUNT,
            required("long_fraction"),
            required("long_prompt"),
            required("short_prompt"),
            OUTPUT,
        ],
        rules: "rate_per_s > 0; long_fraction in [0, 1]; `duration_s` or `count` (at least \
                one); lengths valid",
        load_scale: LoadScale::Scales("rate_per_s × scale"),
        example: "{ rate_per_s: 2, count: 10, long_fraction: 0.1, long_prompt: { fixed: 8000 }, \
                  short_prompt: { fixed: 100 }, output: { fixed: 10 } }",
    },
    TrafficKind {
        name: "family",
        summary: "one of five families of realistic traffic (`kind`: chat, code, rag, agentic, \
                  batch-day), with its own sessions, shared prefixes and arrivals; [Traffic \
                  families](#traffic-families) gives each family's figures and sources",
        params: &[
            required("kind"),
            START,
            required("rate_per_s"),
            required("duration_s"),
            means("prompt", "the family's"),
            means("output", "the family's"),
            means("turns", "the family's (chat, agentic only)"),
            means("think_s", "the family's (chat, agentic only)"),
            means(
                "max_prompt_tokens",
                "no limit (chat, agentic only: a session ends before a turn that would exceed \
                 it)",
            ),
            means("shared_prompts", "the family's (chat, rag, agentic only)"),
            means(
                "shared_prompt_tokens",
                "the family's (chat, rag, agentic, batch-day only)",
            ),
            means("zipf_s", "the family's (chat, rag, agentic only)"),
            means("cv", "the family's (code only)"),
            means("burst_size", "the family's (agentic only)"),
            means("batch_fraction", "the family's (batch-day only)"),
            means("batch_size", "the family's (batch-day only)"),
        ],
        rules: "`kind` one of chat, code, rag, agentic, batch-day; rate_per_s > 0; duration_s > \
                0; a per-family parameter only for the families it names; lengths valid; turns, \
                burst_size and batch_size >= 1; shared_prompts 1 to 1,000,000; zipf_s >= 0; 0 < \
                cv <= 100; batch_fraction in [0, 1]; max_prompt_tokens >= 1",
        load_scale: LoadScale::Scales(
            "rate_per_s × scale: sessions (chat, agentic), requests (code, rag) and the online \
             day and its batch jobs (batch-day) start that much more often; what each session \
             and request is, burst and job sizes and the day's length unchanged",
        ),
        example: "{ kind: chat, rate_per_s: 1, duration_s: 10 }",
    },
    TrafficKind {
        name: "trace",
        summary: "a replay of a trace file (docs/traces.md), as recorded or resampled per seed",
        params: &[
            required("path"),
            means(
                "format",
                "from the extension, `.csv` azure and `.jsonl` mooncake",
            ),
            means("mapping", "none, for a named format"),
            value("time_scale", "1"),
            value("rate_scale", "1"),
            means("limit", "every row"),
            value("skip_rows", "0"),
            means(
                "start_offset_s",
                "the fleet's warm-up: once the registration probes have measured every worker",
            ),
            value("on_bad_row", "error"),
            means(
                "resample",
                "`none` under `run` and `check`, `block` under `compare`, `capacity`, `sweep` \
                 and `replicas`",
            ),
        ],
        rules: "the file exists; time_scale and rate_scale > 0; limit >= 1; a `jsonl` / `csv` log needs a \
                mapping; rows valid (or skipped and counted with `on_bad_row: skip`)",
        load_scale: LoadScale::Scales("rate_scale × scale (the same rows, sooner)"),
        example: "{ path: trace.csv }",
    },
];

/// The kind called `name`.
pub fn find(name: &str) -> Option<&'static TrafficKind> {
    KINDS.iter().find(|k| k.name == name)
}

/// Every kind's name, comma-separated.
pub fn names() -> String {
    KINDS.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
}

/// The names of the kinds whose load scales, comma-separated.
pub fn scalable_names() -> String {
    KINDS
        .iter()
        .filter(|k| k.scales())
        .map(|k| k.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The catalog as the Markdown table of `docs/scenarios.md`.
pub fn markdown_table() -> String {
    let mut out = String::from(
        "| kind | sends | parameters (**required**, `name` = default) | refused unless | `capacity` load scale |\n\
         |---|---|---|---|---|\n",
    );
    for k in &KINDS {
        let params: Vec<String> = k
            .params
            .iter()
            .map(|p| match p.default {
                Default::Required => format!("**`{}`**", p.name),
                Default::Value(v) => format!("`{}` = {v}", p.name),
                Default::Means(m) => format!("`{}`: {m}", p.name),
            })
            .collect();
        let scale = match k.load_scale {
            LoadScale::Scales(how) => how.to_string(),
            LoadScale::Refused(why) => format!("refused: {why}"),
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            k.name,
            k.summary,
            params.join("<br>"),
            k.rules,
            scale
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{RawTraffic, Scenario, TrafficSpec};
    use routelab_policies::located::parse_yaml;
    use std::path::PathBuf;

    /// The list serde gives after "expected one of" for `yaml` read as a source.
    fn expected_list(yaml: &str) -> Vec<String> {
        let e = parse_yaml::<RawTraffic>(yaml, "t.yaml")
            .unwrap_err()
            .to_string();
        let (_, list) = e
            .split_once("expected one of ")
            .unwrap_or_else(|| panic!("{e}"));
        let list = list.lines().next().unwrap_or_default();
        list.split(", ")
            .map(|s| s.trim_matches(|c: char| c == '`' || c == '.').to_string())
            .collect()
    }

    #[test]
    fn the_catalog_lists_every_kind_and_parameter_the_reader_accepts() {
        let kinds: Vec<&str> = KINDS.iter().map(|k| k.name).collect();
        assert_eq!(expected_list("nope: {}\n"), kinds);
        for k in &KINDS {
            let params: Vec<&str> = k.params.iter().map(|p| p.name).collect();
            let got = expected_list(&format!("{}: {{ not_a_field: 1 }}\n", k.name));
            assert_eq!(got, params, "{}", k.name);
        }
    }

    /// A directory with a two-row Azure trace for the `trace` example.
    fn workdir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("routelab-catalog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("trace.csv"),
            "TIMESTAMP,ContextTokens,GeneratedTokens\n\
             2023-11-16 18:15:46.6805900,100,10\n\
             2023-11-16 18:15:47.6805900,200,20\n",
        )
        .unwrap();
        dir
    }

    /// The one source `value` of kind `kind`, read as a scenario in `dir`.
    fn source(dir: &std::path::Path, kind: &str, value: &str) -> TrafficSpec {
        let yaml = format!(
            "fleet: [{{ name: w, profile: rtx-pro-6000-27b }}]\ntraffic:\n  - {kind}: {value}\n"
        );
        let sc = Scenario::from_yaml(&yaml, &dir.join("s.yaml"))
            .unwrap_or_else(|e| panic!("{kind}: {value}: {e}"));
        assert_eq!(sc.traffic.len(), 1);
        sc.traffic[0].clone()
    }

    #[test]
    fn every_example_is_a_valid_source_of_its_kind() {
        let dir = workdir();
        for k in &KINDS {
            assert_eq!(source(&dir, k.name, k.example).kind().name, k.name);
        }
    }

    #[test]
    fn every_printed_default_is_the_default_used() {
        let dir = workdir();
        for k in &KINDS {
            let omitted = format!("{:?}", source(&dir, k.name, k.example));
            for p in k.params {
                let Default::Value(v) = p.default else {
                    continue;
                };
                assert!(!k.example.contains(p.name), "{}: {}", k.name, p.name);
                let written = k
                    .example
                    .replacen("{ ", &format!("{{ {}: {v}, ", p.name), 1);
                assert_eq!(
                    format!("{:?}", source(&dir, k.name, &written)),
                    omitted,
                    "{}.{} written as {v}",
                    k.name,
                    p.name
                );
            }
        }
    }

    #[test]
    fn the_docs_table_is_the_catalogs() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/scenarios.md");
        let doc = std::fs::read_to_string(path).unwrap();
        let begin = "<!-- traffic kinds: generated from sim/src/traffic/catalog.rs -->\n";
        let end = "<!-- end of traffic kinds -->";
        let (_, rest) = doc.split_once(begin).expect("the table's start marker");
        let (table, _) = rest.split_once(end).expect("the table's end marker");
        assert_eq!(
            table,
            markdown_table(),
            "docs/scenarios.md's table differs from the catalog; paste markdown_table()'s output"
        );
    }
}
