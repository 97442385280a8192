//! `GET` and `HEAD /files`: downloading a file (SPEC §6).
//!
//! This module owns the handler: it checks access (token or signed URL), resolves the path, opens
//! the file without ever blocking, picks the coding from `Accept-Encoding`, evaluates the
//! conditional headers and `Range`, and returns a response whose body is the open file, which
//! the HTTP layer sends with `sendfile(2)`, or its gzip form, compressed as it is sent
//! (`gzip`). Parsing of `Range` (`range`) and `Accept-Encoding` (`encoding`), conditional
//! evaluation (`conditional`) and the descriptive headers (`headers`) are pure and live in the
//! submodules.
//!
//! The order of decisions once the file is open: the coding (406), the conditions against the
//! form chosen (412, 304 with that form's ETag), a place for a compressed GET (else identity, or
//! 503), then `Range` for identity (206, 416).
//!
//! Decisions beyond SPEC §6:
//! - `Range` and `If-Range` are honoured for GET only: RFC 9110 §14.2 defines range handling for
//!   GET alone and says a server MUST ignore `Range` on other methods, so HEAD always describes
//!   the whole file (200 with the full `Content-Length`). Every other header of HEAD is GET's.
//! - A file the daemon may not read (`EACCES`, `EPERM`) is 403 `permission denied reading
//!   '<resolved>'`: it is a fact about the file, not a fault of the daemon (envd says 500).
//! - A path through a non-directory (`ENOTDIR`) does not exist: 404, like a missing file.
//! - `X-Content-Type-Options: nosniff` goes with every file, so a browser never runs a
//!   `.txt` as HTML.

pub(crate) mod archive;
pub(crate) mod conditional;
pub(crate) mod encoding;
mod gzip;
mod headers;
pub(crate) mod range;
mod tar;

use std::fs::{File, FileType, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::app::{self, App};
use crate::auth::Operation;
use crate::error::ApiError;
use crate::fs::FsError;
use crate::http::date;
use crate::http::stream;
use crate::http::{Head, Response, ResponseBody};

use conditional::{Conditions, Outcome, Validators};
use encoding::{Accept, Coding};
use range::Range;

/// Answers `GET` or `HEAD /files`.
///
/// Order of checks: query decoding (400), access (401, or 400 for a malformed expiration),
/// the `format` (400), user (401), path resolution (400), then the file itself (404, 400,
/// 403), or the directory for an archive (`archive`).
pub fn get(app: &App, head: &Head) -> Result<Response, ApiError> {
    let query = app::query(head)?;
    let now = date::now_unix();
    app.require_file_access(head, &query, Operation::Read, now)?;
    let format = archive::format(query.get("format"))?;
    let resolver = app.resolver(query.get("username"))?;
    let resolved = resolver.resolve(query.get("path").unwrap_or(""))?;
    if format.is_some() {
        return archive::respond(app, head, &resolver, &resolved);
    }
    // The file is opened as the user (`--fs-as-user`); the open descriptor it is sent from
    // needs no further check.
    let (file, metadata) = {
        let _as_user = app.as_user(&resolver.user)?;
        open_regular(&resolved)?
    };
    respond(head, file, &metadata, &resolved, now)
}

/// Opens `path` for reading only if it is a regular file, and returns it with the `fstat` of the
/// opened descriptor.
///
/// The `stat` before opening keeps `open` away from devices (opening one can have effects, such
/// as arming a watchdog) and FIFOs. The path can change between the two calls, so the open is
/// also non-blocking (a FIFO swapped in cannot block it) and the kind is checked again on the
/// descriptor, whose metadata is then the one every header describes. `O_NONBLOCK` does not
/// affect reads of a regular file, and Linux ignores it on the source of `sendfile`.
fn open_regular(path: &Path) -> Result<(File, Metadata), ApiError> {
    let before = std::fs::metadata(path).map_err(|e| open_error(e, path))?;
    check_regular(before.file_type(), path)?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| open_error(e, path))?;
    let metadata = file
        .metadata()
        .map_err(|e| FsError::io(e, format!("reading the metadata of '{}'", path.display())))?;
    check_regular(metadata.file_type(), path)?;
    Ok((file, metadata))
}

fn check_regular(kind: FileType, path: &Path) -> Result<(), ApiError> {
    if kind.is_file() {
        Ok(())
    } else if kind.is_dir() {
        Err(ApiError::bad_request(format!(
            "path '{}' is a directory: add format=tar to download it as a tar archive",
            path.display()
        )))
    } else {
        // A FIFO, socket or device.
        Err(ApiError::bad_request(format!(
            "path '{}' is not a regular file",
            path.display()
        )))
    }
}

/// The answer to an OS error met while looking up or opening `path`.
fn open_error(err: io::Error, path: &Path) -> ApiError {
    let shown = path.display();
    match err.raw_os_error() {
        Some(libc::ENOENT | libc::ENOTDIR) => {
            ApiError::not_found(format!("path '{shown}' does not exist"))
        }
        Some(libc::EACCES | libc::EPERM) => {
            ApiError::new(403, format!("permission denied reading '{shown}'"))
        }
        Some(libc::ELOOP) => ApiError::bad_request(format!(
            "path '{shown}' has too many levels of symbolic links"
        )),
        Some(libc::ENAMETOOLONG) => ApiError::bad_request(format!("path '{shown}' is too long")),
        _ => FsError::io(err, format!("opening '{shown}'")).into(),
    }
}

fn respond(
    head: &Head,
    file: File,
    metadata: &Metadata,
    path: &Path,
    now: i64,
) -> Result<Response, ApiError> {
    let size = metadata.len();
    let etag = headers::etag(
        metadata.dev(),
        metadata.ino(),
        size,
        metadata.mtime(),
        metadata.mtime_nsec(),
    );
    let gzip_etag = headers::gzip_etag(&etag);
    let modified = headers::last_modified(metadata.mtime(), now);
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy())
        .unwrap_or_default();
    let content_type = headers::content_type(&name);
    let is_get = head.method() == "GET";
    let accept_header = joined(head, "accept-encoding");
    let accept = Accept::parse(accept_header.as_deref().map(str::as_bytes));
    let coding = choose_coding(head, &accept, is_get, size, content_type)
        .ok_or_else(|| not_acceptable(path, accept_header.as_deref()))?;
    let etag_of = |coding| match coding {
        Coding::Identity => etag.clone(),
        Coding::Gzip => gzip_etag.clone(),
    };
    let if_match = joined(head, "if-match");
    let if_none_match = joined(head, "if-none-match");
    let conditions = Conditions {
        if_match: if_match.as_deref(),
        if_none_match: if_none_match.as_deref(),
        if_modified_since: first_text(head, "if-modified-since"),
        if_unmodified_since: first_text(head, "if-unmodified-since"),
        if_range: first_text(head, "if-range"),
    };
    let validators = Validators {
        etag: &etag,
        other_form: Some(&gzip_etag),
        mtime: modified,
        now,
    };
    let range_allowed = match conditional::evaluate(&conditions, &validators) {
        Outcome::PreconditionFailed(header) => {
            return Err(ApiError::new(
                412,
                format!("precondition {header} failed for '{}'", path.display()),
            ))
        }
        Outcome::NotModified => {
            let response = Response::empty(304)
                .with_header("ETag", etag_of(coding))
                .with_header("Vary", VARY);
            return Ok(with_last_modified(response, modified));
        }
        Outcome::Proceed { range_allowed } => range_allowed,
    };
    let (coding, slot) = match coding {
        Coding::Gzip => take_place(is_get, &accept)?,
        Coding::Identity => (Coding::Identity, None),
    };
    let described = |status: u16, body: ResponseBody| {
        let response = Response::new(status, body)
            .with_header("Content-Type", content_type)
            .with_header("Content-Disposition", headers::content_disposition(&name))
            .with_header("ETag", etag_of(coding))
            .with_header("Vary", VARY)
            .with_header("X-Content-Type-Options", "nosniff");
        with_last_modified(response, modified)
    };
    if coding == Coding::Gzip {
        // A GET's body is compressed as it is sent; a HEAD has none (chunked like its GET, so
        // no `Content-Length`). No `Accept-Ranges`: ranges are of the file as it is, never of
        // this form, and a client resuming a gzip transfer must not be told otherwise.
        let body = match slot {
            Some(slot) => gzip::start(file, size, path.to_path_buf(), slot),
            None => {
                let (sender, source) = stream::channel(0);
                sender.finish();
                source
            }
        };
        return Ok(
            described(200, ResponseBody::Stream(body)).with_header("Content-Encoding", "gzip")
        );
    }
    let range_header = joined(head, "range").filter(|_| range_allowed && is_get);
    let range = range_header
        .as_deref()
        .map_or(Range::Whole, |value| range::parse(value.as_bytes(), size));
    let (status, offset, len) = match range {
        Range::Whole => (200, 0, size),
        Range::Partial { start, end } => (206, start, end - start + 1),
        Range::Unsatisfiable => {
            let shown = range_header.unwrap_or_default();
            let error = ApiError::new(
                416,
                format!(
                    "range '{shown}' is not satisfiable: '{}' has {size} bytes",
                    path.display()
                ),
            );
            return Ok(Response::from(error)
                .with_header("Content-Range", format!("bytes */{size}"))
                .with_header("Vary", VARY));
        }
    };
    let mut response = described(status, ResponseBody::File { file, offset, len })
        .with_header("Accept-Ranges", "bytes");
    if status == 206 {
        let end = offset + len - 1;
        response = response.with_header("Content-Range", format!("bytes {offset}-{end}/{size}"));
    }
    Ok(response)
}

/// 406: `Accept-Encoding` (`header`) refuses both codings of `path`'s answer.
fn not_acceptable(path: &Path, header: Option<&str>) -> ApiError {
    ApiError::new(
        406,
        format!(
            "no acceptable content coding for '{}': Accept-Encoding '{}' refuses both codings \
             sandboxd sends, gzip and identity",
            path.display(),
            header.unwrap_or_default()
        ),
    )
}

/// Every answer that describes the file depends on `Accept-Encoding` (`identity;q=0` gets even a
/// small file compressed), so every one says so.
const VARY: &str = "Accept-Encoding";

/// The coding of the answer (SPEC §6): gzip when the client prefers it and the file is worth
/// compressing (`gzip::MIN_SIZE` bytes or more, of a type not compressed already, and no `Range`
/// or `If-Range` on a GET, whose positions are the file's bytes), else identity, else gzip when
/// the client refused identity; `None` (406) when it accepts neither.
fn choose_coding(
    head: &Head,
    accept: &Accept,
    is_get: bool,
    size: u64,
    content_type: &str,
) -> Option<Coding> {
    let asks_range =
        is_get && (head.header("range").is_some() || head.header("if-range").is_some());
    let worth = size >= gzip::MIN_SIZE && headers::compressible(content_type) && !asks_range;
    accept.choose(worth)
}

/// A compressed download's place for a GET in gzip (a HEAD takes none: it says what a GET
/// would get now). With every place taken: identity when the client accepts it, else 503.
fn take_place(is_get: bool, accept: &Accept) -> Result<(Coding, Option<gzip::Slot>), ApiError> {
    let slot = if is_get { gzip::Slot::take() } else { None };
    if slot.is_some() || (!is_get && gzip::Slot::available()) {
        return Ok((Coding::Gzip, slot));
    }
    if accept.identity_acceptable() {
        return Ok((Coding::Identity, None));
    }
    Err(ApiError::new(
        503,
        format!(
            "too many compressed downloads under way (at most {}): try again later, or accept \
             identity",
            gzip::MAX_DOWNLOADS
        ),
    ))
}

/// Adds `Last-Modified` when the file has a date to show (`headers::last_modified`).
fn with_last_modified(response: Response, modified: Option<i64>) -> Response {
    match modified {
        Some(time) => response.with_header("Last-Modified", date::format(time)),
        None => response,
    }
}

/// Every field named `name`, as text joined by `,` (a list split over several fields).
fn joined(head: &Head, name: &str) -> Option<String> {
    let mut fields = head.headers_named(name).peekable();
    fields.peek()?;
    let parts: Vec<String> = fields
        .map(|value| String::from_utf8_lossy(value).into_owned())
        .collect();
    Some(parts.join(","))
}

/// The first field named `name`, if it is UTF-8 (a date or a single validator).
fn first_text<'a>(head: &'a Head, name: &str) -> Option<&'a str> {
    head.header(name)
        .map(|value| std::str::from_utf8(value).unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_for(errno: i32) -> ApiError {
        open_error(
            io::Error::from_raw_os_error(errno),
            Path::new("/home/user/a b.txt"),
        )
    }

    #[test]
    fn missing_and_through_a_file_are_404() {
        for errno in [libc::ENOENT, libc::ENOTDIR] {
            assert_eq!(
                error_for(errno),
                ApiError::new(404, "path '/home/user/a b.txt' does not exist")
            );
        }
    }

    #[test]
    fn permission_denied_is_403() {
        for errno in [libc::EACCES, libc::EPERM] {
            assert_eq!(
                error_for(errno),
                ApiError::new(403, "permission denied reading '/home/user/a b.txt'")
            );
        }
    }

    #[test]
    fn bad_paths_are_400_and_the_rest_500() {
        assert_eq!(error_for(libc::ELOOP).status, 400);
        assert_eq!(error_for(libc::ENAMETOOLONG).status, 400);
        let other = error_for(libc::EIO);
        assert_eq!(other.status, 500);
        assert!(
            other
                .message
                .starts_with("error opening '/home/user/a b.txt': "),
            "{}",
            other.message
        );
    }
}
