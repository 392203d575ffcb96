//! SQL table definitions to Iceberg: column types, `PARTITION BY` transforms
//! and table properties.
//!
//! DataFusion plans `CREATE TABLE` into an Arrow schema (its own type mapping
//! and nullability); this module maps that schema onto Iceberg types, with the
//! units Iceberg v2 stores (timestamps and times in microseconds).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{
    DataType, Field, FieldRef, Fields, Schema as ArrowSchema, SchemaRef, TimeUnit,
};
use datafusion::common::Column;
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, cast};
use datafusion::sql::sqlparser::ast::{
    CreateTableOptions, Expr as SqlExpr, FunctionArg, FunctionArgExpr, FunctionArguments,
    SqlOption, Value,
};
use iceberg::arrow::arrow_schema_to_schema_auto_assign_ids;
use iceberg::spec::Schema as IcebergSchema;
use iceberg::spec::{Schema, Transform, UnboundPartitionSpec};
use iceberg::{NamespaceIdent, TableCreation};

use crate::catalog::TableName;
use crate::catalog::bridge::insert::{insert_into, writer_per_core};
use crate::catalog::maintain::upkeep::{MANIFEST_MERGE_ENABLED, MIN_COUNT_TO_MERGE};
use crate::error::{Error, Result};
use crate::session::CommandContext;
use crate::session::operation::{Operation, flag};

/// A planned `CREATE TABLE` on an Iceberg catalog.
#[derive(Debug)]
pub(crate) struct CreateTable {
    pub(crate) table: TableName,
    pub(crate) schema: IcebergSchema,
    pub(crate) partition_spec: Option<UnboundPartitionSpec>,
    pub(crate) properties: std::collections::HashMap<String, String>,
    pub(crate) if_not_exists: bool,
    /// `AS SELECT ...`: the rows come from the command's input plan.
    pub(crate) with_query: bool,
}

/// The Iceberg schema for a table whose columns DataFusion planned as `arrow`.
/// Field ids are assigned from 1, as a new table gets them.
pub(crate) fn iceberg_schema(arrow: &ArrowSchema) -> Result<Schema> {
    let fields: Vec<FieldRef> = arrow
        .fields()
        .iter()
        .map(storable_field)
        .collect::<Result<_>>()?;
    Ok(arrow_schema_to_schema_auto_assign_ids(&ArrowSchema::new(
        fields,
    ))?)
}

/// `field` with its type changed to one Iceberg v2 stores.
fn storable_field(field: &FieldRef) -> Result<FieldRef> {
    let data_type = storable_type(field.name(), field.data_type())?;
    Ok(Arc::new(Field::new(
        field.name(),
        data_type,
        field.is_nullable(),
    )))
}

fn storable_type(column: &str, data_type: &DataType) -> Result<DataType> {
    const UTC: &str = "+00:00";
    Ok(match data_type {
        DataType::Timestamp(_, None) => DataType::Timestamp(TimeUnit::Microsecond, None),
        DataType::Timestamp(_, Some(_)) => {
            DataType::Timestamp(TimeUnit::Microsecond, Some(UTC.into()))
        }
        DataType::Time32(_) | DataType::Time64(_) => DataType::Time64(TimeUnit::Microsecond),
        DataType::Null => {
            return Err(Error::invalid(format!(
                "column '{column}' has no type (an untyped NULL): cast it, e.g. CAST(NULL AS VARCHAR)"
            )));
        }
        DataType::UInt64 => {
            return Err(Error::invalid(format!(
                "column '{column}' is an unsigned 64-bit integer, which Iceberg cannot store: \
                 use BIGINT, or DECIMAL(20, 0) for the full range"
            )));
        }
        DataType::Dictionary(_, value) => storable_type(column, value)?,
        DataType::List(item) | DataType::LargeList(item) | DataType::ListView(item) => {
            DataType::List(storable_field(item)?)
        }
        DataType::Struct(fields) => DataType::Struct(
            fields
                .iter()
                .map(storable_field)
                .collect::<Result<Fields>>()?,
        ),
        DataType::Map(entries, sorted) => DataType::Map(storable_field(entries)?, *sorted),
        other => other.clone(),
    })
}

/// The partition spec of `PARTITION BY (<transform>, ...)` over `schema`.
///
/// Accepts bare column names (identity) and the transforms Iceberg defines,
/// in Spark's spelling: `year(c)`/`years(c)`, `month(s)`, `day(s)`,
/// `hour(s)`, `bucket(N, c)`, `truncate(N, c)`, `identity(c)`.
pub(crate) fn partition_spec(by: &SqlExpr, schema: &Schema) -> Result<UnboundPartitionSpec> {
    let items: Vec<&SqlExpr> = match by {
        SqlExpr::Tuple(items) => items.iter().collect(),
        SqlExpr::Nested(inner) => vec![inner.as_ref()],
        single => vec![single],
    };
    let mut builder = UnboundPartitionSpec::builder();
    for item in items {
        let (column, transform) = partition_item(item)?;
        let field = schema.field_by_name(&column).ok_or_else(|| {
            Error::invalid(format!(
                "PARTITION BY names column '{column}', which the table does not have: \
                 partition by one of its columns ({})",
                column_names(schema)
            ))
        })?;
        let name = match transform {
            Transform::Identity => column.clone(),
            Transform::Bucket(_) => format!("{column}_bucket"),
            Transform::Truncate(_) => format!("{column}_trunc"),
            Transform::Year => format!("{column}_year"),
            Transform::Month => format!("{column}_month"),
            Transform::Day => format!("{column}_day"),
            Transform::Hour => format!("{column}_hour"),
            _ => format!("{column}_{transform}"),
        };
        builder = builder.add_partition_field(field.id, name, transform)?;
    }
    Ok(builder.build())
}

fn column_names(schema: &Schema) -> String {
    schema
        .as_struct()
        .fields()
        .iter()
        .map(|f| f.name.clone())
        .collect::<Vec<_>>()
        .join(", ")
}

const TRANSFORM_HELP: &str = "use a column name or one of identity(c), year(c), month(c), \
                              day(c), hour(c), bucket(N, c), truncate(N, c)";

fn partition_item(item: &SqlExpr) -> Result<(String, Transform)> {
    match item {
        SqlExpr::Identifier(ident) => Ok((ident.value.clone(), Transform::Identity)),
        SqlExpr::Function(function) => {
            let name = function.name.to_string().to_lowercase();
            let args: Vec<&SqlExpr> = match &function.args {
                FunctionArguments::List(list) => list
                    .args
                    .iter()
                    .filter_map(|arg| match arg {
                        FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e),
                        _ => None,
                    })
                    .collect(),
                _ => vec![],
            };
            let column = |expr: &SqlExpr| match expr {
                SqlExpr::Identifier(ident) => Ok(ident.value.clone()),
                other => Err(Error::invalid(format!(
                    "partition transform '{item}' takes a column name, not '{other}'"
                ))),
            };
            let width = |expr: &SqlExpr| {
                match expr {
                SqlExpr::Value(v) => match &v.value {
                    Value::Number(n, _) => n.parse::<u32>().ok().filter(|w| *w > 0),
                    _ => None,
                },
                _ => None,
            }
            .ok_or_else(|| {
                Error::invalid(format!(
                    "partition transform '{item}' needs a positive whole number as its first argument"
                ))
            })
            };
            let time = |transform: Transform| -> Result<(String, Transform)> {
                match args.as_slice() {
                    [c] => Ok((column(c)?, transform)),
                    _ => Err(Error::invalid(format!(
                        "partition transform '{item}' takes one column, e.g. {name}(created_at)"
                    ))),
                }
            };
            let sized = |make: fn(u32) -> Transform| -> Result<(String, Transform)> {
                match args.as_slice() {
                    [n, c] => Ok((column(c)?, make(width(n)?))),
                    _ => Err(Error::invalid(format!(
                        "partition transform '{item}' takes a width and a column, e.g. {name}(16, id)"
                    ))),
                }
            };
            match name.as_str() {
                "identity" => time(Transform::Identity),
                "year" | "years" => time(Transform::Year),
                "month" | "months" => time(Transform::Month),
                "day" | "days" => time(Transform::Day),
                "hour" | "hours" => time(Transform::Hour),
                "bucket" => sized(Transform::Bucket),
                "truncate" => sized(Transform::Truncate),
                _ => Err(Error::invalid(format!(
                    "'{item}' is not a partition transform: {TRANSFORM_HELP}"
                ))),
            }
        }
        other => Err(Error::invalid(format!(
            "'{other}' cannot partition a table: {TRANSFORM_HELP}"
        ))),
    }
}

/// Properties `CREATE TABLE` sets unless the statement gives them: commits
/// delete the metadata files that fall out of the log, and merge manifests
/// (icestage does whatever the table says, Iceberg's default; said
/// explicitly so that every other writer of the table, PyIceberg's
/// `append` among them, merges too).
pub(crate) const CREATED_TABLE_DEFAULTS: [(&str, &str); 3] = [
    ("write.metadata.delete-after-commit.enabled", "true"),
    ("write.metadata.previous-versions-max", "20"),
    (MANIFEST_MERGE_ENABLED, "true"),
];

/// Refuses a value of a table property icestage acts on that it could not
/// act on, naming the property, the value and what it takes.
fn check_property(key: &str, value: &str) -> Result<()> {
    let takes = match key {
        MANIFEST_MERGE_ENABLED if !matches!(value, "true" | "false") => "true or false",
        MIN_COUNT_TO_MERGE if !value.parse::<u32>().is_ok_and(|n| n >= 1) => {
            "a whole number of commits, at least 1 (Iceberg's default is 100)"
        }
        _ => return Ok(()),
    };
    Err(Error::invalid(format!(
        "table property '{key}' = '{value}' is not valid: it takes {takes}"
    )))
}

/// Table properties from `WITH (...)` / `TBLPROPERTIES (...)`.
pub(crate) fn table_properties(options: &CreateTableOptions) -> Result<HashMap<String, String>> {
    let list: &[SqlOption] = match options {
        CreateTableOptions::None => &[],
        CreateTableOptions::With(list)
        | CreateTableOptions::TableProperties(list)
        | CreateTableOptions::Options(list)
        | CreateTableOptions::Plain(list) => list,
    };
    list.iter()
        .map(|option| match option {
            SqlOption::KeyValue { key, value } => {
                let value = match value {
                    SqlExpr::Value(v) => match &v.value {
                        Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
                        other => other.to_string(),
                    },
                    other => other.to_string(),
                };
                check_property(&key.value, &value)?;
                Ok((key.value.clone(), value))
            }
            other => Err(Error::invalid(format!(
                "table option '{other}' is not a key = value pair: write TBLPROPERTIES ('key' = 'value')"
            ))),
        })
        .collect()
}

/// `CREATE NAMESPACE` / `CREATE SCHEMA` on an Iceberg catalog.
#[derive(Debug)]
pub(crate) struct CreateNamespace {
    pub(crate) catalog: String,
    pub(crate) namespace: NamespaceIdent,
    pub(crate) if_not_exists: bool,
}

impl Operation for CreateNamespace {
    const NAME: &'static str = "CreateNamespace";
    type Outcome = ();

    async fn run(&self, ctx: &CommandContext) -> Result<()> {
        create_namespace(ctx, &self.catalog, &self.namespace, self.if_not_exists).await
    }
}

impl fmt::Display for CreateNamespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{}{}",
            self.catalog,
            self.namespace.join("."),
            flag(self.if_not_exists, "if_not_exists")
        )
    }
}

impl Operation for CreateTable {
    const NAME: &'static str = "CreateIcebergTable";
    type Outcome = RecordBatch;

    /// A `count` column for `AS SELECT`, none otherwise.
    fn schema(&self) -> SchemaRef {
        match self.with_query {
            true => Arc::new(ArrowSchema::new(vec![Field::new(
                "count",
                DataType::UInt64,
                false,
            )])),
            false => Arc::new(ArrowSchema::empty()),
        }
    }

    async fn run(&self, ctx: &CommandContext) -> Result<RecordBatch> {
        create_table(ctx, self).await
    }
}

impl fmt::Display for CreateTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.table)?;
        if let Some(spec) = &self.partition_spec {
            let fields: Vec<String> = spec
                .fields()
                .iter()
                .map(|p| format!("{}({})", p.transform, p.source_id))
                .collect();
            write!(f, ", partition=[{}]", fields.join(", "))?;
        }
        write!(f, "{}", flag(self.if_not_exists, "if_not_exists"))
    }
}

async fn create_namespace(
    ctx: &CommandContext,
    catalog: &str,
    namespace: &NamespaceIdent,
    if_not_exists: bool,
) -> Result<()> {
    let catalog = ctx.icestage.catalog(catalog)?;
    if catalog.catalog().namespace_exists(namespace).await? {
        if if_not_exists {
            return Ok(());
        }
        return Err(Error::invalid(format!(
            "namespace '{}' already exists in catalog '{}': use CREATE NAMESPACE IF NOT EXISTS {}",
            namespace.join("."),
            catalog.name(),
            namespace.join(".")
        )));
    }
    catalog.ensure_namespace(namespace).await
}

/// Refuses names whose parts hold a dot (`"a.b"` quoted): icestage and
/// the clients it hands tables to write a table as `namespace.table`, and
/// such a name would read back as another table.
pub(crate) fn dotless(ident: &iceberg::TableIdent) -> Result<()> {
    for part in ident
        .namespace()
        .iter()
        .map(String::as_str)
        .chain([ident.name()])
    {
        if part.contains('.') || part.is_empty() {
            return Err(Error::invalid(format!(
                "table name part '{part}' holds a dot or is empty: icestage names tables \
                 'namespace.table', so '{part}' would read back as another name; choose a name \
                 without dots, e.g. '{}'",
                part.replace('.', "_")
            )));
        }
    }
    Ok(())
}

/// Runs `CREATE TABLE [AS SELECT]` on an Iceberg catalog; the result is the
/// number of rows written when there is a query, nothing otherwise.
async fn create_table(ctx: &CommandContext, create: &CreateTable) -> Result<RecordBatch> {
    let catalog = ctx.icestage.catalog(&create.table.catalog)?;
    let namespace = create.table.ident.namespace();
    let name = format!("{}.{}", namespace.join("."), create.table.ident.name());
    dotless(&create.table.ident)?;
    if !catalog.catalog().namespace_exists(namespace).await? {
        return Err(Error::invalid(format!(
            "cannot create table '{name}': namespace '{}' does not exist in catalog '{}'; \
             create it first with CREATE SCHEMA {}",
            namespace.join("."),
            catalog.name(),
            namespace.join(".")
        )));
    }
    let written = |rows: u64| -> Result<RecordBatch> {
        if create.with_query {
            Ok(RecordBatch::try_from_iter_with_nullable(vec![(
                "count",
                std::sync::Arc::new(UInt64Array::from(vec![rows])) as _,
                false,
            )])?)
        } else {
            Ok(RecordBatch::new_empty(std::sync::Arc::new(
                ArrowSchema::empty(),
            )))
        }
    };
    if catalog.catalog().table_exists(&create.table.ident).await? {
        if create.if_not_exists {
            return written(0);
        }
        return Err(Error::invalid(format!(
            "table '{name}' already exists in catalog '{}': use CREATE TABLE IF NOT EXISTS, \
             or DROP TABLE {name} first",
            catalog.name()
        )));
    }
    // A table icestage creates deletes the metadata files that fall out of
    // its log (each commit writes one; a target promoted into thousands of
    // times would keep them all) and merges its manifests, unless the
    // statement says otherwise.
    let mut properties = create.properties.clone();
    for (key, value) in CREATED_TABLE_DEFAULTS {
        properties
            .entry(key.to_string())
            .or_insert_with(|| value.to_string());
    }
    let creation = TableCreation::builder()
        .name(create.table.ident.name().to_string())
        .schema(create.schema.clone())
        .partition_spec_opt(create.partition_spec.clone())
        .properties(properties)
        .build();
    catalog.catalog().create_table(namespace, creation).await?;
    let rows = match &ctx.input {
        Some(input) => {
            let cores = ctx.task.session_config().target_partitions();
            insert_into(
                catalog,
                &create.table.ident,
                writer_per_core(std::sync::Arc::clone(input), cores)?,
                std::sync::Arc::clone(&ctx.task),
            )
            .await?
        }
        _ => 0,
    };
    written(rows)
}

/// Projects `input` onto the Arrow types the new table stores.
pub(crate) fn cast_to_table_types(input: LogicalPlan, schema: &Schema) -> Result<LogicalPlan> {
    let target = iceberg::arrow::schema_to_arrow_schema(schema)?;
    let exprs: Vec<Expr> = input
        .schema()
        .iter()
        .zip(target.fields())
        .map(|((qualifier, field), target)| {
            cast(
                Expr::Column(Column::new(qualifier.cloned(), field.name())),
                target.data_type().clone(),
            )
            .alias(target.name())
        })
        .collect();
    Ok(LogicalPlanBuilder::from(input).project(exprs)?.build()?)
}

#[cfg(test)]
mod tests {
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    use iceberg::spec::{PrimitiveType, Type};

    use super::*;

    fn schema() -> Schema {
        iceberg_schema(&ArrowSchema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("ts", DataType::Timestamp(TimeUnit::Nanosecond, None), true),
            Field::new("name", DataType::Utf8View, true),
        ]))
        .unwrap()
    }

    fn expr(sql: &str) -> SqlExpr {
        Parser::new(&GenericDialect {})
            .try_with_sql(sql)
            .unwrap()
            .parse_expr()
            .unwrap()
    }

    #[test]
    fn types_are_stored_as_iceberg_v2() {
        let schema = schema();
        let ts = schema.field_by_name("ts").unwrap();
        assert_eq!(*ts.field_type, Type::Primitive(PrimitiveType::Timestamp));
        assert!(!ts.required);
        assert!(schema.field_by_name("id").unwrap().required);
        assert_eq!(schema.field_by_name("id").unwrap().id, 1);
    }

    #[test]
    fn partition_transforms() {
        let spec = partition_spec(&expr("(day(ts), bucket(16, id), name)"), &schema()).unwrap();
        let fields: Vec<_> = spec
            .fields()
            .iter()
            .map(|f| (f.name.clone(), f.source_id, f.transform))
            .collect();
        assert_eq!(
            fields,
            vec![
                ("ts_day".to_string(), 2, Transform::Day),
                ("id_bucket".to_string(), 1, Transform::Bucket(16)),
                ("name".to_string(), 3, Transform::Identity),
            ]
        );
        let err = partition_spec(&expr("(week(ts))"), &schema()).unwrap_err();
        assert!(
            err.to_string()
                .contains("'week(ts)' is not a partition transform"),
            "{err}"
        );
        let err = partition_spec(&expr("missing"), &schema()).unwrap_err();
        assert!(err.to_string().contains("column 'missing'"), "{err}");
    }
}
