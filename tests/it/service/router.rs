//! The router in-process: the whole flow, typed filters, bad and hostile
//! requests, rate limits and deadlines.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upload_and_download_flow_through_the_router() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let app = app(&config(&warehouse, "")).await;

    let (status, health) = call(&app, "GET", "/healthz", None, None).await;
    assert_eq!((status, health), (StatusCode::OK, json!({"status": "ok"})));
    // Every answer below is checked against the document's schema for it.
    let (_, spec) = call(&app, "GET", "/openapi.json", None, None).await;

    let create = r#"{"table": "payments.transactions", "idempotency_key": "batch-7", "ttl": "2h"}"#;
    let (status, upload) = call(&app, "POST", "/uploads", Some(TOKEN), Some(create)).await;
    assert_eq!(status, StatusCode::CREATED, "{upload}");
    conforms(&spec, "Upload", &upload);
    let id = text(&upload, "upload_id");
    assert_eq!(upload["connection"]["type"], "rest");
    // A retried create (same idempotency key) is the same upload.
    let (_, again) = call(&app, "POST", "/uploads", Some(TOKEN), Some(create)).await;
    assert_eq!(text(&again, "upload_id"), id);

    let (status, credentials) =
        call_as_acme(&app, "POST", &format!("/uploads/{id}/credentials")).await;
    assert_eq!(status, StatusCode::OK, "{credentials}");
    assert_eq!(text(&credentials, "mode"), "write");
    conforms(&spec, "Credentials", &credentials);

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
    conforms(&spec, "Accepted", &accepted);
    let done = poll_until(&app, &format!("/uploads/{id}"), &["promoted", "failed"]).await;
    conforms(&spec, "UploadStatus", &done);
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
    conforms(&spec, "Findings", &page);
    let (status, aborted) = call_as_acme(&app, "DELETE", &format!("/uploads/{failing_id}")).await;
    assert_eq!(
        (status, text(&aborted, "state")),
        (StatusCode::OK, "aborted".to_string())
    );
    conforms(&spec, "UploadAborted", &aborted);

    // Downloads, with a structured filter.
    let request = r#"{"table": "payments.transactions", "columns": ["transaction_id", "amount_cents"],
        "filter": [{"column": "currency", "op": "in", "value": ["usd", "gbp"]}, {"column": "amount_cents", "op": "ge", "value": 50}]}"#;
    let (status, download) = call(&app, "POST", "/downloads", Some(TOKEN), Some(request)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{download}");
    conforms(&spec, "Download", &download);
    let download_id = text(&download, "download_id");
    let ready = poll_until(
        &app,
        &format!("/downloads/{download_id}"),
        &["ready", "failed"],
    )
    .await;
    conforms(&spec, "DownloadStatus", &ready);
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
    conforms(&spec, "Credentials", &read);
    let table = text(&download, "download_table");
    assert_eq!(
        scalar(&client, &format!("SELECT transaction_id FROM {table}")).await,
        "t1"
    );

    // Another token cannot see this token's sessions, not even that they
    // exist.
    let (status, _) = call(&app, "GET", &format!("/uploads/{id}"), Some(OTHER), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// Checks `body` against schema `name` of the OpenAPI document `spec`:
/// every required property there, nothing the schema does not name, each
/// value of the type declared (`null` only where it is nullable), at every
/// depth the schema describes.
fn conforms(spec: &Value, name: &str, body: &Value) {
    let schema = &spec["components"]["schemas"][name];
    assert!(schema.is_object(), "/openapi.json has no schema {name}");
    check_value(schema, body, name);
}

fn check_value(schema: &Value, value: &Value, at: &str) {
    if value.is_null() {
        assert!(
            schema["nullable"] == json!(true),
            "{at} is null but its schema is not nullable: {schema}"
        );
        return;
    }
    let kind = schema["type"].as_str().unwrap_or("any");
    let fits = match kind {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        _ => true,
    };
    assert!(
        fits,
        "{at} = {value} is not of the type its schema declares: {schema}"
    );
    if let (Some(properties), Some(object)) = (schema["properties"].as_object(), value.as_object())
    {
        for required in schema["required"].as_array().into_iter().flatten() {
            let required = required.as_str().unwrap();
            assert!(
                object.contains_key(required),
                "{at} lacks '{required}', which its schema requires: {value}"
            );
        }
        for (key, item) in object {
            let property = properties
                .get(key)
                .unwrap_or_else(|| panic!("{at}.{key} is not in its schema: {schema}"));
            check_value(property, item, &format!("{at}.{key}"));
        }
    }
    if let (Some(items), Some(array)) = (schema.get("items"), value.as_array()) {
        for (i, item) in array.iter().enumerate() {
            check_value(items, item, &format!("{at}[{i}]"));
        }
    }
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
        "/metrics",
        "/iceberg/v1/oauth/tokens",
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

/// The REST catalog answers its own protocol's errors: no token 401, a
/// forged one 401, another table 404, and a session past the request rate
/// 429 (a forged token is charged to its sender's address, not to the
/// session it names).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rest_catalog_refuses_by_its_protocol() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let limited =
        config(&warehouse, "").replace("requests_per_minute = 10000", "requests_per_minute = 4");
    let app = app(&limited).await;
    let (_, token) = open_upload(&app).await;
    let (status, error) = call(&app, "GET", "/iceberg/v1/config", None, None).await;
    assert_eq!(
        (status, error["error"]["type"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("NotAuthorizedException"))
    );
    // The same session id, another secret.
    let last = if token.ends_with('0') { "1" } else { "0" };
    let forged = format!("{}{last}", &token[..token.len() - 1]);
    let (status, _) = call(&app, "GET", "/iceberg/v1/config", Some(&forged), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, config) = call(&app, "GET", "/iceberg/v1/config", Some(&token), None).await;
    assert_eq!(status, StatusCode::OK, "{config}");
    assert!(
        config["endpoints"].as_array().unwrap().len() >= 8,
        "{config}"
    );
    let (status, missing) = call(
        &app,
        "GET",
        "/iceberg/v1/namespaces/payments/tables/transactions",
        Some(&token),
        None,
    )
    .await;
    assert_eq!(
        (status, missing["error"]["type"].as_str()),
        (StatusCode::NOT_FOUND, Some("NoSuchTableException")),
        "{missing}"
    );
    // The forged token did not count against the session: its fourth and
    // fifth requests pass, the sixth is over the rate.
    let (status, namespace) = call(
        &app,
        "GET",
        "/iceberg/v1/namespaces/payments/tables",
        Some(&token),
        None,
    )
    .await;
    assert_eq!(
        (status, namespace["error"]["type"].as_str()),
        (StatusCode::NOT_FOUND, Some("NoSuchNamespaceException")),
        "{namespace}"
    );
    let (status, config) = call(&app, "GET", "/iceberg/v1/config", Some(&token), None).await;
    assert_eq!(status, StatusCode::OK, "{config}");
    let (status, limited) = call(&app, "GET", "/iceberg/v1/config", Some(&token), None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{limited}");
    assert!(
        limited["error"]["message"]
            .as_str()
            .unwrap()
            .contains("more than 4 requests a minute"),
        "{limited}"
    );
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

/// A failed upload's staging table is read through the REST catalog (its
/// findings can be explained from its rows), and takes no more appends: the
/// commit is a conflict that says to open a new upload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_upload_s_table_is_read_only_through_the_rest_catalog() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let home = warehouse.session().await;
    run(
        &home,
        "ALTER TABLE payments.transactions ADD CONSTRAINT positive CHECK (amount_cents > 0)",
    )
    .await
    .unwrap();
    let app = app(&config(&warehouse, "")).await;
    let (upload, token) = open_upload(&app).await;
    let id = text(&upload, "upload_id");
    let staging = text(&upload, "staging_table");
    run(
        &home,
        &format!(
            "INSERT INTO {staging} VALUES ('t1', 'a1', -5, 'usd', TIMESTAMP '2026-07-01 00:00:00Z')"
        ),
    )
    .await
    .unwrap();
    let (status, _) = call(
        &app,
        "POST",
        &format!("/uploads/{id}/complete"),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let failed = poll_until(&app, &format!("/uploads/{id}"), &["failed", "promoted"]).await;
    assert_eq!(text(&failed, "state"), "failed", "{failed}");

    let table_path = format!(
        "/iceberg/v1/namespaces/{}/tables/{}",
        staging.split('.').next().unwrap(),
        staging.split('.').nth(1).unwrap()
    );
    let (status, loaded) = call(&app, "GET", &table_path, Some(&token), None).await;
    assert_eq!(status, StatusCode::OK, "{loaded}");
    let main = loaded["metadata"]["current-snapshot-id"].clone();
    // Any append: it is refused for the session's state before it is read.
    let append = json!({
        "requirements": [{"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": main}],
        "updates": [],
    });
    let (status, refused) = call(
        &app,
        "POST",
        &table_path,
        Some(&token),
        Some(&append.to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("is failed") && message.contains("open a new upload"),
        "{message}"
    );
}

/// Opens an upload into `payments.transactions` through `app`: its answer,
/// and the token of its REST catalog connection.
async fn open_upload(app: &axum::Router) -> (Value, String) {
    let (status, upload) = call(
        app,
        "POST",
        "/uploads",
        Some(TOKEN),
        Some(r#"{"table": "payments.transactions"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{upload}");
    let token = upload["connection"]["token"].as_str().unwrap().to_string();
    (upload, token)
}

/// `complete` takes the promotion's mode in its body: an upsert by a named
/// key lands through the background promotion; a bad mode, and a mode the
/// target cannot take, are answered at once with 400 and the upload stays
/// open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_takes_a_promotion_mode() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let app = app(&config(&warehouse, "")).await;
    let client = warehouse.session().await;
    let upload_with = |rows: &'static str| {
        let app = app.clone();
        let client = client.clone();
        async move {
            let (_, upload) = call(
                &app,
                "POST",
                "/uploads",
                Some(TOKEN),
                Some(r#"{"table": "payments.transactions"}"#),
            )
            .await;
            run(
                &client,
                &format!(
                    "INSERT INTO {} VALUES {rows}",
                    text(&upload, "staging_table")
                ),
            )
            .await
            .unwrap();
            text(&upload, "upload_id")
        }
    };
    let first = upload_with(
        "('t1', 'a1', 100, 'usd', TIMESTAMP '2026-07-01 00:00:00Z'), \
         ('t2', 'a2', 200, 'usd', TIMESTAMP '2026-07-01 00:00:00Z')",
    )
    .await;
    call_as_acme(&app, "POST", &format!("/uploads/{first}/complete")).await;
    poll_until(&app, &format!("/uploads/{first}"), &["promoted", "failed"]).await;

    let second = upload_with(
        "('t1', 'a1', 150, 'usd', TIMESTAMP '2026-07-01 00:00:00Z'), \
         ('t3', 'a3', 300, 'usd', TIMESTAMP '2026-07-01 00:00:00Z')",
    )
    .await;
    let complete = format!("/uploads/{second}/complete");
    for (body, expected) in [
        (
            r#"{"mode": "merge"}"#,
            "mode = 'merge' is not a promotion mode",
        ),
        (r#"{"mode": "replace_partitions"}"#, "has no partitions"),
        (r#"{"mode": "upsert"}"#, "has none: name it with key"),
        (
            r#"{"mode": "upsert", "colour": 1}"#,
            "unknown field `colour`",
        ),
        (
            r#"{"mode": "upsert", "key": ["nosuch"]}"#,
            "names column 'nosuch'",
        ),
    ] {
        let (status, refused) = call(&app, "POST", &complete, Some(TOKEN), Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {refused}");
        assert!(refused.to_string().contains(expected), "{body}: {refused}");
    }
    let (_, open) = call_as_acme(&app, "GET", &format!("/uploads/{second}")).await;
    assert_eq!(text(&open, "state"), "open", "{open}");

    let (status, accepted) = call(
        &app,
        "POST",
        &complete,
        Some(TOKEN),
        Some(r#"{"mode": "upsert", "key": ["transaction_id"]}"#),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let done = poll_until(&app, &format!("/uploads/{second}"), &["promoted", "failed"]).await;
    assert_eq!(text(&done, "state"), "promoted", "{done}");
    assert_eq!(
        scalar(
            &client,
            "SELECT string_agg(concat(transaction_id, ':', amount_cents), ' ' ORDER BY transaction_id) \
             FROM payments.transactions"
        )
        .await,
        "t1:150 t2:200 t3:300"
    );

    // An audit branch: promoted there in the background, published on
    // main by one call that answers the publication.
    let third = upload_with("('t4', 'a4', 400, 'usd', TIMESTAMP '2026-07-01 00:00:00Z')").await;
    let complete = format!("/uploads/{third}/complete");
    let (status, refused) = call(
        &app,
        "POST",
        &complete,
        Some(TOKEN),
        Some(r#"{"to_branch": "main"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    let (status, accepted) = call(
        &app,
        "POST",
        &complete,
        Some(TOKEN),
        Some(r#"{"to_branch": "audit"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let done = poll_until(&app, &format!("/uploads/{third}"), &["promoted", "failed"]).await;
    assert_eq!(text(&done, "state"), "promoted", "{done}");
    let total = "SELECT count(*) FROM payments.transactions";
    assert_eq!(scalar(&client, total).await, "3", "main is unchanged");
    let publish = format!("/uploads/{third}/publish");
    let (status, published) = call(&app, "POST", &publish, Some(TOKEN), None).await;
    assert_eq!(status, StatusCode::OK, "{published}");
    assert_eq!(text(&published, "state"), "published", "{published}");
    assert_eq!(text(&published, "how"), "fast_forward", "{published}");
    assert_eq!(scalar(&client, total).await, "4");
    let (_, status) = call_as_acme(&app, "GET", &format!("/uploads/{third}")).await;
    assert_eq!(text(&status, "state"), "published", "{status}");
}

/// Without `require_remote_signing`, a client that asks for remote signing
/// alone gets the signer's configuration and no storage credentials; one
/// that also accepts vended credentials gets those, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_asking_for_remote_signing_gets_the_signer() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let app = app(&config(&warehouse, "")).await;
    let (_, upload) = call(
        &app,
        "POST",
        "/uploads",
        Some(TOKEN),
        Some(r#"{"table": "payments.transactions"}"#),
    )
    .await;
    let token = text(&upload["connection"], "token");
    assert!(
        upload["connection"]
            .get("header.X-Iceberg-Access-Delegation")
            .is_none()
    );
    let table = text(&upload, "staging_table").replace("staging.", "");
    let load = |delegation: &'static str| {
        let app = app.clone();
        let token = token.clone();
        let table = table.clone();
        async move {
            let request = Request::builder()
                .uri(format!("/iceberg/v1/namespaces/staging/tables/{table}"))
                .header("authorization", format!("Bearer {token}"))
                .header("x-iceberg-access-delegation", delegation)
                .body(Body::empty())
                .unwrap();
            let response = app.oneshot(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 24)
                .await
                .unwrap();
            serde_json::from_slice::<Value>(&bytes).unwrap()
        }
    };
    let signed = load("remote-signing").await;
    assert_eq!(signed["config"]["s3.remote-signing-enabled"], "true");
    assert_eq!(signed["config"]["s3.signer.endpoint"], "v1/aws/s3/sign");
    assert!(signed.get("storage-credentials").is_none(), "{signed}");
    let vended = load("vended-credentials,remote-signing").await;
    assert!(vended["config"].get("s3.remote-signing-enabled").is_none());
    assert!(vended.get("storage-credentials").is_some(), "{vended}");
}
