//! Conditional requests (RFC 9110 §13) for a GET or HEAD of a file: `If-Match`,
//! `If-Unmodified-Since`, `If-None-Match`, `If-Modified-Since` and `If-Range`.
//!
//! This module owns the evaluation, in the order of RFC 9110 §13.2.2, of header text against the
//! file's validators (its strong ETag and the time its `Last-Modified` shows, in whole seconds).
//! It does not read headers or files: the handler passes both in.
//!
//! Decisions:
//! - A date that is not an IMF-fixdate makes its header absent (RFC 9110 §13.1.3-4 MUST ignore).
//! - A malformed entity-tag list matches nothing: `If-Match` then fails (412) and
//!   `If-None-Match` lets the request through; both are the safe side.
//! - A file version has two forms, the file as it is and its gzip form, each with its ETag
//!   (`headers::gzip_etag`). `If-None-Match` is true for either (a client holding either form
//!   holds this version: 304); `If-Match` and `If-Range` compare with the file's own strong
//!   ETag only, the one that names its bytes.
//! - `If-Range` with a date counts only when that date equals `Last-Modified` and the file was
//!   last changed before the current second, so that a change later in the same second cannot
//!   be mistaken for the validated version (the date is then a strong validator, §13.1.4).
//! - The dates compared are the ones `Last-Modified` shows, so a file modified "in the future"
//!   (shown as modified now, `headers::last_modified`) is never `If-Modified-Since`-fresh past
//!   the second it was sent in, and a file without a valid date has its date conditions
//!   ignored (RFC 9110 §13.1.3-4: no modification date available) and no `If-Range` date match.

use crate::http::date;

/// The conditional headers of a request, as text (several fields of one name joined by `,`).
#[derive(Debug, Default, Clone, Copy)]
pub struct Conditions<'a> {
    pub if_match: Option<&'a str>,
    pub if_none_match: Option<&'a str>,
    pub if_modified_since: Option<&'a str>,
    pub if_unmodified_since: Option<&'a str>,
    pub if_range: Option<&'a str>,
}

/// The file's validators as sent in `ETag` and `Last-Modified`.
#[derive(Debug, Clone, Copy)]
pub struct Validators<'a> {
    /// The strong entity-tag, quotes included: `"..."`.
    pub etag: &'a str,
    /// The entity-tag of the version's other form (its gzip form), matched by `If-None-Match`.
    pub other_form: Option<&'a str>,
    /// What `Last-Modified` shows, Unix seconds; `None` when it is not sent.
    pub mtime: Option<i64>,
    /// The current time, Unix seconds.
    pub now: i64,
}

/// What the conditions decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 412: the named precondition header is false.
    PreconditionFailed(&'static str),
    /// 304: the client's copy is current.
    NotModified,
    /// Serve the file; honour `Range` only when `range_allowed` (`If-Range` absent or matching).
    Proceed { range_allowed: bool },
}

/// RFC 9110 §13.2.2 for GET and HEAD.
pub fn evaluate(conditions: &Conditions, file: &Validators) -> Outcome {
    // Step 1 and 2: If-Match, else If-Unmodified-Since.
    if let Some(list) = conditions.if_match {
        if !matches_list(list, file.etag, Comparison::Strong) {
            return Outcome::PreconditionFailed("If-Match");
        }
    } else if let (Some(since), Some(mtime)) = (
        conditions.if_unmodified_since.and_then(date::parse),
        file.mtime,
    ) {
        if mtime > since {
            return Outcome::PreconditionFailed("If-Unmodified-Since");
        }
    }
    // Step 3 and 4: If-None-Match, else If-Modified-Since.
    if let Some(list) = conditions.if_none_match {
        let other = file.other_form;
        if matches_list(list, file.etag, Comparison::Weak)
            || other.is_some_and(|tag| matches_list(list, tag, Comparison::Weak))
        {
            return Outcome::NotModified;
        }
    } else if let (Some(since), Some(mtime)) = (
        conditions.if_modified_since.and_then(date::parse),
        file.mtime,
    ) {
        if mtime <= since {
            return Outcome::NotModified;
        }
    }
    // Step 5: If-Range.
    let range_allowed = conditions
        .if_range
        .is_none_or(|validator| if_range_matches(validator.trim(), file));
    Outcome::Proceed { range_allowed }
}

fn if_range_matches(validator: &str, file: &Validators) -> bool {
    if validator.starts_with('"') || validator.starts_with("W/") {
        // Only a strong comparison may select a range (RFC 9110 §13.1.5).
        let mut tags = EntityTags::new(validator);
        return match (tags.next(), tags.next()) {
            (Some(Some(tag)), None) => tag.strong_eq(file.etag),
            _ => false,
        };
    }
    file.mtime
        .is_some_and(|mtime| date::parse(validator) == Some(mtime) && mtime < file.now)
}

#[derive(Clone, Copy)]
enum Comparison {
    Strong,
    Weak,
}

/// True when `list` is `*` or names an entity-tag equal to `etag` under `comparison`.
fn matches_list(list: &str, etag: &str, comparison: Comparison) -> bool {
    if list.trim() == "*" {
        return true;
    }
    for tag in EntityTags::new(list) {
        let Some(tag) = tag else {
            return false;
        };
        let equal = match comparison {
            Comparison::Strong => tag.strong_eq(etag),
            Comparison::Weak => tag.opaque == etag.strip_prefix("W/").unwrap_or(etag),
        };
        if equal {
            return true;
        }
    }
    false
}

/// One entity-tag of a list: `opaque` keeps its quotes, `weak` is the `W/` prefix.
struct EntityTag<'a> {
    weak: bool,
    opaque: &'a str,
}

impl EntityTag<'_> {
    fn strong_eq(&self, etag: &str) -> bool {
        !self.weak && self.opaque == etag
    }
}

/// The entity-tags of a comma-separated list; yields `None` once, then stops, at a malformed tag.
struct EntityTags<'a> {
    rest: &'a str,
    failed: bool,
}

impl<'a> EntityTags<'a> {
    fn new(list: &'a str) -> Self {
        EntityTags {
            rest: list,
            failed: false,
        }
    }
}

impl<'a> Iterator for EntityTags<'a> {
    type Item = Option<EntityTag<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let rest = self.rest.trim_start_matches([' ', '\t', ',']);
        if rest.is_empty() {
            return None;
        }
        let (weak, rest) = match rest.strip_prefix("W/") {
            Some(rest) => (true, rest),
            None => (false, rest),
        };
        let closing = rest
            .strip_prefix('"')
            .and_then(|inner| inner.find('"'))
            .map(|i| i + 2);
        let Some(end) = closing else {
            self.failed = true;
            return Some(None);
        };
        let (opaque, after) = rest.split_at(end);
        let after = after.trim_start_matches([' ', '\t']);
        if !(after.is_empty() || after.starts_with(',')) {
            self.failed = true;
            return Some(None);
        }
        self.rest = after;
        Some(Some(EntityTag { weak, opaque }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ETAG: &str = "\"801-2a-400-17a\"";
    const GZIP_ETAG: &str = "W/\"801-2a-400-17a-gzip\"";
    const MTIME: i64 = 1_700_000_000;
    const AT_MTIME: &str = "Tue, 14 Nov 2023 22:13:20 GMT";
    const BEFORE: &str = "Tue, 14 Nov 2023 22:13:19 GMT";
    const AFTER: &str = "Tue, 14 Nov 2023 22:13:21 GMT";

    fn file() -> Validators<'static> {
        Validators {
            etag: ETAG,
            other_form: Some(GZIP_ETAG),
            mtime: Some(MTIME),
            now: MTIME + 100,
        }
    }

    fn eval(conditions: Conditions) -> Outcome {
        evaluate(&conditions, &file())
    }

    const SERVE: Outcome = Outcome::Proceed {
        range_allowed: true,
    };
    const SERVE_WHOLE: Outcome = Outcome::Proceed {
        range_allowed: false,
    };

    #[test]
    fn no_conditions_serve() {
        assert_eq!(eval(Conditions::default()), SERVE);
    }

    #[test]
    fn if_match() {
        let check = |value: &str, expected: Outcome| {
            let conditions = Conditions {
                if_match: Some(value),
                ..Default::default()
            };
            assert_eq!(eval(conditions), expected, "{value}");
        };
        check(ETAG, SERVE);
        check("*", SERVE);
        check(" * ", SERVE);
        check("\"a\", \"801-2a-400-17a\"", SERVE);
        check("\"a\",\"b\" ,  \"801-2a-400-17a\" ", SERVE);
        let failed = Outcome::PreconditionFailed("If-Match");
        check("\"other\"", failed);
        check("W/\"801-2a-400-17a\"", failed);
        check("801-2a-400-17a", failed);
        check("\"801-2a-400-17a", failed);
        check("\"a\" junk, \"801-2a-400-17a\"", failed);
        check("", failed);
    }

    #[test]
    fn if_unmodified_since() {
        let check = |value: &str, expected: Outcome| {
            let conditions = Conditions {
                if_unmodified_since: Some(value),
                ..Default::default()
            };
            assert_eq!(eval(conditions), expected, "{value}");
        };
        check(AT_MTIME, SERVE);
        check(AFTER, SERVE);
        check(BEFORE, Outcome::PreconditionFailed("If-Unmodified-Since"));
        check("yesterday", SERVE);
    }

    #[test]
    fn if_match_takes_precedence_over_if_unmodified_since() {
        let conditions = Conditions {
            if_match: Some(ETAG),
            if_unmodified_since: Some(BEFORE),
            ..Default::default()
        };
        assert_eq!(eval(conditions), SERVE);
    }

    #[test]
    fn if_none_match() {
        let check = |value: &str, expected: Outcome| {
            let conditions = Conditions {
                if_none_match: Some(value),
                ..Default::default()
            };
            assert_eq!(eval(conditions), expected, "{value}");
        };
        check(ETAG, Outcome::NotModified);
        check("*", Outcome::NotModified);
        // Weak comparison: a weak tag with the same opaque value matches.
        check("W/\"801-2a-400-17a\"", Outcome::NotModified);
        check("\"x\", W/\"801-2a-400-17a\"", Outcome::NotModified);
        check("\"other\"", SERVE);
        check("garbage", SERVE);
        // Either form of the version: its gzip form's tag, as sent or as a strong tag.
        check(GZIP_ETAG, Outcome::NotModified);
        check("\"801-2a-400-17a-gzip\"", Outcome::NotModified);
        check("\"x\", W/\"801-2a-400-17a-gzip\"", Outcome::NotModified);
        check("W/\"801-2a-400-17a-br\"", SERVE);
    }

    #[test]
    fn only_the_files_own_tag_passes_if_match_and_if_range() {
        let conditions = Conditions {
            if_match: Some(GZIP_ETAG),
            ..Default::default()
        };
        assert_eq!(eval(conditions), Outcome::PreconditionFailed("If-Match"));
        let conditions = Conditions {
            if_match: Some("\"801-2a-400-17a-gzip\""),
            ..Default::default()
        };
        assert_eq!(eval(conditions), Outcome::PreconditionFailed("If-Match"));
        let conditions = Conditions {
            if_range: Some(GZIP_ETAG),
            ..Default::default()
        };
        assert_eq!(eval(conditions), SERVE_WHOLE);
    }

    #[test]
    fn if_modified_since() {
        let check = |value: &str, expected: Outcome| {
            let conditions = Conditions {
                if_modified_since: Some(value),
                ..Default::default()
            };
            assert_eq!(eval(conditions), expected, "{value}");
        };
        check(AT_MTIME, Outcome::NotModified);
        check(AFTER, Outcome::NotModified);
        check(BEFORE, SERVE);
        check("Tuesday, 14-Nov-23 22:13:20 GMT", SERVE);
    }

    #[test]
    fn if_none_match_takes_precedence_over_if_modified_since() {
        let conditions = Conditions {
            if_none_match: Some("\"other\""),
            if_modified_since: Some(AFTER),
            ..Default::default()
        };
        assert_eq!(eval(conditions), SERVE);
    }

    #[test]
    fn failed_precondition_wins_over_not_modified() {
        let conditions = Conditions {
            if_match: Some("\"other\""),
            if_none_match: Some(ETAG),
            ..Default::default()
        };
        assert_eq!(eval(conditions), Outcome::PreconditionFailed("If-Match"));
    }

    #[test]
    fn if_range_with_an_etag_needs_a_strong_match() {
        let check = |value: &str, expected: Outcome| {
            let conditions = Conditions {
                if_range: Some(value),
                ..Default::default()
            };
            assert_eq!(eval(conditions), expected, "{value}");
        };
        check(ETAG, SERVE);
        check(" \"801-2a-400-17a\" ", SERVE);
        check("\"other\"", SERVE_WHOLE);
        check("W/\"801-2a-400-17a\"", SERVE_WHOLE);
        check("\"801-2a-400-17a\", \"x\"", SERVE_WHOLE);
        check("\"801-2a-400-17a", SERVE_WHOLE);
    }

    #[test]
    fn if_range_with_a_date_needs_the_exact_last_modified() {
        let check = |value: &str, expected: Outcome| {
            let conditions = Conditions {
                if_range: Some(value),
                ..Default::default()
            };
            assert_eq!(eval(conditions), expected, "{value}");
        };
        check(AT_MTIME, SERVE);
        check(AFTER, SERVE_WHOLE);
        check(BEFORE, SERVE_WHOLE);
        check("not a date", SERVE_WHOLE);
    }

    #[test]
    fn if_range_date_of_a_file_changed_this_second_is_weak() {
        let conditions = Conditions {
            if_range: Some(AT_MTIME),
            ..Default::default()
        };
        let fresh = Validators {
            now: MTIME,
            ..file()
        };
        assert_eq!(evaluate(&conditions, &fresh), SERVE_WHOLE);
    }

    #[test]
    fn without_a_date_the_date_conditions_are_ignored() {
        let undated = Validators {
            mtime: None,
            ..file()
        };
        for (conditions, expected) in [
            (
                Conditions {
                    if_modified_since: Some(AFTER),
                    ..Default::default()
                },
                SERVE,
            ),
            (
                Conditions {
                    if_unmodified_since: Some(BEFORE),
                    ..Default::default()
                },
                SERVE,
            ),
            (
                Conditions {
                    if_range: Some(AT_MTIME),
                    ..Default::default()
                },
                SERVE_WHOLE,
            ),
            (
                Conditions {
                    if_none_match: Some(ETAG),
                    if_modified_since: Some(BEFORE),
                    ..Default::default()
                },
                Outcome::NotModified,
            ),
        ] {
            assert_eq!(evaluate(&conditions, &undated), expected, "{conditions:?}");
        }
    }
}
