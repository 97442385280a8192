//! The forwards across a live upgrade (`crate::upgrade`): what one image writes down of each
//! forwarded port and each connection relayed through it, and the hooks the upgrade calls.
//!
//! - [`prepare`] parks the forwarder: the supervisor stops scanning (a scan under way ends
//!   first), then the relay thread applies the commands queued and stops between two turns,
//!   where every connection's state is whole (what was read and not yet written is in its
//!   pipe or its pending bytes). Its listeners keep their backlog meanwhile: a client
//!   connecting during the upgrade waits, it is not refused. [`resume`] undoes it.
//! - [`export`] writes down every forward listener and every connection (both sockets, each
//!   direction's pipe with the bytes in it and its ends of stream); the relay's own code
//!   (`relay::carried`) does the work on the parked relay.
//! - [`adopt`] (the new image) takes the descriptors back and checks each one; the forwarder
//!   started next (`forward::start`) serves them instead of binding anew, and its first scan
//!   reconciles them with what listens now.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::relay::{Relay, Restored};
use crate::log;
use crate::upgrade::carry::{Carry, Inherited};

/// One forwarded port: its listener on the forward address and the connections it accepted.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CarriedForward {
    /// The port, the same on the forward address and on the loopback.
    #[prost(uint32, tag = "1")]
    pub port: u32,
    /// The listener's descriptor number; absent when it could not be carried (the next scan
    /// of the new image binds it again).
    #[prost(int32, optional, tag = "2")]
    pub listener_fd: Option<i32>,
    /// Where its connections go: `127.0.0.1:port` or `[::1]:port` (the family is its form).
    #[prost(string, tag = "3")]
    pub upstream: String,
    #[prost(message, repeated, tag = "4")]
    pub connections: Vec<CarriedConnection>,
}

/// One relayed connection.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CarriedConnection {
    #[prost(int32, tag = "1")]
    pub client_fd: i32,
    #[prost(int32, tag = "2")]
    pub upstream_fd: i32,
    /// The connection to the upstream was made (not still under way).
    #[prost(bool, tag = "3")]
    pub connected: bool,
    /// Client to upstream, then upstream to client.
    #[prost(message, repeated, tag = "4")]
    pub flows: Vec<CarriedFlow>,
}

/// One direction of a connection: the bytes read and not yet written, and how it ended.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CarriedFlow {
    /// Its pipe's read and write ends, or nothing. The bytes in it are the pipe's own count,
    /// read back from the kernel (`FIONREAD`): nothing written down can disagree with it.
    #[prost(int32, repeated, tag = "1")]
    pub pipe: Vec<i32>,
    /// Bytes not in a pipe (only when no pipe could be made for them), at most 128 KiB.
    #[prost(bytes = "vec", tag = "2")]
    pub pending: Vec<u8>,
    /// The source ended; the end was passed on.
    #[prost(bool, tag = "3")]
    pub eof: bool,
    #[prost(bool, tag = "4")]
    pub shut: bool,
}

/// How the adoption went (logged: envd's `X-Envd-Handover` has no field for forwards).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Adopted {
    pub listeners: usize,
    pub listeners_failed: usize,
    pub connections: usize,
    pub connections_failed: usize,
}

/// The relay, parked for a handover by its own thread.
struct Park {
    slot: Mutex<Option<Relay>>,
    changed: Condvar,
    asked: AtomicBool,
}

static PARK: Park = Park {
    slot: Mutex::new(None),
    changed: Condvar::new(),
    asked: AtomicBool::new(false),
};
/// What [`adopt`] took back, for `forward::start`.
static ADOPTED: Mutex<Option<Restored>> = Mutex::new(None);
/// How long [`prepare`] waits for the relay to finish its turn.
const PARK_WAIT: Duration = Duration::from_secs(5);

fn slot() -> MutexGuard<'static, Option<Relay>> {
    PARK.slot.lock().unwrap_or_else(|e| e.into_inner())
}

/// Stops the forwarder changing anything: no scan, no byte moved, nothing accepted.
pub fn prepare() {
    let Some(supervisor) = super::running() else {
        return;
    };
    supervisor.pause(true);
    let mut parked = slot();
    PARK.asked.store(true, Ordering::SeqCst);
    let _ = supervisor.wake.signal();
    let deadline = Instant::now() + PARK_WAIT;
    while parked.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            log::line(format_args!(
                "upgrade: the forwarder did not stop within {PARK_WAIT:?}: its listeners and \
                 connections are not carried over"
            ));
            return;
        }
        parked = PARK
            .changed
            .wait_timeout(parked, left)
            .map_or_else(|e| e.into_inner().0, |(guard, _)| guard);
    }
}

/// Whether a handover asks the relay to park.
pub(super) fn asked() -> bool {
    PARK.asked.load(Ordering::SeqCst)
}

/// The forwarder's thread, between turns: parks `relay` while the handover asks it to, and
/// has it back when the upgrade failed.
pub(super) fn park(relay: Relay) -> Relay {
    let mut parked = slot();
    *parked = Some(relay);
    PARK.changed.notify_all();
    loop {
        parked = PARK
            .changed
            .wait_while(parked, |_| PARK.asked.load(Ordering::SeqCst))
            .unwrap_or_else(|e| e.into_inner());
        if let Some(relay) = parked.take() {
            return relay;
        }
    }
}

/// The parked relay's forwards and connections, their descriptors kept in `carry`.
pub fn export(carry: &mut Carry) -> Vec<CarriedForward> {
    slot()
        .as_mut()
        .map(|relay| relay.export(carry))
        .unwrap_or_default()
}

/// The `execve` failed: the relay moves bytes again and the supervisor scans.
pub fn resume() {
    let parked = slot();
    PARK.asked.store(false, Ordering::SeqCst);
    PARK.changed.notify_all();
    drop(parked);
    if let Some(supervisor) = super::running() {
        supervisor.pause(false);
    }
}

/// The new image takes back the forwards a previous one carried, for the forwarder to start
/// with.
pub fn adopt(forwards: &[CarriedForward], inherited: &mut Inherited) -> Adopted {
    let (restored, adopted) = Restored::from_handover(forwards, inherited);
    if forwards.is_empty() {
        return adopted;
    }
    log::line(format_args!(
        "upgrade: forwards: took back {} of {} listeners and {} of {} connections",
        adopted.listeners,
        adopted.listeners + adopted.listeners_failed,
        adopted.connections,
        adopted.connections + adopted.connections_failed
    ));
    *ADOPTED.lock().unwrap_or_else(|e| e.into_inner()) = Some(restored);
    adopted
}

/// What [`adopt`] took back, once.
pub(super) fn take_adopted() -> Option<Restored> {
    ADOPTED.lock().unwrap_or_else(|e| e.into_inner()).take()
}
