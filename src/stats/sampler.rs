//! `Sampler`: keeps the sources open and turns one pass over them into `Metrics`.
//!
//! Owns the I/O of the module: opening the files once (`new`), re-reading each with `pread` into
//! one reused buffer (`sample`), and the choice between host and cgroup figures. Memory figures are
//! the cgroup's when its limit is below MemTotal; CPU figures are the cgroup's when its quota,
//! rounded up, is below the online CPUs and the affinity mask. Limits are read from the process's
//! cgroup up to its hierarchy's mount and the smallest applies, so a limit set on a parent (a
//! systemd slice, a pod) counts. No thread, no timer: CPU percentages cover the time since the
//! previous `sample` (or `new`).

use std::borrow::Cow;
use std::fmt;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::cgroup_detect::{self, CgroupDir, Layout};
use super::compute::{self, MemFigures};
use super::proc_stat::{self, CpuTimes};
use super::quota::CpuQuota;
use super::{affinity, cgroup_v1, cgroup_v2, meminfo, Metrics};
use crate::sys::statvfs::statvfs;

/// The buffer's first size: /proc/stat of a few dozen CPUs fits.
const INITIAL_BUF: usize = 16 * 1024;
/// The buffer stops growing here; a longer file is read this far (the CPU lines of /proc/stat
/// come first).
const MAX_BUF: usize = 1 << 20;

/// Samples resource usage; see the module docs. `Send`, so it can live in a `Mutex`.
pub struct Sampler {
    proc_stat: File,
    meminfo: File,
    /// CPUs in the affinity mask when the sampler was made; `None` when unknown.
    affinity: Option<u32>,
    memory: MemorySource,
    cpu: CpuSource,
    buf: Vec<u8>,
    /// `/proc/stat` at the previous sample.
    prev_host: CpuTimes,
    /// The cgroup's CPU usage in nanoseconds, and when it was read.
    prev_cgroup: Option<(u64, Instant)>,
}

impl fmt::Debug for Sampler {
    /// The sources and the previous readings, without the buffer's bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sampler")
            .field("proc_stat", &self.proc_stat)
            .field("meminfo", &self.meminfo)
            .field("affinity", &self.affinity)
            .field("memory", &self.memory)
            .field("cpu", &self.cpu)
            .field("prev_host", &self.prev_host)
            .field("prev_cgroup", &self.prev_cgroup)
            .finish_non_exhaustive()
    }
}

/// Where a memory limit may come from. The limit files run from the process's cgroup up.
#[derive(Debug)]
enum MemorySource {
    Host,
    V2 {
        max: Vec<File>,
        current: File,
        stat: Option<File>,
    },
    V1 {
        limit: Vec<File>,
        usage: File,
        stat: Option<File>,
    },
}

/// Where a CPU quota may come from, and the cgroup's CPU usage. Quota files run from the
/// process's cgroup up.
#[derive(Debug)]
enum CpuSource {
    Host,
    V2 {
        max: Vec<File>,
        stat: Option<File>,
    },
    V1 {
        /// `cpu.cfs_quota_us` and `cpu.cfs_period_us` of one cgroup.
        cfs: Vec<(File, File)>,
        usage: Option<File>,
    },
}

impl Sampler {
    /// Opens and keeps the sources under `proc_root` (normally `/proc`) and `cgroup_root`
    /// (normally `/sys/fs/cgroup`), detects the process's cgroup, and takes the first CPU reading
    /// so that the first `sample` covers the time since now. Fails only when `<proc_root>/stat` or
    /// `<proc_root>/meminfo` can't be opened; a cgroup file that can't be opened is a limit that
    /// does not apply.
    pub fn new(proc_root: &Path, cgroup_root: &Path) -> io::Result<Sampler> {
        let proc_stat = open_required(&proc_root.join("stat"))?;
        let meminfo = open_required(&proc_root.join("meminfo"))?;
        let self_dir = proc_root.join("self");
        let read = |name: &str| {
            fs::read(self_dir.join(name))
                .ok()
                .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        };
        let affinity = read("status").and_then(|text| affinity::parse_status(&text));
        let layout = cgroup_detect::detect(
            read("cgroup").as_deref(),
            read("mountinfo").as_deref(),
            cgroup_root,
            Path::exists,
        );
        let mut sampler = Sampler {
            proc_stat,
            meminfo,
            affinity,
            memory: MemorySource::open(&layout),
            cpu: CpuSource::open(&layout),
            buf: Vec::new(),
            prev_host: CpuTimes::default(),
            prev_cgroup: None,
        };
        if let Ok(text) = read_text(&sampler.proc_stat, &mut sampler.buf) {
            if let Some(stat) = proc_stat::parse(&text) {
                sampler.prev_host = stat.cpu;
            }
        }
        sampler.prev_cgroup = sampler
            .cpu
            .usage_ns(&mut sampler.buf)
            .map(|usage| (usage, Instant::now()));
        Ok(sampler)
    }

    /// Reads every kept file and computes the ten figures. Fails when `/proc/stat` or
    /// `/proc/meminfo` can't be read or lacks its essential line, or when `statvfs("/")` fails; a
    /// cgroup file that can't be read or parsed is a limit that does not apply.
    pub fn sample(&mut self) -> io::Result<Metrics> {
        let now = Instant::now();
        let stat = proc_stat::parse(&read_text(&self.proc_stat, &mut self.buf)?)
            .ok_or_else(|| invalid_data("/proc/stat has no cpu line"))?;
        let mem = meminfo::parse(&read_text(&self.meminfo, &mut self.buf)?);
        let host_total = mem
            .mem_total
            .ok_or_else(|| invalid_data("/proc/meminfo has no MemTotal"))?;

        let host_pct = compute::host_cpu_percent(self.prev_host, stat.cpu);
        self.prev_host = stat.cpu;
        let available = stat.online.max(1).min(self.affinity.unwrap_or(u32::MAX));
        let (cpu_count, cpu_used_pct) = match self.cpu.quota_cpus(&mut self.buf) {
            Some(cpus) if cpus < available => {
                (cpus, self.cgroup_cpu_percent(now, cpus).unwrap_or(host_pct))
            }
            _ => (available, host_pct),
        };

        let m = self
            .memory
            .limited_figures(&mut self.buf, host_total)
            .unwrap_or(MemFigures {
                total: host_total,
                used: mem.used().unwrap_or(0),
                cache: mem.cache(),
            });

        let disk = statvfs(Path::new("/"))?;
        Ok(Metrics {
            ts: unix_seconds(),
            cpu_count,
            cpu_used_pct,
            mem_total: m.total,
            mem_used: m.used,
            mem_cache: m.cache,
            mem_total_mib: compute::mib(m.total),
            mem_used_mib: compute::mib(m.used),
            disk_used: disk.used_bytes(),
            disk_total: disk.total_bytes(),
        })
    }

    /// The cgroup's CPU usage since its previous reading over the wall time since then on `cpus`
    /// CPUs; `None` without a usage reading now and before.
    fn cgroup_cpu_percent(&mut self, now: Instant, cpus: u32) -> Option<f64> {
        let usage = self.cpu.usage_ns(&mut self.buf)?;
        let (prev_usage, prev_at) = self.prev_cgroup.replace((usage, now))?;
        Some(compute::cgroup_cpu_percent(
            usage.saturating_sub(prev_usage),
            now.saturating_duration_since(prev_at),
            cpus,
        ))
    }
}

impl MemorySource {
    /// v2 when the process's v2 cgroup has the memory controller, else v1's memory hierarchy,
    /// else none; a source with no limit file anywhere is none.
    fn open(layout: &Layout) -> MemorySource {
        if let Some(cg) = &layout.v2 {
            let max = open_chain(cg, "memory.max");
            if let (false, Some(current)) = (max.is_empty(), open(&cg.dir, "memory.current")) {
                let stat = open(&cg.dir, "memory.stat");
                return MemorySource::V2 { max, current, stat };
            }
        }
        if let Some(cg) = &layout.memory_v1 {
            let limit = open_chain(cg, "memory.limit_in_bytes");
            if let (false, Some(usage)) = (limit.is_empty(), open(&cg.dir, "memory.usage_in_bytes"))
            {
                let stat = open(&cg.dir, "memory.stat");
                return MemorySource::V1 { limit, usage, stat };
            }
        }
        MemorySource::Host
    }

    /// The cgroup's figures when its smallest limit is below `host_total`; `None` otherwise or
    /// when the usage can't be read.
    fn limited_figures(&self, buf: &mut Vec<u8>, host_total: u64) -> Option<MemFigures> {
        match self {
            MemorySource::Host => None,
            MemorySource::V2 { max, current, stat } => {
                let limit = min_parsed(max, buf, cgroup_v2::parse_memory_max)
                    .filter(|&limit| limit < host_total)?;
                let usage = read_parsed(current, buf, cgroup_v2::parse_memory_current)?;
                let stat = stat
                    .as_ref()
                    .and_then(|f| read_parsed(f, buf, |t| Some(cgroup_v2::parse_memory_stat(t))))
                    .unwrap_or_default();
                Some(compute::cgroup_memory(
                    limit,
                    usage,
                    stat.inactive_file,
                    stat.file,
                ))
            }
            MemorySource::V1 { limit, usage, stat } => {
                let limit = min_parsed(limit, buf, cgroup_v1::parse_limit_in_bytes)
                    .filter(|&limit| limit < host_total)?;
                let usage = read_parsed(usage, buf, cgroup_v1::parse_usage_in_bytes)?;
                let stat = stat
                    .as_ref()
                    .and_then(|f| read_parsed(f, buf, |t| Some(cgroup_v1::parse_memory_stat(t))))
                    .unwrap_or_default();
                Some(compute::cgroup_memory(
                    limit,
                    usage,
                    stat.inactive_file,
                    stat.cache,
                ))
            }
        }
    }
}

impl CpuSource {
    /// v2 when the process's v2 cgroup or a parent has `cpu.max`, else v1's cpu hierarchy (usage
    /// from cpuacct), else none.
    fn open(layout: &Layout) -> CpuSource {
        if let Some(cg) = &layout.v2 {
            let max = open_chain(cg, "cpu.max");
            if !max.is_empty() {
                let stat = open(&cg.dir, "cpu.stat");
                return CpuSource::V2 { max, stat };
            }
        }
        if let Some(cg) = &layout.cpu_v1 {
            let cfs: Vec<(File, File)> = cg
                .leaf_to_mount()
                .filter_map(|d| Some((open(d, "cpu.cfs_quota_us")?, open(d, "cpu.cfs_period_us")?)))
                .collect();
            if !cfs.is_empty() {
                let usage = layout
                    .cpuacct_v1
                    .as_ref()
                    .and_then(|cg| open(&cg.dir, "cpuacct.usage"));
                return CpuSource::V1 { cfs, usage };
            }
        }
        CpuSource::Host
    }

    /// The smallest quota from the process's cgroup up, in whole CPUs; `None` when unlimited.
    fn quota_cpus(&self, buf: &mut Vec<u8>) -> Option<u32> {
        match self {
            CpuSource::Host => None,
            CpuSource::V2 { max, .. } => {
                min_parsed(max, buf, |t| cgroup_v2::parse_cpu_max(t).map(|q| q.cpus()))
            }
            CpuSource::V1 { cfs, .. } => cfs
                .iter()
                .filter_map(|(quota, period)| {
                    let quota = read_parsed(quota, buf, cgroup_v1::parse_cfs_quota_us)?;
                    let period = read_parsed(period, buf, cgroup_v1::parse_cfs_period_us)?;
                    CpuQuota::new(quota, period).map(|q| q.cpus())
                })
                .min(),
        }
    }

    /// The cgroup's cumulative CPU usage in nanoseconds.
    fn usage_ns(&self, buf: &mut Vec<u8>) -> Option<u64> {
        match self {
            CpuSource::V2 { stat: Some(f), .. } => {
                read_parsed(f, buf, cgroup_v2::parse_cpu_stat_usage_usec)
                    .map(|usec| usec.saturating_mul(1000))
            }
            CpuSource::V1 { usage: Some(f), .. } => {
                read_parsed(f, buf, cgroup_v1::parse_cpuacct_usage)
            }
            _ => None,
        }
    }
}

fn open_required(path: &Path) -> io::Result<File> {
    File::open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("opening {}: {e}", path.display())))
}

fn open(dir: &Path, name: &str) -> Option<File> {
    File::open(dir.join(name)).ok()
}

/// `name` in each directory from the process's cgroup up to the mount, where it exists.
fn open_chain(cg: &CgroupDir, name: &str) -> Vec<File> {
    cg.leaf_to_mount().filter_map(|d| open(d, name)).collect()
}

/// The whole file, read from offset 0 with `pread` into `buf`, growing it when a read fills it.
/// A short read is the end: procfs and cgroupfs produce a file's text in one go, and a second
/// read would have the kernel produce it again.
fn read_text<'b>(file: &File, buf: &'b mut Vec<u8>) -> io::Result<Cow<'b, str>> {
    if buf.is_empty() {
        buf.resize(INITIAL_BUF, 0);
    }
    let mut len = 0;
    loop {
        match file.read_at(&mut buf[len..], len as u64) {
            Ok(n) => {
                len += n;
                if n == 0 || len < buf.len() {
                    break;
                }
                if buf.len() >= MAX_BUF {
                    break;
                }
                let grown = (buf.len() * 2).min(MAX_BUF);
                buf.resize(grown, 0);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    // Valid UTF-8 (always, from the kernel) is checked at SIMD speed; only invalid text pays
    // for the lossy copy.
    match std::str::from_utf8(&buf[..len]) {
        Ok(text) => Ok(Cow::Borrowed(text)),
        Err(_) => Ok(String::from_utf8_lossy(&buf[..len])),
    }
}

/// Reads and parses a file; a read error is `None` like a parse failure.
fn read_parsed<T>(
    file: &File,
    buf: &mut Vec<u8>,
    parse: impl FnOnce(&str) -> Option<T>,
) -> Option<T> {
    read_text(file, buf).ok().and_then(|text| parse(&text))
}

/// The smallest value parsed from `files`; `None` when none gives one.
fn min_parsed<T: Ord>(
    files: &[File],
    buf: &mut Vec<u8>,
    parse: impl Fn(&str) -> Option<T>,
) -> Option<T> {
    files
        .iter()
        .filter_map(|f| read_parsed(f, buf, &parse))
        .min()
}

fn invalid_data(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

fn unix_seconds() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_secs()).map_or(i64::MIN, |s| -s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::time::Duration;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    /// A fixture /proc and cgroup tree in a fresh temporary directory, removed on drop.
    struct Fixture {
        dir: tempfile::TempDir,
    }

    impl Fixture {
        /// A 4-CPU, 8 GiB machine: MemAvailable 6 GiB, Cached 1 GiB, SReclaimable 256 MiB, all
        /// four CPUs in the affinity mask; `self/cgroup` as given.
        fn new(name: &str, self_cgroup: &str) -> Fixture {
            let dir = tempfile::Builder::new()
                .prefix(&format!("sandboxd-stats-{name}-"))
                .tempdir()
                .expect("create fixture");
            fs::create_dir(dir.path().join("cgroup")).expect("create fixture");
            let fx = Fixture { dir };
            fx.set_proc_stat(1000, 10_000);
            fx.write(
                "proc/meminfo",
                "MemTotal:        8388608 kB\nMemFree:         4194304 kB\n\
                 MemAvailable:    6291456 kB\nBuffers:            1024 kB\n\
                 Cached:          1048576 kB\nSReclaimable:     262144 kB\n",
            );
            fx.write(
                "proc/self/status",
                "Name:\tsandboxd\nCpus_allowed_list:\t0-3\n",
            );
            fx.write("proc/self/cgroup", self_cgroup);
            fx
        }

        fn write(&self, rel: &str, text: &str) {
            let path = self.root().join(rel);
            fs::create_dir_all(path.parent().expect("parent")).expect("create dir");
            fs::write(&path, text).expect("write fixture");
        }

        /// Four CPUs; the aggregate line has `busy` (all user) and `total` ticks.
        fn set_proc_stat(&self, busy: u64, total: u64) {
            let idle = total - busy;
            let cpus: String = (0..4)
                .map(|i| format!("cpu{i} {} 0 0 {} 0 0 0 0 0 0\n", busy / 4, idle / 4))
                .collect();
            self.write(
                "proc/stat",
                &format!("cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\n{cpus}intr 1 0\nctxt 5\n"),
            );
        }

        fn root(&self) -> &Path {
            self.dir.path()
        }

        fn proc(&self) -> PathBuf {
            self.root().join("proc")
        }

        fn cgroup(&self) -> PathBuf {
            self.root().join("cgroup")
        }

        fn sampler(&self) -> Sampler {
            Sampler::new(&self.proc(), &self.cgroup()).expect("sampler")
        }
    }

    /// mountinfo's escaping of a mount point.
    fn escape(path: &Path) -> String {
        path.display()
            .to_string()
            .replace('\\', "\\134")
            .replace(' ', "\\040")
            .replace('\t', "\\011")
            .replace('\n', "\\012")
    }

    /// A v2 cgroup with the memory and cpu controllers: 300 MiB charged, of which 100 MiB
    /// inactive file pages and 150 MiB file pages.
    fn write_v2_memory(fx: &Fixture, dir: &str, max: &str) {
        fx.write(&format!("{dir}/memory.max"), max);
        fx.write(&format!("{dir}/memory.current"), "314572800\n");
        fx.write(
            &format!("{dir}/memory.stat"),
            "anon 104857600\nfile 157286400\nkernel 1048576\nshmem 0\n\
             inactive_anon 104857600\nactive_anon 0\ninactive_file 104857600\n\
             active_file 52428800\nunevictable 0\n",
        );
    }

    fn host_figures(m: &Metrics) -> (u64, u64, u64) {
        (m.mem_total, m.mem_used, m.mem_cache)
    }

    const HOST: (u64, u64, u64) = (8 * GIB, 2 * GIB, GIB + 256 * MIB);

    #[test]
    fn sampler_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<Sampler>();
    }

    #[test]
    fn v2_memory_limit() {
        let fx = Fixture::new("v2-mem", "0::/\n");
        // The real machine's mount point, not under the fixture root: conventional layout.
        fx.write(
            "proc/self/mountinfo",
            "35 24 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
        );
        fx.write("cgroup/cgroup.controllers", "cpuset cpu io memory pids\n");
        write_v2_memory(&fx, "cgroup", "536870912\n");
        fx.write("cgroup/cpu.max", "max 100000\n");
        let m = fx.sampler().sample().expect("sample");
        assert_eq!(m.mem_total, 536870912);
        assert_eq!(m.mem_total_mib, 512);
        assert_eq!(m.mem_used, 200 * MIB);
        assert_eq!(m.mem_used_mib, 200);
        assert_eq!(m.mem_cache, 150 * MIB);
        assert_eq!(m.cpu_count, 4);
    }

    #[test]
    fn v2_limits_on_a_parent_found_through_mountinfo() {
        let fx = Fixture::new("v2-nested", "0::/sandbox/inner\n");
        fx.write(
            "proc/self/mountinfo",
            &format!(
                "35 24 0:30 / {} rw,nosuid shared:9 - cgroup2 cgroup2 rw\n",
                escape(&fx.cgroup())
            ),
        );
        fx.write("cgroup/cgroup.controllers", "cpu memory\n");
        fx.write("cgroup/sandbox/cgroup.controllers", "cpu memory\n");
        fx.write("cgroup/sandbox/memory.max", "536870912\n");
        fx.write("cgroup/sandbox/cpu.max", "150000 100000\n");
        fx.write("cgroup/sandbox/inner/cgroup.controllers", "cpu memory\n");
        write_v2_memory(&fx, "cgroup/sandbox/inner", "max\n");
        fx.write("cgroup/sandbox/inner/cpu.max", "max 100000\n");
        fx.write("cgroup/sandbox/inner/cpu.stat", "usage_usec 1000\n");
        let m = fx.sampler().sample().expect("sample");
        assert_eq!((m.mem_total, m.mem_total_mib), (536870912, 512));
        assert_eq!(m.mem_used, 200 * MIB);
        assert_eq!(m.cpu_count, 2);
    }

    #[test]
    fn v1_memory_limit() {
        // This machine's shape: hybrid, memory in a v1 child cgroup, an empty v2.
        let fx = Fixture::new("v1-mem", "4:memory:/sandbox\n2:cpuacct:/\n1:cpu:/\n0::/\n");
        fx.write("cgroup/unified/cgroup.controllers", "\n");
        fx.write("cgroup/unified/cpu.stat", "usage_usec 5\n");
        fx.write(
            "cgroup/memory/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        fx.write("cgroup/memory/memory.usage_in_bytes", "698978304\n");
        fx.write("cgroup/memory/sandbox/memory.limit_in_bytes", "536870912\n");
        fx.write("cgroup/memory/sandbox/memory.usage_in_bytes", "314572800\n");
        fx.write(
            "cgroup/memory/sandbox/memory.stat",
            "cache 1\nrss 2\ninactive_file 3\nhierarchical_memory_limit 536870912\n\
             total_cache 157286400\ntotal_rss 104857600\ntotal_inactive_file 104857600\n",
        );
        fx.write("cgroup/cpu/cpu.cfs_quota_us", "-1\n");
        fx.write("cgroup/cpu/cpu.cfs_period_us", "100000\n");
        fx.write("cgroup/cpuacct/cpuacct.usage", "34042308066\n");
        let m = fx.sampler().sample().expect("sample");
        assert_eq!((m.mem_total, m.mem_total_mib), (536870912, 512));
        assert_eq!((m.mem_used, m.mem_used_mib), (200 * MIB, 200));
        assert_eq!(m.mem_cache, 150 * MIB);
        assert_eq!(m.cpu_count, 4);
    }

    #[test]
    fn v2_cpu_quota_and_usage() {
        let fx = Fixture::new("v2-cpu", "0::/\n");
        fx.write("cgroup/cgroup.controllers", "cpu memory\n");
        fx.write("cgroup/cpu.max", "150000 100000\n");
        fx.write(
            "cgroup/cpu.stat",
            "usage_usec 1000000\nuser_usec 1\nsystem_usec 2\n",
        );
        let mut s = fx.sampler();
        assert_eq!(s.sample().expect("sample").cpu_count, 2);
        // No usage since: 0 whatever the host does.
        fx.set_proc_stat(2000, 11_000);
        assert_eq!(s.sample().expect("sample").cpu_used_pct, 0.0);
        // More CPU time than wall time x 2 CPUs could hold: clamped.
        fx.write("cgroup/cpu.stat", "usage_usec 1000000000\n");
        assert_eq!(s.sample().expect("sample").cpu_used_pct, 100.0);
        // 50 ms of CPU over at least 100 ms on 2 CPUs: at most 25 %.
        std::thread::sleep(Duration::from_millis(100));
        fx.write("cgroup/cpu.stat", "usage_usec 1000050000\n");
        let pct = s.sample().expect("sample").cpu_used_pct;
        assert!(pct > 0.0 && pct <= 25.0, "{pct}");
    }

    #[test]
    fn v1_cfs_quota_and_cpuacct_usage() {
        let fx = Fixture::new("v1-cpu", "3:cpu,cpuacct:/\n2:memory:/\n");
        fx.write("cgroup/cpu,cpuacct/cpu.cfs_quota_us", "150000\n");
        fx.write("cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
        fx.write("cgroup/cpu,cpuacct/cpuacct.usage", "5000\n");
        fx.write(
            "cgroup/memory/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        fx.write("cgroup/memory/memory.usage_in_bytes", "1000\n");
        let mut s = fx.sampler();
        let m = s.sample().expect("sample");
        assert_eq!(m.cpu_count, 2);
        assert_eq!(host_figures(&m), HOST, "unlimited v1 memory");
        fx.write("cgroup/cpu,cpuacct/cpuacct.usage", "5000000000000\n");
        assert_eq!(s.sample().expect("sample").cpu_used_pct, 100.0);
    }

    #[test]
    fn unlimited_cgroup_gives_proc_figures() {
        let fx = Fixture::new("unlimited", "0::/\n");
        fx.write("cgroup/cgroup.controllers", "cpu memory\n");
        write_v2_memory(&fx, "cgroup", "max\n");
        fx.write("cgroup/cpu.max", "max 100000\n");
        fx.write("cgroup/cpu.stat", "usage_usec 0\n");
        let mut s = fx.sampler();
        // The first sample covers the time since `new`: 100 of 400 ticks busy.
        fx.set_proc_stat(1100, 10_400);
        let m = s.sample().expect("sample");
        assert_eq!(host_figures(&m), HOST);
        assert_eq!((m.mem_total_mib, m.mem_used_mib), (8192, 2048));
        assert_eq!(m.cpu_count, 4);
        assert_eq!(m.cpu_used_pct, 25.0);
        // Nothing happened since.
        assert_eq!(s.sample().expect("sample").cpu_used_pct, 0.0);
    }

    #[test]
    fn limits_at_or_above_the_machine_do_not_apply() {
        let fx = Fixture::new("above", "0::/\n");
        fx.write("cgroup/cgroup.controllers", "cpu memory\n");
        write_v2_memory(&fx, "cgroup", &format!("{}\n", 8 * GIB));
        fx.write("cgroup/cpu.max", "400000 100000\n");
        let m = fx.sampler().sample().expect("sample");
        assert_eq!(host_figures(&m), HOST);
        assert_eq!(m.cpu_count, 4);
        // One byte less applies.
        write_v2_memory(&fx, "cgroup", &format!("{}\n", 8 * GIB - 1));
        fx.write("cgroup/cpu.max", "300001 100000\n");
        let m = fx.sampler().sample().expect("sample");
        assert_eq!(m.mem_total, 8 * GIB - 1);
        assert_eq!(m.cpu_count, 4, "3.00001 CPUs round up to 4: not below");
        fx.write("cgroup/cpu.max", "300000 100000\n");
        assert_eq!(fx.sampler().sample().expect("sample").cpu_count, 3);
    }

    #[test]
    fn affinity_caps_cpu_count() {
        let fx = Fixture::new("affinity", "0::/\n");
        fx.write("proc/self/status", "Cpus_allowed_list:\t1-2\n");
        fx.write("cgroup/cgroup.controllers", "cpu\n");
        fx.write("cgroup/cpu.max", "300000 100000\n");
        assert_eq!(fx.sampler().sample().expect("sample").cpu_count, 2);
        fx.write("cgroup/cpu.max", "100000 100000\n");
        assert_eq!(fx.sampler().sample().expect("sample").cpu_count, 1);
    }

    #[test]
    fn no_cgroup_at_all() {
        let fx = Fixture::new("none", "");
        fs::remove_file(fx.root().join("proc/self/cgroup")).expect("rm");
        fs::remove_file(fx.root().join("proc/self/status")).expect("rm");
        let m = fx.sampler().sample().expect("sample");
        assert_eq!(host_figures(&m), HOST);
        assert_eq!(m.cpu_count, 4, "online CPUs, no affinity known");
    }

    #[test]
    fn new_needs_proc_stat_and_meminfo() {
        let fx = Fixture::new("missing", "0::/\n");
        fs::remove_file(fx.root().join("proc/meminfo")).expect("rm");
        let err = Sampler::new(&fx.proc(), &fx.cgroup()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("meminfo"), "{err}");
        fs::remove_file(fx.root().join("proc/stat")).expect("rm");
        let err = Sampler::new(&fx.proc(), &fx.cgroup()).unwrap_err();
        assert!(err.to_string().contains("stat"), "{err}");
    }

    #[test]
    fn garbage_proc_files_are_errors_not_panics() {
        let fx = Fixture::new("garbage", "0::/\n");
        fx.write("proc/stat", "garbage\n\u{0}\u{1}\n");
        let mut s = fx.sampler();
        assert_eq!(s.sample().unwrap_err().kind(), io::ErrorKind::InvalidData);
        fx.set_proc_stat(1000, 10_000);
        fx.write("proc/meminfo", "MemFree: 1 kB\n");
        assert_eq!(s.sample().unwrap_err().kind(), io::ErrorKind::InvalidData);
        fs::write(
            fx.root().join("proc/meminfo"),
            b"MemTotal: 1024 kB\n\xff\xfe\n",
        )
        .expect("write");
        assert_eq!(s.sample().expect("sample").mem_total, 1024 * 1024);
    }

    #[test]
    fn garbage_cgroup_files_are_no_limit() {
        let fx = Fixture::new("cg-garbage", "0::/\n");
        fx.write("cgroup/cgroup.controllers", "cpu memory\n");
        write_v2_memory(&fx, "cgroup", "512M\n");
        fx.write("cgroup/cpu.max", "1.5 CPUs\n");
        let m = fx.sampler().sample().expect("sample");
        assert_eq!(host_figures(&m), HOST);
        assert_eq!(m.cpu_count, 4);
        // A limit without readable usage can't give figures: the host's.
        write_v2_memory(&fx, "cgroup", "536870912\n");
        fx.write("cgroup/memory.current", "lots\n");
        assert_eq!(host_figures(&fx.sampler().sample().expect("sample")), HOST);
        // A missing memory.stat counts as no file pages.
        fx.write("cgroup/memory.current", "314572800\n");
        fs::remove_file(fx.root().join("cgroup/memory.stat")).expect("rm");
        let m = fx.sampler().sample().expect("sample");
        assert_eq!(
            (m.mem_total, m.mem_used, m.mem_cache),
            (512 * MIB, 300 * MIB, 0)
        );
    }

    #[test]
    fn long_files_grow_the_buffer() {
        let fx = Fixture::new("long", "0::/\n");
        // 100 KB of noise before the cpu lines: found only if the whole file is read.
        let noise = "x".repeat(100_000);
        fx.write(
            "proc/stat",
            &format!("{noise}\ncpu  1 0 0 3 0 0 0 0 0 0\ncpu0 1 0 0 3 0 0 0 0 0 0\n"),
        );
        let m = fx.sampler().sample().expect("sample");
        assert_eq!(m.cpu_count, 1);
    }

    /// Median cost of one `sample` on this machine, against the floor of reading the same files
    /// once with kept descriptors (and one statvfs). A measurement, not a check: it prints and
    /// never fails on timing. `cargo test --release --lib -- --ignored --nocapture sample_cost`.
    #[test]
    #[ignore]
    fn sample_cost() {
        let mut s = Sampler::new(Path::new("/proc"), Path::new("/sys/fs/cgroup")).expect("new");
        let files = s.kept_files();
        let mut buf = vec![0u8; INITIAL_BUF];
        let median = |f: &mut dyn FnMut()| {
            let mut times: Vec<Duration> = (0..10_000)
                .map(|_| {
                    let t = Instant::now();
                    f();
                    t.elapsed()
                })
                .collect();
            times.sort();
            times[times.len() / 2]
        };
        let floor = median(&mut || {
            for f in &files {
                std::hint::black_box(f.read_at(&mut buf, 0).expect("pread"));
            }
            std::hint::black_box(statvfs(Path::new("/")).expect("statvfs"));
        });
        let sample = median(&mut || {
            std::hint::black_box(s.sample().expect("sample"));
        });
        println!(
            "files read per sample: {}; floor {floor:?}; sample {sample:?} (x{:.2})",
            files.len(),
            sample.as_secs_f64() / floor.as_secs_f64()
        );
    }

    impl Sampler {
        /// Clones of the descriptors one `sample` reads when nothing is limited.
        fn kept_files(&self) -> Vec<File> {
            let mut files = vec![&self.proc_stat, &self.meminfo];
            match &self.memory {
                MemorySource::Host => {}
                MemorySource::V2 { max: l, .. } | MemorySource::V1 { limit: l, .. } => {
                    files.extend(l)
                }
            }
            match &self.cpu {
                CpuSource::Host => {}
                CpuSource::V2 { max, .. } => files.extend(max),
                CpuSource::V1 { cfs, .. } => files.extend(cfs.iter().flat_map(|(q, p)| [q, p])),
            }
            files
                .into_iter()
                .map(|f| f.try_clone().expect("dup"))
                .collect()
        }
    }
}
