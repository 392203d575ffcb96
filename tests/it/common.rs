//! Test fixtures: a fresh embedded warehouse per test, sessions on it, and
//! the Python interpreter of the test virtual environment.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use datafusion::arrow::array::RecordBatch;
use datafusion::prelude::SessionContext;
use icestage::IcestageConfig;
use tempfile::TempDir;

/// A temporary warehouse: data files in a fresh folder, the catalog in the
/// embedded SQLite database there ([`Warehouse::new`]) or in a fresh
/// PostgreSQL database ([`Warehouse::postgres`]).
pub struct Warehouse {
    dir: TempDir,
    postgres: Option<PgDatabase>,
}

impl Warehouse {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
            postgres: None,
        }
    }

    /// A warehouse whose catalog is a fresh database on the test
    /// PostgreSQL server ([`PgDatabase`]).
    pub async fn postgres() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
            postgres: Some(PgDatabase::new().await),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The PostgreSQL URI of the catalog, for a PostgreSQL warehouse.
    pub fn postgres_uri(&self) -> Option<&str> {
        self.postgres.as_ref().map(|db| db.uri.as_str())
    }

    pub fn config(&self) -> IcestageConfig {
        match &self.postgres {
            None => IcestageConfig::embedded(self.path()).expect("embedded config"),
            Some(_) => IcestageConfig::from_toml_str(&self.catalog_toml()).expect("config"),
        }
    }

    /// The catalog as TOML: `warehouse = "<folder>"` for the embedded
    /// catalog, a `[[catalogs]]` entry otherwise. Root-level keys and
    /// arrays only, so it may open a config or end one.
    pub fn catalog_toml(&self) -> String {
        let dir = self.path().canonicalize().expect("warehouse folder");
        match &self.postgres {
            None => format!("warehouse = \"{}\"\n", dir.display()),
            Some(db) => format!(
                "[[catalogs]]\nname = \"local\"\ntype = \"sql\"\n[catalogs.config]\n\
                 uri = \"{}\"\nwarehouse = \"file://{}\"\n",
                db.uri,
                dir.display()
            ),
        }
    }

    /// The shell's flag and value that open this warehouse's catalog.
    pub fn shell_args(&self) -> [std::ffi::OsString; 2] {
        match &self.postgres {
            None => ["--warehouse".into(), self.path().into()],
            Some(_) => {
                let file = self.path().join("catalogs.toml");
                if !file.exists() {
                    std::fs::write(&file, self.catalog_toml()).expect("catalog config");
                }
                ["--catalog-config".into(), file.into()]
            }
        }
    }

    /// A new session on this warehouse: as another process would see it,
    /// sharing nothing but the catalog.
    pub async fn session(&self) -> SessionContext {
        let ctx = SessionContext::new();
        icestage::register(&ctx, self.config())
            .await
            .expect("register");
        ctx
    }

    /// The `connection` JSON that CREATE UPLOAD hands a client, for
    /// clients that act before any upload exists.
    pub fn connection(&self) -> String {
        let path = self.path().canonicalize().unwrap();
        serde_json::json!({
            "name": "local",
            "type": "sql",
            "uri": format!("sqlite:///{}", path.join("catalog.db").display()),
            "warehouse": format!("file://{}", path.display()),
        })
        .to_string()
    }
}

/// Runs one statement and collects its result.
pub async fn run(ctx: &SessionContext, sql: &str) -> icestage::Result<Vec<RecordBatch>> {
    let frame = icestage::sql(ctx, sql).await?;
    Ok(frame.collect().await?)
}

/// Runs each of `statements` in order; panics with the one that fails.
pub async fn setup(ctx: &SessionContext, statements: &[&str]) {
    for sql in statements {
        run(ctx, sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// The error `sql` fails with, as text; panics when it succeeds.
pub async fn refusal(ctx: &SessionContext, sql: &str) -> String {
    match run(ctx, sql).await {
        Ok(_) => panic!("{sql} succeeded"),
        Err(e) => e.to_string(),
    }
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

/// The Python of the test virtual environment (`.venv`, with PyIceberg and
/// moto), which `./scripts/test.sh` creates. A plain `cargo test` without it
/// fails with what to run: the suite never passes without its real
/// third-party clients, and a test run does not install software by itself.
pub fn python() -> PathBuf {
    static READY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    READY
        .get_or_init(|| {
            let python = repo().join(".venv").join("bin").join("python");
            let ready = python.exists()
                && Command::new(&python)
                    .args(["-c", "import pyiceberg, pyiceberg_core, moto"])
                    .status()
                    .is_ok_and(|s| s.success());
            if ready {
                Ok(python)
            } else {
                Err(format!(
                    "{} lacks PyIceberg or moto: run ./scripts/test.sh (or \
                     ./scripts/setup-venv.sh once, then cargo test)",
                    python.display()
                ))
            }
        })
        .clone()
        .unwrap_or_else(|e| panic!("the test virtual environment is not ready: {e}"))
}

/// Runs a Python script of `tests/python/` with `args`; panics with its
/// output when it fails. Returns its stdout.
pub fn python_script(script: &str, args: &[&str]) -> String {
    let path = repo().join("tests").join("python").join(script);
    let output = Command::new(python())
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

/// The value of `column` in the first row of `batches`, as text.
pub fn value(batches: &[RecordBatch], column: &str) -> String {
    let batch = batches.iter().find(|b| b.num_rows() > 0).expect("a row");
    let index = batch.schema().index_of(column).expect("column");
    datafusion::arrow::util::display::array_value_to_string(batch.column(index), 0).unwrap()
}

/// A freshly opened upload: its id, staging table and client connection JSON.
pub struct Upload {
    pub id: String,
    pub staging_table: String,
    pub connection: String,
}

pub async fn create_upload(ctx: &SessionContext, target: &str) -> Upload {
    let batches = run(ctx, &format!("CREATE UPLOAD FOR {target}"))
        .await
        .unwrap_or_else(|e| panic!("CREATE UPLOAD FOR {target}: {e}"));
    Upload {
        id: value(&batches, "upload_id"),
        staging_table: value(&batches, "staging_table"),
        connection: value(&batches, "connection"),
    }
}

/// The `icestage` shell on one catalog (`--warehouse DIR` or
/// `--catalog-config FILE`), quiet, printing CSV.
pub fn shell_csv(
    catalog_flag: impl AsRef<std::ffi::OsStr>,
    catalog: impl AsRef<std::ffi::OsStr>,
) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_icestage"));
    command
        .arg(catalog_flag)
        .arg(catalog)
        .args(["-q", "--format", "csv"]);
    command
}

/// The standard output of a shell run, which must have succeeded.
pub fn stdout_of_success(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A port on 127.0.0.1 that nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Every file below `dir`, at any depth.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = vec![];
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// A fresh database on the test PostgreSQL server, dropped when the test
/// ends. The server is `ICESTAGE_TEST_POSTGRES` (default
/// `postgres://postgres@127.0.0.1:5432/postgres`, the one this project's
/// development and CI machines run); a server that does not answer fails
/// the test with what to do, never skips it.
pub struct PgDatabase {
    admin: String,
    name: String,
    /// The URI of the fresh database.
    pub uri: String,
}

impl PgDatabase {
    pub async fn new() -> Self {
        use sqlx::Connection;
        static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let admin = std::env::var("ICESTAGE_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string());
        let mut connection = sqlx::PgConnection::connect(&admin)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "no PostgreSQL answers at {admin} ({e}): start one, or set \
                 ICESTAGE_TEST_POSTGRES=postgres://user@host:port/database to a server where \
                 that user may create databases"
                )
            });
        let name = format!(
            "icestage_test_{}_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
        );
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut connection)
            .await
            .unwrap_or_else(|e| panic!("cannot create database {name} at {admin}: {e}"));
        let mut uri = url::Url::parse(&admin).expect("ICESTAGE_TEST_POSTGRES is a URI");
        uri.set_path(&name);
        Self {
            admin,
            name,
            uri: uri.to_string(),
        }
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let (admin, name) = (self.admin.clone(), self.name.clone());
        // Its own runtime on its own thread: a drop may run inside a test's.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                use sqlx::Connection;
                if let Ok(mut connection) = sqlx::PgConnection::connect(&admin).await {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&mut connection)
                        .await;
                }
            })
        })
        .join();
    }
}
