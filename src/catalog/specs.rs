//! Commits whose partition specs Iceberg's spec and its Java catalogs
//! accept but iceberg-rust's metadata builder refuses.
//!
//! Partition evolution on a format v1 table keeps every field of the
//! earlier specs in the new one (a v1 field's id is its position), which
//! gives two such specs:
//!
//! * a removed field stays as a `void` field under its old name, which for
//!   an identity field is its column's name;
//! * a second time transform of one column (`day`, then `hour`, of one
//!   timestamp) sits beside the first.
//!
//! The builder's `add_partition_spec` refuses both (a name that is a
//! column's, a redundant time transform), and its `build` binds the default
//! spec again, so a table whose default spec is one of them could take no
//! later commit at all. When the builder refuses a commit that adds a spec,
//! or that lands on a table whose default spec it cannot bind, the commit
//! is applied here instead: every other update through the builder, with
//! an unpartitioned stand-in as the default spec while it builds, then the
//! specs, checked with the spec's own rules ([`checked_fields`]: sources in
//! the schema, transforms that apply to them, names unique and no other
//! column's, v1 ids in sequence) and written into the metadata as it is
//! stored.

use iceberg::spec::{FormatVersion, PartitionSpec, TableMetadata, Transform, UnboundPartitionSpec};
use iceberg::{Error, ErrorKind, Result, TableUpdate};
use serde_json::{Value, json};

/// The id of a v1 table's first partition field: the rest follow in order.
const V1_FIRST_FIELD_ID: i32 = 1000;

/// `base` (whose metadata file is `location`) with `updates` applied as
/// iceberg's builder applies them, or as the module documentation says
/// when the builder refuses them for a partition spec.
pub(crate) fn apply(
    base: &TableMetadata,
    location: &str,
    updates: Vec<TableUpdate>,
) -> Result<TableMetadata> {
    // The builder's `build` would refuse this default spec, whatever the
    // updates.
    if !binds(base.default_partition_spec(), base) {
        return leniently(base, location, updates);
    }
    if !updates
        .iter()
        .any(|u| matches!(u, TableUpdate::AddSpec { .. }))
    {
        return through_builder(base.clone(), location, updates);
    }
    // Refused for anything but a spec, the lenient path's builder refuses
    // it again, and says why.
    through_builder(base.clone(), location, updates.clone())
        .or_else(|_| leniently(base, location, updates))
}

/// Fails, saying what to do, when `table`'s default partition spec is one
/// that iceberg's builder cannot bind (see the module documentation): the
/// transactions icestage's own commits run (INSERT, PROMOTE, COPY INTO,
/// maintenance) rebuild the metadata with that builder, which would refuse
/// them without saying why.
pub(crate) fn check_committable(table: &iceberg::table::Table) -> Result<()> {
    let metadata = table.metadata();
    let spec = metadata.default_partition_spec();
    if binds(spec, metadata) {
        return Ok(());
    }
    let fields: Vec<String> = spec
        .fields()
        .iter()
        .map(|f| format!("{} ({})", f.name, f.transform))
        .collect();
    Err(Error::new(
        ErrorKind::FeatureUnsupported,
        format!(
            "{}: its partition spec {} ({}) has a void field named like a column or two time              transforms of one column, which format v1's partition evolution leaves and              icestage's own commits cannot write yet (Iceberg clients of the REST catalog can);              rename the void field (PyIceberg: update_spec().rename_field(old, new)) or remove              one of the time fields, then run this again",
            table.identifier(),
            spec.spec_id(),
            fields.join(", ")
        ),
    ))
}

/// `updates` applied to `base` by iceberg's builder alone.
fn through_builder(
    base: TableMetadata,
    location: &str,
    updates: Vec<TableUpdate>,
) -> Result<TableMetadata> {
    let mut builder = base.into_builder(Some(location.to_string()));
    for update in updates {
        builder = update.apply(builder)?;
    }
    Ok(builder.build()?.metadata)
}

/// Whether iceberg's builder can bind `spec` to `metadata`'s current schema.
fn binds(spec: &PartitionSpec, metadata: &TableMetadata) -> bool {
    spec.clone()
        .into_unbound()
        .bind(std::sync::Arc::clone(metadata.current_schema()))
        .is_ok()
}

/// `updates` applied to `base` with the partition specs added here (see
/// the module documentation).
fn leniently(
    base: &TableMetadata,
    location: &str,
    updates: Vec<TableUpdate>,
) -> Result<TableMetadata> {
    let (specs, rest): (Vec<_>, Vec<_>) = updates.into_iter().partition(|u| {
        matches!(
            u,
            TableUpdate::AddSpec { .. } | TableUpdate::SetDefaultSpec { .. }
        )
    });
    let stand_in = base
        .partition_specs_iter()
        .map(|spec| spec.spec_id())
        .max()
        .unwrap_or_default()
        + 1;
    let mut shadow = document(base)?;
    specs_of(&mut shadow)?.push(json!({"spec-id": stand_in, "fields": []}));
    set_default(&mut shadow, stand_in)?;
    let built = through_builder(parsed(shadow)?, location, rest)?;

    let mut stored = document(&built)?;
    specs_of(&mut stored)?.retain(|spec| spec["spec-id"] != json!(stand_in));
    let (mut default, mut added) = (base.default_partition_spec_id(), None);
    for update in specs {
        match update {
            TableUpdate::AddSpec { spec } => added = Some(add_spec(&mut stored, &built, spec)?),
            TableUpdate::SetDefaultSpec { spec_id: -1 } => {
                default = added.ok_or_else(|| {
                    invalid(
                        "set-default-spec names the last spec added (-1), but the commit adds none",
                    )
                })?;
            }
            TableUpdate::SetDefaultSpec { spec_id } => default = spec_id,
            _ => {}
        }
    }
    set_default(&mut stored, default)?;
    parsed(stored)
}

/// `spec` added to the metadata document `stored` (which `built` parsed
/// from, before the specs): its id, or that of an equal spec it already has.
fn add_spec(stored: &mut Value, built: &TableMetadata, spec: UnboundPartitionSpec) -> Result<i32> {
    let fields = checked_fields(built, specs_of(stored)?, &spec)?;
    let specs = specs_of(stored)?;
    if let Some(same) = specs.iter().find(|s| s["fields"] == fields) {
        return same["spec-id"]
            .as_i64()
            .and_then(|id| i32::try_from(id).ok())
            .ok_or_else(|| invalid("a partition spec of the table has no spec-id"));
    }
    let id = specs
        .iter()
        .filter_map(|s| s["spec-id"].as_i64())
        .max()
        .map_or(0, |max| max + 1);
    let id = i32::try_from(id).map_err(|_| invalid("the table has too many partition specs"))?;
    let highest = fields
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["field-id"].as_i64())
        .max();
    specs.push(json!({"spec-id": id, "fields": fields}));
    if let Some(highest) = highest {
        let last = stored["last-partition-id"].as_i64().unwrap_or_default();
        stored["last-partition-id"] = json!(last.max(highest));
    }
    Ok(id)
}

/// The fields of `spec`, checked against the table `built` with the spec's
/// own rules and given their ids (those sent, else v1's positions, or the
/// id of an equal field of an earlier spec in `earlier`, or the next id),
/// as the metadata stores them.
fn checked_fields(
    built: &TableMetadata,
    earlier: &[Value],
    spec: &UnboundPartitionSpec,
) -> Result<Value> {
    let schema = built.current_schema();
    let v1 = built.format_version() == FormatVersion::V1;
    let mut next = built.last_partition_id();
    let mut names = std::collections::HashSet::new();
    let mut ids = std::collections::HashSet::new();
    let mut fields = vec![];
    for (position, field) in spec.fields().iter().enumerate() {
        let name = &field.name;
        let source = schema.field_by_id(field.source_id).ok_or_else(|| {
            invalid(format!(
                "partition field '{name}': source column id {} is not in the table's schema",
                field.source_id
            ))
        })?;
        if !source.field_type.is_primitive() {
            return Err(invalid(format!(
                "partition field '{name}': its source column '{}' is not of a primitive type",
                source.name
            )));
        }
        field
            .transform
            .result_type(&source.field_type)
            .map_err(|e| invalid(format!("partition field '{name}': {}", e.message())))?;
        if name.is_empty() || !names.insert(name.as_str()) {
            return Err(invalid(format!(
                "partition field '{name}': every field of a spec needs a name of its own"
            )));
        }
        let own_column = |column: &iceberg::spec::NestedFieldRef| {
            column.id == field.source_id
                && matches!(field.transform, Transform::Identity | Transform::Void)
        };
        let column = built
            .schemas_iter()
            .find_map(|schema| schema.field_by_name(name));
        if column.is_some_and(|column| !own_column(column)) {
            return Err(invalid(format!(
                "partition field '{name}' is named like column '{name}' but does not take its \
                 value: name it otherwise"
            )));
        }
        let position = i32::try_from(position).map_err(|_| invalid("too many partition fields"))?;
        let id = match field.field_id {
            Some(id) => id,
            None if v1 => V1_FIRST_FIELD_ID + position,
            None => {
                equal_field_id(earlier, field.source_id, &field.transform).unwrap_or_else(|| {
                    next = next.max(V1_FIRST_FIELD_ID - 1) + 1;
                    next
                })
            }
        };
        if v1 && id != V1_FIRST_FIELD_ID + position {
            return Err(invalid(format!(
                "partition field '{name}': field id {id} is not its position in the spec ({}), \
                 as a format v1 table's must be",
                V1_FIRST_FIELD_ID + position
            )));
        }
        if !ids.insert(id) {
            return Err(invalid(format!(
                "partition field '{name}': field id {id} is taken by another field of the spec"
            )));
        }
        fields.push(json!({
            "source-id": field.source_id,
            "field-id": id,
            "name": name,
            "transform": field.transform,
        }));
    }
    Ok(Value::Array(fields))
}

/// The id of a field of an earlier spec with `source_id` and `transform`:
/// one partition field keeps its id across specs.
fn equal_field_id(earlier: &[Value], source_id: i32, transform: &Transform) -> Option<i32> {
    let transform = json!(transform);
    earlier
        .iter()
        .flat_map(|spec| spec["fields"].as_array().into_iter().flatten())
        .find(|f| f["source-id"] == json!(source_id) && f["transform"] == transform)
        .and_then(|f| f["field-id"].as_i64())
        .and_then(|id| i32::try_from(id).ok())
}

/// `metadata` as its metadata file holds it.
fn document(metadata: &TableMetadata) -> Result<Value> {
    serde_json::to_value(metadata).map_err(|e| invalid(format!("table metadata: {e}")))
}

/// The metadata file `document` read back.
fn parsed(document: Value) -> Result<TableMetadata> {
    serde_json::from_value(document).map_err(|e| invalid(format!("table metadata: {e}")))
}

/// The partition specs of the metadata `document`.
fn specs_of(document: &mut Value) -> Result<&mut Vec<Value>> {
    document["partition-specs"]
        .as_array_mut()
        .ok_or_else(|| invalid("table metadata without partition-specs"))
}

/// Makes spec `id` of the metadata `document` its default (a v1 file also
/// names the default spec's fields as `partition-spec`).
fn set_default(document: &mut Value, id: i32) -> Result<()> {
    let fields = specs_of(document)?
        .iter()
        .find(|spec| spec["spec-id"] == json!(id))
        .map(|spec| spec["fields"].clone())
        .ok_or_else(|| {
            invalid(format!(
                "set-default-spec names spec {id}, which the table does not have"
            ))
        })?;
    document["default-spec-id"] = json!(id);
    if document.get("partition-spec").is_some() {
        document["partition-spec"] = fields;
    }
    Ok(())
}

fn invalid(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::DataInvalid, message.into())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use iceberg::TableCreation;
    use iceberg::spec::{NestedField, PrimitiveType, Schema, TableMetadataBuilder, Type};

    use super::*;

    const LOCATION: &str = "/wh/ns/t/metadata/00000-a.metadata.json";

    /// A v1 table of `id` (long) and `ts` (timestamp), partitioned by `spec`.
    fn v1_table(spec: UnboundPartitionSpec) -> TableMetadata {
        let schema = Schema::builder()
            .with_fields(vec![
                NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
                NestedField::optional(2, "ts", Type::Primitive(PrimitiveType::Timestamp)).into(),
            ])
            .build()
            .unwrap();
        let creation = TableCreation::builder()
            .name("t".to_string())
            .location("/wh/ns/t".to_string())
            .schema(schema)
            .partition_spec(spec)
            .properties(HashMap::new())
            .format_version(FormatVersion::V1)
            .build();
        TableMetadataBuilder::from_table_creation(creation)
            .unwrap()
            .build()
            .unwrap()
            .metadata
    }

    /// A spec of `fields` (source, id, name, transform) as a client sends
    /// it: iceberg's own spec builder would refuse some of them.
    fn spec(fields: &[(i32, i32, &str, Transform)]) -> UnboundPartitionSpec {
        let fields: Vec<Value> = fields
            .iter()
            .map(|(source, id, name, transform)| {
                json!({"source-id": source, "field-id": id, "name": name, "transform": transform})
            })
            .collect();
        serde_json::from_value(json!({ "fields": fields })).unwrap()
    }

    /// `spec` added and made the default.
    fn evolve(base: &TableMetadata, spec: UnboundPartitionSpec) -> Result<TableMetadata> {
        apply(
            base,
            LOCATION,
            vec![
                TableUpdate::AddSpec { spec },
                TableUpdate::SetDefaultSpec { spec_id: -1 },
            ],
        )
    }

    fn fields(metadata: &TableMetadata) -> Vec<(i32, i32, String, Transform)> {
        metadata
            .default_partition_spec()
            .fields()
            .iter()
            .map(|f| (f.source_id, f.field_id, f.name.clone(), f.transform))
            .collect()
    }

    #[test]
    fn a_removed_identity_field_stays_void_under_its_column_s_name() {
        let base = v1_table(spec(&[(1, 1000, "id", Transform::Identity)]));
        let removed = evolve(&base, spec(&[(1, 1000, "id", Transform::Void)])).unwrap();
        assert_eq!(removed.default_partition_spec_id(), 1);
        assert_eq!(fields(&removed), [(1, 1000, "id".into(), Transform::Void)]);
        assert_eq!(removed.partition_specs_iter().len(), 2);
        // The table takes later commits, and keeps its default spec.
        let later = apply(
            &removed,
            LOCATION,
            vec![TableUpdate::SetProperties {
                updates: HashMap::from([("k".to_string(), "v".to_string())]),
            }],
        )
        .unwrap();
        assert_eq!(later.properties().get("k").map(String::as_str), Some("v"));
        assert_eq!(later.default_partition_spec_id(), 1);
        assert_eq!(fields(&later), fields(&removed));
        assert_eq!(later.partition_specs_iter().len(), 2);
        assert_eq!(later.metadata_log().last().unwrap().metadata_file, LOCATION);
    }

    #[test]
    fn a_second_time_transform_of_one_column_is_added() {
        let base = v1_table(spec(&[(2, 1000, "day", Transform::Day)]));
        let both = evolve(
            &base,
            spec(&[
                (2, 1000, "day", Transform::Day),
                (2, 1001, "hour", Transform::Hour),
            ]),
        )
        .unwrap();
        assert_eq!(
            fields(&both),
            [
                (2, 1000, "day".into(), Transform::Day),
                (2, 1001, "hour".into(), Transform::Hour)
            ]
        );
        assert_eq!(both.last_partition_id(), 1001);
    }

    #[test]
    fn a_spec_that_breaks_the_spec_s_rules_is_refused() {
        let base = v1_table(spec(&[(1, 1000, "id", Transform::Identity)]));
        for (bad, says) in [
            (
                spec(&[(1, 1000, "ts", Transform::Void)]),
                "named like column 'ts'",
            ),
            (
                spec(&[(9, 1000, "x", Transform::Identity)]),
                "source column id 9",
            ),
            (
                spec(&[(1, 1001, "x", Transform::Identity)]),
                "not its position",
            ),
            (
                spec(&[(1, 1000, "x", Transform::Day)]),
                "'x': long is not a valid input",
            ),
        ] {
            let error = evolve(&base, bad).unwrap_err().to_string();
            assert!(error.contains(says), "{error}");
        }
        assert_eq!(base.default_partition_spec_id(), 0);
    }
}
