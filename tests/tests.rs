//! sandboxd's integration tests, linked as one binary (as ripgrep does: one link instead of one
//! per file, and the compiler sees every use of `common`). Each module starts the real
//! `sandboxd` binary and talks to it over HTTP or runs its subcommands (`docs` reads the
//! documents); `Cargo.toml` sets `autotests = false`, so a file added here is built only once
//! it is declared below.
//!
//! Run one file's tests with `cargo test --test integration compose::`.

// The harness: starts the daemon on 127.0.0.1:0 with a temp dir, reads replies.
mod common;

// Issue 25: the process cgroups (placement, no cgroup v2), /freeze and /unfreeze.
mod cgroups;
// Directory archives: tar downloads and uploads, gzip, signed URLs, refusals, cuts.
mod archive;
// POST /files/compose: order, deletion of the sources, validation, ownership, full disks, kills.
mod compose;
// Connect's gzip: compressed requests and messages, compressed answers, refused codings.
mod connect_compression;
// docs/spec.md, docs/openapi.yaml, the router and the documents' links agree (no daemon).
mod docs;
// The filesystem service beside a hostile local user: swapped entries, trees of any depth.
mod hardening_fs;
// Directory archives beside a hostile local user: staged names swapped, wide directories.
mod hardening_archive;
// /init's system files under --system-root: caBundle, hyperloopIP, kills mid-write.
mod init_system_files;
// /init's volumeMounts and lifecycleID with fake mount helpers: what is mounted and when.
mod volumes;
// --log-format json, and envd's log exporter to the collector the metadata service names.
mod log_export;
// POST /upgrade: a new binary takes over in the same process, the listener and state handed over.
mod upgrade;
mod upgrade_process;
// Where /upgrade stages the new binary and what it runs: never a file a user could plant.
mod upgrade_staging;
// The port forwarder across a live upgrade: listeners and open connections carried over.
mod upgrade_forward;
// Directory watches across POST /upgrade: watchers carried with their inotify instance.
mod upgrade_watch;
// GET and HEAD /files: ranges, conditionals, signed URLs, sendfile.
mod download;
// GET and HEAD /files with Accept-Encoding: the gzip form, when it is sent, stalls, bounds.
mod download_gzip;
// What envd's clients rely on beyond the routes: CORS, /init, -version, Connect paths.
mod envd_compat;
// envd's command line: `envd -port N -isnotfc` serves, -verbose and -no-cgroups, -commit.
mod envd_cli;
// Localhost port forwarding: servers on 127.0.0.1 and ::1 reached through 127.0.0.x.
mod forward;
// The forwarder's share of the open-file limit: /health answered with every forward taken.
mod forward_exhaust;
// --fs-as-user: file routes and filesystem calls with the caller's rights; workers back to root.
mod fs_as_user;
// Hostile and broken clients, each answer exact, /health still served.
mod faults;
// envd's filesystem.Filesystem Connect service: Stat, ListDir, MakeDir, Move, Remove.
mod filesystem;
// Directory watches: the WatchDir stream and the polled watchers, inotify underneath.
mod filesystem_watch;
// Issue 21, Connect/HTTP: Connect-form refusals, the bodies' budget, long calls, StreamInput.
mod hardening_connect;
// Process-service hardening (issue 21): clean children, process identity, exhausted descriptors.
mod hardening_process;
// Issue 21's watch hardening: byte budgets, one queue per watch, setups off the workers.
mod hardening_watch;
// The HTTP layer: framing, keep-alive, pipelining, limits, timeouts.
mod http_layer;
// GET /metrics against fixture /proc and cgroup roots and against the real machine.
mod metrics;
// The metadata service (MMDS v2, a fake on 127.0.0.1): identity, /init's token rules, stalls.
mod mmds;
// Issue 34: /init's reads of the metadata service's token hash hold no worker and are shared.
mod init_hash;
// A peer's pace never holds a worker: slow readers, trickled bodies, partial heads.
mod peers;
// The process: flags, exit codes, signals and drain, readiness, logs, subcommands.
mod process;
// envd's process.Process Connect service: Start, Connect, List, input, signals, users, zombies.
mod process_service;
// Connect's binary protobuf codec with fixtures from a foreign encoder: every method in both
// codecs, the orchestrator's flows, errors, unknown fields, gzip.
mod proto_codec;
// README.md works as written: every command block run against `make run`'s sandbox, in order.
mod readme;
// The route table, the router and docs/openapi.yaml agree.
mod route_table;
// Routing, errors, auth, /health, /envs, /init.
mod routes;
// Issue 25: /freeze and /unfreeze on a cgroup subtree the test makes: busy loops, /init and
// the watchdog thaw, hierarchy mode.
mod freeze;
// Issue 25: /fsfreeze and /fsthaw on a loop-mounted ext4 image the test makes: writes refused
// while frozen, /health answers, the watchdog thaws.
mod fsfreeze;
// POST /files: raw, chunked and multipart bodies, 100-continue, ownership, errors, kills.
mod upload;
// Content-Encoding: gzip uploads.
mod upload_gzip;
// PUT /files: a raw body whatever its type (curl -T), as POST otherwise.
mod upload_put;
// X-Metadata-* headers as user.e2b.* attributes.
mod upload_metadata;

/// With `autotests = false` a file in tests/ that is not declared above would never be built:
/// every one must be.
#[test]
fn every_file_in_tests_is_a_module_here() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let this = include_str!("tests.rs");
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if let Some(module) = name.strip_suffix(".rs").filter(|m| *m != "tests") {
            assert!(
                this.contains(&format!("\nmod {module};\n")),
                "tests/{name} is not declared in tests/tests.rs"
            );
        }
    }
}
