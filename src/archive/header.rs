//! Writing a member's header: one ustar block, preceded by a pax extended header (`x`) when a
//! value does not fit the ustar fields (a name over 100 bytes, a size of 8 GiB or more, an id
//! over 2,097,151, a time with nanoseconds or outside ustar's range, an owner's name over 32
//! bytes) or the member has extended attributes. ustar's fields are then still filled as far
//! as they go, so a reader without pax sees a truncated name rather than nothing.

use super::{Kind, BLOCK, XATTR_RECORD};

/// What a member's header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member<'a> {
    /// The name inside the archive, relative, without a trailing `/` (added for directories).
    pub path: &'a [u8],
    pub kind: Kind,
    /// Permission bits (with set-id and sticky bits).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Owner and group names; empty when the id has none.
    pub uname: &'a str,
    pub gname: &'a str,
    /// Bytes of data that follow (regular files only).
    pub size: u64,
    pub mtime: i64,
    pub mtime_nsec: u32,
    /// A symbolic link's target, or the earlier member a hard link names.
    pub link: &'a [u8],
    /// Extended attributes as (full name, value).
    pub xattrs: &'a [(String, String)],
}

/// The largest number an octal field of `len` bytes holds (`len - 1` digits and a NUL).
fn octal_max(len: usize) -> u64 {
    (1u64 << (3 * (len - 1))) - 1
}

/// Appends the header blocks of `member` to `out`.
pub fn write(member: &Member<'_>, out: &mut Vec<u8>) {
    let mut path = member.path.to_vec();
    if member.kind == Kind::Dir {
        path.push(b'/');
    }
    let mut records = Vec::new();
    if path.len() > 100 {
        record(&mut records, b"path", &path);
    }
    if member.link.len() > 100 {
        record(&mut records, b"linkpath", member.link);
    }
    if member.size > octal_max(12) {
        record(&mut records, b"size", member.size.to_string().as_bytes());
    }
    for (key, id) in [(&b"uid"[..], member.uid), (b"gid", member.gid)] {
        if u64::from(id) > octal_max(8) {
            record(&mut records, key, id.to_string().as_bytes());
        }
    }
    let whole_seconds = member.mtime_nsec == 0;
    let fits = u64::try_from(member.mtime).is_ok_and(|t| t <= octal_max(12));
    if !whole_seconds || !fits {
        record(&mut records, b"mtime", mtime_text(member).as_bytes());
    }
    for (key, name) in [(&b"uname"[..], member.uname), (b"gname", member.gname)] {
        if name.len() > 32 {
            record(&mut records, key, name.as_bytes());
        }
    }
    for (name, value) in member.xattrs {
        let key = [XATTR_RECORD, name.as_bytes()].concat();
        record(&mut records, &key, value.as_bytes());
    }
    if !records.is_empty() {
        let len = records.len() as u64;
        out.extend_from_slice(&block(b"././@PaxHeader", b'x', 0o644, len, member, b""));
        out.extend_from_slice(&records);
        out.resize(out.len() + super::padding(len), 0);
    }
    let flag = match member.kind {
        Kind::File => b'0',
        Kind::Dir => b'5',
        Kind::Symlink => b'2',
        Kind::HardLink => b'1',
        Kind::Special(flag) | Kind::Other(flag) => flag,
    };
    let size = if member.kind == Kind::File {
        member.size
    } else {
        0
    };
    out.extend_from_slice(&block(&path, flag, member.mode, size, member, member.link));
}

/// `<seconds>[.<nanoseconds>]`, as pax writes a time (a negative time's fraction counts
/// towards zero: -1.5 is one and a half seconds before the epoch).
fn mtime_text(member: &Member<'_>) -> String {
    if member.mtime_nsec == 0 {
        return member.mtime.to_string();
    }
    let (secs, nsec) = if member.mtime < 0 {
        // -2 s + 0.5 s is -1.5 s.
        (member.mtime + 1, 1_000_000_000 - member.mtime_nsec)
    } else {
        (member.mtime, member.mtime_nsec)
    };
    let sign = if member.mtime < 0 && secs == 0 {
        "-"
    } else {
        ""
    };
    let fraction = format!("{nsec:09}");
    format!("{sign}{secs}.{}", fraction.trim_end_matches('0'))
}

/// Appends one pax record, `<length> <key>=<value>\n`, the length counting itself.
fn record(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    let rest = 1 + key.len() + 1 + value.len() + 1;
    let mut len = rest + 1;
    while len != rest + len.to_string().len() {
        len = rest + len.to_string().len();
    }
    out.extend_from_slice(len.to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(key);
    out.push(b'=');
    out.extend_from_slice(value);
    out.push(b'\n');
}

/// One ustar header block.
fn block(
    path: &[u8],
    flag: u8,
    mode: u32,
    size: u64,
    member: &Member<'_>,
    link: &[u8],
) -> [u8; BLOCK] {
    let mut b = [0u8; BLOCK];
    put(&mut b[0..100], path);
    octal(&mut b[100..108], u64::from(mode & 0o7777));
    octal(&mut b[108..116], u64::from(member.uid));
    octal(&mut b[116..124], u64::from(member.gid));
    octal(&mut b[124..136], size);
    octal(&mut b[136..148], u64::try_from(member.mtime).unwrap_or(0));
    b[156] = flag;
    put(&mut b[157..257], link);
    b[257..263].copy_from_slice(b"ustar\0");
    b[263..265].copy_from_slice(b"00");
    put(&mut b[265..297], member.uname.as_bytes());
    put(&mut b[297..329], member.gname.as_bytes());
    b[148..156].fill(b' ');
    let sum: u32 = b.iter().map(|&byte| u32::from(byte)).sum();
    octal(&mut b[148..155], u64::from(sum));
    b
}

/// As much of `value` as fits; the rest of the field stays NUL.
fn put(field: &mut [u8], value: &[u8]) {
    let len = value.len().min(field.len());
    field[..len].copy_from_slice(&value[..len]);
}

/// `value` in octal, zero-padded to fill the field but its last byte (NUL); 0 when it does not
/// fit (a pax record then carries it).
fn octal(field: &mut [u8], value: u64) {
    let digits = field.len() - 1;
    let value = if value > octal_max(field.len()) {
        0
    } else {
        value
    };
    let text = format!("{value:0digits$o}");
    field[..digits].copy_from_slice(text.as_bytes());
    field[digits] = 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member<'a>(path: &'a [u8], kind: Kind) -> Member<'a> {
        Member {
            path,
            kind,
            mode: 0o644,
            uid: 1000,
            gid: 1000,
            uname: "user",
            gname: "user",
            size: 0,
            mtime: 1_700_000_000,
            mtime_nsec: 0,
            link: b"",
            xattrs: &[],
        }
    }

    #[test]
    fn a_plain_file_is_one_ustar_block() {
        let mut m = member(b"dir/a.txt", Kind::File);
        m.size = 5;
        let mut out = Vec::new();
        write(&m, &mut out);
        assert_eq!(out.len(), BLOCK);
        assert_eq!(&out[..9], b"dir/a.txt");
        assert_eq!(&out[100..108], b"0000644\0");
        assert_eq!(&out[108..116], b"0001750\0");
        assert_eq!(&out[124..136], b"00000000005\0");
        assert_eq!(&out[136..148], b"14524770400\0");
        assert_eq!(out[156], b'0');
        assert_eq!(&out[257..265], b"ustar\x0000");
        assert_eq!(&out[265..270], b"user\0");
        // The checksum: the bytes' sum with the field as spaces, six digits, NUL, space.
        let mut copy = out.clone();
        copy[148..156].fill(b' ');
        let sum: u32 = copy.iter().map(|&b| u32::from(b)).sum();
        assert_eq!(&out[148..156], format!("{sum:06o}\0 ").as_bytes());
    }

    #[test]
    fn a_directory_ends_with_a_slash_and_has_no_size() {
        let mut m = member(b"sub", Kind::Dir);
        m.size = 99;
        let mut out = Vec::new();
        write(&m, &mut out);
        assert_eq!(&out[..5], b"sub/\0");
        assert_eq!(out[156], b'5');
        assert_eq!(&out[124..136], b"00000000000\0");
    }

    #[test]
    fn long_names_times_and_attributes_go_in_a_pax_header() {
        let long = vec![b'n'; 150];
        let target = vec![b't'; 101];
        let xattrs = vec![("user.e2b.owner".to_string(), "alice".to_string())];
        let mut m = member(&long, Kind::Symlink);
        m.link = &target;
        m.mtime_nsec = 500_000_000;
        m.xattrs = &xattrs;
        let mut out = Vec::new();
        write(&m, &mut out);
        assert_eq!(out[156], b'x');
        let records = String::from_utf8(out[BLOCK..2 * BLOCK].to_vec()).unwrap();
        let records = records.trim_end_matches('\0');
        let expected = format!(
            "160 path={}\n115 linkpath={}\n22 mtime=1700000000.5\n37 SCHILY.xattr.user.e2b.owner=alice\n",
            "n".repeat(150),
            "t".repeat(101)
        );
        assert_eq!(records, expected);
        assert_eq!(out.len(), 3 * BLOCK);
        assert_eq!(out[2 * BLOCK + 156], b'2');
    }

    #[test]
    fn a_record_length_counts_its_own_digits() {
        for value_len in [0, 1, 90, 91, 92, 993, 994, 995, 996] {
            let mut out = Vec::new();
            record(&mut out, b"path", &vec![b'v'; value_len]);
            let text = String::from_utf8(out.clone()).unwrap();
            let (len, _) = text.split_once(' ').unwrap();
            assert_eq!(len.parse::<usize>().unwrap(), out.len(), "{value_len}");
        }
    }

    #[test]
    fn negative_times_are_written_as_pax_decimals() {
        let mut m = member(b"a", Kind::File);
        for (secs, nsec, text) in [
            (-1, 0, "-1"),
            (-2, 500_000_000, "-1.5"),
            (-1, 250_000_000, "-0.75"),
            (5, 1, "5.000000001"),
        ] {
            m.mtime = secs;
            m.mtime_nsec = nsec;
            assert_eq!(mtime_text(&m), text);
        }
    }
}
