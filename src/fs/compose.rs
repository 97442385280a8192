//! Composing files (SPEC §5): the checks on the disk, then the crash-safe write.
//!
//! This module owns what compose does to the filesystem: checking sources and destination by
//! device and inode, writing the concatenation to a temporary beside the destination, making it
//! durable, renaming it into place, and only then deleting the sources. It does not parse requests
//! or resolve client paths (`api::compose` and `fs::paths` do).
//!
//! Decisions where SPEC is silent:
//! - A destination that is a symlink is *replaced*: the rename puts the new file where the link
//!   was and the link's target is left alone. (A link to a source, or to a directory, is refused
//!   by validation, because the checks follow symlinks.)
//! - Sources are deleted by the paths the client gave, each distinct path once; a source that is
//!   a symlink loses the link, not its target, as envd's `os.Remove` does. A path already gone
//!   (two paths to one file) is not an error. A source that cannot be deleted after the rename is
//!   logged and the compose still succeeds, since the destination is already in place.
//! - Parent directories created for the destination stay if the compose then fails.
//! - Sources are read up to the size they had when opened; one that grows meanwhile is cut there.

use std::collections::HashSet;
use std::fs::{self, File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::ApiError;
use crate::fs::atomic::Staged;
use crate::fs::copy::Appender;

/// A compose that passed validation.
#[derive(Debug)]
pub struct Plan {
    destination: PathBuf,
    sources: Vec<PathBuf>,
}

/// SPEC §5 steps 5 and 6, in that order: each source in turn is not the destination (by device
/// and inode, following symlinks), exists, and is a regular file; then the destination is not a
/// directory. Each client path is turned into a path by `resolve` when its turn comes, so that a
/// bad one is reported in order too. Touches nothing.
pub fn validate<'a>(
    destination: PathBuf,
    raw_sources: impl IntoIterator<Item = &'a str>,
    resolve: impl Fn(&str) -> Result<PathBuf, ApiError>,
) -> Result<Plan, ApiError> {
    let dest_meta = match fs::metadata(&destination) {
        Ok(meta) => Some(meta),
        Err(err) if is_missing(&err) => None,
        Err(err) => {
            let what = format!("checking destination '{}'", destination.display());
            return Err(ApiError::from_io(&err, &what));
        }
    };
    let dest_id = dest_meta.as_ref().map(id);
    let mut sources = Vec::new();
    for raw in raw_sources {
        let source = resolve(raw)?;
        let meta = match fs::metadata(&source) {
            Ok(meta) => meta,
            Err(err) if is_missing(&err) => return Err(not_found(&source)),
            Err(err) => {
                let what = format!("checking source '{}'", source.display());
                return Err(ApiError::from_io(&err, &what));
            }
        };
        if Some(id(&meta)) == dest_id {
            return Err(ApiError::bad_request(format!(
                "source path \"{}\" cannot be the same as destination",
                source.display()
            )));
        }
        if !meta.is_file() {
            return Err(not_regular(&source));
        }
        sources.push(source);
    }
    if dest_meta.is_some_and(|meta| meta.is_dir()) {
        return Err(ApiError::bad_request(format!(
            "destination is a directory: {}",
            destination.display()
        )));
    }
    Ok(Plan {
        destination,
        sources,
    })
}

impl Plan {
    pub fn destination(&self) -> &Path {
        &self.destination
    }

    /// Writes the concatenation, owned by uid:gid, and replaces the destination with it; then
    /// deletes the sources. On any error before the rename, the temporary is removed and the
    /// sources and the previous destination are as they were.
    pub fn run(&self, uid: u32, gid: u32) -> Result<(), ApiError> {
        let destination = &self.destination;
        let staged = Staged::create(destination, uid, gid)?;
        let meta = staged.file().metadata().map_err(|e| staged.error(&e))?;
        let mut appender = Appender::new(&meta);
        let mut offset = 0u64;
        for source in &self.sources {
            let (file, meta) = open_source(source)?;
            offset += appender
                .append(&file, &meta, meta.len(), staged.file(), offset)
                .map_err(|err| {
                    let what = format!(
                        "appending '{}' to '{}'",
                        source.display(),
                        destination.display()
                    );
                    ApiError::from_io(&err, &what)
                })?;
        }
        staged.commit()?;
        self.delete_sources();
        Ok(())
    }

    fn delete_sources(&self) {
        let mut seen = HashSet::new();
        for source in &self.sources {
            if !seen.insert(source) {
                continue;
            }
            match fs::remove_file(source) {
                Ok(()) => {}
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => crate::log::line(format_args!(
                    "compose into '{}': could not delete source '{}': {err}",
                    self.destination.display(),
                    source.display()
                )),
            }
        }
    }
}

/// Opens a validated source again for reading and checks it still is a regular file.
/// `O_NONBLOCK` so that one swapped for a FIFO meanwhile cannot block the open.
fn open_source(source: &Path) -> Result<(File, Metadata), ApiError> {
    let what = || format!("reading source '{}'", source.display());
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(source)
        .map_err(|err| {
            if is_missing(&err) {
                not_found(source)
            } else {
                ApiError::from_io(&err, &what())
            }
        })?;
    let meta = file
        .metadata()
        .map_err(|err| ApiError::from_io(&err, &what()))?;
    if !meta.is_file() {
        return Err(not_regular(source));
    }
    Ok((file, meta))
}

fn id(meta: &Metadata) -> (u64, u64) {
    (meta.dev(), meta.ino())
}

/// Errors meaning "nothing is there": no such file, a file where a directory should be, or a
/// symlink loop.
fn is_missing(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::NotFound
        || matches!(err.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP))
}

fn not_found(source: &Path) -> ApiError {
    ApiError::not_found(format!("source file not found: {}", source.display()))
}

fn not_regular(source: &Path) -> ApiError {
    ApiError::bad_request(format!(
        "source path is not a regular file: {}",
        source.display()
    ))
}
