//! The hub against the real kernel, with a sink that records what it is told.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use super::*;

#[derive(Default)]
struct Seen {
    changes: Mutex<Vec<(Op, String)>>,
    ticks: AtomicUsize,
    ended: Mutex<Option<String>>,
    /// Makes the next delivery answer "done".
    refuse: AtomicBool,
}

struct Recorder {
    seen: Arc<Seen>,
    tick_every: Option<Duration>,
    next: Option<Instant>,
}

impl Sink for Recorder {
    fn deliver(&mut self, change: &Change<'_>) -> bool {
        if self.seen.refuse.load(Ordering::SeqCst) {
            return false;
        }
        let name = change.name.display().to_string();
        self.seen.changes.lock().unwrap().push((change.op, name));
        true
    }
    fn next_tick(&self) -> Option<Instant> {
        self.next
    }
    fn tick(&mut self, now: Instant) -> bool {
        self.seen.ticks.fetch_add(1, Ordering::SeqCst);
        self.next = self.tick_every.map(|every| now + every);
        true
    }
    fn end(self: Box<Self>, ended: Ended) {
        *self.seen.ended.lock().unwrap() = Some(format!("{ended:?}"));
    }
    fn upgrading(&mut self) -> bool {
        // A sink told to refuse ends at the pause too.
        !self.seen.refuse.load(Ordering::SeqCst)
    }
}

fn watch(hub: &Hub, root: &Path, recursive: bool) -> (WatchId, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let sink = Recorder {
        seen: Arc::clone(&seen),
        tick_every: None,
        next: None,
    };
    let id = hub.watch(root, recursive, Box::new(sink)).unwrap();
    (id, seen)
}

/// Waits until `seen` holds `expected` (in order, among possibly more), at most 5 s.
fn wait_for(seen: &Seen, expected: &[(Op, &str)]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let changes = seen.changes.lock().unwrap().clone();
        let mut want = expected.iter().peekable();
        for (op, name) in &changes {
            if want.peek().is_some_and(|(o, n)| o == op && n == name) {
                want.next();
            }
        }
        if want.peek().is_none() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "expected {expected:?} in order, saw {changes:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn names(seen: &Seen) -> Vec<String> {
    let changes = seen.changes.lock().unwrap();
    changes.iter().map(|(_, name)| name.clone()).collect()
}

#[test]
fn a_directory_reports_create_write_chmod_rename_remove_of_its_entries() {
    let hub = Hub::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("sub")).unwrap();
    let (_, seen) = watch(&hub, dir.path(), false);
    let file = dir.path().join("a.txt");
    fs::write(&file, b"x").unwrap();
    fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
    fs::rename(&file, dir.path().join("b.txt")).unwrap();
    fs::remove_file(dir.path().join("b.txt")).unwrap();
    // Not recursive: the subdirectory's entries are not reported.
    fs::write(dir.path().join("sub/hidden"), b"x").unwrap();
    fs::write(dir.path().join("last"), b"").unwrap();
    wait_for(
        &seen,
        &[
            (Op::Create, "a.txt"),
            (Op::Write, "a.txt"),
            (Op::Chmod, "a.txt"),
            (Op::Rename, "a.txt"),
            (Op::Create, "b.txt"),
            (Op::Remove, "b.txt"),
            (Op::Create, "last"),
        ],
    );
    assert!(!names(&seen).iter().any(|name| name.contains("hidden")));
}

#[test]
fn a_recursive_watch_follows_new_directories_and_reports_their_contents() {
    let hub = Hub::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("old/deep")).unwrap();
    let (_, seen) = watch(&hub, dir.path(), true);
    assert_eq!(hub.counts().0, 3);
    fs::write(dir.path().join("old/deep/f"), b"").unwrap();
    // Made before its parent's watch lands, mostly: reported by the listing either way.
    fs::create_dir_all(dir.path().join("a/b/c")).unwrap();
    wait_for(
        &seen,
        &[
            (Op::Create, "old/deep/f"),
            (Op::Create, "a"),
            (Op::Create, "a/b"),
            (Op::Create, "a/b/c"),
        ],
    );
    fs::write(dir.path().join("a/b/c/late"), b"").unwrap();
    wait_for(&seen, &[(Op::Create, "a/b/c/late")]);
    // Attribute change of a subdirectory: once, from its parent.
    fs::set_permissions(dir.path().join("a/b"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(dir.path().join("marker"), b"").unwrap();
    wait_for(&seen, &[(Op::Chmod, "a/b"), (Op::Create, "marker")]);
    let chmods = seen
        .changes
        .lock()
        .unwrap()
        .iter()
        .filter(|(op, name)| *op == Op::Chmod && name == "a/b")
        .count();
    assert_eq!(chmods, 1);
}

#[test]
fn directories_moved_within_away_from_and_into_a_recursive_watch() {
    let hub = Hub::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    fs::create_dir_all(root.join("a/inner")).unwrap();
    fs::create_dir_all(outside.path().join("incoming/x")).unwrap();
    let (_, seen) = watch(&hub, &root, true);

    fs::rename(root.join("a"), root.join("z")).unwrap();
    wait_for(&seen, &[(Op::Rename, "a"), (Op::Create, "z")]);
    fs::write(root.join("z/inner/f"), b"").unwrap();
    wait_for(&seen, &[(Op::Create, "z/inner/f")]);
    // Moved within: its contents are not announced again.
    assert!(!names(&seen).contains(&"z/inner".to_string()));

    fs::rename(root.join("z"), outside.path().join("gone")).unwrap();
    wait_for(&seen, &[(Op::Rename, "z")]);
    fs::write(outside.path().join("gone/inner/unseen"), b"").unwrap();

    fs::rename(outside.path().join("incoming"), root.join("in")).unwrap();
    wait_for(&seen, &[(Op::Create, "in"), (Op::Create, "in/x")]);
    fs::write(root.join("in/x/f"), b"").unwrap();
    wait_for(&seen, &[(Op::Create, "in/x/f")]);
    assert!(!names(&seen).iter().any(|name| name.contains("unseen")));
    // root, in, in/x
    assert_eq!(hub.counts().0, 3);
}

#[test]
fn events_on_the_root_itself_are_named_dot() {
    let hub = Hub::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    fs::create_dir(&root).unwrap();
    let (_, seen) = watch(&hub, &root, false);
    fs::set_permissions(&root, fs::Permissions::from_mode(0o700)).unwrap();
    fs::remove_dir(&root).unwrap();
    wait_for(&seen, &[(Op::Chmod, "."), (Op::Remove, ".")]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while hub.counts().0 != 0 {
        assert!(
            Instant::now() < deadline,
            "the kernel's watch was not forgotten"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(hub.counts().1, 1, "the watch itself lives on, silent");
}

#[test]
fn watches_of_one_directory_each_watch_it_and_free_it_when_they_go() {
    let hub = Hub::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("sub")).unwrap();
    let (whole, seen_whole) = watch(&hub, dir.path(), true);
    let (sub, seen_sub) = watch(&hub, &dir.path().join("sub"), false);
    // Each watch has its own instance, so "sub" is watched twice.
    assert_eq!(hub.counts(), (3, 2));
    fs::write(dir.path().join("sub/f"), b"").unwrap();
    wait_for(&seen_whole, &[(Op::Create, "sub/f")]);
    wait_for(&seen_sub, &[(Op::Create, "f")]);
    hub.unwatch(whole);
    assert_eq!(hub.counts(), (1, 1));
    hub.unwatch(sub);
    assert_eq!(hub.counts(), (0, 0));
    hub.unwatch(sub);
}

#[test]
fn a_sink_that_is_done_ends_its_watch_and_ticks_come_when_asked() {
    let hub = Hub::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let seen = Arc::new(Seen::default());
    let sink = Recorder {
        seen: Arc::clone(&seen),
        tick_every: Some(Duration::from_millis(20)),
        next: Some(Instant::now() + Duration::from_millis(20)),
    };
    hub.watch(dir.path(), false, Box::new(sink)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let ticks = seen.ticks.load(Ordering::SeqCst);
    assert!((3..=20).contains(&ticks), "{ticks} ticks in 300 ms");
    seen.refuse.store(true, Ordering::SeqCst);
    fs::write(dir.path().join("f"), b"").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while hub.counts() != (0, 0) {
        assert!(Instant::now() < deadline, "the watch was not dropped");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        seen.ended.lock().unwrap().is_none(),
        "a sink that is done is not told"
    );
}

#[test]
fn the_root_must_be_a_watchable_directory() {
    let hub = Hub::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    fs::write(&file, b"").unwrap();
    for (path, errno) in [
        (file.clone(), libc::ENOTDIR),
        (dir.path().join("missing"), libc::ENOENT),
    ] {
        let sink = Recorder {
            seen: Arc::default(),
            tick_every: None,
            next: None,
        };
        match hub.watch(&path, true, Box::new(sink)) {
            Err(Refused {
                error: WatchError::Io { error, .. },
                ..
            }) => assert_eq!(error.raw_os_error(), Some(errno)),
            other => panic!("{path:?}: {other:?}"),
        }
    }
    assert_eq!(hub.counts(), (0, 0));
    // A link to a directory may be a root.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(dir.path(), &link).unwrap();
    let (_, seen) = watch(&hub, &link, false);
    fs::write(dir.path().join("through"), b"").unwrap();
    wait_for(&seen, &[(Op::Create, "through")]);
}

#[test]
fn an_overflowed_queue_ends_its_own_watch_only() {
    let mut state = state::State::new();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut seen = Vec::new();
    let mut ids = Vec::new();
    for dir in &dirs {
        let watched = Arc::new(Seen::default());
        let sink = Recorder {
            seen: Arc::clone(&watched),
            tick_every: None,
            next: None,
        };
        let id = state.insert(dir.path(), false, Box::new(sink), Inotify::new().unwrap());
        let tree = tree::Tree {
            watch: id,
            abs: dir.path(),
            rel: Path::new(""),
            recursive: false,
            announce: false,
            strict: true,
        };
        tree::add_tree(&mut state, &tree).unwrap();
        seen.push(watched);
        ids.push(id);
    }
    assert_eq!((state.watched_dirs(), state.watches()), (2, 2));
    assert_eq!(state.kernels().len(), 2);
    // An event of a descriptor nobody watches is ignored.
    let stray = std::ffi::OsStr::new("x");
    state.handle(
        ids[0],
        &inotify::Event {
            wd: inotify::Wd(9999),
            mask: libc::IN_CREATE,
            cookie: 0,
            name: stray,
        },
    );
    state.handle(
        ids[0],
        &inotify::Event {
            wd: inotify::Wd(-1),
            mask: libc::IN_Q_OVERFLOW,
            cookie: 0,
            name: std::ffi::OsStr::new(""),
        },
    );
    assert_eq!((state.watched_dirs(), state.watches()), (1, 1));
    assert_eq!(seen[0].ended.lock().unwrap().as_deref(), Some("Overflow"));
    assert!(seen[0].changes.lock().unwrap().is_empty());
    // The other watch lives on, with its instance, and is told its events.
    assert_eq!(*seen[1].ended.lock().unwrap(), None);
    let kernels = state.kernels();
    assert_eq!(kernels.len(), 1);
    fs::write(dirs[1].path().join("still"), b"").unwrap();
    let mut buf = vec![0u8; 4096];
    let n = kernels[0].1.read(&mut buf).unwrap();
    let (events, _) = inotify::parse(&buf[..n]).unwrap();
    for event in &events {
        state.handle(ids[1], event);
    }
    assert_eq!(names(&seen[1]), ["still"]);
}

#[test]
fn a_paused_watch_carried_to_another_hub_reads_on_from_its_queue_once() {
    let old = Hub::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("sub")).unwrap();
    let (id, seen) = watch(&old, dir.path(), true);
    let (_, dropped) = watch(&old, dir.path(), false);
    dropped.refuse.store(true, Ordering::SeqCst);
    fs::write(dir.path().join("before"), b"").unwrap();
    wait_for(&seen, &[(Op::Create, "before")]);
    old.pause();
    // The sink that would not be carried is gone; the other one hears nothing more.
    assert_eq!(old.counts(), (2, 1));
    fs::write(dir.path().join("sub/during"), b"").unwrap();
    let mut carried = old.carried(id).unwrap();
    assert_eq!(carried.root, dir.path());
    assert!(carried.recursive);
    carried.dirs.sort_by_key(|dir| dir.wd);
    let dirs: Vec<(i32, &[u8])> = carried
        .dirs
        .iter()
        .map(|dir| (dir.wd, dir.path.as_slice()))
        .collect();
    assert_eq!(dirs, [(1, &b""[..]), (2, &b"sub"[..])]);
    let copy = carried.kernel.as_fd().try_clone_to_owned().unwrap();
    let kernel = Inotify::from_carried(copy).unwrap();

    let new = Hub::start().unwrap();
    let again = Arc::new(Seen::default());
    let sink = Recorder {
        seen: Arc::clone(&again),
        tick_every: None,
        next: None,
    };
    new.adopt(&carried.root, true, kernel, &carried.dirs, Box::new(sink))
        .unwrap();
    drop(carried);
    old.unwatch(id);
    fs::create_dir(dir.path().join("sub/new")).unwrap();
    fs::write(dir.path().join("sub/new/after"), b"").unwrap();
    wait_for(
        &again,
        &[
            (Op::Create, "sub/during"),
            (Op::Create, "sub/new"),
            (Op::Create, "sub/new/after"),
        ],
    );
    assert_eq!(names(&seen), ["before"]);
    assert!(!names(&again).contains(&"before".to_string()));
    assert_eq!(new.counts(), (3, 1));
}

#[test]
fn a_resumed_hub_reads_what_waited_and_a_bad_carried_watch_is_refused() {
    let hub = Hub::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (id, seen) = watch(&hub, dir.path(), false);
    hub.pause();
    fs::write(dir.path().join("waited"), b"").unwrap();
    hub.resume();
    wait_for(&seen, &[(Op::Create, "waited")]);
    let kernel = Inotify::new().unwrap();
    let sink = Recorder {
        seen: Arc::new(Seen::default()),
        tick_every: None,
        next: None,
    };
    let dirs = [carry::CarriedDir {
        wd: 1,
        path: b"../escape".to_vec(),
    }];
    let error = hub
        .adopt(dir.path(), false, kernel, &dirs, Box::new(sink))
        .unwrap_err();
    assert_eq!(error, "its paths do not hold together");
    assert_eq!(hub.counts().1, 1);
    hub.unwatch(id);
}
