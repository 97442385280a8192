//! What clients written for envd rely on beyond the routes themselves: CORS (SPEC §9a), `/init`
//! as the orchestrator sends it (§9), `-version` (§1), the Connect paths (§9b), the idle
//! keep-alive default (§10) and `disk_used` as `df` counts it (§7).

use std::process::Command;

use crate::common::*;
use sandboxd::ENVD_VERSION;
use sha2::{Digest, Sha256};

const UNAUTHORIZED: &str =
    "unauthorized access, please provide a valid access token or method signing if supported";
const EXPOSED: &str =
    "Content-Disposition, ETag, Content-Range, Content-Length, X-Envd-Version, Location";

#[test]
fn a_cors_preflight_is_204_on_any_path_before_authentication() {
    let daemon = start();
    for path in [
        "/files?path=a.txt",
        "/envs",
        "/filesystem.Filesystem/Stat",
        "/nope",
    ] {
        let reply = daemon.call_with(
            "OPTIONS",
            path,
            &[
                ("Origin", "https://app.example"),
                ("Access-Control-Request-Method", "POST"),
                (
                    "Access-Control-Request-Headers",
                    "x-access-token, content-type",
                ),
            ],
            b"",
        );
        assert_eq!(reply.status, 204, "{path}: {}", reply.text());
        assert!(reply.body.is_empty());
        assert_eq!(reply.header("access-control-allow-origin"), Some("*"));
        assert_eq!(reply.header("access-control-allow-methods"), Some("POST"));
        assert_eq!(
            reply.header("access-control-allow-headers"),
            Some("x-access-token, content-type")
        );
        assert_eq!(reply.header("access-control-max-age"), Some("7200"));
    }
    // A plain OPTIONS is no preflight: the route's 405.
    let reply = daemon.call_with("OPTIONS", "/envs", &[("Origin", "https://a.example")], b"");
    assert_eq!(reply.status, 405);
    assert_eq!(reply.header("allow"), Some("GET, HEAD"));
}

#[test]
fn answers_to_requests_with_origin_carry_cors_headers() {
    let daemon = start();
    write_file(&daemon.home().join("a.txt"), b"abc");
    let origin = ("Origin", "https://app.example");
    let token = ("X-Access-Token", TOKEN);
    for (method, target, headers, status) in [
        ("GET", "/envs", vec![origin, token], 200),
        ("GET", "/envs", vec![origin], 401),
        (
            "GET",
            "/files?path=a.txt&username=user",
            vec![origin, token],
            200,
        ),
        ("POST", "/init", vec![origin, token], 204),
        ("GET", "/health", vec![origin], 204),
    ] {
        let reply = daemon.call_with(method, target, &headers, b"");
        assert_eq!(reply.status, status, "{method} {target}");
        assert_eq!(reply.header("access-control-allow-origin"), Some("*"));
        assert_eq!(reply.header("access-control-expose-headers"), Some(EXPOSED));
    }
    let reply = daemon.get("/envs");
    assert_eq!(reply.header("access-control-allow-origin"), None);
    assert_eq!(reply.header("access-control-expose-headers"), None);
    assert_eq!(reply.header("vary"), None);
    // A download a cache may keep varies on Origin, with and without it (and on
    // Accept-Encoding, which picks its coding: SPEC §6).
    let reply = daemon.get("/files?path=a.txt&username=user");
    assert_eq!(reply.body, b"abc");
    assert_eq!(reply.header("vary"), Some("Accept-Encoding, Origin"));
    assert_eq!(reply.header("access-control-allow-origin"), None);
}

fn init_with(daemon: &Daemon, headers: &[(&str, &str)], body: &str) -> Reply {
    daemon.call_with("POST", "/init", headers, body.as_bytes())
}

fn init(daemon: &Daemon, body: &str) -> Reply {
    init_with(daemon, &[("X-Access-Token", TOKEN)], body)
}

#[test]
fn init_answers_carry_no_store_and_the_envd_version_even_on_errors() {
    let daemon = start();
    for (headers, body, status) in [
        (vec![("X-Access-Token", TOKEN)], "{}", 204),
        (vec![], "{}", 401),
        (vec![("X-Access-Token", TOKEN)], "{not json", 400),
    ] {
        let reply = init_with(&daemon, &headers, body);
        assert_eq!(reply.status, status, "{body}");
        assert_eq!(reply.header("cache-control"), Some("no-store"));
        assert_eq!(reply.header("x-envd-version"), Some(ENVD_VERSION));
    }
}

#[test]
fn init_with_a_wrong_header_is_authorised_by_the_current_token_in_its_body() {
    let daemon = start();
    let body = format!(r#"{{"accessToken":"{TOKEN}","envVars":{{"V":"body"}}}}"#);
    let reply = init_with(&daemon, &[("X-Access-Token", "not-the-token")], &body);
    assert_eq!(reply.status, 204, "{}", reply.text());
    assert_eq!(daemon.get("/envs").json()["V"], "body");
    // A wrong header and no body token: refused, nothing applied.
    let reply = init_with(
        &daemon,
        &[("X-Access-Token", "not-the-token")],
        r#"{"envVars":{"V":"intruder"}}"#,
    );
    assert_eq!(reply.status, 401);
    assert_eq!(daemon.get("/envs").json()["V"], "body");
}

#[test]
fn refusals_of_the_http_layer_carry_cors_and_init_headers() {
    let daemon = start();
    let origin = ("Origin", "https://app.example");
    let token = ("X-Access-Token", TOKEN);
    // An /init body over the 1 MiB a JSON body may have: the layer's 413.
    let big = vec![b' '; (1 << 20) + 1];
    let reply = daemon.call_with("POST", "/init", &[origin, token], &big);
    assert_eq!(reply.status, 413);
    assert_eq!(reply.header("access-control-allow-origin"), Some("*"));
    assert_eq!(reply.header("access-control-expose-headers"), Some(EXPOSED));
    assert_eq!(reply.header("cache-control"), Some("no-store"));
    assert_eq!(reply.header("x-envd-version"), Some(ENVD_VERSION));
    // Bad framing on another route: the layer's 400, readable by a browser too.
    let reply = daemon.raw(
        b"GET /envs HTTP/1.1\r\nHost: h\r\nOrigin: https://app.example\r\nContent-Length: x\r\n\r\n",
    );
    assert_eq!(reply.status, 400);
    assert_eq!(reply.header("access-control-allow-origin"), Some("*"));
    assert_eq!(reply.header("x-envd-version"), None);
}

#[test]
fn an_init_older_than_the_last_applied_changes_nothing() {
    let daemon = start();
    let env = || daemon.get("/envs").json();
    let reply = init(
        &daemon,
        r#"{"timestamp":"2025-01-01T12:00:00Z","envVars":{"V":"noon"}}"#,
    );
    assert_eq!(reply.status, 204);
    assert_eq!(env()["V"], "noon");
    // Older, even by a nanosecond in another zone: 204 and nothing changes, the token included.
    let older = r#"{"timestamp":"2025-01-01T12:59:59.999999999+01:00","envVars":{"V":"older"},"accessToken":"stale-token"}"#;
    let reply = init(&daemon, older);
    assert_eq!(reply.status, 204);
    assert_eq!(reply.header("x-envd-version"), Some(ENVD_VERSION));
    assert_eq!(env()["V"], "noon");
    assert_eq!(daemon.get("/envs").status, 200, "the token is unchanged");
    // Equal applies (as envd's), and so does one without a timestamp.
    let equal = r#"{"timestamp":"2025-01-01T13:00:00+01:00","envVars":{"V":"equal"}}"#;
    assert_eq!(init(&daemon, equal).status, 204);
    assert_eq!(env()["V"], "equal");
    assert_eq!(init(&daemon, r#"{"envVars":{"V":"none"}}"#).status, 204);
    assert_eq!(env()["V"], "none");
    // An /init without a timestamp does not lower the bar.
    let reply = init(
        &daemon,
        r#"{"timestamp":"2024-12-31T00:00:00Z","envVars":{"V":"older"}}"#,
    );
    assert_eq!(reply.status, 204);
    assert_eq!(env()["V"], "none");
    // A stale /init is still authenticated first, and a malformed timestamp is 400.
    init_with(&daemon, &[], r#"{"timestamp":"2000-01-01T00:00:00Z"}"#)
        .assert_error(401, UNAUTHORIZED);
    init(&daemon, r#"{"timestamp":"2025-01-01 12:00:00"}"#).assert_error(
        400,
        "invalid timestamp '2025-01-01 12:00:00': not an RFC 3339 date-time like 2006-01-02T15:04:05Z",
    );
    // A newer /init that fails validation does not move the bar either.
    let reply = init(
        &daemon,
        r#"{"timestamp":"2030-01-01T00:00:00Z","defaultUser":"ghost"}"#,
    );
    assert_eq!(reply.status, 401);
    let reply = init(
        &daemon,
        r#"{"timestamp":"2026-01-01T00:00:00Z","envVars":{"V":"2026"}}"#,
    );
    assert_eq!(reply.status, 204);
    assert_eq!(env()["V"], "2026");
}

fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn the_host_rotates_the_token_through_the_hash_file() {
    let hash_dir = tempfile::tempdir().unwrap();
    let hash_file = hash_dir.path().join("token-hash");
    let daemon = builder()
        .arg("--init-token-hash-file")
        .arg(hash_file.to_str().unwrap())
        .start();
    let rotate = |token: &str| {
        init_with(
            &daemon,
            &[("X-Access-Token", "an-old-token")],
            &format!(r#"{{"accessToken":"{token}","envVars":{{"BY":"{token}"}}}}"#),
        )
    };
    // No file yet: the old token is still needed.
    rotate("resumed-1").assert_error(401, UNAUTHORIZED);
    std::fs::write(&hash_file, format!("{}\n", sha256_hex("resumed-1"))).unwrap();
    rotate("someone-else").assert_error(401, UNAUTHORIZED);
    let reply = rotate("resumed-1");
    assert_eq!(reply.status, 204, "{}", reply.text());
    assert_eq!(daemon.get("/envs").status, 401, "the old token is gone");
    let with_new = [("X-Access-Token", "resumed-1")];
    let reply = daemon.call_with("GET", "/envs", &with_new, b"");
    assert_eq!(reply.json()["BY"], "resumed-1");
    // The file is read on each /init: the host can authorise the next token the same way.
    std::fs::write(&hash_file, sha256_hex("resumed-2")).unwrap();
    assert_eq!(rotate("resumed-2").status, 204);
    let reply = daemon.call_with("GET", "/envs", &[("X-Access-Token", "resumed-2")], b"");
    assert_eq!(reply.status, 200);
    // An empty file authorises nothing (not even an empty token).
    std::fs::write(&hash_file, "").unwrap();
    rotate("resumed-3").assert_error(401, UNAUTHORIZED);
}

#[test]
fn go_style_version_prints_only_the_envd_level() {
    let output = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .arg("-version")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        format!("{ENVD_VERSION}\n")
    );
    assert!(output.stderr.is_empty());
    let parts: Vec<&str> = ENVD_VERSION.split('.').collect();
    assert!(
        parts.len() == 3 && parts.iter().all(|p| p.parse::<u32>().is_ok()),
        "a bare semver: {ENVD_VERSION}"
    );
}

#[test]
fn help_shows_the_640_second_idle_default_and_the_hash_file_flag() {
    let output = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(help.contains("SANDBOXD_IDLE_TIMEOUT       [640]"), "{help}");
    assert!(help.contains("--init-token-hash-file PATH"), "{help}");
    assert!(help.contains("-version"), "{help}");
}

#[test]
fn connect_paths_answer_connect_errors_never_a_plain_404() {
    let daemon = start();
    for (path, content_type, message) in [
        (
            "/process.Process/NoSuchMethod",
            "application/json",
            "process.Process/NoSuchMethod is not a method of process.Process",
        ),
        (
            "/filesystem.Filesystem/NoSuchMethod",
            "application/connect+json",
            "filesystem.Filesystem/NoSuchMethod is not a method of filesystem.Filesystem",
        ),
        // A method sent with the other framing than its own.
        (
            "/filesystem.Filesystem/Stat",
            "application/connect+json",
            "filesystem.Filesystem/Stat is a unary method: send application/json",
        ),
        (
            "/filesystem.Filesystem/WatchDir",
            "application/json",
            "filesystem.Filesystem/WatchDir is a server-streaming method: send \
             application/connect+json",
        ),
    ] {
        let headers = [("X-Access-Token", TOKEN), ("Content-Type", content_type)];
        let reply = daemon.call_with("POST", path, &headers, br#"{"path":"/tmp"}"#);
        assert_eq!(reply.status, 501, "{path}");
        assert_eq!(reply.header("content-type"), Some("application/json"));
        let json = reply.json();
        assert_eq!(json["code"], "unimplemented", "{path}");
        assert_eq!(json["message"], message);
        // Authentication first, answered as Connect's error too.
        let reply = daemon.call_with("POST", path, &headers[1..], b"{}");
        assert_eq!(reply.status, 401);
        assert_eq!(reply.json()["code"], "unauthenticated");
        assert_eq!(reply.json()["message"], UNAUTHORIZED);
    }
    for path in ["/filesystem.Filesystem/Stat", "/process.Process/List"] {
        let reply = daemon.get(path);
        assert_eq!(reply.status, 405);
        assert_eq!(reply.header("allow"), Some("POST"));
        assert_eq!(reply.json()["code"], "unimplemented");
    }
    // Other services and malformed procedures stay unknown routes.
    for path in [
        "/other.Service/Stat",
        "/filesystem.Filesystem/",
        "/process.Process/a/b",
    ] {
        daemon
            .call("POST", path, b"")
            .assert_error(404, &format!("no route for POST {path}"));
    }
}

#[test]
fn metrics_disk_used_is_blocks_less_free_blocks_as_df_counts() {
    let Ok(stat) = Command::new("stat")
        .args(["-f", "-c", "%b %f %a %S", "/"])
        .output()
    else {
        eprintln!("skipped: no coreutils stat");
        return;
    };
    let daemon = start();
    let metrics = daemon.get("/metrics").json();
    let text = String::from_utf8_lossy(&stat.stdout);
    let n: Vec<u64> = text
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    let (blocks, free, available, size) = (n[0], n[1], n[2], n[3]);
    let used = metrics["disk_used"].as_u64().unwrap();
    let expected = (blocks - free) * size;
    const SLACK: u64 = 64 << 20;
    assert!(
        used.abs_diff(expected) <= SLACK,
        "disk_used {used}, (f_blocks - f_bfree) * f_frsize = {expected}"
    );
    assert_eq!(metrics["disk_total"].as_u64(), Some(blocks * size));
    if (free - available) * size > 2 * SLACK {
        assert!(
            used.abs_diff((blocks - available) * size) > SLACK,
            "reserved blocks are not counted as used"
        );
    }
}
