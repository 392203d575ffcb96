//! `CREATE UPLOAD FOR <table>`: a staging table with the target's schema,
//! field ids, partition spec and sort order, registered in the target's catalog.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use iceberg::spec::TableMetadata;
use iceberg::{MetadataLocation, NamespaceIdent, TableCreation, TableIdent};

use super::{
    PROP_CREATED_AT, PROP_EXPIRES_AT, PROP_OWNER, PROP_STATE, PROP_TARGET, PROP_UPLOAD_ID,
    STAGING_NAMESPACE, UploadId, UploadState, is_missing,
};
use crate::catalog::IcebergCatalog;
use crate::config::{Ttl, bounded_ttl};
use crate::error::{Error, Result};
use crate::rows::result_row;
use crate::session::CommandContext;

/// How `CREATE UPLOAD` opens a session (its `WITH (...)` options).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct UploadOptions {
    /// How long the session stays open; the session option
    /// `icestage.upload_ttl` when `None`, at most `icestage.max_ttl`.
    pub ttl: Option<Ttl>,
    /// Who the session belongs to (a service's caller), if anyone.
    pub owner: Option<String>,
    /// A caller-chosen id: asking again with the same id, target and owner
    /// answers the same session (a service derives it from an idempotency
    /// key); an id another upload holds is refused.
    pub upload_id: Option<UploadId>,
}

result_row! {
    /// A session `CREATE UPLOAD` opened: the staging table a client writes
    /// and how it connects to it.
    #[derive(Debug, Clone, PartialEq)]
    pub struct UploadOpened {
        /// The session's id.
        pub upload_id: UploadId,
        /// The staging table, `staging.upload_<id>`.
        pub staging_table: String,
        /// The table the rows are promoted into.
        pub target_table: String,
        /// `open` (or, for a repeated request, where the session stands).
        pub state: UploadState,
        /// When `EXPIRE STAGING` may remove the session.
        pub expires_at: Option<DateTime<Utc>>,
        /// The catalog of both tables.
        pub catalog: String,
        /// A JSON object of catalog connection properties for a client.
        pub connection: String,
    }
}

/// Target properties a staging table inherits: how files are written, never
/// where (a staging table's files stay under its own location).
fn inherited(key: &str) -> bool {
    key.starts_with("write.") && !key.ends_with(".path") && !key.contains("object-storage")
}

/// The metadata of a new staging table for `target`: the target's schemas
/// (so field ids and `last-column-id` carry over), partition specs and sort
/// orders, with no snapshots, no history, a fresh uuid and its own location.
///
/// `create_table` would renumber field ids from 1, and a metadata builder
/// started from the target would keep its metadata log (which a later purge
/// of the staging table would delete), so the metadata is derived from the
/// target's serialized form, field by field as the Iceberg spec names them.
pub(crate) fn staging_metadata(
    target: &TableMetadata,
    location: &str,
    properties: HashMap<String, String>,
) -> Result<TableMetadata> {
    let mut json = serde_json::to_value(target).map_err(|e| Error::invalid(e.to_string()))?;
    let object = json
        .as_object_mut()
        .ok_or_else(|| Error::invalid("internal: table metadata is not a JSON object"))?;
    let mut props: BTreeMap<String, String> = target
        .properties()
        .iter()
        .filter(|(k, _)| inherited(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    props.extend(properties);
    object.insert("table-uuid".into(), uuid::Uuid::new_v4().to_string().into());
    object.insert("location".into(), location.into());
    object.insert(
        "last-updated-ms".into(),
        Utc::now().timestamp_millis().into(),
    );
    object.insert("last-sequence-number".into(), 0.into());
    object.insert(
        "properties".into(),
        serde_json::to_value(props).unwrap_or_default(),
    );
    object.insert("snapshots".into(), serde_json::Value::Array(vec![]));
    object.insert("snapshot-log".into(), serde_json::Value::Array(vec![]));
    object.insert("metadata-log".into(), serde_json::Value::Array(vec![]));
    object.insert("refs".into(), serde_json::Value::Object(Default::default()));
    object.insert("statistics".into(), serde_json::Value::Array(vec![]));
    object.insert(
        "partition-statistics".into(),
        serde_json::Value::Array(vec![]),
    );
    object.remove("current-snapshot-id");
    if object.contains_key("next-row-id") {
        object.insert("next-row-id".into(), 0.into());
    }
    serde_json::from_value(json).map_err(|e| {
        Error::invalid(format!(
            "internal: staging metadata for {location} is invalid: {e}"
        ))
    })
}

/// What `CREATE UPLOAD` answers for session `id`.
fn opened(
    catalog: &IcebergCatalog,
    id: &UploadId,
    target: &str,
    state: UploadState,
    expires_at: Option<DateTime<Utc>>,
) -> Result<UploadOpened> {
    Ok(UploadOpened {
        upload_id: id.clone(),
        staging_table: id.staging_table().to_string(),
        target_table: target.to_string(),
        state,
        expires_at,
        catalog: catalog.name().to_string(),
        connection: catalog.connection_json()?,
    })
}

/// With a caller-chosen id: the upload that already has it, if it is the
/// same request again (same target and owner); an error if the id is taken.
async fn existing_upload(
    ctx: &CommandContext,
    id: &UploadId,
    target: &str,
    owner: Option<&str>,
) -> Result<Option<UploadOpened>> {
    let Some(record) = super::status::status_of(&ctx.icestage, id).await? else {
        return Ok(None);
    };
    if record.target != target || record.owner.as_deref() != owner {
        return Err(Error::invalid(format!(
            "upload id '{id}' is already taken by another upload: choose another idempotency key"
        )));
    }
    let catalog = ctx.icestage.catalog(&record.catalog)?;
    Ok(Some(opened(
        catalog,
        id,
        target,
        record.state,
        record.expires_at,
    )?))
}

pub(crate) async fn create_upload(
    ctx: &CommandContext,
    catalog: &str,
    target: &TableIdent,
    options: &UploadOptions,
) -> Result<UploadOpened> {
    let owner = options.owner.as_deref();
    let catalog = ctx.icestage.catalog(catalog)?;
    let target_name = target.to_string();
    if target.namespace().join(".") == STAGING_NAMESPACE {
        return Err(Error::invalid(format!(
            "'{target_name}' is a staging table: open uploads for the target table it stages"
        )));
    }
    let table = catalog.catalog().load_table(target).await.map_err(|e| {
        if is_missing(&e) {
            Error::TableNotFound {
                table: target_name.clone(),
                hint: format!(
                    " in catalog '{}': create it first with CREATE TABLE {target_name} (...), \
                     or check the name with SHOW TABLES",
                    catalog.name()
                ),
            }
        } else {
            e.into()
        }
    })?;
    let ttl = bounded_ttl(
        options.ttl.as_ref().unwrap_or(&ctx.options.upload_ttl),
        &ctx.options.max_ttl,
        "upload",
    )?;
    let id = match &options.upload_id {
        Some(id) => {
            if let Some(opened) = existing_upload(ctx, id, &target_name, owner).await? {
                return Ok(opened);
            }
            id.clone()
        }
        None => UploadId::random(),
    };
    let created_at = Utc::now();
    let expires_at = created_at
        + ChronoDuration::from_std(ttl).map_err(|_| Error::invalid("upload ttl is too long"))?;
    catalog
        .ensure_namespace(&NamespaceIdent::new(STAGING_NAMESPACE.to_string()))
        .await?;
    // The log that will record how this upload ends, created now rather than
    // by racing promotions.
    crate::session::log::log_table(catalog, crate::session::log::UPLOADS).await?;
    let ident = id.staging_table();
    let mut properties = HashMap::from([
        (PROP_UPLOAD_ID.to_string(), id.to_string()),
        (PROP_TARGET.to_string(), target_name.clone()),
        (PROP_STATE.to_string(), UploadState::Open.to_string()),
        (PROP_CREATED_AT.to_string(), created_at.to_rfc3339()),
        (PROP_EXPIRES_AT.to_string(), expires_at.to_rfc3339()),
    ]);
    if let Some(owner) = owner {
        properties.insert(PROP_OWNER.to_string(), owner.to_string());
    }
    let key = super::seal::key(catalog).await?;
    properties.insert(
        super::seal::PROP_SEAL.to_string(),
        super::seal::seal(&key, &properties),
    );
    // A staging table is icestage's: a bounded metadata folder, whatever
    // the target's own settings.
    properties.extend(crate::catalog::owned_table_properties());
    match catalog.default_table_location(&ident) {
        Some(location) if catalog.can_register_tables() => {
            let metadata = staging_metadata(table.metadata(), &location, properties)?;
            let metadata_location = MetadataLocation::new_with_metadata(location, &metadata);
            metadata
                .write_to(table.file_io(), &metadata_location)
                .await?;
            catalog
                .catalog()
                .register_table(&ident, metadata_location.to_string())
                .await?;
        }
        // The catalog places tables itself and cannot register metadata
        // (S3 Tables): a new table with the target's columns, spec and sort
        // order, whose field ids the catalog assigns; promotion then maps
        // columns by name.
        _ => {
            let metadata = table.metadata();
            let mut props: HashMap<String, String> = metadata
                .properties()
                .iter()
                .filter(|(k, _)| inherited(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            props.extend(properties);
            let creation = TableCreation::builder()
                .name(ident.name().to_string())
                .schema(metadata.current_schema().as_ref().clone())
                .partition_spec(
                    metadata
                        .default_partition_spec()
                        .as_ref()
                        .clone()
                        .into_unbound(),
                )
                .sort_order(metadata.default_sort_order().as_ref().clone())
                .properties(props)
                .format_version(metadata.format_version())
                .build();
            catalog
                .catalog()
                .create_table(ident.namespace(), creation)
                .await?;
        }
    }

    opened(
        catalog,
        &id,
        &target_name,
        UploadState::Open,
        Some(expires_at),
    )
}
