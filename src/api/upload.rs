//! `POST /files`: uploading files (SPEC §8), streamed to disk and placed atomically.
//!
//! This module owns the request: access (token or a signed URL for `write`), the body's
//! encoding and type, the paths, and moving the bytes from the body to each file. Parsing
//! multipart is `http::multipart`'s; the temporary, fsync and rename are `fs::atomic`'s. A body
//! is never held in memory: it passes through one buffer of [`BUFFER_BYTES`].
//!
//! Decisions where SPEC and envd leave room:
//! - No `Content-Type` is taken as `application/octet-stream` (RFC 9110 §8.3), so `curl -T`
//!   works as is; any other type than these two is 400.
//! - A multipart request is all or nothing: every `file` part is written and synced to its own
//!   temporary, and only after the closing boundary are they renamed into place, in order. A
//!   request that fails anywhere (a bad third part, a malformed body, a vanished client, a full
//!   disk) leaves no file of it behind. (envd keeps the parts written before the failure; a
//!   client that sees an error here knows nothing landed and may simply retry.) Only a rename
//!   failing between two others, which needs a concurrent change of the directories, can leave
//!   the earlier parts placed.
//! - Parts whose name is not `file` are ignored. A part's path is the `path` parameter when it
//!   is given, else its filename, resolved as any path (SPEC §4); two parts resolving to the same
//!   path are 400, as is a multipart body without any `file` part.
//! - An existing non-directory at the path (a symlink included) is replaced by the new file; a
//!   directory is 400. Parent directories created for a file stay if the request then fails.
//! - When writing fails part-way (full disk), the rest of the body is read and discarded, up to
//!   [`DRAIN_CAP`], so that the client reads the 507 rather than a reset connection.

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use crate::app::{self, App, Resolver};
use crate::auth::Operation;
use crate::error::ApiError;
use crate::fs::atomic::{self, Finished, Staged};
use crate::fs::dirs;
use crate::fs::users::User;
use crate::http::date;
use crate::http::multipart::{self, Event, Parser};
use crate::http::{Body, Head, Request, Response};

/// The buffer between the socket and the file.
pub const BUFFER_BYTES: usize = 256 * 1024;
/// The most body bytes read and discarded after a failure, to answer it cleanly.
pub const DRAIN_CAP: u64 = 64 * 1024 * 1024;

/// How the body carries the file(s).
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    Raw,
    Multipart(Vec<u8>),
}

/// Answers `POST /files`.
///
/// Order of checks: query decoding (400), access (401), `Content-Encoding` (415),
/// `Content-Type` (400), user (401), path (400); then the body.
pub fn post(app: &App, request: &mut Request<'_>) -> Result<Response, ApiError> {
    let head = &request.head;
    let query = app::query(head)?;
    let raw_path = query.get("path").filter(|p| !p.is_empty());
    app.require_file_access(head, &query, Operation::Write, date::now_unix())?;
    check_encoding(head)?;
    let kind = body_kind(head)?;
    let resolver = app.resolver(query.get("username"))?;
    let mut incoming = Incoming {
        body: &mut request.body,
        failed: false,
    };
    let mut buf = vec![0u8; BUFFER_BYTES];
    let written = match kind {
        Kind::Raw => {
            let raw = raw_path.ok_or_else(|| {
                ApiError::bad_request(
                    "the path query parameter is required for an application/octet-stream body",
                )
            })?;
            let destination = resolver.resolve(raw)?;
            check_target(&destination)?;
            raw_upload(&mut incoming, &destination, &resolver.user, &mut buf)
                .map(|()| vec![destination])
        }
        Kind::Multipart(boundary) => {
            multipart_upload(&mut incoming, &boundary, raw_path, &resolver, &mut buf)
        }
    };
    let written = written.inspect_err(|_| incoming.drain(&mut buf))?;
    let records: Vec<serde_json::Value> = written.iter().map(|p| dirs::file_record(p)).collect();
    Ok(Response::json(
        200,
        serde_json::Value::Array(records).to_string().into_bytes(),
    ))
}

/// 415 for any coding but identity: sandboxd ships no decompressor.
fn check_encoding(head: &Head) -> Result<(), ApiError> {
    for value in head.headers_named("content-encoding") {
        for coding in value.split(|&b| b == b',').map(|c| c.trim_ascii()) {
            if !coding.is_empty() && !coding.eq_ignore_ascii_case(b"identity") {
                return Err(ApiError::new(
                    415,
                    format!(
                        "unsupported Content-Encoding '{}': sandboxd has no decompressor, send \
                         the body uncompressed",
                        String::from_utf8_lossy(coding)
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn body_kind(head: &Head) -> Result<Kind, ApiError> {
    let Some(value) = head.header("content-type") else {
        return Ok(Kind::Raw);
    };
    match multipart::boundary(value) {
        Ok(Some(boundary)) => Ok(Kind::Multipart(boundary)),
        Err(err) => Err(ApiError::bad_request(format!(
            "invalid multipart/form-data Content-Type: {err}"
        ))),
        Ok(None) => {
            let (media_type, _) = multipart::split_media_type(value);
            if media_type.is_empty() || media_type.eq_ignore_ascii_case(b"application/octet-stream")
            {
                Ok(Kind::Raw)
            } else {
                Err(ApiError::bad_request(format!(
                    "unsupported Content-Type '{}': send application/octet-stream or \
                     multipart/form-data",
                    String::from_utf8_lossy(media_type)
                )))
            }
        }
    }
}

/// 400 when `path` is an existing directory; anything else may be replaced.
fn check_target(path: &Path) -> Result<(), ApiError> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Err(ApiError::bad_request(format!(
            "path '{}' is a directory",
            path.display()
        ))),
        _ => Ok(()),
    }
}

/// The request body, remembering whether reading it failed (then it is not drained).
struct Incoming<'r, 'a> {
    body: &'r mut Body<'a>,
    failed: bool,
}

impl Incoming<'_, '_> {
    /// Reads until `buf` is full or the body ends; returns how many bytes.
    fn fill(&mut self, buf: &mut [u8]) -> Result<usize, ApiError> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.body.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => {
                    self.failed = true;
                    return Err(ApiError::bad_request(format!(
                        "error reading the request body: {err}"
                    )));
                }
            }
        }
        Ok(filled)
    }

    /// After a failure that left the body unread: reads and discards it up to [`DRAIN_CAP`],
    /// so the client, still sending, reads the answer instead of a reset.
    fn drain(&mut self, buf: &mut [u8]) {
        let mut drained = 0u64;
        while !self.failed && !self.body.is_complete() && drained < DRAIN_CAP {
            match self.body.read(buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n as u64,
            }
        }
    }
}

/// The body, as is, into `destination`.
fn raw_upload(
    incoming: &mut Incoming,
    destination: &Path,
    user: &User,
    buf: &mut [u8],
) -> Result<(), ApiError> {
    let staged = Staged::create(destination, user.uid, user.gid)?;
    let mut file = staged.file();
    loop {
        let n = incoming.fill(buf)?;
        if n == 0 {
            break;
        }
        file.write_all(&buf[..n]).map_err(|e| staged.error(&e))?;
    }
    staged.commit()
}

/// Every `file` part into its own temporary; all renamed into place once the body is complete.
fn multipart_upload(
    incoming: &mut Incoming,
    boundary: &[u8],
    query_path: Option<&str>,
    resolver: &Resolver,
    buf: &mut [u8],
) -> Result<Vec<PathBuf>, ApiError> {
    let user = &resolver.user;
    let malformed = |err: multipart::MultipartError| {
        ApiError::bad_request(format!("malformed multipart body: {err}"))
    };
    let mut parser = Parser::new(boundary);
    debug_assert!(buf.len() >= parser.min_buffer());
    let mut finished: Vec<Finished> = Vec::new();
    let mut current: Option<Staged> = None;
    let mut seen = HashSet::new();
    let (mut start, mut end) = (0, 0);
    loop {
        let (used, event) = parser.advance(&buf[start..end]).map_err(malformed)?;
        match event {
            Event::Part(head) if head.name.as_deref() == Some("file") => {
                let raw = query_path
                    .or(head.filename.as_deref().filter(|f| !f.is_empty()))
                    .ok_or_else(|| {
                        ApiError::bad_request(
                            "a multipart part named 'file' has no filename and there is no path \
                             query parameter",
                        )
                    })?;
                let destination = resolver.resolve(raw)?;
                if !seen.insert(destination.clone()) {
                    return Err(ApiError::bad_request(format!(
                        "path '{}' is given to more than one part of the request",
                        destination.display()
                    )));
                }
                check_target(&destination)?;
                current = Some(Staged::create(&destination, user.uid, user.gid)?);
            }
            Event::Part(_) => current = None,
            Event::Data(range) => {
                if let Some(staged) = &current {
                    let mut file = staged.file();
                    file.write_all(&buf[start + range.start..start + range.end])
                        .map_err(|e| staged.error(&e))?;
                }
            }
            Event::PartEnd => {
                if let Some(staged) = current.take() {
                    finished.push(staged.finish()?);
                }
            }
            Event::End => break,
            Event::NeedMore => {
                start += used;
                buf.copy_within(start..end, 0);
                end -= start;
                start = 0;
                let n = incoming.fill(&mut buf[end..])?;
                if n == 0 {
                    parser.finish().map_err(malformed)?;
                }
                end += n;
                continue;
            }
        }
        start += used;
    }
    if finished.is_empty() {
        return Err(ApiError::bad_request(
            "the multipart body has no part named 'file'",
        ));
    }
    let written = finished
        .iter()
        .map(|s| s.destination().to_path_buf())
        .collect();
    atomic::place_all(finished)?;
    Ok(written)
}
