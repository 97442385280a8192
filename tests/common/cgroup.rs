//! A cgroup v2 directory made for one test (`sandboxd-test-<pid>-<n>` at the top of the
//! machine's cgroup v2 mount) and removed with everything in it when dropped, even when the
//! test fails: its groups thawed, its processes killed (`cgroup.kill`), its directories
//! removed bottom-up. Nothing else of the machine's cgroups is touched.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::root_or_skip;

pub struct TestCgroup {
    pub path: PathBuf,
    /// The mount point of cgroup v2.
    pub mount: PathBuf,
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// The machine's cgroup v2 mount point, from `/proc/self/mountinfo`.
fn cgroup2_mount() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mount = left.split_whitespace().nth(4)?;
        (right.split_whitespace().next() == Some("cgroup2")).then(|| PathBuf::from(mount))
    })
}

impl TestCgroup {
    /// A fresh directory, or `None` (the test is skipped) without root or cgroup v2, unless
    /// `SANDBOXD_REQUIRE_ROOT_TESTS=1`, which fails the test instead.
    pub fn make() -> Option<TestCgroup> {
        if !root_or_skip("making a cgroup needs root") {
            return None;
        }
        let made = cgroup2_mount().and_then(|mount| {
            let name = format!(
                "sandboxd-test-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::SeqCst)
            );
            let path = mount.join(name);
            std::fs::create_dir(&path).ok()?;
            Some(TestCgroup { path, mount })
        });
        if made.is_none() {
            // The same rule as root: a machine that should run these must have cgroup v2.
            root_or_skip_cgroup();
        }
        made
    }

    /// The cgroup path of `dir` as `/proc/<pid>/cgroup` shows it (`0::/...`).
    pub fn relative(&self, dir: &Path) -> String {
        format!("/{}", dir.strip_prefix(&self.mount).unwrap().display())
    }

    pub fn child(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

fn root_or_skip_cgroup() {
    if std::env::var_os("SANDBOXD_REQUIRE_ROOT_TESTS").is_some_and(|v| v == "1") {
        panic!("no writable cgroup v2 mount, and SANDBOXD_REQUIRE_ROOT_TESTS=1 requires it");
    }
    eprintln!("skipped: no writable cgroup v2 mount");
}

/// `pid`'s cgroup v2 path (`/proc/<pid>/cgroup`'s `0::` line).
pub fn cgroup_of(pid: u32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_else(|| panic!("no cgroup v2 line: {text}"))
        .to_string()
}

/// Every directory below `dir`, deepest first.
fn bottom_up(dir: &Path) -> Vec<PathBuf> {
    let mut all = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < all.len() {
        if let Ok(entries) = std::fs::read_dir(&all[i]) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    all.push(entry.path());
                }
            }
        }
        i += 1;
    }
    all.reverse();
    all
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let dirs = bottom_up(&self.path);
        for dir in &dirs {
            let _ = std::fs::write(dir.join("cgroup.freeze"), "0");
        }
        let _ = std::fs::write(self.path.join("cgroup.kill"), "1");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let events = std::fs::read_to_string(self.path.join("cgroup.events"));
            if events.map_or(true, |e| e.contains("populated 0")) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for dir in &dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}
