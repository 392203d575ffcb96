//! Options of the prefix functions and `COPY INTO`, and the file formats
//! and compressions a file name announces.

use std::fmt;

use crate::config::{self, OptionDoc, OptionSyntax, WithOptions, keys};
use crate::error::{Error, Result};
use crate::secret::Secret;

/// A file format icestage reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Format {
    /// Comma (or other) separated values.
    Csv,
    /// Apache Parquet.
    Parquet,
    /// Newline-delimited JSON.
    Json,
    /// Apache Avro.
    Avro,
}

impl Format {
    pub(crate) fn parse(text: &str) -> Result<Self> {
        match text.to_ascii_lowercase().as_str() {
            "csv" | "tsv" => Ok(Self::Csv),
            "parquet" => Ok(Self::Parquet),
            "json" | "ndjson" | "jsonl" => Ok(Self::Json),
            "avro" => Ok(Self::Avro),
            other => Err(Error::invalid(format!(
                "'{other}' is not a file format icestage reads: use csv, parquet, json (newline-delimited) or avro"
            ))),
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Csv => "csv",
            Self::Parquet => "parquet",
            Self::Json => "json",
            Self::Avro => "avro",
        })
    }
}

/// A whole-file compression, announced by the file name's last suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compression {
    /// None.
    None,
    /// `.gz`
    Gzip,
    /// `.bz2`
    Bzip2,
    /// `.xz`
    Xz,
    /// `.zst`
    Zstd,
    /// `.snappy` (framed or Hadoop block format)
    Snappy,
}

/// What a file name says about its content: format (if known) and compression.
pub(crate) fn classify(name: &str) -> (Option<Format>, Compression) {
    let lower = name.to_ascii_lowercase();
    let (stem, compression) = [
        (".gz", Compression::Gzip),
        (".gzip", Compression::Gzip),
        (".bz2", Compression::Bzip2),
        (".xz", Compression::Xz),
        (".zst", Compression::Zstd),
        (".zstd", Compression::Zstd),
        (".snappy", Compression::Snappy),
        (".sz", Compression::Snappy),
    ]
    .iter()
    .find_map(|(suffix, c)| {
        lower
            .strip_suffix(suffix)
            .map(|stem| (stem.to_string(), *c))
    })
    .unwrap_or((lower.clone(), Compression::None));
    let format = stem.rsplit_once('.').and_then(|(_, ext)| match ext {
        "csv" | "tsv" | "txt" => Some(Format::Csv),
        "parquet" | "pq" => Some(Format::Parquet),
        "json" | "jsonl" | "ndjson" => Some(Format::Json),
        "avro" => Some(Format::Avro),
        _ => None,
    });
    (format, compression)
}

/// Options of `read_s3_prefix`, `infer_s3_schema`, `list_s3` and `COPY INTO`.
#[derive(Debug, Clone, Default)]
pub struct SourceOptions {
    /// The file format; inferred from file names when they agree.
    pub format: Option<Format>,
    /// Keys (relative to the prefix, or full) to read; pins the selection.
    pub files: Vec<String>,
    /// Read every file under the prefix.
    pub all_files: bool,
    /// CSV: the first line holds column names (default true).
    pub header: Option<bool>,
    /// CSV: the field delimiter (default `,`, or tab for `.tsv`).
    pub delimiter: Option<u8>,
    /// The columns, as SQL (`id BIGINT, name VARCHAR`), instead of inferring.
    pub schema: Option<String>,
    /// AWS region.
    pub region: Option<String>,
    /// S3 endpoint (an emulator, or another S3-compatible store).
    pub endpoint: Option<String>,
    /// STS endpoint for `role_arn`; defaults to `endpoint` when that is set.
    pub sts_endpoint: Option<String>,
    /// Explicit access key id.
    pub access_key_id: Option<String>,
    /// Explicit secret access key.
    pub secret_access_key: Option<Secret>,
    /// Explicit session token.
    pub session_token: Option<Secret>,
    /// Role to assume (cross-account).
    pub role_arn: Option<String>,
    /// External id to pass when assuming `role_arn`.
    pub external_id: Option<String>,
    /// `COPY INTO`: load every selected file again, even those loaded before.
    pub force: bool,
    /// `COPY INTO`: what a file that cannot be loaded does to the others.
    pub on_error: OnError,
    /// How the files' columns meet the target's (`match_by_column_name`);
    /// `None` for the default: by position for CSV without a header, else
    /// by name.
    pub match_by_column_name: Option<MatchByName>,
    /// `COPY INTO`: what a column the target lacks does.
    pub schema_evolution: SchemaEvolution,
    /// `COPY INTO`: check the files and answer what a run would do,
    /// committing nothing.
    pub validation_mode: Option<ValidationMode>,
    /// Only keys (relative to the prefix) matching this are candidates.
    pub pattern: Option<Pattern>,
    /// `read_s3_prefix`: read each file with its own columns and put them
    /// together by name (`COPY INTO` always matches each file by name).
    pub union_by_name: bool,
    /// `key=value` path segments under the prefix become columns.
    pub hive_partitioning: bool,
    /// `COPY INTO`: add `_file`, `_row` and `_file_modified` columns.
    pub include_metadata: bool,
    /// `COPY INTO`: delete the files this copy loaded, after its commit.
    pub purge: bool,
}

/// A regular expression over keys (option `pattern`).
#[derive(Debug, Clone)]
pub struct Pattern(regex::Regex);

impl Pattern {
    fn parse(text: &str) -> Result<Self> {
        regex::RegexBuilder::new(text)
            .size_limit(1 << 20)
            .build()
            .map(Self)
            .map_err(|e| {
                Error::invalid(format!(
                    "pattern = '{text}' is not a regular expression ({}): write one that matches \
                     keys relative to the prefix, e.g. '.*[.]csv' or 'orders/.*'",
                    e.to_string().lines().last().unwrap_or_default().trim()
                ))
            })
    }

    /// Whether `key` (relative to the prefix) is a candidate: the whole key
    /// matches, as Snowflake's `PATTERN` does.
    pub(crate) fn matches(&self, key: &str) -> bool {
        self.0
            .find(key)
            .is_some_and(|m| m.start() == 0 && m.end() == key.len())
    }

    /// The expression as written.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

/// How the columns of a file are matched to the target's (option
/// `match_by_column_name`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchByName {
    /// Names must be equal.
    CaseSensitive,
    /// Names are equal ignoring ASCII case.
    CaseInsensitive,
    /// By position: the file's n-th column is the target's n-th.
    None,
}

impl MatchByName {
    fn parse(text: &str) -> Result<Self> {
        match text.to_ascii_lowercase().as_str() {
            "case_sensitive" => Ok(Self::CaseSensitive),
            "case_insensitive" => Ok(Self::CaseInsensitive),
            "none" => Ok(Self::None),
            other => Err(Error::invalid(format!(
                "match_by_column_name = '{other}' is not a choice: use 'case_sensitive', \
                 'case_insensitive' or 'none' (by position)"
            ))),
        }
    }
}

/// What `COPY INTO` does with a column the target lacks (option
/// `schema_evolution`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SchemaEvolution {
    /// The file fails, naming the column.
    #[default]
    Fail,
    /// The column is added to the target (optional, a new field id), in
    /// the commit that lands the rows; narrower target types are widened.
    AddColumns,
    /// Values of unknown columns, and values that do not parse as their
    /// column's type, go to a `_rescued_data` column (a JSON object).
    Rescue,
}

impl SchemaEvolution {
    fn parse(text: &str) -> Result<Self> {
        match text.to_ascii_lowercase().as_str() {
            "fail" => Ok(Self::Fail),
            "add_columns" => Ok(Self::AddColumns),
            "rescue" => Ok(Self::Rescue),
            other => Err(Error::invalid(format!(
                "schema_evolution = '{other}' is not a choice: use 'fail' (a new column fails the \
                 file), 'add_columns' (add it to the table) or 'rescue' (keep its values in \
                 _rescued_data)"
            ))),
        }
    }
}

/// What a `COPY INTO` with `validation_mode` answers instead of loading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValidationMode {
    /// One row per error: file, line, column, error, raw record.
    ReturnErrors,
    /// The first n rows as they would load.
    ReturnRows(usize),
}

/// The most rows `validation_mode = 'return_<n>_rows'` answers.
const MAX_RETURNED_ROWS: usize = 100_000;

impl ValidationMode {
    fn parse(text: &str) -> Result<Self> {
        let lower = text.to_ascii_lowercase();
        if lower == "return_errors" {
            return Ok(Self::ReturnErrors);
        }
        match lower
            .strip_prefix("return_")
            .and_then(|rest| rest.strip_suffix("_rows"))
            .map(str::parse::<usize>)
        {
            Some(Ok(n)) if (1..=MAX_RETURNED_ROWS).contains(&n) => Ok(Self::ReturnRows(n)),
            _ => Err(Error::invalid(format!(
                "validation_mode = '{text}' is not a choice: use 'return_errors' or \
                 'return_<n>_rows' with n from 1 to {MAX_RETURNED_ROWS}, e.g. 'return_10_rows'"
            ))),
        }
    }
}

/// What `COPY INTO` does when one file cannot be read or does not fit the
/// table (option `on_error`, as Snowflake's `COPY INTO` spells it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnError {
    /// Nothing is loaded; the statement fails with the file's error
    /// (`abort_statement`, the default).
    #[default]
    AbortStatement,
    /// The file is left out and reported; the others are loaded
    /// (`skip_file`, what a pipe does by default).
    SkipFile,
    /// Malformed rows are rejected one by one and recorded (see
    /// `copy_rejects`); the rest of each file loads (`continue`).
    Continue,
}

impl OnError {
    fn parse(text: &str) -> Result<Self> {
        match text.to_ascii_lowercase().as_str() {
            "abort_statement" | "abort" => Ok(Self::AbortStatement),
            "skip_file" => Ok(Self::SkipFile),
            "continue" => Ok(Self::Continue),
            other => Err(Error::invalid(format!(
                "on_error = '{other}' is not a choice: use 'abort_statement' (load nothing when a file fails), \
                 'skip_file' (load the other files and report the failed ones) or 'continue' (load \
                 every good row, record the malformed ones in copy_rejects)"
            ))),
        }
    }

    /// The option's spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::AbortStatement => "abort_statement",
            Self::SkipFile => "skip_file",
            Self::Continue => "continue",
        }
    }
}

/// Every option `COPY INTO` takes: first those that say how files are
/// found and read (all that `read_s3_prefix` and `infer_s3_schema` take,
/// [`READ_OPTIONS`]), then those of loading alone.
const COPY_OPTIONS: &[OptionDoc] = &[
    OptionDoc::new(
        "format",
        "from the file names",
        "`csv`, `parquet`, `json` (newline-delimited) or `avro`",
    ),
    OptionDoc::new(
        "files",
        "every candidate",
        "the keys to read, relative to the prefix: `'a.csv,b.csv'` or `['a.csv', 'b.csv']`",
    ),
    OptionDoc::new(
        "all_files",
        "false",
        "read every candidate file of a prefix that holds more than one",
    ),
    OptionDoc::new(
        "header",
        "true",
        "whether a CSV file's first line names its columns",
    ),
    OptionDoc::new(
        "delimiter",
        "`','`",
        "a CSV file's one-character delimiter (`'\\t'` for tab)",
    ),
    OptionDoc::new(
        "schema",
        "inferred",
        "the columns to read, as `'id BIGINT, name VARCHAR'`",
    ),
    OptionDoc::new("region", "the AWS chain's", "the bucket's region"),
    OptionDoc::new(
        "endpoint",
        "`AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`",
        "where S3 requests go (an emulator, another S3)",
    ),
    OptionDoc::new(
        "sts_endpoint",
        "AWS's",
        "where the AssumeRole request of `role_arn` goes",
    ),
    OptionDoc::new(
        "access_key_id",
        "the AWS chain's",
        "an access key to read with (never stored)",
    ),
    OptionDoc::new("secret_access_key", "none", "its secret (never stored)"),
    OptionDoc::new("session_token", "none", "its session token (never stored)"),
    OptionDoc::new(
        "role_arn",
        "none",
        "a role to assume (STS AssumeRole) to read with",
    ),
    OptionDoc::new(
        "external_id",
        "none",
        "the external id the role's trust policy asks for",
    ),
    OptionDoc::new(
        "pattern",
        "none",
        "a regular expression the keys (relative to the prefix) must match whole",
    ),
    OptionDoc::new(
        "union_by_name",
        "false",
        "read each file with its own columns and put them together by name",
    ),
    OptionDoc::new(
        "hive_partitioning",
        "false",
        "`key=value` folders become columns",
    ),
    OptionDoc::new(
        "include_metadata",
        "false",
        "add `_source_file`, `_source_row` and `_source_modified` to every row",
    ),
    OptionDoc::new(
        "force",
        "false",
        "load a file changed since it was loaded again",
    ),
    OptionDoc::new(
        "on_error",
        "`'abort_statement'`",
        "`'abort_statement'`, `'skip_file'` or `'continue'` (reject malformed rows alone)",
    ),
    OptionDoc::new(
        "match_by_column_name",
        "`'case_sensitive'` (by position for CSV without a header)",
        "`'case_sensitive'`, `'case_insensitive'` or `'none'` (by position)",
    ),
    OptionDoc::new(
        "schema_evolution",
        "`'fail'`",
        "a column the table lacks: `'fail'`, `'add_columns'` or `'rescue'` (into `_rescued_data`)",
    ),
    OptionDoc::new(
        "validation_mode",
        "none (load)",
        "`'return_errors'` or `'return_<n>_rows'`: read as a load would and commit nothing",
    ),
    OptionDoc::new(
        "purge",
        "false",
        "delete the source files this copy loaded, after its commit",
    ),
];

/// How many of [`COPY_OPTIONS`] say how files are found and read: those
/// up to and with `include_metadata`, the last of them.
const READING: usize = config::position(COPY_OPTIONS, "include_metadata") + 1;

/// The options `read_s3_prefix` and `infer_s3_schema` take: those of
/// `COPY INTO` that say how files are found and read.
pub(crate) const READ_OPTIONS: &[OptionDoc] = COPY_OPTIONS.split_at(READING).0;

/// The option names that only reach AWS (each one of [`READ_OPTIONS`]).
pub(crate) const AWS_OPTIONS: &[&str] = &[
    "region",
    "endpoint",
    "sts_endpoint",
    "access_key_id",
    "secret_access_key",
    "session_token",
    "role_arn",
    "external_id",
];

impl WithOptions for SourceOptions {
    const STATEMENT: &'static str = "COPY INTO";
    const OPTIONS: &'static [OptionDoc] = COPY_OPTIONS;

    fn parse(pairs: &[(String, String)]) -> Result<Self> {
        Self::from_pairs(
            Self::STATEMENT,
            OptionSyntax::With,
            pairs,
            &keys(COPY_OPTIONS),
        )
    }
}

impl SourceOptions {
    /// Where S3 requests go: the `endpoint` option, else the AWS SDKs'
    /// own variables (`AWS_ENDPOINT_URL_S3`, then `AWS_ENDPOINT_URL`), as
    /// every AWS SDK and the AWS CLI read them; `None` for AWS itself. So
    /// a statement written for AWS runs unchanged against an emulator.
    pub(crate) fn s3_endpoint(&self) -> Option<String> {
        self.endpoint.clone().or_else(|| {
            ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"]
                .iter()
                .find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
        })
    }

    /// The options that decide how a file is opened and read, as the pairs
    /// [`SourceOptions::from_pairs`] reads back (with [`READ_OPTIONS`]):
    /// what a cluster's executor needs to read the same file the same way.
    /// Secrets are in the clear: the pairs travel inside the cluster only.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn reading_pairs(&self) -> Vec<(String, String)> {
        let mut pairs = vec![];
        let mut put = |name: &str, value: Option<String>| {
            if let Some(value) = value {
                pairs.push((name.to_string(), value));
            }
        };
        put("format", self.format.map(|f| f.to_string()));
        put("header", self.header.map(|h| h.to_string()));
        put(
            "delimiter",
            self.delimiter.map(|d| match d {
                b'\t' => "\\t".to_string(),
                d => (d as char).to_string(),
            }),
        );
        put("schema", self.schema.clone());
        put(
            "pattern",
            self.pattern.as_ref().map(|p| p.as_str().to_string()),
        );
        put("region", self.region.clone());
        put("endpoint", self.endpoint.clone());
        put("sts_endpoint", self.sts_endpoint.clone());
        put("access_key_id", self.access_key_id.clone());
        put(
            "secret_access_key",
            self.secret_access_key
                .as_ref()
                .map(|s| s.expose().to_string()),
        );
        put(
            "session_token",
            self.session_token.as_ref().map(|s| s.expose().to_string()),
        );
        put("role_arn", self.role_arn.clone());
        put("external_id", self.external_id.clone());
        pairs
    }

    /// Reads `name = value` pairs, written in `syntax`; `accepted` lists
    /// the names `what` takes.
    pub(crate) fn from_pairs(
        what: &str,
        syntax: OptionSyntax,
        pairs: &[(String, String)],
        accepted: &[&str],
    ) -> Result<Self> {
        let mut options = Self::default();
        let parse_bool = |name: &str, value: &str| syntax.parse_bool(name, value);
        for (name, value) in pairs {
            let name = name.to_ascii_lowercase();
            if !accepted.contains(&name.as_str()) {
                return Err(Error::invalid(format!(
                    "{what} has no option '{name}': valid options are {}",
                    accepted.join(", ")
                )));
            }
            let text = || (!value.is_empty()).then(|| value.clone());
            match name.as_str() {
                "format" => options.format = Some(Format::parse(value)?),
                "files" => {
                    options.files = value
                        .split(',')
                        .map(|f| f.trim().to_string())
                        .filter(|f| !f.is_empty())
                        .collect()
                }
                "all_files" => options.all_files = parse_bool(&name, value)?,
                "header" => options.header = Some(parse_bool(&name, value)?),
                "delimiter" => {
                    let bytes = value.as_bytes();
                    options.delimiter = Some(match (value.as_str(), bytes.len()) {
                        ("\\t" | "tab", _) => b'\t',
                        (_, 1) => bytes[0],
                        _ => {
                            return Err(Error::invalid(format!(
                                "delimiter '{value}' must be one character, e.g. ',' or '|' or '\\t'"
                            )));
                        }
                    })
                }
                "schema" => options.schema = text(),
                "region" => options.region = text(),
                "endpoint" => options.endpoint = text(),
                "sts_endpoint" => options.sts_endpoint = text(),
                "access_key_id" => options.access_key_id = text(),
                "secret_access_key" => options.secret_access_key = text().map(Secret::new),
                "session_token" => options.session_token = text().map(Secret::new),
                "role_arn" => options.role_arn = text(),
                "external_id" => options.external_id = text(),
                "force" => options.force = parse_bool(&name, value)?,
                "on_error" => options.on_error = OnError::parse(value)?,
                "match_by_column_name" => {
                    options.match_by_column_name = Some(MatchByName::parse(value)?)
                }
                "schema_evolution" => options.schema_evolution = SchemaEvolution::parse(value)?,
                "validation_mode" => options.validation_mode = Some(ValidationMode::parse(value)?),
                "pattern" => options.pattern = Some(Pattern::parse(value)?),
                "union_by_name" => options.union_by_name = parse_bool(&name, value)?,
                "hive_partitioning" => options.hive_partitioning = parse_bool(&name, value)?,
                "include_metadata" => options.include_metadata = parse_bool(&name, value)?,
                "purge" => options.purge = parse_bool(&name, value)?,
                _ => unreachable!("checked against accepted"),
            }
        }
        if options.access_key_id.is_some() != options.secret_access_key.is_some() {
            return Err(Error::invalid(format!(
                "{what}: give access_key_id and secret_access_key together (or neither, for a role \
                 or the default credential chain)"
            )));
        }
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_announce_format_and_compression() {
        assert_eq!(classify("in/a.csv"), (Some(Format::Csv), Compression::None));
        assert_eq!(
            classify("in/a.CSV.gz"),
            (Some(Format::Csv), Compression::Gzip)
        );
        assert_eq!(
            classify("b.jsonl.zst"),
            (Some(Format::Json), Compression::Zstd)
        );
        assert_eq!(
            classify("c.ndjson.bz2"),
            (Some(Format::Json), Compression::Bzip2)
        );
        assert_eq!(
            classify("d.csv.snappy"),
            (Some(Format::Csv), Compression::Snappy)
        );
        assert_eq!(
            classify("e.parquet"),
            (Some(Format::Parquet), Compression::None)
        );
        assert_eq!(classify("f.avro"), (Some(Format::Avro), Compression::None));
        assert_eq!(classify("g.xz"), (None, Compression::Xz));
        assert_eq!(classify("README"), (None, Compression::None));
    }

    #[test]
    fn reading_options_round_trip_through_pairs() {
        let pairs: Vec<(String, String)> = [
            ("format", "csv"),
            ("header", "false"),
            ("delimiter", "\\t"),
            ("region", "eu-west-1"),
            ("access_key_id", "AKIA"),
            ("secret_access_key", "s3cr3t"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let options =
            SourceOptions::from_pairs("x", OptionSyntax::Arguments, &pairs, &keys(READ_OPTIONS))
                .unwrap();
        let again = SourceOptions::from_pairs(
            "x",
            OptionSyntax::Arguments,
            &options.reading_pairs(),
            &keys(READ_OPTIONS),
        )
        .unwrap();
        assert_eq!(again.reading_pairs(), options.reading_pairs());
        assert_eq!(again.delimiter, Some(b'\t'));
        assert_eq!(again.secret_access_key.unwrap().expose(), "s3cr3t");
    }

    /// The reading options are the first of `COPY INTO`'s, and the ones
    /// that reach AWS are among them.
    #[test]
    fn the_reading_options_lead_copy_into_s() {
        let reading = keys(READ_OPTIONS);
        assert!(reading.contains(&"pattern") && reading.contains(&"hive_partitioning"));
        assert!(AWS_OPTIONS.iter().all(|key| reading.contains(key)));
        let loading = &keys(COPY_OPTIONS)[READING..];
        assert!(loading.iter().all(|key| !reading.contains(key)));
    }

    #[test]
    fn options_are_checked() {
        let pairs = |p: &[(&str, &str)]| -> Vec<(String, String)> {
            p.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let options = SourceOptions::from_pairs(
            "read_s3_prefix",
            OptionSyntax::Arguments,
            &pairs(&[
                ("format", "csv"),
                ("files", "a.csv, b.csv"),
                ("delimiter", "|"),
            ]),
            &keys(READ_OPTIONS),
        )
        .unwrap();
        assert_eq!(options.files, vec!["a.csv", "b.csv"]);
        assert_eq!(options.delimiter, Some(b'|'));
        let err = SourceOptions::from_pairs(
            "read_s3_prefix",
            OptionSyntax::Arguments,
            &pairs(&[("fromat", "csv")]),
            &keys(READ_OPTIONS),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with(
                "read_s3_prefix has no option 'fromat': valid options are format, files"
            ),
            "{err}"
        );
        let err = SourceOptions::from_pairs(
            "x",
            OptionSyntax::Arguments,
            &pairs(&[("access_key_id", "AKIA")]),
            &keys(READ_OPTIONS),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("give access_key_id and secret_access_key together"),
            "{err}"
        );
        // A bad boolean is shown as the user wrote it: `WITH (k = v)` for
        // COPY INTO, named arguments `k => v` for a table function.
        let maybe = pairs(&[("header", "maybe")]);
        let err = SourceOptions::from_with(&maybe).unwrap_err().to_string();
        assert!(
            err.contains("option header = 'maybe' is not a boolean: write header = true"),
            "{err}"
        );
        let err = SourceOptions::from_pairs(
            "read_s3_prefix",
            OptionSyntax::Arguments,
            &maybe,
            &keys(READ_OPTIONS),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("option header => 'maybe' is not a boolean: write header => true"),
            "{err}"
        );
    }
}
