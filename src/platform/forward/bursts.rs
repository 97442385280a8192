//! When the forwarder's thread scans, between the timekeeper's once-a-second scans: in a short
//! burst after a hint that a server may be about to listen (a process started through the API,
//! or a started process's output), its intervals growing with the time since the hint, so
//! that a hint costs a handful of wake-ups and no hint costs none.
//!
//! A burst scans [`FIRST`] after its hint, then each time half the time since the hint has
//! passed since the last scan (a server listening `t` after the hint is found within about
//! `t / 2`, at least [`FIRST`]), and stops once that interval would pass the 1 s scan
//! ([`SPAN`] after the hint): 9 scans. Each hint starts a burst anew: output is told at most
//! every 500 ms (`proc::io`), and a burst's scans in those 500 ms are at most 170 ms apart, so a
//! server announcing itself in output that was not told is still found within that.

use std::time::{Duration, Instant};

/// The first scan after a hint, and the shortest interval.
pub const FIRST: Duration = Duration::from_millis(50);
/// A burst ends where its interval (half its age) reaches the 1 s scan's.
pub const SPAN: Duration = Duration::from_secs(2);

#[derive(Debug, Default)]
pub struct Bursts {
    /// The hint the running (or last) burst started from.
    from: Option<Instant>,
}

impl Bursts {
    /// A hint at `now`: a burst from now.
    pub fn hint(&mut self, now: Instant) {
        self.from = Some(now);
    }

    /// When the next scan is due, the last having run at `last` (`None`: none is planned, the
    /// 1 s scan is all).
    pub fn due(&self, last: Option<Instant>) -> Option<Instant> {
        let from = self.from?;
        let next = match last.filter(|at| *at > from) {
            Some(at) => at + FIRST.max(at.duration_since(from) / 2),
            None => from + FIRST,
        };
        (next.duration_since(from) <= SPAN).then_some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// The scans a burst makes after a hint at `t0`, as offsets in ms, scanning at each due time.
    fn burst_offsets(bursts: &Bursts, t0: Instant) -> Vec<u128> {
        let mut last = None;
        let mut offsets = Vec::new();
        while let Some(at) = bursts.due(last) {
            assert!(offsets.len() < 100, "a burst ends");
            offsets.push(at.duration_since(t0).as_millis());
            last = Some(at);
        }
        offsets
    }

    #[test]
    fn a_hint_brings_nine_scans_over_two_seconds_then_none() {
        let t0 = Instant::now();
        let mut bursts = Bursts::default();
        assert_eq!(bursts.due(None), None, "no hint, no scan of its own");
        bursts.hint(t0);
        assert_eq!(
            burst_offsets(&bursts, t0),
            vec![50, 100, 150, 225, 337, 506, 759, 1139, 1708]
        );
    }

    #[test]
    fn a_hint_during_a_burst_starts_it_again_from_the_scan_before() {
        let t0 = Instant::now();
        let mut bursts = Bursts::default();
        bursts.hint(t0);
        let last = Some(t0 + 337 * MS);
        bursts.hint(t0 + 400 * MS);
        assert_eq!(bursts.due(last), Some(t0 + 450 * MS));
        // A scan by the timekeeper counts as the burst's when it is after the hint.
        assert_eq!(bursts.due(Some(t0 + 430 * MS)), Some(t0 + 480 * MS));
    }
}
