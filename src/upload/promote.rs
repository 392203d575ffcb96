//! `PROMOTE UPLOAD '<id>'`: validate the staging table against its target,
//! commit its rows into the target exactly once, then retire the session.
//!
//! The steps, in order:
//! 1. find the session; if the target already holds a snapshot with
//!    `upload-id=<id>`, only the clean-up is left (a crash or a concurrent
//!    promotion got there first);
//! 2. claim it (`state=promoting`, a compare-and-swap on the staging table);
//! 3. validate ([`super::validation::validate`]): what the metadata answers (drift,
//!    operations, required NULLs), then the target's rules; row-level
//!    findings go to `upload_findings('<id>')`, and any problem stops here
//!    with the target untouched (`WITH (dry_run = true)` always stops here);
//! 4. commit: register the staging data files in the target with one
//!    `fast_append` carrying `upload-id=<id>` (no data rewritten). The commit
//!    runs through a catalog that re-checks the evidence on every load, and
//!    `Transaction::commit` loads the table at the start of each attempt, so
//!    none of its retries can append twice;
//! 5. record the outcome in the upload log, drop the staging table without
//!    purging (its data files now belong to the target) and delete its
//!    metadata files.

use std::fmt;
use std::time::Duration;

use chrono::Utc;
use iceberg::table::Table;

pub use super::modes::PromoteMode;
use super::modes::{Changes, check, preview};
pub use super::validation::TransferPath;
use super::validation::validate::validate;
use super::validation::{
    Validation, Verify, copies_first, load_target, transfer_path, verified_files,
};
use super::{
    SNAPSHOT_UPLOAD_ID, Staging, UploadId, UploadRecord, UploadState, failpoint,
    failpoint_or_error, find_staging, promoted_snapshot, transfer, validation::findings,
};
use crate::catalog::Catalogs;
use crate::catalog::Removal;
use crate::catalog::commit::{Landed, append_once, summary_count};
use crate::catalog::confine::delete_within;
use crate::cluster::Cluster;
use crate::config::{OptionDoc, WithOptions, flag_option, option};
use crate::error::{Error, Result};
use crate::rows::result_row;
use crate::session::CommandContext;
use crate::session::log;
use crate::session::operation::{Operation, flag};

result_row! {
    /// What `PROMOTE UPLOAD` did.
    #[derive(Debug, Clone, PartialEq)]
    pub struct Promotion {
        /// The session promoted.
        pub upload_id: UploadId,
        /// `promoted`; after a dry run, `open` (it would pass) or `failed`
        /// (a promotion that finds problems answers an error instead).
        pub state: UploadState,
        /// Rows committed (or, after a dry run, that would be).
        pub rows: i64,
        /// Data files committed.
        pub files: i64,
        /// The target snapshot holding the rows.
        pub snapshot_id: Option<i64>,
        /// How the rows reached the target.
        pub path: TransferPath,
        /// Rule violations found; `upload_findings(id)` lists them.
        pub findings: i64,
        /// What happened, in words.
        pub message: String,
        /// Where the proof and the rules' scans ran: `local`, or the cluster's URL.
        pub ran_on: String,
        /// How the rows landed: `append`, `upsert` or `replace_partitions`.
        pub mode: String,
        /// Upload rows new to the target (or, after a dry run, that would be).
        pub rows_inserted: i64,
        /// Target rows an upsert replaced with the upload's rows of their key.
        pub rows_updated: i64,
        /// Target rows removed without a replacement (the old rows of the
        /// partitions `replace_partitions` replaced).
        pub rows_deleted: i64,
        /// The branch of the target the rows landed on: `main`, or the
        /// audit branch `to_branch` named (`PUBLISH UPLOAD` moves them to
        /// `main`).
        pub branch: String,
    }
}

/// How one `PROMOTE UPLOAD` runs: its `WITH (...)` options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromoteOptions {
    /// Validate and report; commit nothing.
    pub dry_run: bool,
    /// How the staged files are proven.
    pub verify: Verify,
    /// How the rows land in the target (default: appended).
    pub mode: PromoteMode,
    /// Tag the snapshot that holds the rows `upload-<id>` in the target, so
    /// any engine can read what this upload added.
    pub tag: bool,
    /// Land the rows on this audit branch of the target (created if
    /// missing) instead of `main`; `PUBLISH UPLOAD` publishes them.
    pub to_branch: Option<String>,
}

impl Default for PromoteOptions {
    fn default() -> Self {
        Self {
            dry_run: false,
            verify: Verify::Bytes,
            mode: PromoteMode::Append,
            tag: false,
            to_branch: None,
        }
    }
}

impl PromoteOptions {
    /// The branch the rows land on.
    fn branch(&self) -> &str {
        self.to_branch
            .as_deref()
            .unwrap_or(iceberg::spec::MAIN_BRANCH)
    }

    /// The options as a claim records them ([`PROP_LANDING`](super::PROP_LANDING)).
    fn landing(&self) -> String {
        let key = match &self.mode {
            PromoteMode::Upsert { key } => key.clone(),
            _ => None,
        };
        serde_json::json!({
            "mode": self.mode.name(),
            "key": key,
            "tag": self.tag,
            "to_branch": self.to_branch,
            "verify": self.verify.as_str(),
        })
        .to_string()
    }

    /// The options a claim recorded on upload `id` ([`Self::landing`]).
    fn from_landing(id: &UploadId, text: &str) -> Result<Self> {
        #[derive(serde::Deserialize)]
        struct Landing {
            mode: String,
            key: Option<Vec<String>>,
            tag: bool,
            to_branch: Option<String>,
            verify: String,
        }
        let landing: Landing = serde_json::from_str(text).map_err(|e| {
            Error::invalid(format!(
                "upload {id}: the promotion options its claim recorded are not readable ({e});                  send complete (or PROMOTE UPLOAD) again with the options wanted"
            ))
        })?;
        let mode = match PromoteMode::parse(&landing.mode, None)? {
            PromoteMode::Upsert { .. } => PromoteMode::Upsert { key: landing.key },
            mode => mode,
        };
        Ok(Self {
            dry_run: false,
            verify: landing.verify.parse()?,
            mode,
            tag: landing.tag,
            to_branch: landing.to_branch,
        })
    }
}

impl WithOptions for PromoteOptions {
    const STATEMENT: &'static str = "PROMOTE UPLOAD";
    const OPTIONS: &'static [OptionDoc] = &[
        OptionDoc {
            key: "dry_run",
            default: "false",
            doc: "validate and report; commit nothing",
        },
        OptionDoc {
            key: "verify",
            default: "`'bytes'`",
            doc: "`'bytes'` reads every staged file; `'metadata'` trusts the manifests (only for trusted writers)",
        },
        OptionDoc {
            key: "mode",
            default: "`'append'`",
            doc: "`'append'`, `'upsert'` (by `key`) or `'replace_partitions'`",
        },
        OptionDoc {
            key: "key",
            default: "the target's identifier fields, else its one UNIQUE rule",
            doc: "the columns an upsert matches rows by: `'id'` or `'(region, id)'`",
        },
        OptionDoc {
            key: "tag",
            default: "false",
            doc: "tag the snapshot holding the rows `upload-<id>`",
        },
        OptionDoc {
            key: "to_branch",
            default: "none (`main`)",
            doc: "append to this audit branch instead; `PUBLISH UPLOAD` puts the rows on `main`",
        },
    ];

    fn parse(pairs: &[(String, String)]) -> Result<Self> {
        Ok(Self {
            dry_run: flag_option(pairs, "dry_run")?,
            verify: option(pairs, "verify")
                .map(str::parse)
                .transpose()?
                .unwrap_or_default(),
            mode: PromoteMode::parse(
                option(pairs, "mode").unwrap_or("append"),
                option(pairs, "key"),
            )?,
            tag: flag_option(pairs, "tag")?,
            to_branch: option(pairs, "to_branch").map(str::to_string),
        })
    }
}

/// One promotion: its options, and what the session it runs in adds.
#[derive(Debug)]
pub(crate) struct PromoteRun<'a> {
    options: &'a PromoteOptions,
    /// How long the claim holds without renewal (it is renewed every third
    /// of it while the promotion runs): `icestage.promotion_lease`.
    lease: Duration,
    /// Where the proof and the rules' scans run: here (`None`) or on a
    /// Ballista cluster (`icestage.cluster`).
    cluster: Option<Cluster>,
    /// The claim taken for this promotion before it ran ([`claim`]), held
    /// as this promotion's own.
    claim: Option<PromotionClaim>,
}

/// A promotion claim taken ahead of the promotion ([`claim`]): the
/// promotion that carries it holds the upload as its own, so no reader and
/// no other replica sees the upload `open` in between.
#[derive(Debug, Clone)]
pub(crate) struct PromotionClaim(String);

impl std::ops::Deref for PromoteRun<'_> {
    type Target = PromoteOptions;

    fn deref(&self) -> &PromoteOptions {
        self.options
    }
}

/// `PROMOTE UPLOAD '<id>' [WITH (...)]`; `plan` describes the validation
/// for EXPLAIN (filled in only when explaining).
#[derive(Debug)]
pub(crate) struct PromoteUpload {
    pub(crate) id: UploadId,
    pub(crate) options: PromoteOptions,
    pub(crate) plan: Vec<String>,
    /// Held before it runs (the service's `complete`), if it was.
    pub(crate) claim: Option<PromotionClaim>,
}

impl PromoteUpload {
    /// Promotes upload `id` with `options`, claiming it when it runs.
    pub(crate) fn new(id: UploadId, options: PromoteOptions) -> Self {
        Self {
            id,
            options,
            plan: vec![],
            claim: None,
        }
    }
}

impl Operation for PromoteUpload {
    const NAME: &'static str = "PromoteUpload";
    type Outcome = Promotion;

    /// With the session's claim lease and cluster.
    async fn run(&self, ctx: &CommandContext) -> Result<Promotion> {
        let run = PromoteRun {
            options: &self.options,
            lease: ctx.options.promotion_lease.duration(),
            cluster: crate::cluster::of_options(&ctx.options)?,
            claim: self.claim.clone(),
        };
        promote(&ctx.icestage, &self.id, &run).await
    }
}

impl fmt::Display for PromoteUpload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let options = &self.options;
        write!(f, "upload={}", self.id)?;
        if let Some(branch) = &options.to_branch {
            write!(f, ", to_branch={branch}")?;
        }
        write!(
            f,
            "{}{}",
            flag(options.tag, "tag"),
            flag(options.dry_run, "dry_run")
        )?;
        match &options.mode {
            PromoteMode::Append => {}
            PromoteMode::Upsert { key: Some(key) } => {
                write!(f, ", mode=upsert, key=({})", key.join(", "))?
            }
            other => write!(f, ", mode={}", other.name())?,
        }
        write!(f, ", verify={}", options.verify.as_str())?;
        for step in &self.plan {
            write!(f, "\n  {step}")?;
        }
        Ok(())
    }
}

/// Whether `options` (their mode and branch) can promote upload `id` into
/// its target (see [`check_landing`]); an upload that is gone is left to
/// the promotion to answer.
pub(crate) async fn check_mode(
    icestage: &Catalogs,
    id: &UploadId,
    options: &PromoteOptions,
) -> Result<()> {
    let Some(staging) = find_staging(icestage, id).await? else {
        return Ok(());
    };
    check_landing(options, &load_target(&staging).await?).map(|_| ())
}

/// Whether the mode and the branch of `options` can promote into `target`
/// (see [`check`]), and the key an upsert matches by. A promotion to an
/// audit branch appends: what it adds is re-applied on `main` as it is then.
fn check_landing(options: &PromoteOptions, target: &Table) -> Result<Option<Vec<String>>> {
    let key = check(&options.mode, target)?;
    if let Some(branch) = &options.to_branch {
        if options.mode != PromoteMode::Append {
            return Err(Error::invalid(format!(
                "to_branch = '{branch}' lands the upload's rows as an append, to be published \
                 with PUBLISH UPLOAD; mode = '{}' does not combine with it: drop to_branch, or \
                 promote with mode = 'append'",
                options.mode.name()
            )));
        }
        crate::catalog::commit::branch::check_branch(target, branch)?;
        crate::catalog::commit::replace::check_format(target, "a promotion to a branch")?;
    }
    Ok(key)
}

/// Where one attempt stands.
enum Attempt {
    Done(Promotion),
    /// Another process's promotion holds a live claim.
    Busy,
}

/// Promotes upload `id`; see the module documentation. While another
/// process's promotion holds the upload, this one waits for it (at most
/// that claim's lease past its last renewal) and reports its outcome.
async fn promote(
    icestage: &Catalogs,
    id: &UploadId,
    options: &PromoteRun<'_>,
) -> Result<Promotion> {
    let mut pause = std::time::Duration::from_millis(100);
    loop {
        match promote_once(icestage, id, options).await {
            Ok(Attempt::Done(promotion)) => return Ok(promotion),
            Ok(Attempt::Busy) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(2));
            }
            // A concurrent promotion may have finished while this one was
            // working (and dropped the staging table under it): that is success.
            Err(error) if !options.dry_run => {
                return match log::find(icestage, log::UPLOADS, id.as_str()).await {
                    Ok(Some(record)) => match already_promoted(icestage, id, &record).await {
                        Some(promotion) => Ok(promotion),
                        // An abort or expiry ended the session under this
                        // promotion (and removed its table): say so.
                        None if error.kind() == crate::error::ErrorKind::NotFound => {
                            Err(closed_or_unknown(id, Some(record)))
                        }
                        None => Err(error),
                    },
                    _ => Err(error),
                };
            }
            Err(error) => return Err(error),
        }
    }
}

/// Claims upload `id`'s promotion now, for a promotion that runs later
/// with the claim (the service answers `complete` before it promotes):
/// from here on every reader and every replica sees the upload
/// `promoting`. `None` when there is nothing to claim: the upload is
/// promoted already or another process holds it. What would stop the
/// promotion before its claim is the error: an upload closed, expired or
/// tampered with, a mode or branch the target cannot take, a catalog that
/// does not answer (the client sends `complete` again).
pub(crate) async fn claim(
    icestage: &Catalogs,
    id: &UploadId,
    options: &PromoteOptions,
    lease: Duration,
) -> Result<Option<PromotionClaim>> {
    let prepared = prepare(icestage, id, &claiming(options, lease)).await?;
    claim_prepared(prepared, options, lease).await
}

/// A promotion with `options` that only claims (see [`claim`]).
fn claiming(options: &PromoteOptions, lease: Duration) -> PromoteRun<'_> {
    PromoteRun {
        options,
        lease,
        cluster: None,
        claim: None,
    }
}

/// [`claim`] once the upload's checks ([`prepare`]) are done.
async fn claim_prepared(
    prepared: Prepared,
    options: &PromoteOptions,
    lease: Duration,
) -> Result<Option<PromotionClaim>> {
    let Prepared::Ready {
        mut staging,
        target,
    } = prepared
    else {
        return Ok(None);
    };
    check_landing(options, &target)?;
    if options.dry_run || !staging.take_claim(options.landing(), lease).await? {
        return Ok(None);
    }
    Ok(staging.held_claim.map(PromotionClaim))
}

/// Upload `id`'s promotion when the process that claimed it stopped
/// before it finished (the claim lapsed): claimed again, with the options
/// that claim recorded, for the caller to run (the service, when a client
/// asks where the upload stands). `None` unless the promotion is stalled.
pub(crate) async fn stalled(
    icestage: &Catalogs,
    id: &UploadId,
    lease: Duration,
) -> Result<Option<(PromoteOptions, PromotionClaim)>> {
    let Some(staging) = find_staging(icestage, id).await? else {
        return Ok(None);
    };
    let props = staging.table.metadata().properties();
    if staging.state != UploadState::Promoting || super::claim_alive(props, Utc::now()) {
        return Ok(None);
    }
    // A claim that recorded nothing (an earlier icestage's) waits for the
    // client's next complete, which says how to land the rows.
    let Some(landing) = &staging.landing else {
        return Ok(None);
    };
    let options = PromoteOptions::from_landing(id, landing)?;
    // The table already loaded is checked as any promotion checks it.
    let prepared = prepare_found(staging, &claiming(&options, lease)).await?;
    let claimed = claim_prepared(prepared, &options, lease).await?;
    Ok(claimed.map(|claim| (options, claim)))
}

/// Where an upload stands before its promotion claims it.
enum Prepared {
    /// Nothing for this promotion to claim.
    Settled(Attempt),
    /// Open to a promotion, into `target`.
    Ready {
        staging: Box<Staging>,
        target: Table,
    },
}

async fn promote_once(
    icestage: &Catalogs,
    id: &UploadId,
    options: &PromoteRun<'_>,
) -> Result<Attempt> {
    let (mut staging, target) = match prepare(icestage, id, options).await? {
        Prepared::Settled(attempt) => return Ok(attempt),
        Prepared::Ready { staging, target } => (*staging, target),
    };
    // A mode or branch the target cannot take is refused before anything
    // is claimed.
    let key = check_landing(options, &target)?;
    if options.dry_run {
        return dry_run_validation(&mut staging, &target, options, key.as_deref())
            .await
            .map(Attempt::Done);
    }
    failpoint("promote.before-claim");
    // Claimed by another process between the look and the claim: wait.
    if !staging.take_claim(options.landing(), options.lease).await? {
        return Ok(Attempt::Busy);
    }
    let _renewing = staging.keep_claim(options.lease);
    match promote_claimed(&mut staging, &target, options, key.as_deref()).await {
        Ok(promotion) => Ok(Attempt::Done(promotion)),
        Err(error) => Err(release_claim(&mut staging, error).await),
    }
}

/// The checks before an upload's claim: promoted already (then the
/// clean-up is finished), closed, expired, held elsewhere or tampered with.
async fn prepare(icestage: &Catalogs, id: &UploadId, options: &PromoteRun<'_>) -> Result<Prepared> {
    let Some(staging) = find_staging(icestage, id).await? else {
        let record = log::find(icestage, log::UPLOADS, id.as_str()).await?;
        let promoted = match &record {
            Some(record) => already_promoted(icestage, id, record).await,
            None => None,
        };
        return match promoted {
            Some(promotion) => Ok(Prepared::Settled(Attempt::Done(promotion))),
            None => Err(closed_or_unknown(id, record)),
        };
    };
    prepare_found(staging, options).await
}

/// [`prepare`] for the live session `staging`.
async fn prepare_found(mut staging: Staging, options: &PromoteRun<'_>) -> Result<Prepared> {
    let id = &staging.id.clone();
    staging.held_claim = options.claim.as_ref().map(|claim| claim.0.clone());
    let target = load_target(&staging).await?;
    if let Some(snapshot_id) = promoted_snapshot(&target, &staging) {
        if options.tag {
            tag(&staging, snapshot_id).await?;
        }
        let (rows, files) = snapshot_counts(&target, snapshot_id);
        // Committed earlier: the files were registered as the target's own
        // only on the zero-copy path, where the catalog keeps them.
        finish(
            &staging,
            Some(snapshot_id),
            rows,
            files,
            Removal::MetadataOnly,
        )
        .await?;
        return Ok(Prepared::Settled(Attempt::Done(Promotion {
            upload_id: id.clone(),
            rows,
            files,
            snapshot_id: Some(snapshot_id),
            path: TransferPath::None,
            findings: 0,
            message: already_message(&staging.target.to_string(), snapshot_id),
            state: UploadState::Promoted,
            ran_on: crate::cluster::LOCAL.to_string(),
            mode: super::modes::landed_mode(&target, snapshot_id),
            rows_inserted: 0,
            rows_updated: 0,
            rows_deleted: 0,
            branch: landed_branch(&target, snapshot_id),
        })));
    }
    if matches!(staging.state, UploadState::Aborted | UploadState::Expired) {
        return Err(Error::UploadClosed {
            id: id.to_string(),
            state: staging.state.to_string(),
            target: staging.target.to_string(),
        });
    }
    if staging.past_promotion(Utc::now()) {
        return Err(Error::UploadState {
            id: id.to_string(),
            state: UploadState::Expired.to_string(),
            hint: format!(
                "it expired at {} and can no longer be promoted; EXPIRE STAGING removes it. \
                 Open a new upload with CREATE UPLOAD FOR {}",
                staging
                    .expires_at
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_default(),
                staging.target
            ),
        });
    }
    if staging.claimed_elsewhere(Utc::now()) {
        return Ok(Prepared::Settled(Attempt::Busy));
    }
    if let Some(reason) = staging.tampered.clone() {
        let error = Error::Tampered {
            id: id.to_string(),
            reason,
        };
        let _ = staging
            .transition(
                &[
                    UploadState::Open,
                    UploadState::Failed,
                    UploadState::Promoting,
                ],
                UploadState::Failed,
                Some(&error.to_string()),
            )
            .await;
        return Err(error);
    }
    Ok(Prepared::Ready {
        staging: Box::new(staging),
        target,
    })
}

/// After a failed promotion that held the claim: the upload becomes
/// `failed` with the error's message, unless its rows reached the target
/// (then the next PROMOTE or EXPIRE STAGING finishes the clean-up) or another
/// process moved it meanwhile (its state wins). Returns `error`.
async fn release_claim(staging: &mut Staging, error: Error) -> Error {
    let committed = match load_target(staging).await {
        Ok(target) => promoted_snapshot(&target, staging).is_some(),
        // Unknown: leave the claim to its lease.
        Err(_) => true,
    };
    if !committed && !matches!(error.root(), Error::ValidationFailed { .. }) {
        let message = error.user_message();
        let _ = staging
            .transition(
                &[UploadState::Promoting],
                UploadState::Failed,
                Some(&message),
            )
            .await;
    }
    error
}

/// Validates and commits an upload this process has claimed.
async fn promote_claimed(
    staging: &mut Staging,
    target: &Table,
    options: &PromoteRun<'_>,
    key: Option<&[String]>,
) -> Result<Promotion> {
    let id = staging.id.clone();
    let path = transfer_path(staging, target);
    let copied = copies_first(staging, path);
    let mut validation = validate(
        staging,
        target,
        options.verify,
        copied,
        options.cluster.as_ref(),
        key,
    )
    .await?;
    // The files the rows reference, landed in the target's storage when
    // nothing else stands in the way.
    let land = validation.passed();
    let relocation = super::files::check(staging, target, &mut validation, copied, land).await?;
    record_findings(staging, &validation).await?;
    staging.findings = Some(validation.finding_count() as i64);
    if !validation.passed() {
        let lines = validation.summary(id.as_str());
        // If another process moved the session meanwhile, its state wins;
        // the reasons are still reported to this caller.
        let _ = staging
            .transition(
                &[UploadState::Promoting],
                UploadState::Failed,
                Some(&lines.join("; ")),
            )
            .await;
        return Err(Error::ValidationFailed {
            id: id.to_string(),
            target: staging.target.to_string(),
            staging: staging.name(),
            reasons: lines,
        });
    }
    failpoint_or_error("promote.after-validation")?;

    let rows = validation.rows;
    let ran_on = validation.ran_on();
    if validation.files.is_empty() {
        finish(staging, None, 0, 0, Removal::Everything).await?;
        return Ok(Promotion {
            upload_id: id.clone(),
            state: UploadState::Promoted,
            rows: 0,
            files: 0,
            snapshot_id: None,
            path: TransferPath::None,
            findings: 0,
            message: format!("the upload was empty: {} is unchanged", staging.target),
            ran_on,
            mode: options.mode.name().to_string(),
            rows_inserted: 0,
            rows_updated: 0,
            rows_deleted: 0,
            branch: options.branch().to_string(),
        });
    }
    let data_files = match path {
        // Verified from the bytes, with metrics from what was read (the
        // copies, on the copy path).
        TransferPath::ZeroCopy | TransferPath::Copy => validation.files,
        // Rewritten from exactly the files verified (copies where a
        // client's keys could reach the staged ones), which then go.
        _ => {
            let verified = verified_files(staging, target, &validation.files, copied)?;
            let rewritten = transfer::rewrite(staging, target, verified, relocation.as_ref()).await;
            if copied {
                let location = target.metadata().location();
                for copy in &validation.files {
                    delete_within(target.file_io(), copy.file_path(), location).await;
                }
            }
            rewritten?
        }
    };
    let files = data_files.len() as i64;
    let forged = staging.evidence().forged_in(target);
    let appended = Changes {
        inserted: rows,
        ..Changes::default()
    };
    let (landed, changes) = match (&options.mode, &options.to_branch) {
        (PromoteMode::Append, Some(branch)) => {
            let landed = crate::catalog::commit::branch::append_to_branch_once(
                &staging.catalog,
                target,
                &staging.evidence(),
                branch,
                &data_files,
            )
            .await?;
            (landed, appended)
        }
        (PromoteMode::Append, None) => {
            let landed =
                append_once(&staging.catalog, target, data_files, staging.evidence()).await?;
            (landed, appended)
        }
        (mode, _) => super::modes::commit(staging, target, mode, key, data_files).await?,
    };
    let Landed {
        snapshot_id,
        committed_here,
    } = landed;
    failpoint("promote.after-commit");
    if options.tag {
        tag(staging, snapshot_id).await?;
    }
    finish(
        staging,
        Some(snapshot_id),
        rows,
        files,
        if path == TransferPath::ZeroCopy {
            Removal::MetadataOnly
        } else {
            Removal::Everything
        },
    )
    .await?;
    let how = match path {
        TransferPath::ZeroCopy => "without rewriting data",
        TransferPath::Copy => "after copying the files into the target's storage",
        _ => "after rewriting the rows with the target's field ids",
    };
    let mut message = if committed_here {
        let mode = match options.mode {
            PromoteMode::Append => String::new(),
            PromoteMode::Upsert { .. } => format!(
                " (upsert: {} inserted, {} updated)",
                changes.inserted, changes.updated
            ),
            PromoteMode::ReplacePartitions => format!(
                " (replacing the partitions it touches: {} old row(s) removed)",
                changes.deleted
            ),
        };
        let branch = match &options.to_branch {
            Some(branch) => {
                format!(" on branch '{branch}' (PUBLISH UPLOAD '{id}' publishes them on main)")
            }
            None => String::new(),
        };
        format!(
            "committed {rows} row(s) in {files} file(s) to {}{branch} in snapshot {snapshot_id} \
             {how}{mode}",
            staging.target
        )
    } else {
        already_message(&staging.target.to_string(), snapshot_id)
    };
    if !forged.is_empty() {
        // Another writer's snapshot claimed this upload: ignored, and said.
        message.push_str(&format!(
            "; ignored {} snapshot(s) of {} that claim {SNAPSHOT_UPLOAD_ID}={id} without \
             icestage's proof ({}): another writer added them",
            forged.len(),
            staging.target,
            forged
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(Promotion {
        upload_id: id.clone(),
        state: UploadState::Promoted,
        rows,
        files,
        snapshot_id: Some(snapshot_id),
        path: if committed_here {
            path
        } else {
            TransferPath::None
        },
        findings: 0,
        message,
        ran_on,
        mode: options.mode.name().to_string(),
        rows_inserted: if committed_here { changes.inserted } else { 0 },
        rows_updated: if committed_here { changes.updated } else { 0 },
        rows_deleted: if committed_here { changes.deleted } else { 0 },
        branch: options.branch().to_string(),
    })
}

/// `WITH (dry_run = true)`: validates and records the findings; commits nothing.
async fn dry_run_validation(
    staging: &mut Staging,
    target: &Table,
    options: &PromoteRun<'_>,
    key: Option<&[String]>,
) -> Result<Promotion> {
    let mut validation = validate(
        staging,
        target,
        options.verify,
        false,
        options.cluster.as_ref(),
        key,
    )
    .await?;
    super::files::check(staging, target, &mut validation, false, false).await?;
    record_findings(staging, &validation).await?;
    staging.findings = Some(validation.finding_count() as i64);
    let lines = validation.summary(staging.id.as_str());
    // What the mode would do to the target as it is now.
    let changes = if validation.passed() {
        preview(staging, target, &options.mode, key, &validation.files).await?
    } else {
        Changes::default()
    };
    let (state, message) = if validation.passed() {
        let effect = match options.mode {
            PromoteMode::Append => String::new(),
            _ => format!(
                "; {} would insert {}, update {} and delete {} row(s)",
                options.mode.name(),
                changes.inserted,
                changes.updated,
                changes.deleted
            ),
        };
        (
            UploadState::Open,
            format!(
                "dry run: {} row(s) in {} file(s) pass every check{effect}; nothing was committed",
                validation.rows,
                validation.files.len(),
            ),
        )
    } else {
        (
            UploadState::Failed,
            format!("dry run: {}", lines.join("; ")),
        )
    };
    staging
        .transition(
            &[UploadState::Open, UploadState::Failed],
            state,
            Some(&lines.join("; ")),
        )
        .await?;
    Ok(Promotion {
        upload_id: staging.id.clone(),
        state,
        rows: validation.rows,
        files: validation.files.len() as i64,
        snapshot_id: None,
        path: TransferPath::DryRun,
        findings: validation.finding_count() as i64,
        message,
        ran_on: validation.ran_on(),
        mode: options.mode.name().to_string(),
        rows_inserted: changes.inserted,
        rows_updated: changes.updated,
        rows_deleted: changes.deleted,
        branch: options.branch().to_string(),
    })
}

/// Stores the row-level findings of `validation` (or removes stale ones).
async fn record_findings(staging: &Staging, validation: &Validation) -> Result<()> {
    if validation.findings.is_empty() {
        findings::discard(&staging.catalog, &staging.id).await
    } else {
        findings::replace(&staging.catalog, &staging.id, &validation.findings).await
    }
}

fn already_message(target: &str, snapshot_id: i64) -> String {
    format!("already promoted into {target} in snapshot {snapshot_id}; nothing changed")
}

/// The promotion an upload's log record tells of, if it was promoted.
async fn already_promoted(
    icestage: &Catalogs,
    id: &UploadId,
    record: &UploadRecord,
) -> Option<Promotion> {
    if !matches!(record.state, UploadState::Promoted | UploadState::Published) {
        return None;
    }
    // The branch the rows are on, as the target says (main when it cannot).
    let target = super::recorded_target(icestage, record).await.ok();
    let branch = match (record.snapshot_id, target) {
        (Some(snapshot_id), Some((_, target))) => landed_branch(&target, snapshot_id),
        _ => iceberg::spec::MAIN_BRANCH.to_string(),
    };
    let message = match record.snapshot_id {
        Some(snapshot_id) => already_message(&record.target, snapshot_id),
        None => "already promoted (the upload was empty); nothing changed".to_string(),
    };
    Some(Promotion {
        upload_id: id.clone(),
        rows: record.rows.unwrap_or(0),
        files: record.files.unwrap_or(0),
        snapshot_id: record.snapshot_id,
        path: TransferPath::None,
        findings: 0,
        message,
        state: UploadState::Promoted,
        ran_on: crate::cluster::LOCAL.to_string(),
        mode: String::new(),
        rows_inserted: 0,
        rows_updated: 0,
        rows_deleted: 0,
        branch,
    })
}

/// The branch snapshot `snapshot_id` of `target` landed on: the audit
/// branch its summary names, else `main`.
fn landed_branch(target: &Table, snapshot_id: i64) -> String {
    crate::catalog::snapshot::summary_property(
        target,
        snapshot_id,
        crate::catalog::commit::branch::SNAPSHOT_BRANCH,
    )
    .unwrap_or_else(|| iceberg::spec::MAIN_BRANCH.to_string())
}

/// The error for an id with no staging table, from its log record:
/// aborted, expired, or (no record) unknown.
fn closed_or_unknown(id: &UploadId, record: Option<UploadRecord>) -> Error {
    match record {
        Some(record) => Error::UploadClosed {
            id: id.to_string(),
            state: record.state.to_string(),
            target: record.target,
        },
        None => Error::UnknownUpload(id.to_string()),
    }
}

fn snapshot_counts(table: &Table, snapshot_id: i64) -> (i64, i64) {
    let snapshot = table.metadata().snapshot_by_id(snapshot_id);
    let count = |key: &str| summary_count(snapshot, key).unwrap_or(0);
    (count("added-records"), count("added-data-files"))
}

/// Tags the target's snapshot `snapshot_id`, which holds upload
/// `staging`'s rows, `upload-<id>`.
async fn tag(staging: &Staging, snapshot_id: i64) -> Result<()> {
    crate::catalog::commit::replace::tag_snapshot(
        &staging.catalog,
        &staging.target,
        &format!("upload-{}", staging.id),
        snapshot_id,
    )
    .await
}

/// Records the promotion and removes the staging table: its metadata only
/// when the target now references its data files, else everything (within
/// its own location, whatever its metadata names).
async fn finish(
    staging: &Staging,
    snapshot_id: Option<i64>,
    rows: i64,
    files: i64,
    removal: Removal,
) -> Result<()> {
    let record = UploadRecord {
        rows: Some(rows),
        files: Some(files),
        snapshot_id,
        message: None,
        ..staging.record(UploadState::Promoted)
    };
    log::append(&staging.catalog, log::UPLOADS, &record).await?;
    failpoint("promote.before-drop");
    findings::discard(&staging.catalog, &staging.id).await?;
    staging.catalog.remove_table(&staging.table, removal).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_s_landing_reads_back_as_the_options_it_recorded() {
        let id = UploadId::random();
        for options in [
            PromoteOptions::default(),
            PromoteOptions {
                verify: Verify::Metadata,
                mode: PromoteMode::Upsert {
                    key: Some(vec!["region".into(), "id, with a comma".into()]),
                },
                tag: true,
                ..Default::default()
            },
            PromoteOptions {
                mode: PromoteMode::Upsert { key: None },
                ..Default::default()
            },
            PromoteOptions {
                mode: PromoteMode::ReplacePartitions,
                ..Default::default()
            },
            PromoteOptions {
                to_branch: Some("audit".into()),
                ..Default::default()
            },
        ] {
            let landing = options.landing();
            assert_eq!(
                PromoteOptions::from_landing(&id, &landing).unwrap(),
                options,
                "{landing}"
            );
        }
        let unreadable = PromoteOptions::from_landing(&id, "{\"mode\": 3}")
            .unwrap_err()
            .to_string();
        assert!(
            unreadable.contains(id.as_str()) && unreadable.contains("send complete"),
            "{unreadable}"
        );
    }
}
