//! Upload table functions: `upload_status(id)`, `uploads()`,
//! `create_upload(table [, ttl])`, `promote_upload(id)`.

use std::sync::Arc;

use datafusion::catalog::{TableFunctionImpl, TableProvider};
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::Expr;

use super::{CommandTable, at_most, string_arg};
use crate::config::Ttl;
use crate::credentials::AccessMode;
use crate::credentials::vend::{VendCredentials, vend_duration};
use crate::tables::rules::ListConstraints;
use crate::upload::UploadId;
use crate::upload::create::{CreateUpload, UploadOptions};
use crate::upload::promote::PromoteUpload;
use crate::upload::status::{ListUploads, ShowUpload, UploadFindings};

/// `upload_status('<id>')`: one row, the state of the upload.
#[derive(Debug)]
pub(crate) struct UploadStatusFunc;

impl TableFunctionImpl for UploadStatusFunc {
    fn call(&self, args: &[Expr]) -> DFResult<Arc<dyn TableProvider>> {
        let signature = "upload_status('<upload id>')";
        at_most(args, 1, "upload_status", signature)?;
        let id = UploadId::parse(&string_arg(args, 0, "upload_status", signature)?)?;
        Ok(CommandTable::of(ShowUpload { id }))
    }
}

/// `uploads()`: every upload the catalogs know, one row each.
#[derive(Debug)]
pub(crate) struct UploadsFunc;

impl TableFunctionImpl for UploadsFunc {
    fn call(&self, args: &[Expr]) -> DFResult<Arc<dyn TableProvider>> {
        at_most(args, 0, "uploads", "uploads()")?;
        Ok(CommandTable::of(ListUploads))
    }
}

/// `create_upload('<table>' [, '<ttl>'])`: the twin of `CREATE UPLOAD FOR`.
#[derive(Debug)]
pub(crate) struct CreateUploadFunc;

impl TableFunctionImpl for CreateUploadFunc {
    fn call(&self, args: &[Expr]) -> DFResult<Arc<dyn TableProvider>> {
        let signature = "create_upload('<namespace>.<table>' [, '<ttl>'])";
        at_most(args, 2, "create_upload", signature)?;
        let table = string_arg(args, 0, "create_upload", signature)?;
        let ttl = match args.len() {
            2 => Some(Ttl::parse(&string_arg(
                args,
                1,
                "create_upload",
                signature,
            )?)?),
            _ => None,
        };
        Ok(CommandTable::on_table(table, move |target| CreateUpload {
            target,
            options: UploadOptions {
                ttl: ttl.clone(),
                ..Default::default()
            },
        }))
    }
}

/// `promote_upload('<id>')`: the twin of `PROMOTE UPLOAD`.
#[derive(Debug)]
pub(crate) struct PromoteUploadFunc;

impl TableFunctionImpl for PromoteUploadFunc {
    fn call(&self, args: &[Expr]) -> DFResult<Arc<dyn TableProvider>> {
        let signature = "promote_upload('<upload id>')";
        at_most(args, 1, "promote_upload", signature)?;
        let id = UploadId::parse(&string_arg(args, 0, "promote_upload", signature)?)?;
        Ok(CommandTable::of(PromoteUpload::new(id, Default::default())))
    }
}

/// `upload_findings('<id>')`: the row-level findings of the last validation.
#[derive(Debug)]
pub(crate) struct UploadFindingsFunc;

impl TableFunctionImpl for UploadFindingsFunc {
    fn call(&self, args: &[Expr]) -> DFResult<Arc<dyn TableProvider>> {
        let signature = "upload_findings('<upload id>')";
        at_most(args, 1, "upload_findings", signature)?;
        let id = UploadId::parse(&string_arg(args, 0, "upload_findings", signature)?)?;
        Ok(CommandTable::of(UploadFindings { id }))
    }
}

/// `vend_credentials('<id>' [, '<mode>'] [, '<duration>'])`: credentials for
/// one upload's staging table.
#[derive(Debug)]
pub(crate) struct VendCredentialsFunc;

impl TableFunctionImpl for VendCredentialsFunc {
    fn call(&self, args: &[Expr]) -> DFResult<Arc<dyn TableProvider>> {
        let signature =
            "vend_credentials('<upload or download id>' [, 'write' | 'read'] [, '<duration>'])";
        at_most(args, 3, "vend_credentials", signature)?;
        let id = string_arg(args, 0, "vend_credentials", signature)?;
        UploadId::parse(&id)?;
        let mode = (args.len() > 1)
            .then(|| string_arg(args, 1, "vend_credentials", signature))
            .transpose()?
            .map(|mode| AccessMode::parse(&mode))
            .transpose()?;
        let duration = (args.len() > 2)
            .then(|| string_arg(args, 2, "vend_credentials", signature))
            .transpose()?
            .map(|duration| Ttl::parse(&duration))
            .transpose()?;
        vend_duration(duration.as_ref())?;
        Ok(CommandTable::of(VendCredentials { id, mode, duration }))
    }
}

/// `table_constraints('<table>')`: the rules stored with a table.
#[derive(Debug)]
pub(crate) struct TableConstraintsFunc;

impl TableFunctionImpl for TableConstraintsFunc {
    fn call(&self, args: &[Expr]) -> DFResult<Arc<dyn TableProvider>> {
        let signature = "table_constraints('<namespace>.<table>')";
        at_most(args, 1, "table_constraints", signature)?;
        let table = string_arg(args, 0, "table_constraints", signature)?;
        Ok(CommandTable::on_table(table, |table| ListConstraints {
            table,
        }))
    }
}
