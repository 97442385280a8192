//! Where `POST /upgrade` writes the new binary: `--upgrade-path`'s directory, held open once it
//! is shown to be root's alone, and the staged file in it, made and placed through that
//! descriptor (`sys::dir::Dir`): unnamed until placed where the filesystem allows, as
//! `fs::atomic`'s files. What runs is never looked up by path: the route keeps the staged
//! file's descriptor and checks and executes it (`sys::exec`).
//!
//! **Whose directory.** As sshd's `StrictModes` (`secure_path`): the directory, resolved once
//! (symlinks the operator put in the path are followed), and every directory above it must be
//! owned by root, or by the user sandboxd runs as when that is not root; the directory itself
//! must not be writable by its group or by others; one above it may be only when it is sticky
//! (as `/tmp`: nobody else may rename or remove what root owns in it). Otherwise whoever can
//! write there could swap the binary, or a directory on the way to it, for one of their own,
//! and the daemon would put it in place for root to run at the next start: refused before
//! anything is written. Each directory is opened from the one above it without following a
//! symlink, so the directory held is the one checked.
//!
//! The check is made at each `/upgrade` with a body, not at start: a sandbox whose upgrade
//! directory is missing or unsafe still serves everything else, and a directory changed after
//! the start is caught.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::{Component, Path, PathBuf};

use crate::sys::dir::{Dir, Stat};

/// `--upgrade-path`'s directory, checked and held, and the names in it.
#[derive(Debug)]
pub struct Staging {
    dir: Dir,
    /// `--upgrade-path` as configured, for messages.
    target: PathBuf,
    name: OsString,
    /// The staged file's name, where it has one (no `O_TMPFILE`: `named`).
    temporary: OsString,
    named: bool,
    /// The name the checked binary is linked under to be renamed over the path.
    placing: OsString,
}

impl Staging {
    /// Opens and checks `target`'s directory; the error is the client's message.
    pub fn open(target: &Path) -> Result<Staging, String> {
        let name = target
            .file_name()
            .ok_or_else(|| format!("--upgrade-path '{}' names no file", target.display()))?;
        let parent = match target.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        let dir = held(parent).map_err(|why| {
            format!(
                "--upgrade-path '{}' is not safe to upgrade into: {why}; its directory and \
                 every directory above it must be owned by root and writable by root alone \
                 (one above it may be writable by others when sticky, as /tmp)",
                target.display()
            )
        })?;
        let mut temporary = OsString::from(".");
        temporary.push(name);
        temporary.push(format!(".upgrade-{}", std::process::id()));
        let mut placing = temporary.clone();
        placing.push(".placing");
        Ok(Staging {
            dir,
            target: target.to_path_buf(),
            name: name.to_os_string(),
            temporary,
            named: false,
            placing,
        })
    }

    /// The staged file, read-write, 0700 until placed: unnamed (`O_TMPFILE`), so that no path
    /// names it before it is placed; where the filesystem has no `O_TMPFILE` (or there is no
    /// `/proc` to name one through), created new under the staged name, not following a
    /// symlink (a leftover of an upgrade cut short by a kill is replaced).
    pub fn create(&mut self) -> io::Result<File> {
        if crate::sys::file::can_link_unnamed() {
            match self.dir.create_unnamed(0o700) {
                Ok(file) => return Ok(file),
                Err(error) if crate::sys::file::unnamed_unsupported(&error) => {}
                Err(error) => return Err(error),
            }
        }
        self.create_named()
    }

    fn create_named(&mut self) -> io::Result<File> {
        self.named = true;
        self.discard();
        self.dir.create_file(&self.temporary, 0o700)
    }

    /// Puts `binary` (the staged file, by its descriptor) at `--upgrade-path`: linked under a
    /// second name, so that the very file checked is placed whatever the staged name holds by
    /// then, and renamed over the path (a binary running from there keeps running: its file is
    /// replaced, not rewritten); a staged name is removed.
    ///
    /// Returns the file to execute: the placed name opened again (not following a symlink)
    /// when it is still the staged file (same device and inode), so that the process's
    /// `/proc/PID/exe` names `--upgrade-path`, as after envd's upgrade; an unnamed file's own
    /// descriptor would leave it reading `/dir/#1234 (deleted)`. Anything else there by then
    /// (only root can write in this directory) is not run: the staged descriptor is.
    pub fn place(&self, binary: File) -> io::Result<File> {
        let _ = self.dir.remove(&self.placing, false);
        self.dir.link_file(&binary, &self.placing)?;
        self.dir.rename(&self.placing, &self.dir, &self.name)?;
        self.discard();
        let staged = crate::sys::dir::fstat(binary.as_fd())?.id();
        let named = self.dir.open_file(&self.name, libc::O_RDONLY);
        match named {
            Ok(named) if crate::sys::dir::fstat(named.as_fd())?.id() == staged => Ok(named),
            _ => {
                crate::log::line(format_args!(
                    "upgrade: '{}' is no longer the file placed; the staged file runs",
                    self.target.display()
                ));
                Ok(binary)
            }
        }
    }

    /// Removes the staged name, if the file has one (a body cut short, a binary refused).
    pub fn discard(&self) {
        if self.named {
            let _ = self.dir.remove(&self.temporary, false);
        }
    }

    /// What a failure to write the staged file says: `cannot write the new binary beside
    /// '<--upgrade-path>': <error>`.
    pub fn cannot_write(&self, error: &io::Error) -> String {
        format!(
            "cannot write the new binary beside '{}': {error}",
            self.target.display()
        )
    }

    /// `--upgrade-path`.
    pub fn target(&self) -> &Path {
        &self.target
    }
}

/// `dir` opened component by component from `/`, each checked (see the module); the error says
/// which directory fails and why.
fn held(dir: &Path) -> Result<Dir, String> {
    let resolved = std::fs::canonicalize(dir)
        .map_err(|e| format!("cannot resolve '{}': {e}", dir.display()))?;
    let me = crate::sys::creds::euid();
    let opened = |what: &Path, e: io::Error| format!("cannot open '{}': {e}", what.display());
    let root = Path::new("/");
    let mut held = Dir::open(root).map_err(|e| opened(root, e))?;
    let mut walked = PathBuf::from("/");
    let names: Vec<&OsStr> = resolved
        .components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name),
            _ => None,
        })
        .collect();
    let mut stat = held.stat().map_err(|e| opened(root, e))?;
    for name in names {
        judge(&walked, &stat, false, me)?;
        walked.push(name);
        held = held.open_dir(name, false).map_err(|e| opened(&walked, e))?;
        stat = held.stat().map_err(|e| opened(&walked, e))?;
    }
    judge(&walked, &stat, true, me)?;
    Ok(held)
}

/// Whether the directory `path` (`stat`) may hold, or lie above (`last` false), the upgrade
/// directory of a daemon running as `me`.
fn judge(path: &Path, stat: &Stat, last: bool, me: u32) -> Result<(), String> {
    let shown = path.display();
    if stat.uid != 0 && stat.uid != me {
        return Err(format!("'{shown}' is owned by uid {}", stat.uid));
    }
    let sticky = stat.mode & libc::S_ISVTX != 0;
    let writers = match (stat.mode & 0o020 != 0, stat.mode & 0o002 != 0) {
        (false, false) => return Ok(()),
        _ if sticky && !last => return Ok(()),
        (true, false) => "its group",
        (false, true) => "others",
        (true, true) => "its group and others",
    };
    Err(format!(
        "'{shown}' (mode {:o}) is writable by {writers}",
        stat.mode & 0o7777
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir(uid: u32, mode: u32) -> Stat {
        Stat {
            mode: libc::S_IFDIR | mode,
            uid,
            gid: 0,
            size: 0,
            nlink: 2,
            dev: 1,
            ino: 2,
            mtime: 0,
            mtime_nsec: 0,
        }
    }

    fn verdict(stat: Stat, last: bool, me: u32) -> Result<(), String> {
        judge(Path::new("/a/b"), &stat, last, me)
    }

    #[test]
    fn only_root_or_the_daemon_may_own_and_write_the_way() {
        assert_eq!(verdict(dir(0, 0o755), true, 0), Ok(()));
        assert_eq!(verdict(dir(0, 0o700), false, 0), Ok(()));
        assert_eq!(
            verdict(dir(4242, 0o755), true, 0),
            Err("'/a/b' is owned by uid 4242".into())
        );
        // A daemon run as a user trusts its own directories (tests without root).
        assert_eq!(verdict(dir(1000, 0o755), true, 1000), Ok(()));
        assert_eq!(
            verdict(dir(0, 0o775), true, 0),
            Err("'/a/b' (mode 775) is writable by its group".into())
        );
        assert_eq!(
            verdict(dir(0, 0o757), false, 0),
            Err("'/a/b' (mode 757) is writable by others".into())
        );
        assert_eq!(
            verdict(dir(0, 0o777), false, 0),
            Err("'/a/b' (mode 777) is writable by its group and others".into())
        );
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// Writes `bytes` to a staged file, as the route does, and places it.
    fn stage(staging: &Staging, mut file: File, bytes: &[u8]) -> io::Result<()> {
        use std::io::Write;
        file.write_all(bytes)?;
        let binary = crate::sys::exec::reopen_read_only(&file)?;
        drop(file);
        staging.place(binary).map(drop)
    }

    #[test]
    fn the_file_written_is_placed_with_or_without_a_name_and_nothing_else_remains() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("envd.next");
        let mut staging = Staging::open(&target).unwrap();
        let file = staging.create().unwrap();
        assert_eq!(names_in(dir.path()), Vec::<String>::new(), "unnamed");
        stage(&staging, file, b"first").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"first");
        assert_eq!(names_in(dir.path()), ["envd.next"]);

        // Where there is no O_TMPFILE: a name while it is written, placed all the same, and
        // its name, not the file, is what a swap changes: the file written is placed.
        let mut staging = Staging::open(&target).unwrap();
        let file = staging.create_named().unwrap();
        let staged = format!(".envd.next.upgrade-{}", std::process::id());
        assert_eq!(names_in(dir.path()), [staged.as_str(), "envd.next"]);
        stage(&staging, file, b"second").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"second");
        assert_eq!(names_in(dir.path()), ["envd.next"]);
    }

    #[test]
    fn a_named_staged_file_replaced_meanwhile_is_not_placed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("envd.next");
        let mut staging = Staging::open(&target).unwrap();
        let file = staging.create_named().unwrap();
        let staged = dir
            .path()
            .join(format!(".envd.next.upgrade-{}", std::process::id()));
        std::fs::write(dir.path().join("planted"), b"planted").unwrap();
        std::fs::rename(dir.path().join("planted"), &staged).unwrap();
        // The file written has no name left to link from: refused, nothing put in place.
        let error = stage(&staging, file, b"written").unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::ENOENT));
        assert!(!target.exists());
        staging.discard();
        assert_eq!(names_in(dir.path()), Vec::<String>::new());
    }

    #[test]
    fn a_directory_others_can_write_is_refused_before_anything_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o757)).unwrap();
        let target = open.join("envd.next");
        let Err(refused) = Staging::open(&target) else {
            panic!("accepted");
        };
        let shown = std::fs::canonicalize(&open).unwrap();
        assert!(
            refused.contains(&format!(
                "is not safe to upgrade into: '{}' (mode 757) is writable by others",
                shown.display()
            )),
            "{refused}"
        );
        assert_eq!(names_in(&open), Vec::<String>::new());
        assert!(Staging::open(Path::new("/"))
            .unwrap_err()
            .contains("names no file"));
    }

    #[test]
    fn a_sticky_directory_may_lie_above_but_not_hold_the_binary() {
        assert_eq!(verdict(dir(0, 0o1777), false, 0), Ok(()));
        assert_eq!(
            verdict(dir(0, 0o1777), true, 0),
            Err("'/a/b' (mode 1777) is writable by its group and others".into())
        );
        // Sticky does not make another owner's directory safe.
        assert_eq!(
            verdict(dir(4242, 0o1777), false, 0),
            Err("'/a/b' is owned by uid 4242".into())
        );
    }
}
