//! `statfs(2)`: the type of the filesystem holding a path (its magic number), which tells a
//! network or FUSE mount from a local one.

use std::ffi::CString;
use std::io;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `f_type` of the filesystem holding `path` (the `*_MAGIC` numbers of `linux/magic.h`).
pub fn fs_type(path: &Path) -> io::Result<u64> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    // SAFETY: `c_path` is a NUL-terminated string alive for the call, and `buf` points to
    // writable memory the size of `struct statfs`. The buffer starts zeroed and the struct is
    // plain integers, so it is a valid value whether or not the call filled it; it is only
    // read when the call returned 0.
    let (rc, st) = unsafe {
        let mut buf = MaybeUninit::<libc::statfs>::zeroed();
        let rc = libc::statfs(c_path.as_ptr(), buf.as_mut_ptr());
        (rc, buf.assume_init())
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // `f_type` is a signed word whose values are 32-bit magic numbers: kept as their bits.
    // (The low 32 bits by design: e.g. CIFS's 0xFF534D42 is negative as an i32 word.)
    #[allow(
        clippy::unnecessary_cast,
        clippy::cast_sign_loss,
        clippy::cast_possible_truncation
    )]
    let magic = st.f_type as u32;
    Ok(u64::from(magic))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_is_procfs_and_a_missing_path_is_an_error() {
        const PROC_SUPER_MAGIC: u64 = 0x9fa0;
        assert_eq!(fs_type(Path::new("/proc")).unwrap(), PROC_SUPER_MAGIC);
        let error = fs_type(Path::new("/no/such/path")).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
    }
}
