//! Column metrics taken from the values read (value and null counts,
//! lower and upper bounds): what the target's manifest will carry.

use std::borrow::Cow;

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::array::{Array, ArrowPrimitiveType, AsArray, PrimitiveArray};
use datafusion::arrow::compute::{self};
use datafusion::arrow::datatypes::{
    Date32Type, Float32Type, Float64Type, Int32Type, Int64Type, TimestampMicrosecondType,
};
use iceberg::spec::{Datum, PrimitiveType, Type};

/// String bounds longer than this are left out of the metrics (Iceberg
/// truncates bounds; leaving one out only costs pruning, never correctness).
const MAX_STRING_BOUND: usize = 64;

/// Metrics of one column, accumulated over the rows read.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct ColumnMetrics {
    pub(super) values: u64,
    pub(super) nulls: u64,
    pub(super) lower: Option<Datum>,
    pub(super) upper: Option<Datum>,
    /// False once some batch had values whose bounds could not be taken.
    bounded: bool,
}

impl ColumnMetrics {
    pub(super) fn new() -> Self {
        Self {
            bounded: true,
            ..Default::default()
        }
    }

    pub(super) fn add(&mut self, array: &ArrayRef, kind: &Type) {
        let nulls = array.logical_null_count();
        self.values += array.len() as u64;
        self.nulls += nulls as u64;
        if nulls == array.len() {
            return;
        }
        match (bounds(array, kind), self.bounded) {
            (Some((low, high)), true) => {
                if self.lower.as_ref().is_none_or(|l| low < *l) {
                    self.lower = Some(low);
                }
                if self.upper.as_ref().is_none_or(|u| high > *u) {
                    self.upper = Some(high);
                }
            }
            _ => {
                self.bounded = false;
                self.lower = None;
                self.upper = None;
            }
        }
    }

    pub(super) fn merge(&mut self, other: ColumnMetrics) {
        self.values += other.values;
        self.nulls += other.nulls;
        self.bounded &= other.bounded;
        if !self.bounded {
            self.lower = None;
            self.upper = None;
            return;
        }
        if let Some(low) = other.lower
            && self.lower.as_ref().is_none_or(|l| low < *l)
        {
            self.lower = Some(low);
        }
        if let Some(high) = other.upper
            && self.upper.as_ref().is_none_or(|u| high > *u)
        {
            self.upper = Some(high);
        }
    }
}

/// The least and greatest value of `array` (which has the Arrow type of
/// `kind`), as Iceberg bounds; `None` where they cannot be taken exactly.
fn bounds(array: &ArrayRef, kind: &Type) -> Option<(Datum, Datum)> {
    let Type::Primitive(primitive) = kind else {
        return None;
    };
    if let Some(dictionary) = array.as_any_dictionary_opt() {
        // Every value is one of the dictionary's; bounds over the dictionary
        // hold them all.
        return bounds(dictionary.values(), kind);
    }
    match primitive {
        PrimitiveType::Boolean => {
            let a = array.as_boolean_opt()?;
            Some((
                Datum::bool(compute::min_boolean(a)?),
                Datum::bool(compute::max_boolean(a)?),
            ))
        }
        PrimitiveType::Int => {
            let (low, high) = min_max(array.as_primitive_opt::<Int32Type>()?)?;
            Some((Datum::int(low), Datum::int(high)))
        }
        PrimitiveType::Long => {
            let (low, high) = min_max(array.as_primitive_opt::<Int64Type>()?)?;
            Some((Datum::long(low), Datum::long(high)))
        }
        PrimitiveType::Float => {
            let a = array.as_primitive_opt::<Float32Type>()?;
            let (low, high) = (compute::min(a)?, compute::max(a)?);
            (!low.is_nan() && !high.is_nan()).then(|| (Datum::float(low), Datum::float(high)))
        }
        PrimitiveType::Double => {
            let a = array.as_primitive_opt::<Float64Type>()?;
            let (low, high) = (compute::min(a)?, compute::max(a)?);
            (!low.is_nan() && !high.is_nan()).then(|| (Datum::double(low), Datum::double(high)))
        }
        PrimitiveType::Date => {
            let (low, high) = min_max(array.as_primitive_opt::<Date32Type>()?)?;
            Some((Datum::date(low), Datum::date(high)))
        }
        PrimitiveType::Timestamp | PrimitiveType::Timestamptz => {
            let (low, high) = min_max(array.as_primitive_opt::<TimestampMicrosecondType>()?)?;
            Some(if *primitive == PrimitiveType::Timestamp {
                (Datum::timestamp_micros(low), Datum::timestamp_micros(high))
            } else {
                (
                    Datum::timestamptz_micros(low),
                    Datum::timestamptz_micros(high),
                )
            })
        }
        PrimitiveType::String => {
            let (low, high) = if let Some(views) = array.as_string_view_opt() {
                string_view_bounds(views)?
            } else {
                let (low, high) = match array.as_string_opt::<i32>() {
                    Some(a) => string_bounds(a)?,
                    None => string_bounds(array.as_string_opt::<i64>()?)?,
                };
                (Cow::Borrowed(low), Cow::Borrowed(high))
            };
            (low.len() <= MAX_STRING_BOUND && high.len() <= MAX_STRING_BOUND)
                .then(|| (Datum::string(low), Datum::string(high)))
        }
        _ => None,
    }
}

/// The least and greatest non-null value of `array`, both in one pass over
/// the values when none is NULL (Arrow's `min` and `max` take a pass each).
fn min_max<T>(array: &PrimitiveArray<T>) -> Option<(T::Native, T::Native)>
where
    T: ArrowPrimitiveType,
    T::Native: Ord,
{
    if array.null_count() > 0 {
        return Some((compute::min(array)?, compute::max(array)?));
    }
    let values = array.values();
    let first = *values.first()?;
    Some(
        values
            .iter()
            .fold((first, first), |(low, high), v| (low.min(*v), high.max(*v))),
    )
}

/// The first eight bytes of `value`, zero-padded, as a number that orders
/// as the bytes do.
fn prefix(value: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    let n = value.len().min(8);
    bytes[..n].copy_from_slice(&value[..n]);
    u64::from_be_bytes(bytes)
}

/// The least and greatest non-null value of `array`, byte-wise (as Iceberg
/// orders strings). Most values are decided by their first eight bytes, so
/// few comparisons reach the whole strings.
fn string_bounds<O: datafusion::arrow::array::OffsetSizeTrait>(
    array: &datafusion::arrow::array::GenericStringArray<O>,
) -> Option<(&str, &str)> {
    let offsets = array.value_offsets();
    let values = array.value_data();
    let nulls = array.nulls();
    // (least, greatest), each with its prefix.
    type Bound<'a> = (&'a [u8], u64);
    let mut bounds: Option<(Bound<'_>, Bound<'_>)> = None;
    for row in 0..array.len() {
        if nulls.is_some_and(|n| n.is_null(row)) {
            continue;
        }
        let value = &values[offsets[row].as_usize()..offsets[row + 1].as_usize()];
        let key = prefix(value);
        match &mut bounds {
            None => bounds = Some(((value, key), (value, key))),
            Some((low, high)) => {
                if key < low.1 || (key == low.1 && value < low.0) {
                    *low = (value, key);
                }
                if key > high.1 || (key == high.1 && value > high.0) {
                    *high = (value, key);
                }
            }
        }
    }
    let ((low, _), (high, _)) = bounds?;
    // Slices of a valid string array at its own offsets are valid UTF-8.
    Some((
        std::str::from_utf8(low).ok()?,
        std::str::from_utf8(high).ok()?,
    ))
}

/// Views a block of [`block_bounds`] holds.
const BLOCK: usize = 1_024;

/// [`string_bounds`] for string views, in one pass. A string of at most
/// 12 bytes lies in its view: its bytes read as a big-endian number, then
/// its length, order as the strings do, so such values are compared as
/// integers (without a branch: the least and greatest key are kept, and
/// the string is read back from the key); longer ones as strings. Without
/// NULLs, blocks go through a loop of their own until one holds a longer
/// string; that block and the rest take the loop that handles both, so a
/// column of long strings is not read twice.
fn string_view_bounds(
    array: &datafusion::arrow::array::StringViewArray,
) -> Option<(Cow<'_, str>, Cow<'_, str>)> {
    let nulls = array.nulls().filter(|n| n.null_count() > 0);
    // No inline key is u128::MAX (its low 32 bits are a length of at most 12).
    let (mut low, mut high) = (u128::MAX, 0u128);
    let mut long: Option<(&str, &str)> = None;
    let mut inline_only = nulls.is_none();
    for (index, block) in array.views().chunks(BLOCK).enumerate() {
        if inline_only {
            if let Some((least, greatest)) = block_bounds(block) {
                low = low.min(least);
                high = high.max(greatest);
                continue;
            }
            inline_only = false;
        }
        for (offset, view) in block.iter().enumerate() {
            let row = index * BLOCK + offset;
            if nulls.is_some_and(|n| n.is_null(row)) {
                continue;
            }
            let length = *view as u32;
            if length <= 12 {
                let key = inline_key(*view, length);
                low = low.min(key);
                high = high.max(key);
            } else {
                let value = array.value(row);
                match &mut long {
                    None => long = Some((value, value)),
                    Some((least, greatest)) => {
                        if value < *least {
                            *least = value;
                        }
                        if value > *greatest {
                            *greatest = value;
                        }
                    }
                }
            }
        }
    }
    let short = if low == u128::MAX {
        None
    } else {
        Some((key_text(low)?, key_text(high)?))
    };
    match (short, long) {
        (Some((a, b)), Some((c, d))) => Some((
            if a.as_str() <= c {
                Cow::Owned(a)
            } else {
                Cow::Borrowed(c)
            },
            if b.as_str() >= d {
                Cow::Owned(b)
            } else {
                Cow::Borrowed(d)
            },
        )),
        (Some((a, b)), None) => Some((Cow::Owned(a), Cow::Owned(b))),
        (None, Some((c, d))) => Some((Cow::Borrowed(c), Cow::Borrowed(d))),
        (None, None) => None,
    }
}

/// The least and greatest [`inline_key`] of `views`, or `None` when one
/// of them is longer than 12 bytes. A loop of its own, so that both bounds
/// stay in registers: inside [`string_view_bounds`]'s loop they were kept
/// on the stack, and every view waited on a store and a load.
#[inline(never)]
fn block_bounds(views: &[u128]) -> Option<(u128, u128)> {
    let (mut low, mut high) = (u128::MAX, 0u128);
    let mut long = false;
    for view in views {
        let length = *view as u32;
        long |= length > 12;
        let key = inline_key(*view, length.min(12));
        low = low.min(key);
        high = high.max(key);
    }
    (!long).then_some((low, high))
}

/// Per length of at most 12, the bits of a swapped view that hold the
/// string's bytes: the top `8 * length`.
const INLINE_MASKS: [u128; 13] = {
    let mut masks = [0u128; 13];
    let mut length = 1;
    while length <= 12 {
        masks[length] = u128::MAX << (8 * (16 - length));
        length += 1;
    }
    masks
};

/// A key that orders inline views (`length` of at most 12) as their bytes
/// do: the bytes big-endian in the top 96 bits (those past `length` masked
/// off), the length in the low 32.
fn inline_key(view: u128, length: u32) -> u128 {
    // Little-endian, the length is the view's bytes 0 to 3 and the string
    // its bytes 4 to 15: swapped, the length is the top 32 bits and byte 0
    // of the string the next; shifted, byte 0 is the most significant.
    let bytes = view.swap_bytes() << 32;
    (bytes & INLINE_MASKS[length as usize]) | u128::from(length)
}

/// The string an [`inline_key`] was taken from (`None` if its bytes are
/// not UTF-8, which a valid string array never holds).
fn key_text(key: u128) -> Option<String> {
    let length = (key as u32 as usize).min(12);
    String::from_utf8(key.to_be_bytes()[..length].to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{DictionaryArray, Int32Array, LargeStringArray, StringArray};
    use datafusion::arrow::datatypes::Int32Type;

    use super::*;

    #[test]
    fn string_bounds_order_bytes_and_skip_nulls() {
        let array = StringArray::from(vec![
            Some("txn_5"),
            None,
            Some("txn_10"),
            Some("txn_1000000000"),
            Some("a"),
            Some("txn_9"),
            Some(""),
        ]);
        assert_eq!(string_bounds(&array), Some(("", "txn_9")));
        let large = LargeStringArray::from(vec![Some("b"), Some("abcdefghij"), Some("abcdefghi")]);
        assert_eq!(string_bounds(&large), Some(("abcdefghi", "b")));
        let empty = StringArray::from(vec![None::<&str>]);
        assert_eq!(string_bounds(&empty), None);
    }

    #[test]
    fn string_view_bounds_are_arrow_s_min_and_max() {
        use datafusion::arrow::array::StringViewArray;
        let cases: Vec<Vec<Option<&str>>> = vec![
            vec![
                Some("txn_5"),
                None,
                Some("txn_10"),
                Some("txn_9"),
                Some("a"),
            ],
            vec![Some("a"), Some("a\0"), Some(""), Some("a\u{1}")],
            vec![
                Some("abcdefghijkl"),
                Some("abcdefghijklm"),
                Some("abcdefghijk"),
            ],
            vec![
                Some("zzzzzzzzzzzzzzzz"),
                Some("b"),
                Some("aaaaaaaaaaaaaaaaaaaa"),
                None,
            ],
            vec![
                Some("\u{ff}x"),
                Some("\u{7f}"),
                Some("long string over twelve bytes"),
            ],
            vec![
                Some("same prefix 12+a"),
                Some("same prefix 12"),
                Some("same prefix 1"),
            ],
            vec![None, None],
            vec![],
        ];
        // And strings of 0 to 19 bytes over a small alphabet (NUL among
        // them), where prefixes and lengths decide most comparisons.
        let mut state = 7u64;
        let mut random: Vec<String> = vec![];
        for _ in 0..2_000 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let length = (state >> 59) as usize % 20;
            random.push(
                (0..length)
                    .map(|i| ['\0', 'a', 'b', '~'][(state >> (2 * i + 8)) as usize % 4])
                    .collect(),
            );
        }
        // And whole blocks: inline strings only (over two blocks), then
        // inline blocks before one holding a longer string, and with NULLs.
        let inline: Vec<Option<&str>> = random
            .iter()
            .filter(|s| s.len() <= 12)
            .map(|s| Some(s.as_str()))
            .collect();
        assert!(inline.len() > BLOCK);
        let mut mixed = inline.clone();
        mixed.extend(random.iter().map(|s| Some(s.as_str())));
        let mut nulls = inline.clone();
        nulls.push(None);
        // Each bound in one block only: the first, then the last.
        let mut first = vec![Some("m"); 3 * BLOCK];
        first[0] = Some("a");
        first[1] = Some("z");
        let mut last = first.clone();
        last.reverse();
        let cases = cases
            .into_iter()
            .chain(
                random
                    .chunks(50)
                    .map(|c| c.iter().map(|s| Some(s.as_str())).collect()),
            )
            .chain([inline, mixed, nulls, first, last]);
        for case in cases {
            let array = StringViewArray::from(case.clone());
            let expected = compute::min_string_view(&array).zip(compute::max_string_view(&array));
            let bounds = string_view_bounds(&array);
            let bounds = bounds
                .as_ref()
                .map(|(low, high)| (low.as_ref(), high.as_ref()));
            assert_eq!(bounds, expected, "{case:?}");
        }
    }

    #[test]
    fn min_max_is_arrow_s_min_and_max() {
        use datafusion::arrow::array::Int64Array;
        let cases: Vec<Vec<Option<i64>>> = vec![
            vec![Some(3), Some(-7), Some(i64::MAX), Some(0)],
            vec![Some(5), None, Some(-1), None],
            vec![Some(i64::MIN)],
            vec![None, None],
            vec![],
        ];
        for case in cases {
            let array = Int64Array::from(case.clone());
            let expected = compute::min(&array).zip(compute::max(&array));
            assert_eq!(min_max(&array), expected, "{case:?}");
        }
    }

    #[test]
    fn metrics_of_a_dictionary_column_hold_every_value() {
        let keys = Int32Array::from(vec![Some(1), None, Some(1), Some(2)]);
        let values = StringArray::from(vec!["unused-a", "usd", "zar"]);
        let array: ArrayRef =
            Arc::new(DictionaryArray::<Int32Type>::try_new(keys, Arc::new(values)).unwrap());
        let mut metrics = ColumnMetrics::new();
        metrics.add(&array, &Type::Primitive(PrimitiveType::String));
        assert_eq!((metrics.values, metrics.nulls), (4, 1));
        // Bounds over the dictionary: looser than the rows' (an unused entry
        // widens them), never narrower.
        assert_eq!(metrics.lower, Some(Datum::string("unused-a")));
        assert_eq!(metrics.upper, Some(Datum::string("zar")));
    }
}
