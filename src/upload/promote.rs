//! `PROMOTE UPLOAD '<id>'`: validate the staging table against its target,
//! commit its rows into the target exactly once, then retire the session.
//!
//! The steps, in order:
//! 1. find the session; if the target already holds a snapshot with
//!    `upload-id=<id>`, only the clean-up is left (a crash or a concurrent
//!    promotion got there first);
//! 2. claim it (`state=promoting`, a compare-and-swap on the staging table);
//! 3. inspect the staging table's metadata: schema and partition-spec drift,
//!    snapshots that are not plain appends, delete files, and nulls in
//!    required columns (from the manifests' null counts; a streaming scan
//!    only for files that lack them);
//! 4. commit: register the staging data files in the target with one
//!    `fast_append` carrying `upload-id=<id>` (no data rewritten). The commit
//!    runs through a catalog that re-checks the evidence on every load, and
//!    `Transaction::commit` loads the table at the start of each attempt, so
//!    none of its retries can append twice;
//! 5. record the outcome in the upload log, drop the staging table without
//!    purging (its data files now belong to the target) and delete its
//!    metadata files.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use chrono::Utc;
use datafusion::arrow::array::RecordBatch;
use futures::TryStreamExt;
use iceberg::spec::{
    DataFile, ManifestContentType, NestedFieldRef, Operation, Schema, TableMetadata, Type,
};
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};

use super::log::{LogRecord, jitter};
use super::{
    SNAPSHOT_UPLOAD_ID, Staging, UploadId, UploadState, find_staging, is_missing, log,
    promoted_snapshot,
};
use crate::catalog::scoped::{LoadCheck, ScopedCatalog};
use crate::context::Icestage;
use crate::error::{Error, Result};
use crate::plan::command::{CommandContext, promote_schema};
use crate::plan::rows::{Value, batch};

/// How the rows reached the target.
pub(crate) const PATH_ZERO_COPY: &str = "zero_copy";
/// Nothing was committed (an empty upload, or an earlier promotion did it).
pub(crate) const PATH_NONE: &str = "none";

/// The result of a promotion.
#[derive(Debug, Clone)]
pub(crate) struct Promotion {
    pub(crate) id: UploadId,
    pub(crate) rows: i64,
    pub(crate) files: i64,
    pub(crate) snapshot_id: Option<i64>,
    pub(crate) path: &'static str,
    pub(crate) message: String,
}

impl Promotion {
    fn row(&self) -> Vec<Value> {
        vec![
            Value::from(self.id.to_string()),
            Value::from(UploadState::Promoted.as_str()),
            Value::from(self.rows),
            Value::from(self.files),
            Value::from(self.snapshot_id),
            Value::from(self.path),
            Value::from(0),
            Value::from(self.message.clone()),
        ]
    }
}

pub(crate) async fn promote_upload(ctx: &CommandContext, id: &str) -> Result<RecordBatch> {
    let id = UploadId::parse(id)?;
    let promotion = promote(&ctx.icestage, &id).await?;
    batch(promote_schema(), &[promotion.row()])
}

/// Promotes upload `id`; see the module documentation.
pub(crate) async fn promote(icestage: &Icestage, id: &UploadId) -> Result<Promotion> {
    match promote_once(icestage, id).await {
        Ok(promotion) => Ok(promotion),
        // A concurrent promotion may have finished while this one was
        // working (and dropped the staging table under it): that is success.
        Err(error) => match already_promoted(icestage, id).await {
            Ok(Some(promotion)) => Ok(promotion),
            _ => Err(error),
        },
    }
}

async fn promote_once(icestage: &Icestage, id: &UploadId) -> Result<Promotion> {
    let Some(mut staging) = find_staging(icestage, id).await? else {
        return match already_promoted(icestage, id).await? {
            Some(promotion) => Ok(promotion),
            None => Err(closed_or_unknown(icestage, id).await?),
        };
    };
    let target = load_target(&staging).await?;
    if let Some(snapshot_id) = promoted_snapshot(&target, id) {
        let (rows, files) = snapshot_counts(&target, snapshot_id);
        finish(&staging, Some(snapshot_id), rows, files).await?;
        return Ok(Promotion {
            id: id.clone(),
            rows,
            files,
            snapshot_id: Some(snapshot_id),
            path: PATH_NONE,
            message: already_message(&staging.target.to_string(), snapshot_id),
        });
    }
    if matches!(staging.state, UploadState::Aborted | UploadState::Expired) {
        return Err(Error::UploadClosed {
            id: id.to_string(),
            state: staging.state.to_string(),
            target: staging.target.to_string(),
        });
    }
    if staging.is_expired(Utc::now()) {
        return Err(Error::UploadState {
            id: id.to_string(),
            state: UploadState::Expired.to_string(),
            hint: format!(
                "it expired at {} and can no longer be promoted; EXPIRE STAGING removes it. \
                 Open a new upload with CREATE UPLOAD FOR {}",
                staging.expires_at.map(|t| t.to_rfc3339()).unwrap_or_default(),
                staging.target
            ),
        });
    }
    staging
        .transition(
            &[UploadState::Open, UploadState::Failed, UploadState::Promoting],
            UploadState::Promoting,
            None,
        )
        .await?;

    let inspection = inspect(&staging, &target).await?;
    if !inspection.reasons.is_empty() {
        let message = inspection.reasons.join("; ");
        // If another process moved the session meanwhile, its state wins;
        // the reasons are still reported to this caller.
        let _ = staging
            .transition(&[UploadState::Promoting], UploadState::Failed, Some(&message))
            .await;
        return Err(Error::ValidationFailed {
            id: id.to_string(),
            target: staging.target.to_string(),
            staging: staging.name(),
            reasons: inspection.reasons,
        });
    }

    let files = inspection.files.len() as i64;
    let rows = inspection.rows;
    if inspection.files.is_empty() {
        finish(&staging, None, 0, 0).await?;
        return Ok(Promotion {
            id: id.clone(),
            rows: 0,
            files: 0,
            snapshot_id: None,
            path: PATH_NONE,
            message: format!("the upload was empty: {} is unchanged", staging.target),
        });
    }
    let (snapshot_id, committed_here) = commit(&staging, &target, inspection.files).await?;
    finish(&staging, Some(snapshot_id), rows, files).await?;
    let message = if committed_here {
        format!(
            "committed {rows} row(s) in {files} file(s) to {} in snapshot {snapshot_id} without rewriting data",
            staging.target
        )
    } else {
        already_message(&staging.target.to_string(), snapshot_id)
    };
    Ok(Promotion {
        id: id.clone(),
        rows,
        files,
        snapshot_id: Some(snapshot_id),
        path: if committed_here { PATH_ZERO_COPY } else { PATH_NONE },
        message,
    })
}

fn already_message(target: &str, snapshot_id: i64) -> String {
    format!("already promoted into {target} in snapshot {snapshot_id}; nothing changed")
}

/// The promotion recorded in an upload log, if the upload was promoted.
async fn already_promoted(icestage: &Icestage, id: &UploadId) -> Result<Option<Promotion>> {
    for catalog in icestage.catalogs() {
        if let Some(record) = log::lookup(catalog, id.as_str()).await?
            && record.state == UploadState::Promoted
        {
            let message = match record.snapshot_id {
                Some(snapshot_id) => already_message(&record.target_table, snapshot_id),
                None => "already promoted (the upload was empty); nothing changed".to_string(),
            };
            return Ok(Some(Promotion {
                id: id.clone(),
                rows: record.rows.unwrap_or(0),
                files: record.files.unwrap_or(0),
                snapshot_id: record.snapshot_id,
                path: PATH_NONE,
                message,
            }));
        }
    }
    Ok(None)
}

/// The error for an id with no staging table: aborted, expired or unknown.
pub(crate) async fn closed_or_unknown(icestage: &Icestage, id: &UploadId) -> Result<Error> {
    for catalog in icestage.catalogs() {
        if let Some(record) = log::lookup(catalog, id.as_str()).await? {
            return Ok(Error::UploadClosed {
                id: id.to_string(),
                state: record.state.to_string(),
                target: record.target_table,
            });
        }
    }
    Ok(Error::UnknownUpload(id.to_string()))
}

pub(crate) async fn load_target(staging: &Staging) -> Result<Table> {
    staging
        .catalog
        .catalog()
        .load_table(&staging.target)
        .await
        .map_err(|e| {
            if is_missing(&e) {
                Error::TableNotFound {
                    table: staging.target.to_string(),
                    hint: format!(
                        ": it is the target of upload '{}', whose rows stay in {} until the upload \
                         expires; ABORT UPLOAD '{}' discards them",
                        staging.id,
                        staging.name(),
                        staging.id
                    ),
                }
            } else {
                e.into()
            }
        })
}

fn snapshot_counts(table: &Table, snapshot_id: i64) -> (i64, i64) {
    let summary = table
        .metadata()
        .snapshot_by_id(snapshot_id)
        .map(|s| s.summary().additional_properties.clone())
        .unwrap_or_default();
    let count = |key: &str| summary.get(key).and_then(|v| v.parse().ok()).unwrap_or(0);
    (count("added-records"), count("added-data-files"))
}

/// What the staging table holds and what is wrong with it.
struct Inspection {
    files: Vec<DataFile>,
    rows: i64,
    reasons: Vec<String>,
}

/// One column of a schema, flattened (nested fields by their dotted path).
#[derive(Debug, PartialEq)]
struct Column {
    path: String,
    kind: String,
    required: bool,
    /// Required here and in every enclosing field, so it can never be null.
    never_null: bool,
}

fn columns(schema: &Schema) -> BTreeMap<i32, Column> {
    fn walk(fields: &[NestedFieldRef], prefix: &str, parents_required: bool, out: &mut BTreeMap<i32, Column>) {
        for field in fields {
            let path = format!("{prefix}{}", field.name);
            let never_null = parents_required && field.required;
            let nested = format!("{path}.");
            let kind = match field.field_type.as_ref() {
                Type::Primitive(p) => p.to_string(),
                Type::Struct(s) => {
                    walk(s.fields(), &nested, never_null, out);
                    "struct".to_string()
                }
                Type::List(l) => {
                    walk(std::slice::from_ref(&l.element_field), &nested, false, out);
                    "list".to_string()
                }
                Type::Map(m) => {
                    walk(&[Arc::clone(&m.key_field), Arc::clone(&m.value_field)], &nested, false, out);
                    "map".to_string()
                }
            };
            out.insert(
                field.id,
                Column {
                    path,
                    kind,
                    required: field.required,
                    never_null,
                },
            );
        }
    }
    let mut out = BTreeMap::new();
    walk(schema.as_struct().fields(), "", true, &mut out);
    out
}

/// Every difference between the staging table's schema and the target's, by
/// field id, one line per column.
pub(crate) fn schema_drift(staging: &Schema, target: &Schema) -> Vec<String> {
    let staging = columns(staging);
    let target = columns(target);
    let mut drift = vec![];
    for (id, t) in &target {
        let Some(s) = staging.get(id) else {
            drift.push(format!(
                "schema drift: column '{}' (field id {id}) of the target is missing from the staging table",
                t.path
            ));
            continue;
        };
        if s.path != t.path {
            drift.push(format!(
                "schema drift: column '{}' (field id {id}) of the target is named '{}' in the staging table",
                t.path, s.path
            ));
        }
        if s.kind != t.kind {
            drift.push(format!(
                "schema drift: column '{}' is {} in the target but {} in the staging table",
                t.path, t.kind, s.kind
            ));
        }
        if s.required != t.required {
            let word = |required: bool| if required { "required" } else { "optional" };
            drift.push(format!(
                "schema drift: column '{}' is {} in the target but {} in the staging table",
                t.path,
                word(t.required),
                word(s.required)
            ));
        }
    }
    for (id, s) in &staging {
        if !target.contains_key(id) {
            drift.push(format!(
                "schema drift: column '{}' (field id {id}) is in the staging table but not in the target",
                s.path
            ));
        }
    }
    drift
}

fn spec_text(metadata: &TableMetadata) -> String {
    let spec = metadata.default_partition_spec();
    let fields: Vec<String> = spec
        .fields()
        .iter()
        .map(|f| format!("{}={}({})", f.name, f.transform, f.source_id))
        .collect();
    format!("spec {} [{}]", spec.spec_id(), fields.join(", "))
}

async fn inspect(staging: &Staging, target: &Table) -> Result<Inspection> {
    let metadata = staging.table.metadata();
    let target_schema = target.metadata().current_schema();
    let mut reasons = schema_drift(metadata.current_schema(), target_schema);
    let (staging_spec, target_spec) = (spec_text(metadata), spec_text(target.metadata()));
    if staging_spec != target_spec {
        reasons.push(format!(
            "partition spec drift: the staging table has {staging_spec}, the target {target_spec}"
        ));
    }
    let mut snapshots: Vec<_> = metadata.snapshots().collect();
    snapshots.sort_by_key(|s| s.sequence_number());
    for snapshot in &snapshots {
        let operation = &snapshot.summary().operation;
        if *operation != Operation::Append {
            reasons.push(format!(
                "snapshot {} of the staging table is a {}, not an append: only appended rows can be \
                 promoted; open a new upload and append the rows once",
                snapshot.snapshot_id(),
                operation.as_str()
            ));
        }
        if let Some(schema_id) = snapshot.schema_id()
            && schema_id != metadata.current_schema_id()
            && let Some(schema) = metadata.schema_by_id(schema_id)
            && !schema_drift(schema, target_schema).is_empty()
        {
            reasons.push(format!(
                "snapshot {} of the staging table was written with schema {schema_id}, which differs \
                 from the target's; open a new upload",
                snapshot.snapshot_id()
            ));
        }
    }

    let mut files = vec![];
    if let Some(current) = metadata.current_snapshot() {
        let list = staging.table.manifest_list_reader(current).load().await?;
        let default_spec = target.metadata().default_partition_spec_id();
        for manifest in list.entries() {
            if manifest.content != ManifestContentType::Data {
                reasons.push(format!(
                    "the staging table has delete files ({}): rows were deleted or updated after \
                     they were written; open a new upload and append the rows once",
                    manifest.manifest_path
                ));
                continue;
            }
            if manifest.partition_spec_id != default_spec {
                reasons.push(format!(
                    "manifest {} was written with partition spec {}, the target's is {default_spec}",
                    manifest.manifest_path, manifest.partition_spec_id
                ));
                continue;
            }
            let loaded = manifest.load_manifest(staging.table.file_io()).await?;
            files.extend(
                loaded
                    .entries()
                    .iter()
                    .filter(|e| e.is_alive())
                    .map(|e| e.data_file().clone()),
            );
        }
    }
    // Counted even when the schema drifted: "optional in staging, required in
    // the target" is worth knowing together with how many rows hold NULL.
    reasons.extend(required_nulls(staging, target_schema, &files).await?);
    let rows = files.iter().map(|f| f.record_count() as i64).sum();
    Ok(Inspection {
        files,
        rows,
        reasons,
    })
}

/// Nulls in columns the target requires: counted from the manifests' null
/// counts; columns whose counts some file lacks are counted by one streaming
/// scan of just those columns.
async fn required_nulls(staging: &Staging, target: &Schema, files: &[DataFile]) -> Result<Vec<String>> {
    // Columns the target requires, by the name the staging table gives them
    // (columns the staging table lacks are reported as drift).
    let staged = columns(staging.table.metadata().current_schema());
    let required: Vec<(i32, String)> = columns(target)
        .into_iter()
        .filter(|(_, c)| c.never_null && c.kind != "struct")
        .filter_map(|(id, _)| staged.get(&id).map(|c| (id, c.path.clone())))
        .collect();
    let mut nulls: HashMap<i32, u64> = HashMap::new();
    let mut unknown: HashSet<i32> = HashSet::new();
    for file in files {
        for (id, _) in &required {
            match file.null_value_counts().get(id) {
                Some(n) => *nulls.entry(*id).or_default() += n,
                None => {
                    unknown.insert(*id);
                }
            }
        }
    }
    if !unknown.is_empty() {
        // The scan reads every file, so its counts replace the partial ones.
        let scanned: Vec<&(i32, String)> = required.iter().filter(|(id, _)| unknown.contains(id)).collect();
        let names = scanned.iter().map(|(_, path)| path.as_str());
        let mut stream = staging.table.scan().select(names).build()?.to_arrow().await?;
        for (id, _) in &scanned {
            nulls.insert(*id, 0);
        }
        while let Some(batch) = stream.try_next().await? {
            for (index, (id, _)) in scanned.iter().enumerate() {
                *nulls.entry(*id).or_default() += batch.column(index).null_count() as u64;
            }
        }
    }
    Ok(required
        .iter()
        .filter_map(|(id, path)| {
            nulls.get(id).filter(|n| **n > 0).map(|n| {
                format!("column '{path}' is required but {n} staged row(s) hold NULL in it")
            })
        })
        .collect())
}

/// Commits `files` into the target with `upload-id=<id>`; returns the
/// snapshot that holds them and whether this call committed it.
async fn commit(staging: &Staging, target: &Table, files: Vec<DataFile>) -> Result<(i64, bool)> {
    let id = staging.id.clone();
    let evidence = id.clone();
    let check: LoadCheck = Arc::new(move |table: &Table| match promoted_snapshot(table, &evidence) {
        Some(_) => Err(iceberg::Error::new(iceberg::ErrorKind::DataInvalid, ALREADY_PROMOTED)),
        None => Ok(()),
    });
    let inner = Arc::clone(staging.catalog.catalog());
    let guarded = ScopedCatalog::new(Arc::clone(&inner)).check_on_load(check);
    let mut base = target.clone();
    let mut attempt = 0u32;
    loop {
        let tx = Transaction::new(&base);
        let tx = tx
            .fast_append()
            // The evidence check replaces the duplicate-file check, which
            // reads every manifest of the target on each attempt.
            .with_check_duplicate(false)
            .set_snapshot_properties(HashMap::from([(
                SNAPSHOT_UPLOAD_ID.to_string(),
                id.to_string(),
            )]))
            .add_data_files(files.clone())
            .apply(tx)?;
        let result = tx.commit(&guarded).await;
        // Whatever the answer (including a lost one), the target now tells
        // whether the rows are in.
        let current = inner.load_table(&staging.target).await?;
        if let Some(snapshot_id) = promoted_snapshot(&current, &id) {
            let committed_here = matches!(&result, Ok(table) if promoted_snapshot(table, &id) == Some(snapshot_id));
            return Ok((snapshot_id, committed_here));
        }
        match result {
            Ok(_) => {
                return Err(Error::invalid(format!(
                    "internal: the commit of upload '{id}' succeeded but {} holds no snapshot with {SNAPSHOT_UPLOAD_ID}={id}",
                    staging.target
                )));
            }
            Err(e) if attempt < 8 && (e.retryable() || e.kind() == iceberg::ErrorKind::CatalogCommitConflicts) => {
                attempt += 1;
                tokio::time::sleep(jitter(attempt)).await;
                base = current;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

const ALREADY_PROMOTED: &str = "upload already promoted into this table";

/// Records the promotion, drops the staging table without purging its data
/// files (the target references them now) and deletes its metadata files.
async fn finish(staging: &Staging, snapshot_id: Option<i64>, rows: i64, files: i64) -> Result<()> {
    log::append(&staging.catalog, &LogRecord {
        upload_id: staging.id.to_string(),
        state: UploadState::Promoted,
        target_table: staging.target.to_string(),
        staging_table: staging.name(),
        created_at: staging.created_at,
        expires_at: staging.expires_at,
        recorded_at: Utc::now(),
        rows: Some(rows),
        files: Some(files),
        snapshot_id,
        message: None,
    })
    .await?;
    let ident = staging.table.identifier();
    match staging.catalog.catalog().drop_table(ident).await {
        Ok(()) => {}
        // A concurrent promotion finished first.
        Err(e) if is_missing(&e) => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    delete_metadata_files(&staging.table).await;
    Ok(())
}

/// Deletes a dropped table's metadata, manifest lists and manifests but not
/// its data files. Best effort: the table is already gone from the catalog,
/// and leftovers are only orphaned files.
pub(crate) async fn delete_metadata_files(table: &Table) {
    let keep_data = HashMap::from([("gc.enabled".to_string(), "false".to_string())]);
    let metadata = table
        .metadata()
        .clone()
        .into_builder(None)
        .set_properties(keep_data)
        .and_then(|b| b.build());
    let Ok(metadata) = metadata else { return };
    let mut builder = Table::builder()
        .file_io(table.file_io().clone())
        .metadata(metadata.metadata)
        .identifier(table.identifier().clone());
    if let Some(location) = table.metadata_location() {
        builder = builder.metadata_location(location.to_string());
    }
    if let Ok(runtime) = iceberg::Runtime::try_current() {
        builder = builder.runtime(runtime);
    }
    if let Ok(copy) = builder.build() {
        let _ = iceberg::drop_table_data(&copy).await;
    }
}

#[cfg(test)]
mod tests {
    use iceberg::spec::{NestedField, PrimitiveType};

    use super::*;

    fn schema(fields: Vec<NestedField>) -> Schema {
        Schema::builder()
            .with_fields(fields.into_iter().map(Arc::new))
            .build()
            .unwrap()
    }

    fn int() -> Type {
        Type::Primitive(PrimitiveType::Int)
    }

    #[test]
    fn drift_names_each_column() {
        let target = schema(vec![
            NestedField::required(1, "id", int()),
            NestedField::required(2, "amount", int()),
            NestedField::optional(3, "note", Type::Primitive(PrimitiveType::String)),
        ]);
        assert!(schema_drift(&target, &target).is_empty());
        let staging = schema(vec![
            NestedField::optional(1, "id", int()),
            NestedField::required(2, "amount", Type::Primitive(PrimitiveType::Long)),
            NestedField::optional(4, "extra", int()),
        ]);
        let drift = schema_drift(&staging, &target);
        assert_eq!(drift, vec![
            "schema drift: column 'id' is required in the target but optional in the staging table",
            "schema drift: column 'amount' is int in the target but long in the staging table",
            "schema drift: column 'note' (field id 3) of the target is missing from the staging table",
            "schema drift: column 'extra' (field id 4) is in the staging table but not in the target",
        ]);
    }
}
