//! Upload metadata (SPEC §8, envd ≥ 0.6.2) against the real binary: `X-Metadata-*` headers
//! become `user.e2b.*` attributes present from the instant the file appears, answered in each
//! entry; every file of a multipart request gets them; a plain re-upload clears them; invalid
//! metadata is 400 before any byte of the body is read; a filesystem without extended
//! attributes is 400.
//!
//! The attributes are read back with the `xattr` crate, not with sandboxd's own wrappers.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::common;
use crate::common::{enc, files_under, root_or_skip, temporaries, Daemon, Mount, Reply, TOKEN};
use serde_json::json;

fn start() -> Daemon {
    let daemon = common::builder().arg("--default-user").arg("user").start();
    require_user_xattrs(&daemon.home());
    daemon
}

/// These tests need a filesystem with `user.*` attributes under the temp dir; say so loudly
/// rather than pass without checking anything.
fn require_user_xattrs(dir: &Path) {
    let probe = dir.join(".xattr-probe");
    fs::write(&probe, b"").unwrap();
    let result = xattr::set(&probe, "user.probe", b"1");
    fs::remove_file(&probe).unwrap();
    if let Err(err) = result {
        panic!(
            "the test directory {} has no user extended attributes ({err}): run the tests with \
             TMPDIR on a filesystem that has them (ext4, xfs, btrfs, tmpfs on Linux >= 6.6)",
            dir.display()
        );
    }
}

/// The `user.e2b.*` attributes of `path`, prefix removed.
fn e2b_attributes(path: &Path) -> BTreeMap<String, String> {
    xattr::list(path)
        .unwrap()
        .filter_map(|name| {
            let name = name.to_str()?.to_owned();
            let key = name.strip_prefix("user.e2b.")?.to_owned();
            let value = xattr::get(path, &name).unwrap().unwrap();
            Some((key, String::from_utf8(value).unwrap()))
        })
        .collect()
}

fn attributes(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn upload(daemon: &Daemon, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    let mut all = vec![
        ("X-Access-Token", TOKEN),
        ("Content-Type", "application/octet-stream"),
    ];
    all.extend_from_slice(headers);
    daemon.call_with("POST", &format!("/files?path={}", enc(path)), &all, body)
}

fn entry(path: &Path, metadata: Option<serde_json::Value>) -> serde_json::Value {
    let mut entry = json!({
        "path": path.to_string_lossy(),
        "name": path.file_name().unwrap().to_string_lossy(),
        "type": "file",
    });
    if let Some(metadata) = metadata {
        entry["metadata"] = metadata;
    }
    entry
}

#[test]
fn metadata_headers_become_attributes_and_are_answered() {
    let daemon = start();
    let home = daemon.home();
    let reply = upload(
        &daemon,
        "notes.txt",
        &[
            ("X-Metadata-Owner", "sdk-test"),
            ("x-metadata-PURPOSE", "a check, with spaces: ~!@#"),
            ("X-Metadata-owner", "a second value is ignored"),
            ("X-Metadata-Empty", ""),
            ("X-Metadata-", "a nameless header is ignored"),
        ],
        b"with metadata",
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    // Keys sorted, as envd's Go map marshals.
    assert_eq!(
        reply.text(),
        json!([entry(
            &home.join("notes.txt"),
            Some(
                json!({"empty": "", "owner": "sdk-test", "purpose": "a check, with spaces: ~!@#"})
            )
        )])
        .to_string()
    );
    assert_eq!(
        e2b_attributes(&home.join("notes.txt")),
        attributes(&[
            ("empty", ""),
            ("owner", "sdk-test"),
            ("purpose", "a check, with spaces: ~!@#")
        ])
    );
    assert_eq!(fs::read(home.join("notes.txt")).unwrap(), b"with metadata");
    // With gzip too (the SDKs' gzip=True with metadata=).
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(b"compressed").unwrap();
    let reply = upload(
        &daemon,
        "packed.txt",
        &[("Content-Encoding", "gzip"), ("X-Metadata-Kind", "gz")],
        &encoder.finish().unwrap(),
    );
    assert_eq!(
        reply.json(),
        json!([entry(&home.join("packed.txt"), Some(json!({"kind": "gz"})))])
    );
    assert_eq!(
        e2b_attributes(&home.join("packed.txt")),
        attributes(&[("kind", "gz")])
    );
}

#[test]
fn the_file_appears_with_its_metadata_never_without() {
    let daemon = start();
    let home = daemon.home();
    let path = home.join("watched.bin");
    fs::write(&path, b"old").unwrap();
    let old_inode = fs::metadata(&path).unwrap().ino();
    // A watcher looks at the path as fast as it can while the new file is sent slowly: every
    // time it sees the new inode, the attributes are already there.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (stop, path) = (Arc::clone(&stop), path.clone());
        std::thread::spawn(move || {
            let mut seen_new = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let Ok(meta) = fs::metadata(&path) else {
                    continue;
                };
                if meta.ino() != old_inode {
                    let value = xattr::get(&path, "user.e2b.stamp").ok().flatten();
                    if fs::metadata(&path).map(|m| m.ino()).ok() == Some(meta.ino()) {
                        assert_eq!(value.as_deref(), Some(&b"set"[..]), "a new file without it");
                        seen_new += 1;
                    }
                }
            }
            seen_new
        })
    };
    let mut stream = daemon.connect();
    write!(
        stream,
        "POST /files?path=watched.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\
         X-Access-Token: {TOKEN}\r\nX-Metadata-Stamp: set\r\nContent-Length: 40000\r\n\r\n"
    )
    .unwrap();
    for _ in 0..20 {
        stream.write_all(&[7u8; 2000]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let reply = common::read_reply(&mut BufReader::new(stream), false).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    std::thread::sleep(std::time::Duration::from_millis(50));
    stop.store(true, Ordering::Relaxed);
    let seen_new = watcher
        .join()
        .expect("the watcher saw a file without its metadata");
    assert!(seen_new > 0, "the watcher never saw the new file");
}

#[test]
fn every_file_of_a_multipart_request_gets_the_metadata() {
    let daemon = start();
    let home = daemon.home();
    let boundary = "meta-7Qz9";
    let mut body = Vec::new();
    for (name, data) in [("a.txt", "a"), ("sub/b.txt", "b")] {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; \
                 filename=\"{name}\"\r\n\r\n{data}\r\n"
            )
            .as_bytes(),
        );
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    let content_type = format!("multipart/form-data; boundary={boundary}");
    let reply = daemon.call_with(
        "POST",
        "/files",
        &[
            ("X-Access-Token", TOKEN),
            ("Content-Type", &content_type),
            ("X-Metadata-Batch", "42"),
        ],
        &body,
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    let metadata = Some(json!({"batch": "42"}));
    assert_eq!(
        reply.json(),
        json!([
            entry(&home.join("a.txt"), metadata.clone()),
            entry(&home.join("sub/b.txt"), metadata)
        ])
    );
    for name in ["a.txt", "sub/b.txt"] {
        assert_eq!(
            e2b_attributes(&home.join(name)),
            attributes(&[("batch", "42")]),
            "{name}"
        );
    }
}

#[test]
fn an_upload_leaves_exactly_its_own_metadata() {
    let daemon = start();
    let home = daemon.home();
    let path = home.join("doc.txt");
    let first = upload(
        &daemon,
        "doc.txt",
        &[("X-Metadata-A", "1"), ("X-Metadata-B", "2")],
        b"one",
    );
    assert_eq!(first.status, 200, "{}", first.text());
    // Also an attribute set inside the sandbox by hand.
    xattr::set(&path, "user.e2b.by-hand", b"x").unwrap();
    // Another set: the keys not sent are gone.
    let second = upload(&daemon, "doc.txt", &[("X-Metadata-B", "3")], b"two");
    assert_eq!(
        second.json(),
        json!([entry(&path, Some(json!({"b": "3"})))])
    );
    assert_eq!(e2b_attributes(&path), attributes(&[("b", "3")]));
    // None sent: none left, and no "metadata" in the answer.
    let third = upload(&daemon, "doc.txt", &[], b"three");
    assert_eq!(third.json(), json!([entry(&path, None)]));
    assert_eq!(e2b_attributes(&path), BTreeMap::new());
    assert_eq!(fs::read(&path).unwrap(), b"three");
}

#[test]
fn invalid_metadata_is_400_before_any_byte_is_read_or_written() {
    let daemon = start();
    let home = daemon.home();
    common::write_file(&home.join("keep.txt"), b"previous");
    let before = files_under(daemon.dir.path());
    let long_key = "k".repeat(247);
    let long_header = format!("X-Metadata-{long_key}");
    let big = "v".repeat(4000);
    let rest = "v".repeat(78);
    let cases: Vec<(Vec<(&str, &str)>, String)> = vec![
        (
            vec![(&long_header, "v")],
            format!("key '{long_key}' is 247 bytes long, more than 246"),
        ),
        (
            vec![("X-Metadata-Note", "tab\there")],
            "the value of key 'note' has byte 0x09 at offset 3, not printable ASCII".into(),
        ),
        (
            vec![("X-Metadata-A", &big), ("X-Metadata-B", &rest)],
            "the metadata takes 4098 bytes (each key counted with its 'user.e2b.' prefix), \
             more than 4096"
                .into(),
        ),
    ];
    for (headers, reason) in &cases {
        // `Expect: 100-continue` and a body never sent: the answer comes from the head alone.
        let mut stream = daemon.connect();
        let mut head = format!(
            "POST /files?path=new/dir/keep.txt HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\n\
             Content-Length: 1000000\r\nExpect: 100-continue\r\n"
        );
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).unwrap();
        let reply = common::read_reply(&mut BufReader::new(stream), false).unwrap();
        reply.assert_error(400, &format!("invalid metadata: {reason}"));
    }
    // Nothing written, not even the parent directories.
    assert_eq!(files_under(daemon.dir.path()), before);
    assert!(!home.join("new").exists());
    assert!(temporaries(&home).is_empty());
    // A non-ASCII value, as raw bytes in the header.
    let mut request = format!(
        "POST /files?path=keep.txt HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\
         X-Access-Token: {TOKEN}\r\nContent-Length: 1\r\nX-Metadata-Caf: caf"
    )
    .into_bytes();
    request.extend_from_slice(b"\xc3\xa9\r\n\r\nx");
    daemon.raw(&request).assert_error(
        400,
        "invalid metadata: the value of key 'caf' has byte 0xc3 at offset 3, not printable ASCII",
    );
    assert_eq!(files_under(daemon.dir.path()), before);
    // The order of checks: the user (401) before the metadata, the metadata before the path.
    let reply = daemon.call_with(
        "POST",
        "/files?path=x&username=nobody",
        &[("X-Access-Token", TOKEN), ("X-Metadata-Note", "tab\tx")],
        b"x",
    );
    reply.assert_error(401, "error looking up user 'nobody': unknown user");
    let reply = daemon.call_with(
        "POST",
        "/files?path=%7Eother/x",
        &[("X-Access-Token", TOKEN), ("X-Metadata-Note", "tab\tx")],
        b"x",
    );
    assert!(reply.json()["message"]
        .as_str()
        .unwrap()
        .starts_with("invalid metadata: "));
}

#[test]
fn metadata_on_a_filesystem_without_extended_attributes_is_400() {
    if !root_or_skip("mounting a ramfs needs root") {
        return;
    }
    let daemon = start();
    let dir = daemon.dir.path().join("ramfs");
    // A filesystem without extended attributes (tmpfs has `user.*` since 6.6).
    let _mount = Mount::ramfs(&dir);
    let target = dir.join("f.txt");
    let target_text = target.to_string_lossy().into_owned();
    let reply = upload(&daemon, &target_text, &[("X-Metadata-A", "1")], b"data");
    reply.assert_error(
        400,
        &format!(
            "invalid metadata: the filesystem of '{}' does not support extended attributes",
            target.display()
        ),
    );
    assert!(!target.exists());
    assert!(temporaries(&dir).is_empty());
    // Without metadata the same upload works.
    let reply = upload(&daemon, &target_text, &[], b"data");
    assert_eq!(reply.json(), json!([entry(&target, None)]));
    assert_eq!(fs::read(&target).unwrap(), b"data");
}
