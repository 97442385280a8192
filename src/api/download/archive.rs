//! The `format` query parameter of `GET` and `HEAD /files`: which archive of a directory is
//! asked for, and the answer that starts it (SPEC §6a). Making the archive is `tar`'s.
//!
//! Only tar is made. zip is refused with 400 and a reason: a zip that is written as it is
//! sent (no seeking back to fill sizes) needs data descriptors and, for files over 4 GiB,
//! zip64 records; the `zip` crate can stream so but brings its own compression stack and
//! costs several times the ~40 KiB this feature may add to the binary, and a tar with
//! `Accept-Encoding: gzip` gives the same one-request download.

use std::path::Path;

use super::encoding::{Accept, Coding};
use super::{gzip, headers, joined, not_acceptable, open_error, tar, VARY};
use crate::app::{App, Resolver};
use crate::error::ApiError;
use crate::fs::owners::Owners;
use crate::http::stream;
use crate::http::{Head, Response, ResponseBody};
use crate::sys::dir::Dir;

/// The archive a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Tar,
}

/// The `format` parameter: `None` for a plain file download (absent or empty), else the
/// archive; 400 for zip (with why) and anything else.
pub fn format(value: Option<&str>) -> Result<Option<Format>, ApiError> {
    match value {
        None | Some("") => Ok(None),
        Some("tar") => Ok(Some(Format::Tar)),
        Some("zip") => Err(ApiError::bad_request(
            "format 'zip' is not supported: only tar archives are (format=tar; \
             gzip-compressed with Accept-Encoding or Content-Encoding)",
        )),
        Some(other) => Err(ApiError::bad_request(format!(
            "unknown format '{other}': the only archive format is tar"
        ))),
    }
}

/// Answers `GET`/`HEAD /files?path=DIR&format=tar`.
pub fn respond(
    app: &App,
    head: &Head,
    resolver: &Resolver,
    dir: &Path,
) -> Result<Response, ApiError> {
    let identity = app.identity(&resolver.user);
    let top = {
        let _as_user = identity.as_ref().map(|who| who.enter()).transpose()?;
        open_dir(dir)?
    };
    let accept_header = joined(head, "accept-encoding");
    let accept = Accept::parse(accept_header.as_deref().map(str::as_bytes));
    let coding = accept
        .choose(true)
        .ok_or_else(|| not_acceptable(dir, accept_header.as_deref()))?;
    // A GET takes one of the places; a HEAD says what a GET would get now.
    let slot = match head.method() {
        "GET" => gzip::Slot::take(),
        _ => None,
    };
    if slot.is_none() && (head.method() == "GET" || !gzip::Slot::available()) {
        return Err(ApiError::new(
            503,
            format!(
                "too many streamed downloads under way (at most {}): try again later",
                gzip::MAX_DOWNLOADS
            ),
        ));
    }
    let compress = coding == Coding::Gzip;
    let body = match slot {
        Some(slot) => {
            let owners = Owners::current(&app.config.passwd_file);
            tar::start(top, dir.to_path_buf(), compress, identity, owners, slot)
        }
        None => {
            let (sender, source) = stream::channel(0);
            sender.finish();
            source
        }
    };
    let name = dir
        .file_name()
        .map_or_else(|| "root".into(), |name| name.to_string_lossy());
    let response = Response::new(200, ResponseBody::Stream(body))
        .with_header("Content-Type", "application/x-tar")
        .with_header(
            "Content-Disposition",
            headers::content_disposition(&format!("{name}.tar")),
        )
        .with_header("Vary", VARY)
        .with_header("X-Content-Type-Options", "nosniff");
    Ok(if compress {
        response.with_header("Content-Encoding", "gzip")
    } else {
        response
    })
}

/// Opens the directory to archive, following the symlinks of its path as named (as a file
/// download does); 404 when missing, 400 when not a directory, 403 when not searchable.
fn open_dir(path: &Path) -> Result<Dir, ApiError> {
    match Dir::open(path) {
        Ok(dir) => {
            // Listing needs read permission: refused here rather than cutting the stream (one
            // buffer of it read, not the whole directory).
            dir.is_empty().map_err(|e| open_error(e, path))?;
            Ok(dir)
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) && path.exists() => Err(
            ApiError::bad_request(format!("path '{}' is not a directory", path.display())),
        ),
        Err(e) => Err(open_error(e, path)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(format(None), Ok(None));
        assert_eq!(format(Some("")), Ok(None));
        assert_eq!(format(Some("tar")), Ok(Some(Format::Tar)));
        assert_eq!(
            format(Some("zip")).unwrap_err().message,
            "format 'zip' is not supported: only tar archives are (format=tar; \
             gzip-compressed with Accept-Encoding or Content-Encoding)"
        );
        assert_eq!(
            format(Some("TAR")),
            Err(ApiError::bad_request(
                "unknown format 'TAR': the only archive format is tar"
            ))
        );
    }
}
