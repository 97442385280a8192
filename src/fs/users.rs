//! Users (SPEC §4): looking a name up in the passwd file for its uid, primary gid and home, and
//! in the group file beside it for the groups a process started as the user joins.
//!
//! This module owns the passwd and group formats and the error for an unknown user. It reads
//! the files on every lookup, because sandboxes add users at runtime, and never calls into
//! libc's NSS.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::fs::error::FsError;
use crate::fs::versions::{cached_text, TextCache};

/// A passwd entry: what sandboxd needs to resolve paths and own files for a user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

/// Pure: finds `name` in passwd-format text (name:pw:uid:gid:gecos:home:shell). Skips blank, comment, malformed lines.
///
/// The first matching entry wins. A line needs at least the six fields up to the home (the shell
/// may be missing, as Go's `os/user` allows), and numeric uid and gid. An empty home is `/`, as
/// `login(1)` does.
pub fn parse_passwd(text: &str, name: &str) -> Option<User> {
    if name.is_empty() {
        return None;
    }
    text.lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
        .find_map(|line| {
            let fields: Vec<&str> = line.splitn(7, ':').collect();
            if fields.len() < 6 || fields[0] != name {
                return None;
            }
            let uid = fields[2].parse::<u32>().ok()?;
            let gid = fields[3].parse::<u32>().ok()?;
            let home = match fields[5] {
                "" => PathBuf::from("/"),
                home => PathBuf::from(home),
            };
            Some(User {
                name: name.to_string(),
                uid,
                gid,
                home,
            })
        })
}

/// Reads the passwd file each call (users are added at runtime inside sandboxes).
/// Unknown user → [`FsError::UnknownUser`]; unreadable file → an OS error naming the file.
pub fn lookup(passwd_file: &Path, name: &str) -> Result<User, FsError> {
    let text = passwd_text(passwd_file).map_err(|err| {
        FsError::io(
            err,
            format!("reading passwd file '{}'", passwd_file.display()),
        )
    })?;
    parse_passwd(&text, name).ok_or_else(|| FsError::UnknownUser(name.to_string()))
}

/// The passwd file's text, read again only when its version changes (a `stat` per call
/// instead of an open and reads: the file is read for every request that names a user).
fn passwd_text(passwd_file: &Path) -> std::io::Result<Arc<str>> {
    static CACHE: TextCache = Mutex::new(None);
    cached_text(&CACHE, passwd_file)
}

/// Pure: the groups each member belongs to, from group-format text (name:pw:gid:member,...):
/// member name to gids in the file's order, each once. Malformed lines are skipped.
pub fn memberships(text: &str) -> HashMap<String, Vec<u32>> {
    let mut members: HashMap<String, Vec<u32>> = HashMap::new();
    for line in text.lines() {
        let mut fields = line.trim_end_matches('\r').splitn(4, ':');
        let (Some(_), Some(_), Some(gid), Some(list)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let Ok(gid) = gid.parse::<u32>() else {
            continue;
        };
        for member in list.split(',').map(str::trim).filter(|m| !m.is_empty()) {
            let gids = members.entry(member.to_string()).or_default();
            if !gids.contains(&gid) {
                gids.push(gid);
            }
        }
    }
    members
}

/// Pure: `user`'s groups given the group file's [`memberships`]: the primary gid first, then
/// every group listing the user, each once, as `initgroups(3)` gathers them.
pub fn groups_of(user: &User, memberships: &HashMap<String, Vec<u32>>) -> Vec<u32> {
    let mut groups = vec![user.gid];
    let listed = memberships.get(&user.name).map_or(&[][..], Vec::as_slice);
    groups.extend(listed.iter().filter(|gid| **gid != user.gid));
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_the_primary_one_then_those_listing_the_user() {
        let user = user("user", 1000, 1000, "/home/user");
        let text = "root:x:0:\nsudo:x:27:admin,user\nuser:x:1000:\ndocker:x:999:user\r\n\
                    other:x:5:username\nbad:x:abc:user\nshort:x:7\nagain:x:27:user\n";
        assert_eq!(groups_of(&user, &memberships(text)), vec![1000, 27, 999]);
        assert_eq!(groups_of(&user, &memberships("")), vec![1000]);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("group"), "dev:x:50:user\n").unwrap();
        assert_eq!(
            crate::fs::owners::groups(&dir.path().join("passwd"), &user),
            vec![1000, 50]
        );
        assert_eq!(
            crate::fs::owners::groups(Path::new("/nonexistent/passwd"), &user),
            vec![1000]
        );
    }

    const PASSWD: &str = "\
root:x:0:0:root:/root:/bin/bash
# a comment:x:1:1::/comment:/bin/sh

daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
broken:x:1000
baduid:x:abc:100::/home/baduid:/bin/sh
negative:x:-1:100::/home/negative:/bin/sh
user:x:1000:1000:Sandbox User,,,:/home/user:/bin/bash
user:x:2000:2000::/home/second:/bin/bash
noshell:x:1001:1002::/home/noshell
nohome:x:1003:1004:::/bin/sh
crlf:x:1005:1006::/home/crlf:/bin/sh\r
";

    fn user(name: &str, uid: u32, gid: u32, home: &str) -> User {
        User {
            name: name.to_string(),
            uid,
            gid,
            home: PathBuf::from(home),
        }
    }

    #[test]
    fn finds_entries() {
        assert_eq!(
            parse_passwd(PASSWD, "root"),
            Some(user("root", 0, 0, "/root"))
        );
        assert_eq!(
            parse_passwd(PASSWD, "daemon"),
            Some(user("daemon", 1, 1, "/usr/sbin"))
        );
        assert_eq!(
            parse_passwd(PASSWD, "crlf"),
            Some(user("crlf", 1005, 1006, "/home/crlf"))
        );
    }

    #[test]
    fn first_entry_wins() {
        assert_eq!(
            parse_passwd(PASSWD, "user"),
            Some(user("user", 1000, 1000, "/home/user"))
        );
    }

    #[test]
    fn shell_may_be_missing_and_empty_home_is_root() {
        assert_eq!(
            parse_passwd(PASSWD, "noshell"),
            Some(user("noshell", 1001, 1002, "/home/noshell"))
        );
        assert_eq!(
            parse_passwd(PASSWD, "nohome"),
            Some(user("nohome", 1003, 1004, "/"))
        );
    }

    #[test]
    fn skips_comments_blank_and_malformed_lines() {
        assert_eq!(parse_passwd(PASSWD, "# a comment"), None);
        assert_eq!(parse_passwd(PASSWD, "broken"), None);
        assert_eq!(parse_passwd(PASSWD, "baduid"), None);
        assert_eq!(parse_passwd(PASSWD, "negative"), None);
        assert_eq!(parse_passwd(PASSWD, ""), None);
        assert_eq!(parse_passwd(PASSWD, "nobody"), None);
        assert_eq!(parse_passwd(PASSWD, "use"), None);
        assert_eq!(parse_passwd("", "root"), None);
    }

    fn temp_file(contents: &[u8]) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), contents).unwrap();
        file
    }

    #[test]
    fn lookup_reads_the_file_each_call() {
        let file = temp_file(b"root:x:0:0::/root:/bin/sh\n");
        let path = file.path();
        let before = lookup(path, "late");
        std::fs::write(
            path,
            b"root:x:0:0::/root:/bin/sh\nlate:x:7:8::/home/late:/bin/sh\n",
        )
        .unwrap();
        let after = lookup(path, "late");
        assert!(
            matches!(&before, Err(FsError::UnknownUser(name)) if name == "late"),
            "{before:?}"
        );
        assert_eq!(after.ok(), Some(user("late", 7, 8, "/home/late")));
    }

    #[test]
    fn lookup_survives_non_utf8_bytes() {
        let file = temp_file(
            b"j\xf6rg:x:5:5:J\xf6rg:/home/jorg:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n",
        );
        let result = lookup(file.path(), "user");
        assert_eq!(result.ok(), Some(user("user", 1000, 1000, "/home/user")));
    }

    #[test]
    fn unreadable_file_is_an_os_error_naming_file_and_error() {
        let path = Path::new("/nonexistent-sandboxd-dir/passwd");
        let err = lookup(path, "root").unwrap_err();
        assert!(matches!(err, FsError::Io { .. }), "{err:?}");
        let message = err.to_string();
        assert!(
            message.starts_with("error reading passwd file '/nonexistent-sandboxd-dir/passwd': "),
            "{message}"
        );
        assert!(message.contains("No such file or directory"), "{message}");
    }
}
