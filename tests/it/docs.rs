//! The manual checks itself: every page the book's summary names exists,
//! every relative link resolves, every code block says its language, the
//! reference lists every session setting and table function, and the
//! README's SQL runs as written on a fresh embedded warehouse. (Rust
//! blocks run as doctests: `src/lib.rs` includes the README and each page.)

use std::path::{Path, PathBuf};

use crate::common::{files_under, repo, shell_csv, stdout_of_success};

/// The Markdown files of the manual: the README, the book, the benchmarks.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![repo().join("README.md"), repo().join("benches/README.md")];
    pages.extend(
        files_under(&repo().join("docs/src"))
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "md")),
    );
    pages.sort();
    pages
}

/// The fenced code blocks of `text`: (line of the fence, language, body).
fn blocks(text: &str) -> Vec<(usize, String, String)> {
    let mut blocks = vec![];
    let mut open: Option<(usize, String, String)> = None;
    for (n, line) in text.lines().enumerate() {
        match (&mut open, line.trim_start().strip_prefix("```")) {
            (None, Some(language)) => {
                open = Some((n + 1, language.trim().to_string(), String::new()))
            }
            (Some(_), Some(_)) => blocks.extend(open.take()),
            (Some((_, _, body)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "a code block is never closed");
    blocks
}

/// The relative link targets of `text`, outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut links = vec![];
    let mut in_block = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            let target = &rest[..end];
            if !target.contains("://") && !target.starts_with('#') && !target.starts_with("mailto:")
            {
                links.push(target.split('#').next().unwrap_or(target).to_string());
            }
        }
    }
    links
}

#[test]
fn every_summary_entry_and_relative_link_resolves() {
    let summary = std::fs::read_to_string(repo().join("docs/src/SUMMARY.md")).unwrap();
    let named = links(&summary);
    assert!(named.len() > 10, "{named:?}");
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for target in links(&text) {
            let resolved = page.parent().unwrap().join(&target);
            assert!(
                resolved.exists(),
                "{}: the link to '{target}' reaches nothing",
                page.display()
            );
        }
        let relative = page.strip_prefix(repo().join("docs/src")).ok();
        if let Some(relative) = relative.filter(|r| *r != Path::new("SUMMARY.md")) {
            let relative = relative.to_string_lossy();
            assert!(
                named.iter().any(|n| *n == relative),
                "docs/src/{relative} is not in SUMMARY.md, so the book never shows it"
            );
        }
    }
}

#[test]
fn every_code_block_says_its_language() {
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for (line, language, _) in blocks(&text) {
            assert!(
                !language.is_empty(),
                "{}:{line}: a code block without a language (rustdoc would run it as Rust)",
                page.display()
            );
        }
    }
}

#[test]
fn the_reference_lists_every_setting_and_table_function() {
    use datafusion::config::ExtensionOptions;
    let settings = std::fs::read_to_string(repo().join("docs/src/reference/settings.md")).unwrap();
    for entry in icestage::IcestageOptions::default().entries() {
        assert!(
            settings.contains(&format!("`icestage.{}`", entry.key)),
            "docs/src/reference/settings.md does not list icestage.{}",
            entry.key
        );
    }
    let statements =
        std::fs::read_to_string(repo().join("docs/src/reference/statements.md")).unwrap();
    let functions = std::fs::read_to_string(repo().join("src/functions/mod.rs")).unwrap();
    let mut registered = 0;
    for piece in functions.split("register_udtf(\"").skip(1) {
        let name = piece.split('"').next().unwrap();
        registered += 1;
        assert!(
            statements.contains(&format!("`{name}(")),
            "docs/src/reference/statements.md does not list the table function {name}"
        );
    }
    assert!(registered > 10, "{registered} table functions found");
}

#[test]
fn the_readme_sql_runs_as_written() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let sql: Vec<String> = blocks(&readme)
        .into_iter()
        .filter(|(_, language, _)| language == "sql")
        .map(|(_, _, body)| body)
        .collect();
    assert!(!sql.is_empty());
    for body in sql {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("readme.sql");
        std::fs::write(&script, &body).unwrap();
        let output = shell_csv("--warehouse", dir.path().join("warehouse"))
            .arg("-f")
            .arg(&script)
            .output()
            .unwrap();
        let printed = stdout_of_success(&output);
        assert!(printed.contains("promoted"), "{printed}");
    }
}
