//! The published `e2b` SDKs and the Connect services against the template guest: `make
//! sdk-test`'s own checks (scripts/sdk-test in its remote mode, then scripts/proto-client),
//! pointed through `hostfwd` at the daemon E2B's unit started, after E2B's create `/init`. Every
//! check must pass: the SDKs' file, watch, command and terminal calls, signed URLs, and the
//! orchestrator's Connect flows in both codecs, against a real systemd guest instead of a
//! daemon on the host with a temp dir.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::{boot, create, figure, TOKEN};

/// The longest the SDK suite may take in a TCG guest on a loaded machine (it takes minutes);
/// the SDKs' installation, when target/sdk-test has none yet, included.
const SUITE_LIMIT: Duration = Duration::from_secs(1200);

/// The counts of `PASS`, `FAIL` and `SKIP` lines, and the suites (`python`, `js`, `proto`,
/// `json`) that printed a line.
#[derive(Debug, Default, PartialEq)]
struct Counts {
    pass: usize,
    fail: usize,
    skip: usize,
    suites: Vec<String>,
}

fn count(output: &str) -> Counts {
    let mut counts = Counts::default();
    for line in output.lines() {
        let Some((verdict, rest)) = line.split_once(' ') else {
            continue;
        };
        match verdict {
            "PASS" => counts.pass += 1,
            "FAIL" => counts.fail += 1,
            "SKIP" => counts.skip += 1,
            _ => continue,
        }
        let suite = rest.split(':').next().unwrap_or_default().to_string();
        if !counts.suites.contains(&suite) {
            counts.suites.push(suite);
        }
    }
    counts
}

#[test]
fn counts_verdicts_and_suites() {
    let output =
        "sdk-test: the daemon at http://127.0.0.1:1 (remote)\nPASS python: files.write text\n\
                  FAIL js: files.read: Error: x\nSKIP proto: a check\nPASS json: errors\n\
                  Traceback: PASS inside\nsdk-test: 2 passed, 1 failed, 1 skipped\n";
    assert_eq!(
        count(output),
        Counts {
            pass: 2,
            fail: 1,
            skip: 1,
            suites: vec!["python".into(), "js".into(), "proto".into(), "json".into()],
        }
    );
}

#[test]
fn the_e2b_sdks_and_the_connect_services_pass_against_the_template_guest() {
    let (mut vm, ready) = boot("template-sdk", "template");
    create(&mut vm, json!({"defaultUser": "user"}));
    // The level E2B's template builder records: the installed binary's own `-version`.
    let level = vm.run("/usr/bin/envd -version").trim().to_string();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let log = vm.dir.join("sdk-test.log");
    let started = Instant::now();
    let mut child = Command::new(root.join("scripts/sdk-test"))
        .env("SDK_TEST_URL", format!("http://{}", vm.api))
        .env("SDK_TEST_TOKEN", TOKEN)
        .env("SDK_TEST_HOME", "/home/user")
        .env("SDK_TEST_LEVEL", &level)
        // The journal goes to the console: the daemon's log, checked for a panic.
        .env("SDK_TEST_LOG", vm.dir.join("console.log"))
        .stdin(Stdio::null())
        .stdout(File::create(&log).unwrap())
        .stderr(File::create(vm.dir.join("sdk-test.err")).unwrap())
        // Its own process group: ended whole (python, node) if it overruns.
        .process_group(0)
        .spawn()
        .expect("scripts/sdk-test");
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > SUITE_LIMIT {
            let group = format!("-{}", child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = child.wait();
            panic!(
                "sdk-test ran over {SUITE_LIMIT:?}:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let took = started.elapsed();
    let output = std::fs::read_to_string(&log).unwrap();
    let errors = std::fs::read_to_string(vm.dir.join("sdk-test.err")).unwrap_or_default();
    eprintln!("{output}");
    let counts = count(&output);
    figure(
        "make sdk-test against the template guest (remote mode): checks passed, wall time",
        &format!(
            "{} of {} in {:.1} s (the guest ready {:.1} s after QEMU started)",
            counts.pass,
            counts.pass + counts.fail + counts.skip,
            took.as_secs_f64(),
            ready.as_secs_f64()
        ),
    );
    assert!(
        status.success() && counts.fail == 0 && counts.skip == 0,
        "sdk-test: {status}, {counts:?}\n{output}\n{errors}"
    );
    assert_eq!(
        counts.suites,
        ["python", "js", "proto", "json"],
        "every suite ran (the JS SDK needs node and npm)"
    );
    let summary = format!("sdk-test: {} passed, 0 failed, 0 skipped", counts.pass);
    assert!(output.contains(&summary), "{output}");
}
