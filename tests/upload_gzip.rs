//! `Content-Encoding: gzip` uploads (SPEC §8) against the real binary: raw, chunked and
//! multipart bodies inflated byte for byte, concatenated members, every kind of broken gzip
//! answered 400 with nothing placed, other codings 415, and a 1 GiB bomb that costs disk, not
//! memory.

use std::fs;
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;

use crate::common;
use crate::common::{
    enc, files_under, low_byte, temporaries, Daemon, Reply, TOKEN, USER_GID, USER_UID,
};
use flate2::write::GzEncoder;
use flate2::{Compress, Compression, Crc, FlushCompress};
use serde_json::json;

const MIB: usize = 1024 * 1024;

fn start() -> Daemon {
    common::builder().arg("--default-user").arg("user").start()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

/// Bytes that compress somewhat, with every value, CRLFs and dashes.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| match i % 97 {
            13 => b'\r',
            14 => b'\n',
            15 | 16 => b'-',
            _ => low_byte(i / 7).wrapping_mul(31).wrapping_add(seed),
        })
        .collect()
}

fn upload_gzip(daemon: &Daemon, path: &str, body: &[u8]) -> Reply {
    daemon.call_with(
        "POST",
        &format!("/files?path={}", enc(path)),
        &[
            ("X-Access-Token", TOKEN),
            ("Content-Type", "application/octet-stream"),
            ("Content-Encoding", "gzip"),
        ],
        body,
    )
}

fn record(daemon: &Daemon, name: &str) -> serde_json::Value {
    let path = daemon.home().join(name);
    json!({
        "path": path.to_string_lossy(),
        "name": path.file_name().unwrap().to_string_lossy(),
        "type": "file",
    })
}

fn multipart(boundary: &str, parts: &[(&str, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (filename, data) in parts {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; \
                 filename=\"{filename}\"\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    body
}

#[test]
fn a_gzip_raw_body_is_inflated_byte_exact_owned_by_the_user() {
    let daemon = start();
    let home = daemon.home();
    let data = pattern(1, 3 * MIB + 17);
    let body = gzip(&data);
    assert!(body.len() < data.len() / 4, "{}", body.len());
    let reply = upload_gzip(&daemon, "dir/inflated.bin", &body);
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json(), json!([record(&daemon, "dir/inflated.bin")]));
    assert_eq!(fs::read(home.join("dir/inflated.bin")).unwrap(), data);
    let meta = fs::metadata(home.join("dir/inflated.bin")).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o644);
    if common::root_or_skip("checking the owner set by chown needs root") {
        assert_eq!((meta.uid(), meta.gid()), (USER_UID, USER_GID));
    }
    // Replacing an existing file keeps its permission bits, as a plain upload does.
    fs::set_permissions(
        home.join("dir/inflated.bin"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    assert_eq!(
        upload_gzip(&daemon, "dir/inflated.bin", &gzip(b"again")).status,
        200
    );
    assert_eq!(fs::read(home.join("dir/inflated.bin")).unwrap(), b"again");
    let mode = fs::metadata(home.join("dir/inflated.bin")).unwrap().mode();
    assert_eq!(mode & 0o7777, 0o600);
    // An empty file, and `x-gzip` (RFC 9110's old name) next to `identity`.
    assert_eq!(upload_gzip(&daemon, "empty", &gzip(b"")).status, 200);
    assert_eq!(fs::read(home.join("empty")).unwrap(), b"");
    let reply = daemon.call_with(
        "POST",
        "/files?path=x.txt",
        &[
            ("X-Access-Token", TOKEN),
            ("Content-Encoding", "identity, X-GZIP"),
        ],
        &gzip(b"old name"),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(fs::read(home.join("x.txt")).unwrap(), b"old name");
    assert!(temporaries(&home).is_empty());
}

#[test]
fn concatenated_members_are_one_stream_as_go_reads_them() {
    let daemon = start();
    let mut body = gzip(b"first member, ");
    body.extend(gzip(b""));
    body.extend(gzip(&pattern(2, 100_000)));
    let reply = upload_gzip(&daemon, "members.bin", &body);
    assert_eq!(reply.status, 200, "{}", reply.text());
    let mut expected = b"first member, ".to_vec();
    expected.extend(pattern(2, 100_000));
    assert_eq!(
        fs::read(daemon.home().join("members.bin")).unwrap(),
        expected
    );
}

#[test]
fn a_chunked_gzip_body_is_inflated() {
    let daemon = start();
    let data = pattern(3, 2 * MIB);
    let body = gzip(&data);
    let mut request = format!(
        "POST /files?path=chunked.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\
         X-Access-Token: {TOKEN}\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    for piece in body.chunks(1000) {
        request.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        request.extend_from_slice(piece);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"0\r\n\r\n");
    let reply = daemon.raw(&request);
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(fs::read(daemon.home().join("chunked.bin")).unwrap(), data);
}

#[test]
fn a_gzip_multipart_body_is_inflated_and_its_parts_placed_together() {
    let daemon = start();
    let home = daemon.home();
    let a = pattern(4, 700_000);
    let b = pattern(5, MIB);
    let body = multipart("gz-7Qz9", &[("a.bin", &a), ("sub/b.bin", &b)]);
    let reply = daemon.call_with(
        "POST",
        "/files",
        &[
            ("X-Access-Token", TOKEN),
            ("Content-Type", "multipart/form-data; boundary=gz-7Qz9"),
            ("Content-Encoding", "gzip"),
        ],
        &gzip(&body),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        reply.json(),
        json!([record(&daemon, "a.bin"), record(&daemon, "sub/b.bin")])
    );
    assert_eq!(fs::read(home.join("a.bin")).unwrap(), a);
    assert_eq!(fs::read(home.join("sub/b.bin")).unwrap(), b);

    // The multipart body is fine but its gzip trailer is not: no part lands.
    let body = multipart("gz-7Qz9", &[("c.bin", b"c"), ("d.bin", b"d")]);
    let mut broken = gzip(&body);
    let at = broken.len() - 8;
    broken[at] ^= 1;
    let reply = daemon.call_with(
        "POST",
        "/files",
        &[
            ("X-Access-Token", TOKEN),
            ("Content-Type", "multipart/form-data; boundary=gz-7Qz9"),
            ("Content-Encoding", "gzip"),
        ],
        &broken,
    );
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(!home.join("c.bin").exists() && !home.join("d.bin").exists());
    assert!(temporaries(&home).is_empty());
}

#[test]
fn broken_gzip_is_400_and_places_nothing() {
    let daemon = start();
    let home = daemon.home();
    common::write_file(&home.join("keep.bin"), b"previous");
    let before = files_under(daemon.dir.path());
    let data = pattern(6, 300_000);
    let good = gzip(&data);
    let crc_at = good.len() - 8;
    let with = |at: usize| {
        let mut body = good.clone();
        body[at] ^= 0x55;
        body
    };
    let mut trailing = good.clone();
    trailing.extend_from_slice(b"garbage");
    let mut padded = good.clone();
    padded.extend_from_slice(&[0; 16]);
    let checksum = {
        let mut crc = Crc::new();
        crc.update(&data);
        crc.sum()
    };
    let cases: Vec<(&str, Vec<u8>, String)> = vec![
        (
            "not gzip",
            data[..1000].to_vec(),
            "not gzip data: it does not start with 1f 8b".into(),
        ),
        (
            "empty",
            Vec::new(),
            "the body is empty, with no gzip header".into(),
        ),
        (
            "cut in the header",
            good[..5].to_vec(),
            "truncated: the body ended inside a gzip header".into(),
        ),
        (
            "cut in the data",
            good[..good.len() / 2].to_vec(),
            "truncated: the body ended inside a gzip deflate stream".into(),
        ),
        (
            "cut in the trailer",
            good[..good.len() - 3].to_vec(),
            "truncated: the body ended inside a gzip trailer".into(),
        ),
        (
            "trailing garbage",
            trailing,
            "trailing data after the gzip stream".into(),
        ),
        (
            "zero padding",
            padded,
            "trailing data after the gzip stream".into(),
        ),
        (
            "CRC-32",
            with(crc_at),
            format!(
                "CRC-32 mismatch: the trailer says {:08x}, the data has {checksum:08x}",
                checksum ^ 0x55
            ),
        ),
        (
            "length",
            with(crc_at + 4),
            format!(
                "length mismatch: the trailer says {} bytes (mod 2^32), the data has {}",
                data.len() ^ 0x55,
                data.len()
            ),
        ),
        (
            "method",
            with(2),
            "compression method 93 is not deflate (8)".into(),
        ),
    ];
    for (what, body, reason) in &cases {
        let reply = upload_gzip(&daemon, "keep.bin", body);
        assert_eq!(reply.status, 400, "{what}: {}", reply.text());
        reply.assert_error(400, &format!("invalid gzip body: {reason}"));
        assert_eq!(files_under(daemon.dir.path()), before, "{what}");
        assert!(temporaries(&home).is_empty(), "{what}");
        assert_eq!(common::unnamed_files(daemon.pid(), &home), 0, "{what}");
    }
    // Corrupt deflate data: the message is the inflater's.
    let mut corrupt = good[..10].to_vec();
    corrupt.extend_from_slice(&[0xff; 64]);
    let reply = upload_gzip(&daemon, "new.bin", &corrupt);
    assert_eq!(reply.status, 400, "{}", reply.text());
    let message = reply.json()["message"].as_str().unwrap().to_owned();
    assert!(
        message.starts_with("invalid gzip body: corrupt deflate data: "),
        "{message}"
    );
    // Corruption early in a large body: answered while the client still sends.
    let big = gzip(&pattern(7, 16 * MIB));
    let mut early = big.clone();
    early[200] ^= 0xff;
    let reply = upload_gzip(&daemon, "keep.bin", &early);
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert_eq!(files_under(daemon.dir.path()), before);
    assert!(temporaries(&home).is_empty());
    common::assert_health_within(&daemon, std::time::Duration::from_secs(5));
}

#[test]
fn other_codings_are_415_naming_the_supported_ones() {
    let daemon = start();
    let before = files_under(daemon.dir.path());
    for (coding, what) in [
        ("br", "'br'"),
        ("deflate", "'deflate'"),
        ("zstd", "'zstd'"),
        ("compress", "'compress'"),
        ("something-else", "'something-else'"),
        ("gzip, gzip", "gzip applied twice"),
        ("gzip, br", "'br'"),
    ] {
        let reply = daemon.call_with(
            "POST",
            "/files?path=coded.bin",
            &[("X-Access-Token", TOKEN), ("Content-Encoding", coding)],
            &gzip(b"x"),
        );
        reply.assert_error(
            415,
            &format!(
                "unsupported Content-Encoding {what}: the supported codings are identity and gzip"
            ),
        );
    }
    assert_eq!(files_under(daemon.dir.path()), before);
}

/// One gzip member holding `blocks` MiB of zeros, made without compressing them all: a full
/// flush resets the compressor, so every further MiB of zeros compresses to the same bytes.
fn zeros_bomb(blocks: usize) -> Vec<u8> {
    let zeros = vec![0u8; MIB];
    let mut deflate = Compress::new(Compression::best(), false);
    let mut block = |input: &[u8], flush| {
        let mut out = Vec::with_capacity(64 * 1024);
        let before = deflate.total_in();
        deflate.compress_vec(input, &mut out, flush).unwrap();
        assert_eq!(deflate.total_in() - before, input.len() as u64);
        out
    };
    let first = block(&zeros, FlushCompress::Full);
    let again = block(&zeros, FlushCompress::Full);
    assert_eq!(first, again, "a full flush makes every MiB compress alike");
    let end = block(&[], FlushCompress::Finish);
    let (mut crc, mut one) = (Crc::new(), Crc::new());
    one.update(&zeros);
    for _ in 0..blocks {
        crc.combine(&one);
    }
    let mut body = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3];
    for _ in 0..blocks {
        body.extend_from_slice(&first);
    }
    body.extend_from_slice(&end);
    body.extend_from_slice(&crc.sum().to_le_bytes());
    body.extend_from_slice(&crc.amount().to_le_bytes());
    body
}

fn vm_hwm_kib(pid: i32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn a_gzip_bomb_costs_disk_never_memory() {
    let daemon = start();
    let bomb = zeros_bomb(1024);
    assert!(bomb.len() < 2 * MIB, "{} bytes", bomb.len());
    let mut stream = daemon.connect();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(300)))
        .unwrap();
    write!(
        stream,
        "POST /files?path=bomb.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\
         X-Access-Token: {TOKEN}\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\n\r\n",
        bomb.len()
    )
    .unwrap();
    stream.write_all(&bomb).unwrap();
    let reply = common::read_reply(&mut BufReader::new(stream), false).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    let peak = vm_hwm_kib(daemon.pid());
    eprintln!(
        "a {} byte body inflated to 1 GiB; the daemon's peak RSS: {peak} KiB",
        bomb.len()
    );
    assert!(peak < 32 * 1024, "peak RSS {peak} KiB");
    let path = daemon.home().join("bomb.bin");
    let mut file = fs::File::open(&path).unwrap();
    assert_eq!(file.metadata().unwrap().len(), 1 << 30);
    // Zeros at a few places (the daemon checked the CRC of all of them).
    let mut buf = vec![0xffu8; 4096];
    for at in [0u64, 12_345_678, (1 << 29) + 1, (1 << 30) - 4096] {
        file.seek(SeekFrom::Start(at)).unwrap();
        file.read_exact(&mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0), "at {at}");
    }
}
