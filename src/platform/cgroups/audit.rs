//! The resume audit of a `hierarchy` freeze (envd's `AuditFrozenState`, `hierarchy.go`): at the
//! `/init` that thaws it, before anything is thawed, every cgroup below the `--process-cgroups`
//! directory is classified against what the sweep should have done, and the counts ride the
//! answer as `X-Envd-Freeze-Audit`, which E2B's orchestrator reads for its freeze metrics.
//!
//! - **frozen**: stopped (`cgroup.events` says `frozen 1`, whether its own freeze or an
//!   ancestor's: being stopped is the question, not who asked);
//! - **escaped**: running although the sweep's business (neither in the descend set nor
//!   allowlisted, `hierarchy`'s `Liveness`): made after the sweep, or past its bound;
//! - **violations**: stopped although the resume needs it (an allowlist entry or below: systemd,
//!   journald, the portmapper, `socats`; the daemon's chain; an ancestor of an entry);
//! - **visited**, the directory itself included, at most [`THAW_MAX_CGROUPS`]; **truncated**
//!   when the bound stopped the walk (every count is then a floor).
//!
//! Only a `hierarchy` sweep made by this process is audited: a `legacy` sweep freezes two
//! groups and would score the rest as escapes, and an image that took a freeze over through a
//! live upgrade cannot know what its predecessor swept (envd's `Applicable`). The names of the
//! offenders are the guest's: they go to the log, escaped, never into the header.

use std::path::{Path, PathBuf};

use super::freeze::THAW_MAX_CGROUPS;
use super::hierarchy::{walk, Visit};
use super::{events, Groups};

/// Offenders named in the log, per kind: the counts are the measure.
const SAMPLE: usize = 8;

/// envd's `freezeAudit`, with its sample of offenders for the log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Audit {
    pub visited: usize,
    pub frozen: usize,
    pub escaped: usize,
    pub violations: usize,
    pub truncated: bool,
    pub violation_paths: Vec<PathBuf>,
    pub escaped_paths: Vec<PathBuf>,
}

impl Audit {
    /// The header's value, byte for byte envd's (every field present, zeros included).
    pub fn header(&self) -> String {
        format!(
            "{{\"visited\":{},\"frozen\":{},\"escaped\":{},\"violations\":{},\"truncated\":{}}}",
            self.visited, self.frozen, self.escaped, self.violations, self.truncated
        )
    }
}

/// Classifies every cgroup below `groups.root` (see the module documentation).
pub fn audit(groups: &Groups) -> Audit {
    audit_with(groups, THAW_MAX_CGROUPS, &mut |dir| {
        std::fs::read_to_string(dir.join("cgroup.events"))
            .ok()
            .map(|text| events::frozen(&text))
    })
}

/// [`audit`] visiting at most `max` cgroups, with `frozen_at` reading whether a cgroup is
/// stopped (`None`: it vanished).
fn audit_with(
    groups: &Groups,
    max: usize,
    frozen_at: &mut dyn FnMut(&Path) -> Option<bool>,
) -> Audit {
    let liveness = groups.liveness();
    // The directory itself is visited, as envd's root: never frozen, never a candidate.
    let mut result = Audit {
        visited: 1,
        ..Audit::default()
    };
    let (_, visited, truncated) = walk(&groups.root, max.saturating_sub(1), &mut |dir| {
        let Some(frozen) = frozen_at(dir) else {
            // Removed mid-walk: a race, not a finding.
            return Visit::Descend;
        };
        let protected = liveness.protected(dir);
        match (frozen, protected) {
            (true, true) => {
                result.violations += 1;
                sample(&mut result.violation_paths, &groups.root, dir);
            }
            (true, false) => result.frozen += 1,
            (false, false) => {
                result.escaped += 1;
                sample(&mut result.escaped_paths, &groups.root, dir);
            }
            (false, true) => {}
        }
        Visit::Descend
    });
    result.visited += visited;
    result.truncated = truncated;
    result
}

fn sample(into: &mut Vec<PathBuf>, root: &Path, dir: &Path) {
    if into.len() < SAMPLE {
        into.push(dir.strip_prefix(root).unwrap_or(dir).to_path_buf());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::cgroups::Group;

    fn groups(root: &Path, own: Option<&str>) -> Groups {
        Groups::for_test(
            root.to_path_buf(),
            own.map(|own| root.join(own)),
            &[(Group::Socats, root.join("socats"))],
        )
    }

    #[test]
    fn the_header_has_envds_bytes_with_zeros_present() {
        let audit = Audit {
            visited: 12,
            frozen: 5,
            escaped: 1,
            truncated: true,
            ..Audit::default()
        };
        assert_eq!(
            audit.header(),
            r#"{"visited":12,"frozen":5,"escaped":1,"violations":0,"truncated":true}"#
        );
        assert_eq!(
            Audit::default().header(),
            r#"{"visited":0,"frozen":0,"escaped":0,"violations":0,"truncated":false}"#
        );
    }

    #[test]
    fn each_cgroup_is_frozen_escaped_or_a_violation_by_where_it_is() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for dir in [
            "user/job",
            "ptys",
            "late",
            "socats/inner",
            "daemon/own",
            "daemon/other",
        ] {
            std::fs::create_dir_all(r.join(dir)).unwrap();
        }
        let stopped = ["user", "user/job", "ptys", "socats/inner", "daemon/other"];
        let mut frozen_at = |dir: &Path| {
            let rel = dir.strip_prefix(r).unwrap().to_str().unwrap().to_string();
            Some(stopped.contains(&rel.as_str()))
        };
        let groups = groups(r, Some("daemon/own"));
        let audit = audit_with(&groups, THAW_MAX_CGROUPS, &mut frozen_at);
        // root + user, user/job, ptys, late, socats, socats/inner, daemon, daemon/own,
        // daemon/other.
        assert_eq!(audit.visited, 10);
        assert_eq!(audit.frozen, 4, "{audit:?}");
        assert_eq!(audit.escaped, 1, "{audit:?}");
        assert_eq!(audit.escaped_paths, [PathBuf::from("late")]);
        assert_eq!(audit.violations, 1, "{audit:?}");
        assert_eq!(audit.violation_paths, [PathBuf::from("socats/inner")]);
        assert!(!audit.truncated);
    }

    /// A systemd guest under E2B's unit: the allowlist and the ancestors the sweep looks
    /// inside are protected, by envd's rules.
    #[test]
    fn in_a_systemd_guest_the_liveness_allowlist_is_protected_and_the_rest_judged() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for dir in [
            "init.scope",
            "system.slice/envd.service",
            "system.slice/systemd-journald.service",
            "system.slice/rpcbind.socket/child",
            "system.slice/cron.service",
            "system.slice/late.service",
            "user.slice/user-1000.slice",
            "user",
            "ptys",
            "socats",
        ] {
            std::fs::create_dir_all(r.join(dir)).unwrap();
        }
        let stopped = [
            "init.scope",
            "system.slice/rpcbind.socket/child",
            "system.slice/cron.service",
            "user.slice",
            "user.slice/user-1000.slice",
            "user",
            "ptys",
        ];
        let mut frozen_at = |dir: &Path| {
            let rel = dir.strip_prefix(r).unwrap().to_str().unwrap().to_string();
            Some(stopped.contains(&rel.as_str()))
        };
        let groups = groups(r, Some("system.slice/envd.service"));
        let audit = audit_with(&groups, THAW_MAX_CGROUPS, &mut frozen_at);
        assert_eq!(audit.visited, 14, "{audit:?}");
        assert_eq!(audit.frozen, 5, "{audit:?}");
        assert_eq!(
            audit.escaped_paths,
            [PathBuf::from("system.slice/late.service")]
        );
        let mut violations = audit.violation_paths.clone();
        violations.sort();
        assert_eq!(
            violations,
            [
                PathBuf::from("init.scope"),
                PathBuf::from("system.slice/rpcbind.socket/child")
            ]
        );
        assert_eq!((audit.escaped, audit.violations), (1, 2));
    }

    #[test]
    fn a_vanished_cgroup_is_skipped_and_the_bound_truncates() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("gone")).unwrap();
        let audit = audit_with(&groups(r, None), THAW_MAX_CGROUPS, &mut |_| None);
        assert_eq!((audit.visited, audit.escaped, audit.frozen), (2, 0, 0));
        assert!(!audit.truncated);
        for i in 0..SAMPLE + 4 {
            std::fs::create_dir(r.join(format!("g{i}"))).unwrap();
        }
        let audit = audit_with(&groups(r, None), SAMPLE + 2, &mut |_| Some(false));
        assert_eq!(audit.visited, SAMPLE + 2);
        assert!(audit.truncated);
        assert_eq!(audit.escaped, SAMPLE + 1);
        assert_eq!(audit.escaped_paths.len(), SAMPLE);
    }
}
