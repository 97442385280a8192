//! `PUT /files?path=...` (SPEC §8): the body is the file's bytes whatever its `Content-Type`,
//! as `curl -T` and WebDAV clients send it; access, signed write URLs, gzip, metadata and the
//! atomic placement are `POST`'s.

use std::fs;
use std::io::Write;
use std::process::Command;

use crate::common;
use crate::common::{enc, files_under, temporaries, Daemon, TOKEN};
use flate2::write::GzEncoder;
use flate2::Compression;
use serde_json::json;

fn start() -> Daemon {
    common::builder().arg("--default-user").arg("user").start()
}

fn record(daemon: &Daemon, name: &str) -> serde_json::Value {
    crate::upload::record(&daemon.home().join(name))
}

#[test]
fn put_writes_the_body_as_the_file_whatever_its_type() {
    let daemon = start();
    let home = daemon.home();
    let put = |path: &str, headers: &[(&str, &str)], body: &[u8]| {
        let mut all = vec![("X-Access-Token", TOKEN)];
        all.extend_from_slice(headers);
        daemon.call_with("PUT", &format!("/files?path={}", enc(path)), &all, body)
    };
    for (name, headers) in [
        ("none.bin", &[][..]),
        (
            "octet.bin",
            &[("Content-Type", "application/octet-stream")][..],
        ),
        (
            "text.txt",
            &[("Content-Type", "text/plain; charset=utf-8")][..],
        ),
        // A multipart type is the file's type too: the bytes are written as they are.
        (
            "form.bin",
            &[("Content-Type", "multipart/form-data; boundary=x")][..],
        ),
    ] {
        let body = format!("--x\r\nbytes of {name}\r\n--x--\r\n");
        let reply = put(name, headers, body.as_bytes());
        assert_eq!(reply.status, 200, "{name}: {}", reply.text());
        assert_eq!(reply.json(), json!([record(&daemon, name)]), "{name}");
        assert_eq!(
            fs::read(home.join(name)).unwrap(),
            body.as_bytes(),
            "{name}"
        );
    }
    // Over an existing file: replaced whole.
    let reply = put("text.txt", &[], b"short");
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(fs::read(home.join("text.txt")).unwrap(), b"short");

    // gzip and metadata as POST takes them.
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(b"inflated on arrival").unwrap();
    let gz = encoder.finish().unwrap();
    let reply = put(
        "gz.txt",
        &[("Content-Encoding", "gzip"), ("X-Metadata-Owner", "put")],
        &gz,
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()[0]["metadata"], json!({"owner": "put"}));
    assert_eq!(
        fs::read(home.join("gz.txt")).unwrap(),
        b"inflated on arrival"
    );
    assert_eq!(
        xattr::get(home.join("gz.txt"), "user.e2b.owner").unwrap(),
        Some(b"put".to_vec())
    );
    assert!(temporaries(&home).is_empty());
}

#[test]
fn put_errors_are_posts_and_write_nothing() {
    let daemon = start();
    let home = daemon.home();
    fs::create_dir_all(home.join("dir")).unwrap();
    let before = files_under(&home);
    daemon
        .call_with("PUT", "/files?path=x.bin", &[], b"x")
        .assert_error(401, "missing signature query parameter");
    daemon
        .call_with("PUT", "/files", &[("X-Access-Token", TOKEN)], b"x")
        .assert_error(400, "the path query parameter is required for a PUT");
    daemon
        .call_with("PUT", "/files?path=dir", &[("X-Access-Token", TOKEN)], b"x")
        .assert_error(
            400,
            &format!("path '{}' is a directory", home.join("dir").display()),
        );
    daemon
        .call_with(
            "PUT",
            "/files?path=x.bin",
            &[("X-Access-Token", TOKEN), ("Content-Encoding", "br")],
            b"x",
        )
        .assert_error(
            415,
            "unsupported Content-Encoding 'br': the supported codings are identity and gzip",
        );
    assert_eq!(files_under(&home), before);
}

#[test]
fn a_signed_write_url_takes_a_put_and_a_read_signature_does_not() {
    let daemon = start();
    let home = daemon.home();
    let target = daemon.sign(
        "signed/put.bin",
        &["--username", "user", "--operation", "write"],
    );
    let reply = daemon.call_with("PUT", &target, &[], b"signed bytes");
    assert_eq!(reply.json(), json!([record(&daemon, "signed/put.bin")]));
    assert_eq!(
        fs::read(home.join("signed/put.bin")).unwrap(),
        b"signed bytes"
    );
    let read = daemon.sign("signed/read.bin", &["--username", "user"]);
    daemon
        .call_with("PUT", &read, &[], b"x")
        .assert_error(401, "invalid signature");
    assert!(!home.join("signed/read.bin").exists());
}

#[test]
fn curl_upload_file_sends_a_put_that_writes_the_file() {
    if Command::new("curl").arg("--version").output().is_err() {
        eprintln!("skipped: curl is not installed");
        return;
    }
    let daemon = start();
    let src = daemon.dir.path().join("src.bin");
    // Over 1 MiB, so curl sends `Expect: 100-continue` too.
    let data: Vec<u8> = (0..3 * 1024 * 1024 + 7)
        .map(|i: u32| (i % 251) as u8)
        .collect();
    common::write_file(&src, &data);
    let output = Command::new("curl")
        .args(["-sS", "--fail-with-body", "-H"])
        .arg(format!("X-Access-Token: {TOKEN}"))
        .arg("-T")
        .arg(&src)
        .arg(format!("http://{}/files?path=curl/t.bin", daemon.addr))
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let reply: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(reply, json!([record(&daemon, "curl/t.bin")]));
    assert_eq!(fs::read(daemon.home().join("curl/t.bin")).unwrap(), data);
}
