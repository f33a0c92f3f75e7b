//! The capacity section of `docs/findings.md`: for each scenario, every policy's capacity at the
//! SLO against round robin (the study's baseline) and against the best of the field's routers,
//! with paired intervals, and one sentence saying which policy to ship and by how much.

use super::CapacityStudy;
use crate::findings;
use crate::interval_text;
use crate::num::fmt_sig;
use crate::stats::{Interval, excludes};
use routelab_policies::PolicyRole;
use std::fmt::Write as _;

/// What a policy is, for the verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    /// The study's baseline (round robin by default).
    Baseline,
    /// A router from the field (SGLang, llm-d, Stargate, Dynamo, production-stack).
    Field,
    /// The lab-only oracle: true capacities, not deployable.
    Oracle,
    /// Ours: the source's policies and the measured-weight ones.
    Ours,
}

impl PolicyKind {
    /// Of policy `i` of a study: the baseline, else the role its validated config gave it.
    pub fn of(st: &CapacityStudy, i: usize) -> PolicyKind {
        if i == st.baseline {
            return PolicyKind::Baseline;
        }
        match st.policies[i].role {
            PolicyRole::Field => PolicyKind::Field,
            PolicyRole::Oracle => PolicyKind::Oracle,
            PolicyRole::Ours => PolicyKind::Ours,
        }
    }

    fn label(self) -> &'static str {
        match self {
            PolicyKind::Baseline => "baseline",
            PolicyKind::Field => "field",
            PolicyKind::Oracle => "oracle (lab only)",
            PolicyKind::Ours => "ours",
        }
    }
}

/// `1.17x [1.16, 1.18]` with `established` or `not established`.
pub(crate) fn ratio_cell(r: Option<Interval>) -> String {
    match r {
        None => "-".into(),
        Some(r) => {
            let ci = interval_text::bounds(&r, 3)
                .map(|b| format!(" {b}"))
                .unwrap_or_default();
            let verdict = if excludes(&r, 1.0) {
                ""
            } else {
                " (not established)"
            };
            format!("{}x{ci}{verdict}", fmt_sig(Some(r.mean), 3))
        }
    }
}

/// The index with the largest mean capacity among those `keep` accepts.
pub fn best(st: &CapacityStudy, keep: impl Fn(usize) -> bool) -> Option<usize> {
    (0..st.policies.len())
        .filter(|&i| keep(i))
        .filter_map(|i| st.policies[i].interval().map(|iv| (i, iv.mean)))
        // The first listed wins a tie (stable, so the text does not depend on float noise).
        .fold(None, |acc: Option<(usize, f64)>, (i, m)| match acc {
            Some((_, bm)) if bm >= m => acc,
            _ => Some((i, m)),
        })
        .map(|(i, _)| i)
}

/// What policy `i` carries against policy `j` (`who`, e.g. "round robin"): "2.1x [2.0, 2.2]
/// round robin's load", or its request rate where `j` meets the SLO at no load tried.
pub(crate) fn versus(st: &CapacityStudy, i: usize, j: usize, who: &str) -> String {
    if st.policies[j].scales().iter().all(|&s| s == 0.0) {
        return format!(
            "{} req/s, where {who} meets the SLO at no load tried",
            fmt_sig(st.rate(i).map(|r| r.mean), 3)
        );
    }
    format!("{} {who}'s load", ratio_cell(st.ratio_to(i, j)))
}

/// The one sentence that says which policy to ship and by how much (the findings' verdict,
/// also the first sentence of the console table and of `report.html`).
pub fn ship_sentence(st: &CapacityStudy) -> String {
    match &st.held_out_of {
        // A held-out part picks nothing: it says the verdict of the study it checks.
        Some(o) => format!(
            "This is the held-out part: it checks the policy picked on the rest of the trace \
             and picks none of its own. {}",
            o.sentence()
        ),
        None => scenario_verdict(st),
    }
}

fn scenario_verdict(st: &CapacityStudy) -> String {
    let kinds: Vec<PolicyKind> = (0..st.policies.len())
        .map(|i| PolicyKind::of(st, i))
        .collect();
    let deployable = |i: usize| kinds[i] != PolicyKind::Oracle;
    let Some(ship) = best(st, deployable) else {
        return "No policy has a capacity here.".into();
    };
    let name = |i: usize| format!("`{}`", st.policies[i].policy);
    if st.policies[ship].scales().iter().all(|&s| s == 0.0) {
        return "No deployable policy meets this SLO at any load tried: loosen the SLO or change \
                the fleet."
            .into();
    }
    // Policies whose paired ratio to the shipped one does not exclude 1 are ties: the choice
    // among them is not established, and the reader should know it.
    let tied: Vec<String> = (0..st.policies.len())
        .filter(|&i| i != ship && deployable(i) && i != st.baseline)
        .filter(|&i| st.ratio_to(i, ship).is_some_and(|r| !excludes(&r, 1.0)))
        .map(name)
        .collect();
    let tie_note = if tied.is_empty() {
        String::new()
    } else {
        format!(
            " (tied with {}: their paired ratios to it include 1)",
            tied.join(", ")
        )
    };
    // The baseline by its name unless it is the default, round robin (issue 41: `--baseline
    // least-load` was still called "round robin" here).
    let base = &st.policies[st.baseline].policy;
    let who = if base.as_str() == "equal/round-robin/none/none" {
        "round robin".to_string()
    } else {
        format!("`{base}`")
    };
    let mut s = format!(
        "Ship {}: it carries {}",
        name(ship),
        versus(st, ship, st.baseline, &who)
    );
    let field_best = best(st, |i| kinds[i] == PolicyKind::Field);
    match (kinds[ship], field_best) {
        (PolicyKind::Field, _) => {
            s.push_str(", the most of any deployable policy");
            s.push_str(&tie_note);
            if let Some(ours) = best(st, |i| kinds[i] == PolicyKind::Ours) {
                // "Lose" only when the paired ratio says so; a tie is said as a tie.
                let lose = st
                    .ratio_to(ours, ship)
                    .is_some_and(|r| excludes(&r, 1.0) && r.mean < 1.0)
                    || st.policies[ours].scales().iter().all(|&c| c == 0.0);
                let verdict = if lose {
                    "Our measured-weight policies lose to this field router here"
                } else {
                    "Our measured-weight policies are not established to lose here"
                };
                let _ = write!(
                    s,
                    ". {verdict}: the best of ours, {}, carries {}",
                    name(ours),
                    versus(st, ours, ship, &name(ship))
                );
            }
        }
        (_, Some(f)) => {
            let _ = write!(
                s,
                " and {} (the best of the field's routers here){tie_note}",
                versus(st, ship, f, &name(f))
            );
        }
        (_, None) => s.push_str(&tie_note),
    }
    s.push('.');
    s
}

/// The marker name of one study's part of the capacity section: the scenario and the SLO, so a
/// scenario may be studied at several SLOs (a strict one and a looser one) side by side.
fn part_name(st: &CapacityStudy) -> String {
    let target = st
        .slo
        .target
        .map(|t| format!(" target {t}"))
        .unwrap_or_default();
    format!("{}{} at {}{target}", part_prefix(), st.scenario, st.slo)
}

/// What every part's marker name starts with.
fn part_prefix() -> String {
    format!("{}/", findings::CAPACITY)
}

/// The findings document `doc` with the capacity section updated for `studies`: each study's
/// part (one per scenario and SLO) is written in place when the section already has it, else
/// appended; the parts not studied this time are kept, so each scenario can be studied at its
/// own SLO, or at several.
pub fn update_findings(doc: &str, studies: &[CapacityStudy]) -> String {
    findings::update_parts(
        doc,
        findings::CAPACITY,
        SECTION_HEADER,
        studies.iter().map(|st| (part_name(st), scenario_part(st))),
    )
}

/// The capacity section for `studies` alone (one table and one verdict per scenario).
pub fn findings_section(studies: &[CapacityStudy]) -> String {
    let mut out = String::from(SECTION_HEADER);
    for st in studies {
        out.push('\n');
        out.push_str(&scenario_part(st));
    }
    out
}

const SECTION_HEADER: &str = "## Capacity at the SLO\n\n\
         Generated by `routelab capacity --findings`; do not edit by hand. For each scenario, each\n\
         policy's **capacity**: the largest load scale (× every source's arrival rate) at which the\n\
         SLO holds, searched on each seed to the stated precision; its request rate; and its paired\n\
         ratio (per-seed capacities, 95 % interval) to round robin and to the best of the field's\n\
         routers in that scenario. A ratio is established only when its interval excludes 1. A\n\
         policy that meets the SLO at no load tried counts as capacity 0 on that seed. A trace is\n\
         a new block-bootstrap resample on each seed unless a part says otherwise, so the\n\
         intervals carry the traffic's variability; with `--holdout`, a part ends with whether\n\
         the policy to ship still wins on the held-out end of each trace.\n";

/// One scenario's table and verdict.
fn scenario_part(st: &CapacityStudy) -> String {
    let mut out = String::new();
    let kinds: Vec<PolicyKind> = (0..st.policies.len())
        .map(|i| PolicyKind::of(st, i))
        .collect();
    let field_best = best(st, |i| kinds[i] == PolicyKind::Field);
    let per_seed = if st.seed_meaning.1.is_empty() {
        String::new()
    } else {
        format!(" ({})", st.seed_meaning.1)
    };
    let _ = write!(
        out,
        "### {} at `{}`{}\n\nSLO: {}; load scale 1 = {} req/s; {} seeds{per_seed}; precision {} %.\n\n\
         | policy | kind | capacity (load scale) | req/s | vs round robin | vs best field router{} |\n\
         |---|---|---:|---:|---|---|\n",
        st.scenario,
        st.slo,
        st.slo
            .target
            .map(|t| format!(" for {}% of requests", t * 100.0))
            .unwrap_or_default(),
        st.slo.rule(),
        fmt_sig(st.base_rate_per_s, 3),
        st.seeds.len(),
        st.precision * 100.0,
        field_best
            .map(|f| format!(" (`{}`)", st.policies[f].policy))
            .unwrap_or_default(),
    );
    for (i, p) in st.policies.iter().enumerate() {
        let iv = p.interval();
        let cap = interval_text::cell(iv, 3);
        let note = p.censored_note();
        // The note's headline ("infeasible on 3/5 seeds (counted as 0)"); the why is in the
        // command's own outputs.
        let cap = match note.split(':').next() {
            Some(head) if !head.is_empty() => format!("{cap} ({head})"),
            _ => cap,
        };
        let vs_field = match field_best {
            Some(f) if f != i => ratio_cell(st.ratio_to(i, f)),
            Some(_) => "best field".into(),
            None => "-".into(),
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} | {} |",
            p.policy,
            kinds[i].label(),
            cap,
            fmt_sig(st.rate(i).map(|r| r.mean), 3),
            if i == st.baseline {
                "baseline".into()
            } else {
                ratio_cell(st.ratio(i))
            },
            vs_field,
        );
    }
    let _ = writeln!(out, "\n{}", scenario_verdict(st));
    if let Some(o) = &st.out_of_sample {
        let _ = writeln!(out, "\n{}", o.sentence());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::fixture;
    use super::super::*;
    use super::*;
    use crate::holdout::{Holds, OutOfSample};

    /// round robin 1x, a field router 1.5x, ours 1.2x, the oracle 2x — every seed alike up to
    /// seed noise both share.
    fn study(ours_speed: f64) -> CapacityStudy {
        let spec = SloSpec::parse("e2el_mean<=500ms", None).unwrap();
        let policies = [
            "equal/round-robin/none/none",
            "cache-aware",
            "seed-v3",
            "oracle/sed/capacity/weighted:24",
        ];
        let speeds = [1.0, 1.5, ours_speed, 2.0];
        fixture::study(&spec, &policies, 3, 1.0, |p, seed| {
            8.0 * speeds[p] * (1.0 + seed as f64 / 10.0)
        })
    }

    #[test]
    fn a_field_router_that_wins_is_shipped_and_our_loss_is_stated() {
        let st = study(1.2);
        assert_eq!(PolicyKind::of(&st, 0), PolicyKind::Baseline);
        assert_eq!(PolicyKind::of(&st, 1), PolicyKind::Field);
        assert_eq!(PolicyKind::of(&st, 2), PolicyKind::Ours);
        assert_eq!(PolicyKind::of(&st, 3), PolicyKind::Oracle);
        // The kind is the config's role, whatever the policy is called (issue 28: it was the
        // name parsed back, so a self-named YAML oracle counted as ours).
        let mut renamed = st.clone();
        renamed.policies[3].policy = "our-upper-bound".into();
        assert_eq!(PolicyKind::of(&renamed, 3), PolicyKind::Oracle);
        let md = findings_section(&[st]);
        // The oracle carries most but is not deployable: the field router is shipped.
        assert!(
            md.contains("Ship `cache-aware`: it carries 1.50x ["),
            "{md}"
        );
        assert!(
            md.contains("Our measured-weight policies lose to this field router here: the best of ours, `seed-v3`, carries 0.800x ["),
            "{md}"
        );
        assert!(
            md.contains("| vs best field router (`cache-aware`) |"),
            "{md}"
        );
        assert!(md.contains("| `seed-v3` | ours |"), "{md}");
    }

    #[test]
    fn ours_winning_is_compared_with_the_best_field_router() {
        let md = findings_section(&[study(1.8)]);
        assert!(md.contains("Ship `seed-v3`: it carries 1.80x ["), "{md}");
        assert!(
            md.contains("(the best of the field's routers here)"),
            "{md}"
        );
        assert!(
            md.contains("and 1.20x [1.20, 1.20] `cache-aware`'s load"),
            "{md}"
        );
    }

    #[test]
    fn a_baseline_that_never_meets_the_slo_is_said_so() {
        let spec = SloSpec::parse("e2el_mean<=500ms", None).unwrap();
        // Round robin: past saturation even at 1/64 load.
        let st = fixture::study(
            &spec,
            &["equal/round-robin/none/none", "seed-v3"],
            2,
            1.0,
            |p, _| if p == 0 { 0.0 } else { 8.0 },
        );
        assert_eq!(st.policies[0].scales(), [0.0, 0.0]);
        assert!(
            st.policies[0]
                .censored_note()
                .starts_with("infeasible on 2/2 seeds")
        );
        let md = findings_section(&[st]);
        assert!(
            md.contains("Ship `seed-v3`: it carries ")
                && md.contains(" req/s, where round robin meets the SLO at no load tried"),
            "{md}"
        );
        assert!(
            md.contains("| 0 ± 0 (infeasible on 2/2 seeds (counted as 0)) |"),
            "{md}"
        );
    }

    #[test]
    fn updating_replaces_the_studied_scenarios_and_keeps_the_others() {
        let renamed = |name: &str, speed: f64| {
            let mut st = study(speed);
            st.scenario = name.into();
            st
        };
        let doc = "# Findings\n\nfrom compare\n";
        let first = update_findings(doc, &[renamed("a", 1.2), renamed("b", 1.2)]);
        assert!(first.starts_with(doc), "{first}");
        assert_eq!(first.matches("## Capacity at the SLO").count(), 1);
        // b again at another speed: a is kept as it was, b replaced in place (still after a).
        let second = update_findings(&first, &[renamed("b", 1.8)]);
        let a_part = |d: &str| crate::findings::section(d, "capacity/a").map(str::to_string);
        assert_eq!(a_part(&second), a_part(&first));
        let (ia, ib) = (second.find("### a").unwrap(), second.find("### b").unwrap());
        assert!(ia < ib, "{second}");
        assert!(second.contains("Ship `seed-v3`"), "{second}");
        assert_eq!(second.matches("### b").count(), 1);
        // A new scenario is appended after the kept ones.
        let third = update_findings(&second, &[renamed("c", 1.2)]);
        assert!(third.find("### c").unwrap() > third.find("### b").unwrap());
        assert_eq!(
            update_findings(&third, &[]),
            third,
            "nothing studied: nothing moves"
        );
    }

    /// The check itself is the lab's (`routelab_lab::holdout`); its outcome is shown in the
    /// scenario's part of the findings.
    #[test]
    fn an_out_of_sample_check_is_shown_in_the_findings() {
        let o = OutOfSample {
            held_out: crate::holdout::held_out_text(0.3),
            criterion: "the most capacity at the SLO of any deployable policy".into(),
            winner: "seed-v3".into(),
            best_held_out: "cache-aware".into(),
            holds: Holds::No,
            detail: "`cache-aware` carries 1.25x [1.25, 1.25] `seed-v3`'s load there".into(),
        };
        let mut st = study(1.8);
        st.out_of_sample = Some(o);
        st.seed_meaning = ("A seed: …".into(), "trace resampled (60 s blocks)".into());
        let md = findings_section(&[st]);
        assert!(
            md.contains("3 seeds (trace resampled (60 s blocks)); precision"),
            "{md}"
        );
        assert!(
            md.contains(
                "\nOut of sample (the last 30 % of each trace's span held out; the winner \
                         picked on the rest by the most capacity at the SLO of any deployable \
                         policy): `seed-v3` does not hold: `cache-aware` beats it"
            ),
            "{md}"
        );
    }

    #[test]
    fn ties_with_the_shipped_policy_are_named() {
        // Ours as fast as the field router: the paired ratio is exactly 1, not established.
        let md = findings_section(&[study(1.5)]);
        assert!(
            md.contains("Ship `cache-aware`: it carries 1.50x")
                && md.contains("the most of any deployable policy (tied with `seed-v3`: their paired ratios to it include 1). Our measured-weight policies are not established to lose here: the best of ours, `seed-v3`, carries 1.00x"),
            "{md}"
        );
    }
}
