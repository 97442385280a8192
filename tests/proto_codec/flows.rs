//! The orchestrator's flows (E2B's `envd_process.go` and `sandboxtools/command.go`), each
//! sent as the fixture a foreign encoder wrote, answers decoded by the test's own messages: a
//! template build step, the `_system` shell, a `Connect-Timeout-Ms` that kills, a terminal,
//! unary `Stat`/`ListDir`, and megabytes of output (read straight into the stream's queue).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::{Duration, Instant};

use serde_json::json;

use super::client::{
    self, answer, decode, fixture, next, next_within, open, run_after_start, run_to_end, started,
};
use super::messages::filesystem::{EntryResponse, FileType, ListDirResponse};
use super::messages::process::{EndEvent, Event, EventResponse, ListResponse, Output};
use crate::common::connect::{Stream, AS_USER, WAIT};
use crate::common::{root_or_skip, start, write_file, Daemon, USER_UID};

const START: &str = "process.Process/Start";
/// `Authorization: Basic base64("root:")`, as `grpc.SetUserHeader(h, "root")` writes it.
const AS_ROOT: &str = "Basic cm9vdDo=";

fn end(exit_code: i32, status: &str, error: Option<&str>) -> Option<EndEvent> {
    Some(EndEvent {
        exit_code,
        exited: true,
        status: status.to_string(),
        error: error.map(str::to_string),
    })
}

fn listed_pids(daemon: &Daemon) -> Vec<u32> {
    let reply = client::unary(daemon, "process.Process/List", &fixture("proc_list"), &[]);
    let list: ListResponse = answer(&reply);
    list.processes.iter().map(|p| p.pid).collect()
}

#[test]
fn a_template_build_step_streams_its_output_and_its_exit_code() {
    if !root_or_skip("a build step runs as `user`, which needs root") {
        return;
    }
    let daemon = start();
    let user = [("Authorization", AS_USER)];
    let mut stream = open(&daemon, START, &fixture("proc_start_build_step"), &user);
    let run = run_to_end(&mut stream, WAIT);
    assert_eq!(run.error, None, "a clean end of the stream: {run:?}");
    assert!(run.pid > 1);
    assert_eq!(
        run.stdout_text(),
        format!("step: install deps\nuser: user {USER_UID}\ncwd: /tmp\nempty: []\n")
    );
    assert_eq!(run.stderr, b"to stderr\n");
    assert_eq!(run.end, end(0, "exit status 0", None));

    let mut stream = open(
        &daemon,
        START,
        &fixture("proc_start_build_step_fails"),
        &user,
    );
    let run = run_to_end(&mut stream, WAIT);
    assert_eq!(
        run.error, None,
        "the failure is the end event's, not the stream's"
    );
    assert_eq!(run.stdout, b"compiling\n");
    assert_eq!(run.stderr, b"error: no such package\n");
    assert_eq!(
        run.end,
        end(7, "exit status 7", Some("exit status 7")),
        "the orchestrator fails the step with the end's status"
    );
}

#[test]
fn the_system_shell_runs_as_root_with_the_system_tag() {
    if !root_or_skip("StartEnvdSystemShell runs as root, which needs a root daemon") {
        return;
    }
    let daemon = start();
    let headers = [("Authorization", AS_ROOT), ("Connect-Timeout-Ms", "60000")];
    let mut stream = open(
        &daemon,
        START,
        &fixture("proc_start_system_shell"),
        &headers,
    );
    let run = run_to_end(&mut stream, Duration::from_secs(60));
    assert_eq!(run.error, None);
    assert_eq!(run.stdout_text(), "synced as 0\n");
    assert_eq!(run.end, end(0, "exit status 0", None));
    // The tag is the process's: its end is found by it.
    let mut by_tag = Stream::open(
        &daemon,
        "process.Process/Connect",
        &json!({"process": {"tag": "_system"}}),
        &[],
    );
    let first = by_tag.next();
    assert_eq!(first.json["event"]["start"]["pid"], json!(run.pid));
    assert_eq!(by_tag.next().json["event"]["end"]["exitCode"], 0);
}

#[test]
fn connect_timeout_ms_kills_a_step_that_outlives_it() {
    let daemon = start();
    let began = Instant::now();
    let deadline = Duration::from_millis(1500);
    let timeout = [("Connect-Timeout-Ms", "1500")];
    let mut stream = open(&daemon, START, &fixture("proc_start_sleep"), &timeout);
    let pid = started(&mut stream);
    assert!(listed_pids(&daemon).contains(&pid));
    let first = next(&mut stream);
    let event = decode::<EventResponse>(&first.message)
        .event
        .and_then(|e| e.event);
    assert_eq!(
        event,
        Some(Event::Data(super::messages::process::DataEvent {
            output: Some(Output::Stdout(b"sleeping\n".to_vec()))
        }))
    );
    assert!(began.elapsed() < deadline, "output is streamed as it comes");
    let last = next_within(&mut stream, WAIT).expect("the end of the stream");
    let (code, _) = client::end_of_stream(&last).expect("an error, no end event");
    assert_eq!(code, "deadline_exceeded", "docs/spec.md §9b, Deadline");
    let took = began.elapsed();
    assert!(took >= deadline && took < deadline * 4, "{took:?}");
    let gone = Instant::now() + WAIT;
    while listed_pids(&daemon).contains(&pid) {
        assert!(Instant::now() < gone, "{pid} still listed: not killed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists() || pid_reused(pid));
}

/// Whether `pid` names a process that is not the one killed (a reuse, not a survivor).
fn pid_reused(pid: u32) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    !cmdline.starts_with(b"/bin/bash\0-l\0-c\0echo sleeping")
}

#[test]
fn a_terminal_is_resized_and_typed_into_in_proto() {
    let daemon = start();
    let mut stream = open(&daemon, START, &fixture("proc_start_pty"), &[]);
    let pid = started(&mut stream);
    let update = "process.Process/Update";
    let reply = client::unary(&daemon, update, &fixture("proc_update_pty"), &[]);
    assert_eq!(reply.body, b"", "UpdateResponse is empty");
    answer::<super::messages::filesystem::Empty>(&reply);
    let input = "process.Process/SendInput";
    let reply = client::unary(&daemon, input, &fixture("proc_send_input_pty"), &[]);
    answer::<super::messages::filesystem::Empty>(&reply);
    let run = run_after_start(&mut stream, pid, WAIT);
    assert!(run.stdout.is_empty() && run.stderr.is_empty());
    let shown = String::from_utf8_lossy(&run.pty);
    assert!(
        shown.contains("30 100"),
        "stty size after Update: {shown:?}"
    );
    assert_eq!(run.end, end(0, "exit status 0", None));
}

#[test]
fn unary_stat_and_list_dir_in_proto() {
    let daemon = start();
    let home = daemon.home();
    write_file(&home.join("proto/hello.txt"), b"hello");
    write_file(&home.join("proto/sub/inner.txt"), b"x");
    let file = home.join("proto/hello.txt");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let user = [("Authorization", AS_USER)];

    let reply = client::unary(
        &daemon,
        "filesystem.Filesystem/Stat",
        &fixture("fs_stat"),
        &user,
    );
    assert_eq!(
        reply.header("content-encoding"),
        None,
        "gzip was not asked for"
    );
    let entry = answer::<EntryResponse>(&reply).entry.expect("an entry");
    assert_eq!(entry.name, "hello.txt");
    assert_eq!(entry.r#type, FileType::File as i32);
    assert_eq!(entry.path, file.to_string_lossy());
    assert_eq!((entry.size, entry.mode), (5, 0o640));
    assert_eq!(entry.permissions, "-rw-r-----");
    let meta = std::fs::metadata(&file).unwrap();
    let time = entry.modified_time.expect("a modification time");
    assert_eq!(
        (time.seconds, i64::from(time.nanos)),
        (meta.mtime(), meta.mtime_nsec())
    );
    assert_eq!(entry.symlink_target, None);
    assert!(entry.metadata.is_empty());

    let list = "filesystem.Filesystem/ListDir";
    let reply = client::unary(&daemon, list, &fixture("fs_list_dir"), &user);
    let entries = answer::<ListDirResponse>(&reply).entries;
    let seen: Vec<(String, i32)> = entries
        .iter()
        .map(|e| (e.path.replace(&*home.to_string_lossy(), "~"), e.r#type))
        .collect();
    let (file_type, dir) = (FileType::File as i32, FileType::Directory as i32);
    assert_eq!(
        seen,
        [
            ("~/proto/hello.txt".to_string(), file_type),
            ("~/proto/sub".to_string(), dir),
            ("~/proto/sub/inner.txt".to_string(), file_type),
        ],
        "depth 2, depth first in name order"
    );
    assert_eq!(
        entries[0],
        answer::<EntryResponse>(&client::unary(
            &daemon,
            "filesystem.Filesystem/Stat",
            &fixture("fs_stat"),
            &user,
        ))
        .entry
        .expect("an entry"),
        "ListDir's entry is Stat's"
    );
}

#[test]
fn megabytes_of_output_arrive_whole_in_events_of_at_most_64_kib() {
    let daemon = start();
    // Large bursts (whole chunks), then small writes after pauses (reads under 16 KiB, whose
    // event headers are shorter), on both outputs.
    let script = "seq 1 400000; printf tail; seq 5 30000 >&2; sleep 0.05; printf x; \
                  sleep 0.05; printf y >&2";
    let run = run_to_end(&mut client::start_sh(&daemon, script), WAIT);
    assert_eq!(run.error, None, "{:?}", run.end);
    let lines = |from: u32, to: u32| -> Vec<u8> {
        (from..=to)
            .flat_map(|n| format!("{n}\n").into_bytes())
            .collect()
    };
    let stdout = [lines(1, 400_000), b"tailx".to_vec()].concat();
    assert_eq!(run.stdout.len(), stdout.len());
    assert!(run.stdout == stdout, "stdout differs");
    assert!(
        run.stderr == [lines(5, 30_000), b"y".to_vec()].concat(),
        "stderr differs"
    );
    assert!(run.largest_data <= 64 << 10, "{} bytes", run.largest_data);
    assert!(
        run.data_events >= stdout.len() / (64 << 10),
        "{} events",
        run.data_events
    );
    assert_eq!(run.end, end(0, "exit status 0", None));
}
