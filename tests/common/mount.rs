//! Mounts a test makes (tmpfs, ramfs, bind), taken off when dropped.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A mount made by a test, unmounted when dropped, even when the test fails.
pub struct Mount(pub PathBuf);

impl Mount {
    pub fn tmpfs(at: &Path, size: &str) -> Mount {
        fs::create_dir_all(at).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .unwrap();
        assert!(status.success(), "mount tmpfs on {}", at.display());
        Mount(at.to_path_buf())
    }

    /// `from` mounted again at `at` (`mount --bind`).
    pub fn bind(from: &Path, at: &Path) -> Mount {
        fs::create_dir_all(at).unwrap();
        let status = Command::new("mount")
            .arg("--bind")
            .arg(from)
            .arg(at)
            .status()
            .unwrap();
        assert!(status.success(), "mount --bind on {}", at.display());
        Mount(at.to_path_buf())
    }

    pub fn ramfs(at: &Path) -> Mount {
        fs::create_dir_all(at).unwrap();
        let status = Command::new("mount")
            .args(["-t", "ramfs", "ramfs"])
            .arg(at)
            .status()
            .unwrap();
        assert!(status.success(), "mount ramfs on {}", at.display());
        Mount(at.to_path_buf())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}
