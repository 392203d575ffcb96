//! The trust boundary tried as an attacker holding a session token and an
//! Iceberg client: what its commits name is read only under its table's
//! location and only within bounds, and a stranger's requests can never
//! spend a caller's request rate.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;

use super::{TOKEN, app, config, target, text};
use crate::common::Warehouse;

/// One request from `from`, as a server started with connection info sees
/// it.
async fn call_from(
    app: &axum::Router,
    from: &str,
    method: &str,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {token}"));
    if body.is_some() {
        request = request.header("content-type", "application/json");
    }
    let mut request = request
        .body(Body::from(body.map(|b| b.to_string()).unwrap_or_default()))
        .unwrap();
    let address: SocketAddr = format!("{from}:40000").parse().unwrap();
    request.extensions_mut().insert(ConnectInfo(address));
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// An upload opened by `acme`: its id, staging table name and token.
async fn open(app: &axum::Router) -> (String, String, String) {
    let (status, upload) = call_from(
        app,
        "10.0.0.1",
        "POST",
        "/uploads",
        TOKEN,
        Some(json!({"table": "payments.transactions"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{upload}");
    (
        text(&upload, "upload_id"),
        text(&upload, "staging_table"),
        upload["connection"]["token"].as_str().unwrap().to_string(),
    )
}

/// A file the fuzz harness keeps (`fuzz/regressions/manifest-list/`).
fn regression(name: &str) -> Vec<u8> {
    std::fs::read(
        crate::common::repo()
            .join("fuzz/regressions/manifest-list")
            .join(name),
    )
    .unwrap()
}

/// A commit that appends a snapshot whose manifest list is `list`.
fn append(list: &str) -> Value {
    json!({"requirements": [], "updates": [
        {"action": "add-snapshot", "snapshot": {
            "snapshot-id": 4242, "sequence-number": 1, "timestamp-ms": 1_780_000_000_000i64,
            "manifest-list": list, "summary": {"operation": "append"}, "schema-id": 0}},
        {"action": "set-snapshot-ref", "ref-name": "main", "snapshot-id": 4242, "type": "branch"}]})
}

/// The manifest lists and manifests a session's commit names are client
/// bytes: a decompression bomb is stopped at the bound, a malformed block
/// is an error answer (not a dead request), and a manifest outside the
/// table's location is refused before it is opened, alike whether it
/// exists or not (no oracle over the service's files).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_commit_is_read_confined_and_bounded() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let app = app(&config(&warehouse, "")).await;
    let (_, staging, token) = open(&app).await;
    let (namespace, table) = staging.split_once('.').unwrap();
    let path = format!("/iceberg/v1/namespaces/{namespace}/tables/{table}");
    let location = warehouse
        .path()
        .canonicalize()
        .unwrap()
        .join(namespace)
        .join(table)
        .join("metadata");
    std::fs::create_dir_all(&location).unwrap();
    let commit = |list: String| {
        let (app, path, token) = (app.clone(), path.clone(), token.clone());
        async move { call_from(&app, "10.0.0.2", "POST", &path, &token, Some(append(&list))).await }
    };

    // 300 MiB of zeros in a few kB of zstd: stopped at the 256 MiB bound.
    let file = location.join("bomb.avro");
    std::fs::write(&file, regression("zstd-block-inflating-to-300-mib.bin")).unwrap();
    let (status, answer) = commit(format!("file://{}", file.display())).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("decompress to more than 256 MiB (limits.metadata_inflated_bytes)"),
        "{answer}"
    );

    // A snappy block too short to hold its checksum: an answer, not a panic.
    let file = location.join("short.avro");
    std::fs::write(
        &file,
        regression("snappy-block-shorter-than-its-checksum.bin"),
    )
    .unwrap();
    let (status, answer) = commit(format!("file://{}", file.display())).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("cannot be read"),
        "{answer}"
    );

    // A manifest list outside the location is refused by name.
    let outside = warehouse.path().join("catalog.db");
    let (status, answer) = commit(format!("file://{}", outside.display())).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");

    // A manifest list inside naming manifests outside: the catalog
    // database (exists) and a path that does not: the same answer.
    let mut answers = vec![];
    for named in [
        outside.display().to_string(),
        warehouse
            .path()
            .join("nothing-here.avro")
            .display()
            .to_string(),
    ] {
        let list = location.join(format!("list-{}.avro", answers.len()));
        write_list(&warehouse, &staging, &list, &format!("file://{named}")).await;
        let (status, answer) = commit(format!("file://{}", list.display())).await;
        let message = answer["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .replace(&named, "<path>");
        assert!(
            message.contains("is outside the table's location"),
            "{status}: {answer}"
        );
        answers.push((status, message));
    }
    assert_eq!(
        answers[0], answers[1],
        "the answer tells whether a file exists"
    );
    assert_eq!(answers[0].0, StatusCode::BAD_REQUEST);
}

/// Writes at `list` a manifest list (v2) naming one manifest at `manifest`,
/// with the staging table's own file access.
async fn write_list(warehouse: &Warehouse, staging: &str, list: &std::path::Path, manifest: &str) {
    use iceberg::TableIdent;
    use iceberg::spec::{ManifestContentType, ManifestFile, ManifestListWriter};
    let catalog = icestage::IcebergCatalog::open(&warehouse.config().catalogs[0])
        .await
        .unwrap();
    let ident = TableIdent::from_strs(staging.split('.')).unwrap();
    let table = catalog.catalog().load_table(&ident).await.unwrap();
    let output = table
        .file_io()
        .new_output(format!("file://{}", list.display()))
        .unwrap();
    let mut writer = ManifestListWriter::v2(output.writer().await.unwrap(), 4242, None, 1);
    writer
        .add_manifests(std::iter::once(ManifestFile {
            manifest_path: manifest.to_string(),
            manifest_length: 100,
            partition_spec_id: 0,
            content: ManifestContentType::Data,
            sequence_number: 1,
            min_sequence_number: 1,
            added_snapshot_id: 4242,
            added_files_count: Some(1),
            existing_files_count: Some(0),
            deleted_files_count: Some(0),
            added_rows_count: Some(1),
            existing_rows_count: Some(0),
            deleted_rows_count: Some(0),
            partitions: None,
            key_metadata: None,
            first_row_id: None,
        }))
        .unwrap();
    writer.close().await.unwrap();
}

/// Wrong secrets for a victim's upload and made-up session ids are
/// charged to the sender's address: the victim keeps its whole rate, and so
/// does every API token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_cannot_spend_a_callers_rate() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let limited =
        config(&warehouse, "").replace("requests_per_minute = 10000", "requests_per_minute = 5");
    let app = app(&limited).await;
    let (id, _, token) = open(&app).await;
    let last = if token.ends_with('0') { "1" } else { "0" };
    let forged = format!("{}{last}", &token[..token.len() - 1]);
    // The attacker: 20 wrong secrets for the victim's upload, then made-up
    // ids, from one address; past its address's rate it gets 429.
    let mut statuses = vec![];
    for n in 0..20 {
        let presented = if n % 2 == 0 {
            forged.clone()
        } else {
            format!("u.{:032x}.{:064x}", n, n)
        };
        let (status, _) = call_from(
            &app,
            "10.9.9.9",
            "GET",
            "/iceberg/v1/config",
            &presented,
            None,
        )
        .await;
        statuses.push(status);
    }
    assert_eq!(statuses[0], StatusCode::UNAUTHORIZED);
    assert_eq!(statuses[19], StatusCode::TOO_MANY_REQUESTS, "{statuses:?}");
    // The victim, from its own address: its five requests all pass.
    for _ in 0..5 {
        let (status, body) =
            call_from(&app, "10.0.0.3", "GET", "/iceberg/v1/config", &token, None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    // The API token that opened the upload is not held up either.
    let (status, body) = call_from(
        &app,
        "10.9.9.9",
        "GET",
        &format!("/uploads/{id}"),
        TOKEN,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// Made-up session ids from more addresses than the service tracks fill
/// only the strangers' map (they once filled the map every caller's bucket
/// lives in): past it, a new stranger waits (429), while an API token that
/// has been idle all along is still served at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_made_up_sessions_never_locks_out_a_caller() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let app = app(&config(&warehouse, "")).await;
    let mut refused = 0;
    for n in 0..10_050u32 {
        let from = format!("10.{}.{}.{}", (n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff);
        let made_up = format!("u.{n:032x}.{n:064x}");
        let (status, _) = call_from(&app, &from, "GET", "/iceberg/v1/config", &made_up, None).await;
        match status {
            StatusCode::UNAUTHORIZED => {}
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("a stranger got {other}"),
        }
    }
    assert!(
        refused >= 50,
        "past the tracked addresses, strangers wait: {refused}"
    );
    // The idle token, from an address never seen: served.
    let (status, body) = call_from(
        &app,
        "192.0.2.1",
        "GET",
        "/uploads/0123456789abcdef0123456789abcdef",
        TOKEN,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
}
