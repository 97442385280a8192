//! Composing files (SPEC §5): the checks on the disk, then the crash-safe write.
//!
//! This module owns what compose does to the filesystem: checking sources and destination by
//! device and inode, holding every source open from validation to the end, writing the
//! concatenation to a staged file beside the destination (`fs::atomic`), making it durable,
//! putting it in place, and only then deleting the sources that are still the files it read.
//! It does not parse requests or resolve client paths (`api::compose` and `fs::paths` do).
//!
//! Decisions where SPEC is silent:
//! - A destination that is a symlink is *replaced*: the new file goes where the link was and the
//!   link's target is left alone. (A link to a source, or to a directory, is refused by
//!   validation, because the checks follow symlinks.)
//! - Each source is opened during validation (after a `stat`, so that no device or FIFO is ever
//!   opened) and read through that descriptor: what is copied is the file that was validated,
//!   up to the size it had then, whatever happens to its path meanwhile. One descriptor per
//!   distinct source path is held for the length of the compose (at most 10,000, SPEC §10).
//! - Sources are deleted by the paths the client gave, each distinct path once, and only if the
//!   path still names the very file that was read, unchanged: same device and inode (`stat`
//!   right before the `unlink`, following symlinks as the open did), and the same size and
//!   modification time as when it was opened. A source replaced (an upload over it, answered
//!   200) or written to while the compose ran is kept, and the log says which and why. The
//!   check and the `unlink` are two system calls: Linux has no "unlink if still this inode",
//!   so a replacement landing in the microseconds between them is still lost.
//! - A source that is a symlink loses the link, not its target, as envd's `os.Remove` does. A
//!   path already gone (two paths to one file) is not an error. A source that cannot be deleted
//!   after the destination is in place is logged and the compose still succeeds.
//! - Parent directories created for the destination stay if the compose then fails.
//! - The new file has no user metadata (`user.e2b.*`), whatever the sources or the replaced
//!   destination had: like envd's compose, it is a new file.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::fs::atomic::Staged;
use crate::fs::copy::Appender;
use crate::fs::error::FsError;
use crate::fs::user_metadata::UserMetadata;
use crate::sys::dir::Dir;

/// A compose that passed validation, holding its sources open.
#[derive(Debug)]
pub struct Plan {
    destination: PathBuf,
    /// Each distinct source path once, with its open file, in order of first appearance.
    opened: Vec<Source>,
    /// The sources in the client's order, as indexes into `opened`.
    order: Vec<usize>,
}

/// A source path, the file it named when validated, and that file's state then.
#[derive(Debug)]
struct Source {
    path: PathBuf,
    file: File,
    version: Version,
}

/// What identifies a file and its contents for the deletion check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Version {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl Version {
    fn of(meta: &Metadata) -> Version {
        Version {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
        }
    }
}

/// SPEC §5 steps 5 and 6, in that order: each source in turn is not the destination (by device
/// and inode, following symlinks), exists, and is a regular file; then the destination is not a
/// directory. Each client path is turned into a path by `resolve` when its turn comes, so that a
/// bad one is reported in order too. Changes nothing on disk; opens each distinct source.
pub fn validate<'a>(
    destination: PathBuf,
    raw_sources: impl IntoIterator<Item = &'a str>,
    resolve: impl Fn(&str) -> Result<PathBuf, FsError>,
) -> Result<Plan, FsError> {
    let dest_meta = match fs::metadata(&destination) {
        Ok(meta) => Some(meta),
        Err(err) if is_missing(&err) => None,
        Err(err) => {
            let what = format!("checking destination '{}'", destination.display());
            return Err(FsError::io(err, what));
        }
    };
    let dest_id = dest_meta.as_ref().map(id);
    let mut opened: Vec<Source> = Vec::new();
    let mut index: HashMap<PathBuf, usize> = HashMap::new();
    let mut order = Vec::new();
    for raw in raw_sources {
        let path = resolve(raw)?;
        if let Some(&at) = index.get(&path) {
            order.push(at);
            continue;
        }
        let meta = match fs::metadata(&path) {
            Ok(meta) => meta,
            Err(err) if is_missing(&err) => return Err(FsError::SourceNotFound(path)),
            Err(err) => {
                let what = format!("checking source '{}'", path.display());
                return Err(FsError::io(err, what));
            }
        };
        if Some(id(&meta)) == dest_id {
            return Err(FsError::SourceIsDestination(path));
        }
        if !meta.is_file() {
            return Err(FsError::SourceNotRegular(path));
        }
        let (file, meta) = open_source(&path)?;
        // Swapped for the destination between the stat and the open.
        if Some(id(&meta)) == dest_id {
            return Err(FsError::SourceIsDestination(path));
        }
        index.insert(path.clone(), opened.len());
        order.push(opened.len());
        opened.push(Source {
            path,
            file,
            version: Version::of(&meta),
        });
    }
    if dest_meta.is_some_and(|meta| meta.is_dir()) {
        return Err(FsError::DestinationIsADirectory(destination));
    }
    Ok(Plan {
        destination,
        opened,
        order,
    })
}

impl Plan {
    pub fn destination(&self) -> &Path {
        &self.destination
    }

    /// Writes the concatenation, owned by uid:gid, and replaces the destination with it; then
    /// deletes the sources that are unchanged. On any error before the destination is in
    /// place, nothing remains of the new file and the sources and the previous destination are
    /// as they were.
    pub fn run(&self, uid: u32, gid: u32) -> Result<(), FsError> {
        let destination = &self.destination;
        let staged = Staged::create(destination, uid, gid, &UserMetadata::default())?;
        let meta = staged.file().metadata().map_err(|e| staged.error(e))?;
        let mut appender = Appender::new(&meta);
        let mut offset = 0u64;
        for &at in &self.order {
            let source = &self.opened[at];
            offset += appender
                .append(
                    &source.file,
                    source.version.dev,
                    source.version.size,
                    staged.file(),
                    offset,
                )
                .map_err(|err| {
                    let what = format!(
                        "appending '{}' to '{}'",
                        source.path.display(),
                        destination.display()
                    );
                    FsError::io(err, what)
                })?;
        }
        staged.commit()?;
        self.delete_sources();
        Ok(())
    }

    /// Deletes each distinct source path whose file is still the one read, unchanged. The
    /// check and the removal name the file in the same directory, held open, so a directory
    /// on the way swapped for a symlink meanwhile cannot make the removal act elsewhere.
    fn delete_sources(&self) {
        for source in &self.opened {
            let (dir, name) = match source.open_dir() {
                Ok(held) => held,
                Err(err) if is_missing(&err) => continue,
                Err(err) => {
                    self.log(
                        source,
                        format_args!("kept it: could not open its directory: {err}"),
                    );
                    continue;
                }
            };
            match source.check(&dir, name) {
                Ok(Check::Unchanged) => match dir.remove(name, false) {
                    Ok(()) => {}
                    Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                    Err(err) => self.log(source, format_args!("could not delete it: {err}")),
                },
                Ok(Check::Gone) => {}
                Ok(Check::Dangling) => {
                    // A symlink whose target, read and deleted just before under another
                    // path, is gone: removing the link loses nothing.
                    let _ = dir.remove(name, false);
                }
                Ok(Check::Kept(why)) => self.log(source, format_args!("kept it: {why}")),
                Err(err) => self.log(
                    source,
                    format_args!("kept it: could not check that it is unchanged: {err}"),
                ),
            }
        }
    }

    fn log(&self, source: &Source, what: std::fmt::Arguments) {
        crate::log::line(format_args!(
            "compose into '{}': source '{}': {what}",
            self.destination.display(),
            source.path.display()
        ));
    }
}

/// What the deletion check found at a source path.
#[derive(Debug, PartialEq, Eq)]
enum Check {
    /// The same file, unchanged: delete the path.
    Unchanged,
    /// Nothing there any more.
    Gone,
    /// A symlink to nothing.
    Dangling,
    /// Something else, or the file changed: keep it, for this reason.
    Kept(String),
}

impl Source {
    /// The directory holding the source's name, opened (following the path as named), and
    /// the name.
    fn open_dir(&self) -> io::Result<(Dir, &OsStr)> {
        let (Some(parent), Some(name)) = (self.path.parent(), self.path.file_name()) else {
            return Err(io::Error::from_raw_os_error(libc::EISDIR));
        };
        Ok((Dir::open(parent)?, name))
    }

    /// Compares what `name` in `dir` names now with the file read, and that file now with
    /// itself when it was opened.
    fn check(&self, dir: &Dir, name: &OsStr) -> io::Result<Check> {
        let now = match dir.stat_at(name, true) {
            Ok(stat) => stat,
            Err(err) if is_missing(&err) => {
                return Ok(match dir.stat_at(name, false) {
                    Ok(stat) if stat.is_symlink() => Check::Dangling,
                    _ => Check::Gone,
                })
            }
            Err(err) => return Err(err),
        };
        let now = Version {
            dev: now.dev,
            ino: now.ino,
            size: now.size,
            mtime: now.mtime,
            mtime_nsec: now.mtime_nsec,
        };
        Ok(judge(&self.version, &now))
    }
}

/// The deletion decision for a source read as `read` whose path now names `now`.
fn judge(read: &Version, now: &Version) -> Check {
    if (now.dev, now.ino) != (read.dev, read.ino) {
        Check::Kept("the path names another file now (replaced while the compose ran)".into())
    } else if now.size != read.size {
        Check::Kept(format!(
            "it changed while the compose ran ({} bytes when read, {} now)",
            read.size, now.size
        ))
    } else if (now.mtime, now.mtime_nsec) != (read.mtime, read.mtime_nsec) {
        Check::Kept("it was modified while the compose ran".into())
    } else {
        Check::Unchanged
    }
}

/// Opens a validated source for reading and checks it still is a regular file. `O_NONBLOCK` so
/// that one swapped for a FIFO after the `stat` cannot block the open.
fn open_source(source: &Path) -> Result<(File, Metadata), FsError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(source)
        .map_err(|err| {
            if is_missing(&err) {
                FsError::SourceNotFound(source.to_path_buf())
            } else {
                reading(err, source)
            }
        })?;
    let meta = file.metadata().map_err(|err| reading(err, source))?;
    if !meta.is_file() {
        return Err(FsError::SourceNotRegular(source.to_path_buf()));
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

fn reading(err: io::Error, source: &Path) -> FsError {
    FsError::io(err, format!("reading source '{}'", source.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const READ: Version = Version {
        dev: 1,
        ino: 2,
        size: 3,
        mtime: 4,
        mtime_nsec: 5,
    };

    #[test]
    fn only_the_same_unchanged_file_is_deleted() {
        assert_eq!(judge(&READ, &READ), Check::Unchanged);
        for now in [
            Version { ino: 9, ..READ },
            Version { dev: 9, ..READ },
            Version { size: 4, ..READ },
            Version { mtime: 5, ..READ },
            Version {
                mtime_nsec: 6,
                ..READ
            },
        ] {
            assert!(matches!(judge(&READ, &now), Check::Kept(_)), "{now:?}");
        }
    }

    #[test]
    fn a_source_replaced_or_appended_to_after_validation_is_read_as_validated_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        fs::write(&a, b"old a").unwrap();
        fs::write(&b, b"bb").unwrap();
        let dest = dir.path().join("out");
        let plan = validate(dest.clone(), ["a", "b", "a"], |raw| {
            Ok(dir.path().join(raw))
        })
        .unwrap();
        assert_eq!(plan.opened.len(), 2);
        // After validation: `a` replaced by a rename, `b` appended to.
        fs::write(dir.path().join("new"), b"new a").unwrap();
        fs::rename(dir.path().join("new"), &a).unwrap();
        fs::OpenOptions::new()
            .append(true)
            .open(&b)
            .and_then(|mut f| io::Write::write_all(&mut f, b"+more"))
            .unwrap();
        let meta = fs::metadata(dir.path()).unwrap();
        plan.run(meta.uid(), meta.gid()).unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"old abbold a");
        assert_eq!(fs::read(&a).unwrap(), b"new a");
        assert_eq!(fs::read(&b).unwrap(), b"bb+more");
    }

    #[test]
    fn unchanged_sources_are_deleted_once() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a"), b"A").unwrap();
        fs::hard_link(dir.path().join("a"), dir.path().join("a2")).unwrap();
        let dest = dir.path().join("out");
        let plan = validate(dest.clone(), ["a", "a2", "a"], |raw| {
            Ok(dir.path().join(raw))
        })
        .unwrap();
        let meta = fs::metadata(dir.path()).unwrap();
        plan.run(meta.uid(), meta.gid()).unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"AAA");
        assert!(!dir.path().join("a").exists());
        assert!(!dir.path().join("a2").exists());
    }
}
