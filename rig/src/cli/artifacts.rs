//! What a failure leaves in an output folder for a person to look at: the run's timeline, its
//! trace and its repro command side by side, and for a sweep or explore finding the scenario file
//! that reproduces it, replayed from that file to check that it does.

use super::Harness;
use crate::explore::Runs as _;
use crate::run::RunOutcome;
use crate::LiveRuns;
use crate::{explore, timeline};
use std::path::{Path, PathBuf};

/// Writes `STEM.timeline.html`, `STEM.trace.jsonl` and `STEM.repro.sh` of one run into `folder`;
/// the paths written (or why one could not be).
pub(crate) fn write_run(outcome: &RunOutcome, folder: &Path, stem: &str) -> Vec<String> {
    let mut trace = outcome.trace.json_lines().collect::<Vec<_>>().join("\n");
    trace.push('\n');
    let files = [
        ("timeline.html", timeline::html(&[outcome])),
        ("trace.jsonl", trace),
        (
            "repro.sh",
            format!(
                "#!/bin/sh\n# {}\n{}\n",
                crate::report::bounds::text(
                    outcome.failures.first().and_then(|f| f.lines().next()).unwrap_or_default()
                ),
                outcome.repro()
            ),
        ),
    ];
    files
        .into_iter()
        .map(|(suffix, text)| {
            let path = folder.join(format!("{stem}.{suffix}"));
            match std::fs::write(&path, text) {
                Ok(()) => path.display().to_string(),
                Err(error) => format!("(could not write {}: {error})", path.display()),
            }
        })
        .collect()
}

/// `scenarios/a/b.toml`, policy `p`, seed 3: `scenarios.a.b.p.seed3`.
pub(crate) fn run_stem(outcome: &RunOutcome) -> String {
    let path = Path::new(&outcome.scenario).with_extension("");
    let parts: Vec<String> = path
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(part) => Some(part.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect();
    format!("{}.{}.seed{}", parts.join("."), outcome.policy, outcome.seed)
}

/// Writes a finding's scenario file into `folder`, replays the written file with the harness
/// under the finding's policy and seed, and writes that run's timeline, trace and repro beside
/// it. Returns the line that names them: the file, the command that replays it with this
/// harness (a finding reproduces under the seed it was found with) and the replay's trace hash,
/// and `NOT REPRODUCED` when the written file does not trip the finding's oracle, which would be
/// a bug of the rig's. A finding of a live sweep (`live`) is replayed live, and its file says how.
/// With the line, the file written, if it was, and the command that replays it.
pub(crate) fn write_finding(
    folder: &Path,
    finding: &explore::Finding,
    harness: &Harness,
    live: Option<&LiveRuns>,
) -> WrittenFinding {
    let replay = match live {
        Some(live) => {
            format!("# Replay it live with `{}`.", live.command("<this file>", &finding.policy, finding.seed))
        }
        None => format!("# Replay it with `{} run <this file> --seed {}`.", harness.program, finding.seed),
    };
    let text = finding.file_text(&[replay]);
    let unwritten = |line: String| WrittenFinding { line, file: None, replay: None };
    let path = match finding_path(folder, finding, &text) {
        Ok(path) => path,
        Err(error) => return unwritten(format!("(could not write into {}: {error})", folder.display())),
    };
    if let Err(error) = std::fs::write(&path, &text) {
        return unwritten(format!("(could not write {}: {error})", path.display()));
    }
    if crate::interrupt::requested() {
        // A signal asked for no new run: the file is there, its replay is not.
        let line = format!("{} (not replayed: interrupted)", path.display());
        return WrittenFinding { line, file: Some(path), replay: None };
    }
    let scenario = match crate::Scenario::parse(&path, &text) {
        Ok(scenario) => scenario,
        Err(error) => {
            let line = format!("{} NOT REPRODUCED: the written file does not load: {error}", path.display());
            return WrittenFinding { line, file: Some(path), replay: None };
        }
    };
    let policy_run = scenario.run_of(&finding.policy).cloned().unwrap_or_else(|| explore::bare_run(&finding.policy));
    let outcome = match live {
        Some(live) => live.run(&scenario, &policy_run, finding.seed),
        None => harness.run(&scenario, &policy_run, finding.seed),
    };
    let mut line = format!("{} (replay: {}; trace hash {})", path.display(), outcome.repro(), outcome.trace_hash);
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let written = write_run(&outcome, folder, &stem);
    if !explore::fired(&outcome).contains(&finding.oracle) {
        line.push_str(&format!(" NOT REPRODUCED: the written file, replayed, does not trip `{}`", finding.oracle));
    }
    if let Some(unwritten) = written.iter().find(|w| w.starts_with('(')) {
        line.push_str(&format!(" {unwritten}"));
    } else {
        line.push_str(" with its timeline, trace and repro beside it");
    }
    WrittenFinding { line, file: Some(path), replay: Some(outcome.repro()) }
}

/// What [`write_finding`] wrote.
pub(crate) struct WrittenFinding {
    /// The line that names the file, its replay and its trace hash.
    pub line: String,
    pub file: Option<PathBuf>,
    /// The command that replays the file.
    pub replay: Option<String>,
}

/// Where a finding goes: its file name, with its seed when that is not 0 (many seeds of an
/// exploration can shrink to the same cuts, and each replays under its own seed). A file already
/// there with other content is kept, and this one takes the next free `-N` name: nothing a
/// finding wrote is lost. The same finding written again replaces itself, whichever other runs
/// it names.
fn finding_path(folder: &Path, finding: &explore::Finding, text: &str) -> std::io::Result<PathBuf> {
    let name = Path::new(&finding.file_name);
    let stem = name.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let stem = if finding.seed == 0 { stem } else { format!("{stem}--seed{}", finding.seed) };
    for n in 1..=FINDINGS_OF_ONE_NAME_MAX {
        let candidate = folder.join(if n == 1 { format!("{stem}.toml") } else { format!("{stem}-{n}.toml") });
        match std::fs::read_to_string(&candidate) {
            Ok(existing) if !same_finding(&existing, text) => continue,
            Ok(_) => return Ok(candidate),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(candidate),
            Err(error) => return Err(error),
        }
    }
    Err(std::io::Error::other(format!("{FINDINGS_OF_ONE_NAME_MAX} other findings are already named {stem}")))
}

/// Whether a file already there is this finding: the same text, but for which other runs
/// came to it (an exploration of more seeds finds more of them).
fn same_finding(existing: &str, text: &str) -> bool {
    let without_others = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|line| !line.ends_with(&format!("{}.", explore::ALSO_NOTE)))
            .filter(|line| !line.starts_with(&format!("# {}", explore::ALSO_NOTE_OTHERS)))
            .map(str::to_string)
            .collect()
    };
    without_others(existing) == without_others(text)
}

/// How many differing findings may share a name in one folder before the rig stops numbering.
const FINDINGS_OF_ONE_NAME_MAX: u32 = 10_000;
