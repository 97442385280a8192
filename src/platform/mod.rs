//! E2B's platform side of the daemon (the orchestrator as a client): what `/init` does to the
//! system beyond the daemon's own memory. Each effect is a module of its own that acts only on
//! paths under `--system-root`, so a test points it at a directory of its own.
//!
//! - [`atomic_file`]: the one way a system file is replaced (temporary, `fsync`, `rename`).
//! - [`clock`]: `timestamp`, the clock, set only in a Firecracker guest.
//! - [`ca_bundle`]: `caBundle`, the trust store's bundle and the persisted certificate.
//! - [`hosts`]: `hyperloopIP`, the `events.e2b.local` line of `/etc/hosts`.
//! - [`init_files`]: the seam into `/init`: validation, order, locking, errors.
//! - [`forward`]: localhost port forwarding, in a thread of its own (not an `/init` effect).

pub mod atomic_file;
pub mod ca_bundle;
pub mod clock;
pub mod forward;
pub mod hosts;
pub mod init_files;
