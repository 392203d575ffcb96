//! How long the allocator keeps freed memory while verification decodes.
//!
//! Verification decodes every staged page into buffers it frees a moment
//! later; the `parquet` crate's decoders allocate (and zero) theirs afresh
//! per page and per dictionary. An allocator that returns freed memory to
//! the kernel soon (the binary's mimalloc after 10 ms, which keeps a
//! download's peak bounded) then gets the same memory back one page fault
//! at a time: a fifth of a promotion's CPU time was the kernel's.
//!
//! The library does not choose the allocator; an application that does
//! names what to change with [`on_decoding`]. The binary keeps freed memory
//! 100 ms instead of 10 while any verification decodes.

use std::sync::{Mutex, OnceLock, PoisonError};

static HOOK: OnceLock<fn(bool)> = OnceLock::new();
/// Decodings running now; the hook is called under this lock, so its calls
/// follow the count's changes in order.
static RUNNING: Mutex<usize> = Mutex::new(0);

/// Sets the function called with `true` when verification starts decoding
/// in a process where none was decoding, and with `false` when the last
/// decoding ends. Only the first call sets it; false for a later one.
pub fn on_decoding(hook: fn(bool)) -> bool {
    HOOK.set(hook).is_ok()
}

/// One decoding under way, from [`Decoding::start`] until dropped.
pub(crate) struct Decoding(());

impl Decoding {
    pub(crate) fn start() -> Self {
        let mut running = RUNNING.lock().unwrap_or_else(PoisonError::into_inner);
        *running += 1;
        if *running == 1
            && let Some(hook) = HOOK.get()
        {
            hook(true);
        }
        Self(())
    }
}

impl Drop for Decoding {
    fn drop(&mut self) {
        let mut running = RUNNING.lock().unwrap_or_else(PoisonError::into_inner);
        *running = running.saturating_sub(1);
        if *running == 0
            && let Some(hook) = HOOK.get()
        {
            hook(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    static DECODING: AtomicBool = AtomicBool::new(false);

    fn record(decoding: bool) {
        DECODING.store(decoding, Ordering::SeqCst);
    }

    #[test]
    fn the_hook_hears_of_decoding_while_any_runs() {
        // No other test sets a hook, but others of this process may verify
        // at the same time: while a decoding of this test's runs, the
        // hook's last word is `true`, whatever theirs do.
        assert!(on_decoding(record));
        for _ in 0..100 {
            let first = Decoding::start();
            assert!(DECODING.load(Ordering::SeqCst));
            let second = Decoding::start();
            drop(first);
            assert!(DECODING.load(Ordering::SeqCst));
            drop(second);
        }
        assert!(!on_decoding(record), "a second hook replaced the first");
    }
}
