//! `COPY INTO <table> FROM '<uri>' [WITH (...)]`: lands files as an Iceberg
//! table, exactly once per file.
//!
//! The table is created from the files' schema when missing. The selected
//! files are read (one task per file, as many at once as there are cores) and
//! written as the table's own Parquet files (streaming), then appended in one
//! commit. Which files were loaded (URI,
//! size, ETag or version) is recorded in the catalog's `icestage.copy_log`
//! table under a copy id that the commit's snapshot also carries: a log row
//! counts only once its copy id is proven, by that snapshot or by the
//! `committed` marker written after it. Running the statement again loads
//! only files not loaded before; a file changed in place (same URI, other
//! size or ETag) is reported, not loaded, unless `force = true`.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::Utc;
use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionContext;
use futures::{StreamExt, TryStreamExt};
use iceberg::expr::Reference;
use iceberg::spec::{DataFile, Datum, NestedField, PrimitiveType, Schema, Type};
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableCreation, TableIdent};

use super::options::SourceOptions;
use super::read::{PrefixTable, Source};
use super::source::{Access, SourceFile, select};
use crate::catalog::IcebergCatalog;
use crate::catalog::commit::{append_once, snapshot_with};
use crate::catalog::insert::append_rows;
use crate::catalog::writer::write_rows;
use crate::error::{Error, Result};
use crate::rows::{Value, result_row};
use crate::session::CommandContext;
use crate::session::is_missing;
use crate::session::log::ICESTAGE_NAMESPACE;
use crate::tables::ddl::iceberg_schema;

/// Snapshot summary key carrying the copy id.
pub const SNAPSHOT_COPY_ID: &str = "icestage.copy-id";
/// Name of the copy log table (in the `icestage` namespace).
pub const COPY_LOG_TABLE: &str = "copy_log";

fn log_ident() -> TableIdent {
    TableIdent::new(
        NamespaceIdent::new(ICESTAGE_NAMESPACE.to_string()),
        COPY_LOG_TABLE.to_string(),
    )
}

fn log_schema() -> Result<Schema> {
    let string = || Type::Primitive(PrimitiveType::String);
    let fields = vec![
        NestedField::required(1, "target_table", string()),
        NestedField::required(2, "file", string()),
        NestedField::optional(3, "size", Type::Primitive(PrimitiveType::Long)),
        NestedField::optional(4, "etag", string()),
        NestedField::optional(5, "version", string()),
        NestedField::required(6, "copy_id", string()),
        NestedField::required(7, "state", string()),
        NestedField::required(
            8,
            "recorded_at",
            Type::Primitive(PrimitiveType::Timestamptz),
        ),
    ];
    Ok(Schema::builder()
        .with_fields(fields.into_iter().map(Arc::new))
        .build()?)
}

async fn log_table(catalog: &IcebergCatalog) -> Result<Table> {
    catalog.table_or_create(&log_ident(), log_schema).await
}

/// One file as the log knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Loaded {
    size: Option<i64>,
    etag: Option<String>,
}

/// The files loaded into `target` by proven copies: URI → size and ETag.
async fn loaded_files(catalog: &IcebergCatalog, target: &Table) -> Result<HashMap<String, Loaded>> {
    let table = match catalog.catalog().load_table(&log_ident()).await {
        Ok(table) => table,
        Err(e) if is_missing(&e) => return Ok(HashMap::new()),
        Err(e) => return Err(e.into()),
    };
    let name = target.identifier().to_string();
    let batches: Vec<RecordBatch> = table
        .scan()
        .with_filter(Reference::new("target_table").equal_to(Datum::string(&name)))
        .build()?
        .to_arrow()
        .await?
        .try_collect()
        .await?;
    let mut rows: Vec<(String, String, String, Loaded)> = vec![];
    for batch in &batches {
        let text = |name: &str| -> Result<Arc<dyn Array>> {
            Ok(cast(
                batch.column_by_name(name).expect("log column"),
                &DataType::Utf8,
            )?)
        };
        let (file, copy, state, etag) = (
            text("file")?,
            text("copy_id")?,
            text("state")?,
            text("etag")?,
        );
        let size = cast(
            batch.column_by_name("size").expect("log column"),
            &DataType::Int64,
        )?;
        let (file, copy, state, etag) = (
            file.as_string::<i32>(),
            copy.as_string::<i32>(),
            state.as_string::<i32>(),
            etag.as_string::<i32>(),
        );
        let size = size.as_primitive::<Int64Type>();
        for row in 0..batch.num_rows() {
            rows.push((
                file.value(row).to_string(),
                copy.value(row).to_string(),
                state.value(row).to_string(),
                Loaded {
                    size: size.is_valid(row).then(|| size.value(row)),
                    etag: etag.is_valid(row).then(|| etag.value(row).to_string()),
                },
            ));
        }
    }
    let committed: std::collections::HashSet<String> = rows
        .iter()
        .filter(|(_, copy, state, _)| {
            state == "committed" || snapshot_with(target, SNAPSHOT_COPY_ID, copy).is_some()
        })
        .map(|(_, copy, _, _)| copy.clone())
        .collect();
    Ok(rows
        .into_iter()
        .filter(|(file, copy, _, _)| !file.is_empty() && committed.contains(copy))
        .map(|(file, _, _, loaded)| (file, loaded))
        .collect())
}

async fn log_rows(
    catalog: &IcebergCatalog,
    target: &str,
    copy_id: &str,
    state: &str,
    files: &[SourceFile],
) -> Result<()> {
    let table = log_table(catalog).await?;
    let now = Some(Utc::now());
    let rows: Vec<Vec<Value>> = if files.is_empty() {
        vec![vec![
            Value::from(target),
            Value::from(""),
            Value::Int(None),
            Value::Str(None),
            Value::Str(None),
            Value::from(copy_id),
            Value::from(state),
            Value::from(now),
        ]]
    } else {
        files
            .iter()
            .map(|f| {
                vec![
                    Value::from(target),
                    Value::from(f.uri.clone()),
                    Value::from(f.meta.size as i64),
                    Value::from(f.etag().map(str::to_string)),
                    Value::from(f.meta.version.clone()),
                    Value::from(copy_id),
                    Value::from(state),
                    Value::from(now),
                ]
            })
            .collect()
    };
    append_rows(catalog, &table, &rows).await
}

/// The table `ident`, created from `source`'s columns when missing.
async fn target_table(
    catalog: &IcebergCatalog,
    ident: &TableIdent,
    source: &Source,
) -> Result<(Table, bool)> {
    match catalog.catalog().load_table(ident).await {
        Ok(table) => return Ok((table, false)),
        Err(e) if is_missing(&e) => {}
        Err(e) => return Err(e.into()),
    }
    catalog.ensure_namespace(ident.namespace()).await?;
    let creation = TableCreation::builder()
        .name(ident.name().to_string())
        .schema(iceberg_schema(&source.schema)?)
        .build();
    Ok((
        catalog
            .catalog()
            .create_table(ident.namespace(), creation)
            .await?,
        true,
    ))
}

/// The staged rows of `source` as the target's columns, checked by name.
fn projection(target: &Table, source: &Source) -> Result<Vec<String>> {
    let schema = target.metadata().current_schema();
    let mut select = vec![];
    let mut missing = vec![];
    for field in schema.as_struct().fields() {
        let quoted = format!("\"{}\"", field.name.replace('"', "\"\""));
        let arrow_type = iceberg::arrow::type_to_arrow_type(&field.field_type)?;
        if source.schema.field_with_name(&field.name).is_ok() {
            select.push(format!(
                "CAST({quoted} AS {}) AS {quoted}",
                sql_type(&arrow_type)?
            ));
        } else if field.required {
            missing.push(field.name.clone());
        } else {
            select.push(format!(
                "CAST(NULL AS {}) AS {quoted}",
                sql_type(&arrow_type)?
            ));
        }
    }
    if !missing.is_empty() {
        return Err(Error::invalid(format!(
            "the files have no column {} that {} requires: the files' columns are {}",
            missing.join(", "),
            target.identifier(),
            source
                .schema
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let extra: Vec<String> = source
        .schema
        .fields()
        .iter()
        .filter(|f| schema.field_by_name(f.name()).is_none())
        .map(|f| f.name().clone())
        .collect();
    if !extra.is_empty() {
        return Err(Error::invalid(format!(
            "the files have column(s) {} that {} lacks: add them to the table, or load into a new table",
            extra.join(", "),
            target.identifier()
        )));
    }
    Ok(select)
}

/// The SQL spelling DataFusion casts to for an Arrow type of an Iceberg column.
fn sql_type(data_type: &DataType) -> Result<String> {
    Ok(match data_type {
        DataType::Boolean => "BOOLEAN".into(),
        DataType::Int32 => "INT".into(),
        DataType::Int64 => "BIGINT".into(),
        DataType::Float32 => "REAL".into(),
        DataType::Float64 => "DOUBLE".into(),
        DataType::Decimal128(p, s) => format!("DECIMAL({p}, {s})"),
        DataType::Date32 => "DATE".into(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "VARCHAR".into(),
        DataType::Binary | DataType::LargeBinary => "BYTEA".into(),
        DataType::Timestamp(_, None) => "TIMESTAMP".into(),
        DataType::Timestamp(_, Some(_)) => "TIMESTAMP WITH TIME ZONE".into(),
        other => {
            return Err(Error::NotSupported(format!(
                "COPY INTO cannot load columns of type {other} yet: load into a table without them"
            )));
        }
    })
}

/// Writes the rows of `source` as data files of `target`.
async fn copy_file(
    target: &Table,
    source: Arc<Source>,
    file_prefix: &str,
) -> Result<Vec<DataFile>> {
    let select = projection(target, &source)?;
    let session = SessionContext::new();
    session.register_table("source", Arc::new(PrefixTable::new(source)))?;
    let frame = session
        .sql(&format!("SELECT {} FROM source", select.join(", ")))
        .await?;
    let stream = frame.execute_stream().await?.map_err(Error::from);
    write_rows(target, file_prefix, stream).await
}

pub(crate) async fn copy_into(
    ctx: &CommandContext,
    catalog: &str,
    ident: &TableIdent,
    uri: &str,
    options: &SourceOptions,
) -> Result<CopyReport> {
    let catalog = ctx.icestage.catalog(catalog)?;
    let access = Access::open(uri, options).await?;
    let (files, format) = select(&access, uri, options).await?;
    let existing = match catalog.catalog().load_table(ident).await {
        Ok(table) => Some(table),
        Err(e) if is_missing(&e) => None,
        Err(e) => return Err(e.into()),
    };
    let loaded = match &existing {
        Some(table) => loaded_files(catalog, table).await?,
        None => HashMap::new(),
    };
    let mut to_load = vec![];
    let mut skipped = 0i64;
    let mut changed = vec![];
    for file in files {
        let now = Loaded {
            size: Some(file.meta.size as i64),
            etag: file.etag().map(str::to_string),
        };
        match loaded.get(&file.uri) {
            _ if options.force => to_load.push(file),
            None => to_load.push(file),
            Some(before) if *before == now => skipped += 1,
            Some(_) => changed.push(file.uri.clone()),
        }
    }
    let name = ident.to_string();
    let changed_note = if changed.is_empty() {
        String::new()
    } else {
        changed.sort();
        format!(
            "; {} file(s) changed since they were loaded and were not loaded again ({}): use WITH (force = true) to reload",
            changed.len(),
            changed.join(", ")
        )
    };
    if to_load.is_empty() {
        return Ok(CopyReport {
            files_loaded: 0,
            files_skipped: skipped,
            files_changed: changed.len() as i64,
            rows: 0,
            snapshot_id: None,
            table_created: false,
            message: format!("nothing new to load into {name}{changed_note}"),
        });
    }

    let progress = ctx.progress();
    progress.start(
        to_load.len() as u64,
        to_load.iter().map(|f| f.meta.size).sum(),
    );
    let first = Arc::new(
        Source::of_files(access.clone(), vec![to_load[0].clone()], format, options).await?,
    );
    let (target, created) = match existing {
        Some(table) => (table, false),
        None => target_table(catalog, ident, &first).await?,
    };
    let copy_id = uuid::Uuid::new_v4().to_string();
    // Files are read and written on their own tasks, as many at once as
    // there are cores; each streams, so memory grows with that count only.
    let parallel = std::thread::available_parallelism().map_or(1, usize::from);
    let mut copies = futures::stream::iter(to_load.iter().cloned().enumerate())
        .map(|(n, file)| {
            let first = (n == 0).then(|| Arc::clone(&first));
            let (access, target, options) = (access.clone(), target.clone(), options.clone());
            let prefix = format!("icestage-copy-{copy_id}-{n:05}");
            tokio::spawn(async move {
                let size = file.meta.size;
                let source = match first {
                    Some(source) => source,
                    None => Arc::new(Source::of_files(access, vec![file], format, &options).await?),
                };
                Ok::<_, Error>((copy_file(&target, source, &prefix).await?, size))
            })
        })
        .buffered(parallel);
    let mut data_files = vec![];
    let mut rows = 0i64;
    while let Some(copied) = copies.next().await {
        let (written, size) =
            copied.map_err(|e| Error::from(DataFusionError::ExecutionJoin(Box::new(e))))??;
        rows += written.iter().map(|f| f.record_count() as i64).sum::<i64>();
        data_files.extend(written);
        progress.advance(1, size);
    }
    log_rows(catalog, &name, &copy_id, "pending", &to_load).await?;
    let (snapshot_id, _) =
        append_once(catalog, &target, data_files, SNAPSHOT_COPY_ID, &copy_id).await?;
    log_rows(catalog, &name, &copy_id, "committed", &[]).await?;
    progress.finish();
    Ok(CopyReport {
        files_loaded: to_load.len() as i64,
        files_skipped: skipped,
        files_changed: changed.len() as i64,
        rows,
        snapshot_id: Some(snapshot_id),
        table_created: created,
        message: format!(
            "loaded {} file(s), {rows} row(s) into {name}{}{changed_note}",
            to_load.len(),
            if created { " (created)" } else { "" }
        ),
    })
}

result_row! {
    /// What `COPY INTO` loaded.
    #[derive(Debug, Clone, PartialEq)]
    pub struct CopyReport {
        /// Files loaded by this statement.
        pub files_loaded: i64,
        /// Files skipped: loaded before, unchanged.
        pub files_skipped: i64,
        /// Files loaded before that changed since, not loaded again (see
        /// `force`).
        pub files_changed: i64,
        /// Rows loaded.
        pub rows: i64,
        /// The table's snapshot holding them (none when nothing was new).
        pub snapshot_id: Option<i64>,
        /// Whether the statement created the table.
        pub table_created: bool,
        /// What happened, in words.
        pub message: String,
    }
}
