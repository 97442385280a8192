//! Request heads: parsed by `httparse`, copied once into an owned [`Head`].
//!
//! The head owns one copy of its bytes and keeps ranges into it, so a request costs two
//! vectors whatever its number of headers, and on a worker they are the previous request's
//! ([`crate::spare`]): no allocation. Limits (SPEC §10): 64 KiB, 100 headers.

use std::mem::MaybeUninit;
use std::ops::Range;

use crate::spare;

/// Largest request line plus headers accepted.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most header fields accepted in one request.
pub const MAX_HEADERS: usize = 100;

/// Methods named without looking at the head's bytes again.
const KNOWN_METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"];

/// Why a head was refused. `TooLarge` is answered 431, `Malformed` 400; both close the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadError {
    /// Over 64 KiB or 100 header fields.
    TooLarge,
    /// Not an HTTP/1.x head; the reason.
    Malformed(&'static str),
}

/// A parsed request head.
#[derive(Debug, Clone)]
pub struct Head {
    bytes: Vec<u8>,
    method: Range<usize>,
    /// The method when it is one of the common ones: asked for often, and then no UTF-8
    /// check of the bytes is needed.
    known_method: Option<&'static str>,
    target: Range<usize>,
    /// The target's path and query (without `?`), found once: routing asks for them often.
    path: Range<usize>,
    query: Range<usize>,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub(crate) minor_version: u8,
    headers: Vec<(Range<usize>, Range<usize>)>,
}

/// The vectors go back to the thread's spares for the next request.
impl Drop for Head {
    fn drop(&mut self) {
        spare::give_head_bytes(std::mem::take(&mut self.bytes));
        spare::give_fields(std::mem::take(&mut self.headers));
    }
}

impl Head {
    /// Parses the head at the start of `buf`. `Ok(None)`: incomplete, read more. `Ok(Some((head,
    /// n)))`: the head took the first `n` bytes. A head not complete within [`MAX_HEAD_BYTES`] is
    /// `TooLarge`.
    pub fn parse(buf: &[u8]) -> Result<Option<(Head, usize)>, HeadError> {
        // Left uninitialised: httparse writes the fields it finds (3.2 KiB zeroed per request
        // otherwise).
        let mut fields = [const { MaybeUninit::<httparse::Header>::uninit() }; MAX_HEADERS];
        let mut request = httparse::Request::new(&mut []);
        let status = match request.parse_with_uninit_headers(buf, &mut fields) {
            Ok(status) => status,
            Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
            Err(e) => return Err(HeadError::Malformed(malformed_reason(e))),
        };
        let len = match status {
            httparse::Status::Complete(len) if len <= MAX_HEAD_BYTES => len,
            httparse::Status::Complete(_) => return Err(HeadError::TooLarge),
            httparse::Status::Partial if buf.len() >= MAX_HEAD_BYTES => {
                return Err(HeadError::TooLarge)
            }
            httparse::Status::Partial => return Ok(None),
        };
        let base = buf.as_ptr() as usize;
        let range_of = |part: &[u8]| {
            let start = part.as_ptr() as usize - base;
            start..start + part.len()
        };
        let (Some(method), Some(target), Some(minor_version)) =
            (request.method, request.path, request.version)
        else {
            return Err(HeadError::Malformed("incomplete request line"));
        };
        let target_range = range_of(target.as_bytes());
        let (path, query) = path_and_query(target);
        let at =
            |part: Range<usize>| target_range.start + part.start..target_range.start + part.end;
        let head = Head {
            known_method: KNOWN_METHODS.iter().copied().find(|known| *known == method),
            method: range_of(method.as_bytes()),
            path: at(path),
            query: at(query),
            target: target_range,
            minor_version,
            headers: {
                let mut fields = spare::fields();
                fields.extend(
                    request
                        .headers
                        .iter()
                        .map(|h| (range_of(h.name.as_bytes()), range_of(h.value))),
                );
                fields
            },
            bytes: {
                let mut bytes = spare::head_bytes();
                bytes.extend_from_slice(&buf[..len]);
                bytes
            },
        };
        Ok(Some((head, len)))
    }

    /// The request method, e.g. `GET`.
    pub fn method(&self) -> &str {
        match self.known_method {
            Some(method) => method,
            None => self.text(&self.method),
        }
    }

    /// The request target as sent: path and query, still percent-encoded.
    pub fn target(&self) -> &str {
        self.text(&self.target)
    }

    /// The path part of the target (before `?`); `/` for an absolute-form target without one.
    pub fn path(&self) -> &str {
        match self.text(&self.path) {
            "" => "/",
            path => path,
        }
    }

    /// The raw query (after `?`), empty when absent.
    pub fn raw_query(&self) -> &str {
        self.text(&self.query)
    }

    /// RFC 9112 §3.2: an HTTP/1.1 request carries exactly one `Host`; any `Host` sent must be
    /// a valid authority (an empty one is allowed). The reason when it is not.
    pub(crate) fn check_host(&self) -> Result<(), &'static str> {
        let mut hosts = self.headers_named("host");
        let first = hosts.next();
        if hosts.next().is_some() {
            return Err("more than one Host header");
        }
        match first {
            None if self.minor_version >= 1 => Err("an HTTP/1.1 request needs a Host header"),
            None => Ok(()),
            Some(host) if host.iter().all(|&b| is_authority_byte(b)) => Ok(()),
            Some(_) => Err("not a valid host[:port]"),
        }
    }

    /// The first header named `name` (ASCII case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| self.bytes[n.clone()].eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| &self.bytes[v.clone()])
    }

    /// Every header named `name`, in order.
    pub fn headers_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| self.bytes[n.clone()].eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| &self.bytes[v.clone()])
    }

    /// Every header as (name, value), in order.
    pub fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.headers
            .iter()
            .map(|(n, v)| (&self.bytes[n.clone()], &self.bytes[v.clone()]))
    }

    /// True when a comma-separated header such as `Connection` lists `token`.
    pub(crate) fn header_has_token(&self, name: &str, token: &str) -> bool {
        self.headers_named(name).any(|value| {
            value
                .split(|&b| b == b',')
                .any(|item| item.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
        })
    }

    fn text(&self, range: &Range<usize>) -> &str {
        // httparse only yields method and target made of visible ASCII.
        std::str::from_utf8(&self.bytes[range.clone()]).unwrap_or("")
    }
}

/// The path and the query (after `?`) of `target`, as ranges of it, without the scheme and
/// authority of an absolute-form target (`GET http://host/health`, RFC 9112 §3.2.2), which
/// servers must accept.
fn path_and_query(target: &str) -> (Range<usize>, Range<usize>) {
    let mut start = 0;
    for scheme in ["http://", "https://"] {
        let prefix = target.get(..scheme.len());
        if prefix.is_some_and(|p| p.eq_ignore_ascii_case(scheme)) {
            let rest = &target[scheme.len()..];
            start = rest
                .find(['/', '?'])
                .map_or(target.len(), |at| scheme.len() + at);
            break;
        }
    }
    match target[start..].find('?') {
        Some(at) => (start..start + at, start + at + 1..target.len()),
        None => (start..target.len(), target.len()..target.len()),
    }
}

/// Bytes of `host [ ":" port ]` (RFC 3986 reg-name, IP literals, percent-encoding).
fn is_authority_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:[]%".contains(&b)
}

fn malformed_reason(error: httparse::Error) -> &'static str {
    match error {
        httparse::Error::HeaderName => "invalid header name",
        httparse::Error::HeaderValue => "invalid header value",
        httparse::Error::NewLine | httparse::Error::Token => "malformed request line",
        httparse::Error::Status => "invalid status",
        httparse::Error::Version => "unsupported HTTP version",
        httparse::Error::TooManyHeaders => "too many headers",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &[u8]) -> Result<Option<(Head, usize)>, HeadError> {
        Head::parse(text)
    }

    #[test]
    fn parses_method_target_version_and_headers() {
        let text =
            b"GET /files?path=a%20b&x=1 HTTP/1.1\r\nHost: h\r\nX-Access-Token: t\r\n\r\nBODY";
        let (head, len) = parse(text).unwrap().unwrap();
        assert_eq!(len, text.len() - 4);
        assert_eq!(head.method(), "GET");
        assert_eq!(head.target(), "/files?path=a%20b&x=1");
        assert_eq!(head.path(), "/files");
        assert_eq!(head.raw_query(), "path=a%20b&x=1");
        assert_eq!(head.minor_version, 1);
        assert_eq!(head.header("x-access-token"), Some(&b"t"[..]));
        assert_eq!(head.header("HOST"), Some(&b"h"[..]));
        assert_eq!(head.header("missing"), None);
    }

    #[test]
    fn incomplete_head_asks_for_more() {
        assert!(parse(b"GET / HTTP/1.1\r\nHost: h\r\n").unwrap().is_none());
        assert!(parse(b"").unwrap().is_none());
    }

    #[test]
    fn connection_tokens_are_matched_in_lists() {
        let text = b"GET / HTTP/1.0\r\nConnection: Upgrade, Keep-Alive\r\n\r\n";
        let (head, _) = parse(text).unwrap().unwrap();
        assert!(head.header_has_token("connection", "keep-alive"));
        assert!(!head.header_has_token("connection", "close"));
        assert_eq!(head.minor_version, 0);
    }

    #[test]
    fn too_many_headers_is_too_large() {
        let mut text = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..=MAX_HEADERS {
            text.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
        }
        text.extend_from_slice(b"\r\n");
        assert_eq!(parse(&text).unwrap_err(), HeadError::TooLarge);
    }

    #[test]
    fn head_over_64_kib_is_too_large() {
        let mut text = b"GET / HTTP/1.1\r\nX-Big: ".to_vec();
        text.resize(MAX_HEAD_BYTES + 10, b'a');
        assert_eq!(parse(&text).unwrap_err(), HeadError::TooLarge);
        text.extend_from_slice(b"\r\n\r\n");
        assert_eq!(parse(&text).unwrap_err(), HeadError::TooLarge);
    }

    #[test]
    fn absolute_form_targets_keep_their_path_and_query() {
        for (target, path, query) in [
            ("http://h:1/health?x=1", "/health", "x=1"),
            ("HTTPS://h/files", "/files", ""),
            ("http://h", "/", ""),
            ("http://h?a=b", "/", "a=b"),
            ("/plain?q", "/plain", "q"),
        ] {
            let text = format!("GET {target} HTTP/1.1\r\nHost: h\r\n\r\n");
            let (head, _) = parse(text.as_bytes()).unwrap().unwrap();
            assert_eq!((head.path(), head.raw_query()), (path, query), "{target}");
            assert_eq!(head.target(), target);
        }
    }

    #[test]
    fn host_rules() {
        let check = |text: &str| parse(text.as_bytes()).unwrap().unwrap().0.check_host();
        assert_eq!(check("GET / HTTP/1.1\r\nHost: a.b:80\r\n\r\n"), Ok(()));
        assert_eq!(check("GET / HTTP/1.1\r\nHost: [::1]:8\r\n\r\n"), Ok(()));
        assert_eq!(check("GET / HTTP/1.1\r\nHost:\r\n\r\n"), Ok(()));
        assert_eq!(check("GET / HTTP/1.0\r\n\r\n"), Ok(()));
        assert!(check("GET / HTTP/1.1\r\n\r\n").is_err());
        assert!(check("GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n").is_err());
        assert!(check("GET / HTTP/1.1\r\nHost: a b\r\n\r\n").is_err());
        assert!(check("GET / HTTP/1.0\r\nHost: a/b\r\n\r\n").is_err());
    }

    #[test]
    fn garbage_is_malformed() {
        assert!(matches!(
            parse(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"),
            Err(HeadError::Malformed(_))
        ));
        assert!(matches!(
            parse(b"GET / HTTP/2.0\r\n\r\n"),
            Err(HeadError::Malformed(_))
        ));
    }
}
