//! Reading an archive as its bytes arrive: [`Reader::advance`] is fed whatever the body brought
//! and says what it found, so no member is ever held whole and the caller needs no buffer.
//!
//! Read: ustar and GNU headers (checksums checked), pax extended headers (`x`: `path`,
//! `linkpath`, `size`, `uid`, `gid`, `uname`, `gname`, `mtime`, `SCHILY.xattr.*`; others
//! ignored) and global ones (`g`, ignored), GNU long names (`L`, `K`), octal and base-256
//! numbers. An extended header or a long name is held in memory, at most [`MAX_EXTENDED`]
//! bytes. The archive ends at its first zero block (a second one, and anything after, is
//! ignored, as GNU tar pads archives to 10 KiB records); a body that ends before it is an
//! error, so an archive cut at a member boundary is never taken for a whole one.

use std::fmt;
use std::ops::Range;

use super::{byte_sums, Kind, BLOCK, XATTR_RECORD};

/// The most bytes of one member's extended headers (pax records, GNU long names) together.
pub const MAX_EXTENDED: usize = 64 * 1024;

/// A member's header, with its extended records applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: Vec<u8>,
    pub kind: Kind,
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub size: u64,
    /// Seconds and nanoseconds since the epoch.
    pub mtime: (i64, u32),
    pub link: Vec<u8>,
    /// `SCHILY.xattr.<name>` records: (name, value).
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// What the reader found in the bytes it was given.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// A member begins; its data (if any) follows as [`Event::Data`].
    Member(Entry),
    /// Bytes of the current member's data: this range of the input just given.
    Data(Range<usize>),
    /// The current member's data is complete.
    MemberEnd,
    /// The end-of-archive block.
    End,
    /// Every byte given was taken; more are needed.
    NeedMore,
}

/// Why the bytes are not a tar archive sandboxd reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TarError {
    Checksum { offset: u64 },
    Field { offset: u64, field: &'static str },
    ExtendedTooLarge { offset: u64, size: u64 },
    Record { offset: u64, reason: &'static str },
    Truncated,
}

impl fmt::Display for TarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TarError::Checksum { offset } => {
                write!(f, "the header at byte {offset} has a wrong checksum")
            }
            TarError::Field { offset, field } => {
                write!(
                    f,
                    "the header at byte {offset} has an invalid {field} field"
                )
            }
            TarError::ExtendedTooLarge { offset, size } => write!(
                f,
                "the extended header at byte {offset} has {size} bytes, more than {MAX_EXTENDED}"
            ),
            TarError::Record { offset, reason } => {
                write!(f, "the pax header at byte {offset} is malformed: {reason}")
            }
            TarError::Truncated => f.write_str("the archive ends before its end-of-archive block"),
        }
    }
}

#[derive(Debug)]
enum State {
    /// Collecting a header block.
    Header,
    /// Collecting an extended header's data (`flag`), `left` bytes more.
    Extended { flag: u8, left: u64 },
    /// Passing on a member's data, `left` bytes more.
    Data { left: u64 },
    /// Skipping the zero bytes after a member's data (or an extended header's).
    Padding { left: usize, member: bool },
    /// After the end-of-archive block: everything is ignored.
    Ended,
}

/// The pending extended values for the next member.
#[derive(Debug, Default)]
struct Extended {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
    uid: Option<u64>,
    gid: Option<u64>,
    mtime: Option<(i64, u32)>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Bytes of extended data read for this member so far.
    bytes: usize,
}

/// A tar reader fed bytes as they come.
#[derive(Debug)]
pub struct Reader {
    state: State,
    block: Vec<u8>,
    data: Vec<u8>,
    extended: Extended,
    /// Bytes of the archive taken so far.
    offset: u64,
    /// The offset of the header being read (for errors).
    header_at: u64,
    /// The size of the current member's data (for its padding).
    data_size: u64,
}

impl Default for Reader {
    fn default() -> Reader {
        Reader::new()
    }
}

impl Reader {
    pub fn new() -> Reader {
        Reader {
            state: State::Header,
            block: Vec::with_capacity(BLOCK),
            data: Vec::new(),
            extended: Extended::default(),
            offset: 0,
            header_at: 0,
            data_size: 0,
        }
    }

    /// Takes bytes from the start of `input` and says what they held: how many were taken
    /// and the event. [`Event::NeedMore`] comes with all of `input` taken; call again with the
    /// rest after any other event.
    pub fn advance(&mut self, input: &[u8]) -> Result<(usize, Event), TarError> {
        let mut used = 0;
        loop {
            let rest = &input[used..];
            match &mut self.state {
                State::Ended => return Ok((input.len(), Event::NeedMore)),
                State::Header => {
                    let take = (BLOCK - self.block.len()).min(rest.len());
                    self.block.extend_from_slice(&rest[..take]);
                    used += take;
                    self.offset += take as u64;
                    if self.block.len() < BLOCK {
                        return Ok((used, Event::NeedMore));
                    }
                    if let Some(event) = self.header()? {
                        return Ok((used, event));
                    }
                }
                State::Extended { flag, left } => {
                    let flag = *flag;
                    let take = usize::try_from(*left).map_or(rest.len(), |l| l.min(rest.len()));
                    self.data.extend_from_slice(&rest[..take]);
                    *left -= take as u64;
                    used += take;
                    self.offset += take as u64;
                    if *left > 0 {
                        return Ok((used, Event::NeedMore));
                    }
                    let data = std::mem::take(&mut self.data);
                    self.apply_extended(flag, &data)?;
                    self.state = State::Padding {
                        left: super::padding(data.len() as u64),
                        member: false,
                    };
                }
                State::Data { left } => {
                    if *left == 0 {
                        self.state = State::Padding {
                            left: 0,
                            member: true,
                        };
                        continue;
                    }
                    if rest.is_empty() {
                        return Ok((used, Event::NeedMore));
                    }
                    let take = usize::try_from(*left).map_or(rest.len(), |l| l.min(rest.len()));
                    *left -= take as u64;
                    self.offset += take as u64;
                    if *left == 0 {
                        self.state = State::Padding {
                            left: self.pending_padding(),
                            member: true,
                        };
                    }
                    return Ok((used + take, Event::Data(used..used + take)));
                }
                State::Padding { left, member } => {
                    let take = (*left).min(rest.len());
                    *left -= take;
                    used += take;
                    self.offset += take as u64;
                    if *left > 0 {
                        return Ok((used, Event::NeedMore));
                    }
                    let member = *member;
                    self.state = State::Header;
                    if member {
                        return Ok((used, Event::MemberEnd));
                    }
                }
            }
        }
    }

    /// The body ended: an error unless the end-of-archive block was read.
    pub fn finish(&self) -> Result<(), TarError> {
        match self.state {
            State::Ended => Ok(()),
            _ => Err(TarError::Truncated),
        }
    }

    /// The padding after the current member's data, from its size (kept in `data_size`).
    fn pending_padding(&self) -> usize {
        super::padding(self.data_size)
    }
}

impl Reader {
    /// A complete header block: the event it makes, or `None` when it was an extended header
    /// whose data comes next.
    fn header(&mut self) -> Result<Option<Event>, TarError> {
        let block = std::mem::take(&mut self.block);
        self.header_at = self.offset - BLOCK as u64;
        let result = self.parse_header(&block);
        self.block = block;
        self.block.clear();
        result
    }

    fn parse_header(&mut self, b: &[u8]) -> Result<Option<Event>, TarError> {
        let at = self.header_at;
        if b.iter().all(|&byte| byte == 0) {
            self.state = State::Ended;
            return Ok(Some(Event::End));
        }
        let stored = number(&b[148..156]).ok_or(TarError::Checksum { offset: at })?;
        // The sums with the checksum field counted as eight spaces: whole-block sums first,
        // then the field's bytes swapped for the spaces. Some old writers summed signed bytes.
        let (block_unsigned, block_signed) = byte_sums(b);
        let (field_unsigned, field_signed) = byte_sums(&b[148..156]);
        let spaces = 8 * u64::from(b' ');
        let unsigned = block_unsigned - field_unsigned + spaces;
        let signed = block_signed - field_signed + spaces.cast_signed();
        if stored != unsigned && i64::try_from(stored).ok() != Some(signed) {
            return Err(TarError::Checksum { offset: at });
        }
        let field = |field| TarError::Field { offset: at, field };
        let size = number(&b[124..136]).ok_or(field("size"))?;
        let flag = b[156];
        if matches!(flag, b'x' | b'g' | b'L' | b'K') {
            let total = (self.extended.bytes as u64).saturating_add(size);
            if total > MAX_EXTENDED as u64 {
                return Err(TarError::ExtendedTooLarge { offset: at, size });
            }
            self.extended.bytes = usize::try_from(total).unwrap_or(MAX_EXTENDED);
            self.data.clear();
            self.state = State::Extended { flag, left: size };
            return Ok(None);
        }
        let extended = std::mem::take(&mut self.extended);
        let kind = match flag {
            b'0' | b'\0' | b'7' => Kind::File,
            b'5' => Kind::Dir,
            b'2' => Kind::Symlink,
            b'1' => Kind::HardLink,
            b'3' | b'4' | b'6' => Kind::Special(flag),
            other => Kind::Other(other),
        };
        let ustar = &b[257..263] == b"ustar\0";
        let path = match extended.path {
            Some(path) => path,
            None => {
                let name = until_nul(&b[0..100]);
                let prefix = until_nul(&b[345..500]);
                if ustar && !prefix.is_empty() {
                    [prefix, b"/", name].concat()
                } else {
                    name.to_vec()
                }
            }
        };
        let size = extended.size.unwrap_or(size);
        // Only a regular file's size is data (GNU tar writes 0 for the others; a hard link
        // with a size carries no data either, as pax says).
        let data = if kind == Kind::File || matches!(kind, Kind::Other(_)) {
            size
        } else {
            0
        };
        let mode = number(&b[100..108]).ok_or(field("mode"))?;
        let entry = Entry {
            path,
            kind,
            mode: u32::try_from(mode & 0o7777).unwrap_or(0),
            uid: match extended.uid {
                Some(uid) => uid,
                None => number(&b[108..116]).ok_or(field("uid"))?,
            },
            gid: match extended.gid {
                Some(gid) => gid,
                None => number(&b[116..124]).ok_or(field("gid"))?,
            },
            size,
            mtime: match extended.mtime {
                Some(mtime) => mtime,
                None => {
                    let secs = number(&b[136..148]).ok_or(field("mtime"))?;
                    (i64::try_from(secs).map_err(|_| field("mtime"))?, 0)
                }
            },
            link: extended
                .link
                .unwrap_or_else(|| until_nul(&b[157..257]).to_vec()),
            xattrs: extended.xattrs,
        };
        self.data_size = data;
        self.state = State::Data { left: data };
        Ok(Some(Event::Member(entry)))
    }

    /// Applies a complete extended header's data to the next member.
    fn apply_extended(&mut self, flag: u8, data: &[u8]) -> Result<(), TarError> {
        match flag {
            b'L' => self.extended.path = Some(until_nul(data).to_vec()),
            b'K' => self.extended.link = Some(until_nul(data).to_vec()),
            b'x' => self.apply_records(data)?,
            // Global headers: nothing sandboxd uses is read from them.
            _ => {}
        }
        Ok(())
    }

    fn apply_records(&mut self, mut data: &[u8]) -> Result<(), TarError> {
        let offset = self.header_at;
        let bad = |reason| TarError::Record { offset, reason };
        while !data.is_empty() {
            let space = data
                .iter()
                .position(|&b| b == b' ')
                .ok_or(bad("a record without a length"))?;
            let len: usize = std::str::from_utf8(&data[..space])
                .ok()
                .and_then(|text| text.parse().ok())
                .ok_or(bad("a record length that is not a number"))?;
            if len <= space + 1 || len > data.len() || data[len - 1] != b'\n' {
                return Err(bad("a record length that does not end at a newline"));
            }
            let record = &data[space + 1..len - 1];
            data = &data[len..];
            let equals = record
                .iter()
                .position(|&b| b == b'=')
                .ok_or(bad("a record without '='"))?;
            let (key, value) = (&record[..equals], &record[equals + 1..]);
            let decimal = |value: &[u8]| -> Result<u64, TarError> {
                std::str::from_utf8(value)
                    .ok()
                    .and_then(|text| text.parse().ok())
                    .ok_or(bad("a number that is not decimal"))
            };
            let extended = &mut self.extended;
            match key {
                // A name with a NUL names no file: the archive's fault, before a C string fails.
                b"path" => extended.path = Some(name(value).ok_or(bad("a path with a NUL byte"))?),
                b"linkpath" => {
                    extended.link = Some(name(value).ok_or(bad("a linkpath with a NUL byte"))?)
                }
                b"size" => extended.size = Some(decimal(value)?),
                b"uid" => extended.uid = Some(decimal(value)?),
                b"gid" => extended.gid = Some(decimal(value)?),
                b"mtime" => extended.mtime = Some(pax_time(value).ok_or(bad("a bad mtime"))?),
                _ => {
                    if let Some(name) = key.strip_prefix(XATTR_RECORD) {
                        extended.xattrs.push((name.to_vec(), value.to_vec()));
                    }
                }
            }
        }
        Ok(())
    }
}

/// A pax record's name value, unless it holds a NUL byte (which no file name can).
fn name(value: &[u8]) -> Option<Vec<u8>> {
    (!value.contains(&0)).then(|| value.to_vec())
}

/// A field up to its first NUL.
fn until_nul(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    &field[..end]
}

/// A numeric field: octal digits between optional spaces and NULs, or GNU's base-256 (the
/// first byte's high bit set; negative values refused).
fn number(field: &[u8]) -> Option<u64> {
    if field.first().is_some_and(|&b| b & 0x80 != 0) {
        if field[0] & 0x40 != 0 {
            return None;
        }
        let mut value: u64 = u64::from(field[0] & 0x3f);
        for &byte in &field[1..] {
            value = value.checked_mul(256)?.checked_add(u64::from(byte))?;
        }
        return Some(value);
    }
    let text = until_nul(field);
    let text = text.trim_ascii();
    if text.is_empty() {
        return Some(0);
    }
    let mut value: u64 = 0;
    for &byte in text {
        if !(b'0'..=b'7').contains(&byte) {
            return None;
        }
        value = value.checked_mul(8)?.checked_add(u64::from(byte - b'0'))?;
    }
    Some(value)
}

/// A pax time, `[-]<seconds>[.<fraction>]`, to seconds and nanoseconds (the fraction cut to
/// nine digits).
fn pax_time(value: &[u8]) -> Option<(i64, u32)> {
    let text = std::str::from_utf8(value).ok()?;
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs: i64 = whole.parse().ok()?;
    let digits = &fraction[..fraction.len().min(9)];
    let nsec: u32 = if digits.is_empty() {
        0
    } else {
        format!("{digits:0<9}").parse().ok()?
    };
    if !negative {
        return Some((secs, nsec));
    }
    if nsec == 0 {
        Some((secs.checked_neg()?, 0))
    } else {
        Some((secs.checked_neg()?.checked_sub(1)?, 1_000_000_000 - nsec))
    }
}

#[cfg(test)]
mod tests;
