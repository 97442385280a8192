//! A file's user metadata (SPEC §8, envd ≥ 0.6.2): string pairs kept as extended attributes
//! `user.e2b.<key>` on the file.
//!
//! This module owns the rules a set must meet and writing it onto an open file. The rules are
//! envd's (`ValidateMetadata` in e2b-dev/infra): keys are lower-cased, keys and values are
//! printable ASCII (0x20-0x7e), a key is at most 246 bytes (Linux's 255-byte attribute name
//! less the `user.e2b.` prefix), and the whole set at most 4096 bytes, counted as the sum of
//! prefix, key and value of every pair (ext4 keeps all of an inode's attributes in one 4 KiB
//! block). Where the pairs come from (request headers) is the upload's business.
//!
//! [`UserMetadata::apply`] gives a file exactly the set: `user.e2b.*` attributes it does not
//! name are removed, other attributes (`user.*` of other tools, `security.*`) are left alone.
//! sandboxd only ever applies it to a file it has just created, which starts with none, so the
//! removal is a guard that costs one `flistxattr`.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::path::Path;

use crate::fs::error::FsError;
use crate::sys;

/// The namespace of the attributes: `user.` is the one unprivileged processes may write, `e2b.`
/// keeps the keys apart from other tools' (as envd names them).
pub const PREFIX: &str = "user.e2b.";

/// Longest key: Linux limits an attribute name to 255 bytes, prefix included.
pub const MAX_KEY_BYTES: usize = 255 - PREFIX.len();

/// Largest set: the sum over the pairs of prefix, key and value lengths.
pub const MAX_TOTAL_BYTES: usize = 4096;

/// A valid metadata set, keys sorted (as envd's JSON answer has them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserMetadata(BTreeMap<String, String>);

impl UserMetadata {
    /// The set made of `pairs` (raw key, value), in order: keys are lower-cased, an empty key is
    /// skipped, and when a key comes more than once its first value counts (envd reads
    /// `X-Metadata-*` headers that way). The error is the reason the set is invalid.
    // Called from several handlers: one copy per caller type is enough.
    #[inline(never)]
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    ) -> Result<UserMetadata, String> {
        let mut set = BTreeMap::new();
        let mut total = 0usize;
        for (key, value) in pairs {
            if key.is_empty() {
                continue;
            }
            let key = printable("key", &key.to_ascii_lowercase(), None)?;
            if set.contains_key(&key) {
                continue;
            }
            if key.len() > MAX_KEY_BYTES {
                return Err(format!(
                    "key '{key}' is {} bytes long, more than {MAX_KEY_BYTES}",
                    key.len()
                ));
            }
            let value = printable("value", value, Some(&key))?;
            total += PREFIX.len() + key.len() + value.len();
            set.insert(key, value);
        }
        if total > MAX_TOTAL_BYTES {
            return Err(format!(
                "the metadata takes {total} bytes (each key counted with its '{PREFIX}' prefix), \
                 more than {MAX_TOTAL_BYTES}"
            ));
        }
        Ok(UserMetadata(set))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The JSON object of the answer: keys without the prefix.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::Value::Object(
            self.0
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect(),
        )
    }

    /// Gives `file` exactly this set of `user.e2b.*` attributes. A filesystem without extended
    /// attributes is fine for an empty set. Errors name `destination`: no extended attributes
    /// there, a set too large for that filesystem, or any other OS error (a full disk).
    // Called from several handlers: one copy in the binary, not one inlined into each.
    #[inline(never)]
    pub fn apply(&self, file: &File, destination: &Path) -> Result<(), FsError> {
        let fail = |err: io::Error| error(err, destination);
        let names = match sys::xattr::list(file) {
            Ok(names) => names,
            Err(err) if self.is_empty() && sys::xattr::unsupported(&err) => return Ok(()),
            Err(err) => return Err(fail(err)),
        };
        for name in &names {
            let Some(key) = name.strip_prefix(PREFIX.as_bytes()) else {
                continue;
            };
            let wanted = std::str::from_utf8(key).is_ok_and(|key| self.0.contains_key(key));
            if !wanted {
                let name = String::from_utf8_lossy(name);
                match sys::xattr::remove(file, &name) {
                    Err(err) if err.raw_os_error() != Some(libc::ENODATA) => return Err(fail(err)),
                    _ => {}
                }
            }
        }
        for (key, value) in &self.0 {
            sys::xattr::set(file, &format!("{PREFIX}{key}"), value.as_bytes()).map_err(fail)?;
        }
        Ok(())
    }
}

/// The error for an OS error met while giving `destination` its attributes.
fn error(err: io::Error, destination: &Path) -> FsError {
    if sys::xattr::unsupported(&err) {
        FsError::NoExtendedAttributes(destination.to_path_buf())
    } else if matches!(err.raw_os_error(), Some(libc::E2BIG | libc::ERANGE)) {
        FsError::MetadataTooLarge(destination.to_path_buf())
    } else {
        FsError::io(
            err,
            format!("storing metadata on '{}'", destination.display()),
        )
    }
}

/// `bytes` as a string when every byte is printable ASCII; else the reason, naming the key
/// (`of`, for a value).
fn printable(what: &str, bytes: &[u8], of: Option<&str>) -> Result<String, String> {
    match bytes.iter().position(|b| !(0x20..=0x7e).contains(b)) {
        None => Ok(bytes.iter().map(|&b| char::from(b)).collect()),
        Some(at) => {
            let whose = match of {
                Some(key) => format!("the {what} of key '{key}'"),
                None => format!("{what} '{}'", bytes.escape_ascii()),
            };
            Err(format!(
                "{whose} has byte 0x{:02x} at offset {at}, not printable ASCII",
                bytes[at]
            ))
        }
    }
}

/// The `user.e2b.*` attributes of the file at `path` (following a symlink), without the prefix,
/// as envd reports them: best-effort (nothing when they cannot be read), and a key or value
/// that is not UTF-8 is left out, so an attribute set by hand cannot break an answer.
pub fn read(path: &Path) -> BTreeMap<String, String> {
    pairs(sys::xattr::list_at(path), |name| {
        sys::xattr::get_at(path, name)
    })
}

/// [`read`] of an open file (no path to resolve again).
pub fn read_open(file: &File) -> BTreeMap<String, String> {
    pairs(sys::xattr::list(file), |name| sys::xattr::get(file, name))
}

fn pairs(
    names: io::Result<Vec<Vec<u8>>>,
    get: impl Fn(&[u8]) -> io::Result<Vec<u8>>,
) -> BTreeMap<String, String> {
    let Ok(names) = names else {
        return BTreeMap::new();
    };
    names
        .iter()
        .filter_map(|name| {
            let key = std::str::from_utf8(name.strip_prefix(PREFIX.as_bytes())?).ok()?;
            let value = String::from_utf8(get(name).ok()?).ok()?;
            Some((key.to_string(), value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(pairs: &[(&str, &str)]) -> Result<UserMetadata, String> {
        UserMetadata::from_pairs(pairs.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())))
    }

    #[test]
    fn keys_are_lower_cased_the_first_value_wins_and_empty_keys_are_skipped() {
        let metadata = set(&[
            ("Owner", "sdk-test"),
            ("purpose", "a check, with spaces ~!"),
            ("OWNER", "second"),
            ("", "nobody"),
            ("empty", ""),
        ])
        .unwrap();
        assert_eq!(
            metadata.to_json().to_string(),
            r#"{"empty":"","owner":"sdk-test","purpose":"a check, with spaces ~!"}"#
        );
        assert!(set(&[]).unwrap().is_empty());
    }

    #[test]
    fn a_key_may_have_246_bytes_not_247() {
        let key = "k".repeat(MAX_KEY_BYTES);
        assert_eq!(MAX_KEY_BYTES, 246);
        assert!(set(&[(&key, "v")]).is_ok());
        let long = "k".repeat(247);
        assert_eq!(
            set(&[(&long, "v")]).unwrap_err(),
            format!("key '{long}' is 247 bytes long, more than 246")
        );
    }

    #[test]
    fn the_whole_set_may_have_4096_bytes_counting_the_prefix() {
        // 9 + 1 + 4086 = 4096: the limit exactly.
        let value = "v".repeat(4086);
        assert!(set(&[("a", &value)]).is_ok());
        let value = "v".repeat(4087);
        assert_eq!(
            set(&[("a", &value)]).unwrap_err(),
            "the metadata takes 4097 bytes (each key counted with its 'user.e2b.' prefix), \
             more than 4096"
        );
        // Spread over many keys, and a dropped duplicate does not count.
        let value = "v".repeat(90);
        let keys: Vec<String> = (0..40).map(|i| format!("key{i:02}")).collect();
        let mut pairs: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), &*value)).collect();
        assert!(set(&pairs).is_err(), "40 * (9 + 5 + 90) = 4160 > 4096");
        pairs.truncate(39);
        pairs.push(("key00", &value));
        assert!(set(&pairs).is_ok());
    }

    #[test]
    fn keys_and_values_must_be_printable_ascii() {
        let bad: [(&[u8], &[u8], &str); 4] = [
            (
                b"k",
                b"tab\there",
                "the value of key 'k' has byte 0x09 at offset 3",
            ),
            (
                b"k",
                b"caf\xc3\xa9",
                "the value of key 'k' has byte 0xc3 at offset 3",
            ),
            (
                b"k",
                b"del\x7f",
                "the value of key 'k' has byte 0x7f at offset 3",
            ),
            (
                b"bad key\x01",
                b"v",
                r"key 'bad key\x01' has byte 0x01 at offset 7",
            ),
        ];
        for (key, value, reason) in bad {
            assert_eq!(
                UserMetadata::from_pairs([(key, value)]).unwrap_err(),
                format!("{reason}, not printable ASCII")
            );
        }
    }

    #[test]
    fn apply_sets_exactly_the_set_and_leaves_other_attributes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = File::create(&path).unwrap();
        if let Err(err) = sys::xattr::set(&file, "user.other.tool", b"kept") {
            assert!(sys::xattr::unsupported(&err), "{err}");
            eprintln!("skipped: the test directory's filesystem has no user xattrs: {err}");
            return;
        }
        sys::xattr::set(&file, "user.e2b.stale", b"old").unwrap();
        set(&[("Fresh", "new"), ("stay", "x")])
            .unwrap()
            .apply(&file, &path)
            .unwrap();
        let mut names = sys::xattr::list(&file).unwrap();
        names.sort();
        assert_eq!(
            names,
            [&b"user.e2b.fresh"[..], b"user.e2b.stay", b"user.other.tool"]
        );
        UserMetadata::default().apply(&file, &path).unwrap();
        assert_eq!(sys::xattr::list(&file).unwrap(), [b"user.other.tool"]);
    }
}
