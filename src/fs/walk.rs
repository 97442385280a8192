//! Walking down a tree by directory descriptors, with no recursion and no path to resolve: how
//! ListDir, Remove and every other descent go as deep as a tree goes (a local user can make one
//! of any depth; 10,000 levels is deeper than `PATH_MAX`) without a stack overflow and without
//! following a symlink swapped in on the way.
//!
//! A [`Descent`] is an explicit stack of levels, each a directory and the walker's state for it.
//! Only the last [`KEEP_OPEN`] levels hold their descriptor, so a deep walk costs a bounded
//! number of descriptors; going back up to a level whose descriptor was closed reopens it as
//! `..` of the level below and checks that it is the same directory (device and inode) as when
//! it was entered. A directory moved away meanwhile fails the walk ([`moved`]); the walk never
//! continues somewhere else.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStringExt;

use crate::sys::dir::Dir;

/// Levels above the current one that keep their descriptor open.
pub const KEEP_OPEN: usize = 16;

struct Level<T> {
    dir: Option<Dir>,
    id: (u64, u64),
    state: T,
}

/// The directories from the top of a walk down to the current one, with a state each.
pub struct Descent<T> {
    levels: Vec<Level<T>>,
}

const MOVED: &str = "a directory was moved while the walk was inside it";

/// The error of a walk whose way back up no longer leads where it came from.
pub fn moved() -> io::Error {
    io::Error::other(MOVED)
}

/// Whether `err` is [`moved`]'s.
pub fn is_moved(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::Other && err.to_string() == MOVED
}

impl<T> Descent<T> {
    /// A walk starting in `top`.
    pub fn new(top: Dir, state: T) -> io::Result<Descent<T>> {
        let mut descent = Descent { levels: Vec::new() };
        descent.push(top, state)?;
        Ok(descent)
    }

    /// How many levels deep the walk is (1: in the top directory).
    pub fn depth(&self) -> usize {
        self.levels.len()
    }

    /// The current directory and its state; `None` once the walk has left the top.
    pub fn current(&mut self) -> Option<(&Dir, &mut T)> {
        let level = self.levels.last_mut()?;
        let dir = level.dir.as_ref()?;
        Some((dir, &mut level.state))
    }

    /// Every level's state, from the top down.
    pub fn states_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.levels.iter_mut().map(|level| &mut level.state)
    }

    /// Enters `dir` (opened from the current directory), with its state.
    pub fn push(&mut self, dir: Dir, state: T) -> io::Result<()> {
        let id = dir.stat()?.id();
        self.levels.push(Level {
            dir: Some(dir),
            id,
            state,
        });
        if let Some(far) = self.levels.len().checked_sub(KEEP_OPEN + 1) {
            self.levels[far].dir = None;
        }
        Ok(())
    }

    /// Leaves the current directory, giving back its state; the level above becomes current
    /// (reopened as `..` and checked when its descriptor was closed).
    pub fn pop(&mut self) -> io::Result<T> {
        let Some(left) = self.levels.pop() else {
            return Err(io::Error::other("a walk left its top twice"));
        };
        if let Some(above) = self.levels.last_mut() {
            if above.dir.is_none() {
                let below = left.dir.as_ref().ok_or_else(moved)?;
                let parent = below.open_parent()?;
                if parent.stat()?.id() != above.id {
                    return Err(moved());
                }
                above.dir = Some(parent);
            }
        }
        Ok(left.state)
    }
}

/// The names in `dir`, in reverse byte order: a walk pops the next from the end, so it goes in
/// name order (ListDir's listing, an archive's members).
pub fn sorted_names(dir: &Dir) -> io::Result<Vec<std::ffi::OsString>> {
    let mut names = dir.names()?;
    names.sort_unstable_by(|a, b| b.cmp(a));
    Ok(names)
}

/// What a name costs in a batch of [`SortedNames`]: its bytes and its `OsString` (pointer,
/// length, capacity, and the allocator's rounding).
fn cost(name: &[u8]) -> usize {
    name.len() + 32
}

/// A directory's names in byte order, held a bounded batch at a time: a walk's memory for a
/// directory does not grow with its width (a user can make 100,000 names of 255 bytes with
/// hard links, no inode each).
///
/// Each batch is the smallest names after the last one handed out, as many as `budget` bytes
/// hold (at least one), found by one pass over the directory with a bounded max-heap. So a
/// directory of `n` names costs about `n / batch + 1` passes of `n` entries; one that fits in
/// a batch, one pass, as a full listing did. Names are handed out strictly increasing: a name
/// made behind the walk's place meanwhile is not seen, one removed before it is reached is not
/// handed out (as `readdir` promises of a directory changed while read, and never twice).
#[derive(Default)]
pub struct SortedNames {
    /// The batch, the next name last, each with its type as the directory said.
    batch: Vec<(std::ffi::OsString, u8)>,
    /// Its bytes, by [`cost`].
    held: usize,
    /// The last name handed out: the next pass starts after it.
    after: Option<std::ffi::OsString>,
    /// The batch holds every name left: no pass is needed when it is spent.
    complete: bool,
}

impl SortedNames {
    /// Before the first name: nothing read yet.
    pub fn new() -> SortedNames {
        SortedNames::default()
    }

    /// The next name of `dir` in byte order, `None` at the end, with its type as the listing
    /// said (`DT_REG`, `DT_DIR`, ...; `DT_UNKNOWN` where the filesystem does not say: a hint
    /// that may be stale by the time the name is opened); a batch of at most `budget` bytes is
    /// read when the last one is spent. (Lent, not copied: it is also the place the next pass
    /// starts after.)
    pub fn next(&mut self, dir: &Dir, budget: usize) -> io::Result<Option<(&OsStr, u8)>> {
        if self.batch.is_empty() {
            if self.complete {
                return Ok(None);
            }
            self.read_batch(dir, budget)?;
        }
        let Some((name, kind)) = self.batch.pop() else {
            return Ok(None);
        };
        self.held -= cost(name.as_encoded_bytes());
        Ok(Some((self.after.insert(name), kind)))
    }

    /// The bytes its batch holds.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Lets the batch go, keeping the place: the names left are read again when needed.
    pub fn release(&mut self) {
        self.batch = Vec::new();
        self.held = 0;
        self.complete = false;
    }

    fn read_batch(&mut self, dir: &Dir, budget: usize) -> io::Result<()> {
        use std::collections::BinaryHeap;
        let after = self.after.as_ref().map(|name| name.as_encoded_bytes());
        let mut heap: BinaryHeap<(Vec<u8>, u8)> = BinaryHeap::new();
        let mut held = 0;
        let mut cut = false;
        dir.each_entry(|name, kind| {
            if after.is_some_and(|after| name <= after) {
                return;
            }
            // Full: only a name before the largest held gets in.
            if cut
                && heap
                    .peek()
                    .is_some_and(|(largest, _)| name >= largest.as_slice())
            {
                return;
            }
            held += cost(name);
            heap.push((name.to_vec(), kind));
            while held > budget && heap.len() > 1 {
                if let Some((largest, _)) = heap.pop() {
                    held -= cost(&largest);
                    cut = true;
                }
            }
        })?;
        let mut batch: Vec<_> = heap
            .into_sorted_vec()
            .into_iter()
            .map(|(name, kind)| (std::ffi::OsString::from_vec(name), kind))
            .collect();
        batch.reverse();
        self.batch = batch;
        self.held = held;
        self.complete = !cut;
        Ok(())
    }
}

/// Removes `name` in `parent`: a file or a symlink (never what it points to), or a directory
/// with everything under it, depth first, each entry by name in its own directory. Entries
/// that vanish meanwhile are fine; a directory swapped for a symlink is removed as the link.
// Called from several handlers: one copy in the binary, not one inlined into each.
#[inline(never)]
pub fn remove_all(parent: &Dir, name: &OsStr) -> io::Result<()> {
    remove_tree(parent, name, None)
}

/// [`remove_all`] of a directory the caller made, only while `name` is still that directory
/// (`id`: device, inode): whatever else is found there (a directory a local user renamed in
/// meanwhile) is left, and the error says so.
pub fn remove_own_dir(parent: &Dir, name: &OsStr, id: (u64, u64)) -> io::Result<()> {
    remove_tree(parent, name, Some(id))
}

fn remove_tree(parent: &Dir, name: &OsStr, expected: Option<(u64, u64)>) -> io::Result<()> {
    let replaced = || io::Error::other("the directory was replaced by another entry");
    if !parent.stat_at(name, false)?.is_dir() {
        if expected.is_some() {
            return Err(replaced());
        }
        return parent.remove(name, false);
    }
    let top = match parent.open_dir(name, false) {
        Ok(top) => top,
        Err(err) if not_a_dir(&err) && expected.is_none() => return parent.remove(name, false),
        Err(err) => return Err(err),
    };
    if expected.is_some_and(|id| top.stat().map(|stat| stat.id()).ok() != Some(id)) {
        return Err(replaced());
    }
    let names = top.names()?;
    let mut descent = Descent::new(top, (name.to_os_string(), names))?;
    while let Some((dir, (_, names))) = descent.current() {
        let mut child = None;
        while let Some(entry) = names.pop() {
            let found = match dir.stat_at(&entry, false) {
                Ok(stat) if stat.is_dir() => dir.open_dir(&entry, false).map(Some),
                Ok(_) => Ok(None),
                Err(err) => Err(err),
            };
            match found {
                Ok(Some(opened)) => {
                    child = Some((entry, opened));
                    break;
                }
                Ok(None) => gone_is_fine(dir.remove(&entry, false))?,
                Err(err) if not_a_dir(&err) => gone_is_fine(dir.remove(&entry, false))?,
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(err),
            }
        }
        if let Some((entry, opened)) = child {
            let names = opened.names()?;
            descent.push(opened, (entry, names))?;
            continue;
        }
        let (done, _) = descent.pop()?;
        match descent.current() {
            Some((dir, _)) => gone_is_fine(dir.remove(&done, true))?,
            None => return gone_is_fine(parent.remove(&done, true)),
        }
    }
    Ok(())
}

/// A directory swapped for a symlink or a file between its `lstat` and its opening.
fn not_a_dir(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR))
}

fn gone_is_fine(result: io::Result<()>) -> io::Result<()> {
    match result {
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    /// Goes `levels` deep into a chain of directories named `d`, then all the way back up,
    /// counting the levels seen on the way up.
    fn down_and_up(top: &std::path::Path, levels: usize) -> io::Result<usize> {
        let mut descent = Descent::new(Dir::open(top)?, 0usize)?;
        for n in 1..levels {
            let child = descent
                .current()
                .unwrap()
                .0
                .open_dir(OsStr::new("d"), false)?;
            descent.push(child, n)?;
        }
        let mut seen = 0;
        while descent.current().is_some() {
            descent.pop()?;
            seen += 1;
        }
        Ok(seen)
    }

    #[test]
    fn sorted_names_come_in_byte_order_a_bounded_batch_at_a_time() {
        let tmp = tempfile::tempdir().unwrap();
        let mut want: Vec<Vec<u8>> = (0..500u32)
            .map(|i| {
                format!(
                    "{:x}-{}",
                    i.wrapping_mul(2_654_435_761),
                    "n".repeat((i % 7) as usize)
                )
            })
            .map(String::into_bytes)
            .collect();
        want.push(vec![b'x'; 255]);
        for name in &want {
            std::fs::write(tmp.path().join(OsStr::from_bytes(name)), b"").unwrap();
        }
        want.sort();
        let dir = Dir::open(tmp.path()).unwrap();
        // A budget of about ten names; one name larger than it still comes.
        let budget = 10 * cost(b"0123456789-nnn");
        let mut names = SortedNames::new();
        let mut got = Vec::new();
        let mut most = 0;
        while let Some((name, _)) = names.next(&dir, budget).unwrap() {
            let name = name.as_bytes().to_vec();
            most = most.max(names.held());
            got.push(name);
            // Let go of the batch now and then, as an ancestor of a deep walk does.
            if got.len() % 97 == 0 {
                names.release();
                assert_eq!(names.held(), 0);
            }
        }
        assert_eq!(got, want);
        assert!(most <= budget, "{most} bytes held");
        assert_eq!(names.next(&dir, budget).unwrap(), None);
    }

    #[test]
    fn names_come_with_their_type_as_listed() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("file"), b"").unwrap();
        std::fs::create_dir(tmp.path().join("dir")).unwrap();
        std::os::unix::fs::symlink("file", tmp.path().join("link")).unwrap();
        let dir = Dir::open(tmp.path()).unwrap();
        let mut names = SortedNames::new();
        let mut got = Vec::new();
        while let Some((name, kind)) = names.next(&dir, 1 << 20).unwrap() {
            got.push((name.to_str().unwrap().to_string(), kind));
        }
        // Every filesystem a test directory lands on here (ext4, tmpfs, xfs, btrfs) says.
        assert_eq!(
            got,
            [
                ("dir".to_string(), libc::DT_DIR),
                ("file".to_string(), libc::DT_REG),
                ("link".to_string(), libc::DT_LNK)
            ]
        );
    }

    #[test]
    fn names_made_or_removed_during_a_walk_come_once_and_in_order() {
        let tmp = tempfile::tempdir().unwrap();
        for name in ["b", "d", "f", "h"] {
            std::fs::write(tmp.path().join(name), b"").unwrap();
        }
        let dir = Dir::open(tmp.path()).unwrap();
        let mut names = SortedNames::new();
        let one = cost(b"b");
        assert_eq!(names.next(&dir, one).unwrap().unwrap().0, "b");
        // Behind the place: not seen. Ahead: seen. Removed before it is read: not seen.
        std::fs::write(tmp.path().join("a"), b"").unwrap();
        std::fs::write(tmp.path().join("e"), b"").unwrap();
        std::fs::remove_file(tmp.path().join("f")).unwrap();
        let mut rest = Vec::new();
        while let Some((name, _)) = names.next(&dir, one).unwrap() {
            rest.push(name.to_str().unwrap().to_string());
        }
        assert_eq!(rest, ["d", "e", "h"]);
    }

    #[test]
    fn goes_deeper_than_the_descriptors_it_keeps_and_back() {
        let tmp = tempfile::tempdir().unwrap();
        let mut path = tmp.path().to_path_buf();
        for _ in 0..(KEEP_OPEN * 3) {
            path.push("d");
        }
        std::fs::create_dir_all(&path).unwrap();
        assert_eq!(
            down_and_up(tmp.path(), KEEP_OPEN * 3).unwrap(),
            KEEP_OPEN * 3
        );
    }

    #[test]
    fn remove_all_takes_a_tree_deeper_than_path_max_and_no_link_target() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("keep")).unwrap();
        std::fs::write(tmp.path().join("keep/file"), b"x").unwrap();
        let top = Dir::open(tmp.path()).unwrap();
        top.mkdir(OsStr::new("t"), 0o755).unwrap();
        let mut dir = top.open_dir(OsStr::new("t"), false).unwrap();
        // 3,000 levels of 2-byte names: 9,000 bytes of path, over PATH_MAX.
        for _ in 0..3000 {
            std::os::unix::fs::symlink(tmp.path().join("keep"), dir.proc_path(OsStr::new("l")))
                .unwrap();
            dir.create_file(OsStr::new("f"), 0o644).unwrap();
            dir.mkdir(OsStr::new("dd"), 0o755).unwrap();
            dir = dir.open_dir(OsStr::new("dd"), false).unwrap();
        }
        remove_all(&top, OsStr::new("t")).unwrap();
        assert!(!tmp.path().join("t").exists());
        assert_eq!(std::fs::read(tmp.path().join("keep/file")).unwrap(), b"x");
        // A file and a link are removed themselves; nothing there is NotFound.
        remove_all(&top, OsStr::new("keep")).unwrap();
        let err = remove_all(&top, OsStr::new("keep")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn an_own_directory_replaced_under_its_name_is_left_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let top = Dir::open(tmp.path()).unwrap();
        top.mkdir(OsStr::new("made"), 0o700).unwrap();
        let made = top.open_dir(OsStr::new("made"), false).unwrap();
        let id = made.stat().unwrap().id();
        std::fs::write(tmp.path().join("made/inside"), b"ours").unwrap();
        // A local user's swap: the directory made goes, another takes its name.
        std::fs::rename(tmp.path().join("made"), tmp.path().join("moved")).unwrap();
        std::fs::create_dir(tmp.path().join("made")).unwrap();
        std::fs::write(tmp.path().join("made/victim"), b"theirs").unwrap();
        let err = remove_own_dir(&top, OsStr::new("made"), id).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the directory was replaced by another entry"
        );
        assert_eq!(
            std::fs::read(tmp.path().join("made/victim")).unwrap(),
            b"theirs"
        );
        std::fs::write(tmp.path().join("file"), b"").unwrap();
        assert!(remove_own_dir(&top, OsStr::new("file"), id).is_err());
        assert!(tmp.path().join("file").exists());
        // The directory made, under its name again: removed whole.
        std::fs::rename(tmp.path().join("made"), tmp.path().join("other")).unwrap();
        std::fs::rename(tmp.path().join("moved"), tmp.path().join("made")).unwrap();
        remove_own_dir(&top, OsStr::new("made"), id).unwrap();
        assert!(!tmp.path().join("made").exists());
    }

    #[test]
    fn a_directory_moved_while_inside_fails_the_walk() {
        let tmp = tempfile::tempdir().unwrap();
        let mut path = tmp.path().join("a");
        for _ in 0..(KEEP_OPEN + 4) {
            path.push("d");
        }
        std::fs::create_dir_all(&path).unwrap();
        std::fs::create_dir(tmp.path().join("elsewhere")).unwrap();
        let mut descent = Descent::new(Dir::open(&tmp.path().join("a")).unwrap(), ()).unwrap();
        for _ in 0..(KEEP_OPEN + 4) {
            let child = descent
                .current()
                .unwrap()
                .0
                .open_dir(OsStr::new("d"), false)
                .unwrap();
            descent.push(child, ()).unwrap();
        }
        // The second level (whose descriptor is closed) moves under another directory.
        std::fs::rename(tmp.path().join("a/d/d"), tmp.path().join("elsewhere/d")).unwrap();
        let mut result = Ok(());
        while descent.current().is_some() {
            if let Err(err) = descent.pop() {
                result = Err(err);
                break;
            }
        }
        let err = result.unwrap_err();
        assert!(is_moved(&err), "{err}");
    }
}
