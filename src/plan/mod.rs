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
use crate::config::WithOptions;
use crate::download::DownloadId;
use crate::download::create::DownloadOptions;
use crate::download::status::DropDownload;
use crate::error::{Error, Result};
use crate::ingest::copy_into::CopyInto;
use crate::pipe::alter::AlterPipe;
use crate::pipe::drop::DropPipe;
use crate::pipe::run::RunPipe;
use crate::pipe::{CreatePipe, PipeName, PipeOptions, PipeState};
use crate::session::expire::ExpireStaging;
use crate::sql::parser::Statement;
use crate::tables::ddl;
use crate::tables::ddl::CreateNamespace;
use crate::tables::ddl::CreateTable;
use crate::tables::expire::{ExpireOptions, ExpireSnapshots};
use crate::tables::maintain::{OrphanOptions, RewriteDataOptions};
use crate::tables::maintain::{RemoveOrphanFiles, RewriteDataFiles, RewriteManifests};
use crate::tables::rules::Rule;
use crate::tables::rules::{AddConstraint, DropConstraint};
use crate::upload::UploadId;
use crate::upload::abort::AbortUpload;
use crate::upload::create::CreateUpload;
use crate::upload::create::UploadOptions;
use crate::upload::promote::PromoteOptions;
use crate::upload::promote::PromoteUpload;
use crate::upload::publish::PublishUpload;

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
            let options = UploadOptions::from_with(&create.options)?;
            let target = icestage.name_of(state, &table_reference(state, create.target)?)?;
            command_plan(CreateUpload { target, options })
        }
        Statement::PromoteUpload(promote) => {
            let options = PromoteOptions::from_with(&promote.options)?;
            let plan = if explaining {
                crate::upload::validation::validate::explain(&icestage, &promote.id, options.verify)
                    .await?
            } else {
                vec![]
            };
            command_plan(PromoteUpload {
                plan,
                ..PromoteUpload::new(UploadId::parse(&promote.id)?, options)
            })
        }
        Statement::PublishUpload(publish) => command_plan(PublishUpload {
            id: UploadId::parse(&publish.id)?,
        }),
        Statement::AbortUpload(abort) => command_plan(AbortUpload {
            id: UploadId::parse(&abort.id)?,
        }),
        Statement::CreateDownload { options, query } => {
            let options = DownloadOptions::from_with(&options)?;
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
            Ok(CommandNode::new(spec.into(), input)?.into_plan())
        }
        Statement::DropDownload { id } => command_plan(DropDownload {
            id: DownloadId::parse(&id)?,
        }),
        Statement::CopyInto {
            table,
            uri,
            options,
        } => {
            let parsed = crate::ingest::SourceOptions::from_with(&options)?;
            command_plan(CopyInto {
                table: icestage.name_of(state, &table_reference(state, table)?)?,
                uri,
                options: parsed,
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
            let table = icestage.name_of(state, &table_reference(state, table)?)?;
            let default = icestage.default_catalog().name();
            let name = CreatePipe::loading(pipe_name(state, &name)?, &table, default)?;
            command_plan(CreatePipe::new(
                name,
                if_not_exists,
                table.ident,
                uri,
                copy_options,
                PipeOptions::from_with(&options)?,
            )?)
        }
        Statement::RunPipe { name } => command_plan(RunPipe {
            name: pipe_name(state, &name)?,
        }),
        Statement::AlterPipe { name, pause } => command_plan(AlterPipe {
            name: pipe_name(state, &name)?,
            state: if pause {
                PipeState::Paused
            } else {
                PipeState::Running
            },
        }),
        Statement::DropPipe { name, if_exists } => command_plan(DropPipe {
            name: pipe_name(state, &name)?,
            if_exists,
        }),
        Statement::ExpireStaging => command_plan(ExpireStaging),
        Statement::RewriteManifests { table } => command_plan(RewriteManifests {
            table: icestage.name_of(state, &table_reference(state, table)?)?,
        }),
        Statement::RewriteDataFiles { table, options } => command_plan(RewriteDataFiles {
            options: RewriteDataOptions::from_with(&options)?,
            table: icestage.name_of(state, &table_reference(state, table)?)?,
        }),
        Statement::RemoveOrphanFiles { table, options } => command_plan(RemoveOrphanFiles {
            options: OrphanOptions::from_with(&options)?,
            table: icestage.name_of(state, &table_reference(state, table)?)?,
        }),
        Statement::ExpireSnapshots { table, options } => command_plan(ExpireSnapshots {
            table: icestage.name_of(state, &table_reference(state, table)?)?,
            options: ExpireOptions::from_with(&options)?,
        }),
        Statement::CreateNamespace {
            name,
            if_not_exists,
        } => {
            let (catalog, namespace) = namespace_of(state, &icestage, &name)?;
            command_plan(CreateNamespace {
                catalog,
                namespace,
                if_not_exists,
            })
        }
    }
}

fn command_plan(command: impl Into<Command>) -> Result<LogicalPlan> {
    Ok(CommandNode::new(command.into(), None)?.into_plan())
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

    let table = icestage.name_of(state, reference)?;
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
    let command: Command = match operation {
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
            AddConstraint { table, rule }.into()
        }
        AlterTableOperation::DropConstraint {
            if_exists, name, ..
        } => DropConstraint {
            table,
            name: name.value.clone(),
            if_exists: *if_exists,
        }
        .into(),
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
    let table = icestage.name_of(state, &memory.name)?;
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
    let command = Command::from(CreateTable {
        table,
        schema,
        partition_spec,
        properties,
        if_not_exists: memory.if_not_exists,
        with_query,
    });
    Ok(CommandNode::new(command, input)?.into_plan())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One statement's options as a section of the reference page.
    fn section<T: WithOptions>() -> String {
        let mut text = format!(
            "## {}\n\n| option | default | what it does |\n|---|---|---|\n",
            T::STATEMENT
        );
        for option in T::OPTIONS {
            text += &format!(
                "| `{}` | {} | {} |\n",
                option.key, option.default, option.doc
            );
        }
        text
    }

    /// The options reference page, from the options types.
    fn options_page() -> String {
        let sections = [
            section::<UploadOptions>(),
            section::<PromoteOptions>(),
            section::<DownloadOptions>(),
            section::<PipeOptions>(),
            section::<ExpireOptions>(),
            section::<RewriteDataOptions>(),
            section::<OrphanOptions>(),
            section::<crate::ingest::SourceOptions>(),
        ];
        format!(
            "# Statement options\n\n\
             What each statement takes in `WITH (...)`: the options type of each statement \
             declares them, refuses any other key (naming these), and this page is checked \
             against it. `read_s3_prefix` and `infer_s3_schema` take the options of `COPY INTO` \
             from `format` to `include_metadata` (as `name => value`); a pipe's `COPY INTO` takes \
             them less those it refuses, saying why (the explicit keys, `files`, `all_files`, \
             `force`, `validation_mode`). [COPY INTO](../guide/copy-into.md) says more of each. Durations are written \
             `'90s'`, `'15m'`, `'24h'` or `'7d'`; booleans `true` or `false`.\n\n{}",
            sections.join("\n")
        )
    }

    /// `docs/src/reference/options.md` is what the options types take; with
    /// `ICESTAGE_BLESS=1` set, the test writes it first.
    #[test]
    fn the_options_reference_is_what_the_options_types_take() {
        let page = options_page();
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/src/reference/options.md");
        if std::env::var_os("ICESTAGE_BLESS").is_some() {
            std::fs::write(path, &page).unwrap();
        }
        let written = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            written == page,
            "docs/src/reference/options.md differs from the options the statements take: \
             rewrite it with ICESTAGE_BLESS=1 cargo test --lib options_reference\n\n{page}"
        );
    }

    /// An unknown key is refused naming every key the statement takes,
    /// from the same declaration.
    #[test]
    fn an_unknown_option_is_refused_with_the_ones_taken() {
        let pairs = [("tll".to_string(), "1h".to_string())];
        let message = UploadOptions::from_with(&pairs).unwrap_err().to_string();
        assert!(
            message.contains(
                "CREATE UPLOAD has no option 'tll': valid options are ttl, owner, upload_id"
            ),
            "{message}"
        );
        let pairs = [("older_than".to_string(), "1d".to_string())];
        let expire = ExpireOptions::from_with(&pairs).unwrap();
        assert_eq!(expire.older_than, std::time::Duration::from_secs(86_400));
        assert_eq!(expire.retain_last, ExpireOptions::default().retain_last);
    }
}
