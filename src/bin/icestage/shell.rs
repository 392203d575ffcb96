//! The shell: runs scripts and an interactive prompt, prints results with
//! datafusion-cli's printer, and keeps psql-style variables.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::common::instant::Instant;
use datafusion::prelude::SessionContext;
use datafusion_cli::object_storage::instrumented::InstrumentedObjectStoreRegistry;
use datafusion_cli::print_format::PrintFormat;
use datafusion_cli::print_options::{MaxRows, PrintOptions};
use icestage::sql::script::{ScriptItem, Variables, split_script};
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;

const HELP: &str = "\
icestage shell: SQL statements end with ';'.
  \\d                 list namespaces and tables of every catalog
  \\d <ns>            list the tables of a namespace
  \\d <ns>.<table>    describe a table
  \\set [name value]  set a variable, or list them; use it as :name, :'name' or :\"name\"
  \\unset name        remove a variable
  <statement> \\gset [prefix]  run a one-row statement and keep its columns as variables
  \\echo text         print text (variables are replaced)
  \\q                 quit
Upload flow: CREATE UPLOAD FOR ns.t \\gset  ->  INSERT INTO :staging_table ...;  ->  PROMOTE UPLOAD :'upload_id';";

pub(crate) struct Shell {
    ctx: SessionContext,
    print: PrintOptions,
    vars: Variables,
}

enum Outcome {
    Continue,
    Quit,
}

impl Shell {
    pub(crate) fn new(
        ctx: SessionContext,
        format: PrintFormat,
        quiet: bool,
        maxrows: MaxRows,
    ) -> Self {
        Self {
            ctx,
            print: PrintOptions {
                format,
                quiet,
                maxrows,
                color: false,
                instrumented_registry: Arc::new(InstrumentedObjectStoreRegistry::new()),
            },
            vars: Variables::default(),
        }
    }

    /// Runs every item of `text`; stops at the first error, printed on
    /// stderr. Returns false if an item failed.
    pub(crate) async fn run_script(&mut self, text: &str) -> bool {
        let (mut items, rest) = split_script(text);
        if !rest.trim().is_empty() {
            items.push(ScriptItem::Sql {
                text: rest.trim().to_string(),
                gset: None,
            });
        }
        for item in items {
            match self.run_item(item).await {
                Ok(Outcome::Continue) => {}
                Ok(Outcome::Quit) => return true,
                Err(message) => {
                    eprintln!("Error: {message}");
                    return false;
                }
            }
        }
        true
    }

    async fn run_item(&mut self, item: ScriptItem) -> Result<Outcome, String> {
        match item {
            ScriptItem::Sql { text, gset } => {
                let started = Instant::now();
                let batches = self.results(&text).await?;
                match gset {
                    Some(prefix) => self
                        .vars
                        .set_from_result(&prefix, &batches)
                        .map_err(|e| e.user_message())?,
                    None => self.show(&batches, started)?,
                }
                Ok(Outcome::Continue)
            }
            ScriptItem::Meta(line) => self.meta(&line).await,
        }
    }

    /// The rows of the statement `text` (its variables interpolated); a
    /// statement that does not plan also names the variables it uses that
    /// are not set.
    async fn results(&self, text: &str) -> Result<Vec<RecordBatch>, String> {
        let sql = self.vars.interpolate(text);
        let frame = icestage::sql(&self.ctx, &sql).await.map_err(|e| {
            let mut message = e.user_message();
            for name in self.vars.missing(text) {
                message.push_str(&format!(
                    "; the variable :{name} is not set: \\set {name} <value>, or end a \
                     query with \\gset to set its columns"
                ));
            }
            message
        })?;
        frame
            .collect()
            .await
            .map_err(|e| icestage::error_message(&e))
    }

    fn show(&self, batches: &[RecordBatch], started: Instant) -> Result<(), String> {
        let schema = match batches.first() {
            Some(b) => b.schema(),
            None => Arc::new(datafusion::arrow::datatypes::Schema::empty()),
        };
        let rows = batches.iter().map(|b| b.num_rows()).sum();
        let options = self.ctx.state().config().options().format.clone();
        let json_lines = match self.print.format {
            PrintFormat::Json => Some(false),
            PrintFormat::NdJson => Some(true),
            _ => None,
        };
        // A JSON column (`connection`) is written as the document it holds,
        // not as a string of JSON; DataFusion's printer then adds only its
        // summary line.
        if let Some(lines) = json_lines
            && icestage::has_json_columns(&schema)
            && rows > 0
        {
            let objects = icestage::json_rows(batches).map_err(|e| e.user_message())?;
            if lines {
                for object in objects {
                    println!("{}", serde_json::Value::from(object));
                }
            } else {
                println!("{}", serde_json::Value::from(objects));
            }
            return self
                .print
                .print_batches(schema, &[], started, rows, &options)
                .map_err(|e| icestage::error_message(&e));
        }
        self.print
            .print_batches(schema, batches, started, rows, &options)
            .map_err(|e| icestage::error_message(&e))
    }

    async fn meta(&mut self, line: &str) -> Result<Outcome, String> {
        let line = self.vars.interpolate(line);
        let mut parts = line.splitn(2, char::is_whitespace);
        let command = parts.next().unwrap_or_default();
        let arg = parts.next().unwrap_or_default().trim();
        match command {
            "\\q" | "\\quit" => return Ok(Outcome::Quit),
            "\\?" | "\\h" | "\\help" => println!("{HELP}"),
            "\\echo" => println!("{arg}"),
            "\\set" if arg.is_empty() => {
                for (name, value) in self.vars.iter() {
                    println!("{name} = '{value}'");
                }
            }
            "\\set" => {
                let (name, value) = arg.split_once(char::is_whitespace).unwrap_or((arg, ""));
                self.vars.set(name, value.trim());
            }
            "\\unset" => self.vars.unset(arg),
            "\\d" => {
                let started = Instant::now();
                let batches = self.results(&describe_sql(arg)).await?;
                let found = batches.iter().any(|b| b.num_rows() > 0);
                if !found && !arg.is_empty() {
                    return Err(if arg.contains('.') {
                        format!("no table '{arg}': \\d <namespace> lists a namespace's tables")
                    } else {
                        format!(
                            "no namespace '{arg}' holds a table: \\d lists every namespace's tables"
                        )
                    });
                }
                self.show(&batches, started)?;
            }
            other => {
                return Err(format!(
                    "unknown command '{other}': \\? lists the shell's commands"
                ));
            }
        }
        Ok(Outcome::Continue)
    }

    /// The interactive prompt, with history in ~/.icestage_history.
    pub(crate) async fn repl(&mut self) {
        let Ok(mut editor) = DefaultEditor::new() else {
            eprintln!("Error: this terminal cannot run an interactive prompt; use -c or -f");
            return;
        };
        let history = std::env::var_os("HOME")
            .map(|home| std::path::PathBuf::from(home).join(".icestage_history"));
        if let Some(path) = &history {
            let _ = editor.load_history(path);
        }
        println!(
            "icestage {} — \\? for help, \\q to quit",
            env!("CARGO_PKG_VERSION")
        );
        let mut pending = String::new();
        loop {
            let prompt = if pending.is_empty() {
                "icestage> "
            } else {
                "      -> "
            };
            match editor.readline(prompt) {
                Ok(line) => {
                    pending.push_str(&line);
                    pending.push('\n');
                    let (items, rest) = split_script(&pending);
                    if items.is_empty() {
                        continue;
                    }
                    let _ = editor.add_history_entry(pending.trim_end());
                    pending = rest;
                    for item in items {
                        match self.run_item(item).await {
                            Ok(Outcome::Continue) => {}
                            Ok(Outcome::Quit) => return self.save(&mut editor, &history),
                            Err(message) => eprintln!("Error: {message}"),
                        }
                    }
                }
                Err(ReadlineError::Interrupted) => pending.clear(),
                Err(ReadlineError::Eof) => break,
                Err(e) => {
                    eprintln!("Error: {e}");
                    break;
                }
            }
        }
        self.save(&mut editor, &history);
    }

    fn save(&self, editor: &mut DefaultEditor, history: &Option<std::path::PathBuf>) {
        if let Some(path) = history {
            let _ = editor.save_history(path);
        }
    }
}

/// The query behind `\d [name]`.
fn describe_sql(arg: &str) -> String {
    let quote = |s: &str| s.replace('\'', "''");
    match arg.split('.').collect::<Vec<_>>().as_slice() {
        [""] => "SELECT table_catalog AS catalog, table_schema AS namespace, table_name AS name \
                 FROM information_schema.tables \
                 WHERE table_schema <> 'information_schema' AND table_type = 'BASE TABLE' \
                 ORDER BY 1, 2, 3"
            .to_string(),
        [ns] => format!(
            "SELECT table_catalog AS catalog, table_schema AS namespace, table_name AS name \
             FROM information_schema.tables WHERE table_schema = '{}' ORDER BY 1, 2, 3",
            quote(ns)
        ),
        [ns, table] => format!(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns \
             WHERE table_schema = '{}' AND table_name = '{}' ORDER BY ordinal_position",
            quote(ns),
            quote(table)
        ),
        _ => format!(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns \
             WHERE table_catalog = '{}' AND table_schema = '{}' AND table_name = '{}' \
             ORDER BY ordinal_position",
            quote(arg.split('.').next().unwrap_or_default()),
            quote(arg.split('.').nth(1).unwrap_or_default()),
            quote(arg.split('.').nth(2).unwrap_or_default())
        ),
    }
}
