//! Unpacking an archive into a directory, all or nothing: members are made beside their
//! places as the body streams, and put in place only when the whole archive has arrived and
//! been checked ([`Unpack::commit`]); dropped before that, everything made is removed.
//!
//! **Where members are made.** A file or symlink whose directory exists already is made under a
//! temporary name in that directory (`fs::temp`'s names, so a killed daemon's leftovers are
//! swept), and renamed to its name at the commit. A directory that does not exist yet is made
//! under a temporary name if its parent exists, else under its own name inside a new parent;
//! everything below a new directory gets its own name at once, since the new tree is out of
//! sight until its top is renamed into place. So the commit is one rename per new top-level
//! directory and one per member in an existing directory. New directories are made mode 0700,
//! owned by the daemon's filesystem user, so nobody else can enter or change them while they
//! fill; at the commit they get their mode, owner and times (deepest first, after all their
//! contents: GNU tar's `--delay-directory-restore`).
//!
//! **What is never followed.** Every step acts by descriptor: directories opened without
//! following a symlink, files created with `O_EXCL | O_NOFOLLOW`, symlinks made by `symlinkat`
//! and changed only through a descriptor checked to hold the link made (`held`: its staged name
//! may be in the user's reach). A member whose path passes through a symlink (one of
//! the archive, or one already on disk) is refused, as is one that would turn an existing
//! directory into a file. Existing directories keep their mode, owner and metadata (GNU tar's
//! `--no-overwrite-dir`) but take the archive's times once everything is in them, so that
//! unpacking an archive again gives the same tree.
//!
//! **Durability.** As `tar -x`'s: the kernel writes the tree back in its own time (an
//! `fsfreeze` before a snapshot flushes it), unless a member is renamed over an existing name
//! (see [`Unpack::commit`]): then, before that rename, one `syncfs` per filesystem written to
//! makes the staged upload durable (thousands of files cost one journal commit, not one `fsync`
//! each), and after the renames each directory renamed into is synced, so a crash leaves every
//! replaced name on its old data or its new, never on a file whose data was not written
//! (docs/design.md, "Directory archives"). A rename that fails between two others (a concurrent
//! change of the tree) leaves the earlier ones placed, as `fs::atomic::place_all` does.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::fs::dirs;
use crate::fs::error::FsError;
use crate::fs::temp;
use crate::fs::user_metadata::UserMetadata;
use crate::sys::dir::{Dir, Touch};

mod commit;
mod held;
pub mod names;
mod tree;
mod writing;

use writing::Writing;

use commit::make_private_dir;

/// The most members an archive may have.
pub const MAX_MEMBERS: usize = 100_000;
/// The most bytes of file data an archive may unpack to.
pub const MAX_BYTES: u64 = 16 << 30;
/// The most bytes of member names and link targets an archive may have together (what the
/// unpacking holds in memory until the commit).
pub const MAX_NAME_BYTES: usize = 16 << 20;

/// What a member is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum What<'a> {
    File,
    Dir,
    /// A symbolic link to this target (never followed).
    Symlink(&'a [u8]),
    /// A hard link to this earlier member of the archive.
    HardLink(&'a [u8]),
}

/// A member to make.
#[derive(Debug)]
pub struct Member<'a> {
    pub name: &'a [u8],
    pub what: What<'a>,
    pub mode: u32,
    pub mtime: (i64, u32),
    pub metadata: UserMetadata,
}

/// A directory of the archive's tree, by its final path relative to the destination.
struct DirNode {
    /// Made by this unpack (else it existed and is left as it is).
    new: bool,
    /// Made under this temporary name in an existing parent (a new tree's top).
    temp: Option<OsString>,
    /// With `temp`: the directory made there (device, inode), checked before it is set up.
    id: Option<(u64, u64)>,
    /// The archive's mode, time and metadata for it, when it had a member.
    meta: Option<(u32, (i64, u32), UserMetadata)>,
}

/// An entry of the tree.
enum Node {
    Dir(DirNode),
    Made(Made),
}

/// A regular file by device and inode: what the commit checks a name still holds before it
/// touches it.
type FileId = (u64, u64);

/// A file or symlink made: where it is until placed.
struct Made {
    parent: Vec<u8>,
    on_disk: OsString,
    /// A regular file's identity; `None` for a symlink.
    file: Option<FileId>,
}

impl Made {
    fn is_file(&self) -> bool {
        self.file.is_some()
    }
}

/// What the commit renames, in the archive's order.
enum Placement {
    /// A new directory's top, from `temp` to `name` in `parent`.
    Dir {
        parent: Vec<u8>,
        temp: OsString,
        name: OsString,
        /// The directory made (device, inode): removed on failure only while it is there.
        id: (u64, u64),
    },
    /// A file or symlink in an existing directory.
    Entry {
        parent: Vec<u8>,
        temp: OsString,
        name: OsString,
        mtime: (i64, u32),
        /// A regular file's identity; `None` for a symlink.
        file: Option<FileId>,
    },
}

/// An archive being unpacked into one directory.
pub struct Unpack {
    dest: PathBuf,
    uid: u32,
    gid: u32,
    /// The destination's parent, when the destination is new.
    parent: Option<Dir>,
    /// The destination itself, or its stand-in under a temporary name.
    root: Arc<Dir>,
    /// The destination is new: its temporary name in `parent`, and its name.
    root_temp: Option<(OsString, OsString)>,
    /// Every directory and every file or symlink of the tree, by final path.
    nodes: HashMap<Vec<u8>, Node>,
    /// The directories, each after its parent (so backwards, each before its parent).
    dir_order: Vec<Vec<u8>>,
    placements: Vec<Placement>,
    /// Placements done by the commit (the rest are undone when dropped).
    placed: usize,
    /// The last directory opened, by final path.
    open: Option<(Vec<u8>, Arc<Dir>)>,
    writing: Option<Writing>,
    members: usize,
    bytes: u64,
    name_bytes: usize,
    written: Vec<PathBuf>,
    /// A member took the place of an existing name: the commit made the staged tree durable
    /// before the first such rename, and syncs the directories renamed into.
    replaces: bool,
    committed: bool,
}

fn refuse(why: String) -> FsError {
    FsError::ArchiveRefused(why)
}

fn os(bytes: &[u8]) -> &OsStr {
    OsStr::from_bytes(bytes)
}

fn join(parts: &[&[u8]]) -> Vec<u8> {
    parts.join(&b'/')
}

fn system_time((secs, nsec): (i64, u32)) -> SystemTime {
    let since = Duration::new(secs.unsigned_abs(), 0);
    let base = if secs >= 0 {
        SystemTime::UNIX_EPOCH.checked_add(since)
    } else {
        SystemTime::UNIX_EPOCH.checked_sub(since)
    };
    base.and_then(|t| t.checked_add(Duration::from_nanos(u64::from(nsec))))
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

impl Unpack {
    /// Opens the destination `dest` (its path's symlinks followed, as named; missing parents
    /// created for the user as an upload's), or makes its stand-in when it does not exist.
    pub fn begin(dest: &Path, uid: u32, gid: u32) -> Result<Unpack, FsError> {
        let io_err =
            |e: io::Error, doing: &str| FsError::io(e, format!("{doing} '{}'", dest.display()));
        let (parent, root, root_temp) = match (dest.parent(), dest.file_name()) {
            (Some(parent_path), Some(name)) => {
                let parent = dirs::open_or_create(parent_path, uid, gid)?;
                match parent.stat_at(name, true) {
                    Ok(stat) if stat.is_dir() => {
                        let root = parent
                            .open_dir(name, true)
                            .map_err(|e| io_err(e, "opening"))?;
                        temp::sweep_once(dest, &root);
                        (None, root, None)
                    }
                    Ok(_) => {
                        return Err(refuse(format!(
                            "path '{}' is not a directory",
                            dest.display()
                        )))
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        let temp = temp::next_name(name);
                        let root = make_private_dir(&parent, &temp)
                            .map_err(|e| io_err(e, "creating directory"))?;
                        (Some(parent), root, Some((temp, name.to_os_string())))
                    }
                    Err(e) => return Err(io_err(e, "opening")),
                }
            }
            _ => (
                None,
                Dir::open(dest).map_err(|e| io_err(e, "opening"))?,
                None,
            ),
        };
        let mut nodes = HashMap::new();
        let root_node = DirNode {
            new: root_temp.is_some(),
            temp: None,
            id: None,
            meta: None,
        };
        nodes.insert(Vec::new(), Node::Dir(root_node));
        Ok(Unpack {
            dest: dest.to_path_buf(),
            uid,
            gid,
            parent,
            root: Arc::new(root),
            root_temp,
            nodes,
            dir_order: vec![Vec::new()],
            placements: Vec::new(),
            placed: 0,
            open: None,
            writing: None,
            members: 0,
            bytes: 0,
            name_bytes: 0,
            written: Vec::new(),
            replaces: false,
            committed: false,
        })
    }

    fn path_of(&self, rel: &[u8]) -> PathBuf {
        if rel.is_empty() {
            self.dest.clone()
        } else {
            self.dest.join(os(rel))
        }
    }

    /// Counts a member against the limits.
    fn count(&mut self, member: &Member<'_>, size: u64) -> Result<(), FsError> {
        self.members += 1;
        if self.members > MAX_MEMBERS {
            return Err(refuse(format!(
                "the archive has more than {MAX_MEMBERS} members"
            )));
        }
        let link = match member.what {
            What::Symlink(target) | What::HardLink(target) => target.len(),
            _ => 0,
        };
        self.name_bytes += member.name.len() + link;
        if self.name_bytes > MAX_NAME_BYTES {
            return Err(refuse(format!(
                "the archive's names take more than {MAX_NAME_BYTES} bytes"
            )));
        }
        self.bytes = self.bytes.saturating_add(size);
        if self.bytes > MAX_BYTES {
            return Err(refuse(format!(
                "the archive's files take more than {MAX_BYTES} bytes"
            )));
        }
        Ok(())
    }

    /// Starts `member` (with `size` bytes of data to follow for a file).
    pub fn member(&mut self, member: Member<'_>, size: u64) -> Result<(), FsError> {
        self.finish_file()?;
        self.count(&member, size)?;
        let shown = names::shown(member.name);
        let base_len = self.dest.as_os_str().len();
        let parts = names::components(member.name, base_len)
            .map_err(|why| refuse(format!("member '{shown}' {why}")))?;
        let Some((last, parent_parts)) = parts.split_last() else {
            return match member.what {
                // The destination itself: it keeps what it has.
                What::Dir => Ok(()),
                _ => Err(refuse(format!(
                    "member '{shown}' names the destination itself"
                ))),
            };
        };
        let rel = join(&parts);
        if let What::Dir = member.what {
            if let Some(made) = self.made(&rel) {
                return Err(self.not_a_dir(&shown, &rel, made.is_file()));
            }
            self.ensure_dir(&parts, &shown)?;
            if let Some(node) = self.dir_mut(&rel) {
                node.meta = Some((member.mode, member.mtime, member.metadata));
            }
            return Ok(());
        }
        if self.dir(&rel).is_some() {
            return Err(refuse(format!(
                "member '{shown}' is not a directory, but a directory of that name is in the \
                 archive or at '{}'",
                self.path_of(&rel).display()
            )));
        }
        if self.made(&rel).is_some() {
            return Err(refuse(format!(
                "member '{shown}' appears twice in the archive"
            )));
        }
        let parent_rel = self.ensure_dir(parent_parts, &shown)?;
        let dir = self.dir_at(&parent_rel)?;
        let name = os(last);
        let path = self.path_of(&rel);
        let fail = |e: io::Error| FsError::io(e, format!("writing '{}'", path.display()));
        let parent_new = self.dir(&parent_rel).is_some_and(|node| node.new);
        let on_disk = if parent_new {
            name.to_os_string()
        } else {
            match dir.stat_at(name, false) {
                Ok(stat) if stat.is_dir() => {
                    return Err(refuse(format!(
                        "member '{shown}' is not a directory, but '{}' is one",
                        path.display()
                    )))
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(fail(e)),
            }
            temp::next_name(name)
        };
        let file_id = match member.what {
            What::File => {
                // Under a temporary name in an existing directory it is the daemon's alone
                // (0600) until the commit; in a new tree nobody can reach it, so it is made
                // with its mode at once.
                // Not when its mode lacks the owner's write bit and it has metadata to set:
                // setting a `user.*` attribute needs write permission on the file, which a
                // user (`--fs-as-user`) only has through its mode.
                let at_once =
                    parent_new && (member.metadata.is_empty() || member.mode & 0o200 != 0);
                let mode = if at_once { member.mode & 0o777 } else { 0o600 };
                let file = dir.create_file(&on_disk, mode).map_err(fail)?;
                let made = file.metadata();
                // Recorded at once, so that a failure from here on removes it.
                let id = made
                    .as_ref()
                    .map_or((0, 0), |made| (made.dev(), made.ino()));
                self.record(
                    &rel,
                    &parent_rel,
                    &on_disk,
                    last,
                    member.mtime,
                    Some(id),
                    parent_new,
                );
                // The owner and mode it got (the umask, a default ACL or a set-group-ID
                // directory have their say): changed only where they are not the member's, as
                // a change costs a journalled inode update and a look costs none.
                let made = made.map_err(fail)?;
                if (made.uid(), made.gid()) != (self.uid, self.gid) {
                    std::os::unix::fs::fchown(&file, Some(self.uid), Some(self.gid))
                        .map_err(fail)?;
                }
                // A new file (O_EXCL) has no attributes to remove: nothing to do without any.
                if !member.metadata.is_empty() {
                    member.metadata.apply(&file, &path)?;
                }
                self.writing = Some(Writing {
                    file,
                    mode: member.mode & 0o777,
                    mode_set: made.mode() & 0o7777 == member.mode & 0o777,
                    mtime: member.mtime,
                    written: self.written.len(),
                });
                self.written.push(path);
                return Ok(());
            }
            What::Dir => return Ok(()),
            What::Symlink(target) => {
                if target.is_empty() || target.len() > names::PATH_MAX {
                    return Err(refuse(format!(
                        "symbolic link '{shown}' has a target of {} bytes",
                        target.len()
                    )));
                }
                dir.symlink(target, &on_disk).map_err(fail)?;
                self.record(
                    &rel,
                    &parent_rel,
                    &on_disk,
                    last,
                    member.mtime,
                    None,
                    parent_new,
                );
                // Changed through a descriptor checked to hold the link just made: in an
                // existing directory its name is in the user's reach, and a hard link to
                // another file swapped in for it must not be given to the user.
                let link = held::made_link(&dir, &on_disk, target).map_err(fail)?;
                link.chown(self.uid, self.gid).map_err(fail)?;
                link.set_mtime(member.mtime, Touch::Times).map_err(fail)?;
                None
            }
            What::HardLink(target) => {
                let shown_target = names::shown(target);
                let not_earlier = || {
                    refuse(format!(
                        "hard link '{shown}' names '{shown_target}', which is not a file \
                         earlier in the archive"
                    ))
                };
                let target_parts =
                    names::components(target, base_len).map_err(|_| not_earlier())?;
                let target_rel = join(&target_parts);
                let made = self
                    .made(&target_rel)
                    .filter(|made| made.is_file())
                    .ok_or_else(not_earlier)?;
                let (from_parent, from_name, id) =
                    (made.parent.clone(), made.on_disk.clone(), made.file);
                self.finish_file()?;
                let from = self.dir_at(&from_parent)?;
                from.link(&from_name, &dir, &on_disk).map_err(fail)?;
                self.written.push(path);
                id
            }
        };
        self.record(
            &rel,
            &parent_rel,
            &on_disk,
            last,
            member.mtime,
            file_id,
            parent_new,
        );
        Ok(())
    }
}
