//! `/init`'s `timestamp` as the guest's clock (SPEC §9), as envd's `shouldSetSystemTime` and
//! `setSystemTime` do it, but only in a Firecracker guest.
//!
//! A resumed snapshot wakes with the clock it was paused with; the orchestrator's `/init`
//! carries the host's time, and envd sets `CLOCK_REALTIME` to it when the guest is more than
//! [`MAX_BEHIND`] behind it or more than [`MAX_AHEAD`] ahead of it. sandboxd does the same only
//! when [`enabled`]: the metadata service is configured at its real link-local address
//! ([`LINK_LOCAL_IP`]) and has answered, which nothing but a Firecracker guest's MMDS can do. A
//! daemon on a developer's machine, or one under test with a fake service on loopback, never
//! moves the clock. The decision is [`decide`], pure and tested with literals; [`apply`] reads
//! the clock, logs what was decided, and calls `sys::clock` only for [`Decision::Set`].

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::mmds::Mmds;
use crate::mmds::LINK_LOCAL_IP;

const MILLISECOND: i128 = 1_000_000;
const SECOND: i128 = 1_000_000_000;

/// envd's `maxTimeInPast`: a guest further behind the timestamp than this is set.
pub const MAX_BEHIND: i128 = 50 * MILLISECOND;
/// envd's `maxTimeInFuture`: a guest further ahead of the timestamp than this is set.
pub const MAX_AHEAD: i128 = 5 * SECOND;
/// The first second Linux refuses to set (`TIME_SETTOD_SEC_MAX`: `KTIME_SEC_MAX` less 30
/// years of uptime, early 2232); times before 1970 are refused too.
const SETTABLE_END: i128 = 8_277_292_036 * SECOND;

/// What to do with the clock for one `/init`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Set `CLOCK_REALTIME` to these Unix nanoseconds (the request's timestamp).
    Set(i128),
    /// Leave the clock as it is, and why.
    Leave(Leave),
}

/// Why the clock is left as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leave {
    /// The `/init` has no `timestamp`.
    NoTimestamp,
    /// The clock is within envd's margins of the timestamp.
    WithinMargins,
    /// Off by more, but this is not a Firecracker guest ([`enabled`] is false).
    NotEnabled,
    /// Off by more, but the timestamp is before 1970 or past what Linux lets be set.
    OutOfRange,
}

/// The decision for a request's `timestamp` and the clock's `now` (both Unix nanoseconds),
/// with clock setting `enabled` or not. The margins are envd's, both exclusive: a guest exactly
/// [`MAX_BEHIND`] behind or [`MAX_AHEAD`] ahead is left.
pub fn decide(timestamp: Option<i128>, now: i128, enabled: bool) -> Decision {
    let Some(timestamp) = timestamp else {
        return Decision::Leave(Leave::NoTimestamp);
    };
    if now >= timestamp - MAX_BEHIND && now <= timestamp + MAX_AHEAD {
        Decision::Leave(Leave::WithinMargins)
    } else if !enabled {
        Decision::Leave(Leave::NotEnabled)
    } else if !(0..SETTABLE_END).contains(&timestamp) {
        Decision::Leave(Leave::OutOfRange)
    } else {
        Decision::Set(timestamp)
    }
}

/// Whether `/init` may set the clock: only with the metadata service configured at
/// [`LINK_LOCAL_IP`] (any port) and after it has `answered`. There is no other way to turn it
/// on: no option, no variable.
pub fn enabled(mmds_address: Option<SocketAddr>, answered: bool) -> bool {
    let link_local = matches!(mmds_address, Some(SocketAddr::V4(a)) if *a.ip() == LINK_LOCAL_IP);
    link_local && answered
}

/// Decides for this `/init` and acts: sets the clock, or logs why not when it is off by more
/// than the margins. A failure to set it is logged and the `/init` goes on, as envd's does.
/// `mmds` is the metadata service, when one is configured: whether it is the real one and has
/// answered decides whether the clock may be set ([`enabled`]).
pub fn apply(mmds: Option<&Mmds>, timestamp: Option<i128>) {
    // The clock is the machine's: one `/init` at a time decides and sets it, and one whose
    // timestamp is older than the newest that reached here is stale by now and leaves it.
    static NEWEST: Mutex<Option<i128>> = Mutex::new(None);
    let mut newest = NEWEST.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(new) = timestamp {
        if newest.is_some_and(|newest| new < newest) {
            return;
        }
        *newest = Some(new);
    }
    let now = unix_nanos(SystemTime::now());
    let is_enabled = enabled(
        mmds.map(|m| m.address()),
        mmds.is_some_and(|m| m.has_answered()),
    );
    let decision = decide(timestamp, now, is_enabled);
    let skew = timestamp
        .map(|t| describe_skew(now - t))
        .unwrap_or_default();
    match decision {
        Decision::Leave(Leave::NoTimestamp | Leave::WithinMargins) => {}
        Decision::Leave(Leave::NotEnabled) => crate::log::line(format_args!(
            "init: clock not set: it is {skew} /init's timestamp, but this is not a Firecracker \
             guest (no answer from a metadata service at {LINK_LOCAL_IP})"
        )),
        Decision::Leave(Leave::OutOfRange) => crate::log::line(format_args!(
            "init: clock not set: it is {skew} /init's timestamp, which Linux cannot set"
        )),
        Decision::Set(to) => match crate::sys::clock::set_realtime(to) {
            Ok(()) => crate::log::line(format_args!(
                "init: clock set to /init's timestamp (it was {skew} it)"
            )),
            Err(e) => crate::log::line(format_args!(
                "init: cannot set the clock ({skew} /init's timestamp): {e}"
            )),
        },
    }
}

/// `time` as Unix nanoseconds, negative before 1970.
fn unix_nanos(time: SystemTime) -> i128 {
    let nanos = |d: std::time::Duration| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX);
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => nanos(after),
        Err(before) => -nanos(before.duration()),
    }
}

/// `12.345s ahead of` or `0.060s behind` for a clock `offset` nanoseconds from a timestamp.
fn describe_skew(offset: i128) -> String {
    let size = offset.unsigned_abs();
    let (seconds, millis) = (size / 1_000_000_000, size % 1_000_000_000 / 1_000_000);
    let direction = if offset < 0 { "behind" } else { "ahead of" };
    format!("{seconds}.{millis:03}s {direction}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2023-11-14T22:13:20Z.
    const NOW: i128 = 1_700_000_000 * SECOND;

    #[test]
    fn envd_s_margins_both_exclusive_in_both_directions() {
        // The guest behind the timestamp: set past 50 ms.
        for (behind, set) in [
            (0, false),
            (MAX_BEHIND - 1, false),
            (MAX_BEHIND, false),
            (MAX_BEHIND + 1, true),
            (60 * MILLISECOND, true),
            (10 * SECOND, true),
        ] {
            let expected = if set {
                Decision::Set(NOW + behind)
            } else {
                Decision::Leave(Leave::WithinMargins)
            };
            assert_eq!(decide(Some(NOW + behind), NOW, true), expected, "{behind}");
        }
        // The guest ahead of the timestamp: set past 5 s.
        for (ahead, set) in [
            (MILLISECOND, false),
            (MAX_AHEAD - 1, false),
            (MAX_AHEAD, false),
            (MAX_AHEAD + 1, true),
            (10 * SECOND, true),
        ] {
            let expected = if set {
                Decision::Set(NOW - ahead)
            } else {
                Decision::Leave(Leave::WithinMargins)
            };
            assert_eq!(decide(Some(NOW - ahead), NOW, true), expected, "{ahead}");
        }
    }

    #[test]
    fn not_enabled_leaves_every_skew() {
        for timestamp in [
            NOW + MAX_BEHIND + 1,
            NOW - MAX_AHEAD - 1,
            NOW + 3600 * SECOND,
            0,
            -SECOND,
            253_402_300_799 * SECOND,
        ] {
            assert_eq!(
                decide(Some(timestamp), NOW, false),
                Decision::Leave(Leave::NotEnabled),
                "{timestamp}"
            );
        }
        assert_eq!(
            decide(Some(NOW), NOW, false),
            Decision::Leave(Leave::WithinMargins)
        );
    }

    #[test]
    fn an_absent_timestamp_leaves_the_clock() {
        assert_eq!(decide(None, NOW, true), Decision::Leave(Leave::NoTimestamp));
        assert_eq!(
            decide(None, NOW, false),
            Decision::Leave(Leave::NoTimestamp)
        );
    }

    #[test]
    fn far_past_and_future_timestamps_set_what_linux_can_set() {
        // 1971-01-01 and 2001-09-09: far behind the guest, but settable.
        assert_eq!(
            decide(Some(31_536_000 * SECOND), NOW, true),
            Decision::Set(31_536_000 * SECOND)
        );
        assert_eq!(
            decide(Some(1_000_000_000 * SECOND), NOW, true),
            Decision::Set(1_000_000_000 * SECOND)
        );
        // 1970-01-01 itself, and the last settable nanosecond (2232).
        assert_eq!(decide(Some(0), NOW, true), Decision::Set(0));
        assert_eq!(
            decide(Some(SETTABLE_END - 1), NOW, true),
            Decision::Set(SETTABLE_END - 1)
        );
        // Before 1970, from 2232 on, and 9999-12-31: Linux refuses them, so they are left.
        for timestamp in [-1, -SECOND, SETTABLE_END, 253_402_300_799 * SECOND] {
            assert_eq!(
                decide(Some(timestamp), NOW, true),
                Decision::Leave(Leave::OutOfRange),
                "{timestamp}"
            );
        }
    }

    #[test]
    fn only_an_answering_service_at_the_link_local_address_enables() {
        let real: SocketAddr = "169.254.169.254:80".parse().unwrap();
        let other_port: SocketAddr = "169.254.169.254:8080".parse().unwrap();
        let loopback: SocketAddr = "127.0.0.1:80".parse().unwrap();
        let neighbour: SocketAddr = "169.254.169.253:80".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:169.254.169.254]:80".parse().unwrap();
        assert!(enabled(Some(real), true));
        assert!(enabled(Some(other_port), true));
        assert!(!enabled(Some(real), false));
        assert!(!enabled(Some(loopback), true));
        assert!(!enabled(Some(neighbour), true));
        assert!(!enabled(Some(mapped), true));
        assert!(!enabled(None, true));
        assert!(!enabled(None, false));
    }

    #[test]
    fn skews_are_described_with_their_direction() {
        assert_eq!(describe_skew(12_345 * MILLISECOND), "12.345s ahead of");
        assert_eq!(describe_skew(-60 * MILLISECOND), "0.060s behind");
        assert_eq!(describe_skew(0), "0.000s ahead of");
        assert_eq!(unix_nanos(UNIX_EPOCH), 0);
        assert_eq!(
            unix_nanos(UNIX_EPOCH - std::time::Duration::from_secs(1)),
            -SECOND
        );
    }
}
