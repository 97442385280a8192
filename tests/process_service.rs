//! envd's `process.Process` service against the real binary, in Connect JSON as the SDKs call
//! it: `Start` streams (start, data, end, keep-alives), exit codes and statuses, stdout and
//! stderr apart and in order, input and its end, `List`, `Connect`, signals, deadlines, the
//! caller's user, clients that leave, large output, many processes at once, and no zombie left.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::connect::{unary, Message, Stream, AS_USER, WAIT};
use crate::common::{root_or_skip, start, Daemon, USER_GID, USER_UID};

const START: &str = "process.Process/Start";

fn b64(bytes: &[u8]) -> String {
    base64_simd::STANDARD.encode_to_string(bytes)
}

fn unb64(text: &str) -> Vec<u8> {
    base64_simd::STANDARD.decode_to_vec(text).unwrap()
}

/// `Start` of `sh -c script`, with more request fields from `extra`.
fn sh(daemon: &Daemon, script: &str, extra: Value, headers: &[(&str, &str)]) -> Stream {
    let mut request = json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}});
    if let (Some(request), Some(extra)) = (request.as_object_mut(), extra.as_object()) {
        request.extend(extra.clone());
    }
    Stream::open(daemon, START, &request, headers)
}

/// What a process stream said, up to its end.
#[derive(Debug, Default)]
struct Run {
    pid: u64,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    pty: Vec<u8>,
    /// Data events in order: ("stdout" | "stderr" | "pty", bytes).
    events: Vec<(String, Vec<u8>)>,
    keepalives: usize,
    end: Option<Value>,
    /// The end-of-stream error, if any.
    error: Option<(String, String)>,
}

/// Reads a stream to its end (at most `limit`).
fn run_to_end(stream: &mut Stream, limit: Duration) -> Run {
    let mut run = Run::default();
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = stream
            .next_within(left)
            .unwrap_or_else(|| panic!("the stream did not end; so far {run:?}"));
        if message.end {
            run.error = Stream::end_error(&message);
            return run;
        }
        take(&mut run, &message);
    }
}

fn take(run: &mut Run, message: &Message) {
    let event = &message.json["event"];
    if let Some(start) = event.get("start") {
        run.pid = start["pid"].as_u64().unwrap();
    } else if let Some(data) = event.get("data") {
        let (kind, text) = data.as_object().unwrap().iter().next().unwrap();
        let bytes = unb64(text.as_str().unwrap());
        match kind.as_str() {
            "stdout" => run.stdout.extend_from_slice(&bytes),
            "stderr" => run.stderr.extend_from_slice(&bytes),
            "pty" => run.pty.extend_from_slice(&bytes),
            other => panic!("data of kind {other}"),
        }
        run.events.push((kind.clone(), bytes));
    } else if event.get("keepalive").is_some() {
        run.keepalives += 1;
    } else if let Some(end) = event.get("end") {
        run.end = Some(end.clone());
    } else {
        panic!("unknown event {message:?}");
    }
}

/// The start event's pid (the first message).
fn started(stream: &mut Stream) -> u64 {
    assert_eq!(stream.status, 200);
    assert_eq!(
        stream.header("content-type"),
        Some("application/connect+json")
    );
    let first = stream.next();
    assert!(!first.end, "ended at once: {first:?}");
    first.json["event"]["start"]["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("a start event first: {first:?}"))
}

fn list(daemon: &Daemon) -> Vec<Value> {
    let reply = unary(daemon, "process.Process/List", &[], &json!({}));
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()["processes"].as_array().unwrap().clone()
}

fn listed_pids(daemon: &Daemon) -> Vec<u64> {
    list(daemon)
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect()
}

/// A unary call's Connect error: (status, code, message).
fn error_of(reply: &crate::common::Reply) -> (u16, String, String) {
    let json = reply.json();
    (
        reply.status,
        json["code"].as_str().unwrap_or("").to_string(),
        json["message"].as_str().unwrap_or("").to_string(),
    )
}

/// Waits until `what` holds (10 s at most).
fn eventually(what: impl Fn() -> bool, context: &str) {
    let deadline = Instant::now() + WAIT;
    while !what() {
        assert!(Instant::now() < deadline, "{context}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The daemon's children that are zombies.
fn zombie_children(daemon: &Daemon) -> Vec<String> {
    let parent = daemon.pid().to_string();
    let mut zombies = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(1) == Some(&parent.as_str()) && fields.first() == Some(&"Z") {
            zombies.push(stat);
        }
    }
    zombies
}

#[test]
fn exit_codes_statuses_and_output_are_envds_events() {
    let daemon = start();
    let mut stream = sh(
        &daemon,
        "echo out; echo err >&2; exit 3",
        json!({}),
        &[("Authorization", AS_USER)],
    );
    let pid = started(&mut stream);
    let run = run_to_end(&mut stream, WAIT);
    assert_eq!(run.error, None);
    assert_eq!(run.stdout, b"out\n");
    assert_eq!(run.stderr, b"err\n");
    assert_eq!(
        run.end,
        Some(
            json!({"exitCode": 3, "exited": true, "status": "exit status 3",
                    "error": "exit status 3"})
        )
    );
    assert!(pid > 1);
    let mut stream = Stream::open(&daemon, START, &json!({"process": {"cmd": "true"}}), &[]);
    started(&mut stream);
    let run = run_to_end(&mut stream, WAIT);
    assert_eq!(
        run.end,
        Some(json!({"exitCode": 0, "exited": true, "status": "exit status 0"})),
        "no error for a clean exit"
    );
    let mut stream = sh(&daemon, "kill -9 $$", json!({}), &[]);
    started(&mut stream);
    let run = run_to_end(&mut stream, WAIT);
    assert_eq!(
        run.end,
        Some(
            json!({"exitCode": -1, "exited": false, "status": "signal: killed",
                    "error": "signal: killed"})
        )
    );
}

#[test]
fn stdout_and_stderr_stay_apart_each_in_its_order() {
    let daemon = start();
    let script = "i=0; while [ $i -lt 2000 ]; do echo o$i; echo e$i >&2; i=$((i+1)); done";
    let mut stream = sh(&daemon, script, json!({}), &[]);
    started(&mut stream);
    let run = run_to_end(&mut stream, WAIT);
    let expect = |prefix: &str| {
        (0..2000)
            .map(|i| format!("{prefix}{i}\n"))
            .collect::<String>()
    };
    assert_eq!(String::from_utf8(run.stdout).unwrap(), expect("o"));
    assert_eq!(String::from_utf8(run.stderr).unwrap(), expect("e"));
    assert_eq!(run.end.unwrap()["exitCode"], 0);
}

#[test]
fn stdin_by_send_input_and_close_stdin() {
    let daemon = start();
    let mut stream = Stream::open(
        &daemon,
        START,
        &json!({"process": {"cmd": "cat"}, "stdin": true, "tag": "cat"}),
        &[],
    );
    let pid = started(&mut stream);
    for (selector, text) in [
        (json!({"pid": pid}), "Hello, "),
        (json!({"tag": "cat"}), "World!"),
    ] {
        let reply = unary(
            &daemon,
            "process.Process/SendInput",
            &[],
            &json!({"process": selector, "input": {"stdin": b64(text.as_bytes())}}),
        );
        assert_eq!((reply.status, reply.json()), (200, json!({})));
    }
    // cat may read the two inputs in one read or two: only their order is asserted.
    let reply = unary(
        &daemon,
        "process.Process/CloseStdin",
        &[],
        &json!({"process": {"pid": pid}}),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    let run = run_to_end(&mut stream, WAIT);
    assert_eq!(run.stdout, b"Hello, World!");
    assert_eq!(run.end.unwrap()["exitCode"], 0);

    // Without stdin (the SDKs' default), input is refused as envd refuses it.
    let mut stream = Stream::open(
        &daemon,
        START,
        &json!({"process": {"cmd": "sleep", "args": ["5"]}, "stdin": false}),
        &[],
    );
    let pid = started(&mut stream);
    let reply = unary(
        &daemon,
        "process.Process/SendInput",
        &[],
        &json!({"process": {"pid": pid}, "input": {"stdin": b64(b"x")}}),
    );
    assert_eq!(
        error_of(&reply),
        (
            500,
            "internal".into(),
            "error writing to stdin: stdin not enabled or closed".into()
        )
    );
    let reply = unary(
        &daemon,
        "process.Process/SendInput",
        &[],
        &json!({"process": {"pid": pid}, "input": {"pty": b64(b"x")}}),
    );
    assert_eq!(reply.status, 500);
    assert!(error_of(&reply).2.contains("tty not assigned to process"));
}

#[test]
fn a_background_process_is_listed_attached_and_killed() {
    let daemon = start();
    let mut stream = sh(
        &daemon,
        "echo ready; exec sleep 30",
        json!({"tag": "sleeper", "process": {"cmd": "/bin/sh",
               "args": ["-c", "echo ready; exec sleep 30"], "envs": {"A": "1"}, "cwd": "/tmp"}}),
        &[],
    );
    let pid = started(&mut stream);
    // The client of Start leaves: a background command.
    drop(stream);
    std::thread::sleep(Duration::from_millis(1500));
    let processes = list(&daemon);
    let listed = processes
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} listed: {processes:?}"));
    assert_eq!(listed["tag"], "sleeper");
    assert_eq!(
        listed["config"],
        json!({"cmd": "/bin/sh", "args": ["-c", "echo ready; exec sleep 30"],
               "envs": {"A": "1"}, "cwd": "/tmp"})
    );
    // Attached by tag: the start event names the pid; output from then on.
    let mut attached = Stream::open(
        &daemon,
        "process.Process/Connect",
        &json!({"process": {"tag": "sleeper"}}),
        &[],
    );
    assert_eq!(started(&mut attached), pid);
    let reply = unary(
        &daemon,
        "process.Process/SendSignal",
        &[],
        &json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}),
    );
    assert_eq!((reply.status, reply.json()), (200, json!({})));
    let run = run_to_end(&mut attached, WAIT);
    assert_eq!(run.stdout, b"", "nothing after the attach");
    assert_eq!(run.end.unwrap()["status"], "signal: killed");
    // Gone: not listed, no pid (`kill -0` fails), a second kill is not_found.
    assert!(!listed_pids(&daemon).contains(&pid));
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "reaped before its end was told"
    );
    let reply = unary(
        &daemon,
        "process.Process/SendSignal",
        &[],
        &json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGTERM"}),
    );
    assert_eq!(
        error_of(&reply),
        (
            404,
            "not_found".into(),
            format!("process with pid {pid} not found")
        )
    );
    // Its end is remembered a while, as envd does: a late Connect gets start and end.
    let mut late = Stream::open(
        &daemon,
        "process.Process/Connect",
        &json!({"process": {"pid": pid}}),
        &[],
    );
    assert_eq!(started(&mut late), pid);
    let run = run_to_end(&mut late, WAIT);
    assert_eq!(run.end.unwrap()["exitCode"], -1);
}

#[test]
fn processes_run_as_the_callers_user_with_envds_environment() {
    if !root_or_skip("starting a process as another user needs root") {
        return;
    }
    let daemon = start();
    let script = "id -u; id -g; echo $HOME $USER $LOGNAME; pwd; env";
    let mut stream = sh(
        &daemon,
        script,
        json!({"process": {"cmd": "/bin/sh", "args": ["-c", script], "envs": {"MINE": "yes"}}}),
        &[("Authorization", AS_USER)],
    );
    started(&mut stream);
    let run = run_to_end(&mut stream, WAIT);
    let text = String::from_utf8(run.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let home = daemon.home();
    let home = home.to_str().unwrap();
    assert_eq!(lines[0], USER_UID.to_string());
    assert_eq!(lines[1], USER_GID.to_string());
    assert_eq!(lines[2], format!("{home} user user"));
    assert_eq!(lines[3], home, "the home is the default working directory");
    let env: BTreeMap<&str, &str> = lines[4..]
        .iter()
        .filter_map(|line| line.split_once('='))
        .collect();
    assert_eq!(env.get("MINE"), Some(&"yes"));
    assert!(env.contains_key("PATH"));
    assert!(
        !text.contains(crate::common::TOKEN) && !env.keys().any(|k| k.starts_with("SANDBOXD_")),
        "the daemon's token and settings never reach a child: {env:?}"
    );
    // Without a user: the default one (root here), in its home.
    let mut stream = sh(&daemon, "id -u; pwd", json!({}), &[]);
    started(&mut stream);
    let run = run_to_end(&mut stream, WAIT);
    let root_home = daemon.dir.path().join("root");
    assert_eq!(
        String::from_utf8(run.stdout).unwrap(),
        format!("0\n{}\n", root_home.display())
    );
}

#[test]
fn a_client_vanishing_mid_stream_leaves_the_process_running() {
    let daemon = start();
    let mut stream = sh(
        &daemon,
        "while :; do echo tick; sleep 0.02; done",
        json!({}),
        &[],
    );
    let pid = started(&mut stream);
    let first = stream.next();
    assert!(first.json["event"]["data"]["stdout"].is_string());
    drop(stream);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(listed_pids(&daemon).contains(&pid), "still running");
    let mut attached = Stream::open(
        &daemon,
        "process.Process/Connect",
        &json!({"process": {"pid": pid}}),
        &[],
    );
    started(&mut attached);
    let next = attached.next();
    let ticks = unb64(next.json["event"]["data"]["stdout"].as_str().unwrap());
    assert!(
        !ticks.is_empty() && ticks.chunks(5).all(|tick| tick == b"tick\n"),
        "its output goes on: {ticks:?}"
    );
    let reply = unary(
        &daemon,
        "process.Process/SendSignal",
        &[],
        &json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGTERM"}),
    );
    assert_eq!(reply.status, 200);
    let run = run_to_end(&mut attached, WAIT);
    assert_eq!(run.end.unwrap()["status"], "signal: terminated");
    eventually(|| zombie_children(&daemon).is_empty(), "no zombie");
}

#[test]
fn large_output_arrives_whole() {
    let daemon = start();
    const SIZE: usize = 100 << 20;
    let mut stream = Stream::open(
        &daemon,
        START,
        &json!({"process": {"cmd": "sh", "args": ["-c",
            format!("yes 0123456789abcdef | head -c {SIZE}")]}}),
        &[],
    );
    started(&mut stream);
    let run = run_to_end(&mut stream, Duration::from_secs(120));
    assert_eq!(run.error, None);
    assert_eq!(run.end.unwrap()["exitCode"], 0);
    assert_eq!(run.stdout.len(), SIZE);
    assert!(run
        .stdout
        .chunks(17)
        .all(|line| line == &b"0123456789abcdef\n"[..line.len()]));
}

#[test]
fn many_commands_at_once_and_no_zombie_after_them() {
    let daemon = std::sync::Arc::new(start());
    let handles: Vec<_> = (0..100)
        .map(|i| {
            let daemon = std::sync::Arc::clone(&daemon);
            std::thread::spawn(move || {
                let mut stream = sh(
                    &daemon,
                    &format!("sleep 0.2; echo {i}; exit $(({i} % 7))"),
                    json!({}),
                    &[],
                );
                started(&mut stream);
                let run = run_to_end(&mut stream, Duration::from_secs(30));
                assert_eq!(run.stdout, format!("{i}\n").into_bytes());
                assert_eq!(run.end.unwrap()["exitCode"], i % 7);
            })
        })
        .collect();
    for handle in handles {
        handle.join().expect("a command failed");
    }
    assert!(list(&daemon).is_empty());
    eventually(
        || zombie_children(&daemon).is_empty(),
        "no zombie after 100 commands",
    );
}

#[test]
fn bad_requests_and_unknown_processes_are_envds_errors() {
    let daemon = start();
    // A program that cannot be executed: envd's own start failure, at the end of an empty
    // stream.
    let not_executable = daemon.dir.path().join("notes.txt");
    std::fs::write(&not_executable, "#!/bin/sh\n").unwrap();
    for (cmd, reason) in [
        (
            "/nonexistent/program",
            "No such file or directory (os error 2)",
        ),
        (
            not_executable.to_str().unwrap(),
            "Permission denied (os error 13)",
        ),
    ] {
        let mut stream = Stream::open(&daemon, START, &json!({"process": {"cmd": cmd}}), &[]);
        assert_eq!(stream.status, 200);
        let only = stream.next();
        assert_eq!(
            Stream::end_error(&only),
            Some((
                "invalid_argument".into(),
                format!(
                    "error starting process '{cmd}' in '{}' as root: {reason}",
                    daemon.dir.path().join("root").display()
                )
            ))
        );
    }
    let mut stream = Stream::open(
        &daemon,
        START,
        &json!({"process": {"cmd": "true", "cwd": "/nonexistent"}}),
        &[],
    );
    assert_eq!(
        Stream::end_error(&stream.next()),
        Some((
            "invalid_argument".into(),
            "cwd '/nonexistent' does not exist".into()
        ))
    );
    let mut stream = Stream::open(
        &daemon,
        START,
        &json!({"process": {"cmd": "sh"}, "pty": {"size": {"cols": 0, "rows": 24}}}),
        &[],
    );
    assert_eq!(
        Stream::end_error(&stream.next()).unwrap().0,
        "invalid_argument"
    );
    let unknown = json!({"pid": 999_999});
    for (method, body) in [
        (
            "SendInput",
            json!({"process": unknown, "input": {"stdin": "eA=="}}),
        ),
        (
            "SendSignal",
            json!({"process": unknown, "signal": "SIGNAL_SIGKILL"}),
        ),
        ("CloseStdin", json!({"process": unknown})),
        (
            "Update",
            json!({"process": unknown, "pty": {"size": {"cols": 80, "rows": 24}}}),
        ),
    ] {
        let reply = unary(&daemon, &format!("process.Process/{method}"), &[], &body);
        assert_eq!(
            error_of(&reply),
            (
                404,
                "not_found".into(),
                "process with pid 999999 not found".into()
            ),
            "{method}"
        );
    }
    let mut stream = Stream::open(
        &daemon,
        "process.Process/Connect",
        &json!({"process": {"tag": "nobody"}}),
        &[],
    );
    assert_eq!(
        Stream::end_error(&stream.next()),
        Some((
            "not_found".into(),
            "process with tag nobody not found".into()
        ))
    );
    let reply = unary(
        &daemon,
        "process.Process/SendSignal",
        &[],
        &json!({"process": {"pid": 1}, "signal": "SIGNAL_UNSPECIFIED"}),
    );
    assert_eq!(
        error_of(&reply).1,
        "unimplemented",
        "envd's answer to an unknown signal"
    );
    let reply = unary(&daemon, "process.Process/StreamInput", &[], &json!({}));
    assert_eq!(
        error_of(&reply),
        (
            501,
            "unimplemented".into(),
            "process.Process/StreamInput is a client-streaming method: send \
             application/connect+json"
                .into()
        )
    );
    let reply = unary(&daemon, "process.Process/Nope", &[], &json!({}));
    assert_eq!(
        error_of(&reply),
        (
            501,
            "unimplemented".into(),
            "process.Process/Nope is not a method of process.Process".into()
        )
    );
}

#[test]
fn the_start_deadline_ends_the_stream_and_kills_the_process() {
    let daemon = start();
    let started_at = Instant::now();
    let mut stream = Stream::open(
        &daemon,
        START,
        &json!({"process": {"cmd": "sleep", "args": ["30"]}}),
        &[("Connect-Timeout-Ms", "500")],
    );
    let pid = started(&mut stream);
    let run = run_to_end(&mut stream, WAIT);
    assert_eq!(run.end, None, "no end event: the deadline came first");
    assert_eq!(run.error.unwrap().0, "deadline_exceeded");
    assert!(started_at.elapsed() < Duration::from_secs(5));
    eventually(
        || !listed_pids(&daemon).contains(&pid),
        "killed at its deadline",
    );
}

#[test]
fn quiet_streams_get_keepalives() {
    let daemon = start();
    let mut stream = sh(
        &daemon,
        "sleep 2.5",
        json!({}),
        &[("Keepalive-Ping-Interval", "1")],
    );
    started(&mut stream);
    let run = run_to_end(&mut stream, WAIT);
    assert!(run.keepalives >= 2, "{run:?}");
    assert_eq!(run.end.unwrap()["exitCode"], 0);
}

#[test]
fn sigterm_to_the_daemon_reaches_its_processes() {
    let mut daemon = start();
    let flag = daemon.dir.path().join("termed");
    let script = format!(
        "trap 'echo bye > {}; exit 0' TERM; echo up; while :; do sleep 0.05; done",
        flag.display()
    );
    let mut stream = sh(&daemon, &script, json!({}), &[]);
    started(&mut stream);
    assert_eq!(stream.next().json["event"]["data"]["stdout"], b64(b"up\n"));
    daemon.signal("TERM");
    let run = run_to_end(&mut stream, WAIT);
    assert_eq!(run.end.unwrap()["exitCode"], 0, "it exited on its trap");
    assert_eq!(std::fs::read_to_string(&flag).unwrap(), "bye\n");
    let status = daemon.wait(WAIT).expect("the daemon exits");
    assert!(status.success());
}

#[test]
fn a_terminal_session_has_its_tty_its_size_and_term() {
    let daemon = start();
    let mut stream = Stream::open(
        &daemon,
        START,
        &json!({"process": {"cmd": "/bin/sh"}, "pty": {"size": {"cols": 80, "rows": 24}}}),
        &[],
    );
    let pid = started(&mut stream);
    let input = |bytes: &[u8]| {
        unary(
            &daemon,
            "process.Process/SendInput",
            &[],
            &json!({"process": {"pid": pid}, "input": {"pty": b64(bytes)}}),
        )
    };
    assert_eq!(input(b"tty; stty size; echo T=$TERM\n").status, 200);
    let mut seen = Run::default();
    let deadline = Instant::now() + WAIT;
    while !String::from_utf8_lossy(&seen.pty).contains("T=xterm-256color") {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = stream.next_within(left).expect("the terminal's answer");
        assert!(!message.end, "{message:?}");
        take(&mut seen, &message);
    }
    let text = String::from_utf8_lossy(&seen.pty).into_owned();
    assert!(text.contains("/dev/pts/"), "{text}");
    assert!(text.contains("24 80"), "{text}");
    assert!(
        seen.stdout.is_empty() && seen.stderr.is_empty(),
        "all output is the terminal's"
    );
    let resize = |cols: u32, rows: u32| {
        unary(
            &daemon,
            "process.Process/Update",
            &[],
            &json!({"process": {"pid": pid}, "pty": {"size": {"cols": cols, "rows": rows}}}),
        )
    };
    assert_eq!(resize(132, 50).status, 200);
    assert_eq!(error_of(&resize(0, 50)).1, "invalid_argument");
    assert_eq!(error_of(&resize(70_000, 50)).1, "invalid_argument");
    // Stdin is the terminal's: stdin bytes and closing it are envd's errors.
    let reply = unary(
        &daemon,
        "process.Process/SendInput",
        &[],
        &json!({"process": {"pid": pid}, "input": {"stdin": b64(b"x")}}),
    );
    assert_eq!(error_of(&reply).1, "internal");
    assert!(error_of(&reply).2.contains("tty assigned to process"));
    let reply = unary(
        &daemon,
        "process.Process/CloseStdin",
        &[],
        &json!({"process": {"pid": pid}}),
    );
    assert_eq!(error_of(&reply).1, "unknown");
    assert_eq!(input(b"stty size; exit 5\n").status, 200);
    let run = run_to_end(&mut stream, WAIT);
    assert!(String::from_utf8_lossy(&run.pty).contains("50 132"));
    assert_eq!(run.end.unwrap()["exitCode"], 5);

    // A process with pipes has no terminal to resize.
    let mut stream = sh(&daemon, "sleep 5", json!({}), &[]);
    let pid = started(&mut stream);
    let reply = unary(
        &daemon,
        "process.Process/Update",
        &[],
        &json!({"process": {"pid": pid}, "pty": {"size": {"cols": 80, "rows": 24}}}),
    );
    assert_eq!(
        error_of(&reply),
        (
            500,
            "internal".into(),
            "error resizing tty: tty not assigned to process".into()
        )
    );
}

/// The pids of `pid`'s children.
fn children_of(pid: i32) -> Vec<i32> {
    let mut children = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let listed = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        children.extend(
            listed
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok()),
        );
    }
    children
}

/// The state letters of `parent`'s children.
fn states_of_children(parent: i32) -> Vec<String> {
    children_of(parent)
        .into_iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|stat| {
            Some(
                stat.rsplit_once(')')?
                    .1
                    .split_whitespace()
                    .next()?
                    .to_string(),
            )
        })
        .collect()
}

#[test]
fn as_pid_1_the_orphans_of_commands_are_reaped() {
    if !root_or_skip("a PID namespace (unshare --pid) needs root") {
        return;
    }
    let daemon = crate::common::builder()
        .wrap_with_shell("exec unshare --pid --kill-child --mount-proc")
        .start();
    // unshare's child is sandboxd, PID 1 of the new namespace.
    let sandboxd = children_of(daemon.pid());
    assert_eq!(sandboxd.len(), 1, "unshare has one child: {sandboxd:?}");
    let sandboxd = sandboxd[0];
    let mut stream = sh(&daemon, "cat /proc/1/comm", json!({}), &[]);
    started(&mut stream);
    let run = run_to_end(&mut stream, WAIT);
    assert_eq!(
        run.stdout, b"sandboxd\n",
        "sandboxd is PID 1 of the commands' namespace"
    );
    // Each command leaves an orphan that exits a moment later: PID 1 inherits and reaps it.
    for _ in 0..20 {
        let mut stream = sh(
            &daemon,
            "(sleep 0.2 > /dev/null 2>&1 &); exit 0",
            json!({}),
            &[],
        );
        started(&mut stream);
        assert_eq!(run_to_end(&mut stream, WAIT).end.unwrap()["exitCode"], 0);
    }
    std::thread::sleep(Duration::from_millis(300));
    eventually(
        || !states_of_children(sandboxd).iter().any(|s| s == "Z"),
        "no zombie among PID 1's children",
    );
    assert!(
        children_of(sandboxd).is_empty(),
        "every orphan exited and was reaped: {:?}",
        states_of_children(sandboxd)
    );
}

#[test]
fn stream_input_feeds_a_process_over_one_chunked_body() {
    use std::io::{BufReader, Write};
    let daemon = start();
    let mut output = Stream::open(
        &daemon,
        START,
        &json!({"process": {"cmd": "cat"}, "stdin": true}),
        &[],
    );
    let pid = started(&mut output);
    let messages = [
        json!({"start": {"process": {"pid": pid}}}),
        json!({"data": {"input": {"stdin": b64(b"one ")}}}),
        json!({"keepalive": {}}),
        json!({"data": {"input": {"stdin": b64(b"two")}}}),
    ];
    let encoded = |messages: &[Value]| -> Vec<u8> {
        messages
            .iter()
            .flat_map(|m| crate::common::connect::envelope(0, m.to_string().as_bytes()))
            .collect()
    };
    let mut socket = daemon.connect();
    socket
        .write_all(
            format!(
                "POST /process.Process/StreamInput HTTP/1.1\r\nHost: t\r\n\
                 X-Access-Token: {}\r\nContent-Type: application/connect+json\r\n\
                 Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
                crate::common::TOKEN
            )
            .as_bytes(),
        )
        .unwrap();
    // Envelopes cut anywhere by the chunks, sent over time.
    let mut send = |body: &[u8]| {
        for piece in body.chunks(7) {
            socket
                .write_all(format!("{:x}\r\n", piece.len()).as_bytes())
                .unwrap();
            socket.write_all(piece).unwrap();
            socket.write_all(b"\r\n").unwrap();
        }
    };
    send(&encoded(&messages[..2]));
    let first = output.next();
    assert_eq!(
        first.json["event"]["data"]["stdout"],
        b64(b"one "),
        "input is applied as it arrives, before the body ends"
    );
    send(&encoded(&messages[2..]));
    socket.write_all(b"0\r\n\r\n").unwrap();
    let reply = crate::common::read_reply(&mut BufReader::new(socket), false).unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.header("content-type"),
        Some("application/connect+json")
    );
    let mut expected = crate::common::connect::envelope(0, b"{}");
    expected.extend(crate::common::connect::envelope(2, b"{}"));
    // Both queued before the answer went out: one chunk.
    let mut chunked = format!("{:x}\r\n", expected.len()).into_bytes();
    chunked.extend(&expected);
    chunked.extend(b"\r\n0\r\n\r\n");
    assert_eq!(reply.body, chunked, "the empty answer, then a clean end");
    let unary_close = unary(
        &daemon,
        "process.Process/CloseStdin",
        &[],
        &json!({"process": {"pid": pid}}),
    );
    assert_eq!(unary_close.status, 200);
    let run = run_to_end(&mut output, WAIT);
    assert_eq!(run.stdout, b"two");

    // Data before start: the stream's end-of-stream error.
    let mut stream = crate::common::connect::Stream::open(
        &daemon,
        "process.Process/StreamInput",
        &json!({"data": {"input": {"stdin": "eA=="}}}),
        &[],
    );
    assert_eq!(stream.status, 200);
    let (code, message) = Stream::end_error(&stream.next()).unwrap();
    assert_eq!(code, "invalid_argument");
    assert!(message.contains("start event"), "{message}");
}
