//! The route table, the router and docs/openapi.yaml agree: every method a route lists is
//! answered (not 404/405), every other is 405 with that `Allow`, and the OpenAPI document
//! describes every route and method.

use crate::common::*;
use sandboxd::ROUTES;

const METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"];

#[test]
fn router_answers_exactly_the_listed_methods() {
    let daemon = start();
    for (path, allow) in ROUTES {
        let listed: Vec<&str> = allow.split(", ").collect();
        for method in METHODS {
            // An empty POST /upgrade after the POST /init above would upgrade the daemon (and
            // answer nothing): a target other than --upgrade-path shows it routed (400) instead.
            let headers: &[(&str, &str)] = if *path == "/upgrade" {
                &[
                    ("X-Access-Token", TOKEN),
                    ("X-Envd-Upgrade-Bin", "/not/the/path"),
                ]
            } else {
                &[("X-Access-Token", TOKEN)]
            };
            let reply = daemon.call_with(method, path, headers, b"");
            if listed.contains(&method) {
                let unrouted = reply.status == 405
                    || (reply.status == 404 && reply.text().contains("no route for"));
                assert!(
                    !unrouted,
                    "{method} {path} -> {} {}",
                    reply.status,
                    reply.text()
                );
            } else {
                assert_eq!(reply.status, 405, "{method} {path}");
                assert_eq!(reply.header("allow"), Some(*allow), "{method} {path}");
            }
        }
    }
}

/// Paths of the document and, per path, the operations under it (a minimal reader of the
/// document's own layout: paths at two spaces, operations at four).
fn documented() -> Vec<(String, Vec<String>)> {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.yaml")).unwrap();
    let mut in_paths = false;
    let mut paths: Vec<(String, Vec<String>)> = Vec::new();
    for line in text.lines() {
        if !line.starts_with(' ') {
            in_paths = line == "paths:";
            continue;
        }
        if !in_paths {
            continue;
        }
        if let Some(path) = line.strip_prefix("  /").and_then(|l| l.strip_suffix(':')) {
            paths.push((format!("/{path}"), Vec::new()));
        } else if let Some(op) = line.strip_prefix("    ").and_then(|l| l.strip_suffix(':')) {
            if !op.starts_with(' ') {
                if let Some((_, ops)) = paths.last_mut() {
                    ops.push(op.to_uppercase());
                }
            }
        }
    }
    paths
}

#[test]
fn openapi_documents_every_route_and_method() {
    let doc = documented();
    for (path, allow) in ROUTES {
        let (_, ops) = doc
            .iter()
            .find(|(p, _)| p == path)
            .unwrap_or_else(|| panic!("{path} missing from docs/openapi.yaml"));
        for method in allow.split(", ") {
            assert!(
                ops.iter().any(|op| op == method),
                "{method} {path} undocumented"
            );
        }
    }
    for (path, _) in &doc {
        assert!(
            ROUTES.iter().any(|(p, _)| p == path),
            "{path} documented but not routed"
        );
    }
}
