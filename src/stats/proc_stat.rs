//! `/proc/stat`: the host's CPU time and its online CPUs.
//!
//! Owns SPEC §7's split of the aggregate `cpu` line into busy (user + nice + system + irq +
//! softirq + steal) and total (busy + idle + iowait), and the count of `cpuN` lines. Guest time is
//! left out: the kernel already counts it in user and nice. Everything after the CPU lines
//! (`intr`, `ctxt`, ...) is not read.

use super::num::parse_u64;

/// Cumulative CPU time of all CPUs, in clock ticks (`USER_HZ`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuTimes {
    pub busy: u64,
    pub total: u64,
}

/// What sandboxd takes from `/proc/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// The aggregate `cpu` line.
    pub cpu: CpuTimes,
    /// The number of well-formed `cpuN` lines: the online CPUs.
    pub online: u32,
}

/// Parses `/proc/stat`. `None` when there is no well-formed aggregate `cpu` line. A CPU line is
/// well formed when its label is followed by at least the four fields every kernel has (user nice
/// system idle), all unsigned numbers; later fields a kernel lacks count as 0, extra ones are
/// ignored. Malformed lines are skipped.
pub fn parse(text: &str) -> Option<ProcStat> {
    let mut cpu = None;
    let mut online: u32 = 0;
    for line in text.lines() {
        if !line.starts_with("cpu") {
            // The CPU lines come first: the rest (`intr` alone can be kilobytes) is not read.
            if cpu.is_some() {
                break;
            }
            continue;
        }
        let mut tokens = line.split_ascii_whitespace();
        let Some(label) = tokens.next() else { continue };
        let Some(index) = label.strip_prefix("cpu") else {
            continue;
        };
        let Some(times) = cpu_times(tokens) else {
            continue;
        };
        if index.is_empty() {
            cpu.get_or_insert(times);
        } else if parse_u64(index).is_some() {
            online = online.saturating_add(1);
        }
    }
    cpu.map(|cpu| ProcStat { cpu, online })
}

/// user nice system idle [iowait irq softirq steal guest guest_nice], saturating sums.
fn cpu_times<'a>(tokens: impl Iterator<Item = &'a str>) -> Option<CpuTimes> {
    let mut f = [0u64; 8];
    let mut n = 0;
    for token in tokens.take(f.len()) {
        f[n] = parse_u64(token)?;
        n += 1;
    }
    if n < 4 {
        return None;
    }
    let [user, nice, system, idle, iowait, irq, softirq, steal] = f;
    let busy = [user, nice, system, irq, softirq, steal]
        .into_iter()
        .fold(0u64, u64::saturating_add);
    let total = busy.saturating_add(idle).saturating_add(iowait);
    Some(CpuTimes { busy, total })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine's /proc/stat (Linux 6.18, 2 vCPUs; the intr line shortened).
    const REAL_2CPU: &str = "\
cpu  4472 0 2002 35389 177 0 16 21 0 0
cpu0 2028 0 917 18059 17 0 5 9 0 0
cpu1 2443 0 1085 17329 159 0 11 11 0 0
intr 97860 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 1 1 15 0 0 0 0 42 20 0 16 1 6711
ctxt 197244
btime 1795262101
processes 4824
procs_running 2
procs_blocked 0
softirq 46956 0 6973 4 771 6710 0 23 14934 0 17541
";

    #[test]
    fn real_sample() {
        let stat = parse(REAL_2CPU).expect("cpu line");
        assert_eq!(stat.online, 2);
        assert_eq!(stat.cpu.busy, 4472 + 2002 + 16 + 21);
        assert_eq!(stat.cpu.total, 4472 + 2002 + 16 + 21 + 35389 + 177);
    }

    #[test]
    fn guest_is_not_counted_twice() {
        let stat = parse("cpu 10 1 2 100 3 4 5 6 1000 1000\ncpu0 10 1 2 100 3 4 5 6 1000 1000\n")
            .expect("cpu line");
        assert_eq!(stat.cpu.busy, 10 + 1 + 2 + 4 + 5 + 6);
        assert_eq!(stat.cpu.total, stat.cpu.busy + 100 + 3);
    }

    #[test]
    fn old_kernels_with_fewer_fields() {
        // Linux 2.4 had four fields; 2.6.0 seven.
        let stat = parse("cpu 1 2 3 4\ncpu0 1 2 3 4\n").expect("cpu line");
        assert_eq!(stat.cpu, CpuTimes { busy: 6, total: 10 });
        let stat = parse("cpu 1 2 3 4 5 6 7\ncpu0 1 2 3 4 5 6 7\n").expect("cpu line");
        // busy = 1 + 2 + 3 + irq 6 + softirq 7; total adds idle 4 and iowait 5.
        assert_eq!(
            stat.cpu,
            CpuTimes {
                busy: 19,
                total: 28
            }
        );
    }

    #[test]
    fn offline_cpus_are_absent_lines() {
        // cpu1 offline: the kernel prints no line for it.
        let text = "cpu 1 0 1 8 0 0 0 0 0 0\ncpu0 1 0 1 8 0 0 0 0 0 0\ncpu2 0 0 0 0 0 0 0 0 0 0\n";
        assert_eq!(parse(text).map(|s| s.online), Some(2));
    }

    #[test]
    fn garbage_lines_are_skipped() {
        let text = "\
garbage
cpu x y z w
cpu 1 2
cpu  1 0 1 2 0 0 0 0 0 0
cpu0 1 0 1 2 0 0 0 0 0 0
cpux 1 0 1 2 0 0 0 0 0 0
cpu1 1 0 -1 2 0 0 0 0 0 0
cpu1
cpu2 1 0 1 2 0 0 0 0 0 0

\u{fffd}\u{fffd}
cpu 9 9 9 9 9 9 9 9 9 9
";
        let stat = parse(text).expect("cpu line");
        assert_eq!(stat.cpu, CpuTimes { busy: 2, total: 4 });
        assert_eq!(stat.online, 2);
    }

    #[test]
    fn nothing_after_the_cpu_lines_is_read() {
        let text = "cpu 1 0 1 2 0 0 0 0 0 0\ncpu0 1 0 1 2 0 0 0 0 0 0\nintr 5 0 0\ncpu1 1 0 1 2\n";
        let stat = parse(text).expect("cpu line");
        assert_eq!(stat.online, 1, "a cpu line after intr was counted");
    }

    #[test]
    fn huge_values_saturate_or_reject() {
        let max = u64::MAX;
        let stat = parse(&format!(
            "cpu {max} {max} 0 {max} 0 0 0 0 0 0\ncpu0 1 1 1 1\n"
        ))
        .expect("cpu line");
        assert_eq!(
            stat.cpu,
            CpuTimes {
                busy: max,
                total: max
            }
        );
        // One past u64::MAX is not a number: the line is skipped.
        assert_eq!(parse("cpu 18446744073709551616 0 0 0 0 0 0 0 0 0\n"), None);
    }

    #[test]
    fn no_aggregate_line_is_none() {
        assert_eq!(parse(""), None);
        assert_eq!(parse("cpu0 1 2 3 4\nintr 1\n"), None);
    }
}
