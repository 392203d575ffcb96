//! Session logs: Iceberg tables owned by icestage (`icestage.upload_log`,
//! `icestage.download_log` in each catalog) that record how each session
//! ended, so that its status outlives its table. Append-only; the latest row
//! of an id is its state.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{Field, Schema as ArrowSchema};
use iceberg::spec::Schema;
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableIdent};

use super::{SessionRecord, is_missing};
use crate::catalog::Catalogs;
use crate::catalog::IcebergCatalog;
use crate::catalog::bridge::insert::append_stored;
use crate::catalog::manifests::lookup::Wanted;
use crate::error::{Error, Result};
use crate::rows::{StoredRow, result_row};
use std::fmt::Display;
use std::str::FromStr;

/// Namespace of the tables icestage owns.
pub const ICESTAGE_NAMESPACE: &str = "icestage";
/// Name of the upload log table.
pub const UPLOAD_LOG_TABLE: &str = "upload_log";
/// Name of the download log table.
pub const DOWNLOAD_LOG_TABLE: &str = "download_log";

/// Which log: its table and the names of the columns that differ between
/// uploads and downloads. Both logs share field ids: a log is read by field
/// id, so a download log written when it still had the upload log's column
/// names (`upload_id`, `target_table`, `staging_table`) reads the same.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SessionLog {
    table: &'static str,
    /// Field 1: the session's id.
    id: &'static str,
    /// Field 3: an upload's target table; a download's sources (JSON).
    target: &'static str,
    /// Field 4: an upload's staging table; a download's table.
    staging: &'static str,
}

/// The log of upload sessions.
pub(crate) const UPLOADS: SessionLog = SessionLog {
    table: UPLOAD_LOG_TABLE,
    id: "upload_id",
    target: "target_table",
    staging: "staging_table",
};
/// The log of download sessions.
pub(crate) const DOWNLOADS: SessionLog = SessionLog {
    table: DOWNLOAD_LOG_TABLE,
    id: "download_id",
    target: "sources",
    staging: "download_table",
};

const ID_FIELD: i32 = 1;
const TARGET_FIELD: i32 = 3;
const STAGING_FIELD: i32 = 4;
/// When a record was written: what "recorded since" reads by.
const RECORDED_AT: &str = "recorded_at";

fn log_ident(log: SessionLog) -> TableIdent {
    icestage_table(log.table)
}

/// The table `name` of icestage's own namespace.
pub(crate) fn icestage_table(name: &str) -> TableIdent {
    TableIdent::new(
        NamespaceIdent::new(ICESTAGE_NAMESPACE.to_string()),
        name.to_string(),
    )
}

result_row! {
    /// One record of a session log as stored. Fields 1, 3 and 4 take the
    /// log's own names ([`SessionLog`]); the rest are named as here.
    #[derive(Debug, Clone, PartialEq)]
    pub struct SessionLogRow {
        /// The session's id.
        pub id: String,
        /// Its state then.
        pub state: String,
        /// An upload's target table; a download's sources (JSON).
        pub target: String,
        /// An upload's staging table; a download's table.
        pub staging: Option<String>,
        /// When the session was opened.
        pub created_at: Option<DateTime<Utc>>,
        /// When it expires.
        pub expires_at: Option<DateTime<Utc>>,
        /// When the record was written.
        pub recorded_at: DateTime<Utc>,
        /// Rows promoted or written.
        pub rows: Option<i64>,
        /// Files promoted or written.
        pub files: Option<i64>,
        /// The snapshot promoted or read.
        pub snapshot_id: Option<i64>,
        /// Why it failed, or what it did.
        pub message: Option<String>,
        /// Who opened it.
        pub owner: Option<String>,
    }
}

/// The schema of `log`: [`SessionLogRow`]'s, with the log's names for fields 1, 3
/// and 4.
fn log_schema(log: SessionLog) -> Result<Schema> {
    let named = [
        (ID_FIELD, log.id),
        (TARGET_FIELD, log.target),
        (STAGING_FIELD, log.staging),
    ];
    let fields = SessionLogRow::iceberg_schema()?
        .as_struct()
        .fields()
        .iter()
        .map(|field| match named.iter().find(|(id, _)| *id == field.id) {
            Some((_, name)) => {
                let mut renamed = field.as_ref().clone();
                renamed.name = (*name).to_string();
                Arc::new(renamed)
            }
            None => Arc::clone(field),
        })
        .collect::<Vec<_>>();
    Ok(Schema::builder().with_fields(fields).build()?)
}

/// The log table of `catalog`, created on first use.
pub(crate) async fn log_table(catalog: &IcebergCatalog, log: SessionLog) -> Result<Table> {
    // Partitioned by the session id: a lookup reads only the manifests
    // that hold that id, however long the log is.
    catalog
        .owned_table(
            &log_ident(log),
            || log_schema(log),
            Some((ID_FIELD, "by_id")),
        )
        .await
}

/// Appends `record` to the log of `catalog`.
pub(crate) async fn append<S: Display>(
    catalog: &IcebergCatalog,
    log: SessionLog,
    record: &SessionRecord<S>,
) -> Result<()> {
    let table = log_table(catalog, log).await?;
    let row = SessionLogRow {
        id: record.id.clone(),
        state: record.state.to_string(),
        target: record.target.clone(),
        staging: Some(record.staging.clone()),
        created_at: record.created_at,
        expires_at: record.expires_at,
        recorded_at: record.recorded_at.unwrap_or_else(Utc::now),
        rows: record.rows,
        files: record.files,
        snapshot_id: record.snapshot_id,
        message: record.message.clone(),
        owner: record.owner.clone(),
    };
    append_stored(catalog, &table, &[row]).await
}

/// The latest record of `upload_id` in the log of `catalog`.
pub(crate) async fn lookup<S: FromStr<Err = Error>>(
    catalog: &IcebergCatalog,
    log: SessionLog,
    id: &str,
) -> Result<Option<SessionRecord<S>>> {
    let records = read(catalog, log, Some(id), None).await?;
    Ok(records.into_iter().max_by_key(|r| r.recorded_at))
}

/// The latest record of session `id` in the log of whichever catalog holds
/// it (a session lives in one catalog).
pub(crate) async fn find<S: FromStr<Err = Error>>(
    icestage: &Catalogs,
    log: SessionLog,
    id: &str,
) -> Result<Option<SessionRecord<S>>> {
    for catalog in icestage.catalogs() {
        if let Some(record) = lookup(catalog, log, id).await? {
            return Ok(Some(record));
        }
    }
    Ok(None)
}

/// The latest record of every session in the log of `catalog`; with
/// `since`, of those recorded since then only (the log's data files whose
/// `recorded_at` bounds lie before it are not read).
pub(crate) async fn latest_records<S: FromStr<Err = Error>>(
    catalog: &IcebergCatalog,
    log: SessionLog,
    since: Option<DateTime<Utc>>,
) -> Result<Vec<SessionRecord<S>>> {
    let mut latest: std::collections::HashMap<String, SessionRecord<S>> = Default::default();
    for record in read(catalog, log, None, since).await? {
        match latest.get(&record.id) {
            Some(seen) if seen.recorded_at >= record.recorded_at => {}
            _ => {
                latest.insert(record.id.clone(), record);
            }
        }
    }
    Ok(latest.into_values().collect())
}

async fn read<S: FromStr<Err = Error>>(
    catalog: &IcebergCatalog,
    log: SessionLog,
    id: Option<&str>,
    since: Option<DateTime<Utc>>,
) -> Result<Vec<SessionRecord<S>>> {
    let table = match catalog.catalog().load_table(&log_ident(log)).await {
        Ok(table) => table,
        Err(e) if is_missing(&e) => return Ok(vec![]),
        Err(e) => return Err(e.into()),
    };
    // The names this table was written with, by field id.
    let schema = table.metadata().current_schema();
    let named = |field: i32, fallback: &'static str| {
        schema
            .field_by_id(field)
            .map_or(fallback.to_string(), |f| f.name.clone())
    };
    let names = [
        named(ID_FIELD, log.id),
        named(TARGET_FIELD, log.target),
        named(STAGING_FIELD, log.staging),
    ];
    // By id (a lookup), or by time (a poller): the files that may hold it,
    // from manifests decoded once; the rows are kept below. Neither: all.
    let wanted = match (id, since) {
        (Some(id), _) => Some(Wanted::Holding {
            field: ID_FIELD,
            value: id,
        }),
        (None, Some(since)) => Wanted::since(schema, RECORDED_AT, since),
        (None, None) => None,
    };
    let batches = catalog.manifests().read(&table, wanted).await?;
    let mut records = vec![];
    for batch in &batches {
        records.extend(decode(batch, catalog.name(), log, &names)?);
    }
    if let Some(id) = id {
        records.retain(|r| r.id == id);
    }
    if let Some(since) = since {
        records.retain(|r| r.recorded_at.is_some_and(|at| at >= since));
    }
    Ok(records)
}

/// The records of `batch`, read from `log` whose id, target and staging
/// columns are named `names`: read as [`SessionLogRow`]s once those three
/// take the row's names.
fn decode<S: FromStr<Err = Error>>(
    batch: &RecordBatch,
    catalog: &str,
    log: SessionLog,
    names: &[String; 3],
) -> Result<Vec<SessionRecord<S>>> {
    let schema = batch.schema();
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|field| {
            let field = field.as_ref().clone();
            match names.iter().position(|name| name == field.name()) {
                Some(at) => field.with_name(["id", "target", "staging"][at]),
                None => field,
            }
        })
        .collect();
    let batch = RecordBatch::try_new(Arc::new(ArrowSchema::new(fields)), batch.columns().to_vec())?;
    let table = format!("{ICESTAGE_NAMESPACE}.{}", log.table);
    SessionLogRow::from_batch(&table, &batch)?
        .into_iter()
        .map(|row| {
            Ok(SessionRecord {
                id: row.id,
                state: row.state.parse()?,
                catalog: catalog.to_string(),
                target: row.target,
                staging: row.staging.unwrap_or_default(),
                message: row.message,
                owner: row.owner,
                rows: row.rows,
                files: row.files,
                snapshot_id: row.snapshot_id,
                findings: None,
                created_at: row.created_at,
                expires_at: row.expires_at,
                recorded_at: Some(row.recorded_at),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::IcestageConfig;
    use crate::rows::{Value, schema_shape};

    /// The logs written before their schema came from [`SessionLogRow`] read and
    /// append alike: the same ids, names, types and required fields.
    #[test]
    fn the_logs_keep_their_schemas() {
        let rest = [
            "5 created_at timestamptz optional",
            "6 expires_at timestamptz optional",
            "7 recorded_at timestamptz required",
            "8 rows long optional",
            "9 files long optional",
            "10 snapshot_id long optional",
            "11 message string optional",
            "12 owner string optional",
        ];
        for (log, names) in [
            (UPLOADS, ["upload_id", "target_table", "staging_table"]),
            (DOWNLOADS, ["download_id", "sources", "download_table"]),
        ] {
            let mut expected = vec![
                format!("1 {} string required", names[0]),
                "2 state string required".to_string(),
                format!("3 {} string required", names[1]),
                format!("4 {} string optional", names[2]),
            ];
            expected.extend(rest.iter().map(|line| line.to_string()));
            assert_eq!(schema_shape(&log_schema(log).unwrap()), expected);
        }
    }

    /// A state for the test records.
    #[derive(Debug, Clone, Copy, PartialEq)]
    struct Ended;

    impl Display for Ended {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("ended")
        }
    }

    impl FromStr for Ended {
        type Err = Error;
        fn from_str(s: &str) -> Result<Self> {
            (s == "ended")
                .then_some(Ended)
                .ok_or_else(|| Error::invalid(format!("'{s}' is not ended")))
        }
    }

    /// An embedded catalog under `dir` with the `icestage` namespace.
    async fn catalog_in(dir: &std::path::Path) -> IcebergCatalog {
        let config = IcestageConfig::embedded(dir).unwrap();
        let catalog = IcebergCatalog::open(&config.catalogs[0]).await.unwrap();
        catalog
            .ensure_namespace(&NamespaceIdent::new(ICESTAGE_NAMESPACE.to_string()))
            .await
            .unwrap();
        catalog
    }

    fn record(id: &str, target: &str, staging: &str) -> SessionRecord<Ended> {
        SessionRecord {
            id: id.to_string(),
            state: Ended,
            catalog: "local".to_string(),
            target: target.to_string(),
            staging: staging.to_string(),
            created_at: None,
            expires_at: None,
            recorded_at: Some(Utc::now()),
            rows: Some(3),
            files: Some(1),
            snapshot_id: None,
            findings: None,
            message: None,
            owner: Some("svc".to_string()),
        }
    }

    /// The manifest list of the upload log's current snapshot.
    async fn current_manifests(catalog: &IcebergCatalog) -> iceberg::spec::ManifestList {
        let table = log_table(catalog, UPLOADS).await.unwrap();
        table
            .manifest_list_reader(table.metadata().current_snapshot().unwrap())
            .load()
            .await
            .unwrap()
    }

    /// Appends a record for each of `ids` to the upload log of `catalog`,
    /// recorded at `at` (now when `None`).
    async fn append_records(
        catalog: &IcebergCatalog,
        ids: impl IntoIterator<Item = String>,
        at: Option<DateTime<Utc>>,
    ) {
        for id in ids {
            let mut next = record(&id, "s.t", "staging.x");
            next.recorded_at = at.or(next.recorded_at);
            append(catalog, UPLOADS, &next).await.unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn download_logs_of_either_schema_read_alike() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = catalog_in(dir.path()).await;

        // A new download log is named for what it holds.
        let table = log_table(&catalog, DOWNLOADS).await.unwrap();
        let names = crate::catalog::column_names(&table);
        assert_eq!(
            names[..4],
            ["download_id", "state", "sources", "download_table"]
        );
        let written = record("a1", "{\"local.shop.orders\":7}", "downloads.download_a1");
        append(&catalog, DOWNLOADS, &written).await.unwrap();
        let read: SessionRecord<Ended> = lookup(&catalog, DOWNLOADS, "a1").await.unwrap().unwrap();
        assert_eq!(
            (&read.target, &read.staging),
            (&written.target, &written.staging)
        );

        // One written under the upload log's column names (as downloads
        // logged before they had their own) reads the same, by field id.
        catalog
            .catalog()
            .drop_table(&log_ident(DOWNLOADS))
            .await
            .unwrap();
        catalog
            .owned_table(
                &log_ident(DOWNLOADS),
                || log_schema(UPLOADS),
                Some((ID_FIELD, "by_id")),
            )
            .await
            .unwrap();
        append(&catalog, DOWNLOADS, &written).await.unwrap();
        let read: SessionRecord<Ended> = lookup(&catalog, DOWNLOADS, "a1").await.unwrap().unwrap();
        assert_eq!((read.id.as_str(), read.rows), ("a1", Some(3)));
        assert_eq!(
            (&read.target, &read.staging),
            (&written.target, &written.staging)
        );
        assert!(
            lookup::<Ended>(&catalog, DOWNLOADS, "b2")
                .await
                .unwrap()
                .is_none()
        );
    }

    /// A log written before logs were partitioned by id (and had the
    /// owned-table properties) gets both on first use; its old records and
    /// the new ones are found alike, and a lookup of a new record reads its
    /// own manifest only.
    #[tokio::test(flavor = "multi_thread")]
    async fn an_unpartitioned_log_is_partitioned_on_first_use() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = catalog_in(dir.path()).await;
        let namespace = NamespaceIdent::new(ICESTAGE_NAMESPACE.to_string());
        let old = catalog
            .catalog()
            .create_table(
                &namespace,
                iceberg::TableCreation::builder()
                    .name(UPLOADS.table.to_string())
                    .schema(log_schema(UPLOADS).unwrap())
                    .build(),
            )
            .await
            .unwrap();
        assert!(old.metadata().default_partition_spec().is_unpartitioned());
        crate::catalog::bridge::insert::append_rows(
            &catalog,
            &old,
            &[vec![
                Value::from("old"),
                Value::from("ended"),
                Value::from("s.t"),
                Value::from("staging.old"),
                Value::from(None::<chrono::DateTime<Utc>>),
                Value::from(None::<chrono::DateTime<Utc>>),
                Value::from(Some(Utc::now())),
                Value::from(Some(1i64)),
                Value::from(Some(1i64)),
                Value::from(None::<i64>),
                Value::from(None::<String>),
                Value::from(None::<String>),
            ]],
        )
        .await
        .unwrap();

        let table = log_table(&catalog, UPLOADS).await.unwrap();
        assert!(!table.metadata().default_partition_spec().is_unpartitioned());
        let props = table.metadata().properties();
        assert_eq!(
            props
                .get("write.metadata.delete-after-commit.enabled")
                .map(String::as_str),
            Some("true")
        );
        append_records(&catalog, (0..3).map(|n| format!("new{n}")), None).await;
        let found: SessionRecord<Ended> = lookup(&catalog, UPLOADS, "old").await.unwrap().unwrap();
        assert_eq!(found.staging, "staging.old");
        let found: SessionRecord<Ended> = lookup(&catalog, UPLOADS, "new1").await.unwrap().unwrap();
        assert_eq!(found.id, "new1");

        // Each new manifest says which id it holds (what a scan for one id
        // prunes by, without reading it); the old one cannot.
        let manifests = current_manifests(&catalog).await;
        let summarized = manifests
            .entries()
            .iter()
            .filter(|m| m.partitions.as_ref().is_some_and(|p| !p.is_empty()))
            .count();
        assert_eq!((manifests.entries().len(), summarized), (4, 3));
    }

    /// Reading what was recorded since a time plans only the data files
    /// recorded since then: a poller's cost follows what changed, not the
    /// log's length.
    #[tokio::test(flavor = "multi_thread")]
    async fn records_since_a_time_read_only_the_files_recorded_since() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = catalog_in(dir.path()).await;
        let old = Utc::now() - chrono::Duration::days(2);
        append_records(&catalog, (0..12).map(|n| format!("old{n:02}")), Some(old)).await;
        append_records(&catalog, (0..3).map(|n| format!("new{n}")), None).await;
        let since = Utc::now() - chrono::Duration::hours(1);
        let mut recent: Vec<String> = latest_records::<Ended>(&catalog, UPLOADS, Some(since))
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        recent.sort();
        assert_eq!(recent, ["new0", "new1", "new2"]);
        let all = latest_records::<Ended>(&catalog, UPLOADS, None)
            .await
            .unwrap();
        assert_eq!(all.len(), 15);
        // What the read plans: from the manifests decoded once, the files
        // whose `recorded_at` upper bound is not before `since`.
        let table = log_table(&catalog, UPLOADS).await.unwrap();
        let wanted = Wanted::since(table.metadata().current_schema(), RECORDED_AT, since).unwrap();
        let planned = catalog
            .manifests()
            .files(&table, wanted)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(planned.len(), 3, "the old records' files are skipped");
    }

    /// A log's manifests merge in levels: level 0 (one per append) folds
    /// into level 1 while that stays under its bound, leaving level 2 as it
    /// was; past the bound everything folds into level 2. Every record stays
    /// found, and a merge with nothing appended since changes nothing.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_log_merges_its_manifests_in_levels() {
        use crate::catalog::maintain::compact::{Layout, Rewrite, level, rewrite_manifests};
        let dir = tempfile::tempdir().unwrap();
        let catalog = catalog_in(dir.path()).await;
        let layout = Layout::Levels {
            per_manifest: 4,
            level_one: 20,
        };
        // The data manifests' file names, by level prefix.
        let names = || async {
            let list = current_manifests(&catalog).await;
            let mut by_level: [Vec<String>; 3] = Default::default();
            for m in list.entries() {
                let name = m.manifest_path.rsplit('/').next().unwrap().to_string();
                by_level[usize::from(level(m))].push(name);
            }
            by_level
        };
        let merge = || async {
            let table = log_table(&catalog, UPLOADS).await.unwrap();
            rewrite_manifests(&catalog, &table, layout).await.unwrap()
        };
        let ids = |from: usize, to: usize| (from..to).map(|n| format!("id{n:04}"));
        // Every record so far is found, and no other (lookups keep the
        // manifests they decode across versions of the log).
        let shared = &catalog;
        let all_found = |to: usize| async move {
            for id in ids(0, to) {
                let found: SessionRecord<Ended> =
                    lookup(shared, UPLOADS, &id).await.unwrap().unwrap();
                assert_eq!(found.id, id);
            }
            let missing = lookup::<Ended>(shared, UPLOADS, "id9999").await.unwrap();
            assert!(missing.is_none());
        };

        // Appends records `from..to`, merges, and counts the manifests per level.
        let step = |from: usize, to: usize| async move {
            append_records(shared, ids(from, to), None).await;
            let merged = merge().await;
            assert!(matches!(merged, Rewrite::Done { .. }), "{merged:?}");
            names().await
        };

        let [zero, one, two] = step(0, 10).await;
        assert_eq!((zero.len(), one.len(), two.len()), (0, 3, 0));
        all_found(10).await;
        let [zero, one, two] = step(10, 18).await;
        assert_eq!((zero.len(), one.len(), two.len()), (0, 5, 0));
        // 18 in level 1 and 5 appended: past 20, all fold into level 2.
        let [zero, one, level_two] = step(18, 23).await;
        assert_eq!((zero.len(), one.len(), level_two.len()), (0, 0, 6));
        all_found(23).await;
        // Level 2 stays as it is while level 1 has room.
        let [zero, one, two] = step(23, 26).await;
        assert_eq!((zero.len(), one.len()), (0, 1));
        assert_eq!(two, level_two);
        assert!(matches!(merge().await, Rewrite::Nothing { .. }));

        // A merge that read a version appends have moved on from lands on
        // top of them: what they added stays, as level 0.
        append_records(&catalog, ids(26, 28), None).await;
        let stale = log_table(&catalog, UPLOADS).await.unwrap();
        append_records(&catalog, ids(28, 30), None).await;
        let rebased = rewrite_manifests(&catalog, &stale, layout).await.unwrap();
        assert!(matches!(rebased, Rewrite::Done { .. }), "{rebased:?}");
        let [zero, one, two] = names().await;
        assert_eq!((zero.len(), one.len()), (2, 2));
        assert_eq!(two, level_two);

        // One whose manifests another merge replaced meanwhile changes nothing.
        append_records(&catalog, ids(30, 31), None).await;
        let stale = log_table(&catalog, UPLOADS).await.unwrap();
        merge().await;
        let before = names().await;
        // The manifests and lists on disk (the background trim may delete
        // some meanwhile; nothing else writes any).
        let folder = format!(
            "{}/metadata",
            stale.metadata().location().trim_start_matches("file://")
        );
        let on_disk = || -> std::collections::HashSet<String> {
            std::fs::read_dir(&folder)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
                .filter(|name| name.ends_with(".avro"))
                .collect()
        };
        let written = on_disk();
        let lost = rewrite_manifests(&catalog, &stale, layout)
            .await
            .unwrap_err();
        assert!(
            lost.to_string().contains("run REWRITE MANIFESTS again"),
            "{lost}"
        );
        assert_eq!(names().await, before);
        let left: Vec<String> = on_disk().difference(&written).cloned().collect();
        assert!(left.is_empty(), "a refused merge left {left:?}");

        all_found(31).await;
    }

    /// A long log keeps a bounded number of manifests and snapshots (merged
    /// every 128 appends, sorted by id), and every record stays found.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_long_log_stays_small_to_look_up() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = catalog_in(dir.path()).await;
        append_records(&catalog, (0..230).map(|n| format!("id{n:04}")), None).await;
        for n in [0, 99, 150, 229] {
            let id = format!("id{n:04}");
            let found: SessionRecord<Ended> =
                lookup(&catalog, UPLOADS, &id).await.unwrap().unwrap();
            assert_eq!(found.id, id);
        }
        // The upkeep runs in the background after an append: give the last
        // one time to land.
        let mut shape = (0, 0);
        for _ in 0..100 {
            let table = log_table(&catalog, UPLOADS).await.unwrap();
            let manifests = current_manifests(&catalog).await;
            shape = (
                table.metadata().snapshots().count(),
                manifests.entries().len(),
            );
            // Merged into level-1 manifests of 200 entries every 128 commits
            // (the table's property commits count too), the rest one per
            // append.
            if shape.0 <= 20 && shape.1 < 135 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("(snapshots, manifests) of a log of 230 appends: {shape:?}");
    }
}
