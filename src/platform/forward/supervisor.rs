//! The supervisor: when to scan, and what a scan changes. It keeps the ports forwarded, binds
//! a listener on the forward address for each new one, and tells the relay to open or close
//! forwards ([`Command`]), waking it through an eventfd only when something changed.
//!
//! Scans come from two places, serialised by one lock: the HTTP layer's timekeeper, which
//! wakes once a second anyway ([`Supervisor::tick`]: an idle daemon wakes no more often with
//! the forwarder on), and, for [`FAST_WINDOW`] after a process is started through the API
//! ([`Supervisor::nudge`]), or for [`ACTIVITY_WINDOW`] after a started process wrote output
//! ([`Supervisor::activity`]: a server says so as it starts, even in a terminal opened an hour
//! ago), the forwarder's own thread every [`FAST_EVERY`], so a dev server is reachable within
//! that; with no process writing anything, the idle tick is all.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::relay::Command;
use super::scan::{self, Forwards, Scanner};
use crate::descriptors::Budget;
use crate::log;
use crate::sys::poll::EventFd;

/// How often the forwarder's thread scans after a nudge.
pub const FAST_EVERY: Duration = Duration::from_millis(50);
/// How long after a nudge it does.
pub const FAST_WINDOW: Duration = Duration::from_secs(60);
/// How long after a started process's output it does.
pub const ACTIVITY_WINDOW: Duration = Duration::from_secs(3);
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
    fast_until: Option<Instant>,
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

    /// A process was started: scan often for a while, starting now.
    pub fn nudge(&self) {
        self.lock().fast_until = Some(Instant::now() + FAST_WINDOW);
        let _ = self.wake.signal();
    }

    /// A started process wrote output: scan often until [`ACTIVITY_WINDOW`] from now, unless a
    /// longer window runs. The forwarder's thread is woken only when it was not scanning often.
    pub fn activity(&self) {
        let until = Instant::now() + ACTIVITY_WINDOW;
        let mut state = self.lock();
        match state.fast_until {
            Some(current) if current >= until => {}
            Some(_) => state.fast_until = Some(until),
            None => {
                state.fast_until = Some(until);
                drop(state);
                let _ = self.wake.signal();
            }
        }
    }

    /// For the forwarder's thread: scan if a fast scan is due; how long until the next one
    /// (`None`: none is planned, the timekeeper's tick does the scanning).
    pub fn fast_scan(&self) -> Option<Duration> {
        let mut state = self.lock();
        let now = Instant::now();
        if state.fast_until.is_none_or(|until| now >= until) {
            state.fast_until = None;
            return None;
        }
        let due = state.last_scan.map_or(now, |at| at + FAST_EVERY);
        if now >= due {
            self.scan(&mut state);
            return Some(FAST_EVERY);
        }
        Some(due - now)
    }

    fn scan(&self, state: &mut State) {
        if state.paused {
            return;
        }
        state.last_scan = Some(Instant::now());
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
    fn output_opens_a_short_fast_window_and_never_shortens_a_longer_one() {
        let quiet = supervisor();
        assert_eq!(quiet.lock().fast_until, None);
        quiet.activity();
        let until = quiet.lock().fast_until.expect("a fast window");
        assert!(until <= Instant::now() + ACTIVITY_WINDOW);
        assert!(until > Instant::now() + ACTIVITY_WINDOW / 2);

        let started = supervisor();
        started.nudge();
        let long = started.lock().fast_until;
        started.activity();
        assert_eq!(started.lock().fast_until, long, "the Start's minute stands");
    }
}
