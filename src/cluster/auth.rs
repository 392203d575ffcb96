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
//! is a bearer proof: across networks nobody may watch, run the cluster on
//! a private network or behind TLS-terminating proxies.

use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};

use ballista_core::extension::EndpointOverrideFn;
use sha2::{Digest, Sha256};
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

/// A cluster's shared secret, as the proof its peers send.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSecret {
    proof: Arc<str>,
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

impl ClusterSecret {
    /// The secret in `path` (surrounding white space ignored).
    pub fn from_file(path: &Path) -> Result<Self> {
        use std::io::Read;
        let named = || format!("cluster secret file '{}'", path.display());
        let file = std::fs::File::open(path).map_err(|e| {
            Error::Config(format!(
                "cannot read the {}: {e}; give every scheduler, executor and client the same \
                 file ({HOW_TO_MAKE})",
                named()
            ))
        })?;
        let mut text = Vec::new();
        file.take(LONGEST + 1)
            .read_to_end(&mut text)
            .map_err(|e| Error::Config(format!("cannot read the {}: {e}", named())))?;
        if text.len() as u64 > LONGEST {
            return Err(Error::Config(format!(
                "the {} is longer than {LONGEST} bytes: it should hold one secret ({HOW_TO_MAKE})",
                named()
            )));
        }
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
        let path = match path {
            Some(path) => Some(path.to_path_buf()),
            None => std::env::var_os(SECRET_FILE_VARIABLE)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
        };
        path.map(|p| Self::from_file(&p)).transpose()
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
        }
    }

    /// Makes each connection a Ballista client opens carry the proof.
    pub(crate) fn endpoint_override(&self) -> EndpointOverrideFn {
        let proof = Arc::clone(&self.proof);
        Arc::new(move |endpoint| Ok(endpoint.user_agent(proof.as_ref())?))
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
