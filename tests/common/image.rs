//! An ext4 filesystem the test makes in a temp dir and loop-mounts (root only): thawed,
//! unmounted and removed when dropped, even when the test fails. Tests that freeze a filesystem
//! or look at what reached a device use it, never the machine's own filesystems.

use std::path::PathBuf;
use std::process::Command;

use super::root_or_skip;

/// An ext4 filesystem in a file, loop-mounted at `mount`.
pub struct Ext4Image {
    pub mount: PathBuf,
    /// The image file itself: what reached the device is in it.
    pub image: PathBuf,
    _dir: tempfile::TempDir,
}

impl Ext4Image {
    /// `None` (skipped) without root, unless `SANDBOXD_REQUIRE_ROOT_TESTS=1`.
    pub fn make() -> Option<Ext4Image> {
        if !root_or_skip("mounting a loop image needs root") {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("fs.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(32 << 20)
            .unwrap();
        let made = Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(&image)
            .status()
            .expect("mkfs.ext4 (e2fsprogs) on the test machine");
        assert!(made.success(), "mkfs.ext4");
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).unwrap();
        let mounted = Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mount)
            .status()
            .unwrap();
        assert!(mounted.success(), "mount -o loop");
        Some(Ext4Image {
            mount,
            image,
            _dir: dir,
        })
    }
}

impl Drop for Ext4Image {
    fn drop(&mut self) {
        // Thawed first (an error when it is not frozen, which is the usual case).
        let _ = Command::new("fsfreeze")
            .arg("-u")
            .arg(&self.mount)
            .stderr(std::process::Stdio::null())
            .status();
        let ok = Command::new("umount")
            .arg(&self.mount)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        }
    }
}
