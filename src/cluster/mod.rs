//! Past one machine: PROMOTE's proof and rules, CREATE DOWNLOAD's query and
//! COPY INTO run on an Apache DataFusion Ballista cluster when
//! `icestage.cluster` names one (`SET icestage.cluster = 'df://HOST:PORT'`).
//!
//! What travels: Iceberg tables as recipes (`recipe`) that executors scan,
//! join and aggregate; writes of a query's rows as new data files
//! (`write`); and jobs (`job`), work that is not a query, which the
//! layers above define (verifying an upload's files, loading a prefix's).
//! Executors only read and write data files and answer their descriptions;
//! the coordinator commits through the same exactly-once path as a local
//! run, so a lost or retried task can cost time and leave an unreferenced
//! file, never a second commit. Scheduler, executors and client must be the
//! same icestage build (the codecs and jobs are icestage's).
//!
//! Without the `cargo` feature `cluster` the setting is refused with how to
//! get it.

#[cfg(feature = "cluster")]
mod auth;
#[cfg(feature = "cluster")]
mod codec;
#[cfg(feature = "cluster")]
mod job;
#[cfg(feature = "cluster")]
mod process;
mod recipe;
#[cfg(feature = "cluster")]
mod write;

#[cfg(feature = "cluster")]
pub use auth::{ClusterSecret, ClusterTls, SECRET_FILE_VARIABLE, TLS_FILE_VARIABLES};
#[cfg(feature = "cluster")]
pub use codec::{IcestageLogicalCodec, IcestagePhysicalCodec};
#[cfg(feature = "cluster")]
pub(crate) use job::{Answer, decode_message, encode_message, run_for_items};
#[cfg(feature = "cluster")]
pub use job::{Job, JobDecoder, Jobs};
#[cfg(feature = "cluster")]
pub use process::ExecutorOptions;
#[cfg(feature = "cluster")]
pub(crate) use process::{run_executor, run_scheduler, start_in_process};
pub(crate) use recipe::{PinnedFile, Recipe, RecipeTable};
#[cfg(feature = "cluster")]
pub(crate) use recipe::{file_io, share, without_long_lived_keys};
#[cfg(feature = "cluster")]
pub(crate) use write::write_on_cluster;

use crate::error::{Error, Result};

/// Partitions a table's files are split into on the cluster (each reads
/// every `PARTITIONS`-th file).
#[cfg(feature = "cluster")]
const PARTITIONS: usize = 8;

/// What results say when the work ran in this process.
pub(crate) const LOCAL: &str = "local";

/// A Ballista cluster's scheduler, as `df://HOST:PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    url: String,
    /// What its calls carry to be let in (see [`Cluster::with_secret_of`]).
    #[cfg(feature = "cluster")]
    secret: Option<ClusterSecret>,
}

impl Cluster {
    /// The cluster a setting names: `None` for `''` or `'local'`.
    pub fn from_setting(text: &str) -> Result<Option<Self>> {
        let text = text.trim();
        if text.is_empty() || text.eq_ignore_ascii_case(LOCAL) {
            return Ok(None);
        }
        let bad = |why: &str| {
            Error::invalid(format!(
                "icestage.cluster = '{text}' {why}: name the scheduler as 'df://HOST:PORT' \
                 (e.g. 'df://127.0.0.1:50050'), or '' to run here"
            ))
        };
        let url = url::Url::parse(text).map_err(|_| bad("is not a URL"))?;
        if url.scheme() != "df" {
            return Err(bad("does not start with df://"));
        }
        let host = url.host_str().ok_or_else(|| bad("has no host"))?;
        let port = url.port().ok_or_else(|| bad("has no port"))?;
        if !cfg!(feature = "cluster") {
            return Err(Error::NotSupported(format!(
                "icestage.cluster = '{text}': this icestage was built without the 'cluster' \
                 feature; build it with `cargo build --release --features cluster` (scheduler, \
                 executors and client from the same build), or SET icestage.cluster = ''"
            )));
        }
        Ok(Some(Self {
            url: format!("df://{host}:{port}"),
            #[cfg(feature = "cluster")]
            secret: None,
        }))
    }

    /// This cluster with the secret its calls carry: the file `options`
    /// name (`icestage.cluster_secret_file`), else the one this process
    /// made for its own in-process cluster at this URL, else the file the
    /// environment names ([`SECRET_FILE_VARIABLE`]); over TLS when
    /// `icestage.cluster_tls_ca_file` (or its environment variable) names
    /// the authority the cluster's certificates chain to.
    #[cfg(feature = "cluster")]
    fn with_secret_of(mut self, options: &crate::config::IcestageOptions) -> Result<Self> {
        let file = options.cluster_secret_file.trim();
        let secret = if !file.is_empty() {
            Some(ClusterSecret::from_file(std::path::Path::new(file))?)
        } else if let Some(secret) = auth::in_process(&self.url) {
            // This process's own cluster, on loopback, without TLS.
            self.secret = Some(secret);
            return Ok(self);
        } else {
            ClusterSecret::from_file_or_env(None)?
        };
        let authority = options.cluster_tls_ca_file.trim();
        let authority = (!authority.is_empty()).then(|| std::path::Path::new(authority));
        // A client has no certificate of its own: only the authority.
        let tls = ClusterTls::from_files_or_env(None, None, authority)?;
        self.secret = secret.map(|s| s.with_tls(tls));
        Ok(self)
    }

    /// What a build without the `cluster` feature answers where a cluster
    /// would be used (unreachable there: [`Cluster::from_setting`] refuses
    /// first).
    #[cfg(not(feature = "cluster"))]
    pub(crate) fn unavailable(&self) -> Error {
        Error::NotSupported(format!("cluster {} needs the 'cluster' feature", self.url))
    }

    /// `table` at `snapshot` as a table provider the cluster can plan.
    pub(crate) fn table(
        &self,
        table: &iceberg::table::Table,
        snapshot: Option<i64>,
    ) -> Result<std::sync::Arc<dyn datafusion::catalog::TableProvider>> {
        #[cfg(feature = "cluster")]
        return Ok(std::sync::Arc::new(RecipeTable::new(table, snapshot)?));
        #[cfg(not(feature = "cluster"))]
        {
            let _ = (table, snapshot);
            Err(self.unavailable())
        }
    }

    /// The scheduler's URL, `df://HOST:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A session whose queries run on this cluster, with icestage's codecs
    /// (in UTC, as icestage's sessions are unless told otherwise).
    #[cfg(feature = "cluster")]
    pub(crate) async fn context(&self) -> Result<datafusion::prelude::SessionContext> {
        use ballista::extension::SessionContextExt;
        use datafusion::execution::SessionStateBuilder;

        let secret = self.secret.as_ref().ok_or_else(|| {
            Error::Config(format!(
                "icestage.cluster = '{}' needs the cluster's secret: SET \
                 icestage.cluster_secret_file = '/path/to/cluster.secret' or set \
                 {SECRET_FILE_VARIABLE} (the file its scheduler and executors were started with)",
                self.url
            ))
        })?;
        let scheduler = format!("http://{}", self.url.trim_start_matches("df://"));
        process::admitted(&scheduler, secret, "client").await?;
        let mut config =
            process::session_config(&Jobs::default(), secret).with_target_partitions(PARTITIONS);
        config.options_mut().execution.time_zone = Some("+00:00".to_string());
        let state = SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            .build();
        datafusion::prelude::SessionContext::remote_with_state(&self.url, state)
            .await
            .map_err(|e| {
                Error::Config(format!(
                    "cannot use the cluster at {}: {e}; is `icestage scheduler` running there?",
                    self.url
                ))
            })
    }
}

/// The cluster the session's `icestage.cluster` names, if any.
pub(crate) fn of_options(options: &crate::config::IcestageOptions) -> Result<Option<Cluster>> {
    let cluster = Cluster::from_setting(&options.cluster)?;
    #[cfg(feature = "cluster")]
    let cluster = cluster.map(|c| c.with_secret_of(options)).transpose()?;
    Ok(cluster)
}

/// Where work ran, as results show it: `local` or the cluster's URL.
pub(crate) fn ran_on(cluster: Option<&Cluster>) -> String {
    cluster.map_or_else(|| LOCAL.to_string(), |c| c.url.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_name_a_scheduler_or_nothing() {
        assert_eq!(Cluster::from_setting("").unwrap(), None);
        assert_eq!(Cluster::from_setting(" local ").unwrap(), None);
        for bad in ["127.0.0.1:50050", "http://h:1", "df://h", "df://"] {
            let message = Cluster::from_setting(bad).unwrap_err().to_string();
            assert!(
                message.contains(bad) && message.contains("df://HOST:PORT"),
                "{message}"
            );
        }
        let named = Cluster::from_setting("df://127.0.0.1:50050");
        if cfg!(feature = "cluster") {
            assert_eq!(named.unwrap().unwrap().url(), "df://127.0.0.1:50050");
        } else {
            assert!(
                named
                    .unwrap_err()
                    .to_string()
                    .contains("--features cluster")
            );
        }
    }
}
