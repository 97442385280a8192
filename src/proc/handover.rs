//! The process table across a live upgrade (`crate::upgrade`): what one image writes down of
//! each process and remembered exit, and the new image's adoption of them.
//!
//! The processes are the daemon's children and stay so across the `execve` (same pid); their
//! pipes and terminal masters are carried as descriptors. So that no byte of output is lost or
//! told twice:
//!
//! - [`prepare`] stops the table under the hub's lock: from then on the I/O thread reads no
//!   output, writes no input, reaps nothing (an exit that comes meanwhile waits, unreaped, for
//!   the next image: its pid cannot be given to another process), and no worker changes the table
//!   (`ProcError::Upgrading`, `unavailable`). Every subscriber is ended
//!   ([`Abort::Upgrade`](super::Abort)) after the output it was already given, which its
//!   connection sends before the drain ends.
//! - The output written after that stays in the pipes. The next image holds it for a process that
//!   had subscribers ([`HOLD`]): nothing is read until a subscriber `Connect`s again, which then
//!   gets it all, then the end. A process nobody listened to is read (and its output dropped) as
//!   before, so it never blocks on a full pipe.
//! - Input accepted but not yet taken by the process, a deadline (as the time left), an exit
//!   reaped but not yet told, and the exits remembered for a late `Connect` cross too.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::spawn::{Config, OutputKind};
use super::table::{Output, Process, Retained, Table};
use super::{Abort, Exit, Hub, GLOBAL};
use crate::log;
use crate::sys::process::WaitStatus;
use crate::upgrade::carry::{Carry, Inherited};

/// How long the next image holds the output of a process that had subscribers for one of them
/// to come back. Past it the output is read (and dropped if still nobody listens), as for any
/// process without subscribers, so that it does not stay blocked on a full pipe.
pub const HOLD: Duration = Duration::from_secs(10);
/// The longest deadline or retention taken from a handover (a corrupt one cannot overflow).
const MAX_MILLIS: u64 = 10 * 365 * 24 * 3600 * 1000;

/// One live process, as the handover carries it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CarriedProcess {
    #[prost(uint32, tag = "1")]
    pub pid: u32,
    #[prost(string, optional, tag = "2")]
    pub tag: Option<String>,
    #[prost(string, tag = "3")]
    pub cmd: String,
    #[prost(string, repeated, tag = "4")]
    pub args: Vec<String>,
    #[prost(btree_map = "string, string", tag = "5")]
    pub envs: BTreeMap<String, String>,
    #[prost(string, optional, tag = "6")]
    pub cwd: Option<String>,
    /// Its outputs still open, in reading order.
    #[prost(message, repeated, tag = "7")]
    pub outputs: Vec<CarriedOutput>,
    /// The stdin pipe or the terminal's master (carried numbers).
    #[prost(int32, optional, tag = "8")]
    pub input_fd: Option<i32>,
    #[prost(int32, optional, tag = "9")]
    pub terminal_fd: Option<i32>,
    #[prost(bytes = "vec", tag = "10")]
    pub pending_input: Vec<u8>,
    #[prost(bool, tag = "11")]
    pub close_input: bool,
    /// Its exit, when reaped but not yet told (its outputs are held open by a descendant).
    #[prost(message, optional, tag = "12")]
    pub exit: Option<CarriedStatus>,
    #[prost(bool, tag = "13")]
    pub cut: bool,
    /// Milliseconds left before its deadline kills it.
    #[prost(uint64, optional, tag = "14")]
    pub kill_in_ms: Option<u64>,
    /// It had subscribers: milliseconds its output is still held for them ([`HOLD`] from the
    /// upgrade that ended them; what is left of it when no subscriber came back since).
    #[prost(uint64, optional, tag = "15")]
    pub hold_ms: Option<u64>,
}

/// One output: its kind (0 stdout, 1 stderr, 2 terminal) and carried number.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CarriedOutput {
    #[prost(uint32, tag = "1")]
    pub kind: u32,
    #[prost(int32, tag = "2")]
    pub fd: i32,
}

/// How a process ended: an exit code, or the signal that ended it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CarriedStatus {
    #[prost(sint32, optional, tag = "1")]
    pub code: Option<i32>,
    #[prost(int32, optional, tag = "2")]
    pub signal: Option<i32>,
    #[prost(bool, tag = "3")]
    pub core: bool,
}

/// One remembered exit.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CarriedExit {
    #[prost(uint32, tag = "1")]
    pub pid: u32,
    #[prost(string, optional, tag = "2")]
    pub tag: Option<String>,
    #[prost(message, optional, tag = "3")]
    pub status: Option<CarriedStatus>,
    /// Milliseconds it is still remembered.
    #[prost(uint64, tag = "4")]
    pub remaining_ms: u64,
}

/// How the adoption went, for `X-Envd-Handover`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Adopted {
    pub procs: usize,
    pub procs_failed: usize,
    pub retained: usize,
    pub retained_failed: usize,
}

/// Stops the table from changing, and ends every subscription (see the module's doc).
pub fn prepare() {
    if let Some(hub) = Hub::running() {
        hub.begin_upgrade();
    }
}

/// Serves on after a failed `execve`: the subscribers that were ended come back by `Connect`
/// and find the output waiting for them.
pub fn resume() {
    if let Some(hub) = Hub::running() {
        hub.end_upgrade();
    }
}

impl Hub {
    /// [`prepare`], for this hub.
    pub(super) fn begin_upgrade(&self) {
        let mut state = self.lock();
        state.upgrading = true;
        let now = Instant::now();
        for process in state.table.processes.values_mut() {
            // Whether it had subscribers is written down now: they are gone at export.
            if !process.subscribers.is_empty() {
                process.hold_until = Some(now + HOLD);
            }
            for subscriber in process.subscribers.drain(..) {
                subscriber.abort(Abort::Upgrade);
            }
        }
        drop(state);
        self.wake();
    }

    /// [`resume`], for this hub.
    pub(super) fn end_upgrade(&self) {
        self.lock().upgrading = false;
        self.wake();
    }
}

/// The table, written down; its descriptors into `carry`.
pub fn export(carry: &mut Carry) -> Result<(Vec<CarriedProcess>, Vec<CarriedExit>), String> {
    let Some(hub) = Hub::running() else {
        return Ok((Vec::new(), Vec::new()));
    };
    let mut state = hub.lock();
    let now = Instant::now();
    let mut processes = Vec::with_capacity(state.table.processes.len());
    for process in state.table.processes.values() {
        processes.push(
            carried_process(process, now, carry)
                .map_err(|e| format!("the descriptors of process {}: {e}", process.pid))?,
        );
    }
    let exits = state
        .table
        .remembered(now)
        .map(|retained| CarriedExit {
            pid: retained.pid,
            tag: retained.tag.clone(),
            status: Some(status_of(retained.exit)),
            remaining_ms: millis(retained.until.saturating_duration_since(now)),
        })
        .collect();
    Ok((processes, exits))
}

fn carried_process(
    process: &Process,
    now: Instant,
    carry: &mut Carry,
) -> std::io::Result<CarriedProcess> {
    let mut outputs = Vec::new();
    for output in &process.outputs {
        if let Some(file) = &output.file {
            outputs.push(CarriedOutput {
                kind: kind_number(output.kind),
                fd: carry.keep(file.as_fd())?,
            });
        }
    }
    let mut keep = |file: &Option<Arc<File>>| -> std::io::Result<Option<i32>> {
        file.as_ref().map(|f| carry.keep(f.as_fd())).transpose()
    };
    Ok(CarriedProcess {
        pid: process.pid,
        tag: process.tag.clone(),
        cmd: process.config.cmd.clone(),
        args: process.config.args.clone(),
        envs: process.config.envs.clone(),
        cwd: process.config.cwd.clone(),
        outputs,
        input_fd: keep(&process.input)?,
        terminal_fd: keep(&process.terminal)?,
        pending_input: process.pending_input.iter().copied().collect(),
        close_input: process.close_input,
        exit: process.exit.map(status_of),
        cut: process.cut,
        kill_in_ms: process
            .kill_at
            .map(|at| millis(at.saturating_duration_since(now))),
        hold_ms: process
            .held(now)
            .then(|| {
                process
                    .hold_until
                    .map(|until| millis(until.saturating_duration_since(now)))
            })
            .flatten(),
    })
}

/// Takes the table back: the daemon's hub, started with it. Then every child is reaped once:
/// an exit that came during the swap finds its process.
pub fn adopt(
    processes: &[CarriedProcess],
    exits: &[CarriedExit],
    inherited: &mut Inherited,
) -> Adopted {
    let mut adopted = Adopted::default();
    let mut table = Table::default();
    let now = Instant::now();
    for exit in exits {
        adopted.retained += 1;
        match remembered(exit, now) {
            Some(retained) => table.remember(retained),
            None => {
                adopted.retained_failed += 1;
                log::line(format_args!(
                    "upgrade: a remembered exit of pid {} is malformed",
                    exit.pid
                ));
            }
        }
    }
    for carried in processes {
        adopted.procs += 1;
        if !is_our_child(carried.pid) {
            // Never signal or wait for a pid that is not ours: a handover that names one is
            // not taken at its word (the process ended and was reaped before the swap only if
            // the handover lied; its descriptors, if any, are closed with the rest).
            adopted.procs_failed += 1;
            log::line(format_args!(
                "upgrade: process {} is not a child of this daemon; not taken back",
                carried.pid
            ));
            continue;
        }
        let (process, complete) = adopt_process(carried, now, inherited);
        if !complete {
            adopted.procs_failed += 1;
            log::line(format_args!(
                "upgrade: process {} came back without all of its descriptors",
                carried.pid
            ));
        }
        if let Some(process) = process {
            table.insert(process);
        }
    }
    if adopted.procs > 0 || adopted.retained > 0 {
        let mut global = GLOBAL.lock().unwrap_or_else(|e| e.into_inner());
        match Hub::start_with(table) {
            Ok(hub) => *global = Some(hub),
            Err(error) => {
                log::line(format_args!(
                    "upgrade: cannot start the process thread: {error}; the carried processes \
                     are not taken back"
                ));
                adopted.procs_failed = adopted.procs;
                adopted.retained_failed = adopted.retained;
            }
        }
    }
    super::reaper::reap_all();
    adopted
}

/// A carried process back in the table (`None`: nothing of it can be used), and whether every
/// descriptor it named came back.
fn adopt_process(
    carried: &CarriedProcess,
    now: Instant,
    inherited: &mut Inherited,
) -> (Option<Process>, bool) {
    if carried.pid == 0 || libc::pid_t::try_from(carried.pid).is_err() {
        return (None, false);
    }
    let mut files: BTreeMap<i32, Arc<File>> = BTreeMap::new();
    let mut complete = true;
    let mut file = |number: i32| -> Option<Arc<File>> {
        if let Some(file) = files.get(&number) {
            return Some(Arc::clone(file));
        }
        let Some(fd) = inherited.take(number) else {
            complete = false;
            return None;
        };
        let file = Arc::new(File::from(fd));
        files.insert(number, Arc::clone(&file));
        Some(file)
    };
    let mut outputs = Vec::new();
    for output in &carried.outputs {
        let Some(kind) = kind_of(output.kind) else {
            continue;
        };
        if let Some(file) = file(output.fd) {
            outputs.push(Output {
                kind,
                file: Some(file),
                rest_until: None,
            });
        }
    }
    let input = carried.input_fd.and_then(&mut file);
    let terminal = carried.terminal_fd.and_then(&mut file);
    let complete = complete && outputs.len() == carried.outputs.len();
    let exit = carried.exit.as_ref().and_then(exit_of);
    let process = Process {
        pid: carried.pid,
        tag: carried.tag.clone(),
        config: Config {
            cmd: carried.cmd.clone(),
            args: carried.args.clone(),
            envs: carried.envs.clone(),
            cwd: carried.cwd.clone(),
        },
        outputs,
        input,
        pending_input: VecDeque::from(carried.pending_input.clone()),
        close_input: carried.close_input,
        terminal,
        subscribers: Vec::new(),
        exit,
        cut: carried.cut,
        kill_at: carried
            .kill_in_ms
            .map(|ms| now + Duration::from_millis(ms.min(MAX_MILLIS))),
        reap_retry: None,
        hold_until: carried
            .hold_ms
            .map(|ms| now + Duration::from_millis(ms).min(HOLD)),
    };
    (Some(process), complete)
}

/// Whether `pid` is a child of this process (reaped or not), per `/proc/<pid>/stat`'s parent.
fn is_our_child(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The command name may hold spaces and parentheses: the fields follow its last ')'.
    let parent = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
        .and_then(|field| field.parse::<u32>().ok());
    parent == Some(std::process::id())
}

fn remembered(exit: &CarriedExit, now: Instant) -> Option<Retained> {
    Some(Retained {
        pid: exit.pid,
        tag: exit.tag.clone(),
        exit: exit_of(exit.status.as_ref()?)?,
        until: now + Duration::from_millis(exit.remaining_ms.min(MAX_MILLIS)),
    })
}

fn kind_number(kind: OutputKind) -> u32 {
    match kind {
        OutputKind::Stdout => 0,
        OutputKind::Stderr => 1,
        OutputKind::Pty => 2,
    }
}

fn kind_of(number: u32) -> Option<OutputKind> {
    match number {
        0 => Some(OutputKind::Stdout),
        1 => Some(OutputKind::Stderr),
        2 => Some(OutputKind::Pty),
        _ => None,
    }
}

fn status_of(exit: Exit) -> CarriedStatus {
    match exit.0 {
        WaitStatus::Exited(code) => CarriedStatus {
            code: Some(code),
            ..CarriedStatus::default()
        },
        WaitStatus::Signaled { signal, core } => CarriedStatus {
            code: None,
            signal: Some(signal),
            core,
        },
    }
}

fn exit_of(status: &CarriedStatus) -> Option<Exit> {
    match (status.code, status.signal) {
        (Some(code), None) => Some(Exit(WaitStatus::Exited(code))),
        (None, Some(signal)) if (1..=64).contains(&signal) => Some(Exit(WaitStatus::Signaled {
            signal,
            core: status.core,
        })),
        _ => None,
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn statuses_round_trip_and_malformed_ones_are_refused() {
        for exit in [
            Exit(WaitStatus::Exited(0)),
            Exit(WaitStatus::Exited(-1)),
            Exit(WaitStatus::Signaled {
                signal: 9,
                core: false,
            }),
            Exit(WaitStatus::Signaled {
                signal: 11,
                core: true,
            }),
        ] {
            let bytes = status_of(exit).encode_to_vec();
            let back = CarriedStatus::decode(bytes.as_slice()).unwrap();
            assert_eq!(exit_of(&back).map(|e| e.0), Some(exit.0));
        }
        for (code, signal) in [
            (None, None),
            (Some(1), Some(9)),
            (None, Some(0)),
            (None, Some(65)),
        ] {
            let status = CarriedStatus {
                code,
                signal,
                core: false,
            };
            assert!(exit_of(&status).is_none(), "{status:?}");
        }
    }

    #[test]
    fn an_adopted_process_without_its_descriptors_is_failed_but_kept_for_its_exit() {
        let carried = CarriedProcess {
            pid: 4242,
            tag: Some("web".into()),
            cmd: "/bin/sh".into(),
            args: vec!["-c".into(), "sleep 1".into()],
            outputs: vec![
                CarriedOutput { kind: 0, fd: 1000 },
                CarriedOutput { kind: 1, fd: 1001 },
            ],
            kill_in_ms: Some(u64::MAX),
            hold_ms: Some(u64::MAX),
            ..CarriedProcess::default()
        };
        let now = Instant::now();
        let (process, complete) = adopt_process(&carried, now, &mut Inherited::default());
        assert!(!complete);
        let process = process.unwrap();
        assert_eq!(process.pid, 4242);
        assert_eq!(process.tag.as_deref(), Some("web"));
        assert_eq!(process.config.args, ["-c", "sleep 1"]);
        assert!(process.outputs.is_empty());
        assert!(process.kill_at.unwrap() <= now + Duration::from_millis(MAX_MILLIS));
        assert!(process.held(now));
        assert_eq!(
            process.hold_until,
            Some(now + HOLD),
            "at most the whole hold"
        );
        let bad_pid = CarriedProcess {
            pid: u32::MAX,
            ..carried
        };
        assert!(adopt_process(&bad_pid, now, &mut Inherited::default())
            .0
            .is_none());
    }

    #[test]
    fn only_a_child_of_this_process_is_ours() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert!(is_our_child(child.id()));
        assert!(!is_our_child(1));
        assert!(!is_our_child(std::process::id()));
        assert!(!is_our_child(u32::MAX));
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_remembered_exit_keeps_its_pid_tag_and_time_left() {
        let now = Instant::now();
        let exit = CarriedExit {
            pid: 77,
            tag: Some("job".into()),
            status: Some(status_of(Exit(WaitStatus::Exited(3)))),
            remaining_ms: 1500,
        };
        let bytes = exit.encode_to_vec();
        let retained = remembered(&CarriedExit::decode(bytes.as_slice()).unwrap(), now).unwrap();
        assert_eq!((retained.pid, retained.tag.as_deref()), (77, Some("job")));
        assert_eq!(retained.exit.code(), 3);
        assert_eq!(retained.until, now + Duration::from_millis(1500));
        let no_status = CarriedExit {
            status: None,
            ..exit
        };
        assert!(remembered(&no_status, now).is_none());
    }
}
