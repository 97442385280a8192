//! `statvfs(2)`: the block counts of the filesystem holding a path.
//!
//! Owns the one call and the conversion of `struct statvfs` into plain `u64`s; the arithmetic
//! SPEC asks of the figures (used = `(f_blocks - f_bfree) * f_frsize`, as `df` and envd's
//! gopsutil count it: blocks reserved for root are not "used") lives here too, saturating.

use std::ffi::CString;
use std::io;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The counts of `struct statvfs` that sandboxd reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStats {
    /// `f_blocks`: size of the filesystem in `f_frsize` units.
    pub blocks: u64,
    /// `f_bfree`: free blocks, those reserved for root included.
    pub bfree: u64,
    /// `f_frsize`: fragment size, the unit of `blocks` and `bfree`.
    pub frsize: u64,
}

impl FsStats {
    /// `f_blocks * f_frsize`, saturating.
    pub fn total_bytes(&self) -> u64 {
        self.blocks.saturating_mul(self.frsize)
    }

    /// `(f_blocks - f_bfree) * f_frsize`, saturating.
    pub fn used_bytes(&self) -> u64 {
        self.blocks
            .saturating_sub(self.bfree)
            .saturating_mul(self.frsize)
    }
}

/// `statvfs(path)`. A path containing a NUL byte is `InvalidInput`; any failure of the call is the
/// OS error.
pub fn statvfs(path: &Path) -> io::Result<FsStats> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    // SAFETY: `c_path` is a valid NUL-terminated string that outlives the call, and `buf` points to
    // writable memory the size of `struct statvfs`, which is all statvfs(3) requires. The buffer
    // starts zeroed and the struct is plain integers, so it is a valid value whether or not the call
    // filled it; it is only read when the call returned 0.
    let (rc, st) = unsafe {
        let mut buf = MaybeUninit::<libc::statvfs>::zeroed();
        let rc = libc::statvfs(c_path.as_ptr(), buf.as_mut_ptr());
        (rc, buf.assume_init())
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // `fsblkcnt_t` and `c_ulong` are u32 on some 32-bit targets and u64 elsewhere.
    #[allow(clippy::unnecessary_cast)]
    Ok(FsStats {
        blocks: st.f_blocks as u64,
        bfree: st.f_bfree as u64,
        frsize: st.f_frsize as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_has_blocks() {
        let st = statvfs(Path::new("/")).expect("statvfs /");
        assert!(st.blocks > 0 && st.frsize > 0, "{st:?}");
        assert!(st.bfree <= st.blocks, "{st:?}");
        assert!(st.used_bytes() <= st.total_bytes());
    }

    /// `used_bytes` is what `df` shows as used (`stat -f`: total blocks less free blocks), not
    /// total less the blocks available to unprivileged users.
    #[test]
    fn used_is_blocks_less_free_blocks_as_df() {
        let Ok(output) = std::process::Command::new("stat")
            .args(["-f", "-c", "%b %f %a %S", "/"])
            .output()
        else {
            return; // no coreutils `stat`: nothing to compare with
        };
        let text = String::from_utf8_lossy(&output.stdout);
        let numbers: Vec<u64> = text
            .split_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect();
        let [blocks, free, _available, size] = numbers[..] else {
            panic!("stat -f printed {text:?}");
        };
        let st = statvfs(Path::new("/")).expect("statvfs /");
        assert_eq!(st.blocks, blocks);
        assert_eq!(st.frsize, size);
        // Other writers may change the free count between the two calls: allow 64 MiB.
        let slack = (64 << 20) / size;
        assert!(st.bfree.abs_diff(free) <= slack, "{st:?} vs {text}");
        assert!(st.used_bytes().abs_diff((blocks - free) * size) <= slack * size);
    }

    #[test]
    fn missing_path_is_not_found() {
        let err = statvfs(Path::new("/nonexistent/sandboxd-statvfs-test")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn nul_byte_is_invalid_input() {
        let err = statvfs(Path::new("/a\0b")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn arithmetic_saturates() {
        let st = FsStats {
            blocks: u64::MAX,
            bfree: 1,
            frsize: 4096,
        };
        assert_eq!(st.total_bytes(), u64::MAX);
        assert_eq!(st.used_bytes(), u64::MAX);
        let odd = FsStats {
            blocks: 10,
            bfree: 20,
            frsize: 4096,
        };
        assert_eq!(odd.used_bytes(), 0);
        assert_eq!(odd.total_bytes(), 40960);
        let real = FsStats {
            blocks: 1000,
            bfree: 250,
            frsize: 4096,
        };
        assert_eq!(real.used_bytes(), 750 * 4096);
    }
}
