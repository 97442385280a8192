//! An entry held by its own descriptor (`O_PATH | O_NOFOLLOW`): whatever was at a name when it
//! was opened, a symbolic link included, described and changed from then on through the
//! descriptor (`AT_EMPTY_PATH`), never by the name again. What a user who can write the
//! directory does to the name afterwards (a rename, a hard link swapped in) changes nothing of
//! what the calls reach; the caller checks, on the descriptor, that it holds what it made.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use super::{c_name, check, fstat, times, Dir, Stat, Touch};

/// An entry held by an `O_PATH` descriptor of its own.
pub struct Held {
    fd: OwnedFd,
}

impl Dir {
    /// Holds whatever `name` here is, never following a symlink there (the link itself is held).
    pub fn hold(&self, name: &OsStr) -> io::Result<Held> {
        let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        Ok(Held {
            fd: self.openat(&c_name(name)?, flags, 0)?,
        })
    }
}

impl Held {
    /// `fstat` of the entry held (a symlink described itself).
    pub fn stat(&self) -> io::Result<Stat> {
        fstat(self.fd.as_fd())
    }

    /// The target of the symlink held (`readlinkat` with an empty name); `ENOENT` or `EINVAL`
    /// when it is not one.
    pub fn read_link(&self) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
        // SAFETY: the name is an empty NUL-terminated string; `buf` is a live, writable buffer
        // of `buf.len()` bytes, of which the kernel writes at most that many.
        let len = crate::sys::check_size(unsafe {
            libc::readlinkat(
                self.fd.as_raw_fd(),
                c"".as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        })?;
        buf.truncate(len);
        Ok(buf)
    }

    /// Sets the owner of the entry held (`fchownat` with `AT_EMPTY_PATH`: a symlink itself).
    pub fn chown(&self, uid: u32, gid: u32) -> io::Result<()> {
        // SAFETY: the name is an empty NUL-terminated string; `self.fd` is open.
        check(unsafe {
            libc::fchownat(
                self.fd.as_raw_fd(),
                c"".as_ptr(),
                uid,
                gid,
                libc::AT_EMPTY_PATH,
            )
        })?;
        Ok(())
    }

    /// Sets the times of the entry held to `mtime` (seconds, nanoseconds), as
    /// [`Dir::set_mtime_at`] does by name (`utimensat` with `AT_EMPTY_PATH`, which acts on a
    /// symlink itself; Linux 5.8 and later).
    pub fn set_mtime(&self, mtime: (i64, u32), what: Touch) -> io::Result<()> {
        let times = times(mtime, what);
        // SAFETY: the name is an empty NUL-terminated string and `times` an array of two
        // timespecs, both alive for the call, which only reads them; `self.fd` is open.
        check(unsafe {
            libc::utimensat(
                self.fd.as_raw_fd(),
                c"".as_ptr(),
                times.as_ptr(),
                libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            )
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_held_symlink_is_changed_itself_whatever_its_name_becomes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Dir::open(tmp.path()).unwrap();
        std::fs::write(tmp.path().join("target"), b"t").unwrap();
        dir.symlink(b"target", OsStr::new("l")).unwrap();
        let held = dir.hold(OsStr::new("l")).unwrap();
        // The name is taken away and given to another file: the held link is still reached.
        std::fs::rename(tmp.path().join("l"), tmp.path().join("moved")).unwrap();
        std::fs::write(tmp.path().join("l"), b"other").unwrap();
        assert!(held.stat().unwrap().is_symlink());
        assert_eq!(held.read_link().unwrap(), b"target");
        held.set_mtime((1_000_000, 5), Touch::Times).unwrap();
        let link = std::fs::symlink_metadata(tmp.path().join("moved")).unwrap();
        assert_eq!((link.mtime(), link.mtime_nsec()), (1_000_000, 5));
        for untouched in ["target", "l"] {
            let meta = std::fs::metadata(tmp.path().join(untouched)).unwrap();
            assert_ne!(meta.mtime(), 1_000_000, "{untouched}");
        }
        let (uid, gid) = (link.uid(), link.gid());
        held.chown(uid, gid).unwrap();
        // A regular file held is described as one: no link target.
        let file = dir.hold(OsStr::new("l")).unwrap();
        assert!(file.stat().unwrap().is_file());
        assert!(file.read_link().is_err());
    }
}
