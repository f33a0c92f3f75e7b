//! The fluid engine's clocks, rates and decode heap keys: plain data the engine moves, looks
//! ahead with and orders its decodes by, and the libm-free rounding its event path uses.

use std::cmp::Ordering;

use routelab_policies::streams::NANOS_PER_SEC;

use super::EPS_STEPS;

/// The engine's fluid clocks and rates, valid at one instant. Plain data, so that the next
/// event can be looked for ahead of time through the breakpoints (below) without touching the
/// engine.
///
/// **Breakpoints.** Within one step the batch is fixed, so the rates change at step boundaries
/// even when nothing is emitted there: where the gated sequences join the prefill work, and
/// where less than a chunk of prefill work is left (the step is shorter). These are crossed
/// lazily — [`FluidEngine::advance`](super::FluidEngine) integrates piecewise through them, with no event and no
/// change of generation — because an event per admission would cost the host a wake-up each.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fluid {
    /// The step clock: engine steps done since the engine last idled (fractional). Step
    /// boundaries are its whole values; every decoding sequence gets one token per step, so it
    /// is also the decode service clock.
    pub(super) v: f64,
    /// Prefill work done (cumulative, against the sequences' `prefill_end` marks).
    pub(super) q: f64,
    /// End mark of the prefill work the running step sees (the gated sequences' excluded).
    pub(super) q_joined: f64,
    /// Sequences at the front of `prefill` whose work is joined.
    pub(super) joined: u32,
    /// Sequences at the back of `prefill` waiting for the boundary `gate_v`.
    pub(super) gated: u32,
    pub(super) rate_v: f64,
    pub(super) rate_q: f64,
    /// The next breakpoint on the step clock (`INFINITY`: none).
    pub(super) break_v: f64,
    /// [`tolerance_at`]`(rate_v)`, set with the rates: every boundary test reads it, and the
    /// division is paid once per change of rates instead of once per test.
    pub(super) tol: f64,
    /// Decode plus prefill work done since the engine became ready (for the warm-up).
    pub(super) work: f64,
    /// Prompt tokens the step under way prefills: fixed when the step starts (on a boundary),
    /// so that a call in the middle of it does not change its length.
    pub(super) c_step: f64,
}

impl Default for Fluid {
    /// An idle engine's clocks: nothing done, nothing stepping.
    fn default() -> Self {
        Fluid {
            v: 0.0,
            q: 0.0,
            q_joined: 0.0,
            joined: 0,
            gated: 0,
            rate_v: 0.0,
            rate_q: 0.0,
            break_v: 0.0,
            tol: tolerance_at(0.0),
            work: 0.0,
            c_step: 0.0,
        }
    }
}

/// How far (steps) the step clock may be from a whole value and still be on a boundary when
/// it runs at `rate_v` steps/s: an event time is rounded up to a whole nanosecond, so it may
/// overshoot by a hair.
#[inline]
pub(super) fn tolerance_at(rate_v: f64) -> f64 {
    EPS_STEPS + rate_v * 2.0 / NANOS_PER_SEC
}

/// Whether the step clock at `v`, running at `rate_v` with boundary tolerance `tol`, is
/// between two boundaries.
#[inline]
pub(super) fn mid_step_at(v: f64, rate_v: f64, tol: f64) -> bool {
    rate_v > 0.0 && (v - round_nn(v)).abs() > tol
}

/// The first step boundary after the step clock at `v` (see [`Fluid::next_boundary`]).
#[inline]
pub(super) fn next_boundary_at(v: f64, rate_v: f64, tol: f64) -> f64 {
    if mid_step_at(v, rate_v, tol) {
        ceil_nn(v)
    } else {
        round_nn(v) + 1.0
    }
}

/// The first breakpoint [`FluidEngine::compute_next`](super::FluidEngine)'s look-ahead crossed at the last refresh,
/// kept for the move that crosses it later. That move starts from the very state the look-ahead
/// started from (every change of the clocks is a move or a mutation, and each is followed by a
/// refresh before the next move), so working the crossing out again would give the same bits.
#[derive(Debug, Clone, Copy)]
pub(super) struct Crossing {
    /// Seconds from the refresh's state to the breakpoint ([`Fluid::secs_to_break`]).
    pub(super) secs: f64,
    /// The clocks just past it: moved there and crossed ([`FluidEngine::cross`](super::FluidEngine)).
    pub(super) fl: Fluid,
}

/// The rates of a step and its next breakpoint, as [`FluidEngine::rates`](super::FluidEngine) works them out.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rates {
    pub(super) v: f64,
    pub(super) q: f64,
    pub(super) break_v: f64,
    /// [`tolerance_at`]`(v)`.
    pub(super) tol: f64,
}

impl Fluid {
    /// How far (steps) the step clock may be from a whole value and still be on a boundary
    /// under the current rates ([`tolerance_at`]).
    #[inline]
    pub(super) fn tolerance(&self) -> f64 {
        self.tol
    }

    /// Whether a step is under way: the engine is stepping and the clock is between two
    /// boundaries.
    #[inline]
    pub(super) fn mid_step(&self) -> bool {
        mid_step_at(self.v, self.rate_v, self.tol)
    }

    /// The first step boundary after the clock (the end of the running step; the end of the
    /// step starting now when on a boundary).
    #[inline]
    pub(super) fn next_boundary(&self) -> f64 {
        next_boundary_at(self.v, self.rate_v, self.tol)
    }

    /// Takes the rates of the step under way and its next breakpoint.
    #[inline]
    pub(super) fn set_rates(&mut self, r: Rates) {
        self.rate_v = r.v;
        self.rate_q = r.q;
        self.break_v = r.break_v;
        self.tol = r.tol;
    }

    /// Seconds to the next breakpoint under the current rates (`INFINITY`: none).
    pub(super) fn secs_to_break(&self) -> f64 {
        if self.break_v.is_finite() && self.rate_v > 0.0 {
            ((self.break_v - self.v) / self.rate_v).max(0.0)
        } else {
            f64::INFINITY
        }
    }

    /// Whether `other` is this state bit for bit (debug checks).
    pub(super) fn same_bits(&self, other: &Fluid) -> bool {
        let floats = |f: &Fluid| {
            [
                f.v, f.q, f.q_joined, f.rate_v, f.rate_q, f.break_v, f.tol, f.work, f.c_step,
            ]
            .map(f64::to_bits)
        };
        floats(self) == floats(other) && (self.joined, self.gated) == (other.joined, other.gated)
    }

    /// Moves the clocks `dt` seconds under the current rates (no breakpoint in between).
    pub(super) fn flow(&mut self, dt: f64, n_decoding: u32) {
        let dv = self.rate_v * dt;
        // the queue cannot drain below empty (event times are rounded up to whole ns)
        let dq = (self.rate_q * dt).min((self.q_joined - self.q).max(0.0));
        self.v += dv;
        self.q += dq;
        self.work += dv * f64::from(n_decoding) + dq;
    }
}

/// Min-heap entry: smallest finish first (in [`f64::total_cmp`]'s order), ties by sequence id.
/// The finish mark is kept as its total-order integer ([`total_order`]), worked out once at the
/// push, so each of the heap's comparisons is an integer one.
#[derive(Debug, Clone, Copy)]
pub(super) struct DecodeKey {
    /// `total_order(finish)`.
    pub(super) order: i64,
    pub(super) seq: u64,
    pub(super) slot: u32,
}

impl DecodeKey {
    pub(super) fn new(finish: f64, seq: u64, slot: u32) -> DecodeKey {
        DecodeKey {
            order: total_order(finish),
            seq,
            slot,
        }
    }

    /// The finish mark on the step clock, bit for bit as pushed.
    pub(super) fn finish(&self) -> f64 {
        from_total_order(self.order)
    }
}

/// The integer whose order is [`f64::total_cmp`]'s (its own transformation of the bits): a
/// negative float's magnitude bits are flipped, so that the signed integers sort as the floats
/// do, `-0.0` before `+0.0`. Its own inverse on the bits ([`from_total_order`]).
#[inline]
pub(super) fn total_order(x: f64) -> i64 {
    let bits = x.to_bits() as i64;
    bits ^ (((bits >> 63) as u64) >> 1) as i64
}

/// The float [`total_order`] came from (the flip keeps the sign bit, so it undoes itself).
#[inline]
pub(super) fn from_total_order(order: i64) -> f64 {
    f64::from_bits((order ^ (((order >> 63) as u64) >> 1) as i64) as u64)
}

impl PartialEq for DecodeKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for DecodeKey {}
impl PartialOrd for DecodeKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for DecodeKey {
    fn cmp(&self, other: &Self) -> Ordering {
        // reversed: BinaryHeap is a max-heap
        other
            .order
            .cmp(&self.order)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

/// `x.floor()` for `x` in `[0, 2^53)` (below 0: 0), without the libm call the baseline x86-64
/// target makes for `f64::floor` (`as` truncates toward zero and saturates). For the step
/// clock and token counts, on every event's path.
#[inline]
pub(super) fn floor_nn(x: f64) -> f64 {
    // the signed conversion is one instruction; the unsigned one is not
    (x as i64).max(0) as f64
}

/// `x.ceil()` for `x` in `[0, 2^53)` (below 0: 0), without the libm call.
#[inline]
pub(super) fn ceil_nn(x: f64) -> f64 {
    let t = floor_nn(x);
    if t < x { t + 1.0 } else { t }
}

/// The whole number nearest `x` in `[0, 2^53)`, halves up, without the libm call.
#[inline]
pub(super) fn round_nn(x: f64) -> f64 {
    floor_nn(x + 0.5)
}
