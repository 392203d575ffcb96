//! `POST /downloads`: a structured query (columns, typed predicates, limit)
//! turned into SQL only after every name and value is checked against the
//! table. Callers never send SQL.

use chrono::{DateTime, NaiveDate, NaiveDateTime};
use serde::Deserialize;
use serde_json::Value;

use super::{ApiError, AppState};

/// The body of `POST /downloads`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DownloadRequest {
    pub(crate) table: String,
    #[serde(default)]
    pub(crate) columns: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) filter: Vec<Predicate>,
    #[serde(default)]
    pub(crate) limit: Option<u64>,
    #[serde(default)]
    pub(crate) ttl: Option<String>,
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

fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `value` as a SQL literal of the column's Arrow type `data_type`.
fn literal(column: &str, data_type: &str, value: &Value) -> Result<String, ApiError> {
    let wrong = |want: &str| {
        ApiError::bad_request(format!(
            "filter on '{column}' ({data_type}) needs {want}, got {value}"
        ))
    };
    let t = data_type.to_ascii_lowercase();
    if t.starts_with("int") || t.starts_with("uint") {
        value
            .as_i64()
            .map(|n| n.to_string())
            .ok_or_else(|| wrong("an integer"))
    } else if t.starts_with("float") || t.starts_with("decimal") {
        value
            .as_f64()
            .map(|n| n.to_string())
            .ok_or_else(|| wrong("a number"))
    } else if t == "boolean" {
        value
            .as_bool()
            .map(|b| if b { "TRUE" } else { "FALSE" }.to_string())
            .ok_or_else(|| wrong("true or false"))
    } else if t.contains("utf8") {
        value
            .as_str()
            .map(|s| format!("'{}'", s.replace('\'', "''")))
            .ok_or_else(|| wrong("a string"))
    } else if t.starts_with("date") {
        value
            .as_str()
            .filter(|s| NaiveDate::parse_from_str(s, "%Y-%m-%d").is_ok())
            .map(|s| format!("DATE '{s}'"))
            .ok_or_else(|| wrong("a date like \"2026-07-01\""))
    } else if t.starts_with("timestamp") {
        value
            .as_str()
            .filter(|s| {
                DateTime::parse_from_rfc3339(s).is_ok()
                    || NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S").is_ok()
            })
            .map(|s| format!("TIMESTAMP '{s}'"))
            .ok_or_else(|| wrong("a timestamp like \"2026-07-01T12:00:00Z\""))
    } else {
        Err(ApiError::bad_request(format!(
            "column '{column}' ({data_type}) cannot be filtered: filter on numbers, strings, booleans, dates or timestamps"
        )))
    }
}

/// The checked SQL query of a download request.
pub(crate) async fn download_sql(
    state: &AppState,
    table: &str,
    quoted: &str,
    request: &DownloadRequest,
) -> Result<String, ApiError> {
    // One table's schema, from its metadata (information_schema would load
    // every table of every catalog).
    let (namespace, name) = table
        .split_once('.')
        .expect("the caller checked it with table_name");
    let ctx = &state.0.ctx;
    let default_catalog = ctx.state().config_options().catalog.default_catalog.clone();
    let provider = match ctx
        .catalog(&default_catalog)
        .and_then(|c| c.schema(namespace))
    {
        Some(schema) => schema
            .table(name)
            .await
            .map_err(|e| ApiError::from(crate::error::Error::from(e)))?,
        None => None,
    };
    let Some(provider) = provider else {
        return Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "not_found",
            format!("table '{table}' does not exist"),
        ));
    };
    let columns: Vec<(String, String)> = provider
        .schema()
        .fields()
        .iter()
        .map(|f| (f.name().clone(), f.data_type().to_string()))
        .collect();
    let names = || {
        columns
            .iter()
            .map(|(n, _)| n.clone())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let type_of = |column: &str| {
        columns
            .iter()
            .find(|(n, _)| n == column)
            .map(|(_, t)| t.clone())
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "column '{column}' is not in table '{table}': its columns are {}",
                    names()
                ))
            })
    };
    let selected = match &request.columns {
        None => "*".to_string(),
        Some(list) if list.is_empty() => {
            return Err(ApiError::bad_request(
                "columns, when given, names at least one column",
            ));
        }
        Some(list) => {
            let mut seen = std::collections::HashSet::new();
            for column in list {
                type_of(column)?;
                if !seen.insert(column) {
                    return Err(ApiError::bad_request(format!(
                        "column '{column}' is named twice in columns: name each column once"
                    )));
                }
            }
            list.iter().map(|c| ident(c)).collect::<Vec<_>>().join(", ")
        }
    };
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
        let column = ident(&predicate.column);
        let value = || {
            predicate.value.as_ref().ok_or_else(|| {
                ApiError::bad_request(format!(
                    "filter '{}' on '{}' needs a value",
                    predicate.op, predicate.column
                ))
            })
        };
        let condition = match predicate.op.as_str() {
            op @ ("eq" | "ne" | "lt" | "le" | "gt" | "ge") => {
                let sql_op = match op {
                    "eq" => "=",
                    "ne" => "<>",
                    "lt" => "<",
                    "le" => "<=",
                    "gt" => ">",
                    _ => ">=",
                };
                format!(
                    "{column} {sql_op} {}",
                    literal(&predicate.column, &data_type, value()?)?
                )
            }
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
                let literals = items
                    .iter()
                    .map(|v| literal(&predicate.column, &data_type, v))
                    .collect::<Result<Vec<_>, _>>()?;
                format!("{column} IN ({})", literals.join(", "))
            }
            "is_null" => format!("{column} IS NULL"),
            "not_null" => format!("{column} IS NOT NULL"),
            other => {
                return Err(ApiError::bad_request(format!(
                    "'{other}' is not a filter operator: use one of {OPERATORS}"
                )));
            }
        };
        conditions.push(condition);
    }
    let mut sql = format!("SELECT {selected} FROM {quoted}");
    if !conditions.is_empty() {
        sql.push_str(&format!(" WHERE {}", conditions.join(" AND ")));
    }
    if let Some(limit) = request.limit {
        if limit == 0 || limit > 10_000_000 {
            return Err(ApiError::bad_request("limit is 1 to 10000000"));
        }
        sql.push_str(&format!(" LIMIT {limit}"));
    }
    Ok(sql)
}
