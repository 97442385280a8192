//! Filesystem work shared by the file routes (SPEC §4, §5): who the user is, where a client's
//! path points, the directories a written file needs, and composing files.
//!
//! `users` owns reading the passwd file, `paths` owns the lexical resolution of client paths,
//! `dirs` owns creating missing parent directories and the JSON record of a written file,
//! `atomic` owns placing a new file for compose and upload (an unnamed `O_TMPFILE` file or a
//! named temporary, its mode and owner, fsync, naming it, fsync of the directory), `compose` owns
//! the crash-safe concatenation and which sources it may delete, `copy` the zero-copy append
//! under it, `temp` the temporary names beside a destination and the sweeper thread that
//! removes stale ones, `user_metadata` the `user.e2b.*` attributes an upload sets and a
//! listing reads, `owners` the names of owners and groups (and a user's groups), `versions` the
//! cached texts of the passwd and group files, `as_user` the switch of a thread's
//! filesystem credentials to a user's (`--fs-as-user`), `walk` descents by directory
//! descriptors, `unpack` an archive unpacked all or nothing, and `watch` the daemon's
//! directory watches (one inotify instance per watch, one thread). Failures leave `fs` as an
//! [`FsError`] (`error`), which knows nothing of HTTP; `watch`, which only the Connect service
//! uses, has its own `WatchError`, and `copy` and `temp` return `io::Error`s to the modules here
//! that use them.

pub mod as_user;
pub mod atomic;
pub mod compose;
pub mod copy;
pub mod dirs;
pub mod error;
pub mod owners;
pub mod paths;
pub mod temp;
pub mod unpack;
pub mod user_metadata;
pub mod users;
pub mod versions;
pub mod walk;
pub mod watch;

pub use error::FsError;

/// The longest path, in bytes, a client may send (SPEC §10): `paths` refuses longer ones and
/// `error` names the limit.
pub const MAX_PATH_BYTES: usize = 4096;
