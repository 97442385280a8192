//! `multipart/form-data` bodies (RFC 7578, RFC 2046 §5.1), parsed incrementally.
//!
//! The parser is pure: the caller owns a buffer, hands it the bytes not yet consumed, and gets
//! back how many it consumed and what they were ([`Event`]). Part data comes out as ranges of
//! the caller's bytes, never copied, and never more than a delimiter's length (at most 74 bytes)
//! is held back in case it begins the next boundary, so a part of any size passes through a
//! buffer of fixed size and the boundary may straddle reads. Part headers are bounded by
//! [`MAX_PART_HEADERS`].
//!
//! Decisions where the RFCs leave room:
//! - The preamble before the first boundary and the epilogue after the last are ignored; a body
//!   that ends before the closing `--boundary--` is an error.
//! - Linear whitespace after a boundary (RFC 2046's transport padding) is accepted.
//! - In a quoted parameter value a backslash escapes only a following tspecial (`"`, `\` and the
//!   like), as Go's `mime.ParseMediaType` does (envd parses with it), so a Windows path such as
//!   `C:\dir\a.txt` keeps its backslashes. `filename*=utf-8''<percent-encoded>` (RFC 5987) wins
//!   over `filename` when both are given; other charsets in `filename*` are ignored.
//! - Header lines continued on the next line (obsolete folding) are refused.

use std::fmt;
use std::ops::Range;

/// The longest boundary RFC 2046 allows.
pub const MAX_BOUNDARY: usize = 70;
/// The most bytes of one part's header block.
pub const MAX_PART_HEADERS: usize = 8 * 1024;
/// The most bytes of whitespace accepted after a boundary.
const MAX_PADDING: usize = 256;

/// Why a body (or its `Content-Type`) is not acceptable multipart.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // Each variant's `Display` below says what it is.
pub enum MultipartError {
    NoBoundary,
    BadBoundary,
    BadBoundaryLine,
    HeadersTooLarge,
    BadHeader,
    BadDisposition,
    FilenameNotUtf8,
    Truncated,
}

impl fmt::Display for MultipartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MultipartError::NoBoundary => "the Content-Type has no boundary parameter",
            MultipartError::BadBoundary => "the boundary must be 1 to 70 visible characters",
            MultipartError::BadBoundaryLine => "a boundary is followed by neither CRLF nor '--'",
            MultipartError::HeadersTooLarge => "a part's headers are larger than 8 KiB",
            MultipartError::BadHeader => "a part has a malformed header line",
            MultipartError::BadDisposition => "a part has a malformed Content-Disposition",
            MultipartError::FilenameNotUtf8 => "a part's filename is not valid UTF-8",
            MultipartError::Truncated => "the body ends before the closing boundary",
        })
    }
}

impl std::error::Error for MultipartError {}

/// What a part's headers say about it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartHead {
    /// The `name` of `Content-Disposition: form-data`; `None` without one.
    pub name: Option<String>,
    /// The `filename` (or `filename*`) parameter, when present.
    pub filename: Option<String>,
}

/// What [`Parser::advance`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A new part begins; its data follows.
    Part(PartHead),
    /// Data of the current part: this range of the input given.
    Data(Range<usize>),
    /// The current part ended.
    PartEnd,
    /// The closing boundary: the body is complete (the epilogue may follow and is ignored).
    End,
    /// Nothing more can be decided without more bytes after the ones not consumed.
    NeedMore,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Preamble { at_start: bool },
    AfterBoundary,
    Headers,
    Body,
    Epilogue,
}

/// An incremental parser for one body.
#[derive(Debug, Clone)]
pub struct Parser {
    /// `CRLF--boundary`.
    delimiter: Vec<u8>,
    /// Boyer-Moore-Horspool shifts for `delimiter`.
    shift: [u8; 256],
    state: State,
}

impl Parser {
    /// A parser for `boundary` as returned by [`boundary`].
    pub fn new(boundary: &[u8]) -> Parser {
        let mut delimiter = b"\r\n--".to_vec();
        delimiter.extend_from_slice(boundary);
        // A delimiter from `boundary` is at most 74 bytes, so every shift fits in a byte; for a
        // longer one a shift is capped at 255, which is still a valid (shorter) Horspool shift
        // and never 0.
        let len = delimiter.len();
        let byte_shift = |n: usize| u8::try_from(n).unwrap_or(u8::MAX);
        let mut shift = [byte_shift(len); 256];
        for (i, &b) in delimiter[..len - 1].iter().enumerate() {
            shift[usize::from(b)] = byte_shift(len - 1 - i);
        }
        Parser {
            delimiter,
            shift,
            state: State::Preamble { at_start: true },
        }
    }

    /// The fewest bytes a caller's buffer must hold for the parser always to make progress.
    pub fn min_buffer(&self) -> usize {
        MAX_PART_HEADERS + self.delimiter.len() + MAX_PADDING + 4
    }

    /// True once the closing boundary has been seen.
    pub fn is_done(&self) -> bool {
        self.state == State::Epilogue
    }

    /// Parses from the start of `input` (the bytes not consumed yet). Returns how many bytes
    /// were consumed and what they held; with [`Event::NeedMore`], keep the rest and append more.
    pub fn advance(&mut self, input: &[u8]) -> Result<(usize, Event), MultipartError> {
        let mut used = 0;
        loop {
            let rest = &input[used..];
            match self.state {
                State::Preamble { at_start } => {
                    let dash_boundary = &self.delimiter[2..];
                    if at_start {
                        if rest.len() < dash_boundary.len() && dash_boundary.starts_with(rest) {
                            return Ok((used, Event::NeedMore));
                        }
                        self.state = State::Preamble { at_start: false };
                        if rest.starts_with(dash_boundary) {
                            used += dash_boundary.len();
                            self.state = State::AfterBoundary;
                        }
                        continue;
                    }
                    match self.find(rest) {
                        Some(at) => {
                            used += at + self.delimiter.len();
                            self.state = State::AfterBoundary;
                        }
                        None => return Ok((used + self.safe_prefix(rest), Event::NeedMore)),
                    }
                }
                State::AfterBoundary => {
                    if rest.len() < 2 {
                        return Ok((used, Event::NeedMore));
                    }
                    if rest.starts_with(b"--") {
                        self.state = State::Epilogue;
                        return Ok((used + 2, Event::End));
                    }
                    let padding = rest
                        .iter()
                        .take_while(|&&b| b == b' ' || b == b'\t')
                        .count();
                    if padding > MAX_PADDING {
                        return Err(MultipartError::BadBoundaryLine);
                    }
                    match &rest[padding..] {
                        [b'\r', b'\n', ..] => {
                            used += padding + 2;
                            self.state = State::Headers;
                        }
                        [] | [b'\r'] => return Ok((used, Event::NeedMore)),
                        _ => return Err(MultipartError::BadBoundaryLine),
                    }
                }
                State::Headers => {
                    let block_len = if rest.starts_with(b"\r\n") {
                        Some(2)
                    } else {
                        rest.windows(4)
                            .take(MAX_PART_HEADERS)
                            .position(|w| w == b"\r\n\r\n")
                            .map(|at| at + 4)
                    };
                    let Some(block_len) = block_len.filter(|&n| n <= MAX_PART_HEADERS) else {
                        if rest.len() >= MAX_PART_HEADERS {
                            return Err(MultipartError::HeadersTooLarge);
                        }
                        return Ok((used, Event::NeedMore));
                    };
                    let head = parse_part_headers(&rest[..block_len - 2])?;
                    self.state = State::Body;
                    return Ok((used + block_len, Event::Part(head)));
                }
                State::Body => {
                    return Ok(match self.find(rest) {
                        Some(0) => {
                            self.state = State::AfterBoundary;
                            (used + self.delimiter.len(), Event::PartEnd)
                        }
                        Some(at) => (used + at, Event::Data(used..used + at)),
                        None => match self.safe_prefix(rest) {
                            0 => (used, Event::NeedMore),
                            safe => (used + safe, Event::Data(used..used + safe)),
                        },
                    });
                }
                State::Epilogue => return Ok((input.len(), Event::NeedMore)),
            }
        }
    }

    /// The error for a body that ended where it did (the caller met end of input).
    pub fn finish(&self) -> Result<(), MultipartError> {
        if self.is_done() {
            Ok(())
        } else {
            Err(MultipartError::Truncated)
        }
    }

    /// The first occurrence of the delimiter in `hay` (Boyer-Moore-Horspool).
    fn find(&self, hay: &[u8]) -> Option<usize> {
        let needle = &self.delimiter[..];
        let last = needle.len() - 1;
        let mut at = 0;
        while at + needle.len() <= hay.len() {
            let byte = hay[at + last];
            if byte == needle[last] && hay[at..at + last] == needle[..last] {
                return Some(at);
            }
            at += usize::from(self.shift[usize::from(byte)]);
        }
        None
    }

    /// How much of `hay` (which holds no whole delimiter) certainly precedes any delimiter: all
    /// but a tail that is a proper prefix of it.
    fn safe_prefix(&self, hay: &[u8]) -> usize {
        let from = hay.len().saturating_sub(self.delimiter.len() - 1);
        (from..hay.len())
            .find(|&at| self.delimiter.starts_with(&hay[at..]))
            .unwrap_or(hay.len())
    }
}

/// The boundary of a `multipart/form-data` Content-Type value; `Ok(None)` when the media type is
/// something else.
pub fn boundary(content_type: &[u8]) -> Result<Option<Vec<u8>>, MultipartError> {
    let (media_type, params) = split_media_type(content_type);
    if !media_type.eq_ignore_ascii_case(b"multipart/form-data") {
        return Ok(None);
    }
    let params = parse_params(params).map_err(|_| MultipartError::BadBoundary)?;
    let boundary = params
        .into_iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(b"boundary"))
        .map(|(_, value)| value)
        .ok_or(MultipartError::NoBoundary)?;
    let visible = boundary.iter().all(|&b| (b' '..=b'~').contains(&b));
    if boundary.is_empty() || boundary.len() > MAX_BOUNDARY || !visible {
        return Err(MultipartError::BadBoundary);
    }
    Ok(Some(boundary))
}

/// The media type (trimmed) and the parameter text after its `;`.
pub fn split_media_type(value: &[u8]) -> (&[u8], &[u8]) {
    match value.iter().position(|&b| b == b';') {
        Some(at) => (value[..at].trim_ascii(), &value[at + 1..]),
        None => (value.trim_ascii(), &[]),
    }
}

fn parse_part_headers(block: &[u8]) -> Result<PartHead, MultipartError> {
    let mut head = PartHead::default();
    for line in block.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        if line[0] == b' ' || line[0] == b'\t' {
            return Err(MultipartError::BadHeader);
        }
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or(MultipartError::BadHeader)?;
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if name.is_empty() || name.iter().any(|b| b.is_ascii_whitespace()) {
            return Err(MultipartError::BadHeader);
        }
        if name.eq_ignore_ascii_case(b"content-disposition") {
            parse_disposition(value, &mut head)?;
        }
    }
    Ok(head)
}

fn parse_disposition(value: &[u8], head: &mut PartHead) -> Result<(), MultipartError> {
    let (kind, params) = split_media_type(value);
    if !kind.eq_ignore_ascii_case(b"form-data") {
        return Ok(());
    }
    let text =
        |bytes: Vec<u8>| String::from_utf8(bytes).map_err(|_| MultipartError::FilenameNotUtf8);
    let mut extended = None;
    for (name, value) in parse_params(params)? {
        if name.eq_ignore_ascii_case(b"name") {
            head.name = Some(String::from_utf8_lossy(&value).into_owned());
        } else if name.eq_ignore_ascii_case(b"filename") {
            head.filename = Some(text(value)?);
        } else if name.eq_ignore_ascii_case(b"filename*") {
            extended = decode_ext_value(&value).map(text).transpose()?;
        }
    }
    if extended.is_some() {
        head.filename = extended;
    }
    Ok(())
}

/// RFC 5987 `utf-8'<lang>'<percent-encoded>`; `None` for another charset or a malformed value.
fn decode_ext_value(value: &[u8]) -> Option<Vec<u8>> {
    let mut fields = value.splitn(3, |&b| b == b'\'');
    let charset = fields.next()?;
    let _language = fields.next()?;
    let encoded = fields.next()?;
    if !charset.eq_ignore_ascii_case(b"utf-8") {
        return None;
    }
    let mut out = Vec::with_capacity(encoded.len());
    let mut i = 0;
    while i < encoded.len() {
        if encoded[i] == b'%' {
            let hex = encoded.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(encoded[i]);
            i += 1;
        }
    }
    Some(out)
}

fn is_tspecial(b: u8) -> bool {
    b"()<>@,;:\\\"/[]?=".contains(&b)
}

/// `; name=value; name="quoted value"` pairs, in order. Values are tokens or quoted strings.
/// A parameter's name and value, as bytes.
type Param = (Vec<u8>, Vec<u8>);

fn parse_params(mut text: &[u8]) -> Result<Vec<Param>, MultipartError> {
    let mut params = Vec::new();
    loop {
        text = text.trim_ascii_start();
        while let Some(rest) = text.strip_prefix(b";") {
            text = rest.trim_ascii_start();
        }
        if text.is_empty() {
            return Ok(params);
        }
        let eq = text
            .iter()
            .position(|&b| b == b'=')
            .ok_or(MultipartError::BadDisposition)?;
        let name = text[..eq].trim_ascii().to_vec();
        if name.is_empty() {
            return Err(MultipartError::BadDisposition);
        }
        text = text[eq + 1..].trim_ascii_start();
        let mut value = Vec::new();
        if let Some(quoted) = text.strip_prefix(b"\"") {
            let mut i = 0;
            loop {
                match quoted.get(i) {
                    None => return Err(MultipartError::BadDisposition),
                    Some(b'"') => break,
                    Some(b'\\') if quoted.get(i + 1).is_some_and(|&b| is_tspecial(b)) => {
                        value.push(quoted[i + 1]);
                        i += 2;
                    }
                    Some(&b) => {
                        value.push(b);
                        i += 1;
                    }
                }
            }
            text = &quoted[i + 1..];
        } else {
            let end = text
                .iter()
                .position(|&b| b == b';' || b.is_ascii_whitespace())
                .unwrap_or(text.len());
            value.extend_from_slice(&text[..end]);
            text = &text[end..];
        }
        params.push((name, value));
        let rest = text.trim_ascii_start();
        if !rest.is_empty() && !rest.starts_with(b";") {
            return Err(MultipartError::BadDisposition);
        }
        text = rest;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A part as the tests see it: its head and all its data.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Part {
        head: PartHead,
        data: Vec<u8>,
    }

    fn file(filename: &str, data: &[u8]) -> Part {
        Part {
            head: PartHead {
                name: Some("file".into()),
                filename: Some(filename.into()),
            },
            data: data.to_vec(),
        }
    }

    /// Feeds `pieces` one after another as a caller would (keeping unconsumed bytes, appending
    /// the next piece), with a buffer of `cap` bytes; returns the parts of a complete body.
    fn parse_pieces(
        boundary: &str,
        pieces: &[&[u8]],
        cap: usize,
    ) -> Result<Vec<Part>, MultipartError> {
        let mut parser = Parser::new(boundary.as_bytes());
        let mut parts: Vec<Part> = Vec::new();
        let mut buf: Vec<u8> = Vec::new();
        let mut pieces = pieces.iter().flat_map(|p| p.chunks(cap.max(1)));
        loop {
            let (used, event) = parser.advance(&buf)?;
            assert!(used <= buf.len());
            let progressed = used > 0 || event != Event::NeedMore;
            match event {
                Event::Part(head) => parts.push(Part {
                    head,
                    data: Vec::new(),
                }),
                Event::Data(range) => {
                    assert!(!range.is_empty(), "empty data event");
                    parts
                        .last_mut()
                        .expect("data before a part")
                        .data
                        .extend_from_slice(&buf[range])
                }
                Event::PartEnd => {}
                Event::End => return Ok(parts),
                Event::NeedMore => {}
            }
            buf.drain(..used);
            if !progressed {
                assert!(buf.len() < cap.max(parser.min_buffer()), "parser stalled");
                match pieces.next() {
                    Some(piece) => buf.extend_from_slice(piece),
                    None => return parser.finish().map(|()| parts),
                }
            }
        }
    }

    fn parse(boundary: &str, body: &[u8]) -> Result<Vec<Part>, MultipartError> {
        parse_pieces(boundary, &[body], usize::MAX)
    }

    const BODY: &[u8] = b"preamble to ignore\r\n\
--XyZ\r\n\
Content-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n\
Content-Type: text/plain\r\n\
\r\n\
hello\r\n--XyY not yet\r\n\r\n\
--XyZ\r\n\
content-disposition: form-data; name=file; filename=\"dir/b.bin\"\r\n\
\r\n\
\r\n--XyZ\r\n\
Content-Disposition: form-data; name=\"note\"\r\n\
\r\n\
ignored field\r\n\
--XyZ--\r\n\
epilogue --XyZ--";

    fn expected() -> Vec<Part> {
        vec![
            file("a.txt", b"hello\r\n--XyY not yet\r\n"),
            file("dir/b.bin", b""),
            Part {
                head: PartHead {
                    name: Some("note".into()),
                    filename: None,
                },
                data: b"ignored field".to_vec(),
            },
        ]
    }

    #[test]
    fn parses_parts_preamble_and_epilogue() {
        assert_eq!(parse("XyZ", BODY).unwrap(), expected());
    }

    #[test]
    fn a_body_split_at_every_byte_position_parses_the_same() {
        for at in 0..=BODY.len() {
            let parts = parse_pieces("XyZ", &[&BODY[..at], &BODY[at..]], usize::MAX);
            assert_eq!(parts.unwrap(), expected(), "split at {at}");
        }
        // Split twice, around every position of the second boundary's delimiter.
        let second = BODY.windows(9).position(|w| w == b"\r\n--XyZ\r\n").unwrap();
        for a in second.saturating_sub(2)..second + 12 {
            for b in a..second + 12 {
                let pieces = [&BODY[..a], &BODY[a..b], &BODY[b..]];
                assert_eq!(
                    parse_pieces("XyZ", &pieces, usize::MAX).unwrap(),
                    expected()
                );
            }
        }
    }

    #[test]
    fn a_delimiter_longer_than_a_byte_shift_still_parses() {
        // `boundary` refuses boundaries over 70 bytes but `Parser::new` takes any: past 255 the
        // Horspool shifts are capped (a shift of 256 kept in a byte would be 0, no progress).
        let boundary = format!("{}Z{}", "a".repeat(43), "a".repeat(256));
        let data = "Z".repeat(1000);
        let body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=file; filename=x\r\n\r\n\
             {data}\r\n--{boundary}--"
        );
        let parts = parse(&boundary, body.as_bytes()).unwrap();
        assert_eq!(parts, vec![file("x", data.as_bytes())]);
    }

    #[test]
    fn one_byte_at_a_time() {
        assert_eq!(parse_pieces("XyZ", &[BODY], 1).unwrap(), expected());
        assert_eq!(parse_pieces("XyZ", &[BODY], 3).unwrap(), expected());
    }

    #[test]
    fn a_large_part_passes_through_a_small_buffer_without_being_held() {
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8 ^ b'\r').collect();
        let mut body =
            b"--b\r\nContent-Disposition: form-data; name=file; filename=x\r\n\r\n".to_vec();
        body.extend_from_slice(&data);
        body.extend_from_slice(b"\r\n--b--");
        let parts = parse_pieces("b", &[&body], 9000).unwrap();
        assert_eq!(parts, vec![file("x", &data)]);
        // Every data event is handed over as soon as it cannot start a delimiter.
        let mut parser = Parser::new(b"b");
        let (used, event) = parser.advance(&body[..70]).unwrap();
        assert!(matches!(event, Event::Part(_)));
        let (n, event) = parser.advance(&body[used..70]).unwrap();
        assert_eq!(event, Event::Data(0..70 - used));
        assert_eq!(n, 70 - used);
        // A tail that may begin the delimiter is held back.
        let (n, event) = parser.advance(b"abc\r\n--").unwrap();
        assert_eq!((n, event), (3, Event::Data(0..3)));
        assert_eq!(parser.advance(b"\r\n--").unwrap(), (0, Event::NeedMore));
    }

    #[test]
    fn the_first_boundary_may_open_the_body_or_follow_a_preamble() {
        let direct = b"--q\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\nx\r\n--q--";
        assert_eq!(parse("q", direct).unwrap(), vec![file("f", b"x")]);
        // `--q` inside the preamble but not at a line start is not a boundary.
        let preamble = b"a--q\r\n\r\n--q\r\nContent-Disposition: form-data; name=file; filename=f\r\n\r\ny\r\n--q--";
        assert_eq!(parse("q", preamble).unwrap(), vec![file("f", b"y")]);
        // Transport padding after a boundary.
        let padded =
            b"--q \t\r\nContent-Disposition: form-data; name=file; filename=f\r\n\r\nz\r\n--q--";
        assert_eq!(parse("q", padded).unwrap(), vec![file("f", b"z")]);
        // A part without headers.
        let bare = b"--q\r\n\r\ndata\r\n--q--";
        let parts = parse("q", bare).unwrap();
        assert_eq!(parts[0].head, PartHead::default());
        assert_eq!(parts[0].data, b"data");
    }

    #[test]
    fn malformed_bodies_are_errors() {
        let head = "Content-Disposition: form-data; name=file; filename=f\r\n\r\n";
        let cases: &[(String, MultipartError)] = &[
            (format!("--q\r\n{head}data"), MultipartError::Truncated),
            (
                format!("--q\r\n{head}data\r\n--q"),
                MultipartError::Truncated,
            ),
            ("".into(), MultipartError::Truncated),
            ("no boundary at all".into(), MultipartError::Truncated),
            (
                format!("--q\r\n{head}x\r\n--qXY"),
                MultipartError::BadBoundaryLine,
            ),
            (
                "--q\r\nno colon here\r\n\r\n".into(),
                MultipartError::BadHeader,
            ),
            (
                "--q\r\nA: b\r\n folded\r\n\r\n".into(),
                MultipartError::BadHeader,
            ),
            (
                "--q\r\nContent-Disposition: form-data; filename=\"open\r\n\r\n".into(),
                MultipartError::BadDisposition,
            ),
            (
                "--q\r\nContent-Disposition: form-data; name=a b\r\n\r\n".into(),
                MultipartError::BadDisposition,
            ),
        ];
        for (body, error) in cases {
            assert_eq!(parse("q", body.as_bytes()).unwrap_err(), *error, "{body:?}");
        }
        let mut huge = b"--q\r\nX-Long: ".to_vec();
        huge.resize(MAX_PART_HEADERS + 10, b'a');
        huge.extend_from_slice(b"\r\n\r\n");
        assert_eq!(
            parse_pieces("q", &[&huge], 4096).unwrap_err(),
            MultipartError::HeadersTooLarge
        );
        let filename =
            b"--q\r\nContent-Disposition: form-data; name=file; filename=\"\xff\"\r\n\r\n";
        assert_eq!(
            parse("q", filename).unwrap_err(),
            MultipartError::FilenameNotUtf8
        );
    }

    #[test]
    fn filenames_quoted_escaped_and_extended() {
        let cases: &[(&str, Option<&str>)] = &[
            (
                r#"form-data; name="file"; filename="a \"b\".txt""#,
                Some(r#"a "b".txt"#),
            ),
            (
                r#"form-data; name="file"; filename="C:\dir\a.txt""#,
                Some(r"C:\dir\a.txt"),
            ),
            (r#"form-data; name="file"; filename="a\\b""#, Some(r"a\b")),
            (r#"form-data; name="file"; filename="x;y=z""#, Some("x;y=z")),
            (
                "form-data; name=file; filename=plain.txt ",
                Some("plain.txt"),
            ),
            (
                r#"form-data; name="file"; filename="fallback"; filename*=UTF-8''%C3%BCn%20i.txt"#,
                Some("ün i.txt"),
            ),
            (
                r#"form-data; name="file"; filename*=latin-1''x; filename=y"#,
                Some("y"),
            ),
            (r#"FORM-DATA; NAME="file"; FILENAME="up""#, Some("up")),
            (r#"form-data; name="file""#, None),
            (r#"attachment; filename="x""#, None),
            (r#"form-data; name="file"; filename="""#, Some("")),
            (
                r#"form-data; name="file"; filename="ünï.txt""#,
                Some("ünï.txt"),
            ),
        ];
        for (disposition, filename) in cases {
            let mut head = PartHead::default();
            parse_disposition(disposition.as_bytes(), &mut head).unwrap();
            assert_eq!(head.filename.as_deref(), *filename, "{disposition}");
        }
    }

    #[test]
    fn boundaries_from_content_types() {
        let ok: &[(&[u8], &[u8])] = &[
            (b"multipart/form-data; boundary=abc", b"abc"),
            (b"Multipart/Form-Data;boundary=\"a b:c\"", b"a b:c"),
            (
                b"multipart/form-data; charset=utf-8; BOUNDARY=------x",
                b"------x",
            ),
        ];
        for (value, expected) in ok {
            assert_eq!(boundary(value).unwrap().as_deref(), Some(*expected));
        }
        assert_eq!(boundary(b"application/octet-stream").unwrap(), None);
        assert_eq!(boundary(b"multipart/mixed; boundary=a").unwrap(), None);
        let long = format!("multipart/form-data; boundary={}", "b".repeat(71));
        for bad in [
            "multipart/form-data",
            "multipart/form-data; boundary=",
            "multipart/form-data; boundary=\"\"",
            long.as_str(),
        ] {
            assert!(boundary(bad.as_bytes()).is_err(), "{bad}");
        }
        let longest = format!("multipart/form-data; boundary={}", "b".repeat(70));
        assert!(boundary(longest.as_bytes()).unwrap().is_some());
    }
}
