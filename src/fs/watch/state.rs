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
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::ops::{self, Op};
use super::table::{Table, WatchId};
use super::tree::{add_tree, Tree};
use super::{Change, Ended, Sink};
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
    pub(super) fn path_bytes(&self) -> usize {
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
    pub(super) fn deliver(&mut self, id: WatchId, op: Op, rel: &Path, abs: &Path) -> bool {
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

pub fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}
