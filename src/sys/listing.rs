//! A directory's entries read a buffer at a time with `getdents64`, in the order the filesystem
//! gives them, from a description of their own: a listing can stop anywhere, be dropped, and a
//! new one go on from where it was.
//!
//! Each record of `struct linux_dirent64`: inode (8 bytes), the offset of the next record (8),
//! the record's length (2), type (1), the name and its NUL, padding. The offset is the
//! filesystem's cookie for "after this entry" (a hash on ext4, an index elsewhere), stable across
//! open descriptions (NFS hands such cookies to its clients): `lseek` to it goes on there.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// The buffer a listing reads entries into: about 120 entries of 255-byte names (musl's
/// `readdir` reads 2 KiB a call: eight entries of long names).
pub const LISTING_BUFFER: usize = 32 * 1024;
/// Where a record's name begins (`d_name`).
const NAME_AT: usize = 19;

/// One pass over a directory's entries (`.` and `..` left out).
pub struct Listing {
    fd: OwnedFd,
    buf: Vec<u8>,
    /// The next record in `buf[..filled]`.
    at: usize,
    filled: usize,
    /// The cookie after the last entry handed out (0: before the first).
    after: i64,
}

impl Listing {
    /// A listing from the start of the directory open for reading as `fd` (its own open file
    /// description: its position is the listing's).
    pub fn new(fd: OwnedFd) -> Listing {
        Listing {
            fd,
            buf: Vec::new(),
            at: 0,
            filled: 0,
            after: 0,
        }
    }

    /// The next entry's name and type as the directory says (`DT_REG`, `DT_DIR`, ...;
    /// `DT_UNKNOWN` where the filesystem does not keep it), `None` at the end.
    pub fn next(&mut self) -> io::Result<Option<(&[u8], u8)>> {
        self.next_kept(|_| true)
    }

    /// [`Listing::next`], passing over the names `keep` says no to.
    pub fn next_kept(&mut self, keep: impl Fn(&[u8]) -> bool) -> io::Result<Option<(&[u8], u8)>> {
        let (start, end) = loop {
            if self.at >= self.filled && !self.read()? {
                return Ok(None);
            }
            let records = &self.buf[self.at..self.filled];
            if records.len() < NAME_AT {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            let len = usize::from(u16::from_ne_bytes([records[16], records[17]]));
            if len < NAME_AT || len > records.len() {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            let mut cookie = [0u8; 8];
            cookie.copy_from_slice(&records[8..16]);
            let name = &records[NAME_AT..len];
            let name_len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
            let wanted = !matches!(&name[..name_len], b"." | b"..") && keep(&name[..name_len]);
            let start = self.at;
            self.at += len;
            self.after = i64::from_ne_bytes(cookie);
            if wanted {
                break (start, start + NAME_AT + name_len);
            }
        };
        Ok(Some((
            &self.buf[start + NAME_AT..end],
            self.buf[start + 18],
        )))
    }

    /// The cookie after the last entry handed out: [`Listing::resumed_after`] of a new listing
    /// of the same directory goes on from there.
    pub fn after(&self) -> i64 {
        self.after
    }

    /// This listing (new, of a directory whose earlier listing stopped at `cookie`), going on
    /// after that entry.
    pub fn resumed_after(self, cookie: i64) -> io::Result<Listing> {
        // SAFETY: plain call on a descriptor this listing owns.
        if unsafe { libc::lseek(self.fd.as_raw_fd(), cookie, libc::SEEK_SET) } == -1 {
            return Err(io::Error::last_os_error());
        }
        Ok(Listing {
            after: cookie,
            ..self
        })
    }

    /// Reads the next records into the buffer: false at the end of the directory.
    fn read(&mut self) -> io::Result<bool> {
        if self.buf.len() < LISTING_BUFFER {
            self.buf.resize(LISTING_BUFFER, 0);
        }
        // SAFETY: `self.fd` is an open directory descriptor; `self.buf` is a live, writable
        // buffer of `self.buf.len()` bytes, of which the kernel writes at most that many.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                self.fd.as_raw_fd(),
                self.buf.as_mut_ptr(),
                self.buf.len(),
            )
        };
        // Negative (-1): the call failed and errno says why.
        let filled = usize::try_from(ret).map_err(|_| io::Error::last_os_error())?;
        self.at = 0;
        self.filled = filled.min(self.buf.len());
        Ok(filled > 0)
    }
}
