//! icestage's statements, parsed by wrapping DataFusion's [`DFParser`].
//!
//! The parser looks at the first words of each statement: icestage's own
//! statements are parsed here, everything else goes to `DFParser` unchanged.
//! Each AST type implements `Display` so that a statement prints back as SQL.

use std::collections::VecDeque;
use std::fmt;

use datafusion::error::DataFusionError;
use datafusion::sql::parser::{DFParser, DFParserBuilder, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::{ObjectName, Value};
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer, Word};

use crate::error::{Error, Result};

/// One parsed statement.
#[derive(Debug, Clone, PartialEq)]
pub enum Statement {
    /// Anything DataFusion parses.
    DataFusion(Box<DFStatement>),
    /// `CREATE UPLOAD FOR <table> [WITH (...)]`
    CreateUpload(CreateUpload),
    /// `PROMOTE UPLOAD '<id>' [WITH (...)]`
    PromoteUpload(UploadStatement),
    /// `PUBLISH UPLOAD '<id>'`
    PublishUpload(UploadStatement),
    /// `ABORT UPLOAD '<id>'`
    AbortUpload(UploadStatement),
    /// `EXPIRE STAGING`
    ExpireStaging,
    /// `EXPIRE SNAPSHOTS <table> [WITH (...)]`
    ExpireSnapshots {
        /// The table.
        table: ObjectName,
        /// `WITH` options.
        options: Vec<(String, String)>,
    },
    /// `REWRITE MANIFESTS <table>`
    RewriteManifests {
        /// The table.
        table: ObjectName,
    },
    /// `REWRITE DATA FILES <table> [WITH (...)]`
    RewriteDataFiles {
        /// The table.
        table: ObjectName,
        /// `WITH` options.
        options: Vec<(String, String)>,
    },
    /// `REMOVE ORPHAN FILES <table> [WITH (...)]`
    RemoveOrphanFiles {
        /// The table.
        table: ObjectName,
        /// `WITH` options.
        options: Vec<(String, String)>,
    },
    /// `CREATE DOWNLOAD [WITH (...)] AS <query>`
    CreateDownload {
        /// `WITH` options.
        options: Vec<(String, String)>,
        /// The query whose rows fill the download.
        query: Box<datafusion::sql::sqlparser::ast::Query>,
    },
    /// `DROP DOWNLOAD '<id>'`
    DropDownload {
        /// The download id, as written.
        id: String,
    },
    /// `COPY INTO <table> FROM '<uri>' [WITH (...)]`
    CopyInto {
        /// The table to load.
        table: ObjectName,
        /// The source URI.
        uri: String,
        /// `WITH` options.
        options: Vec<(String, String)>,
    },
    /// `CREATE PIPE [IF NOT EXISTS] <name> [WITH (...)] AS COPY INTO ...`
    CreatePipe {
        /// The pipe.
        name: ObjectName,
        /// `IF NOT EXISTS` was given.
        if_not_exists: bool,
        /// `WITH` options of the pipe.
        options: Vec<(String, String)>,
        /// The `COPY INTO` statement it runs.
        copy: Box<Statement>,
    },
    /// `RUN PIPE <name>`
    RunPipe {
        /// The pipe.
        name: ObjectName,
    },
    /// `ALTER PIPE <name> PAUSE | RESUME`
    AlterPipe {
        /// The pipe.
        name: ObjectName,
        /// `true` for `PAUSE`, `false` for `RESUME`.
        pause: bool,
    },
    /// `DROP PIPE [IF EXISTS] <name>`
    DropPipe {
        /// The pipe.
        name: ObjectName,
        /// `IF EXISTS` was given.
        if_exists: bool,
    },
    /// `CREATE NAMESPACE [IF NOT EXISTS] <name>`
    CreateNamespace {
        /// The namespace.
        name: ObjectName,
        /// `IF NOT EXISTS` was given.
        if_not_exists: bool,
    },
    /// `EXPLAIN [VERBOSE] <icestage statement>`
    Explain {
        /// `VERBOSE` was given.
        verbose: bool,
        /// The statement explained.
        statement: Box<Statement>,
    },
}

/// `CREATE UPLOAD FOR <table> [WITH (key = value, ...)]`
#[derive(Debug, Clone, PartialEq)]
pub struct CreateUpload {
    /// The target table.
    pub target: ObjectName,
    /// `WITH` options, e.g. `ttl = '24h'`.
    pub options: Vec<(String, String)>,
}

/// A statement about one upload: `PROMOTE UPLOAD '<id>'`, `PUBLISH UPLOAD
/// '<id>'`, `ABORT UPLOAD '<id>'`.
#[derive(Debug, Clone, PartialEq)]
pub struct UploadStatement {
    /// The upload id, as written.
    pub id: String,
    /// `WITH` options.
    pub options: Vec<(String, String)>,
}

fn fmt_options(f: &mut fmt::Formatter<'_>, options: &[(String, String)]) -> fmt::Result {
    if options.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = options
        .iter()
        .map(|(k, v)| format!("{k} = '{}'", v.replace('\'', "''")))
        .collect();
    write!(f, " WITH ({})", list.join(", "))
}

impl fmt::Display for CreateUpload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CREATE UPLOAD FOR {}", self.target)?;
        fmt_options(f, &self.options)
    }
}

impl fmt::Display for Statement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Statement::DataFusion(s) => write!(f, "{s}"),
            Statement::CreateUpload(s) => write!(f, "{s}"),
            Statement::PromoteUpload(s) => {
                write!(f, "PROMOTE UPLOAD '{}'", s.id)?;
                fmt_options(f, &s.options)
            }
            Statement::PublishUpload(s) => write!(f, "PUBLISH UPLOAD '{}'", s.id),
            Statement::AbortUpload(s) => write!(f, "ABORT UPLOAD '{}'", s.id),
            Statement::ExpireStaging => write!(f, "EXPIRE STAGING"),
            Statement::ExpireSnapshots { table, options } => {
                write!(f, "EXPIRE SNAPSHOTS {table}")?;
                fmt_options(f, options)
            }
            Statement::RewriteManifests { table } => write!(f, "REWRITE MANIFESTS {table}"),
            Statement::RewriteDataFiles { table, options } => {
                write!(f, "REWRITE DATA FILES {table}")?;
                fmt_options(f, options)
            }
            Statement::RemoveOrphanFiles { table, options } => {
                write!(f, "REMOVE ORPHAN FILES {table}")?;
                fmt_options(f, options)
            }
            Statement::CreateDownload { options, query } => {
                write!(f, "CREATE DOWNLOAD")?;
                fmt_options(f, options)?;
                write!(f, " AS {query}")
            }
            Statement::DropDownload { id } => write!(f, "DROP DOWNLOAD '{id}'"),
            Statement::CopyInto {
                table,
                uri,
                options,
            } => {
                write!(f, "COPY INTO {table} FROM '{}'", uri.replace('\'', "''"))?;
                let shown: Vec<(String, String)> = options
                    .iter()
                    .map(|(k, v)| {
                        let v = if crate::secret::is_secret_key(k) {
                            "***".to_string()
                        } else {
                            v.clone()
                        };
                        (k.clone(), v)
                    })
                    .collect();
                fmt_options(f, &shown)
            }
            Statement::CreatePipe {
                name,
                if_not_exists,
                options,
                copy,
            } => {
                let ine = if *if_not_exists { "IF NOT EXISTS " } else { "" };
                write!(f, "CREATE PIPE {ine}{name}")?;
                fmt_options(f, options)?;
                write!(f, " AS {copy}")
            }
            Statement::RunPipe { name } => write!(f, "RUN PIPE {name}"),
            Statement::AlterPipe { name, pause } => write!(
                f,
                "ALTER PIPE {name} {}",
                if *pause { "PAUSE" } else { "RESUME" }
            ),
            Statement::DropPipe { name, if_exists } => {
                let ie = if *if_exists { "IF EXISTS " } else { "" };
                write!(f, "DROP PIPE {ie}{name}")
            }
            Statement::CreateNamespace {
                name,
                if_not_exists,
            } => {
                let ine = if *if_not_exists { "IF NOT EXISTS " } else { "" };
                write!(f, "CREATE NAMESPACE {ine}{name}")
            }
            Statement::Explain { verbose, statement } => {
                let v = if *verbose { "VERBOSE " } else { "" };
                write!(f, "EXPLAIN {v}{statement}")
            }
        }
    }
}

/// What the first words of a statement say it is.
enum Head {
    CreateUpload,
    PromoteUpload,
    PublishUpload,
    AbortUpload,
    ExpireStaging,
    ExpireSnapshots,
    RewriteManifests,
    RewriteDataFiles,
    RemoveOrphanFiles,
    CreateNamespace,
    CopyInto,
    CreateDownload,
    DropDownload,
    CreatePipe,
    RunPipe,
    AlterPipe,
    DropPipe,
    Explain,
    Other,
}

/// icestage's SQL parser; see the module documentation.
pub struct IcestageParser<'a> {
    df: DFParser<'a>,
}

impl<'a> IcestageParser<'a> {
    /// A parser over `sql`.
    pub fn new(sql: &'a str) -> Result<Self> {
        // `PARTITIONED BY (...)` (Spark's spelling) is read as `PARTITION BY`,
        // which sqlparser parses into an expression list for CREATE TABLE.
        let dialect = datafusion::sql::sqlparser::dialect::GenericDialect {};
        let mut tokens = Tokenizer::new(&dialect, sql)
            .tokenize_with_location()
            .map_err(|e| DataFusionError::SQL(Box::new(e.into()), None))?;
        for i in 0..tokens.len() {
            if is_word(&tokens[i].token, "PARTITIONED")
                && tokens
                    .iter()
                    .skip(i + 1)
                    .find(|t| !matches!(t.token, Token::Whitespace(_)))
                    .is_some_and(|t| is_word(&t.token, "BY"))
            {
                tokens[i].token = Token::make_keyword("PARTITION");
            }
        }
        tbl_properties_first(&mut tokens);
        Ok(Self {
            df: DFParserBuilder::new(tokens).build()?,
        })
    }

    /// Parses every statement of `sql`.
    pub fn parse_sql(sql: &'a str) -> Result<VecDeque<Statement>> {
        let mut parser = Self::new(sql)?;
        let mut statements = VecDeque::new();
        loop {
            while parser.df.parser.consume_token(&Token::SemiColon) {}
            if parser.df.parser.peek_token().token == Token::EOF {
                break;
            }
            statements.push_back(parser.parse_statement()?);
            if !matches!(
                parser.df.parser.peek_token().token,
                Token::SemiColon | Token::EOF
            ) {
                return Err(parser.expected("end of statement"));
            }
        }
        Ok(statements)
    }

    fn expected(&self, what: &str) -> Error {
        let found = self.df.parser.peek_token();
        Error::invalid(format!(
            "syntax error: expected {what}, found '{found}' ({})",
            location(&found)
        ))
    }

    fn head(&self) -> Head {
        let word = |n: usize| match &self.df.parser.peek_nth_token_ref(n).token {
            Token::Word(w) => w.value.to_ascii_uppercase(),
            _ => String::new(),
        };
        match (word(0).as_str(), word(1).as_str()) {
            ("CREATE", "UPLOAD") => Head::CreateUpload,
            ("PROMOTE", _) => Head::PromoteUpload,
            ("PUBLISH", _) => Head::PublishUpload,
            ("ABORT", "UPLOAD") => Head::AbortUpload,
            ("EXPIRE", "SNAPSHOTS") => Head::ExpireSnapshots,
            ("REWRITE", "MANIFESTS") => Head::RewriteManifests,
            ("REWRITE", "DATA") => Head::RewriteDataFiles,
            ("REMOVE", "ORPHAN") => Head::RemoveOrphanFiles,
            ("EXPIRE", _) => Head::ExpireStaging,
            ("CREATE", "NAMESPACE") => Head::CreateNamespace,
            ("COPY", "INTO") => Head::CopyInto,
            ("CREATE", "DOWNLOAD") => Head::CreateDownload,
            ("DROP", "DOWNLOAD") => Head::DropDownload,
            ("CREATE", "PIPE") => Head::CreatePipe,
            ("RUN", "PIPE") => Head::RunPipe,
            ("ALTER", "PIPE") => Head::AlterPipe,
            ("DROP", "PIPE") => Head::DropPipe,
            ("EXPLAIN", _) => Head::Explain,
            _ => Head::Other,
        }
    }

    /// Parses one statement.
    pub fn parse_statement(&mut self) -> Result<Statement> {
        match self.head() {
            Head::CreateUpload => {
                let usage = "CREATE UPLOAD FOR <namespace>.<table> [WITH (ttl = '24h')]";
                let (target, options) =
                    self.table_with_options(&["CREATE", "UPLOAD", "FOR"], usage)?;
                Ok(Statement::CreateUpload(CreateUpload { target, options }))
            }
            Head::PromoteUpload => {
                let usage = "PROMOTE UPLOAD '<upload id>' [WITH (...)]";
                self.expect_words(&["PROMOTE", "UPLOAD"], usage)?;
                let id = self.parse_id(usage)?;
                let options = self.parse_with_options()?;
                Ok(Statement::PromoteUpload(UploadStatement { id, options }))
            }
            Head::PublishUpload => {
                let usage = "PUBLISH UPLOAD '<upload id>'";
                self.expect_words(&["PUBLISH", "UPLOAD"], usage)?;
                let id = self.parse_id(usage)?;
                Ok(Statement::PublishUpload(UploadStatement {
                    id,
                    options: vec![],
                }))
            }
            Head::AbortUpload => {
                let usage = "ABORT UPLOAD '<upload id>'";
                self.expect_words(&["ABORT", "UPLOAD"], usage)?;
                let id = self.parse_id(usage)?;
                Ok(Statement::AbortUpload(UploadStatement {
                    id,
                    options: vec![],
                }))
            }
            Head::ExpireStaging => {
                self.expect_words(&["EXPIRE", "STAGING"], "EXPIRE STAGING")?;
                Ok(Statement::ExpireStaging)
            }
            Head::ExpireSnapshots => {
                let usage = "EXPIRE SNAPSHOTS <namespace>.<table> [WITH (older_than = '5d', retain_last = 1)]";
                let (table, options) = self.table_with_options(&["EXPIRE", "SNAPSHOTS"], usage)?;
                Ok(Statement::ExpireSnapshots { table, options })
            }
            Head::RewriteManifests => {
                let usage = "REWRITE MANIFESTS <namespace>.<table>";
                self.expect_words(&["REWRITE", "MANIFESTS"], usage)?;
                let table = self
                    .df
                    .parser
                    .parse_object_name(false)
                    .map_err(|_| self.usage(usage))?;
                Ok(Statement::RewriteManifests { table })
            }
            Head::RewriteDataFiles => {
                let usage = "REWRITE DATA FILES <namespace>.<table> [WITH (target_file_size = '512MB', where = '<predicate>')]";
                let (table, options) =
                    self.table_with_options(&["REWRITE", "DATA", "FILES"], usage)?;
                Ok(Statement::RewriteDataFiles { table, options })
            }
            Head::RemoveOrphanFiles => {
                let usage = "REMOVE ORPHAN FILES <namespace>.<table> [WITH (older_than = '3d', dry_run = true)]";
                let (table, options) =
                    self.table_with_options(&["REMOVE", "ORPHAN", "FILES"], usage)?;
                Ok(Statement::RemoveOrphanFiles { table, options })
            }
            Head::CreateNamespace => {
                self.expect_words(&["CREATE", "NAMESPACE"], "CREATE NAMESPACE <name>")?;
                let if_not_exists =
                    self.df
                        .parser
                        .parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
                let name = self
                    .df
                    .parser
                    .parse_object_name(false)
                    .map_err(|_| self.usage("CREATE NAMESPACE [IF NOT EXISTS] <name>"))?;
                Ok(Statement::CreateNamespace {
                    name,
                    if_not_exists,
                })
            }
            Head::CopyInto => {
                let usage = "COPY INTO <namespace>.<table> FROM 's3://bucket/prefix/' [WITH (<option> = <value>, ...)]";
                self.expect_words(&["COPY", "INTO"], usage)?;
                let table = self
                    .df
                    .parser
                    .parse_object_name(false)
                    .map_err(|_| self.usage(usage))?;
                self.expect_words(&["FROM"], usage)?;
                let uri = match self.df.parser.next_token().token {
                    Token::SingleQuotedString(s) => s,
                    _ => {
                        self.df.parser.prev_token();
                        return Err(self.usage(usage));
                    }
                };
                let options = self.parse_with_options()?;
                Ok(Statement::CopyInto {
                    table,
                    uri,
                    options,
                })
            }
            Head::CreateDownload => {
                let usage = "CREATE DOWNLOAD [WITH (ttl = '24h', wait = true)] AS <query>";
                self.expect_words(&["CREATE", "DOWNLOAD"], usage)?;
                let options = self.parse_with_options()?;
                if !self.df.parser.parse_keyword(Keyword::AS) {
                    return Err(self.usage(usage));
                }
                let query = self.df.parser.parse_query().map_err(|e| {
                    Error::invalid(format!("the query of CREATE DOWNLOAD does not parse: {e}"))
                })?;
                Ok(Statement::CreateDownload { options, query })
            }
            Head::DropDownload => {
                let usage = "DROP DOWNLOAD '<download id>'";
                self.expect_words(&["DROP", "DOWNLOAD"], usage)?;
                let id = self.parse_id(usage)?;
                Ok(Statement::DropDownload { id })
            }
            Head::CreatePipe => {
                let usage = "CREATE PIPE [IF NOT EXISTS] <name> [WITH (interval = '30s')] AS COPY INTO <table> FROM '<uri>' [WITH (...)]";
                self.expect_words(&["CREATE", "PIPE"], usage)?;
                let if_not_exists =
                    self.df
                        .parser
                        .parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
                let name = self.pipe_name(usage)?;
                let options = self.parse_with_options()?;
                if !self.df.parser.parse_keyword(Keyword::AS)
                    || !matches!(self.head(), Head::CopyInto)
                {
                    return Err(self.usage(usage));
                }
                let copy = Box::new(self.parse_statement()?);
                Ok(Statement::CreatePipe {
                    name,
                    if_not_exists,
                    options,
                    copy,
                })
            }
            Head::RunPipe => {
                let usage = "RUN PIPE <name>";
                self.expect_words(&["RUN", "PIPE"], usage)?;
                Ok(Statement::RunPipe {
                    name: self.pipe_name(usage)?,
                })
            }
            Head::AlterPipe => {
                let usage = "ALTER PIPE <name> PAUSE | RESUME";
                self.expect_words(&["ALTER", "PIPE"], usage)?;
                let name = self.pipe_name(usage)?;
                let pause = match self.df.parser.peek_token().token {
                    ref t if is_word(t, "PAUSE") => true,
                    ref t if is_word(t, "RESUME") => false,
                    _ => return Err(self.usage(usage)),
                };
                self.df.parser.next_token();
                Ok(Statement::AlterPipe { name, pause })
            }
            Head::DropPipe => {
                let usage = "DROP PIPE [IF EXISTS] <name>";
                self.expect_words(&["DROP", "PIPE"], usage)?;
                let if_exists = self
                    .df
                    .parser
                    .parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
                Ok(Statement::DropPipe {
                    name: self.pipe_name(usage)?,
                    if_exists,
                })
            }
            Head::Explain => {
                // EXPLAIN of an icestage statement is icestage's; anything
                // else is DataFusion's own EXPLAIN.
                let start = self.df.parser.index();
                self.df.parser.next_token();
                let verbose = self.df.parser.parse_keyword(Keyword::VERBOSE);
                if matches!(self.head(), Head::Other | Head::Explain) {
                    while self.df.parser.index() > start {
                        self.df.parser.prev_token();
                    }
                    return Ok(Statement::DataFusion(Box::new(self.df.parse_statement()?)));
                }
                let statement = Box::new(self.parse_statement()?);
                Ok(Statement::Explain { verbose, statement })
            }
            Head::Other => Ok(Statement::DataFusion(Box::new(self.df.parse_statement()?))),
        }
    }

    fn pipe_name(&mut self, usage: &str) -> Result<ObjectName> {
        self.df
            .parser
            .parse_object_name(false)
            .map_err(|_| self.usage(usage))
    }

    fn usage(&self, usage: &str) -> Error {
        let found = self.df.parser.peek_token();
        Error::invalid(format!(
            "syntax error at '{found}' ({}): the statement is {usage}",
            location(&found)
        ))
    }

    fn expect_words(&mut self, words: &[&str], usage: &str) -> Result<()> {
        for expected in words {
            let token = self.df.parser.peek_token();
            if !is_word(&token.token, expected) {
                return Err(self.usage(usage));
            }
            self.df.parser.next_token();
        }
        Ok(())
    }

    fn parse_id(&mut self, usage: &str) -> Result<String> {
        match self.df.parser.next_token().token {
            Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => Ok(s),
            // An unquoted id (all hex) tokenizes as a number or a word.
            Token::Word(Word { value, .. }) => Ok(value),
            Token::Number(n, _) => Ok(n),
            _ => {
                self.df.parser.prev_token();
                Err(self.usage(usage))
            }
        }
    }

    /// `WITH (key = value, ...)`, or nothing.
    /// `<words> <table> [WITH (...)]`: the table and its options.
    fn table_with_options(
        &mut self,
        words: &[&str],
        usage: &str,
    ) -> Result<(ObjectName, Vec<(String, String)>)> {
        self.expect_words(words, usage)?;
        let table = self
            .df
            .parser
            .parse_object_name(false)
            .map_err(|_| self.usage(usage))?;
        Ok((table, self.parse_with_options()?))
    }

    fn parse_with_options(&mut self) -> Result<Vec<(String, String)>> {
        if !self.df.parser.parse_keyword(Keyword::WITH) {
            return Ok(vec![]);
        }
        let usage = "WITH (<option> = <value>, ...)";
        if !self.df.parser.consume_token(&Token::LParen) {
            return Err(self.usage(usage));
        }
        let mut options = vec![];
        loop {
            let key = self.df.parse_option_key()?.to_ascii_lowercase();
            let _ = self.df.parser.consume_token(&Token::Eq);
            let value = match self.df.parse_option_value()? {
                Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s,
                Value::Number(n, _) => n,
                other => other.to_string(),
            };
            options.push((key, value));
            if self.df.parser.consume_token(&Token::RParen) {
                return Ok(options);
            }
            if !self.df.parser.consume_token(&Token::Comma) {
                return Err(self.usage(usage));
            }
        }
    }
}

fn location(token: &TokenWithSpan) -> String {
    let start = token.span.start;
    format!("line {}, column {}", start.line, start.column)
}

/// `PARTITION BY (...) TBLPROPERTIES (...)`, the order Spark and Hive write,
/// as sqlparser reads it: the properties before the partitioning.
fn tbl_properties_first(tokens: &mut [TokenWithSpan]) {
    let next = |tokens: &[TokenWithSpan], from: usize| {
        (from..tokens.len()).find(|&k| !matches!(tokens[k].token, Token::Whitespace(_)))
    };
    // The index just past the parenthesised group opening at `open`.
    let group_end = |tokens: &[TokenWithSpan], open: usize| {
        let mut depth = 0usize;
        for (k, t) in tokens.iter().enumerate().skip(open) {
            match t.token {
                Token::LParen => depth += 1,
                Token::RParen => {
                    depth = depth.checked_sub(1)?;
                    if depth == 0 {
                        return Some(k + 1);
                    }
                }
                _ if depth == 0 => return None,
                _ => {}
            }
        }
        None
    };
    let mut i = 0;
    while i < tokens.len() {
        let swapped = (|| {
            if !is_word(&tokens[i].token, "PARTITION") {
                return None;
            }
            let by = next(tokens, i + 1).filter(|&k| is_word(&tokens[k].token, "BY"))?;
            let partition_end = group_end(tokens, next(tokens, by + 1)?)?;
            let properties = next(tokens, partition_end)
                .filter(|&k| is_word(&tokens[k].token, "TBLPROPERTIES"))?;
            let properties_end = group_end(tokens, next(tokens, properties + 1)?)?;
            // [i, properties) holds the partitioning and the space after it.
            tokens[i..properties_end].rotate_left(properties - i);
            Some(properties_end)
        })();
        i = swapped.unwrap_or(i + 1);
    }
}

fn is_word(token: &Token, expected: &str) -> bool {
    matches!(token, Token::Word(w) if w.value.eq_ignore_ascii_case(expected) && w.quote_style.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(sql: &str) -> Statement {
        let mut all = IcestageParser::parse_sql(sql).unwrap();
        assert_eq!(all.len(), 1, "{sql}");
        all.pop_front().unwrap()
    }

    #[test]
    fn statements_round_trip() {
        for sql in [
            "CREATE UPLOAD FOR payments.transactions",
            "CREATE UPLOAD FOR payments.transactions WITH (ttl = '2h')",
            "PROMOTE UPLOAD '0123456789abcdef0123456789abcdef'",
            "ABORT UPLOAD 'abc'",
            "PROMOTE UPLOAD 'abc' WITH (to_branch = 'audit')",
            "PUBLISH UPLOAD 'abc'",
            "EXPIRE STAGING",
            "EXPIRE SNAPSHOTS payments.transactions WITH (older_than = '1h', retain_last = '5')",
            "REWRITE MANIFESTS payments.transactions",
            "REWRITE DATA FILES payments.transactions",
            "REWRITE DATA FILES payments.transactions WITH (target_file_size = '512MB', where = 'id > 5')",
            "REMOVE ORPHAN FILES payments.transactions WITH (older_than = '3d', dry_run = 'true')",
            "CREATE NAMESPACE IF NOT EXISTS payments",
            "EXPLAIN PROMOTE UPLOAD 'abc'",
            "COPY INTO raw.events FROM 's3://b/in/' WITH (format = 'csv', all_files = 'true')",
            "CREATE DOWNLOAD WITH (ttl = '2h') AS SELECT a FROM t WHERE b > 1",
            "DROP DOWNLOAD 'abc'",
            "CREATE PIPE IF NOT EXISTS events WITH (interval = '5s') AS COPY INTO raw.events FROM 's3://b/in/' WITH (format = 'csv')",
            "RUN PIPE events",
            "ALTER PIPE events PAUSE",
            "ALTER PIPE local.events RESUME",
            "DROP PIPE IF EXISTS events",
        ] {
            assert_eq!(one(sql).to_string(), sql);
        }
    }

    #[test]
    fn everything_else_is_datafusion() {
        assert!(matches!(one("SELECT 1"), Statement::DataFusion(_)));
        assert!(matches!(one("EXPLAIN SELECT 1"), Statement::DataFusion(_)));
        assert!(matches!(
            one("CREATE TABLE t (a INT) PARTITIONED BY (bucket(4, a))"),
            Statement::DataFusion(_)
        ));
    }

    #[test]
    fn table_properties_may_follow_the_partitioning() {
        let spark = "CREATE TABLE t (a INT, b INT) PARTITIONED BY (bucket(4, a), b) \
                     TBLPROPERTIES ('write.format.default' = 'parquet')";
        let sqlparser = "CREATE TABLE t (a INT, b INT) \
                         TBLPROPERTIES ('write.format.default' = 'parquet') \
                         PARTITION BY (bucket(4, a), b)";
        assert_eq!(one(spark).to_string(), one(sqlparser).to_string());
    }

    #[test]
    fn several_statements() {
        let all = IcestageParser::parse_sql("EXPIRE STAGING; SELECT 1;; ABORT UPLOAD 'x'").unwrap();
        assert_eq!(all.len(), 3);
        let err = IcestageParser::parse_sql("EXPIRE STAGING SELECT 1").unwrap_err();
        assert!(
            err.to_string().contains("expected end of statement"),
            "{err}"
        );
    }

    #[test]
    fn malformed_statements_say_the_usage() {
        let err = IcestageParser::parse_sql("CREATE UPLOAD payments.t").unwrap_err();
        assert!(
            err.to_string()
                .contains("CREATE UPLOAD FOR <namespace>.<table>"),
            "{err}"
        );
        let err = IcestageParser::parse_sql("PROMOTE UPLOAD").unwrap_err();
        assert!(
            err.to_string().contains("PROMOTE UPLOAD '<upload id>'"),
            "{err}"
        );
    }
}
