//! Remote signing: the REST catalog signs a session's storage requests one
//! by one with the service's own credentials (Iceberg's S3 signer protocol:
//! method, region, uri and headers in; the uri and the headers to add out),
//! so the client never holds a key and every request is decided alone.
//!
//! What a session may have signed ([`Scope`]):
//! - reads (`GET`/`HEAD` of an object, a listing whose prefix lies inside)
//!   under the table's location;
//! - with write access (an open upload), the creation of *new* objects: a
//!   `PUT` (signed with `If-None-Match: *`, so an existing object is never
//!   replaced) or a multipart upload (started, parts, completed with
//!   `If-None-Match: *`), under the table's `data/` and `files/` folders
//!   (the files rows reference), and in its
//!   `metadata/` folder only the Avro manifests and manifest lists an
//!   Iceberg client writes before it commits (never a metadata JSON file,
//!   which only the catalog writes);
//! - never a `DELETE`, a copy from elsewhere, a change of an object's ACL,
//!   storage class or encryption, or any other request.
//!
//! The signature covers the host, every `x-amz-*` header, `content-md5`,
//! `content-type` and the `If-None-Match` condition, so none of them can be
//! changed or dropped afterwards.

use std::collections::BTreeMap;
use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PayloadChecksumKind, SignableBody, SignableRequest, SigningSettings, sign,
};
use aws_sigv4::sign::v4;

use crate::aws::AwsSettings;
use crate::catalog::confine::is_under;

/// The body of a signing request, as the protocol defines it (its
/// `region` is not read: a request is signed for the region of the store
/// the service reaches).
#[derive(Debug, Clone, serde::Deserialize)]
pub(crate) struct SignRequest {
    /// The request's URL.
    pub(crate) uri: String,
    /// The HTTP method.
    pub(crate) method: String,
    /// The request's headers, each with its values.
    #[serde(default)]
    pub(crate) headers: BTreeMap<String, Vec<String>>,
}

/// The answer: the URL to send and the headers to add.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct SignResponse {
    /// The URL (unchanged).
    pub(crate) uri: String,
    /// Headers to add to the request: the signature and what it covers
    /// that the request lacked.
    pub(crate) headers: BTreeMap<String, Vec<String>>,
}

/// Most headers one signing request may carry.
pub(crate) const MAX_HEADERS: usize = 64;
/// Longest URL or header value accepted.
pub(crate) const MAX_VALUE: usize = 8 * 1024;

/// What one session may have signed: reads under `location` (the table's
/// location, `s3://bucket/prefix`), and with `write`, new objects as the
/// module documentation says.
#[derive(Debug, Clone)]
pub(crate) struct Scope<'a> {
    pub(crate) location: &'a str,
    pub(crate) write: bool,
    /// Objects (`s3://bucket/key`) it may read besides its location: the
    /// files a download's rows name.
    pub(crate) reads: Option<&'a std::collections::HashSet<String>>,
}

/// A request the scope allows, as it will be signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Allowed {
    /// The object (or, for a listing, the prefix) as `s3://bucket/key`.
    pub(crate) path: String,
    /// Whether it creates an object: signed with `If-None-Match: *`.
    pub(crate) creates: bool,
}

/// Headers a request may carry besides `x-amz-*` ones, signed when present.
const SIGNED_PLAIN: [&str; 3] = ["content-md5", "content-type", "if-none-match"];

/// `x-amz-*` headers a request may carry (each signed): a body's digest
/// and checksums, user metadata, a streamed body's framing.
fn allowed_amz(name: &str) -> bool {
    name.starts_with("x-amz-checksum-")
        || name.starts_with("x-amz-meta-")
        || matches!(
            name,
            "x-amz-content-sha256"
                | "x-amz-date"
                | "x-amz-sdk-checksum-algorithm"
                | "x-amz-decoded-content-length"
                | "x-amz-trailer"
                | "x-amz-user-agent"
                | "x-amz-expected-bucket-owner"
                | "x-amz-security-token"
        )
}

/// Whether `request` is one `scope` allows on the store `aws` reaches (its
/// `s3.endpoint`, path-style or virtual-hosted under its host, or without
/// one AWS in its region): what it reaches, or why not (the refusal a
/// client sees, naming the request).
pub(crate) fn check(
    scope: &Scope<'_>,
    aws: &AwsSettings,
    request: &SignRequest,
) -> Result<Allowed, String> {
    let method = request.method.to_ascii_uppercase();
    if request.uri.len() > MAX_VALUE || request.headers.len() > MAX_HEADERS {
        return Err(format!(
            "the request is too large to sign: at most {MAX_HEADERS} headers and {MAX_VALUE} \
             bytes of URL"
        ));
    }
    for (name, values) in &request.headers {
        let name = name.to_ascii_lowercase();
        if values.iter().any(|v| v.len() > MAX_VALUE) {
            return Err(format!("header {name} is too long to sign"));
        }
        if name.starts_with("x-amz-") && !allowed_amz(&name) {
            return Err(format!(
                "{method} with header {name} is not signed: a session may not copy objects, \
                 change their access, storage class or encryption"
            ));
        }
    }
    // As sent: URL parsing resolves dot segments, which S3 keeps as part
    // of a key, so a path that has any is refused before it is parsed.
    let raw_path = request
        .uri
        .split_once("://")
        .map_or("", |(_, rest)| rest)
        .split(['?', '#'])
        .next()
        .unwrap_or_default();
    if raw_path.split('/').any(|segment| {
        let lowered = segment.to_ascii_lowercase().replace("%2e", ".");
        lowered == "." || lowered == ".."
    }) {
        return Err(format!(
            "{method} {}: a path with '.' or '..' segments is not signed",
            request.uri
        ));
    }
    let url = url::Url::parse(&request.uri)
        .map_err(|e| format!("'{}' is not a URL: {e}", request.uri))?;
    let (bucket, key) = addressed(aws, &url)?;
    let query: Vec<(String, String)> = url
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let has = |name: &str| query.iter().any(|(k, _)| k == name);
    let only = |allowed: &[&str]| query.iter().all(|(k, _)| allowed.contains(&k.as_str()));
    let path = format!("s3://{bucket}/{key}");
    let inside = is_under(&path, scope.location);
    let refuse = |why: &str| {
        Err(format!(
            "{method} {path}{}: {why}",
            if query.is_empty() {
                String::new()
            } else {
                format!("?{}", url.query().unwrap_or_default())
            }
        ))
    };
    let outside = || {
        refuse(&format!(
            "outside this session's table ({})",
            scope.location
        ))
    };
    match method.as_str() {
        // A listing: GET on the bucket with a prefix inside the location.
        "GET" if key.is_empty() => {
            let prefix = query
                .iter()
                .find(|(k, _)| k == "prefix")
                .map(|(_, v)| v.as_str())
                .unwrap_or_default();
            let listed = format!("s3://{bucket}/{}", prefix.trim_end_matches('/'));
            if !has("list-type")
                || !only(&[
                    "list-type",
                    "prefix",
                    "delimiter",
                    "max-keys",
                    "continuation-token",
                    "start-after",
                    "encoding-type",
                    "fetch-owner",
                ])
            {
                return refuse("only a ListObjectsV2 listing of a bucket is signed");
            }
            if !is_under(&listed, scope.location) {
                return Err(format!(
                    "a listing of s3://{bucket}/{prefix} reaches outside this session's table \
                     ({}): list under it",
                    scope.location
                ));
            }
            Ok(Allowed {
                path: listed,
                creates: false,
            })
        }
        "GET" | "HEAD" => {
            if !inside && !scope.reads.is_some_and(|reads| reads.contains(&path)) {
                return outside();
            }
            if !only(&["partNumber"]) {
                return refuse("a read takes no other parameter than partNumber");
            }
            Ok(Allowed {
                path,
                creates: false,
            })
        }
        "PUT" | "POST" => {
            if !scope.write {
                return refuse("this session reads its table; it cannot write");
            }
            if !inside {
                return outside();
            }
            if let Err(why) = writable(scope.location, &path) {
                return refuse(&why);
            }
            let creates = match (method.as_str(), query.len()) {
                // PutObject: a new object.
                ("PUT", 0) => true,
                // UploadPart: a part of an upload this key started.
                ("PUT", 2) if has("partNumber") && has("uploadId") => false,
                // CreateMultipartUpload.
                ("POST", 1) if has("uploads") => false,
                // CompleteMultipartUpload: the object appears now.
                ("POST", 1) if has("uploadId") => true,
                _ => {
                    return refuse(
                        "a session writes new objects only (PutObject or a multipart upload)",
                    );
                }
            };
            Ok(Allowed { path, creates })
        }
        "DELETE" => refuse("a session never deletes"),
        _ => refuse("not a request a session makes"),
    }
}

/// Whether an object at `path` may be created under `location`: in its
/// `data/` folder, in its `files/` folder (the files rows reference), or an
/// Avro file in its `metadata/` folder.
fn writable(location: &str, path: &str) -> Result<(), String> {
    let base = location.trim_end_matches('/');
    if is_under(path, &format!("{base}/data")) || is_under(path, &format!("{base}/files")) {
        return Ok(());
    }
    if is_under(path, &format!("{base}/metadata")) {
        if path.ends_with(".avro") && !path.ends_with(".metadata.json") {
            return Ok(());
        }
        return Err(
            "under metadata/ a session writes only Avro manifests and manifest lists; the \
             catalog writes the table's metadata"
                .to_string(),
        );
    }
    Err(
        "a session writes under its table's data/ and files/ (and manifests under metadata/)"
            .to_string(),
    )
}

/// The bucket and (percent-decoded) key `url` addresses on `store`:
/// path-style (`<endpoint>/<bucket>/<key>`) or virtual-hosted
/// (`<bucket>.<host>/<key>`); a URL of any other host is refused.
fn addressed(aws: &AwsSettings, url: &url::Url) -> Result<(String, String), String> {
    let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
    let hosts: Vec<String> = match aws
        .s3_endpoint
        .as_deref()
        .and_then(|e| url::Url::parse(e).ok())
    {
        Some(endpoint) => {
            if endpoint.scheme() != url.scheme() || endpoint.port() != url.port() {
                return Err(format!(
                    "{url} is not on the store this service signs for ({})",
                    endpoint.origin().ascii_serialization()
                ));
            }
            vec![endpoint.host_str().unwrap_or_default().to_ascii_lowercase()]
        }
        None => vec![
            format!("s3.{}.amazonaws.com", aws.region),
            "s3.amazonaws.com".to_string(),
        ],
    };
    let path = percent_encoding::percent_decode_str(url.path())
        .decode_utf8()
        .map_err(|_| format!("{url}: the path is not UTF-8"))?
        .into_owned();
    let path = path.trim_start_matches('/');
    if hosts.contains(&host) {
        let (bucket, key) = path.split_once('/').unwrap_or((path, ""));
        if bucket.is_empty() {
            return Err(format!("{url} names no bucket"));
        }
        return Ok((bucket.to_string(), key.to_string()));
    }
    for known in &hosts {
        if let Some(bucket) = host.strip_suffix(&format!(".{known}"))
            && !bucket.is_empty()
        {
            return Ok((bucket.to_string(), path.to_string()));
        }
    }
    Err(format!(
        "{url} is not on the store this service signs for ({})",
        hosts.join(", ")
    ))
}

/// Signs `request` (checked: `allowed`) with `credentials` for S3 in
/// `region`: the headers to add, the signature's among them.
pub(crate) fn sign_request(
    request: &SignRequest,
    allowed: &Allowed,
    credentials: &Credentials,
    region: &str,
    now: SystemTime,
) -> Result<SignResponse, String> {
    let mut signed: Vec<(String, String)> = vec![];
    let mut added: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let lower: BTreeMap<String, &Vec<String>> = request
        .headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect();
    for (name, values) in &lower {
        let covered = (name.starts_with("x-amz-")
            && !matches!(name.as_str(), "x-amz-date" | "x-amz-security-token"))
            || SIGNED_PLAIN.contains(&name.as_str());
        if covered && !(allowed.creates && name == "if-none-match") {
            signed.push((name.clone(), values.join(", ")));
        }
    }
    if allowed.creates {
        signed.push(("if-none-match".to_string(), "*".to_string()));
        added.insert("if-none-match".to_string(), vec!["*".to_string()]);
    }
    let payload = match lower.get("x-amz-content-sha256") {
        Some(values) => values.join(", "),
        None => {
            let unsigned = "UNSIGNED-PAYLOAD".to_string();
            signed.push(("x-amz-content-sha256".to_string(), unsigned.clone()));
            added.insert("x-amz-content-sha256".to_string(), vec![unsigned.clone()]);
            unsigned
        }
    };
    let identity = credentials.clone().into();
    let mut settings = SigningSettings::default();
    // The digest header is the client's (or set above), not computed here.
    settings.payload_checksum_kind = PayloadChecksumKind::NoHeader;
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("s3")
        .time(now)
        .settings(settings)
        .build()
        .map_err(|e| e.to_string())?
        .into();
    let method = request.method.to_ascii_uppercase();
    let signable = SignableRequest::new(
        &method,
        &request.uri,
        signed.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        SignableBody::Precomputed(payload),
    )
    .map_err(|e| e.to_string())?;
    let (instructions, _) = sign(signable, &params)
        .map_err(|e| e.to_string())?
        .into_parts();
    for (name, value) in instructions.headers() {
        added.insert(name.to_ascii_lowercase(), vec![value.to_string()]);
    }
    Ok(SignResponse {
        uri: request.uri.clone(),
        headers: added,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCATION: &str = "s3://lake/staging/upload_1";

    fn request(method: &str, uri: &str, headers: &[(&str, &str)]) -> SignRequest {
        SignRequest {
            uri: uri.to_string(),
            method: method.to_string(),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), vec![v.to_string()]))
                .collect(),
        }
    }

    /// The settings of a catalog configured with `config`.
    fn store(config: &[(&str, &str)]) -> AwsSettings {
        AwsSettings::from_config(
            &config
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
        .unwrap()
    }

    fn verdict(write: bool, method: &str, uri: &str, headers: &[(&str, &str)]) -> String {
        let scope = Scope {
            location: LOCATION,
            write,
            reads: None,
        };
        let store = store(&[("s3.endpoint", "http://127.0.0.1:5000")]);
        match check(&scope, &store, &request(method, uri, headers)) {
            Ok(allowed) if allowed.creates => "create".to_string(),
            Ok(_) => "ok".to_string(),
            Err(why) => why,
        }
    }

    #[test]
    fn a_session_gets_reads_inside_and_new_objects_under_data_and_files_only() {
        let at = |key: &str| format!("http://127.0.0.1:5000/lake/staging/upload_1/{key}");
        let data = at("data/part-0.parquet");
        assert_eq!(verdict(true, "PUT", &data, &[]), "create");
        assert_eq!(
            verdict(true, "PUT", &at("files/photos/1.png"), &[]),
            "create"
        );
        assert!(verdict(false, "PUT", &at("files/photos/1.png"), &[]).contains("cannot write"));
        assert_eq!(verdict(true, "GET", &data, &[]), "ok");
        assert_eq!(verdict(false, "HEAD", &data, &[]), "ok");
        assert_eq!(
            verdict(true, "PUT", &at("metadata/snap-1.avro"), &[]),
            "create"
        );
        let multipart = format!("{data}?uploads");
        assert_eq!(verdict(true, "POST", &multipart, &[]), "ok");
        assert_eq!(
            verdict(true, "PUT", &format!("{data}?partNumber=1&uploadId=x"), &[]),
            "ok"
        );
        assert_eq!(
            verdict(true, "POST", &format!("{data}?uploadId=x"), &[]),
            "create"
        );
        let listing = "http://127.0.0.1:5000/lake?list-type=2&prefix=staging/upload_1/data/";
        assert_eq!(verdict(false, "GET", listing, &[]), "ok");

        for (write, method, uri, headers, expected) in [
            (true, "DELETE", data.clone(), vec![], "never deletes"),
            (false, "PUT", data.clone(), vec![], "cannot write"),
            (
                true,
                "PUT",
                at("metadata/00001-x.metadata.json"),
                vec![],
                "only Avro manifests",
            ),
            (
                true,
                "PUT",
                at("other/x"),
                vec![],
                "writes under its table's data/ and files/",
            ),
            (
                true,
                "GET",
                "http://127.0.0.1:5000/lake/staging/upload_2/data/x".to_string(),
                vec![],
                "outside this session's table",
            ),
            (
                true,
                "GET",
                "http://127.0.0.1:5000/lake/other/../staging/upload_1/data/x".to_string(),
                vec![],
                "'.' or '..' segments",
            ),
            (
                true,
                "GET",
                "http://127.0.0.1:5000/lake/staging/upload_1/data/%2e%2e/%2e%2e/upload_2/x"
                    .to_string(),
                vec![],
                "'.' or '..' segments",
            ),
            (
                true,
                "GET",
                "http://evil.example:5000/lake/staging/upload_1/data/x".to_string(),
                vec![],
                "not on the store",
            ),
            (
                true,
                "PUT",
                data.clone(),
                vec![("x-amz-copy-source", "/lake/elsewhere")],
                "may not copy objects",
            ),
            (
                true,
                "PUT",
                data.clone(),
                vec![("X-Amz-Storage-Class", "GLACIER")],
                "storage class",
            ),
            (
                true,
                "POST",
                "http://127.0.0.1:5000/lake?delete".to_string(),
                vec![],
                "outside this session's table",
            ),
            (
                false,
                "GET",
                "http://127.0.0.1:5000/lake?list-type=2&prefix=staging/".to_string(),
                vec![],
                "reaches outside",
            ),
        ] {
            let refused = verdict(write, method, &uri, &headers);
            assert!(refused.contains(expected), "{method} {uri}: {refused}");
        }
    }

    #[test]
    fn a_download_reads_the_files_its_rows_name_and_nothing_beside_them() {
        let named =
            std::collections::HashSet::from(["s3://lake/media/photos/files/u1/a.png".to_string()]);
        let scope = Scope {
            location: "s3://lake/downloads/download_1",
            write: false,
            reads: Some(&named),
        };
        let store = store(&[("s3.endpoint", "http://127.0.0.1:5000")]);
        let verdict = |method: &str, key: &str| {
            let uri = format!("http://127.0.0.1:5000/lake/{key}");
            match check(&scope, &store, &request(method, &uri, &[])) {
                Ok(_) => "ok".to_string(),
                Err(why) => why,
            }
        };
        assert_eq!(verdict("GET", "media/photos/files/u1/a.png"), "ok");
        assert_eq!(verdict("HEAD", "media/photos/files/u1/a.png"), "ok");
        assert_eq!(verdict("GET", "downloads/download_1/data/x.parquet"), "ok");
        for (method, key) in [
            ("GET", "media/photos/files/u1/b.png"),
            ("GET", "media/photos/files/u1/a.png.bak"),
            ("GET", "media/photos/files/u1/"),
        ] {
            assert!(
                verdict(method, key).contains("outside this session's table"),
                "{method} {key}: {}",
                verdict(method, key)
            );
        }
        assert!(verdict("PUT", "media/photos/files/u1/a.png").contains("cannot write"));
        assert!(verdict("DELETE", "media/photos/files/u1/a.png").contains("never deletes"));
    }

    #[test]
    fn a_virtual_hosted_request_is_read_by_its_host() {
        let scope = Scope {
            location: LOCATION,
            write: false,
            reads: None,
        };
        let aws = store(&[("region", "eu-west-1")]);
        let ok = request(
            "GET",
            "https://lake.s3.eu-west-1.amazonaws.com/staging/upload_1/data/a.parquet",
            &[],
        );
        assert!(check(&scope, &aws, &ok).is_ok());
        let other = request(
            "GET",
            "https://other.s3.eu-west-1.amazonaws.com/staging/upload_1/data/a.parquet",
            &[],
        );
        assert!(check(&scope, &aws, &other).is_err());
    }

    #[test]
    fn a_creation_is_signed_with_if_none_match() {
        let put = request(
            "PUT",
            "http://127.0.0.1:5000/lake/staging/upload_1/data/a.parquet",
            &[("Content-Type", "application/octet-stream")],
        );
        let allowed = Allowed {
            path: "s3://lake/staging/upload_1/data/a.parquet".to_string(),
            creates: true,
        };
        let credentials = Credentials::new("AKIDEXAMPLE", "secret", None, None, "test");
        let signed = sign_request(
            &put,
            &allowed,
            &credentials,
            "us-east-1",
            SystemTime::UNIX_EPOCH,
        )
        .unwrap();
        assert_eq!(signed.headers["if-none-match"], ["*"]);
        assert_eq!(signed.headers["x-amz-content-sha256"], ["UNSIGNED-PAYLOAD"]);
        let authorization = &signed.headers["authorization"][0];
        assert!(
            authorization.contains(
                "SignedHeaders=content-type;host;if-none-match;x-amz-content-sha256;x-amz-date"
            ),
            "{authorization}"
        );
    }
}
