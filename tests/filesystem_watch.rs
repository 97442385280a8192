//! envd's directory watches against the real binary: `WatchDir` (a Connect server stream read
//! here envelope by envelope) and `CreateWatcher`/`GetWatcherEvents`/`RemoveWatcher`, as the
//! SDKs call them; the kernel's watches observed through `/proc/<pid>/fdinfo`.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::connect::{self, Stream, AS_USER, WAIT};
use crate::common::{start, Daemon, Reply, TOKEN};
use serde_json::{json, Value};

fn rpc(daemon: &Daemon, method: &str, body: Value) -> Reply {
    let procedure = format!("filesystem.Filesystem/{method}");
    connect::unary(daemon, &procedure, &[("Authorization", AS_USER)], &body)
}

/// A WatchDir call as the SDKs make it (as `user`), read envelope by envelope.
fn open_watch(daemon: &Daemon, request: Value, headers: &[(&str, &str)]) -> Stream {
    let mut all = vec![("Authorization", AS_USER)];
    all.extend_from_slice(headers);
    Stream::open(daemon, "filesystem.Filesystem/WatchDir", &request, &all)
}

/// The filesystem events until `expected` (type, name) pairs were all seen in order
/// (keep-alives skipped); panics on the end of the stream or after 10 s.
fn events_until(watch: &mut Stream, expected: &[(&str, &str)]) -> Vec<Value> {
    let mut seen = Vec::new();
    let mut want = expected.iter().peekable();
    let deadline = Instant::now() + WAIT;
    while want.peek().is_some() {
        let left = deadline.saturating_duration_since(Instant::now());
        let Some(message) = watch.next_within(left) else {
            panic!("expected {:?}, saw {seen:?}", want.collect::<Vec<_>>());
        };
        assert!(!message.end, "the stream ended: {message:?}; saw {seen:?}");
        let Some(event) = message.json.get("filesystem") else {
            continue;
        };
        let (kind, name) = (
            event["type"].as_str().unwrap(),
            event["name"].as_str().unwrap(),
        );
        if want.peek().is_some_and(|(k, n)| *k == kind && *n == name) {
            want.next();
        }
        seen.push(event.clone());
    }
    seen
}

fn assert_start(watch: &mut Stream) {
    assert_eq!(watch.status, 200);
    assert_eq!(
        watch.header("content-type"),
        Some("application/connect+json")
    );
    let first = watch.next();
    assert_eq!(first.json, json!({"start": {}}), "{first:?}");
}

/// The end-of-stream message's error (code and message), skipping the events before it; and
/// how many events there were.
fn end_error(watch: &mut Stream, limit: Duration) -> (String, String, usize) {
    let deadline = Instant::now() + limit;
    let mut events = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = watch.next_within(left).expect("the end of the stream");
        if message.end {
            let error = &message.json["error"];
            let text = |v: &Value| v.as_str().unwrap_or("none").to_string();
            return (text(&error["code"]), text(&error["message"]), events);
        }
        events += 1;
    }
}

/// The kernel watches of the daemon's inotify instances, one per watch, all together
/// (`None`: it has none).
pub fn inotify_watches(daemon: &Daemon) -> Option<usize> {
    let fds = Path::new("/proc").join(daemon.pid().to_string());
    let mut total = None;
    for entry in std::fs::read_dir(fds.join("fd")).ok()? {
        let Ok(entry) = entry else { continue };
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        if target.to_string_lossy() == "anon_inode:inotify" {
            let Ok(info) = std::fs::read_to_string(fds.join("fdinfo").join(entry.file_name()))
            else {
                continue;
            };
            let watches = info
                .lines()
                .filter(|l| l.starts_with("inotify wd:"))
                .count();
            total = Some(total.unwrap_or(0) + watches);
        }
    }
    total
}

pub fn wait_for_watches(daemon: &Daemon, expected: usize) {
    let deadline = Instant::now() + WAIT;
    while inotify_watches(daemon).unwrap_or(0) != expected {
        assert!(
            Instant::now() < deadline,
            "{:?} kernel watches, expected {expected}",
            inotify_watches(daemon)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn rss_kib(daemon: &Daemon, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn watch_dir_streams_start_then_create_write_chmod_rename_remove() {
    let daemon = start();
    let dir = daemon.home().join("watched");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let mut watch = open_watch(&daemon, json!({"path": "watched"}), &[]);
    assert_start(&mut watch);

    std::fs::write(dir.join("a.txt"), b"hello").unwrap();
    std::fs::set_permissions(
        dir.join("a.txt"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    std::fs::rename(dir.join("a.txt"), dir.join("b.txt")).unwrap();
    std::fs::write(dir.join("sub/not-recursive"), b"").unwrap();
    std::fs::remove_file(dir.join("b.txt")).unwrap();
    let seen = events_until(
        &mut watch,
        &[
            ("EVENT_TYPE_CREATE", "a.txt"),
            ("EVENT_TYPE_WRITE", "a.txt"),
            ("EVENT_TYPE_CHMOD", "a.txt"),
            ("EVENT_TYPE_RENAME", "a.txt"),
            ("EVENT_TYPE_CREATE", "b.txt"),
            ("EVENT_TYPE_REMOVE", "b.txt"),
        ],
    );
    assert!(
        !seen
            .iter()
            .any(|e| e["name"].as_str().unwrap().contains("not-recursive")),
        "{seen:?}"
    );
    assert!(seen.iter().all(|e| e.get("entry").is_none()), "{seen:?}");
    common::assert_health_within(&daemon, Duration::from_secs(2));
}

#[test]
fn a_recursive_watch_sees_nested_changes_and_new_directories() {
    let daemon = start();
    let dir = daemon.home().join("tree");
    std::fs::create_dir_all(dir.join("old/deep")).unwrap();
    let mut watch = open_watch(&daemon, json!({"path": "tree", "recursive": true}), &[]);
    assert_start(&mut watch);
    assert_eq!(inotify_watches(&daemon), Some(3));
    std::fs::write(dir.join("old/deep/f"), b"").unwrap();
    std::fs::create_dir_all(dir.join("new/a/b")).unwrap();
    events_until(
        &mut watch,
        &[
            ("EVENT_TYPE_CREATE", "old/deep/f"),
            ("EVENT_TYPE_CREATE", "new"),
            ("EVENT_TYPE_CREATE", "new/a"),
            ("EVENT_TYPE_CREATE", "new/a/b"),
        ],
    );
    std::fs::write(dir.join("new/a/b/late.txt"), b"x").unwrap();
    std::fs::remove_dir_all(dir.join("old")).unwrap();
    events_until(
        &mut watch,
        &[
            ("EVENT_TYPE_CREATE", "new/a/b/late.txt"),
            ("EVENT_TYPE_WRITE", "new/a/b/late.txt"),
            ("EVENT_TYPE_REMOVE", "old/deep/f"),
            ("EVENT_TYPE_REMOVE", "old/deep"),
            ("EVENT_TYPE_REMOVE", "old"),
        ],
    );
    // tree, new, new/a, new/a/b
    wait_for_watches(&daemon, 4);
}

#[test]
fn include_entry_describes_creates_and_writes_but_not_removes() {
    let daemon = start();
    let home = daemon.home();
    let mut watch = open_watch(&daemon, json!({"path": "", "includeEntry": true}), &[]);
    assert_start(&mut watch);
    std::fs::write(home.join("e.txt"), b"12345").unwrap();
    std::fs::remove_file(home.join("e.txt")).unwrap();
    let seen = events_until(
        &mut watch,
        &[
            ("EVENT_TYPE_CREATE", "e.txt"),
            ("EVENT_TYPE_REMOVE", "e.txt"),
        ],
    );
    let remove = seen
        .iter()
        .find(|e| e["type"] == "EVENT_TYPE_REMOVE")
        .unwrap();
    assert!(remove.get("entry").is_none(), "{remove}");
    // The create's entry was read after the file was gone, or before: best-effort.
    let create = &seen[0];
    if let Some(entry) = create.get("entry") {
        assert_eq!(entry["name"], "e.txt");
        assert_eq!(entry["path"], home.join("e.txt").to_str().unwrap());
        assert_eq!(entry["type"], "FILE_TYPE_FILE");
    }

    std::fs::write(home.join("kept.txt"), b"12345").unwrap();
    let seen = events_until(&mut watch, &[("EVENT_TYPE_WRITE", "kept.txt")]);
    let write = seen.last().unwrap();
    assert_eq!(write["entry"]["name"], "kept.txt");
    assert_eq!(write["entry"]["size"], "5");
}

#[test]
fn keepalives_come_at_the_interval_the_header_asks() {
    let daemon = start();
    // From before the stream opens: a load that delays the start event only makes the two
    // keep-alives (each at least the interval after the message before it) come later.
    let started = Instant::now();
    let mut watch = open_watch(
        &daemon,
        json!({"path": ""}),
        &[("Keepalive-Ping-Interval", "1")],
    );
    assert_start(&mut watch);
    for _ in 0..2 {
        let message = watch
            .next_within(Duration::from_secs(4))
            .expect("a keep-alive");
        assert_eq!(message.json, json!({"keepalive": {}}));
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(1900) && elapsed < Duration::from_secs(8),
        "two keep-alives in {elapsed:?}"
    );
}

#[test]
fn connect_timeout_ends_the_stream_with_deadline_exceeded() {
    let daemon = start();
    let mut watch = open_watch(
        &daemon,
        json!({"path": ""}),
        &[("Connect-Timeout-Ms", "300")],
    );
    assert_start(&mut watch);
    let started = Instant::now();
    assert_eq!(end_error(&mut watch, WAIT).0, "deadline_exceeded");
    assert!(started.elapsed() < Duration::from_secs(3));
    wait_for_watches(&daemon, 0);
}

#[test]
fn a_client_that_leaves_has_its_watch_dropped() {
    let daemon = start();
    std::fs::create_dir_all(daemon.home().join("a/b")).unwrap();
    let mut watch = open_watch(&daemon, json!({"path": "", "recursive": true}), &[]);
    assert_start(&mut watch);
    assert_eq!(inotify_watches(&daemon), Some(3));
    drop(watch);
    wait_for_watches(&daemon, 0);
    common::assert_health_within(&daemon, Duration::from_secs(2));
    // Another watch works as before.
    let mut watch = open_watch(&daemon, json!({"path": "a"}), &[]);
    assert_start(&mut watch);
    std::fs::write(daemon.home().join("a/f"), b"").unwrap();
    events_until(&mut watch, &[("EVENT_TYPE_CREATE", "f")]);
}

#[test]
fn a_client_that_does_not_read_is_ended_without_the_daemon_growing() {
    let daemon = start();
    let dir = daemon.home().join("busy");
    std::fs::create_dir(&dir).unwrap();
    let mut watch = open_watch(&daemon, json!({"path": "busy", "includeEntry": true}), &[]);
    let before = rss_kib(&daemon, "VmRSS:");
    // About 1 KiB per event with its entry: far more than the stream's 1 MiB queue and the
    // sockets' buffers hold.
    let long = "x".repeat(200);
    for i in 0..12_000 {
        std::fs::write(dir.join(format!("{long}-{i}")), b"").unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    let peak = rss_kib(&daemon, "VmHWM:");
    assert!(
        peak < before + 16 * 1024,
        "the daemon grew from {before} KiB to a peak of {peak} KiB"
    );
    // The client reads at last: the events that were queued, then the end.
    assert_start(&mut watch);
    let (code, message, events) = end_error(&mut watch, Duration::from_secs(30));
    assert_eq!(code, "resource_exhausted", "{message}");
    assert!(message.contains("not reading fast enough"), "{message}");
    eprintln!("{events} events queued, then: {message}; peak {peak} KiB from {before} KiB");
    assert!((1000..12_000).contains(&events), "{events} events");
    wait_for_watches(&daemon, 0);
    common::assert_health_within(&daemon, Duration::from_secs(2));
}

#[test]
fn missing_and_non_directory_paths_end_the_stream_with_envds_codes() {
    let daemon = start();
    std::fs::write(daemon.home().join("file"), b"").unwrap();
    for (path, code) in [("missing", "not_found"), ("file", "invalid_argument")] {
        let mut watch = open_watch(&daemon, json!({"path": path}), &[]);
        // connect-es reads only the status of a streaming call that is not 200: the error
        // travels in the end-of-stream message.
        assert_eq!(watch.status, 200, "{path}");
        let message = watch.next();
        assert!(message.end, "{message:?}");
        assert_eq!(message.json["error"]["code"], code, "{message:?}");
        let text = message.json["error"]["message"].as_str().unwrap();
        assert!(text.contains(path), "{text}");
    }
    // As a unary call, WatchDir is refused from its head.
    let reply = rpc(&daemon, "WatchDir", json!({"path": ""}));
    assert_eq!(reply.status, 501, "{}", reply.text());
    assert_eq!(inotify_watches(&daemon).unwrap_or(0), 0);
}

#[test]
fn watchers_keep_events_until_asked_and_are_removed() {
    let daemon = start();
    let dir = daemon.home().join("polled");
    std::fs::create_dir(&dir).unwrap();
    let reply = rpc(
        &daemon,
        "CreateWatcher",
        json!({"path": "polled", "includeEntry": true}),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    let id = reply.json()["watcherId"].as_str().unwrap().to_string();
    assert!(id.len() >= 33 && id.starts_with('w'), "{id}");

    std::fs::write(dir.join("one"), b"1").unwrap();
    std::fs::remove_file(dir.join("one")).unwrap();
    let mut events = Vec::new();
    let deadline = Instant::now() + WAIT;
    while !events
        .iter()
        .any(|e: &Value| e["type"] == "EVENT_TYPE_REMOVE")
    {
        assert!(Instant::now() < deadline, "{events:?}");
        let reply = rpc(&daemon, "GetWatcherEvents", json!({"watcherId": id}));
        assert_eq!(reply.status, 200, "{}", reply.text());
        events.extend(reply.json()["events"].as_array().unwrap().iter().cloned());
        std::thread::sleep(Duration::from_millis(50));
    }
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["EVENT_TYPE_CREATE", "EVENT_TYPE_WRITE", "EVENT_TYPE_REMOVE"],
        "{events:?}"
    );
    assert!(events.iter().all(|e| e["name"] == "one"));
    // Drained: asked again, nothing new.
    let reply = rpc(&daemon, "GetWatcherEvents", json!({"watcherId": id}));
    assert_eq!(reply.json()["events"], json!([]));
    assert_eq!(inotify_watches(&daemon), Some(1));

    let reply = rpc(&daemon, "RemoveWatcher", json!({"watcherId": id}));
    assert_eq!((reply.status, reply.json()), (200, json!({})));
    wait_for_watches(&daemon, 0);
    for method in ["GetWatcherEvents", "RemoveWatcher"] {
        let reply = rpc(&daemon, method, json!({"watcherId": id}));
        assert_eq!(reply.status, 404, "{method}: {}", reply.text());
        assert_eq!(reply.json()["code"], "not_found");
        assert_eq!(
            reply.json()["message"],
            format!("watcher with id {id} not found")
        );
    }
}

#[test]
fn create_watcher_refuses_what_envd_refuses() {
    let daemon = start();
    std::fs::write(daemon.home().join("file"), b"").unwrap();
    let reply = rpc(&daemon, "CreateWatcher", json!({"path": "missing"}));
    assert_eq!(
        (reply.status, reply.json()["code"].as_str()),
        (404, Some("not_found"))
    );
    let reply = rpc(&daemon, "CreateWatcher", json!({"path": "file"}));
    assert_eq!(
        (reply.status, reply.json()["code"].as_str()),
        (400, Some("invalid_argument"))
    );
    let reply = rpc(&daemon, "GetWatcherEvents", json!({"watcherId": "wnope"}));
    assert_eq!(
        (reply.status, reply.json()["code"].as_str()),
        (404, Some("not_found"))
    );
    // Authentication first, as on every method.
    let reply = daemon.call_with(
        "POST",
        "/filesystem.Filesystem/CreateWatcher",
        &[("Content-Type", "application/json")],
        b"{}",
    );
    assert_eq!(reply.status, 401);
}

#[test]
fn a_stream_ends_with_unavailable_when_the_daemon_stops_and_does_not_hold_the_drain() {
    let mut daemon = start();
    let mut watch = open_watch(&daemon, json!({"path": ""}), &[]);
    assert_start(&mut watch);
    let stopping = Instant::now();
    daemon.signal("TERM");
    let (code, message, _) = end_error(&mut watch, WAIT);
    assert_eq!(code, "unavailable", "{message}");
    let status = daemon.wait(WAIT).expect("the daemon exits");
    assert!(status.success(), "{status:?}");
    // The default drain timeout is 10 s: the stream ended well before it.
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "{:?}",
        stopping.elapsed()
    );
}

#[test]
fn uploads_show_as_create_chmod_and_write_of_their_name_never_as_temporaries() {
    let daemon = start();
    let dir = daemon.home().join("up");
    std::fs::create_dir_all(&dir).unwrap();
    let mut watch = open_watch(&daemon, json!({"path": "up"}), &[]);
    assert_start(&mut watch);
    let upload = |body: &[u8]| {
        let reply = daemon.call_with(
            "POST",
            "/files?path=up/a.txt&username=user",
            &[("X-Access-Token", TOKEN)],
            body,
        );
        assert_eq!(reply.status, 200, "{}", reply.text());
    };
    // A new file, then the same name replaced (a temporary renamed over it underneath), then a
    // new file by multipart (placed from a temporary name), then a marker made by hand so that
    // everything before it has been delivered.
    upload(b"one");
    upload(b"two");
    let body = b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"up/m.txt\"\r\n\r\nm\r\n--b--\r\n";
    let reply = daemon.call_with(
        "POST",
        "/files?username=user",
        &[
            ("X-Access-Token", TOKEN),
            ("Content-Type", "multipart/form-data; boundary=b"),
        ],
        body,
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    std::fs::write(dir.join("marker"), b"").unwrap();
    // As envd's in-place writes show them: a new file created, its owner set, written; a
    // replaced one only the last two. No temporary, no rename, no remove.
    let expected = [
        ("EVENT_TYPE_CREATE", "a.txt"),
        ("EVENT_TYPE_CHMOD", "a.txt"),
        ("EVENT_TYPE_WRITE", "a.txt"),
        ("EVENT_TYPE_CHMOD", "a.txt"),
        ("EVENT_TYPE_WRITE", "a.txt"),
        ("EVENT_TYPE_CREATE", "m.txt"),
        ("EVENT_TYPE_CHMOD", "m.txt"),
        ("EVENT_TYPE_WRITE", "m.txt"),
        ("EVENT_TYPE_CREATE", "marker"),
    ];
    let seen = events_until(&mut watch, &expected);
    let names: Vec<(&str, &str)> = seen
        .iter()
        .map(|e| (e["type"].as_str().unwrap(), e["name"].as_str().unwrap()))
        .collect();
    assert_eq!(names, expected);
}

#[test]
fn a_directory_arriving_whole_reports_its_files_data_as_written() {
    let daemon = start();
    let dir = daemon.home().join("tree");
    std::fs::create_dir_all(&dir).unwrap();
    let outside = daemon.home().join("outside");
    std::fs::create_dir_all(outside.join("inner")).unwrap();
    std::fs::write(outside.join("inner/data.txt"), b"written before the watch").unwrap();
    std::fs::write(outside.join("inner/empty"), b"").unwrap();
    let mut watch = open_watch(&daemon, json!({"path": "tree", "recursive": true}), &[]);
    assert_start(&mut watch);
    // Moved in whole: its files were written where no watch could see them.
    std::fs::rename(&outside, dir.join("moved")).unwrap();
    std::fs::write(dir.join("marker"), b"").unwrap();
    let seen = events_until(
        &mut watch,
        &[
            ("EVENT_TYPE_CREATE", "moved/inner/data.txt"),
            ("EVENT_TYPE_WRITE", "moved/inner/data.txt"),
            ("EVENT_TYPE_CREATE", "marker"),
        ],
    );
    let empty_writes = seen
        .iter()
        .filter(|e| e["name"] == "moved/inner/empty" && e["type"] == "EVENT_TYPE_WRITE")
        .count();
    assert_eq!(empty_writes, 0, "an empty file holds no write: {seen:?}");
}

#[test]
fn an_unpacked_archive_shows_as_uploads_of_each_of_its_files_and_directories() {
    let daemon = start();
    let dir = daemon.home().join("tree");
    std::fs::create_dir_all(dir.join("old")).unwrap();
    let mut watch = open_watch(&daemon, json!({"path": "tree", "recursive": true}), &[]);
    assert_start(&mut watch);
    let body = crate::archive::archive(&[
        ("new/", b'5', &b""[..], ""),
        ("new/a/x", b'0', &b"data"[..], ""),
        ("old/f", b'0', &b"more"[..], ""),
    ]);
    let reply = daemon.call_with(
        "POST",
        "/files?path=tree&format=tar&username=user",
        &[("X-Access-Token", TOKEN)],
        &body,
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    let seen = events_until(
        &mut watch,
        &[
            ("EVENT_TYPE_CREATE", "new"),
            ("EVENT_TYPE_CREATE", "new/a"),
            ("EVENT_TYPE_CREATE", "new/a/x"),
            ("EVENT_TYPE_WRITE", "new/a/x"),
            ("EVENT_TYPE_CREATE", "old/f"),
            ("EVENT_TYPE_CHMOD", "old/f"),
            ("EVENT_TYPE_WRITE", "old/f"),
        ],
    );
    assert!(
        seen.iter()
            .all(|e| !e["name"].as_str().unwrap().contains(".sandboxd-")),
        "{seen:?}"
    );
    // tree, old, new, new/a
    wait_for_watches(&daemon, 4);
}
