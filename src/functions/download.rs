//! Download table functions: `download_status(id)`, `downloads()`,
//! `wait_download(id [, timeout])`.

use std::sync::Arc;
use std::time::Duration;

use datafusion::catalog::{TableFunctionImpl, TableProvider};
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::Expr;

use super::{CommandTable, at_most, string_arg};
use crate::config::parse_duration;
use crate::download::DownloadId;
use crate::download::status::{ListDownloads, ShowDownload, WaitDownload};

/// `download_status('<id>')`: one row, the state of the download.
#[derive(Debug)]
pub(crate) struct DownloadStatusFunc;

impl TableFunctionImpl for DownloadStatusFunc {
    fn call(&self, args: &[Expr]) -> DFResult<Arc<dyn TableProvider>> {
        let signature = "download_status('<download id>')";
        at_most(args, 1, "download_status", signature)?;
        let id = DownloadId::parse(&string_arg(args, 0, "download_status", signature)?)?;
        Ok(CommandTable::of(ShowDownload { id }))
    }
}

/// `downloads()`: every download the catalogs know.
#[derive(Debug)]
pub(crate) struct DownloadsFunc;

impl TableFunctionImpl for DownloadsFunc {
    fn call(&self, args: &[Expr]) -> DFResult<Arc<dyn TableProvider>> {
        at_most(args, 0, "downloads", "downloads()")?;
        Ok(CommandTable::of(ListDownloads))
    }
}

/// `wait_download('<id>' [, '<timeout>'])`: the download's status once it is
/// no longer pending (default timeout 10m).
#[derive(Debug)]
pub(crate) struct WaitDownloadFunc;

impl TableFunctionImpl for WaitDownloadFunc {
    fn call(&self, args: &[Expr]) -> DFResult<Arc<dyn TableProvider>> {
        let signature = "wait_download('<download id>' [, '<timeout>'])";
        at_most(args, 2, "wait_download", signature)?;
        let id = DownloadId::parse(&string_arg(args, 0, "wait_download", signature)?)?;
        let timeout = match args.len() {
            2 => parse_duration(&string_arg(args, 1, "wait_download", signature)?)?,
            _ => Duration::from_secs(600),
        };
        Ok(CommandTable::of(WaitDownload { id, timeout }))
    }
}
