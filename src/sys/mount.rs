//! Mounts acted on through descriptors: a mount cloned from where a helper made it and attached
//! onto a directory held open (`open_tree(2)`, `move_mount(2)`), a mount taken off by the
//! descriptor of its root (`umount2(2)` on `/proc/self/fd/N`), and the identity of a mount's
//! root read without asking a network filesystem's server (`statx(2)` with
//! `AT_STATX_DONT_SYNC`). All need `CAP_SYS_ADMIN` but [`identity`].

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use super::check;
use super::dir::Dir;

/// `linux/mount.h`: clone the mount instead of opening it; the clone is detached until
/// attached with `move_mount`.
const OPEN_TREE_CLONE: libc::c_uint = 1;
const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
/// `linux/mount.h`: `move_mount`'s source and target are the descriptors themselves.
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x04;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;

/// How [`unmount`] takes a mount off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unmount {
    /// `MNT_FORCE`: a network filesystem's pending requests are aborted; fails while busy.
    Force,
    /// `MNT_DETACH`: off the tree now, freed once no longer busy.
    Lazy,
}

/// A copy of the mount whose root is `name` in `dir` (looked up without following a final
/// symlink), not attached anywhere: the descriptor of its root.
pub fn clone_mount(dir: &Dir, name: &OsStr) -> io::Result<OwnedFd> {
    let name = CString::new(name.as_bytes()).map_err(|_| invalid())?;
    let flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | libc::AT_SYMLINK_NOFOLLOW as libc::c_uint;
    // SAFETY: `name` is a NUL-terminated string alive for the call; `dir`'s descriptor is open
    // for the borrow; open_tree takes (int dfd, const char *path, unsigned flags).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            dir.as_fd().as_raw_fd(),
            name.as_ptr(),
            flags,
        )
    };
    let fd = libc::c_int::try_from(ret).map_err(|_| invalid())?;
    let fd = check(fd)?;
    // SAFETY: `fd` was just returned by the kernel for this process and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Attaches the detached mount `tree` (from [`clone_mount`]) onto the directory `onto` itself,
/// on top of whatever is mounted there: the directory held, whatever its path is now.
pub fn attach(tree: BorrowedFd<'_>, onto: &Dir) -> io::Result<()> {
    let flags = MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH;
    // SAFETY: both descriptors are open for the borrows, the two paths are the empty C string
    // (a static), and move_mount takes (int, const char *, int, const char *, unsigned).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            onto.as_fd().as_raw_fd(),
            c"".as_ptr(),
            flags,
        )
    };
    check(libc::c_int::try_from(ret).map_err(|_| invalid())?).map(drop)
}

/// Takes off the mount whose root `root` is (opened by a lookup, which ends on the topmost
/// mount there), through `/proc/self/fd`: the mount held, wherever it is now. A directory that
/// is not a mount's root is `EINVAL`.
pub fn unmount(root: &Dir, how: Unmount) -> io::Result<()> {
    let path =
        CString::new(root.own_proc_path().into_os_string().into_vec()).map_err(|_| invalid())?;
    let flags = match how {
        Unmount::Force => libc::MNT_FORCE,
        Unmount::Lazy => libc::MNT_DETACH,
    };
    // SAFETY: `path` is a NUL-terminated string alive for the call.
    check(unsafe { libc::umount2(path.as_ptr(), flags) }).map(drop)
}

/// Device and inode of the open file `fd`, as the kernel has them cached: no request reaches an
/// NFS server (whose mount may be stale after a resume).
pub fn identity(fd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    // SAFETY: an all-zero `statx` is a valid value of that plain C struct.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    let flags = libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC;
    // SAFETY: `fd` is open for the borrow, the path is the empty C string (a static) and `st`
    // is writable and alive for the call.
    check(unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            flags,
            libc::STATX_INO,
            &mut st,
        )
    })?;
    let dev = libc::makedev(st.stx_dev_major, st.stx_dev_minor);
    Ok((dev, st.stx_ino))
}

fn invalid() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}
