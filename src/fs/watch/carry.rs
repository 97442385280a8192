//! Watches across a live upgrade (`crate::upgrade`): the hub stops reading, and a watch is
//! written down as its inotify instance and its table, which the next image's hub takes back
//! as they are.
//!
//! Carrying the instance (envd re-arms its watchers from their paths instead) keeps the kernel's
//! queue: what happened while neither image read it is read by the new one, and nothing the old
//! one applied is read twice, since the old image reads and applies each batch under the hub's
//! lock and reads nothing once [`Hub::pause`] has taken it. The table (watch descriptor →
//! directory relative to the root) is what the kernel does not tell: the new image could not
//! name the directory of an event without it.
//!
//! Not carried: which `IN_MOVED_FROM` of a directory waits for its `IN_MOVED_TO` (a move whose
//! halves the two images read apart is a directory moved away then a new one created: its
//! contents are announced as created), and which of sandboxd's own temporaries were renamed away
//! (an upload placed across the pause would show one `create` more). Neither happens unless a
//! read of the kernel's queue splits the pair.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use super::state::{lock, MAX_PATH_BYTES};
use super::{Hub, Sink, WatchId, GLOBAL};
use crate::sys::inotify::{Inotify, Wd};

/// What a watch is, for the next image.
pub struct Carried {
    /// The root as the watch was given it.
    pub root: PathBuf,
    pub recursive: bool,
    pub kernel: Arc<Inotify>,
    /// Every watched directory, in no particular order.
    pub dirs: Vec<CarriedDir>,
}

/// One directory of a watch's instance, as the handover carries it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CarriedDir {
    /// Its watch descriptor in the instance.
    #[prost(int32, tag = "1")]
    pub wd: i32,
    /// Its path relative to the watch's root (bytes: a path need not be UTF-8); empty for the
    /// root.
    #[prost(bytes = "vec", tag = "2")]
    pub path: Vec<u8>,
}

impl CarriedDir {
    fn rel(&self) -> &Path {
        Path::new(OsStr::from_bytes(&self.path))
    }
}

impl Hub {
    /// The daemon's hub if it was started.
    pub fn running() -> Option<Hub> {
        GLOBAL.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Stops reading every queue and ticking every sink; asks each sink [`Sink::upgrading`] and
    /// drops the watches whose sink ended. Watches set up meanwhile are asked once ready.
    pub fn pause(&self) {
        let mut ended: Vec<Box<dyn Sink>> = Vec::new();
        {
            let mut state = lock(&self.shared.state);
            state.paused = true;
            let ids: Vec<WatchId> = state.watches.keys().copied().collect();
            for id in ids {
                let done = state
                    .watches
                    .get_mut(&id)
                    .is_some_and(|watch| !watch.sink.upgrading());
                if done {
                    ended.extend(state.remove(id));
                }
            }
        }
        // Dropped outside the lock: dropping a stream wakes its connection.
        drop(ended);
        self.wake();
    }

    /// Reads and ticks again (the upgrade did not happen).
    pub fn resume(&self) {
        lock(&self.shared.state).paused = false;
        self.wake();
    }

    /// Watch `id` as the next image takes it back; `None` when it has ended.
    pub fn carried(&self, id: WatchId) -> Option<Carried> {
        let state = lock(&self.shared.state);
        let watch = state.watches.get(&id)?;
        Some(Carried {
            root: watch.root.clone(),
            recursive: watch.recursive,
            kernel: Arc::clone(&watch.kernel),
            dirs: watch
                .table
                .entries()
                .map(|(wd, rel)| CarriedDir {
                    wd: wd.0,
                    path: rel.as_os_str().as_bytes().to_vec(),
                })
                .collect(),
        })
    }

    /// Takes back a watch another image carried: its instance, read on from where that image
    /// stopped, and its directories, told to `sink`. The root must be absolute and each
    /// directory's path relative and plain (no `.`, `..`, root), within the bytes of paths
    /// the hub holds, else nothing is taken back.
    pub fn adopt(
        &self,
        root: &Path,
        recursive: bool,
        kernel: Inotify,
        dirs: &[CarriedDir],
        sink: Box<dyn Sink>,
    ) -> Result<WatchId, &'static str> {
        let bytes: usize = dirs.iter().map(|dir| dir.path.len()).sum();
        let id = {
            let mut state = lock(&self.shared.state);
            let held: usize = state.watches.values().map(|w| w.table.bytes()).sum();
            if !holds_together(root, dirs) || held + bytes > MAX_PATH_BYTES {
                return Err("its paths do not hold together");
            }
            let id = state.insert(root, recursive, sink, kernel);
            if let Some(watch) = state.watches.get_mut(&id) {
                for dir in dirs {
                    watch.table.subscribe(Wd(dir.wd), id, dir.rel());
                }
            }
            id
        };
        // Polled from now: what waited in its queue is read.
        self.wake();
        Ok(id)
    }
}

/// Whether a carried watch's paths hold together: an absolute root, and directories (with a
/// valid descriptor) at plain relative paths.
pub fn holds_together(root: &Path, dirs: &[CarriedDir]) -> bool {
    let plain = |dir: &CarriedDir| {
        let normal = dir
            .rel()
            .components()
            .all(|c| matches!(c, Component::Normal(_)));
        dir.wd > 0 && !dir.path.contains(&0) && normal
    };
    root.is_absolute() && dirs.iter().all(plain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carried_paths_must_be_a_root_and_plain_relative_directories() {
        let dir = |wd, path: &str| CarriedDir {
            wd,
            path: path.as_bytes().to_vec(),
        };
        let dirs = |rel| vec![dir(1, ""), dir(2, rel)];
        assert!(holds_together(Path::new("/w"), &dirs("a/b")));
        assert!(!holds_together(Path::new("w"), &dirs("a")));
        for bad in ["../up", "/abs", "./a", "a/../b", "a\0b"] {
            assert!(!holds_together(Path::new("/w"), &dirs(bad)), "{bad}");
        }
        assert!(!holds_together(Path::new("/w"), &[dir(0, "")]));
    }
}
