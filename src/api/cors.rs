//! CORS (SPEC §9a): browsers call sandboxd directly (the JS SDK, web pages fetching signed URLs).
//!
//! Owns the two things the router asks before and after routing: [`preflight`] answers a CORS
//! preflight by itself, before authentication (a browser never sends credentials on one), and
//! [`decorate`] adds the headers a cross-origin caller needs to every other answer. Policy, as
//! envd's (`rs/cors` with every origin allowed): any origin (`*`, so no credentials mode), the
//! requested method and headers allowed as asked, preflights cached by the browser for 7200 s.
//!
//! Decisions where SPEC leaves room:
//!
//! - A preflight is an `OPTIONS` carrying `Access-Control-Request-Method` (what the Fetch
//!   standard sends, and what `rs/cors` answers). A plain `OPTIONS` is an ordinary request: 405
//!   with `Allow` like any method a route does not serve.
//! - The preflight is answered whether or not `Origin` is present (a browser always sends it;
//!   the answer does not depend on it). A requested method or header list that is not made of
//!   HTTP tokens is not echoed, so the browser refuses the call rather than sandboxd reflecting
//!   arbitrary bytes.
//! - Answers to requests without `Origin` get no CORS headers (no bytes added to the common
//!   case). So that a browser's cache never hands a stored answer without them to a
//!   cross-origin `fetch` (an `<img>` of a signed URL, then a `fetch` of it), an answer a cache
//!   may keep, one with `ETag` or `Last-Modified` (downloads), carries `Vary: Origin` with or
//!   without `Origin`. Answers without validators are `no-store` or not reused by caches.

use crate::http::{Action, BodySink, Head, Response};

/// The response headers a cross-origin script may read beyond the CORS-safelisted ones: the
/// file name, validators and range of a download, the envd version of `/init`, and `Location`.
pub const EXPOSED_HEADERS: &str =
    "Content-Disposition, ETag, Content-Range, Content-Length, X-Envd-Version, Location";

/// How long a browser may cache a preflight's answer, in seconds (envd's two hours).
pub const MAX_AGE_SECS: &str = "7200";

/// The answer to a CORS preflight, or `None` when `head` is not one.
pub fn preflight(head: &Head) -> Option<Response> {
    if head.method() != "OPTIONS" {
        return None;
    }
    let method = head.header("access-control-request-method")?;
    let mut response = Response::empty(204)
        .with_header("Access-Control-Allow-Origin", "*")
        .with_header("Access-Control-Max-Age", MAX_AGE_SECS)
        .with_header(
            "Vary",
            "Access-Control-Request-Method, Access-Control-Request-Headers",
        );
    if let Some(method) = token_list(method).filter(|m| !m.contains(',')) {
        response = response.with_header("Access-Control-Allow-Methods", method.to_owned());
    }
    if let Some(headers) = head
        .header("access-control-request-headers")
        .and_then(token_list)
    {
        response = response.with_header("Access-Control-Allow-Headers", headers.to_owned());
    }
    Some(response)
}

/// Adds `Access-Control-Allow-Origin` and `Access-Control-Expose-Headers` to the answer of a
/// request that carries `Origin`, and `Vary: Origin` to any answer a cache may keep.
pub fn decorate(head: &Head, response: &mut Response) {
    add_headers(head.header("origin").is_some(), response);
}

fn add_headers(has_origin: bool, response: &mut Response) {
    let cacheable = response.headers.iter().any(|(name, _)| {
        name.eq_ignore_ascii_case("etag") || name.eq_ignore_ascii_case("last-modified")
    });
    if cacheable {
        // One `Vary` field: appended to the handler's (a download's `Accept-Encoding`).
        match response
            .headers
            .iter_mut()
            .find(|(name, _)| name.eq_ignore_ascii_case("vary"))
        {
            Some((_, value)) => *value = format!("{value}, Origin").into(),
            None => response.headers.push(("Vary", "Origin".into())),
        }
    }
    if has_origin {
        response
            .headers
            .push(("Access-Control-Allow-Origin", "*".into()));
        response
            .headers
            .push(("Access-Control-Expose-Headers", EXPOSED_HEADERS.into()));
    }
}

/// [`decorate`] for whatever answer `action` will produce: at once, after a collected body, or
/// after a consumed one (early refusals of a sink included).
pub fn decorate_action(head: &Head, action: Action) -> Action {
    let has_origin = head.header("origin").is_some();
    match action {
        Action::Respond(mut response) => {
            decorate(head, &mut response);
            Action::Respond(response)
        }
        Action::Collect { limit, then } => Action::Collect {
            limit,
            then: Box::new(move |head, body| {
                let mut response = then(head, body);
                decorate(head, &mut response);
                response
            }),
        },
        Action::Consume(sink) => Action::Consume(Box::new(CorsSink { sink, has_origin })),
    }
}

/// A body sink whose answers get the CORS headers.
struct CorsSink {
    sink: Box<dyn BodySink>,
    has_origin: bool,
}

impl CorsSink {
    fn decorate(&self, mut response: Response) -> Response {
        add_headers(self.has_origin, &mut response);
        response
    }
}

impl BodySink for CorsSink {
    fn data(&mut self, bytes: &[u8]) -> Result<(), Response> {
        self.sink.data(bytes).map_err(|r| self.decorate(r))
    }

    fn end(self: Box<Self>) -> Response {
        let has_origin = self.has_origin;
        let mut response = self.sink.end();
        add_headers(has_origin, &mut response);
        response
    }
}

/// `value` when it is a comma-separated list of HTTP tokens (RFC 9110 §5.6.2; optional
/// whitespace around the commas, empty elements allowed as the list syntax does), else `None`.
fn token_list(value: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(value).ok()?;
    let is_tchar = |c: u8| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c);
    let valid = text
        .split(',')
        .map(|item| item.trim_matches([' ', '\t']))
        .all(|item| item.bytes().all(is_tchar));
    (valid && !text.trim_matches([' ', '\t', ',']).is_empty()).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Head {
        match Head::parse(text.as_bytes()) {
            Ok(Some((head, _))) => head,
            other => panic!("{other:?}"),
        }
    }

    fn header<'a>(response: &'a Response, name: &str) -> Option<&'a str> {
        response
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_ref())
    }

    #[test]
    fn a_preflight_echoes_the_method_and_headers() {
        let response = preflight(&head(
            "OPTIONS /files?path=a HTTP/1.1\r\nOrigin: https://app.example\r\n\
             Access-Control-Request-Method: POST\r\n\
             Access-Control-Request-Headers: x-access-token, content-type\r\n\r\n",
        ))
        .expect("a preflight");
        assert_eq!(response.status, 204);
        assert_eq!(header(&response, "access-control-allow-origin"), Some("*"));
        assert_eq!(
            header(&response, "access-control-allow-methods"),
            Some("POST")
        );
        assert_eq!(
            header(&response, "access-control-allow-headers"),
            Some("x-access-token, content-type")
        );
        assert_eq!(header(&response, "access-control-max-age"), Some("7200"));
    }

    #[test]
    fn only_options_with_a_requested_method_is_a_preflight() {
        assert!(preflight(&head("OPTIONS /health HTTP/1.1\r\nOrigin: x\r\n\r\n")).is_none());
        assert!(preflight(&head(
            "GET /health HTTP/1.1\r\nAccess-Control-Request-Method: GET\r\n\r\n"
        ))
        .is_none());
        let response = preflight(&head(
            "OPTIONS /envs HTTP/1.1\r\nAccess-Control-Request-Method: GET\r\n\r\n",
        ))
        .expect("a preflight without Origin is answered too");
        assert_eq!(header(&response, "access-control-allow-headers"), None);
    }

    #[test]
    fn requested_values_that_are_not_tokens_are_not_echoed() {
        let response = preflight(&head(
            "OPTIONS /envs HTTP/1.1\r\nAccess-Control-Request-Method: GET, POST\r\n\
             Access-Control-Request-Headers: x-ok, bad header, \"q\"\r\n\r\n",
        ))
        .expect("a preflight");
        assert_eq!(response.status, 204);
        assert_eq!(header(&response, "access-control-allow-methods"), None);
        assert_eq!(header(&response, "access-control-allow-headers"), None);
        assert_eq!(token_list(b" , "), None);
        assert_eq!(token_list(b"a,,b"), Some("a,,b"));
        assert_eq!(token_list(b"\xff"), None);
    }

    #[test]
    fn answers_to_requests_with_origin_are_decorated() {
        let mut response = Response::empty(404);
        decorate(&head("GET /x HTTP/1.1\r\n\r\n"), &mut response);
        assert!(response.headers.is_empty());
        decorate(
            &head("GET /x HTTP/1.1\r\nOrigin: https://app.example\r\n\r\n"),
            &mut response,
        );
        assert_eq!(header(&response, "access-control-allow-origin"), Some("*"));
        assert_eq!(
            header(&response, "access-control-expose-headers"),
            Some(EXPOSED_HEADERS)
        );
        assert_eq!(header(&response, "vary"), None);
    }

    #[test]
    fn answers_a_cache_may_keep_vary_on_origin() {
        for request in [
            "GET /files HTTP/1.1\r\n\r\n",
            "GET /files HTTP/1.1\r\nOrigin: https://app.example\r\n\r\n",
        ] {
            let mut response = Response::empty(200).with_header("ETag", "\"1\"");
            decorate(&head(request), &mut response);
            assert_eq!(header(&response, "vary"), Some("Origin"), "{request}");
            // A download's own `Vary` is extended, not repeated.
            let mut response = Response::empty(200)
                .with_header("ETag", "\"1\"")
                .with_header("Vary", "Accept-Encoding");
            decorate(&head(request), &mut response);
            let vary: Vec<_> = response
                .headers
                .iter()
                .filter(|(name, _)| name.eq_ignore_ascii_case("vary"))
                .map(|(_, value)| value.as_ref())
                .collect();
            assert_eq!(vary, ["Accept-Encoding, Origin"], "{request}");
        }
    }
}
