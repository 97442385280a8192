//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing` only, never in releases).
//!
//! Each function feeds arbitrary input to one parser and checks the invariants that must hold
//! for any input; a panic or a failed assertion is a finding.

use crate::api::download::{conditional, encoding, range};
use crate::http::query::{self, Query};
use crate::stats::{affinity, cgroup_detect, cgroup_v1, cgroup_v2, meminfo, proc_stat};

/// Query strings: decoding never panics; a redacted target never contains a signature value.
pub fn query(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = Query::parse(text);
    let _ = query::decode(text);
    let target = format!("/files?{text}");
    let redacted = query::redact_signature(&target);
    if let Ok(parsed) = Query::parse(redacted.split_once('?').map_or("", |(_, q)| q)) {
        assert!(parsed.get("signature").is_none(), "{target} -> {redacted}");
    }
}

/// `Range`, the conditional headers and `Accept-Encoding` against a file of a size taken from
/// the input. A coding is chosen only if the header accepts it.
pub fn range_and_conditions(data: &[u8]) {
    if data.len() < 8 {
        return;
    }
    let (size, rest) = data.split_at(8);
    let size = u64::from_le_bytes(size.try_into().unwrap_or([0; 8]));
    if let range::Range::Partial { start, end } = range::parse(rest, size) {
        assert!(start <= end && end < size, "{start}-{end} of {size}");
    }
    let text = String::from_utf8_lossy(rest);
    let mut parts = text.split('\n');
    let mut next = || parts.next();
    let conditions = conditional::Conditions {
        if_match: next(),
        if_none_match: next(),
        if_modified_since: next(),
        if_unmodified_since: next(),
        if_range: next(),
    };
    let accept = encoding::Accept::parse(Some(rest));
    for worth in [false, true] {
        match accept.choose(worth) {
            Some(encoding::Coding::Gzip) => assert!(accept.gzip_acceptable()),
            Some(encoding::Coding::Identity) => assert!(accept.identity_acceptable()),
            None => assert!(!accept.gzip_acceptable() && !accept.identity_acceptable()),
        }
    }
    let validators = conditional::Validators {
        etag: "\"1-2-3-4\"",
        other_form: Some("W/\"1-2-3-4-gzip\""),
        mtime: Some(1_700_000_000),
        now: 1_700_000_100,
    };
    let _ = conditional::evaluate(&conditions, &validators);
}

/// The JSON bodies of compose and init: deserialisation never panics.
pub fn json_bodies(data: &[u8]) {
    let _ = serde_json::from_slice::<crate::api::compose::ComposeBody>(data);
    let _ = serde_json::from_slice::<crate::api::init::InitBody>(data);
}

/// Every /proc and cgroup parser on the same text.
pub fn proc_and_cgroup(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = proc_stat::parse(&text);
    let _ = meminfo::parse(&text);
    let _ = affinity::parse_status(&text);
    let _ = cgroup_detect::parse_self_cgroup(&text);
    let _ = cgroup_detect::parse_mountinfo(&text);
    let _ = cgroup_v1::parse_limit_in_bytes(&text);
    let _ = cgroup_v1::parse_memory_stat(&text);
    let _ = cgroup_v1::parse_cfs_quota_us(&text);
    let _ = cgroup_v1::parse_cpuacct_usage(&text);
    let _ = cgroup_v2::parse_memory_max(&text);
    let _ = cgroup_v2::parse_memory_stat(&text);
    let _ = cgroup_v2::parse_cpu_max(&text);
    let _ = cgroup_v2::parse_cpu_stat_usage_usec(&text);
}

/// Multipart bodies: the `Content-Type` parameter parser, and a body whose parts must come out
/// the same whether it is fed whole or in pieces (boundaries straddling reads).
pub fn multipart(data: &[u8]) {
    use crate::http::multipart::{boundary, Parser};
    let _ = boundary(data);
    let Some((&len, rest)) = data.split_first() else {
        return;
    };
    let len = usize::from(len % 70) + 1;
    if rest.len() < len + 1 {
        return;
    }
    let (boundary, rest) = rest.split_at(len);
    let (&piece, body) = rest.split_first().unwrap_or((&1, &[]));
    let whole = parse_multipart(Parser::new(boundary), body, body.len().max(1));
    let split = parse_multipart(Parser::new(boundary), body, usize::from(piece % 32) + 1);
    assert_eq!(whole, split);
}

/// Each part's filename and data.
type Parts = Vec<(Option<String>, Vec<u8>)>;

/// Feeds `body` in pieces of `piece` bytes, keeping unconsumed bytes as a caller must; returns
/// each part's filename and data, or the error.
fn parse_multipart(
    mut parser: crate::http::multipart::Parser,
    body: &[u8],
    piece: usize,
) -> Result<Parts, crate::http::multipart::MultipartError> {
    use crate::http::multipart::Event;
    let mut parts: Parts = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut fed = 0;
    loop {
        let (used, event) = parser.advance(&pending)?;
        match event {
            Event::Part(head) => parts.push((head.filename, Vec::new())),
            Event::Data(range) => {
                if let Some((_, data)) = parts.last_mut() {
                    data.extend_from_slice(&pending[range]);
                }
            }
            Event::PartEnd => {}
            Event::End => return Ok(parts),
            Event::NeedMore if fed == body.len() => {
                parser.finish()?;
                return Ok(parts);
            }
            Event::NeedMore => {
                let end = (fed + piece).min(body.len());
                pending.drain(..used);
                pending.extend_from_slice(&body[fed..end]);
                fed = end;
                continue;
            }
        }
        pending.drain(..used);
    }
}

/// gzip bodies (`Content-Encoding: gzip` uploads): fed whole into a large buffer or in pieces
/// into a small one, the decoder must give the same bytes and the same verdict, and always
/// progress. The first byte picks the piece and buffer sizes; decoding stops at 64 MiB of
/// output so that a bomb in the corpus costs time, not the fuzzer's memory.
pub fn gzip(data: &[u8]) {
    let Some((&sizes, body)) = data.split_first() else {
        return;
    };
    let whole = inflate(body, body.len().max(1), 64 * 1024);
    let split = inflate(
        body,
        usize::from(sizes & 0x0f) + 1,
        usize::from(sizes >> 4) * 97 + 1,
    );
    assert_eq!(whole, split);
}

fn inflate(body: &[u8], piece: usize, out_len: usize) -> Result<Vec<u8>, String> {
    use crate::api::upload::gzip::Decoder;
    const LIMIT: usize = 64 << 20;
    let mut decoder = Decoder::default();
    let mut out = vec![0; out_len];
    let mut decoded = Vec::new();
    for mut chunk in body.chunks(piece) {
        loop {
            let (used, made) = decoder.feed(chunk, &mut out).map_err(|e| e.to_string())?;
            assert!(used <= chunk.len() && made <= out.len());
            assert!(used > 0 || made > 0 || chunk.is_empty(), "no progress");
            decoded.extend_from_slice(&out[..made]);
            if decoded.len() > LIMIT {
                return Err("over the limit".into());
            }
            chunk = &chunk[used..];
            if chunk.is_empty() && made < out.len() {
                break;
            }
        }
    }
    decoder.finish().map_err(|e| e.to_string())?;
    Ok(decoded)
}

/// Connect envelopes, and a large message read as it arrives: a request body that is one
/// message re-encodes to itself; a prefix that is accepted is within the limits; the streamed
/// reader gives the same verdict and bytes whether fed whole or in pieces (the first byte picks
/// their size), and the bytes a JSON parser reads from the same message.
pub fn connect_envelope(data: &[u8]) {
    use crate::connect::{envelope, streamed::StreamedBytes, MAX_REQUEST_BYTES};
    if let Ok((flags, message)) = envelope::single_message(data) {
        assert_eq!(envelope::encode(flags, message), data);
    }
    if let Ok(Some((flags, len))) = envelope::prefix(data) {
        let known = envelope::END_STREAM | envelope::COMPRESSED;
        assert!(len <= MAX_REQUEST_BYTES && flags & !known == 0);
    }
    const OPENINGS: &[&[u8]] = &[br#"{"a":{"b":""#, br#"{"c":""#];
    let Some((&step, body)) = data.split_first() else {
        return;
    };
    let read = |piece: usize| {
        let mut reader = StreamedBytes::new(OPENINGS);
        let mut out = Vec::new();
        for chunk in body.chunks(piece) {
            out.extend(reader.push(chunk)?);
        }
        reader.finish()?;
        Ok::<_, crate::connect::streamed::Refusal>((out, reader.opening()))
    };
    let whole = read(body.len().max(1));
    let split = read(usize::from(step % 16) + 1);
    assert_eq!(whole.is_ok(), split.is_ok(), "{whole:?} / {split:?}");
    let (Ok(whole), Ok(split)) = (whole, split) else {
        return;
    };
    assert_eq!(whole, split);
    let value: serde_json::Value =
        serde_json::from_slice(body).expect("a message the reader took is JSON");
    let text = match whole.1 {
        Some(0) => &value["a"]["b"],
        _ => &value["c"],
    };
    let text = text.as_str().expect("the field is a string");
    // Mixed alphabets are read here but not by the whole-message reader.
    if let Some(bytes) = crate::connect::json::bytes::decode(text) {
        assert_eq!(bytes, whole.0);
    }
}

/// proto3 JSON readers: integers in any form, enum values, base64 bytes, timestamps. An
/// integer read is read the same from its decimal string and its number; decoded bytes decode
/// the same once re-encoded; a timestamp is always RFC 3339 in UTC.
pub fn connect_json(data: &[u8]) {
    use crate::connect::json::{self, EnumValue};
    #[derive(serde::Deserialize)]
    struct Sample {
        #[serde(default, deserialize_with = "json::integer::deserialize")]
        a: i64,
        #[serde(default, deserialize_with = "json::integer::deserialize")]
        b: u32,
        #[serde(default)]
        e: Option<EnumValue>,
    }
    if let Ok(sample) = serde_json::from_slice::<Sample>(data) {
        for again in [
            format!(r#"{{"a":{},"b":{}}}"#, sample.a, sample.b),
            format!(r#"{{"a":"{}","b":"{}"}}"#, sample.a, sample.b),
        ] {
            let read: Sample = serde_json::from_str(&again).expect("an integer read back");
            assert_eq!((read.a, read.b), (sample.a, sample.b));
        }
        let _ = sample.e.map(|e| e.to_string());
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Some(bytes) = json::bytes::decode(text) {
            let again = base64_simd::STANDARD.encode_to_string(&bytes);
            assert_eq!(json::bytes::decode(&again), Some(bytes));
        }
    }
    if let Some((seconds, rest)) = data.split_first_chunk::<8>() {
        let nanos = rest
            .first_chunk::<4>()
            .map_or(0, |n| u32::from_le_bytes(*n));
        let stamp = json::timestamp(i64::from_le_bytes(*seconds), nanos);
        let shape = stamp.len() >= 20
            && stamp.ends_with('Z')
            && stamp.bytes().take(19).enumerate().all(|(i, b)| match i {
                4 | 7 => b == b'-',
                10 => b == b'T',
                13 | 16 => b == b':',
                _ => b.is_ascii_digit(),
            });
        assert!(shape && &stamp[..4] != "0000", "{stamp}");
    }
}

/// Connect's binary codec and gzip: every request message of both services read in both codecs
/// (what is read re-encodes to itself: `api::fuzz_requests`), a large `StreamInput` data message
/// read as it arrives the same as whole, and a gzip message inflated whole or in pieces alike
/// (the first byte picks their size), bounded, and re-deflated to the same bytes.
pub fn connect_proto(data: &[u8]) {
    use crate::connect::compression::{inflate, Deflater, Inflater};
    crate::api::fuzz_requests(data);
    let Some((&step, body)) = data.split_first() else {
        return;
    };
    let whole = inflate(body);
    let mut inflater = Inflater::default();
    let mut split = Vec::new();
    let pieces = body
        .chunks(usize::from(step) + 1)
        .try_for_each(|piece| inflater.push(piece).map(|out| split.extend(out)))
        .and_then(|()| inflater.finish());
    assert_eq!(whole.is_ok(), pieces.is_ok(), "{whole:?} / {pieces:?}");
    if let Ok(plain) = whole {
        assert!(plain.len() <= crate::connect::MAX_REQUEST_BYTES);
        assert_eq!(plain, split);
        let mut again = Vec::new();
        Deflater::default().gzip(&plain, &mut again);
        assert_eq!(inflate(&again).expect("its own gzip inflates"), plain);
    }
}

/// `/init`'s system-file editors. The hosts editor, with an address the first byte picks, over
/// the rest as a hosts file: editing its own output changes nothing, and the name then has
/// one line, the last. The CA bundle: validating never panics; a valid one, appended to the
/// input as a bundle, is appended once, kept by the same install, and gone after removal.
pub fn init_system_files(data: &[u8]) {
    use crate::platform::{ca_bundle, hosts};
    let Some((&pick, text)) = data.split_first() else {
        return;
    };
    let addresses = ["10.11.0.1", "10.11.0.2", "fd00::1", "::ffff:10.0.0.1"];
    let Ok(address) = addresses[usize::from(pick) % addresses.len()].parse() else {
        return;
    };
    let edited = hosts::set_entry(text, hosts::EVENTS_HOST, address);
    let settled = edited.as_deref().unwrap_or(text);
    assert!(
        hosts::set_entry(settled, hosts::EVENTS_HOST, address).is_none(),
        "not idempotent on {text:?}"
    );
    if let Some(edited) = &edited {
        let entry = format!("{:<16} {}", address.to_string(), hosts::EVENTS_HOST);
        let last = edited
            .strip_suffix(b"\n")
            .map(|rest| rest.strip_suffix(b"\r").unwrap_or(rest))
            .and_then(|rest| rest.rsplit(|&b| b == b'\n').next());
        assert_eq!(last, Some(entry.as_bytes()), "{edited:?}");
    }

    let Ok(pem) = ca_bundle::validate(&String::from_utf8_lossy(text)) else {
        return;
    };
    let pem = pem.as_bytes();
    let installed = ca_bundle::edit(text, &[], Some(pem)).unwrap_or_else(|| text.to_vec());
    assert!(installed.ends_with(pem));
    assert!(ca_bundle::edit(&installed, &[pem], Some(pem)).is_none());
    let removed = ca_bundle::edit(&installed, &[pem], None).unwrap_or(installed);
    assert!(!removed.windows(pem.len()).any(|window| window == pem));
}

/// The platform's other inputs, the first byte choosing: a live upgrade's handover (decoding
/// never panics; what decodes re-encodes to the same message; carried watchers' events and
/// paths are read as the new image reads them), a logs collector's address (an
/// accepted one has a path beginning with `/`), `/init`'s `volumeMounts` as JSON (accepted
/// mount points are normalised: absolute, no empty, `.` or `..` component, no trailing slash),
/// the metadata service's answer (an identity accepted has no control character, and one is
/// refused exactly when either id has one).
pub fn platform_inputs(data: &[u8]) {
    use prost::Message;
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    match pick % 4 {
        0 => {
            if let Ok(handover) = crate::upgrade::state::Handover::decode_checked(rest) {
                let again = crate::upgrade::state::Handover::decode(&*handover.encode_to_vec());
                assert_eq!(again.as_ref(), Ok(&handover));
                let _ = handover.app_state();
                // The forwards' checks, with no descriptor carried: every one fails, none panics.
                let mut none = crate::upgrade::carry::Inherited::default();
                let (_, adopted) = crate::platform::forward::relay::Restored::from_handover(
                    &handover.forwards,
                    &mut none,
                );
                assert_eq!(adopted.listeners + adopted.connections, 0);
                for watcher in &handover.watchers {
                    crate::api::filesystem::watch_carry::fuzz_carried(watcher);
                }
            }
        }
        3 => {
            if let Ok(opts) = crate::mmds::parse(rest) {
                let control = [&opts.instance_id, &opts.env_id]
                    .iter()
                    .any(|id| id.chars().any(char::is_control));
                assert_eq!(crate::mmds::check_identity(&opts).is_err(), control);
            }
        }
        1 => {
            if let Ok((_, path)) = crate::log::export::parse_address(&String::from_utf8_lossy(rest))
            {
                assert!(path.starts_with('/'), "{path}");
            }
        }
        _ => {
            let Ok(mounts) = serde_json::from_slice(rest) else {
                return;
            };
            if let Ok(Some(request)) = crate::platform::volumes::Request::parse(Some(mounts), None)
            {
                for point in request.mount_points() {
                    assert!(point.starts_with('/') && !point.ends_with('/'), "{point}");
                    assert!(
                        point[1..]
                            .split('/')
                            .all(|c| !c.is_empty() && c != "." && c != ".."),
                        "{point}"
                    );
                }
            }
        }
    }
}

/// Tar archives: the reader never panics, and gives the same members, data and outcome whether
/// the archive is fed whole or in pieces (the first byte picks the piece size). No member it
/// gives has a NUL byte in its name or link target (a pax `path` or `linkpath` with one is the
/// archive's error), so the unpacking's names always become C strings; and the unpacking's
/// name check takes any name without panicking.
pub fn tar(data: &[u8]) {
    let Some((&piece, archive)) = data.split_first() else {
        return;
    };
    let whole = read_tar(archive, archive.len().max(1));
    let split = read_tar(archive, usize::from(piece) + 1);
    assert_eq!(whole, split);
    for (entry, _) in &whole.0 {
        assert!(!entry.path.contains(&0), "a NUL in {:?}", entry.path);
        assert!(!entry.link.contains(&0), "a NUL in {:?}", entry.link);
        if let Ok(parts) = crate::fs::unpack::names::components(&entry.path, 0) {
            assert!(parts
                .iter()
                .all(|part| !part.is_empty() && part.len() <= 255));
        }
    }
}

/// Each member's header and data, and how the archive ended.
type TarRead = (
    Vec<(crate::archive::reader::Entry, Vec<u8>)>,
    Result<(), crate::archive::reader::TarError>,
);

fn read_tar(archive: &[u8], piece: usize) -> TarRead {
    use crate::archive::reader::{Event, Reader};
    let mut reader = Reader::new();
    let mut members: Vec<(crate::archive::reader::Entry, Vec<u8>)> = Vec::new();
    for chunk in archive.chunks(piece) {
        let mut at = 0;
        loop {
            let (used, event) = match reader.advance(&chunk[at..]) {
                Ok(step) => step,
                Err(e) => return (members, Err(e)),
            };
            assert!(used <= chunk.len() - at);
            match event {
                Event::Member(entry) => members.push((entry, Vec::new())),
                Event::Data(range) => {
                    let data = &chunk[at..][range];
                    if let Some((_, body)) = members.last_mut() {
                        body.extend_from_slice(data);
                    }
                }
                Event::MemberEnd | Event::End => {}
                Event::NeedMore => break,
            }
            at += used;
        }
    }
    (members, reader.finish())
}
