//! `--baseline FILE` and `--write-baseline FILE` on `run`, `matrix`, `live`, `sweep` and
//! `explore` (and `--strict` on the last two): a run judged against the failures and findings a
//! team knows of ([`crate::baseline`]), and the file written again from what it saw.

use super::bad_input;
use crate::baseline::{Baseline, FailureVerdict, Failures, FindingVerdict, Findings};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args, Clone, Debug, Default)]
pub struct BaselineArgs {
    /// Known failures and findings (a file --write-baseline wrote): the command passes while it
    /// fails only on what the file lists; an unlisted failure or finding fails it, and so does a
    /// listed failure that passes now (the file is stale).
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<PathBuf>,
    /// Write what this command failed on and found to FILE as a baseline: over what FILE
    /// lists, whose entries this command did not run are kept.
    #[arg(long, value_name = "FILE")]
    pub write_baseline: Option<PathBuf>,
}

/// `--strict`, for the searches: a gone finding is news, unless asked to fail on it.
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct Strict {
    /// With --baseline: a listed finding not found again fails the command too (by default it
    /// is reported: what a search draws may change between versions).
    #[arg(long, requires = "baseline")]
    pub strict: bool,
}

/// The baselines of a command, read before any run.
#[derive(Debug, Default)]
pub struct Known {
    /// What the runs are judged against.
    pub judged: Option<Baseline>,
    /// What `--write-baseline` writes over: the file as it is, or an empty one.
    pub write: Option<Baseline>,
}

impl BaselineArgs {
    /// Reads `--baseline`, and the file `--write-baseline` writes over; bad input when either
    /// cannot be read or lists another harness, or the file cannot be written where asked.
    pub fn load(&self, harness: &str) -> Result<Known, ExitCode> {
        let judged = match &self.baseline {
            Some(path) => Some(read(path, harness)?),
            None => None,
        };
        let write = match &self.write_baseline {
            Some(path) if path.exists() => Some(read(path, harness)?),
            Some(path) => {
                if let Some(folder) = path.parent().filter(|f| !f.as_os_str().is_empty()) {
                    std::fs::create_dir_all(folder).map_err(|error| {
                        bad_input(&format!("cannot write the baseline {}: {error}", path.display()))
                    })?;
                }
                Some(Baseline::empty(path, harness))
            }
            None => None,
        };
        Ok(Known { judged, write })
    }
}

fn read(path: &Path, harness: &str) -> Result<Baseline, ExitCode> {
    let baseline = Baseline::load(path).map_err(|error| bad_input(&format!("bad baseline: {error}")))?;
    match &baseline.harness {
        Some(listed) if listed != harness => Err(bad_input(&format!(
            "the baseline {} lists the failures of harness `{listed}`, and this is harness `{harness}`",
            path.display()
        ))),
        _ => Ok(baseline),
    }
}

impl Known {
    pub fn any(&self) -> bool {
        self.judged.is_some() || self.write.is_some()
    }

    /// Writes `written` (the write base brought up to date), and says so.
    fn write(written: &Baseline) -> Result<(), ExitCode> {
        match written.write() {
            Ok(()) => {
                err!(
                    "wrote the baseline {}: {} failure(s), {} sweep finding(s), {} explore finding(s)",
                    written.path.display(),
                    written.failures.len(),
                    written.sweep.len(),
                    written.explore.len()
                );
                Ok(())
            }
            Err(error) => Err(bad_input(&format!("cannot write the baseline {}: {error}", written.path.display()))),
        }
    }

    /// The end of a command that made runs: the baseline judged (its lines printed with
    /// `print`), the file written. `Ok(Some(passed))` when a baseline judged the runs.
    pub fn failures_end(&self, ledger: &Failures, print: &mut dyn FnMut(&str)) -> Result<Option<bool>, ExitCode> {
        let written = self.write.as_ref().map(|base| ledger.written(base));
        if let Some(written) = &written {
            Self::write(written)?;
        }
        // Written only, the file now lists what the runs showed: nothing to say but that.
        let Some(judged) = self.judged.as_ref() else { return Ok(written.map(|_| true)) };
        let verdict = ledger.judge(judged);
        for line in failure_lines(judged, &verdict) {
            print(&line);
        }
        Ok(Some(verdict.passed()))
    }

    /// The end of a sweep or an exploration: its findings judged, and the file written.
    /// `Ok(Some(passed))` when a baseline judged them; a gone finding fails only when `strict`.
    pub fn findings_end(
        &self,
        ledger: &Findings,
        strict: bool,
        print: &mut dyn FnMut(&str),
    ) -> Result<Option<bool>, ExitCode> {
        let written = self.write.as_ref().map(|base| ledger.written(base));
        if let Some(written) = &written {
            Self::write(written)?;
        }
        let Some(judged) = self.judged.as_ref() else { return Ok(written.map(|_| true)) };
        let verdict = ledger.judge(judged);
        for line in finding_lines(judged, ledger, &verdict, strict) {
            print(&line);
        }
        Ok(Some(verdict.new.is_empty() && (verdict.gone.is_empty() || !strict)))
    }
}

/// What the baseline says of the runs' failures: each new one, each stale entry, then a summary.
fn failure_lines(baseline: &Baseline, verdict: &FailureVerdict) -> Vec<String> {
    let mut lines = Vec::new();
    for (key, seen) in &verdict.new {
        let runs = if seen.count == 1 { "1 run".to_string() } else { format!("{} runs", seen.count) };
        lines.push(format!("NEW   {key}: not in the baseline ({runs}, lowest seed {})", seen.seed));
        lines.push(format!("    repro: {}", seen.repro));
    }
    for entry in &verdict.stale {
        let at = match entry.seed {
            Some(seed) => format!("no longer fails on it at seed {seed}"),
            None => "no run of it fails on it now".to_string(),
        };
        lines.push(format!(
            "STALE {}: {} is listed, and {at}: take the entry out, or write the baseline again (--write-baseline)",
            baseline.at(entry),
            entry.key
        ));
    }
    lines.push(format!(
        "baseline {}: {} known failure(s) still failing, {} new, {} stale{}",
        baseline.path.display(),
        verdict.known.len(),
        verdict.new.len(),
        verdict.stale.len(),
        unchecked(verdict.unchecked, "their file and policy were not run, or not at their seed")
    ));
    lines
}

fn unchecked(count: usize, why: &str) -> String {
    match count {
        0 => String::new(),
        n => format!(" ({n} not checked: {why})"),
    }
}

/// What the baseline says of a search's findings: each new one, each gone one, then a summary.
fn finding_lines(baseline: &Baseline, ledger: &Findings, verdict: &FindingVerdict, strict: bool) -> Vec<String> {
    let mut lines = Vec::new();
    for key in &verdict.new {
        let seen = &ledger.found[key];
        lines.push(format!("NEW   finding {key}: not in the baseline"));
        lines.push(format!("    repro: {}", seen.repro));
    }
    let gone = if strict { "fails the command (--strict)" } else { "not a failure without --strict" };
    for entry in &verdict.gone {
        lines.push(format!(
            "GONE  {}: finding {} is listed, and was not found this time ({gone})",
            baseline.at(entry),
            entry.key
        ));
    }
    lines.push(format!(
        "baseline {}: {} known finding(s) found again, {} new, {} gone{}",
        baseline.path.display(),
        verdict.known.len(),
        verdict.new.len(),
        verdict.gone.len(),
        unchecked(verdict.unchecked, "their workload and policy were not searched")
    ));
    lines
}
