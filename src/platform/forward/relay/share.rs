//! The relay's descriptors, counted against its share of the open-file limit
//! ([`crate::descriptors`]): its listeners, both sockets of every connection, a bulk
//! direction's pipe. A connection is taken only while two more fit in the share and neither of
//! its sockets is numbered at or above the ceiling; a pipe only while two more fit and both
//! ends lie below it (a direction without one moves by read and write, as small exchanges
//! always do). The count is kept as descriptors come and go, and made again from the
//! structure after a live upgrade's export or take-over ([`Share::recount`]).

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use crate::descriptors::Budget;
use crate::sys::net::splice_pipe;

#[derive(Debug)]
pub struct Share {
    held: usize,
    most: usize,
    /// The first descriptor number refused.
    ceiling: usize,
    /// Descriptors the ceiling keeps free (for the log).
    reserve: usize,
}

impl Share {
    pub fn new(budget: &Budget) -> Share {
        Share {
            held: 0,
            most: budget.forward_share,
            ceiling: budget.forward_ceiling(),
            reserve: budget.reserve,
        }
    }

    /// No share and no ceiling (unit tests of what is not about descriptors).
    #[cfg(test)]
    pub fn unlimited() -> Share {
        Share {
            held: 0,
            most: usize::MAX,
            ceiling: usize::MAX,
            reserve: 0,
        }
    }

    pub fn held(&self) -> usize {
        self.held
    }

    pub fn reserve(&self) -> usize {
        self.reserve
    }

    /// Whether `n` more descriptors fit in the share.
    pub fn has_room(&self, n: usize) -> bool {
        self.held.saturating_add(n) <= self.most
    }

    /// Whether `fd` is numbered below the ceiling. The kernel hands out the lowest free number,
    /// so one at or above it means every descriptor below is open: the reserve is being eaten.
    pub fn below_ceiling(&self, fd: BorrowedFd<'_>) -> bool {
        usize::try_from(fd.as_raw_fd()).is_ok_and(|n| n < self.ceiling)
    }

    pub fn take(&mut self, n: usize) {
        self.held = self.held.saturating_add(n);
    }

    pub fn give(&mut self, n: usize) {
        self.held = self.held.saturating_sub(n);
    }

    /// Counts again from what the relay holds.
    pub fn recount(&mut self, held: usize) {
        self.held = held;
    }

    /// A pipe of `size` bytes for a bulk direction, when the share and the ceiling allow it.
    pub fn pipe(&mut self, size: usize) -> Option<(OwnedFd, OwnedFd)> {
        if !self.has_room(2) {
            return None;
        }
        let (read, write) = splice_pipe(size).ok()?;
        if !self.below_ceiling(std::os::fd::AsFd::as_fd(&read))
            || !self.below_ceiling(std::os::fd::AsFd::as_fd(&write))
        {
            return None;
        }
        self.take(2);
        Some((read, write))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn the_share_is_counted_and_pipes_stop_at_it() {
        let mut share = Share::new(&Budget {
            limit: 1 << 20,
            reserve: 1,
            forward_share: 3,
        });
        assert!(share.has_room(3) && !share.has_room(4));
        let pipe = share.pipe(1 << 16).expect("a pipe within the share");
        assert_eq!(share.held(), 2);
        assert!(share.pipe(1 << 16).is_none(), "one more than the share");
        assert_eq!(share.held(), 2);
        drop(pipe);
        share.give(2);
        assert_eq!(share.held(), 0);
    }

    #[test]
    fn a_descriptor_at_or_above_the_ceiling_is_refused() {
        let (read, _write) = splice_pipe(1 << 16).unwrap();
        let n = usize::try_from(read.as_raw_fd()).unwrap();
        let at = |ceiling: usize| {
            Share::new(&Budget {
                limit: ceiling + 10,
                reserve: 10,
                forward_share: 100,
            })
        };
        assert!(at(n + 1).below_ceiling(read.as_fd()));
        assert!(!at(n).below_ceiling(read.as_fd()));
        // Any pipe now is numbered above the ceiling of a share whose ceiling is 0.
        let mut none = at(0);
        assert!(none.pipe(1 << 16).is_none());
        assert_eq!(none.held(), 0);
    }
}
