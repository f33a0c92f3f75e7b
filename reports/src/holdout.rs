//! The out-of-sample check of `compare --holdout` and `capacity --holdout`: the winner is picked
//! on the first part of each trace (by time) and checked on the held-out rest.
//!
//! A verdict picked on one stretch of traffic is a claim about traffic in general; holding out
//! the end of the trace asks whether it survives the next stretch. The check is paired, like
//! every verdict of routelab: on the held-out part, the in-sample winner against the best
//! policy there, on the same seeds.
//!
//! The check itself is the lab's (`routelab_lab::holdout`); here are what it found, as plain
//! data, its sentence, and the figures behind it in words.

use crate::capacity::{CapacityStudy, versus};
use crate::compare::{PairedDiff, Winner, fmt_diff, with_unit};
use crate::metric::Metric;
use serde::Serialize;

/// Whether the in-sample winner still wins on the held-out part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Holds {
    /// It is the best there too.
    Yes,
    /// Another policy ranks first there, but their paired difference is not established.
    Tied,
    /// Another policy beats it there, established.
    No,
}

/// The out-of-sample check of one study.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutOfSample {
    /// What was held out (`the last 30 % of each trace's span`).
    pub held_out: String,
    /// What the winner is picked by (`lowest e2e mean`, `most capacity at the SLO`).
    pub criterion: String,
    /// The winner on the in-sample part.
    pub winner: String,
    /// The best policy on the held-out part.
    pub best_held_out: String,
    /// Whether the in-sample winner still wins.
    pub holds: Holds,
    /// The paired figure behind the verdict, on the held-out part.
    pub detail: String,
}

impl OutOfSample {
    /// The sentence every output prints.
    pub fn sentence(&self) -> String {
        let head = format!(
            "Out of sample ({} held out; the winner picked on the rest by {}):",
            self.held_out, self.criterion
        );
        match self.holds {
            Holds::Yes => format!(
                "{head} `{}` still wins on the held-out part ({}).",
                self.winner, self.detail
            ),
            Holds::Tied => format!(
                "{head} `{}` ranks first on the held-out part, but its difference from `{}` is \
                 not established ({}): the win neither clearly holds nor fails.",
                self.best_held_out, self.winner, self.detail
            ),
            Holds::No => format!(
                "{head} `{}` does not hold: `{}` beats it on the held-out part ({}, established).",
                self.winner, self.best_held_out, self.detail
            ),
        }
    }

    /// `holds`, `tied` or `fails`, for a table cell.
    pub fn verdict_word(&self) -> &'static str {
        match self.holds {
            Holds::Yes => "holds",
            Holds::Tied => "not established",
            Holds::No => "fails",
        }
    }
}

/// `the last 30 % of each trace's span`, from `--holdout 0.3`.
pub fn held_out_text(fraction: f64) -> String {
    format!(
        "the last {} % of each trace's span",
        (fraction * 1000.0).round() / 10.0
    )
}

/// The figures behind a comparison's check on metric `m` when its in-sample winner is the best
/// on the held-out part too (`held`, that part's winner): its mean against the runner-up's
/// there, and their paired difference.
pub fn compare_detail_kept(m: &Metric, held: &Winner) -> String {
    match (&held.runner_up, &held.paired) {
        (Some(r), Some(d)) => format!(
            "{} {} against {} for `{r}`, paired {}",
            m.label,
            with_unit(m, held.winner_mean),
            with_unit(m, held.runner_up_mean),
            fmt_diff(m, d)
        ),
        _ => format!("{} {}", m.label, with_unit(m, held.winner_mean)),
    }
}

/// The figures behind a comparison's check on metric `m` when another policy (`held`, the
/// held-out part's winner) ranks above the in-sample winner `winner` (its mean `winner_mean`
/// there): their means and `d`, the paired difference of the one from the other.
pub fn compare_detail_beaten(
    m: &Metric,
    held: &Winner,
    winner: &str,
    winner_mean: Option<f64>,
    d: &PairedDiff,
) -> String {
    format!(
        "{} {} against {} for `{winner}`, paired {}",
        m.label,
        with_unit(m, held.winner_mean),
        with_unit(m, winner_mean),
        fmt_diff(m, d)
    )
}

/// The figures behind a capacity study's check when the shipped policy (`kept`, an index of
/// `held`, the held-out part's study) still carries the most there: against the next deployable
/// policy, or that it is the only one.
pub fn capacity_detail_kept(held: &CapacityStudy, kept: usize, next: Option<usize>) -> String {
    match next {
        Some(r) => format!(
            "it carries {} there",
            versus(held, kept, r, &quoted(held, r))
        ),
        None => "the only deployable policy there".to_owned(),
    }
}

/// The figures behind a capacity study's check when policy `best` of `held` carries more than
/// the shipped policy `shipped` there.
pub fn capacity_detail_beaten(held: &CapacityStudy, best: usize, shipped: usize) -> String {
    format!(
        "{} carries {} there",
        quoted(held, best),
        versus(held, best, shipped, &quoted(held, shipped))
    )
}

fn quoted(st: &CapacityStudy, i: usize) -> String {
    format!("`{}`", st.policies[i].policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_verdict_reads_as_a_sentence() {
        let mut o = OutOfSample {
            held_out: held_out_text(0.3),
            criterion: "most capacity at the SLO".into(),
            winner: "a".into(),
            best_held_out: "a".into(),
            holds: Holds::Yes,
            detail: "1.10x [1.05, 1.15] `b`'s load".into(),
        };
        assert_eq!(
            o.sentence(),
            "Out of sample (the last 30 % of each trace's span held out; the winner picked on \
             the rest by most capacity at the SLO): `a` still wins on the held-out part (1.10x \
             [1.05, 1.15] `b`'s load)."
        );
        o.holds = Holds::No;
        o.best_held_out = "b".into();
        assert!(o.sentence().contains("`a` does not hold: `b` beats it"));
        assert_eq!(o.verdict_word(), "fails");
        o.holds = Holds::Tied;
        assert!(
            o.sentence()
                .contains("`b` ranks first on the held-out part")
        );
    }
}
