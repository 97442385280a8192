//! Localhost port forwarding (SPEC §12): a server inside the sandbox listening only on
//! `127.0.0.1` or `::1` is made reachable on the forward address, at the same port.
//!
//! - [`scan`]: which sockets listen (`sock_diag`), and which ports to forward (pure).
//! - [`proc_net`]: which sockets listen, from `/proc/net/tcp{,6}` where `sock_diag` cannot say.
//! - [`supervisor`]: when to scan, binding the forward listeners, telling the relay.
//! - [`bursts`]: when the forwarder's own thread scans, after a hint.
//! - [`relay`]: the forwarder's thread: its listeners and every forwarded connection, in one
//!   epoll, bytes both ways without a thread or an HTTP worker per connection.
//!
//! - [`handover`]: the forwards across a live upgrade (listeners and open connections).
//!
//! One forwarder per daemon, started by [`start`] once the daemon listens (with what a
//! previous image handed over, if any); the HTTP layer's timekeeper calls [`tick`], the
//! process service [`nudge`], and the HTTP layer's accept, out of descriptors, [`shed`]. Its
//! descriptors come from its share of the open-file limit ([`crate::descriptors`]).

pub mod bursts;
pub mod handover;
pub mod proc_net;
pub mod relay;
pub mod scan;
pub mod supervisor;

use std::os::fd::AsFd;
use std::sync::{Arc, OnceLock};

pub use supervisor::Settings;
use supervisor::Supervisor;

use crate::log;

static RUNNING: OnceLock<Arc<Supervisor>> = OnceLock::new();

/// Starts the forwarder's thread; a failure is logged and leaves forwarding off (the daemon
/// serves on without it).
pub fn start(settings: Settings) {
    let started = Supervisor::new(settings).and_then(|supervisor| {
        let share = relay::share::Share::new(&settings.budget);
        let mut relay = relay::Relay::new(settings.max_connections, share)?;
        relay.watch_wake(supervisor.wake.as_fd())?;
        if let Some(adopted) = handover::take_adopted() {
            supervisor.adopt(relay.take_over(adopted, settings.address));
        }
        let supervisor = Arc::new(supervisor);
        let own = Arc::clone(&supervisor);
        std::thread::Builder::new()
            .name("forward".into())
            .stack_size(128 << 10)
            .spawn(move || run(&own, relay))?;
        Ok(supervisor)
    });
    match started {
        Ok(supervisor) => {
            let budget = settings.budget;
            log::line(format_args!(
                "forwarding takes at most {} descriptors (half the open-file limit of {}), none \
                 numbered {} or above: {} are kept for the HTTP server",
                budget.forward_share,
                budget.limit,
                budget.forward_ceiling(),
                budget.reserve
            ));
            // The first scan at once rather than at the first tick.
            supervisor.nudge();
            let _ = RUNNING.set(supervisor);
        }
        Err(e) => log::line(format_args!("port forwarding is off: cannot start it: {e}")),
    }
}

fn run(supervisor: &Supervisor, mut relay: relay::Relay) {
    let mut timeout = None;
    loop {
        if relay.turn(timeout) {
            let _ = supervisor.wake.drain();
            for command in supervisor.take_commands() {
                relay.apply(command);
            }
        }
        supervisor.set_connections(relay.connections());
        // A scan from the timekeeper queues commands too: the eventfd says so.
        timeout = supervisor.fast_scan();
        for command in supervisor.take_commands() {
            relay.apply(command);
        }
        // A live upgrade parks the relay here, every connection's state whole. The supervisor
        // stopped scanning before the relay was asked: what it queued is applied first.
        if handover::asked() {
            for command in supervisor.take_commands() {
                relay.apply(command);
            }
            relay = handover::park(relay);
        }
    }
}

/// The forwarder, once started.
fn running() -> Option<&'static Supervisor> {
    RUNNING.get().map(|supervisor| &**supervisor)
}

/// The timekeeper's tick: the idle-time scan.
pub fn tick() {
    if let Some(supervisor) = running() {
        supervisor.tick();
    }
}

/// A process was started through the API: it may be about to listen.
pub fn nudge() {
    if let Some(supervisor) = running() {
        supervisor.nudge();
    }
}

/// The HTTP server is out of descriptors: a forwarded connection is given up (by the
/// forwarder's thread, a moment later). False when forwarding is off or holds none.
pub fn shed() -> bool {
    running().is_some_and(Supervisor::shed)
}

/// A started process wrote output (a server announcing itself): it may be about to listen.
pub fn activity() {
    if let Some(supervisor) = running() {
        supervisor.activity();
    }
}
