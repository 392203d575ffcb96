//! `CREATE UPLOAD FOR <table>`: a staging table with the target's schema,
//! field ids, partition spec and sort order, registered in the target's catalog.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use iceberg::spec::TableMetadata;
use iceberg::{MetadataLocation, NamespaceIdent, TableCreation};

use super::{
    PROP_CREATED_AT, PROP_EXPIRES_AT, PROP_OWNER, PROP_STATE, PROP_TARGET, PROP_UPLOAD_ID,
    STAGING_NAMESPACE, UploadId, UploadState, is_missing,
};
use crate::catalog::{IcebergCatalog, TableName};
use crate::config::{OptionDoc, Ttl, WithOptions, bounded_ttl, option};
use crate::error::{Error, Result};
use crate::rows::result_row;
use crate::session::CommandContext;
use crate::session::operation::Operation;

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

/// `CREATE UPLOAD FOR <table> [WITH (...)]`.
#[derive(Debug)]
pub(crate) struct CreateUpload {
    pub(crate) target: TableName,
    pub(crate) options: UploadOptions,
}

impl Operation for CreateUpload {
    const NAME: &'static str = "CreateUpload";
    type Outcome = UploadOpened;

    async fn run(&self, ctx: &CommandContext) -> Result<UploadOpened> {
        create_upload(ctx, &self.target, &self.options).await
    }
}

impl fmt::Display for CreateUpload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "target={}", self.target)?;
        if let Some(ttl) = &self.options.ttl {
            write!(f, ", ttl={ttl}")?;
        }
        if let Some(owner) = &self.options.owner {
            write!(f, ", owner={owner}")?;
        }
        Ok(())
    }
}

impl WithOptions for UploadOptions {
    const STATEMENT: &'static str = "CREATE UPLOAD";
    const OPTIONS: &'static [OptionDoc] = &[
        OptionDoc {
            key: "ttl",
            default: "the session's `icestage.upload_ttl`",
            doc: "how long the upload stays open (at most `icestage.max_ttl`)",
        },
        OptionDoc {
            key: "owner",
            default: "none",
            doc: "who the upload belongs to (a service's caller)",
        },
        OptionDoc {
            key: "upload_id",
            default: "a new id",
            doc: "a caller-chosen id: asking again with it, the same target and owner answers the same upload",
        },
    ];

    fn parse(pairs: &[(String, String)]) -> Result<Self> {
        Ok(Self {
            ttl: option(pairs, "ttl").map(Ttl::parse).transpose()?,
            owner: option(pairs, "owner").map(str::to_string),
            upload_id: option(pairs, "upload_id")
                .map(UploadId::parse)
                .transpose()?,
        })
    }
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
        pub connection: String => json,
        /// Where the client puts the files its rows reference (a column
        /// declared `FILE`): the staging table's `files/` folder, reachable
        /// with the session's own access. `NULL` on a catalog that places
        /// tables itself (S3 Tables).
        pub files_location: Option<String>,
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
/// of the staging table would delete), so the metadata is written out field
/// by field as the Iceberg spec names them, from the target's parts alone:
/// its snapshots (one per promotion, thousands on a busy target) are never
/// copied, so opening a session costs the same whatever the target's history.
pub(crate) fn staging_metadata(
    target: &TableMetadata,
    location: &str,
    properties: HashMap<String, String>,
) -> Result<TableMetadata> {
    use serde_json::json;

    let invalid = |e: serde_json::Error| {
        Error::internal(format!("staging metadata for {location} is invalid: {e}"))
    };
    // A JSON array of `items`, as the spec writes each.
    fn array<'a, T: serde::Serialize + 'a>(
        items: impl Iterator<Item = &'a T>,
    ) -> serde_json::Result<serde_json::Value> {
        serde_json::to_value(items.collect::<Vec<_>>())
    }
    let mut props: BTreeMap<String, String> = target
        .properties()
        .iter()
        .filter(|(k, _)| inherited(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    props.extend(properties);
    let schemas = array(target.schemas_iter().map(AsRef::as_ref)).map_err(invalid)?;
    let specs = array(target.partition_specs_iter().map(AsRef::as_ref)).map_err(invalid)?;
    let orders = array(target.sort_orders_iter().map(AsRef::as_ref)).map_err(invalid)?;
    let mut object = json!({
        "format-version": target.format_version() as u8,
        "table-uuid": uuid::Uuid::new_v4().to_string(),
        "location": location,
        "last-sequence-number": 0,
        "last-updated-ms": Utc::now().timestamp_millis(),
        "last-column-id": target.last_column_id(),
        "schemas": schemas,
        "current-schema-id": target.current_schema_id(),
        "partition-specs": specs,
        "default-spec-id": target.default_partition_spec_id(),
        "last-partition-id": target.last_partition_id(),
        "properties": props,
        "sort-orders": orders,
        "default-sort-order-id": target.default_sort_order_id(),
        "snapshots": [],
        "snapshot-log": [],
        "metadata-log": [],
        "refs": {},
    });
    if target.format_version() >= iceberg::spec::FormatVersion::V3 {
        object["next-row-id"] = 0.into();
        if target.encryption_keys_iter().len() > 0 {
            object["encryption-keys"] = array(target.encryption_keys_iter()).map_err(invalid)?;
        }
    }
    serde_json::from_value(object).map_err(invalid)
}

/// What `CREATE UPLOAD` answers for session `id`.
async fn opened(
    catalog: &IcebergCatalog,
    id: &UploadId,
    target: &str,
    state: UploadState,
    expires_at: Option<DateTime<Utc>>,
) -> Result<UploadOpened> {
    let ident = id.staging_table();
    let location = match catalog.default_table_location(&ident) {
        Some(location) if catalog.can_register_tables() => Some(location),
        _ => match catalog.catalog().load_table(&ident).await {
            Ok(table) => catalog.placed_location(&table),
            Err(_) => None,
        },
    };
    Ok(UploadOpened {
        files_location: location.map(|l| crate::tables::files::files_folder(&l)),
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
    Ok(Some(
        opened(catalog, id, target, record.state, record.expires_at).await?,
    ))
}

async fn create_upload(
    ctx: &CommandContext,
    table: &TableName,
    options: &UploadOptions,
) -> Result<UploadOpened> {
    let owner = options.owner.as_deref();
    let catalog = ctx.icestage.catalog(&table.catalog)?;
    let target = &table.ident;
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
        (
            super::seal::PROP_EVIDENCE.to_string(),
            super::seal::PROOF_V1.to_string(),
        ),
    ]);
    if let Some(owner) = owner {
        properties.insert(PROP_OWNER.to_string(), owner.to_string());
    }
    let key = super::seal::key(catalog).await?;
    properties.insert(
        super::seal::PROP_SEAL.to_string(),
        super::seal::seal(&key, &properties),
    );
    // A staging table is icestage's: a bounded metadata folder and no
    // merges, whatever the target's own settings.
    properties.extend(crate::catalog::session_table_properties());
    match catalog.default_table_location(&ident) {
        Some(location) if catalog.can_register_tables() => {
            let metadata = staging_metadata(table.metadata(), &location, properties)?;
            let metadata_location = MetadataLocation::new_with_metadata(location, &metadata);
            // Named by its content: a client that rewrites it in place is
            // found out (`catalog::pointer::rewritten`).
            let written = crate::catalog::pointer::write_metadata(
                table.file_io(),
                &metadata,
                &metadata_location,
            )
            .await?;
            catalog.catalog().register_table(&ident, written).await?;
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
    .await
}

#[cfg(test)]
mod tests {
    use iceberg::spec::{PartitionSpec, Schema, SortOrder};

    use super::*;

    /// A target after a schema change, with a partition spec, a sort order,
    /// two snapshots, a metadata log and properties of every kind.
    fn target(format_version: u8) -> TableMetadata {
        let mut json = serde_json::json!({
            "format-version": format_version,
            "table-uuid": "9c12d441-03fe-4693-9a96-a0705ddf69c1",
            "location": "file:///wh/shop/orders",
            "last-sequence-number": 2,
            "last-updated-ms": 1_700_000_000_000i64,
            "last-column-id": 3,
            "current-schema-id": 1,
            "schemas": [
                {"type": "struct", "schema-id": 0, "fields": [
                    {"id": 1, "name": "id", "required": true, "type": "long"},
                    {"id": 2, "name": "cents", "required": false, "type": "long"}]},
                {"type": "struct", "schema-id": 1, "identifier-field-ids": [1], "fields": [
                    {"id": 1, "name": "id", "required": true, "type": "long"},
                    {"id": 3, "name": "note", "required": false, "type": "string"}]}
            ],
            "default-spec-id": 1,
            "partition-specs": [
                {"spec-id": 0, "fields": []},
                {"spec-id": 1, "fields": [
                    {"name": "id_bucket", "transform": "bucket[4]", "source-id": 1, "field-id": 1000}]}
            ],
            "last-partition-id": 1000,
            "default-sort-order-id": 1,
            "sort-orders": [
                {"order-id": 0, "fields": []},
                {"order-id": 1, "fields": [
                    {"transform": "identity", "source-id": 1, "direction": "asc", "null-order": "nulls-first"}]}
            ],
            "properties": {
                "write.format.default": "parquet",
                "write.parquet.compression-codec": "zstd",
                "write.data.path": "s3://elsewhere/data",
                "write.object-storage.enabled": "true",
                "owner": "shop"
            },
            "current-snapshot-id": 2,
            "refs": {"main": {"snapshot-id": 2, "type": "branch"}},
            "snapshots": [
                {"snapshot-id": 1, "sequence-number": 1, "timestamp-ms": 1_700_000_000_000i64,
                 "manifest-list": "file:///wh/shop/orders/metadata/snap-1.avro",
                 "summary": {"operation": "append", "upload-id": "a"}, "schema-id": 0},
                {"snapshot-id": 2, "parent-snapshot-id": 1, "sequence-number": 2,
                 "timestamp-ms": 1_700_000_000_001i64,
                 "manifest-list": "file:///wh/shop/orders/metadata/snap-2.avro",
                 "summary": {"operation": "append", "upload-id": "b"}, "schema-id": 1}
            ],
            "snapshot-log": [{"snapshot-id": 1, "timestamp-ms": 1_700_000_000_000i64},
                             {"snapshot-id": 2, "timestamp-ms": 1_700_000_000_001i64}],
            "metadata-log": [{"metadata-file": "file:///wh/shop/orders/metadata/00000.metadata.json",
                              "timestamp-ms": 1_699_999_999_999i64}]
        });
        if format_version == 3 {
            json["next-row-id"] = 10.into();
            for snapshot in json["snapshots"].as_array_mut().unwrap() {
                snapshot["first-row-id"] = 0.into();
                snapshot["added-rows"] = 5.into();
            }
        }
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_staging_table_has_the_targets_layout_and_none_of_its_history() {
        for format_version in [2, 3] {
            let target = target(format_version);
            let location = "file:///wh/staging/upload_x";
            let staging = staging_metadata(
                &target,
                location,
                HashMap::from([(PROP_STATE.to_string(), "open".to_string())]),
            )
            .unwrap();
            assert_eq!(staging.format_version(), target.format_version());
            assert_eq!(staging.location(), location);
            assert_ne!(staging.uuid(), target.uuid());
            // Field ids, schema ids, specs and orders as the target has them.
            assert_eq!(staging.last_column_id(), 3);
            assert_eq!(staging.current_schema_id(), 1);
            // (Kept in maps: compared in id order.)
            fn by_id<T: Clone, K: Ord>(
                items: impl Iterator<Item = impl AsRef<T>>,
                id: impl Fn(&T) -> K,
            ) -> Vec<T> {
                let mut all: Vec<T> = items.map(|item| item.as_ref().clone()).collect();
                all.sort_by_key(|item| id(item));
                all
            }
            let schemas = |m: &TableMetadata| by_id(m.schemas_iter(), |s: &Schema| s.schema_id());
            assert_eq!(schemas(&staging), schemas(&target));
            assert_eq!(staging.default_partition_spec_id(), 1);
            assert_eq!(staging.last_partition_id(), 1000);
            let specs = |m: &TableMetadata| {
                by_id(m.partition_specs_iter(), |s: &PartitionSpec| s.spec_id())
            };
            assert_eq!(specs(&staging), specs(&target));
            assert_eq!(staging.default_sort_order_id(), 1);
            let orders =
                |m: &TableMetadata| by_id(m.sort_orders_iter(), |o: &SortOrder| o.order_id);
            assert_eq!(orders(&staging), orders(&target));
            // None of its history.
            assert_eq!(staging.snapshots().count(), 0);
            assert!(staging.current_snapshot().is_none());
            assert_eq!(staging.history().len(), 0);
            assert_eq!(staging.metadata_log().len(), 0);
            assert_eq!(staging.last_sequence_number(), 0);
            if format_version == 3 {
                assert_eq!(staging.next_row_id(), 0);
            }
            // How files are written, never where; the session's own.
            let props: BTreeMap<_, _> = staging.properties().clone().into_iter().collect();
            assert_eq!(
                props,
                BTreeMap::from([
                    ("write.format.default".to_string(), "parquet".to_string()),
                    (
                        "write.parquet.compression-codec".to_string(),
                        "zstd".to_string()
                    ),
                    (PROP_STATE.to_string(), "open".to_string()),
                ])
            );
        }
    }
}
