//! systemd's readiness protocol (`Type=notify`), by hand: one datagram to `$NOTIFY_SOCKET`.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (`READY=1`, `STOPPING=1`) when `NOTIFY_SOCKET` is set; failures are logged.
pub fn send(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let result = UnixDatagram::unbound().and_then(|socket| {
        let bytes = path.as_encoded_bytes();
        match bytes.strip_prefix(b"@") {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                socket.send_to_addr(state.as_bytes(), &addr)
            }
            None => socket.send_to(state.as_bytes(), &path),
        }
    });
    if let Err(e) = result {
        crate::log::line(format_args!("cannot notify {path:?} of {state}: {e}"));
    }
}
