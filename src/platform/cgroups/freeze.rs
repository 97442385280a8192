//! `/freeze` and `/unfreeze` over the process cgroups (envd's `WorkloadFreezer`, `freeze.go`):
//! the sweep, the wait until the kernel reports the groups frozen, the thaw, the watchdog, and
//! the gate that keeps a `Start` from spawning into a frozen group.
//!
//! - **Sweep.** `legacy` (the default) writes `cgroup.freeze` = 1 in `user` and `ptys`.
//!   `hierarchy` freezes those two first, then walks the `--process-cgroups` directory (by
//!   default the whole mount, as envd's) breadth first, at most `maxCgroups` visited (default
//!   512, at most 8192), and freezes every cgroup the resume does not need: not envd's liveness
//!   allowlist, not the daemon's chain nor an ancestor of an entry (`super::hierarchy`). Without
//!   the daemon's own cgroup known, the sweep is `legacy` (envd's fallback).
//! - **The guest's own freezes.** Before the first sweep of a freeze, every cgroup below the
//!   directory whose `cgroup.freeze` already reads 1 (`docker pause`), less what the resume
//!   needs, is recorded: the sweep
//!   does not write it (`preFrozen`) and the thaw leaves it frozen.
//! - **Wait.** With a budget (`maxWaitMs`), the `cgroup.events` of each written group is read
//!   until it says `frozen 1`; between reads the freezer sleeps in `poll(POLLPRI)`, which the
//!   kernel wakes when the file changes (envd polls every 2 ms), at most 10 ms at a time.
//! - **Audit.** `/init`'s thaw of this image's `hierarchy` freeze is preceded, under the same
//!   lock, by the resume audit (`super::audit`), whose counts ride that `/init`'s answer.
//! - **Thaw** (`/unfreeze`, `/init`, the watchdog): every cgroup below the directory whose
//!   `cgroup.freeze` reads 1, less the guest's, gets 0 (at most 8192 visited). With no freeze
//!   of this daemon's in effect, only `user` and `ptys` are looked at: the directory may be the
//!   machine's whole hierarchy, where another tool's freeze is none of the daemon's business.
//! - **Lock.** One freeze or thaw at a time: `/freeze` and `/unfreeze` answer 503 while another
//!   holds it; `/init` and the watchdog wait for it.
//! - **Gate.** From the sweep until the thaw, a `Start` into `user` or `ptys` is refused
//!   (`unavailable`): envd's child would freeze before `exec` and its `Start` would hang until
//!   the thaw, holding a worker here. A `Start` in progress finishes before the sweep begins.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, TryLockError, Weak};
use std::time::{Duration, Instant};

use super::audit::{self, Audit};
use super::hierarchy::{self, walk, Visit};
use super::{events, write_property, Cgroups, Group, Groups};
use crate::platform::watchdog::Watchdog;
use crate::sys::poll::{poll_ready, Interest};

/// envd's `DefaultFreezeMaxCgroups`.
pub const DEFAULT_MAX_CGROUPS: usize = 512;
/// envd's `DefaultThawMaxCgroups`: the thaw's bound, and the freeze's ceiling.
pub const THAW_MAX_CGROUPS: usize = 8192;
/// Longest sleep between two reads of `cgroup.events` when no change wakes the freezer.
const POLL_CAP: Duration = Duration::from_millis(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Legacy,
    Hierarchy,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Legacy => "legacy",
            Mode::Hierarchy => "hierarchy",
        }
    }
}

pub struct Options {
    /// Zero: no wait.
    pub max_wait: Duration,
    pub mode: Mode,
    /// Zero: [`DEFAULT_MAX_CGROUPS`]; clamped to [`THAW_MAX_CGROUPS`].
    pub max_cgroups: usize,
}

/// envd's `FreezeResult`; [`FreezeResult::to_json`] names the fields as its OpenAPI does.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct FreezeResult {
    pub mode: &'static str,
    pub visited: usize,
    pub allowlisted: usize,
    pub truncated: bool,
    pub pre_frozen: usize,
    pub requested: usize,
    pub frozen: usize,
    pub not_frozen: usize,
    pub failed: usize,
    pub unobservable: usize,
    pub sweep_ms: u64,
    pub wait_ms: u64,
}

impl FreezeResult {
    /// The JSON answer (written by hand: a derive costs the binary more than this).
    pub fn to_json(&self) -> String {
        format!(
            "{{\"mode\":\"{}\",\"visited\":{},\"allowlisted\":{},\"truncated\":{},\
             \"preFrozen\":{},\"requested\":{},\"frozen\":{},\"notFrozen\":{},\"failed\":{},\
             \"unobservable\":{},\"sweepMs\":{},\"waitMs\":{}}}",
            self.mode,
            self.visited,
            self.allowlisted,
            self.truncated,
            self.pre_frozen,
            self.requested,
            self.frozen,
            self.not_frozen,
            self.failed,
            self.unobservable,
            self.sweep_ms,
            self.wait_ms
        )
    }
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct ThawResult {
    pub thawed: usize,
    pub failed: usize,
    pub truncated: bool,
}

/// Another freeze or thaw holds the lock.
#[derive(Debug)]
pub struct Busy;

/// A `Start` into a frozen group.
#[derive(Debug)]
pub struct Frozen;

pub struct Freezer {
    state: Mutex<State>,
    /// True from a sweep until its thaw; a `Start` holds it read across its spawn.
    gate: RwLock<bool>,
    watchdog: Arc<Watchdog>,
}

#[derive(Default)]
struct State {
    /// A freeze of ours is in effect.
    active: bool,
    /// The mode of the sweep in effect, when this image made it (a freeze taken over from a
    /// previous image has none): what the resume audit may judge.
    swept: Option<Mode>,
    /// What the guest had frozen before it (a few paths: a list).
    guest_frozen: Vec<PathBuf>,
}

impl Freezer {
    pub fn new(thaw_after: Duration) -> Freezer {
        Freezer {
            state: Mutex::new(State::default()),
            gate: RwLock::new(false),
            watchdog: Watchdog::new(thaw_after),
        }
    }
}

/// What a `Start` into a group holds while it spawns: the group's `cgroup.procs` and the gate.
pub struct Placement<'a> {
    pub procs: Option<Arc<File>>,
    _gate: Option<RwLockReadGuard<'a, bool>>,
}

impl Cgroups {
    /// The placement of a process of `group` (`None`: the daemon's own); [`Frozen`] while a
    /// freeze is in effect.
    pub fn placement(&self, group: Option<Group>) -> Result<Placement<'_>, Frozen> {
        let (Some(group), Some(groups)) = (group, self.groups()) else {
            return Ok(Placement {
                procs: None,
                _gate: None,
            });
        };
        let gate = self.freezer.gate.read().unwrap_or_else(|e| e.into_inner());
        if *gate {
            return Err(Frozen);
        }
        Ok(Placement {
            procs: groups.procs(group),
            _gate: Some(gate),
        })
    }

    /// `/freeze`: [`Busy`] while another freeze or thaw runs.
    pub fn freeze(self: &Arc<Self>, options: &Options) -> Result<FreezeResult, Busy> {
        let mut state = match self.freezer.state.try_lock() {
            Ok(state) => state,
            Err(TryLockError::WouldBlock) => return Err(Busy),
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
        };
        let mut result = FreezeResult {
            mode: options.mode.as_str(),
            ..FreezeResult::default()
        };
        let Some(groups) = self.groups() else {
            // envd's no-op manager: both groups "requested", neither observable.
            result.mode = Mode::Legacy.as_str();
            result.requested = 2;
            result.unobservable = 2;
            return Ok(result);
        };
        *self.freezer.gate.write().unwrap_or_else(|e| e.into_inner()) = true;
        let sweep_start = Instant::now();
        let liveness = groups.liveness();
        if !state.active {
            let (mut found, truncated) = frozen_below(&groups.root);
            // What the resume needs is never recorded as the guest's: found frozen, it is
            // drift the thaw clears (envd's `ScanGuestFrozen`).
            found.retain(|dir| !liveness.protected(dir));
            state.guest_frozen = found;
            result.truncated |= truncated;
        }
        result.pre_frozen = state.guest_frozen.len();
        // Not knowing its own cgroup, the daemon cannot keep its chain out of a walk that
        // could freeze it: legacy instead, as envd falls back.
        let mode = match (options.mode, &groups.own) {
            (Mode::Hierarchy, None) => Mode::Legacy,
            (mode, _) => mode,
        };
        result.mode = mode.as_str();
        // `user` and `ptys` first in either mode (envd's static list), so no bound leaves them.
        let mut targets = own_groups(groups);
        if mode == Mode::Hierarchy {
            let max = match options.max_cgroups {
                0 => DEFAULT_MAX_CGROUPS,
                n => n.min(THAW_MAX_CGROUPS),
            };
            let sweep = hierarchy::sweep(&liveness, &targets, max);
            result.visited = sweep.visited;
            result.allowlisted = sweep.allowlisted;
            result.truncated |= sweep.truncated;
            targets.extend(sweep.targets);
        }
        let mut written = Vec::new();
        for target in targets {
            if state.guest_frozen.contains(&target) {
                continue;
            }
            match write_property(&target.join("cgroup.freeze"), "1") {
                Ok(()) => written.push(target),
                Err(_) => result.failed += 1,
            }
        }
        result.requested = written.len();
        state.active = true;
        // A legacy sweep after a hierarchy one leaves the hierarchy's groups frozen, but it is
        // the last sweep that says what the freeze meant to stop (envd's sweep state).
        state.swept = Some(mode);
        result.sweep_ms = millis(sweep_start.elapsed());
        if !written.is_empty() {
            let weak = Arc::downgrade(self);
            self.freezer
                .watchdog
                .arm(Box::new(move |generation| watchdog_thaw(&weak, generation)));
        }
        if !options.max_wait.is_zero() {
            let wait_start = Instant::now();
            await_frozen(&written, options.max_wait, &mut result);
            result.wait_ms = millis(wait_start.elapsed());
        }
        drop(state);
        Ok(result)
    }

    /// `/unfreeze`: [`Busy`] while another freeze or thaw runs.
    pub fn try_thaw(&self) -> Result<ThawResult, Busy> {
        match self.freezer.state.try_lock() {
            Ok(state) => Ok(self.thaw_locked(state)),
            Err(TryLockError::WouldBlock) => Err(Busy),
            Err(TryLockError::Poisoned(e)) => Ok(self.thaw_locked(e.into_inner())),
        }
    }

    /// `/init`'s audit and thaw: waits for a freeze in progress, then, under its lock so no
    /// other thaw runs between the two, audits when this image's `hierarchy` sweep is in
    /// effect (`audit`) and thaws; a failed thaw is logged.
    pub fn audit_and_thaw(&self) -> (Option<Audit>, ThawResult) {
        let state = self.freezer.state.lock().unwrap_or_else(|e| e.into_inner());
        let audit = match (self.groups(), state.active, state.swept) {
            (Some(groups), true, Some(Mode::Hierarchy)) => Some(audit::audit(groups)),
            _ => None,
        };
        let result = self.thaw_locked(state);
        if result.failed > 0 {
            crate::log::line(format_args!(
                "thaw: {} cgroups could not be thawed ({} were)",
                result.failed, result.thawed
            ));
        }
        (audit, result)
    }

    fn thaw_locked(&self, mut state: MutexGuard<'_, State>) -> ThawResult {
        let mut result = ThawResult::default();
        if let Some(groups) = self.groups() {
            // Without a freeze of ours in effect (no /freeze since start: an /init, or a
            // daemon restarted after a freeze), only its own two groups: the directory may be
            // the machine's whole hierarchy, and what froze the rest is not known.
            let frozen = if state.active {
                let (frozen, truncated) = frozen_below(&groups.root);
                result.truncated = truncated;
                frozen
            } else {
                let mut own = own_groups(groups);
                own.retain(|dir| freeze_requested_at(dir));
                own
            };
            for dir in frozen {
                if state.guest_frozen.contains(&dir) {
                    continue;
                }
                match write_property(&dir.join("cgroup.freeze"), "0") {
                    Ok(()) => result.thawed += 1,
                    Err(_) => result.failed += 1,
                }
            }
        }
        state.active = false;
        state.swept = None;
        self.freezer.watchdog.disarm();
        *self.freezer.gate.write().unwrap_or_else(|e| e.into_inner()) = false;
        result
    }
}

impl Cgroups {
    /// A freeze of this daemon's in effect: what the guest had frozen before it (`None`: no
    /// freeze). For a live upgrade (`cgroups::handover`).
    pub(super) fn freeze_in_effect(&self) -> Option<Vec<PathBuf>> {
        let state = self.freezer.state.lock().unwrap_or_else(|e| e.into_inner());
        state.active.then(|| state.guest_frozen.clone())
    }

    /// Takes up a freeze a previous image made: in effect, the guest's own freezes left alone
    /// by the thaw, `Start`s gated, and the watchdog armed again (its window counts from now).
    pub(super) fn resume_freeze(self: &Arc<Self>, guest_frozen: Vec<PathBuf>) {
        let mut state = self.freezer.state.lock().unwrap_or_else(|e| e.into_inner());
        state.active = true;
        state.guest_frozen = guest_frozen;
        *self.freezer.gate.write().unwrap_or_else(|e| e.into_inner()) = true;
        let weak = Arc::downgrade(self);
        self.freezer
            .watchdog
            .arm(Box::new(move |generation| watchdog_thaw(&weak, generation)));
    }
}

/// The watchdog's thaw: only if its arming is still the current one, checked under the lock.
fn watchdog_thaw(cgroups: &Weak<Cgroups>, generation: u64) {
    let Some(cgroups) = cgroups.upgrade() else {
        return;
    };
    let state = cgroups
        .freezer
        .state
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if !cgroups.freezer.watchdog.is_current(generation) {
        return;
    }
    let result = cgroups.thaw_locked(state);
    crate::log::line(format_args!(
        "thaw watchdog: a /freeze nobody ended was thawed ({} cgroups, {} failed)",
        result.thawed, result.failed
    ));
}

/// Every cgroup below `root` whose own `cgroup.freeze` reads 1 (at most [`THAW_MAX_CGROUPS`]
/// visited), and whether the bound stopped the walk.
fn frozen_below(root: &Path) -> (Vec<PathBuf>, bool) {
    let (frozen, _, truncated) = walk(root, THAW_MAX_CGROUPS, &mut |dir| {
        if freeze_requested_at(dir) {
            Visit::PickAndDescend
        } else {
            Visit::Descend
        }
    });
    (frozen, truncated)
}

fn freeze_requested_at(dir: &Path) -> bool {
    read(&dir.join("cgroup.freeze")).is_some_and(|t| events::freeze_requested(&t))
}

/// `user` and `ptys`.
fn own_groups(groups: &Groups) -> Vec<PathBuf> {
    [Group::User, Group::Ptys]
        .iter()
        .filter_map(|g| groups.path(*g).map(Path::to_path_buf))
        .collect()
}

/// Reads each written group's `cgroup.events` until all say frozen or `budget` passes.
fn await_frozen(written: &[PathBuf], budget: Duration, result: &mut FreezeResult) {
    let deadline = Instant::now() + budget;
    let mut pending: Vec<File> = Vec::new();
    for dir in written {
        match File::open(dir.join("cgroup.events")) {
            Ok(file) => pending.push(file),
            Err(_) => result.failed += 1,
        }
    }
    loop {
        let mut still = Vec::new();
        for file in pending {
            let mut buf = [0u8; 256];
            match file.read_at(&mut buf, 0) {
                Ok(n) if events::frozen(&String::from_utf8_lossy(&buf[..n])) => result.frozen += 1,
                Ok(_) => still.push(file),
                Err(_) => result.failed += 1,
            }
        }
        pending = still;
        let now = Instant::now();
        if pending.is_empty() || now >= deadline {
            break;
        }
        let fds: Vec<_> = pending
            .iter()
            .map(|f| (f.as_fd(), Interest::Priority))
            .collect();
        let _ = poll_ready(&fds, Some((deadline - now).min(POLL_CAP)));
    }
    result.not_frozen = pending.len();
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn without_groups() -> Arc<Cgroups> {
        Arc::new(Cgroups {
            groups: None,
            freezer: Freezer::new(Duration::from_secs(600)),
        })
    }

    #[test]
    fn a_freeze_or_thaw_while_another_holds_the_lock_is_busy() {
        let cgroups = without_groups();
        let held = cgroups.freezer.state.lock().unwrap();
        let options = Options {
            max_wait: Duration::ZERO,
            mode: Mode::Legacy,
            max_cgroups: 0,
        };
        assert!(cgroups.freeze(&options).is_err());
        assert!(cgroups.try_thaw().is_err());
        drop(held);
        assert!(cgroups.try_thaw().is_ok());
    }

    /// A tree of directories with a `cgroup.freeze` each reading 0, and the manager over it.
    fn tree_with(own: Option<&str>, dirs: &[&str]) -> (tempfile::TempDir, Arc<Cgroups>) {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for dir in dirs {
            std::fs::create_dir_all(r.join(dir)).unwrap();
            std::fs::write(r.join(dir).join("cgroup.freeze"), "0").unwrap();
        }
        let groups = Groups::for_test(
            r.to_path_buf(),
            own.map(|own| r.join(own)),
            &[(Group::User, r.join("user")), (Group::Ptys, r.join("ptys"))],
        );
        let cgroups = Arc::new(Cgroups {
            groups: Some(groups),
            freezer: Freezer::new(Duration::from_secs(600)),
        });
        (root, cgroups)
    }

    fn freeze_requested(root: &Path, dir: &str) -> bool {
        freeze_requested_at(&root.join(dir))
    }

    #[test]
    fn a_hierarchy_freeze_spares_the_allowlist_and_the_chain_and_is_legacy_without_its_own() {
        let dirs = [
            "user",
            "ptys",
            "init.scope",
            "system.slice/envd.service",
            "system.slice/systemd-journald.service",
            "system.slice/cron.service",
            "user.slice",
        ];
        let hierarchy = Options {
            max_wait: Duration::ZERO,
            mode: Mode::Hierarchy,
            max_cgroups: 0,
        };
        let (root, cgroups) = tree_with(Some("system.slice/envd.service"), &dirs);
        let r = root.path();
        // The guest froze journald itself before (drift): ours, so not kept frozen as its own.
        std::fs::write(
            r.join("system.slice/systemd-journald.service/cgroup.freeze"),
            "1",
        )
        .unwrap();
        let result = cgroups.freeze(&hierarchy).unwrap();
        assert_eq!(result.mode, "hierarchy");
        assert_eq!(result.pre_frozen, 0, "{result:?}");
        assert_eq!((result.requested, result.allowlisted), (4, 2), "{result:?}");
        for dir in ["user", "ptys", "system.slice/cron.service", "user.slice"] {
            assert!(freeze_requested(r, dir), "{dir}");
        }
        for dir in ["init.scope", "system.slice/envd.service"] {
            assert!(!freeze_requested(r, dir), "{dir}");
        }
        assert_eq!(cgroups.try_thaw().unwrap().thawed, 5);
        assert!(!freeze_requested(
            r,
            "system.slice/systemd-journald.service"
        ));

        let (root, cgroups) = tree_with(None, &dirs);
        let result = cgroups.freeze(&hierarchy).unwrap();
        assert_eq!((result.mode, result.requested), ("legacy", 2), "{result:?}");
        assert!(!freeze_requested(root.path(), "system.slice/cron.service"));
        assert!(!freeze_requested(root.path(), "user.slice"));
    }

    #[test]
    fn without_groups_it_answers_as_envds_no_op_manager_and_starts_run() {
        let cgroups = without_groups();
        let options = Options {
            max_wait: Duration::from_millis(100),
            mode: Mode::Hierarchy,
            max_cgroups: 0,
        };
        let result = cgroups.freeze(&options).unwrap();
        let json: serde_json::Value = serde_json::from_str(&result.to_json()).unwrap();
        assert_eq!(json["mode"], "legacy");
        assert_eq!(json["unobservable"], 2);
        assert_eq!(json["truncated"], false);
        assert_eq!(json.as_object().unwrap().len(), 12);
        assert_eq!(
            result,
            FreezeResult {
                mode: "legacy",
                requested: 2,
                unobservable: 2,
                ..FreezeResult::default()
            }
        );
        let placement = cgroups.placement(Some(Group::User)).ok().unwrap();
        assert!(placement.procs.is_none());
    }
}
