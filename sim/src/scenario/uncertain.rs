//! The fleet with one uncertain profile field at the low or the high end of its uncertainty
//! (`routelab plan`'s fleet conditions; the rule of which fields are uncertain, and by how
//! much, is [`crate::hardware::uncertainty`]'s).

use super::Scenario;
use crate::hardware::{HardwareProfile, UncertainField};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A fleet condition: one field at one end, on every profile that is uncertain about it.
#[derive(Debug, Clone)]
pub struct UncertainFleet {
    /// The field.
    pub field: UncertainField,
    /// The high end (each profile's field × (1 + u)); else the low end (× (1 − u)).
    pub high: bool,
    /// What it changes: `prefill_tok_s × 0.7 on mac-m3-ultra-27b (±30 %), …`.
    pub what: String,
    /// The scenario with that fleet.
    pub scenario: Scenario,
}

impl Scenario {
    /// For each uncertain field of any of the fleet's profiles (in [`UncertainField::ALL`]
    /// order), the fleet at its low end, then at its high end; every other field, profile and
    /// setting as it is. Fields no profile is uncertain about give no condition.
    pub fn uncertain_fleets(&self) -> Vec<UncertainFleet> {
        let mut out = Vec::new();
        for field in UncertainField::ALL {
            // Each profile once, by name, in the order the fleet first uses it.
            let mut uncertain: Vec<(&str, f64)> = Vec::new();
            for w in &self.setup.workers {
                if let Some(u) = w.profile.uncertainty(field)
                    && uncertain.iter().all(|(n, _)| *n != w.profile.name())
                {
                    uncertain.push((w.profile.name(), u));
                }
            }
            if uncertain.is_empty() {
                continue;
            }
            for high in [false, true] {
                let factor = |u: f64| if high { 1.0 + u } else { 1.0 - u };
                let mut scaled: BTreeMap<String, Arc<HardwareProfile>> = BTreeMap::new();
                let mut sc = self.clone();
                for w in &mut sc.setup.workers {
                    let Some(u) = w.profile.uncertainty(field) else {
                        continue;
                    };
                    let p = scaled
                        .entry(w.profile.name().to_string())
                        .or_insert_with(|| Arc::new(w.profile.with_field_scaled(field, factor(u))))
                        .clone();
                    w.profile = p;
                }
                let what = uncertain
                    .iter()
                    .map(|(name, u)| {
                        format!(
                            "{} × {} on {name} (±{} %)",
                            field.name(),
                            round3(factor(*u)),
                            round3(u * 100.0)
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                out.push(UncertainFleet {
                    field,
                    high,
                    what,
                    scenario: sc,
                });
            }
        }
        out
    }
}

/// A factor or percentage as written: up to 3 decimals, no trailing zeros.
fn round3(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}
