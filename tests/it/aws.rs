//! AWS for real, against moto's server on 127.0.0.1 (started here, stopped
//! when the test ends): the S3 Tables catalog, credential vending through
//! STS, a client that holds only vended credentials, and PyIceberg on an S3
//! warehouse.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use datafusion::prelude::SessionContext;
use icestage::{CatalogConfig, IcestageConfig};

use crate::common::{
    python, python_script, repo, run, scalar, shell_csv, stdout_of_success, value,
};

/// moto's server, running for as long as this value lives.
pub struct Moto {
    child: Child,
    pub endpoint: String,
}

impl Moto {
    /// Starts the server on a free port and waits (with a deadline) until it listens.
    pub fn start() -> Self {
        let mut child = Command::new(python())
            .arg(repo().join("tests/python/moto_server.py"))
            .arg("0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto's server");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let port = loop {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(line) => {
                    if let Some(port) = line.strip_prefix("listening on ") {
                        break port.trim().to_string();
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    panic!("moto's server did not start within 60 s");
                }
            }
        };
        Self {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The service's own (emulated) identity; never handed to clients.
const SERVICE_SECRET: &str = "service-secret-never-printed";
const ROLE_ARN: &str = "arn:aws:iam::123456789012:role/icestage-upload-client";

fn aws_config(moto: &Moto) -> Vec<(String, String)> {
    vec![
        ("region".into(), "us-east-1".into()),
        ("s3.endpoint".into(), moto.endpoint.clone()),
        ("sts.endpoint".into(), moto.endpoint.clone()),
        ("access_key_id".into(), "AKIASERVICEIDENTITY".into()),
        ("secret_access_key".into(), SERVICE_SECRET.into()),
        ("role_arn".into(), ROLE_ARN.into()),
        ("external_id".into(), "icestage-test-external-id".into()),
    ]
}

async fn table_bucket(moto: &Moto, name: &str) -> String {
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(&moto.endpoint)
        .credentials_provider(aws_credential_types::Credentials::new(
            "AKIASERVICEIDENTITY",
            SERVICE_SECRET,
            None,
            None,
            "test",
        ))
        .load()
        .await;
    aws_sdk_s3tables::Client::new(&sdk)
        .create_table_bucket()
        .name(name)
        .send()
        .await
        .expect("create table bucket")
        .arn()
        .to_string()
}

fn s3tables_config(moto: &Moto, bucket_arn: &str) -> IcestageConfig {
    let mut config: std::collections::BTreeMap<String, String> =
        aws_config(moto).into_iter().collect();
    config.insert("table_bucket_arn".into(), bucket_arn.to_string());
    config.insert("endpoint_url".into(), moto.endpoint.clone());
    IcestageConfig {
        default_catalog: None,
        catalogs: vec![CatalogConfig {
            name: "lake".into(),
            kind: "s3tables".into(),
            config,
        }],
        limits: Default::default(),
    }
}

/// A SQL catalog in `dir` whose warehouse is on the emulator's S3
/// (`s3://warehouse-bucket/lake`, a bucket the caller creates).
fn s3_warehouse(moto: &Moto, dir: &std::path::Path) -> IcestageConfig {
    let mut config: std::collections::BTreeMap<String, String> =
        aws_config(moto).into_iter().collect();
    config.insert(
        "uri".into(),
        format!("sqlite:{}/catalog.db?mode=rwc", dir.display()),
    );
    config.insert("warehouse".into(), "s3://warehouse-bucket/lake".into());
    IcestageConfig {
        default_catalog: None,
        catalogs: vec![CatalogConfig {
            name: "lake".into(),
            kind: "sql".into(),
            config,
        }],
        limits: Default::default(),
    }
}

/// An upload into `payments.transactions` and write keys vended for it:
/// its id, its staging table and what `vend_credentials` answered.
async fn upload_with_write_keys(
    ctx: &SessionContext,
) -> (String, String, Vec<datafusion::arrow::array::RecordBatch>) {
    let upload = run(ctx, "CREATE UPLOAD FOR payments.transactions")
        .await
        .unwrap();
    let id = value(&upload, "upload_id");
    let vended = run(
        ctx,
        &format!("SELECT * FROM vend_credentials('{id}', 'write', '30m')"),
    )
    .await
    .unwrap();
    (id, value(&upload, "staging_table"), vended)
}

/// A session on an S3 warehouse (its bucket created) holding the target
/// `payments.transactions`.
async fn s3_target(moto: &Moto, dir: &std::path::Path) -> SessionContext {
    s3_target_with(moto, s3_warehouse(moto, dir)).await
}

/// The payments target in a fresh warehouse bucket, opened with `config`.
async fn s3_target_with(moto: &Moto, config: IcestageConfig) -> SessionContext {
    python_script(
        "aws_setup.py",
        &["create-bucket", &moto.endpoint, "warehouse-bucket"],
    );
    let ctx = session(config).await;
    run(&ctx, "CREATE SCHEMA payments").await.unwrap();
    run(&ctx, TARGET).await.unwrap();
    ctx
}

async fn session(config: IcestageConfig) -> SessionContext {
    let ctx = SessionContext::new();
    icestage::register(&ctx, config).await.expect("register");
    ctx
}

const TARGET: &str = "CREATE TABLE payments.transactions (
    transaction_id VARCHAR NOT NULL, account_id VARCHAR NOT NULL,
    amount_cents BIGINT NOT NULL, created_at TIMESTAMP WITH TIME ZONE NOT NULL)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_tables_upload_by_a_client_holding_only_vended_credentials() {
    let moto = Moto::start();
    let bucket_arn = table_bucket(&moto, "lake").await;
    let config = s3tables_config(&moto, &bucket_arn);
    let ctx = session(config.clone()).await;
    run(&ctx, "CREATE SCHEMA payments").await.unwrap();
    run(&ctx, TARGET).await.unwrap();

    let upload = run(&ctx, "CREATE UPLOAD FOR payments.transactions")
        .await
        .unwrap();
    let id = value(&upload, "upload_id");
    let staging = value(&upload, "staging_table");
    let vended = run(&ctx, &format!("SELECT * FROM vend_credentials('{id}')"))
        .await
        .unwrap();
    let access_key = value(&vended, "access_key_id");
    assert_ne!(
        access_key, "AKIASERVICEIDENTITY",
        "vended, not the service's own key"
    );
    assert!(!value(&vended, "session_token").is_empty());
    let catalog_config = value(&vended, "catalog_config");
    assert!(catalog_config.contains(&access_key), "{catalog_config}");
    assert!(!catalog_config.contains(SERVICE_SECRET));
    assert!(!catalog_config.contains("role_arn"));

    // The client: a separate process with no environment at all, configured
    // with nothing but vend_credentials' output.
    let dir = tempfile::tempdir().unwrap();
    let client_config = dir.path().join("client.toml");
    std::fs::write(&client_config, &catalog_config).unwrap();
    let client = shell_csv("--catalog-config", &client_config)
        .env_clear()
        .current_dir(dir.path())
        .arg("-c")
        .arg(format!(
            "INSERT INTO {staging} VALUES \
             ('t1', 'a1', 100, TIMESTAMP '2026-07-01 10:00:00Z'), \
             ('t2', 'a2', 250, TIMESTAMP '2026-07-02 10:00:00Z')"
        ))
        .output()
        .unwrap();
    assert_eq!(stdout_of_success(&client), "count\n2\n");

    // The service promotes. S3 Tables deletes a table's storage with the
    // table, so the files are copied, not registered in place.
    let promoted = run(&ctx, &format!("PROMOTE UPLOAD '{id}'")).await.unwrap();
    assert_eq!(value(&promoted, "path"), "copy");
    assert_eq!(value(&promoted, "rows"), "2");
    let other = session(config).await;
    assert_eq!(
        scalar(
            &other,
            "SELECT sum(amount_cents) FROM payments.transactions"
        )
        .await,
        "350"
    );
    assert_eq!(
        scalar(
            &other,
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'staging'"
        )
        .await,
        "0"
    );
    assert_eq!(
        scalar(&other, &format!("SELECT state FROM upload_status('{id}')")).await,
        "promoted"
    );

    // A download on S3 Tables, read by a client holding only read-only
    // credentials vended for that one table.
    let download = run(
        &ctx,
        "CREATE DOWNLOAD WITH (wait = true) AS SELECT transaction_id FROM payments.transactions WHERE amount_cents > 200",
    )
    .await
    .unwrap();
    let download_id = value(&download, "download_id");
    let read_only = run(
        &ctx,
        &format!("SELECT * FROM vend_credentials('{download_id}')"),
    )
    .await
    .unwrap();
    assert_eq!(value(&read_only, "mode"), "read");
    std::fs::write(&client_config, value(&read_only, "catalog_config")).unwrap();
    let reader = shell_csv("--catalog-config", &client_config)
        .env_clear()
        .current_dir(dir.path())
        .arg("-c")
        .arg(format!(
            "SELECT * FROM {}",
            value(&download, "download_table")
        ))
        .output()
        .unwrap();
    assert_eq!(stdout_of_success(&reader), "transaction_id\nt2\n");

    // Credentials for a finished upload are refused.
    let refused = run(&ctx, &format!("SELECT * FROM vend_credentials('{id}')"))
        .await
        .unwrap_err();
    assert!(
        refused
            .user_message()
            .contains("is promoted: credentials are vended for open uploads only"),
        "{}",
        refused.user_message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_tables_rewrites_when_the_target_schema_evolved_and_retries_conflicts() {
    let moto = Moto::start();
    let bucket_arn = table_bucket(&moto, "lake").await;
    let config = s3tables_config(&moto, &bucket_arn);
    let ctx = session(config.clone()).await;
    run(&ctx, "CREATE SCHEMA payments").await.unwrap();
    run(
        &ctx,
        "CREATE TABLE payments.transactions (legacy VARCHAR, transaction_id VARCHAR NOT NULL, amount_cents BIGINT NOT NULL)",
    )
    .await
    .unwrap();
    // Evolve the target so its field ids are 2 and 3: a staging table the
    // catalog creates numbers them 1 and 2, so promotion must rewrite.
    let icestage = icestage::Catalogs::connect(&config).await.unwrap();
    let catalog = icestage.catalog("lake").unwrap().catalog();
    let ident = iceberg::TableIdent::from_strs(["payments", "transactions"]).unwrap();
    let table = catalog.load_table(&ident).await.unwrap();
    let tx = iceberg::transaction::Transaction::new(&table);
    let tx = iceberg::transaction::ApplyTransactionAction::apply(
        tx.update_schema().delete_column("legacy"),
        tx,
    )
    .unwrap();
    tx.commit(catalog.as_ref()).await.unwrap();

    // Two uploads promoted at the same time: their commits race on the
    // table's version token and the loser retries.
    let mut ids = vec![];
    for (i, rows) in [(0, 3), (1, 4)] {
        let upload = run(&ctx, "CREATE UPLOAD FOR payments.transactions")
            .await
            .unwrap();
        let staging = value(&upload, "staging_table");
        let values: Vec<String> = (0..rows).map(|r| format!("('u{i}r{r}', {r})")).collect();
        run(
            &ctx,
            &format!("INSERT INTO {staging} VALUES {}", values.join(", ")),
        )
        .await
        .unwrap();
        ids.push(value(&upload, "upload_id"));
    }
    let (first, second) = (
        format!("PROMOTE UPLOAD '{}'", ids[0]),
        format!("PROMOTE UPLOAD '{}'", ids[1]),
    );
    let (a, b) = tokio::join!(run(&ctx, &first), run(&ctx, &second));
    for result in [a.unwrap(), b.unwrap()] {
        assert_eq!(value(&result, "path"), "rewrite");
    }
    assert_eq!(
        scalar(&ctx, "SELECT count(*) FROM payments.transactions").await,
        "7"
    );
    assert_eq!(
        scalar(&ctx, "SELECT count(*) FROM payments.transactions$snapshots WHERE summary['upload-id'] IS NOT NULL").await,
        "2"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_show_in_debug_explain_or_errors() {
    let moto = Moto::start();
    let bucket_arn = table_bucket(&moto, "lake").await;
    let config = s3tables_config(&moto, &bucket_arn);
    assert!(!format!("{config:?}").contains(SERVICE_SECRET));
    let ctx = session(config.clone()).await;
    let icestage = icestage::Catalogs::connect(&config).await.unwrap();
    assert!(
        !format!("{icestage:?}").contains(SERVICE_SECRET),
        "{icestage:?}"
    );
    run(&ctx, "CREATE SCHEMA s").await.unwrap();
    run(&ctx, "CREATE TABLE s.t (id INT NOT NULL)")
        .await
        .unwrap();
    let id = value(
        &run(&ctx, "CREATE UPLOAD FOR s.t").await.unwrap(),
        "upload_id",
    );

    let vended = run(&ctx, &format!("SELECT * FROM vend_credentials('{id}')"))
        .await
        .unwrap();
    let secret = value(&vended, "secret_access_key");
    let token = value(&vended, "session_token");
    let explain = run(
        &ctx,
        &format!("EXPLAIN SELECT * FROM vend_credentials('{id}')"),
    )
    .await
    .unwrap();
    let explained = datafusion::arrow::util::pretty::pretty_format_batches(&explain)
        .unwrap()
        .to_string();
    assert!(explained.contains("VendCredentials"), "{explained}");
    for hidden in [SERVICE_SECRET, secret.as_str(), token.as_str()] {
        assert!(!explained.contains(hidden));
    }
    // An STS failure (no role configured) names the catalog, not its secrets.
    let mut without_role = config.clone();
    without_role.catalogs[0].config.remove("role_arn");
    let other = session(without_role).await;
    let error = run(&other, &format!("SELECT * FROM vend_credentials('{id}')"))
        .await
        .unwrap_err();
    let message = format!("{} {error:?}", error.user_message());
    assert!(
        message.contains("catalog 'lake' has no role_arn"),
        "{message}"
    );
    assert!(!message.contains(SERVICE_SECRET));
    // A failing statement on the catalog does not print them either.
    let error = run(&ctx, "SELECT * FROM s.missing").await.unwrap_err();
    assert!(!format!("{} {error:?}", error.user_message()).contains(SERVICE_SECRET));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyiceberg_appends_with_vended_credentials_on_an_s3_warehouse() {
    let moto = Moto::start();
    let dir = tempfile::tempdir().unwrap();
    let ctx = s3_target(&moto, dir.path()).await;
    let (id, staging, vended) = upload_with_write_keys(&ctx).await;
    let connection = value(&vended, "connection");
    let properties: serde_json::Value = serde_json::from_str(&connection).unwrap();
    assert_eq!(
        properties["s3.access-key-id"],
        value(&vended, "access_key_id")
    );
    assert_eq!(properties["warehouse"], "s3://warehouse-bucket/lake");

    python_script(
        "pyiceberg_client.py",
        &["append", &connection, &staging, "12"],
    );
    let promoted = run(&ctx, &format!("PROMOTE UPLOAD '{id}'")).await.unwrap();
    assert_eq!(value(&promoted, "rows"), "12");
    let read = python_script(
        "pyiceberg_client.py",
        &["read", &connection, "payments.transactions", &id],
    );
    assert!(read.contains("\"rows\": 12"), "{read}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_s3_tables_example_runs_on_the_emulator() {
    let moto = Moto::start();
    let arn = python_script(
        "aws_setup.py",
        &["create-table-bucket", &moto.endpoint, "lake"],
    );
    assert_eq!(
        arn.trim(),
        "arn:aws:s3tables:us-east-1:123456789012:bucket/lake"
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("emulator.toml");
    let example =
        std::fs::read_to_string(repo().join("sql/examples/s3tables-emulator.toml")).unwrap();
    std::fs::write(
        &config,
        example.replace("http://127.0.0.1:5000", &moto.endpoint),
    )
    .unwrap();
    let output = shell_csv("--catalog-config", &config)
        .current_dir(repo())
        .args(["-f", "sql/examples/s3tables_flow.sql"])
        .output()
        .unwrap();
    let stdout = stdout_of_success(&output);
    assert!(
        stdout.contains("state,rows,files,path\npromoted,2,1,copy\n"),
        "{stdout}"
    );
    assert!(
        stdout.ends_with("transaction_id,amount_cents\ntxn_001,1299\ntxn_002,4200\n"),
        "{stdout}"
    );
    assert!(!stdout.contains("secret"), "{stdout}");
}

/// A staged object replaced between verification and the rules (the
/// client's keys still reach it, and the padding keeps its stored size)
/// changes nothing: UNIQUE reads the copies verification read, so the key
/// already in the target is found and nothing lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_read_the_copies_verification_read_not_the_staged_objects() {
    let moto = Moto::start();
    python_script(
        "aws_setup.py",
        &["create-bucket", &moto.endpoint, "warehouse-bucket"],
    );
    let dir = tempfile::tempdir().unwrap();
    let config = s3_warehouse(&moto, dir.path());
    let config_file = dir.path().join("catalogs.toml");
    let mut text =
        String::from("[[catalogs]]\nname = \"lake\"\ntype = \"sql\"\n\n[catalogs.config]\n");
    for (key, value) in &config.catalogs[0].config {
        text.push_str(&format!("{key:?} = {value:?}\n"));
    }
    std::fs::write(&config_file, text).unwrap();
    let ctx = session(config).await;
    run(&ctx, "CREATE SCHEMA payments").await.unwrap();
    run(&ctx, TARGET).await.unwrap();
    run(
        &ctx,
        "ALTER TABLE payments.transactions ADD CONSTRAINT one_row_per_txn UNIQUE (transaction_id)",
    )
    .await
    .unwrap();
    run(
        &ctx,
        "INSERT INTO payments.transactions VALUES \
         ('txn_000', 'acct_0', 1, TIMESTAMP '2026-07-01T00:00:00Z')",
    )
    .await
    .unwrap();
    let (id, staging, vended) = upload_with_write_keys(&ctx).await;
    let connection = value(&vended, "connection");
    // txn_000, txn_001, txn_002: the first is already in the target.
    python_script(
        "pyiceberg_client.py",
        &["append", &connection, &staging, "3"],
    );

    let resume = dir.path().join("resume");
    let mut promote = Command::new(env!("CARGO_BIN_EXE_icestage"))
        .arg("--catalog-config")
        .arg(&config_file)
        .args(["-c", &format!("PROMOTE UPLOAD '{id}'")])
        .env("ICESTAGE_FAILPOINT", "validate.after-verification")
        .env("ICESTAGE_FAILPOINT_RESUME", &resume)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines, seen) = mpsc::channel();
    let stderr = promote.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let mut said = vec![];
    while !said
        .iter()
        .any(|l: &String| l.contains("failpoint validate.after-verification reached"))
    {
        match seen.recv_timeout(Duration::from_secs(120)) {
            Ok(line) => said.push(line),
            Err(e) => panic!("the promotion did not reach verification's end ({e}): {said:?}"),
        }
    }
    let replaced = python_script(
        "hostile_client.py",
        &["replace-same-size", &connection, &staging],
    );
    assert!(replaced.contains("\"rows\": 3"), "{replaced}");
    std::fs::write(&resume, b"").unwrap();
    let status = promote.wait().unwrap();
    said.extend(seen.try_iter());
    let said = said.join("\n");
    assert!(!status.success(), "the promotion passed:\n{said}");
    assert!(
        said.contains("one_row_per_txn") && said.contains("fails for 1 row(s)"),
        "{said}"
    );
    let findings = format!("SELECT \"values\" FROM upload_findings('{id}')");
    assert!(scalar(&ctx, &findings).await.contains("txn_000"));
    assert_eq!(
        scalar(&ctx, "SELECT count(*) FROM payments.transactions").await,
        "1"
    );
}

/// On an S3 warehouse: `REWRITE DATA FILES` packs small files written
/// there, and `REMOVE ORPHAN FILES` lists the table's prefix (not a
/// neighbour's that starts with the same letters), counts every object
/// the table references, and leaves an unreferenced object younger than
/// the cut-off where it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_files_are_packed_and_orphans_found_on_an_s3_warehouse() {
    let moto = Moto::start();
    let dir = tempfile::tempdir().unwrap();
    let ctx = s3_target(&moto, dir.path()).await;
    for n in 0..3 {
        run(
            &ctx,
            &format!(
                "INSERT INTO payments.transactions VALUES \
                 ('txn_{n}', 'acct_0', {n}, TIMESTAMP '2026-07-01T00:00:00Z')"
            ),
        )
        .await
        .unwrap();
    }
    let packed = run(&ctx, "REWRITE DATA FILES payments.transactions")
        .await
        .unwrap();
    assert_eq!(value(&packed, "files_rewritten"), "3");
    assert_eq!(value(&packed, "data_files_after"), "1");
    assert_eq!(
        crate::common::scalar(&ctx, "SELECT sum(amount_cents) FROM payments.transactions").await,
        "3"
    );

    let prefix = "lake/payments/transactions/";
    for key in [
        format!("{prefix}data/in-flight.parquet"),
        "lake/payments/transactions_old/data/stray.parquet".to_string(),
    ] {
        python_script(
            "aws_setup.py",
            &[
                "put-object",
                &moto.endpoint,
                "warehouse-bucket",
                &key,
                "orphan",
            ],
        );
    }
    let stored: i64 = python_script(
        "aws_setup.py",
        &["count-objects", &moto.endpoint, "warehouse-bucket", prefix],
    )
    .trim()
    .parse()
    .unwrap();
    let swept = run(
        &ctx,
        "REMOVE ORPHAN FILES payments.transactions WITH (older_than = '1h')",
    )
    .await
    .unwrap();
    assert_eq!(
        [
            value(&swept, "files_listed"),
            value(&swept, "files_referenced"),
            value(&swept, "files_too_recent"),
            value(&swept, "orphans_found"),
        ],
        [
            stored.to_string(),
            (stored - 1).to_string(),
            "1".to_string(),
            "0".to_string()
        ],
        "{}",
        value(&swept, "message")
    );
    assert_eq!(
        value(&swept, "location"),
        "s3://warehouse-bucket/lake/payments/transactions"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_file_over_one_part_is_copied_by_the_store_in_parts() {
    let moto = Moto::start();
    let dir = tempfile::tempdir().unwrap();
    // Parts of 5 MiB (S3's smallest) stand in for 5 GiB ones.
    let mut config = s3_warehouse(&moto, dir.path());
    config.catalogs[0]
        .config
        .insert("s3.copy-part-size".into(), (5u64 << 20).to_string());
    let ctx = s3_target_with(&moto, config.clone()).await;
    let upload = run(&ctx, "CREATE UPLOAD FOR payments.transactions")
        .await
        .unwrap();
    let (id, staging) = (value(&upload, "upload_id"), value(&upload, "staging_table"));
    // Hex digests compress to about half: staged files of several MB.
    run(
        &ctx,
        &format!(
            "INSERT INTO {staging} SELECT encode(sha256(CAST(value AS VARCHAR)), 'hex') || \
             encode(sha256(CAST(value + 1 AS VARCHAR)), 'hex'), 'acct', value, \
             TIMESTAMP '2026-07-01 10:00:00Z' FROM range(800000)"
        ),
    )
    .await
    .unwrap();
    let promoted = run(&ctx, &format!("PROMOTE UPLOAD '{id}'")).await.unwrap();
    assert_eq!(value(&promoted, "rows"), "800000");
    // The copy is a multipart object (its ETag counts its parts) that the
    // store assembled: the verified rows are all there.
    let listed = python_script(
        "aws_setup.py",
        &[
            "etags",
            &moto.endpoint,
            "warehouse-bucket",
            "lake/payments/transactions/data/",
        ],
    );
    let parts: Vec<(u64, String)> = listed
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let (_, size, etag) = (words.next()?, words.next()?, words.next()?);
            Some((size.parse().ok()?, etag.to_string()))
        })
        .collect();
    assert!(parts.iter().any(|(size, _)| *size > 5 << 20), "{listed}");
    for (size, etag) in &parts {
        let expected = format!("-{}", size.div_ceil(5 << 20));
        if *size > 5 << 20 {
            assert!(etag.ends_with(&expected), "{listed}");
        }
    }
    assert_eq!(
        scalar(
            &session(config.clone()).await,
            "SELECT count(*) || '/' || count(DISTINCT transaction_id) FROM payments.transactions"
        )
        .await,
        "800000/800000"
    );

    // A part size S3 does not take is refused by name, when the catalog
    // is opened.
    config.catalogs[0]
        .config
        .insert("s3.copy-part-size".into(), "1000".into());
    let refused = icestage::register(&SessionContext::new(), config)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("s3.copy-part-size = '1000' is not a part size S3 takes"),
        "{refused}"
    );
}
