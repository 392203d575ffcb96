//! Parse → plan: statements become logical plans. icestage statements become
//! a [`CommandNode`](node::CommandNode); DataFusion statements are planned by
//! DataFusion, except `CREATE TABLE` on an Iceberg catalog, which icestage
//! plans so the table gets Iceberg types and a partition spec.

pub(crate) mod command;
pub(crate) mod node;

use std::sync::Arc;

use datafusion::common::TableReference;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::{DdlStatement, LogicalPlan, LogicalPlanBuilder};
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::planner::object_name_to_table_reference;
use datafusion::sql::sqlparser::ast::{CreateTableOptions, ObjectName, Statement as SqlStatement};
use iceberg::NamespaceIdent;

pub(crate) use self::command::Command;
use self::node::CommandNode;
pub(crate) use self::node::IcestageQueryPlanner;
use crate::catalog::Catalogs;
use crate::config::{Ttl, parse_bool, parse_duration};
use crate::download::DownloadId;
use crate::download::create::DownloadOptions;
use crate::error::{Error, Result};
use crate::expiry::ExpireOptions;
use crate::pipe::{CreatePipe, PipeName, PipeOptions, PipeState};
use crate::sql::parser::{Statement, check_options};
use crate::tables::ddl;
use crate::tables::ddl::CreateTable;
use crate::tables::maintain::{OrphanOptions, RewriteDataOptions};
use crate::tables::rules::Rule;
use crate::upload::UploadId;
use crate::upload::create::UploadOptions;

/// Plans one parsed statement.
pub(crate) async fn statement_to_plan(
    state: &SessionState,
    statement: Statement,
) -> Result<LogicalPlan> {
    plan_statement(state, statement, false).await
}

/// Plans a statement; `explaining` asks commands to describe what they
/// would do (which may read the catalog).
async fn plan_statement(
    state: &SessionState,
    statement: Statement,
    explaining: bool,
) -> Result<LogicalPlan> {
    let icestage = Catalogs::from_config(state.config())?;
    match statement {
        Statement::DataFusion(statement) => plan_datafusion(state, &icestage, *statement).await,
        Statement::Explain { verbose, statement } => {
            let inner = Box::pin(plan_statement(state, *statement, true)).await?;
            Ok(LogicalPlanBuilder::from(inner)
                .explain(verbose, false)?
                .build()?)
        }
        Statement::CreateUpload(create) => {
            check_options(
                "CREATE UPLOAD",
                &create.options,
                &["ttl", "owner", "upload_id"],
            )?;
            let option = |name: &str| option(&create.options, name);
            let options = UploadOptions {
                ttl: option("ttl").map(Ttl::parse).transpose()?,
                owner: option("owner").map(str::to_string),
                upload_id: option("upload_id").map(UploadId::parse).transpose()?,
            };
            let (catalog, target) =
                icestage.resolve(state, &table_reference(state, create.target)?)?;
            command_plan(Command::CreateUpload {
                catalog: catalog.name().to_string(),
                target,
                options,
            })
        }
        Statement::PromoteUpload(promote) => {
            check_options(
                "PROMOTE UPLOAD",
                &promote.options,
                &["dry_run", "verify", "mode", "key", "tag", "to_branch"],
            )?;
            let mode = crate::upload::promote::PromoteMode::parse(
                option(&promote.options, "mode").unwrap_or("append"),
                option(&promote.options, "key"),
            )?;
            let dry_run = option(&promote.options, "dry_run")
                .map(|value| parse_bool("dry_run", value))
                .transpose()?
                .unwrap_or(false);
            let verify = option(&promote.options, "verify")
                .map(str::parse)
                .transpose()?
                .unwrap_or_default();
            let plan = if explaining {
                crate::upload::validation::validate::explain(&icestage, &promote.id, verify).await?
            } else {
                vec![]
            };
            let tag = option(&promote.options, "tag")
                .map(|value| parse_bool("tag", value))
                .transpose()?
                .unwrap_or(false);
            let to_branch = option(&promote.options, "to_branch").map(str::to_string);
            command_plan(Command::PromoteUpload {
                id: UploadId::parse(&promote.id)?,
                options: crate::upload::promote::PromoteOptions {
                    dry_run,
                    verify,
                    mode,
                    tag,
                    to_branch,
                    ..Default::default()
                },
                plan,
            })
        }
        Statement::PublishUpload(publish) => command_plan(Command::PublishUpload {
            id: UploadId::parse(&publish.id)?,
        }),
        Statement::AbortUpload(abort) => command_plan(Command::AbortUpload {
            id: UploadId::parse(&abort.id)?,
        }),
        Statement::CreateDownload { options, query } => {
            check_options(
                "CREATE DOWNLOAD",
                &options,
                &["ttl", "wait", "lease", "owner", "catalog", "include_files"],
            )?;
            let option = |name: &str| option(&options, name);
            let options = DownloadOptions {
                ttl: option("ttl").map(Ttl::parse).transpose()?,
                wait: option("wait")
                    .map(|v| parse_bool("wait", v))
                    .transpose()?
                    .unwrap_or(false),
                lease: option("lease")
                    .map(parse_duration)
                    .transpose()?
                    .unwrap_or(std::time::Duration::from_secs(60)),
                owner: option("owner").map(str::to_string),
                catalog: option("catalog").map(str::to_string),
                include_files: option("include_files")
                    .map(|v| parse_bool("include_files", v))
                    .transpose()?
                    .unwrap_or(false),
            };
            // Redacted from the parsed query (every literal form), then the
            // text once more.
            let mut shown = query.clone();
            crate::secret::redact_query(&mut shown);
            let sql = crate::secret::redact_sql(&shown.to_string());
            let plan = state
                .statement_to_plan(DFStatement::Statement(Box::new(SqlStatement::Query(query))))
                .await?;
            let (spec, input) =
                crate::download::create::plan_download(state, &icestage, plan, sql, options)
                    .await?;
            // On a cluster the query is planned there: no input to plan here.
            let input = spec.remote.is_none().then_some(input);
            Ok(CommandNode::new(Command::CreateDownload(Arc::new(spec)), input)?.into_plan())
        }
        Statement::DropDownload { id } => command_plan(Command::DropDownload {
            id: DownloadId::parse(&id)?,
        }),
        Statement::CopyInto {
            table,
            uri,
            options,
        } => {
            let parsed = crate::ingest::SourceOptions::from_pairs(
                "COPY INTO",
                &options,
                &crate::ingest::copy_options(),
            )?;
            let (catalog, table) = icestage.resolve(state, &table_reference(state, table)?)?;
            command_plan(Command::CopyInto {
                catalog: catalog.name().to_string(),
                table,
                uri,
                options: Box::new(parsed),
                written: options,
            })
        }
        Statement::CreatePipe {
            name,
            if_not_exists,
            options,
            copy,
        } => {
            let Statement::CopyInto {
                table,
                uri,
                options: copy_options,
            } = *copy
            else {
                return Err(Error::invalid(
                    "CREATE PIPE ... AS takes a COPY INTO statement".to_string(),
                ));
            };
            let mut name = pipe_name(state, &name)?;
            let (catalog, target) = icestage.resolve(state, &table_reference(state, table)?)?;
            match &name.catalog {
                Some(named) if named != catalog.name() => {
                    return Err(Error::invalid(format!(
                        "pipe {name} would live in catalog {named} but loads a table of catalog {}: \
                         a pipe lives in its table's catalog, name it {}.{}",
                        catalog.name(),
                        catalog.name(),
                        name.name
                    )));
                }
                _ => {}
            }
            if catalog.name() != icestage.default_catalog().name() {
                name.catalog = Some(catalog.name().to_string());
            }
            let create = CreatePipe::new(
                name,
                if_not_exists,
                target,
                uri,
                copy_options,
                PipeOptions::from_pairs(&options)?,
            )?;
            command_plan(Command::CreatePipe(Arc::new(create)))
        }
        Statement::RunPipe { name } => command_plan(Command::RunPipe {
            name: pipe_name(state, &name)?,
        }),
        Statement::AlterPipe { name, pause } => command_plan(Command::AlterPipe {
            name: pipe_name(state, &name)?,
            state: if pause {
                PipeState::Paused
            } else {
                PipeState::Running
            },
        }),
        Statement::DropPipe { name, if_exists } => command_plan(Command::DropPipe {
            name: pipe_name(state, &name)?,
            if_exists,
        }),
        Statement::ExpireStaging => command_plan(Command::ExpireStaging),
        Statement::RewriteManifests { table } => {
            let (catalog, table) = icestage.resolve(state, &table_reference(state, table)?)?;
            command_plan(Command::RewriteManifests {
                catalog: catalog.name().to_string(),
                table,
            })
        }
        Statement::RewriteDataFiles { table, options } => {
            let options = RewriteDataOptions::from_pairs(&options)?;
            let (catalog, table) = icestage.resolve(state, &table_reference(state, table)?)?;
            command_plan(Command::RewriteDataFiles {
                catalog: catalog.name().to_string(),
                table,
                options,
            })
        }
        Statement::RemoveOrphanFiles { table, options } => {
            let options = OrphanOptions::from_pairs(&options)?;
            let (catalog, table) = icestage.resolve(state, &table_reference(state, table)?)?;
            command_plan(Command::RemoveOrphanFiles {
                catalog: catalog.name().to_string(),
                table,
                options,
            })
        }
        Statement::ExpireSnapshots { table, options } => {
            check_options("EXPIRE SNAPSHOTS", &options, &["older_than", "retain_last"])?;
            let mut expire = ExpireOptions::default();
            if let Some(value) = option(&options, "older_than") {
                expire.older_than = parse_duration(value)?;
            }
            if let Some(value) = option(&options, "retain_last") {
                expire.retain_last = value
                    .parse()
                    .ok()
                    .filter(|n: &usize| (1..=1_000_000).contains(n))
                    .ok_or_else(|| {
                        Error::invalid(format!(
                            "retain_last = '{value}' is not a count of snapshots: give a whole number from 1"
                        ))
                    })?;
            }
            let (catalog, table) = icestage.resolve(state, &table_reference(state, table)?)?;
            command_plan(Command::ExpireSnapshots {
                catalog: catalog.name().to_string(),
                table,
                options: expire,
            })
        }
        Statement::CreateNamespace {
            name,
            if_not_exists,
        } => {
            let (catalog, namespace) = namespace_of(state, &icestage, &name)?;
            command_plan(Command::CreateNamespace {
                catalog,
                namespace,
                if_not_exists,
            })
        }
    }
}

/// The value of option `name` in `options`, if given.
fn option<'a>(options: &'a [(String, String)], name: &str) -> Option<&'a str> {
    options
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn command_plan(command: Command) -> Result<LogicalPlan> {
    Ok(CommandNode::new(command, None)?.into_plan())
}

fn table_reference(state: &SessionState, name: ObjectName) -> Result<TableReference> {
    let normalize = state
        .config()
        .options()
        .sql_parser
        .enable_ident_normalization;
    Ok(object_name_to_table_reference(name, normalize)?)
}

/// The parts of `name`, normalized as the session normalizes identifiers.
fn name_parts(state: &SessionState, name: &ObjectName) -> Vec<String> {
    let normalize = state
        .config()
        .options()
        .sql_parser
        .enable_ident_normalization;
    name.0
        .iter()
        .filter_map(|p| p.as_ident())
        .map(|i| {
            if normalize && i.quote_style.is_none() {
                i.value.to_lowercase()
            } else {
                i.value.clone()
            }
        })
        .collect()
}

/// `name` or `catalog.name` to a pipe's name.
fn pipe_name(state: &SessionState, name: &ObjectName) -> Result<PipeName> {
    PipeName::parse(&name_parts(state, name).join("."))
}

/// `ns` or `catalog.ns` to a catalog name and namespace.
fn namespace_of(
    state: &SessionState,
    icestage: &Catalogs,
    name: &ObjectName,
) -> Result<(String, NamespaceIdent)> {
    let parts = name_parts(state, name);
    match parts.as_slice() {
        [ns] => Ok((
            icestage.default_catalog().name().to_string(),
            NamespaceIdent::new(ns.clone()),
        )),
        [catalog, ns] => {
            icestage.catalog(catalog)?;
            Ok((catalog.clone(), NamespaceIdent::new(ns.clone())))
        }
        _ => Err(Error::invalid(format!(
            "'{name}' is not a namespace name: write <namespace> or <catalog>.<namespace>"
        ))),
    }
}

/// True when `reference` names a table of one of icestage's catalogs.
fn in_icestage_catalog(
    state: &SessionState,
    icestage: &Catalogs,
    reference: &TableReference,
) -> bool {
    let resolved = reference.clone().resolve(
        &state.config().options().catalog.default_catalog,
        &state.config().options().catalog.default_schema,
    );
    icestage.catalog(&resolved.catalog).is_ok()
}

async fn plan_datafusion(
    state: &SessionState,
    icestage: &Catalogs,
    statement: DFStatement,
) -> Result<LogicalPlan> {
    if let DFStatement::Statement(sql) = &statement {
        match sql.as_ref() {
            SqlStatement::CreateTable(create) => {
                let reference = table_reference(state, create.name.clone())?;
                if in_icestage_catalog(state, icestage, &reference) {
                    return plan_create_table(state, icestage, create.clone(), &reference).await;
                }
            }
            SqlStatement::AlterTable(alter) => {
                let reference = table_reference(state, alter.name.clone())?;
                if in_icestage_catalog(state, icestage, &reference) {
                    return plan_alter_table(state, icestage, alter, &reference);
                }
            }
            SqlStatement::Insert(insert) => null_into_not_null(state, insert).await?,
            _ => {}
        }
    }
    Ok(state.statement_to_plan(statement).await?)
}

/// Refuses `INSERT ... VALUES` that gives a NOT NULL column a literal
/// NULL, naming the column: DataFusion would name it after its place in
/// the VALUES list (`column3`). NULLs computed by an expression are still
/// refused when the rows are written.
async fn null_into_not_null(
    state: &SessionState,
    insert: &datafusion::sql::sqlparser::ast::Insert,
) -> Result<()> {
    use datafusion::sql::sqlparser::ast::{Expr, SetExpr, TableObject, Value};

    let (TableObject::TableName(name), Some(source)) = (&insert.table, &insert.source) else {
        return Ok(());
    };
    let SetExpr::Values(values) = source.body.as_ref() else {
        return Ok(());
    };
    let reference = table_reference(state, name.clone())?;
    // A table that does not resolve is DataFusion's to report.
    let Ok(schema) = state.schema_for_ref(reference.clone()) else {
        return Ok(());
    };
    let Ok(Some(table)) = schema.table(reference.table()).await else {
        return Ok(());
    };
    let schema = table.schema();
    let targets: Vec<_> = if insert.columns.is_empty() {
        schema.fields().iter().cloned().collect()
    } else {
        let normalize = state
            .config()
            .options()
            .sql_parser
            .enable_ident_normalization;
        insert
            .columns
            .iter()
            .map(|column| {
                let name = match column.quote_style {
                    None if normalize => column.value.to_lowercase(),
                    _ => column.value.clone(),
                };
                schema.field_with_name(&name).ok().cloned().map(Arc::new)
            })
            .collect::<Option<_>>()
            .unwrap_or_default()
    };
    for (number, row) in values.rows.iter().enumerate() {
        for (value, field) in row.iter().zip(&targets) {
            if matches!(value, Expr::Value(v) if v.value == Value::Null) && !field.is_nullable() {
                return Err(Error::invalid(format!(
                    "column '{}' of {reference} is NOT NULL, but row {} of the VALUES gives it \
                     NULL: give it a value in every row",
                    field.name(),
                    number + 1
                )));
            }
        }
    }
    Ok(())
}

/// `ALTER TABLE` on an Iceberg catalog: adding and dropping the rules that
/// promotion checks.
fn plan_alter_table(
    state: &SessionState,
    icestage: &Catalogs,
    alter: &datafusion::sql::sqlparser::ast::AlterTable,
    reference: &TableReference,
) -> Result<LogicalPlan> {
    use datafusion::sql::sqlparser::ast::{AlterTableOperation, TableConstraint};

    let (catalog, table) = icestage.resolve(state, reference)?;
    let catalog = catalog.name().to_string();
    let usage = format!(
        "ALTER TABLE {reference} supports ADD CONSTRAINT <name> CHECK (<predicate>), \
         ADD CONSTRAINT <name> UNIQUE (<columns>) and DROP CONSTRAINT <name>"
    );
    let [operation] = alter.operations.as_slice() else {
        return Err(Error::NotSupported(format!("{usage}, one at a time")));
    };
    let columns = |list: &[datafusion::sql::sqlparser::ast::IndexColumn]| {
        list.iter()
            .map(|c| c.column.expr.to_string())
            .collect::<Vec<_>>()
    };
    let named = |name: &Option<datafusion::sql::sqlparser::ast::Ident>| {
        name.as_ref().map(|n| n.value.clone()).ok_or_else(|| {
            Error::invalid(format!(
                "give the constraint a name: ALTER TABLE {reference} ADD CONSTRAINT <name> ..."
            ))
        })
    };
    let command = match operation {
        AlterTableOperation::AddConstraint { constraint, .. } => {
            let rule = match constraint {
                TableConstraint::Check(check) => Rule::Check {
                    name: named(&check.name)?,
                    predicate: check.expr.to_string(),
                },
                TableConstraint::Unique(unique) => Rule::Unique {
                    name: named(&unique.name)?,
                    columns: columns(&unique.columns),
                },
                TableConstraint::PrimaryKey(key) => Rule::Unique {
                    name: named(&key.name)?,
                    columns: columns(&key.columns),
                },
                other => {
                    return Err(Error::NotSupported(format!(
                        "constraint '{other}' is not supported: {usage}"
                    )));
                }
            };
            Command::AddConstraint {
                catalog,
                table,
                rule,
            }
        }
        AlterTableOperation::DropConstraint {
            if_exists, name, ..
        } => Command::DropConstraint {
            catalog,
            table,
            name: name.value.clone(),
            if_exists: *if_exists,
        },
        other => {
            return Err(Error::NotSupported(format!(
                "'{other}' is not supported: {usage}"
            )));
        }
    };
    command_plan(command)
}

/// `CREATE TABLE` on an Iceberg catalog: DataFusion plans the columns (or the
/// query), icestage adds the partition spec and properties and creates the
/// table when the plan runs.
async fn plan_create_table(
    state: &SessionState,
    icestage: &Catalogs,
    mut create: datafusion::sql::sqlparser::ast::CreateTable,
    reference: &TableReference,
) -> Result<LogicalPlan> {
    if create.or_replace {
        return Err(Error::NotSupported(format!(
            "CREATE OR REPLACE TABLE {reference} is not supported on Iceberg catalogs: \
             DROP TABLE {reference} first, then CREATE TABLE"
        )));
    }
    let partition_by = create.partition_by.take();
    let mut properties = ddl::table_properties(&create.table_options)?;
    let file_columns = crate::tables::files::declare(&mut create.columns);
    let recorded = crate::tables::files::PROP_FILE_COLUMNS;
    if let Some(value) =
        crate::tables::files::property_value(properties.get(recorded), &file_columns)
    {
        properties.insert(recorded.to_string(), value);
    }
    create.table_options = CreateTableOptions::None;
    let plan = state
        .statement_to_plan(DFStatement::Statement(Box::new(SqlStatement::CreateTable(
            create,
        ))))
        .await?;
    let LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(memory)) = plan else {
        return Err(Error::NotSupported(format!(
            "CREATE TABLE {reference}: this form is not supported on Iceberg catalogs"
        )));
    };
    let (catalog, ident) = icestage.resolve(state, &memory.name)?;
    let arrow = memory.input.schema().as_arrow().clone();
    let schema = ddl::iceberg_schema(&arrow)?;
    if let Some(columns) = properties.get(recorded) {
        crate::tables::files::check_columns(&schema, &crate::tables::files::parse(columns))?;
    }
    let partition_spec = partition_by
        .map(|by| ddl::partition_spec(&by, &schema))
        .transpose()?;
    let with_query = !matches!(memory.input.as_ref(), LogicalPlan::EmptyRelation(_));
    let input = if with_query {
        Some(ddl::cast_to_table_types(
            memory.input.as_ref().clone(),
            &schema,
        )?)
    } else {
        None
    };
    let command = Command::CreateTable(Arc::new(CreateTable {
        catalog: catalog.name().to_string(),
        ident,
        schema,
        partition_spec,
        properties,
        if_not_exists: memory.if_not_exists,
        with_query,
    }));
    Ok(CommandNode::new(command, input)?.into_plan())
}
