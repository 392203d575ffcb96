//! Remote signing on the S3 emulator, which checks the signature and the
//! policy of every request once set up: the service holds the only key,
//! PyIceberg appends to a staging table and reads a download through the
//! REST catalog's signer, and the signer refuses what a session may not do.

use serde_json::{Value, json};

use super::{Service, TOKEN, complete_promoted, create_target, post_json, text, wait_state};
use crate::aws::Moto;
use crate::common::{Warehouse, python_script};

/// Asks the service at `api` to sign `method uri` for the session of
/// `token`: the status and the answer.
pub(super) async fn sign(
    http: &reqwest::Client,
    api: &str,
    token: &str,
    method: &str,
    uri: &str,
) -> (u16, Value) {
    let response = http
        .post(format!("{api}/iceberg/v1/aws/s3/sign"))
        .bearer_auth(token)
        .json(&json!({"method": method, "region": "us-east-1", "uri": uri, "headers": {}}))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Sends `method uri` to the store with the headers the signer answered
/// (`signed`) and `body`: the status and the answer's text.
async fn send_signed(
    http: &reqwest::Client,
    method: &str,
    uri: &str,
    signed: &Value,
    body: &'static str,
) -> (u16, String) {
    let mut request = http.request(method.parse().unwrap(), uri).body(body);
    for (name, values) in signed["headers"].as_object().unwrap() {
        for value in values.as_array().unwrap() {
            request = request.header(name, value.as_str().unwrap());
        }
    }
    let response = request.send().await.unwrap();
    (
        response.status().as_u16(),
        response.text().await.unwrap_or_default(),
    )
}

/// The token of a connection the service handed out.
fn token_of(connection: &Value) -> String {
    text(connection, "token")
}

/// A service on the S3 emulator, which from its start refuses any request
/// not signed with the service's own identity (or its policy's leave):
/// remote signing required, `tokens` its `[[service.tokens]]` (TOML), the
/// payments target created, then `statements` run on its catalog.
pub(super) struct SignedService {
    pub(super) service: Service,
    pub(super) moto: Moto,
    /// The service's identity (`access_key_id`, `secret_access_key`).
    pub(super) keys: Value,
    _warehouse: Warehouse,
}

pub(super) async fn signed_service(tokens: &str, statements: &[&str]) -> SignedService {
    let moto = Moto::start();
    let keys: Value = serde_json::from_str(&python_script(
        "aws_setup.py",
        &["signing-identity", &moto.endpoint, "lake"],
    ))
    .unwrap();
    let warehouse = Warehouse::new();
    let path = warehouse.path().join("service.toml");
    let identity = format!(
        "access_key_id = \"{}\"\nsecret_access_key = \"{}\"",
        text(&keys, "access_key_id"),
        text(&keys, "secret_access_key"),
    );
    let config = format!(
        r#"{catalog}
[service]
listen = "127.0.0.1:0"
requests_per_minute = 100000
require_remote_signing = true
metrics_token = "sk_metrics"
{tokens}"#,
        catalog = super::s3_catalog_toml(warehouse.path(), &moto.endpoint, &identity),
    );
    std::fs::write(&path, &config).unwrap();
    {
        let ctx = datafusion::prelude::SessionContext::new();
        let catalogs = icestage::service::ServiceConfig::from_toml_str(&config)
            .unwrap()
            .catalogs()
            .unwrap();
        icestage::register(&ctx, catalogs).await.unwrap();
        create_target(&ctx).await;
        crate::common::setup(&ctx, statements).await;
    }
    SignedService {
        service: Service::start(&path),
        moto,
        keys,
        _warehouse: warehouse,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_signing_reaches_storage_without_any_key() {
    let tokens = format!(
        r#"
[[service.tokens]]
name = "acme"
token = "{TOKEN}"
tables = ["payments.transactions"]
operations = ["upload", "download"]
"#
    );
    let signed = signed_service(&tokens, &[]).await;
    let (moto, service) = (&signed.moto, &signed.service);
    let api = service.url.clone();
    let http = reqwest::Client::new();

    // An upload's connection asks for remote signing; no key is handed out.
    let created = post_json(
        &http,
        format!("{api}/uploads"),
        json!({"table": "payments.transactions"}),
    )
    .await;
    let id = text(&created, "upload_id");
    let staging = text(&created, "staging_table");
    let access = post_json(&http, format!("{api}/uploads/{id}/credentials"), json!({})).await;
    assert_eq!(access["remote_signing"], true, "{access}");
    assert!(access.get("access_key_id").is_none(), "{access}");
    let connection = &access["connection"];
    assert_eq!(
        connection["header.X-Iceberg-Access-Delegation"], "remote-signing",
        "{connection}"
    );
    let token = token_of(connection);

    // The table's configuration names the signer, and holds no key.
    let (namespace, table) = staging.split_once('.').unwrap();
    let loaded: Value = http
        .get(format!(
            "{api}/iceberg/v1/namespaces/{namespace}/tables/{table}"
        ))
        .bearer_auth(&token)
        .header("X-Iceberg-Access-Delegation", "remote-signing")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(loaded["config"]["s3.remote-signing-enabled"], "true");
    assert!(
        !loaded.to_string().contains("access-key-id"),
        "no key in {loaded}"
    );
    let location = text(&loaded["metadata"], "location");
    let object = |key: &str| {
        format!(
            "{}/{}/{key}",
            moto.endpoint,
            location.trim_start_matches("s3://")
        )
    };

    // PyIceberg appends through the signer: every request it sends the
    // emulator was signed by the service, and checked there.
    python_script(
        "pyiceberg_client.py",
        &["append", &connection.to_string(), &staging, "12"],
    );

    // A signed listing of its data files, sent to the store as signed.
    let (bucket, prefix) = location
        .trim_start_matches("s3://")
        .split_once('/')
        .unwrap();
    // Encoded as an SDK sends it (the emulator signs the query as sent).
    let listing = format!(
        "{}/{bucket}?list-type=2&prefix={}%2Fdata%2F",
        moto.endpoint,
        prefix.replace('/', "%2F")
    );
    let (status, signed) = sign(&http, &api, &token, "GET", &listing).await;
    assert_eq!(status, 200, "{signed}");
    let (status, listed) = send_signed(&http, "GET", &listing, &signed, "").await;
    assert_eq!(status, 200, "{listed}");
    let key = listed
        .split("<Key>")
        .nth(1)
        .and_then(|rest| rest.split("</Key>").next())
        .expect("a data file")
        .to_string();
    let existing = format!("{}/{bucket}/{key}", moto.endpoint);

    // A PUT over an existing object is signed only with If-None-Match: *,
    // and the store then refuses it; the object stays.
    let (status, signed) = sign(&http, &api, &token, "PUT", &existing).await;
    assert_eq!(status, 200, "{signed}");
    assert_eq!(signed["headers"]["if-none-match"], json!(["*"]));
    let (status, answer) = send_signed(&http, "PUT", &existing, &signed, "overwritten").await;
    assert_eq!(status, 412, "{answer}");
    // A new object under data/ is written with the same signature's kind.
    let fresh = object("data/fresh-object.parquet");
    let (_, signed) = sign(&http, &api, &token, "PUT", &fresh).await;
    let (status, answer) = send_signed(&http, "PUT", &fresh, &signed, "new").await;
    assert_eq!(status, 200, "the emulator accepts the signature: {answer}");

    // What is refused, each by name.
    let other = post_json(
        &http,
        format!("{api}/uploads"),
        json!({"table": "payments.transactions"}),
    )
    .await;
    let other_table = text(&other, "staging_table").replace('.', "/");
    for (method, uri, expected) in [
        ("DELETE", existing.clone(), "never deletes"),
        (
            "GET",
            format!("{}/lake/wh/payments/transactions/metadata/x", moto.endpoint),
            "outside this session's table",
        ),
        (
            "GET",
            format!("{}/lake/wh/{other_table}/metadata/x", moto.endpoint),
            "outside this session's table",
        ),
        (
            "PUT",
            object("metadata/00009-planted.metadata.json"),
            "only Avro manifests",
        ),
    ] {
        let (status, refused) = sign(&http, &api, &token, method, &uri).await;
        assert_eq!(status, 403, "{method} {uri}: {refused}");
        assert!(refused.to_string().contains(expected), "{refused}");
    }

    // Promoted: the rows PyIceberg wrote through the signer are the target's,
    // and the session's storage requests are no longer signed.
    complete_promoted(&http, &api, &id, 12).await;
    // The staged files reached the target's storage by the store's own
    // copy (one bucket): none of their bytes passed through the service.
    let metrics = http
        .get(format!("{api}/metrics"))
        .bearer_auth("sk_metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let copied = |how: &str| {
        metrics
            .lines()
            .find_map(|line| {
                line.strip_prefix(&format!(
                    "icestage_promotion_copied_bytes_total{{how=\"{how}\"}} "
                ))
            })
            .map(|n| n.parse::<f64>().unwrap())
    };
    assert!(copied("server_side").is_some_and(|n| n > 0.0), "{metrics}");
    assert_eq!(copied("streamed"), None, "{metrics}");
    let (status, refused) = sign(&http, &api, &token, "GET", &existing).await;
    assert_eq!(status, 403, "{refused}");
    assert!(
        refused.to_string().contains("no longer signed"),
        "{refused}"
    );

    // Aborted: refused at once, not when a key would have expired.
    let other_id = text(&other, "upload_id");
    let other_access = post_json(
        &http,
        format!("{api}/uploads/{other_id}/credentials"),
        json!({}),
    )
    .await;
    let other_token = token_of(&other_access["connection"]);
    let other_object = format!("{}/lake/wh/{other_table}/data/a.parquet", moto.endpoint);
    let (status, _) = sign(&http, &api, &other_token, "HEAD", &other_object).await;
    assert_eq!(status, 200);
    let aborted = http
        .delete(format!("{api}/uploads/{other_id}"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(aborted.status(), 200);
    let (status, refused) = sign(&http, &api, &other_token, "HEAD", &other_object).await;
    assert_eq!(status, 403, "{refused}");
    assert!(refused.to_string().contains("aborted"), "{refused}");

    // A download is read through the signer too.
    let download = post_json(
        &http,
        format!("{api}/downloads"),
        json!({"table": "payments.transactions"}),
    )
    .await;
    let download_id = text(&download, "download_id");
    let ready = wait_state(
        &http,
        &format!("{api}/downloads/{download_id}"),
        &["ready", "failed"],
    )
    .await;
    assert_eq!(text(&ready, "state"), "ready", "{ready}");
    let read = python_script(
        "pyiceberg_client.py",
        &[
            "read-table",
            &download["connection"].to_string(),
            &text(&download, "download_table"),
        ],
    );
    let read: Value = serde_json::from_str(&read).unwrap();
    assert_eq!(read["rows"], 12, "{read}");
}
