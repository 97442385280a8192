//! The cgroup tree below the `--process-cgroups` directory as the freezes see it (envd's
//! `hierarchy.go` and `sweepHierarchy`): which cgroups a sweep must leave running, which it looks
//! inside instead of freezing, and the bounded breadth-first walk the sweep, the thaw and the
//! resume audit share.
//!
//! - **The liveness allowlist** ([`LIVENESS_ALLOWLIST`], envd's `livenessAllowlist`), relative to
//!   the directory: systemd (`init.scope`: the resume's volume mount asks it to start
//!   rpc-statd), journald (the daemon's log would block on a full socket), the portmapper and
//!   rpc-statd (the NFS mount needs both), and `socats`. An entry and everything below it is
//!   never frozen.
//! - **The descend set** (envd's `DescendSet`): the directory, every cgroup from it down to the
//!   daemon's own (freezing one freezes the daemon), and every ancestor of an allowlist entry
//!   (freezing `system.slice` would stop journald below it as surely as freezing journald).
//!   The sweep looks inside these, and freezes every other child it finds there: one write per
//!   subtree, since a freeze stops everything below the cgroup written.
//!
//! What it does not own: the writes, the wait and the thaw (`freeze`), the audit's counts
//! (`audit`).

use std::path::{Path, PathBuf};

/// envd's `livenessAllowlist`, paths relative to the directory.
pub const LIVENESS_ALLOWLIST: [&str; 6] = [
    "init.scope",
    "system.slice/systemd-journald.service",
    "system.slice/rpcbind.service",
    "system.slice/rpcbind.socket",
    "system.slice/rpc-statd.service",
    "socats",
];

/// What the freezes must keep running below one directory.
pub struct Liveness {
    root: PathBuf,
    /// The descend set (see the module documentation); a few paths.
    descend: Vec<PathBuf>,
}

impl Liveness {
    /// The liveness of the tree at `root` for a daemon whose own cgroup is `own` (one outside
    /// `root` puts only `root` on its chain, as envd's `AncestorChain`).
    pub fn new(root: &Path, own: Option<&Path>) -> Liveness {
        let mut descend = vec![root.to_path_buf()];
        let mut add_chain = |to: &Path| {
            let Ok(rel) = to.strip_prefix(root) else {
                return;
            };
            let mut dir = root.to_path_buf();
            for part in rel.components() {
                dir.push(part);
                if !descend.contains(&dir) {
                    descend.push(dir.clone());
                }
            }
        };
        if let Some(own) = own {
            add_chain(own);
        }
        for entry in LIVENESS_ALLOWLIST {
            // The entry's ancestors, not the entry: it is skipped, not looked inside.
            if let Some(parent) = Path::new(entry).parent() {
                add_chain(&root.join(parent));
            }
        }
        Liveness {
            root: root.to_path_buf(),
            descend,
        }
    }

    /// The sweep looks inside `dir` instead of freezing it.
    pub fn descends_into(&self, dir: &Path) -> bool {
        self.descend.iter().any(|d| d == dir)
    }

    /// `dir` is an allowlist entry or below one.
    pub fn allowlisted(&self, dir: &Path) -> bool {
        dir.strip_prefix(&self.root)
            .is_ok_and(|rel| LIVENESS_ALLOWLIST.iter().any(|e| rel.starts_with(e)))
    }

    /// Found frozen, `dir` is a violation; found running, no escape.
    pub fn protected(&self, dir: &Path) -> bool {
        self.descends_into(dir) || self.allowlisted(dir)
    }
}

/// A hierarchy sweep's plan: the cgroups to freeze and the walk's counts.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Sweep {
    pub targets: Vec<PathBuf>,
    pub visited: usize,
    pub allowlisted: usize,
    pub truncated: bool,
}

/// The cgroups a `hierarchy` sweep freezes below the root of `liveness` (at most `max`
/// visited), less `frozen_first`: the groups the caller freezes before the walk (envd's static
/// `user` and `ptys`, which a bound a guest can aim at must not push out of the sweep).
pub fn sweep(liveness: &Liveness, frozen_first: &[PathBuf], max: usize) -> Sweep {
    let mut allowlisted = 0;
    let (targets, visited, truncated) = walk(&liveness.root, max, &mut |dir| {
        if frozen_first.iter().any(|d| d == dir) {
            Visit::Skip
        } else if liveness.descends_into(dir) {
            Visit::Descend
        } else if liveness.allowlisted(dir) {
            allowlisted += 1;
            Visit::Skip
        } else {
            Visit::Pick
        }
    });
    Sweep {
        targets,
        visited,
        allowlisted,
        truncated,
    }
}

/// What a walk does with a cgroup it visits.
pub enum Visit {
    /// Neither: leave it and what is below.
    Skip,
    /// Look below it.
    Descend,
    /// Take it, not what is below.
    Pick,
    /// Take it and look below.
    PickAndDescend,
}

/// The cgroups below `root` that `visit` picks, breadth first, at most `max` visited; how many
/// were, and whether the bound stopped the walk.
pub fn walk(
    root: &Path,
    max: usize,
    visit: &mut dyn FnMut(&Path) -> Visit,
) -> (Vec<PathBuf>, usize, bool) {
    let mut picked = Vec::new();
    let mut queue = vec![root.to_path_buf()];
    let (mut next, mut visited) = (0, 0);
    while let Some(dir) = queue.get(next).cloned() {
        next += 1;
        for child in subdirectories(&dir) {
            if visited >= max {
                return (picked, visited, true);
            }
            visited += 1;
            match visit(&child) {
                Visit::Skip => {}
                Visit::Descend => queue.push(child),
                Visit::Pick => picked.push(child),
                Visit::PickAndDescend => {
                    picked.push(child.clone());
                    queue.push(child);
                }
            }
        }
    }
    (picked, visited, false)
}

/// The child cgroups of `dir`, in the directory's order (cgroupfs has no symlinks; a
/// vanished one lists nothing).
fn subdirectories(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A systemd guest's tree as E2B's template has it, with the daemon's groups at the top.
    const GUEST: [&str; 14] = [
        "init.scope",
        "system.slice/envd.service",
        "system.slice/systemd-journald.service",
        "system.slice/rpcbind.service",
        "system.slice/rpcbind.socket",
        "system.slice/rpc-statd.service",
        "system.slice/cron.service",
        "system.slice/docker.service/inner",
        "user.slice/user-1000.slice/session-1.scope",
        "user/job",
        "ptys",
        "socats/one",
        "docker/abc",
        "dev-hugepages.mount",
    ];

    fn tree(dirs: &[&str]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        for dir in dirs {
            std::fs::create_dir_all(root.path().join(dir)).unwrap();
        }
        root
    }

    fn relative(root: &Path, paths: &[PathBuf]) -> Vec<String> {
        let mut rel: Vec<String> = paths
            .iter()
            .map(|p| p.strip_prefix(root).unwrap().display().to_string())
            .collect();
        rel.sort();
        rel
    }

    fn statics(root: &Path) -> Vec<PathBuf> {
        vec![root.join("user"), root.join("ptys")]
    }

    #[test]
    fn under_e2bs_unit_the_sweep_freezes_all_but_the_allowlist_and_the_daemons_chain() {
        let dir = tree(&GUEST);
        let r = dir.path();
        let liveness = Liveness::new(r, Some(&r.join("system.slice/envd.service")));
        let sweep = sweep(&liveness, &statics(r), 512);
        assert_eq!(
            relative(r, &sweep.targets),
            [
                "dev-hugepages.mount",
                "docker",
                "system.slice/cron.service",
                "system.slice/docker.service",
                "user.slice",
            ]
        );
        // init.scope, socats and the four of system.slice; never envd.service.
        assert_eq!(sweep.allowlisted, 6);
        // 8 at the top, 7 in system.slice.
        assert_eq!(sweep.visited, 15);
        assert!(!sweep.truncated);
    }

    /// envd's `DescendSet` example: a daemon in the root cgroup has only the root on its chain,
    /// and `system.slice` is still looked inside, not frozen over journald.
    #[test]
    fn a_daemon_in_the_root_still_descends_into_the_allowlists_ancestors() {
        let dir = tree(&GUEST);
        let r = dir.path();
        for own in [Some(r), Some(Path::new("/elsewhere")), None] {
            let liveness = Liveness::new(r, own);
            let sweep = sweep(&liveness, &statics(r), 512);
            let targets = relative(r, &sweep.targets);
            assert!(
                targets.contains(&"system.slice/envd.service".to_string()),
                "{targets:?}"
            );
            assert!(!targets.iter().any(|t| t == "system.slice"), "{targets:?}");
            assert!(!targets.iter().any(|t| t.contains("journald")));
            assert_eq!(sweep.allowlisted, 6);
        }
    }

    #[test]
    fn the_allowlist_covers_its_subtrees_by_whole_names_and_the_chain_is_descended() {
        let r = Path::new("/sys/fs/cgroup");
        let liveness = Liveness::new(r, Some(&r.join("system.slice/envd.service")));
        for dir in [
            "init.scope",
            "init.scope/child",
            "socats/x/y",
            "system.slice/rpcbind.socket",
        ] {
            assert!(liveness.allowlisted(&r.join(dir)), "{dir}");
            assert!(liveness.protected(&r.join(dir)), "{dir}");
        }
        for dir in [
            "socats2",
            "init",
            "system.slice",
            "system.slice/cron.service",
        ] {
            assert!(!liveness.allowlisted(&r.join(dir)), "{dir}");
        }
        for dir in ["", "system.slice", "system.slice/envd.service"] {
            assert!(liveness.descends_into(&r.join(dir)), "{dir:?}");
        }
        assert!(!liveness.descends_into(&r.join("system.slice/envd.service/x")));
        assert!(!liveness.protected(&r.join("user.slice")));
        assert!(!liveness.allowlisted(Path::new("/elsewhere/init.scope")));
    }

    #[test]
    fn the_bound_truncates_the_sweep_but_never_the_groups_frozen_first() {
        let dir = tree(&GUEST);
        let r = dir.path();
        let liveness = Liveness::new(r, Some(&r.join("system.slice/envd.service")));
        let sweep = sweep(&liveness, &statics(r), 3);
        assert_eq!(sweep.visited, 3);
        assert!(sweep.truncated);
        assert!(sweep.targets.len() <= 3);
        let all = super::sweep(&liveness, &statics(r), 512);
        assert!(sweep.targets.iter().all(|t| all.targets.contains(t)));
        assert!(!all.targets.iter().any(|t| statics(r).contains(t)));
    }
}
