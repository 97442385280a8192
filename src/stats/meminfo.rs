//! `/proc/meminfo`: the host's memory figures.
//!
//! Owns parsing the handful of keys sandboxd needs (in bytes) and SPEC §7's arithmetic on them:
//! used = MemTotal - MemAvailable, cache = Cached + SReclaimable.

use super::num::parse_u64;

/// The keys of `/proc/meminfo` sandboxd uses, in bytes; `None` when a key is absent or malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Meminfo {
    pub mem_total: Option<u64>,
    pub mem_free: Option<u64>,
    /// Absent before Linux 3.14.
    pub mem_available: Option<u64>,
    pub buffers: Option<u64>,
    pub cached: Option<u64>,
    pub s_reclaimable: Option<u64>,
}

/// Parses `/proc/meminfo`: lines `Key: value kB` (or `Key: value` for counts). Values in kB are
/// converted to bytes, saturating; lines that don't fit the format are skipped; the first
/// occurrence of a key wins.
pub fn parse(text: &str) -> Meminfo {
    let mut m = Meminfo::default();
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let slot = match key {
            "MemTotal" => &mut m.mem_total,
            "MemFree" => &mut m.mem_free,
            "MemAvailable" => &mut m.mem_available,
            "Buffers" => &mut m.buffers,
            "Cached" => &mut m.cached,
            "SReclaimable" => &mut m.s_reclaimable,
            _ => continue,
        };
        if slot.is_none() {
            *slot = value_bytes(rest);
        }
        // All six found (SReclaimable, the last in the kernel's order, is line 23 or so): the
        // thirty-odd lines after it are not read.
        let found = [
            m.mem_total,
            m.mem_free,
            m.mem_available,
            m.buffers,
            m.cached,
            m.s_reclaimable,
        ];
        if found.iter().all(Option::is_some) {
            break;
        }
    }
    m
}

/// ` 24684084 kB` -> bytes; a bare number is taken as is.
fn value_bytes(rest: &str) -> Option<u64> {
    let mut tokens = rest.split_ascii_whitespace();
    let value = parse_u64(tokens.next()?)?;
    let bytes = match tokens.next() {
        None => value,
        Some("kB") => value.saturating_mul(1024),
        Some(_) => return None,
    };
    tokens.next().is_none().then_some(bytes)
}

impl Meminfo {
    /// MemTotal - MemAvailable. Kernels without MemAvailable get the older estimate
    /// MemTotal - (MemFree + Buffers + Cached + SReclaimable). Saturating; `None` without MemTotal.
    pub fn used(&self) -> Option<u64> {
        let total = self.mem_total?;
        let available = self.mem_available.unwrap_or_else(|| {
            [self.mem_free, self.buffers, self.cached, self.s_reclaimable]
                .into_iter()
                .flatten()
                .fold(0u64, u64::saturating_add)
        });
        Some(total.saturating_sub(available))
    }

    /// Cached + SReclaimable; an absent key counts as 0.
    pub fn cache(&self) -> u64 {
        self.cached
            .unwrap_or(0)
            .saturating_add(self.s_reclaimable.unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine's /proc/meminfo (Linux 6.18), abridged only at the end.
    const REAL: &str = "\
MemTotal:       24684084 kB
MemFree:        23598060 kB
MemAvailable:   24314496 kB
Buffers:            5008 kB
Cached:           911680 kB
SwapCached:            0 kB
Active:           459848 kB
Inactive:         453836 kB
Active(anon):       1520 kB
Inactive(anon):     4352 kB
Active(file):     458328 kB
Inactive(file):   449484 kB
Unevictable:       12260 kB
Shmem:              8872 kB
KReclaimable:      29428 kB
Slab:              50928 kB
SReclaimable:      29428 kB
SUnreclaim:        21500 kB
VmallocTotal:   34359738367 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
DirectMap1G:    25165824 kB
";

    #[test]
    fn real_sample() {
        let m = parse(REAL);
        assert_eq!(m.mem_total, Some(24684084 * 1024));
        assert_eq!(m.mem_free, Some(23598060 * 1024));
        assert_eq!(m.mem_available, Some(24314496 * 1024));
        assert_eq!(m.buffers, Some(5008 * 1024));
        assert_eq!(m.cached, Some(911680 * 1024));
        assert_eq!(m.s_reclaimable, Some(29428 * 1024));
        assert_eq!(m.used(), Some((24684084 - 24314496) * 1024));
        assert_eq!(m.cache(), (911680 + 29428) * 1024);
    }

    #[test]
    fn missing_mem_available_uses_the_old_estimate() {
        let m = parse("MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 10 kB\nCached: 200 kB\n");
        assert_eq!(m.mem_available, None);
        assert_eq!(m.s_reclaimable, None);
        assert_eq!(m.used(), Some((1000 - 310) * 1024));
        assert_eq!(m.cache(), 200 * 1024);
    }

    #[test]
    fn missing_mem_total() {
        let m = parse("MemFree: 100 kB\n");
        assert_eq!(m.mem_total, None);
        assert_eq!(m.used(), None);
        assert_eq!(parse(""), Meminfo::default());
    }

    #[test]
    fn huge_values_saturate_or_reject() {
        let m =
            parse("MemTotal: 18446744073709551615 kB\nMemAvailable: 99999999999999999999999 kB\n");
        assert_eq!(m.mem_total, Some(u64::MAX));
        assert_eq!(m.mem_available, None);
        let m = parse("MemTotal: 10 kB\nMemAvailable: 20 kB\n");
        assert_eq!(m.used(), Some(0), "available above total saturates at 0");
    }

    #[test]
    fn garbage_lines_are_skipped() {
        let text = "\
no colon here
MemTotal:
MemTotal: lots kB
MemTotal: 12 MB
MemTotal: 1 kB extra
MemTotal: -5 kB
\u{fffd}\u{fffd}: 7 kB
MemTotal:    2048 kB
MemTotal:    4096 kB
Cached: 7
";
        let m = parse(text);
        assert_eq!(
            m.mem_total,
            Some(2048 * 1024),
            "first well-formed line wins"
        );
        assert_eq!(m.cached, Some(7), "a bare number is bytes");
    }
}
