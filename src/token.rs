//! Where the access token comes from, for the daemon and for `sandboxd sign`: the file named by
//! `--access-token-file`, else `SANDBOXD_ACCESS_TOKEN`. Whitespace around it (a trailing
//! newline) is not part of it, and an empty token is refused. Scrubbing the variable from the
//! environment is the daemon's business (`daemon`), not this module's.

use std::path::Path;

/// The token from `file` if one is named, else `from_env` (the variable's value, which the
/// caller reads so that it can scrub it); `None` when neither is set.
pub fn load(file: Option<&Path>, from_env: Option<String>) -> Result<Option<String>, String> {
    let token = match file {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read access token file '{}': {e}", path.display()))?,
        None => match from_env {
            Some(token) => token,
            None => return Ok(None),
        },
    };
    let token = token.trim();
    if token.is_empty() {
        return Err("the access token is empty".into());
    }
    Ok(Some(token.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_wins_and_whitespace_is_not_part_of_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "from-file\n").unwrap();
        let env = || Some(" from-env ".to_string());
        assert_eq!(
            load(Some(&file), env()).unwrap().as_deref(),
            Some("from-file")
        );
        assert_eq!(load(None, env()).unwrap().as_deref(), Some("from-env"));
        assert_eq!(load(None, None).unwrap(), None);
        std::fs::write(&file, " \n").unwrap();
        assert_eq!(
            load(Some(&file), env()).unwrap_err(),
            "the access token is empty"
        );
        let missing = dir.path().join("missing");
        let error = load(Some(&missing), env()).unwrap_err();
        assert!(
            error.starts_with("cannot read access token file '"),
            "{error}"
        );
    }
}
