//! The supervisor: when to scan, and what a scan changes. It keeps the ports forwarded, binds
//! a listener on the forward address for each new one, and tells the relay to open or close
//! forwards ([`Command`]), waking it through an eventfd only when something changed.
//!
//! Scans come from two places, serialised by one lock: the HTTP layer's timekeeper, which
//! wakes once a second anyway ([`Supervisor::tick`]: an idle daemon wakes no more often with
//! the forwarder on), and, in a short burst after a process is started through the API
//! ([`Supervisor::nudge`]) or after a started process wrote output
//! ([`Supervisor::activity`]: a server says so as it starts, even in a terminal opened an hour
//! ago), the forwarder's own thread ([`super::bursts`]: 50 ms after the hint, then ever less
//! often for 2 s), so a dev server is reachable within about 50 ms of announcing itself; with
//! no process started and none writing anything, the idle tick is all.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::bursts::Bursts;
use super::relay::Command;
use super::scan::{self, Forwards, Scanner};
use crate::descriptors::Budget;
use crate::log;
use crate::sys::poll::EventFd;

/// A timekeeper tick sooner than this after the last scan does not scan again (the
/// timekeeper ticks faster when a timeout option is short).
const TICK_MIN: Duration = Duration::from_millis(500);

/// The forwarder's settings (SPEC §12).
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub address: IpAddr,
    /// The daemon's own port, never forwarded.
    pub own_port: u16,
    pub max_ports: usize,
    /// Most connections through one port.
    pub max_connections: usize,
    /// The open-file budget: the forwarder's share of descriptors and its ceiling.
    pub budget: Budget,
}

pub struct Supervisor {
    settings: Settings,
    state: Mutex<State>,
    /// Commands for the relay, taken by its thread when [`Supervisor::wake`] fires.
    inbox: Mutex<Vec<Command>>,
    pub wake: EventFd,
    /// Connections open through the forwards, as the relay's thread last counted them.
    connections: AtomicUsize,
}

#[derive(Default)]
struct State {
    scanner: Option<Scanner>,
    /// The source the log last named (said again only when it changes).
    said_source: Option<String>,
    address_ready: bool,
    said_waiting: bool,
    failing: Option<String>,
    forwarded: Forwards,
    over_cap: Vec<u16>,
    /// Ports whose forward listener could not be bound (said once; retried each scan).
    bind_failed: Vec<u16>,
    last_scan: Option<Instant>,
    /// The forwarder thread's own scans.
    bursts: Bursts,
    /// A live upgrade is handing the forwards over: no scan changes them.
    paused: bool,
}

impl Supervisor {
    pub fn new(settings: Settings) -> io::Result<Supervisor> {
        Ok(Supervisor {
            settings,
            state: Mutex::new(State::default()),
            inbox: Mutex::new(Vec::new()),
            wake: EventFd::new()?,
            connections: AtomicUsize::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The commands waiting for the relay.
    pub fn take_commands(&self) -> Vec<Command> {
        std::mem::take(&mut *self.inbox.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// For the relay's thread, after each turn: how many connections are open.
    pub fn set_connections(&self, open: usize) {
        self.connections.store(open, Ordering::Relaxed);
    }

    /// The HTTP server is out of descriptors: asks the relay to give up a connection. False
    /// when none is open (as last counted).
    pub fn shed(&self) -> bool {
        if self.connections.load(Ordering::Relaxed) == 0 {
            return false;
        }
        self.queue(vec![Command::Shed]);
        true
    }

    fn queue(&self, commands: Vec<Command>) {
        self.inbox
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(commands);
        let _ = self.wake.signal();
    }

    /// Stops scanning (`true`: a live upgrade hands the forwards over; a scan under way
    /// finishes first, its commands queued) or starts again.
    pub fn pause(&self, paused: bool) {
        self.lock().paused = paused;
    }

    /// Starts from the forwards a previous image handed over (one per port), which the next
    /// scan reconciles with what listens now.
    pub fn adopt(&self, mut forwards: Forwards) {
        by_port(&mut forwards);
        self.lock().forwarded = forwards;
    }

    /// The timekeeper's tick: a scan unless one ran less than [`TICK_MIN`] ago.
    pub fn tick(&self) {
        let mut state = self.lock();
        if state.last_scan.is_none_or(|at| at.elapsed() >= TICK_MIN) {
            self.scan(&mut state);
        }
    }

    /// A process was started: a burst of scans, starting now.
    pub fn nudge(&self) {
        self.hint();
    }

    /// A started process wrote output: a burst of scans ([`super::bursts`]).
    pub fn activity(&self) {
        self.hint();
    }

    /// Plans the scans a hint brings; the forwarder's thread is woken only when that brings
    /// its next scan forward.
    fn hint(&self) {
        let mut state = self.lock();
        let before = state.bursts.due(state.last_scan);
        state.bursts.hint(Instant::now());
        let after = state.bursts.due(state.last_scan);
        drop(state);
        if before.is_none_or(|before| after.is_some_and(|after| after < before)) {
            let _ = self.wake.signal();
        }
    }

    /// For the forwarder's thread: scan if one of its scans is due; how long until the next
    /// (`None`: none is planned, the timekeeper's tick does the scanning).
    pub fn fast_scan(&self) -> Option<Duration> {
        let mut state = self.lock();
        if state.paused {
            return None;
        }
        let now = Instant::now();
        let due = state.bursts.due(state.last_scan)?;
        if due > now {
            return Some(due - now);
        }
        self.scan(&mut state);
        let next = state.bursts.due(state.last_scan)?;
        Some(next.saturating_duration_since(now))
    }

    fn scan(&self, state: &mut State) {
        if state.paused {
            return;
        }
        let now = Instant::now();
        state.last_scan = Some(now);
        let address = self.settings.address;
        if !state.address_ready {
            match TcpListener::bind(SocketAddr::new(address, 0)) {
                Ok(_) => {
                    state.address_ready = true;
                    log::line(format_args!("forwarding localhost ports on {address}"));
                }
                Err(e) => {
                    if !state.said_waiting {
                        state.said_waiting = true;
                        log::line(format_args!(
                            "forward address {address} is not usable ({e}): forwarding waits \
                             until it is on an interface"
                        ));
                    }
                    return;
                }
            }
        }
        let scanner = state.scanner.get_or_insert_with(Scanner::new);
        let source = scanner.source();
        if state.said_source.as_deref() != Some(source.as_str()) {
            log::line(format_args!(
                "forward: listing listening sockets from {source}"
            ));
            state.said_source = Some(source);
        }
        let listening = match scanner.listening() {
            Ok(found) => {
                if state.failing.take().is_some() {
                    log::line(format_args!("forward: scanning works again"));
                }
                found
            }
            Err(e) => {
                let message = e.to_string();
                if state.failing.as_deref() != Some(&message) {
                    log::line(format_args!("forward: cannot list listening sockets: {e}"));
                    state.failing = Some(message);
                }
                state.scanner = None;
                return;
            }
        };
        let plan = scan::plan(
            &listening,
            address,
            self.settings.own_port,
            &state.forwarded,
            self.settings.max_ports,
        );
        let mut commands = Vec::new();
        let mut closed = Vec::new();
        state.forwarded.retain(|&(port, upstream)| {
            if plan.forward.contains(&(port, upstream)) {
                return true;
            }
            log::line(format_args!(
                "forward {address}:{port} closed: nothing listens on {upstream} any more"
            ));
            commands.push(Command::Close { port });
            closed.push(port);
            false
        });
        state
            .bind_failed
            .retain(|port| scan::has(&plan.forward, *port));
        // Added after the loop: `forwarded` stays sorted for `scan::has` while it runs.
        let mut opened = Vec::new();
        for &(port, upstream) in &plan.forward {
            // A port closed by this scan (its server moved to the other family) keeps its old
            // listener until the relay drops it: bound again at the next scan.
            if scan::has(&state.forwarded, port) || closed.contains(&port) {
                continue;
            }
            match bind(SocketAddr::new(address, port)) {
                Ok(listener) => {
                    log::line(format_args!("forwarding {address}:{port} to {upstream}"));
                    state.bind_failed.retain(|p| *p != port);
                    opened.push((port, upstream));
                    commands.push(Command::Open { listener, upstream });
                }
                Err(e) => {
                    if !state.bind_failed.contains(&port) {
                        state.bind_failed.push(port);
                        log::line(format_args!("cannot forward {address}:{port}: {e}"));
                    }
                }
            }
        }
        state.forwarded.extend(opened);
        by_port(&mut state.forwarded);
        for port in plan.over_cap.iter().filter(|p| !state.over_cap.contains(p)) {
            log::line(format_args!(
                "not forwarding localhost:{port}: {} ports are forwarded, the cap",
                self.settings.max_ports
            ));
        }
        state.over_cap = plan.over_cap;
        if !commands.is_empty() {
            self.queue(commands);
        }
    }
}

/// Sorts forwards by port, as `scan::has` searches them.
fn by_port(forwards: &mut Forwards) {
    forwards.sort_unstable_by_key(|(port, _)| *port);
}

/// A forward listener: std's bind (with `SO_REUSEADDR`), then a backlog like a server's own
/// rather than std's 128, so a burst of clients is queued, not dropped to retry a second later.
fn bind(address: SocketAddr) -> io::Result<TcpListener> {
    let listener = TcpListener::bind(address)?;
    crate::sys::net::set_backlog(&listener, BACKLOG)?;
    Ok(listener)
}

/// The kernel caps it at `net.core.somaxconn` (4096 by default since Linux 5.4).
const BACKLOG: i32 = 4096;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::epoll::{Epoll, EDGE_IN};
    use std::os::fd::AsFd;

    fn supervisor() -> Supervisor {
        Supervisor::new(Settings {
            address: IpAddr::from([127, 0, 0, 2]),
            own_port: 1,
            max_ports: 4,
            max_connections: 4,
            budget: Budget::new(1024, 1),
        })
        .unwrap()
    }

    #[test]
    fn a_hint_wakes_the_forwarder_only_when_it_brings_a_scan_forward() {
        let supervisor = supervisor();
        let epoll = Epoll::new().unwrap();
        epoll.add(supervisor.wake.as_fd(), 1, EDGE_IN).unwrap();
        let mut events = Vec::new();
        supervisor.activity();
        epoll.wait(&mut events, Some(Duration::ZERO)).unwrap();
        assert_eq!(events.len(), 1, "the first hint wakes it");
        supervisor.wake.drain().unwrap();
        supervisor.activity();
        epoll.wait(&mut events, Some(Duration::ZERO)).unwrap();
        assert!(events.is_empty(), "a scan is due as soon already");
        assert!(supervisor.fast_scan().is_some(), "a burst is planned");
    }
}
