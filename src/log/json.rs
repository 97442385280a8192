//! The JSON form of a log line, with the field names of envd's logger (zerolog's `level`,
//! envd's `timestamp` and `operation_id`): one object per line, no newline inside.
//!
//! sandboxd's lines carry no severity of their own: every line is `"level":"info"`, the
//! message says what happened. A request's line adds its fields beside the message.

use super::RequestFields;
use crate::http::digits::push_u64;

/// Appends `{"level":"info","timestamp":...,"message":...}` to `out`.
pub(super) fn write_line(out: &mut Vec<u8>, timestamp: &[u8], message: &str) {
    open(out, timestamp);
    string(out, message);
    out.push(b'}');
}

/// Appends a request's line: its message (the text form's `METHOD TARGET STATUS BYTES
/// MICROSus`), its fields and its operation, without `core::fmt` (one per request).
pub(super) fn write_request_line(
    out: &mut Vec<u8>,
    timestamp: &[u8],
    request: &RequestFields,
    operation: u64,
) {
    open(out, timestamp);
    out.push(b'"');
    request.write_message(out, escaped);
    out.extend_from_slice(b"\",\"method\":");
    string(out, request.method);
    out.extend_from_slice(b",\"path\":");
    string(out, request.target);
    out.extend_from_slice(b",\"status\":");
    push_u64(out, u64::from(request.status));
    out.extend_from_slice(b",\"bytes\":");
    push_u64(out, request.bytes);
    out.extend_from_slice(b",\"duration_us\":");
    push_u64(out, request.micros);
    out.extend_from_slice(b",\"operation_id\":\"");
    push_u64(out, operation);
    out.extend_from_slice(b"\"}");
}

/// `{"level":"info","timestamp":"...","message":`
fn open(out: &mut Vec<u8>, timestamp: &[u8]) {
    out.extend_from_slice(b"{\"level\":\"info\",\"timestamp\":\"");
    out.extend_from_slice(timestamp);
    out.extend_from_slice(b"\",\"message\":");
}

/// A JSON string: `text` quoted and escaped.
fn string(out: &mut Vec<u8>, text: &str) {
    out.push(b'"');
    escaped(out, text);
    out.push(b'"');
}

/// `text` escaped as inside a JSON string, as serde_json escapes it: `"` and `\\`, the short
/// forms of five control characters, `\u00XX` for the others; everything else as it is.
fn escaped(out: &mut Vec<u8>, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = text.as_bytes();
    let mut run = 0;
    for (at, &byte) in bytes.iter().enumerate() {
        let short = match byte {
            b'"' => b'"',
            b'\\' => b'\\',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            0x08 => b'b',
            0x0c => b'f',
            0..=0x1f => 0,
            _ => continue,
        };
        out.extend_from_slice(&bytes[run..at]);
        run = at + 1;
        if short == 0 {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(byte >> 4)]);
            out.push(HEX[usize::from(byte & 0xf)]);
        } else {
            out.push(b'\\');
            out.push(short);
        }
    }
    out.extend_from_slice(&bytes[run..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        let mut every_ascii = String::new();
        for byte in 0u8..0x80 {
            every_ascii.push(char::from(byte));
        }
        for text in [
            every_ascii.as_str(),
            "",
            "plain",
            "é ✓ \u{10ffff}",
            "\"\\\"",
            "a\u{7f}b",
        ] {
            let mut out = Vec::new();
            string(&mut out, text);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                serde_json::to_string(text).unwrap(),
                "{text:?}"
            );
        }
    }

    #[test]
    fn a_plain_line_is_level_timestamp_and_message() {
        let mut out = Vec::new();
        write_line(
            &mut out,
            b"2023-11-14T22:13:20.123Z",
            "said \"hi\"\n\tthere\u{1}",
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"level":"info","timestamp":"2023-11-14T22:13:20.123Z","message":"said \"hi\"\n\tthere\u0001"}"#
        );
    }

    #[test]
    fn a_request_line_has_its_fields_and_operation() {
        let mut out = Vec::new();
        let fields = RequestFields {
            method: "GET",
            target: "/files?path=a%22b",
            status: 200,
            bytes: 12,
            micros: 345,
            at: std::time::UNIX_EPOCH,
        };
        write_request_line(&mut out, b"T", &fields, 7);
        let parsed: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            parsed,
            serde_json::json!({
                "level": "info", "timestamp": "T", "message": "GET /files?path=a%22b 200 12 345us",
                "method": "GET", "path": "/files?path=a%22b", "status": 200, "bytes": 12,
                "duration_us": 345, "operation_id": "7"
            })
        );
    }
}
