//! The cgroup v2 manager: envd's groups for started processes, made once at start-up in the
//! `--process-cgroups` directory, and the descriptors a child uses to join its group.
//!
//! envd's groups (`cgroup2.go`, `main.go`), with its weights and limits:
//!
//! | group | who | properties |
//! |---|---|---|
//! | `ptys` | terminal sessions | `cpu.weight` 200, `io.weight` `default 50`, `memory.high` = `memory.max` = the machine's memory less 1/8 (at most 128 MiB) |
//! | `user` | piped processes | `cpu.weight` 50, `io.weight` `default 10`, the same memory limits |
//! | `socats` | envd's port forwarders | `cpu.weight` 150, `io.weight` `default 50`, `memory.min` 5 MiB, `memory.low` 8 MiB |
//!
//! Where: by default the `--cgroup-root` directory, `/sys/fs/cgroup` (envd's `-cgroup-root`),
//! so the groups sit beside the daemon's own cgroup, not inside it: under E2B's unit
//! (`Delegate=yes`) the daemon's cgroup holds the daemon, so cgroup v2's no-internal-process rule
//! keeps controllers off below it (no weights, no limits); the user's processes would inherit the
//! unit's protection meant for the daemon (`CPUWeight=1000`, `MemoryMin=`); and systemd's
//! restart of a crashed daemon kills the unit's whole cgroup, the user's processes with it.
//! A default directory that is not cgroup v2 is refused, saying where v2 is mounted if anywhere:
//! the daemon never picks another place on its own.
//!
//! A process tagged `_system` stays in the daemon's own group (never frozen), as envd's. A
//! property is written only where its file exists: a controller not enabled in the
//! directory's `cgroup.subtree_control` has no files, and its properties are skipped and named
//! in the start-up line (envd skips them the same way). Enabling controllers is left to whoever
//! owns the directory (systemd's `Delegate=`, the image's init).
//!
//! Placement: the daemon keeps each group's `cgroup.procs` open; the child writes `0` (itself)
//! to it between `fork` and `exec` (`sys::spawn`), before any of the user's code runs. Without
//! cgroup v2, or without the right to make the groups, one log line says why and every process
//! runs in the daemon's group: never a failed command. The freezes are `freeze`'s.

pub mod audit;
pub mod events;
pub mod freeze;
mod handover;
pub mod hierarchy;
pub use handover::CarriedFreeze;

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::{Config, ProcessCgroups};
use crate::stats::cgroup_detect;

/// `CGROUP2_SUPER_MAGIC` of `linux/magic.h`.
const CGROUP2_SUPER_MAGIC: u64 = 0x6367_7270;
const MIB: u64 = 1024 * 1024;

/// The groups a started process may join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// Terminal sessions.
    Ptys,
    /// Piped processes.
    User,
    /// envd's port forwarders (made for envd's layout; sandboxd's forwarder is in-process).
    Socats,
}

impl Group {
    pub const ALL: [Group; 3] = [Group::Ptys, Group::User, Group::Socats];

    pub fn name(self) -> &'static str {
        match self {
            Group::Ptys => "ptys",
            Group::User => "user",
            Group::Socats => "socats",
        }
    }

    /// The group of a `Start` (envd's `getProcType`): `None` for the `_system` tag.
    pub fn of_start(tag: Option<&str>, terminal: bool) -> Option<Group> {
        match (tag, terminal) {
            (Some("_system"), _) => None,
            (_, true) => Some(Group::Ptys),
            (_, false) => Some(Group::User),
        }
    }

    /// envd's properties for the group, given the machine's total memory in bytes.
    pub fn properties(self, mem_total: Option<u64>) -> Vec<(&'static str, String)> {
        let limit = mem_total.map(|total| total - (total / 8).min(128 * MIB).min(total));
        let memory = |props: &mut Vec<(&'static str, String)>| {
            if let Some(limit) = limit {
                props.push(("memory.high", limit.to_string()));
                props.push(("memory.max", limit.to_string()));
            }
        };
        let mut props = Vec::new();
        match self {
            Group::Ptys => {
                props.push(("cpu.weight", "200".into()));
                props.push(("io.weight", "default 50".into()));
                memory(&mut props);
            }
            Group::User => {
                memory(&mut props);
                props.push(("cpu.weight", "50".into()));
                props.push(("io.weight", "default 10".into()));
            }
            Group::Socats => {
                props.push(("cpu.weight", "150".into()));
                props.push(("io.weight", "default 50".into()));
                props.push(("memory.min", (5 * MIB).to_string()));
                props.push(("memory.low", (8 * MIB).to_string()));
            }
        }
        props
    }
}

/// The groups, made; `None` of [`Cgroups::groups`] when cgroups are off or unavailable.
pub struct Groups {
    /// The `--process-cgroups` directory.
    pub root: PathBuf,
    /// The daemon's own cgroup directory, when known (the hierarchy freeze leaves its
    /// ancestors alone).
    pub own: Option<PathBuf>,
    dirs: Vec<(Group, PathBuf, Arc<File>)>,
}

impl Groups {
    pub fn path(&self, group: Group) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|(g, _, _)| *g == group)
            .map(|(_, path, _)| path.as_path())
    }

    /// Groups at these paths, for a test that reads the tree only (no `cgroup.procs` held).
    #[cfg(test)]
    pub fn for_test(root: PathBuf, own: Option<PathBuf>, dirs: &[(Group, PathBuf)]) -> Groups {
        let null = || Arc::new(File::open("/dev/null").expect("/dev/null"));
        Groups {
            root,
            own,
            dirs: dirs.iter().map(|(g, p)| (*g, p.clone(), null())).collect(),
        }
    }

    /// What the freezes must keep running below the directory.
    pub fn liveness(&self) -> hierarchy::Liveness {
        hierarchy::Liveness::new(&self.root, self.own.as_deref())
    }

    /// The open `cgroup.procs` a child of `group` writes itself to.
    pub fn procs(&self, group: Group) -> Option<Arc<File>> {
        self.dirs
            .iter()
            .find(|(g, _, _)| *g == group)
            .map(|(_, _, procs)| Arc::clone(procs))
    }
}

/// The manager: the groups if they could be made, and the freezer over them.
pub struct Cgroups {
    groups: Option<Groups>,
    pub freezer: freeze::Freezer,
}

impl Cgroups {
    /// Makes the groups `config` asks for, logging one line either way.
    pub fn setup(config: &Config) -> Cgroups {
        let groups = match make(config) {
            Ok(Some((groups, skipped))) => {
                crate::log::line(format_args!(
                    "process cgroups in {}: ptys, user, socats{skipped}",
                    groups.root.display()
                ));
                Some(groups)
            }
            Ok(None) => {
                crate::log::line(format_args!(
                    "process cgroups off: processes run in the daemon's own cgroup"
                ));
                None
            }
            Err(reason) => {
                crate::log::line(format_args!(
                    "process cgroups unavailable ({reason}): processes run in the daemon's own \
                     cgroup, and /freeze cannot stop them"
                ));
                None
            }
        };
        Cgroups {
            freezer: freeze::Freezer::new(config.thaw_watchdog),
            groups,
        }
    }

    pub fn groups(&self) -> Option<&Groups> {
        self.groups.as_ref()
    }
}

/// The groups made and the properties skipped (`; skipped ...: a, b`, or empty); `None` when
/// off.
fn make(config: &Config) -> Result<Option<(Groups, String)>, String> {
    let root = match &config.process_cgroups {
        ProcessCgroups::Off => return Ok(None),
        ProcessCgroups::At(path) => path.clone(),
        ProcessCgroups::Root => config.cgroup_root.clone(),
    };
    let mountinfo = read_self(config, "mountinfo");
    match crate::sys::statfs::fs_type(&root) {
        Ok(CGROUP2_SUPER_MAGIC) => {}
        Ok(_) => return Err(not_v2(&root, mountinfo.as_deref())),
        Err(e) => return Err(format!("{}: {e}", root.display())),
    }
    let own = own_directory(config, mountinfo.as_deref());
    let mem_total = std::fs::read_to_string(config.proc_root.join("meminfo"))
        .ok()
        .and_then(|text| events::mem_total(&text));
    let mut dirs = Vec::new();
    let mut skipped = String::new();
    for group in Group::ALL {
        let path = root.join(group.name());
        match std::fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot make {}: {e}", path.display())),
        }
        for (name, value) in group.properties(mem_total) {
            if write_property(&path.join(name), &value).is_err() {
                skipped.push_str(match skipped.is_empty() {
                    true => "; skipped (controller not enabled there, or refused): ",
                    false => ", ",
                });
                skipped.push_str(group.name());
                skipped.push('/');
                skipped.push_str(name);
            }
        }
        let procs = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path.join("cgroup.procs"))
            .map_err(|e| format!("cannot open {}/cgroup.procs: {e}", path.display()))?;
        dirs.push((group, path, Arc::new(procs)));
    }
    Ok(Some((Groups { root, own, dirs }, skipped)))
}

/// Writes a cgroup interface file, never creating it (a missing one is a missing controller).
pub fn write_property(path: &Path, value: &str) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    file.write_all(value.as_bytes())
}

/// Why `root` cannot hold the groups: not cgroup v2, and where cgroup v2 is when it is mounted
/// elsewhere (a hybrid host's `/sys/fs/cgroup/unified`, beside v1). The daemon never moves there
/// on its own: such a mount has no controllers (v1 holds them), and the place is the operator's
/// to choose with `--process-cgroups`.
fn not_v2(root: &Path, mountinfo: Option<&str>) -> String {
    let elsewhere = mountinfo.and_then(|text| {
        cgroup_detect::parse_mountinfo(text)
            .into_iter()
            .find(|m| m.kind == cgroup_detect::MountKind::V2)
    });
    match elsewhere {
        Some(mount) => format!(
            "{} is not a cgroup v2 directory; cgroup v2 is mounted at {}: --process-cgroups \
             PATH makes the groups there",
            root.display(),
            mount.mount_point.display()
        ),
        None => format!(
            "{} is not a cgroup v2 directory, and no cgroup v2 is mounted",
            root.display()
        ),
    }
}

fn read_self(config: &Config, name: &str) -> Option<String> {
    std::fs::read_to_string(config.proc_root.join("self").join(name)).ok()
}

/// The daemon's own cgroup v2 directory, from `/proc/self/cgroup` and `/proc/self/mountinfo`.
fn own_directory(config: &Config, mountinfo: Option<&str>) -> Option<PathBuf> {
    let layout = cgroup_detect::detect(
        read_self(config, "cgroup").as_deref(),
        mountinfo,
        &config.cgroup_root,
        // The function the sampler passes too: one copy of `detect` in the binary.
        Path::exists,
    );
    layout.v2.map(|v2| v2.dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envds_weights_and_limits() {
        let gib = 1024 * MIB;
        let user = Group::User.properties(Some(4 * gib));
        let limit = (4 * gib - 128 * MIB).to_string();
        assert_eq!(
            user,
            [
                ("memory.high", limit.clone()),
                ("memory.max", limit),
                ("cpu.weight", "50".into()),
                ("io.weight", "default 10".into()),
            ]
        );
        // A small machine keeps 1/8 free.
        let ptys = Group::Ptys.properties(Some(512 * MIB));
        assert_eq!(ptys[2], ("memory.high", (448 * MIB).to_string()));
        assert_eq!(ptys[0], ("cpu.weight", "200".into()));
        // Unknown memory: no memory limits, the weights still.
        assert_eq!(Group::User.properties(None).len(), 2);
        let socats = Group::Socats.properties(Some(gib));
        assert_eq!(socats[2], ("memory.min", "5242880".into()));
        assert_eq!(socats[3], ("memory.low", "8388608".into()));
    }

    #[test]
    fn a_directory_not_v2_is_refused_naming_where_v2_is_mounted_if_anywhere() {
        let hybrid = "\
30 25 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
33 30 0:29 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,memory
";
        let root = Path::new("/sys/fs/cgroup");
        assert_eq!(
            not_v2(root, Some(hybrid)),
            "/sys/fs/cgroup is not a cgroup v2 directory; cgroup v2 is mounted at \
             /sys/fs/cgroup/unified: --process-cgroups PATH makes the groups there"
        );
        let v1_only = "33 30 0:29 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        for mountinfo in [Some(v1_only), None] {
            assert_eq!(
                not_v2(root, mountinfo),
                "/sys/fs/cgroup is not a cgroup v2 directory, and no cgroup v2 is mounted"
            );
        }
    }

    #[test]
    fn a_starts_group_is_envds() {
        assert_eq!(Group::of_start(None, false), Some(Group::User));
        assert_eq!(Group::of_start(Some("x"), true), Some(Group::Ptys));
        assert_eq!(Group::of_start(Some("_system"), true), None);
        assert_eq!(Group::of_start(Some("_system"), false), None);
    }
}
