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

/// Appends `count` zero bytes to `out` (a copy of static zeros: `Vec::resize` fills a byte at a
/// time in the size-optimised release build).
pub fn push_zeros(out: &mut Vec<u8>, count: usize) {
    static ZEROS: [u8; BLOCK] = [0; BLOCK];
    let mut left = count;
    while left > 0 {
        let take = left.min(ZEROS.len());
        out.extend_from_slice(&ZEROS[..take]);
        left -= take;
    }
}

/// The zero bytes that pad `size` bytes of data to a whole block.
pub fn padding(size: u64) -> usize {
    // Below 512: fits any usize.
    let rest = usize::try_from(size % BLOCK as u64).unwrap_or(0);
    (BLOCK - rest) % BLOCK
}

/// The sums of `bytes` read as unsigned and as signed bytes, eight bytes at a time (the
/// release build is size-optimised, where a byte loop is not vectorised: summing a header
/// block a byte at a time was a tenth of a small-file archive's CPU): the bytes added in
/// pairs of 16-bit lanes, and the signed sum the unsigned one less 256 for each byte over 127.
pub fn byte_sums(bytes: &[u8]) -> (u64, i64) {
    const LOW_BYTES: u64 = 0x00ff_00ff_00ff_00ff;
    const LANES: u64 = 0x0001_0001_0001_0001;
    const HIGH_BITS: u64 = 0x0101_0101_0101_0101;
    let mut unsigned = 0u64;
    let mut high = 0u64;
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let mut eight = [0u8; 8];
        eight.copy_from_slice(word);
        let x = u64::from_le_bytes(eight);
        // Four lanes of at most 510 each; the multiply adds them into the top lane.
        let pairs = (x & LOW_BYTES) + ((x >> 8) & LOW_BYTES);
        unsigned += pairs.wrapping_mul(LANES) >> 48;
        high += ((x >> 7) & HIGH_BITS).wrapping_mul(HIGH_BITS) >> 56;
    }
    for &byte in words.remainder() {
        unsigned += u64::from(byte);
        high += u64::from(byte >> 7);
    }
    (unsigned, unsigned.cast_signed() - 256 * high.cast_signed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sums_count_every_byte_as_unsigned_and_as_signed() {
        let mut block = [0u8; BLOCK + 3];
        block[0] = 0xff;
        block[7] = 0x80;
        block[100] = b'a';
        block[BLOCK + 2] = 0xfe;
        let unsigned: u64 = block.iter().map(|&b| u64::from(b)).sum();
        let signed: i64 = block.iter().map(|&b| i64::from(b.cast_signed())).sum();
        assert_eq!(byte_sums(&block), (unsigned, signed));
        let full = [0xffu8; BLOCK];
        assert_eq!(byte_sums(&full), (255 * 512, -512));
    }

    #[test]
    fn push_zeros_appends_exactly_that_many_zeros() {
        let mut out = vec![7u8];
        push_zeros(&mut out, 0);
        assert_eq!(out, [7]);
        push_zeros(&mut out, 3 * BLOCK + 5);
        assert_eq!(out.len(), 1 + 3 * BLOCK + 5);
        assert!(out[1..].iter().all(|&b| b == 0));
    }
}
