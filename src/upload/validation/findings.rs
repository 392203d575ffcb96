//! Row-level findings of a validation, kept in an Iceberg table of their own
//! (`staging.findings_<id>`) beside the staging table, so any process can
//! read them and they go away with the upload.

use datafusion::arrow::array::RecordBatch;
use futures::TryStreamExt;
use iceberg::{NamespaceIdent, TableCreation, TableIdent};

use crate::catalog::IcebergCatalog;
use crate::catalog::bridge::insert::append_stored;
use crate::error::Result;
use crate::rows::{StoredRow, result_row};
use crate::upload::{STAGING_NAMESPACE, UploadId};

/// Prefix of a findings table's name; the upload id follows.
pub const FINDINGS_TABLE_PREFIX: &str = "findings_";

/// One rule violation.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Finding {
    /// The rule's name (`schema`, `not_null`, or a constraint name).
    pub(crate) rule: String,
    /// `check`, `unique`, `not_null`, ...
    pub(crate) kind: String,
    /// Which row: its key columns (`id=7`) or file and position.
    pub(crate) row: String,
    /// The data file holding the row, when known.
    pub(crate) file: Option<String>,
    /// The row's position in that file, when known.
    pub(crate) position: Option<i64>,
    /// The offending values, as a JSON object.
    pub(crate) values: String,
    /// What is wrong, in words.
    pub(crate) message: String,
}

result_row! {
    /// One rule violation of an upload: a row of `upload_findings(id)`.
    #[derive(Debug, Clone, PartialEq)]
    pub struct UploadFinding {
        /// The session validated.
        pub upload_id: UploadId,
        /// The rule's name (`schema`, `not_null`, or a constraint's name).
        pub rule: String,
        /// `check`, `unique`, `not_null`, ...
        pub kind: String,
        /// Which row: its key columns (`id=7`), or file and position.
        pub row: String,
        /// The data file holding the row, when known.
        pub file: Option<String>,
        /// The row's position in that file, when known.
        pub position: Option<i64>,
        /// The offending values, as a JSON object.
        pub values: String => json,
        /// What is wrong, in words.
        pub message: String,
    }
}

impl Finding {
    /// The finding as a row of upload `upload`'s findings.
    pub(crate) fn of_upload(self, upload: &UploadId) -> UploadFinding {
        UploadFinding {
            upload_id: upload.clone(),
            rule: self.rule,
            kind: self.kind,
            row: self.row,
            file: self.file,
            position: self.position,
            values: self.values,
            message: self.message,
        }
    }
}

impl From<UploadFinding> for Finding {
    fn from(row: UploadFinding) -> Self {
        Self {
            rule: row.rule,
            kind: row.kind,
            row: row.row,
            file: row.file,
            position: row.position,
            values: row.values,
            message: row.message,
        }
    }
}

pub(crate) fn findings_ident(id: &UploadId) -> TableIdent {
    TableIdent::new(
        NamespaceIdent::new(STAGING_NAMESPACE.to_string()),
        format!("{FINDINGS_TABLE_PREFIX}{id}"),
    )
}

/// Replaces the findings of upload `id` with `findings`.
pub(crate) async fn replace(
    catalog: &IcebergCatalog,
    id: &UploadId,
    findings: &[Finding],
) -> Result<()> {
    discard(catalog, id).await?;
    let ident = findings_ident(id);
    let creation = TableCreation::builder()
        .name(ident.name().to_string())
        .schema(UploadFinding::iceberg_schema()?)
        .build();
    let table = catalog
        .catalog()
        .create_table(ident.namespace(), creation)
        .await?;
    if findings.is_empty() {
        return Ok(());
    }
    let rows: Vec<UploadFinding> = findings.iter().map(|f| f.clone().of_upload(id)).collect();
    append_stored(catalog, &table, &rows).await
}

/// Removes the findings of upload `id`, with their files.
pub(crate) async fn discard(catalog: &IcebergCatalog, id: &UploadId) -> Result<()> {
    catalog.purge_if_exists(&findings_ident(id)).await
}

/// The findings of upload `id`, or `None` when it has none recorded.
pub(crate) async fn read(catalog: &IcebergCatalog, id: &UploadId) -> Result<Option<Vec<Finding>>> {
    let Some(table) = catalog.load_if_present(&findings_ident(id)).await? else {
        return Ok(None);
    };
    let batches: Vec<RecordBatch> = table
        .scan()
        .build()?
        .to_arrow()
        .await?
        .try_collect()
        .await?;
    let name = findings_ident(id).to_string();
    let mut findings = vec![];
    for batch in &batches {
        findings.extend(
            UploadFinding::from_batch(&name, batch)?
                .into_iter()
                .map(Finding::from),
        );
    }
    findings.sort_by(|a, b| {
        (&a.rule, &a.file, a.position, &a.row).cmp(&(&b.rule, &b.file, b.position, &b.row))
    });
    Ok(Some(findings))
}
