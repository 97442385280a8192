//! Cgroup v1 interface files: `memory.limit_in_bytes`, `memory.usage_in_bytes`, `memory.stat`,
//! `cpu.cfs_quota_us` with `cpu.cfs_period_us`, `cpuacct.usage`.
//!
//! Owns their formats only, mapping v1's ways of saying "unlimited" (a quota of `-1`, a memory
//! limit of about 2^63) to `None`. Which directory the files come from is `cgroup_detect`'s
//! business, what the numbers mean for the metrics `sampler`'s.

use super::num::{flat_keyed, single_u64};

/// Memory limits at or above this are "unlimited". The kernel shows an unset limit as
/// `PAGE_COUNTER_MAX * PAGE_SIZE`, just under 2^63 and depending on the page size
/// (9223372036854771712 with 4 KiB pages); no machine has 4 EiB.
const UNLIMITED_FLOOR: u64 = 1 << 62;

/// `memory.limit_in_bytes`: bytes, or `None` when unlimited or unreadable.
pub fn parse_limit_in_bytes(text: &str) -> Option<u64> {
    single_u64(text).filter(|&limit| limit < UNLIMITED_FLOOR)
}

/// `memory.usage_in_bytes`: bytes charged to the cgroup and its descendants.
pub fn parse_usage_in_bytes(text: &str) -> Option<u64> {
    single_u64(text)
}

/// The keys of `memory.stat` sandboxd uses, in bytes. The hierarchical `total_` keys, which cover
/// descendants as `memory.usage_in_bytes` does, win over the cgroup-local ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStat {
    /// `total_cache` (else `cache`): page cache, tmpfs and shared memory included.
    pub cache: Option<u64>,
    /// `total_inactive_file` (else `inactive_file`).
    pub inactive_file: Option<u64>,
}

/// `memory.stat`: flat `key value` lines; unknown keys and malformed lines are skipped.
pub fn parse_memory_stat(text: &str) -> MemoryStat {
    let (mut cache, mut total_cache) = (None, None);
    let (mut inactive_file, mut total_inactive_file) = (None, None);
    for (key, value) in flat_keyed(text) {
        let slot = match key {
            "cache" => &mut cache,
            "total_cache" => &mut total_cache,
            "inactive_file" => &mut inactive_file,
            "total_inactive_file" => &mut total_inactive_file,
            _ => continue,
        };
        slot.get_or_insert(value);
    }
    MemoryStat {
        cache: total_cache.or(cache),
        inactive_file: total_inactive_file.or(inactive_file),
    }
}

/// `cpu.cfs_quota_us`: microseconds per period, or `None` for `-1` (unlimited) and anything
/// unreadable. `CpuQuota::new` pairs it with the period.
pub fn parse_cfs_quota_us(text: &str) -> Option<u64> {
    single_u64(text)
}

/// `cpu.cfs_period_us`: microseconds.
pub fn parse_cfs_period_us(text: &str) -> Option<u64> {
    single_u64(text)
}

/// `cpuacct.usage`: CPU time used by the cgroup and its descendants, in nanoseconds.
pub fn parse_cpuacct_usage(text: &str) -> Option<u64> {
    single_u64(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::quota::CpuQuota;

    /// `memory.stat` of this process's v1 memory cgroup on this machine (Linux 6.18).
    const MEMORY_STAT: &str = "\
cache 81920
rss 1675264
rss_huge 0
shmem 0
mapped_file 0
dirty 32768
writeback 0
workingset_refault_anon 0
workingset_refault_file 11
swap 0
swapcached 0
pgpgin 10236
pgpgout 9807
pgfault 25408
pgmajfault 2
inactive_anon 1576960
active_anon 12288
inactive_file 32768
active_file 49152
unevictable 0
hierarchical_memory_limit 9223372036854771712
hierarchical_memsw_limit 9223372036854771712
total_cache 81920
total_rss 1675264
total_rss_huge 0
total_shmem 0
total_mapped_file 0
total_dirty 32768
total_writeback 0
total_workingset_refault_anon 0
total_workingset_refault_file 11
total_swap 0
total_swapcached 0
total_pgpgin 10236
total_pgpgout 9807
total_pgfault 25408
total_pgmajfault 2
total_inactive_anon 1576960
total_active_anon 12288
total_inactive_file 32768
total_active_file 49152
total_unevictable 0
";

    #[test]
    fn limit_in_bytes() {
        // This machine's unlimited value, and 64 KiB pages' one.
        assert_eq!(parse_limit_in_bytes("9223372036854771712\n"), None);
        assert_eq!(parse_limit_in_bytes("9223372036854710272\n"), None);
        assert_eq!(parse_limit_in_bytes("536870912\n"), Some(536870912));
        assert_eq!(parse_limit_in_bytes("-1\n"), None);
        assert_eq!(parse_limit_in_bytes("18446744073709551616\n"), None);
        assert_eq!(parse_limit_in_bytes(""), None);
    }

    #[test]
    fn usage_in_bytes() {
        // This machine's, for the leaf and the root memory cgroup.
        assert_eq!(parse_usage_in_bytes("3317760\n"), Some(3317760));
        assert_eq!(parse_usage_in_bytes("698978304\n"), Some(698978304));
        assert_eq!(parse_usage_in_bytes("x\n"), None);
    }

    #[test]
    fn memory_stat_real() {
        let stat = parse_memory_stat(MEMORY_STAT);
        assert_eq!(stat.cache, Some(81920));
        assert_eq!(stat.inactive_file, Some(32768));
    }

    #[test]
    fn memory_stat_prefers_hierarchical_keys() {
        let text = "cache 10\ninactive_file 20\ntotal_cache 100\ntotal_inactive_file 200\n";
        let stat = parse_memory_stat(text);
        assert_eq!(stat.cache, Some(100));
        assert_eq!(stat.inactive_file, Some(200));
        // Without use_hierarchy's totals the local keys serve.
        let stat = parse_memory_stat("cache 10\ninactive_file 20\n");
        assert_eq!((stat.cache, stat.inactive_file), (Some(10), Some(20)));
    }

    #[test]
    fn memory_stat_missing_and_garbage() {
        assert_eq!(parse_memory_stat(""), MemoryStat::default());
        let text = "total_cache\ntotal_cache -1\ncache 99999999999999999999999\ncache 5\nnoise\n";
        assert_eq!(
            parse_memory_stat(text),
            MemoryStat {
                cache: Some(5),
                inactive_file: None
            }
        );
    }

    #[test]
    fn cfs() {
        let cfs = |q, p| CpuQuota::new(parse_cfs_quota_us(q)?, parse_cfs_period_us(p)?);
        // This machine: no quota.
        assert_eq!(cfs("-1\n", "100000\n"), None);
        assert_eq!(cfs("150000\n", "100000\n"), CpuQuota::new(150000, 100000));
        assert_eq!(cfs("150000\n", ""), None);
        assert_eq!(cfs("150000\n", "0\n"), None);
        assert_eq!(cfs("0\n", "100000\n"), None);
        assert_eq!(cfs("abc\n", "100000\n"), None);
        assert_eq!(cfs("99999999999999999999999\n", "100000\n"), None);
    }

    #[test]
    fn cpuacct_usage() {
        assert_eq!(parse_cpuacct_usage("34042308066\n"), Some(34042308066));
        assert_eq!(parse_cpuacct_usage("\n"), None);
        assert_eq!(parse_cpuacct_usage("18446744073709551616\n"), None);
    }
}
