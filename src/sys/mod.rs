//! Thin libc wrappers: the only place with unsafe.

pub mod statvfs;
