//! `/init`'s `hyperloopIP`: the `events.e2b.local` line of `/etc/hosts` (under `--system-root`),
//! which points sandboxed code at the orchestrator's event service (envd: `SetupHyperloop`).
//!
//! [`set_entry`] is a pure editor: it leaves the name on exactly one line of the new address's
//! family, its own, and every other line byte for byte (comments, blank lines, spacing, CRLF,
//! other names of a line the name shared, the name's line of the other family). It reads lines
//! as glibc does: a `#` starts a comment, the first field is the address and the others are
//! names, compared without regard to ASCII case. [`set_events_entry`] reads, edits and writes
//! the file atomically (`atomic_file`).
//!
//! As envd (`txeh`'s `AddHost`), the name keeps one entry *per address family*: a new IPv6
//! address replaces the IPv6 entry and leaves the IPv4 one, so a sandbox given both resolves
//! the name in either family. Unlike `txeh`, the other lines are not re-rendered.

use std::net::IpAddr;
use std::path::Path;

use super::atomic_file::{self, FileError};

/// The hosts file, under the system root.
pub const HOSTS: &str = "etc/hosts";

/// The name the orchestrator's event service answers to inside the sandbox.
pub const EVENTS_HOST: &str = "events.e2b.local";

/// One line of the file, with its terminator.
struct Line<'a> {
    text: &'a [u8],
    /// The byte ranges of its address and names, before any comment.
    fields: Vec<(usize, usize)>,
    /// The indexes in `fields` of the names that are the name being set.
    names: Vec<usize>,
}

impl<'a> Line<'a> {
    fn new(text: &'a [u8], name: &str) -> Line<'a> {
        let fields = fields(text);
        let names = (1..fields.len())
            .filter(|&i| text[fields[i].0..fields[i].1].eq_ignore_ascii_case(name.as_bytes()))
            .collect();
        Line {
            text,
            fields,
            names,
        }
    }

    /// Its address, if its first field is one.
    fn address(&self) -> Option<IpAddr> {
        let (from, to) = *self.fields.first()?;
        std::str::from_utf8(&self.text[from..to]).ok()?.parse().ok()
    }
}

/// One line's fields: the byte ranges of its address and names, before any comment.
fn fields(line: &[u8]) -> Vec<(usize, usize)> {
    let content = line
        .iter()
        .position(|&b| b == b'#')
        .map_or(line, |hash| &line[..hash]);
    let mut fields = Vec::new();
    let mut start = None;
    for (at, &byte) in content.iter().enumerate() {
        let blank = matches!(byte, b' ' | b'\t' | b'\r' | b'\n');
        match (blank, start) {
            (false, None) => start = Some(at),
            (true, Some(from)) => {
                fields.push((from, at));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(from) = start {
        fields.push((from, content.len()));
    }
    fields
}

/// `text` with `name` mapped to `address` alone in its family: the name removed from every
/// line whose address is of that family (a line left with no name goes, with its comment), then
/// `<address padded to 16> <name>` appended on a line of its own (envd's format) with the file's
/// line ending. `None` when the name is already on exactly one line of the family, with that
/// address.
pub fn set_entry(text: &[u8], name: &str, address: IpAddr) -> Option<Vec<u8>> {
    let same_family = |line: &Line| {
        line.address()
            .is_some_and(|other| other.is_ipv4() == address.is_ipv4())
    };
    let lines: Vec<Line> = text
        .split_inclusive(|&b| b == b'\n')
        .map(|text| Line::new(text, name))
        .map(|mut line| {
            if !same_family(&line) {
                line.names.clear();
            }
            line
        })
        .collect();
    if let [line] = lines
        .iter()
        .filter(|line| !line.names.is_empty())
        .collect::<Vec<_>>()
        .as_slice()
    {
        if line.names.len() == 1 && line.address() == Some(address) {
            return None;
        }
    }
    let mut out = Vec::with_capacity(text.len() + 64);
    for Line {
        text,
        fields,
        names,
    } in &lines
    {
        if names.is_empty() {
            out.extend_from_slice(text);
        } else if names.len() + 1 < fields.len() {
            // Other names stay: each matching name goes with the blanks before it.
            let mut kept = 0;
            for &i in names {
                out.extend_from_slice(&text[kept..fields[i - 1].1]);
                kept = fields[i].1;
            }
            out.extend_from_slice(&text[kept..]);
        }
    }
    let ending: &[u8] = match lines
        .iter()
        .map(|line| line.text)
        .rev()
        .find(|line| line.ends_with(b"\n"))
    {
        Some(line) if line.ends_with(b"\r\n") => b"\r\n",
        _ => b"\n",
    };
    if out.last().is_some_and(|&last| last != b'\n') {
        out.extend_from_slice(ending);
    }
    out.extend_from_slice(format!("{:<16} {name}", address.to_string()).as_bytes());
    out.extend_from_slice(ending);
    Some(out)
}

/// Points [`EVENTS_HOST`] at `address` in the hosts file under `root` (created if missing).
pub fn set_events_entry(root: &Path, address: IpAddr) -> Result<(), FileError> {
    let path = root.join(HOSTS);
    // A write killed half-way left its temporary; an unchanged file would keep it.
    atomic_file::remove_stale(&path)?;
    let text = atomic_file::read_optional(&path)?.unwrap_or_default();
    match set_entry(&text, EVENTS_HOST, address) {
        Some(edited) => atomic_file::write(&path, &edited),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(text: &str, address: &str) -> Option<String> {
        set_entry(text.as_bytes(), EVENTS_HOST, address.parse().unwrap())
            .map(|out| String::from_utf8(out).unwrap())
    }

    const BASE: &str = "# /etc/hosts: static table\n127.0.0.1\tlocalhost\n\n::1     localhost ip6-localhost   # loopback\n";

    #[test]
    fn a_new_entry_is_appended_and_everything_else_kept() {
        assert_eq!(
            set(BASE, "10.11.0.1").as_deref(),
            Some(&*format!("{BASE}10.11.0.1        events.e2b.local\n"))
        );
        assert_eq!(
            set("", "10.11.0.1").as_deref(),
            Some("10.11.0.1        events.e2b.local\n")
        );
        // No final newline: one is added before the entry.
        assert_eq!(
            set("127.0.0.1 localhost", "10.11.0.1").as_deref(),
            Some("127.0.0.1 localhost\n10.11.0.1        events.e2b.local\n")
        );
    }

    #[test]
    fn the_same_address_again_changes_nothing() {
        let once = set(BASE, "10.11.0.1").unwrap();
        assert_eq!(set(&once, "10.11.0.1"), None);
        // The same address in another spelling, the name in another case, shared line.
        assert_eq!(set("fd00:0:0::1 EVENTS.e2b.local other\n", "fd00::1"), None);
    }

    #[test]
    fn a_new_address_replaces_the_entry_of_its_own_family_only() {
        let once = set(BASE, "10.11.0.1").unwrap();
        let twice = set(&once, "10.11.0.2").unwrap();
        assert_eq!(twice, format!("{BASE}10.11.0.2        events.e2b.local\n"));
        // IPv6 is added beside the IPv4 entry (as envd's txeh keeps one per family)...
        let v6 = set(&twice, "FD00::0001").unwrap();
        let both =
            format!("{BASE}10.11.0.2        events.e2b.local\nfd00::1          events.e2b.local\n");
        assert_eq!(v6, both);
        assert_eq!(set(&v6, "fd00::1"), None);
        assert_eq!(set(&v6, "10.11.0.2"), None);
        // ...and a new IPv4 address replaces only the IPv4 one.
        assert_eq!(
            set(&v6, "10.11.0.3").unwrap(),
            format!("{BASE}fd00::1          events.e2b.local\n10.11.0.3        events.e2b.local\n")
        );
        // A line whose first field is no address is never the name's entry: kept.
        assert_eq!(
            set("bogus events.e2b.local\n", "10.0.0.1").unwrap(),
            "bogus events.e2b.local\n10.0.0.1         events.e2b.local\n"
        );
    }

    #[test]
    fn every_copy_goes_and_lines_shared_with_other_names_keep_them() {
        let text = "127.0.0.1 localhost\n\
                    10.0.0.9  events.e2b.local   # old, alone\n\
                    10.0.0.8\tapi events.e2b.local\tweb # shared\n\
                    fd00::9 Events.E2B.Local\n\
                    # events.e2b.local in a comment stays\n\
                    10.0.0.7 events.e2b.local.example\n";
        assert_eq!(
            set(text, "10.11.0.1").unwrap(),
            "127.0.0.1 localhost\n\
             10.0.0.8\tapi\tweb # shared\n\
             fd00::9 Events.E2B.Local\n\
             # events.e2b.local in a comment stays\n\
             10.0.0.7 events.e2b.local.example\n\
             10.11.0.1        events.e2b.local\n"
        );
        // Twice on one line with the right address is still two entries: rewritten.
        assert_eq!(
            set("10.11.0.1 events.e2b.local events.e2b.local\n", "10.11.0.1").unwrap(),
            "10.11.0.1        events.e2b.local\n"
        );
    }

    #[test]
    fn crlf_files_keep_their_endings() {
        let text = "127.0.0.1 localhost\r\n10.0.0.9 events.e2b.local\r\n# end\r\n";
        assert_eq!(
            set(text, "10.11.0.1").unwrap(),
            "127.0.0.1 localhost\r\n# end\r\n10.11.0.1        events.e2b.local\r\n"
        );
        assert_eq!(set("10.11.0.1 events.e2b.local\r\n", "10.11.0.1"), None);
    }

    #[test]
    fn bytes_that_are_not_utf8_are_kept() {
        let text = b"127.0.0.1 caf\xe9\n10.0.0.9 events.e2b.local\n";
        let out = set_entry(text, EVENTS_HOST, "10.11.0.1".parse().unwrap()).unwrap();
        assert_eq!(
            out,
            b"127.0.0.1 caf\xe9\n10.11.0.1        events.e2b.local\n"
        );
    }
}
