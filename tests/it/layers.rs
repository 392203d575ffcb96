//! The crate's top-level modules depend one way: each names (`crate::x`)
//! only modules below it in [`LAYERS`]. A new edge upward fails this test
//! with the file that made it, so no import cycle can come back. Inside a
//! folder, files depend one way too: two files (or folders) that name each
//! other, directly or around a circle, fail the second test, and so do
//! folders taken whole, at every depth.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::common::repo;

/// Lowest first: primitives, DataFusion and AWS helpers, catalogs,
/// sessions, operations, use cases, the typed API, front ends, entry points.
const LAYERS: &[&str] = &[
    "error",
    "limits",
    "memory",
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
    "operations",
    "sql",
    "plan",
    "functions",
    "context",
    "service",
    "processes",
    "fuzz",
];

/// `text` up to its test module.
fn without_tests(text: &str) -> &str {
    match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    }
}

/// The patterns [`named_modules`] reads a file with, compiled once.
struct Patterns {
    comment: regex::Regex,
    /// A folder's face in its `mod.rs`: `mod x;`, `use self::..;`, `use x::..;`.
    face: regex::Regex,
    /// `crate::a::{b, c::d}`, which names `a::b` and `a::c::d`.
    group: regex::Regex,
    path: regex::Regex,
}

static PATTERNS: std::sync::LazyLock<Patterns> = std::sync::LazyLock::new(|| {
    Patterns {
    comment: regex::Regex::new(r"//[^\n]*").unwrap(),
    face: regex::Regex::new(
        r"(?m)^\s*(pub(\([a-z]+\))?\s+)?(mod\s+[a-z_0-9]+\s*;|use\s+self::[^;]*;|use\s+[a-z_0-9]+::[^;]*;)",
    )
    .unwrap(),
    group: regex::Regex::new(
        r"\b(crate|super|self)((?:::super)*)::((?:[a-z_][a-z0-9_]*::)*)\{([^;{}]*)\}",
    )
    .unwrap(),
    path: regex::Regex::new(
        r"\b(crate|super|self)((?:::super)*)::([A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*)",
    )
    .unwrap(),
}
});

/// The `crate::<module>` names in `text`, test modules left out.
fn crate_names(text: &str) -> BTreeSet<String> {
    let text = without_tests(text);
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

/// A file's module path under `src` (`upload/promote.rs` -> `upload::promote`,
/// a folder's `mod.rs` -> the folder).
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// The modules of the crate that `text` (the source of module `base`)
/// names through `crate::`, `super::` or `self::` paths, resolved to the
/// longest path that is a module. Test modules and comments are left out;
/// in a folder's `mod.rs`, declaring children (`mod x;`) and re-exporting
/// them (`pub use x::Y;`, `use self::x::..`) is the folder's face, not a
/// dependency.
fn named_modules(
    text: &str,
    base: &[String],
    is_face: bool,
    modules: &BTreeSet<Vec<String>>,
) -> BTreeSet<Vec<String>> {
    let patterns = &*PATTERNS;
    let mut text = patterns
        .comment
        .replace_all(without_tests(text), "")
        .into_owned();
    if is_face {
        text = patterns.face.replace_all(&text, "").into_owned();
    }
    let mut named = vec![];
    for g in patterns.group.captures_iter(&text) {
        for item in g[4].split(',') {
            let item = item.trim().split(" as ").next().unwrap().trim();
            if !item.is_empty() {
                named.push((
                    g[1].to_string(),
                    g[2].to_string(),
                    format!("{}{item}", &g[3]),
                ));
            }
        }
    }
    let rest = patterns.group.replace_all(&text, "");
    for p in patterns.path.captures_iter(&rest) {
        named.push((p[1].to_string(), p[2].to_string(), p[3].to_string()));
    }
    let mut out = BTreeSet::new();
    for (head, supers, tail) in named {
        let mut start: Vec<String> = if head == "crate" {
            vec![]
        } else {
            let ups = usize::from(head == "super") + supers.matches("super").count();
            base[..base.len().saturating_sub(ups)].to_vec()
        };
        start.extend(tail.split("::").filter(|s| !s.is_empty()).map(String::from));
        if let Some(n) = (1..=start.len())
            .rev()
            .find(|n| modules.contains(&start[..*n].to_vec()))
        {
            out.insert(start[..n].to_vec());
        }
    }
    out
}

/// The groups of two or more modules that name each other in a circle.
fn cycles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<String>> {
    // Kosaraju: the order in which a depth-first walk finishes, then walks
    // of the reversed graph in reverse order of finishing.
    fn finish(
        v: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        seen: &mut BTreeSet<Vec<String>>,
        order: &mut Vec<Vec<String>>,
    ) {
        if !seen.insert(v.clone()) {
            return;
        }
        for w in edges.get(v).into_iter().flatten() {
            finish(w, edges, seen, order);
        }
        order.push(v.clone());
    }
    let mut seen = BTreeSet::new();
    let mut order = vec![];
    for v in edges.keys() {
        finish(v, edges, &mut seen, &mut order);
    }
    let mut reversed: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (a, targets) in edges {
        for b in targets {
            reversed.entry(b.clone()).or_default().insert(a.clone());
        }
    }
    let mut assigned = BTreeSet::new();
    let mut groups = vec![];
    for v in order.iter().rev() {
        if assigned.contains(v) {
            continue;
        }
        let mut group = vec![];
        let mut stack = vec![v.clone()];
        assigned.insert(v.clone());
        while let Some(u) = stack.pop() {
            for w in reversed.get(&u).into_iter().flatten() {
                if assigned.insert(w.clone()) {
                    stack.push(w.clone());
                }
            }
            group.push(u.join("::"));
        }
        if group.len() > 1 {
            group.sort();
            groups.push(group);
        }
    }
    groups
}

#[test]
fn files_and_folders_name_each_other_one_way() {
    let src = repo().join("src");
    let mut files = vec![];
    walk(&src, &mut files);
    let files: Vec<_> = files
        .into_iter()
        .filter(|f| !f.strip_prefix(&src).unwrap().starts_with("bin"))
        .collect();
    let modules: BTreeSet<Vec<String>> = files
        .iter()
        .map(|f| module_path(f.strip_prefix(&src).unwrap()))
        .collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let base = module_path(relative);
        let is_face = relative.ends_with("mod.rs") || relative.ends_with("lib.rs");
        let text = std::fs::read_to_string(file).unwrap();
        let named = named_modules(&text, &base, is_face, &modules);
        let entry = edges.entry(base.clone()).or_default();
        entry.extend(named.into_iter().filter(|m| *m != base));
    }
    // Files first, then folders at every depth (a folder taken whole).
    let deepest = modules.iter().map(Vec::len).max().unwrap_or(0);
    let mut found = vec![];
    for depth in std::iter::once(usize::MAX).chain(1..deepest) {
        let mut collapsed: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
        for (a, targets) in &edges {
            let a = a[..a.len().min(depth)].to_vec();
            for b in targets {
                let b = b[..b.len().min(depth)].to_vec();
                if a != b {
                    collapsed.entry(a.clone()).or_default().insert(b);
                }
            }
        }
        let level = if depth == usize::MAX {
            "files".to_string()
        } else {
            format!("folders {depth} deep")
        };
        found.extend(
            cycles(&collapsed)
                .into_iter()
                .map(|group| format!("{level}: {}", group.join(" <-> "))),
        );
    }
    assert!(
        found.is_empty(),
        "files or folders that name each other in a circle (split out what they share into a \
         file both name):\n{}",
        found.join("\n")
    );
}
