//! Pausing as E2B does it, for real: `/fsfreeze` of the guest's own root (the daemon never waits
//! on it, `/health` keeps answering), and a pause by snapshot: `/freeze`, `/fsfreeze`, QEMU's
//! `stop` and a migration to a file, the VM ended; a new QEMU from the file, `cont`, the resume
//! `/init` with a fresh timestamp and a new identity in the metadata service, `/fsthaw`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use serde_json::json;

use crate::http::{self, Output, Stream};
use crate::mmds::metadata;
use crate::support::{
    boot_minimal, clock_offset, create, figure, highest, rfc3339, TEMPLATE_ID, TOKEN,
};

const FROZEN: &str =
    "the filesystem is frozen (POST /fsfreeze): nothing is written until POST /fsthaw";

/// Reads `stream` until its stdout holds `wanted` (at most `limit`).
fn read_until(stream: &mut Stream, output: &mut Output, wanted: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !output.stdout.contains(wanted) {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = stream.next_within(left);
        let message =
            message.unwrap_or_else(|| panic!("no {wanted:?} within {limit:?}: {output:?}"));
        output.take(&message);
    }
}

/// The p99 of `samples`.
fn p99(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[(samples.len() * 99).div_ceil(100) - 1]
}

#[test]
fn fsfreeze_of_the_real_root_never_blocks_the_daemon() {
    let (mut vm, _) = boot_minimal("fsfreeze");
    create(&mut vm, json!({}));
    let (mut writer, mut output) =
        vm.start("i=0; while :; do echo line $i >> /root/writer.log; echo wrote $i; i=$((i+1)); sleep 0.1; done");
    read_until(
        &mut writer,
        &mut output,
        "wrote 3\n",
        Duration::from_secs(30),
    );
    assert_eq!(
        vm.call("PUT", "/files?path=/root/kept.txt", b"kept").status,
        200
    );
    // The same /health, before any load, kept-alive: the guest's own pace under TCG.
    let mut kept = http::KeepAlive::open(vm.api);
    let idle: Vec<Duration> = (0..100)
        .map(|_| {
            let started = Instant::now();
            assert_eq!(kept.health(), 204);
            started.elapsed()
        })
        .collect();
    figure(
        "/health p99 kept-alive, idle guest (minimal)",
        &format!("{:.1} ms", p99(idle).as_secs_f64() * 1000.0),
    );
    let frozen = vm.call("POST", "/fsfreeze", b"");
    assert_eq!(frozen.status, 204, "{}", frozen.text());
    // The writer is held by the kernel: its output stops.
    std::thread::sleep(Duration::from_millis(500));
    while writer
        .next_within(Duration::from_millis(300))
        .is_some_and(|m| {
            output.take(&m);
            true
        })
    {}
    let held = output.stdout.clone();
    // 16 uploads at once, again and again, while /health is timed.
    let stop = AtomicBool::new(false);
    // A connection QEMU's user network resets before it reaches the daemon (up to a few in a
    // hundred under this load, TCG) is counted, not taken for an answer: the daemon logs every answer it
    // gives, and the count of its refusals is checked against what arrived.
    let resets = AtomicUsize::new(0);
    let refused = AtomicUsize::new(0);
    let (samples, fresh) = std::thread::scope(|scope| {
        for n in 0..16 {
            let (vm, stop, resets, refused) = (&vm, &stop, &resets, &refused);
            scope.spawn(move || {
                let body = vec![b'x'; 64 << 10];
                let target = format!("/files?path=/root/up{n}.bin");
                let headers = [("X-Access-Token", TOKEN)];
                while !stop.load(Ordering::SeqCst) {
                    let limit = Duration::from_secs(30);
                    match http::call(vm.api, "PUT", &target, &headers, &body, limit) {
                        Ok(reply) => {
                            assert_eq!(reply.status, 503, "{}", reply.text());
                            assert_eq!(reply.json()["message"], FROZEN);
                            refused.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(_) => _ = resets.fetch_add(1, Ordering::SeqCst),
                    }
                }
            });
        }
        // /health timed on a kept-alive connection (the daemon's own answer), and on new
        // connections (what a client of the guest sees through QEMU's user network too).
        let mut kept = http::KeepAlive::open(vm.api);
        let (mut samples, mut fresh) = (Vec::new(), Vec::new());
        while samples.len() < 200 {
            let started = Instant::now();
            assert_eq!(kept.health(), 204);
            samples.push(started.elapsed());
            if samples.len() % 4 == 0 {
                let started = Instant::now();
                match http::call(vm.api, "GET", "/health", &[], b"", Duration::from_secs(10)) {
                    Ok(reply) => {
                        assert_eq!(reply.status, 204);
                        fresh.push(started.elapsed());
                    }
                    Err(_) => _ = resets.fetch_add(1, Ordering::SeqCst),
                }
            }
        }
        stop.store(true, Ordering::SeqCst);
        (samples, fresh)
    });
    let (resets, refused) = (resets.into_inner(), refused.into_inner());
    figure(
        "connections reset by QEMU's user network, fsfreeze load",
        &format!("{resets} of {}", resets + refused + fresh.len()),
    );
    let (kept, fresh) = (p99(samples), p99(fresh));
    figure(
        "/health p99 (kept-alive; new connections), guest root frozen, 16 uploads at once",
        &format!(
            "{:.1} ms; {:.1} ms",
            kept.as_secs_f64() * 1000.0,
            fresh.as_secs_f64() * 1000.0
        ),
    );
    assert!(
        writer.next_within(Duration::from_millis(500)).is_none(),
        "the writer wrote on a frozen root"
    );
    assert_eq!(output.stdout, held);
    // Reads go on; the thaw lets the writer and uploads go on, and nothing was lost.
    assert_eq!(
        vm.call("GET", "/files?path=/root/kept.txt", b"").text(),
        "kept"
    );
    let thawed = vm.call("POST", "/fsthaw", b"");
    assert_eq!(thawed.status, 204, "{}", thawed.text());
    let last: usize = held
        .lines()
        .last()
        .unwrap()
        .trim_start_matches("wrote ")
        .parse()
        .unwrap();
    read_until(
        &mut writer,
        &mut output,
        &format!("wrote {}\n", last + 3),
        Duration::from_secs(30),
    );
    assert_eq!(
        vm.call("PUT", "/files?path=/root/after.txt", b"after")
            .status,
        200
    );
    let log = vm.run("cat /root/writer.log");
    let lines: Vec<String> = (0..=last + 3).map(|i| format!("line {i}")).collect();
    assert!(log.starts_with(&(lines.join("\n") + "\n")), "{log}");
    let console = vm.console();
    let logged = console.matches("PUT /files?path=/root/up").count();
    assert_eq!(
        logged, refused,
        "the daemon's answers, against those that arrived"
    );
    // The daemon's own time for each /health while frozen (its log: head read to answer sent).
    let frozen_part = console.split("POST /fsfreeze 204").nth(1).unwrap_or("");
    let frozen_part = frozen_part.split("POST /fsthaw").next().unwrap_or("");
    let own: Vec<Duration> = frozen_part
        .lines()
        .filter(|l| l.contains("GET /health 204"))
        .filter_map(|l| {
            l.split_whitespace()
                .last()?
                .strip_suffix("us")?
                .parse()
                .ok()
        })
        .map(Duration::from_micros)
        .collect();
    let count = own.len();
    figure(
        "/health p99 in the daemon's own log, root frozen, 16 uploads at once",
        &format!("{:.1} ms of {count}", p99(own).as_secs_f64() * 1000.0),
    );
}

#[test]
fn pause_by_snapshot_and_resume_in_a_new_qemu() {
    let (mut vm, _) = boot_minimal("pause");
    create(&mut vm, json!({}));
    let (mut ticker, mut output) = vm.start(
        "i=0; while :; do echo tick $i; echo $i > /root/counter; i=$((i+1)); sleep 0.2; done",
    );
    read_until(
        &mut ticker,
        &mut output,
        "tick 2\n",
        Duration::from_secs(30),
    );
    let pid = output.pid;
    let before: Vec<u8> = (0..1u32 << 20).map(|i| i.to_le_bytes()[0] ^ 0x5a).collect();
    assert_eq!(
        vm.call("PUT", "/files?path=/home/user/before.bin", &before)
            .status,
        200
    );
    // E2B's pause: the user's processes frozen, the root frozen, the VM stopped and saved.
    let freeze = vm.call("POST", "/freeze?maxWaitMs=1000", b"");
    assert!(matches!(freeze.status, 200 | 204), "{}", freeze.text());
    assert_eq!(vm.call("POST", "/fsfreeze", b"").status, 204);
    drop(ticker);
    let snapshot = vm.dir.join("snapshot");
    let saved = vm.snapshot(&snapshot);
    let size = std::fs::metadata(&snapshot).unwrap().len();
    figure(
        "snapshot by migration to a file (minimal, 512 MiB guest)",
        &format!("{:.2} s, {} MiB", saved.as_secs_f64(), size >> 20),
    );
    // Some time passes while the sandbox is paused; it resumes as another sandbox.
    std::thread::sleep(Duration::from_secs(3));
    vm.mmds
        .set(|s| s.metadata = metadata("isb-vm-resumed", TEMPLATE_ID, TOKEN));
    let loading = Instant::now();
    let mut vm = vm.restore(&snapshot);
    let loaded = loading.elapsed();
    let resumed = vm.resume();
    let ready = vm.wait_health_since(resumed, Duration::from_secs(60));
    figure(
        "snapshot loaded by a new QEMU (-incoming)",
        &format!("{:.2} s", loaded.as_secs_f64()),
    );
    figure(
        "cont to first /health 204 after a resume",
        &format!("{:.3} s", ready.as_secs_f64()),
    );
    // The resume /init: a fresh timestamp sets the clock (no command runs before it: the user's
    // processes are frozen until it thaws them), the identity is read again.
    let body = json!({"accessToken": TOKEN, "timestamp": rfc3339(SystemTime::now())});
    assert_eq!(vm.init(&body).status, 204);
    let (offset, error) = clock_offset(&vm);
    let console = vm.console();
    let set = console
        .lines()
        .filter(|l| l.contains("init: clock set to /init's timestamp"))
        .nth(1)
        .unwrap_or_else(|| panic!("the resume /init did not set the clock\n{console}"));
    let behind = set
        .split("(it was ")
        .nth(1)
        .unwrap_or(set)
        .trim_end_matches(')');
    figure(
        "guest clock after the resume /init",
        &format!("{offset:+.3} s (±{error:.3}); it was {behind}"),
    );
    assert!(
        offset.abs() < 1.0 + error,
        "clock off by {offset} s after the resume /init"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while vm.call("GET", "/envs", b"").json()["E2B_SANDBOX_ID"] != "isb-vm-resumed" {
        assert!(
            Instant::now() < deadline,
            "the resumed sandbox's identity was not read"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The root thawed: the command started before the pause goes on, its output continuing.
    assert_eq!(vm.call("POST", "/fsthaw", b"").status, 204);
    let headers = [("X-Access-Token", TOKEN)];
    let mut again = Stream::open(
        vm.api,
        "process.Process/Connect",
        &json!({"process": {"pid": pid}}),
        &headers,
    );
    assert_eq!(again.status, 200);
    let mut after = Output::default();
    let last = highest(&output.stdout, "tick ").expect("ticks before the pause");
    let deadline = Instant::now() + Duration::from_secs(30);
    while highest(&after.stdout, "tick ").is_none_or(|n| n < last + 5) {
        assert!(Instant::now() < deadline, "no tick past {last}: {after:?}");
        if let Some(message) = again.next_within(Duration::from_secs(1)) {
            after.take(&message);
        }
    }
    let counter: usize = vm.run("cat /root/counter").trim().parse().unwrap();
    assert!(counter >= last + 5, "{counter}");
    // Files written before the freeze are intact; writes work again.
    assert_eq!(
        vm.call("GET", "/files?path=/home/user/before.bin", b"")
            .body,
        before
    );
    assert_eq!(
        vm.call("PUT", "/files?path=/home/user/after.txt", b"after")
            .status,
        200
    );
}
