//! Setting the system's wall clock (`CLOCK_REALTIME`): `/init`'s `timestamp` in a Firecracker
//! guest. Only `platform::clock` calls it, and only when its decision says to; nothing in the
//! test suite does (unit-test builds refuse the call outright).

use std::io;

use super::check;

/// Sets `CLOCK_REALTIME` to `unix_nanos` (nanoseconds since 1970-01-01 UTC). Needs
/// `CAP_SYS_TIME`; without it the kernel answers `EPERM`. A time `timespec` cannot hold is
/// `InvalidInput`, without a call.
pub fn set_realtime(unix_nanos: i128) -> io::Result<()> {
    const NANOS: i128 = 1_000_000_000;
    let out_of_range = || io::Error::new(io::ErrorKind::InvalidInput, "time out of range");
    // `timespec::tv_sec`'s own type (libc's `time_t`, deprecated by name on musl).
    let tv_sec = unix_nanos
        .div_euclid(NANOS)
        .try_into()
        .map_err(|_| out_of_range())?;
    let tv_nsec =
        libc::c_long::try_from(unix_nanos.rem_euclid(NANOS)).map_err(|_| out_of_range())?;
    if cfg!(test) {
        // No test may move the machine's clock: a unit test that reaches here is a bug.
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "clock_settime refused in a test build",
        ));
    }
    let time = libc::timespec { tv_sec, tv_nsec };
    // SAFETY: `time` is a valid, initialised timespec that lives across the call; the kernel
    // only reads it.
    check(unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &time) })?;
    Ok(())
}
