//! What envd's two Connect services (`filesystem.Filesystem`, `process.Process`, SPEC §9b)
//! share above the protocol: how a call starts ([`begin`]: the token, the method, its framing,
//! the caller's user from `Authorization: Basic`, the collected request; a streaming call's
//! errors from there on as its end-of-stream message), the HTTP layer's refusals of a call in
//! Connect's form ([`refused`]), the life of their
//! streams ([`LiveStream`]: a full queue, the client's leaving, the deadline, keep-alives at
//! the interval the client asked for), the answer of a stream that failed before it began, and
//! how the shared file layer's errors become Connect codes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64_simd::STANDARD;

use crate::app::App;
use crate::connect::{self, Call, Code, Codec, Error, Outgoing, Shape, Stream};
use crate::fs::FsError;
use crate::http::stream::SendError;
use crate::http::{self, Action, BodySink, Head, Response};

/// Runs a method once its request body is collected: the app, the call, its head, the method,
/// the caller's user name (`None`: the default user) and the body.
pub type Run = fn(&Arc<App>, &Call, &Head, &str, Option<&str>, &[u8]) -> Result<Response, Error>;

/// How a method takes its request and gives its answer.
#[derive(Clone, Copy)]
pub enum Kind {
    /// One request message, one answer (`application/json`).
    Unary,
    /// One request message, a stream of answers (`application/connect+json`).
    ServerStream,
    /// A stream of request messages (`application/connect+json`), taken by the sink this
    /// makes for the call as the body arrives; one answer at its end.
    ClientStream(fn(&Call) -> Box<dyn BodySink>),
}

/// Starts a call to `service`/`method`, one of `methods`. In order: the token (else
/// `unauthenticated`), the method (else `unimplemented`), the call's framing matching its kind
/// (else `unimplemented`), the user; then a client stream's body goes to its sink as it
/// arrives, and any other request message is collected (in the event loop) and given to `run`.
pub fn begin(
    app: &Arc<App>,
    head: &Head,
    service: &str,
    method: &str,
    methods: &[(&str, Kind)],
    run: Run,
) -> Action {
    let refuse = |error: Error| Action::Respond(error.into_response());
    if let Err(error) = app.require_token(head) {
        return refuse(Error::new(Code::Unauthenticated, error.to_string()));
    }
    let Some(&(_, kind)) = methods.iter().find(|(name, _)| *name == method) else {
        return refuse(Error::new(
            Code::Unimplemented,
            format!("{service}/{method} is not a method of {service}"),
        ));
    };
    let call = match Call::from_head(head) {
        Ok(call) => call,
        Err(response) => return Action::Respond(response),
    };
    let (expected, what) = match kind {
        Kind::Unary => (Shape::Unary, "a unary"),
        Kind::ServerStream => (Shape::ServerStream, "a server-streaming"),
        Kind::ClientStream(_) => (Shape::ServerStream, "a client-streaming"),
    };
    if call.shape != expected {
        let send = match expected {
            Shape::Unary => call.codec.unary_type(),
            Shape::ServerStream => call.codec.stream_type(),
        };
        return refuse(Error::new(
            Code::Unimplemented,
            format!("{service}/{method} is {what} method: send {send}"),
        ));
    }
    // From here the call's framing is known: a streaming call's errors are its stream's
    // end-of-stream message (connect-go answers so), which a Connect client reads with its code;
    // an HTTP status alone would reach it as a code of the status's choosing.
    let streaming = !matches!(kind, Kind::Unary);
    let codec = call.codec;
    let answer_error = move |error: Error| {
        if streaming {
            failed(codec, error)
        } else {
            error.into_response()
        }
    };
    let username = match basic_user(head) {
        Ok(username) => username,
        Err(error) => return Action::Respond(answer_error(error)),
    };
    if let Kind::ClientStream(sink) = kind {
        return Action::Consume(sink(&call));
    }
    let app = Arc::clone(app);
    let method = method.to_string();
    Action::Collect {
        limit: connect::MAX_REQUEST_BYTES,
        then: Box::new(move |head, body| {
            run(&app, &call, head, &method, username.as_deref(), &body).unwrap_or_else(answer_error)
        }),
    }
}

/// How often a live stream looks whether its client is still there.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// A service's streaming answer while it lives: the stream (gone once ended), the keep-alive
/// due `keepalive` after the last message queued, the call's deadline (`Connect-Timeout-Ms`),
/// and a look at the client every [`CHECK_EVERY`]. Its producer (a watch, a process) calls
/// [`check`](Self::check) and [`keep_alive`](Self::keep_alive) when [`next_tick`](Self::next_tick)
/// comes, and adds its own conditions between them.
pub struct LiveStream {
    /// `None` once ended.
    stream: Option<Stream>,
    queue_bytes: usize,
    /// Said after a client's queue filled: what that ends.
    when_full: &'static str,
    keepalive: Duration,
    last_sent: Instant,
    next_check: Instant,
    deadline: Option<Instant>,
}

impl LiveStream {
    /// A stream holding at most `queue_bytes` its client has not taken, and the answer carrying
    /// it; nothing is queued yet.
    pub fn open(
        call: &Call,
        queue_bytes: usize,
        when_full: &'static str,
        keepalive: Duration,
    ) -> (LiveStream, Response) {
        let (stream, response) = Stream::open(call.codec, call.gzip_answer, queue_bytes);
        let timeout = call.timeout;
        let now = Instant::now();
        let live = LiveStream {
            stream: Some(stream),
            queue_bytes,
            when_full,
            keepalive,
            last_sent: now,
            next_check: now + CHECK_EVERY,
            deadline: timeout.and_then(|timeout| now.checked_add(timeout)),
        };
        (live, response)
    }

    /// The stream, until it ended.
    pub fn stream(&self) -> Option<&Stream> {
        self.stream.as_ref()
    }

    /// Queues a message; false when the stream has ended (now or before). A full queue ends it
    /// with `resource_exhausted`.
    pub fn send<T: Outgoing>(&mut self, message: &T) -> bool {
        self.send_with(|stream| stream.send(message))
    }

    /// Queues a message `write` writes, in the codec it is given, into its envelope (as
    /// [`Stream::send_some`]: answering false, it sends nothing); as [`send`](Self::send)
    /// otherwise.
    pub fn send_raw(&mut self, write: impl FnOnce(Codec, &mut Vec<u8>) -> bool) -> bool {
        self.send_with(|stream| {
            let codec = stream.codec();
            stream.send_some(|out| write(codec, out))
        })
    }

    fn send_with(&mut self, send: impl FnOnce(&Stream) -> Result<(), SendError>) -> bool {
        let Some(stream) = &self.stream else {
            return false;
        };
        match send(stream) {
            Ok(()) => {
                self.last_sent = Instant::now();
                true
            }
            Err(SendError::Full) => {
                let message = format!(
                    "the client is not reading fast enough: {} KiB of events waited for it{}",
                    self.queue_bytes >> 10,
                    self.when_full
                );
                self.finish(Err(Error::new(Code::ResourceExhausted, message)));
                false
            }
            Err(SendError::Closed) => {
                self.stream = None;
                false
            }
        }
    }

    /// Ends the stream with its end-of-stream message (once).
    pub fn finish(&mut self, outcome: Result<(), Error>) {
        if let Some(stream) = self.stream.take() {
            stream.finish(outcome);
        }
    }

    /// When the next look is due: a keep-alive, the client, the deadline.
    pub fn next_tick(&self) -> Instant {
        let next = (self.last_sent + self.keepalive).min(self.next_check);
        self.deadline.map_or(next, |deadline| next.min(deadline))
    }

    /// What every look checks; false when the stream is over: the client left, or the
    /// deadline passed (then it is ended with `deadline_exceeded`).
    pub fn check(&mut self, now: Instant) -> bool {
        let Some(stream) = &self.stream else {
            return false;
        };
        if stream.is_closed() {
            self.stream = None;
            return false;
        }
        if self.deadline.is_some_and(|deadline| deadline <= now) {
            self.finish(Err(Error::new(
                Code::DeadlineExceeded,
                "the call's deadline (Connect-Timeout-Ms) has passed",
            )));
            return false;
        }
        true
    }

    /// Queues `keepalive` when one is due, and schedules the next look; false when the stream
    /// is over.
    pub fn keep_alive<T: Outgoing>(&mut self, now: Instant, keepalive: &T) -> bool {
        if now >= self.last_sent + self.keepalive && !self.send(keepalive) {
            return false;
        }
        self.next_check = now + CHECK_EVERY;
        true
    }
}

/// The request header carrying the keep-alive interval in seconds.
pub const KEEPALIVE_HEADER: &str = "keepalive-ping-interval";
/// envd's interval when the header is absent.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);
const MAX_KEEPALIVE: Duration = Duration::from_secs(86_400);

/// The user named by `Authorization: Basic` (`base64(user:password)`, the password ignored, as
/// envd does); `None` without the header or with an empty name: the default user.
pub fn basic_user(head: &Head) -> Result<Option<String>, Error> {
    let Some(value) = head.header("authorization") else {
        return Ok(None);
    };
    let invalid = || Error::new(Code::Unauthenticated, "invalid Authorization header");
    let text = std::str::from_utf8(value).map_err(|_| invalid())?.trim();
    let (scheme, credentials) = text.split_once(' ').ok_or_else(invalid)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        // Another scheme says nothing about the user: the default one.
        return Ok(None);
    }
    let decoded = STANDARD
        .decode_to_vec(credentials.trim())
        .map_err(|_| invalid())?;
    let decoded = String::from_utf8(decoded).map_err(|_| invalid())?;
    let name = decoded
        .split_once(':')
        .map_or(decoded.as_str(), |(name, _)| name);
    Ok((!name.is_empty()).then(|| name.to_string()))
}

/// The keep-alive interval of a stream, envd's: whole seconds from the
/// `Keepalive-Ping-Interval` request header (the SDKs send 50), 90 s without one. sandboxd
/// also takes an unparsable or non-positive value as absent (envd's ticker would panic on it)
/// and caps it at a day.
pub fn keepalive_interval(head: &Head) -> Duration {
    head.header(KEEPALIVE_HEADER)
        .and_then(|value| std::str::from_utf8(value).ok())
        .and_then(|text| text.trim().parse::<u64>().ok())
        .filter(|seconds| *seconds > 0)
        .map_or(DEFAULT_KEEPALIVE, |seconds| {
            Duration::from_secs(seconds).min(MAX_KEEPALIVE)
        })
}

/// The answer of a streaming call that failed before its stream began: a stream holding only
/// the end-of-stream message with the error, as connect-go answers. Not a unary error: the JS
/// SDK's client (connect-es) reads a streaming call's non-200 status alone, so a 404 would
/// reach it as `unimplemented`.
pub fn failed(codec: Codec, error: Error) -> Response {
    let (stream, response) = Stream::open(codec, false, 0);
    stream.finish(Err(error));
    response
}

/// The HTTP layer's own refusal of a Connect call (a body too large, too slow, badly framed;
/// the bodies' budget full) in Connect's error form, so a client reads its code rather than
/// `unknown`: an error answer for a unary call, an end-of-stream message for a streaming one.
pub fn refused(head: &Head, error: &http::Error) -> Response {
    use http::{BodyError, Error as Refusal};
    let code = match error {
        Refusal::BodyTooLarge { .. } | Refusal::BodyBudget { .. } => Code::ResourceExhausted,
        Refusal::Body(BodyError::Stalled(_) | BodyError::TooSlow) => Code::DeadlineExceeded,
        Refusal::Framing(http::FramingError::UnsupportedTransferEncoding) => Code::Unimplemented,
        Refusal::Head(_) | Refusal::Host(_) | Refusal::Framing(_) | Refusal::Body(_) => {
            Code::InvalidArgument
        }
    };
    let error = Error::new(code, error.to_string());
    match Call::from_head(head) {
        Ok(call) if call.shape == Shape::ServerStream => failed(call.codec, error),
        _ => error.into_response(),
    }
}

/// An error of the shared file layer, with its Connect code (`api::status` decides both).
pub fn api_error(error: FsError) -> Error {
    Error::new(super::status::fs_code(&error), error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(headers: &str) -> Head {
        let text = format!("POST /filesystem.Filesystem/Stat HTTP/1.1\r\nHost: h\r\n{headers}\r\n");
        Head::parse(text.as_bytes()).unwrap().unwrap().0
    }

    #[test]
    fn the_user_comes_from_basic_authorization() {
        let user = |headers: &str| basic_user(&head(headers));
        assert_eq!(user("").unwrap(), None);
        // "user:" and "root:secret"
        assert_eq!(
            user("Authorization: Basic dXNlcjo=\r\n").unwrap(),
            Some("user".into())
        );
        assert_eq!(
            user("Authorization: basic cm9vdDpzZWNyZXQ=\r\n").unwrap(),
            Some("root".into())
        );
        // ":" (an empty name) is the default user; another scheme too.
        assert_eq!(user("Authorization: Basic Og==\r\n").unwrap(), None);
        assert_eq!(user("Authorization: Bearer abc\r\n").unwrap(), None);
        for bad in ["Authorization: Basic !!!\r\n", "Authorization: Basic\r\n"] {
            assert_eq!(user(bad).unwrap_err().code, Code::Unauthenticated, "{bad}");
        }
    }

    #[test]
    fn the_keepalive_interval_comes_from_the_header_as_envd_reads_it() {
        let interval = |headers: &str| keepalive_interval(&head(headers));
        assert_eq!(interval(""), DEFAULT_KEEPALIVE);
        assert_eq!(
            interval("Keepalive-Ping-Interval: 50\r\n"),
            Duration::from_secs(50)
        );
        assert_eq!(
            interval("keepalive-ping-interval:  1 \r\n"),
            Duration::from_secs(1)
        );
        for bad in ["0", "-5", "1.5", "soon", ""] {
            let headers = format!("Keepalive-Ping-Interval: {bad}\r\n");
            assert_eq!(interval(&headers), DEFAULT_KEEPALIVE, "{bad:?}");
        }
        assert_eq!(
            interval("Keepalive-Ping-Interval: 99999999999999\r\n"),
            MAX_KEEPALIVE
        );
    }
}
