//! Connect's gzip, as connect-go speaks it (SPEC §9b, issue 22): compressed request bodies and
//! messages are inflated (bounded), answers are compressed for clients that accept gzip when
//! they are worth it, codings sandboxd does not take are 501 naming the one it does, and a large
//! compressed `StreamInput` message is applied as it arrives, in both codecs.

use std::io::{Read, Write};

use flate2::write::GzEncoder;
use flate2::Compression;
use serde_json::{json, Value};

use crate::common::connect::envelope;
use crate::common::{start, Daemon, Reply, TOKEN};

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// A call (on a connection closed after it), its body de-chunked.
fn call(daemon: &Daemon, procedure: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    let mut all = vec![
        ("X-Access-Token", TOKEN),
        ("Authorization", "Basic cm9vdDo="),
    ];
    all.extend_from_slice(headers);
    let mut reply = daemon.call_with("POST", &format!("/{procedure}"), &all, body);
    if reply.header("transfer-encoding") == Some("chunked") {
        reply.body = dechunk(&reply.body);
    }
    reply
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = raw.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = std::str::from_utf8(&raw[..line_end]).unwrap();
        let size = usize::from_str_radix(size, 16).unwrap();
        raw = &raw[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

/// The envelopes of a stream's body: (flags, message).
fn envelopes(mut body: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    while !body.is_empty() {
        assert!(body.len() >= 5, "{body:?}");
        let len = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
        out.push((body[0], body[5..5 + len].to_vec()));
        body = &body[5 + len..];
    }
    out
}

fn error_code(reply: &Reply) -> String {
    reply.json()["code"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_gzip_unary_request_is_read_and_a_large_answer_compressed_for_who_accepts_it() {
    let daemon = start();
    let dir = daemon.home().join("many");
    std::fs::create_dir(&dir).unwrap();
    for i in 0..50 {
        std::fs::write(dir.join(format!("file-{i:03}.txt")), b"x").unwrap();
    }
    let path = dir.to_str().unwrap();
    let body = gzip(json!({ "path": path }).to_string().as_bytes());
    let json_headers = [
        ("Content-Type", "application/json"),
        ("Content-Encoding", "gzip"),
        ("Accept-Encoding", "gzip"),
    ];
    let listed = call(
        &daemon,
        "filesystem.Filesystem/ListDir",
        &json_headers,
        &body,
    );
    assert_eq!(listed.status, 200, "{}", listed.text());
    assert_eq!(listed.header("content-encoding"), Some("gzip"));
    assert_eq!(listed.header("content-type"), Some("application/json"));
    let entries: Value = serde_json::from_slice(&gunzip(&listed.body)).unwrap();
    assert_eq!(entries["entries"].as_array().unwrap().len(), 50);
    // Under 1 KiB: sent as it is, whatever the client accepts.
    let stat = call(&daemon, "filesystem.Filesystem/Stat", &json_headers, &body);
    assert_eq!(stat.status, 200, "{}", stat.text());
    assert_eq!(stat.header("content-encoding"), None);
    assert_eq!(stat.json()["entry"]["name"], "many");
    // Not accepted: not compressed.
    let plain = call(
        &daemon,
        "filesystem.Filesystem/ListDir",
        &[("Content-Type", "application/json")],
        json!({ "path": path }).to_string().as_bytes(),
    );
    assert_eq!(plain.header("content-encoding"), None);
    assert_eq!(plain.json()["entries"].as_array().unwrap().len(), 50);
}

#[test]
fn codings_sandboxd_does_not_take_are_501_naming_gzip() {
    let daemon = start();
    let unary = call(
        &daemon,
        "filesystem.Filesystem/Stat",
        &[
            ("Content-Type", "application/json"),
            ("Content-Encoding", "br"),
        ],
        b"{}",
    );
    assert_eq!(unary.status, 501);
    assert_eq!(error_code(&unary), "unimplemented");
    assert_eq!(unary.header("accept-encoding"), Some("gzip"));
    assert!(unary
        .text()
        .contains("Content-Encoding 'br' is not supported"));
    let stream = call(
        &daemon,
        "process.Process/Start",
        &[
            ("Content-Type", "application/connect+json"),
            ("Connect-Content-Encoding", "zstd"),
        ],
        &envelope(0, br#"{"process":{"cmd":"true"}}"#),
    );
    assert_eq!(stream.status, 501);
    assert_eq!(error_code(&stream), "unimplemented");
    assert_eq!(stream.header("connect-accept-encoding"), Some("gzip"));
}

#[test]
fn a_gzip_bomb_and_broken_gzip_are_refused() {
    let daemon = start();
    let bomb = gzip(&vec![b' '; (4 << 20) + 1]);
    assert!(bomb.len() < 64 << 10);
    let headers = [
        ("Content-Type", "application/json"),
        ("Content-Encoding", "gzip"),
    ];
    let reply = call(&daemon, "filesystem.Filesystem/Stat", &headers, &bomb);
    assert_eq!(reply.status, 429, "{}", reply.text());
    assert_eq!(error_code(&reply), "resource_exhausted");
    let reply = call(&daemon, "filesystem.Filesystem/Stat", &headers, b"not gzip");
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(reply.text().contains("malformed gzip message"));
    // A message flagged compressed in a stream that named no encoding: its end-of-stream error.
    let reply = call(
        &daemon,
        "process.Process/Start",
        &[("Content-Type", "application/connect+json")],
        &envelope(1, &gzip(br#"{"process":{"cmd":"true"}}"#)),
    );
    assert_eq!(reply.status, 200);
    let messages = envelopes(&reply.body);
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].0, 2);
    let end: Value = serde_json::from_slice(&messages[0].1).unwrap();
    assert_eq!(end["error"]["code"], "invalid_argument");
    assert!(end["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Connect-Content-Encoding"));
}

#[test]
fn a_stream_with_gzip_both_ways_compresses_only_what_is_worth_it() {
    let daemon = start();
    let request = json!({"process": {"cmd": "/bin/sh", "args": ["-c", "head -c 5000 /dev/zero | tr '\\0' a; echo; echo small >&2"]}, "stdin": false});
    let reply = call(
        &daemon,
        "process.Process/Start",
        &[
            ("Content-Type", "application/connect+json"),
            ("Connect-Content-Encoding", "gzip"),
            ("Connect-Accept-Encoding", "gzip"),
        ],
        &envelope(1, &gzip(request.to_string().as_bytes())),
    );
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("connect-content-encoding"), Some("gzip"));
    assert_eq!(
        reply.header("content-type"),
        Some("application/connect+json")
    );
    let mut stdout = Vec::new();
    let mut flags_seen = Vec::new();
    for (flags, message) in envelopes(&reply.body) {
        flags_seen.push(flags);
        let message = if flags & 1 != 0 {
            gunzip(&message)
        } else {
            message
        };
        let value: Value = serde_json::from_slice(&message).unwrap();
        if flags & 2 != 0 {
            assert_eq!(value, json!({}), "a clean end");
            continue;
        }
        // Compressed exactly when the message is 1 KiB or more (output comes in pieces of
        // whatever size the pipe gave).
        assert_eq!(flags == 1, message.len() >= 1024, "{flags}: {value}");
        if let Some(data) = value["event"]["data"]["stdout"].as_str() {
            stdout.extend(base64_simd::STANDARD.decode_to_vec(data).unwrap());
        }
    }
    assert!(
        flags_seen.contains(&1),
        "5 KiB of output in pieces: {flags_seen:?}"
    );
    let mut expected = vec![b'a'; 5000];
    expected.push(b'\n');
    assert_eq!(stdout, expected);
    assert_eq!(flags_seen.last(), Some(&2));
}

fn varint(mut n: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let low = u8::try_from(n & 0x7f).unwrap();
        n >>= 7;
        if n == 0 {
            out.push(low);
            return out;
        }
        out.push(low | 0x80);
    }
}

/// A length-delimited protobuf field.
fn field(number: u8, payload: &[u8]) -> Vec<u8> {
    [
        &[number << 3 | 2][..],
        &varint(payload.len() as u64),
        payload,
    ]
    .concat()
}

#[test]
fn a_large_compressed_stream_input_message_reaches_the_process_in_both_codecs() {
    let daemon = start();
    for codec in ["json", "proto"] {
        let target = daemon.home().join(format!("input-{codec}"));
        let script = format!("cat > {}", target.display());
        let mut started = crate::common::connect::Stream::open(
            &daemon,
            "process.Process/Start",
            &json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}, "stdin": true}),
            &[],
        );
        assert_eq!(started.status, 200);
        let pid = started.next().json["event"]["start"]["pid"]
            .as_u64()
            .unwrap();
        let input: Vec<u8> = (0..300_000u32).map(|i| (i % 7) as u8 + b'0').collect();
        let (start, data) = if codec == "json" {
            let start = json!({"start": {"process": {"pid": pid}}}).to_string();
            let text = base64_simd::STANDARD.encode_to_string(&input);
            let data = json!({"data": {"input": {"stdin": text}}}).to_string();
            (start.into_bytes(), data.into_bytes())
        } else {
            // start { process { pid } }, data { input { stdin } }
            let selector = [&[0x08][..], &varint(pid)].concat();
            let start = field(1, &field(1, &selector));
            (start, field(2, &field(2, &field(1, &input))))
        };
        let compressed = gzip(&data);
        assert!(compressed.len() < 64 << 10 && data.len() > 64 << 10);
        let mut body = envelope(0, &start);
        body.extend(envelope(1, &compressed));
        let content_type = format!("application/connect+{codec}");
        let reply = call(
            &daemon,
            "process.Process/StreamInput",
            &[
                ("Content-Type", &content_type),
                ("Connect-Content-Encoding", "gzip"),
            ],
            &body,
        );
        assert_eq!(reply.status, 200);
        let messages = envelopes(&reply.body);
        assert_eq!(messages.last().map(|m| m.0), Some(2), "{messages:?}");
        assert_eq!(
            messages.last().map(|m| m.1.as_slice()),
            Some(&b"{}"[..]),
            "{codec}: {}",
            String::from_utf8_lossy(&messages.last().unwrap().1)
        );
        let close = json!({"process": {"pid": pid}});
        let closed =
            crate::common::connect::unary(&daemon, "process.Process/CloseStdin", &[], &close);
        assert_eq!(closed.status, 200, "{}", closed.text());
        loop {
            let message = started.next();
            if message.end || message.json["event"].get("end").is_some() {
                break;
            }
        }
        assert_eq!(std::fs::read(&target).unwrap(), input, "{codec}");
    }
}
