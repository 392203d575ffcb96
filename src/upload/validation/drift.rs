//! What a staging table's metadata answers, without reading data: schema
//! and partition-spec drift by field id, snapshots that are not plain
//! appends, delete files, and NULLs in required columns from the manifests'
//! null counts.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::Array;
use futures::TryStreamExt;
use iceberg::spec::{
    DataFile, ManifestContentType, NestedFieldRef, Operation, Schema, TableMetadata, Type,
};
use iceberg::table::Table;

use crate::error::Result;
use crate::upload::Staging;

/// One column of a schema, flattened (nested fields by their dotted path).
#[derive(Debug, PartialEq)]
pub(crate) struct Column {
    path: String,
    kind: String,
    required: bool,
    /// Required here and in every enclosing field, so it can never be null.
    never_null: bool,
}

pub(crate) fn columns(schema: &Schema) -> BTreeMap<i32, Column> {
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
pub(crate) fn pair_columns(
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
pub(crate) fn spec_text(metadata: &TableMetadata) -> String {
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
pub(crate) async fn required_nulls(
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
pub(crate) fn inspect_metadata(
    staging: &Staging,
    target: &Table,
    manifests: crate::upload::confine::Loaded,
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
