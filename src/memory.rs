//! How long the allocator keeps freed memory while bulk work runs.
//!
//! Verification decodes every staged page into buffers it frees a moment
//! later, and a load (COPY INTO, a pipe) decodes its source and encodes and
//! compresses new pages the same way; the `parquet` crate's decoders and
//! encoders allocate (and zero) theirs afresh per page and per dictionary.
//! An allocator that returns freed memory to the kernel soon (the binary's
//! mimalloc after 10 ms, which keeps a download's peak bounded) then gets
//! the same memory back one page fault at a time: a fifth of a promotion's
//! CPU time, and a fifth of a Parquet load's, was the kernel's.
//!
//! The library does not choose the allocator; an application that does
//! names what to change with [`on_churn`]. The binary keeps freed memory
//! 100 ms instead of 10 while any verification decodes, and a second while
//! any load writes (its bound is 1 GB, not a promotion's 256 MiB).

use std::sync::{Mutex, OnceLock, PoisonError};

/// The bulk work running in a process, as far as freed memory goes; the
/// later a variant, the longer freed memory is worth keeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Churn {
    /// None: freed memory may go back soon.
    Idle,
    /// Verification decodes staged files (a promotion's peak is bounded
    /// at 256 MiB).
    Verifying,
    /// A load (COPY INTO, a pipe) writes data files from source files (its
    /// peak is bounded at 1 GB).
    Loading,
}

static HOOK: OnceLock<fn(Churn)> = OnceLock::new();

/// How many pieces of each kind of work run now, by `Churn as usize`
/// (`Idle`'s count is never read). The hook is called under this lock, so
/// its calls follow the counts' changes in order.
static RUNNING: Mutex<[usize; 3]> = Mutex::new([0; 3]);

/// The most demanding work of `running`.
fn most(running: &[usize; 3]) -> Churn {
    [Churn::Loading, Churn::Verifying]
        .into_iter()
        .find(|churn| running[*churn as usize] > 0)
        .unwrap_or(Churn::Idle)
}

/// Counts one more or one fewer `churn`, and tells the hook when the most
/// demanding work running changed.
fn count(churn: Churn, more: bool) {
    let mut running = RUNNING.lock().unwrap_or_else(PoisonError::into_inner);
    let before = most(&running);
    let slot = &mut running[churn as usize];
    *slot = if more {
        *slot + 1
    } else {
        slot.saturating_sub(1)
    };
    let now = most(&running);
    if now != before
        && let Some(hook) = HOOK.get()
    {
        hook(now);
    }
}

/// Sets the function called with the most demanding [`Churn`] running
/// whenever that changes (with [`Churn::Idle`] when the last work ends).
/// Only the first call sets it; false for a later one.
pub fn on_churn(hook: fn(Churn)) -> bool {
    HOOK.set(hook).is_ok()
}

/// One piece of bulk work under way, from [`Churning::start`] until
/// dropped.
#[derive(Debug)]
pub(crate) struct Churning(Churn);

impl Churning {
    pub(crate) fn start(churn: Churn) -> Self {
        count(churn, true);
        Self(churn)
    }
}

impl Drop for Churning {
    fn drop(&mut self) {
        count(self.0, false);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU8, Ordering};

    use super::*;

    static HEARD: AtomicU8 = AtomicU8::new(Churn::Idle as u8);

    fn record(churn: Churn) {
        HEARD.store(churn as u8, Ordering::SeqCst);
    }

    fn heard() -> u8 {
        HEARD.load(Ordering::SeqCst)
    }

    #[test]
    fn the_hook_hears_of_the_most_demanding_work_running() {
        // No other test sets a hook, but others of this process may verify
        // or load at the same time: while a load of this test's runs, the
        // hook's last word is `Loading`, and while a verification runs it
        // is at least `Verifying`, whatever theirs do.
        assert!(on_churn(record));
        for _ in 0..100 {
            let verifying = Churning::start(Churn::Verifying);
            assert!(heard() >= Churn::Verifying as u8);
            let loading = Churning::start(Churn::Loading);
            assert_eq!(heard(), Churn::Loading as u8);
            let again = Churning::start(Churn::Verifying);
            drop(verifying);
            assert_eq!(heard(), Churn::Loading as u8);
            drop(loading);
            assert!(heard() >= Churn::Verifying as u8);
            drop(again);
        }
        assert!(!on_churn(record), "a second hook replaced the first");
    }
}
