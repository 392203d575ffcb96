//! Validation of a staging table against its target, before promotion.
//!
//! First what the metadata answers, without reading data: schema and
//! partition-spec drift by field id, snapshots that are not plain appends,
//! delete files, and NULLs in required columns (from the manifests' null
//! counts). Then the target's rules ([`crate::tables::rules`]):
//!
//! * `CHECK` rules read only the files whose column metrics cannot rule out a
//!   violation (the negated predicates are pushed into Iceberg's file
//!   planning), streaming them batch by batch, one pass for all rules, so
//!   memory stays bounded. Each violating row is reported with its key or its
//!   file and position, and the values the rule read.
//! * `UNIQUE` rules run as DataFusion queries (a group-by for duplicates
//!   inside the upload, a merge join with the target for keys already there)
//!   in a session with a memory limit that spills to disk.

use std::sync::Arc;

use datafusion::prelude::SessionContext;
use iceberg::table::Table;

use super::drift::{Matching, inspect_metadata, required_nulls};
use super::enforce::{evaluate_checks, evaluate_unique};
use super::{Validation, Verify, load_target, verified_files};
use crate::catalog::Catalogs;
use crate::catalog::commit::summary_count;
use crate::cluster::Cluster;
use crate::error::Result;
use crate::tables::rules::{PlannedCheck, Rule, df_schema, plan_checks, rules_of};
use crate::upload::{Staging, UploadId, find_staging};

/// The rule an upsert's key is checked under when no UNIQUE rule of the
/// target names exactly its columns: each key at most once in the upload.
pub(crate) const UPSERT_KEY_RULE: &str = "upsert_key";

/// Validates `staging` against `target` and its rules. With `copy_first`,
/// the staged files are first copied into the target's storage and the
/// copies are what is verified and returned (no writer can reach them).
/// With `upsert_key`, a key of an upsert: it must be unique within the
/// upload, and a UNIQUE rule on exactly those columns does not count the
/// target's rows (the upsert replaces them).
pub(crate) async fn validate(
    staging: &Staging,
    target: &Table,
    verify: Verify,
    copy_first: bool,
    cluster: Option<&Cluster>,
    upsert_key: Option<&[String]>,
) -> Result<Validation> {
    let location = crate::upload::confine::assigned_location(staging).await?;
    let (confinement, manifests) = crate::upload::confine::confinement(staging, &location).await?;
    if !confinement.is_empty() {
        return Ok(Validation {
            reasons: confinement,
            ..Default::default()
        });
    }
    let (files, reasons) = inspect_metadata(staging, target, manifests)?;
    let rows = files.iter().map(|f| f.record_count() as i64).sum();
    let mut validation = Validation {
        files,
        rows,
        reasons,
        ..Default::default()
    };
    if verify == Verify::Metadata {
        // Counted even when the schema drifted: "optional in staging,
        // required in the target" is worth knowing with how many rows hold NULL.
        let target_schema = target.metadata().current_schema();
        validation
            .reasons
            .extend(required_nulls(staging, target_schema, &validation.files).await?);
    }
    // "Optional in staging, required in the target" is worth knowing with
    // how many rows hold NULL: count them from the bytes, rules aside.
    let only_nullability = validation
        .reasons
        .iter()
        .all(|r| r.contains(" is required in the target but optional in the staging table"));
    if verify == Verify::Bytes
        && only_nullability
        && !validation.reasons.is_empty()
        && !validation.files.is_empty()
    {
        verify_bytes(
            staging,
            target,
            &[],
            vec![],
            false,
            cluster,
            &mut validation,
        )
        .await?;
        return Ok(validation);
    }
    // Rules read the staging data by column name; with a drifted schema the
    // names may not mean what the rules mean, so they wait for a clean schema.
    if !validation.reasons.is_empty() || validation.files.is_empty() {
        return Ok(validation);
    }
    let mut rules = rules_of(target)?;
    let same = |columns: &[String], key: &[String]| {
        let set = |c: &[String]| c.iter().cloned().collect::<std::collections::BTreeSet<_>>();
        set(columns) == set(key)
    };
    if let Some(key) = upsert_key
        && !rules
            .iter()
            .any(|r| matches!(r, Rule::Unique { columns, .. } if same(columns, key)))
    {
        rules.push(Rule::Unique {
            name: UPSERT_KEY_RULE.to_string(),
            columns: key.to_vec(),
        });
    }
    for rule in &rules {
        validation
            .violations
            .insert(rule.name().to_string(), (rule.clone(), 0));
    }
    let key = rules.iter().find_map(|r| match r {
        Rule::Unique { columns, .. } => Some(columns.clone()),
        Rule::Check { .. } => None,
    });
    let ctx = SessionContext::new();
    let checks = plan_checks(&ctx, &staging.name(), &rules, &df_schema(&staging.table)?)?;
    match verify {
        Verify::Metadata => {
            evaluate_checks(
                staging,
                &checks,
                key.as_deref().unwrap_or_default(),
                &mut validation,
            )
            .await?;
        }
        Verify::Bytes => {
            verify_bytes(
                staging,
                target,
                &checks,
                key.unwrap_or_default(),
                copy_first,
                cluster,
                &mut validation,
            )
            .await?;
            if !validation.reasons.is_empty() {
                return Ok(validation);
            }
        }
    }
    crate::session::failpoint("validate.after-verification");
    // Verified from the bytes, the UNIQUE rules read the files verification
    // read: the copies where it made copies, at their stored sizes.
    let unique = rules.iter().any(|r| matches!(r, Rule::Unique { .. }));
    let verified = match verify {
        Verify::Bytes if unique => Some(verified_files(
            staging,
            target,
            &validation.files,
            copy_first,
        )?),
        Verify::Bytes | Verify::Metadata => None,
    };
    for rule in &rules {
        if let Rule::Unique { name, columns } = rule {
            let upserted = upsert_key.is_some_and(|key| same(columns, key));
            evaluate_unique(
                staging,
                target,
                name,
                columns,
                !upserted,
                verified.as_ref(),
                cluster,
                &mut validation,
            )
            .await?;
        }
    }
    Ok(validation)
}

/// Reads every staged file ([`super::verify`]): `validation.files` becomes
/// the files as the target will register them, metrics from the bytes.
async fn verify_bytes(
    staging: &Staging,
    target: &Table,
    checks: &[PlannedCheck],
    key: Vec<String>,
    copy_first: bool,
    cluster: Option<&Cluster>,
    validation: &mut Validation,
) -> Result<()> {
    let checks: Vec<(String, String)> = checks
        .iter()
        .map(|c| (c.name.clone(), c.predicate.clone()))
        .collect();
    let matching = Matching::for_staging(staging);
    let staging_schema = staging.table.metadata().current_schema();
    let plan = Arc::new(super::verify::Plan::new(
        target,
        staging_schema,
        matching,
        super::verify::compile_checks(target, &checks)?,
        key.clone(),
    )?);
    let reader: Box<dyn super::verify::ReadChunks> = match cluster {
        None => Box::new(super::verify::Here),
        #[cfg(feature = "cluster")]
        Some(cluster) => {
            // The proof's reads run on the cluster; the plan travels as a recipe.
            validation.cluster = Some(cluster.clone());
            Box::new(super::distribute::OnCluster(
                cluster.clone(),
                super::distribute::PlanRecipe::new(target, staging_schema, matching, checks, key)?,
            ))
        }
        #[cfg(not(feature = "cluster"))]
        Some(cluster) => return Err(cluster.unavailable()),
    };
    let (io, files) = if copy_first {
        let copies =
            crate::upload::transfer::copy_files(staging, target, &validation.files).await?;
        (target.file_io().clone(), copies)
    } else {
        (staging.table.file_io().clone(), validation.files.clone())
    };
    let verified = super::verify::verify(&io, &files, Arc::clone(&plan), reader.as_ref()).await;
    let verified = match verified {
        Ok(v) if v.reasons.is_empty() && v.violations.values().all(|n| *n == 0) => v,
        other => {
            if copy_first {
                let location = target.metadata().location();
                for file in &files {
                    crate::catalog::confine::delete_within(&io, file.file_path(), location).await;
                }
            }
            other?
        }
    };
    crate::metrics::count(
        "icestage_verified_rows_total",
        "Rows read from staged files by verification.",
        &[],
        verified.rows as f64,
    );
    crate::metrics::count(
        "icestage_verified_bytes_total",
        "Bytes of staged files verification read.",
        &[],
        verified
            .files
            .iter()
            .map(|f| f.file_size_in_bytes() as f64)
            .sum(),
    );
    validation.reasons.extend(verified.reasons.iter().cloned());
    validation
        .reasons
        .extend(super::verify::required_nulls(&plan, &verified));
    for (rule, count) in &verified.violations {
        if let Some(entry) = validation.violations.get_mut(rule) {
            entry.1 += count;
        }
    }
    validation.findings.extend(verified.findings);
    validation.rows = verified.rows;
    validation.files = verified.files;
    Ok(())
}

/// What `PROMOTE UPLOAD '<id>'` would check and how it would commit, for EXPLAIN.
pub(crate) async fn explain(icestage: &Catalogs, id: &str, verify: Verify) -> Result<Vec<String>> {
    let id = UploadId::parse(id)?;
    let Some(staging) = find_staging(icestage, &id).await? else {
        return Ok(vec![
            "no staging table: the upload is finished or unknown (PROMOTE reports which)"
                .to_string(),
        ]);
    };
    let target = load_target(&staging).await?;
    let mut steps = describe(&target, verify)?;
    let files = summary_count(
        staging.table.metadata().current_snapshot(),
        "total-data-files",
    )
    .unwrap_or(0);
    let path = super::transfer_path(&staging, &target);
    let how = match path {
        super::TransferPath::Copy => "copies of ",
        super::TransferPath::Rewrite => "rewritten ",
        _ => "",
    };
    steps.push(format!(
        "commit: {}: one fast_append of {how}{files} staging data file(s) into {} with {}={id}, \
         the evidence re-checked on every attempt",
        path.as_str(),
        staging.target,
        crate::upload::SNAPSHOT_UPLOAD_ID
    ));
    Ok(steps)
}

/// Which rules a promotion into `target` would evaluate and how.
fn describe(target: &Table, verify: Verify) -> Result<Vec<String>> {
    let mut steps = vec![
        "metadata: paths confined to the staging location, schema and partition-spec drift by \
         field id, append-only snapshots, no delete files"
            .to_string(),
        match verify {
            Verify::Bytes => "verify=bytes: every staged file read on all cores: its Parquet \
                              schema by field id, required NULLs, partitions and metrics from \
                              the decoded values"
                .to_string(),
            Verify::Metadata => {
                "verify=metadata: required NULLs from the manifests' null counts (trusted writer)"
                    .to_string()
            }
        },
    ];
    for rule in rules_of(target)? {
        steps.push(match (&rule, verify) {
            (Rule::Check { .. }, Verify::Bytes) => format!(
                "rule {}: {}: evaluated on every row while verifying",
                rule.name(),
                rule.definition()
            ),
            (Rule::Check { .. }, Verify::Metadata) => format!(
                "rule {}: {}: streaming scan of the files whose metrics allow a violation",
                rule.name(),
                rule.definition()
            ),
            (Rule::Unique { .. }, _) => format!(
                "rule {}: {}: group-by over the upload and merge join with the target (spills)",
                rule.name(),
                rule.definition()
            ),
        });
    }
    let files = crate::tables::files::file_columns(target)?;
    if !files.is_empty() {
        steps.push(format!(
            "files of {}: each reference under the upload's files_location, copied into the \
             target's files/<upload id>/ and its size, SHA-256 and content type checked on the \
             copy; the rows' uris rewritten to the copies",
            files.join(", ")
        ));
    }
    Ok(steps)
}
