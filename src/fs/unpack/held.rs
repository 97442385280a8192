//! Entries the unpacking made, reached again through a descriptor checked to hold them.
//!
//! A symlink has no descriptor of its own when `symlinkat` makes it, and a file placed by a
//! rename is known by name only; in an existing directory those names are in the reach of
//! whoever may write the directory (the user), who can swap in a hard link to any file they may
//! link (any file at all with `fs.protected_hardlinks=0`; one they may read and write
//! otherwise). So neither owner nor times are ever set by such a name: the name is opened
//! `O_PATH | O_NOFOLLOW`, the descriptor is checked to be what was made, and the change goes
//! through it (`sys::dir::Held`).

use std::ffi::OsStr;
use std::io;

use super::FileId;
use crate::sys::creds;
use crate::sys::dir::{Dir, Held};

/// The symlink `name` in `dir`, just made with `target`: a symlink with that target, one name,
/// owned by the thread's filesystem user (the daemon's, or the user's with `--fs-as-user`).
/// Anything else is an error: someone put another entry at the name meanwhile. (What could pass
/// the check is a link of the same owner and target with no other name, which a user could
/// only have moved there from a directory they may write: nothing they did not have.)
pub(super) fn made_link(dir: &Dir, name: &OsStr, target: &[u8]) -> io::Result<Held> {
    let held = dir.hold(name)?;
    let stat = held.stat()?;
    let ours = stat.is_symlink()
        && stat.nlink == 1
        && stat.uid == creds::fsuid()
        && held.read_link()? == target;
    if !ours {
        return Err(io::Error::other(
            "the symbolic link made there was replaced by another entry meanwhile",
        ));
    }
    Ok(held)
}

/// The regular file `name` in `dir` if it is still the file `id` made, else `None` (the name
/// was taken by something else after the placing: it is left alone).
pub(super) fn made_file(dir: &Dir, name: &OsStr, id: FileId) -> Option<Held> {
    let held = dir.hold(name).ok()?;
    let stat = held.stat().ok()?;
    (stat.is_file() && (stat.dev, stat.ino) == id).then_some(held)
}
