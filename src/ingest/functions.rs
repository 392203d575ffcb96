//! The prefix table functions, planned by a `RelationPlanner` so that their
//! named arguments (`format => 'csv'`) reach them: DataFusion 53 plans
//! table-function arguments in a way that drops a named argument silently.
//!
//! * `read_s3_prefix(uri, ...)`: the files under a prefix, as a table;
//! * `infer_s3_schema(uri, ...)`: their columns, Arrow and shared types;
//! * `list_s3(uri, ...)`: buckets, prefixes and files a credential set sees;
//! * `cross_account_setup(uri, reader_account => ..., external_id => ...)`:
//!   the policies a data owner applies so icestage can read one prefix.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::MemTable;
use datafusion::datasource::provider_as_source;
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::LogicalPlanBuilder;
use datafusion::logical_expr::planner::{
    PlannedRelation, RelationPlanner, RelationPlannerContext, RelationPlanning,
};
use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, FunctionArg, FunctionArgExpr, TableFactor, Value as SqlValue,
};
use object_store::path::Path as ObjectPath;
use serde_json::json;

use super::by_file;
use super::options::{AWS_OPTIONS, READ_OPTIONS, SourceOptions};
use super::read::{PrefixTable, Source, vocabulary};
use super::source::{Access, Location};
use crate::catalog::block_on;
use crate::config::{OptionSyntax, keys};
use crate::error::{Error, Result};
use crate::rows::timestamp_type;
use crate::rows::{Value, batch};

/// Plans icestage's prefix functions; see the module documentation.
#[derive(Debug, Default)]
pub(crate) struct PrefixRelationPlanner;

const FUNCTIONS: &[&str] = &[
    "read_s3_prefix",
    "infer_s3_schema",
    "list_s3",
    "cross_account_setup",
];

/// A literal argument as text (arrays of literals join with commas).
fn literal(function: &str, expr: &SqlExpr) -> Result<String> {
    let scalar = |v: &SqlValue| match v {
        SqlValue::SingleQuotedString(s) | SqlValue::DoubleQuotedString(s) => Some(s.clone()),
        SqlValue::Number(n, _) => Some(n.clone()),
        SqlValue::Boolean(b) => Some(b.to_string()),
        _ => None,
    };
    match expr {
        SqlExpr::Value(v) => scalar(&v.value),
        SqlExpr::Array(array) => array
            .elem
            .iter()
            .map(|e| match e {
                SqlExpr::Value(v) => scalar(&v.value),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .map(|items| items.join(",")),
        _ => None,
    }
    .ok_or_else(|| {
        Error::invalid(format!(
            "{function} takes literal arguments (a string, number, boolean or array of strings), not '{expr}'"
        ))
    })
}

/// Named arguments, `name => value`.
type Named = Vec<(String, String)>;

/// Positional and named arguments of a call.
fn arguments(function: &str, args: &[FunctionArg]) -> Result<(Vec<String>, Named)> {
    let mut positional = vec![];
    let mut named = vec![];
    for arg in args {
        match arg {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(expr)) => {
                if !named.is_empty() {
                    return Err(Error::invalid(format!(
                        "{function}: positional arguments come before named ones"
                    )));
                }
                positional.push(literal(function, expr)?);
            }
            FunctionArg::Named {
                name,
                arg: FunctionArgExpr::Expr(expr),
                ..
            } => named.push((name.value.to_ascii_lowercase(), literal(function, expr)?)),
            FunctionArg::ExprNamed {
                name: SqlExpr::Identifier(name),
                arg: FunctionArgExpr::Expr(expr),
                ..
            } => named.push((name.value.to_ascii_lowercase(), literal(function, expr)?)),
            other => {
                return Err(Error::invalid(format!(
                    "{function}: unsupported argument '{other}'"
                )));
            }
        }
    }
    Ok((positional, named))
}

fn usage(function: &str) -> &'static str {
    match function {
        "read_s3_prefix" => {
            "read_s3_prefix('s3://bucket/prefix/' [, format => 'csv'] [, files => 'a.csv,b.csv' | all_files => true] \
             [, header => true, delimiter => ','] [, schema => 'id BIGINT, ...'] [, region => ..., endpoint => ..., \
             access_key_id => ..., secret_access_key => ..., role_arn => ..., external_id => ...])"
        }
        "infer_s3_schema" => {
            "infer_s3_schema('s3://bucket/prefix/' [, the options of read_s3_prefix])"
        }
        "list_s3" => {
            "list_s3('s3://' | 's3://bucket/prefix/' [, region => ..., endpoint => ..., credentials...])"
        }
        _ => {
            "cross_account_setup('s3://bucket/prefix/', reader_account => '<12 digits>', external_id => '<id>' \
             [, owner_account => '<12 digits>'] [, role_name => 'icestage-reader'])"
        }
    }
}

impl RelationPlanner for PrefixRelationPlanner {
    fn plan_relation(
        &self,
        relation: TableFactor,
        _context: &mut dyn RelationPlannerContext,
    ) -> DFResult<RelationPlanning> {
        let TableFactor::Table {
            name,
            alias,
            args: Some(args),
            ..
        } = &relation
        else {
            return Ok(RelationPlanning::Original(Box::new(relation)));
        };
        let function = name.to_string().to_ascii_lowercase();
        if !FUNCTIONS.contains(&function.as_str()) {
            return Ok(RelationPlanning::Original(Box::new(relation)));
        }
        let (positional, named) = arguments(&function, &args.args)?;
        let [uri] = positional.as_slice() else {
            return Err(Error::invalid(format!(
                "{function} takes the URI as its one positional argument: {}",
                usage(&function)
            ))
            .into());
        };
        // The reading options, as the functions that read files take them.
        let reading = || {
            SourceOptions::from_pairs(
                &function,
                OptionSyntax::Arguments,
                &named,
                &keys(READ_OPTIONS),
            )
        };
        let provider: Arc<dyn datafusion::catalog::TableProvider> = match function.as_str() {
            "read_s3_prefix" => {
                let options = reading()?;
                if by_file::wanted(&options) {
                    Arc::new(block_on(by_file::table(uri, &options))?)
                } else {
                    let source = block_on(Source::open(uri, &options))?;
                    Arc::new(PrefixTable::new(Arc::new(source)))
                }
            }
            "infer_s3_schema" => {
                let options = reading()?;
                Arc::new(block_on(infer_schema(uri, &options))?)
            }
            "list_s3" => {
                let options = SourceOptions::from_pairs(
                    &function,
                    OptionSyntax::Arguments,
                    &named,
                    AWS_OPTIONS,
                )?;
                Arc::new(block_on(list(uri, &options))?)
            }
            _ => Arc::new(cross_account_setup(uri, &named)?),
        };
        let plan = LogicalPlanBuilder::scan(function.as_str(), provider_as_source(provider), None)?
            .build()?;
        Ok(RelationPlanning::Planned(Box::new(PlannedRelation::new(
            plan,
            alias.clone(),
        ))))
    }
}

fn memory_table(schema: SchemaRef, rows: &[Vec<Value>]) -> Result<MemTable> {
    let batch = batch(Arc::clone(&schema), rows)?;
    Ok(MemTable::try_new(schema, vec![vec![batch]])?)
}

fn text(name: &str, nullable: bool) -> Field {
    Field::new(name, DataType::Utf8, nullable)
}

fn int(name: &str) -> Field {
    Field::new(name, DataType::Int64, true)
}

async fn infer_schema(uri: &str, options: &SourceOptions) -> Result<MemTable> {
    let source = Source::open(uri, options).await?;
    let schema = Arc::new(Schema::new(vec![
        text("column_name", false),
        text("data_type", false),
        text("type", false),
        Field::new("nullable", DataType::Utf8, false),
        text("format", false),
        int("files"),
        int("bytes_read"),
        int("total_bytes"),
    ]));
    let rows: Vec<Vec<Value>> = source
        .schema
        .fields()
        .iter()
        .map(|field| {
            vec![
                Value::from(field.name().clone()),
                Value::from(field.data_type().to_string()),
                Value::from(vocabulary(field.data_type())),
                Value::from(if field.is_nullable() { "YES" } else { "NO" }),
                Value::from(source.format.to_string()),
                Value::from(source.files.len() as i64),
                Value::from(source.schema_bytes as i64),
                Value::from(source.total_bytes as i64),
            ]
        })
        .collect();
    memory_table(schema, &rows)
}

async fn list(uri: &str, options: &SourceOptions) -> Result<MemTable> {
    let access = Access::open(uri, options).await?;
    let schema = Arc::new(Schema::new(vec![
        text("kind", false),
        text("uri", false),
        int("size"),
        Field::new("last_modified", timestamp_type(), true),
    ]));
    let mut rows = vec![];
    match &access.location {
        Location::S3 { bucket, .. } if bucket.is_empty() => {
            let sdk = access.sdk.clone().expect("S3 access has an SDK config");
            let buckets = super::source::list_buckets(&sdk, options.s3_endpoint().as_deref())
                .await
                .map_err(|e| {
                    Error::invalid(format!(
                        "listing buckets as {} failed: {e}; grant s3:ListAllMyBuckets, or list one bucket with list_s3('s3://bucket/')",
                        access.identity
                    ))
                })?;
            for (name, created) in buckets {
                rows.push(vec![
                    Value::from("bucket"),
                    Value::from(format!("s3://{name}/")),
                    Value::Int(None),
                    Value::from(created),
                ]);
            }
        }
        location => {
            let prefix = match location {
                Location::S3 { prefix, .. } => ObjectPath::from(prefix.trim_end_matches('/')),
                Location::Local { path } => ObjectPath::from_absolute_path(path)
                    .map_err(|e| Error::invalid(e.to_string()))?,
            };
            let listed = access
                .store
                .list_with_delimiter(Some(&prefix))
                .await
                .map_err(|e| access.storage_error(e))?;
            for common in &listed.common_prefixes {
                rows.push(vec![
                    Value::from("prefix"),
                    Value::from(format!("{}/", access.uri_of(common))),
                    Value::Int(None),
                    Value::Time(None),
                ]);
            }
            for object in &listed.objects {
                rows.push(vec![
                    Value::from("file"),
                    Value::from(access.uri_of(&object.location)),
                    Value::from(object.size as i64),
                    Value::from(Some(object.last_modified)),
                ]);
            }
        }
    }
    memory_table(schema, &rows)
}

/// The policies that let a reader account assume a role in the data owner's
/// account (with an external id) and read one bucket prefix.
fn cross_account_setup(uri: &str, named: &[(String, String)]) -> Result<MemTable> {
    let function = "cross_account_setup";
    let mut reader = None;
    let mut external_id = None;
    let mut owner = "<owner account id>".to_string();
    let mut role = "icestage-reader".to_string();
    for (name, value) in named {
        match name.as_str() {
            "reader_account" => reader = Some(value.clone()),
            "external_id" => external_id = Some(value.clone()),
            "owner_account" => owner = value.clone(),
            "role_name" => role = value.clone(),
            other => {
                return Err(Error::invalid(format!(
                    "{function} has no option '{other}': valid options are reader_account, external_id, owner_account, role_name"
                )));
            }
        }
    }
    let (Some(reader), Some(external_id)) = (reader, external_id) else {
        return Err(Error::invalid(format!(
            "{function} needs reader_account and external_id: {}",
            usage(function)
        )));
    };
    if reader.len() != 12 || !reader.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Error::invalid(format!(
            "reader_account '{reader}' is not an AWS account id: it is 12 digits"
        )));
    }
    let Location::S3 { bucket, prefix } = Location::parse(uri)? else {
        return Err(Error::invalid(format!(
            "{function} sets up an s3:// prefix, not '{uri}'"
        )));
    };
    if bucket.is_empty() {
        return Err(Error::invalid(format!(
            "{function} needs a bucket: s3://bucket/prefix/"
        )));
    }
    let prefix = prefix.trim_end_matches('/');
    let objects = if prefix.is_empty() {
        format!("arn:aws:s3:::{bucket}/*")
    } else {
        format!("arn:aws:s3:::{bucket}/{prefix}/*")
    };
    let listing = if prefix.is_empty() {
        json!({"Effect": "Allow", "Action": "s3:ListBucket", "Resource": format!("arn:aws:s3:::{bucket}")})
    } else {
        json!({"Effect": "Allow", "Action": "s3:ListBucket", "Resource": format!("arn:aws:s3:::{bucket}"),
               "Condition": {"StringLike": {"s3:prefix": [prefix, format!("{prefix}/*")]}}})
    };
    let role_arn = format!("arn:aws:iam::{owner}:role/{role}");
    let documents = [
        (
            "trust_policy",
            format!("trust policy of role {role} in the owner's account: who may assume it"),
            json!({"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow",
                "Principal": {"AWS": format!("arn:aws:iam::{reader}:root")},
                "Action": "sts:AssumeRole",
                "Condition": {"StringEquals": {"sts:ExternalId": external_id}}}]}),
        ),
        (
            "role_policy",
            format!("permissions policy of role {role}: read the prefix only"),
            json!({"Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Action": "s3:GetObject", "Resource": objects},
                listing]}),
        ),
        (
            "bucket_policy",
            format!("bucket policy of {bucket}: let the role read the prefix"),
            json!({"Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Principal": {"AWS": role_arn}, "Action": "s3:GetObject", "Resource": objects},
                {"Effect": "Allow", "Principal": {"AWS": role_arn}, "Action": "s3:ListBucket",
                 "Resource": format!("arn:aws:s3:::{bucket}")}]}),
        ),
        (
            "icestage_options",
            "what to pass to read_s3_prefix / COPY INTO".to_string(),
            json!({"role_arn": role_arn, "external_id": external_id}),
        ),
    ];
    let schema = Arc::new(Schema::new(vec![
        text("document", false),
        text("purpose", false),
        text("json", false),
    ]));
    let rows: Vec<Vec<Value>> = documents
        .iter()
        .map(|(name, purpose, document)| {
            vec![
                Value::from(*name),
                Value::from(purpose.clone()),
                Value::from(serde_json::to_string_pretty(document).unwrap_or_default()),
            ]
        })
        .collect();
    memory_table(schema, &rows)
}
