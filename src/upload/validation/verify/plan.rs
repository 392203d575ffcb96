//! What to read and prove, shared by every chunk: the target's schema, the
//! staged field ids, the partition spec and the CHECK rules compiled once.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef as ArrowSchemaRef;
use datafusion::physical_expr::PhysicalExpr;
use iceberg::arrow::{RecordBatchPartitionSplitter, schema_to_arrow_schema};
use iceberg::spec::{Schema, SchemaRef};
use iceberg::table::Table;

use crate::error::{Error, Result};
use crate::upload::validation::drift::Matching;

/// One CHECK rule as verification evaluates it.
pub(crate) struct Check {
    pub(crate) name: String,
    pub(crate) predicate: String,
    pub(crate) expr: Arc<dyn PhysicalExpr>,
    /// The columns it reads, sorted, for findings.
    pub(crate) columns: Vec<String>,
}

impl Check {
    pub(crate) fn new(name: String, predicate: String, expr: Arc<dyn PhysicalExpr>) -> Self {
        let mut columns: Vec<String> = datafusion::physical_expr::utils::collect_columns(&expr)
            .iter()
            .map(|c| c.name().to_string())
            .collect();
        columns.sort();
        columns.dedup();
        Self {
            name,
            predicate,
            expr,
            columns,
        }
    }
}

/// The CHECK rules (name, predicate) compiled against `target`'s columns.
pub(crate) fn compile_checks(target: &Table, checks: &[(String, String)]) -> Result<Vec<Check>> {
    let arrow = schema_to_arrow_schema(target.metadata().current_schema())?;
    let schema = datafusion::common::DFSchema::try_from(arrow)?;
    let ctx = datafusion::prelude::SessionContext::new();
    checks
        .iter()
        .map(|(name, predicate)| {
            let expr = ctx.parse_sql_expr(predicate, &schema)?;
            Ok(Check::new(
                name.clone(),
                predicate.clone(),
                ctx.create_physical_expr(expr, &schema)?,
            ))
        })
        .collect()
}

/// What to read and prove, shared by every chunk.
pub(crate) struct Plan {
    /// The target's schema; batches are conformed to it.
    pub(crate) target: SchemaRef,
    /// The target's schema in Arrow form, with field ids.
    pub(crate) arrow: ArrowSchemaRef,
    /// For each top-level target column (by position), the field id its
    /// values carry in the staged files.
    pub(crate) staged_ids: Vec<i32>,
    /// The target's partition spec, when it is partitioned.
    pub(crate) splitter: Option<Arc<RecordBatchPartitionSplitter>>,
    /// The target's default partition spec id.
    pub(crate) spec_id: i32,
    /// Its partition type, when it is partitioned.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) partition_type: Option<iceberg::spec::StructType>,
    /// The CHECK rules, compiled against the conformed batch.
    pub(crate) checks: Vec<Check>,
    /// Columns that identify a row in findings (the first UNIQUE key).
    pub(crate) key: Vec<String>,
}

impl Plan {
    /// A plan for files staged for `target`, whose columns carry the
    /// `staging` schema's field ids.
    pub(crate) fn new(
        target: &Table,
        staging: &Schema,
        matching: Matching,
        checks: Vec<Check>,
        key: Vec<String>,
    ) -> Result<Self> {
        let metadata = target.metadata();
        let schema = Arc::clone(metadata.current_schema());
        let arrow = Arc::new(schema_to_arrow_schema(&schema)?);
        let staged_ids =
            schema
                .as_struct()
                .fields()
                .iter()
                .map(|field| match matching {
                    Matching::ById => Ok(field.id),
                    Matching::ByName => staging
                        .field_by_name(&field.name)
                        .map(|f| f.id)
                        .ok_or_else(|| {
                            Error::invalid(format!(
                                "the staging table has no column '{}' of the target",
                                field.name
                            ))
                        }),
                })
                .collect::<Result<Vec<_>>>()?;
        let spec = metadata.default_partition_spec();
        let splitter = if spec.is_unpartitioned() {
            None
        } else {
            Some(Arc::new(
                RecordBatchPartitionSplitter::try_new_with_computed_values(
                    Arc::clone(&schema),
                    Arc::clone(spec),
                )?,
            ))
        };
        let partition_type = if spec.is_unpartitioned() {
            None
        } else {
            Some(spec.partition_type(&schema)?)
        };
        Ok(Self {
            target: schema,
            arrow,
            staged_ids,
            splitter,
            spec_id: metadata.default_partition_spec_id(),
            partition_type,
            checks,
            key,
        })
    }
}
