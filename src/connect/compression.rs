//! gzip, the one compression Connect clients share (connect-go registers it by default): the
//! request messages it compresses are inflated here, whole and bounded, and the answers a
//! client accepts compressed are deflated here, at level 1.
//!
//! Decisions:
//! - Inflating uses the upload routes' gzip decoder (`api::upload::gzip`: RFC 1952 checked
//!   field by field, members concatenated as Go reads them) into at most
//!   [`super::MAX_REQUEST_BYTES`]: whatever the ratio, a bomb costs at most that, and past it the
//!   call is `resource_exhausted`.
//! - Only messages of at least [`MIN_BYTES`] are compressed. A gzip member adds 18 bytes of
//!   framing and deflate a few more, and the daemon's small messages (an entry, an event, a
//!   keep-alive, a start) are a few hundred bytes of mostly unique text: compressing them
//!   spends microseconds to save tens of bytes on a link that is loopback or a data-center
//!   network. From 1 KiB, output chunks and listings gain 2 to 10 times.
//! - Level 1: the bulk is process output and listings, produced while the client waits; level
//!   1 keeps most of the gain (text shrinks 3 to 5 times) at several times level 6's speed.

use std::cell::RefCell;

use flate2::{Compress, Compression, Crc, FlushCompress, Status};

use super::{Code, Error, MAX_REQUEST_BYTES};
use crate::api::upload::gzip::{Decoder, GzipError};

/// The smallest message compressed for a client that accepts gzip.
pub const MIN_BYTES: usize = 1024;

/// The gzip header sandboxd writes: no name, no time, "fastest" (XFL 4), OS unknown (255).
const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 255];

/// Inflates one gzip message, of at most [`MAX_REQUEST_BYTES`] once inflated.
pub fn inflate(compressed: &[u8]) -> Result<Vec<u8>, Error> {
    let mut inflater = Inflater::default();
    let out = inflater.push(compressed)?;
    inflater.finish()?;
    Ok(out)
}

/// A gzip message inflated as its pieces arrive; counts what it gave against the limit.
#[derive(Default)]
pub struct Inflater {
    decoder: Decoder,
    given: usize,
}

impl Inflater {
    /// The bytes `piece` completes.
    pub fn push(&mut self, mut piece: &[u8]) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        let mut buffer = [0u8; 16 << 10];
        loop {
            let (used, made) = self.decoder.feed(piece, &mut buffer).map_err(malformed)?;
            piece = &piece[used..];
            self.given += made;
            if self.given > MAX_REQUEST_BYTES {
                return Err(Error::new(
                    Code::ResourceExhausted,
                    format!(
                        "a compressed message inflates past the limit of {MAX_REQUEST_BYTES} \
                         bytes"
                    ),
                ));
            }
            out.extend_from_slice(&buffer[..made]);
            if made < buffer.len() && piece.is_empty() {
                return Ok(out);
            }
        }
    }

    /// The message ended: fine only after a whole gzip member.
    pub fn finish(&self) -> Result<(), Error> {
        self.decoder.finish().map_err(malformed)
    }
}

fn malformed(error: GzipError) -> Error {
    Error::invalid_argument(format!("malformed gzip message: {error}"))
}

/// Deflates messages, reusing its state from message to message (reset for each: every message
/// is a gzip member of its own).
pub struct Deflater {
    compress: Compress,
}

impl Default for Deflater {
    fn default() -> Deflater {
        Deflater {
            compress: Compress::new(Compression::fast(), false),
        }
    }
}

impl Deflater {
    /// Appends `message` as one gzip member to `out`.
    pub fn gzip(&mut self, message: &[u8], out: &mut Vec<u8>) {
        self.compress.reset();
        out.extend_from_slice(&HEADER);
        // Deflate's worst case is a few bytes per 16 KiB block over the input.
        out.reserve(message.len() + message.len() / 1000 + 64);
        let mut input = message;
        loop {
            let before_in = self.compress.total_in();
            let status = self
                .compress
                .compress_vec(input, out, FlushCompress::Finish);
            let used = usize::try_from(self.compress.total_in() - before_in).unwrap_or(0);
            input = &input[used..];
            match status {
                Ok(Status::StreamEnd) => break,
                // Out of room: more, and go on.
                Ok(Status::Ok | Status::BufError) => out.reserve(out.capacity().max(4096)),
                // Deflating bytes in memory has no failure but a bug; its state is reset on
                // the next message and this one is cut short, which the client's CRC check
                // reports.
                Err(_) => break,
            }
        }
        let mut crc = Crc::new();
        crc.update(message);
        out.extend_from_slice(&crc.sum().to_le_bytes());
        // ISIZE is the length modulo 2^32 (RFC 1952 §2.3.1).
        #[allow(clippy::cast_possible_truncation)]
        out.extend_from_slice(&(message.len() as u32).to_le_bytes());
    }
}

thread_local! {
    /// The deflate state of this thread's stream messages, made at its first compressed one:
    /// a state is about 300 KiB, so one per producing thread (the process I/O thread, the
    /// watch thread), not one per stream (a thousand watches would hold 300 MiB).
    static STREAM_DEFLATER: RefCell<Option<Deflater>> = const { RefCell::new(None) };
}

/// Appends `message` as one gzip member to `out`, with the calling thread's deflate state.
pub fn gzip_on_thread(message: &[u8], out: &mut Vec<u8>) {
    STREAM_DEFLATER.with(|cell| match cell.try_borrow_mut() {
        Ok(mut state) => state
            .get_or_insert_with(Deflater::default)
            .gzip(message, out),
        Err(_) => Deflater::default().gzip(message, out),
    });
}

/// Whether an `Accept-Encoding` (or `Connect-Accept-Encoding`) value lists gzip with a
/// quality above 0.
pub fn accepts_gzip(value: &[u8]) -> bool {
    value.split(|&b| b == b',').any(|item| {
        let mut parts = item.split(|&b| b == b';');
        let coding = parts.next().unwrap_or_default().trim_ascii();
        let refused = parts.any(|param| {
            let param = param.trim_ascii();
            param.len() >= 2
                && param[..2].eq_ignore_ascii_case(b"q=")
                && std::str::from_utf8(&param[2..])
                    .ok()
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
        });
        (coding.eq_ignore_ascii_case(b"gzip") || coding.eq_ignore_ascii_case(b"x-gzip")) && !refused
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn gunzip_with_flate2(bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(bytes)
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    #[test]
    fn deflated_messages_are_gzip_members_any_reader_takes() {
        let mut deflater = Deflater::default();
        let text: Vec<u8> = (0..50_000)
            .flat_map(|i| format!("line {i}\n").into_bytes())
            .collect();
        for message in [&b""[..], b"a", &text, &[0xa5; 300_000]] {
            let mut out = b"kept".to_vec();
            deflater.gzip(message, &mut out);
            assert_eq!(&out[..4], b"kept");
            assert_eq!(gunzip_with_flate2(&out[4..]), message);
            assert_eq!(inflate(&out[4..]).unwrap(), message);
        }
        let mut out = Vec::new();
        deflater.gzip(&text, &mut out);
        assert!(
            out.len() < text.len() / 3,
            "{} of {}",
            out.len(),
            text.len()
        );
    }

    #[test]
    fn inflating_is_bounded_and_checked() {
        let mut bomb = Vec::new();
        Deflater::default().gzip(&vec![0; MAX_REQUEST_BYTES + 1], &mut bomb);
        assert!(bomb.len() < 20_000, "{}", bomb.len());
        assert_eq!(inflate(&bomb).unwrap_err().code, Code::ResourceExhausted);
        let mut exact = Vec::new();
        Deflater::default().gzip(&vec![0; MAX_REQUEST_BYTES], &mut exact);
        assert_eq!(inflate(&exact).unwrap().len(), MAX_REQUEST_BYTES);
        let mut good = Vec::new();
        Deflater::default().gzip(b"hello", &mut good);
        for bad in [&b""[..], b"plain", &good[..good.len() - 1]] {
            let error = inflate(bad).unwrap_err();
            assert_eq!(error.code, Code::InvalidArgument, "{bad:?}");
            assert!(error.message.starts_with("malformed gzip message"));
        }
        // In pieces, as a stream's message arrives.
        let mut inflater = Inflater::default();
        let mut out = Vec::new();
        for piece in good.chunks(3) {
            out.extend(inflater.push(piece).unwrap());
        }
        inflater.finish().unwrap();
        assert_eq!(out, b"hello");
    }

    #[test]
    fn accept_encoding_lists() {
        for yes in [
            "gzip",
            "GZIP",
            "br, gzip",
            "gzip;q=0.5",
            "x-gzip",
            " identity , gzip ; q=1",
        ] {
            assert!(accepts_gzip(yes.as_bytes()), "{yes}");
        }
        for no in [
            "",
            "identity",
            "br",
            "gzip;q=0",
            "gzip; q=0.0",
            "gzipx",
            "*",
        ] {
            assert!(!accepts_gzip(no.as_bytes()), "{no}");
        }
    }
}
