//! Progress for a person at a terminal: a bar on standard error (done/total, failures so far,
//! runs/s, time left), and failures printed the moment they happen. When standard error is not
//! a terminal (CI logs, pipes) there is no bar and nothing extra, except the failure lines.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use std::cell::Cell;
use std::io::IsTerminal as _;

/// The bar's shape: elapsed, bar, done/total, failures, rate, time left.
const TEMPLATE: &str = "{elapsed_precise} [{bar:32}] {pos}/{len} runs, {msg}, {rate}, ETA {eta}";

/// The progress of one command's runs.
pub struct Progress {
    bar: Option<ProgressBar>,
    /// Failures so far; a `Cell` so the callbacks that count and the ones that print can share
    /// one `Progress`.
    failed: Cell<u64>,
}

impl Progress {
    /// A bar for `total` runs, drawn only when standard error is a terminal and there is more
    /// than one run to wait for.
    pub fn new(total: u64) -> Self {
        let bar = (total > 1 && std::io::stderr().is_terminal()).then(|| {
            let style = ProgressStyle::with_template(TEMPLATE)
                .expect("the template is valid")
                .with_key("rate", |state: &ProgressState, out: &mut dyn std::fmt::Write| {
                    let _ = write!(out, "{:.0} runs/s", state.per_sec());
                })
                .progress_chars("=> ");
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr()).with_style(style);
            bar.set_message("0 failed");
            bar
        });
        Self { bar, failed: Cell::new(0) }
    }

    /// One run completed, `failed` or not; `text`, if any, is printed at once (above the bar,
    /// if any).
    pub fn completed(&self, failed: bool, text: Option<&str>) {
        if failed {
            self.failed.set(self.failed.get() + 1);
        }
        if let Some(text) = text {
            match &self.bar {
                Some(bar) => bar.println(text),
                None => err!("{text}"),
            }
        }
        if let Some(bar) = &self.bar {
            bar.set_message(format!("{} failed", self.failed.get()));
            bar.inc(1);
        }
    }

    /// Writes a line to standard output without tearing the bar.
    pub fn out(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| out!("{line}")),
            None => out!("{line}"),
        }
    }

    /// Removes the bar, leaving the screen to the summary.
    pub fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}
