//! Tables of a SQL catalog, kept once loaded. A table's metadata file never
//! changes once written (a commit writes a new one and moves the table's
//! pointer to it), so a load whose pointer still names the file loaded
//! before hands out that table again, with the manifests and manifest lists
//! it has read since, instead of reading and parsing the metadata again
//! (under the service's load, the target of 200 uploads is loaded by every
//! status read and every promotion). The pointer itself is read on every
//! load, so a load is exactly as fresh as without the cache.

use std::collections::HashMap;
use std::sync::Mutex;

use iceberg::table::Table;
use iceberg::{Catalog, Result, TableIdent};

use super::pointer::PointerStore;

/// Tables kept at most; past it, the least recently loaded goes. Each
/// keeps what it read of its manifests in iceberg's own bounded cache.
const MOST_TABLES: usize = 256;

/// Values by key, up to a total weight of `most` (each value weighs 1
/// unless put with [`Lru::put_weighing`]); past it, the least recently used
/// go.
#[derive(Debug)]
pub(crate) struct Lru<K, V> {
    entries: HashMap<K, Kept<V>>,
    clock: u64,
    weight: usize,
    most: usize,
}

#[derive(Debug)]
struct Kept<V> {
    value: V,
    used: u64,
    weight: usize,
}

impl<K: std::hash::Hash + Eq + Clone, V> Lru<K, V> {
    pub(crate) fn new(most: usize) -> Self {
        Self {
            entries: HashMap::new(),
            clock: 0,
            weight: 0,
            most: most.max(1),
        }
    }

    /// The value of `key`, now the most recently used.
    pub(crate) fn get(&mut self, key: &K) -> Option<&V> {
        self.clock += 1;
        let clock = self.clock;
        let kept = self.entries.get_mut(key)?;
        kept.used = clock;
        Some(&kept.value)
    }

    pub(crate) fn put(&mut self, key: K, value: V) {
        self.put_weighing(key, value, 1);
    }

    /// Keeps `value` as weighing `weight` (at least 1): the least recently
    /// used others go until the total fits. One heavier than the whole
    /// bound is kept alone.
    pub(crate) fn put_weighing(&mut self, key: K, value: V, weight: usize) {
        let weight = weight.max(1);
        self.remove(&key);
        while self.weight + weight > self.most && !self.entries.is_empty() {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, kept)| kept.used)
                .map(|(key, _)| key.clone());
            if let Some(oldest) = oldest {
                self.remove(&oldest);
            }
        }
        self.clock += 1;
        self.weight += weight;
        let used = self.clock;
        self.entries.insert(
            key,
            Kept {
                value,
                used,
                weight,
            },
        );
    }

    pub(crate) fn remove(&mut self, key: &K) {
        if let Some(kept) = self.entries.remove(key) {
            self.weight -= kept.weight;
        }
    }
}

/// The tables a catalog loaded, kept (see the module documentation); used
/// by [`super::scoped::ScopedCatalog::keeping_tables`].
#[derive(Debug)]
pub(crate) struct KeptTables {
    pointers: PointerStore,
    /// Reads a metadata file for its first parse.
    io: iceberg::io::FileIO,
    /// Each table, and whether its metadata is known to be what icestage
    /// committed (its own commit, or a file checked since it was parsed:
    /// [`KeptTables::vouch`]).
    kept: Mutex<Lru<TableIdent, (Table, bool)>>,
}

impl KeptTables {
    /// Tables whose pointers `pointers` reads, their files read by `io`.
    pub(crate) fn new(pointers: PointerStore, io: iceberg::io::FileIO) -> Self {
        Self {
            pointers,
            io,
            kept: Mutex::new(Lru::new(MOST_TABLES)),
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Lru<TableIdent, (Table, bool)>> {
        self.kept.lock().expect("kept tables")
    }

    /// `table` as the catalog's pointer names it now: the one kept if it
    /// is that version, else loaded from `inner` (and kept).
    pub(crate) async fn load(&self, inner: &dyn Catalog, table: &TableIdent) -> Result<Table> {
        // Any trouble reading the pointer: the catalog's own load answers.
        let location = self.pointers.location(table).await.ok().flatten();
        if let Some(location) = location {
            if let Some(kept) = self
                .kept()
                .get(table)
                .filter(|(kept, _)| kept.metadata_location() == Some(location.as_str()))
                .map(|(kept, _)| kept.clone())
            {
                return Ok(kept);
            }
            let (loaded, sound) = self.parse(table, location).await?;
            self.kept().put(table.clone(), (loaded.clone(), sound));
            return Ok(loaded);
        }
        let loaded = inner.load_table(table).await?;
        // Parsed from a file: not vouched for until checked.
        self.kept()
            .put(loaded.identifier().clone(), (loaded.clone(), false));
        Ok(loaded)
    }

    /// `table` parsed from its metadata file at `location`, read once and
    /// within [`crate::limits::ReadLimits::metadata_bytes`] (a client that
    /// can write the metadata folder, a local warehouse, may have grown the
    /// file in place), with whether it holds what icestage committed there
    /// ([`super::pointer::rewritten_bytes`]: the same bytes, not a second
    /// read). A gzip-compressed file is inflated within
    /// [`crate::limits::ReadLimits::metadata_inflated_bytes`].
    async fn parse(&self, table: &TableIdent, location: String) -> Result<(Table, bool)> {
        let bytes = match super::confine::read_bounded(&self.io, &location).await {
            Ok(Ok(bytes)) => bytes,
            Ok(Err((size, bound))) => {
                return Err(iceberg::Error::new(
                    iceberg::ErrorKind::DataInvalid,
                    format!(
                        "the metadata file of {table}, {location}, holds {size} bytes, more than \
                         the {} a metadata file may hold (limits.metadata_bytes): it was written \
                         outside icestage; restore the table or raise the limit",
                        crate::limits::human(bound)
                    ),
                ));
            }
            Err(crate::error::Error::Iceberg(e)) => return Err(e),
            Err(e) => {
                return Err(iceberg::Error::new(
                    iceberg::ErrorKind::Unexpected,
                    format!("cannot read {location}: {e}"),
                ));
            }
        };
        let metadata: iceberg::spec::TableMetadata =
            serde_json::from_slice(&super::confine::metadata_json(&location, &bytes)?)?;
        let sound = super::pointer::rewritten_bytes(&location, &bytes).is_none();
        let loaded = Table::builder()
            .identifier(table.clone())
            .file_io(self.io.clone())
            .metadata(metadata)
            .metadata_location(location)
            .runtime(iceberg::Runtime::current())
            .build()?;
        Ok((loaded, sound))
    }

    /// Keeps `table` as a commit of this process left it: the next load
    /// hands it out while the pointer names its metadata file, instead of
    /// reading back what the commit just wrote (which is icestage's own).
    pub(crate) fn keep(&self, table: Table) {
        self.kept().put(table.identifier().clone(), (table, true));
    }

    /// Whether `table`, as kept, is known to hold the metadata icestage
    /// committed at its location.
    pub(crate) fn vouched(&self, table: &Table) -> bool {
        self.kept()
            .get(table.identifier())
            .is_some_and(|(kept, sound)| {
                *sound && kept.metadata_location() == table.metadata_location()
            })
    }

    /// Records that `table`'s metadata file was checked and holds what
    /// icestage committed; the kept table is that parse when it is at the
    /// same location.
    pub(crate) fn vouch(&self, table: &Table) {
        let mut kept = self.kept();
        if let Some((at, _)) = kept.get(table.identifier())
            && at.metadata_location() == table.metadata_location()
        {
            let at = at.clone();
            kept.put(table.identifier().clone(), (at, true));
        }
    }

    /// Lets go of `table` (dropped, renamed, replaced).
    pub(crate) fn forget(&self, table: &TableIdent) {
        self.kept().remove(table);
    }

    /// What the catalog's metadata files are read and written with.
    pub(crate) fn io(&self) -> &iceberg::io::FileIO {
        &self.io
    }
}

#[cfg(test)]
mod tests {
    use iceberg::transaction::{ApplyTransactionAction, Transaction};

    use std::sync::Arc;

    use super::super::IcebergCatalog;

    /// Past its bound, the least recently used values go, by weight: one
    /// heavy value makes room by sending several light ones away, and the
    /// one read last stays.
    #[test]
    fn an_lru_keeps_the_recently_used_within_its_weight() {
        let mut lru = super::Lru::new(10);
        for n in 0..10 {
            lru.put(n, n);
        }
        assert!(lru.get(&0).is_some());
        lru.put_weighing(10, 10, 4);
        let kept: Vec<i32> = (0..=10).filter(|n| lru.get(n).is_some()).collect();
        assert_eq!(kept, [0, 5, 6, 7, 8, 9, 10]);
        // Put again: weighed anew, not twice.
        lru.put_weighing(10, 10, 4);
        assert_eq!((0..=10).filter(|n| lru.get(n).is_some()).count(), 7);
        // Heavier than the bound: kept alone.
        lru.put_weighing(11, 11, 25);
        let kept: Vec<i32> = (0..=11).filter(|n| lru.get(n).is_some()).collect();
        assert_eq!(kept, [11]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kept_table_is_handed_out_only_while_its_pointer_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, table) = super::super::test_table(dir.path()).await;
        let ident = table.identifier().clone();
        let first = catalog.catalog().load_table(&ident).await.unwrap();
        let again = catalog.catalog().load_table(&ident).await.unwrap();
        assert!(
            Arc::ptr_eq(&first.metadata_ref(), &again.metadata_ref()),
            "an unchanged table is not read again"
        );

        // Commits of this process, plain and exact: the next load hands out
        // the table each committed, without reading back what it wrote.
        let set = |table: &iceberg::table::Table, value: &str| {
            let tx = Transaction::new(table);
            tx.update_table_properties()
                .set("mine".to_string(), value.to_string())
                .apply(tx)
                .unwrap()
        };
        let plain = set(&again, "1")
            .commit(catalog.catalog().as_ref())
            .await
            .unwrap();
        let loaded = catalog.catalog().load_table(&ident).await.unwrap();
        assert!(Arc::ptr_eq(&plain.metadata_ref(), &loaded.metadata_ref()));
        let exact = set(&loaded, "2").commit(&catalog.exact()).await.unwrap();
        let loaded = catalog.catalog().load_table(&ident).await.unwrap();
        assert!(Arc::ptr_eq(&exact.metadata_ref(), &loaded.metadata_ref()));
        assert_eq!(
            loaded
                .metadata()
                .properties()
                .get("mine")
                .map(String::as_str),
            Some("2")
        );

        // Another process (a catalog of its own on the same database)
        // commits: the next load here is that version.
        let config = crate::config::IcestageConfig::embedded(dir.path()).unwrap();
        let other = IcebergCatalog::open(&config.catalogs[0]).await.unwrap();
        let theirs = other.catalog().load_table(&ident).await.unwrap();
        let tx = Transaction::new(&theirs);
        let tx = tx
            .update_table_properties()
            .set("k".to_string(), "v".to_string())
            .apply(tx)
            .unwrap();
        let committed = tx.commit(other.catalog().as_ref()).await.unwrap();
        let now = catalog.catalog().load_table(&ident).await.unwrap();
        assert_eq!(now.metadata_location(), committed.metadata_location());
        assert_eq!(
            now.metadata().properties().get("k").map(String::as_str),
            Some("v")
        );

        // Dropped elsewhere: not found here either.
        other.catalog().drop_table(&ident).await.unwrap();
        assert!(catalog.catalog().load_table(&ident).await.is_err());
    }
}
