//! `StreamInput`: a client stream of input for one process, as envd takes it: a `start` event
//! naming the process, then `data` events (`ProcessInput`, stdin or terminal bytes) and
//! `keepalive` events, in one request body of envelopes; one answer at its end.
//!
//! Over HTTP/1.1 a client stream is a request body sent while it is produced (chunked), and the
//! answer comes after it (half duplex, which the Connect protocol allows for client streams).
//! The body is fed to [`InputSink`] as it arrives, in the event loop, so a slow typist holds no
//! worker; each complete envelope is applied at once, in order, exactly as `SendInput` would
//! (queued for the process, never waiting for it). What HTTP/1.1 does not allow is an idle body:
//! the HTTP layer cuts a request body that sends nothing for its body timeout (30 s) or averages
//! under 500 bytes/s over such a window (SPEC §10), so a stream meant to stay open while nobody
//! types must send `keepalive` events often enough, or use `SendInput` per input (as both SDKs
//! do). Errors: a bad envelope or message, `data` before `start`, or any `SendInput` error,
//! answered at once as the stream's end-of-stream error; the rest of the body is discarded.

use super::messages::{Input, ProcessInput, ProcessSelector};
use super::proc_error;
use crate::api::rpc::failed;
use crate::connect::envelope::{Decoder, END_STREAM};
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

/// Takes a `StreamInput` body as it arrives.
#[derive(Default)]
pub struct InputSink {
    decoder: Decoder,
    process: Option<Selector>,
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
                let process = self.process.as_ref().ok_or_else(|| {
                    Error::invalid_argument("a start event naming the process must come first")
                })?;
                let input = data
                    .input
                    .as_ref()
                    .ok_or_else(|| Error::invalid_argument("a data event without input"))?
                    .input()?;
                let hub = Hub::running()
                    .ok_or_else(|| proc_error(ProcError::NotFound(process.clone()), ""))?;
                match input {
                    Input::Stdin(bytes) => hub
                        .write_input(process, &bytes, false)
                        .map_err(|e| proc_error(e, "error writing to stdin")),
                    Input::Pty(bytes) => hub
                        .write_input(process, &bytes, true)
                        .map_err(|e| proc_error(e, "error writing to tty")),
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

impl BodySink for InputSink {
    fn data(&mut self, bytes: &[u8]) -> Result<(), Response> {
        let envelopes = self.decoder.push(bytes).map_err(failed)?;
        for envelope in envelopes {
            if envelope.flags & END_STREAM != 0 {
                return Err(failed(Error::invalid_argument(
                    "malformed request: an end-of-stream envelope from the client",
                )));
            }
            self.apply(&envelope.message).map_err(failed)?;
        }
        Ok(())
    }

    fn end(self: Box<Self>) -> Response {
        if !self.decoder.is_empty() {
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
}
