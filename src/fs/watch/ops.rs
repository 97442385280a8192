//! What an inotify event means, in envd's words: the kinds of change (`Op`) a mask carries.
//!
//! envd watches with fsnotify (e2b-dev's fork, v0.0.1), whose default operations subscribe to
//! [`MASK`] and read the bits as below; `IN_CLOSE_WRITE` is not among them (fsnotify reports it
//! only as an unportable extra operation envd never asks for), so a write is `IN_MODIFY`, once
//! per `write(2)` the kernel does not merge. One event may carry several bits; envd then sends
//! one event per operation, in the order of [`Op::ALL`]: create, rename, chmod, write, remove.

/// A kind of change, as envd's `EventType` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Create,
    Rename,
    Chmod,
    Write,
    Remove,
}

impl Op {
    /// Every operation, in the order envd sends those of one event, with the inotify bits that
    /// mean it.
    pub const ALL: [(Op, u32); 5] = [
        (Op::Create, libc::IN_CREATE | libc::IN_MOVED_TO),
        (Op::Rename, libc::IN_MOVED_FROM | libc::IN_MOVE_SELF),
        (Op::Chmod, libc::IN_ATTRIB),
        (Op::Write, libc::IN_MODIFY),
        (Op::Remove, libc::IN_DELETE | libc::IN_DELETE_SELF),
    ];

    /// True for the operations after which the entry is still at the path, so its `EntryInfo`
    /// may be reported (envd's `opCarriesEntry`): a stat after a remove or a rename-away
    /// could describe another entry created there since.
    pub fn carries_entry(self) -> bool {
        matches!(self, Op::Create | Op::Write | Op::Chmod)
    }
}

/// The events every watch subscribes to (fsnotify's defaults).
pub const MASK: u32 = libc::IN_CREATE
    | libc::IN_MODIFY
    | libc::IN_DELETE
    | libc::IN_DELETE_SELF
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_MOVE_SELF
    | libc::IN_ATTRIB;

/// The operations `mask` carries, in envd's order.
pub fn from_mask(mask: u32) -> impl Iterator<Item = Op> {
    Op::ALL
        .into_iter()
        .filter(move |(_, bits)| mask & bits != 0)
        .map(|(op, _)| op)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(mask: u32) -> Vec<Op> {
        from_mask(mask).collect()
    }

    #[test]
    fn each_bit_maps_as_fsnotify_reads_it() {
        assert_eq!(ops(libc::IN_CREATE), [Op::Create]);
        assert_eq!(ops(libc::IN_MOVED_TO), [Op::Create]);
        assert_eq!(ops(libc::IN_MODIFY), [Op::Write]);
        assert_eq!(ops(libc::IN_DELETE), [Op::Remove]);
        assert_eq!(ops(libc::IN_DELETE_SELF), [Op::Remove]);
        assert_eq!(ops(libc::IN_MOVED_FROM), [Op::Rename]);
        assert_eq!(ops(libc::IN_MOVE_SELF), [Op::Rename]);
        assert_eq!(ops(libc::IN_ATTRIB), [Op::Chmod]);
        // Flags describe the event; they are no operation.
        assert_eq!(ops(libc::IN_CREATE | libc::IN_ISDIR), [Op::Create]);
        assert!(ops(libc::IN_CLOSE_WRITE | libc::IN_IGNORED | libc::IN_Q_OVERFLOW).is_empty());
        assert!(ops(libc::IN_OPEN | libc::IN_ACCESS | libc::IN_CLOSE_NOWRITE).is_empty());
    }

    #[test]
    fn several_bits_give_several_operations_in_envds_order() {
        let all = libc::IN_DELETE | libc::IN_MODIFY | libc::IN_ATTRIB | libc::IN_MOVED_FROM;
        assert_eq!(
            ops(all | libc::IN_CREATE),
            [Op::Create, Op::Rename, Op::Chmod, Op::Write, Op::Remove]
        );
        assert_eq!(
            ops(libc::IN_DELETE_SELF | libc::IN_ATTRIB),
            [Op::Chmod, Op::Remove]
        );
    }

    #[test]
    fn the_mask_covers_every_mapped_bit() {
        for (_, bits) in Op::ALL {
            assert_eq!(MASK & bits, bits);
        }
        assert_eq!(MASK & libc::IN_CLOSE_WRITE, 0);
    }

    #[test]
    fn only_changes_that_leave_the_entry_in_place_carry_it() {
        let carrying: Vec<Op> = Op::ALL
            .iter()
            .map(|(op, _)| *op)
            .filter(|op| op.carries_entry())
            .collect();
        assert_eq!(carrying, [Op::Create, Op::Chmod, Op::Write]);
    }
}
