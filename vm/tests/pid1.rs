//! The daemon as the guest's PID 1 (the minimal guest): every orphan of the sandbox is its
//! child, and it reaps them; no zombie is left after 1,000 commands; the guest powers off
//! cleanly by busybox's `poweroff`, its filesystems remounted read-only by the daemon.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{boot_minimal, create, figure};

/// Zombies in the guest: processes in state `Z`.
const ZOMBIES: &str = "n=0; for s in /proc/[0-9]*/stat; do \
    read -r line < $s 2>/dev/null || continue; set -- ${line##*) }; [ \"$1\" = Z ] && n=$((n+1)); \
  done; echo $n";

#[test]
fn pid_1_reaps_orphans_leaves_no_zombies_after_1000_commands_and_powers_off_cleanly() {
    let (mut vm, _) = boot_minimal("pid1");
    create(&mut vm, serde_json::json!({}));
    // 1,000 orphans: each subshell starts a child in the background and exits at once, so the
    // child is re-parented to PID 1, the daemon.
    vm.run("for i in $(seq 1000); do ( /bin/true & ) ; done");
    // 1,000 commands through the process service, four at a time.
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..250 {
                    let output = vm.run_within("exit 3", Duration::from_secs(60));
                    assert_eq!(output.exit_code(), 3);
                }
            });
        }
    });
    figure(
        "1,000 commands through Start, 4 at a time (minimal)",
        &format!("{:.1} s", started.elapsed().as_secs_f64()),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let zombies = vm.run(ZOMBIES);
        if zombies.trim() == "0" {
            break;
        }
        assert!(Instant::now() < deadline, "{zombies} zombies left");
        std::thread::sleep(Duration::from_millis(200));
    }
    // A clean poweroff, busybox's `poweroff` (SIGUSR2 to PID 1): the daemon drains, ends
    // every process, syncs and remounts every filesystem read-only, then asks the kernel; QEMU
    // ends by itself and the root needs no recovery. A file written just before is on it.
    vm.run("echo before-poweroff > /root/last.txt");
    let _stream = vm.start("poweroff");
    let status = vm
        .wait_exit(Duration::from_secs(60))
        .expect("the guest powered off");
    assert!(status.success(), "QEMU: {status}");
    let fsck = Command::new("e2fsck")
        .args(["-f", "-n"])
        .arg(vm.dir.join("root.ext4"))
        .output()
        .unwrap();
    let console = vm.console();
    let ended = console
        .lines()
        .find(|l| l.contains("PID 1: power-off: every process ended"))
        .unwrap_or_else(|| panic!("no end line: {console}"));
    assert!(
        ended.contains(" with data remounted read-only") && !ended.contains("refused"),
        "{ended}"
    );
    assert!(
        fsck.status.success(),
        "e2fsck: {}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
    let last = Command::new("debugfs")
        .args(["-R", "cat /root/last.txt"])
        .arg(vm.dir.join("root.ext4"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&last.stdout), "before-poweroff\n");
}
