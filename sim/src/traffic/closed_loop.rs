//! Closed-loop users: send, wait for the completion, think, send again.

use serde::{Deserialize, Serialize};

use super::dist::{DurationDist, LengthDist, SourceRng, Until, rng_from_seed};
use super::{Arrival, TrafficError, TrafficSource};

/// `users` users; user `i` sends its first request at `start + ramp · i / users`, then after
/// each completion thinks for a `think` sample and sends again, until `until` (requests
/// counted over all users; no request is sent at or after `start + duration`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClosedLoopConfig {
    /// Start, ns.
    #[serde(default)]
    pub start: u64,
    /// Number of concurrent users (≥ 1).
    pub users: u32,
    /// First requests are spread evenly over `[start, start + ramp)`, ns.
    #[serde(default)]
    pub ramp: u64,
    /// Think time between a completion and the user's next request.
    pub think: DurationDist,
    /// Stop condition.
    pub until: Until,
    /// Prompt tokens.
    pub prompt: LengthDist,
    /// Output tokens.
    pub output: LengthDist,
}

/// Generator for [`ClosedLoopConfig`]. The tag of an arrival is its user id (`0..users`).
///
/// [`next_arrival`](TrafficSource::next_arrival) yields each user's first request only; every
/// later request is returned by [`on_complete`](TrafficSource::on_complete) for the user's
/// outstanding request, never earlier.
#[derive(Debug, Clone)]
pub struct ClosedLoop {
    cfg: ClosedLoopConfig,
    rng: SourceRng,
    end: u64,
    sent: u64,
    next_user: u32,
    in_flight: Vec<bool>,
}

impl ClosedLoop {
    /// Validate `cfg` and seed the generator.
    ///
    /// # Errors
    /// [`TrafficError::InvalidConfig`] for zero users, no stop condition or bad distributions.
    pub fn new(cfg: ClosedLoopConfig, seed: u64) -> Result<Self, TrafficError> {
        const G: &str = "ClosedLoop";
        if cfg.users == 0 {
            return Err(TrafficError::config(
                G,
                "users",
                "is 0; expected >= 1 users",
            ));
        }
        cfg.think.validate(G, "think")?;
        cfg.until.validate(G)?;
        cfg.prompt.validate(G, "prompt")?;
        cfg.output.validate(G, "output")?;
        Ok(Self {
            end: cfg.until.end(cfg.start),
            in_flight: vec![false; cfg.users as usize],
            rng: rng_from_seed(seed),
            cfg,
            sent: 0,
            next_user: 0,
        })
    }

    /// Requests sent so far (first requests plus follow-ups).
    #[must_use]
    pub const fn sent(&self) -> u64 {
        self.sent
    }

    /// Users with a request outstanding.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.in_flight.iter().filter(|b| **b).count()
    }

    fn send(&mut self, user: u32, at: u64) -> Option<Arrival> {
        if self.sent >= self.cfg.until.max_count() || at >= self.end {
            return None;
        }
        self.sent += 1;
        self.in_flight[user as usize] = true;
        Some(Arrival::new(
            at,
            self.cfg.prompt.sample(&mut self.rng),
            self.cfg.output.sample(&mut self.rng),
            u64::from(user),
        ))
    }
}

impl TrafficSource for ClosedLoop {
    fn next_arrival(&mut self) -> Result<Option<Arrival>, TrafficError> {
        if self.next_user >= self.cfg.users {
            return Ok(None);
        }
        let user = self.next_user;
        self.next_user += 1;
        let offset = u128::from(self.cfg.ramp) * u128::from(user) / u128::from(self.cfg.users);
        let at = self.cfg.start.saturating_add(offset as u64);
        let a = self.send(user, at);
        if a.is_none() {
            self.next_user = self.cfg.users; // the stop condition is monotone
        }
        Ok(a)
    }

    fn on_complete(&mut self, now: u64, tag: u64) -> Option<Arrival> {
        let user = u32::try_from(tag).ok().filter(|u| *u < self.cfg.users)?;
        if !std::mem::replace(&mut self.in_flight[user as usize], false) {
            return None; // nothing outstanding for this user (duplicate completion)
        }
        let at = now.saturating_add(self.cfg.think.sample(&mut self.rng));
        self.send(user, at)
    }
}
