//! Directory watches across `POST /upgrade` (issue 27, part "watchers"): a `CreateWatcher`
//! watcher keeps its id, its waiting events and its inotify instance (so an event made while
//! neither image reads is delivered once), and a `WatchDir` stream ends with `unavailable`
//! without holding the drain.

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::connect::{self, Stream, AS_USER, WAIT};
use crate::common::{self, builder, Daemon, TOKEN};
use crate::filesystem_watch::{inotify_watches, wait_for_watches};

/// A daemon that can be upgraded, `/init` done, with a drain timeout far longer than any wait
/// of these tests: an upgrade that waited for it would be seen not to take over.
fn daemon(dir: &Path) -> Daemon {
    let daemon = builder()
        .arg("--upgrade-path")
        .arg(dir.join("envd.next").to_str().unwrap())
        .args(&["--drain-timeout", "600"])
        .start();
    let reply = daemon.call("POST", "/init", b"{}");
    assert_eq!(reply.status, 204, "{}", reply.text());
    daemon
}

fn rpc(daemon: &Daemon, method: &str, body: Value) -> Value {
    let procedure = format!("filesystem.Filesystem/{method}");
    let reply = connect::unary(daemon, &procedure, &[("Authorization", AS_USER)], &body);
    assert_eq!(reply.status, 200, "{method}: {}", reply.text());
    reply.json()
}

/// Upgrades to the running binary, the `upgrades`-th time; returns once the new image took
/// the state back.
fn upgrade(daemon: &Daemon, upgrades: usize) {
    let answer = post_upgrade(daemon.addr);
    assert_eq!(
        answer, "",
        "no answer: the connection closes with the execve"
    );
    took_back(daemon, upgrades);
}

/// Sends `POST /upgrade` (the running binary); what came back (nothing: the `execve` closed it).
fn post_upgrade(addr: std::net::SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    let head = format!(
        "POST /upgrade HTTP/1.1\r\nHost: t\r\nConnection: close\r\nX-Access-Token: {TOKEN}\r\nContent-Length: 0\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

/// Waits until the `upgrades`-th new image took the state back.
fn took_back(daemon: &Daemon, upgrades: usize) {
    let deadline = Instant::now() + WAIT;
    let took_back = |daemon: &Daemon| {
        let log = daemon.log();
        log.iter()
            .filter(|l| l.contains("upgrade: took back"))
            .count()
    };
    while took_back(daemon) < upgrades {
        assert!(Instant::now() < deadline, "{:?}", daemon.log());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The next `/init`'s `X-Envd-Handover`.
fn handover(daemon: &Daemon) -> String {
    let reply = daemon.call("POST", "/init", b"{}");
    assert_eq!(reply.status, 204, "{}", reply.text());
    reply
        .header("x-envd-handover")
        .unwrap_or("none")
        .to_string()
}

fn outcome(watchers: usize, failed: usize) -> String {
    format!(
        r#"{{"failed":false,"procs":0,"procs_failed":0,"retained":0,"retained_failed":0,"watchers":{watchers},"watchers_failed":{failed}}}"#
    )
}

fn create_watcher(daemon: &Daemon, request: Value) -> String {
    let reply = rpc(daemon, "CreateWatcher", request);
    reply["watcherId"].as_str().unwrap().to_string()
}

/// The watcher's events until one named `last` came, as (type, name), and the events.
fn events_until(daemon: &Daemon, id: &str, last: &str) -> (Vec<(String, String)>, Vec<Value>) {
    let deadline = Instant::now() + WAIT;
    let mut events: Vec<Value> = Vec::new();
    while !events.iter().any(|e| e["name"] == last) {
        assert!(Instant::now() < deadline, "{events:?}");
        let reply = rpc(daemon, "GetWatcherEvents", json!({"watcherId": id}));
        events.extend(reply["events"].as_array().unwrap().iter().cloned());
        std::thread::sleep(Duration::from_millis(20));
    }
    let pairs = events
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap().into(),
                e["name"].as_str().unwrap().into(),
            )
        })
        .collect();
    (pairs, events)
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(kind, name)| (format!("EVENT_TYPE_{kind}"), name.to_string()))
        .collect()
}

#[test]
fn a_watcher_keeps_its_id_and_events_and_gets_what_happened_during_the_swap_once() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = daemon(dir.path());
    let pid = daemon.pid();
    let polled = daemon.home().join("polled");
    std::fs::create_dir(&polled).unwrap();
    let id = create_watcher(&daemon, json!({"path": "polled"}));
    std::fs::File::create(polled.join("before")).unwrap();
    // Most likely read by the old image by now (then carried in its buffer), else still in the
    // kernel's queue: either way delivered once.
    std::thread::sleep(Duration::from_millis(200));
    // An upload under way holds the drain: the old image has stopped reading, the new one has
    // not started, while the event below is made.
    let mut held = daemon.connect();
    write!(
        held,
        "POST /files?path=held.bin HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: 10\r\n\r\n12345"
    )
    .unwrap();
    let addr = daemon.addr;
    let upgrading = std::thread::spawn(move || post_upgrade(addr));
    daemon.log_with(|line| line.contains("upgrade: draining before executing"));
    std::fs::File::create(polled.join("during")).unwrap();
    held.write_all(b"67890").unwrap();
    let reply = common::read_reply(&mut BufReader::new(held), false).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(upgrading.join().unwrap(), "");
    took_back(&daemon, 1);
    assert_eq!(handover(&daemon), outcome(1, 0));
    assert_eq!(daemon.pid(), pid);
    let (seen, _) = events_until(&daemon, &id, "during");
    assert_eq!(seen, pairs(&[("CREATE", "before"), ("CREATE", "during")]));
    std::fs::remove_file(polled.join("before")).unwrap();
    let (seen, _) = events_until(&daemon, &id, "before");
    assert_eq!(seen, pairs(&[("REMOVE", "before")]));
    assert_eq!(inotify_watches(&daemon), Some(1));
    rpc(&daemon, "RemoveWatcher", json!({"watcherId": id}));
    wait_for_watches(&daemon, 0);
}

#[test]
fn a_recursive_watcher_follows_new_directories_and_describes_entries_after_the_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = daemon(dir.path());
    let tree = daemon.home().join("tree");
    std::fs::create_dir_all(tree.join("old")).unwrap();
    let id = create_watcher(
        &daemon,
        json!({"path": "tree", "recursive": true, "includeEntry": true}),
    );
    std::fs::File::create(tree.join("old/pre")).unwrap();
    let (_, before) = events_until(&daemon, &id, "old/pre");
    upgrade(&daemon, 1);
    // A directory arriving whole (its entry listed once it is watched), then an entry made in
    // it once it is watched: each reported once.
    let stage = daemon.home().join("stage");
    std::fs::create_dir_all(stage.join("new")).unwrap();
    std::fs::File::create(stage.join("new/f")).unwrap();
    std::fs::rename(stage.join("new"), tree.join("old/new")).unwrap();
    let (seen, after) = events_until(&daemon, &id, "old/new/f");
    assert_eq!(
        seen,
        pairs(&[("CREATE", "old/new"), ("CREATE", "old/new/f")])
    );
    std::fs::File::create(tree.join("old/new/g")).unwrap();
    let (seen, _) = events_until(&daemon, &id, "old/new/g");
    assert_eq!(seen, pairs(&[("CREATE", "old/new/g")]));
    // Described as before: the owners' names come from the same passwd file.
    let entry = &after[1]["entry"];
    assert_eq!(entry["name"], "f");
    assert_eq!(entry["owner"], before[0]["entry"]["owner"]);
    assert_eq!(entry["group"], before[0]["entry"]["group"]);
    assert_eq!(handover(&daemon), outcome(1, 0));
}

/// A `WatchDir` stream of the home directory, once started.
fn watch_home(daemon: &Daemon) -> Stream {
    let request = json!({"path": ""});
    let auth = [("Authorization", AS_USER)];
    let mut watch = Stream::open(daemon, "filesystem.Filesystem/WatchDir", &request, &auth);
    assert_eq!(watch.next().json, json!({"start": {}}));
    watch
}

#[test]
fn a_watch_dir_stream_ends_unavailable_at_the_upgrade_and_does_not_hold_the_drain() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = daemon(dir.path());
    let mut watch = watch_home(&daemon);
    // The drain timeout is 600 s: `upgrade` sees the new image take over well before.
    upgrade(&daemon, 1);
    let end = loop {
        let message = watch.next();
        if message.end {
            break message;
        }
    };
    assert_eq!(
        end.json["error"],
        json!({"code": "unavailable", "message": "sandboxd is upgrading: call WatchDir again"})
    );
    assert!(!daemon.log().iter().any(|l| l.contains("drain timeout")));
    assert_eq!(handover(&daemon), outcome(0, 0));
    // Called again, it watches in the new image.
    let mut again = watch_home(&daemon);
    std::fs::File::create(daemon.home().join("new")).unwrap();
    let event = again.next();
    assert_eq!(event.json["filesystem"]["name"], "new", "{event:?}");
}

#[test]
fn descriptors_and_threads_are_the_same_after_ten_upgrades_with_a_watcher_as_after_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = daemon(dir.path());
    let polled = daemon.home().join("polled");
    std::fs::create_dir(&polled).unwrap();
    let id = create_watcher(&daemon, json!({"path": "polled"}));
    let descriptors = |daemon: &Daemon| {
        // What each names, sockets left out: a connection of the test may not be closed yet.
        let fds = std::fs::read_dir(format!("/proc/{}/fd", daemon.pid())).unwrap();
        let mut names: Vec<String> = fds
            .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
            .map(|target| target.display().to_string())
            .filter(|target| !target.starts_with("socket:"))
            .collect();
        names.sort();
        names
    };
    let threads = |daemon: &Daemon| {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", daemon.pid())).unwrap();
        tasks.count()
    };
    upgrade(&daemon, 1);
    assert_eq!(handover(&daemon), outcome(1, 0));
    let after_first = (descriptors(&daemon), threads(&daemon));
    for upgrades in 2..=10 {
        std::fs::File::create(polled.join(format!("f{upgrades}"))).unwrap();
        upgrade(&daemon, upgrades);
    }
    assert_eq!(handover(&daemon), outcome(1, 0));
    assert_eq!((descriptors(&daemon), threads(&daemon)), after_first);
    assert_eq!(inotify_watches(&daemon), Some(1));
    let (seen, _) = events_until(&daemon, &id, "f10");
    let expected: Vec<String> = (2..=10).map(|n| format!("f{n}")).collect();
    let names: Vec<String> = seen.into_iter().map(|(_, name)| name).collect();
    assert_eq!(names, expected);
}

#[test]
fn a_watcher_that_failed_before_the_upgrade_answers_the_same_error_after() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = daemon(dir.path());
    let flood = daemon.home().join("flood");
    std::fs::create_dir(&flood).unwrap();
    let id = create_watcher(&daemon, json!({"path": "flood"}));
    let procedure = "filesystem.Filesystem/GetWatcherEvents";
    let ask = |daemon: &Daemon| {
        let body = json!({"watcherId": id});
        connect::unary(daemon, procedure, &[("Authorization", AS_USER)], &body)
    };
    let deadline = Instant::now() + WAIT;
    let mut made = 0;
    let failed = loop {
        // One event more than a watcher holds: it fails (unless asked before all were read:
        // then again).
        for n in made..=made + 10_000 {
            std::fs::File::create(flood.join(n.to_string())).unwrap();
        }
        made += 10_001;
        let reply = ask(&daemon);
        if reply.status != 200 {
            break reply.json();
        }
        assert!(Instant::now() < deadline, "{}", reply.text());
    };
    assert_eq!(failed["code"], "resource_exhausted", "{failed}");
    upgrade(&daemon, 1);
    assert_eq!(handover(&daemon), outcome(1, 0));
    assert_eq!(ask(&daemon).json(), failed);
    assert_eq!(inotify_watches(&daemon), None);
    rpc(&daemon, "RemoveWatcher", json!({"watcherId": id}));
}

#[test]
fn waiting_events_past_the_handovers_room_refuse_the_upgrade_until_fetched() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = daemon(dir.path());
    let full = daemon.home().join("full");
    std::fs::create_dir(&full).unwrap();
    // Ten watchers of 5,000 events with 200-byte names: about 1 MB each encoded (2.6 MB in
    // memory, under a watcher's 4 MiB), 10 MB in all, past the 8 MiB the handover carries.
    let ids: Vec<String> = (0..10)
        .map(|_| create_watcher(&daemon, json!({"path": "full"})))
        .collect();
    let long = "n".repeat(195);
    for n in 0..5_000 {
        std::fs::File::create(full.join(format!("{long}{n:05}"))).unwrap();
    }
    let last = format!("{long}04999");
    let deadline = Instant::now() + WAIT;
    let mut upgrades = 0;
    let answer = loop {
        let answer = post_upgrade(daemon.addr);
        if !answer.is_empty() {
            break answer;
        }
        // Asked before the events were read (they waited in the kernel's queues, carried):
        // the upgrade happened, and the new image reads them.
        upgrades += 1;
        took_back(&daemon, upgrades);
        assert!(Instant::now() < deadline, "never refused");
    };
    // Refused when asked (409), or, when events were still being read then, once they were
    // all read and the handover written (500): either way before anything changed.
    let refused = answer.starts_with("HTTP/1.1 409")
        && answer.contains("cannot upgrade now: the watchers' waiting events take ");
    let failed = answer.starts_with("HTTP/1.1 500")
        && answer.contains(
            "upgrade failed: cannot write the handover: the watchers' waiting events take ",
        );
    assert!(refused || failed, "{answer}");
    assert!(
        answer.contains("KiB, more than the 8 MiB a handover carries; fetch them (GetWatcherEvents) or remove watchers, then upgrade again"),
        "{answer}"
    );
    assert!(daemon.get("/health").status == 204);
    // Fetched from half of them, the rest fits: all ten cross.
    for id in &ids[..5] {
        events_until(&daemon, id, &last);
    }
    upgrade(&daemon, upgrades + 1);
    assert_eq!(handover(&daemon), outcome(10, 0));
    let (seen, _) = events_until(&daemon, &ids[9], &last);
    assert_eq!(seen.len(), 5_000);
}
