//! The unary methods: `List`, `SendInput`, `SendSignal`, `CloseStdin`, `Update`. Each takes the
//! hub's lock once and never waits: input the process's pipe cannot take at once waits in the
//! hub (at most 1 MiB per process) and is written as the process reads.

use super::messages::{
    selector, Empty, Input, ListResponse, ProcessConfig, ProcessInfo, SelectorRequest,
    SendInputRequest, SendSignalRequest, Signal, UpdateRequest,
};
use super::proc_error;
use super::start::window_size;
use crate::connect::{Code, Error};
use crate::proc::{Hub, ProcError, Selector};

/// The hub, or `not_found` for `selector` when no process was ever started.
fn running(selector: &Selector) -> Result<Hub, Error> {
    Hub::running().ok_or_else(|| proc_error(ProcError::NotFound(selector.clone()), ""))
}

/// `List`: every live process, by pid, with its config as it was sent.
pub fn list() -> ListResponse {
    let processes = Hub::running().map(|hub| hub.list()).unwrap_or_default();
    ListResponse {
        processes: processes
            .into_iter()
            .map(|p| ProcessInfo {
                config: Some(ProcessConfig {
                    cmd: p.config.cmd,
                    args: p.config.args,
                    envs: p.config.envs,
                    cwd: p.config.cwd,
                }),
                pid: p.pid,
                tag: p.tag,
            })
            .collect(),
    }
}

/// `SendInput`: bytes for the process's stdin or terminal.
pub fn send_input(request: SendInputRequest) -> Result<Empty, Error> {
    let selector = selector(request.process.as_ref())?;
    let input = request
        .input
        .ok_or_else(|| Error::invalid_argument("process input: stdin or pty bytes are needed"))?
        .into_input()?;
    let hub = running(&selector)?;
    match input {
        Input::Stdin(bytes) => hub
            .write_input(&selector, &bytes, false)
            .map_err(|e| proc_error(e, "error writing to stdin")),
        Input::Pty(bytes) => hub
            .write_input(&selector, &bytes, true)
            .map_err(|e| proc_error(e, "error writing to tty")),
    }?;
    Ok(Empty {})
}

/// `SendSignal`: `SIGTERM` or `SIGKILL` to the process's group.
pub fn send_signal(request: SendSignalRequest) -> Result<Empty, Error> {
    let selector = selector(request.process.as_ref())?;
    let signal = match Signal::try_from(request.signal) {
        Ok(Signal::Sigkill) => libc::SIGKILL,
        Ok(Signal::Sigterm) => libc::SIGTERM,
        Ok(Signal::Unspecified) => {
            return Err(Error::new(
                Code::Unimplemented,
                format!("invalid signal: {}", Signal::Unspecified.as_str()),
            ))
        }
        // A number the schema does not name (binary protobuf carries any): as envd, whose
        // switch knows the same two.
        Err(_) => {
            return Err(Error::new(
                Code::Unimplemented,
                format!("invalid signal: {}", request.signal),
            ))
        }
    };
    running(&selector)?
        .signal(&selector, signal)
        .map_err(|e| proc_error(e, "error sending signal"))?;
    Ok(Empty {})
}

/// `CloseStdin`: end of file on the process's stdin.
pub fn close_stdin(request: SelectorRequest) -> Result<Empty, Error> {
    let selector = selector(request.process.as_ref())?;
    running(&selector)?
        .close_stdin(&selector)
        .map_err(|e| proc_error(e, "error closing stdin"))?;
    Ok(Empty {})
}

/// `Update`: a terminal's new size (nothing without `pty`, as envd).
pub fn update(request: UpdateRequest) -> Result<Empty, Error> {
    let selector = selector(request.process.as_ref())?;
    let hub = running(&selector)?;
    match request.pty {
        Some(pty) => {
            let size = window_size(pty.size.unwrap_or_default())?;
            hub.resize(&selector, size)
                .map_err(|e| proc_error(e, "error resizing tty"))?;
        }
        None => {
            // envd answers an update without a size once it found the process.
            if !hub.list().iter().any(|p| match &selector {
                Selector::Pid(pid) => p.pid == *pid,
                Selector::Tag(tag) => p.tag.as_deref() == Some(tag.as_str()),
            }) {
                return Err(proc_error(ProcError::NotFound(selector), ""));
            }
        }
    }
    Ok(Empty {})
}
