//! A Connect client of the binary codec: the fixtures' bytes sent as they are (unary
//! `application/proto`, streams `application/connect+proto` in envelopes, plain or gzip), and
//! the answers read back with the test's own messages (`messages`), checking the framing on
//! the way: the content type, the flags, an end-of-stream message in JSON.

use std::io::Read;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::messages::process::{
    EndEvent, Event, EventResponse, Output, ProcessConfig, StartRequest,
};
use crate::common::connect::{envelope, Envelope, Stream};
use crate::common::{Daemon, Reply, TOKEN};

pub const UNARY: &str = "application/proto";
pub const STREAM: &str = "application/connect+proto";
/// A pid no kernel gives (above any `pid_max`), in the fixtures that name a missing process.
pub const NO_PID: u32 = 2_000_000_000;
/// The watcher id of the fixtures, of the form sandboxd gives, that no daemon holds.
pub const NO_WATCHER: &str = "w00112233445566778899aabbccddeeff";

/// The bytes of `tests/fixtures/proto/<name>.bin` (see the README there).
pub fn fixture(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/proto")
        .join(format!("{name}.bin"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A unary call with `body` as `application/proto`, the token and `headers`.
pub fn unary(daemon: &Daemon, procedure: &str, body: &[u8], headers: &[(&str, &str)]) -> Reply {
    let mut all = vec![
        ("X-Access-Token", TOKEN),
        ("Content-Type", UNARY),
        ("Connect-Protocol-Version", "1"),
    ];
    all.extend_from_slice(headers);
    daemon.call_with("POST", &format!("/{procedure}"), &all, body)
}

pub fn decode<M: prost::Message + Default>(bytes: &[u8]) -> M {
    M::decode(bytes).unwrap_or_else(|e| {
        panic!(
            "not a {}: {e}: {bytes:?}",
            std::any::type_name::<M>()
                .rsplit("::")
                .next()
                .unwrap_or("message")
        )
    })
}

/// A unary answer in the binary codec: 200, `application/proto`, the message (ungzipped when
/// the answer says `Content-Encoding: gzip`).
pub fn answer<M: prost::Message + Default>(reply: &Reply) -> M {
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("content-type"), Some(UNARY), "{reply:?}");
    match reply.header("content-encoding") {
        Some("gzip") => decode(&gunzip(&reply.body)),
        None => decode(&reply.body),
        Some(other) => panic!("Content-Encoding {other}"),
    }
}

/// A unary call's error: always JSON, whatever the codec asked. (status, code, message).
pub fn json_error(reply: &Reply) -> (u16, String, String) {
    assert_eq!(
        reply.header("content-type"),
        Some("application/json"),
        "a Connect error is JSON in both codecs: {reply:?}"
    );
    let json = reply.json();
    let text = |v: &Value| v.as_str().unwrap_or("").to_string();
    (reply.status, text(&json["code"]), text(&json["message"]))
}

/// A server stream with `message` as its one envelope (flag 0) in the binary codec.
pub fn open(daemon: &Daemon, procedure: &str, message: &[u8], headers: &[(&str, &str)]) -> Stream {
    Stream::open_raw(daemon, procedure, STREAM, &envelope(0, message), headers)
}

/// A `Start` of `/bin/sh -c script` in the binary codec, as the orchestrator sends it.
pub fn start_sh(daemon: &Daemon, script: &str) -> Stream {
    let request = StartRequest {
        process: Some(ProcessConfig {
            cmd: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            ..Default::default()
        }),
        ..Default::default()
    };
    let message = prost::Message::encode_to_vec(&request);
    open(daemon, "process.Process/Start", &message, &[])
}

/// The next envelope, at most 10 s away, ungzipped when its flag 0x01 says so.
pub fn next(stream: &mut Stream) -> Envelope {
    next_within(stream, crate::common::connect::WAIT).expect("an envelope within 10 s")
}

/// As `next`, waiting at most `limit`; the flag 0x01 is cleared once the message is ungzipped.
pub fn next_within(stream: &mut Stream, limit: Duration) -> Option<Envelope> {
    stream
        .next_envelope_within(limit)
        .map(|e| inflate(stream, e).0)
}

/// `envelope` ungzipped when its flag 0x01 says so (the answer must have said
/// `Connect-Content-Encoding: gzip`), and whether it was.
fn inflate(stream: &Stream, mut envelope: Envelope) -> (Envelope, bool) {
    if envelope.flags & 0x01 == 0 {
        return (envelope, false);
    }
    assert_eq!(stream.header("connect-content-encoding"), Some("gzip"));
    envelope.message = gunzip(&envelope.message);
    envelope.flags &= !0x01;
    (envelope, true)
}

/// The end-of-stream message (flag 0x02, JSON in both codecs): its error as (code, message),
/// `None` for a clean end (`{}`).
pub fn end_of_stream(envelope: &Envelope) -> Option<(String, String)> {
    assert_eq!(envelope.flags & 0x02, 0x02, "not the end: {envelope:?}");
    let json: Value = serde_json::from_slice(&envelope.message)
        .unwrap_or_else(|e| panic!("the end of a stream is JSON ({e}): {:?}", envelope.message));
    let error = json.get("error")?;
    let text = |v: &Value| v.as_str().unwrap_or("none").to_string();
    Some((text(&error["code"]), text(&error["message"])))
}

/// What a process stream said in the binary codec, up to its end.
#[derive(Debug, Default)]
pub struct Run {
    pub pid: u32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub pty: Vec<u8>,
    /// Data events in the order they came.
    pub data_events: usize,
    /// The most output bytes one data event carried.
    pub largest_data: usize,
    pub end: Option<EndEvent>,
    /// The end-of-stream error, if any.
    pub error: Option<(String, String)>,
    /// Whether any message came gzip-compressed (flag 0x01).
    pub compressed: bool,
}

impl Run {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// Checks the answer's head (200, `application/connect+proto`) and reads the stream to its
/// end, at most `limit`; the first event must be `start`.
pub fn run_to_end(stream: &mut Stream, limit: Duration) -> Run {
    run_on(stream, Run::default(), limit)
}

/// As `run_to_end`, for a stream whose `start` (`pid`) was read already.
pub fn run_after_start(stream: &mut Stream, pid: u32, limit: Duration) -> Run {
    let run = Run {
        pid,
        ..Run::default()
    };
    run_on(stream, run, limit)
}

fn run_on(stream: &mut Stream, mut run: Run, limit: Duration) -> Run {
    assert_eq!(stream.status, 200);
    assert_eq!(stream.header("content-type"), Some(STREAM));
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let raw = stream
            .next_envelope_within(left)
            .unwrap_or_else(|| panic!("the stream did not end; so far {run:?}"));
        let (envelope, compressed) = inflate(stream, raw);
        if envelope.flags & 0x02 != 0 {
            run.error = end_of_stream(&envelope);
            return run;
        }
        run.compressed |= compressed;
        let event = decode::<EventResponse>(&envelope.message)
            .event
            .and_then(|e| e.event);
        match event {
            Some(Event::Start(start)) if run.pid == 0 => run.pid = start.pid,
            _ if run.pid == 0 => panic!("the first event is not start: {event:?}"),
            Some(Event::Data(data)) => {
                run.data_events += 1;
                let len = match &data.output {
                    Some(Output::Stdout(b) | Output::Stderr(b) | Output::Pty(b)) => b.len(),
                    None => 0,
                };
                run.largest_data = run.largest_data.max(len);
                match data.output {
                    Some(Output::Stdout(b)) => run.stdout.extend(b),
                    Some(Output::Stderr(b)) => run.stderr.extend(b),
                    Some(Output::Pty(b)) => run.pty.extend(b),
                    None => panic!("a data event without output"),
                }
            }
            Some(Event::End(end)) => run.end = Some(end),
            Some(Event::Keepalive(_)) => {}
            other => panic!("unexpected event {other:?}; so far {run:?}"),
        }
    }
}

/// The first event of a process stream: `start`, its pid.
pub fn started(stream: &mut Stream) -> u32 {
    assert_eq!(stream.status, 200);
    assert_eq!(stream.header("content-type"), Some(STREAM));
    let envelope = next(stream);
    assert_eq!(envelope.flags & 0x02, 0, "ended at once: {envelope:?}");
    match decode::<EventResponse>(&envelope.message)
        .event
        .and_then(|e| e.event)
    {
        Some(Event::Start(start)) => start.pid,
        other => panic!("a start event first, got {other:?}"),
    }
}

pub fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .unwrap_or_else(|e| panic!("not gzip ({e}): {bytes:?}"));
    out
}

/// `bytes` with every `from` replaced by `to` of the same length (a fixture's watcher id by
/// the one a daemon gave: the encoding stays the foreign encoder's, lengths unchanged).
pub fn substitute(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
    assert_eq!(from.len(), to.len(), "a substitute of the same length");
    let mut out = bytes.to_vec();
    let at = out
        .windows(from.len())
        .position(|w| w == from.as_bytes())
        .unwrap_or_else(|| panic!("{from} is not in the fixture"));
    out[at..at + to.len()].copy_from_slice(to.as_bytes());
    out
}
