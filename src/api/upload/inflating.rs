//! `Content-Encoding: gzip` uploads (SPEC §8): a body sink in front of the upload's own sink
//! (raw or multipart) that inflates the body as it arrives and hands the result on in pieces
//! of at most [`CHUNK_BYTES`]. The upload's sink never knows the body was compressed, so the
//! atomicity, 507 and ownership rules are the same as for a plain body.
//!
//! Memory stays flat whatever the ratio: one output buffer and the decoder's state per request.
//! A body that is not valid gzip (corrupt, truncated, with trailing data, a checksum mismatch;
//! see `gzip`) is 400 `invalid gzip body: ...`; the inner sink is then dropped without `end`,
//! which removes everything it wrote, so nothing of the request is placed.

use super::gzip::{Decoder, GzipError};
use crate::error::ApiError;
use crate::http::{BodySink, Response};

/// Largest piece handed to the inner sink at once.
pub const CHUNK_BYTES: usize = 64 * 1024;

/// Inflates a gzip body into `inner`.
pub struct Inflating {
    decoder: Decoder,
    out: Vec<u8>,
    inner: Box<dyn BodySink>,
}

impl Inflating {
    pub fn new(inner: Box<dyn BodySink>) -> Inflating {
        Inflating {
            decoder: Decoder::default(),
            out: vec![0; CHUNK_BYTES],
            inner,
        }
    }
}

impl BodySink for Inflating {
    fn data(&mut self, mut bytes: &[u8]) -> Result<(), Response> {
        loop {
            let (used, made) = self.decoder.feed(bytes, &mut self.out).map_err(invalid)?;
            bytes = &bytes[used..];
            if made > 0 {
                self.inner.data(&self.out[..made])?;
            }
            // A full buffer may mean more decoded bytes are waiting, even with no input left.
            if bytes.is_empty() && made < self.out.len() {
                return Ok(());
            }
        }
    }

    fn end(self: Box<Self>) -> Response {
        match self.decoder.finish() {
            Ok(()) => self.inner.end(),
            Err(err) => invalid(err),
        }
    }
}

fn invalid(err: GzipError) -> Response {
    ApiError::bad_request(format!("invalid gzip body: {err}")).into()
}
