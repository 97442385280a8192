//! Acting as a user on the filesystem (`--fs-as-user`): the calling thread's fsuid, fsgid and
//! supplementary groups become the user's while an [`AsUser`] guard lives, and the thread's own
//! fsuid and fsgid come back when it is dropped, whatever path the call took. The groups stay
//! the last user's until another identity needs others: while the fsuid is 0 the thread holds
//! the filesystem capabilities, which no group check reaches, and whatever it starts sets its
//! own groups (`sys::spawn`), so restoring them would only cost two credential copies a call.
//!
//! This module owns the switch and its undoing; which calls run under it is the dispatch's
//! (`api`). Only filesystem permission checks change: the thread keeps its uid 0 and every
//! capability but the filesystem ones (`CAP_DAC_OVERRIDE`, `CAP_DAC_READ_SEARCH`, `CAP_FOWNER`,
//! `CAP_CHOWN`, ...), which the kernel drops from a thread whose fsuid is not 0 and gives back
//! when it is 0 again. The system calls are `sys::creds`' raw ones, which change the calling
//! thread alone (a worker switching never affects another worker).

use std::cell::RefCell;
use std::fmt;
use std::io;
use std::marker::PhantomData;

use crate::fs::owners::Owners;
use crate::fs::users::User;
use crate::log;
use crate::sys::creds;

/// Whom to act as: a user's ids and groups (the primary group first, then those of the group
/// file that list the user, as a process started as the user gets them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl Identity {
    /// `user`'s identity, its groups from the group file `owners` was read with.
    pub fn of(user: &User, owners: &Owners) -> Identity {
        Identity {
            name: user.name.clone(),
            uid: user.uid,
            gid: user.gid,
            groups: owners.groups_of(user),
        }
    }

    /// Switches the calling thread to this identity until the guard is dropped. Each step is
    /// checked; on an error, what was already switched is switched back before returning.
    pub fn enter(&self) -> Result<AsUser, SwitchError> {
        let fail = |error| SwitchError {
            name: self.name.clone(),
            error,
        };
        // The kernel's group check (`in_group_p`) is "the fsgid, or one of the groups": when
        // the thread's groups already are the user's besides the primary one (none, or the
        // same user's from a previous call on this thread), setting them changes no answer.
        THREAD_GROUPS
            .with(|known| {
                let mut known = known.borrow_mut();
                let have = match known.take() {
                    Some(have) => have,
                    None => creds::groups()?,
                };
                if same_besides(&have, &self.groups, self.gid) {
                    *known = Some(have);
                } else {
                    creds::set_groups(&self.groups)?;
                    *known = Some(self.groups.clone());
                }
                Ok(())
            })
            .map_err(fail)?;
        let mut guard = AsUser {
            saved: Saved {
                uid: None,
                gid: None,
            },
            _thread: PhantomData,
        };
        guard.saved.gid = Some(creds::set_fsgid(self.gid).map_err(fail)?);
        guard.saved.uid = Some(creds::set_fsuid(self.uid).map_err(fail)?);
        Ok(guard)
    }
}

thread_local! {
    /// The calling thread's supplementary groups as this module last set or read them (only
    /// this module changes a worker's), which saves reading them back on every switch.
    static THREAD_GROUPS: RefCell<Option<Vec<u32>>> = const { RefCell::new(None) };
}

/// The thread's ids before the switch; `None`: that one was not changed.
struct Saved {
    uid: Option<u32>,
    gid: Option<u32>,
}

/// Whether `have` and `want` hold the same ids besides `primary` (either may repeat one).
fn same_besides(have: &[u32], want: &[u32], primary: u32) -> bool {
    let covers = |a: &[u32], b: &[u32]| a.iter().all(|g| *g == primary || b.contains(g));
    covers(have, want) && covers(want, have)
}

/// While it lives, the thread's filesystem calls are checked as the user's. Not `Send`: the
/// credentials it restores are its thread's.
pub struct AsUser {
    saved: Saved,
    _thread: PhantomData<*const ()>,
}

impl Drop for AsUser {
    /// Restores fsuid first (which gives back the filesystem capabilities), then fsgid; the
    /// groups stay (module documentation). Each is read back: the kernel's `setfsuid` changes
    /// nothing, silently, when it cannot allocate the new credentials or a security module
    /// refuses, and a thread left with a user's credentials would serve the next request with
    /// them, so a failure aborts the daemon.
    fn drop(&mut self) {
        let saved = &self.saved;
        let restored = saved
            .uid
            .map_or(Ok(0), creds::set_fsuid)
            .and_then(|_| saved.gid.map_or(Ok(0), creds::set_fsgid));
        if let Err(error) = restored {
            log::line(format_args!(
                "fatal: cannot restore the daemon's own filesystem credentials: {error}"
            ));
            std::process::abort();
        }
    }
}

/// The switch could not be made (the daemon lacks `CAP_SETUID`/`CAP_SETGID`: not root).
#[derive(Debug)]
pub struct SwitchError {
    pub name: String,
    pub error: io::Error,
}

impl fmt::Display for SwitchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot act as user '{}' on the filesystem (--fs-as-user needs the daemon to run \
             as root): {}",
            self.name, self.error
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> Identity {
        Identity {
            name: "user".into(),
            uid: 4242,
            gid: 4343,
            groups: vec![4343, 50],
        }
    }

    fn is_root() -> bool {
        creds::fsuid() == 0
    }

    #[test]
    fn groups_come_from_the_group_file_beside_passwd() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("group"), "dev:x:50:user\nx:x:60:other\n").unwrap();
        let user = User {
            name: "user".into(),
            uid: 4242,
            gid: 4343,
            home: "/home/user".into(),
        };
        assert_eq!(
            Identity::of(&user, &Owners::current(&dir.path().join("passwd"))),
            identity()
        );
        // Cached, yet a change of the file counts at once; without a file, the primary group.
        assert_eq!(
            Identity::of(&user, &Owners::current(&dir.path().join("passwd"))),
            identity()
        );
        std::fs::write(dir.path().join("group"), "dev:x:50:other\n").unwrap();
        assert_eq!(
            Identity::of(&user, &Owners::current(&dir.path().join("passwd"))).groups,
            [4343]
        );
        // A different size: two writes within one clock tick can share a modification time.
        std::fs::write(dir.path().join("group"), "team:x:51:root,user\n").unwrap();
        assert_eq!(
            Identity::of(&user, &Owners::current(&dir.path().join("passwd"))).groups,
            [4343, 51]
        );
        std::fs::remove_file(dir.path().join("group")).unwrap();
        assert_eq!(
            Identity::of(&user, &Owners::current(&dir.path().join("passwd"))).groups,
            [4343]
        );
    }

    /// As root: a file only root may read is refused inside the guard and readable after it.
    #[test]
    fn the_guard_switches_and_restores() {
        if !is_root() {
            assert!(
                std::env::var_os("SANDBOXD_REQUIRE_ROOT_TESTS").is_none_or(|v| v != "1"),
                "switching credentials needs root"
            );
            let error = identity().enter().err().expect("not root: refused");
            assert!(error
                .to_string()
                .contains("needs the daemon to run as root"));
            assert_eq!(creds::fsuid(), creds::fsuid());
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"s").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let before = (creds::fsuid(), creds::fsgid(), creds::groups().unwrap());
        {
            let _guard = identity().enter().unwrap();
            assert_eq!((creds::fsuid(), creds::fsgid()), (4242, 4343));
            assert_eq!(
                creds::groups().unwrap(),
                vec![50, 4343],
                "kept sorted by the kernel"
            );
            let error = std::fs::read(&secret).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::PermissionDenied);
        }
        assert_eq!((creds::fsuid(), creds::fsgid()), (before.0, before.1));
        assert_eq!(creds::groups().unwrap(), vec![50, 4343], "the groups stay");
        assert_eq!(
            std::fs::read(&secret).unwrap(),
            b"s",
            "root's rights are back"
        );
        creds::set_groups(&before.2).unwrap();
        THREAD_GROUPS.with(|known| *known.borrow_mut() = None);
        // A user without supplementary groups, on a thread without any: only the ids change,
        // and the group check still sees the primary group (through the fsgid).
        if before.2.is_empty() {
            let solo = Identity {
                groups: vec![4343],
                ..identity()
            };
            let group_only = dir.path().join("group-only");
            std::fs::write(&group_only, b"g").unwrap();
            std::fs::set_permissions(&group_only, std::fs::Permissions::from_mode(0o040)).unwrap();
            std::os::unix::fs::chown(&group_only, Some(0), Some(4343)).unwrap();
            let _guard = solo.enter().unwrap();
            assert_eq!(creds::groups().unwrap(), Vec::<u32>::new());
            assert_eq!(std::fs::read(&group_only).unwrap(), b"g");
            assert_eq!(
                std::fs::read(&secret).unwrap_err().kind(),
                io::ErrorKind::PermissionDenied
            );
        }
    }

    /// As root: a switch inside a switch gives back the outer user's ids, then the outer guard
    /// gives back the thread's own.
    #[test]
    fn nested_switches_restore_in_order() {
        if !is_root() {
            assert!(
                std::env::var_os("SANDBOXD_REQUIRE_ROOT_TESTS").is_none_or(|v| v != "1"),
                "switching credentials needs root"
            );
            return;
        }
        std::thread::spawn(|| {
            let own = (creds::fsuid(), creds::fsgid());
            let outer = identity().enter().unwrap();
            {
                let other = Identity {
                    name: "other".into(),
                    uid: 5252,
                    gid: 5353,
                    groups: vec![5353],
                };
                let _inner = other.enter().unwrap();
                assert_eq!((creds::fsuid(), creds::fsgid()), (5252, 5353));
            }
            assert_eq!((creds::fsuid(), creds::fsgid()), (4242, 4343));
            drop(outer);
            assert_eq!((creds::fsuid(), creds::fsgid()), own);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn sets_compare_members_besides_the_primary_group() {
        assert!(same_besides(&[], &[], 7));
        assert!(same_besides(&[5, 6], &[6, 5, 5], 7));
        assert!(
            same_besides(&[], &[7], 7),
            "the fsgid covers the primary group"
        );
        assert!(
            same_besides(&[5, 7], &[5], 7),
            "the same user's set, left from a call"
        );
        assert!(!same_besides(&[5], &[5, 6], 7));
        assert!(!same_besides(&[5, 6], &[5], 7));
        assert!(
            !same_besides(&[5, 8], &[5], 7),
            "another user's primary group"
        );
    }
}
