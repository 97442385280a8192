//! `GET /files?path=DIR&format=tar`: a directory's tree as a pax tar, made as the client takes
//! it (SPEC §6a).
//!
//! This module owns the archive's job: the walk down the tree, the member headers, the files'
//! bytes, and the gzip form. It runs on the download threads (`gzip::Produce`): each step
//! fills one piece (256 KiB; [`gzip::PIECE`] compressed for the gzip form), queues it and
//! parks the job while the client has not taken the queue, so a slow client holds no thread
//! and the job holds only its descriptors, its walk and its queue.
//!
//! The walk is `fs::walk`'s [`Descent`]: no recursion, directories opened by descriptor
//! without following a symlink, each entry opened `O_NOFOLLOW` (and `O_NONBLOCK`, so a FIFO
//! swapped in does not block) and checked with `fstat` once open, so a link swapped in is never
//! followed out of the tree. A name the listing says is a file or a directory is opened as one
//! at once; any other is looked at with `fstatat(AT_SYMLINK_NOFOLLOW)` first (a symlink's
//! header needs its own `stat`; `DT_UNKNOWN` where a filesystem does not say). A directory's
//! names come in byte order when they fit in [`LEVEL_NAMES`] bytes (the same tree gives the
//! same archive), else in the directory's own order, as `tar -c` sends them (`walk::DirNames`:
//! one pass, not one per batch), so a parked archive of a directory of any width holds little
//! ([`ARCHIVE_NAMES`] at most) and a wide one costs time in proportion to its width. Members: directories (the top one is not a
//! member: it is the destination's), regular files, symlinks as links; FIFOs, sockets and
//! devices are skipped, and so is an entry that vanishes or changes kind between the listing
//! (or its `stat`) and its opening. Hard links are sent as separate files. A member's header says its mode, owner
//! and group by id and name, mtime (with nanoseconds in a pax record) and its `user.e2b.*`
//! attributes (pax `SCHILY.xattr.` records).
//!
//! **A file that changes while it is read.** Its header, written first, says the size it had
//! when opened, and exactly that many bytes follow: bytes appended meanwhile are not sent. A
//! file that shrinks cannot fill its member, so the answer is cut (the connection closes without
//! the last chunk, and without the gzip trailer): the client sees a broken transfer, never an
//! archive with a torn member. A read error or an entry the daemon may not read cuts it too,
//! and the log names the entry and why.
//!
//! One copy: a file's data is read (`pread`) straight into the piece, which for the plain form
//! is the stream's own buffer and becomes its queue whole ([`piece`]); the kernel then copies
//! it into the socket. A body made of byte runs and `sendfile` ranges would need a new kind of
//! response body in the HTTP layer; docs/performance.md measures what the copy costs.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;

use flate2::Crc;

use super::gzip::{self, Slot, PIECE, QUEUE};
use crate::archive::header::{self, Member};
use crate::archive::{padding, push_zeros, Kind, BLOCK};
use crate::fs::as_user::Identity;
use crate::fs::owners::Owners;
use crate::fs::user_metadata;
use crate::fs::walk::{Descent, DirNames};
use crate::http::stream::{self, StreamSender, StreamSource};
use crate::sys::dir::{Dir, Stat};

mod piece;

/// Entries looked at in one piece at most: a directory of skipped entries (sockets, vanished
/// names) does not hold a thread for long.
const LOOKUPS_PER_PIECE: usize = 4096;

/// A piece of the plain (not compressed) form: larger than a compressed piece, as nothing is
/// compressed in between; each piece costs a wake-up of the connection and one of the job, so
/// a larger one halves them per GiB. It is the stream's own buffer, recycled, never copied.
const PLAIN_PIECE: usize = 2 * PIECE;
/// The plain form's queue: one piece, handed over whole (the job makes the next while the
/// connection writes it), never two appended, which would grow an allocation past what a
/// stream recycles.
const PLAIN_QUEUE: usize = PLAIN_PIECE;

/// The bytes of names of a directory the walk sends in byte order ([`DirNames`]): about 1,900
/// names of 240 bytes, or 12,000 of 10; a wider one comes in its own order.
const LEVEL_NAMES: usize = 512 * 1024;
/// The bytes of names the whole walk holds at most: entering a directory lets go of the
/// batches of the levels farthest up until the new one fits (they are read again, from where
/// they were, when the walk comes back to them). With 32 archives at once, 24 MiB in all.
const ARCHIVE_NAMES: usize = LEVEL_NAMES + LEVEL_NAMES / 2;

/// Starts the archive of the tree under `top` (named `shown` in the log) and returns the
/// answer's body.
pub fn start(
    top: Dir,
    shown: PathBuf,
    compress: bool,
    identity: Option<Identity>,
    owners: Arc<Owners>,
    slot: Slot,
) -> StreamSource {
    let (sender, source) = stream::channel(if compress { QUEUE } else { PLAIN_QUEUE });
    sender.on_release(move || drop(slot));
    let job = TarJob::new(top, shown, compress, identity, owners, sender);
    match job {
        Ok(job) => gzip::submit(Box::new(job)),
        // The sender is dropped unfinished with it: the answer is cut.
        Err(e) => crate::log::line(format_args!("tar download cut: {e}")),
    }
    source
}

/// One directory of the walk: its names still to visit ([`DirNames`]) and
/// how long the archive path was before its name was added.
struct Level {
    names: DirNames,
    path_len: usize,
}

/// The member whose data is being sent. Its name in the archive (for the log) is the
/// archive path until its data is out; `dir_len` bytes of it are its directory's.
struct Body {
    file: File,
    size: u64,
    offset: u64,
    dir_len: usize,
}

struct TarJob {
    sender: Option<StreamSender>,
    descent: Descent<Level>,
    /// The archive path of the current directory, ending with `/` (empty at the top); while a
    /// file's data is sent, followed by the file's name.
    path: Vec<u8>,
    /// Header and padding bytes not yet put into a piece.
    pending: Vec<u8>,
    body: Option<Body>,
    /// The end-of-archive blocks are in `pending`.
    ended: bool,
    /// The gzip form: the CRC of the tar bytes so far, and whether the header was sent.
    crc: Option<Crc>,
    started: bool,
    /// Bytes the queue could not take.
    unsent: Vec<u8>,
    identity: Option<Identity>,
    owners: Arc<Owners>,
    shown: PathBuf,
}

impl TarJob {
    fn new(
        top: Dir,
        shown: PathBuf,
        compress: bool,
        identity: Option<Identity>,
        owners: Arc<Owners>,
        sender: StreamSender,
    ) -> io::Result<TarJob> {
        let top_level = Level {
            names: DirNames::new(),
            path_len: 0,
        };
        Ok(TarJob {
            sender: Some(sender),
            descent: Descent::new(top, top_level)?,
            path: Vec::new(),
            pending: Vec::new(),
            body: None,
            ended: false,
            crc: compress.then(Crc::new),
            started: false,
            unsent: Vec::new(),
            identity,
            owners,
            shown,
        })
    }

    /// Ends the answer unfinished (the client sees it cut) and says why in the log.
    fn cut(&mut self, error: &str) {
        crate::log::line(format_args!(
            "tar download of '{}' cut: {error}",
            self.shown.display()
        ));
        self.sender = None;
    }

    /// Appends the archive's next bytes to `out` until it holds `limit`: whether the archive
    /// is complete with them.
    fn fill(&mut self, out: &mut Vec<u8>, limit: usize) -> Result<bool, String> {
        let mut lookups = 0;
        loop {
            if !self.pending.is_empty() {
                let take = self.pending.len().min(limit - out.len());
                out.extend_from_slice(&self.pending[..take]);
                self.pending.drain(..take);
                if out.len() == limit {
                    return Ok(self.ended && self.pending.is_empty());
                }
            }
            if let Some(body) = &mut self.body {
                let left = body.size - body.offset;
                if left > 0 {
                    let room = limit - out.len();
                    let take = usize::try_from(left).map_or(room, |left| left.min(room));
                    match crate::sys::pread::append_at(&body.file, out, take, body.offset) {
                        Ok(0) => {
                            return Err(format!(
                                "'{}' shrank to {} bytes while it was sent (it had {} when opened)",
                                String::from_utf8_lossy(&self.path),
                                body.file.metadata().map_or(body.offset, |m| m.len()),
                                body.size
                            ))
                        }
                        Ok(read) => body.offset += read as u64,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            return Err(format!(
                                "reading '{}': {e}",
                                String::from_utf8_lossy(&self.path)
                            ))
                        }
                    }
                    if out.len() == limit {
                        return Ok(false);
                    }
                    continue;
                }
                push_zeros(&mut self.pending, padding(body.size));
                self.path.truncate(body.dir_len);
                self.body = None;
                continue;
            }
            if self.ended {
                return Ok(true);
            }
            if lookups == LOOKUPS_PER_PIECE {
                return Ok(false);
            }
            lookups += 1;
            if !self.next_member().map_err(|e| e.to_string())? {
                push_zeros(&mut self.pending, 2 * BLOCK);
                self.ended = true;
            }
        }
    }

    /// Looks at the walk's next entry, queueing its header (and opening its data) if it is a
    /// member. False once the walk is over.
    fn next_member(&mut self) -> io::Result<bool> {
        let Some((dir, level)) = self.descent.current() else {
            return Ok(false);
        };
        let next = level.names.next(dir, LEVEL_NAMES);
        let Some((name, listed)) = next.map_err(|e| entry_error(e, &self.path, OsStr::new("")))?
        else {
            let level = self.descent.pop()?;
            self.path.truncate(level.path_len);
            return Ok(self.descent.current().is_some());
        };
        // A file or a directory as the listing says is opened without a `stat` first: opening
        // it finds what it is now (one system call of six per small file fewer).
        let (kind, stat) = match listed {
            libc::DT_REG => (libc::S_IFREG, None),
            libc::DT_DIR => (libc::S_IFDIR, None),
            _ => match dir.stat_at(name, false) {
                Ok(stat) => (stat.kind(), Some(stat)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
                Err(e) => return Err(entry_error(e, &self.path, name)),
            },
        };
        let path_len = self.path.len();
        match kind {
            libc::S_IFDIR => {
                let sub = match dir.open_dir(name, false) {
                    Ok(sub) => sub,
                    Err(e) if swapped(&e) => return Ok(true),
                    Err(e) => return Err(entry_error(e, &self.path, name)),
                };
                self.path.extend_from_slice(name.as_bytes());
                let stat = sub.stat()?;
                // An `O_PATH` descriptor has no `flistxattr`: through /proc (directories are
                // few beside their files).
                let xattrs = attributes(user_metadata::read(&sub.own_proc_path()));
                self.header(Kind::Dir, &stat, 0, b"", &xattrs);
                self.make_room();
                let names = DirNames::new();
                self.descent.push(sub, Level { names, path_len })?;
                self.path.push(b'/');
            }
            libc::S_IFREG => {
                let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY;
                let file = match dir.open_file(name, flags) {
                    Ok(file) => file,
                    Err(e) if swapped(&e) => return Ok(true),
                    Err(e) => return Err(entry_error(e, &self.path, name)),
                };
                let stat = crate::sys::dir::fstat(std::os::fd::AsFd::as_fd(&file))?;
                if !stat.is_file() {
                    return Ok(true);
                }
                self.path.extend_from_slice(name.as_bytes());
                let xattrs = attributes(user_metadata::read_open(&file));
                self.header(Kind::File, &stat, stat.size, b"", &xattrs);
                self.body = Some(Body {
                    file,
                    size: stat.size,
                    offset: 0,
                    dir_len: path_len,
                });
            }
            libc::S_IFLNK => {
                let Some(stat) = stat else {
                    return Ok(true);
                };
                let target = match dir.read_link(name) {
                    Ok(target) => target,
                    Err(e) if swapped(&e) || e.raw_os_error() == Some(libc::EINVAL) => {
                        return Ok(true)
                    }
                    Err(e) => return Err(entry_error(e, &self.path, name)),
                };
                self.path.extend_from_slice(name.as_bytes());
                self.header(Kind::Symlink, &stat, 0, &target, &[]);
                self.path.truncate(path_len);
            }
            // FIFOs, sockets, devices: not archived.
            _ => {}
        }
        Ok(true)
    }

    /// Lets go of the name batches of the levels farthest up until a new level's fits in
    /// [`ARCHIVE_NAMES`].
    fn make_room(&mut self) {
        let mut held: usize = self.descent.states_mut().map(|l| l.names.held()).sum();
        for level in self.descent.states_mut() {
            if held + LEVEL_NAMES <= ARCHIVE_NAMES {
                break;
            }
            held -= level.names.held();
            level.names.release();
        }
    }

    /// Queues the header of the member the archive path names.
    fn header(
        &mut self,
        kind: Kind,
        stat: &Stat,
        size: u64,
        link: &[u8],
        xattrs: &[(String, String)],
    ) {
        let member = Member {
            path: &self.path,
            kind,
            mode: stat.mode & 0o7777,
            uid: stat.uid,
            gid: stat.gid,
            uname: self.owners.user_name(stat.uid).unwrap_or(""),
            gname: self.owners.group_name(stat.gid).unwrap_or(""),
            size,
            mtime: stat.mtime,
            mtime_nsec: u32::try_from(stat.mtime_nsec).unwrap_or(0),
            link,
            xattrs,
        };
        header::write(&member, &mut self.pending);
    }
}

/// An entry swapped for something else (a symlink, another kind) or removed between its
/// `stat` and its opening: it is skipped.
fn swapped(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ELOOP | libc::ENOTDIR | libc::ENOENT | libc::ENXIO)
    )
}

fn entry_error(e: io::Error, dir: &[u8], name: &OsStr) -> io::Error {
    io::Error::new(
        e.kind(),
        format!(
            "'{}{}': {e}",
            String::from_utf8_lossy(dir),
            name.to_string_lossy()
        ),
    )
}

/// `user.e2b.*` attributes as a member's header has them: (full name, value).
fn attributes(read: std::collections::BTreeMap<String, String>) -> Vec<(String, String)> {
    read.into_iter()
        .map(|(key, value)| (format!("{}{key}", user_metadata::PREFIX), value))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn an_entry_swapped_after_the_listing_is_skipped_and_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let top = tmp.path().join("top");
        std::fs::create_dir(&top).unwrap();
        for name in ["f1", "f2", "f3"] {
            std::fs::write(top.join(name), name).unwrap();
        }
        std::fs::write(tmp.path().join("secret"), b"outside the tree").unwrap();
        let (sender, _source) = stream::channel(1 << 20);
        let owners = Arc::new(Owners::load(Path::new("/nonexistent/passwd")));
        let dir = Dir::open(&top).unwrap();
        let mut job = TarJob::new(dir, top.clone(), false, None, owners, sender).unwrap();
        // The first member: the directory is listed (all three as files) and f1 opened.
        assert!(job.next_member().unwrap());
        assert!(job.body.is_some());
        job.body = None;
        job.path.clear();
        job.pending.clear();
        // Swapped since the listing: f2 for a symlink out of the tree, f3 for a directory.
        std::fs::remove_file(top.join("f2")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("secret"), top.join("f2")).unwrap();
        std::fs::remove_file(top.join("f3")).unwrap();
        std::fs::create_dir(top.join("f3")).unwrap();
        assert!(job.next_member().unwrap());
        assert!(job.next_member().unwrap());
        // Neither became a member, and nothing was opened through the link.
        assert!(job.body.is_none());
        assert!(
            job.pending.is_empty(),
            "{:?}",
            String::from_utf8_lossy(&job.pending)
        );
        assert!(!job.next_member().unwrap(), "the walk is over");
    }
}
