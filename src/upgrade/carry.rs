//! The descriptors one image leaves open for the next across the upgrade's `execve`, by number.
//!
//! The old image's parts (processes, watchers, forwards) name each descriptor their handover
//! refers to with [`Carry::keep`], which returns the number to write down; every number kept is
//! listed in the handover (`carried_fds`), so that the new image claims them all, first thing
//! at start, before anything of its own could be given one of their numbers. What is carried
//! is a duplicate, close-on-exec until right before the `execve`
//! ([`Carry::open_across_exec`]); if the `execve` fails the duplicates are closed and the
//! originals were never changed.
//!
//! The new image gets them as an [`Inherited`] set; each part takes back its own numbers, and
//! the set closes (and logs) whatever no part took.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use crate::log;
use crate::sys::handover as fds;

/// The descriptors the old image keeps open for the next: duplicates of its parts'
/// descriptors, close-on-exec until the `execve` itself, so that nothing changes on the
/// originals and a failed upgrade only closes the duplicates.
#[derive(Default)]
pub struct Carry {
    /// By the original's number (one duplicate however often it is kept).
    kept: BTreeMap<RawFd, OwnedFd>,
}

impl Carry {
    pub fn new() -> Carry {
        Carry::default()
    }

    /// Keeps `fd` open for the next image; the number to write in the handover. A descriptor
    /// kept twice (a terminal's master is its input and its output) is one number.
    pub fn keep(&mut self, fd: BorrowedFd<'_>) -> io::Result<i32> {
        if let Some(kept) = self.kept.get(&fd.as_raw_fd()) {
            return Ok(kept.as_raw_fd());
        }
        let duplicate = fd.try_clone_to_owned()?;
        let number = duplicate.as_raw_fd();
        self.kept.insert(fd.as_raw_fd(), duplicate);
        Ok(number)
    }

    /// Every number kept, for the handover.
    pub fn numbers(&self) -> Vec<i32> {
        self.kept.values().map(AsRawFd::as_raw_fd).collect()
    }

    /// The duplicate kept under `number` (what [`Carry::keep`] returned).
    pub fn descriptor(&self, number: i32) -> Option<BorrowedFd<'_>> {
        self.kept
            .values()
            .find(|fd| fd.as_raw_fd() == number)
            .map(AsFd::as_fd)
    }

    /// Clears close-on-exec on every descriptor kept, right before the `execve`.
    pub fn open_across_exec(&self) -> io::Result<()> {
        self.kept
            .values()
            .try_for_each(|fd| fds::set_close_on_exec(fd, false))
    }
}

/// The descriptors the previous image carried, claimed at start, for the parts to take back.
#[derive(Debug, Default)]
pub struct Inherited {
    fds: BTreeMap<i32, OwnedFd>,
    /// Numbers listed that were not open (or not ours to take): a part asking for one fails.
    missing: Vec<i32>,
}

impl Inherited {
    /// Claims every number of `numbers` (close-on-exec set again). Only at start, before this
    /// image opens anything (`sys::handover::take_fd`'s contract).
    pub fn claim(numbers: &[i32]) -> Inherited {
        let mut inherited = Inherited::default();
        for &number in numbers {
            if inherited.fds.contains_key(&number) {
                continue;
            }
            match fds::take_fd(number) {
                Ok(fd) => {
                    inherited.fds.insert(number, fd);
                }
                Err(error) => {
                    log::line(format_args!(
                        "upgrade: the carried descriptor {number} is unusable: {error}"
                    ));
                    inherited.missing.push(number);
                }
            }
        }
        inherited
    }

    /// Takes back the descriptor carried under `number`; `None` if it was not carried (or was
    /// taken already). A part that shares one descriptor among several uses takes it once.
    pub fn take(&mut self, number: i32) -> Option<OwnedFd> {
        self.fds.remove(&number)
    }

    /// Closes what no part took, saying so.
    pub fn close_rest(self) {
        if !self.fds.is_empty() {
            let numbers: Vec<i32> = self.fds.keys().copied().collect();
            log::line(format_args!(
                "upgrade: closing carried descriptors no part took back: {numbers:?}"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, IntoRawFd};

    #[test]
    fn a_descriptor_kept_twice_is_one_duplicate_opened_across_exec_only_when_asked() {
        let close_on_exec = |fd: RawFd| {
            // The flag as the kernel reports it, through /proc, independently of sys.
            let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap();
            let flags = text
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .map(|v| u32::from_str_radix(v.trim(), 8).unwrap())
                .unwrap();
            flags & 0o2000000 != 0
        };
        let file = fds::memory_file("carry").unwrap();
        let mut carry = Carry::new();
        let number = carry.keep(file.as_fd()).unwrap();
        assert_ne!(number, file.as_raw_fd());
        assert_eq!(carry.keep(file.as_fd()).unwrap(), number);
        assert_eq!(carry.numbers(), vec![number]);
        assert!(close_on_exec(number));
        carry.open_across_exec().unwrap();
        assert!(!close_on_exec(number));
        assert!(close_on_exec(file.as_raw_fd()));
    }

    #[test]
    fn inherited_descriptors_are_taken_once_and_unknown_numbers_are_missing() {
        let file = fds::memory_file("inherited").unwrap();
        let number = file.into_raw_fd();
        let mut inherited = Inherited::claim(&[number, number, 1 << 20]);
        assert_eq!(inherited.missing, vec![1 << 20]);
        assert!(inherited.take(number).is_some());
        assert!(inherited.take(number).is_none());
        inherited.close_rest();
    }
}
