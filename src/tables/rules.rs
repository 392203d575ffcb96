//! Validation rules that live with the target table, as table properties
//! (`icestage.constraint.<name> = CHECK (...)` or `UNIQUE (...)`), so every
//! process and every upload sees them. The target's Iceberg identifier
//! fields count as a unique key too.
//!
//! Rules apply to uploads: adding one does not check rows already in the
//! target (like PostgreSQL's `NOT VALID` constraints).

use std::collections::BTreeMap;
use std::fmt;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::DFSchema;
use datafusion::logical_expr::{Expr, ExprSchemable};
use datafusion::prelude::SessionContext;
use iceberg::TableIdent;
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};

use crate::catalog::IcebergCatalog;
use crate::catalog::TableName;
use crate::error::{Error, Result};
use crate::rows::result_row;
use crate::session::CommandContext;
use crate::session::is_missing;
use crate::session::operation::{Operation, flag};

/// Table property prefix of a stored rule.
pub const PROP_CONSTRAINT_PREFIX: &str = "icestage.constraint.";
/// Name of the unique rule implied by the target's identifier fields.
pub const IDENTIFIER_FIELDS_RULE: &str = "identifier_fields";

/// One validation rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Rule {
    /// Every row must not make `predicate` false (NULL passes, as in SQL).
    Check { name: String, predicate: String },
    /// No two rows share these columns' values, in the upload or with the target.
    Unique { name: String, columns: Vec<String> },
}

impl Rule {
    pub(crate) fn name(&self) -> &str {
        match self {
            Rule::Check { name, .. } | Rule::Unique { name, .. } => name,
        }
    }

    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Rule::Check { .. } => "check",
            Rule::Unique { .. } => "unique",
        }
    }

    /// The rule as SQL, e.g. `CHECK (amount > 0)`.
    pub(crate) fn definition(&self) -> String {
        match self {
            Rule::Check { predicate, .. } => format!("CHECK ({predicate})"),
            Rule::Unique { columns, .. } => format!("UNIQUE ({})", columns.join(", ")),
        }
    }

    /// Reads a stored definition back.
    fn parse(name: &str, definition: &str) -> Result<Self> {
        let inner = |prefix: &str| {
            definition
                .strip_prefix(prefix)
                .and_then(|rest| rest.trim().strip_prefix('('))
                .and_then(|rest| rest.strip_suffix(')'))
                .map(str::trim)
        };
        if let Some(predicate) = inner("CHECK") {
            return Ok(Rule::Check {
                name: name.to_string(),
                predicate: predicate.to_string(),
            });
        }
        if let Some(columns) = inner("UNIQUE") {
            return Ok(Rule::Unique {
                name: name.to_string(),
                columns: columns.split(',').map(|c| c.trim().to_string()).collect(),
            });
        }
        Err(Error::invalid(format!(
            "stored constraint '{name}' = '{definition}' is neither CHECK (...) nor UNIQUE (...): \
             drop it with ALTER TABLE ... DROP CONSTRAINT {name}"
        )))
    }
}

/// The rules of `table`: stored constraints, sorted by name, then the
/// identifier fields' unique key if the schema has one.
pub(crate) fn rules_of(table: &Table) -> Result<Vec<Rule>> {
    let stored: BTreeMap<&String, &String> = table
        .metadata()
        .properties()
        .iter()
        .filter(|(k, _)| k.starts_with(PROP_CONSTRAINT_PREFIX))
        .collect();
    let mut rules = stored
        .into_iter()
        .map(|(key, definition)| Rule::parse(&key[PROP_CONSTRAINT_PREFIX.len()..], definition))
        .collect::<Result<Vec<_>>>()?;
    let schema = table.metadata().current_schema();
    let mut identifier: Vec<String> = schema
        .identifier_field_ids()
        .filter_map(|id| schema.name_by_field_id(id).map(str::to_string))
        .collect();
    if !identifier.is_empty() {
        identifier.sort();
        rules.push(Rule::Unique {
            name: IDENTIFIER_FIELDS_RULE.to_string(),
            columns: identifier,
        });
    }
    Ok(rules)
}

/// The Arrow schema of `table` as DataFusion plans expressions against it.
pub(crate) fn df_schema(table: &Table) -> Result<DFSchema> {
    let arrow = iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema())?;
    Ok(DFSchema::try_from(arrow)?)
}

/// Plans a CHECK predicate against `schema`; it must be boolean.
pub(crate) fn check_predicate(
    ctx: &SessionContext,
    table: &str,
    predicate: &str,
    schema: &DFSchema,
) -> Result<Expr> {
    let columns = || {
        schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let expr = ctx.parse_sql_expr(predicate, schema).map_err(|e| {
        Error::invalid(format!(
            "CHECK ({predicate}) cannot apply to {table}: {}; its columns are {}",
            crate::error_message(&e),
            columns()
        ))
    })?;
    let data_type = expr.get_type(schema).map_err(|e| {
        Error::invalid(format!(
            "CHECK ({predicate}) cannot apply to {table}: {}; its columns are {}",
            crate::error_message(&e),
            columns()
        ))
    })?;
    if data_type != DataType::Boolean {
        return Err(Error::invalid(format!(
            "CHECK ({predicate}) on {table} is {data_type}, not a condition: write a predicate such as amount > 0"
        )));
    }
    Ok(expr)
}

async fn load(catalog: &IcebergCatalog, ident: &TableIdent) -> Result<Table> {
    catalog.catalog().load_table(ident).await.map_err(|e| {
        if is_missing(&e) {
            Error::TableNotFound {
                table: ident.to_string(),
                hint: format!(" in catalog '{}'", catalog.name()),
            }
        } else {
            e.into()
        }
    })
}

/// `ALTER TABLE <t> ADD CONSTRAINT <name> CHECK (...) | UNIQUE (...)`
#[derive(Debug)]
pub(crate) struct AddConstraint {
    pub(crate) table: TableName,
    pub(crate) rule: Rule,
}

impl fmt::Display for AddConstraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rule = &self.rule;
        write!(f, "{} {} {}", self.table, rule.name(), rule.definition())
    }
}

impl Operation for AddConstraint {
    const NAME: &'static str = "AddConstraint";
    type Outcome = ();

    async fn run(&self, ctx: &CommandContext) -> Result<()> {
        let (rule, ident) = (&self.rule, &self.table.ident);
        let catalog = ctx.icestage.catalog(&self.table.catalog)?;
        let table = load(catalog, ident).await?;
        let name = ident.to_string();
        if rules_of(&table)?.iter().any(|r| r.name() == rule.name()) {
            return Err(Error::invalid(format!(
                "constraint '{}' already exists on {name}: drop it first with ALTER TABLE {name} DROP CONSTRAINT {}",
                rule.name(),
                rule.name()
            )));
        }
        let schema = df_schema(&table)?;
        match rule {
            Rule::Check { predicate, .. } => {
                check_predicate(&SessionContext::new(), &name, predicate, &schema)?;
            }
            Rule::Unique { columns, .. } => {
                for column in columns {
                    if schema.field_with_unqualified_name(column).is_err() {
                        return Err(Error::invalid(format!(
                            "UNIQUE ({}) on {name} names column '{column}', which the table does not have",
                            columns.join(", ")
                        )));
                    }
                }
            }
        }
        let tx = Transaction::new(&table);
        let tx = tx
            .update_table_properties()
            .set(
                format!("{PROP_CONSTRAINT_PREFIX}{}", rule.name()),
                rule.definition(),
            )
            .apply(tx)?;
        tx.commit(catalog.catalog().as_ref()).await?;
        Ok(())
    }
}

/// `ALTER TABLE <t> DROP CONSTRAINT [IF EXISTS] <name>`
#[derive(Debug)]
pub(crate) struct DropConstraint {
    pub(crate) table: TableName,
    pub(crate) name: String,
    pub(crate) if_exists: bool,
}

impl fmt::Display for DropConstraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}{}",
            self.table,
            self.name,
            flag(self.if_exists, "if_exists")
        )
    }
}

impl Operation for DropConstraint {
    const NAME: &'static str = "DropConstraint";
    type Outcome = ();

    async fn run(&self, ctx: &CommandContext) -> Result<()> {
        let (constraint, if_exists, ident) =
            (self.name.as_str(), self.if_exists, &self.table.ident);
        let catalog = ctx.icestage.catalog(&self.table.catalog)?;
        let table = load(catalog, ident).await?;
        let key = format!("{PROP_CONSTRAINT_PREFIX}{constraint}");
        if !table.metadata().properties().contains_key(&key) {
            if if_exists {
                return Ok(());
            }
            let rules = rules_of(&table)?;
            let names: Vec<&str> = rules.iter().map(Rule::name).collect();
            let hint = if constraint == IDENTIFIER_FIELDS_RULE {
                "it comes from the table's identifier fields, which a schema change removes"
                    .to_string()
            } else if names.is_empty() {
                "the table has no constraints".to_string()
            } else {
                format!("its constraints are {}", names.join(", "))
            };
            return Err(Error::invalid(format!(
                "{ident} has no constraint '{constraint}': {hint}"
            )));
        }
        let tx = Transaction::new(&table);
        let tx = tx.update_table_properties().remove(key).apply(tx)?;
        tx.commit(catalog.catalog().as_ref()).await?;
        Ok(())
    }
}

result_row! {
    /// One rule a table's promotions check: a row of `table_constraints(table)`.
    #[derive(Debug, Clone, PartialEq)]
    pub struct TableConstraint {
        /// The table, `namespace.table`.
        pub table_name: String,
        /// The rule's name.
        pub constraint_name: String,
        /// `check`, `unique`, or `not_null`.
        pub kind: String,
        /// The rule as SQL: the predicate, or the columns.
        pub definition: String,
    }
}

/// `table_constraints('<table>')`: one row per rule.
#[derive(Debug)]
pub(crate) struct ListConstraints {
    pub(crate) table: TableName,
}

impl fmt::Display for ListConstraints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.table)
    }
}

impl Operation for ListConstraints {
    const NAME: &'static str = "ListConstraints";
    type Outcome = Vec<TableConstraint>;

    async fn run(&self, ctx: &CommandContext) -> Result<Vec<TableConstraint>> {
        let ident = &self.table.ident;
        let table = load(ctx.icestage.catalog(&self.table.catalog)?, ident).await?;
        Ok(rules_of(&table)?
            .iter()
            .map(|rule| TableConstraint {
                table_name: ident.to_string(),
                constraint_name: rule.name().to_string(),
                kind: rule.kind().to_string(),
                definition: rule.definition(),
            })
            .collect())
    }
}

/// Shared by the validation: the rules as planned expressions.
pub(crate) struct PlannedCheck {
    pub(crate) name: String,
    pub(crate) predicate: String,
    pub(crate) expr: Expr,
}

/// Plans every CHECK rule of `rules` against `schema`.
pub(crate) fn plan_checks(
    ctx: &SessionContext,
    table: &str,
    rules: &[Rule],
    schema: &DFSchema,
) -> Result<Vec<PlannedCheck>> {
    rules
        .iter()
        .filter_map(|rule| match rule {
            Rule::Check { name, predicate } => Some((name, predicate)),
            Rule::Unique { .. } => None,
        })
        .map(|(name, predicate)| {
            Ok(PlannedCheck {
                name: name.clone(),
                predicate: predicate.clone(),
                expr: check_predicate(ctx, table, predicate, schema)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_definitions_round_trip() {
        for rule in [
            Rule::Check {
                name: "positive".into(),
                predicate: "amount > 0 AND (currency IN ('usd', 'eur'))".into(),
            },
            Rule::Unique {
                name: "one_per_txn".into(),
                columns: vec!["transaction_id".into(), "account_id".into()],
            },
        ] {
            assert_eq!(Rule::parse(rule.name(), &rule.definition()).unwrap(), rule);
        }
        let err = Rule::parse("x", "FOREIGN KEY (a)").unwrap_err().to_string();
        assert!(
            err.contains("is neither CHECK (...) nor UNIQUE (...)"),
            "{err}"
        );
    }
}
