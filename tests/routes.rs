//! Routing, errors, auth, /health, /envs and /init (SPEC §2, §3, §9).

use crate::common::*;

#[test]
fn health_is_204_without_auth() {
    let daemon = start();
    let reply = daemon.call_with("GET", "/health", &[], b"");
    assert_eq!(reply.status, 204);
    assert!(reply.body.is_empty());
    assert_eq!(reply.header("cache-control"), Some("no-store"));
    assert_eq!(reply.header("content-length"), None);
    assert_eq!(daemon.call_with("HEAD", "/health", &[], b"").status, 204);
}

#[test]
fn unknown_route_is_404_json() {
    let daemon = start();
    daemon
        .get("/nope")
        .assert_error(404, "no route for GET /nope");
    daemon
        .get("/health/")
        .assert_error(404, "no route for GET /health/");
    let reply = daemon.get("/nope");
    assert_eq!(reply.header("x-content-type-options"), Some("nosniff"));
}

#[test]
fn wrong_method_is_405_with_allow() {
    let daemon = start();
    let reply = daemon.call("POST", "/health", b"");
    reply.assert_error(
        405,
        "method POST is not allowed on /health; allowed: GET, HEAD",
    );
    assert_eq!(reply.header("allow"), Some("GET, HEAD"));
    let reply = daemon.call("GET", "/init", b"");
    assert_eq!(reply.status, 405);
    assert_eq!(reply.header("allow"), Some("POST"));
}

pub(crate) const UNAUTHORIZED: &str =
    "unauthorized access, please provide a valid access token or method signing if supported";

#[test]
fn envs_requires_the_token() {
    let daemon = start();
    daemon
        .call_with("GET", "/envs", &[], b"")
        .assert_error(401, UNAUTHORIZED);
    daemon
        .call_with("GET", "/envs", &[("X-Access-Token", "wrong")], b"")
        .assert_error(401, UNAUTHORIZED);
    daemon
        .call_with("GET", "/envs", &[("X-Access-Token", "")], b"")
        .assert_error(401, UNAUTHORIZED);
    assert_eq!(daemon.get("/envs").status, 200);
}

#[test]
fn envs_lists_the_start_environment_sorted_without_sandboxd_variables() {
    let daemon = builder()
        .env("ZZ_LAST", "z")
        .env("AA_FIRST", "a b=c")
        .env("SANDBOXD_SECRET_THING", "hidden")
        .start();
    let reply = daemon.get("/envs");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_eq!(reply.header("cache-control"), Some("no-store"));
    let json = reply.json();
    assert_eq!(json["AA_FIRST"], "a b=c");
    assert_eq!(json["ZZ_LAST"], "z");
    assert!(json.get("SANDBOXD_SECRET_THING").is_none());
    let keys: Vec<&String> = json.as_object().unwrap().keys().collect();
    let text = reply.text();
    let positions: Vec<usize> = keys
        .iter()
        .map(|k| text.find(&format!("\"{k}\":")).unwrap())
        .collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "keys sorted on the wire"
    );
}

#[test]
fn init_sets_variables_replacing_the_previous_ones() {
    let daemon = builder().env("KEEP", "start").start();
    let first = br#"{"envVars":{"A":"1","B":"2"}}"#;
    assert_eq!(daemon.call("POST", "/init", first).status, 204);
    let json = daemon.get("/envs").json();
    assert_eq!(
        (json["A"].as_str(), json["B"].as_str()),
        (Some("1"), Some("2"))
    );
    let second = br#"{"envVars":{"B":"3","KEEP":"overlaid"}}"#;
    assert_eq!(daemon.call("POST", "/init", second).status, 204);
    let json = daemon.get("/envs").json();
    assert!(json.get("A").is_none());
    assert_eq!(json["B"], "3");
    assert_eq!(json["KEEP"], "overlaid");
}

#[test]
fn init_requires_the_current_token_by_header_or_body() {
    let daemon = start();
    daemon
        .call_with("POST", "/init", &[], br#"{"envVars":{"X":"1"}}"#)
        .assert_error(401, UNAUTHORIZED);
    let body = format!(r#"{{"accessToken":"{TOKEN}","envVars":{{"X":"1"}}}}"#);
    assert_eq!(
        daemon
            .call_with("POST", "/init", &[], body.as_bytes())
            .status,
        204
    );
    assert_eq!(daemon.get("/envs").json()["X"], "1");
}

#[test]
fn init_rotates_the_token() {
    let daemon = start();
    let reply = daemon.call("POST", "/init", br#"{"accessToken":"new-token"}"#);
    assert_eq!(reply.status, 204);
    assert_eq!(daemon.get("/envs").status, 401);
    let reply = daemon.call_with("GET", "/envs", &[("X-Access-Token", "new-token")], b"");
    assert_eq!(reply.status, 200);
}

#[test]
fn without_a_token_routes_are_open_until_init_sets_one() {
    let daemon = builder().no_token().start();
    assert!(daemon
        .log()
        .iter()
        .any(|l| l.contains("warning: no access token")));
    assert_eq!(daemon.call_with("GET", "/envs", &[], b"").status, 200);
    let reply = daemon.call_with("POST", "/init", &[], br#"{"accessToken":"set-later"}"#);
    assert_eq!(reply.status, 204);
    assert_eq!(daemon.call_with("GET", "/envs", &[], b"").status, 401);
    let reply = daemon.call_with("GET", "/envs", &[("X-Access-Token", "set-later")], b"");
    assert_eq!(reply.status, 200);
}

#[test]
fn init_validates_before_changing_anything() {
    let daemon = start();
    let cases: [(&[u8], u16, &str); 5] = [
        (
            br#"{"accessToken":""}"#,
            400,
            "accessToken must not be empty",
        ),
        (
            br#"{"defaultUser":"ghost","envVars":{"Y":"1"}}"#,
            401,
            "error looking up user 'ghost': unknown user",
        ),
        (
            br#"{"defaultWorkdir":"relative/dir","envVars":{"Y":"1"}}"#,
            400,
            "defaultWorkdir must be an absolute path, not 'relative/dir'",
        ),
        (
            br#"{"envVars":{"A=B":"1"}}"#,
            400,
            "invalid envVars name 'A=B': must be non-empty without '=' or NUL",
        ),
        (br#"{"envVars":{"Y":1}}"#, 400, ""),
    ];
    for (body, status, message) in cases {
        let reply = daemon.call("POST", "/init", body);
        if message.is_empty() {
            assert_eq!(reply.status, status);
            let text = reply.json()["message"].as_str().unwrap().to_string();
            assert!(text.starts_with("invalid request body: "), "{text}");
        } else {
            reply.assert_error(status, message);
        }
    }
    assert!(daemon.get("/envs").json().get("Y").is_none());
    let reply = daemon.call("POST", "/init", b"{not json");
    assert_eq!(reply.status, 400);
    assert!(reply.json()["message"]
        .as_str()
        .unwrap()
        .starts_with("invalid request body: "));
}

#[test]
fn init_accepts_an_empty_body_and_a_known_default_user() {
    let daemon = start();
    assert_eq!(daemon.call("POST", "/init", b"").status, 204);
    let reply = daemon.call(
        "POST",
        "/init",
        br#"{"defaultUser":"user","defaultWorkdir":"/tmp"}"#,
    );
    assert_eq!(reply.status, 204);
}

#[test]
fn json_bodies_over_1_mib_are_413() {
    let daemon = start();
    let mut body = br#"{"envVars":{"BIG":""#.to_vec();
    body.resize(1024 * 1024 + 10, b'a');
    body.extend_from_slice(br#""}}"#);
    daemon
        .call("POST", "/init", &body)
        .assert_error(413, "request body too large: at most 1 MiB");
    assert_eq!(daemon.get("/health").status, 204);
}
