//! The options of the server itself: where it listens, the tokens that let a client in, its
//! workers and timeouts, and how it logs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::parse::{default_workers, non_empty_path, parse_addr, parse_seconds, parse_workers};
use super::{Fallback, Opt, Setting};

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
