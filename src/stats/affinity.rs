//! `/proc/self/status`: the CPUs this process may run on (`Cpus_allowed_list`).
//!
//! Owns parsing the CPU list format (`0-3,8,10-11`) into a count. Read from the proc root rather
//! than through `sched_getaffinity` so that fixtures control it, and rather than
//! `std::thread::available_parallelism`, which also applies the real machine's cgroup quota behind
//! `--cgroup-root`'s back.

use super::num::parse_u64;

/// The number of CPUs in the `Cpus_allowed_list:` line of a `/proc/<pid>/status` text; `None`
/// when the line is absent or malformed.
pub fn parse_status(text: &str) -> Option<u32> {
    let list = text
        .lines()
        .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))?;
    parse_cpu_list(list.trim())
}

/// Counts the CPUs of a list such as `0-3,8,10-11` (12 would be 7). `None` for an empty list, a
/// reversed range or anything not made of numbers, commas and dashes.
pub fn parse_cpu_list(list: &str) -> Option<u32> {
    let mut count: u64 = 0;
    for part in list.split(',') {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (parse_u64(a)?, parse_u64(b)?),
            None => {
                let cpu = parse_u64(part)?;
                (cpu, cpu)
            }
        };
        let n = last.checked_sub(first)?.checked_add(1)?;
        count = count.saturating_add(n);
    }
    (count > 0).then(|| u32::try_from(count).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_status_lines() {
        // From this machine's /proc/self/status (2 vCPUs).
        let text = "Name:\tcat\nThreads:\t1\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\nMems_allowed_list:\t0\n";
        assert_eq!(parse_status(text), Some(2));
    }

    #[test]
    fn lists() {
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("5"), Some(1));
        assert_eq!(parse_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(parse_cpu_list("0-127"), Some(128));
        assert_eq!(parse_cpu_list("0-4294967296"), Some(u32::MAX), "saturates");
        assert_eq!(
            parse_cpu_list("0-18446744073709551615"),
            None,
            "2^64 CPUs: rejected"
        );
    }

    #[test]
    fn malformed() {
        assert_eq!(parse_status("Name:\tcat\n"), None);
        assert_eq!(parse_status("Cpus_allowed_list:\t\n"), None);
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("0-"), None);
        assert_eq!(parse_cpu_list("a-b"), None);
        assert_eq!(parse_cpu_list("0,,1"), None);
        assert_eq!(parse_cpu_list("0 1"), None);
        assert_eq!(parse_cpu_list("99999999999999999999"), None);
    }
}
