//! Path resolution (SPEC §4): turning a client's `path` into the absolute path sandboxd acts on.
//!
//! This module owns the rules for `~`, relative paths, the empty path and the length and NUL
//! limits, and the lexical normalisation (Go's `filepath.Clean`). It never touches the disk, so
//! it neither follows nor checks symlinks; the handlers do that when they open the result.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::fs::error::FsError;
use crate::fs::users::User;
use crate::fs::MAX_PATH_BYTES;

/// Whether a client's path for a file to write names a directory by its form: it ends with `/`
/// (`dir/`, `~/`). Resolution drops the slash (Go's `filepath.Clean`), so a write checks this
/// on the raw path: `PUT ?path=dir/` must not make a file named `dir` (SPEC §4).
pub fn ends_as_directory(raw: &str) -> bool {
    raw.ends_with('/')
}

/// SPEC §4 resolution. Lexical only (never touches the disk).
///
/// The result is always absolute and normalised: a relative home or default workdir is taken
/// from `/`.
pub fn resolve(raw: &str, user: &User, default_workdir: Option<&Path>) -> Result<PathBuf, FsError> {
    if raw.as_bytes().contains(&0) {
        return Err(FsError::PathHasNul);
    }
    if raw.len() > MAX_PATH_BYTES {
        return Err(FsError::PathTooLong);
    }
    let home = user.home.as_path();
    let joined = if raw.is_empty() {
        join(default_workdir.unwrap_or(home), "")
    } else if raw == "~" {
        join(home, "")
    } else if let Some(rest) = raw.strip_prefix("~/") {
        join(home, rest)
    } else if raw.starts_with('~') {
        return Err(FsError::OtherUsersHome(raw.to_string()));
    } else if raw.starts_with('/') {
        join(Path::new("/"), raw)
    } else {
        join(home, raw)
    };
    Ok(clean(&joined))
}

/// `base` + `/` + `rest` as text, so that a `rest` beginning with `/` (`~//x`) stays under `base`
/// rather than replacing it as `Path::join` would. `/` is put in front so the result is absolute.
fn join(base: &Path, rest: &str) -> PathBuf {
    let mut joined = OsString::from("/");
    joined.push(base.as_os_str());
    joined.push("/");
    joined.push(rest);
    PathBuf::from(joined)
}

/// Lexical normalisation of an absolute path, like Go's `filepath.Clean`: repeated slashes
/// collapse, `.` is dropped, `..` removes the previous component (and stays at `/` at the root),
/// and there is no trailing slash except for `/` itself.
fn clean(path: &Path) -> PathBuf {
    let mut parts: Vec<&[u8]> = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => parts.push(part.as_bytes()),
            Component::ParentDir => {
                parts.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    if parts.is_empty() {
        return PathBuf::from("/");
    }
    let mut out = OsString::new();
    for part in parts {
        out.push("/");
        out.push(std::ffi::OsStr::from_bytes(part));
    }
    PathBuf::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> User {
        User {
            name: "user".to_string(),
            uid: 1000,
            gid: 1000,
            home: PathBuf::from("/home/user"),
        }
    }

    fn ok(raw: &str) -> PathBuf {
        resolve(raw, &user(), None).unwrap()
    }

    fn check(raw: &str, expected: &str) {
        assert_eq!(ok(raw), PathBuf::from(expected), "{raw:?}");
    }

    #[test]
    fn empty_path_is_the_default_workdir_else_the_home() {
        check("", "/home/user");
        let workdir = Path::new("/srv/work/");
        assert_eq!(
            resolve("", &user(), Some(workdir)).unwrap(),
            PathBuf::from("/srv/work")
        );
    }

    #[test]
    fn default_workdir_only_applies_to_the_empty_path() {
        let workdir = Some(Path::new("/srv/work"));
        assert_eq!(
            resolve("a.txt", &user(), workdir).unwrap(),
            PathBuf::from("/home/user/a.txt")
        );
        assert_eq!(
            resolve("~", &user(), workdir).unwrap(),
            PathBuf::from("/home/user")
        );
    }

    #[test]
    fn tilde_is_the_home() {
        check("~", "/home/user");
        check("~/", "/home/user");
        check("~/x", "/home/user/x");
        check("~/a/b/", "/home/user/a/b");
        check("~//x", "/home/user/x");
        check("~/../other", "/home/other");
    }

    #[test]
    fn other_users_homes_are_refused() {
        for raw in ["~other", "~other/x", "~root/.ssh/id_rsa", "~."] {
            assert!(
                matches!(resolve(raw, &user(), None), Err(FsError::OtherUsersHome(r)) if r == raw),
                "{raw:?}"
            );
        }
    }

    #[test]
    fn tilde_inside_a_path_is_an_ordinary_character() {
        check("a/~", "/home/user/a/~");
        check("/tmp/~x", "/tmp/~x");
    }

    #[test]
    fn absolute_paths_are_as_given() {
        check("/", "/");
        check("/etc/passwd", "/etc/passwd");
        check("/tmp/a b.txt", "/tmp/a b.txt");
    }

    #[test]
    fn relative_paths_join_the_home() {
        check("a.txt", "/home/user/a.txt");
        check("demo/test.txt", "/home/user/demo/test.txt");
        check(".", "/home/user");
        check("./a", "/home/user/a");
        check("..", "/home");
        check("../../..", "/");
        check("../../../../etc/passwd", "/etc/passwd");
    }

    #[test]
    fn normalises_like_go_filepath_clean() {
        check("//a//b///c", "/a/b/c");
        check("/a/./b/.", "/a/b");
        check("/a/b/../c", "/a/c");
        check("/a/b/c/../../d", "/a/d");
        check("/..", "/");
        check("/../..", "/");
        check("/../a", "/a");
        check("/a/b/", "/a/b");
        check("/a/..", "/");
        check("///", "/");
        check("/a/...", "/a/...");
        check("/a/..b/c", "/a/..b/c");
    }

    #[test]
    fn relative_home_and_workdir_still_give_absolute_paths() {
        let mut odd = user();
        odd.home = PathBuf::from("home/odd");
        assert_eq!(
            resolve("x", &odd, None).unwrap(),
            PathBuf::from("/home/odd/x")
        );
        assert_eq!(
            resolve("", &odd, Some(Path::new("work"))).unwrap(),
            PathBuf::from("/work")
        );
    }

    #[test]
    fn nul_byte_is_refused() {
        for raw in ["a\0b", "\0", "/tmp/x\0"] {
            assert!(
                matches!(resolve(raw, &user(), None), Err(FsError::PathHasNul)),
                "{raw:?}"
            );
        }
    }

    #[test]
    fn length_limit_is_4096_bytes() {
        let longest = format!("/{}", "a".repeat(4095));
        assert_eq!(ok(&longest), PathBuf::from(&longest));
        let too_long = format!("/{}", "a".repeat(4096));
        assert!(matches!(
            resolve(&too_long, &user(), None),
            Err(FsError::PathTooLong)
        ));
        // Bytes, not characters: 2049 two-byte characters are 4098 bytes.
        let multibyte = "é".repeat(2049);
        assert!(matches!(
            resolve(&multibyte, &user(), None),
            Err(FsError::PathTooLong)
        ));
    }
}
