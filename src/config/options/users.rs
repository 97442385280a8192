//! The options on users: who a request runs as when it names nobody, where users are looked
//! up, and whether file calls run with the caller's credentials.

use std::path::PathBuf;

use super::parse::{absolute_path, non_empty_path, parse_switch};
use super::{Fallback, Opt, Setting};

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
