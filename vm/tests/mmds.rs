//! The metadata service as the guest sees it at its link-local address: the host tests' fake of
//! Firecracker's MMDS v2 (tests/common/mmds.rs) on the host's 127.0.0.1, reached through QEMU's
//! `guestfwd` (one `socat` per connection), holding what E2B puts there.

use serde_json::{json, Value};

#[allow(dead_code)] // what only the host tests use: stalls, garbage
#[path = "../../tests/common/mmds.rs"]
mod fake;

pub(crate) use fake::{sha512_hex, FakeMmds};

/// E2B's metadata for sandbox `id` of template `template`, whose `/init` may set `token`.
pub fn metadata(id: &str, template: &str, token: &str) -> Value {
    json!({"instanceID": id, "envID": template, "address": "", "accessTokenHash": sha512_hex(token)})
}
