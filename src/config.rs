//! Command line and environment: what to run and with which settings (SPEC §1).
//!
//! Every daemon flag has a `SANDBOXD_*` variable; the flag wins. Parsing is pure (arguments and
//! an environment lookup in, a [`Command`] or a one-line error out) so tests feed it literals.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub const DEFAULT_LISTEN: &str = "0.0.0.0:49983";

/// Idle keep-alive connections live this long (SPEC §1, §10): envd's 640 s, above the 620 s for
/// which E2B's orchestrator proxy keeps an idle pooled connection to the sandbox, so the proxy
/// always closes first and never sends a request on a connection sandboxd is closing.
pub const DEFAULT_IDLE_TIMEOUT_SECS: f64 = 640.0;

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
}

#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Serve(Config),
    Help,
    Version,
    /// Go-style `-version`: print the bare envd API level (E2B's template builder runs it).
    EnvdVersion,
    /// Probe `/health` at this address; exit 0 when it answers 204.
    Healthcheck(SocketAddr),
    Sign(SignRequest),
}

pub const USAGE: &str = "\
sandboxd: the HTTP daemon inside a sandbox (files, compose, metrics, environment)

Usage:
  sandboxd [OPTIONS]                 serve
  sandboxd --healthcheck [ADDR]      probe a running daemon's /health; exit 0 if healthy
  sandboxd sign PATH [SIGN OPTIONS]  print a signed download/upload URL
  sandboxd --help | --version
  sandboxd -version                  print only the envd API level implemented (as envd does)

Options (each also read from the environment variable shown; the flag wins):
  --listen ADDR             SANDBOXD_LISTEN             [0.0.0.0:49983]
  --access-token-file PATH  SANDBOXD_ACCESS_TOKEN_FILE  token file (or SANDBOXD_ACCESS_TOKEN)
  --init-token-hash-file PATH  SANDBOXD_INIT_TOKEN_HASH_FILE
                            hex SHA-256 of a token /init may set without the current one
  --default-user NAME       SANDBOXD_DEFAULT_USER       [root]
  --default-workdir PATH    SANDBOXD_DEFAULT_WORKDIR    [the user's home]
  --passwd-file PATH        SANDBOXD_PASSWD_FILE        [/etc/passwd]
  --workers N               SANDBOXD_WORKERS            [4 x CPUs, 4..64]
  --header-timeout SECS     SANDBOXD_HEADER_TIMEOUT     [10]
  --idle-timeout SECS       SANDBOXD_IDLE_TIMEOUT       [640]
  --drain-timeout SECS      SANDBOXD_DRAIN_TIMEOUT      [10]
  --send-timeout SECS       SANDBOXD_SEND_TIMEOUT       [30] stalled reader of a response
  --body-timeout SECS       SANDBOXD_BODY_TIMEOUT       [30] stalled sender of a request body
  --proc-root PATH          SANDBOXD_PROC_ROOT          [/proc]
  --cgroup-root PATH        SANDBOXD_CGROUP_ROOT        [/sys/fs/cgroup]

Sign options (token from SANDBOXD_ACCESS_TOKEN or --access-token-file):
  --username NAME   --operation read|write [read]   --expires-in SECS [3600]
  --v1 (envd-compatible signature)   --url BASE [http://127.0.0.1:49983]
";

/// Daemon options: flag name, environment variable.
const OPTIONS: &[(&str, &str)] = &[
    ("--listen", "SANDBOXD_LISTEN"),
    ("--access-token-file", "SANDBOXD_ACCESS_TOKEN_FILE"),
    ("--init-token-hash-file", "SANDBOXD_INIT_TOKEN_HASH_FILE"),
    ("--default-user", "SANDBOXD_DEFAULT_USER"),
    ("--default-workdir", "SANDBOXD_DEFAULT_WORKDIR"),
    ("--passwd-file", "SANDBOXD_PASSWD_FILE"),
    ("--workers", "SANDBOXD_WORKERS"),
    ("--header-timeout", "SANDBOXD_HEADER_TIMEOUT"),
    ("--idle-timeout", "SANDBOXD_IDLE_TIMEOUT"),
    ("--drain-timeout", "SANDBOXD_DRAIN_TIMEOUT"),
    ("--send-timeout", "SANDBOXD_SEND_TIMEOUT"),
    ("--body-timeout", "SANDBOXD_BODY_TIMEOUT"),
    ("--proc-root", "SANDBOXD_PROC_ROOT"),
    ("--cgroup-root", "SANDBOXD_CGROUP_ROOT"),
];

/// Parses the arguments (without the program name); `env` looks up environment variables.
pub fn parse(args: &[String], env: &dyn Fn(&str) -> Option<String>) -> Result<Command, String> {
    match args.first().map(String::as_str) {
        Some("--help" | "-h") => return Ok(Command::Help),
        Some("--version" | "-V") => return Ok(Command::Version),
        Some("-version") => return Ok(Command::EnvdVersion),
        Some("sign") => return parse_sign(&args[1..], env),
        Some("--healthcheck") => {
            let config = parse_serve(&[], env)?;
            return match &args[1..] {
                [] => Ok(Command::Healthcheck(local_address(config.listen))),
                [addr] => Ok(Command::Healthcheck(parse_addr("--healthcheck", addr)?)),
                _ => Err("--healthcheck takes at most one address".into()),
            };
        }
        _ => {}
    }
    parse_serve(args, env).map(Command::Serve)
}

fn parse_serve(args: &[String], env: &dyn Fn(&str) -> Option<String>) -> Result<Config, String> {
    let mut values: Vec<Option<String>> = OPTIONS.iter().map(|(_, var)| env(var)).collect();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_string())),
            _ => (arg.as_str(), None),
        };
        if matches!(name, "--help" | "--version" | "-version" | "--healthcheck") {
            return Err(format!("{name} must come first"));
        }
        let index = OPTIONS
            .iter()
            .position(|(flag, _)| *flag == name)
            .ok_or_else(|| format!("unknown argument '{arg}'"))?;
        let value = match inline {
            Some(value) => value,
            None => rest
                .next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))?,
        };
        values[index] = Some(value);
    }
    let value = |flag: &str| -> Option<&str> {
        let index = OPTIONS.iter().position(|(f, _)| *f == flag)?;
        values[index].as_deref()
    };
    let seconds = |flag: &str, default: f64| -> Result<Duration, String> {
        value(flag).map_or(Ok(Duration::from_secs_f64(default)), |v| {
            parse_seconds(flag, v)
        })
    };
    Ok(Config {
        listen: parse_addr("--listen", value("--listen").unwrap_or(DEFAULT_LISTEN))?,
        access_token_file: value("--access-token-file")
            .map(non_empty_path)
            .transpose()?,
        init_token_hash_file: value("--init-token-hash-file")
            .map(non_empty_path)
            .transpose()?,
        default_user: match value("--default-user") {
            None => "root".into(),
            Some("") => return Err("--default-user must not be empty".into()),
            Some(user) => user.into(),
        },
        default_workdir: value("--default-workdir")
            .filter(|v| !v.is_empty())
            .map(|v| absolute_path("--default-workdir", v))
            .transpose()?,
        passwd_file: non_empty_path(value("--passwd-file").unwrap_or("/etc/passwd"))?,
        workers: value("--workers").map_or(Ok(default_workers()), parse_workers)?,
        header_timeout: seconds("--header-timeout", 10.0)?,
        idle_timeout: seconds("--idle-timeout", DEFAULT_IDLE_TIMEOUT_SECS)?,
        drain_timeout: seconds("--drain-timeout", 10.0)?,
        send_timeout: seconds("--send-timeout", 30.0)?,
        body_timeout: seconds("--body-timeout", 30.0)?,
        proc_root: non_empty_path(value("--proc-root").unwrap_or("/proc"))?,
        cgroup_root: non_empty_path(value("--cgroup-root").unwrap_or("/sys/fs/cgroup"))?,
    })
}

fn parse_sign(args: &[String], env: &dyn Fn(&str) -> Option<String>) -> Result<Command, String> {
    let mut request = SignRequest {
        path: String::new(),
        username: String::new(),
        write: false,
        expires_in: 3600,
        version: 2,
        base_url: "http://127.0.0.1:49983".into(),
        access_token_file: env("SANDBOXD_ACCESS_TOKEN_FILE").map(PathBuf::from),
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
            "--url" => request.base_url = value(arg)?.trim_end_matches('/').to_string(),
            "--access-token-file" => request.access_token_file = Some(PathBuf::from(value(arg)?)),
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

/// Four workers per CPU: they block on disks and slow clients, not only on the CPU.
pub fn default_workers() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cpus * 4).clamp(4, 64)
}

fn parse_addr(flag: &str, text: &str) -> Result<SocketAddr, String> {
    text.parse()
        .map_err(|_| format!("{flag}: '{text}' is not an address like 127.0.0.1:49983"))
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

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn serve(list: &[&str], env: &dyn Fn(&str) -> Option<String>) -> Config {
        match parse(&args(list), env) {
            Ok(Command::Serve(config)) => config,
            other => panic!("{other:?}"),
        }
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
            let error = parse(&args(bad), &no_env).unwrap_err();
            assert!(
                !error.contains('\n') && !error.is_empty(),
                "{bad:?}: {error}"
            );
        }
    }

    #[test]
    fn go_style_version_and_the_init_token_hash_file() {
        assert_eq!(
            parse(&args(&["-version"]), &no_env).unwrap(),
            Command::EnvdVersion
        );
        assert_eq!(
            parse(&args(&["--version"]), &no_env).unwrap(),
            Command::Version
        );
        assert!(parse(&args(&["--listen", "127.0.0.1:1", "-version"]), &no_env).is_err());
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
        assert!(parse(&args(&["--init-token-hash-file", ""]), &no_env).is_err());
    }

    #[test]
    fn healthcheck_defaults_to_loopback_of_the_listen_port() {
        assert_eq!(
            parse(&args(&["--healthcheck"]), &no_env).unwrap(),
            Command::Healthcheck("127.0.0.1:49983".parse().unwrap())
        );
        assert_eq!(
            parse(&args(&["--healthcheck", "127.0.0.1:5"]), &no_env).unwrap(),
            Command::Healthcheck("127.0.0.1:5".parse().unwrap())
        );
    }

    #[test]
    fn sign_options() {
        let Command::Sign(request) = parse(
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
        assert!(parse(&args(&["sign"]), &no_env).is_err());
        assert!(parse(&args(&["sign", "a", "--operation", "delete"]), &no_env).is_err());
    }
}
