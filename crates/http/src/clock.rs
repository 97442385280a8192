//! A worker's wall clock, derived from its monotonic readings instead of read for each use.
//!
//! A run reads the monotonic clock once (`Instant::now`), for the stuck-worker watch, its
//! deadlines and a request's start, and a logged request reads it once more at its end, for the
//! duration. The `Date` header and a log line's time are wall-clock times: rather than a third
//! and fourth precise reading, each is that monotonic reading mapped through an [`Anchor`],
//! both clocks read together. Between clock settings the two clocks run at the same rate (NTP
//! slews both alike), so the mapping is as precise as the readings. A setting moves the wall
//! clock alone; to notice one, every mapping first reads the coarse wall clock
//! (`CLOCK_REALTIME_COARSE`: the time of the last timer tick, read from the vDSO's data without
//! the hardware counter), and the anchor is taken again whenever that moved since the anchor
//! was taken: once per tick (1-4 ms) at most while busy, and at once after the clock is set.

use std::cell::Cell;
use std::time::{Duration, Instant, SystemTime};

use crate::sys;

/// The wall clock of one worker (not shared: its anchor is a `Cell`).
pub(crate) struct Wall {
    anchor: Cell<Anchor>,
}

/// Both clocks, read together, and the coarse wall clock read just before.
#[derive(Clone, Copy)]
struct Anchor {
    coarse: Option<(i64, i64)>,
    monotonic: Instant,
    wall: SystemTime,
}

/// Longest gap between the readings of an anchor's monotonic clock around its wall-clock
/// reading (about 0.1 µs unless the thread was preempted between them): the anchor's error.
const ANCHOR_GAP: Duration = Duration::from_micros(50);

impl Anchor {
    /// The wall clock between two readings of the monotonic clock, taken as at their middle;
    /// taken again (a few times at most) when a preemption came between them.
    fn take(coarse: Option<(i64, i64)>) -> Anchor {
        let mut tries = 0;
        loop {
            let before = Instant::now();
            let wall = SystemTime::now();
            let gap = before.elapsed();
            tries += 1;
            if gap <= ANCHOR_GAP || tries == 3 {
                return Anchor {
                    coarse,
                    monotonic: before + gap / 2,
                    wall,
                };
            }
        }
    }

    fn map(&self, at: Instant) -> SystemTime {
        if at >= self.monotonic {
            self.wall + (at - self.monotonic)
        } else {
            self.wall - (self.monotonic - at)
        }
    }
}

impl Wall {
    pub(crate) fn new() -> Wall {
        Wall {
            anchor: Cell::new(Anchor::take(sys::realtime_coarse())),
        }
    }

    /// The wall-clock time of `at`, a recent reading of the monotonic clock.
    pub(crate) fn at(&self, at: Instant) -> SystemTime {
        let coarse = sys::realtime_coarse();
        let mut anchor = self.anchor.get();
        // Unknown coarse time (never on Linux): a new anchor each time, precise but dearer.
        if coarse.is_none() || coarse != anchor.coarse {
            anchor = Anchor::take(coarse);
            self.anchor.set(anchor);
        }
        anchor.map(at)
    }
}

#[cfg(test)]
mod tests {
    use std::thread;
    use std::time::UNIX_EPOCH;

    use super::*;

    /// A wall clock anchored `shift` away from the real one, as after the clock was set by
    /// `shift` with the coarse clock yet to move.
    fn shifted(shift: Duration, later: bool) -> Wall {
        let mut anchor = Anchor::take(sys::realtime_coarse());
        anchor.wall = if later {
            anchor.wall + shift
        } else {
            anchor.wall - shift
        };
        Wall {
            anchor: Cell::new(anchor),
        }
    }

    /// How far `a` is from `b`, either way.
    fn apart(a: SystemTime, b: SystemTime) -> Duration {
        a.duration_since(b)
            .or_else(|_| b.duration_since(a))
            .unwrap_or_default()
    }

    /// The coarse clock moves at least once per timer tick (4 ms at 250 Hz).
    const TICK: Duration = Duration::from_millis(10);

    #[test]
    fn a_mapped_time_is_the_wall_clock_well_within_a_millisecond() {
        let wall = Wall::new();
        let slack = ANCHOR_GAP * 2;
        for _ in 0..3 {
            let before = SystemTime::now();
            let mapped = wall.at(Instant::now());
            let after = SystemTime::now();
            assert!(
                mapped + slack >= before && mapped <= after + slack,
                "{mapped:?} not within {before:?}..{after:?}"
            );
            thread::sleep(TICK);
        }
    }

    #[test]
    fn a_time_read_long_before_is_mapped_to_its_own_moment_not_to_now() {
        // A request's end is read after a long run: the anchor taken later maps it back.
        let wall = Wall::new();
        let start = Instant::now();
        let start_wall = SystemTime::now();
        thread::sleep(Duration::from_millis(50));
        let end = Instant::now();
        let mapped_start = wall.at(start);
        let mapped_end = wall.at(end);
        assert!(apart(mapped_start, start_wall) < Duration::from_millis(1));
        let took = mapped_end.duration_since(mapped_start).unwrap();
        assert!(apart(UNIX_EPOCH + took, UNIX_EPOCH + (end - start)) <= ANCHOR_GAP);
    }

    #[test]
    fn a_clock_setting_is_noticed_within_a_tick() {
        // Anchored as if the wall clock had since been set an hour back, then forward.
        for later in [false, true] {
            let wall = shifted(Duration::from_secs(3600), later);
            thread::sleep(TICK);
            let mapped = wall.at(Instant::now());
            assert!(
                apart(mapped, SystemTime::now()) < Duration::from_millis(1),
                "still off after a tick: {mapped:?}"
            );
        }
    }
}
