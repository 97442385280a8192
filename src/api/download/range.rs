//! The `Range` request header (RFC 9110 §14.1.2, §14.2): which bytes of a file to send.
//!
//! This module owns the parsing and the satisfiability decision, and nothing else: whether the
//! header is to be honoured at all (the method, `If-Range`) is the handler's and `conditional`'s.
//!
//! Decisions, as RFC 9110 allows a server to make them:
//! - A unit other than `bytes` is ignored (MUST), and so is a syntactically invalid set such as
//!   `bytes=5-2` or `bytes=abc` (MAY ignore or reject; ignoring lets the client still get the file).
//! - Several ranges are answered with the whole file (SPEC §6), never `multipart/byteranges`.
//! - Positions too large for `u64` saturate: a huge first position is past the end
//!   (unsatisfiable), a huge last position is clamped to the end.
//! - On an empty file no byte can be selected: `bytes=-n` gets the whole (empty) file and every
//!   other range is unsatisfiable.

/// What to send of a file of a known size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Range {
    /// No (usable) `Range`: 200 with the whole file.
    Whole,
    /// 206 with bytes `start..=end`; `end` is always below the size.
    Partial { start: u64, end: u64 },
    /// 416 with `Content-Range: bytes */<size>`.
    Unsatisfiable,
}

/// One `range-spec` of the set, before the size is known.
enum Spec {
    /// `first-last` or `first-` (`last` is `None`).
    FromTo { first: u64, last: Option<u64> },
    /// `-suffix`.
    Suffix(u64),
}

/// Decides what to send of a file of `size` bytes for the `Range` header `value`.
pub fn parse(value: &[u8], size: u64) -> Range {
    let Ok(text) = std::str::from_utf8(value) else {
        return Range::Whole;
    };
    let Some((unit, set)) = text.trim().split_once('=') else {
        return Range::Whole;
    };
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return Range::Whole;
    }
    // A list may carry empty elements (RFC 9110 §5.6.1); they do not count.
    let mut specs = set.split(',').map(str::trim).filter(|s| !s.is_empty());
    let (Some(spec), None) = (specs.next(), specs.next()) else {
        return Range::Whole;
    };
    match parse_spec(spec) {
        Some(spec) => select(spec, size),
        None => Range::Whole,
    }
}

fn parse_spec(spec: &str) -> Option<Spec> {
    let (first, last) = spec.split_once('-')?;
    let (first, last) = (first.trim(), last.trim());
    if first.is_empty() {
        return Some(Spec::Suffix(number(last)?));
    }
    let first = number(first)?;
    let last = if last.is_empty() {
        None
    } else {
        Some(number(last)?)
    };
    if last.is_some_and(|last| last < first) {
        return None;
    }
    Some(Spec::FromTo { first, last })
}

/// A run of ASCII digits as a `u64`, saturating at `u64::MAX`; `None` for anything else.
fn number(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(text.bytes().fold(0u64, |acc, d| {
        acc.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    }))
}

fn select(spec: Spec, size: u64) -> Range {
    match spec {
        Spec::FromTo { first, .. } if first >= size => Range::Unsatisfiable,
        Spec::FromTo { first, last } => Range::Partial {
            start: first,
            end: last.map_or(size - 1, |last| last.min(size - 1)),
        },
        Spec::Suffix(0) => Range::Unsatisfiable,
        Spec::Suffix(_) if size == 0 => Range::Whole,
        Spec::Suffix(n) => Range::Partial {
            start: size.saturating_sub(n),
            end: size - 1,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(header: &str, size: u64, expected: Range) {
        assert_eq!(
            parse(header.as_bytes(), size),
            expected,
            "{header:?} of {size}"
        );
    }

    fn partial(start: u64, end: u64) -> Range {
        Range::Partial { start, end }
    }

    #[test]
    fn first_and_last() {
        check("bytes=0-0", 10, partial(0, 0));
        check("bytes=0-9", 10, partial(0, 9));
        check("bytes=2-5", 10, partial(2, 5));
        check("bytes=9-9", 10, partial(9, 9));
    }

    #[test]
    fn last_past_the_end_is_clamped() {
        check("bytes=2-10", 10, partial(2, 9));
        check("bytes=0-999999", 10, partial(0, 9));
    }

    #[test]
    fn open_ended() {
        check("bytes=0-", 10, partial(0, 9));
        check("bytes=7-", 10, partial(7, 9));
        check("bytes=9-", 10, partial(9, 9));
    }

    #[test]
    fn suffix() {
        check("bytes=-1", 10, partial(9, 9));
        check("bytes=-3", 10, partial(7, 9));
        check("bytes=-10", 10, partial(0, 9));
        check("bytes=-11", 10, partial(0, 9));
    }

    #[test]
    fn suffix_of_zero_is_unsatisfiable() {
        check("bytes=-0", 10, Range::Unsatisfiable);
        check("bytes=-0", 0, Range::Unsatisfiable);
    }

    #[test]
    fn first_at_or_past_the_end_is_unsatisfiable() {
        check("bytes=10-", 10, Range::Unsatisfiable);
        check("bytes=10-20", 10, Range::Unsatisfiable);
        check("bytes=100-", 10, Range::Unsatisfiable);
    }

    #[test]
    fn empty_file() {
        check("bytes=0-", 0, Range::Unsatisfiable);
        check("bytes=0-0", 0, Range::Unsatisfiable);
        check("bytes=-5", 0, Range::Whole);
    }

    #[test]
    fn overflowing_numbers_saturate() {
        check("bytes=99999999999999999999999-", 10, Range::Unsatisfiable);
        check("bytes=0-99999999999999999999999", 10, partial(0, 9));
        check("bytes=-99999999999999999999999", 10, partial(0, 9));
        check(
            "bytes=18446744073709551615-18446744073709551615",
            u64::MAX,
            Range::Unsatisfiable,
        );
        check(
            "bytes=18446744073709551614-",
            u64::MAX,
            partial(u64::MAX - 1, u64::MAX - 1),
        );
    }

    #[test]
    fn last_before_first_is_invalid_and_ignored() {
        check("bytes=5-2", 10, Range::Whole);
        check("bytes=50-2", 10, Range::Whole);
    }

    #[test]
    fn spaces_around_the_parts_are_tolerated() {
        check(" bytes=2-5 ", 10, partial(2, 5));
        check("bytes= 2-5", 10, partial(2, 5));
        check("bytes=2 - 5", 10, partial(2, 5));
        check("bytes=2-5,", 10, partial(2, 5));
        check("bytes=, 2-5", 10, partial(2, 5));
    }

    #[test]
    fn several_ranges_give_the_whole_file() {
        check("bytes=0-1,3-4", 10, Range::Whole);
        check("bytes=0-1, 3-4", 10, Range::Whole);
        check("bytes=-1,-2", 10, Range::Whole);
        check("bytes=20-30,40-50", 10, Range::Whole);
    }

    #[test]
    fn other_units_are_ignored() {
        check("items=0-5", 10, Range::Whole);
        check("bytesx=0-5", 10, Range::Whole);
        check("none", 10, Range::Whole);
    }

    #[test]
    fn unit_is_case_insensitive() {
        check("Bytes=2-5", 10, partial(2, 5));
        check("BYTES=-2", 10, partial(8, 9));
    }

    #[test]
    fn malformed_sets_are_ignored() {
        for header in [
            "bytes=",
            "bytes=-",
            "bytes=abc",
            "bytes=1",
            "bytes=1-2-3",
            "bytes=+1-2",
            "bytes=1-+2",
            "bytes=0x1-2",
            "bytes=--1",
            "bytes=1.5-2",
            "",
        ] {
            check(header, 10, Range::Whole);
        }
        assert_eq!(parse(b"bytes=\xff-1", 10), Range::Whole);
    }
}
