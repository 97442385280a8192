//! Cgroup v2 interface files: `memory.max`, `memory.current`, `memory.stat`, `cpu.max`,
//! `cpu.stat`.
//!
//! Owns their formats only: `max` is unlimited (`None`), a missing key is `None`, a value too big
//! for `u64` is rejected. Which directory the files come from is `cgroup_detect`'s business, what
//! the numbers mean for the metrics `sampler`'s.

use super::num::{flat_keyed, parse_u64, single_u64};
use super::quota::CpuQuota;

/// The default `cpu.max` period when the file gives only a quota.
const DEFAULT_PERIOD_US: u64 = 100_000;

/// `memory.max` (also the format of `memory.high`): bytes, or `None` for `max` and anything
/// unreadable.
pub fn parse_memory_max(text: &str) -> Option<u64> {
    single_u64(text)
}

/// `memory.current`: bytes charged to the cgroup and its descendants.
pub fn parse_memory_current(text: &str) -> Option<u64> {
    single_u64(text)
}

/// The keys of `memory.stat` sandboxd uses, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStat {
    /// `file`: page cache, tmpfs and shared memory included.
    pub file: Option<u64>,
    /// `inactive_file`: the page cache the kernel would reclaim first.
    pub inactive_file: Option<u64>,
}

/// `memory.stat`: flat `key bytes` lines; unknown keys and malformed lines are skipped.
pub fn parse_memory_stat(text: &str) -> MemoryStat {
    let mut stat = MemoryStat::default();
    for (key, value) in flat_keyed(text) {
        match key {
            "file" => stat.file = stat.file.or(Some(value)),
            "inactive_file" => stat.inactive_file = stat.inactive_file.or(Some(value)),
            _ => {}
        }
    }
    stat
}

/// `cpu.max`: `$QUOTA $PERIOD` in microseconds; `None` when the quota is `max` (or the file is
/// malformed). A lone quota takes the default period.
pub fn parse_cpu_max(text: &str) -> Option<CpuQuota> {
    let mut tokens = text.split_ascii_whitespace();
    let quota = parse_u64(tokens.next()?)?;
    let period = match tokens.next() {
        Some(period) => parse_u64(period)?,
        None => DEFAULT_PERIOD_US,
    };
    if tokens.next().is_some() {
        return None;
    }
    CpuQuota::new(quota, period)
}

/// `cpu.stat`'s `usage_usec`: CPU time used by the cgroup and its descendants, in microseconds.
pub fn parse_cpu_stat_usage_usec(text: &str) -> Option<u64> {
    flat_keyed(text).find_map(|(key, value)| (key == "usage_usec").then_some(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `memory.stat` of a container cgroup on Linux 6.8 (key order and set as the kernel prints).
    const MEMORY_STAT: &str = "\
anon 1675264
file 53248000
kernel 1048576
kernel_stack 65536
pagetables 110592
sec_pagetables 0
percpu 1440
sock 0
vmalloc 0
shmem 8192
zswap 0
zswapped 0
file_mapped 4096000
file_dirty 32768
file_writeback 0
swapcached 0
anon_thp 0
file_thp 0
shmem_thp 0
inactive_anon 1576960
active_anon 106496
inactive_file 40960000
active_file 12288000
unevictable 0
slab_reclaimable 524288
slab_unreclaimable 262144
slab 786432
workingset_refault_anon 0
workingset_refault_file 11
workingset_activate_anon 0
workingset_activate_file 0
workingset_restore_anon 0
workingset_restore_file 0
workingset_nodereclaim 0
pgscan 0
pgsteal 0
pgscan_kswapd 0
pgscan_direct 0
pgscan_khugepaged 0
pgsteal_kswapd 0
pgsteal_direct 0
pgsteal_khugepaged 0
pgfault 25408
pgmajfault 2
pgrefill 0
pgactivate 0
pgdeactivate 0
pglazyfree 0
pglazyfreed 0
thp_fault_alloc 0
thp_collapse_alloc 0
";

    /// `cpu.stat` with the cpu controller enabled (Linux 6.x).
    const CPU_STAT: &str = "\
usage_usec 32828449
user_usec 19748790
system_usec 13079658
core_sched.force_idle_usec 0
nr_periods 1200
nr_throttled 31
throttled_usec 412000
nr_bursts 0
burst_usec 0
";

    /// `cpu.stat` of this machine's (hybrid, controller-less) `/sys/fs/cgroup/unified`.
    const CPU_STAT_CORE_ONLY: &str =
        "usage_usec 32828449\nuser_usec 19748790\nsystem_usec 13079658\nnice_usec 0\n";

    #[test]
    fn memory_max() {
        assert_eq!(parse_memory_max("536870912\n"), Some(536870912));
        assert_eq!(parse_memory_max("max\n"), None);
        assert_eq!(parse_memory_max(""), None);
        assert_eq!(parse_memory_max("18446744073709551615\n"), Some(u64::MAX));
        assert_eq!(parse_memory_max("18446744073709551616\n"), None);
        assert_eq!(parse_memory_max("-1\n"), None);
        assert_eq!(parse_memory_max("512M\n"), None);
    }

    #[test]
    fn memory_current() {
        assert_eq!(parse_memory_current("3317760\n"), Some(3317760));
        assert_eq!(parse_memory_current("0\n"), Some(0));
        assert_eq!(parse_memory_current("garbage\n"), None);
        assert_eq!(parse_memory_current("99999999999999999999999\n"), None);
    }

    #[test]
    fn memory_stat_real() {
        let stat = parse_memory_stat(MEMORY_STAT);
        assert_eq!(stat.file, Some(53248000));
        assert_eq!(stat.inactive_file, Some(40960000));
    }

    #[test]
    fn memory_stat_missing_and_garbage() {
        assert_eq!(parse_memory_stat(""), MemoryStat::default());
        let stat = parse_memory_stat(
            "anon 1\ninactive_file\nfile x\nfile 7\ninactive_file 99999999999999999999999\n",
        );
        assert_eq!(stat.file, Some(7));
        assert_eq!(stat.inactive_file, None);
    }

    #[test]
    fn cpu_max() {
        assert_eq!(
            parse_cpu_max("150000 100000\n"),
            CpuQuota::new(150000, 100000)
        );
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("max\n"), None);
        assert_eq!(parse_cpu_max("50000\n"), CpuQuota::new(50000, 100000));
        assert_eq!(parse_cpu_max("0 100000\n"), None);
        assert_eq!(parse_cpu_max("100000 0\n"), None);
        assert_eq!(parse_cpu_max(""), None);
        assert_eq!(parse_cpu_max("1 2 3\n"), None);
        assert_eq!(parse_cpu_max("-1 100000\n"), None);
        assert_eq!(
            parse_cpu_max("18446744073709551615 1000000\n"),
            CpuQuota::new(u64::MAX, 1_000_000)
        );
        assert_eq!(parse_cpu_max("18446744073709551616 100000\n"), None);
    }

    #[test]
    fn cpu_stat() {
        assert_eq!(parse_cpu_stat_usage_usec(CPU_STAT), Some(32828449));
        assert_eq!(
            parse_cpu_stat_usage_usec(CPU_STAT_CORE_ONLY),
            Some(32828449)
        );
        assert_eq!(parse_cpu_stat_usage_usec("user_usec 1\n"), None);
        assert_eq!(
            parse_cpu_stat_usage_usec("usage_usec x\nusage_usec 5\n"),
            Some(5)
        );
        assert_eq!(
            parse_cpu_stat_usage_usec("usage_usec 99999999999999999999999\n"),
            None
        );
    }
}
