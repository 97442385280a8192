//! `Accept-Encoding` (RFC 9110 §12.5.3): which content codings a download may be answered in.
//!
//! This module owns the parsing of the header's text and the choice between the two codings
//! sandboxd sends, `gzip` and `identity` (the file as it is). Whether a file is worth
//! compressing, and what happens when no compressor is free, are the handler's.
//!
//! Decisions, as RFC 9110 leaves them to the server:
//! - No header at all means identity: the zero-copy answer stays the default for clients that
//!   do not ask (RFC 9110 would allow any coding). An empty header means identity too (the RFC:
//!   "does not want any content coding").
//! - `x-gzip` is `gzip` (RFC 9110 §8.4.1.3); coding names and `q` are case-insensitive.
//! - A coding listed twice (`gzip;q=0, x-gzip`) counts with its highest weight.
//! - gzip's weight is its own entry's, else `*`'s, else 0 (refused). identity's is its own
//!   entry's, else `*`'s; unnamed and without `*` it is acceptable but has no weight of its own,
//!   so it never outranks a gzip the client listed.
//! - When both are acceptable, gzip wins a tie (`gzip, identity`, `*`); identity wins only
//!   with a strictly higher weight (`gzip;q=0.5, identity`).
//! - A header that does not follow the grammar (`#( token [ OWS ";" OWS "q=" qvalue ] )`: a
//!   weight above 1, more than three decimals, another parameter, a stray character, bytes
//!   that are not UTF-8) is no preference at all: treated as absent, so identity. Empty list
//!   elements (`gzip,,br`) are allowed, as RFC 9110 §5.6.1 says.

/// A weight in thousandths: 0 refuses, 1000 is the most preferred.
type Weight = u16;

/// What a request's `Accept-Encoding` allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accept {
    /// gzip's weight (0: not acceptable).
    gzip: Weight,
    /// identity's weight when the header gives one (`identity` or `*`); `None`: acceptable,
    /// with no weight of its own.
    identity: Option<Weight>,
}

/// The coding an answer is sent in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Identity,
    Gzip,
}

impl Accept {
    /// What a request without `Accept-Encoding` (or with one sandboxd cannot read) allows:
    /// identity only.
    pub const IDENTITY: Accept = Accept {
        gzip: 0,
        identity: None,
    };

    /// Reads the header's value, every field of the name joined by `,`; `None` when absent.
    // Called from several handlers: one copy in the binary, not one inlined into each.
    #[inline(never)]
    pub fn parse(value: Option<&[u8]>) -> Accept {
        value
            .and_then(|bytes| std::str::from_utf8(bytes).ok())
            .and_then(parse_list)
            .unwrap_or(Accept::IDENTITY)
    }

    /// True unless the client refused the file as it is (`identity;q=0`, or `*;q=0` without an
    /// `identity` entry).
    pub fn identity_acceptable(&self) -> bool {
        self.identity != Some(0)
    }

    /// True when gzip has a weight above 0.
    pub fn gzip_acceptable(&self) -> bool {
        self.gzip > 0
    }

    /// The coding to answer in: gzip when the client accepts it at least as much as identity
    /// and the file is `worth_compressing`; else identity if acceptable; else gzip if
    /// acceptable (the client refused identity, so even a file not worth compressing is
    /// compressed); `None` when the client accepts neither.
    pub fn choose(&self, worth_compressing: bool) -> Option<Coding> {
        let gzip_preferred =
            self.gzip_acceptable() && self.identity.is_none_or(|identity| self.gzip >= identity);
        if gzip_preferred && worth_compressing {
            Some(Coding::Gzip)
        } else if self.identity_acceptable() {
            Some(Coding::Identity)
        } else if self.gzip_acceptable() {
            Some(Coding::Gzip)
        } else {
            None
        }
    }
}

/// The weights of a well-formed list, or `None`.
fn parse_list(text: &str) -> Option<Accept> {
    let mut gzip = None::<Weight>;
    let mut identity = None::<Weight>;
    let mut any = None::<Weight>;
    for element in text.split(',') {
        let element = element.trim_matches(OWS);
        if element.is_empty() {
            continue;
        }
        let (name, weight) = parse_element(element)?;
        let slot = if name.eq_ignore_ascii_case("gzip") || name.eq_ignore_ascii_case("x-gzip") {
            &mut gzip
        } else if name.eq_ignore_ascii_case("identity") {
            &mut identity
        } else if name == "*" {
            &mut any
        } else {
            // A coding sandboxd does not send (br, zstd, deflate, ...): nothing to record.
            continue;
        };
        *slot = Some(slot.map_or(weight, |kept| kept.max(weight)));
    }
    Some(Accept {
        gzip: gzip.or(any).unwrap_or(0),
        identity: identity.or(any),
    })
}

/// Optional whitespace (RFC 9110 §5.6.3).
const OWS: &[char] = &[' ', '\t'];

/// `coding [ OWS ";" OWS "q=" qvalue ]` into the coding and its weight (1000 when unweighted).
fn parse_element(element: &str) -> Option<(&str, Weight)> {
    let (name, weight) = match element.split_once(';') {
        None => (element, 1000),
        Some((name, parameter)) => {
            let parameter = parameter.trim_start_matches(OWS);
            let value = parameter
                .strip_prefix("q=")
                .or_else(|| parameter.strip_prefix("Q="))?;
            (name.trim_end_matches(OWS), qvalue(value)?)
        }
    };
    (name == "*" || is_token(name)).then_some((name, weight))
}

/// `qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )` in thousandths.
fn qvalue(text: &str) -> Option<Weight> {
    let (whole, fraction) = match text.split_once('.') {
        Some((whole, fraction)) => (whole, fraction),
        None => (text, ""),
    };
    if fraction.len() > 3 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut thousandths: Weight = 0;
    for (i, digit) in fraction.bytes().enumerate() {
        let scale = [100, 10, 1][i];
        thousandths += Weight::from(digit - b'0') * scale;
    }
    match whole {
        "0" => Some(thousandths),
        "1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// A `token` of RFC 9110 §5.6.2: one or more `tchar`.
fn is_token(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(value: &str) -> Accept {
        Accept::parse(Some(value.as_bytes()))
    }

    fn weights(value: &str) -> (Weight, Option<Weight>) {
        let parsed = accept(value);
        (parsed.gzip, parsed.identity)
    }

    /// The coding chosen for a file worth compressing and for one that is not.
    fn chosen(value: &str) -> (Option<Coding>, Option<Coding>) {
        let parsed = accept(value);
        (parsed.choose(true), parsed.choose(false))
    }

    const GZIP: Option<Coding> = Some(Coding::Gzip);
    const IDENTITY: Option<Coding> = Some(Coding::Identity);

    #[test]
    fn no_header_is_identity_only() {
        assert_eq!(Accept::parse(None), Accept::IDENTITY);
        assert_eq!(Accept::IDENTITY.choose(true), IDENTITY);
        assert_eq!(accept(""), Accept::IDENTITY);
        assert_eq!(accept(" , ,"), Accept::IDENTITY);
    }

    #[test]
    fn gzip_and_its_old_name_in_any_case() {
        for value in [
            "gzip",
            "GZIP",
            "Gzip",
            "x-gzip",
            "X-GZip",
            " gzip ",
            "gzip, deflate, br",
        ] {
            assert_eq!(weights(value), (1000, None), "{value}");
            assert_eq!(chosen(value), (GZIP, IDENTITY), "{value}");
        }
    }

    #[test]
    fn what_browsers_and_clients_send() {
        // curl --compressed, Chrome, Firefox, Python requests, Go's transport.
        for value in [
            "deflate, gzip, br, zstd",
            "gzip, deflate, br, zstd",
            "gzip, deflate",
            "gzip",
        ] {
            assert_eq!(chosen(value), (GZIP, IDENTITY), "{value}");
        }
        assert_eq!(chosen("br"), (IDENTITY, IDENTITY));
        assert_eq!(chosen("identity"), (IDENTITY, IDENTITY));
    }

    #[test]
    fn q_values() {
        assert_eq!(weights("gzip;q=0.5"), (500, None));
        assert_eq!(weights("gzip;q=0.123"), (123, None));
        assert_eq!(weights("gzip;q=0.05"), (50, None));
        assert_eq!(weights("gzip;q=1"), (1000, None));
        assert_eq!(weights("gzip;q=1.000"), (1000, None));
        assert_eq!(weights("gzip;q=1."), (1000, None));
        assert_eq!(weights("gzip;q=0."), (0, None));
        assert_eq!(weights("gzip ; q=0.8"), (800, None));
        assert_eq!(weights("gzip;\tQ=0.8"), (800, None));
        // A lone gzip, however light, is still preferred to an unweighted identity.
        assert_eq!(chosen("gzip;q=0.001"), (GZIP, IDENTITY));
    }

    #[test]
    fn q_zero_refuses() {
        assert_eq!(chosen("gzip;q=0"), (IDENTITY, IDENTITY));
        assert_eq!(chosen("gzip;q=0.000"), (IDENTITY, IDENTITY));
        assert_eq!(chosen("x-gzip;q=0"), (IDENTITY, IDENTITY));
        assert_eq!(chosen("gzip;q=0, br"), (IDENTITY, IDENTITY));
    }

    #[test]
    fn identity_weight_against_gzip() {
        assert_eq!(chosen("gzip;q=0.5, identity"), (IDENTITY, IDENTITY));
        assert_eq!(chosen("gzip, identity;q=0.5"), (GZIP, IDENTITY));
        assert_eq!(chosen("gzip, identity"), (GZIP, IDENTITY));
        assert_eq!(chosen("identity, gzip"), (GZIP, IDENTITY));
        assert_eq!(chosen("gzip;q=0.5, identity;q=0.5"), (GZIP, IDENTITY));
    }

    #[test]
    fn identity_refused() {
        let refusing = accept("gzip, identity;q=0");
        assert!(!refusing.identity_acceptable());
        // Compressed even when not worth it: the file as it is was refused.
        assert_eq!(chosen("gzip, identity;q=0"), (GZIP, GZIP));
        assert_eq!(chosen("gzip;q=0.1, *;q=0"), (GZIP, GZIP));
        // A more specific identity entry wins over `*;q=0`.
        assert_eq!(chosen("gzip;q=0.5, identity, *;q=0"), (IDENTITY, IDENTITY));
        assert_eq!(chosen("*;q=0, identity;q=0.1"), (IDENTITY, IDENTITY));
        // Neither: nothing to answer in.
        for value in [
            "identity;q=0",
            "*;q=0",
            "br, identity;q=0",
            "gzip;q=0, *;q=0",
        ] {
            assert_eq!(chosen(value), (None, None), "{value}");
        }
    }

    #[test]
    fn the_wildcard() {
        assert_eq!(weights("*"), (1000, Some(1000)));
        assert_eq!(chosen("*"), (GZIP, IDENTITY));
        assert_eq!(weights("br, *;q=0.3"), (300, Some(300)));
        // gzip named: its own weight, not the wildcard's.
        assert_eq!(weights("gzip;q=0, *"), (0, Some(1000)));
        assert_eq!(chosen("gzip;q=0, *"), (IDENTITY, IDENTITY));
        assert_eq!(chosen("gzip;q=0.5, *"), (IDENTITY, IDENTITY));
        assert_eq!(chosen("*, identity;q=0.5"), (GZIP, IDENTITY));
    }

    #[test]
    fn a_coding_listed_twice_keeps_its_highest_weight() {
        assert_eq!(weights("gzip;q=0, gzip;q=0.4"), (400, None));
        assert_eq!(weights("gzip;q=0.9, x-gzip;q=0.2"), (900, None));
        assert_eq!(weights("identity;q=0, identity"), (0, Some(1000)));
    }

    #[test]
    fn unparseable_is_no_preference() {
        for value in [
            "gzip;q=2",
            "gzip;q=1.5",
            "gzip;q=1.001",
            "gzip;q=0.1234",
            "gzip;q=.5",
            "gzip;q=",
            "gzip;q",
            "gzip;q = 0.5",
            "gzip;level=1",
            "gzip;q=0.5;q=0.1",
            "gzip;",
            "gz ip",
            "gzip\"",
            "gzip/1",
            ";q=1",
            "gzip, identity;q=0, \u{e9}",
            "gzip;q=-0",
            "gzip;q=+1",
        ] {
            assert_eq!(accept(value), Accept::IDENTITY, "{value:?}");
        }
        assert_eq!(Accept::parse(Some(b"gzip\xff")), Accept::IDENTITY);
        // Even a refusal inside an unreadable header is not read.
        assert_eq!(accept("identity;q=0, gzip;q=x").choose(false), IDENTITY);
    }

    #[test]
    fn any_text_gives_a_coding_only_if_the_header_accepts_it() {
        // Pieces of well-formed and broken headers, strung together at random.
        const PIECES: &[&str] = &[
            "gzip", "x-gzip", "GZIP", "identity", "*", "br", ";q=", ";Q=", " ; q=", "0", "1", ".",
            "5", "000", ",", ", ", " ", "\t", "=", ";", "q", "\"",
        ];
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut value = Vec::new();
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            value.clear();
            for i in 0..(x % 12) {
                let pick = usize::try_from((x >> (i * 5)) % PIECES.len() as u64).unwrap();
                value.extend_from_slice(PIECES[pick].as_bytes());
            }
            let accept = Accept::parse(Some(&value));
            for worth in [false, true] {
                match accept.choose(worth) {
                    Some(Coding::Gzip) => assert!(accept.gzip_acceptable()),
                    Some(Coding::Identity) => assert!(accept.identity_acceptable()),
                    None => assert!(!accept.gzip_acceptable() && !accept.identity_acceptable()),
                }
            }
            // Worth compressing never turns gzip into identity.
            if accept.choose(false) == Some(Coding::Gzip) {
                assert_eq!(accept.choose(true), Some(Coding::Gzip));
            }
            assert!(accept.gzip <= 1000 && accept.identity.is_none_or(|w| w <= 1000));
        }
    }

    #[test]
    fn fields_joined_by_the_handler_read_as_one_list() {
        assert_eq!(weights("br,gzip;q=0.7"), (700, None));
        assert_eq!(weights("identity;q=0,gzip"), (1000, Some(0)));
    }
}
