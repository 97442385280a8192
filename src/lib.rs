//! sandboxd: the HTTP daemon inside every sandbox.
//!
//! The tree reads like a request's path: `http` accepts and frames, `routes` matches,
//! `auth` checks, `api` handles, `fs`, `proc` and `stats` do the work, `sys` talks to the
//! kernel.
//!
//! Every module is private, so the compiler reports what nothing uses. The few items outside
//! callers need are re-exported below, grouped by who needs them.

mod api;
mod app;
mod archive;
mod auth;
mod cli;
mod config;
mod connect;
mod daemon;
mod descriptors;
mod error;
mod fs;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
/// The HTTP layer, its own crate (`crates/http`), under the name the modules use.
use sandboxd_http as http;

/// The unit tests count each thread's allocations (a request's path must make none).
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: http::fuzzing::Counting = http::fuzzing::Counting;
mod log;
mod mmds;
mod notify;
mod platform;
mod proc;
mod routes;
mod shutdown;
mod stats;
mod sys;
mod token;
pub mod upgrade;

// The binary (src/main.rs): parse the command line, then serve or run a subcommand.
pub use api::init::ENVD_VERSION;
pub use cli::{healthcheck, sign};
pub use config::{help, parse, sign_help, Command, COMMIT};
pub use daemon::run;

// The integration tests (tests/): signed URLs they cannot get from `sandboxd sign` (expired
// ones), and the route table they check against the router and docs/openapi.yaml.
pub use auth::{signed_url_query, Operation};
pub use routes::ROUTES;
