//! A tar download's pieces: the next bytes of the archive made into the stream's buffer (the
//! plain form, handed over whole) or the thread's and compressed (the gzip form), and queued;
//! the job parks while the queue is full (`gzip::Produce`).

use flate2::FlushCompress;

use super::{TarJob, PLAIN_PIECE, PLAIN_QUEUE};
use crate::api::download::gzip::{self, Next, Produce, Work, HEADER, PIECE, QUEUE, ROOM};
use crate::fs::as_user::Identity;
use crate::http::stream::{SendError, StreamSender};

impl TarJob {
    fn piece_size(&self) -> usize {
        match self.crc {
            Some(_) => PIECE,
            None => PLAIN_PIECE,
        }
    }

    /// Compresses `work.piece` (the archive's next bytes) into `work.output` as the gzip form
    /// has it.
    fn compress(&mut self, work: &mut Work, last: bool) -> Result<(), String> {
        let Some(crc) = &mut self.crc else {
            return Ok(());
        };
        crc.update(&work.piece);
        work.output.clear();
        if !self.started {
            work.output.extend_from_slice(&HEADER);
            self.started = true;
        }
        let flush = if last {
            FlushCompress::Finish
        } else {
            FlushCompress::Sync
        };
        work.compressor.reset();
        gzip::deflate(&mut work.compressor, &work.piece, &mut work.output, flush)
            .map_err(|e| format!("compressing: {e}"))?;
        if last {
            work.output.extend_from_slice(&crc.sum().to_le_bytes());
            work.output.extend_from_slice(&crc.amount().to_le_bytes());
        }
        Ok(())
    }

    /// Makes the next piece into `work.piece` (for the plain form, in a buffer of the
    /// stream's, which becomes its queue without a copy) and, for the gzip form, its output
    /// into `work.output`. Whether it is the last.
    fn make_piece(&mut self, work: &mut Work, sender: &StreamSender) -> Result<bool, String> {
        let mut piece = if self.crc.is_some() {
            std::mem::take(&mut work.piece)
        } else {
            sender.buffer()
        };
        piece.clear();
        piece.reserve_exact(self.piece_size());
        let identity = self.identity.clone();
        let as_user = identity.as_ref().map(Identity::enter).transpose();
        let result = match as_user {
            Ok(_guard) => self.fill(&mut piece, self.piece_size()),
            Err(e) => Err(format!("acting as the user: {e}")),
        };
        work.piece = piece;
        let last = result?;
        self.compress(work, last)?;
        Ok(last)
    }
}

impl Produce for TarJob {
    fn sender(&self) -> Option<&StreamSender> {
        self.sender.as_ref()
    }

    fn step(&mut self, work: &mut Work) -> Next {
        let Some(sender) = self.sender.take() else {
            return Next::Done;
        };
        if !self.unsent.is_empty() {
            match sender.send_owned(std::mem::take(&mut self.unsent)) {
                Ok(()) => {}
                Err((SendError::Full, back)) => {
                    self.unsent = back;
                    let wait = Next::Wait(self.unsent.len());
                    self.sender = Some(sender);
                    return wait;
                }
                Err((SendError::Closed, _)) => return Next::Done,
            }
        }
        if sender.is_closed() {
            return Next::Done;
        }
        let (room, queue) = match self.crc {
            Some(_) => (ROOM, QUEUE),
            None => (PLAIN_PIECE, PLAIN_QUEUE),
        };
        if sender.queued() + room > queue {
            self.sender = Some(sender);
            return Next::Wait(room);
        }
        let last = match self.make_piece(work, &sender) {
            Ok(last) => last,
            Err(error) => {
                self.sender = Some(sender);
                self.cut(&error);
                return Next::Done;
            }
        };
        // The gzip form's output is the thread's (copied into the queue); the plain form's
        // piece is handed over.
        let out = match self.crc {
            Some(_) => Out::Copied(&work.output),
            None => Out::Owned(std::mem::take(&mut work.piece)),
        };
        if last {
            sender.finish_with(out.bytes());
            return Next::Done;
        }
        let sent = match out {
            Out::Copied(bytes) => sender.send(bytes).map_err(|error| (error, bytes.to_vec())),
            Out::Owned(bytes) => sender.send_owned(bytes),
        };
        let next = match sent {
            Ok(()) => Next::More,
            Err((SendError::Closed, _)) => return Next::Done,
            Err((SendError::Full, back)) => {
                self.unsent = back;
                Next::Wait(self.unsent.len())
            }
        };
        self.sender = Some(sender);
        next
    }
}

/// A piece's bytes for the stream: the thread's buffer, or one handed over.
enum Out<'a> {
    Copied(&'a [u8]),
    Owned(Vec<u8>),
}

impl Out<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Out::Copied(bytes) => bytes,
            Out::Owned(bytes) => bytes,
        }
    }
}
