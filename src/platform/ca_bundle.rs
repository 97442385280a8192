//! `/init`'s `caBundle`: the proxy's CA certificate(s) in the system trust store, where envd puts
//! them (`internal/host/cacerts.go`): appended to the bundle TLS clients read,
//! `/etc/ssl/certs/ca-certificates.crt`, and persisted alone in
//! `/usr/local/share/ca-certificates/e2b-ca.crt`, where `update-ca-certificates` finds it when it
//! rebuilds the bundle. Both under `--system-root`, and a third beside the persisted one while an
//! install runs ([`PENDING`]).
//!
//! [`validate`] and [`edit`] are pure (text in, text out); [`install`] and [`uninstall`] do the
//! I/O. The persisted file is also the record of what is in the bundle: a later `/init` removes
//! every copy of the certificate it holds (and of the new one) from the bundle and appends the
//! new one, in one atomic rewrite (`atomic_file`), then replaces the persisted file; the new
//! certificate is named in [`PENDING`] meanwhile, so a crash between the two leaves nothing the
//! next `/init` does not clean (see [`install`]). Since the record is on disk, a restarted daemon
//! still replaces the certificate rather than adding a second (envd keeps it in memory and
//! appends again after a restart).
//!
//! The certificate is appended as the client sent it, with exactly one trailing `\n` (envd's
//! normalisation), so its removal is an exact text match.

use std::path::Path;

use base64_simd::STANDARD;

use super::atomic_file::{self, FileError};

/// The bundle TLS clients read (Debian's, envd's `CaBundlePath`), under the system root.
pub const BUNDLE: &str = "etc/ssl/certs/ca-certificates.crt";

/// The certificate kept for `update-ca-certificates` (envd's `caExtraPath`).
pub const PERSISTED: &str = "usr/local/share/ca-certificates/e2b-ca.crt";

const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
const END: &str = "-----END CERTIFICATE-----";

/// Checks that `pem` is one or more PEM certificates and returns it normalised (one trailing
/// `\n`), or the reason it is not, naming the line. Checked: outside the blocks only blank
/// lines and `#` comments (as Mozilla-derived bundles carry); every block is `CERTIFICATE`,
/// ended by its `END` line; its body is standard base64 (whitespace ignored); and what that
/// decodes to has an X.509 certificate's outer shape, a DER `SEQUENCE` whose length is the
/// whole of it and whose first element is a `SEQUENCE`. Not checked: the certificate's fields,
/// dates or signature.
pub fn validate(pem: &str) -> Result<String, String> {
    let mut blocks = 0usize;
    // The line number of the open block's BEGIN and its base64 so far.
    let mut open: Option<(usize, String)> = None;
    for (index, raw) in pem.split('\n').enumerate() {
        let number = index + 1;
        let line = raw.trim_end_matches(['\r', ' ', '\t']);
        match &mut open {
            None if line.trim_start().is_empty() || line.trim_start().starts_with('#') => {}
            None if line == BEGIN => open = Some((number, String::new())),
            None if line.starts_with("-----BEGIN ") => {
                let label = line.trim_start_matches("-----BEGIN ").trim_end_matches('-');
                return Err(format!(
                    "line {number} begins a '{}' block: only CERTIFICATE blocks belong in a CA bundle",
                    shown(label)
                ));
            }
            None => {
                return Err(format!(
                    "line {number} is neither part of a PEM certificate, a '#' comment nor blank"
                ))
            }
            Some((begin, body)) if line == END => {
                check_der(body)
                    .map_err(|why| format!("the certificate on lines {begin}-{number} {why}"))?;
                blocks += 1;
                open = None;
            }
            Some((begin, _)) if line.starts_with("-----") => {
                return Err(format!(
                    "line {number} should be '{END}', ending the certificate begun on line {begin}"
                ))
            }
            Some((_, body)) => body.extend(line.chars().filter(|c| !c.is_ascii_whitespace())),
        }
    }
    if let Some((begin, _)) = open {
        return Err(format!(
            "the certificate begun on line {begin} has no '{END}' line"
        ));
    }
    if blocks == 0 {
        return Err(format!("no '{BEGIN}' block"));
    }
    Ok(normalise(pem))
}

/// envd's normalisation: the text with exactly one trailing `\n`.
fn normalise(pem: &str) -> String {
    let mut text = pem.trim_end_matches('\n').to_string();
    text.push('\n');
    text
}

/// At most 40 characters of a label, for an error message.
fn shown(label: &str) -> String {
    label.chars().take(40).collect()
}

/// Decodes a block's base64 and checks the outer shape of an X.509 certificate.
fn check_der(base64: &str) -> Result<(), &'static str> {
    let der = STANDARD
        .decode_to_vec(base64.as_bytes())
        .map_err(|_| "is not valid base64")?;
    let not_x509 = "is not a DER-encoded X.509 certificate";
    let (outer, header) = der_length(&der).ok_or(not_x509)?;
    if header.checked_add(outer) != Some(der.len()) || der.get(header) != Some(&0x30) {
        return Err(not_x509);
    }
    Ok(())
}

/// The content length and header size of the DER `SEQUENCE` at the start of `der`.
fn der_length(der: &[u8]) -> Option<(usize, usize)> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    if tag != 0x30 {
        return None;
    }
    if first < 0x80 {
        return Some((usize::from(first), 2));
    }
    let count = usize::from(first & 0x7f);
    if count == 0 || count > 4 {
        return None;
    }
    let length = rest
        .get(..count)?
        .iter()
        .fold(0usize, |acc, &byte| (acc << 8) | usize::from(byte));
    Some((length, 2 + count))
}

/// The bundle with every copy of each of `remove` taken out and `add` (if any) appended once at
/// the end, on a line of its own; `None` when that is the bundle as it is. Nothing else in the
/// bundle changes.
pub fn edit(bundle: &[u8], remove: &[&[u8]], add: Option<&[u8]>) -> Option<Vec<u8>> {
    let mut edited = bundle.to_vec();
    for needle in remove.iter().chain(add.as_ref()) {
        edited = remove_all(&edited, needle);
    }
    if let Some(add) = add {
        if edited.last().is_some_and(|&last| last != b'\n') {
            edited.push(b'\n');
        }
        edited.extend_from_slice(add);
    }
    (edited != bundle).then_some(edited)
}

/// `haystack` without any copy of `needle` (an empty needle removes nothing).
fn remove_all(haystack: &[u8], needle: &[u8]) -> Vec<u8> {
    if needle.is_empty() {
        return haystack.to_vec();
    }
    let mut out = Vec::with_capacity(haystack.len());
    let mut rest = haystack;
    while let Some(at) = rest
        .windows(needle.len())
        .position(|window| window == needle)
    {
        out.extend_from_slice(&rest[..at]);
        rest = &rest[at + needle.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// The certificate being installed, recorded before the bundle is rewritten and removed once
/// the persisted file holds it: a crash in between leaves its name, and the next `/init` takes
/// that certificate out of the bundle too. Not a `.crt`, so `update-ca-certificates` skips it.
pub const PENDING: &str = "usr/local/share/ca-certificates/.e2b-ca.crt.pending";

/// Puts `pem` (validated and normalised) in the bundle under `root` in place of the previous
/// certificate, then persists it. Rewrites nothing that is already so.
///
/// Order: the pending record, the bundle, the persisted file, the record's removal. Killed at
/// any point, the bundle holds the previous certificate or the new one, whole, and the next
/// install or uninstall removes whichever of them it no longer wants.
pub fn install(root: &Path, pem: &str) -> Result<(), FileError> {
    remove_stale_temporaries(root)?;
    let (persisted, pending) = (root.join(PERSISTED), root.join(PENDING));
    let previous = atomic_file::read_optional(&persisted)?;
    let mut crashed = atomic_file::read_optional(&pending)?;
    let new = previous.as_deref() != Some(pem.as_bytes());
    if new && crashed.as_deref() != Some(pem.as_bytes()) {
        if let Some(crashed) = crashed.take() {
            // A crashed install's certificate: out of the bundle before the record goes.
            replace_in_bundle(root, &[&crashed], None)?;
        }
        atomic_file::write(&pending, pem.as_bytes())?;
    }
    let remove: Vec<&[u8]> = previous.iter().chain(&crashed).map(Vec::as_slice).collect();
    replace_in_bundle(root, &remove, Some(pem.as_bytes()))?;
    if new {
        atomic_file::write(&persisted, pem.as_bytes())?;
    }
    atomic_file::remove(&pending)
}

/// Removes the persisted certificate (and a crashed install's) from the bundle under `root`,
/// then the persisted file.
pub fn uninstall(root: &Path) -> Result<(), FileError> {
    remove_stale_temporaries(root)?;
    let (persisted, pending) = (root.join(PERSISTED), root.join(PENDING));
    let previous = atomic_file::read_optional(&persisted)?;
    let crashed = atomic_file::read_optional(&pending)?;
    let remove: Vec<&[u8]> = previous.iter().chain(&crashed).map(Vec::as_slice).collect();
    if remove.is_empty() {
        return Ok(());
    }
    replace_in_bundle(root, &remove, None)?;
    atomic_file::remove(&persisted)?;
    atomic_file::remove(&pending)
}

/// Rewrites the bundle under `root` without any copy of `remove` and with `add` at its end,
/// if that changes it. A missing bundle is created only to add.
/// The temporaries a killed install left (it may have been killed before any rewrite this one
/// makes, which would have replaced them).
fn remove_stale_temporaries(root: &Path) -> Result<(), FileError> {
    for file in [BUNDLE, PERSISTED, PENDING] {
        atomic_file::remove_stale(&root.join(file))?;
    }
    Ok(())
}

fn replace_in_bundle(root: &Path, remove: &[&[u8]], add: Option<&[u8]>) -> Result<(), FileError> {
    let path = root.join(BUNDLE);
    let bundle = atomic_file::read_optional(&path)?;
    if bundle.is_none() && add.is_none() {
        return Ok(());
    }
    match edit(bundle.as_deref().unwrap_or_default(), remove, add) {
        Some(edited) => atomic_file::write(&path, &edited),
        None => Ok(()),
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// Two real certificates (self-signed, EC P-256), as `openssl req -x509` printed them.
    pub const CERT_A: &str = "-----BEGIN CERTIFICATE-----
MIIBIjCByQIUE0PgPAvNJ4FkDRtzTCVfdv2fkb8wCgYIKoZIzj0EAwIwFDESMBAG
A1UEAwwJVGVzdCBDQSBBMB4XDTI2MTEyNTEwMzAzNloXDTM2MTEyMjEwMzAzNlow
FDESMBAGA1UEAwwJVGVzdCBDQSBBMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE
vec+3L2+XUfjkZ+hvrpibtjiVlJkyd575QPQRjGLSte6bb25ux7/JdCDGbW9NNhe
K+8ZAmwR6WYBTwCLfpzK/TAKBggqhkjOPQQDAgNIADBFAiA4eQFyus7H0COMGvrJ
mNW0cBg8qrP7Rkck263jqkHtYAIhAKNzN9/u6a1pNDjBq0SVThXo5BJYkNjpGEMe
7KLFCJ0G
-----END CERTIFICATE-----
";
    pub const CERT_B: &str = "-----BEGIN CERTIFICATE-----
MIIBIjCByQIUCpIiut8UrZjU5W6TQF++vg8y444wCgYIKoZIzj0EAwIwFDESMBAG
A1UEAwwJVGVzdCBDQSBCMB4XDTI2MTEyNTEwMzAzNloXDTM2MTEyMjEwMzAzNlow
FDESMBAGA1UEAwwJVGVzdCBDQSBCMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE
T7dNuSxGhiHlnb59SdSLZ0s51lB0yRGJ1ZRIlo7Pg65WgU2ogoRXmR/KxqEgKjfG
XvlK4JtPossHlQTRlq8PIjAKBggqhkjOPQQDAgNIADBFAiBuwlsc9z+vjUdgxXOL
a4UTGIsge9RLX+qmfwj+xV8x+QIhAMC0v6whsrfN5mWUkdPMCT9BKKlNdfeussoy
Z7muvnQk
-----END CERTIFICATE-----
";

    #[test]
    fn certificates_pass_with_comments_blank_lines_and_crlf() {
        assert_eq!(validate(CERT_A).as_deref(), Ok(CERT_A));
        let two = format!("# proxy CA\n\n{CERT_A}\n{}\n\n\n", CERT_B.trim_end());
        assert_eq!(
            validate(&two),
            Ok(format!("# proxy CA\n\n{CERT_A}\n{CERT_B}"))
        );
        let crlf = CERT_A.replace('\n', "\r\n");
        assert_eq!(validate(&crlf), Ok(crlf.clone()));
        // No trailing newline: one is added.
        assert_eq!(validate(CERT_A.trim_end()).as_deref(), Ok(CERT_A));
    }

    #[test]
    fn garbage_is_refused_with_the_line_that_is_wrong() {
        let cases: [(String, &str); 8] = [
            ("".into(), "no '-----BEGIN CERTIFICATE-----' block"),
            ("hello\n".into(), "line 1 is neither part of a PEM certificate, a '#' comment nor blank"),
            (
                format!("{CERT_A}trailing junk\n"),
                "line 10 is neither part of a PEM certificate, a '#' comment nor blank",
            ),
            (
                "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n".into(),
                "line 1 begins a 'PRIVATE KEY' block: only CERTIFICATE blocks belong in a CA bundle",
            ),
            (
                CERT_A.trim_end().trim_end_matches(END).into(),
                "the certificate begun on line 1 has no '-----END CERTIFICATE-----' line",
            ),
            (
                format!("{BEGIN}\nAAAA\n-----END PRIVATE KEY-----\n"),
                "line 3 should be '-----END CERTIFICATE-----', ending the certificate begun on line 1",
            ),
            (
                format!("{BEGIN}\nnot base64!\n{END}\n"),
                "the certificate on lines 1-3 is not valid base64",
            ),
            (
                // envd's test fixture made valid base64: not a certificate.
                format!("{BEGIN}\nMIIBcTCCARegAwIBAgIUTestCertAA==\n{END}\n"),
                "the certificate on lines 1-3 is not a DER-encoded X.509 certificate",
            ),
        ];
        for (pem, reason) in cases {
            assert_eq!(validate(&pem), Err(reason.to_string()), "{pem:?}");
        }
    }

    #[test]
    fn der_shapes() {
        assert_eq!(check_der("MAMwAQA="), Ok(()), "30 03 30 01 00");
        assert!(check_der("MAIwAAA=").is_err(), "length short of the data");
        assert!(check_der("MQMwAQA=").is_err(), "a SET, not a SEQUENCE");
        assert!(
            check_der("MAMCAQA=").is_err(),
            "first element not a SEQUENCE"
        );
        assert!(check_der("MIA=").is_err(), "indefinite length");
        assert!(check_der("").is_err());
        assert_eq!(der_length(&[0x30, 0x82, 0x01, 0x00]), Some((256, 4)));
    }

    const SYSTEM: &[u8] =
        b"# System CA bundle\n-----BEGIN CERTIFICATE-----\nSYSTEM\n-----END CERTIFICATE-----\n";

    #[test]
    fn edit_appends_replaces_and_removes_exact_copies() {
        let a = CERT_A.as_bytes();
        let b = CERT_B.as_bytes();
        let with_a = [SYSTEM, a].concat();
        assert_eq!(edit(SYSTEM, &[], Some(a)), Some(with_a.clone()));
        // The same certificate again: nothing to write.
        assert_eq!(edit(&with_a, &[a], Some(a)), None);
        // A copy appended twice (envd after a restart) collapses to one at the end.
        assert_eq!(
            edit(&[SYSTEM, a, a].concat(), &[], Some(a)),
            Some(with_a.clone())
        );
        // Replaced: the old one gone wherever it was, the new one at the end.
        assert_eq!(
            edit(&[a, SYSTEM].concat(), &[a], Some(b)),
            Some([SYSTEM, b].concat())
        );
        // Removed.
        assert_eq!(edit(&with_a, &[a], None), Some(SYSTEM.to_vec()));
        assert_eq!(edit(SYSTEM, &[a], None), None);
        // A bundle without a final newline gets one before the certificate; CRLF is kept.
        let crlf = b"-----BEGIN CERTIFICATE-----\r\nSYS\r\n-----END CERTIFICATE-----";
        assert_eq!(
            edit(crlf, &[], Some(a)),
            Some([&crlf[..], b"\n", a].concat())
        );
        assert_eq!(edit(b"", &[], Some(a)), Some(a.to_vec()));
        assert_eq!(remove_all(b"abc", b""), b"abc");
    }

    #[test]
    fn install_replace_and_uninstall_on_disk() {
        let root = tempfile::tempdir().unwrap();
        let bundle = root.path().join(BUNDLE);
        let persisted = root.path().join(PERSISTED);
        atomic_file::write(&bundle, SYSTEM).unwrap();
        install(root.path(), CERT_A).unwrap();
        assert_eq!(
            std::fs::read(&bundle).unwrap(),
            [SYSTEM, CERT_A.as_bytes()].concat()
        );
        assert_eq!(std::fs::read_to_string(&persisted).unwrap(), CERT_A);
        install(root.path(), CERT_A).unwrap();
        install(root.path(), CERT_B).unwrap();
        assert_eq!(
            std::fs::read(&bundle).unwrap(),
            [SYSTEM, CERT_B.as_bytes()].concat()
        );
        assert_eq!(std::fs::read_to_string(&persisted).unwrap(), CERT_B);
        uninstall(root.path()).unwrap();
        assert_eq!(std::fs::read(&bundle).unwrap(), SYSTEM);
        assert!(!persisted.exists());
        uninstall(root.path()).unwrap();
        assert_eq!(std::fs::read(&bundle).unwrap(), SYSTEM);
    }

    #[test]
    fn a_missing_bundle_is_created_and_a_crash_between_the_files_heals() {
        let root = tempfile::tempdir().unwrap();
        let bundle = root.path().join(BUNDLE);
        install(root.path(), CERT_A).unwrap();
        assert_eq!(std::fs::read_to_string(&bundle).unwrap(), CERT_A);
        // The bundle got B, the daemon died before persisting it: the record still says A.
        atomic_file::write(&bundle, CERT_B.as_bytes()).unwrap();
        install(root.path(), CERT_B).unwrap();
        assert_eq!(std::fs::read_to_string(&bundle).unwrap(), CERT_B);
        assert_eq!(
            std::fs::read_to_string(root.path().join(PERSISTED)).unwrap(),
            CERT_B
        );
    }
}
