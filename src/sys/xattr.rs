//! Extended attributes: of an open file (`fsetxattr(2)`, `flistxattr(2)`, `fgetxattr(2)`,
//! `fremovexattr(2)`), of a path when reading an entry's (`listxattr(2)`, `getxattr(2)`).
//!
//! Written through a descriptor, never a path, so the attributes land on the very file being
//! written (an unnamed `O_TMPFILE` file has no path anyway). Which names sandboxd uses, and what a
//! filesystem without extended attributes means to a request, is `fs::user_metadata`'s.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::{check, check_size};

/// Sets attribute `name` of `file` to `value`, creating or replacing it.
pub fn set(file: &File, name: &str, value: &[u8]) -> io::Result<()> {
    let name = c_name(name)?;
    // SAFETY: `name` is a NUL-terminated CString and `value` a live slice, both valid for the
    // call, which only reads them (`value.len()` bytes); `file` keeps its descriptor open for
    // the borrow.
    check(unsafe {
        libc::fsetxattr(
            file.as_raw_fd(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })?;
    Ok(())
}

/// Removes attribute `name` of `file`; `ENODATA` when it has none of that name.
pub fn remove(file: &File, name: &str) -> io::Result<()> {
    let name = c_name(name)?;
    // SAFETY: `name` is a NUL-terminated CString alive for the call; `file` keeps its
    // descriptor open for the borrow.
    check(unsafe { libc::fremovexattr(file.as_raw_fd(), name.as_ptr()) })?;
    Ok(())
}

/// The names of `file`'s attributes that this process may see (all namespaces), each without
/// its NUL.
pub fn list(file: &File) -> io::Result<Vec<Vec<u8>>> {
    let mut buf = Vec::new();
    loop {
        // SAFETY: a null buffer with size 0 asks only for the size the list needs.
        let needed =
            check_size(unsafe { libc::flistxattr(file.as_raw_fd(), std::ptr::null_mut(), 0) })?;
        if needed == 0 {
            return Ok(Vec::new());
        }
        buf.resize(needed, 0);
        // SAFETY: `buf` is a live, writable buffer of `buf.len()` bytes for the call; the kernel
        // writes at most that many and returns how many it wrote.
        let got = unsafe { libc::flistxattr(file.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        match check_size(got) {
            Ok(len) => {
                buf.truncate(len);
                break;
            }
            // An attribute was added between the two calls: ask for the size again.
            Err(err) if err.raw_os_error() == Some(libc::ERANGE) => continue,
            Err(err) => return Err(err),
        }
    }
    Ok(buf
        .split(|&b| b == 0)
        .filter(|name| !name.is_empty())
        .map(<[u8]>::to_vec)
        .collect())
}

/// The names of the attributes of the file at `path` (following a symlink), as [`list`].
pub fn list_at(path: &Path) -> io::Result<Vec<Vec<u8>>> {
    let path = c_path(path)?;
    let buf = read_sized(|buf: &mut [u8]| {
        // SAFETY: `path` is a NUL-terminated CString alive for the call; `buf` is a live,
        // writable buffer of `buf.len()` bytes (a null pointer with size 0 when empty, which
        // asks only for the size); the kernel writes at most that many.
        unsafe { libc::listxattr(path.as_ptr(), buf_ptr(buf).cast(), buf.len()) }
    })?;
    Ok(buf
        .split(|&b| b == 0)
        .filter(|name| !name.is_empty())
        .map(<[u8]>::to_vec)
        .collect())
}

/// The value of attribute `name` of the file at `path` (following a symlink).
pub fn get_at(path: &Path, name: &[u8]) -> io::Result<Vec<u8>> {
    let path = c_path(path)?;
    let name = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    read_sized(|buf: &mut [u8]| {
        // SAFETY: `path` and `name` are NUL-terminated CStrings alive for the call; `buf` as in
        // `list_at`.
        unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), buf_ptr(buf), buf.len()) }
    })
}

/// The value of attribute `name` of `file`.
pub fn get(file: &File, name: &[u8]) -> io::Result<Vec<u8>> {
    let name = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    read_sized(|buf: &mut [u8]| {
        // SAFETY: `name` is a NUL-terminated CString alive for the call; `buf` as in `list_at`;
        // `file` keeps its descriptor open for the borrow.
        unsafe { libc::fgetxattr(file.as_raw_fd(), name.as_ptr(), buf_ptr(buf), buf.len()) }
    })
}

/// Runs a call that fills a buffer whose size it can tell: first with a buffer of
/// [`FIRST_TRY`] bytes, which holds what most files have (nothing, or a few names), so one call
/// does; when that is too small (`ERANGE`), asked for the size with an empty buffer, then with
/// one of that size, again if it grew in between.
fn read_sized(mut call: impl FnMut(&mut [u8]) -> libc::ssize_t) -> io::Result<Vec<u8>> {
    let mut first = [0u8; FIRST_TRY];
    match check_size(call(&mut first)) {
        // Nothing (most files): no allocation at all.
        Ok(len) => return Ok(first[..len].to_vec()),
        Err(err) if err.raw_os_error() == Some(libc::ERANGE) => {}
        Err(err) => return Err(err),
    }
    loop {
        let needed = check_size(call(&mut []))?;
        let mut buf = vec![0u8; needed];
        match check_size(call(&mut buf)) {
            Ok(len) => {
                buf.truncate(len);
                return Ok(buf);
            }
            Err(err) if err.raw_os_error() == Some(libc::ERANGE) => continue,
            Err(err) => return Err(err),
        }
    }
}

/// The buffer of a first try (see `read_sized`).
const FIRST_TRY: usize = 1024;

fn buf_ptr(buf: &mut [u8]) -> *mut libc::c_void {
    if buf.is_empty() {
        std::ptr::null_mut()
    } else {
        buf.as_mut_ptr().cast()
    }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn c_name(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Whether an error of these calls means "this filesystem has no (user) extended attributes"
/// (`ENOTSUP`, the same number as `EOPNOTSUPP` on Linux).
pub fn unsupported(err: &io::Error) -> bool {
    err.raw_os_error() == Some(libc::EOPNOTSUPP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_list_remove_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let file = File::create(dir.path().join("f")).unwrap();
        match set(&file, "user.sandboxd.test", b"one") {
            Ok(()) => {}
            Err(err) if unsupported(&err) => {
                eprintln!("skipped: the test directory's filesystem has no user xattrs: {err}");
                return;
            }
            Err(err) => panic!("{err}"),
        }
        set(&file, "user.sandboxd.empty", b"").unwrap();
        let mut names = list(&file).unwrap();
        names.retain(|n| n.starts_with(b"user.sandboxd."));
        names.sort();
        assert_eq!(
            names,
            vec![
                b"user.sandboxd.empty".to_vec(),
                b"user.sandboxd.test".to_vec()
            ]
        );
        assert_eq!(get(&file, b"user.sandboxd.test").unwrap(), b"one");
        assert_eq!(get(&file, b"user.sandboxd.empty").unwrap(), b"");
        remove(&file, "user.sandboxd.test").unwrap();
        let err = get(&file, b"user.sandboxd.test").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENODATA));
        let err = remove(&file, "user.sandboxd.test").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENODATA));
        assert!(set(&file, "user.bad\0name", b"x").is_err());
        // Only user.*, trusted.*, security.* and system.* exist.
        assert!(set(&file, "nonamespace", b"x").is_err());
    }
}
