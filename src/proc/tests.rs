//! The hub against real children: output and exits, input, signals, deadlines, terminals, a
//! subscriber that holds output back. Each test has a hub of its own; nothing here reaps any
//! child but its own (the I/O thread asks for one pid's exit when its outputs close).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;
use crate::sys::process::WaitStatus;

/// What a subscriber saw.
#[derive(Default)]
struct Seen {
    /// Output events told.
    events: usize,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    pty: Vec<u8>,
    exit: Option<Exit>,
    aborted: bool,
}

/// Collects what it is told; `ready` follows a switch the test holds.
struct Collector {
    seen: Arc<Mutex<Seen>>,
    open: Arc<AtomicBool>,
    waiting: Arc<Mutex<Option<Wake>>>,
}

impl Subscriber for Collector {
    fn ready(&mut self, wake: &Wake) -> bool {
        if self.open.load(Ordering::SeqCst) {
            return true;
        }
        *self.waiting.lock().unwrap() = Some(wake.clone());
        false
    }
    fn output(&mut self, kind: OutputKind, bytes: &[u8]) -> bool {
        let mut seen = self.seen.lock().unwrap();
        seen.events += 1;
        match kind {
            OutputKind::Stdout => seen.stdout.extend_from_slice(bytes),
            OutputKind::Stderr => seen.stderr.extend_from_slice(bytes),
            OutputKind::Pty => seen.pty.extend_from_slice(bytes),
        }
        true
    }
    fn next_tick(&self) -> Option<Instant> {
        None
    }
    fn tick(&mut self, _now: Instant) -> bool {
        true
    }
    fn end(self: Box<Self>, exit: Exit) {
        self.seen.lock().unwrap().exit = Some(exit);
    }
    fn abort(self: Box<Self>, _why: Abort) {
        self.seen.lock().unwrap().aborted = true;
    }
}

struct Watcher {
    seen: Arc<Mutex<Seen>>,
    open: Arc<AtomicBool>,
    waiting: Arc<Mutex<Option<Wake>>>,
}

impl Watcher {
    fn new() -> Watcher {
        Watcher {
            seen: Arc::default(),
            open: Arc::new(AtomicBool::new(true)),
            waiting: Arc::default(),
        }
    }

    fn subscriber(&self) -> Box<dyn Subscriber> {
        Box::new(Collector {
            seen: Arc::clone(&self.seen),
            open: Arc::clone(&self.open),
            waiting: Arc::clone(&self.waiting),
        })
    }

    fn exit(&self) -> Exit {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(exit) = self.seen.lock().unwrap().exit {
                return exit;
            }
            assert!(Instant::now() < deadline, "no end within 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn until(&self, what: impl Fn(&Seen) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !what(&self.seen.lock().unwrap()) {
            assert!(Instant::now() < deadline, "not seen within 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn spec(cmd: &str, args: &[&str]) -> Spec {
    Spec {
        config: Config {
            cmd: cmd.to_string(),
            args: args.iter().map(|a| a.to_string()).collect(),
            envs: BTreeMap::new(),
            cwd: None,
        },
        env: BTreeMap::from([("PATH".to_string(), spawn::DEFAULT_PATH.to_string())]),
        cwd: "/".into(),
        credentials: None,
        terminal: None,
        stdin: false,
        tag: None,
        cgroup: None,
    }
}

fn hub() -> Hub {
    Hub::start_thread().unwrap()
}

#[test]
fn output_is_told_per_stream_then_the_exit() {
    let hub = hub();
    let watcher = Watcher::new();
    let spec = spec("sh", &["-c", "echo out; echo err >&2; printf more; exit 3"]);
    let pid = hub.start(&spec, None, |_| watcher.subscriber()).unwrap();
    assert_eq!(watcher.exit(), Exit(WaitStatus::Exited(3)));
    let seen = watcher.seen.lock().unwrap();
    assert_eq!(seen.stdout, b"out\nmore");
    assert_eq!(seen.stderr, b"err\n");
    assert!(hub.list().is_empty(), "gone from the table");
    drop(seen);
    // Remembered for a late attach.
    let late = Watcher::new();
    let collector = Collector {
        seen: Arc::clone(&late.seen),
        open: Arc::clone(&late.open),
        waiting: Arc::clone(&late.waiting),
    };
    let Ok(Attached::Ended(ended, exit, _)) = hub.attach(&Selector::Pid(pid), collector, |_, _| {})
    else {
        panic!("the end is remembered");
    };
    assert_eq!((ended, exit), (pid, Exit(WaitStatus::Exited(3))));
}

#[test]
fn a_stream_of_small_writes_is_told_as_a_few_large_events_and_output_after_a_pause_at_once() {
    let hub = hub();
    let watcher = Watcher::new();
    // 4,000 writes of 10 bytes (a few µs apart), then a pause, then one more.
    let script = "dd if=/dev/zero bs=10 count=4000 2>/dev/null; sleep 0.5; printf late; sleep 2";
    let started = Instant::now();
    hub.start(&spec("sh", &["-c", script]), None, |_| watcher.subscriber())
        .unwrap();
    watcher.until(|seen| seen.stdout.len() == 40_000);
    let burst = Instant::now();
    let events = watcher.seen.lock().unwrap().events;
    // Read once per millisecond at most (`io::REST`), not once per write: the writes take
    // milliseconds, not thousands of them.
    let limit = 10 + 2 * burst.duration_since(started).as_millis();
    assert!(
        (events as u128) < limit.min(1000),
        "{events} events for 4,000 writes in {:?}",
        burst.duration_since(started)
    );
    // After the pause: at once, not held back.
    watcher.until(|seen| seen.stdout.ends_with(b"late"));
    let late = burst.elapsed();
    assert!(
        late < Duration::from_millis(1500),
        "told {late:?} after the burst"
    );
    assert_eq!(watcher.seen.lock().unwrap().events, events + 1);
}

#[test]
fn a_missing_program_is_a_spawn_error() {
    let hub = hub();
    let watcher = Watcher::new();
    let error = hub
        .start(&spec("/nonexistent/program", &[]), None, |_| {
            watcher.subscriber()
        })
        .unwrap_err();
    assert!(
        matches!(&error, ProcError::Spawn(e) if e.raw_os_error() == Some(libc::ENOENT)),
        "{error:?}"
    );
    assert!(hub.list().is_empty());
}

#[test]
fn input_reaches_stdin_and_closing_it_ends_cat() {
    let hub = hub();
    let watcher = Watcher::new();
    let mut spec = spec("cat", &[]);
    spec.stdin = true;
    spec.tag = Some("cat".into());
    let pid = hub.start(&spec, None, |_| watcher.subscriber()).unwrap();
    let by_tag = Selector::Tag("cat".into());
    hub.write_input(&by_tag, b"hello ", false).unwrap();
    // More than a pipe holds: the rest waits in the table and goes as cat reads.
    let big = vec![b'x'; 300_000];
    hub.write_input(&Selector::Pid(pid), &big, false).unwrap();
    assert!(matches!(
        hub.write_input(&by_tag, b"x", true),
        Err(ProcError::WrongInput { to_terminal: true })
    ));
    let listed = hub.list();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].pid, listed[0].tag.as_deref()),
        (pid, Some("cat"))
    );
    hub.close_stdin(&by_tag).unwrap();
    assert!(matches!(
        hub.write_input(&by_tag, b"late", false),
        Err(ProcError::NoStdin)
    ));
    assert_eq!(watcher.exit(), Exit(WaitStatus::Exited(0)));
    let seen = watcher.seen.lock().unwrap();
    assert_eq!(seen.stdout.len(), 6 + big.len());
    assert!(seen.stdout.starts_with(b"hello xxx"));
    drop(seen);
    assert!(matches!(
        hub.close_stdin(&Selector::Pid(pid)),
        Err(ProcError::NotFound(_))
    ));
}

#[test]
fn a_killed_group_ends_at_its_exit_even_with_its_output_held_elsewhere() {
    let hub = hub();
    let watcher = Watcher::new();
    // The grandchild leaves the group (setsid) but keeps stdout open.
    let spec = spec(
        "sh",
        &["-c", "setsid sleep 5 & echo started; exec sleep 10"],
    );
    let pid = hub.start(&spec, None, |_| watcher.subscriber()).unwrap();
    watcher.until(|seen| seen.stdout == b"started\n");
    let started = Instant::now();
    hub.signal(&Selector::Pid(pid), libc::SIGKILL).unwrap();
    let exit = watcher.exit();
    assert_eq!(exit.status(), "signal: killed");
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[test]
fn the_deadline_kills_the_process() {
    let hub = hub();
    let watcher = Watcher::new();
    let started = Instant::now();
    hub.start(
        &spec("sleep", &["10"]),
        Some(Duration::from_millis(100)),
        |_| watcher.subscriber(),
    )
    .unwrap();
    assert_eq!(watcher.exit().status(), "signal: killed");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_subscriber_without_room_holds_the_output_back_and_loses_none() {
    let hub = hub();
    let watcher = Watcher::new();
    watcher.open.store(false, Ordering::SeqCst);
    let spec = spec("head", &["-c", "3000000", "/dev/zero"]);
    let pid = hub.start(&spec, None, |_| watcher.subscriber()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(watcher.seen.lock().unwrap().stdout.is_empty());
    assert_eq!(hub.list().len(), 1, "head waits for its pipe: {pid}");
    watcher.open.store(true, Ordering::SeqCst);
    watcher.waiting.lock().unwrap().take().unwrap().wake();
    assert_eq!(watcher.exit(), Exit(WaitStatus::Exited(0)));
    assert_eq!(watcher.seen.lock().unwrap().stdout.len(), 3_000_000);
}

#[test]
fn a_terminal_session_has_a_tty_of_its_size() {
    if !std::path::Path::new("/dev/ptmx").exists() {
        return;
    }
    let hub = hub();
    let watcher = Watcher::new();
    let mut spec = spec("sh", &[]);
    spec.terminal = Some(WindowSize { rows: 24, cols: 80 });
    let pid = hub.start(&spec, None, |_| watcher.subscriber()).unwrap();
    let terminal = Selector::Pid(pid);
    hub.write_input(&terminal, b"stty size; tty\n", true)
        .unwrap();
    watcher.until(|seen| String::from_utf8_lossy(&seen.pty).contains("/dev/pts/"));
    assert!(String::from_utf8_lossy(&watcher.seen.lock().unwrap().pty).contains("24 80"));
    hub.resize(
        &terminal,
        WindowSize {
            rows: 50,
            cols: 132,
        },
    )
    .unwrap();
    hub.write_input(&terminal, b"stty size; exit 7\n", true)
        .unwrap();
    assert_eq!(watcher.exit(), Exit(WaitStatus::Exited(7)));
    assert!(String::from_utf8_lossy(&watcher.seen.lock().unwrap().pty).contains("50 132"));
    assert!(matches!(
        hub.close_stdin(&terminal),
        Err(ProcError::NotFound(_))
    ));
}

#[test]
fn shutdown_terms_every_group_and_refuses_new_processes() {
    let hub = hub();
    let watcher = Watcher::new();
    hub.start(&spec("sleep", &["10"]), None, |_| watcher.subscriber())
        .unwrap();
    hub.shutdown();
    assert_eq!(watcher.exit().status(), "signal: terminated");
    assert!(matches!(
        hub.start(&spec("true", &[]), None, |_| watcher.subscriber()),
        Err(ProcError::ShuttingDown)
    ));
}

/// An entry for a process that exited and was reaped (with `exit`) but is still listed: a
/// descendant holds its output, the socket whose other end is returned. Its pid is `pid`, which
/// the kernel may since have given to another process.
fn listed_after_reap(
    hub: &Hub,
    pid: u32,
    exit: Exit,
    watcher: &Watcher,
) -> std::os::unix::net::UnixStream {
    let (ours, held) = std::os::unix::net::UnixStream::pair().unwrap();
    let output = std::fs::File::from(std::os::fd::OwnedFd::from(ours));
    crate::sys::poll::set_nonblocking(output.as_fd()).unwrap();
    hub.lock().table.insert(Process {
        pid,
        tag: None,
        config: Config::default(),
        outputs: vec![Output {
            kind: OutputKind::Stdout,
            file: Some(Arc::new(output)),
            rest_until: None,
        }],
        input: None,
        pending_input: Default::default(),
        close_input: false,
        terminal: None,
        subscribers: vec![watcher.subscriber()],
        exit: Some(exit),
        cut: false,
        kill_at: None,
        reap_retry: None,
        hold_until: None,
    });
    hub.wake();
    held
}

/// How `pid`, a child of this test, ended (waiting at most 10 s).
fn wait_child(pid: u32) -> WaitStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = sysproc::wait_pid(pid).unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "child {pid} did not exit");
        std::thread::sleep(Duration::from_millis(5));
    }
}

// Forced pid reuse: the listed, reaped entry is given the pid of an unrelated live process,
// leader of its own group, as if the kernel had reused the pid.
#[allow(clippy::zombie_processes)] // reaped by `wait_child`
#[test]
fn a_reaped_process_is_never_signalled_even_when_its_pid_is_anothers() {
    use std::os::unix::process::CommandExt;
    let hub = hub();
    let unrelated = std::process::Command::new("sleep")
        .arg("30")
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = unrelated.id();
    let watcher = Watcher::new();
    let _held = listed_after_reap(&hub, pid, Exit(WaitStatus::Exited(3)), &watcher);
    hub.signal(&Selector::Pid(pid), libc::SIGKILL).unwrap();
    // Its end is told at once, with the exit it had.
    assert_eq!(watcher.exit(), Exit(WaitStatus::Exited(3)));
    assert!(hub.list().is_empty());
    // The unrelated process got nothing: SIGTERM, sent now, is what ends it. (A SIGKILL sent
    // before would have decided its end when it was sent.)
    sysproc::kill(pid, libc::SIGTERM).unwrap();
    assert_eq!(
        wait_child(pid),
        WaitStatus::Signaled {
            signal: libc::SIGTERM,
            core: false
        }
    );
}

#[test]
fn a_new_process_with_a_listed_pid_leaves_the_old_entry_its_own_end() {
    let hub = hub();
    let live = Watcher::new();
    let pid = hub
        .start(&spec("sleep", &["30"]), None, |_| live.subscriber())
        .unwrap();
    // A predecessor with the same pid, reaped but still listed.
    let old = Watcher::new();
    let held = listed_after_reap(&hub, pid, Exit(WaitStatus::Exited(3)), &old);
    let pids: Vec<u32> = hub.list().iter().map(|p| p.pid).collect();
    assert_eq!(pids, [pid, pid], "two entries, neither replaced");
    // By pid, the unreaped one is signalled; the old one is not ended by it.
    hub.signal(&Selector::Pid(pid), libc::SIGTERM).unwrap();
    assert_eq!(live.exit().status(), "signal: terminated");
    assert_eq!(hub.list().len(), 1);
    assert!(old.seen.lock().unwrap().exit.is_none());
    // Its output reaches end of file: the old entry ends with its own exit.
    drop(held);
    assert_eq!(old.exit(), Exit(WaitStatus::Exited(3)));
    assert!(hub.list().is_empty());
}

#[test]
fn an_upgrade_stops_the_table_ends_subscribers_and_holds_output_for_the_next_one() {
    let hub = hub();
    let watcher = Watcher::new();
    let spec = spec("sh", &["-c", "echo one; read line; echo two; exit 4"]);
    let spec = Spec {
        stdin: true,
        ..spec
    };
    let pid = hub.start(&spec, None, |_| watcher.subscriber()).unwrap();
    watcher.until(|seen| seen.stdout == b"one\n");
    hub.begin_upgrade();
    assert!(watcher.seen.lock().unwrap().aborted);
    // Nothing changes the table meanwhile.
    let other = Watcher::new();
    let refused = hub.start(&spec, None, |_| other.subscriber()).unwrap_err();
    assert!(matches!(refused, ProcError::Upgrading), "{refused}");
    let input = hub.write_input(&Selector::Pid(pid), b"go\n", false);
    assert!(matches!(input, Err(ProcError::Upgrading)));
    let signal = hub.signal(&Selector::Pid(pid), libc::SIGKILL);
    assert!(matches!(signal, Err(ProcError::Upgrading)));
    // The upgrade fails: the table serves on, and the output written meanwhile waits for the
    // subscriber that comes back.
    hub.end_upgrade();
    hub.write_input(&Selector::Pid(pid), b"go\n", false)
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(hub.list().len(), 1, "held: not ended while nobody listens");
    let back = Watcher::new();
    let collector = Collector {
        seen: Arc::clone(&back.seen),
        open: Arc::clone(&back.open),
        waiting: Arc::clone(&back.waiting),
    };
    let attached = hub.attach(&Selector::Pid(pid), collector, |_, _| {});
    assert!(matches!(attached, Ok(Attached::Live)));
    assert_eq!(back.exit(), Exit(WaitStatus::Exited(4)));
    assert_eq!(back.seen.lock().unwrap().stdout, b"two\n");
}
