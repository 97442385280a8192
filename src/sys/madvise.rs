//! `madvise(2)` over the daemon's own anonymous memory: `MADV_HUGEPAGE` and `MADV_COLLAPSE`
//! (Linux 6.1, with transparent hugepages) for `/collapse`.

use std::io;

/// `MADV_COLLAPSE` of `asm-generic/mman-common.h` (libc names it for glibc targets only).
pub const MADV_COLLAPSE: libc::c_int = 25;
pub const MADV_HUGEPAGE: libc::c_int = libc::MADV_HUGEPAGE;

/// Advises the kernel about `[start, start + len)` of this process's own address space.
pub fn advise(start: usize, len: usize, advice: libc::c_int) -> io::Result<()> {
    // SAFETY: MADV_HUGEPAGE and MADV_COLLAPSE change how pages are backed, never their
    // contents (collapse copies them into a huge page under the kernel's locks), so no Rust
    // reference into the range is invalidated; the kernel checks the range is mapped and
    // fails otherwise. The address is only passed to the kernel, never dereferenced here.
    let ret = unsafe { libc::madvise(start as *mut libc::c_void, len, advice) };
    if ret == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the kernel knows `MADV_COLLAPSE`: it validates the advice before the range, and an
/// empty range at a page boundary is otherwise a no-op.
pub fn collapse_supported() -> bool {
    // SAFETY: sysconf takes a constant and reads no memory of ours.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let page = usize::try_from(page).unwrap_or(4096);
    advise(page, 0, MADV_COLLAPSE).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_advice_is_einval_and_an_empty_range_is_otherwise_fine() {
        let error = advise(4096, 0, 9999).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EINVAL));
        assert!(advise(4096, 0, libc::MADV_NORMAL).is_ok());
    }
}
