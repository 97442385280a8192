//! The process cgroups where E2B's guests have them (defect 4 of docs/vm.md): with no flags the
//! daemon makes envd's `ptys`, `user` and `socats` at the top of the cgroup v2 mount,
//! `/sys/fs/cgroup`, as envd's `-cgroup-root` default does. Under E2B's unit (`Delegate=yes`,
//! `CPUWeight=1000`, `MemoryMin=50M`, `Restart=always`, the whole unit killed on a restart) a
//! command therefore runs outside the daemon's unit: with envd's weights and memory limit, and
//! still running after the daemon crashed and systemd restarted it. The hierarchy freeze walks
//! that whole mount and keeps envd's liveness allowlist (systemd, journald) running. In the
//! minimal guest, the daemon as PID 1 in the root cgroup makes the same groups.

use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};

use crate::http::{self, Message, Output, Stream};
use crate::qemu::Vm;
use crate::support::{boot, boot_minimal, create, figure, rfc3339, BOOT_LIMIT, TOKEN};

/// The daemon's start-up lines about its process cgroups in the guest's console are one per
/// start (`starts`), the last saying the groups are at the top with no property skipped.
fn assert_made_at_the_top(vm: &Vm, starts: usize) {
    let console = vm.console();
    let lines: Vec<&str> = console
        .lines()
        .filter(|l| l.contains("process cgroups "))
        .collect();
    assert_eq!(lines.len(), starts, "{lines:?}");
    let last = lines[starts - 1];
    assert!(
        last.contains("process cgroups in /sys/fs/cgroup: ptys, user, socats"),
        "{last}"
    );
    assert!(!last.contains("skipped"), "{last}");
}

/// The `0::` line of `/proc/<pid>/cgroup` in the guest.
fn cgroup_of(vm: &Vm, pid: u32) -> String {
    let text = run_system(vm, &format!("cat /proc/{pid}/cgroup"));
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_else(|| panic!("no cgroup v2 line for {pid}: {text}"))
        .to_string()
}

/// Whether `cgroup.events` of `/sys/fs/cgroup/<dir>` says frozen.
fn frozen(vm: &Vm, dir: &str) -> bool {
    let events = run_system(vm, &format!("cat /sys/fs/cgroup/{dir}/cgroup.events"));
    events
        .lines()
        .find_map(|l| l.strip_prefix("frozen "))
        .unwrap_or_else(|| panic!("no frozen line in {dir}: {events}"))
        == "1"
}

/// Runs `sh -c script` as root in the daemon's own cgroup (tag `_system`, never frozen), to
/// its end; its stdout, asserting it exited 0.
fn run_system(vm: &Vm, script: &str) -> String {
    let request = json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}, "tag": "_system"});
    let mut headers = vec![("Authorization", "Basic cm9vdDo=")];
    if let Some(token) = &vm.token {
        headers.push(("X-Access-Token", token.as_str()));
    }
    let mut stream = Stream::open(vm.api, "process.Process/Start", &request, &headers);
    assert_eq!(stream.status, 200, "Start of {script:?}");
    let mut output = Output::default();
    let deadline = Instant::now() + Duration::from_secs(60);
    while output.end.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        let message: Message = stream
            .next_within(left)
            .unwrap_or_else(|| panic!("{script:?} did not end: {output:?}"));
        assert!(!message.end, "{script:?}: {}", message.json);
        output.take(&message);
    }
    assert_eq!(output.exit_code(), 0, "{script:?}: {output:?}");
    output.stdout
}

/// Lines the ticker has written so far.
fn ticks(vm: &Vm) -> usize {
    run_system(vm, "wc -l < /tmp/ticks").trim().parse().unwrap()
}

/// The ticker goes on (`true`) or stands still (`false`) over about a second.
fn ticking(vm: &Vm) -> bool {
    let before = ticks(vm);
    std::thread::sleep(Duration::from_millis(1200));
    ticks(vm) > before
}

/// `memory.max` as envd computes it (the machine's memory less an eighth, at most 128 MiB),
/// as the kernel keeps it (whole pages).
fn envds_memory_limit(meminfo: &str) -> u64 {
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("MemTotal");
    let total = kib * 1024;
    let limit = total - (total / 8).min(128 << 20);
    limit / 4096 * 4096
}

fn number(value: &Value, field: &str) -> u64 {
    value[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {value}"))
}

#[test]
fn under_e2b_s_unit_commands_run_in_envd_s_top_level_groups_survive_a_restart_and_freeze_around_systemd(
) {
    let started = Instant::now();
    let (mut vm, _) = boot("template-cgroups", "template");
    create(&mut vm, json!({}));

    // The groups at the top, every property written.
    assert_made_at_the_top(&vm, 1);
    let (_ticker, ticker) = vm.start("while :; do echo x >> /tmp/ticks; sleep 0.2; done");
    let pid = ticker.pid;
    assert_eq!(cgroup_of(&vm, pid), "/user");
    let limit = envds_memory_limit(&run_system(&vm, "cat /proc/meminfo"));
    for (file, value) in [
        ("memory.max", limit.to_string()),
        ("memory.high", limit.to_string()),
        ("cpu.weight", "50".to_string()),
        ("io.weight", "default 10".to_string()),
    ] {
        let read = run_system(&vm, &format!("cat /sys/fs/cgroup/user/{file}"));
        assert_eq!(read.trim(), value, "user/{file}");
    }
    let ptys_weight = run_system(&vm, "cat /sys/fs/cgroup/ptys/cpu.weight");
    assert_eq!(ptys_weight.trim(), "200");
    let socats_min = run_system(&vm, "cat /sys/fs/cgroup/socats/memory.min");
    assert_eq!(socats_min.trim(), (5u64 << 20).to_string());
    // The unit's cgroup holds the daemon alone (read from `user`: a `_system` reader would be
    // in it): the command is none of systemd's to kill.
    let daemon = run_system(&vm, "systemctl show envd -p MainPID --value");
    let unit_procs = vm.run("cat /sys/fs/cgroup/system.slice/envd.service/cgroup.procs");
    assert_eq!(
        unit_procs.split_whitespace().collect::<Vec<_>>(),
        [daemon.trim()]
    );

    // SIGKILL of the daemon: systemd kills what is left of the unit and starts it again; the
    // command goes on in /sys/fs/cgroup/user.
    vm.run(&format!(
        "setsid sh -c 'sleep 1; kill -9 {}' >/dev/null 2>&1 < /dev/null &",
        daemon.trim()
    ));
    let deadline = Instant::now() + Duration::from_secs(60);
    while http::call(vm.api, "GET", "/health", &[], b"", Duration::from_secs(2))
        .is_ok_and(|r| r.status == 204)
    {
        assert!(Instant::now() < deadline, "the daemon was not killed");
        std::thread::sleep(Duration::from_millis(50));
    }
    vm.wait_health_since(Instant::now(), BOOT_LIMIT);
    vm.token = None;
    create(&mut vm, json!({}));
    let restarts = run_system(&vm, "systemctl show envd -p NRestarts --value");
    assert_eq!(restarts.trim(), "1");
    assert_eq!(
        cgroup_of(&vm, pid),
        "/user",
        "the command outlived the daemon"
    );
    assert!(ticking(&vm), "the command runs");
    assert_made_at_the_top(&vm, 2);

    // E2B's pause: a hierarchy freeze of the whole mount, then the resume /init.
    let reply = vm.call("POST", "/freeze?mode=hierarchy&maxWaitMs=10000", b"");
    assert_eq!(reply.status, 200, "{}", reply.text());
    let result = reply.json();
    figure("hierarchy /freeze, template guest", &result.to_string());
    assert_eq!(result["mode"], "hierarchy", "{result}");
    assert_eq!(number(&result, "failed"), 0, "{result}");
    assert_eq!(number(&result, "notFrozen"), 0, "{result}");
    assert_eq!(
        number(&result, "frozen"),
        number(&result, "requested"),
        "{result}"
    );
    // init.scope, journald, socats; rpcbind and rpc-statd are not in this guest.
    assert_eq!(number(&result, "allowlisted"), 3, "{result}");
    for dir in [
        "init.scope",
        "system.slice/systemd-journald.service",
        "system.slice/envd.service",
        "socats",
    ] {
        assert!(!frozen(&vm, dir), "{dir} frozen");
    }
    assert!(frozen(&vm, "user"));
    assert!(!ticking(&vm), "the command is frozen");
    // systemd answers (PID 1 runs) while the sandbox is frozen.
    let state = run_system(&vm, "systemctl show envd -p ActiveState --value");
    assert_eq!(state.trim(), "active");

    let body = json!({"accessToken": TOKEN, "timestamp": rfc3339(SystemTime::now())});
    let resume = vm.init(&body);
    assert_eq!(resume.status, 204, "{}", resume.text());
    let audit = resume.header("x-envd-freeze-audit").expect("the audit");
    figure("resume audit, template guest", audit);
    let audit: Value = serde_json::from_str(audit).unwrap();
    assert_eq!(number(&audit, "violations"), 0, "{audit}");
    assert!(
        number(&audit, "frozen") >= number(&result, "requested"),
        "{audit}"
    );
    assert!(!frozen(&vm, "user"));
    assert!(ticking(&vm), "the command runs again");
    figure(
        "template cgroups scenario, wall time",
        &format!("{:.1} s", started.elapsed().as_secs_f64()),
    );
}

#[test]
fn as_pid_1_in_the_root_cgroup_the_groups_are_made_at_the_top_with_every_property() {
    let started = Instant::now();
    let (vm, _) = boot_minimal("minimal-cgroups");
    assert_made_at_the_top(&vm, 1);
    assert_eq!(vm.run("cat /proc/self/cgroup").trim(), "0::/user");
    figure(
        "minimal cgroups scenario, wall time",
        &format!("{:.1} s", started.elapsed().as_secs_f64()),
    );
}
