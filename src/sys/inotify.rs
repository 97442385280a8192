//! inotify(7): an instance, its watches, and the events it reports.
//!
//! Owns the three system calls (`inotify_init1`, `inotify_add_watch`, `inotify_rm_watch`) and
//! the decoding of what a `read` of the descriptor returns. Reading itself goes through
//! `std::fs::File`, so it needs no `unsafe`. The decoder ([`parse`]) is pure: it takes bytes
//! and never calls the kernel, so tests feed it literal records. What the events mean to
//! sandboxd (which watch, which name, which envd event type) is `fs::watch`'s business.
//!
//! A record is `struct inotify_event` in native byte order: `wd` (i32), `mask`, `cookie`, `len`
//! (u32 each), then `len` bytes of name, NUL-terminated and padded with NULs to an alignment
//! boundary (`len` is 0 for an event on the watched directory itself). The kernel returns only
//! whole records from one `read`; [`parse`] still stops at a record cut off by the end of its
//! buffer, and says how many bytes it used, so a caller may carry the rest over.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::check;

/// Bytes of a record before its name.
pub const HEADER: usize = 16;
/// The longest name a record may declare: `NAME_MAX` (255) plus its NUL, rounded up to the
/// kernel's alignment, with room to spare. A longer one is not the kernel's: the bytes are
/// not inotify records.
pub const MAX_NAME: usize = 4096;
/// A buffer this size always holds at least one record (`read` fails with `EINVAL` when the
/// next record does not fit).
pub const MIN_BUFFER: usize = HEADER + 256;

/// A watch descriptor, as `inotify_add_watch` returns it and every event carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Wd(pub i32);

/// One decoded record; the name borrows from the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event<'a> {
    pub wd: Wd,
    pub mask: u32,
    /// Pairs an `IN_MOVED_FROM` with its `IN_MOVED_TO`; 0 otherwise.
    pub cookie: u32,
    /// The entry inside the watched directory; empty for an event on the directory itself.
    pub name: &'a OsStr,
}

/// An inotify instance: non-blocking, closed on exec.
#[derive(Debug)]
pub struct Inotify {
    file: File,
}

impl Inotify {
    pub fn new() -> io::Result<Inotify> {
        // SAFETY: inotify_init1 takes no pointers; a non-negative result is a new descriptor
        // that nothing else owns.
        let fd = check(unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) })?;
        // SAFETY: `fd` was just returned by the kernel and is owned by no one else; it is
        // wrapped exactly once.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Inotify {
            file: File::from(fd),
        })
    }

    /// An instance a previous image of the daemon carried across a live upgrade (`upgrade`),
    /// once it is seen to be one (else `InvalidData`), made non-blocking (the watcher thread
    /// must never wait in a read).
    pub fn from_carried(fd: OwnedFd) -> io::Result<Inotify> {
        let kind = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        if kind != Path::new("anon_inode:inotify") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not an inotify instance",
            ));
        }
        super::poll::set_nonblocking(fd.as_fd())?;
        Ok(Inotify {
            file: File::from(fd),
        })
    }

    /// Watches `path` for the events in `mask` (`IN_*` bits, with flags such as `IN_ONLYDIR`
    /// and `IN_DONT_FOLLOW`). Watching the same inode again gives the same descriptor and
    /// replaces its mask. `ENOSPC`: the user's watch limit (`fs.inotify.max_user_watches`).
    pub fn add_watch(&self, path: &Path, mask: u32) -> io::Result<Wd> {
        let path = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
        // SAFETY: the descriptor is this instance's, open for the borrow of `self`; `path` is a
        // NUL-terminated string alive for the call, which only reads it.
        let wd =
            check(unsafe { libc::inotify_add_watch(self.file.as_raw_fd(), path.as_ptr(), mask) })?;
        Ok(Wd(wd))
    }

    /// Stops watching `wd`; the kernel then queues an `IN_IGNORED` for it. `EINVAL` when it is
    /// not (or no longer) a watch of this instance.
    pub fn rm_watch(&self, wd: Wd) -> io::Result<()> {
        // SAFETY: the descriptor is this instance's, open for the borrow of `self`; the call
        // takes no pointers.
        check(unsafe { libc::inotify_rm_watch(self.file.as_raw_fd(), wd.0) })?;
        Ok(())
    }

    /// Reads queued records into `buf` (at least [`MIN_BUFFER`] bytes); `WouldBlock` when
    /// there are none.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        (&self.file).read(buf)
    }
}

impl AsFd for Inotify {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// Decodes the whole records at the start of `buf`: them, and the number of bytes they span.
/// A record cut off by the end of `buf` is left undecoded (its bytes are not counted). Fails
/// with `InvalidData` on a record declaring a name longer than [`MAX_NAME`].
pub fn parse(buf: &[u8]) -> io::Result<(Vec<Event<'_>>, usize)> {
    let mut events = Vec::new();
    let mut at = 0;
    while let Some(header) = buf.get(at..at + HEADER) {
        let word = |i: usize| [header[i], header[i + 1], header[i + 2], header[i + 3]];
        let len = u32::from_ne_bytes(word(12));
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > MAX_NAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("an inotify record declares a name of {len} bytes"),
            ));
        }
        let Some(name) = buf.get(at + HEADER..at + HEADER + len) else {
            break;
        };
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        events.push(Event {
            wd: Wd(i32::from_ne_bytes(word(0))),
            mask: u32::from_ne_bytes(word(4)),
            cookie: u32::from_ne_bytes(word(8)),
            name: OsStr::from_bytes(&name[..end]),
        });
        at += HEADER + len;
    }
    Ok((events, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One record as the kernel lays it out, the name padded with NULs to `padded` bytes.
    fn record(wd: i32, mask: u32, cookie: u32, name: &[u8], padded: usize) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&wd.to_ne_bytes());
        out.extend_from_slice(&mask.to_ne_bytes());
        out.extend_from_slice(&cookie.to_ne_bytes());
        out.extend_from_slice(&u32::try_from(padded).unwrap().to_ne_bytes());
        out.extend_from_slice(name);
        out.resize(HEADER + padded, 0);
        out
    }

    #[test]
    fn only_a_non_blocking_inotify_instance_is_taken_back() {
        let kernel = Inotify::new().unwrap();
        let copy = kernel.as_fd().try_clone_to_owned().unwrap();
        let taken = Inotify::from_carried(copy).unwrap();
        assert_eq!(
            taken.read(&mut [0u8; MIN_BUFFER]).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        let file = File::open("/dev/null").unwrap();
        let error = Inotify::from_carried(OwnedFd::from(file)).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn records_with_padded_names_and_without_names() {
        let mut buf = record(1, libc::IN_CREATE, 0, b"a.txt", 16);
        buf.extend(record(
            1,
            libc::IN_MOVED_FROM | libc::IN_ISDIR,
            7,
            b"dir",
            32,
        ));
        buf.extend(record(2, libc::IN_DELETE_SELF, 0, b"", 0));
        let (events, used) = parse(&buf).unwrap();
        assert_eq!(used, buf.len());
        assert_eq!(
            events,
            vec![
                Event {
                    wd: Wd(1),
                    mask: libc::IN_CREATE,
                    cookie: 0,
                    name: OsStr::new("a.txt"),
                },
                Event {
                    wd: Wd(1),
                    mask: libc::IN_MOVED_FROM | libc::IN_ISDIR,
                    cookie: 7,
                    name: OsStr::new("dir"),
                },
                Event {
                    wd: Wd(2),
                    mask: libc::IN_DELETE_SELF,
                    cookie: 0,
                    name: OsStr::new(""),
                },
            ]
        );
    }

    #[test]
    fn a_name_that_fills_its_padding_exactly_and_one_that_is_not_utf8() {
        // 16 bytes of name and no NUL inside the declared length: the whole field is the name.
        let buf = record(3, libc::IN_MODIFY, 0, b"0123456789abcdef", 16);
        let (events, _) = parse(&buf).unwrap();
        assert_eq!(events[0].name, OsStr::new("0123456789abcdef"));
        let buf = record(3, libc::IN_ATTRIB, 0, b"\xff\xfe", 16);
        let (events, _) = parse(&buf).unwrap();
        assert_eq!(events[0].name.as_bytes(), b"\xff\xfe");
    }

    #[test]
    fn a_record_cut_off_at_the_end_is_left_for_the_next_read() {
        let first = record(1, libc::IN_CREATE, 0, b"one", 16);
        let second = record(1, libc::IN_DELETE, 0, b"two", 16);
        let mut whole = first.clone();
        whole.extend(&second);
        // Every cut inside the second record (its header or its name) decodes only the first.
        for cut in first.len()..whole.len() {
            let (events, used) = parse(&whole[..cut]).unwrap();
            assert_eq!((events.len(), used), (1, first.len()), "cut at {cut}");
            // The carried-over bytes, completed, decode the second.
            let (rest, used) = parse(&whole[used..]).unwrap();
            assert_eq!(rest.len(), 1);
            assert_eq!(rest[0].name, OsStr::new("two"));
            assert_eq!(used, second.len());
        }
        assert_eq!(parse(&[]).unwrap(), (Vec::new(), 0));
    }

    #[test]
    fn a_record_declaring_a_huge_name_is_refused() {
        let mut buf = record(1, libc::IN_CREATE, 0, b"", 0);
        buf[12..16].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert_eq!(parse(&buf).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn the_kernel_reports_a_created_file_and_a_removed_watch() {
        let dir = tempfile::tempdir().unwrap();
        let inotify = Inotify::new().unwrap();
        let mut buf = vec![0; 4096];
        assert_eq!(
            inotify.read(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        let wd = inotify
            .add_watch(dir.path(), libc::IN_CREATE | libc::IN_ONLYDIR)
            .unwrap();
        std::fs::write(dir.path().join("new.txt"), b"x").unwrap();
        let n = inotify.read(&mut buf).unwrap();
        let (events, used) = parse(&buf[..n]).unwrap();
        assert_eq!(used, n);
        assert_eq!((events[0].wd, events[0].name), (wd, OsStr::new("new.txt")));
        assert_eq!(events[0].mask & libc::IN_CREATE, libc::IN_CREATE);
        inotify.rm_watch(wd).unwrap();
        let n = inotify.read(&mut buf).unwrap();
        let (events, _) = parse(&buf[..n]).unwrap();
        assert_eq!(events[0].mask & libc::IN_IGNORED, libc::IN_IGNORED);
        assert!(inotify.rm_watch(wd).is_err(), "a removed watch is gone");
        let file = dir.path().join("new.txt");
        let error = inotify.add_watch(&file, libc::IN_ONLYDIR).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::ENOTDIR));
    }
}
