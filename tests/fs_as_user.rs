//! `--fs-as-user`: the file routes and the filesystem service act with the caller's
//! credentials, so the kernel refuses a user what it would refuse their processes; without the
//! option every call acts as root, as envd's. Root-only: switching credentials needs root.

use std::fs;
use std::io::{BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::connect::{Stream, AS_USER, WAIT};
use crate::common::{self, enc, Daemon, Reply, TOKEN, USER_GID, USER_UID};
use serde_json::{json, Value};

const AS_ROOT: &str = "Basic cm9vdDo=";
/// A group listing `user` in the group file, and one that does not.
const DEV_GID: u32 = 4500;
const OTHER_GID: u32 = 4600;

/// A daemon (with `--fs-as-user` when `on`) whose tree a user can reach: the temp dir is
/// searchable, the home is the user's, and `locked/` is root's (0755) with a root-only file
/// `secret` (0600), a group-readable `shared` (0640, group dev, which lists `user`), a
/// `other` (0640, a group without `user`) and a root-only directory `private/` (0700).
fn start(on: bool) -> (Daemon, PathBuf) {
    let mut builder = common::builder().arg("--workers").arg("4");
    if on {
        builder = builder.arg("--fs-as-user");
    }
    let daemon = builder.start();
    let root = daemon.dir.path();
    fs::set_permissions(root, fs::Permissions::from_mode(0o755)).unwrap();
    for file in ["passwd", "token"] {
        fs::set_permissions(root.join(file), fs::Permissions::from_mode(0o600)).unwrap();
    }
    fs::write(
        root.join("group"),
        format!("root:x:0:\ndev:x:{DEV_GID}:root,user\nother:x:{OTHER_GID}:root\n"),
    )
    .unwrap();
    std::os::unix::fs::chown(daemon.home(), Some(USER_UID), Some(USER_GID)).unwrap();
    let locked = root.join("locked");
    fs::create_dir(&locked).unwrap();
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o755)).unwrap();
    for (name, mode, gid, text) in [
        ("secret", 0o600, 0, "root only"),
        ("shared", 0o640, DEV_GID, "for dev"),
        ("other", 0o640, OTHER_GID, "for other"),
    ] {
        let path = locked.join(name);
        fs::write(&path, text).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        std::os::unix::fs::chown(&path, Some(0), Some(gid)).unwrap();
    }
    fs::create_dir(locked.join("private")).unwrap();
    fs::set_permissions(locked.join("private"), fs::Permissions::from_mode(0o700)).unwrap();
    (daemon, locked)
}

fn root_or_fail() -> bool {
    common::root_or_skip("switching to a user's credentials needs root")
}

fn path_of(path: &Path) -> String {
    enc(path.to_str().unwrap())
}

fn download(daemon: &Daemon, path: &Path, user: &str) -> Reply {
    daemon.get(&format!("/files?path={}&username={user}", path_of(path)))
}

fn upload(daemon: &Daemon, path: &Path, user: &str, body: &[u8]) -> Reply {
    daemon.call_with(
        "POST",
        &format!("/files?path={}&username={user}", path_of(path)),
        &[
            ("X-Access-Token", TOKEN),
            ("Content-Type", "application/octet-stream"),
        ],
        body,
    )
}

/// A multipart upload whose head, part header and data arrive apart, so the body is fed to
/// its sink after the worker that began the request has returned (by whichever worker picks
/// the connection up).
fn paced_multipart(daemon: &Daemon, path: &Path, user: &str, data: &[u8]) -> Reply {
    let mut body = b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
        .to_vec();
    let split = body.len();
    body.extend_from_slice(data);
    body.extend_from_slice(b"\r\n--b--\r\n");
    let head = format!(
        "POST /files?path={}&username={user} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\
         X-Access-Token: {TOKEN}\r\nContent-Type: multipart/form-data; boundary=b\r\n\
         Content-Length: {}\r\n\r\n",
        path_of(path),
        body.len()
    );
    let mut socket = daemon.connect();
    socket.write_all(head.as_bytes()).unwrap();
    for piece in [&body[..split], &body[split..]] {
        std::thread::sleep(Duration::from_millis(30));
        // The daemon may already have answered (a refusal) and closed; its answer is read below.
        let _ = socket.write_all(piece);
    }
    common::read_reply(&mut BufReader::new(socket), false).expect("a response")
}

fn rpc(daemon: &Daemon, method: &str, user: &str, body: Value) -> Reply {
    daemon.call_with(
        "POST",
        &format!("/filesystem.Filesystem/{method}"),
        &[
            ("X-Access-Token", TOKEN),
            ("Content-Type", "application/json"),
            ("Authorization", user),
        ],
        body.to_string().as_bytes(),
    )
}

fn compose(daemon: &Daemon, sources: &[&Path], destination: &Path, user: &str) -> Reply {
    let sources: Vec<&str> = sources.iter().map(|p| p.to_str().unwrap()).collect();
    let body = json!({"source_paths": sources, "destination": destination, "username": user});
    daemon.call("POST", "/files/compose", body.to_string().as_bytes())
}

fn assert_code(reply: &Reply, status: u16, code: &str) {
    assert_eq!(reply.status, status, "{}", reply.text());
    assert_eq!(reply.json()["code"], code, "{}", reply.text());
}

fn assert_denied(reply: &Reply) {
    assert_eq!(reply.status, 403, "{}", reply.text());
    let message = reply.json()["message"]
        .as_str()
        .unwrap_or("")
        .to_lowercase();
    assert!(message.contains("permission denied"), "{message}");
}

/// The end of a WatchDir stream opened as `user` on `path`: its error code, or "none".
fn watch_dir_end(daemon: &Daemon, path: &Path, user: &str) -> (String, Stream) {
    let request = json!({"path": path, "recursive": true});
    let mut watch = Stream::open(
        daemon,
        "filesystem.Filesystem/WatchDir",
        &request,
        &[("Authorization", user)],
    );
    assert_eq!(watch.status, 200);
    let first = watch.next_within(WAIT).expect("a first message");
    let code = match first.end {
        true => Stream::end_error(&first).map_or("none".into(), |(code, _)| code),
        false => "none".to_string(),
    };
    (code, watch)
}

#[test]
fn a_user_is_refused_what_the_kernel_refuses_and_root_is_not() {
    if !root_or_fail() {
        return;
    }
    let (daemon, locked) = start(true);
    let home = daemon.home();
    // Downloads: a root-only file, a directory the user cannot enter.
    assert_denied(&download(&daemon, &locked.join("secret"), "user"));
    assert_eq!(
        download(&daemon, &locked.join("secret"), "root").text(),
        "root only"
    );
    // Uploads into a root-owned directory: raw, paced multipart, into a missing subdirectory.
    assert_denied(&upload(&daemon, &locked.join("new"), "user", b"x"));
    assert_denied(&paced_multipart(
        &daemon,
        &locked.join("part"),
        "user",
        b"data",
    ));
    assert_denied(&upload(&daemon, &locked.join("sub/new"), "user", b"x"));
    assert_denied(&compose(
        &daemon,
        &[&locked.join("shared")],
        &locked.join("c"),
        "user",
    ));
    assert_eq!(
        (
            fs::read_dir(&locked).unwrap().count(),
            locked.join("sub").exists()
        ),
        (4, false),
        "nothing was created in locked/, not even a temporary"
    );
    // A compose reading a file the user may not read.
    fs::write(home.join("mine"), b"mine").unwrap();
    assert_denied(&compose(
        &daemon,
        &[&home.join("mine"), &locked.join("secret")],
        &home.join("joined"),
        "user",
    ));
    assert!(home.join("mine").exists() && !home.join("joined").exists());
    // The filesystem service.
    let path = |p: &Path| json!({"path": p});
    assert_code(
        &rpc(&daemon, "MakeDir", AS_USER, path(&locked.join("d"))),
        403,
        "permission_denied",
    );
    assert_code(
        &rpc(&daemon, "Remove", AS_USER, path(&locked.join("shared"))),
        403,
        "permission_denied",
    );
    let moved = json!({"source": locked.join("shared"), "destination": home.join("stolen")});
    assert_code(
        &rpc(&daemon, "Move", AS_USER, moved.clone()),
        403,
        "permission_denied",
    );
    let inside = locked.join("private/x");
    fs::write(&inside, b"x").unwrap();
    assert_code(
        &rpc(&daemon, "Stat", AS_USER, path(&inside)),
        403,
        "permission_denied",
    );
    // ListDir runs on a long-call thread, which must take the user's credentials itself.
    let listed = rpc(&daemon, "ListDir", AS_USER, path(&locked.join("private")));
    assert_code(&listed, 403, "permission_denied");
    assert!(
        listed.text().contains("Permission denied"),
        "{}",
        listed.text()
    );
    assert_code(
        &rpc(
            &daemon,
            "CreateWatcher",
            AS_USER,
            path(&locked.join("private")),
        ),
        403,
        "permission_denied",
    );
    let (code, _) = watch_dir_end(&daemon, &locked.join("private"), AS_USER);
    assert_eq!(code, "permission_denied");
    assert!(locked.join("shared").exists() && !home.join("stolen").exists());
    assert!(!locked.join("d").exists());
    // Root, through the same daemon, may do each.
    assert_eq!(rpc(&daemon, "Stat", AS_ROOT, path(&inside)).status, 200);
    assert_eq!(
        rpc(&daemon, "ListDir", AS_ROOT, path(&locked.join("private"))).status,
        200
    );
    assert_eq!(
        rpc(&daemon, "MakeDir", AS_ROOT, path(&locked.join("d"))).status,
        200
    );
    assert_eq!(rpc(&daemon, "Move", AS_ROOT, moved).status, 200);
    assert_eq!(
        rpc(&daemon, "Remove", AS_ROOT, path(&home.join("stolen"))).status,
        200
    );
    assert_eq!(
        upload(&daemon, &locked.join("new"), "root", b"r").status,
        200
    );
    assert_eq!(fs::read(locked.join("new")).unwrap(), b"r");
}

#[test]
fn a_user_does_everything_in_their_home_and_owns_what_they_make() {
    if !root_or_fail() {
        return;
    }
    let (daemon, _) = start(true);
    let home = daemon.home();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(
        upload(&daemon, &home.join("a/b/big"), "user", &big).status,
        200
    );
    assert_eq!(fs::read(home.join("a/b/big")).unwrap(), big);
    let reply = paced_multipart(&daemon, &home.join("parts/p"), "user", b"paced");
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(fs::read(home.join("parts/p")).unwrap(), b"paced");
    assert_eq!(
        download(&daemon, &home.join("parts/p"), "user").text(),
        "paced"
    );
    let reply = compose(
        &daemon,
        &[&home.join("parts/p"), &home.join("parts/p")],
        &home.join("c"),
        "user",
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(fs::read(home.join("c")).unwrap(), b"pacedpaced");
    let path = |p: &Path| json!({"path": p});
    assert_eq!(
        rpc(&daemon, "MakeDir", AS_USER, path(&home.join("d"))).status,
        200
    );
    let moved = json!({"source": home.join("c"), "destination": home.join("d/c")});
    assert_eq!(rpc(&daemon, "Move", AS_USER, moved).status, 200);
    let listed = rpc(&daemon, "ListDir", AS_USER, path(&home.join("d")));
    assert_eq!(
        listed.json()["entries"][0]["name"],
        "c",
        "{}",
        listed.text()
    );
    let (code, _watch) = watch_dir_end(&daemon, &home, AS_USER);
    assert_eq!(code, "none", "the stream started");
    for made in ["a", "a/b", "a/b/big", "parts", "d", "d/c"] {
        let meta = fs::metadata(home.join(made)).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (USER_UID, USER_GID), "{made}");
    }
    assert_eq!(
        rpc(&daemon, "Remove", AS_USER, path(&home.join("d"))).status,
        200
    );
    assert!(!home.join("d").exists());
}

#[test]
fn without_the_option_a_user_acts_as_root_as_envd() {
    if !root_or_fail() {
        return;
    }
    let (daemon, locked) = start(false);
    let home = daemon.home();
    assert_eq!(
        download(&daemon, &locked.join("secret"), "user").text(),
        "root only"
    );
    assert_eq!(
        upload(&daemon, &locked.join("new"), "user", b"x").status,
        200
    );
    let meta = fs::metadata(locked.join("new")).unwrap();
    assert_eq!(meta.uid(), USER_UID, "owned by the user, written by root");
    let path = |p: &Path| json!({"path": p});
    assert_eq!(
        rpc(&daemon, "MakeDir", AS_USER, path(&locked.join("d"))).status,
        200
    );
    assert_eq!(
        rpc(&daemon, "Stat", AS_USER, path(&locked.join("private"))).status,
        200
    );
    let moved = json!({"source": locked.join("shared"), "destination": home.join("moved")});
    assert_eq!(rpc(&daemon, "Move", AS_USER, moved).status, 200);
    assert_eq!(
        rpc(&daemon, "Remove", AS_USER, path(&locked.join("secret"))).status,
        200
    );
    assert!(!locked.join("secret").exists() && home.join("moved").exists());
}

#[test]
fn a_supplementary_group_opens_what_the_group_may() {
    if !root_or_fail() {
        return;
    }
    let (daemon, locked) = start(true);
    assert_eq!(
        download(&daemon, &locked.join("shared"), "user").text(),
        "for dev"
    );
    assert_denied(&download(&daemon, &locked.join("other"), "user"));
    let team = locked.join("team");
    fs::create_dir(&team).unwrap();
    fs::set_permissions(&team, fs::Permissions::from_mode(0o770)).unwrap();
    std::os::unix::fs::chown(&team, Some(0), Some(DEV_GID)).unwrap();
    assert_eq!(upload(&daemon, &team.join("f"), "user", b"t").status, 200);
    let listed = rpc(&daemon, "ListDir", AS_USER, json!({"path": team}));
    assert_eq!(
        listed.json()["entries"][0]["name"],
        "f",
        "{}",
        listed.text()
    );
    // The group file is read per call: leaving the group takes effect at once.
    fs::write(daemon.dir.path().join("group"), "dev:x:4500:root\n").unwrap();
    assert_denied(&download(&daemon, &locked.join("shared"), "user"));
}

/// Every thread of `pid` with its fsuid and fsgid (`/proc/<pid>/task/*/status`). Its groups
/// are not compared: a worker keeps the last user's while it acts as root (docs/design.md).
fn thread_credentials(pid: i32) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for task in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let Ok(status) = fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .unwrap_or("")
                .trim()
                .to_string()
        };
        let fs_id = |key: &str| {
            field(key)
                .split_whitespace()
                .nth(3)
                .unwrap_or("")
                .to_string()
        };
        out.push((field("Name:"), fs_id("Uid:"), fs_id("Gid:")));
    }
    out
}

#[test]
fn every_worker_is_back_to_root_after_each_call() {
    if !root_or_fail() {
        return;
    }
    let (daemon, locked) = start(true);
    let home = daemon.home();
    let before = thread_credentials(daemon.pid());
    // The first calls are a user's: threads started lazily must not inherit the user's rights.
    assert_eq!(
        upload(&daemon, &home.join("first"), "user", b"1").status,
        200
    );
    // A compressed download starts the gzip threads.
    assert_eq!(
        upload(&daemon, &home.join("log.txt"), "user", &[b'a'; 4096]).status,
        200
    );
    let gzip = daemon.call_with(
        "GET",
        &format!(
            "/files?path={}&username=user",
            path_of(&home.join("log.txt"))
        ),
        &[("X-Access-Token", TOKEN), ("Accept-Encoding", "gzip")],
        b"",
    );
    assert_eq!(gzip.header("content-encoding"), Some("gzip"));
    let (code, watch) = watch_dir_end(&daemon, &home, AS_USER);
    assert_eq!(code, "none");
    std::thread::scope(|scope| {
        for client in 0..4 {
            let (daemon, locked, home) = (&daemon, &locked, &home);
            scope.spawn(move || {
                for round in 0..25 {
                    assert_denied(&download(daemon, &locked.join("secret"), "user"));
                    let root = download(daemon, &locked.join("secret"), "root");
                    assert_eq!(root.text(), "root only", "client {client} round {round}");
                    let name = format!("f{client}-{round}");
                    assert_denied(&upload(daemon, &locked.join(&name), "user", b"u"));
                    assert_eq!(
                        upload(daemon, &locked.join(&name), "root", b"r").status,
                        200
                    );
                    assert_eq!(upload(daemon, &home.join(&name), "user", b"u").status, 200);
                    let stat = rpc(
                        daemon,
                        "Stat",
                        AS_ROOT,
                        json!({"path": locked.join("private")}),
                    );
                    assert_eq!(stat.status, 200, "{}", stat.text());
                }
            });
        }
    });
    drop(watch);
    let after = thread_credentials(daemon.pid());
    assert!(after.len() >= before.len(), "{before:?} {after:?}");
    for (name, fsuid, fsgid) in &after {
        assert_eq!(
            (fsuid.as_str(), fsgid.as_str()),
            ("0", "0"),
            "thread {name} kept a user's credentials: {after:?}"
        );
    }
    let names: Vec<&str> = after.iter().map(|(name, _, _)| name.as_str()).collect();
    assert!(names.contains(&"sweeper"), "{names:?}");
    assert!(names.contains(&"sandboxd-watch"), "{names:?}");
    assert!(names.contains(&"sandboxd-gzip-0"), "{names:?}");
    let owner = |name: &str| fs::metadata(locked.join(name)).unwrap().uid();
    assert_eq!(owner("f3-24"), 0);
}

#[test]
fn a_signed_url_acts_as_the_user_it_names_and_the_variable_turns_the_option_on() {
    if !root_or_fail() {
        return;
    }
    let daemon = common::builder().env("SANDBOXD_FS_AS_USER", "1").start();
    let root = daemon.dir.path();
    fs::set_permissions(root, fs::Permissions::from_mode(0o755)).unwrap();
    let secret = root.join("secret");
    fs::write(&secret, b"root only").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
    let secret = secret.to_str().unwrap();
    let as_user = daemon.sign(secret, &["--username", "user"]);
    assert_denied(&daemon.call_with("GET", &as_user, &[], b""));
    let head = daemon.call_with("HEAD", &as_user, &[], b"");
    assert_eq!(head.status, 403);
    let as_root = daemon.sign(secret, &["--username", "root"]);
    assert_eq!(
        daemon.call_with("GET", &as_root, &[], b"").text(),
        "root only"
    );
}

/// A daemon that cannot switch (not root, asked to act as another user) says so; it never
/// acts as itself instead.
#[test]
fn a_daemon_that_cannot_switch_answers_500_naming_why() {
    if !root_or_fail() {
        return;
    }
    const OTHER: u32 = 4299;
    let daemon = common::builder()
        .arg("--fs-as-user")
        .wrap_with_shell(&format!(
            "chmod -R a+rX \"$(dirname \"$4\")\" && exec setpriv --reuid={OTHER} \
             --regid={OTHER} --clear-groups"
        ))
        .start();
    let file = daemon.dir.path().join("f");
    fs::write(&file, b"readable").unwrap();
    fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).unwrap();
    let reply = download(&daemon, &file, "user");
    assert_eq!(reply.status, 500, "{}", reply.text());
    assert!(
        reply.json()["message"]
            .as_str()
            .unwrap_or("")
            .starts_with("cannot act as user 'user' on the filesystem (--fs-as-user needs the daemon to run as root): "),
        "{}",
        reply.text()
    );
    assert_code(
        &rpc(&daemon, "Stat", AS_USER, json!({"path": file})),
        500,
        "internal",
    );
    let upload = upload(&daemon, &daemon.home().join("x"), "user", b"x");
    assert_eq!(upload.status, 500, "{}", upload.text());
    assert!(!daemon.home().join("x").exists());
}

/// The stdout of `sh -c script` started as the user `authorization` names.
fn output_of(daemon: &Daemon, script: &str, authorization: &str) -> String {
    let request = json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}});
    let mut stream = Stream::open(
        daemon,
        "process.Process/Start",
        &request,
        &[("Authorization", authorization)],
    );
    assert_eq!(stream.status, 200);
    let mut out = Vec::new();
    loop {
        let message = stream
            .next_within(WAIT)
            .expect("the stream ends within 10 s");
        assert!(!message.end, "no end event: {message:?}");
        let event = &message.json["event"];
        if let Some(data) = event["data"]["stdout"].as_str() {
            out.extend(base64_simd::STANDARD.decode_to_vec(data).unwrap());
        }
        if event.get("end").is_some() {
            return String::from_utf8(out).unwrap();
        }
    }
}

#[test]
fn a_worker_left_with_a_users_groups_starts_root_with_roots_groups() {
    if !root_or_fail() {
        return;
    }
    let (daemon, locked) = start(true);
    // Calls as the user on every worker (4, in parallel), each leaving the user's groups on
    // its thread (docs/design.md), then commands as root and as the user.
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..20 {
                    let shared = download(&daemon, &locked.join("shared"), "user");
                    assert_eq!(shared.status, 200);
                }
            });
        }
    });
    for _ in 0..8 {
        assert_eq!(
            output_of(&daemon, "id -G", AS_ROOT)
                .split_whitespace()
                .collect::<Vec<_>>(),
            ["0", "4500", "4600"]
        );
        assert_eq!(
            output_of(&daemon, "id -G", AS_USER)
                .split_whitespace()
                .collect::<Vec<_>>(),
            [USER_GID.to_string(), DEV_GID.to_string()]
        );
        let stat = rpc(
            &daemon,
            "Stat",
            AS_ROOT,
            json!({"path": locked.join("private")}),
        );
        assert_eq!(stat.status, 200, "{}", stat.text());
    }
}

#[test]
fn archives_are_read_and_written_with_the_users_rights() {
    if !root_or_fail() {
        return;
    }
    let (daemon, locked) = start(true);
    let target = |path: &Path, user: &str| {
        format!(
            "/files?path={}&format=tar&username={user}",
            enc(&path.to_string_lossy())
        )
    };
    // A directory the user may not list: refused before the answer.
    let private = locked.join("private");
    daemon.get(&target(&private, "user")).assert_error(
        403,
        &format!("permission denied reading '{}'", private.display()),
    );
    // A tree with a file the user may not read: the answer is cut (no last chunk) and the log
    // says why; root reads it whole.
    let reply = daemon.get(&target(&locked, "user"));
    assert_eq!(reply.status, 200);
    let (_, complete) = crate::download_gzip::dechunk(&reply.body);
    assert!(!complete, "the user's archive of locked/ was not cut");
    daemon.log_with(|l| l.contains("tar download of '") && l.contains("cut: "));
    let reply = daemon.get(&target(&locked, "root"));
    let (_, complete) = crate::download_gzip::dechunk(&reply.body);
    assert!(complete, "root's archive of locked/ was cut");
    // An upload as the user: made with the user's rights, owned by the user; into root's
    // directory it is refused with nothing left.
    let body = crate::archive::archive(&[("d/", b'5', &b""[..], ""), ("d/f", b'0', &b"x"[..], "")]);
    let mine = daemon.home().join("mine");
    let reply = daemon.call_with(
        "PUT",
        &target(&mine, "user"),
        &[("X-Access-Token", TOKEN)],
        &body,
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    for path in ["", "d", "d/f"] {
        let meta = fs::symlink_metadata(mine.join(path)).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (USER_UID, USER_GID), "{path}");
    }
    let reply = daemon.call_with(
        "PUT",
        &target(&locked.join("new"), "user"),
        &[("X-Access-Token", TOKEN)],
        &body,
    );
    assert_eq!(reply.status, 403, "{}", reply.text());
    assert!(!locked.join("new").exists());
    assert!(common::temporaries(&locked).is_empty());
}

/// A read-only file with `user.e2b.*` metadata unpacked into a new directory: its metadata is
/// set while the user may still write it, with the option as without.
#[test]
fn a_read_only_file_with_metadata_unpacks_as_the_user() {
    if !root_or_fail() {
        return;
    }
    fn header(name: &str, flag: u8, size: usize, mode: &[u8; 8]) -> Vec<u8> {
        let mut b = vec![0u8; 512];
        b[..name.len()].copy_from_slice(name.as_bytes());
        b[100..108].copy_from_slice(mode);
        b[108..116].copy_from_slice(b"0000000\0");
        b[116..124].copy_from_slice(b"0000000\0");
        b[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
        b[136..148].copy_from_slice(b"14524770400\0");
        b[156] = flag;
        b[257..265].copy_from_slice(b"ustar\x0000");
        b[148..156].fill(b' ');
        let sum: u32 = b.iter().map(|&x| u32::from(x)).sum();
        b[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        b
    }
    let record = "SCHILY.xattr.user.e2b.k=v\n";
    let record = format!("{} {record}", record.len() + 3);
    let mut body = header("pax", b'x', record.len(), b"0000644\0");
    body.extend_from_slice(record.as_bytes());
    body.resize(body.len().div_ceil(512) * 512, 0);
    body.extend_from_slice(&header("f", b'0', 1, b"0000444\0"));
    body.push(b'x');
    body.resize(body.len().div_ceil(512) * 512 + 1024, 0);
    for on in [false, true] {
        let (daemon, _) = start(on);
        let dest = daemon.home().join("newtree");
        let reply = daemon.call_with(
            "PUT",
            &format!(
                "/files?path={}&format=tar&username=user",
                enc(&dest.to_string_lossy())
            ),
            &[("X-Access-Token", TOKEN)],
            &body,
        );
        assert_eq!(reply.status, 200, "--fs-as-user {on}: {}", reply.text());
        let meta = fs::metadata(dest.join("f")).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o444, "--fs-as-user {on}");
        assert_eq!(
            xattr::get(dest.join("f"), "user.e2b.k").unwrap(),
            Some(b"v".to_vec())
        );
    }
}
