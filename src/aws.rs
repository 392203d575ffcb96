//! AWS plumbing: how icestage reaches AWS for one catalog (region,
//! endpoints, identity), SDK configs, file-IO properties and STS
//! `AssumeRole`.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_credential_types::Credentials;
use chrono::{DateTime, Utc};

use crate::error::{Error, Result};
use crate::secret::Secret;

/// Catalog config key: AWS region.
pub const PROP_REGION: &str = "region";
/// Catalog config key: the S3 endpoint for data files (an emulator, say).
pub const PROP_S3_ENDPOINT: &str = "s3.endpoint";
/// Catalog config key: the STS endpoint.
pub const PROP_STS_ENDPOINT: &str = "sts.endpoint";
/// Catalog config key: the service's access key id (else the default chain).
pub const PROP_ACCESS_KEY_ID: &str = "access_key_id";
/// Catalog config key: the service's secret access key.
pub const PROP_SECRET_ACCESS_KEY: &str = "secret_access_key";
/// Catalog config key: the service's session token.
pub const PROP_SESSION_TOKEN: &str = "session_token";
/// Catalog config key: the role `vend_credentials` assumes.
pub const PROP_ROLE_ARN: &str = "role_arn";
/// Catalog config key: the external id to pass when assuming the role.
pub const PROP_EXTERNAL_ID: &str = "external_id";
/// Catalog config key: the largest object copied within a bucket in one
/// `CopyObject` request, and the part size of larger copies
/// (`UploadPartCopy`), in bytes: 5 MiB to 5 GiB (S3's limits; the default).
pub const PROP_S3_COPY_PART_SIZE: &str = "s3.copy-part-size";

/// S3's largest single copy and largest part, the default part size.
const COPY_PART_MAX: u64 = 5 << 30;
/// S3's smallest part (but the last).
const COPY_PART_MIN: u64 = 5 << 20;

/// How icestage reaches AWS for one catalog.
#[derive(Debug, Clone)]
pub(crate) struct AwsSettings {
    pub(crate) region: String,
    pub(crate) s3_endpoint: Option<String>,
    pub(crate) sts_endpoint: Option<String>,
    pub(crate) access_key_id: Option<String>,
    pub(crate) secret_access_key: Option<Secret>,
    pub(crate) session_token: Option<Secret>,
    pub(crate) role_arn: Option<String>,
    pub(crate) external_id: Option<String>,
    /// `s3.copy-part-size` as given.
    pub(crate) copy_part_size: Option<String>,
}

impl AwsSettings {
    /// Reads the AWS keys of a catalog's `[catalogs.config]`.
    pub(crate) fn from_config(config: &BTreeMap<String, String>) -> Result<Self> {
        let get = |key: &str| config.get(key).filter(|v| !v.is_empty()).cloned();
        let settings = Self {
            region: get(PROP_REGION).unwrap_or_else(|| "us-east-1".to_string()),
            s3_endpoint: get(PROP_S3_ENDPOINT),
            sts_endpoint: get(PROP_STS_ENDPOINT),
            access_key_id: get(PROP_ACCESS_KEY_ID),
            secret_access_key: get(PROP_SECRET_ACCESS_KEY).map(Secret::new),
            session_token: get(PROP_SESSION_TOKEN).map(Secret::new),
            role_arn: get(PROP_ROLE_ARN),
            external_id: get(PROP_EXTERNAL_ID),
            copy_part_size: get(PROP_S3_COPY_PART_SIZE),
        };
        settings.copy_part_bytes()?;
        Ok(settings)
    }

    /// Where the store is, as iceberg's S3 `FileIO` properties: region,
    /// endpoint and addressing, no key.
    pub(crate) fn store_properties(&self) -> HashMap<String, String> {
        let mut props = HashMap::from([("s3.region".to_string(), self.region.clone())]);
        if let Some(endpoint) = &self.s3_endpoint {
            props.insert("s3.endpoint".to_string(), endpoint.clone());
            props.insert("s3.path-style-access".to_string(), "true".to_string());
        }
        props
    }

    /// The properties iceberg's S3 `FileIO` takes for these settings.
    pub(crate) fn file_io_properties(&self) -> HashMap<String, String> {
        let mut props = self.store_properties();
        if let (Some(key), Some(secret)) = (&self.access_key_id, &self.secret_access_key) {
            props.insert("s3.access-key-id".to_string(), key.clone());
            props.insert(
                "s3.secret-access-key".to_string(),
                secret.expose().to_string(),
            );
            if let Some(token) = &self.session_token {
                props.insert("s3.session-token".to_string(), token.expose().to_string());
            }
        }
        props
    }

    /// An AWS SDK config: these credentials (or the default chain), this
    /// region, and `endpoint` when given.
    pub(crate) async fn sdk_config(&self, endpoint: Option<&str>) -> SdkConfig {
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(self.region.clone()));
        if let Some(endpoint) = endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        if let (Some(key), Some(secret)) = (&self.access_key_id, &self.secret_access_key) {
            loader = loader.credentials_provider(Credentials::new(
                key,
                secret.expose(),
                self.session_token.as_ref().map(|t| t.expose().to_string()),
                None,
                "icestage catalog config",
            ));
        }
        loader.load().await
    }
}

impl AwsSettings {
    /// The largest object one `CopyObject` copies, and the part size of
    /// larger copies: `s3.copy-part-size`, else S3's 5 GiB.
    pub(crate) fn copy_part_bytes(&self) -> Result<u64> {
        let Some(text) = &self.copy_part_size else {
            return Ok(COPY_PART_MAX);
        };
        text.trim()
            .parse::<u64>()
            .ok()
            .filter(|n| (COPY_PART_MIN..=COPY_PART_MAX).contains(n))
            .ok_or_else(|| {
                Error::Config(format!(
                    "{PROP_S3_COPY_PART_SIZE} = '{text}' is not a part size S3 takes: give bytes \
                     from {COPY_PART_MIN} (5 MiB) to {COPY_PART_MAX} (5 GiB)"
                ))
            })
    }

    /// The URL of `key` in `bucket` (already percent-encoded): path-style
    /// on a configured endpoint, else AWS's virtual-hosted style.
    pub(crate) fn object_url(&self, bucket: &str, key: &str) -> String {
        match &self.s3_endpoint {
            Some(endpoint) => format!("{}/{bucket}/{key}", endpoint.trim_end_matches('/')),
            None => format!("https://{bucket}.s3.{}.amazonaws.com/{key}", self.region),
        }
    }

    /// The provider of these settings' credentials: the catalog's keys, or
    /// the default chain's.
    pub(crate) async fn credentials_provider(
        &self,
    ) -> Result<aws_credential_types::provider::SharedCredentialsProvider> {
        self.sdk_config(None)
            .await
            .credentials_provider()
            .ok_or_else(|| {
                Error::Config(
                    "no AWS credentials: set access_key_id and secret_access_key (or role_arn) \
                     in the catalog's config"
                        .to_string(),
                )
            })
    }
}

/// The credentials `provider` gives now, for reaching `what` (named in
/// the error when it gives none).
pub(crate) async fn credentials_of(
    provider: &aws_credential_types::provider::SharedCredentialsProvider,
    what: &str,
) -> Result<Credentials> {
    use aws_credential_types::provider::ProvideCredentials;

    provider.provide_credentials().await.map_err(|e| {
        Error::Config(format!(
            "no AWS credentials for {what}: {}",
            aws_sdk_sts::error::DisplayErrorContext(&e)
        ))
    })
}

/// Credentials STS returned.
#[derive(Debug, Clone)]
pub(crate) struct VendedCredentials {
    pub(crate) access_key_id: String,
    pub(crate) secret_access_key: Secret,
    pub(crate) session_token: Secret,
    pub(crate) expiration: DateTime<Utc>,
}

/// STS's bounds on a role session's duration.
pub(crate) const MIN_DURATION: Duration = Duration::from_secs(15 * 60);
/// See [`MIN_DURATION`].
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(12 * 3600);

/// `sts:AssumeRole` into the configured role with `policy` as the session
/// policy: the returned credentials can do at most what the policy allows.
pub(crate) async fn assume_role(
    settings: &AwsSettings,
    catalog: &str,
    session_name: &str,
    policy: &str,
    duration: Duration,
) -> Result<VendedCredentials> {
    let role_arn = settings.role_arn.as_ref().ok_or_else(|| {
        Error::Config(format!(
            "catalog '{catalog}' has no role_arn: vend_credentials assumes that role with a session \
             policy for one table; add role_arn (and external_id if its trust policy asks) to [catalogs.config]"
        ))
    })?;
    let config = settings.sdk_config(settings.sts_endpoint.as_deref()).await;
    let client = aws_sdk_sts::Client::new(&config);
    let mut request = client
        .assume_role()
        .role_arn(role_arn)
        .role_session_name(session_name)
        .policy(policy)
        .duration_seconds(duration.as_secs() as i32);
    if let Some(external_id) = &settings.external_id {
        request = request.external_id(external_id);
    }
    let response = request.send().await.map_err(|e| {
        Error::invalid(format!(
            "sts:AssumeRole of {role_arn} for catalog '{catalog}' failed: {}; check that the service \
             identity may assume the role and that its trust policy names the external id",
            aws_sdk_sts::error::DisplayErrorContext(&e)
        ))
    })?;
    let credentials = response.credentials().ok_or_else(|| {
        Error::invalid(format!(
            "sts:AssumeRole of {role_arn} returned no credentials"
        ))
    })?;
    let expiration = credentials.expiration();
    Ok(VendedCredentials {
        access_key_id: credentials.access_key_id().to_string(),
        secret_access_key: Secret::new(credentials.secret_access_key()),
        session_token: Secret::new(credentials.session_token()),
        expiration: DateTime::from_timestamp(expiration.secs(), expiration.subsec_nanos())
            .unwrap_or_default(),
    })
}

impl AwsSettings {
    /// An object store over `bucket` with these settings: the catalog's
    /// keys, or the default chain's, resolved once (what a listing of a
    /// table's location runs with).
    pub(crate) async fn object_store(
        &self,
        bucket: &str,
    ) -> Result<std::sync::Arc<dyn object_store::ObjectStore>> {
        let credentials = credentials_of(
            &self.credentials_provider().await?,
            &format!("bucket '{bucket}'"),
        )
        .await?;
        let mut builder = object_store::aws::AmazonS3Builder::new()
            .with_bucket_name(bucket)
            .with_region(&self.region)
            .with_access_key_id(credentials.access_key_id())
            .with_secret_access_key(credentials.secret_access_key());
        if let Some(token) = credentials.session_token() {
            builder = builder.with_token(token);
        }
        if let Some(endpoint) = &self.s3_endpoint {
            builder = builder
                .with_endpoint(endpoint)
                .with_allow_http(true)
                .with_virtual_hosted_style_request(false);
        }
        Ok(std::sync::Arc::new(builder.build().map_err(|e| {
            Error::Config(format!("cannot reach bucket '{bucket}': {e}"))
        })?))
    }
}
