//! An entry's `EntryInfo`, as envd describes files: from `lstat`, with a symlink reported as the
//! type and permission bits of what it points to and its fully resolved target.

use std::ffi::OsStr;
use std::io;
use std::path::Path;

use super::messages::{EntryInfo, FileType};
use crate::connect::json::Timestamp;
use crate::fs::owners::Owners;
use crate::fs::user_metadata;
use crate::sys::dir::{Dir, Stat};

/// The entry at `path`, reported under the name `shown` (the path as the client gave it,
/// resolved: a listing shows paths under the directory it was asked for, not under its link's
/// target).
pub fn entry_info(path: &Path, shown: &Path, owners: &Owners) -> io::Result<EntryInfo> {
    let by_path = |stat: &Stat| describe(stat, None, shown, owners, user_metadata::read(path));
    // The common case (`Stat` of anything but a symlink) by path: one `lstat` and the attributes,
    // without opening the parent (three calls) or walking `/proc/self/fd` for the attributes.
    // A symlink, or a path too long for one call, goes through the parent's descriptor.
    if let Ok(stat) = crate::sys::dir::lstat(path) {
        if !stat.is_symlink() {
            return Ok(by_path(&stat));
        }
    }
    let Some(name) = path.file_name() else {
        // The root, which has no parent to name it in (never a symlink).
        return Ok(by_path(&Dir::open(path)?.stat()?));
    };
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    let dir = Dir::open(parent.unwrap_or(Path::new(".")))?;
    entry_at(&dir, name, shown, owners)
}

/// The entry `name` in the open directory `dir`, reported under the name `shown`: by
/// descriptor, so it works at any depth (a listing of a tree deeper than `PATH_MAX`).
pub fn entry_at(dir: &Dir, name: &OsStr, shown: &Path, owners: &Owners) -> io::Result<EntryInfo> {
    let stat = dir.stat_at(name, false)?;
    // Calls without an `*at` form go through the directory's `/proc/self/fd` path.
    let through = dir.proc_path(name);
    let link = stat.is_symlink().then(|| {
        // envd resolves the whole chain (Go's EvalSymlinks); a dangling link names itself.
        let target = std::fs::canonicalize(&through).unwrap_or_else(|_| {
            std::fs::canonicalize(dir.proc_path(OsStr::new("")))
                .map_or_else(|_| shown.to_path_buf(), |real| real.join(name))
        });
        let (kind, mode) = match dir.stat_at(name, true) {
            Ok(target) => (kind_of(&target), target.mode & 0o777),
            Err(_) => (FileType::Unspecified, 0),
        };
        (kind, mode, target.to_string_lossy().into_owned())
    });
    Ok(describe(
        &stat,
        link,
        shown,
        owners,
        user_metadata::read(&through),
    ))
}

/// An `EntryInfo` from `lstat` and, for a symlink, what it points to (kind, permission bits,
/// resolved target).
fn describe(
    stat: &Stat,
    link: Option<(FileType, u32, String)>,
    shown: &Path,
    owners: &Owners,
    metadata: std::collections::BTreeMap<String, String>,
) -> EntryInfo {
    let (kind, mode, symlink_target) = match link {
        Some((kind, mode, target)) => (kind, mode, Some(target)),
        None => (kind_of(stat), stat.mode & 0o777, None),
    };
    let modified_time = match (stat.mtime, stat.mtime_nsec) {
        (0, 0) => None,
        (seconds, nanos) => Some(Timestamp {
            seconds,
            nanos: i32::try_from(nanos).unwrap_or(0),
        }),
    };
    EntryInfo {
        name: name_of(shown),
        kind: kind.into(),
        path: shown.to_string_lossy().into_owned(),
        size: i64::try_from(stat.size).unwrap_or(i64::MAX),
        mode,
        permissions: permissions(stat.mode),
        owner: owners.user(stat.uid),
        group: owners.group(stat.gid),
        modified_time,
        symlink_target,
        metadata,
    }
}

fn kind_of(stat: &Stat) -> FileType {
    if stat.is_file() {
        FileType::File
    } else if stat.is_dir() {
        FileType::Directory
    } else {
        FileType::Unspecified
    }
}

/// The last component; `/` for the root (Go's `FileInfo.Name()`).
fn name_of(path: &Path) -> String {
    path.file_name().map_or_else(
        || "/".to_string(),
        |name| name.to_string_lossy().into_owned(),
    )
}

/// A unix `st_mode` as Go's `FileMode.String()` prints it: the type and special-bit letters
/// in Go's order (`d`, `L`, `D`, `p`, `S`, `u`, `g`, `c`, `t`), `-` when there is none, then
/// `rwxrwxrwx` with `-` for each bit unset.
pub fn permissions(st_mode: u32) -> String {
    let kind = st_mode & libc::S_IFMT;
    let letters = [
        (kind == libc::S_IFDIR, 'd'),
        (kind == libc::S_IFLNK, 'L'),
        (kind == libc::S_IFBLK || kind == libc::S_IFCHR, 'D'),
        (kind == libc::S_IFIFO, 'p'),
        (kind == libc::S_IFSOCK, 'S'),
        (st_mode & libc::S_ISUID != 0, 'u'),
        (st_mode & libc::S_ISGID != 0, 'g'),
        (kind == libc::S_IFCHR, 'c'),
        (st_mode & libc::S_ISVTX != 0, 't'),
    ];
    let mut text: String = letters
        .iter()
        .filter(|(set, _)| *set)
        .map(|(_, letter)| *letter)
        .collect();
    if text.is_empty() {
        text.push('-');
    }
    for (bit, letter) in (0..9).rev().zip("rwxrwxrwx".chars()) {
        text.push(if st_mode & (1 << bit) != 0 {
            letter
        } else {
            '-'
        });
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_as_go_prints_them() {
        let cases = [
            (libc::S_IFREG | 0o644, "-rw-r--r--"),
            (libc::S_IFDIR | 0o755, "drwxr-xr-x"),
            (libc::S_IFLNK | 0o777, "Lrwxrwxrwx"),
            (libc::S_IFREG | libc::S_ISUID | 0o755, "urwxr-xr-x"),
            (libc::S_IFDIR | libc::S_ISVTX | 0o777, "dtrwxrwxrwx"),
            (libc::S_IFCHR | 0o666, "Dcrw-rw-rw-"),
            (libc::S_IFBLK | 0o660, "Drw-rw----"),
            (libc::S_IFIFO | 0o600, "prw-------"),
            (libc::S_IFSOCK | 0o777, "Srwxrwxrwx"),
            (libc::S_IFREG | libc::S_ISGID | 0o2750 & 0o777, "grwxr-x---"),
            (libc::S_IFREG, "----------"),
        ];
        for (mode, expected) in cases {
            assert_eq!(permissions(mode), expected, "{mode:o}");
        }
    }

    #[test]
    fn entries_of_a_file_a_directory_and_links() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.txt");
        std::fs::write(&file, b"hello").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("gone"), &dangling).unwrap();
        let owners = Owners::default();

        let entry = entry_info(&file, &file, &owners).unwrap();
        assert_eq!(
            (entry.name.as_str(), entry.kind, entry.size),
            ("a.txt", FileType::File as i32, 5)
        );
        assert_eq!(entry.permissions.len(), 10);
        assert!(entry.modified_time.is_some() && entry.symlink_target.is_none());

        let entry = entry_info(&link, &link, &owners).unwrap();
        assert_eq!(
            entry.kind,
            FileType::File as i32,
            "a link is reported as its target's type"
        );
        assert!(entry.permissions.starts_with('L'));
        let canonical = std::fs::canonicalize(&file).unwrap();
        assert_eq!(entry.symlink_target.as_deref(), canonical.to_str());

        let entry = entry_info(&dangling, &dangling, &owners).unwrap();
        assert_eq!((entry.kind, entry.mode), (FileType::Unspecified as i32, 0));
        assert_eq!(entry.symlink_target.as_deref(), dangling.to_str());

        let entry = entry_info(dir.path(), Path::new("/shown/here"), &owners).unwrap();
        assert_eq!(
            (entry.name.as_str(), entry.path.as_str()),
            ("here", "/shown/here")
        );
        assert_eq!(entry.kind, FileType::Directory as i32);
        assert_eq!(name_of(Path::new("/")), "/");
    }
}
