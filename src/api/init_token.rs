//! Who may `POST /init`, and what it does to the token (SPEC §9): envd's
//! `validateInitAccessToken`, with the metadata service's `accessTokenHash`, plus sandboxd's two
//! other ways in (the `X-Access-Token` header and `--init-token-hash-file`).
//!
//! envd's rule, given the body's `accessToken` (the new token, possibly absent):
//!
//! 1. it equals the current token: authorised;
//! 2. the metadata service holds a non-empty `accessTokenHash` (lower-case hex SHA-512) and it
//!    is the hash of the new token, or, without a new token, the hash of the empty string (the
//!    host's "clear the token"): authorised, and in the second case the token is cleared;
//! 3. there is no current token and the service holds no hash (no service, not answering, or
//!    an empty hash): authorised (first set-up);
//! 4. otherwise 401.
//!
//! sandboxd adds, before 4: the current token in `X-Access-Token` (the credential of every other
//! route; its holder may do anything already), and a new token whose hex SHA-256 is the content
//! of `--init-token-hash-file` (for hosts without a metadata service: containers, plain VMs).
//! Neither clears the token.
//!
//! The metadata service is read only when its answer can matter, and never on an HTTP worker:
//! [`authorise`] decides at once when it can, and otherwise returns a [`Pending`] decision that
//! the hash thread (`mmds::hash`) completes, one read shared by the `/init`s waiting for it.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256, Sha512};

use crate::app::App;
use crate::auth::{self, AuthError};
use crate::http::deferred::Answer;
use crate::http::{Head, Response};
use crate::mmds::hash::Waiter;
use crate::mmds::Mmds;

/// What an authorised `/init` does to the token besides setting the body's new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenChange {
    /// Set the body's `accessToken` if it has one, else leave the token as it is.
    SetOrKeep,
    /// No `accessToken`, and the metadata service holds the hash of the empty token: clear it.
    Clear,
}

/// Who may `/init`, as far as the head and body tell.
pub enum Authorisation {
    Decided(Result<TokenChange, AuthError>),
    /// The metadata service's hash decides: [`Pending::decide`] reads it off the worker.
    Pending(Pending),
}

/// An `/init`'s authorisation waiting for the metadata service's hash.
pub struct Pending {
    mmds: Arc<Mmds>,
    new_token: Option<String>,
    /// With a token set: the header's verdict (the hash file's, with a new token, was no).
    header: Option<Result<(), AuthError>>,
}

/// Authorises one `/init` carrying `new_token` (the body's `accessToken`), or says what it
/// waits for.
pub fn authorise(app: &App, head: &Head, new_token: Option<&str>) -> Authorisation {
    let current = app.token();
    // envd's fast path: the body's token is the current one.
    if let (Some(current), Some(new)) = (&current, new_token) {
        if auth::constant_time_eq(new.as_bytes(), current.as_bytes()) {
            return Authorisation::Decided(Ok(TokenChange::SetOrKeep));
        }
    }
    // sandboxd's own ways in. With a new token they decide alone, so the holder of the current
    // token never waits on the metadata service; without one, the service may still say
    // "clear".
    let header = current
        .as_deref()
        .map(|current| auth::check_token(Some(current), head.header("x-access-token")));
    let by_file = current.is_some()
        && new_token.is_some_and(|token| {
            host_authorised(app.config.init_token_hash_file.as_deref(), token)
        });
    if new_token.is_some() && (by_file || matches!(header, Some(Ok(())))) {
        return Authorisation::Decided(Ok(TokenChange::SetOrKeep));
    }
    let pending = Pending {
        mmds: match &app.mmds {
            Some(mmds) => Arc::clone(mmds),
            None => return Authorisation::Decided(decide(None, new_token, header)),
        },
        new_token: new_token.map(str::to_owned),
        header,
    };
    Authorisation::Pending(pending)
}

impl Pending {
    /// Reads the hash on the metadata service's hash thread; there, `then` makes the answer
    /// from the decision and `reply` sends it, unless its client left before the read began.
    pub fn decide(
        self,
        reply: Answer,
        then: impl FnOnce(Result<TokenChange, AuthError>) -> Response + Send + 'static,
    ) {
        let mmds = Arc::clone(&self.mmds);
        mmds.with_access_token_hash(Box::new(Decision {
            pending: self,
            reply,
            then,
        }));
    }
}

struct Decision<T> {
    pending: Pending,
    reply: Answer,
    then: T,
}

impl<T> Waiter for Decision<T>
where
    T: FnOnce(Result<TokenChange, AuthError>) -> Response + Send,
{
    fn wanted(&self) -> bool {
        !self.reply.is_abandoned()
    }

    fn hash(self: Box<Self>, hash: Result<String, String>) {
        let Decision {
            pending,
            reply,
            then,
        } = *self;
        // A read that failed is "no hash" (the thread logged it once for all its callers).
        let decision = decide(
            hash.ok().as_deref(),
            pending.new_token.as_deref(),
            pending.header,
        );
        reply.send(then(decision));
    }
}

/// envd's decision once the metadata service's hash is known (`None`: none could be read),
/// with `header` the `X-Access-Token` verdict when a token is set.
fn decide(
    hash: Option<&str>,
    new_token: Option<&str>,
    header: Option<Result<(), AuthError>>,
) -> Result<TokenChange, AuthError> {
    let (matches, hash_held) = hash.map_or((false, false), |hash| check_hash(hash, new_token));
    match (matches, header) {
        (true, _) if new_token.is_none() => Ok(TokenChange::Clear),
        (true, _) => Ok(TokenChange::SetOrKeep),
        // No token set: first set-up, unless the service holds a hash this one does not match.
        (false, None) if hash_held => Err(AuthError::WrongToken),
        (false, None) => Ok(TokenChange::SetOrKeep),
        // A token set, and no way in left but the header (the hash file needs a new token,
        // which returned above): the header's answer, keeping the token.
        (false, Some(header)) => header.map(|()| TokenChange::SetOrKeep),
    }
}

/// envd's `checkMMDSHash`: (the new token's hash is the one held, a hash is held). An empty
/// hash is none; without a new token the hash of the empty string matches.
pub fn check_hash(held: &str, new_token: Option<&str>) -> (bool, bool) {
    if held.is_empty() {
        return (false, false);
    }
    let hash = sha512_hex(new_token.unwrap_or(""));
    (
        auth::constant_time_eq(hash.as_bytes(), held.as_bytes()),
        true,
    )
}

/// Largest hash file read: a hex SHA-256 is 64 bytes; anything much longer is not one.
const MAX_HASH_FILE: u64 = 4096;

/// True when the file at `path` holds the hex SHA-256 of `token` (surrounding whitespace and
/// the case of the hex digits ignored), compared in constant time. No file, an unreadable or
/// empty one: false (an unreadable one is logged, without its content).
fn host_authorised(path: Option<&Path>, token: &str) -> bool {
    let Some(path) = path else {
        return false;
    };
    let mut content = Vec::new();
    let read = std::fs::File::open(path)
        .and_then(|file| file.take(MAX_HASH_FILE).read_to_end(&mut content));
    if let Err(e) = read {
        if e.kind() != std::io::ErrorKind::NotFound {
            crate::log::line(format_args!(
                "init: cannot read the token hash file '{}': {e}",
                path.display()
            ));
        }
        return false;
    }
    let expected = content.trim_ascii().to_ascii_lowercase();
    !expected.is_empty() && auth::constant_time_eq(sha256_hex(token).as_bytes(), &expected)
}

/// envd's `keys.HashAccessToken`: lower-case hex SHA-512.
pub fn sha512_hex(text: &str) -> String {
    hex(&Sha512::digest(text.as_bytes()))
}

/// Lower-case hex SHA-256 (`--init-token-hash-file`'s).
fn sha256_hex(text: &str) -> String {
    hex(&Sha256::digest(text.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    bytes
        .iter()
        .flat_map(|byte| [HEX[usize::from(byte >> 4)], HEX[usize::from(byte & 0xf)]])
        .map(char::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // `printf '' | sha512sum` and `printf 'new-token' | sha512sum`.
    const EMPTY: &str = "cf83e1357eefb8bdf1542850d66d8007d620e4050b5715dc83f4a921d36ce9ce\
                         47d0d13c5d85f2b0ff8318d2877eec2f63b931bd47417a81a538327af927da3e";

    #[test]
    fn the_hash_is_envd_s_lower_case_hex_sha512() {
        assert_eq!(sha512_hex(""), EMPTY);
        assert_eq!(sha512_hex("abc").len(), 128);
        assert_eq!(
            &sha512_hex("abc")[..16],
            "ddaf35a193617aba",
            "FIPS 180-2's SHA-512 of \"abc\""
        );
    }

    #[test]
    fn check_hash_is_envd_s_check_mmds_hash() {
        let new = sha512_hex("new-token");
        assert_eq!(check_hash("", Some("new-token")), (false, false));
        assert_eq!(check_hash("", None), (false, false));
        assert_eq!(check_hash(&new, Some("new-token")), (true, true));
        assert_eq!(check_hash(&new, Some("other")), (false, true));
        assert_eq!(check_hash(&new, None), (false, true));
        assert_eq!(check_hash(EMPTY, None), (true, true));
        assert_eq!(
            check_hash(&new.to_uppercase(), Some("new-token")),
            (false, true)
        );
    }

    #[test]
    fn decide_is_envd_s_rule_with_the_header_as_a_way_in() {
        let new = sha512_hex("new-token");
        let set = |verdict: Result<(), AuthError>| Some(verdict);
        // The hash of the new token, or of the empty one without a token: in (the second clears).
        assert_eq!(
            decide(Some(&new), Some("new-token"), None),
            Ok(TokenChange::SetOrKeep)
        );
        assert_eq!(
            decide(Some(EMPTY), None, set(Err(AuthError::MissingToken))),
            Ok(TokenChange::Clear)
        );
        // No token set: first set-up unless a hash is held that this one does not match.
        assert_eq!(
            decide(None, Some("other"), None),
            Ok(TokenChange::SetOrKeep)
        );
        assert_eq!(
            decide(Some(""), Some("other"), None),
            Ok(TokenChange::SetOrKeep)
        );
        assert_eq!(
            decide(Some(&new), Some("other"), None),
            Err(AuthError::WrongToken)
        );
        // A token set: the header decides what the hash does not, and never clears.
        assert_eq!(
            decide(None, None, set(Err(AuthError::MissingToken))),
            Err(AuthError::MissingToken)
        );
        assert_eq!(
            decide(Some(&new), None, set(Ok(()))),
            Ok(TokenChange::SetOrKeep)
        );
    }

    #[test]
    fn sha256_hex_is_lower_case() {
        assert_eq!(
            sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn the_hash_file_authorises_exactly_its_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hash");
        assert!(!host_authorised(None, "new"));
        assert!(!host_authorised(Some(&path), "new"), "no file");
        std::fs::write(&path, "").unwrap();
        assert!(!host_authorised(Some(&path), ""), "empty file");
        std::fs::write(&path, format!("  {}\n", sha256_hex("new").to_uppercase())).unwrap();
        assert!(host_authorised(Some(&path), "new"));
        assert!(!host_authorised(Some(&path), "other"));
        assert!(!host_authorised(Some(dir.path()), "new"), "a directory");
    }
}
