//! A protobuf message holding one large `bytes` field, read as it arrives: the binary
//! counterpart of [`super::streamed`]. The message must be exactly that field nested in
//! length-delimited fields at a fixed path (for `StreamInput`'s data event: `data` (2), `input`
//! (2), then `stdin` (1) or `pty` (2)), each length agreeing with the one inside it; the
//! field's bytes are then passed on as they come, and nothing may follow them. So a service can
//! apply a message of megabytes while holding at most its few bytes of header.
//!
//! Keys and lengths are decoded by `prost`'s varint functions once each is complete.

use prost::encoding::{decode_key, decode_varint, encoded_len_varint, key_len, WireType};

/// Why the message was refused: what was found instead of the expected shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal(pub &'static str);

/// The most header bytes: three keys and three lengths of at most ten bytes each.
const MAX_HEADER: usize = 60;

/// Reads one message; see the module documentation.
pub struct StreamedProto {
    /// The field numbers of the enclosing fields, outermost first.
    path: &'static [u32],
    /// The field numbers the innermost field may have; which one it had is [`Self::field`].
    last: &'static [u32],
    header: Vec<u8>,
    /// The bytes of the value still to come, once the header is read.
    left: Option<u64>,
    field: Option<u32>,
}

impl StreamedProto {
    pub fn new(path: &'static [u32], last: &'static [u32]) -> StreamedProto {
        StreamedProto {
            path,
            last,
            header: Vec::new(),
            left: None,
            field: None,
        }
    }

    /// The innermost field's number, once read.
    pub fn field(&self) -> Option<u32> {
        self.field
    }

    /// The value's bytes in `bytes` (the next bytes of the message).
    pub fn push<'a>(&mut self, bytes: &'a [u8]) -> Result<std::borrow::Cow<'a, [u8]>, Refusal> {
        let Some(_) = self.left else {
            let take = bytes.len().min(MAX_HEADER - self.header.len());
            self.header.extend_from_slice(&bytes[..take]);
            return match self.read_header()? {
                None if self.header.len() >= MAX_HEADER => Err(Refusal("a header too long")),
                None => Ok(Vec::new().into()),
                Some(used) => {
                    // What came after the header is the value's (or too much).
                    let mut value = self.header.split_off(used);
                    value.extend_from_slice(&bytes[take..]);
                    self.value(value.len())?;
                    Ok(value.into())
                }
            };
        };
        self.value(bytes.len())?;
        Ok(bytes.into())
    }

    /// Counts `n` bytes of the value.
    fn value(&mut self, n: usize) -> Result<(), Refusal> {
        let left = self.left.unwrap_or(0);
        let n = u64::try_from(n).unwrap_or(u64::MAX);
        if n > left {
            return Err(Refusal("bytes after the data"));
        }
        self.left = Some(left - n);
        Ok(())
    }

    /// The message ended: fine only after the whole value.
    pub fn finish(&self) -> Result<(), Refusal> {
        match self.left {
            Some(0) => Ok(()),
            _ => Err(Refusal("the message ends inside the data")),
        }
    }

    /// Reads the keys and lengths once all have arrived: how many header bytes they took.
    fn read_header(&mut self) -> Result<Option<usize>, Refusal> {
        let mut rest: &[u8] = &self.header;
        let mut outer: Option<u64> = None;
        let depth = self.path.len() + 1;
        for level in 0..depth {
            let Some(key) = complete_varint(rest, 5) else {
                return Ok(None);
            };
            let mut key_bytes = &rest[..key];
            let (number, wire_type) =
                decode_key(&mut key_bytes).map_err(|_| Refusal("a malformed key"))?;
            rest = &rest[key..];
            let allowed = match self.path.get(level) {
                Some(expected) => number == *expected,
                None => self.last.contains(&number),
            };
            if !allowed || wire_type != WireType::LengthDelimited {
                return Err(Refusal("another field than the data's"));
            }
            let Some(varint) = complete_varint(rest, 10) else {
                return Ok(None);
            };
            let mut len_bytes = &rest[..varint];
            let len = decode_varint(&mut len_bytes).map_err(|_| Refusal("a malformed length"))?;
            rest = &rest[varint..];
            if let Some(outer) = outer {
                let inner = key_len(number) + encoded_len_varint(len);
                if u64::try_from(inner).ok().and_then(|n| n.checked_add(len)) != Some(outer) {
                    return Err(Refusal("more in a message than the data"));
                }
            }
            outer = Some(len);
            if level + 1 == depth {
                self.field = Some(number);
            }
        }
        self.left = outer;
        Ok(Some(self.header.len() - rest.len()))
    }
}

/// The length of the varint at the start of `bytes` (at most `max` bytes), once complete.
fn complete_varint(bytes: &[u8], max: usize) -> Option<usize> {
    bytes
        .iter()
        .take(max)
        .position(|byte| byte & 0x80 == 0)
        .map(|at| at + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: &[u32] = &[2, 2];
    const LAST: &[u32] = &[1, 2];

    /// `data { input { stdin|pty: value } }` as prost writes it.
    fn message(field: u32, value: &[u8]) -> Vec<u8> {
        use prost::encoding::message;
        #[derive(Clone, PartialEq, prost::Message)]
        struct Inner {
            #[prost(bytes = "vec", optional, tag = "1")]
            stdin: Option<Vec<u8>>,
            #[prost(bytes = "vec", optional, tag = "2")]
            pty: Option<Vec<u8>>,
        }
        #[derive(Clone, PartialEq, prost::Message)]
        struct Data {
            #[prost(message, optional, tag = "2")]
            input: Option<Inner>,
        }
        let inner = if field == 1 {
            Inner {
                stdin: Some(value.to_vec()),
                pty: None,
            }
        } else {
            Inner {
                stdin: None,
                pty: Some(value.to_vec()),
            }
        };
        let data = Data { input: Some(inner) };
        let mut out = Vec::new();
        message::encode(2, &data, &mut out);
        out
    }

    fn read(bytes: &[u8], step: usize) -> Result<(Vec<u8>, Option<u32>), Refusal> {
        let mut reader = StreamedProto::new(PATH, LAST);
        let mut out = Vec::new();
        for piece in bytes.chunks(step.max(1)) {
            out.extend_from_slice(&reader.push(piece)?);
        }
        reader.finish()?;
        Ok((out, reader.field()))
    }

    #[test]
    fn the_value_comes_out_however_the_message_is_split() {
        let value: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        for (field, value) in [(1, &value[..]), (2, &value[..70_000]), (1, &b""[..])] {
            let bytes = message(field, value);
            for step in [1, 2, 7, 4096, 1 << 20] {
                assert_eq!(read(&bytes, step).unwrap(), (value.to_vec(), Some(field)));
            }
        }
    }

    #[test]
    fn anything_but_the_plain_shape_is_refused() {
        let good = message(1, b"hello");
        let mut trailing = good.clone();
        trailing.push(0);
        let mut other_field = good.clone();
        other_field[0] = 0x1a;
        let mut wrong_last = good.clone();
        wrong_last[4] = 0x1a;
        let mut endless_length = vec![0x12];
        endless_length.extend([0x80; 70]);
        let mut bad_outer_length = good.clone();
        bad_outer_length[1] += 1;
        for (bad, why) in [
            (&trailing[..], "bytes after the data"),
            (&other_field[..], "another field than the data's"),
            (&wrong_last[..], "another field than the data's"),
            (&good[..good.len() - 1], "the message ends inside the data"),
            (&endless_length[..], "a header too long"),
        ] {
            for step in [1, 3, 100] {
                let error = read(bad, step).unwrap_err();
                assert_eq!(error, Refusal(why), "{bad:?} by {step}");
            }
        }
        assert!(read(&bad_outer_length, 100).is_err());
    }
}
