//! Logs as E2B's platform collects them (SPEC §1): `--log-format json` on stderr, and envd's
//! exporter, which POSTs every line, with the sandbox's identity, to the collector the metadata
//! service names in `address`. The service and the collector are fakes on 127.0.0.1.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::mmds::FakeMmds;
use crate::common::{assert_health_within, builder, Daemon};

/// One POST the collector received: path, content type, body.
type Post = (String, String, Vec<u8>);

/// A logs collector on 127.0.0.1:0: records each POST's path, content type and body, and
/// answers `status`.
struct Collector {
    addr: SocketAddr,
    posts: Arc<Mutex<Vec<Post>>>,
}

impl Collector {
    fn start(status: u16) -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let posts = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&posts);
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let mut reader = BufReader::new(stream);
                let mut request_line = String::new();
                if reader.read_line(&mut request_line).is_err() {
                    continue;
                }
                let path = request_line.split(' ').nth(1).unwrap_or("").to_string();
                let (mut length, mut content_type) = (0, String::new());
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    let (name, value) = line.split_once(':').unwrap_or(("", ""));
                    match name.to_ascii_lowercase().as_str() {
                        "content-length" => length = value.trim().parse().unwrap_or(0),
                        "content-type" => content_type = value.trim().to_string(),
                        _ => {}
                    }
                }
                let mut body = vec![0; length];
                if reader.read_exact(&mut body).is_err() {
                    continue;
                }
                seen.lock().unwrap().push((path, content_type, body));
                let answer = format!(
                    "HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let _ = reader.get_mut().write_all(answer.as_bytes());
            }
        });
        Collector { addr, posts }
    }

    /// The bodies received, as JSON, once one satisfies `found` (at most 10 s).
    fn lines_with(&self, found: impl Fn(&Value) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let lines: Vec<Value> = self
                .posts
                .lock()
                .unwrap()
                .iter()
                .map(|(_, _, body)| serde_json::from_slice(body).expect("a JSON object per POST"))
                .collect();
            if lines.iter().any(&found) {
                return lines;
            }
            assert!(
                Instant::now() < deadline,
                "no such line collected: {lines:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn daemon_with(collector: &Collector, format: &str) -> (FakeMmds, Daemon, tempfile::TempDir) {
    let mmds = FakeMmds::start(json!({
        "instanceID": "isb-7", "envID": "tpl-7",
        "address": format!("http://{}/logs", collector.addr), "accessTokenHash": ""
    }));
    let root = tempfile::tempdir().unwrap();
    let daemon = mmds.daemon(builder().args(&["--log-format", format]), root.path());
    (mmds, daemon, root)
}

#[test]
fn every_line_reaches_the_collector_as_json_with_the_sandboxs_identity() {
    let collector = Collector::start(204);
    let (_mmds, daemon, _root) = daemon_with(&collector, "text");
    assert_eq!(daemon.get("/health").status, 204);
    let lines = collector.lines_with(|line| line["path"] == "/health");
    let health = lines.iter().find(|line| line["path"] == "/health").unwrap();
    assert_eq!(health["instanceID"], "isb-7");
    assert_eq!(health["envID"], "tpl-7");
    assert_eq!(health["level"], "info");
    assert_eq!(health["method"], "GET");
    assert_eq!(health["status"], 204);
    assert!(health["message"]
        .as_str()
        .unwrap()
        .starts_with("GET /health 204 0 "));
    assert!(health["operation_id"]
        .as_str()
        .unwrap()
        .parse::<u64>()
        .is_ok());
    assert!(health["timestamp"].as_str().unwrap().ends_with('Z'));
    // Lines from before the collector was known were queued and sent too.
    assert!(
        lines.iter().any(|line| line["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("open-file limit"))),
        "{lines:?}"
    );
    for (path, content_type, _) in collector.posts.lock().unwrap().iter() {
        assert_eq!(
            (path.as_str(), content_type.as_str()),
            ("/logs", "application/json")
        );
    }
    // stderr stays text.
    let log = daemon.log_with(|line| line.contains(" GET /health 204 "));
    assert!(log.iter().all(|line| !line.starts_with('{')), "{log:?}");
}

#[test]
fn json_lines_on_stderr_carry_envds_fields() {
    let daemon = builder().args(&["--log-format", "json"]).start();
    assert_eq!(daemon.get("/nope?path=a&signature=v1_SECRET").status, 404);
    let log = daemon.log_with(|line| line.contains("/nope"));
    for line in &log {
        let parsed: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
        assert_eq!(parsed["level"], "info", "{line}");
        assert!(
            parsed["timestamp"].is_string() && parsed["message"].is_string(),
            "{line}"
        );
        assert!(!line.contains("SECRET"), "{line}");
    }
    let request: Value = log
        .iter()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .find(|line| line["method"] == "GET")
        .unwrap();
    assert_eq!(request["path"], "/nope?path=a");
    assert_eq!(request["status"], 404);
    // Without a metadata service nothing is exported: no exporter thread, no collector.
}

#[test]
fn a_failing_collector_is_reported_on_stderr_only_and_requests_go_on() {
    let collector = Collector::start(500);
    let (_mmds, daemon, _root) = daemon_with(&collector, "text");
    let expected = format!(
        "log exporter: cannot send to http://{}/logs: the collector answered 500",
        collector.addr
    );
    daemon.log_with(|line| line.contains(&expected));
    assert_health_within(&daemon, Duration::from_secs(1));
    // The complaint itself is never sent to the collector it is about.
    let lines = collector.lines_with(|line| line["path"] == "/health");
    assert!(
        lines.iter().all(|line| !line["message"]
            .as_str()
            .unwrap_or("")
            .contains("log exporter")),
        "{lines:?}"
    );
}

#[test]
fn an_unknown_log_format_is_refused_at_start() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args(["--listen", "127.0.0.1:0", "--log-format", "yaml"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("--log-format must be text or json, not 'yaml'"),
        "{output:?}"
    );
}

#[test]
fn a_collector_address_that_is_not_an_http_ip_url_is_said_once_and_ignored() {
    for (address, reason) in [
        (
            "https://10.0.0.1/logs",
            "only http:// addresses are supported",
        ),
        (
            "http://logs.local/in",
            "the host 'logs.local' is not an IP address",
        ),
    ] {
        let mmds = FakeMmds::start(json!({
            "instanceID": "isb-8", "envID": "tpl-8", "address": address, "accessTokenHash": ""
        }));
        let root = tempfile::tempdir().unwrap();
        let daemon = mmds.daemon(builder(), root.path());
        let expected =
            format!("log exporter: ignoring the collector address '{address}': {reason}");
        daemon.log_with(|line| line.ends_with(&expected));
        // Every authorised /init reads the service again: the same address is not said again.
        // (Counted before the call: the /init may have read it by the time it answers.)
        let reads = mmds.reads();
        assert_eq!(daemon.call("POST", "/init", b"{}").status, 204);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while mmds.reads() < (reads + 1).max(2) {
            assert!(
                std::time::Instant::now() < deadline,
                "the /init read the service"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(100));
        let log = daemon.log();
        assert_eq!(
            log.iter().filter(|l| l.ends_with(&expected)).count(),
            1,
            "{log:?}"
        );
        assert_eq!(daemon.get("/health").status, 204);
    }
}

/// Lines queued for a collector not named yet cross a live upgrade: the next image sends them.
#[test]
fn lines_not_yet_sent_cross_a_live_upgrade() {
    let collector = Collector::start(200);
    let mmds = FakeMmds::start(json!({
        "instanceID": "isb-9", "envID": "tpl-9", "address": "", "accessTokenHash": ""
    }));
    let root = tempfile::tempdir().unwrap();
    let target = root.path().join("envd.next");
    let daemon = mmds.daemon(
        builder().args(&["--upgrade-path", target.to_str().unwrap()]),
        root.path(),
    );
    assert_eq!(daemon.call("POST", "/init", b"{}").status, 204);
    assert_eq!(
        daemon.get("/files?path=/marker-before-the-upgrade").status,
        404
    );
    assert_eq!(
        crate::upgrade::upgrade(&daemon, crate::common::TOKEN, &[], b""),
        ""
    );
    daemon.log_with(|l| l.contains("upgrade: took back"));
    let address = format!("http://{}/logs", collector.addr);
    mmds.set(|state| state.metadata["address"] = json!(address));
    assert_eq!(daemon.call("POST", "/init", b"{}").status, 204);
    // One line a POST, sent in order: once the new image's own line is in, so is every line
    // queued before the upgrade.
    let lines = collector.lines_with(|line| line.to_string().contains("upgrade: took back"));
    assert!(
        lines
            .iter()
            .any(|l| l.to_string().contains("marker-before-the-upgrade")),
        "{lines:?}"
    );
}
