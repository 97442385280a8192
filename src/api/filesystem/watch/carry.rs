//! The watches across a live upgrade (`crate::upgrade`, part "watchers").
//!
//! - [`prepare`]: the watcher thread stops reading (events wait in each instance's kernel
//!   queue) and every `WatchDir` stream ends with `unavailable`: its connection would not
//!   cross the `execve`, and the drain must not wait for it. [`resume`] reads again.
//! - [`export`]: every `CreateWatcher` watcher as a [`CarriedWatcher`]: its id, how it
//!   describes events, the events waiting for `GetWatcherEvents`, its error or expiry and the
//!   idle time it has left, and its inotify instance (a carried descriptor) with its table.
//! - [`adopt`]: the new image re-creates each under its id; its instance is read on from where
//!   the old image stopped (`fs::watch::carry`). One whose data does not hold together (or
//!   whose descriptor is missing) fails alone, logged, and its id is then unknown.

use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;

use super::budget::Charge;
use super::watchers::{
    lock, watchers, BufferSink, Watcher, IDLE_EXPIRY, MAX_BYTES, MAX_EVENTS, MAX_WATCHERS,
};
use super::{Describe, FilesystemEvent};
use crate::connect::{Code, Error};
use crate::fs::owners::Owners;
use crate::fs::watch::carry::CarriedDir;
use crate::fs::watch::Hub;
use crate::log;
use crate::sys::inotify::Inotify;
use crate::upgrade::carry::{Carry, Inherited};

/// One `CreateWatcher` watcher, as the handover carries it (the first four fields are envd's
/// `HandoverWatcher`'s).
#[derive(Clone, PartialEq, prost::Message)]
pub struct CarriedWatcher {
    #[prost(string, tag = "1")]
    pub id: String,
    /// The watched directory, as the watch was given it (bytes: a path need not be UTF-8).
    #[prost(bytes = "vec", tag = "2")]
    pub root: Vec<u8>,
    #[prost(bool, tag = "3")]
    pub recursive: bool,
    #[prost(bool, tag = "4")]
    pub include_entry: bool,
    /// The events waiting for `GetWatcherEvents`, oldest first: a [`PendingEvents`], encoded
    /// once by the old image and decoded once by the new (not a field of messages, which the
    /// handover's own decoding would copy event by event before the watcher takes them).
    #[prost(bytes = "vec", tag = "5")]
    pub pending_events: Vec<u8>,
    /// The error every `GetWatcherEvents` answers, once it failed: its code's name...
    #[prost(string, optional, tag = "6")]
    pub error_code: Option<String>,
    /// ...and its message.
    #[prost(string, tag = "7")]
    pub error_message: String,
    #[prost(bool, tag = "8")]
    pub expired: bool,
    /// Milliseconds before it expires unless its client asks for its events.
    #[prost(uint64, tag = "9")]
    pub idle_left_ms: u64,
    /// Its inotify instance's descriptor number (`upgrade::carry`); absent once its watch
    /// ended (a failed or expired watcher).
    #[prost(int32, optional, tag = "10")]
    pub inotify_fd: Option<i32>,
    /// The instance's table: every watched directory.
    #[prost(message, repeated, tag = "11")]
    pub dirs: Vec<CarriedDir>,
    /// The passwd file naming the owners of entries it describes.
    #[prost(bytes = "vec", tag = "12")]
    pub passwd_file: Vec<u8>,
}

/// A watcher's waiting events.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PendingEvents {
    #[prost(message, repeated, tag = "1")]
    pub events: Vec<FilesystemEvent>,
}

/// `events` encoded as a [`PendingEvents`].
fn encode_events(events: &[FilesystemEvent]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(events_len(events));
    for event in events {
        prost::encoding::message::encode(1, event, &mut bytes);
    }
    bytes
}

fn events_len(events: &[FilesystemEvent]) -> usize {
    events
        .iter()
        .map(|event| prost::encoding::message::encoded_len(1, event))
        .sum()
}

/// The longest id taken back (sandboxd's are 33 bytes).
const MAX_ID: usize = 128;
/// The most bytes the watchers may take in the handover: half of what the next image reads of
/// it (`upgrade::MAX_STATE`, 16 MiB), the rest being the other parts'.
pub const MAX_CARRIED: usize = 8 << 20;

/// Why the watchers cannot be carried now: their waiting events would not fit the handover.
pub fn refusal() -> Option<String> {
    let events: usize = watchers()
        .values()
        .map(|watcher| events_len(&lock(&watcher.buffer).events))
        .sum();
    (events > MAX_CARRIED).then(|| format!("cannot upgrade now: {}", too_many(events)))
}

fn too_many(bytes: usize) -> String {
    format!(
        "the watchers' waiting events take {} KiB, more than the {} MiB a handover carries; \
         fetch them (GetWatcherEvents) or remove watchers, then upgrade again",
        bytes >> 10,
        MAX_CARRIED >> 20
    )
}

/// Stops reading and ends every `WatchDir` stream.
pub fn prepare() {
    // Started if it was not: a watcher created during the drain is then paused too.
    match Hub::global() {
        Ok(hub) => hub.pause(),
        Err(error) => log::line(format_args!(
            "upgrade: cannot pause the directory watcher: {error}"
        )),
    }
}

/// Reads again: the upgrade did not happen (ended streams stay ended).
pub fn resume() {
    if let Some(hub) = Hub::running() {
        hub.resume();
    }
}

/// Every `CreateWatcher` watcher written down, its instance kept in `carry`.
pub fn export(carry: &mut Carry) -> Result<Vec<CarriedWatcher>, String> {
    let all = watchers();
    let now = Instant::now();
    let mut carried = Vec::with_capacity(all.len());
    for (id, watcher) in all.iter() {
        let watch = watcher
            .watch
            .as_ref()
            .and_then(|(hub, watch)| hub.carried(*watch));
        let buffer = lock(&watcher.buffer);
        let mut entry = CarriedWatcher {
            id: id.clone(),
            include_entry: watcher.include_entry,
            pending_events: encode_events(&buffer.events),
            error_code: buffer.error.as_ref().map(|e| e.code.as_str().to_string()),
            error_message: buffer
                .error
                .as_ref()
                .map_or_else(String::new, |e| e.message.clone()),
            expired: buffer.expired,
            idle_left_ms: millis(buffer.expires.saturating_duration_since(now)),
            passwd_file: watcher.owners.source().as_os_str().as_bytes().to_vec(),
            ..CarriedWatcher::default()
        };
        if let Some(watch) = watch {
            let number = carry
                .keep(watch.kernel.as_fd())
                .map_err(|e| format!("keeping watcher {id}'s inotify instance: {e}"))?;
            entry.inotify_fd = Some(number);
            entry.root = watch.root.as_os_str().as_bytes().to_vec();
            entry.recursive = watch.recursive;
            entry.dirs = watch.dirs;
        }
        carried.push(entry);
    }
    let bytes: usize = carried.iter().map(prost::Message::encoded_len).sum();
    if bytes > MAX_CARRIED {
        return Err(too_many(bytes));
    }
    Ok(carried)
}

/// Re-creates every carried watcher; (carried, failed).
pub fn adopt(carried: &[CarriedWatcher], inherited: &mut Inherited) -> (usize, usize) {
    let mut failed = 0;
    for watcher in carried {
        if let Err(why) = adopt_one(watcher, inherited) {
            log::line(format_args!(
                "upgrade: watcher {:?} is not taken back: {why}",
                watcher.id
            ));
            failed += 1;
        }
    }
    (carried.len(), failed)
}

fn adopt_one(carried: &CarriedWatcher, inherited: &mut Inherited) -> Result<(), &'static str> {
    // Taken first, so that a watcher failing for another reason closes its instance.
    let fd = carried.inotify_fd.and_then(|number| inherited.take(number));
    let id = carried.id.as_str();
    let mut all = watchers();
    if id.is_empty() || id.len() > MAX_ID || all.contains_key(id) {
        return Err("its id is empty, too long or taken");
    }
    // Counted as they are: an expired one is kept to say so once, as in the old image.
    if all.len() >= MAX_WATCHERS {
        return Err("the most watchers are taken back already");
    }
    let events = PendingEvents::decode(carried.pending_events.as_slice())
        .map_err(|_| "its events do not decode")?
        .events;
    let (events, charge) =
        pending(events).ok_or("its events pass a watcher's bounds or the budget")?;
    let passwd = Path::new(OsStr::from_bytes(&carried.passwd_file));
    if !passwd.is_absolute() {
        return Err("its passwd file is not an absolute path");
    }
    let owners = Owners::current(passwd);
    let describe = Describe {
        include_entry: carried.include_entry,
        owners: Arc::clone(&owners),
    };
    let (sink, buffer) = BufferSink::filling(describe, events, charge);
    {
        let mut buffer = lock(&buffer);
        let left = Duration::from_millis(carried.idle_left_ms).min(IDLE_EXPIRY);
        buffer.expires = Instant::now() + left;
        buffer.expired = carried.expired;
        buffer.error = carried.error_code.as_deref().map(|code| Error {
            code: code_named(code),
            message: carried.error_message.clone(),
        });
    }
    let watch = if carried.expired || carried.error_code.is_some() {
        None
    } else {
        let kernel = fd
            .and_then(|fd| Inotify::from_carried(fd).ok())
            .ok_or("its inotify descriptor is missing or not an inotify instance")?;
        let hub = Hub::global().map_err(|_| "the directory watcher cannot start")?;
        let root = Path::new(OsStr::from_bytes(&carried.root));
        let watch = hub.adopt(
            root,
            carried.recursive,
            kernel,
            &carried.dirs,
            Box::new(sink),
        )?;
        Some((hub, watch))
    };
    let watcher = Watcher {
        watch,
        buffer,
        include_entry: carried.include_entry,
        owners,
    };
    all.insert(id.to_string(), watcher);
    Ok(())
}

/// The waiting events, if within a watcher's bounds, charged to the daemon's budget.
fn pending(events: Vec<FilesystemEvent>) -> Option<(Vec<FilesystemEvent>, Charge)> {
    let size = std::mem::size_of::<FilesystemEvent>();
    let bytes: usize = events.iter().map(|e| size + e.heap_bytes()).sum();
    let mut charge = Charge::default();
    let fits = events.len() <= MAX_EVENTS && bytes <= MAX_BYTES && charge.add(bytes);
    fits.then_some((events, charge))
}

/// What the new image reads of a carried watcher beyond the handover's own decoding (its
/// events' blob, its paths), for the fuzz target: never a panic; events that decode re-encode
/// to the same blob.
#[cfg(feature = "fuzzing")]
pub fn fuzz_carried(carried: &CarriedWatcher) {
    if let Ok(pending) = PendingEvents::decode(carried.pending_events.as_slice()) {
        let again = PendingEvents::decode(encode_events(&pending.events).as_slice());
        assert_eq!(again.as_ref(), Ok(&pending));
    }
    let root = Path::new(OsStr::from_bytes(&carried.root));
    let _ = crate::fs::watch::carry::holds_together(root, &carried.dirs);
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The code named `name` on the wire; `unknown` for a name this build does not know.
fn code_named(name: &str) -> Code {
    const CODES: [Code; 16] = [
        Code::Canceled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];
    CODES
        .into_iter()
        .find(|code| code.as_str() == name)
        .unwrap_or(Code::Unknown)
}

#[cfg(test)]
mod tests {
    use super::super::watchers::{get_watcher_events, remove_watcher};
    use super::*;
    use std::os::fd::IntoRawFd;

    fn literal(id: &str) -> CarriedWatcher {
        CarriedWatcher {
            id: id.into(),
            pending_events: encode_events(&[FilesystemEvent {
                name: "a.txt".into(),
                kind: 1,
                entry: None,
            }]),
            idle_left_ms: 60_000,
            passwd_file: b"/nonexistent/passwd".to_vec(),
            ..CarriedWatcher::default()
        }
    }

    #[cfg(feature = "fuzzing")]
    #[test]
    fn the_fuzz_targets_reading_of_a_carried_watcher_takes_any_bytes() {
        let mut carried = literal("wfuzz");
        fuzz_carried(&carried);
        for cut in 0..carried.pending_events.len() {
            let mut bytes = carried.pending_events.clone();
            bytes.truncate(cut);
            bytes.push(0xff);
            carried.pending_events = bytes;
            carried.root = vec![0xff, b'/', 0];
            fuzz_carried(&carried);
        }
    }

    #[test]
    fn failed_and_expired_watchers_come_back_with_their_answer_and_bad_ones_fail_alone() {
        let failed = CarriedWatcher {
            pending_events: Vec::new(),
            error_code: Some("resource_exhausted".into()),
            error_message: "the queue overflowed".into(),
            ..literal("wcarry-failed")
        };
        let expired = CarriedWatcher {
            expired: true,
            ..literal("wcarry-old")
        };
        let no_instance = literal("wcarry-no-instance");
        let missing_fd = CarriedWatcher {
            inotify_fd: Some(1 << 20),
            ..literal("wcarry-missing-fd")
        };
        let relative = CarriedWatcher {
            error_code: Some("internal".into()),
            passwd_file: b"etc/passwd".to_vec(),
            ..literal("wcarry-relative")
        };
        let all = [failed, expired, no_instance, missing_fd, relative];
        assert_eq!(adopt(&all, &mut Inherited::default()), (5, 3));
        let error = get_watcher_events("wcarry-failed").unwrap_err();
        assert_eq!(
            (error.code, error.message.as_str()),
            (Code::ResourceExhausted, "the queue overflowed")
        );
        let error = get_watcher_events("wcarry-old").unwrap_err();
        assert_eq!(error.code, Code::NotFound);
        assert!(
            error
                .message
                .starts_with("watcher with id wcarry-old expired: "),
            "{}",
            error.message
        );
        for gone in ["wcarry-no-instance", "wcarry-missing-fd", "wcarry-relative"] {
            assert_eq!(get_watcher_events(gone).unwrap_err().code, Code::NotFound);
        }
        // A taken id is not taken twice.
        let again = CarriedWatcher {
            error_code: Some("internal".into()),
            ..literal("wcarry-failed")
        };
        assert_eq!(adopt(&[again], &mut Inherited::default()), (1, 1));
        remove_watcher("wcarry-failed").unwrap();
        assert_eq!(code_named("no_such_code"), Code::Unknown);
        assert_eq!(code_named("data_loss"), Code::DataLoss);
    }

    #[test]
    fn a_live_watcher_is_written_down_and_taken_back_with_its_instance_and_events() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let hub = Hub::global().unwrap();
        let owners = std::sync::Arc::new(Owners::load(Path::new("/nonexistent/passwd")));
        let describe = Describe {
            include_entry: false,
            owners: Arc::clone(&owners),
        };
        let (sink, buffer) = BufferSink::filling(describe, Vec::new(), Charge::default());
        let watch = hub
            .watch(dir.path(), true, Box::new(sink))
            .map_err(|r| r.error)
            .unwrap();
        let watcher = Watcher {
            watch: Some((hub.clone(), watch)),
            buffer: std::sync::Arc::clone(&buffer),
            include_entry: false,
            owners,
        };
        watchers().insert("wcarry-live".into(), watcher);
        std::fs::File::create(dir.path().join("a.txt")).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while lock(&buffer).events.is_empty() {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut carry = Carry::new();
        let mut written = export(&mut carry)
            .unwrap()
            .into_iter()
            .find(|w| w.id == "wcarry-live")
            .unwrap();
        let number = written.inotify_fd.take().unwrap();
        written.dirs.sort_by_key(|dir| dir.wd);
        assert_eq!(carry.numbers(), vec![number]);
        written.idle_left_ms = 1000;
        let mut expected = literal("wcarry-live");
        expected.root = dir.path().as_os_str().as_bytes().to_vec();
        expected.recursive = true;
        expected.idle_left_ms = 1000;
        expected.dirs = vec![
            CarriedDir {
                wd: 1,
                path: Vec::new(),
            },
            CarriedDir {
                wd: 2,
                path: b"sub".to_vec(),
            },
        ];
        assert_eq!(written, expected);

        // The next image's side: the watcher gone from this one, its instance a carried number.
        hub.pause();
        let copy = hub
            .carried(watch)
            .unwrap()
            .kernel
            .as_fd()
            .try_clone_to_owned();
        remove_watcher("wcarry-live").unwrap();
        hub.resume();
        std::fs::write(dir.path().join("during"), b"").unwrap();
        written.inotify_fd = Some(copy.unwrap().into_raw_fd());
        let mut inherited = Inherited::claim(&[written.inotify_fd.unwrap()]);
        assert_eq!(adopt(&[written], &mut inherited), (1, 0));
        let mut names = Vec::new();
        while names.len() < 2 {
            assert!(Instant::now() < deadline, "{names:?}");
            let events = get_watcher_events("wcarry-live").unwrap().events;
            names.extend(events.into_iter().map(|e| (e.name, e.kind)));
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(names, [("a.txt".into(), 1), ("during".into(), 1)]);
        remove_watcher("wcarry-live").unwrap();
    }
}
