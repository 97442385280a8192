//! E2B's platform side of the daemon (the orchestrator as a client): what `/init` does to the
//! system beyond the daemon's own memory. Each effect is a module of its own that acts only on
//! paths under `--system-root`, so a test points it at a directory of its own.
//!
//! - [`atomic_file`]: the one way a system file is replaced (temporary, `fsync`, `rename`).
//! - [`clock`]: `timestamp`, the clock, set only in a Firecracker guest.
//! - [`ca_bundle`]: `caBundle`, the trust store's bundle and the persisted certificate.
//! - [`http_client`]: one-request HTTP/1.1 to the host's services (metadata, logs collector).
//! - [`hosts`]: `hyperloopIP`, the `events.e2b.local` line of `/etc/hosts`.
//! - [`init_files`]: the seam into `/init`: validation, order, locking, errors.
//! - [`volumes`]: `volumeMounts` and `lifecycleID`, the sandbox's NFS volumes.
//! - [`walk`]: a system directory opened component by component, following no symlink.
//! - [`command`]: the system programs those run (`mount`), in a budget.
//! - [`cgroups`]: the started processes' cgroups, `/freeze` and `/unfreeze`.
//! - [`fsfreeze`]: `/fsfreeze` and `/fsthaw`, and the gate of the daemon's file writers.
//! - [`collapse`]: `/collapse`, the daemon's heap into transparent hugepages.
//! - [`watchdog`]: the backstop that thaws a freeze nobody ended.
//! - [`forward`]: localhost port forwarding, in a thread of its own (not an `/init` effect).

pub mod atomic_file;
pub mod ca_bundle;
pub mod cgroups;
pub mod clock;
pub mod collapse;
pub mod command;
pub mod forward;
pub mod fsfreeze;
pub mod hosts;
pub mod http_client;
pub mod init_files;
pub mod volumes;
pub mod walk;
pub mod watchdog;
