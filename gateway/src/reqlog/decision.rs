//! A routing decision's part of a log line (and of the `x-routelab-decision` header): the
//! policy crate's [`ShownDecision`](routelab_policies::ShownDecision), the one shape the
//! simulator writes its decisions in too.

pub use routelab_policies::{ShownCandidate as LogCandidate, ShownDecision as LogDecision};
