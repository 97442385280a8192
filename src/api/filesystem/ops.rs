//! The unary methods of `filesystem.Filesystem`, with envd's semantics: Stat, ListDir (with
//! `depth`), MakeDir, Move, Remove. Paths are resolved for the calling user as every path is
//! (SPEC §4); what they create belongs to that user.

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};

use super::entry::entry_at;
use super::messages::{EntryInfo, EntryResponse, FileType, ListDirResponse};
use super::{io_error, Caller};
use crate::connect::{Code, Error};
use crate::fs::dirs::{self, Made};
use crate::fs::walk::{self, sorted_names, Descent};
use crate::sys::dir::Dir;

/// The largest listing ListDir answers, counted as the JSON its entries make (about 190 bytes
/// an entry plus its path): 100,000 entries fit. A larger one is `resource_exhausted`, so that
/// a huge tree cannot make the daemon hold an answer of any size.
pub const MAX_LISTING_BYTES: usize = 32 << 20;

pub fn stat(caller: &Caller, path: &str) -> Result<EntryResponse, Error> {
    let path = caller.resolve(path)?;
    Ok(EntryResponse {
        entry: Some(caller.entry(&path, &path)?),
    })
}

/// The entries under `path` down to `depth` levels (0 counts as 1), depth first in name order,
/// as Go's `filepath.WalkDir` visits them; links inside are listed, not followed. A directory
/// given through a link is listed under the path given. The walk goes by directory descriptors
/// on an explicit stack (`fs::walk`), so no tree is too deep for it.
pub fn list_dir(caller: &Caller, path: &str, depth: u32) -> Result<ListDirResponse, Error> {
    let depth = usize::try_from(depth.max(1)).unwrap_or(usize::MAX);
    let requested = caller.resolve(path)?;
    let top = Dir::open(&requested).map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => Error::new(
            Code::FailedPrecondition,
            format!(
                "cyclic symlink or chain >255 links at '{}'",
                requested.display()
            ),
        ),
        Some(libc::ENOTDIR) if std::fs::metadata(&requested).is_ok() => {
            Error::invalid_argument(format!("path is not a directory: {}", requested.display()))
        }
        _ => io_error(&e, "path not found", &requested),
    })?;
    // envd's code for a walk that failed is `internal`; running out of something, or a
    // directory moved under the walk, is said so (`super::io_error`'s codes for them).
    let reading = |e: io::Error| {
        let code = if crate::api::status::exhausted(&e) {
            Code::ResourceExhausted
        } else if walk::is_moved(&e) {
            Code::Aborted
        } else if e.kind() == io::ErrorKind::PermissionDenied {
            Code::PermissionDenied
        } else {
            Code::Internal
        };
        Error::new(
            code,
            format!("error reading directory {}: {e}", requested.display()),
        )
    };
    let names = sorted_names(&top).map_err(reading)?;
    let mut descent = Descent::new(
        top,
        Level {
            shown: requested.clone(),
            names,
        },
    )
    .map_err(reading)?;
    let mut entries = Vec::new();
    let mut bytes = 0usize;
    loop {
        let level_depth = descent.depth();
        let Some((dir, level)) = descent.current() else {
            break;
        };
        let Some(name) = level.names.pop() else {
            descent.pop().map_err(reading)?;
            continue;
        };
        let shown = level.shown.join(&name);
        let entry = match entry_at(dir, &name, &shown, &caller.owners) {
            Ok(entry) => entry,
            // Gone since the directory was read: skipped, as envd does.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(reading(e)),
        };
        bytes = bytes.saturating_add(json_size(&entry));
        if bytes > MAX_LISTING_BYTES {
            return Err(Error::new(
                Code::ResourceExhausted,
                format!(
                    "the listing of {} is larger than {} MiB after {} entries: list it with a \
                     smaller depth",
                    requested.display(),
                    MAX_LISTING_BYTES >> 20,
                    entries.len()
                ),
            ));
        }
        let real_dir = entry.kind == FileType::Directory as i32 && entry.symlink_target.is_none();
        let child = if real_dir && level_depth < depth {
            match dir.open_dir(&name, false) {
                Ok(child) => Some(child),
                // Gone, or swapped for a link or a file since: listed as it was, not entered.
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => None,
                Err(e) => return Err(reading(e)),
            }
        } else {
            None
        };
        entries.push(entry);
        if let Some(child) = child {
            let names = sorted_names(&child).map_err(reading)?;
            descent
                .push(child, Level { shown, names })
                .map_err(reading)?;
        }
    }
    Ok(ListDirResponse { entries })
}

/// A directory being listed: the path it is shown under and the names still to list, last
/// first.
struct Level {
    shown: PathBuf,
    names: Vec<OsString>,
}

/// About how many bytes `entry` takes in a JSON answer.
fn json_size(entry: &EntryInfo) -> usize {
    let metadata: usize = entry
        .metadata
        .iter()
        .map(|(k, v)| k.len() + v.len() + 6)
        .sum();
    200 + entry.path.len()
        + entry.name.len()
        + entry.owner.len()
        + entry.group.len()
        + entry.symlink_target.as_ref().map_or(0, String::len)
        + metadata
}

/// The parent directory's path and the last component of an absolute, clean path; `None` for
/// `/`, which nothing may remove, move or replace.
fn split(path: &Path) -> Option<(&Path, &OsStr)> {
    Some((path.parent()?, path.file_name()?))
}

pub fn make_dir(caller: &Caller, path: &str) -> Result<EntryResponse, Error> {
    let path = caller.resolve(path)?;
    let exists = || {
        Error::new(
            Code::AlreadyExists,
            format!("directory already exists: {}", path.display()),
        )
    };
    let not_a_dir = || {
        Error::invalid_argument(format!(
            "path already exists but it is not a directory: {}",
            path.display()
        ))
    };
    let Some((parent, name)) = split(&path) else {
        return Err(exists());
    };
    match std::fs::metadata(&path) {
        Ok(meta) if meta.is_dir() => return Err(exists()),
        Ok(_) => return Err(not_a_dir()),
        // A symlink to nothing is there, not a directory.
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if std::fs::symlink_metadata(&path).is_ok() {
                return Err(not_a_dir());
            }
        }
        Err(e) => return Err(io_error(&e, "error getting file info", &path)),
    }
    let (uid, gid) = (caller.user.uid, caller.user.gid);
    let parent = dirs::open_or_create(parent, uid, gid).map_err(crate::api::rpc::api_error)?;
    match dirs::make_dir(&parent, name, uid, gid) {
        // Made here, or another creator won the race: its directory is the answer.
        Ok(_) => {}
        Err(Made::NotADirectory) => return Err(not_a_dir()),
        Err(Made::Replaced) => {
            return Err(Error::new(
                Code::Aborted,
                format!(
                    "directory {} was replaced while it was being created",
                    path.display()
                ),
            ))
        }
        Err(Made::Failed(e)) => return Err(io_error(&e, "error creating directory", &path)),
    }
    Ok(EntryResponse {
        entry: Some(caller.entry(&path, &path)?),
    })
}

pub fn rename(caller: &Caller, source: &str, destination: &str) -> Result<EntryResponse, Error> {
    let source = caller.resolve(source)?;
    let destination = caller.resolve(destination)?;
    let (Some((from_dir, from_name)), Some((to_dir, to_name))) =
        (split(&source), split(&destination))
    else {
        return Err(Error::invalid_argument("'/' cannot be moved or replaced"));
    };
    let to = dirs::open_or_create(to_dir, caller.user.uid, caller.user.gid)
        .map_err(crate::api::rpc::api_error)?;
    let renamed = Dir::open(from_dir).and_then(|from| from.rename(from_name, &to, to_name));
    renamed.map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            io_error(&e, "source file not found", &source)
        } else {
            io_error(
                &e,
                &format!("error renaming '{}' to", source.display()),
                &destination,
            )
        }
    })?;
    Ok(EntryResponse {
        entry: Some(caller.entry(&destination, &destination)?),
    })
}

/// Removes a file, a link (not its target) or a whole directory tree of any depth; nothing
/// there is success, as envd's `os.RemoveAll`. `/` itself is refused.
pub fn remove(caller: &Caller, path: &str) -> Result<(), Error> {
    let path: PathBuf = caller.resolve(path)?;
    let Some((parent, name)) = split(&path) else {
        return Err(Error::invalid_argument("'/' cannot be removed"));
    };
    let removed = Dir::open(parent).and_then(|dir| walk::remove_all(&dir, name));
    match removed {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_error(&e, "error removing file or directory", &path)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checked here, on the pure function, and never by asking a daemon to remove `/`: one
    /// that got it wrong would remove the test machine's filesystem.
    #[test]
    fn the_root_has_no_parent_to_act_in() {
        assert_eq!(split(Path::new("/")), None);
        assert_eq!(
            split(Path::new("/home/user")),
            Some((Path::new("/home"), OsStr::new("user")))
        );
        assert_eq!(
            split(Path::new("/a")),
            Some((Path::new("/"), OsStr::new("a")))
        );
    }
}
