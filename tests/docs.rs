//! The documents agree with each other and with the code. No daemon: it reads files.
//!
//! - docs/spec.md's route index and docs/openapi.yaml list the same routes and methods, each
//!   with the same statuses, and so does the router's table (`sandboxd::ROUTES`).
//! - The section of docs/spec.md a route points to names the route in its heading and mentions
//!   the method and every status listed for it.
//! - Every "SPEC §<n>" cited in the code, tests, scripts and documents is a section of
//!   docs/spec.md, and no section number is used twice.
//! - README.md and docs/*.md link only to files that exist inside the repository.
//!
//! The readers are strict and small: a line of either document they do not understand where
//! they look is an error, not a silent skip. The last tests feed them altered copies of the
//! documents, to show each check fails when it should.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use sandboxd::ROUTES;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// (method, path) to the statuses listed for it.
type Routes = BTreeMap<(String, String), BTreeSet<u16>>;

const HTTP_METHODS: [&str; 8] = [
    "get", "head", "post", "put", "delete", "patch", "options", "trace",
];

fn read(relative: &str) -> String {
    let path = Path::new(ROOT).join(relative);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// The routes of docs/openapi.yaml, read from the document's own layout: `paths:` at column 0,
/// each path at two spaces, its operations at four, `responses:` at six, and each status at
/// eight, as a quoted or bare three-digit key.
fn openapi_routes(text: &str) -> Result<Routes, String> {
    let mut routes = Routes::new();
    let mut in_paths = false;
    let mut path: Option<String> = None;
    let mut operation: Option<(String, String)> = None;
    let mut in_responses = false;
    for (number, line) in text.lines().enumerate() {
        let at = |what: &str| format!("docs/openapi.yaml:{}: {what}: {line:?}", number + 1);
        let content = line.trim();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        let depth = indent(line);
        if depth == 0 {
            in_paths = content == "paths:";
            path = None;
            operation = None;
            in_responses = false;
            continue;
        }
        if !in_paths {
            continue;
        }
        if depth <= 6 {
            in_responses = false;
        }
        match depth {
            2 => {
                let key = content
                    .strip_suffix(':')
                    .filter(|key| key.starts_with('/'))
                    .ok_or_else(|| at("expected a path key"))?;
                path = Some(key.to_string());
                operation = None;
            }
            4 => {
                let key = content.split(':').next().unwrap_or_default();
                operation = if HTTP_METHODS.contains(&key) {
                    if content != format!("{key}:") {
                        return Err(at("an operation must be a block"));
                    }
                    let path = path.clone().ok_or_else(|| at("operation outside a path"))?;
                    let route = (key.to_uppercase(), path);
                    if routes.insert(route.clone(), BTreeSet::new()).is_some() {
                        return Err(at("operation listed twice"));
                    }
                    Some(route)
                } else {
                    None
                };
            }
            6 if operation.is_some() && content.starts_with("responses:") => {
                if content != "responses:" {
                    return Err(at("responses must be a block"));
                }
                in_responses = true;
            }
            8 if in_responses => {
                let key = content
                    .split(':')
                    .next()
                    .unwrap_or_default()
                    .trim_matches(['"', '\'']);
                let status = key
                    .parse::<u16>()
                    .ok()
                    .filter(|s| key.len() == 3 && (100..=599).contains(s))
                    .ok_or_else(|| at("expected a three-digit status"))?;
                if let Some(route) = &operation {
                    if let Some(statuses) = routes.get_mut(route) {
                        statuses.insert(status);
                    }
                }
            }
            _ => {}
        }
    }
    if let Some(((method, path), _)) = routes.iter().find(|(_, statuses)| statuses.is_empty()) {
        return Err(format!(
            "docs/openapi.yaml: {method} {path} lists no status"
        ));
    }
    Ok(routes)
}

/// A heading of docs/spec.md and the text under it, up to the next heading of its level or
/// higher (so a `##` section includes its `###` subsections).
#[derive(Debug)]
struct Section {
    /// `5`, `9a`, `2.1`: the number before the title; `None` for an unnumbered heading.
    id: Option<String>,
    heading: String,
    text: String,
}

fn sections(spec: &str) -> Vec<Section> {
    let lines: Vec<&str> = spec.lines().collect();
    let level = |line: &str| match line.split_once(' ') {
        Some((hashes, _)) if !hashes.is_empty() && hashes.bytes().all(|b| b == b'#') => {
            Some(hashes.len())
        }
        _ => None,
    };
    let mut found = Vec::new();
    let mut in_code = false;
    let mut headings = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        if line.starts_with("```") {
            in_code = !in_code;
        } else if let (false, Some(depth)) = (in_code, level(line)) {
            headings.push((index, depth));
        }
    }
    for (n, &(start, depth)) in headings.iter().enumerate() {
        let end = headings[n + 1..]
            .iter()
            .find(|&&(_, d)| d <= depth)
            .map_or(lines.len(), |&(index, _)| index);
        let heading = lines[start][depth + 1..].trim().to_string();
        let first = heading.split(' ').next().unwrap_or_default();
        let number = first.strip_suffix('.').unwrap_or(first);
        let id = number
            .starts_with(|c: char| c.is_ascii_digit())
            .then(|| number.to_string());
        found.push(Section {
            id,
            heading: heading.clone(),
            text: lines[start..end].join("\n"),
        });
    }
    found
}

/// A row of docs/spec.md's route index.
#[derive(Debug)]
struct IndexRow {
    method: String,
    path: String,
    /// The section that describes the route: `5`, `9`.
    section: String,
    statuses: BTreeSet<u16>,
}

/// The rows of the table under docs/spec.md's "Route index".
fn spec_index(spec: &str) -> Result<Vec<IndexRow>, String> {
    let all = sections(spec);
    let index = all
        .iter()
        .find(|s| s.heading == "Route index")
        .ok_or("docs/spec.md has no \"## Route index\"")?;
    let mut rows = Vec::new();
    for line in index.text.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line
            .trim_matches('|')
            .split('|')
            .map(|cell| cell.trim().trim_matches('`'))
            .collect();
        if cells.first() == Some(&"method") || cells.iter().all(|c| c.starts_with("---")) {
            continue;
        }
        let bad = || format!("docs/spec.md route index: malformed row {line:?}");
        let [method, path, section, statuses] = cells[..] else {
            return Err(bad());
        };
        let section = section.strip_prefix('§').ok_or_else(bad)?;
        let statuses = statuses
            .split(',')
            .map(|s| s.trim().parse::<u16>().map_err(|_| bad()))
            .collect::<Result<BTreeSet<u16>, String>>()?;
        rows.push(IndexRow {
            method: method.to_string(),
            path: path.to_string(),
            section: section.to_string(),
            statuses,
        });
    }
    Ok(rows)
}

/// True when `text` holds `number` with no digit on either side.
fn mentions_number(text: &str, number: u16) -> bool {
    let needle = number.to_string();
    let bytes = text.as_bytes();
    text.match_indices(&needle).any(|(at, _)| {
        let before = at.checked_sub(1).map(|i| bytes[i]);
        let after = bytes.get(at + needle.len()).copied();
        !before.is_some_and(|b| b.is_ascii_digit()) && !after.is_some_and(|b| b.is_ascii_digit())
    })
}

/// True when the heading names `path` as a whole word (`/files` is not in `/files/compose`).
fn heading_names(heading: &str, path: &str) -> bool {
    heading
        .split(|c: char| c.is_whitespace() || c == ',')
        .any(|word| word.trim_matches('`') == path)
}

/// Every disagreement between the two documents (empty when they agree).
fn disagreements(spec: &str, openapi: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let documented = match openapi_routes(openapi) {
        Ok(routes) => routes,
        Err(e) => return vec![e],
    };
    let rows = match spec_index(spec) {
        Ok(rows) => rows,
        Err(e) => return vec![e],
    };
    let all = sections(spec);
    let mut indexed = Routes::new();
    for IndexRow {
        method,
        path,
        section,
        statuses,
    } in &rows
    {
        let route = (method.clone(), path.clone());
        if indexed.insert(route, statuses.clone()).is_some() {
            problems.push(format!(
                "docs/spec.md route index lists {method} {path} twice"
            ));
        }
        let Some(found) = all
            .iter()
            .find(|s| s.id.as_deref() == Some(section.as_str()))
        else {
            problems.push(format!(
                "docs/spec.md route index: {method} {path} points to §{section}, which is no section"
            ));
            continue;
        };
        if !heading_names(&found.heading, path) {
            problems.push(format!(
                "docs/spec.md §{section} ({}) does not name {path} in its heading",
                found.heading
            ));
        }
        if !found.text.contains(method.as_str()) {
            problems.push(format!(
                "docs/spec.md §{section} never mentions {method} (for {path})"
            ));
        }
        for status in statuses {
            if !mentions_number(&found.text, *status) {
                problems.push(format!(
                    "docs/spec.md §{section} never mentions {status}, listed for {method} {path}"
                ));
            }
        }
    }
    for (route, statuses) in &documented {
        let (method, path) = route;
        match indexed.get(route) {
            None => problems.push(format!(
                "{method} {path} is in docs/openapi.yaml but not in docs/spec.md's route index"
            )),
            Some(listed) if listed != statuses => problems.push(format!(
                "{method} {path}: docs/openapi.yaml lists {statuses:?}, docs/spec.md {listed:?}"
            )),
            Some(_) => {}
        }
    }
    for (method, path) in indexed.keys() {
        if !documented.contains_key(&(method.clone(), path.clone())) {
            problems.push(format!(
                "{method} {path} is in docs/spec.md's route index but not in docs/openapi.yaml"
            ));
        }
    }
    problems
}

/// The section numbers cited as "SPEC §<n>" in `text` (`n` starts with a digit; a trailing
/// full stop is punctuation).
fn citations(text: &str) -> Vec<String> {
    text.match_indices("SPEC §")
        .filter_map(|(at, found)| {
            let rest = &text[at + found.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.'))
                .unwrap_or(rest.len());
            let id = rest[..end].trim_end_matches('.');
            id.starts_with(|c: char| c.is_ascii_digit())
                .then(|| id.to_string())
        })
        .collect()
}

/// The text files of the repository that may cite the spec: sources, tests, scripts, documents.
fn repository_texts() -> Vec<PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || ["target", "corpus", "artifacts"].contains(&&*name) {
                continue;
            }
            if path.is_dir() {
                walk(&path, found);
            } else {
                found.push(path);
            }
        }
    }
    let mut found = vec![
        Path::new(ROOT).join("README.md"),
        Path::new(ROOT).join("Makefile"),
    ];
    for dir in ["src", "crates", "tests", "fuzz", "scripts", "docs"] {
        walk(&Path::new(ROOT).join(dir), &mut found);
    }
    found
}

/// Citations of sections `spec` does not have, as `file: §n`.
fn dangling_citations(spec: &str, files: &[(String, String)]) -> Vec<String> {
    let ids: BTreeSet<String> = sections(spec).into_iter().filter_map(|s| s.id).collect();
    let mut problems = Vec::new();
    for (name, text) in files {
        for id in citations(text) {
            if !ids.contains(&id) {
                problems.push(format!(
                    "{name} cites SPEC §{id}, not a section of docs/spec.md"
                ));
            }
        }
    }
    problems
}

#[test]
fn spec_and_openapi_list_the_same_routes_methods_and_statuses() {
    let problems = disagreements(&read("docs/spec.md"), &read("docs/openapi.yaml"));
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn the_spec_lists_exactly_the_routed_methods() {
    let rows = spec_index(&read("docs/spec.md")).unwrap();
    let indexed: BTreeSet<(String, String)> =
        rows.into_iter().map(|row| (row.method, row.path)).collect();
    let routed: BTreeSet<(String, String)> = ROUTES
        .iter()
        .flat_map(|(path, allow)| {
            allow
                .split(", ")
                .map(|method| (method.to_string(), path.to_string()))
        })
        .collect();
    assert_eq!(
        indexed, routed,
        "docs/spec.md's route index vs src/routes.rs"
    );
}

#[test]
fn every_cited_section_exists_once() {
    let spec = read("docs/spec.md");
    let mut seen = BTreeSet::new();
    for id in sections(&spec).into_iter().filter_map(|s| s.id) {
        assert!(seen.insert(id.clone()), "docs/spec.md numbers §{id} twice");
    }
    for id in [
        "1", "2", "3", "4", "5", "6", "7", "8", "9", "9a", "9b", "10",
    ] {
        assert!(seen.contains(id), "docs/spec.md has no §{id}");
    }
    let files: Vec<(String, String)> = repository_texts()
        .into_iter()
        .filter_map(|path| {
            let text = fs::read_to_string(&path).ok()?;
            let name = path
                .strip_prefix(ROOT)
                .unwrap_or(&path)
                .display()
                .to_string();
            Some((name, text))
        })
        .collect();
    let cited = files
        .iter()
        .map(|(_, text)| citations(text).len())
        .sum::<usize>();
    assert!(
        cited > 50,
        "only {cited} citations found: is the walk right?"
    );
    let problems = dangling_citations(&spec, &files);
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn document_links_stay_inside_the_repository() {
    let root = Path::new(ROOT).canonicalize().unwrap();
    let mut documents = vec![root.join("README.md")];
    for entry in fs::read_dir(root.join("docs")).unwrap().flatten() {
        if entry.path().extension().is_some_and(|e| e == "md") {
            documents.push(entry.path());
        }
    }
    let mut problems = Vec::new();
    for document in &documents {
        let text = fs::read_to_string(document).unwrap();
        let dir = document.parent().unwrap();
        for (at, _) in text.match_indices("](") {
            let rest = &text[at + 2..];
            let target = &rest[..rest.find(')').unwrap_or(rest.len())];
            let target = target.split('#').next().unwrap_or_default();
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let name = document.strip_prefix(&root).unwrap().display();
            match dir.join(target).canonicalize() {
                Ok(resolved) if resolved.starts_with(&root) => {}
                Ok(resolved) => problems.push(format!(
                    "{name} links to {target}, outside the repository ({})",
                    resolved.display()
                )),
                Err(e) => problems.push(format!("{name} links to {target}: {e}")),
            }
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

// ---- the checks fail when they should ---------------------------------------------------------

/// The real documents with one change each, and a word the problems must then contain.
#[test]
fn a_route_in_one_document_only_is_reported() {
    let spec = read("docs/spec.md");
    let openapi = read("docs/openapi.yaml");
    let extra_path = openapi.replacen(
        "\npaths:\n",
        "\npaths:\n  /extra:\n    get:\n      responses:\n        \"200\": { description: x }\n",
        1,
    );
    let problems = disagreements(&spec, &extra_path);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("GET /extra is in docs/openapi.yaml but not")),
        "{problems:?}"
    );
    let extra_method = openapi.replacen(
        "  /envs:\n",
        "  /envs:\n    delete:\n      responses:\n        \"204\": { description: x }\n",
        1,
    );
    let problems = disagreements(&spec, &extra_method);
    assert!(
        problems.iter().any(|p| p.contains("DELETE /envs")),
        "{problems:?}"
    );
    let row = "| `POST` | `/files/compose` | §5 | 200, 400, 401, 403, 404, 413, 500, 503, 507 |\n";
    assert!(spec.contains(row), "the test's anchor row moved");
    let extra_row = spec.replacen(row, &format!("{row}| `GET` | `/extra` | §5 | 200 |\n"), 1);
    let problems = disagreements(&extra_row, &openapi);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("GET /extra is in docs/spec.md's route index but not")),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(|p| p.contains("does not name /extra")),
        "{problems:?}"
    );
}

#[test]
fn a_status_in_one_document_only_is_reported() {
    let spec = read("docs/spec.md");
    let openapi = read("docs/openapi.yaml");
    let row = "| `POST` | `/files` | §8 | 200, 400, 401, 403, 415, 500, 503, 507 |";
    assert!(spec.contains(row), "the test's anchor row moved");
    let fewer = spec.replacen(
        row,
        "| `POST` | `/files` | §8 | 200, 400, 401, 403, 500, 503, 507 |",
        1,
    );
    let problems = disagreements(&fewer, &openapi);
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("POST /files: docs/openapi.yaml lists")),
        "{problems:?}"
    );
    // A status both list but the section never explains.
    assert!(!mentions_number(&spec, 418));
    let unexplained = spec.replacen(
        row,
        "| `POST` | `/files` | §8 | 200, 400, 401, 403, 415, 418, 500, 507 |",
        1,
    );
    let openapi_418 = openapi.replacen(
        "        \"415\": { $ref: \"#/components/responses/Error\" }\n",
        "        \"415\": { $ref: \"#/components/responses/Error\" }\n        \"418\": { description: x }\n",
        1,
    );
    assert_ne!(openapi_418, openapi, "the test's anchor status moved");
    let problems = disagreements(&unexplained, &openapi_418);
    let expected = "docs/spec.md §8 never mentions 418, listed for POST /files";
    assert!(problems.iter().any(|p| p == expected), "{problems:?}");
}

#[test]
fn a_citation_of_a_missing_section_is_reported() {
    let spec = read("docs/spec.md");
    // Built at run time, so that this file cites no missing section itself.
    let missing = format!("SPEC §{}", 99);
    let files = vec![
        (
            "ok.rs".to_string(),
            "// SPEC §9b, SPEC §2.1 and SPEC §10.".to_string(),
        ),
        (
            "bad.rs".to_string(),
            format!("// as {missing} says; SPEC §N is a placeholder, SPEC §x not a number"),
        ),
    ];
    assert_eq!(
        dangling_citations(&spec, &files),
        [format!(
            "bad.rs cites {missing}, not a section of docs/spec.md"
        )]
    );
}

#[test]
fn the_readers_refuse_what_they_do_not_understand() {
    let openapi =
        "paths:\n  /a:\n    get:\n      responses:\n        default: { description: x }\n";
    assert!(openapi_routes(openapi)
        .unwrap_err()
        .contains("three-digit status"));
    let openapi = "paths:\n  /a:\n    get:\n      summary: no responses\n";
    assert!(openapi_routes(openapi)
        .unwrap_err()
        .contains("lists no status"));
    let openapi = "paths:\n  /a:\n    get:\n      responses:\n        \"200\": {}\n  /b:\n    \
                   post:\n      responses:\n        '201': {}\ncomponents:\n  x:\n    get:\n";
    let routes = openapi_routes(openapi).unwrap();
    assert_eq!(
        routes.keys().cloned().collect::<Vec<_>>(),
        [
            ("GET".to_string(), "/a".to_string()),
            ("POST".to_string(), "/b".to_string())
        ]
    );
    assert!(!routes[&("POST".to_string(), "/b".to_string())].is_empty());
    let spec = "## Route index\n\n| method | path | § | statuses |\n|---|---|---|---|\n\
                | `GET` | `/a` | 5 | 200 |\n";
    assert!(spec_index(spec).unwrap_err().contains("malformed row"));
    assert!(mentions_number("a 401, b", 401));
    assert!(!mentions_number("4010 and 1401", 401));
    assert!(heading_names("5. POST /files/compose", "/files/compose"));
    assert!(!heading_names("5. POST /files/compose", "/files"));
    assert!(heading_names(
        "9. GET /envs, GET /health, POST /init",
        "/envs"
    ));
}
