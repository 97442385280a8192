//! The options on the sandbox's system: where figures are read and system files written, the
//! metadata service, cgroups, freezing, and where a live upgrade's binary goes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::parse::{absolute_path, non_empty_path, parse_addr, parse_seconds};
use super::{Fallback, Opt, Setting};

pub const PROC_ROOT: Setting<PathBuf> = Setting {
    opt: Opt {
        flag: Some("--proc-root"),
        env: "SANDBOXD_PROC_ROOT",
        value: "PATH",
        default: Fallback::Text("/proc"),
        help: "source of process and memory figures (tests use fixtures)",
    },
    parse: |_, text| non_empty_path(text),
    absent: None,
};

pub const SYSTEM_ROOT: Setting<PathBuf> = Setting {
    opt: Opt {
        flag: Some("--system-root"),
        env: "SANDBOXD_SYSTEM_ROOT",
        value: "PATH",
        default: Fallback::Text("/"),
        help: "where system files /init writes live (/etc/hosts, the CA store, /run/e2b)",
    },
    parse: |flag, text| absolute_path(flag, text),
    absent: None,
};

/// Off unless given: a daemon started as `sandboxd` contacts no metadata service (SPEC §9);
/// under the name `envd` the default is envd's ([`crate::mmds::envd_default_address`]).
pub const MMDS_ADDRESS: Setting<Option<SocketAddr>> = Setting {
    opt: Opt {
        flag: Some("--mmds-address"),
        env: "SANDBOXD_MMDS_ADDRESS",
        value: "HOST:PORT",
        default: Fallback::Words("none: no metadata service"),
        help: "Firecracker's metadata service (MMDS v2): the sandbox's identity and the hash of \
               the token `/init` may set (envd's is Firecracker's link-local one, port 80)",
    },
    parse: |flag, text| parse_addr(flag, text).map(Some),
    absent: Some(|| None),
};

pub const CGROUP_ROOT: Setting<PathBuf> = Setting {
    opt: Opt {
        flag: Some("--cgroup-root"),
        env: "SANDBOXD_CGROUP_ROOT",
        value: "PATH",
        default: Fallback::Text("/sys/fs/cgroup"),
        help: "source of the container's limits, and where the process cgroups are made \
               unless `--process-cgroups` says",
    },
    parse: |_, text| non_empty_path(text),
    absent: None,
};

/// Where started processes' cgroups are made (`platform::cgroups`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessCgroups {
    /// The `--cgroup-root` directory (`/sys/fs/cgroup`, envd's `-cgroup-root`), when it is
    /// cgroup v2 and the daemon may write there: the groups sit outside the daemon's own
    /// cgroup, as envd's do.
    Root,
    /// None: every process stays in the daemon's group.
    Off,
    At(PathBuf),
}

pub const PROCESS_CGROUPS: Setting<ProcessCgroups> = Setting {
    opt: Opt {
        flag: Some("--process-cgroups"),
        env: "SANDBOXD_PROCESS_CGROUPS",
        value: "PATH",
        default: Fallback::Words("the --cgroup-root directory"),
        help: "cgroup v2 directory where started processes' groups (`ptys`, `user`, `socats`) \
               are made, with envd's weights and memory limits (envd's: `/sys/fs/cgroup`); \
               `off` for none",
    },
    parse: |flag, text| match text {
        "off" => Ok(ProcessCgroups::Off),
        _ => absolute_path(flag, text).map(ProcessCgroups::At),
    },
    absent: Some(|| ProcessCgroups::Root),
};

/// The filesystem `/fsfreeze` freezes: the root's in a sandbox, a test's own image in tests.
pub const FSFREEZE_PATH: Setting<PathBuf> = Setting {
    opt: Opt {
        flag: Some("--fsfreeze-path"),
        env: "SANDBOXD_FSFREEZE_PATH",
        value: "PATH",
        default: Fallback::Text("/"),
        help: "a path on the filesystem `/fsfreeze` freezes (`FIFREEZE`) and `/fsthaw` thaws",
    },
    parse: |flag, text| absolute_path(flag, text),
    absent: None,
};

/// envd's `DefaultThawWatchdogWindow`: ten minutes.
pub const THAW_WATCHDOG: Setting<Duration> = Setting {
    opt: Opt {
        flag: Some("--thaw-watchdog"),
        env: "SANDBOXD_THAW_WATCHDOG",
        value: "SECS",
        default: Fallback::Text("600"),
        help: "a `/freeze` or `/fsfreeze` nobody ended is thawed after this long",
    },
    parse: parse_seconds,
    absent: None,
};

/// `--upgrade-path`: where `POST /upgrade` puts the new binary (SPEC §9c), envd's fixed path.
pub const UPGRADE_PATH: Setting<PathBuf> = Setting {
    opt: Opt {
        flag: Some("--upgrade-path"),
        env: "SANDBOXD_UPGRADE_PATH",
        value: "PATH",
        default: Fallback::Text("/usr/bin/envd.next"),
        help: "where `POST /upgrade` writes the new binary it then runs (envd's path; the \
               orchestrator's `X-Envd-Upgrade-Bin`, envd's path or this one, means it); its \
               directory and each above it must be root's alone, or `/upgrade` is refused",
    },
    parse: |flag, text| absolute_path(flag, text),
    absent: None,
};
