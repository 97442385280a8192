//! The byte budget of collected request bodies: all connections together hold at most so many
//! bytes of bodies being collected ([`crate::Action::Collect`]), so that many clients each
//! trickling a body up to its limit cannot make the server hold their sum.
//!
//! A body's bytes are reserved up front when its `Content-Length` is known, else as they
//! arrive (chunked); the reservation is released when the body is handed to the application
//! or the connection gives it up. A request that finds the budget full is refused with
//! [`crate::Error::BodyBudget`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The budget shared by every connection.
#[derive(Debug)]
pub(crate) struct Budget {
    limit: usize,
    used: AtomicUsize,
}

/// Bytes held from a [`Budget`] until dropped.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: Arc<Budget>,
    bytes: usize,
}

impl Budget {
    pub(crate) fn new(limit: usize) -> Arc<Budget> {
        Arc::new(Budget {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// An empty reservation, to grow.
    pub(crate) fn reservation(self: &Arc<Self>) -> Reservation {
        Reservation {
            budget: Arc::clone(self),
            bytes: 0,
        }
    }

    fn take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }

    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

impl Reservation {
    /// Holds `bytes` more; false (nothing more held) when the budget cannot give them.
    pub(crate) fn grow(&mut self, bytes: usize) -> bool {
        if !self.budget.take(bytes) {
            return false;
        }
        self.bytes += bytes;
        true
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(crate) fn budget_limit(&self) -> usize {
        self.budget.limit
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_refused_past_the_limit_and_released_when_dropped() {
        let budget = Budget::new(100);
        let mut a = budget.reservation();
        assert!(a.grow(60));
        let mut b = budget.reservation();
        assert!(!b.grow(41), "60 + 41 > 100");
        assert!(b.grow(40));
        assert!(!b.grow(1));
        assert_eq!(budget.used(), 100);
        drop(a);
        assert_eq!(budget.used(), 40);
        assert!(b.grow(60));
        drop(b);
        assert_eq!(budget.used(), 0);
        assert!(!budget.reservation().grow(usize::MAX));
    }
}
