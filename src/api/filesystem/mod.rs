//! envd's `filesystem.Filesystem` Connect service (SPEC §9b): what the SDKs' `files.exists`,
//! `get_info`, `list`, `make_dir`, `rename`, `remove` and `watch_dir` call.
//!
//! This module owns the service: which methods exist, who the caller is (the token as on every
//! route, then the user named by `Authorization: Basic`, else the default user, as envd reads
//! it), and how filesystem errors become Connect codes. The protocol is `connect`'s, the
//! messages `messages`', an entry's description `entry`'s, the unary methods `ops`', the
//! watches (`WatchDir`, a server stream, and the polled watchers) `watch`'s.

mod entry;
mod messages;
mod ops;
mod watch;

pub use watch::carry as watch_carry;

use std::io;
use std::path::Path;
use std::sync::Arc;

use super::rpc::{self, api_error, failed, keepalive_interval, Kind};
use crate::app::{App, Resolver};
use crate::connect::{Call, Code, Error};
use crate::fs::owners::Owners;
use crate::fs::users::User;
use crate::http::{Action, Head, Response};
use messages::{Empty, EntryInfo, ListDirRequest, MoveRequest, PathRequest};

/// The service's name in Connect paths.
pub const SERVICE: &str = "filesystem.Filesystem";

/// The methods of envd's service; `WatchDir` is the one whose answer is a stream.
const METHODS: [(&str, Kind); 9] = [
    ("Stat", Kind::Unary),
    ("MakeDir", Kind::Unary),
    ("Move", Kind::Unary),
    ("ListDir", Kind::Unary),
    ("Remove", Kind::Unary),
    ("WatchDir", Kind::ServerStream),
    ("CreateWatcher", Kind::Unary),
    ("GetWatcherEvents", Kind::Unary),
    ("RemoveWatcher", Kind::Unary),
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
    let caller = Caller::new(app, username)?;
    // Every method's filesystem calls are the user's with `--fs-as-user`, on this thread or on
    // the thread that runs them (ListDir's long-call thread, WatchDir's setup thread, each of
    // which takes the user's credentials itself). Those threads live as long as the process
    // and inherit the credentials of the thread that starts them, so they are started, as the
    // daemon, before the switch.
    if app.config.fs_as_user {
        watch::hub()?;
        watch::setup::start_threads()?;
        super::long_calls::start();
    }
    // The methods that write hold the filesystem-freeze gate across their calls (refused
    // while it is closed: `api::fsfreeze`).
    let _gate =
        match method {
            "MakeDir" | "Move" | "Remove" => Some(app.fsfreeze.writing().map_err(|closed| {
                Error::new(Code::Unavailable, super::fsfreeze::refusal(closed))
            })?),
            _ => None,
        };
    let _as_user = app
        .as_user_with(&caller.user, &caller.owners)
        .map_err(|e| Error::new(Code::Internal, e.to_string()))?;
    Ok(match method {
        "Stat" => call.unary(&ops::stat(
            &caller,
            &call.request::<PathRequest>(body)?.path,
        )?),
        // A walk of a big tree may take seconds: off the HTTP workers (SPEC §9b), on a thread
        // of the long-call executor, which takes the user's credentials itself.
        "ListDir" => {
            let request: ListDirRequest = call.request(body)?;
            let (app, call) = (Arc::clone(app), call.clone());
            super::long_calls::run(move || {
                let listed = app
                    .as_user_with(&caller.user, &caller.owners)
                    .map_err(|e| Error::new(Code::Internal, e.to_string()))
                    .and_then(|_as_user| ops::list_dir(&caller, &request.path, request.depth));
                listed.map_or_else(Error::into_response, |answer| call.unary(&answer))
            })?
        }
        "MakeDir" => {
            let request: PathRequest = call.request(body)?;
            call.unary(&ops::make_dir(&caller, &request.path)?)
        }
        "Move" => {
            let request: MoveRequest = call.request(body)?;
            call.unary(&ops::rename(
                &caller,
                &request.source,
                &request.destination,
            )?)
        }
        "Remove" => {
            ops::remove(&caller, &call.request::<PathRequest>(body)?.path)?;
            call.unary(&Empty {})
        }
        "WatchDir" => {
            let keepalive = keepalive_interval(head);
            call.request(body)
                .and_then(|request| watch::watch_dir(app, caller, call, keepalive, request))
                .unwrap_or_else(|error| failed(call.codec, error))
        }
        "CreateWatcher" => call.unary(&watch::create_watcher(caller, call.request(body)?)?),
        "GetWatcherEvents" => {
            let request: watch::WatcherRequest = call.request(body)?;
            call.unary(&watch::get_watcher_events(&request.watcher_id)?)
        }
        "RemoveWatcher" => {
            let request: watch::WatcherRequest = call.request(body)?;
            watch::remove_watcher(&request.watcher_id)?;
            call.unary(&Empty {})
        }
        other => {
            return Err(Error::new(
                Code::Unimplemented,
                format!("{SERVICE}/{other} is not implemented by sandboxd"),
            ))
        }
    })
}

/// Every request message of the service read from `data` in `codec` (as
/// `process::fuzz_requests`).
#[cfg(feature = "fuzzing")]
pub fn fuzz_requests(codec: crate::connect::Codec, data: &[u8]) {
    use crate::connect::codec::check_round_trip;
    check_round_trip::<PathRequest>(codec, data);
    check_round_trip::<ListDirRequest>(codec, data);
    check_round_trip::<MoveRequest>(codec, data);
    check_round_trip::<watch::WatchRequest>(codec, data);
    check_round_trip::<watch::WatcherRequest>(codec, data);
}

/// Who calls: their user (for paths and ownership) and the names of owners for entries.
pub struct Caller {
    resolver: Resolver,
    pub user: User,
    pub owners: Arc<Owners>,
}

impl Caller {
    fn new(app: &App, username: Option<&str>) -> Result<Caller, Error> {
        let resolver = app.resolver(username).map_err(api_error)?;
        Ok(Caller {
            user: resolver.user.clone(),
            resolver,
            owners: Owners::current(&app.config.passwd_file),
        })
    }

    /// A client's path, resolved for this user (SPEC §4); a bad one is `invalid_argument`.
    pub fn resolve(&self, raw: &str) -> Result<std::path::PathBuf, Error> {
        self.resolver
            .resolve(raw)
            .map_err(|e| Error::invalid_argument(e.to_string()))
    }

    pub fn entry(&self, path: &Path, shown: &Path) -> Result<EntryInfo, Error> {
        entry::entry_info(path, shown, &self.owners)
            .map_err(|e| io_error(&e, "error getting file info", path))
    }
}

/// An OS error met doing `what` on `path`, as a Connect error.
fn io_error(error: &io::Error, what: &str, path: &Path) -> Error {
    let code = match error.kind() {
        _ if crate::api::status::exhausted(error) => Code::ResourceExhausted,
        _ if crate::fs::walk::is_moved(error) => Code::Aborted,
        io::ErrorKind::NotFound => Code::NotFound,
        io::ErrorKind::PermissionDenied => Code::PermissionDenied,
        io::ErrorKind::AlreadyExists => Code::AlreadyExists,
        _ => match error.raw_os_error() {
            Some(libc::ENOTDIR | libc::EISDIR | libc::ENAMETOOLONG | libc::EINVAL) => {
                Code::InvalidArgument
            }
            Some(libc::ENOTEMPTY) => Code::FailedPrecondition,
            _ => Code::Internal,
        },
    };
    Error::new(code, format!("{what}: {}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_errors_become_connect_codes() {
        let code =
            |errno| io_error(&io::Error::from_raw_os_error(errno), "x", Path::new("/p")).code;
        assert_eq!(code(libc::ENOENT), Code::NotFound);
        assert_eq!(code(libc::EACCES), Code::PermissionDenied);
        assert_eq!(code(libc::EEXIST), Code::AlreadyExists);
        assert_eq!(code(libc::ENOSPC), Code::ResourceExhausted);
        assert_eq!(code(libc::EMFILE), Code::ResourceExhausted);
        assert_eq!(code(libc::ENFILE), Code::ResourceExhausted);
        assert_eq!(code(libc::ENOTDIR), Code::InvalidArgument);
        assert_eq!(code(libc::ENOTEMPTY), Code::FailedPrecondition);
        assert_eq!(code(libc::EIO), Code::Internal);
        let error = io_error(
            &io::Error::from_raw_os_error(libc::ENOENT),
            "file not found",
            Path::new("/p"),
        );
        assert!(
            error.message.starts_with("file not found: /p: "),
            "{}",
            error.message
        );
    }
}
