//! Files referenced from rows, through the service on the S3 emulator that
//! checks every request's signature: PyIceberg puts images under the
//! upload's `files_location` and rows naming them with the session's access
//! alone (the REST catalog signs each request; no key is handed out), the
//! service verifies and promotes them, and PyIceberg then opens every
//! promoted row's file by its uri. A download with `include_files` hands
//! out verified copies in its own folder, which the download's access alone
//! opens.

use serde_json::{Value, json};

use super::{TOKEN, complete_promoted, post_json, text, wait_state};
use crate::common::python_script;

const LAKE_TOKEN: &str = "sk_test_lake";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyiceberg_uploads_images_with_their_rows_and_opens_them_once_promoted() {
    let tokens = format!(
        r#"
[[service.tokens]]
name = "acme"
token = "{TOKEN}"
tables = ["media.photos"]
operations = ["upload", "download"]
[[service.tokens]]
name = "lake"
token = "{LAKE_TOKEN}"
tables = ["media.*"]
operations = ["catalog"]
"#
    );
    let signed = super::signing::signed_service(
        &tokens,
        &[
            "CREATE SCHEMA media",
            "CREATE TABLE media.photos (id BIGINT NOT NULL, photo FILE NOT NULL, caption VARCHAR)",
        ],
    )
    .await;
    let (moto, service, keys) = (&signed.moto, &signed.service, &signed.keys);
    let api = service.url.clone();
    let http = reqwest::Client::new();

    let created = post_json(
        &http,
        format!("{api}/uploads"),
        json!({"table": "media.photos"}),
    )
    .await;
    let id = text(&created, "upload_id");
    let staging = text(&created, "staging_table");
    let files_location = text(&created, "files_location");
    assert!(
        files_location.starts_with("s3://lake/wh/staging/") && files_location.ends_with("/files"),
        "{created}"
    );

    let put = python_script(
        "pyiceberg_client.py",
        &[
            "put-files",
            &created["connection"].to_string(),
            &staging,
            &files_location,
            "20",
        ],
    );
    assert!(put.contains("\"files\": 20"), "{put}");
    complete_promoted(&http, &api, &id, 20).await;

    // A reader with the catalog's view (and storage keys of its own, as a
    // catalog token's holder brings) opens each row's file by its uri: the
    // promoted copy, under the target's own files folder.
    let lake = json!({
        "name": "lake",
        "type": "rest",
        "uri": format!("{api}/iceberg"),
        "token": LAKE_TOKEN,
        "s3.endpoint": moto.endpoint,
        "s3.region": "us-east-1",
        "s3.access-key-id": text(keys, "access_key_id"),
        "s3.secret-access-key": text(keys, "secret_access_key"),
    });
    let opened: Value = serde_json::from_str(&python_script(
        "pyiceberg_client.py",
        &["open-files", &lake.to_string(), "media.photos"],
    ))
    .unwrap();
    assert_eq!(opened["rows"], 20, "{opened}");
    let promoted = opened["opened"].as_array().unwrap().clone();
    for row in &promoted {
        assert_eq!(row["matches"], true, "{row}");
        let uri = text(row, "uri");
        assert!(
            uri.starts_with(&format!("s3://lake/wh/media/photos/files/{id}/camera/")),
            "{uri}"
        );
    }

    // A download of some rows with their files: the rows name copies in the
    // download's own folder, which its connection alone (signed reads of
    // its location) opens.
    let (download, uris) = download_and_open(
        &http,
        &api,
        json!({"table": "media.photos", "include_files": true,
               "filter": [{"column": "id", "op": "lt", "value": 5}]}),
        5,
    )
    .await;
    let copies = format!(
        "s3://lake/wh/downloads/download_{}/files/",
        text(&download, "download_id")
    );
    assert!(uris.iter().all(|uri| uri.starts_with(&copies)), "{uris:?}");

    // Without include_files the rows keep the table's own URIs, and the
    // download's connection reads exactly the files its rows name, each
    // read signed by the catalog; a promoted file its rows do not name is
    // refused.
    let (plain, uris) = download_and_open(
        &http,
        &api,
        json!({"table": "media.photos",
               "filter": [{"column": "id", "op": "lt", "value": 3}]}),
        3,
    )
    .await;
    let own = format!("s3://lake/wh/media/photos/files/{id}/");
    assert!(uris.iter().all(|uri| uri.starts_with(&own)), "{uris:?}");
    let token = text(&plain["connection"], "token");
    let unnamed = promoted
        .iter()
        .find(|row| row["id"] == 10)
        .map(|row| text(row, "uri"))
        .unwrap();
    let object = format!(
        "{}/{}",
        moto.endpoint,
        unnamed.strip_prefix("s3://").unwrap()
    );
    let (status, refused) = super::signing::sign(&http, &api, &token, "GET", &object).await;
    assert_eq!(status, 403, "{refused}");
    assert!(
        refused.to_string().contains("outside this session's table"),
        "{refused}"
    );
}

/// Creates the download `request` asks for, waits until it is ready and
/// has PyIceberg open every row's file with the download's connection
/// alone: the answer of `POST /downloads` and the rows' URIs, each file
/// checked against its row.
async fn download_and_open(
    http: &reqwest::Client,
    api: &str,
    request: Value,
    rows: usize,
) -> (Value, Vec<String>) {
    let download = post_json(http, format!("{api}/downloads"), request).await;
    let ready = wait_state(
        http,
        &format!("{api}/downloads/{}", text(&download, "download_id")),
        &["ready", "failed"],
    )
    .await;
    assert_eq!(text(&ready, "state"), "ready", "{ready}");
    let opened: Value = serde_json::from_str(&python_script(
        "pyiceberg_client.py",
        &[
            "open-files",
            &download["connection"].to_string(),
            &text(&download, "download_table"),
        ],
    ))
    .unwrap();
    assert_eq!(opened["rows"], rows, "{opened}");
    let mut uris = vec![];
    for row in opened["opened"].as_array().unwrap() {
        assert_eq!(row["matches"], true, "{row}");
        uris.push(text(row, "uri"));
    }
    (download, uris)
}
