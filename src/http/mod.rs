//! sandboxd's own HTTP/1.1 server layer. It knows no routes.
//!
//! It accepts connections, frames requests (heads by `httparse`, bodies by `Content-Length` or
//! chunked encoding), enforces limits and timeouts, and writes what a [`Handler`] returns:
//! JSON or other bytes, nothing, or a file region sent with `sendfile`. Why sandboxd owns this
//! loop rather than using a crate is told in the README's design section.

mod body;
pub mod chunked;
mod connection;
pub mod date;
pub mod head;
pub mod multipart;
pub mod query;
mod response;
mod server;
mod stream;

pub use body::{Body, Framing, FramingError};
pub use head::Head;
pub use response::{reason, Response, ResponseBody, SERVER};
pub use server::{start, ServerConfig, ServerHandle};

/// One request as handed to the handler: the parsed head and the body, read on demand.
pub struct Request<'a> {
    pub head: Head,
    pub body: Body<'a>,
}

/// What the server calls for every request. The response is written by the layer: HEAD
/// responses lose their body there, and `Content-Length` is always set there.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, request: &mut Request<'_>) -> Response;
}
