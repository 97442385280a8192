//! Connect's binary protobuf codec (issue 22) with a client that is not sandboxd: requests
//! are the fixtures in tests/fixtures/proto/, written by the E2B SDK's generated envd
//! messages (`scripts/proto-fixtures`), sent as they are; answers are decoded by this
//! module's own `prost` messages, written from envd's `.proto` files.
//!
//! - `every_method`: **the table of every method of both services**, each called in JSON and
//!   in binary protobuf, the two answers compared field by field;
//! - `flows`: the orchestrator's flows (a template build step, the `_system` shell, a
//!   `Connect-Timeout-Ms` that kills, a terminal, unary `Stat`/`ListDir`);
//! - `wire_rules`: errors as JSON, unknown fields, gzip both ways, refused codecs;
//! - `slow_reader`: both outputs whole and in order to a client that reads slowly;
//! - here: the table covers every method the spec names, and sends the same message in both
//!   codecs (the fixtures' README gives each fixture as proto3 JSON).

mod as_json;
mod client;
mod every_method;
mod flows;
mod messages;
mod slow_reader;
mod wire_rules;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value;

use every_method::EVERY_METHOD;

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The methods docs/spec.md §9b lists for each service, as `service/Method`.
fn methods_in_the_spec() -> BTreeSet<String> {
    let spec = read("docs/spec.md");
    let mut methods = BTreeSet::new();
    for service in ["filesystem.Filesystem", "process.Process"] {
        let prefix = format!("| `{service}` | ");
        let line = spec
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("§9b's table has no row for {service}"));
        for name in line[prefix.len()..].split(',') {
            let name = name.split('`').nth(1).unwrap_or("").trim();
            assert!(!name.is_empty(), "{line}");
            methods.insert(format!("{service}/{name}"));
        }
    }
    methods
}

#[test]
fn the_table_holds_every_method_of_both_services() {
    let table: BTreeSet<String> = EVERY_METHOD.iter().map(|r| r.method.to_string()).collect();
    assert_eq!(table.len(), EVERY_METHOD.len(), "each method once");
    assert_eq!(table, methods_in_the_spec());
    assert_eq!(table.len(), 9 + 8);
}

/// The fixtures' README: file name (without `.bin`) -> (method, content as proto3 JSON).
fn fixtures_readme() -> BTreeMap<String, (String, Value)> {
    let readme = read("tests/fixtures/proto/README.md");
    let mut out = BTreeMap::new();
    for line in readme.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<String> = line
            .trim_matches('|')
            .replace("\\|", "\u{0}")
            .split(" | ")
            .map(|c| c.trim().trim_matches('`').replace('\u{0}', "|"))
            .collect();
        let name = cells[0].trim_end_matches(".bin").to_string();
        let content = serde_json::from_str(&cells[4]).unwrap_or(Value::Null);
        out.insert(name, (cells[1].clone(), content));
    }
    out
}

#[test]
fn the_two_codecs_send_the_same_messages() {
    let readme = fixtures_readme();
    for row in &EVERY_METHOD {
        assert_eq!(row.json.len(), row.proto.len(), "{}", row.method);
        for (json, name) in row.json.iter().zip(row.proto) {
            let (method, content) = readme
                .get(*name)
                .unwrap_or_else(|| panic!("{name} is not in the fixtures' README"));
            assert_eq!(method, row.method, "{name}");
            let json = json.replace("$WATCHER", client::NO_WATCHER);
            let json: Value = serde_json::from_str(&json).unwrap();
            assert_eq!(
                &json, content,
                "{name}: the JSON row and the fixture differ"
            );
        }
    }
    // Every fixture file is in the README, and the other way round.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/proto");
    let files: BTreeSet<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".bin").map(str::to_string))
        .collect();
    assert_eq!(files, readme.keys().cloned().collect());
}

#[test]
fn the_fixtures_decode_as_envds_messages() {
    use messages::process::StartRequest;
    let step: StartRequest = client::decode(&client::fixture("proc_start_build_step"));
    let process = step.process.expect("a process");
    assert_eq!(process.cmd, "/bin/bash");
    assert_eq!(process.args[..2], ["-l", "-c"]);
    assert_eq!(process.cwd.as_deref(), Some("/tmp"));
    assert_eq!(process.envs["STEP_NAME"], "install deps");
    assert_eq!(process.envs["EMPTY"], "");
    assert_eq!((step.tag, step.pty, step.stdin), (None, None, None));
    let system: StartRequest = client::decode(&client::fixture("proc_start_system_shell"));
    assert_eq!(system.tag.as_deref(), Some("_system"));
    let pty: StartRequest = client::decode(&client::fixture("proc_start_pty"));
    let size = pty.pty.and_then(|p| p.size).expect("a size");
    assert_eq!((size.cols, size.rows), (80, 24));
    let sleeper: StartRequest = client::decode(&client::fixture("proc_start_sleeper"));
    assert_eq!(sleeper.stdin, Some(false), "an explicit false is sent");
    assert!(
        client::fixture("proc_list").is_empty(),
        "ListRequest is empty"
    );
}
