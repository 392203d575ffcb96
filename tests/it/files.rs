//! Files referenced from rows (`FILE` columns): a client puts files under
//! the upload's `files_location` and rows naming them; promotion verifies
//! each file, copies it into the target's storage and rewrites the rows'
//! URIs, exactly once; a tampered, resized, missing, outside or linked file
//! fails the upload with a finding naming the row and the file.

use std::path::PathBuf;

use sha2::{Digest, Sha256};

use crate::common::{Warehouse, refusal, run, scalar, setup, value};

/// A PNG's signature followed by `len - 8` bytes derived from `seed`.
fn png(seed: u64, len: usize) -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    while bytes.len() < len {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        bytes.push((state >> 33) as u8);
    }
    bytes
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The local folder a `files_location` names.
fn folder(location: &str) -> PathBuf {
    PathBuf::from(location.strip_prefix("file://").unwrap_or(location))
}

/// `named_struct(...)` for a reference to `uri`.
fn reference(uri: &str, size: usize, sha256: &str, content_type: &str) -> String {
    format!(
        "named_struct('uri', '{uri}', 'size', CAST({size} AS BIGINT), 'sha256', '{sha256}', \
         'content_type', '{content_type}')"
    )
}

/// An upload for `s.photos`: its id, staging table and files location.
async fn photos_upload(ctx: &datafusion::prelude::SessionContext) -> (String, String, String) {
    setup(
        ctx,
        &[
            "CREATE SCHEMA IF NOT EXISTS s",
            "CREATE TABLE IF NOT EXISTS s.photos (id BIGINT NOT NULL, photo FILE NOT NULL, \
             thumbnail FILE, caption VARCHAR)",
            "ALTER TABLE s.photos ADD CONSTRAINT one_photo_per_id UNIQUE (id)",
            "ALTER TABLE s.photos ADD CONSTRAINT images CHECK (photo.content_type LIKE 'image/%')",
        ],
    )
    .await;
    let opened = run(ctx, "CREATE UPLOAD FOR s.photos").await.unwrap();
    (
        value(&opened, "upload_id"),
        value(&opened, "staging_table"),
        value(&opened, "files_location"),
    )
}

/// Writes `count` PNGs (sizes growing from 1 KB) under `location`, in a
/// subfolder, and inserts one row per file; the files' bytes by name.
async fn stage_photos(
    ctx: &datafusion::prelude::SessionContext,
    staging: &str,
    location: &str,
    count: usize,
) -> Vec<(String, Vec<u8>)> {
    let dir = folder(location).join("shoot");
    std::fs::create_dir_all(&dir).unwrap();
    let mut written = vec![];
    let mut rows = vec![];
    for n in 0..count {
        let bytes = png(n as u64, 1024 + n * 4099);
        let name = format!("shoot/{n}.png");
        std::fs::write(folder(location).join(&name), &bytes).unwrap();
        let uri = format!("{location}/{name}");
        rows.push(format!(
            "({n}, {}, NULL, 'photo {n}')",
            reference(&uri, bytes.len(), &sha256(&bytes), "image/png")
        ));
        written.push((name, bytes));
    }
    run(
        ctx,
        &format!("INSERT INTO {staging} VALUES {}", rows.join(", ")),
    )
    .await
    .unwrap();
    written
}

/// The promoted rows' `(id, uri, size, sha256)`.
async fn promoted(ctx: &datafusion::prelude::SessionContext) -> Vec<(i64, String, i64, String)> {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::Int64Type;
    let batches = run(
        ctx,
        "SELECT id, CAST(photo.uri AS VARCHAR) AS uri, photo.size AS size, \
         CAST(photo.sha256 AS VARCHAR) AS sha FROM s.photos ORDER BY id",
    )
    .await
    .unwrap();
    let utf8 = |array: &datafusion::arrow::array::ArrayRef| {
        datafusion::arrow::compute::cast(array, &datafusion::arrow::datatypes::DataType::Utf8)
            .unwrap()
    };
    let mut rows = vec![];
    for batch in &batches {
        let (uris, shas) = (utf8(batch.column(1)), utf8(batch.column(3)));
        for row in 0..batch.num_rows() {
            rows.push((
                batch.column(0).as_primitive::<Int64Type>().value(row),
                uris.as_string::<i32>().value(row).to_string(),
                batch.column(2).as_primitive::<Int64Type>().value(row),
                shas.as_string::<i32>().value(row).to_string(),
            ));
        }
    }
    rows
}

fn target_files(warehouse: &Warehouse) -> Vec<PathBuf> {
    let root = warehouse.path().join("s").join("photos").join("files");
    if !root.exists() {
        return vec![];
    }
    crate::common::files_under(&root)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_land_with_their_rows_verified_and_renamed_exactly_once() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let (id, staging, location) = photos_upload(&ctx).await;
    assert!(
        location.ends_with(&format!("staging/upload_{id}/files")),
        "{location}"
    );
    let written = stage_photos(&ctx, &staging, &location, 6).await;
    // A file no row references is not promoted.
    std::fs::write(folder(&location).join("stray.bin"), b"nobody's").unwrap();

    let promotion = run(&ctx, &format!("PROMOTE UPLOAD '{id}'")).await.unwrap();
    assert_eq!(value(&promotion, "state"), "promoted");
    assert_eq!(value(&promotion, "path"), "rewrite");
    assert_eq!(value(&promotion, "rows"), "6");

    let rows = promoted(&ctx).await;
    assert_eq!(rows.len(), 6);
    for (id_, uri, size, sha) in &rows {
        let (name, bytes) = &written[*id_ as usize];
        assert!(
            uri.ends_with(&format!("/s/photos/files/{id}/{name}")),
            "{uri} should name the copy in the target's files folder"
        );
        let landed = std::fs::read(folder(uri)).unwrap();
        assert_eq!(&landed, bytes, "{uri}");
        assert_eq!(
            (*size as usize, sha.as_str()),
            (bytes.len(), sha256(bytes).as_str())
        );
    }
    // Nothing but the referenced files was copied, and the staging folder
    // (with the stray file) went with the staging table.
    assert_eq!(target_files(&warehouse).len(), 6);
    assert!(!folder(&location).exists(), "{location} should be gone");
    // The NULL references stay NULL.
    assert_eq!(
        scalar(
            &ctx,
            "SELECT count(*) FROM s.photos WHERE thumbnail IS NULL"
        )
        .await,
        "6"
    );

    // Again: nothing is copied twice or changed.
    let again = run(&ctx, &format!("PROMOTE UPLOAD '{id}'")).await.unwrap();
    assert!(value(&again, "message").contains("already promoted"));
    assert_eq!(promoted(&ctx).await, rows);
    assert_eq!(target_files(&warehouse).len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_missing_outside_or_linked_file_fails_the_upload_and_names_it() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let (id, staging, location) = photos_upload(&ctx).await;
    let dir = folder(&location);
    std::fs::create_dir_all(&dir).unwrap();
    let good = png(1, 5000);
    std::fs::write(dir.join("good.png"), &good).unwrap();
    // Changed after its row was written: same size, other bytes.
    let mut tampered = png(2, 5000);
    std::fs::write(dir.join("tampered.png"), &tampered).unwrap();
    let tampered_sha = sha256(&tampered);
    tampered[100] ^= 0xff;
    std::fs::write(dir.join("tampered.png"), &tampered).unwrap();
    let resized = png(3, 5000);
    std::fs::write(dir.join("resized.png"), &resized[..4000]).unwrap();
    // Outside the folder, by name and through a link.
    let outside = warehouse.path().join("secret.png");
    let secret = png(4, 3000);
    std::fs::write(&outside, &secret).unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("link.png")).unwrap();
    // Bytes of a PNG called a JPEG.
    let mislabelled = png(5, 2000);
    std::fs::write(dir.join("label.png"), &mislabelled).unwrap();

    let file = |name: &str| format!("{location}/{name}");
    let rows = [
        (
            1,
            reference(&file("good.png"), good.len(), &sha256(&good), "image/png"),
        ),
        (
            2,
            reference(&file("tampered.png"), 5000, &tampered_sha, "image/png"),
        ),
        (
            3,
            reference(&file("resized.png"), 5000, &sha256(&resized), "image/png"),
        ),
        (
            4,
            reference(&file("missing.png"), 10, &sha256(b"x"), "image/png"),
        ),
        (
            5,
            reference(
                &outside.display().to_string(),
                secret.len(),
                &sha256(&secret),
                "image/png",
            ),
        ),
        (
            6,
            reference(
                &file("../../../secret.png"),
                secret.len(),
                &sha256(&secret),
                "image/png",
            ),
        ),
        (
            7,
            reference(
                &file("link.png"),
                secret.len(),
                &sha256(&secret),
                "image/png",
            ),
        ),
        (
            8,
            reference(
                &file("label.png"),
                mislabelled.len(),
                &sha256(&mislabelled),
                "image/jpeg",
            ),
        ),
        // A text file, well described, that the target's CHECK refuses.
        (
            9,
            reference(&file("note.txt"), 5, &sha256(b"hello"), "text/plain"),
        ),
    ];
    std::fs::write(dir.join("note.txt"), b"hello").unwrap();
    let values: Vec<String> = rows
        .iter()
        .map(|(n, r)| format!("({n}, {r}, NULL, 'row {n}')"))
        .collect();
    setup(
        &ctx,
        &[&format!(
            "INSERT INTO {staging} VALUES {}",
            values.join(", ")
        )],
    )
    .await;

    let error = refusal(&ctx, &format!("PROMOTE UPLOAD '{id}'")).await;
    assert!(error.contains("7 file reference(s) fail"), "{error}");
    assert!(error.contains("rule 'images'"), "{error}");
    assert!(error.contains("fails for 1 row(s)"), "{error}");
    // One finding per bad row, naming the row by its key and the file.
    let findings = run(
        &ctx,
        &format!(
            "SELECT row, message FROM upload_findings('{id}') WHERE rule = 'file_reference' \
             ORDER BY row"
        ),
    )
    .await
    .unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&findings)
        .unwrap()
        .to_string();
    for (row, expected) in [
        ("id=2", "tampered.png' hashes to SHA-256"),
        ("id=3", "resized.png' holds 4000 bytes; the row says 5000"),
        ("id=4", "missing.png' does not exist"),
        ("id=5", "is outside the upload's files folder"),
        ("id=6", "is not a file under the upload's files folder"),
        ("id=7", "link.png' is reached through a symbolic link"),
        (
            "id=8",
            "label.png' holds image/png bytes; the row says content_type 'image/jpeg'",
        ),
    ] {
        assert!(
            text.lines()
                .any(|l| l.contains(row) && l.contains(expected)),
            "no finding for {row} ({expected}) in\n{text}"
        );
    }
    assert!(!text.contains("id=1 "), "{text}");
    // The target is unchanged and holds no copy of anything.
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM s.photos").await, "0");
    assert!(
        target_files(&warehouse).is_empty(),
        "{:?}",
        target_files(&warehouse)
    );
    assert_eq!(std::fs::read(&outside).unwrap(), secret);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_killed_mid_copy_lands_every_row_once_with_every_file() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let (id, staging, location) = photos_upload(&ctx).await;
    let written = stage_photos(&ctx, &staging, &location, 12).await;
    crate::exactly_once::kill_sql_at(
        &warehouse,
        &format!("SET icestage.promotion_lease = '2s'; PROMOTE UPLOAD '{id}'"),
        "promote.file-copied",
    );
    // Some copies were made, nothing was committed.
    assert!(!target_files(&warehouse).is_empty());
    assert_eq!(scalar(&ctx, "SELECT count(*) FROM s.photos").await, "0");

    let promotion = run(&ctx, &format!("PROMOTE UPLOAD '{id}'")).await.unwrap();
    assert_eq!(value(&promotion, "state"), "promoted");
    let rows = promoted(&ctx).await;
    assert_eq!(
        rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        (0..12).collect::<Vec<_>>()
    );
    for (n, uri, _, _) in &rows {
        assert_eq!(
            std::fs::read(folder(uri)).unwrap(),
            written[*n as usize].1,
            "{uri}"
        );
    }
    assert_eq!(target_files(&warehouse).len(), 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_column_is_a_plain_struct_recorded_with_the_table() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    setup(
        &ctx,
        &[
            "CREATE SCHEMA s",
            "CREATE TABLE s.docs (id BIGINT NOT NULL, doc FILE NOT NULL)",
        ],
    )
    .await;
    // Recorded in the table's metadata, as any Iceberg client reads it.
    let metadata = crate::common::files_under(&warehouse.path().join("s").join("docs"))
        .into_iter()
        .find(|p| p.to_string_lossy().ends_with(".metadata.json"))
        .expect("a metadata file");
    let metadata: serde_json::Value =
        serde_json::from_slice(&std::fs::read(metadata).unwrap()).unwrap();
    assert_eq!(metadata["properties"]["icestage.file-columns"], "doc");
    let columns = run(&ctx, "DESCRIBE s.docs").await.unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&columns)
        .unwrap()
        .to_string();
    assert!(text.contains("uri") && text.contains("sha256"), "{text}");
    // A declared file column that is not a file reference is refused.
    let error = refusal(
        &ctx,
        "CREATE TABLE s.bad (id BIGINT, doc VARCHAR) \
         TBLPROPERTIES ('icestage.file-columns' = 'doc')",
    )
    .await;
    assert!(error.contains("file column 'doc'"), "{error}");
    assert!(error.contains("declare it as doc FILE"), "{error}");
}

/// The state and message of download `id`.
async fn download_outcome(ctx: &datafusion::prelude::SessionContext, id: &str) -> String {
    scalar(
        ctx,
        &format!("SELECT state || ': ' || coalesce(message, '') FROM download_status('{id}')"),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_with_include_files_hands_out_verified_copies_of_its_rows_files() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    let (upload, staging, location) = photos_upload(&ctx).await;
    let written = stage_photos(&ctx, &staging, &location, 5).await;
    run(&ctx, &format!("PROMOTE UPLOAD '{upload}'"))
        .await
        .unwrap();
    // Two rows naming one file are one copy.
    run(
        &ctx,
        "INSERT INTO s.photos SELECT 100, photo, NULL, 'again' FROM s.photos WHERE id = 1",
    )
    .await
    .unwrap();

    let opened = run(
        &ctx,
        "CREATE DOWNLOAD WITH (wait = true, include_files = true) AS \
         SELECT id, photo, thumbnail FROM s.photos WHERE id IN (0, 1, 2, 100)",
    )
    .await
    .unwrap();
    let id = value(&opened, "download_id");
    assert_eq!(download_outcome(&ctx, &id).await, "ready: ");
    let table = value(&opened, "download_table");
    let folder_of_download = warehouse
        .path()
        .join("downloads")
        .join(format!("download_{id}"))
        .join("files");
    let batches = run(
        &ctx,
        &format!(
            "SELECT id, CAST(photo.uri AS VARCHAR), CAST(photo.sha256 AS VARCHAR) FROM {table} \
             ORDER BY id"
        ),
    )
    .await
    .unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)
        .unwrap()
        .to_string();
    for n in [0usize, 1, 2] {
        let bytes = &written[n].1;
        let copy = folder_of_download.join(sha256(bytes));
        assert!(text.contains(&copy.display().to_string()), "{text}");
        assert_eq!(&std::fs::read(&copy).unwrap(), bytes);
    }
    assert_eq!(crate::common::files_under(&folder_of_download).len(), 3);
    // The download's rows say which columns hold files, as the source's do.
    assert_eq!(
        scalar(
            &ctx,
            &format!("SELECT count(*) FROM {table} WHERE thumbnail IS NULL")
        )
        .await,
        "4"
    );

    // A promoted file changed since it was verified is not handed out.
    let promoted_rows = promoted(&ctx).await;
    let (_, uri, _, _) = promoted_rows.iter().find(|r| r.0 == 3).unwrap();
    let mut bytes = std::fs::read(folder(uri)).unwrap();
    bytes[20] ^= 0xff;
    std::fs::write(folder(uri), &bytes).unwrap();
    let opened = run(
        &ctx,
        "CREATE DOWNLOAD WITH (wait = true, include_files = true) AS \
         SELECT id, photo FROM s.photos WHERE id = 3",
    )
    .await
    .unwrap();
    let outcome = download_outcome(&ctx, &value(&opened, "download_id")).await;
    assert!(outcome.starts_with("failed: "), "{outcome}");
    assert!(outcome.contains("hashes to SHA-256"), "{outcome}");
    assert!(outcome.contains(uri.as_str()), "{outcome}");

    // A reference the query makes up, to a file outside any table's files,
    // copies nothing.
    let secret = warehouse.path().join("secret.png");
    let secret_bytes = png(9, 3000);
    std::fs::write(&secret, &secret_bytes).unwrap();
    let forged = reference(
        &secret.display().to_string(),
        secret_bytes.len(),
        &sha256(&secret_bytes),
        "image/png",
    );
    let opened = run(
        &ctx,
        &format!(
            "CREATE DOWNLOAD WITH (wait = true, include_files = true) AS \
             SELECT id, {forged} AS photo FROM s.photos WHERE id = 0"
        ),
    )
    .await
    .unwrap();
    let forged_id = value(&opened, "download_id");
    let outcome = download_outcome(&ctx, &forged_id).await;
    assert!(
        outcome.contains("is not in the files/ folder of a table the download reads"),
        "{outcome}"
    );
    let forged_folder = warehouse
        .path()
        .join("downloads")
        .join(format!("download_{forged_id}"))
        .join("files");
    assert!(!forged_folder.exists(), "{forged_folder:?}");

    // Without a file column, include_files is refused and says why.
    let error = refusal(
        &ctx,
        "CREATE DOWNLOAD WITH (include_files = true) AS SELECT id FROM s.photos",
    )
    .await;
    assert!(error.contains("select a FILE column"), "{error}");

    // Dropping the download removes its copies.
    run(&ctx, &format!("DROP DOWNLOAD '{id}'")).await.unwrap();
    assert!(!folder_of_download.exists(), "{folder_of_download:?}");
}
