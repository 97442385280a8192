//! envd's `process.proto` messages in proto3 JSON form: requests read (unknown fields ignored,
//! absent ones default), events and answers written.

use std::collections::BTreeMap;

use base64_simd::STANDARD;
use serde::{Deserialize, Serialize};

use crate::connect::json::{self, integer};
use crate::connect::Error;
use crate::proc::{Exit, OutputKind, Selector};
use crate::proto_enum;

/// `ProcessConfig`: what to run. Written back by `List` as it was sent.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProcessConfig {
    pub cmd: String,
    pub args: Vec<String>,
    pub envs: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// `PTY.Size`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PtySize {
    #[serde(deserialize_with = "integer::deserialize")]
    pub cols: u32,
    #[serde(deserialize_with = "integer::deserialize")]
    pub rows: u32,
}

/// `PTY`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Pty {
    pub size: Option<PtySize>,
}

/// `StartRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct StartRequest {
    pub process: Option<ProcessConfig>,
    pub pty: Option<Pty>,
    pub tag: Option<String>,
    /// Absent means true (envd keeps old clients' stdin); the SDKs send false unless asked.
    pub stdin: Option<bool>,
}

/// `ProcessSelector`: a oneof of `pid` and `tag`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProcessSelector {
    #[serde(deserialize_with = "optional_u32")]
    pub pid: Option<u32>,
    pub tag: Option<String>,
}

impl ProcessSelector {
    pub fn selector(&self) -> Result<Selector, Error> {
        match (self.pid, &self.tag) {
            (Some(pid), None) => Ok(Selector::Pid(pid)),
            (None, Some(tag)) => Ok(Selector::Tag(tag.clone())),
            (Some(_), Some(_)) => Err(Error::invalid_argument(
                "process selector: pid and tag are one of: send one",
            )),
            (None, None) => Err(Error::invalid_argument(
                "process selector: a pid or a tag is needed",
            )),
        }
    }
}

/// `ConnectRequest`, `CloseStdinRequest`: a selector only.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SelectorRequest {
    pub process: Option<ProcessSelector>,
}

/// The selector of a request that has one, or `invalid_argument`.
pub fn selector(process: Option<&ProcessSelector>) -> Result<Selector, Error> {
    process
        .ok_or_else(|| Error::invalid_argument("process selector: a pid or a tag is needed"))?
        .selector()
}

/// `ProcessInput`: a oneof of `stdin` and `pty` bytes (base64).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProcessInput {
    pub stdin: Option<String>,
    pub pty: Option<String>,
}

/// Input for a process's stdin, or for its terminal.
pub enum Input {
    Stdin(Vec<u8>),
    Pty(Vec<u8>),
}

impl ProcessInput {
    pub fn input(&self) -> Result<Input, Error> {
        let decode = |text: &str| {
            json::bytes::decode(text)
                .ok_or_else(|| Error::invalid_argument("process input: invalid base64"))
        };
        match (&self.stdin, &self.pty) {
            (Some(stdin), None) => Ok(Input::Stdin(decode(stdin)?)),
            (None, Some(pty)) => Ok(Input::Pty(decode(pty)?)),
            (Some(_), Some(_)) => Err(Error::invalid_argument(
                "process input: stdin and pty are one of: send one",
            )),
            (None, None) => Err(Error::invalid_argument(
                "process input: stdin or pty bytes are needed",
            )),
        }
    }
}

/// `SendInputRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SendInputRequest {
    pub process: Option<ProcessSelector>,
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
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SendSignalRequest {
    pub process: Option<ProcessSelector>,
    pub signal: Signal,
}

/// `UpdateRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct UpdateRequest {
    pub process: Option<ProcessSelector>,
    pub pty: Option<Pty>,
}

/// `ProcessInfo`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessInfo {
    pub config: ProcessConfig,
    pub pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// `ListResponse`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListResponse {
    pub processes: Vec<ProcessInfo>,
}

/// The empty messages (`ListRequest`, `SendInputResponse`, `SendSignalResponse`, ...).
#[derive(Debug, Deserialize, Serialize)]
pub struct Empty {}

/// `StartResponse` and `ConnectResponse`: one `ProcessEvent`.
#[derive(Serialize)]
pub struct EventResponse {
    pub event: Event,
}

/// `ProcessEvent`, a oneof (`data`, the bulk of a stream, is written by [`write_data_event`]).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Event {
    Start { pid: u32 },
    End(EndEvent),
    Keepalive {},
}

/// Appends the JSON of `{"event":{"data":{"stdout":"<base64>"}}}` (or `stderr`, `pty`) to
/// `out`, the base64 written straight into it: no intermediate string or value for what is
/// most of a busy process's stream.
pub fn write_data_event(out: &mut Vec<u8>, kind: OutputKind, bytes: &[u8]) {
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

/// `ProcessEvent.EndEvent`, as envd fills it from Go's `ProcessState`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndEvent {
    pub exit_code: i32,
    pub exited: bool,
    pub status: String,
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
        for bad in [
            r#"{}"#,
            r#"{"process":{}}"#,
            r#"{"process":{"pid":1,"tag":"x"}}"#,
        ] {
            let request: SelectorRequest = serde_json::from_str(bad).unwrap();
            assert!(selector(request.process.as_ref()).is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<SelectorRequest>(r#"{"process":{"pid":-1}}"#).is_err());

        let signal: SendSignalRequest =
            serde_json::from_str(r#"{"process":{"pid":1},"signal":"SIGNAL_SIGKILL"}"#).unwrap();
        assert_eq!(signal.signal, Signal::Sigkill);
        let signal: SendSignalRequest = serde_json::from_str(r#"{"signal":15}"#).unwrap();
        assert_eq!(signal.signal, Signal::Sigterm);

        let input: SendInputRequest =
            serde_json::from_str(r#"{"process":{"pid":1},"input":{"stdin":"aGk="}}"#).unwrap();
        let Input::Stdin(bytes) = input.input.unwrap().input().unwrap() else {
            panic!("stdin");
        };
        assert_eq!(bytes, b"hi");
        let bad = ProcessInput {
            stdin: Some("***".into()),
            pty: None,
        };
        assert!(bad.input().is_err());
    }

    #[test]
    fn events_are_envds_oneofs() {
        let json = |event: Event| serde_json::to_string(&EventResponse { event }).unwrap();
        let data = |kind, bytes: &[u8]| {
            let mut out = Vec::new();
            write_data_event(&mut out, kind, bytes);
            String::from_utf8(out).unwrap()
        };
        assert_eq!(
            json(Event::Start { pid: 7 }),
            r#"{"event":{"start":{"pid":7}}}"#
        );
        assert_eq!(
            data(OutputKind::Stderr, b"hi"),
            r#"{"event":{"data":{"stderr":"aGk="}}}"#
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
        assert_eq!(json(Event::Keepalive {}), r#"{"event":{"keepalive":{}}}"#);
    }

    #[test]
    fn data_events_written_directly_are_serdes_text() {
        for kind in [OutputKind::Stdout, OutputKind::Stderr, OutputKind::Pty] {
            for bytes in [&b""[..], b"a", b"ab", b"abc", &[0xff; 1000]] {
                let mut direct = Vec::new();
                write_data_event(&mut direct, kind, bytes);
                let field = match kind {
                    OutputKind::Stdout => "stdout",
                    OutputKind::Stderr => "stderr",
                    OutputKind::Pty => "pty",
                };
                let reference =
                    json!({"event": {"data": {field: STANDARD.encode_to_string(bytes)}}});
                assert_eq!(String::from_utf8(direct).unwrap(), reference.to_string());
            }
        }
    }
}
