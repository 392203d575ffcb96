//! Required-ness below the top level: which rows hold a value at each depth
//! of a struct, list or map, and the NULLs in required fields there.

use datafusion::arrow::array::{Array, ArrayRef, AsArray};

use iceberg::spec::Type;

/// Which of `array`'s rows hold a value: its own validity, and only where
/// `parent` (the rows that exist at this depth) says so.
pub(super) fn valid_rows(array: &dyn Array, parent: Option<&[bool]>) -> Vec<bool> {
    let nulls = array.logical_nulls();
    (0..array.len())
        .map(|row| parent.is_none_or(|p| p[row]) && nulls.as_ref().is_none_or(|n| n.is_valid(row)))
        .collect()
}

/// Counts, into `out` under `field`, the rows `valid` says hold NULL.
pub(super) fn count_nulls(
    valid: &[bool],
    field: &str,
    out: &mut std::collections::BTreeMap<String, u64>,
) {
    let nulls = valid.iter().filter(|v| !**v).count();
    if nulls > 0 {
        *out.entry(field.to_string()).or_default() += nulls as u64;
    }
}

/// Counts, into `out`, the NULLs of required fields below `array` (of
/// Iceberg type `kind`, named `path`), among the rows `exists` holds: a
/// NULL under a NULL parent is no value at all and not counted.
pub(super) fn required_below(
    array: &dyn Array,
    kind: &Type,
    path: &str,
    exists: &[bool],
    out: &mut std::collections::BTreeMap<String, u64>,
) {
    let mut child =
        |array: &dyn Array, field: &iceberg::spec::NestedField, name: &str, exists: &[bool]| {
            let here = format!("{path}.{name}");
            let valid = valid_rows(array, Some(exists));
            if field.required {
                let missing: Vec<bool> =
                    exists.iter().zip(&valid).map(|(e, v)| !*e || *v).collect();
                count_nulls(&missing, &here, out);
            }
            if !field.field_type.is_primitive() {
                required_below(array, &field.field_type, &here, &valid, out);
            }
        };
    match kind {
        Type::Struct(fields) => {
            let Some(array) = array.as_struct_opt() else {
                return;
            };
            for (index, field) in fields.fields().iter().enumerate() {
                let column = array
                    .fields()
                    .iter()
                    .position(|f| {
                        f.metadata()
                            .get(parquet::arrow::PARQUET_FIELD_ID_META_KEY)
                            .is_some_and(|id| *id == field.id.to_string())
                    })
                    .or_else(|| array.fields().iter().position(|f| f.name() == &field.name))
                    .unwrap_or(index);
                if let Some(values) = array.columns().get(column) {
                    child(values.as_ref(), field, &field.name, exists);
                }
            }
        }
        Type::List(list) => {
            let (values, ranges): (&ArrayRef, Vec<(usize, usize)>) =
                if let Some(a) = array.as_list_opt::<i32>() {
                    (a.values(), offsets(a.value_offsets()))
                } else if let Some(a) = array.as_list_opt::<i64>() {
                    (a.values(), offsets(a.value_offsets()))
                } else {
                    return;
                };
            let inner = spread(exists, &ranges, values.len());
            child(values.as_ref(), &list.element_field, "element", &inner);
        }
        Type::Map(map) => {
            let Some(array) = array.as_map_opt() else {
                return;
            };
            let inner = spread(
                exists,
                &offsets(array.value_offsets()),
                array.entries().len(),
            );
            child(array.keys().as_ref(), &map.key_field, "key", &inner);
            child(array.values().as_ref(), &map.value_field, "value", &inner);
        }
        Type::Primitive(_) => {}
    }
}

/// `(start, end)` of each row's values from Arrow offsets.
fn offsets<O: Copy + TryInto<usize>>(offsets: &[O]) -> Vec<(usize, usize)> {
    offsets
        .windows(2)
        .map(|w| (w[0].try_into().unwrap_or(0), w[1].try_into().unwrap_or(0)))
        .collect()
}

/// Which of `len` child values exist: those inside the range of a row that
/// exists.
fn spread(exists: &[bool], ranges: &[(usize, usize)], len: usize) -> Vec<bool> {
    let mut inner = vec![false; len];
    for ((start, end), row) in ranges.iter().zip(exists) {
        if *row {
            for slot in inner.iter_mut().take(*end).skip(*start) {
                *slot = true;
            }
        }
    }
    inner
}
