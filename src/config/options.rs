//! The option table: every daemon option once, with its flag, environment variable, value
//! placeholder, default, help sentence and parser. `Config` is built from it (`super`), and
//! `--help` and the README's configuration table are rendered from it (`super::usage`).
//!
//! An option that fills a `Config` field is a [`Setting`]: its row ([`Opt`]) and the parser of
//! its text. Code reads a setting through its constant (`LISTEN`), never through a flag string,
//! so a misspelt option does not compile. A default is either text, parsed like a given value
//! (so the default users read is the default they get), or words for a computed or absent
//! value, which the setting's `absent` gives.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// What users read about one option: one line of `--help`, one row of the README's table.
pub struct Opt {
    /// `--listen`; `None` for the variable that has no flag (the token itself).
    pub flag: Option<&'static str>,
    pub env: &'static str,
    /// The value's placeholder after the flag: `ADDR`.
    pub value: &'static str,
    pub default: Fallback,
    /// One sentence, in Markdown (`--help` drops the backticks).
    pub help: &'static str,
}

/// An option's value when neither its flag nor its variable gives one.
pub enum Fallback {
    /// This text, parsed like a given value.
    Text(&'static str),
    /// Computed or absent, as these words say; the setting's `absent` gives the value.
    Words(&'static str),
}

/// A daemon option feeding one `Config` field of type `T`.
pub struct Setting<T> {
    pub opt: Opt,
    /// The text (given, or the default's) into a value; the first argument is the flag, for
    /// error messages.
    parse: fn(&str, &str) -> Result<T, String>,
    /// The value when there is no text at all (a [`Fallback::Words`] default).
    absent: Option<fn() -> T>,
}

impl Opt {
    /// The name error messages use: the flag, else the variable.
    pub fn name(&self) -> &'static str {
        self.flag.unwrap_or(self.env)
    }
}

impl<T> Setting<T> {
    /// The value of `text`, the flag's or else the variable's; without it, the default.
    pub(super) fn read(&self, text: Option<&str>) -> Result<T, String> {
        let name = self.opt.name();
        match (text, &self.opt.default, self.absent) {
            (Some(text), _, _) | (None, &Fallback::Text(text), _) => (self.parse)(name, text),
            (None, &Fallback::Words(_), Some(absent)) => Ok(absent()),
            (None, &Fallback::Words(_), None) => Err(format!("{name} needs a value")),
        }
    }
}

/// Every option, in the order `--help` and the README list them.
pub const OPTIONS: &[Opt] = &[
    LISTEN.opt,
    ACCESS_TOKEN_FILE.opt,
    ACCESS_TOKEN,
    INIT_TOKEN_HASH_FILE.opt,
    DEFAULT_USER.opt,
    DEFAULT_WORKDIR.opt,
    PASSWD_FILE.opt,
    WORKERS.opt,
    HEADER_TIMEOUT.opt,
    IDLE_TIMEOUT.opt,
    DRAIN_TIMEOUT.opt,
    SEND_TIMEOUT.opt,
    BODY_TIMEOUT.opt,
    PROC_ROOT.opt,
    CGROUP_ROOT.opt,
    SYSTEM_ROOT.opt,
    MMDS_ADDRESS.opt,
    FS_AS_USER.opt,
    LOG_FORMAT.opt,
    UPGRADE_PATH.opt,
    PROCESS_CGROUPS.opt,
    FSFREEZE_PATH.opt,
    THAW_WATCHDOG.opt,
    FORWARD_ADDRESS.opt,
    FORWARD_MAX_PORTS.opt,
    FORWARD_MAX_CONNECTIONS.opt,
];

pub const LISTEN: Setting<SocketAddr> = Setting {
    opt: Opt {
        flag: Some("--listen"),
        env: "SANDBOXD_LISTEN",
        value: "ADDR",
        default: Fallback::Text("0.0.0.0:49983"),
        help: "address to listen on",
    },
    parse: parse_addr,
    absent: None,
};

pub const ACCESS_TOKEN_FILE: Setting<Option<PathBuf>> = Setting {
    opt: Opt {
        flag: Some("--access-token-file"),
        env: "SANDBOXD_ACCESS_TOKEN_FILE",
        value: "PATH",
        default: Fallback::Words("none"),
        help: "file holding the token (surrounding whitespace ignored)",
    },
    parse: |_, text| non_empty_path(text).map(Some),
    absent: Some(|| None),
};

/// The token itself. Not parsed into `Config`: the daemon and `sign` read it at start, and the
/// daemon then scrubs it from its environment.
pub const ACCESS_TOKEN: Opt = Opt {
    flag: None,
    env: "SANDBOXD_ACCESS_TOKEN",
    value: "TOKEN",
    default: Fallback::Words("none"),
    help: "the token itself (no flag: a flag's value shows in `ps`)",
};

/// Read on every `/init` that needs it (SPEC §9).
pub const INIT_TOKEN_HASH_FILE: Setting<Option<PathBuf>> = Setting {
    opt: Opt {
        flag: Some("--init-token-hash-file"),
        env: "SANDBOXD_INIT_TOKEN_HASH_FILE",
        value: "PATH",
        default: Fallback::Words("none"),
        help: "hex SHA-256 of a token `/init` may set without the current one (read per request; \
               for hosts without a metadata service)",
    },
    parse: |_, text| non_empty_path(text).map(Some),
    absent: Some(|| None),
};

pub const DEFAULT_USER: Setting<String> = Setting {
    opt: Opt {
        flag: Some("--default-user"),
        env: "SANDBOXD_DEFAULT_USER",
        value: "NAME",
        default: Fallback::Text("root"),
        help: "user for paths and ownership when a request names none",
    },
    parse: |flag, text| match text {
        "" => Err(format!("{flag} must not be empty")),
        user => Ok(user.into()),
    },
    absent: None,
};

/// Empty means unset, as when not given.
pub const DEFAULT_WORKDIR: Setting<Option<PathBuf>> = Setting {
    opt: Opt {
        flag: Some("--default-workdir"),
        env: "SANDBOXD_DEFAULT_WORKDIR",
        value: "PATH",
        default: Fallback::Words("the user's home"),
        help: "where an empty path points",
    },
    parse: |flag, text| match text {
        "" => Ok(None),
        path => absolute_path(flag, path).map(Some),
    },
    absent: Some(|| None),
};

pub const PASSWD_FILE: Setting<PathBuf> = Setting {
    opt: Opt {
        flag: Some("--passwd-file"),
        env: "SANDBOXD_PASSWD_FILE",
        value: "PATH",
        default: Fallback::Text("/etc/passwd"),
        help: "users (read on each request: users are added at run time)",
    },
    parse: |_, text| non_empty_path(text),
    absent: None,
};

pub const WORKERS: Setting<usize> = Setting {
    opt: Opt {
        flag: Some("--workers"),
        env: "SANDBOXD_WORKERS",
        value: "N",
        default: Fallback::Words("4 × CPUs, 4..64"),
        help: "worker threads; they block on disks and slow clients",
    },
    parse: |_, text| parse_workers(text),
    absent: Some(default_workers),
};

pub const HEADER_TIMEOUT: Setting<Duration> = Setting {
    opt: Opt {
        flag: Some("--header-timeout"),
        env: "SANDBOXD_HEADER_TIMEOUT",
        value: "SECS",
        default: Fallback::Text("10"),
        help: "a request head must be complete within this",
    },
    parse: parse_seconds,
    absent: None,
};

/// SPEC §1, §10: envd's 640 s, above the 620 s for which E2B's orchestrator proxy keeps an idle
/// pooled connection to the sandbox, so the proxy always closes first and never sends a request
/// on a connection sandboxd is closing.
pub const IDLE_TIMEOUT: Setting<Duration> = Setting {
    opt: Opt {
        flag: Some("--idle-timeout"),
        env: "SANDBOXD_IDLE_TIMEOUT",
        value: "SECS",
        default: Fallback::Text("640"),
        help: "idle keep-alive connections are closed after this (envd's 640 s, above the 620 s \
               E2B's orchestrator proxy keeps an idle connection, so the proxy always closes \
               first)",
    },
    parse: parse_seconds,
    absent: None,
};

pub const DRAIN_TIMEOUT: Setting<Duration> = Setting {
    opt: Opt {
        flag: Some("--drain-timeout"),
        env: "SANDBOXD_DRAIN_TIMEOUT",
        value: "SECS",
        default: Fallback::Text("10"),
        help: "on SIGTERM, longest wait for requests in flight",
    },
    parse: parse_seconds,
    absent: None,
};

pub const SEND_TIMEOUT: Setting<Duration> = Setting {
    opt: Opt {
        flag: Some("--send-timeout"),
        env: "SANDBOXD_SEND_TIMEOUT",
        value: "SECS",
        default: Fallback::Text("30"),
        help: "a client that reads nothing of a response for this long is dropped",
    },
    parse: parse_seconds,
    absent: None,
};

pub const BODY_TIMEOUT: Setting<Duration> = Setting {
    opt: Opt {
        flag: Some("--body-timeout"),
        env: "SANDBOXD_BODY_TIMEOUT",
        value: "SECS",
        default: Fallback::Text("30"),
        help: "a client that sends no body bytes for this long is dropped; past it, a body \
               averaging under 500 bytes/s is cut too (a trickle cannot hold a worker)",
    },
    parse: parse_seconds,
    absent: None,
};

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
               the token `/init` may set (envd's is `169.254.169.254:80`)",
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
        help: "source of the container's limits",
    },
    parse: |_, text| non_empty_path(text),
    absent: None,
};

/// Where started processes' cgroups are made (`platform::cgroups`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessCgroups {
    /// The daemon's own cgroup v2 directory, when it may write there.
    Own,
    /// None: every process stays in the daemon's group.
    Off,
    At(PathBuf),
}

pub const PROCESS_CGROUPS: Setting<ProcessCgroups> = Setting {
    opt: Opt {
        flag: Some("--process-cgroups"),
        env: "SANDBOXD_PROCESS_CGROUPS",
        value: "PATH",
        default: Fallback::Words("its own group's"),
        help: "cgroup v2 directory where started processes' groups (`ptys`, `user`, `socats`) are made, with envd's weights and memory limits; `off` for none",
    },
    parse: |flag, text| match text {
        "off" => Ok(ProcessCgroups::Off),
        _ => absolute_path(flag, text).map(ProcessCgroups::At),
    },
    absent: Some(|| ProcessCgroups::Own),
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

/// A switch: the flag alone turns it on (`--fs-as-user=false` turns it off again).
pub const FS_AS_USER: Setting<bool> = Setting {
    opt: Opt {
        flag: Some("--fs-as-user"),
        env: "SANDBOXD_FS_AS_USER",
        value: "",
        default: Fallback::Text("0"),
        help: "run file routes and filesystem calls with the caller's fsuid, fsgid and groups, so the \
               kernel checks them as the user's (off: as root, as envd does)",
    },
    parse: parse_switch,
    absent: None,
};

/// `--log-format`: text lines, or JSON objects with envd's field names (SPEC §1).
pub const LOG_FORMAT: Setting<crate::log::Format> = Setting {
    opt: Opt {
        flag: Some("--log-format"),
        env: "SANDBOXD_LOG_FORMAT",
        value: "FORMAT",
        default: Fallback::Text("text"),
        help: "`text` (a time, then the message) or `json` (one object per line with envd's fields: `level`, `timestamp`, `message`, a request's `operation_id`)",
    },
    parse: |flag, text| match text {
        "text" => Ok(crate::log::Format::Text),
        "json" => Ok(crate::log::Format::Json),
        _ => Err(format!("{flag} must be text or json, not '{text}'")),
    },
    absent: None,
};

/// SPEC §12: envd's address for the sandbox (its port forwarder's `socat`s bind there).
pub const FORWARD_ADDRESS: Setting<Option<IpAddr>> = Setting {
    opt: Opt {
        flag: Some("--forward-address"),
        env: "SANDBOXD_FORWARD_ADDRESS",
        value: "ADDR",
        default: Fallback::Text("169.254.0.21"),
        help: "servers listening only on `127.0.0.1` or `::1` are forwarded to this address, same \
               port (`off`: no forwarding; an address on no interface is waited for)",
    },
    parse: |flag, text| match text {
        "off" => Ok(None),
        text => text
            .parse()
            .map(Some)
            .map_err(|_| format!("{flag}: '{text}' is neither an IP address nor 'off'")),
    },
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
               orchestrator's `X-Envd-Upgrade-Bin`, envd's path or this one, means it)",
    },
    parse: |flag, text| absolute_path(flag, text),
    absent: None,
};

pub const FORWARD_MAX_PORTS: Setting<usize> = Setting {
    opt: Opt {
        flag: Some("--forward-max-ports"),
        env: "SANDBOXD_FORWARD_MAX_PORTS",
        value: "N",
        default: Fallback::Text("64"),
        help: "most ports forwarded at once; more are logged and left out",
    },
    parse: |flag, text| parse_count(flag, text, 65_535),
    absent: None,
};

pub const FORWARD_MAX_CONNECTIONS: Setting<usize> = Setting {
    opt: Opt {
        flag: Some("--forward-max-connections"),
        env: "SANDBOXD_FORWARD_MAX_CONNECTIONS",
        value: "N",
        default: Fallback::Text("1024"),
        help: "most connections open through one forwarded port; more are closed at once and \
               logged",
    },
    parse: |flag, text| parse_count(flag, text, 1 << 20),
    absent: None,
};

fn parse_count(flag: &str, text: &str, max: usize) -> Result<usize, String> {
    text.parse()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| format!("{flag} must be between 1 and {max}, not '{text}'"))
}

/// Four workers per CPU: they block on disks and slow clients, not only on the CPU.
pub fn default_workers() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cpus * 4).clamp(4, 64)
}

pub fn parse_addr(flag: &str, text: &str) -> Result<SocketAddr, String> {
    text.parse()
        .map_err(|_| format!("{flag}: '{text}' is not an address like 127.0.0.1:49983"))
}

/// The value of a switch: `1`/`true` or `0`/`false`.
pub fn parse_switch(flag: &str, text: &str) -> Result<bool, String> {
    match text {
        "1" | "true" => Ok(true),
        "0" | "false" => Ok(false),
        _ => Err(format!("{flag} is 1, true, 0 or false, not '{text}'")),
    }
}

fn parse_workers(text: &str) -> Result<usize, String> {
    text.parse()
        .ok()
        .filter(|n| (1..=1024).contains(n))
        .ok_or_else(|| format!("--workers must be between 1 and 1024, not '{text}'"))
}

fn parse_seconds(flag: &str, text: &str) -> Result<Duration, String> {
    text.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0 && *s <= 86_400.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{flag} must be a number of seconds in (0, 86400], not '{text}'"))
}

fn non_empty_path(text: &str) -> Result<PathBuf, String> {
    if text.is_empty() {
        Err("a path option must not be empty".into())
    } else {
        Ok(PathBuf::from(text))
    }
}

fn absolute_path(flag: &str, text: &str) -> Result<PathBuf, String> {
    if text.starts_with('/') {
        Ok(PathBuf::from(text))
    } else {
        Err(format!("{flag} must be an absolute path, not '{text}'"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_variables_are_unique_and_well_formed() {
        for (i, opt) in OPTIONS.iter().enumerate() {
            assert!(opt.env.starts_with("SANDBOXD_"), "{}", opt.env);
            assert!(opt.flag.is_none_or(|f| f.starts_with("--")), "{}", opt.env);
            for other in &OPTIONS[i + 1..] {
                assert_ne!(opt.env, other.env);
                assert!(
                    opt.flag.is_none() || opt.flag != other.flag,
                    "{}",
                    opt.name()
                );
            }
        }
    }

    #[test]
    fn a_default_given_as_text_is_parsed_like_a_value() {
        assert_eq!(
            LISTEN.read(None).unwrap(),
            "0.0.0.0:49983".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(IDLE_TIMEOUT.read(None).unwrap(), Duration::from_secs(640));
        assert_eq!(WORKERS.read(None).unwrap(), default_workers());
        assert_eq!(WORKERS.read(Some("7")).unwrap(), 7);
        assert_eq!(DEFAULT_WORKDIR.read(Some("")).unwrap(), None);
        assert!(!FS_AS_USER.read(None).unwrap());
        assert!(FS_AS_USER.read(Some("true")).unwrap());
        assert!(FS_AS_USER.read(Some("yes")).is_err());
        assert_eq!(LOG_FORMAT.read(None), Ok(crate::log::Format::Text));
        assert_eq!(LOG_FORMAT.read(Some("json")), Ok(crate::log::Format::Json));
        assert_eq!(
            LOG_FORMAT.read(Some("JSON")),
            Err("--log-format must be text or json, not 'JSON'".into())
        );
    }

    #[test]
    fn process_cgroups_is_off_a_path_or_the_daemons_own() {
        assert_eq!(PROCESS_CGROUPS.read(None).unwrap(), ProcessCgroups::Own);
        assert_eq!(
            PROCESS_CGROUPS.read(Some("off")).unwrap(),
            ProcessCgroups::Off
        );
        assert_eq!(
            PROCESS_CGROUPS.read(Some("/sys/fs/cgroup/x")).unwrap(),
            ProcessCgroups::At("/sys/fs/cgroup/x".into())
        );
        assert_eq!(
            PROCESS_CGROUPS.read(Some("x")).unwrap_err(),
            "--process-cgroups must be an absolute path, not 'x'"
        );
        assert_eq!(FSFREEZE_PATH.read(None).unwrap(), PathBuf::from("/"));
        assert_eq!(THAW_WATCHDOG.read(None).unwrap(), Duration::from_secs(600));
        assert_eq!(
            FORWARD_ADDRESS.read(None).unwrap(),
            Some(IpAddr::from([169, 254, 0, 21]))
        );
        assert_eq!(FORWARD_ADDRESS.read(Some("off")).unwrap(), None);
        assert_eq!(
            FORWARD_ADDRESS.read(Some("::1")).unwrap(),
            Some(IpAddr::from(std::net::Ipv6Addr::LOCALHOST))
        );
        assert!(FORWARD_ADDRESS.read(Some("localhost")).is_err());
        assert_eq!(FORWARD_MAX_PORTS.read(Some("3")).unwrap(), 3);
        assert!(FORWARD_MAX_CONNECTIONS.read(Some("0")).is_err());
    }
}
