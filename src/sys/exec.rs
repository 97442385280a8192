//! Running a program from an open descriptor, never by a path (`execveat` with `AT_EMPTY_PATH`,
//! what `fexecve` does): live upgrade's new binary (`crate::upgrade`) is checked and executed as
//! the very file the daemon wrote, whatever its path names by then.
//!
//! A file still open for writing cannot be executed (`ETXTBSY`), so the writer is given a
//! read-only descriptor of the same file first ([`reopen_read_only`], through its own
//! `/proc/self/fd/<n>`, which names the open file and nothing a path could be changed to).
//!
//! The descriptor executed from is not close-on-exec at the `execve`: for a script, the kernel
//! hands its interpreter `/dev/fd/<n>` to open, which a closed descriptor would make fail with
//! `ENOENT` (`fexecve(3)`). The new image then holds it; whoever executes says what becomes of
//! it (a check run's child ends with it; the upgrade names it in the handover, and the new
//! image closes it).

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::process::Command;

use super::check;
use super::dir::fstat;

/// A second descriptor of the open `file`, read-only and close-on-exec: the same file (checked
/// by device and inode), whatever is at its path now.
pub fn reopen_read_only(file: &File) -> io::Result<File> {
    let own = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `own` is a NUL-terminated string alive for the call; the flags are constants.
    let fd = check(unsafe { libc::open(own.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) })?;
    // SAFETY: `fd` was just returned by the kernel for this process and is owned by nobody else.
    let reopened = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let (was, is) = (
        fstat(std::os::fd::AsFd::as_fd(file))?,
        fstat(std::os::fd::AsFd::as_fd(&reopened))?,
    );
    if was.id() != is.id() {
        return Err(io::Error::other(
            "/proc/self/fd named another file (is /proc procfs?)",
        ));
    }
    Ok(reopened)
}

/// A null-terminated array of C strings for `execve`, built before any `fork` (a forked child
/// must not allocate).
struct Strings {
    _owned: Vec<CString>,
    pointers: Vec<*const libc::c_char>,
}

// SAFETY: the pointers point into the `CString`s the same value owns, which are never changed
// or freed while it lives; they are only read (by the kernel, at `execveat`).
unsafe impl Send for Strings {}
// SAFETY: as above: shared access only ever reads.
unsafe impl Sync for Strings {}

impl Strings {
    /// `None` when one of them holds a NUL byte.
    fn new(items: impl Iterator<Item = Vec<u8>>) -> Option<Strings> {
        let owned: Vec<CString> = items.map(CString::new).collect::<Result<_, _>>().ok()?;
        let pointers = owned
            .iter()
            .map(|s| s.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        Some(Strings {
            _owned: owned,
            pointers,
        })
    }

    fn argv_envp(
        args: &[OsString],
        env: &[(OsString, OsString)],
    ) -> io::Result<(Strings, Strings)> {
        let argv = Strings::new(args.iter().map(|a| a.as_bytes().to_vec()));
        let envp = Strings::new(env.iter().map(|(key, value)| {
            let mut pair = key.as_bytes().to_vec();
            pair.push(b'=');
            pair.extend_from_slice(value.as_bytes());
            pair
        }));
        match (argv, envp) {
            (Some(argv), Some(envp)) => Ok((argv, envp)),
            _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }
}

/// `execveat(fd, "", argv, envp, AT_EMPTY_PATH)` with `fd` made inheritable first; returns
/// only on failure, with errno. Only raw system calls: safe in a forked child.
fn execute(fd: RawFd, argv: &Strings, envp: &Strings) -> io::Error {
    // SAFETY: F_SETFD with 0 only clears this descriptor's close-on-exec flag.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } == -1 {
        return io::Error::last_os_error();
    }
    // SAFETY: the empty path is a static NUL-terminated string; `argv` and `envp` are
    // null-terminated arrays of pointers to NUL-terminated strings, all owned by the caller and
    // alive for the call; the kernel only reads them. It returns only on failure.
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            fd,
            c"".as_ptr(),
            argv.pointers.as_ptr(),
            envp.pointers.as_ptr(),
            libc::AT_EMPTY_PATH,
        );
    }
    io::Error::last_os_error()
}

/// Replaces this process's image with the program open at `program`: argv `args`, environment
/// `env`. Returns only when it failed, with why; then `program` is left inheritable (the caller
/// set it to be carried or closes it). Nothing else is changed first (signal mask and
/// dispositions, other descriptors): on failure the process goes on as it was.
pub fn exec_fd(
    program: BorrowedFd<'_>,
    args: &[OsString],
    env: &[(OsString, OsString)],
) -> io::Error {
    match Strings::argv_envp(args, env) {
        Ok((argv, envp)) => execute(program.as_raw_fd(), &argv, &envp),
        Err(error) => error,
    }
}

/// Makes `command` run the program open at `program` instead of its own (`args` as argv, this
/// process's environment): its last step in the child, after std has set up the standard
/// descriptors, is the `execveat`; a failure is std's spawn error. The caller keeps `program`
/// open until the spawn returns.
pub fn run_instead(
    command: &mut Command,
    program: BorrowedFd<'_>,
    args: &[OsString],
) -> io::Result<()> {
    let env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    let (argv, envp) = Strings::argv_envp(args, &env)?;
    let fd = program.as_raw_fd();
    let hook = move || -> io::Result<()> { Err(execute(fd, &argv, &envp)) };
    // SAFETY: the hook runs in the forked child before std's own exec, which it replaces. It
    // makes two raw system calls (fcntl, execveat) on data prepared before the fork, allocates
    // nothing, takes no lock and touches no state shared with the parent's other threads. The
    // descriptor is open in the child: the caller keeps it open in the parent across the fork.
    unsafe {
        command.pre_exec(hook);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::process::Stdio;

    #[test]
    fn a_reopened_file_is_the_same_file_whatever_its_path_becomes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("staged");
        let mut file = File::create(&path).unwrap();
        file.write_all(b"first").unwrap();
        std::fs::rename(dir.path().join("staged"), dir.path().join("moved")).unwrap();
        std::fs::write(&path, b"planted").unwrap();
        let mut back = String::new();
        reopen_read_only(&file)
            .unwrap()
            .read_to_string(&mut back)
            .unwrap();
        assert_eq!(back, "first");
    }

    #[test]
    fn a_script_runs_from_its_descriptor_even_close_on_exec() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("script");
        std::fs::write(&path, "#!/bin/sh\necho \"ran $1 as $0\"\n").unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        // std opens close-on-exec.
        let file = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut command = Command::new("ignored");
        command.stdout(Stdio::piped());
        run_instead(&mut command, file.as_fd(), &["name".into(), "it".into()]).unwrap();
        let output = command.output().unwrap();
        assert!(output.status.success());
        let printed = String::from_utf8(output.stdout).unwrap();
        assert!(printed.starts_with("ran it as /dev/fd/"), "{printed}");
    }

    #[test]
    fn a_failed_exec_says_why() {
        let file = crate::sys::handover::memory_file("not-a-program").unwrap();
        let mut command = Command::new("ignored");
        run_instead(&mut command, file.as_fd(), &["x".into()]).unwrap();
        // Not executable (a memory file is made 0777 but is empty): the kernel refuses.
        assert!(command.output().is_err());
        let error = exec_fd(file.as_fd(), &["a\0b".into()], &[]);
        assert_eq!(error.raw_os_error(), Some(libc::EINVAL));
    }
}
