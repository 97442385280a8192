//! `StreamInput`: a client stream of input for one process, as envd takes it: a `start` event
//! naming the process, then `data` events (`ProcessInput`, stdin or terminal bytes) and
//! `keepalive` events, in one request body of envelopes, in either codec; one answer at its end.
//!
//! Over HTTP/1.1 a client stream is a request body sent while it is produced (chunked), and the
//! answer comes after it (half duplex, which the Connect protocol allows for client streams).
//! The body is fed to [`InputSink`] as it arrives, in the event loop, so a slow typist holds no
//! worker; each envelope is applied as it arrives, in order, exactly as `SendInput` would
//! (queued for the process, never waiting for it). A message (inflated first when it is
//! flagged compressed, with `Connect-Content-Encoding: gzip`) of at most [`WHOLE_MESSAGE_MAX`]
//! bytes is read whole, then applied; a larger one (up to the 4 MiB of any message) must be a
//! data event in its plain form: in JSON `{"data":{"input":{"stdin":"<base64>"}}}` (or `"pty"`),
//! whitespace allowed between tokens and `\/` in the base64; in protobuf the `data`, `input`
//! and `stdin` (or `pty`) fields and nothing else. Its bytes are decoded and written as they
//! arrive, so a connection holds at most 64 KiB of a message, never 4 MiB (SPEC §9b). An error
//! part-way through such a message leaves the bytes before it written.
//! What HTTP/1.1 does not allow is an idle body:
//! the HTTP layer cuts a request body that sends nothing for its body timeout (30 s) or averages
//! under 500 bytes/s over such a window (SPEC §10), so a stream meant to stay open while nobody
//! types must send `keepalive` events often enough, or use `SendInput` per input (as both SDKs
//! do). Errors: a bad envelope or message, `data` before `start`, or any `SendInput` error,
//! answered at once as the stream's end-of-stream error; the rest of the body is discarded.

use std::borrow::Cow;

use serde::Deserialize;

use super::messages::{selector, Empty, Input, ProcessInput, ProcessSelector};
use super::proc_error;
use crate::api::rpc::failed;
use crate::connect::compression::Inflater;
use crate::connect::envelope::{self, COMPRESSED, END_STREAM, PREFIX};
use crate::connect::streamed::{Refusal, StreamedBytes};
use crate::connect::streamed_proto::{self, StreamedProto};
use crate::connect::{Call, Code, Codec, Error, Stream};
use crate::http::{BodySink, Response};
use crate::proc::{Hub, ProcError, Selector};

/// `StreamInputRequest`: a oneof of `start`, `data` and `keepalive`.
#[derive(Clone, PartialEq, Deserialize, prost::Message)]
#[serde(from = "StreamInputJson")]
struct StreamInputRequest {
    #[prost(oneof = "InputEvent", tags = "1, 2, 3")]
    event: Option<InputEvent>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum InputEvent {
    #[prost(message, tag = "1")]
    Start(StartEvent),
    #[prost(message, tag = "2")]
    Data(DataEvent),
    #[prost(message, tag = "3")]
    Keepalive(Empty),
}

/// `StreamInputRequest.StartEvent`.
#[derive(Clone, PartialEq, Deserialize, prost::Message)]
#[serde(rename_all = "camelCase", default)]
struct StartEvent {
    #[prost(message, optional, tag = "1")]
    process: Option<ProcessSelector>,
}

/// `StreamInputRequest.DataEvent`.
#[derive(Clone, PartialEq, Deserialize, prost::Message)]
#[serde(rename_all = "camelCase", default)]
struct DataEvent {
    #[prost(message, optional, tag = "2")]
    input: Option<ProcessInput>,
}

/// The JSON form: members as options; not exactly one set is no event.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct StreamInputJson {
    start: Option<StartEvent>,
    data: Option<DataEvent>,
    keepalive: Option<serde::de::IgnoredAny>,
}

impl From<StreamInputJson> for StreamInputRequest {
    fn from(json: StreamInputJson) -> StreamInputRequest {
        let event = match (json.start, json.data, json.keepalive) {
            (Some(start), None, None) => Some(InputEvent::Start(start)),
            (None, Some(data), None) => Some(InputEvent::Data(data)),
            (None, None, Some(_)) => Some(InputEvent::Keepalive(Empty {})),
            _ => None,
        };
        StreamInputRequest { event }
    }
}

/// The largest message read whole before it is applied; a larger one is a data event applied
/// as it arrives.
pub const WHOLE_MESSAGE_MAX: usize = 64 << 10;

/// Takes a `StreamInput` body as it arrives.
pub struct InputSink {
    codec: Codec,
    /// Messages flagged compressed are gzip (`Connect-Content-Encoding`).
    gzip: bool,
    reading: Reading,
    process: Option<Selector>,
}

/// Where the body is: in an envelope's prefix, or in a message: `left` bytes of the envelope
/// to come, inflated as they arrive when compressed, then held whole or applied as they come.
enum Reading {
    Prefix {
        bytes: [u8; PREFIX],
        have: usize,
    },
    Message {
        left: usize,
        inflater: Option<Box<Inflater>>,
        body: Body,
    },
}

enum Body {
    Whole(Vec<u8>),
    Data(LargeData),
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
    pub fn boxed(call: &Call) -> Box<dyn BodySink> {
        Box::new(InputSink::new(call.codec, call.gzip_request))
    }

    fn new(codec: Codec, gzip: bool) -> InputSink {
        InputSink {
            codec,
            gzip,
            reading: Reading::default(),
            process: None,
        }
    }

    /// Applies one message of the stream.
    fn apply(&mut self, message: &[u8]) -> Result<(), Error> {
        let request: StreamInputRequest = self.codec.decode(message)?;
        match request.event {
            Some(InputEvent::Start(start)) => {
                self.process = Some(selector(start.process.as_ref())?);
                Ok(())
            }
            Some(InputEvent::Data(data)) => {
                self.process()?;
                let input = data
                    .input
                    .ok_or_else(|| Error::invalid_argument("a data event without input"))?
                    .into_input()?;
                match input {
                    Input::Stdin(bytes) => self.write(&bytes, false),
                    Input::Pty(bytes) => self.write(&bytes, true),
                }
            }
            Some(InputEvent::Keepalive(_)) => Ok(()),
            None => Err(Error::new(
                Code::Unimplemented,
                "a StreamInputRequest holds exactly one of start, data and keepalive",
            )),
        }
    }

    /// Takes the next bytes of the body: envelopes' prefixes, then their messages.
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
                Reading::Message { left, inflater, .. } => {
                    let n = (*left).min(rest.len());
                    let piece = &rest[..n];
                    *left -= n;
                    rest = &rest[n..];
                    let done = *left == 0;
                    let plain: Cow<[u8]> = match inflater {
                        Some(inflater) => {
                            let plain = inflater.push(piece)?;
                            if done {
                                inflater.finish()?;
                            }
                            plain.into()
                        }
                        None => piece.into(),
                    };
                    self.absorb(&plain)?;
                    if done {
                        self.end_message()?;
                    }
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
        let compressed = flags & COMPRESSED != 0;
        if compressed && !self.gzip {
            return Err(envelope::compressed_without_encoding());
        }
        if !compressed && len > WHOLE_MESSAGE_MAX {
            // Known to be large already: only a data event may be, after a start event.
            self.process()?;
        }
        self.reading = Reading::Message {
            left: len,
            inflater: compressed.then(Box::default),
            body: Body::Whole(Vec::with_capacity(len.min(WHOLE_MESSAGE_MAX))),
        };
        if len == 0 {
            return self.end_message();
        }
        Ok(())
    }

    /// The next (inflated) bytes of the message: held while it may be read whole, then
    /// written as they come.
    fn absorb(&mut self, plain: &[u8]) -> Result<(), Error> {
        let Reading::Message { body, .. } = &mut self.reading else {
            return Ok(());
        };
        let (bytes, pty) = match body {
            Body::Whole(whole) if whole.len() + plain.len() <= WHOLE_MESSAGE_MAX => {
                whole.extend_from_slice(plain);
                return Ok(());
            }
            Body::Whole(whole) => {
                let mut data = LargeData::new(self.codec);
                let mut bytes = data.push(whole)?;
                bytes.extend(data.push(plain)?);
                let pty = data.pty();
                *body = Body::Data(data);
                (bytes, pty)
            }
            Body::Data(data) => (data.push(plain)?, data.pty()),
        };
        self.write(&bytes, pty)
    }

    /// The message's last byte came: apply it, or end a large one.
    fn end_message(&mut self) -> Result<(), Error> {
        match std::mem::take(&mut self.reading) {
            Reading::Message {
                body: Body::Whole(whole),
                ..
            } => self.apply(&whole),
            Reading::Message {
                body: Body::Data(data),
                ..
            } => data.finish(),
            Reading::Prefix { .. } => Ok(()),
        }
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
        self.take(bytes).map_err(|error| failed(self.codec, error))
    }

    fn end(self: Box<Self>) -> Response {
        if !matches!(self.reading, Reading::Prefix { have: 0, .. }) {
            return failed(
                self.codec,
                Error::invalid_argument("malformed request: the last message is cut short"),
            );
        }
        // `StreamInputResponse` is empty; a client stream's answer is a stream of one message.
        let (stream, response) = Stream::open(self.codec, false, 64);
        match stream.send(&Empty {}) {
            Ok(()) => stream.finish(Ok(())),
            Err(_) => drop(stream),
        }
        response
    }
}

/// The tokens before a JSON data event's bytes, stdin's then the terminal's.
const DATA_OPENINGS: &[&[u8]] = &[
    br#"{"data":{"input":{"stdin":""#,
    br#"{"data":{"input":{"pty":""#,
];

/// A large data message, read as it arrives, in its codec.
enum LargeData {
    Json(StreamedBytes),
    Proto(StreamedProto),
}

impl LargeData {
    fn new(codec: Codec) -> LargeData {
        match codec {
            Codec::Json => LargeData::Json(StreamedBytes::new(DATA_OPENINGS)),
            // StreamInputRequest.data (2) > DataEvent.input (2) > ProcessInput.stdin (1) | pty (2)
            Codec::Proto => LargeData::Proto(StreamedProto::new(&[2, 2], &[1, 2])),
        }
    }

    /// The input bytes completed by the next bytes of the message.
    fn push(&mut self, bytes: &[u8]) -> Result<Vec<u8>, Error> {
        match self {
            LargeData::Json(json) => json.push(bytes).map_err(refusal),
            LargeData::Proto(proto) => proto
                .push(bytes)
                .map(Cow::into_owned)
                .map_err(proto_refusal),
        }
    }

    /// The message ended: fine, or an error.
    fn finish(&self) -> Result<(), Error> {
        match self {
            LargeData::Json(json) => json.finish().map_err(refusal),
            LargeData::Proto(proto) => proto.finish().map_err(proto_refusal),
        }
    }

    /// The bytes go to a terminal.
    fn pty(&self) -> bool {
        match self {
            LargeData::Json(json) => json.opening() == Some(1),
            LargeData::Proto(proto) => proto.field() == Some(2),
        }
    }
}

/// A `StreamInput` message read whole and read as it arrives (in pieces whose size the first
/// byte picks): a large data message the streamed reader takes is the data event a whole
/// reader reads, with the same bytes for the same member.
#[cfg(feature = "fuzzing")]
pub fn fuzz(codec: Codec, data: &[u8]) {
    let Some((&step, message)) = data.split_first() else {
        return;
    };
    crate::connect::codec::check_round_trip::<StreamInputRequest>(codec, message);
    let read = |piece: usize| {
        let mut large = LargeData::new(codec);
        let mut out = Vec::new();
        for chunk in message.chunks(piece) {
            out.extend(large.push(chunk)?);
        }
        large.finish()?;
        Ok::<_, Error>((out, large.pty()))
    };
    let whole = read(message.len().max(1));
    let split = read(usize::from(step % 16) + 1);
    assert_eq!(whole.is_ok(), split.is_ok(), "{whole:?} / {split:?}");
    let (Ok(whole), Ok(split)) = (whole, split) else {
        return;
    };
    assert_eq!(whole, split);
    if codec == Codec::Proto {
        let request: StreamInputRequest = codec
            .decode(message)
            .expect("a message the reader took is protobuf");
        let Some(InputEvent::Data(DataEvent { input: Some(input) })) = request.event else {
            panic!("a data event: {request:?}");
        };
        match input.input {
            Some(Input::Stdin(bytes)) => assert_eq!((bytes, false), whole),
            Some(Input::Pty(bytes)) => assert_eq!((bytes, true), whole),
            None => panic!("an input"),
        }
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

fn proto_refusal(streamed_proto::Refusal(what): streamed_proto::Refusal) -> Error {
    Error::invalid_argument(format!(
        "a message over {} KiB must be a data event (data.input.stdin or data.input.pty, \
         nothing else): {what}",
        WHOLE_MESSAGE_MAX >> 10
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(json: &str) -> Result<(), Error> {
        InputSink::new(Codec::Json, false).apply(json.as_bytes())
    }

    #[test]
    fn the_stream_names_its_process_first() {
        let mut sink = InputSink::new(Codec::Json, false);
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
        let mut data = LargeData::new(Codec::Json);
        let mut out = Vec::new();
        for piece in message.chunks(step.max(1)) {
            out.extend(data.push(piece)?);
        }
        data.finish()?;
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
            let mut sink = InputSink::new(Codec::Json, false);
            for piece in body.chunks(step) {
                sink.take(piece).unwrap();
            }
            assert_eq!(sink.process, Some(Selector::Pid(4_194_304)), "{step}");
            assert!(matches!(sink.reading, Reading::Prefix { have: 0, .. }));
        }
        // A large message before a start event is refused from its prefix.
        let mut sink = InputSink::new(Codec::Json, false);
        let error = sink.take(&[0, 0, 1, 0, 1]).unwrap_err();
        assert!(error.message.contains("start event"), "{}", error.message);
    }
}
