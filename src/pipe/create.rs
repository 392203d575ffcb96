//! `CREATE PIPE`: the pipe's table, holding its definition.

use std::collections::HashMap;
use std::fmt;

use chrono::Utc;
use iceberg::{TableCreation, TableIdent};

use super::options::{PipeOptions, copy_source_options};
use super::status::{PipeStatus, status};
use super::{
    PROP_COPY_OPTIONS, PROP_CREATED_AT, PROP_INTERVAL, PROP_LEASE, PROP_LIST_INTERVAL, PROP_NAME,
    PROP_QUEUE, PROP_STATE, PROP_TARGET, PROP_URI, PipeName, PipeState, RunRow,
};
use crate::catalog::Catalogs;
use crate::catalog::TableName;
use crate::config::format_duration;
use crate::error::{Error, Result};
use crate::ingest::{Format, SourceOptions};
use crate::rows::StoredRow;
use crate::session::CommandContext;
use crate::session::operation::Operation;

/// `CREATE PIPE`, checked.
#[derive(Debug, Clone)]
pub struct CreatePipe {
    /// The pipe.
    pub name: PipeName,
    /// Fail when it exists (`false`: `IF NOT EXISTS`).
    pub if_not_exists: bool,
    /// The table it loads (in the pipe's catalog).
    pub target: TableIdent,
    /// The prefix it watches.
    pub uri: String,
    /// The `COPY INTO` options as written (no secrets).
    pub copy_options: Vec<(String, String)>,
    /// How it runs.
    pub options: PipeOptions,
}

impl CreatePipe {
    /// Checks the parts of `CREATE PIPE`.
    pub fn new(
        name: PipeName,
        if_not_exists: bool,
        target: TableIdent,
        uri: String,
        copy_options: Vec<(String, String)>,
        options: PipeOptions,
    ) -> Result<Self> {
        copy_source_options(&copy_options)?;
        if options.notification_queue.is_some() && !uri.starts_with("s3://") {
            return Err(Error::invalid(format!(
                "notification_queue needs an s3:// prefix (S3 sends the notifications), not '{uri}': \
                 leave it out to find new files by listing"
            )));
        }
        Ok(Self {
            name,
            if_not_exists,
            target,
            uri,
            copy_options,
            options,
        })
    }

    /// A pipe named `name` that loads `table`: it lives in the table's
    /// catalog, which a name without one means when that is not the
    /// default catalog; a name that gives another catalog is refused.
    pub(crate) fn loading(
        mut name: PipeName,
        table: &TableName,
        default_catalog: &str,
    ) -> Result<PipeName> {
        match &name.catalog {
            Some(named) if *named != table.catalog => {
                return Err(Error::invalid(format!(
                    "pipe {name} would live in catalog {named} but loads a table of catalog {}: \
                     a pipe lives in its table's catalog, name it {}.{}",
                    table.catalog, table.catalog, name.name
                )));
            }
            _ if table.catalog != default_catalog => name.catalog = Some(table.catalog.clone()),
            _ => {}
        }
        Ok(name)
    }
}

impl Operation for CreatePipe {
    const NAME: &'static str = "CreatePipe";
    type Outcome = PipeStatus;

    async fn run(&self, ctx: &CommandContext) -> Result<PipeStatus> {
        create(&ctx.icestage, self).await
    }
}

impl fmt::Display for CreatePipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} into {} from {}, interval={}",
            self.name,
            self.target,
            self.uri,
            format_duration(self.options.interval)
        )?;
        if let Some(queue) = &self.options.notification_queue {
            write!(f, ", notification_queue={queue}")?;
        }
        Ok(())
    }
}

/// The format of a pipe without one: what the files under its prefix
/// announce, when they agree.
async fn format_of(create: &CreatePipe, options: &SourceOptions) -> Result<Format> {
    if let Some(format) = options.format {
        return Ok(format);
    }
    let access = crate::ingest::copy_into::Access::open(&create.uri, options).await?;
    let files = crate::ingest::source::candidates(&access).await?;
    let formats: Vec<Option<Format>> = files
        .iter()
        .map(|f| crate::ingest::options::classify(&f.uri).0)
        .collect();
    match formats.first() {
        Some(Some(first)) if formats.iter().all(|f| f == &Some(*first)) => Ok(*first),
        Some(_) => Err(Error::invalid(format!(
            "the files under '{}' do not all announce one format by their names: give the pipe's \
             COPY INTO WITH (format = 'parquet' | 'csv' | 'json' | 'avro')",
            create.uri
        ))),
        None => Err(Error::invalid(format!(
            "'{}' holds no files yet, so the pipe cannot tell their format: give the pipe's \
             COPY INTO WITH (format = 'parquet' | 'csv' | 'json' | 'avro')",
            create.uri
        ))),
    }
}

/// `CREATE PIPE`: the pipe's table, with its definition; running.
async fn create(icestage: &Catalogs, create: &CreatePipe) -> Result<PipeStatus> {
    let catalog = create.name.catalog(icestage)?;
    let ident = create.name.table();
    if catalog.catalog().table_exists(&ident).await? {
        if create.if_not_exists {
            return status(icestage, &create.name).await;
        }
        return Err(Error::invalid(format!(
            "pipe {} exists: DROP PIPE {} first, or use CREATE PIPE IF NOT EXISTS",
            create.name, create.name
        )));
    }
    let source = copy_source_options(&create.copy_options)?;
    let format = format_of(create, &source).await?;
    let mut copy_options = create.copy_options.clone();
    if source.format.is_none() {
        copy_options.push(("format".to_string(), format.to_string()));
    }
    let options = &create.options;
    let mut properties = HashMap::from([
        (PROP_NAME.to_string(), create.name.name.clone()),
        (PROP_TARGET.to_string(), create.target.to_string()),
        (PROP_URI.to_string(), create.uri.clone()),
        (
            PROP_COPY_OPTIONS.to_string(),
            serde_json::to_string(&copy_options).expect("pairs serialize"),
        ),
        (PROP_INTERVAL.to_string(), format_duration(options.interval)),
        (PROP_LEASE.to_string(), format_duration(options.lease)),
        (
            PROP_LIST_INTERVAL.to_string(),
            format_duration(options.list_interval),
        ),
        (
            PROP_QUEUE.to_string(),
            options.notification_queue.clone().unwrap_or_default(),
        ),
        (PROP_STATE.to_string(), PipeState::Running.to_string()),
        (PROP_CREATED_AT.to_string(), Utc::now().to_rfc3339()),
    ]);
    // Its properties change at every run: a bounded metadata folder.
    properties.extend(crate::catalog::owned_table_properties());
    catalog.ensure_namespace(ident.namespace()).await?;
    let creation = TableCreation::builder()
        .name(ident.name().to_string())
        .schema(RunRow::iceberg_schema()?)
        .properties(properties)
        .build();
    match catalog
        .catalog()
        .create_table(ident.namespace(), creation)
        .await
    {
        Ok(_) => {}
        // Another process created it between the check and here.
        Err(e) => {
            if !catalog.catalog().table_exists(&ident).await? {
                return Err(e.into());
            }
            if !create.if_not_exists {
                return Err(Error::invalid(format!(
                    "pipe {} exists: it was created meanwhile by another process; \
                     DROP PIPE {} first, or use CREATE PIPE IF NOT EXISTS",
                    create.name, create.name
                )));
            }
        }
    }
    status(icestage, &create.name).await
}
