//! GET and HEAD /files against the real binary (SPEC §6, with §2-§4 as they apply to it).

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common;
use crate::common::*;
use sandboxd::{signed_url_query, Operation};

const MIB: u64 = 1024 * 1024;

/// The target of `path` for `user`, whose home is `daemon.home()`.
fn files(path: &str) -> String {
    format!("/files?path={}&username=user", enc(path))
}

/// `method` of `target` with the token and `extra` headers.
fn fetch(daemon: &Daemon, method: &str, target: &str, extra: &[(&str, &str)]) -> Reply {
    let mut headers = vec![("X-Access-Token", TOKEN)];
    headers.extend_from_slice(extra);
    send(daemon, method, target, &headers)
}

/// `method` of `target` with exactly `headers`; unlike `Daemon::call_with`, a HEAD reply is read
/// without its body, whatever its `Content-Length`.
fn send(daemon: &Daemon, method: &str, target: &str, headers: &[(&str, &str)]) -> Reply {
    let mut request = format!("{method} {target} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    let mut stream = daemon.connect();
    stream.write_all(request.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let reply = read_reply(&mut reader, method == "HEAD").expect("a response");
    if method == "HEAD" {
        let mut rest = Vec::new();
        let _ = reader.read_to_end(&mut rest);
        assert!(rest.is_empty(), "HEAD sent {} body bytes", rest.len());
    }
    reply
}

/// The byte at `offset` of the patterned test files: the little-endian bytes of `offset / 8`, so
/// a byte sent from the wrong offset never matches.
fn pattern_byte(offset: u64) -> u8 {
    (offset / 8).to_le_bytes()[(offset % 8) as usize]
}

fn write_pattern(path: &Path, len: u64) {
    let mut file = File::create(path).unwrap();
    let mut chunk = vec![0u8; usize::try_from(MIB).unwrap()];
    let mut offset = 0;
    while offset < len {
        let n = (len - offset).min(MIB) as usize;
        for (i, byte) in chunk[..n].iter_mut().enumerate() {
            *byte = pattern_byte(offset + i as u64);
        }
        file.write_all(&chunk[..n]).unwrap();
        offset += n as u64;
    }
}

fn pattern(len: u64) -> Vec<u8> {
    (0..len).map(pattern_byte).collect()
}

/// Sends a GET with `Connection: close` and returns the reader positioned at the body, with the
/// status and headers.
fn open_get(daemon: &Daemon, target: &str) -> (BufReader<std::net::TcpStream>, u16, Vec<String>) {
    let mut stream = daemon.connect();
    write!(
        stream,
        "GET {target} HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reader = BufReader::new(stream);
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line.trim_end().is_empty() {
            break;
        }
        lines.push(line.trim_end().to_string());
    }
    let status = lines[0].split(' ').nth(1).unwrap().parse().unwrap();
    (reader, status, lines)
}

fn content_length(lines: &[String]) -> u64 {
    lines
        .iter()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .expect("Content-Length")
        .parse()
        .unwrap()
}

fn set_mtime(path: &Path, unix_secs: u64) {
    File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(UNIX_EPOCH + Duration::from_secs(unix_secs))
        .unwrap();
}

fn curl_available() -> bool {
    let found = Command::new("curl").arg("--version").output().is_ok();
    if !found {
        eprintln!("skipped: curl is not installed");
    }
    found
}

// ---- bodies ----

#[test]
fn small_files_are_sent_byte_for_byte() {
    let daemon = start();
    for (name, contents) in [
        ("empty", Vec::new()),
        ("one", b"x".to_vec()),
        ("mebibyte.bin", pattern(MIB)),
    ] {
        write_file(&daemon.home().join(name), &contents);
        let reply = fetch(&daemon, "GET", &files(name), &[]);
        assert_eq!(reply.status, 200, "{name}: {}", reply.text());
        assert_eq!(
            reply.header("content-length"),
            Some(contents.len().to_string().as_str())
        );
        assert!(reply.body == contents, "{name}: body differs");
    }
}

#[test]
fn a_100_mib_file_is_sent_byte_for_byte() {
    let daemon = start();
    let len = 100 * MIB;
    write_pattern(&daemon.home().join("big.bin"), len);
    let (mut reader, status, lines) = open_get(&daemon, &files("big.bin"));
    assert_eq!(status, 200);
    assert_eq!(content_length(&lines), len);
    let mut buf = vec![0u8; 256 * 1024];
    let mut offset = 0u64;
    loop {
        let n = reader.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        for (i, &byte) in buf[..n].iter().enumerate() {
            let at = offset + i as u64;
            assert_eq!(byte, pattern_byte(at), "byte {at}");
        }
        offset += n as u64;
    }
    assert_eq!(offset, len);
}

#[test]
fn the_body_is_the_size_at_open_even_if_the_file_grows() {
    let daemon = start();
    let path = daemon.home().join("growing");
    let file = File::create(&path).unwrap();
    file.set_len(64 * MIB).unwrap();
    let (mut reader, status, lines) = open_get(&daemon, &files("growing"));
    assert_eq!(status, 200);
    file.set_len(128 * MIB).unwrap();
    let mut body = Vec::new();
    reader.read_to_end(&mut body).unwrap();
    assert_eq!(content_length(&lines), 64 * MIB);
    assert_eq!(body.len() as u64, 64 * MIB);
}

#[test]
fn a_file_that_shrinks_closes_the_connection_short() {
    let daemon = start();
    let path = daemon.home().join("shrinking");
    let file = File::create(&path).unwrap();
    file.set_len(64 * MIB).unwrap();
    let (mut reader, status, lines) = open_get(&daemon, &files("shrinking"));
    assert_eq!(status, 200);
    assert_eq!(content_length(&lines), 64 * MIB);
    file.set_len(MIB).unwrap();
    let mut body = Vec::new();
    // The connection ends early (a clean close or a reset), never with made-up bytes.
    let _ = reader.read_to_end(&mut body);
    assert!((body.len() as u64) < 64 * MIB, "{} bytes", body.len());
    assert_eq!(
        fetch(&daemon, "GET", &files("shrinking"), &[]).body.len() as u64,
        MIB
    );
}

#[test]
fn a_client_that_goes_away_frees_the_worker_at_once() {
    let daemon = builder().arg("--workers").arg("1").start();
    let path = daemon.home().join("big");
    File::create(&path).unwrap().set_len(256 * MIB).unwrap();
    let (mut reader, status, _) = open_get(&daemon, &files("big"));
    assert_eq!(status, 200);
    let mut some = [0u8; 4096];
    reader.read_exact(&mut some).unwrap();
    drop(reader);
    let started = Instant::now();
    assert_eq!(fetch(&daemon, "GET", "/health", &[]).status, 204);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_stalled_reader_is_bounded_by_the_send_timeout() {
    let daemon = builder()
        .arg("--workers")
        .arg("1")
        .arg("--send-timeout")
        .arg("1")
        .start();
    File::create(daemon.home().join("big"))
        .unwrap()
        .set_len(256 * MIB)
        .unwrap();
    // Requests the file and never reads it.
    let (_stalled, status, _) = open_get(&daemon, &files("big"));
    assert_eq!(status, 200);
    common::assert_health_within(&daemon, Duration::from_secs(10));
}

// ---- headers ----

#[test]
fn headers_of_a_download() {
    let daemon = start();
    let path = daemon.home().join("notes.txt");
    write_file(&path, b"hello");
    set_mtime(&path, 1_700_000_000);
    let reply = fetch(&daemon, "GET", &files("notes.txt"), &[]);
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, b"hello");
    assert_eq!(reply.header("content-type"), Some("text/plain"));
    assert_eq!(
        reply.header("content-disposition"),
        Some("inline; filename=\"notes.txt\"")
    );
    assert_eq!(reply.header("accept-ranges"), Some("bytes"));
    assert_eq!(
        reply.header("last-modified"),
        Some("Tue, 14 Nov 2023 22:13:20 GMT")
    );
    assert_eq!(reply.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(reply.header("transfer-encoding"), None);
    let etag = reply.header("etag").expect("ETag");
    let meta = std::fs::metadata(&path).unwrap();
    use std::os::unix::fs::MetadataExt;
    let nanos = i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec());
    assert_eq!(
        etag,
        format!("\"{:x}-{:x}-5-{nanos:x}\"", meta.dev(), meta.ino())
    );
}

#[test]
fn content_type_and_disposition_follow_the_name() {
    let daemon = start();
    for (name, mime, disposition) in [
        ("pic.PNG", "image/png", "inline; filename=\"pic.PNG\""),
        (
            "Makefile",
            "application/octet-stream",
            "inline; filename=\"Makefile\"",
        ),
        (
            ".bashrc",
            "application/octet-stream",
            "inline; filename=\".bashrc\"",
        ),
        ("a b.pdf", "application/pdf", "inline; filename=\"a b.pdf\""),
        (
            "résumé \"v2\".json",
            "application/json",
            "inline; filename=\"r_sum_ _v2_.json\"; \
             filename*=utf-8''r%C3%A9sum%C3%A9%20%22v2%22.json",
        ),
        (
            "back\\slash",
            "application/octet-stream",
            "inline; filename=\"back_slash\"; filename*=utf-8''back%5Cslash",
        ),
    ] {
        write_file(&daemon.home().join(name), b"x");
        let reply = fetch(&daemon, "GET", &files(name), &[]);
        assert_eq!(reply.status, 200, "{name}");
        assert_eq!(reply.header("content-type"), Some(mime), "{name}");
        assert_eq!(
            reply.header("content-disposition"),
            Some(disposition),
            "{name}"
        );
    }
}

#[test]
fn etag_changes_with_the_contents() {
    let daemon = start();
    let path = daemon.home().join("f");
    write_file(&path, b"one");
    set_mtime(&path, 1_600_000_000);
    let first = fetch(&daemon, "GET", &files("f"), &[]);
    write_file(&path, b"two");
    set_mtime(&path, 1_600_000_001);
    let second = fetch(&daemon, "GET", &files("f"), &[]);
    assert_ne!(first.header("etag"), second.header("etag"));
    let old = first.header("etag").unwrap();
    let reply = fetch(&daemon, "GET", &files("f"), &[("If-None-Match", old)]);
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, b"two");
}

fn without_date(reply: &Reply) -> Vec<(String, String)> {
    reply
        .headers
        .iter()
        .filter(|(name, _)| !name.eq_ignore_ascii_case("date"))
        .cloned()
        .collect()
}

#[test]
fn head_has_the_headers_of_get_and_no_body() {
    let daemon = start();
    write_file(&daemon.home().join("data.csv"), &pattern(100_000));
    write_file(&daemon.home().join("empty"), b"");
    for name in ["data.csv", "empty"] {
        let get = fetch(&daemon, "GET", &files(name), &[]);
        let head = fetch(&daemon, "HEAD", &files(name), &[]);
        assert_eq!(head.status, 200);
        assert_eq!(without_date(&head), without_date(&get), "{name}");
        assert!(head.body.is_empty());
    }
    // Errors too.
    let get = fetch(&daemon, "GET", &files("missing"), &[]);
    let head = fetch(&daemon, "HEAD", &files("missing"), &[]);
    assert_eq!(head.status, 404);
    assert_eq!(without_date(&head), without_date(&get));
}

#[test]
fn head_ignores_range_as_rfc_9110_requires() {
    let daemon = start();
    write_file(&daemon.home().join("f"), b"0123456789");
    let head = fetch(&daemon, "HEAD", &files("f"), &[("Range", "bytes=2-4")]);
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-length"), Some("10"));
    assert_eq!(head.header("content-range"), None);
}

// ---- ranges ----

#[test]
fn single_ranges_are_206() {
    let daemon = start();
    write_file(&daemon.home().join("f"), b"0123456789");
    for (range, body, content_range) in [
        ("bytes=2-4", "234", "bytes 2-4/10"),
        ("bytes=0-0", "0", "bytes 0-0/10"),
        ("bytes=7-", "789", "bytes 7-9/10"),
        ("bytes=-3", "789", "bytes 7-9/10"),
        ("bytes=-30", "0123456789", "bytes 0-9/10"),
        ("bytes=8-100", "89", "bytes 8-9/10"),
        ("bytes=9-9", "9", "bytes 9-9/10"),
    ] {
        let reply = fetch(&daemon, "GET", &files("f"), &[("Range", range)]);
        assert_eq!(reply.status, 206, "{range}");
        assert_eq!(reply.text(), body, "{range}");
        assert_eq!(
            reply.header("content-range"),
            Some(content_range),
            "{range}"
        );
        assert_eq!(
            reply.header("content-length"),
            Some(body.len().to_string().as_str())
        );
        assert!(reply.header("etag").is_some());
    }
}

#[test]
fn a_range_deep_in_a_large_file() {
    let daemon = start();
    write_pattern(&daemon.home().join("f"), 3 * MIB);
    let start = 2 * MIB + 12_345;
    let range = format!("bytes={start}-{}", start + 99_999);
    let reply = fetch(&daemon, "GET", &files("f"), &[("Range", &range)]);
    assert_eq!(reply.status, 206);
    let expected: Vec<u8> = (start..start + 100_000).map(pattern_byte).collect();
    assert!(reply.body == expected, "wrong bytes");
}

#[test]
fn unsatisfiable_ranges_are_416() {
    let daemon = start();
    write_file(&daemon.home().join("f"), b"0123456789");
    write_file(&daemon.home().join("empty"), b"");
    let home = daemon.home();
    for (name, range, size) in [
        ("f", "bytes=10-", 10),
        ("f", "bytes=20-30", 10),
        ("f", "bytes=-0", 10),
        ("empty", "bytes=0-", 0),
    ] {
        let reply = fetch(&daemon, "GET", &files(name), &[("Range", range)]);
        reply.assert_error(
            416,
            &format!(
                "range '{range}' is not satisfiable: '{}' has {size} bytes",
                home.join(name).display()
            ),
        );
        let expected = format!("bytes */{size}");
        assert_eq!(reply.header("content-range"), Some(expected.as_str()));
    }
}

#[test]
fn several_ranges_invalid_ranges_and_other_units_get_the_whole_file() {
    let daemon = start();
    write_file(&daemon.home().join("f"), b"0123456789");
    for range in ["bytes=0-1,3-4", "bytes=5-2", "items=0-1", "bytes=x-y"] {
        let reply = fetch(&daemon, "GET", &files("f"), &[("Range", range)]);
        assert_eq!(reply.status, 200, "{range}");
        assert_eq!(reply.text(), "0123456789");
        assert_eq!(reply.header("content-range"), None);
    }
}

// ---- conditional requests ----

/// Writes `~/f` with mtime 1700000000 (Tue, 14 Nov 2023 22:13:20 GMT); returns its path and
/// the ETag a GET reports for it.
fn file_f_with_etag(daemon: &Daemon, contents: &[u8]) -> (std::path::PathBuf, String) {
    let path = daemon.home().join("f");
    write_file(&path, contents);
    set_mtime(&path, 1_700_000_000);
    let etag = fetch(daemon, "GET", &files("f"), &[])
        .header("etag")
        .unwrap()
        .to_string();
    (path, etag)
}

#[test]
fn if_none_match_and_if_modified_since_give_304() {
    let daemon = start();
    let (_, etag) = file_f_with_etag(&daemon, b"data");
    let at_mtime = "Tue, 14 Nov 2023 22:13:20 GMT";
    let before = "Tue, 14 Nov 2023 22:13:19 GMT";
    for (method, headers, status) in [
        ("GET", vec![("If-None-Match", etag.as_str())], 304),
        ("HEAD", vec![("If-None-Match", etag.as_str())], 304),
        ("GET", vec![("If-None-Match", "*")], 304),
        ("GET", vec![("If-None-Match", "\"a\", \"b\"")], 200),
        ("GET", vec![("If-Modified-Since", at_mtime)], 304),
        ("GET", vec![("If-Modified-Since", before)], 200),
        // If-None-Match present: If-Modified-Since is not looked at.
        (
            "GET",
            vec![("If-None-Match", "\"a\""), ("If-Modified-Since", at_mtime)],
            200,
        ),
    ] {
        let reply = fetch(&daemon, method, &files("f"), &headers);
        assert_eq!(reply.status, status, "{method} {headers:?}");
        if status == 304 {
            assert!(reply.body.is_empty());
            assert_eq!(reply.header("etag"), Some(etag.as_str()));
            assert_eq!(reply.header("last-modified"), Some(at_mtime));
        } else if method == "GET" {
            assert_eq!(reply.body, b"data");
        }
    }
}

#[test]
fn failing_if_match_or_if_unmodified_since_is_412() {
    let daemon = start();
    let (path, etag) = file_f_with_etag(&daemon, b"data");
    let shown = path.display();
    fetch(&daemon, "GET", &files("f"), &[("If-Match", "\"other\"")])
        .assert_error(412, &format!("precondition If-Match failed for '{shown}'"));
    fetch(
        &daemon,
        "GET",
        &files("f"),
        &[("If-Unmodified-Since", "Tue, 14 Nov 2023 22:13:19 GMT")],
    )
    .assert_error(
        412,
        &format!("precondition If-Unmodified-Since failed for '{shown}'"),
    );
    for headers in [
        vec![("If-Match", etag.as_str())],
        vec![("If-Match", "*")],
        vec![("If-Unmodified-Since", "Tue, 14 Nov 2023 22:13:20 GMT")],
    ] {
        let reply = fetch(&daemon, "GET", &files("f"), &headers);
        assert_eq!(reply.status, 200, "{headers:?}");
        assert_eq!(reply.body, b"data");
    }
}

#[test]
fn if_range_by_etag_or_date() {
    let daemon = start();
    let (_, etag) = file_f_with_etag(&daemon, b"0123456789");
    for (if_range, status, body) in [
        (etag.as_str(), 206, "234"),
        ("Tue, 14 Nov 2023 22:13:20 GMT", 206, "234"),
        ("\"stale\"", 200, "0123456789"),
        ("Tue, 14 Nov 2023 22:13:19 GMT", 200, "0123456789"),
    ] {
        let reply = fetch(
            &daemon,
            "GET",
            &files("f"),
            &[("Range", "bytes=2-4"), ("If-Range", if_range)],
        );
        assert_eq!(reply.status, status, "{if_range}");
        assert_eq!(reply.text(), body, "{if_range}");
    }
}

// ---- errors ----

#[test]
fn missing_directory_and_special_files() {
    let daemon = start();
    let home = daemon.home();
    fetch(&daemon, "GET", &files("nope.txt"), &[]).assert_error(
        404,
        &format!("path '{}' does not exist", home.join("nope.txt").display()),
    );
    write_file(&home.join("file"), b"x");
    fetch(&daemon, "GET", &files("file/below"), &[]).assert_error(
        404,
        &format!(
            "path '{}' does not exist",
            home.join("file/below").display()
        ),
    );
    fetch(&daemon, "GET", &files("~"), &[]).assert_error(
        400,
        &format!("path '{}' is a directory{TAR_HINT}", home.display()),
    );
    fetch(&daemon, "GET", &files(""), &[]).assert_error(
        400,
        &format!("path '{}' is a directory{TAR_HINT}", home.display()),
    );

    let fifo = home.join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let socket = home.join("socket");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    for path in [fifo.as_path(), socket.as_path(), Path::new("/dev/null")] {
        let started = Instant::now();
        let reply = fetch(&daemon, "GET", &files(path.to_str().unwrap()), &[]);
        reply.assert_error(
            400,
            &format!("path '{}' is not a regular file", path.display()),
        );
        assert!(started.elapsed() < Duration::from_secs(5), "{path:?}");
    }
}

#[test]
fn symlinks_are_followed() {
    let daemon = start();
    let home = daemon.home();
    write_file(&home.join("target.txt"), b"through the link");
    std::os::unix::fs::symlink(home.join("target.txt"), home.join("link")).unwrap();
    let reply = fetch(&daemon, "GET", &files("link"), &[]);
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, b"through the link");
    std::os::unix::fs::symlink(home.join("gone"), home.join("dangling")).unwrap();
    fetch(&daemon, "GET", &files("dangling"), &[]).assert_error(
        404,
        &format!("path '{}' does not exist", home.join("dangling").display()),
    );
}

#[test]
fn bad_paths_users_and_queries() {
    let daemon = start();
    fetch(&daemon, "GET", &files("~other/x"), &[]).assert_error(
        400,
        "cannot resolve path '~other/x': '~user' paths are not supported",
    );
    fetch(&daemon, "GET", "/files?path=a%00b", &[]).assert_error(400, "path contains a NUL byte");
    fetch(&daemon, "GET", "/files?path=%ff", &[])
        .assert_error(400, "invalid query parameter 'path': not valid UTF-8");
    fetch(&daemon, "GET", "/files?path=a&username=ghost", &[])
        .assert_error(401, "error looking up user 'ghost': unknown user");
    write_file(&daemon.home().join("mine"), b"user's");
    let reply = fetch(&daemon, "GET", "/files?path=mine&username=user", &[]);
    assert_eq!(reply.body, b"user's");
    // root's home is elsewhere: the same relative path is missing there.
    let root_home = daemon.dir.path().join("root/mine");
    fetch(&daemon, "GET", "/files?path=mine&username=root", &[]).assert_error(
        404,
        &format!("path '{}' does not exist", root_home.display()),
    );
}

#[test]
fn wrong_method_is_405() {
    let daemon = start();
    let reply = fetch(&daemon, "DELETE", "/files?path=x", &[]);
    assert_eq!(reply.status, 405);
    let allow = reply.header("allow").unwrap_or_default();
    assert!(allow.contains("GET") && allow.contains("HEAD"), "{allow}");
}

// ---- authentication ----

#[test]
fn token_header() {
    let daemon = start();
    write_file(&daemon.home().join("f"), b"x");
    daemon
        .call_with("GET", &files("f"), &[], b"")
        .assert_error(401, "missing signature query parameter");
    daemon
        .call_with("GET", &files("f"), &[("X-Access-Token", "wrong")], b"")
        .assert_error(401, "access token present in header but does not match");
    let head = send(&daemon, "HEAD", &files("f"), &[("X-Access-Token", "wrong")]);
    assert_eq!(head.status, 401);
    // Without a token configured every download is open (envd's behaviour).
    let open = builder().no_token().start();
    write_file(&open.home().join("f"), b"open");
    assert_eq!(open.call_with("GET", &files("f"), &[], b"").body, b"open");
}

/// Replaces the value of `name` in a target's query.
fn with_param(target: &str, name: &str, value: &str) -> String {
    let (path, query) = target.split_once('?').unwrap();
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((n, _)) if n == name => format!("{n}={value}"),
            _ => pair.to_string(),
        })
        .collect();
    format!("{path}?{}", pairs.join("&"))
}

#[test]
fn signed_urls_from_sandboxd_sign() {
    let daemon = start();
    write_file(&daemon.home().join("dir/a b+c.txt"), b"signed");
    write_file(&daemon.home().join("other.txt"), b"other");
    for version in [&[][..], &["--v1"][..]] {
        let mut args = vec!["--username", "user"];
        args.extend_from_slice(version);
        let target = daemon.sign("dir/a b+c.txt", &args);
        assert!(target.contains("path=dir%2Fa+b%2Bc.txt"), "{target}");
        let reply = daemon.call_with("GET", &target, &[], b"");
        assert_eq!(reply.status, 200, "{version:?}: {}", reply.text());
        assert_eq!(reply.body, b"signed");
        assert_eq!(send(&daemon, "HEAD", &target, &[]).status, 200);
        // An empty header is no header: the signature decides.
        let reply = daemon.call_with("GET", &target, &[("X-Access-Token", "")], b"");
        assert_eq!(reply.status, 200);
        // The same values sent encoded differently are the same values.
        let respelled = with_param(&target, "path", "dir/a%20b%2bc.txt");
        assert_eq!(daemon.call_with("GET", &respelled, &[], b"").status, 200);

        let expiration = target.split("signature_expiration=").nth(1).unwrap();
        let later = (expiration.parse::<i64>().unwrap() + 1).to_string();
        for altered in [
            with_param(&target, "path", "other.txt"),
            with_param(&target, "path", "dir/a+b+c.txt"),
            with_param(&target, "username", "root"),
            with_param(&target, "username", ""),
            with_param(&target, "signature_expiration", &later),
            target.replace("&signature_expiration=", "&ignored="),
        ] {
            daemon
                .call_with("GET", &altered, &[], b"")
                .assert_error(401, "invalid signature");
        }
        // A write signature does not read.
        let mut args = vec!["--username", "user", "--operation", "write"];
        args.extend_from_slice(version);
        let write = daemon.sign("dir/a b+c.txt", &args);
        daemon
            .call_with("GET", &write, &[], b"")
            .assert_error(401, "invalid signature");
        // A valid signature does not rescue a wrong header.
        daemon
            .call_with("GET", &target, &[("X-Access-Token", "wrong")], b"")
            .assert_error(401, "access token present in header but does not match");
    }
    // The right header wins over a bad signature.
    let reply = fetch(
        &daemon,
        "GET",
        "/files?path=other.txt&username=user&signature=v1_bogus&signature_expiration=1",
        &[],
    );
    assert_eq!(reply.body, b"other");
}

#[test]
fn expired_and_malformed_signatures() {
    let daemon = start();
    write_file(&daemon.home().join("f"), b"x");
    let now = now_secs();
    for version in [1, 2] {
        let query = signed_url_query("f", Operation::Read, "user", TOKEN, now - 10, version);
        daemon
            .call_with("GET", &format!("/files?{query}"), &[], b"")
            .assert_error(401, "signature is already expired");
        let query = signed_url_query("f", Operation::Read, "user", TOKEN, now + 60, version);
        assert_eq!(
            daemon
                .call_with("GET", &format!("/files?{query}"), &[], b"")
                .status,
            200
        );
    }
    daemon
        .call_with(
            "GET",
            "/files?path=f&signature=v2_x&signature_expiration=abc",
            &[],
            b"",
        )
        .assert_error(
            400,
            "invalid signature_expiration query parameter 'abc': expected Unix seconds",
        );
    daemon
        .call_with("GET", "/files?path=f&signature=", &[], b"")
        .assert_error(401, "missing signature query parameter");
}

#[test]
fn spec_v1_vectors() {
    let daemon = builder()
        .no_token()
        .env("SANDBOXD_ACCESS_TOKEN", "secret-token")
        .start();
    // Unexpiring: the signature passes, so the answer is about the file (present or not).
    let reply = daemon.call_with(
        "GET",
        &format!(
            "/files?path=%2Ftmp%2Fa.txt&signature={}",
            enc("v1_CDCMrbQyUHyA5BgoY3jXv19yxwH8ZU5/7B4GD7PyUBk")
        ),
        &[],
        b"",
    );
    assert!(
        reply.status == 200 || reply.json()["message"] == "path '/tmp/a.txt' does not exist",
        "{} {}",
        reply.status,
        reply.text()
    );
    // Expiring in 2023: expiry is only checked once the signature matched.
    daemon
        .call_with(
            "GET",
            &format!(
                "/files?path=%2Ftmp%2Fa.txt&username=user&signature={}&signature_expiration=1700000000",
                enc("v1_8qywDjLKW2P0wQ1QjV1/xVDCWHpzm6/fx3cZ+pGFg+w")
            ),
            &[],
            b"",
        )
        .assert_error(401, "signature is already expired");
    // A write vector does not read.
    daemon
        .call_with(
            "GET",
            &format!(
                "/files?path=demo%2Ftest.txt&username=user&signature={}",
                enc("v1_Z9gF3P/eNV3fAoz0bKy62UEAx0aXorYY3wmiZ4eBbOo")
            ),
            &[],
            b"",
        )
        .assert_error(401, "invalid signature");
}

// ---- curl ----

#[test]
fn curl_resumes_a_partial_download() {
    if !curl_available() {
        return;
    }
    let daemon = start();
    let contents = pattern(3 * MIB + 17);
    write_file(&daemon.home().join("big.bin"), &contents);
    let out = daemon.dir.path().join("partial.bin");
    std::fs::write(&out, &contents[..1_000_003]).unwrap();
    let url = format!("http://{}{}", daemon.addr, files("big.bin"));
    let status = Command::new("curl")
        .args(["-sS", "--fail", "-C", "-", "-o"])
        .arg(&out)
        .args(["-H", &format!("X-Access-Token: {TOKEN}"), &url])
        .status()
        .unwrap();
    assert!(status.success(), "curl: {status}");
    assert!(
        std::fs::read(&out).unwrap() == contents,
        "resumed file differs"
    );
}

#[test]
fn curl_saves_under_the_content_disposition_name() {
    if !curl_available() {
        return;
    }
    let daemon = start();
    for name in ["report 2024.txt", ".hidden", "semi;colon,comma.tar.gz"] {
        write_file(&daemon.home().join(name), name.as_bytes());
        let cwd = tempfile::tempdir().unwrap();
        let url = format!("http://{}{}", daemon.addr, files(name));
        let status = Command::new("curl")
            .current_dir(cwd.path())
            .args(["-sS", "--fail", "-O", "-J"])
            .args(["-H", &format!("X-Access-Token: {TOKEN}"), &url])
            .status()
            .unwrap();
        assert!(status.success(), "curl: {status}");
        let saved: Vec<String> = std::fs::read_dir(cwd.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(saved, [name]);
        assert_eq!(
            std::fs::read(cwd.path().join(name)).unwrap(),
            name.as_bytes()
        );
    }
}

// ---- honest dates (issue 13) ----

/// Sets `path`'s modification time to `time`; false when the filesystem cannot hold it (the
/// time read back differs).
fn try_set_modified(path: &Path, time: SystemTime) -> bool {
    let file = File::options().write(true).open(path).unwrap();
    file.set_modified(time).is_ok() && file.metadata().unwrap().modified().unwrap() == time
}

/// The Unix seconds of an IMF-fixdate header, which must be exactly one (29 characters, a
/// four-digit year).
fn imf_date(reply: &Reply, name: &str) -> i64 {
    let value = reply.header(name).unwrap_or_else(|| panic!("no {name}"));
    assert_eq!(value.len(), 29, "{name}: {value:?} is not an IMF-fixdate");
    sandboxd_http::date::parse(value).unwrap_or_else(|| panic!("{name}: {value:?}"))
}

fn now_secs() -> i64 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    i64::try_from(secs).unwrap()
}

#[test]
fn a_future_modification_time_is_sent_as_the_time_of_the_answer() {
    let daemon = start();
    let path = daemon.home().join("future.txt");
    write_file(&path, b"first version");
    // 2100-01-01: a clock set wrong when the file was written.
    set_mtime(&path, 4_102_444_800);
    let before = now_secs();
    let reply = fetch(&daemon, "GET", &files("future.txt"), &[]);
    assert_eq!(reply.status, 200);
    let shown = imf_date(&reply, "last-modified");
    assert!(
        shown >= before && shown <= imf_date(&reply, "date"),
        "Last-Modified {:?} is not the time of the answer {:?}",
        reply.header("last-modified"),
        reply.header("date")
    );
    let last_modified = reply.header("last-modified").unwrap().to_string();
    // Later the file really changes (its clock corrected): the client's If-Modified-Since must
    // not get a stale 304.
    while now_secs() <= shown {
        std::thread::sleep(Duration::from_millis(20));
    }
    write_file(&path, b"second version");
    File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(SystemTime::now())
        .unwrap();
    let reply = fetch(
        &daemon,
        "GET",
        &files("future.txt"),
        &[("If-Modified-Since", &last_modified)],
    );
    assert_eq!(reply.status, 200, "a stale 304 for a changed file");
    assert_eq!(reply.body, b"second version");
    // HEAD and 304 show the same clamped date.
    set_mtime(&path, 4_102_444_800);
    let head = fetch(&daemon, "HEAD", &files("future.txt"), &[]);
    assert!(imf_date(&head, "last-modified") <= imf_date(&head, "date"));
}

#[test]
fn dates_past_9999_or_before_year_0_are_never_sent_malformed() {
    if !root_or_skip("mounting a tmpfs (which holds such dates) needs root") {
        return;
    }
    let daemon = start();
    let dir = daemon.home().join("t");
    let _mount = Mount::tmpfs(&dir, "1m");
    let path = dir.join("odd.txt");
    std::fs::write(&path, b"odd").unwrap();
    // Year 10000 and later: clamped to the time of the answer like any future date.
    let far = UNIX_EPOCH + Duration::from_secs(253_402_300_800 + 86_400 * 400);
    if try_set_modified(&path, far) {
        let reply = fetch(&daemon, "GET", &files("t/odd.txt"), &[]);
        assert_eq!(reply.status, 200);
        assert!(imf_date(&reply, "last-modified") <= imf_date(&reply, "date"));
    } else {
        eprintln!("this tmpfs cannot hold year 10001: that case is not checked");
    }
    // Before year 0 there is no date to show: no Last-Modified, and If-Modified-Since (which
    // needs one, RFC 9110 §13.1.3) is ignored.
    let ancient = UNIX_EPOCH - Duration::from_secs(63_000_000_000);
    if try_set_modified(&path, ancient) {
        let reply = fetch(
            &daemon,
            "GET",
            &files("t/odd.txt"),
            &[("If-Modified-Since", "Fri, 31 Dec 9999 23:59:59 GMT")],
        );
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("last-modified"), None);
        assert_eq!(reply.body, b"odd");
        assert!(reply.header("etag").is_some());
    } else {
        eprintln!("this tmpfs cannot hold a year before 0: that case is not checked");
    }
}

// ---- the token in the environment (issue 13) ----

fn environ_of(pid: i32) -> Vec<u8> {
    std::fs::read(format!("/proc/{pid}/environ")).unwrap()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn the_access_token_from_the_environment_is_not_left_in_proc_environ() {
    const SECRET: &str = "env-secret-7f3a9c1e5b";
    let daemon = builder()
        .no_token()
        .env("SANDBOXD_ACCESS_TOKEN", SECRET)
        .env("SANDBOXD_TEST_NEIGHBOUR", "still-here")
        .start();
    write_file(&daemon.home().join("a.txt"), b"guarded");
    // The token was read: it guards the files.
    let reply = send(
        &daemon,
        "GET",
        &files("a.txt"),
        &[("X-Access-Token", SECRET)],
    );
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, b"guarded");
    assert_eq!(send(&daemon, "GET", &files("a.txt"), &[]).status, 401);
    // ... and it is gone from what /proc shows of the environment; the rest is intact.
    let environ = environ_of(daemon.pid());
    assert!(
        !contains(&environ, SECRET.as_bytes()),
        "the token is in /proc/<pid>/environ"
    );
    assert!(contains(&environ, b"SANDBOXD_TEST_NEIGHBOUR=still-here"));
    let envs = send(&daemon, "GET", "/envs", &[("X-Access-Token", SECRET)]);
    assert_eq!(envs.status, 200);
    assert!(!envs.text().contains(SECRET));

    // With --access-token-file the file wins, and a token also in the environment is scrubbed.
    const OTHER: &str = "ignored-env-secret-99";
    let daemon = builder().env("SANDBOXD_ACCESS_TOKEN", OTHER).start();
    assert_eq!(daemon.get("/envs").status, 200);
    assert!(!contains(&environ_of(daemon.pid()), OTHER.as_bytes()));
}
