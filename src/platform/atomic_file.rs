//! Replacing a system file (`/etc/hosts`, the CA bundle) so that a crash at any instant leaves
//! either the old file or the whole new one, never a truncated one.
//!
//! The new contents go to a temporary beside the file (same directory, so the same filesystem:
//! `rename` never crosses devices), which is written, given the mode and owner of the file it
//! replaces (0644 and the daemon's own for a new file), made durable (`fsync`), then renamed
//! over the file, and the directory is synced. The temporary has one fixed name per file
//! (`.<name>.sandboxd-tmp`): a write killed half-way leaves at most that one name, which the next
//! write of the same file removes first. It is created with `O_EXCL | O_NOFOLLOW`, so a name
//! planted there is never written through.
//!
//! A symlink at the file's own path is replaced by the regular file (as `sed -i` does), not
//! followed: a link resolved under `--system-root` could otherwise point out of it. Missing
//! parent directories are created (0755), as envd's `MkdirAll` does for the persisted
//! certificate. Writers of the same file are serialised by the caller (`init_files`' lock); this
//! module only writes.
//!
//! Not used for files a client names (those are `fs::atomic`'s, with users' owners, metadata and
//! watches); system files belong to root and the daemon alone.

use std::fmt;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The mode of a system file that did not exist before.
const NEW_FILE_MODE: u32 = 0o644;

/// An OS error on a named system file.
#[derive(Debug)]
pub struct FileError {
    pub path: PathBuf,
    pub error: io::Error,
}

impl FileError {
    pub fn new(path: &Path, error: io::Error) -> FileError {
        FileError {
            path: path.to_path_buf(),
            error,
        }
    }
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "'{}': {}", self.path.display(), self.error)
    }
}

/// The file's contents, or `None` when it does not exist.
pub fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, FileError> {
    match fs::read(path) {
        Ok(contents) => Ok(Some(contents)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(FileError::new(path, error)),
    }
}

/// Replaces (or creates) the file at `path` with `contents`, atomically (module documentation).
pub fn write(path: &Path, contents: &[u8]) -> Result<(), FileError> {
    write_with(path, contents, |_| Ok(()))
}

/// Removes the file at `path` if it exists, and syncs its directory.
pub fn remove(path: &Path) -> Result<(), FileError> {
    match fs::remove_file(path) {
        Ok(()) => sync_parent(path),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(FileError::new(path, error)),
    }
}

/// Removes the temporary a write of `path` killed half-way left behind (the caller holds the
/// lock its writes take, so none is being written).
pub fn remove_stale(path: &Path) -> Result<(), FileError> {
    match temporary_of(path) {
        Some(temp) => remove(&temp),
        None => Ok(()),
    }
}

/// The temporary that stands for `path` while it is written.
pub fn temporary_of(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?;
    let mut temp = std::ffi::OsString::from(".");
    temp.push(name);
    temp.push(".sandboxd-tmp");
    Some(path.with_file_name(temp))
}

/// [`write`], calling `before_rename` with the durable temporary just before it is renamed over
/// the file: the seam where a test injects a crash or a failure. An error from it is returned,
/// the temporary removed and the file left as it was.
pub fn write_with(
    path: &Path,
    contents: &[u8],
    before_rename: impl FnOnce(&Path) -> io::Result<()>,
) -> Result<(), FileError> {
    let fail = |error| FileError::new(path, error);
    let (Some(dir), Some(temp)) = (path.parent(), temporary_of(path)) else {
        return Err(fail(io::Error::other("not a file path")));
    };
    DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|error| FileError::new(dir, error))?;
    // The mode and owner of the regular file being replaced; not a symlink's.
    let existing = fs::symlink_metadata(path)
        .ok()
        .filter(|meta| meta.file_type().is_file());
    let mode = existing
        .as_ref()
        .map_or(NEW_FILE_MODE, |meta| meta.mode() & 0o777);
    match fs::remove_file(&temp) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(FileError::new(&temp, error)),
    }
    let written = write_temporary(&temp, contents, mode, existing.as_ref())
        .and_then(|()| before_rename(&temp))
        .and_then(|()| fs::rename(&temp, path));
    if let Err(error) = written {
        let _ = fs::remove_file(&temp);
        return Err(fail(error));
    }
    sync_parent(path)
}

/// Creates `temp` anew (never through a symlink or an existing file), writes `contents`, sets
/// `mode` whatever the umask and the replaced file's owner, and makes it durable.
fn write_temporary(
    temp: &Path,
    contents: &[u8],
    mode: u32,
    replaced: Option<&fs::Metadata>,
) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(temp)?;
    file.set_permissions(fs::Permissions::from_mode(mode))?;
    if let Some(meta) = replaced {
        // Keeps root's (or whoever's) ownership; a daemon not running as root can give a file
        // only its own, and then the replacement is its own.
        match std::os::unix::fs::fchown(&file, Some(meta.uid()), Some(meta.gid())) {
            Err(error) if error.raw_os_error() == Some(libc::EPERM) => {}
            other => other?,
        }
    }
    file.write_all(contents)?;
    file.sync_all()
}

fn sync_parent(path: &Path) -> Result<(), FileError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|error| FileError::new(dir, error))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_failure_before_the_rename_leaves_the_old_file_whole_and_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bundle.crt");
        fs::write(&path, "old contents\n").unwrap();
        let mut seen = None;
        let error = write_with(&path, b"new contents, longer than the old\n", |temp| {
            // The temporary is complete and durable when the rename would come.
            seen = Some(fs::read(temp)?);
            Err(io::Error::other("injected crash"))
        })
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("'{}': injected crash", path.display())
        );
        assert_eq!(
            seen.as_deref(),
            Some(&b"new contents, longer than the old\n"[..])
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), "old contents\n");
        assert_eq!(names(dir.path()), ["bundle.crt"]);
    }

    #[test]
    fn a_temporary_left_by_a_killed_write_is_replaced_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hosts");
        fs::write(&path, "127.0.0.1 localhost\n").unwrap();
        let temp = temporary_of(&path).unwrap();
        assert_eq!(temp, dir.path().join(".hosts.sandboxd-tmp"));
        // A half-written temporary, then a symlink planted at its name: neither is written into.
        let outside = dir.path().join("outside");
        fs::write(&outside, "untouched").unwrap();
        fs::write(&temp, "127.0.0.1 loc").unwrap();
        write(&path, b"1\n").unwrap();
        std::os::unix::fs::symlink(&outside, &temp).unwrap();
        write(&path, b"2\n").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "2\n");
        assert_eq!(fs::read_to_string(&outside).unwrap(), "untouched");
        assert_eq!(names(dir.path()), ["hosts", "outside"]);
    }

    #[test]
    fn the_replaced_files_mode_is_kept_and_a_new_file_is_0644_with_its_directories() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("private");
        fs::write(&path, "x").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        write(&path, b"y").unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);

        let new = dir
            .path()
            .join("usr/local/share/ca-certificates/e2b-ca.crt");
        write(&new, b"z").unwrap();
        assert_eq!(fs::metadata(&new).unwrap().mode() & 0o7777, 0o644);
        assert_eq!(fs::read(&new).unwrap(), b"z");
    }

    #[test]
    fn a_symlink_at_the_path_is_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        fs::write(&target, "target").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        write(&link, b"new").unwrap();
        assert!(fs::symlink_metadata(&link).unwrap().file_type().is_file());
        assert_eq!(fs::read_to_string(&target).unwrap(), "target");
    }

    #[test]
    fn reading_and_removing_a_missing_file_are_not_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing");
        assert!(read_optional(&path).unwrap().is_none());
        remove(&path).unwrap();
        let error = read_optional(dir.path()).unwrap_err();
        assert_eq!(error.path, dir.path());
    }
}
