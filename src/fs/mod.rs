//! Filesystem work shared by the file routes (SPEC §4, §5): who the user is, where a client's
//! path points, the directories a written file needs, and composing files.
//!
//! `users` owns reading the passwd file, `paths` owns the lexical resolution of client paths,
//! `dirs` owns creating missing parent directories and the JSON record of a written file,
//! `atomic` owns placing a new file (temporary, fsync, rename, fsync of the directory) for compose
//! and upload, `compose` owns the crash-safe concatenation, `copy` the zero-copy append under it,
//! and `temp` the temporaries beside a destination and the removal of stale ones.

pub mod atomic;
pub mod compose;
pub mod copy;
pub mod dirs;
pub mod paths;
pub mod temp;
pub mod users;
