//! The template guest: a Debian root with systemd, a `user` account and the daemon installed as
//! `/usr/bin/envd` under E2B's own unit (vm/template/envd.service): the unit's priorities reach
//! the daemon, E2B's create works there, a crash is restarted by `Restart=always` and the next
//! `/init` restores the sandbox, and a live upgrade to a second build keeps the pid systemd
//! watches.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::http::{self, Output, Stream};
use crate::support::{boot, create, figure, highest, kb, BOOT_LIMIT, TOKEN};

const CERT: &str = include_str!("../../tests/fixtures/ca-a.pem");

/// `systemctl show envd -p <property> --value`.
fn unit(vm: &crate::qemu::Vm, property: &str) -> String {
    let value = vm.run(&format!("systemctl show envd -p {property} --value"));
    value.trim().to_string()
}

#[test]
fn e2b_s_unit_starts_the_daemon_with_its_priorities_and_create_works() {
    let (mut vm, ready) = boot("template-unit", "template");
    figure(
        "QEMU start to first /health 204 (template, systemd)",
        &format!("{:.2} s", ready.as_secs_f64()),
    );
    let pid = unit(&vm, "MainPID");
    assert_eq!(
        vm.run(&format!("tr '\\0' ' ' < /proc/{pid}/cmdline"))
            .trim(),
        "/usr/bin/envd"
    );
    let stat = vm.run(&format!("cat /proc/{pid}/stat"));
    let fields: Vec<&str> = stat.rsplit(") ").next().unwrap().split(' ').collect();
    assert_eq!(fields[16], "-20", "Nice=-20: {stat}");
    assert_eq!(
        vm.run(&format!("cat /proc/{pid}/oom_score_adj")).trim(),
        "-1000"
    );
    assert_eq!(
        vm.run(&format!("ionice -p {pid}")).trim(),
        "realtime: prio 4"
    );
    let status = vm.run(&format!("cat /proc/{pid}/status"));
    let rollup = vm.run(&format!("cat /proc/{pid}/smaps_rollup"));
    let private = kb(&rollup, "Private_Clean") + kb(&rollup, "Private_Dirty");
    figure(
        "daemon RSS; private memory in the guest, idle (template)",
        &format!("{} KiB; {private} KiB", kb(&status, "VmRSS")),
    );
    create(
        &mut vm,
        json!({"envVars": {"VM_VAR": "t"}, "defaultUser": "user", "caBundle": CERT}),
    );
    // The trust store is the tmpfs E2B's ExecStartPre bind-mounts; the CA went there.
    let bundle = vm.call("GET", "/files?path=/etc/ssl/certs/ca-certificates.crt", b"");
    assert!(bundle.text().contains(CERT.trim()));
    assert!(vm
        .run("findmnt -n -o FSTYPE /etc/ssl/certs")
        .contains("tmpfs"));
    let request =
        json!({"process": {"cmd": "/bin/bash", "args": ["-c", "id -un; echo $HOME $VM_VAR"]}});
    let mut stream = Stream::open(
        vm.api,
        "process.Process/Start",
        &request,
        &[("X-Access-Token", TOKEN)],
    );
    let mut output = Output::default();
    while output.end.is_none() {
        output.take(
            &stream
                .next_within(Duration::from_secs(30))
                .expect("the command ends"),
        );
    }
    assert_eq!(output.stdout, "user\n/home/user t\n");
}

#[test]
fn a_crash_is_restarted_by_systemd_and_the_next_init_restores_the_sandbox() {
    let (mut vm, _) = boot("template-crash", "template");
    let create_body = json!({"envVars": {"VM_VAR": "kept"}, "defaultUser": "user"});
    create(&mut vm, create_body.clone());
    let pid = unit(&vm, "MainPID");
    assert_eq!(unit(&vm, "NRestarts"), "0");
    // SIGKILL from a process of its own that outlives the request.
    vm.run(&format!(
        "setsid sh -c 'sleep 1; kill -9 {pid}' >/dev/null 2>&1 < /dev/null &"
    ));
    let deadline = Instant::now() + Duration::from_secs(60);
    while http::call(vm.api, "GET", "/health", &[], b"", Duration::from_secs(2))
        .is_ok_and(|r| r.status == 204)
    {
        assert!(Instant::now() < deadline, "the daemon was not killed");
        std::thread::sleep(Duration::from_millis(50));
    }
    let killed = Instant::now();
    let back = vm.wait_health_since(killed, BOOT_LIMIT);
    figure(
        "SIGKILL to /health 204 again under Restart=always",
        &format!("{:.2} s", back.as_secs_f64()),
    );
    // A new daemon: no token, no variables, until the orchestrator's /init restores them.
    vm.token = None;
    assert!(vm.call("GET", "/envs", b"").json().get("VM_VAR").is_none());
    create(&mut vm, create_body);
    assert_eq!(vm.call("GET", "/envs", b"").json()["VM_VAR"], "kept");
    assert_eq!(
        http::call(vm.api, "GET", "/envs", &[], b"", Duration::from_secs(30))
            .unwrap()
            .status,
        401
    );
    assert_eq!(unit(&vm, "NRestarts"), "1");
    assert_ne!(unit(&vm, "MainPID"), pid);
}

#[test]
fn a_live_upgrade_to_a_second_build_keeps_the_pid_systemd_watches() {
    let (mut vm, _) = boot("template-upgrade", "template");
    create(&mut vm, json!({"envVars": {"VM_VAR": "carried"}}));
    let pid = unit(&vm, "MainPID");
    let (mut ticker, mut before) =
        vm.start("i=0; while :; do echo tick $i; i=$((i+1)); sleep 0.2; done");
    while !before.stdout.contains("tick 2\n") {
        before.take(&ticker.next_within(Duration::from_secs(30)).expect("ticks"));
    }
    // The second build: this test's own host build of sandboxd (glibc, debug), stripped; the
    // guest's first is the static musl release build.
    let second = vm.dir.join("envd-second");
    let stripped = Command::new("strip")
        .arg("-o")
        .arg(&second)
        .arg(env!("CARGO_BIN_EXE_sandboxd"))
        .status()
        .unwrap();
    assert!(stripped.success());
    let binary = std::fs::read(&second).unwrap();
    let headers = [
        ("X-Access-Token", TOKEN),
        ("X-Envd-Upgrade-Bin", "/usr/bin/envd.next"),
    ];
    let started = Instant::now();
    // No answer: the connection closes as the new binary takes over.
    let _ = http::call(
        vm.api,
        "POST",
        "/upgrade",
        &headers,
        &binary,
        Duration::from_secs(300),
    );
    let ready = vm.wait_health_since(started, Duration::from_secs(120));
    figure(
        "POST /upgrade of a 2nd build to /health 204 (template, body through QEMU's network)",
        &format!(
            "{:.2} s for {} MiB",
            ready.as_secs_f64(),
            binary.len() >> 20
        ),
    );
    let handover = vm.init(&json!({}));
    assert_eq!(handover.status, 204);
    let carried = handover.header("x-envd-handover").expect("X-Envd-Handover");
    assert!(
        carried.contains("\"failed\":false") && carried.contains("\"procs\":1"),
        "{carried}"
    );
    assert_eq!(unit(&vm, "MainPID"), pid, "the same process");
    assert_eq!(unit(&vm, "NRestarts"), "0");
    assert_eq!(unit(&vm, "ActiveState"), "active");
    assert_eq!(
        vm.run(&format!("readlink /proc/{pid}/exe")).trim(),
        "/usr/bin/envd.next"
    );
    assert!(
        vm.run(&format!("cat /proc/{pid}/maps"))
            .contains("libc.so.6"),
        "the glibc build runs"
    );
    assert_eq!(vm.call("GET", "/envs", b"").json()["VM_VAR"], "carried");
    // The command started before goes on: Connect again for the rest.
    let last = highest(&before.stdout, "tick ").expect("ticks");
    let request = json!({"process": {"pid": before.pid}});
    let headers = [("X-Access-Token", TOKEN)];
    let mut again = Stream::open(vm.api, "process.Process/Connect", &request, &headers);
    assert_eq!(again.status, 200);
    let mut after = Output::default();
    let deadline = Instant::now() + Duration::from_secs(30);
    while highest(&after.stdout, "tick ").is_none_or(|n| n < last + 3) {
        assert!(Instant::now() < deadline, "no tick past {last}: {after:?}");
        if let Some(message) = again.next_within(Duration::from_secs(1)) {
            after.take(&message);
        }
    }
}
