//! Entries changed by name in a held directory, beyond creating and removing them: symbolic
//! links made and read, a rename that never replaces, and the whole filesystem synced (what
//! unpacking an archive needs, `fs::unpack`). A link's owner and times are set through a
//! descriptor of its own (`held`), never by its name.
//! The same rules as the parent module's: one-component names, never a final symlink followed.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::AsRawFd;

use super::{c_name, check, Dir, READ_FLAGS};

impl Dir {
    /// The target of the symlink `name` here (`readlinkat`), as bytes; `EINVAL` if it is
    /// not a symlink.
    pub fn read_link(&self, name: &OsStr) -> io::Result<Vec<u8>> {
        let name = c_name(name)?;
        let mut buf = vec![0u8; 256];
        loop {
            // SAFETY: `name` is NUL-terminated and alive; `buf` is a live, writable buffer of
            // `buf.len()` bytes, of which the kernel writes at most that many.
            let len = crate::sys::check_size(unsafe {
                libc::readlinkat(
                    self.fd.as_raw_fd(),
                    name.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            })?;
            // A target that filled the buffer may have been cut: ask again with more room
            // (a target is at most PATH_MAX bytes, so this ends).
            if len < buf.len() {
                buf.truncate(len);
                return Ok(buf);
            }
            if buf.len() > libc::PATH_MAX as usize {
                return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
            }
            buf.resize(buf.len() * 4, 0);
        }
    }

    /// Creates the symlink `name` here pointing to `target` (never following anything);
    /// `EEXIST` if the name is taken.
    pub fn symlink(&self, target: &[u8], name: &OsStr) -> io::Result<()> {
        let name = c_name(name)?;
        let target =
            CString::new(target).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: both strings are NUL-terminated and alive for the call; `self.fd` is open.
        check(unsafe { libc::symlinkat(target.as_ptr(), self.fd.as_raw_fd(), name.as_ptr()) })?;
        Ok(())
    }

    /// Renames `name` here to `to_name` in `to` only if `to_name` is free (`EEXIST` if not):
    /// `renameat2` with `RENAME_NOREPLACE`.
    pub fn rename_new(&self, name: &OsStr, to: &Dir, to_name: &OsStr) -> io::Result<()> {
        let (name, to_name) = (c_name(name)?, c_name(to_name)?);
        // The raw system call: the musl this builds with has no `renameat2` wrapper.
        // SAFETY: both names are NUL-terminated and alive; both descriptors are open; the
        // arguments are those renameat2(2) takes, in its order.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                self.fd.as_raw_fd(),
                name.as_ptr(),
                to.fd.as_raw_fd(),
                to_name.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if ret == -1 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// `syncfs`: every change to the filesystem this directory is on made durable, in one call
    /// (an archive's thousands of files cost one journal commit, not one `fsync` each).
    pub fn sync_filesystem(&self) -> io::Result<()> {
        let readable = self.openat(c".", READ_FLAGS, 0)?;
        // SAFETY: plain call on a descriptor open for the call.
        check(unsafe { libc::syncfs(readable.as_raw_fd()) })?;
        Ok(())
    }
}
