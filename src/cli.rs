//! The subcommands that are not the daemon: `--healthcheck` and `sign`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::ExitCode;
use std::time::Duration;

use crate::auth::{self, Operation};
use crate::config::{SignRequest, ACCESS_TOKEN, ACCESS_TOKEN_FILE};
use crate::http::date;
use crate::token;

/// Probes `/health` at the first of `addrs` that accepts (`target` is how they were given, for
/// the messages): 0 when it answers 204, 1 otherwise (for images without curl).
pub fn healthcheck(target: &str, addrs: &[SocketAddr]) -> ExitCode {
    let timeout = Duration::from_secs(3);
    let addr = target;
    let result = (|| -> std::io::Result<bool> {
        let mut last = None;
        let mut connected = None;
        for candidate in addrs {
            match TcpStream::connect_timeout(candidate, timeout) {
                Ok(stream) => {
                    connected = Some(stream);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let mut stream = connected
            .ok_or_else(|| last.unwrap_or_else(|| std::io::Error::other("not an address")))?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.write_all(b"GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
        let mut reply = [0u8; 16];
        let mut len = 0;
        while len < reply.len() {
            match stream.read(&mut reply[len..])? {
                0 => break,
                n => len += n,
            }
        }
        Ok(reply[..len].starts_with(b"HTTP/1.1 204 "))
    })();
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("sandboxd: {addr} is not healthy");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("sandboxd: cannot probe {addr}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Prints a signed URL for `request`; the token comes from the token file or
/// `SANDBOXD_ACCESS_TOKEN` (`token::load`). Without a usable token the exit code is 2.
pub fn sign(request: &SignRequest) -> ExitCode {
    let from_env = std::env::var(ACCESS_TOKEN.env).ok();
    let token = match token::load(request.access_token_file.as_deref(), from_env) {
        Ok(Some(token)) => token,
        Ok(None) => {
            let flag = ACCESS_TOKEN_FILE.opt.name();
            eprintln!("sandboxd: set {} or {flag}", ACCESS_TOKEN.env);
            return ExitCode::from(2);
        }
        Err(message) => {
            eprintln!("sandboxd: {message}");
            return ExitCode::from(2);
        }
    };
    let operation = if request.write {
        Operation::Write
    } else {
        Operation::Read
    };
    let expiration = date::now_unix().saturating_add(request.expires_in);
    let query = auth::signed_url_query(
        &request.path,
        operation,
        &request.username,
        &token,
        expiration,
        request.version,
    );
    let format = if request.tar { "&format=tar" } else { "" };
    println!("{}/files?{query}{format}", request.base_url);
    ExitCode::SUCCESS
}
