//! `CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`: a watch whose events wait in a buffer
//! until its client asks for them, under an id.
//!
//! Decisions (envd keeps a watcher, and its events, until `RemoveWatcher`, with no bound):
//!
//! - An id is `w` and 32 hex digits from 16 bytes of `/dev/urandom`: unguessable, so one client
//!   cannot read or remove another's watcher by trying ids.
//! - At most [`MAX_WATCHERS`] watchers at once; another is `resource_exhausted`.
//! - At most [`MAX_EVENTS`] events, and [`MAX_BYTES`] of them, wait in a watcher, within the
//!   daemon's budget for all watches (`budget::TOTAL_BYTES`). One more, and the watcher fails
//!   as envd's does on a watch error: its events are dropped, its kernel watches freed, and
//!   every `GetWatcherEvents` answers the error (`resource_exhausted`) until `RemoveWatcher`.
//!   An event's bytes are its share of the buffer and the strings it holds (its name, with
//!   `includeEntry` its entry's).
//! - A recursive watcher is set up in its worker (the id is answered once the watch is in
//!   place), in one of `setup::MAX_WORKER_SETUPS` slots.
//! - A watcher nobody has asked for events for [`IDLE_EXPIRY`] (one hour) expires: its watch and
//!   events are dropped, and the next `GetWatcherEvents` says so (`not_found`) and forgets the
//!   id. A forgotten `stop()` thus costs neither kernel watches nor memory for ever; a client
//!   that polls less than hourly must create a new watcher.
//! - The events of one `GetWatcherEvents` are all those waiting, oldest first, and then no
//!   longer kept.

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::budget::{self, Charge};
use super::setup::WorkerSlot;
use super::{directory, ended_error, hub, watch_error, Describe, FilesystemEvent, WatchRequest};
use crate::api::filesystem::Caller;
use crate::connect::{Code, Error};
use crate::fs::owners::Owners;
use crate::fs::watch::{Change, Ended, Hub, Refused, Sink, WatchId};

/// The most watchers at once.
pub const MAX_WATCHERS: usize = 256;
/// The most events waiting in one watcher.
pub const MAX_EVENTS: usize = 10_000;
/// The most bytes of events waiting in one watcher.
pub const MAX_BYTES: usize = 4 << 20;
/// How long a watcher lives without `GetWatcherEvents`.
pub const IDLE_EXPIRY: Duration = Duration::from_secs(3600);

#[derive(Clone, PartialEq, Serialize, prost::Message)]
#[serde(rename_all = "camelCase")]
pub struct CreateWatcherResponse {
    #[prost(string, tag = "1")]
    pub watcher_id: String,
}

#[derive(Clone, PartialEq, Serialize, prost::Message)]
pub struct GetWatcherEventsResponse {
    #[prost(message, repeated, tag = "1")]
    pub events: Vec<FilesystemEvent>,
}

/// Every watcher, by id.
static WATCHERS: Mutex<BTreeMap<String, Watcher>> = Mutex::new(BTreeMap::new());

pub(super) struct Watcher {
    /// Its watch; `None` once it failed or expired.
    pub(super) watch: Option<(Hub, WatchId)>,
    pub(super) buffer: Arc<Mutex<Buffer>>,
    /// How it describes its events (`BufferSink`'s), for a live upgrade.
    pub(super) include_entry: bool,
    pub(super) owners: Arc<Owners>,
}

/// What a watcher holds for its client.
pub(super) struct Buffer {
    pub(super) events: Vec<FilesystemEvent>,
    /// What `events` holds, charged to the daemon's budget.
    pub(super) charge: Charge,
    /// Once set, the answer to every `GetWatcherEvents`.
    pub(super) error: Option<Error>,
    /// When it expires unless its client asks for its events before.
    pub(super) expires: Instant,
    pub(super) expired: bool,
}

pub fn create_watcher(
    caller: Caller,
    request: WatchRequest,
) -> Result<CreateWatcherResponse, Error> {
    let dir = directory(&caller, &request)?;
    let hub = hub()?;
    ensure_room(&mut watchers())?;
    let id = new_id()?;
    let _slot = if request.recursive {
        Some(WorkerSlot::take()?)
    } else {
        None
    };
    let owners = Arc::clone(&caller.owners);
    let (sink, buffer) = BufferSink::new(Describe {
        include_entry: request.include_entry,
        owners: caller.owners,
    });
    let watch = hub
        .watch(&dir, request.recursive, Box::new(sink))
        .map_err(|Refused { error, .. }| watch_error(error))?;
    let mut all = watchers();
    // Checked again: others may have been created meanwhile.
    if let Err(error) = ensure_room(&mut all) {
        drop(all);
        hub.unwatch(watch);
        return Err(error);
    }
    let watcher = Watcher {
        watch: Some((hub, watch)),
        buffer,
        include_entry: request.include_entry,
        owners,
    };
    all.insert(id.clone(), watcher);
    Ok(CreateWatcherResponse { watcher_id: id })
}

pub fn get_watcher_events(id: &str) -> Result<GetWatcherEventsResponse, Error> {
    let mut all = watchers();
    let watcher = all.get(id).ok_or_else(|| not_found(id))?;
    let mut buffer = lock(&watcher.buffer);
    if buffer.expired {
        drop(buffer);
        all.remove(id);
        return Err(Error::new(
            Code::NotFound,
            format!(
                "watcher with id {id} expired: nobody asked for its events for {} minutes; \
                 create another",
                IDLE_EXPIRY.as_secs() / 60
            ),
        ));
    }
    buffer.expires = Instant::now() + IDLE_EXPIRY;
    if let Some(error) = &buffer.error {
        return Err(error.clone());
    }
    let events = std::mem::take(&mut buffer.events);
    buffer.charge.clear();
    Ok(GetWatcherEventsResponse { events })
}

pub fn remove_watcher(id: &str) -> Result<(), Error> {
    let watcher = watchers().remove(id).ok_or_else(|| not_found(id))?;
    if let Some((hub, watch)) = watcher.watch {
        hub.unwatch(watch);
    }
    Ok(())
}

fn not_found(id: &str) -> Error {
    Error::new(Code::NotFound, format!("watcher with id {id} not found"))
}

/// Forgets expired watchers, then refuses when [`MAX_WATCHERS`] are left.
fn ensure_room(all: &mut BTreeMap<String, Watcher>) -> Result<(), Error> {
    all.retain(|_, watcher| !lock(&watcher.buffer).expired);
    if all.len() >= MAX_WATCHERS {
        return Err(Error::new(
            Code::ResourceExhausted,
            format!(
                "too many watchers: at most {MAX_WATCHERS} at once; remove one with \
                 RemoveWatcher (the SDK's WatchHandle.stop())"
            ),
        ));
    }
    Ok(())
}

/// A new unguessable id.
fn new_id() -> Result<String, Error> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut bytes))
        .map_err(|e| Error::new(Code::Internal, format!("reading /dev/urandom: {e}")))?;
    let mut id = String::from("w");
    for byte in bytes {
        id.push_str(&format!("{byte:02x}"));
    }
    Ok(id)
}

pub(super) fn watchers() -> MutexGuard<'static, BTreeMap<String, Watcher>> {
    WATCHERS.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn lock(buffer: &Mutex<Buffer>) -> MutexGuard<'_, Buffer> {
    buffer.lock().unwrap_or_else(|e| e.into_inner())
}

/// The watch's side of a watcher: fills its buffer. Lock order: the watchers' table, then a
/// buffer; the watcher thread takes a buffer only.
pub(super) struct BufferSink {
    buffer: Arc<Mutex<Buffer>>,
    describe: Describe,
}

impl BufferSink {
    /// A sink filling a new, empty buffer (also returned, for the polls).
    fn new(describe: Describe) -> (BufferSink, Arc<Mutex<Buffer>>) {
        BufferSink::filling(describe, Vec::new(), Charge::default())
    }

    /// A sink filling a buffer that holds `events` already (charged for by `charge`), as a
    /// watcher taken back from a previous image's.
    pub(super) fn filling(
        describe: Describe,
        events: Vec<FilesystemEvent>,
        charge: Charge,
    ) -> (BufferSink, Arc<Mutex<Buffer>>) {
        let buffer = Arc::new(Mutex::new(Buffer {
            events,
            charge,
            error: None,
            expires: Instant::now() + IDLE_EXPIRY,
            expired: false,
        }));
        let sink = BufferSink {
            buffer: Arc::clone(&buffer),
            describe,
        };
        (sink, buffer)
    }
}

impl Sink for BufferSink {
    fn deliver(&mut self, change: &Change<'_>) -> bool {
        let event = self.describe.event(change);
        let mut buffer = lock(&self.buffer);
        // Its place in the buffer (which grows by doubling) and what it holds.
        let room = if buffer.events.len() == buffer.events.capacity() {
            buffer.events.capacity().max(4) * std::mem::size_of::<FilesystemEvent>()
        } else {
            0
        };
        let bytes = room + event.heap_bytes();
        let error = if buffer.events.len() >= MAX_EVENTS {
            Some(Error::new(
                Code::ResourceExhausted,
                format!(
                    "more than {MAX_EVENTS} events waited for GetWatcherEvents: events were \
                     lost; remove this watcher and create another"
                ),
            ))
        } else if buffer.charge.bytes() + bytes > MAX_BYTES {
            Some(Error::new(
                Code::ResourceExhausted,
                format!(
                    "more than {} KiB of events waited for GetWatcherEvents: events were \
                     lost; remove this watcher and create another",
                    MAX_BYTES >> 10
                ),
            ))
        } else if !buffer.charge.add(bytes) {
            Some(budget::exhausted())
        } else {
            None
        };
        if let Some(error) = error {
            buffer.events = Vec::new();
            buffer.charge.clear();
            buffer.error = Some(error);
            return false;
        }
        buffer.events.push(event);
        true
    }

    fn next_tick(&self) -> Option<Instant> {
        Some(lock(&self.buffer).expires)
    }

    fn tick(&mut self, now: Instant) -> bool {
        let mut buffer = lock(&self.buffer);
        if now < buffer.expires {
            return true;
        }
        buffer.expired = true;
        buffer.events = Vec::new();
        buffer.charge.clear();
        false
    }

    fn end(self: Box<Self>, ended: Ended) {
        let mut buffer = lock(&self.buffer);
        buffer.events = Vec::new();
        buffer.charge.clear();
        buffer.error = Some(ended_error(ended));
    }

    /// Carried to the next image (`carry`).
    fn upgrading(&mut self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::watch::Op;
    use std::path::Path;

    fn sink() -> (BufferSink, Arc<Mutex<Buffer>>) {
        BufferSink::new(Describe {
            include_entry: false,
            owners: Default::default(),
        })
    }

    fn change(name: &str) -> Change<'_> {
        Change {
            op: Op::Create,
            name: Path::new(name),
            path: Path::new(name),
        }
    }

    #[test]
    fn a_full_buffer_fails_the_watcher_with_an_error() {
        let (mut sink, buffer) = sink();
        for _ in 0..MAX_EVENTS {
            assert!(sink.deliver(&change("f")));
        }
        assert!(!sink.deliver(&change("one too many")));
        let buffer = lock(&buffer);
        assert!(buffer.events.is_empty());
        let error = buffer.error.as_ref().unwrap();
        assert_eq!(error.code, Code::ResourceExhausted);
        assert!(error.message.contains("10000"), "{}", error.message);
    }

    #[test]
    fn long_events_fill_the_buffer_in_bytes_before_in_count() {
        let (mut sink, buffer) = sink();
        let long = "n".repeat(4000);
        let mut delivered = 0;
        while sink.deliver(&change(&long)) {
            delivered += 1;
            assert!(delivered < MAX_EVENTS, "the byte bound never came");
        }
        // About MAX_BYTES / 4 KiB of them, then the watcher failed and gave its bytes back.
        assert!(delivered > MAX_BYTES / 8192, "{delivered}");
        let buffer = lock(&buffer);
        assert!(buffer.events.is_empty());
        assert_eq!(buffer.charge.bytes(), 0);
        let error = buffer.error.as_ref().unwrap();
        assert_eq!(error.code, Code::ResourceExhausted);
        assert!(error.message.contains("KiB"), "{}", error.message);
    }

    #[test]
    fn a_watcher_nobody_asks_expires_after_an_hour() {
        let (mut sink, buffer) = sink();
        let expires = lock(&buffer).expires;
        assert_eq!(sink.next_tick(), Some(expires));
        assert!(sink.tick(expires - Duration::from_secs(1)));
        sink.deliver(&change("f"));
        assert!(!sink.tick(expires));
        let buffer = lock(&buffer);
        assert!(buffer.expired && buffer.events.is_empty());
    }

    #[test]
    fn ids_are_long_random_and_distinct() {
        let (a, b) = (new_id().unwrap(), new_id().unwrap());
        assert_eq!(a.len(), 33);
        assert!(a.starts_with('w') && a[1..].bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
