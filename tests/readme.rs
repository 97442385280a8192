//! The README works as written: every command block is run, in order, against the sandbox
//! `make run` serves (scripts/run-sandbox, started here with the test binary on a free loopback
//! port, its run directory `target/run` in a temp directory), in one bash started in that temp
//! directory without the caller's token or `S`, as a reader's second terminal in the clone
//! would be: the README's own `source target/run/env` sets them. Each command must exit 0 and
//! print what the README shows.
//!
//! The README's format, which the parser here enforces:
//! - A ```` ```console ```` block is a transcript: a line `$ COMMAND` (continued on the next
//!   lines while a line ends with `\` or `|`) followed by the lines it prints, up to the next
//!   `$ `.
//! - In a printed line, `...` stands for any text; a line that is only `...` for any number of
//!   lines (none included).
//! - Every other fenced block must follow a `<!-- not run: REASON -->` line: the blocks this
//!   test cannot run (`make run` itself, `make test`, deployment on another machine).
//!
//! Root only (the sandbox's users, the loop-mounted image, the cgroup): skipped without root
//! unless `SANDBOXD_REQUIRE_ROOT_TESTS=1`, which fails it instead.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::root_or_skip;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const MAX_LINES: usize = 250;

/// One `$ ` command of a console block and what the README says it prints.
#[derive(Debug, PartialEq)]
struct Step {
    /// The README's line number of the `$ `.
    line: usize,
    command: String,
    expected: Vec<String>,
}

/// The steps of every console block, in order; an error for a block that is neither a console
/// transcript nor marked as not run.
fn steps(readme: &str) -> Result<Vec<Step>, String> {
    let lines: Vec<&str> = readme.lines().collect();
    let mut steps = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(info) = lines[i].strip_prefix("```") else {
            i += 1;
            continue;
        };
        let start = i;
        let end = (i + 1..lines.len())
            .find(|&j| lines[j] == "```")
            .ok_or_else(|| format!("README.md:{}: a block that never ends", start + 1))?;
        i = end + 1;
        let before = lines[..start].iter().rev().find(|l| !l.trim().is_empty());
        if let Some(reason) = before.and_then(|l| l.strip_prefix("<!-- not run: ")) {
            if reason.trim_end_matches("-->").trim().is_empty() {
                return Err(format!(
                    "README.md:{start}: a not-run mark without a reason"
                ));
            }
            continue;
        }
        if info != "console" {
            return Err(format!(
                "README.md:{}: a ```{info} block that is not marked `<!-- not run: REASON -->`: \
                 make it a ```console transcript or say why it is not run",
                start + 1
            ));
        }
        let mut step: Option<Step> = None;
        let mut continued = false;
        for (offset, line) in lines[start + 1..end].iter().enumerate() {
            let number = start + 2 + offset;
            if continued {
                let step = step.as_mut().expect("a continued command");
                step.command.push('\n');
                step.command.push_str(line);
                continued = line.ends_with('\\') || line.ends_with('|');
            } else if let Some(command) = line.strip_prefix("$ ") {
                steps.extend(step.take());
                step = Some(Step {
                    line: number,
                    command: command.to_string(),
                    expected: Vec::new(),
                });
                continued = line.ends_with('\\') || line.ends_with('|');
            } else {
                let step = step.as_mut().ok_or_else(|| {
                    format!("README.md:{number}: a console block must start with `$ `")
                })?;
                step.expected.push(line.to_string());
            }
        }
        steps.extend(step);
    }
    Ok(steps)
}

/// `line` matches `pattern`, in which `...` stands for any text.
fn line_matches(pattern: &str, line: &str) -> bool {
    let pieces: Vec<&str> = pattern.split("...").collect();
    let (first, rest) = pieces
        .split_first()
        .expect("split yields one piece at least");
    let Some(mut left) = line.strip_prefix(first) else {
        return false;
    };
    let Some((last, middle)) = rest.split_last() else {
        return left.is_empty();
    };
    for piece in middle {
        match left.find(piece) {
            Some(at) => left = &left[at + piece.len()..],
            None => return false,
        }
    }
    left.ends_with(last)
}

/// `output` matches `expected` line by line, a line `...` standing for any number of lines.
/// Dynamic programming over (expected, output) positions: no recursion, README-sized inputs.
fn output_matches(expected: &[String], output: &[&str]) -> bool {
    // reach[j]: the first i expected lines can match the first j output lines.
    let mut reach = vec![false; output.len() + 1];
    reach[0] = true;
    for pattern in expected {
        let mut next = vec![false; output.len() + 1];
        for j in 0..=output.len() {
            if pattern == "..." {
                next[j] = reach[j] || (j > 0 && next[j - 1]);
            } else if j > 0 {
                next[j] = reach[j - 1] && line_matches(pattern, output[j - 1]);
            }
        }
        reach = next;
    }
    reach[output.len()]
}

/// scripts/run-sandbox with the test binary: stopped (SIGTERM, then its clean-up) when dropped.
struct Sandbox {
    child: Child,
    dir: tempfile::TempDir,
}

impl Sandbox {
    fn run_dir(&self) -> PathBuf {
        self.dir.path().join("target/run")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    fn start() -> Sandbox {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = std::fs::File::create(dir.path().join("log")).unwrap();
        let child = Command::new(Path::new(ROOT).join("scripts/run-sandbox"))
            .arg(env!("CARGO_BIN_EXE_sandboxd"))
            .arg(dir.path().join("target/run"))
            .arg(format!("127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let sandbox = Sandbox { child, dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = sandbox.run_dir().join("env").exists()
                && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
            if ready {
                return sandbox;
            }
            assert!(
                Instant::now() < deadline,
                "scripts/run-sandbox did not serve within 60 s:\n{}",
                sandbox.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM to the script, which stops the daemon and removes what it made.
    fn stop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "scripts/run-sandbox did not stop on SIGTERM:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.stop();
        }
    }
}

/// One bash script that runs each step with its output and status in files of `out` (`N` and
/// `N.status`), so a variable set or a directory entered by one step is there for the next.
fn script(out: &Path, steps: &[Step]) -> String {
    let mut text = String::new();
    for (n, step) in steps.iter().enumerate() {
        let file = out.join(n.to_string());
        let _ = writeln!(
            text,
            "{{\n{}\n}} >'{f}' 2>&1 </dev/null; echo $? >'{f}.status'",
            step.command,
            f = file.display()
        );
    }
    text
}

#[test]
fn every_readme_command_does_what_the_readme_shows() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let steps = steps(&readme).unwrap_or_else(|e| panic!("{e}"));
    assert!(steps.len() > 20, "only {} commands found", steps.len());
    if !root_or_skip("the README's sandbox (users, a loop-mounted image, a cgroup) needs root") {
        return;
    }
    let mut sandbox = Sandbox::start();
    let out = sandbox.dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let mut bash = Command::new("bash")
        .arg("-c")
        .arg(script(&out, &steps))
        .current_dir(sandbox.dir.path())
        .env_remove("SANDBOXD_ACCESS_TOKEN")
        .env_remove("SANDBOXD_ACCESS_TOKEN_FILE")
        .env_remove("T")
        .env_remove("S")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    while bash.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = bash.kill();
            panic!("the README's commands took more than 300 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut failures = String::new();
    for (n, step) in steps.iter().enumerate() {
        let read = |name: String| std::fs::read_to_string(out.join(name)).unwrap_or_default();
        let output = read(n.to_string());
        let status = read(format!("{n}.status"));
        let lines: Vec<&str> = output.lines().map(|l| l.trim_end_matches('\r')).collect();
        if status.trim() != "0" || !output_matches(&step.expected, &lines) {
            let _ = write!(
                failures,
                "\nREADME.md:{}: $ {}\n  exit status {} (expected 0)\n  expected:\n{}\n  got:\n{}\n",
                step.line,
                step.command,
                status.trim(),
                step.expected
                    .iter()
                    .map(|l| format!("    {l}\n"))
                    .collect::<String>(),
                lines.iter().map(|l| format!("    {l}\n")).collect::<String>()
            );
        }
    }
    let run_dir = sandbox.run_dir();
    let pid = sandbox.child.id();
    sandbox.stop();
    assert!(
        failures.is_empty(),
        "README commands that did not do what the README shows:{failures}\nsandbox log:\n{}",
        sandbox.log()
    );
    // The clean-up: the image unmounted, the cgroup removed.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let run_dir = run_dir.to_str().unwrap();
    assert!(
        !mounts.contains(run_dir),
        "still mounted after exit:\n{mounts}"
    );
    let cgroup2 = mounts
        .lines()
        .find(|l| l.contains(" - cgroup2 "))
        .and_then(|l| l.split_whitespace().nth(4))
        .expect("a cgroup v2 mount");
    let group = Path::new(cgroup2).join(format!("sandboxd-run-{pid}"));
    assert!(!group.exists(), "{} left after exit", group.display());
}

#[test]
fn the_readme_is_a_front_page() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let count = readme.lines().count();
    assert!(
        count <= MAX_LINES,
        "README.md has {count} lines, more than {MAX_LINES}: move reference to docs/"
    );
}

#[test]
fn the_readme_parser_reads_transcripts_and_refuses_unmarked_blocks() {
    let text = "x\n```console\n$ echo a \\\n  b\na b\n$ true\n```\n<!-- not run: needs a VM -->\n```sh\nmake run\n```\n";
    assert_eq!(
        steps(text).unwrap(),
        vec![
            Step {
                line: 3,
                command: "echo a \\\n  b".into(),
                expected: vec!["a b".into()]
            },
            Step {
                line: 6,
                command: "true".into(),
                expected: vec![]
            },
        ]
    );
    let unmarked = "```sh\nmake run\n```\n";
    assert!(
        steps(unmarked).unwrap_err().contains("not marked"),
        "{unmarked}"
    );
    let no_reason = "<!-- not run: -->\n```sh\nmake run\n```\n";
    assert!(steps(no_reason).unwrap_err().contains("without a reason"));
    let no_prompt = "```console\nout\n```\n";
    assert!(steps(no_prompt).unwrap_err().contains("must start with"));
}

#[test]
fn three_dots_stand_for_any_text_and_a_line_of_them_for_any_lines() {
    let lines = |s: &str| s.lines().map(String::from).collect::<Vec<_>>();
    assert!(line_matches("{\"a\":...,\"b\":2}", "{\"a\":15,\"b\":2}"));
    assert!(!line_matches("{\"a\":...,\"b\":2}", "{\"a\":15,\"b\":3}"));
    assert!(line_matches("exact", "exact"));
    assert!(!line_matches("exact", "exact!"));
    assert!(line_matches("...", ""));
    assert!(output_matches(
        &lines("HTTP/1.1 204 No Content\n..."),
        &["HTTP/1.1 204 No Content", "a: b", ""]
    ));
    assert!(output_matches(&lines("one\n...\nthree"), &["one", "three"]));
    assert!(!output_matches(&lines("one\n...\nthree"), &["one", "two"]));
    assert!(!output_matches(&lines("one"), &["one", "two"]));
    assert!(output_matches(&[], &[]));
    assert!(!output_matches(&[], &["unexpected"]));
}
