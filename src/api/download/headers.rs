//! Header values describing a downloaded file: `Content-Type` from a built-in table of
//! extensions, `Content-Disposition` from its name, its strong `ETag`, and the time its
//! `Last-Modified` shows; which types are worth compressing, and the ETag of the compressed form.
//!
//! Pure functions of names and numbers; the handler supplies them.

/// `Content-Type` for a file name by its extension (ASCII case-insensitive);
/// `application/octet-stream` when the extension is unknown or absent. A leading dot starts no
/// extension (`.bashrc`). No charset is claimed: the bytes of a text file are not known to be UTF-8.
pub fn content_type(name: &str) -> &'static str {
    let extension = match name.rfind('.') {
        Some(dot) if dot > 0 => &name[dot + 1..],
        _ => return OCTET_STREAM,
    };
    let extension = extension.to_ascii_lowercase();
    MIME_TYPES
        .iter()
        .find(|(ext, _)| *ext == extension)
        .map_or(OCTET_STREAM, |(_, mime)| mime)
}

const OCTET_STREAM: &str = "application/octet-stream";

const MIME_TYPES: &[(&str, &str)] = &[
    ("7z", "application/x-7z-compressed"),
    ("avif", "image/avif"),
    ("bmp", "image/bmp"),
    ("bz2", "application/x-bzip2"),
    ("c", "text/x-c"),
    ("css", "text/css"),
    ("csv", "text/csv"),
    ("gif", "image/gif"),
    ("gz", "application/gzip"),
    ("h", "text/x-c"),
    ("htm", "text/html"),
    ("html", "text/html"),
    ("ico", "image/vnd.microsoft.icon"),
    ("ipynb", "application/x-ipynb+json"),
    ("jpeg", "image/jpeg"),
    ("jpg", "image/jpeg"),
    ("js", "text/javascript"),
    ("json", "application/json"),
    ("jsonl", "application/jsonl"),
    ("log", "text/plain"),
    ("md", "text/markdown"),
    ("mjs", "text/javascript"),
    ("mp3", "audio/mpeg"),
    ("mp4", "video/mp4"),
    ("oga", "audio/ogg"),
    ("ogg", "audio/ogg"),
    ("ogv", "video/ogg"),
    ("otf", "font/otf"),
    ("parquet", "application/vnd.apache.parquet"),
    ("pdf", "application/pdf"),
    ("png", "image/png"),
    ("py", "text/x-python"),
    ("rs", "text/x-rust"),
    ("sh", "application/x-sh"),
    ("svg", "image/svg+xml"),
    ("tar", "application/x-tar"),
    ("tgz", "application/gzip"),
    ("toml", "application/toml"),
    ("ts", "text/typescript"),
    ("tsv", "text/tab-separated-values"),
    ("ttf", "font/ttf"),
    ("txt", "text/plain"),
    ("wasm", "application/wasm"),
    ("wav", "audio/wav"),
    ("webm", "video/webm"),
    ("webp", "image/webp"),
    ("woff", "font/woff"),
    ("woff2", "font/woff2"),
    ("xml", "application/xml"),
    ("xz", "application/x-xz"),
    ("yaml", "application/yaml"),
    ("yml", "application/yaml"),
    ("zip", "application/zip"),
    ("zst", "application/zstd"),
];

/// Whether a file of `content_type` (one of [`content_type`]'s answers) is worth compressing.
///
/// Not: formats that are compressed already (images but BMP, SVG and icons; audio; video;
/// archives and compressed streams; WOFF fonts; PDF; Parquet), where gzip spends CPU to gain a
/// percent or two, or to lose a few bytes. Everything else is, `application/octet-stream`
/// included: a file without a known extension is as often a log or a `Makefile` as a binary.
pub fn compressible(content_type: &str) -> bool {
    let packed = match content_type.split_once('/') {
        Some(("image", subtype)) => !matches!(subtype, "svg+xml" | "bmp" | "vnd.microsoft.icon"),
        Some(("audio" | "video", _)) => true,
        _ => PACKED_TYPES.contains(&content_type),
    };
    !packed
}

/// The types of [`MIME_TYPES`] outside `image/`, `audio/` and `video/` whose bytes are
/// compressed already.
const PACKED_TYPES: &[&str] = &[
    "application/gzip",
    "application/pdf",
    "application/vnd.apache.parquet",
    "application/x-7z-compressed",
    "application/x-bzip2",
    "application/x-xz",
    "application/zip",
    "application/zstd",
    "font/woff",
    "font/woff2",
];

/// `Content-Disposition: inline` naming `name` (RFC 6266).
///
/// A name of printable ASCII without `"` or `\` is sent quoted as it is, which every client
/// reads (curl's `-J` included). Any other name gets both an ASCII fallback in `filename=`
/// (each offending character replaced by `_`) and the exact name in
/// `filename*=utf-8''<percent-encoded>` (RFC 8187), which browsers prefer. Control characters
/// never reach the header.
// Called from several handlers: one copy in the binary, not one inlined into each.
#[inline(never)]
pub fn content_disposition(name: &str) -> String {
    let safe = |c: char| (' '..='~').contains(&c) && c != '"' && c != '\\';
    if name.chars().all(safe) {
        return format!("inline; filename=\"{name}\"");
    }
    let fallback: String = name
        .chars()
        .map(|c| if safe(c) { c } else { '_' })
        .collect();
    let mut encoded = String::with_capacity(name.len() * 3);
    for &byte in name.as_bytes() {
        if byte.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    format!("inline; filename=\"{fallback}\"; filename*=utf-8''{encoded}")
}

/// The strong ETag of a file version: device, inode, size and modification time in nanoseconds,
/// in hex. A rewrite in place changes the size or the time; a replacement changes the inode.
pub fn etag(dev: u64, ino: u64, size: u64, mtime_secs: i64, mtime_nsec: i64) -> String {
    let nanos = i128::from(mtime_secs) * 1_000_000_000 + i128::from(mtime_nsec);
    format!("\"{dev:x}-{ino:x}-{size:x}-{nanos:x}\"")
}

/// The ETag of the gzip form of the file version whose ETag is `etag` (`"..."`): weak, as two
/// compressors (another level, another release of sandboxd) may give other bytes for the same
/// file, and with `-gzip` inside the quotes, so no comparison mistakes one form for the other.
pub fn gzip_etag(etag: &str) -> String {
    let opaque = etag.strip_prefix('"').and_then(|e| e.strip_suffix('"'));
    format!("W/\"{}-gzip\"", opaque.unwrap_or(etag))
}

/// 0000-01-01T00:00:00Z and 9999-12-31T23:59:59Z: the first and last instants an IMF-fixdate
/// (a four-digit year) can show.
const FIRST_DATE: i64 = -62_167_219_200;
const LAST_DATE: i64 = 253_402_300_799;

/// The time `Last-Modified` shows for a file modified at `mtime`, answered at `now` (both Unix
/// seconds), or `None` when the header must be left out.
///
/// A modification time in the future (a clock set wrong when the file was written, `touch -d`,
/// an archive's dates) is replaced by `now`, as RFC 9110 §8.8.2.1 requires: the origin server
/// MUST NOT send a `Last-Modified` later than its `Date`, and a future date would make every
/// later `If-Modified-Since` of a client answer 304 after the file really changed. A time with
/// no IMF-fixdate (a year before 0000 or after 9999) has no valid date: `None`.
pub fn last_modified(mtime: i64, now: i64) -> Option<i64> {
    let shown = mtime.min(now);
    (FIRST_DATE..=LAST_DATE).contains(&shown).then_some(shown)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::date;

    #[test]
    fn last_modified_is_never_after_now_and_always_a_valid_date() {
        let now = 1_700_000_000;
        assert_eq!(last_modified(now - 5, now), Some(now - 5));
        assert_eq!(last_modified(now, now), Some(now));
        assert_eq!(last_modified(now + 1, now), Some(now));
        assert_eq!(last_modified(i64::MAX, now), Some(now));
        assert_eq!(last_modified(0, now), Some(0));
        assert_eq!(last_modified(-1, now), Some(-1));
        assert_eq!(date::format(FIRST_DATE), "Sat, 01 Jan 0000 00:00:00 GMT");
        assert_eq!(date::format(LAST_DATE), "Fri, 31 Dec 9999 23:59:59 GMT");
        assert_eq!(last_modified(FIRST_DATE, now), Some(FIRST_DATE));
        assert_eq!(last_modified(FIRST_DATE - 1, now), None);
        assert_eq!(last_modified(i64::MIN, now), None);
        // A clock past 9999 has no date to show either.
        assert_eq!(last_modified(LAST_DATE + 10, LAST_DATE + 1), None);
        assert_eq!(last_modified(LAST_DATE + 10, LAST_DATE), Some(LAST_DATE));
        for shown in [FIRST_DATE, -1, 0, now, LAST_DATE] {
            assert_eq!(date::parse(&date::format(shown)), Some(shown), "{shown}");
        }
    }

    #[test]
    fn content_type_by_extension() {
        assert_eq!(content_type("a.txt"), "text/plain");
        assert_eq!(content_type("report.PDF"), "application/pdf");
        assert_eq!(content_type("photo.JpEg"), "image/jpeg");
        assert_eq!(content_type("archive.tar.gz"), "application/gzip");
        assert_eq!(content_type("data.json"), "application/json");
        assert_eq!(content_type(".hidden.png"), "image/png");
    }

    #[test]
    fn content_type_defaults_to_octet_stream() {
        for name in [
            "Makefile",
            ".bashrc",
            ".txt",
            "a.",
            "a.unknownext",
            "a.txt.bak",
            "",
        ] {
            assert_eq!(content_type(name), "application/octet-stream", "{name}");
        }
    }

    #[test]
    fn mime_table_is_sorted_lowercase_and_unique() {
        for pair in MIME_TYPES.windows(2) {
            assert!(pair[0].0 < pair[1].0, "{:?} {:?}", pair[0], pair[1]);
        }
        for (ext, _) in MIME_TYPES {
            assert_eq!(*ext, ext.to_ascii_lowercase());
        }
    }

    #[test]
    fn plain_names_are_quoted() {
        assert_eq!(content_disposition("a.txt"), "inline; filename=\"a.txt\"");
        assert_eq!(
            content_disposition("my report (final).pdf"),
            "inline; filename=\"my report (final).pdf\""
        );
        assert_eq!(
            content_disposition(".bashrc"),
            "inline; filename=\".bashrc\""
        );
        assert_eq!(
            content_disposition("a;b=c,d.txt"),
            "inline; filename=\"a;b=c,d.txt\""
        );
    }

    #[test]
    fn quotes_and_backslashes_use_the_extended_form() {
        assert_eq!(
            content_disposition("say \"hi\".txt"),
            "inline; filename=\"say _hi_.txt\"; filename*=utf-8''say%20%22hi%22.txt"
        );
        assert_eq!(
            content_disposition("a\\b"),
            "inline; filename=\"a_b\"; filename*=utf-8''a%5Cb"
        );
    }

    #[test]
    fn non_ascii_uses_the_extended_form() {
        assert_eq!(
            content_disposition("résumé.pdf"),
            "inline; filename=\"r_sum_.pdf\"; filename*=utf-8''r%C3%A9sum%C3%A9.pdf"
        );
        assert_eq!(
            content_disposition("数据.csv"),
            "inline; filename=\"__.csv\"; filename*=utf-8''%E6%95%B0%E6%8D%AE.csv"
        );
    }

    #[test]
    fn control_characters_never_reach_the_header() {
        let value = content_disposition("evil\r\nSet-Cookie: x\t.txt");
        assert!(!value.chars().any(|c| c.is_control()), "{value:?}");
        assert_eq!(
            value,
            "inline; filename=\"evil__Set-Cookie: x_.txt\"; \
             filename*=utf-8''evil%0D%0ASet-Cookie%3A%20x%09.txt"
        );
    }

    #[test]
    fn compressed_formats_are_not_worth_compressing() {
        for name in [
            "a.png",
            "a.jpg",
            "a.gif",
            "a.webp",
            "a.avif",
            "a.mp3",
            "a.wav",
            "a.ogg",
            "a.mp4",
            "a.webm",
            "a.gz",
            "a.tgz",
            "a.zip",
            "a.7z",
            "a.bz2",
            "a.xz",
            "a.zst",
            "a.woff",
            "a.woff2",
            "a.pdf",
            "a.parquet",
        ] {
            assert!(!compressible(content_type(name)), "{name}");
        }
        for name in [
            "a.txt", "a.log", "a.csv", "a.json", "a.html", "a.svg", "a.bmp", "a.ico", "a.wasm",
            "a.tar", "a.ttf", "a.otf", "a.py", "Makefile", "a.bin", "a.ipynb",
        ] {
            assert!(compressible(content_type(name)), "{name}");
        }
        // Every packed type is one the table can give.
        for packed in PACKED_TYPES {
            assert!(
                MIME_TYPES.iter().any(|(_, mime)| mime == packed),
                "{packed}"
            );
        }
    }

    #[test]
    fn gzip_etag_is_weak_and_distinct() {
        assert_eq!(gzip_etag("\"801-2a-400-17a\""), "W/\"801-2a-400-17a-gzip\"");
        assert_ne!(gzip_etag("\"a\""), "\"a\"");
    }

    #[test]
    fn etag_is_hex_of_every_part() {
        assert_eq!(etag(0x801, 42, 1024, 1, 5), "\"801-2a-400-3b9aca05\"");
        assert_eq!(etag(0, 0, 0, 0, 0), "\"0-0-0-0\"");
        assert_ne!(etag(1, 2, 3, 4, 5), etag(1, 2, 3, 4, 6));
        assert_ne!(etag(1, 2, 3, 4, 5), etag(1, 2, 4, 4, 5));
        assert_ne!(etag(1, 2, 3, 4, 5), etag(1, 3, 3, 4, 5));
        assert_ne!(etag(1, 2, 3, 4, 5), etag(2, 2, 3, 4, 5));
    }
}
