//! The option table: every daemon option once, with its flag, environment variable, value
//! placeholder, default, help sentence and parser. `Config` is built from it (`super`), and
//! `--help` and docs/usage.md's configuration table are rendered from it (`super::usage`).
//!
//! An option that fills a `Config` field is a [`Setting`]: its row ([`Opt`]) and the parser of
//! its text. Code reads a setting through its constant (`LISTEN`), never through a flag string,
//! so a misspelt option does not compile. A default is either text, parsed like a given value
//! (so the default users read is the default they get), or words for a computed or absent
//! value, which the setting's `absent` gives.
//!
//! This module holds the table's types and its order; the settings are grouped by what they
//! configure (`server`, `users`, `system`, `forward`), with the parsers of their values
//! (`parse`).

mod forward;
mod parse;
mod server;
mod system;
mod users;

pub use forward::{FORWARD_ADDRESS, FORWARD_MAX_CONNECTIONS, FORWARD_MAX_PORTS};
#[cfg(test)]
pub use parse::default_workers;
pub use server::{
    ACCESS_TOKEN, ACCESS_TOKEN_FILE, BODY_TIMEOUT, DRAIN_TIMEOUT, HEADER_TIMEOUT, IDLE_TIMEOUT,
    INIT_TOKEN_HASH_FILE, LISTEN, LOG_FORMAT, SEND_TIMEOUT, WORKERS,
};
pub use system::{
    ProcessCgroups, CGROUP_ROOT, FSFREEZE_PATH, MMDS_ADDRESS, PROCESS_CGROUPS, PROC_ROOT,
    SYSTEM_ROOT, THAW_WATCHDOG, UPGRADE_PATH,
};
pub use users::{DEFAULT_USER, DEFAULT_WORKDIR, FS_AS_USER, PASSWD_FILE};

/// What users read about one option: one line of `--help`, one row of docs/usage.md's table.
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

/// Every option, in the order `--help` and docs/usage.md list them.
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, SocketAddr};
    use std::path::PathBuf;
    use std::time::Duration;

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
    fn process_cgroups_is_off_a_path_or_the_cgroup_root() {
        assert_eq!(PROCESS_CGROUPS.read(None).unwrap(), ProcessCgroups::Root);
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
