//! How the daemon as PID 1 ends the machine, as busybox's init does on `poweroff`, `halt` or
//! `reboot`: every other process asked to stop (`SIGTERM`), killed after a grace period, and
//! reaped; the filesystems synced and, where the power really goes (the initial PID
//! namespace), remounted read-only, innermost first, so that no filesystem needs recovery at
//! the next boot; then the kernel. In a PID namespace of its own (how it is tested on a host)
//! the filesystems are the host's: they are synced and left as they are.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::log;
use crate::sys::power::{self, Power};

/// The inode of the initial PID namespace's `/proc/self/ns/pid` (`PROC_PID_INIT_INO`, fixed
/// since Linux 3.8).
const INITIAL_PID_NAMESPACE: u64 = 0xEFFF_FFFC;
/// How long the processes have between `SIGTERM` and `SIGKILL` (busybox's init: 1 s).
const GRACE: Duration = Duration::from_secs(1);
/// How long the killed processes have to be reaped before the filesystems are remounted.
const KILLED: Duration = Duration::from_secs(2);

/// Ends every other process, puts the filesystems to rest and asks the kernel for `how`;
/// returns only when the kernel refused, with the reason.
pub fn end_machine(how: Power) -> String {
    power::signal_all(libc::SIGTERM);
    if !power::reap_all_until(Instant::now() + GRACE) {
        power::signal_all(libc::SIGKILL);
        power::reap_all_until(Instant::now() + KILLED);
    }
    power::sync_all();
    let filesystems = if in_initial_pid_namespace() {
        read_only_all()
    } else {
        "left mounted (a PID namespace of its own: the host's)".to_string()
    };
    log::line(format_args!(
        "PID 1: {how}: every process ended, filesystems synced, {filesystems}"
    ));
    log::flush();
    format!("the kernel refused the {how}: {}", power::reboot(how))
}

fn in_initial_pid_namespace() -> bool {
    std::fs::metadata("/proc/self/ns/pid").is_ok_and(|ns| ns.ino() == INITIAL_PID_NAMESPACE)
}

/// Remounts every mount read-only, the last mounted first; says how it went.
fn read_only_all() -> String {
    let points = match mounts_to_rest(std::fs::read_to_string("/proc/self/mountinfo")) {
        Ok(points) => points,
        Err(why) => return why,
    };
    let mut refused = Vec::new();
    for point in points.iter().rev() {
        if let Err(error) = power::remount_read_only(point) {
            refused.push(format!("{}: {error}", point.display()));
        }
    }
    power::sync_all();
    let total = points.len();
    let mounts = if total == 1 { "mount" } else { "mounts" };
    match refused.len() {
        0 => format!("{total} {mounts} with data remounted read-only"),
        n => format!(
            "{} of {total} {mounts} with data remounted read-only ({n} refused: {})",
            total - n,
            refused.join(", ")
        ),
    }
}

/// Filesystems that hold no data to lose: the kernel's views and memory-only ones, left as they
/// are (a cgroup2 mount even refuses it: `EBUSY`).
const NO_DATA: [&str; 21] = [
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "devpts",
    "devtmpfs",
    "tmpfs",
    "ramfs",
    "mqueue",
    "debugfs",
    "tracefs",
    "securityfs",
    "pstore",
    "bpf",
    "configfs",
    "fusectl",
    "hugetlbfs",
    "binfmt_misc",
    "autofs",
    "rpc_pipefs",
    "nsfs",
];

/// The mounts to remount read-only, or, when `/proc/self/mountinfo` could not be read, what the
/// end line says instead (not "0 mounts": nothing was tried).
fn mounts_to_rest(mountinfo: std::io::Result<String>) -> Result<Vec<PathBuf>, String> {
    mountinfo
        .map(|text| mount_points(&text))
        .map_err(|e| format!("left mounted (cannot read /proc/self/mountinfo: {e})"))
}

/// The mount points of `/proc/self/mountinfo`'s text whose filesystem holds data (not in
/// [`NO_DATA`]), in the order they were mounted.
fn mount_points(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (mount, filesystem) = line.split_once(" - ")?;
            let kind = filesystem.split(' ').next()?;
            let point = mount.split(' ').nth(4)?;
            (!NO_DATA.contains(&kind)).then_some(point)
        })
        .map(|point| {
            PathBuf::from(OsString::from_vec(crate::stats::cgroup_detect::unescape(
                point,
            )))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mount_points_of_filesystems_with_data_are_read_in_order_with_their_escapes_undone() {
        let mountinfo = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
23 22 0:21 / /proc rw,nosuid - proc proc rw
24 22 0:22 / /mnt/with\\040space rw - xfs /dev/vdb rw
25 22 0:23 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw
26 22 0:24 / /run rw - tmpfs run rw
garbage
";
        assert_eq!(
            mount_points(mountinfo),
            [PathBuf::from("/"), PathBuf::from("/mnt/with space")]
        );
    }

    #[test]
    fn unreadable_mounts_are_said_to_be_left_mounted_not_counted_as_none() {
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(
            mounts_to_rest(Err(missing)).unwrap_err(),
            "left mounted (cannot read /proc/self/mountinfo: entity not found)"
        );
        let one = "22 1 254:0 / / rw - ext4 /dev/vda rw\n".to_string();
        assert_eq!(mounts_to_rest(Ok(one)).unwrap(), [PathBuf::from("/")]);
    }
}
