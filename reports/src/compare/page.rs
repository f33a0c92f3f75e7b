//! The comparison's page: its charts (bars with intervals, the first seed's latency CDF), the
//! self-contained `report.html`, and the one sentence every report page opens with
//! ([`headline`]).

use super::*;

pub(super) fn bars_panel(sc: &ScenarioComparison, m: &Metric, title: &str) -> BarPanel {
    let ivs: Vec<Option<Interval>> = sc.policies.iter().map(|p| interval(p, m)).collect();
    BarPanel {
        title: title.to_string(),
        x_label: "policy".into(),
        y_label: format!("{} ({})", m.label, m.unit.as_str()),
        categories: sc.policies.iter().map(|p| p.policy.clone()).collect(),
        groups: vec![BarGroup {
            name: m.label.to_string(),
            color: chart::color(0),
            values: ivs.iter().map(|iv| iv.map(|i| i.mean)).collect(),
            errors: ivs
                .iter()
                .map(|iv| iv.and_then(|i| i.half_width.map(|_| (i.low().max(0.0), i.high()))))
                .collect(),
        }],
        y_percent: false,
        color_by_category: true,
    }
}

pub(super) fn seeds_note(sc: &ScenarioComparison) -> String {
    let n = sc.policies.iter().map(|p| p.runs.len()).max().unwrap_or(0);
    format!("{n} seed{}", if n == 1 { "" } else { "s" })
}

pub(super) fn bars_figure(sc: &ScenarioComparison) -> Figure {
    let panels = views::COMPARE_BARS
        .iter()
        .map(|(n, title)| Panel::Bars(bars_panel(sc, view(n), title)))
        .collect();
    Figure::new(format!("{}: {}", sc.scenario, seeds_note(sc)), panels)
}

pub(super) fn cdf_figure(sc: &ScenarioComparison) -> Figure {
    let series = sc
        .policies
        .iter()
        .enumerate()
        .map(|(i, p)| Series {
            name: match p.runs.first() {
                Some(r) => format!("{} (seed {})", p.policy, r.seed),
                None => p.policy.clone(),
            },
            color: chart::color(i),
            points: p
                .first_seed_e2e
                .as_ref()
                .map(chart::cdf_points)
                .unwrap_or_default(),
        })
        .collect();
    latency_cdf_figure(
        &format!("{}: end-to-end latency CDF, first seed", sc.scenario),
        "end-to-end latency",
        series,
    )
}

pub(super) fn compare_html(
    scenarios: &[ScenarioComparison],
    file: &CompareFile,
    charts: &[(chart::Rendered, chart::Rendered)],
) -> String {
    let mut page = Page::new("routelab compare");
    page.el("h1", None, "routelab compare");
    page.el(
        "p",
        Some("meta"),
        &format!(
            "{} scenario{} · mean across seeds ± half-width of the 95 % interval (Student's t) · \
             best mean per column highlighted",
            scenarios.len(),
            if scenarios.len() == 1 { "" } else { "s" }
        ),
    );
    // The report opens with the verdict: one sentence per scenario.
    let m = headline_metric();
    for st in &file.scenarios {
        let sentence = headline(st.winners.iter().find(|w| w.metric == m.name), m);
        if file.scenarios.len() == 1 {
            page.el("p", Some("lead"), &sentence);
        } else {
            page.el("p", Some("lead"), &format!("{}: {sentence}", st.scenario));
        }
    }
    page.el("p", Some("meta"), crate::question::COMPARE);
    for ((sc, st), (bars, cdf)) in scenarios.iter().zip(&file.scenarios).zip(charts) {
        page.el("h2", None, &sc.scenario);
        if !sc.description.is_empty() {
            page.el("p", Some("desc"), &sc.description);
        }
        page.el("p", Some("meta"), &seed_rule_note(sc));
        if !sc.seed_meaning.0.is_empty() {
            page.el("p", Some("meta"), &sc.seed_meaning.0);
        }
        if let Some(o) = &sc.out_of_sample {
            page.el("p", Some("lead"), &o.sentence());
        }
        page.raw(&scenario_table_html(sc));
        page.raw(&winners_html(st));
        page.raw(&baseline_html(st));
        page.figure(
            &bars.svg,
            "Mean end-to-end latency and p99 TTFT per policy; error bars: 95 % interval across seeds.",
        );
        page.figure(
            &cdf.svg,
            "End-to-end latency CDF of the first seed, per policy.",
        );
    }
    page.raw(
        "<p class=\"meta\"><a href=\"compare.json\">compare.json</a> · \
         <a href=\"compare.csv\">compare.csv</a> · <a href=\"compare_seeds.csv\">compare_seeds.csv</a></p>",
    );
    page.finish()
}

pub(super) fn scenario_table_html(sc: &ScenarioComparison) -> String {
    let metrics: Vec<&Metric> = key_metrics().collect();
    let headers: Vec<String> = metrics.iter().map(|m| column_label(m)).collect();
    let mut header: Vec<(&str, bool)> = vec![("policy", true), ("seeds", false)];
    header.extend(headers.iter().map(|h| (h.as_str(), false)));
    let (ivs, best) = intervals_and_best(sc, &metrics);
    let rows: Vec<(bool, Vec<Cell>)> = sc
        .policies
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut cells = vec![Cell::text(&p.policy), Cell::num(p.runs.len().to_string())];
            for (k, m) in metrics.iter().enumerate() {
                let iv = ivs[k][i];
                let mut c = Cell::num(interval_text::metric_cell(m, iv)).best(best[k].contains(&i));
                if let Some(iv) = iv {
                    c = c.titled(format!(
                        "n = {}, 95 % interval [{}, {}]",
                        iv.n,
                        fmt_metric(m, Some(iv.low())),
                        fmt_metric(m, Some(iv.high()))
                    ));
                }
                cells.push(c);
            }
            (false, cells)
        })
        .collect();
    split_table(&header, &rows, 2)
}

pub(super) fn winners_html(st: &ScenarioStats) -> String {
    let header = [
        ("metric", true),
        ("winner", true),
        ("runner-up", true),
        ("margin", false),
        ("intervals overlap", true),
        ("paired difference (95 %)", false),
        ("established", true),
    ];
    let rows: Vec<(bool, Vec<Cell>)> = key_metrics()
        .filter_map(|m| {
            st.winners
                .iter()
                .find(|w| w.metric == m.name)
                .map(|w| (m, w))
        })
        .filter(|(_, w)| w.runner_up.is_some() && !w.tie)
        .map(|(m, w)| {
            (
                false,
                vec![
                    Cell::text(m.label),
                    Cell::text(&w.winner),
                    Cell::text(w.runner_up.as_deref().unwrap_or("-")),
                    Cell::num(fmt_margin(w)),
                    Cell::text(match w.intervals_overlap {
                        Some(true) => "yes",
                        Some(false) => "no",
                        None => "-",
                    }),
                    Cell::num(w.paired.as_ref().map_or("-".into(), |d| fmt_diff(m, d))),
                    Cell::text(established(w)),
                ],
            )
        })
        .collect();
    if rows.is_empty() {
        return "<p class=\"note\">No metric separates the policies.</p>".into();
    }
    // One table: a win reads across its row, and only the policy names need room (they wrap).
    let mut s = table(&header, &rows);
    s.push_str(
        "\n<p class=\"note\">Winner by mean across seeds; margin in % of the runner-up's \
         mean; metrics on which the best two tie are left out. Paired difference: winner minus \
         runner-up on each seed both ran (same traffic), mean and 95 % interval in % of the \
         runner-up's mean; the win is established only when that interval excludes zero \
         (overlapping per-policy intervals do not mean there is no difference).</p>",
    );
    s
}

/// The metric a report's opening sentence ([`headline`]) judges policies by: the first panel of
/// the comparison's bar chart ([`views::COMPARE_BARS`]), mean end-to-end latency, what a user
/// of the gateway waits for. The report leads with that sentence and that chart.
pub fn headline_metric() -> &'static Metric {
    view(views::COMPARE_BARS[0].0)
}

/// A value with its unit, for a sentence (`5.04 s`, `96.8%`, `1740 tok/s`).
pub(crate) fn with_unit(m: &Metric, v: Option<f64>) -> String {
    match m.unit {
        Unit::Fraction => fmt_metric(m, v),
        u => format!("{} {}", fmt_metric(m, v), u.as_str()),
    }
}

/// The one sentence a report opens with: the best policy on `m` (the [`Winner`] that
/// [`compare_file`] computed) against the runner-up, with their paired difference and its 95 %
/// interval ([`fmt_diff`]). "Tied" when the means are equal or the interval includes 0; with
/// one seed there is no interval, and the sentence says so and points to `routelab compare`.
pub(crate) fn headline(w: Option<&Winner>, m: &Metric) -> String {
    let what = m.label;
    let Some(w) = w else {
        return format!("No policy has a value for {what}, so there is no winner on it.");
    };
    let best = match m.direction {
        Direction::Higher => "highest",
        _ => "lowest",
    };
    let (Some(runner), Some(d)) = (&w.runner_up, &w.paired) else {
        return format!(
            "{} is the only policy ({what} {}): there is nothing to compare it with.",
            w.winner,
            with_unit(m, w.winner_mean)
        );
    };
    let means = format!(
        "{} against {}",
        with_unit(m, w.winner_mean),
        with_unit(m, w.runner_up_mean)
    );
    let diff = fmt_diff(m, d);
    let seeds = format!("{} seed{}", d.n, if d.n == 1 { "" } else { "s" });
    if d.n < 2 || d.ci95_low.is_none() {
        if w.tie {
            return format!(
                "{} and {runner} are tied on {what} ({means}) on one seed; one seed gives no \
                 interval: run routelab compare with several seeds (--seeds auto) to tell them \
                 apart.{}",
                w.winner,
                oracle_note(w.winner_role)
            );
        }
        return format!(
            "{} has the {best} {what} ({means} for the runner-up {runner}), on one seed only: \
             one seed gives no interval, so whether the win holds is unknown; run routelab \
             compare with several seeds (--seeds auto) to know.{}",
            w.winner,
            oracle_note(w.winner_role)
        );
    }
    if w.tie || !d.established {
        return format!(
            "{} and {runner} are tied on {what} ({means}): their paired difference {diff} \
             (95 % interval, {seeds}) includes 0.{}",
            w.winner,
            oracle_note(w.winner_role)
        );
    }
    format!(
        "{} wins on {what} ({best} is best): {means} for the runner-up {runner}, a paired \
         difference of {diff} (95 % interval, {seeds}).{}",
        w.winner,
        oracle_note(w.winner_role)
    )
}

/// Said after a sentence that names an oracle-weights policy first: it cannot be shipped.
pub(super) fn oracle_note(role: PolicyRole) -> &'static str {
    match role {
        PolicyRole::Oracle => {
            " Oracle weights read the true capacities, which only the lab knows: an upper \
             bound to measure the others against, not a policy a gateway can deploy."
        }
        PolicyRole::Field | PolicyRole::Ours => "",
    }
}

/// `yes` when the winner's paired difference from the runner-up excludes zero.
pub(super) fn established(w: &Winner) -> &'static str {
    match &w.paired {
        Some(d) if d.established => "yes",
        Some(d) if d.n < 2 => "no (one seed)",
        Some(_) => "no",
        None => "-",
    }
}

/// Every policy's paired difference from the baseline on the key metrics.
pub(super) fn baseline_html(st: &ScenarioStats) -> String {
    let Some(base) = &st.baseline else {
        return String::new();
    };
    let metrics: Vec<&Metric> = key_metrics().collect();
    let labels: Vec<String> = metrics.iter().map(|m| column_label(m)).collect();
    let mut header: Vec<(&str, bool)> = vec![("policy", true)];
    header.extend(labels.iter().map(|h| (h.as_str(), false)));
    let rows: Vec<(bool, Vec<Cell>)> = st
        .policies
        .iter()
        .filter(|p| !p.vs_baseline.is_empty())
        .map(|p| {
            let mut cells = vec![Cell::text(&p.policy)];
            for m in &metrics {
                let c = match p.vs_baseline.iter().find(|d| d.metric == m.name) {
                    Some(d) => Cell::num(fmt_diff(m, d))
                        .best(d.verdict == Verdict::Better)
                        .titled(format!("{} on {} paired seeds", d.verdict.as_str(), d.n)),
                    None => Cell::num("-"),
                };
                cells.push(c);
            }
            (false, cells)
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut s = format!(
        "<h3>Paired difference from the baseline, {}</h3>\n",
        crate::export::html::esc(base)
    );
    s.push_str(&split_table(&header, &rows, 1));
    s.push_str(
        "\n<p class=\"note\">Policy minus baseline on each seed both ran (the same traffic), \
         mean and 95 % interval of those differences in % of the baseline's mean. Highlighted: \
         established improvements (the interval excludes zero, on the better side).</p>",
    );
    s
}

pub(super) fn fmt_margin(w: &Winner) -> String {
    match w.margin_pct {
        Some(m) => format!("{m:.1}%"),
        None => "-".into(),
    }
}
