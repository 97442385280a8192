//! `pread(2)` and `read(2)` into a buffer's unused capacity: a producer that builds a piece of
//! an answer in a `Vec` (a tar archive's members, a stream's queue of process output) reads a
//! file's bytes straight after what the piece holds, without zeroing that room first or
//! reading into a second buffer and copying.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use super::check_size;

/// Reads at most `len` bytes of `file` at `offset` and appends them to `buf` (its capacity
/// grows if needed): how many, 0 at the end of the file.
pub fn append_at(file: &File, buf: &mut Vec<u8>, len: usize, offset: u64) -> io::Result<usize> {
    let offset = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file offset too large"))?;
    buf.reserve(len);
    let room = &mut buf.spare_capacity_mut()[..len];
    // SAFETY: `room` is `len` bytes of `buf`'s allocation, writable and not aliased during the
    // call; the kernel writes at most `len` bytes there.
    let read = check_size(unsafe {
        libc::pread(file.as_raw_fd(), room.as_mut_ptr().cast(), len, offset)
    })?;
    let filled = buf.len() + read.min(len);
    // SAFETY: the kernel initialised the first `read` (at most `len`) bytes of the spare
    // capacity, so `filled` bytes from the start are initialised and within the capacity.
    unsafe { buf.set_len(filled) };
    Ok(read)
}

/// Reads at most `len` bytes from `file` (a pipe, a terminal) and appends them to `buf` (its
/// capacity grows if needed): how many, 0 at the end of file.
pub fn append(file: &File, buf: &mut Vec<u8>, len: usize) -> io::Result<usize> {
    buf.reserve(len);
    let room = &mut buf.spare_capacity_mut()[..len];
    // SAFETY: `room` is `len` bytes of `buf`'s allocation, writable and not aliased during the
    // call; the kernel writes at most `len` bytes there.
    let read = check_size(unsafe { libc::read(file.as_raw_fd(), room.as_mut_ptr().cast(), len) })?;
    let filled = buf.len() + read.min(len);
    // SAFETY: the kernel initialised the first `read` (at most `len`) bytes of the spare
    // capacity, so `filled` bytes from the start are initialised and within the capacity.
    unsafe { buf.set_len(filled) };
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn appends_what_the_file_holds_after_the_bytes_already_there() {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"0123456789").unwrap();
        let mut buf = b"head:".to_vec();
        assert_eq!(append_at(&file, &mut buf, 4, 3).unwrap(), 4);
        assert_eq!(buf, b"head:3456");
        // Less than asked near the end; nothing past it.
        assert_eq!(append_at(&file, &mut buf, 100, 8).unwrap(), 2);
        assert_eq!(buf, b"head:345689");
        assert_eq!(append_at(&file, &mut buf, 100, 10).unwrap(), 0);
        assert_eq!(buf, b"head:345689");
        assert!(append_at(&file, &mut buf, 1, u64::MAX).is_err());
    }

    #[test]
    fn appends_what_a_pipe_holds_and_nothing_once_it_ends() {
        let (read, mut write) = std::io::pipe().unwrap();
        let read = File::from(std::os::fd::OwnedFd::from(read));
        write.write_all(b"abcdef").unwrap();
        let mut buf = b"x".to_vec();
        assert_eq!(append(&read, &mut buf, 4).unwrap(), 4);
        assert_eq!(buf, b"xabcd");
        assert_eq!(append(&read, &mut buf, 100).unwrap(), 2);
        assert_eq!(buf, b"xabcdef");
        drop(write);
        assert_eq!(append(&read, &mut buf, 100).unwrap(), 0);
        assert_eq!(buf, b"xabcdef");
    }
}
