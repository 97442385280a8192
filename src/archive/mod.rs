//! The tar format (POSIX.1-2001 pax, read and written by hand): what a member's header blocks
//! are, and a reader fed bytes as they arrive. Pure: no file is opened here; walking a tree into
//! an archive is `api::download::tar`'s, unpacking one is `api::archive_upload`'s.
//!
//! Why by hand and not the `tar` crate: its `Builder` pulls a member's data from a `Read` and
//! its `Archive` pulls from a `Read`, while sandboxd's producers are pushed (a download job
//! writes one piece at a time and parks while the client is slow; an upload is fed whatever
//! bytes the body brought). Wrapping either way needs a thread per transfer or a buffer of a
//! whole member. The part of the format sandboxd needs (regular files, directories, symbolic
//! and hard links, pax records for long names, large numbers, sub-second times and extended
//! attributes; GNU long names and base-256 numbers when reading) is a few hundred lines, and
//! costs a few KiB of binary where the crate costs tens.

pub mod header;
pub mod reader;

/// A tar block: every header and every member's data padding is a multiple of it.
pub const BLOCK: usize = 512;

/// The kinds of member sandboxd writes and reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// A hard link to an earlier member (`link` names it).
    HardLink,
    /// A character or block device, or a FIFO: refused when reading, never written.
    Special(u8),
    /// Any other type flag (sparse files, volume labels, ...): refused when reading.
    Other(u8),
}

/// The `SCHILY.xattr.` prefix of a pax record carrying an extended attribute (GNU tar's and
/// bsdtar's name for it).
pub const XATTR_RECORD: &[u8] = b"SCHILY.xattr.";

/// The zero bytes that pad `size` bytes of data to a whole block.
pub fn padding(size: u64) -> usize {
    // Below 512: fits any usize.
    let rest = usize::try_from(size % BLOCK as u64).unwrap_or(0);
    (BLOCK - rest) % BLOCK
}
