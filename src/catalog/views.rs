//! Iceberg views on a SQL catalog, kept as Iceberg's JDBC catalog keeps
//! them: a row of `iceberg_tables` whose `iceberg_type` is `VIEW`, pointing
//! at a view metadata file under the view's folder
//! (`<warehouse>/<namespace>/<view>/metadata/`), which icestage writes.
//! Every change is a new metadata file and one compare-and-swap of the
//! row's pointer, as for tables ([`super::database`]).
//!
//! Catalogs that keep their own entries (S3 Tables, a REST catalog) are
//! not served views here.

use iceberg::spec::ViewMetadata;
use iceberg::{NamespaceIdent, TableIdent};

use super::IcebergCatalog;
use super::database::{Database, Entry};
use super::pointer::PointerStore;
use crate::error::{Error, Result};

/// A view as the catalog holds it: where its pointer points and what the
/// file there holds.
#[derive(Debug, Clone)]
pub(crate) struct StoredView {
    pub(crate) metadata_location: String,
    pub(crate) metadata: ViewMetadata,
}

/// The metadata file that follows `previous` (`None`: the first) of a view
/// at `location`: `<location>/metadata/<version>-<uuid>.metadata.json`.
fn next_file(location: &str, previous: Option<&str>) -> String {
    let version = previous
        .and_then(|path| path.rsplit('/').next())
        .and_then(|file| file.split_once('-'))
        .and_then(|(version, _)| version.parse::<u64>().ok())
        .map_or(0, |v| v + 1);
    format!(
        "{}/metadata/{version:05}-{}.metadata.json",
        location.trim_end_matches('/'),
        uuid::Uuid::new_v4()
    )
}

fn failed(what: String) -> impl FnOnce(sqlx::Error) -> Error {
    move |e| Error::from(super::snapshot::unexpected(format!("{what}: {e}")))
}

impl IcebergCatalog {
    /// The database and catalog name that hold this catalog's views.
    fn view_store(&self) -> Result<(&Database, &str)> {
        match self.pointers() {
            PointerStore::Sql {
                database,
                catalog_name,
            } => Ok((database, catalog_name)),
            _ => Err(Error::invalid(format!(
                "catalog '{}' keeps no views here: views are served on SQL catalogs",
                self.name()
            ))),
        }
    }

    /// Whether this catalog keeps views (a SQL catalog).
    pub(crate) fn keeps_views(&self) -> bool {
        self.view_store().is_ok()
    }

    /// The views of `namespace`.
    pub(crate) async fn list_views(&self, namespace: &NamespaceIdent) -> Result<Vec<TableIdent>> {
        let (database, catalog) = self.view_store()?;
        let names = database
            .names(catalog, &namespace.join("."), Entry::View)
            .await
            .map_err(failed(format!(
                "cannot list the views of {}",
                namespace.join(".")
            )))?;
        Ok(names
            .into_iter()
            .map(|name| TableIdent::new(namespace.clone(), name))
            .collect())
    }

    /// View `ident` (`None`: no such view), its metadata read within
    /// [`crate::limits::ReadLimits::metadata_bytes`].
    pub(crate) async fn load_view(&self, ident: &TableIdent) -> Result<Option<StoredView>> {
        let (database, catalog) = self.view_store()?;
        let Some(location) = database
            .entry_pointer(catalog, ident, Entry::View)
            .await
            .map_err(failed(format!("cannot read the pointer of view {ident}")))?
        else {
            return Ok(None);
        };
        let io = self
            .file_io()
            .ok_or_else(|| Error::internal(format!("no file IO for view {ident}")))?;
        let bytes =
            super::confine::read_bounded(io, &location)
                .await?
                .map_err(|(size, bound)| {
                    Error::invalid(format!(
                        "the metadata file of view {ident}, {location}, holds {size} bytes, more \
                     than the {} a metadata file may hold (limits.metadata_bytes): it was \
                     written outside icestage; drop the view and create it again",
                        crate::limits::human(bound)
                    ))
                })?;
        let metadata = serde_json::from_slice(&bytes).map_err(|e| {
            Error::invalid(format!(
                "the metadata file of view {ident}, {location}, is not view metadata: {e}"
            ))
        })?;
        Ok(Some(StoredView {
            metadata_location: location,
            metadata,
        }))
    }

    /// Whether a table or view named `ident` exists.
    pub(crate) async fn name_taken(&self, ident: &TableIdent) -> Result<bool> {
        let (database, catalog) = self.view_store()?;
        for entry in [Entry::Table, Entry::View] {
            if database
                .entry_pointer(catalog, ident, entry)
                .await
                .map_err(failed(format!("cannot read the pointer of {ident}")))?
                .is_some()
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Writes `metadata` as the file that follows `previous` and returns
    /// its path.
    async fn write_view(&self, metadata: &ViewMetadata, previous: Option<&str>) -> Result<String> {
        let io = self
            .file_io()
            .ok_or_else(|| Error::internal("no file IO for a view".to_string()))?;
        let path = next_file(metadata.location(), previous);
        let bytes = serde_json::to_vec(metadata)
            .map_err(|e| Error::internal(format!("cannot write view metadata: {e}")))?;
        io.new_output(&path)?.write(bytes.into()).await?;
        Ok(path)
    }

    /// Adds view `ident` with `metadata` (built and checked by icestage):
    /// the view as stored, or `None` when a table or view of that name
    /// exists.
    pub(crate) async fn add_view(
        &self,
        ident: &TableIdent,
        metadata: ViewMetadata,
    ) -> Result<Option<StoredView>> {
        let (database, catalog) = self.view_store()?;
        let path = self.write_view(&metadata, None).await?;
        let added = database
            .insert(catalog, ident, &path, Entry::View)
            .await
            .map_err(failed(format!("cannot add view {ident}")))?;
        Ok(self.settled(added, path, metadata).await)
    }

    /// The view as stored at `path` when the catalog took it (`taken`);
    /// otherwise `None`, and the file written for it is removed (nothing
    /// refers to it).
    async fn settled(
        &self,
        taken: bool,
        path: String,
        metadata: ViewMetadata,
    ) -> Option<StoredView> {
        if !taken {
            if let Some(io) = self.file_io() {
                super::confine::delete_within(io, &path, metadata.location()).await;
            }
            return None;
        }
        Some(StoredView {
            metadata_location: path,
            metadata,
        })
    }

    /// Replaces `base` (view `ident` as loaded) by `metadata` if, and only
    /// if, the view still points at `base`: the view as stored, or `None`
    /// when another change came first.
    pub(crate) async fn replace_view(
        &self,
        ident: &TableIdent,
        base: &StoredView,
        metadata: ViewMetadata,
    ) -> Result<Option<StoredView>> {
        let (database, catalog) = self.view_store()?;
        let path = self
            .write_view(&metadata, Some(&base.metadata_location))
            .await?;
        let swapped = database
            .swap_entry(catalog, ident, &base.metadata_location, &path, Entry::View)
            .await?;
        Ok(self.settled(swapped, path, metadata).await)
    }

    /// Removes view `ident` from the catalog (its files stay, as Iceberg's
    /// catalogs leave them): whether it was there.
    pub(crate) async fn drop_view(&self, ident: &TableIdent) -> Result<bool> {
        let (database, catalog) = self.view_store()?;
        database
            .remove(catalog, ident, Entry::View)
            .await
            .map_err(failed(format!("cannot drop view {ident}")))
    }

    /// Renames view `from` to `to` (which no table or view holds, checked
    /// by the caller; the database's key refuses a racing one): whether
    /// `from` was there.
    pub(crate) async fn rename_view(&self, from: &TableIdent, to: &TableIdent) -> Result<bool> {
        let (database, catalog) = self.view_store()?;
        database
            .rename(catalog, from, to, Entry::View)
            .await
            .map_err(failed(format!("cannot rename view {from} to {to}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_view_metadata_file_follows_the_one_before() {
        let first = next_file("/wh/ns/v/", None);
        assert!(first.starts_with("/wh/ns/v/metadata/00000-"), "{first}");
        let second = next_file("/wh/ns/v", Some(&first));
        assert!(second.starts_with("/wh/ns/v/metadata/00001-"), "{second}");
    }
}
