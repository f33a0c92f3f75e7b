//! The aggregate cap on buffered request bodies (`max_buffered_body_bytes`): every body is
//! held whole while it is read, counted and sent, so `max_body_bytes` alone bounds one request,
//! not forty at once (40 × 32 MiB held 800 MB). Bytes are counted as they arrive; a body that
//! would take the total past the cap is refused at once (503, `Retry-After`), and its bytes
//! leave the total when its request lets go of them.

use crate::error::ApiError;
use axum::http::StatusCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The bytes of request bodies held now, and the most that may be.
#[derive(Debug)]
pub(crate) struct BodyBudget {
    cap: usize,
    held: AtomicUsize,
}

impl BodyBudget {
    /// A budget of `cap` bytes.
    pub fn new(cap: usize) -> Arc<BodyBudget> {
        Arc::new(BodyBudget {
            cap,
            held: AtomicUsize::new(0),
        })
    }

    /// An empty hold on this budget, grown as a body's bytes arrive.
    pub fn hold(self: &Arc<BodyBudget>) -> BodyHold {
        BodyHold {
            budget: self.clone(),
            bytes: 0,
        }
    }
}

/// One request's bytes in the budget, given back when it is dropped.
#[derive(Debug)]
pub(crate) struct BodyHold {
    budget: Arc<BodyBudget>,
    bytes: usize,
}

impl BodyHold {
    /// Count `n` more bytes, or refuse them (nothing counted) when the budget would overflow.
    pub fn grow(&mut self, n: usize) -> Result<(), ApiError> {
        let b = &self.budget;
        let before = b.held.fetch_add(n, Relaxed);
        if before.saturating_add(n) > b.cap {
            b.held.fetch_sub(n, Relaxed);
            let e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "too_many_buffered_bodies",
                format!(
                    "the gateway holds {before} bytes of request bodies and its limit \
                     (max_buffered_body_bytes) is {}; retry shortly",
                    b.cap
                ),
            );
            let mut e = e;
            e.retry_after_s = Some(1);
            return Err(e);
        }
        self.bytes += n;
        Ok(())
    }
}

impl Drop for BodyHold {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_counts_until_dropped_and_the_cap_refuses_the_overflow() {
        let budget = BodyBudget::new(100);
        let mut a = budget.hold();
        a.grow(60).unwrap();
        let mut b = budget.hold();
        assert!(b.grow(50).is_err(), "60 + 50 > 100");
        assert_eq!(
            budget.held.load(Relaxed),
            60,
            "a refused grow counts nothing"
        );
        b.grow(40).unwrap();
        assert_eq!(budget.held.load(Relaxed), 100);
        drop(a);
        assert_eq!(budget.held.load(Relaxed), 40);
        drop(b);
        assert_eq!(budget.held.load(Relaxed), 0);
    }
}
