//! Adding a directory tree to a watch: each directory watched before it is listed, walked
//! through its parent's open descriptor, and, for a new directory, its entries announced as
//! created (the decisions are `state`'s, in its module documentation).
//!
//! A walk runs under the hub's lock one directory at a time ([`Access`]): on the watcher thread
//! for a directory created in a recursive watch, in a worker for a watch being set up.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::ops::{Op, MASK};
use super::state::{lock, State, MAX_PATH_BYTES};
use super::table::WatchId;
use super::WatchError;

/// Lends the state to [`add_tree`] one directory at a time: a worker setting up a watch takes
/// the lock for each directory, so the watcher thread keeps reading events meanwhile; the
/// watcher thread, which already holds it, lends it directly.
pub trait Access {
    fn with<R>(&mut self, f: impl FnOnce(&mut State) -> R) -> R;
}

impl Access for State {
    fn with<R>(&mut self, f: impl FnOnce(&mut State) -> R) -> R {
        f(self)
    }
}

/// The hub's lock, taken for each step.
pub struct Locked<'a>(pub &'a Mutex<State>);

impl Access for Locked<'_> {
    fn with<R>(&mut self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut lock(self.0))
    }
}

/// A directory tree to add to a watch.
pub struct Tree<'a> {
    pub watch: WatchId,
    /// The directory, and its path relative to the watch's root.
    pub abs: &'a Path,
    pub rel: &'a Path,
    /// Every directory below too, or the directory alone.
    pub recursive: bool,
    /// Report every entry below the directory as created (a new directory's contents).
    pub announce: bool,
    /// Errors on the directory itself are errors (a watch's root), not a reason to skip it.
    pub strict: bool,
}

/// A directory met by [`add_tree`]: its paths, and the open directory it was found in (none for
/// the tree's top), through which the kernel is given a short path however deep it is.
pub struct Dir {
    pub abs: PathBuf,
    pub rel: PathBuf,
    parent: Option<Arc<File>>,
}

impl Dir {
    /// The path to give the kernel: `/proc/self/fd/<parent>/<name>` below the top (never longer
    /// than `PATH_MAX`, and naming the entry of the directory already open, whatever was
    /// renamed above it), the path itself for the top.
    fn at(&self) -> PathBuf {
        match (&self.parent, self.abs.file_name()) {
            (Some(parent), Some(name)) => {
                PathBuf::from(format!("/proc/self/fd/{}", parent.as_raw_fd())).join(name)
            }
            _ => self.abs.clone(),
        }
    }

    /// Opens the directory to list it; `Ok(None)` when it vanished, is not a directory any more
    /// or may not be read (a link below the top is not followed).
    fn open(&self) -> Result<Option<File>, WatchError> {
        let mut flags = libc::O_DIRECTORY;
        if self.parent.is_some() {
            flags |= libc::O_NOFOLLOW;
        }
        match OpenOptions::new()
            .read(true)
            .custom_flags(flags)
            .open(self.at())
        {
            Ok(file) => Ok(Some(file)),
            Err(error) if vanished(&error) => Ok(None),
            Err(error) => Err(WatchError::Io {
                path: self.abs.clone(),
                error,
            }),
        }
    }
}

/// Watches `tree.abs` and, when recursive, every directory below it, each before it is
/// listed, so that whatever appears after the listing is reported by the kernel. Depth first,
/// entries in name order (Go's `filepath.WalkDir`), links not followed, with an explicit
/// stack. Each directory below the top is reached through its parent's open descriptor, so
/// no path the kernel is given exceeds `PATH_MAX` however deep the tree; a directory's
/// descriptor stays open while entries of it wait on the stack. Entries that vanish or may not
/// be read meanwhile are skipped; the watch limit, running out of descriptors and
/// [`MAX_PATH_BYTES`] are errors.
pub fn add_tree(access: &mut impl Access, tree: &Tree<'_>) -> Result<(), WatchError> {
    enum Step {
        Stop,
        Skip,
        List,
    }
    let top = Dir {
        abs: tree.abs.to_path_buf(),
        rel: tree.rel.to_path_buf(),
        parent: None,
    };
    // (the entry, is a directory, is the tree's top, holds data)
    let mut stack = vec![(top, true, true, false)];
    while let Some((dir, is_dir, top, written)) = stack.pop() {
        let step = access.with(|state| -> Result<Step, WatchError> {
            // Watched before it is announced: a client that reacts to the create by writing
            // into the new directory must find the watch there already.
            let step = if is_dir {
                match state.add_dir(tree.watch, &dir, top && tree.strict)? {
                    true => Step::List,
                    false if state.watches.contains_key(&tree.watch) => Step::Skip,
                    false => return Ok(Step::Stop),
                }
            } else {
                Step::Skip
            };
            let (abs, rel) = (&dir.abs, &dir.rel);
            if tree.announce && !top && !state.deliver(tree.watch, Op::Create, rel, abs) {
                return Ok(Step::Stop);
            }
            // A file found already holding data was written before the watch could see it:
            // its write is reported too, as it would have been with the watch in place.
            if tree.announce && written && !state.deliver(tree.watch, Op::Write, rel, abs) {
                return Ok(Step::Stop);
            }
            Ok(step)
        })?;
        match step {
            Step::Stop => return Ok(()),
            Step::Skip => continue,
            Step::List if !tree.recursive => continue,
            Step::List => {}
        }
        let Some(opened) = dir.open()? else {
            continue;
        };
        let listing = PathBuf::from(format!("/proc/self/fd/{}", opened.as_raw_fd()));
        let Ok(entries) = std::fs::read_dir(&listing) else {
            continue;
        };
        let mut children: Vec<(std::ffi::OsString, bool, bool)> = entries
            .filter_map(Result::ok)
            .map(|entry| {
                let is_dir = entry.file_type().is_ok_and(|kind| kind.is_dir());
                let written = !is_dir
                    && tree.announce
                    && entry
                        .metadata()
                        .is_ok_and(|meta| meta.is_file() && meta.len() > 0);
                (entry.file_name(), is_dir, written)
            })
            .filter(|(_, is_dir, _)| *is_dir || tree.announce)
            .collect();
        children.sort();
        let parent = Arc::new(opened);
        for (name, is_dir, written) in children.into_iter().rev() {
            let child = Dir {
                abs: dir.abs.join(&name),
                rel: dir.rel.join(&name),
                parent: Some(Arc::clone(&parent)),
            };
            stack.push((child, is_dir, false, written));
        }
    }
    Ok(())
}

impl State {
    /// Watches the directory `abs`, seen by watch `id` at `rel`. `Ok(false)`: not watched, and
    /// not to be listed (the watch is gone; or, unless `strict`, the directory vanished, is
    /// not a directory any more, or may not be read). `IN_DONT_FOLLOW` unless `strict`: inside
    /// a tree a link is an entry, never a way out of it; a watch's root may be a link.
    fn add_dir(&mut self, id: WatchId, dir: &Dir, strict: bool) -> Result<bool, WatchError> {
        let (abs, rel) = (dir.abs.as_path(), dir.rel.as_path());
        if !self.watches.contains_key(&id) {
            return Ok(false);
        }
        let bytes = rel.as_os_str().len();
        if self.path_bytes() + bytes > MAX_PATH_BYTES {
            return Err(WatchError::Paths {
                path: abs.to_path_buf(),
            });
        }
        let Some(watch) = self.watches.get_mut(&id) else {
            return Ok(false);
        };
        let flags = if strict {
            MASK | libc::IN_ONLYDIR
        } else {
            MASK | libc::IN_ONLYDIR | libc::IN_DONT_FOLLOW
        };
        match watch.kernel.add_watch(&dir.at(), flags) {
            Ok(wd) => {
                watch.table.subscribe(wd, id, rel);
                Ok(true)
            }
            Err(error) if error.raw_os_error() == Some(libc::ENOSPC) => Err(WatchError::Limit {
                path: abs.to_path_buf(),
            }),
            Err(error) if !strict && vanished(&error) => Ok(false),
            Err(error) => Err(WatchError::Io {
                path: abs.to_path_buf(),
                error,
            }),
        }
    }
}

/// An error of `inotify_add_watch` that means the entry is not a directory to watch any more.
fn vanished(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::ENOENT | libc::ENOTDIR | libc::EACCES | libc::EPERM | libc::ELOOP)
    )
}
