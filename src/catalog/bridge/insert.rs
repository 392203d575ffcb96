//! `INSERT INTO` an Iceberg table, and appends of icestage's own rows.
//!
//! Tables are scanned through iceberg-datafusion's provider, but written
//! with icestage's writer: each partition of the input streams into Parquet
//! files on its own task (the table's codec, zstd by default; split by its
//! partition spec; a null in a NOT NULL column refused by name), then one
//! `fast_append` commits them all. iceberg-datafusion's own insert writes
//! uncompressed files, stores the type's default (an empty string, a zero)
//! where a NOT NULL column is given a null, and checks every manifest of the
//! table for duplicates on each commit.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::{Constraints, Statistics};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown, TableType};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use iceberg::TableIdent;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::table::Table;

use crate::catalog::IcebergCatalog;
use crate::catalog::Owner;
use crate::catalog::bridge::writer::{write_partitions, write_rows};
use crate::catalog::commit::append_files;
use crate::error::Result;
use crate::rows::one_batch;
use crate::rows::{StoredRow, Value, batch};

/// An Iceberg table as DataFusion sees it: iceberg-datafusion's provider for
/// reading, [`insert_into`] for `INSERT INTO`.
#[derive(Debug)]
pub(crate) struct IcebergTable {
    inner: Arc<dyn TableProvider>,
    catalog: Arc<IcebergCatalog>,
    ident: TableIdent,
}

impl IcebergTable {
    pub(crate) fn new(
        inner: Arc<dyn TableProvider>,
        catalog: Arc<IcebergCatalog>,
        ident: TableIdent,
    ) -> Self {
        Self {
            inner,
            catalog,
            ident,
        }
    }
}

#[async_trait]
impl TableProvider for IcebergTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }

    fn constraints(&self) -> Option<&Constraints> {
        self.inner.constraints()
    }

    fn table_type(&self) -> TableType {
        self.inner.table_type()
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        // Iceberg binds predicates to primitive fields only (`photo IS NULL`
        // on a struct fails to bind): those filters stay with DataFusion,
        // which applies every filter above the scan anyway (all are Inexact).
        let schema = self.inner.schema();
        let bindable: Vec<Expr> = filters
            .iter()
            .filter(|filter| {
                filter.column_refs().iter().all(|column| {
                    schema
                        .field_with_name(&column.name)
                        .is_ok_and(|field| !field.data_type().is_nested())
                })
            })
            .cloned()
            .collect();
        self.inner.scan(state, projection, &bindable, limit).await
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DFResult<Vec<TableProviderFilterPushDown>> {
        self.inner.supports_filters_pushdown(filters)
    }

    fn statistics(&self) -> Option<Statistics> {
        self.inner.statistics()
    }

    async fn insert_into(
        &self,
        _state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: InsertOp,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        if insert_op != InsertOp::Append {
            return Err(DataFusionError::Plan(format!(
                "{insert_op} into Iceberg table {} is not supported: Iceberg tables here take \
                 appends (INSERT INTO); to replace the rows, DROP TABLE {} and recreate it with \
                 CREATE TABLE ... AS SELECT",
                self.ident, self.ident
            )));
        }
        Ok(Arc::new(InsertExec::new(
            Arc::clone(&self.catalog),
            self.ident.clone(),
            input,
        )))
    }
}

/// `input` spread over `cores` partitions when it has fewer, so that as
/// many writers run: encoding and compressing Parquet is the work. (Plans
/// the planner optimizes get this from [`InsertExec`]'s wish.)
pub(crate) fn writer_per_core(
    input: Arc<dyn ExecutionPlan>,
    cores: usize,
) -> DFResult<Arc<dyn ExecutionPlan>> {
    if input.properties().output_partitioning().partition_count() >= cores {
        return Ok(input);
    }
    Ok(Arc::new(RepartitionExec::try_new(
        input,
        Partitioning::RoundRobinBatch(cores),
    )?))
}

/// Writes the partitions of `input` into Iceberg table `ident` and commits
/// them in one append; returns the number of rows.
pub(crate) async fn insert_into(
    catalog: &IcebergCatalog,
    ident: &TableIdent,
    input: Arc<dyn ExecutionPlan>,
    task: Arc<TaskContext>,
) -> Result<u64> {
    let table = catalog.catalog().load_table(ident).await?;
    let prefix = format!("icestage-insert-{}", uuid::Uuid::new_v4());
    let files = write_partitions(&table, &prefix, input, task, None).await?;
    let rows = files.iter().map(|f| f.record_count()).sum();
    if !files.is_empty() {
        let appended = append_files(catalog, &table, files).await?;
        catalog.appended(appended, Owner::User);
    }
    Ok(rows)
}

/// Appends `rows` to `table`, the icestage table whose schema their type
/// gives (see [`StoredRow`]); as [`append_rows`].
pub(crate) async fn append_stored<R: StoredRow>(
    catalog: &IcebergCatalog,
    table: &Table,
    rows: &[R],
) -> Result<()> {
    let values: Vec<Vec<Value>> = rows.iter().map(StoredRow::values).collect();
    append_rows(catalog, table, &values).await
}

/// The rows of icestage's own table `ident` about target table `target`
/// (its `target_table` column, what such a table is partitioned by), read
/// back as their type; none when the table was never made.
pub(crate) async fn stored_rows_of<R: StoredRow>(
    catalog: &dyn iceberg::Catalog,
    ident: &TableIdent,
    target: &str,
) -> Result<Vec<R>> {
    use futures::TryStreamExt;
    use iceberg::expr::Reference;
    use iceberg::spec::Datum;

    let table = match catalog.load_table(ident).await {
        Ok(table) => table,
        Err(e) if crate::catalog::is_missing(&e) => return Ok(vec![]),
        Err(e) => return Err(e.into()),
    };
    let batches: Vec<RecordBatch> = table
        .scan()
        .with_filter(Reference::new("target_table").equal_to(Datum::string(target)))
        .build()?
        .to_arrow()
        .await?
        .try_collect()
        .await?;
    let name = ident.to_string();
    let mut rows = vec![];
    for batch in &batches {
        rows.extend(R::from_batch(&name, batch)?);
    }
    Ok(rows)
}

/// Appends `rows` (a few log rows, values in the order of the table's
/// columns) to `table`, one of icestage's own tables. The rows of this
/// process's appends that queue for one table go in one commit (a group
/// commit, [`crate::catalog::commit::group`]).
pub(crate) async fn append_rows(
    catalog: &IcebergCatalog,
    table: &Table,
    rows: &[Vec<Value>],
) -> Result<()> {
    let local = catalog.local();
    // Boxed, as in `append_once`: a grouped commit nests deep.
    let grouped = Box::pin(local.row_appends.join(
        &local.turns,
        &table.identifier().to_string(),
        rows.to_vec(),
        |members| async move {
            let all: Vec<Vec<Value>> = members
                .iter()
                .flat_map(|m| m.work.iter().cloned())
                .collect();
            let appended = commit_rows(catalog, table, &all).await;
            // On an error, each member meets its own alone.
            let done = appended.as_ref().ok().map(|_| ());
            members.into_iter().for_each(|m| m.answer(done));
            // The members have their answers; the upkeep is the leader's.
            if let Ok(appended) = appended {
                catalog.appended(appended, Owner::Icestage);
            }
        },
    ))
    .await;
    match grouped {
        Some(()) => Ok(()),
        None => Box::pin(append_rows_alone(catalog, table, rows)).await,
    }
}

/// [`append_rows`] in a commit of its own.
async fn append_rows_alone(
    catalog: &IcebergCatalog,
    table: &Table,
    rows: &[Vec<Value>],
) -> Result<()> {
    let appended = commit_rows(catalog, table, rows).await?;
    catalog.appended(appended, Owner::Icestage);
    Ok(())
}

/// Writes `rows` into one file and appends it to `table`; the table as
/// committed.
async fn commit_rows(
    catalog: &IcebergCatalog,
    table: &Table,
    rows: &[Vec<Value>],
) -> Result<Table> {
    let schema = Arc::new(schema_to_arrow_schema(table.metadata().current_schema())?);
    let prefix = format!("icestage-{}", uuid::Uuid::new_v4());
    let rows = futures::stream::iter([batch(schema, rows)]);
    let files = write_rows(table, &prefix, rows).await?;
    append_files(catalog, table, files).await
}

/// The plan of an `INSERT INTO` an Iceberg table: one output partition with
/// one row, `count`, as DataFusion's sinks answer.
#[derive(Debug)]
struct InsertExec {
    catalog: Arc<IcebergCatalog>,
    ident: TableIdent,
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

fn count_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "count",
        DataType::UInt64,
        false,
    )]))
}

impl InsertExec {
    fn new(catalog: Arc<IcebergCatalog>, ident: TableIdent, input: Arc<dyn ExecutionPlan>) -> Self {
        let properties = crate::rows::bounded_properties(count_schema(), 1, false);
        Self {
            catalog,
            ident,
            input,
            properties,
        }
    }
}

impl DisplayAs for InsertExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "IcebergInsertExec: table={}, writers={}, commit=fast_append",
            self.ident,
            self.input
                .properties()
                .output_partitioning()
                .partition_count()
        )
    }
}

impl ExecutionPlan for InsertExec {
    fn name(&self) -> &str {
        "IcebergInsertExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    // The planner spreads a single-partition input over the cores: one
    // writer each.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![true]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let input = children.pop().ok_or_else(|| {
            DataFusionError::Internal("IcebergInsertExec needs its input".to_string())
        })?;
        Ok(Arc::new(Self::new(
            Arc::clone(&self.catalog),
            self.ident.clone(),
            input,
        )))
    }

    fn execute(
        &self,
        partition: usize,
        task: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        let (catalog, ident, input) = (
            Arc::clone(&self.catalog),
            self.ident.clone(),
            Arc::clone(&self.input),
        );
        one_batch(self.name(), partition, count_schema(), async move {
            let rows = insert_into(&catalog, &ident, input, task)
                .await
                .map_err(DataFusionError::from)?;
            RecordBatch::try_new(
                count_schema(),
                vec![Arc::new(UInt64Array::from(vec![rows]))],
            )
            .map_err(DataFusionError::from)
        })
    }
}
