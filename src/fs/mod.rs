//! Filesystem work shared by the file routes (SPEC §4): who the user is, where a client's path
//! points, and the directories a written file needs.
//!
//! `users` owns reading the passwd file, `paths` owns the lexical resolution of client paths, and
//! `dirs` owns creating missing parent directories and the JSON record of a written file.

pub mod dirs;
pub mod paths;
pub mod users;
