//! The unpacked tree's map: each entry by its final path, a directory found on disk through
//! the temporary names of new trees, the missing ones made as members need them (a path
//! through a symlink or a file refused), and each file or symlink recorded where it was made
//! and what the commit must rename.

use std::ffi::OsStr;
use std::io;
use std::sync::Arc;

use super::commit::make_private_dir;
use super::{join, names, os, refuse, DirNode, FileId, Made, Node, Placement, Unpack};
use crate::fs::error::FsError;
use crate::fs::temp;
use crate::sys::dir::Dir;

impl Unpack {
    /// The directory at the final path `rel` (which is known), on disk.
    pub(super) fn dir_at(&mut self, rel: &[u8]) -> Result<Arc<Dir>, FsError> {
        if let Some((open, dir)) = &self.open {
            if open == rel {
                return Ok(Arc::clone(dir));
            }
        }
        let mut dir = Arc::clone(&self.root);
        let mut prefix: Vec<u8> = Vec::new();
        if !rel.is_empty() {
            for part in rel.split(|&b| b == b'/') {
                if !prefix.is_empty() {
                    prefix.push(b'/');
                }
                prefix.extend_from_slice(part);
                let on_disk = match self.dir(&prefix).and_then(|n| n.temp.as_ref()) {
                    Some(temp) => temp.clone(),
                    None => os(part).to_os_string(),
                };
                let next = dir.open_dir(&on_disk, false).map_err(|e| {
                    FsError::io(
                        e,
                        format!("opening directory '{}'", self.path_of(&prefix).display()),
                    )
                })?;
                dir = Arc::new(next);
            }
        }
        self.open = Some((rel.to_vec(), Arc::clone(&dir)));
        Ok(dir)
    }

    /// Makes sure the directories `parts` exist (made new where missing); their final path.
    pub(super) fn ensure_dir(
        &mut self,
        parts: &[&[u8]],
        shown: &names::Shown<'_>,
    ) -> Result<Vec<u8>, FsError> {
        for i in 0..parts.len() {
            let rel = join(&parts[..=i]);
            if self.dir(&rel).is_some() {
                continue;
            }
            if let Some(made) = self.made(&rel) {
                return Err(self.not_a_dir(shown, &rel, made.is_file()));
            }
            let parent_rel = join(&parts[..i]);
            let parent_new = self.dir(&parent_rel).is_some_and(|n| n.new);
            let dir = self.dir_at(&parent_rel)?;
            let name = os(parts[i]);
            let path = self.path_of(&rel);
            let fail =
                |e: io::Error| FsError::io(e, format!("creating directory '{}'", path.display()));
            let node = if parent_new {
                make_private_dir(&dir, name).map_err(fail)?;
                DirNode {
                    new: true,
                    temp: None,
                    id: None,
                    meta: None,
                }
            } else {
                match dir.stat_at(name, false) {
                    Ok(stat) if stat.is_dir() => DirNode {
                        new: false,
                        temp: None,
                        id: None,
                        meta: None,
                    },
                    Ok(stat) if stat.is_symlink() => {
                        return Err(refuse(format!(
                            "member '{shown}' passes through '{}', a symbolic link",
                            path.display()
                        )))
                    }
                    Ok(_) => {
                        return Err(refuse(format!(
                            "member '{shown}' needs '{}' to be a directory, but it is a file",
                            path.display()
                        )))
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        let temp = temp::next_name(name);
                        let made = make_private_dir(&dir, &temp).map_err(fail)?;
                        let id = made.stat().map_err(fail)?.id();
                        self.placements.push(Placement::Dir {
                            parent: parent_rel.clone(),
                            temp: temp.clone(),
                            name: name.to_os_string(),
                            id,
                        });
                        DirNode {
                            new: true,
                            temp: Some(temp),
                            id: Some(id),
                            meta: None,
                        }
                    }
                    Err(e) => return Err(fail(e)),
                }
            };
            self.dir_order.push(rel.clone());
            self.nodes.insert(rel, Node::Dir(node));
        }
        Ok(join(parts))
    }

    pub(super) fn dir(&self, rel: &[u8]) -> Option<&DirNode> {
        match self.nodes.get(rel) {
            Some(Node::Dir(dir)) => Some(dir),
            _ => None,
        }
    }

    pub(super) fn dir_mut(&mut self, rel: &[u8]) -> Option<&mut DirNode> {
        match self.nodes.get_mut(rel) {
            Some(Node::Dir(dir)) => Some(dir),
            _ => None,
        }
    }

    pub(super) fn made(&self, rel: &[u8]) -> Option<&Made> {
        match self.nodes.get(rel) {
            Some(Node::Made(made)) => Some(made),
            _ => None,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn record(
        &mut self,
        rel: &[u8],
        parent: &[u8],
        on_disk: &OsStr,
        name: &[u8],
        mtime: (i64, u32),
        file: Option<FileId>,
        parent_new: bool,
    ) {
        if self.nodes.contains_key(rel) {
            return;
        }
        let made = Made {
            parent: parent.to_vec(),
            on_disk: on_disk.to_os_string(),
            file,
        };
        self.nodes.insert(rel.to_vec(), Node::Made(made));
        if !parent_new {
            self.placements.push(Placement::Entry {
                parent: parent.to_vec(),
                temp: on_disk.to_os_string(),
                name: os(name).to_os_string(),
                mtime,
                file,
            });
        }
    }

    pub(super) fn not_a_dir(&self, shown: &names::Shown<'_>, rel: &[u8], is_file: bool) -> FsError {
        let what = if is_file { "file" } else { "symbolic link" };
        refuse(format!(
            "member '{shown}' needs '{}' to be a directory, but the archive made it a {what}",
            names::shown(rel)
        ))
    }
}
