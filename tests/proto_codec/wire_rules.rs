//! The Connect protocol's rules around the binary codec, with the fixtures: errors are JSON
//! with their HTTP status (a stream's in its end-of-stream message), unknown fields are
//! skipped, gzip request bodies and messages are read, gzip answers are given to clients that
//! accept them, and a codec or an encoding sandboxd does not speak is refused.

use serde_json::json;

use super::client::{
    self, answer, end_of_stream, fixture, json_error, next, open, run_to_end, Run, NO_PID,
    NO_WATCHER, STREAM,
};
use super::messages::filesystem::{EntryResponse, ListDirResponse};
use crate::common::connect::{envelope, unary, Stream, WAIT};
use crate::common::{start, write_file, Daemon, TOKEN};

const STAT: &str = "filesystem.Filesystem/Stat";
const LIST_DIR: &str = "filesystem.Filesystem/ListDir";
const START: &str = "process.Process/Start";

/// A daemon with the fixtures' files in root's home: the calls here name no user, so their
/// relative paths are the default user's (root).
fn daemon_with_files() -> Daemon {
    let daemon = start();
    write_file(&root_home(&daemon).join("proto/hello.txt"), b"hello");
    write_file(&root_home(&daemon).join("proto/sub/inner.txt"), b"x");
    daemon
}

fn root_home(daemon: &Daemon) -> std::path::PathBuf {
    daemon.dir.path().join("root")
}

#[test]
fn errors_of_proto_calls_are_json_with_their_status() {
    let daemon = daemon_with_files();
    // The same error as the JSON codec's, in JSON.
    let proto = client::unary(&daemon, STAT, &fixture("fs_stat_missing"), &[]);
    let json = unary(&daemon, STAT, &[], &json!({"path": "proto/no-such-file"}));
    assert_eq!(json_error(&proto), json_error(&json));
    assert_eq!(json_error(&proto).0, 404);
    assert_eq!(json_error(&proto).1, "not_found");

    let unknown_watcher = format!("watcher with id {NO_WATCHER} not found");
    for (method, name) in [
        ("GetWatcherEvents", "fs_get_watcher_events"),
        ("RemoveWatcher", "fs_remove_watcher"),
    ] {
        let procedure = format!("filesystem.Filesystem/{method}");
        let reply = client::unary(&daemon, &procedure, &fixture(name), &[]);
        assert_eq!(
            json_error(&reply),
            (404, "not_found".into(), unknown_watcher.clone())
        );
    }
    let signal = "process.Process/SendSignal";
    let reply = client::unary(
        &daemon,
        signal,
        &fixture("proc_send_signal_pid_missing"),
        &[],
    );
    let no_process = format!("process with pid {NO_PID} not found");
    assert_eq!(
        json_error(&reply),
        (404, "not_found".into(), no_process.clone())
    );

    // A stream's error: a 200 stream holding only the end-of-stream message, in JSON.
    let connect = "process.Process/Connect";
    let mut stream = open(&daemon, connect, &fixture("proc_connect_pid_missing"), &[]);
    assert_eq!(stream.status, 200);
    assert_eq!(stream.header("content-type"), Some(STREAM));
    let only = next(&mut stream);
    assert_eq!(end_of_stream(&only), Some(("not_found".into(), no_process)));

    // A body that is no StatRequest (a length running past its end), unary and streamed.
    let reply = client::unary(&daemon, STAT, &[0x0a, 0x7f, b'x'], &[]);
    let (status, code, _) = json_error(&reply);
    assert_eq!((status, code.as_str()), (400, "invalid_argument"));
    let mut stream = open(&daemon, START, &[0x0a, 0x7f, b'x'], &[]);
    let (code, _) = end_of_stream(&next(&mut stream)).expect("an error");
    assert_eq!(code, "invalid_argument");

    // No token: 401, JSON, whatever the codec.
    let headers = [("Content-Type", client::UNARY)];
    let reply = daemon.call_with("POST", "/filesystem.Filesystem/Stat", &headers, b"");
    assert_eq!(json_error(&reply).1, "unauthenticated");
    assert_eq!(reply.status, 401);
}

#[test]
fn a_codec_or_an_encoding_sandboxd_does_not_speak_is_refused() {
    let daemon = daemon_with_files();
    let headers = [
        ("X-Access-Token", TOKEN),
        ("Content-Type", "application/xml"),
    ];
    let reply = daemon.call_with("POST", "/filesystem.Filesystem/Stat", &headers, b"<x/>");
    assert_eq!(reply.status, 415, "{}", reply.text());

    // Connect: an unknown Content-Encoding is `unimplemented`, naming what is accepted.
    let br = [("Content-Encoding", "br")];
    let reply = client::unary(&daemon, STAT, &fixture("fs_stat"), &br);
    assert_eq!(
        (json_error(&reply).0, json_error(&reply).1.as_str()),
        (501, "unimplemented"),
        "{reply:?}"
    );
    let accepted = reply.header("accept-encoding").unwrap_or_default();
    assert!(accepted.contains("gzip"), "Accept-Encoding: {accepted:?}");

    // On a stream too, before its answer starts (docs/spec.md §9b, Compression): 501 JSON,
    // naming what is accepted.
    let headers = [
        ("X-Access-Token", TOKEN),
        ("Content-Type", STREAM),
        ("Connect-Content-Encoding", "br"),
    ];
    let body = envelope(1, &fixture("proc_start_build_step"));
    let reply = daemon.call_with("POST", &format!("/{START}"), &headers, &body);
    let (status, code, message) = json_error(&reply);
    assert_eq!((status, code.as_str()), (501, "unimplemented"), "{message}");
    assert_eq!(reply.header("connect-accept-encoding"), Some("gzip"));
}

#[test]
fn unknown_fields_are_skipped_in_both_codecs() {
    let daemon = daemon_with_files();
    let plain: EntryResponse = answer(&client::unary(&daemon, STAT, &fixture("fs_stat"), &[]));
    let newer = client::unary(&daemon, STAT, &fixture("fs_stat_unknown_field"), &[]);
    assert_eq!(answer::<EntryResponse>(&newer), plain, "field 99 skipped");

    let mut stream = open(&daemon, START, &fixture("proc_start_unknown_fields"), &[]);
    let run = run_to_end(&mut stream, WAIT);
    assert_eq!(run.error, None);
    assert_eq!(run.stdout_text(), "unknown fields skipped\n");
    assert_eq!(run.end.map(|e| e.exit_code), Some(0));

    let newer_json = json!({"path": "proto/hello.txt", "traceNote": "sent by a newer client"});
    let reply = unary(&daemon, STAT, &[], &newer_json);
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["entry"]["name"], "hello.txt");
}

#[test]
fn gzip_request_bodies_and_messages_are_read() {
    let daemon = daemon_with_files();
    let plain: ListDirResponse = answer(&client::unary(
        &daemon,
        LIST_DIR,
        &fixture("fs_list_dir"),
        &[],
    ));
    assert_eq!(plain.entries.len(), 3);
    let gz = [("Content-Encoding", "gzip")];
    let reply = client::unary(&daemon, LIST_DIR, &fixture("fs_list_dir_gzip"), &gz);
    assert_eq!(answer::<ListDirResponse>(&reply), plain);

    let runs: Vec<Run> = [false, true]
        .into_iter()
        .map(|compressed| {
            let mut stream = if compressed {
                let body = envelope(1, &fixture("proc_start_build_step_gzip"));
                let headers = [("Connect-Content-Encoding", "gzip")];
                Stream::open_raw(&daemon, START, STREAM, &body, &headers)
            } else {
                open(&daemon, START, &fixture("proc_start_build_step"), &[])
            };
            run_to_end(&mut stream, WAIT)
        })
        .collect();
    assert_eq!(runs[1].error, None);
    assert_eq!(
        runs[1].stdout, runs[0].stdout,
        "the same step, sent gzipped"
    );
    assert!(runs[1].stdout_text().starts_with("step: install deps\n"));
    assert_eq!(runs[1].end, runs[0].end);
}

#[test]
fn answers_are_gzip_for_clients_that_accept_it() {
    let daemon = daemon_with_files();
    for i in 0..300 {
        let name = format!("proto/many/file-with-a-rather-long-name-{i:04}.txt");
        write_file(&root_home(&daemon).join(name), b"");
    }
    let plain = client::unary(&daemon, LIST_DIR, &fixture("fs_list_dir"), &[]);
    assert_eq!(plain.header("content-encoding"), None);
    let accept = [("Accept-Encoding", "gzip")];
    let reply = client::unary(&daemon, LIST_DIR, &fixture("fs_list_dir"), &accept);
    assert_eq!(
        reply.header("content-encoding"),
        Some("gzip"),
        "{} bytes",
        plain.body.len()
    );
    assert!(reply.body.len() < plain.body.len() / 4);
    assert_eq!(
        answer::<ListDirResponse>(&reply),
        answer::<ListDirResponse>(&plain)
    );

    let accept = [("Connect-Accept-Encoding", "gzip")];
    let mut stream = open(&daemon, START, &fixture("proc_start_big_output"), &accept);
    assert_eq!(stream.header("connect-content-encoding"), Some("gzip"));
    let run = run_to_end(&mut stream, WAIT);
    assert!(
        run.compressed,
        "output messages worth compressing came gzip'd"
    );
    assert_eq!(run.stdout, vec![b'a'; 262_144]);
    assert_eq!(run.end.map(|e| e.exit_code), Some(0));
    // And a client that does not say so gets none.
    let mut stream = open(&daemon, START, &fixture("proc_start_big_output"), &[]);
    assert_eq!(stream.header("connect-content-encoding"), None);
    assert!(!run_to_end(&mut stream, WAIT).compressed);
}

/// `SendSignal` with a signal envd's schema does not name: protobuf carries any number, which is
/// `unimplemented` as `SIGNAL_UNSPECIFIED` is; in JSON an unknown name cannot be read at all.
#[test]
fn a_signal_the_schema_does_not_name_is_refused_in_both_codecs() {
    let daemon = start();
    let send_signal = "process.Process/SendSignal";
    // process { pid: 1 }, signal: 2 (SIGINT, not one of envd's).
    let reply = client::unary(&daemon, send_signal, &[0x0a, 2, 0x08, 1, 0x10, 2], &[]);
    assert_eq!(
        json_error(&reply),
        (501, "unimplemented".into(), "invalid signal: 2".into())
    );
    let request = json!({"process": {"pid": 1}, "signal": "SIGNAL_UNSPECIFIED"});
    let reply = unary(&daemon, send_signal, &[], &request);
    assert_eq!(
        json_error(&reply),
        (
            501,
            "unimplemented".into(),
            "invalid signal: SIGNAL_UNSPECIFIED".into()
        )
    );
    let request = json!({"process": {"pid": 1}, "signal": "SIGNAL_SIGINT"});
    let reply = unary(&daemon, send_signal, &[], &request);
    assert_eq!(json_error(&reply).0, 400);
    assert_eq!(json_error(&reply).1, "invalid_argument");
}
