//! The process's environment block: overwriting a secret's value where it lies.
//!
//! `/proc/<pid>/environ` shows the memory that held the environment at `exec` (the initial
//! stack), for as long as the process lives, to anyone allowed to read it. Removing a variable
//! with `unsetenv` only drops a pointer to that memory; the bytes stay. This module overwrites
//! them. Which variable, and when, is the caller's business.

use std::io;

extern "C" {
    /// POSIX's `environ`: NULL, or a NULL-terminated array of `NAME=value` C strings. musl and
    /// glibc both export it.
    static mut environ: *mut *mut libc::c_char;
}

/// Overwrites with NUL bytes, in place, the value of every `name=value` entry of this
/// process's environment; returns how many entries it changed. Afterwards each reads as
/// `name=` (empty) and `/proc/<pid>/environ` no longer shows the value.
///
/// The environment is not synchronised with other threads (`getenv` reads it unlocked), so this
/// refuses, with an error, unless the process has exactly one thread; it is for the start of
/// `main`, before any thread exists. Without a readable `/proc` that cannot be checked, and it
/// refuses too.
pub fn scrub_value(name: &str) -> io::Result<usize> {
    let threads = thread_count()?;
    if threads != 1 {
        return Err(io::Error::other(format!(
            "the process has {threads} threads; the environment can only be changed with one"
        )));
    }
    let prefix = format!("{name}=");
    let prefix = prefix.as_bytes();
    let mut scrubbed = 0;
    // SAFETY: the process has one thread (checked just above; only this thread could start
    // another), so nothing reads or writes the environment meanwhile. `environ` is NULL or a
    // NULL-terminated array of pointers to NUL-terminated strings in writable memory (the
    // initial stack, or copies made by setenv); each string is read up to its NUL and written
    // only before it, so every access stays inside it.
    unsafe {
        let mut entry = std::ptr::addr_of!(environ).read();
        while !entry.is_null() && !(*entry).is_null() {
            let text = *entry;
            let len = libc::strlen(text);
            let matches = {
                let bytes = std::slice::from_raw_parts(text.cast::<u8>(), len);
                bytes.starts_with(prefix)
            };
            if matches {
                std::ptr::write_bytes(text.add(prefix.len()), 0, len - prefix.len());
                scrubbed += 1;
            }
            entry = entry.add(1);
        }
    }
    Ok(scrubbed)
}

/// The `Threads:` line of `/proc/self/status`.
fn thread_count() -> io::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .and_then(|count| count.trim().parse().ok())
        .ok_or_else(|| io::Error::other("no Threads: line in /proc/self/status"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_while_other_threads_run() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || rx.recv());
        let err = scrub_value("SANDBOXD_TEST_NEVER_SET").unwrap_err();
        assert!(err.to_string().contains("threads"), "{err}");
        drop(tx);
        let _ = other.join();
    }
}
