//! The bytes the events of every watch may hold together while they wait for their clients:
//! [`TOTAL_BYTES`], for the polled watchers' buffers and the `WatchDir` streams' queues alike.
//!
//! Each holder charges what it holds ([`Charge`]) and gives it back as its client takes it
//! (or when it is dropped). A holder that cannot charge more ends its watch the way a full
//! buffer does, with `resource_exhausted`: one watch that fills the budget ends, the others
//! keep what they hold.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes of waiting events, in all watches together.
pub const TOTAL_BYTES: usize = 64 << 20;

static HELD: AtomicUsize = AtomicUsize::new(0);

/// What one holder has charged to the budget; given back when dropped.
#[derive(Debug, Default)]
pub struct Charge {
    bytes: usize,
}

impl Charge {
    /// Bytes charged.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Charges `bytes` more; false (and nothing charged) when the budget has no room.
    pub fn add(&mut self, bytes: usize) -> bool {
        let taken = HELD.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
            held.checked_add(bytes)
                .filter(|total| *total <= TOTAL_BYTES)
        });
        if taken.is_err() {
            return false;
        }
        self.bytes += bytes;
        true
    }

    /// Charges `bytes` in all (more or less than now); false when more does not fit.
    pub fn set(&mut self, bytes: usize) -> bool {
        match bytes.checked_sub(self.bytes) {
            Some(more) => self.add(more),
            None => {
                self.release(self.bytes - bytes);
                true
            }
        }
    }

    /// Gives everything back.
    pub fn clear(&mut self) {
        self.release(self.bytes);
    }

    fn release(&mut self, bytes: usize) {
        let bytes = bytes.min(self.bytes);
        HELD.fetch_sub(bytes, Ordering::SeqCst);
        self.bytes -= bytes;
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.clear();
    }
}

/// What a full budget ends a watch with.
pub fn exhausted() -> crate::connect::Error {
    crate::connect::Error::new(
        crate::connect::Code::ResourceExhausted,
        format!(
            "the daemon's {} MiB for events waiting for their clients are used up: events were \
             lost; the watch is ended",
            TOTAL_BYTES >> 20
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_are_bounded_in_total_and_given_back() {
        // Other tests may hold some of the budget: take all that is left, in steps.
        let mut all = Charge::default();
        let mut step = TOTAL_BYTES;
        while step > 0 {
            if !all.add(step) {
                step /= 2;
            }
        }
        let mut other = Charge::default();
        assert!(!other.add(TOTAL_BYTES), "nothing fits past the total");
        assert_eq!(other.bytes(), 0);
        let held = all.bytes();
        assert!(all.set(held - 100));
        assert_eq!(all.bytes(), held - 100);
        drop(all);
        assert!(other.add(1 << 20), "dropped charges are given back");
        other.clear();
        assert_eq!(other.bytes(), 0);
    }
}
