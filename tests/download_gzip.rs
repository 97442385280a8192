//! GET and HEAD /files with `Accept-Encoding` (SPEC §6, "Compressed answers"): the gzip form,
//! decoded here with flate2 and by curl and compared with the file; when it is not sent; its
//! ETag and 304s; a stalled reader, a full house of compressed downloads, a file that shrinks.

use std::fs;
use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use flate2::read::GzDecoder;

use crate::common::*;

const MIB: usize = 1 << 20;
/// `api::download::gzip::MIN_SIZE`: smaller files are never worth compressing.
const MIN_SIZE: usize = 1024;
/// `api::download::gzip::MAX_DOWNLOADS`.
const MAX_DOWNLOADS: usize = 32;

fn files(path: &str) -> String {
    format!("/files?path={}&username=user", enc(path))
}

/// `method` of `target` with the token and `extra` headers, `Connection: close`; the body as
/// sent (chunked framing included), nothing read after a HEAD's head.
fn fetch(daemon: &Daemon, method: &str, target: &str, extra: &[(&str, &str)]) -> Reply {
    let mut headers = vec![("X-Access-Token", TOKEN)];
    headers.extend_from_slice(extra);
    daemon.call_with(method, target, &headers, b"")
}

fn get(daemon: &Daemon, target: &str, accept: &str) -> Reply {
    fetch(daemon, "GET", target, &[("Accept-Encoding", accept)])
}

/// Log-like text of `len` bytes: timestamps, levels, ids and numbers that vary line by line, so
/// it compresses as real logs do (to about a quarter), not as zeros.
fn text(len: usize) -> Vec<u8> {
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let levels = ["INFO", "WARN", "DEBUG", "ERROR"];
    let mut out = Vec::with_capacity(len + 200);
    let mut line = 0u64;
    while out.len() < len {
        let r = next();
        line += 1;
        let level = levels[usize::try_from(r % 4).unwrap()];
        writeln!(
            out,
            "{}.{:06} {level:5} req={:08x} GET /files?path=/home/user/data/{}.csv status=200 \
             bytes={} took={}.{:03}ms",
            1_700_000_000 + line / 100,
            r % 1_000_000,
            r >> 32,
            r % 10_000,
            (r >> 8) % 1_000_000,
            (r >> 16) % 100,
            (r >> 24) % 1000
        )
        .unwrap();
    }
    out.truncate(len);
    out
}

/// Bytes that do not compress (for answers that must stay large on the wire).
pub fn noise(len: usize) -> Vec<u8> {
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    (0..len)
        .map(|_| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng.to_le_bytes()[3]
        })
        .collect()
}

/// The data of a chunked body, and whether it ended with the last chunk.
pub fn dechunk(mut body: &[u8]) -> (Vec<u8>, bool) {
    let mut data = Vec::new();
    loop {
        let Some(end) = body.windows(2).position(|w| w == b"\r\n") else {
            return (data, false);
        };
        let size_text = std::str::from_utf8(&body[..end]).unwrap();
        let size = usize::from_str_radix(size_text, 16).unwrap();
        body = &body[end + 2..];
        if size == 0 {
            return (data, body == b"\r\n");
        }
        if body.len() < size + 2 {
            data.extend_from_slice(&body[..size.min(body.len())]);
            return (data, false);
        }
        data.extend_from_slice(&body[..size]);
        assert_eq!(&body[size..size + 2], b"\r\n");
        body = &body[size + 2..];
    }
}

/// The decoded bytes of a complete gzip stream (CRC and length checked by the decoder); panics
/// on anything else, trailing bytes included.
pub fn gunzip(gzip: &[u8]) -> Vec<u8> {
    let mut decoder = GzDecoder::new(gzip);
    let mut out = Vec::new();
    decoder.read_to_end(&mut out).expect("a valid gzip stream");
    let rest = decoder.into_inner();
    assert!(
        rest.is_empty(),
        "{} bytes after the gzip stream",
        rest.len()
    );
    out
}

/// Asserts `reply` is the gzip form of `contents`: headers and body.
fn assert_gzip_of(reply: &Reply, contents: &[u8]) {
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("content-encoding"), Some("gzip"));
    assert_eq!(reply.header("vary"), Some("Accept-Encoding, Origin"));
    assert_eq!(reply.header("transfer-encoding"), Some("chunked"));
    assert_eq!(reply.header("content-length"), None);
    assert_eq!(reply.header("accept-ranges"), None);
    let etag = reply.header("etag").unwrap();
    assert!(
        etag.starts_with("W/\"") && etag.ends_with("-gzip\""),
        "{etag}"
    );
    let (gzip, complete) = dechunk(&reply.body);
    assert!(complete, "the chunked body ended with its last chunk");
    assert!(
        gunzip(&gzip) == contents,
        "the gzip body decodes to the file"
    );
}

/// Asserts `reply` is the file as it is (sent with sendfile, `Content-Length`).
fn assert_identity_of(reply: &Reply, contents: &[u8]) {
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("content-encoding"), None);
    assert_eq!(reply.header("vary"), Some("Accept-Encoding, Origin"));
    assert_eq!(
        reply.header("content-length"),
        Some(contents.len().to_string().as_str())
    );
    assert!(reply.body == contents, "the body is the file");
}

#[test]
fn gzip_is_sent_to_a_client_that_asks_and_decodes_to_the_file() {
    let daemon = start();
    let contents = text(300_000);
    write_file(&daemon.home().join("app.log"), &contents);
    let target = files("app.log");
    let plain = fetch(&daemon, "GET", &target, &[]);
    assert_identity_of(&plain, &contents);
    let strong = plain.header("etag").unwrap().to_owned();
    let gzip = get(&daemon, &target, "gzip");
    assert_gzip_of(&gzip, &contents);
    // The same version's two forms: the gzip tag is the file's, weak, with `-gzip`.
    let opaque = strong.trim_matches('"');
    assert_eq!(
        gzip.header("etag"),
        Some(format!("W/\"{opaque}-gzip\"").as_str())
    );
    for name in [
        "content-type",
        "content-disposition",
        "last-modified",
        "x-content-type-options",
    ] {
        assert_eq!(gzip.header(name), plain.header(name), "{name}");
    }
    assert_eq!(gzip.header("content-type"), Some("text/plain"));
    let (body, _) = dechunk(&gzip.body);
    assert!(
        body.len() < contents.len() / 3,
        "{} of {}",
        body.len(),
        contents.len()
    );
    // The same file version compresses to the same bytes.
    assert_eq!(dechunk(&get(&daemon, &target, "gzip").body).0, body);
    // The gzip header: deflate, no name, no time, fastest, Unix.
    assert_eq!(&body[..10], &[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 3]);
}

#[test]
fn accept_encoding_is_read_with_its_weights() {
    let daemon = start();
    let contents = text(20_000);
    write_file(&daemon.home().join("a.txt"), &contents);
    let target = files("a.txt");
    for accept in [
        "gzip",
        "GZIP",
        "x-gzip",
        "gzip, deflate, br, zstd",
        "br;q=1, gzip;q=0.2",
        "*",
        "gzip, identity",
        "gzip;q=0.5, identity;q=0.5",
        "identity;q=0.5, gzip",
        "gzip ;\tQ=0.8",
    ] {
        let reply = get(&daemon, &target, accept);
        assert_eq!(reply.header("content-encoding"), Some("gzip"), "{accept}");
        assert_gzip_of(&reply, &contents);
    }
    for accept in [
        "",
        "identity",
        "br, zstd",
        "gzip;q=0",
        "gzip;q=0.000",
        "gzip;q=0, *",
        "gzip;q=0.5, identity",
        "gzip;q=0.5, *",
        // Unreadable: no preference, the file as it is.
        "gzip;q=2",
        "gzip;q=0.1234",
        "gzip;level=1",
        "gzip, identity;q=0, \"",
    ] {
        let reply = get(&daemon, &target, accept);
        assert_eq!(reply.header("content-encoding"), None, "{accept:?}");
        assert_identity_of(&reply, &contents);
    }
    // Several fields are one list.
    let reply = fetch(
        &daemon,
        "GET",
        &target,
        &[("Accept-Encoding", "br"), ("Accept-Encoding", "gzip")],
    );
    assert_gzip_of(&reply, &contents);
}

#[test]
fn a_client_that_refuses_identity_gets_gzip_or_406() {
    let daemon = start();
    let small = b"tiny\n".to_vec();
    write_file(&daemon.home().join("tiny.txt"), &small);
    write_file(&daemon.home().join("empty.txt"), b"");
    write_file(&daemon.home().join("p.png"), &noise(5000));
    let png = fs::read(daemon.home().join("p.png")).unwrap();
    // Not worth compressing, but the file as it is was refused.
    for (name, contents) in [
        ("tiny.txt", &small),
        ("empty.txt", &Vec::new()),
        ("p.png", &png),
    ] {
        for accept in ["gzip, identity;q=0", "gzip;q=0.1, *;q=0"] {
            let reply = get(&daemon, &files(name), accept);
            assert_gzip_of(&reply, contents);
        }
    }
    // Neither coding acceptable: 406, for HEAD as for GET.
    for accept in [
        "identity;q=0",
        "*;q=0",
        "br, identity;q=0",
        "gzip;q=0, *;q=0",
    ] {
        for method in ["GET", "HEAD"] {
            let reply = fetch(
                &daemon,
                method,
                &files("tiny.txt"),
                &[("Accept-Encoding", accept)],
            );
            if method == "GET" {
                let path = daemon.home().join("tiny.txt");
                reply.assert_error(
                    406,
                    &format!(
                        "no acceptable content coding for '{}': Accept-Encoding '{accept}' \
                         refuses both codings sandboxd sends, gzip and identity",
                        path.display()
                    ),
                );
            } else {
                assert_eq!(reply.status, 406, "{accept}");
            }
        }
    }
}

#[test]
fn small_and_compressed_files_are_sent_as_they_are() {
    let daemon = start();
    let home = daemon.home();
    let under = text(MIN_SIZE - 1);
    let at = text(MIN_SIZE);
    write_file(&home.join("under.txt"), &under);
    write_file(&home.join("at.txt"), &at);
    assert_identity_of(&get(&daemon, &files("under.txt"), "gzip"), &under);
    assert_gzip_of(&get(&daemon, &files("at.txt"), "gzip"), &at);
    // Already compressed formats, by their name's type, whatever their bytes.
    let contents = text(50_000);
    for name in [
        "a.png",
        "a.jpg",
        "a.webp",
        "a.mp4",
        "a.mp3",
        "a.gz",
        "a.tgz",
        "a.zip",
        "a.zst",
        "a.xz",
        "a.woff2",
        "a.pdf",
        "a.parquet",
    ] {
        write_file(&home.join(name), &contents);
        let reply = get(&daemon, &files(name), "gzip, deflate, br");
        assert_eq!(reply.header("content-encoding"), None, "{name}");
        assert_identity_of(&reply, &contents);
    }
    for name in [
        "a.svg", "a.json", "a.csv", "Makefile", "a.bin", "a.wasm", "a.tar",
    ] {
        write_file(&home.join(name), &contents);
        assert_gzip_of(&get(&daemon, &files(name), "gzip"), &contents);
    }
}

#[test]
fn range_requests_get_the_files_bytes() {
    let daemon = start();
    let contents = text(100_000);
    write_file(&daemon.home().join("r.txt"), &contents);
    let target = files("r.txt");
    let identity_etag = fetch(&daemon, "GET", &target, &[])
        .header("etag")
        .unwrap()
        .to_owned();
    let reply = fetch(
        &daemon,
        "GET",
        &target,
        &[("Accept-Encoding", "gzip"), ("Range", "bytes=1000-1999")],
    );
    assert_eq!(reply.status, 206);
    assert_eq!(reply.header("content-encoding"), None);
    assert_eq!(reply.header("vary"), Some("Accept-Encoding, Origin"));
    assert_eq!(
        reply.header("content-range"),
        Some("bytes 1000-1999/100000")
    );
    assert_eq!(reply.body, &contents[1000..2000]);
    // A Range that is ignored (several ranges) still keeps the answer plain.
    let reply = fetch(
        &daemon,
        "GET",
        &target,
        &[("Accept-Encoding", "gzip"), ("Range", "bytes=0-1,5-6")],
    );
    assert_identity_of(&reply, &contents);
    // If-Range alone too, matching or not.
    for validator in [identity_etag.as_str(), "\"other\""] {
        let reply = fetch(
            &daemon,
            "GET",
            &target,
            &[
                ("Accept-Encoding", "gzip"),
                ("If-Range", validator),
                ("Range", "bytes=0-9"),
            ],
        );
        assert_eq!(reply.header("content-encoding"), None, "{validator}");
    }
    // An unsatisfiable range is 416, varying like the rest.
    let reply = fetch(
        &daemon,
        "GET",
        &target,
        &[("Accept-Encoding", "gzip"), ("Range", "bytes=200000-")],
    );
    assert_eq!(reply.status, 416);
    assert_eq!(reply.header("vary"), Some("Accept-Encoding"));
    // Identity refused: the Range is ignored and the whole file comes compressed.
    let reply = fetch(
        &daemon,
        "GET",
        &target,
        &[
            ("Accept-Encoding", "gzip, identity;q=0"),
            ("Range", "bytes=0-9"),
        ],
    );
    assert_gzip_of(&reply, &contents);
    // HEAD ignores Range: the gzip form's headers.
    let reply = fetch(
        &daemon,
        "HEAD",
        &target,
        &[("Accept-Encoding", "gzip"), ("Range", "bytes=0-9")],
    );
    assert_eq!(reply.header("content-encoding"), Some("gzip"));
}

#[test]
fn head_has_the_headers_of_the_gzip_get_and_compresses_nothing() {
    let daemon = start();
    let contents = text(200_000);
    write_file(&daemon.home().join("h.txt"), &contents);
    let target = files("h.txt");
    let head = fetch(&daemon, "HEAD", &target, &[("Accept-Encoding", "gzip")]);
    let get = get(&daemon, &target, "gzip");
    let without_date = |reply: &Reply| -> Vec<(String, String)> {
        let mut headers: Vec<_> = reply
            .headers
            .iter()
            .filter(|(name, _)| !name.eq_ignore_ascii_case("date"))
            .cloned()
            .collect();
        headers.sort();
        headers
    };
    assert_eq!(head.status, 200);
    assert_eq!(without_date(&head), without_date(&get));
    assert_eq!(head.header("content-length"), None);
    assert_eq!(head.header("transfer-encoding"), Some("chunked"));
    assert!(head.body.is_empty());
    // A HEAD of the plain file still has its length.
    let head = fetch(&daemon, "HEAD", &target, &[]);
    assert_eq!(head.header("content-length"), Some("200000"));
    assert_eq!(head.header("vary"), Some("Accept-Encoding, Origin"));
}

#[test]
fn not_modified_against_either_form() {
    let daemon = start();
    let contents = text(10_000);
    write_file(&daemon.home().join("c.txt"), &contents);
    let target = files("c.txt");
    let plain = fetch(&daemon, "GET", &target, &[]);
    let gzip = get(&daemon, &target, "gzip");
    let strong = plain.header("etag").unwrap().to_owned();
    let weak = gzip.header("etag").unwrap().to_owned();
    let last_modified = plain.header("last-modified").unwrap().to_owned();
    // Either tag in If-None-Match is this version: 304, carrying the tag of the form the
    // request would have got.
    for (tag, accept, shown) in [
        (&weak, "gzip", &weak),
        (&strong, "gzip", &weak),
        (&weak, "identity", &strong),
        (&strong, "identity", &strong),
    ] {
        for method in ["GET", "HEAD"] {
            let reply = fetch(
                &daemon,
                method,
                &target,
                &[("Accept-Encoding", accept), ("If-None-Match", tag)],
            );
            assert_eq!(reply.status, 304, "{method} {tag} {accept}");
            assert_eq!(reply.header("etag"), Some(shown.as_str()));
            assert_eq!(reply.header("vary"), Some("Accept-Encoding, Origin"));
            assert_eq!(reply.header("last-modified"), Some(last_modified.as_str()));
            assert!(reply.body.is_empty());
        }
    }
    let reply = fetch(
        &daemon,
        "GET",
        &target,
        &[
            ("Accept-Encoding", "gzip"),
            ("If-Modified-Since", &last_modified),
        ],
    );
    assert_eq!(reply.status, 304);
    assert_eq!(reply.header("etag"), Some(weak.as_str()));
    // Another version's tag: the answer, compressed.
    let reply = fetch(
        &daemon,
        "GET",
        &target,
        &[
            ("Accept-Encoding", "gzip"),
            ("If-None-Match", "W/\"1-2-3-4-gzip\""),
        ],
    );
    assert_gzip_of(&reply, &contents);
    // If-Match compares the file's own strong tag: the weak gzip tag never passes.
    let reply = fetch(
        &daemon,
        "GET",
        &target,
        &[("Accept-Encoding", "gzip"), ("If-Match", &weak)],
    );
    assert_eq!(reply.status, 412);
    let reply = fetch(
        &daemon,
        "GET",
        &target,
        &[("Accept-Encoding", "gzip"), ("If-Match", &strong)],
    );
    assert_gzip_of(&reply, &contents);
}

#[test]
fn signed_urls_get_the_plain_file_unless_they_ask() {
    let daemon = start();
    let contents = text(30_000);
    let path = daemon.home().join("s.txt");
    write_file(&path, &contents);
    let target = daemon.sign(&path.to_string_lossy(), &["--username", "user"]);
    let plain = daemon.call_with("GET", &target, &[], b"");
    assert_identity_of(&plain, &contents);
    let identity = daemon.call_with("GET", &target, &[("Accept-Encoding", "identity")], b"");
    assert_identity_of(&identity, &contents);
    let gzip = daemon.call_with("GET", &target, &[("Accept-Encoding", "gzip")], b"");
    assert_gzip_of(&gzip, &contents);
}

#[test]
fn curl_compressed_decodes_the_answer() {
    if Command::new("curl").arg("--version").output().is_err() {
        eprintln!("skipped: no curl");
        return;
    }
    let daemon = start();
    let contents = text(3 * MIB + 12_345);
    write_file(&daemon.home().join("big.log"), &contents);
    let out = daemon.dir.path().join("out");
    let url = format!("http://{}{}", daemon.addr, files("big.log"));
    let status = Command::new("curl")
        .args(["-sS", "--fail", "--compressed", "-D"])
        .arg(daemon.dir.path().join("headers"))
        .args(["-H", &format!("X-Access-Token: {TOKEN}"), "-o"])
        .arg(&out)
        .arg(&url)
        .status()
        .unwrap();
    assert!(status.success());
    let headers = fs::read_to_string(daemon.dir.path().join("headers")).unwrap();
    assert!(
        headers
            .to_ascii_lowercase()
            .contains("content-encoding: gzip"),
        "{headers}"
    );
    assert!(fs::read(&out).unwrap() == contents);
}

#[test]
fn an_http_1_0_client_gets_gzip_until_the_connection_closes() {
    let daemon = start();
    let contents = text(400_000);
    write_file(&daemon.home().join("old.txt"), &contents);
    let reply = daemon.raw(
        format!(
            "GET {} HTTP/1.0\r\nX-Access-Token: {TOKEN}\r\nAccept-Encoding: gzip\r\n\r\n",
            files("old.txt")
        )
        .as_bytes(),
    );
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-encoding"), Some("gzip"));
    assert_eq!(reply.header("transfer-encoding"), None);
    assert_eq!(reply.header("connection"), Some("close"));
    assert!(gunzip(&reply.body) == contents);
}

/// Sends a gzip GET of `target` and reads its head only; the body is left in the socket.
pub fn start_gzip_download(
    daemon: &Daemon,
    target: &str,
    accept: &str,
) -> (BufReader<TcpStream>, Reply) {
    let mut stream = daemon.connect();
    write!(
        stream,
        "GET {target} HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\n\
         Accept-Encoding: {accept}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reader = BufReader::new(stream);
    let head = read_reply(&mut reader, true).expect("an answer");
    (reader, head)
}

pub fn rest_of(reader: &mut BufReader<TcpStream>) -> Vec<u8> {
    let mut body = Vec::new();
    let _ = reader.read_to_end(&mut body);
    body
}

/// Resident memory of `pid`, KiB.
pub fn rss_kib(pid: i32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn stalled_gzip_readers_hold_no_thread_and_little_memory() {
    let daemon = builder().arg("--workers").arg("2").start();
    let contents = text(64 * MIB);
    write_file(&daemon.home().join("big.log"), &contents);
    let target = files("big.log");
    let before = rss_kib(daemon.pid());
    // Four readers that take nothing: twice as many as there are compressing threads.
    let mut stalled: Vec<_> = (0..4)
        .map(|_| {
            let (reader, head) = start_gzip_download(&daemon, &target, "gzip");
            assert_eq!(head.header("content-encoding"), Some("gzip"));
            reader
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    for _ in 0..5 {
        assert_health_within(&daemon, Duration::from_secs(1));
    }
    // Another compressed download goes through while they wait.
    let small = text(200_000);
    write_file(&daemon.home().join("small.log"), &small);
    let started = Instant::now();
    assert_gzip_of(&get(&daemon, &files("small.log"), "gzip"), &small);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // Each stalled download holds its queue and a chunk, not the file's worth.
    let grown = rss_kib(daemon.pid()).saturating_sub(before);
    assert!(grown < 16 * 1024, "RSS grew by {grown} KiB");
    // Then one reads: every byte arrives, the rest are dropped.
    let body = rest_of(&mut stalled[0]);
    let (gzip, complete) = dechunk(&body);
    assert!(complete);
    assert!(
        gunzip(&gzip) == contents,
        "the stalled download arrived whole"
    );
    drop(stalled);
    assert_health_within(&daemon, Duration::from_secs(1));
}

#[test]
fn a_file_that_shrinks_while_compressed_cuts_the_answer() {
    let daemon = start();
    let path = daemon.home().join("shrinking.log");
    write_file(&path, &text(64 * MIB));
    let (mut reader, head) = start_gzip_download(&daemon, &files("shrinking.log"), "gzip");
    assert_eq!(head.header("content-encoding"), Some("gzip"));
    // The compressor stops when the socket and the queue are full: far before the end.
    std::thread::sleep(Duration::from_millis(300));
    fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(MIB as u64)
        .unwrap();
    let body = rest_of(&mut reader);
    let (gzip, complete) = dechunk(&body);
    assert!(!complete, "no last chunk: the client sees the answer cut");
    let mut decoded = Vec::new();
    let result = GzDecoder::new(&gzip[..]).read_to_end(&mut decoded);
    assert!(result.is_err(), "the gzip stream is not complete either");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !daemon.log().iter().any(|l| {
        l.contains("gzip download of '") && l.contains("cut: the file shrank to 1048576 bytes")
    }) {
        assert!(Instant::now() < deadline, "{:?}", daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_health_within(&daemon, Duration::from_secs(1));
}

#[test]
fn past_the_bound_on_compressed_downloads_the_plain_file_or_503() {
    let daemon = start();
    // Incompressible bytes in a text file, more than the socket buffers take (about 4 MiB
    // here): each stalled answer stays unfinished.
    let contents = noise(16 * MIB);
    write_file(&daemon.home().join("n.txt"), &contents);
    let target = files("n.txt");
    let held: Vec<_> = (0..MAX_DOWNLOADS)
        .map(|_| {
            let (reader, head) = start_gzip_download(&daemon, &target, "gzip");
            assert_eq!(head.header("content-encoding"), Some("gzip"));
            reader
        })
        .collect();
    // One more: the plain file, whole, or 503 for a client that refuses it.
    assert_identity_of(&get(&daemon, &target, "gzip"), &contents);
    let reply = get(&daemon, &target, "gzip, identity;q=0");
    reply.assert_error(
        503,
        &format!(
            "too many compressed downloads under way (at most {MAX_DOWNLOADS}): try again \
             later, or accept identity"
        ),
    );
    let reply = fetch(
        &daemon,
        "HEAD",
        &target,
        &[("Accept-Encoding", "gzip, identity;q=0")],
    );
    assert_eq!(reply.status, 503);
    // Small and plain answers are not held back.
    write_file(&daemon.home().join("t.txt"), b"tiny");
    assert_identity_of(&get(&daemon, &files("t.txt"), "gzip"), b"tiny");
    // The clients leave: their places come back.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = fetch(&daemon, "HEAD", &target, &[("Accept-Encoding", "gzip")]);
        if reply.header("content-encoding") == Some("gzip") {
            break;
        }
        assert!(Instant::now() < deadline, "the places never came back");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut reader = start_gzip_download(&daemon, &target, "gzip").0;
    let (gzip, complete) = dechunk(&rest_of(&mut reader));
    assert!(complete);
    assert!(gunzip(&gzip) == contents);
}

#[test]
fn stalled_compressed_downloads_give_their_places_back_at_the_send_timeout() {
    let daemon = builder().arg("--send-timeout").arg("1").start();
    // Larger than what the socket buffers take (about 4 MiB here), and incompressible.
    let contents = noise(16 * MIB);
    write_file(&daemon.home().join("n.txt"), &contents);
    let target = files("n.txt");
    let held: Vec<_> = (0..MAX_DOWNLOADS)
        .map(|_| start_gzip_download(&daemon, &target, "gzip").0)
        .collect();
    let refusing = [("Accept-Encoding", "gzip, identity;q=0")];
    assert_eq!(fetch(&daemon, "HEAD", &target, &refusing).status, 503);
    // Nobody reads: a second after its last progress each connection is closed, cut short
    // (its access-log line is written then), and its place comes back.
    let closed = || {
        daemon
            .log()
            .iter()
            .filter(|line| line.contains(" GET /files?path=n.txt"))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while closed() < MAX_DOWNLOADS {
        assert!(
            Instant::now() < deadline,
            "{} of {MAX_DOWNLOADS} closed",
            closed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(fetch(&daemon, "HEAD", &target, &refusing).status, 200);
    for mut reader in held {
        let (gzip, complete) = dechunk(&rest_of(&mut reader));
        assert!(
            !complete && gzip.len() < contents.len(),
            "{complete} {} of {}",
            gzip.len(),
            contents.len()
        );
    }
    // All of them again: every place came back.
    let again: Vec<_> = (0..MAX_DOWNLOADS)
        .map(|_| start_gzip_download(&daemon, &target, "gzip").1)
        .collect();
    for head in again {
        assert_eq!(head.header("content-encoding"), Some("gzip"));
    }
}
