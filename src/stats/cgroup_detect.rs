//! Which cgroup directories hold this process's limits: `/proc/self/cgroup` + `/proc/self/mountinfo`
//! -> a directory per hierarchy (v2, v1 `memory`, v1 `cpu`, v1 `cpuacct`).
//!
//! Owns the two parsers and the resolution. A hierarchy's directory is its mount point joined with
//! the process's cgroup path relative to the mount's root. Mount points are used only when they
//! lie under the cgroup root and exist; otherwise (a fixture root, no mountinfo) the conventional
//! layout under the cgroup root serves: v2 at the root or at `unified/` (hybrid), v1 at
//! `memory/`, `cpu,cpuacct/`, `cpu/`, `cpuacct/`. When the cgroup path does not exist under the
//! mount (cgroup namespaces, fixtures), the mount itself is the process's cgroup. Opening the
//! interface files is `sampler`'s job.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Component, Path, PathBuf};

/// How far up from the process's cgroup limits are looked for.
const MAX_DEPTH: usize = 32;

/// One line of `/proc/self/cgroup`: `hierarchy-ID:controller-list:cgroup-path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub hierarchy_id: u32,
    /// Empty for cgroup v2 (`0::/path`).
    pub controllers: Vec<String>,
    pub path: String,
}

impl Membership {
    fn is_v2(&self) -> bool {
        self.hierarchy_id == 0 && self.controllers.is_empty()
    }
}

/// Parses `/proc/self/cgroup`, skipping malformed lines.
pub fn parse_self_cgroup(text: &str) -> Vec<Membership> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let hierarchy_id = parts.next()?.parse().ok()?;
            let controllers = parts.next()?;
            let path = parts.next()?;
            if !path.starts_with('/') {
                return None;
            }
            Some(Membership {
                hierarchy_id,
                controllers: controllers
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(str::to_owned)
                    .collect(),
                path: path.to_owned(),
            })
        })
        .collect()
}

/// Which cgroup filesystem a mount is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountKind {
    /// `cgroup2`.
    V2,
    /// `cgroup`, with its super options (`rw,cpu,cpuacct`, `rw,name=systemd`, ...).
    V1 { options: Vec<String> },
}

/// A cgroup mount from `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    /// The cgroup shown at the mount point (field 4), as a cgroup path.
    pub root: String,
    pub mount_point: PathBuf,
    pub kind: MountKind,
}

/// Parses the cgroup and cgroup2 mounts of `/proc/self/mountinfo`, undoing its octal escapes
/// (`\040` for a space); other filesystems and malformed lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let root = fields.nth(3)?;
            let mount_point = fields.next()?;
            // Optional fields, then the separator.
            fields.find(|f| *f == "-")?;
            let fstype = fields.next()?;
            let _source = fields.next()?;
            let super_options = fields.next()?;
            let kind = match fstype {
                "cgroup2" => MountKind::V2,
                "cgroup" => MountKind::V1 {
                    options: super_options.split(',').map(str::to_owned).collect(),
                },
                _ => return None,
            };
            Some(CgroupMount {
                root: String::from_utf8_lossy(&unescape(root)).into_owned(),
                mount_point: PathBuf::from(OsString::from_vec(unescape(mount_point))),
                kind,
            })
        })
        .collect()
}

/// Undoes mountinfo's `\ooo` escapes.
pub(crate) fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d[0] <= b'3' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') << 6 | (d[1] - b'0') << 3 | (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// A process's cgroup directory in one hierarchy, and the directory the hierarchy is mounted at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupDir {
    pub mount: PathBuf,
    /// `mount` itself or a directory below it.
    pub dir: PathBuf,
}

impl CgroupDir {
    /// `dir`, its parent, ... up to and including `mount`: where limits that apply may be set.
    pub fn leaf_to_mount(&self) -> impl Iterator<Item = &Path> {
        self.dir
            .ancestors()
            .take_while(|p| p.starts_with(&self.mount))
            .take(MAX_DEPTH)
    }
}

/// The process's cgroup directories: any may be absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layout {
    pub v2: Option<CgroupDir>,
    pub memory_v1: Option<CgroupDir>,
    pub cpu_v1: Option<CgroupDir>,
    pub cpuacct_v1: Option<CgroupDir>,
}

/// Resolves the layout from the texts of `/proc/self/cgroup` and `/proc/self/mountinfo` (`None`
/// when unreadable) under `cgroup_root`. `exists` is `Path::exists` outside tests. Without
/// `/proc/self/cgroup` every hierarchy found under the root is taken, at its top.
pub fn detect(
    self_cgroup: Option<&str>,
    mountinfo: Option<&str>,
    cgroup_root: &Path,
    exists: impl Fn(&Path) -> bool,
) -> Layout {
    let memberships = self_cgroup.map(parse_self_cgroup);
    let mounts = mountinfo.map(parse_mountinfo).unwrap_or_default();
    let ctx = Ctx {
        memberships: memberships.as_deref(),
        mounts: &mounts,
        cgroup_root,
        exists: &exists,
    };
    Layout {
        v2: ctx.find(Hierarchy::V2),
        memory_v1: ctx.find(Hierarchy::V1("memory")),
        cpu_v1: ctx.find(Hierarchy::V1("cpu")),
        cpuacct_v1: ctx.find(Hierarchy::V1("cpuacct")),
    }
}

#[derive(Clone, Copy)]
enum Hierarchy {
    V2,
    V1(&'static str),
}

struct Ctx<'a> {
    memberships: Option<&'a [Membership]>,
    mounts: &'a [CgroupMount],
    cgroup_root: &'a Path,
    exists: &'a dyn Fn(&Path) -> bool,
}

impl Ctx<'_> {
    fn find(&self, h: Hierarchy) -> Option<CgroupDir> {
        let membership = match self.memberships {
            Some(all) => Some(all.iter().find(|m| match h {
                Hierarchy::V2 => m.is_v2(),
                Hierarchy::V1(c) => m.controllers.iter().any(|mc| mc == c),
            })?),
            None => None,
        };
        let path = membership.map_or("/", |m| m.path.as_str());
        let (mount, mount_root) = self
            .mounted(h)
            .or_else(|| self.conventional(h, membership))?;
        let dir = self.locate(&mount, mount_root, path);
        Some(CgroupDir { mount, dir })
    }

    /// The first mount of the hierarchy that lies under the cgroup root and exists.
    fn mounted(&self, h: Hierarchy) -> Option<(PathBuf, &str)> {
        self.mounts
            .iter()
            .find(|m| {
                let kind_matches = match (&m.kind, h) {
                    (MountKind::V2, Hierarchy::V2) => true,
                    (MountKind::V1 { options }, Hierarchy::V1(c)) => options.iter().any(|o| o == c),
                    _ => false,
                };
                kind_matches
                    && m.mount_point.starts_with(self.cgroup_root)
                    && (self.exists)(&m.mount_point)
            })
            .map(|m| (m.mount_point.clone(), m.root.as_str()))
    }

    /// The conventional place of the hierarchy under the cgroup root, mounted at its root `/`.
    fn conventional(
        &self,
        h: Hierarchy,
        membership: Option<&Membership>,
    ) -> Option<(PathBuf, &'static str)> {
        let root = self.cgroup_root;
        let found = match h {
            Hierarchy::V2 => [root.to_path_buf(), root.join("unified")]
                .into_iter()
                .find(|d| (self.exists)(&d.join("cgroup.controllers"))),
            Hierarchy::V1(c) => {
                let joined = membership.map(|m| m.controllers.join(","));
                let pairs: &[&str] = match c {
                    "cpu" | "cpuacct" => &["cpu,cpuacct", "cpuacct,cpu"],
                    _ => &[],
                };
                let found = joined
                    .iter()
                    .map(String::as_str)
                    .chain([c])
                    .chain(pairs.iter().copied())
                    .map(|name| root.join(name))
                    .find(|d| (self.exists)(d));
                found
            }
        };
        found.map(|d| (d, "/"))
    }

    /// `mount` joined with `path` relative to the mount's root, if that exists; else `mount`.
    fn locate(&self, mount: &Path, mount_root: &str, path: &str) -> PathBuf {
        let Ok(rel) = Path::new(path).strip_prefix(mount_root) else {
            return mount.to_path_buf();
        };
        // `..` appears for cgroups outside a cgroup namespace: never climb out of the mount.
        if rel.as_os_str().is_empty()
            || !rel.components().all(|c| matches!(c, Component::Normal(_)))
        {
            return mount.to_path_buf();
        }
        let dir = mount.join(rel);
        if (self.exists)(&dir) {
            dir
        } else {
            mount.to_path_buf()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// This machine's /proc/self/cgroup: hybrid, memory in a v1 child cgroup.
    const HYBRID_CGROUP: &str = "\
9:name=systemd:/
8:pids:/
7:blkio:/
6:freezer:/
5:devices:/
4:memory:/process_api/a3d8a0f5effe47f734ac53c3861d32b5
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
";

    /// This machine's /proc/self/mountinfo.
    const HYBRID_MOUNTINFO: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
23 27 0:22 / /sys rw,relatime - sysfs sysfs rw
24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,size=12334460k,nr_inodes=3083615,mode=755
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard,resv_strict,resuid=65534,resgid=65534
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    /// A systemd host with cgroup v2 only (Linux 6.x): a service in a slice.
    const V2_CGROUP: &str = "0::/system.slice/sandbox.service\n";
    const V2_MOUNTINFO: &str = "\
24 30 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    /// Docker on cgroup v1 without a cgroup namespace: cpu and cpuacct co-mounted, the
    /// container's cgroup bind-mounted as the mount's root.
    const DOCKER_V1_CGROUP: &str = "\
12:memory:/docker/4f1c
4:cpu,cpuacct:/docker/4f1c
1:name=systemd:/docker/4f1c
";
    const DOCKER_V1_MOUNTINFO: &str = "\
700 699 0:63 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,mode=755
705 700 0:30 /docker/4f1c /sys/fs/cgroup/cpu,cpuacct ro,nosuid,nodev,noexec,relatime master:13 - cgroup cgroup rw,cpu,cpuacct
710 700 0:35 /docker/4f1c /sys/fs/cgroup/memory ro,nosuid,nodev,noexec,relatime master:18 - cgroup cgroup rw,memory
";

    fn fs(paths: &[&str]) -> impl Fn(&Path) -> bool {
        let set: HashSet<PathBuf> = paths.iter().map(PathBuf::from).collect();
        move |p: &Path| set.contains(p)
    }

    fn dir(mount: &str, dir: &str) -> Option<CgroupDir> {
        Some(CgroupDir {
            mount: mount.into(),
            dir: dir.into(),
        })
    }

    #[test]
    fn self_cgroup_real() {
        let m = parse_self_cgroup(HYBRID_CGROUP);
        assert_eq!(m.len(), 10);
        assert_eq!(
            m[5],
            Membership {
                hierarchy_id: 4,
                controllers: vec!["memory".into()],
                path: "/process_api/a3d8a0f5effe47f734ac53c3861d32b5".into()
            }
        );
        assert!(m[9].is_v2() && m[9].path == "/");
        assert_eq!(m[0].controllers, vec!["name=systemd".to_string()]);
        let docker = parse_self_cgroup(DOCKER_V1_CGROUP);
        assert_eq!(
            docker[1].controllers,
            vec!["cpu".to_string(), "cpuacct".into()]
        );
    }

    #[test]
    fn self_cgroup_garbage() {
        let m = parse_self_cgroup("garbage\nx:memory:/a\n4:memory\n4:memory:relative\n\n0::/a:b\n");
        assert_eq!(
            m,
            vec![Membership {
                hierarchy_id: 0,
                controllers: vec![],
                path: "/a:b".into()
            }]
        );
    }

    #[test]
    fn mountinfo_real() {
        let mounts = parse_mountinfo(HYBRID_MOUNTINFO);
        assert_eq!(mounts.len(), 10);
        assert_eq!(mounts[0].mount_point, Path::new("/sys/fs/cgroup/cpu"));
        assert_eq!(
            mounts[0].kind,
            MountKind::V1 {
                options: vec!["rw".into(), "cpu".into()]
            }
        );
        assert_eq!(mounts[9].kind, MountKind::V2);
        assert_eq!(mounts[9].mount_point, Path::new("/sys/fs/cgroup/unified"));
        // Optional fields (`shared:9`) before the separator.
        let v2 = parse_mountinfo(V2_MOUNTINFO);
        assert_eq!(v2.len(), 1);
        assert_eq!(
            (v2[0].root.as_str(), v2[0].kind.clone()),
            ("/", MountKind::V2)
        );
        let docker = parse_mountinfo(DOCKER_V1_MOUNTINFO);
        assert_eq!(docker[0].root, "/docker/4f1c");
    }

    #[test]
    fn mountinfo_escapes_and_garbage() {
        let text = "\
1 2 0:1 / /sys/fs/cgroup/my\\040dir rw - cgroup2 cgroup2 rw
garbage
1 2 0:1 / /x rw cgroup2 cgroup2 rw
1 2 0:1 / /y rw -
1 2 0:1 /a\\134b /z rw - cgroup cgroup rw,memory
1 2 0:1 / /bad\\9 rw - cgroup2 none rw
";
        let mounts = parse_mountinfo(text);
        assert_eq!(mounts.len(), 3);
        assert_eq!(mounts[0].mount_point, Path::new("/sys/fs/cgroup/my dir"));
        assert_eq!(mounts[1].root, "/a\\b");
        assert_eq!(mounts[2].mount_point, Path::new("/bad\\9"));
    }

    #[test]
    fn this_machine_hybrid() {
        let exists = fs(&[
            "/sys/fs/cgroup/cpu",
            "/sys/fs/cgroup/cpuacct",
            "/sys/fs/cgroup/memory",
            "/sys/fs/cgroup/memory/process_api/a3d8a0f5effe47f734ac53c3861d32b5",
            "/sys/fs/cgroup/unified",
        ]);
        let layout = detect(
            Some(HYBRID_CGROUP),
            Some(HYBRID_MOUNTINFO),
            Path::new("/sys/fs/cgroup"),
            exists,
        );
        assert_eq!(
            layout,
            Layout {
                v2: dir("/sys/fs/cgroup/unified", "/sys/fs/cgroup/unified"),
                memory_v1: dir(
                    "/sys/fs/cgroup/memory",
                    "/sys/fs/cgroup/memory/process_api/a3d8a0f5effe47f734ac53c3861d32b5"
                ),
                cpu_v1: dir("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu"),
                cpuacct_v1: dir("/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/cpuacct"),
            }
        );
        let memory = layout.memory_v1.expect("memory");
        let chain: Vec<_> = memory.leaf_to_mount().collect();
        assert_eq!(
            chain,
            vec![
                Path::new("/sys/fs/cgroup/memory/process_api/a3d8a0f5effe47f734ac53c3861d32b5"),
                Path::new("/sys/fs/cgroup/memory/process_api"),
                Path::new("/sys/fs/cgroup/memory"),
            ]
        );
    }

    #[test]
    fn pure_v2_service() {
        let exists = fs(&[
            "/sys/fs/cgroup",
            "/sys/fs/cgroup/system.slice/sandbox.service",
        ]);
        let layout = detect(
            Some(V2_CGROUP),
            Some(V2_MOUNTINFO),
            Path::new("/sys/fs/cgroup"),
            exists,
        );
        assert_eq!(
            layout,
            Layout {
                v2: dir(
                    "/sys/fs/cgroup",
                    "/sys/fs/cgroup/system.slice/sandbox.service"
                ),
                ..Layout::default()
            }
        );
    }

    #[test]
    fn docker_v1_bind_mounted_root() {
        let exists = fs(&["/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/memory"]);
        let layout = detect(
            Some(DOCKER_V1_CGROUP),
            Some(DOCKER_V1_MOUNTINFO),
            Path::new("/sys/fs/cgroup"),
            exists,
        );
        let cpu = dir("/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu,cpuacct");
        assert_eq!(
            layout.memory_v1,
            dir("/sys/fs/cgroup/memory", "/sys/fs/cgroup/memory")
        );
        assert_eq!(
            (layout.cpu_v1, layout.cpuacct_v1.clone()),
            (cpu.clone(), cpu)
        );
        assert_eq!(layout.v2, None, "no 0:: line: not in a v2 hierarchy");
    }

    #[test]
    fn fixture_root_falls_back_to_conventional_layout() {
        // The real mountinfo's mount points are not under the fixture root.
        let exists = fs(&[
            "/fx/unified/cgroup.controllers",
            "/fx/memory",
            "/fx/cpu",
            "/fx/cpuacct",
        ]);
        let layout = detect(
            Some(HYBRID_CGROUP),
            Some(HYBRID_MOUNTINFO),
            Path::new("/fx"),
            exists,
        );
        assert_eq!(
            layout,
            Layout {
                v2: dir("/fx/unified", "/fx/unified"),
                // The process's memory cgroup is not in the fixture: the mount serves.
                memory_v1: dir("/fx/memory", "/fx/memory"),
                cpu_v1: dir("/fx/cpu", "/fx/cpu"),
                cpuacct_v1: dir("/fx/cpuacct", "/fx/cpuacct"),
            }
        );
    }

    #[test]
    fn conventional_layout_variants() {
        // Pure v2 at the root, a nested cgroup path, no mountinfo.
        let exists = fs(&[
            "/fx/cgroup.controllers",
            "/fx/unified/cgroup.controllers",
            "/fx/a/b",
        ]);
        let layout = detect(Some("0::/a/b\n"), None, Path::new("/fx"), exists);
        assert_eq!(layout.v2, dir("/fx", "/fx/a/b"));
        assert_eq!(layout.memory_v1, None);
        // Co-mounted v1 cpu,cpuacct named by the membership, and the reverse order.
        let exists = fs(&["/fx/cpu,cpuacct", "/fx/cpuacct,cpu"]);
        let layout = detect(Some("3:cpu,cpuacct:/\n"), None, Path::new("/fx"), &exists);
        assert_eq!(layout.cpu_v1, dir("/fx/cpu,cpuacct", "/fx/cpu,cpuacct"));
        let layout = detect(Some("3:cpuacct,cpu:/\n"), None, Path::new("/fx"), &exists);
        assert_eq!(layout.cpuacct_v1, dir("/fx/cpuacct,cpu", "/fx/cpuacct,cpu"));
        // No /proc/self/cgroup: everything present is taken, at its top.
        let exists = fs(&["/fx/memory", "/fx/cpu,cpuacct"]);
        let layout = detect(None, None, Path::new("/fx"), exists);
        assert_eq!(layout.memory_v1, dir("/fx/memory", "/fx/memory"));
        assert_eq!(layout.cpuacct_v1, dir("/fx/cpu,cpuacct", "/fx/cpu,cpuacct"));
        assert_eq!(layout.v2, None);
        // Nothing there at all.
        assert_eq!(
            detect(None, None, Path::new("/fx"), fs(&[])),
            Layout::default()
        );
    }

    #[test]
    fn never_climbs_out_of_the_mount() {
        // Inside a cgroup namespace, a cgroup outside it shows as `/../..`.
        let exists = fs(&["/fx/cgroup.controllers", "/other"]);
        let layout = detect(Some("0::/../../other\n"), None, Path::new("/fx"), exists);
        assert_eq!(layout.v2, dir("/fx", "/fx"));
    }

    #[test]
    fn depth_is_bounded() {
        let deep = format!("/m{}", "/d".repeat(100));
        let cg = CgroupDir {
            mount: "/m".into(),
            dir: deep.into(),
        };
        assert_eq!(cg.leaf_to_mount().count(), MAX_DEPTH);
        let flat = CgroupDir {
            mount: "/m".into(),
            dir: "/m".into(),
        };
        assert_eq!(
            flat.leaf_to_mount().collect::<Vec<_>>(),
            vec![Path::new("/m")]
        );
    }
}
