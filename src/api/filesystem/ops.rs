//! The unary methods of `filesystem.Filesystem`, with envd's semantics: Stat, ListDir (with
//! `depth`), MakeDir, Move, Remove. Paths are resolved for the calling user as every path is
//! (SPEC §4); what they create belongs to that user.

use std::fs::DirBuilder;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::entry::entry_info;
use super::messages::{EntryInfo, EntryResponse, ListDirResponse};
use super::{io_error, Caller};
use crate::connect::{Code, Error};
use crate::fs::dirs::{self, DIR_MODE};

pub fn stat(caller: &Caller, path: &str) -> Result<EntryResponse, Error> {
    let path = caller.resolve(path)?;
    Ok(EntryResponse {
        entry: caller.entry(&path, &path)?,
    })
}

/// The entries under `path` down to `depth` levels (0 counts as 1), depth first in name order,
/// as Go's `filepath.WalkDir` visits them; links inside are listed, not followed. A directory
/// given through a link is listed under the path given.
pub fn list_dir(caller: &Caller, path: &str, depth: u32) -> Result<ListDirResponse, Error> {
    let depth = depth.max(1);
    let requested = caller.resolve(path)?;
    let resolved = std::fs::canonicalize(&requested).map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => Error::new(
            Code::FailedPrecondition,
            format!(
                "cyclic symlink or chain >255 links at '{}'",
                requested.display()
            ),
        ),
        _ => io_error(&e, "path not found", &requested),
    })?;
    match std::fs::metadata(&resolved) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(Error::invalid_argument(format!(
                "path is not a directory: {}",
                requested.display()
            )))
        }
        Err(e) => return Err(io_error(&e, "directory not found", &requested)),
    }
    let mut entries = Vec::new();
    walk(caller, &resolved, &requested, depth, &mut entries).map_err(|e| {
        Error::new(
            Code::Internal,
            format!("error reading directory {}: {e}", resolved.display()),
        )
    })?;
    Ok(ListDirResponse { entries })
}

fn walk(
    caller: &Caller,
    dir: &Path,
    shown: &Path,
    depth: u32,
    entries: &mut Vec<EntryInfo>,
) -> io::Result<()> {
    let mut names: Vec<_> = std::fs::read_dir(dir)?
        .map(|entry| entry.map(|entry| entry.file_name()))
        .collect::<io::Result<_>>()?;
    names.sort();
    for name in names {
        let (path, shown) = (dir.join(&name), shown.join(&name));
        match entry_info(&path, &shown, &caller.owners) {
            Ok(entry) => {
                let is_dir = entry_is_real_dir(&path);
                entries.push(entry);
                if is_dir && depth > 1 {
                    walk(caller, &path, &shown, depth - 1, entries)?;
                }
            }
            // Gone since the directory was read: skipped, as envd does.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A directory itself, not a link to one (links are not followed while walking).
fn entry_is_real_dir(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|meta| meta.is_dir())
}

pub fn make_dir(caller: &Caller, path: &str) -> Result<EntryResponse, Error> {
    let path = caller.resolve(path)?;
    match std::fs::metadata(&path) {
        Ok(meta) if meta.is_dir() => {
            return Err(Error::new(
                Code::AlreadyExists,
                format!("directory already exists: {}", path.display()),
            ))
        }
        Ok(_) => {
            return Err(Error::invalid_argument(format!(
                "path already exists but it is not a directory: {}",
                path.display()
            )))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error(&e, "error getting file info", &path)),
    }
    let (uid, gid) = (caller.user.uid, caller.user.gid);
    dirs::create_parents(&path, uid, gid).map_err(crate::api::rpc::api_error)?;
    match DirBuilder::new().mode(DIR_MODE).create(&path) {
        // Another creator won the race: its directory is the answer.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_error(&e, "error creating directory", &path)),
        Ok(()) => {
            // The mode is exact whatever the umask, as for every directory sandboxd creates.
            let chmod = std::fs::set_permissions(&path, mode(DIR_MODE));
            let chown = std::os::unix::fs::chown(&path, Some(uid), Some(gid));
            if let Err(e) = chmod.and(chown) {
                return Err(io_error(&e, "error setting up directory", &path));
            }
        }
    }
    Ok(EntryResponse {
        entry: caller.entry(&path, &path)?,
    })
}

pub fn rename(caller: &Caller, source: &str, destination: &str) -> Result<EntryResponse, Error> {
    let source = caller.resolve(source)?;
    let destination = caller.resolve(destination)?;
    dirs::create_parents(&destination, caller.user.uid, caller.user.gid)
        .map_err(crate::api::rpc::api_error)?;
    std::fs::rename(&source, &destination).map_err(|e| {
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
        entry: caller.entry(&destination, &destination)?,
    })
}

/// Removes a file, a link (not its target) or a whole directory tree; nothing there is success,
/// as envd's `os.RemoveAll`.
pub fn remove(caller: &Caller, path: &str) -> Result<(), Error> {
    let path: PathBuf = caller.resolve(path)?;
    let removed = match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(&path),
        Ok(_) => std::fs::remove_file(&path),
        Err(e) => Err(e),
    };
    match removed {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_error(&e, "error removing file or directory", &path)),
    }
}

fn mode(bits: u32) -> std::fs::Permissions {
    std::os::unix::fs::PermissionsExt::from_mode(bits)
}
