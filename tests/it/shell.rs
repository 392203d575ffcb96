//! The `icestage` shell as a user runs it: a real process, its output
//! checked with volatile values (ids, timings) masked.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::sync::LazyLock;

use regex::Regex;

use crate::common::{Warehouse, repo};

fn icestage(warehouse: &Warehouse) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_icestage"));
    command
        .arg("--warehouse")
        .arg(warehouse.path())
        .current_dir(repo());
    command
}

fn run(command: &mut Command) -> Output {
    command.output().expect("run icestage")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).to_string()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).to_string()
}

/// Masks upload ids, snapshot ids, timings and table borders' widths.
fn mask(text: &str) -> String {
    static RULES: LazyLock<Vec<(Regex, &str)>> = LazyLock::new(|| {
        vec![
            (Regex::new(r"[0-9a-f]{32}").unwrap(), "<id>"),
            (Regex::new(r"\b[0-9]{15,}\b").unwrap(), "<snapshot>"),
            (
                Regex::new(r"Elapsed [0-9.]+ seconds\.").unwrap(),
                "Elapsed <t> seconds.",
            ),
        ]
    });
    RULES.iter().fold(text.to_string(), |text, (re, to)| {
        re.replace_all(&text, *to).to_string()
    })
}

/// The README's first command's script, its results as CSV.
const UPLOAD_FLOW_AS_CSV: [&str; 5] = [
    "-q",
    "--format",
    "csv",
    "-f",
    "sql/examples/upload_flow.sql",
];

#[test]
fn the_upload_flow_example_prints_the_promoted_rows() {
    let warehouse = Warehouse::new();
    let output = run(icestage(&warehouse).args(UPLOAD_FLOW_AS_CSV));
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        mask(&stdout(&output)),
        "\
upload <id> stages into staging.upload_<id>
count
3
upload_id,state,rows,files,snapshot_id,path,findings,message,ran_on,mode,rows_inserted,rows_updated,rows_deleted,branch
<id>,promoted,3,2,<snapshot>,zero_copy,0,committed 3 row(s) in 2 file(s) to payments.transactions in snapshot <snapshot> without rewriting data,local,append,3,0,0,main
transaction_id,account_id,amount_cents,currency,created_at
txn_001,acct_123,1299,usd,2026-07-01T12:00:00Z
txn_002,acct_456,4200,usd,2026-07-01T12:05:00Z
txn_003,acct_123,250,eur,2026-07-02T08:30:00Z
upload_id,state,target_table,rows,files
<id>,promoted,payments.transactions,3,2
"
    );
    // Running it again on the same warehouse adds one more batch.
    let again = run(icestage(&warehouse).args(["-q", "-f", "sql/examples/upload_flow.sql"]));
    assert!(again.status.success(), "{}", stderr(&again));
    let count = run(icestage(&warehouse).args([
        "-q",
        "--format",
        "csv",
        "-c",
        "SELECT count(*) AS n FROM payments.transactions",
    ]));
    assert_eq!(stdout(&count), "n\n6\n");
}

/// A local warehouse needs no HTTP client, so a system without any CA
/// certificate (a minimal container image) runs the whole flow; object
/// stores' clients are built only when one is used.
#[test]
fn a_local_warehouse_runs_on_a_system_without_ca_certificates() {
    let warehouse = Warehouse::new();
    let certs = tempfile::tempdir().unwrap();
    let empty = certs.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let output = run(icestage(&warehouse)
        .env("SSL_CERT_FILE", &empty)
        .env("SSL_CERT_DIR", certs.path())
        .args(UPLOAD_FLOW_AS_CSV));
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        mask(&stdout(&output)).contains("<id>,promoted,payments.transactions,3,2"),
        "{}",
        stdout(&output)
    );
    assert!(!stderr(&output).contains("panicked"), "{}", stderr(&output));

    // An object store needs them: its first use says so, and nothing panics.
    let config = certs.path().join("s3.toml");
    std::fs::write(
        &config,
        format!(
            "[[catalogs]]\nname = \"lake\"\ntype = \"sql\"\n\n[catalogs.config]\n\
             uri = \"sqlite:{}/catalog.db?mode=rwc\"\n\
             warehouse = \"s3://bucket/warehouse\"\n\
             \"s3.endpoint\" = \"http://127.0.0.1:9\"\n\
             \"s3.region\" = \"us-east-1\"\n",
            warehouse.path().display()
        ),
    )
    .unwrap();
    let refused = run(Command::new(env!("CARGO_BIN_EXE_icestage"))
        .env("SSL_CERT_FILE", &empty)
        .env("SSL_CERT_DIR", certs.path())
        .env("AWS_ACCESS_KEY_ID", "key")
        .env("AWS_SECRET_ACCESS_KEY", "secret")
        .arg("--catalog-config")
        .arg(&config)
        .args(["-q", "-c", "CREATE SCHEMA s; CREATE TABLE s.t (a INT)"]));
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("needs the system's CA certificates and none was found")
            && stderr(&refused).contains("SSL_CERT_FILE")
            && !stderr(&refused).contains("panicked"),
        "{}",
        stderr(&refused)
    );
}

#[test]
fn a_failing_statement_stops_the_script_and_exits_non_zero() {
    let warehouse = Warehouse::new();
    let output = run(icestage(&warehouse).args([
        "-q",
        "-c",
        "SELECT 1 AS a; PROMOTE UPLOAD 'upload_7'; SELECT 2 AS b",
    ]));
    assert_eq!(output.status.code(), Some(1));
    assert!(stdout(&output).contains("| a |"), "{}", stdout(&output));
    assert!(
        !stdout(&output).contains("| b |"),
        "the script must stop at the error"
    );
    assert_eq!(
        stderr(&output),
        "Error: 'upload_7' is not an upload id: upload ids are the 32 hex characters returned by \
         CREATE UPLOAD (see SELECT upload_id FROM uploads())\n"
    );
}

#[test]
fn missing_names_and_variables_are_said() {
    let warehouse = Warehouse::new();
    for (script, said) in [
        (
            "\\d nowhere",
            "Error: no namespace 'nowhere' holds a table: \\d lists every namespace's tables\n",
        ),
        (
            "\\d nowhere.nothing",
            "Error: no table 'nowhere.nothing': \\d <namespace> lists a namespace's tables\n",
        ),
    ] {
        let output = run(icestage(&warehouse).args(["-q", "-c", script]));
        assert_eq!(output.status.code(), Some(1), "{script}");
        assert_eq!(stderr(&output), said);
    }
    let output = run(icestage(&warehouse).args(["-q", "-c", "PROMOTE UPLOAD :'upload_id'"]));
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains(
            "the variable :upload_id is not set: \\set upload_id <value>, or end a query with \\gset"
        ),
        "{}",
        stderr(&output)
    );
}

#[test]
fn table_properties_may_follow_the_partitioning() {
    let warehouse = Warehouse::new();
    let output = run(icestage(&warehouse).args([
        "-q",
        "--format",
        "csv",
        "-c",
        "CREATE SCHEMA s; \
         CREATE TABLE s.t (a INT, day DATE) PARTITIONED BY (day) \
         TBLPROPERTIES ('write.parquet.compression-codec' = 'snappy'); \
         SELECT count(*) AS n FROM s.t",
    ]));
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).contains("n\n0\n"), "{}", stdout(&output));
}

#[test]
fn status_is_answered_by_a_fresh_process() {
    let warehouse = Warehouse::new();
    let setup = run(icestage(&warehouse).args([
        "-q",
        "-c",
        "CREATE SCHEMA s; CREATE TABLE s.t (id INT NOT NULL)",
        "-c",
        "CREATE UPLOAD FOR s.t \\gset\nINSERT INTO :staging_table VALUES (1), (2);\nPROMOTE UPLOAD :'upload_id' \\gset p_\n\\echo :upload_id",
    ]));
    assert!(setup.status.success(), "{}", stderr(&setup));
    let id = stdout(&setup)
        .trim()
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    assert_eq!(id.len(), 32, "{id}");
    let status = run(icestage(&warehouse).args([
        "-q",
        "--format",
        "csv",
        "-c",
        &format!("SELECT state, rows FROM upload_status('{id}')"),
    ]));
    assert_eq!(stdout(&status), "state,rows\npromoted,2\n");
}

#[test]
fn output_formats() {
    let warehouse = Warehouse::new();
    let sql = "SELECT 1 AS n, 'a' AS s";
    let cases = [
        ("csv", "n,s\n1,a\n"),
        ("json", "[{\"n\":1,\"s\":\"a\"}]\n"),
        ("ndjson", "{\"n\":1,\"s\":\"a\"}\n"),
        (
            "table",
            "+---+---+\n| n | s |\n+---+---+\n| 1 | a |\n+---+---+\n",
        ),
    ];
    for (format, expected) in cases {
        let output = run(icestage(&warehouse).args(["-q", "--format", format, "-c", sql]));
        assert_eq!(stdout(&output), expected, "--format {format}");
    }
    let verbose = run(icestage(&warehouse).args(["--format", "csv", "-c", sql]));
    assert_eq!(
        mask(&stdout(&verbose)),
        "n,s\n1,a\n1 row(s) fetched. \nElapsed <t> seconds.\n\n"
    );
    // A JSON column (an upload's connection) is written as the object it
    // holds, in both JSON formats, with the summary line after it.
    let setup = ["-c", "CREATE SCHEMA ns", "-c", "CREATE TABLE ns.t (a INT)"];
    run(icestage(&warehouse).args(setup));
    for (format, quiet) in [("json", true), ("ndjson", true), ("json", false)] {
        let mut command = icestage(&warehouse);
        if quiet {
            command.arg("-q");
        }
        let output = run(command.args(["--format", format, "-c", "CREATE UPLOAD FOR ns.t"]));
        let text = stdout(&output);
        let first = text.lines().next().unwrap_or_default();
        let value: serde_json::Value = serde_json::from_str(first).unwrap();
        let row = if format == "json" { &value[0] } else { &value };
        assert_eq!(row["connection"]["type"], "sql", "{text}");
        assert_eq!(row["target_table"], "ns.t", "{text}");
        assert_eq!(text.contains("1 row(s) fetched"), !quiet, "{text}");
    }
}

#[test]
fn a_catalog_config_file_names_the_catalogs() {
    let warehouse = Warehouse::new();
    let config = warehouse.path().join("catalogs.toml");
    let root = warehouse.path().join("lake");
    std::fs::write(
        &config,
        format!(
            "[[catalogs]]\nname = \"lake\"\ntype = \"sql\"\n[catalogs.config]\n\
             uri = \"sqlite:{0}/catalog.db?mode=rwc\"\nwarehouse = \"file://{0}\"\n",
            root.display()
        ),
    )
    .unwrap();
    let output = run(Command::new(env!("CARGO_BIN_EXE_icestage")).args([
        "--catalog-config",
        config.to_str().unwrap(),
        "-q",
        "--format",
        "csv",
        "-c",
        "CREATE SCHEMA lake.s; CREATE TABLE s.t (id INT); INSERT INTO lake.s.t VALUES (7); \
         SELECT table_catalog, id FROM s.t, information_schema.tables WHERE table_name = 't'",
    ]));
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(stdout(&output), "count\n1\ntable_catalog,id\nlake,7\n");
    assert!(root.join("catalog.db").exists());

    let bad = run(Command::new(env!("CARGO_BIN_EXE_icestage")).args([
        "--catalog-config",
        config.with_extension("missing").to_str().unwrap(),
        "-c",
        "SELECT 1",
    ]));
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        stderr(&bad).starts_with("Error: configuration error: cannot read catalog config"),
        "{}",
        stderr(&bad)
    );
}

#[test]
fn the_interactive_prompt_reads_statements_across_lines() {
    let warehouse = Warehouse::new();
    let mut child = icestage(&warehouse)
        .args(["-q", "--format", "csv"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"\\set who world\nSELECT\n  'hello ' || :'who' AS greeting;\nPROMOTE UPLOAD 'x';\nSELECT 2 AS after_error;\n\\q\n")
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let out = stdout(&output);
    assert!(out.contains("greeting\nhello world\n"), "{out}");
    assert!(
        out.contains("after_error\n2\n"),
        "an error does not end the session: {out}"
    );
    assert!(
        stderr(&output).contains("Error: 'x' is not an upload id"),
        "{}",
        stderr(&output)
    );
}
