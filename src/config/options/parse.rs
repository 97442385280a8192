//! The parsers of option values shared by the settings: the text (given, or a default's) into
//! a value, or a one-line error naming the option.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub(super) fn parse_count(flag: &str, text: &str, max: usize) -> Result<usize, String> {
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

pub(super) fn parse_addr(flag: &str, text: &str) -> Result<SocketAddr, String> {
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

pub(super) fn parse_workers(text: &str) -> Result<usize, String> {
    text.parse()
        .ok()
        .filter(|n| (1..=1024).contains(n))
        .ok_or_else(|| format!("--workers must be between 1 and 1024, not '{text}'"))
}

pub(super) fn parse_seconds(flag: &str, text: &str) -> Result<Duration, String> {
    text.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0 && *s <= 86_400.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{flag} must be a number of seconds in (0, 86400], not '{text}'"))
}

pub(super) fn non_empty_path(text: &str) -> Result<PathBuf, String> {
    if text.is_empty() {
        Err("a path option must not be empty".into())
    } else {
        Ok(PathBuf::from(text))
    }
}

pub(super) fn absolute_path(flag: &str, text: &str) -> Result<PathBuf, String> {
    if text.starts_with('/') {
        Ok(PathBuf::from(text))
    } else {
        Err(format!("{flag} must be an absolute path, not '{text}'"))
    }
}
