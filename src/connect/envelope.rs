//! Connect's envelopes: a flags byte, a 4-byte big-endian length, then the message. Streaming
//! calls carry every message in one; the answer's last one has [`END_STREAM`] set and holds the
//! call's outcome.

use super::{Code, Error, MAX_REQUEST_BYTES};

/// The message is compressed with the call's `Connect-Content-Encoding`.
pub const COMPRESSED: u8 = 0x01;
/// The end-of-stream message: `{}` or `{"error":{...}}`, and optional `metadata`.
pub const END_STREAM: u8 = 0x02;
/// The bytes before an envelope's message: flags and length.
pub const PREFIX: usize = 5;

/// One envelope around `message`.
pub fn encode(flags: u8, message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(PREFIX + message.len());
    out.push(flags);
    // Messages are built here from bounded parts; a length past u32 cannot be framed at all.
    let len = u32::try_from(message.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// Replaces `out` with one envelope around the message `write` appends to it.
pub fn encode_into(out: &mut Vec<u8>, flags: u8, write: impl FnOnce(&mut Vec<u8>)) {
    out.clear();
    append_into(out, flags, |out| {
        write(out);
        true
    });
}

/// Appends an envelope to `out` after what it holds, its message written by `write`; when
/// `write` answers false (nothing to send) the envelope is taken off again. Whether one was
/// appended.
pub fn append_into(out: &mut Vec<u8>, flags: u8, write: impl FnOnce(&mut Vec<u8>) -> bool) -> bool {
    let start = out.len();
    out.extend_from_slice(&[flags, 0, 0, 0, 0]);
    if !write(out) {
        out.truncate(start);
        return false;
    }
    // As in `encode`: a message past u32 cannot be framed at all.
    let len = u32::try_from(out.len() - start - PREFIX).unwrap_or(u32::MAX);
    out[start + 1..start + PREFIX].copy_from_slice(&len.to_be_bytes());
    true
}

/// The flags and length of the envelope at the start of `bytes`, once its prefix is complete:
/// unknown flags and a length over [`MAX_REQUEST_BYTES`] are errors. (Whether a compressed
/// message may come is the call's headers' to say: [`compressed_without_encoding`].)
pub fn prefix(bytes: &[u8]) -> Result<Option<(u8, usize)>, Error> {
    let Some(head) = bytes.get(..PREFIX) else {
        return Ok(None);
    };
    let flags = head[0];
    if flags & !(COMPRESSED | END_STREAM) != 0 {
        return Err(Error::invalid_argument(format!(
            "malformed envelope: unknown flags {flags:#04x}"
        )));
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]);
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    if len > MAX_REQUEST_BYTES {
        return Err(Error::new(
            Code::ResourceExhausted,
            format!("a message of {len} bytes is over the limit of {MAX_REQUEST_BYTES}"),
        ));
    }
    Ok(Some((flags, len)))
}

/// A message flagged compressed in a call that named no `Connect-Content-Encoding`.
pub fn compressed_without_encoding() -> Error {
    Error::invalid_argument(
        "malformed request: a compressed message without a Connect-Content-Encoding",
    )
}

/// The flags and message of a server-streaming call's request body, its one message.
pub fn single_message(body: &[u8]) -> Result<(u8, &[u8]), Error> {
    let malformed = |what: &str| Error::invalid_argument(format!("malformed request: {what}"));
    let (flags, len) = prefix(body)?.ok_or_else(|| malformed("no envelope"))?;
    if flags & END_STREAM != 0 {
        return Err(malformed("an end-of-stream envelope from the client"));
    }
    match body.len().checked_sub(PREFIX + len) {
        Some(0) => Ok((flags, &body[PREFIX..])),
        Some(_) => Err(malformed("bytes after the request message")),
        None => Err(malformed("the request message is cut short")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_is_read_once_complete() {
        assert_eq!(prefix(&[0, 0, 0]).unwrap(), None);
        assert_eq!(prefix(&[2, 0, 0, 1, 0, b'x']).unwrap(), Some((2, 256)));
        assert_eq!(
            prefix(&[0x80, 0, 0, 0, 0]).unwrap_err().code,
            Code::InvalidArgument
        );
    }

    #[test]
    fn encoding_is_flags_length_message() {
        assert_eq!(encode(2, b"{}"), vec![2, 0, 0, 0, 2, b'{', b'}']);
        let mut written = b"old".to_vec();
        encode_into(&mut written, 0, |out| out.extend_from_slice(b"{\"a\":1}"));
        assert_eq!(written, encode(0, b"{\"a\":1}"));
        // Appended after what the buffer holds; nothing left of one that had nothing to send.
        let mut queue = b"old".to_vec();
        assert!(append_into(&mut queue, 0, |out| {
            out.extend_from_slice(b"{}");
            true
        }));
        assert!(!append_into(&mut queue, 0, |out| {
            out.extend_from_slice(b"partial");
            false
        }));
        assert_eq!(queue, [&b"old"[..], &encode(0, b"{}")].concat());
    }

    #[test]
    fn oversized_envelopes_are_refused() {
        assert_eq!(prefix(&[1, 0, 0, 0, 0]).unwrap(), Some((COMPRESSED, 0)));
        let error = prefix(&[0, 0xff, 0xff, 0xff, 0xff]).unwrap_err();
        assert_eq!(error.code, Code::ResourceExhausted);
    }

    #[test]
    fn a_request_body_is_exactly_one_message() {
        assert_eq!(single_message(&encode(0, b"{}")).unwrap(), (0, &b"{}"[..]));
        assert_eq!(single_message(&encode(1, b"z")).unwrap(), (1, &b"z"[..]));
        let mut two = encode(0, b"{}");
        two.extend(encode(0, b"{}"));
        for bad in [
            &b""[..],
            &[0, 0, 0],
            &[0, 0, 0, 0, 3, b'{'],
            &two,
            &encode(END_STREAM, b"{}"),
        ] {
            assert_eq!(
                single_message(bad).unwrap_err().code,
                Code::InvalidArgument,
                "{bad:?}"
            );
        }
    }
}
