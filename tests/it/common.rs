//! Test fixtures: a fresh embedded warehouse per test, sessions on it, and
//! the Python interpreter of the test virtual environment.

use std::path::{Path, PathBuf};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::prelude::SessionContext;
use icestage::IcestageConfig;
use tempfile::TempDir;

/// A temporary embedded warehouse (SQLite catalog + data files).
pub struct Warehouse {
    dir: TempDir,
}

impl Warehouse {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn config(&self) -> IcestageConfig {
        IcestageConfig::embedded(self.path()).expect("embedded config")
    }

    /// A new session on this warehouse: as another process would see it,
    /// sharing nothing but the catalog.
    pub async fn session(&self) -> SessionContext {
        let ctx = SessionContext::new();
        icestage::register(&ctx, self.config()).await.expect("register");
        ctx
    }

    /// The SQLAlchemy URI PyIceberg uses for the catalog.
    pub fn pyiceberg_uri(&self) -> String {
        format!("sqlite:///{}", self.path().canonicalize().unwrap().join("catalog.db").display())
    }

    pub fn warehouse_uri(&self) -> String {
        format!("file://{}", self.path().canonicalize().unwrap().display())
    }
}

/// Runs one statement and collects its result.
pub async fn run(ctx: &SessionContext, sql: &str) -> icestage::Result<Vec<RecordBatch>> {
    let frame = icestage::sql(ctx, sql).await?;
    Ok(frame.collect().await?)
}

/// Runs one statement that must succeed and returns its result as a table.
pub async fn table(ctx: &SessionContext, sql: &str) -> String {
    let batches = run(ctx, sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    pretty_format_batches(&batches).unwrap().to_string()
}

/// The single string value of a one-row, one-column result.
pub async fn scalar(ctx: &SessionContext, sql: &str) -> String {
    let batches = run(ctx, sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    let batch = batches.iter().find(|b| b.num_rows() > 0).expect("a row");
    datafusion::arrow::util::display::array_value_to_string(batch.column(0), 0).unwrap()
}

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Python of the test virtual environment that `scripts/test.sh` creates
/// (with pyiceberg and moto). A missing environment fails the test: the
/// suite never passes without its real third-party clients.
pub fn python() -> PathBuf {
    let venv = std::env::var_os("ICESTAGE_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".venv"));
    let python = venv.join("bin").join("python");
    assert!(
        python.exists(),
        "{} is missing: run ./scripts/test.sh, which creates the test virtual environment \
         (pyiceberg, moto) before running the tests",
        python.display()
    );
    python
}

/// Runs a Python script of `tests/python/` with `args`; panics with its
/// output when it fails. Returns its stdout.
pub fn python_script(script: &str, args: &[&str]) -> String {
    let path = repo().join("tests").join("python").join(script);
    let output = std::process::Command::new(python())
        .arg(&path)
        .args(args)
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "{script} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}
