//! Connect protocol v1 over HTTP/1.1, both codecs: what the E2B SDKs (JSON) and E2B's
//! orchestrator (binary protobuf) speak to envd's services (SPEC §9b; the protocol:
//! <https://connectrpc.com/docs/protocol>).
//!
//! This module knows the protocol and nothing of files or processes: how a call is framed
//! ([`Call::from_head`]: unary `application/json` or `application/proto`, or a stream
//! `application/connect+json` or `application/connect+proto` whose messages are
//! [`envelope`]s), what an error looks like on the wire ([`Error`], [`Code`] and its HTTP
//! status), the codecs ([`codec`]: one set of message types, proto3 JSON by [`json`]'s rules
//! and protobuf by `prost`) and gzip ([`compression`]). A service decodes its request message
//! with [`Call::request`], and answers with [`Call::unary`] or through a [`Stream`].
//!
//! Decisions where the protocol leaves room:
//! - The answer is in the codec of the request; errors are JSON in both (the protocol's rule).
//!   Another codec is 415 with `Accept-Post` naming the four media types.
//! - gzip and identity, for requests and answers (unary: `Content-Encoding`, `Accept-Encoding`;
//!   streams: `Connect-Content-Encoding`, `Connect-Accept-Encoding` and each message's flag).
//!   Another coding is `unimplemented`, with the `Accept-Encoding` (unary) or
//!   `Connect-Accept-Encoding` (stream) the daemon takes. Answers are compressed for a client
//!   that accepts gzip from [`compression::MIN_BYTES`] up.
//! - `Connect-Protocol-Version` may be absent (connect-go's default); if present it must be `1`.
//! - `Connect-Timeout-Ms` (at most 10 digits, as the protocol says) bounds a call; the services
//!   read it through [`Call::timeout`].
//! - A streaming call's answer is 200 with the error in its end-of-stream message, as the protocol
//!   requires, once its framing is known (as connect-go answers); a call refused before that
//!   (bad media type, bad headers) is answered as a unary error would be, which every Connect
//!   client reads as the call's error.
//! - A message with one large `bytes` field can be read as it arrives ([`streamed`]).

pub mod codec;
pub mod compression;
pub mod envelope;
pub mod json;
mod stream;
pub mod streamed;
pub mod streamed_proto;

use std::fmt;
use std::time::Duration;

use crate::http::{Head, Response};

pub use codec::{Codec, Incoming, Outgoing};
pub use stream::Stream;

/// The most bytes of one request message (envd's clients send paths and small settings; a
/// process's stdin chunk is the largest).
pub const MAX_REQUEST_BYTES: usize = 4 << 20;

/// The most bytes of request bodies collected whole (every unary and server-streaming call's
/// request, and the small JSON bodies of the HTTP routes) held by all connections together
/// (SPEC §9b): sixteen bodies at [`MAX_REQUEST_BYTES`]. Past it a call is refused with
/// `resource_exhausted` until bodies are handed over or given up.
pub const COLLECT_BUDGET: usize = 64 << 20;

/// Connect's error codes (<https://connectrpc.com/docs/protocol#error-codes>).
// The protocol's whole table, with its statuses; the services send only some of the codes.
#[allow(dead_code)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Code {
    /// The name on the wire, e.g. `not_found`.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code, as the protocol maps them.
    pub fn http_status(self) -> u16 {
        match self {
            Code::Canceled => 499,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
            Code::Unauthenticated => 401,
            Code::PermissionDenied => 403,
            Code::NotFound => 404,
            Code::AlreadyExists | Code::Aborted => 409,
            Code::ResourceExhausted => 429,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::DeadlineExceeded => 504,
            Code::Unknown | Code::Internal | Code::DataLoss => 500,
        }
    }
}

/// A call's error: its code and a sentence for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub code: Code,
    pub message: String,
}

impl Error {
    pub fn new(code: Code, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
        }
    }

    pub fn invalid_argument(message: impl Into<String>) -> Error {
        Error::new(Code::InvalidArgument, message)
    }

    /// The JSON of the error: `{"code":"not_found","message":"..."}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "code": self.code.as_str(), "message": self.message })
    }

    /// The answer to a unary call (or a call refused from its head) that failed.
    pub fn into_response(self) -> Response {
        Response::json(
            self.code.http_status(),
            self.to_json().to_string().into_bytes(),
        )
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

/// How a call's messages travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `application/json`, `application/proto`: the request body is the message, the answer
    /// body is the message.
    Unary,
    /// `application/connect+json`, `application/connect+proto`: enveloped request messages, a
    /// stream of enveloped answers ending with an end-of-stream message.
    ServerStream,
}

/// The media types a call may have, for `Accept-Post`.
const MEDIA_TYPES: &str =
    "application/json, application/proto, application/connect+json, application/connect+proto";

/// A call, as its head describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub shape: Shape,
    pub codec: Codec,
    /// From `Connect-Timeout-Ms`.
    pub timeout: Option<Duration>,
    /// The request's messages may be gzip: the whole body of a unary call
    /// (`Content-Encoding`), a stream's messages flagged compressed
    /// (`Connect-Content-Encoding`).
    pub gzip_request: bool,
    /// The client takes gzip answers (`Accept-Encoding`, `Connect-Accept-Encoding`).
    pub gzip_answer: bool,
}

impl Call {
    /// Reads the framing of a call from its head; the error is the call's answer.
    pub fn from_head(head: &Head) -> Result<Call, Response> {
        let media_type = head
            .header("content-type")
            .map(|value| {
                let text = String::from_utf8_lossy(value);
                let essence = text.split(';').next().unwrap_or("");
                essence.trim().to_ascii_lowercase()
            })
            .unwrap_or_default();
        let (shape, codec) = match media_type.as_str() {
            "application/json" => (Shape::Unary, Codec::Json),
            "application/proto" => (Shape::Unary, Codec::Proto),
            "application/connect+json" => (Shape::ServerStream, Codec::Json),
            "application/connect+proto" => (Shape::ServerStream, Codec::Proto),
            other => return Err(unsupported_media_type(other)),
        };
        if let Some(version) = head.header("connect-protocol-version") {
            if version.trim_ascii() != b"1" {
                return Err(Error::invalid_argument(format!(
                    "Connect-Protocol-Version must be 1, not '{}'",
                    String::from_utf8_lossy(version)
                ))
                .into_response());
            }
        }
        // A stream's messages are compressed one by one; the body as a whole never is.
        let (coding, other, accept) = match shape {
            Shape::Unary => (
                "Content-Encoding",
                "Connect-Content-Encoding",
                "Accept-Encoding",
            ),
            Shape::ServerStream => (
                "Connect-Content-Encoding",
                "Content-Encoding",
                "Connect-Accept-Encoding",
            ),
        };
        let refuse = |name: &str, value: &[u8]| {
            Error::new(
                Code::Unimplemented,
                format!(
                    "{name} '{}' is not supported: sandboxd takes gzip and identity",
                    String::from_utf8_lossy(value)
                ),
            )
            .into_response()
            .with_header(accept, "gzip")
        };
        let gzip_request = match head.header(coding).map(<[u8]>::trim_ascii) {
            None => false,
            Some(value) if value.eq_ignore_ascii_case(b"identity") => false,
            Some(value) if value.eq_ignore_ascii_case(b"gzip") => true,
            Some(value) => return Err(refuse(coding, value)),
        };
        if let Some(value) = head.header(other) {
            if !value.trim_ascii().eq_ignore_ascii_case(b"identity") {
                return Err(refuse(other, value));
            }
        }
        let gzip_answer = head.headers_named(accept).any(compression::accepts_gzip);
        let timeout = match head.header("connect-timeout-ms") {
            None => None,
            Some(value) => Some(parse_timeout(value).map_err(Error::into_response)?),
        };
        Ok(Call {
            shape,
            codec,
            timeout,
            gzip_request,
            gzip_answer,
        })
    }

    /// Decodes the request message from the whole request body.
    pub fn request<T: Incoming>(&self, body: &[u8]) -> Result<T, Error> {
        match self.shape {
            Shape::Unary if self.gzip_request => self.codec.decode(&compression::inflate(body)?),
            Shape::Unary => self.codec.decode(body),
            Shape::ServerStream => {
                let (flags, message) = envelope::single_message(body)?;
                if flags & envelope::COMPRESSED == 0 {
                    self.codec.decode(message)
                } else if self.gzip_request {
                    self.codec.decode(&compression::inflate(message)?)
                } else {
                    Err(envelope::compressed_without_encoding())
                }
            }
        }
    }

    /// The 200 answer of a unary call, in the call's codec (gzip when the client takes it and
    /// the message is worth it).
    pub fn unary<T: Outgoing>(&self, message: &T) -> Response {
        let mut body = Vec::new();
        if let Err(error) = self.codec.encode(message, &mut body) {
            return error.into_response();
        }
        let response = if self.gzip_answer && body.len() >= compression::MIN_BYTES {
            let mut compressed = Vec::new();
            compression::Deflater::default().gzip(&body, &mut compressed);
            Response::new(200, crate::http::ResponseBody::Bytes(compressed))
                .with_header("Content-Encoding", "gzip")
        } else {
            Response::new(200, crate::http::ResponseBody::Bytes(body))
        };
        response.with_header("Content-Type", self.codec.unary_type())
    }
}

fn unsupported_media_type(media_type: &str) -> Response {
    let shown = if media_type.is_empty() {
        "no Content-Type".to_string()
    } else {
        format!("Content-Type '{media_type}'")
    };
    Response::json(
        415,
        Error::new(
            Code::Unimplemented,
            format!("{shown} is not supported: sandboxd speaks Connect's JSON and protobuf codecs ({MEDIA_TYPES})"),
        )
        .to_json()
        .to_string()
        .into_bytes(),
    )
    .with_header("Accept-Post", MEDIA_TYPES)
}

/// `Connect-Timeout-Ms`: 1 to 10 ASCII digits.
fn parse_timeout(value: &[u8]) -> Result<Duration, Error> {
    let value = value.trim_ascii();
    let valid = !value.is_empty() && value.len() <= 10 && value.iter().all(u8::is_ascii_digit);
    let millis = std::str::from_utf8(value)
        .ok()
        .filter(|_| valid)
        .and_then(|text| text.parse::<u64>().ok())
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "Connect-Timeout-Ms must be 1 to 10 digits, not '{}'",
                String::from_utf8_lossy(value)
            ))
        })?;
    Ok(Duration::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(headers: &str) -> Head {
        let text = format!("POST /filesystem.Filesystem/Stat HTTP/1.1\r\nHost: h\r\n{headers}\r\n");
        Head::parse(text.as_bytes()).unwrap().unwrap().0
    }

    fn accepted(headers: &str) -> Call {
        match Call::from_head(&head(headers)) {
            Ok(call) => call,
            Err(response) => panic!("refused with {}", response.status),
        }
    }

    fn refused(headers: &str) -> (u16, serde_json::Value) {
        let Err(response) = Call::from_head(&head(headers)) else {
            panic!("accepted: {headers}");
        };
        let crate::http::ResponseBody::Bytes(body) = &response.body else {
            panic!("an error answer has a body");
        };
        (response.status, serde_json::from_slice(body).unwrap())
    }

    #[test]
    fn the_media_type_says_the_shape_and_the_codec() {
        for (media_type, shape, codec) in [
            ("application/json", Shape::Unary, Codec::Json),
            ("application/proto", Shape::Unary, Codec::Proto),
            (
                "Application/Connect+JSON; charset=utf-8",
                Shape::ServerStream,
                Codec::Json,
            ),
            (
                "application/connect+proto",
                Shape::ServerStream,
                Codec::Proto,
            ),
        ] {
            let call = accepted(&format!(
                "Content-Type: {media_type}\r\nConnect-Protocol-Version: 1\r\n"
            ));
            assert_eq!((call.shape, call.codec), (shape, codec), "{media_type}");
            assert_eq!(call.timeout, None);
            assert!(!call.gzip_request && !call.gzip_answer);
        }
    }

    #[test]
    fn other_codecs_are_415_naming_the_four() {
        for headers in [
            "Content-Type: application/grpc\r\n",
            "Content-Type: application/connect+thrift\r\n",
            "",
        ] {
            let (status, body) = refused(headers);
            assert_eq!(status, 415);
            assert_eq!(body["code"], "unimplemented");
            let message = body["message"].as_str().unwrap();
            assert!(message.contains("application/connect+proto"), "{message}");
        }
    }

    #[test]
    fn compression_headers_by_shape() {
        let unary = accepted(
            "Content-Type: application/proto\r\nContent-Encoding: gzip\r\nAccept-Encoding: br, gzip\r\n",
        );
        assert!(unary.gzip_request && unary.gzip_answer);
        let stream = accepted(
            "Content-Type: application/connect+proto\r\nConnect-Content-Encoding: gzip\r\n\
             Connect-Accept-Encoding: gzip\r\nAccept-Encoding: identity\r\n",
        );
        assert!(stream.gzip_request && stream.gzip_answer);
        // A stream's Accept-Encoding is HTTP's, not the messages'.
        let stream =
            accepted("Content-Type: application/connect+json\r\nAccept-Encoding: gzip\r\n");
        assert!(!stream.gzip_answer);
        for (headers, name) in [
            (
                "Content-Type: application/json\r\nContent-Encoding: br\r\n",
                "Accept-Encoding",
            ),
            (
                "Content-Type: application/connect+json\r\nConnect-Content-Encoding: zstd\r\n",
                "Connect-Accept-Encoding",
            ),
            (
                "Content-Type: application/connect+json\r\nContent-Encoding: gzip\r\n",
                "Connect-Accept-Encoding",
            ),
        ] {
            let Err(response) = Call::from_head(&head(headers)) else {
                panic!("accepted: {headers}");
            };
            assert_eq!(response.status, 501, "{headers}");
            let named = response.headers.iter().find(|(n, _)| *n == name);
            assert_eq!(named.map(|(_, v)| v.as_ref()), Some("gzip"), "{headers}");
        }
    }

    #[test]
    fn timeouts_and_versions() {
        let call = accepted("Content-Type: application/json\r\nConnect-Timeout-Ms: 2500\r\n");
        assert_eq!(call.timeout, Some(Duration::from_millis(2500)));
        for bad in ["-1", "", "12345678901", "1.5", "ten"] {
            let (status, body) = refused(&format!(
                "Content-Type: application/json\r\nConnect-Timeout-Ms: {bad}\r\n"
            ));
            assert_eq!(
                (status, body["code"].as_str()),
                (400, Some("invalid_argument"))
            );
        }
        let (status, _) =
            refused("Content-Type: application/json\r\nConnect-Protocol-Version: 2\r\n");
        assert_eq!(status, 400);
        let (status, body) =
            refused("Content-Type: application/json\r\nContent-Encoding: deflate\r\n");
        assert_eq!(
            (status, body["code"].as_str()),
            (501, Some("unimplemented"))
        );
    }

    #[test]
    fn codes_map_to_the_protocols_statuses() {
        let expected = [
            (Code::Canceled, "canceled", 499),
            (Code::Unknown, "unknown", 500),
            (Code::InvalidArgument, "invalid_argument", 400),
            (Code::DeadlineExceeded, "deadline_exceeded", 504),
            (Code::NotFound, "not_found", 404),
            (Code::AlreadyExists, "already_exists", 409),
            (Code::PermissionDenied, "permission_denied", 403),
            (Code::ResourceExhausted, "resource_exhausted", 429),
            (Code::FailedPrecondition, "failed_precondition", 400),
            (Code::Aborted, "aborted", 409),
            (Code::OutOfRange, "out_of_range", 400),
            (Code::Unimplemented, "unimplemented", 501),
            (Code::Internal, "internal", 500),
            (Code::Unavailable, "unavailable", 503),
            (Code::DataLoss, "data_loss", 500),
            (Code::Unauthenticated, "unauthenticated", 401),
        ];
        for (code, name, status) in expected {
            assert_eq!((code.as_str(), code.http_status()), (name, status));
        }
    }

    #[derive(Clone, PartialEq, serde::Deserialize, serde::Serialize, prost::Message)]
    #[serde(default)]
    struct Stat {
        #[prost(string, tag = "1")]
        path: String,
    }

    fn call(shape: Shape, codec: Codec, gzip_request: bool) -> Call {
        Call {
            shape,
            codec,
            timeout: None,
            gzip_request,
            gzip_answer: false,
        }
    }

    #[test]
    fn request_messages_unary_and_enveloped() {
        let unary = call(Shape::Unary, Codec::Json, false);
        let stat: Stat = unary.request(br#"{"path":"/a","unknownField":1}"#).unwrap();
        assert_eq!(stat.path, "/a");
        let empty: Stat = unary.request(b"").unwrap();
        assert_eq!(empty.path, "");
        let error = unary.request::<Stat>(b"{").unwrap_err();
        assert_eq!(error.code, Code::InvalidArgument);

        let stream = call(Shape::ServerStream, Codec::Json, false);
        let body = envelope::encode(0, br#"{"path":"/b"}"#);
        let stat: Stat = stream.request(&body).unwrap();
        assert_eq!(stat.path, "/b");
        assert_eq!(
            stream
                .request::<Stat>(br#"{"path":"/b"}"#)
                .unwrap_err()
                .code,
            Code::InvalidArgument
        );
        let proto = call(Shape::ServerStream, Codec::Proto, false);
        let stat: Stat = proto.request(&envelope::encode(0, b"\x0a\x02/c")).unwrap();
        assert_eq!(stat.path, "/c");
    }

    #[test]
    fn compressed_requests_need_their_encoding() {
        let mut gzip = Vec::new();
        compression::Deflater::default().gzip(b"\x0a\x02/d", &mut gzip);
        let unary = call(Shape::Unary, Codec::Proto, true);
        assert_eq!(unary.request::<Stat>(&gzip).unwrap().path, "/d");
        let stream = call(Shape::ServerStream, Codec::Proto, true);
        let body = envelope::encode(envelope::COMPRESSED, &gzip);
        assert_eq!(stream.request::<Stat>(&body).unwrap().path, "/d");
        // Not compressed although it may be: fine.
        let plain = envelope::encode(0, b"\x0a\x02/e");
        assert_eq!(stream.request::<Stat>(&plain).unwrap().path, "/e");
        // Flagged without a Connect-Content-Encoding.
        let error = call(Shape::ServerStream, Codec::Proto, false)
            .request::<Stat>(&body)
            .unwrap_err();
        assert_eq!(error.code, Code::InvalidArgument);
        assert!(error.message.contains("Connect-Content-Encoding"));
    }

    #[test]
    fn unary_answers_in_the_requests_codec_compressed_when_worth_it() {
        let answer = |codec, gzip_answer, path: &str| {
            let mut call = call(Shape::Unary, codec, false);
            call.gzip_answer = gzip_answer;
            call.unary(&Stat { path: path.into() })
        };
        let header = |response: &Response, name: &str| {
            response
                .headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.to_string())
        };
        let body = |response: &Response| match &response.body {
            crate::http::ResponseBody::Bytes(bytes) => bytes.clone(),
            _ => panic!("bytes"),
        };
        let small = answer(Codec::Proto, true, "/a");
        assert_eq!(
            header(&small, "content-type").as_deref(),
            Some("application/proto")
        );
        assert_eq!(header(&small, "content-encoding"), None);
        assert_eq!(body(&small), b"\x0a\x02/a");
        let long = "x".repeat(2000);
        let big = answer(Codec::Json, true, &long);
        assert_eq!(
            header(&big, "content-type").as_deref(),
            Some("application/json")
        );
        assert_eq!(header(&big, "content-encoding").as_deref(), Some("gzip"));
        let json = compression::inflate(&body(&big)).unwrap();
        assert_eq!(json, format!(r#"{{"path":"{long}"}}"#).into_bytes());
        let not_accepted = answer(Codec::Json, false, &long);
        assert_eq!(header(&not_accepted, "content-encoding"), None);
    }
}
