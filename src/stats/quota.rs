//! `CpuQuota`: a CFS bandwidth limit, the one type cgroup v1 and v2 share.
//!
//! Owns turning a quota into a whole number of CPUs (rounded up); parsing is the versions' job.

/// `quota_us` of CPU time per `period_us` of wall time; both are positive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuQuota {
    pub quota_us: u64,
    pub period_us: u64,
}

impl CpuQuota {
    /// A limit; `None` when either figure is 0, which the kernel never reports for a set limit.
    pub fn new(quota_us: u64, period_us: u64) -> Option<CpuQuota> {
        (quota_us > 0 && period_us > 0).then_some(CpuQuota {
            quota_us,
            period_us,
        })
    }

    /// The CPUs the quota amounts to, rounded up: 150000/100000 is 2. At least 1.
    pub fn cpus(&self) -> u32 {
        let cpus = self.quota_us.div_ceil(self.period_us);
        u32::try_from(cpus).unwrap_or(u32::MAX).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_up() {
        let cpus = |q, p| CpuQuota::new(q, p).map(|q| q.cpus());
        assert_eq!(cpus(150_000, 100_000), Some(2));
        assert_eq!(cpus(100_000, 100_000), Some(1));
        assert_eq!(cpus(100_001, 100_000), Some(2));
        assert_eq!(cpus(1_000, 100_000), Some(1));
        assert_eq!(cpus(400_000, 100_000), Some(4));
        assert_eq!(cpus(u64::MAX, 1), Some(u32::MAX));
        assert_eq!(cpus(u64::MAX, u64::MAX), Some(1));
        assert_eq!(cpus(0, 100_000), None);
        assert_eq!(cpus(100_000, 0), None);
    }
}
