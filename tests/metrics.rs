//! `GET /metrics` (SPEC §7) against fixture /proc and cgroup roots, and against the real machine.

use std::path::Path;

use crate::common::*;

const FIELDS: [&str; 10] = [
    "ts",
    "cpu_count",
    "cpu_used_pct",
    "mem_total",
    "mem_used",
    "mem_cache",
    "mem_total_mib",
    "mem_used_mib",
    "disk_used",
    "disk_total",
];

fn online_cpus() -> u64 {
    std::fs::read_to_string("/proc/stat")
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count() as u64
}

/// A fixture root: the real /proc/stat and /proc/meminfo, a cgroup of our choosing.
fn fixture(cgroup_line: &str, files: &[(&str, &str)]) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let proc_dir = root.path().join("proc");
    for name in ["stat", "meminfo"] {
        write_file(
            &proc_dir.join(name),
            &std::fs::read(Path::new("/proc").join(name)).unwrap(),
        );
    }
    write_file(&proc_dir.join("self/cgroup"), cgroup_line.as_bytes());
    write_file(&proc_dir.join("self/mountinfo"), b"");
    for (path, text) in files {
        write_file(&root.path().join("cgroup").join(path), text.as_bytes());
    }
    root
}

fn metrics_with(root: &Path) -> serde_json::Value {
    let daemon = builder()
        .arg("--proc-root")
        .arg(root.join("proc").to_str().unwrap())
        .arg("--cgroup-root")
        .arg(root.join("cgroup").to_str().unwrap())
        .start();
    let reply = daemon.get("/metrics");
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()
}

#[test]
fn all_ten_fields_with_their_types() {
    let daemon = start();
    let reply = daemon.get("/metrics");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_eq!(reply.header("cache-control"), Some("no-store"));
    let json = reply.json();
    assert_eq!(json.as_object().unwrap().len(), 10);
    for field in FIELDS {
        assert!(json[field].is_number(), "{field}: {json}");
    }
    for field in FIELDS.iter().filter(|f| **f != "cpu_used_pct") {
        assert!(
            json[field].is_u64() || json[field].is_i64(),
            "{field} is an integer"
        );
    }
    let pct = json["cpu_used_pct"].as_f64().unwrap();
    assert!((0.0..=100.0).contains(&pct));
    assert_eq!((pct * 100.0).round() / 100.0, pct, "two decimals");
}

#[test]
fn metrics_requires_the_token() {
    let daemon = start();
    assert_eq!(daemon.call_with("GET", "/metrics", &[], b"").status, 401);
}

/// A `/proc/meminfo` field in bytes; 0 when absent.
fn meminfo_bytes(meminfo: &str, key: &str) -> u64 {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map_or(0, |v| {
            v.trim().trim_end_matches(" kB").parse::<u64>().unwrap() * 1024
        })
}

/// The lower of `a` and `b` less `slack`, and the higher plus `slack`.
fn around(a: u64, b: u64, slack: u64) -> std::ops::RangeInclusive<u64> {
    a.min(b).saturating_sub(slack)..=a.max(b) + slack
}

#[test]
fn real_machine_figures_match_proc_and_statvfs() {
    const SLACK: u64 = 64 * 1024 * 1024;
    let daemon = start();
    let before = std::fs::read_to_string("/proc/meminfo").unwrap();
    let json = daemon.get("/metrics").json();
    let after = std::fs::read_to_string("/proc/meminfo").unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let ts = json["ts"].as_u64().unwrap();
    assert!(
        now.saturating_sub(5) <= ts && ts <= now,
        "ts {ts}, now {now}"
    );
    let host_total = meminfo_bytes(&before, "MemTotal");
    let mem_total = json["mem_total"].as_u64().unwrap();
    assert!(mem_total <= host_total);
    if mem_total == host_total {
        // Not limited by a cgroup: /proc's figures, give or take what changed meanwhile.
        let used = |m: &str| meminfo_bytes(m, "MemTotal") - meminfo_bytes(m, "MemAvailable");
        let cache = |m: &str| meminfo_bytes(m, "Cached") + meminfo_bytes(m, "SReclaimable");
        let mem_used = json["mem_used"].as_u64().unwrap();
        let mem_cache = json["mem_cache"].as_u64().unwrap();
        assert!(
            around(used(&before), used(&after), SLACK).contains(&mem_used),
            "{json}"
        );
        assert!(
            around(cache(&before), cache(&after), SLACK).contains(&mem_cache),
            "{json}"
        );
    }
    assert_eq!(
        json["mem_total_mib"].as_u64().unwrap(),
        mem_total / (1024 * 1024)
    );
    assert!(json["mem_used"].as_u64().unwrap() <= mem_total);
    assert!(json["cpu_count"].as_u64().unwrap() >= 1);
    assert!(json["cpu_count"].as_u64().unwrap() <= online_cpus());
    // Used as SPEC §7 (corrected) and `df` count it: total less free blocks (`%f`, f_bfree).
    let df = std::process::Command::new("stat")
        .args(["-f", "-c", "%b %f %S", "/"])
        .output()
        .unwrap();
    let text = String::from_utf8(df.stdout).unwrap();
    let parts: Vec<u64> = text
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(json["disk_total"].as_u64().unwrap(), parts[0] * parts[2]);
    let used = (parts[0] - parts[1]) * parts[2];
    let reported = json["disk_used"].as_u64().unwrap();
    assert!(
        reported.abs_diff(used) < 256 * 1024 * 1024,
        "{reported} vs {used}"
    );
}

#[test]
fn cpu_used_pct_rises_while_a_busy_loop_runs() {
    let daemon = start();
    daemon.get("/metrics");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spinner = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut x = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                x = x.wrapping_mul(31).wrapping_add(1);
            }
            x
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(500));
    let pct = daemon.get("/metrics").json()["cpu_used_pct"]
        .as_f64()
        .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    spinner.join().unwrap();
    let floor = 100.0 / online_cpus() as f64 * 0.5;
    assert!(
        pct >= floor,
        "one busy CPU of {} gives {pct}%",
        online_cpus()
    );
}

#[test]
fn v2_memory_max_caps_mem_total() {
    let root = fixture(
        "0::/\n",
        &[
            ("cgroup.controllers", "cpu memory\n"),
            ("memory.max", "536870912\n"),
            ("memory.current", "104857600\n"),
            ("memory.stat", "file 31457280\ninactive_file 20971520\n"),
            ("cpu.max", "max 100000\n"),
        ],
    );
    let json = metrics_with(root.path());
    assert_eq!(json["mem_total"], 536870912u64);
    assert_eq!(json["mem_total_mib"], 512);
    assert_eq!(json["mem_used"], 104857600u64 - 20971520);
    assert_eq!(json["mem_cache"], 31457280u64);
}

#[test]
fn v1_memory_limit_caps_mem_total() {
    let root = fixture(
        "4:memory:/\n3:cpu,cpuacct:/\n",
        &[
            ("memory/memory.limit_in_bytes", "536870912\n"),
            ("memory/memory.usage_in_bytes", "104857600\n"),
            (
                "memory/memory.stat",
                "cache 31457280\ninactive_file 20971520\n",
            ),
        ],
    );
    let json = metrics_with(root.path());
    assert_eq!(json["mem_total"], 536870912u64);
    assert_eq!(json["mem_total_mib"], 512);
}

#[test]
fn v2_cpu_max_rounds_the_quota_up() {
    if online_cpus() < 2 {
        eprintln!("skipped: needs 2 CPUs, this machine has {}", online_cpus());
        return;
    }
    let root = fixture(
        "0::/\n",
        &[
            ("cgroup.controllers", "cpu memory\n"),
            ("cpu.max", "150000 100000\n"),
            ("cpu.stat", "usage_usec 1000\n"),
        ],
    );
    assert_eq!(metrics_with(root.path())["cpu_count"], 2);
}

#[test]
fn missing_proc_is_a_500_naming_the_root() {
    let daemon = builder()
        .arg("--proc-root")
        .arg("/nonexistent-proc")
        .start();
    let reply = daemon.get("/metrics");
    assert_eq!(reply.status, 500);
    let message = reply.json()["message"].as_str().unwrap().to_string();
    assert!(message.contains("/nonexistent-proc"), "{message}");
    assert_eq!(daemon.get("/health").status, 204);
}
