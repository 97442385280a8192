//! Process-wide settings: the open-file limit, signal masks, `sigwait`, reaping children.

use std::io;

use super::check;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the new soft limit.
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit the kernel writes into.
    check(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) })?;
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: `limit` is a valid, initialised rlimit the kernel only reads.
        check(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) })?;
    }
    Ok(limit.rlim_cur)
}

fn signal_set(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it before any other use, and
    // sigaddset with a valid signal number only sets a bit.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &signal in signals {
            libc::sigaddset(&mut set, signal);
        }
        set
    }
}

/// Blocks `signals` in the calling thread and in every thread it spawns afterwards, so that
/// they are only ever received by [`wait_signal`]. Blocked signals are queued even for PID 1.
pub fn block_signals(signals: &[libc::c_int]) -> io::Result<()> {
    let set = signal_set(signals);
    // SAFETY: `set` is an initialised sigset_t; the old mask is not requested (null).
    let ret = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if ret != 0 {
        return Err(io::Error::from_raw_os_error(ret));
    }
    Ok(())
}

/// Waits until one of `signals` (which must be blocked) arrives and returns it.
pub fn wait_signal(signals: &[libc::c_int]) -> io::Result<libc::c_int> {
    let set = signal_set(signals);
    let mut signal: libc::c_int = 0;
    // SAFETY: `set` is initialised and `signal` is a valid int the call writes into.
    let ret = unsafe { libc::sigwait(&set, &mut signal) };
    if ret != 0 {
        return Err(io::Error::from_raw_os_error(ret));
    }
    Ok(signal)
}

/// Reaps every exited child without blocking. As PID 1, orphans of the sandbox become
/// sandboxd's children; without this they would stay zombies.
pub fn reap_children() {
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid int the call writes into; WNOHANG never blocks.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
    }
}
