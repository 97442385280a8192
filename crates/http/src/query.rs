//! Query strings: `application/x-www-form-urlencoded` decoding (`+` is a space, `%2B` is `+`).
//!
//! Values are decoded to bytes and must then be UTF-8: a parameter that is not is refused rather
//! than silently replaced, since it names a file or a signature.

/// Decoded query parameters in the order sent.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Query {
    pairs: Vec<(String, String)>,
}

/// A parameter whose decoded bytes are not UTF-8; holds the raw (encoded) name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryError {
    /// The parameter's name as sent.
    pub name: String,
}

impl Query {
    /// Decodes a raw query string (`a=1&b=%20`).
    pub fn parse(raw: &str) -> Result<Query, QueryError> {
        let mut pairs = Vec::new();
        for item in raw.split('&').filter(|item| !item.is_empty()) {
            let (name, value) = item.split_once('=').unwrap_or((item, ""));
            let error = || QueryError {
                name: name.to_string(),
            };
            let name_text = String::from_utf8(decode(name)).map_err(|_| error())?;
            let value_text = String::from_utf8(decode(value)).map_err(|_| error())?;
            pairs.push((name_text, value_text));
        }
        Ok(Query { pairs })
    }

    /// The first value of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Percent- and plus-decodes one component; a `%` not followed by two hex digits stays literal.
pub fn decode(component: &str) -> Vec<u8> {
    let bytes = component.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => match (
                bytes.get(i + 1).and_then(hex),
                bytes.get(i + 2).and_then(hex),
            ) {
                (Some(high), Some(low)) => {
                    out.push(high << 4 | low);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            byte => out.push(byte),
        }
        i += 1;
    }
    out
}

fn hex(digit: &u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

/// The target with every `signature` parameter removed, for logs (SPEC §1: never log a signature).
pub fn redact_signature(target: &str) -> std::borrow::Cow<'_, str> {
    let Some((path, query)) = target.split_once('?') else {
        return target.into();
    };
    if !query.contains("signature") && !query.contains('%') {
        return target.into();
    }
    let kept: Vec<&str> = query
        .split('&')
        .filter(|item| decode(item.split_once('=').map_or(item, |(n, _)| n)) != b"signature")
        .collect();
    if kept.is_empty() {
        path.into()
    } else {
        format!("{path}?{}", kept.join("&")).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plus_is_space_and_percent_2b_is_plus() {
        let query = Query::parse("path=a+b%2Bc&username=us%65r").unwrap();
        assert_eq!(query.get("path"), Some("a b+c"));
        assert_eq!(query.get("username"), Some("user"));
        assert_eq!(query.get("signature"), None);
    }

    #[test]
    fn first_value_wins_and_bare_names_are_empty() {
        let query = Query::parse("a=1&a=2&flag&&b=").unwrap();
        assert_eq!(query.get("a"), Some("1"));
        assert_eq!(query.get("flag"), Some(""));
        assert_eq!(query.get("b"), Some(""));
    }

    #[test]
    fn malformed_percent_stays_literal() {
        assert_eq!(decode("100%"), b"100%");
        assert_eq!(decode("%zz%4"), b"%zz%4");
        assert_eq!(decode("%00"), b"\0");
    }

    #[test]
    fn invalid_utf8_is_refused_naming_the_parameter() {
        assert_eq!(
            Query::parse("ok=1&path=%ff").unwrap_err(),
            QueryError {
                name: "path".into()
            }
        );
    }

    #[test]
    fn signatures_are_redacted_from_logged_targets() {
        assert_eq!(
            redact_signature("/files?path=a&signature=v1_x&signature_expiration=9"),
            "/files?path=a&signature_expiration=9"
        );
        assert_eq!(redact_signature("/files?signature=v1_x"), "/files");
        assert_eq!(redact_signature("/files?%73ignature=x&a=1"), "/files?a=1");
        assert_eq!(redact_signature("/health"), "/health");
    }
}
