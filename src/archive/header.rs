//! Writing a member's header: one ustar block, preceded by a pax extended header (`x`) when a
//! value does not fit the ustar fields (a name over 100 bytes, a size of 8 GiB or more, an id
//! over 2,097,151, a time with nanoseconds or outside ustar's range, an owner's name over 32
//! bytes) or the member has extended attributes. ustar's fields are then still filled as far
//! as they go, so a reader without pax sees a truncated name rather than nothing.

use super::{byte_sums, push_zeros, Kind, BLOCK, XATTR_RECORD};

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

/// Appends the header blocks of `member` to `out`. Nothing is allocated but `out`'s growth
/// and no `core::fmt` runs: an archive of small files writes one header per few KiB.
pub fn write(member: &Member<'_>, out: &mut Vec<u8>) {
    let slash: &[u8] = if member.kind == Kind::Dir { b"/" } else { b"" };
    // The pax header's block, filled in once its records are written after it.
    let start = out.len();
    push_zeros(out, BLOCK);
    if member.path.len() + slash.len() > 100 {
        record(out, b"path", &[member.path, slash]);
    }
    if member.link.len() > 100 {
        record(out, b"linkpath", &[member.link]);
    }
    if member.size > octal_max(12) {
        record(out, b"size", &[Text::unsigned(member.size).bytes()]);
    }
    for (key, id) in [(&b"uid"[..], member.uid), (b"gid", member.gid)] {
        if u64::from(id) > octal_max(8) {
            record(out, key, &[Text::unsigned(u64::from(id)).bytes()]);
        }
    }
    let whole_seconds = member.mtime_nsec == 0;
    let fits = u64::try_from(member.mtime).is_ok_and(|t| t <= octal_max(12));
    if !whole_seconds || !fits {
        record(out, b"mtime", &[mtime_text(member).bytes()]);
    }
    for (key, name) in [(&b"uname"[..], member.uname), (b"gname", member.gname)] {
        if name.len() > 32 {
            record(out, key, &[name.as_bytes()]);
        }
    }
    for (name, value) in member.xattrs {
        record(
            out,
            &[XATTR_RECORD, name.as_bytes()].concat(),
            &[value.as_bytes()],
        );
    }
    let records = out.len() - start - BLOCK;
    if records == 0 {
        out.truncate(start);
    } else {
        let len = records as u64;
        let pax = block(&[b"././@PaxHeader"], b'x', 0o644, len, member, b"");
        out[start..start + BLOCK].copy_from_slice(&pax);
        push_zeros(out, super::padding(len));
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
    let path = [member.path, slash];
    out.extend_from_slice(&block(&path, flag, member.mode, size, member, member.link));
}

/// A short text made on the stack: a number, a pax time.
struct Text {
    buf: [u8; 48],
    len: usize,
}

impl Text {
    fn new() -> Text {
        Text {
            buf: [0; 48],
            len: 0,
        }
    }

    fn unsigned(n: u64) -> Text {
        let mut text = Text::new();
        text.push_unsigned(n, 1);
        text
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    fn push(&mut self, bytes: &[u8]) {
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    /// `n` in decimal, with at least `width` digits (zeros in front).
    fn push_unsigned(&mut self, n: u64, width: usize) {
        let mut digits = [b'0'; 20];
        let mut at = digits.len();
        let mut rest = n;
        while rest > 0 || at == digits.len() {
            at -= 1;
            digits[at] = b"0123456789"[usize::try_from(rest % 10).unwrap_or(0)];
            rest /= 10;
        }
        let at = at.min(digits.len().saturating_sub(width));
        self.push(&digits[at..]);
    }

    fn push_signed(&mut self, n: i64) {
        if n < 0 {
            self.push(b"-");
        }
        self.push_unsigned(n.unsigned_abs(), 1);
    }
}

/// `<seconds>[.<nanoseconds>]`, as pax writes a time (a negative time's fraction counts
/// towards zero: -1.5 is one and a half seconds before the epoch).
fn mtime_text(member: &Member<'_>) -> Text {
    let mut text = Text::new();
    if member.mtime_nsec == 0 {
        text.push_signed(member.mtime);
        return text;
    }
    let (secs, nsec) = if member.mtime < 0 {
        // -2 s + 0.5 s is -1.5 s.
        (member.mtime + 1, 1_000_000_000 - member.mtime_nsec)
    } else {
        (member.mtime, member.mtime_nsec)
    };
    if member.mtime < 0 && secs == 0 {
        text.push(b"-");
    }
    text.push_signed(secs);
    text.push(b".");
    let mut fraction = u64::from(nsec);
    let mut width = 9;
    while fraction % 10 == 0 && width > 1 {
        fraction /= 10;
        width -= 1;
    }
    text.push_unsigned(fraction, width);
    text
}

/// Appends one pax record, `<length> <key>=<value>\n`, the length counting itself; the value
/// is the concatenation of `value`'s parts.
fn record(out: &mut Vec<u8>, key: &[u8], value: &[&[u8]]) {
    let value_len: usize = value.iter().map(|part| part.len()).sum();
    let rest = 1 + key.len() + 1 + value_len + 1;
    let digits = |n: usize| Text::unsigned(n as u64).len;
    let mut len = rest + 1;
    while len != rest + digits(len) {
        len = rest + digits(len);
    }
    out.extend_from_slice(Text::unsigned(len as u64).bytes());
    out.push(b' ');
    out.extend_from_slice(key);
    out.push(b'=');
    for part in value {
        out.extend_from_slice(part);
    }
    out.push(b'\n');
}

/// One ustar header block; the name is the concatenation of `path`'s parts.
fn block(
    path: &[&[u8]],
    flag: u8,
    mode: u32,
    size: u64,
    member: &Member<'_>,
    link: &[u8],
) -> [u8; BLOCK] {
    let mut b = [0u8; BLOCK];
    let mut at = 0;
    for part in path {
        let field = &mut b[at.min(100)..100];
        put(field, part);
        at += part.len();
    }
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
    let (sum, _) = byte_sums(&b);
    octal(&mut b[148..155], sum);
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
    let mut rest = if value > octal_max(field.len()) {
        0
    } else {
        value
    };
    for slot in field[..digits].iter_mut().rev() {
        *slot = b"01234567"[usize::try_from(rest & 7).unwrap_or(0)];
        rest >>= 3;
    }
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
            record(&mut out, b"path", &[&vec![b'v'; value_len]]);
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
            assert_eq!(mtime_text(&m).bytes(), text.as_bytes());
        }
    }
}
