//! What a command writes for someone else to read: standard output and the output files
//! (`--trace`). A write that fails is never ignored: the command starts no further runs and
//! ends with exit 2 and the reason, so a full disk cannot pass for a clean report. Standard
//! output closed by its reader (`rig run ... | head -1`) is the one quiet case: the reader asked
//! for no more, so nothing is said, but the command stops and exits [`EXIT_CLOSED`], as a
//! program ended by SIGPIPE does, so the runs it did not do are not reported as done.

use super::bad_input;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// The exit status when standard output was closed by its reader: 128 + SIGPIPE.
pub const EXIT_CLOSED: u8 = 141;

/// The first failure writing standard output: its kind and its text.
static STDOUT_LOST: OnceLock<(ErrorKind, String)> = OnceLock::new();
/// Set when any output (standard output or a file) failed: no further runs are started.
static ANY_LOST: AtomicBool = AtomicBool::new(false);

fn lose_stdout(error: &std::io::Error) {
    let _ = STDOUT_LOST.set((error.kind(), error.to_string()));
    ANY_LOST.store(true, Ordering::Relaxed);
}

/// Writes to standard output, unless it already failed.
pub fn stdout(bytes: &[u8]) {
    if STDOUT_LOST.get().is_some() {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(error) = out.write_all(bytes) {
        lose_stdout(&error);
    }
}

/// Writes one line to standard output (what `out!` does).
pub fn line(text: std::fmt::Arguments) {
    stdout(format!("{text}\n").as_bytes());
}

/// Whether an output has failed, so that no more work should start.
pub fn lost() -> bool {
    ANY_LOST.load(Ordering::Relaxed)
}

/// The jobs of a command, taken only while its outputs can still be written and no signal
/// asked it to stop.
pub fn while_wanted<I: Iterator>(jobs: I) -> impl Iterator<Item = I::Item> {
    jobs.take_while(|_| !lost() && !crate::interrupt::requested())
}

/// The exit status of a command that returned `code`, once standard output is flushed: a
/// failed standard output overrides it, and so does a signal that stopped the command (its
/// status, 128 + its number: what a program the signal ended exits with).
pub fn finish(code: ExitCode) -> ExitCode {
    if let Err(error) = std::io::stdout().flush() {
        lose_stdout(&error);
    }
    let code = match crate::interrupt::received() {
        Some(signal) => ExitCode::from(signal.exit_status()),
        None => code,
    };
    match STDOUT_LOST.get() {
        None => code,
        Some((ErrorKind::BrokenPipe, _)) => ExitCode::from(EXIT_CLOSED),
        Some((_, why)) => bad_input(&format!("cannot write to standard output: {why}")),
    }
}

/// An output file, or standard output for `-`, that remembers its first write error.
pub struct Output {
    /// `None` for standard output.
    file: Option<(PathBuf, std::io::BufWriter<std::fs::File>)>,
    what: &'static str,
    failed: Option<std::io::Error>,
}

impl Output {
    /// Creates the output (before any run, so a bad path is bad input, not runs thrown away).
    pub fn create(path: &Path, what: &'static str) -> Result<Self, ExitCode> {
        if path == Path::new("-") {
            return Ok(Self { file: None, what, failed: None });
        }
        match std::fs::File::create(path) {
            Ok(file) => {
                Ok(Self { file: Some((path.to_path_buf(), std::io::BufWriter::new(file))), what, failed: None })
            }
            Err(error) => Err(bad_input(&format!("cannot write the {what} {}: {error}", path.display()))),
        }
    }

    pub fn write(&mut self, bytes: &[u8]) {
        match &mut self.file {
            None => stdout(bytes),
            Some((_, file)) if self.failed.is_none() => {
                if let Err(error) = file.write_all(bytes) {
                    self.failed = Some(error);
                    ANY_LOST.store(true, Ordering::Relaxed);
                }
            }
            Some(_) => {}
        }
    }

    /// Flushes the output; a write that failed, now or before, is exit 2 with the reason.
    /// (Standard output is judged once, by [`finish`].)
    pub fn finish(mut self) -> Result<(), ExitCode> {
        let Some((path, mut file)) = self.file.take() else { return Ok(()) };
        let failed = match self.failed.take() {
            Some(error) => Some(error),
            None => file.flush().err(),
        };
        match failed {
            None => Ok(()),
            Some(error) => Err(bad_input(&format!("cannot write the {} {}: {error}", self.what, path.display()))),
        }
    }
}
