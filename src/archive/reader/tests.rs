use super::*;
use crate::archive::header::{self, Member};
use crate::archive::padding;

/// What a whole read gives: each entry with its data, and whether the end was seen.
type Read = (Vec<(Entry, Vec<u8>)>, bool);

/// Feeds `archive` in pieces of `step` bytes.
fn read(archive: &[u8], step: usize) -> Result<Read, TarError> {
    let mut reader = Reader::new();
    let mut entries: Vec<(Entry, Vec<u8>)> = Vec::new();
    let mut ended = false;
    let mut open = false;
    for piece in archive.chunks(step.max(1)) {
        let mut at = 0;
        loop {
            let (used, event) = reader.advance(&piece[at..])?;
            match event {
                Event::Member(entry) => {
                    assert!(!open, "a member inside a member");
                    open = true;
                    entries.push((entry, Vec::new()));
                }
                Event::Data(range) => {
                    let data = &piece[at..][range];
                    entries.last_mut().unwrap().1.extend_from_slice(data);
                }
                Event::MemberEnd => {
                    assert!(open);
                    open = false;
                }
                Event::End => ended = true,
                Event::NeedMore => {
                    assert_eq!(used, piece.len() - at);
                    break;
                }
            }
            at += used;
        }
    }
    reader.finish()?;
    Ok((entries, ended))
}

fn member<'a>(path: &'a [u8], kind: Kind, size: u64) -> Member<'a> {
    Member {
        path,
        kind,
        mode: 0o640,
        uid: 1000,
        gid: 1001,
        uname: "user",
        gname: "staff",
        size,
        mtime: 1_700_000_000,
        mtime_nsec: 0,
        link: b"",
        xattrs: &[],
    }
}

fn with_data(out: &mut Vec<u8>, m: &Member<'_>, data: &[u8]) {
    header::write(m, out);
    out.extend_from_slice(data);
    out.resize(out.len() + padding(data.len() as u64), 0);
}

fn sample() -> (Vec<u8>, Vec<u8>) {
    let big: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    let long = vec![b'd'; 180];
    let xattrs = vec![("user.e2b.owner".to_string(), "alice".to_string())];
    let mut out = Vec::new();
    with_data(&mut out, &member(b"a.txt", Kind::File, 5), b"hello");
    with_data(&mut out, &member(b"sub", Kind::Dir, 0), b"");
    let mut m = member(&long, Kind::File, big.len() as u64);
    m.mtime_nsec = 123_456_789;
    m.xattrs = &xattrs;
    with_data(&mut out, &m, &big);
    let mut link = member(b"sub/link", Kind::Symlink, 0);
    link.link = b"../a.txt";
    with_data(&mut out, &link, b"");
    with_data(&mut out, &member(b"empty", Kind::File, 0), b"");
    out.extend_from_slice(&[0u8; 1024]);
    (out, big)
}

#[test]
fn written_archives_read_back_in_pieces_of_any_size() {
    let (archive, big) = sample();
    let (whole, ended) = read(&archive, archive.len()).unwrap();
    assert!(ended);
    let names: Vec<&[u8]> = whole.iter().map(|(e, _)| e.path.as_slice()).collect();
    let long = vec![b'd'; 180];
    assert_eq!(
        names,
        [&b"a.txt"[..], b"sub/", &long, b"sub/link", b"empty"]
    );
    assert_eq!(whole[0].1, b"hello");
    assert_eq!(whole[0].0.mode, 0o640);
    assert_eq!((whole[0].0.uid, whole[0].0.gid), (1000, 1001));
    assert_eq!(whole[1].0.kind, Kind::Dir);
    assert_eq!(whole[2].1, big);
    assert_eq!(whole[2].0.mtime, (1_700_000_000, 123_456_789));
    assert_eq!(
        whole[2].0.xattrs,
        vec![(b"user.e2b.owner".to_vec(), b"alice".to_vec())]
    );
    assert_eq!(whole[3].0.kind, Kind::Symlink);
    assert_eq!(whole[3].0.link, b"../a.txt");
    assert_eq!(whole[4].1, b"");
    for step in [1, 2, 7, 511, 512, 513, 1000, 4096] {
        assert_eq!(
            read(&archive, step).unwrap(),
            (whole.clone(), true),
            "{step}"
        );
    }
}

#[test]
fn an_archive_cut_anywhere_before_its_end_block_is_an_error() {
    let (archive, _) = sample();
    let end = archive.len() - 1024;
    for cut in [0, 1, 511, 512, 1024, 1500, end - 1, end] {
        assert_eq!(
            read(&archive[..cut], 512).unwrap_err(),
            TarError::Truncated,
            "{cut}"
        );
    }
    // One zero block is the end; what follows is ignored.
    let mut padded = archive[..end + 512].to_vec();
    padded.extend_from_slice(b"trailing garbage");
    assert!(read(&padded, 100).unwrap().1);
}

#[test]
fn a_wrong_checksum_or_field_is_an_error_naming_the_offset() {
    let (mut archive, _) = sample();
    // The second header (after "a.txt" and its block of data).
    archive[1024 + 3] ^= 1;
    assert_eq!(
        read(&archive, 512).unwrap_err(),
        TarError::Checksum { offset: 1024 }
    );
    assert_eq!(
        TarError::Checksum { offset: 512 }.to_string(),
        "the header at byte 512 has a wrong checksum"
    );
}

/// Old writers summed the header's bytes as signed: a name with bytes over 127 makes the two
/// sums differ, and either is taken; any other value is not.
#[test]
fn a_checksum_summed_signed_or_unsigned_is_taken() {
    let header = |signed: bool, off_by: i64| {
        let mut b = [0u8; 512];
        b[..5].copy_from_slice(b"\xc3\xa9t\xc3\xa9");
        b[100..108].copy_from_slice(b"0000644\0");
        b[124..136].copy_from_slice(b"00000000000\0");
        b[257..263].copy_from_slice(b"ustar\0");
        b[148..156].fill(b' ');
        let sum: i64 = if signed {
            b.iter().map(|&x| i64::from(x.cast_signed())).sum()
        } else {
            b.iter().map(|&x| i64::from(x)).sum()
        };
        b[148..155].copy_from_slice(format!("{:06o}\0", sum + off_by).as_bytes());
        let mut archive = b.to_vec();
        archive.extend_from_slice(&[0u8; 1024]);
        archive
    };
    for signed in [false, true] {
        assert!(read(&header(signed, 0), 512).is_ok(), "signed: {signed}");
        assert_eq!(
            read(&header(signed, 1), 512).unwrap_err(),
            TarError::Checksum { offset: 0 }
        );
    }
}

/// A header block with the checksum made right after the caller filled it.
fn raw_header(fill: impl FnOnce(&mut [u8; 512])) -> [u8; 512] {
    let mut b = [0u8; 512];
    b[100..108].copy_from_slice(b"0000644\0");
    b[257..263].copy_from_slice(b"ustar ");
    fill(&mut b);
    b[148..156].fill(b' ');
    let sum: u32 = b.iter().map(|&x| u32::from(x)).sum();
    b[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    b
}

#[test]
fn gnu_long_names_and_base_256_numbers() {
    let name = vec![b'x'; 300];
    let mut archive = Vec::new();
    archive.extend_from_slice(&raw_header(|b| {
        b[..13].copy_from_slice(b"././@LongLink");
        b[124..136].copy_from_slice(format!("{:011o}\0", name.len() + 1).as_bytes());
        b[156] = b'L';
    }));
    let mut data = name.clone();
    data.push(0);
    archive.extend_from_slice(&data);
    archive.resize(archive.len() + padding(data.len() as u64), 0);
    archive.extend_from_slice(&raw_header(|b| {
        b[..3].copy_from_slice(b"xxx");
        // uid 2^32 in base-256.
        b[108] = 0x80;
        b[111] = 1;
        b[124..136].copy_from_slice(b"00000000003 ");
        b[156] = b'0';
    }));
    archive.extend_from_slice(b"abc");
    archive.resize(archive.len() + 509 + 512, 0);
    let (entries, _) = read(&archive, 100).unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].0.path, name);
    assert_eq!(entries[0].0.uid, 1 << 32);
    assert_eq!(entries[0].1, b"abc");
}

#[test]
fn extended_headers_are_bounded() {
    let mut archive = Vec::new();
    archive.extend_from_slice(&raw_header(|b| {
        b[124..136].copy_from_slice(format!("{:011o}\0", MAX_EXTENDED + 1).as_bytes());
        b[156] = b'x';
    }));
    assert_eq!(
        read(&archive, 512).unwrap_err(),
        TarError::ExtendedTooLarge {
            offset: 0,
            size: MAX_EXTENDED as u64 + 1
        }
    );
}

#[test]
fn malformed_pax_records_are_errors() {
    for (records, reason) in [
        (
            &b"5 a=b"[..],
            "a record length that does not end at a newline",
        ),
        (b"x a=b\n", "a record length that is not a number"),
        (b"6 ab\n\n", "a record without '='"),
        (b"11 size=1x\n", "a number that is not decimal"),
        (b"14 mtime=1.x2\n", "a bad mtime"),
        (b"12 path=a\0b\n", "a path with a NUL byte"),
        (b"13 path=\0abc\n", "a path with a NUL byte"),
        (b"16 linkpath=t\0t\n", "a linkpath with a NUL byte"),
    ] {
        let mut archive = Vec::new();
        archive.extend_from_slice(&raw_header(|b| {
            b[124..136].copy_from_slice(format!("{:011o}\0", records.len()).as_bytes());
            b[156] = b'x';
        }));
        archive.extend_from_slice(records);
        archive.resize(1024 + 1024, 0);
        assert_eq!(
            read(&archive, 512).unwrap_err(),
            TarError::Record { offset: 0, reason },
            "{}",
            String::from_utf8_lossy(records)
        );
    }
}

#[test]
fn pax_times_and_numbers() {
    assert_eq!(pax_time(b"1700000000"), Some((1_700_000_000, 0)));
    assert_eq!(pax_time(b"1.5"), Some((1, 500_000_000)));
    assert_eq!(pax_time(b"1.0000000019"), Some((1, 1)));
    assert_eq!(pax_time(b"-1.5"), Some((-2, 500_000_000)));
    assert_eq!(pax_time(b"-1"), Some((-1, 0)));
    assert_eq!(pax_time(b""), None);
    assert_eq!(pax_time(b"1.-5"), None);
    assert_eq!(number(b"0000644\0"), Some(0o644));
    assert_eq!(number(b"  644 \0"), Some(0o644));
    assert_eq!(number(b"\0\0\0"), Some(0));
    assert_eq!(number(b"0009"), None);
    assert_eq!(number(&[0xff, 0xff]), None);
}

#[test]
fn mutated_archives_read_the_same_whole_and_in_pieces() {
    // The fuzz target's invariant (`fuzzing::tar`), over mutations of a valid archive: bytes
    // changed, cut, headers' fields rewritten; never a panic, and the same outcome however
    // the bytes are split.
    let (archive, _) = sample();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move |below: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        usize::try_from(seed % below as u64).unwrap()
    };
    for _ in 0..3000 {
        let mut bytes = archive.clone();
        for _ in 0..next(8) + 1 {
            let at = next(bytes.len());
            bytes[at] = u8::try_from(next(256)).unwrap();
        }
        if next(4) == 0 {
            bytes.truncate(next(bytes.len()));
        }
        let whole = read(&bytes, bytes.len().max(1));
        let split = read(&bytes, next(700) + 1);
        assert_eq!(whole.map(|(e, _)| e), split.map(|(e, _)| e));
    }
}

#[test]
fn byte_sums_are_the_plain_sums_for_any_bytes_and_length() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state.to_le_bytes()[0]
    };
    let mut cases: Vec<Vec<u8>> = vec![vec![], vec![0xff; 512], vec![0x80; 13], vec![0x7f; 9]];
    for len in [1, 7, 8, 9, 148, 156, 512] {
        cases.push((0..len).map(|_| next()).collect());
    }
    for bytes in cases {
        let unsigned: u64 = bytes.iter().map(|&b| u64::from(b)).sum();
        let signed: i64 = bytes.iter().map(|&b| i64::from(b.cast_signed())).sum();
        assert_eq!(super::byte_sums(&bytes), (unsigned, signed), "{bytes:?}");
    }
}
