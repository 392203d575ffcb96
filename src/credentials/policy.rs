//! The session policies that scope vended credentials to one table.
//!
//! STS intersects the role's own permissions with the session policy passed
//! to `AssumeRole`, so these documents are the upper bound of what the
//! credentials can do. Their packed form must fit STS's limit.

use serde_json::{Value, json};

use crate::error::{Error, Result};

/// What vended credentials may do with their table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessMode {
    /// Read the table and append to it (an upload's staging table).
    Write,
    /// Read the table only (a download table).
    Read,
}

crate::rows::named_column!(AccessMode);

impl std::fmt::Display for AccessMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl AccessMode {
    /// Parses `write` / `read`.
    pub fn parse(text: &str) -> Result<Self> {
        match text.to_ascii_lowercase().as_str() {
            "write" | "readwrite" | "read_write" => Ok(Self::Write),
            "read" | "readonly" | "read_only" => Ok(Self::Read),
            other => Err(Error::invalid(format!(
                "'{other}' is not a credential mode: use 'write' (append to a staging table) or 'read'"
            ))),
        }
    }

    /// The mode's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Write => "write",
            Self::Read => "read",
        }
    }
}

/// STS's limit on a session policy's plain-text size, in characters.
pub const MAX_POLICY_CHARS: usize = 2048;

/// The S3 Tables session policy for one table: the actions of `mode` on the
/// table bucket and its tables, narrowed by the `s3tables:namespace` and
/// `s3tables:tableName` condition keys to the one table.
pub fn s3tables_policy(bucket_arn: &str, namespace: &str, table: &str, mode: AccessMode) -> Value {
    let actions: &[&str] = match mode {
        AccessMode::Write => &[
            "s3tables:GetTable",
            "s3tables:GetTableMetadataLocation",
            "s3tables:UpdateTableMetadataLocation",
            "s3tables:GetTableData",
            "s3tables:PutTableData",
        ],
        AccessMode::Read => &[
            "s3tables:GetTable",
            "s3tables:GetTableMetadataLocation",
            "s3tables:GetTableData",
        ],
    };
    json!({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Action": actions,
            "Resource": [bucket_arn, format!("{bucket_arn}/table/*")],
            "Condition": {"StringEquals": {
                "s3tables:namespace": namespace,
                "s3tables:tableName": table,
            }},
        }],
    })
}

/// The S3 session policy for one table stored under `s3://bucket/prefix`:
/// reading objects under the prefix and listing that prefix; in `Write`
/// mode also putting data files (`data/`), the files rows reference
/// (`files/`) and the manifests and manifest lists a writer adds
/// (`metadata/*.avro`). The table's metadata JSON files
/// are the catalog's alone: vended keys never write one.
pub fn s3_prefix_policy(bucket: &str, prefix: &str, mode: AccessMode) -> Value {
    let prefix = prefix.trim_matches('/');
    let mut statements = vec![
        json!({
            "Effect": "Allow",
            "Action": ["s3:GetObject"],
            "Resource": [format!("arn:aws:s3:::{bucket}/{prefix}/*")],
        }),
        json!({
            "Effect": "Allow",
            "Action": ["s3:ListBucket"],
            "Resource": [format!("arn:aws:s3:::{bucket}")],
            "Condition": {"StringLike": {"s3:prefix": [prefix, format!("{prefix}/*")]}},
        }),
    ];
    if mode == AccessMode::Write {
        statements.push(json!({
            "Effect": "Allow",
            "Action": ["s3:PutObject"],
            "Resource": [
                format!("arn:aws:s3:::{bucket}/{prefix}/data/*"),
                format!("arn:aws:s3:::{bucket}/{prefix}/files/*"),
                format!("arn:aws:s3:::{bucket}/{prefix}/metadata/*.avro"),
            ],
        }));
    }
    json!({
        "Version": "2012-10-17",
        "Statement": statements,
    })
}

/// The policy as STS receives it: compact JSON, checked against the limit.
pub fn pack(policy: &Value) -> Result<String> {
    let packed = policy.to_string();
    if packed.len() > MAX_POLICY_CHARS {
        return Err(Error::invalid(format!(
            "the session policy has {} characters, more than STS's limit of {MAX_POLICY_CHARS}: \
             shorten the bucket, namespace or table names",
            packed.len()
        )));
    }
    Ok(packed)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUCKET: &str = "arn:aws:s3tables:us-east-1:123456789012:bucket/my-table";

    #[test]
    fn write_policy_golden() {
        let policy = s3tables_policy(
            BUCKET,
            "staging",
            "upload_0123456789abcdef0123456789abcdef",
            AccessMode::Write,
        );
        assert_eq!(
            serde_json::to_string_pretty(&policy).unwrap(),
            r#"{
  "Statement": [
    {
      "Action": [
        "s3tables:GetTable",
        "s3tables:GetTableMetadataLocation",
        "s3tables:UpdateTableMetadataLocation",
        "s3tables:GetTableData",
        "s3tables:PutTableData"
      ],
      "Condition": {
        "StringEquals": {
          "s3tables:namespace": "staging",
          "s3tables:tableName": "upload_0123456789abcdef0123456789abcdef"
        }
      },
      "Effect": "Allow",
      "Resource": [
        "arn:aws:s3tables:us-east-1:123456789012:bucket/my-table",
        "arn:aws:s3tables:us-east-1:123456789012:bucket/my-table/table/*"
      ]
    }
  ],
  "Version": "2012-10-17"
}"#
        );
    }

    #[test]
    fn read_policy_golden() {
        let policy = s3tables_policy(
            BUCKET,
            "downloads",
            "download_0123456789abcdef0123456789abcdef",
            AccessMode::Read,
        );
        assert_eq!(
            policy.to_string(),
            r#"{"Statement":[{"Action":["s3tables:GetTable","s3tables:GetTableMetadataLocation","s3tables:GetTableData"],"Condition":{"StringEquals":{"s3tables:namespace":"downloads","s3tables:tableName":"download_0123456789abcdef0123456789abcdef"}},"Effect":"Allow","Resource":["arn:aws:s3tables:us-east-1:123456789012:bucket/my-table","arn:aws:s3tables:us-east-1:123456789012:bucket/my-table/table/*"]}],"Version":"2012-10-17"}"#
        );
        let text = policy.to_string();
        assert!(!text.contains("PutTableData") && !text.contains("UpdateTableMetadataLocation"));
    }

    #[test]
    fn s3_prefix_policy_golden() {
        let policy = s3_prefix_policy("lake", "/warehouse/staging/upload_1/", AccessMode::Write);
        assert_eq!(
            policy.to_string(),
            r#"{"Statement":[{"Action":["s3:GetObject"],"Effect":"Allow","Resource":["arn:aws:s3:::lake/warehouse/staging/upload_1/*"]},{"Action":["s3:ListBucket"],"Condition":{"StringLike":{"s3:prefix":["warehouse/staging/upload_1","warehouse/staging/upload_1/*"]}},"Effect":"Allow","Resource":["arn:aws:s3:::lake"]},{"Action":["s3:PutObject"],"Effect":"Allow","Resource":["arn:aws:s3:::lake/warehouse/staging/upload_1/data/*","arn:aws:s3:::lake/warehouse/staging/upload_1/files/*","arn:aws:s3:::lake/warehouse/staging/upload_1/metadata/*.avro"]}],"Version":"2012-10-17"}"#
        );
        // No write reaches a metadata JSON file, and read keys write nothing.
        let text = policy.to_string();
        assert!(!text.contains("upload_1/metadata/*\"") && !text.contains("upload_1/*\",\"arn"));
        let read = s3_prefix_policy("lake", "warehouse/staging/upload_1", AccessMode::Read);
        assert!(!read.to_string().contains("PutObject"));
    }

    /// The longest names icestage produces, in the longest ARN AWS allows:
    /// a 10-character partition, a 14-character region, a 63-character table
    /// bucket, namespace `downloads` and table `download_<32 hex>`.
    #[test]
    fn the_longest_policy_fits_sts() {
        let bucket = format!(
            "arn:aws-us-gov:s3tables:ap-southeast-5:123456789012:bucket/{}",
            "b".repeat(63)
        );
        for (namespace, table) in [
            ("staging", format!("upload_{}", "f".repeat(32))),
            ("downloads", format!("download_{}", "f".repeat(32))),
        ] {
            for mode in [AccessMode::Write, AccessMode::Read] {
                let packed = pack(&s3tables_policy(&bucket, namespace, &table, mode)).unwrap();
                assert!(
                    packed.len() < MAX_POLICY_CHARS,
                    "{} characters",
                    packed.len()
                );
            }
        }
        let prefix = format!("{}/staging/upload_{}", "p".repeat(900), "f".repeat(32));
        let err = pack(&s3_prefix_policy(
            &"b".repeat(63),
            &prefix,
            AccessMode::Write,
        ))
        .unwrap_err();
        assert!(
            err.to_string().contains("more than STS's limit of 2048"),
            "{err}"
        );
    }
}
