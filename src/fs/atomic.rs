//! Atomic placement of a new file: the write that compose and upload share.
//!
//! A [`Staged`] file is a temporary beside its destination (`fs::temp` names it), mode exactly
//! 0644 and owned by the user before any byte is written. [`Staged::commit`] makes it durable
//! (`fsync`), renames it over the destination and syncs the directory, so a reader sees either
//! the old file or the whole new one, never a part. Dropped uncommitted, it is removed.
//! This module does not decide where the bytes come from.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::error::ApiError;
use crate::fs::dirs;
use crate::fs::temp::{self, TempFile};

/// The mode of every file sandboxd writes (SPEC §4).
pub const FILE_MODE: u32 = 0o644;

/// A temporary that will become `destination`.
pub struct Staged {
    temp: TempFile,
    destination: PathBuf,
}

impl Staged {
    /// Creates the missing parents of `destination` (SPEC §4), removes stale temporaries in its
    /// directory, and creates the temporary, owned by uid:gid. A destination without a file
    /// name (`/`) is a directory: 400.
    pub fn create(destination: &Path, uid: u32, gid: u32) -> Result<Staged, ApiError> {
        let (Some(dir), Some(name)) = (destination.parent(), destination.file_name()) else {
            return Err(ApiError::bad_request(format!(
                "destination is a directory: {}",
                destination.display()
            )));
        };
        dirs::create_parents(destination, uid, gid)?;
        temp::remove_stale(dir);
        let fail = |err: io::Error| writing(&err, destination);
        let temp = TempFile::create(dir, name).map_err(fail)?;
        // Exactly 0644 whatever the umask, and the user's, before any byte is written.
        temp.file
            .set_permissions(fs::Permissions::from_mode(FILE_MODE))
            .map_err(fail)?;
        std::os::unix::fs::fchown(&temp.file, Some(uid), Some(gid)).map_err(fail)?;
        Ok(Staged {
            temp,
            destination: destination.to_path_buf(),
        })
    }

    /// The open temporary, to write into.
    pub fn file(&self) -> &File {
        &self.temp.file
    }

    pub fn destination(&self) -> &Path {
        &self.destination
    }

    /// The 507 or 500 for an OS error met while writing this file.
    pub fn error(&self, err: &io::Error) -> ApiError {
        writing(err, &self.destination)
    }

    /// Makes the data durable; the first half of [`commit`](Self::commit), for callers that
    /// sync several files before renaming any.
    pub fn sync(&self) -> Result<(), ApiError> {
        self.temp.file.sync_all().map_err(|err| self.error(&err))
    }

    /// Renames it over the destination and syncs the directory; call [`sync`](Self::sync) first.
    pub fn place(self) -> Result<(), ApiError> {
        let Staged { temp, destination } = self;
        temp.rename_to(&destination)
            .map_err(|err| writing(&err, &destination))?;
        if let Some(dir) = destination.parent() {
            sync_dir(dir)?;
        }
        Ok(())
    }

    /// `sync`, then `place`.
    pub fn commit(self) -> Result<(), ApiError> {
        self.sync()?;
        self.place()
    }
}

/// `fsync` of a directory, so that a rename into it survives a crash.
pub fn sync_dir(dir: &Path) -> Result<(), ApiError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|err| ApiError::from_io(&err, &format!("syncing '{}'", dir.display())))
}

fn writing(err: &io::Error, destination: &Path) -> ApiError {
    ApiError::from_io(err, &format!("writing '{}'", destination.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn commit_replaces_the_destination_with_a_new_inode() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("sub/out");
        fs::create_dir(dir.path().join("sub")).unwrap();
        fs::write(&dest, b"old").unwrap();
        let old_ino = fs::metadata(&dest).unwrap().ino();
        let meta = fs::metadata(dir.path()).unwrap();
        let staged = Staged::create(&dest, meta.uid(), meta.gid()).unwrap();
        staged.file().write_all(b"new").unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"old");
        staged.commit().unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"new");
        let new = fs::metadata(&dest).unwrap();
        assert_ne!(new.ino(), old_ino);
        assert_eq!(new.mode() & 0o7777, FILE_MODE);
        assert_eq!(names(&dir.path().join("sub")), vec!["out"]);
    }

    #[test]
    fn dropped_uncommitted_leaves_nothing_and_creates_parents() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("a/b/out");
        let meta = fs::metadata(dir.path()).unwrap();
        let staged = Staged::create(&dest, meta.uid(), meta.gid()).unwrap();
        staged.file().write_all(b"partial").unwrap();
        drop(staged);
        assert!(names(&dir.path().join("a/b")).is_empty());
        assert!(Staged::create(Path::new("/"), 0, 0).is_err());
    }
}
