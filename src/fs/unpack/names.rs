//! A member's name, checked before anything is made for it: relative, without `..`, within the
//! path limits. Pure: the tree on disk is `unpack`'s to check.

/// The longest component a name may have (`NAME_MAX`).
pub const NAME_MAX: usize = 255;
/// The longest path a member may make, the destination's included (`PATH_MAX` less its NUL).
pub const PATH_MAX: usize = 4095;

/// The components of the member name `raw` (empty for the top directory itself: `.`, `./`).
/// `.` and empty components are dropped; `base_len` is the destination's path length, counted
/// in the path limit. The error says why the name is refused.
pub fn components(raw: &[u8], base_len: usize) -> Result<Vec<&[u8]>, String> {
    if raw.is_empty() {
        return Err("has an empty name".into());
    }
    if raw[0] == b'/' {
        return Err("has an absolute name".into());
    }
    let mut parts = Vec::new();
    let mut len = base_len;
    for part in raw.split(|&b| b == b'/') {
        match part {
            b"" | b"." => continue,
            b".." => return Err("has a '..' component".into()),
            _ if part.len() > NAME_MAX => {
                return Err(format!("has a component over {NAME_MAX} bytes"))
            }
            _ => {
                len += 1 + part.len();
                parts.push(part);
            }
        }
    }
    if len > PATH_MAX {
        return Err(format!("makes a path of {len} bytes, more than {PATH_MAX}"));
    }
    Ok(parts)
}

/// The member's name as shown in errors: as sent, invalid UTF-8 replaced (only when an error
/// shows it: most members never need it).
pub fn shown(raw: &[u8]) -> Shown<'_> {
    Shown(raw)
}

/// A member's name to show: see [`shown`].
#[derive(Clone, Copy)]
pub struct Shown<'a>(&'a [u8]);

impl std::fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_names_split_into_components() {
        assert_eq!(
            components(b"a/b/c.txt", 5).unwrap(),
            [&b"a"[..], b"b", b"c.txt"]
        );
        assert_eq!(components(b"./a//b/", 5).unwrap(), [&b"a"[..], b"b"]);
        assert!(components(b".", 5).unwrap().is_empty());
        assert!(components(b"./", 5).unwrap().is_empty());
        assert_eq!(components(b"a..b/..c", 5).unwrap(), [&b"a..b"[..], b"..c"]);
    }

    #[test]
    fn absolute_dot_dot_and_long_names_are_refused() {
        assert_eq!(
            components(b"/etc/passwd", 5).unwrap_err(),
            "has an absolute name"
        );
        assert_eq!(
            components(b"a/../../b", 5).unwrap_err(),
            "has a '..' component"
        );
        assert_eq!(components(b"..", 5).unwrap_err(), "has a '..' component");
        assert_eq!(components(b"", 5).unwrap_err(), "has an empty name");
        let long = vec![b'n'; 256];
        assert_eq!(
            components(&long, 5).unwrap_err(),
            "has a component over 255 bytes"
        );
        assert!(components(&long[..255], 5).is_ok());
        let deep = [&b"d/"[..]; 2100].concat();
        assert_eq!(
            components(&deep, 10).unwrap_err(),
            "makes a path of 4210 bytes, more than 4095"
        );
        assert!(components(&deep[..4000], 10).is_ok());
    }
}
