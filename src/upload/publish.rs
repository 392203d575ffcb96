//! `PUBLISH UPLOAD '<id>'`: the second half of write-audit-publish. An
//! upload promoted `WITH (to_branch = '<branch>')` holds its verified rows
//! in one snapshot of that audit branch of the target; publishing puts
//! them on `main`, exactly once:
//!
//! 1. the upload log says where the rows are; if `main` (its head or an
//!    ancestor) already holds a snapshot with the upload's proven evidence,
//!    the upload is published and nothing changes;
//! 2. the target's rules are checked again on the branch snapshot's files,
//!    against `main` as it is now (UNIQUE keys `main` gained since, rules
//!    added since); any violation stops here, `main` unchanged;
//! 3. `main` moves to the branch snapshot when it has not moved since the
//!    promotion (a fast-forward), else the files are appended on top of
//!    `main` in a snapshot carrying the same evidence (re-applied); either
//!    is a compare-and-swap from the version checked in step 2, and a
//!    commit that lands in between makes the attempt start again at step 1.

use std::fmt;
use std::sync::Arc;

use iceberg::spec::{DataFile, MAIN_BRANCH};
use iceberg::table::Table;
use iceberg_datafusion::IcebergStaticTableProvider;

use super::validation::Validation;
use super::validation::enforce::{rules_context, unique_findings};
use super::{SNAPSHOT_UPLOAD_ID, UploadId, UploadRecord, UploadState, seal, validation::findings};
use crate::catalog::commit::Evidence;
use crate::catalog::commit::append::Refusal;
use crate::catalog::commit::branch::{self, Publication, SNAPSHOT_BRANCH};
use crate::catalog::snapshot::{retry_pause, summary_property};
use crate::catalog::{Catalogs, IcebergCatalog};
use crate::cluster::RecipeTable;
use crate::error::{Error, Result};
use crate::rows::result_row;
use crate::session::CommandContext;
use crate::session::log;
use crate::session::operation::Operation;
use crate::tables::rules::{Rule, check_predicate, df_schema, rules_of};

result_row! {
    /// What `PUBLISH UPLOAD` did.
    #[derive(Debug, Clone, PartialEq)]
    pub struct Published {
        /// The upload published.
        pub upload_id: UploadId,
        /// `published`.
        pub state: UploadState,
        /// The audit branch the rows were promoted to.
        pub branch: String,
        /// The snapshot on `main` that holds the rows.
        pub snapshot_id: Option<i64>,
        /// How they reached `main`: `fast_forward`, `reapplied`, or `none`
        /// (published before).
        pub how: String,
        /// Rows published.
        pub rows: i64,
        /// Data files published.
        pub files: i64,
        /// What happened, in words.
        pub message: String,
    }
}

/// What an upload that is not promoted needs before it can be published.
const NOT_PROMOTED: &str = "PUBLISH UPLOAD publishes an upload promoted with PROMOTE UPLOAD \
                            '<id>' WITH (to_branch = '<branch>'); promote it first";

/// How often a publication is checked and tried again on a newer `main`.
const PUBLISH_ATTEMPTS: usize = 30;

/// `PUBLISH UPLOAD '<id>'`.
#[derive(Debug)]
pub(crate) struct PublishUpload {
    pub(crate) id: UploadId,
}

impl Operation for PublishUpload {
    const NAME: &'static str = "PublishUpload";
    type Outcome = Published;

    async fn run(&self, ctx: &CommandContext) -> Result<Published> {
        publish_upload(&ctx.icestage, &self.id).await
    }
}

impl fmt::Display for PublishUpload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "upload={}", self.id)
    }
}

/// Publishes upload `id`; see the module documentation.
async fn publish_upload(icestage: &Catalogs, id: &UploadId) -> Result<Published> {
    let Some(record) = log::find::<UploadState>(icestage, log::UPLOADS, id.as_str()).await? else {
        // No record yet: the upload is still open (or never was).
        return Err(match super::find_staging(icestage, id).await? {
            Some(staging) => Error::UploadState {
                id: id.to_string(),
                state: staging.state.to_string(),
                hint: NOT_PROMOTED.to_string(),
            },
            None => Error::UnknownUpload(id.to_string()),
        });
    };
    if !matches!(record.state, UploadState::Promoted | UploadState::Published) {
        return Err(Error::UploadState {
            id: id.to_string(),
            state: record.state.to_string(),
            hint: NOT_PROMOTED.to_string(),
        });
    }
    let (catalog, table) = super::recorded_target(icestage, &record).await?;
    let target = table.identifier().clone();
    let answer = |branch: &str, snapshot_id: Option<i64>, how: &str, message: String| Published {
        upload_id: id.clone(),
        state: UploadState::Published,
        branch: branch.to_string(),
        snapshot_id,
        how: how.to_string(),
        rows: record.rows.unwrap_or(0),
        files: record.files.unwrap_or(0),
        message,
    };
    if record.state == UploadState::Published {
        let on_main = record.snapshot_id;
        let branch = on_main.map_or_else(String::new, |s| audit_branch_of(&table, s));
        return Ok(answer(
            &branch,
            on_main,
            "none",
            format!(
                "already published on main of {target} in snapshot {}; nothing changed",
                on_main.map_or_else(|| "none".to_string(), |s| s.to_string())
            ),
        ));
    }
    let Some(from) = record
        .snapshot_id
        .and_then(|s| table.metadata().snapshot_by_id(s).cloned())
    else {
        return match record.snapshot_id {
            None => Ok(answer(
                MAIN_BRANCH,
                None,
                "none",
                format!("the upload was empty: {target} is unchanged"),
            )),
            Some(gone) => Err(Error::invalid(format!(
                "upload '{id}' was promoted in snapshot {gone} of {target}, which the table no \
                 longer holds (expired, or its branch removed): its rows cannot be published; \
                 upload them again"
            ))),
        };
    };
    let Some(branch) = from
        .summary()
        .additional_properties
        .get(SNAPSHOT_BRANCH)
        .cloned()
    else {
        return Ok(answer(
            MAIN_BRANCH,
            Some(from.snapshot_id()),
            "none",
            format!(
                "upload '{id}' was promoted onto main of {target} (snapshot {}): nothing to \
                 publish",
                from.snapshot_id()
            ),
        ));
    };
    let key = seal::key(&catalog).await?;
    let evidence = Evidence::new(SNAPSHOT_UPLOAD_ID, id.as_str()).proven(
        seal::SNAPSHOT_UPLOAD_PROOF,
        &seal::proof(&key, id.as_str(), &record.target),
    );
    if !evidence.carried_by(&from) {
        return Err(Error::invalid(format!(
            "snapshot {} of {target} does not carry icestage's proof that it holds upload \
             '{id}': it is not published",
            from.snapshot_id()
        )));
    }
    let assigned = catalog.assigned_location(&table).await?;
    let files = branch::added_files(&table, &from, &assigned).await?;
    let mut base = table;
    for attempt in 0..PUBLISH_ATTEMPTS {
        if attempt > 0 {
            base = catalog.catalog().load_table(&target).await?;
        }
        if let Some(on_main) = evidence.found_on(&base, MAIN_BRANCH) {
            recorded(&catalog, &record, on_main).await?;
            return Ok(answer(
                &branch,
                Some(on_main),
                "none",
                format!(
                    "already published on main of {target} in snapshot {on_main}; nothing changed"
                ),
            ));
        }
        let validation = recheck(&base, &files).await?;
        if !validation.passed() {
            findings::replace(&catalog, id, &validation.findings).await?;
            return Err(Error::Conflict(format!(
                "upload '{id}' on branch '{branch}' of {target} (snapshot {}) fails the table's \
                 rules against main as it is now: {}; main is unchanged and the rows stay on the \
                 branch (SELECT * FROM upload_findings('{id}'))",
                from.snapshot_id(),
                validation.summary(id.as_str()).join("; ")
            )));
        }
        match branch::publish_on(&catalog, &base, &from, &files, &evidence, attempt).await? {
            Ok((snapshot_id, how)) => {
                recorded(&catalog, &record, snapshot_id).await?;
                // The findings of a refused attempt no longer hold.
                findings::discard(&catalog, id).await?;
                let way = match how {
                    Publication::FastForward => "main moved to the branch snapshot",
                    Publication::Reapplied => "its files appended on top of main, which had moved",
                };
                return Ok(answer(
                    &branch,
                    Some(snapshot_id),
                    how.as_str(),
                    format!(
                        "published {} row(s) of branch '{branch}' on main of {target} in \
                         snapshot {snapshot_id}: {way}",
                        record.rows.unwrap_or(0)
                    ),
                ));
            }
            Err(Refusal::Invalid(reason)) => return Err(Error::invalid(reason)),
            Err(Refusal::Conflict(_)) => retry_pause().await,
        }
    }
    Err(Error::Conflict(format!(
        "main of {target} kept changing while upload '{id}' was published ({PUBLISH_ATTEMPTS} \
         attempts); nothing was published: run PUBLISH UPLOAD again"
    )))
}

/// The audit branch whose rows snapshot `snapshot_id` of `table` put on
/// `main`: its own branch (a fast-forward), or that of the snapshot it
/// re-applied; empty when the table no longer says.
fn audit_branch_of(table: &Table, snapshot_id: i64) -> String {
    let property = |id: i64, key: &str| summary_property(table, id, key);
    property(snapshot_id, SNAPSHOT_BRANCH)
        .or_else(|| {
            property(snapshot_id, branch::SNAPSHOT_PUBLISHED_FROM)
                .and_then(|from| from.parse().ok())
                .and_then(|from| property(from, SNAPSHOT_BRANCH))
        })
        .unwrap_or_default()
}

/// Records upload `record` as published in `snapshot_id` of its target
/// (once: a record saying so already stands).
async fn recorded(catalog: &IcebergCatalog, record: &UploadRecord, snapshot_id: i64) -> Result<()> {
    if record.state == UploadState::Published {
        return Ok(());
    }
    let published = UploadRecord {
        state: UploadState::Published,
        snapshot_id: Some(snapshot_id),
        recorded_at: Some(chrono::Utc::now()),
        message: None,
        ..record.clone()
    };
    log::append(catalog, log::UPLOADS, &published).await
}

/// The target's rules on `files` (rows a branch snapshot of `target`
/// added), against `main` of exactly this version of `target` (the one a
/// publication then commits on): each CHECK rule counted, each UNIQUE rule
/// within the files and against `main`.
async fn recheck(target: &Table, files: &[DataFile]) -> Result<Validation> {
    let rules = rules_of(target)?;
    let mut validation = Validation::default();
    for rule in &rules {
        validation
            .violations
            .insert(rule.name().to_string(), (rule.clone(), 0));
    }
    if rules.is_empty() || files.is_empty() {
        return Ok(validation);
    }
    let ctx = rules_context()?;
    ctx.register_table("staged", Arc::new(RecipeTable::of_files(target, files)?))?;
    let main = IcebergStaticTableProvider::try_new_from_table(target.clone()).await?;
    ctx.register_table("target", Arc::new(main))?;
    let schema = df_schema(target)?;
    for rule in &rules {
        match rule {
            Rule::Check { name, predicate } => {
                let table = target.identifier().to_string();
                let expr = check_predicate(&ctx, &table, predicate, &schema)?;
                // A row violates CHECK (p) when p is false (NULL passes).
                let violating = ctx.table("staged").await?.filter(expr.is_false())?;
                let count = violating.count().await? as u64;
                if let Some(entry) = validation.violations.get_mut(name) {
                    entry.1 += count;
                }
            }
            Rule::Unique { name, columns } => {
                unique_findings(&ctx, name, columns, true, &mut validation).await?;
            }
        }
    }
    Ok(validation)
}
