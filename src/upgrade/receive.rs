//! `POST /upgrade`'s checks and body: one upgrade at a time; the new binary streamed to a
//! staged file in `--upgrade-path`'s directory (checked to be root's alone and held open:
//! [`Staging`]), checked to run and executed from that file's descriptor, never by its path;
//! placed at `--upgrade-path` once checked; then the main thread takes over.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::staging::Staging;
use super::{hand_to_main_thread, refusal, Binary, Turn};
use crate::app::App;
use crate::error::ApiError;
use crate::http::{Action, BodySink, Head, Response};
use crate::platform::command;

/// envd's fixed path (`DefaultUpgradeBinPath`), which E2B's orchestrator names in
/// `X-Envd-Upgrade-Bin`: it means `--upgrade-path`, wherever that is.
pub const ENVD_UPGRADE_PATH: &str = "/usr/bin/envd.next";
/// The largest binary accepted.
pub const MAX_BINARY: u64 = 256 << 20;
/// How long the new binary's `-version` may take.
const VERSION_BUDGET: Duration = Duration::from_secs(5);

/// Checks the request from its head (the router has checked the token, before the
/// filesystem-freeze gate); an empty body re-executes the running binary.
pub fn begin(app: &Arc<App>, head: &Head) -> Result<Action, ApiError> {
    if !app.is_initialized() {
        return Err(ApiError::new(
            409,
            "not initialized: /upgrade is accepted only after an authorised POST /init",
        ));
    }
    let target = &app.config.upgrade_path;
    if let Some(named) = head.header("x-envd-upgrade-bin").filter(|h| !h.is_empty()) {
        if named != target.as_os_str().as_encoded_bytes() && named != ENVD_UPGRADE_PATH.as_bytes() {
            return Err(ApiError::bad_request(format!(
                "unsupported upgrade target '{}': the only ones are '{}' (--upgrade-path) and \
                 envd's '{ENVD_UPGRADE_PATH}', which means it",
                String::from_utf8_lossy(named),
                target.display()
            )));
        }
    }
    if let Some(refused) = refusal() {
        return Err(refused);
    }
    let length = head
        .header("content-length")
        .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok());
    let chunked = head.header("transfer-encoding").is_some();
    if length.unwrap_or(0) == 0 && !chunked {
        return hand_to_main_thread(None, Turn::take()?).map(Action::Respond);
    }
    if length.is_some_and(|length| length > MAX_BINARY) {
        return Err(too_large());
    }
    let turn = Turn::take()?;
    let staging = Staging::open(target).map_err(ApiError::internal)?;
    Ok(Action::Consume(Box::new(Receiver::create(staging, turn)?)))
}

fn too_large() -> ApiError {
    ApiError::new(
        413,
        format!("the new binary is larger than {MAX_BINARY} bytes"),
    )
}

/// The body, written to the staged file; removed unless put in place.
struct Receiver {
    staging: Staging,
    /// Open for writing while the body arrives.
    file: Option<File>,
    /// Put in place: nothing to remove.
    placed: bool,
    written: u64,
    /// This upgrade's turn, handed on with the binary.
    turn: Option<Turn>,
}

impl Receiver {
    fn create(mut staging: Staging, turn: Turn) -> Result<Receiver, ApiError> {
        let file = staging
            .create()
            .map_err(|e| ApiError::internal(staging.cannot_write(&e)))?;
        Ok(Receiver {
            staging,
            file: Some(file),
            placed: false,
            written: 0,
            turn: Some(turn),
        })
    }

    /// Closes, checks and places the binary; its read-only descriptor, or the error's answer.
    fn place(&mut self) -> Result<File, ApiError> {
        let file = self
            .file
            .take()
            .ok_or_else(|| ApiError::internal("no file"))?;
        let cannot = |e: std::io::Error| ApiError::internal(self.staging.cannot_write(&e));
        file.sync_all()
            .and_then(|()| file.set_permissions(std::fs::Permissions::from_mode(0o755)))
            .map_err(cannot)?;
        // The writer closed before it runs (a file open for writing cannot be executed:
        // ETXTBSY); the file is held read-only from here on, never looked up by path again.
        let binary = crate::sys::exec::reopen_read_only(&file).map_err(cannot)?;
        drop(file);
        let name = self.staging.target().display().to_string();
        let ran = command::run_from(
            binary.as_fd(),
            &name,
            &["-version"],
            Instant::now() + VERSION_BUDGET,
        );
        let version = ran.output.trim();
        let runs = ran.result.is_ok() && is_version(version);
        if !runs {
            let why = match &ran.result {
                Err(failure) => failure.to_string(),
                Ok(()) => "it printed no version".to_string(),
            };
            return Err(ApiError::bad_request(format!(
                "the new binary does not run: '-version' {why}: '{}'",
                version.chars().take(200).collect::<String>()
            )));
        }
        takes_over(&binary, &name)?;
        let binary = self.staging.place(binary).map_err(|e| {
            ApiError::internal(format!("cannot put the new binary at '{name}': {e}"))
        })?;
        self.placed = true;
        crate::log::line(format_args!(
            "upgrade: a binary of {} bytes for envd {version} is at '{name}'",
            self.written
        ));
        Ok(binary)
    }
}

/// Whether the binary open at `binary` reads the handover this build writes: it answers
/// `--handover-schema` with a layout at least [`SCHEMA`](super::state::SCHEMA). envd's binary,
/// or a sandboxd from before live upgrades, would start without taking over the listener and
/// the processes (and fail to listen): refused before anything is touched.
fn takes_over(binary: &File, name: &str) -> Result<(), ApiError> {
    let ran = command::run_from(
        binary.as_fd(),
        name,
        &["--handover-schema"],
        Instant::now() + VERSION_BUDGET,
    );
    let printed = ran.output.trim();
    let schema = printed.parse::<u32>().ok();
    if ran.result.is_ok() && schema.is_some_and(|schema| schema >= super::state::SCHEMA) {
        return Ok(());
    }
    let why = match (&ran.result, schema) {
        (Err(failure), _) => failure.to_string(),
        (Ok(()), Some(schema)) => format!("it reads layouts up to {schema} only"),
        (Ok(()), None) => "it printed no layout".to_string(),
    };
    Err(ApiError::bad_request(format!(
        "the new binary cannot take over from sandboxd: '--handover-schema' {why}: '{}' (a \
         daemon other than sandboxd, or one without live upgrade, needs a restart instead)",
        printed.chars().take(200).collect::<String>()
    )))
}

/// `1.2.3`: what `-version` prints.
fn is_version(text: &str) -> bool {
    let parts: Vec<&str> = text.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

impl BodySink for Receiver {
    fn data(&mut self, bytes: &[u8]) -> Result<(), Response> {
        self.written += bytes.len() as u64;
        if self.written > MAX_BINARY {
            return Err(too_large().into());
        }
        let Some(file) = self.file.as_mut() else {
            return Err(ApiError::internal("no file").into());
        };
        file.write_all(bytes)
            .map_err(|e| Response::from(ApiError::internal(self.staging.cannot_write(&e))))
    }

    fn end(mut self: Box<Self>) -> Response {
        let file = match self.place() {
            Ok(file) => file,
            Err(error) => return error.into(),
        };
        let Some(turn) = self.turn.take() else {
            return ApiError::internal("no turn").into();
        };
        let binary = Binary {
            file,
            path: self.staging.target().to_path_buf(),
        };
        hand_to_main_thread(Some(binary), turn).unwrap_or_else(Response::from)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if !self.placed {
            self.staging.discard();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_three_numbers() {
        assert!(is_version("0.5.14"));
        assert!(!is_version("0.5"));
        assert!(!is_version("v0.5.14"));
        assert!(!is_version("0.5.14 extra"));
        assert!(!is_version(""));
    }
}
