//! The manual checks itself: every page the book's summary names exists,
//! every relative link resolves, every code block says its language, the
//! reference lists every session setting and table function, and every
//! example runs as written: the README's SQL and the guide's, the shell
//! walk-throughs (the service's with curl and PyIceberg against a real
//! `serve`, the AWS and COPY INTO pages' on moto, the cluster's with real
//! processes), every TOML config, and the Rust blocks as doctests
//! (`src/lib.rs` includes the README and each page). An example no test
//! runs is fenced `no-run` and listed with why.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::{files_under, free_port, repo, shell_csv, stdout_of_success};

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

/// The languages whose blocks are examples a reader runs or writes down
/// (`text` blocks are output and listings).
const EXAMPLES: [&str; 6] = ["sql", "sh", "bash", "python", "toml", "rust"];

/// Which test runs a page's examples of a language (the page is a path
/// under `docs/src`, or a file of the repository's root).
const RUN_BY: &[(&str, &str, &str)] = &[
    ("README.md", "sql", "the_readme_sql_runs_as_written"),
    (
        "guide/upload-flow.md",
        "sql",
        "the_book_sql_runs_as_written",
    ),
    ("guide/downloads.md", "sql", "the_book_sql_runs_as_written"),
    ("guide/copy-into.md", "sql", "the_book_sql_runs_as_written"),
    (
        "guide/copy-into.md",
        "sh",
        "the_copy_into_page_commands_run_as_written",
    ),
    ("guide/pipes.md", "sql", "the_book_sql_runs_as_written"),
    (
        "concepts/scale-and-maintenance.md",
        "sql",
        "the_book_sql_runs_as_written",
    ),
    (
        "guide/service.md",
        "sh",
        "the_service_walk_through_runs_as_written",
    ),
    (
        "guide/aws.md",
        "sh",
        "the_aws_page_runs_on_the_emulator_as_written",
    ),
    (
        "guide/cluster.md",
        "bash",
        "the_cluster_page_runs_as_written",
    ),
    (
        "guide/cluster.md",
        "sql",
        "the_cluster_page_runs_as_written",
    ),
    ("*", "toml", "every_config_example_is_a_config_serve_takes"),
    ("*", "rust", "the doctests (src/lib.rs includes every page)"),
];

/// The examples no test runs, fenced `<language> no-run`: the page, the
/// language, how many, and why.
const NOT_RUN: &[(&str, &str, usize, &str)] = &[
    (
        "guide/getting-started.md",
        "sh",
        1,
        "the README's two commands",
    ),
    ("CONTRIBUTING.md", "sh", 1, "CI's own commands"),
    (
        "guide/upload-flow.md",
        "sql",
        3,
        "shapes with (...) placeholders",
    ),
    (
        "guide/downloads.md",
        "sql",
        1,
        "a shape with (...) placeholders",
    ),
    (
        "concepts/scale-and-maintenance.md",
        "sql",
        2,
        "shapes with (...) placeholders",
    ),
    (
        "guide/cluster.md",
        "bash",
        1,
        "hosts of their own, with certificates; cluster:: starts the same commands",
    ),
    (
        "guide/service.md",
        "sql",
        1,
        "DuckDB's SQL with a session's ids; tests/python/duckdb_client.py runs the same statements",
    ),
    (
        "guide/deploy.md",
        "python",
        2,
        "a deployment's own address; service::oauth and service::tenants run these calls",
    ),
    (
        "guide/shell.md",
        "python",
        1,
        "a path of the reader's; pyiceberg:: opens the same catalog",
    ),
];

/// Every example of the manual is run by a test, or fenced `no-run` and
/// listed in `NOT_RUN` with why: an example nothing runs cannot drift
/// unseen.
#[test]
fn every_example_is_run_or_listed_as_not_run() {
    let docs = repo().join("docs/src");
    let mut not_run = vec![];
    for page in pages() {
        let name = page
            .strip_prefix(&docs)
            .or_else(|_| page.strip_prefix(repo()))
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(&page).unwrap();
        for (line, info, _) in blocks(&text) {
            let mut words = info.split_whitespace();
            let language = words.next().unwrap_or_default();
            if !EXAMPLES.contains(&language) {
                continue;
            }
            if words.any(|word| word == "no-run") {
                not_run.push((name.clone(), language.to_string()));
                continue;
            }
            assert!(
                RUN_BY
                    .iter()
                    .any(|(p, l, _)| (*p == name || *p == "*") && *l == language),
                "{name}:{line}: no test runs this {language} block: run it in tests/it/docs.rs \
                 (RUN_BY), or fence it `{language} no-run` and say why in NOT_RUN"
            );
        }
    }
    for (page, language, count, why) in NOT_RUN {
        let fenced = not_run
            .iter()
            .filter(|(p, l)| p == page && l == language)
            .count();
        assert_eq!(
            fenced, *count,
            "{page}: NOT_RUN lists {count} {language} blocks not run ({why}), the page fences {fenced}"
        );
    }
    for (page, language) in &not_run {
        assert!(
            NOT_RUN
                .iter()
                .any(|(p, l, _, _)| p == page && l == language),
            "{page}: a {language} block is fenced no-run, but NOT_RUN does not say why"
        );
    }
}

/// Every TOML example is a config `serve` or `--catalog-config` takes: a
/// misspelt key fails here. A fragment of a service's settings without a
/// catalog is read with the embedded one added.
#[test]
fn every_config_example_is_a_config_serve_takes() {
    let mut read = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for (line, info, body) in blocks(&text) {
            if info != "toml" {
                continue;
            }
            // A service's settings, or a catalog file (`--catalog-config`).
            let checked = if body.contains("[service") {
                let config = if body.contains("[[catalogs]]") {
                    body.clone()
                } else {
                    format!("warehouse = \"./warehouse\"\n{body}")
                };
                icestage::service::ServiceConfig::from_toml_str(&config).map(|_| ())
            } else {
                icestage::IcestageConfig::from_toml_str(&body).map(|_| ())
            };
            if let Err(e) = checked {
                panic!("{}:{line}: {}\n{body}", page.display(), e.user_message());
            }
            read += 1;
        }
    }
    let examples = repo().join("sql/examples");
    for service in ["service.toml", "rest-backend.toml"] {
        icestage::service::ServiceConfig::from_file(examples.join(service))
            .unwrap_or_else(|e| panic!("sql/examples/{service}: {}", e.user_message()));
    }
    for catalogs in ["postgres.toml", "s3tables-emulator.toml"] {
        icestage::IcestageConfig::from_toml_file(examples.join(catalogs))
            .unwrap_or_else(|e| panic!("sql/examples/{catalogs}: {}", e.user_message()));
    }
    assert!(read >= 5, "{read} TOML examples read");
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
    let sql = page_blocks("README.md", "sql");
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
        for (n, body) in page_blocks(page, "sql").into_iter().enumerate() {
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

/// The blocks of `page` (a path under `docs/src`, or `README.md`) in
/// `language`: those fenced `<language> no-run` (a shape with `(...)`
/// placeholders, or what cannot run here) are left out.
fn page_blocks(page: &str, language: &str) -> Vec<String> {
    let path = match page {
        "README.md" => repo().join(page),
        _ => repo().join("docs/src").join(page),
    };
    let text = std::fs::read_to_string(path).unwrap();
    blocks(&text)
        .into_iter()
        .filter(|(_, info, _)| info == language)
        .map(|(_, _, body)| body)
        .collect()
}

/// A page's shell example, run as a reader runs it in a checkout: from a
/// fresh folder that holds what the commands name (`sql/examples`,
/// `tests/python`, the project's `.venv`), with `python3` the `.venv`'s,
/// `cargo run --release --` the binary under test, `./scripts/setup-venv.sh`
/// what the suite already ran, and the ports the page names replaced by
/// free ones, in the example files too. Lines starting `#>` are the output
/// the page shows, `…` standing for what differs on every run.
struct ShellExample {
    dir: tempfile::TempDir,
    /// Each port the page names, and the free one used instead.
    ports: Vec<(String, String)>,
}

impl ShellExample {
    fn new(ports: &[u16]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ports = ports
            .iter()
            .map(|port| (port.to_string(), free_port().to_string()))
            .collect();
        let example = Self { dir, ports };
        let examples = example.dir.path().join("sql/examples");
        std::fs::create_dir_all(&examples).unwrap();
        for file in files_under(&repo().join("sql/examples")) {
            let text = std::fs::read_to_string(&file).unwrap();
            std::fs::write(
                examples.join(file.file_name().unwrap()),
                example.localize(&text),
            )
            .unwrap();
        }
        std::os::unix::fs::symlink(repo().join("sql/data"), example.dir.path().join("sql/data"))
            .unwrap();
        std::fs::create_dir_all(example.dir.path().join("tests")).unwrap();
        std::os::unix::fs::symlink(
            repo().join("tests/python"),
            example.dir.path().join("tests/python"),
        )
        .unwrap();
        let venv = crate::common::python();
        let venv = venv.parent().and_then(Path::parent).unwrap();
        std::os::unix::fs::symlink(venv, example.dir.path().join(".venv")).unwrap();
        example
    }

    /// The page's `port` is `actual` (a server the test started).
    fn with_port(mut self, port: u16, actual: &str) -> Self {
        self.ports.push((port.to_string(), actual.to_string()));
        self
    }

    /// `text` with the free ports for the page's.
    fn localize(&self, text: &str) -> String {
        let mut text = text.to_string();
        for (page, free) in &self.ports {
            let named = regex::Regex::new(&format!(r"\b{page}\b")).unwrap();
            text = named.replace_all(&text, free.as_str()).into_owned();
        }
        text
    }

    /// Runs `script` in bash (`-euo pipefail`) in the folder, stops
    /// whatever it left running (its background jobs share its process
    /// group), and checks what it printed against the `#>` lines, where
    /// the page shows any. Returns what it printed.
    fn run(&self, script: &str) -> String {
        self.run_after("", script)
    }

    /// [`ShellExample::run`] of `script` after `setup` (an earlier block
    /// of the page, whose output the page does not show).
    fn run_after(&self, setup: &str, script: &str) -> String {
        use std::os::unix::process::CommandExt;
        let binary = env!("CARGO_BIN_EXE_icestage");
        let here = |text: &str| {
            self.localize(text)
                .replace("cargo run --release --", binary)
                .replace("./target/release/icestage", binary)
                .replace("cargo build --release --features cluster", "true")
                .replace("./scripts/setup-venv.sh", "true")
        };
        let (setup, script) = (here(setup), here(script));
        let venv_bin = self.dir.path().join(".venv/bin");
        let path = format!(
            "{}:{}",
            venv_bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let (out, err) = (
            self.dir.path().join("stdout"),
            self.dir.path().join("stderr"),
        );
        let child = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                "set -euo pipefail\n{setup}\necho '{SETUP_DONE}'\n{script}"
            ))
            .current_dir(self.dir.path())
            .env("PATH", path)
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .process_group(0)
            .spawn()
            .unwrap();
        let mut group = ProcessGroup(child);
        let status = group.wait(Duration::from_secs(600));
        drop(group);
        let printed = std::fs::read_to_string(&out).unwrap();
        let printed = match printed.split_once(&format!("{SETUP_DONE}\n")) {
            Some((_, after)) => after.to_string(),
            None => printed,
        };
        let said = std::fs::read_to_string(&err).unwrap();
        assert!(
            status.is_some_and(|s| s.success()),
            "the example ended with {status:?}:\n{script}\nprinted:\n{printed}\nstderr:\n{said}"
        );
        let shown: Vec<String> = script
            .lines()
            .filter_map(|line| line.strip_prefix("#> "))
            .map(str::to_string)
            .collect();
        if shown.is_empty() {
            return printed;
        }
        let lines: Vec<&str> = printed.lines().collect();
        assert_eq!(
            lines.len(),
            shown.len(),
            "the page shows {} lines of output, the example printed {}:\nshown:\n{}\nprinted:\n{printed}",
            shown.len(),
            lines.len(),
            shown.join("\n")
        );
        for (shown, printed) in shown.iter().zip(lines) {
            assert!(
                as_shown(shown, printed),
                "the page shows\n  {shown}\nthe example printed\n  {printed}"
            );
        }
        printed
    }
}

/// Whether `printed` is `shown`, each `…` in it standing for any text.
fn as_shown(shown: &str, printed: &str) -> bool {
    let parts: Vec<&str> = shown.split('…').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return shown == printed;
    }
    let Some(mut rest) = printed.strip_prefix(first) else {
        return false;
    };
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// The line a [`ShellExample`] prints between its setup and its script.
const SETUP_DONE: &str = "--- the setup block is done ---";

/// A shell example's process group: what it started stops with it.
struct ProcessGroup(std::process::Child);

impl ProcessGroup {
    /// The script's exit, or `None` past `timeout`.
    fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if let Some(status) = self.0.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        let group = -libc::pid_t::try_from(self.0.id()).unwrap();
        // SAFETY: signals to the example's own process group.
        unsafe { libc::kill(group, libc::SIGTERM) };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        // SAFETY: signal 0 only asks whether the group still has members.
        while unsafe { libc::kill(group, 0) } == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        // SAFETY: as above.
        unsafe { libc::kill(group, libc::SIGKILL) };
        let _ = self.0.try_wait();
    }
}

/// The service page's walk-through, as written: the upload flow's target,
/// `serve` on `sql/examples/service.toml`, then curl, jq and PyIceberg
/// through an upload, an abort, a download and its read, every `#>` line
/// checked; then a second `serve` on the first one's catalog.
#[test]
fn the_service_walk_through_runs_as_written() {
    let sh = page_blocks("guide/service.md", "sh");
    assert!(sh.len() >= 3 && sh[1].contains("API="), "{sh:?}");
    let example = ShellExample::new(&[8080, 8081]);
    let printed = example.run_after(&sh[0], &sh[1]);
    assert!(printed.contains("txn_004"), "{printed}");
    example.run(&sh[2]);
}

/// The AWS page's emulator steps, as written: moto's server, a table
/// bucket, then the S3 Tables example.
#[test]
fn the_aws_page_runs_on_the_emulator_as_written() {
    let sh = page_blocks("guide/aws.md", "sh");
    assert_eq!(sh.len(), 1, "{sh:?}");
    ShellExample::new(&[5000]).run(&sh[0]);
}

/// The COPY INTO page's commands, as written: its statements, saved as
/// `copy.sql`, on moto's S3 with the page's variables; then the example
/// script on the folder that ships with the repository.
#[test]
fn the_copy_into_page_commands_run_as_written() {
    let moto = crate::aws::Moto::start();
    landing_bucket(&moto.endpoint);
    let sh = page_blocks("guide/copy-into.md", "sh");
    assert_eq!(sh.len(), 2, "{sh:?}");
    let port = moto.endpoint.rsplit(':').next().unwrap();
    let example = ShellExample::new(&[]).with_port(5000, port);
    std::fs::write(
        example.dir.path().join("copy.sql"),
        page_blocks("guide/copy-into.md", "sql").concat(),
    )
    .unwrap();
    example.run(&sh[0]);
    example.run(&sh[1]);
}

/// The cluster page, as written: a scheduler and two executors of the
/// binary under test, then its statements (saved as `cluster.sql`) on the
/// upload flow's target, each of which says it ran on the cluster.
#[cfg(feature = "cluster")]
#[test]
fn the_cluster_page_runs_as_written() {
    let bash = page_blocks("guide/cluster.md", "bash");
    let sql = page_blocks("guide/cluster.md", "sql");
    assert_eq!((bash.len(), sql.len()), (1, 1));
    let example = ShellExample::new(&[50050, 50051, 50052]);
    std::fs::write(
        example.dir.path().join("cluster.sql"),
        example.localize(&sql[0]),
    )
    .unwrap();
    let printed = example.run(&bash[0]);
    let scheduler = example.localize("df://127.0.0.1:50050");
    assert!(printed.matches(&scheduler).count() >= 3, "{printed}");
}
