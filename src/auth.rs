//! Authentication (SPEC §3): the access token and signed URLs.
//!
//! This module owns every decision about whether a request may proceed: comparing the
//! `X-Access-Token` header with the configured token, computing and checking `v1_` (envd's plain
//! SHA-256) and `v2_` (HMAC-SHA256, always expiring) URL signatures, and building the query string
//! that `sandboxd sign` prints. It does not parse HTTP: callers hand it the header bytes and the
//! already-decoded query values. All comparisons of secrets are constant-time.
//!
//! A refusal is an [`AuthError`] saying why, in this module's terms; its `Display` is the
//! client's message (envd's wording). Which status answers it is `api::status`'s decision.

use std::fmt;

use base64_simd::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Message when a token is configured and the header is missing or wrong.
pub const UNAUTHORIZED: &str =
    "unauthorized access, please provide a valid access token or method signing if supported";
/// Message when a file request carries a non-empty header that is not the token.
pub const HEADER_MISMATCH: &str = "access token present in header but does not match";
/// Message when a file request has neither a header nor a signature.
pub const MISSING_SIGNATURE: &str = "missing signature query parameter";
/// Message for a signature that does not match.
pub const INVALID_SIGNATURE: &str = "invalid signature";
/// Message for a matching signature past its expiration.
pub const EXPIRED_SIGNATURE: &str = "signature is already expired";

/// Why a request may not proceed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// No `X-Access-Token`, or an empty one, where only the token admits.
    MissingToken,
    /// An `X-Access-Token` that is not the token, where only the token admits.
    WrongToken,
    /// A file request's non-empty `X-Access-Token` that is not the token (the signature is then
    /// not looked at).
    HeaderMismatch,
    /// A file request with neither a header nor a `signature`.
    MissingSignature,
    /// A signature that is not the one expected: altered, for another operation, of an unknown
    /// version, or a `v2_` one without its expiration.
    BadSignature,
    /// A matching signature past its expiration.
    Expired,
    /// A `signature_expiration` that is not Unix seconds, as sent.
    MalformedExpiration(String),
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthError::MissingToken | AuthError::WrongToken => f.write_str(UNAUTHORIZED),
            AuthError::HeaderMismatch => f.write_str(HEADER_MISMATCH),
            AuthError::MissingSignature => f.write_str(MISSING_SIGNATURE),
            AuthError::BadSignature => f.write_str(INVALID_SIGNATURE),
            AuthError::Expired => f.write_str(EXPIRED_SIGNATURE),
            AuthError::MalformedExpiration(raw) => write!(
                f,
                "invalid signature_expiration query parameter '{raw}': expected Unix seconds"
            ),
        }
    }
}

impl std::error::Error for AuthError {}

/// The operation word of a signature: `read` for GET/HEAD, `write` for POST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Read,
    Write,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Read => "read",
            Operation::Write => "write",
        }
    }
}

/// Compares two byte strings without stopping at the first differing byte.
///
/// A length mismatch returns `false` at once: lengths of tokens and signatures are not secret.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// envd's signature: `"v1_"` and the SHA-256 of `path:op:username:token[:expiration]` in
/// standard base64 without padding.
pub fn sign_v1(
    path: &str,
    op: Operation,
    username: &str,
    token: &str,
    expiration: Option<i64>,
) -> String {
    let mut hasher = Sha256::new();
    hasher.update(path.as_bytes());
    hasher.update(b":");
    hasher.update(op.as_str().as_bytes());
    hasher.update(b":");
    hasher.update(username.as_bytes());
    hasher.update(b":");
    hasher.update(token.as_bytes());
    if let Some(expiration) = expiration {
        hasher.update(format!(":{expiration}").as_bytes());
    }
    format!("v1_{}", STANDARD_NO_PAD.encode_to_string(hasher.finalize()))
}

/// sandboxd's signature: `"v2_"` and the HMAC-SHA256 (keyed by the token) of
/// `path:op:username:expiration` in URL-safe base64 without padding.
pub fn sign_v2(path: &str, op: Operation, username: &str, token: &str, expiration: i64) -> String {
    let mut mac = hmac_sha256(token.as_bytes());
    mac.update(format!("{path}:{}:{username}:{expiration}", op.as_str()).as_bytes());
    format!(
        "v2_{}",
        URL_SAFE_NO_PAD.encode_to_string(mac.finalize().into_bytes())
    )
}

/// An HMAC-SHA256 keyed with `key`, built without a fallible constructor: RFC 2104 hashes a key
/// longer than the block and zero-pads it to the block size, which is exactly the fixed-size key
/// `Hmac::new` takes.
fn hmac_sha256(key: &[u8]) -> Hmac<Sha256> {
    let mut block = [0u8; 64];
    if key.len() > block.len() {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    <Hmac<Sha256> as Mac>::new(&block.into())
}

/// The raw (already percent/plus-decoded) query values of a file request.
///
/// `path` and `username` are the empty string when absent; `signature` and `expiration` are the
/// `signature` and `signature_expiration` parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignedQuery<'a> {
    pub path: &'a str,
    pub username: &'a str,
    pub signature: Option<&'a str>,
    pub expiration: Option<&'a str>,
}

/// Routes other than /health and /files: header must equal the configured token.
///
/// Without a configured token every request passes.
pub fn check_token(configured: Option<&str>, header: Option<&[u8]>) -> Result<(), AuthError> {
    let Some(token) = configured else {
        return Ok(());
    };
    match header {
        None | Some(b"") => Err(AuthError::MissingToken),
        Some(value) if constant_time_eq(value, token.as_bytes()) => Ok(()),
        Some(_) => Err(AuthError::WrongToken),
    }
}

/// GET/HEAD/POST /files: header token, or a signed URL for `op`.
///
/// A non-empty header decides alone (the query is not looked at). Otherwise the signature is
/// checked, and only a matching signature is checked for expiry (`expiration < now_unix`).
pub fn check_file_access(
    configured: Option<&str>,
    header: Option<&[u8]>,
    query: &SignedQuery,
    op: Operation,
    now_unix: i64,
) -> Result<(), AuthError> {
    let Some(token) = configured else {
        return Ok(());
    };
    if let Some(value) = header.filter(|value| !value.is_empty()) {
        return if constant_time_eq(value, token.as_bytes()) {
            Ok(())
        } else {
            Err(AuthError::HeaderMismatch)
        };
    }
    let signature = match query.signature {
        Some(signature) if !signature.is_empty() => signature,
        _ => return Err(AuthError::MissingSignature),
    };
    let expiration = query.expiration.map(parse_expiration).transpose()?;
    let expected = if signature.starts_with("v1_") {
        sign_v1(query.path, op, query.username, token, expiration)
    } else if signature.starts_with("v2_") {
        match expiration {
            Some(expiration) => sign_v2(query.path, op, query.username, token, expiration),
            None => return Err(AuthError::BadSignature),
        }
    } else {
        return Err(AuthError::BadSignature);
    };
    if !constant_time_eq(signature.as_bytes(), expected.as_bytes()) {
        return Err(AuthError::BadSignature);
    }
    match expiration {
        Some(expiration) if expiration < now_unix => Err(AuthError::Expired),
        _ => Ok(()),
    }
}

/// `signature_expiration` as Unix seconds.
fn parse_expiration(raw: &str) -> Result<i64, AuthError> {
    raw.parse::<i64>()
        .map_err(|_| AuthError::MalformedExpiration(raw.to_string()))
}

/// The percent-encoded query string of a signed URL, for `sandboxd sign`:
/// `path=...&username=...&signature=...&signature_expiration=...` (`username` omitted when empty).
///
/// `version` 1 signs with `v1_` (including the expiration); any other value signs with `v2_`,
/// the stronger scheme, so a mistaken version never weakens the URL.
pub fn signed_url_query(
    path: &str,
    op: Operation,
    username: &str,
    token: &str,
    expiration: i64,
    version: u8,
) -> String {
    let signature = if version == 1 {
        sign_v1(path, op, username, token, Some(expiration))
    } else {
        sign_v2(path, op, username, token, expiration)
    };
    let encode =
        |value: &str| form_urlencoded::byte_serialize(value.as_bytes()).collect::<String>();
    let mut query = format!("path={}", encode(path));
    if !username.is_empty() {
        query.push_str("&username=");
        query.push_str(&encode(username));
    }
    query.push_str("&signature=");
    query.push_str(&encode(&signature));
    query.push_str(&format!("&signature_expiration={expiration}"));
    query
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "secret-token";
    const EXP: i64 = 1_700_000_000;

    fn query<'a>(
        path: &'a str,
        username: &'a str,
        signature: Option<&'a str>,
        expiration: Option<&'a str>,
    ) -> SignedQuery<'a> {
        SignedQuery {
            path,
            username,
            signature,
            expiration,
        }
    }

    fn file_access(q: &SignedQuery, op: Operation, now: i64) -> Result<(), AuthError> {
        check_file_access(Some(TOKEN), None, q, op, now)
    }

    #[test]
    fn operation_words() {
        assert_eq!(Operation::Read.as_str(), "read");
        assert_eq!(Operation::Write.as_str(), "write");
    }

    #[test]
    fn constant_time_eq_cases() {
        assert!(constant_time_eq(b"", b""));
        assert!(constant_time_eq(b"secret-token", b"secret-token"));
        assert!(!constant_time_eq(b"secret-token", b"secret-tokem"));
        assert!(!constant_time_eq(b"Xecret-token", b"secret-token"));
        assert!(!constant_time_eq(b"secret-token", b"secret-token "));
        assert!(!constant_time_eq(b"secret", b"secret-token"));
        assert!(!constant_time_eq(b"", b"a"));
    }

    #[test]
    fn sign_v1_matches_spec_vectors() {
        assert_eq!(
            sign_v1("/tmp/a.txt", Operation::Read, "", TOKEN, None),
            "v1_CDCMrbQyUHyA5BgoY3jXv19yxwH8ZU5/7B4GD7PyUBk"
        );
        assert_eq!(
            sign_v1("/tmp/a.txt", Operation::Read, "user", TOKEN, Some(EXP)),
            "v1_8qywDjLKW2P0wQ1QjV1/xVDCWHpzm6/fx3cZ+pGFg+w"
        );
        assert_eq!(
            sign_v1("demo/test.txt", Operation::Write, "user", TOKEN, None),
            "v1_Z9gF3P/eNV3fAoz0bKy62UEAx0aXorYY3wmiZ4eBbOo"
        );
    }

    #[test]
    fn sign_v2_matches_python_hmac() {
        // Computed independently, once, with:
        // python3 -c "import hmac,hashlib,base64; print('v2_'+base64.urlsafe_b64encode(hmac.new(
        //   b'secret-token', b'/tmp/a.txt:read:user:1700000000', hashlib.sha256).digest())
        //   .rstrip(b'=').decode())"
        assert_eq!(
            sign_v2("/tmp/a.txt", Operation::Read, "user", TOKEN, EXP),
            "v2_8L9tNgzA_ReU3WX1rwwHYaxTGmzlcB0Zb3NM5sCE5LA"
        );
        // Same, with b'demo/test.txt:write::1700000000'.
        assert_eq!(
            sign_v2("demo/test.txt", Operation::Write, "", TOKEN, EXP),
            "v2_R6Q6Qn85cB7PCxUJ47NwH9UX3R2MVvfLQ_qgWeWtY1U"
        );
    }

    #[test]
    fn hmac_with_block_key_equals_hmac_crate_for_any_key_length() {
        for len in [0usize, 1, 12, 63, 64, 65, 200] {
            let key: Vec<u8> = (0..len).map(|i| u8::try_from(i).unwrap() ^ 0x5a).collect();
            let mut ours = hmac_sha256(&key);
            ours.update(b"message");
            let mut reference = <Hmac<Sha256> as Mac>::new_from_slice(&key).unwrap();
            reference.update(b"message");
            assert_eq!(
                ours.finalize().into_bytes(),
                reference.finalize().into_bytes(),
                "key length {len}"
            );
        }
    }

    #[test]
    fn open_daemon_allows_everything() {
        assert_eq!(check_token(None, None), Ok(()));
        assert_eq!(check_token(None, Some(b"anything")), Ok(()));
        let q = query("/etc/shadow", "", Some("garbage"), Some("abc"));
        assert_eq!(
            check_file_access(None, None, &q, Operation::Write, 0),
            Ok(())
        );
    }

    #[test]
    fn check_token_requires_the_exact_header() {
        assert_eq!(check_token(Some(TOKEN), Some(b"secret-token")), Ok(()));
        assert_eq!(check_token(Some(TOKEN), None), Err(AuthError::MissingToken));
        assert_eq!(
            check_token(Some(TOKEN), Some(b"")),
            Err(AuthError::MissingToken)
        );
        assert_eq!(
            check_token(Some(TOKEN), Some(b"secret-tokeN")),
            Err(AuthError::WrongToken)
        );
        assert_eq!(
            check_token(Some(TOKEN), Some(b"secret")),
            Err(AuthError::WrongToken)
        );
    }

    #[test]
    fn valid_header_wins_over_a_garbage_signature() {
        let q = query("/tmp/a.txt", "", Some("v1_garbage"), Some("not-a-number"));
        let result = check_file_access(Some(TOKEN), Some(b"secret-token"), &q, Operation::Read, 0);
        assert_eq!(result, Ok(()));
    }

    #[test]
    fn wrong_header_is_refused_even_with_a_valid_signature() {
        let signature = sign_v1("/tmp/a.txt", Operation::Read, "", TOKEN, None);
        let q = query("/tmp/a.txt", "", Some(&signature), None);
        assert_eq!(file_access(&q, Operation::Read, EXP), Ok(()));
        let result = check_file_access(Some(TOKEN), Some(b"wrong"), &q, Operation::Read, EXP);
        assert_eq!(result, Err(AuthError::HeaderMismatch));
    }

    #[test]
    fn empty_header_falls_back_to_the_signature() {
        let signature = sign_v1("/tmp/a.txt", Operation::Read, "", TOKEN, None);
        let q = query("/tmp/a.txt", "", Some(&signature), None);
        let result = check_file_access(Some(TOKEN), Some(b""), &q, Operation::Read, EXP);
        assert_eq!(result, Ok(()));
        let q = query("/tmp/a.txt", "", None, None);
        let result = check_file_access(Some(TOKEN), Some(b""), &q, Operation::Read, EXP);
        assert_eq!(result, Err(AuthError::MissingSignature));
    }

    #[test]
    fn missing_or_empty_signature() {
        let expected = Err(AuthError::MissingSignature);
        assert_eq!(
            file_access(&query("/a", "", None, None), Operation::Read, 0),
            expected
        );
        assert_eq!(
            file_access(&query("/a", "", Some(""), None), Operation::Read, 0),
            expected
        );
    }

    #[test]
    fn malformed_expiration_is_refused_naming_the_value() {
        for raw in [
            "abc",
            "",
            "1.5",
            "17e8",
            " 1700000000",
            "99999999999999999999",
        ] {
            let q = query("/tmp/a.txt", "", Some("v1_x"), Some(raw));
            assert_eq!(
                file_access(&q, Operation::Read, 0),
                Err(AuthError::MalformedExpiration(raw.to_string())),
                "{raw:?}"
            );
        }
    }

    #[test]
    fn spec_v1_vectors_are_accepted() {
        let q = query(
            "/tmp/a.txt",
            "",
            Some("v1_CDCMrbQyUHyA5BgoY3jXv19yxwH8ZU5/7B4GD7PyUBk"),
            None,
        );
        assert_eq!(file_access(&q, Operation::Read, EXP), Ok(()));
        let q = query(
            "/tmp/a.txt",
            "user",
            Some("v1_8qywDjLKW2P0wQ1QjV1/xVDCWHpzm6/fx3cZ+pGFg+w"),
            Some("1700000000"),
        );
        assert_eq!(file_access(&q, Operation::Read, EXP), Ok(()));
        let q = query(
            "demo/test.txt",
            "user",
            Some("v1_Z9gF3P/eNV3fAoz0bKy62UEAx0aXorYY3wmiZ4eBbOo"),
            None,
        );
        assert_eq!(file_access(&q, Operation::Write, EXP), Ok(()));
    }

    #[test]
    fn v2_is_accepted_with_its_expiration_and_refused_without() {
        let signature = "v2_8L9tNgzA_ReU3WX1rwwHYaxTGmzlcB0Zb3NM5sCE5LA";
        let q = query("/tmp/a.txt", "user", Some(signature), Some("1700000000"));
        assert_eq!(file_access(&q, Operation::Read, EXP), Ok(()));
        let q = query("/tmp/a.txt", "user", Some(signature), None);
        assert_eq!(
            file_access(&q, Operation::Read, EXP),
            Err(AuthError::BadSignature)
        );
    }

    #[test]
    fn unknown_prefix_is_invalid() {
        let v1 = sign_v1("/tmp/a.txt", Operation::Read, "", TOKEN, None);
        let unprefixed = v1.trim_start_matches("v1_").to_string();
        for signature in [unprefixed.as_str(), "v3_abc", "V1_abc", "garbage"] {
            let q = query("/tmp/a.txt", "", Some(signature), None);
            assert_eq!(
                file_access(&q, Operation::Read, 0),
                Err(AuthError::BadSignature),
                "{signature}"
            );
        }
    }

    #[test]
    fn expiry_boundary() {
        for signature in [
            sign_v1("/tmp/a.txt", Operation::Read, "user", TOKEN, Some(EXP)),
            sign_v2("/tmp/a.txt", Operation::Read, "user", TOKEN, EXP),
        ] {
            let q = query("/tmp/a.txt", "user", Some(&signature), Some("1700000000"));
            assert_eq!(file_access(&q, Operation::Read, EXP - 1), Ok(()));
            assert_eq!(file_access(&q, Operation::Read, EXP), Ok(()));
            assert_eq!(
                file_access(&q, Operation::Read, EXP + 1),
                Err(AuthError::Expired)
            );
        }
    }

    #[test]
    fn expired_but_forged_signature_is_invalid_not_expired() {
        let q = query("/tmp/a.txt", "user", Some("v1_forged"), Some("1"));
        assert_eq!(
            file_access(&q, Operation::Read, EXP),
            Err(AuthError::BadSignature)
        );
    }

    #[test]
    fn read_signature_is_refused_for_write() {
        for signature in [
            sign_v1("/tmp/a.txt", Operation::Read, "user", TOKEN, Some(EXP)),
            sign_v2("/tmp/a.txt", Operation::Read, "user", TOKEN, EXP),
        ] {
            let q = query("/tmp/a.txt", "user", Some(&signature), Some("1700000000"));
            assert_eq!(file_access(&q, Operation::Read, EXP), Ok(()));
            assert_eq!(
                file_access(&q, Operation::Write, EXP),
                Err(AuthError::BadSignature)
            );
        }
    }

    #[test]
    fn altered_fields_are_invalid() {
        for signature in [
            sign_v1("/tmp/a.txt", Operation::Read, "user", TOKEN, Some(EXP)),
            sign_v2("/tmp/a.txt", Operation::Read, "user", TOKEN, EXP),
        ] {
            let altered = [
                query("/tmp/b.txt", "user", Some(&signature), Some("1700000000")),
                query("/tmp/a.txt", "root", Some(&signature), Some("1700000000")),
                query("/tmp/a.txt", "", Some(&signature), Some("1700000000")),
                query("/tmp/a.txt", "user", Some(&signature), Some("1700000001")),
            ];
            for q in altered {
                assert_eq!(
                    file_access(&q, Operation::Read, 0),
                    Err(AuthError::BadSignature),
                    "{q:?}"
                );
            }
        }
    }

    #[test]
    fn expiration_must_be_sent_exactly_when_signed() {
        // Signed with an expiration, sent without it.
        let with = sign_v1("/tmp/a.txt", Operation::Read, "user", TOKEN, Some(EXP));
        let q = query("/tmp/a.txt", "user", Some(&with), None);
        assert_eq!(
            file_access(&q, Operation::Read, 0),
            Err(AuthError::BadSignature)
        );
        // Signed without one, sent with one.
        let without = sign_v1("/tmp/a.txt", Operation::Read, "user", TOKEN, None);
        let q = query("/tmp/a.txt", "user", Some(&without), Some("1700000000"));
        assert_eq!(
            file_access(&q, Operation::Read, 0),
            Err(AuthError::BadSignature)
        );
    }

    #[test]
    fn signature_from_another_token_is_invalid() {
        let signature = sign_v2("/tmp/a.txt", Operation::Read, "", "other-token", EXP);
        let q = query("/tmp/a.txt", "", Some(&signature), Some("1700000000"));
        assert_eq!(
            file_access(&q, Operation::Read, 0),
            Err(AuthError::BadSignature)
        );
    }

    fn parse_pairs(query: &str) -> Vec<(String, String)> {
        form_urlencoded::parse(query.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect()
    }

    fn value<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
        pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn signed_url_query_round_trips_through_form_urlencoded() {
        let path = "/home/user/a b+c&d=é%.txt";
        for (version, prefix) in [(1u8, "v1_"), (2u8, "v2_")] {
            let text = signed_url_query(path, Operation::Write, "us er", TOKEN, EXP, version);
            assert!(!text.contains(' '), "{text}");
            let pairs = parse_pairs(&text);
            let keys: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(
                keys,
                ["path", "username", "signature", "signature_expiration"]
            );
            assert_eq!(value(&pairs, "path"), Some(path));
            assert_eq!(value(&pairs, "username"), Some("us er"));
            assert_eq!(value(&pairs, "signature_expiration"), Some("1700000000"));
            let signature = value(&pairs, "signature").unwrap_or_default();
            assert!(signature.starts_with(prefix), "{signature}");
            let q = SignedQuery {
                path: value(&pairs, "path").unwrap_or_default(),
                username: value(&pairs, "username").unwrap_or_default(),
                signature: value(&pairs, "signature"),
                expiration: value(&pairs, "signature_expiration"),
            };
            assert_eq!(file_access(&q, Operation::Write, EXP), Ok(()));
            assert_eq!(
                file_access(&q, Operation::Read, EXP),
                Err(AuthError::BadSignature)
            );
        }
    }

    #[test]
    fn signed_url_query_omits_an_empty_username() {
        let text = signed_url_query("/tmp/a.txt", Operation::Read, "", TOKEN, EXP, 2);
        // The signature was computed with Python's hmac, as in `sign_v2_matches_python_hmac`,
        // over b'/tmp/a.txt:read::1700000000'.
        assert_eq!(
            text,
            "path=%2Ftmp%2Fa.txt\
             &signature=v2_oonFLeoi42S2NawwtuXZXHCclxV3OAZn0cNXhJLTyIM\
             &signature_expiration=1700000000"
        );
        let pairs = parse_pairs(&text);
        assert_eq!(value(&pairs, "username"), None);
    }

    #[test]
    fn signed_url_query_version_1_uses_the_spec_v1_form() {
        let text = signed_url_query("/tmp/a.txt", Operation::Read, "user", TOKEN, EXP, 1);
        assert_eq!(
            text,
            "path=%2Ftmp%2Fa.txt&username=user\
             &signature=v1_8qywDjLKW2P0wQ1QjV1%2FxVDCWHpzm6%2Ffx3cZ%2BpGFg%2Bw\
             &signature_expiration=1700000000"
        );
    }
}
