//! `icestage serve`: the router in-process (tower's `oneshot`), real
//! service processes on real sockets (two replicas on one catalog, a
//! restart), webhooks, the source design's Python client, and a bounded load
//! test.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use icestage::service::{AppState, ServiceConfig, router};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::aws::Moto;
use crate::common::{Warehouse, python_script, run, scalar};

const TOKEN: &str = "sk_test_acme";
const OTHER: &str = "sk_test_other";

fn config(warehouse: &Warehouse, extra: &str) -> String {
    format!(
        r#"
warehouse = "{}"
[service]
listen = "127.0.0.1:0"
id_secret = "replicas-share-this"
requests_per_minute = 10000
{extra}
[[service.tokens]]
name = "acme"
token = "{TOKEN}"
tables = ["payments.transactions", "payments.missing"]
operations = ["upload", "download"]
[[service.tokens]]
name = "other"
token = "{OTHER}"
tables = ["payments.transactions"]
operations = ["download"]
"#,
        warehouse.path().display()
    )
}

/// Creates the target table `payments.transactions` in the embedded warehouse.
async fn target(warehouse: &Warehouse) {
    create_target(&warehouse.session().await).await;
}

async fn create_target(ctx: &datafusion::prelude::SessionContext) {
    run(ctx, "CREATE SCHEMA payments").await.unwrap();
    run(
        ctx,
        "CREATE TABLE payments.transactions (transaction_id VARCHAR NOT NULL, account_id VARCHAR NOT NULL, \
         amount_cents BIGINT NOT NULL, currency VARCHAR NOT NULL, created_at TIMESTAMP WITH TIME ZONE NOT NULL)",
    )
    .await
    .unwrap();
}

/// Runs the design's client (tests/python/api_client.py) against `service`
/// and checks that its `rows` were promoted.
fn design_client_promotes(service: &Service, rows: usize) {
    let out = python_script(
        "api_client.py",
        &[
            &service.url,
            TOKEN,
            "payments.transactions",
            &rows.to_string(),
        ],
    );
    let status: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (text(&status, "state"), status["rows"].as_u64()),
        ("promoted".into(), Some(rows as u64)),
        "{status}"
    );
}

/// Sends one request through the router; returns status and JSON body.
/// The service's router for a config given as TOML text.
async fn app(config_text: &str) -> axum::Router {
    let config = ServiceConfig::from_toml_str(config_text).unwrap();
    router(AppState::new(config).await.unwrap())
}

/// [`call`] with the token of `acme` and no body.
async fn call_as_acme(app: &axum::Router, method: &str, path: &str) -> (StatusCode, Value) {
    call(app, method, path, Some(TOKEN), None).await
}

async fn call(
    app: &axum::Router,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (StatusCode, Value) {
    let mut request = Request::builder().method(method).uri(path);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    if body.is_some() {
        request = request.header("content-type", "application/json");
    }
    let request = request
        .body(Body::from(body.unwrap_or_default().to_string()))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 24)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn text(value: &Value, key: &str) -> String {
    value[key].as_str().unwrap_or_default().to_string()
}

/// Calls `get` every 100 ms until the `state` it answers is one of `states`.
async fn poll<F: std::future::Future<Output = Value>>(
    what: &str,
    states: &[&str],
    mut get: impl FnMut() -> F,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let body = get().await;
        if states.contains(&text(&body, "state").as_str()) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never reached {states:?}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn poll_until(app: &axum::Router, path: &str, states: &[&str]) -> Value {
    poll(path, states, || async {
        let (status, body) = call(app, "GET", path, Some(TOKEN), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upload_and_download_flow_through_the_router() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let app = app(&config(&warehouse, "")).await;

    let (status, health) = call(&app, "GET", "/healthz", None, None).await;
    assert_eq!((status, health), (StatusCode::OK, json!({"status": "ok"})));

    let create = r#"{"table": "payments.transactions", "idempotency_key": "batch-7", "ttl": "2h"}"#;
    let (status, upload) = call(&app, "POST", "/uploads", Some(TOKEN), Some(create)).await;
    assert_eq!(status, StatusCode::CREATED, "{upload}");
    let id = text(&upload, "upload_id");
    assert_eq!(upload["connection"]["type"], "sql");
    // A retried create (same idempotency key) is the same upload.
    let (_, again) = call(&app, "POST", "/uploads", Some(TOKEN), Some(create)).await;
    assert_eq!(text(&again, "upload_id"), id);

    let (status, credentials) =
        call_as_acme(&app, "POST", &format!("/uploads/{id}/credentials")).await;
    assert_eq!(status, StatusCode::OK, "{credentials}");
    assert_eq!(text(&credentials, "mode"), "write");

    // The client writes with an Iceberg client of its own.
    let client = warehouse.session().await;
    run(
        &client,
        &format!(
            "INSERT INTO {} VALUES ('t1', 'a1', 100, 'usd', TIMESTAMP '2026-07-01 00:00:00Z'), \
             ('t2', 'a2', 200, 'eur', TIMESTAMP '2026-07-02 00:00:00Z')",
            text(&upload, "staging_table")
        ),
    )
    .await
    .unwrap();
    let (status, accepted) = call_as_acme(&app, "POST", &format!("/uploads/{id}/complete")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let done = poll_until(&app, &format!("/uploads/{id}"), &["promoted", "failed"]).await;
    assert_eq!(
        (text(&done, "state"), done["rows"].as_i64()),
        ("promoted".to_string(), Some(2)),
        "{done}"
    );
    assert_eq!(
        scalar(&client, "SELECT count(*) FROM payments.transactions").await,
        "2"
    );
    let (status, closed) = call_as_acme(&app, "POST", &format!("/uploads/{id}/credentials")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{closed}");

    // Findings of a failed upload, paged.
    run(
        &client,
        "ALTER TABLE payments.transactions ADD CONSTRAINT positive CHECK (amount_cents > 0)",
    )
    .await
    .unwrap();
    let (_, failing) = call(
        &app,
        "POST",
        "/uploads",
        Some(TOKEN),
        Some(r#"{"table": "payments.transactions"}"#),
    )
    .await;
    let failing_id = text(&failing, "upload_id");
    let values: Vec<String> = (0..5)
        .map(|i| format!("('f{i}', 'a', -{i}, 'usd', TIMESTAMP '2026-07-03 00:00:00Z')"))
        .collect();
    run(
        &client,
        &format!(
            "INSERT INTO {} VALUES {}",
            text(&failing, "staging_table"),
            values.join(", ")
        ),
    )
    .await
    .unwrap();
    call_as_acme(&app, "POST", &format!("/uploads/{failing_id}/complete")).await;
    let failed = poll_until(
        &app,
        &format!("/uploads/{failing_id}"),
        &["promoted", "failed"],
    )
    .await;
    assert_eq!(text(&failed, "state"), "failed", "{failed}");
    // amount_cents 0 and -1..-4 break the rule.
    assert_eq!(failed["findings"].as_i64(), Some(5), "{failed}");
    let (status, page) = call_as_acme(
        &app,
        "GET",
        &format!("/uploads/{failing_id}/findings?page=2&page_size=3"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(
        (
            page["total"].as_i64(),
            page["items"].as_array().map(Vec::len)
        ),
        (Some(5), Some(2)),
        "{page}"
    );
    let (status, aborted) = call_as_acme(&app, "DELETE", &format!("/uploads/{failing_id}")).await;
    assert_eq!(
        (status, text(&aborted, "state")),
        (StatusCode::OK, "aborted".to_string())
    );

    // Downloads, with a structured filter.
    let request = r#"{"table": "payments.transactions", "columns": ["transaction_id", "amount_cents"],
        "filter": [{"column": "currency", "op": "in", "value": ["usd", "gbp"]}, {"column": "amount_cents", "op": "ge", "value": 50}]}"#;
    let (status, download) = call(&app, "POST", "/downloads", Some(TOKEN), Some(request)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{download}");
    let download_id = text(&download, "download_id");
    let ready = poll_until(
        &app,
        &format!("/downloads/{download_id}"),
        &["ready", "failed"],
    )
    .await;
    assert_eq!(
        (text(&ready, "state"), ready["rows"].as_i64()),
        ("ready".to_string(), Some(1)),
        "{ready}"
    );
    let (status, read) = call_as_acme(
        &app,
        "POST",
        &format!("/downloads/{download_id}/credentials"),
    )
    .await;
    assert_eq!(
        (status, text(&read, "mode")),
        (StatusCode::OK, "read".to_string())
    );
    let table = text(&download, "download_table");
    assert_eq!(
        scalar(&client, &format!("SELECT transaction_id FROM {table}")).await,
        "t1"
    );

    // Another token cannot see this token's sessions.
    let (status, _) = call(&app, "GET", &format!("/uploads/{id}"), Some(OTHER), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

/// The ids (column `id`, INT) a download of `ledger.entries` with `filter`
/// holds, once ready.
async fn download_ids(
    app: &axum::Router,
    client: &datafusion::prelude::SessionContext,
    filter: &str,
) -> Vec<i32> {
    use datafusion::arrow::array::AsArray;
    let body = format!(r#"{{"table": "ledger.entries", "columns": ["id"], "filter": {filter}}}"#);
    let (status, download) = call(
        app,
        "POST",
        "/downloads",
        Some("sk_test_books"),
        Some(&body),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{filter}: {download}");
    let path = format!("/downloads/{}", text(&download, "download_id"));
    let ready = poll(&path, &["ready", "failed"], || async {
        call(app, "GET", &path, Some("sk_test_books"), None).await.1
    })
    .await;
    assert_eq!(text(&ready, "state"), "ready", "{filter}: {ready}");
    let table = text(&download, "download_table");
    let batches = run(client, &format!("SELECT id FROM {table} ORDER BY id"))
        .await
        .unwrap();
    batches
        .iter()
        .flat_map(|b| {
            b.column(0)
                .as_primitive::<datafusion::arrow::datatypes::Int32Type>()
                .values()
                .to_vec()
        })
        .collect()
}

/// The download filter compares in the column's own type: decimals exactly
/// (to the last digit, past what a double holds), timestamps and dates as
/// instants and days, integers within their type's range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_filters_are_typed_and_exact() {
    let warehouse = Warehouse::new();
    let client = warehouse.session().await;
    run(&client, "CREATE SCHEMA ledger").await.unwrap();
    run(
        &client,
        "CREATE TABLE ledger.entries (id INT NOT NULL, amount DECIMAL(20, 2) NOT NULL, \
         booked TIMESTAMP WITH TIME ZONE NOT NULL, day DATE NOT NULL)",
    )
    .await
    .unwrap();
    run(
        &client,
        "INSERT INTO ledger.entries VALUES \
         (1, CAST('123456789012345678.91' AS DECIMAL(20, 2)), TIMESTAMP '2026-07-01T12:00:00Z', DATE '2026-07-01'), \
         (2, CAST('123456789012345678.92' AS DECIMAL(20, 2)), TIMESTAMP '2026-07-01T12:00:01Z', DATE '2026-07-02'), \
         (3, CAST('0.10' AS DECIMAL(20, 2)), TIMESTAMP '2026-07-02T00:00:00Z', DATE '2026-07-03')",
    )
    .await
    .unwrap();
    let extra = r#"
[[service.tokens]]
name = "books"
token = "sk_test_books"
tables = ["ledger.entries"]
operations = ["download"]
"#;
    let app = app(&config(&warehouse, extra)).await;
    let ids = |filter: &'static str| download_ids(&app, &client, filter);
    // 20 digits: as doubles both amounts are the same number.
    assert_eq!(
        ids(r#"[{"column": "amount", "op": "eq", "value": "123456789012345678.92"}]"#).await,
        [2]
    );
    assert_eq!(
        ids(r#"[{"column": "amount", "op": "lt", "value": "123456789012345678.92"}]"#).await,
        [1, 3]
    );
    assert_eq!(
        ids(r#"[{"column": "amount", "op": "in", "value": [0.1, "123456789012345678.91"]}]"#).await,
        [1, 3]
    );
    assert_eq!(
        ids(r#"[{"column": "booked", "op": "gt", "value": "2026-07-01T12:00:00Z"}]"#).await,
        [2, 3]
    );
    assert_eq!(
        ids(r#"[{"column": "booked", "op": "ge", "value": "2026-07-01 14:00:01+02:00"}]"#).await,
        [2, 3]
    );
    assert_eq!(ids(r#"[{"column": "day", "op": "le", "value": "2026-07-02"}, {"column": "id", "op": "ne", "value": 1}]"#).await, [2]);

    for (filter, message) in [
        (
            r#"[{"column": "amount", "op": "eq", "value": "1.234"}]"#,
            "needs a decimal of at most 20 digits, 2 after the point",
        ),
        (
            r#"[{"column": "amount", "op": "eq", "value": 123456789012345678.92}]"#,
            "send one of more than 15 digits as a string",
        ),
        (
            r#"[{"column": "id", "op": "eq", "value": 3000000000}]"#,
            "does not fit the column",
        ),
        (
            r#"[{"column": "day", "op": "eq", "value": "July 1st"}]"#,
            "needs a date like \"2026-07-01\"",
        ),
    ] {
        let body = format!(r#"{{"table": "ledger.entries", "filter": {filter}}}"#);
        let (status, error) = call(
            &app,
            "POST",
            "/downloads",
            Some("sk_test_books"),
            Some(&body),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{filter}: {error}");
        let text = error["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(text.contains(message), "{filter}: {text}");
    }
}

/// Method, path, token, body; the status and a part of the message expected.
type BadRequest = (
    &'static str,
    &'static str,
    Option<&'static str>,
    Option<String>,
    StatusCode,
    &'static str,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_with_a_clear_error_before_the_catalog() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let limits = "max_body_bytes = 512\nrequests_per_minute = 1000";
    let text_config = config(&warehouse, "")
        .replace("requests_per_minute = 10000\n", "")
        .replace("[service]\n", &format!("[service]\n{limits}\n"));
    let app = app(&text_config).await;
    let upload = r#"{"table": "payments.transactions"}"#;
    let cases: Vec<BadRequest> = vec![
        ("POST", "/uploads", None, Some(upload.into()), StatusCode::UNAUTHORIZED, "send the token as Authorization: Bearer <token>"),
        ("POST", "/uploads", Some("sk_wrong"), Some(upload.into()), StatusCode::UNAUTHORIZED, "the bearer token is not valid"),
        ("POST", "/uploads", Some(OTHER), Some(upload.into()), StatusCode::FORBIDDEN, "token 'other' may not upload"),
        ("POST", "/uploads", Some(TOKEN), Some(r#"{"table": "payments.refunds"}"#.into()), StatusCode::FORBIDDEN,
            "may not upload table 'payments.refunds': its tables are payments.transactions, payments.missing"),
        ("POST", "/uploads", Some(TOKEN), Some(r#"{"table": "payments.missing"}"#.into()), StatusCode::NOT_FOUND,
            "table 'payments.missing' does not exist"),
        ("POST", "/uploads", Some(TOKEN), Some("{not json".into()), StatusCode::BAD_REQUEST, "the request body is not valid"),
        ("POST", "/uploads", Some(TOKEN), Some(r#"{"table": "payments.transactions", "tll": "1h"}"#.into()),
            StatusCode::UNPROCESSABLE_ENTITY, "unknown field `tll`"),
        ("POST", "/uploads", Some(TOKEN), Some(r#"{"table": "x; DROP TABLE y"}"#.into()), StatusCode::BAD_REQUEST,
            "is not a table name"),
        ("POST", "/uploads", Some(TOKEN), Some(r#"{"table": "payments.transactions", "ttl": "soon"}"#.into()),
            StatusCode::BAD_REQUEST, "'soon' is not a duration"),
        ("POST", "/uploads", Some(TOKEN), Some(format!(r#"{{"table": "{}"}}"#, "x".repeat(600))), StatusCode::PAYLOAD_TOO_LARGE,
            "the request body is not valid"),
        ("GET", "/uploads/not-an-id", Some(TOKEN), None, StatusCode::BAD_REQUEST, "is not an upload id"),
        ("GET", "/uploads/0123456789abcdef0123456789abcdef", Some(TOKEN), None, StatusCode::NOT_FOUND, "does not exist"),
        ("POST", "/downloads", Some(TOKEN), Some(r#"{"table": "payments.transactions", "columns": ["nope"]}"#.into()),
            StatusCode::BAD_REQUEST, "column 'nope' is not in table 'payments.transactions': its columns are transaction_id"),
        ("POST", "/downloads", Some(TOKEN),
            Some(r#"{"table": "payments.transactions", "filter": [{"column": "amount_cents", "op": "eq", "value": "ten"}]}"#.into()),
            StatusCode::BAD_REQUEST, "filter on 'amount_cents' (Int64) needs an integer, got \"ten\""),
        ("POST", "/downloads", Some(TOKEN),
            Some(r#"{"table": "payments.transactions", "filter": [{"column": "currency", "op": "like", "value": "u%"}]}"#.into()),
            StatusCode::BAD_REQUEST, "'like' is not a filter operator"),
        ("POST", "/downloads", Some(TOKEN),
            Some(r#"{"table": "payments.transactions", "filter": [{"column": "created_at", "op": "gt", "value": "yesterday"}]}"#.into()),
            StatusCode::BAD_REQUEST, "needs a timestamp like"),
        ("GET", "/nowhere", Some(TOKEN), None, StatusCode::NOT_FOUND, "no such endpoint"),
    ];
    for (method, path, token, body, status, message) in cases {
        let (got, error) = call(&app, method, path, token, body.as_deref()).await;
        assert_eq!(got, status, "{method} {path}: {error}");
        let text = error["error"]["message"].as_str().unwrap_or_default();
        assert!(
            text.contains(message),
            "{method} {path}: '{text}' lacks '{message}'"
        );
        assert!(error["error"]["code"].is_string(), "{error}");
    }
    // Nothing reached the catalog: no upload was opened.
    let ctx = warehouse.session().await;
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM uploads()").await, "0");

    // The OpenAPI document names every endpoint.
    let (_, spec) = call(&app, "GET", "/openapi.json", None, None).await;
    for path in [
        "/uploads",
        "/uploads/{id}",
        "/uploads/{id}/credentials",
        "/uploads/{id}/complete",
        "/uploads/{id}/findings",
        "/downloads",
        "/downloads/{id}",
        "/downloads/{id}/credentials",
        "/healthz",
    ] {
        assert!(
            spec["paths"][path].is_object(),
            "{path} missing from /openapi.json"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_token_has_a_rate_limit() {
    let warehouse = Warehouse::new();
    let limited =
        config(&warehouse, "").replace("requests_per_minute = 10000", "requests_per_minute = 3");
    let app = app(&limited).await;
    for _ in 0..3 {
        let (status, _) =
            call_as_acme(&app, "GET", "/uploads/0123456789abcdef0123456789abcdef").await;
        assert_ne!(status, StatusCode::TOO_MANY_REQUESTS);
    }
    let (status, error) =
        call_as_acme(&app, "GET", "/uploads/0123456789abcdef0123456789abcdef").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("token 'acme' made more than 3 requests a minute")
    );
    // Another token has its own budget.
    let (status, _) = call(
        &app,
        "GET",
        "/uploads/0123456789abcdef0123456789abcdef",
        Some(OTHER),
        None,
    )
    .await;
    assert_ne!(status, StatusCode::TOO_MANY_REQUESTS);
}

/// A request slower than `request_timeout` is cut off with 504, and being
/// cut off half-way leaves nothing half-made: the retry with the same
/// idempotency key, given time to finish, opens exactly one upload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_its_deadline_gets_504_and_its_retry_opens_one_upload() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let create = r#"{"table": "payments.transactions", "idempotency_key": "nightly-2026-11-29"}"#;

    let hurried = app(&config(&warehouse, r#"request_timeout = "1ms""#)).await;
    let (status, error) = call(&hurried, "POST", "/uploads", Some(TOKEN), Some(create)).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{error}");
    assert_eq!(error["error"]["code"], "timeout", "{error}");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("longer than the service's request_timeout (1ms)")
            && message.contains("same idempotency_key"),
        "{message}"
    );

    let patient = app(&config(&warehouse, "")).await;
    let (status, upload) = call(&patient, "POST", "/uploads", Some(TOKEN), Some(create)).await;
    assert!(status.is_success(), "{status}: {upload}");
    let (_, again) = call(&patient, "POST", "/uploads", Some(TOKEN), Some(create)).await;
    let id = text(&upload, "upload_id");
    assert_eq!(text(&again, "upload_id"), id);
    let ctx = warehouse.session().await;
    assert_eq!(
        scalar(&ctx, "SELECT count(*) FROM uploads()").await,
        "1",
        "the cut-off create and its retries opened one upload"
    );
    let (status, got) = call_as_acme(&patient, "GET", &format!("/uploads/{id}")).await;
    assert_eq!(
        (status, text(&got, "state")),
        (StatusCode::OK, "open".to_string()),
        "{got}"
    );
}

/// An `icestage serve` process, killed when dropped. `ICESTAGE_SERVE_BIN`
/// runs another build of the binary (scripts/bench-service.sh: release).
struct Service {
    child: Child,
    url: String,
}

impl Service {
    fn start(config_path: &std::path::Path) -> Self {
        let binary =
            std::env::var_os("ICESTAGE_SERVE_BIN").unwrap_or(env!("CARGO_BIN_EXE_icestage").into());
        let mut child = Command::new(binary)
            .args(["serve", "--config", config_path.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = loop {
            let line = lines
                .next()
                .expect("the service prints where it listens")
                .unwrap();
            if let Some(url) = line.strip_prefix("icestage serve: listening on ") {
                break url.to_string();
            }
        };
        // Keep draining stderr so the service never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        Self { child, url }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// POSTs `body` with the test token; the JSON answer.
async fn post_json(http: &reqwest::Client, url: String, body: Value) -> Value {
    http.post(url)
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn write_config(warehouse: &Warehouse, extra: &str) -> std::path::PathBuf {
    let path = warehouse.path().join("service.toml");
    std::fs::write(&path, config(warehouse, extra)).unwrap();
    path
}

async fn wait_state(client: &reqwest::Client, url: &str, states: &[&str]) -> Value {
    poll(url, states, || async {
        client
            .get(url)
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    })
    .await
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

/// A webhook receiver that refuses the first `refuse` deliveries.
#[derive(Default)]
struct Received {
    attempts: usize,
    /// (signature header, body) of each acknowledged delivery.
    acknowledged: Vec<(String, String)>,
}

async fn receiver(refuse: usize) -> (String, Arc<Mutex<Received>>) {
    let received = Arc::new(Mutex::new(Received::default()));
    let state = Arc::clone(&received);
    let app = axum::Router::new().route(
        "/hooks",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: String| {
            let state = Arc::clone(&state);
            async move {
                let mut received = state.lock().unwrap();
                received.attempts += 1;
                if received.attempts <= refuse {
                    return StatusCode::SERVICE_UNAVAILABLE;
                }
                let signature = headers["icestage-signature"].to_str().unwrap().to_string();
                received.acknowledged.push((signature, body));
                StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hooks", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, received)
}

fn verify(secret: &str, header: &str, body: &str) -> bool {
    use hmac::{Hmac, Mac};
    let parts: BTreeMap<&str, &str> = header
        .split(',')
        .filter_map(|p| p.split_once('='))
        .collect();
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{}.{body}", parts["t"]).as_bytes());
    hex::encode(mac.finalize().into_bytes()) == parts["v1"]
}

async fn upload_and_complete(
    http: &reqwest::Client,
    service: &Service,
    warehouse: &Warehouse,
    key: &str,
) -> String {
    let created: Value = post_json(
        http,
        format!("{}/uploads", service.url),
        json!({"table": "payments.transactions", "idempotency_key": key}),
    )
    .await;
    let id = text(&created, "upload_id");
    let client = warehouse.session().await;
    run(
        &client,
        &format!(
            "INSERT INTO {} VALUES ('{key}', 'a', 1, 'usd', TIMESTAMP '2026-07-01 00:00:00Z')",
            text(&created, "staging_table")
        ),
    )
    .await
    .unwrap();
    http.post(format!("{}/uploads/{id}/complete", service.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    id
}

/// Waits until the service has recorded `count` acknowledged deliveries (a
/// process killed between a receiver's 2xx and this record sends the event
/// again: at least once, and receivers deduplicate by the event's `id`).
async fn wait_recorded(warehouse: &Warehouse, count: usize) {
    let ctx = warehouse.session().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let recorded = run(
            &ctx,
            "SELECT count(*) AS n FROM icestage.webhook_deliveries",
        )
        .await
        .map(|b| crate::common::value(&b, "n"));
        if recorded.is_ok_and(|n| n.parse::<usize>().unwrap() >= count) {
            return;
        }
        assert!(Instant::now() < deadline, "the delivery was never recorded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_acknowledged(received: &Arc<Mutex<Received>>, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while received.lock().unwrap().acknowledged.len() < count {
        assert!(
            Instant::now() < deadline,
            "webhook deliveries never arrived"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_are_signed_retried_and_not_repeated_after_a_restart() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let (url, received) = receiver(2).await;
    let secret = "whsec_test";
    let path = write_config(
        &warehouse,
        &format!(
            "[service.webhook]\nurl = \"{url}\"\nsecret = \"{secret}\"\ninterval = \"300ms\"\n"
        ),
    );
    let http = reqwest::Client::new();
    let first = {
        let service = Service::start(&path);
        let id = upload_and_complete(&http, &service, &warehouse, "first").await;
        wait_acknowledged(&received, 1).await;
        wait_recorded(&warehouse, 1).await;
        id
    }; // killed here, after the delivery was acknowledged and recorded
    {
        let (signature, body) = received.lock().unwrap().acknowledged[0].clone();
        assert!(
            verify(secret, &signature, &body),
            "bad signature {signature}"
        );
        let event: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(event["type"], "upload.promoted");
        assert_eq!(event["data"]["upload_id"], first.as_str());
        assert!(
            received.lock().unwrap().attempts >= 3,
            "the first deliveries were refused and retried"
        );
    }
    // A new process: the acknowledged event is not sent again; new ones are.
    let service = Service::start(&path);
    let second = upload_and_complete(&http, &service, &warehouse, "second").await;
    let download: Value = post_json(
        &http,
        format!("{}/downloads", service.url),
        json!({"table": "payments.transactions", "limit": 1}),
    )
    .await;
    wait_acknowledged(&received, 3).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut events: Vec<(String, String)> = received
        .lock()
        .unwrap()
        .acknowledged
        .iter()
        .map(|(_, body)| {
            let event: Value = serde_json::from_str(body).unwrap();
            let data = &event["data"];
            let id = data["upload_id"]
                .as_str()
                .or(data["download_id"].as_str())
                .unwrap();
            (text(&event, "type"), id.to_string())
        })
        .collect();
    events.sort();
    let mut expected = vec![
        ("download.ready".to_string(), text(&download, "download_id")),
        ("upload.promoted".to_string(), first),
        ("upload.promoted".to_string(), second),
    ];
    expected.sort();
    assert_eq!(events, expected, "each event acknowledged exactly once");
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
#[derive(Default)]
struct Latencies(Mutex<BTreeMap<&'static str, Vec<Duration>>>);

impl Latencies {
    async fn time<T>(
        &self,
        endpoint: &'static str,
        work: impl std::future::Future<Output = T>,
    ) -> T {
        let start = Instant::now();
        let out = work.await;
        self.0
            .lock()
            .unwrap()
            .entry(endpoint)
            .or_default()
            .push(start.elapsed());
        out
    }

    fn report(&self) -> String {
        let mut lines = vec![format!(
            "{:<32} {:>6} {:>9} {:>9} {:>9}",
            "endpoint", "calls", "p50 ms", "p99 ms", "max ms"
        )];
        for (endpoint, samples) in self.0.lock().unwrap().iter_mut() {
            samples.sort();
            let at = |q: f64| {
                samples[((samples.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1000.0
            };
            lines.push(format!(
                "{endpoint:<32} {:>6} {:>9.1} {:>9.1} {:>9.1}",
                samples.len(),
                at(0.5),
                at(0.99),
                at(1.0)
            ));
        }
        lines.join("\n")
    }
}

/// One client of the load test: create, credentials, write a small batch,
/// complete (twice, as a client that retries does), poll until promoted.
async fn load_session(
    http: reqwest::Client,
    api: String,
    writer: Arc<datafusion::prelude::SessionContext>,
    latencies: Arc<Latencies>,
    session: usize,
    rows: usize,
) {
    let send = |request: reqwest::RequestBuilder| async move {
        let response = request.bearer_auth(TOKEN).send().await.unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap();
        assert!(status.is_success(), "session {session}: {status} {body}");
        body
    };
    let created = latencies
        .time(
            "POST /uploads",
            send(http.post(format!("{api}/uploads")).json(&json!({
                "table": "payments.transactions",
                "idempotency_key": format!("load-{session}"),
            }))),
        )
        .await;
    let id = text(&created, "upload_id");
    latencies
        .time(
            "POST /uploads/{id}/credentials",
            send(http.post(format!("{api}/uploads/{id}/credentials"))),
        )
        .await;
    let values: Vec<String> = (0..rows)
        .map(|row| {
            format!(
                "('s{session}-r{row}', 'a{session}', {}, 'usd', TIMESTAMP '2026-07-01 00:00:00Z')",
                row + 1
            )
        })
        .collect();
    let insert = format!(
        "INSERT INTO {} VALUES {}",
        text(&created, "staging_table"),
        values.join(", ")
    );
    latencies
        .time("client append (not the API)", async {
            run(&writer, &insert).await.unwrap()
        })
        .await;
    for _ in 0..2 {
        latencies
            .time(
                "POST /uploads/{id}/complete",
                send(http.post(format!("{api}/uploads/{id}/complete"))),
            )
            .await;
    }
    let completed = Instant::now();
    let deadline = completed + Duration::from_secs(600);
    let mut pause = Duration::from_millis(200);
    loop {
        let status = latencies
            .time(
                "GET /uploads/{id}",
                send(http.get(format!("{api}/uploads/{id}"))),
            )
            .await;
        match text(&status, "state").as_str() {
            "promoted" => break,
            "open" | "promoting" => assert!(
                Instant::now() < deadline,
                "session {session} never promoted: {status}"
            ),
            _ => panic!("session {session}: {status}"),
        }
        // Back off as a polling client should: 200 ms, growing to 2 s.
        tokio::time::sleep(pause).await;
        pause = (pause * 3 / 2).min(Duration::from_secs(2));
    }
    latencies
        .0
        .lock()
        .unwrap()
        .entry("complete -> promoted seen")
        .or_default()
        .push(completed.elapsed());
}

/// The bounded load test: 200 upload sessions at once into one target
/// through the API on a real socket; every batch lands exactly once. Prints
/// throughput and per-endpoint latency (`--nocapture` shows them); nothing
/// here asserts a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_upload_sessions_land_exactly_once() {
    const SESSIONS: usize = 200;
    const ROWS: usize = 10;
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let path = warehouse.path().join("service.toml");
    let text_config = config(&warehouse, "").replace(
        "requests_per_minute = 10000",
        "requests_per_minute = 1000000",
    );
    std::fs::write(&path, text_config).unwrap();
    let service = Service::start(&path);
    let http = reqwest::Client::new();
    let writer = Arc::new(warehouse.session().await);
    let latencies = Arc::new(Latencies::default());
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for session in 0..SESSIONS {
        let (http, api, writer, latencies) = (
            http.clone(),
            service.url.clone(),
            Arc::clone(&writer),
            Arc::clone(&latencies),
        );
        clients.spawn(load_session(http, api, writer, latencies, session, ROWS));
    }
    while let Some(done) = clients.join_next().await {
        done.unwrap();
    }
    let elapsed = started.elapsed();

    let check = warehouse.session().await;
    let landed = "SELECT count(*) || ' rows, ' || count(DISTINCT transaction_id) || ' distinct, ' || \
                  count(DISTINCT account_id) || ' sessions' FROM payments.transactions";
    assert_eq!(
        scalar(&check, landed).await,
        format!(
            "{} rows, {} distinct, {SESSIONS} sessions",
            SESSIONS * ROWS,
            SESSIONS * ROWS
        )
    );
    let appends = "SELECT count(*) FROM payments.transactions$snapshots WHERE operation = 'append'";
    assert_eq!(
        scalar(&check, appends).await,
        SESSIONS.to_string(),
        "one append per upload"
    );
    println!(
        "{SESSIONS} upload sessions of {ROWS} rows, all at once: {:.1}s, {:.1} uploads/s\n{}",
        elapsed.as_secs_f64(),
        SESSIONS as f64 / elapsed.as_secs_f64(),
        latencies.report()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_are_bounded_and_answered_by_kind() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let app = app(&config(&warehouse, "")).await;
    let predicate = json!({"column": "amount_cents", "op": "gt", "value": 1});
    for count in [101, 2000] {
        let body =
            json!({"table": "payments.transactions", "filter": vec![predicate.clone(); count]});
        let (status, error) = call(
            &app,
            "POST",
            "/downloads",
            Some(TOKEN),
            Some(&body.to_string()),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .contains(&format!(
                    "filter holds {count} predicates, more than the limit of 100"
                )),
            "{error}"
        );
    }
    let twice = r#"{"table": "payments.transactions", "columns": ["currency", "currency"]}"#;
    let (status, error) = call(&app, "POST", "/downloads", Some(TOKEN), Some(twice)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert!(
        error
            .to_string()
            .contains("column 'currency' is named twice"),
        "{error}"
    );

    let (status, error) =
        call_as_acme(&app, "GET", "/downloads/0123456789abcdef0123456789abcdef").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{error}");
    assert_eq!(error["error"]["code"], "not_found");

    let (_, created) = call(
        &app,
        "POST",
        "/uploads",
        Some(TOKEN),
        Some(r#"{"table": "payments.transactions"}"#),
    )
    .await;
    let id = text(&created, "upload_id");
    for page in ["page=18446744073709551615", "page=0", "page_size=1001"] {
        let (status, error) =
            call_as_acme(&app, "GET", &format!("/uploads/{id}/findings?{page}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{page}: {error}");
        assert!(
            error.to_string().contains("is out of range"),
            "{page}: {error}"
        );
    }
    let (status, _) = call_as_acme(&app, "GET", &format!("/uploads/{id}/findings?page=2")).await;
    assert_eq!(status, StatusCode::OK);

    // Two tokens with one secret: refused at start-up, naming both.
    let twins = config(&warehouse, "").replace(OTHER, TOKEN);
    let error = AppState::new(ServiceConfig::from_toml_str(&twins).unwrap())
        .await
        .err()
        .expect("duplicate token secrets are refused")
        .to_string();
    assert!(
        error.contains("tokens 'acme' and 'other' have the same secret"),
        "{error}"
    );
}

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
