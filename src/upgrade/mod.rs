//! Live upgrade (`POST /upgrade`, envd's): a new binary takes over the running daemon in the
//! same process, and no connection is refused meanwhile.
//!
//! - [`receive`]: the route. One upgrade at a time ([`Turn`]). The new binary streams in the
//!   body to a staged file in `--upgrade-path`'s directory, which must be root's alone
//!   ([`staging`]), is checked to run (`-version` answers a version) from the file's
//!   descriptor, and only then takes the path; an empty body re-executes the running binary.
//!   Refused before the first authorised `/init`, and when a part could not carry what it
//!   holds (`parts::refusal`).
//! - [`perform`] (on the main thread, which the route wakes with `SIGUSR2`): stop accepting
//!   but keep the listening socket, let requests under way finish (the drain timeout), write
//!   the [`state`] into a memory file, and `execve` the new binary with both descriptors left
//!   open and named in `SANDBOXD_HANDOVER`, from the binary's descriptor (`execveat`), never
//!   by a path. Connections that arrive meanwhile wait in the
//!   socket's backlog for the new image. If the `execve` fails, everything is put back and the
//!   request is answered 500: the old daemon serves on.
//! - [`take_over`] (the new image, at start): the listener and the state back, the variable
//!   removed, and the outcome kept for the next `/init`'s `X-Envd-Handover`.
//!
//! The upgrade request itself is never answered on success, as envd's: the connection closes
//! with the `execve`, which E2B's orchestrator reads as success, and it confirms by the version
//! the next `/init` answers.

pub mod carry;
mod parts;
mod receive;
mod staging;
pub mod state;

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use prost::Message;

pub use receive::begin;

use crate::app::App;
use crate::error::ApiError;
use crate::http::deferred::Answer;
use crate::http::Response;
use crate::log;
use crate::sys::handover as fds;
use state::Handover;

/// The variable naming the handed-over descriptors: `<listener>,<state>`.
pub const HANDOVER_VAR: &str = "SANDBOXD_HANDOVER";
/// The state's largest size read back: the parts' own bounds (8 MiB of watchers' events, the
/// log exporter's 8 MiB) with room to spare.
const MAX_STATE: u64 = 32 << 20;

/// An upgrade the route accepted, for the main thread.
pub struct Pending {
    /// The binary to run; `None`: the running one again.
    binary: Option<Binary>,
    answer: Answer,
    _turn: Turn,
}

/// A new binary, checked: executed from `file`, read-only, whatever `path` holds by then.
pub struct Binary {
    file: File,
    /// Where it was put (`--upgrade-path`), for messages.
    path: PathBuf,
}

/// Whether an upgrade is under way, from its request's head until it is refused or fails (a
/// success ends the image).
static UNDER_WAY: AtomicBool = AtomicBool::new(false);

/// The one upgrade under way's turn; given back when dropped. Two at once would share the
/// staged file (and the second would delete the first's binary).
pub struct Turn(());

impl Turn {
    fn take() -> Result<Turn, ApiError> {
        UNDER_WAY
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .map(|_| Turn(()))
            .map_err(|_| {
                ApiError::new(
                    409,
                    "another upgrade is under way (its binary being received, checked or \
                     executed): one at a time; try again when it has ended",
                )
            })
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        UNDER_WAY.store(false, Ordering::SeqCst);
    }
}

static PENDING: Mutex<Option<Pending>> = Mutex::new(None);
/// How this image's start from a handover went, once it did.
static OUTCOME: OnceLock<Outcome> = OnceLock::new();

/// The outcome of the handover this image started from, if it did.
pub fn outcome() -> Option<Outcome> {
    OUTCOME.get().copied()
}

/// Records the outcome of the handover this image started from (once, at start).
pub fn record_outcome(outcome: Outcome) {
    let _ = OUTCOME.set(outcome);
}

fn pending() -> MutexGuard<'static, Option<Pending>> {
    PENDING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why an upgrade cannot happen now: state it would lose.
pub fn refusal() -> Option<ApiError> {
    parts::refusal().map(|why| ApiError::new(409, why))
}

/// What the previous image handed over, as `X-Envd-Handover` reports it (envd's fields: each
/// count is of what was carried, `_failed` of what of it could not be taken back).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    pub failed: bool,
    pub procs: usize,
    pub procs_failed: usize,
    pub retained: usize,
    pub retained_failed: usize,
    pub watchers: usize,
    pub watchers_failed: usize,
}

impl Outcome {
    /// envd's `handoverResult` JSON.
    pub fn header(&self) -> String {
        format!(
            "{{\"failed\":{},\"procs\":{},\"procs_failed\":{},\"retained\":{},\
             \"retained_failed\":{},\"watchers\":{},\"watchers_failed\":{}}}",
            self.failed,
            self.procs,
            self.procs_failed,
            self.retained,
            self.retained_failed,
            self.watchers,
            self.watchers_failed
        )
    }
}

/// Hands the upgrade to the main thread; the request waits for its deferred answer. Its turn
/// goes along (so no pending upgrade is ever replaced).
fn hand_to_main_thread(binary: Option<Binary>, turn: Turn) -> Result<Response, ApiError> {
    let (answer, deferred) = crate::http::deferred::channel();
    *pending() = Some(Pending {
        binary,
        answer,
        _turn: turn,
    });
    if let Err(error) = crate::sys::process::signal_self(libc::SIGUSR2) {
        pending().take();
        return Err(ApiError::internal(format!(
            "cannot start the upgrade: {error}"
        )));
    }
    Ok(Response::deferred(deferred))
}

/// The main thread's side, on `SIGUSR2`: performs the pending upgrade; returns only when it did
/// not happen (the request then has its answer and the daemon serves on).
pub fn perform<H: crate::http::Handler>(
    server: &crate::http::Server<H>,
    app: &App,
    drain_timeout: Duration,
    signals: &[libc::c_int],
) {
    let Some(Pending { binary, answer, .. }) = pending().take() else {
        return;
    };
    if let Some(refused) = refusal() {
        answer.send(refused.into());
        return;
    }
    let Some(listener) = server.pause_accepting() else {
        answer.send(ApiError::internal("the daemon is shutting down").into());
        return;
    };
    log::line(format_args!(
        "upgrade: draining before executing {}",
        binary.as_ref().map_or_else(
            || "the running binary".into(),
            |b| format!("'{}'", b.path.display())
        )
    ));
    // The parts stop changing what they hand over, and end the streams the `execve` would cut
    // (each told to Connect again) so that the drain does not wait for them.
    parts::prepare();
    // The upgrade request itself waits in flight for its answer; connections accepted before
    // the pause get their request in first.
    if !server.wait_quiet(1, drain_timeout) {
        log::line(format_args!(
            "upgrade: drain timeout of {drain_timeout:?} reached; requests under way are cut"
        ));
    }
    let error = exec(app, &listener, binary.as_ref());
    // Only on failure: the old image serves on.
    if let Err(restore) = crate::sys::process::block_signals(signals) {
        log::line(format_args!(
            "upgrade: cannot block signals again: {restore}"
        ));
    }
    let _ = fds::set_close_on_exec(&listener, true);
    parts::resume();
    let resumed = server.resume_accepting(listener);
    log::line(format_args!("upgrade failed, serving on: {error}"));
    if let Err(resume) = resumed {
        log::line(format_args!("upgrade: cannot accept again: {resume}"));
    }
    answer.send(ApiError::internal(format!("upgrade failed: {error}")).into());
}

/// Writes the handover and executes; returns only the reason it could not.
fn exec(app: &App, listener: &std::net::TcpListener, binary: Option<&Binary>) -> String {
    // The running binary is the file the kernel keeps for the process, not whatever a path
    // names now.
    const RUNNING: &str = "/proc/self/exe";
    let (program, shown) = match binary {
        Some(binary) => (binary.file.try_clone(), binary.path.display().to_string()),
        None => (File::open(RUNNING), RUNNING.to_string()),
    };
    let program = match program {
        Ok(file) => file,
        Err(error) => return format!("cannot open '{shown}': {error}"),
    };
    let mut handover = Handover::of(app.state(), listener.as_raw_fd());
    let mut carry = carry::Carry::new();
    if let Err(error) = parts::export(app, &mut handover, &mut carry) {
        return format!("cannot write the handover: {error}");
    }
    // Executed from a carried duplicate: open across the `execve` (a script's interpreter
    // opens `/dev/fd/<n>`), named in the handover so the new image closes it.
    let program = match carry.keep(program.as_fd()) {
        Ok(number) => number,
        Err(error) => return format!("cannot write the handover: {error}"),
    };
    handover.binary_fd = Some(program);
    handover.carried_fds = carry.numbers();
    let mut memory = match fds::memory_file("sandboxd-handover") {
        Ok(file) => file,
        Err(error) => return format!("cannot make the handover file: {error}"),
    };
    if let Err(error) = memory
        .write_all(&handover.encode_to_vec())
        .and_then(|()| memory.rewind())
        .and_then(|()| fds::set_close_on_exec(&memory, false))
        .and_then(|()| fds::set_close_on_exec(listener, false))
        .and_then(|()| carry.open_across_exec())
    {
        return format!("cannot write the handover: {error}");
    }
    let value = format!("{},{}", listener.as_raw_fd(), memory.as_raw_fd());
    let args: Vec<OsString> = std::env::args_os().collect();
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(key, _)| key.as_bytes() != HANDOVER_VAR.as_bytes())
        .collect();
    env.push((HANDOVER_VAR.into(), value.into()));
    let Some(program) = carry.descriptor(program) else {
        return format!("cannot execute '{shown}': its descriptor is not carried");
    };
    // Lines buffered by the workers are this image's: written before it is replaced.
    crate::log::flush();
    let error = crate::sys::exec::exec_fd(program, &args, &env);
    format!("cannot execute '{shown}': {error}")
}

/// What the new image took over at start.
pub struct TakenOver {
    pub listener: std::net::TcpListener,
    /// The state, or why it could not be read (the listener is still used).
    pub state: Result<Handover, String>,
    /// The descriptors the state names, claimed.
    pub inherited: carry::Inherited,
}

/// The new image's side, at start: the listener, state and descriptors the previous one handed
/// over, if `SANDBOXD_HANDOVER` names them. The variable is removed from the environment.
pub fn take_over() -> Option<TakenOver> {
    let value = std::env::var(HANDOVER_VAR).ok()?;
    std::env::remove_var(HANDOVER_VAR);
    let (listener_fd, state_fd) = value.split_once(',')?;
    let listener = match listener_fd.parse().map(fds::take_listener) {
        Ok(Ok(listener)) => listener,
        Ok(Err(error)) => {
            log::line(format_args!(
                "upgrade: the handed-over listener {listener_fd} is unusable: {error}"
            ));
            return None;
        }
        Err(_) => {
            log::line(format_args!(
                "upgrade: {HANDOVER_VAR} is malformed: '{value}'"
            ));
            return None;
        }
    };
    let state = state_fd
        .parse()
        .map_err(|_| format!("{HANDOVER_VAR} is malformed: '{value}'"))
        .and_then(|fd| fds::take_file(fd).map_err(|e| format!("the state file {fd}: {e}")))
        .and_then(|file| {
            let mut bytes = Vec::new();
            file.take(MAX_STATE)
                .read_to_end(&mut bytes)
                .map_err(|e| format!("reading the state: {e}"))?;
            Handover::decode_checked(&bytes)
        });
    let inherited = match &state {
        Ok(handover) => carry::Inherited::claim(&handover.carried_fds),
        Err(_) => carry::Inherited::default(),
    };
    Some(TakenOver {
        listener,
        state,
        inherited,
    })
}

/// The new image takes back what the handover carries (after the daemon's own state): each
/// part adopts its share; how it went is kept for `/init`.
pub fn adopt(app: &App, mut handover: Handover, mut inherited: carry::Inherited) {
    // The binary this image was executed from: held only for the `execve`.
    if let Some(number) = handover.binary_fd {
        drop(inherited.take(number));
    }
    let outcome = parts::adopt(app, &mut handover, &mut inherited);
    inherited.close_rest();
    log::line(format_args!("upgrade: took back {}", outcome.header()));
    record_outcome(outcome);
}
