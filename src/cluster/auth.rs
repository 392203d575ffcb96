//! Who may speak to a cluster: the scheduler, its executors and icestage's
//! clients share a secret, and every gRPC call between them carries proof
//! of it. A peer without it is refused before any handler runs, so nobody
//! who merely reaches a port can submit a job, register as an executor or
//! fetch an executor's shuffle files.
//!
//! The proof is a digest of the secret, sent where Ballista's connection
//! hook lets a caller put it (the `user-agent` header of each call; the
//! hook can change a connection's endpoint, not add headers). It shows that
//! the caller holds the secret without sending the secret itself, but it
//! is a bearer proof: across networks nobody may watch, give the cluster
//! TLS ([`ClusterTls`]): its scheduler and executors then serve only TLS,
//! with a certificate that chains to an authority every peer and client is
//! given, and every connection the processes and clients open is TLS.

use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};

use ballista_core::extension::EndpointOverrideFn;
use sha2::{Digest, Sha256};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};
use tonic::{Request, Status};

use crate::error::{Error, Result};

/// The environment variable naming the secret's file, for every role.
pub const SECRET_FILE_VARIABLE: &str = "ICESTAGE_CLUSTER_SECRET_FILE";

/// The shortest secret accepted, in bytes.
const SHORTEST: usize = 16;

/// The longest secret file read, in bytes.
const LONGEST: u64 = 4096;

/// What the proof starts with, to tell it from other user agents.
const PREFIX: &str = "icestage-cluster/";

/// Where to get a secret made.
const HOW_TO_MAKE: &str = "make one with `head -c 32 /dev/urandom | base64 > cluster.secret`";

/// The environment variables naming a cluster's TLS files (PEM): this
/// process's certificate and key (a scheduler's, an executor's) and the
/// authority peers' certificates chain to.
pub const TLS_FILE_VARIABLES: [&str; 3] = [
    "ICESTAGE_CLUSTER_TLS_CERT_FILE",
    "ICESTAGE_CLUSTER_TLS_KEY_FILE",
    "ICESTAGE_CLUSTER_TLS_CA_FILE",
];

/// The longest TLS file read, in bytes.
const LONGEST_PEM: u64 = 1 << 20;

/// A cluster's shared secret, as the proof its peers send, and its TLS
/// when it has one.
#[derive(Clone)]
pub struct ClusterSecret {
    proof: Arc<str>,
    tls: Option<Arc<ClusterTls>>,
}

impl PartialEq for ClusterSecret {
    fn eq(&self, other: &Self) -> bool {
        self.proof == other.proof
    }
}

impl Eq for ClusterSecret {}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

impl ClusterSecret {
    /// The secret in `path` (surrounding white space ignored).
    pub fn from_file(path: &Path) -> Result<Self> {
        let named = || format!("cluster secret file '{}'", path.display());
        let file = std::fs::File::open(path).map_err(|e| {
            Error::Config(format!(
                "cannot read the {}: {e}; give every scheduler, executor and client the same \
                 file ({HOW_TO_MAKE})",
                named()
            ))
        })?;
        let text = read_up_to(file, LONGEST)
            .map_err(|e| Error::Config(format!("cannot read the {}: {e}", named())))?
            .ok_or_else(|| {
                Error::Config(format!(
                    "the {} is longer than {LONGEST} bytes: it should hold one secret \
                     ({HOW_TO_MAKE})",
                    named()
                ))
            })?;
        let secret = text.trim_ascii();
        if secret.len() < SHORTEST {
            return Err(Error::Config(format!(
                "the {} holds {} bytes; a cluster secret needs at least {SHORTEST} ({HOW_TO_MAKE})",
                named(),
                secret.len()
            )));
        }
        Ok(Self::of(secret))
    }

    /// The secret of the file `path` names, or else of the file the
    /// environment names ([`SECRET_FILE_VARIABLE`]); `None` when neither does.
    pub fn from_file_or_env(path: Option<&Path>) -> Result<Option<Self>> {
        given_or_env(path, SECRET_FILE_VARIABLE)
            .map(|p| Self::from_file(&p))
            .transpose()
    }

    /// A fresh secret that only this process knows (an in-process cluster's).
    pub(crate) fn random() -> Self {
        Self::of(&rand::random::<[u8; 32]>())
    }

    fn of(secret: &[u8]) -> Self {
        let mut digest = Sha256::new();
        digest.update(b"icestage cluster secret v1\0");
        digest.update(secret);
        Self {
            proof: format!("{PREFIX}{}", hex::encode(digest.finalize())).into(),
            tls: None,
        }
    }

    /// This secret on connections secured by `tls` (none: plain ones).
    pub fn with_tls(mut self, tls: Option<ClusterTls>) -> Self {
        self.tls = tls.map(Arc::new);
        self
    }

    /// The TLS this process's ports serve with, if the cluster has TLS.
    pub(crate) fn serving_tls(&self) -> Result<Option<ServerTlsConfig>> {
        let Some(tls) = &self.tls else {
            return Ok(None);
        };
        let identity = tls.identity.clone().ok_or_else(|| {
            Error::Config(format!(
                "a TLS cluster's scheduler and executors serve with a certificate and its key: \
                 --tls-cert and --tls-key (or {} and {})",
                TLS_FILE_VARIABLES[0], TLS_FILE_VARIABLES[1]
            ))
        })?;
        Ok(Some(ServerTlsConfig::new().identity(identity)))
    }

    /// Makes each connection a Ballista client opens carry the proof, over
    /// TLS when the cluster has it.
    pub(crate) fn endpoint_override(&self) -> EndpointOverrideFn {
        let proof = Arc::clone(&self.proof);
        let tls = self.tls.clone();
        Arc::new(move |endpoint| {
            let endpoint = match &tls {
                Some(tls) => tls.secure(endpoint)?,
                None => endpoint,
            };
            Ok(endpoint.user_agent(proof.as_ref())?)
        })
    }

    /// Refuses a call that does not carry the proof.
    pub(crate) fn check(&self, request: Request<()>) -> std::result::Result<Request<()>, Status> {
        // The client library appends its own name after a space.
        let sent = request
            .metadata()
            .get("user-agent")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(' ').next())
            .unwrap_or("");
        if crate::secret::equal_time(sent.as_bytes(), self.proof.as_bytes()) {
            Ok(request)
        } else if sent.starts_with(PREFIX) {
            Err(Status::unauthenticated(format!(
                "this icestage cluster refused the caller: its cluster secret differs from the \
                 scheduler's; give every scheduler, executor and client the same secret file \
                 (--secret-file, {SECRET_FILE_VARIABLE} or SET icestage.cluster_secret_file)"
            )))
        } else {
            Err(Status::unauthenticated(format!(
                "this icestage cluster refused the caller: it sent no cluster secret; start it \
                 with the cluster's secret file (--secret-file, {SECRET_FILE_VARIABLE} or SET \
                 icestage.cluster_secret_file)"
            )))
        }
    }

    /// The check as a tonic interceptor.
    pub(crate) fn interceptor(
        &self,
    ) -> impl FnMut(Request<()>) -> std::result::Result<Request<()>, Status> + Clone + use<> {
        let secret = self.clone();
        move |request| secret.check(request)
    }
}

/// A cluster's TLS: the authority its certificates chain to, and this
/// process's own certificate and key when it serves.
#[derive(Clone)]
pub struct ClusterTls {
    authority: Certificate,
    identity: Option<Identity>,
}

impl std::fmt::Debug for ClusterTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterTls")
            .field("serves", &self.identity.is_some())
            .finish()
    }
}

impl ClusterTls {
    /// The TLS of the PEM files given (`cert`, `key`, `ca`), each else the
    /// one its environment variable names ([`TLS_FILE_VARIABLES`]); `None`
    /// when none is given. A certificate needs its key; without an
    /// authority, a process's own certificate is the one its peers' must
    /// match (a self-signed cluster certificate).
    pub fn from_files_or_env(
        cert: Option<&Path>,
        key: Option<&Path>,
        ca: Option<&Path>,
    ) -> Result<Option<Self>> {
        let cert = given_or_env(cert, TLS_FILE_VARIABLES[0]);
        let key = given_or_env(key, TLS_FILE_VARIABLES[1]);
        let ca = given_or_env(ca, TLS_FILE_VARIABLES[2]);
        let identity = match (&cert, &key) {
            (Some(cert), Some(key)) => Some((
                read_pem(cert, "certificate", "CERTIFICATE-----")?,
                read_pem(key, "private key", "PRIVATE KEY-----")?,
            )),
            (None, None) => None,
            (Some(_), None) | (None, Some(_)) => {
                return Err(Error::Config(format!(
                    "a cluster's TLS certificate needs its key and the key its certificate: give \
                     both (--tls-cert and --tls-key, or {} and {})",
                    TLS_FILE_VARIABLES[0], TLS_FILE_VARIABLES[1]
                )));
            }
        };
        let authority = match (&ca, &identity) {
            (Some(ca), _) => read_pem(ca, "certificate authority", "CERTIFICATE-----")?,
            (None, Some((cert, _))) => cert.clone(),
            (None, None) => return Ok(None),
        };
        // tonic's server side takes the process's default provider; this
        // build links two, so one is named once, before any is used.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Ok(Some(Self {
            authority: Certificate::from_pem(authority),
            identity: identity.map(|(cert, key)| Identity::from_pem(cert, key)),
        }))
    }

    /// `endpoint` over TLS: its scheme made `https` (Ballista names its
    /// peers `http://HOST:PORT`), trusting the cluster's authority only.
    fn secure(
        &self,
        endpoint: Endpoint,
    ) -> std::result::Result<Endpoint, Box<dyn std::error::Error + Send + Sync>> {
        let uri = endpoint.uri();
        let endpoint = if uri.scheme_str() == Some("https") {
            endpoint
        } else {
            let authority = uri.authority().map_or("", |a| a.as_str());
            ballista_core::utils::create_grpc_client_endpoint(format!("https://{authority}"), None)?
        };
        Ok(endpoint.tls_config(ClientTlsConfig::new().ca_certificate(self.authority.clone()))?)
    }
}

/// `given`, or else the file the environment variable `variable` names
/// (unset or empty: none).
fn given_or_env(given: Option<&Path>, variable: &str) -> Option<PathBuf> {
    given.map(Path::to_path_buf).or_else(|| {
        std::env::var_os(variable)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
}

/// What `file` holds, when it is at most `longest` bytes (only one byte
/// more is read to know).
fn read_up_to(file: std::fs::File, longest: u64) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let mut text = vec![];
    file.take(longest + 1).read_to_end(&mut text)?;
    Ok((text.len() as u64 <= longest).then_some(text))
}

/// The PEM file at `path` (a `what`), which must hold `marker`.
fn read_pem(path: &Path, what: &str, marker: &str) -> Result<Vec<u8>> {
    let named = || format!("the cluster's TLS {what} file '{}'", path.display());
    let text = std::fs::File::open(path)
        .and_then(|file| read_up_to(file, LONGEST_PEM))
        .map_err(|e| Error::Config(format!("cannot read {}: {e}", named())))?;
    match text {
        Some(text) if text.windows(marker.len()).any(|w| w == marker.as_bytes()) => Ok(text),
        _ => Err(Error::Config(format!(
            "{} is not a PEM {what} (no '-----BEGIN ...{marker}' block within {} bytes)",
            named(),
            LONGEST_PEM
        ))),
    }
}

/// The secrets of this process's in-process clusters, by URL.
static IN_PROCESS: LazyLock<Mutex<Vec<(String, ClusterSecret)>>> =
    LazyLock::new(|| Mutex::new(Vec::new()));

/// Remembers the secret of an in-process cluster at `url`.
pub(crate) fn remember(url: &str, secret: &ClusterSecret) {
    if let Ok(mut known) = IN_PROCESS.lock() {
        known.push((url.to_string(), secret.clone()));
    }
}

/// The secret of the in-process cluster at `url`, if this process started one.
pub(crate) fn in_process(url: &str) -> Option<ClusterSecret> {
    IN_PROCESS
        .lock()
        .ok()?
        .iter()
        .find(|(u, _)| u == url)
        .map(|(_, s)| s.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_agent(agent: &str) -> Request<()> {
        let mut request = Request::new(());
        request
            .metadata_mut()
            .insert("user-agent", agent.parse().unwrap());
        request
    }

    #[test]
    fn only_the_same_secret_passes() {
        let ours = ClusterSecret::of(b"0123456789abcdef-ours");
        let theirs = ClusterSecret::of(b"0123456789abcdef-theirs");
        let sent = format!("{} tonic/0.14", ours.proof);
        assert!(ours.check(with_agent(&sent)).is_ok());
        let refused = theirs.check(with_agent(&sent)).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        assert!(
            refused.message().contains("differs"),
            "{}",
            refused.message()
        );
        for agent in ["tonic/0.14", "", "icestage-cluster/", PREFIX] {
            assert!(ours.check(with_agent(agent)).is_err(), "{agent}");
        }
        assert!(ours.check(Request::new(())).is_err());
        // The proof is not the secret.
        assert!(!ours.proof.contains("0123456789abcdef"));
    }

    #[test]
    fn secret_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, "tiny\n").unwrap();
        let message = ClusterSecret::from_file(&short).unwrap_err().to_string();
        assert!(
            message.contains("short") && message.contains("at least 16"),
            "{message}"
        );
        let long = dir.path().join("long");
        std::fs::write(&long, vec![b'x'; 5000]).unwrap();
        let message = ClusterSecret::from_file(&long).unwrap_err().to_string();
        assert!(message.contains("longer than 4096"), "{message}");
        let missing = ClusterSecret::from_file(&dir.path().join("none")).unwrap_err();
        assert!(missing.to_string().contains("none"), "{missing}");
        let good = dir.path().join("good");
        std::fs::write(&good, "  a-secret-of-enough-length \n").unwrap();
        let read = ClusterSecret::from_file(&good).unwrap();
        assert_eq!(
            read.proof,
            ClusterSecret::of(b"a-secret-of-enough-length").proof
        );
    }
}
