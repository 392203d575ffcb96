//! The target's rules on the staged rows: `CHECK` predicates streamed over
//! the files their metrics cannot clear, `UNIQUE` keys as DataFusion
//! queries (within the upload and against the target), and how a violating
//! row is shown (its key or file and position, and the values read).

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{Int64Type, Schema as ArrowSchema};
use datafusion::catalog::TableProvider;
use datafusion::common::DFSchema;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::logical_expr::Expr;
use datafusion::prelude::{SessionConfig, SessionContext};
use futures::{StreamExt, TryStreamExt};
use iceberg::scan::FileScanTask;
use iceberg::table::Table;
use iceberg_datafusion::physical_plan::convert_filters_to_predicate;

use super::findings::Finding;
use super::{FINDINGS_PER_RULE, VALIDATION_MEMORY, Validation, key_text, named, values_json};
use crate::catalog::bridge::provider::table_provider;
use crate::cluster::{Cluster, Recipe, RecipeTable};
use crate::error::{Error, Result};
use crate::tables::rules::PlannedCheck;
use crate::upload::Staging;

/// Evaluates every CHECK rule in one streaming pass over the staging files
/// whose metrics allow a violation of at least one of them.
pub(crate) async fn evaluate_checks(
    staging: &Staging,
    checks: &[PlannedCheck],
    key: &[String],
    validation: &mut Validation,
) -> Result<()> {
    if checks.is_empty() {
        return Ok(());
    }
    let table = &staging.table;
    // The columns to read: the key, then whatever the rules reference.
    let mut read: Vec<String> = key.to_vec();
    let mut referenced: Vec<Vec<String>> = vec![];
    for check in checks {
        let mut names: Vec<String> = check
            .expr
            .column_refs()
            .iter()
            .map(|c| c.name.clone())
            .collect();
        names.sort();
        for name in &names {
            if !read.contains(name) {
                read.push(name.clone());
            }
        }
        referenced.push(names);
    }
    // A row violates CHECK (p) when p is false: prune with NOT p.
    let violation = checks
        .iter()
        .map(|c| Expr::Not(Box::new(c.expr.clone())))
        .reduce(|a, b| a.or(b))
        .expect("at least one check");
    let mut scan = table.scan().select(read.iter().map(String::as_str));
    if let Some(predicate) = convert_filters_to_predicate(&[violation]) {
        scan = scan.with_filter(predicate);
    }
    let tasks: Vec<FileScanTask> = scan.build()?.plan_files().await?.try_collect().await?;

    // The predicates, planned against the columns the scan returns.
    let arrow = iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema())?;
    let projected = ArrowSchema::new(
        read.iter()
            .map(|n| arrow.field_with_name(n).cloned())
            .collect::<Result<Vec<_>, _>>()?,
    );
    let schema = DFSchema::try_from(projected)?;
    let ctx = SessionContext::new();
    let physical = checks
        .iter()
        .map(|c| {
            let expr = ctx.parse_sql_expr(&c.predicate, &schema)?;
            ctx.create_physical_expr(expr, &schema)
        })
        .collect::<datafusion::error::Result<Vec<_>>>()?;

    for mut task in tasks {
        // Whole files, so that positions count every row.
        task.predicate = None;
        let file = task.data_file_path.clone();
        let short = file.rsplit('/').next().unwrap_or(&file).to_string();
        let mut stream = table
            .reader_builder()
            .build()
            .read(futures::stream::iter([Ok(task)]).boxed())?
            .stream();
        let mut position = 0i64;
        while let Some(batch) = stream.try_next().await? {
            let batch = batch.project(
                &read
                    .iter()
                    .map(|n| batch.schema().index_of(n))
                    .collect::<Result<Vec<_>, _>>()?,
            )?;
            let key_columns = named(&batch, key)?;
            for ((check, expr), names) in checks.iter().zip(&physical).zip(&referenced) {
                let result = expr.evaluate(&batch)?.into_array(batch.num_rows())?;
                let result = result.as_boolean();
                let values = named(&batch, names)?;
                let entry = validation
                    .violations
                    .get_mut(&check.name)
                    .expect("every rule has an entry");
                for row in 0..batch.num_rows() {
                    if !result.is_valid(row) || result.value(row) {
                        continue;
                    }
                    entry.1 += 1;
                    if entry.1 as usize > FINDINGS_PER_RULE {
                        continue;
                    }
                    let at = position + row as i64;
                    validation.findings.push(Finding {
                        rule: check.name.clone(),
                        kind: "check".to_string(),
                        row: if key_columns.is_empty() {
                            format!("{short}#{at}")
                        } else {
                            key_text(&key_columns, row)?
                        },
                        file: Some(file.clone()),
                        position: Some(at),
                        values: values_json(&values, row)?,
                        message: format!("violates CHECK ({})", check.predicate),
                    });
                }
            }
            position += batch.num_rows() as i64;
        }
    }
    Ok(())
}

/// Quotes an identifier for SQL.
pub(crate) fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Evaluates one UNIQUE rule: keys repeated inside the upload, and (with
/// `against_target`) keys the target already holds. NULL keys are never
/// duplicates, as in SQL.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn evaluate_unique(
    staging: &Staging,
    target: &Table,
    name: &str,
    columns: &[String],
    against_target: bool,
    verified: Option<&Recipe>,
    cluster: Option<&Cluster>,
    validation: &mut Validation,
) -> Result<()> {
    let ctx = match cluster {
        Some(cluster) => unique_on_cluster(cluster, staging, target, verified).await?,
        None => unique_here(staging, target, verified).await?,
    };
    validation.cluster = cluster.cloned();
    unique_findings(&ctx, name, columns, against_target, validation).await
}

/// Evaluates one UNIQUE rule `name` on `columns` in `ctx`, where `staged`
/// is the upload's rows and `target` the target's: keys repeated inside
/// the upload, and (with `against_target`) keys the target already holds.
pub(crate) async fn unique_findings(
    ctx: &SessionContext,
    name: &str,
    columns: &[String],
    against_target: bool,
    validation: &mut Validation,
) -> Result<()> {
    let list = |alias: &str| {
        columns
            .iter()
            .map(|c| format!("{alias}.{}", ident(c)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let not_null = columns
        .iter()
        .map(|c| format!("s.{} IS NOT NULL", ident(c)))
        .collect::<Vec<_>>()
        .join(" AND ");
    let joined = columns
        .iter()
        .map(|c| format!("s.{0} = t.{0}", ident(c)))
        .collect::<Vec<_>>()
        .join(" AND ");
    let queries = [
        (
            format!(
                "SELECT {cols}, count(*) AS copies FROM staged s WHERE {not_null} GROUP BY {cols} HAVING count(*) > 1",
                cols = list("s")
            ),
            "appears more than once in the upload",
        ),
        (
            format!(
                "SELECT DISTINCT {cols} FROM staged s JOIN target t ON {joined}",
                cols = list("s")
            ),
            "is already in the target",
        ),
    ];
    let definition = format!("UNIQUE ({})", columns.join(", "));
    let queries = if against_target {
        &queries[..]
    } else {
        &queries[..1]
    };
    for (sql, what) in queries {
        let mut stream = ctx.sql(sql).await?.execute_stream().await?;
        while let Some(batch) = stream.try_next().await? {
            let keys = named(&batch, columns)?;
            let copies = batch
                .column_by_name("copies")
                .map(|c| c.as_primitive::<Int64Type>().clone());
            let entry = validation
                .violations
                .get_mut(name)
                .expect("every rule has an entry");
            for row in 0..batch.num_rows() {
                let rows = copies.as_ref().map_or(1, |c| c.value(row) as u64);
                entry.1 += rows;
                if validation
                    .findings
                    .iter()
                    .filter(|f| f.rule == name)
                    .count()
                    >= FINDINGS_PER_RULE
                {
                    continue;
                }
                let mut values = keys.clone();
                if let Some(copies) = &copies {
                    values.push((
                        "copies".to_string(),
                        Arc::new(copies.clone()) as Arc<dyn Array>,
                    ));
                }
                validation.findings.push(Finding {
                    rule: name.to_string(),
                    kind: "unique".to_string(),
                    row: key_text(&keys, row)?,
                    file: None,
                    position: None,
                    values: values_json(&values, row)?,
                    message: format!("violates {definition}: the key {what}"),
                });
            }
        }
    }
    Ok(())
}

/// A session for the rules' queries in this process: bounded memory (they
/// spill), sort-merge joins.
pub(crate) fn rules_context() -> Result<SessionContext> {
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_limit(VALIDATION_MEMORY, 1.0)
        .build_arc()?;
    let config = SessionConfig::new()
        .set_bool("datafusion.optimizer.prefer_hash_join", false)
        .with_target_partitions(2);
    Ok(SessionContext::new_with_config_rt(config, runtime))
}

/// The session the uniqueness queries run in here ([`rules_context`]),
/// the staged side unpruned when bytes are verified.
async fn unique_here(
    staging: &Staging,
    target: &Table,
    verified: Option<&Recipe>,
) -> Result<SessionContext> {
    let ctx = rules_context()?;
    let provider = |table: &Table| {
        let catalog = Arc::clone(&staging.catalog);
        let ident = table.identifier().clone();
        async move {
            table_provider(&catalog, &ident, None)
                .await?
                .ok_or_else(|| Error::TableNotFound {
                    table: ident.to_string(),
                    hint: String::new(),
                })
        }
    };
    // Verified: exactly the files verification read (never pruned by the
    // client's metrics); otherwise the staging table as its metadata says.
    let staged: Arc<dyn TableProvider> = match verified {
        Some(recipe) => Arc::new(RecipeTable::of_recipe(&staging.table, recipe.clone())?),
        None => provider(&staging.table).await?,
    };
    ctx.register_table("staged", staged)?;
    ctx.register_table("target", provider(target).await?)?;
    Ok(ctx)
}

/// The session the uniqueness queries run in on a cluster: both tables as
/// recipes (never pruned by the client's metrics), the staged side exactly
/// the files verification read.
#[cfg(feature = "cluster")]
async fn unique_on_cluster(
    cluster: &Cluster,
    staging: &Staging,
    target: &Table,
    verified: Option<&Recipe>,
) -> Result<SessionContext> {
    let ctx = cluster.context().await?;
    let staged = match verified {
        Some(recipe) => RecipeTable::of_recipe(&staging.table, recipe.clone().travelling())?,
        None => RecipeTable::new(&staging.table, None)?,
    };
    ctx.register_table("staged", Arc::new(staged))?;
    ctx.register_table("target", Arc::new(RecipeTable::new(target, None)?))?;
    Ok(ctx)
}

#[cfg(not(feature = "cluster"))]
async fn unique_on_cluster(
    cluster: &Cluster,
    _staging: &Staging,
    _target: &Table,
    _verified: Option<&Recipe>,
) -> Result<SessionContext> {
    Err(cluster.unavailable())
}
