//! Upload sessions: a staging table a client writes into, validated and
//! promoted into the target exactly once.
//!
//! The story, one file per step: [`create`] opens a session, [`promote`]
//! validates and commits it, [`abort`] and [`expire`] discard it, [`status`]
//! answers where a session stands. All state lives in the catalog:
//!
//! * while the staging table exists, its table properties (`icestage.*`) hold
//!   the session: target, state, expiry, failure reasons;
//! * a promoted upload leaves `upload-id=<id>` in the summary of the target
//!   snapshot that added its rows (the exactly-once evidence);
//! * when the staging table goes away, a row in the catalog's
//!   `icestage.upload_log` table ([`log`]) records how the session ended.

pub(crate) mod abort;
pub(crate) mod access;
pub(crate) mod confine;
pub(crate) mod create;
pub(crate) mod expire;
pub(crate) mod files;
pub(crate) mod modes;
pub(crate) mod promote;
pub(crate) mod publish;
pub(crate) mod seal;
pub(crate) mod status;
pub(crate) mod transfer;
pub(crate) mod validation;

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableIdent};

use crate::catalog::Catalogs;
use crate::catalog::IcebergCatalog;
use crate::catalog::commit::Evidence;
use crate::catalog::commit::{Swap, swap_properties};
use crate::error::{Error, Result};
pub use crate::session::{PROP_CREATED_AT, PROP_EXPIRES_AT, PROP_MESSAGE, PROP_OWNER, PROP_STATE};
pub(crate) use crate::session::{
    SessionRecord, failpoint, failpoint_or_error, id_shape, is_missing, property_time, random_id,
    state_named,
};

pub use crate::catalog::STAGING_NAMESPACE;
/// Prefix of a staging table's name; the upload id follows.
pub const STAGING_TABLE_PREFIX: &str = "upload_";
/// Snapshot summary key that records which upload a target snapshot promoted.
pub const SNAPSHOT_UPLOAD_ID: &str = "upload-id";

/// Staging table property: the upload id.
pub const PROP_UPLOAD_ID: &str = "icestage.upload-id";
/// Staging table property: the target table, `namespace.table`.
pub const PROP_TARGET: &str = "icestage.target";
/// Staging table property: rule violations found by the last validation.
pub const PROP_FINDINGS: &str = "icestage.findings";
/// Staging table property: the token of the promotion holding the claim.
pub const PROP_CLAIM: &str = "icestage.claim";
/// Staging table property: when the claim was taken or last renewed, RFC 3339.
pub const PROP_CLAIMED_AT: &str = "icestage.claimed-at";
/// Staging table property: seconds a claim holds without renewal.
pub const PROP_CLAIM_LEASE: &str = "icestage.claim-lease-seconds";
/// Staging table property: what the promotion holding the claim was asked
/// for (its mode, key, tag, branch and verification, as JSON), so that
/// another process can finish it when the claim lapses.
pub const PROP_LANDING: &str = "icestage.landing";

/// How long ago the promotion claim in the staging properties `props` was
/// taken or last renewed, with the lease it holds for; `None` when no
/// promotion holds one.
fn claim_age(
    props: &HashMap<String, String>,
    now: DateTime<Utc>,
) -> Option<(chrono::TimeDelta, chrono::TimeDelta)> {
    if props
        .get(PROP_STATE)
        .is_none_or(|s| s != UploadState::Promoting.as_str())
    {
        return None;
    }
    let lease = props
        .get(PROP_CLAIM_LEASE)
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(60)
        .clamp(1, 86_400);
    let at = property_time(props, PROP_CLAIMED_AT)?;
    Some((now - at, chrono::TimeDelta::seconds(lease)))
}

/// True when the staging properties `props` hold a promotion claim that is
/// still alive at `now` (renewed within its lease).
pub(crate) fn claim_alive(props: &HashMap<String, String>, now: DateTime<Utc>) -> bool {
    claim_age(props, now).is_some_and(|(age, lease)| age.num_seconds() <= lease.num_seconds())
}

/// An upload id: 128 random bits as 32 lowercase hex characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UploadId(String);

impl UploadId {
    /// A fresh, unguessable id.
    pub fn random() -> Self {
        Self(random_id())
    }

    /// Checks that `text` has the shape of an id.
    pub fn parse(text: &str) -> Result<Self> {
        id_shape(text)
            .map(Self)
            .ok_or_else(|| Error::InvalidUploadId(text.trim().to_string()))
    }

    /// The id's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The staging table of this upload.
    pub fn staging_table(&self) -> TableIdent {
        TableIdent::new(
            NamespaceIdent::new(STAGING_NAMESPACE.to_string()),
            format!("{STAGING_TABLE_PREFIX}{}", self.0),
        )
    }

    /// The id of a staging table's name, if it is one.
    pub(crate) fn from_staging_name(name: &str) -> Option<Self> {
        name.strip_prefix(STAGING_TABLE_PREFIX)
            .and_then(|id| Self::parse(id).ok())
    }
}

impl fmt::Display for UploadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where an upload session stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UploadState {
    /// The client may write into the staging table.
    Open,
    /// A `PROMOTE UPLOAD` claimed the session (or died while holding it).
    Promoting,
    /// The rows are in the target (on `main`, or on the audit branch
    /// `to_branch` named).
    Promoted,
    /// The rows, promoted to an audit branch, were published on `main`
    /// (`PUBLISH UPLOAD`).
    Published,
    /// The last promotion failed validation; the staging table is kept.
    Failed,
    /// Discarded by `ABORT UPLOAD`.
    Aborted,
    /// Discarded by `EXPIRE STAGING` after its time ran out.
    Expired,
}

impl UploadState {
    const ALL: [Self; 7] = [
        Self::Open,
        Self::Promoting,
        Self::Promoted,
        Self::Published,
        Self::Failed,
        Self::Aborted,
        Self::Expired,
    ];

    /// The state's name as SQL shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Promoting => "promoting",
            Self::Promoted => "promoted",
            Self::Published => "published",
            Self::Failed => "failed",
            Self::Aborted => "aborted",
            Self::Expired => "expired",
        }
    }
}

crate::rows::named_column!(read: UploadId, UploadState);

impl fmt::Display for UploadState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for UploadId {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        Self::parse(text)
    }
}

impl FromStr for UploadState {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        state_named(&Self::ALL, s).ok_or_else(|| {
            Error::invalid(format!(
                "'{s}' is not an upload state: expected one of open, promoting, promoted, published, failed, aborted, expired"
            ))
        })
    }
}

/// An upload's record.
pub(crate) type UploadRecord = SessionRecord<UploadState>;

/// A live upload session: its staging table and what its properties say.
#[derive(Debug, Clone)]
pub(crate) struct Staging {
    pub(crate) id: UploadId,
    pub(crate) catalog: Arc<IcebergCatalog>,
    pub(crate) table: Table,
    pub(crate) target: TableIdent,
    pub(crate) state: UploadState,
    pub(crate) created_at: Option<DateTime<Utc>>,
    pub(crate) expires_at: Option<DateTime<Utc>>,
    pub(crate) message: Option<String>,
    pub(crate) findings: Option<i64>,
    pub(crate) owner: Option<String>,
    /// The claim token, when this process holds the promotion claim.
    pub(crate) held_claim: Option<String>,
    /// What the promotion claiming the upload was asked for
    /// ([`PROP_LANDING`]): read from the table, and recorded with a claim
    /// this process takes.
    pub(crate) landing: Option<String>,
    /// Why the session's sealed properties cannot be trusted, if they cannot
    /// (see [`seal`]).
    pub(crate) tampered: Option<String>,
    /// The proof its promotion's target snapshot carries ([`seal::proof`]),
    /// for uploads whose sealed properties ask for one.
    pub(crate) proof: Option<String>,
}

impl Staging {
    /// Reads a session from its staging table's properties.
    pub(crate) fn from_table(catalog: Arc<IcebergCatalog>, table: Table) -> Result<Self> {
        let props = table.metadata().properties();
        let name = table.identifier().to_string();
        let missing = |key: &str| {
            Error::invalid(format!(
                "staging table {name} has no '{key}' property: it was not created by CREATE UPLOAD"
            ))
        };
        let id = UploadId::parse(
            props
                .get(PROP_UPLOAD_ID)
                .ok_or_else(|| missing(PROP_UPLOAD_ID))?,
        )?;
        let target = props.get(PROP_TARGET).ok_or_else(|| missing(PROP_TARGET))?;
        let target = TableIdent::from_strs(target.split('.'))?;
        let state = props
            .get(PROP_STATE)
            .ok_or_else(|| missing(PROP_STATE))?
            .parse()?;
        let time = |key: &str| property_time(props, key);
        Ok(Self {
            id,
            catalog,
            target,
            state,
            created_at: time(PROP_CREATED_AT),
            expires_at: time(PROP_EXPIRES_AT),
            message: props.get(PROP_MESSAGE).cloned(),
            findings: props.get(PROP_FINDINGS).and_then(|v| v.parse().ok()),
            owner: props.get(PROP_OWNER).cloned(),
            held_claim: None,
            landing: props.get(PROP_LANDING).filter(|l| !l.is_empty()).cloned(),
            tampered: None,
            proof: None,
            table,
        })
    }

    /// Reads a session and checks the seal on its authority.
    pub(crate) async fn open(catalog: Arc<IcebergCatalog>, table: Table) -> Result<Self> {
        let key = seal::key(&catalog).await?;
        let mut staging = Self::from_table(catalog, table)?;
        let props = staging.table.metadata().properties();
        staging.tampered = seal::broken(&key, props);
        staging.proof = props
            .contains_key(seal::PROP_EVIDENCE)
            .then(|| seal::proof(&key, staging.id.as_str(), &staging.target.to_string()));
        if staging.tampered.is_none() {
            // The metadata icestage committed, not a copy rewritten in place
            // by a client that can write the table's folder.
            staging.tampered = staging.catalog.metadata_rewritten(&staging.table).await?;
        }
        Ok(staging)
    }

    /// The exactly-once evidence of this upload's promotion: `upload-id`
    /// in the target snapshot's summary, proven by [`seal::proof`] where the
    /// upload asks for it (a snapshot anyone else wrote proves nothing).
    pub(crate) fn evidence(&self) -> Evidence {
        let evidence = Evidence::new(SNAPSHOT_UPLOAD_ID, self.id.as_str());
        match &self.proof {
            Some(proof) => evidence.proven(seal::SNAPSHOT_UPLOAD_PROOF, proof),
            None => evidence,
        }
    }

    /// True when another process's promotion holds a live claim.
    pub(crate) fn claimed_elsewhere(&self, now: DateTime<Utc>) -> bool {
        let props = self.table.metadata().properties();
        claim_alive(props, now) && props.get(PROP_CLAIM) != self.held_claim.as_ref()
    }

    /// The record of this session in `state`, as of now.
    pub(crate) fn record(&self, state: UploadState) -> UploadRecord {
        UploadRecord {
            id: self.id.to_string(),
            state,
            catalog: self.catalog.name().to_string(),
            target: self.target.to_string(),
            staging: self.name(),
            created_at: self.created_at,
            expires_at: self.expires_at,
            recorded_at: Some(Utc::now()),
            rows: None,
            files: None,
            snapshot_id: None,
            findings: self.findings,
            message: self
                .tampered
                .clone()
                .or_else(|| self.message.clone())
                .filter(|m| !m.is_empty()),
            owner: self.owner.clone(),
        }
    }

    /// The staging table's name, `staging.upload_<id>`.
    pub(crate) fn name(&self) -> String {
        self.table.identifier().to_string()
    }

    /// True once the expiry time has passed.
    pub(crate) fn is_expired(&self, now: DateTime<Utc>) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }

    /// True once the session can no longer be promoted: at its expiry, or,
    /// for one whose promotion started before it (state `promoting`: a
    /// replica died mid-promotion), [`PROMOTION_GRACE`] later, so the
    /// client's timely `complete` is still honoured when retried.
    pub(crate) fn past_promotion(&self, now: DateTime<Utc>) -> bool {
        match self.state {
            UploadState::Promoting => self
                .expires_at
                .is_some_and(|at| at + PROMOTION_GRACE <= now),
            _ => self.is_expired(now),
        }
    }

    /// Commits a state change to the staging table's properties, but only if
    /// the state is still one of `from` on the exact version the commit
    /// lands on (a compare-and-swap), so two processes racing (a promotion
    /// and an abort) cannot both win. `promoting` counts as a `from` state
    /// only when this process holds its claim or the claim's lease ran out.
    ///
    /// Moving to `promoting` takes the claim (with `lease`, recording
    /// [`Self::landing`]), or renews the one this process holds; any other
    /// move releases it.
    pub(crate) async fn transition(
        &mut self,
        from: &[UploadState],
        to: UploadState,
        message: Option<&str>,
    ) -> Result<()> {
        self.transition_with_lease(from, to, message, std::time::Duration::from_secs(60))
            .await
    }

    /// [`Self::transition`] with the lease a new claim holds for.
    pub(crate) async fn transition_with_lease(
        &mut self,
        from: &[UploadState],
        to: UploadState,
        message: Option<&str>,
        lease: std::time::Duration,
    ) -> Result<()> {
        let allowed: Vec<String> = from.iter().map(|s| s.to_string()).collect();
        let held = self.held_claim.clone();
        // A claim this process holds is renewed under its own token.
        let claim = (to == UploadState::Promoting).then(|| held.clone().unwrap_or_else(random_id));
        let mut properties = HashMap::from([
            (PROP_STATE.to_string(), to.to_string()),
            (
                PROP_MESSAGE.to_string(),
                message.unwrap_or_default().to_string(),
            ),
            (
                PROP_FINDINGS.to_string(),
                self.findings.unwrap_or(0).to_string(),
            ),
            (PROP_CLAIM.to_string(), claim.clone().unwrap_or_default()),
            (
                PROP_LANDING.to_string(),
                claim.as_ref().and(self.landing.clone()).unwrap_or_default(),
            ),
            (
                PROP_CLAIMED_AT.to_string(),
                claim
                    .as_ref()
                    .map(|_| Utc::now().to_rfc3339())
                    .unwrap_or_default(),
            ),
        ]);
        if claim.is_some() {
            properties.insert(
                PROP_CLAIM_LEASE.to_string(),
                lease.as_secs().max(1).to_string(),
            );
        }
        let swap = swap_properties(
            &self.catalog,
            &self.table,
            PROP_STATE,
            move |props| {
                let Some(state) = props.get(PROP_STATE) else {
                    return false;
                };
                if !allowed.contains(state) {
                    return false;
                }
                state != UploadState::Promoting.as_str()
                    || props.get(PROP_CLAIM) == held.as_ref()
                    || !claim_alive(props, Utc::now())
            },
            properties,
        )
        .await?;
        match swap {
            Swap::Done(table) => {
                let (tampered, proof) = (self.tampered.take(), self.proof.take());
                *self = Staging::from_table(Arc::clone(&self.catalog), table)?;
                self.held_claim = claim;
                self.tampered = tampered;
                self.proof = proof;
                Ok(())
            }
            Swap::Refused(now) => Err(Error::UploadState {
                id: self.id.to_string(),
                hint: if now == UploadState::Promoting.as_str() {
                    format!(
                        "a PROMOTE UPLOAD in another process holds it; wait for it to finish \
                         (SELECT * FROM upload_status('{}')), or for its claim to lapse",
                        self.id
                    )
                } else {
                    format!(
                        "another process changed it while this one wanted it {to}; \
                         check SELECT * FROM upload_status('{}')",
                        self.id
                    )
                },
                state: now,
            }),
        }
    }

    /// Takes the promotion claim for a promotion asked for `landing` (what
    /// the claim records, [`PROP_LANDING`]) with `lease`, or renews the one
    /// this process holds; false when another process holds it.
    ///
    /// A claim this process took for the same landing within the first
    /// third of its lease is neither taken nor renewed again: the service
    /// claims an upload before it answers `complete` and promotes it right
    /// after, and [`Self::keep_claim`] renews it before it could lapse, so
    /// a second commit would only cost the catalog a round trip.
    pub(crate) async fn take_claim(
        &mut self,
        landing: String,
        lease: std::time::Duration,
    ) -> Result<bool> {
        let fresh = self.holds_fresh_claim(&landing, Utc::now());
        self.landing = Some(landing);
        if fresh {
            return Ok(true);
        }
        let from = [
            UploadState::Open,
            UploadState::Failed,
            UploadState::Promoting,
        ];
        match self
            .transition_with_lease(&from, UploadState::Promoting, None, lease)
            .await
        {
            Ok(()) => Ok(true),
            Err(Error::UploadState { state, .. }) if state == UploadState::Promoting.as_str() => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// True when the loaded table shows the claim this process holds,
    /// recorded for `landing`, taken or renewed within the first third of
    /// its lease.
    fn holds_fresh_claim(&self, landing: &str, now: DateTime<Utc>) -> bool {
        let props = self.table.metadata().properties();
        self.held_claim.is_some()
            && props.get(PROP_CLAIM) == self.held_claim.as_ref()
            && props.get(PROP_LANDING).map(String::as_str) == Some(landing)
            && claim_age(props, now)
                .is_some_and(|(age, lease)| age >= chrono::TimeDelta::zero() && age * 3 < lease)
    }

    /// Renews this process's claim every third of `lease` until the
    /// returned guard is dropped.
    pub(crate) fn keep_claim(&self, lease: std::time::Duration) -> ClaimGuard {
        let (catalog, table) = (Arc::clone(&self.catalog), self.table.identifier().clone());
        let token = self.held_claim.clone().unwrap_or_default();
        ClaimGuard(tokio::spawn(async move {
            loop {
                tokio::time::sleep(lease / 3).await;
                let Ok(current) = catalog.catalog().load_table(&table).await else {
                    return;
                };
                let token = token.clone();
                let renewed = swap_properties(
                    &catalog,
                    &current,
                    PROP_STATE,
                    move |props| {
                        props
                            .get(PROP_STATE)
                            .is_some_and(|s| s == UploadState::Promoting.as_str())
                            && props.get(PROP_CLAIM) == Some(&token)
                    },
                    HashMap::from([(PROP_CLAIMED_AT.to_string(), Utc::now().to_rfc3339())]),
                )
                .await;
                // Released or taken over: stop. A failed renewal is retried.
                if matches!(renewed, Ok(Swap::Refused(_))) {
                    return;
                }
            }
        }))
    }
}

/// Stops renewing a claim when dropped (see [`Staging::keep_claim`]).
pub(crate) struct ClaimGuard(tokio::task::JoinHandle<()>);

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Finds the live session of `id` in any catalog.
pub(crate) async fn find_staging(icestage: &Catalogs, id: &UploadId) -> Result<Option<Staging>> {
    let ident = id.staging_table();
    for catalog in icestage.catalogs() {
        let Some(table) = catalog.load_if_present(&ident).await? else {
            continue;
        };
        // Opening reads the metadata again: the session may end meanwhile.
        match Staging::open(Arc::clone(catalog), table).await {
            Ok(staging) => return Ok(Some(staging)),
            Err(e) => catalog.unless_removed(&ident, e).await?,
        }
    }
    Ok(None)
}

/// The uploads whose staging table one catalog lists (none is loaded;
/// [`UploadId::staging_table`] names each table).
pub(crate) async fn staging_tables(catalog: &Arc<IcebergCatalog>) -> Result<Vec<UploadId>> {
    let namespace = NamespaceIdent::new(STAGING_NAMESPACE.to_string());
    if !catalog.catalog().namespace_exists(&namespace).await? {
        return Ok(vec![]);
    }
    let tables = catalog.catalog().list_tables(&namespace).await?;
    Ok(tables
        .into_iter()
        .filter_map(|ident| UploadId::from_staging_name(ident.name()))
        .collect())
}

/// All live sessions of one catalog.
pub(crate) async fn list_staging(catalog: &Arc<IcebergCatalog>) -> Result<Vec<Staging>> {
    let mut sessions = vec![];
    for id in staging_tables(catalog).await? {
        // Removed between listing and loading: it finished meanwhile.
        if let Some(table) = catalog.load_if_present(&id.staging_table()).await?
            && let Ok(session) = Staging::open(Arc::clone(catalog), table).await
        {
            sessions.push(session);
        }
    }
    Ok(sessions)
}

/// How long after its expiry an upload whose promotion started in time may
/// still be promoted (see [`Staging::past_promotion`]).
pub(crate) const PROMOTION_GRACE: chrono::TimeDelta = chrono::TimeDelta::hours(1);

/// The catalog of upload `record` and its target table as it is now.
pub(crate) async fn recorded_target(
    icestage: &Catalogs,
    record: &UploadRecord,
) -> Result<(Arc<IcebergCatalog>, Table)> {
    let catalog = Arc::clone(icestage.catalog(&record.catalog)?);
    let ident = TableIdent::from_strs(record.target.split('.'))?;
    let table = catalog.catalog().load_table(&ident).await?;
    Ok((catalog, table))
}

/// The target snapshot that promoted `staging`, if any (the exactly-once
/// evidence, [`Staging::evidence`]).
pub(crate) fn promoted_snapshot(target: &Table, staging: &Staging) -> Option<i64> {
    staging.evidence().found_in(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_128_random_bits_in_hex() {
        let a = UploadId::random();
        let b = UploadId::random();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 32);
        assert_eq!(UploadId::parse(a.as_str()).unwrap(), a);
        assert_eq!(a.staging_table().to_string(), format!("staging.upload_{a}"));
        assert_eq!(UploadId::from_staging_name(&format!("upload_{a}")), Some(a));
    }

    #[test]
    fn malformed_ids_are_refused_with_the_value() {
        let err = UploadId::parse("upload_123").unwrap_err().to_string();
        assert!(err.starts_with("'upload_123' is not an upload id"), "{err}");
    }

    #[test]
    fn states_round_trip() {
        for state in [
            UploadState::Open,
            UploadState::Promoting,
            UploadState::Promoted,
            UploadState::Published,
            UploadState::Failed,
            UploadState::Aborted,
            UploadState::Expired,
        ] {
            assert_eq!(state.as_str().parse::<UploadState>().unwrap(), state);
        }
    }

    /// A session in state `open` on a real (SQLite) catalog, as two
    /// processes would each load it.
    async fn session(dir: &std::path::Path) -> (Staging, Staging) {
        let config = crate::config::IcestageConfig::embedded(dir).unwrap();
        let catalog = Arc::new(IcebergCatalog::open(&config.catalogs[0]).await.unwrap());
        let id = UploadId::random();
        let ident = id.staging_table();
        catalog.ensure_namespace(ident.namespace()).await.unwrap();
        let now = Utc::now();
        let properties = HashMap::from([
            (PROP_UPLOAD_ID.to_string(), id.to_string()),
            (PROP_TARGET.to_string(), "shop.orders".to_string()),
            (PROP_STATE.to_string(), UploadState::Open.to_string()),
            (PROP_CREATED_AT.to_string(), now.to_rfc3339()),
            (
                PROP_EXPIRES_AT.to_string(),
                (now + chrono::Duration::hours(1)).to_rfc3339(),
            ),
        ]);
        let schema = iceberg::spec::Schema::builder()
            .with_fields(vec![Arc::new(iceberg::spec::NestedField::required(
                1,
                "id",
                iceberg::spec::Type::Primitive(iceberg::spec::PrimitiveType::Long),
            ))])
            .build()
            .unwrap();
        let creation = iceberg::TableCreation::builder()
            .name(ident.name().to_string())
            .schema(schema)
            .properties(properties)
            .build();
        let table = catalog
            .catalog()
            .create_table(ident.namespace(), creation)
            .await
            .unwrap();
        let load = || async {
            let table = catalog.catalog().load_table(&ident).await.unwrap();
            Staging::from_table(Arc::clone(&catalog), table).unwrap()
        };
        drop(table);
        (load().await, load().await)
    }

    fn refused_in(result: Result<()>) -> String {
        match result {
            Err(Error::UploadState { state, .. }) => state,
            other => panic!("expected a refused transition, got {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn one_claim_at_a_time_until_it_is_released_or_lapses() {
        use UploadState::*;
        let dir = tempfile::tempdir().unwrap();
        let (mut first, mut second) = session(dir.path()).await;
        let second_copy = second.clone();

        // The first process claims it; the second cannot while the claim lives.
        first
            .transition(&[Open, Failed], Promoting, None)
            .await
            .unwrap();
        assert_eq!(first.state, Promoting);
        assert!(first.held_claim.is_some());
        let refused = second
            .transition(&[Open, Failed, Promoting], Aborted, None)
            .await;
        assert_eq!(refused_in(refused), "promoting");

        // Releasing it (a failed validation) lets the next one in, from the
        // states it names only.
        first
            .transition(&[Promoting], Failed, Some("2 findings"))
            .await
            .unwrap();
        assert_eq!((first.state, first.held_claim.as_deref()), (Failed, None));
        assert_eq!(first.message.as_deref(), Some("2 findings"));
        let refused = second.transition(&[Open], Promoting, None).await;
        assert_eq!(refused_in(refused), "failed");

        // A claim whose holder stopped renewing lapses with its lease.
        let mut second = second_copy;
        first
            .transition_with_lease(
                &[Failed],
                Promoting,
                None,
                std::time::Duration::from_secs(1),
            )
            .await
            .unwrap();
        let refused = second.transition(&[Promoting], Aborted, None).await;
        assert_eq!(refused_in(refused), "promoting");
        tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
        second
            .transition(&[Promoting], Aborted, None)
            .await
            .unwrap();
        assert_eq!(second.state, Aborted);

        // The first holder's claim is gone: it cannot finish.
        let refused = first.transition(&[Promoting], Promoted, None).await;
        assert_eq!(refused_in(refused), "aborted");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_fresh_claim_this_process_holds_is_not_committed_again() {
        use std::time::Duration;
        let dir = tempfile::tempdir().unwrap();
        let (mut first, other) = session(dir.path()).await;
        let lease = Duration::from_secs(60);
        let location = |staging: &Staging| staging.table.metadata_location().map(str::to_string);

        assert!(first.take_claim("append".into(), lease).await.unwrap());
        let after_claim = location(&first);
        let token = first.held_claim.clone().unwrap();

        // The process that claimed it loads it again to promote it: the
        // claim is fresh, for the same landing, so nothing is committed.
        let reload = |catalog: &Arc<IcebergCatalog>, held: &str| {
            let (catalog, held) = (Arc::clone(catalog), held.to_string());
            let ident = first.table.identifier().clone();
            async move {
                let table = catalog.catalog().load_table(&ident).await.unwrap();
                let mut staging = Staging::from_table(catalog, table).unwrap();
                staging.held_claim = Some(held);
                staging
            }
        };
        let mut again = reload(&first.catalog, &token).await;
        assert!(again.take_claim("append".into(), lease).await.unwrap());
        assert_eq!(
            location(&again),
            after_claim,
            "a fresh claim was committed again"
        );
        assert_eq!(again.held_claim.as_deref(), Some(token.as_str()));

        // Another landing is recorded: that takes a commit.
        let mut upsert = reload(&first.catalog, &token).await;
        assert!(upsert.take_claim("upsert".into(), lease).await.unwrap());
        assert_ne!(location(&upsert), after_claim);
        assert_eq!(
            upsert
                .table
                .metadata()
                .properties()
                .get(PROP_LANDING)
                .map(String::as_str),
            Some("upsert")
        );

        // A process that does not hold it is refused, fresh or not.
        let mut other = reload(&other.catalog, "not-the-token").await;
        assert!(!other.take_claim("upsert".into(), lease).await.unwrap());

        // A claim past the first third of its lease is renewed.
        let short = Duration::from_secs(3);
        let mut renewing = reload(&first.catalog, &token).await;
        assert!(renewing.take_claim("replace".into(), short).await.unwrap());
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let mut late = reload(&first.catalog, &token).await;
        let before = location(&late);
        assert!(late.take_claim("replace".into(), short).await.unwrap());
        assert_ne!(location(&late), before);
    }
}
