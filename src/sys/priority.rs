//! The calling thread's CPU priority (its nice value): background work (long Connect calls)
//! runs below the threads that answer requests.

use std::io;

use super::check;

/// Sets the nice value of the calling thread only (Linux keeps one per thread: `setpriority`
/// with `PRIO_PROCESS` and 0 names the caller's thread, not the whole process).
pub fn set_thread_nice(nice: i32) -> io::Result<()> {
    // SAFETY: setpriority takes plain integers and touches no memory of ours.
    check(unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's nice value, from /proc (field 19 of its stat).
    fn nice() -> i64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let after = stat.rsplit_once(')').unwrap().1.to_string();
        after.split_whitespace().nth(16).unwrap().parse().unwrap()
    }

    #[test]
    fn only_the_calling_thread_is_reniced() {
        let before = nice();
        let niced = std::thread::spawn(move || {
            set_thread_nice(i32::try_from(before + 3).unwrap()).unwrap();
            nice()
        })
        .join()
        .unwrap();
        assert_eq!(niced, before + 3);
        assert_eq!(nice(), before, "this thread keeps its own");
    }
}
