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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{Int64Type, Schema as ArrowSchema};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::catalog::TableProvider;
use datafusion::common::DFSchema;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::logical_expr::Expr;
use datafusion::prelude::{SessionConfig, SessionContext};
use futures::{StreamExt, TryStreamExt};
use iceberg::scan::FileScanTask;
use iceberg::spec::{
    DataFile, ManifestContentType, NestedFieldRef, Operation, Schema, TableMetadata, Type,
};
use iceberg::table::Table;
use iceberg_datafusion::physical_plan::convert_filters_to_predicate;

use super::findings::Finding;
use super::promote::load_target;
use super::{Staging, UploadId, find_staging};
use crate::catalog::Icestage;
use crate::catalog::commit::summary_count;
use crate::catalog::provider::table_provider;
use crate::error::{Error, Result};
use crate::tables::rules::{PlannedCheck, Rule, df_schema, plan_checks, rules_of};

/// Row-level findings kept per rule; the count covers every violation.
pub(crate) const FINDINGS_PER_RULE: usize = 1000;
/// Memory the uniqueness queries may hold before spilling to disk.
const VALIDATION_MEMORY: usize = 256 * 1024 * 1024;

/// What validation found.
#[derive(Debug, Default)]
pub(crate) struct Validation {
    /// The staging table's live data files (what promotion registers).
    pub(crate) files: Vec<DataFile>,
    /// Rows in those files.
    pub(crate) rows: i64,
    /// Problems of the table as a whole (drift, operations, nulls).
    pub(crate) reasons: Vec<String>,
    /// Violations per rule, all of them counted.
    pub(crate) violations: BTreeMap<String, (Rule, u64)>,
    /// Row-level findings, at most [`FINDINGS_PER_RULE`] per rule.
    pub(crate) findings: Vec<Finding>,
}

impl Validation {
    /// True when nothing stands in the way of promotion.
    pub(crate) fn passed(&self) -> bool {
        self.reasons.is_empty() && self.violations.values().all(|(_, n)| *n == 0)
    }

    /// Every violation, counted.
    pub(crate) fn finding_count(&self) -> u64 {
        self.violations.values().map(|(_, n)| n).sum()
    }

    /// One line per problem: the table-level reasons, then a summary per
    /// violated rule.
    pub(crate) fn summary(&self, id: &str) -> Vec<String> {
        let mut lines = self.reasons.clone();
        for (name, (rule, count)) in &self.violations {
            if *count > 0 {
                lines.push(format!(
                    "rule '{name}' {} fails for {count} row(s) (SELECT * FROM upload_findings('{id}'))",
                    rule.definition()
                ));
            }
        }
        lines
    }
}

/// How promotion proves what it promotes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Verify {
    /// Read every staged file: schema, NULLs, rules and metrics from the
    /// bytes ([`super::verify`]). The default, and what the service uses.
    #[default]
    Bytes,
    /// Trust the staging table's manifests (null counts, bounds): only for
    /// files a trusted writer produced, e.g. icestage itself.
    Metadata,
}

impl Verify {
    /// The option value that names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bytes => "bytes",
            Self::Metadata => "metadata",
        }
    }
}

impl std::str::FromStr for Verify {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "bytes" => Ok(Self::Bytes),
            "metadata" => Ok(Self::Metadata),
            _ => Err(Error::invalid(format!(
                "verify = '{text}' is not a verification mode: use 'bytes' (read every staged file, \
                 the default) or 'metadata' (trust the manifests; only for trusted writers)"
            ))),
        }
    }
}

/// Validates `staging` against `target` and its rules. With `copy_first`,
/// the staged files are first copied into the target's storage and the
/// copies are what is verified and returned (no writer can reach them).
pub(crate) async fn validate(
    staging: &Staging,
    target: &Table,
    verify: Verify,
    copy_first: bool,
) -> Result<Validation> {
    let location = super::confine::assigned_location(staging).await?;
    let (confinement, manifests) = super::confine::confinement(staging, &location).await?;
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
        verify_bytes(staging, target, &[], vec![], false, &mut validation).await?;
        return Ok(validation);
    }
    // Rules read the staging data by column name; with a drifted schema the
    // names may not mean what the rules mean, so they wait for a clean schema.
    if !validation.reasons.is_empty() || validation.files.is_empty() {
        return Ok(validation);
    }
    let rules = rules_of(target)?;
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
                &mut validation,
            )
            .await?;
            if !validation.reasons.is_empty() {
                return Ok(validation);
            }
        }
    }
    for rule in &rules {
        if let Rule::Unique { name, columns } = rule {
            evaluate_unique(staging, target, name, columns, verify, &mut validation).await?;
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
    validation: &mut Validation,
) -> Result<()> {
    let arrow = iceberg::arrow::schema_to_arrow_schema(target.metadata().current_schema())?;
    let schema = DFSchema::try_from(arrow)?;
    let ctx = SessionContext::new();
    let compiled = checks
        .iter()
        .map(|c| {
            let expr = ctx.parse_sql_expr(&c.predicate, &schema)?;
            Ok(super::verify::Check::new(
                c.name.clone(),
                c.predicate.clone(),
                ctx.create_physical_expr(expr, &schema)?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let plan = Arc::new(super::verify::Plan::new(
        target,
        staging.table.metadata().current_schema(),
        Matching::for_staging(staging),
        compiled,
        key,
    )?);
    let (io, files) = if copy_first {
        let copies = super::transfer::copy_files(staging, target, &validation.files).await?;
        (target.file_io().clone(), copies)
    } else {
        (staging.table.file_io().clone(), validation.files.clone())
    };
    let verified = super::verify::verify(&io, &files, Arc::clone(&plan)).await;
    let verified = match verified {
        Ok(v) if v.reasons.is_empty() && v.violations.values().all(|n| *n == 0) => v,
        other => {
            if copy_first {
                for file in &files {
                    let _ = io.delete(file.file_path()).await;
                }
            }
            other?
        }
    };
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
pub(crate) async fn explain(icestage: &Icestage, id: &str, verify: Verify) -> Result<Vec<String>> {
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
    let path = super::promote::transfer_path(&staging, &target);
    let how = match path {
        super::promote::TransferPath::Copy => "copies of ",
        super::promote::TransferPath::Rewrite => "rewritten ",
        _ => "",
    };
    steps.push(format!(
        "commit: {}: one fast_append of {how}{files} staging data file(s) into {} with {}={id}, \
         the evidence re-checked on every attempt",
        path.as_str(),
        staging.target,
        super::SNAPSHOT_UPLOAD_ID
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
    Ok(steps)
}

/// One column of a schema, flattened (nested fields by their dotted path).
#[derive(Debug, PartialEq)]
struct Column {
    path: String,
    kind: String,
    required: bool,
    /// Required here and in every enclosing field, so it can never be null.
    never_null: bool,
}

fn columns(schema: &Schema) -> BTreeMap<i32, Column> {
    fn walk(
        fields: &[NestedFieldRef],
        prefix: &str,
        parents_required: bool,
        out: &mut BTreeMap<i32, Column>,
    ) {
        for field in fields {
            let path = format!("{prefix}{}", field.name);
            let never_null = parents_required && field.required;
            let nested = format!("{path}.");
            let kind = match field.field_type.as_ref() {
                Type::Primitive(p) => p.to_string(),
                Type::Struct(s) => {
                    walk(s.fields(), &nested, never_null, out);
                    "struct".to_string()
                }
                Type::List(l) => {
                    walk(std::slice::from_ref(&l.element_field), &nested, false, out);
                    "list".to_string()
                }
                Type::Map(m) => {
                    walk(
                        &[Arc::clone(&m.key_field), Arc::clone(&m.value_field)],
                        &nested,
                        false,
                        out,
                    );
                    "map".to_string()
                }
            };
            out.insert(
                field.id,
                Column {
                    path,
                    kind,
                    required: field.required,
                    never_null,
                },
            );
        }
    }
    let mut out = BTreeMap::new();
    walk(schema.as_struct().fields(), "", true, &mut out);
    out
}

/// How staging columns are matched with the target's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Matching {
    /// By field id: the staging table was registered with the target's ids.
    ById,
    /// By name: the catalog renumbered the staging table's ids (S3 Tables).
    ByName,
}

impl Matching {
    pub(crate) fn for_staging(staging: &Staging) -> Self {
        if staging.catalog.can_register_tables() {
            Matching::ById
        } else {
            Matching::ByName
        }
    }
}

/// The target's columns, each with its staging counterpart if any, and the
/// staging columns the target lacks. Keys are target (or staging) field ids.
#[allow(clippy::type_complexity)]
fn pair_columns(
    staging: &Schema,
    target: &Schema,
    matching: Matching,
) -> (
    Vec<(i32, Column, Option<(i32, Column)>)>,
    Vec<(i32, Column)>,
) {
    let mut staged = columns(staging);
    let mut pairs = vec![];
    for (id, t) in columns(target) {
        let found = match matching {
            Matching::ById => staged.remove(&id).map(|s| (id, s)),
            Matching::ByName => staged
                .iter()
                .find(|(_, s)| s.path == t.path)
                .map(|(sid, _)| *sid)
                .and_then(|sid| staged.remove(&sid).map(|s| (sid, s))),
        };
        pairs.push((id, t, found));
    }
    (pairs, staged.into_iter().collect())
}

/// Every difference between the staging table's schema and the target's,
/// one line per column, matching columns by id or by name.
pub(crate) fn schema_drift(staging: &Schema, target: &Schema, matching: Matching) -> Vec<String> {
    let (pairs, extra) = pair_columns(staging, target, matching);
    let id_note = |id: i32| match matching {
        Matching::ById => format!(" (field id {id})"),
        Matching::ByName => String::new(),
    };
    let mut drift = vec![];
    for (id, t, found) in &pairs {
        let Some((_, s)) = found else {
            drift.push(format!(
                "schema drift: column '{}'{} of the target is missing from the staging table",
                t.path,
                id_note(*id)
            ));
            continue;
        };
        if s.path != t.path {
            drift.push(format!(
                "schema drift: column '{}'{} of the target is named '{}' in the staging table",
                t.path,
                id_note(*id),
                s.path
            ));
        }
        if s.kind != t.kind {
            drift.push(format!(
                "schema drift: column '{}' is {} in the target but {} in the staging table",
                t.path, t.kind, s.kind
            ));
        }
        if s.required != t.required {
            let word = |required: bool| if required { "required" } else { "optional" };
            drift.push(format!(
                "schema drift: column '{}' is {} in the target but {} in the staging table",
                t.path,
                word(t.required),
                word(s.required)
            ));
        }
    }
    for (id, s) in &extra {
        drift.push(format!(
            "schema drift: column '{}'{} is in the staging table but not in the target",
            s.path,
            id_note(*id)
        ));
    }
    drift
}

/// The default partition spec as text, naming source columns (so it
/// compares across tables whose field ids differ).
fn spec_text(metadata: &TableMetadata) -> String {
    let spec = metadata.default_partition_spec();
    let schema = metadata.current_schema();
    let fields: Vec<String> = spec
        .fields()
        .iter()
        .map(|f| {
            let source = schema.name_by_field_id(f.source_id).unwrap_or("?");
            format!("{}={}({source})", f.name, f.transform)
        })
        .collect();
    format!("[{}]", fields.join(", "))
}

/// Nulls in columns the target requires: counted from the manifests' null
/// counts; columns whose counts some file lacks are counted by one streaming
/// scan of just those columns.
async fn required_nulls(
    staging: &Staging,
    target: &Schema,
    files: &[DataFile],
) -> Result<Vec<String>> {
    // Columns the target requires, by the staging table's field id and name
    // (columns the staging table lacks are reported as drift).
    let (pairs, _) = pair_columns(
        staging.table.metadata().current_schema(),
        target,
        Matching::for_staging(staging),
    );
    let required: Vec<(i32, String)> = pairs
        .into_iter()
        .filter(|(_, t, _)| t.never_null && t.kind != "struct")
        .filter_map(|(_, _, found)| found.map(|(id, s)| (id, s.path)))
        .collect();
    let mut nulls: HashMap<i32, u64> = HashMap::new();
    let mut unknown: HashSet<i32> = HashSet::new();
    for file in files {
        for (id, _) in &required {
            match file.null_value_counts().get(id) {
                Some(n) => *nulls.entry(*id).or_default() += n,
                None => {
                    unknown.insert(*id);
                }
            }
        }
    }
    if !unknown.is_empty() {
        // The scan reads every file, so its counts replace the partial ones.
        let scanned: Vec<&(i32, String)> = required
            .iter()
            .filter(|(id, _)| unknown.contains(id))
            .collect();
        let names = scanned.iter().map(|(_, path)| path.as_str());
        let mut stream = staging
            .table
            .scan()
            .select(names)
            .build()?
            .to_arrow()
            .await?;
        for (id, _) in &scanned {
            nulls.insert(*id, 0);
        }
        while let Some(batch) = stream.try_next().await? {
            for (index, (id, _)) in scanned.iter().enumerate() {
                *nulls.entry(*id).or_default() += batch.column(index).null_count() as u64;
            }
        }
    }
    Ok(required
        .iter()
        .filter_map(|(id, path)| {
            nulls.get(id).filter(|n| **n > 0).map(|n| {
                format!("column '{path}' is required but {n} staged row(s) hold NULL in it")
            })
        })
        .collect())
}

/// Checks the staging table's metadata against the target: drift, snapshot
/// operations, delete files, required nulls. Returns the data files to
/// promote and the table-level problems.
fn inspect_metadata(
    staging: &Staging,
    target: &Table,
    manifests: super::confine::Loaded,
) -> Result<(Vec<DataFile>, Vec<String>)> {
    let metadata = staging.table.metadata();
    let target_schema = target.metadata().current_schema();
    let matching = Matching::for_staging(staging);
    let mut reasons = schema_drift(metadata.current_schema(), target_schema, matching);
    let (staging_spec, target_spec) = (spec_text(metadata), spec_text(target.metadata()));
    if staging_spec != target_spec {
        reasons.push(format!(
            "partition spec drift: the staging table has {staging_spec}, the target {target_spec}"
        ));
    }
    let mut snapshots: Vec<_> = metadata.snapshots().collect();
    snapshots.sort_by_key(|s| s.sequence_number());
    for snapshot in &snapshots {
        let operation = &snapshot.summary().operation;
        if *operation != Operation::Append {
            reasons.push(format!(
                "snapshot {} of the staging table is a {}, not an append: only appended rows can be \
                 promoted; open a new upload and append the rows once",
                snapshot.snapshot_id(),
                operation.as_str()
            ));
        }
        if let Some(schema_id) = snapshot.schema_id()
            && schema_id != metadata.current_schema_id()
            && let Some(schema) = metadata.schema_by_id(schema_id)
            && !schema_drift(schema, target_schema, matching).is_empty()
        {
            reasons.push(format!(
                "snapshot {} of the staging table was written with schema {schema_id}, which differs \
                 from the target's; open a new upload",
                snapshot.snapshot_id()
            ));
        }
    }

    let mut files = vec![];
    {
        let default_spec = target.metadata().default_partition_spec_id();
        for (manifest, loaded) in &manifests {
            if manifest.content != ManifestContentType::Data {
                reasons.push(format!(
                    "the staging table has delete files ({}): rows were deleted or updated after \
                     they were written; open a new upload and append the rows once",
                    manifest.manifest_path
                ));
                continue;
            }
            if manifest.partition_spec_id != default_spec {
                reasons.push(format!(
                    "manifest {} was written with partition spec {}, the target's is {default_spec}",
                    manifest.manifest_path, manifest.partition_spec_id
                ));
                continue;
            }
            for entry in loaded.entries().iter().filter(|e| e.is_alive()) {
                let file = entry.data_file();
                if file.content_type() != iceberg::spec::DataContentType::Data
                    || file.file_format() != iceberg::spec::DataFileFormat::Parquet
                {
                    reasons.push(format!(
                        "staged file {} is a {:?} {:?} file: only Parquet data files can be \
                         promoted; open a new upload and append the rows once",
                        file.file_path(),
                        file.content_type(),
                        file.file_format()
                    ));
                    continue;
                }
                files.push(file.clone());
            }
        }
    }
    Ok((files, reasons))
}

/// Renders row `row` of `columns` (name, array) as `name=value, ...`.
pub(crate) fn key_text(columns: &[(String, Arc<dyn Array>)], row: usize) -> Result<String> {
    let options = FormatOptions::default().with_null("NULL");
    let mut parts = vec![];
    for (name, array) in columns {
        let formatter = ArrayFormatter::try_new(array.as_ref(), &options)?;
        parts.push(format!("{name}={}", formatter.value(row)));
    }
    Ok(parts.join(", "))
}

/// Renders row `row` of `columns` as a JSON object of strings (NULL as null).
pub(crate) fn values_json(columns: &[(String, Arc<dyn Array>)], row: usize) -> Result<String> {
    let options = FormatOptions::default();
    let mut object = serde_json::Map::new();
    for (name, array) in columns {
        let value = if array.is_null(row) {
            serde_json::Value::Null
        } else {
            let formatter = ArrayFormatter::try_new(array.as_ref(), &options)?;
            serde_json::Value::String(formatter.value(row).to_string())
        };
        object.insert(name.clone(), value);
    }
    Ok(serde_json::Value::Object(object).to_string())
}

pub(crate) fn named(
    batch: &RecordBatch,
    names: &[String],
) -> Result<Vec<(String, Arc<dyn Array>)>> {
    names
        .iter()
        .map(|name| {
            batch
                .column_by_name(name)
                .map(|a| (name.clone(), Arc::clone(a)))
                .ok_or_else(|| {
                    Error::invalid(format!("internal: the scan returned no column '{name}'"))
                })
        })
        .collect()
}

/// Evaluates every CHECK rule in one streaming pass over the staging files
/// whose metrics allow a violation of at least one of them.
async fn evaluate_checks(
    staging: &Staging,
    checks: &[PlannedCheck],
    key: &[String],
    validation: &mut Validation,
) -> Result<()> {
    if checks.is_empty() {
        return Ok(());
    }
    let table = &staging.table;
    // The columns to read: the key, then whatever the rules reference.
    let mut read: Vec<String> = key.to_vec();
    let mut referenced: Vec<Vec<String>> = vec![];
    for check in checks {
        let mut names: Vec<String> = check
            .expr
            .column_refs()
            .iter()
            .map(|c| c.name.clone())
            .collect();
        names.sort();
        for name in &names {
            if !read.contains(name) {
                read.push(name.clone());
            }
        }
        referenced.push(names);
    }
    // A row violates CHECK (p) when p is false: prune with NOT p.
    let violation = checks
        .iter()
        .map(|c| Expr::Not(Box::new(c.expr.clone())))
        .reduce(|a, b| a.or(b))
        .expect("at least one check");
    let mut scan = table.scan().select(read.iter().map(String::as_str));
    if let Some(predicate) = convert_filters_to_predicate(&[violation]) {
        scan = scan.with_filter(predicate);
    }
    let tasks: Vec<FileScanTask> = scan.build()?.plan_files().await?.try_collect().await?;

    // The predicates, planned against the columns the scan returns.
    let arrow = iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema())?;
    let projected = ArrowSchema::new(
        read.iter()
            .map(|n| arrow.field_with_name(n).cloned())
            .collect::<Result<Vec<_>, _>>()?,
    );
    let schema = DFSchema::try_from(projected)?;
    let ctx = SessionContext::new();
    let physical = checks
        .iter()
        .map(|c| {
            let expr = ctx.parse_sql_expr(&c.predicate, &schema)?;
            ctx.create_physical_expr(expr, &schema)
        })
        .collect::<datafusion::error::Result<Vec<_>>>()?;

    for mut task in tasks {
        // Whole files, so that positions count every row.
        task.predicate = None;
        let file = task.data_file_path.clone();
        let short = file.rsplit('/').next().unwrap_or(&file).to_string();
        let mut stream = table
            .reader_builder()
            .build()
            .read(futures::stream::iter([Ok(task)]).boxed())?
            .stream();
        let mut position = 0i64;
        while let Some(batch) = stream.try_next().await? {
            let batch = batch.project(
                &read
                    .iter()
                    .map(|n| batch.schema().index_of(n))
                    .collect::<Result<Vec<_>, _>>()?,
            )?;
            let key_columns = named(&batch, key)?;
            for ((check, expr), names) in checks.iter().zip(&physical).zip(&referenced) {
                let result = expr.evaluate(&batch)?.into_array(batch.num_rows())?;
                let result = result.as_boolean();
                let values = named(&batch, names)?;
                let entry = validation
                    .violations
                    .get_mut(&check.name)
                    .expect("every rule has an entry");
                for row in 0..batch.num_rows() {
                    if !result.is_valid(row) || result.value(row) {
                        continue;
                    }
                    entry.1 += 1;
                    if entry.1 as usize > FINDINGS_PER_RULE {
                        continue;
                    }
                    let at = position + row as i64;
                    validation.findings.push(Finding {
                        rule: check.name.clone(),
                        kind: "check".to_string(),
                        row: if key_columns.is_empty() {
                            format!("{short}#{at}")
                        } else {
                            key_text(&key_columns, row)?
                        },
                        file: Some(file.clone()),
                        position: Some(at),
                        values: values_json(&values, row)?,
                        message: format!("violates CHECK ({})", check.predicate),
                    });
                }
            }
            position += batch.num_rows() as i64;
        }
    }
    Ok(())
}

/// Quotes an identifier for SQL.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Evaluates one UNIQUE rule: keys repeated inside the upload, and keys the
/// target already holds. NULL keys are never duplicates, as in SQL.
async fn evaluate_unique(
    staging: &Staging,
    target: &Table,
    name: &str,
    columns: &[String],
    verify: Verify,
    validation: &mut Validation,
) -> Result<()> {
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_limit(VALIDATION_MEMORY, 1.0)
        .build_arc()?;
    let config = SessionConfig::new()
        .set_bool("datafusion.optimizer.prefer_hash_join", false)
        .with_target_partitions(2);
    let ctx = SessionContext::new_with_config_rt(config, runtime);
    let provider = |table: &Table| {
        let catalog = Arc::clone(&staging.catalog);
        let ident = table.identifier().clone();
        async move {
            table_provider(&catalog, &ident, None)
                .await?
                .ok_or_else(|| Error::TableNotFound {
                    table: ident.to_string(),
                    hint: String::new(),
                })
        }
    };
    let staged = provider(&staging.table).await?;
    // The staged side's file pruning would believe the client's manifest
    // metrics (a file claiming only NULL keys would be skipped).
    let staged: Arc<dyn TableProvider> = match verify {
        Verify::Bytes => Arc::new(NoPushdown(staged)),
        Verify::Metadata => staged,
    };
    ctx.register_table("staged", staged)?;
    ctx.register_table("target", provider(target).await?)?;
    let list = |alias: &str| {
        columns
            .iter()
            .map(|c| format!("{alias}.{}", ident(c)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let not_null = columns
        .iter()
        .map(|c| format!("s.{} IS NOT NULL", ident(c)))
        .collect::<Vec<_>>()
        .join(" AND ");
    let joined = columns
        .iter()
        .map(|c| format!("s.{0} = t.{0}", ident(c)))
        .collect::<Vec<_>>()
        .join(" AND ");
    let queries = [
        (
            format!(
                "SELECT {cols}, count(*) AS copies FROM staged s WHERE {not_null} GROUP BY {cols} HAVING count(*) > 1",
                cols = list("s")
            ),
            "appears more than once in the upload",
        ),
        (
            format!(
                "SELECT DISTINCT {cols} FROM staged s JOIN target t ON {joined}",
                cols = list("s")
            ),
            "is already in the target",
        ),
    ];
    let definition = format!("UNIQUE ({})", columns.join(", "));
    for (sql, what) in queries {
        let mut stream = ctx.sql(&sql).await?.execute_stream().await?;
        while let Some(batch) = stream.try_next().await? {
            let keys = named(&batch, columns)?;
            let copies = batch
                .column_by_name("copies")
                .map(|c| c.as_primitive::<Int64Type>().clone());
            let entry = validation
                .violations
                .get_mut(name)
                .expect("every rule has an entry");
            for row in 0..batch.num_rows() {
                let rows = copies.as_ref().map_or(1, |c| c.value(row) as u64);
                entry.1 += rows;
                if validation
                    .findings
                    .iter()
                    .filter(|f| f.rule == name)
                    .count()
                    >= FINDINGS_PER_RULE
                {
                    continue;
                }
                let mut values = keys.clone();
                if let Some(copies) = &copies {
                    values.push((
                        "copies".to_string(),
                        Arc::new(copies.clone()) as Arc<dyn Array>,
                    ));
                }
                validation.findings.push(Finding {
                    rule: name.to_string(),
                    kind: "unique".to_string(),
                    row: key_text(&keys, row)?,
                    file: None,
                    position: None,
                    values: values_json(&values, row)?,
                    message: format!("violates {definition}: the key {what}"),
                });
            }
        }
    }
    Ok(())
}

/// A table whose filters DataFusion evaluates itself: none reach the
/// scan, so no file or row group is skipped on the strength of its metrics.
#[derive(Debug)]
struct NoPushdown(Arc<dyn TableProvider>);

#[async_trait::async_trait]
impl TableProvider for NoPushdown {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn schema(&self) -> datafusion::arrow::datatypes::SchemaRef {
        self.0.schema()
    }

    fn table_type(&self) -> datafusion::datasource::TableType {
        self.0.table_type()
    }

    async fn scan(
        &self,
        state: &dyn datafusion::catalog::Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
        self.0.scan(state, projection, &[], limit).await
    }
}

#[cfg(test)]
mod tests {
    use iceberg::spec::{NestedField, PrimitiveType};

    use super::*;

    fn schema(fields: Vec<NestedField>) -> Schema {
        Schema::builder()
            .with_fields(fields.into_iter().map(Arc::new))
            .build()
            .unwrap()
    }

    fn int() -> Type {
        Type::Primitive(PrimitiveType::Int)
    }

    #[test]
    fn drift_names_each_column() {
        let target = schema(vec![
            NestedField::required(1, "id", int()),
            NestedField::required(2, "amount", int()),
            NestedField::optional(3, "note", Type::Primitive(PrimitiveType::String)),
        ]);
        assert!(schema_drift(&target, &target, Matching::ById).is_empty());
        let staging = schema(vec![
            NestedField::optional(1, "id", int()),
            NestedField::required(2, "amount", Type::Primitive(PrimitiveType::Long)),
            NestedField::optional(4, "extra", int()),
        ]);
        let drift = schema_drift(&staging, &target, Matching::ById);
        assert_eq!(
            drift,
            vec![
                "schema drift: column 'id' is required in the target but optional in the staging table",
                "schema drift: column 'amount' is int in the target but long in the staging table",
                "schema drift: column 'note' (field id 3) of the target is missing from the staging table",
                "schema drift: column 'extra' (field id 4) is in the staging table but not in the target",
            ]
        );
    }
}
