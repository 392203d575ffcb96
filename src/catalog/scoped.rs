//! A catalog decorator: narrows listings to one table and can check a
//! condition every time a table is loaded.
//!
//! Two uses, one type:
//!
//! * iceberg-datafusion only builds its catalog-backed table provider (the one
//!   that refreshes metadata on each scan and supports `INSERT INTO`) through
//!   `IcebergCatalogProvider`, which lists every namespace and table. Scoping
//!   the listing to one table makes that construction cost one table load.
//! * `Transaction::commit` reloads the table at the start of every attempt,
//!   including the retries it performs on conflicts. A load check therefore
//!   runs on every attempt, which is where promotion re-checks its
//!   exactly-once evidence (see `upload::promote`).
//! * With [`ScopedCatalog::exact`], a commit lands on exactly the version
//!   the check accepted, or not at all: the commit is applied to that
//!   version and the catalog's pointer is swapped from its metadata location
//!   ([`super::pointer`]). A racing process that committed in between makes
//!   the attempt conflict, and the retry loads and checks afresh.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::future::BoxFuture;
use iceberg::spec::Schema;
use iceberg::table::Table;
use iceberg::{
    Catalog, ErrorKind, Namespace, NamespaceIdent, Result, TableCommit, TableCreation, TableIdent,
    TableRequirement, TableUpdate,
};

use super::cache::KeptTables;
use super::pointer::PointerStore;

/// A check run on every table load; an error stops the caller. It may read
/// other tables (an async check), see [`load_check`] for a plain one.
pub(crate) type LoadCheck = Arc<dyn Fn(Table) -> BoxFuture<'static, Result<()>> + Send + Sync>;

/// A [`LoadCheck`] that needs nothing but the loaded table.
pub(crate) fn load_check(
    check: impl Fn(&Table) -> Result<()> + Send + Sync + 'static,
) -> LoadCheck {
    let check = Arc::new(check);
    Arc::new(move |table: Table| {
        let check = Arc::clone(&check);
        Box::pin(async move { check(&table) })
    })
}

/// Both checks, in order.
pub(crate) fn both(first: LoadCheck, second: LoadCheck) -> LoadCheck {
    Arc::new(move |table: Table| {
        let (first, second) = (Arc::clone(&first), Arc::clone(&second));
        Box::pin(async move {
            first(table.clone()).await?;
            second(table).await
        })
    })
}

/// See the module documentation.
#[derive(Clone)]
pub(crate) struct ScopedCatalog {
    inner: Arc<dyn Catalog>,
    only: Option<TableIdent>,
    on_load: Option<LoadCheck>,
    /// With [`Self::exact`]: the pointer store, and the table the last load
    /// handed out (the version the check accepted).
    exact: Option<(PointerStore, Arc<Mutex<Option<Table>>>)>,
    /// With [`Self::keeping_tables`]: the tables loaded, kept.
    kept: Option<Arc<KeptTables>>,
    /// With [`Self::evolving`]: the schema a commit's table had when its
    /// files were written, and the schema the commit makes current.
    evolve: Option<(i32, Schema)>,
}

impl ScopedCatalog {
    /// The tables kept, with [`Self::keeping_tables`].
    pub(crate) fn kept_tables(&self) -> Option<&Arc<KeptTables>> {
        self.kept.as_ref()
    }

    /// Delegates everything to `inner`.
    pub(crate) fn new(inner: Arc<dyn Catalog>) -> Self {
        Self {
            inner,
            only: None,
            on_load: None,
            exact: None,
            kept: None,
            evolve: None,
        }
    }

    /// Keeps the tables it loads ([`super::cache`]); `pointers` reads
    /// their pointers.
    pub(crate) fn keeping_tables(
        mut self,
        pointers: PointerStore,
        io: iceberg::io::FileIO,
    ) -> Self {
        self.kept = Some(Arc::new(KeptTables::new(pointers, io)));
        self
    }

    /// Keeps `committed`, the table as this process's commit left it.
    fn keep(&self, committed: &Table) {
        if let Some(kept) = &self.kept {
            kept.keep(committed.clone());
        }
    }

    fn forget(&self, table: &TableIdent) {
        if let Some(kept) = &self.kept {
            kept.forget(table);
        }
    }

    /// Commits only against the version the last load handed out (see the
    /// module documentation).
    pub(crate) fn exact(mut self, pointers: PointerStore) -> Self {
        self.exact = Some((pointers, Arc::default()));
        self
    }

    /// Makes `schema` current in the commit (with [`Self::exact`]), on a
    /// table whose current schema is still `from` (or already `schema`'s
    /// columns): the columns a copy adds land with its rows.
    pub(crate) fn evolving(mut self, from: i32, schema: Schema) -> Self {
        self.evolve = Some((from, schema));
        self
    }

    /// Lists only `table` (and its namespace).
    pub(crate) fn listing_only(mut self, table: TableIdent) -> Self {
        self.only = Some(table);
        self
    }

    /// Runs `check` on every loaded table before handing it out.
    pub(crate) fn check_on_load(mut self, check: LoadCheck) -> Self {
        self.on_load = Some(check);
        self
    }
}

impl fmt::Debug for ScopedCatalog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedCatalog")
            .field("inner", &self.inner)
            .field("only", &self.only)
            .field("on_load", &self.on_load.is_some())
            .finish()
    }
}

#[async_trait]
impl Catalog for ScopedCatalog {
    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> Result<Vec<NamespaceIdent>> {
        match &self.only {
            Some(table) if parent.is_none() => Ok(vec![table.namespace().clone()]),
            Some(_) => Ok(vec![]),
            None => self.inner.list_namespaces(parent).await,
        }
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
        match &self.only {
            Some(table) if table.namespace() == namespace => Ok(vec![table.clone()]),
            Some(_) => Ok(vec![]),
            None => self.inner.list_tables(namespace).await,
        }
    }

    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        creation: TableCreation,
    ) -> Result<Table> {
        self.inner.create_table(namespace, creation).await
    }

    async fn load_table(&self, table: &TableIdent) -> Result<Table> {
        let loaded = match &self.kept {
            Some(kept) => kept.load(self.inner.as_ref(), table).await?,
            None => self.inner.load_table(table).await?,
        };
        if let Some(check) = &self.on_load {
            check(loaded.clone()).await?;
        }
        if let Some((_, checked)) = &self.exact {
            super::specs::check_committable(&loaded)?;
            *checked.lock().expect("checked table") = Some(loaded.clone());
        }
        match &self.evolve {
            // The commit is built on the table as it will be: its snapshot
            // names the new schema.
            Some((from, schema)) => evolved_view(loaded, *from, schema),
            None => Ok(loaded),
        }
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

    async fn update_table(&self, mut commit: TableCommit) -> Result<Table> {
        let Some((pointers, checked)) = &self.exact else {
            self.forget(commit.identifier());
            let committed = self.inner.update_table(commit).await?;
            self.keep(&committed);
            return Ok(committed);
        };
        let ident = commit.identifier().clone();
        let base = checked
            .lock()
            .expect("checked table")
            .take()
            .filter(|t| *t.identifier() == ident)
            .ok_or_else(|| {
                iceberg::Error::new(
                    ErrorKind::Unexpected,
                    format!("internal: a commit to {ident} without a checked load before it"),
                )
            })?;
        let (requirements, mut updates) = (
            first_per_ref(commit.take_requirements()),
            commit.take_updates(),
        );
        if let Some((from, schema)) = &self.evolve
            && !has_columns_of(&base, schema)
        {
            columns_unchanged(&base, *from)?;
            updates.splice(
                0..0,
                [
                    TableUpdate::AddSchema {
                        schema: schema.clone(),
                    },
                    TableUpdate::SetCurrentSchema { schema_id: -1 },
                ],
            );
        }
        match pointers.commit(&base, requirements, updates).await? {
            Some(committed) => {
                self.keep(&committed);
                Ok(committed)
            }
            None => Err(iceberg::Error::new(
                ErrorKind::CatalogCommitConflicts,
                format!("{ident} changed after it was checked"),
            )
            .with_retryable(true)),
        }
    }
}

/// Whether `table`'s current schema is `schema`'s columns.
fn has_columns_of(table: &Table, schema: &Schema) -> bool {
    table.metadata().current_schema().as_struct() == schema.as_struct()
}

/// Fails unless `table`'s current schema is still schema `from`.
fn columns_unchanged(table: &Table, from: i32) -> Result<()> {
    if table.metadata().current_schema_id() == from {
        return Ok(());
    }
    Err(iceberg::Error::new(
        ErrorKind::DataInvalid,
        format!(
            "the columns of {} changed while this statement wrote its rows: nothing was \
             committed; run it again",
            table.identifier()
        ),
    ))
}

/// `table` as it is once `schema` (its columns, evolved from its current
/// schema `from`) is current; `table` itself when it already is.
fn evolved_view(table: Table, from: i32, schema: &Schema) -> Result<Table> {
    if has_columns_of(&table, schema) {
        return Ok(table);
    }
    columns_unchanged(&table, from)?;
    with_current_schema(&table, schema)
}

/// `table` with `schema` added and made current, in memory: what rows
/// with the new columns are written against before the commit that adds
/// them.
pub(crate) fn with_current_schema(table: &Table, schema: &Schema) -> Result<Table> {
    let metadata = table
        .metadata()
        .clone()
        .into_builder(table.metadata_location().map(str::to_string))
        .add_current_schema(schema.clone())?
        .build()?
        .metadata;
    let mut builder = Table::builder()
        .metadata(metadata)
        .identifier(table.identifier().clone())
        .file_io(table.file_io().clone())
        .runtime(iceberg::Runtime::current());
    if let Some(location) = table.metadata_location() {
        builder = builder.metadata_location(location);
    }
    builder.build()
}

/// `requirements` with only the first requirement on each ref's snapshot.
/// A transaction of several snapshots (a group commit) asks for each
/// snapshot's parent in turn; iceberg checked every later one against the
/// metadata the earlier ones produced, and the commit lands on exactly the
/// version checked, so the first is the one that speaks of that version.
fn first_per_ref(requirements: Vec<TableRequirement>) -> Vec<TableRequirement> {
    let mut seen = std::collections::HashSet::new();
    requirements
        .into_iter()
        .filter(|requirement| match requirement {
            TableRequirement::RefSnapshotIdMatch { r#ref, .. } => seen.insert(r#ref.clone()),
            _ => true,
        })
        .collect()
}
