//! The end of an unpack: new directories given their metadata, the staged tree made durable
//! when it replaces anything, everything renamed into place; or, for an unpack dropped before
//! that, everything removed.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::FileTimes;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

use super::{held, os, system_time, Placement, Unpack};
use crate::fs::dirs::DIR_MODE;
use crate::fs::error::FsError;
use crate::fs::walk;
use crate::sys::dir::{Dir, Touch};

/// Makes the directory `name` in `dir`, mode 0700 (nobody else enters it while it fills), and
/// opens it without following anything.
/// Makes `name` in `dir`, 0700, and opens it following no link: only if what is opened is
/// still a directory this thread's filesystem user owns, 0700 (a set-group-ID bit inherited from `dir` aside) and empty (the one just made, or
/// one no different from it), else `AlreadyExists`: a directory a local user renamed in
/// between the two calls is never written into nor set up.
pub(super) fn make_private_dir(dir: &Dir, name: &OsStr) -> io::Result<Dir> {
    dir.mkdir(name, 0o700)?;
    let made = dir.open_dir(name, false)?;
    let stat = made.stat()?;
    let ours =
        stat.uid == crate::sys::creds::fsuid() && stat.mode & 0o777 == 0o700 && made.is_empty()?;
    if !ours {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "the directory made was replaced by another meanwhile",
        ));
    }
    Ok(made)
}

impl Unpack {
    /// Places everything: the archive is complete and was checked. The answer's paths: every
    /// regular file written, in the archive's order.
    pub fn commit(mut self) -> Result<Vec<PathBuf>, FsError> {
        self.finish_file()?;
        self.restore_new_dirs()?;
        let placements = std::mem::take(&mut self.placements);
        let mut result = Ok(());
        let mut synced: HashSet<Vec<u8>> = HashSet::new();
        for (index, placement) in placements.iter().enumerate() {
            match self.place(placement, &placements) {
                Ok(parent) => {
                    self.placed = index + 1;
                    synced.insert(parent);
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.placements = placements;
        result?;
        self.restore_existing_times()?;
        if self.replaces {
            for parent in &synced {
                let dir = self.dir_at(parent)?;
                dir.sync()
                    .map_err(|e| FsError::io(e, format!("syncing '{}'", self.dest.display())))?;
            }
        }
        if let (Some(parent), Some((temp, name))) = (&self.parent, &self.root_temp) {
            parent.rename_new(temp, parent, name).map_err(|e| {
                FsError::io(e, format!("creating directory '{}'", self.dest.display()))
            })?;
        }
        self.committed = true;
        Ok(std::mem::take(&mut self.written))
    }

    /// Renames one placement into place; the directory it went into.
    fn place(&mut self, placement: &Placement, all: &[Placement]) -> Result<Vec<u8>, FsError> {
        match placement {
            Placement::Dir {
                parent, temp, name, ..
            } => {
                let dir = self.dir_at(parent)?;
                let path = self.placed_path(parent, name);
                dir.rename_new(temp, &dir, name).map_err(|e| {
                    FsError::io(e, format!("creating directory '{}'", path.display()))
                })?;
                Ok(parent.clone())
            }
            Placement::Entry {
                parent,
                temp,
                name,
                mtime,
                file,
            } => {
                let dir = self.dir_at(parent)?;
                let path = self.placed_path(parent, name);
                let fail = |e: io::Error| FsError::io(e, format!("writing '{}'", path.display()));
                match dir.link(temp, &dir, name) {
                    // A new name: a directory watcher sees its creation.
                    Ok(()) => dir.remove(temp, false).map_err(fail)?,
                    // The name is taken, or the filesystem has no hard links and the rename may
                    // replace one. Only a replacement needs the upload on the device before its
                    // rename: else a crash could leave the name on a file never written.
                    Err(_) => {
                        if !self.replaces {
                            self.replaces = true;
                            self.sync_staged(all)?;
                        }
                        dir.rename(temp, &dir, name).map_err(fail)?;
                    }
                }
                if let Some(id) = file {
                    // What a watcher sees of an upload (`fs::atomic`): an attribute change, then
                    // a modification; the times set are the archive's. Through a descriptor
                    // checked to hold the file made: the name is in the user's reach.
                    if let Some(placed) = held::made_file(&dir, name, *id) {
                        let _ = placed.set_mtime(*mtime, Touch::Times);
                        let _ = placed.set_mtime(*mtime, Touch::Modified);
                    }
                }
                Ok(parent.clone())
            }
        }
    }

    /// Makes the staged tree durable: one `syncfs` per filesystem it was staged on (the
    /// destination's, and another mounted on a directory below it that members went into).
    fn sync_staged(&mut self, placements: &[Placement]) -> Result<(), FsError> {
        // The destination itself (an empty final path), and every directory renamed into.
        let mut parents: Vec<&[u8]> = vec![&[]];
        parents.extend(placements.iter().map(|placement| match placement {
            Placement::Dir { parent, .. } | Placement::Entry { parent, .. } => &parent[..],
        }));
        parents.sort_unstable();
        parents.dedup();
        let mut devices = HashSet::new();
        for rel in parents {
            let dir = self.dir_at(rel)?;
            let path = self.path_of(rel);
            let fail = |e: io::Error| FsError::io(e, format!("syncing '{}'", path.display()));
            let device = dir.stat().map_err(fail)?.id().0;
            if devices.insert(device) {
                dir.sync_filesystem().map_err(fail)?;
            }
        }
        Ok(())
    }

    fn placed_path(&self, parent: &[u8], name: &OsStr) -> PathBuf {
        self.path_of(parent).join(name)
    }

    /// Existing directories that are members take the archive's times (only those: their
    /// mode, owner and metadata stay), deepest first, after everything was renamed into them.
    fn restore_existing_times(&mut self) -> Result<(), FsError> {
        for rel in self.dir_order.clone().into_iter().rev() {
            let Some(mtime) = self
                .dir(&rel)
                .filter(|node| !node.new)
                .and_then(|node| Some(node.meta.as_ref()?.1))
            else {
                continue;
            };
            let path = self.path_of(&rel);
            let fail = |e: io::Error| FsError::io(e, format!("setting up '{}'", path.display()));
            if rel.is_empty() {
                continue;
            }
            let (parent_rel, name) = split(&rel);
            let parent = self.dir_at(parent_rel)?;
            let file = parent
                .open_file(os(name), libc::O_RDONLY | libc::O_DIRECTORY)
                .map_err(fail)?;
            let time = system_time(mtime);
            file.set_times(FileTimes::new().set_accessed(time).set_modified(time))
                .map_err(fail)?;
        }
        Ok(())
    }

    /// Every new directory gets its mode (the archive's, else 0755), the user as owner, and
    /// the archive's metadata and times, deepest first, so that nothing changes a directory
    /// after its time is set.
    fn restore_new_dirs(&mut self) -> Result<(), FsError> {
        for rel in self.dir_order.clone().into_iter().rev() {
            if !self.dir(&rel).is_some_and(|node| node.new) {
                continue;
            }
            let path = self.path_of(&rel);
            let fail = |e: io::Error| FsError::io(e, format!("setting up '{}'", path.display()));
            let file = if rel.is_empty() {
                // The new tree's top, under its temporary name in a directory a local user may
                // write: set up through the descriptor held since it was made, never by name.
                if self.root_temp.is_none() {
                    continue;
                }
                self.root.reopen().map_err(fail)?
            } else {
                let (parent_rel, name) = split(&rel);
                let on_disk = match self.dir(&rel).and_then(|n| n.temp.clone()) {
                    Some(temp) => temp,
                    None => os(name).to_os_string(),
                };
                self.dir_at(parent_rel)?
                    .open_file(&on_disk, libc::O_RDONLY | libc::O_DIRECTORY)
                    .map_err(fail)?
            };
            // One under a temporary name in an existing directory (which a local user may
            // write) is set up only if it is still the directory made there.
            if let Some(id) = self.dir(&rel).and_then(|node| node.id) {
                let meta = file.metadata().map_err(fail)?;
                if (meta.dev(), meta.ino()) != id {
                    return Err(fail(io::Error::other(
                        "the directory made was replaced by another entry meanwhile",
                    )));
                }
            }
            let meta = self.dir_mut(&rel).and_then(|node| node.meta.take());
            let mode = meta.as_ref().map_or(DIR_MODE, |(mode, _, _)| mode & 0o1777);
            std::os::unix::fs::fchown(&file, Some(self.uid), Some(self.gid)).map_err(fail)?;
            file.set_permissions(std::fs::Permissions::from_mode(mode))
                .map_err(fail)?;
            if let Some((_, mtime, metadata)) = meta {
                metadata.apply(&file, &path)?;
                let time = system_time(mtime);
                file.set_times(FileTimes::new().set_accessed(time).set_modified(time))
                    .map_err(fail)?;
            }
        }
        Ok(())
    }
}

/// The parent's final path and the name of the final path `rel` (not empty).
fn split(rel: &[u8]) -> (&[u8], &[u8]) {
    match rel.iter().rposition(|&b| b == b'/') {
        Some(at) => (&rel[..at], &rel[at + 1..]),
        None => (&[], rel),
    }
}

impl Drop for Unpack {
    /// Not committed: whatever was made is removed (by name in its directory, never
    /// following a link; a new tree depth first without recursion, `walk::remove_all`).
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        self.writing = None;
        if let (Some(parent), Some((temp, _))) = (&self.parent, &self.root_temp) {
            // The new tree's top sits under its temporary name in a directory a local user may
            // write: removed only while that name is still the directory made.
            if let Ok(made) = self.root.stat() {
                let _ = walk::remove_own_dir(parent, temp, made.id());
            }
            return;
        }
        let placements = std::mem::take(&mut self.placements);
        for placement in &placements[self.placed.min(placements.len())..] {
            match placement {
                Placement::Dir {
                    parent, temp, id, ..
                } => {
                    if let Ok(dir) = self.dir_at(parent) {
                        let _ = walk::remove_own_dir(&dir, temp, *id);
                    }
                }
                Placement::Entry { parent, temp, .. } => {
                    if let Ok(dir) = self.dir_at(parent) {
                        let _ = dir.remove(temp, false);
                    }
                }
            }
        }
    }
}
