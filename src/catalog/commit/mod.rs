//! Appending data files: plainly ([`append_files`]), or exactly once
//! ([`append_once`]).
//!
//! The snapshot that adds the files carries an evidence property (an upload
//! id, a copy id). The commit runs through a catalog that looks for that
//! evidence every time the table is loaded, and iceberg's
//! `Transaction::commit` loads the table at the start of every attempt,
//! including the retries it performs on conflicts, so none of them can append
//! twice. After any answer, including a lost one, the table is loaded again
//! and the evidence decides.
//!
//! The rest of the protocol, a file each: a client's commit taken as a
//! claim ([`append`]), group commits ([`group`]), snapshots that replace
//! data files ([`replace`]) and audit branches ([`branch`]). Commit code
//! reports what an append leaves due ([`IcebergCatalog::appended`]); it
//! never runs maintenance itself.

pub(crate) mod append;
pub(crate) mod branch;
pub(crate) mod group;
pub(crate) mod replace;

use std::collections::HashMap;

use std::sync::Arc;
use std::time::Duration;

use iceberg::spec::{DataFile, Operation, Schema, SnapshotRef};
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};

use crate::catalog::IcebergCatalog;
use crate::catalog::Owner;
use crate::catalog::scoped::{LoadCheck, both, load_check};
use crate::error::{Error, Result};

/// The exactly-once evidence of an append: `key = value` in its snapshot's
/// summary and, where anyone who can commit to the table could write that
/// pair, a proof beside it (`proof key = proof`, an HMAC under a key such
/// writers cannot read): only a snapshot carrying both counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Evidence {
    key: String,
    value: String,
    proof: Option<(String, String)>,
}

impl Evidence {
    /// `key = value`, believed as found.
    pub(crate) fn new(key: &str, value: &str) -> Self {
        Self {
            key: key.to_string(),
            value: value.to_string(),
            proof: None,
        }
    }

    /// This evidence, counted only with `proof_key = proof` beside it.
    pub(crate) fn proven(mut self, proof_key: &str, proof: &str) -> Self {
        self.proof = Some((proof_key.to_string(), proof.to_string()));
        self
    }

    /// The summary properties an append with this evidence carries.
    pub(crate) fn properties(&self) -> HashMap<String, String> {
        let mut properties = HashMap::from([(self.key.clone(), self.value.clone())]);
        properties.extend(self.proof.clone());
        properties
    }

    /// What `summary` says of this evidence.
    fn claimed(&self, summary: &HashMap<String, String>) -> Claim {
        if summary.get(&self.key) != Some(&self.value) {
            return Claim::Absent;
        }
        let proven = match &self.proof {
            None => true,
            Some((key, proof)) => summary
                .get(key)
                .is_some_and(|found| crate::secret::equal_time(found.as_bytes(), proof.as_bytes())),
        };
        match proven {
            true => Claim::Proven,
            false => Claim::Forged,
        }
    }

    /// The first snapshot of `table` that carries this evidence, proof
    /// included.
    pub(crate) fn found_in(&self, table: &Table) -> Option<i64> {
        self.claims(table, Claim::Proven).next()
    }

    /// Whether `snapshot` carries this evidence, proof included.
    pub(crate) fn carried_by(&self, snapshot: &iceberg::spec::Snapshot) -> bool {
        self.claimed(&snapshot.summary().additional_properties) == Claim::Proven
    }

    /// The first snapshot on branch `branch` of `table` (its head, then
    /// the head's ancestors) that carries this evidence, proof included.
    pub(crate) fn found_on(&self, table: &Table, branch: &str) -> Option<i64> {
        crate::catalog::snapshot::ancestry(table.metadata(), branch)
            .find(|s| self.carried_by(s))
            .map(|s| s.snapshot_id())
    }

    /// The snapshots of `table` that claim this evidence without its proof:
    /// another writer's forgery, ignored.
    pub(crate) fn forged_in(&self, table: &Table) -> Vec<i64> {
        self.claims(table, Claim::Forged).collect()
    }

    /// The snapshots of `table` whose claim of this evidence is `claim`.
    fn claims<'a>(&'a self, table: &'a Table, claim: Claim) -> impl Iterator<Item = i64> + 'a {
        table
            .metadata()
            .snapshots()
            .filter(move |s| self.claimed(&s.summary().additional_properties) == claim)
            .map(|s| s.snapshot_id())
    }
}

/// What a snapshot's summary says of a piece of [`Evidence`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    /// It does not carry the evidence.
    Absent,
    /// It carries the evidence without its proof: another writer's
    /// forgery.
    Forged,
    /// It carries the evidence and its proof.
    Proven,
}

/// How often a commit that keeps conflicting is tried before giving up.
const MAX_COMMIT_ATTEMPTS: u32 = 30;

/// A randomised pause before retry `attempt` (1-based).
fn jitter(attempt: u32) -> Duration {
    let base = 50u64 * u64::from(attempt.min(10));
    Duration::from_millis(base + rand::random::<u64>() % (base * 4 + 1))
}

/// Whether a commit that failed with `error` on attempt `attempt` is worth
/// another. iceberg retries conflicts with backoff but no jitter, so a crowd
/// of concurrent writers can exhaust it; the callers retry again, with
/// jitter.
fn retry(error: &iceberg::Error, attempt: u32) -> bool {
    attempt < MAX_COMMIT_ATTEMPTS
        && (error.retryable() || error.kind() == iceberg::ErrorKind::CatalogCommitConflicts)
}

/// Runs `attempt` until it succeeds, fails for good, or has conflicted
/// [`MAX_COMMIT_ATTEMPTS`] times, pausing with jitter between tries.
async fn retrying<T, F, Fut>(mut attempt: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut tries = 0u32;
    loop {
        match attempt().await {
            Err(Error::Iceberg(e)) if retry(&e, tries) => {
                crate::metrics::count(
                    "icestage_catalog_commit_retries_total",
                    "Catalog commits tried again after a conflict or a retryable failure.",
                    &[],
                    1.0,
                );
                tries += 1;
                tokio::time::sleep(jitter(tries)).await;
            }
            done => return done,
        }
    }
}

/// `tx` with one more snapshot appending `files`, with `properties` in
/// its summary. It skips iceberg's duplicate-file check, which reads every
/// manifest of the table on each attempt: the callers' files are new.
fn with_append(
    tx: Transaction,
    files: &[DataFile],
    properties: HashMap<String, String>,
) -> Result<Transaction> {
    Ok(tx
        .fast_append()
        .with_check_duplicate(false)
        .set_snapshot_properties(properties)
        .add_data_files(files.to_vec())
        .apply(tx)?)
}

/// Appends `files` to `table` in one snapshot; the table as committed.
/// `Transaction::commit` loads the table again at the start of every
/// attempt, so `table` may be stale. The commit swaps the table's pointer
/// from the version it was applied to ([`IcebergCatalog::exact`]), which also
/// honours `write.metadata.delete-after-commit.enabled`.
pub(crate) async fn append_files(
    catalog: &IcebergCatalog,
    table: &Table,
    files: Vec<DataFile>,
) -> Result<Table> {
    // Commits of this process to one table take turns; other processes are
    // met by retries.
    let _turn = catalog.exclusive(&table.identifier().to_string()).await;
    let exact = catalog.exact();
    retrying(|| async {
        Ok(
            with_append(Transaction::new(table), &files, HashMap::new())?
                .commit(&exact)
                .await?,
        )
    })
    .await
}

/// Deletes what the snapshots of `before` that `after` no longer has held
/// alone: their manifest lists, the manifests no remaining snapshot lists
/// (a rewrite's predecessors), and, when a snapshot of `before` removed
/// data files (an overwrite, a delete, a compaction), the data files only
/// those manifests listed: files no remaining snapshot reads. Every file
/// passes the deletion gate ([`crate::catalog::confine::delete_within`]): metadata
/// files under `location` (the table's assigned location), data files under
/// it or one of `roots` (where promotions leave the files they register);
/// a data file elsewhere is counted and left. Best effort: an orphan is
/// harmless, only untidy.
pub(crate) async fn delete_expired_files(
    before: &Table,
    after: &Table,
    location: &str,
    roots: &[String],
) -> DataFilesDeleted {
    use std::collections::HashSet;

    let mut deleted = DataFilesDeleted::default();
    let remaining: HashSet<i64> = after
        .metadata()
        .snapshots()
        .map(|s| s.snapshot_id())
        .collect();
    let expired: Vec<_> = before
        .metadata()
        .snapshots()
        .filter(|s| !remaining.contains(&s.snapshot_id()))
        .cloned()
        .collect();
    if expired.is_empty() {
        return deleted;
    }
    // The manifests remaining snapshots list, by path.
    let mut kept = std::collections::HashMap::new();
    for snapshot in after.metadata().snapshots() {
        match crate::catalog::manifests::load_list(after, snapshot, location).await {
            Ok(list) => kept.extend(
                list.entries()
                    .iter()
                    .map(|m| (m.manifest_path.clone(), m.clone())),
            ),
            // Without knowing what is kept, delete no file.
            Err(_) => return deleted,
        }
    }
    // The manifests only expired snapshots listed, each once.
    let mut alone = vec![];
    let mut seen = HashSet::new();
    for snapshot in &expired {
        if let Ok(list) = crate::catalog::manifests::load_list(before, snapshot, location).await {
            alone.extend(
                list.entries()
                    .iter()
                    .filter(|m| {
                        !kept.contains_key(&m.manifest_path) && seen.insert(m.manifest_path.clone())
                    })
                    .cloned(),
            );
        }
    }
    // Data files, before the manifests naming them go. (A table that sets
    // `gc.enabled = false` never gets here: Iceberg expires none of its
    // snapshots.)
    if removed_data_files(before) {
        deleted = delete_unread_data_files(before, kept.values(), &alone, location, roots).await;
    }
    let io = before.file_io();
    for manifest in &alone {
        crate::catalog::confine::delete_within(io, &manifest.manifest_path, location).await;
    }
    for snapshot in &expired {
        crate::catalog::confine::delete_within(io, snapshot.manifest_list(), location).await;
    }
    deleted
}

/// The data files an expiry deleted ([`delete_expired_files`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DataFilesDeleted {
    /// Deleted.
    pub(crate) deleted: i64,
    /// No remaining snapshot reads them, but they lie outside the table's
    /// location: left where they are.
    pub(crate) outside: i64,
}

/// Whether any snapshot of `table` removed data files: otherwise every
/// data file it ever listed is still live, and no expiry frees one.
fn removed_data_files(table: &Table) -> bool {
    table.metadata().snapshots().any(|snapshot| {
        matches!(
            snapshot.summary().operation,
            Operation::Overwrite | Operation::Delete
        ) || summary_count(Some(snapshot), "deleted-data-files").is_some_and(|n| n > 0)
    })
}

/// Iceberg's `gc.enabled`: whether the table's files are its own to delete
/// (default `true`); Iceberg expires no snapshot of a table that says
/// `false`.
pub(crate) fn gc_enabled(table: &Table) -> bool {
    table
        .metadata()
        .properties()
        .get(GC_ENABLED)
        .is_none_or(|v| !v.trim().eq_ignore_ascii_case("false"))
}

/// Iceberg's switch for deleting a table's files.
pub(crate) const GC_ENABLED: &str = "gc.enabled";

/// Deletes the data files that the manifests `alone` list and no live
/// entry of the manifests `kept` does, under the table's location or
/// `roots`. Reads every kept manifest: what any remaining snapshot reads
/// stays. Any manifest that cannot be read: nothing is deleted.
async fn delete_unread_data_files(
    table: &Table,
    kept: impl Iterator<Item = &iceberg::spec::ManifestFile>,
    alone: &[iceberg::spec::ManifestFile],
    location: &str,
    roots: &[String],
) -> DataFilesDeleted {
    let mut deleted = DataFilesDeleted::default();
    let (Some(live), Some(listed)) = (
        crate::catalog::manifests::listed_files(table, kept, location, true)
            .await
            .ok(),
        crate::catalog::manifests::listed_files(table, alone.iter(), location, false)
            .await
            .ok(),
    ) else {
        return deleted;
    };
    let candidates = listed.difference(&live);
    for path in candidates {
        let root = std::iter::once(location)
            .chain(roots.iter().map(String::as_str))
            .find(|root| crate::catalog::confine::is_under(path, root));
        match root {
            None => deleted.outside += 1,
            Some(root) => {
                if crate::catalog::confine::delete_within(table.file_io(), path, root).await {
                    deleted.deleted += 1;
                }
            }
        }
    }
    deleted
}

/// Commits `tx` (an expiry of snapshots of `table`) on exactly the version
/// it loaded, then deletes what only the expired snapshots held
/// ([`delete_expired_files`], data files under the table's location or
/// `roots`); the table as committed, and the data files deleted.
pub(crate) async fn commit_expiry(
    catalog: &IcebergCatalog,
    table: &Table,
    tx: Transaction,
    roots: &[String],
) -> iceberg::Result<(Table, DataFilesDeleted)> {
    let location = catalog
        .assigned_location(table)
        .await
        .map_err(|e| iceberg::Error::new(iceberg::ErrorKind::Unexpected, e.to_string()))?;
    let expired = tx.commit(&catalog.exact()).await?;
    let deleted = delete_expired_files(table, &expired, &location, roots).await;
    Ok((expired, deleted))
}

/// Snapshots an icestage-owned table keeps (see [`trim_snapshots`]).
const KEPT_SNAPSHOTS: usize = 10;

/// Whether [`trim_snapshots`] would expire snapshots of `table`.
pub(crate) fn trim_due(table: &Table) -> bool {
    table.metadata().snapshots().count() > 2 * KEPT_SNAPSHOTS
}

/// Expires all but the last [`KEPT_SNAPSHOTS`] snapshots of `table`, one of
/// icestage's own append-only tables, once it has twice as many, and deletes
/// what only they held ([`delete_expired_files`]). A concurrent commit wins;
/// the trim is left to the next append.
pub(crate) async fn trim_snapshots(catalog: &IcebergCatalog, table: &Table) -> Result<()> {
    if !trim_due(table) {
        return Ok(());
    }
    let tx = Transaction::new(table);
    let tx = tx
        .expire_snapshots()
        .retain_last(KEPT_SNAPSHOTS)
        .expire_older_than_ms(chrono::Utc::now().timestamp_millis())
        .apply(tx)?;
    match commit_expiry(catalog, table, tx, &[]).await {
        Ok(_) => {}
        Err(e) if retry(&e, 0) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// A count that the summary of `snapshot` holds (`total-records`,
/// `added-data-files`, ...), if it holds it.
pub(crate) fn summary_count(snapshot: Option<&SnapshotRef>, key: &str) -> Option<i64> {
    snapshot?
        .summary()
        .additional_properties
        .get(key)?
        .parse()
        .ok()
}

const ALREADY_COMMITTED: &str = "these files were already committed to this table";

/// An exactly-once append: `files` in one snapshot carrying `key = value`.
#[derive(Clone)]
pub(crate) struct OnceAppend {
    files: Vec<DataFile>,
    evidence: Evidence,
}

/// Where an exactly-once commit's changes are: the snapshot that holds them,
/// and whether this call committed it (`false`: an earlier call, or another
/// process, had).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Landed {
    pub(crate) snapshot_id: i64,
    pub(crate) committed_here: bool,
}

impl Landed {
    /// Committed by this call.
    pub(crate) fn here(snapshot_id: i64) -> Self {
        Self {
            snapshot_id,
            committed_here: true,
        }
    }

    /// Found already committed.
    pub(crate) fn before(snapshot_id: i64) -> Self {
        Self {
            snapshot_id,
            committed_here: false,
        }
    }
}

/// Most exactly-once appends one commit carries ([`append_once`]): bounds
/// the size of one metadata update.
pub(crate) const APPENDS_PER_COMMIT: usize = 64;

/// Appends `files` to `table` in one snapshot carrying `evidence`, unless a
/// snapshot carrying it exists. Returns the snapshot that holds them and
/// whether this call committed it.
///
/// Appends of this process that queue for one table go in one commit (a
/// group commit, [`crate::catalog::commit::group`]): one new version of the table carrying
/// one snapshot per append, each with its own evidence, committed only on a
/// version that holds none of them.
pub(crate) async fn append_once(
    catalog: &IcebergCatalog,
    table: &Table,
    files: Vec<DataFile>,
    evidence: Evidence,
) -> Result<Landed> {
    let append = OnceAppend { files, evidence };
    // Boxed, as below: a grouped commit nests deep, and callers nest it
    // in their own futures (an embedder's too).
    let grouped = Box::pin(catalog.local().once_appends.join(
        &catalog.local().turns,
        &table.identifier().to_string(),
        append.clone(),
        |members| async move {
            let appends: Vec<OnceAppend> = members.iter().map(|m| m.work.clone()).collect();
            match commit_once(catalog, table, &appends, None, None).await {
                Ok(answers) => {
                    for (member, answer) in members.into_iter().zip(answers) {
                        member.answer(Some(answer));
                    }
                }
                // Each meets its own error, or succeeds, alone.
                Err(_) => members.into_iter().for_each(|m| m.answer(None)),
            }
        },
    ))
    .await;
    match grouped {
        Some(answer) => Ok(answer),
        None => {
            Box::pin(append_once_guarded(
                catalog,
                table,
                append.files,
                append.evidence,
                None,
                None,
            ))
            .await
        }
    }
}

/// [`append_once`], with `guard` run on every version the commit would land
/// on as well (after the evidence check): an error from it stops the commit
/// and is returned; and with `schema`, a new current schema of `table`
/// (columns added) committed with the files. Not grouped: the guard speaks
/// for this append alone.
pub(crate) async fn append_once_guarded(
    catalog: &IcebergCatalog,
    table: &Table,
    files: Vec<DataFile>,
    evidence: Evidence,
    guard: Option<LoadCheck>,
    schema: Option<Schema>,
) -> Result<Landed> {
    let append = OnceAppend { files, evidence };
    let mut answers = commit_once(catalog, table, &[append], guard, schema).await?;
    Ok(answers.remove(0))
}

/// Commits each of `appends` to `table` exactly once, together; for each,
/// the snapshot holding it and whether this call committed it.
///
/// The commit runs through a catalog that looks for every pending append's
/// evidence each time the table is loaded (and runs `guard`), and lands only
/// on the version it loaded, so none of iceberg's retries can append twice.
/// After any answer, including a lost one, the table is loaded again and the
/// evidence decides: appends found there are answered, the rest tried again.
async fn commit_once(
    catalog: &IcebergCatalog,
    table: &Table,
    appends: &[OnceAppend],
    guard: Option<LoadCheck>,
    schema: Option<Schema>,
) -> Result<Vec<Landed>> {
    let from_schema = table.metadata().current_schema_id();
    // Commits of this process to one table take turns; other processes are
    // met by retries.
    let _turn = catalog.exclusive(&table.identifier().to_string()).await;
    let mut answers: Vec<Option<Landed>> = vec![None; appends.len()];
    let mut base = table.clone();
    let mut attempt = 0u32;
    loop {
        let pending: Vec<&OnceAppend> = appends
            .iter()
            .zip(&answers)
            .filter(|(_, answer)| answer.is_none())
            .map(|(append, _)| append)
            .collect();
        let wanted: Vec<Evidence> = pending.iter().map(|a| a.evidence.clone()).collect();
        let evidence = load_check(move |table: &Table| {
            match wanted.iter().any(|e| e.found_in(table).is_some()) {
                true => Err(iceberg::Error::new(
                    iceberg::ErrorKind::DataInvalid,
                    ALREADY_COMMITTED,
                )),
                false => Ok(()),
            }
        });
        let check = match &guard {
            Some(guard) => both(evidence, Arc::clone(guard)),
            None => evidence,
        };
        let mut tx = Transaction::new(&base);
        for append in &pending {
            tx = with_append(tx, &append.files, append.evidence.properties())?;
        }
        let mut exact = catalog.exact().check_on_load(check);
        if let Some(schema) = &schema {
            exact = exact.evolving(from_schema, schema.clone());
        }
        let result = tx.commit(&exact).await;
        let current = catalog.catalog().load_table(table.identifier()).await?;
        let mut found = false;
        for (append, answer) in appends.iter().zip(answers.iter_mut()) {
            if answer.is_some() {
                continue;
            }
            if let Some(snapshot_id) = append.evidence.found_in(&current) {
                let committed_here = matches!(
                    &result,
                    Ok(committed) if append.evidence.found_in(committed) == Some(snapshot_id)
                );
                *answer = Some(Landed {
                    snapshot_id,
                    committed_here,
                });
                found = true;
            }
        }
        if answers.iter().all(Option::is_some) {
            // The commits are answered; what they leave due runs apart.
            catalog.appended(current, Owner::User);
            return Ok(answers.into_iter().flatten().collect());
        }
        match result {
            Ok(_) => {
                return Err(Error::internal(format!(
                    "the commit to {} succeeded but it holds no snapshot with the evidence of every append",
                    table.identifier()
                )));
            }
            // Some were committed elsewhere meanwhile: the rest go again.
            Err(_) if found => base = current,
            Err(e) if retry(&e, attempt) => {
                attempt += 1;
                tokio::time::sleep(jitter(attempt)).await;
                base = current;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Where a compare-and-swap on a table's properties stands.
#[derive(Debug)]
pub(crate) enum Swap {
    /// Committed: the table as it is now.
    Done(Table),
    /// The condition did not hold when the commit was attempted; the value
    /// of the `state` property found instead.
    Refused(String),
}

const CONDITION_FAILED: &str = "the table changed concurrently: state is now ";

/// Sets `properties` on `table`, but only if `accept` approves the table's
/// properties as they are when the commit is attempted, and only on the very
/// version it approved (a compare-and-swap of the table's pointer): two
/// processes racing for one transition can never both win. The check runs
/// again on every retry. `state_key` names the property reported when the
/// check refuses.
pub(crate) async fn swap_properties(
    catalog: &IcebergCatalog,
    table: &Table,
    state_key: &'static str,
    accept: impl Fn(&HashMap<String, String>) -> bool + Send + Sync + 'static,
    properties: HashMap<String, String>,
) -> Result<Swap> {
    let check = load_check(move |table: &Table| {
        let props = table.metadata().properties();
        if accept(props) {
            Ok(())
        } else {
            let now = props
                .get(state_key)
                .cloned()
                .unwrap_or_else(|| "unknown".to_string());
            Err(iceberg::Error::new(
                iceberg::ErrorKind::DataInvalid,
                format!("{CONDITION_FAILED}{now}"),
            ))
        }
    });
    let guarded = catalog.exact().check_on_load(check);
    retrying(|| async {
        let tx = Transaction::new(table);
        let mut action = tx.update_table_properties();
        for (key, value) in &properties {
            action = action.set(key.clone(), value.clone());
        }
        match action.apply(tx)?.commit(&guarded).await {
            Ok(table) => Ok(Swap::Done(table)),
            Err(e) if e.message().starts_with(CONDITION_FAILED) => Ok(Swap::Refused(
                e.message().trim_start_matches(CONDITION_FAILED).to_string(),
            )),
            Err(e) => Err(e.into()),
        }
    })
    .await
}

#[cfg(test)]
mod tests {

    use super::*;

    async fn embedded(dir: &std::path::Path) -> (IcebergCatalog, Table) {
        crate::catalog::test_table(dir).await
    }

    fn unset(key: &'static str) -> impl Fn(&HashMap<String, String>) -> bool + Send + Sync {
        move |props: &HashMap<String, String>| !props.contains_key(key)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_swap_lands_only_on_the_version_it_checked() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, table) = embedded(dir.path()).await;
        let checked = table.metadata_location().unwrap().to_string();

        // Two callers saw the same version; the first wins.
        let props = |v: &str| HashMap::from([("k".to_string(), v.to_string())]);
        let first = swap_properties(&catalog, &table, "k", unset("k"), props("a"))
            .await
            .unwrap();
        assert!(matches!(first, Swap::Done(_)), "{first:?}");
        // The second, holding the stale table, is checked again on the
        // version it would land on, and refused with what it found.
        let second = swap_properties(&catalog, &table, "k", unset("k"), props("b"))
            .await
            .unwrap();
        assert!(
            matches!(&second, Swap::Refused(now) if now == "a"),
            "{second:?}"
        );

        // The pointer moves only from the location the caller names.
        let ident = table.identifier();
        assert!(
            !catalog
                .pointers()
                .swap(ident, &checked, "file:///nowhere.metadata.json")
                .await
                .unwrap()
        );
        let now = catalog.catalog().load_table(ident).await.unwrap();
        assert_eq!(
            now.metadata().properties().get("k").map(String::as_str),
            Some("a")
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_append_with_evidence_commits_once() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, table) = embedded(dir.path()).await;
        let first = append_once(&catalog, &table, vec![], Evidence::new("upload-id", "u1"))
            .await
            .unwrap();
        assert!(first.committed_here);
        // Again with the stale table: the evidence is found, nothing is added.
        let again = append_once(&catalog, &table, vec![], Evidence::new("upload-id", "u1"))
            .await
            .unwrap();
        assert_eq!(again, Landed::before(first.snapshot_id));
        let now = catalog
            .catalog()
            .load_table(table.identifier())
            .await
            .unwrap();
        assert_eq!(now.metadata().snapshots().count(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_that_queue_for_a_table_share_one_commit() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, table) = embedded(dir.path()).await;
        let ident = table.identifier();
        let earlier = append_once(&catalog, &table, vec![], Evidence::new("upload-id", "u1"))
            .await
            .unwrap()
            .snapshot_id;
        let before = catalog.catalog().load_table(ident).await.unwrap();

        // Four appends queue while the table's group is busy; one of them
        // (u1) landed before.
        let local = catalog.local();
        let busy = local
            .turns
            .exclusive(&local.once_appends.turn(&ident.to_string()))
            .await;
        let ids = ["u1", "u2", "u3", "u4"];
        let appends = ids
            .iter()
            .map(|id| append_once(&catalog, &table, vec![], Evidence::new("upload-id", id)));
        let (answers, ()) = tokio::join!(futures::future::join_all(appends), async { drop(busy) });
        let answers: Vec<Landed> = answers.into_iter().map(Result::unwrap).collect();

        let after = catalog.catalog().load_table(ident).await.unwrap();
        assert_eq!(
            answers[0],
            Landed::before(earlier),
            "u1 is not appended again"
        );
        for (id, landed) in ids.iter().zip(&answers).skip(1) {
            assert!(landed.committed_here, "{id}");
            assert_eq!(
                Evidence::new("upload-id", id).found_in(&after),
                Some(landed.snapshot_id)
            );
        }
        // One snapshot per upload, the three new ones in one new version.
        assert_eq!(after.metadata().snapshots().count(), 4);
        assert_eq!(
            after.metadata().metadata_log().len(),
            before.metadata().metadata_log().len() + 1
        );
    }
}
