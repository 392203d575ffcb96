//! `POST /downloads`: a structured query (columns, typed predicates, limit)
//! turned into a DataFusion plan of typed expressions once every name and
//! value is checked against the table. Neither callers nor the service
//! write SQL.

use chrono::{DateTime, NaiveDate, NaiveDateTime};
use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::{Column, ScalarValue, TableReference};
use datafusion::dataframe::DataFrame;
use datafusion::logical_expr::{Expr, lit};
use serde::Deserialize;
use serde_json::Value;

use super::{ApiError, AppState};

/// The body of `POST /downloads`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DownloadRequest {
    pub(crate) table: String,
    /// The catalog of `table`: one the token reaches (default: its first).
    #[serde(default)]
    pub(crate) catalog: Option<String>,
    #[serde(default)]
    pub(crate) columns: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) filter: Vec<Predicate>,
    #[serde(default)]
    pub(crate) limit: Option<u64>,
    #[serde(default)]
    pub(crate) ttl: Option<String>,
    /// Copy the files the rows' `FILE` columns reference into the
    /// download's own folder (`include_files`).
    #[serde(default)]
    pub(crate) include_files: bool,
}

/// One condition; all of them must hold.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Predicate {
    column: String,
    op: String,
    #[serde(default)]
    value: Option<Value>,
}

const OPERATORS: &str = "eq, ne, lt, le, gt, ge, in, is_null, not_null";
/// The most predicates one filter may hold.
pub(crate) const MAX_PREDICATES: usize = 100;
/// The most values one `in` predicate may list.
const MAX_IN_VALUES: usize = 1000;

/// `value` as a literal of the column's Arrow type `data_type`, exactly:
/// integers checked against the type's range, decimals parsed from their
/// digits (a JSON string, or a number of at most 15 significant digits,
/// which a double carries without loss), dates and timestamps parsed.
fn literal(column: &str, data_type: &DataType, value: &Value) -> Result<ScalarValue, ApiError> {
    let wrong = |want: &str| {
        ApiError::bad_request(format!(
            "filter on '{column}' ({data_type}) needs {want}, got {value}"
        ))
    };
    let out_of_range = |e: datafusion::error::DataFusionError| {
        ApiError::bad_request(format!(
            "filter on '{column}' ({data_type}): {value} does not fit the column: {e}"
        ))
    };
    match data_type {
        t if t.is_integer() => {
            let number = match (value.as_i64(), value.as_u64()) {
                (Some(n), _) => ScalarValue::Int64(Some(n)),
                (None, Some(n)) => ScalarValue::UInt64(Some(n)),
                _ => return Err(wrong("an integer")),
            };
            number.cast_to(data_type).map_err(out_of_range)
        }
        DataType::Float16 | DataType::Float32 | DataType::Float64 => value
            .as_f64()
            .map(|n| ScalarValue::Float64(Some(n)))
            .ok_or_else(|| wrong("a number"))?
            .cast_to(data_type)
            .map_err(out_of_range),
        DataType::Decimal128(precision, scale) => {
            let text = match value {
                Value::String(text) => text.trim().to_string(),
                Value::Number(n) if n.is_f64() => {
                    let text = n.to_string();
                    let digits = text.bytes().filter(u8::is_ascii_digit).count();
                    if digits > 15 {
                        return Err(wrong(
                            "a decimal: send one of more than 15 digits as a string, e.g. \"12345678901234567.89\"",
                        ));
                    }
                    text
                }
                Value::Number(n) => n.to_string(),
                _ => return Err(wrong("a decimal number (or a string of one)")),
            };
            let unscaled = decimal(&text, *precision, *scale).ok_or_else(|| {
                wrong(&format!(
                    "a decimal of at most {precision} digits, {scale} after the point"
                ))
            })?;
            Ok(ScalarValue::Decimal128(Some(unscaled), *precision, *scale))
        }
        DataType::Boolean => value
            .as_bool()
            .map(|b| ScalarValue::Boolean(Some(b)))
            .ok_or_else(|| wrong("true or false")),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => value
            .as_str()
            .map(|s| ScalarValue::Utf8(Some(s.to_string())))
            .ok_or_else(|| wrong("a string")),
        DataType::Date32 | DataType::Date64 => value
            .as_str()
            .and_then(|s| NaiveDate::parse_from_str(s, "%Y-%m-%d").ok())
            .map(|d| {
                let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).expect("the epoch");
                ScalarValue::Date32(Some((d - epoch).num_days() as i32))
            })
            .ok_or_else(|| wrong("a date like \"2026-07-01\""))?
            .cast_to(data_type)
            .map_err(out_of_range),
        DataType::Timestamp(unit, zone) => {
            let instant = value
                .as_str()
                .and_then(|s| {
                    DateTime::parse_from_rfc3339(s)
                        .map(|t| t.naive_utc())
                        .or_else(|_| NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S"))
                        .ok()
                })
                .ok_or_else(|| wrong("a timestamp like \"2026-07-01T12:00:00Z\""))?
                .and_utc();
            let zone = zone.clone();
            let micros = instant.timestamp_micros();
            Ok(match unit {
                TimeUnit::Second => ScalarValue::TimestampSecond(Some(instant.timestamp()), zone),
                TimeUnit::Millisecond => {
                    ScalarValue::TimestampMillisecond(Some(instant.timestamp_millis()), zone)
                }
                TimeUnit::Microsecond => ScalarValue::TimestampMicrosecond(Some(micros), zone),
                TimeUnit::Nanosecond => ScalarValue::TimestampNanosecond(
                    Some(
                        instant
                            .timestamp_nanos_opt()
                            .ok_or_else(|| wrong("a timestamp between the years 1677 and 2262"))?,
                    ),
                    zone,
                ),
            })
        }
        _ => Err(ApiError::bad_request(format!(
            "column '{column}' ({data_type}) cannot be filtered: filter on numbers, strings, booleans, dates or timestamps"
        ))),
    }
}

/// `text` (`-12.5`, `3`, `0.25`) as the unscaled value of a decimal with
/// `precision` digits, `scale` of them after the point; `None` when it is
/// not a plain decimal or does not fit.
fn decimal(text: &str, precision: u8, scale: i8) -> Option<i128> {
    let scale = usize::try_from(scale).ok()?;
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    let plain = |part: &str| part.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && fraction.is_empty()) || !plain(whole) || !plain(fraction) {
        return None;
    }
    let fraction = fraction.trim_end_matches('0');
    if fraction.len() > scale {
        return None;
    }
    let whole = whole.trim_start_matches('0');
    if whole.len() + scale > usize::from(precision) {
        return None;
    }
    let all = format!("{whole}{fraction:0<scale$}");
    let unscaled: i128 = if all.is_empty() { 0 } else { all.parse().ok()? };
    Some(if negative { -unscaled } else { unscaled })
}

/// The checked query of a download request, as a DataFusion `DataFrame`
/// built from typed expressions.
pub(crate) async fn download_query(
    state: &AppState,
    catalog: &str,
    (namespace, name): (&str, &str),
    request: &DownloadRequest,
) -> Result<DataFrame, ApiError> {
    let table = format!("{namespace}.{name}");
    let ctx = &state.0.ctx;
    let reference = TableReference::full(catalog, namespace, name);
    // One table's provider (information_schema would load every table of
    // every catalog); a missing table is a 404.
    let exists = match ctx.catalog(catalog).and_then(|c| c.schema(namespace)) {
        Some(schema) => schema
            .table(name)
            .await
            .map_err(|e| ApiError::from(crate::error::Error::from(e)))?
            .is_some(),
        None => false,
    };
    if !exists {
        return Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "not_found",
            format!("table '{table}' does not exist"),
        ));
    }
    let frame = ctx
        .table(reference)
        .await
        .map_err(|e| ApiError::from(crate::error::Error::from(e)))?;
    let schema = frame.schema().as_arrow().clone();
    let names = || {
        schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let type_of = |column: &str| {
        schema
            .field_with_name(column)
            .map(|f| f.data_type().clone())
            .map_err(|_| {
                ApiError::bad_request(format!(
                    "column '{column}' is not in table '{table}': its columns are {}",
                    names()
                ))
            })
    };
    // A column by its exact name (no identifier normalization).
    let column = |name: &str| Expr::Column(Column::from_name(name));
    if request.filter.len() > MAX_PREDICATES {
        return Err(ApiError::bad_request(format!(
            "filter holds {} predicates, more than the limit of {MAX_PREDICATES}: combine values \
             of one column with 'in', or download more and filter afterwards",
            request.filter.len()
        )));
    }
    let mut conditions = vec![];
    for predicate in &request.filter {
        let data_type = type_of(&predicate.column)?;
        let value = || {
            predicate.value.as_ref().ok_or_else(|| {
                ApiError::bad_request(format!(
                    "filter '{}' on '{}' needs a value",
                    predicate.op, predicate.column
                ))
            })
        };
        let target = column(&predicate.column);
        let one = |v: &Value| literal(&predicate.column, &data_type, v).map(lit);
        let condition = match predicate.op.as_str() {
            "eq" => target.eq(one(value()?)?),
            "ne" => target.not_eq(one(value()?)?),
            "lt" => target.lt(one(value()?)?),
            "le" => target.lt_eq(one(value()?)?),
            "gt" => target.gt(one(value()?)?),
            "ge" => target.gt_eq(one(value()?)?),
            "in" => {
                let items = value()?
                    .as_array()
                    .filter(|a| !a.is_empty() && a.len() <= MAX_IN_VALUES)
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "filter 'in' on '{}' needs an array of 1 to {MAX_IN_VALUES} values",
                            predicate.column
                        ))
                    })?;
                let list = items.iter().map(one).collect::<Result<Vec<_>, _>>()?;
                target.in_list(list, false)
            }
            "is_null" => target.is_null(),
            "not_null" => target.is_not_null(),
            other => {
                return Err(ApiError::bad_request(format!(
                    "'{other}' is not a filter operator: use one of {OPERATORS}"
                )));
            }
        };
        conditions.push(condition);
    }
    let planning =
        |e: datafusion::error::DataFusionError| ApiError::from(crate::error::Error::from(e));
    let mut frame = frame;
    if let Some(condition) = conditions.into_iter().reduce(Expr::and) {
        frame = frame.filter(condition).map_err(planning)?;
    }
    match &request.columns {
        None => {}
        Some(list) if list.is_empty() => {
            return Err(ApiError::bad_request(
                "columns, when given, names at least one column",
            ));
        }
        Some(list) => {
            let mut seen = std::collections::HashSet::new();
            for name in list {
                type_of(name)?;
                if !seen.insert(name) {
                    return Err(ApiError::bad_request(format!(
                        "column '{name}' is named twice in columns: name each column once"
                    )));
                }
            }
            frame = frame
                .select(list.iter().map(|name| column(name)).collect::<Vec<_>>())
                .map_err(planning)?;
        }
    }
    if let Some(limit) = request.limit {
        if limit == 0 || limit > 10_000_000 {
            return Err(ApiError::bad_request("limit is 1 to 10000000"));
        }
        frame = frame.limit(0, Some(limit as usize)).map_err(planning)?;
    }
    Ok(frame)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_are_exact() {
        assert_eq!(decimal("12.34", 10, 2), Some(1234));
        assert_eq!(decimal("-0.5", 10, 2), Some(-50));
        assert_eq!(decimal("7", 10, 2), Some(700));
        assert_eq!(decimal("1.230", 10, 2), Some(123));
        assert_eq!(
            decimal("12345678901234567.89", 38, 2),
            Some(1234567890123456789)
        );
        // more places than the scale, more digits than the precision
        assert_eq!(decimal("1.234", 10, 2), None);
        assert_eq!(decimal("123456789.1", 10, 2), None);
        assert_eq!(decimal("1e5", 10, 2), None);
        assert_eq!(decimal(".", 10, 2), None);
    }

    #[test]
    fn literals_take_the_column_type() {
        let v = |text: &str| serde_json::from_str::<Value>(text).unwrap();
        let decimal = DataType::Decimal128(12, 2);
        assert_eq!(
            literal("c", &decimal, &v("19.99")).unwrap(),
            ScalarValue::Decimal128(Some(1999), 12, 2)
        );
        assert_eq!(
            literal("c", &decimal, &v("\"1234567890.12\"")).unwrap(),
            ScalarValue::Decimal128(Some(123456789012), 12, 2)
        );
        assert!(literal("c", &DataType::Int32, &v("3000000000")).is_err());
        assert_eq!(
            literal("c", &DataType::Int32, &v("7")).unwrap(),
            ScalarValue::Int32(Some(7))
        );
        let ts = DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()));
        assert_eq!(
            literal("c", &ts, &v("\"1970-01-01T00:00:01Z\"")).unwrap(),
            ScalarValue::TimestampMicrosecond(Some(1_000_000), Some("+00:00".into()))
        );
        assert_eq!(
            literal("c", &DataType::Date32, &v("\"1970-01-11\"")).unwrap(),
            ScalarValue::Date32(Some(10))
        );
        assert!(literal("c", &DataType::Utf8, &v("5")).is_err());
    }
}
