//! Choosers: which eligible worker gets the request.

use rand::{Rng, RngExt};

/// What to do when two candidates score the same (e.g. both idle: 0/w = 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TieRule {
    /// The first of the two random candidates (the source's original behaviour: a coin toss).
    First,
    /// An explicit coin flip.
    Random,
    /// The higher weight (the source's fix: quiet hours go to the fastest worker).
    HigherWeight,
}

impl TieRule {
    /// YAML/CLI name.
    pub fn as_str(self) -> &'static str {
        match self {
            TieRule::First => "first",
            TieRule::Random => "random",
            TieRule::HigherWeight => "higher-weight",
        }
    }

    /// Valid names.
    pub const NAMES: &'static [&'static str] = &["first", "random", "higher-weight"];

    /// Parse a name.
    pub fn parse(s: &str) -> Option<TieRule> {
        match s {
            "first" => Some(TieRule::First),
            "random" => Some(TieRule::Random),
            "higher-weight" => Some(TieRule::HigherWeight),
            _ => None,
        }
    }
}

/// The chooser: an enum over plain variants so the hot path is a `match`, not a virtual call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Chooser {
    /// Power of two choices on in_flight / weight.
    P2c {
        /// Tie rule.
        ties: TieRule,
    },
    /// Shortest expected delay: P2C on (in_flight + 1) / weight — load *after* adding the request.
    Sed {
        /// Tie rule.
        ties: TieRule,
    },
    /// Join the shortest queue: full scan on in_flight / weight.
    Jsq {
        /// Tie rule.
        ties: TieRule,
    },
    /// Envoy's least-request: P2C on weight / (active + 1)^bias (higher wins).
    LeastRequest {
        /// Active-request bias (Envoy's default 1.0).
        bias: f64,
        /// Tie rule.
        ties: TieRule,
    },
    /// Smooth weighted round-robin (nginx's algorithm), ignoring load.
    Wrr,
    /// Uniform random.
    Random,
    /// Plain round-robin.
    RoundRobin,
}

impl Chooser {
    /// Valid names.
    pub const NAMES: &'static [&'static str] = &[
        "p2c",
        "sed",
        "jsq",
        "least-request",
        "wrr",
        "random",
        "round-robin",
    ];

    /// YAML/CLI name.
    pub fn name(&self) -> &'static str {
        match self {
            Chooser::P2c { .. } => "p2c",
            Chooser::Sed { .. } => "sed",
            Chooser::Jsq { .. } => "jsq",
            Chooser::LeastRequest { .. } => "least-request",
            Chooser::Wrr => "wrr",
            Chooser::Random => "random",
            Chooser::RoundRobin => "round-robin",
        }
    }

    /// The chooser of that name with default parameters (ties `first` as in the source).
    pub fn from_name(name: &str, ties: TieRule) -> Option<Chooser> {
        Some(match name {
            "p2c" => Chooser::P2c { ties },
            "sed" => Chooser::Sed { ties },
            "jsq" => Chooser::Jsq { ties },
            "least-request" => Chooser::LeastRequest { bias: 1.0, ties },
            "wrr" => Chooser::Wrr,
            "random" => Chooser::Random,
            "round-robin" => Chooser::RoundRobin,
            _ => return None,
        })
    }

    /// The tie rule, for choosers that compare scores.
    pub fn ties(&self) -> Option<TieRule> {
        match *self {
            Chooser::P2c { ties }
            | Chooser::Sed { ties }
            | Chooser::Jsq { ties }
            | Chooser::LeastRequest { ties, .. } => Some(ties),
            _ => None,
        }
    }

    /// Load score, lower is better.
    #[inline]
    pub(crate) fn score(&self, in_flight: u32, weight: f64) -> f64 {
        let n = f64::from(in_flight);
        match *self {
            Chooser::Sed { .. } => (n + 1.0) / weight,
            Chooser::LeastRequest { bias, .. } => {
                if bias == 1.0 {
                    (n + 1.0) / weight
                } else {
                    (n + 1.0).powf(bias) / weight
                }
            }
            _ => n / weight,
        }
    }
}

/// Resolve a tie between `a` (sampled first) and `b`.
#[inline]
pub(crate) fn break_tie<R: Rng + ?Sized>(
    ties: TieRule,
    a: (usize, f64),
    b: (usize, f64),
    rng: &mut R,
) -> usize {
    match ties {
        TieRule::First => a.0,
        TieRule::Random => {
            if rng.random_bool(0.5) {
                a.0
            } else {
                b.0
            }
        }
        TieRule::HigherWeight => {
            if b.1 > a.1 {
                b.0
            } else {
                a.0
            }
        }
    }
}
