//! The process service cannot be turned against the sandbox's own code (issue 21): started
//! processes start clean (no blocked or ignored signal, the open-file limit the daemon was
//! started with), so `SendSignal`, Ctrl-C on a terminal and the daemon's own shutdown end
//! them; a process whose exit was reaped is never signalled (its pid may be another's); and
//! running out of descriptors is `resource_exhausted`, not the client's fault. A daemon
//! started at nice -10 with realtime or idle I/O starts its children at nice 0 with
//! best-effort I/O (issue 25).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::connect::{unary, Stream, WAIT};
use crate::common::{builder, root_or_skip, start, Daemon};

const START: &str = "process.Process/Start";

/// `Start` of `cmd args`, with more request fields from `extra`.
fn start_process(daemon: &Daemon, cmd: &str, args: &[&str], extra: Value) -> Stream {
    let mut request = json!({"process": {"cmd": cmd, "args": args}});
    if let (Some(request), Some(extra)) = (request.as_object_mut(), extra.as_object()) {
        request.extend(extra.clone());
    }
    Stream::open(daemon, START, &request, &[])
}

/// The start event's pid.
fn started(stream: &mut Stream) -> u32 {
    assert_eq!(stream.status, 200);
    let first = stream.next();
    assert!(!first.end, "ended at once: {first:?}");
    let pid = first.json["event"]["start"]["pid"].as_u64();
    let pid = pid.unwrap_or_else(|| panic!("a start event first: {first:?}"));
    u32::try_from(pid).unwrap()
}

/// The stream's end event (the data before it skipped); panics on an error end or none
/// within 10 s.
fn end_of(stream: &mut Stream) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = stream
            .next_within(left)
            .expect("the stream ends within 10 s");
        assert!(
            !message.end,
            "the stream ended without an end event: {message:?}"
        );
        if let Some(end) = message.json["event"].get("end") {
            let last = stream.next();
            assert_eq!(Stream::end_error(&last), None, "a clean end of stream");
            return end.clone();
        }
    }
}

fn send_signal(daemon: &Daemon, pid: u32, signal: &str) -> (u16, Value) {
    let request = json!({"process": {"pid": pid}, "signal": signal});
    let reply = unary(daemon, "process.Process/SendSignal", &[], &request);
    (reply.status, reply.json())
}

fn listed_pids(daemon: &Daemon) -> Vec<u64> {
    let reply = unary(daemon, "process.Process/List", &[], &json!({}));
    assert_eq!(reply.status, 200, "{}", reply.text());
    let processes = reply.json()["processes"].as_array().unwrap().clone();
    processes.iter().filter_map(|p| p["pid"].as_u64()).collect()
}

/// A line of `/proc/<pid>/<file>` that starts with `prefix`, after the prefix.
fn proc_line(pid: u32, file: &str, prefix: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap();
    let line = text.lines().find_map(|line| line.strip_prefix(prefix));
    line.unwrap_or_else(|| panic!("no {prefix} in /proc/{pid}/{file}: {text}"))
        .trim()
        .to_string()
}

/// Whether `pid` is a process that has not exited (not a zombie, not gone).
fn running(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
    !state.is_some_and(|s| s.starts_with('Z'))
}

/// Whether `pid` runs with no signal pending: it was not signalled, or it would be gone, a
/// zombie, or have the signal pending still (a group's SIGKILL shows in `SigPnd` until the
/// process runs and dies), whatever the scheduler did meanwhile.
fn running_unsignalled(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    let field = |name: &str| {
        let line = status.lines().find_map(|l| l.strip_prefix(name));
        line.map(str::trim).unwrap_or_default().to_string()
    };
    let no_signal = "0000000000000000";
    !field("State:").starts_with('Z')
        && field("SigPnd:") == no_signal
        && field("ShdPnd:") == no_signal
}

fn eventually(what: impl Fn() -> bool, context: &str) {
    let deadline = Instant::now() + WAIT;
    while !what() {
        assert!(Instant::now() < deadline, "{context}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
}

#[test]
fn a_started_process_has_no_blocked_or_ignored_signal_and_the_daemons_first_file_limit() {
    // The daemon's parent ignores SIGHUP (as nohup does) and gives it a soft limit of 1024
    // under a hard one of 4096, which the daemon raises for itself.
    let daemon = builder()
        .wrap_with_shell("trap '' HUP; ulimit -Sn 1024; ulimit -Hn 4096; exec")
        .start();
    let daemon_limit = proc_line(daemon.pid().unsigned_abs(), "limits", "Max open files");
    assert!(
        daemon_limit.starts_with("4096 "),
        "the daemon raised its own: {daemon_limit}"
    );
    let mut stream = start_process(&daemon, "sleep", &["1000"], json!({}));
    let pid = started(&mut stream);
    let blocked = proc_line(pid, "status", "SigBlk:");
    let ignored = proc_line(pid, "status", "SigIgn:");
    let limit = proc_line(pid, "limits", "Max open files");
    kill(pid);
    assert_eq!(blocked, "0000000000000000", "SigBlk");
    assert_eq!(ignored, "0000000000000000", "SigIgn");
    let limit: Vec<&str> = limit.split_whitespace().collect();
    assert_eq!(limit, ["1024", "4096", "files"]);
    assert_eq!(end_of(&mut stream)["status"], "signal: killed");
}

/// Field 19 of `/proc/<pid>/stat`: the nice value.
fn nice_of(pid: u32) -> i64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = stat.rsplit_once(')').unwrap().1;
    after.split_whitespace().nth(16).unwrap().parse().unwrap()
}

/// `ionice -p <pid>`'s answer, e.g. `best-effort: prio 4`.
fn ionice_of(pid: u32) -> String {
    let output = std::process::Command::new("ionice")
        .args(["-p", &pid.to_string()])
        .output()
        .expect("ionice (util-linux) on the test machine");
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

#[test]
fn children_of_a_daemon_at_nice_minus_10_with_realtime_or_idle_io_start_at_nice_0_best_effort() {
    if !root_or_skip("a negative nice and realtime I/O need root") {
        return;
    }
    for io_class in ["-c 1 -n 0", "-c 3"] {
        let daemon = builder()
            .wrap_with_shell(&format!("exec nice -n -10 ionice {io_class}"))
            .start();
        let daemon_pid = daemon.pid().unsigned_abs();
        assert_eq!(nice_of(daemon_pid), -10, "the daemon itself runs at -10");
        let daemon_io = ionice_of(daemon_pid);
        assert!(
            daemon_io.starts_with("realtime") || daemon_io.starts_with("idle"),
            "{daemon_io}"
        );
        let pty = json!({"pty": {"size": {"cols": 80, "rows": 24}}});
        for extra in [json!({}), pty] {
            let mut stream = start_process(&daemon, "sleep", &["1000"], extra.clone());
            let pid = started(&mut stream);
            let (nice, io) = (nice_of(pid), ionice_of(pid));
            kill(pid);
            assert_eq!(nice, 0, "{io_class} {extra}");
            assert_eq!(io, "best-effort: prio 4", "{io_class} {extra}");
            assert_eq!(end_of(&mut stream)["status"], "signal: killed");
        }
    }
}

#[test]
fn sigterm_by_send_signal_ends_sleep() {
    let daemon = start();
    let mut stream = start_process(&daemon, "sleep", &["1000"], json!({}));
    let pid = started(&mut stream);
    assert_eq!(
        send_signal(&daemon, pid, "SIGNAL_SIGTERM"),
        (200, json!({}))
    );
    let end = end_of(&mut stream);
    kill(pid);
    assert_eq!(
        end,
        json!({"exitCode": -1, "exited": false, "status": "signal: terminated",
               "error": "signal: terminated"})
    );
    assert!(!running(pid));
}

#[test]
fn ctrl_c_on_a_terminal_interrupts_sleep() {
    let daemon = start();
    let pty = json!({"pty": {"size": {"cols": 80, "rows": 24}}});
    let mut stream = start_process(&daemon, "sleep", &["1000"], pty);
    let pid = started(&mut stream);
    let input = json!({"process": {"pid": pid}, "input": {"pty": "Aw=="}});
    let reply = unary(&daemon, "process.Process/SendInput", &[], &input);
    assert_eq!(reply.status, 200, "{}", reply.text());
    let end = end_of(&mut stream);
    kill(pid);
    assert_eq!(end["status"], "signal: interrupt", "{end}");
}

#[test]
fn the_daemons_shutdown_ends_a_process_that_traps_nothing() {
    let mut daemon = start();
    let mut stream = start_process(&daemon, "sleep", &["1000"], json!({}));
    let pid = started(&mut stream);
    daemon.signal("TERM");
    let end = end_of(&mut stream);
    kill(pid);
    assert_eq!(end["status"], "signal: terminated");
    assert!(daemon.wait(WAIT).expect("the daemon exits").success());
}

/// A process that exited and was reaped, listed because its background child holds its output
/// and stays in its process group: `SendSignal` does not signal that group (after the reap, the
/// group's id may be another's once its last member leaves); `SIGKILL` ends the listing with the
/// exit it had. That a reused pid is not signalled is tested with a forced reuse in
/// `src/proc/tests.rs`.
#[test]
fn a_reaped_process_is_not_signalled_and_its_end_is_told_with_its_own_exit() {
    let daemon = start();
    let mut stream = start_process(
        &daemon,
        "/bin/sh",
        &["-c", "sleep 1000 & echo $!; exit 5"],
        json!({}),
    );
    let leader = started(&mut stream);
    let message = stream.next();
    let data = message.json["event"]["data"]["stdout"].as_str().unwrap();
    let data = base64_simd::STANDARD.decode_to_vec(data).unwrap();
    let child: u32 = String::from_utf8(data).unwrap().trim().parse().unwrap();
    eventually(
        || !std::path::Path::new(&format!("/proc/{leader}")).exists(),
        "the leader is reaped",
    );
    assert!(listed_pids(&daemon).contains(&u64::from(leader)));
    let pgid = proc_line(child, "stat", "")
        .rsplit_once(')')
        .map(|(_, rest)| {
            let fields: Vec<String> = rest.split_whitespace().map(str::to_string).collect();
            fields[2].clone()
        });
    assert_eq!(pgid, Some(leader.to_string()), "the child is in the group");
    assert_eq!(
        send_signal(&daemon, leader, "SIGNAL_SIGKILL"),
        (200, json!({}))
    );
    let end = end_of(&mut stream);
    let child_lives = running_unsignalled(child);
    kill(child);
    assert_eq!(
        end,
        json!({"exitCode": 5, "exited": true, "status": "exit status 5",
               "error": "exit status 5"})
    );
    assert!(child_lives, "the reaped leader's group was not signalled");
    assert!(!listed_pids(&daemon).contains(&u64::from(leader)));
}

#[test]
fn out_of_descriptors_is_resource_exhausted() {
    // 64 descriptors in all: each running process holds three of the daemon's (stdout,
    // stderr, stdin) and its stream a socket; a start needs eight more for a moment (three
    // pipes and std's exec-error pipe), so a start fails before an accept does.
    let mut daemon = builder().wrap_with_shell("ulimit -n 64; exec").start();
    let mut streams = Vec::new();
    let mut error = None;
    for _ in 0..64 {
        let mut stream = start_process(&daemon, "sleep", &["1000"], json!({}));
        assert_eq!(stream.status, 200);
        let first = stream.next();
        if first.end {
            error = Stream::end_error(&first);
            break;
        }
        streams.push(stream);
    }
    let started = streams.len();
    drop(streams);
    // SIGTERM to the daemon ends every process it started.
    daemon.signal("TERM");
    assert!(daemon.wait(WAIT).is_some(), "the daemon exits");
    let (code, message) = error.expect("a start fails before 64 of them");
    assert!(started >= 2, "only {started} started");
    assert_eq!(code, "resource_exhausted", "{message}");
    assert!(message.contains("os error 24"), "EMFILE: {message}");
}
