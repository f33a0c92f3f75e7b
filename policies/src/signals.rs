//! Router-local load signals that the field's routers read (see `rules.rs`), kept apart from
//! [`Hot`](crate::chooser::Hot) so the existing choosers' scans touch the same cache lines as
//! before.
//!
//! Two kinds of figure:
//! - **local counters**, charged when the router dispatches a request and released, exactly, when
//!   the host hands the request's [`Charge`] back at first token, completion or failure;
//! - **engine reports** ([`EngineReport`]), which a host polls from its engines on the interval
//!   the policy asks for ([`Router::engine_poll_interval`](crate::Router::engine_poll_interval)).
//!   A host that stops hearing from an engine drops its report
//!   ([`Router::forget_engine_report`](crate::Router::forget_engine_report)) and the rules use the
//!   local counters for it again, as they do before its first report.

/// Tokens per prefix block: hosts hash prompts in blocks of this many tokens (the simulator's
/// traffic and the gateway's 2,048-byte blocks at 4 bytes a token), so believed-cached blocks
/// convert to tokens with it.
pub const PREFIX_BLOCK_TOKENS: u32 = 512;

/// What one dispatched request added to its worker's local counters; the host keeps it with the
/// request and hands it back so the router releases exactly what it charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Charge {
    /// Prompt tokens, counted in flight until the request completes or fails.
    pub tokens: u32,
    /// Prompt tokens the router did not believe cached, counted until the first token (then
    /// [`Router::first_token`](crate::Router::first_token) sets it to 0).
    pub uncached: u32,
    /// What the router saw at dispatch, for the capacity it measures from the completion
    /// (`predictive` only; 0 otherwise): uncached prompt tokens already waiting on the worker
    /// plus this request's.
    pub prefill_at_dispatch: u32,
    /// Requests on the worker at dispatch, this one included (`predictive` only; else 0).
    pub sharing_at_dispatch: u32,
}

impl Charge {
    /// Nothing charged (a request the router did not dispatch).
    pub const NONE: Charge = Charge {
        tokens: 0,
        uncached: 0,
        prefill_at_dispatch: 0,
        sharing_at_dispatch: 0,
    };
}

/// Figures an engine reports when its router polls it (vLLM's and SGLang's metrics endpoints).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EngineReport {
    /// Fraction of the KV cache in use, 0 to 1.
    pub kv_used_fraction: f64,
    /// Prompt tokens of requests waiting for admission.
    pub queued_prompt_tokens: u64,
    /// Tokens (prompt + output so far) of the requests the engine is running.
    pub running_tokens: u64,
    /// Output tokens per second the engine is generating now (0 when idle).
    pub generation_tok_s: f64,
}

/// One worker's router-local signals.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Signals {
    /// Prompt tokens of dispatched, unfinished requests.
    pub tokens_in_flight: u64,
    /// Uncached prompt tokens of dispatched requests not yet at their first token.
    pub uncached_in_flight: u64,
    /// Prompt tokens dispatched since the last engine report (the local count between polls).
    pub tokens_since_report: u64,
    /// Prompt tokens dispatched to the worker so far (cumulative, never released): a host whose
    /// poll takes time reads it when it sends the poll and hands it back with the report
    /// ([`Router::engine_report_as_of`](crate::Router::engine_report_as_of)).
    pub tokens_dispatched: u64,
    /// The last engine report, if any.
    pub report: Option<EngineReport>,
    /// The last positive generation throughput reported (tokens/s), 0 before any.
    pub generation_tok_s: f64,
    /// Peak observed input tokens/s: prompt tokens ÷ (first token − dispatch) of completed
    /// requests; 0 before any observation.
    pub peak_input_tok_s: f64,
    /// Network round trip to the worker in seconds, when the host knows it
    /// ([`Router::set_round_trip`](crate::Router::set_round_trip)).
    pub round_trip_s: Option<f64>,
}

impl Signals {
    pub(crate) fn charge(&mut self, c: Charge) {
        self.tokens_in_flight += u64::from(c.tokens);
        self.uncached_in_flight += u64::from(c.uncached);
        self.tokens_since_report += u64::from(c.tokens);
        self.tokens_dispatched += u64::from(c.tokens);
    }

    /// Saturating: a host that hands back a charge twice cannot drive a counter below 0.
    pub(crate) fn release_uncached(&mut self, c: &mut Charge) {
        self.uncached_in_flight = self
            .uncached_in_flight
            .saturating_sub(u64::from(c.uncached));
        c.uncached = 0;
    }

    pub(crate) fn release(&mut self, mut c: Charge) {
        self.release_uncached(&mut c);
        self.tokens_in_flight = self.tokens_in_flight.saturating_sub(u64::from(c.tokens));
    }

    pub(crate) fn report(&mut self, r: EngineReport) {
        self.report = Some(r);
        self.tokens_since_report = 0;
        if r.generation_tok_s.is_finite() && r.generation_tok_s > 0.0 {
            self.generation_tok_s = r.generation_tok_s;
        }
    }

    /// A report the engine gave in answer to a poll sent when `tokens_dispatched` was `mark`:
    /// what was dispatched since then stays counted on top of it (the engine may have written
    /// its figures before those requests reached it).
    pub(crate) fn report_as_of(&mut self, r: EngineReport, mark: u64) {
        self.report(r);
        self.tokens_since_report = self.tokens_dispatched.saturating_sub(mark);
    }

    /// The last report aged out: back to the local count, and the last positive throughput
    /// is no longer used either (issue 42, item 6: one outlandish sample kept every request
    /// after the engine stopped reporting it; the rules fall back to their default until the
    /// engine reports a rate again). Only a host that polls engines calls this (the simulator's
    /// reports never age out), so simulated runs are unchanged.
    pub(crate) fn forget_report(&mut self) {
        self.report = None;
        self.generation_tok_s = 0.0;
    }

    /// Tokens the engine holds as the router sees it: the last report plus what was dispatched
    /// since, or the local count when no report ever came.
    pub(crate) fn engine_tokens(&self) -> f64 {
        match self.report {
            // Saturating: an engine's figures are input from outside (a gauge of 1e30 read as
            // u64::MAX wrapped a plain sum to a small number and drew all traffic there).
            Some(r) => r
                .queued_prompt_tokens
                .saturating_add(r.running_tokens)
                .saturating_add(self.tokens_since_report) as f64,
            None => self.tokens_in_flight as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_returns_exactly_the_charge_and_first_token_only_the_uncached_part() {
        let mut s = Signals::default();
        let mut a = Charge {
            tokens: 1000,
            uncached: 600,
            ..Charge::NONE
        };
        let b = Charge {
            tokens: 300,
            uncached: 300,
            ..Charge::NONE
        };
        s.charge(a);
        s.charge(b);
        assert_eq!((s.tokens_in_flight, s.uncached_in_flight), (1300, 900));
        s.release_uncached(&mut a);
        assert_eq!(
            (s.tokens_in_flight, s.uncached_in_flight, a.uncached),
            (1300, 300, 0)
        );
        s.release(a);
        s.release(b);
        assert_eq!((s.tokens_in_flight, s.uncached_in_flight), (0, 0));
    }

    /// The probe's `vllm:num_requests_waiting 1e30`: the gauge reads as `u64::MAX` tokens, and a
    /// plain sum wrapped to a few tokens, the least load of the fleet. Saturated, it is the
    /// most.
    #[test]
    fn a_huge_report_saturates_rather_than_wrapping_to_a_light_load() {
        let mut s = Signals::default();
        s.charge(Charge {
            tokens: 100,
            uncached: 100,
            ..Charge::NONE
        });
        s.report(EngineReport {
            kv_used_fraction: 0.5,
            queued_prompt_tokens: 1e30 as u64,
            running_tokens: 500,
            generation_tok_s: 0.0,
        });
        s.charge(Charge {
            tokens: 10,
            uncached: 0,
            ..Charge::NONE
        });
        assert_eq!(s.engine_tokens(), u64::MAX as f64);
    }

    #[test]
    fn a_report_replaces_the_local_count_until_the_next_dispatch() {
        let mut s = Signals::default();
        s.charge(Charge {
            tokens: 100,
            uncached: 100,
            ..Charge::NONE
        });
        assert_eq!(s.engine_tokens(), 100.0);
        s.report(EngineReport {
            kv_used_fraction: 0.5,
            queued_prompt_tokens: 40,
            running_tokens: 500,
            generation_tok_s: 0.0,
        });
        assert_eq!(s.engine_tokens(), 540.0);
        assert_eq!(
            s.generation_tok_s, 0.0,
            "an idle report keeps no throughput"
        );
        s.charge(Charge {
            tokens: 10,
            uncached: 0,
            ..Charge::NONE
        });
        assert_eq!(s.engine_tokens(), 550.0);
        s.report(EngineReport {
            kv_used_fraction: 0.5,
            queued_prompt_tokens: 40,
            running_tokens: 500,
            generation_tok_s: 900_000.0,
        });
        assert_eq!(s.generation_tok_s, 900_000.0);
        s.forget_report();
        assert_eq!(
            s.engine_tokens(),
            s.tokens_in_flight as f64,
            "a dropped report falls back to the local count"
        );
        assert_eq!(
            s.generation_tok_s, 0.0,
            "a stale rate is not used after its report aged out"
        );
    }

    #[test]
    fn a_report_as_of_its_poll_keeps_what_was_dispatched_while_the_poll_was_out() {
        let charge = |tokens| Charge {
            tokens,
            uncached: tokens,
            ..Charge::NONE
        };
        let report = EngineReport {
            running_tokens: 500,
            ..EngineReport::default()
        };
        let mut s = Signals::default();
        s.charge(charge(100));
        let mark = s.tokens_dispatched;
        // Dispatched after the poll went out, before its answer was applied.
        s.charge(charge(30));
        let mut late = s;
        late.report_as_of(report, mark);
        assert_eq!(late.engine_tokens(), 530.0);
        s.report(report);
        assert_eq!(s.engine_tokens(), 500.0, "an instant report forgets them");
        let mut instant = late;
        instant.report_as_of(report, instant.tokens_dispatched);
        assert_eq!(
            instant.engine_tokens(),
            500.0,
            "a mark of now is an instant report"
        );
        assert_eq!(
            (late.tokens_dispatched, late.tokens_in_flight),
            (130, 130),
            "the cumulative count is never reset"
        );
    }
}
