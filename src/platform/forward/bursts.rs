//! When the forwarder's thread scans, between the timekeeper's once-a-second scans: in a short
//! burst after a hint that a server may be about to listen (a process started through the API,
//! or a started process's output), its intervals growing with the time since the hint, so
//! that a hint costs a handful of wake-ups and no hint costs none.
//!
//! A burst scans [`FIRST`] after its hint, then each time half the time since the hint has
//! passed since the last scan (a server listening `t` after the hint is found within about
//! `t / 2`, at least [`FIRST`]), and stops once that interval would pass the 1 s scan
//! ([`SPAN`] after the hint): 9 scans. A process's output during a burst, or within [`AGAIN`]
//! of its start, brings one scan [`FIRST`] later instead of a new burst, so a chatty process
//! costs a scan per notice, not a burst per notice.

use std::time::{Duration, Instant};

/// The first scan after a hint, and the shortest interval.
pub const FIRST: Duration = Duration::from_millis(50);
/// A burst ends where its interval (half its age) reaches the 1 s scan's.
pub const SPAN: Duration = Duration::from_secs(2);
/// Output within this long of a burst's start brings a single scan, not a new burst.
pub const AGAIN: Duration = Duration::from_secs(10);

#[derive(Debug, Default)]
pub struct Bursts {
    /// The hint the running (or last) burst started from.
    from: Option<Instant>,
    /// A single scan asked for by output, not yet made.
    soon: Option<Instant>,
}

impl Bursts {
    /// A hint at `now`: a new burst when `fresh` (a process start) or when none began within
    /// [`AGAIN`]; in any case a scan no later than [`FIRST`] from now.
    pub fn hint(&mut self, now: Instant, fresh: bool) {
        if fresh
            || self
                .from
                .is_none_or(|from| now.duration_since(from) >= AGAIN)
        {
            self.from = Some(now);
        }
        let soon = now + FIRST;
        self.soon = Some(self.soon.map_or(soon, |at| at.min(soon)));
    }

    /// A scan ran at `now` (whoever ran it): the single scan asked for is made.
    pub fn scanned(&mut self, now: Instant) {
        if self.soon.is_some_and(|at| at <= now + FIRST / 2) {
            self.soon = None;
        }
    }

    /// When the next scan is due, the last having run at `last` (`None`: none is planned, the
    /// 1 s scan is all).
    pub fn due(&self, last: Option<Instant>) -> Option<Instant> {
        let burst = self.from.and_then(|from| {
            let next = match last.filter(|at| *at > from) {
                Some(at) => at + FIRST.max(at.duration_since(from) / 2),
                None => from + FIRST,
            };
            (next.duration_since(from) <= SPAN).then_some(next)
        });
        match (burst, self.soon) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// The scans a burst makes after a hint at `t0`, as offsets in ms, scanning at each due time.
    fn burst_offsets(bursts: &mut Bursts, t0: Instant) -> Vec<u128> {
        let mut last = None;
        let mut offsets = Vec::new();
        while let Some(at) = bursts.due(last) {
            assert!(offsets.len() < 100, "a burst ends");
            offsets.push(at.duration_since(t0).as_millis());
            bursts.scanned(at);
            last = Some(at);
        }
        offsets
    }

    #[test]
    fn a_start_brings_nine_scans_over_two_seconds_then_none() {
        let t0 = Instant::now();
        let mut bursts = Bursts::default();
        assert_eq!(bursts.due(None), None, "no hint, no scan of its own");
        bursts.hint(t0, true);
        assert_eq!(
            burst_offsets(&mut bursts, t0),
            vec![50, 100, 150, 225, 337, 506, 759, 1139, 1708]
        );
    }

    #[test]
    fn output_during_a_burst_brings_one_scan_not_another_burst() {
        let t0 = Instant::now();
        let mut bursts = Bursts::default();
        bursts.hint(t0, false);
        assert_eq!(burst_offsets(&mut bursts, t0).len(), 9);
        let mut last = Some(t0 + 1708 * MS);
        assert_eq!(bursts.due(last), None, "the burst is over");
        // Output 3 s after the burst's start: one scan 50 ms later, nothing after it.
        let t1 = t0 + 3000 * MS;
        bursts.hint(t1, false);
        assert_eq!(bursts.due(last), Some(t1 + FIRST));
        bursts.scanned(t1 + FIRST);
        last = Some(t1 + FIRST);
        assert_eq!(bursts.due(last), None);
        // Output after AGAIN starts a burst again; a start always does.
        let t2 = t0 + AGAIN;
        bursts.hint(t2, false);
        assert_eq!(burst_offsets(&mut bursts, t2).len(), 9);
        let t3 = t2 + 100 * MS;
        bursts.hint(t3, true);
        assert_eq!(burst_offsets(&mut bursts, t3).len(), 9);
    }

    #[test]
    fn the_timekeepers_scan_counts_for_the_single_scan_asked_for() {
        let t0 = Instant::now();
        let mut bursts = Bursts::default();
        bursts.hint(t0, false);
        bursts.hint(t0 + 20 * SPAN, false);
        // A burst again (past AGAIN) and a scan 50 ms on; a tick at +30 ms makes that scan.
        let t1 = t0 + 20 * SPAN;
        bursts.scanned(t1 + 30 * MS);
        assert_eq!(
            bursts.due(Some(t1 + 30 * MS)),
            Some(t1 + 80 * MS),
            "the burst goes on"
        );
    }
}
