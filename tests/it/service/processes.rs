//! Service processes on real sockets: replicas, the source design's Python
//! client, SIGTERM.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_catalog_serve_the_same_uploads() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let path = write_config(&warehouse, "");
    let (a, b) = (Service::start(&path), Service::start(&path));
    let http = reqwest::Client::new();
    let created: Value = post_json(
        &http,
        format!("{}/uploads", a.url),
        json!({"table": "payments.transactions", "idempotency_key": "k1"}),
    )
    .await;
    let id = text(&created, "upload_id");
    // The same key on the other replica finds the same upload.
    let again: Value = post_json(
        &http,
        format!("{}/uploads", b.url),
        json!({"table": "payments.transactions", "idempotency_key": "k1"}),
    )
    .await;
    assert_eq!(text(&again, "upload_id"), id);
    let client = warehouse.session().await;
    run(
        &client,
        &format!(
            "INSERT INTO {} VALUES ('t1', 'a1', 100, 'usd', TIMESTAMP '2026-07-01 00:00:00Z')",
            text(&created, "staging_table")
        ),
    )
    .await
    .unwrap();
    let accepted = http
        .post(format!("{}/uploads/{id}/complete", b.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 202);
    let from_a = wait_state(
        &http,
        &format!("{}/uploads/{id}", a.url),
        &["promoted", "failed"],
    )
    .await;
    let from_b = wait_state(
        &http,
        &format!("{}/uploads/{id}", b.url),
        &["promoted", "failed"],
    )
    .await;
    assert_eq!(
        (text(&from_a, "state"), text(&from_b, "state")),
        ("promoted".into(), "promoted".into())
    );
    assert_eq!(
        scalar(&client, "SELECT count(*) FROM payments.transactions").await,
        "1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_design_s_python_client_against_the_service() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    design_client_promotes(&Service::start(&write_config(&warehouse, "")), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_design_s_python_client_on_an_s3_warehouse() {
    let moto = Moto::start();
    python_script("aws_setup.py", &["create-bucket", &moto.endpoint, "lake"]);
    let warehouse = Warehouse::new();
    let path = warehouse.path().join("service.toml");
    let config = format!(
        r#"
[[catalogs]]
name = "lake"
type = "sql"
[catalogs.config]
uri = "sqlite:{dir}/catalog.db?mode=rwc"
warehouse = "s3://lake/wh"
region = "us-east-1"
"s3.endpoint" = "{endpoint}"
"sts.endpoint" = "{endpoint}"
access_key_id = "AKIASERVICEIDENTITY"
secret_access_key = "service-secret-never-printed"
role_arn = "arn:aws:iam::123456789012:role/icestage-upload-client"

[service]
listen = "127.0.0.1:0"
[[service.tokens]]
name = "acme"
token = "{TOKEN}"
tables = ["payments.transactions"]
operations = ["upload"]
"#,
        dir = warehouse.path().display(),
        endpoint = moto.endpoint
    );
    std::fs::write(&path, &config).unwrap();
    {
        let ctx = datafusion::prelude::SessionContext::new();
        icestage::register(
            &ctx,
            ServiceConfig::from_toml_str(&config)
                .unwrap()
                .catalogs()
                .unwrap(),
        )
        .await
        .unwrap();
        create_target(&ctx).await;
    }
    design_client_promotes(&Service::start(&path), 9);
}

/// Wall-clock latencies per endpoint, for the load test's report.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_promotions_in_flight() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let path = write_config(&warehouse, "");
    let mut service = Service::start(&path);
    let http = reqwest::Client::new();
    let created = post_json(
        &http,
        format!("{}/uploads", service.url),
        json!({"table": "payments.transactions"}),
    )
    .await;
    let id = text(&created, "upload_id");
    let client = warehouse.session().await;
    let rows: Vec<String> = (0..200)
        .map(|i| format!("('t{i}', 'a1', {i}, 'usd', TIMESTAMP '2026-07-01 00:00:00Z')"))
        .collect();
    run(
        &client,
        &format!(
            "INSERT INTO {} VALUES {}",
            text(&created, "staging_table"),
            rows.join(", ")
        ),
    )
    .await
    .unwrap();
    let accepted = http
        .post(format!("{}/uploads/{id}/complete", service.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 202);
    let pid = service.child.id().to_string();
    let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(sent.success());
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = service.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "serve did not stop after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "serve exited with {status}");
    // The promotion it had accepted finished before the process ended.
    let state = scalar(&client, &format!("SELECT state FROM upload_status('{id}')")).await;
    assert_eq!(state, "promoted");
    assert_eq!(
        scalar(&client, "SELECT count(*) FROM payments.transactions").await,
        "200"
    );
}
