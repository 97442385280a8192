//! What the scenarios share: a booted minimal guest with its metadata service, E2B's create
//! `/init`, the guest's clock read against the host's, and the figures the run reports
//! (printed, and appended to `target/vm/figures.tsv`).

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::mmds::{metadata, FakeMmds};
use crate::qemu::{images, Vm};

/// The token E2B's orchestrator sets at create; the metadata service holds its SHA-512.
pub const TOKEN: &str = "vm-access-token-0123456789";
pub const SANDBOX_ID: &str = "isb-vm-0001";
pub const TEMPLATE_ID: &str = "tpl-vm-minimal";
/// The longest a TCG guest on a loaded 2-core machine is given to boot (the target is 15 s).
pub const BOOT_LIMIT: Duration = Duration::from_secs(180);

/// A minimal guest booted for test `name`, up to its first `/health` 204, and how long that took.
pub fn boot_minimal(name: &str) -> (Vm, Duration) {
    boot(name, "minimal")
}

/// Guest `image` booted for test `name`, up to its first `/health` 204, and how long that took.
pub fn boot(name: &str, image: &str) -> (Vm, Duration) {
    let mmds = Arc::new(FakeMmds::start(metadata(SANDBOX_ID, TEMPLATE_ID, TOKEN)));
    let mut vm = Vm::boot(name, image, mmds);
    let ready = vm.wait_health(BOOT_LIMIT);
    (vm, ready)
}

/// Records a figure: printed, and a row `name<TAB>value<TAB>accelerator` in figures.tsv.
pub fn figure(name: &str, value: &str) {
    eprintln!("vm figure: {name}: {value}");
    let path = images().join("figures.tsv");
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(file, "{name}\t{value}\t{}", crate::qemu::accel());
    }
}

/// `time` as RFC 3339 in UTC with nanoseconds, as the orchestrator sends `timestamp`.
pub fn rfc3339(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap();
    let secs = i64::try_from(since.as_secs()).unwrap();
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = sandboxd_http::date::civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        since.subsec_nanos()
    )
}

/// E2B's create `/init` (no token yet: the metadata service holds the new one's hash) with the
/// host's time; afterwards the guest's calls carry the token.
pub fn create(vm: &mut Vm, extra: Value) {
    let mut body = json!({"accessToken": TOKEN, "timestamp": rfc3339(SystemTime::now())});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    let reply = vm.init(&body);
    assert_eq!(reply.status, 204, "create /init: {}", reply.text());
    vm.token = Some(TOKEN.to_string());
}

/// The guest's clock minus the host's, in seconds, and the uncertainty (half the round trip of
/// the command that read it).
pub fn clock_offset(vm: &Vm) -> (f64, f64) {
    let before = SystemTime::now();
    let start = Instant::now();
    // busybox's date has no %N; adjtimex (read-only without options) gives microseconds.
    let read = "adjtimex | awk '/time.tv_sec/ {s=$2} /time.tv_usec/ {u=$2} END {printf \"%d.%06d\", s, u}'";
    let guest: f64 = vm.run(read).trim().parse().expect("the guest's time");
    let half = start.elapsed().as_secs_f64() / 2.0;
    let host = before.duration_since(UNIX_EPOCH).unwrap().as_secs_f64() + half;
    (guest - host, half)
}

/// One field of a `/proc/<pid>/status`-like text, in kB.
pub fn kb(text: &str, field: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {text}"))
}

#[test]
fn rfc3339_is_utc_with_nanoseconds() {
    let time = UNIX_EPOCH + Duration::new(1_700_000_000, 5);
    assert_eq!(rfc3339(time), "2023-11-14T22:13:20.000000005Z");
    assert_eq!(
        rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
        "2000-02-29T00:00:00.000000000Z"
    );
}

/// `make vm`: one minimal guest for a person to try, its curl lines printed; runs until the
/// guest powers off (`poweroff -f` through the process service) or ^C.
#[test]
#[ignore = "interactive: make vm"]
fn interactive() {
    let (mut vm, ready) = boot_minimal("interactive");
    let api = vm.api;
    println!(
        "minimal guest ready {:.1} s after QEMU started (console: {})",
        ready.as_secs_f64(),
        vm.dir.join("console.log").display()
    );
    println!("the metadata service holds the hash of token {TOKEN}: create the sandbox with");
    println!("  curl -si -X POST http://{api}/init -d '{{\"accessToken\":\"{TOKEN}\",\"timestamp\":\"'$(date -u +%FT%T.%NZ)'\"}}'");
    println!("  curl -si http://{api}/health");
    println!("  curl -s -H 'X-Access-Token: {TOKEN}' http://{api}/envs");
    println!("  curl -s -H 'X-Access-Token: {TOKEN}' 'http://{api}/files?path=/etc/hosts'");
    println!("  curl -s -H 'X-Access-Token: {TOKEN}' -H 'Content-Type: application/json' http://{api}/process.Process/List -d '{{}}'");
    println!(
        "guest port 8000 (a server on its 127.0.0.1, through the forward): http://{}/",
        vm.service
    );
    let status = vm.wait_exit(Duration::from_secs(365 * 86_400));
    println!("QEMU ended: {status:?}");
}

/// The highest `N` of the lines `<word> N` in `text`.
pub fn highest(text: &str, word: &str) -> Option<usize> {
    text.lines()
        .filter_map(|l| l.strip_prefix(word)?.trim().parse().ok())
        .max()
}
