//! The metadata service (issue 23, SPEC §9): a fake Firecracker MMDS v2 on 127.0.0.1 (a token
//! `PUT`, then `GET /` as JSON; it can stall) feeds the sandbox's identity to `/envs`, started
//! processes and `/run/e2b/` under `--system-root`, and the token hash `/init` checks as envd's
//! `validateInitAccessToken` does. A stalled or absent service never delays start-up or
//! `/health`. Nothing here contacts any address but 127.0.0.1.

use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::connect::{Stream, WAIT};
use crate::common::mmds::{sha512_hex, FakeMmds};
use crate::common::{assert_health_within, builder, Builder, Daemon, Reply, TOKEN};

/// A daemon using this service.
impl FakeMmds {
    /// A daemon using this service, its system root a temp dir of the test's.
    pub(crate) fn daemon(&self, builder: Builder, root: &Path) -> Daemon {
        builder
            .arg("--mmds-address")
            .arg(&self.addr.to_string())
            .arg("--system-root")
            .arg(root.to_str().unwrap())
            .start()
    }
}

pub(crate) fn metadata(hash: &str) -> serde_json::Value {
    json!({"instanceID": "isb-1", "envID": "tpl-1", "address": "", "accessTokenHash": hash})
}

fn envs(daemon: &Daemon, token: &str) -> Reply {
    daemon.call_with("GET", "/envs", &[("X-Access-Token", token)], b"")
}

/// `/envs` (with `token`) once it holds `E2B_SANDBOX_ID` = `id`; panics after 10 s.
pub(crate) fn wait_for_id(daemon: &Daemon, token: &str, id: &str) -> serde_json::Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let env = envs(daemon, token).json();
        if env["E2B_SANDBOX_ID"] == id {
            return env;
        }
        assert!(Instant::now() < deadline, "no identity {id} in time: {env}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn init(daemon: &Daemon, headers: &[(&str, &str)], body: &str) -> Reply {
    daemon.call_with("POST", "/init", headers, body.as_bytes())
}

/// Stdout of `sh -c script` started through the process service.
fn run(daemon: &Daemon, script: &str) -> String {
    let request = json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}});
    let mut stream = Stream::open(daemon, "process.Process/Start", &request, &[]);
    assert_eq!(stream.status, 200);
    let mut out = Vec::new();
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = stream.next_within(left).expect("the process ends");
        if message.end {
            return String::from_utf8(out).unwrap();
        }
        if let Some(text) = message.json["event"]["data"]["stdout"].as_str() {
            out.extend(base64_simd::STANDARD.decode_to_vec(text).unwrap());
        }
    }
}

#[test]
fn the_identity_reaches_envs_started_processes_and_run_e2b() {
    let mmds = FakeMmds::start(metadata(""));
    let root = tempfile::tempdir().unwrap();
    let daemon = mmds.daemon(builder(), root.path());
    let env = wait_for_id(&daemon, TOKEN, "isb-1");
    assert_eq!(env["E2B_TEMPLATE_ID"], "tpl-1");
    assert_eq!(env["E2B_SANDBOX"], "true");
    let out = run(
        &daemon,
        "echo \"$E2B_SANDBOX_ID $E2B_TEMPLATE_ID $E2B_SANDBOX\"",
    );
    assert_eq!(out, "isb-1 tpl-1 true\n");
    let run_dir = root.path().join("run/e2b");
    let read = |name: &str| std::fs::read_to_string(run_dir.join(name)).unwrap();
    assert_eq!(read(".E2B_SANDBOX_ID"), "isb-1");
    assert_eq!(read(".E2B_TEMPLATE_ID"), "tpl-1");
    assert_eq!(read(".E2B_SANDBOX"), "true");
    // The identity wins over /init's variables, as envd's internal ones do.
    let reply = init(
        &daemon,
        &[("X-Access-Token", TOKEN)],
        r#"{"envVars":{"E2B_SANDBOX_ID":"spoofed","MINE":"1"}}"#,
    );
    assert_eq!(reply.status, 204);
    let env = envs(&daemon, TOKEN).json();
    assert_eq!(
        (env["E2B_SANDBOX_ID"].as_str(), env["MINE"].as_str()),
        (Some("isb-1"), Some("1"))
    );
    assert_eq!(mmds.violations(), Vec::<String>::new(), "MMDS v2 spoken");
}

#[test]
fn an_init_reads_the_identity_again_as_after_a_resume() {
    let mmds = FakeMmds::start(metadata(""));
    let root = tempfile::tempdir().unwrap();
    let daemon = mmds.daemon(builder(), root.path());
    wait_for_id(&daemon, TOKEN, "isb-1");
    mmds.set(|s| s.metadata["instanceID"] = json!("isb-2"));
    let reply = init(&daemon, &[("X-Access-Token", TOKEN)], "{}");
    assert_eq!(reply.status, 204);
    wait_for_id(&daemon, TOKEN, "isb-2");
    let id = std::fs::read_to_string(root.path().join("run/e2b/.E2B_SANDBOX_ID")).unwrap();
    assert_eq!(id, "isb-2");
}

/// Metadata reads made so far, once at least `count` have been made (10 s at most), and the
/// poller given a moment to act on the last.
fn wait_for_reads(mmds: &FakeMmds, count: usize) {
    let deadline = Instant::now() + WAIT;
    while mmds.reads() < count {
        assert!(
            Instant::now() < deadline,
            "{} reads, not {count}",
            mmds.reads()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
}

#[test]
fn a_malformed_identity_is_refused_and_the_one_known_before_kept() {
    let mmds = FakeMmds::start(metadata(""));
    let root = tempfile::tempdir().unwrap();
    let daemon = mmds.daemon(builder(), root.path());
    wait_for_id(&daemon, TOKEN, "isb-1");
    let reads = mmds.reads();
    mmds.set(|s| s.metadata["instanceID"] = json!("isb\u{0}2"));
    // Two resumes: each reads the service again.
    for done in [reads + 1, reads + 2] {
        assert_eq!(
            init(&daemon, &[("X-Access-Token", TOKEN)], "{}").status,
            204
        );
        wait_for_reads(&mmds, done);
    }
    let env = envs(&daemon, TOKEN).json();
    assert_eq!(env["E2B_SANDBOX_ID"], "isb-1");
    assert_eq!(run(&daemon, "echo \"$E2B_SANDBOX_ID\""), "isb-1\n");
    let id = std::fs::read_to_string(root.path().join("run/e2b/.E2B_SANDBOX_ID")).unwrap();
    assert_eq!(id, "isb-1");
    let refused = |line: &str| {
        line.ends_with(
            r#"mmds: ignoring a malformed identity: the metadata's instanceID "isb\02" has a control character; the identity known before is kept"#,
        )
    };
    let log = daemon.log_with(refused);
    assert_eq!(
        log.iter().filter(|line| refused(line)).count(),
        1,
        "{log:?}"
    );
    // A good one again is taken.
    mmds.set(|s| s.metadata["instanceID"] = json!("isb-3"));
    assert_eq!(
        init(&daemon, &[("X-Access-Token", TOKEN)], "{}").status,
        204
    );
    wait_for_id(&daemon, TOKEN, "isb-3");
}

#[test]
fn a_link_planted_at_run_e2b_or_at_a_temporary_name_is_not_written_through() {
    let mmds = FakeMmds::start(metadata(""));
    let root = tempfile::tempdir().unwrap();
    let elsewhere = root.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::create_dir_all(root.path().join("run")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, root.path().join("run/e2b")).unwrap();
    let daemon = mmds.daemon(builder(), root.path());
    wait_for_id(&daemon, TOKEN, "isb-1");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    daemon.log_with(|line| {
        line.ends_with(
            "mmds: cannot write /run/e2b/.E2B_SANDBOX_ID: '/run/e2b' is a symbolic link, which \
             sandboxd does not follow there",
        )
    });
    // The directory as it should be, and a link where the next write's temporary goes.
    std::fs::remove_file(root.path().join("run/e2b")).unwrap();
    let run_dir = root.path().join("run/e2b");
    std::fs::create_dir(&run_dir).unwrap();
    let victim = elsewhere.join("victim");
    std::fs::write(&victim, "untouched").unwrap();
    let temp = run_dir.join(format!("..E2B_SANDBOX_ID.{}.tmp", daemon.pid()));
    std::os::unix::fs::symlink(&victim, &temp).unwrap();
    mmds.set(|s| s.metadata["instanceID"] = json!("isb-2"));
    assert_eq!(
        init(&daemon, &[("X-Access-Token", TOKEN)], "{}").status,
        204
    );
    wait_for_id(&daemon, TOKEN, "isb-2");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
    let written = run_dir.join(".E2B_SANDBOX_ID");
    assert!(std::fs::symlink_metadata(&written)
        .unwrap()
        .file_type()
        .is_file());
    assert_eq!(std::fs::read_to_string(&written).unwrap(), "isb-2");
    assert!(
        std::fs::symlink_metadata(&temp).is_err(),
        "the planted name is gone"
    );
}

#[test]
fn a_resumed_sandbox_takes_the_new_token_whose_hash_mmds_holds() {
    let mmds = FakeMmds::start(metadata(&sha512_hex("new-token")));
    let root = tempfile::tempdir().unwrap();
    let daemon = mmds.daemon(builder(), root.path());
    // The orchestrator sends no header, only the new token in the body.
    let reply = init(
        &daemon,
        &[],
        r#"{"accessToken":"new-token","envVars":{"V":"1"}}"#,
    );
    assert_eq!(reply.status, 204, "{}", reply.text());
    assert_eq!(envs(&daemon, TOKEN).status, 401, "the old token is refused");
    assert_eq!(envs(&daemon, "new-token").json()["V"], "1");
    assert!(mmds.reads() >= 1);
}

#[test]
fn a_new_token_whose_hash_mmds_does_not_hold_is_refused_and_changes_nothing() {
    let mmds = FakeMmds::start(metadata(&sha512_hex("new-token")));
    let root = tempfile::tempdir().unwrap();
    let daemon = mmds.daemon(builder(), root.path());
    let reply = init(
        &daemon,
        &[],
        r#"{"accessToken":"someone-else","envVars":{"V":"x"}}"#,
    );
    assert_eq!(reply.status, 401, "{}", reply.text());
    let env = envs(&daemon, TOKEN);
    assert_eq!(env.status, 200, "the old token is still valid");
    assert_eq!(env.json()["V"], serde_json::Value::Null, "nothing applied");
    assert_eq!(envs(&daemon, "someone-else").status, 401);
    // Without a token at all, where one was never set: MMDS's hash still decides.
    let fresh = mmds.daemon(builder().no_token(), root.path());
    assert_eq!(init(&fresh, &[], r#"{"accessToken":"other"}"#).status, 401);
    assert_eq!(
        init(&fresh, &[], r#"{"accessToken":"new-token"}"#).status,
        204
    );
    assert_eq!(envs(&fresh, "new-token").status, 200);
}

#[test]
fn mmds_holding_the_empty_token_s_hash_lets_an_init_without_one_clear_it() {
    let mmds = FakeMmds::start(metadata(&sha512_hex("")));
    let root = tempfile::tempdir().unwrap();
    let daemon = mmds.daemon(builder(), root.path());
    let reply = init(&daemon, &[], r#"{"envVars":{"V":"cleared"}}"#);
    assert_eq!(reply.status, 204, "{}", reply.text());
    let open = daemon.call_with("GET", "/envs", &[], b"");
    assert_eq!(open.status, 200, "no token any more");
    assert_eq!(open.json()["V"], "cleared");
}

#[test]
fn an_init_without_a_token_clears_nothing_unless_mmds_says_so() {
    let mmds = FakeMmds::start(metadata(&sha512_hex("new-token")));
    let root = tempfile::tempdir().unwrap();
    let daemon = mmds.daemon(builder(), root.path());
    // envd's "reset not authorized": refused, nothing changes.
    let reply = init(&daemon, &[], r#"{"envVars":{"V":"x"}}"#);
    assert_eq!(reply.status, 401);
    assert_eq!(daemon.call_with("GET", "/envs", &[], b"").status, 401);
    // Authorised by the header, it keeps the token (only MMDS's empty hash clears).
    let reply = init(
        &daemon,
        &[("X-Access-Token", TOKEN)],
        r#"{"envVars":{"V":"y"}}"#,
    );
    assert_eq!(reply.status, 204);
    assert_eq!(daemon.call_with("GET", "/envs", &[], b"").status, 401);
    assert_eq!(envs(&daemon, TOKEN).json()["V"], "y");
}

#[test]
fn a_stalled_mmds_delays_neither_start_up_nor_health() {
    let mmds = FakeMmds::start(metadata(&sha512_hex("new-token")));
    mmds.set(|s| s.stall = true);
    let root = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let daemon = mmds.daemon(builder(), root.path());
    assert_health_within(&daemon, Duration::from_secs(2));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    for _ in 0..5 {
        assert_health_within(&daemon, Duration::from_secs(1));
    }
    let env = envs(&daemon, TOKEN).json();
    assert_eq!(env["E2B_SANDBOX"], "true");
    assert_eq!(
        env["E2B_SANDBOX_ID"],
        serde_json::Value::Null,
        "not known yet"
    );
    // /init waits for the hash a bounded time, then goes on without it: the current token
    // still authorises, a new one alone does not.
    let started = Instant::now();
    assert_eq!(
        init(&daemon, &[], r#"{"accessToken":"new-token"}"#).status,
        401
    );
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    let reply = init(&daemon, &[], &format!(r#"{{"accessToken":"{TOKEN}"}}"#));
    assert_eq!(reply.status, 204);
    // The holder of the current token rotating it never waits on the service.
    let started = Instant::now();
    let reply = init(
        &daemon,
        &[("X-Access-Token", TOKEN)],
        r#"{"accessToken":"rotated"}"#,
    );
    assert_eq!(reply.status, 204);
    assert!(
        started.elapsed() < Duration::from_millis(1000),
        "{:?}",
        started.elapsed()
    );
    // Once it answers, the identity arrives.
    mmds.set(|s| s.stall = false);
    wait_for_id(&daemon, "rotated", "isb-1");
}

/// envd gives each request to the service 10 s: one that answers each 2 s late (a busy host)
/// still gives the identity (it never arrived when the poller gave the exchange 2 s in all).
#[test]
fn a_service_answering_each_request_2_s_late_still_gives_the_identity() {
    let mmds = FakeMmds::start(metadata(&sha512_hex("new-token")));
    mmds.set(|s| s.late = Duration::from_secs(2));
    let root = tempfile::tempdir().unwrap();
    let daemon = mmds.daemon(builder(), root.path());
    assert_health_within(&daemon, Duration::from_secs(1));
    let env = wait_for_id(&daemon, TOKEN, "isb-1");
    assert_eq!(env["E2B_TEMPLATE_ID"], "tpl-1");
    assert_eq!(
        std::fs::read_to_string(root.path().join("run/e2b/.E2B_SANDBOX_ID")).unwrap(),
        "isb-1"
    );
    assert!(
        !daemon.log().iter().any(|l| l.contains("gave up polling")),
        "{:?}",
        daemon.log()
    );
}

#[test]
fn an_mmds_that_is_down_changes_nothing_but_the_missing_identity() {
    let down = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = down.local_addr().unwrap();
    drop(down);
    let root = tempfile::tempdir().unwrap();
    let daemon = builder()
        .arg("--mmds-address")
        .arg(&addr.to_string())
        .arg("--system-root")
        .arg(root.path().to_str().unwrap())
        .start();
    assert_health_within(&daemon, Duration::from_secs(2));
    let env = envs(&daemon, TOKEN).json();
    assert_eq!(env["E2B_SANDBOX"], "true");
    assert_eq!(env["E2B_SANDBOX_ID"], serde_json::Value::Null);
    assert_eq!(init(&daemon, &[], r#"{"accessToken":"new"}"#).status, 401);
    assert_eq!(
        init(
            &daemon,
            &[("X-Access-Token", TOKEN)],
            r#"{"accessToken":"new"}"#
        )
        .status,
        204
    );
    assert_eq!(envs(&daemon, "new").status, 200);
}

/// Under the name `envd` an explicit `--mmds-address` still wins over envd's default address
/// (the harness never starts `envd` without it or `-isnotfc`: the link-local address is never
/// tried).
#[test]
fn a_daemon_named_envd_reads_the_service_it_is_given() {
    let mmds = FakeMmds::start(metadata(""));
    let root = tempfile::tempdir().unwrap();
    let daemon = mmds.daemon(builder().program_name("envd"), root.path());
    wait_for_id(&daemon, TOKEN, "isb-1");
    // The one service named is the fake: envd's default is neither used nor mentioned.
    let line = format!("metadata service at {}", mmds.addr);
    let log = daemon.log_with(|l| l.contains("metadata service"));
    let named: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("metadata service"))
        .collect();
    assert!(
        !named.is_empty() && named.iter().all(|l| l.ends_with(&line)),
        "{log:?}"
    );
}

/// `envd -isnotfc`: no metadata service, so no identity and no run files, as without the name.
#[test]
fn a_daemon_named_envd_with_isnotfc_reads_none() {
    let root = tempfile::tempdir().unwrap();
    let daemon = builder()
        .program_name("envd")
        .arg("-isnotfc")
        .arg("--system-root")
        .arg(root.path().to_str().unwrap())
        .start();
    assert_eq!(daemon.get("/health").status, 204);
    let env = envs(&daemon, TOKEN).json();
    assert_eq!(env["E2B_SANDBOX"], serde_json::Value::Null);
    assert!(!root.path().join("run").exists());
    assert!(!daemon.log().iter().any(|l| l.contains("metadata service")));
}

#[test]
fn without_mmds_address_no_identity_and_no_run_files() {
    let root = tempfile::tempdir().unwrap();
    let daemon = builder()
        .arg("--system-root")
        .arg(root.path().to_str().unwrap())
        .start();
    let env = envs(&daemon, TOKEN).json();
    assert_eq!(env["E2B_SANDBOX"], serde_json::Value::Null);
    assert!(!root.path().join("run").exists());
}

#[test]
fn metadata_that_is_not_the_json_expected_is_no_identity_and_no_hash() {
    let mmds = FakeMmds::start(metadata(&sha512_hex("new-token")));
    mmds.set(|s| s.garbage = Some("<html>not json</html>"));
    let root = tempfile::tempdir().unwrap();
    let daemon = mmds.daemon(builder().no_token(), root.path());
    assert_health_within(&daemon, Duration::from_secs(2));
    // No hash and no token: first set-up is open, whatever the new token.
    assert_eq!(init(&daemon, &[], r#"{"accessToken":"any"}"#).status, 204);
    let env = envs(&daemon, "any").json();
    assert_eq!(env["E2B_SANDBOX_ID"], serde_json::Value::Null);
    assert!(!root.path().join("run/e2b/.E2B_SANDBOX_ID").exists());
    // Once the service answers properly, the identity arrives (the poller kept trying).
    mmds.set(|s| s.garbage = None);
    wait_for_id(&daemon, "any", "isb-1");
}

#[test]
fn an_empty_hash_in_mmds_is_no_hash() {
    let mmds = FakeMmds::start(metadata(""));
    let root = tempfile::tempdir().unwrap();
    let daemon = mmds.daemon(builder().no_token(), root.path());
    assert_eq!(init(&daemon, &[], r#"{"accessToken":"first"}"#).status, 204);
    // Now a token is set and MMDS holds no hash: only the current one re-keys.
    assert_eq!(
        init(&daemon, &[], r#"{"accessToken":"second"}"#).status,
        401
    );
    assert_eq!(
        init(&daemon, &[], r#"{}"#).status,
        401,
        "no reset without the empty hash"
    );
    let reply = init(
        &daemon,
        &[("X-Access-Token", "first")],
        r#"{"accessToken":"second"}"#,
    );
    assert_eq!(reply.status, 204);
    assert_eq!(envs(&daemon, "second").status, 200);
}

/// The daemon's log lines that say what `/init` did with the clock, once `count` are there.
fn clock_lines(daemon: &Daemon, count: usize) -> Vec<String> {
    let deadline = Instant::now() + WAIT;
    loop {
        let lines: Vec<String> = daemon
            .log()
            .into_iter()
            .filter(|line| line.contains(" init: clock ") || line.contains("set the clock"))
            .collect();
        if lines.len() >= count || Instant::now() >= deadline {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_fake_mmds_on_loopback_never_enables_setting_the_clock() {
    // The service has answered (the identity arrived), but at 127.0.0.1: not a Firecracker
    // guest, so the clock is never set, however far off the timestamp. Nothing here can set
    // it: the decision is "not enabled", which the log says.
    let mmds = FakeMmds::start(metadata(""));
    let root = tempfile::tempdir().unwrap();
    let daemon = mmds.daemon(builder(), root.path());
    wait_for_id(&daemon, TOKEN, "isb-1");
    let now = std::process::Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%dT%H:%M:%SZ")
        .output()
        .unwrap();
    let now = String::from_utf8(now.stdout).unwrap();
    // Within the margins: nothing to decide, nothing logged.
    let body = format!(r#"{{"timestamp":"{}"}}"#, now.trim());
    assert_eq!(
        init(&daemon, &[("X-Access-Token", TOKEN)], &body).status,
        204
    );
    // Millennia ahead of the guest's clock.
    let far = r#"{"timestamp":"9999-12-31T23:59:59Z","envVars":{"FAR":"1"}}"#;
    let reply = init(&daemon, &[("X-Access-Token", TOKEN)], far);
    assert_eq!(reply.status, 204);
    assert_eq!(envs(&daemon, TOKEN).json()["FAR"], "1", "the rest applied");
    let lines = clock_lines(&daemon, 1);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("init: clock not set: it is ")
            && lines[0].contains("s behind /init's timestamp, but this is not a Firecracker guest"),
        "{lines:?}"
    );
    let year = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 31_556_952
        + 1970;
    assert!(year < 2500, "the clock is where it was: {year}");
}
