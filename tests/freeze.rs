//! Issue 25's `/freeze` and `/unfreeze` on a cgroup v2 subtree the test makes and removes: a
//! started busy loop stops using CPU while frozen and goes on after; `/init` and the watchdog
//! thaw; the hierarchy mode and the guest's own freezes; what answers while frozen. And
//! `/collapse`, the other step of a pause.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cgroups::{daemon_in, kill, start};
use crate::common::cgroup::TestCgroup;
use crate::common::connect::Stream;
use crate::common::Daemon;

const BUSY_LOOP: &[&str] = &["-c", "while :; do :; done"];

/// `utime` (field 14 of `/proc/<pid>/stat`), in clock ticks.
fn utime(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = stat.rsplit_once(')').unwrap().1;
    after.split_whitespace().nth(11).unwrap().parse().unwrap()
}

fn frozen(dir: &Path) -> bool {
    let events = std::fs::read_to_string(dir.join("cgroup.events")).unwrap();
    events.lines().any(|l| l == "frozen 1")
}

fn eventually(what: impl Fn() -> bool, context: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !what() {
        assert!(Instant::now() < deadline, "{context}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn freeze(daemon: &Daemon, query: &str) -> (u16, Value) {
    let reply = daemon.call("POST", &format!("/freeze{query}"), b"");
    let json = if reply.body.is_empty() {
        Value::Null
    } else {
        reply.json()
    };
    (reply.status, json)
}

/// A group of the guest's own (`custom`) with a busy loop in it, and one it froze itself
/// (`paused`); and the busy loop, which the caller kills.
fn guest_groups(
    cgroup: &TestCgroup,
) -> (std::path::PathBuf, std::path::PathBuf, std::process::Child) {
    let custom = cgroup.child("custom");
    let paused = cgroup.child("paused");
    std::fs::create_dir(&custom).unwrap();
    std::fs::create_dir(&paused).unwrap();
    std::fs::write(paused.join("cgroup.freeze"), "1").unwrap();
    let child = std::process::Command::new("sh")
        .args(BUSY_LOOP)
        .spawn()
        .unwrap();
    std::fs::write(custom.join("cgroup.procs"), child.id().to_string()).unwrap();
    (custom, paused, child)
}

#[test]
fn a_busy_loop_stops_while_frozen_and_goes_on_after_unfreeze() {
    let Some(cgroup) = TestCgroup::make() else {
        return;
    };
    let daemon = daemon_in(&cgroup, &[]);
    let (pid, _stream) = start(&daemon, "sh", BUSY_LOOP, json!({}));
    let (status, result) = freeze(&daemon, "?maxWaitMs=5000");
    assert_eq!(status, 200, "{result}");
    let mut counts = result.clone();
    for timing in ["sweepMs", "waitMs"] {
        assert!(counts[timing].is_u64(), "{result}");
        counts.as_object_mut().unwrap().remove(timing);
    }
    assert_eq!(
        counts,
        json!({"mode": "legacy", "visited": 0, "allowlisted": 0, "truncated": false,
               "preFrozen": 0, "requested": 2, "frozen": 2, "notFrozen": 0, "failed": 0,
               "unobservable": 0})
    );
    assert!(frozen(&cgroup.child("user")) && frozen(&cgroup.child("ptys")));
    assert!(!frozen(&cgroup.child("socats")));
    let before = utime(pid);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(utime(pid), before, "no CPU while frozen");
    // The daemon's own routes answer meanwhile; a Start into a frozen group is refused, one
    // tagged _system (the daemon's group) runs.
    assert_eq!(daemon.get("/health").status, 204);
    assert_eq!(daemon.get("/metrics").status, 200);
    let request = json!({"process": {"cmd": "true"}});
    let mut refused = Stream::open(&daemon, "process.Process/Start", &request, &[]);
    let (code, message) = Stream::end_error(&refused.next()).expect("an error end");
    assert_eq!(code, "unavailable");
    assert_eq!(
        message,
        "the sandbox's processes are frozen (POST /freeze): a process can start once /unfreeze \
         or /init thaws them"
    );
    let (system, _system_stream) = start(&daemon, "sleep", &["1000"], json!({"tag": "_system"}));
    kill(system);
    let reply = daemon.call("POST", "/unfreeze", b"");
    assert_eq!(reply.status, 204, "{}", reply.text());
    assert!(!frozen(&cgroup.child("user")));
    eventually(
        || utime(pid) > before,
        "the loop runs again after /unfreeze",
    );
    let (piped, _piped_stream) = start(&daemon, "sleep", &["1000"], json!({}));
    kill(piped);
    kill(pid);
}

#[test]
fn without_max_wait_ms_the_answer_is_a_bare_204_and_init_thaws() {
    let Some(cgroup) = TestCgroup::make() else {
        return;
    };
    let daemon = daemon_in(&cgroup, &[]);
    let (pid, _stream) = start(&daemon, "sh", BUSY_LOOP, json!({}));
    for query in ["", "?maxWaitMs=0", "?maxWaitMs=-5"] {
        let (status, body) = freeze(&daemon, query);
        assert_eq!((status, body), (204, Value::Null), "{query}");
    }
    eventually(|| frozen(&cgroup.child("user")), "frozen");
    let reply = daemon.call("POST", "/init", b"{}");
    assert_eq!(reply.status, 204, "{}", reply.text());
    assert!(!frozen(&cgroup.child("user")), "/init thawed");
    let before = utime(pid);
    eventually(|| utime(pid) > before, "the loop runs again after /init");
    kill(pid);
    let reply = daemon.call("POST", "/freeze?maxWaitMs=soon", b"");
    reply.assert_error(
        400,
        "invalid query parameter 'maxWaitMs': 'soon' is not an integer",
    );
    let reply = daemon.call_with("POST", "/freeze", &[], b"");
    assert_eq!(reply.status, 401);
}

#[test]
fn the_watchdog_thaws_a_freeze_nobody_ended() {
    let Some(cgroup) = TestCgroup::make() else {
        return;
    };
    let daemon = daemon_in(&cgroup, &["--thaw-watchdog", "0.3"]);
    let (pid, _stream) = start(&daemon, "sh", BUSY_LOOP, json!({}));
    let (status, result) = freeze(&daemon, "?maxWaitMs=5000");
    assert_eq!((status, &result["frozen"]), (200, &json!(2)), "{result}");
    let log = daemon.log_with(|l| l.contains("thaw watchdog:"));
    assert!(
        log.iter().any(|l| l
            .ends_with("thaw watchdog: a /freeze nobody ended was thawed (2 cgroups, 0 failed)")),
        "{log:?}"
    );
    assert!(!frozen(&cgroup.child("user")));
    kill(pid);
}

#[test]
fn hierarchy_freezes_the_guests_groups_too_and_leaves_the_guests_own_freezes() {
    let Some(cgroup) = TestCgroup::make() else {
        return;
    };
    let daemon = daemon_in(&cgroup, &[]);
    // A group of the guest's own with a busy loop in it, and one it froze itself.
    let (custom, paused, mut child) = guest_groups(&cgroup);
    let (status, result) = freeze(&daemon, "?mode=hierarchy&maxWaitMs=5000");
    assert_eq!(status, 200, "{result}");
    assert_eq!(result["mode"], "hierarchy");
    // custom, paused, ptys, socats, user: socats allowlisted, paused the guest's.
    assert_eq!(result["visited"], 5, "{result}");
    assert_eq!(result["allowlisted"], 1, "{result}");
    assert_eq!(result["preFrozen"], 1, "{result}");
    assert_eq!(result["requested"], 3, "{result}");
    assert_eq!(result["frozen"], 3, "{result}");
    assert!(frozen(&custom) && !frozen(&cgroup.child("socats")));
    // A bound smaller than the tree: truncated.
    let reply = daemon.call("POST", "/unfreeze", b"");
    assert_eq!(reply.status, 204);
    assert!(!frozen(&custom), "thawed");
    assert!(frozen(&paused), "the guest's own freeze is left");
    let (_, result) = freeze(&daemon, "?mode=hierarchy&maxCgroups=2&maxWaitMs=5000");
    assert_eq!(
        (&result["visited"], &result["truncated"]),
        (&json!(2), &json!(true))
    );
    assert_eq!(daemon.call("POST", "/unfreeze", b"").status, 204);
    let _ = child.kill();
    let _ = child.wait();
}

/// The hierarchy sweep keeps envd's liveness allowlist running (here a systemd layout made in
/// the test's subtree): `init.scope` and journald are not frozen, `system.slice` is looked
/// inside rather than frozen over journald, and its other services are frozen.
#[test]
fn hierarchy_spares_envds_liveness_allowlist_and_freezes_around_it() {
    let Some(cgroup) = TestCgroup::make() else {
        return;
    };
    let daemon = daemon_in(&cgroup, &[]);
    for dir in [
        "init.scope",
        "system.slice/systemd-journald.service",
        "system.slice/cron.service",
    ] {
        std::fs::create_dir_all(cgroup.child(dir)).unwrap();
    }
    let (status, result) = freeze(&daemon, "?mode=hierarchy&maxWaitMs=5000");
    assert_eq!(status, 200, "{result}");
    // init.scope, journald, socats.
    assert_eq!(result["allowlisted"], 3, "{result}");
    // user, ptys, cron.
    assert_eq!(result["requested"], 3, "{result}");
    assert!(frozen(&cgroup.child("system.slice/cron.service")));
    for dir in [
        "init.scope",
        "system.slice",
        "system.slice/systemd-journald.service",
    ] {
        assert!(!frozen(&cgroup.child(dir)), "{dir}");
    }
    let reply = daemon.call("POST", "/init", b"{}");
    // The directory, init.scope, system.slice and its two, user, ptys, socats.
    assert_eq!(
        reply.header("x-envd-freeze-audit"),
        Some(r#"{"visited":8,"frozen":3,"escaped":0,"violations":0,"truncated":false}"#)
    );
    assert!(!frozen(&cgroup.child("system.slice/cron.service")));
}

/// The `/init` that thaws a hierarchy freeze says what the freeze held, as envd's
/// `X-Envd-Freeze-Audit` (E2B's orchestrator reads it): effectively frozen groups, groups made
/// after the sweep (escaped), allowlisted ones found frozen (violations). Only that `/init`.
#[test]
fn the_init_after_a_hierarchy_freeze_carries_envds_freeze_audit() {
    let Some(cgroup) = TestCgroup::make() else {
        return;
    };
    let daemon = daemon_in(&cgroup, &[]);
    assert_eq!(
        daemon
            .call("POST", "/init", b"{}")
            .header("x-envd-freeze-audit"),
        None
    );
    let (custom, paused, mut child) = guest_groups(&cgroup);
    std::fs::create_dir(custom.join("inner")).unwrap();
    let (status, result) = freeze(&daemon, "?mode=hierarchy&maxWaitMs=5000");
    assert_eq!(status, 200, "{result}");
    // After the sweep: a group made (escaped) and the allowlisted one frozen (a violation).
    let late = cgroup.child("late");
    std::fs::create_dir(&late).unwrap();
    std::fs::write(cgroup.child("socats").join("cgroup.freeze"), "1").unwrap();
    eventually(
        || frozen(&cgroup.child("socats")),
        "socats frozen by the test",
    );
    let reply = daemon.call("POST", "/init", b"{}");
    assert_eq!(reply.status, 204);
    // The directory, custom, custom/inner, paused, ptys, socats, user, late: frozen are
    // custom, custom/inner (its parent's freeze), paused (the guest's), ptys, user.
    assert_eq!(
        reply.header("x-envd-freeze-audit"),
        Some(r#"{"visited":8,"frozen":5,"escaped":1,"violations":1,"truncated":false}"#)
    );
    daemon.log_with(|l| {
        l.contains("init: 1 cgroups the resume depends on were frozen: [\"socats\"]")
    });
    daemon.log_with(|l| l.contains("init: 1 cgroups escaped the hierarchy freeze"));
    eventually(
        || !frozen(&custom) && !frozen(&cgroup.child("socats")),
        "thawed",
    );
    assert!(frozen(&paused), "the guest's own freeze is left");
    // Thawed: the next /init has nothing to audit; nor has one after a legacy freeze, nor one
    // whose body is refused after a hierarchy freeze (it carries the audit all the same).
    assert_eq!(
        daemon
            .call("POST", "/init", b"{}")
            .header("x-envd-freeze-audit"),
        None
    );
    assert_eq!(freeze(&daemon, "?maxWaitMs=5000").0, 200);
    assert_eq!(
        daemon
            .call("POST", "/init", b"{}")
            .header("x-envd-freeze-audit"),
        None
    );
    assert_eq!(freeze(&daemon, "?mode=hierarchy&maxWaitMs=5000").0, 200);
    let refused = daemon.call("POST", "/init", br#"{"defaultWorkdir": "relative"}"#);
    assert_eq!(refused.status, 400);
    assert!(refused.header("x-envd-freeze-audit").is_some());
    std::fs::remove_dir(&late).unwrap();
    std::fs::remove_dir(custom.join("inner")).unwrap();
    let _ = child.kill();
    let _ = child.wait();
}

/// `/collapse`: envd's fields, every window accounted for; on a kernel without
/// `MADV_COLLAPSE` the answer says so instead of counting failures.
#[test]
fn collapse_answers_envds_fields_and_whether_the_kernel_can() {
    let daemon = crate::common::start();
    let reply = daemon.call("POST", "/collapse", b"");
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("cache-control"), Some("no-store"));
    let result = reply.json();
    let count = |name: &str| {
        result[name]
            .as_u64()
            .unwrap_or_else(|| panic!("{name}: {result}"))
    };
    assert!(count("regions") > 0, "{result}");
    assert!(count("elapsedMs") < 60_000);
    match result["supported"].as_bool() {
        Some(true) => {
            assert_eq!(
                count("collapsed") + count("alreadyHuge") + count("skipped"),
                count("chunks"),
                "{result}"
            );
            assert!(result.get("message").is_none(), "{result}");
        }
        Some(false) => {
            assert_eq!(count("chunks"), 0, "{result}");
            assert_eq!(
                result["message"],
                "this kernel has no MADV_COLLAPSE (Linux 6.1 or later with transparent \
                 hugepages): nothing was collapsed"
            );
        }
        None => panic!("no supported: {result}"),
    }
    let reply = daemon.call_with("POST", "/collapse", &[], b"");
    assert_eq!(reply.status, 401);
}

/// With no /freeze of this daemon's in effect, /init thaws only its own two groups (frozen by
/// an earlier daemon, say), never a cgroup something else froze.
#[test]
fn init_without_a_freeze_thaws_only_the_daemons_own_groups() {
    let Some(cgroup) = TestCgroup::make() else {
        return;
    };
    let daemon = daemon_in(&cgroup, &[]);
    let other = cgroup.child("other");
    std::fs::create_dir(&other).unwrap();
    for dir in [other.clone(), cgroup.child("user")] {
        std::fs::write(dir.join("cgroup.freeze"), "1").unwrap();
    }
    eventually(|| frozen(&other) && frozen(&cgroup.child("user")), "frozen");
    let reply = daemon.call("POST", "/init", b"{}");
    assert_eq!(reply.status, 204, "{}", reply.text());
    assert!(
        !frozen(&cgroup.child("user")),
        "the daemon's group is thawed"
    );
    assert!(frozen(&other), "another's freeze is left");
}

/// E2B's orchestrator upgrades the daemon at a resume, the workload still frozen from before
/// the pause, and its next `/init` thaws it: the new image takes the freeze up (SPEC §9c).
#[test]
fn a_freeze_crosses_a_live_upgrade_and_the_next_init_thaws_it_but_not_the_guests_own() {
    let Some(cgroup) = TestCgroup::make() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("envd.next");
    let daemon = daemon_in(&cgroup, &["--upgrade-path", target.to_str().unwrap()]);
    assert_eq!(daemon.call("POST", "/init", b"{}").status, 204);
    let (custom, paused, mut child) = guest_groups(&cgroup);
    let (status, result) = freeze(&daemon, "?mode=hierarchy&maxWaitMs=5000");
    assert_eq!(status, 200, "{result}");
    assert!(frozen(&custom));
    assert_eq!(
        crate::upgrade::upgrade(&daemon, crate::common::TOKEN, &[], b""),
        ""
    );
    daemon.log_with(|l| l.contains("upgrade: a freeze is in effect (1 cgroups the guest froze"));
    daemon.log_with(|l| l.contains("upgrade: took back"));
    assert!(frozen(&custom), "still frozen across the upgrade");
    // A Start into a frozen group is refused, as before the upgrade.
    let mut stream = Stream::open(
        &daemon,
        "process.Process/Start",
        &json!({"process": {"cmd": "true"}}),
        &[],
    );
    let end = stream.next();
    assert_eq!(Stream::end_error(&end).unwrap().0, "unavailable", "{end:?}");
    assert_eq!(daemon.call("POST", "/init", b"{}").status, 204);
    eventually(
        || !frozen(&custom),
        "the /init thawed the guest's busy group",
    );
    assert!(frozen(&paused), "the guest's own freeze is left");
    let _ = child.kill();
    let _ = child.wait();
}
