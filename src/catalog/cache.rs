//! Tables of a SQL catalog, kept once loaded. A table's metadata file never
//! changes once written (a commit writes a new one and moves the table's
//! pointer to it), so a load whose pointer still names the file loaded
//! before hands out that table again, with the manifests and manifest lists
//! it has read since, instead of reading and parsing the metadata again
//! (under the service's load, the target of 200 uploads is loaded by every
//! status read and every promotion). The pointer itself is read on every
//! load, so a load is exactly as fresh as without the cache.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use iceberg::table::Table;
use iceberg::{Catalog, Namespace, NamespaceIdent, Result, TableCommit, TableCreation, TableIdent};

use super::pointer::PointerStore;

/// Tables kept at most; past it, the least recently loaded goes. Each
/// keeps what it read of its manifests in iceberg's own bounded cache.
const MOST_TABLES: usize = 256;

/// `inner` with the tables it loaded kept (see the module documentation).
#[derive(Debug)]
pub(crate) struct CachedTables {
    inner: Arc<dyn Catalog>,
    pointers: PointerStore,
    kept: Mutex<Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    tables: HashMap<TableIdent, (Table, u64)>,
    clock: u64,
}

impl Kept {
    fn get(&mut self, ident: &TableIdent, location: &str) -> Option<Table> {
        self.clock += 1;
        let clock = self.clock;
        let (table, used) = self.tables.get_mut(ident)?;
        if table.metadata_location() != Some(location) {
            return None;
        }
        *used = clock;
        Some(table.clone())
    }

    fn keep(&mut self, table: Table) {
        self.clock += 1;
        if self.tables.len() >= MOST_TABLES && !self.tables.contains_key(table.identifier()) {
            let oldest = self
                .tables
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(ident, _)| ident.clone());
            if let Some(oldest) = oldest {
                self.tables.remove(&oldest);
            }
        }
        self.tables
            .insert(table.identifier().clone(), (table, self.clock));
    }
}

impl CachedTables {
    /// Keeps the tables `inner` loads; `pointers` reads their pointers.
    pub(crate) fn new(inner: Arc<dyn Catalog>, pointers: PointerStore) -> Self {
        Self {
            inner,
            pointers,
            kept: Mutex::default(),
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().expect("kept tables")
    }

    fn forget(&self, table: &TableIdent) {
        self.kept().tables.remove(table);
    }
}

#[async_trait]
impl Catalog for CachedTables {
    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> Result<Vec<NamespaceIdent>> {
        self.inner.list_namespaces(parent).await
    }

    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<Namespace> {
        self.inner.create_namespace(namespace, properties).await
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> Result<Namespace> {
        self.inner.get_namespace(namespace).await
    }

    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> Result<bool> {
        self.inner.namespace_exists(namespace).await
    }

    async fn update_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<()> {
        self.inner.update_namespace(namespace, properties).await
    }

    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> Result<()> {
        self.inner.drop_namespace(namespace).await
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> Result<Vec<TableIdent>> {
        self.inner.list_tables(namespace).await
    }

    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        creation: TableCreation,
    ) -> Result<Table> {
        self.inner.create_table(namespace, creation).await
    }

    async fn load_table(&self, table: &TableIdent) -> Result<Table> {
        // Any trouble reading the pointer: the catalog's own load answers.
        if let Ok(Some(location)) = self.pointers.location(table).await
            && let Some(kept) = self.kept().get(table, &location)
        {
            return Ok(kept);
        }
        let loaded = self.inner.load_table(table).await?;
        self.kept().keep(loaded.clone());
        Ok(loaded)
    }

    async fn drop_table(&self, table: &TableIdent) -> Result<()> {
        self.forget(table);
        self.inner.drop_table(table).await
    }

    async fn purge_table(&self, table: &TableIdent) -> Result<()> {
        self.forget(table);
        self.inner.purge_table(table).await
    }

    async fn table_exists(&self, table: &TableIdent) -> Result<bool> {
        self.inner.table_exists(table).await
    }

    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> Result<()> {
        self.forget(src);
        self.forget(dest);
        self.inner.rename_table(src, dest).await
    }

    async fn register_table(&self, table: &TableIdent, metadata_location: String) -> Result<Table> {
        self.forget(table);
        self.inner.register_table(table, metadata_location).await
    }

    async fn update_table(&self, commit: TableCommit) -> Result<Table> {
        self.forget(commit.identifier());
        self.inner.update_table(commit).await
    }
}

#[cfg(test)]
mod tests {
    use iceberg::transaction::{ApplyTransactionAction, Transaction};

    use super::super::IcebergCatalog;
    use super::*;

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
