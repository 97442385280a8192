//! The options of port forwarding (SPEC §12): the address servers on loopback are forwarded
//! to, and its limits.

use std::net::IpAddr;

use super::parse::parse_count;
use super::{Fallback, Opt, Setting};

/// SPEC §12: envd's address for the sandbox (its port forwarder's `socat`s bind there).
pub const FORWARD_ADDRESS: Setting<Option<IpAddr>> = Setting {
    opt: Opt {
        flag: Some("--forward-address"),
        env: "SANDBOXD_FORWARD_ADDRESS",
        value: "ADDR",
        default: Fallback::Text("169.254.0.21"),
        help: "servers listening only on `127.0.0.1` or `::1` are forwarded to this address, same \
               port (`off`: no forwarding; an address on no interface is waited for)",
    },
    parse: |flag, text| match text {
        "off" => Ok(None),
        text => text
            .parse()
            .map(Some)
            .map_err(|_| format!("{flag}: '{text}' is neither an IP address nor 'off'")),
    },
    absent: None,
};

pub const FORWARD_MAX_PORTS: Setting<usize> = Setting {
    opt: Opt {
        flag: Some("--forward-max-ports"),
        env: "SANDBOXD_FORWARD_MAX_PORTS",
        value: "N",
        default: Fallback::Text("64"),
        help: "most ports forwarded at once; more are logged and left out",
    },
    parse: |flag, text| parse_count(flag, text, 65_535),
    absent: None,
};

pub const FORWARD_MAX_CONNECTIONS: Setting<usize> = Setting {
    opt: Opt {
        flag: Some("--forward-max-connections"),
        env: "SANDBOXD_FORWARD_MAX_CONNECTIONS",
        value: "N",
        default: Fallback::Text("1024"),
        help: "most connections open through one forwarded port; more are closed at once and \
               logged",
    },
    parse: |flag, text| parse_count(flag, text, 1 << 20),
    absent: None,
};
