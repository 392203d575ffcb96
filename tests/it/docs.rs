//! The manual checks itself: every page the book's summary names exists,
//! every relative link resolves, every code block says its language, the
//! reference lists every session setting and table function, and the
//! README's SQL and the guide's run as written (the guide's prefix and pipe
//! pages on moto's S3). (Rust blocks run as doctests: `src/lib.rs` includes
//! the README and each page.)

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

/// The runnable SQL of `page` (a path under `docs/src`): its `sql` blocks,
/// those fenced `sql no-run` (a shape with `(...)` placeholders, or SQL
/// for another engine) left out.
fn runnable_sql(page: &str) -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("docs/src").join(page)).unwrap();
    blocks(&text)
        .into_iter()
        .filter(|(_, language, _)| language == "sql")
        .map(|(_, _, body)| body)
        .collect()
}

/// Files for the prefix and pipe pages' examples on moto's S3, where they
/// name them: Parquet exports in `s3://landing/exports/`, JSON events in
/// `s3://landing/events/` and drifting feeds under `s3://landing/feeds/`
/// (region eu-west-1).
fn landing_bucket(endpoint: &str) {
    let script = r#"
import io, sys
import boto3, pyarrow as pa, pyarrow.parquet as pq
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="eu-west-1",
                  aws_access_key_id="test", aws_secret_access_key="test")
s3.create_bucket(Bucket="landing", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
for day in (1, 2):
    out = io.BytesIO()
    pq.write_table(pa.table({"id": [day * 10 + i for i in range(3)],
                             "name": [f"row {i}" for i in range(3)]}), out)
    s3.put_object(Bucket="landing", Key=f"exports/day-{day}.parquet", Body=out.getvalue())
s3.put_object(Bucket="landing", Key="events/2026-07-01.json",
              Body=b'{"id": 1, "kind": "click"}\n{"id": 2, "kind": "view"}\n')
s3.put_object(Bucket="landing", Key="feeds/orders/dt=2026-07-01/a.csv",
              Body=b"id,name,amount\n1,ann,10.5\n2,bob,20.0\n")
s3.put_object(Bucket="landing", Key="feeds/orders/dt=2026-07-02/b.csv",
              Body=b"amount,id,name,channel\n30.0,3,cy,web\nlots,4,dee,app\n")
s3.put_object(Bucket="landing", Key="feeds/returns/x.json", Body=b'{"id": 1}\n')
"#;
    let output = std::process::Command::new(crate::common::python())
        .args(["-c", script, endpoint])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The guide's SQL, as a reader runs it: every page's blocks in the
/// book's order, on one fresh embedded warehouse (the pages build on each
/// other: a download reads the table the upload flow made), through the
/// shell. The prefix and pipe pages run against moto's S3 with the AWS
/// SDKs' endpoint variable, as those pages say to try them locally; their
/// SQL is the same as for AWS.
#[test]
fn the_book_sql_runs_as_written() {
    let moto = crate::aws::Moto::start();
    landing_bucket(&moto.endpoint);
    let dir = tempfile::tempdir().unwrap();
    let warehouse = dir.path().join("warehouse");
    let pages = [
        "guide/upload-flow.md",
        "guide/downloads.md",
        "guide/copy-into.md",
        "guide/pipes.md",
        "concepts/scale-and-maintenance.md",
    ];
    let mut ran = 0;
    for page in pages {
        for (n, body) in runnable_sql(page).into_iter().enumerate() {
            let script = dir.path().join(format!("block-{ran}.sql"));
            std::fs::write(&script, &body).unwrap();
            let output = shell_csv("--warehouse", &warehouse)
                .arg("-f")
                .arg(&script)
                .env("AWS_ENDPOINT_URL", &moto.endpoint)
                .env("AWS_ACCESS_KEY_ID", "test")
                .env("AWS_SECRET_ACCESS_KEY", "test")
                .output()
                .unwrap();
            assert!(
                output.status.success(),
                "{page}, SQL block {}:\n{body}\nfailed: {}",
                n + 1,
                String::from_utf8_lossy(&output.stderr)
            );
            ran += 1;
        }
    }
    assert!(ran >= 5, "{ran} blocks ran");
    // What the pages did, seen afterwards: the upload's row promoted, the
    // exports and events landed once each, the drifting feed's good rows
    // landed and its malformed one kept aside.
    let counts = stdout_of_success(
        &shell_csv("--warehouse", &warehouse)
            .args([
                "-c",
                "SELECT (SELECT count(*) FROM payments.transactions) AS promoted, \
                 (SELECT count(*) FROM raw.exports) AS exports, \
                 (SELECT count(*) FROM raw.events) AS events, \
                 (SELECT count(*) FROM raw.orders_feed) AS feed, \
                 (SELECT count(*) FROM copy_rejects('raw.orders_feed')) AS rejected",
            ])
            .output()
            .unwrap(),
    );
    assert!(counts.contains("1,6,2,3,1"), "{counts}");
}
