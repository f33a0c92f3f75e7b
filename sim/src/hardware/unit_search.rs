//! The one-dimensional search the fits share: the value in `[0, 1]` that minimises a misfit
//! (`prefill_overlap`, against measured loops analytically or by simulating them).

/// Where `f` is least on `[0, 1]`: `grid` + 1 evenly spaced values first (a misfit need not be
/// unimodal), then `rounds` golden sections within one grid step of the best of them. Returns
/// the best grid value, `f` there, and the golden sections' midpoint (the caller keeps whichever
/// of the two it finds better); `None` when `f` is nowhere finite on the grid.
pub(crate) fn minimise_on_unit(
    f: impl Fn(f64) -> f64,
    grid: u32,
    rounds: u32,
) -> Option<(f64, f64, f64)> {
    let (mut best, mut best_f) = (0.0, f64::INFINITY);
    for i in 0..=grid {
        let o = f64::from(i) / f64::from(grid);
        let v = f(o);
        if v < best_f {
            (best, best_f) = (o, v);
        }
    }
    if !best_f.is_finite() {
        return None;
    }
    let step = 1.0 / f64::from(grid);
    let (mut lo, mut hi) = ((best - step).max(0.0), (best + step).min(1.0));
    let g = (5f64.sqrt() - 1.0) / 2.0;
    for _ in 0..rounds {
        let a = hi - g * (hi - lo);
        let b = lo + g * (hi - lo);
        if f(a) <= f(b) {
            hi = b;
        } else {
            lo = a;
        }
    }
    Some((best, best_f, 0.5 * (lo + hi)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_minimum_between_grid_points_and_refuses_a_nowhere_finite_misfit() {
        let (best, _, mid) = minimise_on_unit(|x| (x - 0.3141).powi(2), 20, 60).expect("finite");
        assert_eq!(best, 0.3);
        assert!((mid - 0.3141).abs() < 1e-6, "{mid}");
        assert_eq!(minimise_on_unit(|_| f64::INFINITY, 10, 5), None);
    }
}
