//! The minimal guest: Debian's stock cloud kernel, a busybox initramfs that mounts the ext4 root
//! from virtio-blk, and the daemon exec'd as PID 1 by `/sbin/boot`, as `/usr/bin/envd` with no
//! flags. Booting to ready, the network's isolation, E2B's create `/init`, and the forward of a
//! loopback server on a kernel whose socket-diag modules are not loaded.

use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::http;
use crate::qemu::SERVICE_PORT;
use crate::support::{boot_minimal, clock_offset, create, figure, kb, SANDBOX_ID, TEMPLATE_ID};

const CERT: &str = include_str!("../../tests/fixtures/ca-a.pem");

#[test]
fn boots_to_ready_with_the_daemon_as_pid_1() {
    let (vm, ready) = boot_minimal("boot");
    figure(
        "QEMU start to first /health 204 (minimal)",
        &format!("{:.2} s", ready.as_secs_f64()),
    );
    // The kernel's own part: its timestamp when it ran the initramfs' /init.
    let dmesg = vm.run("dmesg");
    let kernel = dmesg
        .lines()
        .find(|l| l.contains("Run /init as init process"))
        .and_then(|l| {
            l.trim_start_matches('[')
                .split(']')
                .next()?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .expect("the kernel's 'Run /init' line");
    figure(
        "kernel start to /init (printk time)",
        &format!("{kernel:.2} s"),
    );
    let cmdline = vm.run("tr '\\0' ' ' < /proc/1/cmdline");
    assert_eq!(
        cmdline.trim(),
        "/usr/bin/envd",
        "PID 1 is envd, with no flags"
    );
    // Idle memory, read twice: the first read's command is the only work it did since boot.
    vm.run("cat /proc/1/status");
    let status = vm.run("cat /proc/1/status");
    let rollup = vm.run("cat /proc/1/smaps_rollup");
    let private = kb(&rollup, "Private_Clean") + kb(&rollup, "Private_Dirty");
    figure(
        "daemon RSS in the guest, idle",
        &format!("{} KiB", kb(&status, "VmRSS")),
    );
    figure(
        "daemon private memory in the guest, idle",
        &format!("{private} KiB"),
    );
    assert!(
        vm.mmds.violations().is_empty(),
        "{:?}",
        vm.mmds.violations()
    );
}

/// `restrict=on`: the guest reaches the metadata service's forward and nothing else, not even
/// the host's loopback through the gateway address (where an unrestricted user network sends
/// it). The listener below belongs to this test, so it sees any connection that got through;
/// the other address is TEST-NET-1, which routes nowhere even if something leaked.
#[test]
fn the_guest_reaches_nothing_but_the_forwards() {
    let (vm, _) = boot_minimal("restrict");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || loop {
        if listener.accept().is_ok() {
            counter.fetch_add(1, Ordering::SeqCst);
        }
        std::thread::sleep(Duration::from_millis(20));
    });
    let script = format!(
        "for to in '169.254.0.2 {port}' '192.0.2.1 80'; do \
           if nc -w 3 $to </dev/null; then echo \"reached $to\"; else echo \"refused $to\"; fi; \
         done"
    );
    let out = vm.run(&script);
    assert_eq!(
        out,
        format!("refused 169.254.0.2 {port}\nrefused 192.0.2.1 80\n")
    );
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "a guest connection reached the host"
    );
    // The metadata forward is the one way out, and it works.
    assert!(
        vm.mmds.reads() > 0,
        "the daemon never read the metadata service"
    );
}

/// E2B's create: the identity from the metadata service, then `/init` with the token whose hash
/// the service holds, the variables, the default user, the events address and the proxy's CA,
/// and a timestamp the guest's clock (booted in 2020) is set to.
#[test]
fn e2b_create_sets_identity_token_environment_system_files_and_clock() {
    let (mut vm, _) = boot_minimal("create");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while vm.call("GET", "/envs", b"").json()["E2B_SANDBOX_ID"] != SANDBOX_ID {
        assert!(
            std::time::Instant::now() < deadline,
            "no identity from the metadata service"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (behind, _) = clock_offset(&vm);
    assert!(behind < -3600.0, "the guest booted in 2020: {behind} s");
    create(
        &mut vm,
        json!({"envVars": {"VM_VAR": "a b"}, "defaultUser": "user", "defaultWorkdir": "/home/user",
               "hyperloopIP": "10.11.0.1", "caBundle": CERT}),
    );
    let (offset, error) = clock_offset(&vm);
    figure(
        "guest clock after the create /init",
        &format!("{offset:+.3} s (±{error:.3})"),
    );
    assert!(offset.abs() < 1.0 + error, "clock off by {offset} s");
    assert!(
        vm.console()
            .contains("init: clock set to /init's timestamp"),
        "{}",
        vm.console()
    );
    // The token is required now.
    let open = http::call(vm.api, "GET", "/envs", &[], b"", Duration::from_secs(30)).unwrap();
    assert_eq!(open.status, 401);
    let envs = vm.call("GET", "/envs", b"").json();
    assert_eq!(envs["VM_VAR"], "a b");
    assert_eq!(envs["E2B_SANDBOX_ID"], SANDBOX_ID);
    assert_eq!(envs["E2B_TEMPLATE_ID"], TEMPLATE_ID);
    assert_eq!(envs["E2B_EVENTS_ADDRESS"], "http://10.11.0.1");
    let file = |path: &str| {
        let reply = vm.call("GET", &format!("/files?path={path}"), b"");
        assert_eq!(reply.status, 200, "{path}: {}", reply.text());
        reply.text()
    };
    assert_eq!(file("/run/e2b/.E2B_SANDBOX_ID"), SANDBOX_ID);
    assert_eq!(file("/run/e2b/.E2B_TEMPLATE_ID"), TEMPLATE_ID);
    assert_eq!(file("/run/e2b/.E2B_SANDBOX"), "true");
    let hosts = file("/etc/hosts");
    assert!(
        hosts
            .lines()
            .any(|l| l.split_whitespace().eq(["10.11.0.1", "events.e2b.local"])),
        "{hosts}"
    );
    assert!(file("/etc/ssl/certs/ca-certificates.crt").contains(CERT.trim()));
    // A command with no user named runs as the default user, in its workdir, with the variables.
    let request =
        json!({"process": {"cmd": "/bin/sh", "args": ["-c", "id -un; pwd; echo $VM_VAR"]}});
    let token = [("X-Access-Token", crate::support::TOKEN)];
    let mut stream = http::Stream::open(vm.api, "process.Process/Start", &request, &token);
    let mut output = http::Output::default();
    while output.end.is_none() {
        output.take(
            &stream
                .next_within(Duration::from_secs(30))
                .expect("the command ends"),
        );
    }
    assert_eq!(output.stdout, "user\n/home/user\na b\n");
    // An upload with no user named is the default user's, in its home.
    let reply = vm.call("PUT", "/files?path=hello.txt", b"hello");
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        vm.run("stat -c '%U %n' /home/user/hello.txt"),
        "user /home/user/hello.txt\n"
    );
}

/// A server on the guest's 127.0.0.1 is reached from the host through the daemon's forward on
/// 169.254.0.21, on the stock kernel whose `inet_diag`/`tcp_diag` are modules nothing loaded.
#[test]
fn a_loopback_server_in_the_guest_is_reached_through_169_254_0_21() {
    let (vm, _) = boot_minimal("forward");
    let modules = vm.run("cat /proc/modules");
    assert!(
        !modules.contains("inet_diag") && !modules.contains("tcp_diag"),
        "{modules}"
    );
    let (_server, _) = vm.start(&format!(
        "mkdir -p /tmp/www && echo hello-from-the-guest > /tmp/www/index.html && \
         exec httpd -f -p 127.0.0.1:{SERVICE_PORT} -h /tmp/www"
    ));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let reply = http::call(
            vm.service,
            "GET",
            "/index.html",
            &[],
            b"",
            Duration::from_secs(5),
        );
        if let Ok(reply) = reply.as_ref() {
            if reply.status == 200 {
                assert_eq!(reply.text(), "hello-from-the-guest\n");
                break;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never forwarded: {reply:?}\n{}",
            vm.console()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        vm.console()
            .contains("forward: listing listening sockets from"),
        "{}",
        vm.console()
    );
}
