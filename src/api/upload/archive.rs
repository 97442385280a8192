//! `POST` and `PUT /files?path=DIR&format=tar`: a tar body unpacked into a directory, all or
//! nothing (SPEC §8a).
//!
//! This module owns the request: the checks made from the head, and the sink that feeds the
//! body through the tar reader (`archive::reader`, pushed whatever the body brought, so nothing
//! is buffered) into the unpacking (`fs::unpack`, which makes each member beside its place and
//! places them all at the end). A gzip body is inflated in front of it (`inflating`), and with
//! `--fs-as-user` every step runs as the user (`as_user`). A refused member, a malformed
//! archive, a full disk or a client that leaves ends the request with nothing placed.

use crate::app::Resolver;
use crate::archive::reader::{Entry, Event, Reader};
use crate::archive::Kind;
use crate::error::ApiError;
use crate::fs::dirs;
use crate::fs::unpack::{names, Member, Unpack, What};
use crate::fs::user_metadata::{UserMetadata, PREFIX};
use crate::fs::FsError;
use crate::http::multipart;
use crate::http::{BodySink, Head, Response};

/// The sink of a tar upload, from the head's checks: `Content-Type` (multipart is 400),
/// `X-Metadata-*` (400: the archive carries each member's), `path` (required) and the
/// destination (a directory, or missing and then made).
pub fn sink(
    head: &Head,
    raw_path: Option<&str>,
    resolver: &Resolver,
) -> Result<Box<dyn BodySink>, ApiError> {
    if let Some(value) = head.header("content-type") {
        let (media_type, _) = multipart::split_media_type(value);
        if media_type.eq_ignore_ascii_case(b"multipart/form-data") {
            return Err(ApiError::bad_request(
                "a tar upload's body is the archive itself: send it raw, not as \
                 multipart/form-data",
            ));
        }
    }
    let metadata_header = head
        .headers()
        .any(|(name, _)| name.len() > 11 && name[..11].eq_ignore_ascii_case(b"x-metadata-"));
    if metadata_header {
        return Err(ApiError::bad_request(
            "X-Metadata-* headers are not taken with format=tar: each member's metadata is its \
             SCHILY.xattr.user.e2b.* records",
        ));
    }
    let raw = raw_path.ok_or_else(|| {
        ApiError::bad_request("the path query parameter is required with format=tar")
    })?;
    let dest = resolver.resolve(raw)?;
    let user = &resolver.user;
    let unpack = Unpack::begin(&dest, user.uid, user.gid)?;
    Ok(Box::new(TarUpload {
        reader: Reader::new(),
        unpack: Some(unpack),
    }))
}

struct TarUpload {
    reader: Reader,
    /// `None` once committed.
    unpack: Option<Unpack>,
}

impl BodySink for TarUpload {
    fn data(&mut self, bytes: &[u8]) -> Result<(), Response> {
        self.feed(bytes).map_err(Response::from)
    }

    fn end(mut self: Box<Self>) -> Response {
        if let Err(e) = self.reader.finish() {
            return invalid(&e).into();
        }
        let Some(unpack) = self.unpack.take() else {
            return ApiError::internal("the archive was placed twice").into();
        };
        match unpack.commit() {
            Ok(paths) => Response::json(200, dirs::file_records_json(&paths)),
            Err(e) => ApiError::from(e).into(),
        }
    }
}

impl TarUpload {
    fn feed(&mut self, bytes: &[u8]) -> Result<(), ApiError> {
        let Some(unpack) = self.unpack.as_mut() else {
            return Ok(());
        };
        let mut at = 0;
        loop {
            let rest = &bytes[at..];
            let (used, event) = self.reader.advance(rest).map_err(|e| invalid(&e))?;
            match event {
                Event::Member(entry) => {
                    let size = entry.size;
                    unpack.member(member(&entry)?, size)?;
                }
                Event::Data(range) => unpack.data(&rest[range])?,
                Event::MemberEnd => unpack.finish_file()?,
                Event::End => {}
                Event::NeedMore => return Ok(()),
            }
            at += used;
        }
    }
}

fn invalid(e: &crate::archive::reader::TarError) -> ApiError {
    ApiError::bad_request(format!("invalid tar archive: {e}"))
}

/// What `fs::unpack` makes of a member; devices, FIFOs and other types are refused.
fn member(entry: &Entry) -> Result<Member<'_>, FsError> {
    let shown = names::shown(&entry.path);
    let refuse = |why: String| FsError::ArchiveRefused(format!("member '{shown}' {why}"));
    let what = match entry.kind {
        Kind::File => What::File,
        Kind::Dir => What::Dir,
        Kind::Symlink => What::Symlink(&entry.link),
        Kind::HardLink => What::HardLink(&entry.link),
        Kind::Special(flag) => {
            return Err(refuse(format!(
                "is a device or FIFO (type '{}'): only files, directories and links are \
                 unpacked",
                char::from(flag)
            )))
        }
        Kind::Other(flag) => {
            return Err(refuse(format!(
                "has type '{}', which sandboxd does not unpack",
                flag.escape_ascii()
            )))
        }
    };
    let pairs = entry.xattrs.iter().filter_map(|(name, value)| {
        Some((name.strip_prefix(PREFIX.as_bytes())?, value.as_slice()))
    });
    let metadata = UserMetadata::from_pairs(pairs)
        .map_err(|reason| refuse(format!("has invalid metadata: {reason}")))?;
    Ok(Member {
        name: &entry.path,
        what,
        mode: entry.mode,
        mtime: entry.mtime,
        metadata,
    })
}
