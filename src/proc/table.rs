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
//! **Identity.** A pid names a process only until the process is reaped; after that the kernel
//! may give it to another. A process whose exit was reaped can still be listed (a descendant
//! holds its outputs open), so entries are keyed by pid *and* a generation given at insertion
//! ([`Key`]): a new process that gets the pid of a listed one is a second entry, and the old
//! one still ends with its own end event. A request by pid finds the one not yet reaped (at
//! most one: an unreaped pid cannot be reused), else the newest; an exit handed over by the
//! reaper goes to the unreaped one.
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

/// A table entry's identity: its pid, and the generation that tells apart two processes the
/// kernel gave the same pid (ordered by pid first, so the table lists by pid).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    pub pid: u32,
    pub generation: u64,
}

/// One output stream of a process.
pub struct Output {
    pub kind: OutputKind,
    /// `None` once it reached end of file.
    pub file: Option<Arc<File>>,
    /// After a read that emptied it, not polled again before this (see `io::REST`).
    pub rest_until: Option<Instant>,
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
    /// Adopted across a live upgrade while it had subscribers: until a subscriber comes back
    /// (or this moment passes), its output waits unread for it, and its end is not told.
    pub hold_until: Option<Instant>,
}

impl Process {
    pub fn outputs_open(&self) -> bool {
        self.outputs.iter().any(|o| o.file.is_some())
    }

    /// Ready to tell its end.
    pub fn finished(&self) -> bool {
        self.exit.is_some() && (self.cut || !self.outputs_open())
    }

    /// Its output waits for a returning subscriber (`hold_until`), unless a client signalled
    /// it (or its deadline killed it): then its end is told at once, as for any other.
    pub fn held(&self, now: Instant) -> bool {
        self.subscribers.is_empty() && !self.cut && self.hold_until.is_some_and(|until| until > now)
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
    pub processes: BTreeMap<Key, Process>,
    retained: VecDeque<Retained>,
    /// The generation of the next entry.
    next_generation: u64,
}

impl Table {
    /// The live process a selector names: by pid, the one not yet reaped, else the newest; by
    /// tag, the one with the lowest pid.
    pub fn find(&mut self, selector: &Selector) -> Option<&mut Process> {
        let key = self.find_key(selector)?;
        self.processes.get_mut(&key)
    }

    fn find_key(&self, selector: &Selector) -> Option<Key> {
        match selector {
            Selector::Pid(pid) => {
                let newest = self.with_pid(*pid).next_back()?;
                let unreaped = self.with_pid(*pid).find(|(_, p)| p.exit.is_none());
                Some(*unreaped.unwrap_or(newest).0)
            }
            Selector::Tag(tag) => self
                .processes
                .iter()
                .find(|(_, p)| p.tag.as_deref() == Some(tag.as_str()))
                .map(|(key, _)| *key),
        }
    }

    fn with_pid(&self, pid: u32) -> std::collections::btree_map::Range<'_, Key, Process> {
        let first = Key { pid, generation: 0 };
        let last = Key {
            pid,
            generation: u64::MAX,
        };
        self.processes.range(first..=last)
    }

    /// The reaper saw `pid` exit: the exit goes to the entry with that pid not yet reaped (an
    /// older entry with the pid was reaped before, so the exit cannot be its). False when no
    /// entry waits for it (an orphan's).
    pub fn exited(&mut self, pid: u32, exit: Exit) -> bool {
        let Some(key) = self
            .with_pid(pid)
            .find(|(_, p)| p.exit.is_none())
            .map(|(key, _)| *key)
        else {
            return false;
        };
        if let Some(process) = self.processes.get_mut(&key) {
            process.exit = Some(exit);
            process.reap_retry = None;
        }
        true
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

    /// Adds a new process under a key of its own (a listed process with the same pid stays,
    /// see the module's doc); a remembered end under its pid or tag belongs to a predecessor
    /// and is forgotten.
    pub fn insert(&mut self, process: Process) -> Key {
        self.retained
            .retain(|r| r.pid != process.pid && (r.tag.is_none() || r.tag != process.tag));
        let key = Key {
            pid: process.pid,
            generation: self.next_generation,
        };
        self.next_generation += 1;
        self.processes.insert(key, process);
        key
    }

    /// Takes a finished process out, remembering its end.
    pub fn remove(&mut self, key: Key, now: Instant) -> Option<Process> {
        let pid = key.pid;
        let process = self.processes.remove(&key)?;
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

    /// The exits remembered now, oldest first.
    pub fn remembered(&mut self, now: Instant) -> impl Iterator<Item = &Retained> {
        self.forget_expired(now);
        self.retained.iter()
    }

    /// Remembers an exit a previous image remembered (oldest first, as listed).
    pub fn remember(&mut self, retained: Retained) {
        if self.retained.len() >= RETAIN_MAX {
            self.retained.pop_front();
        }
        self.retained.push_back(retained);
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
            hold_until: None,
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
        let key = |pid| *table.processes.keys().find(|k| k.pid == pid).unwrap();
        let (ten, twenty) = (key(10), key(20));
        assert!(table.remove(ten, now).is_some());
        assert!(table.find(&Selector::Pid(10)).is_none());
        let kept = table.retained(&Selector::Pid(10), now).unwrap();
        assert_eq!(kept.exit, Exit(WaitStatus::Exited(0)));
        assert!(table.retained(&Selector::Tag("web".into()), now).is_some());
        // Forgotten when the time is up, or when a new process takes the pid or the tag.
        assert!(table
            .retained(&Selector::Pid(10), now + RETAIN_FOR)
            .is_none());
        table.remove(twenty, now);
        table.insert(process(30, Some("web")));
        assert!(table.retained(&Selector::Pid(20), now).is_none());
    }

    #[test]
    fn a_reused_pid_is_a_second_entry_and_requests_find_the_unreaped_one() {
        let mut table = Table::default();
        let now = Instant::now();
        // Reaped, but listed: a descendant holds its output open.
        let mut old = process(10, Some("old"));
        old.exit = Some(Exit(WaitStatus::Exited(3)));
        let old_key = table.insert(old);
        // The kernel gives pid 10 to a new process.
        let mut new = process(10, Some("new"));
        new.exit = None;
        let new_key = table.insert(new);
        assert_ne!(old_key, new_key);
        assert_eq!(table.processes.len(), 2, "the old entry is not replaced");
        let found = table.find(&Selector::Pid(10)).unwrap();
        assert_eq!(found.tag.as_deref(), Some("new"), "the unreaped one");
        // The reaper's exit for pid 10 is the new one's: the old one was reaped before.
        assert!(table.exited(10, Exit(WaitStatus::Exited(7))));
        assert_eq!(
            table.processes[&old_key].exit,
            Some(Exit(WaitStatus::Exited(3)))
        );
        assert_eq!(
            table.processes[&new_key].exit,
            Some(Exit(WaitStatus::Exited(7)))
        );
        assert!(!table.exited(10, Exit(WaitStatus::Exited(0))), "none waits");
        assert!(!table.exited(11, Exit(WaitStatus::Exited(0))), "an orphan");
        // Both reaped: by pid, the newest.
        assert_eq!(
            table.find(&Selector::Pid(10)).unwrap().tag.as_deref(),
            Some("new")
        );
        // Each leaves with its own end.
        let old = table.remove(old_key, now).unwrap();
        assert_eq!(old.exit, Some(Exit(WaitStatus::Exited(3))));
        assert_eq!(
            table.find(&Selector::Pid(10)).unwrap().tag.as_deref(),
            Some("new")
        );
        assert!(table.remove(new_key, now).is_some());
        assert!(table.find(&Selector::Pid(10)).is_none());
    }

    #[test]
    fn at_most_retain_max_ends_are_remembered() {
        let mut table = Table::default();
        let now = Instant::now();
        for pid in 1..=u32::try_from(RETAIN_MAX).unwrap() + 1 {
            let key = table.insert(process(pid, None));
            table.remove(key, now);
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
            rest_until: None,
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
