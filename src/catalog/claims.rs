//! Which table a folder of a SQL catalog's warehouse belongs to.
//!
//! A table's files lie under its location, and purging a table deletes
//! what is there. On a SQL catalog a table's location comes from the rule
//! (`<warehouse>/<namespace>/<table>`), from a rename (the table keeps its
//! folder under its new name) or from a registered metadata file. So that
//! no purge ever reaches another table's files, a location is held by at
//! most one live table: a new table (created, created in stages or
//! registered) whose location overlaps a live table's (the same folder, or
//! one inside the other) is refused, and a purge deletes only under a
//! location no other live table overlaps ([`IcebergCatalog::purge_location`]).
//!
//! Other catalogs place each table themselves and are not asked.

use iceberg::spec::TableMetadata;
use iceberg::table::Table;
use iceberg::{MetadataLocation, NamespaceIdent, TableIdent};

use super::pointer::PointerStore;
use super::{CatalogKind, IcebergCatalog, confine};
use crate::error::{Error, Result};

/// The location of the table whose metadata file is `metadata_location`:
/// the folder above its `metadata/` folder (or, for a file kept elsewhere,
/// the folder that holds it).
pub(crate) fn table_location(metadata_location: &str) -> &str {
    metadata_location
        .rsplit_once("/metadata/")
        .or_else(|| metadata_location.rsplit_once('/'))
        .map_or(metadata_location, |(location, _)| location)
}

/// Whether `a` and `b` are the same folder or one lies inside the other.
pub(crate) fn overlap(a: &str, b: &str) -> bool {
    let same = matches!(
        (confine::canonical(a), confine::canonical(b)),
        (Some(a), Some(b)) if a == b
    );
    same || confine::is_under(a, b) || confine::is_under(b, a)
}

/// Why a purge of a table is refused, for the caller's message.
#[derive(Debug)]
pub(crate) enum Unpurgeable {
    /// Its location is not a table's own folder below the warehouse.
    NotATableFolder(String),
    /// Another live table's location overlaps its own.
    Shared { location: String, with: TableIdent },
}

impl std::fmt::Display for Unpurgeable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotATableFolder(location) => write!(
                f,
                "its location {location} is not a table's own folder in the warehouse"
            ),
            Self::Shared { location, with } => write!(
                f,
                "its location {location} overlaps the location of table {with}"
            ),
        }
    }
}

impl IcebergCatalog {
    /// What a SQL catalog's metadata files are read and written with
    /// (`None` for catalogs that keep their tables' metadata themselves).
    pub(crate) fn file_io(&self) -> Option<&iceberg::io::FileIO> {
        match self.kind() {
            CatalogKind::Sql { .. } => self.scoped.kept_tables().map(|kept| kept.io()),
            _ => None,
        }
    }

    /// The live tables and views other than `except` whose location
    /// overlaps `location`, with their locations; none on a catalog that
    /// places tables itself.
    pub(crate) async fn holders(
        &self,
        location: &str,
        except: Option<&TableIdent>,
    ) -> Result<Vec<(TableIdent, String)>> {
        let PointerStore::Sql {
            database,
            catalog_name,
        } = self.pointers()
        else {
            return Ok(Vec::new());
        };
        let tables = database.entries(catalog_name).await.map_err(|e| {
            Error::from(super::snapshot::unexpected(format!(
                "cannot list the tables of catalog '{catalog_name}': {e}"
            )))
        })?;
        let mut holders = Vec::new();
        for (namespace, name, metadata_location) in tables {
            let held = table_location(&metadata_location);
            if !overlap(held, location) {
                continue;
            }
            let Ok(namespace) = NamespaceIdent::from_strs(namespace.split('.')) else {
                continue;
            };
            let ident = TableIdent::new(namespace, name);
            if Some(&ident) != except {
                holders.push((ident, held.to_string()));
            }
        }
        Ok(holders)
    }

    /// Where a purge of `table` may delete: the location icestage assigned
    /// to it ([`Self::assigned_location`]), if that is a table's own folder
    /// (two levels or more below a SQL catalog's warehouse) that no other
    /// live table's location overlaps. `Ok(Err(..))` says why not.
    pub(crate) async fn purge_location(
        &self,
        table: &Table,
    ) -> Result<std::result::Result<String, Unpurgeable>> {
        let location = self.assigned_location(table).await?;
        if let CatalogKind::Sql { warehouse, .. } = self.kind() {
            let depth = confine::canonical(&location)
                .zip(confine::canonical(warehouse))
                .and_then(|(location, warehouse)| {
                    location
                        .strip_prefix(&warehouse)
                        .map(|rest| rest.split('/').filter(|s| !s.is_empty()).count())
                })
                .unwrap_or(0);
            if depth < 2 {
                return Ok(Err(Unpurgeable::NotATableFolder(location)));
            }
        }
        let holders = self.holders(&location, Some(table.identifier())).await?;
        if let Some((with, _)) = holders.into_iter().next() {
            return Ok(Err(Unpurgeable::Shared { location, with }));
        }
        Ok(Ok(location))
    }

    /// Adds `table` to a SQL catalog with `metadata` (built and checked by
    /// icestage), written as its first metadata file under the metadata's
    /// location, named by its content: the table as added, or `None` when
    /// a table of that name exists (the file written is removed again).
    pub(crate) async fn add_table(
        &self,
        table: &TableIdent,
        metadata: TableMetadata,
    ) -> Result<Option<Table>> {
        let (
            PointerStore::Sql {
                database,
                catalog_name,
            },
            Some(kept),
        ) = (self.pointers(), self.scoped.kept_tables())
        else {
            return Err(Error::invalid(format!(
                "catalog '{}' places and adds its tables itself: create {table} there",
                self.name()
            )));
        };
        let location = metadata.location().to_string();
        let named = MetadataLocation::new_with_metadata(&location, &metadata);
        let written = super::pointer::write_metadata(kept.io(), &metadata, &named).await?;
        let added = database
            .insert(catalog_name, table, &written, super::database::Entry::Table)
            .await
            .map_err(|e| {
                Error::from(super::snapshot::unexpected(format!(
                    "cannot add {table} to catalog '{catalog_name}': {e}"
                )))
            })?;
        if !added {
            confine::delete_within(kept.io(), &written, &location).await;
            return Ok(None);
        }
        kept.forget(table);
        Ok(Some(
            Table::builder()
                .identifier(table.clone())
                .file_io(kept.io().clone())
                .metadata(metadata)
                .metadata_location(written)
                .runtime(iceberg::Runtime::current())
                .build()?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_location_is_the_folder_above_its_metadata() {
        assert_eq!(
            table_location("s3://b/wh/ns/t/metadata/00001-x.metadata.json"),
            "s3://b/wh/ns/t"
        );
        assert_eq!(table_location("/wh/ns/t/v1.json"), "/wh/ns/t");
    }

    #[test]
    fn locations_overlap_when_one_holds_the_other() {
        assert!(overlap("/wh/ns/t", "/wh/ns/t"));
        assert!(overlap("/wh/ns/t", "/wh/ns/t/inner"));
        assert!(overlap("/wh/ns", "/wh/ns/t"));
        assert!(!overlap("/wh/ns/t", "/wh/ns/t2"));
        assert!(!overlap("/wh/ns/a", "/wh/ns/b"));
    }
}
