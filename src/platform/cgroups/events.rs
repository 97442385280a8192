//! Pure parsers of the cgroup and /proc texts the manager and the freezer read: fed literal
//! text in tests, never opening a file.

/// The `frozen` field of a `cgroup.events` body: true only for `frozen 1`. A body without the
/// field (a cgroup never frozen, an older kernel) is not frozen.
pub fn frozen(events: &str) -> bool {
    events
        .lines()
        .filter_map(|line| line.trim().split_once(' '))
        .any(|(key, value)| key == "frozen" && value.trim() == "1")
}

/// A `cgroup.freeze` body: this cgroup's own request (not an ancestor's).
pub fn freeze_requested(freeze: &str) -> bool {
    freeze.trim() == "1"
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
pub fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frozen_is_the_events_field() {
        assert!(frozen("populated 1\nfrozen 1\n"));
        assert!(!frozen("populated 1\nfrozen 0\n"));
        assert!(!frozen("populated 0\n"));
        assert!(!frozen("frozen_x 1\nfrozen\n"));
        assert!(freeze_requested("1\n"));
        assert!(!freeze_requested("0\n"));
    }

    #[test]
    fn mem_total_in_bytes() {
        let text = "MemTotal:        2030000 kB\nMemFree:  10 kB\n";
        assert_eq!(mem_total(text), Some(2_030_000 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(mem_total("MemTotal: x kB\n"), None);
    }
}
