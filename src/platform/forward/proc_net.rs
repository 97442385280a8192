//! The scanner's fallback: listening TCP sockets read from `/proc/net/tcp` and `tcp6`, for a
//! kernel on which `sock_diag` cannot list them (`inet_diag`/`tcp_diag` are modules that a
//! minimal guest never loads; its dump answers `ENOENT`). This is envd's own source.
//!
//! The files list every TCP socket, not only those in `LISTEN`, so a scan costs in proportion to
//! the open connections (docs/design.md, "Localhost port forwarding"). [`read_table`] is pure:
//! the file's text in, the listeners out.

use std::fs::File;
use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::scan::Listening;

/// The files read, IPv4 then IPv6; a missing `tcp6` (IPv6 off) lists nothing.
const TABLES: [&str; 2] = ["/proc/net/tcp", "/proc/net/tcp6"];
/// `TCP_LISTEN` as the files print it (`st`).
const LISTEN_STATE: &str = "0A";

/// Reads both files into `buf` (kept between scans) and returns every socket in `LISTEN`.
pub fn listening(buf: &mut Vec<u8>) -> io::Result<Vec<Listening>> {
    let mut found = Vec::new();
    for (index, path) in TABLES.iter().enumerate() {
        buf.clear();
        match File::open(path).and_then(|mut file| file.read_to_end(buf)) {
            Ok(_) => {}
            Err(e) if index == 1 && e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io::Error::new(e.kind(), format!("{path}: {e}"))),
        }
        read_table(buf, &mut found).map_err(|line| {
            io::Error::new(io::ErrorKind::InvalidData, format!("{path}: {line}"))
        })?;
    }
    Ok(found)
}

/// Adds the listeners of one file's text to `found`; a line it cannot read is the error.
pub fn read_table(text: &[u8], found: &mut Vec<Listening>) -> Result<(), String> {
    // The first line is the header.
    for line in text.split(|&b| b == b'\n').skip(1) {
        let line = std::str::from_utf8(line).map_err(|_| "a line is not text".to_string())?;
        if line.trim().is_empty() {
            continue;
        }
        let mut fields = line.split_ascii_whitespace();
        let (Some(_slot), Some(local), Some(_remote), Some(state)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(format!("malformed line '{}'", shown(line)));
        };
        if state != LISTEN_STATE {
            continue;
        }
        let listening =
            address(local).ok_or_else(|| format!("malformed address '{}'", shown(local)))?;
        found.push(listening);
    }
    Ok(())
}

/// `ADDR:PORT` in the kernel's hex: the address as 32-bit words in the machine's byte order,
/// the port as a number.
fn address(text: &str) -> Option<Listening> {
    let (addr, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = match addr.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(addr)?)),
        32 => {
            let mut octets = [0u8; 16];
            for (chunk, out) in addr.as_bytes().chunks(8).zip(octets.chunks_mut(4)) {
                out.copy_from_slice(&word(std::str::from_utf8(chunk).ok()?)?);
            }
            let v6 = Ipv6Addr::from(octets);
            // A v4-mapped address is the IPv4 address it maps, as from sock_diag.
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        }
        _ => return None,
    };
    Some(Listening { ip, port })
}

/// Eight hex digits printed from a word in memory: its bytes as they were in memory.
fn word(hex: &str) -> Option<[u8; 4]> {
    if hex.len() != 8 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(hex, 16).ok().map(u32::to_ne_bytes)
}

fn shown(text: &str) -> String {
    text.chars().take(120).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::forward::scan::tests::l;

    /// A word as this machine's kernel prints it.
    fn hex(octets: [u8; 4]) -> String {
        format!("{:08X}", u32::from_ne_bytes(octets))
    }

    #[test]
    fn listeners_of_both_families_are_read_and_other_states_skipped() {
        let v4 = format!(
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  \
             timeout inode\n   \
             0: {}:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 \
             1234 1 0000000000000000 100 0 0 10 0\n   \
             1: {}:C350 {}:1F40 01 00000000:00000000 00:00000000 00000000  1000        0 \
             1235 1 0000000000000000 20 4 30 10 -1\n   \
             2: {}:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 \
             1236 1 0000000000000000 100 0 0 10 0\n",
            hex([127, 0, 0, 1]),
            hex([127, 0, 0, 1]),
            hex([127, 0, 0, 1]),
            hex([0, 0, 0, 0]),
        );
        let mut found = Vec::new();
        read_table(v4.as_bytes(), &mut found).unwrap();
        assert_eq!(found, [l("127.0.0.1", 8000), l("0.0.0.0", 80)]);

        let loopback6 = [hex([0; 4]), hex([0; 4]), hex([0; 4]), hex([0, 0, 0, 1])].concat();
        let mapped = [
            hex([0; 4]),
            hex([0; 4]),
            hex([0, 0, 0xff, 0xff]),
            hex([127, 0, 0, 1]),
        ]
        .concat();
        let v6 = format!(
            "  sl  local_address                         remote_address                        st \
             tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
             0: {loopback6}:0BB8 00000000000000000000000000000000:0000 0A 00000000:00000000 \
             00:00000000 00000000     0        0 77 1 0000000000000000 100 0 0 10 0\n   \
             1: {mapped}:1F41 00000000000000000000000000000000:0000 0A 00000000:00000000 \
             00:00000000 00000000     0        0 78 1 0000000000000000 100 0 0 10 0\n"
        );
        let mut found = Vec::new();
        read_table(v6.as_bytes(), &mut found).unwrap();
        assert_eq!(found, [l("::1", 3000), l("127.0.0.1", 8001)]);
    }

    #[test]
    fn an_empty_table_lists_nothing_and_a_malformed_line_is_an_error() {
        let mut found = Vec::new();
        read_table(b"  sl  local_address rem_address   st\n", &mut found).unwrap();
        read_table(b"", &mut found).unwrap();
        assert!(found.is_empty());
        let error = read_table(b"header\n   0: 0100007F\n", &mut found).unwrap_err();
        assert_eq!(error, "malformed line '   0: 0100007F'");
        let error = read_table(b"header\n 0: 7F:1F40 00000000:0000 0A\n", &mut found).unwrap_err();
        assert_eq!(error, "malformed address '7F:1F40'");
        let error = read_table(b"header\n 0: 0100007G:1F40 0:0 0A\n", &mut found).unwrap_err();
        assert_eq!(error, "malformed address '0100007G:1F40'");
        let error = read_table(b"header\n 0: 0100007F:XYZ 0:0 0A\n", &mut found).unwrap_err();
        assert_eq!(error, "malformed address '0100007F:XYZ'");
    }

    #[test]
    fn the_files_list_a_listener_of_this_test() {
        let v4 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = v4.local_addr().unwrap().port();
        let found = listening(&mut Vec::new()).unwrap();
        assert!(found.contains(&l("127.0.0.1", port)), "{found:?}");
        if let Ok(v6) = std::net::TcpListener::bind("[::1]:0") {
            let port = v6.local_addr().unwrap().port();
            let found = listening(&mut Vec::new()).unwrap();
            assert!(found.contains(&l("::1", port)), "{found:?}");
        }
    }
}
