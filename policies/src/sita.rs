//! `sita`: size-interval task assignment (Harchol-Balter, Crovella and Murta, "Task assignment
//! with unknown duration", 2002; for servers of different speeds, Harchol-Balter et al. 2009),
//! the baseline from queueing theory beside the field's routers and `predictive`.
//!
//! A request's size is its uncached prompt tokens: the prompt less the longest prefix the
//! router remembers on any worker. Ascending cut-offs `c1 < c2 < … < cm` split sizes into m + 1
//! bands; the model's workers fall into classes by context window, and the bands go to the
//! classes from the top: the last band `[cm, ∞)` to the largest window, the one below to the
//! next window down, and so on, the first band to every class below the rest. So short
//! requests stay off the few workers that can hold long prompts, the scarce-capacity argument
//! of issue 38. Within its class a request goes to the least work: `(in flight + uncached share
//! of its prompt) / weight`, so a worker holding the prompt's prefix is favoured by up to one
//! request. When its class has no open candidate (all at their cap, or none holds its context),
//! the next larger class that has one takes it, else the least work among every open candidate.
//!
//! The cut-offs are a parameter: `routelab` searches them on the scenario itself for the
//! oracle-tuned reference (`oracle_tuned: true`, role oracle: an upper bound, not deployable).

use crate::chooser::Hot;
use crate::rules::RuleCtx;

/// Most cut-offs (bands − 1): far more window classes than any fleet has.
pub const MAX_CUTOFFS: usize = 7;

/// `sita`'s parameters: a fixed array so the chooser stays `Copy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SitaParams {
    /// Ascending cut-offs in uncached prompt tokens; the first `len` are used.
    cutoffs: [u32; MAX_CUTOFFS],
    len: u8,
    /// The cut-offs were searched on the scenario being reported (an oracle: not deployable).
    pub oracle_tuned: bool,
}

/// Why a list of cut-offs is refused (the config layer attaches the field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CutoffError {
    /// More than [`MAX_CUTOFFS`].
    #[error("{0} cut-offs given; at most {MAX_CUTOFFS} (one fewer than the window classes)")]
    TooMany(usize),
    /// Zero, or not above the one before.
    #[error("cut-off {value} (position {position}) must be > 0 and above the one before it")]
    NotAscending {
        /// Its position, from 1.
        position: usize,
        /// The value given.
        value: u64,
    },
    /// Larger than any context window could be.
    #[error("cut-off {0} is above {max} tokens, beyond any context window", max = u32::MAX)]
    TooLarge(u64),
}

/// A cut-off list the fleet cannot serve (checked by hosts against their configured workers).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BandError {
    /// More bands than the model's workers have context windows.
    #[error(
        "{cutoffs} cut-off(s) make {bands} bands, but the workers have {classes} context window(s) ({windows}): give at most {most} cut-off(s)",
        bands = cutoffs + 1,
        most = classes - 1
    )]
    TooManyBands {
        /// Cut-offs given.
        cutoffs: usize,
        /// Distinct context windows.
        classes: usize,
        /// Those windows, ascending.
        windows: String,
    },
    /// A band starts at or above the context window of the workers it goes to.
    #[error(
        "cut-off {cutoff} starts a band served by the {window}-token workers, which cannot hold any request in it: each cut-off must be below the window of the class it opens ({windows})"
    )]
    BandAboveWindow {
        /// The cut-off.
        cutoff: u32,
        /// The window of the class its band goes to.
        window: u32,
        /// Every class's window, ascending.
        windows: String,
    },
}

impl SitaParams {
    /// Validated cut-offs (strictly ascending, > 0, at most [`MAX_CUTOFFS`]).
    pub fn new(cutoffs: &[u64], oracle_tuned: bool) -> Result<SitaParams, CutoffError> {
        if cutoffs.len() > MAX_CUTOFFS {
            return Err(CutoffError::TooMany(cutoffs.len()));
        }
        let mut p = SitaParams {
            oracle_tuned,
            ..SitaParams::default()
        };
        let mut last = 0u64;
        for (i, &c) in cutoffs.iter().enumerate() {
            if c <= last {
                return Err(CutoffError::NotAscending {
                    position: i + 1,
                    value: c,
                });
            }
            p.cutoffs[i] = u32::try_from(c).map_err(|_| CutoffError::TooLarge(c))?;
            last = c;
        }
        p.len = cutoffs.len() as u8;
        Ok(p)
    }

    /// The cut-offs, ascending.
    pub fn cutoffs(&self) -> &[u32] {
        &self.cutoffs[..usize::from(self.len)]
    }

    /// The cut-offs as a composition writes them: `4096,16384` (empty for one band).
    pub fn list(&self) -> String {
        let v: Vec<String> = self.cutoffs().iter().map(u32::to_string).collect();
        v.join(",")
    }

    /// Whether workers with these context windows can serve every band: at most one cut-off
    /// fewer than distinct windows, and each cut-off below the window of the class its band
    /// goes to.
    pub fn fits(&self, windows: &[u32]) -> Result<(), BandError> {
        let mut classes: Vec<u32> = windows.to_vec();
        classes.sort_unstable();
        classes.dedup();
        let list = || {
            let v: Vec<String> = classes.iter().map(u32::to_string).collect();
            v.join(", ")
        };
        let m = self.cutoffs().len();
        if m == 0 {
            return Ok(());
        }
        if m >= classes.len() {
            return Err(BandError::TooManyBands {
                cutoffs: m,
                classes: classes.len(),
                windows: list(),
            });
        }
        // Band j (1..=m) starts at cut-off j and goes to the class m − j from the top.
        for (j, &c) in self.cutoffs().iter().enumerate() {
            let rank_from_top = m - (j + 1);
            let window = classes[classes.len() - 1 - rank_from_top];
            if c >= window {
                return Err(BandError::BandAboveWindow {
                    cutoff: c,
                    window,
                    windows: list(),
                });
            }
        }
        Ok(())
    }

    /// The band of a request of `size` uncached tokens: 0 ..= m.
    #[inline]
    fn band(&self, size: u32) -> usize {
        self.cutoffs().iter().take_while(|&&c| c <= size).count()
    }
}

/// The least-work open candidate in the class `want` from the top (or the nearest larger
/// class that has one), else among every open candidate. `cands` are sorted by window,
/// largest first (the router's members).
pub(crate) fn sita(ctx: &RuleCtx<'_>, cands: &[u32], hot: &[Hot], p: &SitaParams) -> Option<usize> {
    let overlap = ctx.holder.map_or(0, |(w, _)| ctx.overlap(w.0));
    let size = ctx.prompt_tokens.saturating_sub(overlap);
    let m = p.cutoffs().len();
    // Class ranks from the top: the last band to rank 0.
    let want = m - p.band(size);
    let prompt = f64::from(ctx.prompt_tokens.max(1));
    let work = |i: u32| {
        let h = &hot[i as usize];
        let uncached = f64::from(ctx.prompt_tokens.saturating_sub(ctx.overlap(i)));
        (f64::from(h.in_flight) + uncached / prompt) / h.weight
    };
    // Best open candidate per class rank, walking down the windows (ranks clamped at m: the
    // first band's classes are one group); the answer is the one at `want`, else the closest
    // rank above it (a larger window) that had one.
    let mut rank = 0usize;
    let mut window = None;
    let mut in_class: Option<(usize, f64)> = None;
    let mut above: Option<usize> = None;
    let mut any: Option<(usize, f64)> = None;
    for (pos, &i) in cands.iter().enumerate() {
        let h = &hot[i as usize];
        if window.is_some_and(|w| w != h.context_window) && rank < m {
            if rank == want && in_class.is_some() {
                break;
            }
            if rank < want
                && let Some((b, _)) = in_class
            {
                above = Some(b);
            }
            rank += 1;
            in_class = None;
        }
        window = Some(h.context_window);
        if !h.open() {
            continue;
        }
        let s = work(i);
        if in_class.is_none_or(|b| s < b.1) {
            in_class = Some((pos, s));
        }
        if any.is_none_or(|b| s < b.1) {
            any = Some((pos, s));
        }
    }
    // `in_class` is the last group scanned: the wanted one, or the lowest present when the
    // wanted rank is below every candidate's class.
    if rank <= want
        && let Some((b, _)) = in_class
    {
        return Some(b);
    }
    above.or(any.map(|b| b.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::Capacities;
    use crate::prefix::PrefixIndex;
    use crate::signals::Signals;
    use crate::worker::WorkerId;

    fn hot(window: u32, in_flight: u32) -> Hot {
        Hot {
            weight: 1.0,
            in_flight,
            cap: 8,
            context_window: window,
            model: 0,
            routable: true,
        }
    }

    fn pick(p: &SitaParams, hot: &[Hot], prompt: u32, holder: Option<(u32, usize)>) -> Option<u32> {
        let cands: Vec<u32> = (0..hot.len() as u32).collect();
        let signals = vec![Signals::default(); hot.len()];
        let index = PrefixIndex::new(0);
        let capacity = Capacities::default();
        let ctx = RuleCtx {
            prompt_tokens: prompt,
            prefix: &[],
            holder: holder.map(|(w, b)| (WorkerId(w), b)),
            signals: &signals,
            index: &index,
            capacity: &capacity,
            holder_pos: None,
        };
        sita(&ctx, &cands, hot, p).map(|pos| cands[pos])
    }

    #[test]
    fn bands_go_to_window_classes_from_the_top() {
        let p = SitaParams::new(&[8000], false).unwrap();
        // Workers 0-1 hold 131k, 2-3 hold 32k (largest first, as the router sorts them); the
        // big ones are idle, the small ones busy.
        let fleet = [hot(131072, 0), hot(131072, 1), hot(32768, 3), hot(32768, 2)];
        // A short request stays in the small class although the big workers are idle.
        assert_eq!(pick(&p, &fleet, 2000, None), Some(3));
        // A long one goes to the big class, its least loaded.
        assert_eq!(pick(&p, &fleet, 9000, None), Some(0));
        // Without cut-offs: the least work anywhere.
        let one = SitaParams::new(&[], false).unwrap();
        assert_eq!(pick(&one, &fleet, 2000, None), Some(0));
    }

    #[test]
    fn the_cached_prefix_shrinks_the_size_and_favours_its_holder() {
        let p = SitaParams::new(&[8000], false).unwrap();
        let fleet = [hot(131072, 0), hot(32768, 1), hot(32768, 1)];
        // 12,000 tokens of which worker 2 holds 8,192 (16 blocks): 3,808 uncached, the small
        // class, and its holder over its equally loaded twin.
        assert_eq!(pick(&p, &fleet, 12_000, Some((2, 16))), Some(2));
        assert_eq!(pick(&p, &fleet, 12_000, None), Some(0));
    }

    #[test]
    fn a_full_class_overflows_to_a_larger_window_then_anywhere() {
        let p = SitaParams::new(&[8000], false).unwrap();
        let mut fleet = [hot(131072, 5), hot(32768, 8), hot(32768, 8)];
        // The small class is at its cap (8): the big worker takes the short request.
        assert_eq!(pick(&p, &fleet, 100, None), Some(0));
        // The big class full: a long request goes to whatever is open.
        fleet[0].in_flight = 8;
        fleet[1].in_flight = 2;
        assert_eq!(pick(&p, &fleet, 20_000, None), Some(1));
        fleet[1].in_flight = 8;
        assert_eq!(pick(&p, &fleet, 20_000, None), None);
    }

    #[test]
    fn a_wanted_class_below_every_candidate_takes_the_lowest_present() {
        // Three classes, two cut-offs; a request whose context only the two larger classes hold
        // (the router filtered the 8k workers out) and whose band is the smallest.
        let p = SitaParams::new(&[2000, 40_000], false).unwrap();
        let fleet = [hot(131072, 0), hot(65536, 3), hot(65536, 1)];
        assert_eq!(pick(&p, &fleet, 1000, None), Some(2));
        assert_eq!(pick(&p, &fleet, 50_000, None), Some(0));
    }

    #[test]
    fn names_and_yaml_give_the_cut_offs_and_the_oracle_role() {
        use crate::{PolicyConfig, PolicyRole};
        let cuts = |p: &PolicyConfig| match p.chooser {
            crate::Chooser::Sita(s) => s.cutoffs().to_vec(),
            ref other => panic!("{other:?}"),
        };
        let oracle = PolicyConfig::from_name("sita-oracle:4096,16384").unwrap();
        assert_eq!(
            (cuts(&oracle), oracle.role()),
            (vec![4096, 16384], PolicyRole::Oracle)
        );
        let plain = PolicyConfig::from_name("sita:4096").unwrap();
        assert_eq!((cuts(&plain), plain.role()), (vec![4096], PolicyRole::Ours));
        assert!(cuts(&PolicyConfig::from_name("probe/sita/none/none").unwrap()).is_empty());
        let e = PolicyConfig::from_name("sita:16384,4096").unwrap_err();
        assert!(e.to_string().contains("position 2"), "{e}");
        let e = PolicyConfig::from_name("equal/sita:4k").unwrap_err();
        assert!(e.to_string().contains("`4k` is not a whole number"), "{e}");
        let raw = crate::located::parse_yaml::<crate::RawPolicy>(
            "preset: sita\nchooser: { kind: sita, cutoffs: [4096, 2.5] }",
            "p.yaml",
        )
        .unwrap();
        let e = PolicyConfig::from_raw(&raw).unwrap_err();
        assert!(e.to_string().contains("cutoffs[1]"), "{e}");
        let raw = crate::located::parse_yaml::<crate::RawPolicy>(
            "preset: sita\nchooser: { kind: sita, cutoffs: [4096], oracle_tuned: true }",
            "p.yaml",
        )
        .unwrap();
        assert_eq!(
            PolicyConfig::from_raw(&raw).unwrap().role(),
            PolicyRole::Oracle
        );
    }

    #[test]
    fn cut_offs_are_validated_and_checked_against_the_windows() {
        assert!(matches!(
            SitaParams::new(&[4000, 4000], false),
            Err(CutoffError::NotAscending { position: 2, .. })
        ));
        assert!(matches!(
            SitaParams::new(&[0], false),
            Err(CutoffError::NotAscending { position: 1, .. })
        ));
        assert!(matches!(
            SitaParams::new(&[1 << 33], false),
            Err(CutoffError::TooLarge(_))
        ));
        assert!(matches!(
            SitaParams::new(&[1; 8], false),
            Err(CutoffError::TooMany(8))
        ));
        let windows = [32768, 131072, 32768];
        assert_eq!(
            SitaParams::new(&[8000], false).unwrap().fits(&windows),
            Ok(())
        );
        // A band above every worker's window.
        let e = SitaParams::new(&[200_000], false)
            .unwrap()
            .fits(&windows)
            .unwrap_err();
        assert!(e.to_string().contains("131072-token workers"), "{e}");
        // Two cut-offs, two windows: three bands for two classes.
        let e = SitaParams::new(&[1000, 8000], false)
            .unwrap()
            .fits(&windows)
            .unwrap_err();
        assert!(
            matches!(e, BandError::TooManyBands { classes: 2, .. }),
            "{e}"
        );
        // The middle band goes to the 65k class: a cut-off at 70k opens a band it cannot hold.
        let three = [32768, 65536, 131072];
        assert!(
            SitaParams::new(&[70_000, 100_000], false)
                .unwrap()
                .fits(&three)
                .is_err()
        );
        assert!(
            SitaParams::new(&[4000, 60_000], false)
                .unwrap()
                .fits(&three)
                .is_ok()
        );
        assert_eq!(
            SitaParams::new(&[4000, 60_000], true).unwrap().list(),
            "4000,60000"
        );
    }
}
