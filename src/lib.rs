//! sandboxd: the HTTP daemon inside every sandbox.
//!
//! The tree reads like a request's path: `http` accepts and frames, `routes` matches,
//! `auth` checks, `api` handles, `fs` and `stats` do the work, `sys` talks to the kernel.

pub mod error;
pub mod stats;
pub mod sys;
