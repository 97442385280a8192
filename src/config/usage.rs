//! `--help` and the configuration table of docs/usage.md (which the README links to), both
//! rendered from the option table (`super::options`). docs/usage.md holds its copy between two
//! marker comments; a test here fails when it differs and says how to rewrite it.

use super::envd::ENVD_FLAGS;
use super::options::{Fallback, OPTIONS};

const HEAD: &str = "\
sandboxd: the daemon inside every sandbox, a drop-in for E2B's envd. Over HTTP: files (download,
upload, compose, tar archives), envd's Connect filesystem and process services, metrics, the
environment, and the platform's /init, freezes, port forwarding and live upgrade.

Usage:
  sandboxd [OPTIONS]                 serve
  sandboxd --healthcheck [HOST:PORT] probe a running daemon's /health; exit 0 if healthy
  sandboxd sign PATH [SIGN OPTIONS]  print a signed download/upload URL
  sandboxd --help | --version
  sandboxd -version                  print only the envd API level implemented (as envd does)
  sandboxd -commit                   print the source commit built from (as envd does)
  sandboxd --handover-schema         print the live-upgrade handover layout it reads (/upgrade)

Options (each also read from the environment variable shown; the flag wins; SECS may be
fractional):
";

const ENVD_HEAD: &str = "
envd's flags, accepted so envd's unit file and Makefile run sandboxd unchanged: one dash or two,
a value after '=' or as the next argument, a switch's only after '=' (-isnotfc=false). Started
under the name envd, sandboxd reads the metadata service at envd's link-local address unless
-isnotfc or --mmds-address is given:
";

const SIGN_HEAD: &str = "\
Usage: sandboxd sign PATH [SIGN OPTIONS]: print a signed download/upload URL for PATH
";

const TAIL: &str = "
Sign options (token from SANDBOXD_ACCESS_TOKEN or --access-token-file):
  --username NAME   --operation read|write [read]   --expires-in SECS [3600]
  --v1 (envd-compatible signature)   --url BASE [http://127.0.0.1:49983]
  --format tar (a directory's archive: download, or upload with --operation write)
";

/// Help sentences are wrapped to this many columns, indented this far.
const WIDTH: usize = 96;
const INDENT: usize = 6;

/// The text `sandboxd sign --help` prints.
pub fn sign_help() -> String {
    format!("{SIGN_HEAD}{TAIL}")
}

/// The text `sandboxd --help` prints.
pub fn help() -> String {
    let mut out = String::from(HEAD);
    for opt in OPTIONS {
        let flag = match opt.flag {
            Some(flag) => format!("{flag} {}", opt.value).trim_end().to_string(),
            None => "(no flag)".to_string(),
        };
        let default = match opt.default {
            Fallback::Text(text) | Fallback::Words(text) => text,
        };
        out.push_str(&format!("  {flag:<24}  {:<26}  [{default}]\n", opt.env));
        wrap(&opt.help.replace('`', ""), &mut out);
    }
    out.push_str(ENVD_HEAD);
    for flag in ENVD_FLAGS {
        out.push_str(&format!("  {}\n", flag.usage));
        wrap(flag.meaning, &mut out);
    }
    out.push_str(TAIL);
    out
}

/// docs/usage.md's configuration table, in Markdown (only the test below needs it).
#[cfg(test)]
fn markdown() -> String {
    let mut out = String::from("| flag | environment | default | meaning |\n|---|---|---|---|\n");
    for opt in OPTIONS {
        let flag = match opt.flag {
            Some(flag) => format!("`{}`", format!("{flag} {}", opt.value).trim_end()),
            None => "(none)".to_string(),
        };
        let default = match opt.default {
            Fallback::Text(text) => format!("`{text}`"),
            Fallback::Words(words) => words.to_string(),
        };
        let (env, help) = (opt.env, opt.help);
        out.push_str(&format!("| {flag} | `{env}` | {default} | {help} |\n"));
    }
    out
}

/// Appends `text` wrapped to [`WIDTH`] columns, each line indented by [`INDENT`].
fn wrap(text: &str, out: &mut String) {
    let mut line = String::new();
    for word in text.split_whitespace() {
        let len = line.chars().count();
        if len > 0 && INDENT + len + 1 + word.chars().count() > WIDTH {
            push_line(&line, out);
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        push_line(&line, out);
    }
}

fn push_line(line: &str, out: &mut String) {
    out.push_str(&" ".repeat(INDENT));
    out.push_str(line);
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEGIN: &str = "<!-- options:begin: generated from src/config/options/; \
        UPDATE_README=1 cargo test --lib readme_configuration_table rewrites it -->\n";
    const END: &str = "<!-- options:end -->";

    /// docs/usage.md's table is the rendered option table. `UPDATE_README=1` rewrites it (the
    /// name it had when the table was in the README).
    #[test]
    fn readme_configuration_table_is_the_option_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/usage.md");
        let usage = std::fs::read_to_string(path).unwrap();
        let (before, rest) = usage
            .split_once(BEGIN)
            .expect("docs/usage.md has no options:begin");
        let (block, after) = rest
            .split_once(END)
            .expect("docs/usage.md has no options:end");
        let expected = markdown();
        if block == expected {
            return;
        }
        if std::env::var_os("UPDATE_README").is_some() {
            std::fs::write(path, format!("{before}{BEGIN}{expected}{END}{after}")).unwrap();
            return;
        }
        panic!(
            "docs/usage.md's configuration table differs from the option table in \
             src/config/options/. Rewrite it with\n  \
             UPDATE_README=1 cargo test --lib readme_configuration_table\n\
             Expected between the markers:\n{expected}"
        );
    }

    #[test]
    fn help_says_first_what_the_daemon_is() {
        let help = help();
        let first = help.lines().next().unwrap();
        assert_eq!(
            first,
            "sandboxd: the daemon inside every sandbox, a drop-in for E2B's envd. Over HTTP: files (download,"
        );
        assert!(help.contains("Connect filesystem and process services"));
        assert!(sign_help().starts_with("Usage: sandboxd sign PATH [SIGN OPTIONS]"));
    }

    #[test]
    fn help_lists_every_option_with_its_variable_and_default() {
        let help = help();
        for opt in OPTIONS {
            assert!(help.contains(opt.env), "{}", opt.env);
            if let Some(flag) = opt.flag {
                assert!(help.contains(&format!("  {flag} {} ", opt.value)), "{flag}");
            }
        }
        assert!(help.contains("SANDBOXD_IDLE_TIMEOUT       [640]"), "{help}");
        for flag in [
            "-port N",
            "-isnotfc",
            "-verbose",
            "-cgroup-root PATH",
            "-no-cgroups",
        ] {
            assert!(help.contains(&format!("\n  {flag}\n")), "{flag}: {help}");
        }
        assert!(help.lines().all(|l| l.chars().count() <= WIDTH), "{help}");
    }
}
