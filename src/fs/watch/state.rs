//! The watcher's state and what each inotify event does to it: which watches it concerns,
//! the changes they are told, the directories a recursive watch adds or drops.
//!
//! Everything here runs under the hub's lock: on the watcher thread for events, in a worker for
//! a watch being set up. Decisions (fsnotify's, as e2b-dev's fork v0.0.1 makes them, unless
//! said otherwise):
//!
//! - An event on a watch's root itself (`IN_ATTRIB`, `IN_DELETE_SELF`, `IN_MOVE_SELF`) is
//!   reported with the name `.`. A root moved away is no longer watched (its path names
//!   something else now); the watch lives on, silent, until its owner ends it, as envd's.
//! - A subdirectory's own events are not reported: its parent reports its deletion, its move
//!   and its attribute change (fsnotify reports the last twice; sandboxd once).
//! - A directory created or moved into a recursive watch is watched, then listed, and every
//!   entry found in it is reported as created, in the order of Go's `filepath.WalkDir` (as
//!   `mkdir -p a/b/c` would otherwise show only `a`); a directory moved within the tree (its
//!   `IN_MOVED_FROM` seen by the same watch) is watched again without those reports.
//! - A directory moved away stops being watched at once (fsnotify keeps watching it under its
//!   old name). Events inside a directory moved within the tree, between the move and the new
//!   watch, are lost.
//! - Entries that come and go in a new directory before its watch is in place are seen only
//!   by the listing: a file created there then written shows one create, no write; one created
//!   between the watch and the listing shows two creates.
//! - `IN_Q_OVERFLOW`: the kernel dropped events of this watch's instance (each watch has its
//!   own, as envd's): that watch ends, and no other.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::ops::{self, Op, MASK};
use super::table::{Table, WatchId};
use super::{Change, Ended, Sink, WatchError};
use crate::fs::temp;
use crate::sys::inotify::{Event, Inotify, Wd};

/// Moves remembered to pair an `IN_MOVED_TO` with its `IN_MOVED_FROM` (they are usually
/// consecutive; a move out of the tree never gets its pair, so old ones are overwritten).
const MOVES: usize = 16;

/// Bytes of directory paths (relative to their roots) the tables of all watches may hold: a
/// deep tree costs its depth squared (a chain of 10,000 one-letter directories, 100 MB), so
/// past this a watch fails instead.
pub const MAX_PATH_BYTES: usize = 64 << 20;

pub struct State {
    pub(super) watches: HashMap<WatchId, Watch>,
    /// Set for a live upgrade (`carry`): no queue is read, no sink ticked.
    pub(super) paused: bool,
    next_id: WatchId,
    moves: [(u32, WatchId); MOVES],
    next_move: usize,
    /// Cookies of sandboxd's temporaries moved away: their `IN_MOVED_TO` is an upload or a
    /// compose replacing a file, reported by the placement itself (see [`State::handle`]).
    placements: [u32; MOVES],
    next_placement: usize,
}

pub(super) struct Watch {
    pub(super) root: PathBuf,
    pub(super) recursive: bool,
    pub(super) sink: Box<dyn Sink>,
    /// The watch's own inotify instance: its queue overflows for its events only.
    pub(super) kernel: Arc<Inotify>,
    /// Its directories (the table of one watch).
    pub(super) table: Table,
}

impl State {
    pub fn new() -> State {
        State {
            watches: HashMap::new(),
            paused: false,
            next_id: 1,
            moves: [(0, 0); MOVES],
            next_move: 0,
            placements: [0; MOVES],
            next_placement: 0,
        }
    }

    /// A new watch on its own inotify instance (`kernel`), with no directory yet.
    pub fn insert(
        &mut self,
        root: &Path,
        recursive: bool,
        sink: Box<dyn Sink>,
        kernel: Inotify,
    ) -> WatchId {
        let id = self.next_id;
        self.next_id += 1;
        let watch = Watch {
            root: root.to_path_buf(),
            recursive,
            sink,
            kernel: Arc::new(kernel),
            table: Table::default(),
        };
        self.watches.insert(id, watch);
        id
    }

    /// Drops a watch; its sink, if it was there. Closing its instance (once the watcher
    /// thread's poll lets go of it) frees its kernel watches.
    pub fn remove(&mut self, id: WatchId) -> Option<Box<dyn Sink>> {
        let watch = self.watches.remove(&id)?;
        Some(watch.sink)
    }

    /// Tells watch `id`'s sink that its directories are watched (and, during an upgrade, that
    /// one is under way); drops it when it is done.
    pub fn ready(&mut self, id: WatchId) {
        let paused = self.paused;
        let alive = self
            .watches
            .get_mut(&id)
            .is_some_and(|watch| watch.sink.ready() && (!paused || watch.sink.upgrading()));
        if !alive {
            self.remove(id);
        }
    }

    /// Bytes of the paths the tables of all watches hold.
    fn path_bytes(&self) -> usize {
        self.watches.values().map(|watch| watch.table.bytes()).sum()
    }

    /// Every watch's instance, to wait on.
    pub fn kernels(&self) -> Vec<(WatchId, Arc<Inotify>)> {
        self.watches
            .iter()
            .map(|(id, watch)| (*id, Arc::clone(&watch.kernel)))
            .collect()
    }

    /// How many directories the kernel watches for the hub.
    #[cfg(test)]
    pub fn watched_dirs(&self) -> usize {
        self.watches.values().map(|watch| watch.table.len()).sum()
    }

    /// How many watches there are.
    #[cfg(test)]
    pub fn watches(&self) -> usize {
        self.watches.len()
    }

    /// The earliest instant a sink wants its tick.
    pub fn next_tick(&self) -> Option<Instant> {
        self.watches
            .values()
            .filter_map(|watch| watch.sink.next_tick())
            .min()
    }

    /// Ticks every sink that is due; drops the watches whose sink is done.
    pub fn tick(&mut self, now: Instant) {
        if self.paused {
            return;
        }
        let due: Vec<WatchId> = self
            .watches
            .iter()
            .filter(|(_, watch)| watch.sink.next_tick().is_some_and(|at| at <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let alive = self
                .watches
                .get_mut(&id)
                .is_some_and(|watch| watch.sink.tick(now));
            if !alive {
                self.remove(id);
            }
        }
    }

    /// Applies one inotify event of watch `id`'s instance.
    pub fn handle(&mut self, id: WatchId, event: &Event<'_>) {
        if event.mask & libc::IN_Q_OVERFLOW != 0 {
            self.end(id, Ended::Overflow);
            return;
        }
        let Some(watch) = self.watches.get_mut(&id) else {
            return;
        };
        if event.mask & libc::IN_IGNORED != 0 {
            watch.table.forget(event.wd);
            return;
        }
        if self.is_placement(id, event) {
            return;
        }
        let Some(watch) = self.watches.get(&id) else {
            return;
        };
        for sub in watch.table.subscribers(event.wd).to_vec() {
            let Some(watch) = self.watches.get(&sub.watch) else {
                continue;
            };
            let (root, recursive) = (watch.root.clone(), watch.recursive);
            if event.name.is_empty() {
                if sub.rel.as_os_str().is_empty() {
                    self.on_root(sub.watch, &root, event.mask);
                }
            } else {
                let rel = sub.rel.join(event.name);
                self.on_entry(sub.watch, &root.join(&rel), &rel, recursive, event);
            }
        }
    }

    /// An event on a watch's root directory itself.
    fn on_root(&mut self, id: WatchId, root: &Path, mask: u32) {
        for op in ops::from_mask(mask) {
            if !self.deliver(id, op, Path::new(""), root) {
                return;
            }
        }
        if mask & libc::IN_MOVE_SELF != 0 {
            if let Some(watch) = self.watches.get_mut(&id) {
                let freed = watch.table.unsubscribe_all(id);
                release(watch, freed);
            }
        }
    }

    /// An event on an entry of a watched directory.
    fn on_entry(&mut self, id: WatchId, abs: &Path, rel: &Path, recursive: bool, event: &Event) {
        for op in ops::from_mask(event.mask) {
            if !self.deliver(id, op, rel, abs) {
                return;
            }
        }
        if !recursive || event.mask & libc::IN_ISDIR == 0 {
            return;
        }
        if event.mask & libc::IN_MOVED_FROM != 0 {
            self.remember_move(event.cookie, id);
            if let Some(watch) = self.watches.get_mut(&id) {
                let freed = watch.table.unsubscribe_below(id, rel);
                release(watch, freed);
            }
        }
        if event.mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0 {
            let moved_within =
                event.mask & libc::IN_MOVED_TO != 0 && self.take_move(event.cookie, id);
            let tree = Tree {
                watch: id,
                abs,
                rel,
                recursive: true,
                announce: !moved_within,
                strict: false,
            };
            if let Err(error) = add_tree(self, &tree) {
                self.end(id, Ended::Failed(error));
            }
        }
    }

    /// Tells watch `id` of a change; false when the watch is gone (its sink was done and it is
    /// dropped now, or it was already).
    fn deliver(&mut self, id: WatchId, op: Op, rel: &Path, abs: &Path) -> bool {
        let Some(watch) = self.watches.get_mut(&id) else {
            return false;
        };
        let name = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        let change = Change {
            op,
            name,
            path: abs,
        };
        if watch.sink.deliver(&change) {
            return true;
        }
        self.remove(id);
        false
    }

    /// Ends watch `id` for `ended`, telling its sink.
    fn end(&mut self, id: WatchId, ended: Ended) {
        if let Some(sink) = self.remove(id) {
            sink.end(ended);
        }
    }

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

    /// Whether `event` is part of how sandboxd places a file (`fs::atomic`), which a client
    /// never sees: its temporaries (`.<name>.sandboxd-….tmp`, and unnamed `O_TMPFILE` files,
    /// which inotify reports as `#<inode>`) appear in no event, and one renamed
    /// over a name does not show as a rename or a create. What a client means is reported
    /// instead: a new file's link gives `create`, and the placement then touches the file's
    /// modification time, which gives `write` for the name (as envd's in-place writes do).
    fn is_placement(&mut self, id: WatchId, event: &Event) -> bool {
        if self.is_unnamed_file(id, event) {
            return true;
        }
        if !event.name.is_empty() && temp::parse_temp_name(event.name).is_some() {
            if event.mask & libc::IN_MOVED_FROM != 0 && event.cookie != 0 {
                self.placements[self.next_placement] = event.cookie;
                self.next_placement = (self.next_placement + 1) % MOVES;
            }
            return true;
        }
        if event.mask & libc::IN_MOVED_TO == 0 || event.cookie == 0 {
            return false;
        }
        match self.placements.iter_mut().find(|c| **c == event.cookie) {
            // A directory moved in from a temporary name is a new tree (an archive's,
            // `fs::unpack`): reported as created, its contents announced as they are added.
            Some(cookie) if event.mask & libc::IN_ISDIR != 0 => {
                *cookie = 0;
                false
            }
            Some(cookie) => {
                *cookie = 0;
                true
            }
            None => false,
        }
    }

    /// An event on an `O_TMPFILE` file being written: the kernel names it `#<inode>`, a name no
    /// entry of the directory has (one that does is a real file, and reported).
    fn is_unnamed_file(&self, id: WatchId, event: &Event) -> bool {
        let name = event.name.as_bytes();
        let looks_unnamed =
            name.len() > 1 && name[0] == b'#' && name[1..].iter().all(u8::is_ascii_digit);
        if !looks_unnamed {
            return false;
        }
        let Some(watch) = self.watches.get(&id) else {
            return false;
        };
        let Some(sub) = watch.table.subscribers(event.wd).first() else {
            return false;
        };
        let path = watch.root.join(&sub.rel).join(event.name);
        matches!(std::fs::symlink_metadata(path), Err(e) if e.kind() == io::ErrorKind::NotFound)
    }

    fn remember_move(&mut self, cookie: u32, id: WatchId) {
        if cookie != 0 {
            self.moves[self.next_move] = (cookie, id);
            self.next_move = (self.next_move + 1) % MOVES;
        }
    }

    fn take_move(&mut self, cookie: u32, id: WatchId) -> bool {
        let Some(slot) = self
            .moves
            .iter_mut()
            .find(|(c, watch)| cookie != 0 && *c == cookie && *watch == id)
        else {
            return false;
        };
        *slot = (0, 0);
        true
    }
}

/// Removes kernel watches `watch` no longer needs. One the kernel already dropped (its
/// `IN_IGNORED` not read yet) is `EINVAL`, which changes nothing.
fn release(watch: &Watch, wds: Vec<Wd>) {
    for wd in wds {
        let _ = watch.kernel.rm_watch(wd);
    }
}

/// An error of `inotify_add_watch` that means the entry is not a directory to watch any more.
fn vanished(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::ENOENT | libc::ENOTDIR | libc::EACCES | libc::EPERM | libc::ELOOP)
    )
}

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

pub fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
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
