//! Processes across `POST /upgrade` (SPEC §9c): they keep their pids, tags and terminals; a
//! stream open at the upgrade ends with `unavailable` after every byte read before, and a
//! `Connect` to the next image gets the rest, nothing lost or told twice; exits that come
//! during the swap, and those remembered before it, are told.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::connect::{unary, Stream};
use crate::common::{Daemon, TOKEN};
use crate::upgrade::{daemon_upgrading_into, init, own_binary, upgrade};

fn b64(bytes: &[u8]) -> String {
    base64_simd::STANDARD.encode_to_string(bytes)
}

fn unb64(text: &str) -> Vec<u8> {
    base64_simd::STANDARD.decode_to_vec(text).unwrap()
}

/// Upgrades to the running binary and waits until the new image has taken over (the
/// `took over` line number `n`, counting from 1).
fn upgrade_to_self(daemon: &Daemon, n: usize) {
    assert_eq!(
        upgrade(daemon, TOKEN, &[], b""),
        "",
        "the connection closes"
    );
    wait_for_takeovers(daemon, n);
}

fn wait_for_takeovers(daemon: &Daemon, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while daemon
        .log()
        .iter()
        .filter(|l| l.contains("upgrade: took over from"))
        .count()
        < n
    {
        assert!(Instant::now() < deadline, "{:#?}", daemon.log());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What a stream told until its end: output by kind, the end event (if any) and the
/// end-of-stream error (if any).
#[derive(Default, Debug)]
struct Told {
    stdout: Vec<u8>,
    pty: Vec<u8>,
    end: Option<Value>,
    error: Option<(String, String)>,
}

impl Told {
    /// Reads one message into `self`; false at the end of the stream.
    fn take(&mut self, stream: &mut Stream) -> bool {
        let message = stream.next();
        if message.end {
            self.error = Stream::end_error(&message);
            return false;
        }
        let event = &message.json["event"];
        if let Some(data) = event.get("data") {
            if let Some(text) = data["stdout"].as_str() {
                self.stdout.extend(unb64(text));
            }
            if let Some(text) = data["pty"].as_str() {
                self.pty.extend(unb64(text));
            }
        }
        if let Some(end) = event.get("end") {
            self.end = Some(end.clone());
        }
        true
    }

    fn until_end(mut self, stream: &mut Stream) -> Told {
        while self.take(stream) {}
        self
    }
}

fn start(daemon: &Daemon, request: Value) -> (Stream, u32) {
    let mut stream = Stream::open(daemon, "process.Process/Start", &request, &[]);
    let first = stream.next();
    let pid = first.json["event"]["start"]["pid"].as_u64().unwrap();
    (stream, u32::try_from(pid).unwrap())
}

fn connect(daemon: &Daemon, pid: u32) -> Stream {
    let mut stream = Stream::open(
        daemon,
        "process.Process/Connect",
        &json!({"process": {"pid": pid}}),
        &[],
    );
    let first = stream.next();
    assert_eq!(first.json["event"]["start"]["pid"], pid, "{first:?}");
    stream
}

fn assert_upgrading_end(told: &Told) {
    let (code, message) = told.error.clone().expect("an end-of-stream error");
    assert_eq!(code, "unavailable");
    assert!(
        message.contains("sandboxd is being upgraded: the process lives on; Connect to it again"),
        "{message}"
    );
}

#[test]
fn a_streaming_command_loses_and_doubles_no_byte_across_three_upgrades() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = daemon_upgrading_into(dir.path());
    init(&daemon, json!({}));
    let script = "i=0; while [ $i -lt 1500 ]; do echo \"line $i\"; i=$((i+1)); \
                  case $i in *0) sleep 0.01;; esac; done";
    let (mut stream, pid) = start(
        &daemon,
        json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}, "tag": "counter"}),
    );
    let mut all = Vec::new();
    for round in 1..=3 {
        let mut told = Told::default();
        // Some output first, then the upgrade while it streams.
        while told.stdout.len() < 200 * round && told.take(&mut stream) {}
        assert!(told.end.is_none(), "ended too early: {told:?}");
        // The second time to a binary sent in the body as E2B's orchestrator sends it (this
        // build's, to envd's path, which means --upgrade-path), else to the running one.
        if round == 2 {
            let headers = [("X-Envd-Upgrade-Bin", "/usr/bin/envd.next")];
            assert_eq!(upgrade(&daemon, TOKEN, &headers, &own_binary()), "");
        } else {
            assert_eq!(upgrade(&daemon, TOKEN, &[], b""), "");
        }
        let told = told.until_end(&mut stream);
        assert_upgrading_end(&told);
        all.extend(told.stdout);
        wait_for_takeovers(&daemon, round);
        stream = connect(&daemon, pid);
    }
    let told = Told::default().until_end(&mut stream);
    assert_eq!(told.error, None);
    assert_eq!(told.end.as_ref().unwrap()["exitCode"], 0);
    assert_eq!(told.end.as_ref().unwrap()["status"], "exit status 0");
    all.extend(told.stdout);
    assert_eq!(
        std::fs::read(dir.path().join("envd.next")).unwrap(),
        own_binary(),
        "the binary went to --upgrade-path"
    );
    let expected: String = (0..1500).map(|i| format!("line {i}\n")).collect();
    assert_eq!(String::from_utf8(all).unwrap(), expected);
    let handover = daemon.call("POST", "/init", b"{}");
    assert_eq!(handover.status, 204);
    let header: Value = serde_json::from_str(handover.header("x-envd-handover").unwrap()).unwrap();
    assert_eq!(header["failed"], false);
    assert_eq!(header["procs"], 1);
    assert_eq!(header["procs_failed"], 0);
}

#[test]
fn output_and_an_exit_during_a_long_swap_are_told_to_the_next_connect() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = crate::common::builder()
        .arg("--upgrade-path")
        .arg(dir.path().join("envd.next").to_str().unwrap())
        .arg("--drain-timeout")
        .arg("1")
        .start();
    init(&daemon, json!({}));
    let (mut stream, pid) = start(
        &daemon,
        json!({"process": {"cmd": "/bin/sh", "args": ["-c", "echo before; sleep 0.4; echo during; exit 7"]}}),
    );
    let mut told = Told::default();
    while told.stdout.is_empty() && told.take(&mut stream) {}
    assert_eq!(told.stdout, b"before\n");
    // A request in flight (an upload whose body does not come) holds the drain for its
    // timeout, 1 s: the process writes and exits meanwhile, while nothing reads or reaps.
    let mut held = daemon.connect();
    std::io::Write::write_all(
        &mut held,
        format!(
            "POST /files?path=/tmp/held HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\n\
             Content-Type: application/octet-stream\r\nContent-Length: 100\r\n\r\nx"
        )
        .as_bytes(),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(upgrade(&daemon, TOKEN, &[], b""), "");
    let told = told.until_end(&mut stream);
    assert_upgrading_end(&told);
    assert_eq!(told.stdout, b"before\n");
    wait_for_takeovers(&daemon, 1);
    let mut stream = connect(&daemon, pid);
    let told = Told::default().until_end(&mut stream);
    assert_eq!(told.stdout, b"during\n");
    assert_eq!(told.end.unwrap()["exitCode"], 7);
    drop(held);
}

#[test]
fn a_terminal_session_stays_usable_across_an_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = daemon_upgrading_into(dir.path());
    init(&daemon, json!({}));
    let (mut stream, pid) = start(
        &daemon,
        json!({"process": {"cmd": "/bin/sh", "args": ["-i"], "envs": {"PS1": "$ "}},
               "pty": {"size": {"rows": 24, "cols": 80}}}),
    );
    let send = |text: &str| {
        let reply = unary(
            &daemon,
            "process.Process/SendInput",
            &[],
            &json!({"process": {"pid": pid}, "input": {"pty": b64(text.as_bytes())}}),
        );
        assert_eq!(reply.status, 200, "{}", reply.text());
    };
    send("echo before$((40+2))\n");
    let mut told = Told::default();
    while !String::from_utf8_lossy(&told.pty).contains("before42") && told.take(&mut stream) {}
    upgrade_to_self(&daemon, 1);
    let told = told.until_end(&mut stream);
    assert_upgrading_end(&told);
    let mut stream = connect(&daemon, pid);
    let resized = unary(
        &daemon,
        "process.Process/Update",
        &[],
        &json!({"process": {"pid": pid}, "pty": {"size": {"rows": 30, "cols": 100}}}),
    );
    assert_eq!(resized.status, 200, "{}", resized.text());
    send("stty size; echo after$((40+3))\n");
    let mut told = Told::default();
    while !String::from_utf8_lossy(&told.pty).contains("after43") && told.take(&mut stream) {}
    let text = String::from_utf8_lossy(&told.pty).into_owned();
    assert!(text.contains("30 100"), "{text}");
    send("exit\n");
    let told = told.until_end(&mut stream);
    assert_eq!(told.error, None);
    assert!(told.end.is_some());
}

#[test]
fn a_background_process_keeps_its_pid_and_tag_and_is_killed_after_the_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = daemon_upgrading_into(dir.path());
    init(&daemon, json!({}));
    let (stream, pid) = start(
        &daemon,
        json!({"process": {"cmd": "sleep", "args": ["300"], "envs": {"KEPT": "1"}, "cwd": "/tmp"},
               "tag": "background"}),
    );
    drop(stream);
    // A process that ended before the upgrade: its exit is remembered across it.
    let (mut done, done_pid) = start(&daemon, json!({"process": {"cmd": "true"}}));
    assert!(Told::default().until_end(&mut done).end.is_some());
    upgrade_to_self(&daemon, 1);
    let list = unary(&daemon, "process.Process/List", &[], &json!({}));
    assert_eq!(list.status, 200, "{}", list.text());
    let processes = list.json()["processes"].clone();
    assert_eq!(processes.as_array().unwrap().len(), 1, "{processes}");
    assert_eq!(processes[0]["pid"], pid);
    assert_eq!(processes[0]["tag"], "background");
    assert_eq!(processes[0]["config"]["cmd"], "sleep");
    assert_eq!(processes[0]["config"]["args"], json!(["300"]));
    assert_eq!(processes[0]["config"]["envs"], json!({"KEPT": "1"}));
    assert_eq!(processes[0]["config"]["cwd"], "/tmp");
    let mut remembered = connect(&daemon, done_pid);
    let told = Told::default().until_end(&mut remembered);
    assert_eq!(told.end.unwrap()["status"], "exit status 0");
    let killed = unary(
        &daemon,
        "process.Process/SendSignal",
        &[],
        &json!({"process": {"tag": "background"}, "signal": "SIGNAL_SIGKILL"}),
    );
    assert_eq!(killed.status, 200, "{}", killed.text());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let list = unary(&daemon, "process.Process/List", &[], &json!({}));
        if list.json()["processes"]
            .as_array()
            .is_none_or(Vec::is_empty)
        {
            break;
        }
        assert!(Instant::now() < deadline, "{}", list.text());
        std::thread::sleep(Duration::from_millis(20));
    }
    // Reaped by the new image: the pid is gone, not a zombie.
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    let mut ended = connect(&daemon, pid);
    let told = Told::default().until_end(&mut ended);
    assert_eq!(told.end.unwrap()["status"], "signal: killed");
    let header = daemon.call("POST", "/init", b"{}");
    let header: Value = serde_json::from_str(header.header("x-envd-handover").unwrap()).unwrap();
    assert_eq!(
        (
            &header["procs"],
            &header["retained"],
            &header["retained_failed"]
        ),
        (&json!(1), &json!(1), &json!(0))
    );
}

#[test]
fn descriptors_and_threads_stay_the_same_across_ten_upgrades_with_a_live_process() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = daemon_upgrading_into(dir.path());
    init(&daemon, json!({}));
    let (stream, pid) = start(
        &daemon,
        json!({"process": {"cmd": "sleep", "args": ["300"]}}),
    );
    drop(stream);
    let fds = |daemon: &Daemon| {
        std::fs::read_dir(format!("/proc/{}/fd", daemon.pid()))
            .unwrap()
            .count()
    };
    let threads = |daemon: &Daemon| {
        std::fs::read_dir(format!("/proc/{}/task", daemon.pid()))
            .unwrap()
            .count()
    };
    // Counted once the new image serves and its threads have started (they start as it
    // does, some after its first answer): the same counts for a while.
    let settled = |daemon: &Daemon| {
        assert_eq!(daemon.get("/health").status, 204);
        let mut last = (fds(daemon), threads(daemon));
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let now = (fds(daemon), threads(daemon));
            if now == last || Instant::now() > deadline {
                return now;
            }
            last = now;
        }
    };
    upgrade_to_self(&daemon, 1);
    let after_one = settled(&daemon);
    for n in 2..=10 {
        upgrade_to_self(&daemon, n);
    }
    assert_eq!(settled(&daemon), after_one, "(descriptors, threads)");
    let list = unary(&daemon, "process.Process/List", &[], &json!({}));
    assert_eq!(list.json()["processes"].as_array().unwrap().len(), 1);
    let killed = unary(
        &daemon,
        "process.Process/SendSignal",
        &[],
        &json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}),
    );
    assert_eq!(killed.status, 200);
}

#[test]
fn a_kill_9_of_the_new_image_right_after_the_exec_orphans_the_processes_it_carried() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = daemon_upgrading_into(dir.path());
    init(&daemon, json!({}));
    let (stream, pid) = start(
        &daemon,
        json!({"process": {"cmd": "sleep", "args": ["300"]}}),
    );
    drop(stream);
    let daemon_pid = daemon.pid();
    // The upgrade's connection closes with the execve: the new image is killed as it starts.
    assert_eq!(upgrade(&daemon, TOKEN, &[], b""), "");
    daemon.signal("KILL");
    assert!(daemon.wait(Duration::from_secs(10)).is_some());
    assert!(
        std::net::TcpStream::connect(daemon.addr).is_err(),
        "the listener died with it"
    );
    // What any kill -9 of the daemon does (SPEC §9c): its processes live on, orphaned, with
    // no daemon to tell their output or exit to.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let parent: i32 = status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_ne!(parent, daemon_pid);
    assert!(std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap()
        .success());
}
