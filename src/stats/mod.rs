//! Resource usage for `GET /metrics` (SPEC §7): the ten figures of `Metrics`, from `/proc`, the
//! process's cgroup (v2, v1 or hybrid) and `statvfs("/")`.
//!
//! Owns the public API, `Metrics` and `Sampler`. The parsers below are pure (text in, numbers
//! out, no file opened); `sampler` alone does I/O, through descriptors opened once.

pub(crate) mod affinity;
pub(crate) mod cgroup_detect;
pub(crate) mod cgroup_v1;
pub(crate) mod cgroup_v2;
mod compute;
pub(crate) mod meminfo;
mod num;
pub(crate) mod proc_stat;
mod quota;
mod sampler;

pub use sampler::Sampler;

/// One sample, serialized as the `/metrics` body.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Metrics {
    /// Unix seconds, UTC.
    pub ts: i64,
    /// CPUs available to the sandbox.
    pub cpu_count: u32,
    /// Busy share of those CPUs since the previous sample, 0 to 100, two decimals.
    pub cpu_used_pct: f64,
    /// Memory available to the sandbox, bytes.
    pub mem_total: u64,
    /// Used memory, bytes.
    pub mem_used: u64,
    /// Page cache, bytes.
    pub mem_cache: u64,
    /// `mem_total` in MiB, rounded down.
    pub mem_total_mib: u64,
    /// `mem_used` in MiB, rounded down.
    pub mem_used_mib: u64,
    /// Bytes used on `/`: `(f_blocks - f_bfree) * f_frsize` (as `df`; reserved blocks are not used).
    pub disk_used: u64,
    /// Bytes of `/`: `f_blocks * f_frsize`.
    pub disk_total: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_the_ten_fields_of_spec() {
        let m = Metrics {
            ts: 1_700_000_000,
            cpu_count: 2,
            cpu_used_pct: 12.35,
            mem_total: 536870912,
            mem_used: 209715200,
            mem_cache: 157286400,
            mem_total_mib: 512,
            mem_used_mib: 200,
            disk_used: 750,
            disk_total: 1000,
        };
        assert_eq!(
            serde_json::to_string(&m).expect("json"),
            "{\"ts\":1700000000,\"cpu_count\":2,\"cpu_used_pct\":12.35,\"mem_total\":536870912,\
             \"mem_used\":209715200,\"mem_cache\":157286400,\"mem_total_mib\":512,\
             \"mem_used_mib\":200,\"disk_used\":750,\"disk_total\":1000}"
        );
    }
}
