//! One QEMU guest per test, as E2B runs a sandbox: the guest at 169.254.0.21 on QEMU's user
//! network with `restrict=on` (it reaches nothing but the forwards below), the daemon's port and
//! one service port forwarded from 127.0.0.1 on the host (`hostfwd`), the metadata service at
//! the guest's metadata address forwarded to a fake on the host's loopback (`guestfwd`), a QMP socket to
//! stop, snapshot and end it. The QEMU process is this test's own child and is killed by its pid
//! when the `Vm` is dropped. KVM is used when a probe boot shows it works, else TCG.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::http::{self, Message, Output, Reply, Stream};
use crate::mmds::FakeMmds;
use crate::qmp::Qmp;

/// The daemon's port in the guest (envd's).
pub const API_PORT: u16 = 49983;
/// A port the tests serve in the guest on 127.0.0.1, reached through the daemon's forward.
pub const SERVICE_PORT: u16 = 8000;
/// The guest's clock starts here, years behind the host's, as a resumed sandbox's may be.
const RTC_BASE: &str = "2020-01-01T00:00:00";

/// Where `vm/images` puts the images: `target/vm` of the repository.
pub fn images() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/vm")
}

/// `kvm` when a probe boot under KVM reaches the end of the kernel's start, else `tcg` (nested
/// KVM on a microVM may fail with emulation errors). `SANDBOXD_VM_ACCEL` overrides it.
pub fn accel() -> &'static str {
    static ACCEL: OnceLock<&'static str> = OnceLock::new();
    ACCEL.get_or_init(|| {
        let chosen = match std::env::var("SANDBOXD_VM_ACCEL").as_deref() {
            Ok("kvm") => "kvm",
            Ok("tcg") => "tcg",
            _ if kvm_boots() => "kvm",
            _ => "tcg",
        };
        eprintln!("vm: accelerator {chosen}");
        chosen
    })
}

/// Boots the kernel with no root under KVM: it panics ("VFS: Unable to mount root") within
/// seconds when KVM works; QEMU dies or hangs when it does not.
fn kvm_boots() -> bool {
    if !Path::new("/dev/kvm").exists() {
        return false;
    }
    let mut child = Command::new("qemu-system-x86_64")
        .args([
            "-M",
            "q35,accel=kvm",
            "-cpu",
            "host",
            "-m",
            "128M",
            "-nodefaults",
        ])
        .args([
            "-no-user-config",
            "-display",
            "none",
            "-no-reboot",
            "-serial",
            "stdio",
        ])
        .arg("-kernel")
        .arg(images().join("vmlinuz"))
        .args(["-append", "console=ttyS0 panic=-1 loglevel=1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qemu-system-x86_64 (vm/deps installs it)");
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    let works = said.contains("Kernel panic");
    if !works {
        let err = String::from_utf8_lossy(&output.stderr);
        eprintln!("vm: KVM probe failed, using TCG: {}", err.trim());
    }
    works
}

/// A free port on 127.0.0.1 (bound, then released for QEMU to bind).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct Vm {
    pub dir: PathBuf,
    /// The daemon, 169.254.0.21:49983, as the host reaches it.
    pub api: SocketAddr,
    /// 169.254.0.21:8000 (`SERVICE_PORT`), as the host reaches it.
    pub service: SocketAddr,
    pub mmds: Arc<FakeMmds>,
    /// The token sent as `X-Access-Token` once `/init` set one.
    pub token: Option<String>,
    /// When this QEMU process was started.
    pub started: Instant,
    child: Child,
    pub qmp: Qmp,
    image: String,
}

impl Vm {
    /// Boots guest `image` (`minimal` or `template`) for test `name`, on a copy of its root disk under
    /// `target/vm/run/<name>/`, with `mmds` as its metadata service.
    pub fn boot(name: &str, image: &str, mmds: Arc<FakeMmds>) -> Vm {
        let dir = images().join("run").join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let source = images().join(image).join("root.ext4");
        let copied = Command::new("cp")
            .args(["--sparse=always", "--reflink=auto"])
            .arg(&source)
            .arg(dir.join("root.ext4"))
            .status()
            .unwrap();
        assert!(
            copied.success(),
            "{}: run `make vm-test` (vm/images builds it)",
            source.display()
        );
        let ports = (free_port(), free_port());
        Vm::spawn(dir, image, ports, mmds, None)
    }

    fn spawn(
        dir: PathBuf,
        image: &str,
        ports: (u16, u16),
        mmds: Arc<FakeMmds>,
        incoming: Option<&Path>,
    ) -> Vm {
        let accel = accel();
        let netdev = format!(
            "user,id=net,net=169.254.0.0/16,restrict=on,\
             hostfwd=tcp:127.0.0.1:{}-169.254.0.21:{API_PORT},\
             hostfwd=tcp:127.0.0.1:{}-169.254.0.21:{SERVICE_PORT},\
             guestfwd=tcp:169.254.169.254:80-cmd:socat - TCP:127.0.0.1:{}",
            ports.0,
            ports.1,
            mmds.addr.port()
        );
        // Both guests start from the minimal initramfs; the template's root runs systemd.
        let mut append = String::from("console=ttyS0 quiet panic=-1 net.ifnames=0");
        if image == "template" {
            append.push_str(" stage2=/lib/systemd/systemd");
        }
        let qmp_path = dir.join("qmp.sock");
        let _ = std::fs::remove_file(&qmp_path);
        let mut command = Command::new("qemu-system-x86_64");
        command
            .args([
                "-name",
                &format!("sandboxd-vm-{}", dir.file_name().unwrap().to_string_lossy()),
            ])
            .args(["-M", &format!("q35,accel={accel}")])
            .args(if accel == "kvm" {
                &["-cpu", "host"][..]
            } else {
                &[][..]
            })
            .args(["-m", "512M", "-smp", "2", "-nodefaults", "-no-user-config"])
            .args(["-display", "none", "-no-reboot"])
            .arg("-kernel")
            .arg(images().join("vmlinuz"))
            .arg("-initrd")
            .arg(images().join("minimal/initrd.cpio.gz"))
            .args(["-append", &append])
            .arg("-chardev")
            .arg(format!(
                "file,id=console,path={},append=on",
                dir.join("console.log").display()
            ))
            .args(["-serial", "chardev:console"])
            .arg("-drive")
            .arg(format!(
                "file={},format=raw,if=none,id=root",
                dir.join("root.ext4").display()
            ))
            .args(["-device", "virtio-blk-pci,drive=root"])
            .args(["-netdev", &netdev])
            .args(["-device", "virtio-net-pci,netdev=net,romfile="])
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp_path.display()))
            .args(["-rtc", &format!("base={RTC_BASE}")]);
        if let Some(snapshot) = incoming {
            command
                .arg("-incoming")
                .arg(format!("exec:cat {}", snapshot.display()));
        }
        let log = std::fs::File::create(dir.join("qemu.log")).unwrap();
        let started = Instant::now();
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("qemu-system-x86_64 (vm/deps installs it)");
        let qmp = Qmp::connect(&qmp_path, Duration::from_secs(30));
        Vm {
            api: SocketAddr::from(([127, 0, 0, 1], ports.0)),
            service: SocketAddr::from(([127, 0, 0, 1], ports.1)),
            dir,
            mmds,
            token: None,
            started,
            child,
            qmp,
            image: image.to_string(),
        }
    }

    /// The guest's console so far (kernel messages, /init's, the daemon's log).
    pub fn console(&self) -> String {
        std::fs::read_to_string(self.dir.join("console.log")).unwrap_or_default()
    }

    fn qemu_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("qemu.log")).unwrap_or_default()
    }

    /// Waits for the first `/health` 204 (at most `limit` after QEMU started); returns how long
    /// after QEMU started it came. Panics with the console when QEMU ends or time runs out.
    pub fn wait_health(&mut self, limit: Duration) -> Duration {
        let from = self.started;
        self.wait_health_since(from, limit)
    }

    /// The first `/health` 204, as time since `from`.
    pub fn wait_health_since(&mut self, from: Instant, limit: Duration) -> Duration {
        loop {
            let answer = http::call(self.api, "GET", "/health", &[], b"", Duration::from_secs(2));
            if answer.is_ok_and(|r| r.status == 204) {
                return from.elapsed();
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "QEMU ended ({status}) before /health answered\n{}\n{}",
                    self.qemu_log(),
                    self.console()
                );
            }
            assert!(
                from.elapsed() < limit,
                "no /health 204 within {limit:?}\n{}",
                self.console()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn auth(&self) -> Vec<(&str, &str)> {
        match &self.token {
            Some(token) => vec![("X-Access-Token", token.as_str())],
            None => Vec::new(),
        }
    }

    /// `method target` with the token and `headers`; panics when nothing answers in 60 s.
    pub fn call_with(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Reply {
        let mut all = self.auth();
        all.extend_from_slice(headers);
        http::call(
            self.api,
            method,
            target,
            &all,
            body,
            Duration::from_secs(60),
        )
        .unwrap_or_else(|e| panic!("{method} {target}: {e}\n{}", self.console()))
    }

    pub fn call(&self, method: &str, target: &str, body: &[u8]) -> Reply {
        self.call_with(method, target, &[], body)
    }

    /// `/init` with `body` (JSON).
    pub fn init(&self, body: &Value) -> Reply {
        let headers = [("Content-Type", "application/json")];
        self.call_with("POST", "/init", &headers, body.to_string().as_bytes())
    }

    /// Starts `sh -c script` through the process service as root; the stream after `start`.
    pub fn start(&self, script: &str) -> (Stream, Output) {
        let request = json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}});
        let mut headers = self.auth();
        headers.push(("Authorization", "Basic cm9vdDo="));
        let mut stream = Stream::open(self.api, "process.Process/Start", &request, &headers);
        assert_eq!(stream.status, 200, "Start of {script:?}");
        let mut output = Output::default();
        while output.pid == 0 {
            let message = stream
                .next_within(Duration::from_secs(30))
                .expect("a start event");
            output.take(&message);
        }
        (stream, output)
    }

    /// Runs `sh -c script` as root to its end (at most `limit`).
    pub fn run_within(&self, script: &str, limit: Duration) -> Output {
        let (mut stream, mut output) = self.start(script);
        let deadline = Instant::now() + limit;
        while output.end.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            let message: Message = stream
                .next_within(left)
                .unwrap_or_else(|| panic!("{script:?} did not end within {limit:?}: {output:?}"));
            assert!(
                !message.end,
                "{script:?}: the stream ended first: {}",
                message.json
            );
            output.take(&message);
        }
        output
    }

    /// Runs `sh -c script` as root; its stdout, asserting it exited 0.
    pub fn run(&self, script: &str) -> String {
        let output = self.run_within(script, Duration::from_secs(60));
        assert_eq!(output.exit_code(), 0, "{script:?}: {output:?}");
        output.stdout
    }

    /// Stops the guest and saves it to `file` as E2B's pause does (`stop`, then a migration to
    /// the file), then ends this QEMU. Returns how long the save took.
    pub fn snapshot(&mut self, file: &Path) -> Duration {
        let started = Instant::now();
        self.qmp.execute("stop", json!({})).unwrap();
        let uri = format!("exec:cat > {}", file.display());
        self.qmp.execute("migrate", json!({"uri": uri})).unwrap();
        loop {
            let state = self.qmp.execute("query-migrate", json!({})).unwrap();
            match state["status"].as_str() {
                Some("completed") => break,
                Some("failed") | Some("cancelled") => panic!("migration to a file: {state}"),
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        let saved = started.elapsed();
        let _ = self.qmp.execute("quit", json!({}));
        let status = self.wait_exit(Duration::from_secs(30));
        assert!(status.is_some(), "QEMU did not quit");
        saved
    }

    /// A new QEMU restored from `file` (made by `snapshot`), same disk, ports and metadata
    /// service, left paused: `cont` it with [`Vm::resume`].
    pub fn restore(self, file: &Path) -> Vm {
        let dir = self.dir.clone();
        let image = self.image.clone();
        let ports = (self.api.port(), self.service.port());
        let token = self.token.clone();
        let mmds = Arc::clone(&self.mmds);
        drop(self);
        let mut vm = Vm::spawn(dir, &image, ports, mmds, Some(file));
        vm.token = token;
        let deadline = Instant::now() + Duration::from_secs(120);
        while vm.qmp.status() != "paused" {
            assert!(
                Instant::now() < deadline,
                "the snapshot was not loaded: {}",
                vm.qemu_log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        vm
    }

    /// Lets a restored guest run; the instant it was let go.
    pub fn resume(&mut self) -> Instant {
        self.qmp.execute("cont", json!({})).unwrap();
        Instant::now()
    }

    /// Waits for this QEMU to exit, at most `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        // Our own child, by its pid.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
