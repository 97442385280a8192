//! Test harness: starts the real `sandboxd` binary on 127.0.0.1:0 with a temp dir, a passwd file
//! and a token of its own, and talks HTTP/1.1 to it over plain sockets; `connect` makes
//! Connect calls on top.

pub mod cgroup;
pub mod connect;
pub mod image;
pub mod mmds;
mod mount;
mod reply;
mod rng;

pub use mount::Mount;
pub use reply::{answered_yet, read_reply, Reply};
pub use rng::Rng;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const TOKEN: &str = "test-token-0123456789";
/// What a download of a directory without `format=tar` adds to "path '...' is a directory".
pub const TAR_HINT: &str = ": add format=tar to download it as a tar archive";
/// uid/gid of the test user: different from the test runner's, so ownership is observable.
pub const USER_UID: u32 = 4242;
pub const USER_GID: u32 = 4343;

pub struct Daemon {
    child: Child,
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    log: Arc<Mutex<Vec<String>>>,
}

pub struct Builder {
    shell_prefix: Option<String>,
    /// Run the binary through a symlink of this name in the temp dir (argv[0]'s file name).
    program_name: Option<String>,
    token: Option<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// `--cgroup-root` for a daemon left at its `--process-cgroups` default.
    cgroup_root: Option<PathBuf>,
}

pub fn builder() -> Builder {
    Builder {
        shell_prefix: None,
        program_name: None,
        token: Some(TOKEN.to_string()),
        args: Vec::new(),
        env: Vec::new(),
        cgroup_root: None,
    }
}

impl Builder {
    pub fn no_token(mut self) -> Self {
        self.token = None;
        self
    }
    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_string());
        self
    }
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }
    /// Runs the binary through `sh -c '<prefix> "$0" "$@"'`, e.g. to set limits with `ulimit`.
    pub fn wrap_with_shell(mut self, prefix: &str) -> Self {
        self.shell_prefix = Some(prefix.to_string());
        self
    }
    /// Starts the binary under this file name (a symlink in the temp dir): `envd` takes envd's
    /// metadata-service default, so pass `-isnotfc` or `--mmds-address 127.0.0.1:PORT` with it.
    pub fn program_name(mut self, name: &str) -> Self {
        self.program_name = Some(name.to_string());
        self
    }
    /// No `--process-cgroups`, so its default applies (the `--cgroup-root` directory), with
    /// `--cgroup-root` at `dir`: a directory of the test's own, never the machine's hierarchy.
    pub fn default_process_cgroups_under(mut self, dir: &Path) -> Self {
        self.cgroup_root = Some(dir.to_path_buf());
        self
    }
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    pub fn start(self) -> Daemon {
        let dir = tempfile::tempdir().expect("temp dir");
        let home = dir.path().join("home/user");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(dir.path().join("root")).unwrap();
        let passwd = dir.path().join("passwd");
        std::fs::write(
            &passwd,
            format!(
                "root:x:0:0:root:{root}:/bin/sh\nuser:x:{USER_UID}:{USER_GID}:User:{home}:/bin/sh\n",
                root = dir.path().join("root").display(),
                home = home.display()
            ),
        )
        .unwrap();
        let binary = match &self.program_name {
            Some(name) => {
                let link = dir.path().join(name);
                std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sandboxd"), &link).unwrap();
                link.to_str().unwrap().to_string()
            }
            None => env!("CARGO_BIN_EXE_sandboxd").to_string(),
        };
        let mut command = match &self.shell_prefix {
            Some(prefix) => {
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg(format!("{prefix} \"$0\" \"$@\""))
                    .arg(&binary);
                sh
            }
            None => Command::new(&binary),
        };
        command
            .args(["--listen", "127.0.0.1:0", "--passwd-file"])
            .arg(&passwd);
        // No port forwarding unless the test asks for it: every daemon's scanner would see
        // the loopback servers of all the others (tests/forward.rs gives each its own address).
        let forwarding = self.args.iter().any(|a| a.starts_with("--forward-address"))
            || self
                .env
                .iter()
                .any(|(k, _)| k == "SANDBOXD_FORWARD_ADDRESS");
        if !forwarding {
            command.args(["--forward-address", "off"]);
        }
        command
            .args(&self.args)
            .env_remove("SANDBOXD_ACCESS_TOKEN")
            .env_remove("NOTIFY_SOCKET")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(token) = &self.token {
            let file = dir.path().join("token");
            std::fs::write(&file, format!("{token}\n")).unwrap();
            command.arg("--access-token-file").arg(file);
        }
        // Never the machine's own: no cgroups made in the machine's hierarchy (the default is
        // its root, /sys/fs/cgroup), and a /fsfreeze a test did not point at an image of its
        // own fails (the path does not exist) instead of freezing the machine's root. A test's
        // `env` or flag overrides them.
        match &self.cgroup_root {
            Some(root) => {
                command
                    .env_remove("SANDBOXD_PROCESS_CGROUPS")
                    .arg("--cgroup-root")
                    .arg(root);
            }
            None => {
                command.env("SANDBOXD_PROCESS_CGROUPS", "off");
            }
        }
        command.env("SANDBOXD_FSFREEZE_PATH", dir.path().join("no-fsfreeze"));
        for (key, value) in &self.env {
            command.env(key, value);
        }
        let mut child = command.spawn().expect("spawn sandboxd");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line.split(" listening on ").nth(1) {
                    let addr = addr.split(' ').next().unwrap_or("").to_string();
                    let _ = tx.send(addr);
                }
                sink.lock().unwrap().push(line);
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("daemon did not start: {:?}", log.lock().unwrap()));
        Daemon {
            child,
            addr: addr.parse().unwrap(),
            dir,
            log,
        }
    }
}

pub fn start() -> Daemon {
    builder().start()
}

impl Daemon {
    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home/user")
    }

    pub fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(self.addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        stream
    }

    /// Sends raw bytes on a new connection and reads one response.
    pub fn raw(&self, request: &[u8]) -> Reply {
        let mut stream = self.connect();
        stream.write_all(request).unwrap();
        read_reply(&mut BufReader::new(stream), false).expect("a response")
    }

    /// `method target` with the token, `Connection: close`, and an optional body.
    pub fn call(&self, method: &str, target: &str, body: &[u8]) -> Reply {
        self.call_with(method, target, &[("X-Access-Token", TOKEN)], body)
    }

    pub fn call_with(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Reply {
        let stream = self.send(method, target, headers, body);
        read_reply(&mut BufReader::new(stream), method == "HEAD").expect("a response")
    }

    /// Sends what `call_with` sends, on a connection of its own, and returns it unread: the
    /// answer is read later (`read_reply`), so requests can wait together.
    pub fn send(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> TcpStream {
        let mut request =
            format!("{method} {target} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        if !body.is_empty() || method == "POST" || method == "PUT" {
            request.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        request.push_str("\r\n");
        let mut bytes = request.into_bytes();
        bytes.extend_from_slice(body);
        let mut stream = self.connect();
        stream.write_all(&bytes).unwrap();
        stream
    }

    pub fn get(&self, target: &str) -> Reply {
        self.call("GET", target, b"")
    }

    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// The log once one of its lines satisfies `found`, waited for at most 5 s: a thread
    /// collects stderr, so a line the daemon wrote before answering may reach the test after
    /// the answer. Panics with the log when no line comes.
    pub fn log_with(&self, found: impl Fn(&str) -> bool) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let log = self.log();
            if log.iter().any(|line| found(line)) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "no such line in the log: {log:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("a pid fits in pid_t")
    }

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit, at most `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `/health` on a fresh connection answers 204 within `limit` (a daemon that stopped serving
/// never answers: the read gives up after `limit` plus 5 s).
pub fn assert_health_within(daemon: &Daemon, limit: Duration) {
    let started = Instant::now();
    let mut stream = daemon.connect();
    stream
        .set_read_timeout(Some(limit + Duration::from_secs(5)))
        .unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let reply = read_reply(&mut BufReader::new(stream), false).expect("/health answered");
    assert_eq!(reply.status, 204);
    assert!(
        started.elapsed() < limit,
        "/health took {:?}",
        started.elapsed()
    );
}

/// Writes `contents` to `path`, creating parents.
pub fn write_file(path: &Path, contents: &[u8]) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(path, contents).unwrap();
}

/// The low byte of `n`: test patterns wrap around on purpose.
pub fn low_byte(n: usize) -> u8 {
    n.to_le_bytes()[0]
}

/// Percent-encodes a query value.
pub fn enc(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// Whether the part of a test that needs root can run (`reason` says what needs it, e.g.
/// "mounting a tmpfs needs root"): true as root. Otherwise that part is skipped with a message,
/// unless `SANDBOXD_REQUIRE_ROOT_TESTS=1` (`.ci/run`, which runs as root, sets it): then the
/// test fails, so a root-only test never passes without having run.
pub fn root_or_skip(reason: &str) -> bool {
    if is_root() {
        return true;
    }
    if std::env::var_os("SANDBOXD_REQUIRE_ROOT_TESTS").is_some_and(|v| v == "1") {
        panic!("{reason}, and SANDBOXD_REQUIRE_ROOT_TESTS=1 requires the root-only tests to run");
    }
    eprintln!("skipped: {reason}");
    false
}

/// True when the tests run as root (mounts, chown to another user). Tests that need root use
/// [`root_or_skip`]; this is for those that run either way, on a tmpfs as root or on the disk.
pub fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .map(|ids| ids.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// Names in `dir` that look like sandboxd's temporaries.
pub fn temporaries(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains(".sandboxd-") && name.ends_with(".tmp"))
        .collect()
}

impl Daemon {
    /// `sandboxd sign PATH ARGS...` with this daemon's URL and token; returns the target
    /// (`/files?...`).
    pub fn sign(&self, path: &str, args: &[&str]) -> String {
        let url = format!("http://{}", self.addr);
        let output = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
            .arg("sign")
            .arg(path)
            .args(["--url", &url])
            .args(args)
            .env("SANDBOXD_ACCESS_TOKEN", TOKEN)
            .env_remove("SANDBOXD_ACCESS_TOKEN_FILE")
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let printed = String::from_utf8(output.stdout).unwrap();
        printed.trim().strip_prefix(&url).unwrap().to_string()
    }
}

/// Every file under `dir` (paths relative to it) with its contents, sorted: compare two
/// snapshots to prove a refused request changed nothing on disk.
pub fn files_under(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path
                    .strip_prefix(dir)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.push((rel, std::fs::read(&path).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// `clients` keep-alive connections each sending `requests` `GET /health` in sequence, all at
/// once; every answer must be 204 on a connection kept alive. Returns how long they all took.
pub fn busy_keep_alive_clients(daemon: &Daemon, clients: usize, requests: usize) -> Duration {
    let started = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let stream = daemon.connect();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut writer = stream;
                for _ in 0..requests {
                    writer
                        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
                        .unwrap();
                    let reply = read_reply(&mut reader, false).expect("answered");
                    assert_eq!(reply.status, 204);
                    assert_eq!(reply.header("connection"), None, "kept alive");
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("a busy client failed");
    }
    started.elapsed()
}

/// How many unnamed (`O_TMPFILE`) files in `dir` process `pid` holds open: the files sandboxd is
/// writing, which `temporaries` cannot see because they have no name yet. The kernel shows
/// such a descriptor as `<dir>/#<inode> (deleted)`.
pub fn unnamed_files(pid: i32, dir: &Path) -> usize {
    let prefix = format!("{}/#", dir.display());
    let Ok(entries) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|entry| fs::read_link(entry.path()).ok())
        .filter(|target| {
            let target = target.to_string_lossy();
            target.starts_with(&prefix) && target.ends_with(" (deleted)")
        })
        .count()
}

/// The files sandboxd is writing in `dir`: named temporaries plus unnamed files it holds open.
pub fn files_in_progress(daemon: &Daemon, dir: &Path) -> usize {
    temporaries(dir).len() + unnamed_files(daemon.pid(), dir)
}
