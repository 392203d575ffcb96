//! Copying objects between storages: by S3's server-side copy when both
//! lie in one bucket, so no byte passes through the service (`CopyObject`,
//! or for an object over one part, 5 GiB unless the catalog's
//! `s3.copy-part-size` says less, a multipart upload of `UploadPartCopy`
//! parts); otherwise (another bucket, a local file, a key object_store
//! cannot name) streamed in 8 MiB ranges (bounded memory). Promotion copies
//! staged data files and referenced files with it; downloads copy the
//! files their rows reference.

use std::collections::HashMap;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use iceberg::io::FileIO;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};

use super::IcebergCatalog;
use crate::error::{Error, Result};

/// Bytes per range request while copying a file.
const COPY_CHUNK: u64 = 8 * 1024 * 1024;
/// Parts of one multipart copy copied at once.
const PARTS_AT_ONCE: usize = 4;
/// Most parts of one multipart upload (S3's limit).
const MAX_PARTS: u64 = 10_000;

/// The bucket of `from` and `to` and their keys, when both are objects of
/// one S3 bucket whose keys object_store names exactly.
fn same_bucket(from: &str, to: &str) -> Option<(String, StorePath, StorePath)> {
    let split = |uri: &str| -> Option<(String, StorePath)> {
        let rest = uri
            .strip_prefix("s3://")
            .or_else(|| uri.strip_prefix("s3a://"))?;
        let (bucket, key) = rest.split_once('/')?;
        let path = StorePath::parse(key).ok()?;
        (path.as_ref() == key).then(|| (bucket.to_string(), path))
    };
    let (bucket, from) = split(from)?;
    let (other, to) = split(to)?;
    (bucket == other).then_some((bucket, from, to))
}

/// Copies objects of one table's storage into another's: by S3's
/// `CopyObject` within one bucket, streamed otherwise.
pub(crate) struct Copier {
    /// The catalog whose AWS settings reach both.
    catalog: Arc<IcebergCatalog>,
    from: FileIO,
    to: FileIO,
    /// One store per bucket, made on first use.
    stores: tokio::sync::Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
}

impl Copier {
    pub(crate) fn new(catalog: Arc<IcebergCatalog>, from: FileIO, to: FileIO) -> Self {
        Self {
            catalog,
            from,
            to,
            stores: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Copies `from` (in the first storage) to `to` (in the second); the
    /// bytes the copy holds, as the store reports them.
    pub(crate) async fn copy(&self, from: &str, to: &str) -> Result<u64> {
        if let Some((bucket, source, copy)) = same_bucket(from, to) {
            let store = {
                let mut stores = self.stores.lock().await;
                match stores.get(&bucket) {
                    Some(store) => Arc::clone(store),
                    None => {
                        let store = self.catalog.aws().object_store(&bucket).await?;
                        stores.insert(bucket.clone(), Arc::clone(&store));
                        store
                    }
                }
            };
            // The size the store reports, not the one the client's
            // manifest claims.
            let size = store.head(&source).await.map_err(store_error)?.size;
            let part = self.catalog.aws().copy_part_bytes()?;
            if size <= part {
                store.copy(&source, &copy).await.map_err(store_error)?;
            } else {
                let parts = PartCopy::start(self.catalog.aws(), &bucket, &source, &copy).await?;
                parts.copy(size, part).await?;
            }
            // What the copy holds, as the store reports it.
            let size = store.head(&copy).await.map_err(store_error)?.size;
            copied(size, "server_side");
            return Ok(size);
        }
        let size = stream_copy(&self.from, &self.to, from, to).await?;
        copied(size, "streamed");
        Ok(size)
    }
}

/// Copies `from` (in storage `source`) to `to` (in `sink`) through this
/// process, in [`COPY_CHUNK`] ranges; the bytes copied, as the store
/// reports the source's size (not a client's manifest).
async fn stream_copy(source: &FileIO, sink: &FileIO, from: &str, to: &str) -> Result<u64> {
    let input = source.new_input(from)?;
    let size = input.metadata().await?.size;
    let reader = input.reader().await?;
    let mut writer = sink.new_output(to)?.writer().await?;
    let mut offset = 0;
    while offset < size {
        let end = (offset + COPY_CHUNK).min(size);
        writer.write(reader.read(offset..end).await?).await?;
        offset = end;
    }
    writer.close().await?;
    Ok(size)
}

/// One multipart upload that copies an object of a bucket to another key
/// of it, part by part, by S3's `UploadPartCopy`: the store moves the
/// bytes. Signed with the catalog's credentials.
struct PartCopy {
    http: reqwest::Client,
    credentials: aws_credential_types::Credentials,
    region: String,
    /// The copy's URL.
    url: String,
    /// `x-amz-copy-source`: the source as `/<bucket>/<key>`.
    source: String,
    upload_id: String,
}

impl PartCopy {
    /// Starts the multipart upload of `copy`, a copy of `source`.
    async fn start(
        aws: &crate::aws::AwsSettings,
        bucket: &str,
        source: &StorePath,
        copy: &StorePath,
    ) -> Result<Self> {
        let credentials = crate::aws::credentials_of(
            &aws.credentials_provider().await?,
            &format!("copying within bucket '{bucket}'"),
        )
        .await?;
        let mut parts = Self {
            http: reqwest::Client::new(),
            credentials,
            region: aws.region.clone(),
            url: aws.object_url(bucket, &encode_key(copy.as_ref())),
            source: format!("/{bucket}/{}", encode_key(source.as_ref())),
            upload_id: String::new(),
        };
        let started = parts.send("POST", "uploads", &[], String::new()).await?;
        parts.upload_id = element(&started, "UploadId")
            .ok_or_else(|| part_error("CreateMultipartUpload", &started))?
            .to_string();
        Ok(parts)
    }

    /// Copies `size` bytes in parts of `part` bytes, a few at once, and
    /// completes the upload; aborts it on any failure, so no part is left.
    async fn copy(&self, size: u64, part: u64) -> Result<()> {
        let done = self.copy_parts(size, part).await;
        if done.is_err() {
            let query = format!("uploadId={}", encode_key(&self.upload_id));
            let _ = self.send("DELETE", &query, &[], String::new()).await;
        }
        done
    }

    async fn copy_parts(&self, size: u64, part: u64) -> Result<()> {
        // Parts no smaller than asked, and few enough for S3.
        let part = part.max(size.div_ceil(MAX_PARTS));
        let ranges =
            (0..size.div_ceil(part)).map(|n| (n + 1, n * part, ((n + 1) * part).min(size)));
        let etags: Vec<(u64, String)> = futures::stream::iter(ranges)
            .map(|(number, start, end)| async move {
                let query = format!(
                    "partNumber={number}&uploadId={}",
                    encode_key(&self.upload_id)
                );
                let headers = [
                    ("x-amz-copy-source", self.source.clone()),
                    (
                        "x-amz-copy-source-range",
                        format!("bytes={start}-{}", end - 1),
                    ),
                ];
                let answer = self.send("PUT", &query, &headers, String::new()).await?;
                let etag = element(&answer, "ETag")
                    .ok_or_else(|| part_error("UploadPartCopy", &answer))?;
                Ok::<_, Error>((number, etag.to_string()))
            })
            .buffered(PARTS_AT_ONCE)
            .try_collect()
            .await?;
        let body: String = etags
            .iter()
            .map(|(n, etag)| {
                format!("<Part><PartNumber>{n}</PartNumber><ETag>{etag}</ETag></Part>")
            })
            .collect();
        let body = format!("<CompleteMultipartUpload>{body}</CompleteMultipartUpload>");
        let query = format!("uploadId={}", encode_key(&self.upload_id));
        let answer = self.send("POST", &query, &[], body).await?;
        // S3 may answer 200 with an error in the body.
        match element(&answer, "Code") {
            Some(_) => Err(part_error("CompleteMultipartUpload", &answer)),
            None => Ok(()),
        }
    }

    /// Sends one signed request to the copy's URL with `query`; its body.
    async fn send(
        &self,
        method: &str,
        query: &str,
        headers: &[(&str, String)],
        body: String,
    ) -> Result<String> {
        use aws_sigv4::http_request::{
            PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
            UriPathNormalizationMode, sign,
        };
        use sha2::{Digest, Sha256};

        let url = format!("{}?{query}", self.url);
        let payload = hex::encode(Sha256::digest(body.as_bytes()));
        let mut signed: Vec<(&str, String)> = headers.to_vec();
        signed.push(("x-amz-content-sha256", payload.clone()));
        let identity = self.credentials.clone().into();
        let mut settings = SigningSettings::default();
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name("s3")
            .time(std::time::SystemTime::now())
            .settings(settings)
            .build()
            .map_err(|e| Error::internal(format!("signing a copy request: {e}")))?
            .into();
        let signable = SignableRequest::new(
            method,
            &url,
            signed.iter().map(|(k, v)| (*k, v.as_str())),
            SignableBody::Precomputed(payload.clone()),
        )
        .map_err(|e| Error::internal(format!("signing a copy request: {e}")))?;
        let (instructions, _) = sign(signable, &params)
            .map_err(|e| Error::internal(format!("signing a copy request: {e}")))?
            .into_parts();
        let method = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|e| Error::internal(format!("a copy request's method: {e}")))?;
        let mut request = self.http.request(method, &url).body(body);
        for (name, value) in &signed {
            request = request.header(*name, value);
        }
        for (name, value) in instructions.headers() {
            request = request.header(name, value);
        }
        let response = request.send().await.map_err(|e| {
            copy_error(format!(
                "copying to {}: the store did not answer: {e}",
                self.url
            ))
        })?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        if !status.is_success() {
            return Err(copy_error(format!(
                "copying to {} in parts: the store answered {status}: {}",
                self.url,
                text.chars().take(500).collect::<String>()
            )));
        }
        Ok(text)
    }
}

/// The text of the first `<name>` element of an S3 XML answer.
fn element<'a>(xml: &'a str, name: &str) -> Option<&'a str> {
    let start = xml.find(&format!("<{name}>"))? + name.len() + 2;
    let end = xml[start..].find(&format!("</{name}>"))? + start;
    Some(&xml[start..end])
}

/// A multipart copy's step that answered without what it should hold.
fn part_error(step: &str, answer: &str) -> Error {
    copy_error(format!(
        "copying in parts: {step} answered without what it should hold: {}",
        answer.chars().take(500).collect::<String>()
    ))
}

/// `key` percent-encoded as S3 signs a path: every byte but unreserved
/// ones and `/`.
fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for byte in key.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(byte as char)
            }
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

/// Counts `bytes` copied into a target's storage, `how`.
fn copied(bytes: u64, how: &'static str) {
    crate::metrics::count(
        "icestage_promotion_copied_bytes_total",
        "Bytes copied between storages before verification (a promotion's staged data and \
         referenced files, a download's included files), by how: server_side (S3 CopyObject, \
         no byte through the service) or streamed.",
        &[("how", how)],
        bytes as f64,
    );
}

/// An object store's error, as icestage's.
fn store_error(error: object_store::Error) -> Error {
    copy_error(format!("copying a file: {error}"))
}

/// A storage failure while copying, as icestage's (an upstream error).
fn copy_error(message: String) -> Error {
    Error::Iceberg(iceberg::Error::new(iceberg::ErrorKind::Unexpected, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_encoded_as_s3_signs_them_and_answers_read() {
        assert_eq!(
            encode_key("wh/a b/c+d=é.parquet"),
            "wh/a%20b/c%2Bd%3D%C3%A9.parquet"
        );
        let answer = "<InitiateMultipartUploadResult><Bucket>b</Bucket>\
                      <UploadId>abc-1</UploadId></InitiateMultipartUploadResult>";
        assert_eq!(element(answer, "UploadId"), Some("abc-1"));
        assert_eq!(element(answer, "ETag"), None);
    }

    #[test]
    fn a_server_side_copy_stays_in_one_bucket_and_names_keys_exactly() {
        let (bucket, from, to) = same_bucket(
            "s3://lake/wh/staging/upload_1/data/a.parquet",
            "s3://lake/wh/payments/t/data/icestage-1-00000.parquet",
        )
        .unwrap();
        assert_eq!(bucket, "lake");
        assert_eq!(from.as_ref(), "wh/staging/upload_1/data/a.parquet");
        assert_eq!(to.as_ref(), "wh/payments/t/data/icestage-1-00000.parquet");
        // Another bucket (S3 Tables gives each table its own), a local
        // file, or a key object_store would name differently: streamed.
        for (from, to) in [
            ("s3://staging-bucket/d/a.parquet", "s3://lake/d/b.parquet"),
            ("file:///tmp/a.parquet", "file:///tmp/b.parquet"),
            ("s3://lake/d//a.parquet", "s3://lake/d/b.parquet"),
        ] {
            assert!(same_bucket(from, to).is_none(), "{from}");
        }
    }
}
