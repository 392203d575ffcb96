//! A progress bar for long loads, drawn on stderr when it is a terminal.

use std::sync::Mutex;

use icestage::Progress;
use indicatif::{ProgressBar, ProgressStyle};

/// Files and bytes of a load, as an indicatif bar.
#[derive(Default)]
pub(crate) struct Bar {
    bar: Mutex<Option<(ProgressBar, u64)>>,
}

impl Progress for Bar {
    fn start(&self, files: u64, bytes: u64) {
        let bar = ProgressBar::new(bytes);
        bar.set_style(
            ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {msg} ({eta})")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_message(format!("0/{files} files"));
        *self.bar.lock().unwrap() = Some((bar, files));
    }

    fn advance(&self, files: u64, bytes: u64) {
        if let Some((bar, total)) = self.bar.lock().unwrap().as_ref() {
            bar.inc(bytes);
            let done = bar
                .message()
                .split('/')
                .next()
                .and_then(|d| d.parse::<u64>().ok())
                .unwrap_or(0);
            bar.set_message(format!("{}/{total} files", done + files));
        }
    }

    fn finish(&self) {
        if let Some((bar, _)) = self.bar.lock().unwrap().take() {
            bar.finish_and_clear();
        }
    }
}
