//! The names of a file's owner and group, as `ls -l` shows them: the first passwd entry with
//! the uid, the first group entry with the gid, else the number itself (as envd does when Go's
//! `os/user` finds none).
//!
//! The group file is the one beside the passwd file (`/etc/group` for `/etc/passwd`), so a
//! daemon pointed at another passwd file (a test, a chroot) reads the matching groups. Both are
//! read once per request that needs names: users are added at run time inside sandboxes.

use std::collections::HashMap;
use std::path::Path;

/// uid and gid to names, from one read of both files.
#[derive(Debug, Default)]
pub struct Owners {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl Owners {
    /// Reads the passwd file and the group file beside it; a file that cannot be read names
    /// nobody (every id is then shown as its number).
    pub fn load(passwd_file: &Path) -> Owners {
        let read = |path: &Path| {
            std::fs::read(path)
                .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
                .unwrap_or_default()
        };
        Owners {
            users: names_by_id(&read(passwd_file)),
            groups: names_by_id(&read(&passwd_file.with_file_name("group"))),
        }
    }

    pub fn user(&self, uid: u32) -> String {
        self.users
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
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
