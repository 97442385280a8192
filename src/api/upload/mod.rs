//! `POST /files` and `PUT /files`: uploading files (SPEC §8), streamed to disk and placed
//! atomically.
//!
//! This module owns the request: access (token or a signed URL for `write`), the body's
//! encoding and type, the metadata headers, the paths, and moving the bytes from the body to
//! each file. Parsing multipart is `http::multipart`'s; inflating a gzip body is `inflating`'s
//! (a sink in front of the others); the rules of metadata are `fs::user_metadata`'s; the
//! temporary, fsync and rename are `fs::atomic`'s. Access, encoding, type, metadata and paths
//! are checked from the head, before any byte of the body is read; the body is then fed to an
//! [`http::BodySink`](crate::http::BodySink) as it arrives (the connection waits for the peer in
//! the event loop, never in a worker) and is never held in memory: a raw body goes straight to
//! its file, a multipart one through a buffer of [`BUFFER_BYTES`], a gzip one through
//! [`inflating::CHUNK_BYTES`] first.
//!
//! Decisions where SPEC and envd leave room:
//! - `Content-Encoding` may list `identity` any number of times and `gzip` (or its old name
//!   `x-gzip`, RFC 9110 §8.4.1.3) once; anything else (`br`, `deflate`, `zstd`, `gzip` twice)
//!   is 415 naming the supported codings. (envd answers 400 and reads only the first header.)
//! - `X-Metadata-<Key>: <value>` headers, as envd reads them: the key is the rest of the name,
//!   lower-cased; `X-Metadata-` alone is ignored; a key sent twice keeps its first value. The
//!   same set goes on every file of a multipart request, and each entry of the answer carries
//!   it as `"metadata"` when it is not empty. Unlike envd, which writes the attributes after
//!   the data and only logs a filesystem without them, a file appears with its metadata or not
//!   at all: the attributes are set on the staged file before any byte, and a filesystem
//!   without extended attributes is 400 when metadata is asked for.
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
//! - `PUT` is a raw upload whatever its `Content-Type` says: the body is the file's bytes, as
//!   `curl -T`, WebDAV clients and nginx's `dav_methods PUT` take it (a WebDAV client sends the
//!   file's own type, `text/plain` say). Everything else (access with a `write` signature,
//!   gzip, metadata, placement) is `POST`'s.
//! - When writing fails part-way (full disk), the answer is sent at once and the HTTP layer
//!   discards the rest of the body (within its cap), so that the client reads the 507 rather
//!   than a reset connection.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::as_user::AsUserSink;
use super::download;
use crate::app::{self, App, Resolver};
use crate::auth::Operation;
use crate::error::ApiError;
use crate::fs::atomic::{self, Finished, Staged};
use crate::fs::dirs;
use crate::fs::user_metadata::UserMetadata;
use crate::http::date;
use crate::http::multipart::{self, Event, Parser};
use crate::http::{Action, BodySink, Head, Response};

mod archive;
pub mod gzip;
pub mod inflating;

use inflating::Inflating;

/// The buffer a multipart body passes through.
pub const BUFFER_BYTES: usize = 256 * 1024;

/// How the body carries the file(s).
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    Raw,
    Multipart(Vec<u8>),
}

/// The header prefix of metadata (compared without case).
const METADATA_HEADER: &[u8] = b"x-metadata-";

/// Starts `POST /files` or `PUT /files` from its head.
///
/// Order of checks: query decoding (400), access (401), `format` (400), `Content-Encoding`
/// (415); for an archive the user (401), then `archive::sink`'s; else `Content-Type` (400),
/// user (401), metadata (400), path (400); then the body.
/// The upload's own check of the token or the signed URL (before its path is looked at).
pub fn authorise(app: &Arc<App>, head: &Head) -> Result<(), ApiError> {
    let query = app::query(head)?;
    app.require_file_access(head, &query, Operation::Write, date::now_unix())?;
    Ok(())
}

pub fn begin(app: &Arc<App>, head: &Head) -> Result<Action, ApiError> {
    let query = app::query(head)?;
    let raw_path = query.get("path").filter(|p| !p.is_empty());
    authorise(app, head)?;
    let tar = download::archive::format(query.get("format"))?.is_some();
    let gzip = gzip_encoded(head)?;
    if tar {
        let resolver = app.resolver(query.get("username"))?;
        let identity = app.identity(&resolver.user);
        let sink = {
            let _as_user = identity.as_ref().map(|who| who.enter()).transpose()?;
            archive::sink(head, raw_path, &resolver)?
        };
        let sink: Box<dyn BodySink> = if gzip {
            Box::new(Inflating::new(sink))
        } else {
            sink
        };
        return Ok(Action::Consume(AsUserSink::wrap(identity, sink)));
    }
    let kind = if head.method() == "PUT" {
        Kind::Raw
    } else {
        body_kind(head)?
    };
    let resolver = app.resolver(query.get("username"))?;
    let metadata = metadata(head)?;
    // Whatever is created now and later (in `AsUserSink`, on whichever worker feeds the body)
    // is created as the user with `--fs-as-user`.
    let identity = app.identity(&resolver.user);
    let _as_user = identity.as_ref().map(|who| who.enter()).transpose()?;
    let sink: Box<dyn BodySink> = match kind {
        Kind::Raw => {
            let raw = raw_path.ok_or_else(|| {
                ApiError::bad_request(if head.method() == "PUT" {
                    "the path query parameter is required for a PUT"
                } else {
                    "the path query parameter is required for an application/octet-stream body"
                })
            })?;
            let destination = resolver.resolve(raw)?;
            check_target(&destination)?;
            let user = &resolver.user;
            Box::new(RawUpload {
                staged: Staged::create(&destination, user.uid, user.gid, &metadata)?,
                metadata,
            })
        }
        Kind::Multipart(boundary) => Box::new(MultipartUpload {
            parser: Parser::new(&boundary),
            buffer: Vec::with_capacity(BUFFER_BYTES),
            query_path: raw_path.map(str::to_owned),
            resolver,
            metadata,
            current: None,
            finished: Vec::new(),
            seen: HashSet::new(),
            ended: false,
        }),
    };
    let sink: Box<dyn BodySink> = if gzip {
        Box::new(Inflating::new(sink))
    } else {
        sink
    };
    Ok(Action::Consume(AsUserSink::wrap(identity, sink)))
}

/// Whether the body is gzip; 415 for any other coding than identity, and for gzip twice.
fn gzip_encoded(head: &Head) -> Result<bool, ApiError> {
    let mut gzip = false;
    for value in head.headers_named("content-encoding") {
        for coding in value.split(|&b| b == b',').map(|c| c.trim_ascii()) {
            if coding.is_empty() || coding.eq_ignore_ascii_case(b"identity") {
                continue;
            }
            let is_gzip =
                coding.eq_ignore_ascii_case(b"gzip") || coding.eq_ignore_ascii_case(b"x-gzip");
            if is_gzip && !gzip {
                gzip = true;
                continue;
            }
            let what = if is_gzip {
                "gzip applied twice".to_owned()
            } else {
                format!("'{}'", String::from_utf8_lossy(coding))
            };
            return Err(ApiError::new(
                415,
                format!(
                    "unsupported Content-Encoding {what}: the supported codings are identity \
                     and gzip"
                ),
            ));
        }
    }
    Ok(gzip)
}

/// The metadata of the `X-Metadata-<Key>` headers; 400 `invalid metadata: ...`.
fn metadata(head: &Head) -> Result<UserMetadata, ApiError> {
    let pairs = head.headers().filter_map(|(name, value)| {
        let prefix = name.get(..METADATA_HEADER.len())?;
        prefix
            .eq_ignore_ascii_case(METADATA_HEADER)
            .then(|| (&name[METADATA_HEADER.len()..], value))
    });
    UserMetadata::from_pairs(pairs)
        .map_err(|reason| ApiError::bad_request(format!("invalid metadata: {reason}")))
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

/// The 200 answer: one entry per file written, with its metadata when there is any.
fn written(paths: &[PathBuf], metadata: &UserMetadata) -> Response {
    if metadata.is_empty() {
        return Response::json(200, dirs::file_records_json(paths));
    }
    let record = |path: &PathBuf| {
        let mut record = dirs::file_record(path);
        if let Some(fields) = record.as_object_mut().filter(|_| !metadata.is_empty()) {
            fields.insert("metadata".into(), metadata.to_json());
        }
        record
    };
    let records: Vec<serde_json::Value> = paths.iter().map(record).collect();
    Response::json(
        200,
        serde_json::Value::Array(records).to_string().into_bytes(),
    )
}

/// A raw body, as is, into its file.
struct RawUpload {
    staged: Staged,
    metadata: UserMetadata,
}

impl BodySink for RawUpload {
    fn data(&mut self, bytes: &[u8]) -> Result<(), Response> {
        let mut file = self.staged.file();
        file.write_all(bytes)
            .map_err(|e| ApiError::from(self.staged.error(e)).into())
    }

    fn end(self: Box<Self>) -> Response {
        let destination = self.staged.destination().to_path_buf();
        match self.staged.commit() {
            Ok(()) => written(&[destination], &self.metadata),
            Err(error) => ApiError::from(error).into(),
        }
    }
}

/// Every `file` part into its own temporary; all renamed into place once the body is complete.
struct MultipartUpload {
    parser: Parser,
    /// Received bytes the parser has not consumed yet (it holds back a possible boundary).
    buffer: Vec<u8>,
    query_path: Option<String>,
    resolver: Resolver,
    /// Set on every file of the request.
    metadata: UserMetadata,
    current: Option<Staged>,
    finished: Vec<Finished>,
    seen: HashSet<PathBuf>,
    /// The closing boundary was seen; what follows (an epilogue) is ignored.
    ended: bool,
}

impl BodySink for MultipartUpload {
    fn data(&mut self, mut bytes: &[u8]) -> Result<(), Response> {
        while !bytes.is_empty() && !self.ended {
            let take = (BUFFER_BYTES - self.buffer.len()).min(bytes.len());
            self.buffer.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            self.parse().map_err(Response::from)?;
        }
        Ok(())
    }

    fn end(mut self: Box<Self>) -> Response {
        self.finish().unwrap_or_else(Response::from)
    }
}

impl MultipartUpload {
    /// Runs the parser over the buffer until it needs more.
    fn parse(&mut self) -> Result<(), ApiError> {
        debug_assert!(BUFFER_BYTES >= self.parser.min_buffer());
        let mut start = 0;
        loop {
            let (used, event) = self
                .parser
                .advance(&self.buffer[start..])
                .map_err(malformed)?;
            match event {
                Event::Part(head) if head.name.as_deref() == Some("file") => {
                    self.current = Some(self.open_part(head.filename.as_deref())?);
                }
                Event::Part(_) => self.current = None,
                Event::Data(range) => {
                    if let Some(staged) = &self.current {
                        let data = &self.buffer[start + range.start..start + range.end];
                        let mut file = staged.file();
                        file.write_all(data).map_err(|e| staged.error(e))?;
                    }
                }
                Event::PartEnd => {
                    if let Some(staged) = self.current.take() {
                        self.finished.push(staged.finish()?);
                    }
                }
                Event::End => {
                    self.ended = true;
                    self.buffer.clear();
                    return Ok(());
                }
                Event::NeedMore => {
                    self.buffer.drain(..start + used);
                    return Ok(());
                }
            }
            start += used;
        }
    }

    /// The temporary of a `file` part, its path from the query or the part's filename.
    fn open_part(&mut self, filename: Option<&str>) -> Result<Staged, ApiError> {
        let raw = self
            .query_path
            .as_deref()
            .or(filename.filter(|f| !f.is_empty()))
            .ok_or_else(|| {
                ApiError::bad_request(
                    "a multipart part named 'file' has no filename and there is no path query \
                     parameter",
                )
            })?;
        let destination = self.resolver.resolve(raw)?;
        if !self.seen.insert(destination.clone()) {
            return Err(ApiError::bad_request(format!(
                "path '{}' is given to more than one part of the request",
                destination.display()
            )));
        }
        check_target(&destination)?;
        let user = &self.resolver.user;
        let staged = Staged::create(&destination, user.uid, user.gid, &self.metadata)?;
        Ok(staged)
    }

    /// The body ended: every part placed, or none.
    fn finish(&mut self) -> Result<Response, ApiError> {
        if !self.ended {
            self.parser.finish().map_err(malformed)?;
        }
        if self.finished.is_empty() {
            return Err(ApiError::bad_request(
                "the multipart body has no part named 'file'",
            ));
        }
        let paths: Vec<PathBuf> = self
            .finished
            .iter()
            .map(|s| s.destination().to_path_buf())
            .collect();
        atomic::place_all(std::mem::take(&mut self.finished))?;
        Ok(written(&paths, &self.metadata))
    }
}

fn malformed(err: multipart::MultipartError) -> ApiError {
    ApiError::bad_request(format!("malformed multipart body: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(fields: &str) -> Head {
        let raw = format!("POST /files?path=a HTTP/1.1\r\nHost: t\r\n{fields}\r\n");
        Head::parse(raw.as_bytes()).unwrap().unwrap().0
    }

    #[test]
    fn metadata_comes_from_x_metadata_headers_in_any_case() {
        let found = metadata(&head(
            "X-Metadata-Owner: sdk-test\r\nx-metadata-purpose: a check\r\n\
             X-METADATA-owner: second\r\nX-Metadata-: nameless\r\nX-Metadata: no dash\r\n\
             X-Access-Token: secret\r\nX-Metadatax-no: not a prefix\r\n",
        ))
        .unwrap();
        assert_eq!(
            found.to_json().to_string(),
            r#"{"owner":"sdk-test","purpose":"a check"}"#
        );
        assert!(metadata(&head("")).unwrap().is_empty());
    }

    #[test]
    fn invalid_metadata_is_400_naming_the_reason() {
        let long = format!("X-Metadata-{}: v\r\n", "k".repeat(247));
        let cases = [
            (
                long.as_str(),
                format!("key '{}' is 247 bytes long, more than 246", "k".repeat(247)),
            ),
            (
                "X-Metadata-Note: tab\there\r\n",
                "the value of key 'note' has byte 0x09 at offset 3, not printable ASCII".into(),
            ),
            (
                "X-Metadata-Note: caf\u{e9}\r\n",
                "the value of key 'note' has byte 0xc3 at offset 3, not printable ASCII".into(),
            ),
        ];
        for (fields, reason) in cases {
            assert_eq!(
                metadata(&head(fields)),
                Err(ApiError::bad_request(format!("invalid metadata: {reason}")))
            );
        }
        let big = format!("X-Metadata-Big: {}\r\n", "v".repeat(4096));
        assert!(metadata(&head(&big))
            .unwrap_err()
            .message
            .starts_with("invalid metadata: the metadata takes 4108 bytes"));
    }

    #[test]
    fn content_encoding_is_identity_or_gzip_once() {
        for (fields, gzip) in [
            ("", false),
            ("Content-Encoding: identity\r\n", false),
            ("Content-Encoding: gzip\r\n", true),
            ("Content-Encoding: GZIP\r\n", true),
            ("Content-Encoding: x-gzip\r\n", true),
            ("Content-Encoding: identity, gzip\r\n", true),
            (
                "Content-Encoding: gzip\r\nContent-Encoding: identity\r\n",
                true,
            ),
        ] {
            assert_eq!(gzip_encoded(&head(fields)), Ok(gzip), "{fields}");
        }
        for (fields, what) in [
            ("Content-Encoding: br\r\n", "'br'"),
            ("Content-Encoding: deflate\r\n", "'deflate'"),
            ("Content-Encoding: gzip, zstd\r\n", "'zstd'"),
            ("Content-Encoding: gzip, gzip\r\n", "gzip applied twice"),
            (
                "Content-Encoding: gzip\r\nContent-Encoding: x-gzip\r\n",
                "gzip applied twice",
            ),
        ] {
            assert_eq!(
                gzip_encoded(&head(fields)),
                Err(ApiError::new(
                    415,
                    format!(
                        "unsupported Content-Encoding {what}: the supported codings are \
                         identity and gzip"
                    )
                )),
                "{fields}"
            );
        }
    }
}
