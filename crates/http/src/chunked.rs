//! The `Transfer-Encoding: chunked` request-body decoder, as a state machine over byte slices.
//!
//! It consumes framing (size lines, CRLFs, trailers) and tells the caller how many data bytes
//! come next; the caller moves those itself, so data is never copied through the decoder. Input
//! may be split anywhere. Strict: CRLF line ends only, sizes checked for overflow, size lines and
//! trailers bounded.

/// Longest chunk-size line, extensions included.
const MAX_SIZE_LINE: usize = 4096;
/// Most trailer bytes accepted after the last chunk.
const MAX_TRAILERS: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// Why a chunked body is refused (the `Display` text is the client message).
pub enum ChunkError {
    /// Not hexadecimal digits, or more than 64 bits.
    InvalidSize,
    /// A size line (with extensions) over 4 KiB.
    SizeLineTooLong,
    /// A chunk, size line or trailer not ended by CRLF.
    MissingCrlf,
    /// Trailers over 16 KiB.
    TrailersTooLarge,
}

impl std::fmt::Display for ChunkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ChunkError::InvalidSize => "invalid chunk size",
            ChunkError::SizeLineTooLong => "chunk size line too long",
            ChunkError::MissingCrlf => "chunk not followed by CRLF",
            ChunkError::TrailersTooLarge => "chunked trailers too large",
        })
    }
}

/// What follows the framing consumed so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// This many data bytes of the current chunk follow (more than the input may hold).
    Data(u64),
    /// The input ended inside framing: call again with more.
    NeedMore,
    /// The last chunk and its trailers are consumed: the body is complete.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Hex digits of a size; `digits` seen so far, `line` bytes of the line.
    Size {
        size: u64,
        digits: usize,
        line: usize,
    },
    /// Blanks after the digits, before `;` or CR.
    Blank {
        size: u64,
        line: usize,
    },
    /// After `;`: extensions up to CR (their content is ignored).
    Extension {
        size: u64,
        line: usize,
    },
    /// CR of the size line seen, LF expected.
    SizeLf {
        size: u64,
    },
    Data {
        remaining: u64,
    },
    DataCr,
    DataLf,
    /// Start of a trailer line (or of the final empty line).
    TrailerStart {
        total: usize,
    },
    TrailerLine {
        total: usize,
    },
    TrailerLf {
        total: usize,
        empty: bool,
    },
    Done,
}

#[derive(Debug, Clone)]
/// The decoder of one chunked body.
pub struct ChunkedDecoder {
    state: State,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        ChunkedDecoder {
            state: State::Size {
                size: 0,
                digits: 0,
                line: 0,
            },
        }
    }
}

impl ChunkedDecoder {
    /// Consumes framing bytes from the start of `input`. Returns how many were consumed and what
    /// follows them. On `Next::Data(n)` the caller reads up to `n` bytes and reports them with
    /// [`ChunkedDecoder::consumed_data`].
    pub fn advance(&mut self, input: &[u8]) -> Result<(usize, Next), ChunkError> {
        let mut used = 0;
        loop {
            if let State::Data { remaining } = self.state {
                if remaining > 0 {
                    return Ok((used, Next::Data(remaining)));
                }
                self.state = State::DataCr;
            }
            if self.state == State::Done {
                return Ok((used, Next::Done));
            }
            let Some(&byte) = input.get(used) else {
                return Ok((used, Next::NeedMore));
            };
            used += 1;
            self.state = step(self.state, byte)?;
        }
    }

    /// Records that the caller moved `n` data bytes (at most what `Next::Data` announced).
    pub fn consumed_data(&mut self, n: u64) {
        if let State::Data { remaining } = &mut self.state {
            *remaining = remaining.saturating_sub(n);
        }
    }

    /// True once the last chunk and the trailers are consumed.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }
}

fn step(state: State, byte: u8) -> Result<State, ChunkError> {
    Ok(match state {
        State::Size { size, digits, line } => {
            let line = grow_line(line)?;
            match (byte as char).to_digit(16) {
                Some(digit) => State::Size {
                    size: size
                        .checked_mul(16)
                        .and_then(|s| s.checked_add(u64::from(digit)))
                        .ok_or(ChunkError::InvalidSize)?,
                    digits: digits + 1,
                    line,
                },
                None if digits == 0 => return Err(ChunkError::InvalidSize),
                None => end_of_digits(size, line, byte)?,
            }
        }
        State::Blank { size, line } => end_of_digits(size, grow_line(line)?, byte)?,
        State::Extension { size, line } => {
            let line = grow_line(line)?;
            match byte {
                b'\r' => State::SizeLf { size },
                b'\n' => return Err(ChunkError::MissingCrlf),
                _ if is_extension_byte(byte) => State::Extension { size, line },
                _ => return Err(ChunkError::InvalidSize),
            }
        }
        State::SizeLf { size } if byte == b'\n' => match size {
            0 => State::TrailerStart { total: 0 },
            _ => State::Data { remaining: size },
        },
        State::DataCr if byte == b'\r' => State::DataLf,
        State::DataLf if byte == b'\n' => State::Size {
            size: 0,
            digits: 0,
            line: 0,
        },
        State::TrailerStart { total } | State::TrailerLine { total } => {
            let total = total + 1;
            if total > MAX_TRAILERS {
                return Err(ChunkError::TrailersTooLarge);
            }
            match byte {
                b'\r' => State::TrailerLf {
                    total,
                    empty: matches!(state, State::TrailerStart { .. }),
                },
                b'\n' => return Err(ChunkError::MissingCrlf),
                _ => State::TrailerLine { total },
            }
        }
        State::TrailerLf { empty: true, .. } if byte == b'\n' => State::Done,
        State::TrailerLf { total, .. } if byte == b'\n' => State::TrailerStart { total },
        State::SizeLf { .. } | State::DataCr | State::DataLf | State::TrailerLf { .. } => {
            return Err(ChunkError::MissingCrlf)
        }
        State::Data { .. } | State::Done => state,
    })
}

/// A byte after the size digits: blanks, then `;` starting extensions or CR ending the line.
fn end_of_digits(size: u64, line: usize, byte: u8) -> Result<State, ChunkError> {
    match byte {
        b'\r' => Ok(State::SizeLf { size }),
        b'\n' => Err(ChunkError::MissingCrlf),
        b' ' | b'\t' => Ok(State::Blank { size, line }),
        b';' => Ok(State::Extension { size, line }),
        _ => Err(ChunkError::InvalidSize),
    }
}

fn is_extension_byte(byte: u8) -> bool {
    byte == b'\t' || (b' '..=b'~').contains(&byte) || byte >= 0x80
}

fn grow_line(line: usize) -> Result<usize, ChunkError> {
    if line >= MAX_SIZE_LINE {
        Err(ChunkError::SizeLineTooLong)
    } else {
        Ok(line + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `input` fed in pieces of `piece` bytes; returns the data or the first error.
    fn decode_in_pieces(input: &[u8], piece: usize) -> Result<(Vec<u8>, bool), ChunkError> {
        let mut decoder = ChunkedDecoder::default();
        let mut data = Vec::new();
        let mut pos = 0;
        while pos < input.len() {
            let end = (pos + piece).min(input.len());
            let (used, next) = decoder.advance(&input[pos..end])?;
            pos += used;
            match next {
                Next::Data(n) => {
                    let take = usize::try_from(n).unwrap_or(usize::MAX).min(end - pos);
                    data.extend_from_slice(&input[pos..pos + take]);
                    decoder.consumed_data(take as u64);
                    pos += take;
                }
                Next::Done => return Ok((data, true)),
                Next::NeedMore => {}
            }
        }
        Ok((data, decoder.is_done()))
    }

    const BODY: &[u8] = b"5\r\nhello\r\n7;ext=\"v\"\r\n, world\r\n0\r\nX-Trailer: t\r\n\r\n";

    #[test]
    fn decodes_whatever_the_split() {
        for piece in 1..=BODY.len() {
            assert_eq!(
                decode_in_pieces(BODY, piece).unwrap(),
                (b"hello, world".to_vec(), true),
                "piece {piece}"
            );
        }
    }

    #[test]
    fn stops_at_the_end_of_the_body() {
        let mut input = b"3\r\nabc\r\n0\r\n\r\n".to_vec();
        input.extend_from_slice(b"GET / HTTP/1.1\r\n");
        let mut decoder = ChunkedDecoder::default();
        let (used, next) = decoder.advance(&input).unwrap();
        assert_eq!((used, next), (3, Next::Data(3)));
        decoder.consumed_data(3);
        let (used, next) = decoder.advance(&input[6..]).unwrap();
        assert_eq!(next, Next::Done);
        assert_eq!(&input[6 + used..], b"GET / HTTP/1.1\r\n");
    }

    #[test]
    fn uppercase_hex_and_leading_zeros() {
        let input = b"00A\r\n0123456789\r\n0\r\n\r\n";
        assert_eq!(decode_in_pieces(input, 3).unwrap().0, b"0123456789");
    }

    #[test]
    fn rejects_bad_sizes() {
        for bad in [
            &b"\r\n"[..],
            b"x\r\n",
            b"-1\r\n",
            b"1 2\r\n",
            b"1;a\x01\r\n",
        ] {
            assert_eq!(
                decode_in_pieces(bad, 64).unwrap_err(),
                ChunkError::InvalidSize,
                "{bad:?}"
            );
        }
        assert_eq!(
            decode_in_pieces(b"1 ;a\r\nx\r\n0\r\n\r\n", 64).unwrap().0,
            b"x"
        );
        assert_eq!(
            decode_in_pieces(b"10000000000000000\r\n", 64).unwrap_err(),
            ChunkError::InvalidSize
        );
        assert_eq!(
            decode_in_pieces(b"ffffffffffffffff\r\n", 64).unwrap(),
            (Vec::new(), false)
        );
    }

    #[test]
    fn rejects_bare_lf_and_missing_crlf_after_data() {
        assert_eq!(
            decode_in_pieces(b"3\nabc", 64).unwrap_err(),
            ChunkError::MissingCrlf
        );
        assert_eq!(
            decode_in_pieces(b"3\r\nabcX\r\n", 64).unwrap_err(),
            ChunkError::MissingCrlf
        );
        assert_eq!(
            decode_in_pieces(b"0\r\nX: y\n\r\n", 64).unwrap_err(),
            ChunkError::MissingCrlf
        );
    }

    #[test]
    fn bounds_size_lines_and_trailers() {
        let mut long = b"1;".to_vec();
        long.resize(MAX_SIZE_LINE + 2, b'a');
        assert_eq!(
            decode_in_pieces(&long, 100).unwrap_err(),
            ChunkError::SizeLineTooLong
        );
        let mut trailers = b"0\r\n".to_vec();
        for _ in 0..2000 {
            trailers.extend_from_slice(b"X-T: 0123456789\r\n");
        }
        assert_eq!(
            decode_in_pieces(&trailers, 100).unwrap_err(),
            ChunkError::TrailersTooLarge
        );
    }
}
