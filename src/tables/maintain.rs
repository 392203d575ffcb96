//! `REWRITE MANIFESTS <table>`: merges a table's data manifests, one per
//! partition spec (see `catalog::compact`), changing no row.

use iceberg::TableIdent;

use crate::catalog::compact::{Layout, Rewrite, rewrite_manifests as rewrite};
use crate::catalog::upkeep;
use crate::error::{Error, Result};
use crate::rows::result_row;
use crate::session::CommandContext;

result_row! {
    /// What `REWRITE MANIFESTS <table>` did.
    #[derive(Debug, Clone, PartialEq)]
    pub struct ManifestsRewritten {
        /// The table.
        pub table_name: String,
        /// Data manifests before.
        pub manifests_before: i64,
        /// Data manifests after.
        pub manifests_after: i64,
        /// Data files they list (unchanged), when rewritten.
        pub data_files: Option<i64>,
        /// The `replace` snapshot, when one was committed.
        pub snapshot_id: Option<i64>,
        /// What happened, in words.
        pub message: String,
    }
}

/// Rewrites tried before a conflict is answered.
const ATTEMPTS: u32 = 3;

pub(crate) async fn rewrite_manifests(
    ctx: &CommandContext,
    catalog: &str,
    ident: &TableIdent,
) -> Result<ManifestsRewritten> {
    let catalog = ctx.icestage.catalog(catalog)?;
    // The background merge of this process waits for this one; one of
    // another process that wins meanwhile is read again, a few times.
    let _turn = upkeep::turn(catalog, ident).await;
    let mut attempt = 1;
    let rewritten = loop {
        let table = catalog.catalog().load_table(ident).await?;
        match rewrite(catalog, &table, Layout::OnePerSpec).await {
            Err(Error::Conflict(_)) if attempt < ATTEMPTS => attempt += 1,
            done => break done?,
        }
    };
    let name = ident.to_string();
    Ok(match rewritten {
        Rewrite::Nothing { manifests, why } => ManifestsRewritten {
            table_name: name,
            manifests_before: manifests,
            manifests_after: manifests,
            data_files: None,
            snapshot_id: None,
            message: why,
        },
        Rewrite::Done {
            before,
            after,
            files,
            snapshot_id,
        } => ManifestsRewritten {
            message: format!(
                "rewrote {before} data manifests of {name} as {after} ({files} data files, no row changed)"
            ),
            table_name: name,
            manifests_before: before,
            manifests_after: after,
            data_files: Some(files),
            snapshot_id: Some(snapshot_id),
        },
    })
}
