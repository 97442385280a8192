//! The JSON form of a log line, with the field names of envd's logger (zerolog's `level`,
//! envd's `timestamp` and `operation_id`): one object per line, no newline inside.
//!
//! sandboxd's lines carry no severity of their own: every line is `"level":"info"`, the
//! message says what happened. A request's line adds its fields beside the message.

use std::io::Write;

use super::RequestFields;

/// Appends `{"level":"info","timestamp":...,"message":...}` (and a request's fields) to `out`.
pub(super) fn write_line(
    out: &mut Vec<u8>,
    timestamp: &[u8],
    message: &str,
    request: Option<&RequestFields>,
    operation: Option<u64>,
) {
    out.extend_from_slice(b"{\"level\":\"info\",\"timestamp\":\"");
    out.extend_from_slice(timestamp);
    out.extend_from_slice(b"\",\"message\":");
    string(out, message);
    if let Some(request) = request {
        out.extend_from_slice(b",\"method\":");
        string(out, request.method);
        out.extend_from_slice(b",\"path\":");
        string(out, request.target);
        // Writing into a Vec cannot fail.
        let _ = write!(
            out,
            ",\"status\":{},\"bytes\":{},\"duration_us\":{}",
            request.status, request.bytes, request.micros
        );
    }
    if let Some(operation) = operation {
        let _ = write!(out, ",\"operation_id\":\"{operation}\"");
    }
    out.push(b'}');
}

/// A JSON string: quotes, backslashes and control characters escaped.
fn string(out: &mut Vec<u8>, text: &str) {
    // Writing into a Vec cannot fail, and a str always serializes.
    let _ = serde_json::to_writer(&mut *out, text);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_line_is_level_timestamp_and_message() {
        let mut out = Vec::new();
        write_line(
            &mut out,
            b"2023-11-14T22:13:20.123Z",
            "said \"hi\"\n\tthere\u{1}",
            None,
            None,
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
        write_line(
            &mut out,
            b"T",
            "GET /files?path=a%22b 200 12 345us",
            Some(&fields),
            Some(7),
        );
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
