//! Which watches see each watched directory, and where it is inside each of them.
//!
//! Each watch has its own table (and inotify instance); the table still names the watch of each
//! subscription, so it could serve several watches sharing an instance. The table maps each descriptor to its
//! subscribers, each with the directory's path relative to that watch's root (empty for the
//! root), and each watch to its descriptors, so a watch is dropped without a scan. It is pure
//! bookkeeping: the caller makes the system calls, and asks the table which descriptors
//! nobody watches any more.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use crate::sys::inotify::Wd;

/// A watch's own number (never reused while the daemon runs).
pub type WatchId = u64;

/// One watch's view of a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sub {
    pub watch: WatchId,
    /// The directory's path relative to the watch's root; empty for the root.
    pub rel: PathBuf,
}

#[derive(Debug, Default)]
pub struct Table {
    dirs: HashMap<Wd, Vec<Sub>>,
    watches: HashMap<WatchId, BTreeSet<Wd>>,
    /// Bytes of the subscriptions' paths.
    bytes: usize,
}

impl Table {
    /// Records that `watch` sees the directory of `wd` at `rel`. A watch sees a directory at
    /// one place: a second subscription (the directory moved inside the tree) replaces the
    /// first.
    pub fn subscribe(&mut self, wd: Wd, watch: WatchId, rel: &Path) {
        let subs = self.dirs.entry(wd).or_default();
        self.bytes += rel.as_os_str().len();
        match subs.iter_mut().find(|sub| sub.watch == watch) {
            Some(sub) => {
                self.bytes -= sub.rel.as_os_str().len();
                sub.rel = rel.to_path_buf();
            }
            None => subs.push(Sub {
                watch,
                rel: rel.to_path_buf(),
            }),
        }
        self.watches.entry(watch).or_default().insert(wd);
    }

    /// Who sees the directory of `wd`.
    pub fn subscribers(&self, wd: Wd) -> &[Sub] {
        self.dirs.get(&wd).map_or(&[], Vec::as_slice)
    }

    /// Unsubscribes `watch` from `rel` and every directory below it; returns the descriptors
    /// nobody sees any more (to remove from the kernel).
    pub fn unsubscribe_below(&mut self, watch: WatchId, rel: &Path) -> Vec<Wd> {
        let Some(wds) = self.watches.get(&watch) else {
            return Vec::new();
        };
        let below: Vec<Wd> = wds
            .iter()
            .copied()
            .filter(|wd| {
                self.subscribers(*wd)
                    .iter()
                    .any(|sub| sub.watch == watch && sub.rel.starts_with(rel))
            })
            .collect();
        below
            .into_iter()
            .filter(|wd| self.unsubscribe(*wd, watch))
            .collect()
    }

    /// Unsubscribes `watch` from everything; returns the descriptors nobody sees any more.
    pub fn unsubscribe_all(&mut self, watch: WatchId) -> Vec<Wd> {
        let wds = self.watches.remove(&watch).unwrap_or_default();
        wds.into_iter()
            .filter(|wd| self.unsubscribe(*wd, watch))
            .collect()
    }

    /// Forgets `wd` for every watch: the kernel removed it (`IN_IGNORED`).
    pub fn forget(&mut self, wd: Wd) {
        for sub in self.dirs.remove(&wd).unwrap_or_default() {
            self.bytes -= sub.rel.as_os_str().len();
            if let Some(wds) = self.watches.get_mut(&sub.watch) {
                wds.remove(&wd);
                if wds.is_empty() {
                    self.watches.remove(&sub.watch);
                }
            }
        }
    }

    /// Every directory and its path (relative to its watch's root), for a table of one watch;
    /// in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = (Wd, &Path)> {
        self.dirs
            .iter()
            .flat_map(|(wd, subs)| subs.iter().map(|sub| (*wd, sub.rel.as_path())))
    }

    /// Bytes of the paths it holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// How many directories are watched.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.dirs.len()
    }

    /// Removes one subscription; true when `wd` has no subscriber left.
    fn unsubscribe(&mut self, wd: Wd, watch: WatchId) -> bool {
        if let Some(wds) = self.watches.get_mut(&watch) {
            wds.remove(&wd);
            if wds.is_empty() {
                self.watches.remove(&watch);
            }
        }
        let Some(subs) = self.dirs.get_mut(&wd) else {
            return false;
        };
        let mut freed = 0;
        subs.retain(|sub| {
            let keep = sub.watch != watch;
            if !keep {
                freed += sub.rel.as_os_str().len();
            }
            keep
        });
        self.bytes -= freed;
        if subs.is_empty() {
            self.dirs.remove(&wd);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rels(table: &Table, wd: i32) -> Vec<(WatchId, String)> {
        table
            .subscribers(Wd(wd))
            .iter()
            .map(|sub| (sub.watch, sub.rel.display().to_string()))
            .collect()
    }

    #[test]
    fn one_directory_seen_by_two_watches_at_different_places() {
        let mut table = Table::default();
        table.subscribe(Wd(1), 10, Path::new(""));
        table.subscribe(Wd(2), 10, Path::new("sub"));
        // Watch 20 is rooted at "sub", which watch 10 sees recursively.
        table.subscribe(Wd(2), 20, Path::new(""));
        assert_eq!(rels(&table, 2), [(10, "sub".into()), (20, String::new())]);
        assert_eq!(table.len(), 2);

        // Dropping watch 10 frees its root only: "sub" is still watch 20's.
        let mut freed = table.unsubscribe_all(10);
        freed.sort();
        assert_eq!(freed, [Wd(1)]);
        assert_eq!(rels(&table, 2), [(20, String::new())]);
        assert_eq!(table.unsubscribe_all(20), [Wd(2)]);
        assert_eq!(table.len(), 0);
        assert!(table.unsubscribe_all(20).is_empty());
    }

    #[test]
    fn a_subtree_is_unsubscribed_by_path_components() {
        let mut table = Table::default();
        for (wd, rel) in [(1, ""), (2, "a"), (3, "a/b"), (4, "ab"), (5, "c")] {
            table.subscribe(Wd(wd), 7, Path::new(rel));
        }
        table.subscribe(Wd(3), 8, Path::new(""));
        let mut freed = table.unsubscribe_below(7, Path::new("a"));
        freed.sort();
        // "a/b" is still watch 8's root; "ab" is not below "a".
        assert_eq!(freed, [Wd(2)]);
        assert_eq!(rels(&table, 3), [(8, String::new())]);
        assert_eq!(rels(&table, 4), [(7, "ab".into())]);
        assert!(table.unsubscribe_below(9, Path::new("")).is_empty());
    }

    #[test]
    fn a_directory_moved_inside_a_tree_is_seen_at_its_new_place() {
        let mut table = Table::default();
        table.subscribe(Wd(2), 7, Path::new("old"));
        table.subscribe(Wd(2), 7, Path::new("new"));
        assert_eq!(rels(&table, 2), [(7, "new".into())]);
        let entries: Vec<(Wd, &Path)> = table.entries().collect();
        assert_eq!(entries, [(Wd(2), Path::new("new"))]);
        assert_eq!(table.bytes(), 3);
        table.subscribe(Wd(3), 7, Path::new("new/deeper"));
        assert_eq!(table.bytes(), 13);
        assert_eq!(table.unsubscribe_below(7, Path::new("new")).len(), 2);
        assert_eq!(table.bytes(), 0);
    }

    #[test]
    fn a_descriptor_the_kernel_dropped_is_forgotten_for_every_watch() {
        let mut table = Table::default();
        table.subscribe(Wd(1), 7, Path::new(""));
        table.subscribe(Wd(2), 7, Path::new("sub"));
        table.subscribe(Wd(2), 8, Path::new(""));
        table.forget(Wd(2));
        assert!(table.subscribers(Wd(2)).is_empty());
        assert!(table.unsubscribe_all(8).is_empty());
        assert_eq!(table.unsubscribe_all(7), [Wd(1)]);
    }
}
