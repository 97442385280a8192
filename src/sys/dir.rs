//! Directories held open: every change sandboxd makes to a tree that other users also write goes
//! through one of these, by name relative to the descriptor (the `*at` calls), so that nothing
//! between resolving a path and acting on it can redirect the act.
//!
//! A [`Dir`] is opened once, following the symlinks of the path as the client named it; from
//! then on a name inside it is looked up by the kernel relative to that very directory, a final
//! symlink is never followed where the call could change what it points to (`O_NOFOLLOW`,
//! `AT_SYMLINK_NOFOLLOW`, `unlinkat` and `renameat`, which act on the link itself), and what
//! was created is changed through its own descriptor (`fchmod`, `fchown`). Which symlinks a
//! request means to follow is `fs`'s business; this module only makes the calls.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use super::check;
use super::listing::Listing;

mod entries;
mod held;

pub use held::Held;

/// What `stat(2)` says of an entry, the fields sandboxd uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u64,
    pub dev: u64,
    pub ino: u64,
    pub mtime: i64,
    pub mtime_nsec: i64,
}

impl Stat {
    fn of(st: &libc::stat) -> Stat {
        Stat {
            mode: st.st_mode,
            uid: st.st_uid,
            gid: st.st_gid,
            size: u64::try_from(st.st_size).unwrap_or(0),
            // `nlink_t` is `u64` on 64-bit Linux and `u32` elsewhere: a widening either way.
            #[allow(clippy::useless_conversion)]
            nlink: u64::from(st.st_nlink),
            dev: st.st_dev,
            ino: st.st_ino,
            mtime: st.st_mtime,
            mtime_nsec: st.st_mtime_nsec,
        }
    }

    pub fn kind(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    pub fn is_dir(&self) -> bool {
        self.kind() == libc::S_IFDIR
    }

    pub fn is_file(&self) -> bool {
        self.kind() == libc::S_IFREG
    }

    pub fn is_symlink(&self) -> bool {
        self.kind() == libc::S_IFLNK
    }

    /// Device and inode: the identity of a file.
    pub fn id(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }
}

/// Which times [`Dir::touch`] sets to now, and so what inotify reports of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touch {
    /// The access and modification times: an attribute change (`IN_ATTRIB`), as `utime`.
    Times,
    /// The modification time alone: a modification (`IN_MODIFY`), as a write.
    Modified,
}

/// An open directory: an `O_PATH` descriptor, which needs only the right to search the path to
/// it (not to read the directory), as the `*at` calls that use it check the rest themselves.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
}

/// `name` as a C string for an `*at` call. A name is one component: `/` and NUL are refused
/// (`EINVAL`), as are the empty name, `.` and `..`, which no client-named entry may be.
fn c_name(name: &OsStr) -> io::Result<CString> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    CString::new(bytes).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Takes ownership of the descriptor an `open`-like call returned (or its error).
fn owned(ret: libc::c_int) -> io::Result<OwnedFd> {
    let fd = check(ret)?;
    // SAFETY: `fd` was just returned by the kernel for this process and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

const DIR_FLAGS: libc::c_int = libc::O_DIRECTORY | libc::O_PATH | libc::O_CLOEXEC;

/// A directory opened to be read (its entries listed, or synced).
const READ_FLAGS: libc::c_int = libc::O_DIRECTORY | libc::O_RDONLY | libc::O_CLOEXEC;

impl Dir {
    /// Opens the directory at `path`, following symlinks anywhere in it (the path as named).
    pub fn open(path: &Path) -> io::Result<Dir> {
        let path = c_path(path)?;
        // SAFETY: `path` is a NUL-terminated CString alive for the call.
        let fd = owned(unsafe { libc::open(path.as_ptr(), DIR_FLAGS) })?;
        Ok(Dir { fd })
    }

    /// Opens the directory `name` inside this one. With `follow` false a symlink there is not
    /// followed (`ELOOP`); anything but a directory is `ENOTDIR`.
    pub fn open_dir(&self, name: &OsStr, follow: bool) -> io::Result<Dir> {
        let flags = if follow {
            DIR_FLAGS
        } else {
            DIR_FLAGS | libc::O_NOFOLLOW
        };
        Ok(Dir {
            fd: self.openat(&c_name(name)?, flags, 0)?,
        })
    }

    /// The same directory on a descriptor of its own (to hand to another thread).
    pub fn try_clone(&self) -> io::Result<Dir> {
        Ok(Dir {
            fd: self.openat(c".", DIR_FLAGS, 0)?,
        })
    }

    /// The parent of this directory (`..`), for walks that go back up without a path.
    pub fn open_parent(&self) -> io::Result<Dir> {
        Ok(Dir {
            fd: self.openat(c"..", DIR_FLAGS | libc::O_NOFOLLOW, 0)?,
        })
    }

    fn openat(&self, name: &CStr, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
        // SAFETY: `name` is a NUL-terminated string alive for the call; `self.fd` is open for
        // the borrow; the mode is passed as the variadic `mode_t` open(2) reads with O_CREAT or
        // O_TMPFILE and ignores otherwise.
        owned(unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                name.as_ptr(),
                flags,
                libc::c_uint::from(mode as libc::mode_t),
            )
        })
    }

    /// Opens the file `name` in this directory with `flags` (`O_CLOEXEC` and `O_NOFOLLOW` are
    /// added: a final symlink is never followed).
    pub fn open_file(&self, name: &OsStr, flags: libc::c_int) -> io::Result<File> {
        let fd = self.openat(
            &c_name(name)?,
            flags | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            0,
        )?;
        Ok(File::from(fd))
    }

    /// This directory itself as a read-only `File` (for `fchown`, `fchmod`, times and
    /// attributes), opened through its descriptor: no name is looked up.
    pub fn reopen(&self) -> io::Result<File> {
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
        Ok(File::from(self.openat(c".", flags, 0)?))
    }

    /// Creates the regular file `name` for reading and writing, with `mode` less the umask;
    /// `EEXIST` if anything (a symlink included) is there.
    pub fn create_file(&self, name: &OsStr, mode: u32) -> io::Result<File> {
        let flags =
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        Ok(File::from(self.openat(&c_name(name)?, flags, mode)?))
    }

    /// A new unnamed regular file in this directory (`O_TMPFILE`), read-write, `mode` less the
    /// umask, linkable later.
    pub fn create_unnamed(&self, mode: u32) -> io::Result<File> {
        let flags = libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC;
        Ok(File::from(self.openat(c".", flags, mode)?))
    }

    /// `stat` of this directory itself.
    pub fn stat(&self) -> io::Result<Stat> {
        fstat(self.fd.as_fd())
    }

    /// `stat` of `name` in this directory; with `follow` false a symlink is described itself.
    pub fn stat_at(&self, name: &OsStr, follow: bool) -> io::Result<Stat> {
        let name = c_name(name)?;
        let flags = if follow { 0 } else { libc::AT_SYMLINK_NOFOLLOW };
        // SAFETY: an all-zero `stat` is a valid value of that plain C struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `name` is NUL-terminated and `st` a writable stat, both alive for the call.
        check(unsafe { libc::fstatat(self.fd.as_raw_fd(), name.as_ptr(), &mut st, flags) })?;
        Ok(Stat::of(&st))
    }

    /// Creates the directory `name` with `mode` (less the umask).
    pub fn mkdir(&self, name: &OsStr, mode: u32) -> io::Result<()> {
        let name = c_name(name)?;
        // SAFETY: `name` is NUL-terminated and alive for the call.
        check(unsafe { libc::mkdirat(self.fd.as_raw_fd(), name.as_ptr(), mode as libc::mode_t) })?;
        Ok(())
    }

    /// Removes the entry `name` (a symlink itself, never its target); `dir` for a directory.
    pub fn remove(&self, name: &OsStr, dir: bool) -> io::Result<()> {
        let name = c_name(name)?;
        let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
        // SAFETY: `name` is NUL-terminated and alive for the call.
        check(unsafe { libc::unlinkat(self.fd.as_raw_fd(), name.as_ptr(), flags) })?;
        Ok(())
    }

    /// Renames `name` here to `to_name` in `to`, replacing what is there as rename(2) does.
    pub fn rename(&self, name: &OsStr, to: &Dir, to_name: &OsStr) -> io::Result<()> {
        let (name, to_name) = (c_name(name)?, c_name(to_name)?);
        // SAFETY: both names are NUL-terminated and alive; both descriptors are open.
        check(unsafe {
            libc::renameat(
                self.fd.as_raw_fd(),
                name.as_ptr(),
                to.fd.as_raw_fd(),
                to_name.as_ptr(),
            )
        })?;
        Ok(())
    }

    /// A hard link `to_name` in `to` of the file `name` here (a symlink is linked itself).
    pub fn link(&self, name: &OsStr, to: &Dir, to_name: &OsStr) -> io::Result<()> {
        let (name, to_name) = (c_name(name)?, c_name(to_name)?);
        // SAFETY: both names are NUL-terminated and alive; both descriptors are open; flags 0
        // does not follow a symlink at `name`.
        check(unsafe {
            libc::linkat(
                self.fd.as_raw_fd(),
                name.as_ptr(),
                to.fd.as_raw_fd(),
                to_name.as_ptr(),
                0,
            )
        })?;
        Ok(())
    }

    /// Gives the open `file` (an unnamed `O_TMPFILE` file, or any) the name `name` here;
    /// `EEXIST` if the name is taken: a link never replaces anything. Through the file's
    /// `/proc/self/fd/N` magic link with `AT_SYMLINK_FOLLOW`, which needs `/proc` but no
    /// capability (`AT_EMPTY_PATH` would need `CAP_DAC_READ_SEARCH`).
    pub fn link_file(&self, file: &File, name: &OsStr) -> io::Result<()> {
        let from = c_path(&proc_fd(file.as_raw_fd()))?;
        let name = c_name(name)?;
        // SAFETY: both strings are NUL-terminated and alive; `file` is open for the borrow, so
        // the descriptor number in `from` names it; `self.fd` is open.
        check(unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                from.as_ptr(),
                self.fd.as_raw_fd(),
                name.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        })?;
        Ok(())
    }

    /// Sets times of `name` here (not following a symlink) to now, and nothing else.
    pub fn touch(&self, name: &OsStr, what: Touch) -> io::Result<()> {
        let now = libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        };
        self.set_times_at(name, now, what)
    }

    /// `utimensat` of `name` here, not following a symlink: the modification time to `time`,
    /// and the access time too for [`Touch::Times`].
    fn set_times_at(&self, name: &OsStr, time: libc::timespec, what: Touch) -> io::Result<()> {
        let name = c_name(name)?;
        let times = both_times(time, what);
        // SAFETY: `name` is NUL-terminated and `times` an array of two timespecs, both alive
        // for the call, which only reads them.
        check(unsafe {
            libc::utimensat(
                self.fd.as_raw_fd(),
                name.as_ptr(),
                times.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })?;
        Ok(())
    }

    /// Sets this directory's permission bits and owner, through its descriptor (a `Dir` opened
    /// for reading: an `O_PATH` one cannot be changed).
    pub fn set_mode_and_owner(&self, mode: u32, uid: u32, gid: u32) -> io::Result<()> {
        // SAFETY: plain calls on a descriptor open for the borrow.
        check(unsafe { libc::fchmod(self.fd.as_raw_fd(), mode) })?;
        // SAFETY: as above.
        check(unsafe { libc::fchown(self.fd.as_raw_fd(), uid, gid) })?;
        Ok(())
    }

    /// `fsync` of the directory, so that names made in it survive a crash. It needs the
    /// directory opened for reading: a directory its user may write but not read (`--fs-as-user`
    /// in a drop box such as mode 0733) cannot be synced by that user, as by any process of
    /// theirs, and is left to the filesystem's own commit.
    pub fn sync(&self) -> io::Result<()> {
        let readable = match self.openat(c".", READ_FLAGS, 0) {
            Ok(fd) => fd,
            Err(err) if err.kind() == io::ErrorKind::PermissionDenied => return Ok(()),
            Err(err) => return Err(err),
        };
        // SAFETY: plain call on a descriptor open for the call.
        check(unsafe { libc::fsync(readable.as_raw_fd()) })?;
        Ok(())
    }

    /// The names in this directory (not `.` or `..`), in the order the filesystem gives them.
    /// Reads through a description of its own, so this `Dir` can be read again.
    pub fn names(&self) -> io::Result<Vec<OsString>> {
        let mut names = Vec::new();
        let mut listing = self.listing()?;
        while let Some((name, _)) = listing.next()? {
            names.push(OsString::from_vec(name.to_vec()));
        }
        Ok(names)
    }

    /// Whether this directory has no entry but `.` and `..`: one buffer of its listing read,
    /// however many it holds.
    pub fn is_empty(&self) -> io::Result<bool> {
        Ok(self.listing()?.next()?.is_none())
    }

    /// A listing of this directory's entries from the start, through a description of its own.
    pub fn listing(&self) -> io::Result<Listing> {
        Ok(Listing::new(self.openat(c".", READ_FLAGS, 0)?))
    }

    /// This directory itself through `/proc/self/fd` (its extended attributes: an `O_PATH`
    /// descriptor has no `fgetxattr`).
    pub fn own_proc_path(&self) -> PathBuf {
        proc_fd(self.fd.as_raw_fd())
    }

    /// A path naming `name` in this directory through `/proc/self/fd`, for the few calls with
    /// no `*at` form (extended attributes, `realpath`). It resolves from this very directory
    /// whatever its path is now, and stays short however deep the directory lies.
    pub fn proc_path(&self, name: &OsStr) -> PathBuf {
        proc_fd(self.fd.as_raw_fd()).join(name)
    }
}

/// A directory opened some other way (for reading, to change it through its descriptor).
impl From<File> for Dir {
    fn from(file: File) -> Dir {
        Dir {
            fd: OwnedFd::from(file),
        }
    }
}

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The access and modification times `utimensat` takes: the modification time `time`, and the
/// access time too for [`Touch::Times`] (else left as it is).
fn both_times(time: libc::timespec, what: Touch) -> [libc::timespec; 2] {
    let access = match what {
        Touch::Times => time,
        Touch::Modified => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    };
    [access, time]
}

/// [`both_times`] for a time in seconds and nanoseconds.
fn times((secs, nsec): (i64, u32), what: Touch) -> [libc::timespec; 2] {
    let time = libc::timespec {
        tv_sec: secs,
        tv_nsec: i64::from(nsec),
    };
    both_times(time, what)
}

fn proc_fd(fd: RawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{fd}"))
}

/// `fstat` of any open descriptor.
/// `lstat` of `path` (a symlink described itself), by path in one call.
pub fn lstat(path: &Path) -> io::Result<Stat> {
    let path = c_path(path)?;
    // SAFETY: an all-zero `stat` is a valid value of that plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `st` a writable stat, both alive for the call.
    check(unsafe {
        libc::fstatat(
            libc::AT_FDCWD,
            path.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(Stat::of(&st))
}

pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<Stat> {
    // SAFETY: an all-zero `stat` is a valid value of that plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is writable and alive for the call; `fd` is open for the borrow.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(Stat::of(&st))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn dir() -> (tempfile::TempDir, Dir) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Dir::open(tmp.path()).unwrap();
        (tmp, dir)
    }

    #[test]
    fn names_are_single_components() {
        let (_tmp, dir) = dir();
        for bad in ["", ".", "..", "a/b", "/etc", "a\0b"] {
            let err = dir.mkdir(OsStr::new(bad), 0o755).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{bad:?}");
        }
    }

    #[test]
    fn a_final_symlink_is_never_followed() {
        let (tmp, dir) = dir();
        std::fs::create_dir(tmp.path().join("real")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("real"), tmp.path().join("link")).unwrap();
        // With O_DIRECTORY the kernel says ENOTDIR of a symlink it will not follow.
        let err = dir.open_dir(OsStr::new("link"), false).unwrap_err();
        assert!(
            matches!(err.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)),
            "{err}"
        );
        assert!(dir.open_dir(OsStr::new("link"), true).is_ok());
        assert!(dir.stat_at(OsStr::new("link"), false).unwrap().is_symlink());
        assert!(dir.stat_at(OsStr::new("link"), true).unwrap().is_dir());
        let err = dir
            .open_file(OsStr::new("link"), libc::O_RDONLY)
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
        // Removing the link removes the link, never what it points to.
        dir.remove(OsStr::new("link"), false).unwrap();
        assert!(tmp.path().join("real").is_dir());
    }

    #[test]
    fn files_are_made_linked_renamed_and_listed_by_name() {
        let (tmp, dir) = dir();
        let mut file = dir.create_file(OsStr::new("a"), 0o600).unwrap();
        file.write_all(b"bytes").unwrap();
        assert!(dir.create_file(OsStr::new("a"), 0o600).is_err());
        dir.mkdir(OsStr::new("sub"), 0o700).unwrap();
        let sub = dir.open_dir(OsStr::new("sub"), false).unwrap();
        dir.link(OsStr::new("a"), &sub, OsStr::new("b")).unwrap();
        sub.rename(OsStr::new("b"), &dir, OsStr::new("c")).unwrap();
        let mut names = dir.names().unwrap();
        names.sort();
        assert_eq!(names, ["a", "c", "sub"]);
        assert_eq!(std::fs::read(tmp.path().join("c")).unwrap(), b"bytes");
        assert_eq!(
            sub.open_parent().unwrap().stat().unwrap(),
            dir.stat().unwrap()
        );
        assert!(dir.names().unwrap().len() == 3, "a Dir can be listed again");
        assert!(!dir.is_empty().unwrap());
        assert!(sub.is_empty().unwrap(), "b was renamed away");
    }

    #[test]
    fn an_unnamed_file_is_invisible_until_linked() {
        let (tmp, dir) = dir();
        let mut file = match dir.create_unnamed(0o600) {
            Ok(file) => file,
            Err(err) => {
                eprintln!("skipped: no O_TMPFILE on the test directory's filesystem: {err}");
                return;
            }
        };
        file.write_all(b"x").unwrap();
        assert!(dir.names().unwrap().is_empty());
        dir.link_file(&file, OsStr::new("named")).unwrap();
        let err = dir.link_file(&file, OsStr::new("named")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EEXIST));
        assert_eq!(std::fs::read(tmp.path().join("named")).unwrap(), b"x");
        assert!(std::fs::metadata(dir.proc_path(OsStr::new("named"))).is_ok());
    }
}
