//! How the fluid engine moves in time: its clocks integrated through the breakpoints, the
//! rates of a step from the one step-time model, and the look-ahead for its next event.

use routelab_policies::streams::{nanos_to_secs, secs_to_nanos_ceil};

use super::clock::{Crossing, Fluid, Rates, ceil_nn, floor_nn, next_boundary_at, tolerance_at};
use super::{EPS_TOKENS, FluidEngine, MAX_LOOKAHEAD_BREAKS};
use crate::hardware::mixed_step_s;

impl FluidEngine {
    /// Moves the fluid state to `t`, through the breakpoints on the way.
    pub(super) fn move_to(&mut self, t: u64) {
        if t <= self.core.t0 {
            return;
        }
        let dt_ns = t - self.core.t0;
        let q_before = self.fl.q;
        let dt = nanos_to_secs(dt_ns);
        // kept for this move only: the clocks are about to change
        let crossing = self.crossing.take();
        if self.fl.v + self.fl.rate_v * dt < self.fl.break_v {
            // no breakpoint on the way (most moves): in place
            self.fl.flow(dt, self.n_decoding);
        } else if let Some(c) = crossing.filter(|c| c.secs <= dt) {
            // the last refresh's look-ahead crossed the first breakpoint from this very state:
            // go on from there (what `advance_through` does after its first crossing)
            let fl = self.advance(c.fl, dt - c.secs);
            debug_assert!(
                fl.same_bits(&self.advance_through(self.fl, dt)),
                "the kept crossing is not the move's"
            );
            self.fl = fl;
        } else {
            self.fl = self.advance_through(self.fl, dt);
        }
        if self.running > 0 && self.core.ready_at <= self.core.t0 {
            // the decoding count is constant between the engine's events, as the flow assumes
            self.core.note_busy(dt_ns, self.n_decoding);
        }
        self.core.t0 = t;
        if self.fl.q > q_before && self.prefills_with_blocks > 0 {
            self.cache_computed_blocks();
        }
    }

    /// `fl` moved `dt` seconds ahead, integrating piecewise through its breakpoints. Pure: the
    /// same path serves moving the engine, looking for its next event and reading a decode's
    /// progress.
    pub(super) fn advance(&self, mut fl: Fluid, dt: f64) -> Fluid {
        // most moves cross no breakpoint: tell without the division
        if fl.v + fl.rate_v * dt < fl.break_v {
            fl.flow(dt, self.n_decoding);
            return fl;
        }
        self.advance_through(fl, dt)
    }

    /// [`Self::advance`] once its quick test has failed: a breakpoint may come within `dt`.
    fn advance_through(&self, mut fl: Fluid, mut dt: f64) -> Fluid {
        loop {
            let to_break = fl.secs_to_break();
            if to_break > dt {
                fl.flow(dt, self.n_decoding);
                return fl;
            }
            fl.flow(to_break, self.n_decoding);
            self.cross(&mut fl);
            dt -= to_break;
            if fl.v + fl.rate_v * dt < fl.break_v {
                fl.flow(dt, self.n_decoding);
                return fl;
            }
        }
    }

    /// `fl` at its breakpoint, a step boundary: the gated work joins when due, and the rates
    /// of the step starting there.
    pub(super) fn cross(&self, fl: &mut Fluid) {
        fl.v = fl.break_v;
        if fl.gated > 0 && fl.v >= self.gate_v - fl.tolerance() {
            fl.joined += fl.gated;
            fl.gated = 0;
            fl.q_joined = self.q_tail;
        }
        fl.c_step = self.step_chunk(fl);
        self.set_rates(fl);
    }

    /// Sets `fl`'s rates for the step under way (its decode batch and the chunk of joined
    /// prefill work it carries, timed by the one step-time model) and its next breakpoint.
    fn set_rates(&self, fl: &mut Fluid) {
        fl.set_rates(self.rates(fl));
    }

    /// The prompt tokens a step starting at `fl` prefills: a chunk, or what joined work is left.
    fn step_chunk(&self, fl: &Fluid) -> f64 {
        if fl.joined == 0 {
            0.0
        } else {
            self.chunk
                .min((fl.q_joined - fl.q).max(0.0))
                .max(EPS_TOKENS)
        }
    }

    /// The rates of the step under way in `fl` and its next breakpoint. See
    /// [`Self::set_rates`].
    #[inline]
    fn rates(&self, fl: &Fluid) -> Rates {
        let queued = (fl.q_joined - fl.q).max(0.0);
        let c = fl.c_step;
        let mut decode_s = self.step_time[self.n_decoding as usize];
        if self.kv_read_s > 0.0 && self.n_decoding > 0 {
            // the KV the decoders attend to, read in the step starting at `fl.v`
            decode_s += self.kv_read_s * (self.ctx_base + self.ctx_per_v * fl.v).max(0.0);
        }
        // a step without prefill is its decode (`mixed_step_s` of a zero prefill, exactly):
        // no division for it
        let step = if c > 0.0 {
            mixed_step_s(decode_s, c / self.prefill_tok_s, self.overlap)
        } else {
            decode_s
        };
        let (rate_v, rate_q) = if step > 0.0 && self.speed > 0.0 {
            let rate_v = self.speed / step;
            (rate_v, if c > 0.0 { rate_v * c } else { 0.0 })
        } else {
            (0.0, 0.0)
        };
        let tol = tolerance_at(rate_v);
        let mut next = f64::INFINITY;
        if fl.gated > 0 {
            next = self.gate_v;
        }
        if rate_q > 0.0 && c >= self.chunk {
            // whole chunks until the boundary at which less than one is left: that step is
            // shorter
            let first = next_boundary_at(fl.v, rate_v, tol);
            let left = queued - (first - fl.v) * c;
            let whole = floor_nn((left / self.chunk).max(0.0));
            if left - whole * self.chunk > EPS_TOKENS {
                next = next.min(first + whole);
            }
        }
        Rates {
            v: rate_v,
            q: rate_q,
            break_v: next,
            tol,
        }
    }

    /// The speed multiplier at `t` (0 if the engine is not up).
    pub(super) fn speed_at(&self, t: u64) -> f64 {
        if t < self.core.ready_at {
            return 0.0;
        }
        self.core.pace.current()
    }

    /// Recomputes rates and the next event after any change at `t0`; bumps the generation.
    pub(super) fn refresh_rates(&mut self) {
        let t = self.core.t0;
        if self.n_decoding == 0 && self.fl.joined == 0 {
            // Nothing is stepping: the next step starts now. Re-base the step clock (the decode
            // heap is empty) and let the gated sequences in.
            self.fl.v = 0.0;
            self.join_gated();
        }
        self.core.pace.note_work(self.fl.work, EPS_TOKENS);
        self.core.pace.enter_epoch(t);
        self.speed = self.speed_at(t);
        if !self.fl.mid_step() {
            // a step starts here: its prefill is fixed until its end
            self.fl.c_step = self.step_chunk(&self.fl);
        } else if self.fl.joined == 0 {
            // the work it carried was aborted
            self.fl.c_step = 0.0;
        }
        let rates = self.rates(&self.fl);
        self.fl.set_rates(rates);
        self.core.generation += 1;
        self.core.next_event = self.compute_next();
    }

    /// Seconds from `fl` to the next thing the host must be woken for under `fl`'s rates
    /// (a completion, a first token, the end of the warm-up); `INFINITY` if none.
    fn first_change(&self, fl: &Fluid) -> f64 {
        let mut best = f64::INFINITY;
        if fl.rate_v <= 0.0 {
            return best;
        }
        if let Some(top) = self.decode.peek() {
            best = best.min((top.finish() - fl.v) / fl.rate_v);
        }
        if fl.joined > 0 && fl.rate_q > 0.0 {
            // The front's first token comes at the end of the step that finishes its prefill.
            let h = *self.prefill.front().expect("joined sequences are queued");
            let per_step = fl.rate_q / fl.rate_v;
            let v_done = fl.v + (self.slots[h as usize].state.prefill_end - fl.q) / per_step;
            let v_event = ceil_nn(v_done - fl.tolerance()).max(fl.next_boundary());
            best = best.min((v_event - fl.v) / fl.rate_v);
        }
        if !self.core.pace.is_warm() {
            let work_rate = fl.rate_v * f64::from(self.n_decoding) + fl.rate_q;
            best = best.min(self.core.pace.warmup_left(fl.work) / work_rate);
        }
        best.max(0.0)
    }

    /// The next event's time; keeps the look-ahead's first crossing, if it made one, in
    /// `crossing`.
    fn compute_next(&mut self) -> Option<u64> {
        let t = self.core.t0;
        let at = |dt_s: f64| -> u64 { t.saturating_add(secs_to_nanos_ceil(dt_s)) };
        let mut best: Option<u64> = None;
        let mut consider = |x: u64| best = Some(best.map_or(x, |b: u64| b.min(x)));
        let busy = self.running > 0;
        if busy && self.core.ready_at > t && self.core.ready_at != u64::MAX {
            consider(self.core.ready_at);
        }
        // Look ahead through the breakpoints for the first change the host must see; after a
        // few, wake at the last one reached (crossing it there changes nothing either).
        let mut change = self.first_change(&self.fl);
        let mut to_break = self.fl.secs_to_break();
        self.crossing = None;
        if change <= to_break {
            // no breakpoint before it (most refreshes): no look-ahead copy
            if change.is_finite() {
                consider(at(change));
            }
        } else {
            // the first breakpoint comes before the change (just tested): cross it at once
            let mut fl = self.fl;
            let mut ahead = 0.0;
            for crossed in 1.. {
                fl.flow(to_break, self.n_decoding);
                self.cross(&mut fl);
                if crossed == 1 {
                    self.crossing = Some(Crossing { secs: to_break, fl });
                }
                ahead += to_break;
                change = self.first_change(&fl);
                to_break = fl.secs_to_break();
                if change <= to_break {
                    if change.is_finite() {
                        consider(at(ahead + change));
                    }
                    break;
                }
                if crossed == MAX_LOOKAHEAD_BREAKS {
                    consider(at(ahead + to_break));
                    break;
                }
            }
        }
        if busy
            && self.core.ready_at <= t
            && let Some(next) = self.core.pace.next_epoch_after(t)
        {
            consider(next);
        }
        best
    }
}
