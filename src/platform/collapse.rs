//! `/collapse`: the daemon's own anonymous read-write memory collapsed into 2 MiB transparent
//! hugepages before a pause (envd's `services/memory`), so a resumed sandbox touches fewer
//! distinct guest frames. Best effort: each 2 MiB window is collapsed on its own
//! (`MADV_COLLAPSE` over a whole region stops at the first window it cannot collapse), after
//! `MADV_HUGEPAGE` on the region so it is eligible whatever the system's THP mode.
//!
//! The regions are `/proc/self/maps` lines that are readable, writable and have no path (no
//! file, no `[heap]` or `[stack]`), as envd's. Real migrations are told from windows that were
//! huge already by the growth of `AnonHugePages` in `/proc/self/smaps_rollup` (envd's
//! `splitCollapsed`). A kernel without `MADV_COLLAPSE` (before 6.1, or without transparent
//! hugepages) collapses nothing, and the answer says so.

use std::time::Instant;

use crate::sys::madvise::{self, MADV_COLLAPSE, MADV_HUGEPAGE};

pub const HUGE_PAGE: usize = 2 << 20;

/// envd's `CollapseResult`, plus whether the kernel could collapse at all.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CollapseResult {
    pub regions: usize,
    pub chunks: usize,
    pub collapsed: usize,
    pub already_huge: usize,
    pub skipped: usize,
    pub elapsed_ms: u64,
    /// False on a kernel without `MADV_COLLAPSE`; then `message` says so.
    pub supported: bool,
    pub message: Option<&'static str>,
}

impl CollapseResult {
    /// The JSON answer, envd's field names (written by hand: a derive costs more). The
    /// message is a constant without characters to escape.
    pub fn to_json(&self) -> String {
        let message = self
            .message
            .map(|m| format!(",\"message\":\"{m}\""))
            .unwrap_or_default();
        format!(
            "{{\"regions\":{},\"chunks\":{},\"collapsed\":{},\"alreadyHuge\":{},\"skipped\":{},\
             \"elapsedMs\":{},\"supported\":{}{message}}}",
            self.regions,
            self.chunks,
            self.collapsed,
            self.already_huge,
            self.skipped,
            self.elapsed_ms,
            self.supported
        )
    }
}

pub const UNSUPPORTED: &str =
    "this kernel has no MADV_COLLAPSE (Linux 6.1 or later with transparent hugepages): nothing was collapsed";

/// Collapses the daemon's anonymous memory; `maps` and `smaps_rollup` read the two /proc files.
pub fn collapse_self(
    maps: &str,
    anon_huge_bytes: impl Fn() -> Option<u64>,
    supported: bool,
) -> CollapseResult {
    let started = Instant::now();
    let regions = anonymous_regions(maps);
    let mut result = CollapseResult {
        regions: regions.len(),
        supported,
        ..CollapseResult::default()
    };
    if !supported {
        result.message = Some(UNSUPPORTED);
        return result;
    }
    let before = anon_huge_bytes();
    let mut successes = 0;
    for (start, end) in regions {
        let _ = madvise::advise(start, end - start, MADV_HUGEPAGE);
        let mut window = start.div_ceil(HUGE_PAGE) * HUGE_PAGE;
        while window.checked_add(HUGE_PAGE).is_some_and(|e| e <= end) {
            result.chunks += 1;
            match madvise::advise(window, HUGE_PAGE, MADV_COLLAPSE) {
                Ok(()) => successes += 1,
                Err(_) => result.skipped += 1,
            }
            window += HUGE_PAGE;
        }
    }
    let after = anon_huge_bytes();
    (result.collapsed, result.already_huge) = split(successes, before, after);
    result.elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    result
}

/// Successes into (migrated, already huge) by the growth of `AnonHugePages`; all migrated when
/// it could not be measured or shrank (envd's rule).
fn split(successes: usize, before: Option<u64>, after: Option<u64>) -> (usize, usize) {
    match (before, after) {
        (Some(before), Some(after)) if after >= before => {
            let grown = usize::try_from((after - before) / HUGE_PAGE as u64).unwrap_or(usize::MAX);
            let migrated = grown.min(successes);
            (migrated, successes - migrated)
        }
        _ => (successes, 0),
    }
}

/// The `start-end` of every readable, writable mapping without a path in a `maps` text.
pub fn anonymous_regions(maps: &str) -> Vec<(usize, usize)> {
    maps.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let range = fields.next()?;
            let perms = fields.next()?;
            // offset, device, inode, then the path if any.
            if fields.nth(3).is_some() || !perms.starts_with("rw") {
                return None;
            }
            let (start, end) = range.split_once('-')?;
            let start = usize::from_str_radix(start, 16).ok()?;
            let end = usize::from_str_radix(end, 16).ok()?;
            (end > start).then_some((start, end))
        })
        .collect()
}

/// `AnonHugePages` of a `smaps_rollup` text, in bytes.
pub fn anon_huge_pages(smaps_rollup: &str) -> Option<u64> {
    let line = smaps_rollup
        .lines()
        .find_map(|l| l.strip_prefix("AnonHugePages:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0000000-55d0c0200000 r-xp 00000000 08:01 1234 /usr/bin/sandboxd
55d0c1000000-55d0c1400000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000600000 rw-p 00000000 00:00 0
7f0000600000-7f0000601000 ---p 00000000 00:00 0
7f0000601000-7f0000700000 rw-p 00000000 00:00 0 
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
";

    #[test]
    fn only_anonymous_read_write_mappings_without_a_path() {
        assert_eq!(
            anonymous_regions(MAPS),
            [
                (0x7f00_0000_0000, 0x7f00_0060_0000),
                (0x7f00_0060_1000, 0x7f00_0070_0000)
            ]
        );
        assert_eq!(anonymous_regions("garbage\nzz-1 rw-p 0 0 0\n"), []);
    }

    #[test]
    fn successes_split_by_the_growth_of_anon_huge_pages() {
        let mib = 1 << 20;
        assert_eq!(split(3, Some(0), Some(4 * mib)), (2, 1));
        assert_eq!(split(3, Some(0), Some(100 * mib)), (3, 0));
        assert_eq!(split(3, Some(4 * mib), Some(0)), (3, 0));
        assert_eq!(split(3, None, Some(0)), (3, 0));
        let rollup = "Rss: 1 kB\nAnonHugePages:      4096 kB\n";
        assert_eq!(anon_huge_pages(rollup), Some(4 * mib));
        assert_eq!(anon_huge_pages("Rss: 1 kB\n"), None);
    }

    #[test]
    fn without_madv_collapse_nothing_is_tried_and_the_answer_says_so() {
        let result = collapse_self(MAPS, || panic!("not measured"), false);
        assert_eq!(
            result,
            CollapseResult {
                regions: 2,
                supported: false,
                message: Some(UNSUPPORTED),
                ..CollapseResult::default()
            }
        );
        let json: serde_json::Value = serde_json::from_str(&result.to_json()).unwrap();
        assert_eq!(json["message"], UNSUPPORTED);
        assert_eq!(json["supported"], false);
        assert_eq!(json["alreadyHuge"], 0);
        assert_eq!(json["elapsedMs"], 0);
    }
}
