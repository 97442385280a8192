//! Zero-copy append of one file to another (SPEC §5): the strategy and its fallbacks.
//!
//! This module owns choosing how bytes move: `FICLONERANGE` for the block-aligned part where the
//! filesystem shares blocks, then `copy_file_range(2)` in a loop, then `pread`/`pwrite` when the
//! kernel refuses (the errno table of Rust std's `kernel_copy.rs`, plus a 0 return before the end
//! of the source, as procfs and sysfs files give). It does not open, create or rename files.

use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};

use crate::fs::error::is_disk_full;
use crate::sys::copy;

/// Largest request to one `copy_file_range` call; the kernel caps a call at about 2 GiB anyway.
const CHUNK: usize = 1 << 30;

/// Buffer of the read/write fallback.
const FALLBACK_BUFFER: usize = 256 * 1024;

/// Appends sources to one destination file, remembering what the kernel refused so that later
/// sources skip a method already known not to work.
pub struct Appender {
    dst_dev: u64,
    block: u64,
    try_clone: bool,
    try_copy_range: bool,
}

impl Appender {
    /// An appender for `dst`, whose metadata gives its device and block size.
    pub fn new(dst: &Metadata) -> Appender {
        Appender {
            dst_dev: dst.dev(),
            block: dst.blksize().max(512),
            try_clone: true,
            try_copy_range: true,
        }
    }

    /// An appender that never tries the methods switched off (for tests of the fallbacks).
    #[cfg(test)]
    fn with_methods(dst: &Metadata, clone: bool, copy_range: bool) -> Appender {
        Appender {
            try_clone: clone,
            try_copy_range: copy_range,
            ..Appender::new(dst)
        }
    }

    /// Appends the first `len` bytes of `src` (on device `src_dev`) to `dst` at `dst_offset`
    /// (its current end). Returns the count appended: `len`, or less if `src` shrank meanwhile.
    pub fn append(
        &mut self,
        src: &File,
        src_dev: u64,
        len: u64,
        dst: &File,
        dst_offset: u64,
    ) -> io::Result<u64> {
        let mut src_offset = 0u64;
        let mut dst_offset = dst_offset;
        if self.try_clone && src_dev == self.dst_dev && dst_offset.is_multiple_of(self.block) {
            let aligned = len - len % self.block;
            if aligned > 0 {
                match copy::clone_range(src, 0, dst, dst_offset, aligned) {
                    Ok(()) => {
                        src_offset = aligned;
                        dst_offset += aligned;
                    }
                    Err(err) if is_disk_full(&err) => return Err(err),
                    // EOPNOTSUPP, ENOTTY, EINVAL (alignment), EXDEV...: copy instead, and stop
                    // asking for this destination.
                    Err(_) => self.try_clone = false,
                }
            }
        }
        if self.try_copy_range {
            while src_offset < len {
                let want = usize::try_from(len - src_offset)
                    .unwrap_or(CHUNK)
                    .min(CHUNK);
                match copy::copy_file_range(src, &mut src_offset, dst, &mut dst_offset, want) {
                    // The source claims more bytes than the kernel will copy: read them.
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                    Err(err) if falls_back(&err) => {
                        if matches!(err.raw_os_error(), Some(libc::ENOSYS | libc::EOPNOTSUPP)) {
                            self.try_copy_range = false;
                        }
                        break;
                    }
                    Err(err) => return Err(err),
                }
            }
        }
        if src_offset < len {
            read_write(src, &mut src_offset, len, dst, &mut dst_offset)?;
        }
        Ok(src_offset)
    }
}

/// The errors after which `copy_file_range` is given up for a plain copy: no such call
/// (`ENOSYS`), not between these files (`EXDEV`, `EINVAL`, `EOPNOTSUPP`, `EBADF`), or forbidden by
/// a seccomp filter or an immutable file (`EPERM`).
pub fn falls_back(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(
            libc::ENOSYS
                | libc::EXDEV
                | libc::EINVAL
                | libc::EOPNOTSUPP
                | libc::EPERM
                | libc::EBADF
        )
    )
}

/// Copies `src[*src_offset..len]` to `dst` at `*dst_offset` through a buffer, advancing both;
/// stops early at the end of `src`.
fn read_write(
    src: &File,
    src_offset: &mut u64,
    len: u64,
    dst: &File,
    dst_offset: &mut u64,
) -> io::Result<()> {
    let mut buffer = vec![0u8; FALLBACK_BUFFER];
    while *src_offset < len {
        let want = usize::try_from(len - *src_offset)
            .unwrap_or(FALLBACK_BUFFER)
            .min(FALLBACK_BUFFER);
        let read = match src.read_at(&mut buffer[..want], *src_offset) {
            Ok(0) => return Ok(()),
            Ok(read) => read,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        };
        dst.write_all_at(&buffer[..read], *dst_offset)?;
        *src_offset += read as u64;
        *dst_offset += read as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..=u8::MAX)
            .cycle()
            .take(len)
            .map(|i| i.wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// Appends each of `parts` with `appender` and returns the destination's bytes.
    fn compose(parts: &[Vec<u8>], clone: bool, copy_range: bool) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let dst = File::create_new(dir.path().join("out")).unwrap();
        let mut appender = Appender::with_methods(&dst.metadata().unwrap(), clone, copy_range);
        let mut offset = 0;
        for (i, part) in parts.iter().enumerate() {
            let path = dir.path().join(format!("part{i}"));
            std::fs::File::create(&path)
                .unwrap()
                .write_all(part)
                .unwrap();
            let src = File::open(&path).unwrap();
            let meta = src.metadata().unwrap();
            let len = meta.len();
            offset += appender
                .append(&src, meta.dev(), len, &dst, offset)
                .unwrap();
        }
        assert_eq!(dst.metadata().unwrap().len(), offset);
        std::fs::read(dir.path().join("out")).unwrap()
    }

    fn parts() -> Vec<Vec<u8>> {
        vec![
            pattern(1, 8192),
            Vec::new(),
            pattern(2, 5000),
            pattern(3, 4096 * 3 + 17),
            Vec::new(),
            pattern(4, 1),
            pattern(5, 3 * 1024 * 1024 + 11),
        ]
    }

    #[test]
    fn every_method_appends_the_same_bytes_in_order() {
        let expected: Vec<u8> = parts().concat();
        for (clone, copy_range) in [(true, true), (false, true), (false, false)] {
            assert!(
                compose(&parts(), clone, copy_range) == expected,
                "clone={clone} copy_range={copy_range}"
            );
        }
    }

    #[test]
    fn a_device_the_kernel_will_not_copy_from_falls_back_to_read_write() {
        // copy_file_range from a character device is EINVAL: the fallback reads it instead.
        let zero = File::open("/dev/zero").unwrap();
        let meta = zero.metadata().unwrap();
        let dst = tempfile::tempfile().unwrap();
        dst.write_all_at(b"head", 0).unwrap();
        let mut appender = Appender::new(&dst.metadata().unwrap());
        assert_eq!(
            appender
                .append(&zero, meta.dev(), 300_000, &dst, 4)
                .unwrap(),
            300_000
        );
        let mut out = vec![1u8; 300_004];
        dst.read_exact_at(&mut out, 0).unwrap();
        assert_eq!(&out[..4], b"head");
        assert!(out[4..].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_source_shorter_than_announced_stops_at_its_end() {
        let mut src = tempfile::tempfile().unwrap();
        src.write_all(b"short").unwrap();
        let meta = src.metadata().unwrap();
        let dst = tempfile::tempfile().unwrap();
        let mut appender = Appender::new(&dst.metadata().unwrap());
        assert_eq!(appender.append(&src, meta.dev(), 1000, &dst, 0).unwrap(), 5);
        let mut appender = Appender::with_methods(&dst.metadata().unwrap(), false, false);
        assert_eq!(appender.append(&src, meta.dev(), 1000, &dst, 5).unwrap(), 5);
        assert_eq!(dst.metadata().unwrap().len(), 10);
    }

    #[test]
    fn the_fallback_errno_table() {
        for errno in [
            libc::ENOSYS,
            libc::EXDEV,
            libc::EINVAL,
            libc::EOPNOTSUPP,
            libc::EPERM,
            libc::EBADF,
        ] {
            assert!(falls_back(&io::Error::from_raw_os_error(errno)), "{errno}");
        }
        for errno in [libc::ENOSPC, libc::EDQUOT, libc::EIO, libc::EFBIG] {
            assert!(!falls_back(&io::Error::from_raw_os_error(errno)), "{errno}");
        }
    }
}
