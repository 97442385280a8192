//! `StreamInput`: a client stream of input for one process, as envd takes it: a `start` event
//! naming the process, then `data` events (`ProcessInput`, stdin or terminal bytes) and
//! `keepalive` events, in one request body of envelopes; one answer at its end.
//!
//! Over HTTP/1.1 a client stream is a request body sent while it is produced (chunked), and the
//! answer comes after it (half duplex, which the Connect protocol allows for client streams).
//! The body is fed to [`InputSink`] as it arrives, in the event loop, so a slow typist holds no
//! worker; each envelope is applied as it arrives, in order, exactly as `SendInput` would
//! (queued for the process, never waiting for it). A message of at most [`WHOLE_MESSAGE_MAX`]
//! bytes is read whole, then applied; a larger one (up to the 4 MiB of any message) must be a
//! data event in its plain form, `{"data":{"input":{"stdin":"<base64>"}}}` (or `"pty"`),
//! whitespace allowed between tokens and `\/` in the base64: its bytes are decoded and
//! written as they arrive, so a connection holds at most 64 KiB of a message, never 4 MiB
//! (SPEC §9b). An error part-way through such a message leaves the bytes before it written.
//! What HTTP/1.1 does not allow is an idle body:
//! the HTTP layer cuts a request body that sends nothing for its body timeout (30 s) or averages
//! under 500 bytes/s over such a window (SPEC §10), so a stream meant to stay open while nobody
//! types must send `keepalive` events often enough, or use `SendInput` per input (as both SDKs
//! do). Errors: a bad envelope or message, `data` before `start`, or any `SendInput` error,
//! answered at once as the stream's end-of-stream error; the rest of the body is discarded.

use super::messages::{Input, ProcessInput, ProcessSelector};
use super::proc_error;
use crate::api::rpc::failed;
use crate::connect::envelope::{self, END_STREAM, PREFIX};
use crate::connect::streamed::{Refusal, StreamedBytes};
use crate::connect::{Code, Error, Stream};
use crate::http::{BodySink, Response};
use crate::proc::{Hub, ProcError, Selector};

/// `StreamInputRequest`, a oneof of `start`, `data` and `keepalive`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct StreamInputRequest {
    start: Option<StartEvent>,
    data: Option<DataEvent>,
    keepalive: Option<serde::de::IgnoredAny>,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct StartEvent {
    process: Option<ProcessSelector>,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct DataEvent {
    input: Option<ProcessInput>,
}

/// The largest message read whole before it is applied; a larger one is a data event applied
/// as it arrives.
pub const WHOLE_MESSAGE_MAX: usize = 64 << 10;

/// Takes a `StreamInput` body as it arrives.
#[derive(Default)]
pub struct InputSink {
    reading: Reading,
    process: Option<Selector>,
}

/// Where the body is: in an envelope's prefix, in a small message, in a large data message.
enum Reading {
    Prefix { bytes: [u8; PREFIX], have: usize },
    Whole { message: Vec<u8>, left: usize },
    Data { data: StreamedData, left: usize },
}

impl Default for Reading {
    fn default() -> Reading {
        Reading::Prefix {
            bytes: [0; PREFIX],
            have: 0,
        }
    }
}

impl InputSink {
    /// A sink for one call's body.
    pub fn boxed() -> Box<dyn BodySink> {
        Box::<Self>::default()
    }

    /// Applies one message of the stream.
    fn apply(&mut self, message: &[u8]) -> Result<(), Error> {
        let request: StreamInputRequest = serde_json::from_slice(message)
            .map_err(|e| Error::invalid_argument(format!("invalid request message: {e}")))?;
        match (request.start, request.data, request.keepalive) {
            (Some(start), None, None) => {
                self.process = Some(super::messages::selector(start.process.as_ref())?);
                Ok(())
            }
            (None, Some(data), None) => {
                self.process()?;
                let input = data
                    .input
                    .as_ref()
                    .ok_or_else(|| Error::invalid_argument("a data event without input"))?
                    .input()?;
                match input {
                    Input::Stdin(bytes) => self.write(&bytes, false),
                    Input::Pty(bytes) => self.write(&bytes, true),
                }
            }
            (None, None, Some(_)) => Ok(()),
            _ => Err(Error::new(
                Code::Unimplemented,
                "a StreamInputRequest holds exactly one of start, data and keepalive",
            )),
        }
    }
}

impl InputSink {
    /// Takes the next bytes of the body: envelopes' prefixes, small messages whole, large data
    /// messages as they come.
    fn take(&mut self, mut rest: &[u8]) -> Result<(), Error> {
        while !rest.is_empty() {
            match &mut self.reading {
                Reading::Prefix { bytes, have } => {
                    let n = (PREFIX - *have).min(rest.len());
                    bytes[*have..*have + n].copy_from_slice(&rest[..n]);
                    *have += n;
                    rest = &rest[n..];
                    if *have == PREFIX {
                        let prefix = *bytes;
                        self.start_message(&prefix)?;
                    }
                }
                Reading::Whole { message, left } => {
                    let n = (*left).min(rest.len());
                    message.extend_from_slice(&rest[..n]);
                    *left -= n;
                    rest = &rest[n..];
                    if *left == 0 {
                        let message = std::mem::take(message);
                        self.reading = Reading::default();
                        self.apply(&message)?;
                    }
                }
                Reading::Data { data, left } => {
                    let n = (*left).min(rest.len());
                    let mut decoded = data.push(&rest[..n])?;
                    *left -= n;
                    rest = &rest[n..];
                    let done = *left == 0;
                    if done {
                        decoded.extend(data.finish()?);
                    }
                    let pty = data.pty();
                    if done {
                        self.reading = Reading::default();
                    }
                    self.write(&decoded, pty)?;
                }
            }
        }
        Ok(())
    }

    /// An envelope's prefix is complete: how its message is to be read.
    fn start_message(&mut self, prefix: &[u8; PREFIX]) -> Result<(), Error> {
        let Some((flags, len)) = envelope::prefix(prefix)? else {
            return Err(Error::invalid_argument("malformed request: no envelope"));
        };
        if flags & END_STREAM != 0 {
            return Err(Error::invalid_argument(
                "malformed request: an end-of-stream envelope from the client",
            ));
        }
        if len <= WHOLE_MESSAGE_MAX {
            self.reading = Reading::Whole {
                message: Vec::with_capacity(len),
                left: len,
            };
            if len == 0 {
                self.reading = Reading::default();
                return self.apply(b"");
            }
            return Ok(());
        }
        self.process()?;
        self.reading = Reading::Data {
            data: StreamedData::default(),
            left: len,
        };
        Ok(())
    }

    fn process(&self) -> Result<&Selector, Error> {
        self.process.as_ref().ok_or_else(|| {
            Error::invalid_argument("a start event naming the process must come first")
        })
    }

    /// Writes input bytes to the process, as `SendInput` does.
    fn write(&self, bytes: &[u8], pty: bool) -> Result<(), Error> {
        if bytes.is_empty() {
            return Ok(());
        }
        let process = self.process()?;
        let hub =
            Hub::running().ok_or_else(|| proc_error(ProcError::NotFound(process.clone()), ""))?;
        let what = if pty {
            "error writing to tty"
        } else {
            "error writing to stdin"
        };
        hub.write_input(process, bytes, pty)
            .map_err(|e| proc_error(e, what))
    }
}

impl BodySink for InputSink {
    fn data(&mut self, bytes: &[u8]) -> Result<(), Response> {
        self.take(bytes).map_err(failed)
    }

    fn end(self: Box<Self>) -> Response {
        if !matches!(self.reading, Reading::Prefix { have: 0, .. }) {
            return failed(Error::invalid_argument(
                "malformed request: the last message is cut short",
            ));
        }
        // `StreamInputResponse` is empty; a client stream's answer is a stream of one message.
        let (stream, response) = Stream::open(64);
        match stream.send(&super::messages::Empty {}) {
            Ok(()) => stream.finish(Ok(())),
            Err(_) => drop(stream),
        }
        response
    }
}

/// The tokens before a data event's bytes, stdin's then the terminal's.
const DATA_OPENINGS: &[&[u8]] = &[
    br#"{"data":{"input":{"stdin":""#,
    br#"{"data":{"input":{"pty":""#,
];

/// A large data message, read as it arrives.
struct StreamedData(StreamedBytes);

impl Default for StreamedData {
    fn default() -> StreamedData {
        StreamedData(StreamedBytes::new(DATA_OPENINGS))
    }
}

impl StreamedData {
    /// The input bytes completed by the next bytes of the message.
    fn push(&mut self, bytes: &[u8]) -> Result<Vec<u8>, Error> {
        self.0.push(bytes).map_err(refusal)
    }

    /// The message ended: nothing more to write, or an error.
    fn finish(&mut self) -> Result<Vec<u8>, Error> {
        self.0.finish().map_err(refusal).map(|()| Vec::new())
    }

    /// The bytes go to a terminal.
    fn pty(&self) -> bool {
        self.0.opening() == Some(1)
    }
}

fn refusal(refusal: Refusal) -> Error {
    match refusal {
        Refusal::Base64 => Error::invalid_argument("process input: invalid base64"),
        Refusal::Shape(what) => Error::invalid_argument(format!(
            "a message over {} KiB must be a data event {{\"data\":{{\"input\":{{\"stdin\" or \
             \"pty\":\"<base64>\"}}}}}}: {what}",
            WHOLE_MESSAGE_MAX >> 10
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(json: &str) -> Result<(), Error> {
        InputSink::default().apply(json.as_bytes())
    }

    #[test]
    fn the_stream_names_its_process_first() {
        let mut sink = InputSink::default();
        let error = sink
            .apply(br#"{"data":{"input":{"stdin":"aGk="}}}"#)
            .unwrap_err();
        assert_eq!(error.code, Code::InvalidArgument);
        sink.apply(br#"{"start":{"process":{"pid":4194304}}}"#)
            .unwrap();
        assert_eq!(sink.process, Some(Selector::Pid(4_194_304)));
        sink.apply(br#"{"keepalive":{}}"#).unwrap();
        assert_eq!(message("{}").unwrap_err().code, Code::Unimplemented);
        assert_eq!(
            message(r#"{"start":{}}"#).unwrap_err().code,
            Code::InvalidArgument
        );
        assert_eq!(message("[").unwrap_err().code, Code::InvalidArgument);
    }

    /// Feeds `message` to a streamed data reader in pieces of `step`: the bytes decoded and
    /// whether it was for a terminal, or the first error.
    fn streamed(message: &[u8], step: usize) -> Result<(Vec<u8>, bool), Error> {
        let mut data = StreamedData::default();
        let mut out = Vec::new();
        for piece in message.chunks(step.max(1)) {
            out.extend(data.push(piece)?);
        }
        out.extend(data.finish()?);
        Ok((out, data.pty()))
    }

    #[test]
    fn a_large_data_message_decodes_the_same_however_it_is_split() {
        let input: Vec<u8> = (0..1000u32).map(|i| i.to_le_bytes()[0] ^ 0x5a).collect();
        for extra in 0..3 {
            let input = &input[..input.len() - extra];
            let text = base64_simd::STANDARD.encode_to_string(input);
            let plain = format!(r#"{{"data":{{"input":{{"stdin":"{text}"}}}}}}"#);
            let spaced = format!(
                " {{ \"data\" :\n{{\"input\":{{ \"pty\" : \"{}\" }} }}\t}} ",
                text.replace('/', "\\/")
            );
            let url_unpadded = format!(
                r#"{{"data":{{"input":{{"stdin":"{}"}}}}}}"#,
                base64_simd::URL_SAFE_NO_PAD.encode_to_string(input)
            );
            for step in [1, 2, 3, 5, 64, 100_000] {
                assert_eq!(
                    streamed(plain.as_bytes(), step).unwrap(),
                    (input.to_vec(), false)
                );
                assert_eq!(
                    streamed(spaced.as_bytes(), step).unwrap(),
                    (input.to_vec(), true),
                    "{spaced}"
                );
                assert_eq!(
                    streamed(url_unpadded.as_bytes(), step).unwrap().0,
                    input.to_vec()
                );
            }
        }
    }

    #[test]
    fn other_large_messages_and_bad_base64_are_refused() {
        for bad in [
            r#"{"keepalive":{}}"#,
            r#"{"data":{"input":{"stdinx":"AAAA"}}}"#,
            r#"{"start":{"process":{"pid":1}}}"#,
            r#"{"data":{"input":{"stdin":"AAAA"}}}, "#,
            r#"{"data":{"input":{"stdin":"AAAA"}}"#,
            r#"{"data":{"input":{"stdin":"AAA=A"}}}"#,
            r#"{"data":{"input":{"stdin":"AAAAA"}}}"#,
            r#"{"data":{"input":{"stdin":"AA="}}}"#,
            r#"{"data":{"input":{"stdin":"A\u0041AA"}}}"#,
            r#"{"data":{"input":{"stdin":"AA!A"}}}"#,
            r#"{"da ta":{"input":{"stdin":"AAAA"}}}"#,
        ] {
            for step in [1, 4, 1000] {
                let error = streamed(bad.as_bytes(), step).unwrap_err();
                assert_eq!(error.code, Code::InvalidArgument, "{bad}");
            }
        }
    }

    #[test]
    fn envelopes_are_read_across_any_split_and_small_messages_whole() {
        let mut body = crate::connect::envelope::encode(0, br#"{"keepalive":{}}"#);
        body.extend(crate::connect::envelope::encode(
            0,
            br#"{"start":{"process":{"pid":4194304}}}"#,
        ));
        for step in 1..body.len() {
            let mut sink = InputSink::default();
            for piece in body.chunks(step) {
                sink.take(piece).unwrap();
            }
            assert_eq!(sink.process, Some(Selector::Pid(4_194_304)), "{step}");
            assert!(matches!(sink.reading, Reading::Prefix { have: 0, .. }));
        }
        // A large message before a start event is refused from its prefix.
        let mut sink = InputSink::default();
        let error = sink.take(&[0, 0, 1, 0, 1]).unwrap_err();
        assert!(error.message.contains("start event"), "{}", error.message);
    }
}
