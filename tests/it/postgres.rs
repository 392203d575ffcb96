//! The SQL catalog on PostgreSQL, a real server (`ICESTAGE_TEST_POSTGRES`,
//! one fresh database per test): PyIceberg's `SqlCatalog` and icestage on
//! one database, a server that cannot be reached or refuses, and a
//! connection the server drops. The concurrency tests run on it too
//! (`*_on_postgres` in `exactly_once` and `service`).

use serde_json::Value;

use crate::common::{PgDatabase, Warehouse, create_upload, python_script, run, scalar, shell_csv};

/// PyIceberg's `SqlCatalog` writes the catalog database first (its tables,
/// its layout); icestage reads that table, promotes an upload that PyIceberg
/// wrote through the connection icestage handed out, and PyIceberg reads
/// the promoted rows back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyiceberg_and_icestage_share_a_postgres_catalog() {
    let warehouse = Warehouse::postgres().await;
    let dir = warehouse.path().canonicalize().unwrap();
    let uri = warehouse.postgres_uri().unwrap();
    let connection = serde_json::json!({
        "name": "local",
        "type": "sql",
        "uri": uri.replacen("postgres://", "postgresql://", 1),
        "warehouse": format!("file://{}", dir.display()),
    })
    .to_string();
    python_script(
        "pyiceberg_client.py",
        &["create", &connection, "payments.transactions", "3"],
    );

    let ctx = warehouse.session().await;
    assert_eq!(
        scalar(&ctx, "SELECT count(*) FROM payments.transactions").await,
        "3"
    );
    let upload = create_upload(&ctx, "payments.transactions").await;
    let handed: Value = serde_json::from_str(&upload.connection).unwrap();
    assert!(
        handed["uri"]
            .as_str()
            .is_some_and(|u| u.starts_with("postgresql://")),
        "PyIceberg is handed a URI SQLAlchemy takes: {handed}"
    );
    python_script(
        "pyiceberg_client.py",
        &["append", &upload.connection, &upload.staging_table, "5"],
    );
    run(&ctx, &format!("PROMOTE UPLOAD '{}'", upload.id))
        .await
        .unwrap();

    let read = python_script(
        "pyiceberg_client.py",
        &["read", &connection, "payments.transactions", &upload.id],
    );
    let read: Value = serde_json::from_str(read.trim()).unwrap();
    assert_eq!(read["rows"], 8, "{read}");
    assert_eq!(
        read["evidence_snapshots"].as_array().map(Vec::len),
        Some(1),
        "{read}"
    );
}

/// The server drops every connection of the catalog's database between
/// two statements (a restart, a failover, an idle timeout): the next
/// statements get new connections, and the promotion lands once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_database_connection_is_replaced_and_the_promotion_lands_once() {
    use sqlx::Connection;
    let warehouse = Warehouse::postgres().await;
    let ctx = warehouse.session().await;
    run(&ctx, "CREATE SCHEMA s").await.unwrap();
    run(&ctx, "CREATE TABLE s.t (id BIGINT NOT NULL)")
        .await
        .unwrap();
    let upload = create_upload(&ctx, "s.t").await;
    run(
        &ctx,
        &format!("INSERT INTO {} VALUES (1), (2)", upload.staging_table),
    )
    .await
    .unwrap();

    let uri = warehouse.postgres_uri().unwrap();
    let mut admin = sqlx::PgConnection::connect(uri).await.unwrap();
    let dropped: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert!(
        !dropped.is_empty() && dropped.iter().all(|d| *d),
        "the session held connections, and the server dropped them: {dropped:?}"
    );

    run(&ctx, &format!("PROMOTE UPLOAD '{}'", upload.id))
        .await
        .unwrap();
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM s.t").await, "2");
    assert_eq!(
        scalar(
            &ctx,
            &format!(
                "SELECT count(*) FROM s.t$snapshots WHERE summary['upload-id'] = '{}'",
                upload.id
            )
        )
        .await,
        "1"
    );
}

/// A server that does not answer, a user it refuses and a database it does
/// not have: one line each, naming the server and what to check, and no
/// password in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_catalog_that_cannot_be_opened_says_what_to_check() {
    let server = PgDatabase::new().await;
    let mut base = url::Url::parse(&server.uri).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let missing = {
        let mut uri = base.clone();
        uri.set_path("icestage_no_such_database");
        uri.to_string()
    };
    let stranger = {
        let mut uri = base.clone();
        uri.set_username("icestage_no_such_role").unwrap();
        uri.set_password(Some("hunter2")).unwrap();
        uri.to_string()
    };
    base.set_port(Some(1)).unwrap();
    let refused = base.to_string();
    for (uri, says) in [
        (
            refused,
            "no PostgreSQL answers at 127.0.0.1:1 (connection refused): check that the server runs",
        ),
        (stranger, "refused user 'icestage_no_such_role'"),
        (
            missing,
            "has no database 'icestage_no_such_database': create it (createdb",
        ),
    ] {
        let file = dir.path().join("catalogs.toml");
        std::fs::write(
            &file,
            format!(
                "[[catalogs]]\nname = \"shared\"\ntype = \"sql\"\n[catalogs.config]\n\
                 uri = \"{uri}\"\nwarehouse = \"file://{}\"\n\"pool.acquire-timeout\" = \"5\"\n",
                dir.path().display()
            ),
        )
        .unwrap();
        let output = shell_csv("--catalog-config", &file)
            .args(["-c", "SELECT 1"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{uri}: {stderr}");
        assert!(
            stderr.contains(says) && stderr.contains("catalog 'shared'"),
            "{uri}: {stderr}"
        );
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(!stderr.contains("hunter2"), "no password: {stderr}");
    }
}

/// `sql/examples/postgres.toml`, pointed at a fresh database and folder,
/// opens and serves SQL as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_example_configuration_opens() {
    let database = PgDatabase::new().await;
    let dir = tempfile::tempdir().unwrap();
    let example =
        std::fs::read_to_string(crate::common::repo().join("sql/examples/postgres.toml")).unwrap();
    let text = example
        .replace(
            "postgresql://postgres@127.0.0.1:5432/icestage",
            &database.uri,
        )
        .replace(
            "file:///tmp/icestage-postgres-warehouse",
            &format!("file://{}", dir.path().display()),
        );
    assert!(
        !text.contains("/icestage\"") && !text.contains("/tmp/icestage-postgres-warehouse"),
        "the example's URI and warehouse were replaced: {text}"
    );
    let config = icestage::IcestageConfig::from_toml_str(&text).unwrap();
    let ctx = datafusion::prelude::SessionContext::new();
    icestage::register(&ctx, config).await.unwrap();
    run(&ctx, "CREATE SCHEMA lake.s").await.unwrap();
    run(&ctx, "CREATE TABLE lake.s.t (id BIGINT NOT NULL)")
        .await
        .unwrap();
    run(&ctx, "INSERT INTO lake.s.t VALUES (1), (2), (3)")
        .await
        .unwrap();
    assert_eq!(scalar(&ctx, "SELECT sum(id) FROM lake.s.t").await, "6");
}
