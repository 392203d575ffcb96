//! Confinement: every path a staging table's metadata names must lie under
//! the location icestage gave the table, and nothing outside it is ever
//! read, promoted or deleted on the table's behalf.
//!
//! The location itself is not taken from the table's metadata (the client
//! writes that): the SQL catalog places a staging table by rule under the
//! warehouse, and S3 Tables reports the storage it assigned.

use super::Staging;
use crate::catalog::confine::{canonical, is_under, metadata_paths, through_link};
use crate::error::Result;

/// Where icestage placed the staging table of `staging`: by the catalog's
/// rule, or as the catalog reports it ([`IcebergCatalog::placed_location`]
/// says where a client's metadata cannot have moved it).
///
/// [`IcebergCatalog::placed_location`]: crate::catalog::IcebergCatalog::placed_location
pub(crate) async fn assigned_location(staging: &Staging) -> Result<String> {
    staging.catalog.placed_or_reported(&staging.table).await
}

/// The current snapshot's manifests, each loaded (those under the location).
pub(crate) type Loaded = Vec<(iceberg::spec::ManifestFile, iceberg::spec::Manifest)>;

/// One line per problem: the table's location moved, or a path outside it;
/// and the current snapshot's manifests, loaded once for the checks that
/// follow. Reads the manifest list and the manifests under the location.
pub(crate) async fn confinement(
    staging: &Staging,
    location: &str,
) -> Result<(Vec<String>, Loaded)> {
    let mut loaded_manifests = vec![];
    let mut problems = vec![];
    let table = &staging.table;
    let claimed = table.metadata().location();
    if canonical(claimed) != canonical(location) {
        problems.push(format!(
            "the staging table's location was changed to '{claimed}'; icestage placed it at \
             '{location}': open a new upload"
        ));
    }
    let mut outside: Vec<String> = metadata_paths(table)
        .into_iter()
        .filter(|p| !is_under(p, location))
        .collect();
    if outside.is_empty()
        && let Some(current) = table.metadata().current_snapshot()
    {
        let list = crate::catalog::manifests::load_list(table, current, location).await?;
        let (inside, elsewhere): (Vec<_>, Vec<_>) = list
            .entries()
            .iter()
            .partition(|m| is_under(&m.manifest_path, location));
        outside.extend(elsewhere.into_iter().map(|m| m.manifest_path.clone()));
        for (manifest, loaded) in
            crate::catalog::manifests::load_each(table, inside, location).await?
        {
            // A link below the location (a local warehouse) names whatever
            // it points at: outside, whatever its text says.
            outside.extend(
                loaded
                    .entries()
                    .iter()
                    .map(|e| e.data_file().file_path().to_string())
                    .filter(|p| !is_under(p, location) || through_link(p, location)),
            );
            loaded_manifests.push((manifest, loaded));
        }
    }
    outside.sort();
    outside.dedup();
    problems.extend(outside.into_iter().map(|path| {
        format!(
            "the staging table names '{path}', which is outside its location '{location}': \
             only files under the staging table's own location can be promoted"
        )
    }));
    Ok((problems, loaded_manifests))
}
