//! sandboxd: the HTTP daemon inside every sandbox.
//!
//! The tree reads like a request's path: `http` accepts and frames, `routes` matches,
//! `auth` checks, `api` handles, `fs` and `stats` do the work, `sys` talks to the kernel.

pub mod api;
pub mod app;
pub mod auth;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod error;
pub mod fs;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod http;
pub mod log;
pub mod notify;
pub mod routes;
pub mod stats;
pub mod sys;
