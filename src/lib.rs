//! sandboxd: the HTTP daemon inside every sandbox.
//!
//! The tree reads like a request's path: `http` accepts and frames, `routes` matches,
//! `auth` checks, `api` handles, `fs` and `stats` do the work, `sys` talks to the kernel.

pub mod api;
pub mod app;
pub mod auth;
pub mod cli;
pub mod config;
pub mod connect;
pub mod daemon;
pub mod error;
pub mod fs;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
/// The HTTP layer, its own crate (`crates/http`), under the name the modules use.
pub use sandboxd_http as http;
pub mod log;
pub mod notify;
pub mod routes;
pub mod stats;
pub mod sys;
pub mod token;
