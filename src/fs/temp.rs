//! Named temporaries beside a destination, and removing the ones a killed sandboxd left behind.
//!
//! Most writes need no name until they are complete (`fs::atomic` writes into an unnamed
//! `O_TMPFILE`); a name is needed where the filesystem has no `O_TMPFILE`, for a finished
//! multipart part whose descriptor is closed, and for the instant between linking a file and
//! renaming it over an existing destination. Such a temporary is named
//! `.<name>.sandboxd-<pid>-<start>-<n>.tmp`: `<name>` is the destination's base name (shortened
//! to fit `NAME_MAX`), `<pid>` and `<start>` identify the process that made it (its start time
//! in clock ticks after boot, field 22 of `/proc/<pid>/stat`, so a reused pid is told apart),
//! `<n>` a per-process counter. A temporary is stale when no running process has that pid and
//! start time. Without a readable `/proc`, nothing is ever judged stale.
//!
//! Stale temporaries are removed by the sweeper, a thread that reads each directory sandboxd
//! writes into once per process life ([`sweep_once`]); no request ever reads a whole directory.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::hash::{BuildHasher, RandomState};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};

use crate::sys::dir::Dir;

const MARK: &[u8] = b".sandboxd-";
const SUFFIX: &[u8] = b".tmp";
const NAME_MAX: usize = 255;

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// This process's (pid, start time), or `None` without `/proc`.
fn me() -> Option<(u32, u64)> {
    static ME: OnceLock<Option<(u32, u64)>> = OnceLock::new();
    *ME.get_or_init(|| {
        let pid = std::process::id();
        let stat = fs::read_to_string("/proc/self/stat").ok()?;
        let (_, start) = parse_stat(&stat)?;
        Some((pid, start))
    })
}

/// The state letter and start time of a `/proc/<pid>/stat` line. The command name may hold
/// spaces and parentheses, so fields are counted after the last `)`.
pub fn parse_stat(stat: &str) -> Option<(char, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    // Field 3 is the state; field 22 the start time: 19 fields further.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// The temporary's name for destination base name `name`, made by process (pid, start).
pub fn temp_name(name: &OsStr, pid: u32, start: u64, n: u64) -> OsString {
    let suffix = format!(".sandboxd-{pid}-{start}-{n}.tmp");
    let room = NAME_MAX - 1 - suffix.len();
    let name = name.as_bytes();
    let mut out = Vec::with_capacity(NAME_MAX);
    out.push(b'.');
    out.extend_from_slice(&name[..name.len().min(room)]);
    out.extend_from_slice(suffix.as_bytes());
    OsString::from_vec(out)
}

/// The (pid, start) in a temporary's name, or `None` if the name is not one of sandboxd's.
pub fn parse_temp_name(name: &OsStr) -> Option<(u32, u64)> {
    let name = name.as_bytes();
    if name.first() != Some(&b'.') {
        return None;
    }
    let body = name.strip_suffix(SUFFIX)?;
    let at = body.windows(MARK.len()).rposition(|w| w == MARK)?;
    let ids = std::str::from_utf8(&body[at + MARK.len()..]).ok()?;
    let mut parts = ids.split('-');
    let pid = parts.next()?.parse().ok()?;
    let start = parts.next()?.parse().ok()?;
    parts.next()?.parse::<u64>().ok()?;
    if parts.next().is_some() {
        return None;
    }
    Some((pid, start))
}

/// Whether process (pid, start) is gone: no such pid, a zombie, or a pid reused by a process
/// started at another time. Unknown (no `/proc`, unreadable) counts as alive.
fn is_gone(pid: u32, start: u64) -> bool {
    let Some((my_pid, my_start)) = me() else {
        return false;
    };
    if pid == my_pid {
        return start != my_start;
    }
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => match parse_stat(&stat) {
            Some((state, started)) => matches!(state, 'Z' | 'X') || started != start,
            None => false,
        },
        Err(err) => err.kind() == io::ErrorKind::NotFound,
    }
}

/// Removes, in `dir`, the regular files and directories (an archive's new tree, `fs::unpack`)
/// named like sandboxd's temporaries whose process is gone (by name in that very directory,
/// never following a symlink; a directory with what it holds, `walk::remove_all`, without
/// recursion). Best effort: errors are ignored
/// (a leftover only wastes space). Reads the whole directory, a listing buffer at a time,
/// holding no name but the one it looks at (a directory a user made of a million names costs
/// time, not memory): requests never call it, only the sweeper thread ([`sweep_once`]) and
/// tests. (A name removed while the directory is listed moves no other: listings go by the
/// filesystem's stable cookies.)
pub fn remove_stale(dir: &Dir) {
    if me().is_none() {
        // Without /proc nothing can be judged stale: do not read the directory for nothing.
        return;
    }
    let Ok(mut listing) = dir.listing() else {
        return;
    };
    while let Ok(Some((name, _))) = listing.next() {
        let name = OsStr::from_bytes(name);
        let Some((pid, start)) = parse_temp_name(name) else {
            continue;
        };
        let Ok(stat) = dir.stat_at(name, false) else {
            continue;
        };
        if (stat.is_file() || stat.is_dir()) && is_gone(pid, start) {
            let _ = crate::fs::walk::remove_all(dir, name);
        }
    }
}

/// How many directories the sweeper remembers having swept; past that it forgets them all and
/// may sweep one again (harmless, and it bounds the memory: 8 bytes each).
const SWEPT_CAP: usize = 16_384;

/// The sweeper: a thread started on first use that runs [`remove_stale`] on each directory it
/// is handed, and what it has been handed already (hashes of the paths).
struct Sweeper {
    seen: HashSet<u64>,
    hasher: RandomState,
    queue: mpsc::Sender<Dir>,
}

static SWEEPER: OnceLock<Option<Mutex<Sweeper>>> = OnceLock::new();

/// Has `dir` swept of stale temporaries once in this process's life, on the sweeper thread.
///
/// Every write calls this for its directory; only the first call for a directory does anything
/// (one hash lookup under a lock otherwise), and the reading of the directory happens on the
/// sweeper thread, so no request's cost depends on how many entries its directory holds. A
/// temporary left by a killed sandboxd (a named temporary where the filesystem has no
/// `O_TMPFILE`, a finished multipart part, or the instant between a link and a rename) is thus
/// removed shortly after a later sandboxd first writes into that directory. Without `/proc`
/// (nothing can be judged stale) or when the thread cannot start, it does nothing.
// Called from several handlers: one copy in the binary, not one inlined into each.
#[inline(never)]
pub fn sweep_once(path: &Path, dir: &Dir) {
    let Some(sweeper) = SWEEPER.get_or_init(start_sweeper) else {
        return;
    };
    let Ok(mut sweeper) = sweeper.lock() else {
        return;
    };
    let key = sweeper.hasher.hash_one(path);
    if sweeper.seen.contains(&key) {
        return;
    }
    if sweeper.seen.len() >= SWEPT_CAP {
        sweeper.seen.clear();
    }
    sweeper.seen.insert(key);
    if let Ok(dir) = dir.try_clone() {
        let _ = sweeper.queue.send(dir);
    }
}

/// Starts the sweeper thread now, if it has not started. A thread starts with the
/// credentials of the thread that creates it, so with `--fs-as-user` the daemon starts it
/// before any call runs as a user (`fs::as_user`); otherwise the first write would.
pub fn start_sweeper_now() {
    SWEEPER.get_or_init(start_sweeper);
}

fn start_sweeper() -> Option<Mutex<Sweeper>> {
    me()?;
    let (queue, directories) = mpsc::channel::<Dir>();
    std::thread::Builder::new()
        .name("sweeper".into())
        .spawn(move || {
            for dir in directories {
                remove_stale(&dir);
            }
        })
        .ok()?;
    Some(Mutex::new(Sweeper {
        seen: HashSet::new(),
        hasher: RandomState::new(),
        queue,
    }))
}

/// A temporary's name in a directory held open, removed when dropped unless
/// [`kept`](TempPath::keep).
#[derive(Debug)]
pub struct TempPath {
    pub dir: Arc<Dir>,
    pub name: OsString,
    keep: bool,
}

impl TempPath {
    /// From now on the name is no longer removed when dropped (it was renamed away).
    pub fn keep(mut self) {
        self.keep = true;
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        if !self.keep {
            let _ = self.dir.remove(&self.name, false);
        }
    }
}

/// The name of the next temporary for destination base name `name`.
pub fn next_name(name: &OsStr) -> OsString {
    let (pid, start) = me().unwrap_or_else(|| (std::process::id(), 0));
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    temp_name(name, pid, start, n)
}

/// Creates a new named temporary file for destination base name `name` in `dir`, mode 0644
/// (less the umask), with `O_EXCL` (never reusing or following anything already there). For
/// filesystems without `O_TMPFILE`.
pub fn create_named(dir: &Arc<Dir>, name: &OsStr) -> io::Result<(File, TempPath)> {
    loop {
        let temp = next_name(name);
        match dir.create_file(&temp, 0o644) {
            Ok(file) => return Ok((file, TempPath::new(dir, temp))),
            // Someone else's file of that name: take the next number.
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(err) => return Err(err),
        }
    }
}

/// Gives the unnamed file `file` a temporary's name in `dir` (for destination base name
/// `name`), so that its descriptor can be closed or it can be renamed over a destination.
pub fn link_named(file: &File, dir: &Arc<Dir>, name: &OsStr) -> io::Result<TempPath> {
    loop {
        let temp = next_name(name);
        match dir.link_file(file, &temp) {
            Ok(()) => return Ok(TempPath::new(dir, temp)),
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(err) => return Err(err),
        }
    }
}

impl TempPath {
    fn new(dir: &Arc<Dir>, name: OsString) -> TempPath {
        TempPath {
            dir: Arc::clone(dir),
            name,
            keep: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_fit_name_max() {
        let name = temp_name(OsStr::new("out.bin"), 42, 1234, 7);
        assert_eq!(name, OsStr::new(".out.bin.sandboxd-42-1234-7.tmp"));
        assert_eq!(parse_temp_name(&name), Some((42, 1234)));
        let long = "x".repeat(255);
        let name = temp_name(OsStr::new(&long), u32::MAX, u64::MAX, u64::MAX);
        assert_eq!(name.len(), 255);
        assert_eq!(parse_temp_name(&name), Some((u32::MAX, u64::MAX)));
        // A destination name that itself looks like a temporary still parses by the last mark.
        let tricky = temp_name(OsStr::new("a.sandboxd-1-2-3.tmp"), 9, 8, 7);
        assert_eq!(parse_temp_name(&tricky), Some((9, 8)));
    }

    #[test]
    fn other_names_are_not_temporaries() {
        for name in [
            "out.bin",
            ".out.bin",
            "out.sandboxd-1-2-3.tmp",
            ".out.sandboxd-1-2.tmp",
            ".out.sandboxd-1-2-3-4.tmp",
            ".out.sandboxd-a-2-3.tmp",
            ".out.sandboxd-1-2-3.tmpx",
            ".out.sandboxd--2-3.tmp",
        ] {
            assert_eq!(parse_temp_name(OsStr::new(name)), None, "{name}");
        }
    }

    #[test]
    fn parses_stat_with_a_hostile_command_name() {
        let stat = "77 (a) b (c) S 1 77 77 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1 2 3";
        assert_eq!(parse_stat(stat), Some(('S', 987654)));
        assert_eq!(parse_stat("77 (x) Z 1"), None);
        assert_eq!(parse_stat("no parenthesis"), None);
    }

    /// The pid of a child that has exited and been reaped: free.
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        dead
    }

    #[test]
    fn stale_temporaries_are_removed_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (pid, start) = me().expect("/proc is mounted here");
        let dead = dead_pid();
        let files = [
            (temp_name(OsStr::new("a"), dead, 5, 0), false),
            (temp_name(OsStr::new("b"), pid, start + 1, 0), false),
            (temp_name(OsStr::new("c"), pid, start, 0), true),
            (OsString::from("plain.tmp"), true),
        ];
        for (name, _) in &files {
            fs::write(dir.path().join(name), b"x").unwrap();
        }
        // An archive's new tree left by a dead process, and one of a live one.
        let dead_tree = temp_name(OsStr::new("tree"), dead, 5, 1);
        let live_tree = temp_name(OsStr::new("tree"), pid, start, 1);
        for tree in [&dead_tree, &live_tree] {
            fs::create_dir_all(dir.path().join(tree).join("sub")).unwrap();
            fs::write(dir.path().join(tree).join("sub/f"), b"x").unwrap();
        }
        std::os::unix::fs::symlink(
            dir.path().join(&live_tree),
            dir.path().join(&dead_tree).join("l"),
        )
        .unwrap();
        remove_stale(&Dir::open(dir.path()).unwrap());
        for (name, kept) in &files {
            assert_eq!(dir.path().join(name).exists(), *kept, "{name:?}");
        }
        assert!(!dir.path().join(&dead_tree).exists());
        assert!(
            dir.path().join(&live_tree).join("sub/f").exists(),
            "a link was not followed"
        );
    }

    /// Removed while the directory is listed, several listing buffers of them: each stale one
    /// goes, and each other name stays.
    #[test]
    fn stale_temporaries_among_many_names_all_go_in_one_listing() {
        let dir = tempfile::tempdir().unwrap();
        let dead = dead_pid();
        let long = "n".repeat(150);
        for i in 0..1500 {
            let stale = temp_name(OsStr::new(&format!("{i}{long}")), dead, 5, 0);
            fs::write(dir.path().join(stale), b"x").unwrap();
            fs::write(dir.path().join(format!("keep{i}{long}")), b"x").unwrap();
        }
        remove_stale(&Dir::open(dir.path()).unwrap());
        let left: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left.len(), 1500, "{} left", left.len());
        assert!(left.iter().all(|name| name.starts_with("keep")));
    }

    #[test]
    fn a_temp_file_is_removed_unless_kept() {
        let dir = tempfile::tempdir().unwrap();
        let held = Arc::new(Dir::open(dir.path()).unwrap());
        let (_file, temp) = create_named(&held, OsStr::new("out")).unwrap();
        let path = dir.path().join(&temp.name);
        assert!(path.exists());
        assert!(parse_temp_name(&temp.name).is_some());
        drop(temp);
        assert!(!path.exists());
        let (_file, temp) = create_named(&held, OsStr::new("out")).unwrap();
        fs::rename(dir.path().join(&temp.name), dir.path().join("out")).unwrap();
        temp.keep();
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, vec![OsString::from("out")]);
    }

    #[test]
    fn an_unnamed_file_linked_to_a_temporary_name_is_removed_unless_kept() {
        let dir = tempfile::tempdir().unwrap();
        let held = Arc::new(Dir::open(dir.path()).unwrap());
        let Ok(file) = held.create_unnamed(0o644) else {
            eprintln!("skipped: no O_TMPFILE here");
            return;
        };
        let temp = link_named(&file, &held, OsStr::new("x")).unwrap();
        assert!(dir.path().join(&temp.name).exists());
        let again = link_named(&file, &held, OsStr::new("x")).unwrap();
        assert_ne!(again.name, temp.name);
        let (first, second) = (dir.path().join(&temp.name), dir.path().join(&again.name));
        drop(temp);
        drop(again);
        assert!(!first.exists() && !second.exists());
    }

    #[test]
    fn the_sweeper_removes_stale_temporaries_once_per_directory() {
        let dir = tempfile::tempdir().unwrap();
        let dead = dead_pid();
        let stale = dir.path().join(temp_name(OsStr::new("a"), dead, 5, 0));
        fs::write(&stale, b"x").unwrap();
        let held = Dir::open(dir.path()).unwrap();
        sweep_once(dir.path(), &held);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while stale.exists() {
            assert!(std::time::Instant::now() < deadline, "not swept");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // A second call for the same directory does nothing: a new leftover stays.
        fs::write(&stale, b"x").unwrap();
        sweep_once(dir.path(), &held);
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(stale.exists());
    }
}
