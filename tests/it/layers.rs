//! The crate's top-level modules depend one way: each names (`crate::x`)
//! only modules below it in [`LAYERS`]. A new edge upward fails this test
//! with the file that made it, so no import cycle can come back.

use std::collections::BTreeSet;
use std::path::Path;

use crate::common::repo;

/// Lowest first: primitives, DataFusion and AWS helpers, catalogs,
/// sessions, operations, use cases, the typed API, front ends, entry points.
const LAYERS: &[&str] = &[
    "error",
    "limits",
    "secret",
    "metrics",
    "config",
    "rows",
    "progress",
    "aws",
    "catalog",
    "session",
    "cluster",
    "tables",
    "upload",
    "download",
    "ingest",
    "pipe",
    "credentials",
    "expiry",
    "api",
    "sql",
    "plan",
    "functions",
    "context",
    "service",
    "processes",
    "fuzz",
];

/// The `crate::<module>` names in `text`, test modules left out.
fn crate_names(text: &str) -> BTreeSet<String> {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    names.insert(name);
                }
            }
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.chars().next().is_some_and(|c| c.is_ascii_lowercase()) {
            names.insert(name);
        }
    }
    names
}

fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn modules_depend_only_on_the_layers_below_them() {
    let src = repo().join("src");
    let mut files = vec![];
    walk(&src, &mut files);
    let mut violations = vec![];
    for file in files {
        let relative = file.strip_prefix(&src).unwrap();
        let first = relative.iter().next().unwrap().to_string_lossy();
        if first == "bin" || first == "lib.rs" {
            continue;
        }
        let module = first.trim_end_matches(".rs").to_string();
        let rank = LAYERS
            .iter()
            .position(|m| *m == module)
            .unwrap_or_else(|| panic!("module '{module}' is not in LAYERS: place it"));
        let text = std::fs::read_to_string(&file).unwrap();
        for name in crate_names(&text) {
            let Some(used) = LAYERS.iter().position(|m| *m == name) else {
                continue;
            };
            if used > rank {
                violations.push(format!(
                    "{} ({module}) uses crate::{name}, a layer above it",
                    relative.display()
                ));
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}
