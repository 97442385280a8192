//! Request body framing: `Content-Length` or chunked, decided from the head and decoded
//! incrementally from whatever bytes have arrived.
//!
//! Nothing is allocated by a declared length, and the decoder never claims a byte past the end
//! of the body, so the next pipelined request stays where it is.

use std::ops::Range;

use crate::chunked::{ChunkError, ChunkedDecoder, Next};

/// How a request body is delimited.
#[derive(Debug, Clone)]
pub enum Framing {
    Length(u64),
    Chunked(ChunkedDecoder),
}

/// Why the framing headers were refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FramingError {
    /// Not a decimal number, over 64 bits, or several different values.
    BadContentLength,
    /// A transfer coding other than `chunked` alone.
    UnsupportedTransferEncoding,
    /// Both `Content-Length` and `Transfer-Encoding`.
    Conflicting,
    /// HTTP/1.0 has no transfer codings (RFC 9112 §6.1): the framing is not to be trusted.
    TransferEncodingInHttp10,
}

impl std::fmt::Display for FramingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FramingError::BadContentLength => "invalid Content-Length header",
            FramingError::UnsupportedTransferEncoding => {
                "unsupported Transfer-Encoding: only chunked is accepted"
            }
            FramingError::Conflicting => "both Content-Length and Transfer-Encoding sent",
            FramingError::TransferEncodingInHttp10 => "Transfer-Encoding in an HTTP/1.0 request",
        })
    }
}

impl Framing {
    /// Decides the framing from the `Content-Length` and `Transfer-Encoding` values sent.
    pub fn from_headers<'a>(
        content_lengths: impl Iterator<Item = &'a [u8]>,
        transfer_encodings: impl Iterator<Item = &'a [u8]>,
    ) -> Result<Framing, FramingError> {
        let mut length: Option<u64> = None;
        for value in content_lengths {
            let parsed = parse_length(value).ok_or(FramingError::BadContentLength)?;
            if length.is_some_and(|l| l != parsed) {
                return Err(FramingError::BadContentLength);
            }
            length = Some(parsed);
        }
        let codings: Vec<&[u8]> = transfer_encodings
            .flat_map(|v| v.split(|&b| b == b','))
            .map(|c| c.trim_ascii())
            .filter(|c| !c.is_empty())
            .collect();
        match (codings.as_slice(), length) {
            ([], length) => Ok(Framing::Length(length.unwrap_or(0))),
            ([_, ..], Some(_)) => Err(FramingError::Conflicting),
            ([coding], None) if coding.eq_ignore_ascii_case(b"chunked") => {
                Ok(Framing::Chunked(ChunkedDecoder::default()))
            }
            _ => Err(FramingError::UnsupportedTransferEncoding),
        }
    }
}

fn parse_length(value: &[u8]) -> Option<u64> {
    let digits = value.trim_ascii();
    if digits.is_empty() || digits.len() > 20 {
        return None;
    }
    digits.iter().try_fold(0u64, |acc, &d| {
        d.is_ascii_digit()
            .then(|| acc.checked_mul(10)?.checked_add(u64::from(d - b'0')))
            .flatten()
    })
}

/// What the bytes at the start of the decoder's input were.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    /// Body data, at this range of the input.
    Data(Range<usize>),
    /// The input is used up (framing may have been consumed): more is needed.
    NeedMore,
    /// The body is complete.
    Done,
}

impl Framing {
    /// True when nothing of the body is left to read.
    pub(crate) fn is_done(&self) -> bool {
        match self {
            Framing::Length(remaining) => *remaining == 0,
            Framing::Chunked(decoder) => decoder.is_done(),
        }
    }

    /// The body bytes still expected, when the framing says (`Content-Length`).
    pub(crate) fn remaining(&self) -> Option<u64> {
        match self {
            Framing::Length(remaining) => Some(*remaining),
            Framing::Chunked(_) => None,
        }
    }

    /// Decodes from the start of `input`: how many bytes it used and what they were. Call
    /// again with the rest of the input after `Data`.
    pub(crate) fn decode(&mut self, input: &[u8]) -> Result<(usize, Piece), ChunkError> {
        match self {
            Framing::Length(0) => Ok((0, Piece::Done)),
            Framing::Length(_) if input.is_empty() => Ok((0, Piece::NeedMore)),
            Framing::Length(remaining) => {
                let take = input
                    .len()
                    .min(usize::try_from(*remaining).unwrap_or(usize::MAX));
                *remaining -= take as u64;
                Ok((take, Piece::Data(0..take)))
            }
            Framing::Chunked(decoder) => {
                let (used, next) = decoder.advance(input)?;
                match next {
                    Next::Done => Ok((used, Piece::Done)),
                    Next::NeedMore => Ok((used, Piece::NeedMore)),
                    Next::Data(n) => {
                        let take =
                            (input.len() - used).min(usize::try_from(n).unwrap_or(usize::MAX));
                        if take == 0 {
                            return Ok((used, Piece::NeedMore));
                        }
                        decoder.consumed_data(take as u64);
                        Ok((used + take, Piece::Data(used..used + take)))
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framing(lengths: &[&str], encodings: &[&str]) -> Result<Framing, FramingError> {
        Framing::from_headers(
            lengths.iter().map(|s| s.as_bytes()),
            encodings.iter().map(|s| s.as_bytes()),
        )
    }

    #[test]
    fn content_length_values() {
        assert!(matches!(framing(&[], &[]), Ok(Framing::Length(0))));
        assert!(matches!(framing(&["42"], &[]), Ok(Framing::Length(42))));
        assert!(matches!(
            framing(&[" 7 ", "7"], &[]),
            Ok(Framing::Length(7))
        ));
        assert!(matches!(
            framing(&["18446744073709551615"], &[]),
            Ok(Framing::Length(u64::MAX))
        ));
        for bad in ["18446744073709551616", "-1", "+1", "1e3", "", "0x10", "1 2"] {
            assert_eq!(
                framing(&[bad], &[]).unwrap_err(),
                FramingError::BadContentLength,
                "{bad}"
            );
        }
        assert_eq!(
            framing(&["1", "2"], &[]).unwrap_err(),
            FramingError::BadContentLength
        );
    }

    #[test]
    fn transfer_encoding_values() {
        assert!(matches!(
            framing(&[], &["Chunked"]),
            Ok(Framing::Chunked(_))
        ));
        assert_eq!(
            framing(&["5"], &["chunked"]).unwrap_err(),
            FramingError::Conflicting
        );
        assert_eq!(
            framing(&[], &["gzip, chunked"]).unwrap_err(),
            FramingError::UnsupportedTransferEncoding
        );
        assert_eq!(
            framing(&[], &["identity"]).unwrap_err(),
            FramingError::UnsupportedTransferEncoding
        );
    }
}
