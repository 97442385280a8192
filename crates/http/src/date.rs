//! HTTP dates (RFC 9110 IMF-fixdate): `Sun, 06 Nov 1994 08:49:37 GMT`.
//!
//! Formatting for `Date` and `Last-Modified`, parsing for `If-Modified-Since` and friends. Only
//! IMF-fixdate is parsed; obsolete formats are treated as absent, as RFC 9110 allows.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::digits::push_padded;

const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Formats Unix seconds as an IMF-fixdate.
pub fn format(unix_secs: i64) -> String {
    let mut text = Vec::with_capacity(29);
    write(&mut text, unix_secs);
    String::from_utf8(text).unwrap_or_default()
}

/// Appends Unix seconds as an IMF-fixdate, digits by hand.
fn write(out: &mut Vec<u8>, unix_secs: i64) {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400).unsigned_abs();
    let (year, month, day) = civil_from_days(days);
    // In range by construction: `rem_euclid(7)` is in 0..7, `civil_from_days` gives a month in
    // 1..=12.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let (weekday, month) = (
        DAYS[days.rem_euclid(7) as usize],
        MONTHS[(month - 1) as usize],
    );
    out.extend_from_slice(weekday.as_bytes());
    out.extend_from_slice(b", ");
    push_padded(out, day.unsigned_abs(), 2);
    out.push(b' ');
    out.extend_from_slice(month.as_bytes());
    out.push(b' ');
    if year < 0 {
        out.push(b'-');
    }
    push_padded(out, year.unsigned_abs(), 4);
    out.push(b' ');
    for (value, after) in [
        (secs / 3600, b':'),
        (secs / 60 % 60, b':'),
        (secs % 60, b' '),
    ] {
        push_padded(out, value, 2);
        out.push(after);
    }
    out.extend_from_slice(b"GMT");
}

/// Unix seconds of `time` (0 before the epoch).
pub fn unix_secs(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The current time in Unix seconds.
pub fn now_unix() -> i64 {
    unix_secs(SystemTime::now())
}

/// Parses an IMF-fixdate into Unix seconds; `None` for anything else.
pub fn parse(text: &str) -> Option<i64> {
    let b = text.trim().as_bytes();
    if b.len() != 29 || &b[3..5] != b", " || &b[25..] != b" GMT" {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let digits = b.get(range)?;
        digits.iter().try_fold(0i64, |acc, &d| {
            d.is_ascii_digit().then(|| acc * 10 + i64::from(d - b'0'))
        })
    };
    let day = number(5..7)?;
    let (month, _) = (1..).zip(MONTHS).find(|(_, m)| m.as_bytes() == &b[8..11])?;
    let year = number(12..16)?;
    let (hour, minute, second) = (number(17..19)?, number(20..22)?, number(23..25)?);
    if b[7] != b' ' || b[11] != b' ' || b[16] != b' ' || b[19] != b':' || b[22] != b':' {
        return None;
    }
    if !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second)
}

/// Howard Hinnant's algorithm: days since 1970-01-01 to (year, month, day).
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The inverse of [`civil_from_days`].
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The `Server` and `Date` header lines of every answer, `Server: <name>\r\nDate: <date>\r\n`,
/// copied into a head at once: the date is rewritten into the same buffer once per second (no
/// allocation), since formatting it on every response is waste.
pub(crate) struct DateCache {
    secs: i64,
    /// Where the date starts in `text`.
    date_at: usize,
    text: String,
}

impl DateCache {
    /// A cache holding no date yet, for a server named `server`.
    pub(crate) fn new(server: &str) -> DateCache {
        let mut text = String::with_capacity(server.len() + 48);
        text.push_str("Server: ");
        text.push_str(server);
        text.push_str("\r\nDate: ");
        DateCache {
            secs: i64::MIN,
            date_at: text.len(),
            text,
        }
    }

    /// The header lines with the second of `time` as the date.
    pub(crate) fn at(&mut self, time: SystemTime) -> &str {
        let now = unix_secs(time);
        if now != self.secs {
            self.secs = now;
            let mut bytes = std::mem::take(&mut self.text).into_bytes();
            bytes.truncate(self.date_at);
            write(&mut bytes, now);
            bytes.extend_from_slice(b"\r\n");
            // ASCII but for the server's name, a `&str`: a failure cannot happen, and would
            // only leave the lines out.
            self.text = String::from_utf8(bytes).unwrap_or_default();
        }
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_dates() {
        assert_eq!(format(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(format(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(format(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(format(1_700_000_000), "Tue, 14 Nov 2023 22:13:20 GMT");
    }

    #[test]
    fn the_server_and_date_lines_follow_the_second() {
        let mut cache = DateCache::new("sandboxd");
        let at = |secs| UNIX_EPOCH + std::time::Duration::from_secs(secs);
        assert_eq!(
            cache.at(at(784_111_777)),
            "Server: sandboxd\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
        );
        assert_eq!(
            cache.at(at(1_700_000_000)),
            "Server: sandboxd\r\nDate: Tue, 14 Nov 2023 22:13:20 GMT\r\n"
        );
    }

    #[test]
    fn parse_inverts_format() {
        for secs in [0, 784_111_777, 951_782_400, 1_700_000_000, 4_102_444_799] {
            assert_eq!(parse(&format(secs)), Some(secs));
        }
    }

    #[test]
    fn rejects_other_formats_and_garbage() {
        for text in [
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 36 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 25:49:37 GMT",
            "Sun, 0x Nov 1994 08:49:37 GMT",
            "",
        ] {
            assert_eq!(parse(text), None, "{text}");
        }
    }
}
