//! The names of a file's owner and group, as `ls -l` shows them: the first passwd entry with
//! the uid, the first group entry with the gid, else the number itself (as envd does when Go's
//! `os/user` finds none). One parse also gives each user's supplementary groups
//! ([`Owners::groups_of`]), so a request that acts as its user (`--fs-as-user`) or starts a
//! process reads the files no more than one that only names owners.
//!
//! The group file is the one beside the passwd file (`/etc/group` for `/etc/passwd`), so a
//! daemon pointed at another passwd file (a test, a chroot) reads the matching groups. Users are
//! added at run time inside sandboxes, so each request looks at both files again, but only with
//! a `stat`: they are read and parsed anew when their identity, size or modification time
//! changed, and the last parse is shared otherwise.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::fs::users::{self, User};
use crate::fs::versions::{version, Version};

/// uid and gid to names, from one read of both files.
#[derive(Debug, Default)]
pub struct Owners {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
    /// Member name to the groups listing it (`users::memberships`).
    members: HashMap<String, Vec<u32>>,
    /// The passwd file they were read from (a watcher carried across a live upgrade names it).
    source: PathBuf,
}

/// The last parse, and the files and versions it came from.
type Cached = (PathBuf, Version, Version, Arc<Owners>);

static CACHE: Mutex<Option<Cached>> = Mutex::new(None);

impl Owners {
    /// The names from the passwd file and the group file beside it, parsed again only when
    /// either changed; a file that cannot be read names nobody (every id is then shown as its
    /// number).
    // Called from several handlers: one copy in the binary, not one inlined into each.
    #[inline(never)]
    pub fn current(passwd_file: &Path) -> Arc<Owners> {
        let group_file = passwd_file.with_file_name("group");
        let (passwd, group) = (version(passwd_file), version(&group_file));
        let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((path, p, g, owners)) = cache.as_ref() {
            if path == passwd_file && *p == passwd && *g == group && passwd.is_some() {
                return Arc::clone(owners);
            }
        }
        let owners = Arc::new(Owners::load(passwd_file));
        *cache = Some((
            passwd_file.to_path_buf(),
            passwd,
            group,
            Arc::clone(&owners),
        ));
        owners
    }

    /// Reads the passwd file and the group file beside it; a file that cannot be read names
    /// nobody (every id is then shown as its number).
    pub fn load(passwd_file: &Path) -> Owners {
        let read = |path: &Path| {
            std::fs::read(path)
                .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
                .unwrap_or_default()
        };
        let group = read(&passwd_file.with_file_name("group"));
        Owners {
            users: names_by_id(&read(passwd_file)),
            groups: names_by_id(&group),
            members: users::memberships(&group),
            source: passwd_file.to_path_buf(),
        }
    }

    /// `user`'s groups: the primary one, then those the group file lists the user in.
    pub fn groups_of(&self, user: &User) -> Vec<u32> {
        users::groups_of(user, &self.members)
    }

    /// The passwd file they were read from (empty for none).
    pub fn source(&self) -> &Path {
        &self.source
    }

    pub fn user(&self, uid: u32) -> String {
        self.users
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }

    /// The name of `uid`, if the passwd file has one (a tar header's `uname`).
    pub fn user_name(&self, uid: u32) -> Option<&str> {
        self.users.get(&uid).map(String::as_str)
    }

    /// The name of `gid`, if the group file has one.
    pub fn group_name(&self, gid: u32) -> Option<&str> {
        self.groups.get(&gid).map(String::as_str)
    }

    pub fn group(&self, gid: u32) -> String {
        self.groups
            .get(&gid)
            .cloned()
            .unwrap_or_else(|| gid.to_string())
    }
}

/// Pure: name by id (the third field) from passwd- or group-format text; the first entry of an
/// id wins; blank, comment and malformed lines are skipped.
pub fn names_by_id(text: &str) -> HashMap<u32, String> {
    let mut names = HashMap::new();
    for line in text.lines().filter(|line| !line.starts_with('#')) {
        let mut fields = line.split(':');
        let (Some(name), Some(_), Some(id)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        if let (false, Ok(id)) = (name.is_empty(), id.parse::<u32>()) {
            names.entry(id).or_insert_with(|| name.to_string());
        }
    }
    names
}

/// The groups of `user` (SPEC §9b), from the `group` file beside the passwd file
/// (`/etc/group` for `/etc/passwd`); without one, only the primary group. The files are parsed
/// again only when their version changed ([`Owners::current`]), so a user added to or removed
/// from a group counts at once.
pub fn groups(passwd_file: &Path, user: &User) -> Vec<u32> {
    Owners::current(passwd_file).groups_of(user)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_by_id_from_passwd_and_group_text() {
        let passwd =
            "root:x:0:0:root:/root:/bin/bash\n# c:x:5:5\n\nuser:x:1000:1000::/home/user:\n\
                      alias:x:1000:1000::/:\nbroken\n:x:7:7\nnum:x:abc:1\n";
        let names = names_by_id(passwd);
        assert_eq!(names.get(&0).map(String::as_str), Some("root"));
        assert_eq!(names.get(&1000).map(String::as_str), Some("user"));
        assert_eq!(names.len(), 2);
        let groups = names_by_id("wheel:x:10:root,user\nstaff:*:50:\n");
        assert_eq!(groups.get(&10).map(String::as_str), Some("wheel"));
        assert_eq!(groups.get(&50).map(String::as_str), Some("staff"));
    }

    #[test]
    fn unknown_ids_are_shown_as_numbers() {
        let owners = Owners::load(Path::new("/nonexistent/passwd"));
        assert_eq!(
            (owners.user(42), owners.group(7)),
            ("42".into(), "7".into())
        );
    }
}
