//! `INSERT INTO` an Iceberg table goes through icestage's writer: files in
//! the table's Parquet codec (zstd unless the table names another), one
//! commit per statement.

use std::fs::File;
use std::path::{Path, PathBuf};

use parquet::file::reader::{FileReader, SerializedFileReader};

use crate::common::{Warehouse, run, scalar};

/// The Parquet files under `dir`, at any depth.
fn parquet_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = vec![];
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(parquet_files(&path));
        } else if path.extension().is_some_and(|e| e == "parquet") {
            found.push(path);
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inserts_write_the_tables_codec_in_one_commit() {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    run(&ctx, "CREATE SCHEMA s").await.unwrap();
    run(
        &ctx,
        "CREATE TABLE s.plain (id BIGINT NOT NULL, name VARCHAR)",
    )
    .await
    .unwrap();
    run(
        &ctx,
        "CREATE TABLE s.snappy (id BIGINT NOT NULL, name VARCHAR) \
         TBLPROPERTIES ('write.parquet.compression-codec' = 'snappy')",
    )
    .await
    .unwrap();
    for (table, codec) in [("plain", "ZSTD"), ("snappy", "SNAPPY")] {
        run(
            &ctx,
            &format!(
                "INSERT INTO s.{table} SELECT value, 'name-' || value FROM generate_series(1, 100000)"
            ),
        )
        .await
        .unwrap();
        assert_eq!(
            scalar(&ctx, &format!("SELECT count(*) FROM s.{table}")).await,
            "100000"
        );
        assert_eq!(
            scalar(&ctx, &format!("SELECT count(*) FROM s.{table}$snapshots")).await,
            "1",
            "one INSERT, one commit"
        );
        let files = parquet_files(&warehouse.path().join("s").join(table).join("data"));
        assert!(!files.is_empty(), "no data files for s.{table}");
        let mut rows = 0;
        for file in &files {
            let reader = SerializedFileReader::new(File::open(file).unwrap()).unwrap();
            rows += reader.metadata().file_metadata().num_rows();
            for group in reader.metadata().row_groups() {
                for column in group.columns() {
                    let written = format!("{:?}", column.compression());
                    assert!(
                        written.starts_with(codec),
                        "{}: column {} is {written}, not {codec}",
                        file.display(),
                        column.column_path()
                    );
                }
            }
        }
        assert_eq!(rows, 100_000, "s.{table}: {files:?}");
    }
}
