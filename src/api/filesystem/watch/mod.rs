//! envd's directory watches over Connect (SPEC §9b): `WatchDir`, a server stream of a
//! directory's events (what the JS SDK's `watchDir` and the async Python SDK's `watch_dir`
//! call), and `CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`, the same events kept for
//! polling (what the sync Python SDK's `watch_dir` calls).
//!
//! This module owns what both share: the request, which directory may be watched (resolved for
//! the caller, existing, a directory, not a network mount unless asked), and how a change
//! becomes envd's `FilesystemEvent`. `stream` owns WatchDir's stream (keep-alives, the call's
//! deadline, a client that leaves or does not keep up), `watchers` the polled watchers (ids,
//! buffers, caps, expiry). Watching itself is `fs::watch`'s.

mod budget;
pub mod carry;
pub(super) mod setup;
mod stream;
mod watchers;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use stream::watch_dir;
pub use watchers::{create_watcher, get_watcher_events, remove_watcher};

use super::entry::entry_info;
use super::messages::EntryInfo;
use super::{io_error, Caller};
use crate::connect::{Code, Error};
use crate::fs::owners::Owners;
use crate::fs::watch::{Change, Ended, Hub, Op, WatchError};
use crate::proto_enum;
use crate::sys::statfs;

proto_enum!(
    /// A kind of change, as envd names them.
    EventType {
        Unspecified = 0 => "EVENT_TYPE_UNSPECIFIED",
        Create = 1 => "EVENT_TYPE_CREATE",
        Write = 2 => "EVENT_TYPE_WRITE",
        Remove = 3 => "EVENT_TYPE_REMOVE",
        Rename = 4 => "EVENT_TYPE_RENAME",
        Chmod = 5 => "EVENT_TYPE_CHMOD",
    }
);

impl From<Op> for EventType {
    fn from(op: Op) -> EventType {
        match op {
            Op::Create => EventType::Create,
            Op::Write => EventType::Write,
            Op::Remove => EventType::Remove,
            Op::Rename => EventType::Rename,
            Op::Chmod => EventType::Chmod,
        }
    }
}

/// `WatchDirRequest` and `CreateWatcherRequest`, which have the same fields.
#[derive(Clone, PartialEq, Deserialize, prost::Message)]
#[serde(rename_all = "camelCase", default)]
pub struct WatchRequest {
    #[prost(string, tag = "1")]
    pub path: String,
    #[prost(bool, tag = "2")]
    pub recursive: bool,
    #[prost(bool, tag = "3")]
    pub include_entry: bool,
    #[prost(bool, tag = "4")]
    pub allow_network_mounts: bool,
}

/// `GetWatcherEventsRequest` and `RemoveWatcherRequest`.
#[derive(Clone, PartialEq, Deserialize, prost::Message)]
#[serde(rename_all = "camelCase", default)]
pub struct WatcherRequest {
    #[prost(string, tag = "1")]
    pub watcher_id: String,
}

/// One change, as envd reports it.
#[derive(Clone, PartialEq, Serialize, prost::Message)]
pub struct FilesystemEvent {
    /// Relative to the watched directory; `.` for the directory itself.
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(enumeration = "EventType", tag = "2")]
    #[serde(rename = "type", serialize_with = "EventType::to_json")]
    pub kind: i32,
    /// With `includeEntry`, for a create, write or chmod, when the entry could be read.
    #[prost(message, optional, tag = "3")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

/// How a watch describes its changes.
struct Describe {
    include_entry: bool,
    owners: std::sync::Arc<Owners>,
}

impl Describe {
    /// The event of `change`. The entry is best-effort, as envd's: one gone (or unreadable)
    /// by the time it is looked at is left out.
    fn event(&self, change: &Change<'_>) -> FilesystemEvent {
        let entry = if self.include_entry && change.op.carries_entry() {
            entry_info(change.path, change.path, &self.owners).ok()
        } else {
            None
        };
        FilesystemEvent {
            name: change.name.to_string_lossy().into_owned(),
            kind: EventType::from(change.op).into(),
            entry,
        }
    }
}

impl FilesystemEvent {
    /// The bytes it holds beyond its own size: its name and its entry's strings.
    fn heap_bytes(&self) -> usize {
        self.name.capacity() + self.entry.as_ref().map_or(0, entry_bytes)
    }
}

/// The bytes an entry holds beyond its own size (a map's entries with some room for the map's
/// nodes).
fn entry_bytes(entry: &EntryInfo) -> usize {
    let optional = |text: &Option<String>| text.as_ref().map_or(0, String::capacity);
    let metadata: usize = entry
        .metadata
        .iter()
        .map(|(key, value)| key.capacity() + value.capacity() + 64)
        .sum();
    std::mem::size_of::<EntryInfo>()
        + entry.name.capacity()
        + entry.path.capacity()
        + entry.permissions.capacity()
        + entry.owner.capacity()
        + entry.group.capacity()
        + optional(&entry.symlink_target)
        + metadata
}

/// Filesystems whose events may never arrive, which envd refuses to watch unless
/// `allowNetworkMounts` (the `statfs` magic numbers of NFS, CIFS, SMB, SMB2 and FUSE).
const NETWORK_FILESYSTEMS: [u64; 5] = [0x6969, 0xff53_4d42, 0x517b, 0xfe53_4d42, 0x6573_5546];

/// The directory a request may watch, as envd checks it: resolved for the caller, existing
/// (`not_found`), a directory (`invalid_argument`), and not on a network or FUSE mount unless
/// `allowNetworkMounts` (`invalid_argument`).
fn directory(caller: &Caller, request: &WatchRequest) -> Result<PathBuf, Error> {
    let path = caller.resolve(&request.path)?;
    let meta = std::fs::metadata(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            Error::new(Code::NotFound, format!("path {} not found", path.display()))
        }
        _ => io_error(&e, "error statting path", &path),
    })?;
    if !meta.is_dir() {
        return Err(Error::invalid_argument(format!(
            "path {} not a directory",
            path.display()
        )));
    }
    if !request.allow_network_mounts {
        let kind = statfs::fs_type(&path)
            .map_err(|e| io_error(&e, "error checking mount status", &path))?;
        if NETWORK_FILESYSTEMS.contains(&kind) {
            return Err(Error::invalid_argument(format!(
                "cannot watch path on network filesystem: {} (set allowNetworkMounts to watch it; \
                 its events may be unreliable)",
                path.display()
            )));
        }
    }
    Ok(path)
}

/// The daemon's watcher; failing to start it is running out of descriptors or threads.
pub(super) fn hub() -> Result<Hub, Error> {
    Hub::global().map_err(|e| {
        let code = if crate::api::status::exhausted(&e) {
            Code::ResourceExhausted
        } else {
            Code::Internal
        };
        Error::new(
            code,
            format!(
                "cannot start the directory watcher: {e} (limits: fs.inotify.max_user_instances, \
                 open files)"
            ),
        )
    })
}

/// A directory that could not be watched, as a Connect error.
fn watch_error(error: WatchError) -> Error {
    match error {
        WatchError::Limit { .. } | WatchError::Instances(_) | WatchError::Paths { .. } => {
            Error::new(Code::ResourceExhausted, error.to_string())
        }
        WatchError::Io { path, error } => io_error(&error, "error adding path to watcher", &path),
    }
}

/// Why the watcher ended a watch, as the error its client is given.
fn ended_error(ended: Ended) -> Error {
    match ended {
        Ended::Overflow => Error::new(
            Code::ResourceExhausted,
            "the kernel's inotify event queue overflowed (fs.inotify.max_queued_events): \
             events were lost; watch again",
        ),
        Ended::Failed(error) => watch_error(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn events_carry_an_entry_only_when_asked_and_when_it_stays_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f.txt");
        std::fs::write(&file, b"abc").unwrap();
        let describe = Describe {
            include_entry: true,
            owners: Default::default(),
        };
        let change = |op| Change {
            op,
            name: Path::new("f.txt"),
            path: &file,
        };
        let event = serde_json::to_value(describe.event(&change(Op::Write))).unwrap();
        assert_eq!(event["name"], "f.txt");
        assert_eq!(event["type"], "EVENT_TYPE_WRITE");
        assert_eq!(event["entry"]["size"], "3");
        let event = serde_json::to_value(describe.event(&change(Op::Rename))).unwrap();
        assert_eq!(
            event,
            serde_json::json!({"name":"f.txt","type":"EVENT_TYPE_RENAME"})
        );
        // Gone by the time it is described: no entry, the event still.
        std::fs::remove_file(&file).unwrap();
        let event = describe.event(&change(Op::Create));
        assert!(event.entry.is_none());
        let plain = Describe {
            include_entry: false,
            owners: Default::default(),
        };
        assert!(plain.event(&change(Op::Create)).entry.is_none());
    }

    #[test]
    fn watch_errors_become_connect_codes() {
        let limit = watch_error(WatchError::Limit { path: "/w".into() });
        assert_eq!(limit.code, Code::ResourceExhausted);
        assert!(
            limit.message.contains("max_user_watches"),
            "{}",
            limit.message
        );
        let gone = watch_error(WatchError::Io {
            path: "/w".into(),
            error: std::io::Error::from_raw_os_error(libc::ENOENT),
        });
        assert_eq!(gone.code, Code::NotFound);
        assert_eq!(ended_error(Ended::Overflow).code, Code::ResourceExhausted);
    }
}
