//! Compare-and-swap of a table's metadata pointer, against the exact version
//! a caller checked.
//!
//! The catalogs' own `update_table` reload the table and apply a commit to
//! whatever version is current then, checking only the commit's
//! requirements; a property change carries none. A state transition that
//! checked version N could therefore land on top of version N+1, written by a
//! racing process. [`PointerStore::swap`] moves the pointer only from the
//! metadata location the caller names, so a transition commits against the
//! version it checked or not at all:
//!
//! * SQL catalog: `UPDATE iceberg_tables ... WHERE metadata_location = <old>`
//!   on the catalog's own database, SQLite or PostgreSQL ([`super::database`]);
//! * S3 Tables: `GetTable` gives the version token of the current metadata
//!   location, and `UpdateTableMetadataLocation` takes that token, so a
//!   location that moved since answers a conflict;
//! * a REST catalog: icestage cannot swap its pointer, but it can make the
//!   catalog's own requirements pin the version ([`super::rest_backend`]).
//!
//! [`PointerStore::commit`] is the one way in: a commit's requirements and
//! updates, applied on exactly the version the caller loaded.

use std::fmt;
use std::str::FromStr;

use super::database::Database;
use super::snapshot::{successor, unexpected};
use iceberg::spec::TableMetadata;
use iceberg::table::Table;
use iceberg::{ErrorKind, MetadataLocation, TableIdent, TableRequirement, TableUpdate};

/// Where a catalog keeps its tables' metadata pointers.
#[derive(Clone)]
pub(crate) enum PointerStore {
    /// The SQL catalog's `iceberg_tables` table, in SQLite or PostgreSQL.
    Sql {
        database: Database,
        catalog_name: String,
    },
    /// An S3 Tables table bucket.
    S3Tables {
        client: aws_sdk_s3tables::Client,
        bucket_arn: String,
    },
    /// An Iceberg REST catalog, whose commits icestage sends itself.
    Rest(super::rest_backend::RestCommits),
}

impl fmt::Debug for PointerStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sql {
                database,
                catalog_name,
            } => write!(f, "{database:?}({catalog_name})"),
            Self::S3Tables { bucket_arn, .. } => write!(f, "S3Tables({bucket_arn})"),
            Self::Rest(commits) => write!(f, "{commits:?}"),
        }
    }
}

/// S3 Tables' `GetTable` for `table`: its metadata location, the version
/// token of that location, and its storage.
async fn get_table(
    client: &aws_sdk_s3tables::Client,
    bucket_arn: &str,
    table: &TableIdent,
) -> iceberg::Result<aws_sdk_s3tables::operation::get_table::GetTableOutput> {
    client
        .get_table()
        .table_bucket_arn(bucket_arn)
        .namespace(table.namespace().to_url_string())
        .name(table.name())
        .send()
        .await
        .map_err(|e| {
            unexpected(format!(
                "cannot read {table} from S3 Tables: {}",
                aws_sdk_s3tables::error::DisplayErrorContext(&e)
            ))
        })
}

impl PointerStore {
    /// Removes the properties `keys` of `namespace`, where the catalog
    /// keeps them in a database icestage reaches (a SQL catalog); iceberg's
    /// catalogs only add and change namespace properties.
    pub(crate) async fn remove_namespace_properties(
        &self,
        namespace: &iceberg::NamespaceIdent,
        keys: &[String],
    ) -> iceberg::Result<()> {
        let Self::Sql {
            database,
            catalog_name,
        } = self
        else {
            return Err(iceberg::Error::new(
                ErrorKind::FeatureUnsupported,
                "this catalog cannot remove namespace properties: set them to another value instead",
            ));
        };
        database
            .remove_namespace_properties(catalog_name, &namespace.join("."), keys)
            .await
            .map(|_| ())
            .map_err(|e| unexpected(format!("cannot remove properties of {namespace:?}: {e}")))
    }

    /// Where the SQL catalog's pointer of `table` points now (`None`: no
    /// such table, or a store that is not a SQL catalog).
    pub(crate) async fn location(&self, table: &TableIdent) -> iceberg::Result<Option<String>> {
        let Self::Sql {
            database,
            catalog_name,
        } = self
        else {
            return Ok(None);
        };
        database
            .pointer(catalog_name, table)
            .await
            .map_err(|e| unexpected(format!("cannot read the pointer of {table}: {e}")))
    }

    /// Commits `updates` to `base`'s table if, and only if, the catalog still
    /// holds `base`'s version and `requirements` hold there: the table as
    /// committed, or `None` when another process committed first. A failed
    /// requirement is an error ([`ErrorKind::CatalogCommitConflicts`]).
    pub(crate) async fn commit(
        &self,
        base: &Table,
        requirements: Vec<TableRequirement>,
        updates: Vec<TableUpdate>,
    ) -> iceberg::Result<Option<Table>> {
        if let Self::Rest(commits) = self {
            return commits.commit(base, requirements, updates).await;
        }
        for requirement in &requirements {
            requirement.check(Some(base.metadata()))?;
        }
        let current = base.metadata_location_result()?;
        let metadata = super::specs::apply(base.metadata(), current, updates)?;
        let location = MetadataLocation::from_str(current)?
            .with_next_version()
            .with_new_metadata(&metadata);
        let Some(location) = self.publish(base, &metadata, &location).await? else {
            crate::metrics::count(
                "icestage_catalog_commit_conflicts_total",
                "Compare-and-swap commits another process's commit came before.",
                &[],
                1.0,
            );
            return Ok(None);
        };
        successor(base, metadata, location).map(Some)
    }

    /// Writes `metadata` as the next version of `base` (at `location`, named
    /// by its content: [`write_metadata`]) and points `base`'s table at it
    /// if, and only if, it still points at `base`'s metadata location; the
    /// new location, or `None` when another process committed first (the
    /// new file is removed again: nothing refers to it).
    async fn publish(
        &self,
        base: &Table,
        metadata: &TableMetadata,
        location: &MetadataLocation,
    ) -> iceberg::Result<Option<String>> {
        let expected = base.metadata_location_result()?;
        let new = write_metadata(base.file_io(), metadata, location).await?;
        let swapped = self.swap(base.identifier(), expected, &new).await?;
        // The folder of the metadata the catalog points at: the catalog's
        // pointer, not the metadata's own claims, says where it is.
        let folder = expected
            .rsplit_once('/')
            .map_or(expected, |(folder, _)| folder);
        let io = base.file_io();
        if !swapped {
            // Best effort: an orphan is harmless, only untidy.
            super::confine::delete_within(io, &new, folder).await;
        } else if metadata
            .properties()
            .get(DELETE_AFTER_COMMIT)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        {
            // As Iceberg's own writers do with this property: the metadata
            // files that fell out of the log (bounded by
            // `write.metadata.previous-versions-max`) are deleted, so a
            // table whose properties change often keeps a bounded folder.
            // Only metadata files beside the one the catalog pointed at: a
            // log entry naming anything else (a client may have written the
            // log) is left alone.
            for old in removed_metadata(base, metadata) {
                if old.ends_with(".metadata.json") {
                    super::confine::delete_within(io, &old, folder).await;
                }
            }
        }
        Ok(swapped.then_some(new))
    }

    /// Points `table` at `new` if, and only if, it points at `expected` now.
    /// `Ok(false)` when it points elsewhere (another process committed).
    pub(crate) async fn swap(
        &self,
        table: &TableIdent,
        expected: &str,
        new: &str,
    ) -> iceberg::Result<bool> {
        match self {
            Self::Sql {
                database,
                catalog_name,
            } => database.swap(catalog_name, table, expected, new).await,
            Self::S3Tables { client, bucket_arn } => {
                let namespace = table.namespace().to_url_string();
                let current = get_table(client, bucket_arn, table).await?;
                if current.metadata_location() != Some(expected) {
                    return Ok(false);
                }
                let sent = client
                    .update_table_metadata_location()
                    .table_bucket_arn(bucket_arn)
                    .namespace(&namespace)
                    .name(table.name())
                    .version_token(current.version_token())
                    .metadata_location(new)
                    .send()
                    .await;
                match sent {
                    Ok(_) => Ok(true),
                    Err(e)
                        if e.as_service_error().is_some_and(|s| {
                            matches!(
                                s,
                                aws_sdk_s3tables::operation::update_table_metadata_location::UpdateTableMetadataLocationError::ConflictException(_)
                            )
                        }) =>
                    {
                        Ok(false)
                    }
                    Err(e) => Err(unexpected(format!(
                        "cannot update the metadata location of {table}: {}",
                        aws_sdk_s3tables::error::DisplayErrorContext(&e)
                    ))),
                }
            }
            Self::Rest(_) => Err(iceberg::Error::new(
                ErrorKind::FeatureUnsupported,
                format!(
                    "internal: {table} is in a REST catalog, whose pointer only moves by commits"
                ),
            )),
        }
    }

    /// The location the catalog assigned to `table`'s storage, where the
    /// catalog (not the table's own metadata) says it: S3 Tables'
    /// `warehouseLocation`. `None` for catalogs that place tables by rule.
    pub(crate) async fn assigned_location(
        &self,
        table: &TableIdent,
    ) -> iceberg::Result<Option<String>> {
        match self {
            Self::S3Tables { client, bucket_arn } => {
                let current = get_table(client, bucket_arn, table).await?;
                Ok(Some(current.warehouse_location().to_string()))
            }
            _ => Ok(None),
        }
    }
}

/// Writes `metadata` where `location` says, named by its content: the
/// file name's UUID is the first 16 bytes of the SHA-256 of the bytes
/// written (a version-8 UUID), so the pointer the catalog keeps also pins
/// what the file holds ([`rewritten`] checks it). Compressed metadata
/// (`write.metadata.compression-codec`) is written as iceberg writes it,
/// under a random UUID. The path written.
pub(crate) async fn write_metadata(
    io: &iceberg::io::FileIO,
    metadata: &TableMetadata,
    location: &MetadataLocation,
) -> iceberg::Result<String> {
    let named = location.to_string();
    if !matches!(location.compression_codec().suffix(), Ok("")) {
        metadata.write_to(io, location).await?;
        return Ok(named);
    }
    let bytes = serde_json::to_vec(metadata).map_err(|e| {
        iceberg::Error::new(
            ErrorKind::DataInvalid,
            format!("cannot write metadata: {e}"),
        )
    })?;
    let (folder, file) = named.rsplit_once('/').unwrap_or(("", &named));
    let version = file.split_once('-').map_or(file, |(v, _)| v);
    let path = format!(
        "{folder}/{version}-{}.metadata.json",
        content_id(&bytes).hyphenated()
    );
    io.new_output(&path)?.write(bytes.into()).await?;
    Ok(path)
}

/// The version-8 UUID that names metadata `bytes` ([`write_metadata`]).
fn content_id(bytes: &[u8]) -> uuid::Uuid {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(bytes);
    let mut first = [0u8; 16];
    first.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(first).into_uuid()
}

/// The content id that names the metadata file at `path`, when its name
/// carries one (icestage's own files, [`write_metadata`]).
fn named_content_id(path: &str) -> Option<uuid::Uuid> {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.strip_suffix(".metadata.json")
        .and_then(|stem| stem.split_once('-'))
        .and_then(|(_, id)| uuid::Uuid::parse_str(id).ok())
        .filter(|id| id.get_version_num() == 8)
}

/// Whether the metadata file at `path` still holds what icestage wrote
/// there: `None` when it does, or when its name carries no content id
/// (another writer's file); otherwise why not. Read only within
/// [`crate::limits::ReadLimits::metadata_bytes`].
pub(crate) async fn rewritten(
    io: &iceberg::io::FileIO,
    path: &str,
) -> iceberg::Result<Option<String>> {
    if named_content_id(path).is_none() {
        return Ok(None);
    }
    let bytes = match super::confine::read_bounded(io, path).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err((size, bound))) => {
            return Ok(Some(format!(
                "its metadata file {path} holds {size} bytes, more than the {} icestage writes \
                 at most (limits.metadata_bytes): it was rewritten in place",
                crate::limits::human(bound)
            )));
        }
        Err(e) => {
            return Err(iceberg::Error::new(
                ErrorKind::Unexpected,
                format!("cannot read {path}: {e}"),
            ));
        }
    };
    Ok(rewritten_bytes(path, &bytes))
}

/// [`rewritten`] for `bytes`, read from `path` already.
pub(crate) fn rewritten_bytes(path: &str, bytes: &[u8]) -> Option<String> {
    let id = named_content_id(path)?;
    (content_id(bytes) != id).then(|| {
        format!(
            "its metadata file {path} is not the one icestage committed (its content changed \
             after it was written): a client rewrote it in place"
        )
    })
}

/// The table property that asks for old metadata files to be deleted.
const DELETE_AFTER_COMMIT: &str = "write.metadata.delete-after-commit.enabled";

/// The metadata files `base` knew (its own and its log) that `next`'s log no
/// longer holds.
fn removed_metadata(base: &Table, next: &TableMetadata) -> Vec<String> {
    let kept: std::collections::HashSet<&str> = next
        .metadata_log()
        .iter()
        .map(|entry| entry.metadata_file.as_str())
        .collect();
    base.metadata()
        .metadata_log()
        .iter()
        .map(|entry| entry.metadata_file.as_str())
        .chain(base.metadata_location())
        .filter(|file| !kept.contains(file))
        .map(str::to_string)
        .collect()
}
