//! The processes the daemon started and has not finished with, by pid, and the exits it
//! still remembers for a late `Connect`.
//!
//! A process stays in the table from its spawn until its end has been told to its
//! subscribers: after its exit was reaped *and* its outputs reached end of file (envd waits
//! for both), or right after the exit when it was signalled or its deadline killed it (its
//! outputs are then read for what they hold, not waited for: a descendant in another process
//! group may keep them open). Its exit is then kept for [`RETAIN_FOR`] (at most
//! [`RETAIN_MAX`] exits), as envd does, so a `Connect` just after the end still learns it.
//!
//! Everything here is under the hub's lock, taken by workers (start, attach, input, signals)
//! and by the I/O thread; nothing under it waits.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::exit::Exit;
use super::spawn::{Config, OutputKind};
use super::Subscriber;

/// How long an ended process's exit is remembered (envd: 30 s).
pub const RETAIN_FOR: Duration = Duration::from_secs(30);
/// The most exits remembered at once.
pub const RETAIN_MAX: usize = 1024;
/// Input bytes a process may have waiting for it (written when its pipe has room).
pub const INPUT_MAX: usize = 1 << 20;
/// First wait before asking again for the exit of a process expected to end (its outputs
/// closed, or it was signalled); doubled up to [`REAP_RETRY_MAX`].
pub const REAP_RETRY_FIRST: Duration = Duration::from_millis(10);
pub const REAP_RETRY_MAX: Duration = Duration::from_secs(1);

/// How a request names a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    Pid(u32),
    Tag(String),
}

impl std::fmt::Display for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Selector::Pid(pid) => write!(f, "process with pid {pid}"),
            Selector::Tag(tag) => write!(f, "process with tag {tag}"),
        }
    }
}

/// One output stream of a process.
pub struct Output {
    pub kind: OutputKind,
    /// `None` once it reached end of file.
    pub file: Option<Arc<File>>,
}

/// One live process.
pub struct Process {
    pub pid: u32,
    pub tag: Option<String>,
    pub config: Config,
    pub outputs: Vec<Output>,
    /// The stdin pipe or the terminal's master; `None` without stdin or once closed.
    pub input: Option<Arc<File>>,
    /// Input accepted but not yet taken by the pipe, oldest first.
    pub pending_input: VecDeque<u8>,
    /// Close the stdin pipe once `pending_input` is written.
    pub close_input: bool,
    /// The terminal's master, for resizing; `None` for pipes.
    pub terminal: Option<Arc<File>>,
    pub subscribers: Vec<Box<dyn Subscriber>>,
    pub exit: Option<Exit>,
    /// Signalled (or killed at its deadline): end at the exit without waiting for the
    /// outputs' end of file.
    pub cut: bool,
    /// When to kill it (the `Start` call's deadline, as envd does).
    pub kill_at: Option<Instant>,
    /// Outputs closed but no exit yet: when to look again, and the next interval.
    pub reap_retry: Option<(Instant, Duration)>,
}

impl Process {
    pub fn outputs_open(&self) -> bool {
        self.outputs.iter().any(|o| o.file.is_some())
    }

    /// Ready to tell its end.
    pub fn finished(&self) -> bool {
        self.exit.is_some() && (self.cut || !self.outputs_open())
    }

    /// Its end is near (its outputs closed, or it was signalled): ask for its exit soon, and
    /// again until it comes, rather than only at `SIGCHLD`.
    pub fn expect_exit(&mut self, now: Instant) {
        if self.exit.is_none() && self.reap_retry.is_none() {
            self.reap_retry = Some((now + REAP_RETRY_FIRST, REAP_RETRY_FIRST));
        }
    }
}

/// A process's end, kept after it left the table.
#[derive(Debug, Clone)]
pub struct Retained {
    pub pid: u32,
    pub tag: Option<String>,
    pub exit: Exit,
    pub until: Instant,
}

/// The table.
#[derive(Default)]
pub struct Table {
    pub processes: BTreeMap<u32, Process>,
    retained: VecDeque<Retained>,
}

impl Table {
    /// The live process a selector names (by tag: the one with the lowest pid).
    pub fn find(&mut self, selector: &Selector) -> Option<&mut Process> {
        match selector {
            Selector::Pid(pid) => self.processes.get_mut(pid),
            Selector::Tag(tag) => self
                .processes
                .values_mut()
                .find(|p| p.tag.as_deref() == Some(tag.as_str())),
        }
    }

    /// The remembered end of a process a selector names, if it ended lately.
    pub fn retained(&mut self, selector: &Selector, now: Instant) -> Option<Retained> {
        self.forget_expired(now);
        self.retained
            .iter()
            .rev()
            .find(|r| match selector {
                Selector::Pid(pid) => r.pid == *pid,
                Selector::Tag(tag) => r.tag.as_deref() == Some(tag.as_str()),
            })
            .cloned()
    }

    /// Adds a new process; a remembered end under its pid or tag belongs to a predecessor and
    /// is forgotten.
    pub fn insert(&mut self, process: Process) {
        self.retained
            .retain(|r| r.pid != process.pid && (r.tag.is_none() || r.tag != process.tag));
        self.processes.insert(process.pid, process);
    }

    /// Takes a finished process out, remembering its end.
    pub fn remove(&mut self, pid: u32, now: Instant) -> Option<Process> {
        let process = self.processes.remove(&pid)?;
        if let Some(exit) = process.exit {
            self.forget_expired(now);
            if self.retained.len() >= RETAIN_MAX {
                self.retained.pop_front();
            }
            self.retained.push_back(Retained {
                pid,
                tag: process.tag.clone(),
                exit,
                until: now + RETAIN_FOR,
            });
        }
        Some(process)
    }

    fn forget_expired(&mut self, now: Instant) {
        while self.retained.front().is_some_and(|r| r.until <= now) {
            self.retained.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::process::WaitStatus;

    fn process(pid: u32, tag: Option<&str>) -> Process {
        Process {
            pid,
            tag: tag.map(str::to_string),
            config: Config::default(),
            outputs: Vec::new(),
            input: None,
            pending_input: VecDeque::new(),
            close_input: false,
            terminal: None,
            subscribers: Vec::new(),
            exit: Some(Exit(WaitStatus::Exited(0))),
            cut: false,
            kill_at: None,
            reap_retry: None,
        }
    }

    #[test]
    fn processes_are_found_by_pid_or_tag_and_remembered_after_their_end() {
        let mut table = Table::default();
        let now = Instant::now();
        table.insert(process(20, Some("web")));
        table.insert(process(10, Some("web")));
        assert_eq!(table.find(&Selector::Pid(20)).map(|p| p.pid), Some(20));
        assert_eq!(
            table.find(&Selector::Tag("web".into())).map(|p| p.pid),
            Some(10)
        );
        assert!(table.find(&Selector::Tag("db".into())).is_none());
        assert!(table.remove(10, now).is_some());
        assert!(table.find(&Selector::Pid(10)).is_none());
        let kept = table.retained(&Selector::Pid(10), now).unwrap();
        assert_eq!(kept.exit, Exit(WaitStatus::Exited(0)));
        assert!(table.retained(&Selector::Tag("web".into()), now).is_some());
        // Forgotten when the time is up, or when a new process takes the pid or the tag.
        assert!(table
            .retained(&Selector::Pid(10), now + RETAIN_FOR)
            .is_none());
        table.remove(20, now);
        table.insert(process(30, Some("web")));
        assert!(table.retained(&Selector::Pid(20), now).is_none());
    }

    #[test]
    fn at_most_retain_max_ends_are_remembered() {
        let mut table = Table::default();
        let now = Instant::now();
        for pid in 1..=u32::try_from(RETAIN_MAX).unwrap() + 1 {
            table.insert(process(pid, None));
            table.remove(pid, now);
        }
        assert!(table.retained(&Selector::Pid(1), now).is_none());
        assert!(table.retained(&Selector::Pid(2), now).is_some());
    }

    #[test]
    fn a_process_is_finished_at_its_exit_and_end_of_file_or_when_cut() {
        let mut p = process(1, None);
        p.exit = None;
        p.outputs.push(Output {
            kind: OutputKind::Stdout,
            file: Some(Arc::new(File::open("/dev/null").unwrap())),
        });
        assert!(!p.finished());
        p.exit = Some(Exit(WaitStatus::Exited(1)));
        assert!(!p.finished(), "output still open");
        p.cut = true;
        assert!(p.finished());
        p.cut = false;
        p.outputs[0].file = None;
        assert!(p.finished());
    }
}
