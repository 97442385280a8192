//! Number parsing shared by the parsers: unsigned decimals, one-value files, `key value` lines.
//!
//! Owns the rules every parser follows: a number is ASCII digits only (no sign, no spaces inside);
//! a value too big for `u64` is rejected (`None`), never wrapped; a line that is not exactly
//! `key value` is skipped.

/// An unsigned decimal: ASCII digits only. Overflow and anything else are `None`.
pub fn parse_u64(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The one token of a one-value file such as `memory.current` (surrounding whitespace allowed).
pub fn single_token(text: &str) -> Option<&str> {
    let mut tokens = text.split_ascii_whitespace();
    let token = tokens.next()?;
    tokens.next().is_none().then_some(token)
}

/// The number of a one-value file such as `memory.current`.
pub fn single_u64(text: &str) -> Option<u64> {
    single_token(text).and_then(parse_u64)
}

/// The `key value` pairs of a flat-keyed file such as `memory.stat` or `cpu.stat`, skipping
/// lines that are not exactly a key and an unsigned number.
pub fn flat_keyed(text: &str) -> impl Iterator<Item = (&str, u64)> {
    text.lines().filter_map(|line| {
        let mut tokens = line.split_ascii_whitespace();
        let key = tokens.next()?;
        let value = parse_u64(tokens.next()?)?;
        tokens.next().is_none().then_some((key, value))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_u64_accepts_digits_only() {
        assert_eq!(parse_u64("0"), Some(0));
        assert_eq!(parse_u64("18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64("18446744073709551616"), None);
        assert_eq!(parse_u64("99999999999999999999999999"), None);
        assert_eq!(parse_u64(""), None);
        assert_eq!(parse_u64("+1"), None);
        assert_eq!(parse_u64("-1"), None);
        assert_eq!(parse_u64("1 2"), None);
        assert_eq!(parse_u64("12kB"), None);
        assert_eq!(parse_u64("max"), None);
    }

    #[test]
    fn single_value_files() {
        assert_eq!(single_u64("3317760\n"), Some(3317760));
        assert_eq!(single_u64("  42  "), Some(42));
        assert_eq!(single_u64(""), None);
        assert_eq!(single_u64("\n"), None);
        assert_eq!(single_u64("1\n2\n"), None);
        assert_eq!(single_token("max\n"), Some("max"));
    }

    #[test]
    fn flat_keyed_skips_garbage() {
        let text =
            "usage_usec 10\n\ngarbage\nbad -3\nthree tokens 4\nuser_usec 7\n\u{fffd}\u{fffd} 1\n";
        let pairs: Vec<_> = flat_keyed(text).collect();
        assert_eq!(
            pairs,
            vec![
                ("usage_usec", 10),
                ("user_usec", 7),
                ("\u{fffd}\u{fffd}", 1)
            ]
        );
    }
}
