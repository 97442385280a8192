//! Arithmetic from parsed readings to the figures of `Metrics`: percentages (clamped to
//! [0, 100], two decimals, never NaN), a limited cgroup's memory figures, MiB.
//!
//! Owns no I/O and no parsing; `sampler` feeds it.

use std::time::Duration;

use super::proc_stat::CpuTimes;

/// `part / whole` in percent, clamped to [0, 100] and rounded to two decimals; 0 when `whole` is
/// not positive or either is not finite.
pub fn percent(part: f64, whole: f64) -> f64 {
    if !part.is_finite() || !whole.is_finite() || whole <= 0.0 {
        return 0.0;
    }
    let pct = (part / whole * 100.0).clamp(0.0, 100.0);
    (pct * 100.0).round() / 100.0
}

/// The host's busy share between two `/proc/stat` readings. Counters that went backwards count
/// as no time.
pub fn host_cpu_percent(prev: CpuTimes, cur: CpuTimes) -> f64 {
    let busy = cur.busy.saturating_sub(prev.busy);
    let total = cur.total.saturating_sub(prev.total);
    percent(busy as f64, total as f64)
}

/// A cgroup's CPU time `usage_ns` over `wall` time on `cpus` CPUs.
pub fn cgroup_cpu_percent(usage_ns: u64, wall: Duration, cpus: u32) -> f64 {
    percent(usage_ns as f64, wall.as_nanos() as f64 * f64::from(cpus))
}

/// Memory figures in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemFigures {
    pub total: u64,
    pub used: u64,
    pub cache: u64,
}

/// A limited cgroup's figures: total = the limit, used = usage less inactive file pages (at most
/// the limit), cache = the cgroup's file pages. A missing `memory.stat` key counts as 0.
pub fn cgroup_memory(
    limit: u64,
    usage: u64,
    inactive_file: Option<u64>,
    file: Option<u64>,
) -> MemFigures {
    MemFigures {
        total: limit,
        used: usage.saturating_sub(inactive_file.unwrap_or(0)).min(limit),
        cache: file.unwrap_or(0),
    }
}

/// Bytes in MiB, rounded down.
pub fn mib(bytes: u64) -> u64 {
    bytes >> 20
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_rounds_clamps_and_never_nans() {
        assert_eq!(percent(1.0, 3.0), 33.33);
        assert_eq!(percent(2.0, 3.0), 66.67);
        assert_eq!(percent(1.0, 8.0), 12.5);
        assert_eq!(percent(0.0, 10.0), 0.0);
        assert_eq!(percent(10.0, 10.0), 100.0);
        assert_eq!(percent(30.0, 10.0), 100.0);
        assert_eq!(percent(-1.0, 10.0), 0.0);
        assert_eq!(percent(0.0, 0.0), 0.0);
        assert_eq!(percent(5.0, 0.0), 0.0);
        assert_eq!(percent(5.0, -1.0), 0.0);
        assert_eq!(percent(f64::NAN, 1.0), 0.0);
        assert_eq!(percent(1.0, f64::NAN), 0.0);
        assert_eq!(percent(f64::INFINITY, 1.0), 0.0);
        assert_eq!(percent(1.0, f64::INFINITY), 0.0);
        assert_eq!(percent(u64::MAX as f64, 1.0), 100.0);
    }

    #[test]
    fn host_cpu() {
        let a = CpuTimes {
            busy: 100,
            total: 1000,
        };
        let b = CpuTimes {
            busy: 150,
            total: 1200,
        };
        assert_eq!(host_cpu_percent(a, b), 25.0);
        assert_eq!(host_cpu_percent(a, a), 0.0, "no time passed");
        assert_eq!(host_cpu_percent(b, a), 0.0, "counters went backwards");
        // Since boot, as when the first reading failed.
        assert_eq!(host_cpu_percent(CpuTimes::default(), b), 12.5);
        // Idle going backwards (nohz iowait) makes busy outrun total: clamped.
        let c = CpuTimes {
            busy: 300,
            total: 1250,
        };
        assert_eq!(host_cpu_percent(b, c), 100.0);
    }

    #[test]
    fn cgroup_cpu() {
        let second = Duration::from_secs(1);
        assert_eq!(cgroup_cpu_percent(500_000_000, second, 1), 50.0);
        assert_eq!(cgroup_cpu_percent(1_000_000_000, second, 2), 50.0);
        assert_eq!(cgroup_cpu_percent(3_000_000_000, second, 2), 100.0);
        assert_eq!(cgroup_cpu_percent(0, second, 2), 0.0);
        assert_eq!(cgroup_cpu_percent(1, Duration::ZERO, 2), 0.0);
        assert_eq!(cgroup_cpu_percent(1, second, 0), 0.0);
    }

    #[test]
    fn limited_memory() {
        let mib512 = 512 << 20;
        let m = cgroup_memory(mib512, 300 << 20, Some(100 << 20), Some(150 << 20));
        assert_eq!(
            m,
            MemFigures {
                total: mib512,
                used: 200 << 20,
                cache: 150 << 20
            }
        );
        let m = cgroup_memory(mib512, 300 << 20, None, None);
        assert_eq!((m.used, m.cache), (300 << 20, 0));
        assert_eq!(cgroup_memory(mib512, 10, Some(20), None).used, 0);
        assert_eq!(cgroup_memory(mib512, u64::MAX, Some(1), None).used, mib512);
    }

    #[test]
    fn mib_rounds_down() {
        assert_eq!(mib(536870912), 512);
        assert_eq!(mib(536870911), 511);
        assert_eq!(mib(0), 0);
        assert_eq!(mib(u64::MAX), (1 << 44) - 1);
    }
}
