//! Thin libc wrappers: the only place in sandboxd with `unsafe`.
//!
//! Each wrapper turns one system call into a safe function returning `io::Result`, and each
//! `unsafe` block says why it is sound. Callers never see raw pointers.

#![allow(unsafe_code)]

pub mod clock;
pub mod copy;
pub mod creds;
pub mod dir;
pub mod env;
pub mod epoll;
pub mod exec;
pub mod file;
pub mod fsfreeze;
pub mod handover;
pub mod inotify;
pub mod listing;
pub mod madvise;
pub mod mount;
pub mod net;
pub mod poll;
pub mod power;
pub mod pread;
pub mod priority;
pub mod process;
pub mod pty;
pub mod spawn;
pub mod statfs;
pub mod statvfs;
pub mod xattr;

use std::io;

/// Turns a libc return value into `io::Result`, reading `errno` when it is -1.
fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Like [`check`], for calls returning `ssize_t`.
fn check_size(ret: libc::ssize_t) -> io::Result<usize> {
    // Negative (-1): the call failed and errno says why.
    usize::try_from(ret).map_err(|_| io::Error::last_os_error())
}
