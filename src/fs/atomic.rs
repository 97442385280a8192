//! Atomic placement of a new file: the write that compose and upload share.
//!
//! A [`Staged`] file is written where no reader sees it: an unnamed `O_TMPFILE` file in the
//! destination's directory, or, where the filesystem has no `O_TMPFILE` (or there is no `/proc`
//! to name one through), a named temporary (`fs::temp`). Before any byte is written it has its
//! user metadata (exactly the set given, `fs::user_metadata`), its owner (the user) and its
//! mode: the permission bits (`0777` part) of the regular file it is about to replace, else
//! exactly 0644 whatever the umask (SPEC §4, §8). Set-user-ID, set-group-ID and sticky bits are
//! never carried over to new contents, nor is anything of the replaced file's metadata: the
//! staged file is always a new inode, so it appears with its metadata in the same step as its
//! contents.
//!
//! [`Staged::commit`] makes the data durable (`fsync`), names it, and syncs the directory, so a
//! reader sees either the old file or the whole new one. Naming: a destination that does not
//! exist is created by `linkat` in one step; an existing one is replaced by linking the file to a
//! temporary name and renaming that over it (no system call links over a name). Dropped
//! uncommitted, nothing remains: the kernel frees an unnamed file when its descriptor closes,
//! and a named temporary is removed. A process killed at any instant leaves nothing either,
//! except between that link and that rename (two system calls), or with a named temporary on a
//! filesystem without `O_TMPFILE`; those names are `fs::temp`'s, and its sweeper removes them
//! after a restart. No write reads its directory.
//!
//! [`Staged::finish`] is for a caller that holds many files before placing any (multipart): it
//! gives the file a temporary name and closes it, so that any number of [`Finished`] files cost
//! no descriptor; [`place_all`] then syncs them all, renames them, and syncs each directory once.
//! This module does not decide where the bytes come from.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::fs::dirs;
use crate::fs::error::FsError;
use crate::fs::temp::{self, TempPath};
use crate::fs::user_metadata::UserMetadata;
use crate::sys;
use crate::sys::dir::{Dir, Stat, Touch};

/// The mode of every new file sandboxd writes (SPEC §4).
pub const FILE_MODE: u32 = 0o644;

/// The bits of a replaced file's mode that its replacement keeps.
pub const KEPT_BITS: u32 = 0o777;

/// A file being written that will become `destination`: it and its directory held open, so
/// that naming it acts in the directory it was created in whatever happens to the path.
pub struct Staged {
    file: File,
    destination: PathBuf,
    dir: Arc<Dir>,
    dir_path: PathBuf,
    name: OsString,
    /// The named temporary, or `None` for an unnamed (`O_TMPFILE`) file.
    temp: Option<TempPath>,
    /// Something was at `destination` when this was created: naming goes straight to the link
    /// to a temporary name and the rename, without first trying to link at `destination`.
    replacing: bool,
}

impl Staged {
    /// Creates the missing parents of `destination` (SPEC §4) and the file to write, with
    /// exactly `metadata` as its `user.e2b.*` attributes, owned by uid:gid, with the permission
    /// bits of the regular file now at `destination` (not following a symlink there, which is
    /// replaced) or 0644. A destination without a file name (`/`) is a directory. Hands the
    /// directory to the sweeper (`fs::temp`).
    pub fn create(
        destination: &Path,
        uid: u32,
        gid: u32,
        metadata: &UserMetadata,
    ) -> Result<Staged, FsError> {
        Staged::create_as(destination, uid, gid, metadata, unnamed_possible())
    }

    /// [`create`](Self::create), trying `O_TMPFILE` only when `try_unnamed`.
    fn create_as(
        destination: &Path,
        uid: u32,
        gid: u32,
        metadata: &UserMetadata,
        try_unnamed: bool,
    ) -> Result<Staged, FsError> {
        let (Some(dir_path), Some(name)) = (destination.parent(), destination.file_name()) else {
            return Err(FsError::DestinationIsADirectory(destination.to_path_buf()));
        };
        let dir_path = if dir_path.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir_path
        };
        let dir = Arc::new(dirs::open_or_create(dir_path, uid, gid)?);
        let existing = dir.stat_at(name, false).ok();
        let mode = mode_to_keep(existing.as_ref());
        temp::sweep_once(dir_path, &dir);
        let fail = |err: io::Error| writing(err, destination);
        let unnamed = if try_unnamed {
            match dir.create_unnamed(mode) {
                Ok(file) => Some(file),
                Err(err) if sys::file::unnamed_unsupported(&err) => None,
                Err(err) => return Err(fail(err)),
            }
        } else {
            None
        };
        let (file, temp) = match unnamed {
            Some(file) => (file, None),
            None => {
                let (file, temp) = temp::create_named(&dir, name).map_err(fail)?;
                (file, Some(temp))
            }
        };
        metadata.apply(&file, destination)?;
        // Exactly that mode whatever the umask, and the user's, before any byte is written.
        file.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(fail)?;
        std::os::unix::fs::fchown(&file, Some(uid), Some(gid)).map_err(fail)?;
        Ok(Staged {
            file,
            destination: destination.to_path_buf(),
            dir,
            dir_path: dir_path.to_path_buf(),
            name: name.to_os_string(),
            temp,
            replacing: existing.is_some(),
        })
    }

    /// The open file, to write into.
    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn destination(&self) -> &Path {
        &self.destination
    }

    /// The error for an OS error met while writing this file.
    pub fn error(&self, err: io::Error) -> FsError {
        writing(err, &self.destination)
    }

    /// Makes the data durable; the first half of [`commit`](Self::commit).
    pub fn sync(&self) -> Result<(), FsError> {
        self.file.sync_all().map_err(|err| self.error(err))
    }

    /// Puts it at the destination and syncs the directory; call [`sync`](Self::sync) first.
    pub fn place(self) -> Result<(), FsError> {
        let Staged {
            file,
            destination,
            dir,
            name,
            temp,
            replacing,
            ..
        } = self;
        let fail = |err: io::Error| writing(err, &destination);
        let temp = match temp {
            Some(temp) => temp,
            None if replacing => temp::link_named(&file, &dir, &name).map_err(fail)?,
            None => match dir.link_file(&file, &name) {
                // The destination did not exist: created whole, in one step.
                Ok(()) => {
                    announce_write(&dir, &name);
                    return dir.sync().map_err(|err| syncing(err, &destination));
                }
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                    temp::link_named(&file, &dir, &name).map_err(fail)?
                }
                Err(err) => return Err(fail(err)),
            },
        };
        drop(file);
        put_in_place(temp, &name).map_err(fail)?;
        announce_write(&dir, &name);
        dir.sync().map_err(|err| syncing(err, &destination))
    }

    /// `sync`, then `place`.
    pub fn commit(self) -> Result<(), FsError> {
        self.sync()?;
        self.place()
    }

    /// Gives the file a temporary name beside its destination and closes it and its directory:
    /// the [`Finished`] file holds no descriptor. Removed if dropped unplaced. Its data is made
    /// durable by [`place_all`], together with the others' (see there).
    pub fn finish(self) -> Result<Finished, FsError> {
        let Staged {
            file,
            destination,
            dir,
            dir_path,
            name,
            temp,
            ..
        } = self;
        let fail = |err: io::Error| writing(err, &destination);
        let dir_id = dir.stat().map_err(fail)?.id();
        let temp = match temp {
            Some(temp) => temp,
            None => temp::link_named(&file, &dir, &name).map_err(fail)?,
        };
        let temp_name = temp.name.clone();
        temp.keep();
        Ok(Finished {
            temp_name: Some(temp_name),
            name,
            destination,
            dir_path,
            dir_id,
        })
    }
}

/// A complete file under a temporary name, waiting to be synced and renamed over its
/// destination. It holds no descriptor: its directory is reopened by path when it is placed
/// (or removed), and used only if it is still the directory the file was written in.
#[derive(Debug)]
pub struct Finished {
    /// `None` once placed.
    temp_name: Option<OsString>,
    name: OsString,
    destination: PathBuf,
    dir_path: PathBuf,
    dir_id: (u64, u64),
}

impl Finished {
    pub fn destination(&self) -> &Path {
        &self.destination
    }

    /// Its directory, reopened; an error if the path names another directory now.
    fn reopen(&self) -> io::Result<Dir> {
        let dir = Dir::open(&self.dir_path)?;
        if dir.stat()?.id() != self.dir_id {
            return Err(io::Error::other(format!(
                "directory '{}' was replaced while the upload ran",
                self.dir_path.display()
            )));
        }
        Ok(dir)
    }
}

impl Drop for Finished {
    fn drop(&mut self) {
        if let Some(temp) = &self.temp_name {
            if let Ok(dir) = self.reopen() {
                let _ = dir.remove(temp, false);
            }
        }
    }
}

/// Gives the file at the temporary name `temp` the name `name` in the same directory: a name
/// that is new by a hard link (then the temporary goes), which a directory watcher sees as the
/// creation of that name; an existing one by `rename` over it, which replaces it in one step
/// (and which a watcher of sandboxd's own directories does not report as a rename of a
/// temporary: see `fs::watch`). Either way readers see the old file or the whole new one.
fn put_in_place(temp: TempPath, name: &OsStr) -> io::Result<()> {
    let dir = Arc::clone(&temp.dir);
    match dir.link(&temp.name, &dir, name) {
        // Dropping `temp` removes the temporary name; the file keeps the new one.
        Ok(()) => Ok(()),
        // Taken, or no hard links here (some FUSE filesystems): the rename replaces or creates.
        Err(_) => {
            dir.rename(&temp.name, &dir, name)?;
            temp.keep();
            Ok(())
        }
    }
}

/// Tells directory watchers (inotify) what envd's in-place write of this name shows them: its
/// content arrived through an unnamed file or a temporary name, which a watcher does not see
/// as this name's. envd creates the file (`create`, here the link), sets its owner (`chmod`)
/// and writes it (`write`); so here the times are set to now twice, all of them (`IN_ATTRIB`,
/// `chmod`), then the modification time alone (`IN_MODIFY`, `write`). A new file is seen as
/// `create`, `chmod`, `write`, a replaced one as `chmod`, `write`, as with envd (the SDKs'
/// watch tests count them); never the temporary. Best-effort: the file is in place already.
fn announce_write(dir: &Dir, name: &OsStr) {
    let _ = dir.touch(name, Touch::Times);
    let _ = dir.touch(name, Touch::Modified);
}

/// Makes every file durable, then renames each over its destination, in order, then syncs each
/// directory once. A failure before the first rename removes them all; a rename failing stops
/// there: the files before it are placed, it and the rest are removed. A file whose directory
/// was replaced since it was written fails there, as a rename would.
///
/// Syncing all the files first and renaming afterwards costs far less than syncing each as it
/// is finished: the first `fsync` commits the journal transaction that holds them all, and the
/// others find little left to do (2,000 small files on ext4 here: 0.8 s instead of 9.2 s).
pub fn place_all(mut finished: Vec<Finished>) -> Result<(), FsError> {
    let mut dirs = Reopened::default();
    for file in &finished {
        let synced = dirs
            .get(file)
            .and_then(|dir| sync_temp(&dir, file.temp_name.as_deref().unwrap_or_default()));
        synced.map_err(|err| writing(err, &file.destination))?;
    }
    let mut synced: Vec<(u64, u64)> = Vec::new();
    let mut to_sync: Vec<(Arc<Dir>, PathBuf)> = Vec::new();
    let mut result = Ok(());
    for file in &mut finished {
        let placed = dirs.get(file).and_then(|dir| {
            let temp = file.temp_name.as_deref().unwrap_or_default();
            match dir.link(temp, &dir, &file.name) {
                Ok(()) => {
                    let _ = dir.remove(temp, false);
                }
                Err(_) => dir.rename(temp, &dir, &file.name)?,
            }
            Ok(dir)
        });
        match placed {
            Ok(dir) => {
                file.temp_name = None;
                announce_write(&dir, &file.name);
                if !synced.contains(&file.dir_id) {
                    synced.push(file.dir_id);
                    to_sync.push((dir, file.destination.clone()));
                }
            }
            Err(err) => {
                result = Err(writing(err, &file.destination));
                break;
            }
        }
    }
    for (dir, destination) in &to_sync {
        let done = dir.sync().map_err(|err| syncing(err, destination));
        if result.is_ok() {
            result = done;
        }
    }
    result
}

/// The directory of the last [`Finished`] file asked for, kept while the next ones share it.
#[derive(Default)]
struct Reopened {
    last: Option<((u64, u64), Arc<Dir>)>,
}

impl Reopened {
    fn get(&mut self, file: &Finished) -> io::Result<Arc<Dir>> {
        if let Some((id, dir)) = &self.last {
            if *id == file.dir_id {
                return Ok(Arc::clone(dir));
            }
        }
        let dir = Arc::new(file.reopen()?);
        self.last = Some((file.dir_id, Arc::clone(&dir)));
        Ok(dir)
    }
}

/// `fsync` of the regular file `name` in `dir`, opened without following a symlink and without
/// blocking (a temporary name is in a directory others may write to).
fn sync_temp(dir: &Dir, name: &OsStr) -> io::Result<()> {
    let file = dir.open_file(name, libc::O_RDONLY | libc::O_NONBLOCK)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    file.sync_all()
}

/// Whether this process can name an unnamed file (checked once: `/proc/self/fd` is there).
fn unnamed_possible() -> bool {
    static POSSIBLE: OnceLock<bool> = OnceLock::new();
    *POSSIBLE.get_or_init(sys::file::can_link_unnamed)
}

/// The mode for a file about to replace what `lstat` found at its destination (`None`:
/// nothing): the permission bits of a regular file there, else [`FILE_MODE`]. A symlink is not
/// followed (the link itself is replaced).
fn mode_to_keep(existing: Option<&Stat>) -> u32 {
    match existing {
        Some(stat) if stat.is_file() => stat.mode & KEPT_BITS,
        _ => FILE_MODE,
    }
}

fn syncing(err: io::Error, destination: &Path) -> FsError {
    let dir = destination.parent().unwrap_or(destination);
    FsError::io(err, format!("syncing '{}'", dir.display()))
}

fn writing(err: io::Error, destination: &Path) -> FsError {
    FsError::io(err, format!("writing '{}'", destination.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_directory_swapped_for_a_symlink_while_writing_redirects_nothing() {
        for unnamed in WAYS {
            let dir = tempfile::tempdir().unwrap();
            fs::create_dir(dir.path().join("d")).unwrap();
            fs::create_dir(dir.path().join("elsewhere")).unwrap();
            let (uid, gid) = owner(dir.path());
            let staged =
                Staged::create_as(&dir.path().join("d/f"), uid, gid, &none(), unnamed).unwrap();
            staged.file().write_all(b"new").unwrap();
            fs::rename(dir.path().join("d"), dir.path().join("moved")).unwrap();
            std::os::unix::fs::symlink("elsewhere", dir.path().join("d")).unwrap();
            staged.commit().unwrap();
            // The file is in the directory it was written in, not where the link points.
            assert_eq!(fs::read(dir.path().join("moved/f")).unwrap(), b"new");
            assert!(names(&dir.path().join("elsewhere")).is_empty());
            // A finished file whose directory is replaced is refused, and nothing is placed.
            let finished = Staged::create_as(&dir.path().join("d/g"), uid, gid, &none(), unnamed)
                .unwrap()
                .finish()
                .unwrap();
            fs::remove_file(dir.path().join("d")).unwrap();
            fs::create_dir(dir.path().join("d")).unwrap();
            let err = place_all(vec![finished]).unwrap_err();
            assert!(err.to_string().contains("replaced"), "{err}");
            assert!(names(&dir.path().join("d")).is_empty());
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn owner(dir: &Path) -> (u32, u32) {
        let meta = fs::metadata(dir).unwrap();
        (meta.uid(), meta.gid())
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().mode() & 0o7777
    }

    fn none() -> UserMetadata {
        UserMetadata::default()
    }

    /// Both ways of staging: unnamed (`O_TMPFILE`) and named.
    const WAYS: [bool; 2] = [true, false];

    #[test]
    fn commit_replaces_the_destination_with_a_new_inode() {
        for unnamed in WAYS {
            let dir = tempfile::tempdir().unwrap();
            let dest = dir.path().join("sub/out");
            fs::create_dir(dir.path().join("sub")).unwrap();
            fs::write(&dest, b"old").unwrap();
            fs::set_permissions(&dest, fs::Permissions::from_mode(0o644)).unwrap();
            let old_ino = fs::metadata(&dest).unwrap().ino();
            let (uid, gid) = owner(dir.path());
            let staged = Staged::create_as(&dest, uid, gid, &none(), unnamed).unwrap();
            assert_eq!(staged.temp.is_none(), unnamed);
            staged.file().write_all(b"new").unwrap();
            assert_eq!(fs::read(&dest).unwrap(), b"old");
            staged.commit().unwrap();
            assert_eq!(fs::read(&dest).unwrap(), b"new");
            let new = fs::metadata(&dest).unwrap();
            assert_ne!(new.ino(), old_ino);
            assert_eq!(new.mode() & 0o7777, FILE_MODE);
            assert_eq!(names(&dir.path().join("sub")), vec!["out"]);
        }
    }

    #[test]
    fn a_new_destination_is_created_whole_and_an_unnamed_file_is_never_seen() {
        for unnamed in WAYS {
            let dir = tempfile::tempdir().unwrap();
            let dest = dir.path().join("fresh");
            let (uid, gid) = owner(dir.path());
            let staged = Staged::create_as(&dest, uid, gid, &none(), unnamed).unwrap();
            staged.file().write_all(b"whole").unwrap();
            // Unnamed: nothing at all in the directory until placed.
            assert_eq!(names(dir.path()).len(), usize::from(!unnamed));
            staged.commit().unwrap();
            assert_eq!(fs::read(&dest).unwrap(), b"whole");
            assert_eq!(names(dir.path()), vec!["fresh"]);
            assert_eq!(mode(&dest), FILE_MODE);
        }
    }

    #[test]
    fn the_permission_bits_of_a_replaced_file_are_kept_but_not_set_id_bits() {
        for unnamed in WAYS {
            let dir = tempfile::tempdir().unwrap();
            let (uid, gid) = owner(dir.path());
            for (before, after) in [
                (0o600, 0o600),
                (0o755, 0o755),
                (0o4755, 0o755),
                (0o2640, 0o640),
            ] {
                let dest = dir.path().join("f");
                fs::write(&dest, b"old").unwrap();
                fs::set_permissions(&dest, fs::Permissions::from_mode(before)).unwrap();
                let staged = Staged::create_as(&dest, uid, gid, &none(), unnamed).unwrap();
                staged.commit().unwrap();
                assert_eq!(mode(&dest), after, "{before:o}");
            }
            // A symlink is replaced, not followed: the new file gets 0644.
            let target = dir.path().join("secret");
            fs::write(&target, b"s").unwrap();
            fs::set_permissions(&target, fs::Permissions::from_mode(0o600)).unwrap();
            std::os::unix::fs::symlink(&target, dir.path().join("link")).unwrap();
            Staged::create_as(&dir.path().join("link"), uid, gid, &none(), unnamed)
                .unwrap()
                .commit()
                .unwrap();
            assert_eq!(mode(&dir.path().join("link")), FILE_MODE);
            assert_eq!(mode(&target), 0o600);
            fs::remove_file(dir.path().join("link")).unwrap();
        }
    }

    #[test]
    fn dropped_uncommitted_leaves_nothing_and_creates_parents() {
        for unnamed in WAYS {
            let dir = tempfile::tempdir().unwrap();
            let dest = dir.path().join("a/b/out");
            let (uid, gid) = owner(dir.path());
            let staged = Staged::create_as(&dest, uid, gid, &none(), unnamed).unwrap();
            staged.file().write_all(b"partial").unwrap();
            drop(staged);
            assert!(names(&dir.path().join("a/b")).is_empty());
            let finished = Staged::create_as(&dest, uid, gid, &none(), unnamed)
                .unwrap()
                .finish()
                .unwrap();
            assert_eq!(names(&dir.path().join("a/b")).len(), 1);
            drop(finished);
            assert!(names(&dir.path().join("a/b")).is_empty());
        }
        assert!(matches!(
            Staged::create(Path::new("/"), 0, 0, &none()),
            Err(FsError::DestinationIsADirectory(path)) if path == Path::new("/")
        ));
    }

    #[test]
    fn finished_files_hold_no_descriptor_and_are_placed_together() {
        for unnamed in WAYS {
            let dir = tempfile::tempdir().unwrap();
            let (uid, gid) = owner(dir.path());
            fs::write(dir.path().join("p1"), b"old").unwrap();
            let open_before = fs::read_dir("/proc/self/fd").unwrap().count();
            let mut finished = Vec::new();
            for i in 0..50 {
                let staged = Staged::create_as(
                    &dir.path().join(format!("p{i}")),
                    uid,
                    gid,
                    &none(),
                    unnamed,
                )
                .unwrap();
                staged
                    .file()
                    .write_all(format!("part {i}").as_bytes())
                    .unwrap();
                finished.push(staged.finish().unwrap());
            }
            // Other tests open files meanwhile: allow some slack, far below 50.
            let open_after = fs::read_dir("/proc/self/fd").unwrap().count();
            assert!(
                open_after < open_before + 10,
                "{open_before} -> {open_after}"
            );
            assert_eq!(fs::read(dir.path().join("p1")).unwrap(), b"old");
            assert_eq!(names(dir.path()).len(), 50 + 1);
            place_all(finished).unwrap();
            assert_eq!(names(dir.path()).len(), 50);
            for i in 0..50 {
                let path = dir.path().join(format!("p{i}"));
                assert_eq!(fs::read(&path).unwrap(), format!("part {i}").as_bytes());
            }
        }
    }
}
