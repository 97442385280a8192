//! Versions of the system's text files (passwd, group): what identifies one without reading it,
//! and the last text read of a file, read again only when its version changes. A leaf: the
//! users' and owners' parsers both read through it.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// What identifies a version of a file without reading it: device, inode, size, mtime.
pub type FileVersion = (u64, u64, u64, i64, i64);

pub type Version = Option<FileVersion>;

/// The version of the file at `path`, `None` when it cannot be read; the passwd and group
/// files' caches (here and `fs::as_user`) parse them again only when it changes.
pub fn version(path: &Path) -> Version {
    let meta = std::fs::metadata(path).ok()?;
    Some((
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec(),
    ))
}

/// The last text read of a file, with the path and version it was read at.
pub type TextCache = Mutex<Option<(PathBuf, FileVersion, Arc<str>)>>;

/// The text of the file at `path` (non-UTF-8 bytes, say a Latin-1 GECOS field, replaced: they
/// must not hide the other lines), from `cache` while the file's identity, size and
/// modification time are those it was read at, so a change counts at once.
pub fn cached_text(cache: &TextCache, path: &Path) -> std::io::Result<Arc<str>> {
    let version = version(path);
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let (Some((cached, seen, text)), Some(version)) = (cache.as_ref(), version) {
        if cached == path && *seen == version {
            return Ok(Arc::clone(text));
        }
    }
    let bytes = std::fs::read(path)?;
    let text: Arc<str> = String::from_utf8_lossy(&bytes).into();
    if let Some(version) = version {
        *cache = Some((path.to_path_buf(), version, Arc::clone(&text)));
    }
    Ok(text)
}
