//! envd's own command line (SPEC §1): the Go-style flags envd's unit file and Makefile pass
//! (`-port N`, `-isnotfc`, `-verbose`, `-commit`, `-cgroup-root PATH`, `-no-cgroups`), each
//! mapped onto sandboxd's settings, and the table `--help` and the spec list them from.
//!
//! Forms are Go's `flag` package's: one dash or two, a value after `=` or as the next
//! argument; a switch takes only the `=` form (`-isnotfc=false`) and Go's boolean words.

/// What envd's flags said; `super::parse_serve` folds it into `Config`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EnvdFlags {
    /// `-port N`: listen on `0.0.0.0:N`.
    pub port: Option<u16>,
    /// `-isnotfc`: outside Firecracker, so no metadata service.
    pub is_not_fc: bool,
    /// `-verbose`: accepted; sandboxd always logs to stderr.
    pub verbose: bool,
    /// `-no-cgroups`: `--process-cgroups off`.
    pub no_cgroups: bool,
}

/// One of envd's flags as `--help` lists it.
pub struct EnvdFlag {
    pub usage: &'static str,
    pub meaning: &'static str,
}

/// envd's flags, in `--help`'s order (`-version` is listed with the commands).
pub const ENVD_FLAGS: &[EnvdFlag] = &[
    EnvdFlag {
        usage: "-port N",
        meaning: "listen on 0.0.0.0:N (is --listen 0.0.0.0:N; an error beside --listen)",
    },
    EnvdFlag {
        usage: "-isnotfc",
        meaning: "not in Firecracker: no metadata service (an error beside --mmds-address)",
    },
    EnvdFlag {
        usage: "-verbose",
        meaning: "accepted; no effect: sandboxd always logs to stderr (logged at start)",
    },
    EnvdFlag {
        usage: "-cgroup-root PATH",
        meaning: "is --process-cgroups PATH (where the processes' cgroups are made)",
    },
    EnvdFlag {
        usage: "-no-cgroups",
        meaning: "is --process-cgroups off: processes stay in the daemon's own cgroup",
    },
    EnvdFlag {
        usage: "-commit",
        meaning: "print the source commit built from (or 'unknown') and exit; must come first",
    },
];

/// The commit `-commit` prints: `SANDBOXD_COMMIT` at build time, else `unknown`.
pub const COMMIT: &str = match option_env!("SANDBOXD_COMMIT") {
    Some(commit) => commit,
    None => "unknown",
};

/// If `name` (one dash or two, `=value` already split off into `inline`) is one of envd's
/// switches or `-port`, records it and returns true; `rest` gives `-port`'s separate value.
pub(super) fn take<'a>(
    name: &str,
    inline: Option<&str>,
    rest: &mut impl Iterator<Item = &'a String>,
    flags: &mut EnvdFlags,
) -> Result<bool, String> {
    let switch = match bare(name) {
        Some("port") => {
            let text = match inline {
                Some(text) => text.to_string(),
                None => rest
                    .next()
                    .cloned()
                    .ok_or_else(|| format!("{name} needs a value"))?,
            };
            flags.port = Some(parse_port(name, &text)?);
            return Ok(true);
        }
        Some("isnotfc") => &mut flags.is_not_fc,
        Some("verbose") => &mut flags.verbose,
        Some("no-cgroups") => &mut flags.no_cgroups,
        _ => return Ok(false),
    };
    *switch = match inline {
        None => true,
        Some(text) => parse_go_bool(name, text)?,
    };
    Ok(true)
}

/// `-cgroup-root` (one dash) is `--process-cgroups` (envd makes its groups there): the other
/// names are sandboxd's own.
pub(super) fn alias(name: &str) -> &str {
    match name {
        "-cgroup-root" => "--process-cgroups",
        other => other,
    }
}

/// Whether `arg` is envd's `-commit` in either of Go's spellings.
pub(super) fn is_commit(arg: &str) -> bool {
    bare(arg) == Some("commit")
}

/// The flag's name without its one or two dashes.
fn bare(name: &str) -> Option<&str> {
    name.strip_prefix("--")
        .or_else(|| name.strip_prefix('-'))
        .filter(|bare| !bare.starts_with('-'))
}

/// A port as envd's `-port` gives it: decimal, 0 to 65535 (0: one the kernel picks).
fn parse_port(flag: &str, text: &str) -> Result<u16, String> {
    text.parse()
        .map_err(|_| format!("{flag} must be a port from 0 to 65535, not '{text}'"))
}

/// The boolean words Go's `flag` package takes after `=`.
fn parse_go_bool(flag: &str, text: &str) -> Result<bool, String> {
    match text {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!(
            "{flag} takes true or false after '=', not '{text}'"
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::super::tests::{args, no_env, serve_as};
    use super::super::{parse, Command, Config};

    fn error(list: &[&str]) -> String {
        parse("sandboxd", &args(list), &no_env).unwrap_err()
    }

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn port_in_every_go_form_listens_on_every_address() {
        for form in [
            &["-port", "49983"][..],
            &["-port=49983"],
            &["--port", "49983"],
            &["--port=49983"],
        ] {
            let config = serve_as("sandboxd", form, &no_env);
            assert_eq!(config.listen, addr("0.0.0.0:49983"), "{form:?}");
            assert_eq!(config.envd.port, Some(49983));
        }
        assert_eq!(
            serve_as("sandboxd", &["-port", "0"], &no_env).listen,
            addr("0.0.0.0:0")
        );
        // Over the variable, as every flag.
        let env = |name: &str| (name == "SANDBOXD_LISTEN").then(|| "127.0.0.1:1".to_string());
        assert_eq!(
            serve_as("sandboxd", &["-port", "7"], &env).listen,
            addr("0.0.0.0:7")
        );
        assert_eq!(serve_as("sandboxd", &[], &env).listen, addr("127.0.0.1:1"));
    }

    #[test]
    fn bad_ports_and_port_beside_listen_are_errors() {
        assert_eq!(error(&["-port"]), "-port needs a value");
        assert_eq!(
            error(&["-port", "65536"]),
            "-port must be a port from 0 to 65535, not '65536'"
        );
        assert_eq!(
            error(&["--port=x"]),
            "--port must be a port from 0 to 65535, not 'x'"
        );
        assert_eq!(
            error(&["-port="]),
            "-port must be a port from 0 to 65535, not ''"
        );
        assert_eq!(
            error(&["-port", "-1"]),
            "-port must be a port from 0 to 65535, not '-1'"
        );
        let both = "-port and --listen both say where to listen: give one";
        assert_eq!(error(&["-port", "1", "--listen", "127.0.0.1:2"]), both);
        assert_eq!(error(&["--listen=127.0.0.1:2", "-port=1"]), both);
    }

    #[test]
    fn switches_take_go_s_forms_and_boolean_words() {
        for name in ["isnotfc", "verbose", "no-cgroups"] {
            let on = |config: &Config| match name {
                "isnotfc" => config.envd.is_not_fc,
                "verbose" => config.envd.verbose,
                _ => config.envd.no_cgroups,
            };
            for form in [format!("-{name}"), format!("--{name}")] {
                assert!(on(&serve_as("sandboxd", &[&form], &no_env)), "{form}");
                for word in ["1", "t", "T", "true", "TRUE", "True"] {
                    let arg = format!("{form}={word}");
                    assert!(on(&serve_as("sandboxd", &[&arg], &no_env)), "{arg}");
                }
                for word in ["0", "f", "F", "false", "FALSE", "False"] {
                    let arg = format!("{form}={word}");
                    assert!(!on(&serve_as("sandboxd", &[&arg], &no_env)), "{arg}");
                }
                assert_eq!(
                    error(&[&format!("{form}=yes")]),
                    format!("{form} takes true or false after '=', not 'yes'")
                );
            }
            // Go's switches take no separate value: the next word is an argument of its own.
            assert_eq!(
                error(&[&format!("-{name}"), "false"]),
                "unknown argument 'false'"
            );
        }
        assert_eq!(serve_as("sandboxd", &[], &no_env).envd, Default::default());
    }

    #[test]
    fn cgroup_root_with_one_dash_is_process_cgroups_and_no_cgroups_turns_them_off() {
        use crate::config::ProcessCgroups;
        for form in [
            &["-cgroup-root", "/cg"][..],
            &["-cgroup-root=/cg"],
            &["--process-cgroups", "/cg"],
        ] {
            let config = serve_as("sandboxd", form, &no_env);
            assert_eq!(config.process_cgroups, ProcessCgroups::At("/cg".into()));
            assert_eq!(config.cgroup_root.to_str(), Some("/sys/fs/cgroup"));
        }
        let config = serve_as("sandboxd", &["-cgroup-root", "/cg", "-no-cgroups"], &no_env);
        assert_eq!(config.process_cgroups, ProcessCgroups::Off);
        let config = serve_as("sandboxd", &["--cgroup-root=/cg"], &no_env);
        assert_eq!(config.cgroup_root.to_str(), Some("/cg"));
        assert_eq!(error(&["-cgroup-root"]), "--process-cgroups needs a value");
        assert_eq!(
            error(&["-cgroup-root=cg"]),
            "--process-cgroups must be an absolute path, not 'cg'"
        );
    }

    #[test]
    fn commit_comes_first_and_prints() {
        for form in ["-commit", "--commit"] {
            assert_eq!(parse("envd", &args(&[form]), &no_env), Ok(Command::Commit));
            assert_eq!(
                error(&["-isnotfc", form]),
                format!("{form} must come first")
            );
        }
        assert_eq!(parse("envd", &args(&["-help"]), &no_env), Ok(Command::Help));
        assert_eq!(
            error(&["-resume-handover"]),
            "unknown argument '-resume-handover'"
        );
    }

    /// The program-name default: argv[0], the flags and the environment in, the metadata
    /// service's address out. Literals only: nothing is contacted.
    #[test]
    fn under_the_name_envd_the_metadata_service_defaults_to_envd_s() {
        let envd = Some(addr("169.254.169.254:80"));
        let fake = Some(addr("127.0.0.1:9"));
        let env = |name: &str| (name == "SANDBOXD_MMDS_ADDRESS").then(|| "127.0.0.1:8".to_string());
        type Env<'a> = &'a dyn Fn(&str) -> Option<String>;
        let cases: [(&str, &[&str], Env, _); 12] = [
            ("envd", &[], &no_env, envd),
            ("/usr/bin/envd", &[], &no_env, envd),
            ("/usr/bin/envd", &["-port", "49983"], &no_env, envd),
            ("/usr/bin/envd", &["-isnotfc"], &no_env, None),
            ("envd", &["-isnotfc=false"], &no_env, envd),
            ("envd", &["--mmds-address", "127.0.0.1:9"], &no_env, fake),
            ("envd", &[], &env, Some(addr("127.0.0.1:8"))),
            ("envd", &["-isnotfc"], &env, None),
            ("sandboxd", &[], &no_env, None),
            ("/opt/envd2", &[], &no_env, None),
            ("", &[], &no_env, None),
            ("sandboxd", &["--mmds-address=127.0.0.1:9"], &no_env, fake),
        ];
        for (program, list, env, expected) in cases {
            let config = serve_as(program, list, env);
            assert_eq!(config.mmds_address, expected, "{program} {list:?}");
        }
        assert_eq!(
            parse(
                "envd",
                &args(&["-isnotfc", "--mmds-address", "127.0.0.1:9"]),
                &no_env
            )
            .unwrap_err(),
            "-isnotfc says there is no metadata service, --mmds-address names one: give one"
        );
    }
}
