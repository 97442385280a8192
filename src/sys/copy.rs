//! File-to-file copies in the kernel: `copy_file_range(2)` and the `FICLONERANGE` ioctl.
//!
//! Both take explicit offsets, so the descriptors' own file positions are never used or moved.
//! Choosing between them, and falling back, is `fs::copy`'s business.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use super::{check, check_size};

/// `struct file_clone_range` of `<linux/fs.h>`.
#[repr(C)]
struct FileCloneRange {
    src_fd: i64,
    src_offset: u64,
    src_length: u64,
    dest_offset: u64,
}

/// `FICLONERANGE` = `_IOW(0x94, 13, struct file_clone_range)`.
const FICLONERANGE: libc::c_ulong = 0x4020_940d;

/// Copies up to `len` bytes from `src` at `*src_offset` to `dst` at `*dst_offset`, advancing both
/// offsets by the count copied, which is returned (0 at the end of `src`).
pub fn copy_file_range(
    src: &File,
    src_offset: &mut u64,
    dst: &File,
    dst_offset: &mut u64,
    len: usize,
) -> io::Result<usize> {
    let mut off_in = i64::try_from(*src_offset).map_err(|_| einval())?;
    let mut off_out = i64::try_from(*dst_offset).map_err(|_| einval())?;
    // SAFETY: both descriptors are open for the lifetime of the borrows; `off_in` and `off_out`
    // are valid, initialised loff_t values the kernel reads and updates; flags must be 0. The
    // raw syscall is used because not every libc (old musl) exports a wrapper.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_copy_file_range,
            src.as_raw_fd(),
            &mut off_in as *mut i64,
            dst.as_raw_fd(),
            &mut off_out as *mut i64,
            len,
            0u32,
        )
    };
    // `syscall` returns a `c_long`, which on Linux has the width of `ssize_t` (the word size).
    #[allow(clippy::cast_possible_truncation)]
    let copied = check_size(ret as libc::ssize_t)?;
    *src_offset += copied as u64;
    *dst_offset += copied as u64;
    Ok(copied)
}

/// Makes `dst[dst_offset..dst_offset+len]` share the blocks of `src[src_offset..src_offset+len]`
/// (a reflink). All or nothing; offsets and length must be aligned to the filesystem's block
/// size, except a range ending at the end of `src`.
pub fn clone_range(
    src: &File,
    src_offset: u64,
    dst: &File,
    dst_offset: u64,
    len: u64,
) -> io::Result<()> {
    let range = FileCloneRange {
        src_fd: i64::from(src.as_raw_fd()),
        src_offset,
        src_length: len,
        dest_offset: dst_offset,
    };
    // SAFETY: `range` is a valid file_clone_range the kernel only reads during the call; `dst`
    // and the descriptor inside `range` stay open for the borrows' lifetime.
    check(unsafe {
        libc::ioctl(
            dst.as_raw_fd(),
            FICLONERANGE as _,
            &range as *const FileCloneRange,
        )
    })?;
    Ok(())
}

fn einval() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, SeekFrom, Write};

    #[test]
    fn copies_with_explicit_offsets_and_leaves_positions_alone() {
        let mut src = tempfile::tempfile().unwrap();
        src.write_all(b"hello, world").unwrap();
        let mut dst = tempfile::tempfile().unwrap();
        dst.write_all(b"AB").unwrap();
        let (mut from, mut to) = (7u64, 2u64);
        let mut total = 0;
        loop {
            let n = copy_file_range(&src, &mut from, &dst, &mut to, 100).unwrap();
            if n == 0 {
                break;
            }
            total += n;
        }
        assert_eq!((total, from, to), (5, 12, 7));
        // The descriptors' positions were not used: `dst` is still at 2, `src` at 12 (its end).
        assert_eq!(dst.stream_position().unwrap(), 2);
        assert_eq!(src.stream_position().unwrap(), 12);
        let mut out = String::new();
        dst.seek(SeekFrom::Start(0)).unwrap();
        dst.read_to_string(&mut out).unwrap();
        assert_eq!(out, "ABworld");
    }

    #[test]
    fn clone_range_reports_unsupported_filesystems_as_errors() {
        // tmpfs and ext4 have no reflink; either way a failure is an error, never a panic.
        let src = tempfile::tempfile().unwrap();
        let dst = tempfile::tempfile().unwrap();
        match clone_range(&src, 0, &dst, 0, 4096) {
            Ok(()) => {}
            Err(err) => assert!(err.raw_os_error().is_some(), "{err}"),
        }
    }
}
