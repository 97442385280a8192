//! Starting an answer: the handler's [`Response`] written as a head into the worker's buffer,
//! with its body (bytes, a file range, a stream) chosen for sending and what follows the
//! answer settled; and a [`deferred`](crate::deferred) answer awaited, holding no worker, until
//! it comes.

use super::after::After;
use super::send::{Batch, Outgoing, Reply, Sending};
use super::{log, Conn, Context, Exchange, Io, Phase, Step, Wait};
use crate::deferred::{Deferred, Ready};
use crate::handler::Handler;
use crate::response::{self, HeadOptions, Response, ResponseBody};

/// Largest in-memory body sent from the worker's buffer; a larger one gets a buffer of its own.
const INLINE_BODY: usize = 16 * 1024;

/// A deferred answer awaited: see [`crate::deferred`].
pub(super) struct Waiting {
    exchange: Exchange,
    after: After,
    deferred: Deferred,
    /// Headers set on the response that carried the deferred answer (CORS, say): added to it.
    headers: Vec<(&'static str, std::borrow::Cow<'static, str>)>,
    close: bool,
}

impl Conn {
    /// Starts writing `response`.
    pub(super) fn respond<H: Handler>(
        &mut self,
        exchange: Exchange,
        mut response: Response,
        after: After,
        cx: &mut Context<'_, H>,
    ) -> Step {
        if let ResponseBody::Deferred(deferred) = response.body {
            self.phase = Phase::Waiting(Box::new(Waiting {
                exchange,
                after,
                deferred,
                headers: response.headers,
                close: response.close,
            }));
            return Step::Continue;
        }
        let keep_alive = exchange.keep_alive && !response.close && !cx.stopping;
        let after = match after {
            After::KeepAlive if !keep_alive => After::Close,
            // Closing with body bytes still to come would reset a peer that is still sending
            // before it reads the answer: linger instead.
            After::Discard(framing) if !keep_alive && !framing.is_done() => After::Linger,
            After::Discard(_) if !keep_alive => After::Close,
            After::Discard(framing) if framing.is_done() => After::KeepAlive,
            After::Discard(framing) => After::Discard(framing),
            other => other,
        };
        let out = &mut *cx.out;
        out.clear();
        let options = HeadOptions {
            server_and_date: cx.server_and_date,
            keep_alive: !matches!(after, After::Close | After::Linger),
            announce_keep_alive: !exchange.http11,
            chunked_allowed: exchange.http11,
        };
        let framing = response::write_head(out, &response, &options);
        crate::spare::give_headers(std::mem::take(&mut response.headers));
        let send_body = !exchange.head_only && framing != response::Framing::None;
        let after = if framing == response::Framing::Close {
            After::Close
        } else {
            after
        };
        // In-memory bodies leave with the head; they count as sent once queued.
        let counted_bytes = match &response.body {
            ResponseBody::Bytes(bytes) if send_body => bytes.len() as u64,
            _ => 0,
        };
        let body = match response.body {
            ResponseBody::Bytes(bytes) if send_body && bytes.len() > INLINE_BODY => {
                let mut whole = Vec::with_capacity(out.len() + bytes.len());
                whole.extend_from_slice(out);
                whole.extend_from_slice(&bytes);
                out.clear();
                self.phase = Phase::Send(Box::new(Sending {
                    exchange,
                    status: response.status,
                    body_bytes: counted_bytes,
                    out: whole,
                    sent: 0,
                    body: Outgoing::None,
                    last_progress: cx.now,
                    after,
                }));
                return Step::Continue;
            }
            ResponseBody::Bytes(bytes) if send_body => {
                out.extend_from_slice(&bytes);
                Outgoing::None
            }
            ResponseBody::File { file, offset, len } if send_body && len > 0 => Outgoing::File {
                file,
                offset,
                end: offset.saturating_add(len),
                corked: false,
            },
            ResponseBody::Stream(source) if send_body => Outgoing::Stream {
                source,
                chunked: framing == response::Framing::Chunked,
                batch: Batch::default(),
            },
            _ => Outgoing::None,
        };
        if let Outgoing::None = body {
            self.phase = Phase::Closed;
            return Step::Reply(Reply {
                exchange,
                status: response.status,
                body_bytes: counted_bytes,
                after,
            });
        }
        let head = out.to_vec();
        out.clear();
        self.phase = Phase::Send(Box::new(Sending {
            exchange,
            status: response.status,
            body_bytes: counted_bytes,
            out: head,
            sent: 0,
            body,
            last_progress: cx.now,
            after,
        }));
        Step::Continue
    }

    /// A deferred answer: written once it came; meanwhile parked, only the peer leaving
    /// watched (then closed: dropping the [`Deferred`] tells the work its client is gone).
    pub(super) fn wait_answer<H: Handler>(
        &mut self,
        io: &mut impl Io,
        cx: &mut Context<'_, H>,
    ) -> Step {
        let Phase::Waiting(waiting) = &mut self.phase else {
            return Step::Close;
        };
        match waiting.deferred.poll(cx.waker) {
            Ready::Answer(mut response) => {
                let Phase::Waiting(waiting) = std::mem::replace(&mut self.phase, Phase::Closed)
                else {
                    return Step::Close;
                };
                let Waiting {
                    exchange,
                    after,
                    headers,
                    close,
                    ..
                } = *waiting;
                response.headers.extend(headers);
                response.close |= close;
                self.respond(exchange, response, after, cx)
            }
            Ready::Pending if io.hung_up() => {
                log(cx, &waiting.exchange, 499, 0);
                Step::Close
            }
            Ready::Pending => Step::Wait(Wait::Producer, None),
            Ready::Abandoned => {
                log(cx, &waiting.exchange, 500, 0);
                Step::Close
            }
        }
    }
}
