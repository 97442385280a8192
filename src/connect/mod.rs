//! Connect protocol v1 over HTTP/1.1 with the JSON codec: what the E2B SDKs speak to envd's
//! services (SPEC §9b; the protocol: <https://connectrpc.com/docs/protocol>).
//!
//! This module knows the protocol and nothing of files or processes: how a call is framed
//! ([`Call::from_head`]: unary `application/json`, or a server stream `application/connect+json`
//! whose request and answer messages are [`envelope`]s), what an error looks like on the wire
//! ([`Error`], [`Code`] and its HTTP status), and proto3's JSON rules ([`json`]). A service
//! decodes its request message with [`Call::request`], and answers with [`unary`] or through a
//! [`Stream`].
//!
//! Decisions where the protocol leaves room:
//! - Only the JSON codec: `application/proto` and `application/connect+proto` are 415 with
//!   `Accept-Post` naming the JSON types (the SDKs use JSON; binary protobuf would need a
//!   protobuf runtime for no client). No compression: a `Content-Encoding` or
//!   `Connect-Content-Encoding` other than `identity` is `unimplemented`, as the SDKs never
//!   compress (their `ENVD_RPC_COMPRESSION` turns it off).
//! - `Connect-Protocol-Version` may be absent (connect-go's default); if present it must be `1`.
//! - `Connect-Timeout-Ms` (at most 10 digits, as the protocol says) bounds a call; the services
//!   read it through [`Call::timeout`].
//! - A streaming call's answer is 200 with the error in its end-of-stream message, as the protocol
//!   requires, once its framing is known (as connect-go answers); a call refused before that
//!   (bad media type, bad headers) is answered as a unary error would be, which every Connect
//!   client reads as the call's error.
//! - A message with one large `bytes` field can be read as it arrives ([`streamed`]).

pub mod envelope;
pub mod json;
mod stream;
pub mod streamed;

use std::fmt;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::http::{Head, Response};

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
    /// `application/json`: the request body is the message, the answer body is the message.
    Unary,
    /// `application/connect+json`: one enveloped request message, a stream of enveloped answers
    /// ending with an end-of-stream message.
    ServerStream,
}

/// A call, as its head describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub shape: Shape,
    /// From `Connect-Timeout-Ms`.
    pub timeout: Option<Duration>,
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
        let shape = match media_type.as_str() {
            "application/json" => Shape::Unary,
            "application/connect+json" => Shape::ServerStream,
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
        for name in ["content-encoding", "connect-content-encoding"] {
            if let Some(coding) = head.header(name) {
                if !coding.trim_ascii().eq_ignore_ascii_case(b"identity") {
                    return Err(Error::new(
                        Code::Unimplemented,
                        format!(
                            "compression '{}' is not supported; send identity",
                            String::from_utf8_lossy(coding)
                        ),
                    )
                    .into_response());
                }
            }
        }
        let timeout = match head.header("connect-timeout-ms") {
            None => None,
            Some(value) => Some(parse_timeout(value).map_err(Error::into_response)?),
        };
        Ok(Call { shape, timeout })
    }

    /// Decodes the request message from the whole request body.
    pub fn request<T: DeserializeOwned>(&self, body: &[u8]) -> Result<T, Error> {
        let message = match self.shape {
            Shape::Unary => body,
            Shape::ServerStream => envelope::single_message(body)?,
        };
        // An empty unary body is the empty message, as connect-go reads it.
        let message: &[u8] = if message.is_empty() { b"{}" } else { message };
        serde_json::from_slice(message)
            .map_err(|e| Error::invalid_argument(format!("invalid request message: {e}")))
    }
}

/// The 200 answer of a unary call.
pub fn unary<T: Serialize>(message: &T) -> Response {
    match serde_json::to_vec(message) {
        Ok(body) => Response::json(200, body),
        Err(e) => Error::new(Code::Internal, format!("encoding the answer: {e}")).into_response(),
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
            format!(
                "{shown} is not supported: sandboxd speaks Connect with the JSON codec \
                 (application/json, application/connect+json)"
            ),
        )
        .to_json()
        .to_string()
        .into_bytes(),
    )
    .with_header("Accept-Post", "application/json, application/connect+json")
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
    fn the_media_type_says_the_shape() {
        let call = accepted("Content-Type: application/json\r\n");
        assert_eq!(call.shape, Shape::Unary);
        let call = accepted(
            "Content-Type: Application/Connect+JSON; charset=utf-8\r\nConnect-Protocol-Version: 1\r\n",
        );
        assert_eq!(call.shape, Shape::ServerStream);
        assert_eq!(call.timeout, None);
    }

    #[test]
    fn other_codecs_are_415_naming_the_json_ones() {
        for headers in ["Content-Type: application/proto\r\n", ""] {
            let (status, body) = refused(headers);
            assert_eq!(status, 415);
            assert_eq!(body["code"], "unimplemented");
            assert!(body["message"]
                .as_str()
                .unwrap()
                .contains("application/json"));
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
            refused("Content-Type: application/json\r\nContent-Encoding: gzip\r\n");
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

    #[test]
    fn request_messages_unary_and_enveloped() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Stat {
            #[serde(default)]
            path: String,
        }
        let unary = Call {
            shape: Shape::Unary,
            timeout: None,
        };
        let stat: Stat = unary.request(br#"{"path":"/a","unknownField":1}"#).unwrap();
        assert_eq!(stat.path, "/a");
        let empty: Stat = unary.request(b"").unwrap();
        assert_eq!(empty.path, "");
        let error = unary.request::<Stat>(b"{").unwrap_err();
        assert_eq!(error.code, Code::InvalidArgument);

        let stream = Call {
            shape: Shape::ServerStream,
            timeout: None,
        };
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
    }
}
