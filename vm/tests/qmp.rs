//! QEMU's machine protocol (QMP) on the guest's Unix socket: one JSON command per line, its
//! `return` or `error` read back, events skipped. Used to stop, snapshot, resume and end a guest.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    /// Connects once QEMU has made the socket (within `limit`) and leaves capabilities mode.
    pub fn connect(path: &Path, limit: Duration) -> Qmp {
        let deadline = Instant::now() + limit;
        let socket = loop {
            match UnixStream::connect(path) {
                Ok(socket) => break socket,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("QMP socket {}: {e}", path.display()),
            }
        };
        socket
            .set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        let mut qmp = Qmp {
            reader: BufReader::new(socket.try_clone().unwrap()),
            writer: socket,
        };
        let greeting = qmp.line();
        assert!(greeting.get("QMP").is_some(), "not QMP: {greeting}");
        qmp.execute("qmp_capabilities", json!({})).unwrap();
        qmp
    }

    fn line(&mut self) -> Value {
        let mut line = String::new();
        let read = self.reader.read_line(&mut line).expect("QMP answer");
        assert!(read > 0, "QMP socket closed");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("QMP said {line:?}: {e}"))
    }

    /// Runs `command`; its `return`, or the error's description.
    pub fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, String> {
        let request = json!({"execute": command, "arguments": arguments});
        writeln!(self.writer, "{request}").expect("QMP write");
        loop {
            let answer = self.line();
            if let Some(value) = answer.get("return") {
                return Ok(value.clone());
            }
            if let Some(error) = answer.get("error") {
                return Err(error["desc"].as_str().unwrap_or("?").to_string());
            }
        }
    }

    /// `query-status`'s `status` (`running`, `paused`, `inmigrate`, `postmigrate`, ...).
    pub fn status(&mut self) -> String {
        let status = self.execute("query-status", json!({})).unwrap();
        status["status"].as_str().unwrap_or("").to_string()
    }
}
