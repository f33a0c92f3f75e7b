//! Which question each ranking answers, said once for the outputs of both (issue 41: `compare`
//! and `capacity` named different winners on one scenario and neither said why). They differ by
//! design: a policy can meet the SLO best at today's load and still saturate first.

/// What `compare` ranks by, and where the other question is answered.
pub const COMPARE: &str = "`compare` ranks the policies at the scenario's own load (each metric, \
     the SLO attainment included, at that load); `routelab capacity` asks how much load each \
     carries while still meeting the SLO, a different question that can name another winner.";

/// What `capacity` ranks by, and where the other question is answered.
pub const CAPACITY: &str = "`capacity` ranks the policies by the most load each carries while \
     meeting the SLO; `routelab compare` ranks them at the scenario's own load (the SLO \
     attainment at that load), a different question that can name another winner.";
