//! sandboxd in a real QEMU guest, driven from outside as E2B drives envd (issue 35). Only
//! `make vm-test` runs these (`--features vm-tests`), after `vm/images` built the guests under
//! `target/vm/`: each test boots its own guest and talks to it only through QEMU's forwards on
//! 127.0.0.1 (the daemon's HTTP and Connect API) and QMP. Inside the guest the daemon is
//! `/usr/bin/envd` with no flags: the real root, the real metadata address, the real clock.
//! Run one with `make vm-test VM_TESTS=boot`.
#![cfg(feature = "vm-tests")]

mod cgroups;
mod http;
mod minimal;
mod mmds;
mod pause;
mod pid1;
mod qemu;
mod qmp;
mod sdk;
mod support;
mod template;
