//! envd's log exporter (`internal/logs/exporter/`): every log line, as JSON with the sandbox's
//! `instanceID` and `envID` added, POSTed to the logs collector the metadata service names in
//! `address`.
//!
//! On only where the metadata service is (`--mmds-address`, or envd's name): [`start`] at
//! start-up, [`set_target`] whenever the service answers. Lines are queued from the start,
//! before the collector is known, in one queue bounded at [`MAX_QUEUED`] bytes that drops its
//! oldest lines when the collector is slow or down (envd's bound and rule); a line over
//! [`MAX_LINE`] is dropped at once (a collector such as Loki refuses it anyway); the bound
//! counts each line's bytes plus [`LINE_OVERHEAD`] for its allocation, and the lines being sent
//! ([`BATCH`] at most, taken off the queue) come on top. Queuing is a copy and a short lock: a
//! request never waits for the collector. One thread, at nice [`NICE`] so that it yields the
//! CPU to the workers under load (the queue sheds lines then), sends: each line in a `POST` of
//! its own (`application/json`, as envd's), on a new connection, within [`TIMEOUT`]; a failed
//! send drops that line and is reported on stderr at most once a minute (with how many failed
//! meanwhile), never exported itself. The collector's host must be an IP address (envd's is the
//! host's address on the sandbox's link): resolving names would put a DNS resolver in the
//! binary for no caller.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::platform::http_client;

/// Bytes of lines waiting for the collector, at most (envd's `maxBufferedBytes`).
pub const MAX_QUEUED: usize = 8 << 20;
/// The longest line exported (envd's `maxLogLineBytes`, under Loki's 256 KiB line limit).
pub const MAX_LINE: usize = 192 << 10;
/// One `POST`, connect to answer (envd's `ExporterTimeout`).
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// What a queued line costs beyond its bytes (its `Vec` and allocator header), counted in the
/// bound.
pub const LINE_OVERHEAD: usize = 48;
/// Lines taken off the queue at once to be sent.
pub const BATCH: usize = 64;
/// The sender's nice value: the lowest priority.
const NICE: i32 = 19;
/// Failures are reported at most this often.
const REPORT_EVERY: Duration = Duration::from_secs(60);
/// The collector's answer, at most.
const MAX_ANSWER: usize = 64 << 10;

/// Where lines go: the collector's address and the identity added to each line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    address: SocketAddr,
    path: String,
    /// `,"instanceID":"…","envID":"…"` (the sandbox's, JSON-escaped).
    identity: String,
}

#[derive(Default)]
struct Queue {
    lines: VecDeque<Vec<u8>>,
    bytes: usize,
    /// Lines dropped for room or size since the last report.
    dropped: u64,
    target: Option<Target>,
    /// The address last named, so a bad one is said once, not at every read of the service.
    named: String,
}

struct Exporter {
    queue: Mutex<Queue>,
    wake: Condvar,
}

static EXPORTER: OnceLock<Exporter> = OnceLock::new();

fn exporter_queue(exporter: &Exporter) -> MutexGuard<'_, Queue> {
    exporter.queue.lock().unwrap_or_else(|e| e.into_inner())
}

/// Turns exporting on: lines are queued from now on, and a thread sends them once a target
/// is set. Once per process.
pub fn start() {
    let mut started = false;
    EXPORTER.get_or_init(|| {
        started = true;
        Exporter {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
        }
    });
    if started {
        let spawned = std::thread::Builder::new()
            .name("log-export".into())
            .spawn(send_forever);
        if let Err(error) = spawned {
            super::local_line(format_args!(
                "log exporter: cannot start its thread: {error}"
            ));
        }
    }
}

/// Whether lines are being queued.
pub fn is_on() -> bool {
    EXPORTER.get().is_some()
}

/// The collector the metadata service named (`address`, `http://host[:port][/path]`) and the
/// sandbox's identity; `""` (or exporting off): lines stay queued (bounded) until one is named.
pub fn set_target(address: &str, instance_id: &str, env_id: &str) {
    let Some(exporter) = EXPORTER.get() else {
        return;
    };
    let repeated = {
        let mut queue = exporter_queue(exporter);
        std::mem::replace(&mut queue.named, address.to_string()) == address
    };
    let target = if address.is_empty() {
        None
    } else {
        match parse_address(address) {
            Ok((address, path)) => Some(Target {
                address,
                path,
                identity: identity(instance_id, env_id),
            }),
            Err(reason) => {
                if !repeated {
                    super::local_line(format_args!(
                        "log exporter: ignoring the collector address '{address}': {reason}"
                    ));
                }
                None
            }
        }
    };
    let mut queue = exporter_queue(exporter);
    if queue.target != target {
        queue.target = target;
        exporter.wake.notify_one();
    }
}

/// Queues a copy of one JSON line (no newline), dropping the oldest for room.
pub(super) fn push(line: &[u8]) {
    let Some(exporter) = EXPORTER.get() else {
        return;
    };
    let mut queue = exporter_queue(exporter);
    if line.len() > MAX_LINE {
        queue.dropped += 1;
        return;
    }
    make_room(&mut queue, line.len() + LINE_OVERHEAD);
    let was_empty = queue.lines.is_empty();
    queue.bytes += line.len() + LINE_OVERHEAD;
    queue.lines.push_back(line.to_vec());
    // The sender waits only on an empty queue (or for a target, which `set_target` wakes it
    // for): a wake per line would be a futex call per request.
    if was_empty {
        exporter.wake.notify_one();
    }
}

/// The lines waiting to be sent, taken for a live upgrade's handover (`crate::upgrade`):
/// the next image sends them. A batch being sent at that moment is not among them.
pub fn take_queued() -> Vec<Vec<u8>> {
    let Some(exporter) = EXPORTER.get() else {
        return Vec::new();
    };
    let mut queue = exporter_queue(exporter);
    queue.bytes = 0;
    queue.lines.drain(..).collect()
}

/// Puts back, before the lines queued since this image started, those a previous image
/// handed over; within the same bound (the oldest dropped for room).
pub fn requeue(lines: Vec<Vec<u8>>) {
    let Some(exporter) = EXPORTER.get() else {
        return;
    };
    let mut queue = exporter_queue(exporter);
    for line in lines.into_iter().rev() {
        if line.len() > MAX_LINE || queue.bytes + line.len() + LINE_OVERHEAD > MAX_QUEUED {
            queue.dropped += 1;
            continue;
        }
        queue.bytes += line.len() + LINE_OVERHEAD;
        queue.lines.push_front(line);
    }
    exporter.wake.notify_one();
}

fn make_room(queue: &mut Queue, wanted: usize) {
    while queue.bytes + wanted > MAX_QUEUED {
        let Some(oldest) = queue.lines.pop_front() else {
            break;
        };
        queue.bytes -= oldest.len() + LINE_OVERHEAD;
        queue.dropped += 1;
    }
}

/// The sender's loop: waits for lines and a target, takes every queued line, sends each.
fn send_forever() {
    let Some(exporter) = EXPORTER.get() else {
        return;
    };
    if let Err(error) = crate::sys::priority::set_thread_nice(NICE) {
        super::local_line(format_args!(
            "log exporter: cannot lower its priority: {error}"
        ));
    }
    let mut failures: u64 = 0;
    let mut last_report: Option<Instant> = None;
    loop {
        let (lines, target, dropped) = {
            let mut queue = exporter_queue(exporter);
            while queue.lines.is_empty() || queue.target.is_none() {
                queue = exporter.wake.wait(queue).unwrap_or_else(|e| e.into_inner());
            }
            let taken = queue.lines.len().min(BATCH);
            let lines: Vec<Vec<u8>> = queue.lines.drain(..taken).collect();
            queue.bytes -= lines.iter().map(|l| l.len() + LINE_OVERHEAD).sum::<usize>();
            let dropped = std::mem::take(&mut queue.dropped);
            (lines, queue.target.clone(), dropped)
        };
        let Some(target) = target else { continue };
        let mut last_error = None;
        for line in lines {
            if let Err(error) = send(&target, &line) {
                failures += 1;
                last_error = Some(error);
            }
        }
        let due = last_report.is_none_or(|at| at.elapsed() >= REPORT_EVERY);
        if let (Some(error), true) = (last_error, due) {
            super::local_line(format_args!(
                "log exporter: cannot send to http://{}{}: {error} ({failures} lines not \
                 sent, {dropped} dropped for room, since the last report)",
                target.address, target.path
            ));
            failures = 0;
            last_report = Some(Instant::now());
        }
    }
}

/// One line in one `POST`; any 2xx is success.
fn send(target: &Target, line: &[u8]) -> Result<(), String> {
    let body = with_identity(line, &target.identity);
    let mut request = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        target.path,
        target.address,
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);
    match http_client::exchange(target.address, TIMEOUT, &request, MAX_ANSWER)? {
        (200..=299, _) => Ok(()),
        (status, _) => Err(format!("the collector answered {status}")),
    }
}

/// `line` (a JSON object) with the identity's fields added after its `{`.
fn with_identity(line: &[u8], identity: &str) -> Vec<u8> {
    let mut body = Vec::with_capacity(line.len() + identity.len());
    match line.split_first() {
        Some((b'{', rest)) => {
            body.push(b'{');
            body.extend_from_slice(&identity.as_bytes()[1..]);
            if rest.first() != Some(&b'}') {
                body.push(b',');
            }
            body.extend_from_slice(rest);
        }
        _ => body.extend_from_slice(line),
    }
    body
}

fn identity(instance_id: &str, env_id: &str) -> String {
    let quote = |text: &str| serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into());
    format!(
        ",\"instanceID\":{},\"envID\":{}",
        quote(instance_id),
        quote(env_id)
    )
}

/// `http://<IP>[:port][/path]` (IPv6 in brackets) into the socket address (port 80 by
/// default) and the path (`/` by default). Only `http`, and only an IP address: see the module.
pub(crate) fn parse_address(address: &str) -> Result<(SocketAddr, String), String> {
    let rest = address
        .strip_prefix("http://")
        .ok_or("only http:// addresses are supported")?;
    let (authority, path) = match rest.find(['/', '?']) {
        Some(at) if rest.as_bytes()[at] == b'/' => (&rest[..at], &rest[at..]),
        Some(at) => (&rest[..at], "/"),
        None => (rest, "/"),
    };
    if path.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        return Err("the path has spaces or control characters".into());
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or("an unclosed '[' in the host")?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let ip: IpAddr = host
        .parse()
        .map_err(|_| format!("the host '{host}' is not an IP address"))?;
    let port = match port {
        None => 80,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or("the port is not a number from 1 to 65535")?,
    };
    Ok((SocketAddr::new(ip, port), path.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collector_addresses_are_parsed() {
        let parsed = |a: &str| parse_address(a);
        let at = |a: &str, path: &str| Ok((a.parse().unwrap(), path.to_string()));
        assert_eq!(parsed("http://10.0.0.1:30006"), at("10.0.0.1:30006", "/"));
        assert_eq!(
            parsed("http://10.0.0.1/in?x=1"),
            at("10.0.0.1:80", "/in?x=1")
        );
        assert_eq!(parsed("http://[fd00::1]:9/p"), at("[fd00::1]:9", "/p"));
        assert_eq!(parsed("http://10.0.0.1?q"), at("10.0.0.1:80", "/"));
        assert_eq!(
            parsed("http://logs.local/in"),
            Err("the host 'logs.local' is not an IP address".into())
        );
        for bad in [
            "https://10.0.0.1",
            "10.0.0.1:80",
            "http://",
            "http://:80",
            "http://10.0.0.1:0",
            "http://10.0.0.1:99999",
            "http://u@10.0.0.1",
            "http://10.0.0.1/a b",
            "http://[::1",
        ] {
            assert!(parsed(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_identity_goes_first_in_each_line() {
        let identity = identity("isb\"1", "tpl");
        assert_eq!(
            with_identity(br#"{"level":"info"}"#, &identity),
            br#"{"instanceID":"isb\"1","envID":"tpl","level":"info"}"#.to_vec()
        );
        assert_eq!(
            with_identity(b"{}", &identity),
            br#"{"instanceID":"isb\"1","envID":"tpl"}"#.to_vec()
        );
    }

    #[test]
    fn the_queue_drops_its_oldest_lines_for_room() {
        let mut queue = Queue::default();
        let line = vec![b'x'; MAX_QUEUED / 4 - LINE_OVERHEAD];
        for _ in 0..4 {
            make_room(&mut queue, line.len() + LINE_OVERHEAD);
            queue.bytes += line.len() + LINE_OVERHEAD;
            queue.lines.push_back(line.clone());
        }
        assert_eq!((queue.lines.len(), queue.dropped), (4, 0));
        make_room(&mut queue, 10);
        assert_eq!((queue.lines.len(), queue.dropped), (3, 1));
        assert_eq!(queue.bytes, 3 * MAX_QUEUED / 4);
    }
}
