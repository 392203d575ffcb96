//! The sqllogictest runner: every `sql/*.slt` file runs in a fresh
//! warehouse, through icestage's own parse → plan → execute path.
//!
//! A record may end with `\gset [prefix]` to keep the columns of its one
//! result row as variables (`:name`, `:'name'`), as in the shell; variables
//! are shared by all connections of a file, and each `connection <name>`
//! is a separate session on the same catalog (as another process would be).
//!
//! Volatile values are masked before comparing: upload ids read as
//! `<upload_id>`, snapshot ids (15 or more digits) as `<snapshot_id>`, the
//! repository's folder as `<repo>`. Files run with the repository as the
//! working directory, so `'sql/data/...'` paths reach the fixtures.
//!
//! Set `ICESTAGE_SLT_COMPLETE=1` to rewrite the expected results from the
//! actual ones (then review the diff).

use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex};

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::prelude::SessionContext;
use icestage::sql::script::{ScriptItem, Variables, split_script};
use regex::Regex;
use sqllogictest::{DBOutput, DefaultColumnType};

use crate::common::{Warehouse, repo};

#[derive(Debug)]
struct SltError(String);

impl std::fmt::Display for SltError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SltError {}

struct IcestageDb {
    ctx: SessionContext,
    vars: Arc<Mutex<Variables>>,
}

fn message(error: icestage::Error) -> SltError {
    SltError(error.user_message())
}

fn column_type(data_type: &DataType) -> DefaultColumnType {
    match data_type {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64 => DefaultColumnType::Integer,
        DataType::Float16 | DataType::Float32 | DataType::Float64 | DataType::Decimal128(_, _) => {
            DefaultColumnType::FloatingPoint
        }
        _ => DefaultColumnType::Text,
    }
}

fn rows(batches: &[RecordBatch]) -> Result<DBOutput<DefaultColumnType>, SltError> {
    let Some(first) = batches.first() else {
        return Ok(DBOutput::StatementComplete(0));
    };
    let schema = first.schema();
    if schema.fields().is_empty() {
        return Ok(DBOutput::StatementComplete(0));
    }
    let types = schema
        .fields()
        .iter()
        .map(|f| column_type(f.data_type()))
        .collect();
    let options = FormatOptions::default().with_null("NULL");
    let mut out = vec![];
    for batch in batches {
        let formatters = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| SltError(e.to_string()))?;
        for row in 0..batch.num_rows() {
            out.push(
                formatters
                    .iter()
                    .map(|f| {
                        let v = f.value(row).to_string();
                        if v.is_empty() {
                            "(empty)".to_string()
                        } else {
                            v
                        }
                    })
                    .collect(),
            );
        }
    }
    Ok(DBOutput::Rows { types, rows: out })
}

#[async_trait]
impl sqllogictest::AsyncDB for IcestageDb {
    type Error = SltError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, SltError> {
        let (mut items, rest) = split_script(sql);
        if !rest.trim().is_empty() {
            items.push(ScriptItem::Sql {
                text: rest.trim().to_string(),
                gset: None,
            });
        }
        let mut output = DBOutput::StatementComplete(0);
        for item in items {
            let ScriptItem::Sql { text, gset } = item else {
                return Err(SltError(format!(
                    "backslash commands are not supported here: {item:?}"
                )));
            };
            let sql = self.vars.lock().unwrap().interpolate(&text);
            let frame = icestage::sql(&self.ctx, &sql).await.map_err(message)?;
            let batches = frame
                .collect()
                .await
                .map_err(|e| SltError(icestage::error_message(&e)))?;
            output = match gset {
                Some(prefix) => {
                    self.vars
                        .lock()
                        .unwrap()
                        .set_from_result(&prefix, &batches)
                        .map_err(message)?;
                    DBOutput::StatementComplete(0)
                }
                None => rows(&batches)?,
            };
        }
        Ok(output)
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "icestage"
    }
}

/// The default normalizer after masking volatile values.
#[allow(clippy::ptr_arg)]
fn normalize(text: &String) -> String {
    static UPLOAD_ID: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\b[0-9a-f]{32}\b").unwrap());
    static SNAPSHOT_ID: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\b[0-9]{15,}\b").unwrap());
    let masked = UPLOAD_ID.replace_all(text, "<upload_id>");
    let masked = SNAPSHOT_ID.replace_all(&masked, "<snapshot_id>");
    let masked = masked.replace(repo().to_str().expect("a UTF-8 path"), "<repo>");
    sqllogictest::default_normalizer(&masked)
}

fn slt_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("sql"))
        .expect("sql/ folder")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .collect();
    files.sort();
    files
}

async fn run_file(path: PathBuf) -> Result<(), String> {
    let warehouse = Arc::new(Warehouse::new());
    let vars = Arc::new(Mutex::new(Variables::default()));
    let connect = {
        let warehouse = Arc::clone(&warehouse);
        move || {
            let warehouse = Arc::clone(&warehouse);
            let vars = Arc::clone(&vars);
            async move {
                Ok(IcestageDb {
                    ctx: warehouse.session().await,
                    vars,
                })
            }
        }
    };
    let mut runner = sqllogictest::Runner::new(connect);
    runner.with_normalizer(normalize);
    if std::env::var_os("ICESTAGE_SLT_COMPLETE").is_some() {
        runner
            .update_test_file(
                &path,
                " ",
                sqllogictest::default_validator,
                normalize,
                sqllogictest::default_column_validator,
            )
            .await
            .map_err(|e| e.to_string())
    } else {
        runner
            .run_file_async(&path)
            .await
            .map_err(|e| e.display(false).to_string())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sql_logic_tests() {
    let files = slt_files();
    assert!(!files.is_empty(), "no .slt files under sql/");
    let mut failures = vec![];
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        match run_file(path).await {
            Ok(()) => println!("ok   {name}"),
            Err(e) => failures.push(format!("FAIL {name}\n{e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
