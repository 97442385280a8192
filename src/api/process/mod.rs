//! envd's `process.Process` Connect service (SPEC §9b): what the SDKs' `commands.run`,
//! `commands.run(background=True)`, `send_stdin`, `close_stdin`, `kill`, `list`, `connect` and
//! `pty.create` / `resize` / `send_input` call.
//!
//! This module owns the service: which methods exist and how each travels (server streams,
//! unary calls, and `StreamInput`, a client stream whose body is taken as it arrives), who the
//! caller is (the token, then the user of `Authorization: Basic`, else the default user), and
//! how the process hub's errors become Connect codes with envd's words. The messages are
//! `messages`', `Start` and `Connect` `start`'s, their streams `stream`'s, the unary methods
//! `ops`', `StreamInput` `input_stream`'s (with what HTTP/1.1 allows of it). Processes
//! themselves are `proc`'s.

mod input_stream;
mod messages;
mod ops;
mod start;
mod stream;

use std::sync::Arc;

use crate::api::rpc::{self, failed, keepalive_interval, Kind};
use crate::api::status::exhausted;
use crate::app::App;
use crate::connect::{Call, Code, Error};
use crate::http::{Action, Head, Response};
use crate::proc::{Hub, ProcError};
use input_stream::InputSink;

/// The service's name in Connect paths.
pub const SERVICE: &str = "process.Process";

/// The methods of envd's service.
const METHODS: [(&str, Kind); 8] = [
    ("List", Kind::Unary),
    ("Connect", Kind::ServerStream),
    ("Start", Kind::ServerStream),
    ("Update", Kind::Unary),
    ("StreamInput", Kind::ClientStream(InputSink::boxed)),
    ("SendInput", Kind::Unary),
    ("SendSignal", Kind::Unary),
    ("CloseStdin", Kind::Unary),
];

/// Starts a call to `method` of the service; its request message is collected, then run.
pub fn begin(app: &Arc<App>, head: &Head, method: &str) -> Action {
    rpc::begin(app, head, SERVICE, method, &METHODS, run)
}

fn run(
    app: &Arc<App>,
    call: &Call,
    head: &Head,
    method: &str,
    username: Option<&str>,
    body: &[u8],
) -> Result<Response, Error> {
    Ok(match method {
        "Start" => match call.request(body) {
            Ok(request) => start::start(app, username, call, keepalive_interval(head), request),
            Err(error) => failed(call.codec, error),
        },
        "Connect" => match call.request(body) {
            Ok(request) => start::connect(call, keepalive_interval(head), request),
            Err(error) => failed(call.codec, error),
        },
        "List" => {
            call.request::<messages::Empty>(body)?;
            call.unary(&ops::list())
        }
        "SendInput" => call.unary(&ops::send_input(call.request(body)?)?),
        "SendSignal" => call.unary(&ops::send_signal(call.request(body)?)?),
        "CloseStdin" => call.unary(&ops::close_stdin(call.request(body)?)?),
        "Update" => call.unary(&ops::update(call.request(body)?)?),
        other => {
            return Err(Error::new(
                Code::Unimplemented,
                format!("{SERVICE}/{other} is not implemented by sandboxd"),
            ))
        }
    })
}

/// Every request message of the service read from `data` in `codec`; each one read re-encodes
/// to bytes that read back as the same message (the fuzz target `connect_proto`).
#[cfg(feature = "fuzzing")]
pub fn fuzz_requests(codec: crate::connect::Codec, data: &[u8]) {
    use messages::*;
    crate::connect::codec::check_round_trip::<StartRequest>(codec, data);
    crate::connect::codec::check_round_trip::<SelectorRequest>(codec, data);
    crate::connect::codec::check_round_trip::<SendInputRequest>(codec, data);
    crate::connect::codec::check_round_trip::<SendSignalRequest>(codec, data);
    crate::connect::codec::check_round_trip::<UpdateRequest>(codec, data);
    input_stream::fuzz(codec, data);
}

/// The daemon's process hub, started on first use; failing to start it is usually the open
/// file limit.
fn hub() -> Result<Hub, Error> {
    Hub::global().map_err(|e| {
        let code = if exhausted(&e) {
            Code::ResourceExhausted
        } else {
            Code::Internal
        };
        Error::new(code, format!("cannot start the process I/O thread: {e}"))
    })
}

/// The code of a failed start: envd's `invalid_argument` (a missing program, a directory the
/// user may not enter), unless something ran out (descriptors for the pipes or the terminal,
/// memory, processes): `resource_exhausted`, not the client's fault.
fn spawn_code(error: &std::io::Error) -> Code {
    if exhausted(error) {
        Code::ResourceExhausted
    } else {
        Code::InvalidArgument
    }
}

/// A hub error as a Connect error with envd's code and words; `context` says what was being
/// done (`error writing to stdin`), as envd prefixes its errors.
fn proc_error(error: ProcError, context: &str) -> Error {
    let with_context = |code| Error::new(code, format!("{context}: {error}"));
    match &error {
        ProcError::NotFound(_) => Error::new(Code::NotFound, error.to_string()),
        ProcError::ShuttingDown | ProcError::Upgrading => {
            Error::new(Code::Unavailable, error.to_string())
        }
        ProcError::InputFull => Error::new(Code::ResourceExhausted, error.to_string()),
        ProcError::Io(e) if exhausted(e) => with_context(Code::ResourceExhausted),
        ProcError::Spawn(e) => with_context(spawn_code(e)),
        ProcError::TerminalStdin => with_context(Code::Unknown),
        ProcError::NoStdin
        | ProcError::WrongInput { .. }
        | ProcError::NotATerminal
        | ProcError::Io(_) => with_context(Code::Internal),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proc::Selector;

    #[test]
    fn hub_errors_carry_envds_codes_and_words() {
        let error = proc_error(ProcError::NotFound(Selector::Pid(7)), "x");
        assert_eq!(
            (error.code, error.message.as_str()),
            (Code::NotFound, "process with pid 7 not found")
        );
        let error = proc_error(ProcError::NotFound(Selector::Tag("web".into())), "x");
        assert_eq!(error.message, "process with tag web not found");
        let error = proc_error(ProcError::NoStdin, "error writing to stdin");
        assert_eq!(
            (error.code, error.message.as_str()),
            (
                Code::Internal,
                "error writing to stdin: stdin not enabled or closed"
            )
        );
        let error = proc_error(ProcError::TerminalStdin, "error closing stdin");
        assert_eq!(error.code, Code::Unknown);
        assert_eq!(
            proc_error(ProcError::InputFull, "x").code,
            Code::ResourceExhausted
        );
        assert_eq!(
            proc_error(ProcError::ShuttingDown, "x").code,
            Code::Unavailable
        );
        // Out of descriptors, memory or processes: not the client's fault (envd's
        // invalid_argument stays for a spawn the request made fail).
        let os = |errno| std::io::Error::from_raw_os_error(errno);
        for errno in [libc::EMFILE, libc::ENFILE, libc::ENOMEM, libc::EAGAIN] {
            let error = proc_error(ProcError::Spawn(os(errno)), "error starting process");
            assert_eq!(error.code, Code::ResourceExhausted, "{}", error.message);
            assert_eq!(
                proc_error(ProcError::Io(os(errno)), "x").code,
                Code::ResourceExhausted
            );
        }
        for errno in [libc::ENOENT, libc::EACCES, libc::ENOEXEC] {
            let code = proc_error(ProcError::Spawn(os(errno)), "x").code;
            assert_eq!(code, Code::InvalidArgument);
        }
        assert_eq!(
            proc_error(ProcError::Io(os(libc::EPERM)), "x").code,
            Code::Internal
        );
    }
}
