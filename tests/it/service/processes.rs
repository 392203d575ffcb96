//! Service processes on real sockets: replicas, the source design's Python
//! client, SIGTERM.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_says_what_it_opened_and_warns_without_tokens() {
    let warehouse = Warehouse::new();
    let with_tokens = Service::start(&write_config(&warehouse, ""));
    let said = with_tokens.stderr.lock().unwrap().join("\n");
    assert!(
        said.contains(&format!("warehouse {}", warehouse.path().display()))
            && said.contains("2 API token(s): acme, other"),
        "{said}"
    );
    let bare = warehouse.path().join("bare.toml");
    std::fs::write(
        &bare,
        format!(
            "warehouse = \"{}\"\n[service]\nlisten = \"127.0.0.1:0\"\n",
            warehouse.path().display()
        ),
    )
    .unwrap();
    let without = Service::start(&bare);
    let said = without.stderr.lock().unwrap().join("\n");
    assert!(
        said.contains("no [[service.tokens]]: every request is refused with 401"),
        "{said}"
    );
}

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
    complete(&http, &b.url, &id).await;
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

/// The design's download client: it configures its catalog from the
/// answer of `POST /downloads`, is told "not ready" while the download is
/// being filled (held there by a failpoint), waits, and reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_design_s_download_client_configures_its_catalog_from_the_create_answer() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let resume = warehouse.path().join("resume-download");
    let service = Service::start_held(&write_config(&warehouse, ""), "download.fill", &resume, &[]);
    design_client_promotes(&service, 7);
    let out = python_script(
        "download_client.py",
        &[
            &service.url,
            TOKEN,
            "payments.transactions",
            resume.to_str().unwrap(),
        ],
    );
    let out: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (text(&out, "state"), out["rows"].as_u64()),
        ("ready".to_string(), Some(7)),
        "{out}"
    );
    assert!(
        text(&out, "early").contains("is not ready yet (pending)"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_design_s_python_client_on_an_s3_warehouse() {
    let moto = Moto::start();
    python_script("aws_setup.py", &["create-bucket", &moto.endpoint, "lake"]);
    let warehouse = Warehouse::new();
    let path = warehouse.path().join("service.toml");
    let identity = format!(
        r#""sts.endpoint" = "{}"
access_key_id = "AKIASERVICEIDENTITY"
secret_access_key = "service-secret-never-printed"
role_arn = "arn:aws:iam::123456789012:role/icestage-upload-client""#,
        moto.endpoint
    );
    let config = format!(
        r#"{catalog}
[service]
listen = "127.0.0.1:0"
[[service.tokens]]
name = "acme"
token = "{TOKEN}"
tables = ["payments.transactions"]
operations = ["upload"]
"#,
        catalog = s3_catalog_toml(warehouse.path(), &moto.endpoint, &identity),
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
    complete(&http, &service.url, &id).await;
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

/// PyIceberg with `type="rest"`: the connection of `POST /uploads` is
/// icestage's REST catalog with a token that reaches the staging table only.
/// Out-of-scope loads answer "no such table", schema and property changes
/// are refused, two racing appends both land (the second after a 409 and a
/// reload), the upload promotes, and after the promotion the token opens
/// nothing. A download is then read through the catalog with a read-only
/// token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rest_client_reaches_only_its_staging_table() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let service = Service::start(&write_config(&warehouse, ""));
    let out = python_script(
        "rest_client.py",
        &[&service.url, TOKEN, "payments.transactions", "5"],
    );
    let seen: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(seen["namespaces"], json!([["staging"]]), "{seen}");
    assert_eq!(seen["tables"].as_array().map(Vec::len), Some(1), "{seen}");
    let refusal = |what: &str| {
        seen["refusals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["what"] == what)
            .cloned()
            .unwrap_or_else(|| panic!("no refusal for {what}: {seen}"))
    };
    for what in ["load the target table", "load another namespace's table"] {
        assert_eq!(refusal(what)["error"], "NoSuchTableError", "{seen}");
    }
    for what in ["add a column", "set a property"] {
        let refused = refusal(what);
        assert_eq!(refused["error"], "ForbiddenError", "{seen}");
        assert!(
            refused["message"]
                .as_str()
                .unwrap()
                .contains("only an append is accepted"),
            "{seen}"
        );
    }
    assert_eq!(
        (
            text(&seen["status"], "state"),
            seen["status"]["rows"].as_i64()
        ),
        ("promoted".to_string(), Some(5)),
        "{seen}"
    );
    assert_ne!(seen["after"]["error"], Value::Null, "{seen}");
    // A download's token reads its table and nothing else.
    assert_eq!(seen["download_rows"].as_i64(), Some(5), "{seen}");
    let refusals = seen["download_refusals"].as_array().unwrap();
    assert_eq!(refusals[0]["error"], "NoSuchTableError", "{seen}");
    assert_eq!(refusals[1]["error"], "ForbiddenError", "{seen}");
    let client = warehouse.session().await;
    assert_eq!(
        scalar(&client, "SELECT count(*) FROM payments.transactions").await,
        "5"
    );
}

/// DuckDB (its iceberg extension, loaded offline) as a third client of the
/// REST catalog: it ATTACHes with an upload's token and INSERTs into the
/// staging table, which promotes past the target's UNIQUE and CHECK rules
/// (its manifests name the wrong schema in their metadata; the catalog
/// rewrites them on commit), then reads a download with the download's
/// token and is refused an INSERT there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duckdb_writes_an_upload_and_reads_a_download_through_the_rest_catalog() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    // Rules make promotion plan scans of the staging table, which must read
    // DuckDB's manifests too.
    let client = warehouse.session().await;
    for rule in [
        "ADD CONSTRAINT one_txn UNIQUE (transaction_id)",
        "ADD CONSTRAINT positive CHECK (amount_cents > 0)",
    ] {
        run(
            &client,
            &format!("ALTER TABLE payments.transactions {rule}"),
        )
        .await
        .unwrap();
    }
    // The promotion stops between its commit and its clean-up, so the status
    // the client sees is the one read while the staging table still exists:
    // DuckDB's snapshot summaries carry no totals, and the promoted rows
    // must come from the target's snapshot.
    let service = Service::start_with(
        &write_config(&warehouse, ""),
        &[("ICESTAGE_FAILPOINT", "promote.after-commit")],
    );
    let out = python_script(
        "duckdb_client.py",
        &[&service.url, TOKEN, "payments.transactions"],
    );
    let seen: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(seen["tables"].as_array().map(Vec::len), Some(1), "{seen}");
    assert_eq!(
        (
            text(&seen["upload"], "state"),
            seen["upload"]["rows"].as_i64()
        ),
        ("promoted".to_string(), Some(2)),
        "{seen}"
    );
    assert_eq!(seen["download_rows"].as_i64(), Some(2), "{seen}");
    assert_eq!(seen["download_insert"], "refused", "{seen}");
}

/// Once a promotion holds the upload (stopped by a failpoint just after its
/// claim, in a real service process), a client's commit is a conflict: the
/// rows being validated cannot change under the validation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_after_the_promotion_claim_is_a_conflict() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let service = Service::start_with(
        &write_config(&warehouse, ""),
        &[("ICESTAGE_FAILPOINT", "promote.after-validation")],
    );
    let http = reqwest::Client::new();
    let upload = post_json(
        &http,
        format!("{}/uploads", service.url),
        json!({"table": "payments.transactions"}),
    )
    .await;
    let (_, ctx) = rest_session(&upload).await;
    let staging = text(&upload, "staging_table");
    insert_three(&ctx, &staging).await.unwrap();
    let id = text(&upload, "upload_id");
    complete(&http, &service.url, &id).await;
    wait_state(
        &http,
        &format!("{}/uploads/{id}", service.url),
        &["promoting"],
    )
    .await;
    let refused = insert_three(&ctx, &staging).await.unwrap_err();
    assert!(
        refused.contains("409") || refused.contains("CommitFailed"),
        "{refused}"
    );
    assert!(refused.contains("promoting"), "{refused}");
}

/// An upload opened on the service at `api`, with three rows written
/// through its REST session; its id.
async fn three_rows_staged(http: &reqwest::Client, api: &str) -> String {
    let upload = post_json(
        http,
        format!("{api}/uploads"),
        json!({"table": "payments.transactions"}),
    )
    .await;
    let (_, ctx) = rest_session(&upload).await;
    insert_three(&ctx, &text(&upload, "staging_table"))
        .await
        .unwrap();
    text(&upload, "upload_id")
}

/// `complete` answers 202 only once the promotion holds the upload in the
/// catalog: another replica, asked right after, reads it `promoting`, even
/// while the promotion itself is held (by a failpoint) before it starts.
/// A client's loop "while promoting, wait" cannot end on a stale `open`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_complete_no_replica_reads_the_upload_open() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let resume = warehouse.path().join("resume-promotion");
    let path = write_config(&warehouse, "");
    let (a, b) = (
        Service::start_held(&path, "promote.before-claim", &resume, &[]),
        Service::start_held(&path, "promote.before-claim", &resume, &[]),
    );
    let http = reqwest::Client::new();
    let id = three_rows_staged(&http, &a.url).await;
    complete(&http, &a.url, &id).await;
    let seen = get_json(&http, &format!("{}/uploads/{id}", b.url)).await;
    assert_eq!(text(&seen, "state"), "promoting", "{seen}");
    std::fs::write(&resume, "").unwrap();
    wait_promoted(&http, &b.url, &id, 3).await;
}

/// A replica killed after `complete` answered 202, before its promotion
/// ran: once the claim's lease lapses, the next look at the upload on
/// another replica finishes the promotion, the way `complete` asked for
/// it (an upsert by `transaction_id`, recorded with the claim).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_whose_replica_died_is_finished_by_the_next_look() {
    let warehouse = Warehouse::new();
    let client = target_holding_t1(&warehouse).await;
    let path = write_config(&warehouse, "promotion_lease = \"2s\"");
    let held = Service::start_with(&path, &[("ICESTAGE_FAILPOINT", "promote.before-claim")]);
    let http = reqwest::Client::new();
    let id = three_rows_staged(&http, &held.url).await;
    complete_upserting(&http, &held.url, &id).await;
    assert!(held.reached_failpoint("promote.before-claim"));
    held.kill();

    let other = Service::start(&path);
    let done = wait_state(
        &http,
        &format!("{}/uploads/{id}", other.url),
        &["promoted", "failed"],
    )
    .await;
    assert_eq!(text(&done, "state"), "promoted", "{done}");
    upserted_over_t1(&client).await;
}

/// A replica whose promotion waits on another replica's live claim: once
/// that replica dies and its claim lapses, the waiting promotion takes the
/// upload over, however often the client sends `complete` meanwhile. A
/// complete there used to claim the lapsed upload beside the waiting
/// promotion: a claim no promotion ran or renewed, in the waiting one's
/// way until it lapsed, then taken again by the next complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completes_beside_a_waiting_promotion_do_not_keep_it_waiting() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let path = write_config(&warehouse, "promotion_lease = \"2s\"");
    let held = Service::start_with(&path, &[("ICESTAGE_FAILPOINT", "promote.after-validation")]);
    let waiting = Service::start(&path);
    let http = reqwest::Client::new();
    let id = three_rows_staged(&http, &held.url).await;
    complete(&http, &held.url, &id).await;
    assert!(held.reached_failpoint("promote.after-validation"));
    complete(&http, &waiting.url, &id).await;
    held.kill();

    let status = format!("{}/uploads/{id}", waiting.url);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        complete(&http, &waiting.url, &id).await;
        let seen = get_json(&http, &status).await;
        match text(&seen, "state").as_str() {
            "promoting" => assert!(
                Instant::now() < deadline,
                "the waiting promotion never took the upload over: {seen}"
            ),
            _ => {
                assert_eq!(
                    (text(&seen, "state"), seen["rows"].as_i64()),
                    ("promoted".to_string(), Some(3)),
                    "{seen}"
                );
                break;
            }
        }
    }
}

/// Two completes of one upload at once on one replica: the second, sent
/// while the first is still claiming (held there by a failpoint), claims
/// nothing and answers `promoting` at once, and the one promotion runs with
/// the first's claim. Both used to claim, and the attempt could start with
/// the claim that lost: the winning claim then ran nowhere and held the
/// upload until its lease lapsed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_beside_one_still_claiming_claims_nothing() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let resume = warehouse.path().join("resume-claim");
    let service = Service::start_held(
        &write_config(&warehouse, ""),
        "complete.before-claim",
        &resume,
        &[],
    );
    let http = reqwest::Client::new();
    let id = three_rows_staged(&http, &service.url).await;
    let first = tokio::spawn({
        let (http, api, id) = (http.clone(), service.url.clone(), id.clone());
        async move { complete(&http, &api, &id).await }
    });
    assert!(service.reached_failpoint("complete.before-claim"));
    let second = http
        .post(format!("{}/uploads/{id}/complete", service.url))
        .bearer_auth(TOKEN)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("the second complete waited on the first one's claim");
    assert_eq!(second.status(), 202);
    let second: Value = second.json().await.unwrap();
    assert_eq!(text(&second, "state"), "promoting", "{second}");
    std::fs::write(&resume, "").unwrap();
    first.await.unwrap();
    wait_promoted(&http, &service.url, &id, 3).await;
}

/// A promotion that failed upstream (a storage error injected once, in a
/// real service process) leaves the upload `failed` while its retry
/// waits. A `complete` sent then claims the upload again, with other
/// options: the retry runs with that claim and those options, at once,
/// rather than waiting out the new claim's lease (60 s here) and landing
/// the rows as the first `complete` asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_between_retries_is_what_the_retry_promotes() {
    let warehouse = Warehouse::new();
    let client = target_holding_t1(&warehouse).await;
    let resume = warehouse.path().join("resume-retry");
    let service = Service::start_held(
        &write_config(&warehouse, ""),
        "promote.retry",
        &resume,
        &[("ICESTAGE_FAILPOINT_ERROR", "promote.after-validation")],
    );
    let http = reqwest::Client::new();
    let id = three_rows_staged(&http, &service.url).await;
    let status = format!("{}/uploads/{id}", service.url);
    complete(&http, &service.url, &id).await;
    let failed = wait_state(&http, &status, &["failed", "promoted"]).await;
    assert!(
        text(&failed, "message").contains("an injected storage failure"),
        "{failed}"
    );
    assert!(service.reached_failpoint("promote.retry"));
    complete_upserting(&http, &service.url, &id).await;
    let resumed = Instant::now();
    std::fs::write(&resume, "").unwrap();
    let done = wait_state(&http, &status, &["promoted", "failed"]).await;
    assert_eq!(text(&done, "state"), "promoted", "{done}");
    assert!(
        resumed.elapsed() < Duration::from_secs(30),
        "the retry waited {:?}, as for the second claim's lease",
        resumed.elapsed()
    );
    upserted_over_t1(&client).await;
}

/// The target, holding one row `t1` with amount 1; a session on the
/// warehouse.
async fn target_holding_t1(warehouse: &Warehouse) -> datafusion::prelude::SessionContext {
    target(warehouse).await;
    let client = warehouse.session().await;
    run(
        &client,
        "INSERT INTO payments.transactions VALUES \
         ('t1', 'a1', 1, 'usd', TIMESTAMP '2026-06-01 00:00:00Z')",
    )
    .await
    .unwrap();
    client
}

/// `POST /uploads/{id}/complete` on the service at `api` asking for an
/// upsert by `transaction_id`, accepted.
async fn complete_upserting(http: &reqwest::Client, api: &str, id: &str) {
    let upsert = json!({"mode": "upsert", "key": ["transaction_id"]});
    complete_with(http, api, id, Some(upsert)).await;
}

/// That [`three_rows_staged`]'s rows were upserted by `transaction_id`
/// over [`target_holding_t1`]'s: t1 replaced, t2 and t3 added (an append
/// would have kept the old t1 beside the new one).
async fn upserted_over_t1(client: &datafusion::prelude::SessionContext) {
    assert_eq!(
        scalar(
            client,
            "SELECT string_agg(concat(transaction_id, ':', amount_cents), ' ' \
             ORDER BY transaction_id) FROM payments.transactions"
        )
        .await,
        "t1:100 t2:200 t3:300"
    );
}

/// iceberg-rust's own `RestCatalog`, in process, as the client: it reaches
/// the staging table and nothing else, and DataFusion's `INSERT INTO` over
/// it (iceberg-datafusion's writer, committed through the REST catalog)
/// lands rows that promote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iceberg_rust_s_rest_catalog_writes_an_upload() {
    use iceberg::TableIdent;

    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let service = Service::start(&write_config(&warehouse, ""));
    let http = reqwest::Client::new();
    let upload = post_json(
        &http,
        format!("{}/uploads", service.url),
        json!({"table": "payments.transactions"}),
    )
    .await;
    let (catalog, ctx) = rest_session(&upload).await;
    let target = TableIdent::from_strs(["payments", "transactions"]).unwrap();
    assert!(catalog.load_table(&target).await.is_err());
    let staging = text(&upload, "staging_table");
    let staging_ident = TableIdent::from_strs(staging.split('.')).unwrap();
    assert!(catalog.load_table(&staging_ident).await.is_ok());
    insert_three(&ctx, &staging).await.unwrap();

    let id = text(&upload, "upload_id");
    complete_promoted(&http, &service.url, &id, 3).await;
}
