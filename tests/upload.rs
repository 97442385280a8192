//! `POST /files` (SPEC §8) against the real binary: raw, chunked and multipart bodies byte for
//! byte, curl, `100 Continue`, parallel parts composed, signed URLs, ownership, every error,
//! a full disk, a client that vanishes mid-body, and memory that does not grow with the body.

use std::fs;
use std::io::{BufReader, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::{
    enc, files_under, is_root, low_byte, root_or_skip, temporaries, Daemon, Mount, Reply, TOKEN,
};
use serde_json::json;

const MIB: usize = 1024 * 1024;

/// A daemon whose default user is `user`, so relative paths land in `daemon.home()`.
fn start() -> Daemon {
    common::builder().arg("--default-user").arg("user").start()
}

/// Bytes with every value, CRLFs and dashes, so that a byte lost or added shows.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| match i % 97 {
            13 => b'\r',
            14 => b'\n',
            15 | 16 => b'-',
            _ => low_byte(i).wrapping_mul(31).wrapping_add(seed) ^ low_byte(i >> 11),
        })
        .collect()
}

fn upload(daemon: &Daemon, path: &str, body: &[u8]) -> Reply {
    daemon.call_with(
        "POST",
        &format!("/files?path={}", enc(path)),
        &[
            ("X-Access-Token", TOKEN),
            ("Content-Type", "application/octet-stream"),
        ],
        body,
    )
}

/// A multipart body: `(name, filename, data)` per part.
fn multipart(boundary: &str, parts: &[(&str, Option<&str>, &[u8])]) -> Vec<u8> {
    let mut body = b"ignored preamble\r\n".to_vec();
    for (name, filename, data) in parts {
        body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        let mut disposition = format!("Content-Disposition: form-data; name=\"{name}\"");
        if let Some(filename) = filename {
            disposition.push_str(&format!("; filename=\"{filename}\""));
        }
        body.extend_from_slice(disposition.as_bytes());
        body.extend_from_slice(b"\r\nContent-Type: application/octet-stream\r\n\r\n");
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\nepilogue").as_bytes());
    body
}

fn post_multipart(daemon: &Daemon, query: &str, boundary: &str, body: &[u8]) -> Reply {
    let content_type = format!("multipart/form-data; boundary=\"{boundary}\"");
    daemon.call_with(
        "POST",
        &format!("/files{query}"),
        &[("X-Access-Token", TOKEN), ("Content-Type", &content_type)],
        body,
    )
}

fn records(reply: &Reply) -> serde_json::Value {
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()
}

pub fn record(path: &Path) -> serde_json::Value {
    json!({
        "path": path.to_string_lossy(),
        "name": path.file_name().unwrap().to_string_lossy(),
        "type": "file",
    })
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn raw_upload_is_byte_exact_and_replaces_a_file_atomically() {
    let daemon = start();
    let home = daemon.home();
    let data = pattern(1, 3 * MIB + 17);
    let reply = upload(&daemon, "new/dir/raw.bin", &data);
    let path = home.join("new/dir/raw.bin");
    assert_eq!(records(&reply), json!([record(&path)]));
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_eq!(fs::read(&path).unwrap(), data);
    assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o644);
    assert_eq!(
        fs::metadata(home.join("new")).unwrap().mode() & 0o7777,
        0o755
    );
    // Replacing: a new inode, the new bytes, no temporary left; an empty body is an empty file.
    let old_ino = fs::metadata(&path).unwrap().ino();
    assert_eq!(upload(&daemon, "new/dir/raw.bin", b"second").status, 200);
    assert_eq!(fs::read(&path).unwrap(), b"second");
    assert_ne!(fs::metadata(&path).unwrap().ino(), old_ino);
    for directory in ["/", "~", "new"] {
        assert_eq!(upload(&daemon, directory, b"x").status, 400, "{directory}");
    }
    assert_eq!(upload(&daemon, "empty", b"").status, 200);
    assert_eq!(fs::read(home.join("empty")).unwrap(), b"");
    assert!(temporaries(&home.join("new/dir")).is_empty());
    // An absolute path, and no Content-Type at all (curl -T sends none).
    let abs = daemon.dir.path().join("abs.bin");
    let reply = daemon.call_with(
        "POST",
        &format!("/files?path={}", enc(&abs.to_string_lossy())),
        &[("X-Access-Token", TOKEN)],
        b"no type",
    );
    assert_eq!(records(&reply), json!([record(&abs)]));
    assert_eq!(fs::read(&abs).unwrap(), b"no type");
}

/// Sends `data` with chunked framing in chunks of the given sizes, cycling.
fn chunked_request(target: &str, headers: &str, data: &[u8], sizes: &[usize]) -> Vec<u8> {
    let mut request = format!(
        "POST {target} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nX-Access-Token: {TOKEN}\r\n\
         Transfer-Encoding: chunked\r\n{headers}\r\n"
    )
    .into_bytes();
    let mut at = 0;
    for size in sizes.iter().cycle() {
        if at == data.len() {
            break;
        }
        let n = (*size).min(data.len() - at);
        request.extend_from_slice(format!("{n:x}\r\n").as_bytes());
        request.extend_from_slice(&data[at..at + n]);
        request.extend_from_slice(b"\r\n");
        at += n;
    }
    request.extend_from_slice(b"0\r\n\r\n");
    request
}

#[test]
fn chunked_raw_and_multipart_bodies_are_byte_exact() {
    let daemon = start();
    let home = daemon.home();
    let data = pattern(2, 2 * MIB + 5);
    let request = chunked_request(
        "/files?path=chunked.bin",
        "Content-Type: application/octet-stream\r\n",
        &data,
        &[1, 7, 65536, 300_000, 13],
    );
    let reply = daemon.raw(&request);
    assert_eq!(records(&reply), json!([record(&home.join("chunked.bin"))]));
    assert_eq!(fs::read(home.join("chunked.bin")).unwrap(), data);

    let a = pattern(3, MIB + 1);
    let body = multipart("bnd-7Qz9-boundary", &[("file", Some("c/a.bin"), &a)]);
    let request = chunked_request(
        "/files",
        "Content-Type: multipart/form-data; boundary=bnd-7Qz9-boundary\r\n",
        &body,
        &[3, 4096, 70, 1],
    );
    let reply = daemon.raw(&request);
    assert_eq!(records(&reply), json!([record(&home.join("c/a.bin"))]));
    assert_eq!(fs::read(home.join("c/a.bin")).unwrap(), a);
}

#[test]
fn multipart_with_several_parts_writes_each_file() {
    let daemon = start();
    let home = daemon.home();
    let outside = daemon.dir.path().join("outside/z.bin");
    let outside_text = outside.to_string_lossy().into_owned();
    let a = pattern(4, 700_000);
    let b = b"--boundary-like\r\n--xYz\r\n".to_vec();
    let c = pattern(5, 3 * MIB);
    let boundary = "----xYz0123";
    let body = multipart(
        boundary,
        &[
            ("file", Some("one.bin"), &a),
            ("note", None, b"not a file"),
            ("file", Some("deep/er/two.txt"), &b),
            ("other", Some("ignored.bin"), b"ignored"),
            ("file", Some(&outside_text), &c),
            ("file", Some("empty"), b""),
        ],
    );
    let reply = post_multipart(&daemon, "", boundary, &body);
    assert_eq!(
        records(&reply),
        json!([
            record(&home.join("one.bin")),
            record(&home.join("deep/er/two.txt")),
            record(&outside),
            record(&home.join("empty")),
        ])
    );
    assert_eq!(fs::read(home.join("one.bin")).unwrap(), a);
    assert_eq!(fs::read(home.join("deep/er/two.txt")).unwrap(), b);
    assert_eq!(fs::read(&outside).unwrap(), c);
    assert_eq!(fs::read(home.join("empty")).unwrap(), b"");
    assert!(!home.join("ignored.bin").exists());
    assert!(temporaries(&home).is_empty());
    // With `path`, the one part lands there whatever its filename says.
    let body = multipart("q", &[("file", Some("elsewhere.bin"), b"by path")]);
    let reply = post_multipart(&daemon, "?path=named.bin", "q", &body);
    assert_eq!(records(&reply), json!([record(&home.join("named.bin"))]));
    assert_eq!(fs::read(home.join("named.bin")).unwrap(), b"by path");
    assert!(!home.join("elsewhere.bin").exists());
}

#[test]
fn a_failing_part_leaves_no_file_of_the_request() {
    let daemon = start();
    let home = daemon.home();
    fs::create_dir(home.join("a-directory")).unwrap();
    common::write_file(&home.join("kept.bin"), b"previous");
    let before = files_under(&home);
    let cases: Vec<(Vec<u8>, String)> = vec![
        (
            multipart(
                "b",
                &[
                    ("file", Some("kept.bin"), b"1"),
                    ("file", Some("p2"), b"2"),
                    ("file", Some("a-directory"), b"3"),
                ],
            ),
            format!(
                "path '{}' is a directory",
                home.join("a-directory").display()
            ),
        ),
        (
            multipart(
                "b",
                &[
                    ("file", Some("kept.bin"), b"1"),
                    ("file", Some("./sub/../kept.bin"), b"2"),
                ],
            ),
            format!(
                "path '{}' is given to more than one part of the request",
                home.join("kept.bin").display()
            ),
        ),
        (
            multipart(
                "b",
                &[("file", Some("kept.bin"), b"1"), ("file", None, b"2")],
            ),
            "a multipart part named 'file' has no filename and there is no path query parameter"
                .into(),
        ),
        (
            multipart("b", &[("note", None, b"1")]),
            "the multipart body has no part named 'file'".into(),
        ),
        (
            b"--b\r\nContent-Disposition: form-data; name=file; filename=x\r\n\r\nno end".to_vec(),
            "malformed multipart body: the body ends before the closing boundary".into(),
        ),
        (
            b"--b\r\nContent-Disposition: form-data; name=file; filename=x\r\n\r\n1\r\n--bad"
                .to_vec(),
            "malformed multipart body: a boundary is followed by neither CRLF nor '--'".into(),
        ),
    ];
    for (body, message) in &cases {
        post_multipart(&daemon, "", "b", body).assert_error(400, message);
        assert_eq!(files_under(&home), before, "{message}");
        assert!(temporaries(&home).is_empty());
    }
}

#[test]
fn request_errors_in_order() {
    let daemon = start();
    let home = daemon.home();
    fs::create_dir(home.join("dir")).unwrap();
    common::write_file(&home.join("file"), b"f");
    let post = |target: &str, headers: &[(&str, &str)]| {
        let mut all = vec![("X-Access-Token", TOKEN)];
        all.extend_from_slice(headers);
        daemon.call_with("POST", target, &all, b"body")
    };
    let octet = ("Content-Type", "application/octet-stream");
    post("/files", &[octet]).assert_error(
        400,
        "the path query parameter is required for an application/octet-stream body",
    );
    post("/files?path=", &[octet]).assert_error(
        400,
        "the path query parameter is required for an application/octet-stream body",
    );
    post("/files?path=dir", &[octet]).assert_error(
        400,
        &format!("path '{}' is a directory", home.join("dir").display()),
    );
    post("/files?path=file/x", &[octet]).assert_error(
        400,
        &format!("path is a file: {}", home.join("file").display()),
    );
    post("/files?path=%7Eother/x", &[octet]).assert_error(
        400,
        "cannot resolve path '~other/x': '~user' paths are not supported",
    );
    let deflate = post("/files?path=g", &[octet, ("Content-Encoding", "deflate")]);
    deflate.assert_error(
        415,
        "unsupported Content-Encoding 'deflate': the supported codings are identity and gzip",
    );
    assert_eq!(
        post("/files?path=i", &[octet, ("Content-Encoding", "identity")]).status,
        200
    );
    for content_type in ["text/plain", "application/x-www-form-urlencoded"] {
        post("/files?path=t", &[("Content-Type", content_type)]).assert_error(
            400,
            &format!(
                "unsupported Content-Type '{content_type}': send application/octet-stream or \
                 multipart/form-data"
            ),
        );
    }
    post("/files", &[("Content-Type", "multipart/form-data")]).assert_error(
        400,
        "invalid multipart/form-data Content-Type: the Content-Type has no boundary parameter",
    );
    post("/files?path=u&username=nobody", &[octet])
        .assert_error(401, "error looking up user 'nobody': unknown user");
    // Access is checked before the body's headers, and the encoding before the type.
    daemon
        .call_with("POST", "/files?path=a", &[("Content-Encoding", "br")], b"x")
        .assert_error(401, "missing signature query parameter");
    post(
        "/files?path=a",
        &[("Content-Type", "text/plain"), ("Content-Encoding", "br")],
    )
    .assert_error(
        415,
        "unsupported Content-Encoding 'br': the supported codings are identity and gzip",
    );
    daemon
        .call_with("POST", "/files?path=a", &[("X-Access-Token", "nope")], b"x")
        .assert_error(401, "access token present in header but does not match");
    let patch = daemon.call("PATCH", "/files?path=a", b"x");
    assert_eq!(patch.status, 405);
    assert_eq!(patch.header("allow"), Some("GET, HEAD, POST, PUT"));
    assert!(!home.join("a").exists() && !home.join("t").exists() && !home.join("g").exists());
    assert!(temporaries(&home).is_empty());
}

#[test]
fn a_signed_write_url_uploads_and_a_read_signature_does_not() {
    let daemon = start();
    let home = daemon.home();
    let octet = ("Content-Type", "application/octet-stream");
    for version in [&[][..], &["--v1"][..]] {
        let mut args = vec!["--username", "user", "--operation", "write"];
        args.extend_from_slice(version);
        let target = daemon.sign("signed/up.bin", &args);
        let reply = daemon.call_with("POST", &target, &[octet], b"signed bytes");
        assert_eq!(
            records(&reply),
            json!([record(&home.join("signed/up.bin"))])
        );
        assert_eq!(
            fs::read(home.join("signed/up.bin")).unwrap(),
            b"signed bytes"
        );
        // A signed path that the body would change (multipart filename) is not a way around
        // the signature: the signed `path` names the file.
        let body = multipart("s", &[("file", Some("elsewhere"), b"mp")]);
        let content_type = "multipart/form-data; boundary=s";
        let reply = daemon.call_with("POST", &target, &[("Content-Type", content_type)], &body);
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(fs::read(home.join("signed/up.bin")).unwrap(), b"mp");
        // Another path under the same signature is refused.
        let other = target.replace("path=signed%2Fup.bin", "path=other.bin");
        assert_ne!(other, target);
        daemon
            .call_with("POST", &other, &[octet], b"x")
            .assert_error(401, "invalid signature");

        let mut args = vec!["--username", "user"];
        args.extend_from_slice(version);
        let read = daemon.sign("signed/read.bin", &args);
        daemon
            .call_with("POST", &read, &[octet], b"x")
            .assert_error(401, "invalid signature");
        assert!(!home.join("signed/read.bin").exists());
    }
    daemon
        .call_with("POST", "/files?path=x", &[octet], b"x")
        .assert_error(401, "missing signature query parameter");
}

#[test]
fn files_and_created_directories_belong_to_the_user() {
    if !root_or_skip(&format!("chown to uid {} needs root", common::USER_UID)) {
        return;
    }
    let daemon = start();
    let home = daemon.home();
    let user = (common::USER_UID, common::USER_GID);
    let owner = |p: &Path| {
        let meta = fs::metadata(p).unwrap();
        (meta.uid(), meta.gid())
    };
    // An existing root-owned file is replaced by a new inode owned by the user.
    common::write_file(&home.join("old.txt"), b"root's");
    assert_eq!(owner(&home.join("old.txt")), (0, 0));
    assert_eq!(upload(&daemon, "old.txt", b"mine").status, 200);
    assert_eq!(owner(&home.join("old.txt")), user);
    assert_eq!(upload(&daemon, "x/y/raw", b"r").status, 200);
    for path in ["x", "x/y", "x/y/raw"] {
        assert_eq!(owner(&home.join(path)), user, "{path}");
    }
    let body = multipart("m", &[("file", Some("m/part"), b"p")]);
    assert_eq!(post_multipart(&daemon, "", "m", &body).status, 200);
    assert_eq!(owner(&home.join("m")), user);
    assert_eq!(owner(&home.join("m/part")), user);
    // As root, into root's home.
    let reply = daemon.call_with(
        "POST",
        "/files?path=r.txt&username=root",
        &[("X-Access-Token", TOKEN)],
        b"root",
    );
    let path = daemon.dir.path().join("root/r.txt");
    assert_eq!(records(&reply), json!([record(&path)]));
    assert_eq!(owner(&path), (0, 0));
}

#[test]
fn expect_100_continue_is_answered_before_the_body_and_only_when_accepted() {
    let daemon = start();
    let data = pattern(6, 2 * MIB);
    let mut stream = daemon.connect();
    write!(
        stream,
        "POST /files?path=continued.bin HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: {}\r\n\
         Expect: 100-continue\r\n\r\n",
        data.len()
    )
    .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let interim = common::read_reply(&mut reader, false).unwrap();
    assert_eq!(interim.status, 100);
    stream.write_all(&data).unwrap();
    let reply = common::read_reply(&mut reader, false).unwrap();
    assert_eq!(
        records(&reply),
        json!([record(&daemon.home().join("continued.bin"))])
    );
    assert_eq!(fs::read(daemon.home().join("continued.bin")).unwrap(), data);
    // The connection stays usable.
    write!(stream, "GET /health HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    assert_eq!(common::read_reply(&mut reader, false).unwrap().status, 204);

    // Refused before the body: the answer comes at once, without 100 Continue.
    let mut stream = daemon.connect();
    write!(
        stream,
        "POST /files?path=refused.bin HTTP/1.1\r\nHost: t\r\nX-Access-Token: wrong\r\n\
         Content-Length: 1000000000\r\nExpect: 100-continue\r\n\r\n"
    )
    .unwrap();
    let mut reader = BufReader::new(stream);
    let reply = common::read_reply(&mut reader, false).unwrap();
    reply.assert_error(401, "access token present in header but does not match");
    assert!(!daemon.home().join("refused.bin").exists());
}

#[test]
fn eight_parts_uploaded_in_parallel_compose_into_the_whole() {
    let daemon = start();
    let whole = pattern(7, 8 * MIB + 123);
    let parts: Vec<&[u8]> = whole.chunks(whole.len().div_ceil(8)).collect();
    assert_eq!(parts.len(), 8);
    std::thread::scope(|scope| {
        let handles: Vec<_> = parts
            .iter()
            .enumerate()
            .map(|(i, part)| {
                let daemon = &daemon;
                scope.spawn(move || upload(daemon, &format!("parts/{i}.part"), part))
            })
            .collect();
        for handle in handles {
            assert_eq!(handle.join().unwrap().status, 200);
        }
    });
    let sources: Vec<String> = (0..8).map(|i| format!("parts/{i}.part")).collect();
    let body = json!({"source_paths": sources, "destination": "whole.bin"});
    let reply = daemon.call("POST", "/files/compose", body.to_string().as_bytes());
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(fs::read(daemon.home().join("whole.bin")).unwrap(), whole);
}

#[test]
fn curl_raw_data_binary_and_form_uploads() {
    if Command::new("curl").arg("--version").output().is_err() {
        eprintln!("skipped: curl is not installed");
        return;
    }
    let daemon = start();
    let home = daemon.home();
    let src = daemon.dir.path().join("src");
    // Over 1 MiB, so curl sends `Expect: 100-continue`.
    let big = pattern(8, 3 * MIB + 1);
    let small = pattern(9, 1000);
    common::write_file(&src.join("big"), &big);
    common::write_file(&src.join("small"), &small);
    let base = format!("http://{}/files", daemon.addr);
    let curl = |args: &[&str]| -> serde_json::Value {
        let output = Command::new("curl")
            .args(["-sS", "--fail-with-body", "-H"])
            .arg(format!("X-Access-Token: {TOKEN}"))
            .args(args)
            .output()
            .unwrap();
        assert!(output.status.success(), "curl {args:?}: {output:?}");
        serde_json::from_slice(&output.stdout).unwrap()
    };
    let big_path = src.join("big").to_string_lossy().into_owned();
    let small_path = src.join("small").to_string_lossy().into_owned();

    let reply = curl(&["-X", "POST", "-T", &big_path, &format!("{base}?path=t.bin")]);
    assert_eq!(reply, json!([record(&home.join("t.bin"))]));
    assert_eq!(fs::read(home.join("t.bin")).unwrap(), big);

    let reply = curl(&[
        "--data-binary",
        &format!("@{big_path}"),
        "-H",
        "Content-Type: application/octet-stream",
        &format!("{base}?path=d.bin"),
    ]);
    assert_eq!(reply, json!([record(&home.join("d.bin"))]));
    assert_eq!(fs::read(home.join("d.bin")).unwrap(), big);

    let reply = curl(&[
        "-F",
        &format!("file=@{big_path};filename=form/big.bin"),
        "-F",
        &format!("file=@{small_path};filename=small.bin"),
        "-F",
        "comment=ignored",
        &base,
    ]);
    assert_eq!(
        reply,
        json!([
            record(&home.join("form/big.bin")),
            record(&home.join("small.bin"))
        ])
    );
    assert_eq!(fs::read(home.join("form/big.bin")).unwrap(), big);
    assert_eq!(fs::read(home.join("small.bin")).unwrap(), small);

    // Chunked from curl (a pipe has no length).
    let output = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cat '{big_path}' | curl -sS --fail-with-body -H 'X-Access-Token: {TOKEN}' \
             -H 'Transfer-Encoding: chunked' -H 'Content-Type: application/octet-stream' \
             --data-binary @- '{base}?path=piped.bin'"
        ))
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(fs::read(home.join("piped.bin")).unwrap(), big);
}

#[test]
fn a_full_disk_is_507_keeps_the_old_file_and_leaves_no_temporary() {
    if !root_or_skip("mounting a small tmpfs needs root") {
        return;
    }
    let daemon = start();
    let small = daemon.dir.path().join("small");
    let _mount = Mount::tmpfs(&small, "4m");
    fs::write(small.join("out.bin"), b"old").unwrap();
    let target = small.join("out.bin").to_string_lossy().into_owned();
    let reply = upload(&daemon, &target, &pattern(10, 8 * MIB));
    reply.assert_error(507, "not enough disk space available");
    assert_eq!(fs::read(small.join("out.bin")).unwrap(), b"old");
    assert!(temporaries(&small).is_empty());
    // Multipart: the first part fits, the second does not; neither lands.
    let body = multipart(
        "disk-7Qz9-boundary",
        &[
            ("file", Some(&format!("{target}.1")), &pattern(11, MIB)),
            ("file", Some(&target), &pattern(12, 8 * MIB)),
        ],
    );
    post_multipart(&daemon, "", "disk-7Qz9-boundary", &body)
        .assert_error(507, "not enough disk space available");
    assert_eq!(fs::read(small.join("out.bin")).unwrap(), b"old");
    assert!(!small.join("out.bin.1").exists());
    assert!(temporaries(&small).is_empty());
    // The space is free again: a small upload succeeds.
    assert_eq!(upload(&daemon, &target, b"new").status, 200);
    assert_eq!(fs::read(small.join("out.bin")).unwrap(), b"new");
}

#[test]
fn a_client_that_disconnects_mid_upload_leaves_nothing_behind() {
    let daemon = start();
    let home = daemon.home();
    common::write_file(&home.join("keep.bin"), b"previous");
    let data = pattern(13, 4 * MIB);
    // Raw: half the declared body, then gone.
    let mut stream = daemon.connect();
    write!(
        stream,
        "POST /files?path=keep.bin HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\n\
         Content-Length: {}\r\n\r\n",
        data.len() * 2
    )
    .unwrap();
    stream.write_all(&data).unwrap();
    wait_for("the file being written", || {
        common::files_in_progress(&daemon, &home) == 1
    });
    drop(stream);
    wait_for("the file to go", || {
        common::files_in_progress(&daemon, &home) == 0
    });
    assert_eq!(fs::read(home.join("keep.bin")).unwrap(), b"previous");

    // Multipart: one part complete, the next cut short.
    let body = multipart(
        "cut-7Qz9-boundary",
        &[
            ("file", Some("first.bin"), &data),
            ("file", Some("second.bin"), &data),
        ],
    );
    let mut stream = daemon.connect();
    write!(
        stream,
        "POST /files HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\n\
         Content-Type: multipart/form-data; boundary=cut-7Qz9-boundary\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .unwrap();
    let cut = body.len() - MIB;
    stream.write_all(format!("{cut:x}\r\n").as_bytes()).unwrap();
    stream.write_all(&body[..cut]).unwrap();
    // The first part finished (a temporary name, no descriptor), the second being written.
    wait_for("two files", || {
        common::files_in_progress(&daemon, &home) == 2
    });
    drop(stream);
    wait_for("the files to go", || {
        common::files_in_progress(&daemon, &home) == 0
    });
    assert!(!home.join("first.bin").exists());
    assert!(!home.join("second.bin").exists());
}

fn vm_hwm_kib(pid: i32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Streams `len` bytes of body after `head`, generated on the fly.
fn stream_upload(daemon: &Daemon, head: String, prefix: &[u8], len: usize, suffix: &[u8]) -> Reply {
    let mut stream = daemon.connect();
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(prefix).unwrap();
    let block = pattern(14, MIB);
    let mut sent = 0;
    while sent < len {
        let n = block.len().min(len - sent);
        stream.write_all(&block[..n]).unwrap();
        sent += n;
    }
    stream.write_all(suffix).unwrap();
    let mut reader = BufReader::new(stream);
    common::read_reply(&mut reader, false).unwrap()
}

#[test]
fn a_large_body_is_streamed_not_held_in_memory() {
    let daemon = start();
    let len = 256 * MIB;
    let before = vm_hwm_kib(daemon.pid());
    let head = format!(
        "POST /files?path=big.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\
         X-Access-Token: {TOKEN}\r\nContent-Length: {len}\r\n\r\n"
    );
    let reply = stream_upload(&daemon, head, b"", len, b"");
    assert_eq!(reply.status, 200, "{}", reply.text());
    let prefix = b"--big-7Qz9-boundary\r\nContent-Disposition: form-data; name=file; filename=mp.bin\r\n\r\n";
    let suffix = b"\r\n--big-7Qz9-boundary--\r\n";
    let head = format!(
        "POST /files HTTP/1.1\r\nHost: t\r\nConnection: close\r\nX-Access-Token: {TOKEN}\r\n\
         Content-Type: multipart/form-data; boundary=big-7Qz9-boundary\r\nContent-Length: {}\r\n\r\n",
        prefix.len() + len + suffix.len()
    );
    let reply = stream_upload(&daemon, head, prefix, len, suffix);
    assert_eq!(reply.status, 200, "{}", reply.text());
    let growth = vm_hwm_kib(daemon.pid()).saturating_sub(before);
    assert!(growth < 8 * 1024, "peak RSS grew by {growth} KiB");
    let block = pattern(14, MIB);
    let mut buf = vec![0u8; MIB];
    for name in ["big.bin", "mp.bin"] {
        let mut file = fs::File::open(daemon.home().join(name)).unwrap();
        assert_eq!(file.metadata().unwrap().len(), len as u64, "{name}");
        for at in 0..len / MIB {
            file.read_exact(&mut buf).unwrap();
            assert!(buf == block, "{name}: MiB {at} differs");
        }
    }
}

// ---- issue 13: modes kept, constant descriptors, nothing left after a kill ----

#[test]
fn uploading_over_a_file_keeps_its_permission_bits() {
    use std::os::unix::fs::PermissionsExt;
    let daemon = start();
    let home = daemon.home();
    let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o7777;
    // Set-user-ID and set-group-ID are not carried over to new contents.
    for (name, before, after) in [
        ("secret.txt", 0o600, 0o600),
        ("tool.sh", 0o755, 0o755),
        ("shared", 0o664, 0o664),
        ("setuid", 0o4755, 0o755),
        ("setgid", 0o2750, 0o750),
    ] {
        common::write_file(&home.join(name), b"old");
        fs::set_permissions(home.join(name), fs::Permissions::from_mode(before)).unwrap();
        assert_eq!(upload(&daemon, name, b"new").status, 200, "{name}");
        assert_eq!(fs::read(home.join(name)).unwrap(), b"new");
        assert_eq!(mode(&home.join(name)), after, "{name}");
    }
    common::write_file(&home.join("mp-secret"), b"old");
    fs::set_permissions(home.join("mp-secret"), fs::Permissions::from_mode(0o600)).unwrap();
    let body = multipart(
        "keep-mode",
        &[
            ("file", Some("mp-secret"), b"new secret"),
            ("file", Some("mp-new"), b"new file"),
        ],
    );
    let reply = post_multipart(&daemon, "", "keep-mode", &body);
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(fs::read(home.join("mp-secret")).unwrap(), b"new secret");
    assert_eq!(mode(&home.join("mp-secret")), 0o600);
    assert_eq!(mode(&home.join("mp-new")), 0o644);
    assert_eq!(upload(&daemon, "raw-new", b"n").status, 200);
    assert_eq!(mode(&home.join("raw-new")), 0o644);
    if root_or_skip("checking the owner set by chown needs root") {
        let meta = fs::metadata(home.join("secret.txt")).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid()),
            (common::USER_UID, common::USER_GID)
        );
    }
}

#[test]
fn eight_thousand_parts_under_a_descriptor_limit_of_64() {
    const PARTS: usize = 8_000;
    let daemon = common::builder()
        .arg("--default-user")
        .arg("user")
        .wrap_with_shell("ulimit -n 64 && exec")
        .start();
    // On a tmpfs when possible: the test is about descriptors, not about this disk's speed.
    let (home, _mount) = if is_root() {
        let at = daemon.dir.path().join("t");
        let mount = Mount::tmpfs(&at, "64m");
        (at, Some(mount))
    } else {
        (daemon.home(), None)
    };
    let limits = fs::read_to_string(format!("/proc/{}/limits", daemon.pid())).unwrap();
    let nofile = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .to_string();
    assert!(nofile.split_whitespace().nth(3) == Some("64"), "{nofile}");
    let names: Vec<String> = (0..PARTS)
        .map(|i| format!("{}/mp/p{i:04}", home.display()))
        .collect();
    let contents: Vec<Vec<u8>> = (0..PARTS)
        .map(|i| format!("part {i}\r\n--not a boundary").into_bytes())
        .collect();
    let parts: Vec<(&str, Option<&str>, &[u8])> = names
        .iter()
        .zip(&contents)
        .map(|(name, data)| ("file", Some(name.as_str()), data.as_slice()))
        .collect();
    let body = multipart("many-parts-boundary", &parts);
    let reply = post_multipart(&daemon, "", "many-parts-boundary", &body);
    let written = records(&reply);
    assert_eq!(written.as_array().map(Vec::len), Some(PARTS));
    assert_eq!(written[PARTS - 1], record(&home.join(&names[PARTS - 1])));
    for (name, data) in names.iter().zip(&contents) {
        assert!(fs::read(home.join(name)).unwrap() == *data, "{name}");
    }
    assert_eq!(fs::read_dir(home.join("mp")).unwrap().count(), PARTS);
    assert!(temporaries(&home.join("mp")).is_empty());
    assert_eq!(daemon.get("/health").status, 204);
}

#[test]
fn killed_at_random_instants_an_upload_to_a_new_file_leaves_nothing_behind() {
    let workspace = tempfile::tempdir().unwrap();
    let dir = workspace.path().join("k");
    // On a tmpfs of its own when possible, to spare the disk the other tests share.
    let _mount = if is_root() {
        Some(Mount::tmpfs(&dir, "96m"))
    } else {
        fs::create_dir(&dir).unwrap();
        None
    };
    let dest = dir.join("out.bin");
    let data = pattern(21, 24 * MIB);
    let mut request = format!(
        "POST /files?path={} HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\n\
         Content-Length: {}\r\n\r\n",
        enc(&dest.to_string_lossy()),
        data.len()
    )
    .into_bytes();
    request.extend_from_slice(&data);
    let request = std::sync::Arc::new(request);
    // Calibrate: how long one whole upload takes here.
    let daemon = start();
    let started = Instant::now();
    assert_eq!(upload(&daemon, &dest.to_string_lossy(), &data).status, 200);
    let full = started.elapsed();
    drop(daemon);
    let mut rng = common::Rng::from_env("UPLOAD_KILL_SEED");
    let (mut none, mut complete) = (0, 0);
    for round in 0..8 {
        let _ = fs::remove_file(&dest);
        let mut daemon = start();
        let mut stream = daemon.connect();
        let request = std::sync::Arc::clone(&request);
        let writer = std::thread::spawn(move || {
            let _ = stream.write_all(&request);
        });
        let delay = Duration::from_micros(
            rng.below(u64::try_from(full.as_micros()).unwrap() * 13 / 10 + 1),
        );
        std::thread::sleep(delay);
        daemon.signal("KILL");
        assert!(daemon.wait(Duration::from_secs(5)).is_some());
        let _ = writer.join();
        // Right after the kill: the whole file or nothing at all, not even a temporary.
        let left: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        match left.as_slice() {
            [] => none += 1,
            [name] if *name == *"out.bin" => {
                assert!(
                    fs::read(&dest).unwrap() == data,
                    "round {round} after {delay:?}: a partial file"
                );
                complete += 1;
            }
            other => panic!("round {round} after {delay:?}: left {other:?}"),
        }
    }
    eprintln!("8 kills (upload takes {full:?}): {none} nothing, {complete} whole");
}

#[test]
fn a_killed_multipart_upload_leaves_only_names_the_next_daemon_sweeps() {
    let workspace = tempfile::tempdir().unwrap();
    let dir = workspace.path().join("m");
    fs::create_dir(&dir).unwrap();
    let data = pattern(17, 2 * MIB);
    let first = dir.join("first.bin").to_string_lossy().into_owned();
    let second = dir.join("second.bin").to_string_lossy().into_owned();
    let body = multipart(
        "kill-boundary",
        &[
            ("file", Some(first.as_str()), &data),
            ("file", Some(second.as_str()), &data),
        ],
    );
    let mut daemon = start();
    let mut stream = daemon.connect();
    write!(
        stream,
        "POST /files HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\n\
         Content-Type: multipart/form-data; boundary=kill-boundary\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    stream.write_all(&body[..body.len() - MIB]).unwrap();
    // The first part is finished (under a temporary name, its descriptor closed), the second
    // is being written (unnamed).
    wait_for("two files", || {
        common::files_in_progress(&daemon, &dir) == 2
    });
    assert_eq!(temporaries(&dir).len(), 1);
    daemon.signal("KILL");
    assert!(daemon.wait(Duration::from_secs(5)).is_some());
    drop(stream);
    // The killed process left the finished part's temporary name, and nothing else.
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
    assert_eq!(temporaries(&dir).len(), 1);
    // The next daemon to write into the directory sweeps it, off the request's path.
    let next = start();
    let other = dir.join("other.txt").to_string_lossy().into_owned();
    assert_eq!(upload(&next, &other, b"o").status, 200);
    wait_for("the sweep", || temporaries(&dir).is_empty());
    let left: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("other.txt")]);
}
