//! The comparison as text: the console table ([`compare_table`]) and the Markdown findings
//! document (`docs/findings.md`: [`findings_markdown`], [`findings_baseline_markdown`],
//! [`findings_document`]).

use super::*;

/// An aligned plain-text table per scenario: key metrics as `mean ± half-width` across seeds,
/// the best mean per column marked with `*`; then how many seeds ran and why, and every
/// policy's paired difference from the baseline (`!` marks an established one).
pub fn compare_table(scenarios: &[ScenarioComparison]) -> String {
    let metrics: Vec<&Metric> = views::COMPARE_TERMINAL.iter().map(|n| view(n)).collect();
    let mut out = String::new();
    for (k, sc) in scenarios.iter().enumerate() {
        if k > 0 {
            out.push('\n');
        }
        let _ = writeln!(out, "{} ({})", sc.scenario, seeds_note(sc));
        let mut cols: Vec<(&str, bool)> = vec![("policy", false)];
        cols.extend(metrics.iter().map(|m| (m.label, true)));
        let mut t = TextTable::new(&cols);
        let (ivs, best) = intervals_and_best(sc, &metrics);
        for (i, p) in sc.policies.iter().enumerate() {
            let mut row = vec![p.policy.clone()];
            for (j, m) in metrics.iter().enumerate() {
                let mut s = interval_text::metric_cell(m, ivs[j][i]);
                if best[j].contains(&i) {
                    s.push('*');
                } else {
                    s.push(' ');
                }
                row.push(s);
            }
            t.row(row);
        }
        out.push_str(&t.render());
        out.push_str(&no_spread_note(sc, &metrics, &ivs));
        out.push_str(&paired_table(sc, &metrics));
        if !sc.seed_meaning.0.is_empty() {
            let _ = writeln!(out, "{}", sc.seed_meaning.0);
        }
        if let Some(slo) = &sc.slo {
            let _ = writeln!(
                out,
                "SLO column: the share of requests that meet {slo} (the scenario's `slo`)."
            );
        }
        if let Some(o) = &sc.out_of_sample {
            let _ = writeln!(out, "{}", o.sentence());
        }
    }
    if !scenarios.is_empty() {
        let _ = writeln!(out, "{}", crate::question::COMPARE);
        out.push_str("mean ± 95 % half-width across seeds; * best mean (s, tok/s, %)\n");
        if scenarios.iter().any(|sc| sc.policies.len() > 1) {
            out.push_str(
                "vs baseline: policy minus baseline per seed, mean [95 % interval] in % of the \
                 baseline's mean; ! established (the interval excludes 0)\n",
            );
        }
    }
    out
}

/// The seed note and, with two policies or more, the paired differences from the baseline.
pub(super) fn paired_table(sc: &ScenarioComparison, metrics: &[&Metric]) -> String {
    let mut out = format!("seeds: {}\n", seed_rule_note(sc));
    let Some(base) = sc.baseline_policy() else {
        return out;
    };
    if sc.policies.len() < 2 {
        return out;
    }
    let _ = writeln!(out, "vs baseline {}:", base.policy);
    let mut cols: Vec<(&str, bool)> = vec![("policy", false)];
    cols.extend(metrics.iter().map(|m| (m.label, true)));
    let mut t = TextTable::new(&cols);
    for (i, p) in sc.policies.iter().enumerate() {
        if i == sc.baseline {
            continue;
        }
        let mut row = vec![p.policy.clone()];
        for m in metrics {
            let d = paired_diff(p, base, m);
            let mut s = fmt_diff(m, &d);
            s.push(if d.established { '!' } else { ' ' });
            row.push(s);
        }
        t.row(row);
    }
    out.push_str(&t.render());
    out
}

/// A Markdown findings table (scenario | metric | winner | runner-up | margin % | paired
/// difference | established) for `docs/findings.md`, over the key metrics; exact ties are left
/// out. The margin is how much better the winner's mean is, in % of the runner-up's mean; the
/// paired difference is winner minus runner-up per seed, in % of the runner-up's mean with its
/// 95 % interval, and the win is established only when that interval excludes zero.
pub fn findings_markdown(scenarios: &[ScenarioComparison]) -> String {
    let file = compare_file(scenarios);
    let mut out = String::from(
        "| scenario | metric | winner | runner-up | margin % | paired difference [95 %] | established |\n\
         |---|---|---|---|---:|---:|---|\n",
    );
    for st in &file.scenarios {
        for m in key_metrics() {
            let Some(w) = st.winners.iter().find(|w| w.metric == m.name) else {
                continue;
            };
            let Some(runner) = &w.runner_up else { continue };
            if w.tie {
                continue;
            }
            let label = column_label(m);
            let _ = writeln!(
                out,
                "| {} | {} | {} ({}) | {} ({}) | {} | {} | {} |",
                md(&st.scenario),
                md(&label),
                md(&w.winner),
                fmt_metric(m, w.winner_mean),
                md(runner),
                fmt_metric(m, w.runner_up_mean),
                w.margin_pct
                    .map_or_else(|| "-".into(), |v| format!("{v:.1}")),
                w.paired.as_ref().map_or("-".into(), |d| fmt_diff(m, d)),
                established(w)
            );
        }
    }
    out
}

/// Per scenario, each policy against the baseline: the key metrics it is established better
/// on, worse on, and the rest (Markdown).
pub fn findings_baseline_markdown(scenarios: &[ScenarioComparison]) -> String {
    let file = compare_file(scenarios);
    let mut out = String::from(
        "| scenario | policy | baseline | better on | worse on | not established |\n\
         |---|---|---|---|---|---|\n",
    );
    for st in &file.scenarios {
        let Some(base) = &st.baseline else { continue };
        for p in st.policies.iter().filter(|p| !p.vs_baseline.is_empty()) {
            let list = |v: Verdict| {
                let names: Vec<String> = key_metrics()
                    .filter_map(|m| {
                        let d = p.vs_baseline.iter().find(|d| d.metric == m.name)?;
                        (d.verdict == v && d.n > 0).then(|| match d.relative_pct {
                            Some(r) if v != Verdict::NotEstablished => {
                                format!("{} {r:+.1}%", md(m.label))
                            }
                            _ => md(m.label),
                        })
                    })
                    .collect();
                if names.is_empty() {
                    "-".to_string()
                } else {
                    names.join(", ")
                }
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} |",
                md(&st.scenario),
                md(&p.policy),
                md(base),
                list(Verdict::Better),
                list(Verdict::Worse),
                list(Verdict::NotEstablished)
            );
        }
    }
    out
}

/// The whole findings document (`docs/findings.md`): a header saying how it was generated
/// (`seeds` says how many seeds, e.g. `5 seeds each`), the paired rule, the seeds each scenario
/// ran and why, [`findings_markdown`], [`findings_baseline_markdown`], then `extra_sections`
/// (whole Markdown sections, e.g. a capacity table) in order.
pub fn findings_document(
    scenarios: &[&str],
    seeds: &str,
    comparisons: &[ScenarioComparison],
    extra_sections: &[String],
) -> String {
    let mut out = format!(
        "# Findings\n\nGenerated by `routelab compare` over {} with {seeds}; do not edit by hand.\n\n\
         ## How a verdict is reached\n\n\
         Every policy of a scenario runs on the same seeds and, for a given seed, sees the same\n\
         traffic (common random numbers: the same arrivals and lengths for open-loop traffic; closed-loop\n\
         follow-ups depend on completions). A comparison is therefore made **per seed**: the difference\n\
         between the two policies on each seed, then the mean and 95 % interval (Student's t) of those\n\
         differences. A difference is **established** only when that paired interval excludes zero. The\n\
         per-policy intervals of the report are not the test: they include the seed-to-seed noise both\n\
         policies share, so they often overlap when one policy is better on every seed.\n\n\
         ## Seeds\n\n\
         What a seed is differs by scenario: a trace is resampled per seed (a local block\n\
         bootstrap of whole sessions, so its intervals carry the traffic's variability) or replayed\n\
         as recorded (`resample: none`: its intervals carry only the engines' and routers' own\n\
         randomness); synthetic traffic is drawn anew from each seed.\n\n\
         | scenario | baseline | seeds | decided by | traffic per seed |\n\
         |---|---|---:|---|---|\n",
        scenarios
            .iter()
            .map(|s| format!("`{s}`"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    for sc in comparisons {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            md(&sc.scenario),
            md(sc.baseline_policy().map_or("-", |b| b.policy.as_str())),
            sc.seeds_run(),
            match sc.seed_stop {
                SeedStop::Fixed => "fixed count",
                SeedStop::Precise => "auto: every difference precise enough",
                SeedStop::MaxSeeds => "auto: maximum count reached",
            },
            if sc.seed_meaning.1.is_empty() {
                "-".to_string()
            } else {
                md(&sc.seed_meaning.1)
            }
        );
    }
    let checked: Vec<&ScenarioComparison> = comparisons
        .iter()
        .filter(|sc| sc.out_of_sample.is_some())
        .collect();
    if !checked.is_empty() {
        out.push_str(
            "\n## Out of sample\n\n\
             With `--holdout`, each scenario's winner by the report's headline metric is picked on\n\
             the first part of each trace (by time) and checked on the held-out rest, paired on the\n\
             same seeds: it holds, it is beaten (established), or neither.\n\n\
             | scenario | winner in sample | best held out | verdict |\n\
             |---|---|---|---|\n",
        );
        for sc in &checked {
            let o = sc.out_of_sample.as_ref().expect("filtered");
            let _ = writeln!(
                out,
                "| {} | {} | {} | {}: {} |",
                md(&sc.scenario),
                md(&o.winner),
                md(&o.best_held_out),
                o.verdict_word(),
                md(&o.detail)
            );
        }
    }
    out.push_str(
        "\n## Winner per metric\n\n\
         Each row: which policy wins the metric on the scenario (mean over the seeds), the runner-up,\n\
         the margin in % of the runner-up's mean, and the paired difference winner minus runner-up\n\
         (mean and 95 % interval in % of the runner-up's mean). The win is established only when\n\
         that interval excludes zero.\n\n",
    );
    out.push_str(&findings_markdown(comparisons));
    out.push_str(
        "\n## Against the baseline\n\n\
         Each policy against its scenario's baseline (see the seeds table), on the key metrics:\n\
         where the paired difference is established better or worse (mean in % of the baseline's\n\
         mean), and where it is not established.\n\n",
    );
    out.push_str(&findings_baseline_markdown(comparisons));
    for section in extra_sections {
        out.push('\n');
        out.push_str(section);
        if !section.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}
