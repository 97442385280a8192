//! The data of the file member being written: bytes appended as they arrive, then its mode
//! and times set through its descriptor and the file closed, as its data ends.

use std::fs::{File, FileTimes};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;

use super::{system_time, Unpack};
use crate::fs::error::FsError;

/// The file whose data is arriving.
pub(super) struct Writing {
    pub(super) file: File,
    /// Its permission bits, and whether it was made with them already.
    pub(super) mode: u32,
    pub(super) mode_set: bool,
    pub(super) mtime: (i64, u32),
    /// Its path, in [`Unpack::written`].
    pub(super) written: usize,
}

impl Unpack {
    /// Bytes of the current file's data.
    pub fn data(&mut self, bytes: &[u8]) -> Result<(), FsError> {
        let Some(writing) = &mut self.writing else {
            return Ok(());
        };
        writing.file.write_all(bytes).map_err(|e| {
            let path = &self.written[writing.written];
            FsError::io(e, format!("writing '{}'", path.display()))
        })
    }

    /// The current file's data is complete: its mode and times are set, and it is closed.
    pub fn finish_file(&mut self) -> Result<(), FsError> {
        let Some(writing) = self.writing.take() else {
            return Ok(());
        };
        let path = &self.written[writing.written];
        let fail = |e: io::Error| FsError::io(e, format!("writing '{}'", path.display()));
        if !writing.mode_set {
            writing
                .file
                .set_permissions(std::fs::Permissions::from_mode(writing.mode))
                .map_err(fail)?;
        }
        let time = system_time(writing.mtime);
        writing
            .file
            .set_times(FileTimes::new().set_accessed(time).set_modified(time))
            .map_err(fail)?;
        Ok(())
    }
}
