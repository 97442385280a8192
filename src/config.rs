//! Command line and environment: what to run and with which settings (SPEC §1).
//!
//! Every daemon flag has a `SANDBOXD_*` variable; the flag wins. The options themselves, their
//! defaults and their help are one table (`options`); `usage` renders `--help` and docs/usage.md's
//! table from it. Parsing is pure (arguments and an environment lookup in, a [`Command`] or a
//! one-line error out) so tests feed it literals.

mod envd;
mod options;
mod usage;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use envd::{EnvdFlags, COMMIT};
pub use options::{ProcessCgroups, ACCESS_TOKEN, ACCESS_TOKEN_FILE};
pub use usage::{help, sign_help};

use options::{
    Setting, BODY_TIMEOUT, CGROUP_ROOT, DEFAULT_USER, DEFAULT_WORKDIR, DRAIN_TIMEOUT,
    FORWARD_ADDRESS, FORWARD_MAX_CONNECTIONS, FORWARD_MAX_PORTS, FSFREEZE_PATH, FS_AS_USER,
    HEADER_TIMEOUT, IDLE_TIMEOUT, INIT_TOKEN_HASH_FILE, LISTEN, LOG_FORMAT, MMDS_ADDRESS, OPTIONS,
    PASSWD_FILE, PROCESS_CGROUPS, PROC_ROOT, SEND_TIMEOUT, SYSTEM_ROOT, THAW_WATCHDOG,
    UPGRADE_PATH, WORKERS,
};

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub listen: SocketAddr,
    pub access_token_file: Option<PathBuf>,
    /// File holding the lower-case hex SHA-256 of a token the host authorises `/init` to set
    /// without the current one (SPEC §9); read on every `/init` that needs it.
    pub init_token_hash_file: Option<PathBuf>,
    pub default_user: String,
    pub default_workdir: Option<PathBuf>,
    pub passwd_file: PathBuf,
    pub workers: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub drain_timeout: Duration,
    pub send_timeout: Duration,
    pub body_timeout: Duration,
    pub proc_root: PathBuf,
    pub cgroup_root: PathBuf,
    /// `--system-root`: the directory standing for `/` when the daemon writes system files.
    pub system_root: PathBuf,
    /// `--mmds-address`: the metadata service to read, if any (`crate::mmds`).
    pub mmds_address: Option<SocketAddr>,
    /// `--fs-as-user`: file routes and filesystem calls run with the caller's credentials.
    pub fs_as_user: bool,
    /// `--log-format`: how lines are written on stderr.
    pub log_format: crate::log::Format,
    /// `--upgrade-path`: where `/upgrade` puts the new binary.
    pub upgrade_path: PathBuf,
    /// `--process-cgroups` (envd's `-cgroup-root`; `-no-cgroups` is `Off`).
    pub process_cgroups: ProcessCgroups,
    /// `--fsfreeze-path`: a path on the filesystem `/fsfreeze` freezes.
    pub fsfreeze_path: PathBuf,
    /// `--thaw-watchdog`: how long a freeze nobody ends lasts.
    pub thaw_watchdog: Duration,
    /// `--forward-address` (`None`: off) and the forwarder's caps (SPEC §11).
    pub forward_address: Option<std::net::IpAddr>,
    pub forward_max_ports: usize,
    pub forward_max_connections: usize,
    /// envd's flags as given (`envd`); `-port` and `-isnotfc` are already folded into `listen`
    /// and `mmds_address`, the others only change what start-up logs.
    pub envd: EnvdFlags,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SignRequest {
    pub path: String,
    pub username: String,
    pub write: bool,
    pub expires_in: i64,
    pub version: u8,
    pub base_url: String,
    pub access_token_file: Option<PathBuf>,
    /// `--format tar`: the URL asks for the directory's archive (SPEC §6a, §8a).
    pub tar: bool,
}

// Parsed once at start and taken apart at once: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Serve(Config),
    Help,
    Version,
    /// Go-style `-version`: print the bare envd API level (E2B's template builder runs it).
    EnvdVersion,
    /// envd's `-commit`: print the source commit ([`COMMIT`]).
    Commit,
    /// `--handover-schema`: print the highest live-upgrade handover layout this build reads
    /// (`upgrade::state::SCHEMA`); `/upgrade` asks a new binary before it hands over.
    HandoverSchema,
    /// Probe `/health` at the first of these addresses that accepts (the target as given, and
    /// its addresses); exit 0 when it answers 204.
    Healthcheck(String, Vec<SocketAddr>),
    Sign(SignRequest),
    /// `sign --help`: the sign options.
    SignHelp,
}

/// Parses the arguments; `program` is argv[0] (under the name `envd` the metadata service has
/// envd's default address, SPEC §1), `env` looks up environment variables.
pub fn parse(
    program: &str,
    args: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Command, String> {
    match args.first().map(String::as_str) {
        Some("--help" | "-h" | "-help") => return Ok(Command::Help),
        Some("--version" | "-V") => return Ok(Command::Version),
        Some("-version") => return Ok(Command::EnvdVersion),
        Some("--handover-schema") => return Ok(Command::HandoverSchema),
        Some(first) if envd::is_commit(first) => return Ok(Command::Commit),
        Some("sign") => return parse_sign(&args[1..], env),
        Some("--healthcheck") => {
            let config = parse_serve(program, &[], env)?;
            return match &args[1..] {
                [] => {
                    let addr = local_address(config.listen);
                    Ok(Command::Healthcheck(addr.to_string(), vec![addr]))
                }
                [target] => Ok(Command::Healthcheck(target.clone(), health_target(target)?)),
                _ => Err("--healthcheck takes at most one address".into()),
            };
        }
        _ => {}
    }
    parse_serve(program, args, env).map(Command::Serve)
}

fn parse_serve(
    program: &str,
    args: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, String> {
    let given = Given::collect(args, env)?;
    let envd = given.envd.clone();
    let listen = match envd.port {
        Some(_) if given.has_flag(&LISTEN) => {
            return Err("-port and --listen both say where to listen: give one".into())
        }
        Some(port) => SocketAddr::from(([0, 0, 0, 0], port)),
        None => given.read(&LISTEN)?,
    };
    let mmds_address = if !envd.is_not_fc {
        crate::mmds::envd_default_address(program, given.read(&MMDS_ADDRESS)?, false)
    } else if given.has_flag(&MMDS_ADDRESS) {
        return Err(
            "-isnotfc says there is no metadata service, --mmds-address names one: give one".into(),
        );
    } else {
        // The flag wins over SANDBOXD_MMDS_ADDRESS, as every flag wins over its variable.
        None
    };
    Ok(Config {
        listen,
        access_token_file: given.read(&ACCESS_TOKEN_FILE)?,
        init_token_hash_file: given.read(&INIT_TOKEN_HASH_FILE)?,
        default_user: given.read(&DEFAULT_USER)?,
        default_workdir: given.read(&DEFAULT_WORKDIR)?,
        passwd_file: given.read(&PASSWD_FILE)?,
        workers: given.read(&WORKERS)?,
        header_timeout: given.read(&HEADER_TIMEOUT)?,
        idle_timeout: given.read(&IDLE_TIMEOUT)?,
        drain_timeout: given.read(&DRAIN_TIMEOUT)?,
        send_timeout: given.read(&SEND_TIMEOUT)?,
        body_timeout: given.read(&BODY_TIMEOUT)?,
        proc_root: given.read(&PROC_ROOT)?,
        cgroup_root: given.read(&CGROUP_ROOT)?,
        system_root: given.read(&SYSTEM_ROOT)?,
        mmds_address,
        fs_as_user: given.read(&FS_AS_USER)?,
        log_format: given.read(&LOG_FORMAT)?,
        upgrade_path: given.read(&UPGRADE_PATH)?,
        process_cgroups: if envd.no_cgroups {
            ProcessCgroups::Off
        } else {
            given.read(&PROCESS_CGROUPS)?
        },
        fsfreeze_path: given.read(&FSFREEZE_PATH)?,
        thaw_watchdog: given.read(&THAW_WATCHDOG)?,
        forward_address: given.read(&FORWARD_ADDRESS)?,
        forward_max_ports: given.read(&FORWARD_MAX_PORTS)?,
        forward_max_connections: given.read(&FORWARD_MAX_CONNECTIONS)?,
        envd,
    })
}

/// The values the command line gives, one per row of [`OPTIONS`], and the environment.
struct Given<'a> {
    flags: Vec<Option<String>>,
    envd: EnvdFlags,
    env: &'a dyn Fn(&str) -> Option<String>,
}

impl<'a> Given<'a> {
    fn collect(args: &[String], env: &'a dyn Fn(&str) -> Option<String>) -> Result<Self, String> {
        let mut flags = vec![None; OPTIONS.len()];
        let mut envd = EnvdFlags::default();
        let mut rest = args.iter();
        while let Some(arg) = rest.next() {
            let (name, inline) = match arg.split_once('=') {
                Some((name, value)) if name.starts_with('-') => (name, Some(value.to_string())),
                _ => (arg.as_str(), None),
            };
            if matches!(
                name,
                "--help" | "--version" | "-version" | "--healthcheck" | "--handover-schema"
            ) || envd::is_commit(name)
            {
                return Err(format!("{name} must come first"));
            }
            if envd::take(name, inline.as_deref(), &mut rest, &mut envd)? {
                continue;
            }
            let name = envd::alias(name);
            let slot = OPTIONS
                .iter()
                .zip(flags.iter_mut())
                .find_map(|(opt, slot)| (opt.flag == Some(name)).then_some(slot))
                .ok_or_else(|| format!("unknown argument '{arg}'"))?;
            let value = match inline {
                Some(value) => value,
                // A switch (no value placeholder): the flag alone turns it on.
                None if is_switch(name) => "1".to_string(),
                None => rest
                    .next()
                    .cloned()
                    .ok_or_else(|| format!("{name} needs a value"))?,
            };
            *slot = Some(value);
        }
        Ok(Given { flags, envd, env })
    }

    /// Whether the setting's flag is on the command line.
    fn has_flag<T>(&self, setting: &Setting<T>) -> bool {
        OPTIONS
            .iter()
            .zip(&self.flags)
            .any(|(opt, flag)| opt.env == setting.opt.env && flag.is_some())
    }

    /// The setting's value from its flag, else its variable, else its default. The variable is
    /// looked up only when the flag is absent, so a bad value there is no error then.
    fn read<T>(&self, setting: &Setting<T>) -> Result<T, String> {
        let env = setting.opt.env;
        let flag = OPTIONS
            .iter()
            .zip(&self.flags)
            .find_map(|(opt, flag)| (opt.env == env).then_some(flag))
            .ok_or_else(|| format!("{env} is missing from the option table"))?;
        match flag {
            Some(text) => setting.read(Some(text)),
            None => setting.read((self.env)(env).as_deref()),
        }
    }
}

/// Whether the option with flag `name` takes no value.
fn is_switch(name: &str) -> bool {
    OPTIONS
        .iter()
        .any(|opt| opt.flag == Some(name) && opt.value.is_empty())
}

fn parse_sign(args: &[String], env: &dyn Fn(&str) -> Option<String>) -> Result<Command, String> {
    let mut request = SignRequest {
        path: String::new(),
        username: String::new(),
        write: false,
        expires_in: 3600,
        version: 2,
        base_url: "http://127.0.0.1:49983".into(),
        access_token_file: env(ACCESS_TOKEN_FILE.opt.env).map(PathBuf::from),
        tar: false,
    };
    let mut path = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let mut value = |name: &str| {
            rest.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match arg.as_str() {
            "--username" => request.username = value(arg)?,
            "--operation" => {
                request.write = match value(arg)?.as_str() {
                    "read" => false,
                    "write" => true,
                    other => {
                        return Err(format!("--operation must be read or write, not '{other}'"))
                    }
                }
            }
            "--expires-in" => {
                let text = value(arg)?;
                request.expires_in = text.parse().ok().filter(|s| *s > 0).ok_or_else(|| {
                    format!("--expires-in must be a positive number of seconds, not '{text}'")
                })?;
            }
            "--v1" => request.version = 1,
            "--format" => {
                request.tar = match value(arg)?.as_str() {
                    "tar" => true,
                    other => return Err(format!("--format must be tar, not '{other}'")),
                }
            }
            "--url" => request.base_url = value(arg)?.trim_end_matches('/').to_string(),
            "--access-token-file" => request.access_token_file = Some(PathBuf::from(value(arg)?)),
            "--help" | "-h" | "-help" => return Ok(Command::SignHelp),
            other if other.starts_with("--") => {
                return Err(format!("unknown sign option '{other}'"))
            }
            other if path.is_none() => path = Some(other.to_string()),
            other => return Err(format!("unexpected argument '{other}'")),
        }
    }
    request.path = path.ok_or("sign needs a PATH")?;
    Ok(Command::Sign(request))
}

/// `--healthcheck`'s target: an address (`127.0.0.1:49983`, `[::1]:49983`) or `localhost:PORT`
/// (`127.0.0.1` then `::1`). Names are not resolved otherwise: the resolver would cost the
/// binary 24 KB for a probe that runs beside the daemon.
fn health_target(text: &str) -> Result<Vec<SocketAddr>, String> {
    if let Ok(addr) = text.parse() {
        return Ok(vec![addr]);
    }
    match text.rsplit_once(':') {
        Some((host, port)) if host.eq_ignore_ascii_case("localhost") => match port.parse() {
            Ok(port) => Ok(vec![
                SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), port),
                SocketAddr::new(std::net::Ipv6Addr::LOCALHOST.into(), port),
            ]),
            Err(_) => Err(health_error(text)),
        },
        _ => Err(health_error(text)),
    }
}

fn health_error(text: &str) -> String {
    format!("--healthcheck: '{text}' is not an address like 127.0.0.1:49983 or localhost:49983")
}

/// The address to probe a daemon listening on `listen`: a wildcard becomes loopback.
fn local_address(listen: SocketAddr) -> SocketAddr {
    let mut addr = listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    addr
}

#[cfg(test)]
mod tests {
    use super::options::default_workers;
    use super::*;

    pub(crate) fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    pub(crate) fn no_env(_: &str) -> Option<String> {
        None
    }

    /// The configuration `list` gives a program named `program` (the tests of `envd` too).
    pub(crate) fn serve_as(
        program: &str,
        list: &[&str],
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Config {
        match parse(program, &args(list), env) {
            Ok(Command::Serve(config)) => config,
            other => panic!("{list:?}: {other:?}"),
        }
    }

    fn serve(list: &[&str], env: &dyn Fn(&str) -> Option<String>) -> Config {
        serve_as("sandboxd", list, env)
    }

    #[test]
    fn defaults() {
        let config = serve(&[], &no_env);
        assert_eq!(config.listen, "0.0.0.0:49983".parse().unwrap());
        assert_eq!(config.default_user, "root");
        assert_eq!(config.passwd_file, PathBuf::from("/etc/passwd"));
        assert_eq!(config.header_timeout, Duration::from_secs(10));
        assert_eq!(config.idle_timeout, Duration::from_secs(640));
        assert_eq!(config.init_token_hash_file, None);
        assert_eq!(config.drain_timeout, Duration::from_secs(10));
        assert_eq!(config.workers, default_workers());
        assert_eq!(config.default_workdir, None);
        assert!(!config.fs_as_user);
    }

    #[test]
    fn fs_as_user_is_a_switch() {
        let on = |name: &str| (name == "SANDBOXD_FS_AS_USER").then(|| "1".to_string());
        assert!(serve(&[], &on).fs_as_user);
        assert!(!serve(&["--fs-as-user=false"], &on).fs_as_user);
        let config = serve(&["--fs-as-user", "--workers", "2"], &no_env);
        assert!(config.fs_as_user);
        assert_eq!(config.workers, 2);
        let error = parse("sandboxd", &args(&["--fs-as-user=yes"]), &no_env)
            .err()
            .unwrap();
        assert_eq!(error, "--fs-as-user is 1, true, 0 or false, not 'yes'");
    }

    #[test]
    fn flag_wins_over_environment() {
        let env = |name: &str| match name {
            "SANDBOXD_LISTEN" => Some("127.0.0.1:1".to_string()),
            "SANDBOXD_WORKERS" => Some("3".to_string()),
            _ => None,
        };
        let config = serve(&["--listen", "127.0.0.1:2", "--idle-timeout=0.5"], &env);
        assert_eq!(config.listen, "127.0.0.1:2".parse().unwrap());
        assert_eq!(config.workers, 3);
        assert_eq!(config.idle_timeout, Duration::from_millis(500));
    }

    #[test]
    fn bad_values_are_one_line_errors() {
        for bad in [
            &["--listen", "nowhere"][..],
            &["--workers", "0"],
            &["--workers", "many"],
            &["--header-timeout", "-1"],
            &["--idle-timeout", "NaN"],
            &["--default-workdir", "relative"],
            &["--bogus"],
            &["--listen"],
        ] {
            let error = parse("sandboxd", &args(bad), &no_env).unwrap_err();
            assert!(
                !error.contains('\n') && !error.is_empty(),
                "{bad:?}: {error}"
            );
        }
    }

    #[test]
    fn go_style_version_and_the_init_token_hash_file() {
        assert_eq!(
            parse("sandboxd", &args(&["-version"]), &no_env).unwrap(),
            Command::EnvdVersion
        );
        assert_eq!(
            parse("sandboxd", &args(&["--version"]), &no_env).unwrap(),
            Command::Version
        );
        assert_eq!(
            parse("sandboxd", &args(&["--handover-schema"]), &no_env).unwrap(),
            Command::HandoverSchema
        );
        assert!(parse(
            "sandboxd",
            &args(&["-p", "1", "--handover-schema"]),
            &no_env
        )
        .is_err());
        assert!(parse(
            "sandboxd",
            &args(&["--listen", "127.0.0.1:1", "-version"]),
            &no_env
        )
        .is_err());
        let env = |name: &str| {
            (name == "SANDBOXD_INIT_TOKEN_HASH_FILE").then(|| "/run/from-env".to_string())
        };
        let config = serve(&[], &env);
        assert_eq!(
            config.init_token_hash_file,
            Some(PathBuf::from("/run/from-env"))
        );
        let config = serve(&["--init-token-hash-file", "/run/flag"], &env);
        assert_eq!(
            config.init_token_hash_file,
            Some(PathBuf::from("/run/flag"))
        );
        assert!(parse("sandboxd", &args(&["--init-token-hash-file", ""]), &no_env).is_err());
    }

    #[test]
    fn the_metadata_service_is_off_unless_given() {
        assert_eq!(serve(&[], &no_env).mmds_address, None);
        let env = |name: &str| (name == "SANDBOXD_MMDS_ADDRESS").then(|| "127.0.0.1:7".to_string());
        assert_eq!(
            serve(&[], &env).mmds_address,
            Some("127.0.0.1:7".parse().unwrap())
        );
        assert_eq!(
            serve(&["--mmds-address", "127.0.0.1:8"], &env).mmds_address,
            Some("127.0.0.1:8".parse().unwrap())
        );
        assert!(parse(
            "sandboxd",
            &args(&["--mmds-address", "169.254.169.254"]),
            &no_env
        )
        .is_err());
        assert!(parse("sandboxd", &args(&["--mmds-address", ""]), &no_env).is_err());
    }

    #[test]
    fn healthcheck_defaults_to_loopback_of_the_listen_port() {
        assert_eq!(
            parse("sandboxd", &args(&["--healthcheck"]), &no_env).unwrap(),
            Command::Healthcheck(
                "127.0.0.1:49983".into(),
                vec!["127.0.0.1:49983".parse().unwrap()]
            )
        );
        assert_eq!(
            parse(
                "sandboxd",
                &args(&["--healthcheck", "127.0.0.1:5"]),
                &no_env
            )
            .unwrap(),
            Command::Healthcheck("127.0.0.1:5".into(), vec!["127.0.0.1:5".parse().unwrap()])
        );
        for (target, addrs) in [
            ("localhost:49983", &["127.0.0.1:49983", "[::1]:49983"][..]),
            ("LOCALHOST:1", &["127.0.0.1:1", "[::1]:1"]),
            ("[::1]:7", &["[::1]:7"]),
        ] {
            let addrs = addrs.iter().map(|a| a.parse().unwrap()).collect();
            assert_eq!(
                parse("sandboxd", &args(&["--healthcheck", target]), &no_env).unwrap(),
                Command::Healthcheck(target.into(), addrs)
            );
        }
        for bad in [
            "bogus",
            "localhost",
            "localhost:",
            ":80",
            "a b:80",
            "host:99999",
        ] {
            let error = parse("sandboxd", &args(&["--healthcheck", bad]), &no_env).unwrap_err();
            assert_eq!(
                error,
                format!(
                    "--healthcheck: '{bad}' is not an address like 127.0.0.1:49983 or \
                     localhost:49983"
                )
            );
        }
    }

    #[test]
    fn sign_help_is_the_sign_options() {
        for flag in ["--help", "-h"] {
            assert_eq!(
                parse("sandboxd", &args(&["sign", flag]), &no_env).unwrap(),
                Command::SignHelp
            );
        }
        assert_eq!(
            parse("sandboxd", &args(&["sign", "/a", "--help"]), &no_env).unwrap(),
            Command::SignHelp
        );
    }

    #[test]
    fn sign_options() {
        let Command::Sign(request) = parse(
            "sandboxd",
            &args(&[
                "sign",
                "/tmp/a b",
                "--username",
                "user",
                "--operation",
                "write",
                "--v1",
            ]),
            &no_env,
        )
        .unwrap() else {
            panic!("not sign")
        };
        assert_eq!(request.path, "/tmp/a b");
        assert_eq!(request.username, "user");
        assert!(request.write);
        assert_eq!(request.version, 1);
        assert!(parse("sandboxd", &args(&["sign"]), &no_env).is_err());
        assert!(parse(
            "sandboxd",
            &args(&["sign", "a", "--operation", "delete"]),
            &no_env
        )
        .is_err());
    }
}
