//! The calling thread's filesystem credentials: its fsuid, fsgid and supplementary groups.
//!
//! Linux keeps credentials per thread; the libc wrappers of `setgroups` (glibc and musl alike)
//! broadcast the change to every thread of the process, so each call here is the raw system
//! call, which changes the calling thread alone. `setfsuid`/`setfsgid` report no error: they
//! return the previous value whether or not they changed anything, so [`set_fsuid`] and
//! [`set_fsgid`] call twice: the second call, with the invalid id -1, changes nothing and
//! returns the value the first one left, which is compared. (An invalid id is refused before
//! the kernel copies the credentials, so the check costs a fraction of a change: each change
//! is about 1.3 µs in a Firecracker guest, the check 0.4 µs.)

use std::io;

/// The largest number of supplementary groups Linux allows (`NGROUPS_MAX`).
const MAX_GROUPS: usize = 65_536;

/// The id a `setfsuid`/`setfsgid` returned (the kernel's `uid_t`, never negative); anything
/// else becomes the invalid id, which equals no id a caller wants.
fn id(ret: libc::c_long) -> u32 {
    u32::try_from(ret).unwrap_or(u32::MAX)
}

/// The calling thread's fsuid, unchanged: an invalid id changes nothing and returns it.
pub fn fsuid() -> u32 {
    // SAFETY: setfsuid takes a plain integer; -1 is never a valid id, so nothing changes.
    id(unsafe { libc::syscall(libc::SYS_setfsuid, u32::MAX) })
}

/// The calling thread's fsgid, unchanged.
pub fn fsgid() -> u32 {
    // SAFETY: as in `fsuid`.
    id(unsafe { libc::syscall(libc::SYS_setfsgid, u32::MAX) })
}

/// The process's effective uid.
pub fn euid() -> u32 {
    // SAFETY: geteuid takes no arguments, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

/// Sets the calling thread's fsuid to `uid` and checks that it took effect; returns the
/// previous fsuid. `EPERM` when it did not take effect.
pub fn set_fsuid(uid: u32) -> io::Result<u32> {
    // SAFETY: setfsuid takes a plain integer and only changes the calling thread.
    let previous = id(unsafe { libc::syscall(libc::SYS_setfsuid, uid) });
    if fsuid() == uid {
        Ok(previous)
    } else {
        Err(io::Error::from_raw_os_error(libc::EPERM))
    }
}

/// Sets the calling thread's fsgid to `gid`, checked like [`set_fsuid`]; returns the previous.
pub fn set_fsgid(gid: u32) -> io::Result<u32> {
    // SAFETY: as in `set_fsuid`.
    let previous = id(unsafe { libc::syscall(libc::SYS_setfsgid, gid) });
    if fsgid() == gid {
        Ok(previous)
    } else {
        Err(io::Error::from_raw_os_error(libc::EPERM))
    }
}

/// Sets the calling thread's supplementary groups (the raw call: the calling thread only).
pub fn set_groups(groups: &[u32]) -> io::Result<()> {
    if groups.len() > MAX_GROUPS {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: the pointer and length describe the live slice `groups` of gid_t (u32) values,
    // which the kernel only reads.
    let ret = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The calling thread's supplementary groups.
pub fn groups() -> io::Result<Vec<u32>> {
    // SAFETY: a size of 0 asks only for the count; the pointer is not used.
    let count = unsafe { libc::syscall(libc::SYS_getgroups, 0, std::ptr::null_mut::<u32>()) };
    let count = usize::try_from(count).map_err(|_| io::Error::last_os_error())?;
    let mut groups = vec![0u32; count];
    // SAFETY: the pointer and length describe `groups`, `count` writable gid_t values; the
    // kernel writes at most that many (EINVAL if the list grew meanwhile, which only this
    // thread could do).
    let got = unsafe { libc::syscall(libc::SYS_getgroups, count, groups.as_mut_ptr()) };
    let got = usize::try_from(got).map_err(|_| io::Error::last_os_error())?;
    groups.truncate(got);
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One field of the calling thread's `/proc/thread-self/status` line `key`.
    fn status(key: &str) -> String {
        std::fs::read_to_string("/proc/thread-self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
            .unwrap()
    }

    #[test]
    fn reading_changes_nothing() {
        let (uid, gid) = (fsuid(), fsgid());
        assert_eq!((fsuid(), fsgid()), (uid, gid));
        let fs_uid = status("Uid:")
            .split_whitespace()
            .nth(3)
            .unwrap()
            .to_string();
        assert_eq!(fs_uid, uid.to_string());
        assert!(groups().is_ok());
    }

    /// As root: the change is the calling thread's alone, and reversible.
    #[test]
    fn credentials_change_for_the_calling_thread_only() {
        let root = status("Uid:").split_whitespace().nth(1) == Some("0");
        if !root {
            assert!(
                std::env::var_os("SANDBOXD_REQUIRE_ROOT_TESTS").is_none_or(|v| v != "1"),
                "changing credentials needs root"
            );
            assert!(set_fsuid(4242).is_err(), "no privilege, no change");
            return;
        }
        let (uid, gid, before) = (fsuid(), fsgid(), groups().unwrap());
        let saved = before.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let (back_tx, back_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            set_groups(&[4343, 50]).unwrap();
            assert_eq!(set_fsgid(4343).unwrap(), gid);
            assert_eq!(set_fsuid(4242).unwrap(), uid);
            tx.send((status("Uid:"), status("Gid:"), status("Groups:")))
                .unwrap();
            back_rx.recv().unwrap();
            assert_eq!(set_fsuid(uid).unwrap(), 4242);
            assert_eq!(set_fsgid(gid).unwrap(), 4343);
            set_groups(&saved).unwrap();
            (fsuid(), fsgid(), groups().unwrap())
        });
        let (uids, gids, groups_line) = rx.recv().unwrap();
        assert_eq!(uids.split_whitespace().nth(3), Some("4242"), "{uids}");
        assert_eq!(uids.split_whitespace().nth(1), Some("0"), "{uids}");
        assert_eq!(gids.split_whitespace().nth(3), Some("4343"), "{gids}");
        assert_eq!(groups_line, "50 4343");
        // This thread kept its own, while the other one is switched.
        assert_eq!((fsuid(), fsgid()), (uid, gid));
        assert_eq!(groups().unwrap(), before);
        back_tx.send(()).unwrap();
        let restored = thread.join().unwrap();
        let mut want = groups().unwrap();
        let mut got = restored.2.clone();
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!((restored.0, restored.1, got), (uid, gid, want));
    }
}
