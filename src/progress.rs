//! Progress of long statements (files and bytes), for front ends that want
//! to show it. The shell draws a bar on a terminal; elsewhere nothing is
//! reported.

use std::sync::Arc;

/// Receives progress reports.
pub trait Progress: Send + Sync {
    /// A load of `files` files, `bytes` bytes in all, begins.
    fn start(&self, files: u64, bytes: u64);
    /// `files` more files, `bytes` more bytes are done.
    fn advance(&self, files: u64, bytes: u64);
    /// The load is over.
    fn finish(&self);
}

/// Reports nothing.
#[derive(Debug, Default)]
pub(crate) struct NoProgress;

impl Progress for NoProgress {
    fn start(&self, _files: u64, _bytes: u64) {}
    fn advance(&self, _files: u64, _bytes: u64) {}
    fn finish(&self) {}
}

/// The progress receiver of a session, kept in its config:
/// `SessionConfig::with_extension(Arc::new(ProgressSink::new(...)))`.
pub struct ProgressSink(pub Arc<dyn Progress>);

impl ProgressSink {
    /// Wraps a receiver.
    pub fn new(progress: Arc<dyn Progress>) -> Self {
        Self(progress)
    }
}
