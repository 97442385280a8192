//! envd's `process.proto` messages (field names, numbers and oneofs as envd's schema has them):
//! each type is both the protobuf message (`prost`) and its proto3 JSON form (serde,
//! `connect::json`'s rules). Requests are read (unknown fields skipped, absent ones default),
//! events and answers written. A message with a oneof reads its JSON through a plain struct of
//! options (`*Json`), so that two members sent at once are refused with a clear message.

use std::collections::BTreeMap;

use base64_simd::STANDARD;
use serde::{Deserialize, Serialize};

use crate::connect::json::{self, integer};
use crate::connect::{Codec, Error};
use crate::proc::{Exit, OutputKind, Selector, CHUNK};
use crate::proto_enum;

/// `ProcessConfig`: what to run. Written back by `List` as it was sent.
#[derive(Clone, PartialEq, Deserialize, Serialize, prost::Message)]
#[serde(rename_all = "camelCase", default)]
pub struct ProcessConfig {
    #[prost(string, tag = "1")]
    pub cmd: String,
    #[prost(string, repeated, tag = "2")]
    pub args: Vec<String>,
    #[prost(btree_map = "string, string", tag = "3")]
    pub envs: BTreeMap<String, String>,
    #[prost(string, optional, tag = "4")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// `PTY.Size`.
#[derive(Clone, Copy, PartialEq, Deserialize, prost::Message)]
#[serde(rename_all = "camelCase", default)]
pub struct PtySize {
    #[prost(uint32, tag = "1")]
    #[serde(deserialize_with = "integer::deserialize")]
    pub cols: u32,
    #[prost(uint32, tag = "2")]
    #[serde(deserialize_with = "integer::deserialize")]
    pub rows: u32,
}

/// `PTY`.
#[derive(Clone, Copy, PartialEq, Deserialize, prost::Message)]
#[serde(rename_all = "camelCase", default)]
pub struct Pty {
    #[prost(message, optional, tag = "1")]
    pub size: Option<PtySize>,
}

/// `StartRequest`.
#[derive(Clone, PartialEq, Deserialize, prost::Message)]
#[serde(rename_all = "camelCase", default)]
pub struct StartRequest {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessConfig>,
    #[prost(message, optional, tag = "2")]
    pub pty: Option<Pty>,
    #[prost(string, optional, tag = "3")]
    pub tag: Option<String>,
    /// Absent means true (envd keeps old clients' stdin); the SDKs send false unless asked.
    #[prost(bool, optional, tag = "4")]
    pub stdin: Option<bool>,
}

/// `ProcessSelector`: a oneof of `pid` and `tag`.
#[derive(Clone, PartialEq, Deserialize, prost::Message)]
#[serde(try_from = "SelectorJson")]
pub struct ProcessSelector {
    #[prost(oneof = "SelectorField", tags = "1, 2")]
    pub selector: Option<SelectorField>,
}

/// `ProcessSelector`'s oneof `selector`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum SelectorField {
    #[prost(uint32, tag = "1")]
    Pid(u32),
    #[prost(string, tag = "2")]
    Tag(String),
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct SelectorJson {
    #[serde(deserialize_with = "optional_u32")]
    pid: Option<u32>,
    tag: Option<String>,
}

impl TryFrom<SelectorJson> for ProcessSelector {
    type Error = &'static str;

    fn try_from(json: SelectorJson) -> Result<ProcessSelector, Self::Error> {
        let selector = match (json.pid, json.tag) {
            (Some(_), Some(_)) => return Err("process selector: pid and tag are one of: send one"),
            (Some(pid), None) => Some(SelectorField::Pid(pid)),
            (None, Some(tag)) => Some(SelectorField::Tag(tag)),
            (None, None) => None,
        };
        Ok(ProcessSelector { selector })
    }
}

/// `ConnectRequest`, `CloseStdinRequest`: a selector only.
#[derive(Clone, PartialEq, Deserialize, prost::Message)]
#[serde(rename_all = "camelCase", default)]
pub struct SelectorRequest {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessSelector>,
}

/// The selector of a request that has one, or `invalid_argument`.
pub fn selector(process: Option<&ProcessSelector>) -> Result<Selector, Error> {
    match process.and_then(|process| process.selector.as_ref()) {
        Some(SelectorField::Pid(pid)) => Ok(Selector::Pid(*pid)),
        Some(SelectorField::Tag(tag)) => Ok(Selector::Tag(tag.clone())),
        None => Err(Error::invalid_argument(
            "process selector: a pid or a tag is needed",
        )),
    }
}

/// `ProcessInput`: a oneof of `stdin` and `pty` bytes.
#[derive(Clone, PartialEq, Deserialize, prost::Message)]
#[serde(try_from = "InputJson")]
pub struct ProcessInput {
    #[prost(oneof = "Input", tags = "1, 2")]
    pub input: Option<Input>,
}

/// Input for a process's stdin, or for its terminal (`ProcessInput`'s oneof `input`).
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Input {
    #[prost(bytes = "vec", tag = "1")]
    Stdin(Vec<u8>),
    #[prost(bytes = "vec", tag = "2")]
    Pty(Vec<u8>),
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct InputJson {
    stdin: Option<String>,
    pty: Option<String>,
}

impl TryFrom<InputJson> for ProcessInput {
    type Error = &'static str;

    fn try_from(json: InputJson) -> Result<ProcessInput, Self::Error> {
        let decode = |text: &str| json::bytes::decode(text).ok_or("process input: invalid base64");
        let input = match (json.stdin, json.pty) {
            (Some(_), Some(_)) => return Err("process input: stdin and pty are one of: send one"),
            (Some(stdin), None) => Some(Input::Stdin(decode(&stdin)?)),
            (None, Some(pty)) => Some(Input::Pty(decode(&pty)?)),
            (None, None) => None,
        };
        Ok(ProcessInput { input })
    }
}

impl ProcessInput {
    /// The input, or `invalid_argument` when neither member is set.
    pub fn into_input(self) -> Result<Input, Error> {
        self.input
            .ok_or_else(|| Error::invalid_argument("process input: stdin or pty bytes are needed"))
    }
}

/// `SendInputRequest`.
#[derive(Clone, PartialEq, Deserialize, prost::Message)]
#[serde(rename_all = "camelCase", default)]
pub struct SendInputRequest {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessSelector>,
    #[prost(message, optional, tag = "2")]
    pub input: Option<ProcessInput>,
}

proto_enum!(
    /// `Signal`: the two envd sends.
    Signal {
        Unspecified = 0 => "SIGNAL_UNSPECIFIED",
        Sigterm = 15 => "SIGNAL_SIGTERM",
        Sigkill = 9 => "SIGNAL_SIGKILL",
    }
);

/// `SendSignalRequest`.
#[derive(Clone, PartialEq, Deserialize, prost::Message)]
#[serde(rename_all = "camelCase", default)]
pub struct SendSignalRequest {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessSelector>,
    #[prost(enumeration = "Signal", tag = "2")]
    #[serde(deserialize_with = "Signal::from_json")]
    pub signal: i32,
}

/// `UpdateRequest`.
#[derive(Clone, PartialEq, Deserialize, prost::Message)]
#[serde(rename_all = "camelCase", default)]
pub struct UpdateRequest {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessSelector>,
    #[prost(message, optional, tag = "2")]
    pub pty: Option<Pty>,
}

/// `ProcessInfo`.
#[derive(Clone, PartialEq, Serialize, prost::Message)]
#[serde(rename_all = "camelCase")]
pub struct ProcessInfo {
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<ProcessConfig>,
    #[prost(uint32, tag = "2")]
    pub pid: u32,
    #[prost(string, optional, tag = "3")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// `ListResponse`.
#[derive(Clone, PartialEq, Serialize, prost::Message)]
#[serde(rename_all = "camelCase")]
pub struct ListResponse {
    #[prost(message, repeated, tag = "1")]
    pub processes: Vec<ProcessInfo>,
}

/// The empty messages (`ListRequest`, `SendInputResponse`, `SendSignalResponse`, ...).
#[derive(Clone, Copy, PartialEq, Deserialize, Serialize, prost::Message)]
pub struct Empty {}

/// `StartResponse` and `ConnectResponse`: one `ProcessEvent`.
#[derive(Clone, PartialEq, Serialize, prost::Message)]
pub struct EventResponse {
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<ProcessEvent>,
}

impl EventResponse {
    pub fn of(event: Event) -> EventResponse {
        EventResponse {
            event: Some(ProcessEvent { event: Some(event) }),
        }
    }
}

/// `ProcessEvent`.
#[derive(Clone, PartialEq, Serialize, prost::Message)]
pub struct ProcessEvent {
    #[prost(oneof = "Event", tags = "1, 2, 3, 4")]
    #[serde(flatten)]
    pub event: Option<Event>,
}

/// `ProcessEvent`'s oneof `event` (`data`, the bulk of a stream, is written by
/// [`write_data_event`] without this type).
#[derive(Clone, PartialEq, Serialize, prost::Oneof)]
#[serde(rename_all = "camelCase")]
pub enum Event {
    #[prost(message, tag = "1")]
    Start(StartEvent),
    #[prost(message, tag = "2")]
    Data(DataEvent),
    #[prost(message, tag = "3")]
    End(EndEvent),
    #[prost(message, tag = "4")]
    Keepalive(Empty),
}

/// `ProcessEvent.StartEvent`.
#[derive(Clone, Copy, PartialEq, Serialize, prost::Message)]
pub struct StartEvent {
    #[prost(uint32, tag = "1")]
    pub pid: u32,
}

/// `ProcessEvent.DataEvent`.
#[derive(Clone, PartialEq, Serialize, prost::Message)]
pub struct DataEvent {
    #[prost(oneof = "Output", tags = "1, 2, 3")]
    #[serde(flatten)]
    pub output: Option<Output>,
}

/// `ProcessEvent.DataEvent`'s oneof `output`.
#[derive(Clone, PartialEq, Serialize, prost::Oneof)]
#[serde(rename_all = "camelCase")]
pub enum Output {
    #[prost(bytes = "vec", tag = "1")]
    #[serde(serialize_with = "json::bytes::serialize")]
    Stdout(Vec<u8>),
    #[prost(bytes = "vec", tag = "2")]
    #[serde(serialize_with = "json::bytes::serialize")]
    Stderr(Vec<u8>),
    #[prost(bytes = "vec", tag = "3")]
    #[serde(serialize_with = "json::bytes::serialize")]
    Pty(Vec<u8>),
}

/// Appends `StartResponse { event { data { stdout: bytes } } }` (or `stderr`, `pty`) in `codec`
/// to `out`, the bytes written straight into it (as base64 in JSON): no intermediate message
/// for what is most of a busy process's stream.
pub fn write_data_event(codec: Codec, out: &mut Vec<u8>, kind: OutputKind, bytes: &[u8]) {
    match codec {
        Codec::Json => write_json_data_event(out, kind, bytes),
        Codec::Proto => write_proto_data_event(out, kind, bytes),
    }
}

fn write_json_data_event(out: &mut Vec<u8>, kind: OutputKind, bytes: &[u8]) {
    let field: &[u8] = match kind {
        OutputKind::Stdout => b"stdout",
        OutputKind::Stderr => b"stderr",
        OutputKind::Pty => b"pty",
    };
    out.extend_from_slice(br#"{"event":{"data":{""#);
    out.extend_from_slice(field);
    out.extend_from_slice(br#"":""#);
    STANDARD.encode_append(bytes, out);
    out.extend_from_slice(br#""}}}"#);
}

/// The three nested length-delimited fields, by `prost`'s encoding functions: event (1), data
/// (2), then stdout (1), stderr (2) or pty (3).
fn write_proto_data_event(out: &mut Vec<u8>, kind: OutputKind, bytes: &[u8]) {
    out.reserve(PROTO_HEADER_MAX + bytes.len());
    proto_data_header(out, kind, bytes.len());
    out.extend_from_slice(bytes);
}

/// The longest header [`proto_data_header`] writes for output of up to [`CHUNK`] bytes: three
/// keys of one byte and three lengths of at most three (each under 2^21).
pub const PROTO_HEADER_MAX: usize = 12;
const _: () = assert!(CHUNK + 8 < 1 << 21);

/// Appends the header of a protobuf data event of `len` bytes of output.
fn proto_data_header(out: &mut impl prost::bytes::BufMut, kind: OutputKind, len: usize) {
    use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
    let field = match kind {
        OutputKind::Stdout => 1,
        OutputKind::Stderr => 2,
        OutputKind::Pty => 3,
    };
    let len64 = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    let output = key_len(field) + encoded_len_varint(len64(len)) + len;
    let data = key_len(2) + encoded_len_varint(len64(output)) + output;
    encode_key(1, WireType::LengthDelimited, out);
    encode_varint(len64(data), out);
    encode_key(2, WireType::LengthDelimited, out);
    encode_varint(len64(output), out);
    encode_key(field, WireType::LengthDelimited, out);
    encode_varint(len64(len), out);
}

/// Appends a protobuf data event whose output `read` appends to `out` (at most `max` bytes,
/// and at most [`CHUNK`], as asked): the output is read straight into place, after room for the header, which
/// is written before it once its length is known (the output moved back over the room left
/// when the header is shorter, as for a read under 16 KiB). False, and nothing appended, when
/// `read` read nothing.
pub fn read_proto_data_event(
    out: &mut Vec<u8>,
    kind: OutputKind,
    max: usize,
    read: impl FnOnce(&mut Vec<u8>, usize) -> usize,
) -> bool {
    let max = max.min(CHUNK);
    let start = out.len();
    out.extend_from_slice(&[0; PROTO_HEADER_MAX]);
    let body = start + PROTO_HEADER_MAX;
    read(out, max);
    let len = out.len() - body;
    if len == 0 || len > max {
        // Nothing read (or, against `read`'s promise, more than asked: not sent).
        out.truncate(start);
        return false;
    }
    let mut header = [0u8; PROTO_HEADER_MAX];
    let mut free = &mut header[..];
    proto_data_header(&mut free, kind, len);
    let header_len = PROTO_HEADER_MAX - free.len();
    let at = start + header_len;
    if at < body {
        // Only for a short read (under 16 KiB): a whole chunk's header fills its room. (A
        // move onto itself is not free: musl's memmove copies it byte by byte, backwards.)
        out.copy_within(body.., at);
        out.truncate(at + len);
    }
    out[start..at].copy_from_slice(&header[..header_len]);
    true
}

/// `ProcessEvent.EndEvent`, as envd fills it from Go's `ProcessState`.
#[derive(Clone, PartialEq, Serialize, prost::Message)]
#[serde(rename_all = "camelCase")]
pub struct EndEvent {
    #[prost(sint32, tag = "1")]
    pub exit_code: i32,
    #[prost(bool, tag = "2")]
    pub exited: bool,
    #[prost(string, tag = "3")]
    pub status: String,
    #[prost(string, optional, tag = "4")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl From<Exit> for EndEvent {
    fn from(exit: Exit) -> EndEvent {
        EndEvent {
            exit_code: exit.code(),
            exited: exit.exited(),
            status: exit.status(),
            error: exit.error(),
        }
    }
}

/// An optional `uint32`, as a number or a string.
fn optional_u32<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<u32>, D::Error> {
    #[derive(Deserialize)]
    struct Wrapped(#[serde(deserialize_with = "integer::deserialize")] u32);
    Option::<Wrapped>::deserialize(deserializer).map(|w| w.map(|Wrapped(n)| n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::process::WaitStatus;
    use serde_json::json;

    #[test]
    fn requests_read_as_the_sdks_send_them() {
        let start: StartRequest = serde_json::from_str(
            r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"},
                "cwd":"/tmp"},"stdin":false,"pty":{"size":{"cols":80,"rows":"24"}},"tag":"t"}"#,
        )
        .unwrap();
        let process = start.process.unwrap();
        assert_eq!(process.args, ["-l", "-c", "echo hi"]);
        assert_eq!(process.cwd.as_deref(), Some("/tmp"));
        let size = start.pty.unwrap().size.unwrap();
        assert_eq!((size.cols, size.rows), (80, 24));
        assert_eq!(
            (start.stdin, start.tag.as_deref()),
            (Some(false), Some("t"))
        );

        let by_pid: SelectorRequest = serde_json::from_str(r#"{"process":{"pid":42}}"#).unwrap();
        assert_eq!(
            selector(by_pid.process.as_ref()).unwrap(),
            Selector::Pid(42)
        );
        let by_tag: SelectorRequest = serde_json::from_str(r#"{"process":{"tag":"web"}}"#).unwrap();
        assert_eq!(
            selector(by_tag.process.as_ref()).unwrap(),
            Selector::Tag("web".into())
        );
        for bad in [r#"{}"#, r#"{"process":{}}"#] {
            let request: SelectorRequest = serde_json::from_str(bad).unwrap();
            assert!(selector(request.process.as_ref()).is_err(), "{bad}");
        }
        let both = serde_json::from_str::<SelectorRequest>(r#"{"process":{"pid":1,"tag":"x"}}"#);
        let error = both.unwrap_err().to_string();
        assert!(error.contains("pid and tag are one of"), "{error}");
        assert!(serde_json::from_str::<SelectorRequest>(r#"{"process":{"pid":-1}}"#).is_err());

        let signal: SendSignalRequest =
            serde_json::from_str(r#"{"process":{"pid":1},"signal":"SIGNAL_SIGKILL"}"#).unwrap();
        assert_eq!(signal.signal, Signal::Sigkill as i32);
        let signal: SendSignalRequest = serde_json::from_str(r#"{"signal":15}"#).unwrap();
        assert_eq!(signal.signal, Signal::Sigterm as i32);

        let input: SendInputRequest =
            serde_json::from_str(r#"{"process":{"pid":1},"input":{"stdin":"aGk="}}"#).unwrap();
        let Input::Stdin(bytes) = input.input.unwrap().into_input().unwrap() else {
            panic!("stdin");
        };
        assert_eq!(bytes, b"hi");
        for bad in [
            r#"{"input":{"stdin":"***"}}"#,
            r#"{"input":{"stdin":"aGk=","pty":"aGk="}}"#,
        ] {
            assert!(
                serde_json::from_str::<SendInputRequest>(bad).is_err(),
                "{bad}"
            );
        }
        let none: SendInputRequest = serde_json::from_str(r#"{"input":{}}"#).unwrap();
        assert!(none.input.unwrap().into_input().is_err());
    }

    #[test]
    fn requests_read_the_same_from_protobuf() {
        use prost::Message;
        let request = StartRequest {
            process: Some(ProcessConfig {
                cmd: "/bin/bash".into(),
                args: vec!["-l".into(), "-c".into(), "echo hi".into()],
                envs: [("A".to_string(), "1".to_string())].into(),
                cwd: Some("/tmp".into()),
            }),
            pty: Some(Pty {
                size: Some(PtySize { cols: 80, rows: 24 }),
            }),
            tag: Some("_system".into()),
            stdin: Some(false),
        };
        let bytes = request.encode_to_vec();
        assert_eq!(StartRequest::decode(&bytes[..]).unwrap(), request);
        // `stdin` absent and present-false differ in protobuf as in JSON.
        let absent = StartRequest::decode(&[][..]).unwrap();
        assert_eq!(absent.stdin, None);
        let selector = |bytes: &[u8]| {
            let request = SelectorRequest::decode(bytes).unwrap();
            super::selector(request.process.as_ref()).ok()
        };
        assert_eq!(selector(&[0x0a, 2, 0x08, 42]), Some(Selector::Pid(42)));
        assert_eq!(
            selector(&[0x0a, 3, 0x12, 1, b'w']),
            Some(Selector::Tag("w".into()))
        );
        // Both members sent: the last one wins, as protobuf's oneofs read.
        assert_eq!(
            selector(&[0x0a, 5, 0x12, 1, b'w', 0x08, 7]),
            Some(Selector::Pid(7))
        );
        assert_eq!(selector(&[0x0a, 0]), None);
        let signal = SendSignalRequest::decode(&[0x10, 9][..]).unwrap();
        assert_eq!(signal.signal, Signal::Sigkill as i32);
        let unknown = SendSignalRequest::decode(&[0x10, 2][..]).unwrap();
        assert_eq!(Signal::try_from(unknown.signal).ok(), None);
    }

    #[test]
    fn events_are_envds_oneofs() {
        let json = |event: Event| serde_json::to_string(&EventResponse::of(event)).unwrap();
        let data = |kind, bytes: &[u8]| {
            let mut out = Vec::new();
            write_data_event(Codec::Json, &mut out, kind, bytes);
            String::from_utf8(out).unwrap()
        };
        assert_eq!(
            json(Event::Start(StartEvent { pid: 7 })),
            r#"{"event":{"start":{"pid":7}}}"#
        );
        assert_eq!(
            data(OutputKind::Stderr, b"hi"),
            r#"{"event":{"data":{"stderr":"aGk="}}}"#
        );
        assert_eq!(
            json(Event::Data(DataEvent {
                output: Some(Output::Stderr(b"hi".to_vec()))
            })),
            data(OutputKind::Stderr, b"hi")
        );
        assert_eq!(
            json(Event::End(Exit(WaitStatus::Exited(0)).into())),
            r#"{"event":{"end":{"exitCode":0,"exited":true,"status":"exit status 0"}}}"#
        );
        let killed = Exit(WaitStatus::Signaled {
            signal: 9,
            core: false,
        });
        assert_eq!(
            json(Event::End(killed.into())),
            r#"{"event":{"end":{"exitCode":-1,"exited":false,"status":"signal: killed","error":"signal: killed"}}}"#
        );
        assert_eq!(
            json(Event::Keepalive(Empty {})),
            r#"{"event":{"keepalive":{}}}"#
        );
    }

    #[test]
    fn events_in_protobuf() {
        use prost::Message;
        let proto = |event: Event| EventResponse::of(event).encode_to_vec();
        assert_eq!(
            proto(Event::Start(StartEvent { pid: 300 })),
            [0x0a, 5, 0x0a, 3, 0x08, 0xac, 0x02]
        );
        // exit_code is sint32: -1 is zigzag 1.
        let killed = Exit(WaitStatus::Signaled {
            signal: 9,
            core: false,
        });
        let end = EventResponse::decode(&proto(Event::End(killed.into()))[..]).unwrap();
        let Some(ProcessEvent {
            event: Some(Event::End(end)),
        }) = end.event
        else {
            panic!("an end event");
        };
        assert_eq!((end.exit_code, end.exited), (-1, false));
        assert_eq!(proto(Event::Keepalive(Empty {})), [0x0a, 2, 0x22, 0]);
    }

    #[test]
    fn data_events_written_directly_are_the_libraries_bytes() {
        for kind in [OutputKind::Stdout, OutputKind::Stderr, OutputKind::Pty] {
            for bytes in [&b""[..], b"a", b"ab", b"abc", &[0xff; 1000], &[7; 70_000]] {
                let mut direct = Vec::new();
                write_data_event(Codec::Json, &mut direct, kind, bytes);
                let field = match kind {
                    OutputKind::Stdout => "stdout",
                    OutputKind::Stderr => "stderr",
                    OutputKind::Pty => "pty",
                };
                let reference =
                    json!({"event": {"data": {field: STANDARD.encode_to_string(bytes)}}});
                assert_eq!(String::from_utf8(direct).unwrap(), reference.to_string());
                let output = match kind {
                    OutputKind::Stdout => Output::Stdout(bytes.to_vec()),
                    OutputKind::Stderr => Output::Stderr(bytes.to_vec()),
                    OutputKind::Pty => Output::Pty(bytes.to_vec()),
                };
                let mut direct = Vec::new();
                write_data_event(Codec::Proto, &mut direct, kind, bytes);
                let event = Event::Data(DataEvent {
                    output: Some(output),
                });
                assert_eq!(
                    direct,
                    prost::Message::encode_to_vec(&EventResponse::of(event))
                );
            }
        }
    }

    #[test]
    fn data_events_read_into_place_are_the_bytes_written_directly() {
        // Lengths on each side of a varint's change (128, 16,384), up to a whole chunk.
        for len in [1, 127, 128, 16_375, 16_376, 16_383, 16_384, 60_000, CHUNK] {
            for kind in [OutputKind::Stdout, OutputKind::Stderr, OutputKind::Pty] {
                let bytes: Vec<u8> = (0..=250u8).cycle().take(len).collect();
                let mut read = b"queued".to_vec();
                let mut asked = 0;
                assert!(read_proto_data_event(
                    &mut read,
                    kind,
                    usize::MAX,
                    |out, max| {
                        asked = max;
                        out.extend_from_slice(&bytes);
                        len
                    }
                ));
                assert_eq!(asked, CHUNK);
                let mut written = b"queued".to_vec();
                write_data_event(Codec::Proto, &mut written, kind, &bytes);
                assert_eq!(read, written, "{len} bytes");
            }
        }
        // Nothing read: nothing appended.
        let mut out = b"queued".to_vec();
        assert!(!read_proto_data_event(
            &mut out,
            OutputKind::Stdout,
            CHUNK,
            |_, _| 0
        ));
        assert_eq!(out, b"queued");
        // Asked for no more than the room given.
        assert!(read_proto_data_event(
            &mut out,
            OutputKind::Stdout,
            3,
            |out, max| {
                assert_eq!(max, 3);
                out.extend_from_slice(b"abc");
                3
            }
        ));
        assert_eq!(
            out,
            [&b"queued\x0a\x07\x12\x05\x0a\x03"[..], b"abc"].concat()
        );
    }
}
