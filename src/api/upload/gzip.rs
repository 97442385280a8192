//! A streaming gzip decoder (RFC 1952): compressed bytes in, in pieces of any size; inflated
//! bytes out, into a buffer of the caller's.
//!
//! It does no I/O and holds nothing that grows: the inflate state (its 32 KiB window included)
//! and a few counters. So whatever the ratio, a "gzip bomb" costs the disk it fills, never
//! memory. The deflate data itself is `flate2`'s (miniz_oxide, pure Rust); the gzip framing
//! around it is here, so that every way a body can be wrong has its own message.
//!
//! What is accepted is what envd accepts: envd reads the body with Go's `gzip.NewReader`, which
//! decodes concatenated members (RFC 1952 §2.2) as one stream by default. So:
//! - one or more members back to back, their data concatenated;
//! - in each header: the magic `1f 8b`, method 8 (deflate), no reserved flag bit (RFC 1952
//!   §2.3.1.2), the extra field, name and comment skipped, the header CRC-16 checked when
//!   present;
//! - after each member's data, its trailer: the CRC-32 and the length (mod 2^32) of the data.
//!
//! Refused, as Go refuses them: a body that ends anywhere but right after a trailer (an empty
//! body included), bytes after a member that do not start another one (zero padding included),
//! corrupt deflate data, a checksum or length that does not match.

use std::fmt;

use flate2::{Crc, Decompress, FlushDecompress, Status};

const MAGIC: [u8; 2] = [0x1f, 0x8b];
const METHOD_DEFLATE: u8 = 8;
const FLAG_HEADER_CRC: u8 = 0x02;
const FLAG_EXTRA: u8 = 0x04;
const FLAG_NAME: u8 = 0x08;
const FLAG_COMMENT: u8 = 0x10;
const FLAGS_RESERVED: u8 = 0xe0;
/// Magic, method, flags, mtime (4), extra flags, OS.
const FIXED_HEADER: usize = 10;
/// CRC-32 and length of the data.
const TRAILER: usize = 8;

/// Why a body is not valid gzip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GzipError {
    /// The body is empty: not even a header.
    Empty,
    NotGzip,
    Method(u8),
    ReservedFlags(u8),
    HeaderChecksum,
    Deflate(String),
    Checksum {
        trailer: u32,
        data: u32,
    },
    Length {
        trailer: u32,
        data: u32,
    },
    /// Bytes after a member that do not start another member.
    TrailingData,
    /// The body ended inside a member: in its header, its data or its trailer.
    Truncated(&'static str),
}

impl fmt::Display for GzipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GzipError::Empty => write!(f, "the body is empty, with no gzip header"),
            GzipError::NotGzip => write!(f, "not gzip data: it does not start with 1f 8b"),
            GzipError::Method(method) => {
                write!(f, "compression method {method} is not deflate (8)")
            }
            GzipError::ReservedFlags(flags) => {
                write!(f, "reserved header flags are set (0x{flags:02x})")
            }
            GzipError::HeaderChecksum => write!(f, "the header checksum does not match"),
            GzipError::Deflate(reason) => write!(f, "corrupt deflate data: {reason}"),
            GzipError::Checksum { trailer, data } => write!(
                f,
                "CRC-32 mismatch: the trailer says {trailer:08x}, the data has {data:08x}"
            ),
            GzipError::Length { trailer, data } => write!(
                f,
                "length mismatch: the trailer says {trailer} bytes (mod 2^32), the data has {data}"
            ),
            GzipError::TrailingData => write!(f, "trailing data after the gzip stream"),
            GzipError::Truncated(part) => {
                write!(f, "truncated: the body ended inside a gzip {part}")
            }
        }
    }
}

/// Where in a member the decoder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Fixed,
    ExtraLength,
    Extra { left: usize },
    Name,
    Comment,
    HeaderChecksum,
    Data,
    Trailer,
}

/// Decodes one gzip stream; see the module documentation.
pub struct Decoder {
    step: Step,
    /// The bytes of the fixed-size field being read (header, a length, the trailer).
    field: [u8; FIXED_HEADER],
    have: usize,
    flags: u8,
    header_crc: Crc,
    inflate: Decompress,
    data_crc: Crc,
    members: u64,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder {
            step: Step::Fixed,
            field: [0; FIXED_HEADER],
            have: 0,
            flags: 0,
            header_crc: Crc::new(),
            inflate: Decompress::new(false),
            data_crc: Crc::new(),
            members: 0,
        }
    }
}

impl Decoder {
    /// Decodes from `input` into `out`: returns how many bytes of `input` it took and how many
    /// of `out` it filled. It stops when all of `input` is taken and no decoded byte is left
    /// to give, or when `out` is full; so call it again, with the input not taken, for as long
    /// as `out` comes back full. It always takes or gives something when `input` is not empty
    /// and `out` is not full.
    pub fn feed(&mut self, mut input: &[u8], out: &mut [u8]) -> Result<(usize, usize), GzipError> {
        let offered = input.len();
        let mut made = 0;
        loop {
            match self.step {
                Step::Data => {
                    if made == out.len() {
                        break;
                    }
                    let (used, produced, ended) = self.inflate(input, &mut out[made..])?;
                    self.data_crc.update(&out[made..made + produced]);
                    input = &input[used..];
                    made += produced;
                    if ended {
                        self.step = Step::Trailer;
                    } else if used == 0 && produced == 0 {
                        break;
                    }
                }
                _ if input.is_empty() => break,
                Step::Fixed => {
                    if self.fill(&mut input, FIXED_HEADER) {
                        self.check_fixed()?;
                        self.step = self.next_after(Step::Fixed);
                    } else {
                        self.check_magic(self.have)?;
                    }
                }
                Step::ExtraLength => {
                    if self.fill(&mut input, 2) {
                        let left = usize::from(u16::from_le_bytes([self.field[0], self.field[1]]));
                        self.step = Step::Extra { left };
                    }
                }
                Step::Extra { left } => {
                    let take = left.min(input.len());
                    self.header_crc.update(&input[..take]);
                    input = &input[take..];
                    self.step = match left - take {
                        0 => self.next_after(Step::Extra { left: 0 }),
                        left => Step::Extra { left },
                    };
                }
                Step::Name | Step::Comment => {
                    let end = input.iter().position(|&b| b == 0);
                    let take = end.map_or(input.len(), |at| at + 1);
                    self.header_crc.update(&input[..take]);
                    input = &input[take..];
                    if end.is_some() {
                        self.step = self.next_after(self.step);
                    }
                }
                Step::HeaderChecksum => {
                    let expected = self.header_crc.sum() & 0xffff;
                    if self.fill(&mut input, 2) {
                        let sent = u16::from_le_bytes([self.field[0], self.field[1]]);
                        if u32::from(sent) != expected {
                            return Err(GzipError::HeaderChecksum);
                        }
                        self.step = Step::Data;
                    }
                }
                Step::Trailer => {
                    if self.fill(&mut input, TRAILER) {
                        self.check_trailer()?;
                        self.next_member();
                    }
                }
            }
        }
        Ok((offered - input.len(), made))
    }

    /// The body is over: fine only right after a member's trailer.
    pub fn finish(&self) -> Result<(), GzipError> {
        match self.step {
            Step::Fixed if self.have == 0 && self.members > 0 => Ok(()),
            Step::Fixed if self.have == 0 => Err(GzipError::Empty),
            Step::Data => Err(GzipError::Truncated("deflate stream")),
            Step::Trailer => Err(GzipError::Truncated("trailer")),
            _ => Err(GzipError::Truncated("header")),
        }
    }

    /// Copies bytes of a fixed-size field of `len` bytes from `input`; true once it is whole
    /// (in `self.field[..len]`). Header bytes also go to the header checksum.
    fn fill(&mut self, input: &mut &[u8], len: usize) -> bool {
        let take = (len - self.have).min(input.len());
        self.field[self.have..self.have + take].copy_from_slice(&input[..take]);
        if self.step != Step::Trailer && self.step != Step::HeaderChecksum {
            self.header_crc.update(&input[..take]);
        }
        *input = &input[take..];
        self.have += take;
        if self.have < len {
            return false;
        }
        self.have = 0;
        true
    }

    /// The first `seen` bytes of a header must be the magic's: after a member, anything else is
    /// trailing data rather than another member.
    fn check_magic(&self, seen: usize) -> Result<(), GzipError> {
        let seen = seen.min(MAGIC.len());
        if self.field[..seen] == MAGIC[..seen] {
            Ok(())
        } else if self.members == 0 {
            Err(GzipError::NotGzip)
        } else {
            Err(GzipError::TrailingData)
        }
    }

    fn check_fixed(&mut self) -> Result<(), GzipError> {
        self.check_magic(MAGIC.len())?;
        let [_, _, method, flags, ..] = self.field;
        if method != METHOD_DEFLATE {
            return Err(GzipError::Method(method));
        }
        if flags & FLAGS_RESERVED != 0 {
            return Err(GzipError::ReservedFlags(flags));
        }
        self.flags = flags;
        Ok(())
    }

    /// The header field after `done`, skipping those the flags say are absent; then the data.
    fn next_after(&self, done: Step) -> Step {
        let optional = [
            (Step::ExtraLength, FLAG_EXTRA),
            (Step::Name, FLAG_NAME),
            (Step::Comment, FLAG_COMMENT),
            (Step::HeaderChecksum, FLAG_HEADER_CRC),
        ];
        let from = match done {
            Step::Fixed => 0,
            Step::ExtraLength | Step::Extra { .. } => 1,
            Step::Name => 2,
            Step::Comment => 3,
            _ => optional.len(),
        };
        optional[from..]
            .iter()
            .find(|(_, flag)| self.flags & flag != 0)
            .map_or(Step::Data, |&(step, _)| step)
    }

    /// One call of the inflater: (input taken, output made, end of this member's data).
    fn inflate(&mut self, input: &[u8], out: &mut [u8]) -> Result<(usize, usize, bool), GzipError> {
        let (in_before, out_before) = (self.inflate.total_in(), self.inflate.total_out());
        let status = self
            .inflate
            .decompress(input, out, FlushDecompress::None)
            .map_err(|err| GzipError::Deflate(err.to_string()))?;
        // Both differences are bounded by the lengths of the slices just given, so fit a usize.
        #[allow(clippy::cast_possible_truncation)]
        let (used, produced) = (
            (self.inflate.total_in() - in_before) as usize,
            (self.inflate.total_out() - out_before) as usize,
        );
        let ended = status == Status::StreamEnd;
        if !ended && used == 0 && produced == 0 && !input.is_empty() && !out.is_empty() {
            return Err(GzipError::Deflate("no progress on the input given".into()));
        }
        Ok((used, produced, ended))
    }

    fn check_trailer(&self) -> Result<(), GzipError> {
        let word = |at: usize| {
            u32::from_le_bytes([
                self.field[at],
                self.field[at + 1],
                self.field[at + 2],
                self.field[at + 3],
            ])
        };
        let (crc, length) = (word(0), word(4));
        if crc != self.data_crc.sum() {
            return Err(GzipError::Checksum {
                trailer: crc,
                data: self.data_crc.sum(),
            });
        }
        if length != self.data_crc.amount() {
            return Err(GzipError::Length {
                trailer: length,
                data: self.data_crc.amount(),
            });
        }
        Ok(())
    }

    /// Ready for another member, or for the end of the body.
    fn next_member(&mut self) {
        self.members += 1;
        self.step = Step::Fixed;
        self.flags = 0;
        self.header_crc.reset();
        self.data_crc.reset();
        self.inflate.reset(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::GzEncoder;
    use flate2::{Compression, GzBuilder};
    use std::io::Write;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    /// Decodes `body` fed in pieces of `piece` bytes through an output buffer of `out_len`.
    fn decode(body: &[u8], piece: usize, out_len: usize) -> Result<Vec<u8>, GzipError> {
        let mut decoder = Decoder::default();
        let mut out = vec![0; out_len];
        let mut decoded = Vec::new();
        for mut chunk in body.chunks(piece) {
            loop {
                let (used, made) = decoder.feed(chunk, &mut out)?;
                decoded.extend_from_slice(&out[..made]);
                chunk = &chunk[used..];
                if chunk.is_empty() && made < out.len() {
                    break;
                }
                assert!(used > 0 || made > 0, "no progress");
            }
        }
        decoder.finish()?;
        Ok(decoded)
    }

    /// Every way of splitting the input and sizing the output gives the same answer.
    fn decode_all_ways(body: &[u8]) -> Result<Vec<u8>, GzipError> {
        let whole = decode(body, body.len().max(1), 64 * 1024);
        for piece in [1, 2, 3, 7, 10, 64, 4096] {
            for out_len in [1, 5, 4096] {
                assert_eq!(decode(body, piece, out_len), whole, "{piece} {out_len}");
            }
        }
        whole
    }

    fn sample() -> Vec<u8> {
        (0..100_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect()
    }

    #[test]
    fn decodes_a_member_split_anywhere() {
        let data = sample();
        assert_eq!(decode_all_ways(&gzip(&data)), Ok(data));
        assert_eq!(decode_all_ways(&gzip(b"")), Ok(Vec::new()));
    }

    #[test]
    fn decodes_concatenated_members_as_one_stream() {
        let mut body = gzip(b"first, ");
        body.extend(gzip(b""));
        body.extend(gzip(b"second"));
        assert_eq!(decode_all_ways(&body), Ok(b"first, second".to_vec()));
    }

    #[test]
    fn skips_extra_name_and_comment_and_checks_the_header_crc() {
        let mut encoder = GzBuilder::new()
            .extra(vec![1, 2, 3, 0, 5])
            .filename("report.txt")
            .comment("made by a test")
            .write(Vec::new(), Compression::fast());
        encoder.write_all(b"with a full header").unwrap();
        let body = encoder.finish().unwrap();
        assert_eq!(decode_all_ways(&body), Ok(b"with a full header".to_vec()));

        // The same with FHCRC, built by hand: the CRC-16 of the header before it.
        let plain = gzip(b"crc");
        let mut header = plain[..FIXED_HEADER].to_vec();
        header[3] |= FLAG_HEADER_CRC;
        let mut crc = Crc::new();
        crc.update(&header);
        let mut body = header.clone();
        // The header's CRC16: the two low bytes of the CRC-32.
        body.extend_from_slice(&crc.sum().to_le_bytes()[..2]);
        body.extend_from_slice(&plain[FIXED_HEADER..]);
        assert_eq!(decode_all_ways(&body), Ok(b"crc".to_vec()));
        body[FIXED_HEADER] ^= 1;
        assert_eq!(decode_all_ways(&body), Err(GzipError::HeaderChecksum));
    }

    #[test]
    fn refuses_bad_headers() {
        let good = gzip(b"x");
        let with = |at: usize, byte: u8| {
            let mut body = good.clone();
            body[at] = byte;
            body
        };
        assert_eq!(decode_all_ways(b"plain text"), Err(GzipError::NotGzip));
        assert_eq!(decode_all_ways(&with(1, 0)), Err(GzipError::NotGzip));
        assert_eq!(decode_all_ways(&with(2, 7)), Err(GzipError::Method(7)));
        assert_eq!(
            decode_all_ways(&with(3, 0x20)),
            Err(GzipError::ReservedFlags(0x20))
        );
        assert_eq!(decode_all_ways(b""), Err(GzipError::Empty));
    }

    #[test]
    fn refuses_truncated_bodies_wherever_they_end() {
        let body = gzip(&sample());
        for (len, part) in [
            (1, "header"),
            (9, "header"),
            (FIXED_HEADER, "deflate stream"),
            (body.len() / 2, "deflate stream"),
            (body.len() - TRAILER, "trailer"),
            (body.len() - 1, "trailer"),
        ] {
            assert_eq!(
                decode_all_ways(&body[..len]),
                Err(GzipError::Truncated(part)),
                "{len}"
            );
        }
        // A second member cut short is a truncation too.
        let mut two = body.clone();
        two.extend_from_slice(&body[..5]);
        assert_eq!(decode_all_ways(&two), Err(GzipError::Truncated("header")));
    }

    #[test]
    fn refuses_trailing_data_corrupt_data_and_wrong_trailers() {
        let body = gzip(&sample());
        for tail in [
            &b"garbage"[..],
            b"\0",
            b"\0\0\0\0\0\0\0\0\0\0\0\0",
            b"\x1f\x00",
        ] {
            let mut padded = body.clone();
            padded.extend_from_slice(tail);
            assert_eq!(
                decode_all_ways(&padded),
                Err(GzipError::TrailingData),
                "{tail:?}"
            );
        }
        let crc_at = body.len() - TRAILER;
        let mut wrong_crc = body.clone();
        wrong_crc[crc_at] ^= 0xff;
        assert!(matches!(
            decode_all_ways(&wrong_crc),
            Err(GzipError::Checksum { .. })
        ));
        let mut wrong_length = body.clone();
        wrong_length[crc_at + 4] ^= 0xff;
        assert!(matches!(
            decode_all_ways(&wrong_length),
            Err(GzipError::Length { .. })
        ));
        // A block type 3 (reserved) right after the header.
        let mut corrupt = body[..FIXED_HEADER].to_vec();
        corrupt.extend_from_slice(&[0xff; 32]);
        assert!(matches!(
            decode_all_ways(&corrupt),
            Err(GzipError::Deflate(_))
        ));
    }

    #[test]
    fn a_bomb_is_decoded_through_a_small_buffer() {
        let zeros = vec![0u8; 8 << 20];
        let body = gzip(&zeros);
        assert!(body.len() < 16 * 1024, "{}", body.len());
        let mut decoder = Decoder::default();
        let mut out = [0u8; 4096];
        let (mut input, mut total) = (&body[..], 0usize);
        loop {
            let (used, made) = decoder.feed(input, &mut out).unwrap();
            assert!(out[..made].iter().all(|&b| b == 0));
            input = &input[used..];
            total += made;
            if input.is_empty() && made < out.len() {
                break;
            }
        }
        decoder.finish().unwrap();
        assert_eq!(total, zeros.len());
    }

    /// A small fuzz run inside `make test` (the `gzip` fuzz target goes further): damaged
    /// bodies give the same verdict however they are split, and never panic or stall.
    #[test]
    fn damaged_bodies_are_decoded_alike_however_split() {
        let mut encoder = GzBuilder::new()
            .filename("f")
            .write(Vec::new(), Compression::default());
        encoder.write_all(&sample()[..5000]).unwrap();
        let mut good = encoder.finish().unwrap();
        good.extend(gzip(b"second member"));
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |below: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            usize::try_from(state % below as u64).unwrap()
        };
        for _ in 0..200 {
            let mut body = good.clone();
            match next(3) {
                0 => {
                    for _ in 0..=next(3) {
                        let at = next(body.len());
                        body[at] ^= 1 << next(8);
                    }
                }
                1 => body.truncate(next(body.len())),
                _ => body.extend((0..next(12)).map(|_| u8::try_from(next(256)).unwrap())),
            }
            let whole = decode(&body, body.len().max(1), 64 * 1024);
            for (piece, out_len) in [(1, 1), (3, 7), (64, 100)] {
                assert_eq!(decode(&body, piece, out_len), whole, "{piece} {out_len}");
            }
        }
    }

    #[test]
    fn messages_say_what_is_wrong() {
        assert_eq!(
            GzipError::Truncated("trailer").to_string(),
            "truncated: the body ended inside a gzip trailer"
        );
        assert_eq!(
            GzipError::Checksum {
                trailer: 0xdeadbeef,
                data: 1
            }
            .to_string(),
            "CRC-32 mismatch: the trailer says deadbeef, the data has 00000001"
        );
    }
}
