//! `/init`'s system files (SPEC §9): `caBundle` in the trust store's bundle and the persisted
//! certificate, `hyperloopIP` in `/etc/hosts` and `E2B_EVENTS_ADDRESS`. Every daemon here runs
//! with `--system-root` at a temporary directory seeded with an `etc/hosts` and a CA bundle of
//! its own: nothing outside it is written.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use crate::common::connect::Stream;
use crate::common::{builder, Daemon, Reply, TOKEN};

const CERT_A: &str = include_str!("fixtures/ca-a.pem");
const CERT_B: &str = include_str!("fixtures/ca-b.pem");

const BUNDLE: &str = "etc/ssl/certs/ca-certificates.crt";
const PERSISTED: &str = "usr/local/share/ca-certificates/e2b-ca.crt";
const PENDING: &str = "usr/local/share/ca-certificates/.e2b-ca.crt.pending";

/// The seeded bundle: one system certificate (a stand-in, never parsed) after a comment.
const SYSTEM_BUNDLE: &str =
    "# the system's CAs\n-----BEGIN CERTIFICATE-----\nU1lTVEVN\n-----END CERTIFICATE-----\n";

/// The seeded hosts file: comments, a blank line, odd spacing, IPv6, no final newline.
const HOSTS: &str = "# static table lookup\n127.0.0.1\tlocalhost\n\n::1     localhost ip6-localhost  # v6\n10.0.0.9 old events.e2b.local";

/// A system root seeded with `etc/hosts` and the bundle.
fn system_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    write(&root.path().join("etc/hosts"), HOSTS);
    write(&root.path().join(BUNDLE), SYSTEM_BUNDLE);
    root
}

fn write(path: &Path, contents: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, contents).unwrap();
}

fn read(root: &Path, path: &str) -> String {
    std::fs::read_to_string(root.join(path)).unwrap()
}

fn daemon(root: &Path) -> Daemon {
    builder()
        .arg("--system-root")
        .arg(root.to_str().unwrap())
        .start()
}

fn init(daemon: &Daemon, body: Value) -> Reply {
    daemon.call("POST", "/init", body.to_string().as_bytes())
}

fn envs(daemon: &Daemon) -> Value {
    daemon.get("/envs").json()
}

/// The names in `dir` (temporaries included).
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn ca_bundle_is_appended_kept_replaced_and_removed() {
    let root = system_root();
    let r = root.path();
    let daemon = daemon(r);
    assert_eq!(init(&daemon, json!({"caBundle": CERT_A})).status, 204);
    assert_eq!(read(r, BUNDLE), format!("{SYSTEM_BUNDLE}{CERT_A}"));
    assert_eq!(read(r, PERSISTED), CERT_A);

    // The same certificate again (every resume sends it): nothing is rewritten.
    let inode = std::fs::metadata(r.join(BUNDLE)).unwrap().ino();
    assert_eq!(init(&daemon, json!({"caBundle": CERT_A})).status, 204);
    assert_eq!(std::fs::metadata(r.join(BUNDLE)).unwrap().ino(), inode);
    assert_eq!(read(r, BUNDLE), format!("{SYSTEM_BUNDLE}{CERT_A}"));

    // Without a final newline, it is the same certificate; a new one replaces it.
    let trimmed = CERT_B.trim_end();
    assert_eq!(init(&daemon, json!({"caBundle": trimmed})).status, 204);
    assert_eq!(read(r, BUNDLE), format!("{SYSTEM_BUNDLE}{CERT_B}"));
    assert_eq!(read(r, PERSISTED), CERT_B);
    // An /init without the field leaves it.
    assert_eq!(init(&daemon, json!({"envVars": {"A": "1"}})).status, 204);
    assert_eq!(read(r, BUNDLE), format!("{SYSTEM_BUNDLE}{CERT_B}"));

    // Empty: removed, the system's bundle as it was.
    assert_eq!(init(&daemon, json!({"caBundle": ""})).status, 204);
    assert_eq!(read(r, BUNDLE), SYSTEM_BUNDLE);
    assert!(!r.join(PERSISTED).exists());
    assert_eq!(names(&r.join("etc/ssl/certs")), ["ca-certificates.crt"]);
    assert_eq!(
        names(&r.join("usr/local/share/ca-certificates")),
        Vec::<String>::new()
    );

    // A restarted daemon still replaces the certificate rather than adding a second.
    assert_eq!(init(&daemon, json!({"caBundle": CERT_A})).status, 204);
    drop(daemon);
    let daemon = self::daemon(r);
    assert_eq!(init(&daemon, json!({"caBundle": CERT_B})).status, 204);
    assert_eq!(read(r, BUNDLE), format!("{SYSTEM_BUNDLE}{CERT_B}"));
}

#[test]
fn a_ca_bundle_that_is_not_pem_certificates_is_400_and_changes_nothing() {
    let root = system_root();
    let r = root.path();
    let daemon = daemon(r);
    let key = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
    let half = &CERT_A[..CERT_A.len() / 2];
    let cases = [
        ("not a certificate", "invalid caBundle: line 1 is neither part of a PEM certificate, a '#' comment nor blank"),
        (key, "invalid caBundle: line 1 begins a 'PRIVATE KEY' block: only CERTIFICATE blocks belong in a CA bundle"),
        (half, "invalid caBundle: the certificate begun on line 1 has no '-----END CERTIFICATE-----' line"),
        (
            "-----BEGIN CERTIFICATE-----\nbm90IGRlcg==\n-----END CERTIFICATE-----\n",
            "invalid caBundle: the certificate on lines 1-3 is not a DER-encoded X.509 certificate",
        ),
    ];
    for (pem, message) in cases {
        let reply = init(&daemon, json!({"caBundle": pem, "envVars": {"SET": "no"}}));
        reply.assert_error(400, message);
        assert_eq!(reply.header("x-envd-version"), Some(sandboxd::ENVD_VERSION));
    }
    assert_eq!(read(r, BUNDLE), SYSTEM_BUNDLE);
    assert!(!r.join(PERSISTED).exists());
    assert_eq!(envs(&daemon).get("SET"), None);
}

#[test]
fn a_bundle_that_cannot_be_written_is_500_and_the_init_stops() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    std::fs::create_dir_all(r.join(BUNDLE)).unwrap();
    let daemon = daemon(r);
    let reply = init(
        &daemon,
        json!({"caBundle": CERT_A, "envVars": {"SET": "no"}}),
    );
    reply.assert_error(
        500,
        &format!(
            "error installing caBundle: '{}': Is a directory (os error 21)",
            r.join(BUNDLE).display()
        ),
    );
    assert_eq!(envs(&daemon).get("SET"), None);
    assert!(!r.join(PERSISTED).exists());
}

#[test]
fn a_missing_bundle_is_created() {
    let root = tempfile::tempdir().unwrap();
    let daemon = daemon(root.path());
    assert_eq!(init(&daemon, json!({"caBundle": CERT_A})).status, 204);
    assert_eq!(read(root.path(), BUNDLE), CERT_A);
}

/// What a process started now sees in `$E2B_EVENTS_ADDRESS` (`unset` when it has none).
fn events_address_seen(daemon: &Daemon) -> String {
    let script = "printf %s \"${E2B_EVENTS_ADDRESS-unset}\"";
    let request = json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}});
    let mut stream = Stream::open(daemon, "process.Process/Start", &request, &[]);
    let mut stdout = Vec::new();
    loop {
        let message = stream.next();
        if message.end {
            return String::from_utf8(stdout).unwrap();
        }
        if let Some(text) = message.json["event"]["data"]["stdout"].as_str() {
            stdout.extend(base64_simd::STANDARD.decode_to_vec(text).unwrap());
        }
    }
}

#[test]
fn hyperloop_ip_sets_one_hosts_entry_and_the_events_address() {
    let root = system_root();
    let r = root.path();
    let daemon = daemon(r);
    assert_eq!(events_address_seen(&daemon), "unset");
    assert_eq!(
        init(&daemon, json!({"hyperloopIP": "10.11.0.1"})).status,
        204
    );
    // The old entry's name leaves its line (the line's other name stays), the new one at the end.
    let base = "# static table lookup\n127.0.0.1\tlocalhost\n\n::1     localhost ip6-localhost  # v6\n10.0.0.9 old\n";
    assert_eq!(
        read(r, "etc/hosts"),
        format!("{base}10.11.0.1        events.e2b.local\n")
    );
    assert_eq!(envs(&daemon)["E2B_EVENTS_ADDRESS"], "http://10.11.0.1");
    assert_eq!(events_address_seen(&daemon), "http://10.11.0.1");

    // Again: nothing changes. A user variable of that name does not override it (envd's).
    let inode = std::fs::metadata(r.join("etc/hosts")).unwrap().ino();
    let body = json!({"hyperloopIP": "10.11.0.1", "envVars": {"E2B_EVENTS_ADDRESS": "mine"}});
    assert_eq!(init(&daemon, body).status, 204);
    assert_eq!(std::fs::metadata(r.join("etc/hosts")).unwrap().ino(), inode);
    assert_eq!(envs(&daemon)["E2B_EVENTS_ADDRESS"], "http://10.11.0.1");

    // IPv6 is added beside it: one entry per address family, as envd's hosts library keeps.
    assert_eq!(
        init(&daemon, json!({"hyperloopIP": "FD00:0::1"})).status,
        204
    );
    assert_eq!(
        read(r, "etc/hosts"),
        format!("{base}10.11.0.1        events.e2b.local\nfd00::1          events.e2b.local\n")
    );
    assert_eq!(envs(&daemon)["E2B_EVENTS_ADDRESS"], "http://[fd00::1]");
    assert_eq!(events_address_seen(&daemon), "http://[fd00::1]");
    // A new IPv4 address replaces the IPv4 entry only.
    assert_eq!(
        init(&daemon, json!({"hyperloopIP": "10.11.0.2"})).status,
        204
    );
    assert_eq!(
        read(r, "etc/hosts"),
        format!("{base}fd00::1          events.e2b.local\n10.11.0.2        events.e2b.local\n")
    );
    assert_eq!(names(&r.join("etc")), ["hosts", "ssl"]);
}

#[test]
fn a_malformed_hyperloop_ip_is_400_and_an_empty_one_changes_nothing() {
    let root = system_root();
    let r = root.path();
    let daemon = daemon(r);
    for bad in ["10.11.0", "fe80::1%eth0", "events.e2b.local"] {
        init(
            &daemon,
            json!({"hyperloopIP": bad, "envVars": {"SET": "no"}}),
        )
        .assert_error(
            400,
            &format!("invalid hyperloopIP '{bad}': not an IPv4 or IPv6 address"),
        );
    }
    assert_eq!(envs(&daemon).get("SET"), None);
    assert_eq!(init(&daemon, json!({"hyperloopIP": ""})).status, 204);
    assert_eq!(read(r, "etc/hosts"), HOSTS);
    assert_eq!(envs(&daemon).get("E2B_EVENTS_ADDRESS"), None);
}

#[test]
fn a_hosts_file_that_cannot_be_written_is_logged_and_the_init_applies() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    std::fs::create_dir_all(r.join("etc/hosts")).unwrap();
    let daemon = daemon(r);
    let body = json!({"hyperloopIP": "10.11.0.1", "envVars": {"SET": "yes"}});
    assert_eq!(init(&daemon, body).status, 204);
    let env = envs(&daemon);
    assert_eq!(env["SET"], "yes");
    assert_eq!(env.get("E2B_EVENTS_ADDRESS"), None);
    let expected = format!(
        "init: hyperloopIP: cannot write the events.e2b.local entry: '{}': Is a directory (os error 21); E2B_EVENTS_ADDRESS unchanged",
        r.join("etc/hosts").display()
    );
    daemon.log_with(|line| line.ends_with(&expected));
}

/// Sends an `/init` and ignores what happens to it (the daemon may be killed meanwhile).
fn init_blind(addr: std::net::SocketAddr, body: &str) {
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return;
    };
    let request = format!(
        "POST /init HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\nConnection: close\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(request.as_bytes());
    let _ = stream.read_to_end(&mut Vec::new());
}

#[test]
fn the_bundle_is_whole_after_the_daemon_is_killed_mid_init() {
    let root = system_root();
    let r = root.path();
    let whole = [
        SYSTEM_BUNDLE.to_string(),
        format!("{SYSTEM_BUNDLE}{CERT_A}"),
        format!("{SYSTEM_BUNDLE}{CERT_B}"),
    ];
    for round in 0..24u32 {
        let mut daemon = daemon(r);
        let cert = [CERT_A, CERT_B, ""][round as usize % 3];
        let body = json!({"caBundle": cert, "hyperloopIP": format!("10.11.0.{round}")}).to_string();
        let addr = daemon.addr;
        let sender = std::thread::spawn(move || {
            for _ in 0..50 {
                init_blind(addr, &body);
            }
        });
        // Somewhere in the first few /inits.
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        std::thread::sleep(Duration::from_micros(u64::from(nanos % 20_000)));
        daemon.signal("KILL");
        assert!(daemon.wait(Duration::from_secs(5)).is_some());
        sender.join().unwrap();
        let bundle = read(r, BUNDLE);
        assert!(whole.contains(&bundle), "round {round}: {bundle:?}");
        let hosts = read(r, "etc/hosts");
        assert!(
            hosts.starts_with("# static table lookup\n127.0.0.1\tlocalhost\n")
                && hosts.matches("events.e2b.local").count() <= 1,
            "round {round}: {hosts:?}"
        );
    }
    // A last /init, not killed, leaves exactly its certificate and no temporary, even when the
    // files already say what it asks (a killed write's temporary is not left for later).
    let daemon = daemon(r);
    assert_eq!(init(&daemon, json!({"caBundle": CERT_A})).status, 204);
    let body = json!({"caBundle": CERT_A, "hyperloopIP": "10.11.0.99"});
    assert_eq!(init(&daemon, body.clone()).status, 204);
    std::fs::write(r.join("etc/.hosts.sandboxd-tmp"), b"half").unwrap();
    std::fs::write(
        r.join("etc/ssl/certs/.ca-certificates.crt.sandboxd-tmp"),
        b"half",
    )
    .unwrap();
    assert_eq!(init(&daemon, body).status, 204);
    assert!(!names(&r.join("etc"))
        .iter()
        .any(|n| n.ends_with(".sandboxd-tmp")));
    assert_eq!(read(r, BUNDLE), format!("{SYSTEM_BUNDLE}{CERT_A}"));
    assert_eq!(read(r, PERSISTED), CERT_A);
    assert!(!r.join(PENDING).exists());
    assert_eq!(names(&r.join("etc/ssl/certs")), ["ca-certificates.crt"]);
}
