//! Every method of both services in both codecs, as one table: each row is called once as
//! JSON (`application/json`, `application/connect+json`) and once as binary protobuf
//! (`application/proto`, `application/connect+proto`) with the fixture a foreign encoder
//! wrote, each codec against a daemon of its own, and the two answers compared field by field
//! (the proto one decoded by the test's own messages and written as proto3 JSON).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::as_json::{self, normalize};
use super::client::{self, fixture, substitute, NO_WATCHER};
use crate::common::connect::{self, envelope, Stream, AS_USER};
use crate::common::{start, Daemon, Reply};

/// One method of a service and the message it is sent in each codec: the JSON request(s),
/// and the fixture(s) holding the same message in binary protobuf (their README gives each
/// fixture's content as proto3 JSON: `the_two_codecs_send_the_same_messages` compares).
/// `$WATCHER` is the id the row before gave.
pub struct Row {
    pub method: &'static str,
    pub json: &'static [&'static str],
    pub proto: &'static [&'static str],
}

const fn row(
    method: &'static str,
    json: &'static [&'static str],
    proto: &'static [&'static str],
) -> Row {
    Row {
        method,
        json,
        proto,
    }
}

/// Every method of `filesystem.Filesystem` and `process.Process`, in the order the test calls
/// them (each row's state is the rows' before it).
#[rustfmt::skip]
pub const EVERY_METHOD: [Row; 17] = [
    //   method                                     JSON request(s)                                                       proto fixture(s)
    row("filesystem.Filesystem/Stat",             &[r#"{"path":"proto/hello.txt"}"#],                                   &["fs_stat"]),
    row("filesystem.Filesystem/MakeDir",          &[r#"{"path":"proto/made/deeper"}"#],                                 &["fs_make_dir"]),
    row("filesystem.Filesystem/Move",             &[r#"{"source":"proto/made","destination":"proto/moved"}"#],          &["fs_move"]),
    row("filesystem.Filesystem/ListDir",          &[r#"{"path":"proto","depth":2}"#],                                   &["fs_list_dir"]),
    row("filesystem.Filesystem/Remove",           &[r#"{"path":"proto/moved"}"#],                                       &["fs_remove"]),
    row("filesystem.Filesystem/WatchDir",         &[r#"{"path":"proto","recursive":true,"includeEntry":true}"#],        &["fs_watch_dir"]),
    row("filesystem.Filesystem/CreateWatcher",    &[r#"{"path":"proto","recursive":true,"includeEntry":true}"#],        &["fs_create_watcher"]),
    row("filesystem.Filesystem/GetWatcherEvents", &[r#"{"watcherId":"$WATCHER"}"#],                                     &["fs_get_watcher_events"]),
    row("filesystem.Filesystem/RemoveWatcher",    &[r#"{"watcherId":"$WATCHER"}"#],                                     &["fs_remove_watcher"]),
    row("process.Process/Start",                  &[r#"{"process":{"cmd":"cat"},"tag":"proto-cat","stdin":true}"#],     &["proc_start_cat"]),
    row("process.Process/List",                   &["{}"],                                                              &["proc_list"]),
    row("process.Process/Connect",                &[r#"{"process":{"tag":"proto-cat"}}"#],                              &["proc_connect_tag"]),
    row("process.Process/SendInput",              &[r#"{"process":{"tag":"proto-cat"},"input":{"stdin":"aGVsbG8gZnJvbSBwcm90b2J1Zgo="}}"#], &["proc_send_input_stdin"]),
    row("process.Process/StreamInput",            &[r#"{"start":{"process":{"tag":"proto-cat"}}}"#,
                                                    r#"{"data":{"input":{"stdin":"c3RyZWFtZWQgbGluZQo="}}}"#,
                                                    r#"{"keepalive":{}}"#],                                             &["proc_stream_input_start", "proc_stream_input_data", "proc_stream_input_keepalive"]),
    row("process.Process/CloseStdin",             &[r#"{"process":{"tag":"proto-cat"}}"#],                              &["proc_close_stdin"]),
    row("process.Process/Update",                 &[r#"{"process":{"tag":"proto-pty"},"pty":{"size":{"cols":100,"rows":30}}}"#], &["proc_update_pty"]),
    row("process.Process/SendSignal",             &[r#"{"process":{"tag":"proto-sleep"},"signal":"SIGNAL_SIGKILL"}"#],  &["proc_send_signal_kill"]),
];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Codec {
    Json,
    Proto,
}

/// One daemon, the table's calls in one codec, and what each answered (normalized).
struct Session {
    codec: Codec,
    daemon: Daemon,
    watcher: String,
    seen: Vec<(String, Value)>,
}

impl Session {
    fn new(codec: Codec) -> Session {
        let daemon = start();
        crate::common::write_file(&daemon.home().join("proto/hello.txt"), b"hello");
        Session {
            codec,
            daemon,
            watcher: NO_WATCHER.to_string(),
            seen: Vec::new(),
        }
    }

    fn row(method: &str) -> &'static Row {
        let found = EVERY_METHOD.iter().find(|r| r.method == method);
        found.unwrap_or_else(|| panic!("{method} is not in the table"))
    }

    /// The row's request messages in this session's codec, the watcher id put in.
    fn messages(&self, row: &Row) -> Vec<Vec<u8>> {
        match self.codec {
            Codec::Json => row
                .json
                .iter()
                .map(|j| j.replace("$WATCHER", &self.watcher).into_bytes())
                .collect(),
            Codec::Proto => row
                .proto
                .iter()
                .map(|name| {
                    let bytes = fixture(name);
                    if name.ends_with("_watcher_events") || name.ends_with("_remove_watcher") {
                        substitute(&bytes, NO_WATCHER, &self.watcher)
                    } else {
                        bytes
                    }
                })
                .collect(),
        }
    }

    fn note(&mut self, what: &str, value: &Value) {
        let value = normalize(value, &self.daemon.home());
        self.seen.push((what.to_string(), value));
    }

    /// A unary row: 200 in the codec asked, the answer as JSON.
    fn unary(&mut self, method: &str) -> Value {
        let row = Session::row(method);
        let body = self.messages(row).concat();
        let user = user_of(method);
        let (content_type, reply) = match self.codec {
            Codec::Json => {
                let mut headers = vec![
                    ("X-Access-Token", crate::common::TOKEN),
                    ("Content-Type", "application/json"),
                ];
                headers.extend_from_slice(user);
                let target = format!("/{method}");
                let reply = self.daemon.call_with("POST", &target, &headers, &body);
                ("application/json", reply)
            }
            Codec::Proto => (
                client::UNARY,
                client::unary(&self.daemon, method, &body, user),
            ),
        };
        assert_eq!(
            reply.status,
            200,
            "{method} in {:?}: {}",
            self.codec,
            reply.text()
        );
        assert_eq!(reply.header("content-type"), Some(content_type), "{method}");
        let value = self.decode_unary(method, &reply);
        self.note(method, &value);
        value
    }

    fn decode_unary(&self, method: &str, reply: &Reply) -> Value {
        match self.codec {
            Codec::Json => reply.json(),
            Codec::Proto => as_json::unary(method, &reply.body),
        }
    }

    /// A streaming row's call (its messages each in an envelope).
    fn open(&self, method: &str) -> Stream {
        let body: Vec<u8> = self
            .messages(Session::row(method))
            .iter()
            .flat_map(|m| envelope(0, m))
            .collect();
        let content_type = match self.codec {
            Codec::Json => "application/connect+json",
            Codec::Proto => client::STREAM,
        };
        let user = user_of(method);
        let stream = Stream::open_raw(&self.daemon, method, content_type, &body, user);
        assert_eq!(stream.status, 200, "{method}");
        assert_eq!(stream.header("content-type"), Some(content_type));
        stream
    }

    /// The next message of `stream` (a call of `method`) as JSON, `{"end of stream": ...}`
    /// for the last one.
    fn next(&mut self, stream: &mut Stream, method: &str, what: &str) -> Value {
        let envelope = client::next(stream);
        let value = if envelope.flags & 0x02 != 0 {
            let end: Value = serde_json::from_slice(&envelope.message).unwrap();
            json!({ "end of stream": end })
        } else {
            match self.codec {
                Codec::Json => serde_json::from_slice(&envelope.message).unwrap(),
                Codec::Proto => as_json::streamed(method, &envelope.message),
            }
        };
        self.note(what, &value);
        value
    }

    fn setup(&self, request: Value) -> Stream {
        let mut stream = Stream::open(&self.daemon, "process.Process/Start", &request, &[]);
        assert!(stream.next().json["event"]["start"]["pid"].is_u64());
        stream
    }
}

/// The filesystem rows' relative paths are in `user`'s home; processes run as the default
/// user (root), which a daemon that is not root can start.
fn user_of(method: &str) -> &'static [(&'static str, &'static str)] {
    if method.starts_with("filesystem.") {
        &[("Authorization", AS_USER)]
    } else {
        &[]
    }
}

/// The table's calls in `codec`: what each answered, in order.
fn every_method_in(codec: Codec) -> Vec<(String, Value)> {
    let mut s = Session::new(codec);
    for method in ["Stat", "MakeDir", "Move", "ListDir", "Remove"] {
        s.unary(&format!("filesystem.Filesystem/{method}"));
    }
    let home = s.daemon.home();

    let watch = "filesystem.Filesystem/WatchDir";
    let mut stream = s.open(watch);
    s.next(&mut stream, watch, "WatchDir: start");
    std::fs::create_dir(home.join("proto/w1")).unwrap();
    s.next(&mut stream, watch, "WatchDir: an event");
    drop(stream);

    let id = s.unary("filesystem.Filesystem/CreateWatcher")["watcherId"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(id.len(), NO_WATCHER.len(), "{id}");
    s.watcher = id;
    std::fs::create_dir(home.join("proto/w2")).unwrap();
    watcher_events(&mut s, &home);
    s.unary("filesystem.Filesystem/RemoveWatcher");

    // The processes the rows below address by tag, started in JSON in both sessions.
    let _pty = s.setup(json!({"process": {"cmd": "/bin/sh"},
                              "pty": {"size": {"cols": 80, "rows": 24}}, "tag": "proto-pty"}));
    let mut sleeper =
        s.setup(json!({"process": {"cmd": "sleep", "args": ["30"]}, "tag": "proto-sleep"}));

    let start = "process.Process/Start";
    let mut cat = s.open(start);
    s.next(&mut cat, start, "Start: start");
    let mut list = s.unary("process.Process/List");
    sort_by_tag(&mut list);
    if let Some((_, seen)) = s.seen.last_mut() {
        sort_by_tag(seen);
    }
    let cat_pid = pid_of(&list, "proto-cat");
    let mut attached = s.open("process.Process/Connect");
    let first = s.next(&mut attached, "process.Process/Connect", "Connect: start");
    assert_eq!(first["event"]["start"]["pid"], json!(cat_pid));

    s.unary("process.Process/SendInput");
    s.next(&mut cat, start, "Start: the input sent, on stdout");
    s.next(&mut attached, start, "Connect: the input sent, on stdout");

    let input = "process.Process/StreamInput";
    let mut answer = s.open(input);
    let message = client::next(&mut answer);
    // The answer's bytes: StreamInputResponse, empty (`{}` in JSON), in a plain envelope.
    let empty: &[u8] = match s.codec {
        Codec::Json => b"{}",
        Codec::Proto => b"",
    };
    assert_eq!((message.flags, message.message.as_slice()), (0, empty));
    let value = match s.codec {
        Codec::Json => serde_json::from_slice(&message.message).unwrap(),
        Codec::Proto => as_json::unary(input, &message.message),
    };
    s.note("StreamInput: its answer", &value);
    s.next(&mut answer, input, "StreamInput: its end");
    s.next(&mut cat, start, "Start: the input streamed, on stdout");

    s.unary("process.Process/CloseStdin");
    s.next(&mut cat, start, "Start: cat's end");
    s.next(&mut cat, start, "Start: the end of its stream");

    s.unary("process.Process/Update");
    s.unary("process.Process/SendSignal");
    let end = sleeper.next();
    assert_eq!(end.json["event"]["end"]["status"], "signal: killed");
    s.seen
}

/// `GetWatcherEvents` until it has reported the directory made (at most 10 s).
fn watcher_events(s: &mut Session, home: &Path) {
    let deadline = Instant::now() + connect::WAIT;
    loop {
        let events = s.unary("filesystem.Filesystem/GetWatcherEvents");
        if events["events"].as_array().is_some_and(|e| !e.is_empty()) {
            return;
        }
        s.seen.pop();
        assert!(Instant::now() < deadline, "no event for {}", home.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn sort_by_tag(list: &mut Value) {
    if let Some(processes) = list["processes"].as_array_mut() {
        processes.sort_by_key(|p| p["tag"].as_str().unwrap_or("").to_string());
    }
}

fn pid_of(list: &Value, tag: &str) -> u64 {
    let processes = list["processes"].as_array().cloned().unwrap_or_default();
    let found = processes.iter().find(|p| p["tag"] == tag);
    found
        .and_then(|p| p["pid"].as_u64())
        .unwrap_or_else(|| panic!("{tag} not listed: {list}"))
}

#[test]
fn every_method_answers_the_same_in_both_codecs() {
    let json = every_method_in(Codec::Json);
    let proto = every_method_in(Codec::Proto);
    let names = |seen: &[(String, Value)]| seen.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&json), names(&proto));
    for ((what, j), (_, p)) in json.iter().zip(&proto) {
        assert_eq!(j, p, "{what}: JSON answered {j}, binary protobuf {p}");
    }
    // Not vacuous: the answers hold what the calls did.
    let answer = |what: &str| &json.iter().find(|(n, _)| n == what).unwrap().1;
    assert_eq!(answer("filesystem.Filesystem/Stat")["entry"]["size"], "5");
    assert_eq!(
        answer("filesystem.Filesystem/Move")["entry"]["path"],
        "~/proto/moved"
    );
    let listed = answer("filesystem.Filesystem/ListDir")["entries"].clone();
    let paths: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["path"].as_str())
        .collect();
    assert_eq!(
        paths,
        ["~/proto/hello.txt", "~/proto/moved", "~/proto/moved/deeper"]
    );
    assert_eq!(
        answer("WatchDir: an event")["filesystem"]["name"],
        "w1",
        "{json:?}"
    );
    assert_eq!(
        answer("Start: the input streamed, on stdout")["event"]["data"]["stdout"],
        "c3RyZWFtZWQgbGluZQo="
    );
    assert_eq!(
        answer("Start: cat's end")["event"]["end"]["status"],
        "exit status 0"
    );
}
