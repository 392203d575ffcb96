//! Where files come from: a URI (`s3://`, `s3a://`, `file://`), the
//! credentials to reach it, and the candidate files under it, with the
//! ambiguous-prefix guard.
//!
//! Credentials, in this order of priority: explicit `access_key_id` /
//! `secret_access_key` (and `session_token`); `role_arn` with `external_id`
//! (STS AssumeRole, the cross-account pattern, signed with the explicit keys
//! when given, else with the default chain); the instance's role (EC2/ECS
//! metadata); the environment; the rest of the default AWS chain (profiles,
//! web identity). They are resolved once per statement.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_config::meta::credentials::CredentialsProviderChain;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_credential_types::Credentials;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use futures::TryStreamExt;
use object_store::aws::{AmazonS3Builder, AwsCredential};
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{CredentialProvider, ObjectMeta, ObjectStore, ObjectStoreExt};
use url::Url;

use super::options::{Compression, Format, SourceOptions, classify};
use crate::error::{Error, Result};

/// A parsed source URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Location {
    /// `s3://bucket/prefix` (or `s3a://`); `bucket` empty for `s3://`.
    S3 { bucket: String, prefix: String },
    /// `file:///folder/`, or a plain path (relative to the working
    /// directory, as DuckDB reads them).
    Local { path: PathBuf },
}

impl Location {
    pub(crate) fn parse(uri: &str) -> Result<Self> {
        if let Some(rest) = uri
            .strip_prefix("s3://")
            .or_else(|| uri.strip_prefix("s3a://"))
        {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            return Ok(Self::S3 {
                bucket: bucket.to_string(),
                prefix: prefix.to_string(),
            });
        }
        if let Some(path) = uri.strip_prefix("file://") {
            if !path.starts_with('/') {
                return Err(Error::invalid(format!(
                    "'{uri}' is not an absolute file URI: write file:///absolute/folder/"
                )));
            }
            return Ok(Self::Local {
                path: PathBuf::from(path),
            });
        }
        if uri.contains("://") || uri.is_empty() {
            return Err(Error::invalid(format!(
                "'{uri}' is not an s3://, s3a:// or file:// URI: write s3://bucket/prefix/, file:///folder/ or a local path"
            )));
        }
        let path = std::path::absolute(uri)
            .map_err(|e| Error::invalid(format!("'{uri}' is not a usable local path: {e}")))?;
        Ok(Self::Local { path })
    }
}

/// Reaches one bucket (or the local file system) with resolved credentials.
#[derive(Debug, Clone)]
pub(crate) struct Access {
    pub(crate) location: Location,
    pub(crate) store: Arc<dyn ObjectStore>,
    /// The URL DataFusion registers the store under (`s3://bucket`, `file://`).
    pub(crate) store_url: Url,
    /// Who icestage is when it reads (for error messages).
    pub(crate) identity: String,
    /// The URI it was opened for (a cluster's executors open it again).
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) uri: String,
    pub(crate) sdk: Option<SdkConfig>,
}

/// Hands resolved AWS credentials to object_store.
#[derive(Debug)]
struct ResolvedCredentials(Arc<AwsCredential>);

#[async_trait]
impl CredentialProvider for ResolvedCredentials {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        Ok(Arc::clone(&self.0))
    }
}

fn region(options: &SourceOptions) -> Region {
    Region::new(
        options
            .region
            .clone()
            .unwrap_or_else(|| "us-east-1".to_string()),
    )
}

/// The credentials of `options`, in the documented priority order, and a
/// description of the identity for error messages.
async fn resolve_credentials(options: &SourceOptions) -> Result<(Credentials, String, SdkConfig)> {
    let loader = || {
        let loader = aws_config::defaults(BehaviorVersion::latest()).region(region(options));
        match options.sts_endpoint.as_ref().or(options.endpoint.as_ref()) {
            Some(endpoint) => loader.endpoint_url(endpoint),
            None => loader,
        }
    };
    let explicit = match (&options.access_key_id, &options.secret_access_key) {
        (Some(key), Some(secret)) => Some(Credentials::new(
            key,
            secret.expose(),
            options
                .session_token
                .as_ref()
                .map(|t| t.expose().to_string()),
            None,
            "explicit keys",
        )),
        _ => None,
    };
    let (provider, identity): (SharedCredentialsProvider, String) =
        match (&options.role_arn, &explicit) {
            (Some(role), _) => {
                let base = match &explicit {
                    Some(keys) => loader().credentials_provider(keys.clone()).load().await,
                    None => loader().load().await,
                };
                let mut builder = aws_config::sts::AssumeRoleProvider::builder(role)
                    .session_name("icestage-read")
                    .configure(&base);
                if let Some(external_id) = &options.external_id {
                    builder = builder.external_id(external_id);
                }
                (
                    SharedCredentialsProvider::new(builder.build().await),
                    format!("role {role}"),
                )
            }
            (None, Some(keys)) => (
                SharedCredentialsProvider::new(keys.clone()),
                format!("access key {}", keys.access_key_id()),
            ),
            (None, None) => {
                let imds = aws_config::imds::credentials::ImdsCredentialsProvider::builder()
                    .imds_client(
                        aws_config::imds::Client::builder()
                            .connect_timeout(Duration::from_millis(500))
                            .read_timeout(Duration::from_millis(500))
                            .build(),
                    )
                    .build();
                // The environment first, as every AWS SDK orders it: an instance
                // metadata endpoint that answers with an error (not "no role")
                // ends a chain, and must not hide keys the process was given.
                let chain = CredentialsProviderChain::first_try(
                "environment",
                aws_config::environment::credentials::EnvironmentVariableCredentialsProvider::new(),
            )
            .or_else("instance role", imds)
            .or_default_provider()
            .await;
                (
                    SharedCredentialsProvider::new(chain),
                    "the environment, instance role or default AWS credential chain".to_string(),
                )
            }
        };
    let credentials = provider.provide_credentials().await.map_err(|e| {
        Error::invalid(format!(
            "no AWS credentials from {identity}: {}; pass access_key_id and secret_access_key, or role_arn",
            aws_sdk_sts::error::DisplayErrorContext(&e)
        ))
    })?;
    let sdk = loader()
        .credentials_provider(credentials.clone())
        .load()
        .await;
    Ok((credentials, identity, sdk))
}

impl Access {
    /// Resolves credentials (for S3) and opens the store behind `uri`.
    pub(crate) async fn open(uri: &str, options: &SourceOptions) -> Result<Self> {
        let location = Location::parse(uri)?;
        match &location {
            Location::Local { path } => Ok(Self {
                uri: uri.to_string(),
                store: Arc::new(LocalFileSystem::new()),
                store_url: Url::parse("file:///").expect("valid"),
                identity: format!("the local user of {}", path.display()),
                sdk: None,
                location,
            }),
            Location::S3 { bucket, .. } => {
                let (credentials, identity, sdk) = resolve_credentials(options).await?;
                let store_url = Url::parse(&format!(
                    "s3://{}",
                    if bucket.is_empty() {
                        "all-buckets"
                    } else {
                        bucket
                    }
                ))
                .map_err(|e| {
                    Error::invalid(format!("bucket name '{bucket}' is not valid in a URL: {e}"))
                })?;
                let mut builder = AmazonS3Builder::new()
                    .with_bucket_name(if bucket.is_empty() {
                        "all-buckets"
                    } else {
                        bucket
                    })
                    .with_region(region(options).as_ref())
                    .with_credentials(Arc::new(ResolvedCredentials(Arc::new(AwsCredential {
                        key_id: credentials.access_key_id().to_string(),
                        secret_key: credentials.secret_access_key().to_string(),
                        token: credentials.session_token().map(str::to_string),
                    }))));
                if let Some(endpoint) = options.s3_endpoint() {
                    builder = builder
                        .with_endpoint(endpoint)
                        .with_allow_http(true)
                        .with_virtual_hosted_style_request(false);
                }
                Ok(Self {
                    uri: uri.to_string(),
                    store: Arc::new(builder.build().map_err(|e| Error::invalid(e.to_string()))?),
                    store_url,
                    identity,
                    sdk: Some(sdk),
                    location,
                })
            }
        }
    }

    /// The URI of `path` in this store.
    pub(crate) fn uri_of(&self, path: &ObjectPath) -> String {
        match &self.location {
            Location::S3 { bucket, .. } => format!("s3://{bucket}/{path}"),
            Location::Local { .. } => format!("file:///{path}"),
        }
    }

    /// The store path of the location's prefix.
    fn prefix(&self) -> Result<ObjectPath> {
        match &self.location {
            Location::S3 { prefix, .. } => Ok(ObjectPath::from(prefix.trim_end_matches('/'))),
            Location::Local { path } => ObjectPath::from_absolute_path(path)
                .map_err(|e| Error::invalid(format!("'{}': {e}", path.display()))),
        }
    }

    /// A storage error, named for the user.
    pub(crate) fn storage_error(&self, error: object_store::Error) -> Error {
        let what = match &self.location {
            Location::S3 { bucket, .. } => format!("bucket '{bucket}'"),
            Location::Local { path } => format!("folder '{}'", path.display()),
        };
        // S3's error codes arrive inside generic errors; read them.
        let text = error.to_string();
        let denied = [
            "AccessDenied",
            "403 Forbidden",
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "ExpiredToken",
        ]
        .iter()
        .any(|code| text.contains(code));
        let missing = text.contains("NoSuchBucket");
        match error {
            _ if missing => Error::invalid(format!(
                "{what} does not exist or is not visible to {}",
                self.identity
            )),
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => Error::invalid(format!(
                "access to {what} was denied for {}: grant it s3:ListBucket and s3:GetObject there, or pass \
                     other credentials",
                self.identity
            )),
            _ if denied => Error::invalid(format!(
                "access to {what} was denied for {}: grant it s3:ListBucket and s3:GetObject there, or pass \
                     other credentials",
                self.identity
            )),
            object_store::Error::NotFound { .. } => Error::invalid(format!(
                "{what} does not exist or is not visible to {}",
                self.identity
            )),
            other => Error::invalid(format!(
                "reading {what} as {} failed: {other}",
                self.identity
            )),
        }
    }

    /// Every object under the location's prefix (an exact key is its own
    /// prefix), sorted by key.
    pub(crate) async fn list(&self) -> Result<Vec<ObjectMeta>> {
        let prefix = self.prefix()?;
        if let Location::S3 { prefix: text, .. } = &self.location
            && !text.is_empty()
            && !text.ends_with('/')
        {
            // An exact key names one file.
            if let Ok(meta) = self.store.head(&prefix).await {
                return Ok(vec![meta]);
            }
        }
        let mut objects: Vec<ObjectMeta> = self
            .store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| self.storage_error(e))?;
        objects.sort_by(|a, b| a.location.cmp(&b.location));
        Ok(objects)
    }
}

/// One file selected for reading.
#[derive(Debug, Clone)]
pub(crate) struct SourceFile {
    pub(crate) meta: ObjectMeta,
    pub(crate) uri: String,
    pub(crate) compression: Compression,
}

impl SourceFile {
    pub(crate) fn etag(&self) -> Option<&str> {
        self.meta.e_tag.as_deref()
    }

    fn of(access: &Access, meta: ObjectMeta) -> Self {
        Self {
            uri: access.uri_of(&meta.location),
            compression: classify(meta.location.as_ref()).1,
            meta,
        }
    }
}

/// Every data file under `access` (see [`is_candidate`]), sorted by key;
/// an empty prefix is no error here.
pub(crate) async fn candidates(access: &Access) -> Result<Vec<SourceFile>> {
    Ok(access
        .list()
        .await?
        .into_iter()
        .filter(is_candidate)
        .map(|meta| SourceFile::of(access, meta))
        .collect())
}

/// The data files at `keys` (store paths, as S3 event notifications name
/// them) that lie under `access`'s prefix, as they are now: keys outside the
/// prefix, gone or not data files are left out.
pub(crate) async fn files_at(access: &Access, keys: &[String]) -> Result<Vec<SourceFile>> {
    let prefix = access.prefix()?;
    let mut files = vec![];
    for key in keys {
        let path = ObjectPath::from(key.as_str());
        if !path.prefix_matches(&prefix) && path != prefix {
            continue;
        }
        match access.store.head(&path).await {
            Ok(meta) if is_candidate(&meta) => files.push(SourceFile::of(access, meta)),
            Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(access.storage_error(e)),
        }
    }
    files.sort_by(|a, b| a.uri.cmp(&b.uri));
    files.dedup_by(|a, b| a.uri == b.uri);
    Ok(files)
}

/// Files that are data, not markers: not folders, not empty, not hidden
/// (`_SUCCESS`, `.crc` and the like, as Spark and Hadoop write them).
fn is_candidate(meta: &ObjectMeta) -> bool {
    let name = meta.location.filename().unwrap_or_default();
    meta.size > 0 && !name.starts_with('_') && !name.starts_with('.') && !name.ends_with(".crc")
}

/// The files to read under `access`, after the ambiguous-prefix guard, and
/// their common format.
impl Access {
    /// `location`'s key relative to the prefix (the whole key when it is
    /// not under it).
    pub(crate) fn relative_key(&self, location: &object_store::path::Path) -> String {
        let base = match &self.location {
            Location::S3 { prefix, .. } => prefix.trim_end_matches('/').to_string(),
            Location::Local { path } => path
                .to_string_lossy()
                .trim_start_matches('/')
                .trim_end_matches('/')
                .to_string(),
        };
        let key = location.to_string();
        key.strip_prefix(&base)
            .map(|r| r.trim_start_matches('/').to_string())
            .filter(|r| !r.is_empty())
            .unwrap_or(key)
    }

    /// Whether the file at `location` is a candidate under
    /// `options.pattern` (every file is, without one).
    pub(crate) fn admits(
        &self,
        options: &SourceOptions,
        location: &object_store::path::Path,
    ) -> bool {
        options
            .pattern
            .as_ref()
            .is_none_or(|pattern| pattern.matches(&self.relative_key(location)))
    }
}

pub(crate) async fn select(
    access: &Access,
    uri: &str,
    options: &SourceOptions,
) -> Result<(Vec<SourceFile>, Format)> {
    let listed = access.list().await?;
    let candidates: Vec<&ObjectMeta> = listed.iter().filter(|m| is_candidate(m)).collect();
    let relative = |meta: &ObjectMeta| access.relative_key(&meta.location);
    let candidates: Vec<&ObjectMeta> = match &options.pattern {
        Some(pattern) => {
            let matching: Vec<&ObjectMeta> = candidates
                .iter()
                .copied()
                .filter(|m| access.admits(options, &m.location))
                .collect();
            if matching.is_empty() && !candidates.is_empty() {
                return Err(Error::invalid(format!(
                    "pattern '{}' matches none of the files under '{uri}' ({}): the pattern must \
                     match a whole key relative to the prefix, e.g. '.*[.]csv'",
                    pattern.as_str(),
                    name_list(candidates.iter().map(|m| relative(m)).collect())
                )));
            }
            matching
        }
        None => candidates,
    };
    if candidates.is_empty() {
        return Err(Error::invalid(format!(
            "prefix '{uri}' holds no files{}: check the bucket and prefix with SELECT * FROM list_s3('{}')",
            if listed.is_empty() {
                ""
            } else {
                " (only markers or empty files)"
            },
            parent_uri(uri)
        )));
    }
    let chosen: Vec<&ObjectMeta> = if !options.files.is_empty() {
        let mut chosen = vec![];
        for pin in &options.files {
            let pin = pin.trim_start_matches('/');
            let found = candidates
                .iter()
                .find(|m| relative(m) == pin || m.location.as_ref() == pin)
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "pinned file '{pin}' is not under '{uri}': the prefix holds {}",
                        name_list(candidates.iter().map(|m| relative(m)).collect())
                    ))
                })?;
            chosen.push(*found);
        }
        chosen
    } else if candidates.len() > 1 && !options.all_files {
        return Err(Error::invalid(format!(
            "prefix '{uri}' holds {} candidate files ({}): pin files => '<key>[,<key>...]' or set all_files => true",
            candidates.len(),
            name_list(candidates.iter().map(|m| relative(m)).collect())
        )));
    } else {
        candidates
    };
    let files: Vec<SourceFile> = chosen
        .iter()
        .map(|meta| SourceFile::of(access, (*meta).clone()))
        .collect();
    let format = match options.format {
        Some(format) => format,
        None => {
            let mut formats: Vec<(Option<Format>, String)> = chosen
                .iter()
                .map(|m| (classify(m.location.as_ref()).0, relative(m)))
                .collect();
            formats.sort();
            let known: Vec<Format> = formats.iter().filter_map(|(f, _)| *f).collect();
            match (
                known.first(),
                known.len() == formats.len() && known.iter().all(|f| Some(f) == known.first()),
            ) {
                (Some(format), true) => *format,
                _ => {
                    let described: Vec<String> = formats
                        .iter()
                        .map(|(f, name)| {
                            format!(
                                "{name} ({})",
                                f.map_or("unknown".to_string(), |f| f.to_string())
                            )
                        })
                        .collect();
                    return Err(Error::invalid(format!(
                        "the files under '{uri}' do not name one format ({}): pass format => 'csv' | 'parquet' | \
                         'json' | 'avro', or pin files of one format",
                        described.join(", ")
                    )));
                }
            }
        }
    };
    Ok((files, format))
}

/// `keys`, sorted and comma-separated, with their count when there are many.
fn name_list(mut keys: Vec<String>) -> String {
    keys.sort();
    let count = keys.len();
    let joined = keys.join(", ");
    if count > 10 {
        format!("{count} files: {joined}")
    } else {
        joined
    }
}

/// The URI one level up, for the "check with list_s3" hint.
fn parent_uri(uri: &str) -> String {
    let trimmed = uri.trim_end_matches('/');
    match trimmed.rsplit_once('/') {
        Some((parent, _)) if parent.ends_with(':') || parent.ends_with("//") => {
            format!("{trimmed}/")
        }
        Some((parent, _)) => format!("{parent}/"),
        None => uri.to_string(),
    }
}

/// The buckets the credentials of `sdk` can list (S3 `ListBuckets`, signed
/// with SigV4), with their creation times: `list_s3('s3://')`. One signed
/// GET, so that listing buckets does not need the whole S3 SDK.
pub(crate) async fn list_buckets(
    sdk: &SdkConfig,
    endpoint: Option<&str>,
) -> std::result::Result<Vec<(String, Option<chrono::DateTime<chrono::Utc>>)>, String> {
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    use aws_sigv4::sign::v4;

    let region = sdk
        .region()
        .map(|r| r.to_string())
        .unwrap_or_else(|| "us-east-1".to_string());
    let url = match endpoint {
        Some(endpoint) => format!("{}/", endpoint.trim_end_matches('/')),
        None => format!("https://s3.{region}.amazonaws.com/"),
    };
    let provider = sdk
        .credentials_provider()
        .ok_or_else(|| "no credentials are configured".to_string())?;
    let credentials = provider
        .provide_credentials()
        .await
        .map_err(|e| aws_sdk_sts::error::DisplayErrorContext(&e).to_string())?;
    let identity = credentials.into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(&region)
        .name("s3")
        .time(std::time::SystemTime::now())
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| e.to_string())?
        .into();
    let payload = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    let headers = [("x-amz-content-sha256", payload)];
    let signable = SignableRequest::new(
        "GET",
        &url,
        headers.iter().copied(),
        SignableBody::Precomputed(payload.to_string()),
    )
    .map_err(|e| e.to_string())?;
    let (instructions, _) = sign(signable, &params)
        .map_err(|e| e.to_string())?
        .into_parts();
    let mut request = reqwest::Client::new().get(&url);
    for (name, value) in headers {
        request = request.header(name, value);
    }
    for (name, value) in instructions.headers() {
        request = request.header(name, value);
    }
    let response = request.send().await.map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response.text().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        let code = xml_values(&body, "Code")
            .into_iter()
            .next()
            .unwrap_or_default();
        let message = xml_values(&body, "Message")
            .into_iter()
            .next()
            .unwrap_or_default();
        return Err(format!("{status} {code}: {message}"));
    }
    let names = xml_values(&body, "Name");
    let created = xml_values(&body, "CreationDate");
    Ok(names
        .into_iter()
        .enumerate()
        .map(|(i, name)| {
            let at = created
                .get(i)
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .map(|t| t.with_timezone(&chrono::Utc));
            (name, at)
        })
        .collect())
}

/// The text of every `<tag>...</tag>` element of a small XML answer (bucket
/// names and dates hold no markup or entities).
fn xml_values(xml: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut values = vec![];
    let mut rest = xml;
    while let Some(start) = rest.find(&open) {
        rest = &rest[start + open.len()..];
        let Some(end) = rest.find(&close) else { break };
        values.push(rest[..end].to_string());
        rest = &rest[end + close.len()..];
    }
    values
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denied_access_names_the_bucket_and_the_identity() {
        let access = Access {
            location: Location::S3 {
                bucket: "private".into(),
                prefix: "in/".into(),
            },
            store: Arc::new(LocalFileSystem::new()),
            store_url: Url::parse("s3://private").unwrap(),
            identity: "access key AKIAREADER".into(),
            uri: "s3://private/in/".into(),
            sdk: None,
        };
        let error = access.storage_error(object_store::Error::PermissionDenied {
            path: "in/".into(),
            source: "403 Forbidden".into(),
        });
        assert_eq!(
            error.to_string(),
            "access to bucket 'private' was denied for access key AKIAREADER: grant it s3:ListBucket and \
             s3:GetObject there, or pass other credentials"
        );
    }

    #[test]
    fn uris() {
        assert_eq!(
            Location::parse("s3a://b/in/").unwrap(),
            Location::S3 {
                bucket: "b".into(),
                prefix: "in/".into()
            }
        );
        assert_eq!(
            Location::parse("s3://").unwrap(),
            Location::S3 {
                bucket: "".into(),
                prefix: "".into()
            }
        );
        assert!(
            Location::parse("gs://b/x")
                .unwrap_err()
                .to_string()
                .contains("is not an s3://, s3a:// or file:// URI")
        );
        assert_eq!(
            Location::parse("data/in/").unwrap(),
            Location::Local {
                path: std::env::current_dir().unwrap().join("data/in/")
            }
        );
        assert_eq!(parent_uri("s3://b/in/"), "s3://b/");
    }
}
